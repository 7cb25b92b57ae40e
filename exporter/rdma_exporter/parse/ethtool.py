"""`ethtool -S` statistics: read them (ioctl or a captured text file) and pick the ones worth exporting.

Three layers, all free of Prometheus imports:

- `read_stats_ioctl`: the driver's statistics straight from the kernel through SIOCETHTOOL, the same
  calls `ethtool -S` makes (ETHTOOL_GSSET_INFO, ETHTOOL_GSTRINGS, ETHTOOL_GSTATS).
- `parse_stats_text` / `read_stats_file`: the same dict from saved `ethtool -S` output (fixture mode).
- `curate_counted`: maps the few hundred to few thousand driver-specific names onto a small set of
  semantic keys with labels (priority, lane, direction...) and units, and counts the extras left out past
  MAX_EXTRA_STATS. Everything else is dropped unless an operator opts in with extra patterns. (`curate`
  is the same without the count.)

A failure costs the interface's statistics for this scrape and raises `EthtoolError`, whose `reason` is
one of reader.py's reason constants so the caller can tally it like a failed sysfs read.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import re
import socket
import struct
import sys
import threading
from array import array
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Final, Literal

from .infiniband import metric_fragment
from .netdev import valid_ifname
from .reader import (
    REASON_IO,
    REASON_MISSING,
    REASON_UNSUPPORTED,
    parse_uint,
    read_regular_file,
    reason_for_errno,
)

# --- include/uapi/linux/sockios.h, include/uapi/linux/ethtool.h ---------------------------------------
SIOCETHTOOL: Final = 0x8946
ETHTOOL_GDRVINFO: Final = 0x00000003
ETHTOOL_GSTRINGS: Final = 0x0000001B
ETHTOOL_GSTATS: Final = 0x0000001D
ETHTOOL_GSSET_INFO: Final = 0x00000037
ETH_SS_STATS: Final = 1
ETH_GSTRING_LEN: Final = 32

# struct ethtool_drvinfo: cmd, driver[32], version[32], fw_version[32], bus_info[32], erom_version[32],
# reserved2[12], n_priv_flags, n_stats, testinfo_len, eedump_len, regdump_len.
_DRVINFO_SIZE: Final = 196
_DRVINFO_N_STATS: Final = 180
# Headers: ethtool_sset_info {cmd, reserved, u64 sset_mask, u32 data[]}, ethtool_gstrings {cmd, string_set,
# len, u8 data[]}, ethtool_stats {cmd, n_stats, u64 data[]}.
_SSET_INFO_SIZE: Final = 24
_GSTRINGS_HEADER: Final = 12
_GSTATS_HEADER: Final = 8
# struct ifreq is 40 bytes on 64-bit (16-byte name + 24-byte union); the kernel copies all of it in.
_IFREQ_SIZE: Final = 40

# Six times any real NIC (mlx5 with 256 channels has ~20k); a larger count is a broken driver. Not higher:
# a read's peak memory grows with the count (buffers with headroom, names read twice), and a driver
# answering 10**6 took the process from 17 to 268 MB (207 MB with the names copied once), near or past
# the unit's MemoryMax and the DaemonSet's limit of 256 MB: the OOM killer would take every metric with
# it. At this ceiling, 42 MB (an ioctl answering the count, measured with ru_maxrss).
MAX_STATS: Final = 1 << 17
# A capture of ~20k stats is about 1 MB of text; a file far past that is not an `ethtool -S` capture.
MAX_CAPTURE_BYTES: Final = 16 << 20
# We pass the count we expect in GSTRINGS/GSTATS. Kernels with the Dec 2025 fix ("ethtool: Avoid
# overflowing userspace buffer on stats query") then answer 0 entries if the set changed since; older
# kernels ignore it and write the count of that moment, past a buffer sized for the old count. Headroom
# makes such growth land in memory we own; the count check then sends us round the retry loop. Growth
# past the headroom (mlx5 going from 1 to 8 traffic classes on many channels) meets GuardedMemory's
# guard page: EFAULT, also retried.
_MIN_HEADROOM: Final = 1024

DEFAULT_ATTEMPTS: Final = 3


class EthtoolError(Exception):
    """Statistics of one interface could not be read. `reason` is a reader.REASON_* constant."""

    def __init__(self, ifname: str, reason: str, detail: str) -> None:
        super().__init__(f"{ifname}: {reason}: {detail}")
        self.ifname = ifname
        self.reason = reason
        self.detail = detail


# Performs one SIOCETHTOOL request for `ifname` whose ethtool command struct is `buffer` (first u32 = cmd),
# filling `buffer` in place; raises OSError like the syscall. Injectable so tests can fake the kernel.
EthtoolCall = Callable[[str, "array[int]"], None]  # a string: array is subscriptable from 3.12 on


def _open_socket() -> socket.socket:
    # Any socket reaches dev_ioctl(); try the usual one first, then families a sandbox may leave open.
    last: OSError | None = None
    for family, proto in ((socket.AF_INET, 0), (socket.AF_NETLINK, 0), (socket.AF_UNIX, 0)):
        try:
            return socket.socket(family, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, proto)
        except OSError as exc:
            last = exc
    assert last is not None
    raise last


class GuardedMemory:
    """Memory for the kernel to write a request into, ending right before a page it cannot write.

    Kernels without the Dec 2025 fix write a stat set's size of the moment, whatever size was asked for
    (see _MIN_HEADROOM). Into a buffer on the heap, a set that grew past the headroom mid-read would
    overwrite whatever lies behind it; with a PROT_NONE page there instead, the kernel's copy faults and
    the ioctl fails with EFAULT, which read_stats_ioctl retries. One mapping, reused and grown as needed.
    """

    _PAGE: Final = mmap.PAGESIZE
    _FAILED: Final = ctypes.c_void_p(-1).value

    def __init__(self) -> None:
        self._base: int | None = None
        self._span = 0  # writable bytes before the guard page

    def place(self, data: array[int]) -> int | None:
        """Copy `data` so that it ends at the guard page; its address, or None where mappings fail."""
        size = len(data) * data.itemsize
        if size > self._span and not self._grow(size):
            return None
        assert self._base is not None
        address = self._base + self._span - size
        ctypes.memmove(address, data.buffer_info()[0], size)
        return address

    def take(self, address: int, data: array[int]) -> None:
        """Copy what the kernel wrote at `address` back into `data`."""
        ctypes.memmove(data.buffer_info()[0], address, len(data) * data.itemsize)

    def _grow(self, size: int) -> bool:
        self.close()
        if _libc is None:
            return False
        span = -(-size // self._PAGE) * self._PAGE
        base = _libc.mmap(None, span + self._PAGE, mmap.PROT_READ | mmap.PROT_WRITE,
                          mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # fmt: skip
        if base is None or base == self._FAILED:
            return False
        if _libc.mprotect(base + span, self._PAGE, 0) != 0:  # PROT_NONE
            _libc.munmap(base, span + self._PAGE)
            return False
        self._base, self._span = base, span
        return True

    def close(self) -> None:
        if self._base is not None and _libc is not None:
            _libc.munmap(self._base, self._span + self._PAGE)
            self._base, self._span = None, 0

    def __del__(self) -> None:
        self.close()  # a SocketEthtool dropped without close() (a caller's own): its mapping goes with it


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError):  # no dynamic libc: GuardedMemory gives no memory, the heap is used
        return None
    return libc


_libc: Final = _load_libc()


class SocketEthtool:
    """The real `EthtoolCall`: SIOCETHTOOL on a datagram socket in the caller's network namespace.

    Calls from several threads take turns, as the kernel's RTNL lock makes them do anyway: they share the
    guarded memory, which is kept (mapped anew for each read, it cost 0.18 ms a read of 3,457 stats). So a
    call stuck in the kernel holds the others here, where the RTNL lock it holds or waits for would hold
    them in the kernel.
    """

    def __init__(self) -> None:
        self._sock = _open_socket()
        self._memory = GuardedMemory()
        self._lock = threading.Lock()

    def __call__(self, ifname: str, buffer: array[int]) -> None:
        with self._lock:
            self._call(ifname, buffer)

    def _call(self, ifname: str, buffer: array[int]) -> None:
        guarded = self._memory.place(buffer)
        ifreq = bytearray(_IFREQ_SIZE)
        # Native layout: 16-byte name, then the union whose first member is the ifr_data pointer. Without a
        # mapping (a memory limit) the kernel writes the heap buffer itself, with its headroom only.
        address = buffer.buffer_info()[0] if guarded is None else guarded
        struct.pack_into("16sP", ifreq, 0, os.fsencode(ifname), address)
        fcntl.ioctl(self._sock.fileno(), SIOCETHTOOL, ifreq, True)
        if guarded is not None:
            self._memory.take(guarded, buffer)

    def close(self) -> None:
        with self._lock:  # not while another thread's call copies from the mapping
            self._sock.close()
            self._memory.close()

    def __enter__(self) -> SocketEthtool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _zeroed(size: int) -> array[int]:
    # Not array("B", bytes(size)), which builds the zeros twice: for the 221 KB buffer of 3,457 names it
    # took 0.18 ms a read against 0.11 ms, under the daemon's mmap threshold (a mapping faulted in each time).
    return array("B", [0]) * size


def _fail(ifname: str, exc: OSError, what: str) -> EthtoolError:
    return EthtoolError(ifname, reason_for_errno(exc.errno), f"{what}: {exc.strerror or exc}")


def _stat_count(call: EthtoolCall, ifname: str) -> int:
    buffer = _zeroed(_SSET_INFO_SIZE)
    struct.pack_into("=IIQ", buffer, 0, ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS)
    try:
        call(ifname, buffer)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise _fail(ifname, exc, "ETHTOOL_GSSET_INFO") from exc
        return _drvinfo_count(call, ifname)  # kernels before 2.6.30 know no GSSET_INFO
    (mask,) = struct.unpack_from("=Q", buffer, 8)
    if not mask & (1 << ETH_SS_STATS):
        return 0  # the kernel clears the bit when the driver has no statistics set
    count: int
    (count,) = struct.unpack_from("=I", buffer, 16)
    return count


def _drvinfo_count(call: EthtoolCall, ifname: str) -> int:
    buffer = _zeroed(_DRVINFO_SIZE)
    struct.pack_into("=I", buffer, 0, ETHTOOL_GDRVINFO)
    try:
        call(ifname, buffer)
    except OSError as exc:
        raise _fail(ifname, exc, "ETHTOOL_GDRVINFO") from exc
    count: int
    (count,) = struct.unpack_from("=I", buffer, _DRVINFO_N_STATS)
    return count


def _read_strings(call: EthtoolCall, ifname: str, expected: int, capacity: int) -> bytes | None:
    """The name table as the kernel wrote it (ETH_GSTRING_LEN bytes a name), or None if the kernel wrote
    past the buffer (the set grew beyond the headroom)."""
    buffer = _zeroed(_GSTRINGS_HEADER + capacity * ETH_GSTRING_LEN)
    struct.pack_into("=III", buffer, 0, ETHTOOL_GSTRINGS, ETH_SS_STATS, expected)
    try:
        call(ifname, buffer)
    except OSError as exc:
        if exc.errno == errno.EFAULT:
            return None
        raise _fail(ifname, exc, "ETHTOOL_GSTRINGS") from exc
    (length,) = struct.unpack_from("=I", buffer, 8)
    if length > capacity:
        raise EthtoolError(ifname, REASON_IO, f"stat set grew from <={capacity} to {length} strings mid-read")
    # Copy the names only, not the whole buffer with its headroom first.
    return bytes(memoryview(buffer)[_GSTRINGS_HEADER : _GSTRINGS_HEADER + length * ETH_GSTRING_LEN])


def _read_values(call: EthtoolCall, ifname: str, expected: int, capacity: int) -> tuple[int, ...] | None:
    """The values, or None if the kernel wrote past the buffer (the set grew beyond the headroom)."""
    buffer = _zeroed(_GSTATS_HEADER + capacity * 8)
    struct.pack_into("=II", buffer, 0, ETHTOOL_GSTATS, expected)
    try:
        call(ifname, buffer)
    except OSError as exc:
        if exc.errno == errno.EFAULT:
            return None
        raise _fail(ifname, exc, "ETHTOOL_GSTATS") from exc
    (count,) = struct.unpack_from("=I", buffer, 4)
    if count > capacity:
        raise EthtoolError(ifname, REASON_IO, f"stat set grew from <={capacity} to {count} values mid-read")
    return struct.unpack_from(f"={count}Q", buffer, _GSTATS_HEADER)


_PositionPlan = tuple[tuple[tuple[int, str, tuple[tuple[str, str], ...], "Kind", float, str], ...], int]


@dataclass(frozen=True, slots=True, eq=False)
class StatNames:
    """A netdev's stat-name table as the kernel wrote it, and the names decoded from it.

    Kept between scrapes by the caller: a driver answers the same table every time (mlx5 with many channels:
    thousands of names, a 100 KB table whose decoding cost about as much as the ioctls), and a table equal
    to the kept one needs neither decoding nor the second name read (read_stat_set).
    """

    table: bytes
    names: tuple[str, ...]
    by_position: bool  # no empty and no repeated name: the values pair with the names by position alone
    # Per extra_patterns: (position, key, labels, kind, scale, name) of each stat to export, and the extras
    # over the limit. Written by the one job that reads this netdev.
    _curation: dict[tuple[re.Pattern[str], ...], _PositionPlan] = field(default_factory=dict, repr=False)

    @classmethod
    def decode(cls, table: bytes) -> StatNames:
        # Interned: the NICs of a node mostly share one driver and so their names, kept once for all.
        names = tuple(
            sys.intern(table[start : start + ETH_GSTRING_LEN].split(b"\0", 1)[0].decode("utf-8", "replace").strip())
            for start in range(0, len(table), ETH_GSTRING_LEN)
        )
        return cls(table, names, "" not in names and len(set(names)) == len(names))

    def curate(
        self, values: Sequence[int], extra_patterns: Sequence[re.Pattern[str]] = ()
    ) -> tuple[list[CuratedStat], int]:
        """curate_counted(self.pair(values), extra_patterns), without building the {name: value} dict of
        every stat first (0.53 ms at 10,001 stats, for the hundred or so curated)."""
        if not self.by_position:
            return curate_counted(self.pair(values), extra_patterns)
        patterns = tuple(extra_patterns)
        planned = self._curation.get(patterns)
        if planned is None:
            # Values read through the ioctl are u64 (struct "Q"): no value drops a name from the plan.
            plan, over_limit = _plan(self.names, patterns)
            position = {name: i for i, name in enumerate(self.names)}
            steps = tuple((position[name], key, labels, kind, scale, name) for name, key, labels, kind, scale in plan)
            planned = self._curation[patterns] = (steps, over_limit)
        steps, over_limit = planned
        curated = [
            CuratedStat(key, values[at], labels, kind, scale, name) for at, key, labels, kind, scale, name in steps
        ]
        return curated, over_limit

    def pair(self, values: Sequence[int]) -> dict[str, int]:
        """{name: value}; same rules as parse_stats_text, so the ioctl and fixture paths give equal dicts."""
        if len(values) != len(self.names):
            raise ValueError(f"{len(values)} values for {len(self.names)} names")
        if self.by_position:
            return dict(zip(self.names, values, strict=True))
        stats: dict[str, int] = {}
        for name, value in zip(self.names, values, strict=True):
            if name and name not in stats:
                stats[name] = value
        return stats


def read_stats_ioctl(
    ifname: str, *, call: EthtoolCall | None = None, max_attempts: int = DEFAULT_ATTEMPTS
) -> dict[str, int]:
    """`ethtool -S ifname` as {name: value}, in the driver's order, through SIOCETHTOOL (read_stat_set with
    nothing known of the netdev)."""
    return read_stat_set(ifname, None, call=call, max_attempts=max_attempts)[0]


def read_stat_set(
    ifname: str, known: StatNames | None, *, call: EthtoolCall | None = None, max_attempts: int = DEFAULT_ATTEMPTS
) -> tuple[dict[str, int], StatNames]:
    """`ethtool -S ifname` as {name: value}, in the driver's order, and the names it was read with, which
    the caller passes back as `known` next time (read_stat_values, paired)."""
    values, names = read_stat_values(ifname, known, call=call, max_attempts=max_attempts)
    return names.pair(values), names


def read_stat_values(
    ifname: str, known: StatNames | None, *, call: EthtoolCall | None = None, max_attempts: int = DEFAULT_ATTEMPTS
) -> tuple[tuple[int, ...], StatNames]:
    """`ethtool -S ifname`'s values, in the driver's order, and the names they were read with, which the
    caller passes back as `known` next time.

    The stat set is dynamic (mlx5 adds per-priority pause counters when PFC is enabled and per-channel
    ones when channels are added), so the count is read, then the names, then the values, then the names
    again; if the counts disagree (old kernels return the new count, fixed ones return 0) or the names
    changed, the set changed underneath us and the whole read is retried up to `max_attempts` times.
    With `known`, and a count equal to its length, the values are read first and then the names once: if
    those are `known`'s table, the values are taken as read with that set. Otherwise the full read
    follows. This check is weaker than the full read's: a set replaced by another of the same size at
    any time since the last read, and put back between the values and the names read here, passes with
    the other set's values under the kept names (the full read misses that only if both changes fall
    within its own two name reads). It costs one name read instead of two, and no decoding.
    Names are stripped (StatNames.decode); pairing them with the values is StatNames.pair's.

    Raises EthtoolError: missing (no such interface), unsupported (no statistics set, e.g. `lo`),
    permission, or io (anything else, including a set that never held still).
    """
    if not valid_ifname(ifname):
        raise EthtoolError(ifname, REASON_MISSING, "not a valid interface name")
    owned: SocketEthtool | None = None
    if call is None:
        try:
            owned = SocketEthtool()
        except OSError as exc:
            raise _fail(ifname, exc, "socket") from exc
        call = owned
    try:
        seen: list[str] = []
        for _ in range(max(1, max_attempts)):
            count = _stat_count(call, ifname)
            if count == 0:
                raise EthtoolError(ifname, REASON_UNSUPPORTED, "driver has no statistics set")
            if count > MAX_STATS:
                raise EthtoolError(ifname, REASON_IO, f"implausible stat count {count}")
            capacity = count + max(count, _MIN_HEADROOM)
            if known is not None and count == len(known.names):
                values = _read_values(call, ifname, count, capacity)
                if (
                    values is not None
                    and len(values) == count
                    and _read_strings(call, ifname, count, capacity) == known.table
                ):
                    return values, known
                known = None  # changed: the full read below, this attempt and any after it
            table = _read_strings(call, ifname, count, capacity)
            if table is None or len(table) != count * ETH_GSTRING_LEN:
                got = "more than " + str(capacity) if table is None else len(table) // ETH_GSTRING_LEN
                seen.append(f"{count}->{got} strings")
                continue
            values = _read_values(call, ifname, count, capacity)
            if values is None or len(values) != count:
                seen.append(f"{count}->{'more than ' + str(capacity) if values is None else len(values)} values")
                continue
            # The same count is no proof of the same set: channels or PFC priorities swapped for as many
            # others (ethtool -L, a DCB change) pair one set's names with the other's values. The names
            # read again after the values must be those read before them.
            if _read_strings(call, ifname, count, capacity) != table:
                seen.append(f"{count} strings replaced by as many others")
                continue
            return values, StatNames.decode(table)
        raise EthtoolError(ifname, REASON_IO, f"stat set changed on every attempt: {', '.join(seen)}")
    finally:
        if owned is not None:
            owned.close()


class StatSetReader:
    """Reads netdevs' stat sets, each from the names kept from its last read (read_stat_set). Not for two
    threads at once: the collector keeps one per RDMA device, whose job reads its netdevs one after the
    other."""

    def __init__(self) -> None:
        self._names: dict[str, StatNames] = {}

    def read(self, ifname: str, call: EthtoolCall | None = None) -> dict[str, int]:
        """`ethtool -S ifname` as {name: value}; raises EthtoolError as read_stat_set."""
        stats, self._names[ifname] = read_stat_set(ifname, self._names.get(ifname), call=call)
        return stats

    def read_curated(
        self, ifname: str, extra_patterns: Sequence[re.Pattern[str]] = (), call: EthtoolCall | None = None
    ) -> tuple[list[CuratedStat], int]:
        """curate_counted(self.read(ifname, call), extra_patterns), curated from the kept names."""
        values, names = read_stat_values(ifname, self._names.get(ifname), call=call)
        self._names[ifname] = names
        return names.curate(values, extra_patterns)

    def retain(self, ifnames: Collection[str]) -> None:
        """Forget the names of netdevs not in `ifnames`."""
        for name in [n for n in self._names if n not in ifnames]:
            del self._names[name]


# --- text form ------------------------------------------------------------------------------------------


def parse_stats_text(text: str, malformed: list[str] | None = None) -> dict[str, int]:
    """Parse what `ethtool -S X` prints: a `NIC statistics:` header and `     name: value` lines.

    The LAST ": " splits name and value, since names may contain dots, spaces and even colons.
    Blank lines, `#` comment lines and unindented `Header:` lines are skipped silently. Any other line
    that is not `name: u64` is skipped and appended to `malformed` (when given), so the caller can count
    it under the `malformed` reason. A repeated name keeps its first value.
    """
    stats, bad = _parse_stats_text(text)
    if malformed is not None:
        malformed.extend(bad)
    return dict(stats)


# Captures are re-read every scrape and rarely change: parse each distinct text once. A text with all
# per-queue stats can be 100 KB, so keep only a few.
@lru_cache(maxsize=8)
def _parse_stats_text(text: str) -> tuple[dict[str, int], tuple[str, ...]]:
    stats: dict[str, int] = {}
    malformed: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or raw.startswith("#"):
            continue
        name, sep, value = line.rpartition(": ")
        if not sep:
            if line.endswith(":") and raw[:1] not in (" ", "\t"):
                continue  # section header such as "NIC statistics:"
            malformed.append(raw)
            continue
        name = name.strip()
        parsed = parse_uint(value)
        if not name or parsed is None:
            malformed.append(raw)
            continue
        stats.setdefault(name, parsed)
    return stats, tuple(malformed)


def read_stats_file(directory: Path, ifname: str, malformed: list[str] | None = None) -> dict[str, int]:
    """Fixture mode (`--path.ethtool=DIR`): parse the saved `ethtool -S ifname` output in DIR/ifname."""
    if not valid_ifname(ifname):
        raise EthtoolError(ifname, REASON_MISSING, "not a valid interface name")
    try:
        # A FIFO left in the capture directory must not hold a reader thread for ever.
        raw = read_regular_file(directory / ifname, MAX_CAPTURE_BYTES, f"{MAX_CAPTURE_BYTES} bytes")
    except OSError as exc:  # the caller names the file; the detail is only why it failed
        raise EthtoolError(ifname, reason_for_errno(exc.errno), exc.strerror or str(exc)) from exc
    bad: list[str] = []
    stats = parse_stats_text(raw.decode("utf-8", "replace"), bad)
    if not stats and not bad:
        # What `ethtool -S` of a driver without statistics leaves in a file (it prints its error to
        # stderr): the ioctl's answer of no statistics set, counted the same way.
        raise EthtoolError(ifname, REASON_UNSUPPORTED, "the capture holds no statistics")
    if malformed is not None:
        malformed.extend(bad)
    return stats


# --- curation -------------------------------------------------------------------------------------------

Kind = Literal["counter", "gauge"]
COUNTER: Final = "counter"
GAUGE: Final = "gauge"


@dataclass(frozen=True, slots=True)
class CuratedStat:
    """One ethtool statistic ready for exposition as `rdma_ethtool_<key>` (`_total` added for counters).

    `value` is the raw driver value; multiply by `unit_scale` for base units (seconds, ratio).
    `labels` have the same names in the same order for every stat of one key. `source` is the ethtool name.
    """

    key: str
    value: int
    labels: tuple[tuple[str, str], ...]
    kind: Kind
    unit_scale: float
    source: str = ""


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str]
    key: str
    kind: Kind
    unit_scale: float


def _rule(pattern: str, key: str, kind: Kind = COUNTER, unit_scale: float = 1.0) -> _Rule:
    return _Rule(re.compile(pattern), key, kind, unit_scale)


# Label values: named groups give label name and value; `operation` is spelled out. Labels are put in the
# order of _LABEL_ORDER whatever the order of the groups in the name (bnxt_en puts the priority first).
_DIR = r"(?P<direction>rx|tx)"
_RX = r"(?P<direction>rx)"
_TX = r"(?P<direction>tx)"
_PRIO = r"prio(?P<priority>[0-7])"  # IEEE 802.1p priorities
_PRI = r"(?P<priority>[0-7])"
_LANE = r"(?P<lane>[0-9]|1[0-5])"
_OPERATIONS: Final = {"rd": "read", "wr": "write"}
# Transceiver module events mlx5 counts (the `event` label's only values).
MODULE_EVENTS: Final = ("bus_stuck", "high_temp", "bad_shorted", "unplug")
_LABEL_ORDER: Final = {"direction": 0, "priority": 1, "lane": 2, "operation": 3, "event": 4}
_RULES: Final[tuple[_Rule, ...]] = (
    # mlx5: names and units per Documentation/networking/device_drivers/ethernet/mellanox/mlx5/counters.rst
    # and en_stats.c; durations are in microseconds, outbound_pci_stalled_{rd,wr} are percentages of the
    # last second.
    _rule(rf"{_DIR}_{_PRIO}_pause", "pfc_pause_frames"),
    _rule(rf"{_DIR}_{_PRIO}_pause_duration", "pfc_pause_duration_seconds", unit_scale=1e-6),
    _rule(rf"{_DIR}_{_PRIO}_pause_transition", "pfc_pause_transitions"),
    _rule(rf"{_DIR}_global_pause", "global_pause_frames"),
    _rule(rf"{_DIR}_global_pause_duration", "global_pause_duration_seconds", unit_scale=1e-6),
    _rule(rf"{_DIR}_global_pause_transition", "global_pause_transitions"),
    _rule(rf"{_DIR}_pause_ctrl_phy", "pause_mac_control_frames"),
    _rule(rf"{_TX}_pause_storm_warning_events", "pause_storm_warning_events"),
    _rule(rf"{_TX}_pause_storm_error_events", "pause_storm_error_events"),
    _rule(rf"{_DIR}_discards_phy", "port_discards"),
    _rule(rf"{_TX}_errors_phy", "port_errors"),
    _rule(rf"{_RX}_out_of_buffer", "out_of_buffer"),
    _rule(rf"{_RX}_{_PRIO}_discards", "priority_discards"),
    _rule(rf"{_RX}_{_PRIO}_buf_discard", "priority_buffer_discards"),
    _rule(rf"{_RX}_{_PRIO}_cong_discard", "priority_congestion_discards"),
    _rule(rf"{_RX}_{_PRIO}_marked", "priority_ecn_marked_packets"),
    _rule(rf"{_DIR}_{_PRIO}_bytes", "priority_bytes"),
    _rule(rf"{_DIR}_{_PRIO}_packets", "priority_packets"),
    _rule(r"link_down_events_phy", "link_down_events"),
    _rule(rf"{_RX}_pcs_symbol_err_phy", "pcs_symbol_errors"),
    _rule(rf"{_RX}_symbol_err_phy", "symbol_error_packets"),
    _rule(rf"{_RX}_corrected_bits_phy", "corrected_bits"),
    _rule(rf"{_RX}_crc_errors_phy", "crc_error_packets"),
    _rule(rf"{_RX}_oversize_pkts_phy", "oversize_packets"),
    _rule(rf"{_RX}_out_of_range_len_phy", "out_of_range_length_packets"),
    _rule(rf"{_RX}_in_range_len_errors_phy", "in_range_length_error_packets"),
    _rule(rf"{_RX}_undersize_pkts_phy", "undersize_packets"),
    _rule(rf"{_RX}_fragments_phy", "fragment_packets"),
    _rule(rf"{_RX}_jabbers_phy", "jabber_packets"),
    _rule(rf"{_DIR}_bits_phy", "port_bits"),
    _rule(rf"{_DIR}_bytes_phy", "port_bytes"),
    _rule(rf"{_DIR}_packets_phy", "port_packets"),
    _rule(rf"{_RX}_buffer_passed_thres_phy", "port_buffer_almost_full_events"),
    _rule(rf"{_RX}_err_lane_{_LANE}_phy", "lane_raw_errors"),
    _rule(rf"{_DIR}_pci_signal_integrity", "pci_signal_integrity_errors"),
    _rule(r"outbound_pci_stalled_(?P<operation>rd|wr)", "pci_outbound_stalled_ratio", GAUGE, 0.01),
    _rule(r"outbound_pci_stalled_(?P<operation>rd|wr)_events", "pci_outbound_stalled_seconds"),
    _rule(r"outbound_pci_buffer_overflow", "pci_outbound_buffer_overflow_packets"),
    _rule(r"dev_out_of_buffer", "device_out_of_buffer"),
    _rule(rf"module_(?P<event>{'|'.join(MODULE_EVENTS)})", "module_events"),
    # bnxt_en (Broadcom; RoCE through bnxt_re): names from bnxt_port_stats_arr, bnxt_port_stats_ext_arr and
    # bnxt_tx_port_stats_ext_arr in drivers/net/ethernet/broadcom/bnxt/bnxt_ethtool.c; meanings from the
    # descriptions of the same counters in Broadcom's FreeBSD driver (sys/dev/bnxt/bnxt_en/bnxt_sysctl.c).
    # PFC durations are in microseconds. Left out: rx_discard_{packets,bytes}_cosN and {rx,tx}_*_cosN
    # (per class of service, not per priority), {rx,tx}_{bytes,packets}_priN (the counter of the CoS queue
    # the priority maps to, so priorities sharing a queue repeat one value), pfc_priN_{rx,tx}_transitions
    # (described as transitions "between XON to XOFF and XOFF to XON": perhaps both edges, where
    # pfc_pause_transitions counts XOFF to XON only; opt in with extra_stats to read them).
    _rule(rf"pfc_pri{_PRI}_{_DIR}_duration_us", "pfc_pause_duration_seconds", unit_scale=1e-6),
    _rule(rf"{_DIR}_pfc_ena_frames_pri{_PRI}", "pfc_pause_frames"),
    _rule(rf"{_DIR}_pause_frames", "global_pause_frames"),
    _rule(r"link_down_events", "link_down_events"),
    _rule(rf"{_RX}_pcs_symbol_err", "pcs_symbol_errors"),
    _rule(rf"{_RX}_corrected_bits", "corrected_bits"),
    _rule(rf"{_RX}_fcs_err_frames", "crc_error_packets"),
    # Frames the port discarded ({rx,tx}_stat_discard, "received stat discard" in the FreeBSD driver): the
    # port-wide count RdmaRoceBufferDiscards falls back to where per-priority counts are missing.
    _rule(rf"{_DIR}_stat_discard", "port_discards"),
    _rule(rf"{_RX}_undrsz_frames", "undersize_packets"),
    _rule(rf"{_RX}_jbr_frames", "jabber_packets"),
    _rule(rf"{_RX}_bits", "port_bits"),
    _rule(rf"{_RX}_buffer_passed_threshold", "port_buffer_almost_full_events"),
    # ice (Intel E810; RoCE through irdma): names from ice_gstrings_pf_stats and the per-priority loop of
    # __ice_get_strings in drivers/net/ethernet/intel/ice/ice_ethtool.c, port-wide (`.nic`) counters of
    # the PF netdev. XOFF frames are the pause frames; XON frames (`*_xon.nic`) end a pause and are left out.
    _rule(rf"{_DIR}_priority_{_PRI}_xoff\.nic", "pfc_pause_frames"),
    _rule(rf"link_xoff_{_DIR}\.nic", "global_pause_frames"),
    _rule(rf"{_RX}_crc_errors\.nic", "crc_error_packets"),
    # RFC 2819 frame errors (GLPRT_ROC, RUC, RFC, RJC). rx_dropped.nic is left out: the driver does not say
    # whether it counts the port's buffer or the host's descriptor rings running out.
    _rule(rf"{_RX}_oversize\.nic", "oversize_packets"),
    _rule(rf"{_RX}_undersize\.nic", "undersize_packets"),
    _rule(rf"{_RX}_fragments\.nic", "fragment_packets"),
    _rule(rf"{_RX}_jabber\.nic", "jabber_packets"),
    # mlx4_en (ConnectX-3 RoCE): main_strings of drivers/net/ethernet/mellanox/mlx4/en_ethtool.c. Its pause
    # durations are left out (the unit is nowhere stated), and so is rx_dropped (a software count). Its CRC
    # counter too: `rx_crc_errors` is also qede's and ixgbe's, whose PFC names are not known, and curated it
    # would silence RdmaRoceStatisticsUnknown for them.
    _rule(rf"{_DIR}_pause_prio_{_PRI}", "pfc_pause_frames"),
    _rule(rf"{_DIR}_pause_transition_prio_{_PRI}", "pfc_pause_transitions"),
    _rule(rf"{_DIR}_pause", "global_pause_frames"),
    _rule(rf"{_DIR}_pause_transition", "global_pause_transitions"),
    # i40e (X722 iWARP, an Ethernet link layer): its port-wide `port.` counters in i40e_ethtool.c.
    _rule(rf"port\.{_DIR}_priority_{_PRI}_xoff_(?:rx|tx)", "pfc_pause_frames"),
    _rule(rf"port\.link_xoff_{_DIR}", "global_pause_frames"),
    _rule(rf"port\.{_RX}_crc_errors", "crc_error_packets"),
)
# What each curated key is, taken from the rules that make it, so the exposition has one source for it.
CURATED_KINDS: Final[dict[str, Kind]] = {rule.key: rule.kind for rule in _RULES}

CURATED_HELP: Final[dict[str, str]] = {
    "pfc_pause_frames": "PFC (802.1Qbb) pause frames per priority; rx: the peer throttles us, tx: we throttle it.",
    "pfc_pause_duration_seconds": "Time spent paused by PFC per priority (rx: we were paused, tx: we paused the peer).",
    "pfc_pause_transitions": "PFC XOFF to XON transitions per priority.",
    "global_pause_frames": "Global 802.3x pause frames (mlx5 lists them only while global pause is enabled).",
    "global_pause_duration_seconds": "Time spent paused by global 802.3x pause (rx: we were paused, tx: we paused).",
    "global_pause_transitions": "Global pause XOFF to XON transitions.",
    "pause_mac_control_frames": "802.3 MAC control PAUSE frames on the physical port (IEEE aPAUSEMACCtrlFrames).",
    "pause_storm_warning_events": "Times the NIC had been sending pause frames for a long time (pause storm warning).",
    "pause_storm_error_events": "Times a pause storm timed out and pause sending was disabled; drops may follow.",
    "port_discards": "Packets discarded by the physical port (rx: no receive buffer, tx: head-of-line/link down).",
    "port_errors": "Packets the physical port failed to send (RFC 2863 ifOutErrors; mlx5: longer than the MTU).",
    "out_of_buffer": "Times a receive queue had no software buffer for incoming traffic (32-bit, may wrap).",
    "priority_discards": "Packets of this priority discarded for lack of receive buffers.",
    "priority_buffer_discards": (
        "Packets discarded for lack of per-host receive buffers, per traffic class (see the note of "
        "rdma_ethtool_priority_ecn_marked_packets_total on the priority label)."
    ),
    "priority_congestion_discards": (
        "Packets discarded because of per-host congestion, per traffic class (see the note of "
        "rdma_ethtool_priority_ecn_marked_packets_total on the priority label)."
    ),
    "priority_ecn_marked_packets": (
        "Packets ECN-marked by the NIC because of per-host congestion. mlx5 counts this and the buffer and "
        "congestion discards per traffic class: the priority label is the class number, which carries that "
        "priority under mlx5's default map except classes 0 and 1 (priorities 1 and 0); a custom map "
        "(mlnx_qos --prio_tc) changes that."
    ),
    "priority_bytes": "Bytes on the physical port per priority.",
    "priority_packets": "Packets on the physical port per priority.",
    "link_down_events": "Times the physical link went down (flapping points at cable or transceiver).",
    "pcs_symbol_errors": (
        "Symbol errors not corrected by FEC (traffic lost); for the BER divide by port_bits where the driver "
        "counts them, else by the line speed's bits (rdma_netdev_speed_bytes_per_second * 8)."
    ),
    "symbol_error_packets": "Received packets dropped because of physical coding (symbol) errors.",
    "corrected_bits": (
        "Bits corrected by FEC; for the pre-FEC BER divide by port_bits where the driver counts them, else by "
        "the line speed's bits (rdma_netdev_speed_bytes_per_second * 8)."
    ),
    "crc_error_packets": "Received packets dropped for a bad FCS (CRC).",
    "oversize_packets": (
        "Received packets dropped as longer than the MTU (802.3 frame too long error); the peer's MTU is larger."
    ),
    "out_of_range_length_packets": "Received packets dropped for a length above the maximum; the peer's MTU is larger.",
    "in_range_length_error_packets": "Received packets dropped for a length/type error (802.3 in-range length error).",
    "undersize_packets": "Received packets dropped as shorter than 64 bytes with a good FCS (RFC 2819 undersize).",
    "fragment_packets": "Received packets dropped as shorter than 64 bytes with a bad FCS (RFC 2819 fragments).",
    "jabber_packets": "Received packets dropped as longer than allowed with a bad FCS (RFC 2819 jabbers).",
    "port_bits": "Bits received on the physical port; the denominator of the bit error rates (mainline mlx5 has none).",
    "port_bytes": "Bytes on the physical port, Ethernet header and FCS included.",
    "port_packets": "Packets on the physical port.",
    "port_buffer_almost_full_events": "Times the port receive buffer passed 85% full.",
    "lane_raw_errors": "Raw physical errors per lane, before FEC correction.",
    "pci_signal_integrity_errors": "PCIe physical-layer signal integrity errors (rx: ours, tx: initiated by the peer).",
    "pci_outbound_stalled_ratio": "Share of the last second outbound PCIe reads/writes waited for credits.",
    "pci_outbound_stalled_seconds": "Seconds in which outbound PCIe reads/writes were stalled over 30% of the time.",
    "pci_outbound_buffer_overflow_packets": "Packets dropped because the PCIe buffer overflowed (host bus too slow).",
    "device_out_of_buffer": "Times a device-owned queue had too few buffers.",
    "module_events": (
        "Transceiver module events: bus_stuck (I2C bus or data shorted), high_temp (module too hot), "
        "bad_shorted (bad or shorted cable/module); unplug (module ejected) is informational."
    ),
}

# Extra stats' keys get the `stat_` prefix (collect/ethtool.py gives them one HELP).
EXTRA_PREFIX: Final = "stat_"
# Extra series a netdev may export. Names come from the driver and from operators' extra_stats patterns:
# a broad pattern on mlx5 with 256 channels selects about 20k per-queue stats, and a broken driver or
# capture any number of lane_N names (200,000 took 7 s a scrape and 79 MB an answer, review). Past the
# first this many in the driver's order they are counted (rdma_ethtool_extra_stats_over_limit), not exported.
MAX_EXTRA_STATS: Final = 2048
_ESCAPED_WORD: Final = re.compile(r"(?:priority|lane|queue|channel|all)(?:_|$)")

# Bounds keep label values a small fixed set; an index outside them stays part of the key instead.
MAX_PRIORITY: Final = 7
MAX_LANE: Final = 15
# mlx5 numbers its send queues channel + TC * channels: 8 traffic classes of 256 channels reach tx2047.
MAX_QUEUE: Final = 4095

# Generic index extraction for lanes and extras. Applied in this order to the raw ethtool name.
# ASCII digits only: \d would also take other scripts' digits, which int() accepts.
# mlx5 `rx0_`, `tx_queue_0_`/`rx_q0_` of others, i40e and ixgbe `tx-0.`.
_QUEUE_PREFIX: Final = re.compile(r"^(?P<direction>rx|tx)(?:_queue_|_q|-|)(?P<queue>[0-9]+)[_.]")
# mlx5 `chN_`; bnxt_en `[N]: ` (per completion ring, bnxt_get_strings in bnxt_ethtool.c).
_CHANNEL_PREFIX: Final = re.compile(r"^(?:ch(?:annel)?_?(?P<channel>[0-9]+)_|\[(?P<ring>[0-9]+)\]: ?)")
_DIRECTION_PREFIX: Final = re.compile(r"^(?P<direction>rx|tx)_")
# mlx5 spells a priority prioN, bnxt_en priN (pfc_pri3_rx_transitions, rx_bytes_pri3), ice and i40e priority_N.
_PRIORITY_PART: Final = re.compile(r"(?:^|_)(?:prio|pri|priority)_?(?P<priority>[0-9]+)(?=_|$)")
_LANE_PART: Final = re.compile(r"(?:^|_)lane_?(?P<lane>[0-9]+)(?=_|$)")
_LANE_ANYWHERE: Final = re.compile(r"(?:^|_)lane_?[0-9]+(?:_|$)")


def _index(value: str, bound: int) -> str | None:
    if len(value) > 4:
        return None
    number = int(value)
    # Leading zeros would make two spellings of one index; treat them like an out-of-range index.
    return str(number) if number <= bound and str(number) == value else None


@lru_cache(maxsize=8192)
def _curated(name: str) -> tuple[str, tuple[tuple[str, str], ...], Kind, float] | None:
    for rule in _RULES:
        match = rule.pattern.fullmatch(name)
        if match is None:
            continue
        found = [(label, _OPERATIONS.get(value, value)) for label, value in match.groupdict().items() if value]
        labels = tuple(sorted(found, key=lambda item: _LABEL_ORDER[item[0]]))
        return rule.key, labels, rule.kind, rule.unit_scale
    return None


@lru_cache(maxsize=8192)
def generic_key(name: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The labelled form of a stat with no curated meaning (extras and unlisted per-lane stats).

    Rule: a leading `rxN_`/`txN_`/`rx_queue_N_`/`tx_queue_N_` becomes direction + queue, a leading `chN_`
    (bnxt_en: `[N]: `) becomes channel, else a leading `rx_`/`tx_` becomes direction; then `prioN`/`prio_N`
    (also `priN` and `priority_N`) and `laneN`/`lane_N` anywhere become priority and lane. The rest is
    snake_cased (see infiniband.metric_fragment) and the key is `stat_` + the stripped dimensions in a fixed
    order (`priority_`, `lane_`, `queue_`, `channel_`) + rest, with `all_` before a rest that starts with
    one of those words (or `all`). Names that differ only in where a dimension stands (`rx_prio0_foo`,
    `rx_foo_prio0`) share a key; `curate_counted` keeps the first.
    Naming the dimensions in the key keeps per-queue series out of the family of the port-wide total, so
    a key's label names never vary: direction (always present, "" when the name has none) then the
    dimensions named in the key. Indices beyond the bounds stay in the name.
    Examples: `rx0_xdp_drop` -> stat_queue_xdp_drop{direction=rx,queue=0};
    `ch3_poll` -> stat_channel_poll{direction="",channel=3}; `rx_vport_unicast_bytes` ->
    stat_vport_unicast_bytes{direction=rx}.
    """
    rest = name
    direction = ""
    dims: dict[str, str] = {}
    match = _QUEUE_PREFIX.match(rest)
    if match and (queue := _index(match["queue"], MAX_QUEUE)) is not None:
        direction, dims["queue"] = match["direction"], queue
        rest = rest[match.end() :]
    elif (match := _CHANNEL_PREFIX.match(rest)) and (
        channel := _index(match["channel"] or match["ring"], MAX_QUEUE)
    ) is not None:
        dims["channel"] = channel
        rest = rest[match.end() :]
    elif match := _DIRECTION_PREFIX.match(rest):
        direction = match["direction"]
        rest = rest[match.end() :]
    for label, pattern, bound in (("priority", _PRIORITY_PART, MAX_PRIORITY), ("lane", _LANE_PART, MAX_LANE)):
        match = pattern.search(rest)
        if match and (value := _index(match[label], bound)) is not None:
            dims[label] = value
            rest = f"{rest[: match.start()]}_{rest[match.end() :]}"
    order = [d for d in ("priority", "lane", "queue", "channel") if d in dims]
    fragment = metric_fragment(rest) if rest.strip("_") else "value"
    # The exposition appends _total itself; strip every trailing one (`total_total` is a real-world shape).
    while fragment == "total" or fragment.endswith("_total"):
        fragment = fragment[: -len("_total")] if fragment != "total" else ""
    fragment = fragment or "value"
    # A fragment that itself starts with a dimension's word (mlx5's port-wide tx_queue_stopped beside
    # per-queue tx0_stopped) gets `all_` in front, and so does one starting with `all`: otherwise one key
    # would come with and without that label, and the exposition would drop one side.
    if _ESCAPED_WORD.match(fragment):
        fragment = "all_" + fragment
    key = EXTRA_PREFIX + "".join(f"{d}_" for d in order) + fragment
    return key, (("direction", direction), *((d, dims[d]) for d in order))


