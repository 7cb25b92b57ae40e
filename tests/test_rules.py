"""The alert pack: promtool checks and unit tests, Alertmanager config and routing, and a static check
that every metric a rule reads is one the exporter really emits (on the sample tree).

Binaries (promtool, amtool) come from Debian's prometheus and prometheus-alertmanager packages; the
tests skip with the reason when one is missing and CI is not set.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rdma_exporter import metricsdoc
from rdma_exporter.collect import readers
from rdma_exporter.config import parse_config
from rdma_exporter.daemon import build_collector, build_registry
from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree

from conftest import (
    EARLY_BATCHES,
    PROMETHEUS_RELEASES,
    BatchRun,
    GatedRuns,
    PrometheusRelease,
    alternatives,
    params_of,
)

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules"
RULE_FILES = sorted(RULES.glob("*.rules.yml"))
RULE_TESTS = sorted((RULES / "tests").glob("*.test.yml"))
RUNBOOKS = ROOT / "docs" / "runbooks"
ALERTMANAGER = ROOT / "deploy" / "alertmanager"
RUNBOOK_BASE = "https://github.com/rdma-exporter/rdma-exporter/blob/main/docs/runbooks/"
SEVERITIES = ("critical", "warning", "info")
# Series Prometheus itself writes: each target's scrape series, and ALERTS for the alerts it evaluates.
SYNTHETIC = {"up", "scrape_duration_seconds", "ALERTS"}
# Metrics the exporter serves only for hardware the sample tree does not have (bonds, EFA and bnxt_re
# hw_counters): they must be in one of the golden expositions of tests/golden/, which the exporter's
# own tests keep equal to its output, or have their own row in METRICS.md, so that a rename is caught.
NOT_ON_SAMPLE_TREE = {
    "rdma_netdev_bond_slave_info",
    "rdma_port_hw_tx_bytes_total",
    "rdma_port_hw_rx_bytes_total",
    # irdma's names (tests/fixtures/sysfs/built-multi-driver), read where mlx5's are missing.
    "rdma_port_hw_ip4_in_octets_total",
    "rdma_port_hw_ip4_out_octets_total",
    "rdma_port_hw_ip6_in_octets_total",
    "rdma_port_hw_ip6_out_octets_total",
    "rdma_port_hw_cnp_ignored_total",
    "rdma_port_hw_cnp_sent_total",
    # Mainline bnxt_re's names (the same fixture tree), read where mlx5's are missing.
    "rdma_port_hw_to_retransmits_total",
    "rdma_port_hw_seq_err_naks_rcvd_total",
    "rdma_port_hw_missing_resp_total",
    "rdma_port_hw_rnr_naks_rcvd_total",
    "rdma_port_hw_tx_cnp_pkts_total",
    "rdma_port_hw_np_cnp_pkts_total",  # since bnxt_re's rename of August 2025 (bnxt_re1 there)
    "rdma_port_hw_rx_out_of_buffer_total",
    # Link-level 802.3x pause: mlx5 lists it only while global pause is on (the real ConnectX-6 Dx
    # captures in tests/fixtures/ethtool); the sample's RoCE ports run PFC instead.
    "rdma_ethtool_global_pause_duration_seconds_total",
    # Present only for a device that is excluded, or whose reads are stuck.
    "rdma_exporter_device_excluded",
    "rdma_exporter_device_scrape_skipped",
    "rdma_exporter_device_read_blocked_seconds",
}
# Alerts about a node whose expressions read device metrics but keep no device label.
PER_NODE_ALERTS = {
    "RdmaDeviceFirmwareMismatch",  # one ticket per node and board, its devices in the text
    "RdmaUserVerbsNotLoaded",  # a module of the node, not of a device
}
# Alerts on a state rather than a quantity: their value is 1 and the description names the state.
STATE_ALERTS = {
    "RdmaPortDown",
    "RdmaRocePortAdminDown",
    "RdmaPortVanished",
    "RdmaExpectedDeviceMissing",
    "RdmaExpectedPortMissing",
    "RdmaPortLinkLayerMismatch",
    "RdmaPortCounterSaturated",
    "RdmaExporterDown",
    "RdmaExporterCollectorFailing",
    "RdmaRoceEcnDisabled",
    "RdmaRocePfcDisabled",
    "RdmaDeviceUserVerbsMissing",
    "RdmaUserVerbsNotLoaded",
    # Exactly one drop: the description says "once" (the extrapolated count reads 1 to about 1.6,
    # which would print as 2).
    "RdmaPortLinkDowned",
}

# Alerts on the Prometheus configuration rather than a node: one per job, without an instance, so that
# Alertmanager's grouping by (cluster, instance) makes one ticket of them, not one per node.
PROMETHEUS_ALERTS = {"RdmaHistoryRulesMissing"}


# A guard against a hung promtool, not a speed limit: the largest unit test files, rewritten into two
# clusters, took about 55 s on a quiet 2-CPU machine with every rule loaded (one passed 120 s with
# other work beside it), and take about 20 s cut to the rules they read.
PROMTOOL_TIMEOUT: Final = 300


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # env: promtool_runs calls this from BackgroundRuns' threads (see there).
    return subprocess.run(
        args, capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT, cwd=cwd, check=False, env=dict(os.environ)
    )


def rules() -> Iterator[dict[str, Any]]:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            yield from group["rules"]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


ALERT_NAMES = sorted({rule["alert"] for rule in alerts()})


# --- promtool ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("release", PROMETHEUS_RELEASES, ids=lambda release: release.name)
def test_promtool_check_rules(release: PrometheusRelease) -> None:
    promtool = release.binary("promtool")
    result = run(promtool, "check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    # Lint findings (duplicate rules...) are printed without failing the exit code.
    assert "FAILED" not in result.stdout + result.stderr


def _promtool_batch(items: list[pytest.Function], scratch: Path) -> list[BatchRun]:
    """The `promtool test rules` runs of the two tests below, started in the background as the session
    starts (conftest.EARLY_BATCHES): promtool keeps about one core busy, and these runs were a third of
    the suite's CPU time before cut_to_the_rules_read (6.4 CPU-minutes then, 2.8 since)."""
    runs: list[BatchRun] = []
    for params in params_of(items, "test_promtool_unit_tests"):
        test_file = params["test_file"]
        runs.append((("unit", test_file.name), _run_unit_tests, (test_file, scratch / f"unit-{test_file.stem}")))
    for params in params_of(items, "test_rules_keep_clusters_apart"):
        test_file = params["test_file"]
        runs.append((("clusters", test_file.name), _run_in_two_clusters, (test_file, scratch / test_file.stem)))
    return runs


