"""Network interfaces from sysfs (`class/net/<name>/mtu`), for the MTU audit.

`exporters/infiniband.py` reads the MTU of the interfaces RDMA devices use; the audit also covers
interfaces with no RDMA device (a TCP storage or management port), so it reads every interface.
"""

from __future__ import annotations

import errno
from pathlib import Path

from clusterhealth.exporters.sysfs import Failure, read_raw

# An MTU is a few digits; a longer file is not an mtu attribute.
_MAX_MTU_BYTES = 32


def read_netdev_mtus(sysfs_root: Path) -> dict[str, int]:
    """{interface name: MTU in bytes} for every interface under `<sysfs_root>/class/net`.

    Raises FileNotFoundError when `class/net` is absent: every Linux node has at least `lo`, so a
    missing directory means a wrong sysfs root, not a node without interfaces. An interface whose
    `mtu` is missing, unreadable or not a number is left out (it may be going away as we read).
    """
    class_net = sysfs_root / "class" / "net"
    if not class_net.is_dir():
        raise FileNotFoundError(errno.ENOENT, "no network interfaces (class/net is absent)", str(class_net))
    mtus: dict[str, int] = {}
    for entry in sorted(class_net.iterdir()):
        raw = read_raw(f"{entry}/mtu", limit=_MAX_MTU_BYTES + 1)
        if isinstance(raw, Failure):
            # bonding_masters and links flattened into files land here (ENOTDIR) with vanished ones.
            continue
        text = raw.decode("ascii", errors="replace").strip()
        if len(text) <= _MAX_MTU_BYTES and text.isdigit() and text.isascii():
            mtus[entry.name] = int(text)
    return mtus
