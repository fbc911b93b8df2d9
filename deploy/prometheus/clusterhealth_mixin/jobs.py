"""Job attribution's rules (groups `clusterhealth.jobs.rules` and `clusterhealth.jobs`): GPU
series joined with the job on each GPU (clusterhealth_gpu_job_info), per-job medians, JobStraggler
and JobHitByNodeFault (docs/deploy.md, "Jobs"). Cases: jobs_cases.py; runbooks:
docs/runbooks/<Alert>.md."""

from __future__ import annotations

from dataclasses import dataclass

from .config import Config
from .lib import GPU, Alert, Group, Record, indent, quote, selector
from .recording import CLOCK_SLOWDOWN


@dataclass(frozen=True)
class JobSignal:
    """A GPU series JobStraggler compares with the median of the GPU's job: the `signal` label of
    its alerts, the metric its records are named after, how far below the median counts (a Config
    field's value), and the series joined when it is not the metric itself (a recording rule; then
    `operation` tells its records apart)."""

    name: str
    metric: str
    margin: float
    series: str = ""
    operation: str = ""

    @property
    def joined(self) -> str:
        return f"instance_gpu_workload:{self.metric}:{self.operation}join"

    @property
    def median(self) -> str:
        return f"workload:{self.metric}:{self.operation}median"


# The job a series is about (its Prometheus job, and the workload labels of clusterhealth_gpu_job_info
# without `container` and `source`): a Slurm job, or a pod. `job` in the agent's exposition reaches
# Prometheus as `exported_job`, its own `job` label being the scrape job's.
WORKLOAD = "job, scheduler, exported_job, namespace, pod"
JOB_OF = (
    "{{ if $labels.pod }}pod {{ $labels.namespace }}/{{ $labels.pod }}{{ else }}{{ $labels.scheduler }} "
    "job {{ $labels.exported_job }}{{ end }}"
)


def job_signals(c: Config) -> list[JobSignal]:
    """What JobStraggler looks at: one entry per signal (more, such as throttle time, are one
    entry each)."""
    return [
        JobSignal("sm_clock", "clusterhealth_gpu_sm_clock_hertz", c.job_straggler_clock_margin),
        JobSignal("sm_active", "clusterhealth_gpu_sm_active_ratio", c.job_straggler_activity_margin),
        # The share of slowdown_window free of fault throttling (NVML's time counters): a GPU held
        # down for seconds every minute, which a sampled clock mostly misses.
        JobSignal(
            "unthrottled_time",
            "clusterhealth_gpu_clocks_event_seconds_total",
            c.job_straggler_throttle_margin,
            series="instance_gpu:clusterhealth_gpu_clocks_event_seconds_total:unthrottled_rate",
            operation="unthrottled_rate_",
        ),
    ]


UTILIZATION = JobSignal("utilization", "clusterhealth_gpu_utilization_ratio", 0.0)


def groups(c: Config) -> list[Group]:
    return [
        Group("clusterhealth.jobs.rules", records(c)),
        Group("clusterhealth.jobs", [job_straggler(c), job_hit_by_node_fault(c)]),
    ]


def records(c: Config) -> list[Alert | Record]:
    """Each signal's series (and utilization) joined with the workload on its GPU, one result per
    GPU and workload on it (a shared GPU has several), with the workload's labels; each
    workload's median of it; and each workload's GPU count."""
    m = selector(c)
    out: list[Alert | Record] = []
    for signal in [*job_signals(c), UTILIZATION]:
        out.append(
            Record(
                signal.joined,
                f"""{signal.series or signal.metric}{m()}
* on (instance, job, gpu, uuid) group_right ()
clusterhealth_gpu_job_info{m()}""",
            )
        )
        out.append(Record(signal.median, f"quantile by ({WORKLOAD}) (0.5, {signal.joined})"))
    out.append(
        Record(
            "workload:clusterhealth_gpu_job_info:gpus",
            f"count by ({WORKLOAD}) (clusterhealth_gpu_job_info{m()})",
        )
    )
    return out


def job_straggler(c: Config) -> Alert:
    below = "\nor\n".join(
        f"""label_replace(
  {s.joined}
  / on ({WORKLOAD}) group_left ()
  {s.median}
  < {round(1 - s.margin, 6)},
  "signal", "{s.name}", "", ""
)"""
        for s in job_signals(c)
    )
    busy_jobs = f"""{UTILIZATION.median} > {c.busy_utilization}
and
workload:clusterhealth_gpu_job_info:gpus >= {c.job_straggler_min_gpus}"""
    return Alert(
        "JobStraggler",
        "warning",
        f"""(
{indent(below)}
)
and on ({WORKLOAD})
(
{indent(busy_jobs)}
)""",
        f"{GPU} holds back {JOB_OF}: its {{{{ $labels.signal }}}} is far below the job's median.",
        "Its {{ $labels.signal }} is at {{ $value | humanizePercentage }} of the median of the "
        "job's GPUs (an alert below "
        + ", ".join(f"{1 - s.margin:.0%} for {s.name}" for s in job_signals(c))
        + ") while the job is busy (its GPUs' median utilization above "
        + f"{c.busy_utilization:g}). A synchronous job runs at the pace of its slowest rank: a low clock "
        "is heat, power or a clock setting on this GPU; low SM activity is a rank starved of "
        "input or stalled."
        + quote(
            CLOCK_SLOWDOWN,
            ("job", "instance", "gpu"),
            " Its maximum SM clock is {} times its clock now (f_max/f_eff): its share of every step "
            "computes about that much slower, and the job waits for it.",
        )
        + " Look for GPUThermalOrPowerSlowdown on the GPU, then drain it or tell the job's owner.",
        c.for_sustained,
        about="gpu",
    )


def job_hit_by_node_fault(c: Config) -> Alert:
    """A GPU's critical alert hurts the jobs on that GPU, and carries its `gpu` so that
    Alertmanager's grouping by (instance, gpu) puts it in the GPU's own page; any other critical
    alert of a node hurts every job on the node."""
    m = selector(c)
    return Alert(
        "JobHitByNodeFault",
        "critical",
        f"""group by ({WORKLOAD}, instance, gpu) (clusterhealth_gpu_job_info{m()})
* on (job, instance, gpu) group_left ()
count by (job, instance, gpu) (
  ALERTS{m('alertstate="firing"', 'severity="critical"', 'gpu!=""', 'alertname!="JobHitByNodeFault"')}
)
or
group by ({WORKLOAD}, instance) (clusterhealth_gpu_job_info{m()})
* on (job, instance) group_left ()
count by (job, instance) (
  ALERTS{m('alertstate="firing"', 'severity="critical"', 'gpu=""', 'alertname!="JobHitByNodeFault"')}
)""",
        f"{JOB_OF} runs on {{{{ $labels.instance }}}}"
        "{{ if $labels.gpu }} GPU {{ $labels.gpu }}{{ end }}, which has a critical alert.",
        "{{ $value }} critical alert(s) fire on the GPU or node this job runs on: the job has likely "
        "failed or hangs (a collective waits for the rank on that node). The node's own alerts say "
        "what broke; drain the node and requeue or restart the job.",
        about="job",
    )
