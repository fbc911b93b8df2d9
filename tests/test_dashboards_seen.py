"""The dashboards, seen: every panel of every dashboard shows the fault it is there for.

A real Prometheus scrapes the demo's faulty node beside a healthy one and a node whose jobs are
attributed badly, with a pairwise group's history backfilled (tests/dashboard_fleet.py), and
evaluates the generated rules. Each panel is then looked at as Grafana would show it, over the
last 30 minutes (tests/grafana.py: variables, intervals, queries, frames, transformations, value
mappings), and its purpose is checked on what it shows: GPU 6 lost, the NVLink down, the
throttled GPU and the IB port down on the node board, the slow host h3 on the fabric board, the
faults and attribution problems on the fleet and jobs boards. A few panels have no fault to show
in this data; their purpose says so (`healthy=True`) and checks the healthy data they should show.

Every panel must have a purpose (a new panel fails `test_every_panel_has_a_purpose` until it gets
one), and every purpose must be able to fail: on a panel that shows nothing, and, for the panels
that follow $node, on the healthy node alone (`test_each_purpose_fails_without_its_fault`). A few
broken queries, among them the dashboards' own earlier versions that the check found wrong, fail
their purpose (`test_a_broken_panel_fails_its_purpose`). On failure, the test prints what each
failing panel shows (query, series, values).
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from .dashboard_fleet import PAIRS_BAD_HOST, PAIRS_LEAVES, SLURM_JOB, DashboardFleet, running
from .grafana import Context, Series, Shown, TimeRange, panels, show, variable_options
from .mixin import ROOT

DASHBOARDS = ROOT / "dashboards"
WINDOW = 1800.0  # "Last 30 minutes": the backfilled pairwise rounds and everything scraped since
PATIENCE = 150.0  # seconds for every panel to show its fault (rates, `for` clauses, probe runs)


@dataclass(frozen=True)
class Names:
    """The instances as Prometheus labels them."""

    faulty: str
    healthy: str
    jobs: str


@dataclass(frozen=True)
class Purpose:
    """What a panel is there to show, and the check that it shows it (True, or raises on a
    missing series or row). `node`: the node the node board is looked at for it; `follows_node`:
    the panel selects by $node, so the fault vanishes with the healthy node alone; `healthy`: no
    fault of this data concerns the panel, the check is on the healthy data it should show."""

    what: str
    check: Callable[[Shown, Names], bool]
    node: str = "faulty"
    follows_node: bool = True
    healthy: bool = False


# ---- reading what a panel shows


def series(s: Shown, name: str) -> Series:
    found = [x for x in s.series if x.name == name]
    if len(found) != 1:
        raise KeyError(f"{len(found)} series named {name!r}")
    return found[0]


def last(s: Shown, name: str) -> float:
    return series(s, name).last()


def peak(s: Shown, name: str) -> float:
    return max((v for _, v in series(s, name).points), default=float("nan"))


def names(s: Shown) -> set[str]:
    return {x.name for x in s.series}


def rows(s: Shown, **match: str) -> list[dict[str, str]]:
    """The shown table's rows (as displayed) whose cells are `match`."""
    return [r for r in s.rows() if all(r.get(k) == v for k, v in match.items())]


def cell(s: Shown, column: str, **match: str) -> str:
    (row,) = rows(s, **match)
    return row[column]


def one_row_each(s: Shown, *key: str) -> bool:
    keys = [tuple(r.get(k) for k in key) for r in s.rows()]
    return bool(keys) and len(keys) == len(set(keys))


def only(values: dict[str, float], name: str, test: Callable[[float], bool]) -> bool:
    """`name` passes `test` and no other series does."""
    return test(values[name]) and not any(test(v) for n, v in values.items() if n != name)


def gpus(s: Shown, suffix: str = "") -> dict[str, float]:
    return {x.name: x.last() for x in s.series if x.name.startswith("GPU ") and x.name.endswith(suffix)}


# ---- the purposes

