"""Parse `/sys/class/net/<name>`: link state, speed, statistics, bonding and MLNX_OFED ECN switches.

Pure functions over a sysfs root (the directory mounted at `/sys`) returning typed dataclasses; no
Prometheus imports. Also maps an RDMA port to the netdevs that carry it (RoCE), including RoCE LAG
devices (`mlx5_bond_0`), which map to the bond master, and decides which RDMA device reads a netdev
that several reach (`Locality`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Final

from .reader import (
    GID_ATTR_NO_VALUE_ERRNOS,
    NO_VALUE_ERRNOS,
    REASON_MALFORMED,
    SysfsReader,
    is_dir,
    link_name,
    list_dir,
    parse_entry_number,
    pci_function,
    pci_slot,
)

NET_DIR: Final = Path("class") / "net"
IB_DIR: Final = Path("class") / "infiniband"

# ecn/<dir>/enable/<priority> directories and the role each is reported as.
ECN_ROLES: Final = {"roce_np": "np", "roce_rp": "rp"}  # notification point (receiver), reaction point (sender)
MAX_PRIORITY: Final = 7

# netdev `type` of an IPoIB interface and of an Ethernet one (include/uapi/linux/if_arp.h).
ARPHRD_INFINIBAND: Final = 32
ARPHRD_ETHER: Final = 1

# SPEED_UNKNOWN is -1; kernels that printed it with %u show 4294967295.
_SPEED_UNKNOWN_U32: Final = 2**32 - 1

# switchdev representors share the PF's PCI function (and its dev_port) but are not the uplink: VF and
# SF representors (phys_port_name pf0vf1, c1pf0sf3) and, on a BlueField, the host PF's (pf0, c1pf0;
# the netdev pf0hpf). The uplink's phys_port_name is p0, p1.
_REPRESENTOR: Final = re.compile(r"^(?:c\d+)?pf\d+(?:(?:vf|sf)\d+)?$")


@dataclass(frozen=True, slots=True)
class Netdev:
    """One network interface. Values a file could not give are None; absent collections are empty."""

    name: str
    ifindex: int | None
    type: int | None  # ARPHRD_*: 1 Ethernet, 32 InfiniBand (IPoIB)
    address: str | None
    operstate: str | None  # RFC 2863 as the kernel prints it: up, down, lowerlayerdown, dormant, unknown...
    admin_up: bool | None  # IFF_UP of `flags`: False once `ip link set <netdev> down`, whatever the link does
    carrier: bool | None  # None while administratively down: the kernel has no answer then
    carrier_changes: int | None
    carrier_up_count: int | None  # kernels >= 4.16
    carrier_down_count: int | None
    speed_bps: int | None  # bits per second (sysfs Mb/s x 10^6); None when unknown or the link is down
    mtu: int | None
    statistics: dict[str, int]  # statistics/<file> -> value (rx_bytes, tx_dropped, rx_crc_errors, ...)
    statistics_files: tuple[str, ...]  # the sorted listing `statistics` was read from; () when not read
    is_bond_master: bool
    bond_mode: str | None  # e.g. 802.3ad, active-backup
    bond_slaves: tuple[str, ...]  # read every scrape (NetdevIdentity keeps the list of its last static read)
    master: str | None  # the upper device this one is enslaved to (bond, team, bridge)
    ecn: dict[tuple[str, int], bool]  # (role "np"|"rp", priority) -> enabled, MLNX_OFED ecn/roce_*/enable/N


def _no_value_attr(path: str | Path, reader: SysfsReader) -> str | None:
    """An attribute that may be absent or answer "no value in this state" (NO_VALUE_ERRNOS): None, no error."""
    return reader.text(path, optional=True, absent_errnos=NO_VALUE_ERRNOS)


# What the kernel prints: a u32 in decimal, with %d since 4.6 (SPEED_UNKNOWN is then -1) and %u before.
# Not int()'s wider syntax: it also takes "+5", "1_000" and other scripts' digits, none of which is a
# speed; and bounded, for int() refuses over 4,300 digits with a ValueError.
_SPEED_TEXT: Final = re.compile(r"(?:-1|[0-9]{1,10})\Z")


def _speed_number(text: str) -> int | None:
    """The Mb/s a `speed` file can hold (-1, 0 .. 4294967295), else None."""
    text = text.strip()
    if not _SPEED_TEXT.match(text):
        return None
    mbps = int(text)
    return mbps if mbps <= _SPEED_UNKNOWN_U32 else None


def _bits_per_second(mbps: int | None) -> int | None:
    """None for unknown (-1, 0, 4294967295) or garbage (None)."""
    if mbps is None or mbps <= 0 or mbps >= _SPEED_UNKNOWN_U32:
        return None
    return mbps * 1_000_000


def parse_speed(text: str) -> int | None:
    """sysfs `speed` (Mb/s) to bits/s; None for unknown (-1, 0, 4294967295) or garbage."""
    return _bits_per_second(_speed_number(text))


def _speed(path: str | Path, reader: SysfsReader) -> int | None:
    mbps = reader.parsed(path, _speed_number, "a speed in Mb/s", optional=True, absent_errnos=NO_VALUE_ERRNOS)
    return _bits_per_second(mbps)


# What net-sysfs.c prints (operstates[] of RFC 2863).
OPERSTATES: Final = frozenset({"unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up"})


def _operstate(path: str | Path, reader: SysfsReader) -> str | None:
    """A state the kernel can print, else None: garbage says nothing about the link, and read as "not up"
    it would export a link-down."""
    return reader.parsed(path, lambda text: text if text in OPERSTATES else None, "an operstate", optional=True)


# net-sysfs.c prints dev->flags, an unsigned int, with "%#x": 0x1003, and a bare 0 when no flag is set.
_FLAGS_TEXT: Final = re.compile(r"(?:0x[1-9a-f][0-9a-f]{0,7}|0)\Z")
IFF_UP: Final = 0x1


def _admin_up(path: str | Path, reader: SysfsReader) -> bool | None:
    """Whether an administrator has the netdev up. Separate from operstate: a RoCE port reads DOWN and
    Disabled both when its cable is pulled and when someone set its netdev down, and only this tells
    the two apart."""
    return reader.parsed(path, _iff_up, "netdev flags", optional=True)


def _iff_up(flags: str) -> bool | None:
    return bool(int(flags, 16) & IFF_UP) if _FLAGS_TEXT.match(flags) else None


_CARRIER: Final = {"0": False, "1": True}


def _carrier(path: str | Path, reader: SysfsReader) -> bool | None:
    return reader.parsed(path, _CARRIER.get, "a carrier of 0 or 1", optional=True, absent_errnos=NO_VALUE_ERRNOS)


def _ecn_layout(ecn_dir: Path, reader: SysfsReader) -> tuple[tuple[str, int, str], ...]:
    """(role, priority, file) of every ECN enable switch; which exist is fixed by the driver."""
    layout: list[tuple[str, int, str]] = []
    for directory, role in ECN_ROLES.items():
        enable_dir = ecn_dir / directory / "enable"
        for entry in list_dir(enable_dir, reader):
            priority = parse_entry_number(entry)
            if priority is None or priority > MAX_PRIORITY:
                reader.fail(REASON_MALFORMED, enable_dir / entry, "not a priority 0-7")
                continue
            layout.append((role, priority, f"ecn/{directory}/enable/{entry}"))
    return tuple(layout)


def _ecn(net_dir: str, layout: tuple[tuple[str, int, str], ...], reader: SysfsReader) -> dict[tuple[str, int], bool]:
    states: dict[tuple[str, int], bool] = {}
    for role, priority, file in layout:
        path = f"{net_dir}/{file}"
        value = reader.uint(path)
        if value is None:
            continue
        if value > 1:
            reader.fail(REASON_MALFORMED, path, f"enable is not 0/1: {value}")
            continue
        states[(role, priority)] = value == 1
    return states


# The kernel's bound on a netdev name, its NUL included.
IFNAMSIZ: Final = 16
# More slaves than any RDMA bond has (mlx5 LAG takes 2 to 4): a longer list is not one to export.
MAX_BOND_SLAVES: Final = 64


def valid_ifname(name: str) -> bool:
    """A name the kernel could give a netdev (its dev_valid_name: under IFNAMSIZ bytes, not . or .., no
    '/', ':' or white space). Other text is garbage: as a path component it fails with ENAMETOOLONG where
    absence is checked for, and as a label value it is unbounded."""
    raw = os.fsencode(name)
    return 0 < len(raw) < IFNAMSIZ and not _NOT_IN_IFNAME.search(raw) and name not in (".", "..")


_NOT_IN_IFNAME: Final = re.compile(rb"[\0/:\s]")  # \s in bytes: the ASCII white space the kernel's isspace() sees


@dataclass(frozen=True, slots=True)
class NetdevIdentity:
    """The static half of a netdev: what only changes with a uevent on the netdev or its RDMA device.

    Bond membership is recorded here as it was at the static read, for the RDMA port -> netdev mapping
    (`PortInfo.netdevs`); `read_netdev_state` reads the slaves and the mode every scrape, since
    enslaving and releasing send no uevent.
    """

    name: str
    ifindex: int | None
    type: int | None
    address: str | None
    is_bond_master: bool
    bond_slaves: tuple[str, ...]
    master: str | None
    # Which statistics files and ECN switches exist is fixed by the kernel and driver; their values are
    # read every scrape.
    statistics_files: tuple[str, ...] = ()
    ecn_layout: tuple[tuple[str, int, str], ...] = ()  # (role, priority, file relative to the netdev)
    pci_address: str | None = None  # the PCI function behind it; None for software netdevs (bonds, VLANs)


# The bonding driver's mode names (bond_mode_tbl), the only values of the bond's `mode` label.
BOND_MODES: Final = frozenset(
    {"balance-rr", "active-backup", "balance-xor", "broadcast", "802.3ad", "balance-tlb", "balance-alb"}
)


def _bond_slaves(text: str, path: str | Path, reader: SysfsReader) -> tuple[str, ...] | None:
    """`bonding/slaves` is the slaves' names, space-separated (empty for a bond without slaves); None for
    text that is not such a list (counted)."""
    names = tuple(text.split())
    if not all(map(valid_ifname, names)) or len(names) > MAX_BOND_SLAVES:
        reader.fail(REASON_MALFORMED, path, f"not a list of netdev names: {text[:40]!r}")
        return None
    return names


def _bond_mode(text: str | None, path: str | Path, reader: SysfsReader) -> str | None:
    """`bonding/mode` is the mode's name, then its number ("802.3ad 4")."""
    if not text:
        return None
    name = text.split()[0]
    if name not in BOND_MODES:
        reader.fail(REASON_MALFORMED, path, f"not a bonding mode: {text[:40]!r}")
        return None
    return name


