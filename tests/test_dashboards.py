"""The Grafana dashboards in grafana/: linted like grafana/dashboard-linter would, then proven on real data.

The lint implements the useful dashboard-linter rules in Python (templated datasource, job and instance
variables, every panel titled, described, with a unit and targets, rate queries on `$__rate_interval`,
counters only inside rate/irate/increase, job/instance matchers on every selector) plus this project's
conventions: pinned unique uids and panel ids, runbook links that resolve, threshold colours equal to the
alert thresholds, and JSON identical to what grafana/build.py generates.

The end-to-end part starts the exporter on the sample tree (with an expected topology, so that the
expected-vs-observed panels have both sides) and a real Prometheus with the repository's rules, then
sends every query of every panel, with the template variables substituted as Grafana would for "All",
to /api/v1/query. Each must parse and return data, except in panels whose description says
"Empty while ..." (tables of problems on a healthy node). Every metric name must be something the
exporter serves, a recording rule of rules/, or a series Prometheus itself writes.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from rdma_exporter.metricsdoc import declared_labels
from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree

from conftest import PROMETHEUS_RELEASES, PrometheusRelease, family_pattern, free_port, promtool_failures, samples

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "grafana"
DASHBOARD_FILES = sorted((GRAFANA / "dashboards").glob("*.json"))
UIDS_BY_STEM = {path.stem: f"rdma-{path.stem}" for path in DASHBOARD_FILES}
RUNBOOK_DIR = ROOT / "docs" / "runbooks"
RUNBOOK_URL = "https://github.com/rdma-exporter/rdma-exporter/blob/main/docs/runbooks/"
DS = {"type": "prometheus", "uid": "${datasource}"}
PINNED_UIDS = {
    "fabric-overview.json": "rdma-fabric-overview",
    "node-detail.json": "rdma-node-detail",
    "roce-congestion.json": "rdma-roce-congestion",
}
VARIABLE_ORDER = ["datasource", "job", "cluster", "instance", "device", "port"]

# Units Grafana knows (dashboard-linter's list, trimmed to the categories a network dashboard can use).
VALID_UNITS = {
    "none", "short", "percent", "percentunit", "sci", "string", "bool", "bool_on_off", "bool_yes_no",
    "bytes", "decbytes", "bits", "decbits", "pps", "binBps", "Bps", "binbps", "bps", "KBs", "Kbits", "MBs",
    "Mbits", "GBs", "Gbits", "TBs", "Tbits", "hertz", "ns", "µs", "ms", "s", "m", "h", "d", "dtdurations",
    "cps", "ops", "reqps", "rps", "wps", "iops", "cpm", "opm", "dateTimeAsIso", "dateTimeFromNow",
    "celsius",  # the HCA temperatures (Grafana's temperature category)
}  # fmt: skip
PANEL_TYPES = {"stat", "table", "timeseries", "state-timeline", "bargauge", "row"}
# Series that Prometheus writes itself, not the exporter or the rules.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "ALERTS"}
SEVERITY_COLOURS = {"warning": "orange", "critical": "red"}
EPSILON_MAX = 1e-6  # a threshold step at or below this stands for an alert's "> 0"
MAY_BE_EMPTY = re.compile(r"\bEmpty while\b")
COLOURS_FOLLOW = re.compile(r"Colours follow (Rdma\w+)")
MAX_MAY_BE_EMPTY = 4
# Queries the sample tree has no series for, though a fleet has, by "dashboard / panel / refId": why.
EMPTY_ON_THE_SAMPLE = {
    "node-detail / Link events / C": "its RoCE netdevs are all mlx5's, whose PHY link-down events count instead",
}
# Target labels that not every target has: an empty {{cluster}} at the start of a legend leaves a blank.
OPTIONAL_LABELS = ("cluster",)
# A port's netdev drawn after it, where a query holds both link layers: a RoCE LAG's slaves share the bond's
# device and port and tell apart by netdev only; an InfiniBand port has none, and leaves that place blank.
PORT_NETDEV = "{{port}} {{netdev}}"
# Port-level series that a sum or count turns into a number of ports or links.
PORT_COUNT_SERIES = {
    "rdma_port_state_id", "rdma_port_state", "rdma_port_physical_state_id", "rdma_port_physical_state",
    "instance_device_port:rdma_port_link_down_events:increase1h",
    "instance_device_port:rdma_port_link_error_recovery:increase1h",
}  # fmt: skip
AGGREGATED = re.compile(r"^\s*(?:sum|count)\b")
SKIPS_VFS = re.compile(r"unless on \(cluster, job, instance, device\) rdma_device_sriov_virtual_function\{[^}]*\} == 1")
# Panels on recording rules aggregated above the node (no instance label) say so.
WHOLE_CLUSTERS = re.compile(r"\bwhole clusters\b")

RATE_INTERVAL = "15s"  # what Grafana would pick for $__rate_interval: >= 4 x the 1 s scrape interval
SCRAPE_INTERVAL = "1s"
# Seconds for Prometheus to have scraped enough and evaluated the rules for every panel. Under load one pass
# over the panels takes tens of seconds, and a single scrape missing its 0.5 s deadline fails the pass it
# falls in: at 45 s only one or two passes fitted (flaky-test review). A clean pass ends the wait at once.
DEADLINE = 120.0


def assert_settles(problems: Callable[[], list[str]]) -> None:
    """Poll `problems` until it finds none (Prometheus catching up), and fail with its last list if it
    still finds some after DEADLINE."""
    deadline, last = time.monotonic() + DEADLINE, ["not run"]
    while time.monotonic() < deadline:
        last = problems()
        if not last:
            break
        time.sleep(1)
    assert not last, "\n".join(last)

# --- PromQL tokens -----------------------------------------------------------------------------------

TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<duration>\$__\w+|(?:\d+(?:ms|[smhdwy]))+\b)
  | (?P<number>0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|==|!=|<=|>=|[-+*/%^<>=(){}\[\],:@])
    """,
    re.VERBOSE,
)
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
                "topk", "quantile"}  # fmt: skip
COUNTER_FUNCTIONS = {"rate", "irate", "increase"}


def tokenize(expr: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    while position < len(expr):
        match = TOKEN.match(expr, position)
        if match is None:
            raise ValueError(f"cannot tokenize {expr[position : position + 30]!r}")
        assert match.lastgroup is not None
        if match.lastgroup != "space":
            tokens.append((match.lastgroup, match.group()))
        position = match.end()
    return tokens


@dataclass
class Selector:
    name: str
    matchers: dict[str, tuple[str, str]]
    range: str | None  # the [range] right after the selector
    function: str | None  # the function the range selector is the direct argument of
    # The whole right-hand operand of `and` or `unless`, or the whole argument of `group`: only which
    # series exist is read, not their values.
    presence: bool = False


def closing(tokens: list[tuple[str, str]], start: int, opening: str, close: str) -> int:
    depth = 0
    for index in range(start, len(tokens)):
        if tokens[index][1] == opening:
            depth += 1
        elif tokens[index][1] == close:
            depth -= 1
            if depth == 0:
                return index
    raise ValueError(f"unbalanced {opening}{close}")


def set_operand(tokens: list[tuple[str, str]], start: int, end: int) -> bool:
    """Whether tokens[start:end] are the whole right-hand operand of `and` or `unless` (with an optional
    `on (...)` or `ignoring (...)`): set operators bind less tightly than anything but `or`, and left to
    right, so the operand ends at the end, a closing parenthesis or the next set operator."""
    while (start >= 1 and tokens[start - 1][1] == "(" and end < len(tokens) and tokens[end][1] == ")"
           and (start < 2 or tokens[start - 2][0] != "ident" or tokens[start - 2][1] in KEYWORDS)):  # fmt: skip
        start, end = start - 1, end + 1  # (x), not f(x)
    if end < len(tokens) and tokens[end][1] not in (")", "and", "or", "unless"):
        return False
    before = start - 1
    if before >= 0 and tokens[before][1] == ")":
        depth = 0
        while before >= 0:
            depth += {")": 1, "(": -1}.get(tokens[before][1], 0)
            if depth == 0:
                break
            before -= 1
        if before < 1 or tokens[before - 1][1] not in ("on", "ignoring"):
            return False
        before -= 2
    return before >= 0 and tokens[before][1] in ("and", "unless")


def group_operand(tokens: list[tuple[str, str]], start: int, end: int) -> bool:
    """Whether tokens[start:end] are the whole argument of `group` (`group (x)`, `group by (...) (x)`,
    `group without (...) (x)`), whose value is 1 for every series whatever x's values."""
    if start < 2 or tokens[start - 1][1] != "(" or end >= len(tokens) or tokens[end][1] != ")":
        return False
    before = start - 2
    if tokens[before][1] == ")":  # the label list of `by` or `without`
        while before >= 0 and tokens[before][1] != "(":
            before -= 1
        if before < 2 or tokens[before - 1][1] not in ("by", "without"):
            return False
        before -= 2
    return before >= 0 and tokens[before] == ("ident", "group")


def selectors(expr: str) -> list[Selector]:
    """Every vector selector of a PromQL expression, with its matchers and enclosing range function."""
    tokens = tokenize(expr)
    found: list[Selector] = []
    index = 0
    while index < len(tokens):
        kind, text = tokens[index]
        following = tokens[index + 1][1] if index + 1 < len(tokens) else ""
        if kind == "ident" and text in LABEL_LIST_KEYWORDS and following == "(":
            index = closing(tokens, index + 1, "(", ")") + 1
            continue
        is_call = following == "(" or (text in AGGREGATIONS and following in ("by", "without"))
        if (kind == "ident" and text not in KEYWORDS and not is_call) or text == "{":
            name = text if kind == "ident" else ""
            end = index + 1 if kind == "ident" else index
            matchers: dict[str, tuple[str, str]] = {}
            if end < len(tokens) and tokens[end][1] == "{":
                stop = closing(tokens, end, "{", "}")
                body = tokens[end + 1 : stop]
                for at in range(0, len(body), 4):
                    label, op, value = body[at][1], body[at + 1][1], body[at + 2][1]
                    matchers[label] = (op, value[1:-1])
                end = stop + 1
            window = None
            if end < len(tokens) and tokens[end][1] == "[":
                window = tokens[end + 1][1]
                end = closing(tokens, end, "[", "]") + 1
            function = None
            if window and index >= 2 and tokens[index - 1][1] == "(" and tokens[index - 2][0] == "ident":
                function = tokens[index - 2][1]
            # `x_total > 0` after `and`/`unless` asks only whether the counter has counted since it reset.
            counted = [text for _, text in tokens[end : end + 2]] == [">", "0"]
            presence = (
                set_operand(tokens, index, end)
                or (counted and set_operand(tokens, index, end + 2))
                or group_operand(tokens, index, end)
            )
            found.append(Selector(name, matchers, window, function, presence))
            index = end
            continue
        index += 1
    return found


LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[a-zA-Z_]\w*)\)$")


def test_tokenizer_finds_selectors_matchers_and_functions() -> None:
    expr = (
        'sum by (device) (rate(a_total{job=~"$job", x="y"}[$__rate_interval])) / on (job) group_left () '
        "max without (port) (b >= bool 4) or vector(0) and increase(c_total[15m]) > 1e-12"
    )
    found = {s.name: s for s in selectors(expr)}
    assert set(found) == {"a_total", "b", "c_total"}
    assert found["a_total"].matchers == {"job": ("=~", "$job"), "x": ("=", "y")}
    assert (found["a_total"].range, found["a_total"].function) == ("$__rate_interval", "rate")
    assert (found["c_total"].range, found["c_total"].function) == ("15m", "increase")
    assert found["b"].range is None
    # Which selectors only say which series exist: the right-hand operands of `and` and `unless`.
    expr = "a unless on (x) b_total and c_total or d and (e) unless ignoring (y) f_total > 1 and g + h and (i)"
    assert {s.name: s.presence for s in selectors(expr)} == {
        "a": False, "b_total": True, "c_total": True, "d": False, "e": True, "f_total": False, "g": False,
        "h": False, "i": True,
    }  # fmt: skip
    # Or whether a counter has counted at all since it reset; any other comparison reads its value.
    expr = "a unless on (x) b_total > 0 and c_total > 0.5 or d unless e_total > 0 + f"
    assert {s.name: s.presence for s in selectors(expr)} == {
        "a": False, "b_total": True, "c_total": False, "d": False, "e_total": False, "f": False,
    }  # fmt: skip
    # `group` reads which series exist, with or without a label list; other aggregations read values.
    expr = "group without (d) (a_total) or group by (x) (b_total) or group (c_total) or sum by (x) (e_total)"
    assert {s.name: s.presence for s in selectors(expr)} == {
        "a_total": True, "b_total": True, "c_total": True, "e_total": False,
    }  # fmt: skip


# --- dashboards and rules ----------------------------------------------------------------------------


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows' nested panels included, rows excluded."""
    out = []
    for item in board["panels"]:
        if item["type"] == "row":
            out += item.get("panels", [])
        else:
            out.append(item)
    return out


def all_panels() -> Iterator[tuple[Path, dict[str, Any]]]:
    """(dashboard file, panel) for every panel of every dashboard."""
    for path in DASHBOARD_FILES:
        for item in panels(load(path)):
            yield path, item


def all_targets() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for path, item in all_panels():
        for tgt in item["targets"]:
            yield path.name, item, tgt


def urls(node: Any) -> Iterator[str]:
    """Every "url" string anywhere in a dashboard (panel links, field links in overrides, data links)."""
    if isinstance(node, dict):
        if isinstance(node.get("url"), str):
            yield node["url"]
        for value in node.values():
            yield from urls(value)
    elif isinstance(node, list):
        for value in node:
            yield from urls(value)


@functools.cache
def all_rules() -> tuple[dict[str, Any], ...]:
    out = []
    for path in sorted((ROOT / "rules").glob("*.rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += group["rules"]
    return tuple(out)


def all_urls() -> Iterator[tuple[str, str]]:
    """(dashboard file stem, URL) for every URL of every dashboard."""
    for path in DASHBOARD_FILES:
        for url in urls(load(path)):
            yield path.stem, url


def rules() -> list[dict[str, Any]]:
    return list(all_rules())


def recorded_names() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def target_labels(name: str) -> tuple[str, ...]:
    """Target labels a selector must narrow by: job, cluster and instance, except recording rules whose
    level has no instance (cluster:, cluster_device_port:): those series carry no instance label, so an
    instance matcher would match nothing."""
    level = name.split(":")[0] if name.count(":") == 2 else ""
    if level and "instance" not in level.split("_"):
        return ("job", "cluster")
    return ("job", "cluster", "instance")


COMPARISON_OPS = {">", ">=", "<", "<=", "==", "!="}
SET_OPS = {"and", "or", "unless"}


@dataclass(frozen=True)
class Comparison:
    """One `<quantity> <op> <number>` of an alert: what it compares, how, with what, at which severity."""

    alert: str
    severity: str
    op: str
    value: float
    quantity: tuple[Selector, ...]  # the selectors of the left-hand side, with their functions and windows
    # The aggregations of the left-hand side with their grouping, as "sum without (counter)": the alert
    # compares the sum over causes, so a panel drawing each cause against its threshold shows another
    # quantity.
    groupings: tuple[str, ...] = ()


def groupings(tokens: list[tuple[str, str]]) -> list[str]:
    """Every `agg by|without (labels)` of the tokens, written "agg by (a, b)" (labels as written)."""
    found = []
    for index, (kind, text) in enumerate(tokens[:-2]):
        if kind == "ident" and text in AGGREGATIONS and tokens[index + 1][1] in ("by", "without"):
            stop = closing(tokens, index + 2, "(", ")")
            labels = ", ".join(label for _, label in tokens[index + 3 : stop] if label != ",")
            found.append(f"{text} {tokens[index + 1][1]} ({labels})")
    return found


def legend_labels(legend: str) -> set[str]:
    """The labels a legend format draws (`{{label}}`)."""
    return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))


def outer_by_labels(expr: str) -> set[str] | None:
    """The labels an expression keeps when the whole of it is one `agg by (labels) (...)`, optionally inside
    topk/bottomk/sort/sort_desc and optionally combined with a number; None for any other shape."""
    return _kept_by(tokenize(expr))


@functools.cache
def family_labels() -> tuple[tuple[re.Pattern[str], frozenset[str]], ...]:
    """Each exported family's name (a pattern, for `<counter>` families) and declared labels."""
    return tuple((family_pattern(name), frozenset(labels)) for name, labels in declared_labels().items())


def plain_selector_labels(expr: str) -> set[str] | None:
    """The labels of what a query returns when it is one exported family's selector, bare or under functions
    that keep labels (rate, increase...): the family's labels and the target's. None for any other query."""
    found = selectors(expr)
    idents = {text for kind, text in tokenize(expr) if kind == "ident"}
    if len(found) != 1 or idents & (AGGREGATIONS | KEYWORDS | {"label_replace", "label_join"}):
        return None
    labels = next((labels for pattern, labels in family_labels() if pattern.fullmatch(found[0].name)), None)
    return None if labels is None else set(labels) | {"cluster", "job", "instance"}


