"""Device discovery: udev events when the kernel can send them, a rescan on every scrape otherwise.

A VF or a whole HCA can appear or vanish at any time, and a driver reload or a netdev rename changes
static attributes that the engine caches. The monitor listens to uevents of the `infiniband`,
`infiniband_verbs`, `net`, `pci` and `hwmon` subsystems and tells the inventory what to forget:

- infiniband add/remove/change/move: that RDMA device (relist, re-read its static info), and on the
  removal of a VF its PF, whose count of VFs dropped;
- pci change on a cached device's function: that device (writing sriov_numvfs sends it on the PF);
- infiniband_verbs (uverbsN, re-created on driver reload): every device, since the event names none;
- hwmon add/remove under a cached device's function (or a function behind its ports' netdevs, as a RoCE
  LAG device's second port): that device. mlx5 registers its hwmon device after its RDMA device
  (mlx5_init_one_devl_locked), so a device read in between was cached without sensors;
- net: the RDMA devices that own the netdev (by its name, old name on a rename, or its PCI function);
  netdevs of no RDMA device (container veths, bridges) change nothing.

An IP address added to or removed from a RoCE port's netdev (or an upper of it, such as a VLAN) adds or
removes a GID of the port, and the kernel sends no uevent for it. Address changes are therefore watched
on an rtnetlink socket (RTM_NEWADDR/RTM_DELADDR) beside the uevent one, and refresh the RDMA devices whose
ports carry that netdev or one of its lowers, and once more when the kernel's GID work has surely run
(ADDRESS_SETTLE_SECONDS). Without it the GID counts and the port's netdevs stayed as
they were at start-up until the 15-minute resync (seen on a real rxe0: a second IPv4 address made the
kernel's RoCE v2 GIDs 3 while rdma_port_gids kept saying 2).

Events come from udevd when it runs (after its rules renamed the netdevs), else straight from the kernel
(containers with the host's network namespace but no udevd). Without either, or when the exporter reads
a tree that is not the kernel's sysfs (fixtures, a replayed node), it falls back to rescanning.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .collect.inventory import Inventory
from .parse.netdev import MAX_STACK, card_bond_slaves
from .parse.reader import PCI_ADDRESS, is_sysfs_mount

log = logging.getLogger(__name__)

SUBSYSTEMS: Final = ("infiniband", "infiniband_verbs", "net", "pci", "hwmon")
ACTIONS: Final = frozenset({"add", "remove", "change", "move", "bind", "unbind"})
UDEVD_CONTROL: Final = Path("/run/udev/control")
# rtnetlink: the multicast groups of IPv4 and IPv6 address changes, and their message types.
RTMGRP_IPV4_IFADDR: Final = 0x10
RTMGRP_IPV6_IFADDR: Final = 0x100
RTM_NEWADDR: Final = 20
RTM_DELADDR: Final = 21
# The kernel adds or removes an address's GID from a workqueue, after RTM_NEWADDR/RTM_DELADDR went out:
# a scrape in between would cache the old GID table until the next event or the resync. So each change
# is applied once more when the GID table has surely followed.
ADDRESS_SETTLE_SECONDS: Final = 2.0
# Address changes on one netdev are logged at info at most this often (the rest at debug): a router
# advertisement flood on a RoCE segment sends a change per advertisement, and each would be a line.
ADDRESS_LOG_INTERVAL_SECONDS: Final = 60.0
# The clock of the address-change log throttle (tests set it rather than the process-wide time.monotonic,
# which other threads read too).
log_clock: Callable[[], float] = time.monotonic
_NLMSGHDR: Final = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_IFADDRMSG: Final = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, interface index


@dataclass(frozen=True, slots=True)
class Event:
    """The part of a uevent the inventory needs (a plain value, so tests can inject events)."""

    action: str
    subsystem: str
    name: str  # sys_name: mlx5_0, uverbs0, ib0
    devpath: str = ""
    devpath_old: str = ""  # set on `move` (rename)

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> Event:
        devpath = props.get("DEVPATH", "")
        return cls(
            action=props.get("ACTION", ""),
            subsystem=props.get("SUBSYSTEM", ""),
            name=props.get("INTERFACE") or os.path.basename(devpath),
            devpath=devpath,
            devpath_old=props.get("DEVPATH_OLD", ""),
        )


def apply_event(inventory: Inventory, event: Event) -> str | None:
    """Make the inventory forget what the event changed; returns what it did, for logs and tests."""
    if event.action not in ACTIONS:
        return None
    if event.subsystem == "infiniband":
        # A VF that goes changed its PF's sriov_numvfs; disabling VFs sends no event on the PF itself.
        removed = inventory.cached().get(event.name) if event.action == "remove" else None
        pf = removed.pf_pci_address if removed is not None else None
        return _forget(inventory, [event.name, *_devices_on_function(inventory, pf)])
    if event.subsystem == "pci":
        # Writing sriov_numvfs sends `change` on the PF once its VFs exist (no infiniband event names it;
        # a re-read before that would wait on the write's lock). Other PCI events change nothing we cache.
        return _forget(inventory, _devices_on_function(inventory, event.name) if event.action == "change" else [])
    if event.subsystem == "infiniband_verbs":
        inventory.invalidate()
        return "all devices"
    if event.subsystem == "hwmon":
        # /devices/pci0000:00/0000:00:01.0/0000:18:00.0/hwmon/hwmon3: the function it belongs to is the
        # last address on the path. A hwmon device of anything else (a CPU, a disk) has none of ours.
        on_path = [part for part in event.devpath.split("/") if PCI_ADDRESS.match(part)]
        if event.action not in ("add", "remove") or not on_path:
            return None
        # Its function's devices; for a function without one, the RoCE LAG device of its card that stands
        # for it (parse.infiniband._port_functions reads the same functions).
        function = on_path[-1]
        # A device whose static info is being read right now is not cached yet: its name comes from the
        # function's own infiniband/ directory, so that the read in flight is not stored without sensors.
        hwmon_dir = os.path.join(os.fspath(inventory.sys_root), event.devpath.lstrip("/"))
        own = sorted(set(_devices_on_function(inventory, function)) | set(_listed(f"{hwmon_dir}/../../infiniband")))
        return _forget(inventory, own or sorted(
            device
            for device, info in inventory.cached().items()
            if info.pci_address is not None and function in card_bond_slaves(info.pci_address, info.netdevs)
        ))  # fmt: skip
    if event.subsystem != "net":
        return None
    names = {event.name}
    if event.devpath_old:
        names.add(os.path.basename(event.devpath_old))
    # The PCI functions on the netdev's path, e.g. /devices/pci0000:00/0000:00:01.0/0000:17:00.0/net/ib0.
    functions = {part for part in event.devpath.split("/") if PCI_ADDRESS.match(part)}
    hit = sorted(
        device
        for device, info in inventory.cached().items()
        if (info.pci_address is not None and info.pci_address in functions)
        or any(names.intersection(port.netdevs) for port in info.ports)
    )
    if not hit and not event.devpath.startswith("/devices/virtual/"):
        # A physical netdev of no known device: maybe an RDMA device's netdev that is not cached yet.
        inventory.mark_dirty()
    return _forget(inventory, hit)


def address_changes(data: bytes) -> list[tuple[str, int]]:
    """(action, interface index) of each RTM_NEWADDR ("add") and RTM_DELADDR ("remove") in a datagram."""
    changes: list[tuple[str, int]] = []
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            break  # truncated or malformed: nothing after it can be trusted
        if kind in (RTM_NEWADDR, RTM_DELADDR) and length >= _NLMSGHDR.size + _IFADDRMSG.size:
            index = _IFADDRMSG.unpack_from(data, offset + _NLMSGHDR.size)[4]
            changes.append(("add" if kind == RTM_NEWADDR else "remove", index))
        offset += (length + 3) & ~3
    return changes


def _lowers(sys_root: Path, name: str) -> set[str]:
    """The netdev and the netdevs under it (lower_* links, a few levels down)."""
    names = {name}
    level = [name]
    for _ in range(MAX_STACK):
        below: list[str] = []
        for upper in level:
            entries = _listed(os.fspath(sys_root / "class" / "net" / upper))
            below += [e[len("lower_") :] for e in entries if e.startswith("lower_")]
        level = [n for n in below if n not in names]
        if not level:
            break
        names.update(level)
    return names


def apply_address_change(inventory: Inventory, name: str, sys_root: Path) -> str | None:
    """An address came or went on netdev `name`: refresh the devices whose ports carry it or a lower of it.

    A GID appears for an address on an upper (a VLAN) that is not yet among the port's netdevs, so the
    netdev's lowers are matched too. Netdevs of no RDMA device (container veths) change nothing.
    """
    names = _lowers(sys_root, name)
    hit = sorted(
        device for device, info in inventory.cached().items() if any(names.intersection(p.netdevs) for p in info.ports)
    )
    return _forget(inventory, hit)


def open_address_socket() -> socket.socket | None:
    """An rtnetlink socket subscribed to IPv4 and IPv6 address changes; None if the host refuses one."""
    try:
        route = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    except OSError as exc:
        log.warning("cannot open an rtnetlink socket (%s): GID counts follow address changes only at resync", exc)
        return None
    try:
        route.bind((0, RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))
    except OSError as exc:
        route.close()
        log.warning("cannot watch address changes (%s): GID counts follow them only at resync", exc)
        return None
    return route


def _forget(inventory: Inventory, devices: list[str]) -> str | None:
    """Invalidate each device's static info; what was done, for the log (None for nothing)."""
    for device in devices:
        inventory.invalidate(device)
    return ", ".join(f"device {device}" for device in devices) or None


