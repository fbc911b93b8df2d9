"""A real Kubernetes API on loopback, for the tests of what talks to one.

Debian's etcd and a kube-apiserver 1.20.2 built from Debian bookworm's source package
(tests/k8s/build_apiserver.sh, which `make test` runs once: the binary lives in a cache outside the
clone). No controller, scheduler or kubelet: objects are what the tests write, which is what a
client of the API sees and does. Everything is in its own folder and on free ports: two of them
run at once.

- TLS with a self-signed certificate made here (SAN 127.0.0.1), trusted by the clients below.
- Static bearer tokens: `admin` (group system:masters) and `clusterhealth-remediator` (no group of
  its own; the API adds system:authenticated, as for every token), authorization by RBAC alone:
  the remediator may do only what Roles and ClusterRoles applied in a test grant it.
- Service-account flags 1.20 requires (issuer, signing key); the ServiceAccount admission plugin is
  off, since no token controller runs to give pods their tokens.

Usage (tests/conftest.py has the fixtures):

    with KubeAPI(tmp_path) as kube:
        kube.create_node("gpu-1")
        kube.client(kube.remediator_token).get("/api/v1/nodes").status  # 403 until RBAC allows
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .conftest import ROOT, require_tool

VERSION = "1.20.2"
REMEDIATOR = "clusterhealth-remediator"
# What the API made itself and a reset keeps: its namespaces and bootstrap RBAC.
SYSTEM_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease"}
DEFAULT_CLUSTER_ROLES = {"admin", "cluster-admin", "edit", "view"}
# What a reset empties in every namespace.
NAMESPACED = [
    "/api/v1/namespaces/{ns}/pods",
    "/api/v1/namespaces/{ns}/events",
    "/api/v1/namespaces/{ns}/configmaps",
    "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "/apis/policy/v1beta1/namespaces/{ns}/poddisruptionbudgets",
]
PATCH_TYPES = {
    "strategic": "application/strategic-merge-patch+json",
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
}


def apiserver_binary() -> Path:
    """The kube-apiserver that tests/k8s/build_apiserver.sh built (`make kube-apiserver`); the
    same cache the script picks, or KUBE_APISERVER."""
    if os.environ.get("KUBE_APISERVER"):
        return Path(os.environ["KUBE_APISERVER"])
    cache = os.environ.get("CLUSTERHEALTH_CACHE")
    if not cache:
        writable = os.access("/var/cache", os.W_OK) or os.access("/var/cache/clusterhealth", os.W_OK)
        home_cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "clusterhealth"
        cache = "/var/cache/clusterhealth" if writable else str(home_cache)
    path = Path(cache) / f"kube-apiserver-{VERSION}" / "kube-apiserver"
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: `make kube-apiserver` builds it (`make test` does)")
    return path


@dataclass(frozen=True)
class Response:
    status: int
    body: Any  # the decoded JSON, or the text when it is not JSON

    def ok(self) -> Response:
        assert 200 <= self.status < 300, f"{self.status}: {self.body}"
        return self


class Client:
    """A plain HTTPS client of the API under one bearer token."""

    def __init__(self, server: str, token: str, ca: Path) -> None:
        self.server = server
        self.token = token
        self._context = ssl.create_default_context(cafile=str(ca))

    def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
        timeout: float = 30,
    ) -> Response:  # fmt: skip
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, context=self._context, timeout=timeout) as answer:
                status, raw = answer.status, answer.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        try:
            return Response(status, json.loads(raw))
        except ValueError:
            return Response(status, raw.decode(errors="replace"))

    def get(self, path: str) -> Response:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Response:
        return self.request("POST", path, body)

    def put(self, path: str, body: Any) -> Response:
        return self.request("PUT", path, body)

    def delete(self, path: str, body: Any = None) -> Response:
        return self.request("DELETE", path, body)

    def patch(self, path: str, body: Any, patch_type: str = "strategic") -> Response:
        """PATCH with a strategic-merge ("strategic"), JSON merge ("merge") or JSON ("json") patch."""
        return self.request("PATCH", path, body, content_type=PATCH_TYPES[patch_type])


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _write_tls(directory: Path) -> tuple[Path, Path]:
    """A self-signed serving certificate for 127.0.0.1 (its own trust anchor) and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "apiserver.crt", directory / "apiserver.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_pem(key))
    key_path.chmod(0o600)
    return cert_path, key_path


