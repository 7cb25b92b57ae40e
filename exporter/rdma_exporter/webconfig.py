"""`--web.config.file`: TLS, mutual TLS and basic auth in the Prometheus exporter-toolkit format.

The same file works for node_exporter and rdma-exporter on one node:

    tls_server_config:
      cert_file: server.crt            # paths are relative to this file
      key_file: server.key
      min_version: TLS12               # TLS10 .. TLS13
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
    basic_auth_users:
      prometheus: $2b$12$...           # bcrypt hash (htpasswd -nBC 12 "" | tr -d ':\\n')

Anything this exporter cannot honour exactly (a cipher suite list, a client certificate that is requested
but not verified) is refused rather than ignored, because a security setting that silently does nothing
is worse than a start-up error. One exception, said in a warning instead: a min_version of TLS10 or TLS11
that this system's OpenSSL will not serve (OpenSSL 3 refuses them at its default security level). It
only allows older clients, so serving less than it allows is never less safe, and a file shared with
node_exporter that has it keeps working for every client that speaks TLS 1.2.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import ssl
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import bcrypt

from .config import ConfigError, ConfigUnavailable, check_bool, file_error, read_yaml_file, require_kind

log = logging.getLogger(__name__)

TLS_VERSIONS: Final = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_NAMES: Final = {version: name for name, version in TLS_VERSIONS.items()}
# exporter-toolkit names -> verify mode. RequestClientCert and RequireAnyClientCert ask for a certificate
# without verifying it, which OpenSSL through Python's ssl cannot do: refused, see the module doc.
CLIENT_AUTH: Final = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_UNSUPPORTED_AUTH: Final = ("RequestClientCert", "RequireAnyClientCert")
_TLS_KEYS: Final = frozenset(
    {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version", "client_allowed_sans"}
)
_REFUSED_TLS_KEYS: Final = {
    "cipher_suites": "cipher suites are OpenSSL's defaults here; remove the key (or use min_version: TLS13)",
    "curve_preferences": "curves are OpenSSL's defaults here; remove the key",
    "prefer_server_cipher_suites": "not configurable here; remove the key",
    "cert": "inline certificates are not supported; use cert_file",
    "key": "inline keys are not supported; use key_file",
    "client_ca": "inline CAs are not supported; use client_ca_file",
}
_HTTP_KEYS: Final = frozenset({"http2", "headers"})
_TOP_KEYS: Final = frozenset({"tls_server_config", "http_server_config", "basic_auth_users"})
# The headers exporter-toolkit lets a web config set (web/handler.go), with the values it allows where it
# limits them. node_exporter refuses any other name or value, and one file serves both on a node.
TOOLKIT_HEADERS: Final[dict[str, tuple[str, ...]]] = {
    "Content-Security-Policy": (),
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
}
# RFC 9110 5.5 field-value: visible ASCII, space and tab, and obs-text (0x80-0xFF, what Latin-1 encodes).
_FIELD_VALUE: Final = re.compile(r"[\t\x20-\x7e\x80-\xff]*\Z")
# \Z: no final newline. [0-9], not \d: the cost of a hash with other scripts' digits is no int() (review).
_BCRYPT_HASH: Final = re.compile(r"^\$2[aby]\$[0-9][0-9]\$[./A-Za-z0-9]{53}\Z")
_BCRYPT_COSTS: Final = range(4, 32)  # what bcrypt (here and in Go) can check; other costs never match
_BCRYPT_ADVISED: Final = range(10, 15)  # costs accepted without a warning: about 0.07 to 1 s a check
# Checked for unknown users too, so response time does not reveal which user names exist. Only its salt
# and digest are used: BasicAuth puts the configured cost in front (a well-formed hash, matching nothing).
_DUMMY_HASH: Final = b"$2b$10$BBbAEHokxkprkXcs7WUUru5P5E2RDe7zZ9AZPgszTXaqI0AjY5KpS"
# getpeercert()'s names for the SAN kinds exporter-toolkit matches: DNSNames, EmailAddresses, IPAddresses, URIs.
_SAN_KINDS: Final = frozenset({"DNS", "email", "IP Address", "URI"})
# Since the last use: the stored hash is in each key, so a remembered login never outlives its user's hash.
AUTH_CACHE_SECONDS: Final = 300.0
_AUTH_CACHE_SIZE: Final = 64


@dataclass
class BasicAuth:
    """bcrypt-checked users. A successful check is remembered while it is in use: bcrypt costs ~0.1-0.3 s
    of CPU, and Prometheus sends the same credentials on every scrape."""

    users: dict[str, bytes]
    dummy_hash: bytes = field(init=False)
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    _cache: OrderedDict[bytes, float] = field(default_factory=OrderedDict)  # key -> when it is forgotten
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # One bcrypt check at a time, as exporter-toolkit does: bcrypt releases the GIL, so without it anyone
    # who reaches the port could keep every HTTP worker hashing wrong passwords on a core of its own.
    _bcrypt_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        # As costly as the costliest real hash: a cheaper dummy (the docs recommend cost 12) would answer
        # unknown users several times faster than known ones.
        cost = max((_bcrypt_cost(hashed) for hashed in self.users.values()), default=10)
        self.dummy_hash = _with_cost(_DUMMY_HASH, cost)

    def remember_from(self, previous: BasicAuth) -> None:
        """Keep the logins `previous` remembers (on reload): a user whose hash is unchanged logs in without
        bcrypt. Safe for changed or removed users: the stored hash is part of each key, so their entries
        never match again."""
        with previous._lock:
            self._key = previous._key
            self._cache = OrderedDict(previous._cache)

    def _cache_key(self, header: str | None) -> tuple[bytes, str, bytes | None] | None:
        """(cache key, password, stored hash) of a well-formed Basic header; None for anything else."""
        if not header:
            return None
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, sep, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
        except ValueError:  # not base64 (binascii.Error), not UTF-8, or not ASCII to begin with
            return None
        if not sep:
            return None
        # The cache key is a keyed hash, so memory never holds a password.
        stored = self.users.get(user)
        token = hmac.new(self._key, b"\0".join([user.encode(), password.encode(), stored or b""]), hashlib.sha256)
        return token.digest(), password, stored

    def _remembered(self, key: bytes) -> bool:
        now = time.monotonic()
        with self._lock:
            expires = self._cache.get(key)
            if expires is None or expires <= now:
                return False
            # Sliding: a client that keeps logging in stays remembered, so Prometheus never has to wait
            # for a bcrypt check behind a flood of wrong passwords (HttpServer's costly lane).
            self._cache[key] = now + AUTH_CACHE_SECONDS
            self._cache.move_to_end(key)
            return True

    def needs_bcrypt(self, header: str | None) -> bool:
        """Whether checking `header` costs a bcrypt hash: well-formed and not remembered. Cheap (one HMAC)."""
        found = self._cache_key(header)
        return found is not None and not self._remembered(found[0])

    def check(self, header: str | None) -> bool:
        found = self._cache_key(header)
        if found is None:
            return False
        key, password, stored = found
        if self._remembered(key):
            return True
        secret = password.encode()
        if len(secret) > _BCRYPT_MAX_PASSWORD:
            # bcrypt 5 refuses such a password itself; bcrypt 4, which pyproject allows, would check its
            # first 72 bytes only, so that any suffix logged in. Refused here, whichever is installed.
            return False
        try:
            with self._bcrypt_lock:
                ok = bcrypt.checkpw(secret, stored or self.dummy_hash) and stored is not None
        except ValueError:  # any other password bcrypt refuses: a 401, not an error
            return False
        if ok:
            with self._lock:
                self._cache[key] = time.monotonic() + AUTH_CACHE_SECONDS
                self._cache.move_to_end(key)
                while len(self._cache) > _AUTH_CACHE_SIZE:
                    self._cache.popitem(last=False)
        return ok


# A file's identity and version: device, inode, mtime, ctime and size, through symlinks; None if it cannot
# be stat'ed. A Secret volume's update swaps a symlink, which changes the inode behind the same path; a
# chmod or chown after a `mv` (a key first unreadable to the exporter) changes only the ctime.
FileState = tuple[int, int, int, int, int] | None
LoadedFiles = tuple[tuple[Path, FileState], ...]  # files, each with its state when it was read


def file_state(path: Path) -> FileState:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size


@dataclass
class WebConfig:
    """What the server needs: an SSL context (None: plain HTTP), users, extra response headers."""

    ssl_context: ssl.SSLContext | None = None
    auth: BasicAuth | None = None
    headers: dict[str, str] = field(default_factory=dict)
    allowed_sans: frozenset[str] = frozenset()
    source: str = ""
    empty: bool = False  # the file held no document (empty, or only comments): see Daemon._reload
    tls_files: LoadedFiles = ()  # certificate, key and client CA files, each with its state when loaded
    tls_settings: tuple[str, str] = ("", "")  # the tls_server_config section as written, and its base
    # The web config file itself, with its state before it was read: exporter-toolkit reads the file
    # again for every request, so an edit (a user removed, a hash rotated) takes effect without a signal.
    file: LoadedFiles = ()

    def same_tls(self, other: WebConfig) -> bool:
        """Whether `other` was loaded from the same TLS settings and files, unchanged in between: its SSL
        context can serve for this one."""
        return self.tls_settings == other.tls_settings and self.tls_files == other.tls_files

    @property
    def watched_files(self) -> LoadedFiles:
        """The web config file and the TLS files it names, each with its state when loaded."""
        return self.file + self.tls_files

    def watched_file_states(self) -> tuple[FileState, ...]:
        """The watched files' states now, in the order of `watched_files`."""
        return tuple(file_state(path) for path, _ in self.watched_files)

    def watched_files_changed(self, states: tuple[FileState, ...] | None = None) -> tuple[Path, ...]:
        """The watched files that are not what was loaded: edited, replaced (cert-manager, kubelet's swap
        of a Secret volume) or removed. `states`: from `watched_file_states`, if the caller has them."""
        now = self.watched_file_states() if states is None else states
        return tuple(path for (path, loaded), state in zip(self.watched_files, now, strict=True) if state != loaded)

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    def describe(self) -> str:
        parts = [self.scheme.upper()]
        if self.ssl_context is not None and self.ssl_context.verify_mode == ssl.CERT_REQUIRED:
            parts.append("client certificates required")
        if self.auth is not None:
            parts.append(f"basic auth ({len(self.auth.users)} users)")
        return ", ".join(parts)

    def protections(self) -> frozenset[str]:
        """What it asks of clients, by name: a reload that drops one of them is worth a warning."""
        kept = set()
        if self.ssl_context is not None:
            kept.add("TLS")
            if self.ssl_context.verify_mode == ssl.CERT_REQUIRED:
                kept.add("client certificates")
        if self.allowed_sans:
            kept.add("client_allowed_sans")
        if self.auth is not None:
            kept.add("basic auth")
        return frozenset(kept)

    def peer_allowed(self, peer_cert: Mapping[str, Any] | None) -> bool:
        """client_allowed_sans: a verified client certificate must name one of them."""
        if not self.allowed_sans:
            return True
        if not peer_cert:
            return False
        names = {
            _ip_text(value) if kind == "IP Address" else value
            for kind, value in peer_cert.get("subjectAltName", ())
            if kind in _SAN_KINDS
        }
        return bool(names & self.allowed_sans)


