"""The README's Install section, and a throwaway root that a node's install lands in.

The README's commands are run as written where this machine can run them: as root, in a private
mount namespace (`unshare --mount`) whose /etc, /opt and /usr/local (and /var, for a service's
state) are overlay mounts. Installing, the overlays' upper layers are folders of the throwaway
root, so `sudo make install` writes its files there and nothing on the machine changes; running
what was installed, the root's folders are laid read-only over the machine's, so the installed
unit, command, config and scripts are seen at the paths they name.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, require_tool
from .dist import wheelhouse

README = (ROOT / "README.md").read_text()
INSTALL_SECTION = README.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
# The section's shell blocks: the systemd node, Kubernetes, Slurm.
BLOCKS = re.findall(r"```sh\n(.*?)```", INSTALL_SECTION, flags=re.S)
SYSTEM_DIRS = ("etc", "opt", "usr/local")
# Build requirements of the project (pyproject's [build-system]), for pip's isolated build of the
# clone without an index: downloaded once into the clone's build folder.
BUILD_REQUIREMENTS = ROOT / "build" / "install-test" / "build-requirements"


def commands(block: str) -> list[str]:
    """A block's commands as a shell runs them: continuation lines joined, comments dropped, `&&`
    lists split. `sudo` is kept: the test runs as root, where it changes nothing."""
    joined = block.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        for command in line.split("#", 1)[0].split("&&"):
            command = " ".join(command.split())
            if command:
                out.append(command)
    return out


def offline_pip() -> dict[str, str]:
    """pip's environment for an install without an index: the wheels the image installs (`make
    wheels`) and, to build the clone, setuptools. No cache is written."""
    if not any(BUILD_REQUIREMENTS.glob("setuptools-*.whl")):
        download = ["download", "-q", "--no-deps", "--only-binary=:all:", "setuptools>=77"]
        subprocess.run(
            [sys.executable, "-m", "pip", *download, "-d", str(BUILD_REQUIREMENTS)], check=True, timeout=300
        )
    return {
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": f"{wheelhouse()} {BUILD_REQUIREMENTS}",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.fail(
            "the install tests mount overlays in a mount namespace: run as root (as `make test` does)"
        )


def in_namespace(
    script: str, *, net: bool = False, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`sh -ec SCRIPT` in a private mount namespace (and network namespace, with `net`)."""
    _need_root()
    flags = ["--mount", *(["--net"] if net else [])]
    return subprocess.run(
        [require_tool("unshare"), *flags, "sh", "-ec", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def writable_overlays(root: Path, dirs: tuple[str, ...] = SYSTEM_DIRS) -> str:
    """Mounts that send every write under /DIR to root/DIR (the machine's /DIR below, unchanged)."""
    lines = []
    for d in dirs:
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / ".work" / d).mkdir(parents=True, exist_ok=True)
        lines.append(
            f"mount -t overlay overlay -o lowerdir=/{d},upperdir={root}/{d},workdir={root}/.work/{d} /{d}\n"
        )
    return "".join(lines)


def read_only_overlays(root: Path) -> str:
    """Mounts that show root/DIR's files over the machine's /DIR."""
    return "".join(
        f"mount -t overlay overlay -o lowerdir={root}/{d}:/{d} /{d}\n"
        for d in SYSTEM_DIRS
        if (root / d).is_dir()
    )


def in_root(
    root: Path, script: str, env: dict[str, str] | None = None, *, net: bool = False, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `script` with `root`'s /etc, /opt and /usr/local laid over the machine's."""
    return in_namespace(read_only_overlays(root) + script, env=env, net=net, timeout=timeout)


def readme_install_command() -> str:
    """The systemd block's install command (the one outside its comment)."""
    (install,) = [c for c in commands(BLOCKS[0]) if re.fullmatch(r"(sudo )?make install\b.*", c)]
    return install


def readme_install(root: Path) -> Path:
    """The README's `sudo make install`, run as written from the clone, into `root`."""
    script = writable_overlays(root) + f'sudo() {{ "$@"; }}\ncd {ROOT}\n{readme_install_command()}\n'
    result = in_namespace(script, env=offline_pip(), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root
