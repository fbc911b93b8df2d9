"""Logging: one logfmt line per event on stderr, the way Prometheus exporters log.

Under systemd (JOURNAL_STREAM set) the timestamp is left to journald and the level is also given as
a syslog priority prefix (`<3>`), so `journalctl -p err` filters correctly.
"""

from __future__ import annotations

import logging
import os
import sys
import time

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


def _quote(value: str) -> str:
    if value and not any(c in value for c in ' "=\n\t'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class LogfmtFormatter(logging.Formatter):
    def __init__(self, journald: bool):
        super().__init__()
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        parts = []
        if not self.journald:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            parts.append(f"ts={stamp}.{int(record.msecs):03d}Z")
        parts.append(f"level={record.levelname.lower()}")
        parts.append(f"logger={record.name.removeprefix('clusterhealth.')}")
        message = record.getMessage()
        if record.exc_info:
            message += " " + self.formatException(record.exc_info).replace("\n", " | ")
        parts.append(f"msg={_quote(message)}")
        line = " ".join(parts)
        if self.journald:
            line = f"<{_PRIORITY.get(record.levelno, 6)}>{line}"
        return line


def setup(level: str = "info") -> None:
    logger = logging.getLogger("clusterhealth")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter(journald=bool(os.environ.get("JOURNAL_STREAM"))))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def set_level(level: str) -> None:
    logging.getLogger("clusterhealth").setLevel(level.upper())
