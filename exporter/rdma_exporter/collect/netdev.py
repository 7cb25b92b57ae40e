"""Exposition of the network interfaces behind RDMA ports: link state, speed, MTU, statistics, ECN, bonds.

Every series carries the `device` and `port` of the RDMA port the netdev belongs to, so it joins with the
`rdma_port_*` series. A netdev can be reached from several RDMA devices (a bond master named in the GID
tables of both slaves' ports); `Locality` picks one device to read and export it, from sysfs alone, so
that device reads running in parallel need not coordinate and the choice does not depend on timing.
The ethtool collector uses the same rules.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..configerror import check_bool
from ..parse.infiniband import DeviceInfo, metric_fragment
from ..parse.netdev import (
    ARPHRD_INFINIBAND,
    MAX_PRIORITY,
    Locality,
    Netdev,
    read_netdev_identity,
    read_netdev_state,
)
from ..parse.reader import REASON_MISSING, SysfsReader
from .base import DynamicMetricSpec, FamilySet, MetricSpec, ScrapeContext, ShadowedFiles, lint_safe

NAME: Final = "netdev"


class SeenNetdevs:
    """Netdevs each device's reads have read, to tell a netdev that vanished from one never visible here.

    GID tables also name netdevs of other network namespaces (macvlans and VFs handed to containers),
    which never appear in this sysfs; counting those as errors on every scrape would drown real losses.
    A netdev that was read before and is now gone is counted once, then forgotten until it is back, and
    the device's static info, which still names it, is read again (a rename, or a re-created VF's netdev).
    Kept per device and only for the netdevs the device's last read named, so that names which are gone
    for good (VFs created per job, renames) do not pile up over weeks.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, set[str]] = {}

    def __len__(self) -> int:
        with self._lock:
            return sum(len(names) for names in self._seen.values())

    def add(self, device: str, name: str) -> None:
        with self._lock:
            self._seen.setdefault(device, set()).add(name)

    def check_vanished(self, locality: Locality, device: str, name: str, reader: SysfsReader) -> None:
        with self._lock:
            names = self._seen.get(device)
            if names is None or name not in names:
                return
            names.discard(name)
        reader.fail(REASON_MISSING, locality.net_dir(name), "netdev vanished since it was last read")
        reader.static_stale = True

    def retain(self, device: str, names: Collection[str]) -> None:
        """Forget the device's netdevs that its read did not name (its static info no longer does)."""
        with self._lock:
            seen = self._seen.get(device)
            if seen is not None and not seen.issubset(names):
                seen.intersection_update(names)

    def forget(self, device: str) -> None:
        with self._lock:
            self._seen.pop(device, None)


LABELS: Final = ("device", "port", "netdev")

UP: Final = MetricSpec(
    "rdma_netdev_up",
    "gauge",
    "1 if the netdev's operstate is up, 0 for any other state (down, lowerlayerdown, dormant, unknown...).",
    LABELS,
)
ADMIN_UP: Final = MetricSpec(
    "rdma_netdev_admin_up",
    "gauge",
    "1 if the netdev is administratively up (IFF_UP in flags), 0 if it was set down (ip link set down). "
    "A RoCE port reads DOWN both when its link is lost and when its netdev was set down; this tells which.",
    LABELS,
)
CARRIER: Final = MetricSpec(
    "rdma_netdev_carrier",
    "gauge",
    "1 if the netdev has carrier (physical link), 0 if not; absent while the netdev is administratively "
    "down, when the kernel has no answer.",
    LABELS,
)
CARRIER_CHANGES: Final = MetricSpec(
    "rdma_netdev_carrier_changes_total", "counter", "Carrier (link) changes in either direction.", LABELS
)
CARRIER_UP: Final = MetricSpec(
    "rdma_netdev_carrier_up_changes_total", "counter", "Times the carrier came up (kernel >= 4.16).", LABELS
)
CARRIER_DOWN: Final = MetricSpec(
    "rdma_netdev_carrier_down_changes_total",
    "counter",
    "Times the carrier went down (kernel >= 4.16); on a RoCE netdev, a link drop of the RDMA port.",
    LABELS,
)
SPEED: Final = MetricSpec(
    "rdma_netdev_speed_bytes_per_second",
    "gauge",
    "Link speed the netdev reports, in bytes per second (a bond reports the sum of its active slaves); "
    "absent while the driver reports none (an Ethernet NIC without link). An IPoIB netdev may report its port's "
    "rate, also while the port is down: no trained speed then (read it with rdma_netdev_carrier).",
    LABELS,
)
MTU: Final = MetricSpec("rdma_netdev_mtu_bytes", "gauge", "MTU of the netdev, in bytes.", LABELS)
ECN: Final = MetricSpec(
    "rdma_netdev_ecn_enabled",
    "gauge",
    "1 if RoCE ECN (DCQCN) is enabled for the priority, 0 if not (MLNX_OFED ecn/roce_np|roce_rp/enable/<prio>). "
    "role np: the notification point, which answers ECN-marked packets with CNPs; rp: the reaction point, "
    "which slows down on CNPs. Off on the RoCE priority leaves congestion to PFC alone.",
    (*LABELS, "role", "priority"),
)
BOND_SLAVE: Final = MetricSpec(
    "rdma_netdev_bond_slave_info",
    "info",
    "A slave of a bond netdev that carries RDMA (RoCE LAG or a bonded RoCE port), with the bonding mode. "
    "The slaves' own series carry the device and port of the bond.",
    (*LABELS, "slave", "mode"),
)