def _pem(
    key: ec.EllipticCurvePrivateKey, form: serialization.PrivateFormat = serialization.PrivateFormat.PKCS8
) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, form, serialization.NoEncryption())


class KubeAPI:
    """etcd and kube-apiserver in `base`; see the module's docstring. `startup_seconds` is how
    long `start()` took until the API was ready."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.admin_token = os.urandom(16).hex()
        self.remediator_token = os.urandom(16).hex()
        self.startup_seconds = 0.0
        self.server = ""
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self.ca = base / "tls" / "apiserver.crt"

    def __enter__(self) -> KubeAPI:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> None:
        began = time.monotonic()
        binary = apiserver_binary()
        for d in ("tls", "etcd", "log", "certs"):
            (self.base / d).mkdir(parents=True, exist_ok=True)
        cert, key = _write_tls(self.base / "tls")
        signing = ec.generate_private_key(ec.SECP256R1())
        service_account_key = self.base / "tls" / "service-account.key"
        service_account_key.write_bytes(_pem(signing, serialization.PrivateFormat.TraditionalOpenSSL))
        service_account_key.chmod(0o600)
        service_account_pub = self.base / "tls" / "service-account.pub"
        service_account_pub.write_bytes(
            signing.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        tokens = self.base / "tls" / "tokens.csv"
        tokens.write_text(
            f'{self.admin_token},admin,admin,"system:masters"\n'
            f"{self.remediator_token},{REMEDIATOR},{REMEDIATOR}\n"
        )
        tokens.chmod(0o600)
        try:
            for attempt in range(3):
                client_port, peer_port, secure_port = _free_ports(3)
                self.server = f"https://127.0.0.1:{secure_port}"
                self._etcd = self._spawn(
                    [
                        require_tool("etcd"), "--name", "test",
                        "--data-dir", str(self.base / "etcd" / f"data{attempt}"),
                        "--listen-client-urls", f"http://127.0.0.1:{client_port}",
                        "--advertise-client-urls", f"http://127.0.0.1:{client_port}",
                        "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                        "--initial-cluster", f"test=http://127.0.0.1:{peer_port}",
                        # Nothing here outlives the test: its writes need not reach the disk.
                        "--unsafe-no-fsync", "--logger", "zap", "--log-level", "warn",
                    ],
                    "etcd",
                )  # fmt: skip
                self._apiserver = self._spawn(
                    [
                        str(binary),
                        f"--etcd-servers=http://127.0.0.1:{client_port}",
                        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                        f"--secure-port={secure_port}", "--insecure-port=0",
                        f"--cert-dir={self.base / 'certs'}",
                        f"--tls-cert-file={cert}", f"--tls-private-key-file={key}",
                        f"--token-auth-file={tokens}", "--anonymous-auth=false",
                        "--authorization-mode=RBAC",
                        "--service-account-issuer=https://kubernetes.default.svc",
                        f"--service-account-key-file={service_account_pub}",
                        f"--service-account-signing-key-file={service_account_key}",
                        "--service-cluster-ip-range=10.96.0.0/24",
                        "--disable-admission-plugins=ServiceAccount",
                        "--profiling=false", "--v=1",
                    ],
                    "kube-apiserver",
                )  # fmt: skip
                try:
                    self.wait(self._ready, timeout, "the API ready (/readyz)")
                    break
                except _PortTaken:
                    self._stop_processes()
                    if attempt == 2:
                        raise
        except BaseException:
            logs = self.logs()
            self.stop()
            raise RuntimeError(f"the Kubernetes API in {self.base} did not start:\n{logs}") from None
        self.startup_seconds = time.monotonic() - began

    def _ready(self) -> bool:
        try:
            answer = self.admin.get("/readyz")
        except (OSError, ssl.SSLError):
            return False
        return answer.status == 200

    def stop(self) -> None:
        self._stop_processes()

    def _stop_processes(self) -> None:
        for attr in ("_apiserver", "_etcd"):
            process = getattr(self, attr)
            if process is not None:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    try:
                        process.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait(timeout=20)
                setattr(self, attr, None)

    def _spawn(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        # setpriv's parent-death signal: a test run killed outright leaves no server behind.
        with (self.base / "log" / f"{name}.log").open("ab") as out:
            return subprocess.Popen(
                [require_tool("setpriv"), "--pdeathsig", "SIGKILL", "--", *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.base,
                start_new_session=True,
            )

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll `condition` until it holds; fail after `timeout` seconds or when a server died."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while not condition():
            for name, process in (("etcd", self._etcd), ("kube-apiserver", self._apiserver)):
                if process is not None and process.poll() is not None:
                    logs = self.logs()
                    if "address already in use" in logs:
                        raise _PortTaken(logs)
                    raise RuntimeError(f"{name} exited waiting for {what}:\n{logs}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout} s for {what}\n{self.logs()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def logs(self, lines: int = 30) -> str:
        out = []
        for path in sorted((self.base / "log").glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            if text:
                out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)

    # --- clients ---------------------------------------------------------------------------

    def client(self, token: str) -> Client:
        return Client(self.server, token, self.ca)

    @property
    def admin(self) -> Client:
        return self.client(self.admin_token)

    @property
    def remediator(self) -> Client:
        """The identity the remediator runs as: allowed what the applied RBAC allows it."""
        return self.client(self.remediator_token)

    def kubeconfig(self, path: Path, token: str | None = None) -> Path:
        """A kubeconfig file for this API and a token (admin's by default)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "test", "cluster": {"server": self.server, "certificate-authority": str(self.ca)}}
            ],
            "users": [{"name": "user", "user": {"token": token or self.admin_token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def kubectl(
        self, *args: str, token: str | None = None, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """kubectl (`make k8s-tools`) against this API, as admin unless told another token."""
        kubectl = Path(sys.executable).parent / "kubectl"
        if not kubectl.exists():
            pytest.fail(f"{kubectl} is missing: `make k8s-tools` installs it (`make test` does)")
        return subprocess.run(
            [str(kubectl), f"--server={self.server}", f"--certificate-authority={self.ca}",
             f"--token={token or self.admin_token}", *args],
            input=input, capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "KUBECONFIG": os.devnull},
        )  # fmt: skip

    def apply(self, manifests: str | Iterable[dict[str, Any]], token: str | None = None) -> None:
        """`kubectl apply` of manifests (YAML text, or objects)."""
        text = manifests if isinstance(manifests, str) else yaml.safe_dump_all(list(manifests))
        done = self.kubectl("apply", "-f", "-", token=token, input=text)
        assert done.returncode == 0, done.stderr

    # --- objects ---------------------------------------------------------------------------

    def create_node(
        self,
        name: str,
        *,
        ready: bool = True,
        heartbeat: datetime.datetime | None = None,
        labels: dict[str, str] | None = None,
        gpus: int = 8,
    ) -> dict[str, Any]:
        """A Node as a kubelet registers it and reports its status: the Ready condition (with
        its heartbeat), the kubelet's other conditions, addresses, capacity with its GPUs."""
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        }
        self.admin.post("/api/v1/nodes", node).ok()
        return (
            self.admin.patch(f"/api/v1/nodes/{name}/status", kubelet_status(ready, heartbeat, gpus)).ok().body
        )

    def node(self, name: str) -> dict[str, Any]:
        body: dict[str, Any] = self.admin.get(f"/api/v1/nodes/{name}").ok().body
        return body

    def reset(self) -> None:
        """Back to a fresh API for the next test: no Node, and in every namespace no pod, event,
        lease, configmap, role, binding or PodDisruptionBudget; the ClusterRoles and bindings a
        test added removed. Namespaces a test made stay, empty (only a controller could finish
        deleting one)."""
        admin = self.admin
        admin.delete("/api/v1/nodes").ok()
        namespaces = [n["metadata"]["name"] for n in admin.get("/api/v1/namespaces").ok().body["items"]]
        for ns in namespaces:
            for path in NAMESPACED:
                admin.request("DELETE", path.format(ns=ns) + "?gracePeriodSeconds=0").ok()
            for sa in admin.get(f"/api/v1/namespaces/{ns}/serviceaccounts").ok().body["items"]:
                if sa["metadata"]["name"] != "default":
                    admin.delete(f"/api/v1/namespaces/{ns}/serviceaccounts/{sa['metadata']['name']}").ok()
        for kind in ("clusterroles", "clusterrolebindings"):
            path = f"/apis/rbac.authorization.k8s.io/v1/{kind}"
            for item in admin.get(path).ok().body["items"]:
                name = item["metadata"]["name"]
                if name.startswith("system:") or name in DEFAULT_CLUSTER_ROLES:
                    continue
                admin.delete(f"{path}/{name}").ok()


class _PortTaken(RuntimeError):
    pass


def _timestamp(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def kubelet_status(
    ready: bool = True, heartbeat: datetime.datetime | None = None, gpus: int = 8
) -> dict[str, Any]:
    """A node's status as the kubelet (1.20) patches it."""
    now = heartbeat or datetime.datetime.now(datetime.timezone.utc)
    stamp = _timestamp(now)

    def condition(kind: str, status: bool, reason: str, message: str) -> dict[str, str]:
        return {
            "type": kind, "status": "True" if status else "False", "reason": reason, "message": message,
            "lastHeartbeatTime": stamp, "lastTransitionTime": stamp,
        }  # fmt: skip

    resources = {"cpu": "64", "memory": "1056Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    sufficient = "kubelet has sufficient {} available"
    return {
        "status": {
            "conditions": [
                condition("MemoryPressure", False, "KubeletHasSufficientMemory", sufficient.format("memory")),
                condition("DiskPressure", False, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", False, "KubeletHasSufficientPID", sufficient.format("PID")),
                condition("Ready", ready, "KubeletReady" if ready else "KubeletNotReady",
                          "kubelet is posting ready status" if ready else "container runtime is down"),
            ],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "capacity": resources,
            "allocatable": resources,
            "nodeInfo": {
                "kubeletVersion": f"v{VERSION}", "kubeProxyVersion": f"v{VERSION}", "architecture": "amd64",
                "operatingSystem": "linux", "osImage": "Debian GNU/Linux 12 (bookworm)",
                "kernelVersion": "6.1.0", "containerRuntimeVersion": "containerd://1.6.20",
                "machineID": "", "systemUUID": "", "bootID": "",
            },
        }
    }  # fmt: skip


def condition(node: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """A node's condition of that type, or None."""
    for c in node.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return dict(c)
    return None


def helm_template(*args: str) -> list[dict[str, Any]]:
    """The chart (deploy/kubernetes/helm/clusterhealth) rendered by helm (`make k8s-tools`)."""
    helm = Path(sys.executable).parent / "helm"
    if not helm.exists():
        pytest.fail(f"{helm} is missing: `make k8s-tools` installs it (`make test` does)")
    chart = ROOT / "deploy" / "kubernetes" / "helm" / "clusterhealth"
    done = subprocess.run(
        [str(helm), "template", "clusterhealth", str(chart), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]
