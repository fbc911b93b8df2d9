"""Fuzzing the sysfs reader (issue 11): whatever the files hold, nothing escapes but the documented error.

`read_rdma_devices` documents one error: FileNotFoundError (or the error listing it) when
class/infiniband itself cannot be listed. Below it, a file holding any bytes, a file replaced by a
directory, a FIFO, a dangling symlink or nothing at all costs that value only: the test checks
that every counter the damage did not touch is still read with its value, and that the collector's
families render. The number of examples is bounded so `make test` stays short.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from clusterhealth.exporters import infiniband
from clusterhealth.exporters.infiniband import (
    COUNTER_MAX,
    RdmaDevice,
    parse_pcie_generation,
    parse_pcie_width,
    parse_rate,
    parse_state,
    read_rdma_devices,
)
from clusterhealth.exporters.rdma import RdmaCollector

from .test_rdma_parser import CLUSTER, copy_devices

# Text that looks like what the kernel prints, with its numbers mangled, beside arbitrary text.
NUMBERISH = st.from_regex(
    r"-?[0-9]{0,40}(\.[0-9]{0,5})?( Gb/sec| GT/s( PCIe)?|: [A-Za-z]{0,8})?"
    r"( \([0-9]{0,6}X( [A-Z]{0,4})?\))?\n?",
    fullmatch=True,
)
TEXT = st.one_of(st.text(max_size=60), NUMBERISH)
CONTENT = st.one_of(st.binary(max_size=80), TEXT.map(str.encode), st.just(b"9" * 5000))


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_text_parsers_return_a_bounded_value_or_none(text: str) -> None:
    state = parse_state(text)
    assert state is None or 0 <= state[0] <= 999
    rate = parse_rate(text)
    assert rate is None or 0 <= rate[0] <= 10**16 // 8
    assert parse_pcie_generation(text) in (None, 1, 2, 3, 4, 5, 6)
    width = parse_pcie_width(text)
    assert width is None or 1 <= width <= 999


@settings(max_examples=400, deadline=None)
@given(CONTENT)
def test_counter_values_are_64_bit_unsigned_decimals(raw: bytes) -> None:
    value = infiniband._counter_value(raw.strip())
    assert value is None or 0 <= value <= COUNTER_MAX
    if value is not None:
        assert raw.strip().isdigit() and value == int(raw)


# --- whole trees ------------------------------------------------------------------------------

DAMAGE = st.sampled_from(["content", "directory", "fifo", "missing", "dangling", "loop"])
# Each example copies a tree of ~200 entries: on tmpfs that is ten times faster than on a disk.
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@pytest.fixture(scope="module")
def pristine() -> Iterator[Path]:
    """A writable copy of two HCAs of the cluster-node tree: one InfiniBand, one RoCE."""
    with tempfile.TemporaryDirectory(prefix="rdma-fuzz-", dir=SCRATCH) as tmp:
        yield copy_devices(CLUSTER, Path(tmp), "mlx5_0", "mlx5_8")


def entries(root: Path) -> list[str]:
    """Every file and directory under the devices' PCI functions and class/net, relative to root."""
    found = []
    for path in sorted((root / "devices").rglob("*")):
        if not path.is_symlink():
            found.append(str(path.relative_to(root)))
    return found


def damage(path: Path, how: str, content: bytes) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if how == "content":
        path.write_bytes(content)
    elif how == "directory":
        path.mkdir()
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "dangling":
        path.symlink_to("nowhere")
    elif how == "loop":
        path.symlink_to(path.name)


def counters(devices: list[RdmaDevice]) -> dict[tuple[str, int, str], int]:
    out = {}
    for device in devices:
        for port in device.ports:
            by_file = port.counters.by_file() if port.counters is not None else {}
            raw = {**by_file, **{f"hw:{k}": v for k, v in port.hw_counters.items()}}
            for file, value in raw.items():
                out[(device.name, port.number, file)] = value
    return out


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.data())
def test_damaged_trees_lose_only_the_damaged_values(pristine: Path, data: st.DataObject) -> None:
    baseline = read_rdma_devices(pristine)
    candidates = entries(pristine)
    with tempfile.TemporaryDirectory(prefix="rdma-fuzz-", dir=SCRATCH) as tmp:
        tree = Path(tmp) / "sys"
        shutil.copytree(pristine, tree, symlinks=True)
        damaged: list[str] = []
        for relative in data.draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=4, unique=True)):
            if not any(relative.startswith(d + "/") for d in damaged):  # not inside what is gone
                damaged.append(relative)
                damage(tree / relative, data.draw(DAMAGE), data.draw(CONTENT))

        devices = read_rdma_devices(tree)  # must not raise
        families = RdmaCollector(tree).collect() if devices else []
        generate_latest(_Families(families))  # type: ignore[arg-type]

    # Every counter whose file (and directories above it) escaped damage keeps its value.
    function_of = {d.name: os.path.realpath(pristine / "class/infiniband" / d.name) for d in baseline}
    read = counters(devices)
    for (device, port, file), value in counters(baseline).items():
        folder = "hw_counters" if file.startswith("hw:") else "counters"
        path = f"{function_of[device]}/ports/{port}/{folder}/{file.removeprefix('hw:')}"
        relative = os.path.relpath(path, pristine)
        if not any(relative == d or relative.startswith(d + "/") for d in damaged):
            assert read.get((device, port, file)) == value, (relative, damaged)


class _Families:
    def __init__(self, families: list[object]):
        self._families = families

    def collect(self) -> list[object]:
        return self._families
