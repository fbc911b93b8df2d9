"""The panel helpers every dashboard is built from, with Grafana's foundation SDK.

One helper per kind of panel (`graph`, `grid`, `number`, `timeline`), each taking a title, a
description and `Query`s; `base` gives a dashboard its fixed uid, the `clusterhealth` tag, the
variables for the data source, the job and the node, and the links to the other dashboards;
`with_rows` lays rows of panels out in reading order. The dashboards themselves are in `fleet.py`,
`node.py`, `fabric.py` and `jobs.py`, and `build.py` writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

# The SDK's enums are enum.StrEnum (Python 3.11), which mypy, set to the project's 3.10, reads as
# plain str: the `type: ignore[arg-type]` below are for that alone.
TAGS = ["clusterhealth", "gpu", "rdma"]
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'job="$job",instance=~"$node"'
RATE = "$__rate_interval"

# clusterhealth_check_status and friends: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.
STATUS_MAPPINGS: list[dm.ValueMapping] = [
    dm.ValueMap(
        options={
            "0": dm.ValueMappingResult(text="OK", color="green", index=0),
            "1": dm.ValueMappingResult(text="WARNING", color="orange", index=1),
            "2": dm.ValueMappingResult(text="CRITICAL", color="red", index=2),
            "3": dm.ValueMappingResult(text="UNKNOWN", color="purple", index=3),
        }
    )
]
PORT_STATE_MAPPINGS: list[dm.ValueMapping] = [
    dm.ValueMap(
        options={
            "1": dm.ValueMappingResult(text="DOWN", color="red", index=0),
            "2": dm.ValueMappingResult(text="INIT", color="orange", index=1),
            "3": dm.ValueMappingResult(text="ARMED", color="orange", index=2),
            "4": dm.ValueMappingResult(text="ACTIVE", color="green", index=3),
        }
    )
]
# ports/N/phys_state (IBTA): what the cable and the PHY do, beside the logical state above.
PHYSICAL_STATE_MAPPINGS: list[dm.ValueMapping] = [
    dm.ValueMap(
        options={
            "1": dm.ValueMappingResult(text="Sleep", color="red", index=0),
            "2": dm.ValueMappingResult(text="Polling", color="red", index=1),
            "3": dm.ValueMappingResult(text="Disabled", color="red", index=2),
            "4": dm.ValueMappingResult(text="PortConfigurationTraining", color="orange", index=3),
            "5": dm.ValueMappingResult(text="LinkUp", color="green", index=4),
            "6": dm.ValueMappingResult(text="LinkErrorRecovery", color="orange", index=5),
            "7": dm.ValueMappingResult(text="PhyTest", color="orange", index=6),
        }
    )
]


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


def target(q: Query, ref: str) -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(q.expr).ref_id(ref).datasource(DATASOURCE)
    if q.legend:
        query = query.legend_format(q.legend)
    query = query.instant().format(pm.PromQueryFormat.TABLE) if q.instant else query.range()
    return query


def with_targets(panel: Builder[dm.Panel], queries: Sequence[Query]) -> Builder[dm.Panel]:
    for n, q in enumerate(queries):
        panel.with_target(target(q, chr(ord("A") + n)))  # type: ignore[attr-defined]
    return panel


def graph(
    title: str, description: str, queries: Sequence[Query], unit: str = "short", w: int = 12
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(8)
        .span(w)
        .fill_opacity(10)
        .show_points(common.VisibilityMode.NEVER)
        .legend(
            gc.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)  # type: ignore[arg-type]
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
    )
    with_targets(panel, queries)
    return panel


def grid(
    title: str,
    description: str,
    queries: Sequence[Query],
    w: int = 12,
    h: int = 8,
    mappings: list[dm.ValueMapping] | None = None,
    transformations: Sequence[dm.DataTransformerConfig] = (),
    unit: str = "short",
) -> table.Panel:
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .height(h)
        .span(w)
        .unit(unit)
    )
    if mappings:
        # On the values only: Grafana maps every field's values, so a label column's "1" (a port,
        # a GPU index) would read as a status.
        panel = panel.override_by_field_type("number", coloured(mappings))
    for transformation in transformations:
        panel = panel.with_transformation(transformation)
    with_targets(panel, queries)
    return panel


def xid_events(by: str) -> str:
    """Xid events per `by` within the rate interval. A code's first event on a GPU creates its
    series at 1, which increase() cannot see: a series younger than the interval counts with its
    value (first, so that its increase does not hide it), as the Xid alerts do."""
    series = f"clusterhealth_gpu_xid_errors_total{{{SEL}}}"
    return f"sum by ({by}) (({series} unless {series} offset {RATE}) or increase({series}[{RATE}]))"


def coloured(mappings: list[dm.ValueMapping]) -> list[dm.DynamicConfigValue]:
    """A table field's properties that show its values through `mappings`, in their colours."""
    return [
        dm.DynamicConfigValue(id_val="mappings", value=mappings),
        dm.DynamicConfigValue(
            id_val="custom.cellOptions",
            value=common.TableColoredBackgroundCellOptions(
                mode=common.TableCellBackgroundDisplayMode.BASIC  # type: ignore[arg-type]
            ),
        ),
    ]


