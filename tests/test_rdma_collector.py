"""RdmaCollector: exact samples from the fixture trees, SPEC names and labels, filters, NoData."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from clusterhealth.exporters import sysfs
from clusterhealth.exporters.base import Collector, FamilySelection, NoData
from clusterhealth.exporters.infiniband import PMA_COUNTER_BITS
from clusterhealth.exporters.rdma import ERROR_COUNTERS_DEFAULT, HW_COUNTERS_DEFAULT, RdmaCollector

from .conftest import CLUSTERHEALTH

FIXTURES = Path(__file__).parent / "fixtures" / "sysfs"
PROCFS = FIXTURES / "procfs-fixture" / "sys"
NODE_EXPORTER = FIXTURES / "node-exporter-fixture" / "sys"
CLUSTER = FIXTURES / "cluster-node" / "sys"

Key = tuple[str, tuple[tuple[str, str], ...]]

# SPEC.md, "RDMA and network": name -> label names.
SPEC_METRICS = {
    "clusterhealth_rdma_device_info": {"device", "board_id", "firmware_version", "hca_type", "node_guid"},
    "clusterhealth_rdma_port_info": {"device", "port", "link_layer", "netdev"},
    "clusterhealth_rdma_port_state_id": {"device", "port"},
    "clusterhealth_rdma_port_physical_state_id": {"device", "port"},
    "clusterhealth_rdma_port_rate_bytes_per_second": {"device", "port"},
    "clusterhealth_rdma_port_data_received_bytes_total": {"device", "port"},
    "clusterhealth_rdma_port_data_transmitted_bytes_total": {"device", "port"},
    "clusterhealth_rdma_port_packets_received_total": {"device", "port"},
    "clusterhealth_rdma_port_packets_transmitted_total": {"device", "port"},
    "clusterhealth_rdma_port_errors_total": {"device", "port", "counter"},
    "clusterhealth_rdma_port_xmit_wait_total": {"device", "port"},
    "clusterhealth_rdma_port_hw_events_total": {"device", "port", "counter"},
    "clusterhealth_netdev_mtu_bytes": {"interface"},
}
# This collector's own additions.
OWN_METRICS = {
    "clusterhealth_rdma_port_pma_saturated": {"device", "port", "counter"},
    "clusterhealth_rdma_port_pma_saturated_counters": {"device", "port"},
    "clusterhealth_rdma_device_pcie_link_generation": {"device"},
    "clusterhealth_rdma_device_pcie_link_generation_max": {"device"},
    "clusterhealth_rdma_device_pcie_link_width": {"device"},
    "clusterhealth_rdma_device_pcie_link_width_max": {"device"},
    **{
        name: {"device", "port"}
        for name in (
            "clusterhealth_rdma_port_unicast_packets_received_total",
            "clusterhealth_rdma_port_unicast_packets_transmitted_total",
            "clusterhealth_rdma_port_multicast_packets_received_total",
            "clusterhealth_rdma_port_multicast_packets_transmitted_total",
            "clusterhealth_rdma_port_legacy_data_received_bytes_total",
            "clusterhealth_rdma_port_legacy_data_transmitted_bytes_total",
            "clusterhealth_rdma_port_legacy_packets_received_total",
            "clusterhealth_rdma_port_legacy_packets_transmitted_total",
            "clusterhealth_rdma_port_legacy_unicast_packets_received_total",
            "clusterhealth_rdma_port_legacy_unicast_packets_transmitted_total",
            "clusterhealth_rdma_port_legacy_multicast_packets_received_total",
            "clusterhealth_rdma_port_legacy_multicast_packets_transmitted_total",
        )
    },
}


def scrape(collector: RdmaCollector) -> dict[Key, float]:
    """The collector's samples as Prometheus would read them off /metrics."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def key(name: str, **labels: str) -> Key:
    return name, tuple(sorted(labels.items()))


def sample_names(samples: dict[Key, float]) -> set[str]:
    return {name for name, _ in samples}


def label_values(samples: dict[Key, float], name: str, label: str) -> set[str]:
    return {dict(labels)[label] for sample, labels in samples if sample == name}


