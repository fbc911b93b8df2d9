"""Node audits and current-health checks: pure functions from readings and a policy to results.

`run_audits` compares what the exporters read (GPU readings, RDMA devices, interface MTUs, recent
kernel-log events) with a `Policy` and returns one `CheckResult` per check and subject. It reads
nothing itself, so the agent's `audit` collector and `clusterhealth check` share it, and tests
feed it fixture trees and hand-built readings.

Checks (the `check` label of `clusterhealth_check_status`) and their subjects:

- ``mtu`` (interface): MTU per the first `policy.mtu` rule matching the interface.
- ``rdma_port_state`` (``mlx5_0/1``): port and physical state per `policy.rdma_ports`.
- ``rdma_port_rate`` (``mlx5_0/1``): an ACTIVE port's rate is at least the rule's `rate_gbps`.
- ``hca_count`` (the rule's devices pattern): how many RDMA devices match; fewer CRITICAL, more WARNING.
- ``gpu_count`` (``node``): how many GPUs answer NVML; fewer CRITICAL, more WARNING.
- ``hca_firmware`` (device): fw_ver per board_id, or the same as the HCAs of its board.
- ``gpu_driver`` (``driver``): the NVIDIA driver version.
- ``gpu_vbios`` (GPU index): VBIOS per GPU model, or the same as the GPUs of its model.
- ``gpu_pcie_link`` (GPU index), ``hca_pcie_link`` (device): link width (and generation) at maximum.
- ``gpu_lost`` (GPU index): CRITICAL when the GPU does not answer NVML.
- ``gpu_ecc_uncorrectable`` (GPU index): CRITICAL on uncorrectable ECC errors since the driver loaded.
- ``gpu_row_remap`` (GPU index): failed remap CRITICAL, pending one WARNING (or per policy).
- ``gpu_xid`` (GPU index): an Xid within the window; critical ones CRITICAL, the others WARNING,
  informational ones (43, 45: the fallout of a killed process) OK.

Inputs that are None could not be read: the checks that need them report UNKNOWN with the reason,
never OK. A node without such hardware passes an empty list instead. A check with nothing to
compare (no rule, a single HCA of its board) yields no result rather than an OK it did not earn.
A check that covers every subject but cannot run at all reports subject ``node``.

Decisions:

- PCIe generation on GPUs: an idle GPU lowers its link speed (to Gen1 on H100) to save power, so
  the generation is checked only when `policy.pcie.gpu_generation` asks, and then a lower
  generation is OK while NVML reports the `gpu_idle` clock-event reason, the policy's severity
  while it does not, and WARNING when NVML could not tell. The width never drops at idle and is
  checked by default.
- `worst` follows the Nagios/NHC convention for a node's overall status: CRITICAL if any result is
  critical, else UNKNOWN if any is unknown, else WARNING, else OK. UNKNOWN (3) outranks WARNING
  because a check that could not run may hide a critical fault, but not CRITICAL, which is known.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from clusterhealth.checks.kernel_log import normalize_pci_bus_id
from clusterhealth.checks.kernel_watch import SeenEvent
from clusterhealth.checks.policy import (
    FirmwarePolicy,
    GpuHealthPolicy,
    HcaCountRule,
    MtuRule,
    PciePolicy,
    Policy,
    RdmaPortRule,
)
from clusterhealth.checks.xid_catalog import describe
from clusterhealth.exporters.gpu import CLOCK_EVENT_REASONS, GpuReading
from clusterhealth.exporters.infiniband import RdmaDevice, RdmaPort

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
STATUS_NAMES = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
_SEVERITY_STATUS = {"warning": WARNING, "critical": CRITICAL}
_GPU_IDLE = dict(CLOCK_EVENT_REASONS)["gpu_idle"]
# How `worst` ranks statuses: the Nagios/NHC precedence, which is not their numeric order.
_PRECEDENCE = {OK: 0, WARNING: 1, UNKNOWN: 2, CRITICAL: 3}
NODE = "node"


@dataclass(frozen=True)
class CheckResult:
    check: str
    subject: str
    status: int  # OK, WARNING, CRITICAL or UNKNOWN
    message: str


def _worse(a: int, b: int) -> int:
    return max(a, b, key=_PRECEDENCE.__getitem__)


def worst(results: Iterable[CheckResult]) -> int:
    """The node's status and `clusterhealth check`'s exit code: CRITICAL > UNKNOWN > WARNING > OK."""
    return max((r.status for r in results), key=_PRECEDENCE.__getitem__, default=OK)


def firmware_inventory(
    gpus: Sequence[GpuReading] | None,
    driver_version: str | None,
    rdma: Sequence[RdmaDevice] | None,
) -> list[tuple[str, str, str]]:
    """(component, subject, version) for `clusterhealth_firmware_info`, whatever the policy.

    Components: ``hca`` (subject the device, fw_ver), ``gpu_vbios`` (subject the GPU index) and
    ``gpu_driver`` (subject ``driver``). Versions that could not be read are left out.
    """
    inventory = [("hca", d.name, d.firmware_version) for d in rdma or () if d.firmware_version]
    inventory += [
        ("gpu_vbios", str(g.index), g.vbios_version)
        for g in sorted(gpus or (), key=lambda g: g.index)
        if g.up and g.vbios_version
    ]
    if driver_version:
        inventory.append(("gpu_driver", "driver", driver_version))
    return inventory


def run_audits(
    policy: Policy,
    *,
    gpus: Sequence[GpuReading] | None,
    driver_version: str | None,
    rdma: Sequence[RdmaDevice] | None,
    netdev_mtus: Mapping[str, int] | None,
    recent_kernel_events: Sequence[SeenEvent] | None,
    now_boot_seconds: float,
) -> list[CheckResult]:
    """Every check of the module docstring, in that order, minus `policy.disabled_checks`.

    `recent_kernel_events` are the kernel-log events the watcher kept; `now_boot_seconds` is the
    time since boot on their clock (CLOCK_MONOTONIC, `time.monotonic()`).
    """
    gpu_list = sorted(gpus, key=lambda g: g.index) if gpus is not None else None
    results = [
        *_mtu(policy.mtu, netdev_mtus),
        *_rdma_ports(policy.rdma_ports, rdma),
        *_hca_count(policy.hca_count, rdma),
        *_gpu_count(policy.gpu_count, gpu_list),
        *_hca_firmware(policy.firmware, rdma),
        *_gpu_driver(policy.firmware, driver_version),
        *_gpu_vbios(policy.firmware, gpu_list),
        *_gpu_pcie_link(policy.pcie, gpu_list),
        *_hca_pcie_link(policy.pcie, rdma),
        *_gpu_lost(gpu_list),
        *_gpu_ecc(gpu_list),
        *_gpu_row_remap(policy.gpu_health, gpu_list),
        *_gpu_xid(policy.gpu_health, gpu_list, recent_kernel_events, now_boot_seconds),
    ]
    disabled = set(policy.disabled_checks)
    return [r for r in results if r.check not in disabled]


def _natural(name: str) -> list[int | str]:
    """ibp64s0 before ibp154s0."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _compile(pattern: str) -> re.Pattern[str] | None:
    # The loader rejects bad patterns; a Policy built in code may still hold one.
    try:
        return re.compile(pattern) if pattern else None
    except re.error:
        return None


