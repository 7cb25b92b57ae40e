"""METRICS.md is generated from the code and every exported metric is documented in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rdma_exporter.metricsdoc import main, render
from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree

from conftest import samples, scrape

METRICS_MD = Path(__file__).resolve().parent.parent / "METRICS.md"


def test_metrics_md_is_current() -> None:
    assert METRICS_MD.read_text() == render(), "regenerate: python -m rdma_exporter.metricsdoc > METRICS.md"


def test_every_exported_family_is_documented(tmp_path: Path) -> None:
    sys_root = build_tree(tmp_path / "t", SAMPLE_SPEC)
    exported = {name for name, _ in samples(scrape(sys_root, ethtool_dir=tmp_path / "t" / "ethtool"))}
    documented = render()
    patterns = [
        re.compile(re.escape(p).replace(re.escape("<counter>"), "[a-z0-9_]+") + "$")
        for p in re.findall(r"\| `([a-z0-9_<>]+)` \|", documented)
    ]
    undocumented = sorted(name for name in exported if not any(p.match(name) for p in patterns))
    assert not undocumented, f"not in METRICS.md: {undocumented}"


def test_cli_writes_exactly_metrics_md(capsys: pytest.CaptureFixture[str]) -> None:
    # README regenerates the file with `python -m rdma_exporter.metricsdoc > METRICS.md`.
    assert main() == 0
    assert capsys.readouterr().out == METRICS_MD.read_text()