def curate(stats: Mapping[str, int], extra_patterns: Sequence[re.Pattern[str]] = ()) -> list[CuratedStat]:
    """The curated subset of one interface's stats, in the driver's order (see `curate_counted`)."""
    return curate_counted(stats, extra_patterns)[0]


def curate_counted(
    stats: Mapping[str, int], extra_patterns: Sequence[re.Pattern[str]] = ()
) -> tuple[list[CuratedStat], int]:
    """The curated subset of one interface's stats, in the driver's order, and how many extras were left
    out past MAX_EXTRA_STATS.

    Known names map through the rule table above (help in CURATED_HELP). Any other name containing a
    `lane_N` is curated through `generic_key`, as is any name an `extra_patterns` regex finds
    (`re.search`, so anchor patterns to match whole names). Extras are counters with unit scale 1, and
    their keys start with `stat_` so they never collide with a curated key. When two names land on the
    same key and labels (e.g. `duplicate metric` and `duplicate_metric`), the first one wins.
    Values outside u64 are dropped. Extras past the first MAX_EXTRA_STATS are left out and counted.
    """
    patterns = tuple(extra_patterns)
    plan, over_limit = _plan(tuple(stats), patterns)
    if not all(0 <= stats[name] < 2**64 for name, *_ in plan):
        # A value outside u64 (which neither the ioctl nor parse_stats_text yields) drops its name, which
        # frees its key for a later name: plan over the names that remain.
        plan, over_limit = _plan(tuple(name for name, value in stats.items() if 0 <= value < 2**64), patterns)
    curated = [CuratedStat(key, stats[name], labels, kind, scale, name) for name, key, labels, kind, scale in plan]
    return curated, over_limit


