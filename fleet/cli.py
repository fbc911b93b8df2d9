"""The fleet-side commands on the `clusterhealth` command line: their options and their dispatch.

agent/cli.py stays the one entry point: it adds these commands to its parser (``add_commands``)
and hands them over (``run``). Each command's module is imported when it runs, so the node's
commands load none of them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from clusterhealth.checks.cost import IMPACT_WORKLOAD, Workload
from clusterhealth.checks.probes.settings import parse_bandwidth

COMMANDS = ("analyze", "lab", "model", "remediate", "report")


def add_commands(sub: Any) -> None:
    """The fleet-side commands, as subparsers of ``sub`` (argparse's subparsers action)."""
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
        help="analyse what can be read on partial data (results that cannot be tied, Prometheus warnings, "
        "a store answering isPartial)",
    )
    _workload_arguments(analyze, IMPACT_WORKLOAD, "the job each suspect is priced for (impact): ")

    report = sub.add_parser(
        "report",
        help="write one self-contained HTML page (or a PNG) of a pairwise group: the pair-bandwidth "
        "matrix, each node round by round, and analyze's verdict",
        description="Reads and judges the group as analyze does. Needs the report extra: "
        "pip install 'clusterhealth[report]'. Exit codes: 0 no suspect, 1 suspects, 2 bad arguments or "
        "the report extra missing, 3 no verdict (nothing is written when there is no data to draw).",
    )
    report.add_argument("--prometheus", required=True, metavar="URL", help="e.g. http://prometheus:9090")
    report.add_argument("--probe", metavar="NAME", help="the pairwise group (default: the only one)")
    report.add_argument(
        "--window", default="6h", metavar="DURATION", help="how far back to look (default 6h)"
    )
    report.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write")
    report.add_argument(
        "--format", choices=("html", "png"), default="html", help="an HTML page (default) or one PNG"
    )
    report.add_argument(
        "--step", metavar="DURATION", help="width of the windows the history is read in (as analyze's)"
    )
    report.add_argument(
        "--allow-partial", action="store_true", help="draw what can be read on partial data (as analyze's)"
    )
    _workload_arguments(report, IMPACT_WORKLOAD, "the job each suspect is priced for (impact): ")

    lab = sub.add_parser(
        "lab",
        help="build N hosts as network namespaces, on one switch or on leaves joined by a spine, running "
        "agents with a pairwise group; degrade a host, a path, a leaf's uplink or a leaf; print analyze's "
        "verdict (root)",
        description="Exit codes: 0 no suspect, 1 suspects, 2 bad arguments or not root, 3 no verdict, "
        "4 the lab could not be built or run, 130 interrupted. Everything it made is removed at the end. "
        "Faults can be combined when they do not overlap.",
    )
    lab.add_argument("--hosts", type=int, required=True, metavar="N", help="hosts h1..hN (2 to 64)")
    lab.add_argument(
        "--leaves",
        type=int,
        default=1,
        metavar="M",
        help="spread the hosts over M leaf switches leaf1..leafM joined by a spine (default 1: one switch)",
    )
    lab.add_argument(
        "--degrade-host", metavar="NAME", help="shape this host's link to --degrade-factor of the rate"
    )
    lab.add_argument(
        "--degrade-path",
        metavar="A-B",
        help="shape the path between two hosts, e.g. h2-h5, or 'first': the first pair to meet (away from "
        "the other faults; inside a leaf when a leaf or an uplink is degraded too)",
    )
    lab.add_argument(
        "--degrade-uplink",
        metavar="LEAF",
        help="shape a leaf's uplink to the spine to --degrade-factor of one host link's rate, e.g. leaf2",
    )
    lab.add_argument(
        "--degrade-leaf",
        metavar="LEAF",
        help="shape every port of a leaf switch to --degrade-factor of the rate, e.g. leaf3",
    )
    lab.add_argument(
        "--degrade-factor",
        type=float,
        default=0.5,
        metavar="R",
        help="what is degraded runs at this share of the rate (default 0.5)",
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
    lab.add_argument(
        "--report",
        metavar="FILE",
        help="where to write the report of the run (clusterhealth report's page; default "
        "lab-PREFIX.html in the current directory; needs the report extra)",
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

    remediate = sub.add_parser(
        "remediate",
        help="act on the nodes' verdicts: drain (Slurm) or cordon (Kubernetes) within a fleet budget, "
        "dry-run unless --act",
        description="Exit codes of --once: 0 nothing to do or done, 1 acted or would act, 2 bad "
        "arguments or configuration, 3 no trusted data (Prometheus or the scheduler could not be read, "
        "or a scheduler command failed or hung). docs/remediation.md.",
    )
    remediate.add_argument("--prometheus", required=True, metavar="URL", help="e.g. http://prometheus:9090")
    remediate.add_argument(
        "--backend", required=True, choices=("slurm", "kubernetes"), help="the scheduler to act on"
    )
    remediate.add_argument(
        "--config", metavar="FILE", help="the remediator's YAML configuration (docs/remediation.md)"
    )
    remediate.add_argument(
        "--act", action="store_true", help="carry the orders out (default: dry-run, which touches nothing)"
    )
    remediate.add_argument("--once", action="store_true", help="reconcile once and exit with its code")
    remediate.add_argument("--listen", metavar="HOST:PORT", help="serve the remediator's /metrics here")
    remediate.add_argument(
        "--fabric",
        metavar="PROBE",
        help="also act on the host suspects analyze names in this pairwise group (fabric.action)",
    )


def run(args: argparse.Namespace) -> int:
    """Runs one of ``COMMANDS`` and returns its exit code."""
    if args.command == "analyze":
        from clusterhealth.fleet.analyze import main as analyze_main

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
    if args.command == "report":
        from clusterhealth.fleet.report.command import main as report_main

        try:
            workload = _workload(args)
        except ValueError as err:
            print(f"clusterhealth report: {err}", file=sys.stderr)
            return 2
        return report_main(
            args.prometheus,
            args.probe,
            args.window,
            args.output,
            args.format,
            step_text=args.step,
            allow_partial=args.allow_partial,
            workload=workload,
        )
    if args.command == "lab":
        return _lab(args)
    if args.command == "remediate":
        from clusterhealth.fleet.remediate.command import main as remediate_main

        return remediate_main(args)
    return _model(args)


def _lab(args: argparse.Namespace) -> int:
    from clusterhealth.fleet import lab

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
        leaves=args.leaves,
        degrade_uplink=args.degrade_uplink,
        degrade_leaf=args.degrade_leaf,
        report=Path(args.report) if args.report else None,
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
    from clusterhealth.fleet.model import parse_count

    return Workload(
        params=parse_count(args.params),
        bytes_per_param=args.bytes_per_param,
        gpus=args.gpus,
        compute_seconds=args.compute_seconds,
        overlap=args.overlap,
        **extra,
    )


def _model(args: argparse.Namespace) -> int:
    from clusterhealth.fleet import model, pairwise
    from clusterhealth.fleet.prometheus import parse_duration, valid_url

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
    if not valid_url(args.prometheus):
        return usage(f"--prometheus: expected http(s)://HOST:PORT, got {args.prometheus!r}")
    path = None
    if args.path is not None:
        ends = [end.strip() for end in args.path.split(",")]
        if len(ends) != 2 or not all(ends) or ends[0] == ends[1]:
            return usage(f"--path: expected two different nodes as A,B, got {args.path!r}")
        path = (min(ends), max(ends))  # as analyze names a path
    if args.probe is not None and not pairwise.valid_probe(args.probe):
        return usage(f"--probe: expected a probe name, got {args.probe!r}")
    try:
        window = parse_duration(args.window)
    except ValueError as err:
        return usage(f"--window: {err}")
    source = model.Source(args.prometheus, args.probe, window, node=args.node, path=path)
    return model.run_measured(request, source, bandwidth, args.json)
