"""PCIe Advanced Error Reporting counters of the GPUs' and HCAs' PCI functions, from sysfs.

The kernel keeps, per PCI function with AER, three files of counts since boot
(drivers/pci/pcie/aer.c, `aer_stats_attrs`): `aer_dev_correctable`, `aer_dev_nonfatal` and
`aer_dev_fatal`, one `NAME COUNT` line per error type and a `TOTAL_ERR_*` line. A correctable error
is retried by the link itself and costs bandwidth (a marginal riser, cable or slot shows as a
rising count); a non-fatal one loses a transaction; a fatal one takes the link down. The kernel
log says when each happens (`clusterhealth_kernel_events_total{event="pcie_aer_*"}`); these
counters say how many, without a log line missed or rotated away.

Only the functions bound to the drivers the settings name are read (mlx5 HCAs by default; `nvidia`
adds the GPUs, whose link NVML's PCIe replay counter and Xid 79 already watch; `pcieport` adds the
switch and root ports above them). Per function and severity the
total is exported, from the `TOTAL_ERR_*` line, or the sum of the lines when a kernel prints none;
the per-type breakdown stays in the files (`cat .../aer_dev_correctable`), which keeps the series
to three per function.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, Metric

from clusterhealth.exporters.base import NoData
from clusterhealth.exporters.pci import bound_functions
from clusterhealth.exporters.sysfs import Failure, read_raw

SEVERITIES = (
    ("correctable", "aer_dev_correctable"),
    ("nonfatal", "aer_dev_nonfatal"),
    ("fatal", "aer_dev_fatal"),
)
# The kernel prints u64 counts; more digits than that is damage, and int() of thousands raises.
_MAX_DIGITS = 20
_MAX_BYTES = 4096


@dataclass(frozen=True)
class AerCounts:
    """One `aer_dev_*` file: counts by error type and the total (None: no usable line)."""

    by_type: dict[str, int]
    total: int | None


@dataclass(frozen=True)
class AerFunction:
    address: str  # 0000:1b:00.0, as sysfs names it
    driver: str
    counts: dict[str, AerCounts]  # severity -> counts; a severity whose file is unreadable is left out


def parse_aer_counts(text: str) -> AerCounts:
    """The lines of an `aer_dev_*` file; a line that is not `NAME COUNT` is skipped, never raised."""
    by_type: dict[str, int] = {}
    total = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit() or len(parts[1]) > _MAX_DIGITS:
            continue
        name, count = parts[0], int(parts[1])
        if name.startswith("TOTAL_"):
            total = count
        else:
            by_type[name] = count
    if total is None and by_type:
        total = sum(by_type.values())
    return AerCounts(by_type, total)


def read_aer_functions(sysfs_root: Path, drivers: Sequence[str]) -> list[AerFunction]:
    """The PCI functions under `bus/pci/devices` bound to one of `drivers` (globs) that have AER
    statistics. FileNotFoundError when the PCI bus directory is absent."""
    functions = []
    for address, driver, directory in bound_functions(sysfs_root, drivers):
        counts = {}
        for severity, name in SEVERITIES:
            text = _read(os.path.join(directory, name))
            if text is not None:
                counts[severity] = parse_aer_counts(text)
        if counts:
            functions.append(AerFunction(address, driver, counts))
    return functions


def _read(path: str) -> str | None:
    raw = read_raw(path, limit=_MAX_BYTES)
    if isinstance(raw, Failure):
        return None  # absent (no AER capability) or unreadable: that severity is left out
    return raw.decode("ascii", errors="replace")


class PcieAerCollector:
    """The `pcie_aer` collector."""

    name = "pcie_aer"

    def __init__(self, sysfs_root: Path, drivers: Sequence[str]):
        self.sysfs_root, self.drivers = sysfs_root, tuple(drivers)

    def collect(self) -> list[Metric]:
        try:
            functions = read_aer_functions(self.sysfs_root, self.drivers)
        except FileNotFoundError as absent:
            raise NoData(f"no PCI bus in sysfs ({absent.filename})") from None
        errors = CounterMetricFamily(
            "clusterhealth_pcie_aer_errors_total",
            "PCIe AER errors reported by the PCI function since boot, by error class (aer_dev_*).",
            # `class`, the PCIe spec's word (error classification), not `severity`: alert rules set
            # `severity` and would overwrite it.
            labels=["device", "driver", "class"],
        )
        for function in functions:
            for severity, counts in function.counts.items():
                if counts.total is not None:
                    errors.add_metric([function.address, function.driver, severity], float(counts.total))
        return [errors] if errors.samples else []
