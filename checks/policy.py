"""What a healthy node looks like: the policy `checks.audits` compares the node against.

Frozen dataclasses whose keys are declared with `setting()` (checks/schema.py), as the agent's
config file declares its own, so the agent's loader validates a `policy:` section (unknown keys,
types, `min`/`max`/`choices`, `check` hooks) and its reference generator documents every key from
`doc`.

Every key is optional. Where no expectation holds on every node (MTUs, port speeds, device
counts, firmware versions) the default is "not checked"; what is wrong on any node (a lost GPU, an
uncorrectable ECC error, a PCIe link narrower than it can be, two HCAs of one board on different
firmware) is checked by default.

Rule lists (`mtu`, `rdma_ports`, `hca_count`) are tried in order and the first rule that matches
a name applies, so specific rules go before general ones. Patterns are Python regular expressions
matched against the whole name (`re.fullmatch`): `ibp.*`, `mlx5_[0-7]`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from clusterhealth.checks.schema import check_pattern, setting

SEVERITIES = ("warning", "critical")
# The node's checks in the order they run: the `check` label of clusterhealth_check_status and the
# names `disabled_checks` accepts. checks/audits/ (its CHECKS table, in this order) runs each; the
# names live here because the audits read the policy, not the other way round.
CHECK_NAMES = (
    "mtu",
    "rdma_port_state",
    "rdma_port_rate",
    "hca_count",
    "gpu_count",
    "hca_firmware",
    "gpu_driver",
    "gpu_vbios",
    "gpu_pcie_link",
    "hca_pcie_link",
    "gpu_lost",
    "gpu_ecc_uncorrectable",
    "gpu_row_remap",
    "gpu_xid",
    "gpu_recovery_action",
)
# Names as drivers/infiniband/core/sysfs.c prints them after "<id>: " in `state` and `phys_state`.
PORT_STATES = ("DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")
PORT_PHYSICAL_STATES = (
    "Sleep",
    "Polling",
    "Disabled",
    "PortConfigurationTraining",
    "LinkUp",
    "LinkErrorRecovery",
    "Phy Test",
)
LINK_LAYERS = ("InfiniBand", "Ethernet")

# Letters and digits in groups joined by dots, dashes or underscores, with at least one digit:
# 28.39.1002, 96.00.74.00.01, 550.54.15, 1.71, 20.0.2-1.
_VERSION_RE = re.compile(r"[0-9A-Za-z]+(?:[._-][0-9A-Za-z]+)*")
_VERSION_EXPECTED = "a version such as 28.39.1002: letters and digits joined by dots or dashes"


def check_version(value: str) -> str | None:
    """`check=` for a firmware or driver version string."""
    if not _VERSION_RE.fullmatch(value) or not any(c.isdigit() for c in value):
        return _VERSION_EXPECTED
    return None


def check_versions_by_name(value: Mapping[str, str]) -> str | None:
    """`check=` for a mapping of board id or GPU model name to version."""
    for name, version in value.items():
        if not name.strip():
            return "a non-empty board id or GPU model name as each key"
        problem = check_version(version)
        if problem:
            return f"{problem} (the value for {name!r} is {version!r})"
    return None


def check_check_names(value: tuple[str, ...]) -> str | None:
    """`check=` for a list of check names."""
    unknown = [name for name in value if name not in CHECK_NAMES]
    if unknown:
        return f"check names from {', '.join(CHECK_NAMES)} (unknown: {', '.join(unknown)})"
    return None


@dataclass(frozen=True)
class MtuRule:
    """Interfaces whose name matches `interfaces` must have MTU `mtu`."""

    interfaces: str = setting(
        "",
        doc="regular expression matched against the whole interface name, e.g. ibp.* (required)",
        check=check_pattern,
    )
    mtu: int | None = setting(
        None, doc="the MTU those interfaces must have, e.g. 9000 or 4092 (required)", min=68, max=65536
    )
    severity: str = setting("critical", doc="status of a mismatch", choices=SEVERITIES)


@dataclass(frozen=True)
class RdmaPortRule:
    """What every port of the RDMA devices matching `devices` must look like."""

    devices: str = setting(
        ".*",
        doc="regular expression matched against the whole RDMA device name, e.g. mlx5_[0-7]",
        check=check_pattern,
    )
    link_layer: str | None = setting(
        None, doc="only ports of this link layer (any when unset)", choices=LINK_LAYERS
    )
    state: str = setting("ACTIVE", doc="the logical port state they must be in", choices=PORT_STATES)
    physical_state: str = setting(
        "LinkUp", doc="the physical port state they must be in", choices=PORT_PHYSICAL_STATES
    )
    rate_gbps: float | None = setting(
        None,
        doc="the least rate in Gb/s an ACTIVE port must run at, e.g. 400 for 4X NDR (not checked when unset)",
        min=1,
        max=10_000,
    )


@dataclass(frozen=True)
class HcaCountRule:
    """Exactly `count` RDMA devices must match `devices`."""

    devices: str = setting(
        ".*",
        doc="regular expression matched against the whole RDMA device name; also the result's subject",
        check=check_pattern,
    )
    count: int | None = setting(None, doc="how many RDMA devices must match (required)", min=0, max=1024)


@dataclass(frozen=True)
class FirmwarePolicy:
    hca: dict[str, str] = setting(
        default_factory=dict,
        doc="HCA firmware (fw_ver) by board_id (PSID), e.g. MT_0000000838: 28.39.1002; "
        "quote versions YAML would read as numbers",
        check=check_versions_by_name,
    )
    gpu_driver: str | None = setting(
        None, doc="NVIDIA driver version, e.g. 550.54.15 (not checked when unset)", check=check_version
    )
    gpu_vbios: dict[str, str] = setting(
        default_factory=dict,
        doc="VBIOS version by GPU model name as NVML reports it, e.g. NVIDIA H100 80GB HBM3: 96.00.74.00.01",
        check=check_versions_by_name,
    )
    uniform: bool = setting(
        True,
        doc="HCAs of one board_id, and GPUs of one model, not pinned above must all run the same "
        "firmware; those off the most common version are reported",
    )
    severity: str = setting("warning", doc="status of a firmware or driver mismatch", choices=SEVERITIES)


@dataclass(frozen=True)
class PciePolicy:
    gpu_width: bool = setting(True, doc="GPU PCIe links must run at their maximum width (lanes)")
    gpu_generation: bool = setting(
        False,
        doc="GPU PCIe links must run at their maximum generation; an idle GPU lowers its link speed "
        "to save power, so a lower generation is reported only while NVML says the GPU is busy",
    )
    hca_width: bool = setting(True, doc="HCA PCIe links must run at their maximum width (lanes)")
    hca_generation: bool = setting(
        False,
        doc="HCA PCIe links must run at their maximum generation (off by default: a card faster than "
        "its slot, e.g. PCIe Gen5 in a Gen4 server, is normal and would always be reported)",
    )
    severity: str = setting("critical", doc="status of a degraded PCIe link", choices=SEVERITIES)


@dataclass(frozen=True)
class GpuHealthPolicy:
    xid_window_seconds: float = setting(
        3600.0,
        doc="how long a GPU is reported after an Xid in the kernel log: critical Xids CRITICAL, "
        "others WARNING, informational ones (43, 45) OK",
        min=60,
        max=30 * 86400,
    )
    row_remap_pending: str = setting(
        "warning",
        doc="status of a GPU whose row remap waits for a GPU reset (a failed remap is always CRITICAL)",
        choices=SEVERITIES,
    )


@dataclass(frozen=True)
class Policy:
    mtu: tuple[MtuRule, ...] = setting(
        (),
        doc="MTU rules, each {interfaces: pattern, mtu: bytes, severity}; the first matching rule applies "
        "to an interface, interfaces no rule matches are not checked",
    )
    # A port that is not up is a problem wherever it is; speeds differ between fabrics.
    rdma_ports: tuple[RdmaPortRule, ...] = setting(
        (RdmaPortRule(),),
        doc="RDMA port rules, each {devices: pattern, link_layer, state, physical_state, rate_gbps}; "
        "the first matching rule applies to a port, ports no rule matches are not checked "
        "(default: every port ACTIVE and LinkUp, any rate)",
    )
    hca_count: tuple[HcaCountRule, ...] = setting(
        (), doc="RDMA device counts, each {devices: pattern, count}"
    )
    gpu_count: int | None = setting(
        None, doc="how many GPUs must answer NVML (not checked when unset)", min=0, max=1024
    )
    firmware: FirmwarePolicy = setting(
        default_factory=FirmwarePolicy, doc="expected firmware and driver versions"
    )
    pcie: PciePolicy = setting(default_factory=PciePolicy, doc="PCIe link checks")
    gpu_health: GpuHealthPolicy = setting(default_factory=GpuHealthPolicy, doc="current GPU health checks")
    disabled_checks: tuple[str, ...] = setting(
        (),
        doc="names of checks not to run, e.g. gpu_row_remap on GPUs older than Ampere",
        check=check_check_names,
    )