def test_it_is_a_collector() -> None:
    collector: Collector = RdmaCollector(CLUSTER)
    assert collector.name == "rdma"


def test_cluster_node_exact_samples() -> None:
    samples = scrape(RdmaCollector(CLUSTER))
    port = {"device": "mlx5_0", "port": "1"}
    expected = {
        key(
            "clusterhealth_rdma_device_info",
            device="mlx5_0",
            board_id="MT_0000000838",
            firmware_version="28.39.1002",
            hca_type="MT4129",
            node_guid="946d:ae03:00a1:b000",
        ): 1,
        key(
            "clusterhealth_rdma_device_info",
            device="irdma0",
            board_id="",
            firmware_version="1.71",
            hca_type="",
            node_guid="b696:91ff:fe4e:2a70",
        ): 1,
        key("clusterhealth_rdma_port_info", **port, link_layer="InfiniBand", netdev="ibp24s0"): 1,
        key(
            "clusterhealth_rdma_port_info",
            device="mlx5_9",
            port="1",
            link_layer="Ethernet",
            netdev="enp170s0f1np1",
        ): 1,
        key("clusterhealth_rdma_port_state_id", **port): 4,
        key("clusterhealth_rdma_port_physical_state_id", **port): 5,
        key("clusterhealth_rdma_port_rate_bytes_per_second", **port): 50e9,
        # port_rcv_data and port_xmit_data hold 4_098_215_576_004 and 4_127_339_901_732 4-byte words.
        key("clusterhealth_rdma_port_data_received_bytes_total", **port): 16_392_862_304_016,
        key("clusterhealth_rdma_port_data_transmitted_bytes_total", **port): 16_509_359_606_928,
        key("clusterhealth_rdma_port_packets_received_total", **port): 15_876_023_391,
        key("clusterhealth_rdma_port_packets_transmitted_total", **port): 15_902_447_810,
        key("clusterhealth_rdma_port_xmit_wait_total", **port): 1_826_304_775,
        key("clusterhealth_rdma_port_unicast_packets_received_total", **port): 15_876_019_180,
        key("clusterhealth_rdma_port_multicast_packets_transmitted_total", **port): 1028,
        key("clusterhealth_rdma_port_errors_total", **port, counter="symbol_error"): 0,
        key("clusterhealth_rdma_port_pma_saturated", **port, counter="symbol_error"): 0,
        key("clusterhealth_rdma_port_hw_events_total", **port, counter="rx_write_requests"): 918_227_301,
        key("clusterhealth_rdma_device_pcie_link_generation", device="mlx5_0"): 5,
        key("clusterhealth_rdma_device_pcie_link_width", device="mlx5_0"): 16,
        key("clusterhealth_netdev_mtu_bytes", interface="ibp24s0"): 4092,
        # the faults
        key("clusterhealth_rdma_port_state_id", device="mlx5_3", port="1"): 1,
        key("clusterhealth_rdma_port_physical_state_id", device="mlx5_3", port="1"): 2,
        key("clusterhealth_rdma_port_rate_bytes_per_second", device="mlx5_3", port="1"): 1.25e9,
        key("clusterhealth_rdma_port_errors_total", device="mlx5_3", port="1", counter="link_downed"): 2,
        key(
            "clusterhealth_rdma_port_errors_total", device="mlx5_3", port="1", counter="port_xmit_discards"
        ): 412,
        key("clusterhealth_rdma_device_pcie_link_width", device="mlx5_4"): 8,
        key("clusterhealth_rdma_device_pcie_link_width_max", device="mlx5_4"): 16,
        key("clusterhealth_rdma_port_errors_total", device="mlx5_5", port="1", counter="symbol_error"): 65535,
        key("clusterhealth_rdma_port_pma_saturated", device="mlx5_5", port="1", counter="symbol_error"): 1,
        key(
            "clusterhealth_rdma_port_errors_total", device="mlx5_5", port="1", counter="port_rcv_errors"
        ): 1187,
        key(
            "clusterhealth_rdma_port_hw_events_total", device="mlx5_8", port="1", counter="np_cnp_sent"
        ): 18_234_507,
        key(
            "clusterhealth_rdma_port_hw_events_total", device="mlx5_8", port="1", counter="rp_cnp_handled"
        ): 17_002_433,
        key(
            "clusterhealth_rdma_port_hw_events_total",
            device="mlx5_8",
            port="1",
            counter="np_ecn_marked_roce_packets",
        ): 19_876_647,
        key(
            "clusterhealth_rdma_port_hw_events_total", device="mlx5_9", port="1", counter="out_of_buffer"
        ): 1283,
        key("clusterhealth_netdev_mtu_bytes", interface="enp170s0f0np0"): 9000,
        key("clusterhealth_netdev_mtu_bytes", interface="enp170s0f1np1"): 1500,
        key(
            "clusterhealth_rdma_port_hw_events_total", device="irdma0", port="1", counter="ip4InOctets"
        ): 88_112_934_002,
        key("clusterhealth_rdma_device_pcie_link_generation", device="irdma0"): 4,
    }
    assert {k: samples.get(k) for k in expected} == expected

    firmware = {
        dict(labels)["device"]: dict(labels)["firmware_version"]
        for name, labels in samples
        if name.endswith("device_info")
    }
    assert firmware["mlx5_7"] == "28.36.1010"
    assert {v for d, v in firmware.items() if d.startswith("mlx5") and d != "mlx5_7"} == {"28.39.1002"}


