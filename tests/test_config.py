"""The config file: defaults, validation errors that name the key, flags over the file."""

from __future__ import annotations

import dataclasses
import signal
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest
import yaml

from clusterhealth.agent import config as configuration
from clusterhealth.agent import settings
from clusterhealth.checks.probes.settings import ProbeConfig

from .conftest import AgentProcess, run_cli, scenario, value


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "clusterhealth.yaml"
    path.write_text(text)
    return path


def test_every_key_is_optional() -> None:
    config = configuration.load(None)
    assert config.listen == ":9845"
    assert config.collectors.gpu.interval_seconds == 10.0
    assert config.paths.sysfs == "/sys"


def test_an_empty_file_means_defaults(tmp_path: Path) -> None:
    assert configuration.load(write(tmp_path, "")) == configuration.load(None)


def test_values_are_read_into_typed_objects(tmp_path: Path) -> None:
    path = write(tmp_path, "collectors:\n  gpu:\n    interval_seconds: 5\n    gpm: false\nlog_level: debug\n")
    config = configuration.load(path)
    assert config.collectors.gpu.interval_seconds == 5.0
    assert isinstance(config.collectors.gpu.interval_seconds, float)
    assert config.collectors.gpu.gpm is False
    assert config.log_level == "debug"


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("colectors: {}\n", "colectors", "one of the known keys"),
        ("collectors:\n  gpu:\n    intervall_seconds: 5\n", "collectors.gpu.intervall_seconds", "known keys"),
        ("collectors:\n  gpu:\n    interval_seconds: fast\n", "collectors.gpu.interval_seconds", "a number"),
        (
            "collectors:\n  gpu:\n    interval_seconds: 0.01\n",
            "collectors.gpu.interval_seconds",
            "between 0.5",
        ),
        ("collectors:\n  gpu:\n    enabled: 'yes'\n", "collectors.gpu.enabled", "true or false"),
        ("collectors:\n  gpu: [1, 2]\n", "collectors.gpu", "a mapping"),
        ("listen: 9845\n", "listen", "a string"),
        (
            "probes:\n  - {name: s, kind: iperf3, argv: [iperf3, -s, -1]}\n",
            "probes[0].argv[2]",
            "write it quoted, '-1'",
        ),
        ("listen: 'localhost'\n", "listen", "HOST:PORT"),
        ("listen: ':99999'\n", "listen", "HOST:PORT"),
        ("log_level: loud\n", "log_level", "one of debug, info, warning, error"),
        ("- a list\n", "<top level>", "a mapping"),
        ("listen: [unclosed\n", "<top level>", "valid YAML"),
    ],
)
def test_a_bad_value_names_the_file_the_key_and_what_was_expected(
    tmp_path: Path, text: str, key: str, expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(configuration.ConfigError) as caught:
        configuration.load(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {key}: expected ")
    assert expected in message


def test_bad_config_exits_2_with_the_key_in_the_message(tmp_path: Path) -> None:
    path = write(tmp_path, "collectors:\n  gpu:\n    interval_seconds: -1\n")
    for command in ("agent", "scrape"):
        result = run_cli(command, "--config", str(path))
        assert result.returncode == 2, result.stderr
        assert (
            f"{path}: collectors.gpu.interval_seconds: expected a number between 0.5 and 3600, got -1"
            in result.stderr
        )
        assert "Traceback" not in result.stderr


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    result = run_cli("agent", "--config", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert "nope.yaml" in result.stderr and "a readable file" in result.stderr


def test_bad_scenario_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text("gpu_count: 2\nfaults:\n  - gpu: 1\n    set: {temprature_celsius: 90}\n")
    result = run_cli("scrape", "--simulate", str(path))
    assert result.returncode == 2
    assert "faults[0].set.temprature_celsius" in result.stderr


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "listen: '127.0.0.1:1234'\npaths:\n  sysfs: /host/sys\n")
    result = run_cli(
        "agent", "--config", str(path), "--listen", ":4321", "--kmsg-path", "/tmp/kmsg", "--print-config"
    )
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed["listen"] == ":4321"
    assert printed["paths"] == {"sysfs": "/host/sys", "procfs": "/proc", "kmsg": "/tmp/kmsg"}


def test_print_config_output_is_a_valid_config(tmp_path: Path) -> None:
    result = run_cli("agent", "--print-config")
    assert result.returncode == 0
    path = write(tmp_path, result.stdout)
    assert configuration.load(path) == configuration.load(None)


def test_reference_documents_every_leaf_key() -> None:
    rows = settings.reference(configuration.Config)
    keys = [key for key, _, _ in rows]
    assert "collectors.gpu.interval_seconds" in keys
    assert all(doc for _, _, doc in rows)
    assert dict((k, d) for k, d, _ in rows)["collectors.gpu.interval_seconds"] == "10.0"
    assert dict((k, d) for k, d, _ in rows)["listen"] == '":9845"'


# Every collectors.<name> section: (interval_seconds default, its bounds, timeout_seconds default).
SCHEDULES = {
    "gpu": (10.0, (0.5, 3600), 30.0),
    "kernel_log": (5.0, (0.5, 3600), 30.0),
    "rdma": (15.0, (0.5, 3600), 30.0),
    "audit": (60.0, (1, 86400), 30.0),
    "xid": (5.0, (0.5, 3600), 30.0),
    "pcie_aer": (30.0, (0.5, 3600), 30.0),
    "probes": (2.0, (0.5, 3600), 10.0),
    "jobs": (15.0, (0.5, 3600), 10.0),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_every_collector_section_has_the_three_keys_first_with_its_own_defaults_and_bounds(name: str) -> None:
    every, (low, high), timeout = SCHEDULES[name]
    assert [f.name for f in dataclasses.fields(configuration.CollectorsConfig)] == list(SCHEDULES)
    section = getattr(configuration.Config().collectors, name)
    assert [f.name for f in dataclasses.fields(section)][:3] == [
        "enabled",
        "interval_seconds",
        "timeout_seconds",
    ]
    assert (section.enabled, section.interval_seconds, section.timeout_seconds) == (True, every, timeout)

    def load(key: str, seconds: float) -> configuration.Config:
        return settings.from_mapping(configuration.Config, {"collectors": {name: {key: seconds}}}, "f.yaml")

    for seconds in (low, high):
        assert getattr(load("interval_seconds", seconds).collectors, name).interval_seconds == seconds
    for seconds in (low / 2, high * 2):
        with pytest.raises(configuration.ConfigError) as caught:
            load("interval_seconds", seconds)
        assert str(caught.value).startswith(
            f"f.yaml: collectors.{name}.interval_seconds: expected a number between {low:g} and {high:g}"
        )
    with pytest.raises(configuration.ConfigError, match="between 1 and 3600"):
        load("timeout_seconds", 3601)


LATIN1_COMMENT = "# réseau du nœud\nlog_level: info\n".encode("latin-1", errors="replace")


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "clusterhealth.yaml"
    path.write_bytes(LATIN1_COMMENT)
    with pytest.raises(configuration.ConfigError) as caught:
        configuration.load(path)
    assert str(caught.value) == f"{path}: <top level>: expected a UTF-8 text file, got 'byte 0xe9 on line 1'"


def test_a_utf8_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "clusterhealth.yaml"
    path.write_bytes("\ufeff# réseau\nlog_level: debug\n".encode())
    assert configuration.load(path).log_level == "debug"


@pytest.mark.parametrize("command", ["agent", "scrape", "check"])
def test_a_file_that_is_not_utf8_exits_2_naming_it(tmp_path: Path, command: str) -> None:
    path = tmp_path / "clusterhealth.yaml"
    path.write_bytes(LATIN1_COMMENT)
    result = run_cli(command, "--config", str(path))
    assert result.returncode == 2, result.stderr
    assert f"configuration error: {path}: <top level>: expected a UTF-8 text file" in result.stderr
    assert "Traceback" not in result.stderr


def test_sighup_with_a_file_that_is_not_utf8_keeps_the_agent_serving(
    agent_process: Callable[..., AgentProcess], write_scenario: Callable[..., Path], tmp_path: Path
) -> None:
    path = write(
        tmp_path, "collectors:\n  gpu:\n    interval_seconds: 0.5\n  kernel_log:\n    enabled: false\n"
    )
    agent = agent_process("--config", str(path), "--simulate", str(write_scenario(scenario())))
    agent.wait_for(lambda: "clusterhealth_gpu_up" in agent.metrics(), what="GPU series")
    path.write_bytes(LATIN1_COMMENT)
    agent.signal(signal.SIGHUP)
    agent.wait_for(lambda: any("reload failed" in line for line in agent.lines), what="the reload error")
    error = next(line for line in agent.lines if "reload failed" in line)
    assert "level=error" in error and f"{path}: <top level>: expected a UTF-8 text file" in error
    assert agent.proc.poll() is None
    assert value(agent.metrics(), "clusterhealth_gpu_up", gpu="0") == 1
    assert agent.health()["collectors"]["gpu"]["interval_seconds"] == 0.5
    assert not any("Traceback" in line for line in agent.lines)


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        (
            "collectors:\n  gpu:\n    timeout_seconds: .nan\n",
            "collectors.gpu.timeout_seconds",
            "between 1 and",
        ),
        ("collectors:\n  gpu:\n    interval_seconds: .NaN\n", "collectors.gpu.interval_seconds", "between"),
        ("collectors:\n  rdma:\n    interval_seconds: .inf\n", "collectors.rdma.interval_seconds", "between"),
        (
            "collectors:\n  audit:\n    timeout_seconds: -.inf\n",
            "collectors.audit.timeout_seconds",
            "between",
        ),
        ("probing:\n  degraded_fraction: .nan\n", "probing.degraded_fraction", "between 0.01 and 1"),
        (
            "probes:\n  - {name: p, argv: [x], jitter_seconds: .nan}\n",
            "probes[0].jitter_seconds",
            "between 0 and",
        ),
        (
            "probes:\n  - {name: p, argv: [x], degraded_fraction: .nan}\n",
            "probes[0].degraded_fraction",
            "between",
        ),
        (
            "policy:\n  gpu_health:\n    xid_window_seconds: .nan\n",
            "policy.gpu_health.xid_window_seconds",
            "between 60 and",
        ),
        (
            "policy:\n  rdma_ports:\n    - {rate_gbps: .nan}\n",
            "policy.rdma_ports[0].rate_gbps",
            "between 1 and",
        ),
    ],
)
def test_nan_and_infinity_are_refused(tmp_path: Path, text: str, key: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(configuration.ConfigError) as caught:
        configuration.load(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {key}: expected a number ")
    assert expected in message


def _float_settings(cls: type, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(key path, the smallest data setting that key to NaN) for every float setting of `cls`."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = [a for a in get_args(hint) if a is not type(None)]
        hint = args[0] if get_origin(hint) in (Union, types.UnionType) else hint
        key = f"{path}.{f.name}" if path else f.name
        if dataclasses.is_dataclass(hint):
            for inner, data in _float_settings(hint, key):  # type: ignore[arg-type]
                yield inner, {f.name: data}
        elif get_origin(hint) is tuple and dataclasses.is_dataclass(args[0]):
            required = {"name": "p", "argv": ["x"]} if args[0] is ProbeConfig else {}
            for inner, data in _float_settings(args[0], f"{key}[0]"):
                yield inner, {f.name: [{**required, **data}]}
        elif hint is float:
            yield key, {f.name: float("nan")}


def test_every_float_setting_refuses_nan() -> None:
    # Found from the declarations, so that a float setting added later is covered too.
    floats = dict(_float_settings(configuration.Config))
    assert {"collectors.kernel_log.timeout_seconds", "probes[0].jitter_seconds"} <= floats.keys()
    assert "policy.rdma_ports[0].rate_gbps" in floats
    for key, data in floats.items():
        with pytest.raises(configuration.ConfigError) as caught:
            settings.from_mapping(configuration.Config, data, "f.yaml")
        assert str(caught.value).startswith(f"f.yaml: {key}: expected a number"), key
        assert str(caught.value).endswith(", got nan"), key


def test_nan_in_a_number_without_bounds_is_refused() -> None:
    with pytest.raises(configuration.ConfigError, match="expected a finite number, got nan"):
        settings._check_bounds(float("nan"), {}, "f.yaml", "k")


def test_a_bandwidth_too_large_for_a_float_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, f"probes:\n  - {{name: p, argv: [x], expect: '{'9' * 400} GB/s'}}\n")
    with pytest.raises(
        configuration.ConfigError, match=r"probes\[0\]\.expect: expected learn, or a bandwidth"
    ):
        configuration.load(path)


@pytest.mark.parametrize("port", ["²", "9" * 5000, "٣"])
def test_a_listen_port_int_cannot_read_is_a_config_error(port: str) -> None:
    with pytest.raises(configuration.ConfigError, match="listen: expected HOST:PORT"):
        configuration.load(None, {"listen": f"127.0.0.1:{port}"})


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        ("listen: ':1'\nlisten: ':2'\n", "listen", (1, 2)),
        (
            "collectors:\n  gpu:\n    interval_seconds: 5\n    interval_seconds: 7\n",
            "collectors.gpu.interval_seconds",
            (3, 4),
        ),
        ("collectors:\n  gpu: {}\ncollectors:\n  rdma: {}\n", "collectors", (1, 3)),
        ("probes:\n  - {name: a, argv: [x], name: b}\n", "probes[0].name", (2, 2)),
        ("policy:\n  firmware:\n    hca: {MT_1: '1.0', 'MT_1': '2.0'}\n", "policy.firmware.hca.MT_1", (3, 3)),
    ],
)
def test_a_key_given_twice_is_an_error_naming_it(
    tmp_path: Path, text: str, key: str, lines: tuple[int, int]
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(configuration.ConfigError) as caught:
        configuration.load(path)
    assert str(caught.value) == (
        f"{path}: {key}: expected each key once per mapping (lines {lines[0]} and {lines[1]} both set it)"
    )


def test_keys_merged_in_may_be_overridden(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "collectors:\n  gpu: &fast {interval_seconds: 5, timeout_seconds: 9}\n"
        "  rdma:\n    <<: *fast\n    interval_seconds: 3\n",
    )
    rdma = configuration.load(path).collectors.rdma
    assert (rdma.interval_seconds, rdma.timeout_seconds) == (3.0, 9.0)


# 283 bytes that stand for 3.2 million strings once the aliases are expanded.
ALIAS_BOMB = """\
listen:
  - &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
  - &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
  - &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
  - &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
  - &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
  - &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
  - [*f,*f,*f,*f,*f,*f]
"""


def test_aliases_expanding_past_the_limit_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, ALIAS_BOMB)
    with pytest.raises(configuration.ConfigError) as caught:
        configuration.load(path)
    assert str(caught.value) == (
        f"{path}: listen[5]: expected at most 100000 values once YAML aliases are expanded (found 597871)"
    )


def test_aliases_within_the_limit_still_work(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "probes:\n  - {name: a, argv: [x], peers: &hosts [h1, h2, h3]}\n"
        "  - {name: b, argv: [y], peers: *hosts}\n",
    )
    assert [p.peers for p in configuration.load(path).probes] == [("h1", "h2", "h3")] * 2


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "probes: &loop [*loop]\n")
    with pytest.raises(configuration.ConfigError, match=r"probes\[0\]: expected no alias inside the value"):
        configuration.load(path)


