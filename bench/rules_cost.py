#!/usr/bin/env python3
"""What the alerting and recording rules cost a Prometheus server, in steady state with a day of history.

    python bench/rules_cost.py [--nodes 10] [--rules rules/] [--json OUT] [--compare OLD.json]
    python bench/rules_cost.py --compare OLD.json NEW.json      # no run, only the side-by-side table

Made to compare two versions of rules/, or one under two Prometheus versions (--prometheus and
--promtool of another release; --compare then labels the columns by version): the samples each rule
reads are exact and machine-independent, the durations are this machine's.

1. The fleet: --nodes copies of one exporter answer (--exposition, default the sample tree's golden
   file: 8 InfiniBand and 2 RoCE devices), each with instance="node-NNN:9883" and job="rdma". Only the
   metric families that some rule expression names are kept (the others cost scraping and storage, and
   only a little index lookup to rule evaluation). The golden file leaves out rdma_exporter_build_info
   and rdma_exporter_node_boot_time_seconds (they vary between runs); both are put back. Gauges stay
   constant; traffic counters (`*_bytes_total` that are not zero) grow at a constant rate, every other
   counter (errors, events, pauses) stays flat: a healthy fleet, where the alerts are quiet unless the
   answer itself has a fault.
2. History: a day and a bit at the shipped 30 s scrape interval, ending at a time T, written as
   OpenMetrics (with `up` and `scrape_duration_seconds` as a scrape would add them) and turned into a
   block by `promtool tsdb create-blocks-from openmetrics`. The recording rules are then backfilled over
   the day by `promtool tsdb create-blocks-from rules` against a Prometheus started on that TSDB, one
   dependency level at a time (records that read records wait for them; the server is restarted to load
   each level's blocks; a record that reads itself is backfilled without its own past). Prometheus
   2.42's rule backfill evaluates a group at the group's own `interval:` (--eval-interval only applies
   to groups without one), aligned as the server aligns it; the report checks the spacing it finds.
3. Prometheus is started on the result with every rule file and --eval-interval (default 1m, as
   Prometheus defaults it: the shipped scrape config sets no evaluation_interval), scraping the same
   fleet live from a loopback HTTP server so that the rules keep seeing fresh data. Every rule's
   expression is run as an instant query at T (the end of the backfilled day: the counts then depend on
   nothing that happened during the run) with stats=all: totalQueryableSamples is the cost. After the
   server has compacted the backfilled blocks, prometheus_rule_group_last_duration_seconds is read for
   --rounds evaluation rounds of every group.

The Markdown report goes to stdout (progress to stderr); --json writes every number.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import http.server
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from bench import CHILDREN, ROOT, free_port, git, stop, stop_all

SCHEMA_VERSION: Final = 1
SCRAPE_INTERVAL: Final = 30  # s, deploy/prometheus/scrape-config.yml
DAY: Final = 86400
# Raw history before the day the records are backfilled over: the records evaluated at its start read
# up to an hour back (rate(...[1h]), link_steady:1h).
RAW_LEAD: Final = 3600 + 600
RECORD_LEAD: Final = 300  # records start this long before T - 1d, so that a [1d] look-back at T is full
# Traffic counters grow at this rate (bytes/s): 20 Gb/s, 5 % of a 400G port, far from any threshold.
BYTES_PER_SECOND: Final = 2_500_000_000
SCRAPE_DURATION: Final = "0.05"
EXTRAPOLATE_TO: Final = 1000
TOP_RULES: Final = 15
# Blocks as large as promtool allows in few passes: it rereads the whole input once per block range.
MAX_BLOCK_DURATION: Final = "486h"
PROMQL_KEYWORDS: Final = frozenset(
    {
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "inf",
        "nan",
        "atan2",
    }
)
PROMETHEUS_MADE: Final = ("up", "scrape_duration_seconds")
# Seconds a child has to exit after SIGTERM before it is killed: Prometheus closes its TSDB first.
STOP_TIMEOUT: Final = 30


def log(message: str) -> None:
    print(f"rules_cost: {message}", file=sys.stderr, flush=True)


# --- processes ---------------------------------------------------------------------------------------


def spawn(cmd: Sequence[str], logfile: Path) -> subprocess.Popen[bytes]:
    """A child in its own session: Ctrl-C reaches only this script, whose cleanup stops the child."""
    with logfile.open("ab") as out:
        proc = subprocess.Popen(
            list(cmd), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    CHILDREN.append(proc)
    return proc


def run(cmd: Sequence[str], logfile: Path, timeout: float) -> None:
    """Run a tool to completion (stopped with the script on Ctrl-C); its output goes to logfile."""
    proc = spawn(cmd, logfile)
    try:
        code = proc.wait(timeout=timeout)
    finally:
        stop(proc, timeout=STOP_TIMEOUT)
    if code != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} exited {code}:\n{tail(logfile)}")


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def http_request(port: int, path: str, form: dict[str, str] | None = None, timeout: float = 600) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if form is None:
            conn.request("GET", path)
        else:
            body = urllib.parse.urlencode(form)
            conn.request("POST", path, body, {"Content-Type": "application/x-www-form-urlencoded"})
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{path}: HTTP {response.status}: {data[:500]!r}")
        return data
    finally:
        conn.close()


# --- rules -------------------------------------------------------------------------------------------


@dataclass
class Rule:
    group: str
    index: int  # position in its group
    kind: str  # "record" or "alert"
    name: str
    expr: str
    labels: dict[str, str]
    reads: set[str]  # metric names the expression selects

    @property
    def key(self) -> str:
        return f"{self.group}/{self.index}"


@dataclass
class Group:
    name: str
    file: str  # the rule file's name
    interval: float | None  # its own interval: in seconds, None for the global evaluation_interval
    rules: list[Rule] = field(default_factory=list)


DURATION_UNITS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": DAY, "w": 7 * DAY, "y": 365 * DAY}


def parse_duration(text: str) -> float:
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * DURATION_UNITS[u] for n, u in parts)


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers that are not functions, keywords, label names
    (in braces or grouping lists), strings or numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"#[^\n]*", "", text)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    found = {m.group(0) for m in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*(?![\w:])(?!\s*\()", text)}
    # {__name__="x"} selectors name a metric inside the braces.
    found |= set(re.findall(r'__name__\s*=\s*"([A-Za-z_:][\w:]*)"', expr))
    return found - PROMQL_KEYWORDS


def longest_range(expr: str) -> float:
    """The longest range or subquery window in an expression, in seconds (0 for none)."""
    ranges = re.findall(r"\[\s*([0-9a-z]+)\s*(?::[^\]]*)?\]", re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr))
    return max((parse_duration(r) for r in ranges), default=0.0)


def load_rules(rules_dir: Path) -> list[Group]:
    files = sorted(p for p in rules_dir.iterdir() if p.suffix in (".yml", ".yaml") and p.is_file())
    groups: list[Group] = []
    for path in files:
        doc = yaml.safe_load(path.read_text())
        if not isinstance(doc, dict) or "groups" not in doc:
            continue
        for raw in doc["groups"] or []:
            interval = parse_duration(str(raw["interval"])) if raw.get("interval") else None
            group = Group(raw["name"], path.name, interval)
            for index, rule in enumerate(raw.get("rules") or []):
                kind = "record" if "record" in rule else "alert"
                group.rules.append(
                    Rule(
                        group.name,
                        index,
                        kind,
                        str(rule[kind]),
                        str(rule["expr"]),
                        {str(k): str(v) for k, v in (rule.get("labels") or {}).items()},
                        metric_names(str(rule["expr"])),
                    )
                )
            groups.append(group)
    if not groups:
        raise SystemExit(f"rules_cost: no rule groups in {rules_dir}")
    return groups


def record_levels(groups: list[Group]) -> tuple[dict[str, int], list[str]]:
    """Backfill level of every recording rule (by key): 0 reads only scraped series, n reads records of
    levels below n. Also the records that read themselves (backfilled without their own past)."""
    records = [r for g in groups for r in g.rules if r.kind == "record"]
    producers: dict[str, list[Rule]] = {}
    for rule in records:
        producers.setdefault(rule.name, []).append(rule)
    level = {r.key: 0 for r in records}
    for _ in range(len(records) + 1):
        changed = False
        for rule in records:
            deps = [p for name in rule.reads - {rule.name} for p in producers.get(name, [])]
            want = 1 + max((level[p.key] for p in deps), default=-1)
            if want > level[rule.key]:
                level[rule.key] = want
                changed = True
        if not changed:
            break
    else:
        raise SystemExit("rules_cost: recording rules read each other in a cycle; cannot order the backfill")
    self_reading = sorted({r.name for r in records if r.name in r.reads})
    return level, self_reading


# --- the simulated fleet -----------------------------------------------------------------------------


@dataclass
class Series:
    name: str
    labels: str  # inside the braces, without them; "" for none
    value: str  # as written, for constant series
    base: float = 0.0
    rate: float = 0.0  # per second; 0 for constant series


@dataclass
class Fleet:
    series: list[Series]  # one node's kept series
    families_kept: int
    families_total: int
    series_total: int  # one node's series in the exposition
    added: list[str]  # families put back or made up
    reference: int  # the time counters have their base value at

    def counter_value(self, s: Series, at: float) -> str:
        return str(int(s.base + s.rate * (at - self.reference)))

    def exposition(self, at: float) -> str:
        """One node's answer at a time, without target labels."""
        out = []
        for s in self.series:
            if s.name in PROMETHEUS_MADE:
                continue
            value = self.counter_value(s, at) if s.rate else s.value
            out.append(f"{s.name}{{{s.labels}}} {value}\n" if s.labels else f"{s.name} {value}\n")
        return "".join(out)


