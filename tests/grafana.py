"""What a Grafana panel shows, computed from a real Prometheus the way Grafana computes it.

Grafana itself cannot run here (no Debian, PyPI or npm package ships its server), so this module
does, for the features the dashboards use, what Grafana's Prometheus data source and panels do
with a dashboard JSON, and fails loudly on any feature it does not model (a new transformation, a
field matcher, a panel type), so that a dashboard cannot quietly outgrow the check:

- template variables: `$var`, `${var}` and `[[var]]` from the selected values, a single value
  escaped as Grafana's Prometheus data source escapes it (backslash and quote), a multi-value or
  All variable as a regex (its custom all value as it is); the built-ins `$__interval`,
  `$__interval_ms`, `$__rate_interval` (max(interval + scrape interval, 4 × scrape interval)),
  `$__range`, `$__range_s` and `$__range_ms`;
- the interval: the time range over the panel's max data points, rounded as Grafana rounds it, at
  least the data source's scrape interval (its `timeInterval`); a range query's start and end
  aligned to it, an instant query at the range's end;
- the frames: a range query's series named by the legend format (`{{label}}`), or by the metric
  and its labels; an instant query in table format as one table per query, with Time, the labels
  in name order and `Value` (`Value #<refId>` when the panel has several table queries);
- the panels' transformations `merge`, `organize` and `groupingToMatrix`, in order;
- field config: value mappings and units from the defaults, overridden by name or by field type,
  applied to every field as Grafana applies them (a label column's "1" maps like a value);
- what each panel type then shows: a time series or state timeline its series, a stat each
  series' last value, a table its first frame (Grafana puts the others behind a selector).

`summary()` writes what a panel shows as text: per query, what was sent and how many series came
back; per series or row, its values as displayed.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# What Grafana's interval calculator rounds an interval to: (upper bound, rounded), in seconds.
_ROUNDING = [
    (0.015, 0.01),
    (0.035, 0.02),
    (0.075, 0.05),
    (0.15, 0.1),
    (0.35, 0.2),
    (0.75, 0.5),
    (1.5, 1),
    (3.5, 2),
    (7.5, 5),
    (12.5, 10),
    (17.5, 15),
    (25, 20),
    (45, 30),
    (90, 60),
    (210, 120),
    (450, 300),
    (750, 600),
    (1050, 900),
    (1500, 1200),
    (2700, 1800),
    (5400, 3600),
    (9000, 7200),
    (16200, 10800),
    (32400, 21600),
    (86400, 43200),
]
MAX_DATA_POINTS = 1000  # about a half-width panel's pixels on a 1920-pixel screen
_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]")
_LEGEND = re.compile(r"\{\{\s*(.+?)\s*\}\}")
_REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|]")


def round_interval(seconds: float) -> float:
    for bound, rounded in _ROUNDING:
        if seconds < bound:
            return rounded
    return 86400 * 7


def duration(seconds: float) -> str:
    """A duration as Grafana writes it into a query: whole units, the largest that divides it."""
    ms = round(seconds * 1000)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True)
class TimeRange:
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Context:
    """Where and how the dashboard is looked at: the Prometheus, the data source's scrape interval,
    the time range and the variables' selected values (a list, or "$__all")."""

    prometheus: str
    dashboard: dict[str, Any]
    selected: dict[str, str | list[str]]
    time_range: TimeRange
    scrape_interval: float


def _variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}


def _variable_value(variable: dict[str, Any], value: str | list[str]) -> str:
    if variable.get("type") == "datasource":
        return str(value)
    if value == "$__all" or value == ["$__all"]:
        if not variable.get("includeAll"):
            raise AssertionError(f"variable {variable['name']} has no All option")
        if variable.get("allValue"):
            return str(variable["allValue"])
        raise AssertionError(f"variable {variable['name']}: All without a custom all value is not modelled")
    values = [value] if isinstance(value, str) else list(value)
    if not (variable.get("multi") or variable.get("includeAll")):
        (one,) = values
        return one.replace("\\", "\\\\").replace("'", "\\\\'")
    escaped = [_REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), v.replace("\\", "\\\\\\\\")) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def interval(ctx: Context, target: dict[str, Any]) -> float:
    minimum = _seconds(target.get("interval") or "") or ctx.scrape_interval
    return max(minimum, round_interval(ctx.time_range.seconds / MAX_DATA_POINTS))


