"""A real Prometheus holding verdict histories written sample by sample, for the remediator's tests.

The histories are what agents would have exported, scrape by scrape (`Target`): written as
OpenMetrics, backfilled with `promtool tsdb create-blocks-from openmetrics` and served by the
Debian prometheus on a free port, so that each test asks a real Prometheus about a past it chose to
the second (a verdict that held 400 s, a series that stopped, an agent restart in the middle).
A ``remote_read`` to a closed port makes the same data answer with a warning (partial data).
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .prom import binary, free_port, wait_for

SCRAPE = 15.0


@dataclass(frozen=True)
class Span:
    """A verdict a target exported from ``start`` to ``end`` (Unix seconds, end excluded)."""

    start: float
    end: float
    state: str
    action: str


@dataclass(frozen=True)
class Target:
    instance: str
    node: str | None  # clusterhealth_node_info{node}; None: the target never said
    spans: tuple[Span, ...]
    checks: tuple[tuple[str, str, int], ...] = ()  # (check, subject, status) while not healthy
    extra: dict[str, str] = field(default_factory=dict)  # more target labels


def _labels(target: Target, **own: str) -> str:
    labels = {"instance": target.instance, "job": "clusterhealth", **target.extra, **own}
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def openmetrics(targets: Iterable[Target], step: float = SCRAPE) -> str:
    verdict, info, checks = [], [], []
    for target in targets:
        for span in target.spans:
            t = span.start
            while t < span.end:
                verdict.append(
                    f"clusterhealth_node_verdict{{{_labels(target, state=span.state, action=span.action)}}} "
                    f"1 {t:.3f}"
                )
                if target.node is not None:
                    info.append(f"clusterhealth_node_info{{{_labels(target, node=target.node)}}} 1 {t:.3f}")
                # The checks behind a verdict are not OK while it is not healthy.
                for check, subject, status in target.checks if span.state != "healthy" else ():
                    checks.append(
                        f"clusterhealth_check_status{{{_labels(target, check=check, subject=subject)}}} "
                        f"{status} {t:.3f}"
                    )
                t += step
    out = []
    for name, lines in (
        ("clusterhealth_node_verdict", verdict),
        ("clusterhealth_node_info", info),
        ("clusterhealth_check_status", checks),
    ):
        if not lines:
            continue
        out.append(f"# TYPE {name} gauge")
        # promtool wants each series' samples together and in time order.
        parts = sorted(
            (line.rsplit(" ", 2) for line in dict.fromkeys(lines)), key=lambda p: (p[0], float(p[2]))
        )
        out.extend(" ".join(p) for p in parts)
    out.append("# EOF")
    return "\n".join(out) + "\n"


def backfill(root: Path, text: str) -> Path:
    source, data = root / "history.om", root / "tsdb"
    source.write_text(text)
    subprocess.run(
        [
            binary("promtool", "prometheus"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(source),
            str(data),
        ],
        check=True,
        capture_output=True,
    )
    return data


@contextlib.contextmanager
def serve(root: Path, data: Path, partial: bool = False, name: str = "prometheus") -> Iterator[str]:
    """Prometheus over ``data`` (a copy with ``partial``: every answer carries a warning)."""
    config = "global:\n  scrape_interval: 15s\nscrape_configs: []\n"
    if partial:
        config += (
            f"remote_read:\n  - url: http://127.0.0.1:{free_port()}/api/v1/read\n    read_recent: true\n"
        )
    (root / f"{name}.yml").write_text(config)
    port = free_port()
    log = root / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                binary("prometheus", "prometheus"),
                f"--config.file={root / f'{name}.yml'}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=30d",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"prometheus exited: {log.read_text()[-3000:]}")
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)

        wait_for(ready, 60, f"prometheus on {url}", lambda: log.read_text()[-3000:])
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
