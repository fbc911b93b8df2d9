"""The generated parts of the documentation: the Xid table of docs/runbooks/GPUXidCritical.md (from
the Xid catalog), the alert and parameter tables of docs/deploy.md, and the index of
docs/runbooks/README.md."""

from __future__ import annotations

import dataclasses

from .areas import alerts
from .config import Config
from .lib import splice

XID_TABLE_BEGIN = "<!-- BEGIN GENERATED XID TABLE -->\n"
XID_TABLE_END = "<!-- END GENERATED XID TABLE -->\n"


def xid_runbook(text: str, config: Config) -> str:
    """The GPUXidCritical runbook with its table of codes refreshed from the Xid catalog: each
    code's alert (page, ticket or none) and what `clusterhealth check` makes of it (CRITICAL drains
    a Slurm node)."""
    from clusterhealth.checks.xid_catalog import XID_CATALOG

    audit = {"critical": "CRITICAL (drains)", "warning": "WARNING", "info": "OK"}
    rows = ["| Xid | name | alert | check | meaning | action |", "| --- | --- | --- | --- | --- | --- |"]
    for code, info in sorted(XID_CATALOG.items()):
        if code in config.critical_xids:
            alert = "critical (page)"
        elif code in config.ticket_xids:
            alert = "warning (ticket)"
        else:
            alert = "none"
        cells = (str(code), f"`{info.name}`", alert, audit[info.severity], info.meaning, info.action)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return splice(text, XID_TABLE_BEGIN, XID_TABLE_END, "\n".join(rows) + "\n")


DOC_BEGIN = "<!-- BEGIN GENERATED RULES REFERENCE -->\n"
DOC_END = "<!-- END GENERATED RULES REFERENCE -->\n"


def reference_markdown(config: Config) -> str:
    """The alert table and the parameter table of docs/deploy.md."""

    def cell(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    lines = ["| alert | severity | for | expression |", "| --- | --- | --- | --- |"]
    for alert in alerts(config):
        lines.append(
            f"| [{alert.name}](runbooks/{alert.name}.md) | {alert.severity} | {alert.for_} | "
            f"`{cell(alert.expr)}` |"
        )
    lines += ["", "| parameter | default | meaning |", "| --- | --- | --- |"]
    for f in dataclasses.fields(Config):
        default = getattr(config, f.name)
        shown = ", ".join(str(v) for v in default) if isinstance(default, tuple) else str(default)
        lines.append(f"| `{f.name}` | `{cell(shown) or '(empty)'}` | {cell(f.metadata['doc'])} |")
    return "\n".join(lines) + "\n"


def with_reference(text: str, config: Config) -> str:
    return splice(text, DOC_BEGIN, DOC_END, reference_markdown(config))


INDEX_BEGIN = "<!-- BEGIN GENERATED RUNBOOK INDEX -->\n"
INDEX_END = "<!-- END GENERATED RUNBOOK INDEX -->\n"


def runbook_index(config: Config) -> str:
    """One row per alert, its severities (critical first) and its runbook."""
    severities: dict[str, list[str]] = {}
    for alert in alerts(config):
        severities.setdefault(alert.name, []).append(alert.severity)
    lines = ["| alert | severity | page |", "| --- | --- | --- |"]
    for name, levels in severities.items():
        shown = ", ".join(sorted(set(levels), key=("critical", "warning").index))
        lines.append(f"| {name} | {shown} | [{name}.md]({name}.md) |")
    return "\n".join(lines) + "\n"


def with_runbook_index(text: str, config: Config) -> str:
    return splice(text, INDEX_BEGIN, INDEX_END, runbook_index(config))
