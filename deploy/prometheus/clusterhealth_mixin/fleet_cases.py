"""promtool cases of the fleet alerts (fleet.py): each fires on its fault series and stays quiet
on healthy and boundary series."""

from __future__ import annotations

from collections.abc import Callable

from . import recording_cases
from .cases import PAIRWISE_ROUNDS, Case, Expr, F, S, Sample, gpu
from .config import Config
from .fleet import pairwise_host


def transport(instance: str, net: str, gdrdma: str, intra: str) -> dict[str, str]:
    """The labels of a probe's clusterhealth_probe_transport_info (empty: the run did not say)."""
    return {"instance": instance, "probe": "nccl", "net": net, "gdrdma": gdrdma, "intra": intra}


TRANSPORT = "clusterhealth_probe_transport_info"


def pairwise_group(bad: str) -> dict[str, str]:
    """A pairwise group of five nodes (PAIRWISE_ROUNDS), `bad` bad: every meeting with it fails or
    falls short."""
    series: dict[str, str] = {}
    rows: dict[tuple[str, str], list[str]] = {}
    for k, pairs in enumerate(PAIRWISE_ROUNDS):
        for a, b in pairs:
            for node, peer in ((a, b), (b, a)):
                row = rows.setdefault((node, peer), ["_"] * 60)
                row[15 * k : 15 * k + 5] = ["0" if bad in (a, b) else "1"] * 5
    for (node, peer), row in rows.items():
        where = {"instance": node, "probe": "fabric", "peer": peer}
        series[S("clusterhealth_probe_peer_success", where)] = " ".join(row)
        # The agents' own verdicts of each meeting: below their expectation with the bad host.
        bandwidth = [{"0": "5e8", "1": "1.2e9"}.get(v, v) for v in row]
        series[S("clusterhealth_probe_bandwidth_bytes_per_second", where)] = " ".join(bandwidth)
    for i in range(1, 6):
        host = {"instance": f"h{i}"}
        series[S("clusterhealth_node_info", {**host, "node": f"h{i}"})] = "1x60"
        series[S("clusterhealth_probe_round", {**host, "probe": "fabric"})] = "2000000+0x60"
        series[S("clusterhealth_probe_expected_bandwidth_bytes_per_second", {**host, "probe": "fabric"})] = (
            "1.25e9x60"
        )
        series[S("clusterhealth_probe_success", {**host, "probe": "fabric"})] = "0x60" if i == 1 else "1x60"
    return series


# What h1 costs (the impact rules, quoted by the alerts that name it): its meetings measure 5e8
# B/s, its partners' typical meeting and the group's reference 1.2e9 (each met h1 once in three).
H1_IMPACT = recording_cases.impact(5e8, 1.2e9)


# The pairwise host rule on its own (docs/fabric.md shows it): groups of five nodes meeting in
# PAIRWISE_ROUNDS, each meeting exported by both ends for 5 minutes from its round's start.
SUSPECT = '{instance="h1:9845",job="clusterhealth",pairwise="host",probe="hostfault"}'
SUSPECT_OF_THREE = '{instance="h1:9845",job="clusterhealth",pairwise="host",probe="hostthree"}'


def meetings(probe: str, fails: Callable[[str, str], bool]) -> dict[str, str]:
    """`clusterhealth_probe_peer_success` of each meeting, 1 or 0 as `fails` says."""
    rows: dict[tuple[str, str], list[str]] = {}
    for k, pairs in enumerate(PAIRWISE_ROUNDS):
        for a, b in pairs:
            for x, y in ((a, b), (b, a)):
                row = rows.setdefault((x, y), ["_"] * 60)
                row[15 * k : 15 * k + 5] = ["0" if fails(a, b) else "1"] * 5
    return {
        S("clusterhealth_probe_peer_success", {"instance": x, "probe": probe, "peer": y}): " ".join(row)
        for (x, y), row in rows.items()
    }


