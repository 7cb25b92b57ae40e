"""The scrape engine: `RdmaCollector` gathers fresh metric families on every scrape.

It is a prometheus_client Collector (`collect()`, for a registry); the daemon calls `gather()` and writes
the text with `FamilySet.render_chunks`, the same bytes prometheus_client's writer gives for those
families (tests/test_exposition.py) at a fraction of its cost (bench/PROFILE.md).

A stuck mlx5 firmware makes sysfs reads block in the kernel, uninterruptibly. The engine therefore never
reads a device on the thread that serves a scrape (the device list and its cache: `inventory.py`; the
reader threads and each device's outstanding jobs: `readers.py`):

- each scrape ("round") submits ONE job per device (its static info when not cached, then every enabled
  source's `read`: first the device's own reads, those that need no firmware (PCIe) first, then its
  netdev reads, see below) to a bounded pool of
  daemon threads, and waits for the jobs until the scrape's deadline; a device whose job has not
  finished is reported as failed for that scrape, in the sources the job has not finished;
- a device whose job from an earlier round is still running gets no new job: it is skipped and says so,
  so a read that never returns holds exactly one thread, whatever the number of scrapes;
- except when that job is stuck in its netdev reads only. Sources that set `needs_rtnl` (netdev:
  class/net attributes such as speed and bonding/slaves; ethtool: the SIOCETHTOOL ioctl) wait in the
  kernel for the rtnl lock, which any other NIC's driver or a busy node can hold for seconds to minutes;
  the device's own files (class/infiniband, PCI config space) need no rtnl. Each job therefore reads the
  other sources first, and a round whose device still has a job in its netdev reads starts a
  "device-only" job beside it, which reads the static info (if not cached) and those other sources and
  skips the netdev ones (reported as not read, like a skipped device's). At most one device-only job is
  outstanding per device: while it runs, the device is skipped as above. So a device never has more than
  one job in its device reads and one in its netdev reads, and an rtnl stall costs the device's netdev
  and ethtool series only, not its InfiniBand and PCIe series;
- likewise, a job stuck in the device's firmware after its firmware-free reads (sources that set
  `firmware_free`: PCIe config space and the PCI core's AER counts) gets a side job beside it in later
  rounds, which reads those sources only, from the static info known: a hung firmware costs the device's
  InfiniBand, hwmon and netdev series, not its PCIe link and AER counters, which may say why. The
  device is still reported skipped. A device has at most one side job of either kind;
- concurrent scrapes join the round in flight (single-flight), each waiting no longer than its own
  deadline, so three Prometheus replicas cost one set of firmware queries; but only until the deadline
  of the scrape that started it (`_Round.joinable_until`): a round held up by a hung read never
  completes, and scrapes that kept joining it would keep getting its old values.

Every family is built anew from the scrape's reads, so a device or port that disappears simply stops
being exported (no stale series). What is kept between scrapes is there to read, write or log less, never
to fill in a value: the static inventory, the cumulative error counts, the kept file descriptors and
which counter files answered, rendered label texts and each family's last text (sent again only while
its samples are all equal to those it was written from), and the log throttles.
"""

from __future__ import annotations

