"""promtool cases of the RDMA and network alerts (rdma.py): each fires on its fault series and
stays quiet on healthy and boundary series."""

from __future__ import annotations

from .cases import Case, F, S, port


def aer(device: str, driver: str, error_class: str, instance: str = "n1") -> dict[str, str]:
    return {"instance": instance, "device": device, "driver": driver, "class": error_class}


CASES = [
    Case(
        "RDMAPortDown",
        "a port that goes DOWN/Polling, and one stuck in INIT, fire; an ACTIVE LinkUp one does not",
        {
            S("clusterhealth_rdma_port_state_id", port("mlx5_0")): "4x20",
            S("clusterhealth_rdma_port_physical_state_id", port("mlx5_0")): "5x20",
            S("clusterhealth_rdma_port_state_id", port("mlx5_3")): "4x5 1x15",
            S("clusterhealth_rdma_port_physical_state_id", port("mlx5_3")): "5x5 2x15",
            S("clusterhealth_rdma_port_state_id", port("mlx5_4")): "4x5 2x15",
            S("clusterhealth_rdma_port_physical_state_id", port("mlx5_4")): "5x20",
        },
        [("4m", []), ("10m", [F(port("mlx5_3"), "critical", 1), F(port("mlx5_4"), "critical", 2)])],
    ),
    Case(
        "RDMAPortDown",
        "every physical state but LinkUp fires, even while the logical state still reads ACTIVE",
        {
            **{S("clusterhealth_rdma_port_state_id", port(f"mlx5_{phys}")): "4x20" for phys in range(8)},
            **{
                S("clusterhealth_rdma_port_physical_state_id", port(f"mlx5_{phys}")): f"5x5 {phys}x15"
                for phys in range(8)
            },
        },
        [
            ("4m", []),
            ("10m", [F(port(f"mlx5_{phys}"), "critical", phys) for phys in range(8) if phys != 5]),
        ],
    ),
    Case(
        "RDMALinkFlapping",
        "one link_downed increment, or more than 5 link recoveries a minute, is a flap; 4 a minute is not",
        {
            S("clusterhealth_rdma_port_errors_total", port("mlx5_0", counter="link_downed")): "2x30",
            S("clusterhealth_rdma_port_errors_total", port("mlx5_1", counter="link_downed")): "0x10 1x20",
            S(
                "clusterhealth_rdma_port_errors_total", port("mlx5_2", counter="link_error_recovery")
            ): "0+4x30",
            S("clusterhealth_rdma_port_errors_total", port("mlx5_3", counter="link_error_recovery")): (
                "0x10 10+10x20"
            ),
        },
        [
            ("8m", []),
            (
                "20m",
                [
                    F(port("mlx5_1", counter="link_downed"), "warning"),
                    F(port("mlx5_3", counter="link_error_recovery"), "warning"),
                ],
            ),
        ],
    ),
    Case(
        "RDMAPortErrors",
        "symbol errors above 10/s page; exactly 10/s does not (both exceed the hourly warning)",
        {
            S("clusterhealth_rdma_port_errors_total", port("mlx5_0", counter="symbol_error")): "0+600x70",
            S("clusterhealth_rdma_port_errors_total", port("mlx5_1", counter="symbol_error")): "0+1200x70",
        },
        [
            ("0m", []),
            (
                "65m",
                [
                    F(port("mlx5_1", counter="symbol_error"), "critical", 20),
                    F(port("mlx5_0", counter="symbol_error"), "warning", 36000),
                    F(port("mlx5_1", counter="symbol_error"), "warning", 72000),
                ],
            ),
        ],
    ),
    Case(
        "RDMAPortErrors",
        "hourly: 180 symbol errors or 20 link-integrity errors warn; 120 symbol errors, old "
        "receive errors and transmit discards do not",
        {
            S("clusterhealth_rdma_port_errors_total", port("mlx5_2", counter="symbol_error")): "0+2x100",
            S("clusterhealth_rdma_port_errors_total", port("mlx5_3", counter="symbol_error")): "0+3x100",
            S("clusterhealth_rdma_port_errors_total", port("mlx5_4", counter="port_rcv_errors")): "1187x100",
            S(
                "clusterhealth_rdma_port_errors_total", port("mlx5_5", counter="port_xmit_discards")
            ): "0+5x100",
            S(
                "clusterhealth_rdma_port_errors_total", port("mlx5_6", counter="local_link_integrity_errors")
            ): ("0x70 1+1x30"),
        },
        [
            ("0m", []),
            (
                "90m",
                [
                    F(port("mlx5_3", counter="symbol_error"), "warning", 180),
                    F(port("mlx5_6", counter="local_link_integrity_errors"), "warning", 20),
                ],
            ),
        ],
    ),
    Case(
        "RDMAPortErrorsUnknown",
        "a port whose symbol_error and link_downed counters saturate is unknown, not 'no errors'",
        {
            S("clusterhealth_rdma_port_pma_saturated_counters", port("mlx5_5")): "0x5 1x3 2x7",
            S("clusterhealth_rdma_port_pma_saturated_counters", port("mlx5_0")): "0x15",
        },
        [("3m", []), ("7m", [F(port("mlx5_5"), "warning", 1)]), ("12m", [F(port("mlx5_5"), "warning", 2)])],
    ),
    Case(
        "RDMAPCIeLinkDegraded",
        "an HCA whose link check is CRITICAL or WARNING fires after 10m; one OK, one UNKNOWN "
        "(NodeCheckUnknown's) and one degraded for 5m do not",
        {
            S("clusterhealth_check_status", {"check": "hca_pcie_link", "subject": "mlx5_4"}): "2x20",
            S("clusterhealth_check_status", {"check": "hca_pcie_link", "subject": "mlx5_1"}): "1x20",
            S("clusterhealth_check_status", {"check": "hca_pcie_link", "subject": "mlx5_0"}): "0x20",
            S("clusterhealth_check_status", {"check": "hca_pcie_link", "subject": "mlx5_9"}): "3x20",
            S("clusterhealth_check_status", {"check": "hca_pcie_link", "subject": "mlx5_2"}): "0x5 2x5 0x10",
            S("clusterhealth_check_status", {"check": "rdma_port_state", "subject": "mlx5_3"}): "2x20",
        },
        [
            ("5m", []),
            (
                "15m",
                [
                    F({"device": "mlx5_4", "check": "hca_pcie_link", "subject": "mlx5_4"}, "warning", 2),
                    F({"device": "mlx5_1", "check": "hca_pcie_link", "subject": "mlx5_1"}, "warning", 1),
                ],
            ),
        ],
    ),
    Case(
        "PCIeAERErrors",
        "an uncorrectable error pages, counts since boot do not; correctable errors above 8 a minute "
        "for 10 minutes open a ticket, 8 a minute and a short burst do not",
        {
            S("clusterhealth_pcie_aer_errors_total", aer("0000:18:00.0", "nvidia", "nonfatal")): "0x10 1x20",
            S("clusterhealth_pcie_aer_errors_total", aer("0000:2a:00.0", "mlx5_core", "fatal")): "2x30",
            S("clusterhealth_pcie_aer_errors_total", aer("0000:3a:00.0", "nvidia", "correctable")): "0+10x30",
            S("clusterhealth_pcie_aer_errors_total", aer("0000:5d:00.0", "nvidia", "correctable")): "0+8x30",
            S("clusterhealth_pcie_aer_errors_total", aer("0000:9a:00.0", "mlx5_core", "correctable")): (
                "0x10 500x20"
            ),
        },
        [
            ("5m", []),
            (
                "20m",
                [
                    F(aer("0000:18:00.0", "nvidia", "nonfatal"), "critical", 1),
                    F(aer("0000:3a:00.0", "nvidia", "correctable"), "warning", 10),
                ],
            ),
        ],
    ),
    Case(
        "MTUMismatch",
        "the policy's CRITICAL pages, its WARNING and the fleet's odd one out warn; a tie, OK and "
        "UNKNOWN do not",
        {
            S("clusterhealth_netdev_mtu_bytes", {"instance": "n1", "interface": "enp1"}): "9000x20",
            S("clusterhealth_netdev_mtu_bytes", {"instance": "n2", "interface": "enp1"}): "9000x20",
            S("clusterhealth_netdev_mtu_bytes", {"instance": "n3", "interface": "enp1"}): "1500x20",
            S("clusterhealth_netdev_mtu_bytes", {"instance": "n1", "interface": "enp2"}): "9000x20",
            S("clusterhealth_netdev_mtu_bytes", {"instance": "n2", "interface": "enp2"}): "1500x20",
            S("clusterhealth_check_status", {"instance": "n1", "check": "mtu", "subject": "ibp1"}): "2x20",
            S("clusterhealth_check_status", {"instance": "n1", "check": "mtu", "subject": "ibp2"}): "3x20",
            S("clusterhealth_check_status", {"instance": "n2", "check": "mtu", "subject": "ibp1"}): "0x20",
            S("clusterhealth_check_status", {"instance": "n2", "check": "mtu", "subject": "ibp3"}): "1x20",
        },
        [
            ("5m", []),
            (
                "15m",
                [
                    F(
                        {"instance": "n1", "check": "mtu", "subject": "ibp1", "interface": "ibp1"},
                        "critical",
                        2,
                    ),
                    F(
                        {"instance": "n2", "check": "mtu", "subject": "ibp3", "interface": "ibp3"},
                        "warning",
                        1,
                    ),
                    F({"instance": "n3", "interface": "enp1", "mtu": "1500"}, "warning", 1),
                ],
            ),
        ],
    ),
]