def test_series_that_cannot_be_read_are_absent_not_zero() -> None:
    samples = scrape(RdmaCollector(CLUSTER))
    for device, counter in (("mlx5_2", "VL15_dropped"), ("mlx5_6", "symbol_error")):
        labels = {"device": device, "port": "1", "counter": counter}
        assert key("clusterhealth_rdma_port_errors_total", **labels) not in samples
        assert key("clusterhealth_rdma_port_pma_saturated", **labels) not in samples
        assert (
            key("clusterhealth_rdma_port_errors_total", device=device, port="1", counter="link_downed")
            in samples
        )
    # irdma has no counters/: no PMA series, but its identity, state, hw_counters and MTU.
    irdma = {(name, labels) for name, labels in samples if ("device", "irdma0") in labels}
    assert sample_names({k: 0 for k in irdma}) == {
        "clusterhealth_rdma_device_info",
        "clusterhealth_rdma_port_info",
        "clusterhealth_rdma_port_state_id",
        "clusterhealth_rdma_port_physical_state_id",
        "clusterhealth_rdma_port_rate_bytes_per_second",
        "clusterhealth_rdma_port_hw_events_total",
        "clusterhealth_rdma_device_pcie_link_generation",
        "clusterhealth_rdma_device_pcie_link_generation_max",
        "clusterhealth_rdma_device_pcie_link_width",
        "clusterhealth_rdma_device_pcie_link_width_max",
    }
    assert key("clusterhealth_netdev_mtu_bytes", interface="enp177s0f0") in samples


def test_no_pma_device_keeps_identity_state_and_rate() -> None:
    samples = scrape(RdmaCollector(NODE_EXPORTER))
    i40iw = {name for name, labels in samples if ("device", "i40iw0") in labels}
    assert i40iw == {
        "clusterhealth_rdma_device_info",
        "clusterhealth_rdma_port_info",
        "clusterhealth_rdma_port_state_id",
        "clusterhealth_rdma_port_physical_state_id",
        "clusterhealth_rdma_port_rate_bytes_per_second",
    }
    assert samples[key("clusterhealth_rdma_port_rate_bytes_per_second", device="i40iw0", port="1")] == 1.25e9