import logging
import os
import platform
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Final

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..parse.infiniband import DeviceInfo, read_device_info
from ..parse.reader import (
    REASON_IO,
    REASON_TIMEOUT,
    REASON_UNSUPPORTED,
    OpenFiles,
    ReadErrors,
    SysfsReader,
    is_sysfs_mount,
    reason_for_errno,
)
from . import readers
from .base import (
    FailureEpisodes,
    FamilySet,
    MetricSpec,
    ScrapeContext,
    SeriesPrefixes,
    Source,
    firmware_free,
    needs_rtnl,
)
from .inventory import DeviceEntry, DeviceFilter, Inventory
from .readers import (
    READS_DEVICE,
    READS_NETDEV,
    DeviceJob,
    DeviceReads,
    SourceOutcome,
    forget_quiet_periods_over,
    shared_reads,
)

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
    "1 if every device answered the collector in this scrape, 0 if any device failed as a whole. "
    'collector="inventory" is the listing of class/infiniband; errors reading a device\'s static '
    'attributes count in rdma_exporter_file_read_errors_total{collector="inventory"}.',
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
DEVICE_EXCLUDED: Final = MetricSpec(
    "rdma_exporter_device_excluded",
    "gauge",
    "1 for an RDMA device listed under class/infiniband that the include/exclude filters skip (none of its "
    "files is read, so it has no other rdma_ series); present only for such devices.",
    ("device",),
)
DISCOVERY_MODE: Final = MetricSpec(
    "rdma_exporter_discovery_mode",
    "gauge",
    "How devices and changes to their static attributes are found, one series per mode, 1 for the one in "
    "use: udev (uevents invalidate the cache, resynced every 15 minutes) or rescan (class/infiniband listed "
    "on every scrape, static attributes re-read every 5 minutes: a fixture tree, no uevent socket, or a "
    "uevent monitor that failed, which the log says).",
    ("mode",),
)
SAMPLE_TREE: Final = MetricSpec(
    "rdma_exporter_sample_tree",
    "gauge",
    "1 when the exporter serves its bundled sample tree of made-up devices (a bare run on a machine without "
    "class/infiniband), not this node's devices; 0 otherwise.",
    (),
)
DEVICE_SKIPPED: Final = MetricSpec(
    "rdma_exporter_device_scrape_skipped",
    "gauge",
    "1 for a device not read in this scrape because its read from an earlier scrape has not returned "
    "(e.g. stuck firmware), but for its PCIe link when that read is past it; present only for such devices. "
    "A device whose netdev reads alone are stuck is read all the same, without them, and is not reported "
    "here.",
    ("device",),
)
DEVICE_BLOCKED: Final = MetricSpec(
    "rdma_exporter_device_read_blocked_seconds",
    "gauge",
    "How long the unfinished read of a device has been running; present only for devices that timed out, "
    'were skipped or were read beside a stuck netdev read in this scrape. reads="device": a read of the '
    "device's own files (static info, PCIe, InfiniBand, hwmon) is unfinished, so none of its series are "
    "served, except its PCIe link and AER counters when the stuck read is past them (InfiniBand, hwmon): "
    "they need no firmware, are read first, and are read again beside such a read in later scrapes; "
    'reads="netdev": only its netdev '
    "reads (netdev and ethtool collectors, which wait for the kernel's rtnl lock) are unfinished, and its "
    "other series are served without them.",
    ("device", "reads"),
)
NODE_BOOT_TIME: Final = MetricSpec(
    "rdma_exporter_node_boot_time_seconds",
    "gauge",
    "When the node booted (as btime of /proc/stat: the wall clock less the time since boot, taken at "
    "start-up), in seconds since the epoch. It changes "
    "when the node reboots, not when the exporter restarts or a scrape fails: the alert rules skip counts "
    "that a reboot disturbs (links retraining, netdevs registered anew) over the hour after one.",
    (),
)
BUILD_INFO: Final = MetricSpec(
    "rdma_exporter_build_info",
    "info",
    "Version of rdma-exporter and the Python that runs it.",
    ("version", "python_version"),
)
ENGINE_SPECS: Final = (
    SCRAPE_DURATION,
    SCRAPE_SUCCESS,
    READ_ERRORS,
    DEVICES,
    DEVICES_EXCLUDED,
    DEVICE_EXCLUDED,
    DISCOVERY_MODE,
    SAMPLE_TREE,
    DEVICE_SKIPPED,
    DEVICE_BLOCKED,
    NODE_BOOT_TIME,
    BUILD_INFO,
)


# What _reading says of a job no reader thread has taken yet.
QUEUED: Final = "the queue"


def _reading(job: DeviceJob) -> str:
    """What an unfinished job is reading: its static info, or the files of which source, and the file
    (counters directory, ioctl) its last read began on, where a read stuck in the kernel is stuck."""
    if job.started is None:
        return QUEUED
    reader = job.reader
    at = f", at {os.fspath(reader.at)}" if reader is not None and reader.at else ""
    if not job.info_done:
        return f"its static info{at}"
    _, current = job.snapshot()
    return f"its {current[0]} files{at}" if current is not None else "its reads"


# Files named in one read-error line; more are counted, not listed.
LOGGED_FILES: Final = 8


def _some_files(files: dict[str, str]) -> str:
    """The messages of up to LOGGED_FILES failed files, in path order, and how many more failed."""
    paths = sorted(files)
    named = "; ".join(files[path] for path in paths[:LOGGED_FILES])
    return named + (f" (and {len(paths) - LOGGED_FILES} more)" if len(paths) > LOGGED_FILES else "")


@dataclass(slots=True)
class _ErrorEpisode:
    """Files of one device that keep failing for one reason: whether its start was logged (not while every
    file in it had been named within the quiet period), the paths failing at its last scrape, and those of
    them no line of this episode has named yet (held back by their quiet periods)."""

    logged: bool
    paths: set[str]
    unnamed: set[str] = field(default_factory=set)


# --- scrape rounds -----------------------------------------------------------------------------------


@dataclass
class _Round:
    """One collection: the jobs it started and what the scrapes waiting for it have already counted."""

    deadline: float  # the latest deadline of the scrapes waiting for it
    # The deadline of the scrape that started it: later scrapes start a round of their own. Joining was
    # open for as long as any joiner waited, and two Prometheus servers whose scrapes overlapped kept one
    # round held up by a hung read alive for as long as the hang: every answer took the full deadline
    # and every healthy device's counters stood still in it.
    joinable_until: float
    entries: list[DeviceEntry]
    jobs: dict[str, DeviceJob]
    skipped: dict[str, DeviceJob]  # devices whose job from an earlier round is still running
    inventory_seconds: float
    inventory_ok: bool
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Set when every job of the round has ended: scrapes wait on this once, not on each job in turn
    # (each wake-up would take the GIL from the reader thread).
    all_done: threading.Event = field(default_factory=threading.Event)
    pending: int = 0
    # Not `lock`: _assemble holds that while it cancels jobs, which ends them.
    pending_lock: threading.Lock = field(default_factory=threading.Lock)
    result: FamilySet | None = None
    # (collector, device) keys, each counted at most once per round whichever scrapes share it. Two sets:
    # a short scrape counting a timeout must not stop a longer one that got the values from recording
    # their read errors.
    timed_out: set[tuple[str, str]] = field(default_factory=set)  # timeout already counted
    recorded: set[tuple[str, str]] = field(default_factory=set)  # an outcome's read errors already counted
    logged: bool = False

    def complete(self) -> bool:
        return all(job.done.is_set() for job in self.jobs.values())

    def job_ended(self) -> None:
        with self.pending_lock:
            self.pending -= 1
            if self.pending <= 0:
                self.all_done.set()