# struct rtnl_link_stats64 as the kernel shows it under statistics/: net-sysfs.c stops at rx_nohandler
# (later fields such as rx_otherhost_dropped are netlink only). Other files get a generic HELP.
STATISTICS_HELP: Final[dict[str, str]] = {
    "rx_packets": "Packets received by the kernel network stack (RDMA traffic bypasses it and is not counted, "
    "except on an mlx5 switchdev uplink representor, whose counts are the physical port's).",
    "tx_packets": "Packets transmitted by the kernel network stack (RDMA traffic is not counted, except on an "
    "mlx5 switchdev uplink representor, whose counts are the physical port's).",
    "rx_bytes": "Bytes received by the kernel network stack (RDMA traffic is not counted, except on an mlx5 "
    "switchdev uplink representor, whose counts are the physical port's).",
    "tx_bytes": "Bytes transmitted by the kernel network stack (RDMA traffic is not counted, except on an mlx5 "
    "switchdev uplink representor, whose counts are the physical port's).",
    "rx_errors": "Received packets with errors of any kind (the sum of the rx_*_errors details).",
    "tx_errors": "Packets that failed to transmit, of any kind.",
    "rx_dropped": "Received packets dropped before reaching the stack (no buffer, filtered, unknown protocol).",
    "tx_dropped": "Packets dropped on transmit (queue full, no resources).",
    "multicast": "Multicast packets received.",
    "collisions": "Collisions (half-duplex media only).",
    "rx_length_errors": "Received frames with a bad length.",
    "rx_over_errors": "Receive ring overflows.",
    "rx_crc_errors": "Received frames with a bad CRC (FCS).",
    "rx_frame_errors": "Received frames with alignment errors.",
    "rx_fifo_errors": "Receive FIFO overruns.",
    "rx_missed_errors": "Packets the NIC dropped for lack of host receive buffers.",
    "tx_aborted_errors": "Transmissions aborted by the NIC.",
    "tx_carrier_errors": "Transmissions lost to carrier errors.",
    "tx_fifo_errors": "Transmit FIFO underruns.",
    "tx_heartbeat_errors": "SQE heartbeat errors (legacy Ethernet).",
    "tx_window_errors": "Late collisions (half-duplex media only).",
    "rx_compressed": "Compressed packets received (CSLIP/PPP).",
    "tx_compressed": "Compressed packets transmitted (CSLIP/PPP).",
    "rx_nohandler": "Packets received with no protocol handler (e.g. on an inactive bond slave).",
}

