"""Safe reading of single sysfs attribute files.

Every read goes through `SysfsReader` so that one bad file costs exactly one value: errors never raise,
they are recorded in a `ReadErrors` tally (by device and reason) that the exposition layer turns into
the `rdma_exporter_file_read_errors_total` counter. No Prometheus imports here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

_Parsed = TypeVar("_Parsed")

# Largest value a kernel counter file can hold (u64). Anything larger is garbage, not a counter.
U64_MAX: Final = 2**64 - 1
# Its digits. A longer run of digits is garbage too, and int() refuses one of over 4300 digits with a
# ValueError instead of returning it: digits are bounded before int() sees them.
U64_DIGITS: Final = len(str(U64_MAX))

# No attribute this exporter reads comes near this (the longest, AER counts, are about 1 KiB; a page is
# 4 or 64 KiB): a read that reaches it is of a file that is not such an attribute (SysfsReader._decode).
_READ_LIMIT: Final = 8192
# Kept files are re-read with this first: nearly every attribute is shorter, and a buffer this small
# comes from Python's small-object allocator instead of an 8 KB malloc shrunk afterwards (fragmentation).
_SMALL_READ: Final = 448

# Reasons are a fixed, bounded set because they become a label value.
REASON_MISSING: Final = "missing"  # listed or required, but gone (ENOENT/ENODEV race, removed device)
REASON_PERMISSION: Final = "permission"  # EACCES/EPERM
REASON_IO: Final = "io"  # EIO, EINVAL, EBUSY, EAGAIN and other kernel-side failures
REASON_UNSUPPORTED: Final = "unsupported"  # EOPNOTSUPP, or the "N/A (no PMA)" placeholder
REASON_MALFORMED: Final = "malformed"  # empty, garbage, or out of range for the attribute
REASON_TIMEOUT: Final = "timeout"  # the read did not finish before the scrape deadline

NO_PMA: Final = "N/A (no PMA)"
_NO_PMA_BYTES: Final = NO_PMA.encode()


def _gave_value(data: bytes) -> bool:
    """Whether a read that succeeded gave a value: pre-4.20 kernels answer a PMA query that failed, or a
    device without a PMA, with the NO_PMA text instead of an errno."""
    return not data.startswith(_NO_PMA_BYTES)

# Some show() methods fail to mean "no value in this state", not "broken": carrier/speed of an
# administratively down netdev and the ndev of an unpopulated GID entry answer EINVAL, phys_port_name of
# a netdev that is not a switchdev port answers EOPNOTSUPP. Pass as `absent_errnos` for such attributes.
NO_VALUE_ERRNOS: Final = frozenset({errno.EINVAL, errno.EOPNOTSUPP, errno.ENODATA})
# gid_attrs/{ndevs,types}/N have one more: up to Linux 4.18 they read the port's GID cache, which
# answers EAGAIN for an unpopulated entry of a RoCE port (__ib_cache_gid_get), and ib_query_gid() gave
# no attributes at all for an IB port (EINVAL, for populated entries too).
GID_ATTR_NO_VALUE_ERRNOS: Final = NO_VALUE_ERRNOS | {errno.EAGAIN}


# What a counter file answers when the device will not give that value: any failed PMA query is EINVAL
# (get_perf_mad), and so is a firmware command the function may not issue (the "limited" PFs of HGX
# B200/B300 boards may not read the port counter register; a ConnectX-7 port in switching mode refuses
# VL15_dropped); EOPNOTSUPP and ENOSYS are drivers without the query. A counter file that has answered
# nothing else since the device was first read is unsupported, not broken (SysfsReader.uints).
COUNTER_REFUSALS: Final = frozenset({errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS})
# A refused counter file is tried again this long after its last refusal: once a minute instead of every
# scrape for a function that may never read it, and a refusal that was transient (a failed PMA query at
# start-up) hides the value for a minute at most.
REFUSAL_RETRY_SECONDS: Final = 60.0
# The clock of those retries (tests move it).
refusal_clock: Callable[[], float] = time.monotonic


def reason_for_errno(code: int | None) -> str:
    if code in (errno.ENOENT, errno.ENODEV, errno.ENXIO):
        return REASON_MISSING
    if code in (errno.EACCES, errno.EPERM):
        return REASON_PERMISSION
    if code in (errno.EOPNOTSUPP, errno.ENOSYS):
        return REASON_UNSUPPORTED
    return REASON_IO


@dataclass
class ReadErrors:
    """Tally of failed reads in one scrape, keyed by (device, reason).

    `device` is the RDMA device or netdev the file belongs to; "" for files of no device.
    `last` keeps the latest message per key for debug logging. `failed` maps each thing that failed (a
    file's path; a device or netdev name for other reads) to its latest message, so that the log can
    name every file of a device that fails, not only the last one read: at most the files one scrape
    reads, and gone with the scrape.
    """

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    last: dict[tuple[str, str], str] = field(default_factory=dict)
    failed: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)

    def add(self, device: str, reason: str, detail: str, what: str | None = None) -> None:
        """`detail` is "what: why"; `what` is given where it may itself hold ": " (a path)."""
        key = (device, reason)
        self.counts[key] += 1
        self.last[key] = detail
        self.failed.setdefault(key, {})[detail.split(": ", 1)[0] if what is None else what] = detail

    def total(self) -> int:
        return sum(self.counts.values())


def _page_size() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 4096


# A kept sysfs file holds its seq_file buffer, one page of kernel memory charged to the exporter's
# cgroup: 4 KiB on x86_64, 64 KiB on many aarch64 kernels. The default number of kept files is
# therefore a memory bound: 16384 files with 4 KiB pages, 1024 with 64 KiB.
KEPT_FILES_KERNEL_MEMORY: Final = 64 * 1024 * 1024
DEFAULT_MAX_OPEN_FILES: Final = KEPT_FILES_KERNEL_MEMORY // _page_size()


class FileBudget:
    """How many attribute files all devices together may keep open (each costs an fd and a page of kernel
    memory for the seq_file buffer), shared by every device's `OpenFiles`."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.used = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.used >= self.limit:
                return False
            self.used += 1
            return True

    def give(self, count: int) -> None:
        with self._lock:
            self.used -= count


class _KeptDir:
    """The kept files of one directory, by name; on a non-sysfs tree also the directory as it was when
    its first file was kept (inode, mtime), to notice files deleted or replaced since."""

    __slots__ = ("fds", "inode", "mtime_ns", "settled")

    def __init__(self, inode: int = 0, mtime_ns: int = 0, *, settled: bool = True) -> None:
        self.fds: dict[str, int] = {}
        self.inode = inode
        self.mtime_ns = mtime_ns
        self.settled = settled


# A kept fd failing with one of these means the file itself went away (a removed kernfs node answers
# ENODEV): open the path again, which finds a re-created device or reports the real error.
REOPEN_ERRNOS: Final = frozenset({errno.ENODEV, errno.ENOENT, errno.ESTALE, errno.EBADF})

# A PCI function name, domain:bus:device.function; the domain can be wider than 4 digits (Intel VMD).
PCI_ADDRESS: Final = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def pci_slot(address: str) -> str:
    """domain:bus:device, the card, of a PCI function address (0000:3b:00.1 -> 0000:3b:00)."""
    return address.rpartition(".")[0]


def pci_function(device_dir: str | Path) -> Path | None:
    """The PCI function behind `<dev>/device` (an RDMA device's or a netdev's), None for a device of no
    PCI function (rxe, siw, software netdevs) or a dangling link."""
    try:
        resolved = Path(os.path.realpath(f"{os.fspath(device_dir)}/device"))
    except OSError:
        return None
    if not os.path.isdir(resolved) or not PCI_ADDRESS.match(resolved.name):  # isdir: any failure is "no"
        return None
    return resolved

# A directory whose mtime is older than this is "settled": any later unlink or rename in it moves its
# mtime past the recorded one, even with the coarse (jiffy) timestamps of file systems.
_SETTLE_NS: Final = 2_000_000_000


class OpenFiles:
    """One device's attribute files, kept open between scrapes and re-read with one pread at offset 0.

    Sysfs runs the attribute's show() again for every read at offset 0, so a kept file gives a fresh
    value for one syscall instead of three (open, read, close). A kernfs node that was removed answers
    ENODEV: then (REOPEN_ERRNOS) the fd is dropped and the path opened afresh, which finds a re-created
    device or reports the real error. Any other error is the attribute's own (EIO from firmware): the fd
    is dropped and the error raised, without a second read. Only the thread running the device's job may
    use it (the engine guarantees one job per device at a time). The one exception is the record of
    answered and refused counter files (`note_answered`, `refuse`), which a device-only job beside it also
    writes: the engine starts that job only once the full job is past the device's own reads, so the two
    never write the same directory's entry (the side job beside a firmware stall uses neither). Files are
    kept by directory, then by (interned) name.

    On a tree that is not sysfs (fixtures), a file deleted or replaced under a kept fd stays readable, so
    `verify` makes `begin()` stat each directory of kept files once per scrape and drop the files of a
    directory that changed. Until a directory has been quiet for two seconds its mtime cannot prove that
    (timestamps are coarse), so meanwhile each read of its files checks st_nlink with an fstat.
    """

    __slots__ = ("_answered", "_budget", "_dirs", "device_inode", "refused", "verify")

    def __init__(self, budget: FileBudget, *, verify: bool = False) -> None:
        self._budget = budget
        self.verify = verify
        self._dirs: dict[str, _KeptDir] = {}
        # Names (by directory) of files that have given a value through this object: for the life of the
        # device, so that a counter that worked and now fails stays a fault (SysfsReader.uints). Tuples,
        # not sets: a set per directory of every device cost 1.1 MB on 128 devices; this is read only when
        # a read fails and grows only on a file's first read.
        self._answered: dict[str, tuple[str, ...]] = {}
        # Counter files (by directory) that have refused every read, with when they last did: left out
        # until REFUSAL_RETRY_SECONDS later.
        self.refused: dict[str, dict[str, float]] = {}
        # The device directory's inode when the records above began (adopt), None before it is known.
        self.device_inode: int | None = None

    def __len__(self) -> int:
        return sum(len(kept.fds) for kept in list(self._dirs.values()))

    def begin(self) -> None:
        """Before a scrape's reads: give files back if the budget was lowered (a reload), and on a
        non-sysfs tree forget files whose directory changed."""
        if self._budget.used > self._budget.limit:
            self.close()  # reopened within the new budget as they are read
            return
        if not self.verify or not self._dirs:
            return
        now = time.time_ns()
        for directory, kept in list(self._dirs.items()):
            try:
                stat = os.stat(directory)
            except OSError:
                self._drop_dir(directory)
                continue
            if stat.st_ino != kept.inode or stat.st_mtime_ns != kept.mtime_ns:
                self._drop_dir(directory)
            elif not kept.settled and now - stat.st_mtime_ns > _SETTLE_NS:
                # A file replaced within the same timestamp tick as the recorded mtime left no trace on
                # the directory: check every kept file once before trusting the directory from now on.
                for name, fd in list(kept.fds.items()):
                    try:
                        gone = os.fstat(fd).st_nlink == 0
                    except OSError:
                        gone = True
                    if gone:
                        self._forget(kept, name)
                kept.settled = True

    def trusted(self, directory: str) -> dict[str, int] | None:
        """The kept fds of `directory` by name, if they can be read without further checks."""
        kept = self._dirs.get(directory)
        return kept.fds if kept is not None and kept.settled else None

    def read(self, path: str) -> bytes:
        """The first page of `path`; raises OSError like open/read would."""
        directory, _, name = path.rpartition("/")
        kept = self._dirs.get(directory)
        fd = kept.fds.get(name) if kept is not None else None
        if fd is not None and kept is not None:
            try:
                if kept.settled or os.fstat(fd).st_nlink:
                    data = os.pread(fd, _SMALL_READ, 0)
                    if len(data) == _SMALL_READ:
                        # The rest continues this read (sysfs serves it from the same show()), not a new one.
                        data += os.pread(fd, _READ_LIMIT - _SMALL_READ, _SMALL_READ)
                    if data:
                        return data
                # Empty (a bond's slaves with none left) or replaced on a fixture tree: open the path afresh.
                # Older kernels, whose seq_file did not reset its iterator on a read at offset 0, answer an
                # fd that once read empty with nothing for good, whatever the attribute shows since.
                self._forget(kept, name)
            except OSError as exc:
                self._forget(kept, name)
                if exc.errno not in REOPEN_ERRNOS:
                    raise  # the attribute failed (EIO, ETIMEDOUT...): one firmware query, one error
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = _read_fd(fd)  # not pread: a fixture may put a FIFO here to stall the read
        except OSError:
            os.close(fd)
            raise
        # Once per file while kept (the reads above are the first); every read of a file kept nowhere.
        if _gave_value(data):
            self._note_answered(directory, name)
        # Not kept if empty: see above.
        if data and self._budget.used < self._budget.limit and self._budget.take():  # unlocked check first
            if kept is None:
                kept = self._watch(directory)
            if kept is not None:
                kept.fds[sys.intern(name)] = fd
                return data
            self._budget.give(1)
        os.close(fd)
        return data

    def _watch(self, directory: str) -> _KeptDir | None:
        """Start keeping files of `directory`; on a non-sysfs tree, only if it can be watched."""
        if not self.verify:
            kept = self._dirs[directory] = _KeptDir()
            return kept
        try:
            stat = os.stat(directory)
        except OSError:
            return None
        kept = self._dirs[directory] = _KeptDir(stat.st_ino, stat.st_mtime_ns, settled=False)
        return kept

    def forget(self, directory: str, name: str) -> None:
        """Close the kept file `directory/name`, if any: its next read opens the path afresh."""
        kept = self._dirs.get(directory)
        if kept is not None and name in kept.fds:
            self._forget(kept, name)

    def _forget(self, kept: _KeptDir, name: str) -> None:
        _close(kept.fds.pop(name))
        self._budget.give(1)

    def _drop_dir(self, directory: str) -> None:
        kept = self._dirs.pop(directory)
        for fd in kept.fds.values():
            _close(fd)
        self._budget.give(len(kept.fds))

    def _note_answered(self, directory: str, name: str) -> None:
        answered = self._answered.get(directory, ())
        if name not in answered:
            self._answered[directory] = (*answered, sys.intern(name))

    def note_answered(self, path: str) -> None:
        """Record that `path` gave a value through a read that did not use these files (a device-only job)."""
        directory, _, name = path.rpartition("/")
        self._note_answered(directory, name)

    def has_answered(self, path: str) -> bool:
        """Whether `path` has given a value through this object."""
        directory, _, name = path.rpartition("/")
        return name in self._answered.get(directory, ())

    def refuse(self, path: str) -> None:
        """Leave the counter file `path` out of reads for REFUSAL_RETRY_SECONDS."""
        directory, _, name = path.rpartition("/")
        self.refused.setdefault(directory, {})[sys.intern(name)] = refusal_clock()

    def adopt(self, device_inode: int) -> None:
        """Tie the answered and refused records to the device directory with inode `device_inode`, and
        forget them if they were of another one: a driver reload (after a firmware update, say) re-creates
        the device under the same name and path, and what the old firmware answered says nothing of the
        new. Kernels since 4.14 number a re-created kernfs directory anew; older ones may give it its old
        number back, and then the records stay."""
        if self.device_inode is not None and device_inode != self.device_inode:
            self._answered.clear()
            self.refused.clear()
        self.device_inode = device_inode

    def close(self) -> None:
        for directory in list(self._dirs):
            self._drop_dir(directory)

    def __del__(self) -> None:
        # A collector dropped without closing (a reload, a test) must not leak its fds.
        with contextlib.suppress(Exception):
            self.close()


def _close(fd: int) -> None:
    # Linux frees the fd even when close(2) reports an error, and a read-only fd has nothing to flush:
    # the error must not fail a read, nor leave the other fds of a directory and their budget behind.
    with contextlib.suppress(OSError):
        os.close(fd)


def _unescape_mount(path: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def mount_types(mountinfo: str) -> dict[str, str]:
    """Mount point -> filesystem type, from a /proc/<pid>/mountinfo text.

    A later mount on the same point hides the earlier one, as in the kernel; lines that do not parse are
    ignored.
    """
    types: dict[str, str] = {}
    for line in mountinfo.splitlines():
        fields, sep, tail = line.partition(" - ")
        parts = fields.split(" ")
        if sep and len(parts) >= 5 and tail:
            types[_unescape_mount(parts[4])] = tail.split(" ", 1)[0]
    return types


def sysfs_mount_points(mountinfo: str) -> frozenset[str]:
    """Mount points of sysfs in a /proc/<pid>/mountinfo text."""
    return frozenset(point for point, fstype in mount_types(mountinfo).items() if fstype == "sysfs")


def is_sysfs_mount(path: str | os.PathLike[str], mountinfo: str = "/proc/self/mountinfo") -> bool | None:
    """True if a sysfs is mounted at `path` (the live kernel's view), False if not (a fixture tree).

    None when the mount table cannot be read: each caller decides what is the safe guess.
    """
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as mounts:
            text = mounts.read()
    except OSError:
        return None
    return os.path.realpath(path) in sysfs_mount_points(text)


class SysfsReader:
    """Reads attribute files, recording failures against a device.

    One reader is used per device (or netdev) and per scrape, so the errors it records can be
    attributed without passing the device name to every call.
    """

    __slots__ = ("at", "device", "errors", "files", "files_read", "memory", "static_stale")

    def __init__(
        self,
        device: str,
        errors: ReadErrors | None = None,
        files: OpenFiles | None = None,
        memory: OpenFiles | None = None,
    ) -> None:
        self.device = device
        self.errors = errors if errors is not None else ReadErrors()
        # Files read (kept-open ones included), which tests count; bench.py counts a scrape's with strace.
        self.files_read = 0
        # Per-scrape reads of a device go through its kept-open files; static reads pass none.
        self.files = files
        # Which counter files have answered or refused (SysfsReader.uints): the kept files' record, also
        # for a read that may not use them (the engine's device-only job, beside a job that holds them).
        self.memory = memory if memory is not None else files
        # Set by a read that found the device's cached static info out of date (a netdev it names is gone:
        # renamed, or re-created under another name), so that the caller reads it again.
        self.static_stale = False
        # The file (or counters directory, or ioctl) a read began last: where a read stuck in the kernel
        # is stuck, which the engine's blocked-read line names (another thread reads it; a plain store).
        self.at: str | os.PathLike[str] = ""

    def fail(self, reason: str, path: str | os.PathLike[str], detail: str) -> None:
        where = os.fspath(path)
        self.errors.add(self.device, reason, f"{where}: {detail}", where)

    def text(
        self, path: str | os.PathLike[str], *, optional: bool = False, absent_errnos: Collection[int] = ()
    ) -> str | None:
        """Return the stripped content of `path`, or None when it cannot be read.

        `optional` attributes that do not exist (an absent `lid` on a RoCE port, an old kernel without
        `node_desc`) are not errors: absence is a fact about the device, not a failed read.
        An open or read failing with an errno in `absent_errnos` (usually NO_VALUE_ERRNOS) is absence too.
        """
        raw = self._raw(path, optional, absent_errnos)
        return None if raw is None else self._decode(path, raw)

    def parsed(
        self,
        path: str | os.PathLike[str],
        parse: Callable[[str], _Parsed | None],
        what: str,
        *,
        optional: bool = False,
        absent_errnos: Collection[int] = (),
    ) -> _Parsed | None:
        """What `parse` makes of the file's text (read as `text` reads it). Text that `parse` refuses
        (None) is counted as malformed, "not <what>", and gives None as an absent file does."""
        text = self.text(path, optional=optional, absent_errnos=absent_errnos)
        if text is None:
            return None
        value = parse(text)
        if value is None:
            self.fail(REASON_MALFORMED, path, f"not {what}: {text[:40]!r}")
        return value

    def _raw(
        self, path: str | os.PathLike[str], optional: bool, absent_errnos: Collection[int], counter: bool = False
    ) -> bytes | None:
        self.files_read += 1
        self.at = path
        try:
            if self.files is not None:
                return self.files.read(path if type(path) is str else os.fspath(path))
            raw = _read_once(path)
            if counter and self.memory is not None and _gave_value(raw):
                # A device-only job: what answers here is a fault when it later refuses, as in the kept files.
                self.memory.note_answered(os.fspath(path))
            return raw
        except OSError as exc:
            if (optional and exc.errno == errno.ENOENT) or exc.errno in absent_errnos:
                return None
            if counter and exc.errno in COUNTER_REFUSALS and self.memory is not None:
                text = os.fspath(path)
                if not self.memory.has_answered(text):
                    self.memory.refuse(text)
                    detail = f"{exc.strerror or exc} on every read so far; tried again in a minute"
                    self.fail(REASON_UNSUPPORTED, path, detail)
                    return None
            self.fail(reason_for_errno(exc.errno), path, exc.strerror or str(exc))
            return None

    def _decode(self, path: str | os.PathLike[str], raw: bytes, counter: bool = False) -> str | None:
        if len(raw) >= _READ_LIMIT:  # the read stopped at the limit: no attribute is this long
            self.fail(REASON_MALFORMED, path, f"{_READ_LIMIT} bytes or more: not a sysfs attribute")
            return None
        try:
            value = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            self.fail(REASON_MALFORMED, path, "not UTF-8 text")
            return None
        if value == NO_PMA:
            # Pre-4.20 kernels print this for every PMA counter of a device without a PMA agent, at every
            # read, for as long as the device exists: a counter file's is counted once and the file left out
            # of the reads for REFUSAL_RETRY_SECONDS, as an errno refusal is, not counted at every scrape.
            # Those kernels print it for any failed PMA query too: from a file that has given values, it is a
            # fault, counted at every read as a failing errno is, and the file is read at the next scrape.
            if counter and self.memory is not None and self.memory.has_answered(os.fspath(path)):
                self.fail(REASON_IO, path, f"{NO_PMA} after it gave values: the PMA query failed")
            elif counter and self.memory is not None:
                self.memory.refuse(os.fspath(path))  # uints() closes its kept file at the next read
                self.fail(REASON_UNSUPPORTED, path, f"{NO_PMA}; tried again in a minute")
            else:
                self.fail(REASON_UNSUPPORTED, path, NO_PMA)
            return None
        return value

    def uint(
        self,
        path: str | os.PathLike[str],
        *,
        optional: bool = False,
        base: int = 10,
        prefix: str = "",
        absent_errnos: Collection[int] = (),
        counter: bool = False,
    ) -> int | None:
        """Read an unsigned integer attribute (decimal by default), after a `prefix` that must be there.

        `counter`: a file of a counters directory, whose refusals are judged as `uints` says."""
        raw = self._raw(path, optional, absent_errnos, counter)
        if raw is None:
            return None
        return self._uint_of(path, raw, base=base, prefix=prefix, counter=counter)

    def _uint_of(
        self, path: str | os.PathLike[str], raw: bytes, *, base: int = 10, prefix: str = "", counter: bool = False
    ) -> int | None:
        """`uint` of the bytes `raw` read from `path`, counting what is wrong with them."""
        # Fast path for the common case, a plain decimal counter ("123\n"); int() itself would also
        # accept signs, underscores and surrounding blanks, which the slow path rejects or tolerates.
        if base == 10 and raw[-1:] == b"\n" and raw[:-1].isdigit() and len(raw) <= U64_DIGITS + 1:
            number = int(raw)
            if number <= U64_MAX:
                return number
        value = self._decode(path, raw, counter)
        if value is None:
            return None
        parsed = parse_uint(value, base=base, prefix=prefix)
        if parsed is None:
            self.fail(REASON_MALFORMED, path, f"not an unsigned integer: {value[:40]!r}")
        return parsed

    def uints(self, directory: str, names: Iterable[str]) -> dict[str, int]:
        """`uint` of every `directory/name`, by name, leaving out what could not be read.

        The loop over a counters directory is the hot path of a scrape: a kept file holding a plain
        decimal is read and parsed inline; anything else (first read, an error, odd content) goes
        through `uint`, which handles and counts it.

        A file that fails with COUNTER_REFUSALS and has never given a value through the device's kept
        files, or that says N/A (no PMA), is counted as unsupported and left out of the reads for
        REFUSAL_RETRY_SECONDS, then tried again. One that did give a value and then fails is a fault:
        counted on every read.
        """
        values: dict[str, int] = {}
        self.at = directory  # one store a directory, not one a file: the hot loop below stays as it is
        files = self.files
        fds = files.trusted(directory) if files is not None else None
        refused = self.memory.refused.get(directory) if self.memory is not None else None
        now = refusal_clock() if refused else 0.0
        fast = 0
        for name in names:
            if refused:
                since = refused.get(name)
                if since is not None:
                    if now - since < REFUSAL_RETRY_SECONDS:
                        # Counted when it refused. Checked before the kept read: a file that answered N/A
                        # (no PMA) stays open, here or in the full job beside a device-only job that refused it.
                        if files is not None:
                            files.forget(directory, name)
                        continue
                    refused.pop(name, None)  # another job of the device may have retried it
            fd = fds.get(name) if fds is not None else None
            if fd is not None and files is not None:
                try:
                    raw = os.pread(fd, _SMALL_READ, 0)
                except OSError as exc:
                    if exc.errno not in REOPEN_ERRNOS:
                        # Counted here, not retried through uint(): a failing mlx5 counter is a firmware
                        # query each time it is read.
                        files.forget(directory, name)
                        self.fail(reason_for_errno(exc.errno), f"{directory}/{name}", exc.strerror or str(exc))
                        fast += 1
                        continue
                    raw = b""
                if not raw:
                    # Removed (ENODEV) or empty: uint() below opens the path afresh, not this fd again, which
                    # would be one more firmware query for the same answer (OpenFiles.read).
                    files.forget(directory, name)
                if raw[-1:] == b"\n" and raw[:-1].isdigit() and len(raw) < _SMALL_READ:
                    number = int(raw)
                    if number <= U64_MAX:
                        values[name] = number
                        fast += 1
                        continue
                if raw and len(raw) < _SMALL_READ:
                    # Read whole, but not a plain decimal ("N/A (no PMA)", a sign, garbage): judged from this
                    # read. Through uint() it would be read again, a second firmware query on mlx5.
                    fast += 1
                    value = self._uint_of(f"{directory}/{name}", raw, counter=True)
                    if value is not None:
                        values[name] = value
                    continue
            value = self.uint(f"{directory}/{name}", counter=True)
            self.at = directory  # the fast reads that follow are the directory's again, not that file's
            if value is not None:
                values[name] = value
        self.files_read += fast
        return values


def _read_fd(fd: int) -> bytes:
    """Up to _READ_LIMIT bytes from the current offset: a small read first, the rest only if needed."""
    data = os.read(fd, _SMALL_READ)
    if len(data) == _SMALL_READ:
        data += os.read(fd, _READ_LIMIT - _SMALL_READ)
    return data


def read_regular_file(path: str | os.PathLike[str], limit: int, limit_text: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (`limit_text` says how much in the error),
    for files an operator names (a config, an ethtool capture). Anything else is an OSError whose strerror
    says why: opening and reading a FIFO nobody writes would block for ever, and a device such as
    /dev/zero would never end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # O_NONBLOCK: opening a FIFO returns
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file")
    except OSError:
        os.close(fd)  # a caller that retries (a reload) would otherwise keep one more fd each time
        raise
    with os.fdopen(fd, "rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit_text}")
    return data


def _read_once(path: str | os.PathLike[str]) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _read_fd(fd)
    finally:
        os.close(fd)


_HEX_DIGITS: Final = re.compile(r"[0-9a-fA-F]+")


def parse_uint(value: str, *, base: int = 10, prefix: str = "") -> int | None:
    """Parse a u64 as the kernel prints it; None for garbage, signs, blanks or values above 2^64-1.

    `prefix` is one the kernel always prints, such as lid_show()'s "0x": without it the value is garbage,
    and so is anything but hex digits after it (int() would skip a second "0x" or "0X", and blanks).
    """
    value = value.strip()
    if prefix:
        if not value.startswith(prefix):
            return None
        value = value[len(prefix) :]
        if not _HEX_DIGITS.fullmatch(value):
            return None
    # int() also takes signs, underscores and any script's digits ("٣" is 3): none is a kernel number.
    if not value or value[0] in "+-_" or "_" in value or not value.isascii():
        return None
    try:
        parsed = int(value, base)
    except ValueError:
        return None
    if parsed < 0 or parsed > U64_MAX:
        return None
    return parsed


def parse_entry_number(name: str) -> int | None:
    """A directory entry the kernel names with %d/%u (a port, a priority): its number, None for any other
    name. Stricter than parse_uint, which takes leading zeros and blanks: `01` beside `1` would be a second
    entry of the same number, every series of it exported twice."""
    return int(name) if name.isascii() and name.isdigit() and (name == "0" or name[0] != "0") else None


# What a failed stat() answers about a path that is simply not there (or a link into nothing).
ABSENT_ERRNOS: Final = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


def stat_of(path: str | Path, reader: SysfsReader) -> os.stat_result | None:
    """stat() of `path`, None if it fails. Absence is an answer; any other failure (EACCES from an LSM
    profile or a container mount) is counted. pathlib's is_dir() and exists() raise those, which cost the
    whole device for one directory (fuzz review)."""
    reader.at = path
    try:
        return os.stat(path)
    except OSError as exc:
        if exc.errno not in ABSENT_ERRNOS:
            reader.fail(reason_for_errno(exc.errno), path, exc.strerror or str(exc))
        return None


def is_dir(path: str | Path, reader: SysfsReader) -> bool:
    found = stat_of(path, reader)
    return found is not None and stat.S_ISDIR(found.st_mode)


def exists(path: str | Path, reader: SysfsReader) -> bool:
    return stat_of(path, reader) is not None


def list_dir(path: str | Path, reader: SysfsReader, *, optional: bool = True) -> list[str]:
    """Sorted entry names of a directory; a missing optional directory is an empty list, not an error.

    Names are interned: every device lists the same counter files, and the cached static info of a
    node with 128 functions would otherwise hold 128 copies of each name.
    """
    reader.at = path
    try:
        return sorted(map(sys.intern, os.listdir(path)))
    except OSError as exc:
        if optional and exc.errno == errno.ENOENT:
            return []
        reader.fail(reason_for_errno(exc.errno), path, exc.strerror or str(exc))
        return []


def link_name(path: Path, form: re.Pattern[str] | None = None, *, under: str = "") -> str | None:
    """Basename of a symlink's target (e.g. the driver of `device/driver`), None if not a link, or if it
    is not a link the kernel makes: its target not in a directory named `under`, or its name not of
    `form` (a name taken from anywhere would be a label value; fuzz review)."""
    try:
        target = os.readlink(path).rstrip("/")
    except OSError:
        return None
    name = os.path.basename(target)
    if (under and f"/{under}/" not in target) or (form is not None and not form.fullmatch(name)):
        return None
    return name
