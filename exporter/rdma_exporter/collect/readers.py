"""Bounded reader threads: each device's reads run as one job on a pool thread, never on a scrape's.

`DeviceReads` keeps at most one job outstanding per device (plus one side job beside a job stuck in its
netdev reads or in the device's firmware, see the engine's docstring) and the device's kept-open files;
`WorkerPool` runs the jobs with few threads while reads are quick and more while they are slow or stuck.
No Prometheus imports.
"""

from __future__ import annotations

import logging
import math
import resource
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final

from ..parse.infiniband import DeviceInfo
from ..parse.reader import DEFAULT_MAX_OPEN_FILES, FileBudget, OpenFiles, ReadErrors, SysfsReader
from ..threadstart import RetriedStart

# The engine's name: operators filter the journal on it for every line about reads (docs/operations.md).
log = logging.getLogger("rdma_exporter.collect.engine")

# Most devices read in parallel (`--web.read-threads`). Real mlx5 counter reads can be firmware commands
# of ~0.1-1 ms each, which parallel devices hide; on reads that cost only CPU a second thread just fights
# over the GIL (8 threads made fixture scrapes 50% slower than 1, bench/PROFILE.md). So the pool runs
# one job at a time and adds threads only while a job is slow (SPILL_AFTER_SECONDS).
DEFAULT_PARALLELISM: Final = 4
# A job running longer than this lets one more reader thread start on the queue (WorkerPool).
SPILL_AFTER_SECONDS: Final = 0.02
# A job running longer than this is stuck (a firmware command or driver lock that does not return), not
# slow: a device's reads are ~100 firmware commands of 0.1-1 ms. Like an abandoned job it stops counting
# against the parallelism, so that as many stuck devices as read threads cannot keep every other device
# from being read in the same scrape. At most `parallelism` of them: where every device is merely slow
# (busy firmware), reads in parallel stay within twice the read threads, not up to hard_max.
STUCK_AFTER_SECONDS: Final = 1.0
# However many devices are stuck, the pool never holds more threads than this.
HARD_MAX_WORKERS: Final = 64
# Idle pool threads exit after this, so a quiet exporter holds no reader threads.
WORKER_IDLE_SECONDS: Final = 30.0
# A device whose reads miss the deadline again within this long of the last logged episode is not logged
# again (the timeout counters and rdma_exporter_device_read_blocked_seconds still show each one): a slow
# firmware that answers a little after every deadline gave two warnings a scrape.
BLOCKED_LOG_QUIET_SECONDS: Final = 600.0
# A read blocked this long is a hang (RdmaDeviceUnresponsive's threshold), logged whatever the quiet period.
HUNG_READ_SECONDS: Final = 60.0
# What a device's unfinished read is blocked in (the `reads` label of its blocked-seconds metric): its
# own reads, or its netdev reads, which wait for the kernel's rtnl lock.
READS_DEVICE: Final = "device"
READS_NETDEV: Final = "netdev"


@dataclass(slots=True)
class SourceOutcome:
    value: Any
    errors: ReadErrors
    seconds: float
    ok: bool