STATISTICS_DYNAMIC: Final = DynamicMetricSpec(
    "rdma_netdev_<counter>_total",
    "counter",
    "Every file of the netdev's statistics/ directory (rx_bytes, rx_errors, rx_dropped, tx_carrier_errors...). "
    "RoCE netdevs and RoCE LAG bonds always; IPoIB interfaces only with collector.netdev.ipoib_statistics.",
    LABELS,
)
_LINK_SPECS: Final = (UP, ADMIN_UP, CARRIER, CARRIER_CHANGES, CARRIER_UP, CARRIER_DOWN, SPEED, MTU)
_FIXED_NAMES: Final = frozenset(spec.name for spec in _LINK_SPECS)


class _StatisticsSpecs:
    """MetricSpecs of statistics/ files, made once per file name."""

    def __init__(self) -> None:
        self._cache: dict[str, MetricSpec | None] = {}
        self.shadowed = ShadowedFiles(lambda file: spec.name if (spec := self.get(file)) else None)

    def get(self, file: str) -> MetricSpec | None:
        if file not in self._cache:
            # Token by token as promtool wants it (rx_bits, tx_gauge_ms...), as for hw_counters/ files.
            name = f"rdma_netdev_{lint_safe(metric_fragment(file), 'counter')}_total"
            if name in _FIXED_NAMES:
                self._cache[file] = None  # a driver file must not shadow a link-state counter
            else:
                described = STATISTICS_HELP.get(file, f"Interface counter statistics/{file}.")
                self._cache[file] = MetricSpec(name, "counter", described, LABELS)
        return self._cache[file]


_STATISTICS = _StatisticsSpecs()


@dataclass(frozen=True, slots=True)
class NetdevReading:
    """The netdevs one RDMA device read, each with the port it belongs to, in port order."""

    netdevs: tuple[tuple[int, Netdev], ...]


def expose_netdev(netdev: Netdev, device: str, port: int, out: FamilySet) -> None:
    labels = [device, str(port), netdev.name]
    if netdev.operstate is not None:
        out.add(UP, labels, 1 if netdev.operstate == "up" else 0)
    if netdev.admin_up is not None:
        out.add(ADMIN_UP, labels, 1 if netdev.admin_up else 0)
    if netdev.carrier is not None:
        out.add(CARRIER, labels, 1 if netdev.carrier else 0)
    if netdev.carrier_changes is not None:
        out.add(CARRIER_CHANGES, labels, netdev.carrier_changes)
    if netdev.carrier_up_count is not None:
        out.add(CARRIER_UP, labels, netdev.carrier_up_count)
    if netdev.carrier_down_count is not None:
        out.add(CARRIER_DOWN, labels, netdev.carrier_down_count)
    if netdev.speed_bps is not None:
        out.add(SPEED, labels, netdev.speed_bps / 8)
    if netdev.mtu is not None:
        out.add(MTU, labels, netdev.mtu)
    shadowed = _STATISTICS.shadowed(netdev.statistics_files)
    for file, value in netdev.statistics.items():
        spec = _STATISTICS.get(file)
        if spec is not None and file not in shadowed:
            out.add(spec, labels, value)
    for (role, priority), enabled in sorted(netdev.ecn.items()):
        if 0 <= priority <= MAX_PRIORITY:
            out.add(ECN, [*labels, role, str(priority)], 1 if enabled else 0)
    if netdev.is_bond_master:
        for slave in netdev.bond_slaves:
            out.add(BOND_SLAVE, [*labels, slave, netdev.bond_mode or ""], 1)


# Validators of the `collector.netdev` settings in the config file (config.COLLECTOR_SETTINGS).
# ipoib_statistics: an IPoIB interface's statistics/ counts IP over InfiniBand, not the fabric's RDMA
# traffic (the port counters have that), no rule or dashboard reads them, and node_exporter's netdev
# collector exports the same counters. Off, they cost neither a read per file nor a series each (about
# 24 of both per IPoIB interface, a quarter of the sample node's per-scrape reads). RoCE netdevs' and
# RoCE LAG bonds' are always read (on RoCE the netdev carries the RDMA traffic). A netdev whose type is
# unreadable goes by its port's link layer, read as InfiniBand where that is unreadable too: see is_ipoib.
SETTINGS: Final = {"ipoib_statistics": check_bool}