N = "faulty"
NODE: dict[str, Purpose] = {
    "Which wall": Purpose(
        "GPU 0 waits on others: low in every column, one row a GPU, GPU 6 (lost) absent",
        lambda s, n: (
            one_row_each(s, "gpu")
            and "6" not in [r["gpu"] for r in s.rows()]
            and float(cell(s, "tensor cores", gpu="0")) < 0.05
            and float(cell(s, "DRAM bandwidth", gpu="0")) < 0.05
            and float(cell(s, "NVLink", gpu="0")) < 0.05
            and all(float(cell(s, "tensor cores", gpu=g)) > 0.4 for g in "123457")
        ),
    ),
    "SM activity against utilization": Purpose(
        "GPU 0 busy (utilization 1) with its SMs almost idle",
        lambda s, n: (
            last(s, "GPU 0 utilization") == 1
            and only(gpus(s, "SM active"), "GPU 0 SM active", lambda v: v < 0.1)
        ),
    ),
    "SM clock against its maximum": Purpose(
        "GPU 3 throttled to 1155 MHz below the 1980 MHz maximum",
        lambda s, n: last(s, "maximum") == 1.98e9 and only(gpus(s), "GPU 3", lambda v: v < 0.9 * 1.98e9),
    ),
    "Clock-event reasons": Purpose(
        "one GPU held by HW slowdown and HW thermal slowdown",
        lambda s, n: (
            last(s, "hw_thermal_slowdown") == 1
            and last(s, "hw_slowdown") == 1
            and all(x.last() == 0 for x in s.series if x.name not in ("hw_thermal_slowdown", "hw_slowdown"))
        ),
    ),
    "Time held back, by reason": Purpose(
        "GPU 3 held back by HW thermal slowdown most of the time, no other GPU",
        lambda s, n: (
            peak(s, "GPU 3 hw_thermal_slowdown") > 0.5
            and not [x for x in gpus(s) if not x.startswith("GPU 3 ")]
        ),
    ),
    "Temperatures": Purpose(
        "GPU 3 hot (91 °C, its HBM 98 °C)",
        lambda s, n: (
            only(gpus(s, " gpu"), "GPU 3 gpu", lambda v: v > 85)
            and only(gpus(s, " memory"), "GPU 3 memory", lambda v: v > 90)
        ),
    ),
    "Power against the limit": Purpose(
        "GPU 4's unreadable power absent (not 0), GPU 6 lost, GPU 0 waiting at half the others' draw",
        lambda s, n: (
            set(gpus(s)) == {f"GPU {g}" for g in "012357"}
            and last(s, "limit") == 700
            and only(gpus(s), "GPU 0", lambda v: v < 350)
        ),
    ),
    "ECC errors since the driver loaded": Purpose(
        "GPU 5's uncorrected ECC errors",
        lambda s, n: only(gpus(s, " uncorrected"), "GPU 5 uncorrected", lambda v: v > 0),
    ),
    "Row remapping": Purpose(
        "GPU 5's remap pending, GPU 7's remap failed, one row a GPU",
        lambda s, n: (
            one_row_each(s, "gpu")
            and [r["gpu"] for r in rows(s, **{"remap pending": "1"})] == ["5"]
            and [r["gpu"] for r in rows(s, **{"remap failed": "1"})] == ["7"]
        ),
    ),
    "Xid by code": Purpose(
        "the Xids: GPU 2's 74, GPU 5's 94 and 63, GPU 6's 79, GPU 7's 64",
        lambda s, n: (
            {x.name for x in s.series if max((v for _, v in x.points), default=0) > 0}
            == {"GPU 2 Xid 74", "GPU 5 Xid 94", "GPU 5 Xid 63", "GPU 6 Xid 79", "GPU 7 Xid 64"}
        ),
    ),
    "NVLinks down": Purpose(
        "GPU 2's NVLink down",
        lambda s, n: only(gpus(s), "GPU 2", lambda v: v == 1) and "GPU 6" not in gpus(s),
    ),
    "NVLink errors": Purpose(
        "GPU 2's NVLink CRC errors rising",
        lambda s, n: (
            peak(s, "GPU 2 crc_flit") > 0
            and not [x for x in s.series if not x.name.startswith("GPU 2 ") and peak(s, x.name) > 0]
        ),
    ),
    "PCIe link width against its maximum": Purpose(
        "GPU 1's link at x8 of x16",
        lambda s, n: (
            last(s, "maximum width") == 16 and only(gpus(s, " width"), "GPU 1 width", lambda v: v == 8)
        ),
    ),
    "PCIe replays": Purpose(
        "GPU 1's link replaying",
        lambda s, n: peak(s, "GPU 1") > 0 and all(peak(s, g) == 0 for g in gpus(s) if g != "GPU 1"),
    ),
    "Ports": Purpose(
        "mlx5_3's port DOWN (Polling), the others ACTIVE, one row a port",
        lambda s, n: (
            one_row_each(s, "device", "port")
            and cell(s, "state", device="mlx5_3") == "DOWN"
            and cell(s, "physical state", device="mlx5_3") == "Polling"
            and {r["state"] for r in s.rows() if r["device"] != "mlx5_3"} == {"ACTIVE"}
            and {r["port"] for r in s.rows()} == {"1"}
        ),
    ),
    "Throughput": Purpose(
        "data on every port but mlx5_3, which is down",
        lambda s, n: (
            peak(s, "mlx5_0/1 received") > 0
            and peak(s, "mlx5_3/1 received") == 0
            and peak(s, "mlx5_3/1 transmitted") == 0
            and all(peak(s, f"mlx5_{d}/1 transmitted") > 0 for d in (0, 1, 2, 4, 5, 6, 7, 8, 9))
        ),
    ),
    "Port errors": Purpose(
        "symbol errors on mlx5_0, receive errors on mlx5_1, mlx5_5's link going down",
        lambda s, n: (
            peak(s, "mlx5_0/1 symbol_error") > 0
            and peak(s, "mlx5_1/1 port_rcv_errors") > 0
            and peak(s, "mlx5_5/1 link_downed") > 0
        ),
    ),
    "Saturated counters": Purpose(
        "mlx5_5's symbol_error pinned at its maximum",
        lambda s, n: only({x.name: x.last() for x in s.series}, "mlx5_5/1", lambda v: v >= 1),
    ),
    "Congestion": Purpose(
        "no congestion here: transmit waits of every port and the RoCE ports' congestion counters, at 0",
        lambda s, n: (
            {f"mlx5_{d}/1 xmit_wait" for d in range(10)} <= names(s)
            and {"mlx5_8/1 np_cnp_sent", "mlx5_9/1 rp_cnp_handled"} <= names(s)
            and all(peak(s, x) == 0 for x in names(s))
        ),
        healthy=True,
    ),
    "HCA PCIe link width": Purpose(
        "mlx5_4's link at x8 of x16",
        lambda s, n: (
            last(s, "maximum") == 16
            and only({x.name: x.last() for x in s.series if x.name != "maximum"}, "mlx5_4", lambda v: v == 8)
        ),
    ),
    "Checks": Purpose(
        "GPU 6 lost and mlx5_3's port down CRITICAL, subjects as they are",
        lambda s, n: (
            cell(s, "Value", check="gpu_lost", subject="6") == "CRITICAL"
            and cell(s, "Value", check="rdma_port_state", subject="mlx5_3/1") == "CRITICAL"
            and cell(s, "Value", check="gpu_lost", subject="0") == "OK"
        ),
    ),
    "Kernel events": Purpose(
        "the kernel log's PCIe AER corrected errors",
        lambda s, n: peak(s, "pcie_aer_corrected") > 0 and peak(s, "mce") == 0,
    ),
    "PCIe AER errors": Purpose(
        "mlx5_4's function (0000:9a:00.0) retrying: correctable errors rising",
        lambda s, n: only(
            {x.name: peak(s, x.name) for x in s.series},
            "0000:9a:00.0 (mlx5_core) correctable",
            lambda v: v > 0,
        ),
    ),
    "Interfaces' MTU": Purpose(
        "enp170s0f1np1 at MTU 1500 beside its twin at 9000",
        lambda s, n: (
            cell(s, "Value", interface="enp170s0f1np1") == "1500"
            and cell(s, "Value", interface="enp170s0f0np0") == "9000"
        ),
    ),
    "Collectors": Purpose(
        "the jobs collector failing (an unreadable mapping file), the others fine",
        lambda s, n: only(
            {x.name: x.last() for x in s.series if x.name.endswith(" success")},
            "jobs success",
            lambda v: v == 0,
        ),
        node="jobs",
    ),
}