class DeviceJob:
    """All reads of one device for one round, run by a pool thread; results appear as each source ends."""

    def __init__(
        self,
        key: str,
        device: str,
        work: Callable[[DeviceJob], None],
        *,
        beside: DeviceJob | None = None,
    ) -> None:
        self.key = key
        self.device = device
        self._work = work
        # A side job, started beside the device's job `beside`, which is stuck in `stall`: in its netdev
        # reads (READS_NETDEV), and the side job reads the device's own sources; or in the device's
        # firmware (READS_DEVICE), and it reads the firmware-free sources only. It keeps no files.
        self.beside = beside
        self.stall = None if beside is None else READS_NETDEV if beside.device_reads_done else READS_DEVICE
        self.submitted = time.monotonic()
        self.started: float | None = None
        self.done = threading.Event()
        self.cancelled = False
        self.abandoned = False
        self.running = False
        self.lock = threading.Lock()
        # Filled by the work function, read by the scrapes waiting for it.
        self.info: DeviceInfo | None = None
        self.info_errors = ReadErrors()
        self.info_seconds = 0.0
        self.info_failed = False
        self.info_read = False  # the static info was read in this job, not taken from the cache
        self.info_done = False  # the static-info phase is over (read, cached or failed)
        # The firmware-free sources are read, and there were some: a stall after them is in firmware.
        self.firmware_free_done: bool = False
        # Static info and every source that needs no rtnl are read: what is left are netdev reads.
        self.device_reads_done: bool = False
        self.blocked_in = READS_DEVICE  # what its reads were in when a scrape stopped waiting for it
        self.outcomes: dict[str, SourceOutcome] = {}
        self.current: tuple[str, float] | None = None  # source being read and since when
        self.reader: SysfsReader | None = None  # the reader of the static info or source being read
        self.on_done: Callable[[DeviceJob], None] | None = None
        self.on_round_done: Callable[[], None] | None = None  # set before submission, by the round

    def since(self) -> float:
        return self.started if self.started is not None else self.submitted

    def stalled_since(self) -> float:
        """Since when the device's reads that this job stands in for have been held up: for a side job
        beside a firmware stall, since the stuck job started, whose reads it leaves out."""
        return self.beside.since() if self.beside is not None and self.stall == READS_DEVICE else self.since()

    def begin(self, source: str) -> None:
        with self.lock:
            self.current = (source, time.perf_counter())

    def finish(self, source: str, outcome: SourceOutcome) -> None:
        with self.lock:
            self.outcomes[source] = outcome
            self.current = None

    def snapshot(self) -> tuple[dict[str, SourceOutcome], tuple[str, float] | None]:
        with self.lock:
            return dict(self.outcomes), self.current

    def run(self) -> None:
        if self.started is None:
            self.started = time.monotonic()
        try:
            self._work(self)
        except Exception:  # the work function handles source errors; this is a bug, not a device fault
            log.exception("device job %s failed", self.device)
        finally:
            self._complete()

    def cancel(self) -> None:
        self.cancelled = True
        self._complete()

    def _complete(self) -> None:
        # Drop the callbacks once called: the round holds its jobs, so a job holding the round would make
        # every scrape's readings a reference cycle, freed only whenever the cyclic GC next runs.
        on_done, self.on_done = self.on_done, None
        on_round_done, self.on_round_done = self.on_round_done, None
        # No longer outstanding before it is done: a round starting in between must not see it "stuck".
        if on_done is not None:
            on_done(self)
        self.done.set()
        if on_round_done is not None:
            on_round_done()


class WorkerPool:
    """Daemon threads that run device jobs, created on demand and ended when idle.

    Jobs run one at a time while they are quick: on reads that cost only CPU (files served from memory,
    the driver's counter cache), a second thread would just take turns at the GIL and make every read
    slower. When the running job has taken longer than `spill_after` (firmware latency, a stuck read),
    one more thread starts on the queue, up to `parallelism` at once. The scrape waiting for the jobs is
    the watchdog: it calls `rebalance()` while it waits.

    Besides, every job that has run past `stuck_after` (up to `parallelism` of them) and every abandoned
    job (one some scrape gave up waiting for, probably blocked in the kernel) lets one more thread in,
    and there are never more than `hard_max` threads. Threads are daemons so
    that a read blocked forever cannot stop the process from exiting.
    """

    def __init__(
        self,
        parallelism: int = DEFAULT_PARALLELISM,
        hard_max: int = HARD_MAX_WORKERS,
        idle_seconds: float = WORKER_IDLE_SECONDS,
        spill_after: float = SPILL_AFTER_SECONDS,
        stuck_after: float = STUCK_AFTER_SECONDS,
    ) -> None:
        self.parallelism = max(1, min(parallelism, hard_max))
        self.hard_max = hard_max
        self.idle_seconds = idle_seconds
        self.spill_after = spill_after
        self.stuck_after = max(stuck_after, spill_after)  # a stuck job is a slow one too
        self._cond = threading.Condition()
        self._queue: deque[DeviceJob] = deque()
        self._running: set[DeviceJob] = set()
        self._threads = 0
        self._idle = 0
        self._starting = 0  # threads spawned that have not reached the queue yet
        self._abandoned = 0
        self._serial = 0
        self._starts = RetriedStart(
            log, "cannot start a reader thread (%s); retrying quietly", "reader thread started again")  # fmt: skip

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def abandoned(self) -> int:
        return self._abandoned

    def _capacity(self) -> int:
        """Jobs that may run now: one, plus one per running job that is slow (up to the parallelism), plus
        one per job that is stuck or abandoned."""
        now = time.monotonic()
        slow = stuck = 0
        for job in self._running:
            if job.abandoned or job.started is None:
                continue
            ran = now - job.started
            slow += ran >= self.spill_after
            stuck += ran >= self.stuck_after
        return min(self.hard_max, min(self.parallelism, 1 + slow) + min(stuck, self.parallelism) + self._abandoned)

    def submit(self, job: DeviceJob) -> None:
        with self._cond:
            self._queue.append(job)
            self._wake()

    def rebalance(self) -> None:
        """Let another thread take queued jobs if a running one has become slow."""
        with self._cond:
            if self._queue:
                self._wake()

    def abandon(self, *jobs: DeviceJob) -> None:
        """A scrape stopped waiting for `jobs`: drop those not started, and let another thread in for each
        running one. All under one lock: a thread let in for the first must not take a queued job that the
        same scrape is giving up on (it would read a device nobody waits for, and the log would call the
        read running when it was queued)."""
        cancelled: list[DeviceJob] = []
        with self._cond:
            for job in jobs:
                if job.done.is_set() or job.abandoned:
                    continue
                if not job.running:
                    try:
                        self._queue.remove(job)
                    except ValueError:
                        continue
                    cancelled.append(job)
                else:
                    job.abandoned = True
                    self._abandoned += 1
            self._wake()
        for job in cancelled:
            job.cancel()

    def _wake(self) -> None:
        """Under _cond: get queued jobs running, within capacity (idle threads first, else a new one)."""
        can_start = min(len(self._queue), self._capacity() - len(self._running))
        if can_start <= 0:
            return
        if self._idle:
            self._cond.notify(min(can_start, self._idle))
        # A thread just spawned has not reached the queue yet: count it, or each submit would spawn one.
        if self._idle + self._starting < can_start and self._threads < self.hard_max:
            self._serial += 1
            thread = threading.Thread(target=self._worker, name=f"rdma-read-{self._serial}", daemon=True)
            self._threads += 1
            self._starting += 1
            if not self._starts.start(thread):  # out of tasks or memory: the next rebalance tries again
                self._threads -= 1
                self._starting -= 1

    def _worker(self) -> None:
        with self._cond:
            self._starting -= 1
        while True:
            with self._cond:
                while not self._queue or len(self._running) >= self._capacity():
                    self._idle += 1
                    woken = self._cond.wait(self.idle_seconds)
                    self._idle -= 1
                    if not woken and not self._queue:
                        self._threads -= 1
                        return
                job = self._queue.popleft()
                job.running = True
                job.started = time.monotonic()
                self._running.add(job)
            job.run()
            with self._cond:
                self._running.discard(job)
                if job.abandoned:
                    self._abandoned -= 1
                if self._threads > self._capacity() and not self._queue:
                    self._threads -= 1
                    return


