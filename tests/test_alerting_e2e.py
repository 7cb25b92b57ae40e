"""End to end with the real binaries: exporter -> Prometheus (rules/) -> Alertmanager (deploy/) -> webhook.

The exporter serves a temp copy of the healthy sample tree with the expected topology configured.
Prometheus scrapes it every second and evaluates the shipped rule expressions (on a copy whose `for:`
durations are divided by FOR_SCALE), Alertmanager runs the example config with its receivers pointed at
a webhook server in this test. First the healthy tree must page nothing; then three faults are
written into the tree and the right alerts must reach the right receivers with the right labels,
while the alert a down port inhibits is held back.

The inhibition test runs Alertmanager alone: for each case of deploy/alertmanager/inhibit-tests.yaml it
posts the case's source alert with every shipped alert, in pairs, and checks which ones are inhibited.

Each test that starts Prometheus or Alertmanager runs twice: with Debian 12's Prometheus 2.42 and
Alertmanager 0.25, and with Prometheus 3 and the Alertmanager Debian testing ships beside it
(conftest.PROMETHEUS_RELEASES). The fault scenario, which mostly waits, runs under both at the same time.

Everything listens on 127.0.0.1, every wait is bounded, and every process is stopped at the end.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from rdma_exporter.sample_tree import HEALTHY_SPEC, build_tree

from conftest import (
    PROMETHEUS_RELEASES,
    BackgroundRuns,
    PrometheusRelease,
    alternatives,
    distinct_free_ports,
    free_port,
    selected_params,
)

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = "e2e"
FOR_SCALE = 30  # 2m -> 4s, 5m -> 10s
HEALTHY_WINDOW = 15.0  # seconds of evaluation in which nothing may even be pending
DEADLINE = 60.0  # longest wait for any one expectation

EXPECTED_TOPOLOGY = (Path(__file__).resolve().parent.parent / "deploy/examples/expected-sample-node.yml").read_text()


@pytest.fixture(params=PROMETHEUS_RELEASES, ids=lambda release: release.name)
def release(request: pytest.FixtureRequest) -> PrometheusRelease:
    """Each test once with Debian 12's Prometheus and Alertmanager, once with Prometheus 3's."""
    return request.param  # type: ignore[no-any-return]


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=20) as response:  # thousands of alerts, on a busy machine
        return json.load(response)


def wait_for(what: str, check: Callable[[], Any], timeout: float = DEADLINE, interval: float = 0.5) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (OSError, ValueError) as exc:  # not listening yet, half-written response
            last_error = exc
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last_error})")


@dataclass
class Webhook:
    """Alertmanager webhook receiver: records every notification by path (/pager, /ticket)."""

    server: ThreadingHTTPServer
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def alerts(self, path: str, status: str = "firing") -> list[dict[str, Any]]:
        with self.lock:
            return [
                alert
                for where, body in self.received
                if where == path
                for alert in body["alerts"]
                if alert["status"] == status
            ]

    def all_alertnames(self) -> set[str]:
        with self.lock:
            return {alert["labels"]["alertname"] for _, body in self.received for alert in body["alerts"]}


@contextmanager
def serve_webhook() -> Iterator[Webhook]:
    """A webhook receiver on a loopback port, for as long as the block runs."""
    hook: Webhook

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            with hook.lock:
                hook.received.append((self.path, body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook = Webhook(server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    with serve_webhook() as hook:
        yield hook


class Processes:
    """Started processes, stopped (then killed if need be) in reverse order at teardown."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        # env: the fault scenario starts its processes from BackgroundRuns' threads (see there).
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=dict(os.environ)
        )
        log.close()
        self.procs.append((name, proc))
        return proc

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"{name} exited with {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def shorten_for(rules_dir: Path, dest: Path) -> list[Path]:
    """Copies of the shipped rule files with every `for:` divided by FOR_SCALE; expressions untouched."""
    out = []
    for path in sorted(rules_dir.glob("*.rules.yml")):
        document = yaml.safe_load(path.read_text())
        for group in document["groups"]:
            group["interval"] = "1s"
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = f"{max(1, parse_duration(rule['for']) // FOR_SCALE)}s"
        copy = dest / path.name
        copy.write_text(yaml.safe_dump(document, sort_keys=False))
        out.append(copy)
    return out


