"""`--web.config.file` behaviour that a second hand-made mutation review of webconfig.py found unpinned
(test_webconfig_gaps.py holds the first): how credentials are split and remembered, what unknown users
cost, and settings of the wrong type or with a bad file that must stop start-up naming file, key and reason.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import bcrypt
import pytest
from test_daemon_http import Pki, basic, make_pki, web_config

from rdma_exporter import webconfig
from rdma_exporter.config import ConfigError
from rdma_exporter.webconfig import BasicAuth, load_web_config


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def bcrypt_hash(password: str, cost: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=cost)).decode()


def users(tmp_path: Path, **hashes: str) -> BasicAuth:
    text = "basic_auth_users:\n" + "".join(f"  {user}: '{hashed}'\n" for user, hashed in hashes.items())
    auth = load_web_config(web_config(tmp_path, text)).auth
    assert auth is not None
    return auth


def login(auth: BasicAuth, user: str, password: str) -> bool:
    return auth.check(basic(user, password)["Authorization"])


def refusal(tmp_path: Path, text: str) -> ConfigError:
    """The start-up error for this web config, also checked through --check-config (exit 2, file named)."""
    path = web_config(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_web_config(path)
    check = subprocess.run(
        [sys.executable, "-m", "rdma_exporter", "--check-config", "--web.config.file", str(path)],
        capture_output=True, text=True, timeout=60,
    )
    assert check.returncode == 2 and f"{path}: {info.value.key}: {info.value.reason}" in check.stderr, check.stderr
    return info.value


# --- basic auth ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["$2y$", "$2a$", "$2b$"])
def test_hashes_of_every_bcrypt_flavour_log_in(tmp_path: Path, prefix: str) -> None:
    # htpasswd -B writes $2y$, older tools $2a$, Python's bcrypt $2b$: all three are the same algorithm.
    auth = users(tmp_path, prometheus=prefix + bcrypt_hash("pw")[4:])
    assert login(auth, "prometheus", "pw")
    assert not login(auth, "prometheus", "px")


def test_a_password_may_contain_colons(tmp_path: Path) -> None:
    # The user name ends at the first ':' (Go's BasicAuth, RFC 7617): names cannot hold one, passwords can.
    auth = users(tmp_path, prometheus=bcrypt_hash("a:b:c"))
    assert login(auth, "prometheus", "a:b:c")


def test_users_sharing_a_hash_do_not_share_remembered_logins(tmp_path: Path) -> None:
    # One hash copied to several users is common. A remembered login of "a" with "bc" must not let "ab" in
    # with "c": the cache key keeps the user name and the password apart.
    shared = bcrypt_hash("bc")
    auth = users(tmp_path, a=shared, ab=shared)
    assert login(auth, "a", "bc")
    assert not login(auth, "ab", "c")
    assert login(auth, "ab", "bc")


def test_credentials_that_are_not_utf8_are_refused(tmp_path: Path) -> None:
    # Valid base64 of bytes that are not UTF-8: a 401 like any bad password, not a failing handler (500).
    auth = users(tmp_path, prometheus=bcrypt_hash("pw"))
    assert not auth.check("Basic " + base64.b64encode(b"prometheus:\xff\xfe").decode())
    assert not auth.check("Basic " + base64.b64encode(b"\xc3:pw").decode())


def test_an_unknown_user_costs_as_much_bcrypt_work_as_the_costliest_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check an unknown name gets must run at the configured cost (5 here), not at the fixed dummy's (10):
    # otherwise response times tell which user names exist.
    auth = users(tmp_path, cheap=bcrypt_hash("a", 4), dear=bcrypt_hash("b", 5))
    costs: list[int] = []
    real_checkpw = bcrypt.checkpw

    def checkpw(password: bytes, hashed: bytes) -> bool:
        costs.append(int(hashed.split(b"$")[2]))
        return real_checkpw(password, hashed)

    monkeypatch.setattr(webconfig.bcrypt, "checkpw", checkpw)
    assert not login(auth, "nobody", "b")
    assert costs == [5]


def test_the_start_up_line_counts_users_and_says_what_is_required(certs: Pki, tmp_path: Path) -> None:
    text = (
        f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: {certs.server_key}\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {certs.ca}\n"
        f"basic_auth_users:\n  a: '{bcrypt_hash('a')}'\n  b: '{bcrypt_hash('b')}'\n"
    )
    assert load_web_config(web_config(tmp_path, text)).describe() == (
        "HTTPS, client certificates required, basic auth (2 users)"
    )


# --- refused at start-up ------------------------------------------------------------------------------------

VERSIONS = "expected one of TLS10, TLS11, TLS12, TLS13"
AUTH_TYPES = "expected one of NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"
A_HASH = "$2b$04$" + "a" * 53  # well-formed; its salt is never checked before the user name is


@pytest.mark.parametrize(
    ("tls", "key", "reason"),
    [
        ("max_version: TLS14", "max_version", f"{VERSIONS}, got 'TLS14'"),
        # A list or mapping where a name belongs was a TypeError traceback (exit 1), not a config error.
        ("min_version: [TLS12]", "min_version", f"{VERSIONS}, got ['TLS12']"),
        ("max_version: {TLS13: 1}", "max_version", f"{VERSIONS}, got {{'TLS13': 1}}"),
        ("client_auth_type: [RequireAndVerifyClientCert]", "client_auth_type",
         f"{AUTH_TYPES}, got ['RequireAndVerifyClientCert']"),
        ("client_auth_type: requireandverifyclientcert", "client_auth_type",
         f"{AUTH_TYPES}, got 'requireandverifyclientcert'"),
        ("cert_file: 5", "cert_file", "expected a file path, got 5"),
        ("key_file: ''", "key_file", "expected a file path, got ''"),
    ],
)
def test_tls_settings_of_the_wrong_type_or_value_are_refused(
    certs: Pki, tmp_path: Path, tls: str, key: str, reason: str
) -> None:
    # A cert_file or key_file under test replaces the good one: a key given twice is refused before this.
    head = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}
    head.pop(tls.split(":")[0], None)
    text = "tls_server_config:\n" + "".join(f"  {k}: {v}\n" for k, v in head.items()) + f"  {tls}\n"
    error = refusal(tmp_path, text)
    assert (error.key, error.reason) == (f"tls_server_config.{key}", reason)


# /proc/self/mem is a regular file that cannot be read (EIO): like a key only root may read, for an exporter
# that runs as its own user, but unreadable even when the tests run as root.
UNREADABLE = Path("/proc/self/mem")


@pytest.mark.parametrize(
    ("key", "file", "reason"),
    [
        # The certificate and key are loaded together: a failure names the section and both files.
        ("key_file", UNREADABLE, "tls_server_config: cannot load {dir}/server.crt with /proc/self/mem: "),
        ("client_ca_file", Path("server.key"), "tls_server_config.client_ca_file: cannot load {dir}/server.key: "),
        ("client_ca_file", UNREADABLE, "tls_server_config.client_ca_file: cannot load /proc/self/mem: "),
    ],
    ids=["unreadable-key", "ca-without-certificate", "unreadable-ca"],
)
def test_a_file_that_cannot_be_loaded_stops_start_up_under_its_key(
    certs: Pki, tmp_path: Path, key: str, file: Path, reason: str
) -> None:
    if file == UNREADABLE and not UNREADABLE.is_file():
        pytest.skip(f"no {UNREADABLE}")
    files = {"cert_file": certs.server_cert, "key_file": certs.server_key, "client_ca_file": certs.ca}
    files[key] = certs.dir / file  # an absolute file stays as it is
    text = "tls_server_config:\n  client_auth_type: RequireAndVerifyClientCert\n" + "".join(
        f"  {k}: {v}\n" for k, v in files.items()
    )
    error = refusal(tmp_path, text)
    assert f"{error.key}: {error.reason}".startswith(reason.format(dir=certs.dir)), error


def test_an_empty_client_allowed_sans_admits_any_verified_client(certs: Pki, tmp_path: Path) -> None:
    # `client_allowed_sans:` with nothing after it is exporter-toolkit's "no list", not a wrong type.
    text = (
        f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: {certs.server_key}\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {certs.ca}\n  client_allowed_sans:\n"
    )
    web = load_web_config(web_config(tmp_path, text))
    assert web.peer_allowed({"subjectAltName": (("DNS", "intruder"),)})


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        # Top-level keys are named as written (no leading dot), with the keys that would be understood.
        ("tls_config: {}\n", "tls_config",
         "unknown key (known: basic_auth_users, http_server_config, tls_server_config)"),
        ("basic_auth_users:\n  1: '" + A_HASH + "'\n", "basic_auth_users.1",
         "user names are non-empty strings without ':'"),
        ("basic_auth_users:\n  p:\n", "basic_auth_users.p", "expected a bcrypt hash ($2y$/$2b$/$2a$, 60 characters)"),
        # Go's bcrypt reads exactly two cost digits.
        ("basic_auth_users:\n  p: '$2b$4$" + "a" * 53 + "'\n", "basic_auth_users.p",
         "expected a bcrypt hash ($2y$/$2b$/$2a$, 60 characters)"),
        ("http_server_config:\n  headers:\n    X-A: \"a\\nb\"\n", "http_server_config.headers.X-A",
         "expected a single-line string"),
        ("http_server_config:\n  headers:\n    '': x\n", "http_server_config.headers.", "not a valid header name"),
    ],
    ids=["top-level-typo", "numeric-user", "no-hash", "one-digit-cost", "bare-lf", "empty-header-name"],
)
def test_more_settings_that_stop_start_up(tmp_path: Path, text: str, key: str, reason: str) -> None:
    error = refusal(tmp_path, text)
    assert (error.key, error.reason) == (key, reason)