def read_netdev_identity(sys_root: Path, name: str, reader: SysfsReader) -> NetdevIdentity | None:
    """Static attributes of `class/net/<name>`; None if it does not exist (absence is not a read error)."""
    if not valid_ifname(name):
        return None
    net_dir = sys_root / NET_DIR / name
    if not is_dir(net_dir, reader):
        return None
    is_bond_master = is_dir(net_dir / "bonding", reader)
    slaves: tuple[str, ...] = ()
    if is_bond_master:
        # The lower_* links name the slaves without bonding/slaves, whose read waits for the rtnl lock
        # (on kernels before a 2024 change that reads it under RCU): a stall there would hold up the whole
        # device's static read, IB ports included. A bond without them (no slaves, or a kernel before
        # 3.13) still has the file read.
        slaves = tuple(e[len("lower_") :] for e in list_dir(net_dir, reader) if e.startswith("lower_"))
        if not slaves:
            slaves_path = net_dir / "bonding" / "slaves"
            listed = reader.text(slaves_path, optional=True)
            slaves = (_bond_slaves(listed, slaves_path, reader) if listed else None) or ()
    return NetdevIdentity(
        name=name,
        ifindex=reader.uint(net_dir / "ifindex", optional=True),
        type=reader.uint(net_dir / "type", optional=True),
        address=reader.text(net_dir / "address", optional=True) or None,
        is_bond_master=is_bond_master,
        bond_slaves=slaves,
        master=link_name(net_dir / "master"),
        statistics_files=tuple(list_dir(net_dir / "statistics", reader)),
        ecn_layout=_ecn_layout(net_dir / "ecn", reader),
        pci_address=pci_fn.name if (pci_fn := pci_function(net_dir)) is not None else None,
    )