def _ip_text(value: str) -> str:
    """An IP in Go's net.IP.String() form, which exporter-toolkit matches client_allowed_sans against:
    getpeercert() writes IPv6 uncompressed and upper case (2001:DB8:0:0:0:0:0:1 for 2001:db8::1)."""
    try:
        ip = ipaddress.ip_address(value.strip())
    except ValueError:
        return value
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)  # Go writes v4-mapped addresses dotted
    return ip.compressed


def _with_cost(hashed: bytes, cost: int) -> bytes:
    """`$2b$NN$salt+digest` with its cost NN replaced: the salt and digest are checked as they are."""
    return hashed[:4] + b"%02d" % cost + hashed[6:]


_BCRYPT_MAX_PASSWORD: Final = 72  # bytes: bcrypt reads no further


def _bcrypt_cost(hashed: bytes) -> int:
    return int(hashed.split(b"$")[2])  # $2b$12$...: the cost is the number after the second $


def _mapping(
    source: str, key: str, value: Any, known: frozenset[str], refused: Mapping[str, str] | None = None
) -> Mapping[str, Any]:
    """A section: absent is empty, anything but a mapping is refused (`tls_server_config: []` must not
    pass for "no TLS"), and so is a key in `refused` (with its reason) or not in `known`."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(source, key or "(top level)", f"expected a mapping, got {type(value).__name__}")
    for sub, reason in (refused or {}).items():
        if sub in value:
            raise ConfigError(source, f"{key}.{sub}", reason)
    for sub in value:
        if sub not in known:
            where = f"{key}.{sub}" if key else str(sub)
            raise ConfigError(source, where, f"unknown key (known: {', '.join(sorted(known))})")
    return value


def _file(source: str, key: str, value: Any, base: Path) -> Path:
    if not isinstance(value, str) or not value or "\0" in value:  # no path holds a NUL: it can never appear
        raise ConfigError(source, key, f"expected a file path, got {value!r}")
    path = Path(value) if Path(value).is_absolute() else base / value
    require_kind(source, key, path, directory=False)
    return path


def _version(source: str, key: str, value: Any) -> ssl.TLSVersion:
    # Strings only: `in` hashes the value, and a list (`min_version: [TLS13]`) would raise a TypeError.
    if not isinstance(value, str) or value not in TLS_VERSIONS:
        raise ConfigError(source, key, f"expected one of {', '.join(TLS_VERSIONS)}, got {value!r}")
    return TLS_VERSIONS[value]


def _serves(context: ssl.SSLContext, version: ssl.TLSVersion) -> bool:
    """Whether `context` (its certificate loaded, before any client authentication) completes a handshake
    at `version` with a client that allows anything: OpenSSL's security level and the system's crypto
    policy can refuse TLS 1.0 and 1.1 whatever minimum_version says."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TLSVersion.TLSv1 and TLSv1_1 are deprecated
            client.minimum_version = client.maximum_version = version
        client.set_ciphers("ALL:@SECLEVEL=0")  # the server's policy is the one asked about, not the probe's
    except (ValueError, ssl.SSLError):  # an OpenSSL built without the version at all
        return False
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    ends = [
        client.wrap_bio(to_client, to_server),
        context.wrap_bio(to_server, to_client, server_side=True),
    ]
    done = [False, False]
    for _ in range(8):  # a TLS 1.0 to 1.2 handshake is two round trips
        for i, end in enumerate(ends):
            if not done[i]:
                try:
                    end.do_handshake()
                    done[i] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError:
                    return False
        if all(done):
            return True
    return False