FLEET: dict[str, Purpose] = {
    "Agents up": Purpose(
        "the three agents scraped",
        lambda s, n: s.values() == {'sum(up{job="clusterhealth"})': 3},
        follows_node=False,
        healthy=True,
    ),
    "Agents down": Purpose(
        "the target without an agent", lambda s, n: list(s.values().values()) == [1], follows_node=False
    ),
    "Firing alerts (stat)": Purpose(
        "the faults' alerts firing", lambda s, n: next(iter(s.values().values())) >= 20, follows_node=False
    ),
    "GPUs lost": Purpose("GPU 6", lambda s, n: list(s.values().values()) == [1]),
    "RDMA ports not ACTIVE": Purpose("mlx5_3's port", lambda s, n: list(s.values().values()) == [1]),
    "Collectors failing": Purpose(
        "the jobs node's jobs collector", lambda s, n: list(s.values().values()) == [1]
    ),
    "Nodes × checks": Purpose(
        "the faulty node's GPU and port checks CRITICAL (a lost GPU's UNKNOWN does not hide them), "
        "the others OK",
        lambda s, n: (
            cell(s, "gpu_lost", **{"instance\\check": n.faulty}) == "CRITICAL"
            and cell(s, "rdma_port_state", **{"instance\\check": n.faulty}) == "CRITICAL"
            and cell(s, "gpu_ecc_uncorrectable", **{"instance\\check": n.faulty}) == "CRITICAL"
            and set(rows(s, **{"instance\\check": n.healthy})[0].values()) == {n.healthy, "OK"}
        ),
    ),
    "Firing alerts (table)": Purpose(
        "GPUFellOffBus, NVLinkDown, GPUThermalOrPowerSlowdown, RDMAPortDown on the faulty node, h3's "
        "FabricBandwidthDegraded; none on the healthy node",
        lambda s, n: (
            all(
                rows(s, alertname=a, instance=n.faulty, **labels)
                for a, labels in (
                    ("GPUFellOffBus", {"gpu": "6"}),
                    ("NVLinkDown", {"gpu": "2"}),
                    ("GPUThermalOrPowerSlowdown", {"gpu": "3"}),
                    ("RDMAPortDown", {"device": "mlx5_3"}),
                )
            )
            and bool(rows(s, alertname="FabricBandwidthDegraded", instance=f"{PAIRS_BAD_HOST}:9845"))
            and not rows(s, instance=n.healthy)
        ),
        follows_node=False,
    ),
    "Firmware versions by component and model": Purpose(
        "one HCA of model MT_0000000838 on another version than the other 23",
        lambda s, n: cell(s, "Value", component="hca", model="MT_0000000838", version="28.36.1010") == "1",
        follows_node=False,
    ),
    "Devices off the fleet's firmware": Purpose(
        "mlx5_7 of the faulty node",
        lambda s, n: [(r["instance"], r["subject"]) for r in s.rows()] == [(n.faulty, "mlx5_7")],
        follows_node=False,
    ),
    "MTU by interface": Purpose(
        "enp170s0f1np1 at 1500 on one node, 9000 on two",
        lambda s, n: (
            cell(s, "Value", interface="enp170s0f1np1", mtu="1500") == "1"
            and cell(s, "Value", interface="enp170s0f1np1", mtu="9000") == "2"
        ),
        follows_node=False,
    ),
    "Driver versions": Purpose(
        "every node's driver, one version",
        lambda s, n: (
            {r["instance"] for r in s.rows()} == {n.faulty, n.healthy, n.jobs}
            and {r["driver_version"] for r in s.rows()} == {"550.90.07"}
        ),
        healthy=True,
    ),
    "Busy GPUs waiting on others": Purpose(
        "the faulty node's GPU 0",
        lambda s, n: [(r["instance"], r["gpu"]) for r in s.rows()] == [(n.faulty, "0")],
    ),
    "Busy GPUs' SM clock against the fleet median": Purpose(
        "the faulty node's GPU 3 well below the median",
        lambda s, n: only({x.name: x.last() for x in s.series}, f"{n.faulty} GPU 3", lambda v: v < 0.9),
        follows_node=False,
    ),
    "Probe bandwidth against the fleet median": Purpose(
        "the faulty node's nccl-local run well below the fleet's",
        lambda s, n: only({x.name: x.last() for x in s.series}, f"{n.faulty} nccl-local", lambda v: v < 0.9),
        follows_node=False,
    ),
    "GPUs held back by faults": Purpose(
        "one GPU of the faulty node (held by two reasons, counted once)",
        lambda s, n: s.values() == {n.faulty: 1, n.healthy: 0, n.jobs: 0},
    ),
    "Critical Xid events": Purpose(
        "the faulty node's Xids 74, 94, 63, 79 and 64",
        lambda s, n: (
            {x.name for x in s.series if max((v for _, v in x.points), default=0) > 0}
            == {f"{n.faulty} Xid {x}" for x in (74, 94, 63, 79, 64)}
        ),
    ),
}