def read_netdev_state(
    sys_root: Path, identity: NetdevIdentity, reader: SysfsReader, *, statistics: bool = True
) -> Netdev | None:
    """Per-scrape state of a netdev whose identity is known; None if it is gone. `statistics=False` reads
    none of its statistics/ files.

    MTU, the ECN enables and a bond's slaves and mode are runtime configuration that changes without a
    uevent (enslaving or releasing a slave only relinks sysfs), so they are here.
    """
    net_dir = f"{os.fspath(sys_root)}/{NET_DIR}/{identity.name}"
    if not os.path.isdir(net_dir):
        return None
    slaves: tuple[str, ...] = ()
    mode = None
    if identity.is_bond_master:
        slaves_path, mode_path = f"{net_dir}/bonding/slaves", f"{net_dir}/bonding/mode"
        listed = reader.text(slaves_path, optional=True)
        # A failed read or garbage (counted) keeps the slaves of the static read: the slaves' series must
        # not vanish, and be forgotten as netdevs, for a read that tells nothing about membership.
        parsed = None if listed is None else _bond_slaves(listed, slaves_path, reader)
        slaves = identity.bond_slaves if parsed is None else parsed
        mode = _bond_mode(reader.text(mode_path, optional=True), mode_path, reader)
    return Netdev(
        name=identity.name,
        ifindex=identity.ifindex,
        type=identity.type,
        address=identity.address,
        operstate=_operstate(f"{net_dir}/operstate", reader),
        admin_up=_admin_up(f"{net_dir}/flags", reader),
        carrier=_carrier(f"{net_dir}/carrier", reader),
        carrier_changes=reader.uint(f"{net_dir}/carrier_changes", optional=True),
        carrier_up_count=reader.uint(f"{net_dir}/carrier_up_count", optional=True),
        carrier_down_count=reader.uint(f"{net_dir}/carrier_down_count", optional=True),
        speed_bps=_speed(f"{net_dir}/speed", reader),
        mtu=reader.uint(f"{net_dir}/mtu", optional=True),
        statistics=reader.uints(f"{net_dir}/statistics", identity.statistics_files) if statistics else {},
        statistics_files=identity.statistics_files if statistics else (),
        is_bond_master=identity.is_bond_master,
        bond_mode=mode,
        bond_slaves=slaves,
        master=identity.master,
        ecn=_ecn(net_dir, identity.ecn_layout, reader),
    )