def _bad_pattern(check: str, pattern: str, what: str) -> CheckResult:
    return CheckResult(
        check,
        pattern or NODE,
        UNKNOWN,
        f"policy: {what} pattern {pattern!r} is not a valid regular expression",
    )


def _gbps(bytes_per_second: int) -> float:
    return bytes_per_second * 8 / 1e9


# --- mtu ---------------------------------------------------------------------------------------


def _mtu(rules: Sequence[MtuRule], mtus: Mapping[str, int] | None) -> list[CheckResult]:
    results: list[CheckResult] = []
    usable: list[tuple[re.Pattern[str], MtuRule]] = []
    for number, rule in enumerate(rules, 1):
        compiled = _compile(rule.interfaces)
        if not rule.interfaces or rule.mtu is None:
            results.append(
                CheckResult(
                    "mtu",
                    f"rule{number}",
                    UNKNOWN,
                    f"policy: MTU rule {number} needs both interfaces (a pattern) and mtu",
                )
            )
        elif compiled is None:
            results.append(_bad_pattern("mtu", rule.interfaces, "interfaces"))
        elif mtus is None:
            results.append(
                CheckResult(
                    "mtu",
                    rule.interfaces,
                    UNKNOWN,
                    f"interface MTUs could not be read (class/net), so interfaces matching "
                    f"{rule.interfaces} were not checked",
                )
            )
        else:
            usable.append((compiled, rule))
    for name, mtu in sorted((mtus or {}).items(), key=lambda item: _natural(item[0])):
        match = next((rule for pattern, rule in usable if pattern.fullmatch(name)), None)
        if match is None:
            continue
        expected = match.mtu
        if mtu == expected:
            results.append(CheckResult("mtu", name, OK, f"{name} MTU {mtu} (pattern {match.interfaces})"))
        else:
            results.append(
                CheckResult(
                    "mtu",
                    name,
                    _SEVERITY_STATUS[match.severity],
                    f"{name} MTU {mtu}, expected {expected} (pattern {match.interfaces}): fix the "
                    f"interface's network configuration (ip link set dev {name} mtu {expected} to try it)",
                )
            )
    return results


