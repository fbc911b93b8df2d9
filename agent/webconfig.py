"""The web configuration file (`--web-config-file`): TLS and basic auth for /metrics and /healthz.

The format is the Prometheus exporter-toolkit's (the file node_exporter and dcgm-exporter take as
`--web.config.file`), so one file can serve every exporter of a node: `tls_server_config`,
`http_server_config` and `basic_auth_users` with bcrypt hashes. Relative file names are read from
the web config file's directory, as the toolkit does. What Python's ssl module cannot do is
refused with an error naming the key rather than silently ignored: `client_auth_type`
`RequestClientCert` and `RequireAnyClientCert` (a client certificate taken without verification),
and the toolkit's `rate_limit`. One key is this agent's own: `healthz_without_basic_auth`, which
lets a liveness probe read /healthz without credentials.

Defaults a TLS scanner passes (testssl.sh, tests/test_web_config.py): TLS 1.2 and 1.3 only, TLS 1.2
with AEAD suites only (Mozilla's "intermediate" set, less the DHE suites the toolkit cannot offer
either) in the server's order, and security headers on every response (`http_server_config.headers`
overrides them one by one).

The file is validated completely when it is loaded (certificates and keys loaded, hashes
checked for form), so a bad file stops the agent at start (exit 2, naming the key) and is
refused on reload (the running configuration stays).
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import os
import re
import secrets
import ssl
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

from clusterhealth.agent.settings import ConfigError, from_mapping
from clusterhealth.agent.yamlfile import read_yaml
from clusterhealth.checks.schema import setting

CLIENT_AUTH_TYPES = (
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "RequireClientCert",  # the toolkit's older name of RequireAnyClientCert
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
# Accepting a certificate without verifying it needs a verification callback, which Python's ssl
# module does not offer; refusing the value is better than verifying where the file says not to.
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

# The cipher suites Go's crypto/tls offers (tls.CipherSuites()), by their IANA names as the toolkit
# takes them, with OpenSSL's names. TLS 1.3 suites are not configurable in Go either: accepted,
# and left to OpenSSL.
CIPHER_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": "",
    "TLS_AES_256_GCM_SHA384": "",
    "TLS_CHACHA20_POLY1305_SHA256": "",
}

# Mozilla's "intermediate" TLS 1.2 suites (https://wiki.mozilla.org/Security/Server_Side_TLS), in
# its order, without the DHE ones, which Go's crypto/tls, and so the toolkit, does not offer
# either: AEAD only. OpenSSL's defaults add CBC suites, which scanners flag (LUCKY13).
DEFAULT_CIPHER_SUITES = (
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
)

# curve_preferences: the toolkit's names (Go's tls.CurveID) with OpenSSL's group names.
CURVES = {"CurveP256": "P-256", "CurveP384": "P-384", "CurveP521": "P-521", "X25519": "X25519"}

# http_server_config.headers: the names the toolkit allows, with the values it allows (None: any).
RESPONSE_HEADERS: Mapping[str, tuple[str, ...] | None] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}

# Sent on every response unless http_server_config.headers sets the same header: a scanner rates a
# response with none of them MEDIUM (testssl.sh). The pages need no script, style or frame.
# Strict-Transport-Security is left to the file: it binds every port of the host to HTTPS.
DEFAULT_HEADERS = (
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "deny"),
    ("Content-Security-Policy", "default-src 'none'"),
)

_BCRYPT_HASH = re.compile(r"\$2[abxy]?\$(?P<cost>[0-9]{2})\$[./A-Za-z0-9]{53}")


def _check_cipher_suites(value: tuple[str, ...]) -> str | None:
    unknown = [name for name in value if name not in CIPHER_SUITES]
    if unknown:
        return (
            "cipher suites by Go's tls.CipherSuites() names, "
            f"e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 (unknown: {unknown[0]})"
        )
    return None


def _check_client_auth(value: str) -> str | None:
    if value in UNVERIFIED_CLIENT_AUTH:
        return (
            "NoClientCert, VerifyClientCertIfGiven or RequireAndVerifyClientCert (this agent cannot take "
            "a client certificate without verifying it)"
        )
    return None


def _check_curves(value: tuple[str, ...]) -> str | None:
    unknown = [name for name in value if name not in CURVES]
    if unknown:
        return "curves among " + ", ".join(CURVES) + f" (unknown: {unknown[0]})"
    return None


def _check_headers(value: dict[str, str]) -> str | None:
    for name, text in value.items():
        if name not in RESPONSE_HEADERS:
            return "headers among " + ", ".join(RESPONSE_HEADERS) + f" (got {name})"
        allowed = RESPONSE_HEADERS[name]
        if allowed is not None and text.lower() not in allowed:
            return f"{name} one of " + ", ".join(allowed)
        if "\r" in text or "\n" in text:
            return f"{name} on one line"
    return None


@dataclass(frozen=True)
class TlsServerConfig:
    cert_file: str | None = setting(None, doc="the server's certificate (PEM), with its chain")
    key_file: str | None = setting(None, doc="the server's private key (PEM)")
    cert: str | None = setting(None, doc="or the certificate itself, inline (PEM)")
    key: str | None = setting(None, doc="or the key itself, inline (PEM)")
    client_ca_file: str | None = setting(
        None, doc="CA certificates (PEM) that client certificates must chain to"
    )
    client_ca: str | None = setting(None, doc="or those CA certificates inline (PEM)")
    client_auth_type: str = setting(
        "NoClientCert",
        doc="NoClientCert, VerifyClientCertIfGiven or RequireAndVerifyClientCert (client certificates)",
        choices=CLIENT_AUTH_TYPES,
        check=_check_client_auth,
    )
    client_allowed_sans: tuple[str, ...] = setting(
        (),
        doc="a client certificate must carry one of these Subject Alternative Names (DNS, IP, e-mail, URI)",
    )
    min_version: str = setting("TLS12", doc="lowest TLS version accepted", choices=tuple(TLS_VERSIONS))
    max_version: str = setting("TLS13", doc="highest TLS version accepted", choices=tuple(TLS_VERSIONS))
    cipher_suites: tuple[str, ...] = setting(
        (),
        doc="TLS 1.2 cipher suites by Go's names (empty: Mozilla's intermediate AEAD suites)",
        check=_check_cipher_suites,
    )
    prefer_server_cipher_suites: bool = setting(True, doc="the server's order of cipher_suites wins")
    curve_preferences: tuple[str, ...] = setting(
        (),
        doc="key-exchange curves in order, among " + ", ".join(CURVES) + " (empty: OpenSSL's)",
        check=_check_curves,
    )


@dataclass(frozen=True)
class HttpServerConfig:
    http2: bool = setting(True, doc="accepted for compatibility; the agent speaks HTTP/1.1")
    headers: dict[str, str] = setting(
        default_factory=dict, doc="headers added to every response (the toolkit's five)", check=_check_headers
    )


@dataclass(frozen=True)
class WebConfigFile:
    tls_server_config: TlsServerConfig | None = setting(None, doc="serve HTTPS")
    http_server_config: HttpServerConfig = setting(default_factory=HttpServerConfig, doc="HTTP settings")
    basic_auth_users: dict[str, str] = setting(
        default_factory=dict, doc="user name: bcrypt hash of the password; empty: no basic auth"
    )
    healthz_without_basic_auth: bool = setting(
        False, doc="this agent's own key: /healthz answers without credentials (TLS settings still apply)"
    )


class ConnectionRefused(Exception):
    """A TLS client whose certificate carries none of client_allowed_sans."""


@dataclass(frozen=True)
class WebConfig:
    """A loaded, validated web configuration, as the HTTP server applies it."""

    source: str | None = None
    ssl_context: ssl.SSLContext | None = None
    client_auth_type: str = "NoClientCert"
    allowed_sans: frozenset[str] = frozenset()
    users: Mapping[str, bytes] = field(default_factory=dict)
    healthz_without_basic_auth: bool = False
    headers: tuple[tuple[str, str], ...] = DEFAULT_HEADERS
    credentials: Credentials | None = None

    @property
    def tls(self) -> bool:
        return self.ssl_context is not None

    @property
    def authenticates(self) -> bool:
        """Whether a client must prove who it is: basic auth, or a verified client certificate."""
        return bool(self.users) or self.client_auth_type == "RequireAndVerifyClientCert"

    def needs_basic_auth(self, path: str) -> bool:
        return bool(self.users) and not (self.healthz_without_basic_auth and path == "/healthz")

    def check_peer(self, ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> None:
        """Raise ConnectionRefused unless the verified client certificate names an allowed SAN."""
        if not self.allowed_sans:
            return
        cert = ssl_object.getpeercert() if ssl_object is not None else None
        sans: Any = (cert or {}).get("subjectAltName", ())
        names = {str(entry[1]) for entry in sans}
        names |= {_normal_ip(name) for name in names}
        if not names & self.allowed_sans:
            raise ConnectionRefused(
                f"no allowed Subject Alternative Name in the client certificate: {sorted(names)}"
            )


def _normal_ip(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        return text


NO_WEB_CONFIG = WebConfig()


def load(path: str | Path | None) -> WebConfig:
    """Read and validate a web config file; None: plain HTTP without authentication."""
    if path is None:
        return NO_WEB_CONFIG
    source = str(path)
    # The config file's reader: UTF-8 only, duplicate keys, alias bombs and deep nesting refused.
    data = read_yaml(path, source)
    if data is None:
        data = {}
    if isinstance(data, dict) and "rate_limit" in data:
        raise ConfigError(source, "rate_limit", "no rate_limit (not supported by this agent)")
    parsed = from_mapping(WebConfigFile, data, source)
    base = Path(path).resolve().parent
    users = _users(parsed.basic_auth_users, source)
    tls = parsed.tls_server_config
    return WebConfig(
        source=source,
        ssl_context=_ssl_context(tls, base, source) if tls is not None else None,
        client_auth_type=tls.client_auth_type if tls is not None else "NoClientCert",
        allowed_sans=frozenset(_normal_ip(san) for san in tls.client_allowed_sans) if tls else frozenset(),
        users=users,
        healthz_without_basic_auth=parsed.healthz_without_basic_auth,
        headers=_headers(parsed.http_server_config.headers),
        credentials=Credentials(users) if users else None,
    )


def _headers(configured: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The default headers, each replaced by the file's value of the same name, then the file's others."""
    merged = dict(DEFAULT_HEADERS)
    merged.update(configured)
    return tuple(merged.items())


