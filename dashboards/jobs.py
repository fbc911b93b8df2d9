"""The jobs view: which jobs run on the nodes, their GPUs' health, each GPU against its job's
median, stragglers and the faults that hit a job.

A job is a workload of `clusterhealth_gpu_job_info`: a Slurm job (`exported_job`, its id; the
exposition's `job` label, renamed by Prometheus) or a Kubernetes pod (`namespace`, `pod`).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import dashboard as dm

from clusterhealth.dashboards.panels import (
    HIDE_META,
    SEL,
    STATUS_MAPPINGS,
    Query,
    base,
    graph,
    grid,
    number,
    organize,
    with_rows,
)

WORKLOAD = "scheduler, exported_job, namespace, pod"
# A legend that names a Slurm job by its id and a pod by its namespace and name.
JOB_LEGEND = "{{scheduler}} {{exported_job}}{{namespace}}/{{pod}}"
ALERT_COLUMNS = ["Time", "__name__", "Value", "alertstate", "job", "source", "container"]


def dashboard() -> gd.Dashboard:
    return with_rows(
        base(
            "clusterhealth-jobs",
            "clusterhealth / Jobs",
            "Which job each GPU runs (clusterhealth_gpu_job_info): the jobs, their nodes and GPUs with "
            "their health, each GPU's SM clock and activity against its job's median, stragglers and "
            "the node faults that hit a job.",
            node_multi=True,
        ),
        [
            ("Jobs", jobs_row()),
            ("Their nodes and GPUs", gpus_row()),
            ("Against the job's median", median_row()),
            ("Stragglers and faults", alerts_row()),
        ],
    )


def jobs_row() -> list[Builder[dm.Panel]]:
    return [
        grid(
            "Jobs and their GPUs",
            "Each job on the selected nodes and how many GPUs it holds there.",
            [Query(f"count by ({WORKLOAD}) (clusterhealth_gpu_job_info{{{SEL}}})", instant=True)],
            w=12,
            transformations=[organize(["Time"])],
        ),
        number(
            "Busy GPUs without a job",
            "GPUs with compute processes that no source attributes (a job outside the scheduler, or a "
            "source that is not set up).",
            Query(f"sum(clusterhealth_gpu_job_unattributed_busy_gpus{{{SEL}}}) or vector(0)"),
        ),
        number(
            "GPUs the sources disagree about",
            "GPUs about which two attribution sources name different jobs (the agent's log names both).",
            Query(f"sum(clusterhealth_gpu_job_conflicting_gpus{{{SEL}}}) or vector(0)"),
        ),
        number(
            "Attribution sources failing",
            "Sources (pod_resources, mapping_dir, cgroup) that could not be read; /healthz says why.",
            Query(f"count(clusterhealth_gpu_job_source_success{{{SEL}}} == 0) or vector(0)"),
        ),
    ]


def gpus_row() -> list[Builder[dm.Panel]]:
    return [
        grid(
            "GPUs of each job",
            "Every GPU and the job on it, with the source that named it.",
            [Query(f"clusterhealth_gpu_job_info{{{SEL}}}", instant=True)],
            w=12,
            transformations=[organize(["Time", "__name__", "Value", "job"])],
        ),
        grid(
            "Health of the jobs' GPUs",
            "The worst check status of each GPU that runs a job (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN).",
            [
                # A GPU check's subject is the GPU's index (the node-wide ones join nothing).
                Query(
                    "label_replace(max by (instance, job, subject) (clusterhealth_check_status{"
                    + SEL
                    + ',check=~"gpu_.*"}), "gpu", "$1", "subject", "(.*)")'
                    f" * on (instance, job, gpu) group_right () group by (instance, job, gpu, {WORKLOAD}) "
                    f"(clusterhealth_gpu_job_info{{{SEL}}})",
                    instant=True,
                )
            ],
            w=12,
            mappings=STATUS_MAPPINGS,
            transformations=[HIDE_META],
        ),
    ]


def _against_median(metric: str) -> Query:
    return Query(
        f"instance_gpu_workload:{metric}:join{{{SEL}}} / on (job, {WORKLOAD}) group_left () "
        f'workload:{metric}:median{{job="$job"}}',
        JOB_LEGEND + " {{instance}} GPU {{gpu}}",
    )


def median_row() -> list[Builder[dm.Panel]]:
    return [
        graph(
            "SM clock against the job's median",
            "Each GPU's SM clock divided by the median of its job's GPUs; JobStraggler fires below 0.9 "
            "for 10 minutes while the job is busy.",
            [_against_median("clusterhealth_gpu_sm_clock_hertz")],
            unit="percentunit",
        ),
        graph(
            "SM activity against the job's median",
            "Each GPU's SM activity divided by the median of its job's GPUs; JobStraggler fires below "
            "0.5 for 10 minutes while the job is busy.",
            [_against_median("clusterhealth_gpu_sm_active_ratio")],
            unit="percentunit",
        ),
        graph(
            "Jobs' median utilization",
            "The median utilization of each job's GPUs: a job above 0.5 is busy, and only a busy job's "
            "stragglers alert.",
            [Query('workload:clusterhealth_gpu_utilization_ratio:median{job="$job"}', JOB_LEGEND)],
            unit="percentunit",
        ),
    ]


def alerts_row() -> list[Builder[dm.Panel]]:
    return [
        grid(
            "Stragglers",
            "GPUs that hold back their job (JobStraggler): the job, the GPU and the signal.",
            [Query('ALERTS{alertname="JobStraggler",alertstate="firing",job="$job"}', instant=True)],
            w=12,
            transformations=[organize(ALERT_COLUMNS)],
        ),
        grid(
            "Jobs hit by a node fault",
            "Jobs on a node with a critical alert (JobHitByNodeFault); the value is the number of such "
            "alerts.",
            [Query('ALERTS{alertname="JobHitByNodeFault",alertstate="firing",job="$job"}', instant=True)],
            w=12,
            transformations=[organize(["Time", "__name__", "alertstate", "job"])],
        ),
        grid(
            "Critical alerts on the jobs' nodes",
            "The critical alerts of every node that runs a job.",
            [
                Query(
                    'ALERTS{alertstate="firing",severity="critical",job="$job",'
                    'alertname!="JobHitByNodeFault"} '
                    f"and on (instance) group by (instance) (clusterhealth_gpu_job_info{{{SEL}}})",
                    instant=True,
                )
            ],
            w=24,
            transformations=[organize(["Time", "__name__", "Value", "alertstate", "job"])],
        ),
    ]