# --- RDMA ports ----------------------------------------------------------------------------------


def _port_subject(device: RdmaDevice, port: RdmaPort) -> str:
    return f"{device.name}/{port.number}"


def _port_name(device: RdmaDevice, port: RdmaPort) -> str:
    netdev = f" ({port.netdev})" if port.netdev else ""
    return f"{device.name} port {port.number}{netdev}"


def _rdma_ports(rules: Sequence[RdmaPortRule], rdma: Sequence[RdmaDevice] | None) -> list[CheckResult]:
    results: list[CheckResult] = []
    usable: list[tuple[re.Pattern[str], RdmaPortRule]] = []
    for rule in rules:
        compiled = _compile(rule.devices)
        if compiled is None:
            results.append(_bad_pattern("rdma_port_state", rule.devices, "devices"))
        elif rdma is None:
            why = (
                "RDMA devices could not be read (class/infiniband), "
                f"so ports of {rule.devices} were not checked"
            )
            results.append(CheckResult("rdma_port_state", rule.devices, UNKNOWN, why))
            if rule.rate_gbps is not None:
                results.append(CheckResult("rdma_port_rate", rule.devices, UNKNOWN, why))
        else:
            usable.append((compiled, rule))
    states: list[CheckResult] = []
    rates: list[CheckResult] = []
    for device in rdma or ():
        for port in device.ports:
            match = next((r for p, r in usable if p.fullmatch(device.name) and _layer_matches(r, port)), None)
            if match is None:
                continue
            states.append(_port_state(device, port, match))
            if match.rate_gbps is not None:
                rates.append(_port_rate(device, port, match.rate_gbps))
    return results + states + rates


def _layer_matches(rule: RdmaPortRule, port: RdmaPort) -> bool:
    if rule.link_layer is None:
        return True
    return port.link_layer is not None and port.link_layer.lower() == rule.link_layer.lower()


def _port_state(device: RdmaDevice, port: RdmaPort, rule: RdmaPortRule) -> CheckResult:
    subject, name = _port_subject(device, port), _port_name(device, port)
    if port.state is None or port.physical_state is None:
        return CheckResult(
            "rdma_port_state",
            subject,
            UNKNOWN,
            f"{name}: state or phys_state could not be read (see the device's skipped files)",
        )
    now = f"{port.state}, physical state {port.physical_state}"
    if (
        port.state.upper() == rule.state.upper()
        and port.physical_state.lower() == rule.physical_state.lower()
    ):
        return CheckResult("rdma_port_state", subject, OK, f"{name} is {now}")
    return CheckResult(
        "rdma_port_state",
        subject,
        CRITICAL,
        f"{name} is {now}; expected {rule.state}, {rule.physical_state}: {_port_hint(port)}",
    )


def _port_hint(port: RdmaPort) -> str:
    physical = (port.physical_state or "").lower()
    if physical == "polling":
        return "no link partner answers: check the cable, the transceiver and the switch port"
    if physical == "disabled":
        return "the port is disabled: enable it on the switch or with ibportstate"
    if physical == "linkup" and (port.link_layer or "").lower() == "infiniband":
        return "the link is up but not activated: check the subnet manager (sminfo) and the switch port"
    if physical == "linkup":
        return "the link is up but the port is not: check the interface (ip link) and the switch port"
    return "check the cable, the transceiver and the switch port; reseat or replace them if it persists"


