"""METRICS.md is generated from the code and every exported metric is documented in it."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from rdma_exporter.collect.process import ProcessMetrics
from rdma_exporter.daemon import node_boot_time
from rdma_exporter.httpserver import MAX_PENDING_BYTES
from rdma_exporter.metricsdoc import declared_labels, main, render
from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree

from conftest import GOLDEN, family_pattern, samples, scrape

METRICS_MD = Path(__file__).resolve().parent.parent / "METRICS.md"
OPERATIONS_MD = METRICS_MD.parent / "docs" / "operations.md"


def sizing_section() -> str:
    """operations.md from its "Sizing the Prometheus server" section on."""
    return OPERATIONS_MD.read_text().split("\n### Sizing the Prometheus server\n", 1)[1]


def names_read(*patterns: str) -> set[str]:
    """The rdma_ metric names the repository's files matching `patterns` mention."""
    text = "".join(p.read_text() for pattern in patterns for p in METRICS_MD.parent.glob(pattern))
    return set(re.findall(r"\b(rdma_[a-z0-9_]+)", text))


def golden_sample_names() -> list[str]:
    """The metric name of each series of the sample node's golden exposition."""
    golden = (GOLDEN / "sample-8hca.prom").read_text()
    return [line.split("{", 1)[0].split(" ", 1)[0] for line in golden.splitlines() if line and line[0] != "#"]


def test_metrics_md_is_current() -> None:
    assert METRICS_MD.read_text() == render(), "regenerate: python -m rdma_exporter.metricsdoc > METRICS.md"


