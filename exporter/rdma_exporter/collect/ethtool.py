"""Exposition of `ethtool -S` statistics of RoCE netdevs: PFC and global pause, pause storms, discards,
PHY errors, per-lane errors and PCIe stalls, curated and labelled by parse/ethtool.py.

Only the netdevs of Ethernet RDMA ports are read (IPoIB interfaces have no such counters): the port's own
physical netdev, or the slaves of the bond a RoCE LAG port maps to. Uppers without hardware (VLANs,
macvlans) are skipped. Each netdev is read by one RDMA device per scrape (see parse.netdev.Locality), so a LAG's
slaves are asked once. Statistics come from the SIOCETHTOOL ioctl, or in fixture mode
(`--path.ethtool=DIR`) from `DIR/<netdev>`, a saved `ethtool -S <netdev>` output.

A failure (netdev gone, EOPNOTSUPP, EPERM, a stat set that would not hold still, a missing capture)
costs that netdev's statistics for the scrape and is counted against the RDMA device; the RDMA series
and the other netdevs are unaffected.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Final

from ..configerror import ConfigError, compile_regex
from ..parse.ethtool import (
    CURATED_HELP,
    CURATED_KINDS,
    MAX_EXTRA_STATS,
    CuratedStat,
    EthtoolCall,
    EthtoolError,
    SocketEthtool,
    StatSetReader,
    curate_counted,
    read_stats_file,
)
from ..parse.infiniband import DeviceInfo
from ..parse.netdev import Locality
from ..parse.reader import (
    REASON_IO,
    REASON_MALFORMED,
    REASON_MISSING,
    REASON_UNSUPPORTED,
    SysfsReader,
    is_sysfs_mount,
)
from .base import DynamicMetricSpec, FailureEpisodes, FamilySet, MetricSpec, ScrapeContext, lint_safe
from .netdev import SeenNetdevs

log = logging.getLogger(__name__)

NAME: Final = "ethtool"
PREFIX: Final = "rdma_ethtool_"
NETDEV: Final = ("device", "port", "netdev")
# More than this many extra patterns is a config mistake (one alternation is the way to say many names).
MAX_EXTRA_PATTERNS: Final = 64

_socket: SocketEthtool | None = None
_socket_lock = threading.Lock()


def ioctl_socket() -> SocketEthtool | None:
    """The socket every source reads SIOCETHTOOL through, opened at the first read and kept for the life of
    the process: a socket per source left the old one to the garbage collector at every reload. None if it
    cannot be opened (read_stat_values then tries its own, and fails with the reason)."""
    global _socket
    with _socket_lock:
        if _socket is None:
            try:
                _socket = SocketEthtool()
            except OSError:
                return None
        return _socket


def check_extra_stats(source: str, key: str, value: Any) -> tuple[re.Pattern[str], ...]:
    """Validator of `collector.ethtool.extra_stats`: a list of regexes searched in the ethtool names."""
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, list):
        raise ConfigError(source, key, f"expected a list of regular expressions, got {type(value).__name__}")
    if len(value) > MAX_EXTRA_PATTERNS:
        raise ConfigError(source, key, f"at most {MAX_EXTRA_PATTERNS} patterns; combine names with |")
    patterns = []
    for index, pattern in enumerate(value):
        where = f"{key}[{index}]"
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(source, where, f"expected a non-empty regular expression string, got {pattern!r}")
        patterns.append(compile_regex(source, where, pattern))
    return tuple(patterns)


# Validators of the `collector.ethtool` settings in the config file (config.COLLECTOR_SETTINGS).
SETTINGS: Final = {"extra_stats": check_extra_stats}

# Label names of every curated key, after the netdev labels, in the order parse/ethtool.py gives them.
# Declared here so that METRICS.md lists each metric; test_collect_roce checks it against the parser.
CURATED_LABELS: Final[dict[str, tuple[str, ...]]] = {
    "pfc_pause_frames": ("direction", "priority"),
    "pfc_pause_duration_seconds": ("direction", "priority"),
    "pfc_pause_transitions": ("direction", "priority"),
    "global_pause_frames": ("direction",),
    "global_pause_duration_seconds": ("direction",),
    "global_pause_transitions": ("direction",),
    "pause_mac_control_frames": ("direction",),
    "pause_storm_warning_events": ("direction",),
    "pause_storm_error_events": ("direction",),
    "port_discards": ("direction",),
    "port_errors": ("direction",),
    "out_of_buffer": ("direction",),
    "priority_discards": ("direction", "priority"),
    "priority_buffer_discards": ("direction", "priority"),
    "priority_congestion_discards": ("direction", "priority"),
    "priority_ecn_marked_packets": ("direction", "priority"),
    "priority_bytes": ("direction", "priority"),
    "priority_packets": ("direction", "priority"),
    "link_down_events": (),
    "pcs_symbol_errors": ("direction",),
    "symbol_error_packets": ("direction",),
    "corrected_bits": ("direction",),
    "crc_error_packets": ("direction",),
    "oversize_packets": ("direction",),
    "out_of_range_length_packets": ("direction",),
    "in_range_length_error_packets": ("direction",),
    "undersize_packets": ("direction",),
    "fragment_packets": ("direction",),
    "jabber_packets": ("direction",),
    "port_bits": ("direction",),
    "port_bytes": ("direction",),
    "port_packets": ("direction",),
    "port_buffer_almost_full_events": ("direction",),
    "lane_raw_errors": ("direction", "lane"),
    "pci_signal_integrity_errors": ("direction",),
    "pci_outbound_stalled_ratio": ("operation",),
    "pci_outbound_stalled_seconds": ("operation",),
    "pci_outbound_buffer_overflow_packets": (),
    "device_out_of_buffer": (),
    "module_events": ("event",),
}


# Two curated keys are renamed by hand (promtool rejects "bits"); the rest go through lint_safe.
CURATED_RENAMES: Final = {"corrected_bits": "corrected_bit_errors", "port_bits": "port_bit_count"}


def metric_name(key: str, kind: str) -> str:
    safe = lint_safe(CURATED_RENAMES.get(key, key), kind)
    return f"{PREFIX}{safe}_total" if kind == "counter" else f"{PREFIX}{safe}"


def _curated_help(key: str) -> str:
    # The parser's help names other keys ("divide by port_bits"); name the metrics operators will see.
    text = CURATED_HELP[key]
    for old in CURATED_RENAMES:
        text = re.sub(rf"\b{old}\b", metric_name(old, "counter"), text)
    return f"{text} From ethtool -S."


CURATED_SPECS: Final[dict[str, MetricSpec]] = {
    key: MetricSpec(
        metric_name(key, CURATED_KINDS[key]),
        CURATED_KINDS[key],
        _curated_help(key),
        (*NETDEV, *labels),
    )
    for key, labels in CURATED_LABELS.items()
}
# Per netdev read: how many of its statistics the rule table knew. Drivers name their statistics freely, so
# a NIC whose driver the table does not cover reads fine and exports nothing; this makes that visible.
CURATED_STATS: Final = MetricSpec(
    f"{PREFIX}curated_stats",
    "gauge",
    "Number of the netdev's ethtool -S statistics exported under a curated rdma_ethtool_* name (extra_stats "
    "and uncurated per-lane ones not counted); 0 also for a driver that lists no statistics. Without a "
    "curated CRC counter among them the driver's names are not known to the exporter (a driver other than "
    "mlx5, bnxt_en, ice or i40e; mlx4_en's pause names are known, not its CRC counter), so the netdev's PFC, "
    "pause and PHY series are missing.",
    NETDEV,
)
EXTRA_OVER_LIMIT: Final = MetricSpec(
    f"{PREFIX}extra_stats_over_limit",
    "gauge",
    f"Number of the netdev's ethtool -S statistics selected as rdma_ethtool_stat_* series (uncurated per-lane "
    f"ones and collector.ethtool.extra_stats matches) past the first {MAX_EXTRA_STATS}, in the driver's order, "
    "and so not exported. Above 0: narrow the extra_stats patterns, or the driver reports unexpected names.",
    NETDEV,
)
EXTRA_HELP: Final = (
    "ethtool -S statistic without a curated meaning (an uncurated per-lane counter, or one selected by "
    "collector.ethtool.extra_stats); see the driver's documentation of the ethtool name."
)
EXTRA_DYNAMIC: Final = DynamicMetricSpec(
    f"{PREFIX}stat_<counter>_total",
    "counter",
    "A further ethtool statistic: per-lane ones not curated above, and those matching the "
    "collector.ethtool.extra_stats patterns. Besides direction (rx, tx or empty) it has a priority, lane, "
    "queue or channel label when the key names that dimension, e.g. stat_queue_xdp_drop{queue=...}.",
    (*NETDEV, "direction"),
    ("priority", "lane", "queue", "channel"),
)


@lru_cache(maxsize=8)
def live_sysfs(sys_root: str) -> bool:
    """Is `sys_root` a mounted sysfs (the live kernel), rather than a fixture tree on disk?

    Only then do the tree's netdev names mean anything to the ioctl. When mountinfo cannot be read the
    answer is yes: better a counted failure than silence on a real host.
    """
    return is_sysfs_mount(sys_root) is not False


@dataclass(frozen=True, slots=True)
class EthtoolReading:
    """The curated stats of the netdevs one RDMA device read, each with the port it belongs to."""

    # (port, netdev, its curated stats, how many extras were left out past MAX_EXTRA_STATS)
    netdevs: tuple[tuple[int, str, tuple[CuratedStat, ...], int], ...]


def scaled(stat: CuratedStat) -> float:
    """The value in base units; microseconds and percent are divided, not multiplied, to stay exact."""
    if stat.unit_scale == 1:
        return stat.value
    inverse = round(1 / stat.unit_scale)
    if inverse > 1 and abs(inverse * stat.unit_scale - 1) < 1e-9:
        return stat.value / inverse
    return stat.value * stat.unit_scale


MAX_SERIES_MEMO: Final = 65536


_WARNED_NOT_SYSFS: set[str] = set()  # trees already warned of as no mounted sysfs


class EthtoolSource:
    """`ethtool -S` statistics of the netdevs of Ethernet (RoCE) ports."""

    name = NAME
    # The SIOCETHTOOL ioctl runs under the rtnl lock.
    needs_rtnl = True
    specs: tuple[MetricSpec, ...] = (*CURATED_SPECS.values(), CURATED_STATS, EXTRA_OVER_LIMIT)
    dynamic_specs: tuple[DynamicMetricSpec, ...] = (EXTRA_DYNAMIC,)

    def __init__(
        self,
        ethtool_dir: Path | None = None,
        extra_patterns: Sequence[re.Pattern[str]] = (),
        call: EthtoolCall | None = None,
    ) -> None:
        """`ethtool_dir` switches to fixture mode; `call` replaces the SIOCETHTOOL ioctl (tests)."""
        self.ethtool_dir = ethtool_dir
        self.extra_patterns = tuple(extra_patterns)
        self.call = call
        self.seen = SeenNetdevs()
        self._extra_specs: dict[str, MetricSpec] = {}
        # (key, labels) -> (spec or None, label values): the same few hundred every scrape.
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[MetricSpec | None, tuple[str, ...]]] = {}
        # Unexpected exceptions per netdev: logged once per episode, as the engine logs a failing
        # collector, not once per scrape.
        self._failures = FailureEpisodes()
        # (device, netdev) with extras over the limit: logged once per episode, which ends when they fit.
        self._over_limit = FailureEpisodes()
        # Per device, its netdevs' stat names as last read through the ioctl: only that device's job uses its
        # entry. The socket they are read through is the process's (ioctl_socket).
        self._stat_readers: dict[str, StatSetReader] = {}

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], ethtool_dir: Path | None = None) -> EthtoolSource:
        return cls(ethtool_dir, settings.get("extra_stats", ()))

    def _enabled(self, ctx: ScrapeContext) -> bool:
        if self.ethtool_dir is not None or self.call is not None or live_sysfs(str(ctx.sys_root)):
            return True
        root = str(ctx.sys_root)
        if root not in _WARNED_NOT_SYSFS:
            # Once per process and tree: a reload builds a new source, and said it again each time.
            _WARNED_NOT_SYSFS.add(root)
            log.warning(
                "%s is not a mounted sysfs: the ethtool collector reads nothing (the ioctl would read this "
                "host's netdevs); give it captures with --path.ethtool",
                ctx.sys_root,
            )
        return False

    def _targets(
        self, locality: Locality, device: str, names: Sequence[str], reader: SysfsReader
    ) -> tuple[list[str], list[str]]:
        """The netdevs of one port whose hardware statistics this device reads: its own, and its bonds'
        slaves."""
        own: list[str] = []
        slaves: list[str] = []
        for name in names:
            if not locality.exists(name):
                self.seen.check_vanished(locality, device, name, reader)
            elif locality.is_bond(name):
                # A bond has no ethtool statistics of its own; PFC and PHY counters live on the slaves.
                slaves += [s for s in locality.bond_slaves(name) if locality.is_physical(s) and locality.is_local(s)]
            elif locality.is_physical(name) and locality.is_local(name):
                own.append(name)
            # else a software upper (VLAN, macvlan), whose lower is the port's netdev, or another device's
        return own, slaves

    def forget_device(self, device: str) -> None:
        """The device is gone (engine): so are its netdevs' failure episodes and what was read of them."""
        self._stat_readers.pop(device, None)
        self._failures.forget(device)
        self.seen.forget(device)
        self._over_limit.forget(device)

    def read(self, ctx: ScrapeContext, device: DeviceInfo, reader: SysfsReader) -> EthtoolReading:
        netdevs: list[tuple[int, str, tuple[CuratedStat, ...], int]] = []
        if not self._enabled(ctx) or all(port.link_layer != "Ethernet" for port in device.ports):
            # Nothing of it is read: as if it were gone, but said, as for a netdev that went away.
            self._end_failures(device.name, ())
            self.forget_device(device.name)
            return EthtoolReading(())
        locality = Locality(ctx.sys_root, device.name, reader)
        own: list[tuple[int, str]] = []
        slaves: list[tuple[int, str]] = []
        for port in device.ports:
            if port.link_layer != "Ethernet":
                continue  # IPoIB netdevs have no PFC, ECN or PHY counters of the RDMA link
            port_own, port_slaves = self._targets(locality, device.name, port.netdevs, reader)
            own += [(port.number, name) for name in port_own]
            slaves += [(port.number, name) for name in port_slaves]
        # Bond slaves after every port's own netdevs, as in NetdevSource.read: a bond over both ports of a
        # two-port function that is no RoCE LAG is in one port's GID table, and its other slave is the
        # other port's netdev.
        done: set[str] = set()
        stat_reader = None
        if self.ethtool_dir is None:
            stat_reader = self._stat_readers.get(device.name)
            if stat_reader is None:
                stat_reader = self._stat_readers[device.name] = StatSetReader()
        for number, name in own + slaves:
            if name in done:
                continue
            done.add(name)
            read = self._read_netdev(device.name, name, reader, locality, stat_reader)
            if read is not None:
                self.seen.add(device.name, name)
                netdevs.append((number, name, *read))
        if stat_reader is not None:
            stat_reader.retain(done)
        self._end_failures(device.name, done)
        self._over_limit.retain(device.name, done)
        self.seen.retain(device.name, done)
        netdevs.sort(key=lambda item: item[0])  # stable: port order, each port's netdevs as visited
        return EthtoolReading(tuple(netdevs))

    def _end_failures(self, device: str, read: Collection[str]) -> None:
        """End the failure episodes of the device's netdevs not in `read`: a netdev that failed and then
        went away (a driver reload) starts a new episode if it comes back. Said, or the log's last word on
        it would be that it cannot be read."""
        for name in self._failures.retain(device, read):
            log.info(
                "ethtool statistics of %s (device %s) are no longer read: the netdev is gone or no longer one "
                "of the device's RoCE netdevs",
                name, device,
            )

    def _read_netdev(
        self,
        device: str,
        name: str,
        reader: SysfsReader,
        locality: Locality,
        stat_reader: StatSetReader | None,
    ) -> tuple[tuple[CuratedStat, ...], int] | None:
        """The netdev's curated stats and extras over the limit, or None if they cannot be read; through
        `stat_reader` unless from a capture."""
        where: str | Path = f"SIOCETHTOOL {name}" if self.ethtool_dir is None else self.ethtool_dir / name
        reader.at = where
        try:
            if self.ethtool_dir is not None:
                malformed: list[str] = []
                raw = read_stats_file(self.ethtool_dir, name, malformed)
                for line in malformed:
                    reader.fail(REASON_MALFORMED, where, f"not 'name: value': {line[:60]!r}")
                curated, over_limit = curate_counted(raw, self.extra_patterns)
            else:
                assert stat_reader is not None  # read() gives one to every device it reads through the ioctl
                call = self.call or ioctl_socket()
                curated, over_limit = stat_reader.read_curated(name, self.extra_patterns, call)
        except EthtoolError as exc:
            if exc.reason == REASON_MISSING and self.ethtool_dir is None and locality.exists(name):
                # The ioctl looks the name up in this process's network namespace, sysfs lists the host's:
                # a netdev sysfs still lists that the ioctl cannot find is not gone, the exporter runs in
                # another namespace (a container without host networking). As "missing" it was logged at
                # info and no alert saw it, while every PFC, pause and PHY series of the node was absent.
                exc = EthtoolError(
                    name, REASON_IO,
                    f"{exc.detail}, yet sysfs lists it: is the exporter outside the host's network namespace "
                    "(hostNetwork: true, docker --network host)?",
                )
            reader.fail(exc.reason, where, exc.detail)
            # The engine's read-error lines name sysfs files only: an ioctl or a capture file is logged
            # here, once per episode, or every PFC series of a port could vanish with nothing in the log.
            if self._failures.start((device, name), exc.reason):
                level = logging.INFO if exc.reason in (REASON_MISSING, REASON_UNSUPPORTED) else logging.WARNING
                log.log(
                    level,
                    "ethtool statistics of %s (device %s) cannot be read (%s): %s: %s; counted in "
                    "rdma_exporter_file_read_errors_total, not logged again while it goes on",
                    name, device, exc.reason, where, exc.detail,
                )
            if exc.reason == REASON_UNSUPPORTED:
                # The driver's whole answer: no statistics. Exported as none curated, or no alert could
                # tell this port from one that is not RoCE at all (RdmaRoceStatisticsUnknown).
                return (), 0
        except Exception as exc:  # a parser bug must cost this netdev only, not the device's other ports
            self._failures.log_failure(log, (device, name), exc, "ethtool statistics of %s failed: %r", name, exc)
            reader.fail(REASON_IO, where, repr(exc))
        else:
            if self._failures.succeeded((device, name)):
                log.info("ethtool statistics of %s (device %s) read again", name, device)
            self._log_over_limit(device, name, over_limit)
            return tuple(curated), over_limit
        return None

    def _log_over_limit(self, device: str, name: str, over_limit: int) -> None:
        if not over_limit:
            self._over_limit.succeeded((device, name))
        elif self._over_limit.start((device, name), "over limit"):
            advice = (
                "narrow collector.ethtool.extra_stats"
                if self.extra_patterns
                else "the driver lists unexpected lane_N statistics"
            )
            log.warning(
                "ethtool statistics of %s (%s): %d rdma_ethtool_stat_* series past the limit of %d a netdev "
                "are not exported (rdma_ethtool_extra_stats_over_limit); %s",
                name, device, over_limit, MAX_EXTRA_STATS, advice,
            )

    def _spec(self, stat: CuratedStat) -> MetricSpec | None:
        labels = (*NETDEV, *(label for label, _ in stat.labels))
        spec = CURATED_SPECS.get(stat.key)
        if spec is None:
            name = metric_name(stat.key, stat.kind)
            spec = self._extra_specs.get(name)
            if spec is None:
                spec = self._extra_specs[name] = MetricSpec(name, stat.kind, EXTRA_HELP, labels)
        # A key's labels never vary (parse/ethtool.py); should that break, skip rather than mislabel.
        return spec if spec.labels == labels else None

    def expose(self, results: Mapping[str, EthtoolReading], out: FamilySet) -> None:
        emitted: set[str] = set()
        for device in sorted(results):
            for port, name, curated, over_limit in results[device].netdevs:
                if name in emitted:
                    continue  # see NetdevSource.expose
                emitted.add(name)
                base = [device, str(port), name]
                series: set[tuple[str, tuple[str, ...]]] = set()
                known = 0
                for stat in curated:
                    series_of = self._series.get((stat.key, stat.labels))
                    if series_of is None:
                        if len(self._series) >= MAX_SERIES_MEMO:
                            self._series.clear()  # bounded even if a driver kept inventing names
                        series_of = self._series[(stat.key, stat.labels)] = (
                            self._spec(stat),
                            tuple(value for _, value in stat.labels),
                        )
                    spec, values = series_of
                    # Two extras whose names differ only in a token lint_safe rewrote: keep the first.
                    if spec is not None and (spec.name, values) not in series:
                        series.add((spec.name, values))
                        out.add(spec, [*base, *values], scaled(stat))
                        if stat.key in CURATED_SPECS:
                            known += 1
                out.add(CURATED_STATS, base, known)
                out.add(EXTRA_OVER_LIMIT, base, over_limit)
