"""Parse what the exporter needs to know about its node from procfs: when it booted.

A reboot retrains every link and re-registers every netdev, so counts over the hour around it (carrier
changes, symbol errors while the PHYs regain lock) are not the fabric's faults; the alert rules skip
such hours by watching the boot time change. A failed scrape or an exporter restart leaves it as it is,
which a count of failed scrapes could not tell apart from a short reboot. Pure functions; no
Prometheus imports.
"""

from __future__ import annotations

import os
from typing import Final

PROC_STAT: Final = "/proc/stat"


def parse_boot_time(stat: str) -> int | None:
    """The `btime` line of /proc/stat: seconds since the epoch at boot; None if it is not there."""
    for line in stat.splitlines():
        name, _, value = line.partition(" ")
        if name == "btime":
            value = value.strip()
            return int(value) if value.isascii() and value.isdigit() else None
    return None


def read_boot_time(path: str | os.PathLike[str] = PROC_STAT) -> int | None:
    """The node's boot time from /proc/stat (the kernel's, not a container's: it has no namespace)."""
    with open(path, encoding="ascii", errors="replace") as stat:
        return parse_boot_time(stat.read())