def test_node_exporter_tree_saturation_and_legacy_counters() -> None:
    samples = scrape(RdmaCollector(NODE_EXPORTER))
    port1 = {"device": "mlx4_0", "port": "1"}
    assert samples[key("clusterhealth_rdma_port_pma_saturated", **port1, counter="port_xmit_wait")] == 1
    assert samples[key("clusterhealth_rdma_port_xmit_wait_total", **port1)] == 4_294_967_295
    assert samples[key("clusterhealth_rdma_port_errors_total", **port1, counter="port_xmit_discards")] == 5
    assert samples[key("clusterhealth_rdma_port_errors_total", **port1, counter="port_rcv_discards")] == 0
    assert samples[key("clusterhealth_rdma_port_legacy_data_received_bytes_total", **port1)] == 18_527_668
    assert samples[key("clusterhealth_rdma_port_legacy_unicast_packets_transmitted_total", **port1)] == 61_239
    port2 = {"device": "mlx4_0", "port": "2"}
    assert samples[key("clusterhealth_rdma_port_data_received_bytes_total", **port2)] == 0
    assert samples[key("clusterhealth_rdma_port_legacy_data_received_bytes_total", **port2)] == 18_527_668
    # counters_ext/ present: the 32-bit counters/ data fields are watched for saturation too.
    assert samples[key("clusterhealth_rdma_port_pma_saturated", **port2, counter="port_rcv_data")] == 0


def test_metric_names_and_labels_follow_spec() -> None:
    samples = scrape(RdmaCollector(CLUSTER)) | scrape(RdmaCollector(NODE_EXPORTER))
    labels_by_name: dict[str, set[str]] = {}
    for name, labels in samples:
        labels_by_name.setdefault(name, set()).update(label for label, _ in labels)
    assert set(SPEC_METRICS) <= set(labels_by_name)
    assert labels_by_name == {name: labels for name, labels in (SPEC_METRICS | OWN_METRICS).items()}


def test_every_counters_file_is_exported() -> None:
    """Each readable counters/ file shows up as traffic, xmit_wait or an error series."""
    samples = scrape(RdmaCollector(CLUSTER))
    counters_dir = CLUSTER / "class" / "infiniband" / "mlx5_5" / "ports" / "1" / "counters"
    files = {path.name for path in counters_dir.iterdir()}
    errors = label_values(
        {k: v for k, v in samples.items() if ("device", "mlx5_5") in k[1]},
        "clusterhealth_rdma_port_errors_total",
        "counter",
    )
    traffic = {
        "port_xmit_data",
        "port_rcv_data",
        "port_xmit_packets",
        "port_rcv_packets",
        "port_xmit_wait",
        "unicast_xmit_packets",
        "unicast_rcv_packets",
        "multicast_xmit_packets",
        "multicast_rcv_packets",
    }
    assert errors == files - traffic
    assert len(errors) == 12


def test_an_unknown_counters_file_counts_as_an_error(tmp_path: Path) -> None:
    sysfs = copy_device(CLUSTER, tmp_path, "mlx5_0")
    (sysfs / "class/infiniband/mlx5_0/ports/1/counters/port_rcv_widget_errors").write_text("9\n")
    samples = scrape(RdmaCollector(sysfs))
    assert (
        samples[
            key(
                "clusterhealth_rdma_port_errors_total",
                device="mlx5_0",
                port="1",
                counter="port_rcv_widget_errors",
            )
        ]
        == 9
    )
    assert (
        key(
            "clusterhealth_rdma_port_pma_saturated",
            device="mlx5_0",
            port="1",
            counter="port_rcv_widget_errors",
        )
        not in samples
    )


def copy_device(source: Path, tmp_path: Path, name: str) -> Path:
    """A writable sys/ holding one device of `source`: its PCI function and class links."""
    target = tmp_path / "sys"
    link = source / "class" / "infiniband" / name
    function = (link / "device").resolve()
    shutil.copytree(function, target / function.relative_to(source.resolve()), symlinks=True)
    links = [
        Path("class") / "infiniband" / name,
        *(Path("class") / "net" / i.name for i in (function / "net").iterdir()),
    ]
    for relative in links:
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        (target / relative).symlink_to(os.readlink(source / relative))
    return target


