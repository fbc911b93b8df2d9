"""Cross-check against node_exporter: the same sysfs tree must give the same numbers.

The real Debian `prometheus-node-exporter` (1.5.0; `make test` installs it) runs as a subprocess
on each tree with only its infiniband and netclass collectors, and is scraped over HTTP on
loopback. Every value both export must be equal. node_exporter 1.5.0 gives up its whole
infiniband collector on a device without `board_id` or `counters/` (irdma: "no data") and on an
empty counter file (a parse error), so on cluster-node the test also asserts exactly that, and
compares the counters on copies without those two. The recorded outputs that came with the
third-party trees are compared too, so the check runs even where the binary is absent.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from clusterhealth.exporters.rdma import RdmaCollector

from .conftest import require_tool
from .prom import free_port

FIXTURES = Path(__file__).parent / "fixtures" / "sysfs"
CLUSTER = FIXTURES / "cluster-node" / "sys"
UPSTREAM_TREES = ("procfs-fixture", "node-exporter-fixture")

Labels = tuple[tuple[str, str], ...]
Key = tuple[str, Labels]

# node_infiniband_<name> -> (our metric, value of our `counter` label or None).
COUNTERPARTS: dict[str, tuple[str, str | None]] = {
    "state_id": ("clusterhealth_rdma_port_state_id", None),
    "physical_state_id": ("clusterhealth_rdma_port_physical_state_id", None),
    "rate_bytes_per_second": ("clusterhealth_rdma_port_rate_bytes_per_second", None),
    "port_data_received_bytes_total": ("clusterhealth_rdma_port_data_received_bytes_total", None),
    "port_data_transmitted_bytes_total": ("clusterhealth_rdma_port_data_transmitted_bytes_total", None),
    "port_packets_received_total": ("clusterhealth_rdma_port_packets_received_total", None),
    "port_packets_transmitted_total": ("clusterhealth_rdma_port_packets_transmitted_total", None),
    "port_transmit_wait_total": ("clusterhealth_rdma_port_xmit_wait_total", None),
    "unicast_packets_received_total": ("clusterhealth_rdma_port_unicast_packets_received_total", None),
    "unicast_packets_transmitted_total": ("clusterhealth_rdma_port_unicast_packets_transmitted_total", None),
    "multicast_packets_received_total": ("clusterhealth_rdma_port_multicast_packets_received_total", None),
    "multicast_packets_transmitted_total": (
        "clusterhealth_rdma_port_multicast_packets_transmitted_total",
        None,
    ),
    "legacy_data_received_bytes_total": ("clusterhealth_rdma_port_legacy_data_received_bytes_total", None),
    "legacy_data_transmitted_bytes_total": (
        "clusterhealth_rdma_port_legacy_data_transmitted_bytes_total",
        None,
    ),
    "legacy_packets_received_total": ("clusterhealth_rdma_port_legacy_packets_received_total", None),
    "legacy_packets_transmitted_total": ("clusterhealth_rdma_port_legacy_packets_transmitted_total", None),
    "legacy_unicast_packets_received_total": (
        "clusterhealth_rdma_port_legacy_unicast_packets_received_total",
        None,
    ),
    "legacy_unicast_packets_transmitted_total": (
        "clusterhealth_rdma_port_legacy_unicast_packets_transmitted_total",
        None,
    ),
    "legacy_multicast_packets_received_total": (
        "clusterhealth_rdma_port_legacy_multicast_packets_received_total",
        None,
    ),
    "legacy_multicast_packets_transmitted_total": (
        "clusterhealth_rdma_port_legacy_multicast_packets_transmitted_total",
        None,
    ),
    "symbol_error_total": ("clusterhealth_rdma_port_errors_total", "symbol_error"),
    "link_error_recovery_total": ("clusterhealth_rdma_port_errors_total", "link_error_recovery"),
    "link_downed_total": ("clusterhealth_rdma_port_errors_total", "link_downed"),
    "port_errors_received_total": ("clusterhealth_rdma_port_errors_total", "port_rcv_errors"),
    "port_receive_remote_physical_errors_total": (
        "clusterhealth_rdma_port_errors_total",
        "port_rcv_remote_physical_errors",
    ),
    "port_receive_switch_relay_errors_total": (
        "clusterhealth_rdma_port_errors_total",
        "port_rcv_switch_relay_errors",
    ),
    "port_discards_transmitted_total": ("clusterhealth_rdma_port_errors_total", "port_xmit_discards"),
    "port_discards_received_total": ("clusterhealth_rdma_port_errors_total", "port_rcv_discards"),
    "port_constraint_errors_transmitted_total": (
        "clusterhealth_rdma_port_errors_total",
        "port_xmit_constraint_errors",
    ),
    "port_constraint_errors_received_total": (
        "clusterhealth_rdma_port_errors_total",
        "port_rcv_constraint_errors",
    ),
    "local_link_integrity_errors_total": (
        "clusterhealth_rdma_port_errors_total",
        "local_link_integrity_errors",
    ),
    "excessive_buffer_overrun_errors_total": (
        "clusterhealth_rdma_port_errors_total",
        "excessive_buffer_overrun_errors",
    ),
    "vl15_dropped_total": ("clusterhealth_rdma_port_errors_total", "VL15_dropped"),
}
COMPARED = {ours for ours, _ in COUNTERPARTS.values()}


def parse(text: str) -> dict[Key, float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def ours(sysfs: Path) -> dict[Key, float]:
    registry = CollectorRegistry()
    registry.register(RdmaCollector(sysfs))
    return parse(generate_latest(registry).decode())


def translate(node_exporter: dict[Key, float]) -> dict[Key, float]:
    """node_exporter's infiniband port series under our names and labels."""
    translated: dict[Key, float] = {}
    unknown = set()
    for (name, labels), value in node_exporter.items():
        if not name.startswith("node_infiniband_") or name == "node_infiniband_info":
            continue
        short = name.removeprefix("node_infiniband_")
        if short not in COUNTERPARTS:
            unknown.add(short)
            continue
        our_name, counter = COUNTERPARTS[short]
        our_labels = dict(labels) | ({"counter": counter} if counter else {})
        translated[(our_name, tuple(sorted(our_labels.items())))] = value
    assert not unknown, f"node_exporter series without a counterpart here: {sorted(unknown)}"
    return translated