SAMPLE_LINE: Final = re.compile(r"([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")


def load_fleet(exposition: Path, wanted: set[str], reference: int) -> Fleet:
    types: dict[str, str] = {}
    parsed: list[tuple[str, str, str]] = []
    families: set[str] = set()
    for line in exposition.read_text().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            types[name] = kind
            families.add(name)
            continue
        if not line or line.startswith("#"):
            continue
        match = SAMPLE_LINE.fullmatch(line.strip())
        if match is None:
            raise SystemExit(f"rules_cost: cannot parse exposition line {line!r}")
        name, labels, value = match.group(1), match.group(2) or "", match.group(3)
        parsed.append((name, labels, value))
        families.add(name)
    present = {name for name, _, _ in parsed}
    series: list[Series] = []
    for name, labels, value in parsed:
        if name not in wanted:
            continue
        counter = types.get(name) == "counter" or types.get(name.removesuffix("_total")) == "counter"
        grows = counter and name.endswith("_bytes_total") and float(value) > 0
        series.append(Series(name, labels, value, float(value), BYTES_PER_SECOND if grows else 0.0))
    kept_families = {s.name for s in series}
    added = []
    # Left out of the golden file because they change between runs; a real answer has them.
    if "rdma_exporter_build_info" in wanted and "rdma_exporter_build_info" not in present:
        version = platform.python_version()
        series.append(Series("rdma_exporter_build_info", f'python_version="{version}",version="0.0.0+bench"', "1"))
        added.append("rdma_exporter_build_info")
    if "rdma_exporter_node_boot_time_seconds" in wanted and "rdma_exporter_node_boot_time_seconds" not in present:
        series.append(Series("rdma_exporter_node_boot_time_seconds", "", str(reference - 30 * DAY)))
        added.append("rdma_exporter_node_boot_time_seconds")
    if "up" in wanted:
        series.append(Series("up", "", "1"))
        added.append("up")
    if "scrape_duration_seconds" in wanted:
        series.append(Series("scrape_duration_seconds", "", SCRAPE_DURATION))
        added.append("scrape_duration_seconds")
    return Fleet(series, len(kept_families), len(families), len(parsed), added, reference)


