"""PCIe checks: GPU and HCA links at their maximum width (and generation, on request).

An idle GPU lowers its link speed (to Gen1 on H100) to save power, so the GPU generation is
checked only when `policy.pcie.gpu_generation` asks, and then a lower generation is OK while NVML
reports the `gpu_idle` clock-event reason, the policy's severity while it does not, and WARNING
when NVML could not tell. The width never drops at idle and is checked by default.
"""

from __future__ import annotations

from clusterhealth.checks.audits.observations import Observations, each_gpu
from clusterhealth.checks.audits.status import NODE, SEVERITY_STATUS, CheckResult, Status, worse
from clusterhealth.checks.policy import Policy
from clusterhealth.exporters.gpu import CLOCK_EVENT_REASONS, GpuReading

_GPU_IDLE = dict(CLOCK_EVENT_REASONS)["gpu_idle"]


def _link_status(
    name: str,
    generation: tuple[int | None, int | None] | None,
    width: tuple[int | None, int | None] | None,
    severity: Status,
    action: str,
    idle: bool | None = None,
) -> tuple[Status, str]:
    """Status and message of one PCIe link; a None pair is not checked, idle None means unknown."""
    status, degraded, unreadable, fine = Status.OK, [], [], []
    if width is not None:
        current, maximum = width
        if current is None or maximum is None:
            unreadable.append("width")
        elif current < maximum:
            status = worse(status, severity)
            degraded.append(f"x{current} of x{maximum}")
        else:
            fine.append(f"x{current}")
    if generation is not None:
        current, maximum = generation
        if current is None or maximum is None:
            unreadable.append("generation")
        elif current >= maximum:
            fine.append(f"Gen{current}")
        elif idle:
            fine.append(f"Gen{current} of Gen{maximum} while idle (power saving)")
        elif idle is None:
            status = worse(status, Status.WARNING)
            degraded.append(f"Gen{current} of Gen{maximum}, and NVML could not tell whether it is idle")
        else:
            status = worse(status, severity)
            degraded.append(f"Gen{current} of Gen{maximum} while busy")
    parts = []
    if degraded:
        parts.append(f"{name} PCIe link {', '.join(degraded)}: {action}")
    if unreadable:
        status = worse(status, Status.UNKNOWN)
        parts.append(f"{name} PCIe link {' and '.join(unreadable)} could not be read")
    return status, "; ".join(parts) or f"{name} PCIe link {', '.join(fine)}"


def gpu_pcie_link(policy: Policy, obs: Observations) -> list[CheckResult]:
    pcie = policy.pcie
    if not (pcie.gpu_width or pcie.gpu_generation):
        return []

    def judge(gpu: GpuReading) -> CheckResult:
        reasons = gpu.clocks_event_reasons
        status, message = _link_status(
            f"GPU {gpu.index}" + (f" ({gpu.pci_bus_id})" if gpu.pci_bus_id else ""),
            (gpu.pcie_link_generation, gpu.pcie_link_generation_max) if pcie.gpu_generation else None,
            (gpu.pcie_link_width, gpu.pcie_link_width_max) if pcie.gpu_width else None,
            SEVERITY_STATUS[pcie.severity],
            "drain the node and reseat the GPU or its riser/cable; the link retrains at reboot",
            idle=None if reasons is None else bool(reasons & _GPU_IDLE),
        )
        return CheckResult("gpu_pcie_link", str(gpu.index), status, message)

    return each_gpu("gpu_pcie_link", obs, judge)


def hca_pcie_link(policy: Policy, obs: Observations) -> list[CheckResult]:
    pcie = policy.pcie
    if not (pcie.hca_width or pcie.hca_generation):
        return []
    if obs.rdma is None:
        return [
            CheckResult(
                "hca_pcie_link", NODE, Status.UNKNOWN, "RDMA devices could not be read (class/infiniband)"
            )
        ]
    results = []
    for device in obs.rdma:
        pci = device.pci
        # No PCI function (soft RoCE) or a virtual function, whose link registers are reserved.
        if pci is None or (pci.width is None and pci.width_max is None):
            continue
        status, message = _link_status(
            f"{device.name} ({pci.address})",
            (pci.generation, pci.generation_max) if pcie.hca_generation else None,
            (pci.width, pci.width_max) if pcie.hca_width else None,
            SEVERITY_STATUS[pcie.severity],
            "drain the node and reseat the HCA or check its slot and riser; the link retrains at reboot",
            idle=False,
        )
        results.append(CheckResult("hca_pcie_link", device.name, status, message))
    return results
