#!/usr/bin/env python3
"""What reading one RoCE netdev's `ethtool -S` through the ioctl costs a scrape, on this machine's kernel.

    python bench/ethtool_ioctl.py [--queues 128,384] [--reads 300] [--json ethtool-ioctl.json] [--exporter DIR]

bench.py's trees give the ethtool source captures (`--path.ethtool`), so its numbers never include the
ioctl, which is what a real node runs. This script makes a network namespace with one veth pair per entry
of --queues (veth has 7 stats per rx queue and 2 per tx queue: 384 queues give 3,457 stats, about an mlx5
netdev with 60 channels) and, inside it, times per netdev (median of --reads):

  cold   read_stats_ioctl and curation: a socket of its own, the names read twice and decoded, as every
         scrape read every netdev before a0a6aed
  kept   StatSetReader on a kept socket, curated from the kept names, as the ethtool source reads now

both with the daemon's malloc settings (its pinned mmap threshold makes each large buffer a fresh mapping),
and, if node_exporter is installed, its ethtool collector scraping the same netdevs (p50 over --reads
scrapes, and the series it exports), against the same node_exporter with no collector. `--exporter DIR`
measures another checkout's exporter/ directory (one without StatSetReader gives the cold column only).
Needs root (ip netns), iproute2 and ethtool. The namespace is deleted at the end.
"""

from __future__ import annotations

import argparse
import http.client
import importlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
DEFAULT_QUEUES: Final = "128,384"


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)


def median_ms(fn: Callable[[], object], reads: int) -> float:
    times = []
    for _ in range(reads):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape(port: int) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Accept": "text/plain"})
        return conn.getresponse().read()
    finally:
        conn.close()


def node_exporter_p50(binary: str, flags: Sequence[str], reads: int) -> tuple[float, int]:
    """p50 ms of node_exporter's scrape with `flags`, and its node_ethtool_* series."""
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--collector.disable-defaults", f"--web.listen-address=127.0.0.1:{port}", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                body = scrape(port)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"node_exporter {' '.join(flags)} did not answer") from None
                time.sleep(0.05)
        for _ in range(20):  # warm-up
            scrape(port)
        series = sum(1 for line in body.splitlines() if line.startswith(b"node_ethtool_"))
        return median_ms(lambda: scrape(port), reads), series
    finally:
        proc.terminate()
        proc.wait(10)


def measure_inside(
    exporter: str, netdevs: Sequence[str], reads: int, node_exporter: str | None
) -> list[dict[str, Any]]:
    """Runs in the namespace: one row per netdev."""
    sys.path.insert(0, exporter)
    # As the daemon runs: buffers of 128 KB or more (a name table of 4,096 stats and up) get mappings of
    # their own, faulted in for each read; without this glibc soon serves them from the heap, for free.
    daemon = importlib.import_module("rdma_exporter.daemon")
    for pin in ("fix_mmap_threshold", "use_one_malloc_arena"):
        getattr(daemon, pin, lambda: None)()
    ethtool = importlib.import_module("rdma_exporter.parse.ethtool")
    curate, cold_read = ethtool.curate_counted, ethtool.read_stats_ioctl
    rows = []
    sock = ethtool.SocketEthtool()
    for name in netdevs:
        stats = cold_read(name)
        row: dict[str, Any] = {
            "netdev": name,
            "stats": len(stats),
            "curated_series": len(curate(stats, ())[0]),
            "cold_ms": median_ms(lambda: curate(cold_read(name), ()), reads),  # noqa: B023
        }
        if hasattr(ethtool, "StatSetReader"):
            stat_reader = ethtool.StatSetReader()
            stat_reader.read(name, sock)
            if hasattr(stat_reader, "read_curated"):  # as the source reads: curated from the kept names
                row["kept_ms"] = median_ms(lambda: stat_reader.read_curated(name, (), sock), reads)  # noqa: B023
            else:
                row["kept_ms"] = median_ms(lambda: curate(stat_reader.read(name, sock), ()), reads)  # noqa: B023
        if node_exporter is not None:
            flags = ["--collector.ethtool", f"--collector.ethtool.device-include=^{name}$"]
            row["node_exporter_ms"], row["node_exporter_series"] = node_exporter_p50(node_exporter, flags, reads)
            row["node_exporter_empty_ms"], _ = node_exporter_p50(node_exporter, [], reads)
        rows.append(row)
    sock.close()
    return rows