def _seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text.strip())
    if not m:
        return 0.0
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def interpolate(ctx: Context, expr: str, step: float) -> str:
    """`expr` as Grafana sends it: the built-ins, then the dashboard's variables."""
    rng = ctx.time_range.seconds
    rate = max(step + ctx.scrape_interval, 4 * ctx.scrape_interval)
    for name, value in (
        ("$__interval_ms", str(round(step * 1000))),
        ("$__interval", duration(step)),
        ("$__rate_interval", duration(rate)),
        ("$__range_ms", str(round(rng * 1000))),
        ("$__range_s", str(round(rng))),
        ("$__range", f"{round(rng)}s"),
    ):
        expr = expr.replace(name, value)
    variables = _variables(ctx.dashboard)

    def replace(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in variables:
            return m.group(0)  # not a variable (a label_replace "$1"): left as it is, as Grafana does
        if name not in ctx.selected:
            raise AssertionError(f"no value selected for ${name}")
        return _variable_value(variables[name], ctx.selected[name])

    return _VARIABLE.sub(replace, expr)


def _api(prometheus: str, path: str, params: list[tuple[str, str]]) -> Any:
    url = f"{prometheus}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.loads(response.read())
    if body.get("status") != "success":
        raise AssertionError(f"{path} {params}: {body}")
    return body["data"]


def variable_options(ctx: Context, name: str) -> list[str]:
    """The values a query variable offers: `label_values(selector, label)` or `label_values(label)`."""
    variable = _variables(ctx.dashboard)[name]
    query = variable["query"]
    query = query.get("query", "") if isinstance(query, dict) else query
    m = re.fullmatch(r"label_values\((?:(.+),\s*)?(\w+)\)", interpolate(ctx, query, ctx.scrape_interval))
    if not m:
        raise AssertionError(f"variable {name}: query {query!r} is not modelled")
    params = [("start", str(ctx.time_range.start)), ("end", str(ctx.time_range.end))]
    if m.group(1):
        params.append(("match[]", m.group(1)))
    return sorted(_api(ctx.prometheus, f"label/{m.group(2)}/values", params))


# ---- frames


@dataclass
class Series:
    """One series of a range query, as a time series panel plots it."""

    ref: str
    name: str
    labels: dict[str, str]
    points: list[tuple[float, float]]

    def last(self) -> float:
        return self.points[-1][1] if self.points else math.nan


@dataclass
class Table:
    """A table frame: its columns in order, their types ("time", "string", "number") and rows."""

    columns: list[str]
    types: dict[str, str]
    rows: list[dict[str, Any]]

    def column(self, name: str) -> list[Any]:
        return [row.get(name) for row in self.rows]


def _legend(legend: str, labels: dict[str, str], expr: str) -> str:
    if legend and legend != "__auto":
        return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), legend)
    name = labels.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    if not name and not rest:
        return expr
    return f"{name}{{{rest}}}" if rest else name


def _number(text: Any) -> float:
    return float(text)


@dataclass
class Query:
    ref: str
    expr: str  # as sent
    kind: str  # "range" or "instant"
    count: int  # series that came back


@dataclass
class Shown:
    """What a panel shows: its queries as sent, the series (time series, stat, state timeline) or
    the table frames after the transformations (a table panel shows the first), and each field's
    display config (mappings and unit, after overrides)."""

    title: str
    type: str
    queries: list[Query] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    display: Callable[[str, str, Any], str] = lambda column, kind, value: str(value)

    @property
    def table(self) -> Table:
        """The frame the table panel shows (its first); an empty table when none."""
        return self.tables[0] if self.tables else Table([], {}, [])

    def text(self, column: str, value: Any) -> str:
        """A cell's text as displayed: its value mapped, or the value."""
        return self.display(column, self.table.types.get(column, "string"), value)

    def rows(self) -> list[dict[str, str]]:
        """The shown table's rows as displayed text, column by column."""
        return [{c: self.text(c, row.get(c)) for c in self.table.columns} for row in self.table.rows]

    def values(self) -> dict[str, float]:
        """Each series' last value, by name (a stat's numbers; a graph's legend "last")."""
        return {s.name: s.last() for s in self.series}

    def summary(self) -> str:
        out = [f"{self.title} ({self.type})"]
        for q in self.queries:
            out.append(f"  {q.ref} {q.kind}: {q.expr}\n     -> {q.count} series")
        if self.type == "table":
            if len(self.tables) > 1:
                out.append(f"  {len(self.tables)} frames: the first is shown, the others behind a selector")
            for n, table in enumerate(self.tables):
                out.append(f"  frame {n}: | " + " | ".join(table.columns) + " |")
                for row in self.rows() if n == 0 else table.rows:
                    out.append("    | " + " | ".join(str(row.get(c, "")) for c in table.columns) + " |")
        else:
            for s in self.series:
                values = [v for _, v in s.points]
                shown = (
                    "no points"
                    if not values
                    else f"last {values[-1]:.6g}, min {min(values):.6g}, max {max(values):.6g}"
                )
                out.append(f"  {s.name}: {shown} ({len(values)} points)")
        if not self.series and not self.tables:
            out.append("  No data")
        return "\n".join(out)