def _kept_by(tokens: list[tuple[str, str]]) -> set[str] | None:
    if len(tokens) > 2 and tokens[-2][0] == "op" and tokens[-1][0] == "number":
        tokens = tokens[:-2]  # `... > 0`, `... * 8`: a number keeps the labels
    if len(tokens) < 4 or (tokens[1][1] != "(" and tokens[1][1] != "by"):
        return None
    head = tokens[0][1]
    if head in ("sort", "sort_desc", "topk", "bottomk") and closing(tokens, 1, "(", ")") == len(tokens) - 1:
        inner = tokens[2:-1]
        if head in ("topk", "bottomk"):  # topk(k, expr)
            if len(inner) < 3 or inner[0][0] != "number" or inner[1][1] != ",":
                return None
            inner = inner[2:]
        return _kept_by(inner)
    grouped_nowhere = tokens[1][1] == "(" and closing(tokens, 1, "(", ")") == len(tokens) - 1
    if head in AGGREGATIONS - {"count_values"} and grouped_nowhere:
        return set()  # `sum(...)` with no grouping keeps no label
    if head not in AGGREGATIONS or tokens[1][1] != "by":
        return None
    labels_end = closing(tokens, 2, "(", ")")
    if closing(tokens, labels_end + 1, "(", ")") != len(tokens) - 1:
        return None
    return {label for kind, label in tokens[3:labels_end] if kind == "ident"}


def comparisons(expr: str) -> list[tuple[str, float, list[Selector], list[str]]]:
    """(op, number, left-hand selectors, left-hand groupings) of every comparison of `expr` with a number.
    The left-hand side reaches back to the previous comparison or set operator at its depth, which bind
    less tightly than the arithmetic and functions around the quantity (`rate(x[10m]) * 60 > 0`)."""
    tokens = tokenize(expr)
    found = []
    braces = 0
    for index, (kind, text) in enumerate(tokens):
        braces += {"{": 1, "}": -1}.get(text, 0)
        if kind != "op" or text not in COMPARISON_OPS or braces:  # `!=` inside {...} is a matcher
            continue
        at = index + 1
        if tokens[at][1] == "bool":
            at += 1
        if tokens[at][0] != "number":
            continue
        depth, start = 0, index - 1
        while start >= 0:
            token = tokens[start][1]
            if token in (")", "]", "}"):
                depth += 1
            elif token in ("(", "[", "{"):
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0 and (token in COMPARISON_OPS or token in SET_OPS):
                break
            start -= 1
        left = " ".join(text for _, text in tokens[start + 1 : index])
        found.append((text, float(tokens[at][1]), selectors(left), groupings(tokens[start + 1 : index])))
    return found


def test_comparisons_find_the_quantity_each_threshold_applies_to() -> None:
    found = comparisons(
        'rdma_port_state_id{x!="y"} < 4 or max without (source) (rec:a:b) >= bool 2 unless on (device) vf == 1 '
        "and rate(c_total[10m]) * 60 > 0"
    )
    assert [(op, value, [(q.name, q.function, q.range) for q in qs], by) for op, value, qs, by in found] == [
        ("<", 4.0, [("rdma_port_state_id", None, None)], []),
        (">=", 2.0, [("rec:a:b", None, None)], ["max without (source)"]),
        ("==", 1.0, [("vf", None, None)], []),
        (">", 0.0, [("c_total", "rate", "10m")], []),
    ]


def alert_comparisons() -> dict[str, list[Comparison]]:
    """alert name -> every comparison with a number in its expressions, one rule (severity) each."""
    out: dict[str, list[Comparison]] = {}
    for rule in rules():
        if "alert" in rule:
            for op, value, quantity, grouped in comparisons(rule["expr"]):
                severity = rule["labels"]["severity"]
                out.setdefault(rule["alert"], []).append(
                    Comparison(rule["alert"], severity, op, value, tuple(quantity), tuple(grouped))
                )
            out.setdefault(rule["alert"], [])
    return out


def record_exprs() -> dict[str, list[str]]:
    exprs: dict[str, list[str]] = {}
    for rule in rules():
        if "record" in rule:
            exprs.setdefault(rule["record"], []).append(rule["expr"])
    return exprs


def read_series(expr: str) -> list[Selector]:
    """The selectors of `expr` and, for every recording rule it reads as it is (no range: the same window),
    the selectors of the rule's expressions, recursively: what the query computes from."""
    exprs, out, seen = record_exprs(), [], set()
    pending = selectors(expr)
    while pending:
        selector = pending.pop()
        out.append(selector)
        if selector.name in exprs and selector.range is None and selector.name not in seen:
            seen.add(selector.name)
            for record in exprs[selector.name]:
                pending += selectors(record)
    return out


def build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grafana_build", GRAFANA / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- lint --------------------------------------------------------------------------------------------


def test_three_dashboards_with_pinned_unique_uids() -> None:
    assert {p.name for p in DASHBOARD_FILES} == set(PINNED_UIDS)
    uids = [load(p)["uid"] for p in DASHBOARD_FILES]
    assert uids == [PINNED_UIDS[p.name] for p in DASHBOARD_FILES]
    assert len(set(uids)) == len(uids)
    assert all(len(uid) <= 40 for uid in uids)
    titles = [load(p)["title"] for p in DASHBOARD_FILES]
    assert len(set(titles)) == len(titles)


def test_json_is_what_build_py_generates() -> None:
    generated = build_module().build_all()
    assert sorted(generated) == [p.name for p in DASHBOARD_FILES]
    for path in DASHBOARD_FILES:
        assert path.read_text() == generated[path.name], f"{path.name} is stale: run python grafana/build.py"


def test_hottest_sensors_split_modules_as_the_temperature_alert_does() -> None:
    """The fleet's sensor panel colours modules at their own 5 °C margin, in a query of their own: it must
    tell modules from chips by the alert's own pattern, or a module would be coloured at the chip's."""
    patterns = {
        match for rule in rules() if rule.get("alert") == "RdmaDeviceTemperatureHigh"
        for match in re.findall(r'sensor=~"([^"]+)"', rule["expr"])
    }  # fmt: skip
    assert patterns == {build_module().MODULE_SENSORS}


# Catches (Ports by state all one neutral colour): DOWN and Polling ports drew as blue as ACTIVE ones
# (dashboard review). Every state the exporter names has its colour, under the name the legend gives it.
def test_ports_by_state_colours_each_state_the_exporter_names() -> None:
    from rdma_exporter.parse.infiniband import PHYS_STATES, PORT_STATES

    board = load(GRAFANA / "dashboards" / "fabric-overview.json")
    item = next(i for i in panels(board) if i["title"] == "Ports by state")
    colours = {o["matcher"]["options"]: o["properties"][0]["value"]["fixedColor"]
               for o in item["fieldConfig"]["overrides"]}  # fmt: skip
    names = {*PORT_STATES.values(), *(f"physical {name}" for name in PHYS_STATES.values())} - {"NOP", "physical NOP"}
    assert set(colours) == names
    assert colours["DOWN"] == colours["physical Polling"] == colours["physical Disabled"] == "red"
    assert colours["ACTIVE"] == colours["physical LinkUp"] == "green"