def read_netdev(sys_root: Path, name: str, reader: SysfsReader) -> Netdev | None:
    """One netdev from `class/net/<name>`, identity and state; None if it does not exist."""
    identity = read_netdev_identity(sys_root, name, reader)
    return read_netdev_state(sys_root, identity, reader) if identity is not None else None


def _gid_ndevs(port_dir: Path, reader: SysfsReader) -> list[str]:
    """Netdevs of the port's populated GID entries, in GID index order (index 0 is the port's own)."""
    ndevs_dir = port_dir / "gid_attrs" / "ndevs"
    # Not str.isdigit(): it takes '²', which int() then refuses with a ValueError that cost the device.
    indexes = sorted((n, e) for e in list_dir(ndevs_dir, reader) if (n := parse_entry_number(e)) is not None)
    names: list[str] = []
    for _, entry in indexes:
        name = reader.text(ndevs_dir / entry, optional=True, absent_errnos=GID_ATTR_NO_VALUE_ERRNOS)
        if not name:
            continue  # unpopulated entry (EINVAL, EAGAIN up to 4.18) or an IB GID without a netdev
        if not valid_ifname(name):
            reader.fail(REASON_MALFORMED, ndevs_dir / entry, f"not a netdev name: {name[:40]!r}")
        elif name not in names:
            names.append(name)
    return names


