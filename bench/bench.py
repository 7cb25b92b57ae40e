#!/usr/bin/env python3
"""Side-by-side benchmark of rdma-exporter and node_exporter 1.5 on the same generated sysfs trees.

    python bench/bench.py [--scrapes N] [--devices sample,1,8,32,128] [--json OUT] [--quick]

For every tree (`sample` is the 8-HCA + 2 RoCE sample node, a number N is `spec_for_devices(N)`,
i.e. SR-IOV VFs beyond 8 devices) the script builds the tree once, starts both exporters on free
loopback ports, warms them up and measures, scraping them alternately so both see the same machine:

- scrape latency p50/p90/p99 over --scrapes HTTP scrapes (a new connection per scrape, no gzip);
- series exported (all, and "fabric" series without the exporters' own go_/process_/self metrics);
- CPU time per scrape (utime+stime deltas of /proc/PID/stat) and resident memory (VmRSS);
- files read per scrape: strace attached to the running exporter across a few steady-state
  scrapes; a file read is an open, or a pread of a file kept open from an earlier open (rdma-exporter
  keeps per-scrape sysfs files open); each file read is classed as counter, state, static, directory
  or other (see `classify`), a failed one is counted apart, and each call goes to the scrape whose
  time window it falls in, for the most reads of one counter file in any one scrape; the same trace
  counts the metadata calls (stat, readlink, getdents64) on paths under the tree;
- the static refresh: the traced steady scrapes fall between two of rdma-exporter's periodic re-reads
  of every device's static info (every 300 s on these trees, which put it in rescan mode; every 900 s
  and on a uevent in udev mode, on a node), so the files such a scrape reads are counted on the cold
  scrape of a second instance started under strace, which reads the same ones;
- on the largest tree, VmRSS at the 500th and the 1000th scrape (--memory-scrapes, 0 for none), each
  the median of 5 readings taken every 10 scrapes up to it, the bench waiting 0.2 s before each;
  growth between the two is the least-squares slope of every reading in between (51 of them by
  default), with its standard error, and, for the target, the same with one allocator step in the
  readings taken out (`rss_growth_one_step`). The readings start after the timed and traced scrapes.

It prints a Markdown report to stdout (progress goes to stderr) and writes the same numbers as JSON
(--json, default bench-results.json). Every child process is bounded by timeouts and killed on exit.
The exporter under test is the working tree's (exporter/ is put first on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import atexit
import bisect
import contextlib
import gzip
import http.client
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NamedTuple

ROOT: Final = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "exporter"))
sys.path.insert(0, str(ROOT / "bench"))  # also when the tests load this file by its path

from traffic import Traffic  # noqa: E402

from rdma_exporter.collect.inventory import (  # noqa: E402
    RESCAN_STATIC_MAX_AGE,
    STATIC_RETRY_SECONDS,
    UDEV_RESYNC_SECONDS,
)
from rdma_exporter.parse.reader import is_sysfs_mount  # noqa: E402
from rdma_exporter.sample_tree import SAMPLE_SPEC, TreeSpec, build_tree, spec_for_devices  # noqa: E402

# 2: per-fabric-series latency, failed reads apart, the most reads of a counter file in one scrape.
# 3: adds, and renames nothing: files_per_scrape.metadata_calls and seconds_after_cold_scrape, our
#    exporter's static_refresh (the cold scrape traced), memory.growth_check (one allocator step allowed),
#    settings.growth_tolerance_mb and memory_limit_mb. Every field of 2 means what it meant.
SCHEMA_VERSION: Final = 3
# RSS at a memory checkpoint is the median of this many readings, one every RSS_SAMPLE_EVERY scrapes up
# to it, each after a pause: single readings taken right after an answer scattered by about ±0.5 MB.
# Readings continue every RSS_SAMPLE_EVERY scrapes between the checkpoints: growth is fitted over all of
# them, because two medians of a bimodal reading could differ by a whole mode with nothing growing.
COLD_TRACE_DEADLINE_SECONDS: Final = 120  # the traced cold scrape's deadline, see static_refresh
RSS_SAMPLES: Final = 5
RSS_SAMPLE_EVERY: Final = 10
RSS_SETTLE_SECONDS: Final = 0.2
# The growth target (see `growth_check`): fitted growth plus two standard errors, over the span between the
# two checkpoints, at most this. 0.04 MB over 500 scrapes is 84 bytes a scrape: a steady leak of 100 bytes
# a scrape (0.048 MB) fails even with no noise at all. Simulated on 51 readings: a flat run passes always at
# the recorded run's noise (sd 0.012 MB), 97 times in 100 at sd 0.022 (PROFILE.md, Update 4); with one step of
# 0.1 to 0.3 MB, 96 to 98 and 63 to 72 times in 100; a leak of 100 bytes a scrape at most 1 in 100. A run
# that fails on noise has not shown growth, only not excluded it: a longer one (--memory-scrapes 4000) tells.
GROWTH_TOLERANCE_MB: Final = 0.04
MEMORY_LIMIT_MB: Final = 40.0
# A step in the readings is taken for a one-off allocator step (PROFILE.md, Updates 9 and 17: 0.1 to 0.4 MB
# once, as glibc's heap or a pymalloc arena touches more pages) only when it stands this many standard
# errors clear of zero. On readings of pure noise the best place for a step (of 50) holds one under 4 standard
# errors in 99 runs of 100, under 5 in 2,000 of 2,000 (simulated, 51 readings).
STEP_T_MIN: Final = 6.0
STEP_MIN_MB: Final = 2**-10  # and is at least VmRSS's unit, 1 kB: less is rounding, not a step
OURS: Final = "rdma_exporter"
NODE: Final = "node_exporter"
DEFAULT_DEVICES: Final = "sample,1,8,32,128"

# Series that describe the exporter itself rather than the fabric; left out of the "fabric" count so
# that node_exporter's Go runtime metrics do not inflate its side of the comparison.
SELF_PREFIXES: Final = ("go_", "process_", "promhttp_", "node_exporter_", "node_scrape_", "rdma_exporter_", "python_")

# File classes. A counter file holds an event count that moves between scrapes (on mlx5 each read of
# counters/ or hw_counters/ is a firmware query). A state file is a small attribute that legitimately
# changes while the device runs (link state, trained rate, SM-assigned LID, PCIe retraining), so it is
# read every scrape. Everything else under sysfs (GUIDs, firmware, board id, link layer, PCI identity,
# GID tables, netdev names...) is static and should be read once, not per scrape. MTU and the RoCE ECN
# enables (ecn/roce_np|roce_rp/enable/<prio>) are runtime configuration that `ip link set mtu` or a
# write to the file changes without any uevent, so an exporter must re-read them: they count as state.
COUNTER_DIRS: Final = frozenset({"counters", "counters_ext", "hw_counters", "statistics"})
COUNTER_FILES: Final = frozenset(
    {
        "aer_dev_correctable",
        "aer_dev_fatal",
        "aer_dev_nonfatal",
        "aer_rootport_total_err_cor",
        "aer_rootport_total_err_fatal",
        "aer_rootport_total_err_nonfatal",
        "carrier_changes",
        "carrier_up_count",
        "carrier_down_count",
    }
)
STATE_FILES: Final = frozenset(
    {
        "state",
        "phys_state",
        "rate",
        "lid",
        "sm_lid",
        "sm_sl",
        "lid_mask_count",
        "operstate",
        "flags",
        "carrier",
        "speed",
        "duplex",
        "current_link_speed",
        "current_link_width",
        "mtu",
    }
)
# A sensor reading of a hwmon device (hwmon<N>/temp<N>_input; its label and threshold are static).
HWMON_READING: Final = re.compile(r"temp[0-9]+_input")
# A bond's bonding/slaves and bonding/mode: enslaving and releasing send no uevent. (An IPoIB netdev's
# own `mode` file is static.)
BOND_STATE_FILES: Final = frozenset({"slaves", "mode"})
CLASSES: Final = ("counter", "state", "static", "directory", "other")

CHILDREN: list[subprocess.Popen[bytes]] = []


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# --- processes ---------------------------------------------------------------------------------------


def spawn(cmd: Sequence[str], *, env: dict[str, str] | None = None, stderr: Any = None) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr or subprocess.DEVNULL, env=env
    )
    CHILDREN.append(proc)
    return proc


def child_pids(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            children.append(int(entry))
    return children


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 10) -> None:
    """Stop a child and its own children: killing `strace -- cmd` alone would leave cmd running. Killed
    if it has not exited `timeout` seconds after the signal."""
    if proc.poll() is None:
        children = child_pids(proc.pid)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait(timeout=10)
    if proc in CHILDREN:
        CHILDREN.remove(proc)


def stop_all(timeout: float = 10) -> None:
    for proc in list(CHILDREN):
        stop(proc, timeout=timeout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (every thread, live or exited)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


# Request headers: the plain text format, or what a Prometheus 2.x server sends: OpenMetrics first
# (node_exporter 1.5 answers in text all the same, prometheus_client does not) and gzip.
ACCEPT: Final = {
    "text": {"Accept": "text/plain;version=0.0.4"},
    "prometheus": {
        "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        "Accept-Encoding": "gzip",
    },
}
request_headers = ACCEPT["text"]


def http_get(port: int, timeout: float, path: str = "/metrics") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=request_headers)
        response = conn.getresponse()
        body = response.read()
        if response.getheader("Content-Encoding", "") == "gzip":
            body = gzip.decompress(body)  # the client's share of the cost, paid for both exporters alike
        return response.status, body
    finally:
        conn.close()


def first_rss_reading(memory_scrapes: int) -> int:
    """The scrape of the first RSS reading: the first of RSS_SAMPLES before the run's half-way checkpoint."""
    return memory_scrapes // 2 - (RSS_SAMPLES - 1) * RSS_SAMPLE_EVERY