def _port_rate(device: RdmaDevice, port: RdmaPort, expected_gbps: float) -> CheckResult:
    subject, name = _port_subject(device, port), _port_name(device, port)
    if (port.state or "").upper() != "ACTIVE":
        return CheckResult(
            "rdma_port_rate",
            subject,
            UNKNOWN,
            f"{name} is {port.state or 'in an unknown state'}: its rate is checked once it is ACTIVE",
        )
    if port.rate_bytes_per_second is None:
        return CheckResult("rdma_port_rate", subject, UNKNOWN, f"{name}: rate could not be read")
    gbps = _gbps(port.rate_bytes_per_second)
    detail = f"{gbps:g} Gb/s"
    if port.rate_lanes is not None:
        detail += f" ({port.rate_lanes}X{' ' + port.rate_speed if port.rate_speed else ''})"
    if gbps + 1e-9 >= expected_gbps:
        return CheckResult("rdma_port_rate", subject, OK, f"{name} runs at {detail}")
    return CheckResult(
        "rdma_port_rate",
        subject,
        CRITICAL,
        f"{name} runs at {detail}, expected {expected_gbps:g} Gb/s: check the cable or transceiver "
        "and the switch port's speed, then reset the link",
    )


# --- counts --------------------------------------------------------------------------------------


def _hca_count(rules: Sequence[HcaCountRule], rdma: Sequence[RdmaDevice] | None) -> list[CheckResult]:
    results: list[CheckResult] = []
    for number, rule in enumerate(rules, 1):
        compiled = _compile(rule.devices)
        if rule.count is None:
            results.append(
                CheckResult(
                    "hca_count",
                    rule.devices or f"rule{number}",
                    UNKNOWN,
                    f"policy: HCA count rule {number} needs a count",
                )
            )
        elif compiled is None:
            results.append(_bad_pattern("hca_count", rule.devices, "devices"))
        elif rdma is None:
            results.append(
                CheckResult(
                    "hca_count",
                    rule.devices,
                    UNKNOWN,
                    f"RDMA devices could not be read (class/infiniband), so the {rule.count} "
                    f"matching {rule.devices} were not counted",
                )
            )
        else:
            names = [d.name for d in rdma if compiled.fullmatch(d.name)]
            listing = f" ({', '.join(names)})" if names else ""
            text = f"{len(names)} RDMA devices match {rule.devices}{listing}, expected {rule.count}"
            results.append(_count_result("hca_count", rule.devices, rule.count, len(names), text))
    return results


def _count_result(check: str, subject: str, expected: int, found: int, text: str) -> CheckResult:
    if found < expected:
        return CheckResult(
            check, subject, CRITICAL, f"{text}: find the missing ones (lspci, dmesg), reseat or replace them"
        )
    if found > expected:
        return CheckResult(check, subject, WARNING, f"{text}: update the policy if the node really has more")
    return CheckResult(check, subject, OK, text)


def _gpu_count(expected: int | None, gpus: Sequence[GpuReading] | None) -> list[CheckResult]:
    if expected is None:
        return []
    if gpus is None:
        return [
            CheckResult(
                "gpu_count", NODE, UNKNOWN, f"NVML could not be read, so the {expected} GPUs were not counted"
            )
        ]
    up = sum(1 for g in gpus if g.up)
    lost = [str(g.index) for g in gpus if not g.up]
    text = f"{up} GPUs answer NVML, expected {expected}"
    if lost:
        text += f" (lost: GPU {', '.join(lost)})"
    return [_count_result("gpu_count", NODE, expected, up, text)]


# --- firmware ------------------------------------------------------------------------------------


