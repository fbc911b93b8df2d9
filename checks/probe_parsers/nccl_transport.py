"""Which transports NCCL used, read from its ``NCCL_DEBUG=INFO`` lines.

NCCL logs how it connected each pair of ranks when it sets a channel up, and which network it
chose when a communicator starts. What is read, and from which lines (every form below is in a real
capture under tests/fixtures/nccl-tests, with its source in that folder's README):

* The network (``net``), first from the channels that really carried data, then from what NCCL
  chose, then from the devices a network transport listed at start-up. NCCL loads a network and
  says ``Using network Socket`` (or IB) in a single-node run too, whose channels then all stay
  inside the node: ``net`` is None, and nothing is said of GPUDirect RDMA, when NCCL's communicator
  spans one node (``comm 0x... rank 0 nRanks 8 nNodes 1 ...``, NCCL 2.20 and later) or, without
  that line, when channels between GPUs were set up and none went through the network (a cut
  capture of a multi-node run whose lines say ``nNodes 2`` keeps what NCCL chose):

  - ``Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA`` (``Ring 00 : ...`` before NCCL 2.5,
    ``Channel 00 : ...`` before the connection index was printed). NCCL's format is
    ``via NET/<name>/<dev>[(<proxy rank>)][/GDRDMA][(PCI)][/Shared]`` (src/transport/net.cc);
  - ``Using network IB`` (NCCL 2.6 and later print it for every rank);
  - ``NET/IB : Using [0]mlx5_0:1/IB ...`` and ``NET/Socket : Using [0]eth0:...``: NCCL 2.4 printed
    the socket line for every process, IB in use or not, so an IB line wins over a socket line.

  The name is NCCL's, but for two plugins that name themselves several ways: aws-ofi-nccl is
  "AWS Libfabric" (1.11 and before), "Libfabric" or "OFI" (it renames itself to match NCCL_NET),
  all ``OFI``; the RDMA/SHARP plugin of HPC-X is "IBext" or "IBext_v8", InfiniBand verbs like
  NCCL's own, so ``IB``. Any other name is kept as printed.
* Whether GPUDirect RDMA is used on network channels (``gdrdma``): true when a network channel says
  ``/GDRDMA`` (NCCL may use it on the receive side only, ``NCCL_NET_GDR_READ=0``: still in use),
  false when network channels exist and none does. Without channel lines, NCCL's own verdict at
  start-up: ``NET/IB : GPU Direct RDMA Enabled for GPU ...`` (true) or only ``... Disabled for ...``
  lines (false).
* The intra-node transport (``intra``), from the channels between GPUs of one node: ``P2P`` for
  ``via P2P/IPC``, ``P2P/CUMEM``, ``P2P/direct pointer`` (with or without ``/read``); ``SHM`` for
  ``via SHM/...`` (NCCL 2.13 and later) or ``via direct shared memory`` (NCCL 2.3 to 2.12) (peer
  access is off, so data goes through host memory); ``NVLS`` once NVLink
  SHARP buffers are set up (``NVLS comm 0x... headRank ...``), which only NVSwitch systems with
  peer access have. ``mixed`` when the channels disagree on peer access: some pairs of GPUs are
  connected through P2P or NVLS and others through SHM, as when only the GPUs behind one PCIe
  switch can reach each other.

Anything the output does not say is None: a capture without INFO lines says nothing, a single-node
run whose channels never use the network says nothing about GPUDirect RDMA.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

Intra = Literal["P2P", "SHM", "NVLS", "mixed"]
INTRA_VALUES: tuple[Intra, ...] = ("P2P", "SHM", "NVLS", "mixed")

# `via NET/<name>/<dev>...`; the name may hold spaces ("AWS Libfabric") but no slash.
_NET_CHANNEL = re.compile(r"\bvia NET/(?P<name>[^/]+)/\d+(?P<rest>\S*)")
_USING_NETWORK = re.compile(r"\bNCCL INFO Using network (?P<name>.+?)\s*$")
_NET_DEVICES = re.compile(r"\bNCCL INFO NET/(?P<name>\w+) : Using \[")
_GDR_ENABLED = re.compile(r"\bGPU Direct RDMA Enabled for\b")
_GDR_DISABLED = re.compile(r"\bGPU Direct RDMA Disabled for\b")
_P2P_CHANNEL = re.compile(r"\bvia P2P/")
# NCCL 2.13 renamed `via direct shared memory` (src/transport/shm.cc) to `via SHM/<send>/<recv>`.
_SHM_CHANNEL = re.compile(r"\bvia (?:SHM/|direct shared memory\b)")
_NVLS_SETUP = re.compile(r"\bNCCL INFO NVLS comm 0x")
_NODES = re.compile(r"\bNCCL INFO comm 0x[0-9a-f]+ rank \d+ nRanks \d+ nNodes (?P<nodes>\d+)\b")
_INFO = re.compile(r"\bNCCL INFO\b")

# Plugins' names for themselves -> the transport family reported.
_OFI_NAMES = frozenset({"aws libfabric", "libfabric", "ofi"})
_IB_PLUGIN = re.compile(r"IBext(?:_v\d+)?")


@dataclass(frozen=True)
class Transport:
    """What NCCL's INFO lines say about the transports of a run; None where they say nothing."""

    net: str | None = None
    gdrdma: bool | None = None
    intra: Intra | None = None

    @property
    def said(self) -> bool:
        """Whether the output said anything about the transport."""
        return self.net is not None or self.gdrdma is not None or self.intra is not None

    def to_dict(self) -> dict[str, Any]:
        return {"net": self.net, "gdrdma": self.gdrdma, "intra": self.intra}

    @classmethod
    def from_dict(cls, data: Any) -> Transport:
        """A transport as `to_dict` wrote it (a state file); ValueError when it is not one."""
        if not isinstance(data, dict) or set(data) != {"net", "gdrdma", "intra"}:
            raise ValueError(f"not a transport: {data!r}")
        net, gdrdma, intra = data["net"], data["gdrdma"], data["intra"]
        if not (net is None or isinstance(net, str)) or not (gdrdma is None or isinstance(gdrdma, bool)):
            raise ValueError(f"not a transport: {data!r}")
        if intra is not None and intra not in INTRA_VALUES:
            raise ValueError(f"unknown intra-node transport {intra!r}")
        return cls(net, gdrdma, intra)


