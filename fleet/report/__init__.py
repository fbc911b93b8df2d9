"""`clusterhealth report`: what `analyze` reads and concludes, as a picture a person looks at.

One self-contained HTML page (or one PNG) from a pairwise group's history as fleet/pairwise.py
reads it and judges it, the same reading as `analyze`'s:

* ``command``: the command (its arguments, the exit codes, the file written whole or not at all);
  it imports nothing beyond the package until the report extra is known to be installed;
* ``view``: what the page shows, as arrays: the nodes' order (by placement when known, else by
  name), the pair matrix (latest and worst meeting of each pair), its aggregate by group, each
  node's worst meeting per round, and what was missing;
* ``render``: the pictures (colormap, rasters, legend) and the page (``page.html.j2``) or the PNG.

matplotlib (the colormap, the legend, the PNG), Pillow (the rasters) and Jinja2 (the page) are
the optional extra ``clusterhealth[report]``: the node image does not carry them.
"""