@pytest.mark.parametrize("depth", [40, 5000])
def test_deep_nesting_is_a_config_error(tmp_path: Path, depth: int) -> None:
    path = write(tmp_path, "listen: " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(configuration.ConfigError, match="expected values nested at most 32 levels deep"):
        configuration.load(path)


@pytest.mark.parametrize(
    ("text", "line"),
    [("simulate: 2001-13-45\n", 1), ("log_level: info\nlisten: " + "9" * 5000 + "\n", 2)],
)
def test_a_scalar_yaml_cannot_build_is_a_yaml_error_at_its_line(tmp_path: Path, text: str, line: int) -> None:
    path = write(tmp_path, text)
    with pytest.raises(
        configuration.ConfigError, match=rf": <top level>: expected valid YAML \(line {line}\)"
    ):
        configuration.load(path)


def test_an_error_message_renders_only_a_preview_of_the_value() -> None:
    class NotToBeRendered:
        def __repr__(self) -> str:
            raise AssertionError("the whole value was rendered")

    # What aliases make of a few hundred bytes: the same lists shared, billions of items deep.
    value: object = ["lol"] * 9
    for _ in range(9):
        value = [value] * 9
    value = [*([value] * 8), NotToBeRendered()]
    error = configuration.ConfigError("f.yaml", "listen", "a string", value)
    assert str(error).startswith("f.yaml: listen: expected a string, got [[[[")
    assert len(str(error)) < 120


def test_an_integer_too_long_to_print_is_shown_by_its_size(tmp_path: Path) -> None:
    path = write(tmp_path, "listen: 0x" + "f" * 5000 + "\n")
    with pytest.raises(configuration.ConfigError) as caught:
        configuration.load(path)
    assert str(caught.value) == f"{path}: listen: expected a string, got <an integer of 20000 bits>"


@pytest.mark.parametrize("text", ["\x00", "listen: ':1'\x07\n"])
def test_a_character_yaml_does_not_allow_is_a_config_error(tmp_path: Path, text: str) -> None:
    # Found by tests/test_fuzz.py: the YAML reader refuses them before parsing starts.
    path = write(tmp_path, text)
    with pytest.raises(configuration.ConfigError, match="expected valid YAML"):
        configuration.load(path)


def test_an_integer_too_large_for_a_float_is_out_of_range(tmp_path: Path) -> None:
    # Found by tests/test_fuzz.py: float() of it raised OverflowError out of the loader.
    path = write(tmp_path, "collectors:\n  gpu:\n    interval_seconds: -0x" + "f" * 300 + "\n")
    with pytest.raises(configuration.ConfigError) as caught:
        configuration.load(path)
    assert str(caught.value).startswith(
        f"{path}: collectors.gpu.interval_seconds: expected a number between 0.5"
    )