EARLY_BATCHES[__name__] = _promtool_batch


@pytest.fixture(scope="module")
def promtool_runs(early_batches: GatedRuns) -> GatedRuns:
    """The runs of _promtool_batch, two at a time from now on (one at a time before this module)."""
    early_batches.widen()
    return early_batches


# Each unit test file runs under both Prometheus lines: 3.x no longer counts a sample exactly at a
# window's start, so a test whose input steps at a window's edge passes under one and not the other.
# The 2.x line runs the files as written; the 3.x line runs them rewritten into two clusters
# (test_rules_keep_clusters_apart), which holds each test's expectations once per cluster, so a third
# run, the files as written under 3.x, would add nothing but a minute of the CI machine's time.
UNIT_TEST_RELEASE, CLUSTER_TEST_RELEASE = PROMETHEUS_RELEASES


# Where an expression or annotation names a series: a record's name, or ALERTS and its matchers.
_NAME_TOKEN = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_ALERTS_SELECTOR = re.compile(r"\bALERTS(?:_FOR_STATE)?\b\s*(\{[^}]*\})?")
_ALERTNAME_EQUALS = re.compile(r'\balertname\s*=\s*"([^"]*)"')
_NAMELESS_SELECTOR = re.compile(r"(?:^|[^\w:\s])\s*\{")


def _series_names_read(text: str, alert_names: set[str]) -> tuple[set[str], set[str]]:
    """The names in `text` that may be records (every name-like token: a surplus costs only time), and
    the alerts whose ALERTS series it reads: those its ALERTS selectors name with alertname="...", or
    every alert where a selector does not (`ALERTS{alertstate="firing"}`: all that fire)."""
    alerts: set[str] = set()
    for selector in _ALERTS_SELECTOR.finditer(text):
        named = _ALERTNAME_EQUALS.findall(selector.group(1) or "")
        alerts |= set(named) if named else alert_names
    return set(_NAME_TOKEN.findall(text)), alerts


def _selects_by_name(query: str, who: str) -> None:
    """`{job="x"}` or `{__name__=~"..."}` may read any record, and which ones no name says: the cut
    follows names, so it refuses such a query rather than drop a rule the query reads."""
    assert not _NAMELESS_SELECTOR.search(query) and "__name__" not in query, (
        f"{who} selects series by matchers alone: {query}"
    )


