"""Counter values that move between scrapes, as on a node that carries traffic.

A generated tree holds the same values for the whole run, which a real node never does: its data,
packet, CNP and ECN counters move every second, and its temperatures wander. An exporter that kept
anything keyed on what it read (a parsed capture, the text of a family) would look cheaper on a
still tree than on a node. `Traffic.advance` rewrites every non-zero file under `counters/`,
`counters_ext/`, `hw_counters/` or `statistics/`, and every non-zero `ethtool -S` capture value, to a
larger number, and moves each temperature reading by a degree. What a healthy node under load keeps
still stays still: zero counters (a healthy port's errors), AER counts and carrier changes. Files are
written in place (same inode), so that a kept-open file reads the new value, as a kept sysfs file does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from pathlib import Path
from typing import Final

# hw_counters' lifespan is a setting (milliseconds between firmware refreshes), not a count.
SETTINGS: Final = frozenset({"lifespan"})
_CAPTURE_VALUE: Final = re.compile(r"^(\s*.+: )(\d+)$", re.MULTILINE)
_TEMPERATURE: Final = re.compile(r"temp[0-9]+_input")


def _step(base: int) -> int:
    # About a thousandth of what the counter already holds: a busy port's data counter gains that much in
    # a scrape interval, and the digit count of the values stays as it was.
    return max(1, base // 1000)


class Traffic:
    """The moving files of one tree: counters under `counter_dirs`, temperatures, ethtool captures."""

    def __init__(self, sys_root: Path, ethtool_dir: Path | None, counter_dirs: Collection[str]) -> None:
        self.counters: list[tuple[str, int]] = []  # path, value in the generated tree
        self.temperatures: list[tuple[str, int]] = []
        self.captures: list[tuple[str, str]] = []  # path, text in the generated tree
        self.rounds = 0
        # The real files live under devices/; class/ and bus/ only link to them.
        for top, _dirs, files in os.walk(sys_root / "devices"):
            counting = os.path.basename(top) in counter_dirs
            for name in files:
                path = os.path.join(top, name)
                if counting and name not in SETTINGS:
                    value = _read_uint(path)
                    if value:
                        self.counters.append((path, value))
                elif _TEMPERATURE.fullmatch(name):
                    value = _read_uint(path)
                    if value is not None:
                        self.temperatures.append((path, value))
        if ethtool_dir is not None:
            for entry in sorted(ethtool_dir.iterdir()):
                self.captures.append((str(entry), entry.read_text()))

    def __len__(self) -> int:
        """Files rewritten by each `advance`."""
        return len(self.counters) + len(self.temperatures) + len(self.captures)

    def advance(self) -> None:
        self.rounds += 1
        n = self.rounds
        for path, base in self.counters:
            _write(path, f"{base + n * _step(base)}\n")
        for path, base in self.temperatures:
            _write(path, f"{base + 1000 * (n % 2)}\n")  # millidegrees: up a degree, back down
        for path, text in self.captures:
            _write(path, _CAPTURE_VALUE.sub(lambda m: _moved(m, n), text))


def _moved(match: re.Match[str], n: int) -> str:
    base = int(match.group(2))
    return match.group(1) + (str(base + n * _step(base)) if base else "0")


def _read_uint(path: str) -> int | None:
    try:
        with open(path) as file:
            text = file.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _write(path: str, text: str) -> None:
    # Over the old text, then cut to length: the file never reads empty (a truncate first would leave it
    # so for a moment). The bench writes between rounds only; this is for any reader that overlaps.
    fd = os.open(path, os.O_WRONLY)
    try:
        data = text.encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
