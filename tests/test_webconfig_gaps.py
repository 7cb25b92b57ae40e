"""`--web.config.file` cases that hand-made mutation testing of webconfig.py found unchecked: client
certificates that are optional, TLS version bounds, what is refused at start-up (with the key named), basic
auth edge cases and the bound on the auth cache. Real files, real handshakes and real HTTP on loopback.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import bcrypt
import pytest
from test_daemon_http import (
    InProcessServer,
    Pki,
    RunningDaemon,
    basic,
    client_context,
    get,
    make_pki,
    refused,
    web_config,
)

from rdma_exporter import webconfig
from rdma_exporter.config import ConfigError
from rdma_exporter.daemon import Response
from rdma_exporter.sample_tree import build_tree, spec_for_devices
from rdma_exporter.webconfig import WebConfig, load_web_config


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def sysfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tree(tmp_path_factory.mktemp("web") / "t", spec_for_devices(1))


@pytest.fixture
def daemon(tmp_path: Path, sysfs: Path) -> Iterator[Callable[[Path], RunningDaemon]]:
    running: list[RunningDaemon] = []

    def make(config: Path) -> RunningDaemon:
        running.append(RunningDaemon(tmp_path, ["--path.sysfs", str(sysfs), "--web.config.file", str(config)]))
        return running[-1]

    yield make
    for proc in running:
        proc.stop()


def serve(web: WebConfig) -> InProcessServer:
    """The HTTP server with this web config's TLS, SAN check and headers, answering 200 "ok"."""
    return InProcessServer(
        lambda request: Response(200, b"ok"),
        tls=lambda: web.ssl_context,  # type: ignore[arg-type]
        peer_allowed=web.peer_allowed,  # type: ignore[arg-type]
        headers=lambda: web.headers,  # type: ignore[arg-type]
    )


def tls_head(certs: Pki) -> str:
    return f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: {certs.server_key}\n"


