"""The scrape engine: a custom prometheus_client Collector that builds fresh families on every scrape.

It keeps the static part of every device (`DeviceInfo`) in an `Inventory`, runs each enabled source's
per-device reads, lets each source expose what it read, and adds the exporter's own health metrics.
Nothing is remembered between scrapes except the static inventory and the cumulative error counts, so
a device or port that disappears simply stops being exported (no stale series).
"""

from __future__ import annotations

import logging
import os
import platform
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..parse.infiniband import CLASS_DIR, DeviceInfo, list_devices, read_device_info
from ..parse.reader import ReadErrors, SysfsReader
from .base import FamilySet, MetricSpec, ScrapeContext, Source

log = logging.getLogger(__name__)

INVENTORY: Final = "inventory"

SCRAPE_DURATION: Final = MetricSpec(
    "rdma_exporter_scrape_collector_duration_seconds",
    "gauge",
    "Time a collector spent in this scrape, summed over devices.",
    ("collector",),
)
SCRAPE_SUCCESS: Final = MetricSpec(
    "rdma_exporter_scrape_collector_success",
    "gauge",
    "1 if every device answered the collector in this scrape, 0 if any device failed as a whole.",
    ("collector",),
)
READ_ERRORS: Final = MetricSpec(
    "rdma_exporter_file_read_errors_total",
    "counter",
    "Files (or ioctls) that could not be read, by collector, device and reason (missing, permission, io, "
    "unsupported, malformed, timeout). Each costs only its own value.",
    ("collector", "device", "reason"),
)
DEVICES: Final = MetricSpec(
    "rdma_exporter_devices",
    "gauge",
    "RDMA devices found under class/infiniband, after the include/exclude filters.",
    (),
)
DEVICES_EXCLUDED: Final = MetricSpec(
    "rdma_exporter_devices_excluded",
    "gauge",
    "RDMA devices skipped by the include/exclude filters (none of their files is read).",
    (),
)
BUILD_INFO: Final = MetricSpec(
    "rdma_exporter_build_info",
    "info",
    "Version of rdma-exporter and the Python that runs it.",
    ("version", "python_version"),
)
ENGINE_SPECS: Final = (SCRAPE_DURATION, SCRAPE_SUCCESS, READ_ERRORS, DEVICES, DEVICES_EXCLUDED, BUILD_INFO)


@dataclass(frozen=True, slots=True)
class DeviceFilter:
    """Include/exclude regexes on RDMA device names, matched in full (`mlx5_[0-7]`, not a substring)."""

    include: re.Pattern[str] | None = None
    exclude: re.Pattern[str] | None = None

    def allows(self, name: str) -> bool:
        if self.include is not None and not self.include.fullmatch(name):
            return False
        return not (self.exclude is not None and self.exclude.fullmatch(name))


@dataclass
class Inventory:
    """Static info of every device, read once and kept until the device changes.

    A device is re-read when its class/infiniband link points somewhere else (driver reload, VF
    re-creation) or when `invalidate` is called (udev change events). Listing the class directory is
    a single getdents, so it is done on every scrape; no file of an excluded device is ever opened.
    """

    sys_root: Path
    device_filter: DeviceFilter = field(default_factory=DeviceFilter)
    _devices: dict[str, tuple[str, DeviceInfo]] = field(default_factory=dict)
    _stale: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    excluded: int = 0

    def invalidate(self, name: str | None = None) -> None:
        """Forget one device's static info (or all of it), so the next scrape reads it again."""
        with self._lock:
            if name is None:
                self._stale.update(self._devices)
            else:
                self._stale.add(name)

    def refresh(self, errors: ReadErrors) -> list[DeviceInfo]:
        reader = SysfsReader("", errors)
        names = list_devices(self.sys_root, reader)
        allowed = [name for name in names if self.device_filter.allows(name)]
        self.excluded = len(names) - len(allowed)
        with self._lock:
            stale, self._stale = self._stale, set()
            current: dict[str, tuple[str, DeviceInfo]] = {}
            for name in allowed:
                try:
                    target = os.readlink(self.sys_root / CLASS_DIR / name)
                except OSError:
                    target = ""  # a plain directory (fixture trees): identity is the name alone
                cached = self._devices.get(name)
                if cached is not None and cached[0] == target and name not in stale:
                    current[name] = cached
                    continue
                try:
                    info = read_device_info(self.sys_root, name, SysfsReader(name, errors))
                except Exception as exc:  # a broken device costs that device only
                    log.warning("cannot read device %s: %s", name, exc)
                    errors.add(name, "io", f"{name}: {exc}")
                    continue
                current[name] = (target, info)
            self._devices = current
        return [info for _, info in current.values()]


