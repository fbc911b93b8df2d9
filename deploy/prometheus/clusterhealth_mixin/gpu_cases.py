"""promtool cases of the GPU alerts (gpu.py): each fires on its fault series and stays quiet on
healthy and boundary series."""

from __future__ import annotations

from .cases import Case, F, S, gpu

CASES = [
    Case(
        "GPUFellOffBus",
        "GPU 0 stops answering at 6m; GPU 1 stays up; pending for its first minute",
        {
            S("clusterhealth_gpu_up", gpu("0")): "1x5 0x10",
            S("clusterhealth_gpu_up", gpu("1")): "1x15",
        },
        [("3m", []), ("6m", []), ("8m", [F(gpu("0"), "critical", 0)])],
    ),
    Case(
        "GPUUncorrectableECC",
        "volatile uncorrectable errors on GPU 0; corrected and old aggregate errors stay quiet",
        {
            S(
                "clusterhealth_gpu_ecc_errors_total", gpu("0", error="uncorrected", scope="volatile")
            ): "0x5 2x10",
            S("clusterhealth_gpu_ecc_errors_total", gpu("0", error="corrected", scope="volatile")): "0+50x15",
            S("clusterhealth_gpu_ecc_errors_total", gpu("1", error="uncorrected", scope="volatile")): "0x15",
            S("clusterhealth_gpu_ecc_errors_total", gpu("1", error="uncorrected", scope="aggregate")): "7x15",
        },
        [
            ("4m", []),
            ("10m", [F(gpu("0", error="uncorrected", scope="volatile"), "critical", 2)]),
        ],
    ),
    Case(
        "GPURowRemapFailed",
        "GPU 7 runs out of spare rows at 6m",
        {
            S("clusterhealth_gpu_row_remap_failed", gpu("7")): "0x5 1x10",
            S("clusterhealth_gpu_row_remap_failed", gpu("0")): "0x15",
        },
        [("4m", []), ("6m", []), ("10m", [F(gpu("7"), "critical", 1)])],
    ),
    Case(
        "GPURowRemapPending",
        "GPU 5 waits for a reset from 6m on, until it is reset at 12m",
        {
            S("clusterhealth_gpu_row_remap_pending", gpu("5")): "0x5 1x6 0x5",
            S("clusterhealth_gpu_row_remap_pending", gpu("0")): "0x16",
        },
        [("4m", []), ("10m", [F(gpu("5"), "warning", 1)]), ("14m", [])],
    ),
    Case(
        "GPURecoveryActionRequired",
        "GPU 4's NVML recovery action is gpu_reset from 6m on until the reset at 12m; GPU 0 needs none",
        {
            S("clusterhealth_gpu_recovery_action", gpu("4", action="none")): "1x4 stale _x5 1x5",
            S("clusterhealth_gpu_recovery_action", gpu("4", action="gpu_reset")): "_x5 1x6 stale",
            S("clusterhealth_gpu_recovery_action", gpu("0", action="none")): "1x16",
        },
        [("4m", []), ("10m", [F(gpu("4", action="gpu_reset"), "critical", 1)]), ("14m", [])],
    ),
    Case(
        "GPUXidCritical",
        "new and increasing critical Xids page and memory-health Xids open a ticket, each after a "
        "minute like the GPU's other hardware alerts; an old constant one and an application's do not",
        {
            S("clusterhealth_gpu_xid_errors_total", gpu("2", xid="48")): "1x100",
            S("clusterhealth_gpu_xid_errors_total", gpu("1", xid="43")): "0x70 1+1x30",
            S("clusterhealth_gpu_xid_errors_total", gpu("1", xid="13")): "0x70 1+1x30",
            S("clusterhealth_gpu_xid_errors_total", gpu("3", xid="95")): "1x80 2x20",
            S("clusterhealth_gpu_xid_errors_total", gpu("0", xid="79")): "_x80 1x20",
            S("clusterhealth_gpu_xid_errors_total", gpu("5", xid="94")): "_x80 1x20",
            S("clusterhealth_gpu_xid_errors_total", gpu("5", xid="63")): "_x80 1x20",
            S("clusterhealth_gpu_xid_errors_total", gpu("6", xid="92")): "0x80 1x20",
            # NVLink 5 (Blackwell): the MSE unit's errors are all fatal, a reset (150 pages); the
            # RLW unit's may be either (145 opens a ticket, its fatal one pages through Xid 154);
            # TREX needs nothing (147 neither).
            S("clusterhealth_gpu_xid_errors_total", gpu("0", "n2", xid="150")): "_x80 1x20",
            S("clusterhealth_gpu_xid_errors_total", gpu("1", "n2", xid="145")): "_x80 1x20",
            S("clusterhealth_gpu_xid_errors_total", gpu("2", "n2", xid="147")): "_x80 1x20",
        },
        [
            ("75m", []),
            # The events of 80m are pending (`_x80` is 80 blanks: the series start at 80m).
            ("80m", []),
            (
                "85m",
                [
                    F(gpu("3", xid="95"), "critical"),
                    F(gpu("0", xid="79"), "critical"),
                    F(gpu("5", xid="94"), "warning"),
                    F(gpu("5", xid="63"), "warning"),
                    F(gpu("6", xid="92"), "warning"),
                    F(gpu("0", "n2", xid="150"), "critical"),
                    F(gpu("1", "n2", xid="145"), "warning"),
                ],
            ),
        ],
    ),
    Case(
        "GPUThermalOrPowerSlowdown",
        "GPU 3's time counter says HW thermal slowdown held it from 6m on, and GPU 5 (a driver "
        "without counters) had its HW slowdown flag set for a whole window: both fire. The power "
        "cap, 5% of the time in power brake, an idle flag, and a flag on a GPU whose driver has "
        "counters stay quiet",
        {
            S("clusterhealth_gpu_clocks_event_seconds_total", gpu("3", reason="hw_thermal_slowdown")): (
                "0x5 0+60x20"
            ),
            S("clusterhealth_gpu_clocks_event_seconds_total", gpu("0", reason="sw_power_cap")): "0+60x26",
            S("clusterhealth_gpu_clocks_event_seconds_total", gpu("4", reason="hw_power_brake_slowdown")): (
                "0+3x26"
            ),
            S("clusterhealth_gpu_clocks_event_active", gpu("4", reason="hw_power_brake_slowdown")): "1x26",
            S("clusterhealth_gpu_clocks_event_active", gpu("5", reason="hw_slowdown")): "0x5 1x21",
            S("clusterhealth_gpu_clocks_event_active", gpu("1", reason="gpu_idle")): "1x26",
        },
        [
            ("5m", []),
            ("7m", []),
            (
                "20m",
                [
                    F(gpu("3", reason="hw_thermal_slowdown"), "warning"),
                    F(gpu("5", reason="hw_slowdown"), "warning"),
                ],
            ),
        ],
    ),
    Case(
        "GPUThermalOrPowerSlowdown",
        "each flag is judged by its own reason's counter: GPU 6's driver has time counters but none "
        "for hw_slowdown, whose flag is set for a whole window: it fires. GPU 7's older driver counts "
        "both thermal slowdowns in `thermal`, idle: its sw_thermal_slowdown flag stays quiet, as GPU "
        "2's hw_thermal_slowdown flag does beside its own idle counter",
        {
            S("clusterhealth_gpu_clocks_event_seconds_total", gpu("6", reason="sw_power_cap")): "0+30x26",
            S("clusterhealth_gpu_clocks_event_seconds_total", gpu("6", reason="hw_thermal_slowdown")): "0x26",
            S("clusterhealth_gpu_clocks_event_active", gpu("6", reason="hw_slowdown")): "0x5 1x21",
            S("clusterhealth_gpu_clocks_event_seconds_total", gpu("7", reason="thermal")): "0x26",
            S("clusterhealth_gpu_clocks_event_active", gpu("7", reason="sw_thermal_slowdown")): "1x26",
            S("clusterhealth_gpu_clocks_event_seconds_total", gpu("2", reason="hw_thermal_slowdown")): "0x26",
            S("clusterhealth_gpu_clocks_event_active", gpu("2", reason="hw_thermal_slowdown")): "1x26",
        },
        [("12m", []), ("20m", [F(gpu("6", reason="hw_slowdown"), "warning")])],
    ),
    Case(
        "GPUPCIeLinkDegraded",
        "x8 in an x16 slot fires; a lower generation fires under load only (idle GPUs save power)",
        {
            S("clusterhealth_gpu_pcie_link_width", gpu("0")): "8x20",
            S("clusterhealth_gpu_pcie_link_width_max", gpu("0")): "16x20",
            S("clusterhealth_gpu_pcie_link_width", gpu("1")): "16x20",
            S("clusterhealth_gpu_pcie_link_width_max", gpu("1")): "16x20",
            S("clusterhealth_gpu_pcie_link_generation", gpu("1")): "1x20",
            S("clusterhealth_gpu_pcie_link_generation_max", gpu("1")): "5x20",
            S("clusterhealth_gpu_utilization_ratio", gpu("1")): "0x20",
            S("clusterhealth_gpu_pcie_link_width", gpu("2")): "16x20",
            S("clusterhealth_gpu_pcie_link_width_max", gpu("2")): "16x20",
            S("clusterhealth_gpu_pcie_link_generation", gpu("2")): "4x20",
            S("clusterhealth_gpu_pcie_link_generation_max", gpu("2")): "5x20",
            S("clusterhealth_gpu_utilization_ratio", gpu("2")): "1x20",
        },
        [("5m", []), ("15m", [F(gpu("0"), "warning", 8), F(gpu("2"), "warning", 4)])],
    ),
    Case(
        "GPUPCIeReplays",
        "more than 8 replays a minute for 10 minutes fires; 8 a minute and a short burst do not",
        {
            S("clusterhealth_gpu_pcie_replay_errors_total", gpu("0")): "0+10x30",
            S("clusterhealth_gpu_pcie_replay_errors_total", gpu("1")): "0+8x30",
            S("clusterhealth_gpu_pcie_replay_errors_total", gpu("2")): "0x10 500x20",
        },
        [("5m", []), ("20m", [F(gpu("0"), "warning", 10)])],
    ),
    Case(
        "NVLinkDown",
        "one link of GPU 2 goes down at 6m; GPU 1's links stay up",
        {
            S("clusterhealth_gpu_nvlink_links_down", gpu("2")): "0x5 1x20",
            S("clusterhealth_gpu_nvlink_links_down", gpu("1")): "0x25",
        },
        [("3m", []), ("10m", [F(gpu("2"), "critical", 1)])],
    ),
]