def _pem_problem(cert: Path, key: Path) -> tuple[str, str, bool] | None:
    """(setting, reason, empty) for a certificate and key that OpenSSL refused, where their content tells
    why: its own reason is often only "[SSL] PEM lib", for an empty file, a DER file or the two swapped."""
    texts = []
    for path in (cert, key):
        try:
            texts.append(path.read_bytes()[: 1 << 20])
        except OSError:
            return None
    cert_text, key_text = texts
    if not cert_text.strip():
        return "cert_file", f"{cert} is empty", True
    if not key_text.strip():
        return "key_file", f"{key} is empty", True
    swapped = "(cert_file and key_file swapped?)"
    if b"-----BEGIN CERTIFICATE-----" not in cert_text:
        if b"PRIVATE KEY-----" in cert_text:
            return "cert_file", f"{cert} holds a private key, not a certificate {swapped}", False
        return "cert_file", f"{cert} holds no PEM certificate (DER? `openssl x509 -inform der` converts it)", False
    if b"PRIVATE KEY-----" not in key_text:
        if b"-----BEGIN CERTIFICATE-----" in key_text:
            return "key_file", f"{key} holds a certificate, not a private key {swapped}", False
        return "key_file", f"{key} holds no PEM private key (DER? `openssl pkey -inform der` converts it)", False
    return None