FABRIC: dict[str, Purpose] = {
    "Probe bandwidth by node": Purpose(
        "the faulty node's nccl-local run below its expectation",
        lambda s, n: (
            last(s, f"{n.faulty} nccl-local") < last(s, f"{n.faulty} nccl-local expected")
            and last(s, f"{n.healthy} nccl-local") >= last(s, f"{n.healthy} nccl-local expected")
        ),
    ),
    "Probe bandwidth by pair": Purpose(
        "every meeting of h3 at about half the others'",
        lambda s, n: (
            len(s.series) == 8 * 7
            and max(peak(s, x.name) for x in s.series if PAIRS_BAD_HOST in x.name)
            < 0.6 * statistics.median(x.last() for x in s.series if PAIRS_BAD_HOST not in x.name)
        ),
    ),
    "Bandwidth against expectation": Purpose(
        "the faulty node's nccl-local below 0.8 of its expectation, the healthy node's above",
        lambda s, n: last(s, f"{n.faulty} nccl-local ") < 0.8 and last(s, f"{n.healthy} nccl-local ") >= 0.8,
    ),
    "Fleet median by probe": Purpose(
        "the median of nccl-local where the two good runs are, not at the slow one",
        lambda s, n: abs(last(s, "nccl-local") - 4.697e11) < 1e9,
        follows_node=False,
        healthy=True,
    ),
    "What each node costs": Purpose(
        "h3 at half its group's bandwidth, twice the all-reduce time and the GPU-hours it loses; one "
        "row a node",
        lambda s, n: (
            one_row_each(s, "instance")
            and len(s.rows()) == 8
            and float(cell(s, "bandwidth ratio r", instance=f"{PAIRS_BAD_HOST}:9845")) < 0.6
            and float(cell(s, "all-reduce slowdown 1/r", instance=f"{PAIRS_BAD_HOST}:9845")) > 1.6
            and float(cell(s, "GPU-hours lost a day", instance=f"{PAIRS_BAD_HOST}:9845")) > 100
            and all(
                float(r["bandwidth ratio r"]) > 0.9
                for r in s.rows()
                if not r["instance"].startswith(PAIRS_BAD_HOST)
            )
        ),
    ),
    "GPU-hours lost a day, by node": Purpose(
        "h3 loses ten times any other node",
        lambda s, n: (
            last(s, f"{PAIRS_BAD_HOST}:9845 pairs")
            > 10 * max(x.last() for x in s.series if not x.name.startswith(PAIRS_BAD_HOST))
        ),
    ),
    "Bandwidth ratio by leaf": Purpose(
        "h3's leaf below the others, which hold at the reference",
        lambda s, n: (
            len(s.series) == len(set(PAIRS_LEAVES.values()))
            and last(s, f"{PAIRS_LEAVES[PAIRS_BAD_HOST]} pairs") < 0.85
            and all(
                x.last() > 0.9 for x in s.series if not x.name.startswith(f"{PAIRS_LEAVES[PAIRS_BAD_HOST]} ")
            )
        ),
    ),
    "Where each node sits": Purpose(
        "every node of the group on its leaf, one row a node, in the order of their places",
        lambda s, n: (
            one_row_each(s, "instance")
            and {(r["instance"].split(":")[0], r["leaf"]) for r in s.rows()} == set(PAIRS_LEAVES.items())
            and [(r["leaf"], r["instance"]) for r in s.rows()]
            == sorted((r["leaf"], r["instance"]) for r in s.rows())
        ),
    ),
    "Probe success": Purpose(
        "the faulty node's nccl-local failing its expectation, the healthy node's passing",
        lambda s, n: last(s, f"{n.faulty} nccl-local") == 0 and last(s, f"{n.healthy} nccl-local") == 1,
    ),
    "Probe runs by result": Purpose(
        "degraded nccl-local runs", lambda s, n: peak(s, "nccl-local degraded") > 0
    ),
    "Last runs": Purpose(
        "every probe ran within the last minute, with its duration; one row a probe",
        lambda s, n: (
            one_row_each(s, "instance", "probe")
            and {(r["instance"], r["probe"]) for r in s.rows()}
            == {
                (n.faulty, "nccl-local"),
                (n.faulty, "nccl-sockets"),
                (n.healthy, "nccl-local"),
                (n.jobs, "nccl-local"),
            }
            and all(float(r["seconds since it ran"]) < 60 and r["duration"] for r in s.rows())
        ),
        healthy=True,
    ),
    "Link errors across the fleet": Purpose(
        "the faulty node's mlx5_0, mlx5_1 and mlx5_5 erring, no other port",
        lambda s, n: (
            {x.name for x in s.series if peak(s, x.name) > 0} == {f"{n.faulty} mlx5_{d}/1" for d in (0, 1, 5)}
        ),
    ),
}

