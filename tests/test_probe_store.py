"""The probes' state files (checks/probes/store.py): the files an earlier agent wrote are read and
written back byte for byte, two stores of one file never lose a change, and a file that cannot be
read or written is a problem named in the collector's words, never a crash."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from clusterhealth.checks.fabric.rounds import GROUP_FORMAT, SlotResult, group_store
from clusterhealth.checks.fabric.schedule import Played
from clusterhealth.checks.probe_parsers.nccl_transport import Transport
from clusterhealth.checks.probes.collector import RESULTS_FILE, RESULTS_FORMAT, PeerRun
from clusterhealth.checks.probes.store import StateStore

from .conftest import FIXTURES

EARLIER = FIXTURES / "state"


def test_the_files_an_earlier_agent_wrote_are_read_and_written_back_as_they_were(tmp_path: Path) -> None:
    for name in ("probe-results.json", "pairwise-fabric.json"):
        shutil.copy(EARLIER / name, tmp_path / name)
    results = StateStore(tmp_path / RESULTS_FILE, RESULTS_FORMAT)
    probes = results.read()
    nccl, iperf3 = probes["nccl-allreduce"], probes["iperf3-pair"]
    assert nccl.runs == {"ok": 1, "degraded": 0, "failed": 0, "timeout": 0, "skipped": 1}
    assert nccl.last is not None and nccl.last_any is not None
    assert nccl.last.outcome.transport == Transport("IB", True, "P2P")
    assert nccl.last.command == "all_reduce_perf -b 8 -e 8G -f 2 -g 8"
    assert nccl.last_any == PeerRun("nccl-allreduce", "", nccl.last_any.outcome, 1767229200.5, 0.01, "")
    assert nccl.last_any.outcome.result == "skipped" and nccl.bandwidth == {"": 469.715e9}
    assert iperf3.bandwidth == {"10.0.0.2": 19.8e9 / 8, "10.0.0.3": 9.1e9 / 8}
    assert iperf3.last is not None and iperf3.last.outcome.result == "timeout"

    group = group_store(tmp_path, "fabric")
    state = group.read()
    assert state.runs == {"ok": 1, "degraded": 1, "failed": 0, "timeout": 0, "skipped": 1}
    assert state.last is not None and state.last.confirming and state.last.outcome.result == "ok"
    assert state.current == state.last_any
    assert state.current == SlotResult(
        1963586, False, "gpu-003", state.current.outcome, 1767226500.0, 6.0, "iperf3 -c 10.0.0.3 -p 5201 -J"
    )
    assert state.history == {
        1963584: Played(1963584, "gpu-002", "client", True),
        1963585: Played(1963585, None, None, None),
        1963586: Played(1963586, "gpu-003", "server", None),
    }
    assert state.confirms == {1963585: Played(1963585, "gpu-002", "client", False)}

    # A change that changes nothing writes the file again: the same bytes.
    results.update(lambda _: None)
    group.update(lambda _: None)
    assert results.problem is None and group.problem is None
    for name in ("probe-results.json", "pairwise-fabric.json"):
        assert (tmp_path / name).read_bytes() == (EARLIER / name).read_bytes(), name


def test_two_stores_of_one_file_never_lose_a_change(tmp_path: Path) -> None:
    # After a reload the old rounds of a group may still record their last meeting while the new
    # rounds record theirs, each through a store of its own.
    stores = [group_store(tmp_path, "fabric") for _ in range(2)]

    def count(store: StateStore[object]) -> None:
        for _ in range(100):
            store.update(lambda state: state.runs.update(ok=1))  # type: ignore[attr-defined]

    threads = [threading.Thread(target=count, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert group_store(tmp_path, "fabric").read().runs["ok"] == 200


def test_a_file_that_cannot_be_read_or_written_is_a_problem_in_the_collectors_words(tmp_path: Path) -> None:
    for name in ("probe-results.json", "pairwise-fabric.json"):
        (tmp_path / name).write_text("{not json")
    results = StateStore(tmp_path / RESULTS_FILE, RESULTS_FORMAT)
    group = StateStore(tmp_path / "pairwise-fabric.json", GROUP_FORMAT)
    assert results.read() == {} and group.read().last_any is None
    why = "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    assert results.problem == (
        f"cannot read probe results from {tmp_path / RESULTS_FILE}: {why}; they are kept in memory only"
    )
    assert group.problem == f"cannot read pairwise results from {tmp_path / 'pairwise-fabric.json'}: {why}"
    # The next change replaces the file, and the problem is gone.
    group.update(lambda state: state.runs.update(ok=1))
    assert group.problem is None and group_store(tmp_path, "fabric").read().runs["ok"] == 1

    # A state directory that is a file: nothing can be saved.
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    results = StateStore(blocked / RESULTS_FILE, RESULTS_FORMAT)
    results.update(lambda states: None)
    assert results.problem is not None
    assert results.problem.startswith(f"cannot save probe results to {blocked / RESULTS_FILE}: [Errno ")
    assert results.problem.endswith("; they are kept in memory only")