def _listed(directory: str) -> list[str]:
    """Entry names of a directory, none if it cannot be listed (gone, or not there at all)."""
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _devices_on_function(inventory: Inventory, pci_address: str | None) -> list[str]:
    """Cached RDMA devices of a PCI function, by name."""
    if pci_address is None:
        return []
    return sorted(device for device, info in inventory.cached().items() if info.pci_address == pci_address)


class HotplugMonitor:
    """A daemon thread that feeds uevents to the inventory of the collector in use.

    `inventory` is a callable so that a config reload (a new collector) needs no new monitor.
    """

    def __init__(
        self,
        monitor: Any,
        source: str,
        inventory: Callable[[], Inventory],
        *,
        addresses: socket.socket | None = None,
        sys_root: Path = Path("/sys"),
        address_settle_seconds: float = ADDRESS_SETTLE_SECONDS,
    ) -> None:
        self._monitor = monitor
        self._addresses = addresses  # rtnetlink address changes (open_address_socket), watched on a 2nd thread
        self._address_thread: threading.Thread | None = None
        self._address_settle = address_settle_seconds
        self._sys_root = sys_root
        self.source = source
        self._inventory = inventory
        self._stop = threading.Event()
        self._failed = threading.Event()
        self._thread: threading.Thread | None = None
        self.events = 0  # events that changed something, for tests
        self.seen = 0
        self.undecodable = 0  # events lost because pyudev could not decode them, for tests
        self.overflows = 0  # times the uevent socket overflowed and every device was re-read, for tests
        self._address_logged: dict[str, float] = {}  # netdev -> when a change on it was last logged at info
        self.changed = threading.Condition()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rdma-hotplug", daemon=True)
        self._thread.start()
        if self._addresses is not None:
            self._address_thread = threading.Thread(target=self._watch_addresses, name="rdma-addr", daemon=True)
            self._address_thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=3)
        if self._address_thread is not None:
            self._address_thread.join(timeout=3)
        if self._addresses is not None:
            self._addresses.close()

    def handle_address(self, action: str, name: str) -> None:
        self.seen += 1
        try:
            what = apply_address_change(self._inventory(), name, self._sys_root)
        except Exception:
            log.exception("cannot apply an address change on %s", name)
            return
        if what is None:
            return
        now = log_clock()
        last = self._address_logged.get(name)
        if last is None or now - last >= ADDRESS_LOG_INTERVAL_SECONDS:
            if len(self._address_logged) >= 256:  # netdevs come and go (VLANs): forget the quiet ones
                self._address_logged = {
                    n: t for n, t in self._address_logged.items() if now - t < ADDRESS_LOG_INTERVAL_SECONDS
                }
            self._address_logged[name] = now
            level = logging.INFO
        else:
            level = logging.DEBUG
        log.log(level, "address %s on %s: refreshing %s", action, name, what)
        with self.changed:
            self.events += 1
            self.changed.notify_all()

    def _watch_addresses(self) -> None:
        route = self._addresses
        assert route is not None
        settling: dict[str, float] = {}  # netdev -> when to apply its last address change once more
        while not self._stop.is_set():
            now = time.monotonic()
            for name in [name for name, due in settling.items() if due <= now]:
                del settling[name]
                self.handle_address("settled", name)
            try:
                # Inside the try: settimeout is an ioctl (FIONBIO), which a seccomp filter may refuse.
                route.settimeout(min([1.0, *(due - now for due in settling.values())]) if settling else 1.0)
                data = route.recv(65536)
            except TimeoutError:
                continue
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    log.warning("rtnetlink socket overflowed; re-reading every device")
                    self._inventory().invalidate()
                    continue
                if not self._stop.is_set():  # closed by stop() otherwise
                    log.error("address watch failed (%s); GID counts follow address changes only at resync", exc)
                return
            for action, index in address_changes(data):
                try:
                    name = socket.if_indextoname(index)
                except OSError:
                    continue  # the netdev is gone already: its removal sends a net uevent
                self.handle_address(action, name)
                settling[name] = time.monotonic() + self._address_settle

    def wait_for_events(self, count: int, timeout: float) -> bool:
        """Block until `count` events changed the inventory (tests)."""
        with self.changed:
            return self.changed.wait_for(lambda: self.events >= count, timeout)

    def handle(self, event: Event) -> None:
        self.seen += 1
        try:
            what = apply_event(self._inventory(), event)
        except Exception:  # a malformed event must not kill the monitor
            log.exception("cannot apply %s", event)
            return
        if what is None:
            log.debug("uevent %s %s %s: nothing to refresh", event.action, event.subsystem, event.name)
            return
        log.info("uevent %s %s %s: refreshing %s", event.action, event.subsystem, event.name, what)
        with self.changed:
            self.events += 1
            self.changed.notify_all()

    def _overflowed(self) -> bool:
        """Whether the uevent socket's pending error is an overflow, which reading it clears.

        pyudev reports a socket error as an OSError without errno ("Error while polling fd: N"): the
        kernel's ENOBUFS, set when an event storm (VFs created, a driver reloaded) filled the receive
        buffer, is only in SO_ERROR.
        """
        try:
            fd = os.dup(self._monitor.fileno())
        except (AttributeError, OSError, ValueError):
            return False
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)  # not a socket after all: the wrapper never took it
            return False
        with sock:  # closes the duplicate only
            try:
                return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ENOBUFS
            except OSError:
                return False

    @property
    def failed(self) -> bool:
        """Whether the monitor stopped on a failure (its inventory then rescans every scrape)."""
        return self._failed.is_set()

    def _fall_back(self) -> None:
        # Failed first, then the fallback: whoever swaps in an inventory (start-up, a reload) and then
        # reads `failed` either sees it or had its inventory switched here (`running` stays true for a
        # moment after this returns, and so could miss both).
        self._failed.set()
        self._inventory().rescan_each_scrape = True

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:  # the cache would go stale unseen: rescan instead, and say why
            log.exception("uevent monitor failed; falling back to rescanning on every scrape")
            self._fall_back()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                device = self._monitor.poll(timeout=1.0)
            except OSError as exc:
                if exc.errno == errno.ENOBUFS or self._overflowed():
                    # The socket overflowed during an event storm: what was lost is unknown.
                    log.warning("uevent socket overflowed; re-reading every device")
                    self._inventory().invalidate()
                    with self.changed:
                        self.overflows += 1
                        self.changed.notify_all()
                    continue
                log.error("uevent monitor failed (%s); falling back to rescanning on every scrape", exc)
                self._fall_back()
                return
            if device is None:
                continue
            try:
                properties = dict(device.properties)
            except UnicodeDecodeError as exc:
                # pyudev decodes values strictly, and a netdev may be named with any bytes: the event
                # is lost, so (as after an overflow) what changed is unknown.
                log.warning("cannot decode a uevent (%s); re-reading every device", exc)
                self._inventory().invalidate()
                # Counted once acted on, as events are: a reader of the count sees the invalidation.
                with self.changed:
                    self.undecodable += 1
                    self.changed.notify_all()
                continue
            self.handle(Event.from_properties(properties))


