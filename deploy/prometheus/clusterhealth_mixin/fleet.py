"""Fleet alerts (group `clusterhealth.fleet`): the fabric probes (bandwidth against the
expectation, pairwise groups' suspect hosts, NCCL's transport, failed runs), stragglers against the
fleet's medians, firmware drift, and the node audits without an alert of their own. Cases:
fleet_cases.py; runbooks: docs/runbooks/<Alert>.md."""

from __future__ import annotations

from . import recording
from .config import Config
from .lib import GPU, Alert, Group, alternation, indent, joined, matchers, quote, selector


def group(c: Config) -> Group:
    return Group(
        "clusterhealth.fleet",
        [
            firmware_drift(c),
            fabric_bandwidth_degraded(c),
            node_straggler(c),
            probe_failing(c),
            nccl_transport_fallback(c),
            node_check_failing_critical(c),
            node_check_failing_warning(c),
            node_check_unknown(c),
        ],
    )


def pairwise_host(c: Config) -> str:
    """Suspect hosts of pairwise groups: a node whose `peer_success` was 0 with at least
    `pairwise_host_partners` distinct partners in the window, each of which was 1 in more than half
    of its samples (a partner of a bad host fails once; a fleet-wide slowdown leaves nobody clean).
    docs/fabric.md explains the rule and what PromQL cannot express of analyze's. Labels: job,
    instance, probe, and pairwise="host"; the value is the number of such partners."""
    success = f"clusterhealth_probe_peer_success{matchers(c)}"
    window = f"[{c.pairwise_host_window}]"
    node_info = f"clusterhealth_node_info{matchers(c)}"
    return f"""label_replace(
  count by (job, instance, probe) (
    min_over_time({success}{window}) == 0
    and on (job, probe, peer)
    label_replace(
      (
        sum by (job, instance, probe) (sum_over_time({success}{window}))
        /
        sum by (job, instance, probe) (count_over_time({success}{window}))
        > 0.5
      )
      * on (job, instance) group_left (node) {node_info},
      "peer", "$1", "node", "(.*)"
    )
  ) >= {c.pairwise_host_partners},
  "pairwise", "host", "", ""
)"""


def impact(c: Config) -> str:
    """What a pairwise group's node costs, from the impact recording rules (recording.impact), for
    the alerts that name it; nothing where the rules have no result for it."""
    of = ("job", "instance", "probe")
    workload = (
        f"a job of {c.impact_gpus} GPUs reducing {_count(c.impact_params)} parameters of "
        f"{c.impact_bytes_per_param:g} bytes with {c.impact_compute_seconds:g} s of compute a step"
    )
    return quote(
        recording.RATIO,
        of,
        " Its meetings ran at {} of its group's reference bandwidth"
        + quote(recording.ALLREDUCE_SLOWDOWN, of, ": a ring all-reduce through it takes {} times as long")
        + quote(recording.STEP_SLOWDOWN, of, f", and {workload} runs {{}} times slower")
        + quote(recording.GPU_HOURS_LOST, of, ", losing {} GPU-hours a day", fmt="%.0f")
        + ".",
    )


def _count(n: float) -> str:
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= size:
            return f"{n / size:g}{suffix}"
    return f"{n:g}"


def degraded_probe(c: Config) -> str:
    """A probe's last run below `probe_degraded_fraction` of its expectation."""
    m = selector(c)
    return f"""clusterhealth_probe_bandwidth_bytes_per_second{m()}
< on (instance, job, probe) group_left ()
(clusterhealth_probe_expected_bandwidth_bytes_per_second{m()} * {c.probe_degraded_fraction})"""


def not_pairwise(c: Config) -> str:
    """A pairwise group's single meetings alert nowhere: a bad host's partners each fall short
    once, and a path is `clusterhealth analyze`'s to name. Its host rule alerts instead."""
    return f"unless on (instance, job, probe)\nclusterhealth_probe_round{matchers(c)}"


def fallback(c: Config) -> str:
    """NCCL fell back: sockets where the node exports RDMA devices, shared memory where its GPUs
    have an NVLink up; the facts checks/probes/transport.py judges a run by, so the probe's result
    is degraded whenever this fires. Links up: a GPU's NVLink rate (its links up times one link's
    speed) by default, the per-link flags where they are exported (opt-in); on a driver without
    the speed field and without the per-link flags, the degraded run shows as ProbeFailing."""
    m = selector(c)
    return f"""clusterhealth_probe_transport_info{m('net="Socket"')}
  and on (instance, job) clusterhealth_rdma_device_info{m()}
or
clusterhealth_probe_transport_info{m('intra=~"SHM|mixed"')}
  and on (instance, job)
  (
    clusterhealth_gpu_nvlink_rate_bytes_per_second{m()} > 0
    or
    clusterhealth_gpu_nvlink_up{m()} == 1
  )"""


def not_fallback(c: Config) -> str:
    """The fallback is the run's problem to fix; its low bandwidth or failed result is the symptom."""
    return f"unless on (instance, job, probe)\n(\n{indent(fallback(c))}\n)"


