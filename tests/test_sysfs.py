"""exporters/sysfs.py: every exporter that reads /sys reads through it, with its bounds and errno policy.

The RDMA reader's own cases (held files, the descriptor budget, a counter the kernel refuses) are
in test_rdma_parser.py; these check that the PCI, AER and MTU readers take the same path.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clusterhealth.exporters import sysfs
from clusterhealth.exporters.netdev import read_netdev_mtus
from clusterhealth.exporters.pci import nvidia_gpu_functions
from clusterhealth.exporters.pcie_aer import read_aer_functions

CLUSTER = Path(__file__).parent / "fixtures" / "sysfs" / "cluster-node" / "sys"
GPU = "0000:1b:00.0"  # GPU 0 of the tree, bound to nvidia, with AER statistics
GPU_FILES = f"bus/pci/devices/{GPU}"
GPUS = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0", "0000:9d:00.0"]  # the first five


FIFOS = (f"{GPU_FILES}/aer_dev_fatal", f"{GPU_FILES}/class", "class/net/eno3/mtu")


@pytest.fixture(scope="module")
def fifo_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster node with FIFOs in place of one AER file, one PCI class and one MTU."""
    copy = tmp_path_factory.mktemp("fifos") / "sys"
    shutil.copytree(CLUSTER, copy, symlinks=True)
    for fifo in FIFOS:
        path = Path(os.path.realpath(copy / fifo))
        path.unlink()
        os.mkfifo(path)
    return copy


def aer_classes(tree: Path) -> list[str]:
    by_address = {f.address: f for f in read_aer_functions(tree, ["nvidia"])}
    return sorted(by_address[GPU].counts)


def gpus(tree: Path) -> list[str]:
    return nvidia_gpu_functions(tree)[:4]


def mtu_names(tree: Path) -> list[str]:
    return sorted(read_netdev_mtus(tree))[:2]


# (a reader, the file made to fail, what the reader returns, what it returns then)
READERS: list[tuple[Callable[[Path], Any], str, Any, Any]] = [
    (
        aer_classes,
        f"{GPU_FILES}/aer_dev_fatal",
        ["correctable", "fatal", "nonfatal"],
        ["correctable", "nonfatal"],
    ),
    (gpus, f"{GPU_FILES}/class", GPUS[:4], GPUS[1:]),
    (mtu_names, "class/net/eno3/mtu", ["eno3", "enp170s0f0np0"], ["enp170s0f0np0", "enp170s0f1np1"]),
]


@pytest.mark.parametrize(("read", "failing", "intact", "without"), READERS, ids=["aer", "pci_class", "mtu"])
@pytest.mark.parametrize("code", [errno.EACCES, errno.EIO, errno.EINVAL])
def test_a_file_the_kernel_refuses_is_left_out_by_every_reader(
    monkeypatch: pytest.MonkeyPatch,
    read: Callable[[Path], Any],
    failing: str,
    intact: Any,
    without: Any,
    code: int,
) -> None:
    assert read(CLUSTER) == intact
    target = os.path.realpath(CLUSTER / failing)

    def refusing_open(file: str | bytes, flags: int, dir_fd: int | None = None) -> int:
        if dir_fd is None and os.path.realpath(file) == target:
            raise OSError(code, os.strerror(code), file)
        return os.open(file, flags, dir_fd=dir_fd)

    # Root reads through chmod 000, so the error is raised by a stand-in for the layer's one open.
    monkeypatch.setattr(sysfs, "_open", refusing_open)
    assert read(CLUSTER) == without


@pytest.mark.parametrize(
    ("read", "expected"),
    [
        # An empty AER file is present with no count: the class is listed without a total.
        (aer_classes, ["correctable", "fatal", "nonfatal"]),
        (gpus, GPUS[1:]),
        (mtu_names, ["enp170s0f0np0", "enp170s0f1np1"]),
    ],
    ids=["aer", "pci_class", "mtu"],
)
def test_a_fifo_in_the_tree_reads_as_empty_instead_of_blocking(
    fifo_tree: Path, read: Callable[[Path], Any], expected: Any
) -> None:
    result: list[Any] = []
    reader = threading.Thread(target=lambda: result.append(read(fifo_tree)), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "the read blocked on a FIFO"
    assert result == [expected]


def test_reads_are_bounded_and_never_raise(tmp_path: Path) -> None:
    attribute = tmp_path / "attribute"
    attribute.write_bytes(b"  12345 \n" + b"x" * (2 * sysfs.MAX_ATTRIBUTE_BYTES))
    assert sysfs.read_raw(str(attribute), limit=8) == b"12345"
    assert sysfs.read_raw(str(attribute)) == b"12345 \n" + b"x" * (sysfs.MAX_ATTRIBUTE_BYTES - 9)
    assert sysfs.read_raw(str(tmp_path / "absent")) == sysfs.Failure("ENOENT")
    assert sysfs.read_raw(str(tmp_path)) == sysfs.Failure("EISDIR")
    assert sysfs.read_raw(str(attribute / "below")) == sysfs.Failure("ENOTDIR")
