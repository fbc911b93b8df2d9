"""The parse(kind, text) entry point behind `clusterhealth probe parse --kind KIND FILE`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from clusterhealth.checks.probe_parsers import KINDS, REGISTRY, headline_help, parse, wrong_values_help
from clusterhealth.checks.probes.settings import ProbeConfig

from .conftest import run_cli

FIXTURES = Path(__file__).parent / "fixtures"
ONE_CAPTURE_PER_KIND = {
    "nccl-tests": FIXTURES / "nccl-tests" / "01_multinode_2x8_h100_allreduce_ib.txt",
    "iperf3": FIXTURES / "iperf3" / "01_tcp_loopback.json",
    "ib_write_bw": FIXTURES / "ib_write_bw" / "01_sweep_gbits_roce_gpudirect.txt",
    "nvbandwidth": FIXTURES / "nvbandwidth" / "02_d2d_read_ce_6x_a6000_v0.8.txt",
}


def test_the_specs_kinds_are_registered() -> None:
    # SPEC names three kinds for `probe parse --kind`; kinds added since come after them.
    assert KINDS[:3] == ("nccl-tests", "iperf3", "ib_write_bw")
    assert set(KINDS) == set(ONE_CAPTURE_PER_KIND)


def test_the_registry_the_config_and_the_command_line_agree() -> None:
    # One registry: each kind's module declares itself, and the config and `probe parse --kind`
    # accept exactly the registered kinds.
    field = next(f for f in dataclasses.fields(ProbeConfig) if f.name == "kind")
    assert field.metadata["choices"] == KINDS == tuple(REGISTRY)
    for name, declared in REGISTRY.items():
        assert declared.name == name
        assert declared.headline in headline_help()
        assert (f"{name}: {declared.wrong_values}" in wrong_values_help()) is bool(declared.wrong_values)
    usage = run_cli("probe", "parse", "--kind", "no-such-kind", "-")
    assert usage.returncode == 2
    assert "{" + ",".join(KINDS) + "}" in usage.stderr
    for name in KINDS:
        from_file = run_cli("probe", "parse", "--kind", name, str(ONE_CAPTURE_PER_KIND[name]))
        assert from_file.returncode == 0, from_file.stderr
        assert json.loads(from_file.stdout)["kind"] == name


@pytest.mark.parametrize("kind", ["", "nccl_tests", "iperf", "IB_WRITE_BW", "ib_read_bw"])
def test_unknown_kind_raises(kind: str) -> None:
    with pytest.raises(ValueError, match="unknown probe output kind"):
        parse(kind, "")


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_has_a_headline_and_a_verdict(kind: str) -> None:
    result = parse(kind, ONE_CAPTURE_PER_KIND[kind].read_text())
    as_dict = json.loads(json.dumps(result.to_dict(), allow_nan=False))

    assert result.verdict == "ok"
    assert result.errors == ()
    assert result.bandwidth_bytes_per_second is not None
    assert result.bandwidth_bytes_per_second > 1e8
    assert as_dict["kind"] == kind
    assert as_dict["bandwidth_bytes_per_second"] == result.bandwidth_bytes_per_second


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "garbage",
    ["", "not a probe output at all", "{", "\x00\xff", "<html><body>502 Bad Gateway</body></html>"],
)
def test_garbage_never_raises(kind: str, garbage: str) -> None:
    result = parse(kind, garbage)

    assert result.verdict in ("incomplete", "failed")
    assert result.errors
    assert result.bandwidth_bytes_per_second is None
    json.dumps(result.to_dict(), allow_nan=False)


@pytest.mark.parametrize("kind", KINDS)
def test_another_kinds_output_is_not_mistaken_for_a_result(kind: str) -> None:
    for other, path in ONE_CAPTURE_PER_KIND.items():
        if other == kind:
            continue
        result = parse(kind, path.read_text())
        assert result.verdict in ("incomplete", "failed"), (kind, other)
        assert result.bandwidth_bytes_per_second is None