def commit_of(directory: str) -> str | None:
    """The commit of the checkout `directory` is in, with "+" if its exporter/ has changes; None if unknown."""
    git = ["git", "-C", directory]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run([*git, "status", "--porcelain", "."], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# ethtool ioctl per netdev, median of {report['reads']} reads (commit {report['commit']}, kernel "
        f"{report['kernel']})",
        "",
        "| netdev | stats | curated series | cold ms | kept ms | cold/kept | node_exporter series "
        "| node_exporter p50 ms (no collector) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in report["netdevs"]:
        ne = (
            (str(row["node_exporter_series"]), f"{row['node_exporter_ms']:.2f} ({row['node_exporter_empty_ms']:.2f})")
            if "node_exporter_ms" in row
            else ("n/a", "n/a")
        )
        kept = (f"{row['kept_ms']:.3f}", f"{row['cold_ms'] / row['kept_ms']:.1f}") if "kept_ms" in row else ("n/a",) * 2
        lines.append(
            f"| {row['netdev']} | {row['stats']} | {row['curated_series']} | {row['cold_ms']:.3f} "
            f"| {kept[0]} | {kept[1]} | {ne[0]} | {ne[1]} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--queues", default=DEFAULT_QUEUES, help=f"rx and tx queues of each veth (default {DEFAULT_QUEUES})"
    )
    parser.add_argument("--reads", type=int, default=300, help="reads (and scrapes) timed per netdev (default 300)")
    parser.add_argument("--json", default="ethtool-ioctl.json", help="where to write the JSON report")
    parser.add_argument("--no-node-exporter", action="store_true", help="leave node_exporter out")
    parser.add_argument("--exporter", default=str(ROOT / "exporter"), help="the exporter/ directory to measure")
    parser.add_argument("--inside", help=argparse.SUPPRESS)  # netdevs, when run in the namespace
    args = parser.parse_args(argv)
    node_exporter = None
    if not args.no_node_exporter:
        node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if args.inside is not None:
        print(json.dumps(measure_inside(args.exporter, args.inside.split(","), args.reads, node_exporter)))
        return 0

    for tool in ("ip", "ethtool"):
        if shutil.which(tool) is None:
            print(f"bench: {tool} not found (Debian: iproute2, ethtool)", file=sys.stderr)
            return 2
    queues = [int(q) for q in args.queues.split(",")]
    namespace = f"rdma-bench-ethtool-{os.getpid()}"
    run("ip", "netns", "add", namespace)
    try:
        run("ip", "-n", namespace, "link", "set", "lo", "up")
        netdevs = []
        for i, count in enumerate(queues):
            name, peer = f"bq{i}a", f"bq{i}b"
            q = ("numrxqueues", str(count), "numtxqueues", str(count))
            run("ip", "-n", namespace, "link", "add", name, *q, "type", "veth", "peer", "name", peer, *q)
            netdevs.append(name)
        inside = run(
            "ip", "netns", "exec", namespace, sys.executable, __file__,
            "--inside", ",".join(netdevs), "--reads", str(args.reads), "--exporter", args.exporter,
            *(["--no-node-exporter"] if node_exporter is None else []),
        )  # fmt: skip
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
    report = {
        "kernel": os.uname().release,
        "reads": args.reads,
        "node_exporter": node_exporter,
        "exporter": args.exporter,
        "commit": commit_of(args.exporter),
        "netdevs": json.loads(inside.stdout),
    }
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