def test_drill_down_links_keep_the_selection_the_row_does_not_set() -> None:
    """A data link to another dashboard passes, as `var-` parameters, every template variable of the target
    that the source dashboard also has, except what the clicked row sets (its instance) and the device and
    port lists (the target's own choice): otherwise a fleet filtered to one job and cluster opens the node
    on the target's saved job and cluster."""
    dashboards = {load(path)["uid"]: load(path) for path in DASHBOARD_FILES}
    names = {uid: {v["name"] for v in d["templating"]["list"]} for uid, d in dashboards.items()}

    checked = 0
    for uid, dashboard in dashboards.items():
        for url in (url for url in urls(dashboard["panels"]) if url.startswith("/d/")):
            target = url.removeprefix("/d/").split("/", 1)[0]
            assert target in dashboards, f"{dashboard['title']}: link to an unknown dashboard: {url}"
            query = url.partition("?")[2].split("&")
            passed = {p.removeprefix("var-").split("=", 1)[0] for p in query if p.startswith("var-")}
            passed |= {m for p in query for m in re.findall(r"^\$\{(\w+):queryparam\}$", p)}
            wanted = (names[target] & names[uid]) - {"instance", "device", "port"}
            assert "instance" in passed and wanted <= passed, f"{dashboard['title']}: {url} misses {wanted - passed}"
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_dashboard_settings(path: Path) -> None:
    board = load(path)
    assert board["schemaVersion"] >= 36, "Grafana 10+ schema"
    assert board["title"].startswith("RDMA / ")
    assert "rdma-exporter" in board["tags"]
    assert board["description"]
    assert board["editable"] is False, "provisioned dashboards are read-only; save a copy to edit"
    assert "id" not in board or board["id"] is None, "no instance-specific id"
    # The links to the other RDMA dashboards keep the selection and the time range: a node picked on the
    # fleet view must stay picked when its RoCE congestion is opened from there. Node detail takes no
    # instance: the fleet views' All would reach its single-value variable as `$__all`, which Grafana
    # turns into a list of every node but the first, and no panel would show anything (dashboard review).
    others = {UIDS_BY_STEM[other.stem] for other in DASHBOARD_FILES if other != path}
    assert {link["url"].split("/")[2] for link in board["links"]} == others
    for link in board["links"]:
        assert (link["type"], link["keepTime"], link["includeVars"]) == ("link", True, False), link
        query = set(link["url"].partition("?")[2].split("&"))
        kept = {"${datasource:queryparam}", "${job:queryparam}", "${cluster:queryparam}"}
        selection = {"${instance:queryparam}", "${device:queryparam}", "${port:queryparam}"}
        # RoCE congestion's device list holds RoCE ports only: a device picked on another page (Node
        # detail starts on its first, usually an InfiniBand HCA) would empty every panel there.
        target = link["url"].split("/")[2]
        if target == "rdma-node-detail":
            assert query == kept, link
        elif target == "rdma-roce-congestion":
            assert query == kept | {"${instance:queryparam}"}, link
        else:
            assert query == kept | selection, link


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_template_variables(path: Path) -> None:
    board = load(path)
    variables = board["templating"]["list"]
    names = [v["name"] for v in variables]
    assert names[: len(VARIABLE_ORDER)] == VARIABLE_ORDER
    assert len(set(names)) == len(names)

    datasources = [v for v in variables if v["type"] == "datasource"]
    assert len(datasources) == 1, "template-datasource-rule: exactly one templated datasource"
    ds = datasources[0]
    assert (ds["name"], ds["label"], ds["query"]) == ("datasource", "Data source", "prometheus")

    for position, variable in enumerate(variables[1:], start=1):
        name = variable["name"]
        assert variable["type"] == "query", name
        assert variable["datasource"] == DS, f"{name}: must use $datasource"
        assert variable["refresh"] == 2, f"{name}: template-on-time-change-reload"
        if (path.stem, name) == ("node-detail", "instance"):
            # One node: a single choice, so the page never loads the whole fleet's ports.
            assert not variable["multi"] and not variable["includeAll"] and "allValue" not in variable
        else:
            assert variable["multi"] and variable["includeAll"], f"{name}: multi-select with All"
        assert variable["label"], name
        match = LABEL_VALUES.match(variable["query"])
        assert match, f"{name}: label_values(selector, label) expected, got {variable['query']!r}"
        assert variable["definition"] == variable["query"]
        # The chain: a variable refers only to variables defined before it.
        used = set(re.findall(r"\$(\w+)", variable["query"]))
        assert used <= set(names[:position]), f"{name} uses {used - set(names[:position])} defined later"
        for selector in selectors(match["selector"]):
            for earlier in names[1:position]:  # each list narrowed by every variable before it
                assert selector.matchers.get(earlier) == matcher(path, earlier), f"{name}: narrow by ${earlier}"
    by_name = {v["name"]: v for v in variables}
    for name in ("job", "instance"):  # template-job-rule, template-instance-rule
        assert by_name[name]["label"] == name.title()
    # Unlike the linter's ".+", All of job is the jobs listed: `up` and `scrape_duration_seconds` exist for
    # every job Prometheus scrapes, and ".+" would fill the instance list with all of them.
    assert "allValue" not in by_name["job"]
    if path.stem != "node-detail":
        assert by_name["instance"]["allValue"] == ".+"
    # The cluster label is optional: All must also match series without it.
    assert by_name["cluster"]["allValue"] == ".*"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_panels_titled_described_with_units_and_targets(path: Path) -> None:
    board = load(path)
    ids = [item["id"] for item in board["panels"]]
    ids += [nested["id"] for item in board["panels"] for nested in item.get("panels", [])]
    assert len(set(ids)) == len(ids), "panel ids must be unique"
    assert all(isinstance(i, int) and i > 0 for i in ids)
    titles = [item["title"] for item in panels(board)]
    assert len(set(titles)) == len(titles), "panel titles must be unique within a dashboard"

    for item in board["panels"]:
        assert item["type"] in PANEL_TYPES, item["type"]
        grid = item["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, item["title"]
        if item["type"] == "row":
            assert item["title"]
    cells = set()
    for item in board["panels"]:
        grid = item["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{item['title']} overlaps another panel"
                cells.add((x, y))

    for item in panels(board):
        title = item["title"]
        assert title, "panel-title-description-rule"
        assert item.get("description", "").endswith("."), f"{title}: needs a description (a sentence)"
        assert item["datasource"] == DS, f"{title}: panel-datasource-rule"
        defaults = item["fieldConfig"]["defaults"]
        assert defaults.get("unit") in VALID_UNITS, f"{title}: panel-units-rule, got {defaults.get('unit')!r}"
        for override in item["fieldConfig"]["overrides"]:
            for prop in override["properties"]:
                if prop["id"] == "unit":
                    assert prop["value"] in VALID_UNITS or prop["value"].startswith("suffix:"), title
        assert item["targets"], f"{title}: panel-no-targets-rule"
        refs = [t["refId"] for t in item["targets"]]
        assert len(set(refs)) == len(refs), f"{title}: duplicate refIds"
        for tgt in item["targets"]:
            assert tgt["datasource"] == DS, f"{title}: target must use $datasource"
            assert tgt["expr"].strip(), f"{title}: empty query"


def matcher(path: Path, label: str) -> tuple[str, str]:
    """How a dashboard's selectors narrow by the template variable of `label`: a regex (multi-select, and
    Grafana escapes the values), but on the node page the single-choice instance exactly. Grafana does not
    escape a single-choice value, and an IPv6 target such as `[fd00::1]:9883` read as a regex matches
    nothing (found by the dashboard review)."""
    if (path.stem, label) == ("node-detail", "instance"):
        return ("=", "$instance")
    return ("=~", f"${label}")


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_queries_follow_the_linter_rules(path: Path) -> None:
    board = load(path)
    variables = {v["name"] for v in board["templating"]["list"]}
    for item in panels(board):
        # A port under link-level 802.3x pause is paused on every priority: wherever a panel shows a PFC
        # pause counter, it shows the global one too (as priority="global", as the pause-time record does).
        # Counters read for their presence only (`unless on (...) x_total`) show nothing.
        read = {sel.name for tgt in item["targets"] for sel in selectors(tgt["expr"]) if not sel.presence}
        for name in read:
            if match := re.fullmatch(r"rdma_ethtool_pfc_pause_(\w+)_total", name):
                assert f"rdma_ethtool_global_pause_{match[1]}_total" in read, f"{item['title']}: no global pause"
        for tgt in item["targets"]:
            expr, where = tgt["expr"], f"{item['title']} {tgt['refId']}"
            assert "$__interval" not in expr and "$__range" not in expr, f"{where}: use $__rate_interval"
            assert set(re.findall(r"\$(\w+)", expr)) <= variables | {"__rate_interval"}, where
            found = selectors(expr)
            assert found, f"{where}: no selector"
            for sel in found:
                assert sel.name, f"{where}: selector without a metric name"
                # target-job-rule, target-instance-rule; and the optional cluster label
                required = target_labels(sel.name)
                if sel.name == "ALERTS" and sel.matchers.get("instance") == ("=", ""):
                    # A cluster's own alert (RdmaHistoryRulesMissing), which the node selector would hide.
                    required = tuple(label for label in required if label != "instance")
                    assert WHOLE_CLUSTERS.search(item["description"]), f"{where}: say it lists whole clusters' alerts"
                for label in required:
                    assert sel.matchers.get(label) == matcher(path, label), f"{where}: {sel.name} lacks {label}"
                if "instance" not in required and sel.name != "ALERTS":
                    assert sel.name in recorded_names(), f"{where}: {sel.name} is no recording rule"
                    assert "instance" not in sel.matchers, f"{where}: {sel.name} has no instance label"
                    assert WHOLE_CLUSTERS.search(item["description"]), (
                        f"{where}: say that {sel.name} covers whole clusters (the instance selector does not apply)"
                    )
                # target-counter-agg-rule; a counter that only says which series exist (the operand of
                # `and` or `unless`, as in the alert a panel copies) has no value to show.
                if sel.name.endswith("_total") and not sel.presence:
                    assert sel.range and sel.function in COUNTER_FUNCTIONS, f"{where}: bare counter {sel.name}"
                # target-rate-interval-rule
                if sel.function in ("rate", "irate"):
                    assert sel.range == "$__rate_interval", f"{where}: {sel.function} over {sel.range}"
                # Grafana steps a range query by $__interval, and $__rate_interval is at least four scrapes:
                # an increase over it counts each event at several steps (one link drop, four bars). An
                # increase over $__interval loses the events between two windows' samples instead. Per
                # step, plot a rate; counts are increases over a fixed window (an alert's).
                if sel.function == "increase":
                    assert not sel.range.startswith("$"), f"{where}: increase over {sel.range}; plot a rate"
            assert "$__rate_interval" not in re.sub(r"\[\$__rate_interval\]", "", expr), where
            # A legend's label that the query aggregates away, or that its series never had, is drawn
            # empty: every line looks alike.
            kept = outer_by_labels(expr)
            if kept is None:
                kept = plain_selector_labels(expr)
            if kept is not None:
                drawn = legend_labels(tgt["legendFormat"])
                missing = sorted(drawn - kept)
                assert not missing, f"{where}: the legend draws {missing}, which the query's series do not carry"
            # An optional label (targets without `cluster`) leaves its place in a legend empty: only at the end.
            for label in OPTIONAL_LABELS:
                token, legend = "{{" + label + "}}", tgt["legendFormat"]
                assert token not in legend or (legend.endswith(token) and legend.count(token) == 1), (
                    f"{where}: {token} may be absent, so it can only end a legend: {legend!r}"
                )
            names = {sel.name for sel in found}
            # Counts of ports and links skip SR-IOV virtual functions, which share their PF's link, as the
            # link alerts (and the count records) do.
            if names & PORT_COUNT_SERIES and AGGREGATED.match(expr):
                assert SKIPS_VFS.search(expr), f"{where}: a count of ports or links must skip SR-IOV VFs"
            # IPoIB carrier changes also follow `ip link set down`: link drops count RoCE netdevs only, as
            # the link-down record does.
            if "rdma_netdev_carrier_down_changes_total" in names:
                assert any(sel.name == "rdma_port_info" and sel.matchers.get("link_layer") == ("=", "Ethernet")
                           for sel in found), f"{where}: carrier changes of RoCE netdevs only"  # fmt: skip


def runbook_alerts(item: dict[str, Any]) -> list[str]:
    alerts = []
    for link in item.get("links", []):
        assert link["url"].startswith(RUNBOOK_URL) and link["url"].endswith(".md"), link
        alerts.append(link["url"][len(RUNBOOK_URL) : -len(".md")])
    return alerts


# Series that only narrow a query (which ports, which devices) say nothing about what it measures.
JOIN_SERIES = {"rdma_port_info", "rdma_device_info", "rdma_device_sriov_virtual_function"}
# Runbooks a panel links although it shows none of the series its alert reads, and why.
RELATED_RUNBOOKS = {
    ("node-detail", "Physical port state", "RdmaPortLinkErrorRecovery"): "the LinkErrorRecovery state it counts",
    ("node-detail", "PCIe AER errors", "RdmaPcieLinkDegraded"): "AER errors precede a link that retrains slower",
    ("node-detail", "PCIe AER errors", "RdmaPcieUncorrectableErrors"): "it counts the AER messages (reports) of "
    "the non-fatal and fatal errors this panel shows by type, and its description names the types",
    ("fabric-overview", "Firmware by board", "RdmaDeviceFirmwareMismatch"): "it counts the HCAs of each board "
    "and firmware version that the alert compares, per cluster instead of per node",
    ("fabric-overview", "Ports by state", "RdmaPortDown"): "the states its description names (its expression "
    "reads their numbers, *_state_id)",
}


def measured(expr: str) -> set[str]:
    return {s.name for s in read_series(expr)} - JOIN_SERIES


def alert_names(selector: Selector) -> list[str]:
    """The alerts an ALERTS selector reads: its alertname, or the names of an alternation of plain names."""
    if selector.name != "ALERTS":
        return []
    op, value = selector.matchers.get("alertname", ("", ""))
    names = [value] if op == "=" else value.split("|") if op == "=~" else []
    return names if all(re.fullmatch(r"[A-Za-z0-9_]+", name) for name in names) else []


def test_runbook_links_resolve() -> None:
    """Every runbook link resolves, and is the runbook of an alert on what the panel shows: the alert reads
    (directly or through recording rules) a series the panel reads, or the panel shows the alert's ALERTS."""
    alert_exprs: dict[str, set[str]] = {}
    for rule in rules():
        if "alert" in rule:
            alert_exprs.setdefault(rule["alert"], set()).update(measured(rule["expr"]))
    linked: set[str] = set()
    related = set()
    for path, item in all_panels():
        shown = set().union(*(measured(tgt["expr"]) for tgt in item["targets"]))
        alerts_shown = {name for tgt in item["targets"] for s in selectors(tgt["expr"]) for name in alert_names(s)}
        for alert in runbook_alerts(item):
            assert alert in alert_exprs, f"{item['title']}: no alert {alert} in rules/"
            assert (RUNBOOK_DIR / f"{alert}.md").is_file(), f"{item['title']}: no runbook for {alert}"
            assert f"Runbook: {alert}" in [link["title"] for link in item["links"]]
            assert (
                alert in alerts_shown
                or shown & alert_exprs[alert]
                or ((path.stem, item["title"], alert) in RELATED_RUNBOOKS)
            ), f"{path.stem} / {item['title']}: links {alert}, which reads none of {sorted(shown)}"
            linked.add(alert)
            related.add((path.stem, item["title"], alert))
    assert set(RELATED_RUNBOOKS) <= related, "stale RELATED_RUNBOOKS entries"
    assert len(linked) >= 20, "most alerts should be one click away from the panel that shows them"


def target_steps(item: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """refId -> the threshold steps (base colour left out) that colour that query's fields: the defaults, or
    the last thresholds override matching it by name (its legend, or the table column its value is renamed
    to) or by query (byFrameRefID)."""
    config = item["fieldConfig"]
    steps = {tgt["refId"]: list(config["defaults"]["thresholds"]["steps"][1:]) for tgt in item["targets"]}
    renames = column_renames(item)
    for override in config["overrides"]:
        for prop in override["properties"]:
            if prop["id"] != "thresholds":
                continue
            matcher = override["matcher"]
            assert matcher["id"] in ("byName", "byFrameRefID"), f"{item['title']}: matcher {matcher['id']}"
            if matcher["id"] == "byName":
                names = {tgt["refId"]: (tgt["legendFormat"], renames.get(f"Value #{tgt['refId']}"))
                         for tgt in item["targets"]}  # fmt: skip
                matched = [ref for ref, named in names.items() if matcher["options"] in named]
            else:
                matched = [tgt["refId"] for tgt in item["targets"] if tgt["refId"] == matcher["options"]]
            assert matched, f"{item['title']}: thresholds of {matcher} colour no query"
            for ref in matched:
                steps[ref] = list(prop["value"]["steps"][1:])
    return steps


# Panels coloured orange or red that follow no single alert threshold, and why.
UNCLAIMED_COLOURS = {
    ("fabric-overview", "Links below expected"): "the record is the alerts' condition: any series is one; red "
    "for those below an expectation (critical alerts), orange for reference link_max (RdmaPcieLinkDegraded)",
    ("fabric-overview", "Links below expected rate, width or PCIe"): "the share of the reference reached",
    ("fabric-overview", "Ports down"): "down counts the port alerts' own ALERTS series; unreachable, the ports "
    "of targets that are down, orange as RdmaExporterDown (up == 0) is a warning",
    ("node-detail", "Ports down"): "as on the fleet page",
    ("node-detail", "Link rate and width"): "the share of the day's best rate reached: below 100% is "
    "RdmaPortRateBelowRecentMax's condition (rate * 8 < the day's best * 8)",
    ("roce-congestion", "ECN disabled"): "a count of configuration problems",
    ("roce-congestion", "Priorities that lost PFC"): "a count of configuration problems; RdmaRocePfcDisabled "
    "compares no number: any series is its condition",
    ("roce-congestion", "Unknown statistics"): "a count of netdevs the RoCE alerts cannot see; "
    "RdmaRoceStatisticsUnknown compares no number: a PF's netdev without a curated CRC counter is its condition",
    ("fabric-overview", "Hottest HCA sensors"): "RdmaDeviceTemperatureHigh compares each sensor with its own "
    "threshold less a margin; the panel shows the difference, at each query's margin (chips -10, modules -5) "
    "and at the threshold (0)",
}


def test_hottest_sensors_colour_each_query_at_the_alerts_margin_for_its_sensors() -> None:
    # UNCLAIMED_COLOURS exempts the panel from the general check, so its steps are checked here against
    # RdmaDeviceTemperatureHigh's warning: each branch's sensor matcher and margin, and the critical at 0
    # (mutation review: a chip step of -5 passed every test).
    (warning,) = [r for r in all_rules() if r.get("alert") == "RdmaDeviceTemperatureHigh"
                  and r["labels"]["severity"] == "warning"]  # fmt: skip
    margins = {
        (op, pattern): float(margin)
        for op, pattern, margin in re.findall(
            r'rdma_device_temperature_critical_celsius\{sensor(=~|!~)"([^"]+)"\}\s*-\s*([0-9.]+)', warning["expr"]
        )
    }
    assert len(margins) == 2, warning["expr"]
    ((item,),) = [[i for p, i in all_panels() if p.stem == "fabric-overview" and i["title"] == "Hottest HCA sensors"]]
    steps = target_steps(item)
    matched = set()
    for tgt in item["targets"]:
        (key,) = [k for k in margins if f'sensor{k[0]}"{k[1]}"' in tgt["expr"]]
        matched.add(key)
        assert steps[tgt["refId"]] == [{"color": "orange", "value": -margins[key]}, {"color": "red", "value": 0}], key
    assert matched == set(margins)


def step_follows(step: dict[str, Any], tgt: dict[str, Any], followed: list[str],
                 claims: dict[str, list[Comparison]]) -> bool:  # fmt: skip
    """Whether `step`, colouring query `tgt`, is one of the followed alerts' thresholds: a comparison of
    that severity, with that number (just above it for `>`: Grafana colours from the step on), of the
    quantity the query computes (the same series, function and window; for "> 0" of a counter, any rate or
    increase of it), or a count of the alert's own ALERTS series at 1."""
    value, colour = float(step["value"]), step["color"]
    for selector in selectors(tgt["expr"]):
        names = alert_names(selector)
        if names and set(names) <= set(followed):
            severities = {rule["labels"]["severity"] for rule in rules() if rule.get("alert") in names}
            return value == 1 and colour in {SEVERITY_COLOURS[s] for s in severities}
    computed = read_series(tgt["expr"])
    for alert in followed:
        for claim in claims[alert]:
            if colour != SEVERITY_COLOURS[claim.severity] or not claim.quantity:
                continue
            if claim.op == ">" and claim.value == 0:
                at = 0 < value <= EPSILON_MAX
            elif claim.op == ">":
                at = claim.value < value <= claim.value * (1 + 1e-6)
            elif claim.op in (">=", "=="):
                at = value == claim.value
            else:
                at = False
            if not at:
                continue
            if not set(claim.groupings) <= set(groupings(tokenize(tgt["expr"]))):
                continue  # the alert aggregates (over causes, say) what the query shows apart
            any_rate = claim.op == ">" and claim.value == 0
            if all(
                any(
                    have.name == want.name
                    and ((have.function, have.range) == (want.function, want.range)
                         or (any_rate and {have.function, want.function} <= COUNTER_FUNCTIONS))
                    for have in computed
                )
                for want in claim.quantity
            ):  # fmt: skip
                return True
    return False


def test_threshold_colours_follow_the_alerts() -> None:
    """A panel saying "Colours follow <Alert>" colours each query at a threshold of that alert on the
    quantity the query shows, in the alert's severity colour: not a number that happens to appear
    somewhere in the alert's expression, not a 5-minute rate at an hourly rate's threshold. A panel
    coloured orange or red that follows no alert says why (UNCLAIMED_COLOURS)."""
    claims = alert_comparisons()
    checked = 0
    titles = set()
    for path, item in all_panels():
        titles.add((path.stem, item["title"]))
        where = f"{path.stem} / {item['title']}"
        steps = target_steps(item)
        coloured = any(step["color"] in SEVERITY_COLOURS.values() for ref in steps for step in steps[ref])
        followed = COLOURS_FOLLOW.findall(item["description"])
        if not followed:
            reads_alerts = all("ALERTS" in {s.name for s in selectors(t["expr"])} for t in item["targets"])
            if coloured and not reads_alerts:
                assert (path.stem, item["title"]) in UNCLAIMED_COLOURS, f"{where}: coloured, follows no alert"
            continue
        for alert in followed:
            assert alert in claims, f"{where}: unknown alert {alert}"
            assert alert in runbook_alerts(item), f"{where}: link the runbook of {alert}"
        assert any(steps.values()), f"{where}: says colours follow {followed} but has no threshold step"
        for tgt in item["targets"]:
            for step in steps[tgt["refId"]]:
                assert step_follows(step, tgt, followed, claims), (
                    f"{where} {tgt['refId']}: step {step['value']} {step['color']} is no threshold of "
                    f"{followed} on what the query shows: {tgt['expr']}"
                )
                checked += 1
    assert set(UNCLAIMED_COLOURS) <= titles, "stale UNCLAIMED_COLOURS entries"
    assert checked >= 15


def test_panels_count_over_the_windows_of_the_alerts_they_link() -> None:
    """A panel that links an alert's runbook and counts one of the alert's series over a fixed window
    counts over the alert's window: a panel showing 10 minutes of module events beside an alert that
    tickets 15 minutes of them is empty while the ticket is open (mutation review)."""
    alert_windows: dict[str, dict[str, set[str]]] = {}
    for rule in rules():
        if "alert" in rule:
            for selector in read_series(rule["expr"]):
                if selector.range:
                    alert_windows.setdefault(rule["alert"], {}).setdefault(selector.name, set()).add(selector.range)
    checked = 0
    for dashboard, item, tgt in all_targets():
        for selector in selectors(tgt["expr"]):
            if not selector.range or selector.range.startswith("$"):
                continue
            for alert in runbook_alerts(item):
                windows = alert_windows.get(alert, {}).get(selector.name)
                if windows is not None:
                    assert selector.range in windows, (
                        f"{dashboard} / {item['title']}: {selector.name}[{selector.range}], "
                        f"{alert} reads it over {sorted(windows)}"
                    )
                    checked += 1
    assert checked >= 4


def test_the_day_of_pfc_use_is_selected_by_node_only() -> None:
    """The last day of PFC use is joined to today's devices by their HCA's key, because it may have been
    recorded under another device name (a reboot without one HCA renumbers the mlx5_N after it). A device
    matcher on it would lose that day as soon as one device is chosen (mutation review)."""
    checked = 0
    for _, item, tgt in all_targets():
        for selector in selectors(tgt["expr"]):
            if selector.name == "instance_device_port:rdma_ethtool_pfc_used:present1d":
                assert not {"device", "port", "priority"} & set(selector.matchers), (item["title"], selector)
                checked += 1
    assert checked >= 2


def infiniband_port_metrics() -> set[str]:
    """Metrics that some golden exposition has on an InfiniBand port."""
    names = set()
    for path in sorted((ROOT / "tests" / "golden").glob("*.prom")):
        exposed = samples(path.read_text())
        ib_ports = {
            (labels["device"], labels["port"])
            for name, pairs in exposed
            if name == "rdma_port_info" and (labels := dict(pairs)).get("link_layer") == "InfiniBand"
        }
        for name, pairs in exposed:
            labels = dict(pairs)
            if (labels.get("device"), labels.get("port")) in ib_ports:
                names.add(name)
    return names


def test_roce_panels_read_no_infiniband_port() -> None:
    """Device names are per node: mlx5_0 is a RoCE port on one node and an InfiniBand port on the next,
    so the RoCE dashboard's device list does not keep InfiniBand ports out (found by review: "RoCE
    throughput" showed 476 Gb/s of which 80 were RoCE, on a fleet mixing the two). A query reading a
    metric that InfiniBand ports also have keeps the Ethernet ports only, by their link layer."""
    on_ib = infiniband_port_metrics()
    assert {"rdma_port_transmit_data_bytes_total", "rdma_port_hw_out_of_buffer_total"} <= on_ib
    checked = 0
    for item in panels(load(GRAFANA / "dashboards" / "roce-congestion.json")):
        for tgt in item["targets"]:
            found = selectors(tgt["expr"])
            read = {s.name for s in found if not s.presence and s.name in on_ib}
            if not read:
                continue
            checked += 1
            ethernet = any(
                s.presence and s.name == "rdma_port_info" and s.matchers.get("link_layer") == ("=", "Ethernet")
                for s in found
            )
            assert ethernet, f"{item['title']} {tgt['refId']}: reads {sorted(read)} of InfiniBand ports too"
    assert checked >= 2


def test_few_panels_may_be_empty() -> None:
    """Only panels of problems may legitimately show nothing; each says so in its description."""
    empty = [item["title"] for path in DASHBOARD_FILES for item in panels(load(path))
             if MAY_BE_EMPTY.search(item["description"])]  # fmt: skip
    assert len(empty) <= MAX_MAY_BE_EMPTY, empty


def test_provisioning_loads_the_dashboards_as_they_are() -> None:
    datasources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert datasources["apiVersion"] == 1
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy" and source["url"]
    assert source["jsonData"]["timeInterval"], "$__rate_interval is derived from the scrape interval"
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "rdma-exporter.yml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    readme = (GRAFANA / "README.md").read_text()
    # The README mounts/copies the JSON files where the provider looks, and documents every dashboard.
    assert f":{provider['options']['path']}:ro" in readme
    for path in DASHBOARD_FILES:
        assert f"dashboards/{path.name}" in readme and f"`{load(path)['uid']}`" in readme


# --- end to end ----------------------------------------------------------------------------------------

EXPECTED_TOPOLOGY = (Path(__file__).resolve().parent.parent / "deploy/examples/expected-sample-node.yml").read_text()
# The sample node with an SR-IOV VF on each InfiniBand PF and one expected port down (its VF with it), so
# that the port counts are seen to count links, as the alerts do.
DOWN_PORT = "mlx5_1"
TREE_SPEC = dataclasses.replace(SAMPLE_SPEC, vfs_per_pf=1, down_ports=(DOWN_PORT,))
# A RoCE port under link-level 802.3x pause instead of PFC: mlx5 then lists no per-priority pause counters,
# so its priorities (traffic, ECN state) are ones without PFC counters, and the pause panels show it as
# priority "global". The other RoCE port runs PFC on priority 3; a test disables it there for a while.
GLOBAL_PAUSE_NETDEV = "enp220s0f1np1"
PFC_NETDEV = "enp220s0f0np0"
PFC_PRIORITY = "3"
PFC_COUNTER = re.compile(r"^\s*[rt]x_prio(\d)_pause\w*:.*\n", re.MULTILINE)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


def wait_until(what: str, check: Any, timeout: float, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        for proc in procs:
            assert proc.poll() is None, f"{proc.args[0]} exited with {proc.returncode} while waiting for {what}"
        try:
            if check():
                return
        except OSError as exc:
            last = exc
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last})")


STACK_INSTANCE = "[fd00::17]:9883"


@dataclass
class Stack:
    exporter: str
    prometheus: str
    exposition: str
    ethtool: Path  # the exporter's --path.ethtool: one `ethtool -S` capture per netdev, read at every scrape

    def query(self, expr: str) -> dict[str, Any]:
        """/api/v1/query; HTTP errors (bad_data) are returned, not raised."""
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            return dict(json.loads(get(url)))
        except urllib.error.HTTPError as err:
            return dict(json.loads(err.read()))


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """The exporter on the sample tree with the expected topology: (address, its exposition, its ethtool
    captures)."""
    tmp = tmp_path_factory.mktemp("dashboards")
    build_tree(tmp / "tree", TREE_SPEC)
    # One RoCE port under link-level 802.3x pause instead of PFC, which the pause panels show as priority
    # "global": no per-priority pause counters, as mlx5 lists them.
    capture = tmp / "tree" / "ethtool" / GLOBAL_PAUSE_NETDEV
    stats = PFC_COUNTER.sub("", capture.read_text())
    assert stats != capture.read_text()
    capture.write_text(stats + "     rx_global_pause: 1200\n     rx_global_pause_duration: 90000\n"
                       "     tx_global_pause: 300\n     tx_global_pause_duration: 20000\n")  # fmt: skip
    assert PFC_COUNTER.search((tmp / "tree" / "ethtool" / PFC_NETDEV).read_text())
    # One unreadable counter, so that the read-error panel has a series to show.
    infiniband = tmp / "tree" / "sys" / "class" / "infiniband"
    (infiniband / "mlx5_0" / "ports" / "1" / "counters" / "VL15_dropped").write_text("garbage\n")
    # A device without a NUMA node (single-socket hosts, VMs) and a port whose lane generation this
    # exporter does not know: both must still be listed in the node's identity tables.
    (infiniband / "mlx5_1" / "device" / "numa_node").write_text("-1\n")
    (infiniband / "mlx5_2" / "ports" / "1" / "rate").write_text("400 Gb/sec (4X ZDR)\n")
    config = tmp / "rdma-exporter.yml"
    config.write_text(EXPECTED_TOPOLOGY)
    address = f"127.0.0.1:{free_port()}"
    tree = tmp / "tree"
    proc = start(
        [sys.executable, "-m", "rdma_exporter", "--path.sysfs", str(tree / "sys"), "--path.ethtool",
         str(tree / "ethtool"), "--config.file", str(config), "--web.listen-address", address],
        tmp / "exporter.log",
    )  # fmt: skip
    try:
        wait_until("the exporter", lambda: get(f"http://{address}/metrics"), 30, [proc])
        yield address, get(f"http://{address}/metrics").decode(), tree / "ethtool"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module", params=PROMETHEUS_RELEASES, ids=lambda release: release.name)
def stack(
    exporter: tuple[str, str, Path], tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    """A real Prometheus scraping the exporter and evaluating rules/, once per Prometheus line: 3.x's
    left-open windows change what a panel's range holds."""
    release: PrometheusRelease = request.param
    binary = release.binary("prometheus")
    address, exposition, ethtool = exporter
    tmp = tmp_path_factory.mktemp("prometheus")
    config = tmp / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {
                    "scrape_interval": SCRAPE_INTERVAL,
                    "scrape_timeout": SCRAPE_INTERVAL,
                    "evaluation_interval": SCRAPE_INTERVAL,
                },
                "rule_files": [str(p) for p in sorted((ROOT / "rules").glob("*.rules.yml"))],
                "scrape_configs": [
                    {
                        "job_name": "rdma-exporter",
                        # A target label, as in a fleet that tells clusters apart.
                        "static_configs": [{"targets": [address], "labels": {"cluster": "lab"}}],
                        # Named as a node scraped over IPv6 (IPv6-only Kubernetes): a value that is no
                        # regex of itself, as Grafana hands a single choice to the node page unescaped.
                        "relabel_configs": [{"target_label": "instance", "replacement": STACK_INSTANCE}],
                    }
                ],
            }
        )
    )
    url = f"http://127.0.0.1:{free_port()}"
    proc = start(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address={url.removeprefix('http://')}", "--log.level=warn"],
        tmp / "prometheus.log",
    )  # fmt: skip
    try:
        wait_until("Prometheus to be ready", lambda: get(f"{url}/-/ready"), 30, [proc])
        yield Stack(address, url, exposition, ethtool)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.returncode not in (0, -15):
            print((tmp / "prometheus.log").read_text()[-3000:])


