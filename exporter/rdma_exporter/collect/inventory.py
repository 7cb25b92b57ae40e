"""The RDMA device list and each device's static info, kept between scrapes until the device changes.

`Inventory` lists class/infiniband (every scrape, or on udev events) and caches what `read_device_info`
returned; the engine's device jobs do the reading, under the scrape deadline. No Prometheus imports here.
"""

from __future__ import annotations

import math
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ..parse.infiniband import CLASS_DIR, DeviceInfo, list_devices, pci_address_of
from ..parse.reader import ReadErrors, SysfsReader, stat_of

# udev mode: relist and re-read static info this often anyway, in case netlink dropped events (ENOBUFS).
UDEV_RESYNC_SECONDS: Final = 900.0
# Rescan mode has no change events (netdev renames, firmware updates): re-read static info this often.
RESCAN_STATIC_MAX_AGE: Final = 300.0
# Static info whose read failed somewhere is read again this soon, in either mode: a transient failure
# (EIO during a firmware reset) must not cost its values until the next uevent or resync, nor, when it was
# a listing such as counters/, every value behind it.
STATIC_RETRY_SECONDS: Final = 60.0


@dataclass(frozen=True, slots=True)
class DeviceFilter:
    """Include/exclude regexes on RDMA device names, matched in full (`mlx5_[0-7]`, not a substring)."""

    include: re.Pattern[str] | None = None
    exclude: re.Pattern[str] | None = None

    def allows(self, name: str) -> bool:
        if self.include is not None and not self.include.fullmatch(name):
            return False
        return not (self.exclude is not None and self.exclude.fullmatch(name))


# --- inventory ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    """One listed device for one round: its cached static info, or None when the job must read it."""

    name: str
    # (class/infiniband link target, device directory inode): a change in either is a new device under an
    # old name. The inode catches a driver reload, which keeps the link target, between two listings, on
    # kernels since 4.14 (they number a re-created kernfs directory anew; older ones may reuse the number).
    identity: tuple[str, int]
    info: DeviceInfo | None
    epoch: tuple[int, int]  # invalidation generation when listed; a late static read must not undo one


