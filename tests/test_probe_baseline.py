"""Learned probe baselines: rolling median, learning policy, persistence, damaged state files."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

from clusterhealth.checks.probes.baseline import STATE_FILE, BaselineStore
from clusterhealth.checks.probes.evaluate import ProbeOutcome

GB = 1e9


def outcome(result: str, bandwidth: float | None) -> ProbeOutcome:
    return ProbeOutcome(result, "test", bandwidth)  # type: ignore[arg-type]


def test_no_expectation_until_min_runs(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, window=10, min_runs=3)
    store.record("allreduce", "", 400 * GB)
    store.record("allreduce", "", 440 * GB)
    assert store.expected("allreduce") is None
    store.record("allreduce", "", 420 * GB)
    assert store.expected("allreduce") == 420 * GB


def test_expectation_is_the_median_of_the_last_window_runs(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, window=5, min_runs=3)
    for gbps in (100, 300, 200):
        store.record("allreduce", "", gbps * GB)
    assert store.expected("allreduce") == 200 * GB
    store.record("allreduce", "", 1000 * GB)  # one lucky run moves the median a little, not to 1000
    assert store.expected("allreduce") == 250 * GB
    for gbps in (410, 420, 430):
        store.record("allreduce", "", gbps * GB)
    # 100, 300 and 200 fell out of the window: 200, 1000, 410, 420, 430 remain.
    assert store.runs("allreduce") == tuple(g * GB for g in (200, 1000, 410, 420, 430))
    assert store.expected("allreduce") == 420 * GB


def test_probes_and_peers_are_kept_apart(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, min_runs=1)
    store.record("ib_pairwise", "node-b", 40 * GB)
    store.record("ib_pairwise", "node-c", 20 * GB)
    store.record("allreduce", "", 400 * GB)
    assert store.expected("ib_pairwise", "node-b") == 40 * GB
    assert store.expected("ib_pairwise", "node-c") == 20 * GB
    assert store.expected("ib_pairwise") is None
    assert store.expected("allreduce") == 400 * GB


@pytest.mark.parametrize(
    ("result", "bandwidth", "learned"),
    [
        ("ok", 400 * GB, True),
        ("degraded", 200 * GB, False),  # learning it would let the fault become the expectation
        ("failed", 300 * GB, False),
        ("timeout", None, False),
        ("ok", None, False),  # a probe without a bandwidth figure
    ],
)
def test_only_ok_runs_shape_the_baseline(
    tmp_path: Path, result: str, bandwidth: float | None, learned: bool
) -> None:
    store = BaselineStore(tmp_path, min_runs=1)
    assert store.learn("allreduce", "", outcome(result, bandwidth)) is learned
    assert store.runs("allreduce") == ((bandwidth,) if learned else ())


def test_a_degraded_link_does_not_drag_the_baseline_down(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, window=5, min_runs=3)
    for _ in range(3):
        store.learn("allreduce", "", outcome("ok", 400 * GB))
    for _ in range(20):
        store.learn("allreduce", "", outcome("degraded", 200 * GB))
    assert store.expected("allreduce") == 400 * GB


def test_baseline_survives_a_restart(tmp_path: Path) -> None:
    first = BaselineStore(tmp_path / "state", min_runs=2)
    first.record("allreduce", "", 400 * GB)
    first.record("allreduce", "", 420 * GB)
    first.record("ib_pairwise", "node-b", 45 * GB)
    del first
    second = BaselineStore(tmp_path / "state", min_runs=2)
    assert second.expected("allreduce") == 410 * GB
    assert second.runs("ib_pairwise", "node-b") == (45 * GB,)


def test_a_smaller_window_after_restart_keeps_the_newest_runs(tmp_path: Path) -> None:
    first = BaselineStore(tmp_path, window=10)
    for gbps in range(1, 11):
        first.record("allreduce", "", gbps * GB)
    assert BaselineStore(tmp_path, window=3).runs("allreduce") == (8 * GB, 9 * GB, 10 * GB)


def test_two_instances_see_each_others_records(tmp_path: Path) -> None:
    # The agent and a manual `clusterhealth probe run` share the state directory.
    agent, manual = BaselineStore(tmp_path, min_runs=1), BaselineStore(tmp_path, min_runs=1)
    agent.record("allreduce", "", 400 * GB)
    manual.record("allreduce", "", 420 * GB)
    agent.record("allreduce", "", 440 * GB)
    assert manual.runs("allreduce") == agent.runs("allreduce") == (400 * GB, 420 * GB, 440 * GB)


def test_reset_forgets_a_probe(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, min_runs=1)
    store.record("ib_pairwise", "node-b", 45 * GB)
    store.record("ib_pairwise", "node-c", 44 * GB)
    store.record("allreduce", "", 400 * GB)
    store.reset("ib_pairwise", "node-b")
    assert store.runs("ib_pairwise", "node-b") == ()
    assert store.runs("ib_pairwise", "node-c") == (44 * GB,)
    store.reset("ib_pairwise")
    assert BaselineStore(tmp_path).runs("ib_pairwise", "node-c") == ()
    assert BaselineStore(tmp_path).runs("allreduce") == (400 * GB,)


def test_deleting_the_file_resets_a_running_store(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, min_runs=1)
    store.record("allreduce", "", 400 * GB)
    (tmp_path / STATE_FILE).unlink()
    assert store.expected("allreduce") is None


@pytest.mark.parametrize(
    "content",
    [
        b'{"version": 1, "baselines": {"allreduce": {"": [4e11, 4.1e11',  # cut short
        b"\x00\x00\x00\x00",  # a block of zeros after a crash on a filesystem without data journaling
        b"[1, 2, 3]",
        b'{"version": 99, "baselines": {}}',
        b'{"version": 1, "baselines": {"allreduce": {"": ["fast"]}}}',
        b'{"version": 1, "baselines": {"allreduce": {"": [-1]}}}',
        b'{"version": 1, "baselines": {"allreduce": [4e11]}}',
    ],
    ids=["truncated", "zeros", "not-an-object", "future-version", "not-numbers", "negative", "no-peers"],
)
def test_corrupt_state_is_ignored_logged_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    (tmp_path / STATE_FILE).write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="clusterhealth.probes"):
        store = BaselineStore(tmp_path, min_runs=1)
    assert store.expected("allreduce") is None
    assert [r.name for r in caplog.records] == ["clusterhealth.probes"]
    assert "ignoring unreadable probe baselines" in caplog.records[0].getMessage()
    # The damaged file is kept for a post-mortem, and a valid one takes its place.
    assert (tmp_path / f"{STATE_FILE}.corrupt").read_bytes() == content
    store.record("allreduce", "", 400 * GB)
    assert json.loads((tmp_path / STATE_FILE).read_text())["baselines"] == {"allreduce": {"": [400 * GB]}}
    assert BaselineStore(tmp_path, min_runs=1).expected("allreduce") == 400 * GB


def test_file_that_cannot_be_read_at_all_is_survived(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / STATE_FILE).mkdir()  # unreadable as a file, and cannot be replaced by one either
    with caplog.at_level(logging.WARNING, logger="clusterhealth.probes"):
        store = BaselineStore(tmp_path, min_runs=1)
        store.record("allreduce", "", 400 * GB)
    # Kept in memory for this process, with warnings, and no exception.
    assert store.expected("allreduce") == 400 * GB
    messages = [r.getMessage() for r in caplog.records]
    assert any("is not a regular file" in m for m in messages)
    assert any("cannot save probe baselines" in m for m in messages)
    assert sorted(p.name for p in tmp_path.iterdir()) == [STATE_FILE], "a temporary file was left behind"


def test_writes_leave_only_the_state_file(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, window=3)
    for n in range(50):
        store.record(f"probe-{n % 4}", "", (400 + n) * GB)
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE]


def test_a_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    # A reader in another thread reads the file while records rewrite it: with write-in-place it
    # would catch an empty or half-written file; with rename it sees the old or the new file.
    store = BaselineStore(tmp_path)
    store.record("allreduce", "", 1 * GB)
    path = tmp_path / STATE_FILE
    stop = threading.Event()
    bad: list[str] = []
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            text = path.read_text()
            reads += 1
            try:
                json.loads(text)
            except ValueError:
                bad.append(text)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for n in range(300):
            store.record(f"probe-{n % 7}", f"peer-{n % 3}", (n + 1) * GB)
    finally:
        stop.set()
        thread.join()
    assert reads > 0 and bad == []


@pytest.mark.parametrize("bandwidth", [0.0, -5.0, float("nan"), float("inf")])
def test_record_rejects_non_measurements(tmp_path: Path, bandwidth: float) -> None:
    with pytest.raises(ValueError):
        BaselineStore(tmp_path).record("allreduce", "", bandwidth)