def is_ipoib(arphrd_type: int | None, device: DeviceInfo, port: int) -> bool:
    """An IPoIB netdev by its type; with the type unreadable, by the link layer of `device`'s `port`.
    Taken as not IPoIB, a garbled type file turned on the statistics that
    collector.netdev.ipoib_statistics keeps off."""
    if arphrd_type is not None:
        return arphrd_type == ARPHRD_INFINIBAND
    info = next((info for info in device.ports if info.number == port), None)
    return info is None or info.reads_as_infiniband


class NetdevSource:
    """Netdevs of every RDMA port (RoCE netdevs, IPoIB interfaces, bonds and their slaves)."""

    name = NAME
    # class/net attributes (speed, bonding/slaves...) take the rtnl lock in the kernel.
    needs_rtnl = True
    specs: tuple[MetricSpec, ...] = (*_LINK_SPECS, ECN, BOND_SLAVE)
    dynamic_specs: tuple[DynamicMetricSpec, ...] = (STATISTICS_DYNAMIC,)

    def __init__(self, ipoib_statistics: bool = False) -> None:
        self.seen = SeenNetdevs()
        self.ipoib_statistics = ipoib_statistics

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> NetdevSource:
        return cls(settings.get("ipoib_statistics", False))

    def read(self, ctx: ScrapeContext, device: DeviceInfo, reader: SysfsReader) -> NetdevReading:
        locality = Locality(ctx.sys_root, device.name, reader)
        done: set[str] = set()
        netdevs: list[tuple[int, Netdev]] = []
        bonds: list[tuple[int, Sequence[str]]] = []  # port, slaves: of the bonds reached, read here or not

        def visit(port: int, name: str) -> Netdev | None:
            if name in done:
                return None  # reached from two ports of this device: the lower port has it
            done.add(name)
            if not locality.exists(name):
                self.seen.check_vanished(locality, device.name, name, reader)
                return None
            if not locality.is_local(name):
                if locality.is_bond(name):  # read by another device, but its slaves may be this one's links
                    bonds.append((port, locality.bond_slaves(name)))
                return None  # another RDMA device reads it
            # Static attributes come from the device's cached info; a netdev that appeared since it was
            # read (no uevent seen) has its identity read now.
            identity = device.netdev(name) or read_netdev_identity(ctx.sys_root, name, reader)
            if identity is None:
                return None
            statistics = self.ipoib_statistics or not is_ipoib(identity.type, device, port)
            netdev = read_netdev_state(ctx.sys_root, identity, reader, statistics=statistics)
            if netdev is not None:
                self.seen.add(device.name, name)
                netdevs.append((port, netdev))
            return netdev

        for port in device.ports:
            for name in port.netdevs:
                netdev = visit(port.number, name)
                if netdev is not None and netdev.is_bond_master:
                    bonds.append((port.number, netdev.bond_slaves))
        # RoCE LAG: the port maps to the bond; its slaves are the physical links. They are visited after
        # every port's own netdevs: a bond over both ports of a two-port function that is no RoCE LAG
        # (the RDMA device keeps both ports) is in the active slave's GID table only, and its other
        # slave is the other port's netdev, whose series must join that port. A bond over two RDMA
        # devices' netdevs (two cards, no RoCE LAG) is read by one of them (its anchor's,
        # parse.netdev.Locality), but the kernel gives a slave no GIDs of its own: the other device's port
        # lists only the bond, and its own link is reached through it.
        for number, slaves in bonds:
            for slave in slaves:
                visit(number, slave)
        self.seen.retain(device.name, done)
        netdevs.sort(key=lambda item: item[0])  # stable: port order, each port's netdevs as visited
        return NetdevReading(tuple(netdevs))

    def forget_device(self, device: str) -> None:
        """The device is gone (engine): so is what was known of its netdevs."""
        self.seen.forget(device)

    def expose(self, results: Mapping[str, NetdevReading], out: FamilySet) -> None:
        emitted: set[str] = set()
        for device in sorted(results):
            for port, netdev in results[device].netdevs:
                # Locality gives each netdev one reader; should two devices still both read one (two soft
                # RDMA devices on one NIC), the first in device order exports it.
                if netdev.name not in emitted:
                    emitted.add(netdev.name)
                    expose_netdev(netdev, device, port, out)