def columns(names: dict[str, str], exclude: Sequence[str] = ("Time", "job")) -> dm.DataTransformerConfig:
    """`organize` that hides `exclude` and renames the value columns of a merged table."""
    return dm.DataTransformerConfig(
        id_val="organize",
        options={"excludeByName": dict.fromkeys(exclude, True), "renameByName": names},
    )


def number(title: str, description: str, query: Query, w: int = 4, unit: str = "short") -> stat.Panel:
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .height(4)
        .span(w)
        .unit(unit)
        .graph_mode(common.BigValueGraphMode.NONE)
    )
    with_targets(panel, [query])
    return panel


def timeline(title: str, description: str, queries: Sequence[Query], w: int = 12) -> statetimeline.Panel:
    panel = (
        statetimeline.Panel().title(title).description(description).datasource(DATASOURCE).height(8).span(w)
    )
    with_targets(panel, queries)
    return panel


def organize(exclude: Sequence[str]) -> dm.DataTransformerConfig:
    return dm.DataTransformerConfig(
        id_val="organize", options={"excludeByName": dict.fromkeys(exclude, True)}
    )


MERGE = dm.DataTransformerConfig(id_val="merge", options={})
HIDE_META = organize(["Time", "__name__", "job"])


def variables(node_multi: bool) -> list[Builder[dm.VariableModel]]:
    node = (
        gd.QueryVariable("node")
        .label("node")
        .description("The agent's instance (host:port)")
        .datasource(DATASOURCE)
        .query('label_values(clusterhealth_build_info{job="$job"}, instance)')
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.NATURAL_ASC)
    )
    if node_multi:
        node = node.multi(True).include_all(True).all_value(".*")
    return [
        gd.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        gd.QueryVariable("job")
        .label("job")
        .datasource(DATASOURCE)
        .query("label_values(clusterhealth_build_info, job)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC),
        node,
    ]


def base(uid: str, title: str, description: str, node_multi: bool) -> gd.Dashboard:
    return (
        gd.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .refresh("1m")
        .time("now-6h", "now")
        .timezone("browser")
        .variables(variables(node_multi))
        .link(
            gd.DashboardLink("clusterhealth")
            .type(dm.DashboardLinkType.DASHBOARDS)  # type: ignore[arg-type]
            .tags(["clusterhealth"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )


def with_rows(
    dashboard: gd.Dashboard, rows: Sequence[tuple[str, Sequence[Builder[dm.Panel]]]]
) -> gd.Dashboard:
    """`dashboard` with each row's title and then its panels, in order."""
    for title, panels in rows:
        dashboard = dashboard.with_row(gd.Row(title))
        for panel in panels:
            dashboard = dashboard.with_panel(panel)
    return dashboard
