"""A web config section of the wrong shape is refused at start-up, naming the section: an empty list or
string where a mapping belongs must not silently mean "no TLS" or "no headers"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rdma_exporter.config import ConfigError
from rdma_exporter.webconfig import load_web_config


@pytest.mark.parametrize(
    ("text", "key", "got"),
    [
        # Before: plain HTTP, as if the section were not there.
        ("tls_server_config: []\n", "tls_server_config", "list"),
        ("tls_server_config: ''\n", "tls_server_config", "str"),
        ("tls_server_config: false\n", "tls_server_config", "bool"),
        # Before: the string was searched for refused key names ("key" in "key.pem") and the error named
        # tls_server_config.key, a key that is not in the file.
        ("tls_server_config: key.pem\n", "tls_server_config", "str"),
        ("tls_server_config: [cert]\n", "tls_server_config", "list"),
        # Before: no headers, silently.
        ("http_server_config:\n  headers: []\n", "http_server_config.headers", None),
        ("http_server_config:\n  headers: ''\n", "http_server_config.headers", None),
    ],
)
def test_a_section_that_is_not_a_mapping_is_refused(tmp_path: Path, text: str, key: str, got: str | None) -> None:
    web = tmp_path / "web.yml"
    web.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_web_config(web)
    assert info.value.key == key
    assert "expected a mapping" in info.value.reason
    if got is not None:
        assert info.value.reason.endswith(f"got {got}")
    check = subprocess.run(
        [sys.executable, "-m", "rdma_exporter", "--check-config", "--web.config.file", str(web)],
        capture_output=True, text=True, timeout=60,
    )
    assert check.returncode == 2 and f"{web}: {key}: expected a mapping" in check.stderr


@pytest.mark.parametrize(
    "text", ["tls_server_config:\n", "tls_server_config: {}\n", "http_server_config:\n  headers:\n"]
)
def test_an_empty_section_still_means_its_defaults(tmp_path: Path, text: str) -> None:
    web = tmp_path / "web.yml"
    web.write_text(text)
    config = load_web_config(web)
    assert (config.scheme, config.headers) == ("http", {})