def _function_ndevs(net_dir: Path, port: int, reader: SysfsReader, *, single_port: bool) -> list[str]:
    """Netdevs of the RDMA device's PCI function that belong to `port` (dev_port, else dev_id, is port-1)."""
    candidates = [name for name in list_dir(net_dir, reader) if valid_ifname(name)]
    # A one-port device owns its function's lone netdev whatever dev_port says. On a two-port function
    # (a ConnectX-3 VPI, IB on port 1 and Ethernet on port 2) the lone netdev may be the other port's.
    if len(candidates) <= 1 and single_port:
        return candidates
    # switchdev representors sit on the PF too; only the uplink is the port's netdev.
    candidates = [
        c for c in candidates if not _REPRESENTOR.match(_no_value_attr(net_dir / c / "phys_port_name", reader) or "")
    ]
    matched: list[str] = []
    known = False
    for name in candidates:
        index = reader.uint(net_dir / name / "dev_port", optional=True)
        # Before 3.15 there is no dev_port. IPoIB numbered its netdevs by dev_id alone until 5.3, so on
        # those kernels dev_port reads 0 for ib0 and ib1 of a two-port HCA alike and dev_id tells them.
        if index is None or (index == 0 and reader.uint(net_dir / name / "type", optional=True) == ARPHRD_INFINIBAND):
            dev_id = reader.uint(net_dir / name / "dev_id", optional=True, base=16)
            if dev_id is not None:
                index = dev_id
        if index is not None:
            known = True
            if index == port - 1:
                matched.append(name)
    return matched if known else candidates


def _bond_master(sys_root: Path, name: str) -> str | None:
    master = link_name(sys_root / NET_DIR / name / "master")
    if master and os.path.isdir(sys_root / NET_DIR / master / "bonding"):  # any failure: not a bond
        return master
    return None


def rdma_port_netdevs(
    sys_root: Path, ib_device: str, port: int, reader: SysfsReader, *, single_port: bool
) -> list[str]:
    """Netdevs carrying RDMA port `port` of `ib_device`, unique, most specific first.

    First the netdevs of the populated GID entries (`gid_attrs/ndevs/N`, in index order, so the port's
    own netdev, then uppers such as VLANs that have addresses), then the PCI function's netdevs
    (`device/net/*`) that belong to this port. A RoCE LAG device (mlx5_bond_N) sits on the first slave's
    PCI function; that slave is replaced by its bond master when the GID table names the master and not
    the slave, or, with no GID table to ask (an old kernel, or every GID gone while the port is down),
    when the bond's other slave on the card has no RDMA device (`folds_a_function`). The slaves are in
    the master's `Netdev.bond_slaves`.

    Reads up to one file per GID table entry (often 256): cache the result, it changes only on hotplug
    or address changes.

    `single_port`: the device has no other port, so its function's lone netdev is this port's whatever
    its dev_port says.
    """
    device_dir = sys_root / IB_DIR / ib_device
    # The GID table also names netdevs of containers' namespaces (a VF's net1 in a pod), and the host may
    # have a netdev of the same name on another card: only this namespace's netdevs of this card count.
    locality = Locality(sys_root, ib_device, reader)
    gids = [name for name in _gid_ndevs(device_dir / "ports" / str(port), reader) if locality.on_card(name)]
    names = list(gids)
    by_name = lag_by_name(ib_device)
    for name in _function_ndevs(device_dir / "device" / "net", port, reader, single_port=single_port):
        master = _bond_master(sys_root, name)
        lag = False
        if master is not None and gids:
            lag = master in gids and name not in gids
        elif master is not None:
            lag = by_name if by_name is not None else folds_a_function(sys_root, device_dir, master, reader)
        chosen = master if lag and master is not None else name
        if chosen not in names:
            names.append(chosen)
    return names


# Uppers of uppers (a VLAN on a bond) are followed this deep to the physical netdev under them.
MAX_STACK: Final = 4


# The kernel's own names: mlx5 registers a RoCE LAG device as mlx5_bond_N and every other as mlx5_N.
_MLX5_KERNEL_NAME: Final = re.compile(r"mlx5_(bond_)?\d+")


def lag_by_name(ib_device: str) -> bool | None:
    """Whether a device the kernel named is a RoCE LAG device; None for a renamed one, which the card must
    tell (`folds_a_function`): rdma-core's udev rule (rdma_rename NAME_FALLBACK) names it rocep59s0f0,
    say, and site rules name it anything."""
    kernel = _MLX5_KERNEL_NAME.fullmatch(ib_device)
    return None if kernel is None else kernel.group(1) is not None


