"""The `clusterhealth` command line."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clusterhealth.agent import __version__
from clusterhealth.agent import config as configuration
from clusterhealth.agent import log as logsetup
from clusterhealth.checks import probe_parsers
from clusterhealth.checks.cost import IMPACT_WORKLOAD, Workload
from clusterhealth.checks.probes.settings import parse_bandwidth
from clusterhealth.checks.schema import check_pattern

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

    analyze = sub.add_parser(
        "analyze",
        help="read pairwise probe results from Prometheus and name suspect hosts and paths",
        description="Exit codes: 0 no suspect, 1 suspects, 2 bad arguments, 3 no verdict (Prometheus "
        "unreachable, no data, partial data, not enough evidence).",
    )
    analyze.add_argument("--prometheus", required=True, metavar="URL", help="e.g. http://prometheus:9090")
    analyze.add_argument("--probe", metavar="NAME", help="the pairwise group (default: the only one)")
    analyze.add_argument(
        "--window", default="6h", metavar="DURATION", help="how far back to look (default 6h)"
    )
    analyze.add_argument("--json", action="store_true", help="print JSON")
    analyze.add_argument(
        "--step", metavar="DURATION", help="width of the windows the history is read in (default: 1/8 round)"
    )
    analyze.add_argument(
        "--allow-partial",
        action="store_true",
        help="analyse what can be read on partial data (results that cannot be tied, Prometheus warnings)",
    )
    _workload_arguments(analyze, IMPACT_WORKLOAD, "the job each suspect is priced for (impact): ")

    lab = sub.add_parser(
        "lab",
        help="build N hosts as network namespaces running agents with a pairwise group, degrade a host "
        "or a path, print analyze's verdict (root)",
        description="Exit codes: 0 no suspect, 1 suspects, 2 bad arguments or not root, 3 no verdict, "
        "4 the lab could not be built or run, 130 interrupted. Everything it made is removed at the end.",
    )
    lab.add_argument("--hosts", type=int, required=True, metavar="N", help="hosts h1..hN (2 to 64)")
    degrade = lab.add_mutually_exclusive_group()
    degrade.add_argument(
        "--degrade-host", metavar="NAME", help="shape this host's link to --degrade-factor of the rate"
    )
    degrade.add_argument(
        "--degrade-path",
        metavar="A-B",
        help="shape the path between two hosts, e.g. h2-h5, or 'first': the pair that meets first",
    )
    lab.add_argument(
        "--degrade-factor",
        type=float,
        default=0.5,
        metavar="R",
        help="the degraded host's or path's share of the rate (default 0.5)",
    )
    lab.add_argument("--rounds", type=int, default=5, metavar="K", help="rounds to wait (default 5)")
    lab.add_argument(
        "--period", type=float, default=20.0, metavar="SECONDS", help="round period (default 20, the least)"
    )
    lab.add_argument(
        "--rate",
        type=float,
        default=100.0,
        metavar="MBIT",
        help="every host link's rate (default 100 Mbit/s)",
    )
    lab.add_argument(
        "--restart-prometheus",
        type=int,
        metavar="K",
        help="stop the lab's Prometheus three quarters into round K and start it again a quarter into "
        "round K+1 (the series that ended meanwhile carry no staleness marker)",
    )
    lab.add_argument("--json", action="store_true", help="print analyze's JSON with a lab object")

    model = sub.add_parser(
        "model",
        help="what gradient synchronisation costs a data-parallel job at a given bandwidth",
        description="The ring all-reduce and overlap step models (docs/cost.md). Sizes take K, M, B, T "
        "suffixes (7B); RATE is a bandwidth such as 400Gbit/s, 400 Gb/s or 50GB/s.",
    )
    _workload_arguments(model, None, "")
    model.add_argument(
        "--bandwidth",
        metavar="RATE",
        help="the slowest link's bandwidth; with --prometheus, the nominal one to compare with "
        "(default: the group's reference)",
    )
    model.add_argument(
        "--prometheus",
        metavar="URL",
        help="take the bandwidth from a node's or a path's measured probe bandwidth in this Prometheus",
    )
    measured = model.add_mutually_exclusive_group()
    measured.add_argument("--node", metavar="NAME", help="with --prometheus: this node's latest meetings")
    measured.add_argument("--path", metavar="A,B", help="with --prometheus: the latest meetings of A and B")
    model.add_argument(
        "--probe", metavar="NAME", help="with --prometheus: the pairwise group (default: the only one)"
    )
    model.add_argument(
        "--window",
        default="6h",
        metavar="DURATION",
        help="with --prometheus: how far back to look (default 6h)",
    )
    model.add_argument(
        "--accumulation", type=int, default=1, metavar="K", help="micro-batches per all-reduce (default 1)"
    )
    model.add_argument(
        "--latency", type=float, default=0.0, metavar="SECONDS", help="per-message latency α (default 0)"
    )
    model.add_argument(
        "--target-efficiency",
        type=float,
        default=0.9,
        metavar="E",
        help="say the bandwidth that keeps this scaling efficiency (default 0.9)",
    )
    model.add_argument("--json", action="store_true", help="print JSON")

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
        if args.command == "analyze":
            from clusterhealth.agent.analyze import main as analyze_main

            try:
                workload = _workload(args)
            except ValueError as err:
                print(f"clusterhealth analyze: {err}", file=sys.stderr)
                return 2
            return analyze_main(
                args.prometheus,
                args.probe,
                args.window,
                args.json,
                step_text=args.step,
                allow_partial=args.allow_partial,
                workload=workload,
            )
        if args.command == "lab":
            return _lab(args)
        if args.command == "model":
            return _model(args)
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
    from clusterhealth.agent.daemon import Agent, raise_open_file_limit

    config, overrides = load_config(args)
    if args.print_config:
        sys.stdout.write(configuration.dump(config))
        return 0
    logsetup.set_level(config.log_level)
    raise_open_file_limit()
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


def _lab(args: argparse.Namespace) -> int:
    from clusterhealth.agent import lab

    try:
        path = lab.parse_path(args.degrade_path) if args.degrade_path else None
    except ValueError as err:
        print(f"clusterhealth lab: {err}", file=sys.stderr)
        return lab.EXIT_USAGE
    spec = lab.LabSpec(
        hosts=args.hosts,
        rounds=args.rounds,
        period=args.period,
        rate_mbit=args.rate,
        degrade_host=args.degrade_host,
        degrade_path=path,
        factor=args.degrade_factor,
        restart_prometheus=args.restart_prometheus,
    )
    return lab.main(spec, args.json)


def _workload_arguments(parser: argparse.ArgumentParser, defaults: Workload | None, what: str) -> None:
    """--params, --bytes-per-param, --gpus, --compute-seconds and --overlap; all but --overlap
    required without ``defaults``."""

    def option(name: str, value: Any, text: str, **kw: Any) -> None:
        if defaults is None and name != "--overlap":
            parser.add_argument(name, required=True, **kw)
        else:
            kw["help"] = f"{what}{kw['help']} (default {text})"
            parser.add_argument(name, default=value, **kw)

    w = defaults or Workload(params=1, bytes_per_param=1, gpus=1, compute_seconds=1)
    option(
        "--params",
        f"{w.params:.0f}",
        "7B" if w.params == 7e9 else f"{w.params:g}",
        metavar="N",
        help="parameters, e.g. 7B or 7e9",
    )
    option(
        "--bytes-per-param",
        w.bytes_per_param,
        f"{w.bytes_per_param:g}",
        type=float,
        metavar="B",
        help="gradient bytes per parameter (2 for BF16)",
    )
    option("--gpus", w.gpus, f"{w.gpus}", type=int, metavar="N", help="data-parallel ranks")
    option(
        "--compute-seconds",
        w.compute_seconds,
        f"{w.compute_seconds:g}",
        type=float,
        metavar="T",
        help="compute time of one micro-batch",
    )
    option(
        "--overlap",
        w.overlap,
        f"{w.overlap:g}",
        type=float,
        metavar="E",
        help="share of the shorter of compute and communication hidden under the other, 0 to 1",
    )


def _workload(args: argparse.Namespace, **extra: Any) -> Workload:
    """The workload of --params and its friends; ValueError naming what is wrong."""
    from clusterhealth.agent.model import parse_count

    return Workload(
        params=parse_count(args.params),
        bytes_per_param=args.bytes_per_param,
        gpus=args.gpus,
        compute_seconds=args.compute_seconds,
        overlap=args.overlap,
        **extra,
    )


def _model(args: argparse.Namespace) -> int:
    from clusterhealth.agent import analyze as analyzing
    from clusterhealth.agent import model

    def usage(problem: str) -> int:
        print(f"clusterhealth model: {problem}", file=sys.stderr)
        return model.EXIT_USAGE

    bandwidth = None
    if args.bandwidth is not None:
        bandwidth = parse_bandwidth(args.bandwidth)
        if not bandwidth:
            return usage(f"--bandwidth: expected a rate such as 400Gbit/s or 50GB/s, got {args.bandwidth!r}")
    elif args.prometheus is None:
        return usage(
            "--bandwidth is required (or --prometheus with --node or --path to take it from the probes)"
        )
    if args.prometheus is None and (args.node or args.path or args.probe):
        return usage("--node, --path and --probe read from Prometheus: give --prometheus URL")
    if args.prometheus is not None and not (args.node or args.path):
        return usage("--prometheus: name the --node NAME or the --path A,B whose bandwidth to take")
    try:
        workload = _workload(args, accumulation=args.accumulation, latency_seconds=args.latency)
        if not 0 < args.target_efficiency <= 1:
            raise ValueError(f"target efficiency must be in (0, 1], not {args.target_efficiency}")
    except ValueError as err:
        return usage(str(err))
    request = model.Request(workload, bandwidth or 0.0, args.target_efficiency)
    if args.prometheus is None:
        return model.run(request, args.json)
    if not urllib.parse.urlsplit(args.prometheus).scheme.startswith("http"):
        return usage(f"--prometheus: expected http(s)://HOST:PORT, got {args.prometheus!r}")
    path = None
    if args.path is not None:
        ends = [end.strip() for end in args.path.split(",")]
        if len(ends) != 2 or not all(ends) or ends[0] == ends[1]:
            return usage(f"--path: expected two different nodes as A,B, got {args.path!r}")
        path = (min(ends), max(ends))  # as analyze names a path
    if args.probe is not None and not analyzing.valid_probe(args.probe):
        return usage(f"--probe: expected a probe name, got {args.probe!r}")
    try:
        window = analyzing.parse_duration(args.window)
    except ValueError as err:
        return usage(f"--window: {err}")
    source = model.Source(args.prometheus, args.probe, window, node=args.node, path=path)
    return model.run_measured(request, source, bandwidth, args.json)


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