def _fetch(ctx: Context, target: dict[str, Any], table_refs: int) -> tuple[Query, list[Series], Table | None]:
    step = interval(ctx, target)
    expr = interpolate(ctx, target["expr"], step)
    ref = target["refId"]
    if target.get("instant"):
        data = _api(ctx.prometheus, "query", [("query", expr), ("time", f"{ctx.time_range.end:.3f}")])
        result = data["result"]
        if data["resultType"] == "scalar":
            result = [{"metric": {}, "value": result}]
        if target.get("format") != "table":
            series = [
                Series(
                    ref,
                    _legend(target.get("legendFormat", ""), r["metric"], expr),
                    r["metric"],
                    [(float(r["value"][0]), _number(r["value"][1]))],
                )
                for r in result
            ]
            return Query(ref, expr, "instant", len(result)), series, None
        value = f"Value #{ref}" if table_refs > 1 else "Value"
        labels = sorted({k for r in result for k in r["metric"]})
        table = Table(
            ["Time", *labels, value],
            {"Time": "time", **dict.fromkeys(labels, "string"), value: "number"},
            [{"Time": float(r["value"][0]), **r["metric"], value: _number(r["value"][1])} for r in result],
        )
        return Query(ref, expr, "instant", len(result)), [], table if result else None
    start = math.floor(ctx.time_range.start / step) * step
    end = math.floor(ctx.time_range.end / step) * step
    params = [("query", expr), ("start", f"{start:.3f}"), ("end", f"{end:.3f}"), ("step", f"{step:g}")]
    result = _api(ctx.prometheus, "query_range", params)["result"]
    series = [
        Series(
            ref,
            _legend(target.get("legendFormat", ""), r["metric"], expr),
            r["metric"],
            [(float(t), _number(v)) for t, v in r["values"]],
        )
        for r in result
    ]
    return Query(ref, expr, "range", len(result)), series, None


# ---- transformations


def _merge(tables: list[Table]) -> list[Table]:
    """Grafana's `merge`: rows whose fields common to every frame are equal become one row, unless
    another field they both have differs."""
    if len(tables) <= 1:
        return tables
    columns: list[str] = []
    types: dict[str, str] = {}
    for t in tables:
        for c in t.columns:
            if c not in types:
                columns.append(c)
                types[c] = t.types[c]
    keys = [c for c in tables[-1].columns if all(c in t.columns for t in tables)]
    if not keys:
        return tables
    rows: list[dict[str, Any]] = []
    by_key: dict[str, list[int]] = {}
    for t in tables:
        for row in t.rows:
            key = "\x00".join(str(row.get(k)) for k in keys)
            for index in by_key.get(key, []):
                existing = rows[index]
                if all(existing.get(c) in (None, v) for c, v in row.items()):
                    existing.update(row)
                    break
            else:
                by_key.setdefault(key, []).append(len(rows))
                rows.append(dict(row))
    return [Table(columns, types, rows)]


def _organize(tables: list[Table], options: dict[str, Any]) -> list[Table]:
    excluded = {k for k, v in options.get("excludeByName", {}).items() if v}
    renames = options.get("renameByName", {})
    order = options.get("indexByName", {})
    out = []
    for t in tables:
        kept = [c for c in t.columns if c not in excluded]
        if order:
            kept.sort(key=lambda c: order.get(c, len(order) + kept.index(c)))
        out.append(
            Table(
                [renames.get(c, c) for c in kept],
                {renames.get(c, c): t.types[c] for c in kept},
                [{renames.get(c, c): row[c] for c in kept if c in row} for row in t.rows],
            )
        )
    return out


def _grouping_to_matrix(tables: list[Table], options: dict[str, Any]) -> list[Table]:
    row_field, column_field, value_field = (
        options.get("rowField", ""),
        options.get("columnField", ""),
        options.get("valueField", ""),
    )
    out = []
    for t in tables:
        if not {row_field, column_field, value_field} <= set(t.columns):
            out.append(t)
            continue
        row_keys = list(dict.fromkeys(str(r[row_field]) for r in t.rows if row_field in r))
        column_keys = list(dict.fromkeys(str(r[column_field]) for r in t.rows if column_field in r))
        cells = {(str(r.get(row_field)), str(r.get(column_field))): r.get(value_field) for r in t.rows}
        first = f"{row_field}\\{column_field}"
        out.append(
            Table(
                [first, *column_keys],
                {first: "string", **dict.fromkeys(column_keys, t.types[value_field])},
                [{first: k, **{c: cells.get((k, c)) for c in column_keys}} for k in row_keys],
            )
        )
    return out