def instance(node: int) -> str:
    return f"node-{node:03d}:9883"


def target_labels(labels: str, node: int) -> str:
    extra = f'instance="{instance(node)}",job="rdma"'
    return f"{labels},{extra}" if labels else extra


def write_openmetrics(fleet: Fleet, nodes: int, timestamps: range, path: Path) -> int:
    """Every node's series at every timestamp, oldest first. Constant lines are one template per
    timestamp (the timestamp put in by str.replace), so that a day of a fleet writes in seconds."""
    constant: list[str] = []
    growing: list[tuple[str, Series]] = []
    for node in range(1, nodes + 1):
        for s in fleet.series:
            prefix = f"{s.name}{{{target_labels(s.labels, node)}}} "
            if s.rate:
                growing.append((prefix, s))
            else:
                constant.append(f"{prefix}{s.value} \x00\n")
    template = "".join(constant)
    lines = 0
    with path.open("w", buffering=16 * 1024 * 1024) as out:
        for ts in timestamps:
            stamp = str(ts)
            out.write(template.replace("\x00", stamp))
            out.write("".join(f"{prefix}{fleet.counter_value(s, ts)} {stamp}\n" for prefix, s in growing))
            lines += len(constant) + len(growing)
        out.write("# EOF\n")
    return lines


class FleetServer:
    """Serves every node's answer at /node/NNN on a loopback port, counters at the current time."""

    def __init__(self, fleet: Fleet) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if not re.fullmatch(r"/node/\d+", self.path):
                    self.send_error(404)
                    return
                body = fleet.exposition(time.time()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name="fleet", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- Prometheus --------------------------------------------------------------------------------------


class Prometheus:
    def __init__(self, binary: str, data: Path, config: Path, logfile: Path, max_samples: int | None = None) -> None:
        self.binary, self.data, self.config, self.logfile = binary, data, config, logfile
        self.max_samples = max_samples
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> None:
        self.port = free_port()
        cmd = [
            self.binary,
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.data}",
            "--storage.tsdb.retention.time=30d",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--query.timeout=10m",
            "--log.level=info",
        ]
        if self.max_samples:
            cmd.append(f"--query.max-samples={self.max_samples}")
        self.proc = spawn(cmd, self.logfile)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}:\n{tail(self.logfile)}")
            with contextlib.suppress(OSError, RuntimeError):
                http_request(self.port, "/-/ready", timeout=5)
                self.started = time.time()
                return
            time.sleep(0.5)
        raise RuntimeError(f"prometheus not ready after 300 s:\n{tail(self.logfile)}")

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, timeout=STOP_TIMEOUT)
            self.proc = None

    def query(self, expr: str, at: float, stats: bool = False) -> dict[str, Any]:
        form = {"query": expr, "time": f"{at:.3f}"}
        if stats:
            form["stats"] = "all"
        answer = json.loads(http_request(self.port, "/api/v1/query", form))
        if answer.get("status") != "success":
            raise RuntimeError(f"query failed: {answer}")
        data: dict[str, Any] = answer["data"]
        return data

    def metrics(self) -> dict[str, float]:
        """The server's own /metrics: {'name{labels}': value} for the families read here."""
        text = http_request(self.port, "/metrics", timeout=30).decode()
        wanted = ("prometheus_rule_", "prometheus_tsdb_")
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(wanted):
                key, _, value = line.rpartition(" ")
                with contextlib.suppress(ValueError):
                    out[key] = float(value)
        return out


def rule_group_key(file: Path, group: str) -> str:
    return f'rule_group="{file};{group}"'


def version_of(binary: str) -> str:
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    first = (done.stdout or done.stderr).splitlines()
    return first[0] if first else "unknown"


def move_blocks(source: Path, data: Path) -> int:
    moved = 0
    if source.is_dir():
        for block in source.iterdir():
            if (block / "meta.json").is_file():
                shutil.move(str(block), data / block.name)
                moved += 1
    return moved


def write_config(path: Path, eval_interval: float, rule_files: Iterable[Path], targets: tuple[int, int] | None) -> None:
    """targets: (fleet server port, nodes) to scrape, or None for a server that only answers queries."""
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL}s",
            "scrape_timeout": "10s",
            "evaluation_interval": f"{int(eval_interval)}s",
        },
        "rule_files": [str(p) for p in rule_files],
    }
    if targets is not None:
        port, nodes = targets
        config["scrape_configs"] = [
            {
                "job_name": "rdma",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{port}"],
                        "labels": {"__metrics_path__": f"/node/{n}", "instance": instance(n)},
                    }
                    for n in range(1, nodes + 1)
                ],
            }
        ]
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def write_level_files(groups: list[Group], level: dict[str, int], wanted: int, rule_dir: Path) -> list[Path]:
    """The records of one backfill level, in files and groups of the same names and intervals as the
    real ones: Prometheus offsets a group's evaluations by a hash of its name and file, so the backfilled
    samples fall where the server's own evaluations of the real files will."""
    by_file: dict[str, list[dict[str, Any]]] = {}
    for group in groups:
        rules = []
        for rule in group.rules:
            if rule.kind == "record" and level[rule.key] == wanted:
                entry: dict[str, Any] = {"record": rule.name, "expr": rule.expr}
                if rule.labels:
                    entry["labels"] = rule.labels
                rules.append(entry)
        if rules:
            raw: dict[str, Any] = {"name": group.name}
            if group.interval is not None:
                raw["interval"] = f"{int(group.interval)}s"
            raw["rules"] = rules
            by_file.setdefault(group.file, []).append(raw)
    paths = []
    for name, file_groups in by_file.items():
        path = rule_dir / name
        path.write_text(yaml.safe_dump({"groups": file_groups}, sort_keys=False))
        paths.append(path)
    return paths