@pytest.fixture(scope="module")
def sample_scrape(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One scrape of the sample tree, for the checks below that compare it with METRICS.md."""
    dest = tmp_path_factory.mktemp("sample")
    return scrape(build_tree(dest, SAMPLE_SPEC), ethtool_dir=dest / "ethtool")


def test_every_exported_family_is_documented(sample_scrape: str) -> None:
    exported = {name for name, _ in samples(sample_scrape)}
    documented = render()
    patterns = [family_pattern(p) for p in re.findall(r"\| `([a-z0-9_<>]+)` \|", documented)]
    undocumented = sorted(name for name in exported if not any(p.fullmatch(name) for p in patterns))
    assert not undocumented, f"not in METRICS.md: {undocumented}"


def test_cli_writes_exactly_metrics_md(capsys: pytest.CaptureFixture[str]) -> None:
    # README regenerates the file with `python -m rdma_exporter.metricsdoc > METRICS.md`.
    assert main() == 0
    assert capsys.readouterr().out == METRICS_MD.read_text()


def test_the_documented_series_of_a_sample_node_are_what_it_serves(sample_scrape: str, tmp_path: Path) -> None:
    """docs/operations.md ("Sizing the Prometheus server") sizes a Prometheus server from the series a
    sample node serves: the numbers must be this code's, or the sizing drifts with every new family."""
    row = re.search(
        r"\| series scraped \| ([\d,]+) by default \(([\d,]+) per InfiniBand device, ([\d,]+) per two-port RoCE card, "
        r"([\d,]+) per node\); ([\d,]+) with IPoIB statistics",
        OPERATIONS_MD.read_text(),
    )
    assert row, "the sizing table's 'series scraped' row is not in the expected form"
    total, per_infiniband, per_roce_card, per_node, with_ipoib = (int(n.replace(",", "")) for n in row.groups())

    def series(exposition: str) -> list[dict[str, str]]:
        # As served: the collectors' families and the process's own (daemon.py adds those to each answer).
        served = exposition + ProcessMetrics(node_boot_time()).families().render_text().decode()
        return [dict(labels) for _, labels in samples(served)]

    served = series(sample_scrape)
    link_layers = {s["device"]: s["link_layer"] for s in served if "link_layer" in s and "device" in s}
    counts = Counter(link_layers.get(s.get("device", ""), "node") for s in served)
    infiniband = sum(1 for layer in link_layers.values() if layer == "InfiniBand")
    roce = sum(1 for layer in link_layers.values() if layer == "Ethernet")
    assert (infiniband, roce) == (8, 2)
    # The two RoCE devices are the two ports of one card, sharing its PCIe link (and the port above it).
    assert (counts["InfiniBand"] / infiniband, counts["Ethernet"], counts["node"]) == (
        per_infiniband,
        per_roce_card,
        per_node,
    )
    assert len(served) == total == 8 * per_infiniband + per_roce_card + per_node

    tree = build_tree(tmp_path, SAMPLE_SPEC)
    ipoib = scrape(tree, ethtool_dir=tmp_path / "ethtool", collector_settings={"netdev": {"ipoib_statistics": True}})
    assert len(series(ipoib)) == with_ipoib


def test_the_documented_sizes_are_the_recorded_bench_runs() -> None:
    """operations.md quotes the recorded bench run (bench/RESULTS.json) for what a node costs: the series
    of the SR-IOV tree, the files the sample node keeps open and the size of its answer."""
    text = " ".join(OPERATIONS_MD.read_text().split())
    recorded = {
        t["tree"]: t["exporters"]["rdma_exporter"]
        for t in json.loads((METRICS_MD.parent / "bench" / "RESULTS.json").read_text())["trees"]
    }
    vfs = re.search(r"128-device tree exports ([\d,]+) series, bench/RESULTS.md", text)
    assert vfs and int(vfs.group(1).replace(",", "")) == recorded["128"]["series"]
    kept = re.search(r"the 10-HCA sample node keeps (\d+) ", text)
    assert kept and int(kept.group(1)) == recorded["sample"]["files_per_scrape"]["kept_open_reads"]
    answers = re.search(r"about (\d+) answers of the sample tree, of (\d+) KB each", text)
    assert answers and int(answers.group(2)) == round(recorded["sample"]["body_bytes"] / 1000)
    assert abs(int(answers.group(1)) - MAX_PENDING_BYTES / recorded["sample"]["body_bytes"]) <= 10


def test_the_documented_scrape_drop_keeps_every_series_a_rule_or_dashboard_reads() -> None:
    """docs/operations.md ("Sizing the Prometheus server") gives a metric_relabel_configs regex that drops
    the netdevs' statistics/ counters. It must drop those on the sample node, nothing any rule or
    dashboard reads (a rule added later on one of them makes the advice wrong), and not the carrier
    counters the link alerts use."""
    section = sizing_section()
    found = re.search(r"regex: (\S+)\n\s+action: drop", section)
    assert found, "the drop snippet is gone from docs/operations.md"
    drop = re.compile(found.group(1))
    series = golden_sample_names()
    names = set(series)
    dropped = {name for name in names if drop.fullmatch(name)}
    statistics = {name for name in names if re.fullmatch(r"rdma_netdev_(?!carrier)[a-z_]+_total", name)}
    assert dropped == statistics and "rdma_netdev_rx_bytes_total" in dropped
    used = {name for name in names_read("rules/*.yml", "grafana/dashboards/*.json") if drop.fullmatch(name)}
    assert not used, f"rules or dashboards read series the documented drop removes: {sorted(used)}"
    count = sum(1 for name in series if drop.fullmatch(name))
    assert f"statistics/` counters ({count} on the sample node" in " ".join(section.split())


def test_the_documented_counts_of_series_nothing_reads_are_current() -> None:
    """The same section counts the sample node's series that no rule and no dashboard reads, which an
    operator may drop at the scrape. A panel or rule added on one of them changes the count (it said
    about 550 where about 410 was true: dashboard panels added after it was written read some of them)."""
    section = " ".join(sizing_section().split())
    found = re.search(
        r"About (\d+) series of a sample node are read by no rule and no dashboard, .*?\(about (\d+) with IPoIB "
        r"statistics\)\. Among them are about (\d+) `hw_counters/` series \(no rule reads about (\d+) of the node's "
        r"`hw_counters/` series, and the dashboards show about (\d+) of those\)",
        section,
    )
    assert found, "the count of series nothing reads is gone from docs/operations.md"
    unread, with_ipoib, hw_unread, hw_by_no_rule, hw_on_dashboard = (int(n) for n in found.groups())
    by_rules = names_read("rules/*.yml")
    by_either = by_rules | names_read("grafana/dashboards/*.json")
    names = golden_sample_names()
    hw = [name for name in names if name.startswith("rdma_port_hw_")]
    unread_now = sum(name not in by_either for name in names)
    measured = (
        unread_now,
        unread_now + 8 * 24,  # IPoIB statistics: 24 netdev counters for each of the 8 InfiniBand ports, none read
        sum(name not in by_either for name in hw),
        sum(name not in by_rules for name in hw),
        sum(name not in by_rules and name in by_either for name in hw),
    )
    documented = (unread, with_ipoib, hw_unread, hw_by_no_rule, hw_on_dashboard)
    for said, actual in zip(documented, measured, strict=True):
        assert abs(said - actual) <= 0.1 * actual, f"documented about {said}, now {actual}"


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
    for path in sorted(GOLDEN.glob("*.prom")):
        for (name, labels), _ in samples(path.read_text()).items():
            declared.setdefault(name, set()).update(label for label, _value in labels)
    found = {name: sorted(labels & OWNED_ELSEWHERE) for name, labels in declared.items() if labels & OWNED_ELSEWHERE}
    assert not found, f"rename these labels: {found}"


# METRICS.md's table read back, so the checks below compare the code with what an operator reads.
_ROW = re.compile(r"^\| `([^`]+)` \| (\w+) \| ([^|]*) \|", re.M)


def _documented_rows() -> dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """METRICS.md's rows: name -> (type, labels, optional labels), read back from the table."""
    rows = {}
    for name, kind, cell in _ROW.findall(METRICS_MD.read_text()):
        fixed, _, optional = cell.partition("; also ")
        rows[name] = (kind, tuple(re.findall(r"`(\w+)`", fixed)), tuple(re.findall(r"`(\w+)`", optional)))
    return rows


def test_declared_labels_are_the_documented_rows() -> None:
    # The tests of rules and dashboards trust declared_labels() as "what METRICS.md declares": the same
    # families (label-less, self-monitoring and <counter> ones included) and the same fixed labels.
    assert declared_labels() == {name: labels for name, (_, labels, _) in _documented_rows().items()}


def test_exported_types_and_labels_are_the_documented_ones(sample_scrape: str) -> None:
    # Per-file families (<counter>) get their MetricSpec at scrape time, not from the documented one.
    text = sample_scrape
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    rows = _documented_rows()
    patterns = [(family_pattern(name), row) for name, row in rows.items() if "<counter>" in name]
    wrong = []
    for (name, labels), _ in samples(text).items():
        kind, fixed, optional = rows.get(name) or next(row for p, row in patterns if p.fullmatch(name))
        names = {label for label, _value in labels}
        if types[name] != ("gauge" if kind == "info" else kind) or not set(fixed) <= names <= {*fixed, *optional}:
            wrong.append((name, types[name], sorted(names), kind, fixed))
    assert not wrong, f"exposition and METRICS.md disagree: {sorted(set(map(str, wrong)))[:5]}"


# Documented families neither the sample tree nor a golden file serves: each is tested elsewhere or
# needs what the goldens lack (an expectations file, the daemon's process collector, a bond, a global
# pause driver). A family documented but served nowhere (renamed, no longer emitted) fails here.
NOT_IN_GOLDENS = {
    "rdma_exporter_device_excluded", "rdma_exporter_device_scrape_skipped", "process_cpu_seconds_total",
    "process_resident_memory_bytes", "process_virtual_memory_bytes", "process_start_time_seconds",
    "process_open_fds", "process_max_fds", "rdma_ethtool_global_pause_frames_total",
    "rdma_ethtool_global_pause_duration_seconds_total", "rdma_ethtool_global_pause_transitions_total",
    "rdma_ethtool_device_out_of_buffer_total", "rdma_ethtool_stat_<counter>_total", "rdma_expected_port_info",
    "rdma_expected_port_rate_bytes_per_second", "rdma_expected_port_link_width_lanes",
    "rdma_expected_netdev_speed_bytes_per_second", "rdma_expected_pcie_link_speed_transfers_per_second",
    "rdma_expected_pcie_link_width_lanes", "rdma_expected_device_present", "rdma_expected_port_present",
    "rdma_expected_pci_device_present", "rdma_netdev_bond_slave_info",
}  # fmt: skip


def test_every_documented_family_is_served_or_listed(sample_scrape: str) -> None:
    texts = [sample_scrape, *(path.read_text() for path in GOLDEN.glob("*.prom"))]
    served = {name for text in texts for name in re.findall(r"^# TYPE (\S+)", text, re.M)}
    unserved = {name for name in _documented_rows() if not any(family_pattern(name).fullmatch(s) for s in served)}
    assert unserved == NOT_IN_GOLDENS