def _users(users: Mapping[str, str], source: str) -> dict[str, bytes]:
    checked = {}
    for user, hashed in users.items():
        key = f"basic_auth_users.{user}"
        # The value is never echoed: a plaintext password put there by mistake must not reach a log.
        if not user or ":" in user:
            raise ConfigError(
                source, key, "a user name without ':' (basic auth splits user and password at it)"
            )
        if not _BCRYPT_HASH.fullmatch(hashed):
            raise ConfigError(
                source, key, "a bcrypt hash such as $2y$10$... (htpasswd -nBC 10 '' | tr -d ':\\n')"
            )
        checked[user] = hashed.encode()
    return checked


def _ssl_context(tls: TlsServerConfig, base: Path, source: str) -> ssl.SSLContext:
    prefix = "tls_server_config"
    if not (tls.cert_file or tls.cert):
        raise ConfigError(source, f"{prefix}.cert_file", "a certificate: cert_file or cert")
    if not (tls.key_file or tls.key):
        raise ConfigError(source, f"{prefix}.key_file", "a private key: key_file or key")
    if tls.cert_file and tls.cert:
        raise ConfigError(source, f"{prefix}.cert", "one of cert_file and cert, not both")
    if tls.key_file and tls.key:
        raise ConfigError(source, f"{prefix}.key", "one of key_file and key, not both")
    if TLS_VERSIONS[tls.min_version] > TLS_VERSIONS[tls.max_version]:
        raise ConfigError(
            source, f"{prefix}.min_version", f"a version no higher than max_version ({tls.max_version})"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    context.maximum_version = TLS_VERSIONS[tls.max_version]
    _load_key_pair(context, tls, base, source)

    has_ca = bool(tls.client_ca_file or tls.client_ca)
    if tls.client_auth_type == "NoClientCert":
        if has_ca:
            raise ConfigError(
                source,
                f"{prefix}.client_auth_type",
                "VerifyClientCertIfGiven or RequireAndVerifyClientCert when a client CA is given",
                tls.client_auth_type,
            )
        context.verify_mode = ssl.CERT_NONE
    else:
        if not has_ca:
            raise ConfigError(
                source, f"{prefix}.client_ca_file", f"the CA file {tls.client_auth_type} verifies with"
            )
        context.verify_mode = (
            ssl.CERT_REQUIRED if tls.client_auth_type == "RequireAndVerifyClientCert" else ssl.CERT_OPTIONAL
        )
        try:
            if tls.client_ca_file:
                context.load_verify_locations(cafile=str(base / tls.client_ca_file))
            else:
                context.load_verify_locations(cadata=tls.client_ca)
        except (OSError, ssl.SSLError, ValueError) as err:
            key = f"{prefix}.client_ca_file" if tls.client_ca_file else f"{prefix}.client_ca"
            raise ConfigError(source, key, "readable PEM CA certificates", _reason(err)) from err
    if tls.client_allowed_sans and tls.client_auth_type != "RequireAndVerifyClientCert":
        raise ConfigError(
            source,
            f"{prefix}.client_allowed_sans",
            "client_auth_type RequireAndVerifyClientCert to check SANs against",
        )
    # TLS 1.3 suites are OpenSSL's (all AEAD); a list that names only those leaves TLS 1.2 the defaults.
    ciphers = [CIPHER_SUITES[name] for name in tls.cipher_suites if CIPHER_SUITES[name]]
    try:
        context.set_ciphers(":".join(ciphers or (CIPHER_SUITES[name] for name in DEFAULT_CIPHER_SUITES)))
    except ssl.SSLError as err:
        raise ConfigError(
            source, f"{prefix}.cipher_suites", "suites this OpenSSL offers", _reason(err)
        ) from err
    if tls.curve_preferences:
        from clusterhealth.agent.sslgroups import set_groups  # ctypes, only for the files that ask

        try:
            set_groups(context, [CURVES[name] for name in tls.curve_preferences])
        except (OSError, ValueError) as err:
            raise ConfigError(
                source, f"{prefix}.curve_preferences", "curves this OpenSSL offers", str(err)
            ) from err
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    return context


def _load_key_pair(context: ssl.SSLContext, tls: TlsServerConfig, base: Path, source: str) -> None:
    prefix = "tls_server_config"
    cert_key = f"{prefix}.cert_file" if tls.cert_file else f"{prefix}.cert"
    key_key = f"{prefix}.key_file" if tls.key_file else f"{prefix}.key"
    for key, name in ((cert_key, tls.cert_file), (key_key, tls.key_file)):
        if name:
            try:
                (base / name).read_bytes()
            except OSError as err:
                raise ConfigError(source, key, "a readable file", f"{base / name}: {err.strerror}") from err
    with tempfile.TemporaryDirectory(prefix="clusterhealth-tls-") as tmp:
        # load_cert_chain reads files only: inline PEM goes through a private temporary file.
        cert_path = str(base / tls.cert_file) if tls.cert_file else _private_file(tmp, "cert.pem", tls.cert)
        key_path = str(base / tls.key_file) if tls.key_file else _private_file(tmp, "key.pem", tls.key)
        try:
            context.load_cert_chain(cert_path, key_path)
        except ssl.SSLError as err:
            raise ConfigError(
                source,
                f"{cert_key} and {key_key}",
                "a PEM certificate and the private key that matches it",
                _reason(err),
            ) from err


def _private_file(directory: str, name: str, text: str | None) -> str:
    path = os.path.join(directory, name)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text or "")
    return path