# --- the run -----------------------------------------------------------------------------------------


@dataclass
class Phases:
    started: float = field(default_factory=time.monotonic)
    marks: dict[str, float] = field(default_factory=dict)
    last: float = field(default_factory=time.monotonic)

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.marks[name] = round(now - self.last, 1)
        self.last = now
        log(f"{name}: {self.marks[name]:.1f} s")


@dataclass
class Evaluation:
    at: float  # unix time the group's evaluation started
    seconds: float  # prometheus_rule_group_last_duration_seconds
    settled: bool  # started after the TSDB had compacted the backfilled blocks


def observe(
    prom: Prometheus,
    groups: dict[str, tuple[str, float]],
    rounds: int,
    eval_interval: float,
    overlapping: bool,
    warm: float,
) -> tuple[dict[str, list[Evaluation]], float | None]:
    """Every group's evaluations from `warm` (unix time) on, read from the server's /metrics once a second.

    groups: name -> (its rule_group label, its interval). The backfilled blocks overlap in time, so the
    TSDB compacts them a minute after start (a compaction counts only when it ends): the run waits for
    that, then for `rounds` evaluations of every group at the global interval. A group with a longer
    interval of its own needs one evaluation from `warm` on, after the compaction if one comes in time.
    Returns the evaluations and when the compaction was seen to be over."""
    evaluations: dict[str, list[Evaluation]] = {name: [] for name in groups}
    seen: dict[str, float] = {}
    settled_at: float | None = None
    last: tuple[float, float] | None = None
    since = time.monotonic()
    longest = max([eval_interval] + [interval for _, interval in groups.values()])
    deadline = time.monotonic() + 600 + rounds * eval_interval + longest

    def done(name: str) -> bool:
        settled = sum(e.settled for e in evaluations[name])
        if groups[name][1] <= eval_interval:
            return settled >= rounds
        return settled >= 1 or bool(evaluations[name])

    while time.monotonic() < deadline:
        m = prom.metrics()
        if settled_at is None:
            state = (m.get("prometheus_tsdb_blocks_loaded", -1), m.get("prometheus_tsdb_compactions_total", 0))
            triggered = m.get("prometheus_tsdb_compactions_triggered_total", 0)
            if state != last:
                last, since = state, time.monotonic()
            elif triggered >= 1 and (state[1] >= 1 or not overlapping) and time.monotonic() - since >= 10:
                settled_at = time.time()
        for name, (gid, _) in groups.items():
            stamp = m.get(f"prometheus_rule_group_last_evaluation_timestamp_seconds{{{gid}}}")
            duration = m.get(f"prometheus_rule_group_last_duration_seconds{{{gid}}}")
            if stamp is None or duration is None or stamp == seen.get(name):
                continue
            seen[name] = stamp
            if stamp >= warm:
                evaluations[name].append(Evaluation(stamp, duration, settled_at is not None and stamp >= settled_at))
        if settled_at is not None and all(done(name) for name in groups):
            break
        time.sleep(1)
    else:
        log("gave up waiting for evaluation rounds; reporting those seen")
    return evaluations, settled_at


