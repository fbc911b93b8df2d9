"""RDMA and network alerts (group `clusterhealth.rdma`): ports, their error counters and PCIe
links, PCIe AER of the GPUs' and HCAs' functions, and MTUs. Cases: rdma_cases.py; runbooks:
docs/runbooks/<Alert>.md."""

from __future__ import annotations

from .config import Config
from .lib import PORT, Alert, Group, alternation, selector


def group(c: Config) -> Group:
    return Group(
        "clusterhealth.rdma",
        [
            rdma_port_down(c),
            rdma_link_flapping(c),
            rdma_port_errors_critical(c),
            rdma_port_errors_warning(c),
            rdma_port_errors_unknown(c),
            rdma_pcie_link_degraded(c),
            pcie_aer_errors_critical(c),
            pcie_aer_errors_warning(c),
            mtu_mismatch_critical(c),
            mtu_mismatch_warning(c),
        ],
    )


def rdma_port_down(c: Config) -> Alert:
    m = selector(c)
    port = c.rdma_port_selector
    return Alert(
        "RDMAPortDown",
        "critical",
        f"""clusterhealth_rdma_port_state_id{m(port)} != 4
or on (instance, job, device, port)
clusterhealth_rdma_port_physical_state_id{m(port)} != 5""",
        f"{PORT} is not ACTIVE and LinkUp.",
        "The port lost its link, or waits for the subnet manager: traffic on this rail "
        "stops or moves to the others. Check the cable and the switch port (ibstat, "
        "mlxlink); reseat or replace the cable or transceiver.",
        c.for_immediate,
        about="rdma_port",
    )


def rdma_link_flapping(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "RDMALinkFlapping",
        "warning",
        f"""increase(
  clusterhealth_rdma_port_errors_total{m('counter="link_downed"')}[{c.flap_window}]
) > 0
or
rate(clusterhealth_rdma_port_errors_total{m('counter="link_error_recovery"')}[{c.rate_window}]) * 60
  > {c.link_error_recovery_per_minute}""",
        f"{PORT} is flapping ({{{{ $labels.counter }}}}).",
        "The link went down or retrained recently: every flap stalls the collectives that "
        "use it. Usually a marginal cable or transceiver; check it with mlxlink and replace "
        "it if the counters keep rising.",
        about="rdma_port",
    )


def rdma_port_errors_critical(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "RDMAPortErrors",
        "critical",
        f"""rate(clusterhealth_rdma_port_errors_total{m('counter="symbol_error"')}[{c.rate_window}])
  > {c.symbol_errors_per_second_critical}""",
        f"{PORT} counts more than {c.symbol_errors_per_second_critical:g} symbol errors per second.",
        "{{ $value | humanize }} symbol errors per second: the link is corrupting data and "
        "retransmitting. Drain the node (or disable the port) and replace the cable or "
        "transceiver.",
        c.for_immediate,
        about="rdma_port",
    )


def rdma_port_errors_warning(c: Config) -> Alert:
    m = selector(c)
    receive = m(f'counter=~"{alternation(c.receive_error_counters)}"')
    return Alert(
        "RDMAPortErrors",
        "warning",
        f"""increase(clusterhealth_rdma_port_errors_total{m('counter="symbol_error"')}[{c.error_window}])
  > {c.symbol_errors_per_hour_warning:g}
or
increase(clusterhealth_rdma_port_errors_total{receive}[{c.error_window}])
  > {c.receive_errors_per_hour_warning:g}""",
        f"{PORT} counts {{{{ $labels.counter }}}} errors.",
        "{{ $value | humanize }} {{ $labels.counter }} errors in " + c.error_window + ": a "
        "marginal cable, transceiver or port. Check the link with mlxlink or ibdiagnet and "
        "replace the cable at the next maintenance.",
        about="rdma_port",
    )


def rdma_port_errors_unknown(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "RDMAPortErrorsUnknown",
        "warning",
        f"clusterhealth_rdma_port_pma_saturated_counters{m()} > 0",
        f"{PORT}: {{{{ $value }}}} error counter(s) saturated, its error rates are unknown.",
        "Fixed-width PMA counters sit at their maximum (65535 for the 16-bit ones such as "
        "symbol_error, 255 for link_downed) and no longer count, so RDMAPortErrors and "
        "RDMALinkFlapping cannot see new errors on this port (and the link has had many). "
        "Check the link, then clear the port's counters (perfquery -R) so they count again.",
        about="rdma_port",
    )