class _EncryptedKey(Exception):
    """The key file asked for a passphrase (_no_passphrase)."""


def _no_passphrase() -> bytes:
    raise _EncryptedKey


def _tls(source: str, section: Any, base: Path) -> tuple[ssl.SSLContext | None, frozenset[str], LoadedFiles]:
    """The SSL context, the allowed SANs, and the files loaded with what they were before loading."""
    body = _mapping(source, "tls_server_config", section, _TLS_KEYS, _REFUSED_TLS_KEYS)
    if not body:
        return None, frozenset(), ()
    if "cert_file" not in body or "key_file" not in body:
        raise ConfigError(source, "tls_server_config", "cert_file and key_file are both required for TLS")
    cert = _file(source, "tls_server_config.cert_file", body["cert_file"], base)
    key_file = _file(source, "tls_server_config.key_file", body["key_file"], base)
    # Taken before they are loaded: a file replaced meanwhile shows as changed at the next check.
    files = [(cert, file_state(cert)), (key_file, file_state(key_file))]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # No session tickets: OpenSSL encrypts them with a key made once per context, kept for the life of
    # the process, so one memory dump would unlock every resumed session since start-up (Go rotates its
    # keys daily). Prometheus keeps its connection open between scrapes and does not resume sessions.
    context.options |= ssl.OP_NO_TICKET  # TLS 1.2
    context.num_tickets = 0  # TLS 1.3
    context.minimum_version = _version(source, "tls_server_config.min_version", body.get("min_version", "TLS12"))
    if "max_version" in body:
        context.maximum_version = _version(source, "tls_server_config.max_version", body["max_version"])
        if context.maximum_version < context.minimum_version:
            raise ConfigError(source, "tls_server_config.max_version", "is lower than min_version")
    try:
        # Without a password callback OpenSSL prompts for an encrypted key's passphrase on the terminal:
        # start-up (or a reload) waits there for ever with stdin open, and fails with a bare EINVAL without.
        context.load_cert_chain(cert, key_file, password=_no_passphrase)
    except _EncryptedKey:
        raise ConfigError(
            source,
            "tls_server_config.key_file",
            f"{key_file} is encrypted and there is no way to give its passphrase; store the key unencrypted "
            "(`openssl pkey -in KEY -out KEY.plain`) and restrict who may read it (LoadCredential= under systemd)",
        ) from None
    except ssl.SSLError as exc:  # the content: not PEM, a key that does not match the certificate
        problem = _pem_problem(cert, key_file)
        if problem is None:
            raise ConfigError(source, "tls_server_config", f"cannot load {cert} with {key_file}: {exc}") from None
        key, reason, empty = problem
        # An empty file is most often one being written (a renewal): worth a restart, as a missing one is.
        raise (ConfigUnavailable if empty else ConfigError)(source, f"tls_server_config.{key}", reason) from None
    except OSError as exc:  # not readable (yet), as a key whose permissions are still being set
        raise file_error(exc)(source, "tls_server_config", f"cannot load {cert} with {key_file}: {exc}") from None
    lowest = context.minimum_version
    if lowest < ssl.TLSVersion.TLSv1_2 and not _serves(context, lowest):
        served = ssl.TLSVersion.TLSv1_1
        if lowest == ssl.TLSVersion.TLSv1_1 or not _serves(context, served):
            served = ssl.TLSVersion.TLSv1_2
        log.warning(
            "%s: tls_server_config.min_version %s is not served: %s refuses older TLS versions here (its "
            "security level or the system's crypto policy); the lowest version served is %s",
            source, _NAMES[lowest], ssl.OPENSSL_VERSION, _NAMES[served],
        )
    # Empty or null is NoClientCert, as exporter-toolkit reads it (a Go string left ""): one file for both.
    auth_type = body.get("client_auth_type")
    if auth_type is None or auth_type == "":
        auth_type = "NoClientCert"
    if auth_type in _UNSUPPORTED_AUTH:
        raise ConfigError(
            source,
            "tls_server_config.client_auth_type",
            f"{auth_type} accepts unverified client certificates, which is not supported; "
            "use RequireAndVerifyClientCert or VerifyClientCertIfGiven with client_ca_file",
        )
    if not isinstance(auth_type, str) or auth_type not in CLIENT_AUTH:  # a list is unhashable: TypeError
        raise ConfigError(
            source, "tls_server_config.client_auth_type", f"expected one of {', '.join(CLIENT_AUTH)}, got {auth_type!r}"
        )
    ca = body.get("client_ca_file")
    if CLIENT_AUTH[auth_type] != ssl.CERT_NONE:
        if ca is None:
            raise ConfigError(source, "tls_server_config.client_ca_file", f"required with client_auth_type {auth_type}")
        ca_path = _file(source, "tls_server_config.client_ca_file", ca, base)
        files.append((ca_path, file_state(ca_path)))
        try:
            context.load_verify_locations(cafile=ca_path)
        except ssl.SSLError as exc:
            raise ConfigError(source, "tls_server_config.client_ca_file", f"cannot load {ca_path}: {exc}") from None
        except OSError as exc:
            reason = f"cannot load {ca_path}: {exc}"
            raise file_error(exc)(source, "tls_server_config.client_ca_file", reason) from None
        context.verify_mode = CLIENT_AUTH[auth_type]
    elif ca is not None:
        reason = "set, but client_auth_type is NoClientCert: no client would be checked"
        raise ConfigError(source, "tls_server_config.client_ca_file", reason)
    sans = body.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(s, str) and s for s in sans):
        raise ConfigError(source, "tls_server_config.client_allowed_sans", "expected a list of names")
    if sans and context.verify_mode == ssl.CERT_NONE:
        raise ConfigError(source, "tls_server_config.client_allowed_sans", "needs verified client certificates")
    # An IP written any other way (upper case, uncompressed) still names the same address.
    return context, frozenset(sans) | {_ip_text(s) for s in sans}, tuple(files)


