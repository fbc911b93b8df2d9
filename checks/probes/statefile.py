"""The probes' state files in `probing.state_dir`: written atomically, re-read when another process
changed them.

A write goes to a temporary file in the same directory, is fsynced, renamed over the old file and
the directory fsynced, so a crash leaves the old file or the new one, never half of one. Readers
compare the file's signature (inode, size, mtime) with the one they last saw, so the agent adopts
what `clusterhealth probe run` wrote beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

Signature = tuple[int, int, int]  # inode, size, mtime in ns: has another writer replaced the file?


def signature(path: Path) -> Signature | None:
    """The file's signature; None when it does not exist. Other errors raise OSError."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def write_json(path: Path, document: Any) -> Signature:
    """Replace `path` with `document` atomically; OSError when it cannot be done."""
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        _fsync_dir(path.parent)
        written = signature(path)
        assert written is not None
        return written
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _fsync_dir(path: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
