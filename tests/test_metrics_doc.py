"""METRICS.md is generated from the code and every exported metric is documented in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rdma_exporter.metricsdoc import declared_labels, main, render
from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree

from conftest import family_pattern, samples, scrape

METRICS_MD = Path(__file__).resolve().parent.parent / "METRICS.md"


def test_metrics_md_is_current() -> None:
    assert METRICS_MD.read_text() == render(), "regenerate: python -m rdma_exporter.metricsdoc > METRICS.md"


def test_every_exported_family_is_documented(tmp_path: Path) -> None:
    sys_root = build_tree(tmp_path / "t", SAMPLE_SPEC)
    exported = {name for name, _ in samples(scrape(sys_root, ethtool_dir=tmp_path / "t" / "ethtool"))}
    documented = render()
    patterns = [family_pattern(p) for p in re.findall(r"\| `([a-z0-9_<>]+)` \|", documented)]
    undocumented = sorted(name for name in exported if not any(p.fullmatch(name) for p in patterns))
    assert not undocumented, f"not in METRICS.md: {undocumented}"


def test_cli_writes_exactly_metrics_md(capsys: pytest.CaptureFixture[str]) -> None:
    # README regenerates the file with `python -m rdma_exporter.metricsdoc > METRICS.md`.
    assert main() == 0
    assert capsys.readouterr().out == METRICS_MD.read_text()


def test_the_documented_scrape_drop_keeps_every_series_a_rule_or_dashboard_reads() -> None:
    """docs/operations.md ("Sizing the Prometheus server") gives a metric_relabel_configs regex that drops
    the netdevs' statistics/ counters. It must drop those on the sample node, nothing any rule or
    dashboard reads (a rule added later on one of them makes the advice wrong), and not the carrier
    counters the link alerts use."""
    root = Path(__file__).resolve().parent.parent
    section = (root / "docs" / "operations.md").read_text().split("\n### Sizing the Prometheus server\n", 1)[1]
    found = re.search(r"regex: (\S+)\n\s+action: drop", section)
    assert found, "the drop snippet is gone from docs/operations.md"
    drop = re.compile(found.group(1))
    golden = (Path(__file__).resolve().parent / "golden" / "sample-8hca.prom").read_text()
    names = {line.split("{", 1)[0].split(" ", 1)[0] for line in golden.splitlines() if not line.startswith("#")}
    dropped = {name for name in names if drop.fullmatch(name)}
    statistics = {name for name in names if re.fullmatch(r"rdma_netdev_(?!carrier)[a-z_]+_total", name)}
    assert dropped == statistics and "rdma_netdev_rx_bytes_total" in dropped
    read = "".join(p.read_text() for p in [*root.glob("rules/*.yml"), *root.glob("grafana/dashboards/*.json")])
    used = {name for name in re.findall(r"\b(rdma_[a-z0-9_]+)", read) if drop.fullmatch(name)}
    assert not used, f"rules or dashboards read series the documented drop removes: {sorted(used)}"
    count = sum(1 for line in golden.splitlines() if not line.startswith("#") and drop.fullmatch(line.split("{")[0]))
    assert f"statistics/` counters ({count} on the sample node" in " ".join(section.split())


# Labels the rules, Prometheus, Alertmanager or the shipped deployments own: a series of ours carrying
# one would be renamed at scrape (`exported_instance`; deploy/kubernetes's ServiceMonitor adds
# namespace, pod, node...; operations.md suggests a `rack` target label) or would route an alert that
# keeps it (`severity="fatal"` matches no route).
OWNED_ELSEWHERE = {"job", "instance", "cluster", "rack", "severity", "alertname", "alertstate", "le", "quantile",
                   "namespace", "service", "endpoint", "pod", "container", "node"}  # fmt: skip


def test_no_exported_label_is_one_the_scrape_or_alerting_owns() -> None:
    # Every declared family, and every series of every golden file for the labels a dynamic family adds
    # per key.
    declared = {name: set(labels) for name, labels in declared_labels().items()}
    assert len(declared) > 100 and declared["rdma_pcie_aer_errors_total"] == {"device", "error_class", "type"}
    for path in sorted((Path(__file__).resolve().parent / "golden").glob("*.prom")):
        for (name, labels), _ in samples(path.read_text()).items():
            declared.setdefault(name, set()).update(label for label, _value in labels)
    found = {name: sorted(labels & OWNED_ELSEWHERE) for name, labels in declared.items() if labels & OWNED_ELSEWHERE}
    assert not found, f"rename these labels: {found}"