def identities(samples: dict[Key, float], name: str) -> set[tuple[str, str, str, str]]:
    return {
        (d["device"], d["board_id"], d["firmware_version"], d["hca_type"])
        for d in (dict(labels) for sample, labels in samples if sample == name)
    }


def assert_agrees(node_exporter: dict[Key, float], mine: dict[Key, float]) -> None:
    """Same port series, same values; same device identities; same MTU for our interfaces."""
    comparable = {k: v for k, v in mine.items() if k[0] in COMPARED}
    assert translate(node_exporter) == comparable
    assert identities(node_exporter, "node_infiniband_info") == identities(
        mine, "clusterhealth_rdma_device_info"
    )
    assert_same_mtu(node_exporter, mine)


def assert_same_mtu(node_exporter: dict[Key, float], mine: dict[Key, float]) -> None:
    our_mtu = {
        dict(labels)["interface"]: v
        for (name, labels), v in mine.items()
        if name == "clusterhealth_netdev_mtu_bytes"
    }
    their_mtu = {
        dict(labels)["device"]: v
        for (name, labels), v in node_exporter.items()
        if name == "node_network_mtu_bytes"
    }
    assert our_mtu == {interface: their_mtu.get(interface) for interface in our_mtu}


def success(node_exporter: dict[Key, float], collector: str) -> float:
    return node_exporter[("node_scrape_collector_success", (("collector", collector),))]


def infiniband_series(samples: dict[Key, float]) -> set[str]:
    return {name for name, _ in samples if name.startswith("node_infiniband_")}


# --- node_exporter as a subprocess -----------------------------------------------------------


@dataclass(frozen=True)
class Scrape:
    samples: dict[Key, float]
    log: str


@pytest.fixture(scope="module")
def node_exporter() -> str:
    return require_tool("prometheus-node-exporter")


RunNodeExporter = Callable[[Path], Scrape]


@pytest.fixture
def run_node_exporter(node_exporter: str, tmp_path: Path) -> RunNodeExporter:
    def run(sysfs: Path) -> Scrape:
        # The port is free when picked but could be taken before node_exporter binds it: retry.
        for attempt in range(3):
            log_path = tmp_path / f"node_exporter.{attempt}.log"
            text = serve_and_scrape(node_exporter, sysfs, log_path)
            if text is not None:
                return Scrape(parse(text), log_path.read_text())
        pytest.fail(f"node_exporter served no /metrics; its log:\n{log_path.read_text()}")

    return run


