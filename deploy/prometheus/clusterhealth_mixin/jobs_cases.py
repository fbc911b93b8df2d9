"""promtool cases of the job rules (jobs.py): JobStraggler fires for a slow GPU of a busy
multi-GPU job and stays quiet for a healthy job, a GPU just inside the margin, a single-GPU job and
a job whose GPUs all idle; JobHitByNodeFault names the job on a node with a critical alert, not a
warning, nor a node without a job."""

from __future__ import annotations

from .cases import Case, F, Firing, S, gpu
from .recording import CLOCK_SLOWDOWN


def job_gpu(instance: str, n: str, job: str, **extra: str) -> dict[str, str]:
    return gpu(n, instance, scheduler="slurm", exported_job=job, **extra)


def job(
    name: str,
    gpus: list[tuple[str, str]],
    *,
    clock: dict[int, str] | None = None,
    active: dict[int, str] | None = None,
    utilization: str = "1x20",
    throttled: dict[int, str] | None = None,
    samples: int = 20,
    clock_max: bool = False,
) -> dict[str, str]:
    """A Slurm job's join series on `gpus` ((instance, gpu) pairs) and their GPUs' series: the SM
    clock at 1.98 GHz and SM activity at 0.78 unless `clock` or `active` says otherwise (by position).
    With `throttled`, each GPU's hw_thermal_slowdown time counter too (seconds held; idle unless
    `throttled` says otherwise), over `samples` minutes. With `clock_max`, each GPU's maximum SM
    clock (1.98 GHz) and model, from which f_max/f_eff is recorded."""
    series = {}
    x = f"x{samples}"
    for k, (instance, n) in enumerate(gpus):
        series[S("clusterhealth_gpu_job_info", job_gpu(instance, n, name, source="mapping_dir"))] = "1" + x
        where = gpu(n, instance)
        series[S("clusterhealth_gpu_sm_clock_hertz", where)] = (clock or {}).get(k, "1.98e9" + x)
        series[S("clusterhealth_gpu_sm_active_ratio", where)] = (active or {}).get(k, "0.78" + x)
        series[S("clusterhealth_gpu_utilization_ratio", where)] = utilization.replace("x20", x)
        if clock_max:
            series[S("clusterhealth_gpu_sm_clock_max_hertz", where)] = "1.98e9" + x
            series[S("clusterhealth_gpu_info", gpu(n, instance, name="H100"))] = "1" + x
        if throttled is not None:
            counter = gpu(n, instance, reason="hw_thermal_slowdown")
            series[S("clusterhealth_gpu_clocks_event_seconds_total", counter)] = throttled.get(k, "0" + x)
    return series


def straggler(
    instance: str, n: str, job_id: str, signal: str, value: float, quoted: dict[str, float] | None = None
) -> Firing:
    return F(job_gpu(instance, n, job_id, source="mapping_dir", signal=signal), "warning", value, quoted)


