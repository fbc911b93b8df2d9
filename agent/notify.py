"""systemd's readiness and watchdog notifications (sd_notify), in a few lines and no dependency.

Under `Type=notify` systemd sets NOTIFY_SOCKET (a Unix datagram socket; a leading `@` is the
abstract namespace) and, with `WatchdogSec=`, WATCHDOG_USEC. The variables are taken out of the
environment when read, as sd_notify's `unset_environment` does, so that probe processes started
later do not inherit them and cannot speak for the agent.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping


class Notifier:
    def __init__(self, address: str | None, watchdog_usec: int | None):
        self.address = address
        self.watchdog_usec = watchdog_usec

    @classmethod
    def from_environ(cls, environ: MutableMapping[str, str] = os.environ) -> Notifier:
        address = environ.pop("NOTIFY_SOCKET", None) or None
        usec = environ.pop("WATCHDOG_USEC", "")
        pid = environ.pop("WATCHDOG_PID", "")
        watchdog = int(usec) if usec.isdigit() and int(usec) > 0 else None
        if pid and pid != str(os.getpid()):
            watchdog = None  # meant for another process
        return cls(address, watchdog)

    def notify(self, state: str) -> bool:
        """Send `state` (e.g. READY=1); False when not under systemd or the socket is gone."""
        if not self.address:
            return False
        address = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                # Never block the main loop on a reader that does not keep up: drop the message.
                sock.setblocking(False)
                sock.sendto(state.encode(), address)
        except OSError:
            return False
        return True

    def wait_seconds(self, default: float) -> float:
        """How long the main loop may sleep: half the watchdog interval, as systemd advises."""
        if self.watchdog_usec is None:
            return default
        return min(default, self.watchdog_usec / 2e6)

    def watchdog(self) -> None:
        if self.watchdog_usec is not None:
            self.notify("WATCHDOG=1")