def _hca_firmware(policy: FirmwarePolicy, rdma: Sequence[RdmaDevice] | None) -> list[CheckResult]:
    if rdma is None:
        if policy.hca or policy.uniform:
            return [
                CheckResult(
                    "hca_firmware", NODE, UNKNOWN, "RDMA devices could not be read (class/infiniband)"
                )
            ]
        return []
    severity = _SEVERITY_STATUS[policy.severity]
    results: dict[str, CheckResult] = {}
    unpinned: list[tuple[str, str | None, str]] = []  # (device, firmware, board)
    for device in rdma:
        board = device.board_id
        if board is None:
            continue
        if board not in policy.hca:
            unpinned.append((device.name, device.firmware_version, board))
            continue
        expected = policy.hca[board]
        if device.firmware_version is None:
            results[device.name] = CheckResult(
                "hca_firmware", device.name, UNKNOWN, f"{device.name}: fw_ver could not be read"
            )
        elif device.firmware_version == expected:
            results[device.name] = CheckResult(
                "hca_firmware", device.name, OK, f"{device.name} ({board}) runs firmware {expected}"
            )
        else:
            results[device.name] = CheckResult(
                "hca_firmware",
                device.name,
                severity,
                f"{device.name} ({board}) runs firmware {device.firmware_version}, expected {expected}: "
                "update it (mlxfwmanager) and reset the HCA or reboot",
            )
    if policy.uniform:
        for result in _uniform(
            "hca_firmware",
            unpinned,
            label=str,
            kind="HCAs of board",
            what="firmware",
            severity=severity,
            action="update it (mlxfwmanager) and reset the HCA or reboot",
            pin_key="firmware.hca",
        ):
            results[result.subject] = result
    return [results[d.name] for d in rdma if d.name in results]


def _uniform(
    check: str,
    members: Sequence[tuple[str, str | None, str]],
    *,
    label: Callable[[str], str],
    kind: str,
    what: str,
    severity: int,
    action: str,
    pin_key: str,
) -> list[CheckResult]:
    """Members (subject, version, group) of a group of two or more must share one version."""
    groups: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for subject, version, group in members:
        groups[group].append((subject, version))
    results: list[CheckResult] = []
    for group, entries in groups.items():
        if len(entries) < 2:
            continue
        counts = Counter(v for _, v in entries if v is not None)
        ranked = counts.most_common()
        # With a tie there is no telling which version is intended: every member is reported.
        majority = ranked[0][0] if ranked and (len(ranked) == 1 or ranked[0][1] > ranked[1][1]) else None
        for subject, version in entries:
            if version is None:
                status, message = UNKNOWN, f"{label(subject)}: {what} version could not be read"
            elif majority is None:
                spread = "; ".join(
                    f"{v} on {', '.join(label(s) for s, sv in entries if sv == v)}" for v, _ in ranked
                )
                status, message = (
                    severity,
                    f"{kind} {group} on this node run different {what}: {spread}: pin the intended "
                    f"version in the policy ({pin_key}) and update the others",
                )
            elif version == majority:
                status, message = OK, f"{label(subject)} runs {what} {version} like the other {kind} {group}"
            else:
                status, message = (
                    severity,
                    f"{label(subject)} runs {what} {version} while {counts[majority]} other {kind} "
                    f"{group} on this node run {majority}: {action}",
                )
            results.append(CheckResult(check, subject, status, message))
    return results


def _gpu_driver(policy: FirmwarePolicy, driver_version: str | None) -> list[CheckResult]:
    expected = policy.gpu_driver
    if expected is None:
        return []
    if driver_version is None:
        return [
            CheckResult(
                "gpu_driver", "driver", UNKNOWN, "the NVIDIA driver version could not be read from NVML"
            )
        ]
    if driver_version == expected:
        return [CheckResult("gpu_driver", "driver", OK, f"NVIDIA driver {driver_version}")]
    return [
        CheckResult(
            "gpu_driver",
            "driver",
            _SEVERITY_STATUS[policy.severity],
            f"NVIDIA driver {driver_version}, expected {expected}: install driver {expected} and reboot",
        )
    ]


def _lost(check: str, gpu: GpuReading) -> CheckResult:
    return CheckResult(check, str(gpu.index), UNKNOWN, f"GPU {gpu.index} does not answer NVML (see gpu_lost)")


def _gpus_unreadable(check: str) -> list[CheckResult]:
    return [CheckResult(check, NODE, UNKNOWN, "NVML could not be read, so no GPU was checked")]


