"""The Xid/SXid catalog: every code the agent alerts on is described, and unknown codes are handled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clusterhealth.checks.kernel_log import parse_line
from clusterhealth.checks.xid_catalog import (
    CRITICAL_XIDS,
    SXID_CATALOG,
    TICKET_XIDS,
    XID_CATALOG,
    XidInfo,
    describe,
    describe_sxid,
)

KMSG_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kmsg"

REQUIRED_XIDS = [13, 31, 32, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120, 121, 123]
REQUIRED_XIDS += [140, 143, *range(144, 151)]


def _complete(info: XidInfo) -> bool:
    return all(text.strip() for text in (info.name, info.meaning, info.action)) and info.severity in (
        "critical",
        "warning",
        "info",
    )


@pytest.mark.parametrize("code", REQUIRED_XIDS)
def test_required_xid_is_described(code: int) -> None:
    info = describe(code)
    assert info.known
    assert info.code == code
    assert _complete(info)


def test_every_catalog_entry_is_complete_and_keyed_by_its_code() -> None:
    for catalog in (XID_CATALOG, SXID_CATALOG):
        for code, info in catalog.items():
            assert info.code == code
            assert info.known
            assert _complete(info), code


@pytest.mark.parametrize("code", [0, 1, 9999, -5])
def test_unknown_xid(code: int) -> None:
    info = describe(code)
    assert not info.known
    assert info.code == code
    assert info.severity == "warning"
    assert _complete(info)
    assert "docs.nvidia.com" in info.action


def test_unknown_sxid() -> None:
    info = describe_sxid(1)
    assert (info.known, info.severity) == (False, "warning")
    assert "fabric-manager-user-guide" in info.action


def test_hardware_xids_alert_and_application_xids_do_not() -> None:
    # Double-bit ECC, failed row remap, NVLink, off the bus, uncontained ECC, GSP: a reset or more.
    assert {48, 64, 74, 79, 95, 119, 120} <= CRITICAL_XIDS
    # NVIDIA asks no immediate action of a recorded remap (63) or an SBE storm (92), and only a
    # restart of the job after a contained error (94): a ticket, neither a page nor a drain.
    assert {63, 92, 94} <= TICKET_XIDS
    assert all(XID_CATALOG[code].severity == "warning" for code in TICKET_XIDS)
    assert not TICKET_XIDS & CRITICAL_XIDS


def test_nvlink5_levels_follow_nvidias_decode_table() -> None:
    """NVIDIA decodes Xid 144-150 from the message: every MSE (150) item is a fatal reset; SAW, RLW,
    TLW and NETIR (144-146, 149) items are fatal resets or non-fatal nothing, the fatal ones
    followed by an Xid 154 that pages; every TREX and NVLPW_CTRL (147, 148) item is IGNORE."""
    assert 150 in CRITICAL_XIDS and {154} <= CRITICAL_XIDS
    assert {144, 145, 146, 149} <= TICKET_XIDS
    assert not {144, 145, 146, 147, 148, 149} & CRITICAL_XIDS
    assert not {147, 148} & TICKET_XIDS
    assert all(XID_CATALOG[code].severity == "warning" for code in range(144, 150))
    assert "Xid 154" in XID_CATALOG[145].action and "reset" in XID_CATALOG[150].action
    # Faults of one application: the GPU is fine.
    assert not {13, 31, 32, 43, 45, 68, 69} & (CRITICAL_XIDS | TICKET_XIDS)


def test_catalog_is_read_only() -> None:
    with pytest.raises(TypeError):
        XID_CATALOG[1] = describe(1)  # type: ignore[index]


def test_every_code_in_the_captured_lines_is_catalogued() -> None:
    entries: list[dict[str, Any]] = json.loads((KMSG_FIXTURES / "expected.json").read_text(encoding="utf-8"))
    entries += json.loads((KMSG_FIXTURES / "extra_lines.json").read_text(encoding="utf-8"))
    for entry in entries:
        event = parse_line(entry["line"])
        if event is None or event.code is None:
            continue
        # Xid 14 comes from NVIDIA's pre-Ampere example and is unused on current GPUs.
        if event.kind == "xid" and event.code != 14:
            assert describe(event.code).known, event.code
        if event.kind == "sxid":
            assert describe_sxid(event.code).known, event.code
