"""The config file: defaults, validation errors that name the key, flags over the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clusterhealth.agent import config as configuration

from .conftest import run_cli


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
    rows = configuration.reference()
    keys = [key for key, _, _ in rows]
    assert "collectors.gpu.interval_seconds" in keys
    assert all(doc for _, _, doc in rows)
    assert dict((k, d) for k, d, _ in rows)["collectors.gpu.interval_seconds"] == "10.0"
    assert dict((k, d) for k, d, _ in rows)["listen"] == '":9845"'
