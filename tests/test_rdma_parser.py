"""exporters/infiniband.py on real and generated sysfs trees, and on trees broken on purpose."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from clusterhealth.exporters import infiniband, sysfs
from clusterhealth.exporters.infiniband import (
    LegacyCounters,
    Netdev,
    PciLink,
    RdmaDevice,
    RdmaPort,
    SkippedFile,
    parse_pcie_generation,
    parse_pcie_width,
    parse_rate,
    parse_state,
    read_rdma_devices,
)
from clusterhealth.exporters.sim import sysfs as sim_sysfs
from clusterhealth.exporters.sysfs import ReadCache

FIXTURES = Path(__file__).parent / "fixtures" / "sysfs"
PROCFS = FIXTURES / "procfs-fixture" / "sys"
NODE_EXPORTER = FIXTURES / "node-exporter-fixture" / "sys"
CLUSTER = FIXTURES / "cluster-node" / "sys"


def by_name(sysfs: Path) -> dict[str, RdmaDevice]:
    return {device.name: device for device in read_rdma_devices(sysfs)}


def only_port(device: RdmaDevice) -> RdmaPort:
    (port,) = device.ports
    return port


def copy_devices(source: Path, tmp_path: Path, *names: str) -> Path:
    """A writable sys/ with only these devices of `source`: their PCI functions and class links.

    Copying a whole tree costs about a second here (952 files); a device's function is ~100.
    """
    target = tmp_path / "sys"
    for name in names:
        link = source / "class" / "infiniband" / name
        function = (link / "device").resolve()
        shutil.copytree(function, target / function.relative_to(source.resolve()), symlinks=True)
        copy_link(source, target, Path("class") / "infiniband" / name)
        for interface in (function / "net").iterdir():
            copy_link(source, target, Path("class") / "net" / interface.name)
    return target


def copy_link(source: Path, target: Path, relative: Path) -> None:
    (target / relative).parent.mkdir(parents=True, exist_ok=True)
    (target / relative).symlink_to(os.readlink(source / relative))


# --- the kernel's text formats -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4: ACTIVE\n", (4, "ACTIVE")),
        ("1: DOWN", (1, "DOWN")),
        ("5: LinkUp", (5, "LinkUp")),
        ("7: Phy Test", (7, "Phy Test")),
        ("9: <unknown>", (9, "<unknown>")),
        ("ACTIVE", None),
        ("", None),
        ("-1: DOWN", None),
    ],
)
def test_parse_state(text: str, expected: tuple[int, str] | None) -> None:
    assert parse_state(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400 Gb/sec (4X NDR)\n", (50_000_000_000, 4, "NDR")),
        ("200 Gb/sec (4X HDR)", (25_000_000_000, 4, "HDR")),
        ("100 Gb/sec (4X EDR)", (12_500_000_000, 4, "EDR")),
        ("56 Gb/sec (4X FDR)", (7_000_000_000, 4, "FDR")),
        ("40 Gb/sec (4X QDR)", (5_000_000_000, 4, "QDR")),
        ("25 Gb/sec (1X EDR)", (3_125_000_000, 1, "EDR")),
        ("2.5 Gb/sec (1X SDR)", (312_500_000, 1, "SDR")),
        ("10 Gb/sec (4X SDR)", (1_250_000_000, 4, "SDR")),
        ("10 Gb/sec (4X)", (1_250_000_000, 4, None)),  # SDR on older kernels
        ("800 Gb/sec (8X NDR)", (100_000_000_000, 8, "NDR")),
        ("fast", None),
        ("400 Mb/sec", None),
    ],
)
def test_parse_rate(text: str, expected: tuple[int, int | None, str | None] | None) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    ("text", "generation"),
    [
        ("2.5 GT/s PCIe", 1),
        ("5.0 GT/s PCIe", 2),
        ("8.0 GT/s PCIe", 3),
        ("16.0 GT/s PCIe\n", 4),
        ("32.0 GT/s PCIe", 5),
        ("64.0 GT/s PCIe", 6),
        ("8 GT/s", 3),  # older kernels
        ("5 GT/s", 2),
        ("Unknown", None),
        ("Unknown speed", None),
        ("12.0 GT/s PCIe", None),
    ],
)
def test_parse_pcie_generation(text: str, generation: int | None) -> None:
    assert parse_pcie_generation(text) == generation


@pytest.mark.parametrize(("text", "width"), [("16", 16), ("8\n", 8), ("x4", 4), ("0", None), ("wide", None)])
def test_parse_pcie_width(text: str, width: int | None) -> None:
    assert parse_pcie_width(text) == width


# --- procfs's tree ---------------------------------------------------------------------------


def test_procfs_tree_devices_and_identity() -> None:
    devices = by_name(PROCFS)
    assert list(devices) == ["hfi1_0", "mlx4_0", "mlx5_0"]
    hfi = devices["hfi1_0"]
    assert hfi.board_id == "HPE 100Gb 1-port OP101 QSFP28 x16 PCIe Gen3 with Intel Omni-Path Adapter"
    assert (hfi.firmware_version, hfi.hca_type, hfi.node_guid) == ("1.27.0", None, None)
    assert (devices["mlx4_0"].hca_type, devices["mlx4_0"].node_guid) == ("MT4099", None)
    assert devices["mlx5_0"].node_guid == "0a7f:bc12:45ef:d23b"
    # No device links in this tree: no PCIe link and no netdev, and eth0 is not taken for one.
    assert all(d.pci is None and d.netdevs == () for d in devices.values())
    assert all(d.skipped == () for d in devices.values())


def test_procfs_tree_port_values() -> None:
    devices = by_name(PROCFS)
    mlx5 = only_port(devices["mlx5_0"])
    assert (mlx5.state_id, mlx5.state, mlx5.physical_state_id, mlx5.physical_state) == (
        4,
        "ACTIVE",
        4,
        "ACTIVE",
    )
    assert (mlx5.rate_bytes_per_second, mlx5.rate_lanes, mlx5.rate_speed) == (3_125_000_000, 1, "EDR")
    assert mlx5.link_layer == "InfiniBand"
    assert mlx5.counters is not None
    assert mlx5.counters.port_rcv_data_bytes == 72_505_381_512  # port_rcv_data 18_126_345_378 words
    assert mlx5.counters.port_xmit_data_bytes == 11_523_046_035_392  # port_xmit_data 2_880_761_508_848 words
    assert mlx5.counters.unicast_xmit_packets == 10_907_922_116
    # lifespan is the kernel's cache period, not a counter.
    assert "lifespan" not in mlx5.hw_counters
    assert mlx5.hw_counters_lifespan_ms == 10
    assert len(mlx5.hw_counters) == 24
    assert (mlx5.hw_counters["req_cqe_error"], mlx5.hw_counters["rx_read_requests"]) == (3481, 175_528_982)

    mlx4_ports = devices["mlx4_0"].ports
    assert [p.number for p in mlx4_ports] == [1, 2]
    assert [p.counters.port_xmit_wait for p in mlx4_ports if p.counters] == [3599, 3846]
    assert [p.legacy_counters for p in mlx4_ports] == [None, None]
    assert not any(any(p.pinned_at_max.values()) for p in mlx4_ports)


# --- node_exporter's tree --------------------------------------------------------------------


def test_no_pma_counters_are_left_out_but_the_port_is_kept() -> None:
    i40iw = by_name(NODE_EXPORTER)["i40iw0"]
    port = only_port(i40iw)
    assert port.counters is not None and port.counters.by_file() == {}
    assert port.pinned_at_max == {}
    assert (port.state_id, port.physical_state_id) == (4, 5)
    assert (port.rate_bytes_per_second, port.rate_lanes, port.rate_speed) == (1_250_000_000, 4, None)
    assert len(i40iw.skipped) == 17
    assert {s.reason for s in i40iw.skipped} == {"N/A (no PMA)"}
    assert SkippedFile("i40iw0/ports/1/counters/port_xmit_data", "N/A (no PMA)") in i40iw.skipped


def test_legacy_counters_and_32_bit_saturation() -> None:
    port1, port2 = by_name(NODE_EXPORTER)["mlx4_0"].ports
    assert port1.counters is not None
    assert port1.counters.port_xmit_discards == 5
    assert port1.counters.port_rcv_discards == 0
    assert port1.counters.port_xmit_wait == 4_294_967_295
    assert port1.pinned_at_max["port_xmit_wait"] is True
    assert port1.legacy_counters == LegacyCounters(
        port_xmit_data_bytes=14_933_760,  # 3_733_440 words
        port_rcv_data_bytes=18_527_668,  # 4_631_917 words
        port_xmit_packets=0,
        port_rcv_packets=0,
        unicast_xmit_packets=61_239,
        unicast_rcv_packets=61_148,
        multicast_xmit_packets=16,
        multicast_rcv_packets=93,
    )
    # With counters_ext/ present, counters/ holds the 32-bit PortCounters data fields.
    assert port2.counters is not None
    assert sorted(port2.counters.by_file()) == [
        "link_downed",
        "link_error_recovery",
        "multicast_rcv_packets",
        "multicast_xmit_packets",
        "port_rcv_data",
        "port_xmit_data",
        "unicast_rcv_packets",
        "unicast_xmit_packets",
    ]
    assert port2.pinned_at_max == {
        "link_error_recovery": False,
        "link_downed": False,
        "port_xmit_data": False,
        "port_rcv_data": False,
    }


def test_interfaces_that_are_files_or_unrelated_are_ignored() -> None:
    # class/net/bonding_masters is a file; eth0 and the bonds share no PCI function with an HCA.
    assert all(d.netdevs == () and d.pci is None for d in read_rdma_devices(NODE_EXPORTER))


# --- the generated DGX-like tree -------------------------------------------------------------


def test_cluster_node_devices_in_natural_order() -> None:
    assert [d.name for d in read_rdma_devices(CLUSTER)] == ["irdma0", *(f"mlx5_{i}" for i in range(10))]


def test_cluster_node_healthy_hca() -> None:
    mlx5_0 = by_name(CLUSTER)["mlx5_0"]
    assert mlx5_0.firmware_version == "28.39.1002"
    assert (mlx5_0.board_id, mlx5_0.hca_type, mlx5_0.node_guid) == (
        "MT_0000000838",
        "MT4129",
        "946d:ae03:00a1:b000",
    )
    assert mlx5_0.pci == PciLink("0000:18:00.0", generation=5, generation_max=5, width=16, width_max=16)
    assert mlx5_0.netdevs == (Netdev("ibp24s0", 4092),)
    assert mlx5_0.skipped == ()
    port = only_port(mlx5_0)
    assert (port.state_id, port.physical_state_id, port.rate_bytes_per_second) == (4, 5, 50_000_000_000)
    assert (port.link_layer, port.netdev, port.gid_netdevs) == ("InfiniBand", "ibp24s0", ())
    assert port.counters is not None
    assert port.counters.port_xmit_data_bytes == 16_509_359_606_928  # 4_127_339_901_732 words
    assert port.counters.port_xmit_wait == 1_826_304_775
    assert len(port.counters.by_file()) == 21
    assert set(port.pinned_at_max) == set(infiniband.PMA_COUNTER_BITS)
    assert len(port.hw_counters) == 24


def test_cluster_node_faults() -> None:
    devices = by_name(CLUSTER)

    no_pma = only_port(devices["mlx5_2"])
    assert no_pma.counters is not None and no_pma.counters.vl15_dropped is None
    assert devices["mlx5_2"].skipped == (SkippedFile("mlx5_2/ports/1/counters/VL15_dropped", "N/A (no PMA)"),)

    down = only_port(devices["mlx5_3"])
    assert (down.state_id, down.state, down.physical_state_id, down.physical_state) == (
        1,
        "DOWN",
        2,
        "Polling",
    )
    assert (down.rate_bytes_per_second, down.rate_speed) == (1_250_000_000, "SDR")
    assert down.counters is not None
    assert (down.counters.link_downed, down.counters.port_xmit_discards) == (2, 412)

    assert devices["mlx5_4"].pci == PciLink(
        "0000:9a:00.0", generation=5, generation_max=5, width=8, width_max=16
    )

    flapping = only_port(devices["mlx5_5"])
    assert flapping.counters is not None and flapping.counters.symbol_error == 65_535
    assert [file for file, pinned in flapping.pinned_at_max.items() if pinned] == ["symbol_error"]
    assert flapping.pinned_at_max["local_link_integrity_errors"] is False  # 7 of 15

    empty = only_port(devices["mlx5_6"])
    assert empty.counters is not None and empty.counters.symbol_error is None
    assert "symbol_error" not in empty.pinned_at_max
    assert devices["mlx5_6"].skipped == (SkippedFile("mlx5_6/ports/1/counters/symbol_error", "empty"),)

    firmware = {name: d.firmware_version for name, d in devices.items() if name.startswith("mlx5")}
    assert [name for name, version in firmware.items() if version != "28.39.1002"] == ["mlx5_7"]
    assert firmware["mlx5_7"] == "28.36.1010"


def test_cluster_node_roce_ports() -> None:
    devices = by_name(CLUSTER)
    for name, netdev, mtu in (("mlx5_8", "enp170s0f0np0", 9000), ("mlx5_9", "enp170s0f1np1", 1500)):
        port = only_port(devices[name])
        assert (port.link_layer, port.netdev, port.gid_netdevs) == ("Ethernet", netdev, (netdev,))
        assert devices[name].netdevs == (Netdev(netdev, mtu),)
        assert port.rate_bytes_per_second == 25_000_000_000
    hw8, hw9 = (only_port(devices[name]).hw_counters for name in ("mlx5_8", "mlx5_9"))
    assert (hw8["np_cnp_sent"], hw8["rp_cnp_handled"], hw8["np_ecn_marked_roce_packets"]) == (
        18_234_507,
        17_002_433,
        19_876_647,
    )
    assert (hw8["out_of_buffer"], hw9["out_of_buffer"]) == (0, 1283)


def test_cluster_node_device_without_counters() -> None:
    irdma = by_name(CLUSTER)["irdma0"]
    assert (irdma.board_id, irdma.hca_type, irdma.firmware_version) == (None, None, "1.71")
    assert irdma.pci == PciLink("0000:b1:00.0", generation=4, generation_max=4, width=16, width_max=16)
    port = only_port(irdma)
    assert (port.counters, port.legacy_counters, port.pinned_at_max) == (None, None, {})
    assert len(port.hw_counters) == 46
    assert port.hw_counters["ip4InOctets"] == 88_112_934_002
    assert (port.netdev, port.rate_bytes_per_second) == ("enp177s0f0", 12_500_000_000)
    assert irdma.skipped == ()


def test_non_rdma_interfaces_are_not_netdevs_of_any_device() -> None:
    names = {n.name for d in read_rdma_devices(CLUSTER) for n in d.netdevs}
    assert "lo" not in names and "eno3" not in names
    assert len(names) == 11


def test_committed_cluster_node_tree_is_what_the_simulator_writes(tmp_path: Path) -> None:
    sim_sysfs.build(tmp_path / "sys")
    assert tree(tmp_path / "sys") == tree(CLUSTER)


def tree(root: Path) -> dict[str, str]:
    """Every entry under root: a symlink's target, a file's content."""
    entries = {}
    for path in sorted(root.rglob("*")):
        relative = str(path.relative_to(root))
        if path.is_symlink():
            entries[relative] = "-> " + os.readlink(path)
        elif path.is_file():
            entries[relative] = path.read_text()
    return entries


@pytest.mark.parametrize(
    "link",
    [
        NODE_EXPORTER / "class" / "net" / "eth0",
        PROCFS / "class" / "net" / "eth0" / "device",
        CLUSTER / "class" / "infiniband" / "mlx5_0",
        CLUSTER / "class" / "infiniband" / "mlx5_0" / "device",
        CLUSTER / "class" / "net" / "ibp24s0" / "device",
    ],
    ids=lambda path: str(path.relative_to(FIXTURES)),
)
def test_fixture_symlinks_survived(link: Path) -> None:
    assert link.is_symlink() and link.resolve().is_dir()


# --- broken files ----------------------------------------------------------------------------

COUNTER = "class/infiniband/mlx5_0/ports/1/counters/port_rcv_errors"


def break_file(path: Path, how: str) -> None:
    if how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "dangling symlink":
        path.unlink()
        path.symlink_to("nowhere")
    elif how == "binary":
        path.write_bytes(b"\x00\xff\xfe")
    else:
        path.write_text(how)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("", "empty"),
        ("\n", "empty"),
        ("N/A (no PMA)\n", "N/A (no PMA)"),
        ("garbage\n", "not a counter: 'garbage'"),
        ("-1\n", "not a counter: '-1'"),
        ("12 34\n", "not a counter: '12 34'"),
        ("0x10\n", "not a counter: '0x10'"),
        ("binary", "not a counter: '\\x00��'"),
        ("directory", "EISDIR"),
        ("dangling symlink", None),  # reads as absent: nothing to report
    ],
)
def test_a_broken_counter_is_left_out_and_the_rest_returned(
    tmp_path: Path, content: str, reason: str | None
) -> None:
    sysfs = copy_devices(CLUSTER, tmp_path, "mlx5_0", "mlx5_1")
    break_file(sysfs / COUNTER, content)
    mlx5_0 = by_name(sysfs)["mlx5_0"]
    port = only_port(mlx5_0)
    assert port.counters is not None and port.counters.port_rcv_errors is None
    assert "port_rcv_errors" not in port.pinned_at_max
    expected = () if reason is None else (SkippedFile("mlx5_0/ports/1/counters/port_rcv_errors", reason),)
    assert mlx5_0.skipped == expected

    intact = only_port(by_name(CLUSTER)["mlx5_0"])
    assert intact.counters is not None
    assert port.counters.by_file() == {
        k: v for k, v in intact.counters.by_file().items() if k != "port_rcv_errors"
    }
    assert (port.state_id, port.rate_bytes_per_second, port.hw_counters) == (
        intact.state_id,
        intact.rate_bytes_per_second,
        intact.hw_counters,
    )
    assert by_name(sysfs)["mlx5_1"] == by_name(CLUSTER)["mlx5_1"]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("9" * 5000 + "\n", "out of range: 5000 digits"),  # int() of it raises ValueError
        (f"{2**64}\n", "out of range: 20 digits"),  # one past what a 64-bit counter holds
        ("-5\n", "not a counter: '-5'"),
        ("+5\n", "not a counter: '+5'"),
        ("1_000\n", "not a counter: '1_000'"),
        ("\uff11\uff12\n", "not a counter: '\uff11\uff12'"),  # fullwidth digits, which int() reads
    ],
)
def test_an_absurd_counter_value_is_skipped_alone(tmp_path: Path, content: str, reason: str) -> None:
    """Issue 11: one counter of thousands of digits made the whole collector fail."""
    sysfs = copy_devices(CLUSTER, tmp_path, "mlx5_0")
    (sysfs / COUNTER).write_text(content)
    mlx5_0 = by_name(sysfs)["mlx5_0"]
    assert mlx5_0.skipped == (SkippedFile("mlx5_0/ports/1/counters/port_rcv_errors", reason),)
    port, intact = only_port(mlx5_0), only_port(by_name(CLUSTER)["mlx5_0"])
    assert port.counters is not None and intact.counters is not None
    assert port.counters.by_file() == {
        k: v for k, v in intact.counters.by_file().items() if k != "port_rcv_errors"
    }


def test_the_largest_64_bit_counter_is_read() -> None:
    assert infiniband._counter_value(str(2**64 - 1).encode()) == 2**64 - 1
    assert infiniband._counter_value(b"0") == 0


@pytest.mark.parametrize(
    ("relative", "content"),
    [
        ("ports/1/state", "9" * 5000 + ": ACTIVE"),
        ("ports/1/rate", "9" * 5000 + " Gb/sec (4X NDR)"),
        ("ports/1/rate", "400 Gb/sec (" + "9" * 5000 + "X NDR)"),
        ("device/current_link_width", "9" * 5000),
        ("device/current_link_speed", "9" * 5000 + ".0 GT/s PCIe"),
    ],
)
def test_absurd_numbers_in_other_attributes_are_skipped(tmp_path: Path, relative: str, content: str) -> None:
    sysfs = copy_devices(CLUSTER, tmp_path, "mlx5_0")
    (sysfs / "class/infiniband/mlx5_0" / relative).write_text(content + "\n")
    mlx5_0 = by_name(sysfs)["mlx5_0"]
    assert [s.path for s in mlx5_0.skipped] == [f"mlx5_0/{relative}"]
    assert mlx5_0.skipped[0].reason.startswith("unexpected format")
    assert only_port(mlx5_0).counters == only_port(by_name(CLUSTER)["mlx5_0"]).counters


@pytest.mark.parametrize("content", ["9" * 5000, "-1", str(2**40)])
def test_absurd_interface_numbers_leave_the_interface_without_them(tmp_path: Path, content: str) -> None:
    sysfs = copy_devices(CLUSTER, tmp_path, "mlx5_0")
    (sysfs / "class/net/ibp24s0/mtu").write_text(content + "\n")
    assert by_name(sysfs)["mlx5_0"].netdevs == (Netdev("ibp24s0", None),)


def test_a_fifo_reads_as_empty_instead_of_blocking(tmp_path: Path) -> None:
    sysfs = copy_devices(CLUSTER, tmp_path, "mlx5_0")
    (sysfs / COUNTER).unlink()
    os.mkfifo(sysfs / COUNTER)
    mlx5_0 = by_name(sysfs)["mlx5_0"]
    assert mlx5_0.skipped == (SkippedFile("mlx5_0/ports/1/counters/port_rcv_errors", "empty"),)


@pytest.mark.parametrize(
    "code", [errno.EPERM, errno.EACCES, errno.EINVAL, errno.EOPNOTSUPP, errno.EIO, errno.ENOSYS]
)
def test_read_errors_are_skipped(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    # Root reads through chmod 000, so the errors the kernel returns are raised by a stand-in
    # for the reader's one open call.
    failing = {
        "mlx5_0/ports/1/counters/symbol_error",
        "mlx5_0/ports/1/hw_counters/out_of_buffer",
        "mlx5_0/fw_ver",
    }

    def fake_open(file: str | bytes, flags: int, dir_fd: int | None = None) -> int:
        name = os.fsdecode(file)
        where = name if dir_fd is None else f"{os.readlink(f'/proc/self/fd/{dir_fd}')}/{name}"
        if any(where.endswith(path) for path in failing):
            raise OSError(code, os.strerror(code), where)
        return os.open(file, flags, dir_fd=dir_fd)

    monkeypatch.setattr(sysfs, "_open", fake_open)
    mlx5_0 = by_name(CLUSTER)["mlx5_0"]
    port = only_port(mlx5_0)
    assert mlx5_0.firmware_version is None
    assert port.counters is not None and port.counters.symbol_error is None
    assert "out_of_buffer" not in port.hw_counters and len(port.hw_counters) == 23
    assert port.counters.port_rcv_data_bytes == 16_392_862_304_016  # 4_098_215_576_004 words
    assert {s.path for s in mlx5_0.skipped} == {"mlx5_0/" + path.split("/", 1)[1] for path in failing}
    assert {s.reason for s in mlx5_0.skipped} == {errno.errorcode[code]}


@pytest.mark.parametrize(
    ("relative", "content", "field", "reason"),
    [
        ("ports/1/state", "ACTIVE\n", "state_id", "unexpected format: 'ACTIVE'"),
        ("ports/1/phys_state", "\n", "physical_state_id", "empty"),
        ("ports/1/rate", "fast\n", "rate_bytes_per_second", "unexpected format: 'fast'"),
        ("ports/1/link_layer", "", "link_layer", "empty"),
    ],
)
def test_broken_port_attributes(tmp_path: Path, relative: str, content: str, field: str, reason: str) -> None:
    sysfs = copy_devices(CLUSTER, tmp_path, "mlx5_0", "mlx5_1")
    (sysfs / "class/infiniband/mlx5_1" / relative).write_text(content)
    mlx5_1 = by_name(sysfs)["mlx5_1"]
    port = only_port(mlx5_1)
    assert getattr(port, field) is None
    assert mlx5_1.skipped == (SkippedFile(f"mlx5_1/{relative}", reason),)
    assert port.counters == only_port(by_name(CLUSTER)["mlx5_1"]).counters


def test_broken_pcie_link_files(tmp_path: Path) -> None:
    sysfs = copy_devices(CLUSTER, tmp_path, "mlx5_0", "mlx5_1")
    device = sysfs / "class/infiniband/mlx5_1/device"
    (device / "current_link_speed").write_text("Unknown\n")  # what the kernel says when it cannot tell
    (device / "current_link_width").write_text("0\n")  # a virtual function's reserved register
    (device / "max_link_width").write_text("lots\n")
    mlx5_1 = by_name(sysfs)["mlx5_1"]
    assert mlx5_1.pci == PciLink(
        "0000:40:00.0", generation=None, generation_max=5, width=None, width_max=None
    )
    assert mlx5_1.skipped == (
        SkippedFile("mlx5_1/device/current_link_speed", "unexpected format: 'Unknown'"),
        SkippedFile("mlx5_1/device/max_link_width", "unexpected format: 'lots'"),
    )


def test_device_without_ports_or_device_link(tmp_path: Path) -> None:
    sysfs = copy_devices(CLUSTER, tmp_path, "mlx5_0", "mlx5_1")
    device = sysfs / "class/infiniband/mlx5_1"
    shutil.rmtree(device / "ports")
    (device / "device").unlink()
    mlx5_1 = by_name(sysfs)["mlx5_1"]
    assert (mlx5_1.ports, mlx5_1.pci, mlx5_1.netdevs) == ((), None, ())
    assert mlx5_1.firmware_version == "28.39.1002"


def test_entries_that_are_not_directories_are_not_devices(tmp_path: Path) -> None:
    sysfs = copy_devices(CLUSTER, tmp_path, "mlx5_0", "mlx5_1")
    (sysfs / "class/infiniband/mlx5_1").unlink()
    (sysfs / "class/infiniband/mlx5_1").write_text("../../devices/pci0000:3d/...\n")  # a flattened link
    assert "mlx5_1" not in by_name(sysfs)


def test_absent_class_infiniband_raises(tmp_path: Path) -> None:
    (tmp_path / "class" / "net").mkdir(parents=True)
    with pytest.raises(FileNotFoundError):
        read_rdma_devices(tmp_path)


# --- the device <-> netdev relation on multi-port functions ----------------------------------


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def add_interface(sysfs: Path, function: Path, name: str, ifindex: int, iflink: int, dev_port: int) -> None:
    directory = function / "net" / name
    for attribute, value in {"ifindex": ifindex, "iflink": iflink, "dev_port": dev_port, "mtu": 2044}.items():
        write(directory / attribute, str(value))
    (directory / "device").symlink_to(Path("../../..") / function.name)
    (sysfs / "class" / "net").mkdir(parents=True, exist_ok=True)
    (sysfs / "class" / "net" / name).symlink_to(Path("../..") / directory.relative_to(sysfs))


def test_multi_port_function_maps_ports_by_dev_port_and_prefers_parents(tmp_path: Path) -> None:
    """A two-port ConnectX-3 (mlx4) running IPoIB: ib0, ib1 and a P_Key child ib0.8001 on one function."""
    sysfs = tmp_path
    function = sysfs / "devices" / "pci0000:00" / "0000:00:02.0" / "0000:04:00.0"
    device = function / "infiniband" / "mlx4_0"
    write(device / "fw_ver", "2.42.5000")
    for port in ("1", "2"):
        write(device / "ports" / port / "link_layer", "InfiniBand")
    (device / "device").symlink_to(Path("../../..") / function.name)
    (sysfs / "class" / "infiniband").mkdir(parents=True)
    (sysfs / "class" / "infiniband" / "mlx4_0").symlink_to(Path("../..") / device.relative_to(sysfs))
    add_interface(sysfs, function, "ib0", ifindex=4, iflink=4, dev_port=0)
    add_interface(sysfs, function, "ib1", ifindex=5, iflink=5, dev_port=1)
    add_interface(sysfs, function, "ib0.8001", ifindex=6, iflink=4, dev_port=0)

    (mlx4,) = read_rdma_devices(sysfs)
    assert [port.netdev for port in mlx4.ports] == ["ib0", "ib1"]
    assert [n.name for n in mlx4.netdevs] == ["ib0", "ib0.8001", "ib1"]
    assert mlx4.pci == PciLink("0000:04:00.0")


# --- reading again with a cache --------------------------------------------------------------


@pytest.mark.parametrize("tree", [PROCFS, NODE_EXPORTER, CLUSTER], ids=lambda p: p.parent.name)
def test_reads_with_a_cache_equal_fresh_reads(tree: Path) -> None:
    cache = ReadCache()
    fresh = read_rdma_devices(tree)
    assert [read_rdma_devices(tree, cache) for _ in range(3)] == [fresh] * 3


def test_a_device_registered_again_is_read_afresh(tmp_path: Path) -> None:
    """A driver reload or firmware reset gives the device a new sysfs directory: new firmware shows."""
    sysfs = copy_devices(CLUSTER, tmp_path, "mlx5_0")
    cache = ReadCache()
    assert by_name_cached(sysfs, cache)["mlx5_0"].firmware_version == "28.39.1002"
    device = (sysfs / "class/infiniband/mlx5_0").resolve()
    shutil.copytree(device, device.with_name("new"), symlinks=True)
    device.rename(device.with_name("old"))  # kept, so the new directory cannot reuse its inode
    device.with_name("new").rename(device)
    (device / "fw_ver").write_text("28.40.1000\n")
    (device / "ports/1/link_layer").write_text("Ethernet\n")
    again = by_name_cached(sysfs, cache)["mlx5_0"]
    assert again.firmware_version == "28.40.1000"
    assert only_port(again).link_layer == "Ethernet"


def test_a_counter_file_that_appears_is_read(tmp_path: Path) -> None:
    sysfs = copy_devices(CLUSTER, tmp_path, "mlx5_0")
    cache = ReadCache()
    before = only_port(by_name_cached(sysfs, cache)["mlx5_0"])
    (sysfs / "class/infiniband/mlx5_0/ports/1/hw_counters/new_counter").write_text("7\n")
    (sysfs / "class/infiniband/mlx5_0/ports/1/hw_counters/out_of_buffer").unlink()
    after = only_port(by_name_cached(sysfs, cache)["mlx5_0"])
    assert after.hw_counters["new_counter"] == 7
    assert set(after.hw_counters) == set(before.hw_counters) - {"out_of_buffer"} | {"new_counter"}


def by_name_cached(sysfs: Path, cache: ReadCache) -> dict[str, RdmaDevice]:
    return {device.name: device for device in read_rdma_devices(sysfs, cache)}


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_held_counter_files_show_values_written_in_place_and_are_released(tmp_path: Path) -> None:
    """Counter files stay open between reads and are read again at offset 0, as sysfs regenerates
    an attribute there; a value written into the same file shows, and nothing stays open once the
    device is gone or the cache is closed."""
    sysfs = copy_devices(CLUSTER, tmp_path, "mlx5_0")
    cache = ReadCache()
    before = _open_fds()
    first = only_port(by_name_cached(sysfs, cache)["mlx5_0"])
    held = _open_fds() - before
    assert held >= len(first.hw_counters) > 0  # one per counter file
    counter = sysfs / "class/infiniband/mlx5_0/ports/1/counters/symbol_error"
    with counter.open("r+") as f:  # the same inode, as the kernel updates a counter
        f.write("4242\n")
        f.truncate()
    again = only_port(by_name_cached(sysfs, cache)["mlx5_0"])
    assert (first.counters.symbol_error, again.counters.symbol_error) != (4242, 4242)
    assert again.counters.symbol_error == 4242
    assert _open_fds() - before == held  # the same descriptors, nothing opened again
    shutil.rmtree(sysfs / "class/infiniband/mlx5_0/ports")
    by_name_cached(sysfs, cache)  # the ports are gone: their files are let go
    assert _open_fds() - before < held
    cache.close()
    assert _open_fds() == before


def test_a_read_without_a_cache_holds_nothing_open() -> None:
    before = _open_fds()
    read_rdma_devices(CLUSTER)
    assert _open_fds() == before


def test_counter_files_beyond_the_budget_are_opened_for_one_read_only() -> None:
    # Under a low open-file limit only part of the files are held; the values are the same.
    cache = ReadCache(held_budget=60)
    before = _open_fds()
    fresh = read_rdma_devices(CLUSTER)
    assert [read_rdma_devices(CLUSTER, cache) for _ in range(2)] == [fresh] * 2
    assert 0 < cache.held <= 60
    assert _open_fds() - before == cache.held
    cache.close()
    assert (cache.held, _open_fds()) == (0, before)


def _recording_opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file and directory the read layer opens from now on, as a path."""
    opened: list[str] = []

    def recording_open(file: str | bytes, flags: int, dir_fd: int | None = None) -> int:
        name = os.fsdecode(file)
        opened.append(name if dir_fd is None else f"{os.readlink(f'/proc/self/fd/{dir_fd}')}/{name}")
        return os.open(file, flags, dir_fd=dir_fd)

    monkeypatch.setattr(sysfs, "_open", recording_open)
    return opened


