"""The Xid ledger: one event seen by NVML and by the kernel log counts once."""

from __future__ import annotations

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
