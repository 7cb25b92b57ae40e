"""The exporter's own process from /proc: CPU time, memory, start time and open files.

These are the process_* values every Prometheus client library exports. Pure functions over a /proc root,
as the sysfs parsers are over theirs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ProcessStat:
    cpu_seconds: float  # user and system
    resident_bytes: int
    virtual_bytes: int
    start_time_seconds: float  # since the epoch


def parse_proc_stat(text: str, boot_time: float, ticks_per_second: int, page_size: int) -> ProcessStat | None:
    """A /proc/PID/stat line, or None if it is not one. The command name (field 2) may hold spaces and
    parentheses, so the fields are counted from the last ')'."""
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 22:
        return None
    try:
        # Fields 14/15 (utime, stime) and 22 (starttime) are in clock ticks, 23 (vsize) in bytes and 24
        # (rss) in pages; field 3 (state) is fields[0].
        utime, stime, start, vsize, rss = (int(fields[i]) for i in (11, 12, 19, 20, 21))
    except ValueError:
        return None
    return ProcessStat(
        cpu_seconds=(utime + stime) / ticks_per_second,
        resident_bytes=rss * page_size,
        virtual_bytes=vsize,
        start_time_seconds=boot_time + start / ticks_per_second,
    )


def read_process_stat(proc: Path, boot_time: float) -> ProcessStat | None:
    try:
        text = (proc / "self" / "stat").read_text(errors="replace")
    except OSError:
        return None
    return parse_proc_stat(text, boot_time, os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE"))


def count_open_files(proc: Path) -> int | None:
    """Open file descriptors: the entries of /proc/self/fd (the one listed is counted too: it is open)."""
    try:
        return len(os.listdir(proc / "self" / "fd"))
    except OSError:
        return None
