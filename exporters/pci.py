"""PCI functions in sysfs (`bus/pci/devices`): which driver each is bound to, and its class.

Read by the `pcie_aer` collector (the functions of the GPUs' and HCAs' drivers) and by the node to
place a GPU that never answered NVML (the nvidia driver's GPU functions).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from clusterhealth.exporters.sysfs import Failure, link_name, read_raw

# PCI base class 03h, display controllers: VGA (0x0300xx) and 3D (0x0302xx) GPUs. NVSwitches,
# bound to the nvidia driver too, are bridges (0x0680xx).
DISPLAY_CLASS = "0x03"


def bus_directory(sysfs_root: Path | str) -> str:
    return os.path.join(os.fspath(sysfs_root), "bus", "pci", "devices")


def bound_functions(sysfs_root: Path | str, drivers: Sequence[str]) -> Iterator[tuple[str, str, str]]:
    """(address, driver, directory) of each PCI function bound to a driver matching one of the
    globs `drivers`, by address. FileNotFoundError when the PCI bus directory is absent."""
    bus = bus_directory(sysfs_root)
    for address in sorted(os.listdir(bus)):
        directory = os.path.join(bus, address)
        try:
            driver = link_name(os.path.join(directory, "driver"))
        except OSError:
            continue  # no driver bound
        if any(fnmatch.fnmatchcase(driver, pattern) for pattern in drivers):
            yield address, driver, directory


def nvidia_gpu_functions(sysfs_root: Path | str) -> list[str]:
    """The addresses of the GPUs the nvidia driver is bound to (base class 03h); empty when the PCI
    bus cannot be read. A GPU that NVML cannot answer for is still listed here while it is on
    the bus."""
    found = []
    try:
        for address, _, directory in bound_functions(sysfs_root, ("nvidia",)):
            pci_class = read_raw(os.path.join(directory, "class"), limit=64)
            if isinstance(pci_class, Failure) or not pci_class.isascii():
                continue
            if pci_class.decode().startswith(DISPLAY_CLASS):
                found.append(address)
    except OSError:
        return []
    return found