def substitute(expr: str, variables: list[dict[str, Any]], chosen: dict[str, str] | None = None) -> str:
    """What Grafana sends with every variable on All (its allValue, or any value for list-valued ones), or
    on the value `chosen` gives it."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    for variable in sorted(variables, key=lambda v: -len(v["name"])):
        name = variable["name"]
        if variable["type"] == "query" and not variable.get("multi") and name not in (chosen or {}):
            # A single choice (the node page's instance) matches exactly: with none chosen, look at every
            # node at once, as if each had been chosen in turn.
            expr = expr.replace(f'{name}="${name}"', f'{name}=~".+"')
        if variable["type"] == "query":
            value = (chosen or {}).get(variable["name"]) or variable.get("allValue") or ".+"
            expr = expr.replace("${" + variable["name"] + "}", value).replace("$" + variable["name"], value)
    return expr


def exporter_names(exposition: str) -> set[str]:
    return {sample.name for family in text_string_to_metric_families(exposition) for sample in family.samples}


def test_every_metric_exists(exporter: tuple[str, str, Path]) -> None:
    """Every name in every query is served by the exporter, recorded by rules/, or written by Prometheus."""
    # The golden expositions of captured and built trees: metrics the sample tree cannot show (EFA and
    # bnxt_re byte counters) but real nodes serve.
    golden = "".join(p.read_text() for p in sorted((ROOT / "tests" / "golden").glob("*.prom")))
    known = exporter_names(exporter[1]) | exporter_names(golden) | recorded_names() | PROMETHEUS_SERIES
    missing = sorted(
        {
            f"{name} ({dashboard}: {item['title']})"
            for dashboard, item, tgt in all_targets()
            for name in {s.name for s in selectors(tgt["expr"])} - known
        }
    )
    assert not missing, "unknown metric names:\n" + "\n".join(missing)


def test_every_variable_has_values(stack: Stack) -> None:
    for path in DASHBOARD_FILES:
        variables = load(path)["templating"]["list"]
        for variable in variables[1:]:
            match = LABEL_VALUES.match(variable["query"])
            assert match
            selector = substitute(match["selector"], variables)

            def values(selector: str = selector, label: str = match["label"]) -> set[str]:
                url = f"{stack.prometheus}/api/v1/series?" + urllib.parse.urlencode({"match[]": selector})
                return {s[label] for s in json.loads(get(url))["data"] if label in s}

            wait_until(f"values of ${variable['name']} in {path.name}", values, DEADLINE, [])


def test_link_rate_table_leaves_a_port_that_is_not_active_empty(stack: Stack) -> None:
    """A down port reports its driver's preset rate and width (mlx5: 40 Gb/s 4X): in the node page's table
    beside an expected 400 Gb/s it looked like a link that trained low (found by the dashboard review)."""
    board = load(GRAFANA / "dashboards" / "node-detail.json")
    variables = board["templating"]["list"]
    item = next(i for i in panels(board) if i["title"] == "Link rate and width")
    rate, width = (substitute(t["expr"], variables, {"instance": STACK_INSTANCE}) for t in item["targets"][:2])
    deadline = time.monotonic() + DEADLINE
    shown: dict[str, set[str]] = {}
    while time.monotonic() < deadline:
        shown = {expr: {r["metric"]["device"] for r in stack.query(expr)["data"]["result"]} for expr in (rate, width)}
        if all(shown.values()):
            break
        time.sleep(1)
    assert stack.query(f'rdma_port_state_id{{device="{DOWN_PORT}"}} < 4')["data"]["result"], "the port is down"
    for expr, devices in shown.items():
        assert devices and DOWN_PORT not in devices, (expr, devices)


def legend_gaps(legend: str, result: list[dict[str, Any]]) -> str | None:
    """The first series of a query's answer that lacks a label its legend draws (the line's name would have
    a blank there), described; None if every series carries them all. Optional target labels may be absent."""
    drawn = legend_labels(legend) - set(OPTIONAL_LABELS)
    if PORT_NETDEV in legend:
        drawn.discard("netdev")
    for series in result:
        missing = sorted(drawn - series["metric"].keys())
        if missing:
            return f"the legend {legend!r} draws {missing}, which this series lacks: {series['metric']}"
    return None


def test_every_panel_query_returns_data(stack: Stack) -> None:
    """Poll until every query that must have data has it (the rules need a few evaluations), then report.

    Every series a query returns must also carry each label its legend draws: the static legend check
    cannot follow joins, label_replace or recording rules, the answers can."""
    queries = []
    for path in DASHBOARD_FILES:
        variables = load(path)["templating"]["list"]
        # The node page is only ever on one node, chosen as Grafana sends it: raw, not regex-escaped.
        chosen = {"instance": STACK_INSTANCE} if path.stem == "node-detail" else None
        for item in panels(load(path)):
            for tgt in item["targets"]:
                where = f"{path.stem} / {item['title']} / {tgt['refId']}"
                may_be_empty = bool(MAY_BE_EMPTY.search(item["description"])) or where in EMPTY_ON_THE_SAMPLE
                legend = tgt.get("legendFormat", "")
                queries.append((where, substitute(tgt["expr"], variables, chosen), may_be_empty, legend))

    problems: dict[str, str] = {}
    legends: dict[str, str] = {}
    deadline = time.monotonic() + DEADLINE
    pending = list(queries)
    while pending and time.monotonic() < deadline:
        still = []
        for where, expr, may_be_empty, legend in pending:
            answer = stack.query(expr)
            if answer.get("status") != "success":
                problems[where] = f"does not parse: {answer.get('error')}\n  {expr}"
                continue
            result = answer["data"]["result"]
            gap = legend_gaps(legend, result)
            if gap is None:
                legends.pop(where, None)
            else:
                legends[where] = f"{gap}\n  {expr}"
            if not result and not may_be_empty:
                problems[where] = f"returned no data\n  {expr}"
                still.append((where, expr, may_be_empty, legend))
            else:
                problems.pop(where, None)
        pending = [p for p in still if "does not parse" not in problems.get(p[0], "")]
        if pending:
            time.sleep(1)
    assert not problems, "\n".join(f"{where}: {why}" for where, why in sorted(problems.items()))
    assert not legends, "\n".join(f"{where}: {why}" for where, why in sorted(legends.items()))


IDENTITY_TABLES = (("Devices", "rdma_device_info", ("device",)), ("Ports", "rdma_port_info", ("device", "port")))


def test_identity_tables_list_every_device_and_port(stack: Stack) -> None:
    """The node's Devices and Ports tables show every device and port, also one without a NUMA node or a
    known lane speed (a join on those would drop exactly the odd one out)."""
    board = load(GRAFANA / "dashboards" / "node-detail.json")
    variables = board["templating"]["list"]
    families = list(text_string_to_metric_families(stack.exposition))
    for title, name, keys in IDENTITY_TABLES:
        exposed = {tuple(s.labels[k] for k in keys) for f in families for s in f.samples if s.name == name}
        assert len(exposed) >= 10, name
        item = next(item for item in panels(board) if item["title"] == title)

        def left_out(
            item: dict[str, Any] = item, keys: tuple[str, ...] = keys, exposed: set[tuple[str, ...]] = exposed
        ) -> set[tuple[str, ...]]:
            listed: set[tuple[str, ...]] = set()
            for tgt in item["targets"]:
                answer = stack.query(substitute(tgt["expr"], variables))
                assert answer["status"] == "success", answer
                listed |= {tuple(r["metric"][k] for k in keys) for r in answer["data"]["result"]}
                # Grafana's merge joins rows on every column they share, the metric name included.
                named = [r for r in answer["data"]["result"] if "__name__" in r["metric"]]
                assert len(item["targets"]) == 1 or not named, f"{item['title']}: __name__ splits the merged rows"
            return exposed - listed

        wait_until(f"{title} to list every {name}", lambda f=left_out: not f(), DEADLINE, [])  # the first scrapes


def test_every_recording_rule_has_a_consumer() -> None:
    """Each record is read by an alert, a panel, or a record that is: a series nobody reads costs every
    evaluation, and a dashboard that computes what a record already holds drifts from the alert."""
    recorded = recorded_names()
    exprs: dict[str, list[str]] = {}
    for rule in rules():
        if "record" in rule:
            exprs.setdefault(rule["record"], []).append(rule["expr"])
    read = [rule["expr"] for rule in rules() if "alert" in rule] + [tgt["expr"] for _, _, tgt in all_targets()]
    consumed = {s.name for expr in read for s in selectors(expr)} & recorded
    pending = list(consumed)
    while pending:
        for expr in exprs[pending.pop()]:
            for name in {s.name for s in selectors(expr)} & recorded - consumed:
                consumed.add(name)
                pending.append(name)
    assert sorted(recorded - consumed) == []


def test_recording_rules_used_by_dashboards_are_healthy(stack: Stack) -> None:
    """Each record a dashboard reads evaluates without error on the stack's data. A rule not evaluated yet
    reports health "unknown", which passed for an error (test review): the groups evaluated every
    second are waited for, and every record's expression is also run as a query, so that the history
    group's (every 5 minutes, too slow to wait for) are checked as well."""
    used = {s.name for _, _, tgt in all_targets() for s in selectors(tgt["expr"])} & recorded_names()

    def health() -> list[tuple[str, str, str, float, str]]:
        """(name, health, last error, group interval, expression) of each record a dashboard reads."""
        groups = json.loads(get(f"{stack.prometheus}/api/v1/rules?type=record"))["data"]["groups"]
        return [
            (r["name"], r["health"], r.get("lastError", ""), float(g["interval"]), r["query"])
            for g in groups for r in g["rules"] if r["name"] in used
        ]

    assert {name for name, *_ in health()} == used
    # On empty data every expression succeeds: wait for the exporter's series first (run alone, this test
    # came before the first scrape).
    wait_until("the exporter's series", lambda: stack.query("rdma_port_info")["data"]["result"], 30, [])
    wait_until("the records to be evaluated", lambda: all(h[1] != "unknown" for h in health() if h[3] <= 1), 30, [])
    records = health()
    assert not [h for h in records if h[1] == "err"], records
    failed = {name: answer for name, *_, query in records if (answer := stack.query(query))["status"] != "success"}
    assert not failed, failed


