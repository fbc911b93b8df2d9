"""The container image, built for real: `make image` with buildah on a Debian base this test
bootstraps itself (no registry is reachable here), then the agent run inside the built image.

- The base is what Debian's own images are made from: `mmdebstrap` (bookworm, minbase, python3,
  the slim images' dpkg path excludes) from the Debian mirror, imported into buildah.
- The image is built by the README's own `make image IMAGE=...` command (its Install section), in
  a copy of the clone (tests/dist.py's `source_copy`: the build folders are the copy's, so the other
  packaging tests build in the clone meanwhile), with three variables added for this machine: the
  bootstrapped base (`BASE=`), buildah's vfs storage in the test cache and chroot isolation (what
  works without a container runtime). The tests then use the image by the ID buildah wrote
  (`--iidfile`), not by the README's tag, which another clone's test run may be building meanwhile
  in the same storage. The README's `buildah push` needs a registry, which the test machines do not
  have.
- Inside it, with `buildah run`: `clusterhealth scrape` on the golden node of tests/test_golden.py
  gives the golden exposition line for line, and `clusterhealth agent` serves /metrics and /healthz
  on loopback.

The bootstrap tarball and buildah's storage (with the layer cache) are kept between runs under
$CLUSTERHEALTH_TEST_CACHE (default ~/.cache/clusterhealth-tests): the first run takes about a minute
and a half longer. Delete the folder to start afresh.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import ROOT, require_tool, samples
from .dist import VERSION, make, source_copy
from .node_root import BLOCKS, commands
from .test_golden import GOLDEN_FILE, SPEC_GPU, comparable, golden_node

pytestmark = pytest.mark.slow

CACHE = Path(os.environ.get("CLUSTERHEALTH_TEST_CACHE", Path.home() / ".cache" / "clusterhealth-tests"))
MIRROR = os.environ.get("CLUSTERHEALTH_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What debian:bookworm-slim leaves out, so that the base is about its size.
SLIM = [
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-exclude=/usr/share/lintian/*",
]
BOOTSTRAP = ["--variant=minbase", "--include=python3", "--mode=root", *SLIM, "bookworm"]
KEY = hashlib.sha256(json.dumps([*BOOTSTRAP, MIRROR]).encode()).hexdigest()[:12]
BASE = f"localhost/clusterhealth-test-base:{KEY}"
# The README's command, and the image it names.
MAKE_IMAGE = commands(BLOCKS[1])[0]
IMAGE = MAKE_IMAGE.split("IMAGE=", 1)[1]
# vfs keeps a full copy of the tree per layer: past this, the storage is emptied and rebuilt.
STORAGE_LIMIT_BYTES = 3 * 1024**3


def _buildah() -> list[str]:
    return [
        require_tool("buildah"),
        "--root",
        str(CACHE / "storage"),
        "--runroot",
        str(CACHE / "run"),
        "--storage-driver",
        "vfs",
    ]


def _run(argv: list[str], timeout: float = 600, **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]
    assert result.returncode == 0, f"{argv[:4]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _size(path: Path) -> int:
    """Bytes of the files under path; a file another clone's test run removes meanwhile (the cache
    is shared) counts nothing."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def _base_image() -> str:
    """The bootstrapped base, imported into buildah's storage; both kept between runs."""
    tarball = CACHE / f"bookworm-python3-{KEY}.tar"
    if not tarball.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        # Another clone's test run may be bootstrapping into the same cache at the same time.
        partial = tarball.with_suffix(f".partial-{os.getpid()}.tar")
        _run([require_tool("mmdebstrap"), *BOOTSTRAP, str(partial), MIRROR])
        partial.rename(tarball)
    # The images no tag names any more first (earlier builds): `rmi --all --force` also takes the
    # images and containers another clone's test run is using, so it is the last resort.
    for emptying in (["--prune"], ["--all", "--force"]):
        if _size(CACHE / "storage") > STORAGE_LIMIT_BYTES:
            subprocess.run([*_buildah(), "rmi", *emptying], capture_output=True, check=False)
    known = subprocess.run([*_buildah(), "inspect", "--type", "image", BASE], capture_output=True)
    if known.returncode != 0:
        container = _run([*_buildah(), "from", "scratch"]).stdout.strip()
        _run([*_buildah(), "add", container, str(tarball), "/"])
        _run([*_buildah(), "commit", "--rm", "-q", container, BASE])
    return BASE


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The image the README's command built, by its ID: the tag is the README's, and another clone's
    test run may be building another image under it in the same storage meanwhile."""
    base = _base_image()
    buildah = " ".join(_buildah())
    iidfile = tmp_path_factory.mktemp("image") / "iid"
    clone, env = source_copy(tmp_path_factory.mktemp("clone"))
    assert MAKE_IMAGE.split()[:2] == ["make", "image"], MAKE_IMAGE
    flags = f"BUILD_FLAGS=--isolation chroot --iidfile {iidfile}"
    built = make(
        *MAKE_IMAGE.split()[1:], f"BASE={base}", f"BUILDAH={buildah}", flags, directory=clone, env=env
    )
    assert f"Successfully tagged {IMAGE}\n" in built.stdout, built.stdout[-3000:]
    return iidfile.read_text().strip()


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    """One working container for the module's tests (vfs copies the whole tree for each)."""
    name = _run([*_buildah(), "from", "-q", image]).stdout.strip()
    yield name
    subprocess.run([*_buildah(), "rm", name], capture_output=True, check=False)