class Inventory:
    """The device list and the static info of every device, kept until the device changes.

    Rescan mode (no udev: containers, fixture trees) lists class/infiniband on every scrape (a single
    getdents, plus a stat and a readlink per device) and re-reads a device's static info when its link
    target or its directory's inode changes (driver reload, VF re-creation) or after
    RESCAN_STATIC_MAX_AGE. Udev mode lists only when the hotplug monitor said something changed
    (`mark_dirty`, `invalidate`), plus a periodic resync.
    In either mode, static info whose read had errors, or that is not settled (a PCIe capability read
    while the device was in reset), is read again after STATIC_RETRY_SECONDS.
    Static info itself is read by the device's job, under the scrape deadline.
    """

    def __init__(
        self,
        sys_root: Path,
        device_filter: DeviceFilter | None = None,
        *,
        rescan_each_scrape: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sys_root = sys_root
        # The class directory as a str with its separator: device paths are built from it every scrape.
        self.class_dir = os.fspath(sys_root / CLASS_DIR) + os.sep
        self.device_filter = device_filter or DeviceFilter()
        self.rescan_each_scrape = rescan_each_scrape
        self._clock = clock
        self._lock = threading.Lock()
        self._listing: list[tuple[str, tuple[str, int]]] | None = None  # (name, identity) of allowed devices
        # When udev mode last relisted and re-read everything (never, before the first scan). Not moved
        # by the relists that events cause: on a node with an event every few minutes the resync would
        # never come.
        self._resynced_at = -math.inf
        # name -> (identity, info, read at, read without errors)
        self._cache: dict[str, tuple[tuple[str, int], DeviceInfo, float, bool]] = {}
        self._epoch_all = 0
        self._epochs: dict[str, int] = {}
        # Listed devices the filters skip, with their PCI address (from the class link alone), or None.
        # One dict swapped whole, so that a scrape never sees names and addresses of different listings.
        self.excluded_pci: dict[str, str | None] = {}

    @property
    def excluded(self) -> tuple[str, ...]:
        return tuple(self.excluded_pci)

    @property
    def mode(self) -> str:
        return "rescan" if self.rescan_each_scrape else "udev"

    def invalidate(self, name: str | None = None) -> None:
        """Forget one device's static info (or everyone's) and relist: the next scrape reads it again."""
        with self._lock:
            if name is None:
                self._epoch_all += 1
                self._cache.clear()
                self._resynced_at = self._clock()  # this is a resync: the next is due a period later
            else:
                self._epochs[name] = self._epochs.get(name, 0) + 1
                self._cache.pop(name, None)
            self._listing = None

    def mark_dirty(self) -> None:
        """The device set may have changed: relist on the next scrape (static info is kept)."""
        with self._lock:
            self._listing = None

    def cached(self) -> dict[str, DeviceInfo]:
        with self._lock:
            return {name: cached[1] for name, cached in self._cache.items()}

    def scan(self, errors: ReadErrors) -> list[DeviceEntry]:
        now = self._clock()
        with self._lock:
            resync = not self.rescan_each_scrape and now - self._resynced_at >= UDEV_RESYNC_SECONDS
            if resync:  # also when an event since the last scrape already asked for a relist
                self._epoch_all += 1
                self._cache.clear()
            if self.rescan_each_scrape or self._listing is None or resync:
                self._listing = self._list(errors)
                if resync:
                    self._resynced_at = now
                listed = {name for name, _ in self._listing}
                self._cache = {n: v for n, v in self._cache.items() if n in listed}
                # Epochs of names no longer listed go too, or one per VF name ever invalidated piles up.
                # A pruned name's epoch starts again at 0, so no job listed before may store under it.
                if any(n not in listed for n in self._epochs):
                    self._epochs = {n: e for n, e in self._epochs.items() if n in listed}
                    self._epoch_all += 1
            listing = self._listing
            if errors.counts:  # a listing that failed is no listing: udev mode too lists again next scrape
                self._listing = None
            entries = []
            max_age = RESCAN_STATIC_MAX_AGE if self.rescan_each_scrape else math.inf
            for name, identity in listing:
                cached = self._cache.get(name)
                info = None
                if cached is not None and cached[0] == identity:
                    age = now - cached[2]
                    if age < max_age and (cached[3] or age < STATIC_RETRY_SECONDS):
                        info = cached[1]
                entries.append(DeviceEntry(name, identity, info, (self._epoch_all, self._epochs.get(name, 0))))
            return entries

    def store(self, entry: DeviceEntry, info: DeviceInfo, *, complete: bool = True) -> None:
        """Cache static info a job read, unless the device was invalidated since it was listed.

        `complete` is False when some static read failed or the info is not settled: the info is then
        kept STATIC_RETRY_SECONDS only.
        """
        with self._lock:
            if entry.epoch == (self._epoch_all, self._epochs.get(entry.name, 0)):
                self._cache[entry.name] = (entry.identity, info, self._clock(), complete)

    def _list(self, errors: ReadErrors) -> list[tuple[str, tuple[str, int]]]:
        # A link that leads nowhere is a device in the middle of its removal, not a device without attributes.
        listed = list_devices(self.sys_root, SysfsReader("", errors))
        allowed: list[tuple[str, int]] = []
        excluded: list[str] = []
        for name in listed:
            wanted = self.device_filter.allows(name)
            # Gone, or a link into nothing: not a device now. Anything else (EACCES) hides a device that is
            # there, which must not pass in silence (fuzz review), unless it is filtered out: a reader of
            # its own keeps those errors.
            found = stat_of(self.class_dir + name, SysfsReader(name, errors) if wanted else SysfsReader(name))
            if found is None or not stat.S_ISDIR(found.st_mode):
                continue
            if wanted:
                allowed.append((name, found.st_ino))
            else:
                excluded.append(name)
        self.excluded_pci = {name: pci_address_of(self.sys_root, name) for name in excluded}
        listing = []
        for name, inode in allowed:
            try:
                target = os.readlink(self.class_dir + name)
            except OSError:
                target = ""  # a plain directory (fixture trees): identity is its inode alone
            listing.append((name, (target, inode)))
        return listing
