"""Fuzzed parsers: whatever the input, no exception escapes but the parser's own documented error.

The probe-output parsers, the kernel-log line parser, the /dev/kmsg record parser and reader, and
the config loader (its `policy:` section included) are fed random input and the real captures of
tests/fixtures/ mutated (cut short, spliced, numbers made absurd, JSON leaves replaced). The number
of examples is bounded and the examples are derandomized (the profile tests/conftest.py loads), so
`make test` stays fast and repeatable; `CLUSTERHEALTH_FUZZ=explore` runs many more, from a random
seed, to hunt for new failures.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import math
import os
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from clusterhealth.agent import config as configuration
from clusterhealth.checks.kernel_log import EventKind, KernelEvent, normalize_pci_bus_id, parse_line
from clusterhealth.checks.kmsg import MAX_RECORD_BYTES, KmsgReader, KmsgRecord, parse_record
from clusterhealth.checks.probe_parsers import parse

from .conftest import FIXTURES, ROOT


def _captures(folder: str, suffix: str) -> list[str]:
    return [p.read_text(encoding="utf-8") for p in sorted((FIXTURES / folder).glob(f"*{suffix}"))]


NCCL_TESTS = _captures("nccl-tests", ".txt")
IPERF3 = _captures("iperf3", ".json")
IPERF3_TERMINAL = _captures("iperf3", ".txt")  # copied from a terminal: debris around the JSON
IB_WRITE_BW = _captures("ib_write_bw", ".txt")
NVBANDWIDTH = _captures("nvbandwidth", ".txt")
KMSG_LINES = [
    row.split("\t", 1)[1]
    for row in (FIXTURES / "kmsg" / "lines.txt").read_text(encoding="utf-8").splitlines()
] + [e["line"] for e in json.loads((FIXTURES / "kmsg" / "extra_lines.json").read_text(encoding="utf-8"))]
KMSG_RECORDS = (FIXTURES / "kmsg" / "kmsg_records.txt").read_bytes().splitlines(keepends=True)
SAMPLE_CONFIG = (ROOT / "deploy" / "clusterhealth.yaml").read_text(encoding="utf-8")
POLICY_EXAMPLE = """\
policy:
  mtu:
    - {interfaces: "ibp.*", mtu: 4092}
    - {interfaces: "enp.*np[0-9]", mtu: 9000}
  rdma_ports:
    - {devices: "mlx5_[0-7]", link_layer: InfiniBand, rate_gbps: 400}
    - {devices: ".*"}
  hca_count: [{devices: "mlx5_[0-7]", count: 8}]
  gpu_count: 8
  firmware:
    hca: {MT_0000000838: "28.39.1002"}
    gpu_driver: "550.90.07"
