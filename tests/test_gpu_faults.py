"""One test per GPU incident: the simulated node reproduces it, the exposition must show it.

Each test runs the real collection path (`scrape_once`: pynvml calls, error policy, mapping to
metrics, rendering) on a simulated NVML library.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from clusterhealth.agent import config as configuration
from clusterhealth.agent.daemon import scrape_once
from clusterhealth.agent.node import Node
from clusterhealth.exporters.gpu import (
    FieldValue,
    GpuCollector,
    GpuDirectory,
    GpuReading,
    clock_event_seconds,
)
from clusterhealth.exporters.nvml_health import RECOVERY_ACTIONS
from clusterhealth.exporters.sim import nvml as nvml_sim
from clusterhealth.exporters.sim.scenario import CLOCK_EVENT_BITS

from .conftest import samples, scenario, value


@pytest.fixture
def scrape(write_scenario: Callable[..., Path]) -> Iterator[Callable[..., str]]:
    def run(data: dict[str, Any], **gpu: Any) -> str:
        path = write_scenario(data)
        overrides = {
            "simulate": str(path),
            "collectors.gpu.gpm_min_window_seconds": 0.05,
            "collectors.kernel_log.enabled": False,
        }
        overrides.update({f"collectors.gpu.{k}": v for k, v in gpu.items()})
        return scrape_once(configuration.load(None, overrides)).decode()

    yield run
    nvml_sim.uninstall()


def fault(gpu: int, **kw: Any) -> dict[str, Any]:
    return {"gpu": gpu, **kw}


def test_thermal_slowdown_shows_hw_slowdown_reasons_and_low_clock(scrape: Callable[..., str]) -> None:
    text = scrape(
        scenario(
            faults=[
                fault(
                    1,
                    set={
                        "clocks_event_reasons": ["hw_slowdown", "hw_thermal_slowdown"],
                        "sm_clock_mhz": 1155,
                        "temperature_celsius": 91,
                        "memory_temperature_celsius": 98,
                    },
                )
            ]
        ),
        clocks_event_reasons=["*"],
    )
    active = {
        reason: value(text, "clusterhealth_gpu_clocks_event_active", gpu="1", reason=reason)
        for reason, _ in CLOCK_EVENT_BITS.items()
    }
    assert active == {r: 1.0 if r in ("hw_slowdown", "hw_thermal_slowdown") else 0.0 for r in active}
    assert value(text, "clusterhealth_gpu_clocks_event_active", gpu="0", reason="hw_slowdown") == 0.0
    assert value(text, "clusterhealth_gpu_sm_clock_hertz", gpu="1") == 1155e6
    assert value(text, "clusterhealth_gpu_sm_clock_max_hertz", gpu="1") == 1980e6
    assert value(text, "clusterhealth_gpu_temperature_celsius", gpu="1", sensor="gpu") == 91
    assert value(text, "clusterhealth_gpu_temperature_celsius", gpu="1", sensor="memory") == 98


def test_throttle_time_counts_the_seconds_each_reason_held_the_clocks(scrape: Callable[..., str]) -> None:
    # GPU 1 ran hot from 100 s to 400 s; its power cap held it 5 s; it was board-limited for 12.5 s
    # before the node started. The sampled flag at 600 s says nothing of this any more.
    text = scrape(
        scenario(
            frozen_at_seconds=600,
            gpus={1: {"clocks_event_seconds": {"board_limit": 12.5}}},
            faults=[
                fault(
                    1,
                    from_seconds=100,
                    until_seconds=400,
                    set={"clocks_event_reasons": ["hw_slowdown", "hw_thermal_slowdown"]},
                ),
                fault(1, from_seconds=420, until_seconds=425, set={"clocks_event_reasons": ["sw_power_cap"]}),
            ],
        ),
        clocks_event_counters=["*"],
    )
    held = {
        reason: value(text, "clusterhealth_gpu_clocks_event_seconds_total", gpu="1", reason=reason)
        for reason in (
            "hw_thermal_slowdown",
            "sw_thermal_slowdown",
            "sw_power_cap",
            "board_limit",
            "hw_power_brake_slowdown",
            "sync_boost",
            "low_utilization",
            "reliability",
        )
    }
    assert held == {
        "hw_thermal_slowdown": pytest.approx(300),
        "sw_thermal_slowdown": 0,
        "sw_power_cap": pytest.approx(5),
        "board_limit": 12.5,
        "hw_power_brake_slowdown": 0,
        "sync_boost": 0,
        "low_utilization": 0,
        "reliability": 0,
    }
    # The older thermal counter counts the same time again where the split ones exist.
    assert value(text, "clusterhealth_gpu_clocks_event_seconds_total", gpu="1", reason="thermal") is None
    assert value(text, "clusterhealth_gpu_clocks_event_active", gpu="1", reason="hw_thermal_slowdown") == 0
    assert (
        value(text, "clusterhealth_gpu_clocks_event_seconds_total", gpu="0", reason="hw_thermal_slowdown")
        == 0
    )


def test_by_default_the_throttle_time_of_the_reasons_that_are_faults_is_exported(
    scrape: Callable[..., str],
) -> None:
    def counters(text: str) -> set[str]:
        return {
            dict(labels)["reason"]
            for (name, labels) in samples(text)
            if name == "clusterhealth_gpu_clocks_event_seconds_total"
        }

    # Heat and the power brake; the power cap (how a busy GPU runs at its limit) on request.
    faults = {"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
    assert counters(scrape(scenario(gpu_count=1))) == faults
    every = scrape(scenario(gpu_count=1), clocks_event_counters=["*"])
    others = {"sw_power_cap", "sync_boost", "board_limit", "low_utilization", "reliability"}
    assert counters(every) == faults | others


def test_by_default_every_flag_of_spec_is_exported(scrape: Callable[..., str]) -> None:
    def flags(text: str) -> set[str]:
        return {
            dict(labels)["reason"]
            for (name, labels) in samples(text)
            if name == "clusterhealth_gpu_clocks_event_active"
        }

    assert flags(scrape(scenario(gpu_count=1))) == set(CLOCK_EVENT_BITS)
    slowing = ["sw_*", "hw_*", "sync_boost"]
    assert flags(scrape(scenario(gpu_count=1), clocks_event_reasons=slowing)) == {
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }


def test_a_driver_without_the_slowdown_counters_counts_thermal_time_together(
    scrape: Callable[..., str],
) -> None:
    older = ["sw_power_cap", "sync_boost", "thermal", "board_limit", "low_utilization", "reliability"]
    text = scrape(
        scenario(
            frozen_at_seconds=60,
            gpu={"clocks_event_counters": older},
            faults=[fault(0, set={"clocks_event_reasons": ["sw_thermal_slowdown"]})],
        )
    )
    assert value(
        text, "clusterhealth_gpu_clocks_event_seconds_total", gpu="0", reason="thermal"
    ) == pytest.approx(60)
    assert value(text, "clusterhealth_gpu_clocks_event_seconds_total", gpu="1", reason="thermal") == 0
    assert (
        value(text, "clusterhealth_gpu_clocks_event_seconds_total", gpu="0", reason="sw_thermal_slowdown")
        is None
    )


def test_a_throttle_counter_id_answered_with_another_type_is_another_field() -> None:
    ns = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    fields = {
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: FieldValue(ns, 2.5e9),
        # A driver numbering its fields otherwise answers a power-smoothing setting here.
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: FieldValue(
            pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 3
        ),
        pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: FieldValue(ns, 7e9),
    }
    assert clock_event_seconds(fields) == {"sw_power_cap": 2.5, "thermal": 7.0}


# Every action the installed nvidia-ml-py names (13.615: also recover_imex_domain, bus_reset and
# system_reboot), besides the five nvml.h has had since R570.
ACTIONS = sorted(
    {"none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset", *RECOVERY_ACTIONS.values()}
)


@pytest.mark.parametrize("action", ACTIONS)
def test_the_recovery_action_is_named_as_nvml_names_it(scrape: Callable[..., str], action: str) -> None:
    # A GPU that needs a reset after an Xid the agent never saw: the driver still says so.
    text = scrape(scenario(faults=[fault(1, set={"recovery_action": action})]))
    actions = {
        dict(labels)["action"]: v
        for (name, labels), v in samples(text).items()
        if name == "clusterhealth_gpu_recovery_action" and dict(labels)["gpu"] == "1"
    }
    assert actions == {action: 1.0}
    assert value(text, "clusterhealth_gpu_recovery_action", gpu="0", action="none") == 1
    assert value(text, "clusterhealth_gpu_up", gpu="1") == 1
    # The audit asks for the action (checks/audits/gpu_health.py says what each one means).
    check = value(text, "clusterhealth_check_status", check="gpu_recovery_action", subject="1")
    assert check == (0 if action == "none" else 2)


@pytest.mark.parametrize("action", ["gpu_reset", "node_reboot"])
def test_a_gpu_waiting_for_a_reset_still_says_its_recovery_action(
    scrape: Callable[..., str], action: str
) -> None:
    # GPU 1 answers ResetRequired to every call but the recovery-action field, which says what to do.
    text = scrape(scenario(faults=[fault(1, reset_required=True, set={"recovery_action": action})]))
    assert value(text, "clusterhealth_gpu_up", gpu="1") == 0
    gpu1 = {name for name, labels in samples(text) if dict(labels).get("gpu") == "1"}
    assert gpu1 == {"clusterhealth_gpu_up", "clusterhealth_gpu_recovery_action"}
    assert value(text, "clusterhealth_gpu_recovery_action", gpu="1", action=action) == 1
    assert value(text, "clusterhealth_check_status", check="gpu_recovery_action", subject="1") == 2
    assert value(text, "clusterhealth_check_status", check="gpu_lost", subject="1") == 2
    assert value(text, "clusterhealth_gpu_up", gpu="0") == 1


def test_a_gpu_waiting_for_a_reset_on_a_driver_without_the_field_is_only_down(
    scrape: Callable[..., str],
) -> None:
    text = scrape(scenario(gpu={"recovery_action": None}, faults=[fault(1, reset_required=True)]))
    assert value(text, "clusterhealth_gpu_up", gpu="1") == 0
    assert "clusterhealth_gpu_recovery_action" not in text
    assert value(text, "clusterhealth_check_status", check="gpu_recovery_action", subject="1") == 3


def test_a_driver_without_the_recovery_action_field_leaves_it_absent(scrape: Callable[..., str]) -> None:
    text = scrape(scenario(gpu={"recovery_action": None}))
    assert "clusterhealth_gpu_recovery_action" not in text
    assert "clusterhealth_gpu_nvml_errors_total" not in text


def test_sram_ecc_errors_past_the_threshold(scrape: Callable[..., str]) -> None:
    data = scenario(
        gpu_count=3,
        gpus={1: {"sram_ecc_supported": False}},
        faults=[fault(0, set={"sram_ecc_threshold_exceeded": True, "sram_ecc_uncorrected_parity": 4})],
    )
    # By default the audit says it (a CRITICAL gpu_ecc_uncorrectable); the flag itself is opt-in.
    text = scrape(data)
    assert "clusterhealth_gpu_sram_ecc_threshold_exceeded" not in text
    assert value(text, "clusterhealth_check_status", check="gpu_ecc_uncorrectable", subject="0") == 2
    assert value(text, "clusterhealth_check_status", check="gpu_ecc_uncorrectable", subject="2") == 0
    text = scrape(data, include_metrics=["clusterhealth_gpu_sram_*"])
    assert value(text, "clusterhealth_gpu_sram_ecc_threshold_exceeded", gpu="0") == 1
    assert value(text, "clusterhealth_gpu_sram_ecc_threshold_exceeded", gpu="1") is None
    assert value(text, "clusterhealth_gpu_sram_ecc_threshold_exceeded", gpu="2") == 0


@pytest.mark.parametrize(
    ("state", "pending", "unrepairable"),
    [
        ({}, 0, 0),
        ({"channel_repair_pending": True}, 1, 0),
        ({"tpc_repair_pending": True}, 1, 0),
        ({"memory_unrepairable": True}, 0, 1),
    ],
)
def test_memory_repair_status_on_a_gpu_that_has_it(
    scrape: Callable[..., str], state: dict[str, bool], pending: int, unrepairable: int
) -> None:
    text = scrape(scenario(gpu={"memory_repair_supported": True}, faults=[fault(0, set=state)]))
    assert value(text, "clusterhealth_gpu_repair_pending", gpu="0") == pending
    assert value(text, "clusterhealth_gpu_memory_unrepairable", gpu="0") == unrepairable
    assert value(text, "clusterhealth_gpu_repair_pending", gpu="1") == 0


def test_an_h100_has_no_memory_repair_status(scrape: Callable[..., str]) -> None:
    text = scrape(scenario())
    assert "clusterhealth_gpu_repair_pending" not in text
    assert "clusterhealth_gpu_memory_unrepairable" not in text


@pytest.mark.parametrize(
    ("gpu", "degraded"),
    [
        ({}, 0),
        ({"fabric_conditions": ["degraded_bandwidth"]}, 1),
        ({"fabric_conditions": ["route_unhealthy", "fabric_manager_disconnected"]}, 1),
        ({"fabric_conditions": ["incorrect_configuration"]}, 1),
        ({"fabric_status": "Unknown"}, 1),  # the registration failed
        ({"fabric_conditions": ["degraded_bandwidth"], "fabric_info_version": 2}, 1),  # no summary
        ({"fabric_info_version": 2}, 0),
        ({"fabric_state": "in_progress"}, None),  # not registered yet: unknown
        ({"fabric_supported": False}, None),  # a PCIe card or a system without NVSwitch
    ],
)
def test_fabric_health_from_its_mask(
    scrape: Callable[..., str], gpu: dict[str, Any], degraded: int | None
) -> None:
    text = scrape(scenario(gpu_count=1, gpu=gpu))
    assert value(text, "clusterhealth_gpu_fabric_degraded") == degraded
    assert "clusterhealth_gpu_nvml_errors_total" not in text


def test_the_log_says_how_the_fabric_is_degraded_once(
    write_scenario: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    data = scenario(
        gpu_count=1, gpu={"fabric_conditions": ["route_unhealthy", "fabric_manager_disconnected"]}
    )
    config = configuration.load(None, {"simulate": str(write_scenario(data))})
    node = Node(config, one_shot=True)
    try:
        collector = GpuCollector(node.session, node.directory, gpm=False)
        with caplog.at_level(logging.WARNING, logger="clusterhealth.gpu"):
            collector.collect()
            collector.collect()
    finally:
        node.close()
        nvml_sim.uninstall()
    said = [r.getMessage() for r in caplog.records if "fabric degraded" in r.getMessage()]
    how = "route_unhealthy, fabric_manager_disconnected"
    assert said == [f"GPU 0 ({node.directory.uuid(0)}): NVLink fabric degraded: {how}"]


@pytest.mark.parametrize("version", [2, 1])
def test_platform_info_labels_gpu_info(scrape: Callable[..., str], version: int) -> None:
    where = {"chassis_serial": "1821023000123", "slot": 7, "tray": 3, "host_id": 1, "module_id": 2}
    text = scrape(scenario(gpu_count=1, gpu={"platform_info": where, "platform_info_version": version}))
    labels = next(dict(ls) for (n, ls) in samples(text) if n == "clusterhealth_gpu_info")
    # Version 1 of the struct has a rack GUID, not the chassis serial.
    assert labels["chassis_serial"] == ("1821023000123" if version == 2 else "")
    assert (labels["slot"], labels["tray"], labels["host_id"], labels["module_id"]) == ("7", "3", "1", "2")
    assert "clusterhealth_gpu_nvml_errors_total" not in text


def test_an_hgx_h100_has_no_platform_info(scrape: Callable[..., str]) -> None:
    text = scrape(scenario(gpu_count=1))
    labels = next(dict(ls) for (n, ls) in samples(text) if n == "clusterhealth_gpu_info")
    # An empty label is no label to Prometheus.
    assert {labels.get(k, "") for k in ("chassis_serial", "slot", "tray", "host_id", "module_id")} == {""}


def test_pcie_link_trained_down_to_x8_after_reseat(scrape: Callable[..., str]) -> None:
    text = scrape(
        scenario(faults=[fault(1, set={"pcie_width": 8, "pcie_generation": 4, "pcie_replays": 310})])
    )
    assert value(text, "clusterhealth_gpu_pcie_link_width", gpu="1") == 8
    assert value(text, "clusterhealth_gpu_pcie_link_width_max", gpu="1") == 16
    assert value(text, "clusterhealth_gpu_pcie_link_generation", gpu="1") == 4
    assert value(text, "clusterhealth_gpu_pcie_link_generation_max", gpu="1") == 5
    assert value(text, "clusterhealth_gpu_pcie_replay_errors_total", gpu="1") == 310
    assert value(text, "clusterhealth_gpu_pcie_link_width", gpu="0") == 16


def test_nvlink_down_after_crc_errors(scrape: Callable[..., str]) -> None:
    errors = {
        5: {"crc_flit": 18234, "crc_data": 12, "replay": 912, "recovery": 37},
        9: {"crc_flit": 6, "replay": 1},
    }
    text = scrape(scenario(faults=[fault(0, xid=[74], set={"nvlink_down": [5], "nvlink_errors": errors})]))
    # By default, per GPU: how many links are down, the errors summed over its links, its rate.
    assert value(text, "clusterhealth_gpu_nvlink_links_down", gpu="0") == 1
    assert value(text, "clusterhealth_gpu_nvlink_links_down", gpu="1") == 0
    summed = {"crc_flit": 18240, "crc_data": 12, "replay": 913, "recovery": 37}
    for error, count in summed.items():
        assert value(text, "clusterhealth_gpu_nvlink_errors_total", gpu="0", error=error) == count
    assert value(text, "clusterhealth_gpu_nvlink_errors_total", gpu="1", error="crc_flit") == 0
    # H100 SXM: 18 links at 26.562 GB/s each way; one down leaves 17.
    assert value(text, "clusterhealth_gpu_nvlink_rate_bytes_per_second", gpu="0") == 17 * 26562e6
    assert value(text, "clusterhealth_gpu_nvlink_rate_bytes_per_second", gpu="1") == 18 * 26562e6
    assert "clusterhealth_gpu_nvlink_up" not in text
    assert "clusterhealth_gpu_nvlink_link_errors_total" not in text
    assert value(text, "clusterhealth_gpu_xid_errors_total", gpu="0", xid="74") == 1


def test_per_link_nvlink_detail_on_request(scrape: Callable[..., str]) -> None:
    errors = {5: {"crc_flit": 18234, "crc_data": 12, "replay": 912, "recovery": 37}}
    text = scrape(
        scenario(faults=[fault(0, set={"nvlink_down": [5], "nvlink_errors": errors})]),
        include_metrics=["clusterhealth_gpu_nvlink_*"],
    )
    assert value(text, "clusterhealth_gpu_nvlink_up", gpu="0", link="5") == 0
    assert value(text, "clusterhealth_gpu_nvlink_up", gpu="0", link="4") == 1
    link_errors = "clusterhealth_gpu_nvlink_link_errors_total"
    for error, count in errors[5].items():
        assert value(text, link_errors, gpu="0", link="5", error=error) == count
    assert value(text, link_errors, gpu="0", link="4", error="crc_flit") == 0
    # H100 SXM has 18 links: 0..17 and nothing beyond.
    assert value(text, "clusterhealth_gpu_nvlink_up", gpu="1", link="17") == 1
    assert value(text, "clusterhealth_gpu_nvlink_up", gpu="1", link="18") is None
    # The totals are there too.
    assert value(text, "clusterhealth_gpu_nvlink_errors_total", gpu="0", error="replay") == 912


def test_a_family_can_be_left_out(scrape: Callable[..., str]) -> None:
    text = scrape(
        scenario(), exclude_metrics=["clusterhealth_gpu_fp*_active_ratio", "clusterhealth_gpu_ecc_*"]
    )
    assert "clusterhealth_gpu_fp16_active_ratio" not in text
    assert "clusterhealth_gpu_fp64_active_ratio" not in text
    assert "clusterhealth_gpu_ecc_errors_total" not in text
    assert value(text, "clusterhealth_gpu_tensor_active_ratio", gpu="0") == 0
    # Exclusion wins over inclusion.
    text = scrape(scenario(), include_metrics=["*"], exclude_metrics=["clusterhealth_gpu_nvlink_up"])
    assert "clusterhealth_gpu_nvlink_up" not in text
    assert "clusterhealth_gpu_nvlink_link_errors_total" in text


def test_pcie_gpu_without_nvlink_has_no_nvlink_series(scrape: Callable[..., str]) -> None:
    text = scrape(scenario(gpu={"name": "NVIDIA H100 PCIe", "nvlinks": 0}), include_metrics=["*"])
    assert "clusterhealth_gpu_nvlink" not in text
    assert value(text, "clusterhealth_gpu_up", gpu="0") == 1


def test_hbm_uncorrectable_ecc_with_row_remap_pending(scrape: Callable[..., str]) -> None:
    text = scrape(
        scenario(
            faults=[
                fault(
                    1,
                    xid=[94, 63],
                    set={
                        "ecc_corrected_volatile": 1312,
                        "ecc_corrected_aggregate": 20411,
                        "ecc_uncorrected_volatile": 2,
                        "ecc_uncorrected_aggregate": 3,
                        "remapped_rows_uncorrectable": 1,
                        "remap_pending": True,
                    },
                )
            ]
        )
    )
    ecc = "clusterhealth_gpu_ecc_errors_total"
    assert value(text, ecc, gpu="1", error="corrected", scope="volatile") == 1312
    assert value(text, ecc, gpu="1", error="corrected", scope="aggregate") == 20411
    assert value(text, ecc, gpu="1", error="uncorrected", scope="volatile") == 2
    assert value(text, ecc, gpu="1", error="uncorrected", scope="aggregate") == 3
    assert value(text, "clusterhealth_gpu_remapped_rows", gpu="1", cause="uncorrectable") == 1
    assert value(text, "clusterhealth_gpu_remapped_rows", gpu="1", cause="correctable") == 0
    assert value(text, "clusterhealth_gpu_row_remap_pending", gpu="1") == 1
    assert value(text, "clusterhealth_gpu_row_remap_failed", gpu="1") == 0
    assert value(text, "clusterhealth_gpu_row_remap_pending", gpu="0") == 0
    assert value(text, "clusterhealth_gpu_xid_errors_total", gpu="1", xid="94") == 1
    assert value(text, "clusterhealth_gpu_xid_errors_total", gpu="1", xid="63") == 1


def test_row_remap_failed_means_replace_the_gpu(scrape: Callable[..., str]) -> None:
    text = scrape(
        scenario(faults=[fault(0, xid=[64], set={"remapped_rows_uncorrectable": 8, "remap_failed": True})])
    )
    assert value(text, "clusterhealth_gpu_row_remap_failed", gpu="0") == 1
    assert value(text, "clusterhealth_gpu_remapped_rows", gpu="0", cause="uncorrectable") == 8
    assert value(text, "clusterhealth_gpu_xid_errors_total", gpu="0", xid="64") == 1


@pytest.mark.parametrize("error", ["GpuIsLost", "ResetRequired", "GpuNotFound", "Unknown", "NoPermission"])
def test_gpu_whose_identity_fails_is_down_and_the_others_are_exported(
    scrape: Callable[..., str], error: str
) -> None:
    # The handle and UUID are what a GPU is exported by: any error there takes the GPU down.
    text = scrape(scenario(gpu_count=3, faults=[fault(1, errors={"nvmlDeviceGetUUID": error})]))
    assert value(text, "clusterhealth_gpu_up", gpu="1") == 0
    assert value(text, "clusterhealth_gpu_power_watts", gpu="1") is None
    assert value(text, "clusterhealth_gpu_info", gpu="1") is None
    for other in ("0", "2"):
        assert value(text, "clusterhealth_gpu_up", gpu=other) == 1
        assert value(text, "clusterhealth_gpu_power_watts", gpu=other) == 72.5
    assert value(text, "clusterhealth_scrape_collector_success", collector="gpu") == 1


def test_gpu_fell_off_the_bus_is_down_and_the_others_are_exported(scrape: Callable[..., str]) -> None:
    text = scrape(scenario(gpu_count=8, faults=[fault(6, lost=True, xid=[79])]))
    assert value(text, "clusterhealth_gpu_up", gpu="6", uuid="") == 0
    assert "clusterhealth_gpu_info{" in text
    assert value(text, "clusterhealth_gpu_temperature_celsius", gpu="6", sensor="gpu") is None
    assert [value(text, "clusterhealth_gpu_up", gpu=str(i)) for i in range(8)] == [1] * 6 + [0, 1]
    assert value(text, "clusterhealth_scrape_collector_success", collector="gpu") == 1


@pytest.mark.parametrize("error", ["GpuIsLost", "ResetRequired", "GpuNotFound"])
def test_gpu_lost_in_the_middle_of_a_read_is_down(scrape: Callable[..., str], error: str) -> None:
    text = scrape(scenario(faults=[fault(0, errors={"nvmlDeviceGetTotalEccErrors": error})]))
    assert value(text, "clusterhealth_gpu_up", gpu="0") == 0
    assert value(text, "clusterhealth_gpu_sm_clock_hertz", gpu="0") is None
    assert value(text, "clusterhealth_gpu_up", gpu="1") == 1


def test_power_sensor_unknown_error_leaves_only_power_absent(scrape: Callable[..., str]) -> None:
    text = scrape(scenario(faults=[fault(1, errors={"nvmlDeviceGetPowerUsage": "Unknown"})]))
    assert value(text, "clusterhealth_gpu_power_watts", gpu="1") is None
    assert value(text, "clusterhealth_gpu_power_watts", gpu="0") == 72.5
    assert value(text, "clusterhealth_gpu_up", gpu="1") == 1
    assert value(text, "clusterhealth_gpu_power_limit_watts", gpu="1") == 700
    assert value(text, "clusterhealth_gpu_temperature_celsius", gpu="1", sensor="gpu") == 31
    errors = "clusterhealth_gpu_nvml_errors_total"
    assert value(text, errors, gpu="1", call="nvmlDeviceGetPowerUsage", error="Unknown") == 1


@pytest.mark.parametrize(
    ("call", "absent"),
    [
        ("nvmlDeviceGetTotalEccErrors", "clusterhealth_gpu_ecc_errors_total"),
        ("nvmlDeviceGetRemappedRows", "clusterhealth_gpu_row_remap_pending"),
        ("nvmlDeviceGetTotalEnergyConsumption", "clusterhealth_gpu_energy_joules_total"),
        ("nvmlDeviceGetFieldValues", 'sensor="memory"'),
        ("nvmlDeviceGetPcieReplayCounter", "clusterhealth_gpu_pcie_replay_errors_total"),
        ("nvmlDeviceGetNvLinkErrorCounter", "clusterhealth_gpu_nvlink_errors_total"),
    ],
)
def test_unsupported_call_leaves_its_series_absent_silently(
    scrape: Callable[..., str], call: str, absent: str
) -> None:
    text = scrape(scenario(gpu_count=1, faults=[fault(0, errors={call: "NotSupported"})]))
    assert absent not in text
    assert value(text, "clusterhealth_gpu_up", gpu="0") == 1
    assert value(text, "clusterhealth_gpu_power_watts", gpu="0") == 72.5
    # NotSupported is the GPU's nature, not an error worth counting.
    assert "clusterhealth_gpu_nvml_errors_total" not in text


def test_gpu_without_hbm_sensor_has_only_the_gpu_temperature(scrape: Callable[..., str]) -> None:
    text = scrape(scenario(gpu_count=1, gpu={"memory_temperature_celsius": None}))
    assert value(text, "clusterhealth_gpu_temperature_celsius", sensor="gpu") == 31
    assert value(text, "clusterhealth_gpu_temperature_celsius", sensor="memory") is None


def test_busy_waiting_gpu_shows_full_utilization_but_idle_sms(scrape: Callable[..., str]) -> None:
    text = scrape(scenario(gpu={"utilization": 1.0, "sm_active": 0.04, "sm_occupancy": 0.02}))
    assert value(text, "clusterhealth_gpu_utilization_ratio", gpu="0") == 1.0
    assert value(text, "clusterhealth_gpu_sm_active_ratio", gpu="0") == pytest.approx(0.04)
    assert value(text, "clusterhealth_gpu_sm_occupancy_ratio", gpu="0") == pytest.approx(0.02)


def test_gpu_without_gpm_falls_back_to_utilization(scrape: Callable[..., str]) -> None:
    text = scrape(scenario(gpu={"name": "NVIDIA A100-SXM4-80GB", "gpm_supported": False, "utilization": 0.9}))
    assert "clusterhealth_gpu_sm_active_ratio" not in text
    assert "clusterhealth_gpu_sm_occupancy_ratio" not in text
    assert value(text, "clusterhealth_gpu_utilization_ratio", gpu="0") == 0.9


def test_compute_memory_and_link_bound_gpus_show_their_wall(scrape: Callable[..., str]) -> None:
    # GPU 0 runs tensor cores flat out, GPU 1 streams from HBM, GPU 2 all-reduces over NVLink.
    gib = float(1 << 30)
    text = scrape(
        scenario(
            gpu_count=3,
            gpu={"utilization": 1.0, "sm_active": 0.9},
            gpus={
                0: {"tensor_active": 0.83, "dram_active": 0.21, "fp16_active": 0.02, "fp32_active": 0.05},
                1: {"tensor_active": 0.04, "dram_active": 0.91, "fp64_active": 0.3},
                2: {
                    "sm_active": 0.12,
                    "nvlink_received_bytes_per_second": 400 * gib,
                    "nvlink_transmitted_bytes_per_second": 380 * gib,
                    "pcie_received_bytes_per_second": 1.5 * gib,
                    "pcie_transmitted_bytes_per_second": 0.5 * gib,
                },
            },
        )
    )
    assert value(text, "clusterhealth_gpu_tensor_active_ratio", gpu="0") == pytest.approx(0.83)
    assert value(text, "clusterhealth_gpu_dram_active_ratio", gpu="0") == pytest.approx(0.21)
    assert value(text, "clusterhealth_gpu_fp16_active_ratio", gpu="0") == pytest.approx(0.02)
    assert value(text, "clusterhealth_gpu_fp32_active_ratio", gpu="0") == pytest.approx(0.05)
    assert value(text, "clusterhealth_gpu_fp64_active_ratio", gpu="1") == pytest.approx(0.3)
    assert value(text, "clusterhealth_gpu_dram_active_ratio", gpu="1") == pytest.approx(0.91)
    # GPM counts MiB/s; the exposition bytes per second.
    nvlink_in = value(text, "clusterhealth_gpu_nvlink_received_bytes_per_second", gpu="2")
    assert nvlink_in == pytest.approx(400 * gib)
    nvlink_out = value(text, "clusterhealth_gpu_nvlink_transmitted_bytes_per_second", gpu="2")
    assert nvlink_out == pytest.approx(380 * gib)
    assert value(text, "clusterhealth_gpu_pcie_received_bytes_per_second", gpu="2") == pytest.approx(
        1.5 * gib
    )
    pcie_out = value(text, "clusterhealth_gpu_pcie_transmitted_bytes_per_second", gpu="2")
    assert pcie_out == pytest.approx(0.5 * gib)
    assert value(text, "clusterhealth_gpu_pcie_received_bytes_per_second", gpu="0") == 0
    # The peak the NVLink traffic is held against: 18 links at 26.562 GB/s each way.
    assert value(text, "clusterhealth_gpu_nvlink_rate_bytes_per_second", gpu="2") == 18 * 26562e6


def test_a_pcie_card_has_gpm_but_no_nvlink_traffic(scrape: Callable[..., str]) -> None:
    text = scrape(scenario(gpu_count=1, gpu={"name": "NVIDIA H100 PCIe", "nvlinks": 0, "tensor_active": 0.4}))
    assert value(text, "clusterhealth_gpu_tensor_active_ratio") == pytest.approx(0.4)
    assert value(text, "clusterhealth_gpu_pcie_received_bytes_per_second") == 0
    assert "clusterhealth_gpu_nvlink_received_bytes_per_second" not in text
    assert "clusterhealth_gpu_nvlink_rate_bytes_per_second" not in text
    assert "clusterhealth_gpu_nvml_errors_total" not in text


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({"gpu": {"gpm_supported": False}}, "the GPU has no GPM"),
        (
            {"faults": [fault(0, errors={"nvmlGpmQueryDeviceSupport": "FunctionNotFound"})]},
            "the driver has no GPM",
        ),
        (
            {"faults": [fault(0, errors={"nvmlGpmQueryDeviceSupport": "NotSupported"})]},
            "nvmlGpmQueryDeviceSupport answered NotSupported",
        ),
    ],
)
def test_without_gpm_the_roofline_is_absent_and_the_log_says_why_once(
    write_scenario: Callable[..., Path], caplog: pytest.LogCaptureFixture, data: dict[str, Any], why: str
) -> None:
    overrides = {
        "simulate": str(write_scenario(scenario(gpu_count=1, **data))),
        "collectors.gpu.gpm_min_window_seconds": 0.05,
    }
    config = configuration.load(None, overrides)
    node = Node(config, one_shot=True)
    try:
        collector = GpuCollector(node.session, node.directory, gpm_min_window_seconds=0.05)
        with caplog.at_level(logging.INFO, logger="clusterhealth.gpu"):
            first = collector.collect()
            collector.collect()
    finally:
        node.close()
        nvml_sim.uninstall()
    names = {family.name for family in first}
    assert "clusterhealth_gpu_tensor_active_ratio" not in names
    assert "clusterhealth_gpu_sm_active_ratio" not in names
    assert "clusterhealth_gpu_utilization_ratio" in names
    said = [r.getMessage() for r in caplog.records if "activity are not exported" in r.getMessage()]
    assert len(said) == 1 and why in said[0], said


def test_gpm_can_be_switched_off(scrape: Callable[..., str]) -> None:
    text = scrape(scenario(gpu={"sm_active": 0.5}), gpm=False)
    assert "clusterhealth_gpu_sm_active_ratio" not in text


def test_driver_older_than_r535_falls_back_to_throttle_reasons(scrape: Callable[..., str]) -> None:
    text = scrape(
        scenario(
            driver_version="525.85.12",
            cuda_driver_version=12000,
            faults=[fault(0, set={"clocks_event_reasons": ["sw_power_cap"]})],
        ),
        clocks_event_reasons=["*"],
    )
    assert value(text, "clusterhealth_gpu_clocks_event_active", gpu="0", reason="sw_power_cap") == 1
    assert value(text, "clusterhealth_gpu_clocks_event_active", gpu="1", reason="gpu_idle") == 1
    assert (
        value(text, "clusterhealth_gpu_driver_info", driver_version="525.85.12", cuda_driver_version="12.0")
        == 1
    )
    assert "clusterhealth_gpu_nvml_errors_total" not in text


def test_xid_events_are_counted_per_gpu_and_code(scrape: Callable[..., str]) -> None:
    text = scrape(scenario(faults=[fault(0, xid=[13, 13, 31]), fault(1, xid=[48])]))
    assert value(text, "clusterhealth_gpu_xid_errors_total", gpu="0", xid="13") == 2
    assert value(text, "clusterhealth_gpu_xid_errors_total", gpu="0", xid="31") == 1
    assert value(text, "clusterhealth_gpu_xid_errors_total", gpu="1", xid="48") == 1


def test_units_are_converted_once_at_the_boundary(scrape: Callable[..., str]) -> None:
    text = scrape(
        scenario(
            gpu_count=1,
            frozen_at_seconds=100,
            gpu={"power_watts": 612.4, "energy_joules": 5000.0, "memory_used_mib": 1024},
        )
    )
    assert value(text, "clusterhealth_gpu_power_watts") == pytest.approx(612.4)
    assert value(text, "clusterhealth_gpu_energy_joules_total") == pytest.approx(5000 + 612.4 * 100)
    assert value(text, "clusterhealth_gpu_memory_used_bytes") == 1024 * 2**20
    assert value(text, "clusterhealth_gpu_memory_total_bytes") == 81559 * 2**20
    assert value(text, "clusterhealth_gpu_memory_clock_hertz") == 2619e6
    assert value(text, "clusterhealth_gpu_performance_state") == 0


@pytest.mark.parametrize("state", ["library_missing", "driver_not_loaded"])
def test_nvml_unusable_fails_the_collector_only(scrape: Callable[..., str], state: str) -> None:
    text = scrape(scenario(nvml=state))
    assert value(text, "clusterhealth_scrape_collector_success", collector="gpu") == 0
    assert "clusterhealth_gpu_up" not in text
    assert value(text, "clusterhealth_build_info") == 1


@pytest.mark.parametrize("error", ["Uninitialized", "LibRmVersionMismatch"])
@pytest.mark.parametrize("call", ["nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPowerUsage"])
def test_a_library_level_error_on_one_gpu_call_fails_the_collector(
    scrape: Callable[..., str], call: str, error: str
) -> None:
    # The library itself is unusable (a driver upgraded under the agent): no GPU is exported as if
    # it were fine, the collector says it failed, and the next cycle starts NVML again.
    text = scrape(scenario(faults=[fault(1, errors={call: error})]))
    assert value(text, "clusterhealth_scrape_collector_success", collector="gpu") == 0
    assert "clusterhealth_gpu_up" not in text
    assert "clusterhealth_gpu_nvml_errors_total" not in text
    assert value(text, "clusterhealth_build_info") == 1


def test_the_directory_tells_a_gpu_that_never_answered_from_one_that_fell_later() -> None:
    directory = GpuDirectory()
    directory.learn([GpuReading(0, "GPU-a", True, pci_bus_id="00000000:1B:00.0"), GpuReading(1, "", False)])
    assert directory.never_answered() == {1}
    assert directory.bus_ids() == {"00000000:1B:00.0": 0}
    # GPU 0 falls off the bus later: it keeps what it told, and it did answer once.
    directory.learn(
        [GpuReading(0, "GPU-a", False), GpuReading(1, "GPU-b", True, pci_bus_id="00000000:43:00.0")]
    )
    assert directory.never_answered() == set()
    assert directory.bus_ids() == {"00000000:1B:00.0": 0, "00000000:43:00.0": 1}
