"""Load on the running daemon, loopback only and bounded in time: many concurrent scrapers plus a few
hundred idle connections. No scrape fails, latency stays bounded, threads and memory do not grow."""

from __future__ import annotations

import http.client
import socket
import statistics
import threading
import time
from pathlib import Path

from test_daemon_http import RunningDaemon

from rdma_exporter.sample_tree import build_tree, spec_for_devices

SCRAPERS = 24
IDLE_CONNECTIONS = 300
DURATION = 12.0  # seconds of load after the warm-up
WARMUP = 3.0


def proc_status(pid: int) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "Threads"):
            values[key] = int(rest.split()[0])
    return values


class Scraper(threading.Thread):
    """A Prometheus-like client: keep-alive, gzip, the timeout header; every fifth one reconnects each time."""

    def __init__(self, port: int, until: float, reconnect: bool) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.until = until
        self.reconnect = reconnect
        self.latencies: list[float] = []
        self.failures: list[str] = []

    def run(self) -> None:
        headers = {"Accept-Encoding": "gzip", "X-Prometheus-Scrape-Timeout-Seconds": "10"}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        while time.monotonic() < self.until:
            started = time.monotonic()
            try:
                conn.request("GET", "/metrics", headers=headers)
                response = conn.getresponse()
                body = response.read()
                if response.status != 200 or len(body) < 1000:
                    self.failures.append(f"status {response.status}, {len(body)} bytes")
            except (OSError, http.client.HTTPException) as exc:
                self.failures.append(repr(exc))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
                continue
            self.latencies.append(time.monotonic() - started)
            if self.reconnect:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        conn.close()


def test_concurrent_scrapers_and_idle_connections(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "load", spec_for_devices(16))
    daemon = RunningDaemon(tmp_path, ["--path.sysfs", str(tree)])
    try:
        run_load(daemon)
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait()


def run_load(daemon: RunningDaemon) -> None:
    idle = [socket.create_connection(("127.0.0.1", daemon.port), timeout=5) for _ in range(IDLE_CONNECTIONS)]
    try:
        until = time.monotonic() + WARMUP + DURATION
        scrapers = [Scraper(daemon.port, until, reconnect=i % 5 == 0) for i in range(SCRAPERS)]
        for scraper in scrapers:
            scraper.start()
        time.sleep(WARMUP)
        warm = proc_status(daemon.proc.pid)
        peak_threads = warm["Threads"]
        while time.monotonic() < until:
            time.sleep(0.5)
            peak_threads = max(peak_threads, proc_status(daemon.proc.pid)["Threads"])
        for scraper in scrapers:
            scraper.join(30)
        end = proc_status(daemon.proc.pid)
    finally:
        for sock in idle:
            sock.close()

    failures = [failure for scraper in scrapers for failure in scraper.failures]
    latencies = sorted(latency for scraper in scrapers for latency in scraper.latencies)
    assert not failures, failures[:5]
    assert len(latencies) > SCRAPERS * 10, f"only {len(latencies)} scrapes in {DURATION + WARMUP} s"
    p99 = latencies[int(len(latencies) * 0.99)]
    print(
        f"{len(latencies)} scrapes, median {statistics.median(latencies) * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms; RSS {warm['VmRSS']} -> {end['VmRSS']} kB; "
        f"threads peak {peak_threads}"
    )
    assert p99 < 3.0 and latencies[-1] < 8.0
    # Main, uevent-less loop, 16 HTTP workers and at most 8 readers: nothing per connection or request.
    assert peak_threads <= 30, peak_threads
    assert end["VmRSS"] - warm["VmRSS"] < 20 * 1024, f"RSS grew from {warm['VmRSS']} to {end['VmRSS']} kB"
    # Still healthy and serving after the load.
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    conn.close()
    assert daemon.stop() == 0