def panel_result(stack: Stack, stem: str, title: str, ref: str = "A",
                 chosen: dict[str, str] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """What one query of a panel returns now, the variables on All or as `chosen`."""
    board = load(GRAFANA / "dashboards" / f"{stem}.json")
    item = next(item for item in panels(board) if item["title"] == title)
    tgt = next(tgt for tgt in item["targets"] if tgt["refId"] == ref)
    answer = stack.query(substitute(tgt["expr"], board["templating"]["list"], chosen))
    assert answer["status"] == "success", f"{stem} / {title} / {ref}: {answer}"
    return list(answer["data"]["result"])


def total(result: list[dict[str, Any]]) -> float:
    return sum(float(r["value"][1]) for r in result)


def test_panels_count_and_filter_ports_as_the_alerts_do(stack: Stack) -> None:
    """On a node with SR-IOV VFs and a port down: port counts count links (not VFs), so that the ports not
    ACTIVE are the ports down that RdmaPortDown reports; per-port utilisation has no value for a port that
    is not ACTIVE; InfiniBand panels list no RoCE port; the PFC pause frames show every priority the
    pause-time record has, link-level pause (global) included."""
    samples = [s for f in text_string_to_metric_families(stack.exposition) for s in f.samples]
    vfs = {s.labels["device"] for s in samples if s.name == "rdma_device_sriov_virtual_function" and s.value == 1}
    layers = {(s.labels["device"], s.labels["port"]): s.labels["link_layer"] for s in samples
              if s.name == "rdma_port_info"}  # fmt: skip
    links = {port for port in layers if port[0] not in vfs}
    active = {(s.labels["device"], s.labels["port"]) for s in samples
              if s.name == "rdma_port_state_id" and s.value >= 4} & links  # fmt: skip
    assert vfs and (DOWN_PORT, "1") in links - active, "the tree has VFs and a port down"

    def problems() -> list[str]:
        found = []

        def expect(what: str, got: float, want: float) -> None:
            if got != want:
                found.append(f"{what}: {got:g}, expected {want:g}")

        for stem, title in (("fabric-overview", "Ports ACTIVE"), ("node-detail", "Ports ACTIVE"),
                            ("fabric-overview", "Ports ACTIVE per cluster")):  # fmt: skip
            expect(f"{stem} / {title} active", total(panel_result(stack, stem, title, "A")), len(active))
            expect(f"{stem} / {title} total", total(panel_result(stack, stem, title, "B")), len(links))
        logical = panel_result(stack, "fabric-overview", "Ports by state", "A")
        expect("Ports by state, logical", total(logical), len(links))
        expect("Ports by state, physical", total(panel_result(stack, "fabric-overview", "Ports by state", "B")),
               len(links))  # fmt: skip
        not_active = total([r for r in logical if r["metric"].get("state") not in ("ACTIVE", "ACTIVE_DEFER")])
        expect("Ports by state, not ACTIVE", not_active, total(panel_result(stack, "fabric-overview", "Ports down")))
        expect("Ports down", total(panel_result(stack, "fabric-overview", "Ports down")), len(links - active))
        for ref in ("A", "B"):
            shown = {r["metric"].get("device") for r in panel_result(stack, "node-detail", "Utilisation per port", ref)}
            if DOWN_PORT in shown:
                found.append(f"Utilisation per port {ref}: shows {DOWN_PORT}, which is not ACTIVE")
        for stem, title in (("fabric-overview", "Top InfiniBand ports by credit wait"), ("node-detail", "Credit wait")):
            result = panel_result(stack, stem, title)
            roce = {(r["metric"]["device"], r["metric"]["port"]) for r in result} & {
                port for port, layer in layers.items() if layer == "Ethernet"
            }
            if not result or roce:
                found.append(f"{stem} / {title}: {len(result)} ports, RoCE: {sorted(roce)}")
        priorities = "group by (priority) (instance_device_port:rdma_ethtool_pfc_pause_duration:ratio_rate5m)"
        listed = {r["metric"]["priority"] for r in stack.query(priorities)["data"]["result"]}
        board = load(GRAFANA / "dashboards" / "roce-congestion.json")
        refs = next(item for item in panels(board) if item["title"] == "PFC pause frames")["targets"]
        shown = {r["metric"].get("priority") for tgt in refs
                 for r in panel_result(stack, "roce-congestion", "PFC pause frames", tgt["refId"])}  # fmt: skip
        if "global" not in listed or listed - shown:
            found.append(f"PFC pause frames: priorities {sorted(listed)} listed, {sorted(shown - {None})} shown")
        return found

    assert_settles(problems)


# --- the priority variable of the RoCE dashboard -------------------------------------------------------

ROCE = "roce-congestion"
# Panels of the RoCE dashboard that narrow by $priority: those of the pause series, which have a priority
# "global" (link-level 802.3x pause); the per-priority panels of series without one, which show every
# priority of the ports under link-level pause while global is selected; and counts of configuration
# problems, never empty (a number, 0 included).
PAUSE_PANELS = {"Most-paused priority", "PFC pause frames", "Time paused"}
PER_PRIORITY_PANELS = {"ECN enabled", "Packets marked by the NIC", "Traffic per priority",
                       "Receive buffer discards per priority"}  # fmt: skip
COUNT_PANELS = {"ECN disabled", "Priorities that lost PFC", "Buffer discards (15 min)"}
PAUSE_DURATION = "instance_device_port:rdma_ethtool_pfc_pause_duration:ratio_rate5m"


def listed_values(stack: Stack, board: dict[str, Any], name: str) -> set[str]:
    """The values a variable lists, the variables before it on All."""
    variables = board["templating"]["list"]
    variable = next(v for v in variables if v["name"] == name)
    match = LABEL_VALUES.match(variable["query"])
    assert match
    url = f"{stack.prometheus}/api/v1/series?" + urllib.parse.urlencode(
        {"match[]": substitute(match["selector"], variables)}
    )
    return {s[match["label"]] for s in json.loads(get(url))["data"] if match["label"] in s}


def grafana_regex(values: set[str]) -> str:
    """A selection of several values as Grafana writes it into a regex matcher (values escaped)."""
    escaped = sorted(re.escape(v) for v in values)
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def exposed_priorities(stack: Stack, name: str, netdev: str) -> set[str]:
    return {s.labels["priority"] for f in text_string_to_metric_families(stack.exposition) for s in f.samples
            if s.name == name and s.labels.get("netdev") == netdev and "priority" in s.labels}  # fmt: skip


def shown(result: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(r["metric"].get("netdev", ""), r["metric"].get("priority", "")) for r in result}


def test_priority_variable_lists_every_port_and_its_panels_show_them(stack: Stack) -> None:
    """The priority variable lists the priorities of a port under link-level pause (no PFC counters) and
    `global`; on every selection (All, the whole list, global alone, each priority), the per-priority panels
    show each port's priorities of that selection, and those of the port under link-level pause while
    global is selected; the pause panels show the selected priorities of the pause-time record, and the
    counts a number."""
    board = load(GRAFANA / "dashboards" / f"{ROCE}.json")
    variable = next(v for v in board["templating"]["list"] if v["name"] == "priority")
    narrowed = {item["title"] for item in panels(board) if any("$priority" in t["expr"] for t in item["targets"])}
    assert narrowed == PAUSE_PANELS | PER_PRIORITY_PANELS | COUNT_PANELS, "classify the panels on $priority"
    names = exporter_names(stack.exposition)
    netdevs = (GLOBAL_PAUSE_NETDEV, PFC_NETDEV)
    assert not exposed_priorities(stack, "rdma_ethtool_pfc_pause_frames_total", GLOBAL_PAUSE_NETDEV)

    def problems() -> list[str]:
        found = []
        listed = listed_values(stack, board, "priority")
        for netdev in netdevs:
            for name in ("rdma_ethtool_priority_bytes_total", "rdma_netdev_ecn_enabled"):
                if missing := exposed_priorities(stack, name, netdev) - listed:
                    found.append(f"$priority lists {sorted(listed)}, not {sorted(missing)} of {netdev} {name}")
        if "global" not in listed:
            found.append(f"$priority lists {sorted(listed)}, not global")
        selections = {variable["allValue"], grafana_regex(listed), "global"} | (listed - {"global"})
        paused = shown(stack.query(PAUSE_DURATION)["data"]["result"])
        for selection in sorted(selections):
            chosen = {"priority": selection}

            def selected(priority: str, selection: str = selection) -> bool:
                return re.fullmatch(selection, priority) is not None

            for item in panels(board):
                title = item["title"]
                for tgt in item["targets"] if title in narrowed else ():
                    where = f"{title} {tgt['refId']} on priority {selection!r}"
                    result = panel_result(stack, ROCE, title, tgt["refId"], chosen)
                    if title in COUNT_PANELS:
                        if len(result) != 1:
                            found.append(f"{where}: {len(result)} values, not one")
                    elif title == "Time paused":
                        series = {(n, p) for n, p in paused if selected(p)}
                        if shown(result) != series:
                            found.append(f"{where}: shows {sorted(shown(result))}, not {sorted(series)}")
                    elif title in PER_PRIORITY_PANELS:
                        (metric,) = {s.name for s in selectors(tgt["expr"])} & names
                        for netdev in netdevs:
                            exposed = exposed_priorities(stack, metric, netdev)
                            everything = netdev == GLOBAL_PAUSE_NETDEV and selected("global")
                            want = {p for p in exposed if everything or selected(p)}
                            got = {p for n, p in shown(result) if n == netdev}
                            if got != want:
                                found.append(f"{where}: {netdev} priorities {sorted(got)}, not {sorted(want)}")
        return found

    assert_settles(problems)


def without_matchers(expr: str) -> list[str]:
    tokens, out, depth = tokenize(expr), [], 0
    for _, text in tokens:
        depth += text == "{"
        if not depth:
            out.append(text)
        depth -= text == "}"
    return out


@pytest.mark.parametrize(
    ("title", "name"),
    [("Priorities that lost PFC", "RdmaRocePfcDisabled"), ("Unknown statistics", "RdmaRoceStatisticsUnknown")],
)
def test_condition_panel_is_the_alert(title: str, name: str) -> None:
    """A RoCE panel that counts an alert's condition computes it as the rule does, with the dashboard's
    label matchers added."""
    (alert,) = [rule["expr"] for rule in rules() if rule.get("alert") == name]
    board = load(GRAFANA / "dashboards" / f"{ROCE}.json")
    (tgt,) = next(item for item in panels(board) if item["title"] == title)["targets"]
    want, have = without_matchers(alert), without_matchers(tgt["expr"])
    assert any(have[i : i + len(want)] == want for i in range(len(have))), tgt["expr"]


def test_a_priority_that_lost_pfc_stays_on_the_dashboard(stack: Stack) -> None:
    """PFC disabled on a priority that used it (mlx5 drops its PFC counters): the variable still lists the
    priority, the ECN panels still show it there, and the panel of priorities that lost PFC counts it, as
    the alert's expression finds it."""
    board = load(GRAFANA / "dashboards" / f"{ROCE}.json")
    (alert,) = [rule["expr"] for rule in rules() if rule.get("alert") == "RdmaRocePfcDisabled"]
    pfc = f'rdma_ethtool_pfc_pause_frames_total{{netdev="{PFC_NETDEV}", priority="{PFC_PRIORITY}"}}'
    used = f'instance_device_port:rdma_ethtool_pfc_used:present1d{{netdev="{PFC_NETDEV}", priority="{PFC_PRIORITY}"}}'
    one = {"priority": PFC_PRIORITY}

    def lost(chosen: dict[str, str] | None = None) -> float:
        return total(panel_result(stack, ROCE, "Priorities that lost PFC", "A", chosen))

    wait_until("the baseline: PFC used and not lost", lambda: stack.query(used)["data"]["result"] and
               stack.query(pfc)["data"]["result"] and lost() == 0, DEADLINE, [])  # fmt: skip
    capture = stack.ethtool / PFC_NETDEV
    original = capture.read_text()

    def problems() -> list[str]:
        found = []
        if stack.query(pfc)["data"]["result"]:
            return ["the PFC counters are still there"]
        fired = shown(stack.query(alert)["data"]["result"])
        if fired != {(PFC_NETDEV, PFC_PRIORITY)}:
            found.append(f"the alert's expression finds {sorted(fired)}")
        for chosen in (None, one):
            if lost(chosen) != len(fired):
                found.append(f"Priorities that lost PFC on {chosen}: {lost(chosen):g}, the alert {len(fired)}")
        if PFC_PRIORITY not in listed_values(stack, board, "priority"):
            found.append(f"$priority does not list {PFC_PRIORITY}")
        for title in ("ECN enabled", "Packets marked by the NIC"):
            if (PFC_NETDEV, PFC_PRIORITY) not in shown(panel_result(stack, ROCE, title, "A", one)):
                found.append(f"{title} on priority {PFC_PRIORITY} does not show {PFC_NETDEV}")
        return found

    try:
        capture.write_text(PFC_COUNTER.sub("", original))
        assert_settles(problems)
    finally:
        capture.write_text(original)
        wait_until("the PFC counters back", lambda: stack.query(pfc)["data"]["result"], DEADLINE, [])


def test_unknown_statistics_panel_is_the_alert(stack: Stack) -> None:
    """A netdev whose driver the exporter does not curate, but two of whose generic names it does (a
    capture as Chelsio's cxgb4 prints it, pause frames and no CRC counter it knows): the panel counts
    it, as RdmaRoceStatisticsUnknown's expression finds it; with the netdev's own capture both are 0."""
    (alert,) = [rule["expr"] for rule in rules() if rule.get("alert") == "RdmaRoceStatisticsUnknown"]
    curated = f'rdma_ethtool_curated_stats{{netdev="{PFC_NETDEV}"}}'

    def unknown() -> float:
        return total(panel_result(stack, ROCE, "Unknown statistics"))

    wait_until("the baseline: curated statistics", lambda: stack.query(curated)["data"]["result"] and
               stack.query(alert)["data"]["result"] == [] and unknown() == 0, DEADLINE, [])  # fmt: skip
    capture = stack.ethtool / PFC_NETDEV
    original = capture.read_text()

    def problems() -> list[str]:
        found = []
        values = [float(r["value"][1]) for r in stack.query(curated)["data"]["result"]]
        if values != [2]:
            return [f"rdma_ethtool_curated_stats is {values}"]
        fired = {r["metric"]["netdev"] for r in stack.query(alert)["data"]["result"]}
        if fired != {PFC_NETDEV}:
            found.append(f"the alert's expression finds {sorted(fired)}")
        if unknown() != len(fired):
            found.append(f"Unknown statistics: {unknown():g}, the alert {len(fired)}")
        return found

    try:
        # Names as cxgb4 prints them (padded): the generic pause counters are curated, the rest is not.
        capture.write_text("NIC statistics:\n     tx_frames_ok      : 12\n     tx_pause_frames   : 0\n"
                           "     rx_frames_ok      : 34\n     rx_pause_frames   : 0\n"
                           "     rx_fcs_err        : 0\n")
        assert_settles(problems)
    finally:
        capture.write_text(original)
        wait_until("curated statistics back", lambda: unknown() == 0, DEADLINE, [])


# --- panels against the rules' own scenarios (promtool) -------------------------------------------------

BER_5M = "instance_device_port:rdma_port_bit_error_rate:ratio_rate5m"


def promtool_checks(tmp_path: Path, series: dict[str, str], checks: list[tuple[str, str, float]]) -> list[str]:
    """Run `promtool test rules` with the repository's rules on `series` (1-minute samples), checking each
    (expr, eval_time, value) as `expr` returning the one sample `value` without labels, under each
    Prometheus line; the failures."""
    test = {
        "rule_files": [str(p) for p in sorted((ROOT / "rules").glob("*.rules.yml"))],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in series.items()],
                "promql_expr_test": [
                    {"expr": expr, "eval_time": at, "exp_samples": [{"labels": "{}", "value": value}]}
                    for expr, at, value in checks
                ],
            }
        ],
    }
    path = tmp_path / "panels.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return promtool_failures("test", "rules", str(path), timeout=120)


def queries_reading(names: set[str]) -> dict[str, str]:
    """Every panel query of the dashboards that reads one of `names`, by "dashboard / panel / refId", with
    its variables substituted as on All."""
    found = {}
    for path in DASHBOARD_FILES:
        variables = load(path)["templating"]["list"]
        for item in panels(load(path)):
            for tgt in item["targets"]:
                if names & {s.name for s in read_series(tgt["expr"])}:
                    found[f"{path.stem} / {item['title']} / {tgt['refId']}"] = substitute(tgt["expr"], variables)
    return found


def test_bit_error_rate_panels_keep_showing_a_port_whose_counter_saturated(tmp_path: Path) -> None:
    """A link bad enough to page saturates its 16-bit symbol_error counter within minutes (50 errors a
    second reach 65535 in 22), after which its 5-minute rate is 0 while RdmaPortBitErrorRateHigh keeps
    paging from the saturated record until the counter is reset. Every panel that shows the 5-minute
    bit-error rate (coloured red above 1e-12, as the critical alert) must still show that port above
    1e-12, not drop it to 0 and out of the top ten while the page is on."""
    port = 'job="rdma-exporter", instance="dgx-122:9883", device="mlx5_6", port="1"'
    series = {
        'up{job="rdma-exporter", instance="dgx-122:9883"}': "1x240",
        f'rdma_port_info{{{port}, link_layer="InfiniBand"}}': "1x240",
        f"rdma_port_rate_bytes_per_second{{{port}}}": "5e10x240",
        f"rdma_port_physical_state_id{{{port}}}": "5x240",
        f"rdma_port_state_id{{{port}}}": "4x240",
        f"rdma_port_symbol_errors_total{{{port}}}": "0+3000x21 65535x218",
        f'rdma_port_pma_saturated{{{port}, counter="symbol_error"}}': "0x21 1x218",
    }
    # 150m: saturated for two hours, so both the 5-minute and the hourly rate are 0.
    page = 'count(ALERTS{alertname="RdmaPortBitErrorRateHigh", severity="critical", alertstate="firing"})'
    reading = queries_reading({BER_5M})
    shown = list(reading)
    checks = [(page, "150m", 1.0), *((f"count(({expr}) > 1e-12)", "150m", 1.0) for expr in reading.values())]
    assert len(shown) >= 4, shown
    problems = promtool_checks(tmp_path, series, checks)
    assert not problems, f"{shown}:\n" + "\n".join(problems)


TRANSMIT_WAIT = {
    "instance_device_port:rdma_port_transmit_wait:ratio_rate5m",
    "instance:rdma_port_transmit_wait:max_ratio_rate5m",
}


def test_credit_wait_panels_show_the_port_that_pages_whose_link_layer_is_unknown(tmp_path: Path) -> None:
    """RdmaPortTransmitWaitHigh leaves out ports known to be RoCE (PFC pauses them). A port whose
    link_layer read failed has no rdma_port_info and still pages: every credit-wait panel must show it,
    not keep known InfiniBand ports only."""
    port = 'job="rdma-exporter", instance="dgx-123:9883", device="mlx5_6", port="1"'
    series = {
        'up{job="rdma-exporter", instance="dgx-123:9883"}': "1x60",
        f"rdma_port_rate_bytes_per_second{{{port}}}": "5e10x60",
        f"rdma_port_state_id{{{port}}}": "4x60",
        f"rdma_port_transmit_wait_total{{{port}}}": "0+1.875e11x60",  # half the link time
    }
    page = 'count(ALERTS{alertname="RdmaPortTransmitWaitHigh", alertstate="firing"})'
    reading = queries_reading(TRANSMIT_WAIT)
    shown = list(reading)
    checks = [(page, "30m", 1.0), *((f"count(({expr}) > 0.1)", "30m", 1.0) for expr in reading.values())]
    assert len(shown) >= 3, shown
    problems = promtool_checks(tmp_path, series, checks)
    assert not problems, f"{shown}:\n" + "\n".join(problems)


