"""Fabric tomography: pairwise probe groups, pure parts.

* ``schedule``: who meets whom in which round, with which role, and the confirming meeting; every
  agent of a group derives the same answer from (members, round, seed) with no coordinator.
* ``analysis``: from the results read back from Prometheus, which host or which path between two
  hosts is the suspect.

Nothing here does I/O or reads a clock; the agent runs the rounds and ``clusterhealth analyze``
queries Prometheus.
"""

from __future__ import annotations
