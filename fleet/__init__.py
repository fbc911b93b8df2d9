"""The fleet-side commands: what reads the whole fleet from Prometheus rather than one node.

* ``prometheus``: the one client of Prometheus's HTTP API (queries, partial answers, costs);
* ``pairwise``: a pairwise group's history read back from it, and its analysis;
* ``analyze``, ``report``, ``model`` and ``lab``: the commands (``cli`` adds them to the command
  line); ``report/`` draws with the optional extra ``clusterhealth[report]``.

The node daemon's wiring stays in agent/. This package may import checks/ and exporters/, and
from agent/ only what both sides share (the package's version, logging, the YAML loader and the
settings machinery it reports errors with); agent/ reaches it through agent/cli.py alone
(tests/test_imports.py).
"""