def card_bond_slaves(pci_address: str, netdevs: Iterable[NetdevIdentity]) -> dict[str, str]:
    """The bond slaves among a device's static netdev identities that sit on another PCI function of its
    card (the card of `pci_address`): function address -> slave name. These are the functions a RoCE LAG
    device on that card may stand for; whether it does is the caller's to decide (by the device's name,
    or by the function having no RDMA device of its own)."""
    by_name = {netdev.name: netdev for netdev in netdevs}
    slot = pci_slot(pci_address)
    siblings: dict[str, str] = {}
    for master in by_name.values():
        for slave in master.bond_slaves if master.is_bond_master else ():
            identity = by_name.get(slave)
            address = identity.pci_address if identity is not None else None
            if address is not None and address != pci_address and pci_slot(address) == slot:
                siblings.setdefault(address, slave)
    return siblings


def has_no_rdma_device(function: Path, reader: SysfsReader) -> bool:
    """Whether the PCI function has no RDMA device of its own: one a RoCE LAG device on another function
    of the card can stand for."""
    return not list_dir(function / "infiniband", reader)


def folds_a_function(sys_root: Path, device_dir: str | Path, master: str, reader: SysfsReader) -> bool:
    """Whether a slave of the bond `master` sits on another PCI function of the RDMA device's card that
    has no RDMA device of its own: one a RoCE LAG device stands for.

    mlx5 folds both ports of a card into one LAG device on the first function while they are slaves of
    one bond. Read from the `lower_*` links: `bonding/slaves` waits for the rtnl lock. (A bond over both
    functions without LAG whose second RDMA device failed to probe looks the same.)
    """
    own = pci_function(device_dir)
    if own is None:
        return False
    net_dir = sys_root / NET_DIR / master
    for entry in list_dir(net_dir, reader):
        if not entry.startswith("lower_"):
            continue
        function = pci_function(net_dir / entry)
        if (
            function is not None
            and function.name != own.name
            and pci_slot(function.name) == pci_slot(own.name)
            and has_no_rdma_device(function, reader)
        ):
            return True
    return False


def _pci_slot(device_dir: str) -> str | None:
    """domain:bus:device, the card, of the PCI function behind `<dev>/device`; None if there is none."""
    function = pci_function(device_dir)
    return pci_slot(function.name) if function is not None else None