ALIAS_RECORD = re.compile(r"rate\(\w+\[\w+\]\)(?: or rate\(\w+\[\w+\]\))+")


def test_panels_read_every_driver_name_that_the_records_read() -> None:
    """A record that reads one counter under each driver's name (`rate(a[5m]) or rate(b[5m]) ...`) lists
    every name a driver gives it. A panel that reads those raw counters rather than the record reads every
    one of those names too, or a driver's ports are missing from it: mainline bnxt_re counts its CNPs
    sent in np_cnp_pkts since its 2025 rename (the golden built-multi-driver exposition has one)."""
    golden = exporter_names("".join(p.read_text() for p in sorted((ROOT / "tests" / "golden").glob("*.prom"))))
    assert "rdma_port_hw_np_cnp_pkts_total" in golden
    aliases = [{s.name for s in selectors(rule["expr"])} for rule in rules()
               if "record" in rule and ALIAS_RECORD.fullmatch(" ".join(rule["expr"].split()))]  # fmt: skip
    assert any("rdma_port_hw_np_cnp_pkts_total" in names for names in aliases), aliases
    missing = []
    for dashboard, item, tgt in all_targets():
        read = {s.name for s in selectors(tgt["expr"]) if not s.presence}
        for names in aliases:
            if read & names and names - read:
                missing.append(f"{dashboard} / {item['title']} / {tgt['refId']}: reads {sorted(read & names)}, "
                               f"not {sorted(names - read)}")  # fmt: skip
    assert not missing, "\n".join(missing)


PAUSE_RATIO = "instance_device_port:rdma_ethtool_pfc_pause_duration:ratio_rate5m"


def test_roce_panels_show_the_worst_nodes_each_whole(tmp_path: Path) -> None:
    """The RoCE dashboard opens on All nodes. On a fleet its per-series panels would draw one line per node,
    netdev, priority and direction (tens of thousands): they show the few nodes with the highest values
    (the lowest, for ECN state: disabled first), each with all its series, and one node chosen shows whole.
    Seven nodes, each paused on priority 3 rx (node k: k %) and not at all tx; ECN disabled on n1 and n6."""
    board = load(GRAFANA / "dashboards" / "roce-congestion.json")
    variables = board["templating"]["list"]
    worst = build_module().WORST_NODES
    nodes = [f"n{k}:9883" for k in range(1, 8)]
    assert len(nodes) > worst
    series: dict[str, str] = {}
    for k, node in enumerate(nodes, start=1):
        port = f'job="rdma-exporter", instance="{node}", device="mlx5_0", port="1", netdev="eth0", priority="3"'
        series[f'{PAUSE_RATIO}{{{port}, direction="rx"}}'] = f"{k / 100}x10"
        series[f'{PAUSE_RATIO}{{{port}, direction="tx"}}'] = "0x10"
        for role in ("np", "rp"):
            series[f'rdma_netdev_ecn_enabled{{{port}, role="{role}"}}'] = "0x10" if k in (1, 6) else "1x10"

    def expr(title: str, chosen: dict[str, str] | None = None) -> str:
        item = next(item for item in panels(board) if item["title"] == title)
        assert len(item["targets"]) == 1, title
        return substitute(item["targets"][0]["expr"], variables, chosen)

    paused, ecn = expr("Time paused"), expr("ECN enabled")
    checks = [
        (f"count({paused})", "5m", 2 * worst),  # every series of each node shown
        (f"count(count by (instance) ({paused}))", "5m", worst),
        (f"min(max by (instance) ({paused}))", "5m", (len(nodes) - worst + 1) / 100),  # the worst, not any five
        (f"count({expr('Time paused', {'instance': 'n1:9883'})})", "5m", 2),  # one node: whole, though the least
        (f"count(count by (instance) ({ecn}))", "5m", worst),
        (f"count(count by (instance) (({ecn}) == 0))", "5m", 2),  # both nodes with ECN disabled among them
    ]
    problems = promtool_checks(tmp_path, series, checks)
    assert not problems, "\n".join(problems)


# Catches (worst nodes ranked by everything drawn): mlx5 leaves ECN off on lossy priorities and sheds bursts
# there, so every node's lowest ECN was 0 and its highest drop rate a lossy one: the five nodes shown were
# any five, and never the one whose lossless priority lost ECN or dropped packets (dashboard review).
def test_roce_panels_rank_nodes_by_their_lossless_priorities(tmp_path: Path) -> None:
    nodes = [f"n{k}:9883" for k in range(1, 13)]
    series: dict[str, str] = {}
    for k, node in enumerate(nodes, start=1):
        at = f'job="rdma-exporter", instance="{node}", device="mlx5_0"'
        series[f'rdma_device_info{{{at}, pci_address="0000:0c:00.0"}}'] = "1x20"
        for priority in ("0", "3"):
            where = f'{at}, port="1", netdev="eth0", priority="{priority}"'
            lossless = priority == "3"
            series[f'rdma_ethtool_priority_bytes_total{{{where}, direction="rx"}}'] = "0+1e9x20"
            if lossless:  # PFC pauses priority 3 now and then: it is lossless
                series[f'rdma_ethtool_pfc_pause_frames_total{{{where}, direction="rx"}}'] = "0+10x20"
            # ECN off on the lossy priority of every node, and on the lossless one of n12 only.
            enabled = "1x20" if lossless and k != 12 else "0x20"
            series[f'rdma_netdev_ecn_enabled{{{where}, role="np"}}'] = enabled
            # Lossy drops everywhere, fewest on n12, which drops on its lossless priority too.
            drops = f"0+{100 * (13 - k)}x20" if not lossless else ("0+60x20" if k == 12 else "0x20")
            series[f'rdma_ethtool_priority_discards_total{{{where}, direction="rx"}}'] = drops

    shown = 'count(({}) and on (instance) {{instance="n12:9883"}})'
    ecn = panel_expr(ROCE, "ECN enabled")
    discards = panel_expr(ROCE, "Receive buffer discards per priority", "C").replace("[15s]", "[5m]")
    checks = [(shown.format(ecn), "15m", 2.0), (shown.format(discards), "15m", 2.0)]  # n12's series, all of them
    problems = promtool_checks(tmp_path, series, checks)
    assert not problems, "\n".join(problems)


def test_pfc_panels_judge_each_hca_by_its_own_day_when_a_reload_swaps_the_names(tmp_path: Path) -> None:
    """The ECN and lost-PFC panels join the day of PFC use on the HCA (its PCI address), as
    RdmaRoceEcnDisabled and RdmaRocePfcDisabled do. A driver reload at 21m swaps two HCAs' device names:
    enp12s0f0np0's HCA ran RoCE with PFC and ECN as mlx5_0 and comes back as mlx5_1 with both lost;
    enp13s0f0np0's HCA runs priority 3 lossy on purpose (no PFC, ECN off) as mlx5_1, then as mlx5_0.
    Joined on the name, the panels counted the lossy port and missed the one that lost its settings."""
    node = 'job="rdma-exporter", instance="dgx-191:9883"'

    def info(device: str, pci: str) -> str:
        return (f'rdma_device_info{{{node}, board_id="MT_0000000838", device="{device}", driver="mlx5_core", '
                f'fw_ver="28.41.1000", hca_type="MT4129", hw_rev="0x0", node_desc="dgx-191 {device}", '
                f'node_guid="b8ce:f603:00bf:{pci[5:7]}00", node_type="CA", pci_address="{pci}", '
                f'pf_pci_address="", sys_image_guid="b8ce:f603:00bf:{pci[5:7]}00"}}')

    def port(metric: str, device: str, netdev: str, extra: str = 'direction="rx"') -> str:
        return f'{metric}{{{node}, device="{device}", port="1", netdev="{netdev}", {extra}, priority="3"}}'

    before, after = "0+1e9x20 stale", "_x21 2.1e10+1e9x38"
    series = {
        info("mlx5_0", "0000:0c:00.0"): "1x20 stale",
        info("mlx5_1", "0000:0d:00.0"): "1x20 stale",
        info("mlx5_0", "0000:0d:00.0"): "_x21 1x38",
        info("mlx5_1", "0000:0c:00.0"): "_x21 1x38",
        port("rdma_ethtool_pfc_pause_frames_total", "mlx5_0", "enp12s0f0np0"): "0+10x20 stale",
        port("rdma_ethtool_priority_bytes_total", "mlx5_0", "enp12s0f0np0"): before,
        port("rdma_netdev_ecn_enabled", "mlx5_0", "enp12s0f0np0", 'role="np"'): "1x20 stale",
        port("rdma_ethtool_priority_bytes_total", "mlx5_1", "enp12s0f0np0"): after,
        port("rdma_netdev_ecn_enabled", "mlx5_1", "enp12s0f0np0", 'role="np"'): "_x21 0x38",
        port("rdma_ethtool_priority_bytes_total", "mlx5_1", "enp13s0f0np0"): before,
        port("rdma_netdev_ecn_enabled", "mlx5_1", "enp13s0f0np0", 'role="np"'): "0x20 stale",
        port("rdma_ethtool_priority_bytes_total", "mlx5_0", "enp13s0f0np0"): after,
        port("rdma_netdev_ecn_enabled", "mlx5_0", "enp13s0f0np0", 'role="np"'): "_x21 0x38",
    }
    board = load(GRAFANA / "dashboards" / f"{ROCE}.json")
    variables = board["templating"]["list"]
    checks = []
    for title, alert in (("ECN disabled", "RdmaRoceEcnDisabled"), ("Priorities that lost PFC", "RdmaRocePfcDisabled")):
        (tgt,) = next(item for item in panels(board) if item["title"] == title)["targets"]
        expr = substitute(tgt["expr"], variables)
        assert expr.startswith("count(\n") and expr.endswith("\n) or vector(0)"), expr
        counted = expr[len("count(\n") : -len("\n) or vector(0)")]
        # Only the port that lost its settings, under its name of now, in the panel and in the alert.
        checks.append((expr, "40m", 1.0))
        checks.append((f'count(({counted}) and on (device) rdma_device_info{{device="mlx5_1"}})', "40m", 1.0))
        checks.append((f'count(ALERTS{{alertname="{alert}", alertstate="firing", device="mlx5_1"}})', "40m", 1.0))
    problems = promtool_checks(tmp_path, series, checks)
    assert not problems, "\n".join(problems)


# --- what the panels compute, beyond parsing and returning data (a mutation review of build.py) -----------


# Catches (node_link -> /d/rdma-fabric-overview/...) and (top-ten bars pass
# var-instance=${__field.labels.device}): the drill-down from a row or bar must open the node page, on the
# instance of what was clicked. test_drill_down_links_keep_the_selection_the_row_does_not_set only checks
# that *some* var-instance is passed and that the target exists.
def test_drill_downs_open_the_node_page_of_the_clicked_instance() -> None:
    """To the node's detail, or for the fleet's RoCE congestion panels to its RoCE congestion page: node
    detail has no PFC, ECN or CNP panel, and a click on the worst RoCE port showed none of it (review)."""
    checked = 0
    roce = 0
    for stem, url in all_urls():
        if not url.startswith("/d/") or "var-instance=" not in url:
            continue
        roce += url.startswith("/d/rdma-roce-congestion/")
        assert url.startswith(("/d/rdma-node-detail/", "/d/rdma-roce-congestion/")), (
            f"{stem}: instance drill-down to another page: {url}"
        )
        (value,) = re.findall(r"var-instance=([^&]*)", url)
        assert re.fullmatch(r"\$\{__(?:field\.labels|data\.fields)\.instance\}", value), (
            f"{stem}: var-instance is not the clicked instance: {url}"
        )
        # Its cluster too: node names repeat across clusters, and the selection's (All) opened every node of
        # the name at once (review).
        (cluster,) = re.findall(r"var-cluster=([^&]*)", url)
        assert cluster == value.replace(".instance", ".cluster"), f"{stem}: not the clicked cluster: {url}"
        checked += 1
    assert checked >= 3 and roce >= 3


# Catches (the alertname column's field link loses ".md"): test_runbook_links_resolve only reads the
# panels' own "links", not the per-field links in overrides, so a runbook URL there was never checked.
def test_every_runbook_url_anywhere_resolves() -> None:
    checked = 0
    for stem, url in all_urls():
        if not url.startswith(RUNBOOK_URL):
            continue
        name = url[len(RUNBOOK_URL) :]
        assert name.endswith(".md"), f"{stem}: runbook link without .md: {url}"
        if "${" not in name:
            assert (RUNBOOK_DIR / name).is_file(), url
        else:  # a field link: the alertname of the row
            assert name == "${__data.fields.alertname}.md", url
        checked += 1
    assert checked >= 20


# Catches (the device variable runs label_values(rdma_port_info{...}, port): the Device drop-down lists
# port numbers and $device then matches no device). test_template_variables checks the selector and the
# chain, not which label is listed.
@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_each_variable_lists_its_own_label(path: Path) -> None:
    for variable in load(path)["templating"]["list"][1:]:
        match = LABEL_VALUES.match(variable["query"])
        assert match and match["label"] == variable["name"], f"{variable['name']}: lists {match and match['label']}"


# Catches (job variable from label_values(up, job)): All of job is the jobs listed (no allValue), so the
# list must hold only jobs that scrape rdma-exporter, or the instance list and the exporter panels fill with
# every other job Prometheus scrapes.
@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_job_variable_lists_rdma_exporter_jobs_only(path: Path) -> None:
    (job,) = [v for v in load(path)["templating"]["list"] if v["name"] == "job"]
    match = LABEL_VALUES.match(job["query"])
    assert match
    names = {s.name for s in selectors(match["selector"])}
    assert names and all(name.startswith("rdma_exporter_") for name in names), job["query"]


def column_renames(item: dict[str, Any]) -> dict[str, str]:
    """A table's column renames: its "organize" transformation's renameByName (a panel has at most one)."""
    organize = [t for t in item.get("transformations", []) if t["id"] == "organize"]
    assert len(organize) <= 1, item["title"]
    return organize[0]["options"].get("renameByName", {}) if organize else {}


def target_units(item: dict[str, Any]) -> dict[str, str]:
    """refId -> the unit Grafana draws that query's values in: the default, or an override that matches the
    query by name (its legend, or the column a table renames its value to) or by refId."""
    tgts = item["targets"]
    units = {t["refId"]: item["fieldConfig"]["defaults"]["unit"] for t in tgts}
    renames = column_renames(item)
    for override in item["fieldConfig"]["overrides"]:
        matcher = override["matcher"]
        for prop in override["properties"]:
            if prop["id"] != "unit":
                continue
            for tgt in tgts:
                names = {tgt["legendFormat"], renames.get(f"Value #{tgt['refId']}")}
                if len(tgts) == 1:
                    names.add(renames.get("Value"))
                if (matcher["id"] == "byName" and matcher["options"] in names) or (
                    matcher["id"] == "byFrameRefID" and matcher["options"] == tgt["refId"]
                ):
                    units[tgt["refId"]] = prop["value"]
    return units


RATIO_UNITS = ("percentunit", "none", "sci")  # units of a quotient, whatever the units of its parts


# Catches (fabric "RDMA throughput" tx without * 8 in a bps panel: an 8x too low number), (node "Link
# rate and width" Rate column without * 8, a 400 Gb/s port shown as 50 Gb/s), ("Throughput per cluster"
# in Bps while the query is in bits: 8x too high) and (PCIe "Speed" column without / 1e9 under the
# "GT/s" suffix: 32000000000 GT/s). The series are in bytes and transfers per second; the units are bits
# per second and GT/s.
def test_units_match_the_scale_of_the_query() -> None:
    checked = 0
    for path, item in all_panels():
        units = target_units(item)
        for tgt in item["targets"]:
            where, unit, expr = f"{path.stem} / {item['title']} / {tgt['refId']}", units[tgt["refId"]], tgt["expr"]
            bits = re.search(r"\*\s*8\b", expr) is not None
            # A ratio (bits corrected per bit at line speed) may turn bytes into bits inside it.
            ratio = unit in RATIO_UNITS and "/" in expr
            if not ratio:
                assert (unit == "bps") == bits, f"{where}: unit {unit!r}, query {'in bits' if bits else 'not * 8'}"
            reads_bytes = any("bytes" in s.name and not s.presence for s in selectors(expr))
            if reads_bytes and unit not in RATIO_UNITS:
                assert bits, f"{where}: bytes drawn as {unit!r}"
            if any(s.name.endswith("_celsius") for s in selectors(expr)):
                assert unit == "celsius", f"{where}: temperatures drawn as {unit!r}"
            if "transfers_per_second" in expr and unit != "none":
                assert unit == "suffix: GT/s" and "/ 1e9" in expr, f"{where}: {unit!r} of {expr}"
            checked += 1
    assert checked >= 100


# Catches (PCIe outbound stalls in "percent": the 0..1 ratio drawn as 0.5 % instead of 50 %). No series
# of the exporter or the rules is a percentage: every share is a 0..1 ratio (percentunit).
def test_no_panel_draws_a_ratio_as_percent() -> None:
    for path, item in all_panels():
        assert "percent" not in target_units(item).values(), f"{path.stem} / {item['title']}: percent"


