"""The `clusterhealth` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clusterhealth.agent import __version__
from clusterhealth.agent import config as configuration
from clusterhealth.agent import log as logsetup
from clusterhealth.checks import probe_parsers
from clusterhealth.checks.probes.settings import parse_bandwidth
from clusterhealth.checks.schema import check_pattern
from clusterhealth.fleet import cli as fleet_cli

EXIT_CONFIG = 2

# Flags that override a key of the config file, and the key they override.
OVERRIDES = {
    "listen": "listen",
    "sysfs_root": "paths.sysfs",
    "procfs_root": "paths.procfs",
    "kmsg_path": "paths.kmsg",
    "simulate": "simulate",
    "log_level": "log_level",
    "web_config_file": "web_config_file",
    "node_name": "node_name",
    "pod_resources_socket": "collectors.jobs.pod_resources_socket",
    "job_mapping_dir": "collectors.jobs.mapping_dir",
}


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML config file (every key optional)")
    parser.add_argument("--sysfs-root", metavar="DIR", help="root of sysfs (default /sys)")
    parser.add_argument("--procfs-root", metavar="DIR", help="root of procfs (default /proc)")
    parser.add_argument("--kmsg-path", metavar="FILE", help="kernel log device (default /dev/kmsg)")
    parser.add_argument("--simulate", metavar="SCENARIO.yaml", help="run on a simulated node (no GPU needed)")
    parser.add_argument("--log-level", choices=configuration.LOG_LEVELS, help="default info")
    parser.add_argument(
        "--node-name",
        metavar="NAME",
        help="this node's name in probe groups (default: $NODE_NAME, else the short hostname)",
    )
    _attribution(parser)


def _attribution(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pod-resources-socket",
        metavar="PATH",
        help="the kubelet's pod-resources socket (default /var/lib/kubelet/pod-resources/kubelet.sock)",
    )
    parser.add_argument(
        "--job-mapping-dir",
        metavar="DIR",
        help="job-mapping files in dcgm-exporter's format, as deploy/slurm's Prolog writes them "
        "(default /run/clusterhealth/jobs)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clusterhealth",
        description="Health agent for GPU training clusters: exports NVML and RDMA state to Prometheus.",
    )
    parser.add_argument("--version", action="version", version=f"clusterhealth {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    agent = sub.add_parser("agent", help="run the daemon: serve /metrics and /healthz")
    _common(agent)
    agent.add_argument("--listen", metavar="HOST:PORT", help=f"default :{configuration.DEFAULT_PORT}")
    agent.add_argument(
        "--web-config-file",
        metavar="FILE",
        help="TLS and basic auth (Prometheus exporter-toolkit format); re-read on SIGHUP",
    )
    agent.add_argument("--print-config", action="store_true", help="print the effective config and exit")

    scrape = sub.add_parser("scrape", help="collect once, print the exposition, exit 0")
    _common(scrape)

    check = sub.add_parser(
        "check", help="run every audit and health check once; exit 0 OK 1 WARNING 2 CRITICAL 3 UNKNOWN"
    )
    _common(check)
    check.add_argument("--json", dest="output", action="store_const", const="json", help="print JSON")
    check.add_argument(
        "--format",
        dest="output",
        choices=("table", "json", "line"),
        help="table (default), json, or one line led by the node's verdict (state and action)",
    )
    check.add_argument(
        "--exit-codes",
        choices=("nagios", "npd"),
        default="nagios",
        help="nagios: 0 OK 1 WARNING 2 CRITICAL 3 UNKNOWN; npd: 0 OK/WARNING 1 CRITICAL 2 UNKNOWN",
    )
    check.add_argument("--only", metavar="REGEX", help="only the checks whose name matches, e.g. 'gpu_.*'")
    check.add_argument("--all", action="store_true", help="list passing checks too")

    probe = sub.add_parser("probe", help="fabric probes: run one now, or parse a saved output")
    probe_sub = probe.add_subparsers(dest="probe_command", required=True, metavar="ACTION")
    probe_run = probe_sub.add_parser("run", help="run a configured probe now and print its result")
    _common(probe_run)
    probe_run.add_argument("name", metavar="NAME", help="the probe's name in the config file")
    probe_run.add_argument("--json", action="store_true", help="print JSON")
    parse = probe_sub.add_parser(
        "parse",
        help="parse a saved probe output and print it as JSON",
        description="Prints the parsed output as JSON on stdout and a one-line verdict on stderr. "
        "Rates in the JSON are in base units where the key says so (*_bytes_per_second) and in GB/s "
        "(10^9 bytes a second, as nccl-tests prints them) in the *_gbps fields. Exit codes, as "
        "`probe run`: 0 ok, 1 degraded (below --degraded-fraction of --expect, or NCCL fell back to "
        "sockets or shared memory where --has-rdma or --has-nvlink says the node had better), 2 "
        "failed, incomplete or wrong results.",
    )
    parse.add_argument("--kind", required=True, choices=probe_parsers.KINDS)
    parse.add_argument("file", metavar="FILE", help="the saved output ('-' for standard input)")
    parse.add_argument(
        "--expect",
        metavar="RATE",
        help="the bandwidth the run should reach, as in a probe's `expect` (e.g. '400 Gb/s', '480 GB/s')",
    )
    parse.add_argument(
        "--degraded-fraction",
        type=float,
        default=0.8,
        metavar="F",
        help="below this fraction of --expect the run is degraded (default 0.8, as probing's)",
    )
    parse.add_argument(
        "--has-rdma",
        action="store_true",
        help="the node that printed the output has RDMA devices: an NCCL run over sockets (NET/Socket) "
        "is a fallback, degraded (`probe run` reads this from sysfs)",
    )
    parse.add_argument(
        "--has-nvlink",
        action="store_true",
        help="the node's GPUs have NVLink up: an NCCL run through shared memory (SHM) is a fallback, "
        "degraded (`probe run` reads this from NVML)",
    )

    fleet_cli.add_commands(sub)

    demo = sub.add_parser("demo", help="run the agent on a simulated faulty 8-GPU node")
    demo.add_argument("--listen", metavar="HOST:PORT", default=f"127.0.0.1:{configuration.DEFAULT_PORT}")
    demo.add_argument("--scenario", metavar="NAME|FILE", default="h100-faulty", help="default h100-faulty")
    demo.add_argument("--interval", type=float, default=5.0, metavar="SECONDS", help="GPU sampling interval")
    demo.add_argument(
        "--duration", type=float, metavar="SECONDS", help="stop after this long (default: Ctrl-C)"
    )
    return parser


def load_config(args: argparse.Namespace) -> tuple[configuration.Config, dict[str, Any]]:
    overrides = {
        key: getattr(args, flag) for flag, key in OVERRIDES.items() if getattr(args, flag, None) is not None
    }
    return configuration.load(args.config, overrides), overrides


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logsetup.setup(getattr(args, "log_level", None) or "info")
    try:
        if args.command == "agent":
            return _agent(args)
        if args.command == "scrape":
            return _scrape(args)
        if args.command == "check":
            return _check(args)
        if args.command == "probe" and args.probe_command == "run":
            return _probe_run(args)
        if args.command == "probe" and args.probe_command == "parse":
            return _probe_parse(args)
        if args.command in fleet_cli.COMMANDS:
            return fleet_cli.run(args)
        if args.command == "demo":
            from clusterhealth.agent.demo import run_demo

            return run_demo(args.scenario, args.listen, args.interval, args.duration)
    except _config_errors() as err:
        print(f"clusterhealth: configuration error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def _config_errors() -> tuple[type[Exception], ...]:
    """A bad config file, and a bad scenario file once --simulate or `demo` has loaded the
    simulator: it is imported by nothing else, so its error is not looked for before."""
    scenario = sys.modules.get("clusterhealth.exporters.sim.scenario")
    return (configuration.ConfigError,) + ((scenario.ScenarioError,) if scenario is not None else ())


def _agent(args: argparse.Namespace) -> int:
    from clusterhealth.agent.daemon import Agent, limit_malloc_arenas, raise_open_file_limit

    config, overrides = load_config(args)
    if args.print_config:
        sys.stdout.write(configuration.dump(config))
        return 0
    logsetup.set_level(config.log_level)
    raise_open_file_limit()
    limit_malloc_arenas()  # before the agent starts its threads
    try:
        agent = Agent(args.config, overrides, config)
    except OSError as err:
        print(f"clusterhealth: cannot listen on {config.listen}: {err.strerror}", file=sys.stderr)
        return 1
    return agent.run()


def _check(args: argparse.Namespace) -> int:
    from clusterhealth.agent.check import main_check

    if args.only is not None:
        problem = check_pattern(args.only)
        if problem:
            print(f"clusterhealth: --only: expected {problem}", file=sys.stderr)
            return EXIT_CONFIG
    config, _ = load_config(args)
    logsetup.set_level(config.log_level if args.log_level else "error")
    return main_check(config, args.output or "table", args.exit_codes, args.only, args.all)


# `probe run` exits like `check`: ok 0, degraded 1, failed or timeout 2, skipped 3.
PROBE_EXIT = {"ok": 0, "degraded": 1, "failed": 2, "timeout": 2, "skipped": 3}


def _probe_run(args: argparse.Namespace) -> int:
    from clusterhealth.agent.collectors import collect_once, node_links
    from clusterhealth.checks.probes.collector import ProbeRunner, ProbeService
    from clusterhealth.checks.probes.pipeline import Pipeline

    config, _ = load_config(args)
    logsetup.set_level(config.log_level)
    probe = next((p for p in config.probes if p.name == args.name), None)
    if probe is None and any(g.name == args.name for g in config.pairwise_groups):
        print(
            f"clusterhealth: {args.name} is a pairwise group: its rounds run in the agent, on every "
            "member at once (docs/fabric.md)",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if probe is None:
        known = ", ".join(p.name for p in config.probes) or "none configured"
        print(f"clusterhealth: no probe named {args.name!r} (probes: {known})", file=sys.stderr)
        return EXIT_CONFIG
    # The GPUs read once first: a run's NCCL transport is judged against their NVLink links.
    node, _ = collect_once(config, only=("gpu",))
    try:
        session = node.session if config.collectors.gpu.enabled else None
        # Through the service, so that the result is kept for `scrape` and the agent too.
        pipeline = Pipeline.of(config.probing, session, node_links(config, node))
        runner = ProbeRunner(pipeline, session, configuration.node_name(config))
        runs = ProbeService(config.probing, config.probes, runner).run_probe(probe)
    finally:
        node.close()
    if args.json:
        report = [
            {
                "probe": r.probe,
                "peer": r.peer,
                "command": r.command,
                "duration_seconds": round(r.duration_seconds, 3),
            }
            | r.outcome.to_dict()
            for r in runs
        ]
        print(json.dumps(report, indent=2))
    else:
        for r in runs:
            where = f" to {r.peer}" if r.peer else ""
            print(f"{r.probe}{where}: {r.outcome.result}: {r.outcome.reason} ({r.duration_seconds:.1f}s)")
    return max(PROBE_EXIT[r.outcome.result] for r in runs)


def _probe_parse(args: argparse.Namespace) -> int:
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(errors="replace")
    except OSError as err:
        print(f"clusterhealth: cannot read {args.file}: {err.strerror}", file=sys.stderr)
        return EXIT_CONFIG  # never 1, which says "degraded"
    from clusterhealth.checks.probes.evaluate import evaluate
    from clusterhealth.checks.probes.runner import RunResult
    from clusterhealth.checks.probes.transport import NodeLinks

    expected = None
    if args.expect is not None:
        expected = parse_bandwidth(args.expect)
        if expected is None or expected <= 0:
            problem = f"expected a rate such as '400 Gb/s', got {args.expect!r}"
            print(f"clusterhealth: --expect: {problem}", file=sys.stderr)
            return EXIT_CONFIG
    if not 0 < args.degraded_fraction <= 1:
        print("clusterhealth: --degraded-fraction: expected a number in (0, 1]", file=sys.stderr)
        return EXIT_CONFIG
    result = probe_parsers.parse(args.kind, text)
    print(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    # Judged as `probe run` judges a run that exited 0 with this output.
    run = RunResult((args.kind,), 0, None, False, 0.0, text, "", False, None)
    node = NodeLinks(
        rdma="RDMA devices (--has-rdma)" if args.has_rdma else None,
        nvlink="NVLink up (--has-nvlink)" if args.has_nvlink else None,
    )
    outcome = evaluate(args.kind, run, result, expected, args.degraded_fraction, node)
    print(f"{outcome.result}: {outcome.reason}", file=sys.stderr)
    return PROBE_EXIT[outcome.result]


def _scrape(args: argparse.Namespace) -> int:
    from clusterhealth.agent.daemon import scrape_once

    config, _ = load_config(args)
    logsetup.set_level(config.log_level)
    sys.stdout.buffer.write(scrape_once(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