def rdma_pcie_link_degraded(c: Config) -> Alert:
    """From the audit's hca_pcie_link check, which judges the link figures the rdma collector
    exports only on request: its width, and its generation where the policy asks
    (`pcie.hca_generation`: a Gen5 card in a Gen4 slot is normal)."""
    m = selector(c)
    return Alert(
        "RDMAPCIeLinkDegraded",
        "warning",
        f"""label_replace(
  clusterhealth_check_status{m('check="hca_pcie_link"')}, "device", "$1", "subject", "(.*)"
) > 0 < 3""",
        "HCA {{ $labels.device }} on {{ $labels.instance }} runs its PCIe link below its maximum.",
        "The HCA's PCIe link trained narrower (or, where the node's policy checks it, slower) "
        "than it can: it cannot feed its port at line rate. Usually a badly seated card or "
        "riser; reseat it at the next maintenance.",
        c.for_sustained,
        about="hca",
    )


def pcie_aer_errors_critical(c: Config) -> Alert:
    """PCIe AER of the GPUs' and HCAs' PCI functions (the pcie_aer collector): counts since boot,
    so only an increase alerts."""
    m = selector(c)
    return Alert(
        "PCIeAERErrors",
        "critical",
        f"""increase(
  clusterhealth_pcie_aer_errors_total{m('class=~"nonfatal|fatal"')}[{c.error_window}]
) > 0""",
        "PCI function {{ $labels.device }} ({{ $labels.driver }}) on {{ $labels.instance }} "
        "reported {{ $labels.class }} PCIe errors.",
        "{{ $value | humanize }} uncorrectable ({{ $labels.class }}) AER errors in "
        + c.error_window
        + ": the link lost or poisoned a transaction, and a fatal error usually takes the "
        "device off the bus (a GPU then reports Xid 79). Drain the node; reseat or replace "
        "the device or its riser if it happens again.",
        about="pci_function",
    )


def pcie_aer_errors_warning(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "PCIeAERErrors",
        "warning",
        f"""rate(clusterhealth_pcie_aer_errors_total{m('class="correctable"')}[{c.rate_window}]) * 60
  > {c.pcie_correctable_errors_per_minute:g}""",
        "PCI function {{ $labels.device }} ({{ $labels.driver }}) on {{ $labels.instance }} "
        "counts many correctable PCIe errors.",
        "{{ $value | humanize }} correctable AER errors a minute (bad TLPs or DLLPs, replays, "
        f"receiver errors), above {c.pcie_correctable_errors_per_minute:g}: the link is "
        "marginal and retransmits, which costs bandwidth, and it may train down or fail "
        "next. Reseat the device or its riser at the next maintenance.",
        c.for_sustained,
        about="pci_function",
    )


def mtu_mismatch_critical(c: Config) -> Alert:
    """At the severity `check` gives the node's own policy (a rule's `severity`), so that the Slurm
    health check and the alert judge one fault alike; a fleet outlier is a warning."""
    m = selector(c)
    return Alert(
        "MTUMismatch",
        "critical",
        f"""label_replace(
  clusterhealth_check_status{m('check="mtu"')}, "interface", "$1", "subject", "(.*)"
) == 2""",
        "Interface {{ $labels.interface }} on {{ $labels.instance }} has an MTU unlike its policy.",
        "The MTU differs from the node's policy, whose rule makes this CRITICAL (check mtu): "
        "jumbo frames are dropped or fragmented and RoCE or IPoIB throughput falls. Fix the "
        "interface's network configuration.",
        c.for_sustained,
        about="interface",
    )


def mtu_mismatch_warning(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "MTUMismatch",
        "warning",
        f"""label_replace(
  clusterhealth_check_status{m('check="mtu"')}, "interface", "$1", "subject", "(.*)"
) == 1
or on (instance, job, interface)
(
  count_values without () ("mtu", clusterhealth_netdev_mtu_bytes{m()})
  * on (job, interface, mtu) group_left ()
  job_interface_mtu:clusterhealth_netdev_mtu_bytes:count
  < on (job, interface) group_left ()
  job_interface:clusterhealth_netdev_mtu_bytes:max_count
)""",
        "Interface {{ $labels.interface }} on {{ $labels.instance }} has an MTU unlike its "
        "policy or its peers.",
        "The MTU differs from the node's policy (check mtu) or from the MTU most nodes use "
        "on this interface: jumbo frames are dropped or fragmented and RoCE or IPoIB "
        "throughput falls. Fix the interface's network configuration.",
        c.for_sustained,
        about="interface",
    )
