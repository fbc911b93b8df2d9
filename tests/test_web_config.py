"""--web-config-file: TLS, client certificates and basic auth, with real clients.

Certificates are made here, per test session, with `cryptography` (nothing secret is committed).
The clients are Python's ssl, `curl` and a real Prometheus scraping over TLS with basic auth and a
client certificate. The agent runs as a real process.
"""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import warnings
from base64 import b64encode
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from clusterhealth.agent import webconfig
from clusterhealth.agent.config import ConfigError, from_mapping

from .conftest import AgentProcess, require_tool, run_cli
from .prom import free_port

PASSWORD = "s3cret"
# Cost 4, the least bcrypt takes, keeps the tests fast; the format is what htpasswd -B writes.
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$", 1)


# --- certificates ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path  # SAN scraper.example, signed by ca
    client_key: Path
    rogue_cert: Path  # SAN scraper.example, signed by another CA
    rogue_key: Path
    other_san_cert: Path  # SAN intruder.example, signed by ca
    other_san_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    sans: list[x509.GeneralName],
    usage: x509.ObjectIdentifier | None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    issuer_name, issuer_key = issuer if issuer is not None else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is None:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(
    directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("clusterhealth test CA", ca_key, None, [], None)
    rogue_ca_key = ec.generate_private_key(ec.SECP256R1())
    rogue_ca = _issue("another CA", rogue_ca_key, None, [], None)
    ca_path, _ = _write(directory, "ca", ca, ca_key)

    def leaf(
        name: str, issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], sans: list[Any], usage: Any
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        return _write(directory, name, _issue(name, key, (issuer[0].subject, issuer[1]), sans, usage), key)

    server = leaf(
        "server",
        (ca, ca_key),
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        ExtendedKeyUsageOID.SERVER_AUTH,
    )
    client = leaf("client", (ca, ca_key), [x509.DNSName("scraper.example")], ExtendedKeyUsageOID.CLIENT_AUTH)
    rogue = leaf(
        "rogue", (rogue_ca, rogue_ca_key), [x509.DNSName("scraper.example")], ExtendedKeyUsageOID.CLIENT_AUTH
    )
    other = leaf("other", (ca, ca_key), [x509.DNSName("intruder.example")], ExtendedKeyUsageOID.CLIENT_AUTH)
    return Pki(ca_path, *server, *client, *rogue, *other)


def web_file(tmp_path: Path, data: dict[str, Any], name: str = "web.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def tls(pki: Pki, **extra: Any) -> dict[str, Any]:
    return {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key), **extra}


def quiet_config(tmp_path: Path) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(
        "collectors:\n  gpu: {enabled: false}\n  kernel_log: {enabled: false}\n  audit: {enabled: false}\n"
        "  rdma: {enabled: false}\n"
    )
    return config


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Any]:
    started: list[AgentProcess] = []

    def start(web: Path | None, *args: str) -> AgentProcess:
        extra = ["--web-config-file", str(web)] if web is not None else []
        process = AgentProcess(["--config", str(quiet_config(tmp_path)), *extra, *args])
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def port_of(agent: AgentProcess) -> int:
    return int(agent.url.rsplit(":", 1)[1])


