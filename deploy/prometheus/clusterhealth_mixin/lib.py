"""What every area builds with: the rules as data (`Alert`, `Record`, `Group`), what an alert is
about (`SUBJECTS`, from which the Alertmanager inhibitions are generated), the PromQL helpers and
the annotation fragments the areas share."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .config import Config

# What an alert is about: the labels that name the thing it concerns in every alert it raises (a
# test checks them against the promtool cases). Alertmanager's inhibitions are generated from them
# (`inhibit_rules`).
SUBJECTS: dict[str, tuple[str, ...]] = {
    "fleet": (),
    "node": ("instance",),
    "gpu": ("instance", "gpu"),
    "rdma_port": ("instance", "device", "port"),
    "hca": ("instance", "device"),
    "pci_function": ("instance", "device"),
    "interface": ("instance", "interface"),
    "firmware": ("instance", "component", "subject"),
    "check": ("instance", "check", "subject"),
    "probe": ("instance", "probe"),
    "collector": ("instance", "collector"),
    # A workload on a node (JobHitByNodeFault): `job` is stored as `exported_job` beside
    # Prometheus's own scrape job.
    "job": ("instance", "scheduler", "exported_job", "namespace", "pod"),
    # The remediator (one per fleet, its own scrape job).
    "remediator": ("instance",),
}


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str
    expr: str
    summary: str
    description: str
    for_: str = "0m"
    about: str = "node"
    """What the alert is about, a key of SUBJECTS: the labels that name it."""


@dataclass(frozen=True)
class Record:
    record: str
    expr: str


@dataclass(frozen=True)
class Group:
    name: str
    rules: Sequence[Alert | Record]


def matchers(config: Config, *extra: str) -> str:
    """`{selector,extra...}`: the agent's scrape job and the extra matchers given."""
    return "{" + ",".join(m for m in (config.selector, *extra) if m) + "}"


def selector(config: Config) -> Callable[..., str]:
    """`matchers` bound to `config`: `m()` is the job's selector, `m('gpu="0"')` one more matcher."""

    def m(*extra: str) -> str:
        return matchers(config, *extra)

    return m


def alternation(values: Iterable[object]) -> str:
    return "|".join(str(v) for v in values)


def joined(expr: str, extra: str) -> str:
    """`expr`, or `expr` or `extra` when a hook expression is set."""
    if not extra:
        return expr
    return f"(\n{indent(expr)}\n)\nor\n(\n{indent(extra.strip())}\n)"


def indent(text: str) -> str:
    return "\n".join("  " + line if line else line for line in text.splitlines())


# A GPU lost before it ever answered has no uuid (the label is empty).
GPU = "GPU {{ $labels.gpu }}{{ if $labels.uuid }} ({{ $labels.uuid }}){{ end }} on {{ $labels.instance }}"
PORT = "RDMA port {{ $labels.device }}/{{ $labels.port }} on {{ $labels.instance }}"


def quote(record: str, labels: Sequence[str], text: str, fmt: str = "%.2f") -> str:
    """A template that writes `text` with its first `{}` replaced by the value of the recorded
    series `record` for the alert's own `labels`, and nothing when the rule has no such series (the
    annotation then reads without it). Prometheus runs the query when it expands the template.
    `text` may hold other quotes after its `{}`: they nest."""
    where = ",".join(f'{label}="%s"' for label in labels)
    args = " ".join(f"$labels.{label}" for label in labels)
    value = '{{ . | first | value | printf "' + fmt + '" }}'
    body = text.replace("{}", value, 1)
    return f"{{{{ with printf `{record}{{{where}}}` {args} | query }}}}{body}{{{{ end }}}}"


def splice(text: str, begin: str, end: str, body: str) -> str:
    """`text` with what stands between the markers `begin` and `end` replaced by `body`; a file
    that lost a marker is an error, not a second generated block appended at its end."""
    head, found_begin, rest = text.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not (found_begin and found_end):
        raise ValueError(f"the generated block's markers are missing: {begin.strip()} ... {end.strip()}")
    return head + begin + body + end + tail
