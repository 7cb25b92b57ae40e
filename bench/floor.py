#!/usr/bin/env python3
"""The served floor of a flat pure-Python scrape, beside the daemon and node_exporter.

    python bench/floor.py [--devices sample] [--rounds 300] [--warmup 30]

How close to node_exporter can a Python exporter get on the same tree, with the same reads and the same
series? `flat` servers answer that (bench/PROFILE.md, Update 22). Each builds the real collector once
on the tree to learn every file a scrape reads (the fds the collector keeps open) and every series it
writes (headers and label texts from the exporter's own writer). Each scrape then only:

  1. hands the reads to a reader thread, as a daemon must so that a stuck read cannot hang the answer:
     one job for every device (`flat`), or one job a device as the engine does (`flat per device`);
  2. preads each fd and parses a plain decimal (anything else counts as 0), and takes the values of
     the ethtool captures with one regex each;
  3. writes every series with a value read in this scrape, taken by position (the files are not mapped to
     their series: on the sample tree that puts 317 values in exponent form where the exporter writes
     197, about 0.1 ms against the floor), in the exporter's value formatting;
  4. answers through the standard library's http.server.

None of the exporter's checks are made (errors, state and rate texts, PMA scaling and saturation,
curation by name), nor its pool's spill to more threads or abandoning of a stuck job: a floor, not an
alternative. Every round advances the tree's counters
(bench/traffic.py) and scrapes node_exporter, the daemon and both floors over a new connection each,
in rotating order, then times an empty request to the floor's server and the daemon's /healthz.
"""

from __future__ import annotations

import argparse
import http.server
import os
import re
import shutil
import socketserver
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "exporter"))
sys.path.insert(0, str(ROOT / "bench"))

from traffic import Traffic  # noqa: E402

import bench  # noqa: E402
from rdma_exporter.collect.base import _label_text, _layout, format_value  # noqa: E402
from rdma_exporter.collect.readers import DeviceReads, shared_reads  # noqa: E402
from rdma_exporter.config import Config  # noqa: E402
from rdma_exporter.daemon import build_collector  # noqa: E402

CAPTURE_VALUE: Final = re.compile(r": (\d+)$", re.MULTILINE)


class FlatScrape:
    """The files and series of one tree as the real collector reads and writes them, and a flat scrape
    of them. Reaches into the collector's internals on purpose (its kept files, its rows, the writer's
    header and label texts): the floor must read the files it reads and write the series it writes.
    """

    def __init__(self, sys_root: Path, ethtool_dir: Path | None) -> None:
        # Kept files of its own, not the process's: those would hold other trees' files in a test run.
        reads = DeviceReads(shared_reads().pool)
        collector = build_collector(replace(Config(), sysfs=sys_root, ethtool_dir=ethtool_dir), reads=reads)
        families = collector.gather()
        self.groups: list[list[int]] = []  # per device: its kept files, dup'ed
        for files in reads._files.values():
            self.groups.append([os.dup(fd) for kept in files._dirs.values() for fd in kept.fds.values()])
        self.captures = sorted(str(p) for p in ethtool_dir.iterdir()) if ethtool_dir is not None else []
        self.values = values = len(self.read(range(len(self.groups))))
        self.families: list[tuple[str, list[tuple[str, int]]]] = []
        at = 0
        for spec, label_rows, _ in families._rows.values():
            header, order = _layout(spec)
            rows = []
            for labels in label_rows:
                rows.append((spec.name + _label_text(order, labels), at % values))
                at += 1
            self.families.append((header, rows))
        self.series = at

    def read(self, groups: Sequence[int], captures: bool = True) -> list[int]:
        values: list[int] = []
        append = values.append
        pread = os.pread
        for group in groups:
            for fd in self.groups[group]:
                raw = pread(fd, 64, 0)
                append(int(raw) if raw[-1:] == b"\n" and raw[:-1].isdigit() else 0)
        if captures:
            for path in self.captures:
                with open(path, "rb") as file:
                    values += map(int, CAPTURE_VALUE.findall(file.read().decode()))
        return values

    def render(self, values: list[int]) -> bytes:
        chunks = []
        for header, rows in self.families:
            lines = [header]
            for prefix, at in rows:
                value = values[at]
                small = type(value) is int and 0 <= value < 1_000_000
                lines.append(f"{prefix}{value}.0\n" if small else f"{prefix}{format_value(value)}\n")
            chunks.append("".join(lines).encode())
        return b"".join(chunks)


# A read job, the list its values are put in, and the event set when it is done.
_Job = tuple[Callable[[], list[int]], list[list[int]], threading.Event]


