"""Whether a run's NCCL transport is a fallback on this node: sockets where the node has RDMA
devices, shared memory where its GPUs have NVLink.

NCCL falls back silently: without libibverbs in the container, with NCCL_IB_DISABLE set or its HCAs
invisible it moves every byte over TCP sockets; without peer access between GPUs (NCCL_P2P_DISABLE,
GPUs in separate containers, ACS on a PCIe switch) it copies through host shared memory. The run
still finishes, slower, and a baseline learned from such runs would hide it.

The node's facts are the ones the agent already reads and exports: its RDMA devices in sysfs
(`class/infiniband`, as the rdma collector selects them: clusterhealth_rdma_device_info) and its
active NVLink links as the gpu collector last read them (by default exported per GPU as
clusterhealth_gpu_nvlink_rate_bytes_per_second, one link's speed times the links up; per link, opt-in,
as clusterhealth_gpu_nvlink_up). Not a probe setting: the hardware says what NCCL should have used,
on every node alike, and the alert NCCLTransportFallback asks the same facts in PromQL, so the alert
and the probe's result agree (where a driver lacks the NVLink speed field and the per-link flags are
off, the alert cannot see the links and the degraded run shows as ProbeFailing).
A node whose facts are unknown (sysfs unreadable, the gpu collector not run yet) is not judged.
A run whose output does not say (no NCCL_DEBUG=INFO) is not judged either: that is how a probe
opts out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterhealth.checks.probe_parsers.nccl_transport import Transport
from clusterhealth.exporters.gpu import GpuState
from clusterhealth.exporters.infiniband import NO_COUNTERS, read_rdma_devices

# How many device names a reason lists before it counts the rest.
_NAMES_SHOWN = 4


@dataclass(frozen=True)
class NodeLinks:
    """What this node offers NCCL beyond sockets and shared memory, each in a few words for a
    reason ("RDMA devices mlx5_0, mlx5_1"), or None when it has none or that is not known."""

    rdma: str | None = None
    nvlink: str | None = None

    @classmethod
    def of(cls, rdma_devices: Sequence[str] | None, nvlinks_up: int | None) -> NodeLinks:
        rdma = None
        if rdma_devices:
            names = ", ".join(rdma_devices[:_NAMES_SHOWN])
            more = len(rdma_devices) - _NAMES_SHOWN
            rdma = f"RDMA devices ({names}{f' and {more} more' if more > 0 else ''})"
        nvlink = f"{nvlinks_up} NVLink links up" if nvlinks_up else None
        return cls(rdma, nvlink)


def fallback(transport: Transport, node: NodeLinks) -> str | None:
    """Why the run's transport falls short of what the node has, or None."""
    reasons = []
    if transport.net == "Socket" and node.rdma is not None:
        reasons.append(f"NCCL used sockets (NET/Socket) although the node has {node.rdma}")
    if transport.intra in ("SHM", "mixed") and node.nvlink is not None:
        which = "its GPUs" if transport.intra == "SHM" else "some of its GPUs"
        reasons.append(
            f"NCCL connected {which} through shared memory (SHM) although the node has "
            f"{node.nvlink}: peer access is off"
        )
    return "; ".join(reasons) or None


def read_node_links(
    sysfs_root: Path | None, selects: Callable[[str], bool], gpus: GpuState | None
) -> NodeLinks:
    """The node's facts: RDMA devices under `sysfs_root` that `selects` keeps (None: the rdma
    collector is off, not known), and the active NVLink links of `gpus` (None: not read yet)."""
    devices: list[str] | None = None
    if sysfs_root is not None:
        try:
            devices = [d.name for d in read_rdma_devices(sysfs_root, counters=NO_COUNTERS, selects=selects)]
        except OSError:
            devices = None  # FileNotFoundError too: no RDMA stack, nothing to fall back from
    links = None
    if gpus is not None:
        links = sum(link.up for gpu in gpus.readings for link in gpu.nvlinks)
    return NodeLinks.of(devices, links)