"""
assert NCCL_TESTS and IPERF3 and IPERF3_TERMINAL and IB_WRITE_BW and KMSG_RECORDS


# --- mutations of real captures -------------------------------------------------------------------

ABSURD = st.sampled_from(
    ["9" * 5000, "-" + "9" * 400, "1e400", "nan", "-inf", "0x" + "f" * 40, "\x00", "\\x", "٣", "²", ""]
)


@st.composite
def mutated(draw: st.DrawFn, texts: list[str]) -> str:
    """A real capture, cut, spliced, with lines dropped or doubled, or a number made absurd."""
    text = draw(st.sampled_from(texts))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["cut", "insert", "number", "drop_line", "double_line", "junk_line"]))
        at = draw(st.integers(0, len(text)))
        if how == "cut":
            text = text[:at]
        elif how == "insert":
            text = text[:at] + draw(st.text(max_size=40)) + text[at:]
        elif how == "number":
            digits = [i for i, c in enumerate(text) if c.isdigit()]
            if digits:
                i = digits[at % len(digits)]
                j = i
                while j < len(text) and (text[j].isdigit() or text[j] == "."):
                    j += 1
                text = text[:i] + draw(ABSURD) + text[j:]
        else:
            lines = text.splitlines(keepends=True)
            if lines:
                k = at % len(lines)
                if how == "drop_line":
                    del lines[k]
                elif how == "double_line":
                    lines.insert(k, lines[k])
                else:
                    lines.insert(k, draw(st.text(max_size=80)) + "\n")
            text = "".join(lines)
    return text


JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=10,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found += _paths(child, (*prefix, i))
    return found


_HUGE = "<a number of 5000 digits>"


@st.composite
def json_mutated(draw: st.DrawFn, texts: list[str]) -> str:
    """A real JSON capture with some values replaced by other JSON values (wrong types, absurd)."""
    document = json.loads(draw(st.sampled_from(texts)))
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(_paths(document)))
        replacement = draw(JSON_VALUES | st.sampled_from([_HUGE, -1, 0, 1e308]))
        if not path:
            document = replacement
            continue
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = replacement
    # A number of thousands of digits, which json.loads refuses to turn into an int.
    return json.dumps(document).replace(json.dumps(_HUGE), "9" * 5000)


# --- probe outputs ----------------------------------------------------------------------------------


def _check_probe_result(kind: str, text: str) -> None:
    result = parse(kind, text)  # documented: bad text never raises
    assert result.verdict in ("ok", "wrong_results", "failed", "incomplete")
    json.dumps(result.to_dict(), allow_nan=False)  # what `probe parse` prints is strict JSON
    for figure in (result.bandwidth_bytes_per_second, result.peak_bandwidth_bytes_per_second):
        assert figure is None or (math.isfinite(figure) and figure >= 0), figure


@st.composite
def tails(draw: st.DrawFn, texts: list[str]) -> str:
    """The end of a real capture from one of its lines on, as `kubectl logs --tail` gives it."""
    lines = draw(st.sampled_from(texts)).splitlines(keepends=True)
    return "".join(lines[draw(st.integers(0, len(lines))) :])


@given(st.text() | mutated(NCCL_TESTS) | tails(NCCL_TESTS))
@example(NCCL_TESTS[0])
def test_nccl_tests_parser(text: str) -> None:
    _check_probe_result("nccl-tests", text)


def _after_the_header(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    header = max(i for i, line in enumerate(lines) if "size" in line and "count" in line and "type" in line)
    return lines[header + 1 :]


WITH_HEADER = [text for text in NCCL_TESTS if parse("nccl-tests", text).rows and "(elements)" in text]


@given(st.sampled_from(WITH_HEADER), st.integers(min_value=0))
def test_a_tail_without_the_header_reads_the_same_rows(text: str, at: int) -> None:
    table = _after_the_header(text)
    tail = "".join(table[at % len(table) :])
    rows = parse("nccl-tests", tail).to_dict()["rows"]
    whole = parse("nccl-tests", text).to_dict()["rows"]
    assert rows == whole[len(whole) - len(rows) :]


# What a terminal leaves around a command's output: no "{" (so no JSON) and no iperf3 error line.
DEBRIS = st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=60).filter(
    lambda t: "iperf3: error - " not in t
)


@given(st.text() | mutated(IPERF3 + IPERF3_TERMINAL) | json_mutated(IPERF3) | tails(IPERF3_TERMINAL))
@example(IPERF3[0])
@example(IPERF3_TERMINAL[0])
def test_iperf3_parser(text: str) -> None:
    _check_probe_result("iperf3", text)


@given(DEBRIS, st.sampled_from(IPERF3), DEBRIS)
def test_iperf3_json_reads_the_same_amid_terminal_debris(before: str, text: str, after: str) -> None:
    assert parse("iperf3", before + text + "\n" + after).to_dict() == parse("iperf3", text).to_dict()


@given(st.text() | mutated(IB_WRITE_BW))
@example(IB_WRITE_BW[0])
def test_ib_write_bw_parser(text: str) -> None:
    _check_probe_result("ib_write_bw", text)


@given(st.text() | mutated(NVBANDWIDTH))
@example(NVBANDWIDTH[1])
def test_nvbandwidth_parser(text: str) -> None:
    _check_probe_result("nvbandwidth", text)


# --- kernel log ---------------------------------------------------------------------------------------

EVENT_KINDS = set(get_args(EventKind))


@given(st.text() | mutated(KMSG_LINES))
@example(KMSG_LINES[0])
def test_kernel_log_line_parser(line: str) -> None:
    event = parse_line(line)
    if event is None:
        return
    assert isinstance(event, KernelEvent) and event.kind in EVENT_KINDS
    assert event.code is None or 0 <= event.code < 1_000_000
    if event.pci is not None and event.kind not in ("xid", "sxid"):
        normalize_pci_bus_id(event.pci)  # a device's bus id (NVRM prints shorter forms of its own)


# The kernel's text of every real event line, and what log tools put before it in those lines.
KMSG_EVENTS = [(line, event) for line in KMSG_LINES if (event := parse_line(line)) is not None]
KMSG_PREFIXES = sorted({line[: line.index(event.message)] for line, event in KMSG_EVENTS})
# Text a tool could put before a line, with no ':' so it cannot itself hold a kernel event.
TOOL_TEXT = st.text(alphabet=st.characters(blacklist_characters=":\n\r"), max_size=40).map(lambda t: t + " ")


@given(st.sampled_from(KMSG_EVENTS), st.sampled_from(KMSG_PREFIXES) | TOOL_TEXT)
@example(KMSG_EVENTS[0], "")
def test_an_event_is_the_same_whatever_stands_before_it(real: tuple[str, KernelEvent], prefix: str) -> None:
    _, event = real
    assert parse_line(prefix + event.message) == event


@given(st.binary() | mutated([r.decode("utf-8", "replace") for r in KMSG_RECORDS]).map(str.encode))
@example(KMSG_RECORDS[0])
def test_kmsg_record_parser(raw: bytes) -> None:
    record = parse_record(raw)
    if record is not None:
        assert isinstance(record, KmsgRecord)
        assert 0 <= record.priority <= 7 and 0 <= record.facility < 256
        assert 0 <= record.sequence < 1 << 64 and 0 <= record.timestamp_us < 1 << 64


@given(st.lists(st.binary(max_size=300) | st.sampled_from(KMSG_RECORDS), max_size=30))
def test_kmsg_reader_on_a_fuzzed_file(tmp_path: Path, chunks: list[bytes]) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes(b"".join(chunks))
    with KmsgReader(str(path)) as reader:
        read = 0
        while batch := reader.read_available(7):
            assert len(batch) <= 7
            read += len(batch)
        assert len(reader._buffer) <= MAX_RECORD_BYTES
    assert read + reader.malformed_records <= sum(chunk.count(b"\n") + 1 for chunk in chunks) + 1


# --- the config loader -------------------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(),
    st.text(max_size=30),
    st.sampled_from(["learn", "460 GB/s", "400 Gb/s", ":9845", "0 */6 * * *", "mlx5_[0-7]", "(", ".*"]),
)
JUNK = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)


def _unwrap(hint: Any) -> Any:
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        return args[0]
    return hint


def _plausible(hint: Any) -> st.SearchStrategy[Any]:
    """Values of roughly the right type for a setting (so validation goes deep), or junk."""
    hint = _unwrap(hint)
    if dataclasses.is_dataclass(hint):
        return _section(hint)  # type: ignore[arg-type]
    origin, args = get_origin(hint), get_args(hint)
    if origin is tuple:
        return st.lists(_plausible(args[0]), max_size=3) | JUNK
    if origin is dict:
        return st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=3) | JUNK
    leaf = {
        bool: st.booleans(),
        int: st.integers(min_value=-(10**6), max_value=10**9),
        float: st.floats(),
        str: st.text(max_size=30),
    }[hint]
    return leaf | SCALARS


def _section(cls: type) -> st.SearchStrategy[dict[str, Any]]:
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    optional = {name: _plausible(hints[name]) for name in names}
    # Sometimes a key no section knows, to exercise the unknown-key path below the top level.
    return st.fixed_dictionaries({}, optional=optional) | st.dictionaries(
        st.sampled_from(names) | st.text(max_size=8), JUNK, max_size=2
    )


def _load(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "clusterhealth.yaml"
    path.write_bytes(raw)
    try:
        config = configuration.load(path)
    except configuration.ConfigError as err:
        assert str(err).startswith(f"{path}: ")
        assert len(str(err)) < 2000
        return
    # What --print-config prints is a config file that loads to the same configuration.
    path.write_text(configuration.dump(config))
    assert configuration.load(path) == config


@given(st.binary(max_size=400) | mutated([SAMPLE_CONFIG, POLICY_EXAMPLE]).map(str.encode))
@example(SAMPLE_CONFIG.encode())
@example(POLICY_EXAMPLE.encode())
def test_config_loader_on_arbitrary_bytes(tmp_path: Path, raw: bytes) -> None:
    _load(tmp_path, raw)


@given(_section(configuration.Config))
@settings(max_examples=200)
def test_config_loader_on_documents_shaped_like_a_config(tmp_path: Path, data: dict[str, Any]) -> None:
    _load(tmp_path, yaml.safe_dump(data, allow_unicode=True).encode())


# --- the profile ------------------------------------------------------------------------------------


def _hypothesis_tests() -> list[tuple[str, Any]]:
    found = []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        if "hypothesis" not in path.read_text(encoding="utf-8"):
            continue
        module = importlib.import_module(f"{__package__}.{path.stem}")
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if getattr(function, "is_hypothesis_test", False):
                found.append((f"{path.stem}.{name}", function))
    return found


def test_every_hypothesis_test_runs_bounded_and_derandomized() -> None:
    tests = _hypothesis_tests()
    assert {name.split(".")[0] for name, _ in tests} >= {
        "test_fuzz",
        "test_fabric_schedule",
        "test_rdma_fuzz",
    }
    for name, function in tests:
        # A @settings decorator's own settings, else the profile loaded when the test runs.
        chosen = getattr(function, "_hypothesis_internal_use_settings", settings.default)
        if os.environ.get("CLUSTERHEALTH_FUZZ", "ci") == "ci":
            assert chosen.derandomize, name
            assert chosen.database is None, name
            assert chosen.max_examples <= 400, name
        assert chosen.deadline is None, name
