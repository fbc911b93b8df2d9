"""The agent: runs the collectors of the table (agent/collectors.py), serves them, reloads on SIGHUP."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import resource
import select
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from clusterhealth.agent import config as configuration
from clusterhealth.agent import log as logsetup
from clusterhealth.agent import webconfig
from clusterhealth.agent.collectors import Collectors, collect_once
from clusterhealth.agent.exposition import Exposition
from clusterhealth.agent.http import Server
from clusterhealth.agent.node import Node
from clusterhealth.agent.notify import Notifier
from clusterhealth.checks.probes import runner

log = logging.getLogger("clusterhealth.agent")


# Soft limit on open files the agent raises itself to, within the hard limit (as Go programs such
# as node_exporter do at start): the rdma collector holds its ~540 counter files open on a 10-HCA
# node, and the HTTP server takes a quarter of the limit for connections.
OPEN_FILES = 65536


def raise_open_file_limit(target: int = OPEN_FILES) -> int:
    """Raise the soft RLIMIT_NOFILE towards `target`, never above the hard limit; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as err:
            log.debug("cannot raise the open-file limit from %d to %d: %s", soft, wanted, err)
            return soft
        return wanted
    return soft


# glibc's mallopt() parameter for the number of malloc arenas (malloc.h).
M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas for the threads started from now on; False where that is not glibc.

    glibc gives a thread that allocates while another holds an arena an arena of its own, up to
    eight per core, and each keeps the memory freed in it. The agent's threads run Python in turn
    (the interpreter lock), so a few arenas serve them all: about 3 MB less resident memory.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_ARENA_MAX, arenas))


class Agent:
    def __init__(self, config_path: str | None, overrides: Mapping[str, Any], config: configuration.Config):
        self.config_path, self.overrides, self.config = config_path, overrides, config
        self.loaded_at = time.time()
        self.node = Node(config)
        self.exposition = Exposition(lambda: self.collectors.active, lambda: self.config.node_name)
        # Render on the sampler's thread right after each snapshot, so no scrape waits for it.
        self.collectors = Collectors(self.node, self.exposition.refresh)
        # What the signal handlers ask, as plain flags, and a pipe that wakes the main loop: a
        # handler runs in the main thread between any two bytecodes, so it must take no lock (an
        # Event's set() does: a SIGTERM arriving inside a SIGHUP handler's set() deadlocked).
        self._stopping = False
        self._reloading = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.server = Server(
            config.listen,
            self.exposition,
            lambda: self.collectors.active,
            self._health_extra,
            web_config=webconfig.load(config.web_config_file),
        )

    def _health_extra(self) -> dict[str, Any]:
        return {
            "config": {
                "file": self.config_path,
                "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.loaded_at)),
                "simulate": self.config.simulate,
            }
        }

    def run(self) -> int:
        notifier = Notifier.from_environ()  # first: probe processes must not inherit NOTIFY_SOCKET
        # Hand the GIL to scrape threads sooner than the default 5 ms while a collection runs.
        sys.setswitchinterval(0.0005)
        # Everything allocated so far lives as long as the agent: keep the cycle collector off it,
        # and let a collection's short-lived objects go without a full pass each time.
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 20)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_reload)
        self._apply(self.config)
        self.server.start()
        host, port = self.server.address[:2]
        log.info("serving /metrics and /healthz on %s:%d", host, port)
        notifier.notify("READY=1")
        while not self._stopping:
            # The signal handlers wake it; the timeout is a safety net and the watchdog's beat.
            select.select([self._wake_r], [], [], notifier.wait_seconds(5))
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake_r, 512):
                    pass
            notifier.watchdog()
            if self._reloading and not self._stopping:
                self._reloading = False
                self.reload()
        log.info("shutting down")
        notifier.notify("STOPPING=1")
        self.server.stop()
        # Probe processes run in sessions of their own: end them, or a probe server waiting for a
        # client would outlive the agent and hold its port.
        runner.stop_all()
        self.collectors.stop()
        self.node.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        return 0

    def stop(self) -> None:
        self._stopping = True
        self._wake()

    def _wake(self) -> None:
        # A full pipe already holds a wake-up; a closed one, the end of run().
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop()

    def _on_reload(self, signum: int, frame: FrameType | None) -> None:
        self._reloading = True
        self._wake()

    def _apply(self, config: configuration.Config) -> None:
        self.node.sync_xid_watcher(config)
        self.collectors.apply(config)

    def reload(self) -> bool:
        """Apply the config file again; a bad file is reported and the running config kept."""
        if self._stopping:
            return False
        try:
            new = configuration.load(self.config_path, self.overrides)
            web = webconfig.load(new.web_config_file)
        except configuration.ConfigError as err:
            log.error("reload failed, keeping the running configuration: %s", err)
            return False
        if new.listen != self.config.listen:
            log.warning("listen address changed to %s; it takes effect on restart", new.listen)
        if new.simulate != self.config.simulate:
            log.warning("simulate changed to %s; it takes effect on restart", new.simulate)
        logsetup.set_level(new.log_level)
        self.server.reconfigure(web)
        self.config, self.loaded_at = new, time.time()
        self._apply(new)
        log.info("configuration reloaded from %s", self.config_path or "defaults")
        return True


def scrape_once(config: configuration.Config) -> bytes:
    """One collection of every enabled collector, rendered; for `clusterhealth scrape`."""
    node, samplers = collect_once(config)
    try:
        return Exposition(lambda: samplers, lambda: config.node_name).render()
    finally:
        node.close()


def default_scenario(name: str) -> Path:
    from clusterhealth.exporters.sim.scenario import SCENARIO_DIR  # for `demo` only

    return SCENARIO_DIR / f"{name}.yaml"