DIRECTION_WORDS = {
    "tx": re.compile(r"transmit|_tx_|_out_"),
    "rx": re.compile(r"receive|_rx_|_in_"),
}


# Catches (node "Throughput per port" legends tx/rx swapped), (fabric "Utilisation" tx computed from
# the receive record) and ("Throughput per rail" rx line reading the transmit record): a line named tx
# must read transmit series only, rx receive series only.
def test_tx_and_rx_lines_read_their_direction() -> None:
    checked = 0
    for dashboard, item, tgt in all_targets():
        words = set(re.findall(r"\b(tx|rx)\b", tgt["legendFormat"]))
        if len(words) != 1:
            continue
        (word,) = words
        other = "rx" if word == "tx" else "tx"
        read = {s.name for s in selectors(tgt["expr"]) if not s.presence}
        where = f"{dashboard} / {item['title']} / {tgt['refId']}"
        assert any(DIRECTION_WORDS[word].search(n) for n in read), f"{where}: {word} reads {sorted(read)}"
        assert not any(DIRECTION_WORDS[other].search(n) for n in read), f"{where}: {word} reads {sorted(read)}"
        checked += 1
    assert checked >= 10


# Catches (fabric "Alerts firing": the "critical" query counts severity="warning"): a query of ALERTS
# narrowed to one severity is named after that severity.
def test_alert_counts_by_severity_are_named_after_it() -> None:
    checked = 0
    for _, item, tgt in all_targets():
        for s in selectors(tgt["expr"]):
            if s.name == "ALERTS" and s.matchers.get("severity", ("", ""))[0] == "=":
                assert tgt["legendFormat"] == s.matchers["severity"][1], f"{item['title']} {tgt['refId']}"
                checked += 1
    assert checked >= 2


# Catches (node "Alerts firing" one count coloured orange: a page looked like a ticket): a stat that counts
# firing alerts counts each severity apart, critical in red and warning in orange.
def test_alert_counts_colour_a_page_red_and_a_ticket_orange() -> None:
    checked = 0
    for _, item in all_panels():
        every_alert = [s for t in item["targets"] for s in selectors(t["expr"])
                       if s.name == "ALERTS" and s.matchers.get("alertname") == ("=~", "Rdma.*")]  # fmt: skip
        if item["type"] != "stat" or not every_alert:
            continue
        names = [t["legendFormat"] for t in item["targets"]]
        assert names == ["critical", "warning"], f"{item['title']}: {names}"
        steps = target_steps(item)
        assert {ref: steps[ref][-1]["color"] for ref in ("A", "B")} == {"A": "red", "B": "orange"}, item["title"]
        checked += 1
    assert checked >= 2


# Catches (a node name in two clusters drew two lines under one name): every legend that names a node names
# its cluster, at its end (targets without the label leave it blank there).
def test_a_legend_that_names_its_node_names_its_cluster() -> None:
    checked = 0
    for _, item, tgt in all_targets():
        if "{{instance}}" in tgt["legendFormat"]:
            assert tgt["legendFormat"].endswith(" {{cluster}}"), f"{item['title']} {tgt['refId']}"
            checked += 1
    assert checked >= 50


# Catches (per-cluster panels: a cluster whose nodes two jobs scrape drew two lines, both "tx c1"): the
# fleet's per-cluster and per-rail lines sum the jobs of a cluster.
def test_cluster_lines_sum_the_jobs_of_a_cluster(tmp_path: Path) -> None:
    series = {}
    for job, nodes in (("rdma", 3), ("rdma-tls", 1)):
        labels = f'job="{job}", cluster="c1"'
        series[f"cluster:rdma_port_transmit_bytes:rate5m{{{labels}}}"] = f"{nodes * 1e9}x10"
        series[f"cluster:rdma_port_active_rate_bytes_per_second:sum{{{labels}}}"] = f"{nodes * 5e10}x10"
        series[f"cluster:rdma_ports_active:count{{{labels}}}"] = f"{nodes * 8}x10"
        series[f'cluster_device_port:rdma_port_transmit_bytes:rate5m{{{labels}, device="mlx5_0", port="1"}}'] = (
            f"{nodes * 1e8}x10"
        )
    overview = "fabric-overview"
    checks = [
        (f"count({panel_expr(overview, 'Throughput per cluster')})", "5m", 1.0),
        (f"sum({panel_expr(overview, 'Throughput per cluster')})", "5m", 4e9 * 8),
        (f"count({panel_expr(overview, 'Utilisation per cluster')})", "5m", 1.0),
        (f"sum({panel_expr(overview, 'Utilisation per cluster')})", "5m", 0.02),
        (f"count({panel_expr(overview, 'Ports ACTIVE per cluster')})", "5m", 1.0),
        (f"sum({panel_expr(overview, 'Ports ACTIVE per cluster')})", "5m", 32.0),
        (f"count({panel_expr(overview, 'Throughput per rail')})", "5m", 1.0),
        (f"sum({panel_expr(overview, 'Throughput per rail')})", "5m", 4e8 * 8),
    ]
    problems = promtool_checks(tmp_path, series, checks)
    assert not problems, "\n".join(problems)


# Catches (Exporter up: 1 mapped to "down") and (ECN enabled: 1 mapped to "disabled"): every 0/1 gauge
# the panels map (up, collector success, ECN enabled) is healthy at 1.
def test_boolean_value_mappings_are_healthy_at_one() -> None:
    checked = 0
    for _, item in all_panels():
        for mapping in item["fieldConfig"]["defaults"].get("mappings", []):
            options = mapping["options"]
            if set(options) != {"0", "1"}:
                continue
            assert options["1"]["color"] == "green" and options["0"]["color"] != "green", item["title"]
            assert options["1"]["text"] in ("up", "ok", "enabled"), item["title"]
            checked += 1
    assert checked >= 3


def panel_expr(stem: str, title: str, ref: str = "A") -> str:
    """One query of a panel with its variables on All, as Grafana sends it."""
    board = load(GRAFANA / "dashboards" / f"{stem}.json")
    item = next(item for item in panels(board) if item["title"] == title)
    tgt = next(tgt for tgt in item["targets"] if tgt["refId"] == ref)
    return substitute(tgt["expr"], board["templating"]["list"])


# One promtool scenario on the series the fleet panels read (alert states and recording rules), checking
# what the panels compute, not only that they parse and return something:
# - (Ports down counts firing only): a port whose RdmaPortDown is pending (its first 2 minutes down) is
#   down, as the description says ("pending or firing"); both dashboards' "Ports down" show 2, not 1.
# - (fabric "Alerts firing" critical reads warning) and (node "Alerts firing" counts pending):
#   one critical and two warning alerts firing, one pending.
# - (links_below's others keep width, so SR-IOV VFs' width shortfalls are counted): a VF reporting
#   its PF's narrow link is not a link below expected, as RdmaPortRateBelowExpected leaves it out.
# - (ports flapping at one drop) and (link drops summed over sources, one drop counted twice):
#   a port whose one drop two sources saw, and a port that dropped twice.
# - (most congested nodes: bottomk): six nodes, the five most congested shown.
# - (hottest HCA sensors: temperature plus the threshold): 80 °C under a 90 °C threshold is -10.
# - ("Top InfiniBand ports by credit wait" without NOT_ETHERNET): a RoCE port's credit wait is not
#   ranked. The end-to-end test cannot see this: the sample tree's RoCE ports have no transmit-wait series.
def test_fleet_panels_compute_what_they_say(tmp_path: Path) -> None:
    node = 'job="rdma-exporter", instance="n1:9883"'

    def alert(name: str, state: str, severity: str, device: str) -> str:
        return (f'ALERTS{{{node}, alertname="{name}", alertstate="{state}", severity="{severity}", '
                f'device="{device}", port="1"}}')  # fmt: skip

    below = "instance_device:rdma_link_below_expected:ratio"
    events = "instance_device_port:rdma_port_link_down_events:increase1h"
    series = {
        alert("RdmaPortDown", "pending", "critical", "mlx5_0"): "1x10",
        alert("RdmaPortDown", "firing", "critical", "mlx5_1"): "1x10",
        alert("RdmaPortReceiveErrors", "firing", "warning", "mlx5_2"): "1x10",
        alert("RdmaPortTransmitDiscards", "firing", "warning", "mlx5_2"): "1x10",
        # (Ports down counts RdmaPortDown only): a port gone from the system, which the expected topology also
        # misses, is down, and once.
        alert("RdmaPortVanished", "firing", "critical", "mlx5_9"): "1x10",
        alert("RdmaExpectedPortMissing", "firing", "critical", "mlx5_9"): "1x10",
        # Two devices expected and missing, by name and by PCI address: neither has a port, the second no
        # device name either (the panels' port and device selectors missed both).
        f'ALERTS{{{node}, alertname="RdmaExpectedDeviceMissing", alertstate="firing", severity="critical", '
        'device="mlx5_13"}': "1x10",
        f'ALERTS{{{node}, alertname="RdmaExpectedDeviceMissing", alertstate="firing", severity="critical", '
        'pci_address="0000:ab:00.0"}': "1x10",
        # (Links below expected blind without an expected topology): a port below its peers and its day.
        alert("RdmaPortRateBelowPeers", "firing", "critical", "mlx5_10"): "1x10",
        alert("RdmaPortRateBelowRecentMax", "firing", "critical", "mlx5_10"): "1x10",
        # A cluster's alert, about no node: the fleet view counts and lists it under any node selection.
        'ALERTS{job="rdma-exporter", alertname="RdmaHistoryRulesMissing", alertstate="firing", severity="warning"}': (
            "1x10"
        ),
        # A VF (mlx5_8) reports its PF's width; a PF (mlx5_3) trained below its expected rate.
        f'{below}{{{node}, device="mlx5_8", port="1", problem="width", reference="expected"}}': "0.5x10",
        f'rdma_device_sriov_virtual_function{{{node}, device="mlx5_8"}}': "1x10",
        f'{below}{{{node}, device="mlx5_3", port="1", problem="rate", reference="expected"}}': "0.5x10",
        f'rdma_device_sriov_virtual_function{{{node}, device="mlx5_3"}}': "0x10",
        # mlx5_4: one drop seen by link_downed and the PHY counter; mlx5_5: two drops.
        f'{events}{{{node}, device="mlx5_4", port="1", source="link_downed"}}': "1x10",
        f'{events}{{{node}, device="mlx5_4", port="1", netdev="eth4", source="link_down_events_phy"}}': "1x10",
        f'{events}{{{node}, device="mlx5_5", port="1", source="link_downed"}}': "2x10",
        f'rdma_device_temperature_celsius{{{node}, device="mlx5_0", sensor="asic"}}': "80x10",
        f'rdma_device_temperature_critical_celsius{{{node}, device="mlx5_0", sensor="asic"}}': "90x10",
        # A module 3 °C below its threshold: its own query, whose colours follow the module margin.
        f'rdma_device_temperature_celsius{{{node}, device="mlx5_0", sensor="Module0"}}': "72x10",
        f'rdma_device_temperature_critical_celsius{{{node}, device="mlx5_0", sensor="Module0"}}': "75x10",
    }
    # mlx5_11 trained at 400 Gb/s, then at 200 from 4m: below its day's best, without an expected rate (the
    # rules' RdmaPortRateBelowRecentMax is pending for it by 5m). mlx5_12 the same, but 200 Gb/s is its expected
    # rate: RdmaPortRateBelowExpected's business, not a shortfall against its day.
    for device in ("mlx5_11", "mlx5_12"):
        rate = f'rdma_port_rate_bytes_per_second{{{node}, device="{device}", port="1"}}'
        series[rate] = "50000000000x3 25000000000x7"
        series[f'rdma_port_state_id{{{node}, device="{device}", port="1"}}'] = "4x10"
    series[f'rdma_expected_port_rate_bytes_per_second{{{node}, device="mlx5_12", port="1"}}'] = "25000000000x10"
    # mlx5_14 to mlx5_16, three HCAs of one model: mlx5_16 trained at 200 Gb/s from the start, its peers at
    # 400. Below its peers (RdmaPortRateBelowPeers), not below its day: the table lists it too (found by review).
    for device, address, rate in (("mlx5_14", "14", 5e10), ("mlx5_15", "15", 5e10), ("mlx5_16", "16", 2.5e10)):
        series[f'rdma_device_info{{{node}, device="{device}", board_id="MT_0000000838", '
               f'pci_address="0000:{address}:00.0"}}'] = "1x10"  # fmt: skip
        series[f'rdma_port_info{{{node}, device="{device}", port="1", link_layer="InfiniBand"}}'] = "1x10"
        series[f'rdma_port_state_id{{{node}, device="{device}", port="1"}}'] = "4x10"
        series[f'rdma_port_rate_bytes_per_second{{{node}, device="{device}", port="1"}}'] = f"{rate:.0f}x10"
    # Credit wait of an InfiniBand port and of a RoCE port (PFC, not credits, throttles RoCE).
    wait = "instance_device_port:rdma_port_transmit_wait:ratio_rate5m"
    for device, layer in (("mlx5_6", "InfiniBand"), ("mlx5_7", "Ethernet")):
        series[f'{wait}{{{node}, device="{device}", port="1"}}'] = "0.5x10"
        series[f'rdma_port_info{{{node}, device="{device}", port="1", link_layer="{layer}"}}'] = "1x10"
    for k in range(1, 7):
        series[f'instance:rdma_port_transmit_wait:max_ratio_rate5m{{job="rdma-exporter", instance="c{k}:9883"}}'] = (
            f"{k / 10}x10"
        )
    # (Links below expected counted shortfalls): mlx5_3 also trained at half its width, still one link.
    series[f'{below}{{{node}, device="mlx5_3", port="1", problem="width", reference="expected"}}'] = "0.5x10"
    # A PCIe link at half its speed, no PCIe expectation: the warning's row, in a column of its own.
    series[f'{below}{{{node}, device="mlx5_17", problem="pcie_speed", reference="link_max"}}'] = "0.5x10"
    # (A dead node's ports vanished from every count): n2's exporter is down; its history saw two ports
    # ACTIVE in the day, one on a VF, and a third never up. n3's exporter is up: its ports are counted by
    # their state. The history records hold their last values while the target is down.
    day_state = "instance_device_port:rdma_port_state_id:max10m_max1d"
    day_vf = "instance_device:rdma_device_sriov_virtual_function:max10m_max1d"
    for instance, up in (("n2:9883", "0x10"), ("n3:9883", "1x10")):
        other = f'job="rdma-exporter", instance="{instance}"'
        series[f"up{{{other}}}"] = up
        for device, state, vf in (("mlx5_0", "4", "0"), ("mlx5_1", "1", "0"), ("mlx5_2", "4", "1")):
            series[f'{day_state}{{{other}, device="{device}", port="1"}}'] = f"{state}x10"
            series[f'{day_vf}{{{other}, device="{device}"}}'] = f"{vf}x10"
            if up.startswith("1"):  # still reporting (else RdmaPortVanished would count them)
                series[f'rdma_port_state_id{{{other}, device="{device}", port="1"}}'] = f"{state}x10"
    overview, node_page = "fabric-overview", "node-detail"

    def firing(severity: str) -> str:
        return f'(count(ALERTS{{alertname=~"Rdma.*", alertstate="firing", severity=~"{severity}"}}) or vector(0))'

    checks = [
        (f"sum({panel_expr(overview, 'Ports down')})", "5m", 5.0),
        (f"sum({panel_expr(node_page, 'Ports down')})", "5m", 5.0),
        # The rules fire alerts of their own on these series: compare with ALERTS as it is.
        (f"sum({panel_expr(overview, 'Alerts firing', 'A')}) - {firing('critical')}", "5m", 0.0),
        (f"sum({panel_expr(overview, 'Alerts firing', 'B')}) - {firing('warning')}", "5m", 0.0),
        (f"count({panel_expr(overview, 'Firing RDMA alerts')}) - {firing('.+')}", "5m", 0.0),
        # The node page counts the node's alerts, not the cluster's (RdmaHistoryRulesMissing, a warning).
        (f"sum({panel_expr(node_page, 'Alerts firing', 'A')}) - {firing('critical')}", "5m", 0.0),
        (f"sum({panel_expr(node_page, 'Alerts firing', 'B')}) - {firing('warning')} + 1", "5m", 0.0),
        (f"({firing('critical')} >= bool 1) + ({firing('warning')} >= bool 2)", "5m", 2.0),  # both levels fire
        (f"sum({panel_expr(overview, 'Links below expected', 'A')})", "5m", 1.0),
        (f"sum({panel_expr(overview, 'Links below expected', 'C')})", "5m", 3.0),  # mlx5_10, mlx5_11, mlx5_16
        (f"sum({panel_expr(overview, 'Links below expected', 'B')})", "5m", 1.0),
        (f"count({panel_expr(overview, 'Links below expected rate, width or PCIe')})", "5m", 4.0),
        (f"sum({panel_expr(overview, 'Links below expected rate, width or PCIe')})", "5m", 2.0),  # 4 x 0.5
        (f"count({panel_expr(overview, 'Links below expected rate, width or PCIe', 'B')})", "5m", 1.0),
        (f"sum({panel_expr(overview, 'Ports down', 'B')})", "5m", 1.0),
        (f"sum({panel_expr(node_page, 'Ports down', 'B')})", "5m", 1.0),
        (f"sum({panel_expr(overview, 'Link drops in the last hour', 'A')})", "5m", 3.0),
        (f"sum({panel_expr(overview, 'Link drops in the last hour', 'B')})", "5m", 1.0),
        # c1..c6 at 0.1..0.6 and n1 at 0.5 (its ports' record): the five highest end at 0.3.
        (f"min({panel_expr(overview, 'Most congested nodes (InfiniBand)')})", "5m", 0.3),
        (f"sum({panel_expr(overview, 'Hottest HCA sensors')})", "5m", -10.0),
        (f"sum({panel_expr(overview, 'Hottest HCA sensors', 'B')})", "5m", -3.0),
        (f"count({panel_expr(overview, 'Top InfiniBand ports by credit wait')})", "5m", 1.0),
    ]
    problems = promtool_checks(tmp_path, series, checks)
    assert not problems, "\n".join(problems)


