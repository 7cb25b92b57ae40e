"""process_* series of the exporter itself, under the names and HELP texts of the Prometheus client
libraries, so that the usual dashboards and memory or file-descriptor alerts work on it as on any exporter.

They are not in the collector's families: the daemon adds them to each answer (and the golden files,
which must not change from run to run, leave them out).
"""

from __future__ import annotations

import resource
import threading
import time
from pathlib import Path
from typing import Final

from ..parse.process import count_open_files, read_process_stat
from .base import FamilySet, MetricSpec

CPU: Final = MetricSpec("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", ())
RESIDENT: Final = MetricSpec("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", ())
VIRTUAL: Final = MetricSpec("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", ())
START: Final = MetricSpec(
    "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.", ()
)
OPEN_FDS: Final = MetricSpec(
    "process_open_fds",
    "gauge",
    "Number of open file descriptors. Counted at most once a minute: the exporter keeps its sysfs files "
    "open, and listing thousands of them on every scrape would cost more than the scrape's reads.",
    (),
)
MAX_FDS: Final = MetricSpec("process_max_fds", "gauge", "Maximum number of open file descriptors.", ())
PROCESS_SPECS: Final = (CPU, RESIDENT, VIRTUAL, START, OPEN_FDS, MAX_FDS)
OPEN_FDS_MAX_AGE_SECONDS: Final = 60.0


class ProcessMetrics:
    def __init__(self, boot_time: float, proc: Path = Path("/proc")) -> None:
        self._boot_time = boot_time
        self._proc = proc
        self._lock = threading.Lock()
        self._open_fds: tuple[float, int | None] | None = None  # (when counted, count)

    def families(self, now: float | None = None) -> FamilySet:
        """This moment's values; one that cannot be read (a /proc hidden by a sandbox) is left out."""
        now = time.monotonic() if now is None else now
        out = FamilySet()
        stat = read_process_stat(self._proc, self._boot_time)
        if stat is not None:
            out.add(CPU, (), stat.cpu_seconds)
            out.add(RESIDENT, (), stat.resident_bytes)
            out.add(VIRTUAL, (), stat.virtual_bytes)
            out.add(START, (), stat.start_time_seconds)
        with self._lock:
            if self._open_fds is None or now - self._open_fds[0] >= OPEN_FDS_MAX_AGE_SECONDS:
                self._open_fds = (now, count_open_files(self._proc))
            open_fds = self._open_fds[1]
        if open_fds is not None:
            out.add(OPEN_FDS, (), open_fds)
        try:
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except OSError:  # a seccomp filter that refuses prlimit64, as start-up allows (daemon.raise_fd_limit)
            return out
        if soft != resource.RLIM_INFINITY:
            out.add(MAX_FDS, (), soft)
        return out
