"""`clusterhealth remediate`: one reconciler for the fleet that acts on the nodes' verdicts.

Every interval it reads every node's verdict from Prometheus (``verdicts``; with ``--fabric``,
`analyze`'s host suspects too), every node as the scheduler has it (a backend: ``slurm``, or the
Kubernetes one), decides (``engine``, pure) and carries out the orders (``reconcile``), within a
fleet budget, dry-run unless ``--act``. docs/remediation.md is the operator's side of it.

* ``backend``: what a scheduler backend does and reports (the interface both backends follow);
* ``engine``: the decisions, a pure function of the two pictures and the configuration;
* ``config``: the configuration file;
* ``verdicts``: the verdicts read from Prometheus, and whether they can be trusted;
* ``ledger``: the Slurm backend's record of what it did, and its lock;
* ``slurm``: the Slurm backend (scontrol);
* ``metrics``: the remediator's own metrics;
* ``reconcile``: the loop, its exit codes and its log.
"""
