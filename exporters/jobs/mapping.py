"""The HPC job-mapping directory: dcgm-exporter's format, which deploy/slurm's Prolog writes.

One file per GPU allocated to a job, named by the GPU's index (`3`), or by the index and the GPU
instance for a MIG device (`3.1`); each line of a file is the id of a job that runs on it (more
than one when jobs share the GPU). dcgm-exporter reads the same directory
(`--hpc-job-mapping-dir`, internal/pkg/transformation/hpc.go), so one site's files serve both.

Slurm numbers GPUs by their device files (`/dev/nvidiaN`, N the minor number: Slurm's GRES guide),
not in NVML's PCI-bus order, so an index is a minor number unless the site's scripts wrote NVML
indices (`mapping_index: nvml`).

`read_mapping_dir` is a pure reader: every file read with the bounded read layer of
exporters/sysfs.py (a FIFO or a huge file cannot stall or swamp it), each problem named, never an
exception for one bad file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from clusterhealth.exporters import sysfs

# A file holds a few job ids; anything much longer is not a mapping file.
MAX_FILE_BYTES = 4096
_NAME = re.compile(r"(\d{1,4})(?:\.(\d{1,4}))?")
# Slurm's ids (12345, array tasks 12345_7, heterogeneous 12345+0) and other schedulers' alike.
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+:-]{0,127}")


@dataclass(frozen=True)
class MappingFile:
    name: str
    index: int  # the GPU's index as the file names it (a minor number, or NVML's index)
    gpu_instance: int | None  # the MIG GPU instance, for `GPU.GI` files
    jobs: tuple[str, ...]
    modified: float  # mtime, seconds since the epoch


@dataclass
class MappingRead:
    files: list[MappingFile] = field(default_factory=list)
    # One sentence per file that could not be read or parsed (the others are still read).
    problems: list[str] = field(default_factory=list)


def parse_jobs(text: str) -> tuple[str, ...] | str:
    """The job ids of a file's text, or what is wrong with it."""
    jobs = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        if not _JOB_ID.fullmatch(line):
            shown = line if len(line) <= 40 else line[:37] + "..."
            return f"line {number} is not a job id ({shown!r})"
        if line not in jobs:
            jobs.append(line)
    return tuple(jobs)


def read_mapping_dir(path: str) -> MappingRead | None:
    """Every mapping file of the directory `path`, or None when the directory does not exist.
    Raises OSError when it exists but cannot be listed."""
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except FileNotFoundError:
        return None
    read = MappingRead()
    for entry in entries:
        name = _NAME.fullmatch(entry.name)
        if name is None:
            continue  # dcgm-exporter skips other names too (a lock file, an editor's backup)
        # An Epilog may remove a file at any moment after the listing: gone is no problem.
        try:
            if not entry.is_file():
                continue
            modified = entry.stat().st_mtime
        except FileNotFoundError:
            continue
        except OSError as error:
            read.problems.append(f"{entry.name}: {sysfs.errno_name(error)}")
            continue
        raw = sysfs.read_raw(entry.path, limit=MAX_FILE_BYTES + 1)
        if isinstance(raw, sysfs.Failure):
            if raw.reason != "ENOENT":
                read.problems.append(f"{entry.name}: {raw.reason}")
            continue
        if len(raw) > MAX_FILE_BYTES:
            read.problems.append(f"{entry.name}: longer than {MAX_FILE_BYTES} bytes")
            continue
        try:
            jobs = parse_jobs(raw.decode("utf-8"))
        except UnicodeDecodeError:
            read.problems.append(f"{entry.name}: not text")
            continue
        if isinstance(jobs, str):
            read.problems.append(f"{entry.name}: {jobs}")
            continue
        instance = name.group(2)
        read.files.append(
            MappingFile(
                entry.name,
                int(name.group(1)),
                int(instance) if instance is not None else None,
                jobs,
                modified,
            )
        )
    return read


__all__ = ["MappingFile", "MappingRead", "parse_jobs", "read_mapping_dir"]