def firmware_drift(c: Config) -> Alert:
    return Alert(
        "FirmwareDrift",
        "warning",
        """instance_subject:clusterhealth_firmware_info:model
* on (job, component, model, version) group_left ()
(
  job_component_model_version:clusterhealth_firmware_info:count
  < on (job, component, model) group_left ()
  job_component_model:clusterhealth_firmware_info:max_count
)""",
        "{{ $labels.component }} {{ $labels.subject }} on {{ $labels.instance }} runs "
        "{{ $labels.version }}, not the fleet's most common version.",
        "{{ $value }} device(s) of this component and model run {{ $labels.version }} in the "
        "fleet, fewer than run the most common version: the node missed a roll-out, or got a "
        "part with other firmware. Mixed firmware causes hard-to-trace collective slowdowns; "
        "update it to the fleet's version.",
        c.for_drift,
        about="firmware",
    )


def fabric_bandwidth_degraded(c: Config) -> Alert:
    fraction = c.probe_degraded_fraction
    return Alert(
        "FabricBandwidthDegraded",
        "warning",
        joined(
            joined(f"{degraded_probe(c)}\n{not_pairwise(c)}\n{not_fallback(c)}", pairwise_host(c)),
            c.fabric_pairwise_host_expr,
        ),
        "{{ if $labels.pairwise }}{{ $labels.instance }} is a suspect host of pairwise group "
        "{{ $labels.probe }}.{{ else }}Probe {{ $labels.probe }}{{ if $labels.peer }} to "
        "{{ $labels.peer }}{{ end }} on {{ $labels.instance }} measured below its expected "
        "bandwidth.{{ end }}",
        "{{ if $labels.pairwise }}Its meetings failed or fell short with {{ $value }} partners "
        f"within {c.pairwise_host_window}, each of which did fine with its other partners: the "
        "node, not the paths, is the likely culprit (its NIC or HCA, PCIe link, cable to the "
        "leaf)." + impact(c) + " `clusterhealth analyze --probe {{ $labels.probe }}` shows the meetings."
        "{{ else }}The last run measured {{ $value | humanize1024 }}B/s, below "
        f"{fraction:.0%} of the probe's expectation: a slow link, HCA or GPU on this node "
        "(or its peer). Run `clusterhealth probe run {{ $labels.probe }}` on the node and "
        "compare its HCAs' counters.{{ end }}",
        c.for_immediate,
        about="probe",
    )


def slow_gpus(c: Config) -> str:
    """Busy GPUs slower than their peers: an SM clock below its node's and its fleet's medians of
    the same model (`signal="sm_clock"`, the clock), or fault reasons holding the clocks down for
    more than `straggler_throttle_share` of `slowdown_window` by NVML's time counters
    (`signal="throttle"`, the share; a sampled clock may miss a slowdown of seconds a minute)."""
    below = round(1 - c.straggler_margin, 6)
    return f"""label_replace(
  instance_gpu:clusterhealth_gpu_sm_clock_hertz:busy
    < on (instance, job, name) group_left ()
    (instance:clusterhealth_gpu_sm_clock_hertz:busy_median * {below})
    < on (job, name) group_left ()
    (job:clusterhealth_gpu_sm_clock_hertz:busy_median * {below}),
  "signal", "sm_clock", "", ""
)
or
label_replace(
  instance_gpu:clusterhealth_gpu_sm_clock_hertz:busy * 0
    + on (instance, job, gpu, uuid) group_left ()
    instance_gpu:clusterhealth_gpu_clocks_event_seconds_total:slowdown_rate
    > {c.straggler_throttle_share:g},
  "signal", "throttle", "", ""
)"""


def node_straggler(c: Config) -> Alert:
    local = matchers(c, 'peer=""')
    below = round(1 - c.straggler_margin, 6)
    return Alert(
        "NodeStraggler",
        "warning",
        joined(
            joined(
                f"""{slow_gpus(c)}
or
clusterhealth_probe_bandwidth_bytes_per_second{local}
  < on (job, probe) group_left ()
  (job_probe:clusterhealth_probe_bandwidth_bytes_per_second:median * {below})
  and on (job, probe)
  job_probe:clusterhealth_probe_bandwidth_bytes_per_second:nodes >= {c.straggler_min_nodes}""",
                # The pairwise host rule, as FabricBandwidthDegraded has it: a host its
                # group's meetings single out is the fabric's straggler.
                pairwise_host(c),
            ),
            c.straggler_pairwise_host_expr,
        ),
        "{{ if $labels.gpu }}" + GPU + ' is a straggler: {{ if eq $labels.signal "throttle" }}its '
        "clocks are held down by a fault{{ else }}its SM clock sits below its node's and its "
        "fleet's{{ end }}.{{ else }}{{ if $labels.pairwise }}{{ $labels.instance }} is the straggler "
        "of pairwise group {{ $labels.probe }}.{{ else }}{{ $labels.instance }} is a straggler "
        "in probe {{ $labels.probe }}.{{ end }}{{ end }}",
        '{{ if $labels.gpu }}{{ if eq $labels.signal "throttle" }}Busy, and held down by a fault '
        "reason (heat, power brake, HW slowdown) for {{ $value | humanizePercentage }} of the last "
        f"{c.slowdown_window}, more than {c.straggler_throttle_share:.0%}: every synchronous job step "
        "waits for it. GPUThermalOrPowerSlowdown names the reason; drain it if it persists."
        "{{ else }}Busy at {{ $value | humanize }}Hz, more than "
        f"{c.straggler_margin:.0%} below the median of the node's and the fleet's busy GPUs "
        "of the same model: every synchronous job step waits for it. Look for clock events "
        "(thermal, power) and drain it if it persists.{{ end }}{{ else }}{{ if $labels.pairwise }}Its "
        "meetings failed or fell short with {{ $value }} partners within "
        f"{c.pairwise_host_window}, each of which did fine with its other partners: every "
        "collective it joins runs at its pace."
        + impact(c)
        + " `clusterhealth analyze --probe {{ $labels.probe }}` shows the meetings; "
        "drain it and check its HCAs, PCIe links and cables.{{ else }}The node's last run "
        "measured {{ $value | humanize1024 }}B/s, more than "
        f"{c.straggler_margin:.0%} below the fleet's median for the same probe: the node "
        "slows every job it joins. Compare its GPUs' clocks and HCAs' counters with a healthy "
        "node.{{ end }}{{ end }}",
        c.for_sustained,
        about="node",
    )


