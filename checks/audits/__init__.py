"""Node audits and current-health checks: pure functions from observations and a policy to results.

`run_audits` compares what the collectors read (GPU readings, RDMA devices, interface MTUs, recent
kernel-log events: `Observations`) with a `Policy` and returns one `CheckResult` per check and
subject. It reads nothing itself, so the agent's `audit` collector and `clusterhealth check` share
it, and tests feed it fixture trees and hand-built readings.

`CHECKS` below is the table of checks, in the order of `policy.CHECK_NAMES` (the `check` label of
`clusterhealth_check_status`, the names `policy.disabled_checks` accepts): their subjects, when they
fail, and the function that runs each. The functions live by subject: `network` (MTU, RDMA ports,
HCA count), `firmware`, `pcie` and `gpu_health`.

Inputs that are None could not be read: the checks that need them report UNKNOWN with the reason,
never OK. A node without such hardware passes an empty list instead. A check with nothing to
compare (no rule, a single HCA of its board) yields no result rather than an OK it did not earn.
A check that covers every subject but cannot run at all reports subject ``node``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from clusterhealth.checks.audits import firmware, gpu_health, network, pcie
from clusterhealth.checks.audits.firmware import firmware_inventory
from clusterhealth.checks.audits.observations import Observations
from clusterhealth.checks.audits.status import (
    CRITICAL,
    NODE,
    OK,
    UNKNOWN,
    WARNING,
    CheckResult,
    Status,
    worst,
)
from clusterhealth.checks.policy import CHECK_NAMES, Policy


@dataclass(frozen=True)
class Check:
    name: str
    subject: str  # what one result is about, as the `subject` label shows it
    fails_when: str  # for the README's table
    run: Callable[[Policy, Observations], list[CheckResult]]


CHECKS: tuple[Check, ...] = (
    Check(
        "mtu",
        "interface",
        "its MTU differs from the first `policy.mtu` rule whose pattern matches it",
        network.mtu,
    ),
    Check(
        "rdma_port_state",
        "`mlx5_3/1`",
        "a port is not ACTIVE and LinkUp (by default every port; `policy.rdma_ports` rules narrow it)",
        network.rdma_port_state,
    ),
    Check(
        "rdma_port_rate",
        "`mlx5_0/1`",
        "an ACTIVE port runs below the rule's `rate_gbps`",
        network.rdma_port_rate,
    ),
    Check(
        "hca_count",
        "the rule's pattern",
        "fewer (CRITICAL) or more (WARNING) RDMA devices match than the rule's `count`",
        network.hca_count,
    ),
    Check(
        "gpu_count",
        "`node`",
        "fewer (CRITICAL) or more (WARNING) GPUs answer NVML than `policy.gpu_count`",
        gpu_health.gpu_count,
    ),
    Check(
        "hca_firmware",
        "device",
        "its firmware differs from the version pinned for its board, or (no pin) from the other HCAs "
        "of its board on the node",
        firmware.hca_firmware,
    ),
    Check(
        "gpu_driver",
        "`driver`",
        "the NVIDIA driver differs from `policy.firmware.gpu_driver`",
        firmware.gpu_driver,
    ),
    Check(
        "gpu_vbios",
        "GPU",
        "its VBIOS differs from the version pinned for its model, or (no pin) from the other GPUs of "
        "its model on the node",
        firmware.gpu_vbios,
    ),
    Check(
        "gpu_pcie_link",
        "GPU",
        "the link is narrower than its maximum (generation on request: an idle GPU lowers it to save power)",
        pcie.gpu_pcie_link,
    ),
    Check(
        "hca_pcie_link",
        "device",
        "the HCA's link is narrower (or, on request, slower) than its maximum",
        pcie.hca_pcie_link,
    ),
    Check("gpu_lost", "GPU", "the GPU does not answer NVML", gpu_health.gpu_lost),
    Check(
        "gpu_ecc_uncorrectable",
        "GPU",
        "volatile uncorrectable ECC errors since the driver loaded; SRAM uncorrectable errors past "
        "NVIDIA's threshold (CRITICAL: NVIDIA's RMA criterion for SRAM in its GPU Memory "
        "Error Management, RMA Policy: confirm with the field diagnostic and replace)",
        gpu_health.gpu_ecc_uncorrectable,
    ),
    Check(
        "gpu_row_remap",
        "GPU",
        "a row remap failed (CRITICAL: replace) or is pending (WARNING by default: reset)",
        gpu_health.gpu_row_remap,
    ),
    Check(
        "gpu_xid",
        "GPU",
        "a critical Xid within `xid_window_seconds` (from NVML events or the kernel log), with the "
        "catalog's meaning and action; informational ones (43, 45) are OK",
        gpu_health.gpu_xid,
    ),
    Check(
        "gpu_recovery_action",
        "GPU",
        "NVML's recovery action for the GPU is not `none` (gpu_reset, node_reboot, drain_p2p, "
        "drain_and_reset, system_reboot, ...), also for a GPU that answers everything else with "
        "ResetRequired; GPUs whose driver does not say have no result",
        gpu_health.gpu_recovery_action,
    ),
)


def run_audits(policy: Policy, observations: Observations) -> list[CheckResult]:
    """Every check of `CHECKS`, in that order, minus `policy.disabled_checks`."""
    disabled = set(policy.disabled_checks)
    return [
        result for check in CHECKS if check.name not in disabled for result in check.run(policy, observations)
    ]


def checks_markdown() -> str:
    """The README's table of checks."""
    lines = ["| check | subject | fails when |", "| --- | --- | --- |"]
    lines += [f"| `{c.name}` | {c.subject} | {c.fails_when} |" for c in CHECKS]
    return "\n".join(lines) + "\n"


__all__ = [
    "CHECKS",
    "CHECK_NAMES",
    "CRITICAL",
    "NODE",
    "OK",
    "UNKNOWN",
    "WARNING",
    "Check",
    "CheckResult",
    "Observations",
    "Status",
    "checks_markdown",
    "firmware_inventory",
    "run_audits",
    "worst",
]