def _gpu_vbios(policy: FirmwarePolicy, gpus: Sequence[GpuReading] | None) -> list[CheckResult]:
    if gpus is None:
        return _gpus_unreadable("gpu_vbios") if policy.gpu_vbios or policy.uniform else []
    severity = _SEVERITY_STATUS[policy.severity]
    results: dict[str, CheckResult] = {}
    unpinned: list[tuple[str, str | None, str]] = []
    for gpu in gpus:
        subject = str(gpu.index)
        if not gpu.up:
            results[subject] = _lost("gpu_vbios", gpu)
            continue
        if gpu.name is None:
            continue
        if gpu.name not in policy.gpu_vbios:
            unpinned.append((subject, gpu.vbios_version, gpu.name))
            continue
        expected = policy.gpu_vbios[gpu.name]
        if gpu.vbios_version is None:
            results[subject] = CheckResult(
                "gpu_vbios", subject, UNKNOWN, f"GPU {subject}: VBIOS version could not be read"
            )
        elif gpu.vbios_version == expected:
            results[subject] = CheckResult(
                "gpu_vbios", subject, OK, f"GPU {subject} ({gpu.name}) runs VBIOS {expected}"
            )
        else:
            results[subject] = CheckResult(
                "gpu_vbios",
                subject,
                severity,
                f"GPU {subject} ({gpu.name}) runs VBIOS {gpu.vbios_version}, expected {expected}: "
                "flash the expected VBIOS (NVIDIA firmware update) and reboot",
            )
    if policy.uniform:
        for result in _uniform(
            "gpu_vbios",
            unpinned,
            label="GPU {}".format,
            kind="GPUs of model",
            what="VBIOS",
            severity=severity,
            action="flash the VBIOS the others run (NVIDIA firmware update) and reboot",
            pin_key="firmware.gpu_vbios",
        ):
            results[result.subject] = result
    return [results[s] for s in (str(g.index) for g in gpus) if s in results]


# --- PCIe ----------------------------------------------------------------------------------------


def _link_status(
    name: str,
    generation: tuple[int | None, int | None] | None,
    width: tuple[int | None, int | None] | None,
    severity: int,
    action: str,
    idle: bool | None = None,
) -> tuple[int, str]:
    """Status and message of one PCIe link; a None pair is not checked, idle None means unknown."""
    status, degraded, unreadable, fine = OK, [], [], []
    if width is not None:
        current, maximum = width
        if current is None or maximum is None:
            unreadable.append("width")
        elif current < maximum:
            status = _worse(status, severity)
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
            status = _worse(status, WARNING)
            degraded.append(f"Gen{current} of Gen{maximum}, and NVML could not tell whether it is idle")
        else:
            status = _worse(status, severity)
            degraded.append(f"Gen{current} of Gen{maximum} while busy")
    parts = []
    if degraded:
        parts.append(f"{name} PCIe link {', '.join(degraded)}: {action}")
    if unreadable:
        status = _worse(status, UNKNOWN)
        parts.append(f"{name} PCIe link {' and '.join(unreadable)} could not be read")
    return status, "; ".join(parts) or f"{name} PCIe link {', '.join(fine)}"


def _gpu_pcie_link(policy: PciePolicy, gpus: Sequence[GpuReading] | None) -> list[CheckResult]:
    if not (policy.gpu_width or policy.gpu_generation):
        return []
    if gpus is None:
        return _gpus_unreadable("gpu_pcie_link")
    results = []
    for gpu in gpus:
        if not gpu.up:
            results.append(_lost("gpu_pcie_link", gpu))
            continue
        reasons = gpu.clocks_event_reasons
        status, message = _link_status(
            f"GPU {gpu.index}" + (f" ({gpu.pci_bus_id})" if gpu.pci_bus_id else ""),
            (gpu.pcie_link_generation, gpu.pcie_link_generation_max) if policy.gpu_generation else None,
            (gpu.pcie_link_width, gpu.pcie_link_width_max) if policy.gpu_width else None,
            _SEVERITY_STATUS[policy.severity],
            "drain the node and reseat the GPU or its riser/cable; the link retrains at reboot",
            idle=None if reasons is None else bool(reasons & _GPU_IDLE),
        )
        results.append(CheckResult("gpu_pcie_link", str(gpu.index), status, message))
    return results