def test_a_later_read_opens_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What is read every time (counters, states, rates, the PCIe link, MTUs, the GIDs' interfaces)
    stays open, and what is absent (counters_ext/ on current kernels) is known to be: a second read
    of an unchanged tree opens nothing, and sees what changed in the files it holds."""
    sysfs = copy_devices(CLUSTER, tmp_path, "mlx5_0", "mlx5_8")  # an InfiniBand and a RoCE HCA
    opened = _recording_opens(monkeypatch)
    cache = ReadCache()
    first = by_name_cached(sysfs, cache)
    assert any(path.endswith("/ports/1/state") for path in opened)
    assert any(path.endswith("/mtu") for path in opened)
    assert first["mlx5_8"].ports[0].gid_netdevs  # RoCE: the port's interface from its GIDs
    port = sysfs / "class/infiniband/mlx5_0/ports/1"
    with (port / "state").open("r+") as f:  # in place, as the kernel changes an attribute
        f.write("1: DOWN\n")
        f.truncate()
    mtu = (sysfs / "class/net" / first["mlx5_0"].netdevs[0].name / "mtu").resolve()
    with mtu.open("r+") as f:
        f.write("2044\n")
        f.truncate()
    opened.clear()
    again = by_name_cached(sysfs, cache)
    assert opened == []
    assert only_port(again["mlx5_0"]).state == "DOWN"
    assert again["mlx5_0"].netdevs[0].mtu_bytes == 2044
    assert again["mlx5_8"] == first["mlx5_8"]
    cache.close()


def test_a_read_takes_only_the_counter_files_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = _recording_opens(monkeypatch)
    selection = infiniband.CounterSelection(
        counters=lambda name: name == "symbol_error", hw_counters=lambda name: name == "out_of_buffer"
    )
    port = only_port(read_rdma_devices(CLUSTER, counters=selection, selects=lambda name: name == "mlx5_0")[0])
    assert port.counters is not None and port.counters.by_file() == {"symbol_error": 0}
    assert port.hw_counters == {"out_of_buffer": 0}
    counter_files = {
        path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[-1] for path in opened if "counters/" in path
    }
    assert counter_files == {"counters/symbol_error", "hw_counters/out_of_buffer"}
    assert not [path for path in opened if "/mlx5_1/" in path]  # a device not selected is not read
    # The audits read no counter, and still know which ports have them.
    opened.clear()
    (device,) = read_rdma_devices(CLUSTER, counters=infiniband.NO_COUNTERS, selects=lambda n: n == "mlx5_0")
    assert only_port(device).counters == infiniband.PortCounters() and only_port(device).hw_counters == {}
    assert not [path for path in opened if "counters/" in path]