def network_family(name: str) -> str:
    """The transport a network plugin's name stands for (see the module's docstring)."""
    name = name.strip()
    if name.lower() in _OFI_NAMES:
        return "OFI"
    if _IB_PLUGIN.fullmatch(name):
        return "IB"
    return name


class TransportReader:
    """Reads NCCL INFO lines one at a time (launcher prefixes may remain); `result()` says what
    they told."""

    def __init__(self) -> None:
        self._channel_nets: Counter[str] = Counter()
        self._gdr_channels = 0
        self._chosen_nets: Counter[str] = Counter()
        self._device_nets: Counter[str] = Counter()
        self._gdr_enabled = False
        self._gdr_disabled = False
        self._p2p = False
        self._shm = False
        self._nvls = False
        self._nodes: int | None = None

    def line(self, line: str) -> bool:
        """Read one line; False if it is not an NCCL INFO line (nothing read)."""
        if not _INFO.search(line):
            return False
        if match := _NET_CHANNEL.search(line):
            self._channel_nets[network_family(match.group("name"))] += 1
            if "/GDRDMA" in match.group("rest"):
                self._gdr_channels += 1
        elif match := _USING_NETWORK.search(line):
            self._chosen_nets[network_family(match.group("name"))] += 1
        elif match := _NET_DEVICES.search(line):
            self._device_nets[network_family(match.group("name"))] += 1
        elif _GDR_ENABLED.search(line):
            self._gdr_enabled = True
        elif _GDR_DISABLED.search(line):
            self._gdr_disabled = True
        elif _P2P_CHANNEL.search(line):
            self._p2p = True
        elif _SHM_CHANNEL.search(line):
            self._shm = True
        elif _NVLS_SETUP.search(line):
            self._nvls = True
        elif match := _NODES.search(line):
            self._nodes = max(self._nodes or 0, int(match.group("nodes")))
        return True

    def result(self) -> Transport:
        return Transport(self._net(), self._gdrdma(), self._intra())

    def _inside_one_node(self) -> bool:
        """Whether the run used no network: one node, or GPU channels and none through the network."""
        if self._channel_nets:
            return False
        if self._nodes is not None:
            return self._nodes == 1
        return self._p2p or self._shm

    def _net(self) -> str | None:
        if self._inside_one_node():
            return None
        for seen in (self._channel_nets, self._chosen_nets):
            if seen:
                return seen.most_common(1)[0][0]
        if not self._device_nets:
            return None
        # NCCL 2.4 listed its socket devices whatever it then used.
        others = Counter({name: n for name, n in self._device_nets.items() if name != "Socket"})
        return (others or self._device_nets).most_common(1)[0][0]

    def _gdrdma(self) -> bool | None:
        if self._inside_one_node():
            return None
        if self._channel_nets:
            return self._gdr_channels > 0
        if self._gdr_enabled:
            return True
        return False if self._gdr_disabled else None

    def _intra(self) -> Intra | None:
        peer = self._p2p or self._nvls
        if self._shm:
            return "mixed" if peer else "SHM"
        if self._nvls:
            return "NVLS"
        return "P2P" if self._p2p else None


def read_transport(text: str) -> Transport:
    """What the INFO lines of a whole output say."""
    reader = TransportReader()
    for line in text.splitlines():
        reader.line(line)
    return reader.result()