def start_monitor(
    sys_root: Path, inventory: Callable[[], Inventory], *, source: str | None = None
) -> tuple[HotplugMonitor | None, str]:
    """Start the udev monitor if it can describe `sys_root`; returns it (or None) and a mode for the log."""
    if source is None and is_sysfs_mount(sys_root) is not True:
        return None, f"rescan ({sys_root} is not the kernel's sysfs mount, so uevents do not describe it)"
    try:
        import pyudev
    except ImportError as exc:  # pragma: no cover - a declared dependency; libudev may still be missing
        log.warning("pyudev unavailable (%s): hotplug is found by a rescan on every scrape", exc)
        return None, f"rescan (pyudev unavailable: {exc})"
    # os.path.exists: Path.exists raises on EACCES (InaccessiblePaths=/run/udev), which is "no udevd here".
    chosen = source or ("udev" if os.path.exists(UDEVD_CONTROL) else "kernel")
    try:
        context = pyudev.Context()
        monitor = pyudev.Monitor.from_netlink(context, source=chosen)
        for subsystem in SUBSYSTEMS:
            monitor.filter_by(subsystem)
        monitor.start()
    except Exception as exc:  # no libudev, netlink refused by a seccomp or address-family filter
        # A warning, unlike the fixture-tree case above: on the real /sys this is a sandbox refusing what
        # the shipped unit allows (AF_NETLINK), and every scrape now pays a rescan.
        log.warning("cannot open the uevent socket (%s): hotplug is found by a rescan on every scrape", exc)
        return None, f"rescan (cannot open the uevent socket: {exc})"
    hotplug = HotplugMonitor(monitor, chosen, inventory, addresses=open_address_socket(), sys_root=sys_root)
    hotplug.start()
    how = "udevd events" if chosen == "udev" else "kernel uevents, no udevd running"
    return hotplug, f"udev ({how} on {', '.join(SUBSYSTEMS)})"