def _hca_pcie_link(policy: PciePolicy, rdma: Sequence[RdmaDevice] | None) -> list[CheckResult]:
    if not (policy.hca_width or policy.hca_generation):
        return []
    if rdma is None:
        return [
            CheckResult("hca_pcie_link", NODE, UNKNOWN, "RDMA devices could not be read (class/infiniband)")
        ]
    results = []
    for device in rdma:
        pci = device.pci
        # No PCI function (soft RoCE) or a virtual function, whose link registers are reserved.
        if pci is None or (pci.width is None and pci.width_max is None):
            continue
        status, message = _link_status(
            f"{device.name} ({pci.address})",
            (pci.generation, pci.generation_max) if policy.hca_generation else None,
            (pci.width, pci.width_max) if policy.hca_width else None,
            _SEVERITY_STATUS[policy.severity],
            "drain the node and reseat the HCA or check its slot and riser; the link retrains at reboot",
            idle=False,
        )
        results.append(CheckResult("hca_pcie_link", device.name, status, message))
    return results


# --- current GPU health --------------------------------------------------------------------------


def _gpu_lost(gpus: Sequence[GpuReading] | None) -> list[CheckResult]:
    if gpus is None:
        return _gpus_unreadable("gpu_lost")
    results = []
    for gpu in gpus:
        subject = str(gpu.index)
        if gpu.up:
            results.append(CheckResult("gpu_lost", subject, OK, f"GPU {subject} answers NVML"))
        else:
            uuid = f" ({gpu.uuid})" if gpu.uuid else ""
            results.append(
                CheckResult(
                    "gpu_lost",
                    subject,
                    CRITICAL,
                    f"GPU {subject}{uuid} does not answer NVML: {gpu.down_reason or 'no reason given'}. "
                    "Drain the node and reboot it; if the GPU stays lost, check the kernel log for Xid 79 "
                    "and PCIe errors and have the GPU replaced",
                )
            )
    return results


def _gpu_ecc(gpus: Sequence[GpuReading] | None) -> list[CheckResult]:
    if gpus is None:
        return _gpus_unreadable("gpu_ecc_uncorrectable")
    results = []
    for gpu in gpus:
        subject = str(gpu.index)
        if not gpu.up:
            results.append(_lost("gpu_ecc_uncorrectable", gpu))
            continue
        volatile = gpu.ecc_errors.get(("uncorrected", "volatile"))
        if volatile is None:
            results.append(
                CheckResult(
                    "gpu_ecc_uncorrectable",
                    subject,
                    UNKNOWN,
                    f"GPU {subject}: ECC counters unavailable (ECC disabled, not supported, or NVML failed)",
                )
            )
        elif volatile > 0:
            aggregate = gpu.ecc_errors.get(("uncorrected", "aggregate"))
            lifetime = f" ({aggregate} over its lifetime)" if aggregate is not None else ""
            results.append(
                CheckResult(
                    "gpu_ecc_uncorrectable",
                    subject,
                    CRITICAL,
                    f"GPU {subject} had {volatile} uncorrectable ECC errors since the driver loaded"
                    f"{lifetime}: "
                    "drain it, reset it so the bad rows are remapped, and check "
                    "nvidia-smi -q -d ECC,ROW_REMAPPER",
                )
            )
        else:
            results.append(
                CheckResult(
                    "gpu_ecc_uncorrectable",
                    subject,
                    OK,
                    f"GPU {subject}: no uncorrectable ECC error since the driver loaded",
                )
            )
    return results


