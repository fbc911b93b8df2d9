"""agent/exposition.py's Renderer writes what prometheus_client's generate_latest writes, byte for
byte, on the golden node and on families made to be awkward, rendering after rendering."""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, Sample
from prometheus_client.parser import text_string_to_metric_families

from clusterhealth.agent.exposition import Renderer

GOLDEN = Path(__file__).parent / "golden" / "h100-faulty.prom"


class _Families:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def library(families: list[Metric]) -> bytes:
    return generate_latest(_Families(families))  # type: ignore[arg-type]


def test_the_golden_node_renders_as_the_library_renders_it_every_time() -> None:
    families = list(text_string_to_metric_families(GOLDEN.read_text()))
    renderer = Renderer()
    assert renderer.render(families) == library(families)
    # Again with every value changed: the kept line prefixes with new values.
    for family in families:
        family.samples = [s._replace(value=s.value * 3 + 0.5) for s in family.samples]
    assert renderer.render(families) == library(families)


LABEL_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0.0, -0.0, 1e21, 123456789.0, 2**64 - 1]),
)


@st.composite
def families(draw: st.DrawFn) -> list[Metric]:
    made: list[Metric] = []
    for number in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["gauge", "counter", "opaque"]))
        name = f"family_{number}"
        documentation = draw(LABEL_TEXT)
        labels = draw(st.lists(st.sampled_from(["b", "a", "device", "le"]), max_size=3, unique=True))
        family: Metric
        if kind == "gauge":
            family = GaugeMetricFamily(name, documentation, labels=labels)
        elif kind == "counter":
            family = CounterMetricFamily(name, documentation, labels=labels)
        else:
            family = Metric(
                name, documentation, draw(st.sampled_from(["untyped", "info", "stateset", "unknown"]))
            )
        for _ in range(draw(st.integers(0, 4))):
            values = {label: draw(LABEL_TEXT) for label in labels}
            sample_name = name + draw(st.sampled_from(["", "_total", "_created", "_info"]))
            timestamp = draw(st.one_of(st.none(), st.floats(0, 2e9)))
            family.samples.append(Sample(sample_name, values, draw(VALUES), timestamp))
        made.append(family)
    return made


@given(families(), st.lists(VALUES, min_size=1, max_size=3))
@settings(max_examples=300, derandomize=True, database=None, deadline=None)
def test_any_families_render_as_the_library_renders_them(made: list[Metric], later: list[float]) -> None:
    renderer = Renderer()
    assert renderer.render(made) == library(made)
    for value in later:  # the same series with other values: from the kept prefixes
        for family in made:
            family.samples = [s._replace(value=value) for s in family.samples]
        assert renderer.render(made) == library(made)


def test_a_series_gone_is_forgotten() -> None:
    renderer = Renderer()
    gauge = GaugeMetricFamily("g", "a gauge", labels=["device"])
    for device in range(100):
        gauge.add_metric([f"mlx5_{device}"], device)
    renderer.render([gauge])
    one = GaugeMetricFamily("g", "a gauge", labels=["device"])
    one.add_metric(["mlx5_0"], math.pi)
    assert renderer.render([one]) == library([one])
    assert len(renderer._prefixes) == 1
