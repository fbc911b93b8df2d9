"""Firmware checks: HCA firmware, the NVIDIA driver and GPU VBIOS, pinned or uniform on the node."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence

from clusterhealth.checks.audits.observations import Observations, gpus_unreadable, lost
from clusterhealth.checks.audits.status import NODE, SEVERITY_STATUS, CheckResult, Status
from clusterhealth.checks.policy import Policy
from clusterhealth.exporters.gpu import GpuReading
from clusterhealth.exporters.infiniband import RdmaDevice


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


def hca_firmware(policy: Policy, obs: Observations) -> list[CheckResult]:
    firmware, rdma = policy.firmware, obs.rdma
    if rdma is None:
        if firmware.hca or firmware.uniform:
            return [
                CheckResult(
                    "hca_firmware", NODE, Status.UNKNOWN, "RDMA devices could not be read (class/infiniband)"
                )
            ]
        return []
    severity = SEVERITY_STATUS[firmware.severity]
    results: dict[str, CheckResult] = {}
    unpinned: list[tuple[str, str | None, str]] = []  # (device, firmware, board)
    for device in rdma:
        board = device.board_id
        if board is None:
            continue
        if board not in firmware.hca:
            unpinned.append((device.name, device.firmware_version, board))
            continue
        expected = firmware.hca[board]
        if device.firmware_version is None:
            results[device.name] = CheckResult(
                "hca_firmware", device.name, Status.UNKNOWN, f"{device.name}: fw_ver could not be read"
            )
        elif device.firmware_version == expected:
            results[device.name] = CheckResult(
                "hca_firmware", device.name, Status.OK, f"{device.name} ({board}) runs firmware {expected}"
            )
        else:
            results[device.name] = CheckResult(
                "hca_firmware",
                device.name,
                severity,
                f"{device.name} ({board}) runs firmware {device.firmware_version}, expected {expected}: "
                "update it (mlxfwmanager) and reset the HCA or reboot",
            )
    if firmware.uniform:
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
    severity: Status,
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
            status: Status
            if version is None:
                status, message = Status.UNKNOWN, f"{label(subject)}: {what} version could not be read"
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
                status = Status.OK
                message = f"{label(subject)} runs {what} {version} like the other {kind} {group}"
            else:
                status, message = (
                    severity,
                    f"{label(subject)} runs {what} {version} while {counts[majority]} other {kind} "
                    f"{group} on this node run {majority}: {action}",
                )
            results.append(CheckResult(check, subject, status, message))
    return results


def gpu_driver(policy: Policy, obs: Observations) -> list[CheckResult]:
    expected, found = policy.firmware.gpu_driver, obs.driver_version
    if expected is None:
        return []
    if found is None:
        why = obs.gpus_unreadable if obs.gpus is None else "NVML did not tell it"
        return [
            CheckResult(
                "gpu_driver", "driver", Status.UNKNOWN, f"the NVIDIA driver version could not be read ({why})"
            )
        ]
    if found == expected:
        return [CheckResult("gpu_driver", "driver", Status.OK, f"NVIDIA driver {found}")]
    return [
        CheckResult(
            "gpu_driver",
            "driver",
            SEVERITY_STATUS[policy.firmware.severity],
            f"NVIDIA driver {found}, expected {expected}: install driver {expected} and reboot",
        )
    ]


def gpu_vbios(policy: Policy, obs: Observations) -> list[CheckResult]:
    firmware, gpus = policy.firmware, obs.gpus
    if gpus is None:
        return gpus_unreadable("gpu_vbios", obs) if firmware.gpu_vbios or firmware.uniform else []
    severity = SEVERITY_STATUS[firmware.severity]
    results: dict[str, CheckResult] = {}
    unpinned: list[tuple[str, str | None, str]] = []
    for gpu in gpus:
        subject = str(gpu.index)
        if not gpu.up:
            results[subject] = lost("gpu_vbios", gpu)
            continue
        if gpu.name is None:
            continue
        if gpu.name not in firmware.gpu_vbios:
            unpinned.append((subject, gpu.vbios_version, gpu.name))
            continue
        expected = firmware.gpu_vbios[gpu.name]
        if gpu.vbios_version is None:
            results[subject] = CheckResult(
                "gpu_vbios", subject, Status.UNKNOWN, f"GPU {subject}: VBIOS version could not be read"
            )
        elif gpu.vbios_version == expected:
            results[subject] = CheckResult(
                "gpu_vbios", subject, Status.OK, f"GPU {subject} ({gpu.name}) runs VBIOS {expected}"
            )
        else:
            results[subject] = CheckResult(
                "gpu_vbios",
                subject,
                severity,
                f"GPU {subject} ({gpu.name}) runs VBIOS {gpu.vbios_version}, expected {expected}: "
                "flash the expected VBIOS (NVIDIA firmware update) and reboot",
            )
    if firmware.uniform:
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