def scrapes_before_memory_run(args: argparse.Namespace) -> int:
    """The most scrapes an exporter serves before its memory run: the cold one, warm-up, timed and traced."""
    return 1 + args.warmup + args.scrapes + (args.strace_scrapes if args.strace else 0)


@dataclass
class Exporter:
    """One running exporter and everything measured on it."""

    name: str
    cmd_for_port: Any  # Callable[[int], list[str]]
    env: dict[str, str] | None
    timeout: float
    memory_checkpoints: tuple[int, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    scrapes: int = 0
    cold_ms: float | None = None
    cold_window: tuple[float, float] | None = None  # wall-clock (start, end) of the cold scrape, as strace -ttt
    rss_readings: list[tuple[int, int]] = field(default_factory=list)  # (scrapes served, VmRSS bytes)
    last_body: bytes = b""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, wrap: Sequence[str] = ()) -> None:
        for _ in range(3):  # a free port can be taken between probing and binding; retry on a new one
            self.port = free_port()
            self.proc = spawn([*wrap, *self.cmd_for_port(self.port)], env=self.env, stderr=subprocess.PIPE)
            if self._wait_ready():
                return
            err = self._stderr_tail()
            stop(self.proc)
            log(f"{self.name} did not come up on port {self.port}: {err}")
        raise RuntimeError(f"{self.name} failed to start: {' '.join(self.cmd_for_port(self.port))}")

    def _stderr_tail(self) -> str:
        assert self.proc is not None and self.proc.stderr is not None
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read().decode(errors="replace")[-500:]

    def _wait_ready(self) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            started, wall_started = time.perf_counter(), time.time()
            try:
                status, _ = http_get(self.port, self.timeout)
            except OSError:
                time.sleep(0.05)
                continue
            if status == 200:
                # The first scrape is the cold one: it also reads the static inventory.
                self.cold_ms = (time.perf_counter() - started) * 1000
                self.cold_window = (wall_started, time.time())
                self.scrapes += 1
                # stderr is only needed for start-up failures; drain it off so a chatty log cannot block.
                assert self.proc.stderr is not None
                self.proc.stderr.close()
                self.proc.stderr = None
                return True
            time.sleep(0.05)
        return False

    def scrape(self) -> float:
        """One scrape; returns its latency in seconds."""
        started = time.perf_counter()
        status, body = http_get(self.port, self.timeout)
        elapsed = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"{self.name} answered HTTP {status}")
        self.last_body = body
        self.scrapes += 1
        if self._reads_rss():
            # Let the exporter finish its work after the answer (freeing, malloc_trim) before reading.
            time.sleep(RSS_SETTLE_SECONDS)
            self.rss_readings.append((self.scrapes, rss_bytes(self.pid)))
        return elapsed

    def _reads_rss(self) -> bool:
        if not self.memory_checkpoints:
            return False
        mid, end = self.memory_checkpoints
        # Counted back from each checkpoint, so that each one's window holds RSS_SAMPLES readings also
        # where the two are not a multiple of RSS_SAMPLE_EVERY apart (a --quick run's 56 and 112).
        checkpoint = mid if self.scrapes <= mid else end
        on_schedule = (checkpoint - self.scrapes) % RSS_SAMPLE_EVERY == 0
        return first_rss_reading(end) <= self.scrapes <= end and on_schedule

    def rss_at(self, checkpoint: int) -> int | None:
        """Median of the readings in the RSS_SAMPLES * RSS_SAMPLE_EVERY scrapes up to `checkpoint`."""
        near = [rss for n, rss in self.rss_readings if checkpoint - RSS_SAMPLES * RSS_SAMPLE_EVERY < n <= checkpoint]
        return int(statistics.median(near)) if near else None

    def close(self) -> None:
        if self.proc is not None:
            stop(self.proc)


# --- measurements ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    low = int(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def count_series(body: bytes) -> tuple[int, int]:
    """(all samples, fabric samples) of a text exposition."""
    total = fabric = 0
    for line in body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        total += 1
        if not line.startswith(SELF_PREFIXES):
            fabric += 1
    return total, fabric


def classify(path: str, sys_root: str, ethtool_dir: str | None) -> str:
    """Class of one opened path (see COUNTER_DIRS/STATE_FILES above)."""
    if ethtool_dir and (path == ethtool_dir or path.startswith(ethtool_dir + "/")):
        return "directory" if path == ethtool_dir else "counter"  # an `ethtool -S` capture stands for the ioctl
    if not (path == sys_root or path.startswith(sys_root + "/")):
        return "other"  # the exporter's own /proc/self, Python imports...
    parts = Path(path).relative_to(sys_root).parts
    name = parts[-1] if parts else ""
    # ecn/roce_*/enable is listed every scrape (the priorities are the state files); IPoIB netdevs lack it.
    ecn_enable_dir = name == "enable" and len(parts) >= 3 and parts[-3] == "ecn"
    if os.path.isdir(path) or name in COUNTER_DIRS or ecn_enable_dir:
        return "directory"
    if name == "lifespan" and len(parts) >= 2 and parts[-2] == "hw_counters":
        return "state"  # how long the driver caches hw_counters: a setting a write changes, not a count
    if any(part in COUNTER_DIRS for part in parts[:-1]) or name in COUNTER_FILES:
        return "counter"
    if name in BOND_STATE_FILES and len(parts) >= 2 and parts[-2] == "bonding":
        return "state"
    if HWMON_READING.fullmatch(name) and len(parts) >= 3 and parts[-3] == "hwmon":
        return "state"
    if name in STATE_FILES or (len(parts) >= 3 and parts[-2] == "enable" and "ecn" in parts[:-3]):
        return "state"
    return "static"