class ReaderThread:
    """One daemon thread that runs read jobs in order; `run` waits for all of a scrape's jobs (at most
    `timeout` seconds: the values of the jobs done by then)."""

    def __init__(self) -> None:
        self._jobs: list[_Job] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                job, out, done = self._jobs.pop(0)
            out.append(job())
            done.set()

    def run(self, jobs: Sequence[Callable[[], list[int]]], timeout: float = 8.0) -> list[int]:
        waits: list[_Job] = [(job, [], threading.Event()) for job in jobs]
        with self._cond:
            self._jobs.extend(waits)
            self._cond.notify()
        # One wake-up a scrape, as the engine's: the jobs run in order, so the last one done is all of them.
        waits[-1][2].wait(timeout)
        return [value for _, out, done in waits if done.is_set() for value in out[0]]


def serve(sys_root: Path, ethtool_dir: Path | None, port: int, per_device: bool) -> None:
    flat = FlatScrape(sys_root, ethtool_dir)
    reader = ReaderThread()
    devices = range(len(flat.groups))
    if per_device:
        last = len(flat.groups) - 1
        jobs = [lambda g=g: flat.read((g,), captures=g == last) for g in devices]
    else:
        jobs = [lambda: flat.read(devices)]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = b"ok\n"
            if self.path == "/metrics":
                values = reader.run(jobs)
                body = flat.render(values) if len(values) == flat.values else b"reads timed out\n"
            self.send_response(200 if body != b"reads timed out\n" else 503)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True

    Server(("127.0.0.1", port), Handler).serve_forever()


def run(devices: str, rounds: int, warmup: int, node_exporter: str, timeout: float = 30.0) -> str:
    trees = bench.parse_trees(devices)
    if len(trees) != 1:
        raise SystemExit("--devices: one tree")
    workdir = Path(tempfile.mkdtemp(prefix="rdma-floor-"))
    try:
        dest = workdir / "tree"
        sys_root = bench.build_tree(dest, trees[0].spec)
        ethtool_dir = dest / "ethtool" if (dest / "ethtool").is_dir() else None
        traffic = Traffic(sys_root, ethtool_dir, bench.COUNTER_DIRS)
        env = bench.exporter_env()

        def floor_cmd(mode: str) -> Callable[[int], list[str]]:
            ethtool = str(ethtool_dir) if ethtool_dir else "-"
            return lambda port: [sys.executable, __file__, "--serve", str(sys_root), ethtool, str(port), mode]

        servers = [
            bench.Exporter("node_exporter", lambda port: bench.node_exporter_cmd(node_exporter, sys_root, port),
                           None, timeout),
            bench.Exporter("rdma_exporter", lambda port: bench.exporter_cmd(sys_root, ethtool_dir, port), env, timeout),
            bench.Exporter("flat", floor_cmd("one"), env, timeout),
            bench.Exporter("flat per device", floor_cmd("device"), env, timeout),
        ]  # fmt: skip
        for server in servers:
            server.start()
        probes = {"flat: empty request": (servers[2], "/empty"), "rdma_exporter: /healthz": (servers[1], "/healthz")}
        timed: dict[str, list[float]] = {name: [] for name in [*(s.name for s in servers), *probes]}
        for i in range(warmup + rounds):
            traffic.advance()
            for server in servers[i % 4 :] + servers[: i % 4]:  # each one first in turn
                seconds = server.scrape()
                if i >= warmup:
                    timed[server.name].append(seconds)
            for name, (server, path) in probes.items():
                started = time.perf_counter()
                status, _ = bench.http_get(server.port, timeout, path)
                if status != 200:
                    raise RuntimeError(f"{name}: HTTP {status}")
                if i >= warmup:
                    timed[name].append(time.perf_counter() - started)
        fabric = {server.name: bench.count_series(server.last_body)[1] for server in servers}
    finally:
        bench.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    node_p50 = bench.summarise(timed["node_exporter"])["p50"]
    lines = [
        f"# Flat scrape floor: {trees[0].name} tree, {rounds} timed rounds after {warmup}, counters moving\n",
        "| server | fabric series | p50 ms | p90 ms | p50 / node_exporter |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, latencies in timed.items():
        summary = bench.summarise(latencies)
        ratio = f"×{summary['p50'] / node_p50:.2f}" if name in fabric else ""
        lines.append(f"| {name} | {fabric.get(name, '')} | {summary['p50']:.2f} | {summary['p90']:.2f} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:  # a floor server, started by run()
        sys_root, ethtool, port, mode = argv[1:]
        serve(Path(sys_root), None if ethtool == "-" else Path(ethtool), int(port), mode == "device")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", default="sample", help="'sample' or a number of RDMA devices (default sample)")
    parser.add_argument("--rounds", type=int, default=300, help="timed rounds (default 300)")
    parser.add_argument("--warmup", type=int, default=30, help="rounds before the timed ones (default 30)")
    parser.add_argument("--node-exporter", default=None, help="node_exporter binary (default: found on PATH)")
    args = parser.parse_args(argv)
    node_exporter = args.node_exporter or shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if node_exporter is None:
        parser.error("no node_exporter on PATH: give --node-exporter")
    sys.stdout.write(run(args.devices, args.rounds, args.warmup, node_exporter))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