def test_bit_error_rate_legends_name_the_slaves_of_a_roce_lag() -> None:
    """A RoCE LAG's bit-error rate is one series per slave (its netdev: each cable and transceiver counts its
    own errors), under the bond's device and port. Legends that drew device and port alone gave two bars the
    same name, and the operator could not tell which cable to change (dashboard review)."""
    legends = [
        (f"{path.stem} / {item['title']}", tgt["legendFormat"])
        for path, item in all_panels()
        for tgt in item["targets"]
        if "rdma_port_bit_error_rate" in tgt["expr"] and "{{port}}" in tgt["legendFormat"]
    ]
    assert len(legends) == 4, legends
    assert all(PORT_NETDEV in legend for _, legend in legends), legends


def test_node_tables_keep_a_node_name_that_repeats_in_another_cluster(tmp_path: Path) -> None:
    """A global view (cluster on All) with the same node name in two clusters: the node page's tables give
    each its own rows. Aggregated by instance alone, the twins' rows merged into one with the larger value,
    and a port at half its rate hid behind its healthy twin (dashboard review)."""
    series = {}
    for cluster, rate, speed in (("c1", "50000000000", "32000000000"), ("c2", "25000000000", "16000000000")):
        node = f'job="rdma-exporter", cluster="{cluster}", instance="n1:9883", device="mlx5_0"'
        series[f'rdma_port_rate_bytes_per_second{{{node}, port="1"}}'] = f"{rate}x10"
        series[f'rdma_port_state_id{{{node}, port="1"}}'] = "4x10"
        series[f'rdma_pcie_link_speed_transfers_per_second{{{node}}}'] = f"{speed}x10"
    checks = [
        (f"count({panel_expr('node-detail', 'Link rate and width')})", "5m", 2.0),
        (f"min({panel_expr('node-detail', 'Link rate and width')})", "5m", 2e11),
        (f"count({panel_expr('node-detail', 'PCIe link')})", "5m", 2.0),
        (f"min({panel_expr('node-detail', 'PCIe link')})", "5m", 16.0),
    ]
    problems = promtool_checks(tmp_path, series, checks)
    assert not problems, "\n".join(problems)


KEEPS_ETHERNET = re.compile(r'\band on \([^)]*\) rdma_port_info\{[^}]*link_layer="Ethernet"[^}]*\}')
DROPS_ETHERNET = re.compile(r'\bunless on \([^)]*\) rdma_port_info\{[^}]*link_layer="Ethernet"[^}]*\}')


# Catches ("RoCE throughput" tx `unless` instead of `and` the Ethernet ports: the RoCE stat shows the
# InfiniBand ports' traffic and none of RoCE's), (RoCE "Out of buffer" RDMA queues of InfiniBand ports
# only) and (node "Link events" carrier changes of IPoIB netdevs instead of RoCE ones).
# test_roce_panels_read_no_infiniband_port and the carrier lint accept any rdma_port_info{link_layer=
# "Ethernet"} selector read for its presence, `unless` as well as `and`.
def test_roce_queries_keep_the_ethernet_ports() -> None:
    checked = 0
    for dashboard, item, tgt in all_targets():
        expr, where = tgt["expr"], f"{dashboard} / {item['title']} / {tgt['refId']}"
        roce = dashboard == "roce-congestion.json"
        if roce:
            assert not DROPS_ETHERNET.search(expr), f"{where}: leaves the RoCE ports out"
        reads_link_layer = "rdma_port_info" in expr and "link_layer" in expr
        if "rdma_netdev_carrier_down_changes_total" in expr or (roce and reads_link_layer):
            assert KEEPS_ETHERNET.search(expr), f"{where}: does not keep the Ethernet ports"
            checked += 1
    assert checked >= 4


# Catches (bytes_rate: `ip4 + ip6 or ip4 or ip6` -> `ip4 or ip6`): an irdma port that carries RoCEv2 over
# IPv4 and IPv6 counts its bytes in two counters; the node's throughput is their sum, as the throughput
# records compute it, not the IPv4 half. The sample tree has no irdma port, so end to end never sees it.
def test_throughput_adds_both_ip_families_of_irdma(tmp_path: Path) -> None:
    port = 'job="rdma-exporter", instance="n1:9883", device="irdma0", port="1"'
    series = {f"rdma_port_hw_ip4_out_octets_total{{{port}}}": "0+600x10",  # 10 B/s
              f"rdma_port_hw_ip6_out_octets_total{{{port}}}": "0+1200x10"}  # 20 B/s  # fmt: skip
    # One-minute samples: a 5-minute window, not the 15 s rate interval the end-to-end stack scrapes at.
    expr = panel_expr("node-detail", "Throughput", "A").replace("[15s]", "[5m]")
    problems = promtool_checks(tmp_path, series, [(expr, "8m", 240.0)])  # (10 + 20) B/s * 8
    assert not problems, "\n".join(problems)


# Catches (pre-FEC bit-error rate divides by port_bit_count only): mainline mlx5 has no rx_bits_phy (only
# bnxt_en's rx_bits gives that count), so the panel stayed empty on the NICs most clusters run. Without the
# count it divides by the bits the netdev's line speed carries, which is what the PHY's count measures.
def test_bit_error_rate_divides_by_line_speed_where_the_driver_counts_no_bits(tmp_path: Path) -> None:
    mlx5 = 'job="rdma-exporter", instance="n1:9883", device="mlx5_0", port="1", netdev="eth0"'
    bnxt = 'job="rdma-exporter", instance="n1:9883", device="bnxt_re0", port="1", netdev="eth1"'
    series = {
        f'rdma_ethtool_corrected_bit_errors_total{{{mlx5}, direction="rx"}}': "0+600x10",  # 10 bits/s
        f"rdma_netdev_speed_bytes_per_second{{{mlx5}}}": "12500000000x10",  # 100GbE: 1e11 bits/s
        f'rdma_ethtool_corrected_bit_errors_total{{{bnxt}, direction="rx"}}': "0+600x10",
        f'rdma_ethtool_port_bit_count_total{{{bnxt}, direction="rx"}}': "0+600000000000x10",  # 1e10 bits/s
        f"rdma_netdev_speed_bytes_per_second{{{bnxt}}}": "25000000000x10",
    }
    expr = panel_expr("node-detail", "RoCE pre-FEC bit-error rate").replace("[15s]", "[5m]")
    problems = promtool_checks(tmp_path, series, [(f"min({expr})", "8m", 1e-10), (f"max({expr})", "8m", 1e-9)])
    assert not problems, "\n".join(problems)


# Counters that one alert reads under each driver's name (not through a record, so that
# test_panels_read_every_driver_name_that_the_records_read does not see them).
ALERT_ALIASES = {"RdmaPortOutOfBuffer": {"rdma_port_hw_out_of_buffer_total", "rdma_port_hw_rx_out_of_buffer_total"}}


# Catches (node "Receive queue out of buffer" reads out_of_buffer only): mainline bnxt_re counts the same
# drops in rx_out_of_buffer, which RdmaPortOutOfBuffer reads, so a bnxt_re port that tickets showed nothing.
def test_panels_read_every_driver_name_that_the_alerts_read() -> None:
    for alert, names in ALERT_ALIASES.items():
        read = {s.name for rule in rules() if rule.get("alert") == alert for s in selectors(rule["expr"])}
        assert names <= read, f"{alert} no longer reads {sorted(names - read)}"
    checked = 0
    for dashboard, item, tgt in all_targets():
        read = {s.name for s in selectors(tgt["expr"]) if not s.presence}
        for names in ALERT_ALIASES.values():
            if read & names:
                assert names <= read, f"{dashboard} / {item['title']} / {tgt['refId']}: not {sorted(names - read)}"
                checked += 1
    assert checked >= 2


def _reads_as(have: Selector, want: Selector, ignored: set[str]) -> bool:
    """A panel's selector reads what an alert's does: the same matchers on the labels the alert fixes beyond
    the dashboard's variables (`ignored`), and both read values or both only presence."""
    own = {k: v for k, v in want.matchers.items() if k not in ignored}
    return {k: v for k, v in have.matchers.items() if k in own} == own and have.presence == want.presence


# Catches (MODULE_FAULTS without high_temp: the module events panel no longer shows, or colours, an
# overheating module that RdmaPortModuleFault tickets). test_threshold_colours_follow_the_alerts compares
# series, function and window, not the matchers that pick which series (events, counters) are the alert's.
def test_coloured_queries_select_the_series_their_alert_reads() -> None:
    targets_labels = {"job", "cluster", "instance", "device", "port", "priority"}
    checked = 0
    for path, item in all_panels():
        followed = COLOURS_FOLLOW.findall(item["description"])
        steps = target_steps(item)
        alert_selectors = [s for rule in rules() if rule.get("alert") in followed for s in selectors(rule["expr"])]
        for tgt in item["targets"]:
            if not any(step["color"] in ("orange", "red") for step in steps[tgt["refId"]]):
                continue
            # An alert may read one metric through several selectors (RdmaPortCounterSaturated: every
            # counter but port_xmit_wait, and port_xmit_wait off RoCE ports): each of the panel's must be
            # one of them, and each of them must be one of the panel's.
            panel_selectors = selectors(tgt["expr"])
            where = f"{path.stem} / {item['title']} / {tgt['refId']}"
            for name in sorted({have.name for have in panel_selectors}):
                wanted = [s for s in alert_selectors if s.name == name and set(s.matchers) - targets_labels]
                if not wanted:
                    continue
                mine = [have for have in panel_selectors if have.name == name]
                for have in mine:
                    assert any(_reads_as(have, want, targets_labels) for want in wanted), (
                        f"{where}: {have.matchers} is none of the alert's"
                    )
                for want in wanted:
                    assert any(_reads_as(have, want, targets_labels) for have in mine), (
                        f"{where}: no selector for {want.matchers}"
                    )
                checked += 1
    assert checked >= 1


# Catches ("Firmware by board" summed by (cluster, hca_type, board_id): the firmware column is empty and
# two versions of one board, the rollout the panel exists to show, merge into one row). A table's renamed
# columns are labels its query keeps.
def test_table_columns_are_labels_the_query_keeps() -> None:
    checked = 0
    for path, item in all_panels():
        if item["type"] != "table":
            continue
        columns = {name for name in column_renames(item) if not name.startswith("Value")}
        for tgt in item["targets"]:
            kept = outer_by_labels(tgt["expr"])
            if kept is not None and columns:
                assert columns <= kept, f"{path.stem} / {item['title']}: {sorted(columns - kept)} dropped"
                checked += 1
    assert checked >= 1


def test_coloured_columns_of_merged_tables_leave_blank_cells_uncoloured() -> None:
    """A table merging several queries puts each query's value in a column of its own, blank on the other
    queries' rows. Grafana colours a blank cell with the thresholds' base colour: the shortfall table's
    PCIe warning rows had a red blank Share cell, and every other row an orange one (diff review). Each
    coloured value column of such a table maps null and NaN to transparent."""
    checked = 0
    for path, item in all_panels():
        if item["type"] != "table" or len(item["targets"]) < 2:
            continue
        overrides = item["fieldConfig"]["overrides"]
        coloured = {o["matcher"]["options"] for o in overrides for prop in o["properties"]
                    if prop["id"] == "custom.cellOptions" and prop["value"].get("type") == "color-background"}
        values = {column_renames(item).get(f"Value #{t['refId']}", f"Value #{t['refId']}") for t in item["targets"]}
        for column in coloured & values:
            blank = [m for o in overrides if o["matcher"]["options"] == column for prop in o["properties"]
                     if prop["id"] == "mappings" for m in prop["value"]
                     if m["type"] == "special" and m["options"]["match"] in ("null", "null+nan")]  # fmt: skip
            assert blank and all(m["options"]["result"]["color"] == "transparent" for m in blank), (
                f"{path.stem} / {item['title']}: blank cells of {column} take the base colour"
            )
            checked += 1
    assert checked >= 2


# Panels that had fallen out of step with their alerts (a dashboard review), each against a series that
# tells the old query from the new:
# - (Saturated error counters counted port_xmit_wait at any speed): RdmaPortCounterSaturated leaves it out on
#   links of 10 Gb/s or more, where it fills again within seconds of a clear; the 2.5 Gb/s port counts.
# - (the pause-storm stat counted error events of the last 10 minutes): RdmaRocePauseStorm keeps paging for
#   an hour while the port's lossless priorities still drop, and the stat read 0 through that page.
# - (Links below expected kept a node short of a device expected by name): a missing HCA renumbers the names
#   after it, and the alerts leave the node's ports and netdevs out; its PCIe links still count.
# - (Link events showed mlx5's carrier changes): with PHY link-down events the alerts ignore the carrier,
#   which mlx5 drops at every channel reopen with the link up.
def test_panels_count_as_their_alerts_count(tmp_path: Path) -> None:
    node = 'job="rdma-exporter", instance="n1:9883"'
    shifted = 'job="rdma-exporter", instance="n2:9883"'
    saturated = "rdma_port_pma_saturated"
    storms = "rdma_ethtool_pause_storm_error_events_total"
    lossless = "instance_device_port:rdma_ethtool_lossless_receive_buffer_discards:increase15m"
    below = "instance_device:rdma_link_below_expected:ratio"
    series = {
        f'rdma_port_info{{{node}, device="mlx5_0", port="1", link_layer="InfiniBand"}}': "1x60",
        f'rdma_port_info{{{node}, device="mlx5_1", port="1", link_layer="InfiniBand"}}': "1x60",
        f'rdma_port_rate_bytes_per_second{{{node}, device="mlx5_0", port="1"}}': "312500000x60",
        f'rdma_port_rate_bytes_per_second{{{node}, device="mlx5_1", port="1"}}': "50000000000x60",
        f'{saturated}{{{node}, device="mlx5_0", port="1", counter="port_xmit_wait"}}': "1x60",
        f'{saturated}{{{node}, device="mlx5_1", port="1", counter="port_xmit_wait"}}': "1x60",
        # One storm each at 5m; mlx5_2's lossless priority 3 keeps dropping, mlx5_3's does not.
        f'{storms}{{{node}, device="mlx5_2", port="1", netdev="eth2"}}': "0x5 1x55",
        f'{storms}{{{node}, device="mlx5_3", port="1", netdev="eth3"}}': "0x5 1x55",
        f'{lossless}{{{node}, device="mlx5_2", port="1", netdev="eth2", priority="3"}}': "500x60",
        f'{lossless}{{{node}, device="mlx5_3", port="1", netdev="eth3", priority="3"}}': "0x60",
        # n2 is short of mlx5_9, expected by name: its port and netdev shortfalls are against shifted names.
        f'rdma_expected_device_present{{{shifted}, device="mlx5_9"}}': "0x60",
        f'rdma_device_sriov_virtual_function{{{shifted}, device="mlx5_3"}}': "0x60",
        f'{below}{{{shifted}, device="mlx5_3", port="1", problem="rate", reference="expected"}}': "0.5x60",
        f'{below}{{{shifted}, device="mlx5_4", port="1", netdev="eth4", problem="netdev_speed", '
        'reference="expected"}': "0.5x60",
        f'{below}{{{shifted}, device="mlx5_5", problem="pcie_width", reference="expected"}}': "0.5x60",
        # Carrier drops on two RoCE ports; only eth7's has no PHY counter to count them instead.
        f'rdma_port_info{{{node}, device="mlx5_6", port="1", link_layer="Ethernet"}}': "1x60",
        f'rdma_port_info{{{node}, device="mlx5_7", port="1", link_layer="Ethernet"}}': "1x60",
        f'rdma_netdev_carrier_down_changes_total{{{node}, device="mlx5_6", port="1", netdev="eth6"}}': "0+1x60",
        f'rdma_netdev_carrier_down_changes_total{{{node}, device="mlx5_7", port="1", netdev="eth7"}}': "0+1x60",
        f'rdma_ethtool_link_down_events_total{{{node}, device="mlx5_6", port="1", netdev="eth6"}}': "0x60",
    }
    saturated_panel = panel_expr("node-detail", "Saturated error counters")
    storm_panel = panel_expr("roce-congestion", "Pause storms (10 min)", "B")
    links_panel = panel_expr("fabric-overview", "Links below expected")
    carrier = panel_expr("node-detail", "Link events", "C").replace(f"[{RATE_INTERVAL}]", "[5m]")  # 1m samples
    checks = [
        (f"({saturated_panel}) or vector(0)", "30m", 1),
        (storm_panel, "8m", 2),
        (storm_panel, "40m", 1),
        (links_panel, "30m", 1),
        (f"count({carrier}) or vector(0)", "30m", 1),
    ]
    problems = promtool_checks(tmp_path, series, checks)
    assert not problems, "\n".join(problems)