def cut_to_the_rules_read(document: dict[str, Any], test_dir: Path, scratch: Path) -> None:
    """Point a promtool test document (its rule_files relative to test_dir, as promtool reads them) at
    copies of its rule files in scratch that keep only the rules its tests read: the alerts they name,
    the records their expressions name, and what those rules' expressions, labels and annotations read
    in turn. promtool evaluates every rule of its files at every step of every test group, so this takes
    the unit tests from about 3 minutes of a CPU to about 1. A rule's outcome depends only on the series
    it reads, so the rules kept give what they give with every file loaded; rules keep their groups,
    their order and their group's settings, and group_eval_order its order."""
    alert_names: set[str] = set()
    rules_by_name: dict[str, list[tuple[int, int, int]]] = {}
    rule_files = [test_dir / name for name in document["rule_files"]]
    loaded = [yaml.safe_load(path.read_text()) for path in rule_files]
    for f, loaded_file in enumerate(loaded):
        for g, group in enumerate(loaded_file["groups"]):
            for r, rule in enumerate(group["rules"]):
                name = rule.get("record") or rule["alert"]
                if "alert" in rule:
                    alert_names.add(name)
                rules_by_name.setdefault(name, []).append((f, g, r))
    kept: set[tuple[int, int, int]] = set()
    wanted: list[str] = []

    def read(text: str) -> None:
        records, alerts = _series_names_read(text, alert_names)
        wanted.extend(name for name in records | alerts if name in rules_by_name)

    for test in document["tests"]:
        wanted.extend(case["alertname"] for case in test.get("alert_rule_test", []))
        for case in test.get("promql_expr_test", []):
            _selects_by_name(case["expr"], "a test's expression")
            read(case["expr"])
    while wanted:
        for where in rules_by_name.get(wanted.pop(), []):
            if where not in kept:
                kept.add(where)
                f, g, r = where
                rule = loaded[f]["groups"][g]["rules"][r]
                for query in rule_queries(rule):
                    _selects_by_name(query, rule.get("record") or rule["alert"])
                for text in [rule["expr"], *rule.get("labels", {}).values(), *rule.get("annotations", {}).values()]:
                    read(text)
    scratch.mkdir(parents=True, exist_ok=True)
    document["rule_files"] = []
    groups_kept: set[str] = set()
    for f, (path, loaded_file) in enumerate(zip(rule_files, loaded, strict=True)):
        groups = []
        for g, group in enumerate(loaded_file["groups"]):
            rules = [rule for r, rule in enumerate(group["rules"]) if (f, g, r) in kept]
            if rules:
                groups.append({**group, "rules": rules})
                groups_kept.add(group["name"])
        if groups:
            cut = scratch / f"read-{path.name}"
            cut.write_text(yaml.safe_dump({**loaded_file, "groups": groups}, sort_keys=False))
            document["rule_files"].append(cut.name)
    if "group_eval_order" in document:
        document["group_eval_order"] = [name for name in document["group_eval_order"] if name in groups_kept]


def test_cut_rule_files_keep_what_the_tests_read_and_no_more(tmp_path: Path) -> None:
    rule_file = tmp_path / "r.rules.yml"
    rule_file.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "records",
                        "interval": "5m",
                        "rules": [
                            {"record": "job:a", "expr": "sum by (job) (a_total)"},
                            {"record": "job:b", "expr": "job:a * 2"},
                            {"record": "job:unread", "expr": "c"},
                        ],
                    },
                    {
                        "name": "alerts",
                        "rules": [
                            {"alert": "B", "expr": "job:b > 1", "annotations": {"d": '{{ query "job:q" }}'}},
                            {"alert": "Named", "expr": "d > 0"},
                            {"alert": "Unread", "expr": "e > 0"},
                            {"alert": "Meta", "expr": 'ALERTS{alertname="Named"} unless ALERTS{alertname!="x"} > 2'},
                        ],
                    },
                    {"name": "query", "rules": [{"record": "job:q", "expr": "q"}]},
                    {"name": "other", "rules": [{"record": "job:other", "expr": "o"}]},
                ]
            }
        )
    )

    def kept(tests: list[dict[str, Any]]) -> tuple[dict[str, list[str]], list[str]]:
        order = ["other", "records", "alerts", "query"]
        document = {"rule_files": ["r.rules.yml"], "group_eval_order": order, "tests": tests}
        cut_to_the_rules_read(document, tmp_path, tmp_path / "cut")
        (cut,) = document["rule_files"]
        groups = yaml.safe_load((tmp_path / "cut" / cut).read_text())["groups"]
        assert all(group.get("interval") == ("5m" if group["name"] == "records" else None) for group in groups)
        names = {group["name"]: [rule.get("record") or rule["alert"] for rule in group["rules"]] for group in groups}
        return names, document["group_eval_order"]

    # An alert, what its expression and its annotation's query read, in their groups' order.
    assert kept([{"alert_rule_test": [{"alertname": "B"}]}]) == (
        {"records": ["job:a", "job:b"], "alerts": ["B"], "query": ["job:q"]},
        ["records", "alerts", "query"],
    )
    # ALERTS named by an equality matcher only; the other selector of Meta names none, so every alert.
    assert kept([{"promql_expr_test": [{"expr": 'ALERTS{alertname="Named"}'}]}])[0] == {"alerts": ["Named"]}
    assert kept([{"alert_rule_test": [{"alertname": "Meta"}]}])[0] == {
        "records": ["job:a", "job:b"],
        "alerts": ["B", "Named", "Unread", "Meta"],
        "query": ["job:q"],
    }
    assert kept([{"promql_expr_test": [{"expr": "job:b + job:other"}]}])[0] == {
        "records": ["job:a", "job:b"],
        "other": ["job:other"],
    }
    # A selector without a metric name could read any record: the cut refuses to guess.
    rules = yaml.safe_load(rule_file.read_text())
    rules["groups"][3]["rules"][0]["expr"] = 'count({job="rdma"})'
    rule_file.write_text(yaml.safe_dump(rules))
    with pytest.raises(AssertionError, match=r'job:other selects series by matchers alone: count\(\{job="rdma"\}\)'):
        kept([{"promql_expr_test": [{"expr": "job:other"}]}])
    rules["groups"][3]["rules"][0]["expr"] = '{__name__=~"job:.*"}'
    rule_file.write_text(yaml.safe_dump(rules))
    with pytest.raises(AssertionError, match="job:other selects series by matchers alone"):
        kept([{"promql_expr_test": [{"expr": "job:other"}]}])
    # The tests' own expressions alike.
    with pytest.raises(AssertionError, match=r"a test's expression selects series by matchers alone: \{job=\"x\"\}"):
        kept([{"promql_expr_test": [{"expr": '{job="x"}'}]}])