@dataclass
class _CollectorState:
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)


class RdmaCollector(Collector):
    """Registered once with a prometheus_client registry; every `collect()` is one scrape."""

    def __init__(
        self,
        sys_root: Path,
        sources: Sequence[Source],
        *,
        device_filter: DeviceFilter | None = None,
        settings: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.sys_root = sys_root
        self.sources = list(sources)
        self.inventory = Inventory(sys_root, device_filter or DeviceFilter())
        self._settings = settings or {}
        self._state: dict[str, _CollectorState] = {INVENTORY: _CollectorState()}
        for source in self.sources:
            self._state[source.name] = _CollectorState()
        self._lock = threading.Lock()

    def describe(self) -> Iterable[Metric]:
        # Families depend on the hardware; describing none stops the registry from calling collect()
        # at registration time.
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families = self._scrape()
        yield from families

    def _scrape(self) -> FamilySet:
        out = FamilySet()
        durations: dict[str, float] = {}
        success: dict[str, bool] = {}

        started = time.perf_counter()
        inventory_errors = ReadErrors()
        devices = self.inventory.refresh(inventory_errors)
        durations[INVENTORY] = time.perf_counter() - started
        success[INVENTORY] = os.path.isdir(self.sys_root / CLASS_DIR)
        self._record_errors(INVENTORY, inventory_errors)

        for source in self.sources:
            ctx = ScrapeContext(self.sys_root, self._settings.get(source.name, {}))
            errors = ReadErrors()
            results: dict[str, Any] = {}
            ok = True
            started = time.perf_counter()
            for device in devices:
                try:
                    results[device.name] = source.read(ctx, device, SysfsReader(device.name, errors))
                except Exception as exc:  # one broken device must not take the others down
                    ok = False
                    log.warning("collector %s failed on device %s: %s", source.name, device.name, exc)
                    errors.add(device.name, "io", f"{device.name}: {exc!r}")
            try:
                source.expose(results, out)
            except Exception:
                ok = False
                log.exception("collector %s failed to build its metrics", source.name)
            durations[source.name] = time.perf_counter() - started
            success[source.name] = ok
            self._record_errors(source.name, errors)

        for name in self._state:
            if name in durations:
                out.add(SCRAPE_DURATION, [name], durations[name])
                out.add(SCRAPE_SUCCESS, [name], 1 if success[name] else 0)
        for name, state in self._state.items():
            for (device, reason), count in sorted(state.errors.items()):
                out.add(READ_ERRORS, [name, device, reason], count)
        out.add(DEVICES, [], len(devices))
        out.add(DEVICES_EXCLUDED, [], self.inventory.excluded)
        out.add(BUILD_INFO, [__version__, platform.python_version()], 1)
        return out

    def _record_errors(self, collector: str, errors: ReadErrors) -> None:
        if not errors.counts:
            return
        self._state[collector].errors.update(errors.counts)
        if log.isEnabledFor(logging.DEBUG):
            for (device, reason), detail in errors.last.items():
                log.debug("read error [%s] %s %s: %s", collector, device, reason, detail)