class Locality:
    """Which netdevs one RDMA device reads: those whose physical netdev belongs to it.

    A netdev's physical netdev (its "anchor") is itself, or for an upper (bond, VLAN) one of its lower
    devices, followed down: an active-backup bond's active slave, else the first lower on a PCI function
    with an RDMA device, else the first lower. The anchor is local to the RDMA devices on its PCI function
    (`class/net/<anchor>/device/infiniband/*`); an anchor with none there (the second port of a RoCE LAG,
    whose RDMA device is folded into mlx5_bond_N, or the NIC under soft RoCE) is local to every device
    that reaches it from the same PCI card, or from no PCI function at all (rxe, siw). So a bond over the
    netdevs of mlx5_0 and mlx5_1 is read by mlx5_0 only, or by mlx5_1 while its link is the active one.

    One instance per device read. A bond's slave list is read once per instance, that is every scrape:
    enslaving and releasing send no uevent, so the device's cached static info would lag behind. (A
    slave new since that info was read has its identity read per scrape until the info is refreshed.)
    """

    def __init__(self, sys_root: Path, device: str, reader: SysfsReader) -> None:
        # Plain string paths: this runs for every device on every scrape.
        root = os.fspath(sys_root)
        self._net = f"{root}/{NET_DIR}/"
        self._device = device
        self._reader = reader
        # The netdevs of the device's own PCI function are local without further reads.
        self._own = frozenset(list_dir(f"{root}/{IB_DIR}/{device}/device/net", reader))
        self._slaves: dict[str, list[str]] = {}
        self._active: dict[str, str | None] = {}
        self._rdma: dict[str, list[str]] = {}
        self._device_dir = f"{root}/{IB_DIR}/{device}"

    def net_dir(self, name: str) -> str:
        return self._net + name

    def exists(self, name: str) -> bool:
        return os.path.isdir(self._net + name)

    def is_bond(self, name: str) -> bool:
        return os.path.isdir(f"{self._net}{name}/bonding")

    def is_physical(self, name: str) -> bool:
        """Backed by hardware (a `device` link); software uppers such as VLANs and macvlans are not."""
        return os.path.exists(f"{self._net}{name}/device")

    def bond_slaves(self, name: str) -> list[str]:
        slaves = self._slaves.get(name)
        if slaves is None:
            path = f"{self._net}{name}/bonding/slaves"
            text = self._reader.text(path, optional=True)
            # Checked as the netdev's own read checks it: a list that is no netdev names is counted, and
            # the bond's lower_* links name the slaves instead (its names would have become paths under
            # class/net, and the slaves' series must not vanish for a file that says nothing of them),
            # as they do for a file that could not be read (counted by the read) or is not there.
            listed = _bond_slaves(text, path, self._reader) if text is not None else None
            slaves = self._slaves[name] = list(self._lower_links(name) if listed is None else listed)
        return slaves

    def _lower_links(self, name: str) -> list[str]:
        entries = list_dir(self.net_dir(name), self._reader)
        return sorted(e[len("lower_") :] for e in entries if e.startswith("lower_"))

    def lowers(self, name: str) -> list[str]:
        lowers = self._lower_links(name)
        if not lowers and self.is_bond(name):
            lowers = self.bond_slaves(name)  # trees without lower_* links still name the slaves
        return lowers

    def anchor(self, name: str) -> str:
        for _ in range(MAX_STACK):
            if name in self._own:
                break
            lowers = self.lowers(name)
            if not lowers:
                break
            name = self._active_slave(name, lowers) or self._first_with_rdma(lowers)
        return name

    def _first_with_rdma(self, lowers: list[str]) -> str:
        """The first lower on a PCI function with an RDMA device, else the first lower. Every device
        picks the same one, so one device reads the upper: anchored on its first name instead, a bond
        over an RDMA NIC and a plain NIC of another card was read by no device when the plain NIC's name
        sorted first (review)."""
        if len(lowers) > 1:
            for lower in lowers:
                if lower in self._own or self._rdma_devices(lower):
                    return lower
        return lowers[0]

    def _active_slave(self, name: str, lowers: list[str]) -> str | None:
        """An active-backup bond's active slave. The kernel keeps such a bond's GIDs on the active slave's
        RDMA device only, so that device reads the bond: by its first lower, a bond over two cards whose
        second card's link was active was read by no device."""
        if name not in self._active:  # once per instance, as the slave list: anchor() runs per upper
            path = f"{self._net}{name}/bonding/active_slave"
            self._active[name] = self._reader.text(path, optional=True) if self.is_bond(name) else None
        active = self._active[name]
        return active if active in lowers else None

    def is_local(self, name: str) -> bool:
        anchor = self.anchor(name)
        if anchor in self._own:
            return True
        rdma = self._rdma_devices(anchor)
        if rdma:
            return self._device in rdma
        # An anchor without an RDMA device: the second port of a RoCE LAG (folded into mlx5_bond_N, a
        # function of the same card) or the NIC under soft RoCE (an RDMA device of no PCI function). Not a
        # netdev of another card: GID tables also name netdevs of containers' namespaces, and the host may
        # have one of the same name (an SR-IOV VF's eth1 in a pod, the host's own eth1).
        return self._slot is None or _pci_slot(self._net + anchor) == self._slot

    def _rdma_devices(self, name: str) -> list[str]:
        """The RDMA devices on netdev `name`'s PCI function, listed once per instance: `is_local` asks
        again for the anchor `_first_with_rdma` chose, and for every upper that shares an anchor."""
        rdma = self._rdma.get(name)
        if rdma is None:
            rdma = self._rdma[name] = list_dir(f"{self._net}{name}/device/infiniband", self._reader)
        return rdma

    def on_card(self, name: str) -> bool:
        """Whether netdev `name` is in this namespace and it, or a netdev it stacks on, is on the device's
        PCI card; for a device of no PCI function (rxe, siw), whether it is in this namespace."""
        if not self.exists(name):
            return False
        if self._slot is None:
            return True
        pending = [name]
        for _ in range(MAX_STACK + 1):
            if any(n in self._own or _pci_slot(self._net + n) == self._slot for n in pending):
                return True
            pending = [lower for n in pending for lower in self.lowers(n)]
            if not pending:
                break
        return False

    @cached_property
    def _slot(self) -> str | None:
        """The device's PCI card (None: not a PCI device), looked up only on that rare branch."""
        return _pci_slot(self._device_dir)