def _sort_by(tables: list[Table], options: dict[str, Any]) -> list[Table]:
    """Grafana's `sortBy` on plain frames: by the FIRST field of `sort` alone (sortDataFrames takes
    `s[0]`; the others are ignored), a stable sort, so several keys take several transformations,
    the least significant first."""
    sort = options.get("sort") or []
    if not sort:
        return tables
    field, desc = sort[0].get("field"), bool(sort[0].get("desc"))
    out = []
    for t in tables:
        if field not in t.columns:
            out.append(t)
            continue
        number = t.types[field] in ("number", "time")

        def key(row: dict[str, Any], number: bool = number) -> tuple[int, Any]:
            value = row.get(field)
            if value is None:
                return (1, 0)  # Grafana sorts missing values last
            return (0, float(value) if number else str(value))

        out.append(Table(t.columns, t.types, sorted(t.rows, key=key, reverse=desc)))
    return out


TRANSFORMATIONS: dict[str, Callable[[list[Table], dict[str, Any]], list[Table]]] = {
    "merge": lambda tables, _: _merge(tables),
    "sortBy": _sort_by,
    "organize": _organize,
    "groupingToMatrix": _grouping_to_matrix,
}


# ---- field config


def _matches(matcher: dict[str, Any], column: str, kind: str) -> bool:
    if matcher["id"] == "byName":
        return bool(matcher["options"] == column)
    if matcher["id"] == "byType":
        return bool(matcher["options"] == kind)
    raise AssertionError(f"field matcher {matcher['id']!r} is not modelled")


def _config(panel: dict[str, Any], column: str, kind: str) -> dict[str, Any]:
    config = dict(panel.get("fieldConfig", {}).get("defaults", {}))
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        if _matches(override["matcher"], column, kind):
            for prop in override.get("properties", []):
                config[prop["id"]] = prop.get("value")
    return config


def _mapped(mappings: list[dict[str, Any]], value: Any) -> str | None:
    for mapping in mappings:
        if mapping["type"] != "value":
            raise AssertionError(f"value mapping type {mapping['type']!r} is not modelled")
        key = _format(value)
        if key in mapping["options"]:
            return str(mapping["options"][key].get("text", key))
    return None


def _format(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def display(panel: dict[str, Any]) -> Callable[[str, str, Any], str]:
    def text(column: str, kind: str, value: Any) -> str:
        if value is None:
            return ""
        mapped = _mapped(_config(panel, column, kind).get("mappings") or [], value)
        return mapped if mapped is not None else _format(value)

    return text


PANEL_TYPES = {"timeseries", "table", "stat", "state-timeline"}


def show(ctx: Context, panel: dict[str, Any]) -> Shown:
    """What `panel` shows in `ctx`."""
    if panel["type"] not in PANEL_TYPES:
        raise AssertionError(f"{panel['title']}: panel type {panel['type']!r} is not modelled")
    calcs = panel.get("options", {}).get("reduceOptions", {}).get("calcs", [])
    if panel["type"] == "stat" and calcs not in ([], ["last"]):
        raise AssertionError(
            f"{panel['title']}: a stat reduced by {calcs} is not modelled (Grafana's default is last)"
        )
    shown = Shown(panel["title"], panel["type"], display=display(panel))
    targets = [t for t in panel.get("targets", []) if not t.get("hide")]
    table_refs = sum(1 for t in targets if t.get("format") == "table")
    tables: list[Table] = []
    for target in targets:
        query, series, table = _fetch(ctx, target, table_refs)
        shown.queries.append(query)
        shown.series += series
        if table is not None:
            tables.append(table)
    for transformation in panel.get("transformations", []):
        if transformation.get("disabled"):
            continue
        if transformation["id"] not in TRANSFORMATIONS:
            raise AssertionError(f"{panel['title']}: transformation {transformation['id']!r} is not modelled")
        if shown.series and not tables:
            raise AssertionError(f"{panel['title']}: transformations of time series are not modelled")
        tables = TRANSFORMATIONS[transformation["id"]](tables, transformation.get("options", {}))
    shown.tables = tables
    return shown


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that queries (rows left out), in reading order."""
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            yield panel
        yield from (p for p in panel.get("panels", []) if p["type"] != "row")
