"""Generate the Python code of the vendored api.proto with grpcio-tools (`make generate`).

The proto is compiled from a temporary tree where it sits at the package's import path, so the
generated service module imports its messages as `clusterhealth.exporters.jobs.kubelet.api_pb2`.
grpcio-tools is a development dependency (the `test` extra, pinned): the agent imports only what
this writes, never this module.

    python -m clusterhealth.exporters.jobs.kubelet.generate [--check]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = Path("clusterhealth", "exporters", "jobs", "kubelet")
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate() -> dict[str, bytes]:
    """The generated files' names and contents, from api.proto beside this file."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / PACKAGE).mkdir(parents=True)
        (root / PACKAGE / "api.proto").write_bytes((HERE / "api.proto").read_bytes())
        argv = ["protoc", f"-I{root}", f"--python_out={root}", f"--pyi_out={root}"]
        argv += [f"--grpc_python_out={root}", str(root / PACKAGE / "api.proto")]
        if protoc.main(argv) != 0:
            raise RuntimeError("protoc failed on api.proto")
        return {name: (root / PACKAGE / name).read_bytes() for name in GENERATED}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for name, content in generate().items():
        path = HERE / name
        if path.exists() and path.read_bytes() == content:
            continue
        stale.append(name)
        if not args.check:
            path.write_bytes(content)
    if args.check and stale:
        print("stale, run `make generate`: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