def _users(source: str, body: Any, stop: threading.Event | None = None) -> BasicAuth | None:
    if body is None or (isinstance(body, Mapping) and not body):
        return None  # `basic_auth_users: {}` too: exporter-toolkit reads no users as no authentication
    if not isinstance(body, Mapping):
        raise ConfigError(source, "basic_auth_users", "expected a mapping of user name to bcrypt hash")
    users: dict[str, bytes] = {}
    for user, hashed in body.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise ConfigError(source, f"basic_auth_users.{user}", "user names are non-empty strings without ':'")
        if not isinstance(hashed, str) or not _BCRYPT_HASH.match(hashed):
            raise ConfigError(
                source, f"basic_auth_users.{user}", "expected a bcrypt hash ($2y$/$2b$/$2a$, 60 characters)"
            )
        if _bcrypt_cost(hashed.encode()) not in _BCRYPT_COSTS:
            # Such a user could never log in, and as the dummy's cost it would make unknown users fast.
            raise ConfigError(
                source, f"basic_auth_users.{user}",
                f"bcrypt cost must be {_BCRYPT_COSTS.start}..{_BCRYPT_COSTS.stop - 1}",
            )
        if stop is not None and stop.is_set():
            # The exporter is exiting: a thread inside bcrypt at interpreter exit aborts the process.
            raise ConfigError(source, f"basic_auth_users.{user}", "not checked: the exporter is stopping")
        # A hash of the right shape can still have a salt bcrypt refuses: its user would get 401 on every
        # login with nothing logged. Checked at cost 4 (the salt's validity does not depend on the cost,
        # and BasicAuth splices a cost onto the dummy the same way): a real cost of 31 would take hours.
        try:
            bcrypt.checkpw(b"", _with_cost(hashed.encode(), _BCRYPT_COSTS.start))
        except ValueError as exc:
            raise ConfigError(
                source, f"basic_auth_users.{user}", f"bcrypt cannot check this hash ({exc}); generate it again"
            ) from None
        users[user] = hashed.encode()
    costs = sorted({_bcrypt_cost(hashed) for hashed in users.values()})
    if len(costs) > 1:
        # Unknown users are checked at the highest cost: a user at a lower one answers a wrong password
        # faster, and so tells that the name exists (found by review: 68 against 263 ms, costs 10 and 12).
        log.warning(
            "%s: basic_auth_users hashes have different bcrypt costs (%s): a wrong password for a user with a "
            "lower cost is answered faster, which tells that the user exists; hash every user at one cost",
            source, ", ".join(map(str, costs)),
        )
    if costs and costs[0] < _BCRYPT_ADVISED.start:
        # Accepted as exporter-toolkit accepts it, but the web config is often world-readable (DynamicUser
        # without a credential): a cheap hash in a leaked copy gives up its password quickly.
        log.warning(
            "%s: basic_auth_users hashes at bcrypt cost %d are quick to crack from a copy of the file; hash "
            "at %d to %d (htpasswd -nBC 12 USER)",
            source, costs[0], _BCRYPT_ADVISED.start, _BCRYPT_ADVISED.stop - 1,
        )
    if costs and costs[-1] >= _BCRYPT_ADVISED.stop:
        # Every login that is not remembered, and every unknown user, is checked at this cost, one at a
        # time: past 14 a check takes seconds and the lane's queue fills.
        log.warning(
            "%s: basic_auth_users hashes at bcrypt cost %d make each login check take seconds, one at a time; "
            "hash at %d to %d",
            source, costs[-1], _BCRYPT_ADVISED.start, _BCRYPT_ADVISED.stop - 1,
        )
    return BasicAuth(users)