def _run_unit_tests(test_file: Path, scratch: Path) -> subprocess.CompletedProcess[str]:
    promtool = UNIT_TEST_RELEASE.binary("promtool")
    document = yaml.safe_load(test_file.read_text())
    cut_to_the_rules_read(document, test_file.parent, scratch)
    (scratch / test_file.name).write_text(yaml.safe_dump(document, sort_keys=False))
    return run(promtool, "test", "rules", test_file.name, cwd=scratch)


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests(test_file: Path, promtool_runs: GatedRuns) -> None:
    """Every unit test file as written, under the 2.x line (the 3.x line: test_rules_keep_clusters_apart),
    against the rules it reads (cut_to_the_rules_read)."""
    result = promtool_runs.result(("unit", test_file.name))
    assert result.returncode == 0, result.stdout + result.stderr


HISTORY_RULES = RULES / "rdma-history.rules.yml"


def test_the_history_lag_test_runs_without_the_history_rules() -> None:
    """history-lag.test.yml gives the history records as input, as Prometheus writes them (every 5
    minutes, behind their sources): promtool, which evaluates every group at every step, would
    otherwise write them at once and no test would see the lag."""
    lag_test = yaml.safe_load((RULES / "tests" / "history-lag.test.yml").read_text())
    assert HISTORY_RULES.name not in " ".join(lag_test["rule_files"])
    assert "rdma-exporter.history.rules" not in lag_test["group_eval_order"]


def test_every_day_of_history_is_read_with_the_last_minutes_of_its_source() -> None:
    """The history group writes each source's 10-minute maxima and, after them, the day's maximum of
    those. Elsewhere a day is only ever read as the day's maxima of the last 10 minutes, with a selector,
    beside its source's last 10 minutes with the same selector and offset (which the history group may not have
    caught up with); nothing else reads a day or more, nor the 10-minute maxima themselves. An offset reads
    the day as it stood then (RdmaDeviceNameMovedWhileAway: before a node's absence)."""
    (group,) = yaml.safe_load(HISTORY_RULES.read_text())["groups"]
    assert group["interval"] == "5m"
    ten_minutes: dict[str, str] = {}  # record -> its source
    day: dict[str, str] = {}  # record -> the source of the 10-minute maxima it reads
    for rule in group["rules"]:
        # Windows that overlap: a sample written late for one evaluation is in the next one.
        if match := re.fullmatch(r"max_over_time\((\S+)\[10m\]\)", rule["expr"]):
            ten_minutes[rule["record"]] = match.group(1)
        else:
            # 23h40m of 10-minute maxima, read over the last 10 minutes: a day of the source.
            match = re.fullmatch(r"max_over_time\((\S+)\[23h40m\]\)", rule["expr"])
            assert match and match.group(1) in ten_minutes, rule
            assert rule["record"] == f"{match.group(1)}_max1d"
            day[rule["record"]] = ten_minutes[match.group(1)]
    assert len(ten_minutes) == 11 and len(day) == 11
    problems = []
    # The rules' expressions and the queries of their annotations (run each time a firing alert is
    # evaluated); a subquery's range counts as a window too.
    all_rules = list(rules())
    queries = [
        (rule.get("record") or rule.get("alert"), query, rule.get("record"))
        for rule in all_rules
        for query in rule_queries(rule)
    ]
    assert len(queries) > len(all_rules)
    for name, expr, record in queries:
        if record in ten_minutes or record in day:
            continue
        # An alert's own firing state over 12 hours (RdmaPortLinkDropsRepeated pages once in them) reads the
        # few ALERTS series of one alert, not a day of a source.
        own = re.sub(rf'ALERTS\{{alertname="{re.escape(name or "")}"[^}}]*\}}\[12h\]', "ALERTS[own]", expr)
        if re.search(r"\[(\d+[dwy]|\d{2,}h|\d{4,}m|\d{5,}s)(:\w*)?\]|\[\d+[dhms]\d", own):
            problems.append(f"{name} reads a day of its source")
        if read := [record for record in re.findall(r"[\w:]+", expr) if record in ten_minutes]:
            problems.append(f"{name} reads the 10-minute maxima {read}, not the day's")
        reads = re.findall(r"(\w+)\(([\w:]+)(\{[^}]*\})?\[(\w+)(?::\w*)?\]((?: offset \w+)?)\)", expr)
        if name == "RdmaHistoryRulesMissing":  # whether there is any, not what it says
            continue
        days = Counter((day[record], selector, offset) for _, record, selector, _, offset in reads if record in day)
        # Read any other way (another window or function, an instant value) a day's maximum would hold a
        # day of other than a day: every mention of one must be such a read.
        proper = [record for function, record, _, window, _ in reads if (function, window) == ("max_over_time", "10m")]
        if sum(expr.count(record) for record in day) != sum(record in day for record in proper):
            problems.append(f"{name} reads a day's maximum other than over the last 10 minutes")
        tails = Counter((record, selector, offset) for _, record, selector, window, offset in reads if window == "10m")
        if days - tails:
            problems.append(f"{name} reads a day of history without the last minutes of {sorted(days - tails)}")
        # Where the maximum's value is taken (`max by` over the day and the tail), the tail needs a label
        # of its own: `or` would drop it for a series that also has a day's maximum.
        if re.search(r"max(?: by \([^)]*\))? ?\(\s*max_over_time\([\w:]+_max1d", expr):
            for source, selector, offset in days:
                tail = f"max_over_time({source}{selector}[10m]{offset})"
                labelled = f'label_replace({tail}, "rdma_history_window", "10m", "", "")'
                if expr.count(tail) != expr.count(labelled):
                    problems.append(f"{name} takes the maximum of {source}{selector} without labelling its tail")
    assert problems == []