@pytest.mark.parametrize(
    ("include", "exclude", "devices", "interfaces"),
    [
        ((), (), {"irdma0", *(f"mlx5_{i}" for i in range(10))}, 11),
        (("mlx5_8", "mlx5_9"), (), {"mlx5_8", "mlx5_9"}, 2),
        (("mlx5_*",), ("mlx5_[89]",), {f"mlx5_{i}" for i in range(8)}, 8),
        ((), ("mlx5_*",), {"irdma0"}, 1),
        (("mlx5_1?",), (), set(), 0),
        (("irdma*", "mlx5_0"), ("mlx5_0",), {"irdma0"}, 1),
    ],
)
def test_include_and_exclude_patterns(
    include: tuple[str, ...], exclude: tuple[str, ...], devices: set[str], interfaces: int
) -> None:
    samples = scrape(RdmaCollector(CLUSTER, include_devices=include, exclude_devices=exclude))
    assert label_values(samples, "clusterhealth_rdma_device_info", "device") == devices
    assert {dict(labels)["device"] for name, labels in samples if "device" in dict(labels)} == devices
    assert len(label_values(samples, "clusterhealth_netdev_mtu_bytes", "interface")) == interfaces


def test_no_class_infiniband_is_no_data(tmp_path: Path) -> None:
    (tmp_path / "class" / "net").mkdir(parents=True)
    with pytest.raises(NoData):
        RdmaCollector(tmp_path).collect()


def test_empty_class_infiniband_is_no_data(tmp_path: Path) -> None:
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    with pytest.raises(NoData):
        RdmaCollector(tmp_path).collect()


def test_every_collect_reads_sysfs_afresh(tmp_path: Path) -> None:
    sysfs = copy_device(CLUSTER, tmp_path, "mlx5_0")
    collector = RdmaCollector(sysfs)
    first = collector.collect()
    counter = sysfs / "class/infiniband/mlx5_0/ports/1/counters/symbol_error"
    counter.unlink()  # the copy's files are its own, but replace rather than write through
    counter.write_text("12\n")
    second = collector.collect()
    assert not {id(family) for family in first} & {id(family) for family in second}
    errors = key("clusterhealth_rdma_port_errors_total", device="mlx5_0", port="1", counter="symbol_error")
    assert scrape(collector)[errors] == 12


def test_exposition_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing: `make test` installs the Debian prometheus package"
    registry = CollectorRegistry()
    registry.register(RdmaCollector(CLUSTER))
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=generate_latest(registry),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
    assert not (result.stdout + result.stderr).strip(), (result.stdout + result.stderr).decode()


def test_procfs_tree_samples() -> None:
    samples = scrape(RdmaCollector(PROCFS))
    assert samples[key("clusterhealth_rdma_port_physical_state_id", device="mlx5_0", port="1")] == 4
    assert samples[key("clusterhealth_rdma_port_rate_bytes_per_second", device="mlx5_0", port="1")] == 3.125e9
    assert samples[key("clusterhealth_rdma_port_xmit_wait_total", device="mlx4_0", port="2")] == 3846
    assert (
        samples[
            key(
                "clusterhealth_rdma_port_hw_events_total", device="mlx5_0", port="1", counter="resp_cqe_error"
            )
        ]
        == 8109
    )
    assert (
        key("clusterhealth_rdma_port_hw_events_total", device="mlx5_0", port="1", counter="lifespan")
        not in samples
    )
    assert (
        samples[
            key(
                "clusterhealth_rdma_device_info",
                device="hfi1_0",
                board_id="HPE 100Gb 1-port OP101 QSFP28 x16 PCIe Gen3 with Intel Omni-Path Adapter",
                firmware_version="1.27.0",
                hca_type="",
                node_guid="",
            )
        ]
        == 1
    )
    assert "clusterhealth_netdev_mtu_bytes" not in sample_names(samples)


