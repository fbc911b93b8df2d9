"""The remediator's image, built for real by `make image-remediator` on the base tests/test_image.py
bootstraps (and caches): the agent's image with the kubernetes extra, whose client the remediator
loads inside it. The agent's own image stays without it (tests/test_image.py holds its size)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from .dist import VERSION, make
from .test_image import _base_image, _buildah, _run

IMAGE = f"localhost/clusterhealth-remediate-test:{VERSION}"


@pytest.fixture(scope="module")
def container() -> Iterator[str]:
    base = _base_image()
    buildah = " ".join(_buildah())
    make("image-remediator", f"REMEDIATOR_IMAGE={IMAGE}", f"BASE={base}", f"BUILDAH={buildah}",
         "BUILD_FLAGS=--isolation chroot")  # fmt: skip
    name = _run([*_buildah(), "from", "-q", IMAGE]).stdout.strip()
    yield name
    subprocess.run([*_buildah(), "rm", name], capture_output=True, check=False)


def test_the_remediator_loads_the_kubernetes_client_in_its_image(container: str) -> None:
    run = [*_buildah(), "run", "--isolation", "chroot", container, "--"]
    version = subprocess.run(
        [*run, "/opt/clusterhealth/bin/python", "-c", "import kubernetes; print(kubernetes.__version__)"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert version.returncode == 0 and version.stdout.startswith("37."), version.stderr
    # Out of a cluster and without a kubeconfig: the client is there and says what it lacks (exit 2).
    done = subprocess.run(
        [*run, "clusterhealth", "remediate", "--backend", "kubernetes", "--prometheus", "http://127.0.0.1:9",
         "--once"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot reach the Kubernetes API with the service account or the default kubeconfig" in done.stderr
    listed = json.loads(_run([*_buildah(), "images", "--json", IMAGE]).stdout)
    assert listed[0]["size"].endswith("MB")
