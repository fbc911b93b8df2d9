"""Fabric tomography: pairwise probe groups.

Pure parts, which do no I/O and read no clock:

* ``schedule``: who meets whom in which round, with which role, and the confirming meeting; every
  agent of a group derives the same answer from (members, round, seed) with no coordinator.
* ``members``: a group's inventory, from the config or a members file.
* ``topology``: where a member sits (leaf, spine, pod, rail, NVLink domain), and the order of
  nodes by place (``ordered``, ``leaf_of``, ``leaves``) for the report and the dashboards.
* ``analysis``: from the meetings of a group (read back from Prometheus by fleet/pairwise.py), which
  host, which path between two hosts, or which leaf or uplink is the suspect.
* ``simulation``: a group played round by round without a network, for tests and benchmarks/.
* ``settings``: a group's keys in the config file.

And the parts that run: ``rounds``, each group's rounds on this node (a thread per group, started
by the ``probes`` collector, what it keeps and exports), and ``meeting``, one end of one meeting
through the probe pipeline (checks/probes/pipeline.py). ``clusterhealth analyze`` reads the
group's history from Prometheus on the fleet's side (fleet/pairwise.py, fleet/analyze.py).
"""

from __future__ import annotations
