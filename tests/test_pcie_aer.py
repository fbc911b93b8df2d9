"""The pcie_aer collector on the AER files of procfs's fixture (real content) and on damaged copies.

procfs's fixture has one PCI function with AER statistics, `0000:00:1f.6` (an Intel I219 Ethernet
controller: vendor 0x8086, class 0x020000). The tests lay it out as sysfs does, under
`bus/pci/devices/` with a `driver` link (the one thing the fixture lacks; e1000e is the driver of
that controller), and copy the three `aer_dev_*` files verbatim.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from clusterhealth.exporters.base import NoData
from clusterhealth.exporters.pci import nvidia_gpu_functions
from clusterhealth.exporters.pcie_aer import AerCounts, PcieAerCollector, parse_aer_counts, read_aer_functions

from .conftest import samples

FUNCTION = (
    Path(__file__).parent
    / "fixtures"
    / "sysfs"
    / "procfs-fixture"
    / "sys"
    / "devices"
    / "pci0000:00"
    / "0000:00:1f.6"
)
ADDRESS = "0000:00:1f.6"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    sysfs = tmp_path / "sys"
    function = sysfs / "devices" / "pci0000:00" / ADDRESS
    function.mkdir(parents=True)
    for name in ("aer_dev_correctable", "aer_dev_fatal", "aer_dev_nonfatal", "vendor", "class"):
        shutil.copy(FUNCTION / name, function / name)
    driver = sysfs / "bus" / "pci" / "drivers" / "e1000e"
    driver.mkdir(parents=True)
    (function / "driver").symlink_to("../../../bus/pci/drivers/e1000e")
    devices = sysfs / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    (devices / ADDRESS).symlink_to(f"../../../devices/pci0000:00/{ADDRESS}")
    return sysfs


def test_the_real_files_parse_into_counts_and_totals() -> None:
    correctable = parse_aer_counts((FUNCTION / "aer_dev_correctable").read_text())
    assert correctable.total == 9
    assert correctable.by_type == {
        "RxErr": 1,
        "BadTLP": 2,
        "BadDLLP": 3,
        "Rollover": 4,
        "Timeout": 5,
        "NonFatalErr": 6,
        "CorrIntErr": 7,
        "HeaderOF": 8,
    }
    fatal = parse_aer_counts((FUNCTION / "aer_dev_fatal").read_text())
    assert (fatal.total, fatal.by_type["Undefined"], fatal.by_type["PoisonTLPBlocked"]) == (28, 10, 27)
    # The fixture's nonfatal file names its total TOTAL_ERR_FATAL (the kernel prints
    # TOTAL_ERR_NONFATAL): the total is the file's TOTAL_ line, whatever its name.
    assert parse_aer_counts((FUNCTION / "aer_dev_nonfatal").read_text()).total == 48


def test_a_file_without_a_total_is_summed_and_bad_lines_are_skipped() -> None:
    text = "RxErr 4\nBadTLP 5\ngarbage\nBadDLLP " + "9" * 5000 + "\nTimeout -1\nHeaderOF 1 2\n"
    assert parse_aer_counts(text) == AerCounts({"RxErr": 4, "BadTLP": 5}, 9)
    assert parse_aer_counts("") == AerCounts({}, None)


def test_the_collector_exports_the_totals_of_the_selected_drivers(tree: Path) -> None:
    registry = CollectorRegistry()
    registry.register(PcieAerCollector(tree, ["e1000e"]))
    exported = samples(generate_latest(registry).decode())
    key = "clusterhealth_pcie_aer_errors_total"
    labels = {"device": ADDRESS, "driver": "e1000e"}
    assert {
        dict(ls)["class"]: v
        for (n, ls), v in exported.items()
        if n == key and labels.items() <= dict(ls).items()
    } == {"correctable": 9, "fatal": 28, "nonfatal": 48}
    assert PcieAerCollector(tree, ["nvidia", "mlx5_core"]).collect() == []  # not one of theirs
    assert [f.address for f in read_aer_functions(tree, ["e1000*"])] == [ADDRESS]  # globs


def test_a_function_without_a_driver_or_a_file_that_cannot_be_read(tree: Path) -> None:
    function = tree / "devices" / "pci0000:00" / ADDRESS
    (function / "aer_dev_fatal").unlink()
    (function / "aer_dev_fatal").mkdir()  # read() of a directory fails: that severity is left out
    (function / "aer_dev_nonfatal").write_text("RxErr " + "7" * 5000 + "\n")
    (aer,) = read_aer_functions(tree, ["e1000e"])
    assert aer.counts["correctable"].total == 9
    assert "fatal" not in aer.counts
    assert aer.counts["nonfatal"].total is None
    (function / "driver").unlink()
    assert read_aer_functions(tree, ["*"]) == []


def test_no_pci_bus_is_no_data_not_a_failure(tmp_path: Path) -> None:
    with pytest.raises(NoData):
        PcieAerCollector(tmp_path, ["nvidia"]).collect()


def test_only_display_class_functions_of_the_nvidia_driver_are_gpus(tree: Path) -> None:
    function = tree / "devices" / "pci0000:00" / ADDRESS
    (tree / "bus" / "pci" / "drivers" / "nvidia").mkdir()
    (function / "driver").unlink()
    (function / "driver").symlink_to("../../../bus/pci/drivers/nvidia")
    # The real function's class, 0x020000 (Ethernet), as an NVSwitch's 0x068000 would be: no GPU.
    assert nvidia_gpu_functions(tree) == []
    (function / "class").write_text("0x030200\n")  # a 3D controller, as the kernel prints it
    assert nvidia_gpu_functions(tree) == [ADDRESS]
    assert nvidia_gpu_functions(tree / "nowhere") == []