def _with_cluster(selector: str, cluster: str) -> str:
    """`name{a="b"}` with a cluster label added."""
    name, _, inner = selector.partition("{")
    inner = inner.rstrip("}").strip()
    return f'{name}{{cluster="{cluster}"{"," + inner if inner else ""}}}'


# The same node names in two clusters, as a global ruler (Thanos Ruler, Mimir) sees them.
CLUSTERS = ("cx", "cy")


def _in_two_clusters(test: dict[str, Any]) -> None:
    """Rewrite one promtool test in place: every input series once per cluster of CLUSTERS, and every
    expected alert and sample once per cluster. Alerts' annotations stay the same: both clusters have the
    same values, so a description only differs if it quotes the wrong one (e.g. a query that leaves
    cluster out returns two series and fails on `first`'s choice or the joins' many-to-many)."""
    test["input_series"] = [
        {**series, "series": _with_cluster(series["series"], cluster)}
        for cluster in CLUSTERS
        for series in test.get("input_series", [])
    ]
    for case in test.get("alert_rule_test", []):
        case["exp_alerts"] = [
            {**alert, "exp_labels": {**alert.get("exp_labels", {}), "cluster": cluster}}
            for cluster in CLUSTERS
            for alert in case.get("exp_alerts") or []
        ]
    for case in test.get("promql_expr_test", []):
        case["exp_samples"] = [
            {**sample, "labels": _with_cluster(sample["labels"], cluster)}
            for cluster in CLUSTERS
            for sample in case.get("exp_samples") or []
        ]


def _run_in_two_clusters(test_file: Path, scratch: Path) -> tuple[int, subprocess.CompletedProcess[str]]:
    """How many of the file's tests were put in two clusters, and promtool's run of the rewritten file."""
    promtool = CLUSTER_TEST_RELEASE.binary("promtool")
    document = yaml.safe_load(test_file.read_text())
    cut_to_the_rules_read(document, test_file.parent, scratch)
    rewritten = 0
    for test in document["tests"]:
        if not any("cluster=" in series["series"] for series in test.get("input_series", [])):
            _in_two_clusters(test)
            rewritten += 1
    copy = scratch / test_file.name
    copy.write_text(yaml.safe_dump(document, sort_keys=False))
    return rewritten, run(promtool, "test", "rules", copy.name, cwd=scratch)


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda p: p.name)
def test_rules_keep_clusters_apart(test_file: Path, promtool_runs: GatedRuns) -> None:
    """The unit tests again with every input series in two clusters whose node names repeat. Each
    record and alert must carry `cluster` through, or Alertmanager's grouping and inhibitions
    (equal: [cluster, ...]) and the cluster-level records lose it (a `by (...)` or one-to-one `on (...)`
    without group_left drops it); and every join and description query must match on it, or the two
    clusters' ports meet in one match group. Tests that already set clusters of their own are left as
    they are. Under the 3.x line: this is also each unit test's only run under 3.x (see UNIT_TEST_RELEASE)."""
    rewritten, result = promtool_runs.result(("clusters", test_file.name))
    assert rewritten > 0
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr


_QUERY_PRINTF = re.compile(r"printf `([^`]*)`((?:\s+\$labels\.\w+)+)\s*\|\s*query")


def test_description_queries_select_the_alerts_own_target() -> None:
    """A description that quotes another series selects it by the alert's cluster, job and instance, with
    one argument per %s. Without cluster, under a global ruler, it can quote a node of the same name in
    another cluster; the two-cluster unit tests give both clusters the same values, so only this check
    sees a query that leaves cluster out."""
    problems = []
    queries = 0
    for alert in alerts():
        for key, text in alert.get("annotations", {}).items():
            for template, arguments in _QUERY_PRINTF.findall(text):
                queries += 1
                names = [argument.removeprefix("$labels.") for argument in arguments.split()]
                selected = re.findall(r'(\w+)="%s"', template)
                if template.count("%s") != len(names) or selected != names:
                    problems.append(f"{alert['alert']} {key}: {template} gets {names}")
                elif not {"cluster", "job", "instance"} <= set(selected):
                    problems.append(f"{alert['alert']} {key}: {template} does not select cluster, job, instance")
    assert queries > 0
    assert problems == []


