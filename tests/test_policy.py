"""The audit policy: defaults, a full `policy:` section through the agent's loader, validation hooks."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from clusterhealth.agent.settings import ConfigError, from_mapping, reference
from clusterhealth.checks.policy import (
    CHECK_NAMES,
    FirmwarePolicy,
    GpuHealthPolicy,
    HcaCountRule,
    MtuRule,
    PciePolicy,
    Policy,
    RdmaPortRule,
    check_check_names,
    check_pattern,
    check_version,
    check_versions_by_name,
)

# The policy of a DGX H100-class node like tests/fixtures/sysfs/cluster-node: eight NDR compute
# HCAs with IPoIB, one dual-port ConnectX-7 for RoCE storage. The report's YAML example.
FULL_POLICY = """
mtu:
  - interfaces: "ibp.*"
    mtu: 4092
  - interfaces: "enp170s0f[01]np[01]"
    mtu: 9000
    severity: warning
rdma_ports:
  - devices: "mlx5_[0-7]"
    link_layer: InfiniBand
    rate_gbps: 400
  - devices: "mlx5_(8|9)"
    link_layer: Ethernet
    state: ACTIVE
    physical_state: LinkUp
    rate_gbps: 200
hca_count:
  - devices: "mlx5_[0-7]"
    count: 8
  - devices: "mlx5_(8|9)"
    count: 2
gpu_count: 8
firmware:
  hca:
    MT_0000000838: "28.39.1002"
    MT_0000000834: "28.39.1002"
  gpu_driver: "550.90.07"
  gpu_vbios:
    NVIDIA H100 80GB HBM3: "96.00.99.00.01"
  uniform: true
  severity: warning
pcie:
  gpu_width: true
  gpu_generation: true
  hca_width: true
  hca_generation: true
  severity: critical
gpu_health:
  xid_window_seconds: 7200
  row_remap_pending: critical
