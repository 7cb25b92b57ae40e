"""`--web.config.file` behaviour that a second hand-made mutation review of webconfig.py found unpinned
(test_webconfig_gaps.py holds the first): how credentials are split and remembered, what unknown users
cost, and settings of the wrong type or with a bad file that must stop start-up naming file, key and reason.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_daemon_http import Pki, make_pki, web_config

from rdma_exporter.config import ConfigError
from rdma_exporter.webconfig import load_web_config


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


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


# --- refused at start-up ------------------------------------------------------------------------------------

VERSIONS = "expected one of TLS10, TLS11, TLS12, TLS13"
AUTH_TYPES = "expected one of NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"


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