def node_infos() -> dict[str, str]:
    return {S("clusterhealth_node_info", {"instance": f"h{i}", "node": f"h{i}"}): "1x60" for i in range(1, 6)}


def host_fault() -> dict[str, str]:
    return meetings("hostfault", lambda a, b: "h1" in (a, b))


def path_fault() -> dict[str, str]:
    """h2 and h5 meet in round 1; their confirmation, in the second half of round 2, fails too."""
    series = meetings("pathfault", lambda a, b: {a, b} == {"h2", "h5"})
    confirming = " ".join(["_"] * 38 + ["0"] * 5 + ["_"] * 17)
    for x, y in (("h2", "h5"), ("h5", "h2")):
        # The same series as the round-1 meeting's: promtool takes one row per series, so the
        # confirmation goes in the meeting's row.
        key = S("clusterhealth_probe_peer_success", {"instance": x, "probe": "pathfault", "peer": y})
        values = zip(series[key].split(), confirming.split(), strict=True)
        series[key] = " ".join(a if a != "_" else b for a, b in values)
    return series


CASES = [
    Case(
        "FirmwareDrift",
        "one HCA of three runs older firmware than its board's fleet; a tie and a lone board do not",
        {
            **{
                S(
                    "clusterhealth_firmware_info",
                    {"instance": n, "component": "hca", "subject": "mlx5_0", "version": v},
                ): "1x80"
                for n, v in (("n1", "28.39.1002"), ("n2", "28.39.1002"), ("n3", "28.36.1010"))
            },
            **{
                S(
                    "clusterhealth_rdma_device_info",
                    {"instance": n, "device": "mlx5_0", "board_id": "MT_838", "firmware_version": "x"},
                ): "1x80"
                for n in ("n1", "n2", "n3")
            },
            # a tie between two versions on two nodes has no odd one out
            S(
                "clusterhealth_firmware_info",
                {"instance": "n1", "component": "hca", "subject": "mlx5_1", "version": "1.0"},
            ): "1x80",
            S(
                "clusterhealth_firmware_info",
                {"instance": "n2", "component": "hca", "subject": "mlx5_1", "version": "2.0"},
            ): "1x80",
            **{
                S(
                    "clusterhealth_rdma_device_info",
                    {"instance": n, "device": "mlx5_1", "board_id": "MT_999", "firmware_version": "x"},
                ): "1x80"
                for n in ("n1", "n2")
            },
            **{
                S(
                    "clusterhealth_firmware_info",
                    {"instance": n, "component": "gpu_vbios", "subject": "0", "version": "96.00.99.00.01"},
                ): "1x80"
                for n in ("n1", "n2", "n3")
            },
            **{
                S(
                    "clusterhealth_gpu_info", {"instance": n, "gpu": "0", "uuid": f"GPU-{n}", "name": "H100"}
                ): "1x80"
                for n in ("n1", "n2", "n3")
            },
            **{
                S(
                    "clusterhealth_firmware_info",
                    {"instance": n, "component": "gpu_driver", "subject": "driver", "version": "550.90.07"},
                ): "1x80"
                for n in ("n1", "n2", "n3")
            },
        },
        [
            ("30m", []),
            (
                "70m",
                [
                    F(
                        {
                            "instance": "n3",
                            "component": "hca",
                            "subject": "mlx5_0",
                            "version": "28.36.1010",
                            "model": "MT_838",
                        },
                        "warning",
                        1,
                    ),
                ],
            ),
        ],
    ),
    Case(
        "FabricBandwidthDegraded",
        "a node-local and a peer probe below 80% of their expectation fire; 87% does not",
        {
            S(
                "clusterhealth_probe_bandwidth_bytes_per_second",
                {"instance": "n1", "probe": "nccl", "peer": ""},
            ): ("400e9x10"),
            S(
                "clusterhealth_probe_expected_bandwidth_bytes_per_second", {"instance": "n1", "probe": "nccl"}
            ): ("460e9x10"),
            S(
                "clusterhealth_probe_bandwidth_bytes_per_second",
                {"instance": "n2", "probe": "nccl", "peer": ""},
            ): ("460e9x2 300e9x8"),
            S(
                "clusterhealth_probe_expected_bandwidth_bytes_per_second", {"instance": "n2", "probe": "nccl"}
            ): ("460e9x10"),
            S(
                "clusterhealth_probe_bandwidth_bytes_per_second",
                {"instance": "n3", "probe": "iperf", "peer": "s1"},
            ): ("5e8x10"),
            S(
                "clusterhealth_probe_expected_bandwidth_bytes_per_second",
                {"instance": "n3", "probe": "iperf"},
            ): ("1.25e9x10"),
        },
        [
            ("0m", []),
            (
                "5m",
                [
                    F({"instance": "n2", "probe": "nccl", "peer": ""}, "warning", 300e9),
                    F({"instance": "n3", "probe": "iperf", "peer": "s1"}, "warning", 5e8),
                ],
            ),
        ],
    ),
    Case(
        "FabricBandwidthDegraded",
        "a pairwise group's bad host fires once it failed with 3 clean partners; its partners, each "
        "short once with it, and the group's single degraded meetings do not",
        pairwise_group("h1"),
        [
            ("20m", []),
            ("50m", [F({"instance": "h1", "probe": "fabric", "pairwise": "host"}, "warning", 4, H1_IMPACT)]),
        ],
    ),
    Case(
        "NodeStraggler",
        "a pairwise group's bad host is the fabric's straggler once it failed with 3 clean partners "
        "for 10 minutes; its partners are not",
        pairwise_group("h1"),
        [
            ("20m", []),
            ("50m", []),
            ("59m", [F({"instance": "h1", "probe": "fabric", "pairwise": "host"}, "warning", 4, H1_IMPACT)]),
        ],
    ),
    Case(
        "ProbeFailing",
        "a pairwise group's failed meetings are its host rule's, not ProbeFailing's",
        pairwise_group("h1"),
        [("20m", []), ("50m", [])],
    ),
    Case(
        "NodeStraggler",
        "a busy GPU far below both medians, and a node far below its probe's fleet median, are "
        "stragglers; 9% below, idle GPUs, and a probe on two nodes are not",
        {
            **{
                S("clusterhealth_gpu_sm_clock_hertz", gpu(g, n)): f"{clock}x20"
                for n, g, clock in (
                    ("n1", "0", "1.98e9"),
                    ("n1", "1", "1.98e9"),
                    ("n1", "2", "1.1e9"),
                    ("n2", "0", "1.98e9"),
                    ("n2", "1", "1.98e9"),
                    ("n2", "2", "1.8e9"),
                    ("n3", "0", "3.45e8"),
                )
            },
            **{
                S("clusterhealth_gpu_utilization_ratio", gpu(g, n)): f"{util}x20"
                for n, g, util in (
                    ("n1", "0", 1),
                    ("n1", "1", 1),
                    ("n1", "2", 1),
                    ("n2", "0", 1),
                    ("n2", "1", 1),
                    ("n2", "2", 1),
                    ("n3", "0", 0.1),
                )
            },
            **{
                S("clusterhealth_gpu_info", gpu(g, n, name="H100")): "1x20"
                for n, g in (
                    ("n1", "0"),
                    ("n1", "1"),
                    ("n1", "2"),
                    ("n2", "0"),
                    ("n2", "1"),
                    ("n2", "2"),
                    ("n3", "0"),
                )
            },
            **{
                S(
                    "clusterhealth_probe_bandwidth_bytes_per_second",
                    {"instance": n, "probe": "nccl", "peer": ""},
                ): f"{bw}x20"
                for n, bw in (("n1", "460e9"), ("n2", "455e9"), ("n3", "300e9"))
            },
            **{
                S(
                    "clusterhealth_probe_bandwidth_bytes_per_second",
                    {"instance": n, "probe": "ib", "peer": ""},
                ): f"{bw}x20"
                for n, bw in (("n1", "50e9"), ("n2", "10e9"))
            },
        },
        [
            ("5m", []),
            (
                "15m",
                [
                    F(gpu("2", "n1", name="H100", signal="sm_clock"), "warning", 1.1e9),
                    F({"instance": "n3", "probe": "nccl", "peer": ""}, "warning", 300e9),
                ],
            ),
        ],
    ),
    Case(
        "NodeStraggler",
        "a busy GPU held down by a fault reason for a third of each minute is a straggler, whatever "
        "its sampled clock; a sixth of each minute (under 25%), a quarter exactly (the threshold is "
        "more than 25%), the power cap all the time, and an idle GPU held down half the time are not",
        {
            **{
                S(name, gpu(g, n, **extra)): values
                for n, g, util in (
                    ("n1", "0", 1),
                    ("n1", "1", 1),
                    ("n1", "2", 1),
                    ("n1", "3", 1),
                    ("n2", "0", 0.1),
                )
                for name, extra, values in (
                    ("clusterhealth_gpu_sm_clock_hertz", {}, "1.98e9x30"),
                    ("clusterhealth_gpu_utilization_ratio", {}, f"{util}x30"),
                    ("clusterhealth_gpu_info", {"name": "H100"}, "1x30"),
                )
            },
            S("clusterhealth_gpu_clocks_event_seconds_total", gpu("0", reason="hw_power_brake_slowdown")): (
                "0+20x30"
            ),
            S(
                "clusterhealth_gpu_clocks_event_seconds_total", gpu("1", reason="hw_thermal_slowdown")
            ): "0+10x30",
            S("clusterhealth_gpu_clocks_event_seconds_total", gpu("2", reason="sw_power_cap")): "0+60x30",
            # 15 s of each minute: a rate of exactly 0.25 (no extrapolation once the window is full).
            S(
                "clusterhealth_gpu_clocks_event_seconds_total", gpu("3", reason="hw_thermal_slowdown")
            ): "0+15x30",
            S("clusterhealth_gpu_clocks_event_seconds_total", gpu("0", "n2", reason="hw_thermal_slowdown")): (
                "0+30x30"
            ),
        },
        # rate() reaches a third once its 10-minute window is full (8m: 0.25), then 10 minutes pending.
        [("5m", []), ("17m", []), ("25m", [F(gpu("0", name="H100", signal="throttle"), "warning", 20 / 60)])],
    ),
    Case(
        "ProbeFailing",
        "a failed run fires; a degraded run is FabricBandwidthDegraded's; a passing run is quiet",
        {
            S("clusterhealth_probe_success", {"instance": "n1", "probe": "nccl"}): "1x2 0x8",
            S(
                "clusterhealth_probe_bandwidth_bytes_per_second",
                {"instance": "n1", "probe": "nccl", "peer": ""},
            ): ("460e9x10"),
            S(
                "clusterhealth_probe_expected_bandwidth_bytes_per_second", {"instance": "n1", "probe": "nccl"}
            ): ("460e9x10"),
            S("clusterhealth_probe_success", {"instance": "n2", "probe": "nccl"}): "0x10",
            S(
                "clusterhealth_probe_bandwidth_bytes_per_second",
                {"instance": "n2", "probe": "nccl", "peer": ""},
            ): ("100e9x10"),
            S(
                "clusterhealth_probe_expected_bandwidth_bytes_per_second", {"instance": "n2", "probe": "nccl"}
            ): ("460e9x10"),
            S("clusterhealth_probe_success", {"instance": "n3", "probe": "nccl"}): "1x10",
        },
        [("2m", []), ("6m", [F({"instance": "n1", "probe": "nccl"}, "warning", 0)])],
    ),
    Case(
        "NCCLTransportFallback",
        "sockets on a node with RDMA devices and SHM (all or some channels) on a node with an NVLink "
        "up fire once the run says so for a minute; sockets without RDMA devices, SHM with every "
        "NVLink down, and IB with P2P do not",
        {
            # n1 has RDMA devices; its run switched from IB to sockets at 5m (a new image).
            S("clusterhealth_rdma_device_info", {"instance": "n1", "device": "mlx5_0"}): "1x20",
            S("clusterhealth_rdma_device_info", {"instance": "n1", "device": "mlx5_1"}): "1x20",
            S(TRANSPORT, transport("n1", "IB", "true", "P2P")): "1x4",
            S(TRANSPORT, transport("n1", "Socket", "false", "P2P")): "_x5 1x15",
            # n2: Ethernet only, sockets are all it has.
            S(TRANSPORT, transport("n2", "Socket", "false", "")): "1x20",
            # n3: SHM with an NVLink up (the opt-in per-link flags); n4: mixed, with its links up
            # as the default series say (the GPU's NVLink rate); n5: SHM with its NVLinks down
            # (NVLinkDown's), a rate of 0.
            S("clusterhealth_gpu_nvlink_up", gpu("0", "n3", link="0")): "1x20",
            S("clusterhealth_gpu_nvlink_up", gpu("0", "n3", link="1")): "0x20",
            S(TRANSPORT, transport("n3", "", "", "SHM")): "1x20",
            S("clusterhealth_gpu_nvlink_rate_bytes_per_second", gpu("0", "n4")): "478116000000x20",
            S(TRANSPORT, transport("n4", "IB", "true", "mixed")): "1x20",
            S("clusterhealth_gpu_nvlink_rate_bytes_per_second", gpu("0", "n5")): "0x20",
            S("clusterhealth_gpu_nvlink_links_down", gpu("0", "n5")): "18x20",
            S(TRANSPORT, transport("n5", "", "", "SHM")): "1x20",
            # n6: what it should be.
            S("clusterhealth_rdma_device_info", {"instance": "n6", "device": "mlx5_0"}): "1x20",
            S("clusterhealth_gpu_nvlink_up", gpu("0", "n6", link="0")): "1x20",
            S(TRANSPORT, transport("n6", "IB", "true", "P2P")): "1x20",
        },
        [
            ("0m", []),
            (
                "3m",
                [
                    F(transport("n3", "", "", "SHM"), "warning", 1),
                    F(transport("n4", "IB", "true", "mixed"), "warning", 1),
                ],
            ),
            (
                "10m",
                [
                    F(transport("n1", "Socket", "false", "P2P"), "warning", 1),
                    F(transport("n3", "", "", "SHM"), "warning", 1),
                    F(transport("n4", "IB", "true", "mixed"), "warning", 1),
                ],
            ),
        ],
    ),
    Case(
        "ProbeFailing",
        "a run that fell back is NCCLTransportFallback's, failed or not; the same failure without "
        "the fallback fires",
        {
            S("clusterhealth_rdma_device_info", {"instance": "n1", "device": "mlx5_0"}): "1x10",
            S("clusterhealth_probe_success", {"instance": "n1", "probe": "nccl"}): "0x10",
            S(TRANSPORT, transport("n1", "Socket", "false", "P2P")): "1x10",
            S("clusterhealth_probe_success", {"instance": "n2", "probe": "nccl"}): "0x10",
            S(TRANSPORT, transport("n2", "IB", "true", "P2P")): "1x10",
        },
        [("5m", [F({"instance": "n2", "probe": "nccl"}, "warning", 0)])],
    ),
    Case(
        "FabricBandwidthDegraded",
        "a slow run that fell back to sockets is NCCLTransportFallback's",
        {
            S("clusterhealth_rdma_device_info", {"instance": "n1", "device": "mlx5_0"}): "1x10",
            S(
                "clusterhealth_probe_bandwidth_bytes_per_second",
                {"instance": "n1", "probe": "nccl", "peer": ""},
            ): ("20e9x10"),
            S(
                "clusterhealth_probe_expected_bandwidth_bytes_per_second", {"instance": "n1", "probe": "nccl"}
            ): ("460e9x10"),
            S(TRANSPORT, transport("n1", "Socket", "false", "P2P")): "1x10",
        },
        [("5m", [])],
    ),
    Case(
        "NodeCheckFailing",
        "CRITICAL and WARNING of checks without an alert of their own; gpu_xid has its own alert, and "
        "UNKNOWN is NodeCheckUnknown's",
        {
            S(
                "clusterhealth_check_status", {"instance": "n1", "check": "gpu_count", "subject": "node"}
            ): "2x20",
            S(
                "clusterhealth_check_status", {"instance": "n2", "check": "hca_firmware", "subject": "mlx5_7"}
            ): ("1x20"),
            S(
                "clusterhealth_check_status", {"instance": "n2", "check": "gpu_count", "subject": "node"}
            ): "0x20",
            S("clusterhealth_check_status", {"instance": "n3", "check": "gpu_xid", "subject": "2"}): "2x20",
            S(
                "clusterhealth_check_status", {"instance": "n3", "check": "hca_count", "subject": "mlx5_.*"}
            ): "3x20",
        },
        [
            ("0m", []),
            ("3m", [F({"instance": "n1", "check": "gpu_count", "subject": "node"}, "critical", 2)]),
            (
                "15m",
                [
                    F({"instance": "n1", "check": "gpu_count", "subject": "node"}, "critical", 2),
                    F({"instance": "n2", "check": "hca_firmware", "subject": "mlx5_7"}, "warning", 1),
                ],
            ),
        ],
    ),
    Case(
        "NodeCheckUnknown",
        "an UNKNOWN check (the kernel log unreadable) fires after 10m, its GPU present (gpu_lost OK); "
        "OK, CRITICAL and a lost GPU's checks do not",
        {
            S("clusterhealth_check_status", {"instance": "n1", "check": "gpu_xid", "subject": "0"}): "3x20",
            S("clusterhealth_check_status", {"instance": "n1", "check": "gpu_lost", "subject": "0"}): "0x20",
            S("clusterhealth_check_status", {"instance": "n2", "check": "gpu_xid", "subject": "0"}): "0x20",
            S("clusterhealth_check_status", {"instance": "n2", "check": "gpu_xid", "subject": "1"}): "2x20",
            # GPU 6 is lost: its other checks cannot run, and GPUFellOffBus already alerts.
            S("clusterhealth_check_status", {"instance": "n2", "check": "gpu_lost", "subject": "6"}): "2x20",
            S("clusterhealth_check_status", {"instance": "n2", "check": "gpu_vbios", "subject": "6"}): "3x20",
        },
        [("5m", []), ("15m", [F({"instance": "n1", "check": "gpu_xid", "subject": "0"}, "warning", 3)])],
    ),
    Case(
        "",
        "h1 is bad, every meeting with it fails: named with its 4 partners, none of whom is named; "
        "in group hostthree h1 fails with its first three partners and is fine with h5: named with "
        "3, as many as the rule needs; "
        "h2 and h5 fail together (a meeting and its confirmation) and are fine with others: a path, "
        "nobody is named (analyze's job); every meeting fails: nobody is clean, nobody is named (a "
        "fleet-wide finding); before h1's third short meeting, nobody",
        {
            **node_infos(),
            **host_fault(),
            **meetings("hostthree", lambda a, b: "h1" in (a, b) and "h5" not in (a, b)),
            **path_fault(),
            **meetings("slowfleet", lambda a, b: True),
        },
        exprs=[
            Expr("50m", pairwise_host(Config()), [Sample(SUSPECT, 4), Sample(SUSPECT_OF_THREE, 3)]),
            Expr("20m", pairwise_host(Config()), []),
        ],
        title="the pairwise host rule",
    ),
]