@dataclass
class _CollectorState:
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)


class _Tally:
    """What `_assemble` collects from a round's jobs before any family is built."""

    __slots__ = ("blocked", "devices", "durations", "reading", "results", "rnd", "success")

    def __init__(self, rnd: _Round, sources: Sequence[str]) -> None:
        self.rnd = rnd
        self.durations: dict[str, float] = {INVENTORY: rnd.inventory_seconds, **dict.fromkeys(sources, 0.0)}
        self.success: dict[str, bool] = {INVENTORY: rnd.inventory_ok, **dict.fromkeys(sources, True)}
        self.results: dict[str, dict[str, Any]] = {name: {} for name in sources}  # source -> device -> value
        self.devices = 0
        # (device, READS_DEVICE or READS_NETDEV) -> seconds its unfinished read has been running
        self.blocked: dict[tuple[str, str], float] = {}
        self.reading: dict[str, str] = {}  # device -> what its unfinished read was doing, for the log


class RdmaCollector(Collector):
    """Registered once with a prometheus_client registry; every `collect()` is one scrape."""

    def __init__(
        self,
        sys_root: Path,
        sources: Sequence[Source],
        *,
        device_filter: DeviceFilter | None = None,
        settings: dict[str, dict[str, Any]] | None = None,
        scrape_timeout: float = 8.0,
        reads: DeviceReads | None = None,
        rescan_each_scrape: bool = True,
        sample_tree: bool = False,
        boot_time: int | None = None,
    ) -> None:
        self.sys_root = sys_root
        self.sample_tree = sample_tree
        self.boot_time = boot_time  # of the node, read once: it cannot change while this process runs
        self.sources = list(sources)  # in exposition order
        # Read order: the device's own reads, those that need no firmware first (a hung firmware then
        # still leaves its PCIe link and AER counts to see), then those that wait for rtnl (module docstring).
        self._firmware_free_sources = [s for s in self.sources if firmware_free(s) and not needs_rtnl(s)]
        self._firmware_sources = [s for s in self.sources if not firmware_free(s) and not needs_rtnl(s)]
        self._netdev_sources = [s for s in self.sources if needs_rtnl(s)]
        self.inventory = Inventory(sys_root, device_filter, rescan_each_scrape=rescan_each_scrape)
        self.scrape_timeout = scrape_timeout
        self.reads = reads or shared_reads()
        self._settings = settings or {}
        self._state: dict[str, _CollectorState] = {INVENTORY: _CollectorState()}
        for source in self.sources:
            self._state[source.name] = _CollectorState()
        self._state_lock = threading.Lock()
        self._listed: frozenset[str] = frozenset()  # the devices of the last listing that worked
        # (collector, device) -> its ongoing read-error episodes, by (owner, reason)
        self._erroring: dict[tuple[str, str], dict[tuple[str, str], _ErrorEpisode]] = {}
        # (collector, device, owner, reason, path) -> when a read-error line last named that file
        self._errors_logged: dict[tuple[str, str, str, str, str], float] = {}
        self._failures = FailureEpisodes()  # devices whose static info or a source's read fails
        self._listing_failed: frozenset[str] = frozenset()  # reasons of the listing failure already logged
        self._round_lock = threading.Lock()
        self._round: _Round | None = None
        self._successor: Callable[[], RdmaCollector] | None = None  # set by retire(): new rounds go there
        self._contexts = {s.name: ScrapeContext(sys_root, self._settings.get(s.name, {})) for s in self.sources}
        # Kept-open files of a fixture tree (not sysfs) may outlive their paths: check them (OpenFiles),
        # also when the mounts cannot be read.
        self._verify_files = is_sysfs_mount(sys_root) is not True
        # Series text of the previous scrape, reused by FamilySet.render_text.
        self.prefixes = SeriesPrefixes()

    def describe(self) -> Iterable[Metric]:
        # Families depend on the hardware; describing none stops the registry from calling collect()
        # at registration time.
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self.gather()

    def gather(self, timeout: float | None = None) -> FamilySet:
        """One scrape's families, waiting at most `timeout` seconds (default: the configured deadline).

        Joins the collection in flight unless it is past the deadline of every scrape waiting for it.
        """
        wait = self.scrape_timeout if timeout is None else max(0.0, timeout)
        now = time.monotonic()
        mine = now + wait
        successor = None
        with self._round_lock:
            current = self._round
            if current is not None and current.result is None and now < current.joinable_until:
                current.deadline = max(current.deadline, mine)  # join the round in flight
            elif self._successor is None:
                current = self._round = self._start_round(mine)
            else:
                successor = self._successor  # retired by a reload: new rounds are the successor's
        if successor is not None:
            return successor().gather(max(0.0, mine - time.monotonic()))
        assert current is not None  # joined or started above
        pool = self.reads.pool
        while True:
            remaining = mine - time.monotonic()
            if remaining <= 0 or current.all_done.wait(min(remaining, pool.spill_after)):
                break
            pool.rebalance()  # a job is slow: let another thread take the queue
        families = self._assemble(current)
        if current.result is not None:
            # A finished round is never joined again, so it need not outlive its scrapes. Kept until the
            # next scrape replaced it, its readings and families stayed alive between scrapes, out of
            # reach of the clean-up after the answer, and were freed inside the next scrape.
            with self._round_lock:
                if self._round is current:
                    self._round = None
        return families

    def retire(self, successor: Callable[[], RdmaCollector]) -> None:
        """Hand this collector's new rounds to `successor()`, the newest collector (built by a reload,
        sharing the reads), then wait for the round in flight to end, at most until the deadline of the
        scrapes waiting for it. A getter, not the collector: a chain of retired collectors, each holding
        the next, would be kept alive by a job hung in the first one, a reload after reload.

        The successor would take unfinished jobs of a round here for reads still blocked since an earlier
        scrape: a healthy device skipped, a timeout counted. So the round in flight is let end (past its
        deadline its jobs are abandoned, and that is what they are), and a scrape that took this collector
        before the swap but gathers after it (one that spent the reload in its login's bcrypt check) gathers
        from the successor instead of starting a round here (review, reproduced)."""
        with self._round_lock:
            self._successor = successor
            current = self._round
        if current is not None:
            current.all_done.wait(max(0.0, current.deadline - time.monotonic()))

    # The round is started under _round_lock: listing is one getdents, everything else is a job.
    def _start_round(self, deadline: float) -> _Round:
        started = time.perf_counter()
        errors = ReadErrors()
        entries = self.inventory.scan(errors)
        class_dir = self.inventory.class_dir
        # A missing class/infiniband is a node without RDMA devices (no error counted); a listing that
        # failed (EACCES, EIO) is a failure.
        ok = not errors.counts
        self._record_errors(INVENTORY, errors)
        self._log_listing(errors, class_dir)
        if ok:
            self._forget_removed(frozenset(entry.name for entry in entries))
        jobs: dict[str, DeviceJob] = {}
        skipped: dict[str, DeviceJob] = {}
        rnd = _Round(deadline, deadline, entries, jobs, skipped, 0.0, ok, pending=len(entries) + 1)
        self.reads.prune(class_dir, {class_dir + entry.name for entry in entries})
        claims: dict[str, str] = {}  # the round's own (ScrapeContext.claim_once)
        contexts = {name: replace(context, claims=claims) for name, context in self._contexts.items()}
        for entry in entries:
            key = class_dir + entry.name
            job, new = self.reads.start(
                key,
                entry.name,
                partial(self._read_device, entry=entry, contexts=contexts),
                rnd.job_ended,
                firmware_free_reads=bool(self._firmware_free_sources),
            )
            if new:
                jobs[entry.name] = job
                if job.stall == READS_DEVICE and job.beside is not None:
                    skipped[entry.name] = job.beside  # skipped but for the firmware-free reads of `job`
            else:
                skipped[entry.name] = job
                rnd.job_ended()  # nothing to wait for
        rnd.job_ended()  # the round's own share: all_done cannot be set while jobs are still being added
        rnd.inventory_seconds = time.perf_counter() - started
        return rnd

    def _read_device(self, job: DeviceJob, entry: DeviceEntry, contexts: dict[str, ScrapeContext]) -> None:
        """Runs in a pool thread: static info if not cached, then each source's reads, the device's own
        first (those that need no firmware before the others), then those that need rtnl. A side job
        beside a netdev stall skips the last; one beside a firmware stall reads the firmware-free ones only."""
        info = entry.info
        if job.stall == READS_DEVICE:
            # Not the static info, whose reads reach the firmware: the stuck job's serves if none is cached.
            # Nor the kept files or their record of counter files, which the stuck job is using.
            job.info = info or (job.beside.info if job.beside is not None else None)
            job.info_done = True
            if job.info is not None:
                self._read_sources(job, entry.name, job.info, None, None, self._firmware_free_sources, contexts)
            return
        # A side job runs beside a job that holds the kept files: it reads without any.
        files = None if job.beside is not None else self.reads.files(job.key, verify=self._verify_files)
        memory = self.reads.memory(job.key) if job.beside is not None else files
        if memory is not None:
            # A new device under the old name has answered nothing yet. Checked on every read, not only
            # with static info: a side job may have read and cached the new device's, and in either
            # job, since a driver reload takes rtnl and so stalls the full job's netdev reads.
            memory.adopt(entry.identity[1])
        if info is None:
            if files is not None:
                files.close()  # new static info may name other files (or the device is a new one)
            started = time.perf_counter()
            key = (entry.name, "device info")
            try:
                # With the device's record of answered counters (parse.infiniband.read_port_info).
                reader = job.reader = SysfsReader(entry.name, job.info_errors, memory=memory)
                info = read_device_info(self.sys_root, entry.name, reader)
            except Exception as exc:  # a broken device costs that device only
                self._failures.log_failure(log, key, exc, "cannot read device %s: %s", entry.name, exc)
                reason = reason_for_errno(exc.errno) if isinstance(exc, OSError) else REASON_IO
                job.info_errors.add(entry.name, reason, f"{entry.name}: {exc}")
                job.info_failed = True
            else:
                if self._failures.succeeded(key):
                    log.info("device %s is readable again", entry.name)
            job.info_seconds = time.perf_counter() - started
            job.info_read = True
            if info is not None:
                # An unsupported read (`N/A (no PMA)` in counters_ext/, EOPNOTSUPP) is the device's
                # answer for good: reading the static info again soon would change nothing.
                failed = any(reason != REASON_UNSUPPORTED for _, reason in job.info_errors.counts)
                self.inventory.store(entry, info, complete=info.settled and not failed)
        job.info = info
        job.info_done = True
        if info is None:
            return
        if files is not None:
            files.begin()
        if self._firmware_free_sources:
            self._read_sources(job, entry.name, info, files, memory, self._firmware_free_sources, contexts)
            job.firmware_free_done = True
        self._read_sources(job, entry.name, info, files, memory, self._firmware_sources, contexts)
        job.device_reads_done = True
        if job.beside is None:
            self._read_sources(job, entry.name, info, files, memory, self._netdev_sources, contexts)
        if not os.path.isdir(job.key):
            self.inventory.mark_dirty()  # removed under us: relist even if udev missed it

    def _read_sources(
        self,
        job: DeviceJob,
        name: str,
        info: DeviceInfo,
        files: OpenFiles | None,
        memory: OpenFiles | None,
        sources: Sequence[Source],
        contexts: dict[str, ScrapeContext],
    ) -> None:
        for source in sources:
            job.begin(source.name)
            errors = ReadErrors()
            started = time.perf_counter()
            key = (name, source.name)
            try:
                reader = job.reader = SysfsReader(name, errors, files, memory)
                value = source.read(contexts[source.name], info, reader)
                ok = True
                if reader.static_stale:  # e.g. a netdev it names was renamed: read it again next scrape
                    self.inventory.invalidate(name)
            except Exception as exc:  # one broken device must not take the others down
                message = "collector %s failed on device %s: %s"
                self._failures.log_failure(log, key, exc, message, source.name, name, exc)
                errors.add(name, REASON_IO, f"{name}: {exc!r}")
                value, ok = None, False
            else:
                if self._failures.succeeded(key):
                    log.info("collector %s works again on device %s", source.name, name)
            job.finish(source.name, SourceOutcome(value, errors, time.perf_counter() - started, ok))

    def _assemble(self, rnd: _Round) -> FamilySet:
        """The families of a round as far as it got; cached once every job has finished."""
        with rnd.lock:
            if rnd.result is not None:
                return rnd.result
            complete = rnd.complete()
            now = time.monotonic()
            if not complete and now >= rnd.deadline:
                # Nobody waits any longer: drop jobs that never started, and let the pool replace
                # threads blocked in the kernel.
                self.reads.give_up(list(rnd.jobs.values()))
            tally = _Tally(rnd, [source.name for source in self.sources])
            for entry in rnd.entries:
                skipped = rnd.skipped.get(entry.name)
                if skipped is not None:
                    self._tally_skipped(tally, entry, skipped, rnd.jobs.get(entry.name), now)
                else:
                    self._tally_job(tally, entry.name, rnd.jobs[entry.name], now)
            self._read_excluded(tally.results, tally.success)
            if not rnd.logged:
                rnd.logged = True
                self._log_blocked(tally.blocked, tally.reading, rnd)
            out = FamilySet(self.prefixes)
            for source in self.sources:
                started = time.perf_counter()
                try:
                    source.expose(tally.results[source.name], out)
                except Exception:
                    tally.success[source.name] = False
                    log.exception("collector %s failed to build its metrics", source.name)
                tally.durations[source.name] += time.perf_counter() - started
            self._expose_own(out, rnd, tally.durations, tally.success, tally.devices, tally.blocked)
            if complete:
                rnd.result = out
            return out

    def _tally_skipped(
        self, tally: _Tally, entry: DeviceEntry, skipped: DeviceJob, side: DeviceJob | None, now: float
    ) -> None:
        """A device skipped this round, its job from an earlier round still running: only I/O-free
        sources answer for it, and the firmware-free ones that a side job beside it (`side`) has read;
        the others time out."""
        name = entry.name
        tally.devices += 1
        tally.blocked[name, READS_DEVICE] = now - skipped.stalled_since()
        tally.reading[name] = _reading(skipped)
        known = entry.info or skipped.info
        outcomes = side.snapshot()[0] if side is not None else {}
        for source in self.sources:
            outcome = outcomes.get(source.name)
            if outcome is not None:
                self._take_outcome(tally, name, source.name, outcome)
            elif not self._read_io_free(source, name, known, tally.results, tally.success):
                tally.success[source.name] = False
                self._count_timeout(tally.rnd, source.name, name)

    def _tally_job(self, tally: _Tally, name: str, job: DeviceJob, now: float) -> None:
        """What this round's job for the device has served so far, its errors recorded once a round."""
        rnd = tally.rnd
        tally.devices += 1
        if job.info_done:
            tally.durations[INVENTORY] += job.info_seconds
            if (INVENTORY, name) not in rnd.recorded:
                rnd.recorded.add((INVENTORY, name))
                self._record_errors(INVENTORY, job.info_errors)
                if job.info_read:  # a cached round says nothing about the static files
                    self._log_read_errors(INVENTORY, name, job.info_errors)
            if job.info_failed:
                # Listed all the same: found under class/infiniband, present with its ports unknown,
                # and failed as a whole for every source that reads files.
                for source in self.sources:
                    if not self._read_io_free(source, name, None, tally.results, tally.success):
                        tally.success[source.name] = False
                return
        unfinished = not job.done.is_set() or job.cancelled
        outcomes, current = job.snapshot()
        missing = READS_NETDEV if job.info_done else READS_DEVICE  # the first reads not served
        for source in self.sources:
            outcome = outcomes.get(source.name)
            if outcome is None and self._read_io_free(source, name, job.info, tally.results, tally.success):
                continue
            if outcome is None:
                if not needs_rtnl(source):
                    missing = READS_DEVICE
                tally.success[source.name] = False
                if current is not None and current[0] == source.name:
                    tally.durations[source.name] += time.perf_counter() - current[1]
                self._count_timeout(rnd, source.name, name)
                continue
            self._take_outcome(tally, name, source.name, outcome)
        if job.beside is not None and job.stall == READS_NETDEV and missing == READS_NETDEV:
            # A side job served the device's reads; its netdev reads are the stuck job's.
            tally.blocked[name, READS_NETDEV] = now - job.beside.since()
        elif unfinished:
            tally.blocked[name, missing] = now - job.since()
            tally.reading[name] = _reading(job)

    def _take_outcome(self, tally: _Tally, name: str, source: str, outcome: SourceOutcome) -> None:
        """A source's finished read of the device: its value, duration and success, its errors once a round."""
        # Recorded even if an earlier, shorter scrape of this round counted a timeout here.
        if (source, name) not in tally.rnd.recorded:
            tally.rnd.recorded.add((source, name))
            self._record_errors(source, outcome.errors)
            self._log_read_errors(source, name, outcome.errors)
        tally.durations[source] += outcome.seconds
        tally.success[source] = tally.success[source] and outcome.ok
        if outcome.ok:
            tally.results[source][name] = outcome.value

    def _read_excluded(self, results: dict[str, dict[str, Any]], success: dict[str, bool]) -> None:
        """Listed but filtered out: I/O-free sources see each excluded device as present with its layout
        unknown, so that excluding a misbehaving device does not page it as missing. Its PCI address is
        known from its class link: without it, expectations by address could not be judged."""
        for name, address in self.inventory.excluded_pci.items():
            for source in self.sources:
                read_excluded = getattr(source, "read_excluded", None)
                if read_excluded is not None:
                    results[source.name][name] = read_excluded(address)
                else:
                    self._read_io_free(source, name, None, results, success)

    def _expose_own(
        self,
        out: FamilySet,
        rnd: _Round,
        durations: dict[str, float],
        success: dict[str, bool],
        devices: int,
        blocked: dict[tuple[str, str], float],
    ) -> None:
        """The exporter's own series: per-collector duration, success and read errors, and the devices."""
        for name in self._state:
            if name in durations:
                out.add(SCRAPE_DURATION, [name], durations[name])
                out.add(SCRAPE_SUCCESS, [name], 1 if success[name] else 0)
        # Declared, as DEVICE_BLOCKED below: alerts and runbooks name them, and `curl | grep` should find
        # them before the first error.
        out.declare(READ_ERRORS)
        with self._state_lock:
            for name, state in self._state.items():
                for (device, reason), count in sorted(state.errors.items()):
                    out.add(READ_ERRORS, [name, device, reason], count)
        out.add(DEVICES, [], devices)
        excluded = self.inventory.excluded
        out.add(DEVICES_EXCLUDED, [], len(excluded))
        for name in excluded:
            out.add(DEVICE_EXCLUDED, [name], 1)
        mode = self.inventory.mode
        for known in ("rescan", "udev"):
            out.add(DISCOVERY_MODE, [known], 1 if known == mode else 0)
        out.add(SAMPLE_TREE, [], 1 if self.sample_tree else 0)
        for name in sorted(rnd.skipped):
            out.add(DEVICE_SKIPPED, [name], 1)
        out.declare(DEVICE_BLOCKED)
        for (name, reads), seconds in sorted(blocked.items()):
            out.add(DEVICE_BLOCKED, [name, reads], round(seconds, 3))
        if self.boot_time is not None:
            out.add(NODE_BOOT_TIME, [], self.boot_time)
        out.add(BUILD_INFO, [__version__, platform.python_version()], 1)

    def _read_io_free(
        self,
        source: Source,
        name: str,
        info: DeviceInfo | None,
        results: dict[str, dict[str, Any]],
        success: dict[str, bool],
    ) -> bool:
        """Evaluate an I/O-free source for a listed device whose job cannot (stuck, or not there yet);
        False if the source reads files, which the caller then reports as not read.

        Such a source needs no read, so nothing timed out: the device is in the round's listing, and
        with its static info unknown (first scrape, a re-read stuck in firmware) its value is None,
        "listed, layout unknown". The source fails the round only if it raises.
        """
        if not getattr(source, "io_free", False):
            return False
        if info is None:
            results[source.name][name] = None
            return True
        try:
            # Claims of its own: the collector's base contexts last as long as it (claim_once is per scrape).
            context = replace(self._contexts[source.name], claims={})
            results[source.name][name] = source.read(context, info, SysfsReader(name, ReadErrors()))
        except Exception:
            log.exception("collector %s failed on cached info of %s", source.name, name)
            success[source.name] = False
        return True

    def _log_blocked(self, blocked: dict[tuple[str, str], float], reading: dict[str, str], rnd: _Round) -> None:
        # Once per episode, not once per scrape: a stuck HCA must not flood the journal. Nor once per
        # episode of a device that is slow on every scrape: not again within BLOCKED_LOG_QUIET_SECONDS.
        # What was said is the process's, not this collector's: a reload must not say it again.
        now = time.monotonic()
        said = self.reads.blocked_log
        with said.lock:
            logged = said.logged
            forget_quiet_periods_over(logged, now)
            episodes = sorted(set(blocked) - said.reported)
            new = [key for key in episodes if key not in logged or blocked[key] >= readers.HUNG_READ_SECONDS]
            quiet = [key for key in episodes if key not in new]
            # A quiet episode is not reported yet: once the quiet period is over, a device still blocked is
            # logged then. A read that turns into a hang is logged when it does, once, whatever came before.
            said.reported = set(blocked) - set(quiet)
            hung = {key for key, seconds in blocked.items() if seconds >= readers.HUNG_READ_SECONDS}
            new += sorted(hung - said.hung_reported - set(new))
            said.hung_reported = hung
            logged.update(dict.fromkeys(new, now))
        for name, reads in quiet:
            log.debug("device %s: %s read still missed the scrape deadline (read running for %.1f s)",
                      name, reads, blocked[name, reads])
        for name, reads in new:
            how = "skipped, its read from an earlier scrape is still blocked"
            if reads == READS_NETDEV:
                how = "its netdev reads (which wait for the kernel's rtnl lock) are blocked; its other reads go on"
            elif name not in rnd.skipped:
                how = "no answer before the scrape deadline"
            state, where = "read running", ""
            if reads != READS_NETDEV and name in reading:
                if reading[name] == QUEUED:  # not running: no thread has taken it yet
                    state, where = "queued", ", waiting for a reader thread"
                else:
                    where = f", in {reading[name]}"
            log.warning(
                "device %s: %s (%s for %.1f s%s; not logged again for %d minutes)",
                name, how, state, blocked[name, reads], where, readers.BLOCKED_LOG_QUIET_SECONDS // 60,
            )

    def _log_listing(self, errors: ReadErrors, class_dir: str) -> None:
        # Once per episode, like a blocked read: a listing that fails serves no device at all, so the
        # whole node is unmonitored, and the log must say why without repeating it every scrape.
        reasons = frozenset(reason for _, reason in errors.counts)
        if reasons and reasons != self._listing_failed:
            detail = "; ".join(sorted(set(errors.last.values())))
            log.warning("cannot list the RDMA devices, none is exported until it works again: %s", detail)
        elif not reasons and self._listing_failed:
            log.info("listing %s works again", class_dir.rstrip("/"))
        self._listing_failed = reasons

    def _count_timeout(self, rnd: _Round, collector: str, device: str) -> None:
        # Once per round and device: three replicas timing out on one stuck device count one timeout.
        # It stays counted if a longer scrape of the round gets the values later: the short scrape did
        # serve without them, and a counter never goes back.
        if (collector, device) in rnd.timed_out:
            return
        rnd.timed_out.add((collector, device))
        errors = ReadErrors()
        errors.add(device, REASON_TIMEOUT, f"{device}: no answer before the scrape deadline")
        self._record_errors(collector, errors)

    def _forget_removed(self, listed: frozenset[str]) -> None:
        """Drop the error counts of devices that are no longer listed: their series go with the device,
        as every other series of it does. Kept, they grew without bound as SR-IOV VFs come and go."""
        gone, appeared = self._listed - listed, listed - self._listed
        self._listed = listed
        # The uevent monitor logs its events; in rescan mode this is the only line that says when a
        # device came or went (the first listing names every device the exporter serves).
        for what, names in (("listed", appeared), ("no longer listed", gone)):
            if names:
                shown = sorted(names)
                more = f" and {len(shown) - 16} more" if len(shown) > 16 else ""
                log.info("RDMA devices %s: %s%s (%d in all)", what, ", ".join(shown[:16]), more, len(listed))
        if not gone:
            return
        for device in gone:
            self._failures.forget(device)
            for source in self.sources:
                forget = getattr(source, "forget_device", None)
                if forget is not None:
                    forget(device)
        with self._state_lock:
            for state in self._state.values():
                for key in [key for key in state.errors if key[0] in gone]:
                    del state.errors[key]
            for key in [key for key in self._erroring if key[1] in gone]:
                del self._erroring[key]
            # A device that comes back is a new device: its first broken file is logged at once.
            for named in [named for named in self._errors_logged if named[1] in gone]:
                del self._errors_logged[named]

    def _log_read_errors(self, collector: str, device: str, errors: ReadErrors) -> None:
        """A sysfs file that fails to read (garbage, EIO, a directory in its place) costs its value, counted in
        rdma_exporter_file_read_errors_total: the log names it once per episode, with the file, and says
        when the episode ends. A file that starts failing while the episode of its device and reason goes
        on is named in an "also" line. Not timeouts (the blocked-read lines) nor refusals (the device's
        answer). A file a line named is not named again within BLOCKED_LOG_QUIET_SECONDS: an episode made
        only of such files (one that flaps) is not logged, until a file fails that no line named in that
        time."""
        # Files under the sysfs root only: the ethtool collector logs its failed ioctls and capture files
        # itself (a capture's malformed lines only in _record_errors' debug lines), and a read that raised has its own
        # episode lines (FailureEpisodes).
        root = f"{os.fspath(self.sys_root)}/"
        current: dict[tuple[str, str], dict[str, str]] = {}
        for key, failed in errors.failed.items():
            if key[1] not in (REASON_TIMEOUT, REASON_UNSUPPORTED):
                files = {path: detail for path, detail in failed.items() if path.startswith(root)}
                if files:
                    current[key] = files
        if not current and (collector, device) not in self._erroring:
            return  # the common case, every read of every scrape
        now = time.monotonic()
        started: list[tuple[str, str, dict[str, str]]] = []
        more: list[tuple[str, str, dict[str, str]]] = []
        with self._state_lock:
            episodes = self._erroring.pop((collector, device), {})
            logged = self._errors_logged
            forget_quiet_periods_over(logged, now)
            ended = [key for key, episode in episodes.items() if key not in current and episode.logged]
            for (owner, reason), files in sorted(current.items()):
                episode = episodes.get((owner, reason))
                if episode is None:
                    # Paths, not messages: a file whose bad value changes each scrape is still one file.
                    episode = episodes[owner, reason] = _ErrorEpisode(logged=False, paths=set())
                # Paths that were not failing at the episode's last scrape: a file mended and broken
                # again while its device's other files keep the episode going is news once more.
                seen = files.keys() - episode.paths
                episode.paths = set(files)
                # News is a file no line named within its quiet period: an episode made only of files
                # named lately (one that flaps, or comes and goes with others) stays quiet. A file held
                # back so stays a candidate while it keeps failing: broken again within its quiet period
                # and left broken, it is named once that period is over (fault-injection and diff
                # reviews: it was never named again, and the log's last word on it was "stopped").
                candidates = seen | (episode.unnamed & files.keys())
                news = {path for path in candidates if (collector, device, owner, reason, path) not in logged}
                named: Mapping[str, str] = {}
                if news:
                    if episode.logged:
                        named = {path: files[path] for path in news}
                        more.append((owner, reason, named))
                    else:
                        episode.logged = True
                        named = files  # a start line names every file failing now (past 8, by count)
                        started.append((owner, reason, named))
                    for path in named:
                        logged[collector, device, owner, reason, path] = now
                episode.unnamed = candidates - named.keys()
            for key in [key for key in episodes if key not in current]:
                del episodes[key]
            if episodes:
                self._erroring[collector, device] = episodes
        for owner, reason, files in started:
            log.warning(
                "read errors [%s] %s (%s): %s; counted in rdma_exporter_file_read_errors_total, not logged again "
                "while they go on",
                collector, owner or device, reason, _some_files(files),
            )
        for owner, reason, files in more:
            log.warning("read errors [%s] %s (%s), also: %s", collector, owner or device, reason, _some_files(files))
        for owner, reason in ended:
            log.info("read errors [%s] %s (%s) stopped", collector, owner or device, reason)

    def _record_errors(self, collector: str, errors: ReadErrors) -> None:
        if not errors.counts:
            return
        with self._state_lock:
            self._state[collector].errors.update(errors.counts)
        if log.isEnabledFor(logging.DEBUG):
            for (device, reason), detail in errors.last.items():
                log.debug("read error [%s] %s %s: %s", collector, device, reason, detail)