JOBS: dict[str, Purpose] = {
    "Jobs and their GPUs": Purpose(
        "job 817304 on the faulty node's seven GPUs; 3385 and the mapping file's 9999 on the jobs node",
        lambda s, n: (
            {(r["exported_job"], r["Value"]) for r in s.rows()}
            == {(SLURM_JOB, "7"), ("3385", "3"), ("9999", "1")}
        ),
    ),
    "Busy GPUs without a job": Purpose(
        "the desktop session's GPU", lambda s, n: list(s.values().values()) == [1]
    ),
    "GPUs the sources disagree about": Purpose(
        "GPU 1 of the jobs node", lambda s, n: list(s.values().values()) == [1]
    ),
    "Attribution sources failing": Purpose(
        "the jobs node's mapping files", lambda s, n: list(s.values().values()) == [1]
    ),
    "GPUs of each job": Purpose(
        "817304 on GPUs 0-5 and 7 of the faulty node (cgroup); 9999 on GPU 1 of the jobs node (mapping file)",
        lambda s, n: (
            sorted(r["gpu"] for r in rows(s, exported_job=SLURM_JOB, instance=n.faulty, source="cgroup"))
            == list("012345" + "7")
            and bool(rows(s, exported_job="9999", gpu="1", instance=n.jobs, source="mapping_dir"))
        ),
    ),
    "Health of the jobs' GPUs": Purpose(
        "817304's GPUs 5 and 7 CRITICAL, GPU 0 OK, GPUs named by their index",
        lambda s, n: (
            cell(s, "Value", exported_job=SLURM_JOB, gpu="5") == "CRITICAL"
            and cell(s, "Value", exported_job=SLURM_JOB, gpu="7") == "CRITICAL"
            and cell(s, "Value", exported_job=SLURM_JOB, gpu="0") == "OK"
        ),
    ),
    "SM clock against the job's median": Purpose(
        "817304's GPU 3 well below its job's median clock",
        lambda s, n: only(
            {x.name: x.last() for x in s.series}, f"slurm {SLURM_JOB}/ {n.faulty} GPU 3", lambda v: v < 0.9
        ),
    ),
    "SM activity against the job's median": Purpose(
        "817304's GPU 0 far below its job's median activity",
        lambda s, n: only(
            {x.name: x.last() for x in s.series}, f"slurm {SLURM_JOB}/ {n.faulty} GPU 0", lambda v: v < 0.5
        ),
    ),
    "Jobs' median utilization": Purpose(
        "the three jobs busy",
        lambda s, n: s.values() == {f"slurm {SLURM_JOB}/": 1, "slurm 3385/": 1, "slurm 9999/": 1},
        follows_node=False,
        healthy=True,
    ),
    "Stragglers": Purpose(
        "817304's GPU 3 (its clock) and GPU 0 (its activity)",
        lambda s, n: (
            bool(rows(s, exported_job=SLURM_JOB, gpu="3", signal="sm_clock"))
            and bool(rows(s, exported_job=SLURM_JOB, gpu="0", signal="sm_active"))
            and {r["instance"] for r in s.rows()} == {n.faulty}
        ),
        follows_node=False,
    ),
    "Jobs hit by a node fault": Purpose(
        "817304, on the faulty node",
        lambda s, n: (
            bool(s.rows())
            and {(r["exported_job"], r["instance"]) for r in s.rows()} == {(SLURM_JOB, n.faulty)}
        ),
        follows_node=False,
    ),
    "Critical alerts on the jobs' nodes": Purpose(
        "GPU 6 lost and mlx5_3's port down on the faulty node, which runs 817304",
        lambda s, n: (
            bool(rows(s, alertname="GPUFellOffBus", gpu="6", instance=n.faulty))
            and bool(rows(s, alertname="RDMAPortDown", device="mlx5_3", instance=n.faulty))
        ),
    ),
}