# openat's directory fd is AT_FDCWD or a number, and -y prints its path in <...>, which may hold a comma.
_OPEN_CALL: Final = re.compile(
    r"^(\d+)\s+(\d+\.\d+)\s+(?:openat|open)\("
    r'(?:(?:AT_FDCWD|-?\d+)(?:<([^>]*)>)?,\s*)?"((?:[^"\\]|\\.)*)"'
)
_RESUMED: Final = re.compile(r"^(\d+)\s+\d+\.\d+\s+<\.\.\. (openat|open|pread64) resumed>")
# A call's return value ends its line: `= 9</sys/...>` (an fd, -y adds its path), `= 2`, or
# `= -1 EIO (Input/output error)` for a failure. Anchored at the end: a pread's buffer may hold `=12`.
_RETURN: Final = re.compile(r"=\s+(-?\d+)(?:<[^>]*>)?(?:\s+E[A-Z0-9]+\s+\([^)]*\))?\s*$")
# With -y strace prints each fd argument with its path: pread64(7</sys/.../symbol_error>, ...
_PREAD_CALL: Final = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+pread64\(\d+<([^>]*)>")
_PREAD_OFFSET: Final = re.compile(r", \d+, (\d+)\)\s+=")


# strace prints a path as C text: `\"`, `\\`, `\n` and the like, every other byte it does not print as
# an octal escape (`\303\251` for "é"), and inside -y's <...> also `>` (`\76`).
_STRACE_ESCAPE: Final = re.compile(rb"\\(?:([0-7]{1,3})|(.))", re.DOTALL)
_STRACE_NAMED: Final = {b"n": b"\n", b"t": b"\t", b"r": b"\r", b"v": b"\v", b"f": b"\f", b"a": b"\a", b"b": b"\b"}


def _strace_path(text: str) -> str:
    """A path as strace printed it, as the file system's bytes decoded like `os.fsdecode` does."""
    if "\\" not in text:
        return text

    def byte(escape: re.Match[bytes]) -> bytes:
        octal, char = escape.groups()
        return bytes([int(octal, 8)]) if octal else _STRACE_NAMED.get(char, char)

    return os.fsdecode(_STRACE_ESCAPE.sub(byte, os.fsencode(text)))


def _from_start(line: str) -> bool:
    """Whether a pread line (or its resumed line) reads at offset 0, or says no offset: the read of a
    file. Another offset is the rest of a long file, part of the read at offset 0."""
    offset = _PREAD_OFFSET.search(line)
    return offset is None or offset.group(1) == "0"


# `= ? ERESTARTSYS (...)`: interrupted by a signal (Go's runtime sends SIGURG all the time) and restarted,
# which strace traces as a call of its own; `= ? <unavailable>`: the thread exited in the call.
# Anchored at the end, as _RETURN: a pread's buffer may hold "= ?".
_NO_RESULT: Final = re.compile(r"=\s+\?(?:\s+(?:E[A-Z_]+\s+\([^)]*\)|<unavailable>))?\s*$")


def _returned(line: str) -> int | None:
    """The call's return value; None if it has none (restarted, see above); 0 (success) for a line that
    does not end in one."""
    if _NO_RESULT.search(line):
        return None
    result = _RETURN.search(line)
    return int(result.group(1)) if result else 0


class FileRead(NamedTuple):
    """One read of a file in a traced scrape (see `parse_strace`)."""

    path: str
    ok: bool
    kept: bool  # a pread of a file kept open, rather than an open
    scrape: int | None  # index of the scrape it fell in; None: after the last one


def parse_strace(text: str, windows: Sequence[tuple[float, float]]) -> list[FileRead]:
    """Every file read from the first scrape on, with the scrape (`windows`: wall-clock seconds, in order)
    it belongs to. What comes before the first scrape is left out: start-up and warm-up, when strace
    launched the exporter.

    A file read is an open(at) call, or a pread64 at offset 0: the re-read of a file kept open (`kept`).
    Neither exporter reads a file it has just opened with pread (rdma-exporter's first read of a file it
    keeps is a read(), node_exporter only uses read()), so every pread at offset 0 is a read of its own.
    A call another thread interrupted (`<unfinished ...>`) is read together with its `resumed` line.
    """
    calls: list[FileRead] = []
    pending: dict[str, tuple[str, str, float]] = {}  # pid -> (syscall, path, stamp at entry)
    starts = [start for start, _ in windows]
    last_end = windows[-1][1] if windows else 0.0

    def add(path: str, stamp: float, result: int | None, kept: bool) -> None:
        # A restarted call is traced again when it runs.
        if result is None or not starts or stamp < starts[0]:
            return
        # The scrape whose window started last by then: the time between two scrapes goes to the earlier.
        scrape = None if stamp > last_end else bisect.bisect_right(starts, stamp) - 1
        calls.append(FileRead(path, result >= 0, kept, scrape))

    for line in text.splitlines():
        resumed = _RESUMED.match(line)
        if resumed:
            pid = resumed.group(1)
            if pid in pending:
                syscall, path, stamp = pending.pop(pid)
                if syscall != "pread64" or _from_start(line):
                    add(path, stamp, _returned(line), syscall == "pread64")
            continue
        unfinished = line.rstrip().endswith("<unfinished ...>")
        pread = _PREAD_CALL.match(line)
        if pread:
            pid, stamp, path = pread.group(1), float(pread.group(2)), _strace_path(pread.group(3))
            if unfinished:
                pending[pid] = ("pread64", path, stamp)  # its offset is on the resumed line
            elif _from_start(line):
                add(path, stamp, _returned(line), True)
            continue
        call = _OPEN_CALL.match(line)
        if call is None:
            continue
        pid, stamp = call.group(1), float(call.group(2))
        directory, path = _strace_path(call.group(3) or ""), _strace_path(call.group(4))
        if directory and not path.startswith("/"):
            path = os.path.join(directory, path)  # openat relative to a directory fd (or the cwd)
        if unfinished:
            pending[pid] = ("open", path, stamp)
            continue
        add(path, stamp, _returned(line), False)
    return calls


# Metadata calls: no file is read, but each is a syscall of the scrape (and on sysfs a kernfs lookup). Traced
# to show what the fixture trees cost rdma-exporter and a node's sysfs would not (see `markdown`'s notes).
METADATA_CALLS: Final = ("newfstatat", "fstat", "stat", "lstat", "statx", "readlink", "readlinkat", "getdents64")
STRACE_ARGS: Final = (
    "-f", "-qq", "-ttt", "-y", "-s", "4096",
    "-e", "trace=openat,?open,pread64," + ",".join(f"?{name}" for name in METADATA_CALLS),
    "-o",
)  # fmt: skip
# A metadata call's entry: its name, then a directory fd or AT_FDCWD (-y adds its path in <...>) and/or a
# quoted path, as far as they are printed (an fd alone for fstat and getdents64, a path alone for stat).
_METADATA_CALL: Final = re.compile(
    r"^(\d+)\s+(\d+\.\d+)\s+(" + "|".join(METADATA_CALLS) + r")\("
    r"(?:(?:AT_FDCWD|-?\d+)(?:<([^>]*)>)?(?:,\s*|\)))?"
    r'(?:"((?:[^"\\]|\\.)*)")?'
)


def count_metadata_calls(text: str, windows: Sequence[tuple[float, float]], root: str) -> dict[str, float]:
    """Metadata calls (METADATA_CALLS) on paths under `root` inside the scrape `windows`, per scrape, by
    name: a stat of a path, an fstat or getdents64 of an fd open on one, a readlink. Counted where they
    start (an `<unfinished ...>` line has the arguments), failed or not: each is a syscall made."""
    counts: Counter[str] = Counter()
    if not windows:
        return {}
    first, last = windows[0][0], windows[-1][1]
    for line in text.splitlines():
        call = _METADATA_CALL.match(line)
        if call is None:
            continue
        stamp = float(call.group(2))
        if not first <= stamp <= last:
            continue
        directory, path = _strace_path(call.group(4) or ""), _strace_path(call.group(5) or "")
        if not path:
            path = directory  # fstat(fd), getdents64(fd), newfstatat(fd, "", ..., AT_EMPTY_PATH)
        elif directory and not path.startswith("/"):
            path = os.path.join(directory, path)
        path = os.path.normpath(path) if path else ""
        if path == root or path.startswith(root + "/"):
            counts[call.group(3)] += 1
    return {name: counts[name] / len(windows) for name in sorted(counts)}


def _traced_threads_ready(pid: int, tracer: int) -> bool:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        for task in tasks:
            status = Path(f"/proc/{pid}/task/{task}/status").read_text()
            tracer_line = next(line for line in status.splitlines() if line.startswith("TracerPid:"))
            if int(tracer_line.split()[1]) != tracer:
                return False
    except (OSError, StopIteration):
        return False
    return True


def scrape_windows(exporter: Exporter, scrapes: int) -> list[tuple[float, float]]:
    """Scrape `scrapes` times; the wall-clock (start, end) of each, the clock strace -ttt stamps with."""
    windows = []
    for _ in range(scrapes):
        started = time.time()
        exporter.scrape()
        windows.append((started, time.time()))
    return windows


def trace_attached(exporter: Exporter, scrapes: int, out: Path) -> tuple[list[tuple[float, float]], str] | None:
    """Trace `scrapes` scrapes of the running exporter: their windows and the trace; None if ptrace is refused."""
    strace = spawn(["strace", *STRACE_ARGS, str(out), "-p", str(exporter.pid)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while not _traced_threads_ready(exporter.pid, strace.pid):
        if strace.poll() is not None or time.monotonic() > deadline:
            stop(strace)
            return None
        time.sleep(0.02)
    windows = scrape_windows(exporter, scrapes)
    stop(strace, signal.SIGINT)  # SIGINT makes strace detach and flush
    return windows, out.read_text()


def trace_launched(exporter: Exporter, warmup: int, scrapes: int, out: Path) -> tuple[list[tuple[float, float]], str]:
    """Fallback where attaching is not allowed (Yama ptrace_scope): a second instance run under strace."""
    traced = Exporter(exporter.name, exporter.cmd_for_port, exporter.env, exporter.timeout)
    traced.start(wrap=["strace", *STRACE_ARGS, str(out), "--"])
    try:
        for _ in range(warmup):
            traced.scrape()
        windows = scrape_windows(traced, scrapes)
    finally:
        traced.close()
    return windows, out.read_text()


def files_per_scrape(
    exporter: Exporter, scrapes: int, warmup: int, workdir: Path, sys_root: Path, ethtool_dir: Path | None
) -> dict[str, Any]:
    out = workdir / f"strace-{exporter.name}.txt"
    mode = "attached"
    traced = trace_attached(exporter, scrapes, out)
    if traced is None:
        mode = "launched"
        log(f"strace cannot attach to {exporter.name}; tracing a second instance started under strace")
        traced = trace_launched(exporter, warmup, scrapes, out)
    windows, trace = traced
    result = count_trace(trace, windows, scrapes, sys_root, ethtool_dir)
    result["mode"] = mode
    if mode == "attached" and exporter.cold_window is not None:
        # How long after the cold scrape (which read the static info) the last traced scrape ended: under
        # the refresh period, no periodic re-read of static info could fall in the traced scrapes.
        result["seconds_after_cold_scrape"] = windows[-1][1] - exporter.cold_window[0]
    return result


def static_refresh(
    exporter: Exporter, workdir: Path, sys_root: Path, ethtool_dir: Path | None
) -> dict[str, Any] | None:
    """The files rdma-exporter reads in a scrape that re-reads every device's static info, and how often
    such a scrape comes.

    The steady scrapes traced by `files_per_scrape` fall within the exporter's first minute, so they never
    hold one: in rescan mode (the trees here: no sysfs mount, so no uevents) the inventory re-reads a device's
    static info in the first scrape RESCAN_STATIC_MAX_AGE after it last read it, every device at once since
    the cold scrape read them all; in udev mode (a node's /sys) in the first scrape UDEV_RESYNC_SECONDS after
    the last resync, and a device's on its uevent. A refresh reads what the cold scrape reads (no cached
    static info, the kept files closed and opened again), so this traces the cold scrape of a second
    instance started under strace. None where strace cannot run it.
    """
    out = workdir / f"strace-{exporter.name}-cold.txt"

    # Under strace a cold scrape of many devices outruns the 8 s deadline: the answer leaves devices out
    # and their reads land after it, uncounted (f86e229's trace of 128 devices: 4,526 of 6,296 counter files).
    # A long deadline lets the traced scrape read everything before it answers.
    def cmd(port: int) -> list[str]:
        return [*exporter.cmd_for_port(port), "--web.scrape-timeout", str(COLD_TRACE_DEADLINE_SECONDS)]

    traced = Exporter(exporter.name, cmd, exporter.env, max(exporter.timeout, COLD_TRACE_DEADLINE_SECONDS + 10))
    try:
        traced.start(wrap=["strace", *STRACE_ARGS, str(out), "--"])
    except RuntimeError:
        return None
    finally:
        traced.close()
    if traced.cold_window is None or not out.exists():
        return None
    result = count_trace(out.read_text(), [traced.cold_window], 1, sys_root, ethtool_dir)
    rescan = is_sysfs_mount(sys_root) is not True
    result.update(
        traced="cold scrape",
        deadline_seconds=COLD_TRACE_DEADLINE_SECONDS,
        mode="rescan" if rescan else "udev",
        every_seconds=RESCAN_STATIC_MAX_AGE if rescan else UDEV_RESYNC_SECONDS,
        rescan_every_seconds=RESCAN_STATIC_MAX_AGE,
        udev_every_seconds=UDEV_RESYNC_SECONDS,
        retry_failed_seconds=STATIC_RETRY_SECONDS,
    )
    return result


def count_trace(
    trace: str, windows: Sequence[tuple[float, float]], scrapes: int, sys_root: Path, ethtool_dir: Path | None
) -> dict[str, Any]:
    """`count_reads` of a strace output's scrape `windows`, with its `count_metadata_calls`."""
    ethtool = str(ethtool_dir) if ethtool_dir else None
    result = count_reads(parse_strace(trace, windows), scrapes, str(sys_root), ethtool)
    result["metadata_calls"] = count_metadata_calls(trace, windows, str(sys_root))
    return result


def count_reads(calls: Sequence[FileRead], scrapes: int, root: str, ethtool: str | None) -> dict[str, Any]:
    """Reads per scrape by class, from `parse_strace`'s calls over `scrapes` scrapes.

    A failed read (an open of a file that is not there, a pread that errs) is counted as failed, not in a
    class: no file was read (on mlx5 a failed counters/ read may still have cost a firmware query). The
    most reads of one counter file is the most in any one scrape. Calls after the last scrape are counted
    apart (`outside_scrapes`, in all): no exporter should read files once it has answered.
    """
    classes: Counter[str] = Counter()
    per_scrape: Counter[tuple[int, str]] = Counter()  # (scrape, real path) of counter files
    real: dict[str, str] = {}
    static_examples: list[str] = []
    failed = 0
    kept = 0
    outside = 0
    for call in calls:
        if call.scrape is None:
            outside += 1
            continue
        # Both exporters open paths under the root exactly as given on their command line; -y prints
        # a kept fd's resolved path, which is under the root too (class/ links point into devices/).
        kind = classify(os.path.normpath(call.path), root, ethtool)
        if not call.ok:
            # Failed reads of the tree only, as the other columns: a library the runtime probes for
            # and does not find is no read of sysfs.
            failed += kind != "other"
            continue
        classes[kind] += 1
        kept += call.kept
        if kind == "counter":
            # One file, however spelled: an open names it as given (class/... links), -y a kept fd's real path.
            if call.path not in real:
                real[call.path] = os.path.realpath(call.path)
            per_scrape[(call.scrape, real[call.path])] += 1
        if kind == "static" and len(static_examples) < 8:
            rel = os.path.relpath(call.path, root)
            if rel not in static_examples:
                static_examples.append(rel)
    result: dict[str, Any] = {k: classes[k] / scrapes for k in CLASSES}
    result["sysfs_total"] = sum(classes[k] for k in ("counter", "state", "static", "directory")) / scrapes
    result["failed"] = failed / scrapes
    result["kept_open_reads"] = kept / scrapes
    result["outside_scrapes"] = outside
    result["max_reads_of_one_counter_file_in_a_scrape"] = max(per_scrape.values(), default=0)
    result["static_examples"] = static_examples
    result["traced_scrapes"] = scrapes
    return result


# --- one tree ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tree:
    name: str
    spec: TreeSpec

    @property
    def devices(self) -> int:
        return self.spec.ib_hcas + self.spec.roce_hcas + self.spec.ib_hcas * self.spec.vfs_per_pf


def parse_trees(text: str) -> list[Tree]:
    trees: list[Tree] = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        if item == "sample":
            trees.append(Tree("sample", SAMPLE_SPEC))
        elif item.isdigit() and int(item) > 0:
            trees.append(Tree(item, spec_for_devices(int(item))))
        else:
            raise argparse.ArgumentTypeError(f"--devices: {item!r} is neither 'sample' nor a positive number")
    return trees


def summarise(latencies: Sequence[float]) -> dict[str, float]:
    ms = [x * 1000 for x in latencies]
    return {
        "p50": percentile(ms, 0.5),
        "p90": percentile(ms, 0.9),
        "p99": percentile(ms, 0.99),
        "mean": sum(ms) / len(ms),
        "min": min(ms),
        "max": max(ms),
    }


def exporter_env() -> dict[str, str]:
    """The environment that runs this checkout's exporter, whatever is installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "exporter"), env.get("PYTHONPATH")]))
    return env


def exporter_cmd(sys_root: Path, ethtool_dir: Path | None, port: int, flags: Sequence[str] = ()) -> list[str]:
    """rdma-exporter serving a tree (and its `ethtool -S` captures) on a loopback port."""
    cmd = [sys.executable, "-m", "rdma_exporter", "--path.sysfs", str(sys_root)]
    cmd += ["--web.listen-address", f"127.0.0.1:{port}", "--log.level", "warn"]
    return cmd + (["--path.ethtool", str(ethtool_dir)] if ethtool_dir else []) + list(flags)


def node_exporter_cmd(binary: str, sys_root: Path, port: int, flags: Sequence[str] = ()) -> list[str]:
    """node_exporter with its infiniband collector alone, serving the same tree on a loopback port."""
    return [
        binary,
        "--collector.disable-defaults",
        "--collector.infiniband",
        f"--path.sysfs={sys_root}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
        *flags,
    ]


def bench_tree(tree: Tree, args: argparse.Namespace, workdir: Path, memory_tree: bool) -> dict[str, Any]:
    dest = workdir / f"tree-{tree.name}"
    sys_root = build_tree(dest, tree.spec)
    ethtool_dir = dest / "ethtool" if (dest / "ethtool").is_dir() else None
    # Before each warm-up and timed round, not inside a scrape's time: both exporters see the same values.
    traffic = Traffic(sys_root, ethtool_dir, COUNTER_DIRS) if args.traffic else None
    checkpoints = (args.memory_scrapes // 2, args.memory_scrapes) if memory_tree and args.memory_scrapes else ()
    env = exporter_env()

    def ours_cmd(port: int) -> list[str]:
        return exporter_cmd(sys_root, ethtool_dir, port, args.ours_flag)

    def node_cmd(port: int) -> list[str]:
        return node_exporter_cmd(args.node_exporter, sys_root, port, args.node_exporter_flag)

    exporters = [
        Exporter(OURS, ours_cmd, env, args.timeout, checkpoints),
        Exporter(NODE, node_cmd, None, args.timeout, checkpoints),
    ]
    try:
        for exporter in exporters:
            exporter.start()
        log(f"tree {tree.name} ({tree.devices} devices): warm-up")
        for _ in range(args.warmup):
            if traffic is not None:
                traffic.advance()
            for exporter in exporters:
                exporter.scrape()

        log(f"tree {tree.name}: {args.scrapes} timed scrapes each")
        latencies: dict[str, list[float]] = {e.name: [] for e in exporters}
        cpu_before = {e.name: cpu_seconds(e.pid) for e in exporters}
        for i in range(args.scrapes):
            if traffic is not None:
                traffic.advance()
            # Alternate who goes first so that neither always scrapes right after the other.
            for exporter in exporters if i % 2 == 0 else exporters[::-1]:
                latencies[exporter.name].append(exporter.scrape())
        cpu_after = {e.name: cpu_seconds(e.pid) for e in exporters}

        results: dict[str, dict[str, Any]] = {}
        for exporter in exporters:
            total, fabric = count_series(exporter.last_body)
            lat = summarise(latencies[exporter.name])
            results[exporter.name] = {
                "latency_ms": lat,
                "cold_scrape_ms": exporter.cold_ms,
                "series": total,
                "fabric_series": fabric,
                "body_bytes": len(exporter.last_body),
                # Per fabric series: the exporter's own series are not what it is there to export.
                "p50_us_per_fabric_series": lat["p50"] * 1000 / max(fabric, 1),
                "cpu_ms_per_scrape": (cpu_after[exporter.name] - cpu_before[exporter.name]) * 1000 / args.scrapes,
            }

        if args.strace:
            for exporter in exporters:
                log(f"tree {tree.name}: counting files read by {exporter.name} over {args.strace_scrapes} scrapes")
                results[exporter.name]["files_per_scrape"] = files_per_scrape(
                    exporter, args.strace_scrapes, args.warmup, workdir, sys_root, ethtool_dir
                )
            log(f"tree {tree.name}: counting files read by {OURS}'s cold scrape (a static refresh)")
            refresh = static_refresh(exporters[0], workdir, sys_root, ethtool_dir)
            if refresh is not None:
                results[OURS]["static_refresh"] = refresh

        if checkpoints:
            log(f"tree {tree.name}: memory run up to scrape {args.memory_scrapes}")
            for exporter in exporters:
                while exporter.scrapes < args.memory_scrapes:
                    if traffic is not None:
                        traffic.advance()
                    exporter.scrape()
        for exporter in exporters:
            memory: dict[str, Any] = {"rss_mb_end": rss_bytes(exporter.pid) / 2**20, "scrapes": exporter.scrapes}
            if checkpoints:
                at = {c: exporter.rss_at(c) for c in checkpoints}
                memory["rss_mb_at"] = {str(c): v / 2**20 for c, v in at.items() if v is not None}
                memory["rss_mb_readings"] = [[n, round(rss / 2**20, 3)] for n, rss in exporter.rss_readings]
                mid, end = checkpoints
                between = [(n, rss) for n, rss in exporter.rss_readings if mid <= n <= end]
                growth, error = rss_growth(between, end - mid) if between else (None, None)
                memory["growth_mb_mid_to_end"] = growth
                memory["growth_mb_standard_error"] = error
                memory["growth_readings"] = len(between)
                memory["growth_mb_of_medians"] = (
                    (at[end] - at[mid]) / 2**20 if at[mid] is not None and at[end] is not None else None
                )
                # What the growth target judges (evaluate_targets), from the readings as recorded.
                memory["growth_check"] = growth_check(memory["rss_mb_readings"], mid, end)
            results[exporter.name]["memory"] = memory
    finally:
        for exporter in exporters:
            exporter.close()
        if not args.keep:
            shutil.rmtree(dest, ignore_errors=True)

    ours, node = results[OURS], results[NODE]
    ratio = {
        "p50": ours["latency_ms"]["p50"] / node["latency_ms"]["p50"],
        "p99": ours["latency_ms"]["p99"] / node["latency_ms"]["p99"],
        "fabric_series": ours["fabric_series"] / max(node["fabric_series"], 1),
        "cpu_per_scrape": ours["cpu_ms_per_scrape"] / node["cpu_ms_per_scrape"] if node["cpu_ms_per_scrape"] else None,
    }
    return {
        "tree": tree.name,
        "devices": tree.devices,
        "exporters": results,
        "ours_over_node_exporter": ratio,
        "traffic_files": len(traffic) if traffic is not None else None,
    }


# --- report ------------------------------------------------------------------------------------------


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float] | None:
    """Least-squares line: slope, intercept, R² and, from 3 points on, the slope's standard error."""
    if len(set(xs)) < 2:
        return None
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    fit = {"slope": slope, "intercept": intercept, "r2": 1 - ss_res / ss_tot if ss_tot else 1.0}
    if n > 2:
        fit["slope_se"] = (ss_res / (n - 2) / sxx) ** 0.5
    return fit


def rss_growth(readings: Sequence[tuple[int, int]], span: int) -> tuple[float, float | None]:
    """Fitted growth of RSS over `span` scrapes, in MB, and its standard error (None under 3 readings)."""
    fit = linear_fit([float(n) for n, _ in readings], [rss / 2**20 for _, rss in readings])
    if fit is None:
        return 0.0, None
    error = fit.get("slope_se")
    return fit["slope"] * span, None if error is None else error * span


def growth_check(readings: Sequence[Sequence[float]], first: int, last: int) -> dict[str, Any] | None:
    """`rss_growth_one_step` over the readings (scrape, MB) from scrape `first` to `last`, with their count."""
    between = [(int(n), float(mb)) for n, mb in readings if first <= n <= last]
    fit = rss_growth_one_step(between, last - first)
    return None if fit is None else {**fit, "readings": len(between)}


def rss_growth_one_step(readings: Sequence[tuple[int, float]], span: int) -> dict[str, Any] | None:
    """Growth of RSS (`readings`: scrape, MB) over `span` scrapes, with one step in the readings allowed.

    Why not the plain line (`rss_growth`) against a loose tolerance, as before: a loose tolerance (0.25 MB)
    let a steady leak of 300 bytes a scrape pass. Why not a tight one on the plain line: glibc's heap and
    pymalloc's arenas take a one-off step of 0.1 to 0.4 MB somewhere in some runs (PROFILE.md, Updates 9
    and 17), which tilts the line by up to 1.5 times the step (0.44 MB of growth for 0.3 MB at scrape 750).
    Why not each half (500-750, 750-1,000) apart: a half's slope has 2.75 times the standard error of the
    whole window's, too much to tell 100 bytes a scrape from noise. So: the line through all the readings,
    or, where the readings hold a step, the line with the step taken out, i.e. one slope common to the
    readings before and after it, each side with its own level. The step is put where it fits best and
    kept only if it stands STEP_T_MIN standard errors clear of zero: on a step-free run the best place for
    one is noise, and a slope fitted around a step put there by the noise scatters twice as far as its
    standard error says. A leak is in the slope either way; a single step, up or down, is not. Two steps
    up are taken for growth.

    Returns growth_mb and standard_error_mb over `span`, step_mb and step_at_scrape (the first reading
    after it; both None where no step was kept), or None under 4 readings.
    """
    n = len(readings)
    if n < 4 or len({x for x, _ in readings}) < 2:
        return None
    xs = [float(x) for x, _ in readings]
    ys = [float(y) for _, y in readings]

    def sums(lo: int, hi: int) -> tuple[float, float, float, float, float, int]:
        """Centred sums of readings lo..hi-1: Sxx, Sxy, Syy, mean x, mean y, count."""
        m = hi - lo
        mx, my = sum(xs[lo:hi]) / m, sum(ys[lo:hi]) / m
        sxx = sum((x - mx) ** 2 for x in xs[lo:hi])
        sxy = sum((x - mx) * (y - my) for x, y in zip(xs[lo:hi], ys[lo:hi], strict=True))
        return sxx, sxy, sum((y - my) ** 2 for y in ys[lo:hi]), mx, my, m

    sxx, sxy, syy, _, _, _ = sums(0, n)
    slope = sxy / sxx
    result: dict[str, Any] = {
        "growth_mb": slope * span,
        "standard_error_mb": (max(syy - slope * sxy, 0.0) / (n - 2) / sxx) ** 0.5 * span,
        "step_mb": None,
        "step_at_scrape": None,
    }
    best: tuple[float, int] | None = None  # (residual sum of squares, k): a step before reading k
    for k in range(1, n):
        a, b = sums(0, k), sums(k, n)
        within = a[0] + b[0]
        if within > 0:
            residual = a[2] + b[2] - (a[1] + b[1]) ** 2 / within
            if best is None or residual < best[0]:
                best = (residual, k)
    if best is None:
        return result
    k = best[1]
    a, b = sums(0, k), sums(k, n)
    within = a[0] + b[0]
    common = (a[1] + b[1]) / within
    variance = max(a[2] + b[2] - common * common * within, 0.0) / (n - 3)
    step = b[4] - a[4] - common * (b[3] - a[3])  # the two levels compared at the same scrape
    step_se = (variance * (1 / a[5] + 1 / b[5] + (b[3] - a[3]) ** 2 / within)) ** 0.5
    if abs(step) >= STEP_MIN_MB and (step_se == 0 or abs(step) / step_se >= STEP_T_MIN):
        result.update(
            growth_mb=common * span,
            standard_error_mb=(variance / within) ** 0.5 * span,
            step_mb=step,
            step_at_scrape=int(xs[k]),
        )
    return result


def scaling(trees: list[dict[str, Any]]) -> dict[str, Any]:
    """How cost grows with devices, fitted over the generated trees (not `sample`)."""
    numeric = [t for t in trees if t["tree"].isdigit()]
    out: dict[str, Any] = {}
    for name in (OURS, NODE):
        xs = [float(t["devices"]) for t in numeric]
        fits = {
            "p50_ms": linear_fit(xs, [t["exporters"][name]["latency_ms"]["p50"] for t in numeric]),
            "cpu_ms_per_scrape": linear_fit(xs, [t["exporters"][name]["cpu_ms_per_scrape"] for t in numeric]),
            "fabric_series": linear_fit(xs, [float(t["exporters"][name]["fabric_series"]) for t in numeric]),
        }
        if all("files_per_scrape" in t["exporters"][name] for t in numeric):
            ys = [t["exporters"][name]["files_per_scrape"]["sysfs_total"] for t in numeric]
            fits["sysfs_files_per_scrape"] = linear_fit(xs, ys)
        out[name] = fits
    return out


def evaluate_targets(
    trees: list[dict[str, Any]], memory_limit_mb: float, growth_tolerance_mb: float
) -> list[dict[str, Any]]:
    by_name = {t["tree"]: t for t in trees}
    targets: list[dict[str, Any]] = []

    def add(target: str, met: bool | None, measured: str) -> None:
        targets.append({"target": target, "met": met, "measured": measured})

    sample = by_name.get("sample")
    if sample:
        ours, node = sample["exporters"][OURS], sample["exporters"][NODE]
        add(
            "sample tree: our p50 <= node_exporter's p50",
            ours["latency_ms"]["p50"] <= node["latency_ms"]["p50"],
            f"{ours['latency_ms']['p50']:.2f} ms vs {node['latency_ms']['p50']:.2f} ms "
            f"(x{sample['ours_over_node_exporter']['p50']:.2f})",
        )
        add(
            "sample tree: at least 2x node_exporter's series",
            ours["fabric_series"] >= 2 * node["fabric_series"],
            f"{ours['fabric_series']} vs {node['fabric_series']} fabric series "
            f"(x{sample['ours_over_node_exporter']['fabric_series']:.2f})",
        )
    else:
        add("sample tree targets", None, "sample tree not in --devices")

    traced = [t for t in trees if "files_per_scrape" in t["exporters"][OURS]]
    if traced:
        static = max(t["exporters"][OURS]["files_per_scrape"]["static"] for t in traced)
        # Judged on the steady scrapes, which fall between two refreshes of the static info; what one
        # refresh re-reads, and how often it comes, is said beside it (`static_refresh`).
        refreshed = [t for t in traced if "static_refresh" in t["exporters"][OURS]]
        measured = f"max {static:g} static reads per scrape over trees"
        if refreshed:
            largest = max(refreshed, key=lambda t: t["devices"])
            refresh = largest["exporters"][OURS]["static_refresh"]
            measured += (
                f"; static files re-read every {refresh['every_seconds']:g} s: {refresh['static']:g} "
                f"({largest['devices']} devices, {refresh['mode']} mode; the {refresh['traced']} traced)"
            )
        else:
            measured += "; no refresh traced"
        add(
            f"no static file re-read between refreshes of the static info (every {RESCAN_STATIC_MAX_AGE:g} s in "
            f"rescan mode, as on these trees; in udev mode every {UDEV_RESYNC_SECONDS:g} s and on the device's uevent)",
            static == 0,
            measured,
        )
        worst = max(
            t["exporters"][OURS]["files_per_scrape"]["max_reads_of_one_counter_file_in_a_scrape"] for t in traced
        )
        measured = f"max {worst:g} reads of one counter file in one traced scrape"
        if refreshed:  # the refresh scrape too: the static info's reads must not read a counter again
            in_refresh = max(
                t["exporters"][OURS]["static_refresh"]["max_reads_of_one_counter_file_in_a_scrape"] for t in refreshed
            )
            measured += f" ({in_refresh:g} in a refresh)"
            worst = max(worst, in_refresh)
        add("each counter file read at most once per scrape", worst <= 1, measured)
    else:
        add("files read per scrape", None, "not traced (--no-strace)")

    memory_trees = [t for t in trees if "rss_mb_at" in t["exporters"][OURS]["memory"]]
    if memory_trees:
        mem_tree = memory_trees[0]
        memory = mem_tree["exporters"][OURS]["memory"]
        at = memory["rss_mb_at"]
        last = max(at, key=int) if at else None
        rss = at[last] if last else memory["rss_mb_end"]
        add(
            f"RSS <= {memory_limit_mb:g} MB after {last} scrapes of the {mem_tree['devices']}-device tree",
            rss <= memory_limit_mb,
            f"{rss:.1f} MB",
        )
        first = min(at, key=int)
        check = growth_check(memory.get("rss_mb_readings") or [], int(first), int(last or 0))
        measured = "n/a (no RSS readings recorded)"
        if check is not None:
            measured = (
                f"{check['growth_mb']:+.3f} MB ± {check['standard_error_mb']:.3f} (fit over {check['readings']} "
                + (
                    f"readings, a step of {check['step_mb']:+.3f} MB before scrape {check['step_at_scrape']} taken out)"
                    if check["step_mb"] is not None
                    else "readings, no step)"
                )
            )
        # Met only if the fitted growth stays under the tolerance by two standard errors as well.
        add(
            f"no RSS growth between scrapes {first} and {last} (fitted growth + 2 standard errors <= "
            f"{growth_tolerance_mb:g} MB, one allocator step allowed)",
            None if check is None else check["growth_mb"] + 2 * check["standard_error_mb"] <= growth_tolerance_mb,
            measured,
        )
    big = [t for t in trees if t["tree"].isdigit() and t["devices"] >= 128]
    if big:
        p50 = big[0]["exporters"][OURS]["latency_ms"]["p50"]
        add(f"{big[0]['devices']} devices scraped in under 100 ms p50", p50 < 100, f"{p50:.1f} ms")
    return targets


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _calls_text(calls: dict[str, float]) -> str:
    return ", ".join(f"{name} {count:g}" for name, count in calls.items()) or "none"


def notes(report: dict[str, Any]) -> list[str]:
    """What the table's file counts leave out: the periodic static refresh, and the metadata calls the
    fixture trees cost rdma-exporter that a node's sysfs would not."""
    lines: list[str] = []
    refreshes = [
        (tree["tree"], tree["exporters"][OURS]["static_refresh"])
        for tree in report["trees"]
        if "static_refresh" in tree["exporters"][OURS]
    ]
    if refreshes:
        mode = refreshes[0][1]
        lines += [
            "",
            f"The static column is the steady state, between refreshes: rdma_exporter re-reads every device's static "
            f"info in the first scrape {mode['rescan_every_seconds']:g} s after it last read it in rescan mode (these "
            f"trees: not a sysfs mount, so no uevents), and in udev mode (a node's /sys) "
            f"{mode['udev_every_seconds']:g} s after the last resync and on a device's uevent; in either mode static "
            f"info whose read failed is read again after {mode['retry_failed_seconds']:g} s. Static files re-read "
            f"every {mode['every_seconds']:g} s ({mode['mode']} mode; the cold scrape traced, which reads the same): "
            + ", ".join(f"{name} {refresh['static']:g}" for name, refresh in refreshes)
            + ".",
        ]
    metadata = [
        f"{tree['tree']}: "
        + "; ".join(
            f"{name} {_calls_text(tree['exporters'][name]['files_per_scrape']['metadata_calls'])}"
            for name in (OURS, NODE)
            if "metadata_calls" in tree["exporters"][name].get("files_per_scrape", {})
        )
        for tree in report["trees"]
        if "metadata_calls" in tree["exporters"][OURS].get("files_per_scrape", {})
    ]
    if metadata:
        lines += [
            "",
            "Metadata calls per steady scrape on paths under the tree (strace): " + " | ".join(metadata) + ".",
            "",
            "The trees make rdma_exporter's numbers pessimistic. Not being a sysfs mount, they put it in rescan mode, "
            "which lists class/infiniband every scrape (its getdents64, a stat and a readlink per device), and make it "
            "check the directories of its kept-open files every scrape (a stat each, and an fstat per read of a kept "
            "file until its directory has been still for 2 s), since a file deleted under a kept fd stays readable on "
            "a plain file system. On a node with sysfs mounted and udev it does neither; the other calls above (each "
            "device's device/net listing, the netdev directory checks) it makes there too.",
        ]
    return lines


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# rdma-exporter vs node_exporter",
        "",
        f"{report['machine']['cpu_model']}, {report['machine']['nproc']} CPUs, Python "
        f"{report['machine']['python']}, kernel {report['machine']['kernel']}, {report['machine']['node_exporter']}; "
        f"{report['settings']['scrapes']} timed scrapes per exporter and tree, requests as --accept "
        f"{report['settings']['accept']}"
        f"{', counters moving between rounds (--traffic)' if report['settings'].get('traffic') else ''}"
        f"; exporter at commit "
        f"{(report['source']['commit'] or 'unknown')[:12]}"
        f"{' with uncommitted changes in exporter/' if report['source']['exporter_dirty'] else ''}.",
        "",
        "| tree | devices | exporter | series (fabric) | p50 ms | p90 ms | p99 ms | p50 ours/NE | µs/fabric series "
        "| CPU ms/scrape | RSS MB | files read/scrape counter / state / static / dirs (kept open; failed) |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for tree in report["trees"]:
        for name in (OURS, NODE):
            r = tree["exporters"][name]
            lat = r["latency_ms"]
            files = r.get("files_per_scrape")
            files_text = (
                f"{files['counter']:g} / {files['state']:g} / {files['static']:g} / {files['directory']:g}"
                f" ({files.get('kept_open_reads', 0):g}; {files.get('failed', 0):g})"
                if files
                else "n/a"
            )
            ratio = f"{tree['ours_over_node_exporter']['p50']:.2f}" if name == OURS else ""
            lines.append(
                f"| {tree['tree']} | {tree['devices']} | {name} | {r['series']} ({r['fabric_series']}) "
                f"| {lat['p50']:.2f} | {lat['p90']:.2f} | {lat['p99']:.2f} | {ratio} "
                f"| {r['p50_us_per_fabric_series']:.1f} "
                f"| {r['cpu_ms_per_scrape']:.2f} | {r['memory']['rss_mb_end']:.1f} | {files_text} |"
            )
    lines += notes(report)
    lines += ["", "## Growth with devices (least-squares fit over the generated trees)", ""]
    lines += [
        "| exporter | p50 ms per device | p50 intercept ms | CPU ms per device | sysfs files per device | R² (p50) |"
    ]
    lines += ["| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, fits in report["scaling"].items():
        p50, cpu, files = fits.get("p50_ms"), fits.get("cpu_ms_per_scrape"), fits.get("sysfs_files_per_scrape")
        lines.append(
            f"| {name} | {_fmt(p50 and p50['slope'], 3)} | {_fmt(p50 and p50['intercept'])} "
            f"| {_fmt(cpu and cpu['slope'], 3)} | {_fmt(files and files['slope'], 1)} | {_fmt(p50 and p50['r2'], 3)} |"
        )
    lines += ["", "## Targets", ""]
    if report["settings"].get("ours_flags"):
        flags = " ".join(report["settings"]["ours_flags"])
        lines += [f"rdma_exporter ran with `{flags}`: not the default configuration, so these do not count.", ""]
    if report["settings"].get("node_exporter_flags"):
        flags = " ".join(report["settings"]["node_exporter_flags"])
        lines += [f"node_exporter ran with `{flags}` as well: not the issue's comparison, so these do not count.", ""]
    lines += ["| target | measured | result |", "| --- | --- | --- |"]
    for t in report["targets"]:
        result = {True: "met", False: "**NOT MET**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {t['measured']} | {result} |")
    examples = {
        tree["tree"]: tree["exporters"][OURS]["files_per_scrape"]["static_examples"]
        for tree in report["trees"]
        if tree["exporters"][OURS].get("files_per_scrape", {}).get("static_examples")
    }
    if examples:
        lines += ["", "Static files rdma_exporter re-read per scrape (examples):", ""]
        lines += [f"- {tree}: {', '.join(paths)}" for tree, paths in examples.items()]
    after = [
        f"{tree['tree']} ({name}): {files['outside_scrapes']}"
        for tree in report["trees"]
        for name in (OURS, NODE)
        if (files := tree["exporters"][name].get("files_per_scrape", {})).get("outside_scrapes")
    ]
    if after:
        lines += ["", f"Files read after the last traced scrape's answer: {', '.join(after)}."]
    return "\n".join(lines) + "\n"


# --- main --------------------------------------------------------------------------------------------


def machine(node_exporter: str) -> dict[str, Any]:
    cpu_model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "cpu model")):
                cpu_model = line.split(":", 1)[1].strip()
                break
    try:
        version = subprocess.run([node_exporter, "--version"], capture_output=True, text=True, timeout=30)
        ne_version = (version.stdout + version.stderr).splitlines()[0].strip()
    except (OSError, subprocess.TimeoutExpired, IndexError):
        ne_version = "node_exporter (version unknown)"
    try:
        import prometheus_client

        client_version = getattr(prometheus_client, "__version__", None)
        if client_version is None:
            from importlib.metadata import version as dist_version

            client_version = dist_version("prometheus-client")
    except Exception:  # a version string is not worth failing the benchmark for
        client_version = "unknown"
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "node_exporter": ne_version,
        "prometheus_client": client_version,
        "hostname": platform.node(),
    }


def git(cwd: Path, *argv: str) -> str | None:
    """A git command's output in cwd, or None where git or the repository is missing."""
    try:
        done = subprocess.run(["git", *argv], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def source_revision() -> dict[str, Any]:
    """The commit measured, and whether exporter/ had uncommitted changes (results are then not reproducible)."""
    status = git(ROOT, "status", "--porcelain", "--", "exporter")
    return {"commit": git(ROOT, "rev-parse", "HEAD"), "exporter_dirty": None if status is None else bool(status)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--scrapes", type=int, help="timed scrapes per exporter and tree (default 300, quick 10)")
    parser.add_argument(
        "--devices", help=f"comma-separated trees: 'sample' or a device count (default {DEFAULT_DEVICES}, quick 1)"
    )
    parser.add_argument("--json", type=Path, default=Path("bench-results.json"), help="where to write the JSON")
    parser.add_argument("--quick", action="store_true", help="smoke run: few scrapes, one small tree")
    parser.add_argument("--warmup", type=int, help="untimed scrapes before measuring (default 20, quick 2)")
    parser.add_argument("--strace-scrapes", type=int, help="scrapes traced to count opened files (default 5, quick 2)")
    parser.add_argument(
        "--memory-scrapes",
        type=int,
        help="on the largest tree, RSS at half and at this many scrapes, 0 for none (default 1000, or the fewest\n"
        "that keep the RSS readings, before each of which the bench waits 0.2 s, after the timed and traced\n"
        "scrapes, if that is more; quick: the fewest)",
    )
    parser.add_argument(
        "--accept",
        choices=sorted(ACCEPT),
        default="text",
        help="request headers: 'text' (default) or 'prometheus', what a Prometheus server sends (OpenMetrics, gzip)",
    )
    parser.add_argument(
        "--traffic",
        action="store_true",
        help="before each warm-up and timed round and each memory-run scrape, rewrite every non-zero file under\n"
        "counters/, counters_ext/, hw_counters/ and statistics/ and every ethtool capture value to a larger\n"
        "number and move each temperature (bench/traffic.py), as on a node under load; the traced scrapes\n"
        "read the tree as it is then",
    )
    parser.add_argument("--no-strace", dest="strace", action="store_false", help="do not count opened files")
    parser.add_argument("--node-exporter", default=None, help="node_exporter binary (default: found on PATH)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds allowed for start-up and each scrape")
    parser.add_argument("--keep", action="store_true", help="keep the generated trees and strace logs")
    parser.add_argument(
        "--ours-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra flag for rdma-exporter (repeatable), e.g. --no-collector.netdev to time it on node_exporter's "
        "share of the work; the report then says its targets are not the default configuration's",
    )
    parser.add_argument(
        "--node-exporter-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra flag for node_exporter (repeatable), e.g. --collector.netclass to time it on more of our work; "
        "the report then says its targets are not the issue's comparison",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quick = args.quick
    args.scrapes = args.scrapes or (10 if quick else 300)
    args.warmup = args.warmup if args.warmup is not None else (2 if quick else 20)
    args.strace_scrapes = args.strace_scrapes or (2 if quick else 5)
    before = scrapes_before_memory_run(args)
    # The smallest run whose first RSS reading comes after every timed and traced scrape.
    least = 2 * (before + 1 + (RSS_SAMPLES - 1) * RSS_SAMPLE_EVERY)
    if args.memory_scrapes is None:
        args.memory_scrapes = least if quick else max(1000, least)
    if args.memory_scrapes < 0 or 0 < args.memory_scrapes < least:
        print(
            f"bench: --memory-scrapes {args.memory_scrapes} would read RSS among the {before} scrapes before the "
            f"memory run (the bench waits 0.2 s before each reading); use at least {least}, or 0 for none",
            file=sys.stderr,
        )
        return 2
    try:
        trees = parse_trees(args.devices or ("1" if quick else DEFAULT_DEVICES))
    except argparse.ArgumentTypeError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    args.node_exporter = args.node_exporter or shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if not args.node_exporter:
        print("bench: node_exporter not found (Debian: apt-get install prometheus-node-exporter)", file=sys.stderr)
        return 2
    if args.strace and shutil.which("strace") is None:
        print("bench: strace not found (apt-get install strace), or pass --no-strace", file=sys.stderr)
        return 2

    global request_headers
    request_headers = ACCEPT[args.accept]

    atexit.register(stop_all)
    # SIGTERM/SIGHUP unwind through the finally blocks so that no exporter outlives the benchmark.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))

    workdir = Path(tempfile.mkdtemp(prefix="rdma-bench-")).resolve()
    memory_tree = max(trees, key=lambda t: t.devices)
    results: list[dict[str, Any]] = []
    try:
        for tree in trees:
            results.append(bench_tree(tree, args, workdir, memory_tree=tree is memory_tree))
    finally:
        stop_all()
        if args.keep:
            log(f"trees and traces kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(args.node_exporter),
        "source": source_revision(),
        "settings": {
            "scrapes": args.scrapes,
            "warmup": args.warmup,
            "strace_scrapes": args.strace_scrapes if args.strace else None,
            "memory_scrapes": args.memory_scrapes,
            "memory_tree": memory_tree.name,
            "quick": quick,
            "accept": args.accept,
            "traffic": args.traffic,
            "ours_flags": args.ours_flag,
            "node_exporter_flags": args.node_exporter_flag,
            "memory_limit_mb": MEMORY_LIMIT_MB,
            "growth_tolerance_mb": GROWTH_TOLERANCE_MB,
        },
        "trees": results,
        "scaling": scaling(results),
        "targets": evaluate_targets(results, memory_limit_mb=MEMORY_LIMIT_MB, growth_tolerance_mb=GROWTH_TOLERANCE_MB),
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    sys.stdout.write(markdown(report))
    log(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
