"""The agent as the benchmarks start it: on a port of its choosing, its log kept draining.

Each script runs as `python benchmarks/<name>.py`, so this folder is on its import path. The
command is this virtualenv's `clusterhealth`, or the one CLUSTERHEALTH_COMMAND names (another
build's, to measure two side by side on the same machine).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

CLUSTERHEALTH = os.environ.get("CLUSTERHEALTH_COMMAND") or str(Path(sys.executable).parent / "clusterhealth")
_SERVING = re.compile(r"serving /metrics and /healthz on [^ ]+:(\d+)")


def start_agent(*args: str, name: str = "agent") -> tuple[subprocess.Popen[str], int, list[str]]:
    """`clusterhealth agent --listen 127.0.0.1:0 ARGS`, its port once it serves, and its log.

    stderr is read on a thread after that, so the agent never blocks on a full pipe while it is
    measured; the lines keep landing in the returned list.
    """
    proc = subprocess.Popen(
        [CLUSTERHEALTH, "agent", "--listen", "127.0.0.1:0", *args], stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    log: list[str] = []
    for line in proc.stderr:
        log.append(line)
        if m := _SERVING.search(line):
            threading.Thread(target=lambda: log.extend(proc.stderr or ()), daemon=True).start()
            return proc, int(m.group(1)), log
    raise SystemExit(f"{name} did not start:\n" + "".join(log))