# A netdev reports the same names, in the same order, every scrape (mlx5: about a thousand, of which a
# hundred are curated): decide the list once and then only pick the curated values out.
@lru_cache(maxsize=32)
def _plan(
    names: tuple[str, ...], extra_patterns: tuple[re.Pattern[str], ...]
) -> tuple[tuple[tuple[str, str, tuple[tuple[str, str], ...], Kind, float], ...], int]:
    """(name, key, labels, kind, scale) of each stat to export, and the number of extras over the limit."""
    plan: list[tuple[str, str, tuple[tuple[str, str], ...], Kind, float]] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    extras = over_limit = 0
    for name in names:
        decided = _decide(name, extra_patterns)
        if decided is None:
            continue
        key, labels, kind, scale = decided
        if (key, labels) in seen:
            continue
        seen.add((key, labels))  # also past the limit: a later name with this key is no further series
        if key.startswith(EXTRA_PREFIX):
            if extras >= MAX_EXTRA_STATS:
                over_limit += 1
                continue
            extras += 1
        plan.append((name, key, labels, kind, scale))
    return tuple(plan), over_limit


# A driver reports the same names every scrape (mlx5: about a thousand per netdev): decide each once.
@lru_cache(maxsize=16384)
def _decide(
    name: str, extra_patterns: tuple[re.Pattern[str], ...]
) -> tuple[str, tuple[tuple[str, str], ...], Kind, float] | None:
    curated = _curated(name)
    if curated is not None:
        return curated
    if _LANE_ANYWHERE.search(name) or any(p.search(name) for p in extra_patterns):
        key, labels = generic_key(name)
        return key, labels, COUNTER, 1.0
    return None
