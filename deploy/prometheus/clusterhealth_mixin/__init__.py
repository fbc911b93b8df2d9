"""clusterhealth's Prometheus rules as code, one module per alert area (kubernetes-mixin's layout).

- config.py: `Config`, every selector, threshold and duration (the defaults are what ships);
- lib.py: the rules as data (`Alert`, `Record`, `Group`), what an alert is about (`SUBJECTS`),
  PromQL helpers and shared annotation fragments;
- recording.py: the recording rules the alerts and dashboards read;
- one module per alert area, each a group of the rule file: gpu.py, rdma.py (RDMA and network),
  fleet.py (fabric probes, stragglers, drift, audits), agent.py, jobs.py (with its own records);
- areas.py: the groups in the order the rule file has them;
- the outputs: rulefile.py (the YAML), alertmanager.py (the example's inhibitions), docs.py (the
  Xid runbook's table and docs/deploy.md's reference).

`deploy/prometheus/mixin.py` is the entry point that writes them all (`make generate`);
docs/adding-an-alert.md is the recipe for a new alert.
"""