PURPOSES = {
    "clusterhealth-node.json": NODE,
    "clusterhealth-fleet.json": FLEET,
    "clusterhealth-fabric.json": FABRIC,
    "clusterhealth-jobs.json": JOBS,
}


def load(name: str) -> dict[str, Any]:
    return dict(json.loads((DASHBOARDS / name).read_text()))


def key(dashboard: dict[str, Any], panel: dict[str, Any]) -> str:
    """The panel's title, with its type where two panels share the title."""
    titles = [p["title"] for p in panels(dashboard)]
    return panel["title"] if titles.count(panel["title"]) == 1 else f"{panel['title']} ({panel['type']})"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardFleet]:
    with running(tmp_path_factory.mktemp("dashboards-seen")) as running_fleet:
        yield running_fleet


def context(fleet: DashboardFleet, dashboard: dict[str, Any], node: str | None) -> Context:
    """The dashboard as opened over the last 30 minutes, on `node` (the node board) or on all
    nodes, or (`node` for the others) on that node alone."""
    now = time.time()
    multi = next(v for v in dashboard["templating"]["list"] if v["name"] == "node").get("multi", False)
    selected: str | list[str] = [fleet.instance(node)] if multi and node else "$__all"
    if not multi:
        selected = fleet.instance(node or "faulty")
    return Context(
        fleet.prometheus.url,
        dashboard,
        {"datasource": "prometheus", "job": "clusterhealth", "node": selected},
        TimeRange(now - WINDOW, now),
        scrape_interval=1.0,
    )