def measure(args: argparse.Namespace) -> dict[str, Any]:
    phases = Phases()
    rules_dir = Path(args.rules).resolve()
    groups = load_rules(rules_dir)
    all_rules = [r for g in groups for r in g.rules]
    record_names = {r.name for r in all_rules if r.kind == "record"}
    wanted = set().union(*(r.reads for r in all_rules)) - record_names
    eval_interval = parse_duration(args.eval_interval)
    level, self_reading = record_levels(groups)
    levels = max(level.values(), default=-1) + 1

    end = int(time.time()) // SCRAPE_INTERVAL * SCRAPE_INTERVAL - SCRAPE_INTERVAL  # T, before any live scrape
    raw_start = end - DAY - RAW_LEAD
    record_start = end - DAY - RECORD_LEAD
    fleet = load_fleet(Path(args.exposition), wanted, reference=raw_start)
    log(
        f"{args.nodes} nodes x {len(fleet.series)} series ({fleet.families_kept} of {fleet.families_total} "
        f"families, those the rules read); {len(all_rules)} rules in {len(groups)} groups, {levels} record levels"
    )

    work = Path(tempfile.mkdtemp(prefix="rules-cost-")).resolve()
    server: FleetServer | None = None
    prom: Prometheus | None = None
    try:
        data = work / "data"
        data.mkdir()
        rule_dir = work / "rules"  # the same paths for backfill and server: see write_level_files
        rule_dir.mkdir()
        om = work / "history.om"
        lines = write_openmetrics(fleet, args.nodes, range(raw_start, end + 1, SCRAPE_INTERVAL), om)
        phases.mark(f"wrote {lines / 1e6:.1f} M samples ({om.stat().st_size / 1e9:.2f} GB of OpenMetrics)")
        run(
            [
                args.promtool,
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "-q",
                f"--max-block-duration={MAX_BLOCK_DURATION}",
                str(om),
                str(work / "raw"),
            ],
            work / "promtool-openmetrics.log",
            timeout=1800,
        )
        om.unlink()
        raw_blocks = move_blocks(work / "raw", data)
        phases.mark(f"backfilled the raw history ({raw_blocks} blocks)")

        backfill_config = work / "backfill.yml"
        write_config(backfill_config, eval_interval, [], None)
        prom = Prometheus(
            args.prometheus, data, backfill_config, work / "prometheus-backfill.log", max_samples=500_000_000
        )
        rule_blocks = 0
        for lvl in range(levels):
            for stale in rule_dir.iterdir():
                stale.unlink()
            files = write_level_files(groups, level, lvl, rule_dir)
            prom.start()
            out = work / f"blocks-{lvl}"
            logfile = work / f"promtool-rules-{lvl}.log"
            run(
                [
                    args.promtool,
                    "tsdb",
                    "create-blocks-from",
                    "rules",
                    f"--url=http://127.0.0.1:{prom.port}",
                    f"--start={record_start}",
                    f"--end={end}",
                    f"--eval-interval={int(eval_interval)}s",
                    f"--output-dir={out}",
                    f"--max-block-duration={MAX_BLOCK_DURATION}",
                    *map(str, files),
                ],
                logfile,
                timeout=3600,
            )
            errors = [line for line in logfile.read_text().splitlines() if "level=error" in line or "err=" in line]
            if errors:
                raise RuntimeError("rule backfill: " + "\n".join(errors[:10]))
            prom.stop()
            moved = move_blocks(out, data)
            rule_blocks += moved
            phases.mark(
                f"backfilled record level {lvl} ({sum(1 for v in level.values() if v == lvl)} rules, {moved} blocks)"
            )

        # The server: every rule file as it is, at the paths the backfill used.
        for stale in rule_dir.iterdir():
            stale.unlink()
        rule_files = []
        for name in sorted({g.file for g in groups}):
            shutil.copy(rules_dir / name, rule_dir / name)
            rule_files.append(rule_dir / name)
        server = FleetServer(fleet)
        config = work / "prometheus.yml"
        write_config(config, eval_interval, rule_files, (server.port, args.nodes))
        prom = Prometheus(args.prometheus, data, config, work / "prometheus.log")
        prom.start()
        started = prom.started
        phases.mark("started Prometheus with the rules")

        # Every rule at T, before the server's first compaction (a minute after its start).
        per_rule: list[dict[str, Any]] = []
        for rule in all_rules:
            runs = [prom.query(rule.expr, end, stats=True) for _ in range(args.repeat)]
            samples = {int(r["stats"]["samples"]["totalQueryableSamples"]) for r in runs}
            if len(samples) != 1:
                log(f"{rule.key} {rule.name}: samples differ between runs: {sorted(samples)}")
            times = sorted(float(r["stats"]["timings"]["evalTotalTime"]) for r in runs)
            per_rule.append(
                {
                    "group": rule.group,
                    "index": rule.index,
                    "kind": rule.kind,
                    "name": rule.name,
                    "samples": max(samples),
                    "peak_samples": int(runs[0]["stats"]["samples"]["peakSamples"]),
                    "result_series": len(runs[0]["result"]),
                    "longest_range_seconds": longest_range(rule.expr),
                    "query_seconds": statistics.median(times),
                }
            )
        checks = backfill_checks(prom, groups, end, eval_interval)
        phases.mark(f"queried {len(all_rules)} rules at T ({args.repeat} times each)")

        group_ids = {g.name: rule_group_key(rule_dir / g.file, g.name) for g in groups}
        # From two scrapes after the start on, the rate windows of the evaluations have live samples.
        evaluations, settled_at = observe(
            prom,
            {g.name: (group_ids[g.name], g.interval or eval_interval) for g in groups},
            args.rounds,
            eval_interval,
            overlapping=rule_blocks > 0 or raw_blocks > 1,
            warm=prom.started + 2 * SCRAPE_INTERVAL,
        )
        final = prom.metrics()
        alerts = json.loads(http_request(prom.port, "/api/v1/alerts"))["data"]["alerts"]
        phases.mark(f"watched {args.rounds} evaluation rounds")
    finally:
        if prom is not None:
            prom.stop()
        if server is not None:
            server.close()
        if args.keep:
            log(f"work files kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    by_key = {(r["group"], r["index"]): r for r in per_rule}
    group_rows = []
    for g in groups:
        interval = g.interval or eval_interval
        rows = [by_key[(g.name, r.index)] for r in g.rules]
        per_eval = sum(r["samples"] for r in rows)
        gid = group_ids[g.name]
        # After the compaction if there are any such (always for the groups at the global interval).
        settled = [e.seconds for e in evaluations[g.name] if e.settled][: args.rounds]
        measured = settled or [e.seconds for e in evaluations[g.name]]
        group_rows.append(
            {
                "name": g.name,
                "file": g.file,
                "interval_seconds": interval,
                "own_interval": g.interval is not None,
                "rules": len(g.rules),
                "samples_per_evaluation": per_eval,
                "samples_per_minute": per_eval * 60 / interval,
                "duration_seconds": statistics.median(measured) if measured else None,
                "duration_max_seconds": max(measured) if measured else None,
                "durations_seconds": measured,
                "durations_during_compaction": bool(measured) and not settled,
                "query_seconds": sum(r["query_seconds"] for r in rows),
                "evaluation_failures": final.get(f"prometheus_rule_evaluation_failures_total{{{gid}}}", 0.0),
                "iterations_missed": final.get(f"prometheus_rule_group_iterations_missed_total{{{gid}}}", 0.0),
            }
        )
    for row in per_rule:
        interval = next(g.interval or eval_interval for g in groups if g.name == row["group"])
        row["samples_per_minute"] = row["samples"] * 60 / interval
    total_per_minute = sum(g["samples_per_minute"] for g in group_rows)
    for row in group_rows:
        row["percent"] = 100 * row["samples_per_minute"] / total_per_minute if total_per_minute else 0.0
    for row in per_rule:
        row["percent"] = 100 * row["samples_per_minute"] / total_per_minute if total_per_minute else 0.0
    measured_rows = [g for g in group_rows if g["duration_seconds"] is not None]
    duration_per_minute = sum(g["duration_seconds"] * 60 / g["interval_seconds"] for g in measured_rows)
    scale = EXTRAPOLATE_TO / args.nodes
    firing: dict[str, int] = {}
    for alert in alerts:
        name = f"{alert['labels']['alertname']} ({alert.get('state')})"
        firing[name] = firing.get(name, 0) + 1
    phases.marks["total"] = round(time.monotonic() - phases.started, 1)
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "source": source_revision(rules_dir),
        "prometheus": version_of(args.prometheus),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version()},
        "nodes": args.nodes,
        "exposition": str(Path(args.exposition)),
        "series_per_node": len(fleet.series),
        "exposition_series_per_node": fleet.series_total,
        "families_kept": fleet.families_kept,
        "families_total": fleet.families_total,
        "series_added": fleet.added,
        "scrape_interval_seconds": SCRAPE_INTERVAL,
        "evaluation_interval_seconds": eval_interval,
        "history_seconds": end - raw_start,
        "records_backfilled_seconds": end - record_start,
        "query_time": end,
        "record_levels": levels,
        "self_reading_records": self_reading,
        "blocks": {
            "raw": raw_blocks,
            "rules": rule_blocks,
            "after_compaction": final.get("prometheus_tsdb_blocks_loaded"),
        },
        "head_series": final.get("prometheus_tsdb_head_series"),
        "compacted_after_seconds": None if settled_at is None else round(settled_at - started, 1),
        "backfill_checks": checks,
        "alerts": firing,
        "groups": group_rows,
        "rules": per_rule,
        "totals": {
            "samples_per_evaluation_round": sum(g["samples_per_evaluation"] for g in group_rows),
            "samples_per_minute": total_per_minute,
            "duration_seconds_per_minute": duration_per_minute,
            "query_seconds": sum(r["query_seconds"] for r in per_rule),
            # Whole rules, so also their other selectors: an upper bound on what the day-long ranges read.
            "samples_per_minute_in_rules_with_a_day_range": sum(
                r["samples_per_minute"] for r in per_rule if r["longest_range_seconds"] >= DAY
            ),
        },
        "extrapolation": {
            "nodes": EXTRAPOLATE_TO,
            "samples_per_minute": total_per_minute * scale,
            "duration_seconds_per_minute": duration_per_minute * scale,
        },
        "phases_seconds": phases.marks,
    }


