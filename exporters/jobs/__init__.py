"""Job attribution: which Slurm job or Kubernetes pod runs on each GPU (the `jobs` collector).

- `podresources.py`: the kubelet's pod-resources API over its unix socket (client generated from
  the kubelet's api.proto, vendored in `kubelet/`), and the device plugins' device IDs;
- `mapping.py`: the job-mapping directory in dcgm-exporter's format (deploy/slurm's Prolog writes it);
- `cgroup.py`: the Slurm job or pod of a process, from /proc/<pid>/cgroup;
- `attribution.py`: the sources' claims merged by precedence, and their conflicts;
- `collector.py`: the collector that reads the three and exports the join series.
"""