def refusal(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_web_config(web_config(tmp_path, text))
    return info.value


# --- client certificates ------------------------------------------------------------------------------------


def test_verify_client_cert_if_given_admits_clients_without_one_and_checks_those_with_one(
    certs: Pki, tmp_path: Path
) -> None:
    text = tls_head(certs) + f"  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: {certs.ca}\n"
    web = load_web_config(web_config(tmp_path, text))
    with serve(web) as server:
        assert get(server.port, "/", context=client_context(certs)).status == 200  # none given
        assert get(server.port, "/", context=client_context(certs, "client")).status == 200
        assert refused(server.port, client_context(certs, "rogue"))  # given, but from a CA we do not trust
    assert "client certificates required" not in web.describe()

    # With client_allowed_sans, a client without a certificate names no allowed SAN.
    web = load_web_config(web_config(tmp_path, text + "  client_allowed_sans: [prometheus]\n"))
    with serve(web) as server:
        assert get(server.port, "/", context=client_context(certs, "client")).status == 200
        assert refused(server.port, client_context(certs))
        assert refused(server.port, client_context(certs, "intruder"))


@pytest.mark.parametrize(
    ("sans", "reason"),
    [
        # A bare string would be taken as its characters, each a "name".
        ("prometheus", "expected a list of names"),
        ("['']", "expected a list of names"),
        ("[1]", "expected a list of names"),
    ],
)
def test_client_allowed_sans_must_be_a_list_of_names(
    certs: Pki, tmp_path: Path, sans: str, reason: str
) -> None:
    text = tls_head(certs) + (
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {certs.ca}\n"
        f"  client_allowed_sans: {sans}\n"
    )
    error = refusal(tmp_path, text)
    assert (error.key, error.reason) == ("tls_server_config.client_allowed_sans", reason)


# --- TLS versions -------------------------------------------------------------------------------------------


def test_max_version_caps_the_handshake_and_may_equal_min_version(certs: Pki, tmp_path: Path) -> None:
    web = load_web_config(web_config(tmp_path, tls_head(certs) + "  max_version: TLS12\n"))
    with serve(web) as server:
        assert get(server.port, "/", context=client_context(certs)).status == 200
        assert refused(server.port, client_context(certs, minimum_version=ssl.TLSVersion.TLSv1_3))
    web = load_web_config(web_config(tmp_path, tls_head(certs) + "  min_version: TLS13\n  max_version: TLS13\n"))
    with serve(web) as server:
        assert get(server.port, "/", context=client_context(certs)).status == 200
        assert refused(server.port, client_context(certs, maximum_version=ssl.TLSVersion.TLSv1_2))


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
@pytest.mark.parametrize(
    ("name", "version"), [("TLS10", ssl.TLSVersion.TLSv1), ("TLS11", ssl.TLSVersion.TLSv1_1)]
)
def test_min_version_names_the_lowest_version_the_server_accepts(
    certs: Pki, tmp_path: Path, name: str, version: ssl.TLSVersion
) -> None:
    # Only with a permissive cipher policy (as a LEGACY system policy gives) can TLS 1.0/1.1 happen at all.
    web = load_web_config(web_config(tmp_path, tls_head(certs) + f"  min_version: {name}\n"))
    assert web.ssl_context is not None
    web.ssl_context.set_ciphers("DEFAULT:@SECLEVEL=0")
    old = client_context(certs, minimum_version=ssl.TLSVersion.TLSv1, maximum_version=version)
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    try:
        with serve(web) as server:
            reply = get(server.port, "/", context=old)
    except ssl.SSLError as exc:
        if "UNSUPPORTED_PROTOCOL" in str(exc) or "NO_PROTOCOLS" in str(exc):
            pytest.skip(f"this OpenSSL cannot speak {name} at all: {exc}")
        raise
    assert reply.status == 200


def test_relative_certificate_paths_are_relative_to_the_web_config_file(
    certs: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # systemd starts the exporter in /: what the file names must not depend on where it runs.
    etc = tmp_path / "etc"
    etc.mkdir()
    for name in ("server.crt", "server.key", "ca.crt"):
        (etc / name).write_bytes((certs.dir / name).read_bytes())
    (etc / "web.yml").write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    web = load_web_config(Path("../etc/web.yml"))
    with serve(web) as server:
        assert get(server.port, "/", context=client_context(certs, "client")).status == 200


# --- what the file may leave out ----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "http_server_config:\n", "tls_server_config:\nhttp_server_config:\n"])
def test_a_web_config_without_settings_serves_plain_http(tmp_path: Path, text: str) -> None:
    web = load_web_config(web_config(tmp_path, text))
    assert (web.scheme, web.auth, web.headers) == ("http", None, {})
    with serve(web) as server:
        assert get(server.port, "/").status == 200


def test_http2_is_a_known_http_server_config_key(tmp_path: Path) -> None:
    # exporter-toolkit's http2 switch: this server speaks HTTP/1.1 only, which `http2: false` asks for.
    web = load_web_config(web_config(tmp_path, "http_server_config:\n  http2: false\n"))
    assert web.scheme == "http"


# --- refused at start-up ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["cipher_suites", "curve_preferences", "prefer_server_cipher_suites", "cert", "key", "client_ca"]
)
def test_tls_settings_that_cannot_be_honoured_say_why(certs: Pki, tmp_path: Path, key: str) -> None:
    error = refusal(tmp_path, tls_head(certs) + f"  {key}: x\n")
    assert error.key == f"tls_server_config.{key}"
    assert "unknown key" not in error.reason and ("not supported" in error.reason or "remove the key" in error.reason)


@pytest.mark.parametrize("key", ["cert_file", "key_file"])
def test_a_directory_named_as_a_certificate_file_is_refused_under_its_key(
    certs: Pki, tmp_path: Path, key: str
) -> None:
    text = tls_head(certs).replace(str(getattr(certs, f"server_{key.removesuffix('_file')}")), str(certs.dir))
    error = refusal(tmp_path, text)
    assert (error.key, error.reason) == (f"tls_server_config.{key}", f"{certs.dir} does not exist or is not a file")


@pytest.mark.parametrize(
    "name",
    ["WWW-Authenticate", "Server", "date", "Connection", "Transfer-Encoding", "content-type", "Content-Encoding"],
)
def test_headers_the_server_sets_itself_are_refused(tmp_path: Path, name: str) -> None:
    error = refusal(tmp_path, f"http_server_config:\n  headers:\n    {name}: x\n")
    assert (error.key, error.reason) == (f"http_server_config.headers.{name}", "set by the server itself")


@pytest.mark.parametrize(
    ("headers", "key", "reason"),
    [
        ("'X-A B': x", "X-A B", "not a valid header name"),
        ("'X-A:': x", "X-A:", "not a valid header name"),
        ("1: x", "1", "not a valid header name"),  # YAML makes this an int
        ("X-A: \"a\\rb\"", "X-A", "expected a single-line string"),  # a bare CR ends a header line too
        ("X-A: [a, b]", "X-A", "expected a single-line string"),
    ],
)
def test_bad_header_names_and_values_are_refused(tmp_path: Path, headers: str, key: str, reason: str) -> None:
    error = refusal(tmp_path, f"http_server_config:\n  headers:\n    {headers}\n")
    assert (error.key, error.reason) == (f"http_server_config.headers.{key}", reason)


def test_configured_headers_are_sent_as_written(tmp_path: Path) -> None:
    text = "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
    web = load_web_config(web_config(tmp_path, text))
    with serve(web) as server:
        assert get(server.port, "/").headers["x-content-type-options"] == "nosniff"


def _hash(cost: int) -> str:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    return f"$2b${cost:02d}${hashed[7:]}"


@pytest.mark.parametrize(
    ("users", "key", "reason"),
    [
        ("{{}}", "basic_auth_users", "expected a mapping"),  # nobody could log in
        ("\n  '': '{hash}'", "basic_auth_users.", "user names are non-empty"),
        ("\n  p: '{hash}AA'", "basic_auth_users.p", "expected a bcrypt hash"),  # too long: never matches
        ("\n  p: '{cost3}'", "basic_auth_users.p", "bcrypt cost must be 4..31"),
        ("\n  p: '{cost32}'", "basic_auth_users.p", "bcrypt cost must be 4..31"),
    ],
)
def test_basic_auth_users_that_could_never_log_in_are_refused(
    tmp_path: Path, users: str, key: str, reason: str
) -> None:
    text = "basic_auth_users: " + users.format(hash=_hash(4), cost3=_hash(3), cost32=_hash(32)) + "\n"
    error = refusal(tmp_path, text)
    assert error.key == key and error.reason.startswith(reason), error


# --- basic auth over HTTP -----------------------------------------------------------------------------------


def test_basic_auth_refuses_malformed_credentials_like_go_does(
    daemon: Callable[[Path], RunningDaemon], tmp_path: Path
) -> None:
    empty = bcrypt.hashpw(b"", bcrypt.gensalt(rounds=4)).decode()  # a user with an empty password
    s3cret = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    port = daemon(web_config(tmp_path, f"basic_auth_users:\n  blank: '{empty}'\n  prometheus: '{s3cret}'\n")).port

    def status(value: str) -> int:
        return get(port, "/healthz", headers={"Authorization": value}).status

    assert status("Basic " + base64.b64encode(b"blank:").decode()) == 200
    # No ':' at all is no credentials (Go's BasicAuth), not user "blank" with an empty password.
    assert status("Basic " + base64.b64encode(b"blank").decode()) == 401
    good = base64.b64encode(b"prometheus:s3cret").decode()
    assert status("Basic " + good) == 200
    assert status("Basic " + good[:4] + "*" + good[4:]) == 401  # not base64: Go refuses it too
    assert status("Bearer " + good) == 401
    # RFC 7235 puts 1*SP between the scheme and the credentials; Go takes exactly one, this server any
    # number (a proxy that pads the header still authenticates).
    assert status("Basic   " + good) == 200
    # bcrypt cannot check a password over 72 bytes: a 401, and the server goes on answering.
    assert status("Basic " + base64.b64encode(b"prometheus:" + b"s3cret" * 13).decode()) == 401
    assert status("Basic " + good) == 200


def test_the_auth_cache_is_bounded_and_evicts_the_oldest_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = webconfig._AUTH_CACHE_SIZE
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    # One hash for all users is enough: the cache is keyed by user name and password.
    text = "basic_auth_users:\n" + "".join(f"  u{i}: '{hashed}'\n" for i in range(size + 2))
    auth = load_web_config(web_config(tmp_path, text)).auth
    assert auth is not None
    now = [1000.0]
    monkeypatch.setattr(webconfig, "time", type("Clock", (), {"monotonic": staticmethod(lambda: now[0])}))
    checked: list[str] = []

    def login(user: str) -> bool:
        """Log in; True if bcrypt had to check the password (it was not remembered)."""
        calls = len(checked)
        assert auth is not None and auth.check(basic(user, "pw")["Authorization"])
        return len(checked) > calls

    real_checkpw = bcrypt.checkpw

    def checkpw(password: bytes, hashed: bytes) -> bool:
        checked.append(password.decode())
        return real_checkpw(password, hashed)

    monkeypatch.setattr(webconfig.bcrypt, "checkpw", checkpw)
    assert all(login(f"u{i}") for i in range(size))  # u0 .. u63 fill the cache
    assert not login("u0")
    assert login(f"u{size}")  # one more: the oldest entry (u0) goes, the new one stays
    assert not login(f"u{size}") and not login("u1")
    assert login("u0")  # forgotten; now remembered again in place of u1

    # A renewed entry counts as new: once all have expired, renew the oldest (u2), then add one more user.
    now[0] += webconfig.AUTH_CACHE_SECONDS + 1
    assert login("u2")
    assert login(f"u{size + 1}")  # evicts the oldest entry, which is no longer u2
    assert not login("u2")
