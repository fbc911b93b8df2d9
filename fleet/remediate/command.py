"""`clusterhealth remediate`'s command: the ``--listen`` endpoint, signals, output (fleet/cli.py
declares its options, so that the command line loads none of this).

``--once`` prints what it did or would do, one line per order, then the nodes it left alone
for a reason worth reading (vetoed, someone else's, deferred, no verdict), and exits with the
reconcile's code (fleet/remediate/reconcile.py). Without ``--once`` it reconciles every
``interval_seconds`` until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from clusterhealth.agent import log as logsetup
from clusterhealth.agent.settings import ConfigError
from clusterhealth.fleet.prometheus import Prometheus, valid_url
from clusterhealth.fleet.remediate import config as configuration
from clusterhealth.fleet.remediate import engine
from clusterhealth.fleet.remediate.backend import BackendError
from clusterhealth.fleet.remediate.reconcile import (
    EXIT_DONE,
    EXIT_USAGE,
    Remediator,
    Result,
    open_backend,
)

# The statuses --once lists (healthy nodes, and those waiting for their hold, are only counted).
_LISTED = (
    engine.VETO, engine.OTHER, engine.UNKNOWN_NODE, engine.NO_VERDICT, engine.UNTRUSTED,
    engine.QUARANTINED, engine.HELD_FOR_PERSON, *engine.DEFERRED,
)  # fmt: skip


def _usage(problem: str) -> int:
    print(f"clusterhealth remediate: {problem}", file=sys.stderr)
    return EXIT_USAGE


def _listen(text: str) -> tuple[str, int] | None:
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        return None
    return host.strip("[]") or "0.0.0.0", int(port)


def main(args: argparse.Namespace) -> int:
    from clusterhealth.fleet.pairwise import valid_probe

    if not valid_url(args.prometheus):
        return _usage(f"--prometheus: expected http(s)://HOST:PORT, got {args.prometheus!r}")
    address = _listen(args.listen) if args.listen is not None else None
    if args.listen is not None and address is None:
        return _usage(f"--listen: expected HOST:PORT, got {args.listen!r}")
    if args.fabric is not None and not valid_probe(args.fabric):
        return _usage(f"--fabric: expected a pairwise group's name, got {args.fabric!r}")
    try:
        config = configuration.load(args.config)
    except ConfigError as err:
        return _usage(str(err))
    logsetup.setup(config.log_level)
    try:
        backend = open_backend(args.backend, config, dry_run=not args.act)
    except ModuleNotFoundError:
        return _usage(f"--backend {args.backend}: not available in this version")
    except (ConfigError, BackendError) as err:  # BackendError: a client library or credentials missing
        return _usage(str(err))
    prometheus = Prometheus(args.prometheus, timeout=config.prometheus_timeout_seconds)
    remediator = Remediator(config, backend, prometheus, act=args.act, fabric=args.fabric)
    server: Any = None
    try:
        if address is not None:
            from prometheus_client import start_http_server

            from clusterhealth.fleet.remediate.metrics import registry

            try:
                server, _ = start_http_server(address[1], address[0], registry(remediator.tally))
            except OSError as err:
                return _usage(f"--listen {args.listen}: {err.strerror or err}")
        if args.once:
            result = remediator.reconcile()
            sys.stdout.write(render(result, args.act))
            return result.code
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        remediator.run(stop)
        return EXIT_DONE
    finally:
        backend.close()
        if server is not None:
            server.shutdown()


def render(result: Result, act: bool) -> str:
    """--once's report: the orders, then the nodes left alone for a reason worth reading."""
    if result.plan is None:
        return f"{result.problem}\n"
    lines = []
    for order in result.done:
        lines.append(f"{order.operation} {order.node}: {order.reason} ({order.why})")
    for order in result.would:
        lines.append(f"would {order.operation} {order.node}: {order.reason} ({order.why})")
    for item in result.plan.left:
        if item.status in _LISTED:
            lines.append(f"{item.status} {item.node}: {item.detail}")
    if result.problem:
        lines.append(f"stopped: {result.problem}")
    budget = result.plan.budget
    counts = ", ".join(f"{n} {status}" for status, n in sorted(result.plan.statuses().items()))
    lines.append(
        f"budget: {budget.used} of {budget.max_unavailable} out of service by us, slow start width "
        f"{budget.width}; nodes: {counts or 'none'}{'' if act else '; dry-run: nothing was touched'}"
    )
    return "\n".join(lines) + "\n"