def _gpu_row_remap(policy: GpuHealthPolicy, gpus: Sequence[GpuReading] | None) -> list[CheckResult]:
    if gpus is None:
        return _gpus_unreadable("gpu_row_remap")
    results = []
    for gpu in gpus:
        subject = str(gpu.index)
        if not gpu.up:
            results.append(_lost("gpu_row_remap", gpu))
            continue
        rows = gpu.remapped_rows
        remapped = (
            f" ({rows.get('uncorrectable', 0)} rows remapped for uncorrectable errors, "
            f"{rows.get('correctable', 0)} for correctable ones)"
            if rows
            else ""
        )
        if gpu.row_remap_failed:
            status, message = (
                CRITICAL,
                f"GPU {subject}: a row remap failed{remapped}: the memory has no spare rows left; "
                "drain the node and replace the GPU",
            )
        elif gpu.row_remap_pending:
            status, message = (
                _SEVERITY_STATUS[policy.row_remap_pending],
                f"GPU {subject}: a row remap is pending{remapped}: drain the GPU and reset it "
                "(nvidia-smi -r, or reboot) to apply it",
            )
        elif gpu.row_remap_failed is None or gpu.row_remap_pending is None:
            status, message = (
                UNKNOWN,
                f"GPU {subject}: row-remap state unavailable (not supported before Ampere, or NVML failed)",
            )
        else:
            status, message = OK, f"GPU {subject}: no pending or failed row remap{remapped}"
        results.append(CheckResult("gpu_row_remap", subject, status, message))
    return results


_XID_STATUS = {"critical": CRITICAL, "warning": WARNING, "info": OK}


def _gpu_xid(
    policy: GpuHealthPolicy,
    gpus: Sequence[GpuReading] | None,
    events: Sequence[SeenEvent] | None,
    now: float,
) -> list[CheckResult]:
    window = policy.xid_window_seconds
    if events is None:
        return [
            CheckResult(
                "gpu_xid", NODE, UNKNOWN, "the kernel log could not be read, so Xid errors are unknown"
            )
        ]
    subject_of = _xid_subject_resolver(gpus)
    recent: dict[str, list[SeenEvent]] = defaultdict(list)
    for event in events:
        if event.kind == "xid" and event.code is not None and now - event.boot_seconds <= window:
            recent[subject_of(event)].append(event)
    subjects = [str(g.index) for g in gpus or ()]
    subjects += sorted((s for s in recent if s not in subjects), key=_natural)
    return [_xid_result(subject, recent.get(subject, []), window, now) for subject in subjects]


def _xid_subject_resolver(gpus: Sequence[GpuReading] | None) -> Callable[[SeenEvent], str]:
    by_bus: dict[str, int] = {}
    for gpu in gpus or ():
        if gpu.pci_bus_id:
            try:
                by_bus[normalize_pci_bus_id(gpu.pci_bus_id)] = gpu.index
            except ValueError:
                continue

    def subject(event: SeenEvent) -> str:
        if event.gpu is not None and event.gpu >= 0:
            return str(event.gpu)
        # The watcher may have seen the line before NVML told it the GPUs' bus ids.
        if event.pci:
            try:
                bus = normalize_pci_bus_id(event.pci)
            except ValueError:
                return event.pci
            return str(by_bus[bus]) if bus in by_bus else bus
        return "unknown"

    return subject


def _xid_result(subject: str, events: Sequence[SeenEvent], window: float, now: float) -> CheckResult:
    if subject.isdigit():
        gpu = f"GPU {subject}"
    else:
        gpu = "an unidentified GPU" if subject == "unknown" else f"the GPU at {subject}"
    if not events:
        return CheckResult("gpu_xid", subject, OK, f"{gpu}: no Xid in the last {window:g} s")
    status_of = {e: _XID_STATUS[describe(e.code or 0).severity] for e in events}
    status = max(status_of.values())
    # The latest of the worst events is the one to act on.
    latest = max((e for e in events if status_of[e] == status), key=lambda e: e.boot_seconds)
    info = describe(latest.code or 0)
    codes = Counter(e.code for e in events)
    tally = ", ".join(f"Xid {code}" + (f" ×{n}" if n > 1 else "") for code, n in sorted(codes.items()))
    summary = f"{len(events)} Xid event{'s' if len(events) > 1 else ''} in the last {window:g} s: {tally}"
    if status == OK:
        return CheckResult(
            "gpu_xid",
            subject,
            OK,
            f"{gpu}: only informational Xids ({summary}), the usual fallout of a killed process",
        )
    ago = max(0.0, now - latest.boot_seconds)
    return CheckResult(
        "gpu_xid",
        subject,
        status,
        f"{gpu}: Xid {info.code} ({info.name}) {ago:.0f} s ago: {info.meaning} "
        f"Action: {info.action} ({summary})",
    )