def run_in(container: str, *argv: str, mount: Path | None = None) -> subprocess.CompletedProcess[str]:
    volume = ["-v", f"{mount}:{mount}"] if mount is not None else []
    return subprocess.run(
        [*_buildah(), "run", "--isolation", "chroot", *volume, container, "--", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_image_describes_itself(image: str) -> None:
    """OCI labels, the entry point and the default command, as users and registries read them."""
    inspected = json.loads(_run([*_buildah(), "inspect", "--type", "image", image]).stdout)
    config = inspected["OCIv1"]["config"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.source"].startswith("https://")
    assert labels["org.opencontainers.image.base.name"] == BASE
    assert config["Entrypoint"] == ["/opt/clusterhealth/bin/clusterhealth"]
    assert config["Cmd"] == ["agent"]
    assert "9845/tcp" in config["ExposedPorts"]


def test_the_probe_tools_and_the_command_are_in_the_image(container: str) -> None:
    where = "for t in iperf3 ib_write_bw clusterhealth; do command -v $t; done; clusterhealth --version"
    result = run_in(container, "sh", "-c", where)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "/usr/bin/iperf3",
        "/usr/bin/ib_write_bw",
        "/opt/clusterhealth/bin/clusterhealth",
        "clusterhealth",
        VERSION,
    ]
    # Nothing to compile or install at run time: no compiler, no pip.
    absent = "for t in gcc cc pip pip3 /opt/clusterhealth/bin/pip; do command -v $t; done"
    tools = run_in(container, "sh", "-c", absent)
    assert tools.stdout.strip() == ""


def test_scrape_in_the_image_gives_the_golden_exposition(container: str, tmp_path: Path) -> None:
    node = golden_node(tmp_path)
    probed = run_in(container, "clusterhealth", "probe", "run", "nccl-allreduce", *node, mount=tmp_path)
    assert probed.returncode == 0, probed.stdout + probed.stderr
    result = run_in(container, "clusterhealth", "scrape", *node, mount=tmp_path)
    assert result.returncode == 0, result.stderr
    assert 'clusterhealth_build_info{version="' + VERSION + '"} 1.0' in result.stdout
    got = comparable(result.stdout)
    want = GOLDEN_FILE.read_text().splitlines()
    for n, (a, b) in enumerate(zip(got, want, strict=False), start=1):
        assert a == b, f"line {n} differs from {GOLDEN_FILE.name}"
    assert len(got) == len(want)


# The agent in the background; the image's own Python reads /metrics and /healthz over loopback
# once it serves, then stops it with SIGTERM and reports its exit status.
_SERVE_AND_READ = """
clusterhealth agent --listen 127.0.0.1:$PORT "$@" 2>"$OUT/agent.log" &
agent=$!
python3 - "$PORT" "$OUT" <<'PY'
import sys, time, urllib.request
port, out = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + 60
def get(path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return response.read()
# Until the audits, which wait for the GPU collector's first cycle, have run once.
while True:
    try:
        metrics = get("/metrics")
        if b'clusterhealth_scrape_collector_success{collector="audit"}' in metrics:
            break
    except OSError:
        pass
    if time.monotonic() > deadline:
        raise SystemExit("no complete exposition within 60 s")
    time.sleep(0.5)
open(f"{out}/metrics", "wb").write(metrics)
open(f"{out}/healthz", "wb").write(get("/healthz"))
PY
kill -TERM "$agent"
wait "$agent"
echo "agent exit $?"
"""


def test_the_agent_serves_metrics_on_loopback_in_the_image(container: str, tmp_path: Path) -> None:
    from .prom import free_port

    (tmp_path / "node").mkdir()
    node = golden_node(tmp_path / "node")
    out = tmp_path / "out"
    out.mkdir()
    script = f"PORT={free_port()} OUT={out}\n{_SERVE_AND_READ}"
    result = run_in(container, "sh", "-c", script, "sh", *node, mount=tmp_path)
    log = (out / "agent.log").read_text() if (out / "agent.log").exists() else ""
    assert result.returncode == 0 and "agent exit 0" in result.stdout, result.stdout + result.stderr + log
    assert "serving /metrics and /healthz on 127.0.0.1:" in log
    exposition = (out / "metrics").read_text()
    names = {name for name, _ in samples(exposition)}
    assert set(SPEC_GPU) <= names
    assert 'clusterhealth_scrape_collector_success{collector="gpu"} 1.0' in exposition
    assert json.loads((out / "healthz").read_text())["collectors"]["gpu"]["success"] is True


def test_the_image_is_small_enough_and_its_size_is_recorded(image: str) -> None:
    """The target is 250 MB uncompressed; docs/performance.md records the size, and the record
    must stay within 5% of the image built (a new dependency's megabytes are measured again)."""
    listed = _run([*_buildah(), "images", "--json", image]).stdout
    number, unit = json.loads(listed)[0]["size"].split()  # "191 MB": decimal units, as registries show
    size = float(number) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
    assert size <= TARGET_BYTES, f"{number} {unit}"
    recorded = recorded_image_bytes()
    assert recorded <= TARGET_BYTES
    assert abs(size - recorded) <= 0.05 * recorded, (
        f"the image is {number} {unit}, docs/performance.md records {recorded / 1e6:g} MB: measure again"
    )


TARGET_BYTES = 250e6


def recorded_image_bytes() -> float:
    """The uncompressed size docs/performance.md's "Container image" table gives the image."""
    text = (ROOT / "docs" / "performance.md").read_text()
    section = text.split("\n## Container image", 1)[1].split("\n## ", 1)[0]
    (megabytes,) = re.findall(
        r"^\| clusterhealth \S+ on the test's bookworm base \| ([\d.]+) MB \|", section, re.M
    )
    return float(megabytes) * 1e6


def test_the_recorded_image_size_is_read_and_within_the_target() -> None:
    """What the size check above reads, without building: the number, not only the heading."""
    assert 100e6 < recorded_image_bytes() <= TARGET_BYTES