def backfill_checks(prom: Prometheus, groups: list[Group], end: int, eval_interval: float) -> list[dict[str, Any]]:
    """Samples per hour of each group's records at T against what its interval gives, and a raw series'
    samples over the day: what the look-backs read depends on both."""
    checks: list[dict[str, Any]] = []
    up = prom.query('max(count_over_time(up{job="rdma"}[1d]))', end)["result"]
    checks.append(
        {
            "what": "up[1d] samples per series",
            "found": float(up[0]["value"][1]) if up else 0,
            "expected": DAY // SCRAPE_INTERVAL + 1,
        }
    )
    for g in groups:
        interval = g.interval or eval_interval
        for rule in g.rules:
            if rule.kind != "record":
                continue
            selector = rule.name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(rule.labels.items())) + "}"
            found = prom.query(f"max(count_over_time({selector}[1h]))", end)["result"]
            if found:
                checks.append(
                    {
                        "what": f"{g.name}: {rule.name} samples per hour",
                        "found": float(found[0]["value"][1]),
                        "expected": 3600 / interval,
                    }
                )
                break  # one record of the group shows its spacing
    return checks


def source_revision(path: Path) -> dict[str, Any]:
    status = git(path, "status", "--porcelain", "--", ".")
    return {
        "rules_dir": str(path),
        "commit": git(path, "rev-parse", "HEAD"),
        "rules_dirty": None if status is None else bool(status),
    }


# --- reports -----------------------------------------------------------------------------------------


def fmt_int(value: float) -> str:
    return f"{round(value):,}"


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def fmt_interval(seconds: float) -> str:
    return f"{int(seconds // 60)}m" if seconds % 60 == 0 else f"{int(seconds)}s"


def fmt_big(value: float) -> str:
    if value >= 1e9:
        return f"{value / 1e9:.2f} G"
    if value >= 1e6:
        return f"{value / 1e6:.1f} M"
    return fmt_int(value)