def parse_duration(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    return int(text[:-1]) * units[text[-1]]


def alertmanager_config(webhook: Webhook, dest: Path, wait: str | None = "1s", scale: int = 1) -> Path:
    """The example config with its receivers pointed at the test webhook. Every route's group waits and
    intervals (a child route's own ones too) are set to `wait`, or, with wait=None, divided by `scale`."""
    config = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    for route in [config["route"], *config["route"].get("routes", [])]:
        if wait is not None:
            route.update(group_wait=wait, group_interval=wait)
            continue
        for key in ("group_wait", "group_interval", "repeat_interval"):
            if key in route:
                route[key] = f"{max(1, parse_duration(route[key]) // scale)}s"
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = webhook.url + "/" + receiver["name"]
    path = dest / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def start_alertmanager(procs: Processes, binary: str, config: Path, tmp_path: Path, port: int) -> None:
    """A single Alertmanager (no cluster peers) on a loopback port, its data under tmp_path."""
    procs.start(
        "alertmanager",
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
    )


def write_attr(path: Path, value: str) -> None:
    """Replace a sysfs attribute the way the kernel presents it: whole, newline-terminated."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(value + "\n")
    tmp.replace(path)


def prometheus_alerts(url: str) -> list[dict[str, Any]]:
    return list(get_json(f"{url}/api/v1/alerts")["data"]["alerts"])


def find(alerts: list[dict[str, Any]], **labels: str) -> list[dict[str, Any]]:
    return [a for a in alerts if all(a["labels"].get(k) == v for k, v in labels.items())]


@pytest.fixture(scope="module")
def fault_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundRuns]:
    """The fault scenario under every selected Prometheus line at once: a run spends its 38 s waiting
    on scrapes, evaluations and `for:` (about a fifth of a CPU), so the second line costs no time. The
    webhooks listen before the ports of both runs are chosen, in one call, so that no two of them can
    end up on one port."""
    selected = [params["release"] for params in selected_params(request, "test_faults_page_the_right_receivers")]
    with ExitStack() as webhooks:
        hooks = [webhooks.enter_context(serve_webhook()) for _ in selected]
        ports = distinct_free_ports(3 * len(selected))
        with BackgroundRuns(workers=len(selected) or 1) as runs:
            for index, (release, hook) in enumerate(zip(selected, hooks, strict=True)):
                work = tmp_path_factory.mktemp(f"faults-{release.name}")
                runs.submit(release.name, _fault_scenario, work, hook, release, ports[3 * index : 3 * index + 3])
            yield runs


def test_faults_page_the_right_receivers(release: PrometheusRelease, fault_runs: BackgroundRuns) -> None:
    fault_runs.result(release.name)


def _fault_scenario(tmp_path: Path, webhook: Webhook, release: PrometheusRelease, ports: list[int]) -> None:
    prometheus = release.binary("prometheus")
    alertmanager = release.binary("prometheus-alertmanager", "alertmanager")

    tree = tmp_path / "tree"
    sys_root = build_tree(tree, HEALTHY_SPEC)
    exporter_config = tmp_path / "rdma-exporter.yml"
    exporter_config.write_text(EXPECTED_TOPOLOGY)
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    rule_files = shorten_for(ROOT / "rules", rules_dir)

    exporter_port, prom_port, am_port = ports
    am_url, prom_url = f"http://127.0.0.1:{am_port}", f"http://127.0.0.1:{prom_port}"
    prom_config = tmp_path / "prometheus.yml"
    prom_config.write_text(
        yaml.safe_dump(
            {
                "global": {
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "evaluation_interval": "1s",
                    "external_labels": {"cluster": CLUSTER},
                },
                "rule_files": [str(p) for p in rule_files],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
                "scrape_configs": [
                    {"job_name": "rdma-exporter", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}
                ],
            }
        )
    )

    logs = tmp_path / "logs"
    logs.mkdir()
    procs = Processes(logs)
    try:
        procs.start(
            "exporter",
            [
                sys.executable, "-m", "rdma_exporter",
                "--path.sysfs", str(sys_root),
                "--path.ethtool", str(tree / "ethtool"),
                "--config.file", str(exporter_config),
                "--web.listen-address", f"127.0.0.1:{exporter_port}",
            ],
        )  # fmt: skip
        start_alertmanager(procs, alertmanager, alertmanager_config(webhook, tmp_path), tmp_path, am_port)
        procs.start(
            "prometheus",
            [
                prometheus,
                f"--config.file={prom_config}",
                f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--rules.alert.resend-delay=1s",
            ],
        )

        def target_up() -> bool:
            procs.check_alive()
            result = get_json(f"{prom_url}/api/v1/query?query=up")["data"]["result"]
            return bool(result) and result[0]["value"][1] == "1"

        wait_for("Prometheus to scrape the exporter", target_up)
        wait_for("Alertmanager to be ready", lambda: get_json(f"{am_url}/api/v2/status"))
        wait_for(
            "the expected topology to be scraped",
            lambda: get_json(f"{prom_url}/api/v1/query?query=rdma_expected_port_present")["data"]["result"],
        )

        # --- healthy: nothing fires, nothing is even pending, nothing is sent --------------------------
        deadline = time.monotonic() + HEALTHY_WINDOW
        while time.monotonic() < deadline:
            procs.check_alive()
            assert prometheus_alerts(prom_url) == []
            time.sleep(1)
        assert webhook.received == []

        # --- faults -----------------------------------------------------------------------------------
        ports = sys_root / "class" / "infiniband"
        # mlx5_0: a failing cable retrained the link 20 times, then it was pulled. The port goes DOWN
        # and link_downed counts the drop.
        write_attr(ports / "mlx5_0/ports/1/state", "1: DOWN")
        write_attr(ports / "mlx5_0/ports/1/phys_state", "2: Polling")
        write_attr(ports / "mlx5_0/ports/1/rate", "40 Gb/sec (4X QDR)")
        write_attr(ports / "mlx5_0/ports/1/counters/link_downed", "1")
        write_attr(ports / "mlx5_0/ports/1/counters/link_error_recovery", "20")
        # mlx5_1: the link dropped once and came back.
        write_attr(ports / "mlx5_1/ports/1/counters/link_downed", "1")
        # mlx5_3: retrained at 200 Gb/s on two lanes.
        write_attr(ports / "mlx5_3/ports/1/rate", "200 Gb/sec (2X NDR)")
        # mlx5_2: its ASIC at 106 degrees, past the 105 its firmware reports: the page, and its ticket
        # held back by it.
        (asic,) = (ports / "mlx5_2/device").glob("hwmon/hwmon*/temp1_input")
        write_attr(asic, "106000")
        # mlx5_8: `ip link set enp220s0f0np0 down`. mlx5 shows its RoCE port DOWN / Disabled as for a
        # pulled cable; the netdev loses IFF_UP, and carrier, speed and duplex have no value (EINVAL).
        # No page: RdmaRocePortAdminDown starts its hour instead.
        write_attr(ports / "mlx5_8/ports/1/state", "1: DOWN")
        write_attr(ports / "mlx5_8/ports/1/phys_state", "3: Disabled")
        roce_netdev = sys_root / "class/net/enp220s0f0np0"
        write_attr(roce_netdev / "operstate", "down")
        write_attr(roce_netdev / "flags", "0x1002")
        for name in ("carrier", "speed", "duplex"):
            (roce_netdev / name).resolve().unlink()

        def delivered() -> bool:
            procs.check_alive()
            pager = {(a["labels"]["alertname"], a["labels"]["device"]) for a in webhook.alerts("/pager")}
            ticket = {(a["labels"]["alertname"], a["labels"]["device"]) for a in webhook.alerts("/ticket")}
            paged = {("RdmaPortDown", "mlx5_0"), ("RdmaPortRateBelowExpected", "mlx5_3")}
            return paged | {("RdmaDeviceTemperatureHigh", "mlx5_2")} <= pager and (
                "RdmaPortLinkDowned",
                "mlx5_1",
            ) in ticket

        wait_for("the fault notifications", delivered)
        # mlx5_8 went down with mlx5_0, whose page has gone out: it is not even pending, and its ticket is
        # (its hour, 2 minutes here, is still running).
        assert find(prometheus_alerts(prom_url), alertname="RdmaPortDown", device="mlx5_8") == []
        set_down = find(prometheus_alerts(prom_url), alertname="RdmaRocePortAdminDown")
        assert [(a["labels"]["device"], a["state"]) for a in set_down] == [("mlx5_8", "pending")]

        # Labels: the cluster from Prometheus' external labels, the port, the severity that routed it.
        instance = f"127.0.0.1:{exporter_port}"
        common = {"cluster": CLUSTER, "job": "rdma-exporter", "instance": instance, "port": "1"}
        down = find(webhook.alerts("/pager"), alertname="RdmaPortDown", device="mlx5_0")[0]
        assert down["labels"] == {
            **common,
            "alertname": "RdmaPortDown",
            "severity": "critical",
            "device": "mlx5_0",
        }
        assert down["annotations"]["runbook_url"].endswith("/docs/runbooks/RdmaPortDown.md")
        assert f"{instance} mlx5_0 port 1 is DOWN (physical state Polling)" in down["annotations"]["description"]
        slow = find(webhook.alerts("/pager"), alertname="RdmaPortRateBelowExpected")[0]
        assert slow["labels"] == {
            **common,
            "alertname": "RdmaPortRateBelowExpected",
            "severity": "critical",
            "device": "mlx5_3",
        }
        assert "trained at 200Gb/s (2X NDR), expected 400Gb/s (4X)" in slow["annotations"]["description"]
        dropped = find(webhook.alerts("/ticket"), alertname="RdmaPortLinkDowned")
        assert [a["labels"] for a in dropped] == [
            {**common, "alertname": "RdmaPortLinkDowned", "severity": "warning", "device": "mlx5_1"}
        ]

        # mlx5_0's retrains: Prometheus fires RdmaPortLinkErrorRecovery for them, and Alertmanager holds
        # it back because RdmaPortDown on the same port inhibits it.
        def inhibited() -> list[dict[str, Any]]:
            alerts = get_json(f"{am_url}/api/v2/alerts?filter=alertname%3D%22RdmaPortLinkErrorRecovery%22")
            return [
                a
                for a in alerts
                if a["labels"].get("device") == "mlx5_0"
                and a["status"]["state"] == "suppressed"
                and a["status"]["inhibitedBy"]
            ]

        wait_for("RdmaPortLinkErrorRecovery on mlx5_0 to be inhibited", inhibited)
        time.sleep(3)  # a few more notification rounds: the inhibited alert must still not be sent
        assert find(webhook.alerts("/ticket"), alertname="RdmaPortLinkErrorRecovery", device="mlx5_0") == []
        # mlx5_0's drop is the one its page is for: RdmaPortLinkDowned does not even fire for it, so no
        # ticket follows once the port is back and the inhibition lifts.
        assert find(prometheus_alerts(prom_url), alertname="RdmaPortLinkDowned", device="mlx5_0") == []
        assert find(webhook.alerts("/pager"), device="mlx5_1") == []
        # Only the injected faults were reported: no healthy port was dragged in.
        reported = {
            (a["labels"]["alertname"], a["labels"].get("device"))
            for path in ("/pager", "/ticket")
            for a in webhook.alerts(path)
        }
        assert reported == {
            ("RdmaPortDown", "mlx5_0"),
            ("RdmaPortRateBelowExpected", "mlx5_3"),
            ("RdmaPortLinkDowned", "mlx5_1"),
            ("RdmaDeviceTemperatureHigh", "mlx5_2"),
        }
        hot = find(webhook.alerts("/pager"), alertname="RdmaDeviceTemperatureHigh")[0]
        assert hot["labels"] == {
            "cluster": CLUSTER, "job": "rdma-exporter", "instance": instance, "alertname": "RdmaDeviceTemperatureHigh",
            "severity": "critical", "device": "mlx5_2", "sensor": "asic",
        }  # fmt: skip
        # Its warning fires too (106 is within 10 of 105) and stays behind the page: no ticket.
        def warning_firing() -> list[dict[str, Any]]:
            procs.check_alive()
            warnings = find(prometheus_alerts(prom_url), alertname="RdmaDeviceTemperatureHigh", severity="warning")
            return [a for a in warnings if a["state"] == "firing"]

        wait_for("the temperature warning to fire", warning_firing)
        time.sleep(3)  # a few notification rounds
        assert find(webhook.alerts("/ticket"), alertname="RdmaDeviceTemperatureHigh") == []
    finally:
        procs.stop()


@contextmanager
def alertmanager_alone(
    tmp_path: Path, webhook: Webhook, release: PrometheusRelease, **config: Any
) -> Iterator[tuple[Processes, str]]:
    """A single Alertmanager on a loopback port running the example config (alertmanager_config's
    `config` arguments), ready to take alerts; its processes and URL. Stopped on exit."""
    alertmanager = release.binary("prometheus-alertmanager", "alertmanager")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = Processes(logs)
    try:
        start_alertmanager(procs, alertmanager, alertmanager_config(webhook, tmp_path, **config), tmp_path, port)
        wait_for("Alertmanager to be ready", lambda: get_json(f"{url}/api/v2/status"))
        yield procs, url
    finally:
        procs.stop()


def post_alerts(url: str, alerts: list[dict[str, str]]) -> None:
    """Post firing alerts (started a minute ago, ending in an hour) to Alertmanager as Prometheus does."""
    now = time.time()
    stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))  # noqa: E731
    body = [{"labels": labels, "startsAt": stamp(now - 60), "endsAt": stamp(now + 3600)} for labels in alerts]
    request = urllib.request.Request(
        f"{url}/api/v2/alerts", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    # Ingesting 500 alerts against the inhibit rules takes seconds on a busy 2-core CI machine.
    with urllib.request.urlopen(request, timeout=DEADLINE) as response:
        assert response.status == 200


ROUTE_SCALE = 30  # the shipped routing timings, 30 times faster: 30s -> 1s, 1m -> 2s, 5m -> 10s


def test_a_second_fault_on_a_paged_node_pages_at_the_pager_interval(
    tmp_path: Path, webhook: Webhook, release: PrometheusRelease
) -> None:
    """A node's pager group that has paged for one fault, still firing, pages for a second fault at its
    next flush: with the shipped timings (scaled) that is the pager route's 1 minute, not the root
    route's 5 (measured live: a second fault paged 2m29-4m54 late when the pager had no interval of its own)."""
    with alertmanager_alone(tmp_path, webhook, release, wait=None, scale=ROUTE_SCALE) as (_, url):
        node = {"cluster": CLUSTER, "job": "rdma-exporter", "instance": "gpu-017:9883", "severity": "critical"}
        first = {**node, "alertname": "RdmaPortRateBelowExpected", "device": "mlx5_3", "port": "1"}
        second = {**node, "alertname": "RdmaPortDown", "device": "mlx5_5", "port": "1"}
        post_alerts(url, [first])
        wait_for("the first page", lambda: find(webhook.alerts("/pager"), alertname=first["alertname"]))
        # Right after a flush: the second alert waits for the group's whole interval.
        posted = time.monotonic()
        post_alerts(url, [first, second])
        wait_for("the second page", lambda: find(webhook.alerts("/pager"), alertname=second["alertname"]), interval=0.1)
        waited = time.monotonic() - posted
        pager_interval = 60 / ROUTE_SCALE
        root_interval = 300 / ROUTE_SCALE
        assert waited < (pager_interval + root_interval) / 2, (
            f"the second fault paged {waited:.1f} s after it was posted (scaled pager interval {pager_interval:.0f} s, "
            f"root {root_interval:.0f} s)"
        )
        assert webhook.alerts("/ticket") == []


# --- inhibitions, case by case ---------------------------------------------------------------------

INHIBIT_CASES: list[dict[str, Any]] = yaml.safe_load((ROOT / "deploy/alertmanager/inhibit-tests.yaml").read_text())
SCOPES = ("same_port", "same_device", "same_instance")
# Where the target alert is put relative to the source (instance, device, port, job), by the labels it
# has. other_job: the same node, device and port under another job (a node scraped by `rdma` and
# `rdma-tls` while it moves to TLS), which no rule may hold back: the source's target is another one.
PLACEMENTS = {
    "same_port": ("src", "mlx5_3", "1", "rdma-exporter"),
    "other_port": ("src", "mlx5_3", "2", "rdma-exporter"),
    "other_device": ("src", "mlx5_4", "1", "rdma-exporter"),
    "other_instance": ("other", "mlx5_3", "1", "rdma-exporter"),
    "other_job": ("src", "mlx5_3", "1", "rdma-tls"),
}
# Which placements each scope of a case covers.
SCOPE_PLACEMENTS = {
    "same_port": {"same_port"},
    "same_device": {"same_port", "other_port"},
    "same_instance": {"same_port", "other_port", "other_device"},
}
_MATCHER = re.compile(r'^\s*(\w+)\s*(=~|!~|!=|=)\s*"(.*)"\s*$')


def shipped_alerts() -> dict[tuple[str, str], list[tuple[str, ...]]]:
    """(alertname, severity) of every shipped alert -> the label names its promtool tests give it."""
    severities = {
        (rule["alert"], rule["labels"]["severity"])
        for path in sorted((ROOT / "rules").glob("*.rules.yml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    shapes: dict[tuple[str, str], set[tuple[str, ...]]] = {key: set() for key in severities}
    for path in sorted((ROOT / "rules" / "tests").glob("*.test.yml")):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                for alert in case.get("exp_alerts") or []:
                    labels = alert.get("exp_labels", {})
                    key = (case["alertname"], labels.get("severity"))
                    # cluster and rack come from the test's own series; every alert gets a cluster below.
                    shapes[key].add(tuple(sorted(set(labels) - {"alertname", "severity", "cluster", "rack"})))
    missing = sorted(key for key, found in shapes.items() if not found)
    assert missing == [], f"alerts without a firing promtool case to take their labels from: {missing}"
    return {key: sorted(found) for key, found in shapes.items()}


def matches(matchers: list[str], labels: dict[str, str]) -> bool:
    """Alertmanager's label matchers (the four operators, anchored regexes), for the coverage check."""
    for matcher in matchers:
        parsed = _MATCHER.match(matcher)
        assert parsed, f"matcher this test cannot read: {matcher!r}"
        name, op, value = parsed.groups()
        actual = labels.get(name, "")
        if op == "=":
            ok = actual == value
        elif op == "!=":
            ok = actual != value
        else:
            ok = bool(re.fullmatch(value, actual)) == (op == "=~")
        if not ok:
            return False
    return True


def listed(case: dict[str, Any], scope: str, name: str, severity: str) -> bool:
    entries = case.get(scope, [])
    if "*" in entries:
        return name != case["source"]["alertname"]
    return name in entries or f"{name}/{severity}" in entries


def alert_labels(
    name: str, severity: str, shape: tuple[str, ...], instance: str, device: str, port: str,
    job: str = "rdma-exporter",
) -> dict[str, str]:
    labels = {"alertname": name, "severity": severity, "cluster": "c1"}
    fixed = {"instance": instance, "device": device, "port": port, "job": job}
    for key in shape:
        labels[key] = fixed.get(key, f"{key}-1")
    return labels


def test_inhibit_cases_cover_every_rule_and_name_real_alerts() -> None:
    alerts = shipped_alerts()
    names = {name for name, _ in alerts}
    config = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    cased = [case["source"] for case in INHIBIT_CASES]
    shipped = [{"alertname": name, "severity": severity} for name, severity in alerts]
    for index, rule in enumerate(config["inhibit_rules"]):
        # A misspelt alert name in a rule would make it match nothing, silently.
        for side in ("source_matchers", "target_matchers"):
            matched = any(matches(rule[side], labels) for labels in shipped)
            assert matched, f"inhibit rule {index}: no shipped alert matches its {side}"
            # ... nor may one name of a list: a regex with a misspelt branch still matches the others.
            for matcher in rule[side]:
                parsed = _MATCHER.match(matcher)
                if parsed and parsed[1] == "alertname" and parsed[2] == "=~":
                    for branch in alternatives(parsed[3]):
                        hits = [name for name, _ in alerts if re.fullmatch(branch, name)]
                        assert hits, f"inhibit rule {index}: {branch!r} in {side} matches no shipped alert"
        # Every shipped alert that this rule lets hold back another shipped alert needs its own case.
        for name, severity in alerts:
            source = {"alertname": name, "severity": severity}
            if not matches(rule["source_matchers"], source):
                continue
            targets = sorted(
                f"{other}/{other_severity}"
                for other, other_severity in alerts
                if (other, other_severity) != (name, severity)
                and matches(rule["target_matchers"], {"alertname": other, "severity": other_severity})
                and ("alertname" not in rule.get("equal", []) or other == name)
            )
            assert not targets or source in cased, (
                f"inhibit rule {index}: {name}/{severity} can hold back {targets} but has no case in inhibit-tests.yaml"
            )
    for case in INHIBIT_CASES:
        source = case["source"]
        assert (source["alertname"], source["severity"]) in alerts, f"no such alert: {source}"
        assert set(case) - {"source"} <= set(SCOPES), case
        for scope in SCOPES:
            # An alert held back per port or per device must carry that label, or no rule can compare it.
            needs = {"same_port": ("device", "port"), "same_device": ("device",), "same_instance": ()}[scope]
            for entry in case.get(scope, []):
                if entry == "*":
                    continue
                name, _, severity = entry.partition("/")
                assert name in names, f"{source['alertname']}: {scope} names an unknown alert {entry}"
                for (alertname, sev), shapes in alerts.items():
                    if alertname == name and severity in ("", sev):
                        for shape in shapes:
                            assert set(needs) <= set(shape), f"{entry} {shape} has no {needs} label for {scope}"


def test_a_sensors_page_holds_back_its_own_ticket_but_not_another_sensors(
    tmp_path: Path, webhook: Webhook, release: PrometheusRelease
) -> None:
    """An alert at two severities per sensor: the critical-over-warning rule compares `sensor`, which the
    case-by-case test cannot show (it gives every target the same value of each label)."""
    device = {"alertname": "RdmaDeviceTemperatureHigh", "cluster": "c1", "job": "rdma-exporter",
              "instance": "dgx-301:9883", "device": "mlx5_0"}  # fmt: skip
    alerts = (("critical", "Module0"), ("warning", "Module0"), ("warning", "asic"))
    posted = [device | {"severity": severity, "sensor": sensor} for severity, sensor in alerts]
    with alertmanager_alone(tmp_path, webhook, release, wait="1h") as (procs, url):
        post_alerts(url, posted)

        def inhibited() -> dict[tuple[str, str], bool]:
            procs.check_alive()
            return {
                (alert["labels"]["sensor"], alert["labels"]["severity"]): bool(alert["status"]["inhibitedBy"])
                for alert in get_json(f"{url}/api/v2/alerts")
            }

        expected = {("Module0", "critical"): False, ("Module0", "warning"): True, ("asic", "warning"): False}
        wait_for("the inhibition to settle", lambda: inhibited() == expected)


def test_a_pause_page_holds_back_its_own_ticket_but_not_another_links_or_prioritys(
    tmp_path: Path, webhook: Webhook, release: PrometheusRelease
) -> None:
    """The critical-over-warning rule compares netdev and priority too: a RoCE LAG's two slaves are two links
    under one port, and a storm on priority 3 says nothing of priority 5 (alerting review: both were held
    back). The other direction of the same priority is part of the storm, and held back."""
    port = {"cluster": "c1", "job": "rdma-exporter", "instance": "dgx-302:9883", "device": "mlx5_bond_0", "port": "1"}
    storm = port | {"alertname": "RdmaRocePauseStorm"}
    paused = port | {"alertname": "RdmaRocePfcPauseHigh", "netdev": "ens1f0np0"}
    posted = {
        "storm page": storm | {"severity": "critical", "netdev": "ens1f0np0"},
        "storm ticket, same slave": storm | {"severity": "warning", "netdev": "ens1f0np0"},
        "storm ticket, other slave": storm | {"severity": "warning", "netdev": "ens1f1np1"},
        "pause page": paused | {"severity": "critical", "direction": "rx", "priority": "3"},
        "pause ticket, same priority": paused | {"severity": "warning", "direction": "rx", "priority": "3"},
        "pause ticket, other priority": paused | {"severity": "warning", "direction": "rx", "priority": "5"},
        "pause ticket, other direction": paused | {"severity": "warning", "direction": "tx", "priority": "3"},
    }  # fmt: skip
    keys = {tuple(sorted(labels.items())): name for name, labels in posted.items()}
    with alertmanager_alone(tmp_path, webhook, release, wait="1h") as (procs, url):
        post_alerts(url, list(posted.values()))

        def inhibited() -> dict[str, bool]:
            procs.check_alive()
            return {
                keys[tuple(sorted(alert["labels"].items()))]: bool(alert["status"]["inhibitedBy"])
                for alert in get_json(f"{url}/api/v2/alerts")
            }

        same = ("storm ticket, same slave", "pause ticket, same priority", "pause ticket, other direction")
        expected = {name: name in same for name in posted}
        wait_for("the inhibition to settle", lambda: inhibited() == expected)


def test_exporter_failures_across_nodes_are_one_ticket_and_port_pages_one_a_node(
    tmp_path: Path, webhook: Webhook, release: PrometheusRelease
) -> None:
    """Exporters failing on many nodes at once share a cause (a certificate, a network policy): one ticket
    group for the job, not one a node (alerting review: five nodes made five tickets), and so do
    configuration drift tickets (routing review). Faults of the nodes themselves stay grouped per node."""
    nodes = [f"dgx-31{k}:9883" for k in range(5)]
    base = {"cluster": "c1", "job": "rdma-exporter"}
    posted = [base | {"alertname": "RdmaExporterDown", "severity": "warning", "instance": node} for node in nodes]
    posted += [base | {"alertname": "RdmaPortDown", "severity": "critical", "instance": node, "device": "mlx5_0",
                       "port": "1"} for node in nodes[:2]]  # fmt: skip
    # A QoS rollout that lost PFC on three nodes: one ticket too (fleet-wide causes' route).
    posted += [base | {"alertname": "RdmaRocePfcDisabled", "severity": "warning", "instance": node, "device": "mlx5_8",
                       "port": "1"} for node in nodes[:3]]  # fmt: skip
    with alertmanager_alone(tmp_path, webhook, release, wait="1h") as (procs, url):
        post_alerts(url, posted)

        def groups() -> list[tuple[str, int]]:
            procs.check_alive()
            return sorted((g["receiver"]["name"], len(g["alerts"])) for g in get_json(f"{url}/api/v2/alerts/groups"))

        wait_for("the groups", lambda: groups() == [("pager", 1), ("pager", 1), ("ticket", 3), ("ticket", 5)])


def test_the_documented_maintenance_silences_hold_back_what_they_say(
    tmp_path: Path, webhook: Webhook, release: PrometheusRelease
) -> None:
    """The silences docs/runbooks/README.md gives for planned work, created with the real amtool: the first
    covers the node's alerts (under either form of its instance) but not the two tickets that say a name
    moved, which fire for 70 minutes after the change and would otherwise end inside the silence unseen;
    the second covers the node's RdmaPortLinkDropsRepeated, which counts the work's drops for 12 hours."""
    readme = (ROOT / "docs/runbooks/README.md").read_text()
    commands = re.findall(r"`amtool silence add ([^`]+)`", readme)
    assert len(commands) == 2, commands
    amtool = release.binary("amtool")
    node = {"cluster": CLUSTER, "job": "rdma-exporter", "device": "mlx5_3"}
    # How many of the two silences hold each alert back: the first all but the name tickets, the second
    # RdmaPortLinkDropsRepeated on the node only (also under the first here, which lasts 3 hours, not 15).
    alerts = {
        ("gpu-031:9883", "RdmaPortLinkDowned"): 1,
        ("gpu-031:9883", "RdmaPortDown"): 1,
        ("gpu-031", "RdmaPortDown"): 1,
        ("gpu-031:9883", "RdmaDeviceNameMoved"): 0,
        ("gpu-031:9883", "RdmaDeviceNameMovedWhileAway"): 0,
        ("gpu-0311:9883", "RdmaPortDown"): 0,
        ("gpu-032:9883", "RdmaDeviceNameMoved"): 0,
        ("gpu-031", "RdmaPortLinkDropsRepeated"): 2,
        ("gpu-031:9883", "RdmaPortLinkDropsRepeated"): 2,
        ("gpu-032", "RdmaPortLinkDropsRepeated"): 0,
    }
    posted = [node | {"instance": instance, "alertname": name, "severity": "warning"} for instance, name in alerts]
    with alertmanager_alone(tmp_path, webhook, release, wait="1h") as (procs, url):
        for command in commands:
            arguments = command.replace("<url>", url).replace("<ticket>", "MAINT-1").replace("<node>", "gpu-031")
            result = subprocess.run(
                [amtool, "silence", "add", *shlex.split(arguments)], capture_output=True, text=True, timeout=60
            )
            assert result.returncode == 0, result.stdout + result.stderr
        post_alerts(url, posted)

        def silenced() -> dict[tuple[str, str], int]:
            procs.check_alive()
            return {
                (alert["labels"]["instance"], alert["labels"]["alertname"]): len(alert["status"]["silencedBy"])
                for alert in get_json(f"{url}/api/v2/alerts")
            }

        wait_for("the silence to settle", lambda: silenced() == alerts)


def test_inhibitions_hold_back_exactly_the_intended_alerts(
    tmp_path: Path, webhook: Webhook, release: PrometheusRelease
) -> None:
    """Every case's source fires with every shipped alert, one pair per instance, on a real Alertmanager
    running the shipped inhibit rules; exactly the alerts the case lists for that placement are inhibited."""
    alerts = shipped_alerts()
    posted: list[dict[str, str]] = []
    expected: dict[str, bool] = {}  # pair -> is its target inhibited?
    for number, case in enumerate(INHIBIT_CASES):
        source = case["source"]
        source_key = (source["alertname"], source["severity"])
        source_shape = alerts[source_key][0]
        for (name, severity), shapes in sorted(alerts.items()):
            if (name, severity) == source_key:
                continue
            for shape_number, shape in enumerate(shapes):
                for placement, (where, device, port, job) in PLACEMENTS.items():
                    # A target without a port (or device, job) label has one placement for all of those;
                    # one without an instance (an alert per job) is on no node, so on none of the source's.
                    if (
                        ("port" not in shape and placement == "other_port")
                        or ("device" not in shape and placement in ("other_port", "other_device"))
                        or ("job" not in shape and placement == "other_job")
                        or ("instance" not in shape and placement != "other_instance")
                    ):
                        continue
                    pair = f"case{number}-{name}-{severity}-{shape_number}-{placement}"
                    source_instance = f"{pair}:9883"
                    target_instance = source_instance if where == "src" else f"{pair}-other:9883"
                    # `pair` tells the pairs apart, also for an alert without an instance (one per job).
                    source_labels = alert_labels(*source_key, source_shape, source_instance, "mlx5_3", "1")
                    posted.append(source_labels | {"pair": pair})
                    target_labels = alert_labels(name, severity, shape, target_instance, device, port, job)
                    posted.append(target_labels | {"pair": pair})
                    expected[pair] = any(
                        listed(case, scope, name, severity) and placement in SCOPE_PLACEMENTS[scope]
                        for scope in SCOPES
                    )

    # The API computes each alert's inhibition when asked; notifying is not what this test checks, and
    # flushing some 2,600 groups every second starved the API on a busy 2-core machine.
    with alertmanager_alone(tmp_path, webhook, release, wait="1h") as (procs, url):
        for start in range(0, len(posted), 500):
            post_alerts(url, posted[start : start + 500])

        targets = {labels["pair"]: labels for labels in posted[1::2]}

        def inhibited() -> dict[str, bool]:
            """Whether each target alert is inhibited now, by its pair."""
            procs.check_alive()
            return {
                alert["labels"]["pair"]: bool(alert["status"]["inhibitedBy"])
                for alert in get_json(f"{url}/api/v2/alerts")
                if alert["labels"] == targets.get(alert["labels"]["pair"])
            }

        try:
            wait_for("the inhibitions to settle", lambda: inhibited() == expected)
        except pytest.fail.Exception:
            seen = inhibited()
            wrong = sorted(
                f"{pair}: expected {'inhibited' if want else 'not inhibited'}, got {seen.get(pair)}"
                for pair, want in expected.items()
                if seen.get(pair) != want
            )
            pytest.fail(f"{len(wrong)} of {len(expected)} targets are wrong:\n" + "\n".join(wrong[:40]))