def looked_at(fleet: DashboardFleet, dashboard: dict[str, Any], purpose: Purpose) -> Context:
    """The view a purpose is checked in: the node board on its node, the others on all nodes."""
    single = not next(v for v in dashboard["templating"]["list"] if v["name"] == "node").get("multi")
    return context(fleet, dashboard, purpose.node if single else None)


def failure(purpose: Purpose, shown: Shown, n: Names) -> str | None:
    """Why `shown` does not show `purpose` (None: it does)."""
    try:
        if purpose.check(shown, n):
            return None
        return f"does not show {purpose.what}"
    except (KeyError, ValueError, IndexError, TypeError, StopIteration) as error:
        return f"does not show {purpose.what} ({type(error).__name__}: {error})"


def names_of(fleet: DashboardFleet) -> Names:
    return Names(fleet.instance("faulty"), fleet.instance("healthy"), fleet.instance("jobs"))


@pytest.mark.parametrize("name", list(PURPOSES))
def test_every_panel_has_a_purpose(name: str) -> None:
    dashboard = load(name)
    keys = [key(dashboard, p) for p in panels(dashboard)]
    assert len(keys) == len(set(keys))
    missing = sorted(set(keys) - set(PURPOSES[name]))
    assert not missing, f"panels whose purpose no test checks (add them to PURPOSES): {missing}"
    assert sorted(set(PURPOSES[name]) - set(keys)) == [], "purposes of panels that are gone"


SHOWN: set[str] = set()  # the dashboards whose every panel has shown its fault


def wait_until_shown(fleet: DashboardFleet, name: str) -> None:
    """Look at every panel of `name` until each shows its fault (the faults come with the first
    scrapes, rates and `for` clauses); fail naming those that never did, with what they show."""
    if name in SHOWN:
        return
    dashboard = load(name)
    n = names_of(fleet)
    assert fleet.instance("faulty") in variable_options(context(fleet, dashboard, None), "node")
    pending = {key(dashboard, p): p for p in panels(dashboard)}
    seen: dict[str, tuple[str, Shown]] = {}
    deadline = time.monotonic() + PATIENCE
    while pending and time.monotonic() < deadline:
        for title, panel in list(pending.items()):
            purpose = PURPOSES[name][title]
            shown = show(looked_at(fleet, dashboard, purpose), panel)
            why = failure(purpose, shown, n)
            if why is None:
                del pending[title]
            else:
                seen[title] = (why, shown)
        if pending:
            time.sleep(1)
    report = [f"{title}: {seen[title][0]}\n{seen[title][1].summary()}" for title in pending]
    assert not pending, f"{len(pending)} panels of {name} do not show their fault:\n\n" + "\n\n".join(report)
    SHOWN.add(name)


@pytest.mark.parametrize("name", list(PURPOSES))
def test_each_panel_shows_its_fault(fleet: DashboardFleet, name: str) -> None:
    wait_until_shown(fleet, name)


@pytest.mark.parametrize("name", list(PURPOSES))
def test_each_purpose_fails_without_its_fault(fleet: DashboardFleet, name: str) -> None:
    """Every purpose fails on a panel that shows nothing; one that follows $node fails on the
    healthy node alone (the fault is not there), unless it is a healthy-data purpose."""
    wait_until_shown(fleet, name)
    dashboard = load(name)
    n = names_of(fleet)
    passed = []
    for panel in panels(dashboard):
        title = key(dashboard, panel)
        purpose = PURPOSES[name][title]
        if failure(purpose, Shown(panel["title"], panel["type"]), n) is None:
            passed.append(f"{title}: passes on a panel that shows nothing")
        if purpose.follows_node and not purpose.healthy:
            shown = show(context(fleet, dashboard, "healthy"), panel)
            if failure(purpose, shown, n) is None:
                passed.append(f"{title}: passes on the healthy node\n{shown.summary()}")
    assert not passed, "purposes that cannot fail:\n" + "\n".join(passed)


def _panel(name: str, title: str) -> tuple[dict[str, Any], dict[str, Any]]:
    dashboard = load(name)
    return dashboard, copy.deepcopy(next(p for p in panels(dashboard) if key(dashboard, p) == title))


