"""The node's verdict (checks/verdict.py): one state and one action from NVML's recovery action, the
Xid catalog and the checks, with its evidence; then end to end through `clusterhealth check`
(`--json`, `--format line`) and the agent's scrape on the simulated nodes.

The unit cases feed hand-built GPU readings (the typed boundary of NVML, tests/test_audits.py's
helpers), the cluster-node sysfs fixture and kernel-log events to the real audits, and judge their
results: each source alone, each check, the precedence between them, and data that could not be
read.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from clusterhealth.agent.collectors import COLLECTORS, verdict_inputs
from clusterhealth.checks.audits import CheckResult, Observations, Status, run_audits, worst
from clusterhealth.checks.kernel_watch import SeenEvent
from clusterhealth.checks.policy import (
    CHECK_NAMES,
    FirmwarePolicy,
    HcaCountRule,
    MtuRule,
    Policy,
    RdmaPortRule,
)
from clusterhealth.checks.verdict import (
    ACTIONS,
    CHECK_RULES,
    RECOVERY_ACTIONS,
    STATES,
    XID_RESOLUTIONS,
    Action,
    Missing,
    Verdict,
    VerdictClock,
    decide,
    decide_run,
    verdict_markdown,
    xid_action,
)
from clusterhealth.checks.xid_catalog import XID_CATALOG
from clusterhealth.exporters import nvml_health
from clusterhealth.exporters.gpu import GpuReading
from clusterhealth.exporters.infiniband import read_rdma_devices
from clusterhealth.exporters.netdev import read_netdev_mtus
from clusterhealth.exporters.nvml_health import NvmlHealth

from .conftest import FIXTURES, ROOT, SCENARIOS, AgentProcess, run_cli, samples, scenario, value
from .test_audits import CLUSTER, NOW, h100, healthy_node, lost, xid

WALL = 1_790_000_000.0  # Unix time of the audit, NOW seconds after boot
RDMA = read_rdma_devices(CLUSTER)
MTUS = read_netdev_mtus(CLUSTER)


EIGHT_H100 = healthy_node()


def judge(
    policy: Policy | None = None,
    *,
    only: str | None = None,
    gpus: Sequence[GpuReading] | None = EIGHT_H100,
    rdma: Any = (),
    netdev_mtus: Any = None,
    events: Sequence[SeenEvent] | None = (),
    missing: Sequence[Missing] = (),
) -> Verdict:
    """The verdict of the real audits on eight healthy H100s unless told, no RDMA and no Xid;
    `only` leaves every other check disabled, so one check speaks."""
    policy = policy or Policy()
    if only is not None:
        policy = dataclasses.replace(policy, disabled_checks=tuple(c for c in CHECK_NAMES if c != only))
    observations = Observations.of(
        gpus=gpus,
        driver_version="550.90.07",
        rdma=rdma,
        netdev_mtus={} if netdev_mtus is None else netdev_mtus,
        kernel_events=events,
        now_boot_seconds=NOW,
    )
    return decide(run_audits(policy, observations), observations, policy, WALL, missing)


def findings(verdict: Verdict) -> list[tuple[str, str, str, str, str]]:
    """(source, check, subject, status, action) of each piece of evidence, in order."""
    return [(e.source, e.check, e.subject, e.status.name, e.action.label) for e in verdict.evidence]


def known(verdict: Verdict) -> list[tuple[str, str, str, str, str]]:
    return [f for f in findings(verdict) if f[3] != "UNKNOWN"]


# --- healthy ---------------------------------------------------------------------------------------


def test_a_healthy_node_is_healthy_with_nothing_to_do() -> None:
    healthy = judge()
    assert (healthy.state, healthy.action, healthy.evidence) == ("healthy", Action.NONE, ())
    assert healthy.checks == 8 * 6 and healthy.since is None
    # A node without GPUs or HCAs has nothing against it either.
    assert judge(gpus=[]).state == "healthy"


# --- source 1: NVML's recovery action --------------------------------------------------------------

# What each recovery action NVML names asks of the node.
RECOVERY = {
    "gpu_reset": "reset_gpu",
    "drain_and_reset": "reset_gpu",
    "gpu_reset_bus": "reset_gpu",
    "bus_reset": "reset_gpu",
    "drain_p2p": "restart_job",
    "node_reboot": "reboot",
    "system_reboot": "reboot",
    "recover_imex_domain": "inspect",
    "unknown_42": "inspect",  # a value the installed nvidia-ml-py has no name for
}


@pytest.mark.parametrize(("name", "action"), RECOVERY.items())
def test_nvmls_recovery_action_alone(name: str, action: str) -> None:
    verdict = judge(gpus=healthy_node(gpu4=h100(4, recovery_action=name)))
    assert (verdict.state, verdict.action.label) == ("unhealthy", action)
    assert findings(verdict) == [("nvml", "gpu_recovery_action", "4", "CRITICAL", action)]
    reason = verdict.reason
    assert reason is not None and reason.recovery_action == name
    assert reason.gpu is not None and (reason.gpu.index, reason.gpu.uuid) == (4, h100(4).uuid)


def test_every_recovery_action_nvidia_ml_py_names_has_its_action() -> None:
    assert set(nvml_health.RECOVERY_ACTIONS.values()) <= set(RECOVERY_ACTIONS)
    assert set(RECOVERY) - {"unknown_42"} <= set(RECOVERY_ACTIONS)
    assert judge(gpus=healthy_node(gpu4=h100(4, recovery_action="none"))).state == "healthy"


def test_a_gpu_waiting_for_a_reset_is_lost_and_says_its_recovery() -> None:
    # ResetRequired: the GPU answers nothing but the recovery action. A lost GPU asks for a reboot
    # (NVIDIA restarts the node after Xid 79); the heavier action wins, and both are evidence.
    waiting = GpuReading(
        index=3,
        uuid=h100(3).uuid,
        up=False,
        down_reason="nvmlDeviceGetMemoryInfo: ResetRequired (NVML's recovery action: gpu_reset)",
        recovery_action="gpu_reset",
    )
    verdict = judge(gpus=healthy_node(gpu3=waiting))
    assert (verdict.state, verdict.action.label) == ("unhealthy", "reboot")
    assert known(verdict) == [
        ("check", "gpu_lost", "3", "CRITICAL", "reboot"),
        ("nvml", "gpu_recovery_action", "3", "CRITICAL", "reset_gpu"),
    ]


# --- source 2: the Xid catalog ---------------------------------------------------------------------

# Code: (state, action, NVIDIA's immediate resolution for it).
XIDS = {
    79: ("unhealthy", "reboot", "RESTART_BM"),
    48: ("unhealthy", "reset_gpu", "WORKFLOW_XID_48"),
    74: ("unhealthy", "reset_gpu", "WORKFLOW_NVLINK_ERR"),
    95: ("unhealthy", "reset_gpu", "RESET_GPU"),
    150: ("unhealthy", "reset_gpu", "RESET_GPU"),  # every item of its decode table
    154: ("unhealthy", "reset_gpu", "XID_154"),
    61: ("unhealthy", "inspect", "CONTACT_SUPPORT"),
    13: ("degraded", "restart_job", "RESTART_APP"),
    94: ("degraded", "restart_job", "RESTART_APP"),
    63: ("degraded", "none", "IGNORE"),  # gpu_row_remap's pending remap asks for the reset
    144: ("degraded", "none", "WORKFLOW_NVLINK5_ERR"),  # a fatal one brings Xid 154 and NVML's action
    147: ("degraded", "none", "IGNORE"),
    123: ("degraded", "inspect", "CONTACT_SUPPORT"),
    9999: ("degraded", "inspect", ""),  # not in the catalog: look it up
}


@pytest.mark.parametrize(("code", "expected"), XIDS.items())
def test_an_xid_alone(code: int, expected: tuple[str, str, str]) -> None:
    state, action, bucket = expected
    assert XID_CATALOG[code].immediate == bucket if code in XID_CATALOG else bucket == ""
    verdict = judge(events=[xid(code, 2, 120), xid(code, 2, 60)])
    assert (verdict.state, verdict.action.label) == (state, action)
    assert findings(verdict) == [("xid", "gpu_xid", "2", verdict.status.name, action)]
    reason = verdict.reason
    assert reason is not None and reason.gpu is not None and reason.gpu.uuid == h100(2).uuid
    assert [(x.code, x.count, x.action.label) for x in reason.xids] == [(code, 2, action)]
    # When: the first of the two, on the wall clock; the verdict began no later.
    assert reason.since == pytest.approx(WALL - 120)
    assert verdict.since == pytest.approx(WALL - 120)


def test_informational_and_old_xids_ask_for_nothing() -> None:
    assert judge(events=[xid(43, 1, 60), xid(45, 1, 50)]).state == "healthy"
    assert judge(events=[xid(79, 1, 4000)]).state == "healthy"  # outside the hour


def test_an_xid_finding_acts_on_the_xids_that_set_its_status() -> None:
    # A GPU with Xid 79 (critical: reboot) and an uncatalogued one (warning: inspect) is unhealthy,
    # and the critical Xid's reboot is its action, not the warning's visit.
    verdict = judge(events=[xid(79, 6, 30), xid(9999, 6, 20)])
    assert (verdict.state, verdict.action.label) == ("unhealthy", "reboot")
    reason = verdict.reason
    assert reason is not None and [x.code for x in reason.xids] == [79]


def test_the_verdict_dates_from_the_first_of_its_findings() -> None:
    """Two GPUs fell off the bus 300 s and 30 s ago: the node has been unhealthy since the first."""
    verdict = judge(events=[xid(79, 1, 300), xid(79, 2, 30)])
    assert (verdict.state, verdict.action.label) == ("unhealthy", "reboot")
    dates = sorted(e.since for e in verdict.evidence if e.since is not None)
    assert len(dates) == 2 and dates[0] < dates[1]
    assert verdict.since == dates[0]


def test_an_xid_no_gpu_was_found_for_is_evidence_without_a_gpu() -> None:
    verdict = judge(events=[xid(119, -1, 20, pci="PCI:0000:ab:00")])
    assert findings(verdict) == [("xid", "gpu_xid", "0000:ab:00.0", "CRITICAL", "reset_gpu")]
    assert verdict.evidence[0].gpu is None


def test_every_xid_of_the_catalog_has_an_action_and_every_critical_one_asks_for_one() -> None:
    for code, info in XID_CATALOG.items():
        assert info.immediate in XID_RESOLUTIONS, code
        if info.severity == "critical":
            assert xid_action(code) > Action.NONE, code


# --- source 3: the checks --------------------------------------------------------------------------

CHECKS: dict[str, tuple[str, dict[str, Any], tuple[str, str, str, str]]] = {
    "mtu critical": (
        "mtu",
        {"policy": Policy(mtu=(MtuRule("enp170s0f[01]np[01]", 9000),)), "netdev_mtus": MTUS},
        ("enp170s0f1np1", "CRITICAL", "unhealthy", "inspect"),
    ),
    "mtu warning": (
        "mtu",
        {"policy": Policy(mtu=(MtuRule("enp170s0f[01]np[01]", 9000, "warning"),)), "netdev_mtus": MTUS},
        ("enp170s0f1np1", "WARNING", "degraded", "inspect"),
    ),
    "rdma_port_state": ("rdma_port_state", {"rdma": RDMA}, ("mlx5_3/1", "CRITICAL", "unhealthy", "inspect")),
    "rdma_port_rate": (
        "rdma_port_rate",
        {"rdma": RDMA, "policy": Policy(rdma_ports=(RdmaPortRule("mlx5_0", rate_gbps=800),))},
        ("mlx5_0/1", "CRITICAL", "unhealthy", "inspect"),
    ),
    "hca_count fewer": (
        "hca_count",
        {"rdma": RDMA, "policy": Policy(hca_count=(HcaCountRule("mlx5_[0-7]", 9),))},
        ("mlx5_[0-7]", "CRITICAL", "unhealthy", "inspect"),
    ),
    "hca_count more": (
        "hca_count",
        {"rdma": RDMA, "policy": Policy(hca_count=(HcaCountRule("mlx5_[0-7]", 7),))},
        ("mlx5_[0-7]", "WARNING", "degraded", "inspect"),
    ),
    "gpu_count fewer": (
        "gpu_count",
        {"policy": Policy(gpu_count=9)},
        ("node", "CRITICAL", "unhealthy", "inspect"),
    ),
    "hca_firmware": ("hca_firmware", {"rdma": RDMA}, ("mlx5_7", "WARNING", "degraded", "inspect")),
    "gpu_driver": (
        "gpu_driver",
        {"policy": Policy(firmware=FirmwarePolicy(gpu_driver="560.35.03"))},
        ("driver", "WARNING", "degraded", "inspect"),
    ),
    "gpu_vbios": (
        "gpu_vbios",
        {"gpus": healthy_node(gpu2=h100(2, vbios_version="96.00.74.00.01"))},
        ("2", "WARNING", "degraded", "inspect"),
    ),
    "gpu_pcie_link": (
        "gpu_pcie_link",
        {"gpus": healthy_node(gpu1=h100(1, pcie_link_width=8))},
        ("1", "CRITICAL", "unhealthy", "inspect"),
    ),
    "hca_pcie_link": ("hca_pcie_link", {"rdma": RDMA}, ("mlx5_4", "CRITICAL", "unhealthy", "inspect")),
    "gpu_lost": ("gpu_lost", {"gpus": healthy_node(gpu6=lost(6))}, ("6", "CRITICAL", "unhealthy", "reboot")),
    "gpu_ecc_uncorrectable since the driver loaded": (
        "gpu_ecc_uncorrectable",
        {"gpus": healthy_node(gpu5=h100(5, ecc_errors={("uncorrected", "volatile"): 2}))},
        ("5", "CRITICAL", "unhealthy", "reset_gpu"),
    ),
    "gpu_ecc_uncorrectable SRAM past the threshold": (
        "gpu_ecc_uncorrectable",
        {"gpus": healthy_node(gpu7=h100(7, health=NvmlHealth(sram_ecc_threshold_exceeded=True)))},
        ("7", "CRITICAL", "unhealthy", "replace"),
    ),
    "gpu_row_remap pending": (
        "gpu_row_remap",
        {"gpus": healthy_node(gpu5=h100(5, row_remap_pending=True))},
        ("5", "WARNING", "degraded", "reset_gpu"),
    ),
    "gpu_row_remap failed": (
        "gpu_row_remap",
        {"gpus": healthy_node(gpu7=h100(7, row_remap_failed=True))},
        ("7", "CRITICAL", "unhealthy", "replace"),
    ),
}


@pytest.mark.parametrize(("check", "given", "expected"), CHECKS.values(), ids=CHECKS.keys())
def test_each_check_alone(check: str, given: dict[str, Any], expected: tuple[str, str, str, str]) -> None:
    subject, status, state, action = expected
    verdict = judge(only=check, **given)
    assert (verdict.state, verdict.action.label) == (state, action)
    assert findings(verdict) == [("check", check, subject, status, action)]
    reason = verdict.reason
    assert reason is not None
    if check.startswith("gpu_") and subject.isdigit():
        assert reason.gpu is not None and (reason.gpu.index, reason.gpu.uuid) == (
            int(subject),
            h100(int(subject)).uuid,
        )
    else:
        assert reason.gpu is None


def test_every_check_says_what_it_asks_for() -> None:
    ruled = {rule.check for rule in CHECK_RULES} | {"gpu_recovery_action", "gpu_xid"}
    assert ruled == set(CHECK_NAMES)
    assert {case[0] for case in CHECKS.values()} | {"gpu_recovery_action", "gpu_xid"} == set(CHECK_NAMES)


def test_a_lost_gpu_is_a_fault_not_missing_data() -> None:
    # GPU 6 fell off the bus: its other checks cannot read it (UNKNOWN), yet the node is unhealthy,
    # with the reboot NVIDIA asks for (Xid 79's RESTART_BM), not unknown.
    verdict = judge(gpus=healthy_node(gpu6=lost(6)), events=[xid(79, 6, 10)])
    assert (verdict.state, verdict.action.label) == ("unhealthy", "reboot")
    assert known(verdict) == [
        ("xid", "gpu_xid", "6", "CRITICAL", "reboot"),
        ("check", "gpu_lost", "6", "CRITICAL", "reboot"),
    ]
    assert {f[1] for f in findings(verdict) if f[3] == "UNKNOWN"} == {
        "gpu_vbios", "gpu_pcie_link", "gpu_ecc_uncorrectable", "gpu_row_remap", "gpu_recovery_action",
    }  # fmt: skip


# --- precedence --------------------------------------------------------------------------------------


def test_at_equal_weight_nvml_comes_before_the_xid_before_the_checks() -> None:
    gpus = healthy_node(
        gpu4=h100(4, recovery_action="gpu_reset"), gpu5=h100(5, ecc_errors={("uncorrected", "volatile"): 1})
    )
    verdict = judge(gpus=gpus, events=[xid(74, 2, 30)])
    assert (verdict.state, verdict.action.label) == ("unhealthy", "reset_gpu")
    assert findings(verdict) == [
        ("nvml", "gpu_recovery_action", "4", "CRITICAL", "reset_gpu"),
        ("xid", "gpu_xid", "2", "CRITICAL", "reset_gpu"),
        ("check", "gpu_ecc_uncorrectable", "5", "CRITICAL", "reset_gpu"),
    ]


def test_the_heaviest_action_wins_across_sources() -> None:
    # NVML asks for a reset, an Xid for a reboot, a check for a replacement: replace.
    gpus = healthy_node(gpu4=h100(4, recovery_action="gpu_reset"), gpu7=h100(7, row_remap_failed=True))
    verdict = judge(gpus=gpus, events=[xid(79, 1, 30)])
    assert verdict.action.label == "replace"
    assert [f[4] for f in findings(verdict)] == ["replace", "reboot", "reset_gpu"]
    # Without the check, the Xid's reboot outweighs NVML's reset.
    assert judge(
        gpus=healthy_node(gpu4=h100(4, recovery_action="gpu_reset")), events=[xid(79, 1, 30)]
    ).action == (Action.REBOOT)


def test_the_action_is_the_heaviest_of_the_findings_that_set_the_state() -> None:
    # A GPU needs a reset (CRITICAL); an HCA's firmware drifted (WARNING: a person updates it).
    # The node is unhealthy and the reset is what to do now; the warning stays in the evidence.
    only_drift = Policy(disabled_checks=("rdma_port_state", "rdma_port_rate", "hca_pcie_link"))
    verdict = judge(only_drift, gpus=healthy_node(gpu4=h100(4, recovery_action="gpu_reset")), rdma=RDMA)
    assert (verdict.state, verdict.action.label) == ("unhealthy", "reset_gpu")
    assert findings(verdict) == [
        ("nvml", "gpu_recovery_action", "4", "CRITICAL", "reset_gpu"),
        ("check", "hca_firmware", "mlx5_7", "WARNING", "inspect"),
    ]
    # Among warnings alone, the heaviest warning's.
    pending = healthy_node(gpu5=h100(5, row_remap_pending=True))
    assert judge(gpus=pending, events=[xid(13, 0, 30)]).action.label == "reset_gpu"


# --- data that could not be read -------------------------------------------------------------------


def test_unknown_shapes() -> None:
    cases: dict[str, Verdict] = {
        "NVML unreadable": judge(gpus=None),
        "kernel log unreadable": judge(events=None),
        "one GPU's ECC counters unavailable": judge(gpus=healthy_node(gpu3=h100(3, ecc_errors={}))),
        "a collector failing": judge(missing=[Missing("gpu", "is failing: nvmlInit: Driver Not Loaded")]),
        "the audit has not run": decide_run(None),
        "the audit hung": decide_run(
            None, [Missing("audit", "is failing: collection has been running for 31s")]
        ),
        # An UNKNOWN outranks a WARNING: the check that could not run may hide a fault.
        "a warning beside an unknown": judge(
            gpus=healthy_node(gpu3=h100(3, ecc_errors={}), gpu5=h100(5, row_remap_pending=True))
        ),
    }
    for name, verdict in cases.items():
        assert (verdict.state, verdict.action) == ("unknown", Action.NONE), name
        assert verdict.reason is not None and verdict.reason.status == Status.UNKNOWN, name
    collector = cases["a collector failing"].reason
    assert collector is not None and (collector.source, collector.collector) == ("collector", "gpu")
    assert collector.as_json()["collector"] == "gpu" and "check" not in collector.as_json()


def test_a_known_fault_stays_unhealthy_beside_missing_data() -> None:
    verdict = judge(
        gpus=healthy_node(gpu7=h100(7, row_remap_failed=True)),
        events=None,
        missing=[Missing("kernel_log", "is failing: EISDIR")],
    )
    assert (verdict.state, verdict.action.label) == ("unhealthy", "replace")
    assert [f[0] for f in findings(verdict)] == ["check", "xid", "collector"]


@given(
    st.lists(st.sampled_from(list(Status)), max_size=8), st.lists(st.sampled_from(list(Action)), max_size=8)
)
def test_the_state_is_the_worst_status_and_unknown_data_never_acts(
    statuses: list[Status], actions: list[Action]
) -> None:
    results = [CheckResult("gpu_count", "node", s, "") for s in statuses]
    observations = Observations.of(
        gpus=(), driver_version=None, rdma=(), netdev_mtus={}, kernel_events=(), now_boot_seconds=NOW
    )
    verdict = decide(results, observations, Policy(), WALL)
    status = worst(results)
    assert verdict.state == {Status.OK: "healthy", Status.WARNING: "degraded", Status.CRITICAL: "unhealthy",
                             Status.UNKNOWN: "unknown"}[status]  # fmt: skip
    if Status.UNKNOWN in statuses and Status.CRITICAL not in statuses:
        assert verdict.state == "unknown" and verdict.action == Action.NONE
    assert (verdict.action > Action.NONE) == (status in (Status.WARNING, Status.CRITICAL))
    assert [e.status.rank for e in verdict.evidence] == sorted(
        (e.status.rank for e in verdict.evidence), reverse=True
    )


# --- since -----------------------------------------------------------------------------------------


def test_the_clock_keeps_when_the_verdict_began() -> None:
    clock = VerdictClock()
    healthy = Verdict("healthy", Action.NONE, (), 10)
    reboot = Verdict("unhealthy", Action.REBOOT, (), 10, since=900.0)
    reset = Verdict("unhealthy", Action.RESET_GPU, (), 10, since=950.0)
    assert clock.since(reboot, 1000.0) == 900.0  # the first verdict: its first Xid, when earlier
    assert clock.since(reboot, 1010.0) == 900.0
    assert clock.since(reset, 1020.0) == 1020.0  # a new action: now, whatever its Xid's time
    assert clock.since(healthy, 1030.0) == 1030.0
    assert clock.since(healthy, 1090.0) == 1030.0
    assert VerdictClock().since(healthy, 5.0) == 5.0


# --- the documented table --------------------------------------------------------------------------


def test_docs_remediation_holds_the_mapping() -> None:
    page = (ROOT / "docs" / "remediation.md").read_text()
    assert verdict_markdown() in page, "paste checks.verdict.verdict_markdown() into docs/remediation.md"
    for word in (*STATES, *ACTIONS):
        assert f"`{word}`" in page, word


def test_the_verdict_reads_the_audit_and_what_the_audit_reads() -> None:
    (audit,) = [e for e in COLLECTORS if e.name == "audit"]
    assert verdict_inputs() == ("audit", *audit.after) == ("audit", "gpu", "kernel_log")


# --- end to end ------------------------------------------------------------------------------------

FAULTY = SCENARIOS / "h100-faulty.yaml"
HEALTHY = SCENARIOS / "h100-healthy.yaml"
CLUSTER_NODE = FIXTURES / "sysfs" / "cluster-node" / "sys"


def verdict_series(exposition: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(ls), v) for (n, ls), v in samples(exposition).items() if n == "clusterhealth_node_verdict"]


def since_of(exposition: str) -> float:
    (found,) = [
        v
        for (n, _), v in samples(exposition).items()
        if n == "clusterhealth_node_verdict_since_timestamp_seconds"
    ]
    return found


@pytest.fixture
def quiet_sysfs(tmp_path: Path) -> str:
    (tmp_path / "sys" / "class" / "net" / "lo").mkdir(parents=True)
    (tmp_path / "sys" / "class" / "net" / "lo" / "mtu").write_text("65536\n")
    return str(tmp_path / "sys")


def test_the_faulty_node_end_to_end() -> None:
    node = ["--simulate", str(FAULTY), "--sysfs-root", str(CLUSTER_NODE), "--kmsg-path", "/dev/null"]
    report = json.loads(run_cli("check", "--json", *node).stdout)
    verdict = report["verdict"]
    assert (verdict["state"], verdict["action"]) == ("unhealthy", "replace")
    # GPU 7 must be replaced (SRAM past NVIDIA's threshold, a failed remap): the reason, with its UUID.
    first = verdict["evidence"][0]
    assert (first["source"], first["check"], first["subject"], first["status"]) == (
        "check", "gpu_ecc_uncorrectable", "7", "CRITICAL",
    )  # fmt: skip
    assert first["gpu"]["index"] == 7 and first["gpu"]["uuid"].startswith("GPU-")
    by_key = {(e["check"], e["subject"]): e for e in verdict["evidence"]}
    assert by_key[("gpu_recovery_action", "4")]["recovery_action"] == "gpu_reset"
    assert by_key[("gpu_recovery_action", "4")]["action"] == "reset_gpu"
    xid74 = by_key[("gpu_xid", "2")]
    assert [(x["code"], x["action"]) for x in xid74["xids"]] == [(74, "reset_gpu")]
    assert xid74["since"] == pytest.approx(time.time(), abs=120)
    assert by_key[("hca_firmware", "mlx5_7")] == {
        **by_key[("hca_firmware", "mlx5_7")],
        "status": "WARNING",
        "action": "inspect",
    }
    # Every finding is evidence: one per result that is not OK.
    assert len(verdict["evidence"]) == sum(r["status"] != "OK" for r in report["results"]) == 12
    assert verdict["checks"] == len(report["results"])
    assert verdict["since"] is None  # nothing known says when a replacement became due
    line = run_cli("check", "--format", "line", *node).stdout
    assert line.startswith("unhealthy replace: CRITICAL: gpu_ecc_uncorrectable 7: GPU 7: its SRAM ")
    assert line.rstrip().endswith("(+11 more)") and line.count("\n") == 1
    table = run_cli("check", *node).stdout.splitlines()
    assert table[-1].endswith("; verdict: unhealthy replace")
    assert table[1].split()[:3] == ["CRITICAL", "gpu_ecc_uncorrectable", "7"]  # the reason first
    scraped = run_cli("scrape", *node).stdout
    assert verdict_series(scraped) == [({"state": "unhealthy", "action": "replace"}, 1.0)]
    assert since_of(scraped) == pytest.approx(time.time(), abs=60)


def test_the_healthy_node_end_to_end(quiet_sysfs: str, tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    node = ["--simulate", str(HEALTHY), "--sysfs-root", quiet_sysfs, "--kmsg-path", str(kmsg)]
    report = json.loads(run_cli("check", "--json", *node).stdout)
    assert report["verdict"] == {"state": "healthy", "action": "none", "since": None,
                                 "checks": len(report["results"]), "evidence": []}  # fmt: skip
    assert (
        run_cli("check", "--format", "line", *node).stdout
        == f"healthy none: OK: {len(report['results'])} checks passed\n"
    )
    assert verdict_series(run_cli("scrape", *node).stdout) == [({"state": "healthy", "action": "none"}, 1.0)]


def test_check_only_judges_the_checks_it_selects() -> None:
    node = ["--simulate", str(FAULTY), "--sysfs-root", str(CLUSTER_NODE), "--kmsg-path", "/dev/null"]
    rdma = json.loads(run_cli("check", "--json", "--only", "mtu|rdma_.*|hca_.*", *node).stdout)["verdict"]
    assert (rdma["state"], rdma["action"]) == ("unhealthy", "inspect")
    assert {e["check"] for e in rdma["evidence"]} == {"rdma_port_state", "hca_pcie_link", "hca_firmware"}
    nvml = json.loads(run_cli("check", "--json", "--only", "gpu_recovery_action", *node).stdout)["verdict"]
    assert (nvml["state"], nvml["action"]) == ("unhealthy", "reset_gpu")


def test_the_agent_follows_the_node_and_keeps_when_its_verdict_began(
    agent_process: Callable[..., AgentProcess],
    write_scenario: Callable[..., Path],
    quiet_sysfs: str,
    tmp_path: Path,
) -> None:
    # GPU 1 falls off the bus 4 s after the agent starts: healthy, then unhealthy (reboot).
    node = scenario(faults=[{"gpu": 1, "from_seconds": 4, "lost": True}])
    config = tmp_path / "clusterhealth.yaml"
    fast = {name: {"interval_seconds": 0.5} for name in ("gpu", "kernel_log", "xid")}
    config.write_text(yaml.safe_dump({"collectors": {**fast, "audit": {"interval_seconds": 1}}}))
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    agent = agent_process("--config", str(config), "--simulate", str(write_scenario(node)),
                          "--sysfs-root", quiet_sysfs, "--kmsg-path", str(kmsg))  # fmt: skip
    seen: list[tuple[str, float]] = []

    def state() -> str:
        text = agent.metrics()
        series = verdict_series(text)
        assert len(series) == 1, series  # exactly one, at every scrape, from the first
        labels, _ = series[0]
        seen.append((f"{labels['state']} {labels['action']}", since_of(text)))
        return seen[-1][0]

    agent.wait_for(lambda: state() == "healthy none", what="a healthy verdict")
    healthy_since = seen[-1][1]
    agent.wait_for(lambda: state() == "unhealthy reboot", what="GPU 1 off the bus")
    unhealthy_since = seen[-1][1]
    assert healthy_since < unhealthy_since <= time.time()
    assert state() == "unhealthy reboot"
    order = [s for s, _ in seen]
    # Until its first audit the agent says unknown, never healthy; then healthy until GPU 1 goes.
    first_healthy = order.index("healthy none")
    assert set(order[:first_healthy]) <= {"unknown none"}
    assert set(order[first_healthy:]) == {"healthy none", "unhealthy reboot"}
    # A verdict keeps the time it began at every scrape.
    assert {t for s, t in seen if s == "healthy none"} == {healthy_since}
    assert {t for s, t in seen if s == "unhealthy reboot"} == {unhealthy_since}


def test_the_agent_is_unknown_while_nvml_hangs(
    agent_process: Callable[..., AgentProcess],
    write_scenario: Callable[..., Path],
    quiet_sysfs: str,
    tmp_path: Path,
) -> None:
    # NVML stops answering 2 s in: the audit goes on judging the GPUs as last read, which must
    # not read as healthy.
    node = scenario(faults=[{"gpu": 0, "from_seconds": 2, "hang": {"nvmlDeviceGetPowerUsage": 600}}])
    config = tmp_path / "clusterhealth.yaml"
    fast = {name: {"interval_seconds": 0.5} for name in ("kernel_log", "xid")}
    gpu = {"interval_seconds": 0.5, "timeout_seconds": 1}
    config.write_text(yaml.safe_dump({"collectors": {**fast, "gpu": gpu, "audit": {"interval_seconds": 1}}}))
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    agent = agent_process("--config", str(config), "--simulate", str(write_scenario(node)),
                          "--sysfs-root", quiet_sysfs, "--kmsg-path", str(kmsg))  # fmt: skip
    agent.wait_for(lambda: verdict_series(agent.metrics()) == [({"state": "healthy", "action": "none"}, 1.0)],
                   what="a healthy verdict")  # fmt: skip
    agent.wait_for(lambda: verdict_series(agent.metrics()) == [({"state": "unknown", "action": "none"}, 1.0)],
                   what="the hang")  # fmt: skip
    text = agent.metrics()
    assert re.search(r'clusterhealth_scrape_collector_success\{collector="gpu"\} 0', text)
    # The audit still ran on the GPUs as last read: every check OK, yet the verdict is unknown.
    statuses = [v for (n, _), v in samples(text).items() if n == "clusterhealth_check_status"]
    assert statuses and set(statuses) == {0.0}


def test_a_fault_in_judging_the_verdict_never_fails_the_scrape(
    write_scenario: Callable[..., Path], quiet_sysfs: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    from clusterhealth.agent import config as configuration
    from clusterhealth.agent import exposition
    from clusterhealth.agent.collectors import collect_once
    from clusterhealth.exporters.sim import nvml as nvml_sim

    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    overrides = {
        "simulate": str(write_scenario(scenario())),
        "paths.sysfs": quiet_sysfs,
        "paths.kmsg": str(kmsg),
    }
    node, samplers = collect_once(configuration.load(None, overrides))
    try:

        def broken(current: object) -> Verdict:
            raise ZeroDivisionError("a bug")

        # A fault injected where no input reaches: the judging itself.
        monkeypatch.setattr(exposition, "node_verdict", broken)
        text = exposition.Exposition(lambda: samplers).render().decode()
        assert verdict_series(text) == [({"state": "unknown", "action": "none"}, 1.0)]
        assert value(text, "clusterhealth_gpu_up", gpu="1") == 1  # the rest of the scrape is there
        assert "could not be judged: ZeroDivisionError: a bug" in caplog.text
        monkeypatch.undo()
        again = exposition.Exposition(lambda: samplers).render().decode()
        assert verdict_series(again) == [({"state": "healthy", "action": "none"}, 1.0)]
    finally:
        node.close()
        nvml_sim.uninstall()