EIGHT = [(i, str(g)) for i in ("n1", "n2") for g in range(4)]
FOUR_N1 = [("n1", str(g)) for g in range(4)]
FOUR_N2 = [("n2", str(g)) for g in range(4)]
CASES = [
    Case(
        "JobStraggler",
        "job 4242 on two nodes: GPU 1 of n2 clocked at 1155 MHz for 10m; job 4243: GPU 2 of n3 barely active",
        {
            **job("4242", EIGHT, clock={5: "1.98e9x2 1.155e9x18"}, clock_max=True),
            **job("4243", [("n3", str(g)) for g in range(4)], active={2: "0.04x20"}),
        },
        [
            ("5m", []),  # pending: 10 minutes are asked for
            (
                "15m",
                [
                    # f_max / f_eff = 1980 / 1155 = 1.71, quoted; job 4243's GPUs have no maximum
                    # clock exported, so its alert says nothing of it.
                    straggler("n2", "1", "4242", "sm_clock", 1.155 / 1.98, {CLOCK_SLOWDOWN: 1.98 / 1.155}),
                    straggler("n3", "2", "4243", "sm_active", 0.04 / 0.78),
                ],
            ),
        ],
    ),
    Case(
        "JobStraggler",
        "a healthy job: one GPU 9% below the median clock, another at 60% of the median SM activity",
        job("4244", EIGHT, clock={3: "1.80e9x20"}, active={6: "0.47x20"}),
        [("15m", [])],
    ),
    Case(
        "JobStraggler",
        "a single-GPU job has no median to fall below, however slow it is",
        job("4245", [("n1", "0")], clock={0: "1.1e9x20"}, active={0: "0.01x20"}),
        [("15m", [])],
    ),
    Case(
        "JobStraggler",
        "a job whose GPUs all idle (utilization 0): one idles at a lower clock, which is no straggler",
        job(
            "4246",
            EIGHT,
            clock={k: "345e6x20" for k in range(8)} | {2: "210e6x20"},
            active={k: "0x20" for k in range(8)},
            utilization="0x20",
        ),
        [("15m", [])],
    ),
    Case(
        "JobStraggler",
        "job 4248: GPU 2 of n1 held down by HW thermal slowdown 18 s a minute (free 70% of the time, "
        "74% of its job's median) holds it back; GPU 3, 6 s a minute (free 90%, 95% of the median), "
        "does not; job 4249's GPUs are all held down alike, none holds the others back",
        {
            **job("4248", FOUR_N1, throttled={2: "0+18x30", 3: "0+6x30"}, samples=30),
            **job("4249", FOUR_N2, throttled={k: "0+18x30" for k in range(4)}, samples=30),
        },
        # Once rate()'s 10-minute window is full, GPU 2 is free 1 - 18/60 = 0.7 of the time; the
        # job's median of (1, 1, 0.7, 0.9) is 0.95: 0.7 / 0.95 = 0.737, under 0.8 from about 9m.
        [("5m", []), ("25m", [straggler("n1", "2", "4248", "unthrottled_time", 0.7 / 0.95)])],
    ),
    Case(
        "JobHitByNodeFault",
        "GPU 0 of n1, where job 4242 runs, falls off the bus (job 4245 on GPU 2 of n1 is not hurt); "
        "n2 (the job's other node) has a warning only; n3 has a critical alert and runs no job; n4's "
        "GPU count check fails, which hurts every job on n4 (4246 on GPUs 0 and 1)",
        {
            S("clusterhealth_gpu_job_info", job_gpu("n1", "0", "4242", source="cgroup")): "1x20",
            S("clusterhealth_gpu_job_info", job_gpu("n1", "1", "4242", source="cgroup")): "1x20",
            S("clusterhealth_gpu_job_info", job_gpu("n1", "2", "4245", source="cgroup")): "1x20",
            S("clusterhealth_gpu_job_info", job_gpu("n2", "0", "4242", source="cgroup")): "1x20",
            S("clusterhealth_gpu_job_info", job_gpu("n4", "0", "4246", source="cgroup")): "1x20",
            S("clusterhealth_gpu_job_info", job_gpu("n4", "1", "4246", source="cgroup")): "1x20",
            S("clusterhealth_gpu_up", gpu("0", "n1")): "1x5 0x15",
            S("clusterhealth_gpu_row_remap_pending", gpu("0", "n2")): "1x20",
            S("clusterhealth_gpu_up", gpu("0", "n3")): "0x20",
            S(
                "clusterhealth_check_status",
                {"instance": "n4", "check": "gpu_count", "subject": "node"},
            ): "0x5 2x15",
        },
        [
            ("4m", []),
            (
                "10m",
                [
                    F(
                        {"instance": "n1", "scheduler": "slurm", "exported_job": "4242", "gpu": "0"},
                        "critical",
                        1,
                    ),
                    F({"instance": "n4", "scheduler": "slurm", "exported_job": "4246"}, "critical", 1),
                ],
            ),
        ],
    ),
]