def probe_failing(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "ProbeFailing",
        "warning",
        f"""clusterhealth_probe_success{m()} == 0
unless on (instance, job, probe)
(
{indent(degraded_probe(c))}
)
{not_pairwise(c)}
{not_fallback(c)}""",
        "Probe {{ $labels.probe }} on {{ $labels.instance }} failed its last run.",
        "The probe did not complete (non-zero exit, wrong results, garbage output or a "
        "timeout). Run `clusterhealth probe run {{ $labels.probe }}` on the node to see "
        "why; a failed collective often points at a GPU or HCA fault.",
        c.for_immediate,
        about="probe",
    )


def nccl_transport_fallback(c: Config) -> Alert:
    return Alert(
        "NCCLTransportFallback",
        "warning",
        fallback(c),
        "NCCL in probe {{ $labels.probe }} on {{ $labels.instance }} fell back to sockets or "
        "shared memory (net {{ $labels.net }}, intra-node {{ $labels.intra }}).",
        "The probe's last run used net={{ $labels.net }}, intra={{ $labels.intra }}, "
        "gdrdma={{ $labels.gdrdma }}, although the node exports RDMA devices (then Socket is a "
        "fallback: libibverbs missing in the probe's container, NCCL_IB_DISABLE, HCAs not "
        "visible) or NVLink links up (then SHM, or mixed, means peer access between its GPUs "
        "is off: NCCL_P2P_DISABLE, GPUs in separate containers, ACS). Jobs on this node fall "
        "back the same way and run slower. `clusterhealth probe run {{ $labels.probe }}` on "
        "the node shows the run's reason; its NCCL INFO lines show the channels.",
        c.for_immediate,
        about="probe",
    )


def node_check_failing_critical(c: Config) -> Alert:
    uncovered = matchers(c, f'check=~"{alternation(c.uncovered_checks)}"')
    return Alert(
        "NodeCheckFailing",
        "critical",
        f"clusterhealth_check_status{uncovered} == 2",
        "Check {{ $labels.check }} of {{ $labels.subject }} on {{ $labels.instance }} is CRITICAL.",
        "The node's audit fails against its policy (a GPU or HCA missing, a port below its "
        "rate, a version other than the pinned one). Run `clusterhealth check --only "
        "{{ $labels.check }}` on the node for the detail and drain it if devices are "
        "missing.",
        c.for_immediate,
        about="check",
    )


def node_check_failing_warning(c: Config) -> Alert:
    uncovered = matchers(c, f'check=~"{alternation(c.uncovered_checks)}"')
    return Alert(
        "NodeCheckFailing",
        "warning",
        f"clusterhealth_check_status{uncovered} == 1",
        "Check {{ $labels.check }} of {{ $labels.subject }} on {{ $labels.instance }} is WARNING.",
        "The node's audit found something to fix (an extra device, a version unlike its "
        "siblings'). Run `clusterhealth check --only {{ $labels.check }}` on the node for "
        "the detail.",
        c.for_sustained,
        about="check",
    )


def node_check_unknown(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "NodeCheckUnknown",
        "warning",
        # A lost GPU's other checks are UNKNOWN too; GPUFellOffBus already says so.
        f"""clusterhealth_check_status{m()} == 3
unless on (instance, job, subject)
clusterhealth_check_status{m('check="gpu_lost"')} > 0""",
        "Check {{ $labels.check }} of {{ $labels.subject }} on {{ $labels.instance }} is UNKNOWN.",
        "The agent could not read what the check needs (NVML unusable, the kernel log "
        "unreadable), so this part of the node is not watched. Run `clusterhealth check` "
        "on the node and fix the access.",
        c.for_sustained,
        about="check",
    )
