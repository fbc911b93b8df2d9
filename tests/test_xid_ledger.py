"""The Xid ledger: one event seen by NVML and by the kernel log counts once."""

from __future__ import annotations

import pytest

from clusterhealth.exporters.xid import XidLedger


def test_the_same_event_from_both_sources_counts_once() -> None:
    ledger = XidLedger(window_seconds=30)
    assert ledger.record("nvml", 6, 79, when=1000.0) is True
    assert ledger.record("kmsg", 6, 79, when=1000.4) is False
    assert ledger.counts() == {(6, 79): 1}


def test_kernel_log_first_then_nvml_also_counts_once() -> None:
    ledger = XidLedger(window_seconds=30)
    assert ledger.record("kmsg", 2, 74, when=50.0)
    assert not ledger.record("nvml", 2, 74, when=52.0)
    assert ledger.counts() == {(2, 74): 1}


def test_repeats_from_one_source_are_real_repeats() -> None:
    ledger = XidLedger(window_seconds=30)
    for t in (1.0, 2.0, 3.0):
        assert ledger.record("nvml", 0, 13, when=t)
    assert ledger.counts() == {(0, 13): 3}


def test_each_twin_is_consumed_once() -> None:
    ledger = XidLedger(window_seconds=30)
    ledger.record("nvml", 0, 13, when=1.0)
    ledger.record("nvml", 0, 13, when=2.0)
    ledger.record("kmsg", 0, 13, when=1.1)
    ledger.record("kmsg", 0, 13, when=2.1)
    ledger.record("kmsg", 0, 13, when=3.0)  # the kernel saw a third one NVML did not deliver
    assert ledger.counts() == {(0, 13): 3}


def test_different_gpu_code_or_time_are_different_events() -> None:
    ledger = XidLedger(window_seconds=30)
    ledger.record("nvml", 0, 79, when=100.0)
    assert ledger.record("kmsg", 1, 79, when=100.0)
    assert ledger.record("kmsg", 0, 48, when=100.0)
    assert ledger.record("kmsg", 0, 79, when=200.0)
    assert ledger.counts() == {(0, 79): 2, (1, 79): 1, (0, 48): 1}


def test_memory_stays_bounded_under_a_flood() -> None:
    ledger = XidLedger(window_seconds=30, max_unmatched=100)
    for i in range(10_000):
        ledger.record("kmsg", i % 8, 13, when=float(i))
    assert len(ledger._unmatched) <= 100
    assert sum(ledger.counts().values()) == 10_000


EPSILON = 0.001


def test_the_other_source_just_inside_the_window_is_the_same_event() -> None:
    ledger = XidLedger(window_seconds=30)
    assert ledger.record("nvml", 3, 79, when=1000.0)
    assert not ledger.record("kmsg", 3, 79, when=1000.0 + 30 - EPSILON)
    assert ledger.counts() == {(3, 79): 1}


def test_the_other_source_just_inside_the_window_before_is_the_same_event() -> None:
    # The kernel's timestamp can be earlier than NVML's delivery: the window spans both sides.
    ledger = XidLedger(window_seconds=30)
    assert ledger.record("nvml", 3, 79, when=1000.0)
    assert not ledger.record("kmsg", 3, 79, when=1000.0 - 30 + EPSILON)
    assert ledger.counts() == {(3, 79): 1}


@pytest.mark.parametrize("offset", [30 + EPSILON, -(30 + EPSILON)])
def test_the_other_source_just_outside_the_window_is_another_event(offset: float) -> None:
    ledger = XidLedger(window_seconds=30)
    assert ledger.record("nvml", 3, 79, when=1000.0)
    assert ledger.record("kmsg", 3, 79, when=1000.0 + offset)
    assert ledger.counts() == {(3, 79): 2}


def test_a_twin_arriving_after_the_retention_counts_again() -> None:
    # Unmatched events are kept twice the window (sources deliver a little out of order); once a
    # later event has moved past that, a late twin stamped inside the window is no longer known.
    ledger = XidLedger(window_seconds=30)
    assert ledger.record("nvml", 3, 79, when=1000.0)
    assert ledger.record("kmsg", 5, 13, when=1000.0 + 2 * 30 + EPSILON)  # pushes 1000.0 out
    assert ledger.record("kmsg", 3, 79, when=1000.0 + 30 - EPSILON)
    assert ledger.counts() == {(3, 79): 2, (5, 13): 1}


def test_a_twin_kept_just_inside_the_retention_still_matches() -> None:
    ledger = XidLedger(window_seconds=30)
    assert ledger.record("nvml", 3, 79, when=1000.0)
    assert ledger.record("kmsg", 5, 13, when=1000.0 + 2 * 30 - EPSILON)  # 1000.0 is still kept
    assert not ledger.record("kmsg", 3, 79, when=1000.0 + 30 - EPSILON)
    assert ledger.counts() == {(3, 79): 1, (5, 13): 1}


def test_a_twin_pushed_out_by_a_flood_counts_again() -> None:
    ledger = XidLedger(window_seconds=30, max_unmatched=4)
    assert ledger.record("nvml", 3, 79, when=1000.0)
    for i in range(4):  # four unmatched events fill the bounded memory and evict the first
        ledger.record("kmsg", 5, 13, when=1000.0 + i * EPSILON)
    assert ledger.record("kmsg", 3, 79, when=1000.5)
    assert ledger.counts()[(3, 79)] == 2