def default_file_budget() -> int:
    """Kept files for a process that did not size its fd limit (the daemon does): half the soft limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_OPEN_FILES
    return max(0, min(DEFAULT_MAX_OPEN_FILES, soft // 2 - 64))


_shared_budget: FileBudget | None = None
_budget_lock = threading.Lock()  # not _shared_lock: shared_reads() builds a DeviceReads while holding it


def shared_budget() -> FileBudget:
    """One budget for every DeviceReads that was not given its own: kept fds are a process resource."""
    global _shared_budget
    with _budget_lock:
        if _shared_budget is None:
            _shared_budget = FileBudget(default_file_budget())
        return _shared_budget


@dataclass(slots=True)
class BlockedLog:
    """What the log has said of blocked reads: their starts (engine's `_log_blocked`) and their ends
    (`DeviceReads._finished`). Kept by DeviceReads, which outlives config reloads, so that a reload does
    not say again what was said: 20 reloads while an HCA was stuck logged its "not logged again for 10
    minutes" line 20 times (daemon review). Keys are (device, reads): READS_DEVICE or READS_NETDEV."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    reported: set[tuple[str, str]] = field(default_factory=set)  # blocked in the last logged round
    logged: dict[tuple[str, str], float] = field(default_factory=dict)  # -> when its start was last logged
    hung_reported: set[tuple[str, str]] = field(default_factory=set)  # blocked past HUNG_READ_SECONDS, logged
    # -> when its end was last logged: by what was blocked, as the starts are (a netdev stall after a
    # device stall had its start logged, not its end)
    returned: dict[tuple[str, str], float] = field(default_factory=dict)


class DeviceReads:
    """The pool, the outstanding jobs of each device directory, and each device's kept-open files.

    A device has at most one job outstanding, plus, while that job is stuck in its netdev reads or, after
    its firmware-free reads, in the device's firmware, at most one side job (module docstring).

    Shared by every collector of the process (one per config reload), so a device that is stuck keeps
    holding one thread across reloads instead of one per collector. A device's `OpenFiles` is used only
    by its (full) job, and closed only when the device has no such job outstanding, so no fd is closed
    under a read; a side job keeps no files (it runs only while the other job holds them).
    """

    def __init__(self, pool: WorkerPool | None = None, budget: FileBudget | None = None) -> None:
        self.pool = pool or WorkerPool()
        self.budget = budget or shared_budget()
        self._lock = threading.Lock()
        self._outstanding: dict[str, DeviceJob] = {}
        self._side: dict[str, DeviceJob] = {}  # beside an outstanding job stuck in some of its reads
        self._files: dict[str, OpenFiles] = {}
        self.blocked_log = BlockedLog()

    def start(
        self,
        key: str,
        device: str,
        work: Callable[[DeviceJob], None],
        on_round_done: Callable[[], None] | None = None,
        *,
        firmware_free_reads: bool = True,
    ) -> tuple[DeviceJob, bool]:
        """Submit a job for `key` (a device directory): (new job, True), or (unfinished job, False).

        The new job is a side job (`beside`) when no side job is outstanding and the device's outstanding
        job has done its device reads and is still in its netdev reads, or has done its firmware-free
        reads and is still in the others, and the caller has firmware-free reads to give it
        (`firmware_free_reads`: a reload may have disabled them). Otherwise the unfinished job returned
        is the one that holds up the device's own reads: the side job if there is one, else the
        outstanding job.

        `on_round_done` is called when a new job completes (or is cancelled), not for an unfinished one.
        """
        with self._lock:
            extra = self._side.get(key)
            if extra is not None:
                return extra, False
            previous = self._outstanding.get(key)
            if previous is None:
                job = self._outstanding[key] = DeviceJob(key, device, work)
            elif previous.device_reads_done or (previous.firmware_free_done and firmware_free_reads):
                job = self._side[key] = DeviceJob(key, device, work, beside=previous)
            else:
                return previous, False
        job.on_done = self._finished
        job.on_round_done = on_round_done
        self.pool.submit(job)
        return job, True

    def outstanding(self) -> int:
        """Jobs not finished, side jobs included."""
        with self._lock:
            return len(self._outstanding) + len(self._side)

    def files(self, key: str, *, verify: bool) -> OpenFiles:
        """The kept-open files of device directory `key`; only its running (full) job may call this."""
        with self._lock:
            files = self._files.get(key)
            if files is None:
                files = self._files[key] = OpenFiles(self.budget, verify=verify)
            return files

    def memory(self, key: str) -> OpenFiles | None:
        """The kept files of `key` if there are any, for what they know of its counter files only: a
        side job reads without them (SysfsReader.memory)."""
        with self._lock:
            return self._files.get(key)

    def open_files(self) -> int:
        """Files kept open now (approximate while jobs run)."""
        with self._lock:
            every = list(self._files.values())
        return sum(len(files) for files in every)

    def prune(self, prefix: str, listed: Collection[str]) -> None:
        """Close the kept files of devices under `prefix` that are no longer listed and not being read."""
        with self._lock:
            gone = [
                key
                for key in self._files
                if key.startswith(prefix) and key not in listed and key not in self._outstanding
            ]
            closing = [self._files.pop(key) for key in gone]
        for files in closing:
            files.close()

    def give_up(self, jobs: Collection[DeviceJob]) -> None:
        for job in jobs:
            if not job.abandoned:  # the first time only: its end must close the episode whose start was logged
                job.blocked_in = READS_NETDEV if job.device_reads_done else READS_DEVICE
        self.pool.abandon(*jobs)

    def _finished(self, job: DeviceJob) -> None:
        with self._lock:
            if self._outstanding.get(job.key) is job:
                del self._outstanding[job.key]
            elif self._side.get(job.key) is job:
                del self._side[job.key]
            # A side job beside a firmware stall shares the stall's episode (both are the device's reads):
            # its return while the stuck job is still out ends nothing, and must not take the place of
            # that end in the quiet period.
            stall_goes_on = job.stall == READS_DEVICE and self._outstanding.get(job.key) is job.beside
        if job.abandoned and stall_goes_on:
            log.debug("device %s: the PCIe read beside its blocked read returned after %.1f s; that read is "
                      "still blocked", job.device, time.monotonic() - job.since())
        elif job.abandoned:
            now = time.monotonic()
            episode = (job.device, job.blocked_in)
            said = self.blocked_log
            with said.lock:
                quiet = (
                    now - said.returned.get(episode, -math.inf) < BLOCKED_LOG_QUIET_SECONDS
                    and now - job.since() < HUNG_READ_SECONDS
                )
                if not quiet:
                    said.returned[episode] = now
                    forget_quiet_periods_over(said.returned, now)
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "device %s: blocked read returned after %.1f s",
                job.device,
                now - job.since(),
            )


_shared_reads: DeviceReads | None = None
_shared_lock = threading.Lock()


def shared_reads() -> DeviceReads:
    """The process-wide reader pool (one process, one bound on reader threads)."""
    global _shared_reads
    with _shared_lock:
        if _shared_reads is None:
            _shared_reads = DeviceReads()
        return _shared_reads


def forget_quiet_periods_over(logged: dict[Any, float], now: float) -> None:
    """Drop the entries of `logged` (what -> when last logged) whose BLOCKED_LOG_QUIET_SECONDS are over."""
    for key in [key for key, at in logged.items() if now - at >= BLOCKED_LOG_QUIET_SECONDS]:
        del logged[key]
