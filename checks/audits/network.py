"""Network checks: interface MTUs, RDMA port state and rate, how many HCAs the node has."""

from __future__ import annotations

import re
from collections.abc import Sequence

from clusterhealth.checks.audits.observations import Observations
from clusterhealth.checks.audits.status import (
    SEVERITY_STATUS,
    CheckResult,
    Status,
    bad_pattern,
    compile_pattern,
    natural,
)
from clusterhealth.checks.policy import Policy, RdmaPortRule
from clusterhealth.exporters.infiniband import RdmaDevice, RdmaPort


def _gbps(bytes_per_second: int) -> float:
    return bytes_per_second * 8 / 1e9


def mtu(policy: Policy, obs: Observations) -> list[CheckResult]:
    results: list[CheckResult] = []
    usable = []
    for number, rule in enumerate(policy.mtu, 1):
        compiled = compile_pattern(rule.interfaces)
        if not rule.interfaces or rule.mtu is None:
            results.append(
                CheckResult(
                    "mtu",
                    f"rule{number}",
                    Status.UNKNOWN,
                    f"policy: MTU rule {number} needs both interfaces (a pattern) and mtu",
                )
            )
        elif compiled is None:
            results.append(bad_pattern("mtu", rule.interfaces, "interfaces"))
        elif obs.netdev_mtus is None:
            results.append(
                CheckResult(
                    "mtu",
                    rule.interfaces,
                    Status.UNKNOWN,
                    f"interface MTUs could not be read (class/net), so interfaces matching "
                    f"{rule.interfaces} were not checked",
                )
            )
        else:
            usable.append((compiled, rule))
    for name, value in sorted((obs.netdev_mtus or {}).items(), key=lambda item: natural(item[0])):
        match = next((rule for pattern, rule in usable if pattern.fullmatch(name)), None)
        if match is None:
            continue
        expected = match.mtu
        if value == expected:
            results.append(
                CheckResult("mtu", name, Status.OK, f"{name} MTU {value} (pattern {match.interfaces})")
            )
        else:
            results.append(
                CheckResult(
                    "mtu",
                    name,
                    SEVERITY_STATUS[match.severity],
                    f"{name} MTU {value}, expected {expected} (pattern {match.interfaces}): fix the "
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


def _matched_ports(
    check: str, rules: Sequence[RdmaPortRule], rdma: Sequence[RdmaDevice] | None
) -> tuple[list[CheckResult], list[tuple[RdmaDevice, RdmaPort, RdmaPortRule]]]:
    """Results for the rules that cannot be applied, and each port with the first rule matching it.

    `rdma_port_rate` looks only at the rules that set `rate_gbps`, but a port's rule is still the
    first one matching it, so that a specific rule without a rate exempts its ports.
    """
    problems: list[CheckResult] = []
    usable: list[tuple[re.Pattern[str], RdmaPortRule]] = []
    for rule in rules:
        compiled = compile_pattern(rule.devices)
        rates = check == "rdma_port_rate"
        if compiled is None:
            if not rates:
                problems.append(bad_pattern(check, rule.devices, "devices"))
        elif rdma is None:
            if not rates or rule.rate_gbps is not None:
                problems.append(
                    CheckResult(
                        check,
                        rule.devices,
                        Status.UNKNOWN,
                        "RDMA devices could not be read (class/infiniband), "
                        f"so ports of {rule.devices} were not checked",
                    )
                )
        else:
            usable.append((compiled, rule))
    matched = []
    for device in rdma or ():
        for port in device.ports:
            first = next((r for p, r in usable if p.fullmatch(device.name) and _layer_matches(r, port)), None)
            if first is not None:
                matched.append((device, port, first))
    return problems, matched


def _layer_matches(rule: RdmaPortRule, port: RdmaPort) -> bool:
    if rule.link_layer is None:
        return True
    return port.link_layer is not None and port.link_layer.lower() == rule.link_layer.lower()


def rdma_port_state(policy: Policy, obs: Observations) -> list[CheckResult]:
    problems, matched = _matched_ports("rdma_port_state", policy.rdma_ports, obs.rdma)
    return problems + [_port_state(device, port, rule) for device, port, rule in matched]


def rdma_port_rate(policy: Policy, obs: Observations) -> list[CheckResult]:
    problems, matched = _matched_ports("rdma_port_rate", policy.rdma_ports, obs.rdma)
    return problems + [
        _port_rate(device, port, rule.rate_gbps)
        for device, port, rule in matched
        if rule.rate_gbps is not None
    ]


def _port_state(device: RdmaDevice, port: RdmaPort, rule: RdmaPortRule) -> CheckResult:
    subject, name = _port_subject(device, port), _port_name(device, port)
    if port.state is None or port.physical_state is None:
        return CheckResult(
            "rdma_port_state",
            subject,
            Status.UNKNOWN,
            f"{name}: state or phys_state could not be read (see the device's skipped files)",
        )
    now = f"{port.state}, physical state {port.physical_state}"
    if (
        port.state.upper() == rule.state.upper()
        and port.physical_state.lower() == rule.physical_state.lower()
    ):
        return CheckResult("rdma_port_state", subject, Status.OK, f"{name} is {now}")
    return CheckResult(
        "rdma_port_state",
        subject,
        Status.CRITICAL,
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
            Status.UNKNOWN,
            f"{name} is {port.state or 'in an unknown state'}: its rate is checked once it is ACTIVE",
        )
    if port.rate_bytes_per_second is None:
        return CheckResult("rdma_port_rate", subject, Status.UNKNOWN, f"{name}: rate could not be read")
    gbps = _gbps(port.rate_bytes_per_second)
    detail = f"{gbps:g} Gb/s"
    if port.rate_lanes is not None:
        detail += f" ({port.rate_lanes}X{' ' + port.rate_speed if port.rate_speed else ''})"
    if gbps + 1e-9 >= expected_gbps:
        return CheckResult("rdma_port_rate", subject, Status.OK, f"{name} runs at {detail}")
    return CheckResult(
        "rdma_port_rate",
        subject,
        Status.CRITICAL,
        f"{name} runs at {detail}, expected {expected_gbps:g} Gb/s: check the cable or transceiver "
        "and the switch port's speed, then reset the link",
    )


# --- counts --------------------------------------------------------------------------------------


def hca_count(policy: Policy, obs: Observations) -> list[CheckResult]:
    results: list[CheckResult] = []
    for number, rule in enumerate(policy.hca_count, 1):
        compiled = compile_pattern(rule.devices)
        if rule.count is None:
            results.append(
                CheckResult(
                    "hca_count",
                    rule.devices or f"rule{number}",
                    Status.UNKNOWN,
                    f"policy: HCA count rule {number} needs a count",
                )
            )
        elif compiled is None:
            results.append(bad_pattern("hca_count", rule.devices, "devices"))
        elif obs.rdma is None:
            results.append(
                CheckResult(
                    "hca_count",
                    rule.devices,
                    Status.UNKNOWN,
                    f"RDMA devices could not be read (class/infiniband), so the {rule.count} "
                    f"matching {rule.devices} were not counted",
                )
            )
        else:
            names = [d.name for d in obs.rdma if compiled.fullmatch(d.name)]
            listing = f" ({', '.join(names)})" if names else ""
            text = f"{len(names)} RDMA devices match {rule.devices}{listing}, expected {rule.count}"
            results.append(count_result("hca_count", rule.devices, rule.count, len(names), text))
    return results


def count_result(check: str, subject: str, expected: int, found: int, text: str) -> CheckResult:
    """Fewer devices than expected is CRITICAL, more a WARNING (the policy may be out of date)."""
    if found < expected:
        return CheckResult(
            check,
            subject,
            Status.CRITICAL,
            f"{text}: find the missing ones (lspci, dmesg), reseat or replace them",
        )
    if found > expected:
        return CheckResult(
            check, subject, Status.WARNING, f"{text}: update the policy if the node really has more"
        )
    return CheckResult(check, subject, Status.OK, text)