def markdown(report: dict[str, Any]) -> str:
    totals, groups = report["totals"], report["groups"]
    nodes = report["nodes"]
    out = [
        f"## Rule evaluation cost: {nodes} nodes, a day of history",
        "",
        f"{nodes} nodes × {report['series_per_node']:,} series each, "
        f"scraped every {report['scrape_interval_seconds']} s "
        f"for {report['history_seconds'] / 3600:.1f} h: only the {report['families_kept']} metric families that the "
        f"rules read were kept, of the {report['families_total']} in the exposition "
        f"({report['exposition_series_per_node']:,} series a node), plus {', '.join(report['series_added'])}. "
        f"Rules from {report['source'].get('commit') or 'the working tree'}"
        f"{' (with uncommitted changes)' if report['source'].get('rules_dirty') else ''}, "
        f"evaluation_interval {fmt_interval(report['evaluation_interval_seconds'])}; {report['prometheus']}.",
        "",
        "Samples are Prometheus's `totalQueryableSamples` for each rule's expression as an instant query at the "
        "end of the backfilled day (exact, machine-independent); per minute counts a group with its own interval "
        "at its rate. Group durations are `prometheus_rule_group_last_duration_seconds`, median (max) of "
        f"{max((len(g['durations_seconds']) for g in groups), default=0)} live evaluation rounds on this machine "
        f"({report['machine']['nproc']} CPUs).",
        "",
        "| group | interval | rules | samples per evaluation | samples per minute | % of total "
        "| group duration median (max) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for g in groups:
        interval = fmt_interval(g["interval_seconds"]) + ("" if not g["own_interval"] else " (own)")
        out.append(
            f"| {g['name']} | {interval} | {g['rules']} | {fmt_int(g['samples_per_evaluation'])} | "
            f"{fmt_int(g['samples_per_minute'])} | {g['percent']:.1f} % | "
            f"{fmt_seconds(g['duration_seconds'])} ({fmt_seconds(g['duration_max_seconds'])})"
            f"{' †' if g['durations_during_compaction'] else ''} |"
        )
    out.append(
        f"| **total** | | {sum(g['rules'] for g in groups)} | {fmt_int(totals['samples_per_evaluation_round'])} | "
        f"{fmt_int(totals['samples_per_minute'])} | 100 % | "
        f"{fmt_seconds(totals['duration_seconds_per_minute'])} per minute |"
    )
    out += [
        "",
        f"Top {TOP_RULES} rules by samples per minute:",
        "",
        "| # | rule | group | samples per evaluation | % of total | result series | query time at T |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    ranked = sorted(report["rules"], key=lambda r: -r["samples_per_minute"])[:TOP_RULES]
    for n, r in enumerate(ranked, 1):
        out.append(
            f"| {n} | {r['kind']} `{r['name']}` (#{r['index']}) | {r['group']} | {fmt_int(r['samples'])} | "
            f"{r['percent']:.1f} % | {r['result_series']} | {fmt_seconds(r['query_seconds'])} |"
        )
    ext = report["extrapolation"]
    out += [
        "",
        f"At {ext['nodes']:,} nodes (linear in the node count): about {fmt_big(ext['samples_per_minute'])} samples "
        f"read per minute of rule evaluation, and about {fmt_seconds(ext['duration_seconds_per_minute'])} of "
        "evaluation per minute on this machine.",
        "",
    ]
    day = totals["samples_per_minute_in_rules_with_a_day_range"]
    notes = [
        f"rules with a range of a day or more ({sum(r['longest_range_seconds'] >= DAY for r in report['rules'])}) "
        f"read {100 * day / totals['samples_per_minute']:.1f} % of the samples (whole rules, other selectors included)"
        if totals["samples_per_minute"]
        else "no samples read"
    ]
    failures = {g["name"]: g["evaluation_failures"] for g in groups if g["evaluation_failures"]}
    missed = {g["name"]: g["iterations_missed"] for g in groups if g["iterations_missed"]}
    if any(g["durations_during_compaction"] for g in groups):
        notes.append("† no evaluation of this group after the TSDB's compaction: durations from during it")
    if failures:
        notes.append(f"evaluation failures: {failures}")
    if missed:
        notes.append(f"missed iterations: {missed}")
    bad = [c for c in report["backfill_checks"] if abs(c["found"] - c["expected"]) > 1]
    notes.append(
        "backfill checks: "
        + (
            "all as expected"
            if not bad
            else "; ".join(f"{c['what']}: {c['found']:g} (expected {c['expected']:g})" for c in bad)
        )
        + f" ({len(report['backfill_checks'])} checked)"
    )
    firing = report["alerts"]
    notes.append("alerts at the end: " + (", ".join(f"{k} × {v}" for k, v in sorted(firing.items())) or "none"))
    if report["self_reading_records"]:
        notes.append(
            "records that read themselves (backfilled without their own past): "
            + ", ".join(f"`{n}`" for n in report["self_reading_records"])
        )
    phases = report["phases_seconds"]
    notes.append(
        f"run took {phases['total']:.0f} s: " + ", ".join(f"{k} {v:.0f} s" for k, v in phases.items() if k != "total")
    )
    out += [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def prometheus_version(report: dict[str, Any]) -> str:
    """The version in a report's `prometheus --version` line ("prometheus, version 2.42.0+ds (...)")."""
    match = re.search(r"version (\S+)", str(report.get("prometheus", "")))
    return match.group(1) if match else "?"


def compare(old: dict[str, Any], new: dict[str, Any]) -> str:
    def label(report: dict[str, Any]) -> str:
        source = report.get("source") or {}
        if source.get("commit"):
            return str(source["commit"])[:10] + ("+" if source.get("rules_dirty") else "")
        return Path(source.get("rules_dir") or "?").name

    a, b = label(old), label(new)
    old_version, new_version = prometheus_version(old), prometheus_version(new)
    if old_version != new_version:  # the same rules (or not: the heading says) under two Prometheus versions
        heading = f"## Prometheus {old_version} ({a}) and {new_version} ({b})"
        a, b = old_version, new_version
    else:
        if a == b:
            a, b = f"{a} (old)", f"{b} (new)"
        heading = f"## Before ({a}) and after ({b})"
    out = [
        heading,
        "",
        f"{old['nodes']} and {new['nodes']} nodes; samples per minute of evaluation, group durations as measured."
        + ("" if old["nodes"] == new["nodes"] else " Different fleets: compare per node."),
        "",
        f"| group | samples/min {a} | samples/min {b} | change | duration {a} | duration {b} |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    old_groups = {g["name"]: g for g in old["groups"]}
    new_groups = {g["name"]: g for g in new["groups"]}
    names = [g["name"] for g in old["groups"]] + [g["name"] for g in new["groups"] if g["name"] not in old_groups]

    def change(x: float | None, y: float | None) -> str:
        if x is None or y is None:
            return "—"
        if x == 0:
            return "—" if y == 0 else "new"
        return f"{100 * (y - x) / x:+.1f} %"

    for name in names:
        o, n = old_groups.get(name), new_groups.get(name)
        os_, ns = (o["samples_per_minute"] if o else None), (n["samples_per_minute"] if n else None)
        out.append(
            f"| {name} | {fmt_int(os_) if os_ is not None else '—'} | {fmt_int(ns) if ns is not None else '—'} | "
            f"{change(os_, ns)} | {fmt_seconds(o['duration_seconds'] if o else None)} | "
            f"{fmt_seconds(n['duration_seconds'] if n else None)} |"
        )
    ot, nt = old["totals"], new["totals"]
    out.append(
        f"| **total** | {fmt_int(ot['samples_per_minute'])} | {fmt_int(nt['samples_per_minute'])} | "
        f"{change(ot['samples_per_minute'], nt['samples_per_minute'])} | "
        f"{fmt_seconds(ot['duration_seconds_per_minute'])}/min | {fmt_seconds(nt['duration_seconds_per_minute'])}/min |"
    )

    def rule_key(r: dict[str, Any]) -> tuple[str, str, str]:
        return (r["group"], r["kind"], r["name"])

    def summed(rules: list[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
        out: dict[tuple[str, str, str], float] = {}
        for r in rules:
            out[rule_key(r)] = out.get(rule_key(r), 0.0) + r["samples_per_minute"]
        return out

    old_rules, new_rules = summed(old["rules"]), summed(new["rules"])
    keys = sorted(set(old_rules) | set(new_rules), key=lambda k: -max(old_rules.get(k, 0), new_rules.get(k, 0)))
    out += [
        "",
        f"Rules (same group, kind and name; several rules of one name are summed), top {TOP_RULES} either side:",
        "",
        f"| rule | group | samples/min {a} | samples/min {b} | change |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for key in keys[:TOP_RULES]:
        x, y = old_rules.get(key), new_rules.get(key)
        out.append(
            f"| {key[1]} `{key[2]}` | {key[0]} | {fmt_int(x) if x is not None else '—'} | "
            f"{fmt_int(y) if y is not None else '—'} | {change(x, y)} |"
        )
    ox, nx = old["extrapolation"], new["extrapolation"]

    def day_share(report: dict[str, Any]) -> str:
        totals = report["totals"]
        day = totals.get("samples_per_minute_in_rules_with_a_day_range")
        if day is None or not totals["samples_per_minute"]:
            return "?"
        return f"{100 * day / totals['samples_per_minute']:.1f} %"

    out += [
        "",
        f"Rules with a range of a day or more read {day_share(old)} of the samples before, {day_share(new)} after.",
        "",
        f"At {nx['nodes']:,} nodes: {fmt_big(ox['samples_per_minute'])} → {fmt_big(nx['samples_per_minute'])} samples "
        f"per minute, {fmt_seconds(ox['duration_seconds_per_minute'])} → "
        f"{fmt_seconds(nx['duration_seconds_per_minute'])} of evaluation per minute.",
        "",
    ]
    return "\n".join(out)


# --- main --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=10, help="simulated nodes (default 10)")
    parser.add_argument("--rules", default=str(ROOT / "rules"), help="directory of rule files (*.yml, default rules/)")
    parser.add_argument(
        "--exposition",
        default=str(ROOT / "tests" / "golden" / "sample-8hca.prom"),
        help="one node's answer (default tests/golden/sample-8hca.prom)",
    )
    parser.add_argument("--eval-interval", default="1m", help="global evaluation_interval (default 1m)")
    parser.add_argument("--rounds", type=int, default=3, help="evaluation rounds whose durations are read (default 3)")
    parser.add_argument(
        "--repeat", type=int, default=3, help="instant queries per rule, for the median time (default 3)"
    )
    parser.add_argument("--json", help="write every number here")
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="JSON",
        help="OLD.json: print this run beside it; OLD.json NEW.json: only compare the two files",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (TSDB, logs)")
    parser.add_argument("--prometheus", default=shutil.which("prometheus") or "prometheus")
    parser.add_argument("--promtool", default=shutil.which("promtool") or "promtool")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.compare and len(args.compare) > 2:
        print("rules_cost: --compare takes OLD.json, or OLD.json NEW.json", file=sys.stderr)
        return 2
    if args.compare and len(args.compare) == 2:
        old, new = (json.loads(Path(p).read_text()) for p in args.compare)
        print(compare(old, new))
        return 0
    if args.nodes < 1 or args.rounds < 1 or args.repeat < 1:
        print("rules_cost: --nodes, --rounds and --repeat must be at least 1", file=sys.stderr)
        return 2
    for tool in (args.prometheus, args.promtool):
        if shutil.which(tool) is None:
            print(f"rules_cost: {tool} not found (Debian: apt-get install prometheus)", file=sys.stderr)
            return 2
    # SIGTERM/SIGHUP unwind through the finally blocks like Ctrl-C does: no child outlives the run. SIGINT
    # too when started in the background by a shell, which would have it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    try:
        report = measure(args)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        stop_all(timeout=STOP_TIMEOUT)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(markdown(report))
    if args.compare:
        print(compare(json.loads(Path(args.compare[0]).read_text()), report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