# (dashboard, panel, how it is broken): the earlier versions of the panels this check found wrong,
# and a broken query.
BROKEN: list[tuple[str, str, str, Callable[[dict[str, Any]], None]]] = []


def broken(
    name: str, title: str, how: str
) -> Callable[[Callable[[dict[str, Any]], None]], Callable[[dict[str, Any]], None]]:
    def register(mutate: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
        BROKEN.append((name, title, how, mutate))
        return mutate

    return register


@broken("clusterhealth-node.json", "Which wall", "its queries keep __name__ (the merge made two rows a GPU)")
def _(panel: dict[str, Any]) -> None:
    for target in panel["targets"][:2]:
        target["expr"] = target["expr"].removeprefix("max by (instance, job, gpu, uuid) (").removesuffix(")")


@broken("clusterhealth-node.json", "Ports", "the state mapping on every field (a port's 1 read DOWN)")
def _(panel: dict[str, Any]) -> None:
    mappings = panel["fieldConfig"]["overrides"][0]["properties"][0]["value"]
    panel["fieldConfig"]["defaults"]["mappings"] = mappings
    panel["fieldConfig"]["overrides"] = []


@broken("clusterhealth-node.json", "Xid by code", "increase() alone (a code's first Xid never shows)")
def _(panel: dict[str, Any]) -> None:
    panel["targets"][0]["expr"] = (
        "sum by (gpu, xid) (increase("
        'clusterhealth_gpu_xid_errors_total{job="$job",instance=~"$node"}[$__rate_interval]))'
    )


@broken("clusterhealth-node.json", "NVLinks down", "the wrong metric")
def _(panel: dict[str, Any]) -> None:
    panel["targets"][0]["expr"] = panel["targets"][0]["expr"].replace("links_down", "errors_total")


@broken(
    "clusterhealth-fleet.json",
    "Nodes × checks",
    "the recording rule alone (a lost GPU's UNKNOWN hid CRITICAL)",
)
def _(panel: dict[str, Any]) -> None:
    panel["targets"][0]["expr"] = (
        'instance_check:clusterhealth_check_status:max{job="$job",instance=~"$node"}'
    )


@broken("clusterhealth-fleet.json", "GPUs lost", "counts the GPUs that answer")
def _(panel: dict[str, Any]) -> None:
    panel["targets"][0]["expr"] = panel["targets"][0]["expr"].replace("== 0", "== 1")


@broken("clusterhealth-fleet.json", "GPUs held back by faults", "sums the reasons (GPU 3 counted twice)")
def _(panel: dict[str, Any]) -> None:
    panel["targets"][0]["expr"] = panel["targets"][0]["expr"].replace("max by (instance, job, gpu) ", "")


@broken(
    "clusterhealth-fabric.json", "What each node costs", "unaggregated rules (their __name__ split the rows)"
)
def _(panel: dict[str, Any]) -> None:
    for target in panel["targets"]:
        if target["expr"].startswith("max by (instance, probe) ("):
            target["expr"] = target["expr"].removeprefix("max by (instance, probe) (").removesuffix(")")


@broken(
    "clusterhealth-fabric.json",
    "Where each node sits",
    "one sortBy given every key (Grafana sorts by the first alone: pod, empty here)",
)
def _(panel: dict[str, Any]) -> None:
    keys = [t["options"]["sort"][0] for t in panel["transformations"] if t["id"] == "sortBy"]
    others = [t for t in panel["transformations"] if t["id"] != "sortBy"]
    panel["transformations"] = [*others, {"id": "sortBy", "options": {"sort": keys[::-1]}}]


@broken(
    "clusterhealth-jobs.json",
    "Health of the jobs' GPUs",
    "the status mapping on every field (GPU 2 read CRITICAL)",
)
def _(panel: dict[str, Any]) -> None:
    override = panel["fieldConfig"]["overrides"][0]
    panel["fieldConfig"]["defaults"]["mappings"] = override["properties"][0]["value"]
    panel["fieldConfig"]["overrides"] = []


def test_a_broken_panel_fails_its_purpose(fleet: DashboardFleet) -> None:
    for name in PURPOSES:
        wait_until_shown(fleet, name)  # the faults are there
    n = names_of(fleet)
    passed = []
    for name, title, how, mutate in BROKEN:
        dashboard, panel = _panel(name, title)
        purpose = PURPOSES[name][title]
        mutate(panel)
        shown = show(looked_at(fleet, dashboard, purpose), panel)
        if failure(purpose, shown, n) is None:
            passed.append(f"{name} {title} ({how}) still passes:\n{shown.summary()}")
    assert not passed, "\n\n".join(passed)
