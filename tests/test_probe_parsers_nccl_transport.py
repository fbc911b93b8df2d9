"""NCCL's transport, read from real NCCL_DEBUG=INFO output (tests/fixtures/nccl-tests/nccl-debug-info
and the captures with INFO lines; sources in that folder's README). Expected values are read off the
files by eye."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterhealth.checks.probe_parsers import parse
from clusterhealth.checks.probe_parsers.nccl_transport import Transport, network_family, read_transport
from clusterhealth.checks.probes.transport import NodeLinks, fallback

FIXTURES = Path(__file__).parent / "fixtures" / "nccl-tests"
DEBUG_INFO = FIXTURES / "nccl-debug-info"

T = Transport

# file -> what its INFO lines say, and why.
EXPECTED: dict[str, tuple[Transport, str]] = {
    # On InfiniBand.
    "nccl-tests-issue-228_net_ib.log": (T("IB"), "`Using network IB`, no channel lines"),
    "nccl-issue-429_p2p_direct_pointer_and_ib_gdrdma.log": (
        T("IB", True, "P2P"),
        "`Channel 03 :` (no connection index) via NET/IB/0/GDRDMA, P2P/direct pointer",
    ),
    "nccl-tests-issue-36_ring_gdrdma_on_receive_only.log": (
        T("IB", True),
        "NCCL 2.4's `Ring 00 :` lines; GPUDirect RDMA on receive, not on send, is in use",
    ),
    "nv_peer_memory-issue-56_ring_ib_without_gdrdma.log": (
        T("IB", False, "P2P"),
        "`Ring` lines via NET/IB/0 and none with /GDRDMA; P2P/IPC",
    ),
    "nccl-issue-1814_ibext_without_gdrdma.log": (
        T("IB", False),
        "HPC-X's IBext_v8 plugin is IB; no /GDRDMA; the last line is cut before its device",
    ),
    "nccl-issue-1453_hydra_tags_ibext_gdrdma_nvls.log": (
        T("IB", True, "NVLS"),
        "IBext_v8/GDRDMA behind Hydra's `[0]` tags; an `NVLS comm` line inside a table row",
    ),
    "nccl-issue-988_using_network_ibext.log": (T("IB"), "`Using network IBext` with SHARP devices"),
    "nccl-issue-1537_roce_gdr_disabled_for_hca.log": (
        T("IB", False),
        "RoCE is NCCL's IB transport; no channels, `GPU Direct RDMA Disabled for HCA` lines only",
    ),
    "horovod-issue-1523_nccl_2.4_socket_and_ib_device_lines.log": (
        T("IB"),
        "NCCL 2.4 listed its socket devices in every process; the IB device line says IB",
    ),
    # On sockets.
    "aws-k8s-tester-pr-464_mpijob_net_socket.log": (
        T("Socket", False),
        "`Using network Socket` and a channel via NET/Socket/0, behind OpenMPI tags",
    ),
    "nccl-issue-1812_net_socket_no_ibverbs.log": (
        T("Socket"),
        "libibverbs missing: only the `NET/Socket : Using` device line",
    ),
    "nccl-issue-1817_socket_without_libibverbs.log": (T("Socket"), "`Using network Socket`"),
    "nccl-issue-1817_shm_run_socket_without_libibverbs.log": (
        T("Socket"),
        "`Using network Socket`; alone, nothing says that the run stayed inside one node",
    ),
    "nccl-issue-1121_ib_no_device_found_socket.log": (
        T("Socket"),
        "`NET/IB : No device found.`, then the socket device line",
    ),
    "nccl-issue-952_no_ib_device_socket_and_p2p_ipc.log": (
        T("Socket", False, "P2P"),
        "sockets between nodes, P2P/IPC/read inside them",
    ),
    "nccl-tests-issue-166_socket_and_shm.log": (
        T("Socket", False, "SHM"),
        "sockets between nodes and shared memory inside them; the last line is cut inside `SHM/direct`",
    ),
    # Inside a node.
    "aks-rdma-infiniband-issue-30_p2p_cumem.log": (T(intra="P2P"), "P2P/CUMEM/read"),
    "nccl-issue-892_p2p_direct_pointer_0_nvls_channels.log": (
        T(intra="P2P"),
        "P2P/direct pointer; `0 nvls channels` is no NVLS",
    ),
    "nccl-issue-1817_p2p_lines_after_the_header.log": (
        T(intra="P2P"),
        "P2P/direct pointer lines after the table's header",
    ),
    "nccl-tests-issue-228_shm_on_nvswitch.log": (
        T(intra="SHM"),
        "SHM/direct/direct between the GPUs of an NVSwitch system",
    ),
    "nccl-issue-1817_mixed_shm_and_p2p.log": (
        T(intra="mixed"),
        "one run (pid 3884652) with SHM between some GPU pairs and P2P between others",
    ),
    "nccl-issue-644_p2p_direct_pointer_and_direct_shared_memory.log": (
        T(intra="mixed"),
        "NCCL 2.7.8: `via direct shared memory` between some GPU pairs, `P2P/direct pointer` between others",
    ),
    # Nothing said.
    "nccl-issue-1189_info_lines_around_the_header_0_nvls_channels.log": (
        T(),
        "INFO lines but none about transports; a channel line cut before `via`",
    ),
    "nccl-issue-1453_hydra_tags_rows_after_the_split_row.log": (T(), "rows only"),
    "nccl-tests-issue-213_nnodes_1.log": (T(), "`nNodes 1` alone says no transport"),
    "nccl-issue-1189_nnodes_2.log": (T(), "`nNodes 2` alone says no transport"),
}
# The nccl-tests captures (tests/test_probe_parsers_nccl_tests.py) whose INFO lines say something.
CAPTURES = {
    "11_efa_2x8_a100_mpirun_tagged_error_column.txt": T("OFI", True, "P2P"),
    "15_tail_nccl_info_between_last_row_and_footer.txt": T(),
    "19_mpijob_launcher_log_rows_after_nccl_info.txt": T(),
    "08_single_node_8x_h100_allreduce.txt": T(),
}


def test_every_debug_info_capture_has_expectations() -> None:
    assert sorted(p.name for p in DEBUG_INFO.iterdir() if p.suffix == ".log") == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_debug_info_capture(name: str) -> None:
    expected, why = EXPECTED[name]
    text = (DEBUG_INFO / name).read_text()
    assert read_transport(text) == expected, why
    # The nccl-tests parser reads the same through its launcher-prefix handling.
    assert parse("nccl-tests", text).transport == expected, why


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_capture(name: str) -> None:
    result = parse("nccl-tests", (FIXTURES / name).read_text())
    assert result.transport == CAPTURES[name]
    assert result.to_dict()["transport"] == CAPTURES[name].to_dict()


def test_the_efa_capture_names_its_plugin_aws_libfabric() -> None:
    text = (FIXTURES / "11_efa_2x8_a100_mpirun_tagged_error_column.txt").read_text()
    assert "Using network AWS Libfabric" in text and "via NET/AWS Libfabric/0/GDRDMA" in text


@pytest.mark.parametrize(
    ("printed", "family"),
    [
        # aws-ofi-nccl: up to 1.11, since, and renamed after NCCL_NET=OFI (its nvidia_plugin_name_fixup).
        ("AWS Libfabric", "OFI"),
        ("Libfabric", "OFI"),
        ("OFI", "OFI"),
        # HPC-X's nccl-rdma-sharp-plugins.
        ("IBext", "IB"),
        ("IBext_v8", "IB"),
        ("IB", "IB"),
        ("Socket", "Socket"),
        # Any other plugin keeps its name.
        ("GPUDirectTCPX", "GPUDirectTCPX"),
    ],
)
def test_network_family(printed: str, family: str) -> None:
    assert network_family(printed) == family


def test_the_channels_that_carried_data_outrank_what_nccl_chose() -> None:
    # No single capture disagrees with itself; two real outputs read as one show the precedence:
    # channels over `Using network`, and `Using network` over the device lines.
    chose_ib = (DEBUG_INFO / "nccl-tests-issue-228_net_ib.log").read_text()
    socket_channels = (DEBUG_INFO / "nccl-tests-issue-166_socket_and_shm.log").read_text()
    assert read_transport(chose_ib + socket_channels).net == "Socket"
    devices_socket = (DEBUG_INFO / "nccl-issue-1121_ib_no_device_found_socket.log").read_text()
    assert read_transport(devices_socket + chose_ib).net == "IB"


def test_a_second_run_with_shm_makes_p2p_mixed() -> None:
    p2p = (DEBUG_INFO / "nccl-issue-892_p2p_direct_pointer_0_nvls_channels.log").read_text()
    shm = (DEBUG_INFO / "nccl-tests-issue-228_shm_on_nvswitch.log").read_text()
    nvls = (DEBUG_INFO / "nccl-issue-1453_hydra_tags_ibext_gdrdma_nvls.log").read_text()
    assert read_transport(p2p + shm).intra == "mixed"
    assert read_transport(nvls + shm).intra == "mixed"
    assert read_transport(p2p + nvls).intra == "NVLS"


def test_before_nccl_2_13_shared_memory_was_direct_shared_memory() -> None:
    # One process driving 8 GPUs on two CPU sockets (NCCL 2.7.8): P2P within a socket's PCIe tree,
    # host memory across. Read alone, the old SHM lines are SHM too.
    lines = (DEBUG_INFO / "nccl-issue-644_p2p_direct_pointer_and_direct_shared_memory.log").read_text()
    shm_only = "".join(line for line in lines.splitlines(keepends=True) if "direct shared memory" in line)
    assert shm_only and read_transport(shm_only) == T(intra="SHM")
    assert read_transport(lines) == T(intra="mixed")


# Two stored parts of one run of issue 1817 (8 x L20 on one host, libibverbs missing): its start-up
# lines (`Using network Socket`) and its channel lines (none via NET/).
ONE_NODE_RUNS = {
    "p2p run (pid 3884994)": (
        "nccl-issue-1817_socket_without_libibverbs.log",
        "nccl-issue-1817_p2p_lines_after_the_header.log",
        T(intra="P2P"),
    ),
    "shm run (pid 3884652)": (
        "nccl-issue-1817_shm_run_socket_without_libibverbs.log",
        "nccl-issue-1817_mixed_shm_and_p2p.log",
        T(intra="mixed"),
    ),
}


@pytest.mark.parametrize("run", sorted(ONE_NODE_RUNS))
def test_a_single_node_run_that_chose_sockets_used_no_network(run: str) -> None:
    start_up, channels, expected = ONE_NODE_RUNS[run]
    text = (DEBUG_INFO / start_up).read_text() + (DEBUG_INFO / channels).read_text()
    assert "Using network Socket" in text and "via NET/" not in text
    assert read_transport(text) == expected
    result = parse("nccl-tests", text)
    assert result.transport == expected
    assert result.to_dict()["transport"]["net"] is None
    # Sockets NCCL loaded but never used are no fallback on a node with RDMA devices.
    assert fallback(result.transport, NodeLinks.of(["mlx5_0", "mlx5_1"], None)) is None


def test_nccl_s_node_count_decides_whether_the_network_was_used() -> None:
    # Real outputs read as one (no capture holds all of these lines): NCCL chose IB, and its
    # communicator spans one node: no network carried anything.
    one_node = (DEBUG_INFO / "nccl-tests-issue-213_nnodes_1.log").read_text()
    chose_ib = (DEBUG_INFO / "nccl-tests-issue-228_net_ib.log").read_text()
    assert read_transport(chose_ib + one_node) == T()
    # NCCL's IB plugin judges GPUDirect RDMA per HCA at start-up, whether the run then uses the
    # network or not: on one node that verdict says nothing about the run.
    gdr_disabled_for_hca = (DEBUG_INFO / "nccl-issue-1537_roce_gdr_disabled_for_hca.log").read_text()
    assert read_transport(gdr_disabled_for_hca).gdrdma is False
    assert read_transport(gdr_disabled_for_hca + one_node) == T()
    # A communicator over two nodes whose captured channels happen to stay inside a node (a cut
    # capture): what NCCL chose still stands.
    two_nodes = (DEBUG_INFO / "nccl-issue-1189_nnodes_2.log").read_text()
    start_up, channels, _ = ONE_NODE_RUNS["p2p run (pid 3884994)"]
    p2p_run = (DEBUG_INFO / start_up).read_text() + (DEBUG_INFO / channels).read_text()
    assert read_transport(two_nodes + p2p_run) == T("Socket", None, "P2P")


def test_lines_without_nccl_info_are_not_read() -> None:
    # The same words outside an INFO line (a user's note, a WARN) say nothing about the run.
    assert read_transport("we expected traffic via NET/IB/0/GDRDMA and Using network IB\n") == T()
    warn = "gpu5:6252:6325 [0] transport/net_ib.cu:788 NCCL WARN NET/IB : Got completion with error 4\n"
    assert parse("nccl-tests", warn).transport == T()


def test_said_and_json() -> None:
    assert not T().said
    assert T(intra="SHM").said and T(gdrdma=False).said
    assert T("Socket", False, "mixed").to_dict() == {"net": "Socket", "gdrdma": False, "intra": "mixed"}


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        {"net": "IB", "gdrdma": True},
        {"net": "IB", "gdrdma": "true", "intra": "P2P"},
        {"net": 3, "gdrdma": None, "intra": None},
        {"net": "IB", "gdrdma": True, "intra": "NVLink"},
        {"net": "IB", "gdrdma": True, "intra": "P2P", "extra": 1},
    ],
)
def test_a_malformed_transport_is_refused(data: object) -> None:
    with pytest.raises(ValueError):
        Transport.from_dict(data)


def test_from_dict_reads_to_dict() -> None:
    for transport in (T(), T("IB", True, "NVLS"), T("Socket", False, "mixed")):
        assert Transport.from_dict(transport.to_dict()) == transport


def test_hydra_tags_do_not_hide_the_rows() -> None:
    # MPICH's Hydra prefixes every chunk with `[0]`, inside rows too: `-1[0]     159.4`.
    first = parse("nccl-tests", (DEBUG_INFO / "nccl-issue-1453_hydra_tags_ibext_gdrdma_nvls.log").read_text())
    assert [row.size_bytes for row in first.rows] == [32768, 65536, 131072, 262144]
    row = first.rows[0]
    assert (row.type, row.redop, row.root) == ("float", "sum", -1)
    assert row.out_of_place is not None and row.in_place is not None
    assert (row.out_of_place.time_us, row.out_of_place.busbw_gbps, row.out_of_place.wrong) == (159.4, 0.39, 0)
    assert (row.in_place.time_us, row.in_place.busbw_gbps, row.in_place.wrong) == (201.8, 0.31, 0)
    # The row an INFO line cut (524288) is lost, not misread; its second half alone is no row.
    rest = parse(
        "nccl-tests", (DEBUG_INFO / "nccl-issue-1453_hydra_tags_rows_after_the_split_row.log").read_text()
    )
    sizes = [row.size_bytes for row in rest.rows]
    assert sizes == [1 << n for n in range(20, 30)]
    assert rest.rows[-1].in_place is not None and rest.rows[-1].in_place.busbw_gbps == 5.33


def test_info_lines_around_and_inside_the_table_leave_it_readable() -> None:
    # The header among INFO lines: the layout is read from it (root column, #wrong).
    around = parse(
        "nccl-tests",
        (DEBUG_INFO / "nccl-issue-1189_info_lines_around_the_header_0_nvls_channels.log").read_text(),
    )
    assert around.rows == ()
    assert around.errors[0].startswith("output ends before the '# Avg bus bandwidth' footer")
    # Capture 11 has 529 INFO lines, some between its rows; every row is still read.
    efa = parse("nccl-tests", (FIXTURES / "11_efa_2x8_a100_mpirun_tagged_error_column.txt").read_text())
    assert len(efa.rows) == 30 and efa.verdict == "ok"


def test_every_debug_info_capture_names_its_source() -> None:
    readme = (FIXTURES / "README.md").read_text()
    for name in EXPECTED:
        row = next((line for line in readme.splitlines() if line.startswith(f"| {name} | ")), "")
        assert "https://github.com/" in row or "the same" in row, name