def serve_and_scrape(binary: str, sysfs: Path, log_path: Path) -> str | None:
    port = free_port()
    command = [
        binary,
        f"--path.sysfs={sysfs}",
        "--collector.disable-defaults",
        "--collector.infiniband",
        "--collector.netclass",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=debug",
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return wait_for_metrics(process, f"http://127.0.0.1:{port}/metrics")
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def wait_for_metrics(process: subprocess.Popen[bytes], url: str, timeout: float = 20.0) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return None
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body: bytes = response.read()
                return body.decode()
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.05)
    return None


@pytest.fixture(scope="module")
def cluster_variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """cluster-node without irdma0, then also without mlx5_6's empty symbol_error file."""
    root = tmp_path_factory.mktemp("cluster-node")
    without_irdma = root / "without-irdma" / "sys"
    shutil.copytree(CLUSTER, without_irdma, symlinks=True)
    (without_irdma / "class" / "infiniband" / "irdma0").unlink()
    readable = root / "readable" / "sys"
    shutil.copytree(without_irdma, readable, symlinks=True)
    (readable / "class" / "infiniband" / "mlx5_6" / "ports" / "1" / "counters" / "symbol_error").unlink()
    return {"without-irdma": without_irdma, "readable": readable}


# --- the checks ------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", UPSTREAM_TREES)
def test_agrees_with_node_exporter_on_upstream_trees(tree: str, run_node_exporter: RunNodeExporter) -> None:
    scrape = run_node_exporter(FIXTURES / tree / "sys")
    assert success(scrape.samples, "infiniband") == 1
    assert success(scrape.samples, "netclass") == 1
    assert_agrees(scrape.samples, ours(FIXTURES / tree / "sys"))


@pytest.mark.parametrize("tree", UPSTREAM_TREES)
def test_agrees_with_node_exporter_output_recorded_with_the_tree(tree: str) -> None:
    recorded = parse((FIXTURES / tree / "node_exporter_metrics.txt").read_text())
    assert_agrees(recorded, ours(FIXTURES / tree / "sys"))


def test_node_exporter_gives_up_on_cluster_node_where_we_do_not(run_node_exporter: RunNodeExporter) -> None:
    scrape = run_node_exporter(CLUSTER)
    # irdma0 has no board_id and no counters/: node_exporter 1.5.0 calls the collector "no data".
    assert success(scrape.samples, "infiniband") == 0
    assert 'msg="collector returned no data" name=infiniband' in scrape.log
    assert infiniband_series(scrape.samples) == set()
    assert success(scrape.samples, "netclass") == 1
    mine = ours(CLUSTER)
    assert_same_mtu(scrape.samples, mine)
    assert len([name for name, _ in mine if name == "clusterhealth_netdev_mtu_bytes"]) == 11


def test_node_exporter_fails_on_an_empty_counter_file(
    run_node_exporter: RunNodeExporter, cluster_variants: dict[str, Path]
) -> None:
    scrape = run_node_exporter(cluster_variants["without-irdma"])
    assert success(scrape.samples, "infiniband") == 0
    assert 'msg="collector failed" name=infiniband' in scrape.log
    assert 'strconv.ParseUint: parsing \\"\\": invalid syntax' in scrape.log
    assert infiniband_series(scrape.samples) == set()


def test_agrees_with_node_exporter_on_cluster_node(
    run_node_exporter: RunNodeExporter, cluster_variants: dict[str, Path]
) -> None:
    scrape = run_node_exporter(cluster_variants["readable"])
    assert success(scrape.samples, "infiniband") == 1
    mine = ours(cluster_variants["readable"])
    assert_agrees(scrape.samples, mine)
    # 10 ports × (state, phys_state, rate, 9 traffic, 12 error series), less VL15_dropped of mlx5_2
    # (N/A (no PMA)) and symbol_error of mlx5_6 (removed here, empty in the committed tree).
    assert len(translate(scrape.samples)) == 10 * 24 - 2


def test_cluster_node_differs_from_the_checked_copy_only_by_irdma0(cluster_variants: dict[str, Path]) -> None:
    # An empty file and an absent one read the same here, so on the committed tree we export
    # exactly what node_exporter agreed with, plus the device it cannot read.
    committed = ours(CLUSTER)
    without_irdma0 = {k: v for k, v in committed.items() if ("device", "irdma0") not in k[1]}
    assert without_irdma0 != committed
    irdma_mtu = ("clusterhealth_netdev_mtu_bytes", (("interface", "enp177s0f0"),))
    assert without_irdma0 | {irdma_mtu: committed[irdma_mtu]} == ours(cluster_variants["readable"]) | {
        irdma_mtu: committed[irdma_mtu]
    }