def test_every_alert_is_unit_tested_firing_and_quiet() -> None:
    """Each alert appears with a non-empty exp_alerts somewhere, and with an empty one somewhere. promtool
    demands the exact set of firing alerts, so the healthy series of a case checked for firing stay quiet
    too; an explicit quiet case also pins the alert silent where it has nothing to say (test review)."""
    fired: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert sorted(set(ALERT_NAMES) - fired) == []
    assert sorted(set(ALERT_NAMES) - quiet) == []


def test_every_record_is_unit_tested_with_samples() -> None:
    """Each record is checked by value somewhere: in a promql_expr_test with samples, or inside an alert
    that a unit test fires, whose labels and value depend on it. Otherwise neither its maths nor
    test_rules_keep_clusters_apart can judge it."""
    expressions: dict[str, list[str]] = {}  # record -> its expressions (a record may have several rules)
    for rule in rules():
        if "record" in rule:
            expressions.setdefault(rule["record"], []).append(rule["expr"])

    def read_in(expr: str) -> set[str]:
        return {name for name in expressions if re.search(re.escape(name) + r"(?![\w:])", expr)}

    fired: set[str] = set()
    checked: set[str] = set()
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            fired |= {case["alertname"] for case in test.get("alert_rule_test", []) if case.get("exp_alerts")}
            for case in test.get("promql_expr_test", []):
                if case.get("exp_samples"):
                    checked |= read_in(case["expr"])

    # Records an alert that fires in a test reads, and the records those read, and so on.
    pending = set().union(*(read_in(rule["expr"]) for rule in alerts() if rule["alert"] in fired))
    through_alerts: set[str] = set()
    while pending:
        name = pending.pop()
        if name not in through_alerts:
            through_alerts.add(name)
            pending |= set().union(*(read_in(expr) for expr in expressions[name]))
    checked |= through_alerts
    assert sorted(set(expressions) - checked) == []


def test_the_hung_read_threshold_is_the_unresponsive_alerts() -> None:
    # A read blocked HUNG_READ_SECONDS is logged as a hang "whatever the quiet period" because that is when
    # RdmaDeviceUnresponsive pages: the log and the page must agree on what a hang is.
    (expr,) = [rule["expr"] for rule in alerts() if rule["alert"] == "RdmaDeviceUnresponsive"]
    threshold = re.search(r"\[5m\]\)\)\s*>\s*(\d+)", expr)
    assert threshold is not None, expr
    assert float(threshold.group(1)) == readers.HUNG_READ_SECONDS


# --- alert metadata ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", alerts(), ids=lambda r: f"{r['alert']}-{r['labels']['severity']}")
def test_alert_metadata(rule: dict[str, Any]) -> None:
    name = rule["alert"]
    assert re.fullmatch(r"Rdma[A-Z][A-Za-z]+", name)
    assert "for" in rule, f"{name} has no for:"
    # A failed scrape must not resolve a firing page (link.test.yml shows it on RdmaPortDown).
    assert rule.get("keep_firing_for") == "2m", f"{name} has no keep_firing_for: 2m"
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    # summary is static so that notifications group and dedupe; description carries the specifics.
    assert "{{" not in annotations["summary"]
    if name not in PROMETHEUS_ALERTS:
        assert "$labels.instance" in annotations["description"]
        if "device" in rule["expr"] and name not in PER_NODE_ALERTS and not name.startswith("RdmaExporter"):
            assert "$labels.device" in annotations["description"]
    if name not in STATE_ALERTS:
        assert "$value" in annotations["description"], f"{name} does not show the value it fired on"
    assert annotations["runbook_url"] == f"{RUNBOOK_BASE}{name}.md"


@pytest.mark.parametrize("name", ALERT_NAMES)
def test_runbook_exists_and_covers_the_basics(name: str) -> None:
    page = RUNBOOKS / f"{name}.md"
    assert page.is_file(), f"missing runbook {page}"
    text = page.read_text()
    assert text.startswith(f"# {name}\n")
    headings = set(re.findall(r"^## .+$", text, re.MULTILINE))
    for section in ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation", "## Escalation", "## Threshold"):
        assert section in headings, f"{page.name} lacks the heading {section}"


def test_the_history_runbook_counts_the_shipped_day_records() -> None:
    """RdmaHistoryRulesMissing's runbook has the on-call engineer count the day records in the loaded file;
    a count that lags the shipped file sends them after a rules file that is fine."""
    stated = re.findall(r"should count (\d+)", (RUNBOOKS / "RdmaHistoryRulesMissing.md").read_text())
    shipped = len(re.findall(r"record: .*max10m_max1d", HISTORY_RULES.read_text()))
    assert stated == [str(shipped)]


def test_no_orphan_runbooks() -> None:
    pages = {p.stem for p in RUNBOOKS.glob("*.md") if p.stem != "README"}
    assert pages == set(ALERT_NAMES)