def _headers(source: str, body: Mapping[str, Any]) -> dict[str, str]:
    headers = body.get("headers")
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):  # `headers: []` or "" sets nothing: refused, not ignored
        raise ConfigError(source, "http_server_config.headers", "expected a mapping of header to value")
    result: dict[str, str] = {}
    for name, value in headers.items():
        key = f"http_server_config.headers.{name}"
        if not isinstance(name, str) or name not in TOOLKIT_HEADERS:
            allowed = ", ".join(TOOLKIT_HEADERS)
            raise ConfigError(source, key, f"not one of the headers exporter-toolkit allows: {allowed}")
        if not isinstance(value, str) or "\r" in value or "\n" in value:
            raise ConfigError(source, key, "expected a single-line string")
        if TOOLKIT_HEADERS[name] and value not in TOOLKIT_HEADERS[name]:
            raise ConfigError(source, key, f"expected one of {', '.join(TOOLKIT_HEADERS[name])}, got {value!r}")
        if not _FIELD_VALUE.match(value):
            # Answers are written in Latin-1: any other character made every answer fail, with no reply.
            raise ConfigError(source, key, "only printable ASCII, tabs and Latin-1 letters can be sent")
        result[name] = value
    return result


def load_web_config(path: Path | None, stop: threading.Event | None = None) -> WebConfig:
    """Parse and check the whole file: certificates are loaded now, so a bad one stops start-up. Once
    `stop` is set, the users' hashes are not checked further (ConfigError): a reload at exit."""
    if path is None:
        return WebConfig()
    source = str(path)
    state = file_state(path)  # before the read: an edit after it then differs, and is read next time
    document = read_yaml_file(path)
    top = _mapping(source, "", document, _TOP_KEYS)
    base = path.parent
    context, sans, tls_files = _tls(source, top.get("tls_server_config"), base)
    http = _mapping(source, "http_server_config", top.get("http_server_config"), _HTTP_KEYS)
    if http.get("http2") is not None:
        # Ignored (this server speaks HTTP/1.1), but typed as exporter-toolkit types it: a value node_exporter
        # refuses must not pass here, or the one shared file stops only node_exporter.
        check_bool(source, "http_server_config.http2", http["http2"])
    auth = _users(source, top.get("basic_auth_users"), stop)
    # A section written with every setting under it commented out: exporter-toolkit reads it as off, and so
    # does this server, one file for both; but it served without TLS or passwords in silence (daemon review).
    for section, what, off in (
        ("tls_server_config", "TLS", context is None),
        ("basic_auth_users", "basic authentication", auth is None),
    ):
        if section in top and off:
            log.warning("%s: %s is empty: serving without %s", source, section, what)
    return WebConfig(
        ssl_context=context,
        auth=auth,
        headers=_headers(source, http),
        allowed_sans=sans,
        source=source,
        empty=document is None,
        tls_files=tls_files,
        tls_settings=(str(base), repr(top.get("tls_server_config"))),
        file=((path, state),),
    )
