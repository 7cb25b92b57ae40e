#!/usr/bin/env python3
"""Availability under attack: does a remembered Prometheus still get its scrapes while others flood the port?

    python bench/attack.py [--devices sample|N] [--seconds 60] [--flood 200] [--slow 40] [--netns] [--json OUT]

Starts the exporter on a generated tree with basic auth (one user, bcrypt cost 12), logs "Prometheus"
in once, then runs three kinds of clients together for --seconds:

- Prometheus: one scrape a second with a 10 s timeout and the remembered credentials;
- the flood: --flood threads sending wrong passwords, each on a new connection, as fast as answers come
  (with --no-auth: plain metrics requests);
- slow readers: --slow connections that ask for the metrics with the right credentials, with a 4 KB
  receive window, and never read; replaced as the server closes them.

On loopback the kernel's send buffer takes a whole answer, so a client that does not read costs the
server nothing. With --netns (root and iproute2) the slow readers connect from a network namespace over
a veth pair the script creates and removes, where a non-reading client's window stops the server's
writes as it would across the fabric.

It reports the Prometheus scrapes answered 200, their p50 and max latency, the flood's answers by
status and the exporter's RSS at the end: Markdown on stdout, JSON with --json. --exporter DIR runs
another checkout's exporter/ (e.g. `git worktree add /tmp/old COMMIT`, then `--exporter /tmp/old/exporter`)
to compare the same attack before and after a change.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Final

import bcrypt

from bench import ROOT, free_port, percentile, rss_bytes, spawn, stop_all
from rdma_exporter.httpserver import WRITE_TIMEOUT
from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree, spec_for_devices

SCRAPE_TIMEOUT: Final = 10.0
BCRYPT_COST: Final = 12  # what docs/operations.md recommends
PASSWORD: Final = "s3cret"
# The veth pair of --netns: a /30 of the private range, on interfaces named after this process.
NETNS_SERVER, NETNS_CLIENT = "10.213.0.1", "10.213.0.2"
TCP_CLOSE, TCP_CLOSE_WAIT = 7, 8  # tcpi_state values (include/net/tcp_states.h): reset, or closed by the server
GIVEN_UP_AFTER: Final = WRITE_TIMEOUT + 5.0  # a slow reader is replaced after the server's write timeout


def log(message: str) -> None:
    print(f"attack: {message}", file=sys.stderr, flush=True)


def basic(password: str) -> str:
    return "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()


def scrape(host: str, port: int, authorization: str | None) -> tuple[str, float]:
    """One scrape as Prometheus makes it: (status or error name, seconds)."""
    conn = http.client.HTTPConnection(host, port, timeout=SCRAPE_TIMEOUT)
    started = time.monotonic()
    try:
        conn.request("GET", "/metrics", headers={"Authorization": authorization} if authorization else {})
        response = conn.getresponse()
        response.read()
        return str(response.status), time.monotonic() - started
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__, time.monotonic() - started
    finally:
        conn.close()


def hold_slow_readers(host: str, port: int, count: int, seconds: float, authorization: str | None) -> None:
    """Keep `count` connections that asked for the metrics and never read, for `seconds`."""
    header = f"Authorization: {authorization}\r\n" if authorization else ""
    request = f"GET /metrics HTTP/1.1\r\nHost: x\r\n{header}\r\n".encode()
    held: dict[socket.socket, float] = {}  # -> when it connected (monotonic)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        # A server that gives up on a reader with most of the answer unsent has its FIN queued behind that
        # data, which a zero window never lets through: no TCP state shows that close, so age does.
        now = time.monotonic()
        for sock in [s for s, since in held.items() if _closed_by_server(s) or now - since > GIVEN_UP_AFTER]:
            del held[sock]
            sock.close()
        while len(held) < count:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            try:
                sock.connect((host, port))
                sock.sendall(request)
            except OSError:
                sock.close()
                break
            held[sock] = time.monotonic()
        time.sleep(0.5)
    for sock in held:
        sock.close()


def _closed_by_server(sock: socket.socket) -> bool:
    # From the TCP state, not a read: the unread start of the answer sits before the end of the stream.
    # This finds a close after an answer the client got whole (idle or head timeout), not one mid-answer.
    state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    return state in (TCP_CLOSE, TCP_CLOSE_WAIT)


class Flood:
    """Threads sending one request per new connection, counting the answers by status."""

    def __init__(self, host: str, port: int, threads: int, authorization: str | None) -> None:
        header = f"Authorization: {authorization}\r\n" if authorization else ""
        self.request = f"GET /metrics HTTP/1.1\r\nHost: x\r\n{header}Connection: close\r\n\r\n".encode()
        self.address = (host, port)
        self.answers: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(SCRAPE_TIMEOUT + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with socket.create_connection(self.address, timeout=SCRAPE_TIMEOUT) as sock:
                    sock.sendall(self.request)
                    first = sock.recv(64).split(maxsplit=2)
                    answer = first[1].decode() if len(first) > 1 else "closed"
            except OSError as exc:
                answer = type(exc).__name__
            with self._lock:
                self.answers[answer] += 1


class Netns:
    """A network namespace joined to this one by a veth pair, removed on exit."""

    def __init__(self) -> None:
        self.name = f"rdma-attack-{os.getpid()}"
        self.veth = f"ratk{os.getpid() % 100000}"
        ip = shutil.which("ip")
        if ip is None or os.geteuid() != 0:
            raise SystemExit("--netns needs root and iproute2 (ip)")
        run = [
            ["netns", "add", self.name],
            ["link", "add", self.veth, "type", "veth", "peer", "name", f"{self.veth}p"],
            ["link", "set", f"{self.veth}p", "netns", self.name],
            ["addr", "add", f"{NETNS_SERVER}/30", "dev", self.veth],
            ["link", "set", self.veth, "up"],
            ["-n", self.name, "addr", "add", f"{NETNS_CLIENT}/30", "dev", f"{self.veth}p"],
            ["-n", self.name, "link", "set", f"{self.veth}p", "up"],
        ]
        atexit.register(self.remove)
        for args in run:
            subprocess.run([ip, *args], check=True, capture_output=True, timeout=20)

    def remove(self) -> None:
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True, timeout=20)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=20)


def wait_listening(host: str, port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the exporter exited with {proc.returncode}")
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the exporter is not listening on {host}:{port} after {timeout:.0f} s")


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    spec = SAMPLE_SPEC if args.devices == "sample" else spec_for_devices(int(args.devices))
    sysfs = build_tree(workdir / "tree", spec)
    netns = Netns() if args.netns else None
    host = NETNS_SERVER if netns else "127.0.0.1"
    port = free_port()
    command = [sys.executable, "-m", "rdma_exporter", "--path.sysfs", str(sysfs)]
    command += ["--web.listen-address", f"{host}:{port}"]
    good = None
    if not args.no_auth:
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=BCRYPT_COST)).decode()
        web = workdir / "web.yml"
        web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
        command += ["--web.config.file", str(web)]
        good = basic(PASSWORD)
    env = {**os.environ, "PYTHONPATH": str(Path(args.exporter).resolve())}
    exporter = spawn(command, env=env)
    wait_listening(host, port, exporter)
    status, _ = scrape(host, port, good)  # the login Prometheus makes once, then is remembered
    if status != "200":
        raise SystemExit(f"the first scrape answered {status}")

    flood = Flood(host, port, args.flood, basic("guess") if good else None)
    hold = args.seconds + 10
    if netns:
        slow = spawn(["ip", "netns", "exec", netns.name, sys.executable, __file__, "--hold-slow-readers",
                      f"{host},{port},{args.slow},{hold},{good or ''}"], env=env)
    else:
        threading.Thread(target=hold_slow_readers, args=(host, port, args.slow, hold, good), daemon=True).start()
    flood.start()
    time.sleep(min(5.0, args.seconds / 4))  # let both kinds of attackers reach the server first
    results = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        started = time.monotonic()
        results.append(scrape(host, port, good))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    rss = rss_bytes(exporter.pid)
    flood.stop()
    if netns:
        slow.kill()
    answered = [seconds * 1000 for status, seconds in results if status == "200"]
    return {
        "exporter": str(Path(args.exporter).resolve()),
        "devices": args.devices,
        "auth": not args.no_auth,
        "netns": args.netns,
        "flood_threads": args.flood,
        "slow_readers": args.slow,
        "seconds": args.seconds,
        "scrapes": len(results),
        "scrapes_ok": len(answered),
        "scrape_failures": dict(Counter(status for status, _ in results if status != "200")),
        "p50_ms": statistics.median(answered) if answered else None,
        "p90_ms": percentile(answered, 0.9) if answered else None,
        "max_ms": max(answered) if answered else None,
        "flood_answers": dict(flood.answers),
        "rss_mb": rss / 2**20,
    }


def markdown(report: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1f}"

    attack = (
        f"{report['flood_threads']} flood threads ({'wrong passwords' if report['auth'] else 'plain requests'}), "
        f"{report['slow_readers']} slow readers{' from a network namespace' if report['netns'] else ' on loopback'}"
    )
    return "\n".join([
        f"# rdma-exporter under attack: {report['devices']} tree, {report['seconds']:.0f} s",
        "",
        f"Exporter from {report['exporter']}; {attack}.",
        "",
        "| Prometheus scrapes answered 200 | failed | p50 ms | p90 ms | max ms | flood answers | RSS MB |",
        "| ---: | --- | ---: | ---: | ---: | --- | ---: |",
        f"| {report['scrapes_ok']} of {report['scrapes']} | {report['scrape_failures'] or 'none'} | "
        f"{ms(report['p50_ms'])} | {ms(report['p90_ms'])} | {ms(report['max_ms'])} | "
        f"{report['flood_answers'] or 'none'} | {report['rss_mb']:.1f} |",
        "",
    ])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--devices", default="sample", help="'sample' or a device count (default sample)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long Prometheus scrapes under attack")
    parser.add_argument("--flood", type=int, default=200, help="threads sending wrong passwords (default 200)")
    parser.add_argument("--slow", type=int, default=40, help="connections that never read (default 40)")
    parser.add_argument("--no-auth", action="store_true", help="no basic auth: the flood sends plain requests")
    parser.add_argument("--netns", action="store_true", help="slow readers from a network namespace (root)")
    parser.add_argument("--exporter", default=str(ROOT / "exporter"), help="the exporter/ directory to run")
    parser.add_argument("--json", help="where to write the JSON report")
    parser.add_argument("--hold-slow-readers", help=argparse.SUPPRESS)  # the child run inside the namespace
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.hold_slow_readers:
        host, port, count, seconds, authorization = args.hold_slow_readers.split(",", 4)
        hold_slow_readers(host, int(port), int(count), float(seconds), authorization or None)
        return 0
    atexit.register(stop_all)
    with tempfile.TemporaryDirectory(prefix="rdma-attack-") as tmp:
        try:
            report = run(args, Path(tmp))
        finally:
            stop_all()
    print(markdown(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