def https_get(
    port: int,
    path: str,
    ca: Path,
    user: str | None = None,
    password: str | None = None,
    cert: tuple[Path, Path] | None = None,
) -> tuple[int, bytes, dict[str, str]]:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
    if user is not None:
        token = b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    binary = require_tool("curl")
    return subprocess.run(
        [binary, "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


# --- loading ---------------------------------------------------------------------------------


def load_error(tmp_path: Path, data: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        webconfig.load(web_file(tmp_path, data))
    return str(caught.value)


@pytest.mark.parametrize(
    ("data", "key", "expected"),
    [
        ({"tls_server_config": {"key_file": "k.pem"}}, "tls_server_config.cert_file", "a certificate"),
        (
            {"tls_server_config": {"cert_file": "missing.pem", "key_file": "k.pem"}},
            "tls_server_config.cert_file",
            "a readable file",
        ),
        (
            {"tls_server_config": {"client_auth_type": "Sometimes"}},
            "tls_server_config.client_auth_type",
            "one of",
        ),
        ({"tls_server_config": {"min_version": "TLS14"}}, "tls_server_config.min_version", "one of"),
        (
            {"tls_server_config": {"cipher_suites": ["RC4"]}},
            "tls_server_config.cipher_suites",
            "unknown: RC4",
        ),
        (
            {"tls_server_config": {"curve_preferences": ["X448"]}},
            "tls_server_config.curve_preferences",
            "unknown: X448",
        ),
        (
            {"tls_server_config": {"client_auth_type": "RequireAnyClientCert"}},
            "tls_server_config.client_auth_type",
            "cannot take a client certificate without verifying it",
        ),
        ({"basic_auth_users": {"alice": "plaintext-password"}}, "basic_auth_users.alice", "a bcrypt hash"),
        ({"basic_auth_users": {"a:b": HASH}}, "basic_auth_users.a:b", "without ':'"),
        ({"basic_auth_user": {}}, "basic_auth_user", "one of the known keys"),
        ({"rate_limit": {"interval": "1s", "burst": 5}}, "rate_limit", "not supported"),
        (
            {"http_server_config": {"headers": {"X-Frame-Options": "allow"}}},
            "http_server_config.headers",
            "deny",
        ),
        ([1, 2], "<top level>", "a mapping"),
    ],
)
def test_a_bad_web_config_names_the_key(tmp_path: Path, data: Any, key: str, expected: str) -> None:
    message = load_error(tmp_path, data)
    assert f"web.yaml: {key}: expected" in message
    assert expected in message


def test_a_plaintext_password_in_the_file_is_not_echoed(tmp_path: Path) -> None:
    assert "plaintext-password" not in load_error(
        tmp_path, {"basic_auth_users": {"alice": "plaintext-password"}}
    )


def test_tls_files_are_checked_at_load(tmp_path: Path, pki: Pki) -> None:
    mismatched = {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.client_key)}}
    assert (
        "tls_server_config.cert_file and tls_server_config.key_file: expected a PEM certificate"
        in load_error(tmp_path, mismatched)
    )
    ca_without_auth = {"tls_server_config": tls(pki, client_ca_file=str(pki.ca))}
    assert "tls_server_config.client_auth_type" in load_error(tmp_path, ca_without_auth)
    auth_without_ca = {"tls_server_config": tls(pki, client_auth_type="RequireAndVerifyClientCert")}
    assert "tls_server_config.client_ca_file" in load_error(tmp_path, auth_without_ca)
    sans_without_verification = {
        "tls_server_config": tls(
            pki,
            client_ca_file=str(pki.ca),
            client_auth_type="VerifyClientCertIfGiven",
            client_allowed_sans=["x"],
        )
    }
    assert "tls_server_config.client_allowed_sans" in load_error(tmp_path, sans_without_verification)


def test_relative_files_are_read_beside_the_web_config(tmp_path: Path, pki: Pki) -> None:
    shutil.copy(pki.server_cert, tmp_path / "s.pem")
    shutil.copy(pki.server_key, tmp_path / "s-key.pem")
    loaded = webconfig.load(
        web_file(tmp_path, {"tls_server_config": {"cert_file": "s.pem", "key_file": "s-key.pem"}})
    )
    assert loaded.tls and not loaded.authenticates


def test_inline_certificate_and_key(tmp_path: Path, pki: Pki) -> None:
    data = {"tls_server_config": {"cert": pki.server_cert.read_text(), "key": pki.server_key.read_text()}}
    assert webconfig.load(web_file(tmp_path, data)).tls


def test_the_agent_exits_2_naming_the_key(tmp_path: Path) -> None:
    bad = web_file(tmp_path, {"basic_auth_users": {"alice": "nope"}})
    result = run_cli(
        "agent",
        "--listen",
        "127.0.0.1:0",
        "--config",
        str(quiet_config(tmp_path)),
        "--web-config-file",
        str(bad),
    )
    assert result.returncode == 2
    assert "basic_auth_users.alice: expected a bcrypt hash" in result.stderr
    via_config = tmp_path / "with-key.yaml"
    via_config.write_text(f"web_config_file: {bad}\n")
    result = run_cli("agent", "--listen", "127.0.0.1:0", "--config", str(via_config))
    assert result.returncode == 2 and "basic_auth_users.alice" in result.stderr


# --- TLS parameters, in process --------------------------------------------------------------


def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> tuple[str, str, int]:
    """A TLS handshake between two contexts over memory: the cipher the client got (SSLError when
    they do not agree)."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    ends = [
        client.wrap_bio(to_client, to_server, server_hostname="localhost"),
        server.wrap_bio(to_server, to_client, server_side=True),
    ]
    pending = list(ends)
    for _ in range(10):
        for end in list(pending):
            try:
                end.do_handshake()
                pending.remove(end)
            except ssl.SSLWantReadError:
                pass
        if not pending:
            cipher = ends[0].cipher()
            assert cipher is not None
            return cipher
    raise AssertionError("the handshake made no progress")


def server_context(tmp_path: Path, pki: Pki, **extra: Any) -> ssl.SSLContext:
    context = webconfig.load(web_file(tmp_path, {"tls_server_config": tls(pki, **extra)})).ssl_context
    assert context is not None
    return context


def client_context(
    pki: Pki, ciphers: str | None = None, curve: str | None = None, version: str = "TLSv1_2"
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.maximum_version = getattr(ssl.TLSVersion, version)
    if ciphers:
        context.set_ciphers(ciphers)
    if curve:
        context.set_ecdh_curve(curve)  # the client's one key-exchange group
    return context


CBC = "ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA:ECDHE-ECDSA-AES128-SHA256:ECDHE-ECDSA-AES256-SHA384"


def test_tls12_offers_only_aead_suites_by_default(tmp_path: Path, pki: Pki) -> None:
    server = server_context(tmp_path, pki)
    with pytest.raises(ssl.SSLError, match=r"NO_SHARED_CIPHER"):
        handshake(server, client_context(pki, CBC))
    for suite in (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
    ):
        assert handshake(server, client_context(pki, suite))[0] == suite
    assert handshake(server, client_context(pki, version="TLSv1_3"))[1] == "TLSv1.3"


def test_cipher_suites_and_the_servers_order_are_honoured(tmp_path: Path, pki: Pki) -> None:
    suites = ["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"]
    client = client_context(pki, "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384")
    ours = server_context(tmp_path, pki, cipher_suites=suites)
    assert handshake(ours, client)[0] == "ECDHE-ECDSA-AES256-GCM-SHA384"
    theirs = server_context(tmp_path, pki, cipher_suites=suites, prefer_server_cipher_suites=False)
    assert handshake(theirs, client)[0] == "ECDHE-ECDSA-AES128-GCM-SHA256"
    # A file that names a CBC suite gets it: the defaults are defaults.
    cbc = server_context(tmp_path, pki, cipher_suites=["TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA"])
    assert handshake(cbc, client_context(pki, CBC))[0] == "ECDHE-ECDSA-AES128-SHA"


def test_curve_preferences_limit_the_key_exchange(tmp_path: Path, pki: Pki) -> None:
    p384 = server_context(tmp_path, pki, curve_preferences=["CurveP384"])
    assert handshake(p384, client_context(pki, curve="secp384r1", version="TLSv1_3"))[1] == "TLSv1.3"
    with pytest.raises(ssl.SSLError):
        handshake(p384, client_context(pki, curve="prime256v1", version="TLSv1_3"))
    # TLS 1.2: OpenSSL also takes the ECDSA certificate's curve (P-256 here) from the list.
    with pytest.raises(ssl.SSLError):
        handshake(p384, client_context(pki, curve="prime256v1"))
    both = server_context(tmp_path, pki, curve_preferences=["CurveP384", "CurveP256"])
    assert handshake(both, client_context(pki, curve="prime256v1"))[1] == "TLSv1.2"
    x25519 = server_context(tmp_path, pki, curve_preferences=["X25519"])
    with pytest.raises(ssl.SSLError):
        handshake(x25519, client_context(pki, curve="prime256v1", version="TLSv1_3"))
    assert handshake(x25519, client_context(pki, version="TLSv1_3"))[1] == "TLSv1.3"  # X25519 offered


def test_security_headers_by_default_and_the_files_own_values_win(tmp_path: Path) -> None:
    assert dict(webconfig.NO_WEB_CONFIG.headers) == {
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "deny",
        "Content-Security-Policy": "default-src 'none'",
    }
    loaded = webconfig.load(
        web_file(
            tmp_path,
            {
                "http_server_config": {
                    "headers": {"X-Frame-Options": "sameorigin", "Strict-Transport-Security": "max-age=60"}
                }
            },
        )
    )
    assert dict(loaded.headers) == {
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "sameorigin",
        "Content-Security-Policy": "default-src 'none'",
        "Strict-Transport-Security": "max-age=60",
    }


# --- verified credentials are remembered -----------------------------------------------------


def test_credentials_pay_bcrypt_once_per_good_password() -> None:
    credentials = webconfig.Credentials({"alice": HASH.encode()})
    assert not credentials.known(b"alice", PASSWORD.encode())
    assert credentials.verify(b"alice", PASSWORD.encode())
    assert credentials.known(b"alice", PASSWORD.encode())
    # Failures are not remembered: each wrong guess pays bcrypt again.
    assert not credentials.verify(b"alice", b"guess")
    assert not credentials.known(b"alice", b"guess")
    assert not credentials.verify(b"mallory", PASSWORD.encode())
    # What is kept is a keyed digest, not the password.
    assert all(PASSWORD.encode() not in tag for tag in credentials._verified)
    # Another configuration (a reload) starts over.
    assert not webconfig.Credentials({"alice": HASH.encode()}).known(b"alice", PASSWORD.encode())


def test_remembered_credentials_are_not_confused_by_where_user_and_password_split() -> None:
    """ "ab" with password "c" and "a" with password "bc" concatenate alike: verifying the first
    must not let the second in without bcrypt."""
    users = {
        "ab": bcrypt.hashpw(b"c", bcrypt.gensalt(rounds=4)),
        "a": bcrypt.hashpw(b"other", bcrypt.gensalt(rounds=4)),
    }
    credentials = webconfig.Credentials(users)
    assert credentials.verify(b"ab", b"c")
    assert credentials.known(b"ab", b"c")
    assert not credentials.known(b"a", b"bc")
    assert not credentials.known(b"abc", b"")
    assert not credentials.verify(b"a", b"bc")


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer x", "Basic !!!", "Basic " + b64encode(b"no-colon").decode(), "Basic"],
)
def test_malformed_authorization_headers_are_no_credentials(header: str | None) -> None:
    assert webconfig.Credentials.parse(header) is None


# --- real clients ----------------------------------------------------------------------------


def test_tls_and_basic_auth_with_python_ssl(tmp_path: Path, pki: Pki, agent: Any) -> None:
    web = web_file(tmp_path, {"tls_server_config": tls(pki), "basic_auth_users": {"alice": HASH}})
    process = agent(web)
    port = port_of(process)
    status, _, headers = https_get(port, "/metrics", pki.ca)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert https_get(port, "/metrics", pki.ca, "alice", "wrong")[0] == 401
    assert https_get(port, "/metrics", pki.ca, "bob", PASSWORD)[0] == 401
    status, body, _ = https_get(port, "/metrics", pki.ca, "alice", PASSWORD)
    assert status == 200 and b"clusterhealth_build_info" in body
    assert https_get(port, "/healthz", pki.ca)[0] == 401  # not exempt unless the file says so
    # Plain HTTP to the TLS port gets no metrics, and the server goes on.
    with pytest.raises((urllib.error.URLError, ConnectionError, http_client_errors())):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    assert https_get(port, "/metrics", pki.ca, "alice", PASSWORD)[0] == 200
    assert any("TLS, basic auth (1 users)" in line for line in process.lines)


def http_client_errors() -> type[Exception]:
    import http.client

    return http.client.HTTPException


def test_healthz_without_basic_auth_when_the_file_says_so(tmp_path: Path, pki: Pki, agent: Any) -> None:
    web = web_file(
        tmp_path,
        {
            "tls_server_config": tls(pki),
            "basic_auth_users": {"alice": HASH},
            "healthz_without_basic_auth": True,
        },
    )
    port = port_of(agent(web))
    status, body, _ = https_get(port, "/healthz", pki.ca)
    assert status == 200 and json.loads(body)["http"]["tls"] is True
    assert https_get(port, "/metrics", pki.ca)[0] == 401


def test_curl_with_tls_basic_auth_and_response_headers(tmp_path: Path, pki: Pki, agent: Any) -> None:
    web = web_file(
        tmp_path,
        {
            "tls_server_config": tls(pki, min_version="TLS13"),
            "basic_auth_users": {"alice": HASH},
            "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
        },
    )
    port = port_of(agent(web))
    url = f"https://127.0.0.1:{port}/metrics"
    ok = curl("--cacert", str(pki.ca), "-u", f"alice:{PASSWORD}", "-D", "-", "--compressed", url)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.endswith("200") and "x-content-type-options: nosniff" in ok.stdout.lower()
    assert curl("--cacert", str(pki.ca), "-u", "alice:wrong", url).stdout == "401"
    assert curl("--cacert", str(pki.ca), url).stdout == "401"
    assert curl("--cacert", str(pki.ca), "-I", "-u", f"alice:{PASSWORD}", url).stdout == "200"  # HEAD
    # min_version TLS13: a TLS 1.2 client is turned away.
    old = curl("--cacert", str(pki.ca), "--tls-max", "1.2", "-u", f"alice:{PASSWORD}", url)
    assert old.returncode != 0 and old.stdout == "000"
    # Without the CA, curl does not trust the server.
    assert curl("-u", f"alice:{PASSWORD}", url).returncode != 0


def test_client_certificates_required_and_checked(tmp_path: Path, pki: Pki, agent: Any) -> None:
    web = web_file(
        tmp_path,
        {
            "tls_server_config": tls(
                pki,
                client_auth_type="RequireAndVerifyClientCert",
                client_ca_file=str(pki.ca),
                client_allowed_sans=["scraper.example"],
            )
        },
    )
    process = agent(web, "--listen", "0.0.0.0:0")
    port = port_of(process)
    url = f"https://127.0.0.1:{port}/metrics"
    good = curl("--cacert", str(pki.ca), "--cert", str(pki.client_cert), "--key", str(pki.client_key), url)
    assert good.stdout == "200", good.stderr
    assert curl("--cacert", str(pki.ca), url).returncode != 0  # no certificate
    rogue = curl("--cacert", str(pki.ca), "--cert", str(pki.rogue_cert), "--key", str(pki.rogue_key), url)
    assert rogue.returncode != 0  # signed by a CA the agent does not trust
    other = curl(
        "--cacert", str(pki.ca), "--cert", str(pki.other_san_cert), "--key", str(pki.other_san_key), url
    )
    assert other.stdout != "200"  # trusted CA, but not an allowed SAN
    status, body, _ = https_get(port, "/metrics", pki.ca, cert=(pki.client_cert, pki.client_key))
    assert status == 200 and b"clusterhealth_build_info" in body
    # Verified client certificates are authentication: no warning although it listens everywhere.
    assert not any("without authentication" in line for line in process.lines)


def test_a_required_client_certificate_is_required_without_allowed_sans(
    tmp_path: Path, pki: Pki, agent: Any
) -> None:
    """RequireAndVerifyClientCert alone, no SAN list and no basic auth: the certificate is the only
    credential, so a client without one must not get in."""
    web = web_file(
        tmp_path,
        {
            "tls_server_config": tls(
                pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca)
            )
        },
    )
    port = port_of(agent(web, "--listen", "0.0.0.0:0"))
    url = f"https://127.0.0.1:{port}/metrics"
    anonymous = curl("--cacert", str(pki.ca), url)
    assert anonymous.returncode != 0 and anonymous.stdout != "200", anonymous
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        https_get(port, "/metrics", pki.ca)
    # Any certificate of the trusted CA will do when no SAN is required.
    other = curl(
        "--cacert", str(pki.ca), "--cert", str(pki.other_san_cert), "--key", str(pki.other_san_key), url
    )
    assert other.stdout == "200", other.stderr
    assert https_get(port, "/metrics", pki.ca, cert=(pki.client_cert, pki.client_key))[0] == 200


def test_verify_client_cert_if_given(tmp_path: Path, pki: Pki, agent: Any) -> None:
    web = web_file(
        tmp_path,
        {
            "tls_server_config": tls(
                pki, client_auth_type="VerifyClientCertIfGiven", client_ca_file=str(pki.ca)
            )
        },
    )
    port = port_of(agent(web))
    url = f"https://127.0.0.1:{port}/metrics"
    assert curl("--cacert", str(pki.ca), url).stdout == "200"
    assert (
        curl(
            "--cacert", str(pki.ca), "--cert", str(pki.client_cert), "--key", str(pki.client_key), url
        ).stdout
        == "200"
    )
    assert (
        curl(
            "--cacert", str(pki.ca), "--cert", str(pki.rogue_cert), "--key", str(pki.rogue_key), url
        ).returncode
        != 0
    )


def test_sighup_rereads_the_web_config_and_a_bad_one_is_refused(tmp_path: Path, pki: Pki, agent: Any) -> None:
    web = web_file(tmp_path, {"tls_server_config": tls(pki), "basic_auth_users": {"alice": HASH}})
    process = agent(web)
    port = port_of(process)
    assert https_get(port, "/metrics", pki.ca, "alice", PASSWORD)[0] == 200
    other = bcrypt.hashpw(b"n3w", bcrypt.gensalt(rounds=4)).decode()
    web_file(tmp_path, {"tls_server_config": tls(pki), "basic_auth_users": {"bob": other}})
    process.signal(signal.SIGHUP)
    process.wait_for(lambda: any("configuration reloaded" in line for line in process.lines), what="reload")
    assert https_get(port, "/metrics", pki.ca, "alice", PASSWORD)[0] == 401
    assert https_get(port, "/metrics", pki.ca, "bob", "n3w")[0] == 200

    web.write_text("tls_server_config:\n  cert_file: /nonexistent.pem\n  key_file: /nonexistent.pem\n")
    process.signal(signal.SIGHUP)
    process.wait_for(lambda: any("reload failed" in line for line in process.lines), what="the reload error")
    error = next(line for line in process.lines if "reload failed" in line)
    assert "tls_server_config.cert_file" in error
    assert https_get(port, "/metrics", pki.ca, "bob", "n3w")[0] == 200  # the running one stays
    assert process.proc.poll() is None


def test_a_user_removed_by_sighup_is_refused_on_a_connection_already_open(tmp_path: Path, agent: Any) -> None:
    web = web_file(tmp_path, {"basic_auth_users": {"alice": HASH, "bob": HASH}})
    process = agent(web)
    alice = {"Authorization": "Basic " + b64encode(f"alice:{PASSWORD}".encode()).decode()}
    bob = {"Authorization": "Basic " + b64encode(f"bob:{PASSWORD}".encode()).decode()}
    connection = http.client.HTTPConnection("127.0.0.1", port_of(process), timeout=10)
    try:
        connection.request("GET", "/metrics", headers=alice)
        response = connection.getresponse()
        assert response.status == 200
        response.read()
        kept = connection.sock
        web_file(tmp_path, {"basic_auth_users": {"bob": HASH}})
        process.signal(signal.SIGHUP)
        process.wait_for(
            lambda: any("configuration reloaded" in line for line in process.lines), what="reload"
        )
        for headers, status in ((alice, 401), (bob, 200)):
            connection.request("GET", "/metrics", headers=headers)
            response = connection.getresponse()
            response.read()
            assert response.status == status
            assert connection.sock is kept, "the keep-alive connection was closed: the test proves nothing"
    finally:
        connection.close()


def test_warning_when_listening_beyond_loopback_without_auth(tmp_path: Path, pki: Pki, agent: Any) -> None:
    everywhere = agent(None, "--listen", "0.0.0.0:0")
    warning = [line for line in everywhere.lines if "without authentication" in line]
    assert len(warning) == 1 and "level=warning" in warning[0] and "0.0.0.0" in warning[0]
    loopback = agent(None)
    assert not any("without authentication" in line for line in loopback.lines)
    tls_only = agent(web_file(tmp_path, {"tls_server_config": tls(pki)}), "--listen", "0.0.0.0:0")
    assert any("without authentication" in line for line in tls_only.lines)  # TLS alone is not auth
    authenticated = agent(
        web_file(tmp_path, {"basic_auth_users": {"alice": HASH}}, "auth.yaml"), "--listen", "0.0.0.0:0"
    )
    assert not any("without authentication" in line for line in authenticated.lines)


# --- a TLS scanner ---------------------------------------------------------------------------

# What testssl.sh rightly says of a test CA's day-old leaf, by id: it expires within 30 days
# (cert_expirationStatus, and cert_notAfter beside it), and names no CRL or OCSP responder
# (cert_revocation). Nothing else may reach MEDIUM.
TEST_CERTIFICATES_OWN = {"cert_expirationStatus", "cert_notAfter", "cert_revocation"}
SERIOUS = ("MEDIUM", "HIGH", "CRITICAL")
# testssl.sh's exit status counts its own ambiguous situations and scan errors (a handshake that
# failed on a loaded machine adds 1: `ret=$(($? + ret))` after every check), not findings; from 242
# on it says the scan itself could not run (ERR_CHILD ... ERR_BASH, `man testssl`, EXIT STATUS).
TESTSSL_FATAL = 242
# The ids the verdict below rests on; a scan that lost one of them decided nothing.
TESTSSL_REQUIRED = (
    *("SSLv2", "SSLv3", "TLS1", "TLS1_1", "TLS1_2", "TLS1_3"),
    *("cipherlist_NULL", "cipherlist_aNULL", "cipherlist_EXPORT", "cipherlist_LOW"),
    *("cipherlist_3DES_IDEA", "cipherlist_AVERAGE", "cipherlist_STRONG"),
    *("cipher_order", "cipherorder_TLSv1_2", "cert_chain_of_trust", "LUCKY13"),
    *("X-Frame-Options", "X-Content-Type-Options", "Content-Security-Policy", "HSTS"),
    *sorted(TEST_CERTIFICATES_OWN),
)
# A WARN about the scanner's own openssl (no GOST engine), not about the agent.
TESTSSL_OWN_WARNINGS = {"engine_problem"}


@dataclass
class ScannerReport:
    returncode: int
    output: str
    findings: list[dict[str, Any]]

    @property
    def by_id(self) -> dict[str, dict[str, Any]]:
        return {f["id"]: f for f in self.findings}

    @property
    def missing(self) -> list[str]:
        return [name for name in TESTSSL_REQUIRED if name not in self.by_id]

    @property
    def warnings(self) -> list[dict[str, Any]]:
        return [f for f in self.findings if f["severity"] == "WARN" and f["id"] not in TESTSSL_OWN_WARNINGS]

    def explain(self, offending: Any) -> str:
        return f"{offending}\ntestssl exit status {self.returncode}; its output begins:\n{self.output[:4000]}"


def scan_with_testssl(testssl: str, port: int, ca: Path, report: Path) -> ScannerReport:
    report.unlink(missing_ok=True)
    result = subprocess.run(
        [
            testssl,
            *("--quiet", "--color", "0", "--warnings", "off", "--nodns", "none"),
            *("--add-ca", str(ca), "--jsonfile", str(report)),
            *(
                "--protocols",
                "--std",
                "--server-preference",
                "--server-defaults",
                "--headers",
                "--vulnerable",
            ),
            f"127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode < TESTSSL_FATAL, (
        f"testssl could not scan (exit {result.returncode}):\n{output[:4000]}"
    )
    return ScannerReport(result.returncode, output, json.loads(report.read_text()))


@pytest.mark.slow  # testssl.sh's scan: about 20 s
def test_testssl_finds_nothing_serious_and_no_cbc_suite(tmp_path: Path, pki: Pki, agent: Any) -> None:
    """testssl.sh (the Debian package) against the agent with its default TLS settings and a
    certificate of a test CA it is told to trust. Its protocol, cipher-category, server-order,
    certificate, header and vulnerability checks run; its client simulation and per-cipher scans
    (informational, a minute more) do not. The JSON report is judged, not the exit status."""
    testssl = require_tool("testssl")
    port = port_of(agent(web_file(tmp_path, {"tls_server_config": tls(pki)})))
    scan = scan_with_testssl(testssl, port, pki.ca, tmp_path / "testssl.json")
    if scan.missing and scan.returncode:
        # A check that erred (a handshake lost on a loaded machine) writes no verdict; it is the
        # scanner's ambiguity, not a finding, and the second scan must then be complete.
        warnings.warn(
            f"testssl scan incomplete ({scan.missing}), scanning again: {scan.warnings}", stacklevel=1
        )
        scan = scan_with_testssl(testssl, port, pki.ca, tmp_path / "testssl-again.json")
    assert not scan.missing, scan.explain(f"ids missing from the report: {scan.missing}")
    if scan.warnings:
        warnings.warn(f"testssl WARN entries (scan ambiguities): {scan.warnings}", stacklevel=1)
    found = scan.by_id
    serious = [f for f in scan.findings if f["severity"] in SERIOUS and f["id"] not in TEST_CERTIFICATES_OWN]
    assert not serious, scan.explain(serious)
    assert found["cert_chain_of_trust"]["severity"] == "OK", scan.explain(found["cert_chain_of_trust"])
    # TLS 1.2 and 1.3 only.
    protocols = [found[p] for p in ("SSLv2", "SSLv3", "TLS1", "TLS1_1", "TLS1_2", "TLS1_3")]
    offered = [f["finding"].startswith("offered") for f in protocols]
    assert offered == [False, False, False, False, True, True], scan.explain(protocols)
    # No CBC suite: not in any category that holds one ("Obsolete CBC ciphers" is AVERAGE), only
    # AEAD suites offered, and the server's TLS 1.2 order names nothing but AEAD suites.
    categories = [
        found[f"cipherlist_{c}"] for c in ("NULL", "aNULL", "EXPORT", "LOW", "3DES_IDEA", "AVERAGE")
    ]
    offered_weak = [f for f in categories if f["finding"] != "not offered"]
    assert not offered_weak, scan.explain(offered_weak)
    assert found["cipherlist_STRONG"]["finding"] == "offered", scan.explain(found["cipherlist_STRONG"])
    tls12 = found["cipherorder_TLSv1_2"]["finding"].split()
    assert tls12 and all("-GCM-" in suite or "CHACHA20-POLY1305" in suite for suite in tls12), scan.explain(
        found["cipherorder_TLSv1_2"]
    )
    assert found["cipher_order"]["finding"] == "server", scan.explain(found["cipher_order"])
    assert found["LUCKY13"]["severity"] == "OK", scan.explain(found["LUCKY13"])
    headers = [found[h] for h in ("X-Content-Type-Options", "X-Frame-Options", "Content-Security-Policy")]
    missing_headers = [f for f in headers if f["severity"] != "OK"]
    assert not missing_headers, scan.explain(missing_headers)
    # No HSTS by default (a node's metrics port is no web site): testssl rates its absence LOW
    # (`fileout "HSTS" "LOW" "not offered"` in run_hsts), below the bar.
    if found["HSTS"]["finding"] == "not offered":
        assert found["HSTS"]["severity"] == "LOW", scan.explain(found["HSTS"])


# --- a real Prometheus -----------------------------------------------------------------------


def test_prometheus_scrapes_over_tls_with_basic_auth_and_a_client_certificate(
    tmp_path: Path, pki: Pki, agent: Any
) -> None:
    binary = require_tool("prometheus")
    web = web_file(
        tmp_path,
        {
            "tls_server_config": tls(
                pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca)
            ),
            "basic_auth_users": {"prometheus": HASH},
        },
    )
    target = f"127.0.0.1:{port_of(agent(web))}"
    tls_config = {
        "ca_file": str(pki.ca),
        "cert_file": str(pki.client_cert),
        "key_file": str(pki.client_key),
    }
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": "clusterhealth",
                "scheme": "https",
                "tls_config": tls_config,
                "basic_auth": {"username": "prometheus", "password": PASSWORD},
                "static_configs": [{"targets": [target]}],
            },
            {
                "job_name": "wrong-password",
                "scheme": "https",
                "tls_config": tls_config,
                "basic_auth": {"username": "prometheus", "password": "wrong"},
                "static_configs": [{"targets": [target]}],
            },
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    prometheus = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        targets = wait_for_targets(port, prometheus)
        good, bad = targets["clusterhealth"], targets["wrong-password"]
        assert good["health"] == "up", good
        assert bad["health"] == "down" and "401" in bad["lastError"], bad
        result = query(port, 'clusterhealth_build_info{job="clusterhealth"}')
        assert len(result) == 1 and result[0]["value"][1] == "1"
    finally:
        prometheus.terminate()
        try:
            prometheus.wait(10)
        except subprocess.TimeoutExpired:
            prometheus.kill()


GOOD_SERIES = 'clusterhealth_build_info{job="clusterhealth"}'


def api(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return json.loads(response.read())["data"]


def query(port: int, expression: str) -> list[dict[str, Any]]:
    return api(port, "/api/v1/query?query=" + urllib.request.quote(expression))["result"]  # type: ignore[no-any-return]


def wait_for_targets(port: int, prometheus: subprocess.Popen[str]) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + 60
    targets: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        if prometheus.poll() is not None:
            raise AssertionError(
                f"prometheus exited: {prometheus.stderr.read() if prometheus.stderr else ''}"
            )
        try:
            active = api(port, "/api/v1/targets")["activeTargets"]
        except (OSError, ValueError):
            time.sleep(0.5)
            continue
        targets = {t["labels"]["job"]: t for t in active}
        scraped = len(targets) == 2 and all(t["health"] != "unknown" for t in targets.values())
        if scraped and targets["clusterhealth"]["health"] == "up" and query(port, GOOD_SERIES):
            return targets
        time.sleep(0.5)
    raise AssertionError(f"targets not scraped within 60 s: {targets}")


def test_the_documented_example_is_a_web_config_this_agent_takes() -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "security.md").read_text()
    section = page.split("## Securing the endpoint", 1)[1]
    example = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    parsed = from_mapping(webconfig.WebConfigFile, example, "docs/security.md")
    users = webconfig._users(parsed.basic_auth_users, "docs/security.md")
    assert bcrypt.checkpw(b"change-me", users["prometheus"])
    assert parsed.tls_server_config is not None
    assert parsed.tls_server_config.client_auth_type == "RequireAndVerifyClientCert"
    assert parsed.healthz_without_basic_auth is True


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"basic_auth_users: {}\nbasic_auth_users: {}\n", "basic_auth_users"),  # a duplicate key
        (b"# caf\xe9\nbasic_auth_users: {}\n", "a UTF-8 text file"),
    ],
)
def test_the_web_config_is_read_like_the_config_file(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "web.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        webconfig.load(path)
    assert expected in str(caught.value)