def _reason(err: Exception) -> str:
    return str(getattr(err, "reason", None) or getattr(err, "strerror", None) or err)


class Credentials:
    """Checks basic-auth credentials against bcrypt hashes, paying bcrypt once per good password.

    bcrypt is slow on purpose (about 0.1 s at cost 10 on this class of machine); a Prometheus
    scraping every 15 s would pay it on every scrape. So a credential that verified is
    remembered, and why that is safe:
    - what is kept is an HMAC-SHA256 of "user:password" under a random key made for this object,
      never the password; the key lives only in memory and dies with the configuration, so what is
      kept cannot be checked against guesses offline without reading this process's memory (which
      also holds the passwords of requests in flight);
    - only successes are kept, so every wrong guess still pays bcrypt, and guesses are verified one
      at a time (`checking` serializes bcrypt), so an attacker keeps at most one core busy while
      scrapers whose credentials were verified are answered from memory;
    - it belongs to one loaded configuration: a reload, or a changed hash, starts with an empty
      cache; it holds at most `limit` entries;
    - a request for an unknown user runs bcrypt against a hash of the same cost, so the answer's
      time does not tell which users exist; user names are compared in constant time.
    """

    def __init__(self, users: Mapping[str, bytes], limit: int = 64) -> None:
        self._users = dict(users)
        self._key = secrets.token_bytes(32)
        self._verified: OrderedDict[bytes, None] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()  # guards _verified
        self.checking = threading.Lock()  # one bcrypt at a time
        cost = min(int(_BCRYPT_HASH.fullmatch(h.decode())["cost"]) for h in self._users.values())  # type: ignore[index]
        import bcrypt  # only where basic auth is configured

        self._decoy = bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(rounds=max(4, min(cost, 31))))

    @staticmethod
    def parse(header: str | None) -> tuple[bytes, bytes] | None:
        """(user, password) of an `Authorization: Basic ...` header; None when there is none."""
        if not header:
            return None
        scheme, _, encoded = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True)
        except ValueError:
            return None
        user, colon, password = decoded.partition(b":")
        return (user, password) if colon else None

    def _tag(self, user: bytes, password: bytes) -> bytes:
        return hmac.new(self._key, user + b":" + password, sha256).digest()

    def known(self, user: bytes, password: bytes) -> bool:
        """True when these credentials verified before: no bcrypt needed."""
        with self._lock:
            return self._tag(user, password) in self._verified

    def verify(self, user: bytes, password: bytes) -> bool:
        """bcrypt against the user's hash (blocking: run it off the event loop)."""
        tag = self._tag(user, password)
        hashed = self._decoy
        found = False
        for name, candidate in self._users.items():
            if hmac.compare_digest(name.encode(), user):
                hashed, found = candidate, True
        import bcrypt

        with self.checking:
            try:
                good = bcrypt.checkpw(password, hashed) and found
            except ValueError:
                good = False
        if good:
            with self._lock:
                self._verified[tag] = None
                self._verified.move_to_end(tag)
                while len(self._verified) > self._limit:
                    self._verified.popitem(last=False)
        return good