disabled_checks: []
"""


def load(text: str) -> Policy:
    return from_mapping(Policy, yaml.safe_load(text) or {}, "policy.yaml")


def test_the_default_policy_checks_only_what_holds_on_every_node() -> None:
    policy = load("")
    assert policy == Policy()
    assert (policy.mtu, policy.hca_count, policy.gpu_count) == ((), (), None)
    # A port that is not up is a problem on any node: every port must be ACTIVE and LinkUp.
    assert policy.rdma_ports == (
        RdmaPortRule(devices=".*", state="ACTIVE", physical_state="LinkUp", rate_gbps=None),
    )
    assert policy.firmware == FirmwarePolicy(hca={}, gpu_driver=None, gpu_vbios={}, uniform=True)
    # Width is checked everywhere; generation drops at idle (GPUs) or sits below a card's maximum
    # in an older slot (HCAs), so it is checked only on request.
    assert policy.pcie == PciePolicy(
        gpu_width=True, gpu_generation=False, hca_width=True, hca_generation=False
    )
    assert policy.gpu_health == GpuHealthPolicy(xid_window_seconds=3600.0, row_remap_pending="warning")


def test_a_full_policy_loads_into_typed_objects() -> None:
    policy = load(FULL_POLICY)
    assert policy.mtu == (MtuRule("ibp.*", 4092), MtuRule("enp170s0f[01]np[01]", 9000, "warning"))
    assert policy.rdma_ports == (
        RdmaPortRule("mlx5_[0-7]", "InfiniBand", "ACTIVE", "LinkUp", 400.0),
        RdmaPortRule("mlx5_(8|9)", "Ethernet", "ACTIVE", "LinkUp", 200.0),
    )
    assert isinstance(policy.rdma_ports[0].rate_gbps, float)
    assert policy.hca_count == (HcaCountRule("mlx5_[0-7]", 8), HcaCountRule("mlx5_(8|9)", 2))
    assert policy.gpu_count == 8
    assert policy.firmware.hca == {"MT_0000000838": "28.39.1002", "MT_0000000834": "28.39.1002"}
    assert policy.firmware.gpu_driver == "550.90.07"
    assert policy.firmware.gpu_vbios == {"NVIDIA H100 80GB HBM3": "96.00.99.00.01"}
    assert policy.pcie.gpu_generation is True
    assert policy.gpu_health.xid_window_seconds == 7200.0
    assert policy.gpu_health.row_remap_pending == "critical"


def test_every_key_is_documented_for_the_reference() -> None:
    rows = reference(Policy)
    keys = [key for key, _, _ in rows]
    assert "firmware.hca" in keys and "gpu_health.xid_window_seconds" in keys and "mtu" in keys
    assert all(doc for _, _, doc in rows)
    for rule in (MtuRule, RdmaPortRule, HcaCountRule):
        assert all(f.metadata["doc"] for f in dataclasses.fields(rule))


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        (
            "mtu:\n  - interfaces: 'ibp[0-9'\n    mtu: 4092\n",
            "mtu[0].interfaces",
            "a valid regular expression",
        ),
        ("mtu:\n  - interfaces: ''\n    mtu: 4092\n", "mtu[0].interfaces", "a non-empty regular expression"),
        ("mtu:\n  - interfaces: 'ibp.*'\n    mtu: 40\n", "mtu[0].mtu", "between 68 and 65536"),
        ("mtu:\n  - interfaces: 'ibp.*'\n    mtu: 4092\n    severity: fatal\n", "mtu[0].severity", "warning"),
        ("mtu:\n  - interface: 'ibp.*'\n", "mtu[0].interface", "known keys"),
        ("rdma_ports:\n  - devices: '(mlx5'\n", "rdma_ports[0].devices", "a valid regular expression"),
        ("rdma_ports:\n  - state: UP\n", "rdma_ports[0].state", "one of DOWN, INIT, ARMED, ACTIVE"),
        ("rdma_ports:\n  - physical_state: linkup\n", "rdma_ports[0].physical_state", "LinkUp"),
        ("rdma_ports:\n  - link_layer: IB\n", "rdma_ports[0].link_layer", "InfiniBand, Ethernet"),
        ("hca_count:\n  - devices: 'mlx5_*['\n    count: 8\n", "hca_count[0].devices", "regular expression"),
        ("firmware:\n  gpu_driver: 'latest'\n", "firmware.gpu_driver", "a version such as 28.39.1002"),
        ("firmware:\n  gpu_driver: '550.54.15 '\n", "firmware.gpu_driver", "a version such as"),
        # YAML reads an unquoted two-part version as a number.
        ("firmware:\n  gpu_driver: 550.54\n", "firmware.gpu_driver", "a string"),
        ("gpu_health:\n  row_remap_pending: ignore\n", "gpu_health.row_remap_pending", "warning, critical"),
        ("gpu_health:\n  xid_window_seconds: 10\n", "gpu_health.xid_window_seconds", "between 60"),
        ("pcie:\n  gpu_width: 'yes'\n", "pcie.gpu_width", "true or false"),
    ],
)
def test_a_bad_value_names_the_key_and_what_was_expected(text: str, key: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(text)
    assert caught.value.key == key
    assert expected in caught.value.expected
    assert str(caught.value).startswith(f"policy.yaml: {key}: expected ")


@pytest.mark.parametrize("pattern", ["ibp.*", "mlx5_[0-7]", "enp170s0f[01]np[01]", "(ib|en)p\\d+s0"])
def test_check_pattern_accepts_regular_expressions(pattern: str) -> None:
    assert check_pattern(pattern) is None


@pytest.mark.parametrize("pattern", ["ibp[0-9", "(mlx5", "*", ""])
def test_check_pattern_rejects_what_re_cannot_compile(pattern: str) -> None:
    problem = check_pattern(pattern)
    assert problem is not None and "regular expression" in problem


@pytest.mark.parametrize(
    "version", ["28.39.1002", "96.00.74.00.01", "550.54.15", "1.71", "20.0.2-1", "16.35.2000", "535"]
)
def test_check_version_accepts_real_versions(version: str) -> None:
    assert check_version(version) is None


@pytest.mark.parametrize(
    "version", ["", " 28.39.1002", "28.39.1002\n", "28..39", ".28", "28.", "latest", "28.39 (beta)", "v-"]
)
def test_check_version_rejects_garbage(version: str) -> None:
    assert check_version(version) == (
        "a version such as 28.39.1002: letters and digits joined by dots or dashes"
    )


def test_the_version_maps_are_checked_value_by_value() -> None:
    # The agent's loader builds dict values without field metadata; this hook is the field's check.
    hook = dataclasses.fields(FirmwarePolicy)[0].metadata["check"]
    assert hook is check_versions_by_name
    assert hook({"MT_0000000838": "28.39.1002", "MT_0000000834": "28.39.1002"}) is None
    problem = hook({"MT_0000000838": "28.39.1002", "MT_0000000834": "28,39,1002"})
    assert problem is not None
    assert "a version such as 28.39.1002" in problem and "'MT_0000000834'" in problem
    assert "non-empty" in (hook({" ": "28.39.1002"}) or "")


def test_disabled_checks_must_name_real_checks() -> None:
    assert check_check_names(("gpu_row_remap", "hca_pcie_link")) is None
    problem = check_check_names(("gpu_row_remap", "gpu_remap"))
    assert problem is not None and "unknown: gpu_remap" in problem and "gpu_row_remap" in problem


def test_the_policy_accepts_the_names_of_the_check_table() -> None:
    from clusterhealth.checks.audits import CHECKS

    assert tuple(check.name for check in CHECKS) == CHECK_NAMES
    assert len(set(CHECK_NAMES)) == len(CHECK_NAMES)
    assert check_check_names(CHECK_NAMES) is None