def test_the_readme_counts_the_alerts() -> None:
    counted = re.findall(r"(\d+) alerts for", (ROOT / "README.md").read_text())
    assert counted == [str(len(ALERT_NAMES))]


# --- alertmanager -----------------------------------------------------------------------------------


@pytest.mark.parametrize("release", PROMETHEUS_RELEASES, ids=lambda release: release.name)
def test_amtool_check_config(release: PrometheusRelease) -> None:
    amtool = release.binary("amtool")
    result = run(amtool, "check-config", str(ALERTMANAGER / "alertmanager.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


ROUTE_CASES = yaml.safe_load((ALERTMANAGER / "routes-tests.yaml").read_text())


@pytest.mark.parametrize("case", ROUTE_CASES, ids=lambda c: "-".join(f"{v}" for v in c["labels"].values())[:60])
@pytest.mark.parametrize("release", PROMETHEUS_RELEASES, ids=lambda release: release.name)
def test_amtool_routes(case: dict[str, Any], release: PrometheusRelease) -> None:
    amtool = release.binary("amtool")
    labels = [f"{key}={value}" for key, value in case["labels"].items()]
    result = run(
        amtool,
        "config",
        "routes",
        "test",
        f"--config.file={ALERTMANAGER / 'alertmanager.yml'}",
        f"--verify.receivers={','.join(case['receivers'])}",
        *labels,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_notifications_are_grouped_per_node_and_resolve() -> None:
    """What a routes test cannot see: the header's promise of one page per node (not one per cluster, where
    a second node's fault would only join an incident already acknowledged), and receivers told when an
    alert resolves, so that a pager's incident closes by itself."""
    config = yaml.safe_load((ALERTMANAGER / "alertmanager.yml").read_text())
    routes = [config["route"], *config["route"]["routes"]]
    fleet_routes = 0
    for route in routes:
        group_by = route.get("group_by", config["route"]["group_by"])
        assert "..." not in group_by, route
        names = [m.split("=~", 1)[1].strip('"') for m in route.get("matchers", []) if m.startswith("alertname=~")]
        # Every name a route lists is a shipped alert: a misspelt one falls through to the per-node
        # route, and both routes end at the same receiver, which no routes test tells apart.
        for branch in (branch for name in names for branch in alternatives(name)):
            assert branch in ALERT_NAMES, f"{branch} in {route['matchers']} is no shipped alert"
        if names:
            # Causes shared across nodes (a certificate, a network policy, a rollout): one ticket a job
            # and alert. Never a page: a paging route must stay per node.
            assert {"cluster", "job", "alertname"} <= set(group_by), route
            assert 'severity="warning"' in route["matchers"], route
            fleet_routes += 1
        else:
            assert {"cluster", "instance"} <= set(group_by), route
    assert fleet_routes == 2
    for receiver in config["receivers"]:
        for webhook in receiver.get("webhook_configs", []):
            assert webhook.get("send_resolved", True) is True, receiver["name"]


def test_every_severity_routes_somewhere_deliberate() -> None:
    cases = {case["labels"].get("severity") for case in ROUTE_CASES}
    assert set(SEVERITIES) <= cases


# --- static metric names ----------------------------------------------------------------------------

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(\s*\()?")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, label names
    (inside {...} or grouping clauses), strings, durations or numbers."""
    text = _STRINGS.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = _GROUPING.sub("", text)
    text = re.sub(r"\b\d+(\.\d+)?([eE][+-]?\d+)?\b", "", text)
    names = set()
    for ident, call in _IDENT.findall(text):
        if call or ident in _KEYWORDS or ident in ("inf", "nan", "Inf", "NaN"):
            continue
        names.add(ident)
    return names


def template_queries(text: str) -> list[str]:
    """The PromQL inside `printf `...` | query` calls of an annotation template (placeholders emptied)."""
    return [q.replace("%s", "x") for q in re.findall(r"printf `([^`]*)`", text)]


def rule_queries(rule: dict[str, Any]) -> list[str]:
    """The rule's expression and the queries of its annotations."""
    return [rule["expr"], *(query for text in rule.get("annotations", {}).values() for query in template_queries(text))]


def test_metric_names_parser() -> None:
    expr = (
        'rate(a_total{x="b:c"}[5m]) / on (job, device) group_left () (b > 0) and on (job) '
        'max without (d) (c:d:e) unless label_replace(f == 1, "g", "$1", "state", "(.+)") * 8 > 1e-12'
    )
    assert metric_names(expr) == {"a_total", "b", "c:d:e", "f"}


def referenced_metrics() -> dict[str, set[str]]:
    """Metric name -> alert or record names that read it (expressions and annotation queries)."""
    used: dict[str, set[str]] = {}
    for rule in rules():
        owner = rule.get("alert") or rule["record"]
        for expr in rule_queries(rule):
            for name in metric_names(expr):
                used.setdefault(name, set()).add(owner)
    return used


METRICS_DOC = (Path(__file__).resolve().parent.parent / "METRICS.md").read_text()
GOLDEN = "".join(p.read_text() for p in sorted((Path(__file__).resolve().parent / "golden").glob("*.prom")))
EXPECTED_CONFIG = (Path(__file__).resolve().parent.parent / "deploy/examples/expected-sample-node.yml").read_text()


@pytest.fixture(scope="module")
def emitted_labels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, set[str]]]:
    """Sample name -> label name -> values, for every sample the exporter emits on the sample tree with
    expectations and ethtool captures."""
    dest = tmp_path_factory.mktemp("sample")
    sys_root = build_tree(dest, SAMPLE_SPEC)
    document = yaml.safe_load(EXPECTED_CONFIG)
    # The example expects by name; one entry by PCI address (mlx5_0's) adds the series those give.
    document["collector"]["expected"]["ports"].append({"pci_addresses": "0000:18:00.0", "port": 2})
    config = parse_config(document, "test")
    config = replace(config, sysfs=sys_root, ethtool_dir=dest / "ethtool")
    registry = build_registry(build_collector(config))
    generate_latest(registry)
    # A counter file vanishing between scrapes (driver reload) makes the read-error counter appear,
    # which the exporter only emits once something failed.
    next((sys_root / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "hw_counters").glob("out_of_*")).unlink()
    text = generate_latest(registry).decode()
    out: dict[str, dict[str, set[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = out.setdefault(sample.name, {})
            for key, value in sample.labels.items():
                labels.setdefault(key, set()).add(value)
    return out


@pytest.fixture(scope="module")
def emitted(emitted_labels: dict[str, dict[str, set[str]]]) -> set[str]:
    """Every sample name the exporter emits on the sample tree."""
    return set(emitted_labels)


def test_rules_read_only_metrics_the_exporter_emits(emitted: set[str]) -> None:
    """A renamed metric would silently disarm an alert; this catches it against the real exposition."""
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    used = referenced_metrics()
    problems = []
    for name, owners in sorted(used.items()):
        if ":" in name:
            if name not in recorded:
                problems.append(f"{name} (used by {', '.join(sorted(owners))}) is not a recording rule")
        elif name in NOT_ON_SAMPLE_TREE:
            if not re.search(rf"^{name}{{", GOLDEN, re.MULTILINE) and f"| `{name}` |" not in METRICS_DOC:
                problems.append(f"{name} (used by {', '.join(sorted(owners))}) is neither in METRICS.md nor golden")
        elif name not in emitted and name not in SYNTHETIC:
            problems.append(f"{name} (used by {', '.join(sorted(owners))}) is not emitted")
    assert problems == []


# Labels Prometheus attaches to a target (and the tests use for one), not the exporter.
TARGET_LABELS = {"job", "instance", "cluster", "rack", "pod"}  # pod: the ServiceMonitor's
_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$")
_PAIR = re.compile(r'([a-zA-Z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"')


# Label sets older exporters served, which a rule still reads so that rules and exporters can be upgraded
# in either order (docs/operations.md, upgrading the exporter); their unit tests feed them on purpose.
OLDER_EXPORTERS_LABELS: dict[str, set[str]] = {
    "rdma_pcie_aer_reports_total": {"device", "severity"},  # before the AER class became error_class
    "rdma_exporter_device_read_blocked_seconds": {"device"},  # before netdev stalls were reported apart
}


def test_unit_test_series_carry_the_exported_labels(emitted_labels: dict[str, dict[str, set[str]]]) -> None:
    """Input series of the promtool tests look like what the exporter serves: the same label names (a
    missing `direction` once hid that alerts and aggregates carry it) and a `direction` the exporter uses
    for that metric; for families the sample tree does not serve, the label names METRICS.md declares."""
    problems = []
    # Families the sample tree does not serve (bonds, stuck reads, other vendors' counters) are held to
    # the label names METRICS.md declares for them.
    declared = [
        (re.compile(re.escape(pattern).replace(re.escape("<counter>"), r"\w+")), set(labels))
        for pattern, labels in metricsdoc.declared_labels().items()
    ]
    checked_declared = 0
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for series in test.get("input_series", []):
                match = _SERIES.match(series["series"])
                assert match, f"{path.name}: cannot parse {series['series']}"
                name, labels = match[1], dict(_PAIR.findall(match[2]))
                real = emitted_labels.get(name, {})
                if name in emitted_labels:
                    expected, source = set(real), "the exporter serves"
                else:
                    expected = next((names for pattern, names in declared if pattern.fullmatch(name)), None)
                    if expected is None:
                        continue  # not the exporter's (up, records): the name checks above
                    source = "METRICS.md declares"
                    checked_declared += 1
                if set(labels) - TARGET_LABELS == OLDER_EXPORTERS_LABELS.get(name):
                    continue
                if set(labels) - TARGET_LABELS != expected:
                    problems.append(
                        f"{path.name}: {series['series']} has labels {sorted(set(labels) - TARGET_LABELS)}, "
                        f"{source} {sorted(expected)}"
                    )
                elif "direction" in labels and real and labels["direction"] not in real["direction"]:
                    problems.append(
                        f"{path.name}: {series['series']}: the exporter's direction is one of "
                        f"{sorted(real['direction'])}"
                    )
    assert checked_declared > 100  # bond slaves, stuck reads, other vendors' counters...
    assert problems == []