def test_a_counter_of_thousands_of_digits_costs_only_that_series(tmp_path: Path) -> None:
    """Issue 11: int() of it raised, and the collector lost every series."""
    sysfs = copy_device(CLUSTER, tmp_path, "mlx5_0")
    intact = scrape(RdmaCollector(sysfs))
    (sysfs / "class/infiniband/mlx5_0/ports/1/counters/symbol_error").write_text("9" * 5000 + "\n")
    (sysfs / "class/infiniband/mlx5_0/ports/1/hw_counters/out_of_buffer").write_text("-3\n")
    damaged = scrape(RdmaCollector(sysfs))
    lost = {
        key("clusterhealth_rdma_port_errors_total", device="mlx5_0", port="1", counter="symbol_error"),
        key("clusterhealth_rdma_port_pma_saturated", device="mlx5_0", port="1", counter="symbol_error"),
        key("clusterhealth_rdma_port_hw_events_total", device="mlx5_0", port="1", counter="out_of_buffer"),
    }
    assert lost <= set(intact)
    assert damaged == {k: v for k, v in intact.items() if k not in lost}


def test_no_class_infiniband_is_a_successful_run_without_series(tmp_path: Path) -> None:
    """node_exporter reports success 0 for its infiniband collector on such a node; this agent
    reports 1: missing hardware is not a failure, and CollectorFailing must not fire on every
    node without an HCA (README, "RDMA and network metrics")."""
    (tmp_path / "class" / "net").mkdir(parents=True)
    config = tmp_path / "config.yaml"
    config.write_text(
        "collectors: {gpu: {enabled: false}, kernel_log: {enabled: false}, audit: {enabled: false}}\n"
    )
    result = subprocess.run(
        [CLUSTERHEALTH, "scrape", "--config", str(config), "--sysfs-root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert 'clusterhealth_scrape_collector_success{collector="rdma"} 1.0' in result.stdout
    assert "clusterhealth_rdma_" not in result.stdout


def test_the_default_counters_are_the_curated_ones_and_all_is_every_file() -> None:
    curated = scrape(
        RdmaCollector(CLUSTER, error_counters=ERROR_COUNTERS_DEFAULT, hw_counters=HW_COUNTERS_DEFAULT)
    )
    every = scrape(RdmaCollector(CLUSTER, error_counters=["*"], hw_counters=["*"]))
    errors = "clusterhealth_rdma_port_errors_total"
    hw = "clusterhealth_rdma_port_hw_events_total"
    assert label_values(curated, errors, "counter") == set(ERROR_COUNTERS_DEFAULT)
    assert {"VL15_dropped", "port_rcv_constraint_errors"} <= label_values(every, errors, "counter")
    # An IB port has no RoCE congestion counters: what the curated list names and the port has.
    assert label_values(curated, hw, "counter") == set(HW_COUNTERS_DEFAULT)
    ib = {
        dict(labels)["counter"] for name, labels in curated if name == hw and ("device", "mlx5_0") in labels
    }
    assert ib == {"out_of_buffer", "local_ack_timeout_err"}
    assert len(label_values(every, hw, "counter")) > 50  # mlx5's and irdma's every file
    assert {k: v for k, v in every.items() if k[0] not in (errors, hw)} == {
        k: v for k, v in curated.items() if k[0] not in (errors, hw)
    }


def test_saturated_counters_are_one_series_per_port() -> None:
    samples = scrape(RdmaCollector(NODE_EXPORTER)) | scrape(RdmaCollector(CLUSTER))
    saturated = "clusterhealth_rdma_port_pma_saturated_counters"
    # mlx5_5's symbol_error sits at 65535; mlx4_0 port 1's port_xmit_wait at 2^32 - 1.
    assert samples[key(saturated, device="mlx5_5", port="1")] == 1
    assert samples[key(saturated, device="mlx4_0", port="1")] == 1
    assert samples[key(saturated, device="mlx5_0", port="1")] == 0
    assert samples[key(saturated, device="mlx4_0", port="2")] == 0
    # A port without counters/ (irdma) has no PMA counters to saturate.
    assert key(saturated, device="irdma0", port="1") not in samples


def test_every_counter_the_rules_and_dashboards_read_is_exported_by_default() -> None:
    root = Path(__file__).resolve().parent.parent
    texts = [(root / "deploy" / "prometheus" / "clusterhealth-rules.yaml").read_text()]
    texts += [path.read_text() for path in (root / "dashboards").glob("*.json")]
    read = {
        name
        for text in texts
        for match in re.findall(r'counter=~?\\?"([^"\\]+)\\?"', text)
        for name in match.split("|")
    }
    assert {"symbol_error", "link_downed", "np_cnp_sent", "out_of_buffer"} <= read
    assert read <= set(ERROR_COUNTERS_DEFAULT) | set(HW_COUNTERS_DEFAULT)


@pytest.mark.parametrize(
    ("collectors", "has", "lacks"),
    [
        (
            {},
            {
                "clusterhealth_rdma_port_pma_saturated_counters",
                "clusterhealth_rdma_port_data_received_bytes_total",
            },
            {"clusterhealth_rdma_port_pma_saturated", "clusterhealth_rdma_port_packets_received_total"},
        ),
        (
            {"rdma": {"include_metrics": ["*"]}},
            {
                "clusterhealth_rdma_port_pma_saturated",
                "clusterhealth_rdma_port_unicast_packets_received_total",
            },
            set(),
        ),
        (
            {"rdma": {"include_metrics": ["*"], "exclude_metrics": ["clusterhealth_rdma_port_*_packets_*"]}},
            {"clusterhealth_rdma_port_packets_received_total"},
            {"clusterhealth_rdma_port_unicast_packets_received_total"},
        ),
    ],
)
def test_opt_in_families_are_exported_on_request(
    tmp_path: Path, collectors: dict[str, object], has: set[str], lacks: set[str]
) -> None:
    config = tmp_path / "config.yaml"
    off = {"enabled": False}
    config.write_text(
        yaml.safe_dump({"collectors": {"gpu": off, "kernel_log": off, "audit": off, **collectors}})
    )
    result = subprocess.run(
        [CLUSTERHEALTH, "scrape", "--config", str(config), "--sysfs-root", str(CLUSTER)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    names = {family.name for family in text_string_to_metric_families(result.stdout)}
    names |= {name + "_total" for name in names}
    assert has <= names and not lacks & names, (has - names, lacks & names)


def test_the_collector_reads_only_what_its_exported_families_need(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the defaults, the packet counters (opt-in families) and the hw_counters/ files beyond the
    five are never opened; the saturation count still watches every fixed-width PMA counter."""
    opened: list[str] = []

    def recording_open(file: str | bytes, flags: int, dir_fd: int | None = None) -> int:
        name = os.fsdecode(file)
        opened.append(name if dir_fd is None else f"{os.readlink(f'/proc/self/fd/{dir_fd}')}/{name}")
        return os.open(file, flags, dir_fd=dir_fd)

    monkeypatch.setattr(sysfs, "_open", recording_open)
    defaults = FamilySelection(RdmaCollector.opt_in)
    curated = RdmaCollector(
        CLUSTER, error_counters=ERROR_COUNTERS_DEFAULT, hw_counters=HW_COUNTERS_DEFAULT, families=defaults
    )
    samples = scrape(curated)
    read = {os.path.basename(path) for path in opened if "counters/" in path}
    assert read <= set(PMA_COUNTER_BITS) | {"port_rcv_data", "port_xmit_data"} | set(HW_COUNTERS_DEFAULT)
    assert {"VL15_dropped", "port_rcv_data", "np_cnp_sent"} <= read
    assert not {"port_rcv_packets", "unicast_rcv_packets", "rx_write_requests"} & read
    assert samples[key("clusterhealth_rdma_port_pma_saturated_counters", device="mlx5_5", port="1")] == 1
    assert "clusterhealth_rdma_port_packets_received_total" not in sample_names(samples)
    # Asked for, an opt-in family is read and exported.
    opened.clear()
    every = scrape(RdmaCollector(CLUSTER, families=FamilySelection(RdmaCollector.opt_in, ("*",))))
    assert "port_rcv_packets" in {os.path.basename(path) for path in opened}
    assert "clusterhealth_rdma_port_packets_received_total" in sample_names(every)
