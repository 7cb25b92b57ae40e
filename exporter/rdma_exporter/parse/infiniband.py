"""Parse `/sys/class/infiniband`: RDMA devices, their ports and counters.

Pure functions over a sysfs root (the directory mounted at `/sys`) returning typed dataclasses; no
Prometheus imports. Reads are split by how often they change, so the collector can cache the static
half and re-read only what moves:

- `read_device_info`: identity and layout (GUIDs, firmware, board, PCI address, driver, SR-IOV role,
  link layer, GIDs, netdevs and their static attributes, the PCIe maximum link, and the *names* of
  counter files). Most of it changes only on hotplug, driver reload or firmware reset, which udev
  reports; GIDs follow IP addresses, which send no uevent (the daemon watches rtnetlink for them, see
  `hotplug`), and a bond's member list is read every scrape. A periodic resync catches what both miss.
- `read_device_snapshot`: the moving part (port state, rate, LIDs and every counter value), read once
  per scrape using the file names cached in the info.
"""

from __future__ import annotations

import errno
import os
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from .hwmon import HwmonIdentity, read_hwmon_identity
from .netdev import (
    ARPHRD_ETHER,
    ARPHRD_INFINIBAND,
    NetdevIdentity,
    card_bond_slaves,
    has_no_rdma_device,
    rdma_port_netdevs,
    read_netdev_identity,
)
from .pcie import PcieIdentity, read_pcie_identity
from .reader import (
    GID_ATTR_NO_VALUE_ERRNOS,
    NO_VALUE_ERRNOS,
    PCI_ADDRESS,
    REASON_MALFORMED,
    REASON_MISSING,
    SysfsReader,
    link_name,
    list_dir,
    parse_entry_number,
    pci_function,
)
from .verbs import user_verbs_dirs

CLASS_DIR: Final = Path("class") / "infiniband"

# IB spec PortInfo:PortState and PortPhysicalState names, as the kernel prints them.
PORT_STATES: Final[dict[int, str]] = {
    0: "NOP",
    1: "DOWN",
    2: "INIT",
    3: "ARMED",
    4: "ACTIVE",
    5: "ACTIVE_DEFER",
}
PHYS_STATES: Final[dict[int, str]] = {
    0: "NOP",
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}
NODE_TYPES: Final[dict[int, str]] = {
    1: "CA", 2: "Switch", 3: "Router", 4: "RNIC", 5: "USNIC", 6: "USNIC_UDP",
    7: "UNSPECIFIED",  # EFA registers as RDMA_NODE_UNSPECIFIED; the kernel prints "7: unspecified"
}

# Per-lane signalling generations (the suffix of the `rate` file). Old kernels print no suffix for SDR.
LANE_SPEEDS: Final = ("SDR", "DDR", "QDR", "FDR10", "FDR", "EDR", "HDR", "NDR", "XDR")


@dataclass(frozen=True, slots=True)
class PmaCounter:
    """Known semantics of a `counters/` (or legacy `counters_ext/`) file.

    `width` is the PMA field width in bits: a narrow counter stops at 2^width - 1 and from then on hides
    new errors until someone resets it, so the exposition reports saturation explicitly.
    `scale` converts the raw unit (4-octet words for the data counters) into base units.
    `maybe_32bit`: a 64-bit `width` that the port's listing cannot confirm, judged saturated at exactly
    2^32 - 1 only (see `pma_counter`).
    `wraps`: a driver that cuts its own wider count to the field's width, so the value wraps to 0
    instead of stopping at the maximum: there is no saturation to report (see `PmaQuirks`).
    All four can differ per port.
    """

    file: str
    key: str
    width: int
    scale: int = 1
    maybe_32bit: bool = False
    wraps: bool = False


# PortCounters / PortCountersExtended fields the kernel exposes under counters/.
PMA_COUNTERS: Final[dict[str, PmaCounter]] = {
    c.file: c
    for c in (
        PmaCounter("symbol_error", "symbol_errors", 16),
        PmaCounter("link_error_recovery", "link_error_recovery", 8),
        PmaCounter("link_downed", "link_downed", 8),
        PmaCounter("port_rcv_errors", "receive_errors", 16),
        PmaCounter("port_rcv_remote_physical_errors", "receive_remote_physical_errors", 16),
        PmaCounter("port_rcv_switch_relay_errors", "receive_switch_relay_errors", 16),
        PmaCounter("port_xmit_discards", "transmit_discards", 16),
        PmaCounter("port_xmit_constraint_errors", "transmit_constraint_errors", 8),
        PmaCounter("port_rcv_constraint_errors", "receive_constraint_errors", 8),
        PmaCounter("local_link_integrity_errors", "local_link_integrity_errors", 4),
        PmaCounter("excessive_buffer_overrun_errors", "excessive_buffer_overrun_errors", 4),
        PmaCounter("VL15_dropped", "vl15_dropped", 16),
        # The kernel serves these from PortCountersExtended (64 bit) when the HCA's PMA says it has
        # them, which every HCA of the last decade does; beside a legacy MLNX_OFED counters_ext/ they are
        # 32 bit, and on a port without the unicast files they may be (see pma_counter).
        PmaCounter("port_xmit_data", "transmit_data_bytes", 64, 4),
        PmaCounter("port_rcv_data", "receive_data_bytes", 64, 4),
        PmaCounter("port_xmit_packets", "transmit_packets", 64),
        PmaCounter("port_rcv_packets", "receive_packets", 64),
        PmaCounter("port_xmit_wait", "transmit_wait", 32),
        PmaCounter("unicast_xmit_packets", "transmit_unicast_packets", 64),
        PmaCounter("unicast_rcv_packets", "receive_unicast_packets", 64),
        PmaCounter("multicast_xmit_packets", "transmit_multicast_packets", 64),
        PmaCounter("multicast_rcv_packets", "receive_multicast_packets", 64),
    )
}
# Legacy MLNX_OFED stacks put the 64-bit PortCountersExtended values in counters_ext/ beside 32-bit counters/
# (mainline made counters/ itself 64-bit in kernel 4.5).
PMA_COUNTERS_EXT: Final[dict[str, PmaCounter]] = {
    c.file: c
    for c in (
        PmaCounter("port_xmit_data_64", "transmit_data_bytes", 64, 4),
        PmaCounter("port_rcv_data_64", "receive_data_bytes", 64, 4),
        PmaCounter("port_xmit_packets_64", "transmit_packets", 64),
        PmaCounter("port_rcv_packets_64", "receive_packets", 64),
        PmaCounter("port_unicast_xmit_packets", "transmit_unicast_packets", 64),
        PmaCounter("port_unicast_rcv_packets", "receive_unicast_packets", 64),
        PmaCounter("port_multicast_xmit_packets", "transmit_multicast_packets", 64),
        PmaCounter("port_multicast_rcv_packets", "receive_multicast_packets", 64),
    )
}
_LEGACY_32BIT: Final = frozenset({"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets"})
_DATA_COUNTERS: Final = frozenset({"port_xmit_data", "port_rcv_data"})
# The IB PMA counts data in 4-octet words. hfi1 (Omni-Path) answers the same queries with its OPA
# counters, which count 8-byte flits (hfi1 mad.c pma_get_ib_portcounters_ext).
IB_DATA_WORD_BYTES: Final = 4
OPA_FLIT_BYTES: Final = 8


@dataclass(frozen=True)
class PmaQuirks:
    """How a driver that emulates the PMA (answers the kernel's counter queries from its own statistics)
    departs from the IB spec, by the driver of the device's PCI function.

    `data_word_bytes`: the unit of the data counters.
    `constant_zero`: files the kernel lists for every such port but the driver never fills. Exported,
    their 0 would read as a clean link; they are neither read nor exported, so the dashboards show no
    value and the alerts rely on the counters the driver keeps.
    `wrapping`: narrow fields the driver fills with its wider count cut to the field's width, which wrap
    to 0 rather than stop at the maximum (`PmaCounter.wraps`).
    """

    data_word_bytes: int = IB_DATA_WORD_BYTES
    constant_zero: frozenset[str] = frozenset()
    wrapping: frozenset[str] = frozenset()


IB_SPEC_PMA: Final = PmaQuirks()
PMA_QUIRKS: Final[dict[str, PmaQuirks]] = {
    # hfi1 mad.c: no OPA counter behind symbol_error and VL15_dropped (commit b8d114ebb6fb, which added
    # its counters/) nor port_rcv_switch_relay_errors (a switch's), the unicast packets of its
    # PortCountersExtended answer are set to 0, and its PortCounters answer never sets port_xmit_wait.
    # Its narrow fields stop at the maximum, as the spec says.
    "hfi1": PmaQuirks(
        data_word_bytes=OPA_FLIT_BYTES,
        constant_zero=frozenset(
            {
                "symbol_error",
                "VL15_dropped",
                "port_rcv_switch_relay_errors",
                "port_xmit_wait",
                "unicast_xmit_packets",
                "unicast_rcv_packets",
            }
        ),
    ),
    # bnxt_re, on functions of bnxt_en, has a PMA since the patch "RDMA/bnxt_re: Support Perf management
    # counters" (linux-rdma, March 2025): the data, packet and unicast counts, and four error fields
    # cut from its 64-bit statistics ((u8)rx_discard_pkts, (u16)rx_error_pkts, (u8)tx_error_pkts,
    # (u16)tx_discard_pkts). Broadcom's own driver also fills link_downed and symbol_error that way (the
    # mainline one leaves them 0: the netdev's PHY counters and the port state show the link then). The
    # 64-bit counts behind the receive two are in hw_counters/ (rx_roce_errors, rx_roce_discards); some
    # driver versions list the transmit two as well.
    "bnxt_en": PmaQuirks(
        constant_zero=frozenset(
            {
                "link_error_recovery",
                "port_rcv_remote_physical_errors",
                "port_rcv_switch_relay_errors",
                "local_link_integrity_errors",
                "excessive_buffer_overrun_errors",
                "VL15_dropped",
                "port_xmit_wait",
                "multicast_xmit_packets",
                "multicast_rcv_packets",
            }
        ),
        wrapping=frozenset(
            {
                "port_rcv_constraint_errors",
                "port_rcv_errors",
                "port_xmit_constraint_errors",
                "port_xmit_discards",
                "link_downed",
                "symbol_error",
            }
        ),
    ),
}
# The kernel's names for the devices of those drivers, for trees without the PCI function's driver link.
_DRIVER_BY_DEVICE_NAME: Final = (("hfi1_", "hfi1"), ("bnxt_re", "bnxt_en"))
# counters/ file -> the counters_ext/ file holding the same PMA field in 64 bits. Where both exist the
# 64-bit one is the counter: the other is neither read nor exported (it stops at 2^32-1, a false
# saturation verdict and a flat rate).
SUPERSEDED_BY_EXT: Final[dict[str, str]] = {
    counter.file: ext.file
    for counter in PMA_COUNTERS.values()
    for ext in PMA_COUNTERS_EXT.values()
    if counter.key == ext.key
}


def pma_counter(
    file: str, *, legacy: bool, quirks: PmaQuirks = IB_SPEC_PMA, unicast: bool = True
) -> PmaCounter | None:
    """Semantics of a counters/ file of a port. `legacy` (counters_ext/ present) narrows the data and
    packet counters to 32 bit; `quirks` are those of the device's driver.

    `unicast`: the port lists the unicast counters, which only the kernel's table for a PMA with IETF
    extended counters has. Without them the kernel chose either the 32-bit PortCounters table (no
    extended counters: the data counter stops at 16 GiB, under a second at 400 Gb/s) or the 64-bit one
    without IETF counters, and both list the same files: the data and packet counters are `maybe_32bit`.
    """
    known = PMA_COUNTERS.get(file)
    if known is None:
        return None
    width = 32 if legacy and file in _LEGACY_32BIT else known.width
    scale = quirks.data_word_bytes if file in _DATA_COUNTERS else known.scale
    maybe_32bit = not legacy and not unicast and file in _LEGACY_32BIT
    wraps = file in quirks.wrapping
    if width == known.width and scale == known.scale and not maybe_32bit and not wraps:
        return known
    return PmaCounter(known.file, known.key, width, scale, maybe_32bit, wraps)


# hw_counters files that are levels, not event counts. Drivers name them differently; these patterns
# cover bnxt_re's active_* resource counts and *watermark* high-water marks, and the *_active counts and
# *_active_max high-water marks of HiSilicon's hns_roce builds outside the mainline kernel.
_HW_GAUGE_PATTERN: Final = re.compile(r"^(active_.*|.*_active(_max)?|.*watermark.*|.*_wm)$")
# Levels whose names say nothing of it. bnxt_re's db_fifo_register is readl() of the doorbell FIFO
# register (bnxt_re_copy_db_pacing_stats), its occupancy now; hfi1's DRIVER_CtxtsOpen is the number of
# contexts open now (hfi1_stats.sps_ctxts, decremented when one is freed); mana_ib's port-level
# current_rate is the firmware's current congestion-control send rate, which falls as well as rises.
_HW_GAUGES: Final = frozenset({"lifespan", "db_fifo_register", "DRIVER_CtxtsOpen", "current_rate"})


def hw_counter_is_gauge(name: str) -> bool:
    # Judged on the snake_case form too: CamelCase `ActiveQPs` is `active_q_ps`.
    return name in _HW_GAUGES or any(_HW_GAUGE_PATTERN.match(form) for form in (name.lower(), metric_fragment(name)))


_CAMEL_BOUNDARY: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NON_NAME: Final = re.compile(r"[^a-z0-9]+")


def metric_fragment(name: str) -> str:
    """Turn a driver's counter file name into a snake_case metric-name fragment.

    irdma uses CamelCase (`ip4InOctets` -> `ip4_in_octets`, `RxECNMrkd` -> `rx_ecn_mrkd`), some drivers
    put spaces or dots in names; everything outside [a-z0-9] collapses into one underscore.
    """
    snake = _CAMEL_BOUNDARY.sub("_", name).lower()
    fragment = _NON_NAME.sub("_", snake).strip("_")
    if not fragment:
        return "unnamed"
    return fragment if not fragment[0].isdigit() else f"n{fragment}"


@dataclass(frozen=True, slots=True)
class PortInfo:
    """What rarely changes about a port: identity, link layer, GIDs and the counter file names."""

    number: int
    link_layer: str | None
    counter_files: tuple[str, ...]  # counters/, less the files counters_ext/ supersedes (SUPERSEDED_BY_EXT)
    counter_ext_files: tuple[str, ...]
    hw_counter_files: tuple[str, ...]
    netdevs: tuple[str, ...]  # own netdev first, then uppers (VLANs); a RoCE LAG port maps to its bond
    gid_types: tuple[tuple[str, int], ...]  # (type, populated GID entries), sorted
    # The PMA semantics of each known counters/ file of this port (pma_counter), decided once here
    # rather than on every scrape. Not part of the port's identity.
    pma_counters: dict[str, PmaCounter] = field(default_factory=dict, compare=False)

    @property
    def reads_as_infiniband(self) -> bool:
        """InfiniBand, or a link layer that could not be read: a port without a link_layer file (kernels
        before RoCE) was InfiniBand, so an unreadable one is read as InfiniBand's too."""
        return self.link_layer in ("InfiniBand", None)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What rarely changes about an RDMA device."""

    name: str
    node_type: str | None
    node_guid: str | None
    sys_image_guid: str | None
    fw_ver: str | None
    hca_type: str | None
    board_id: str | None
    hw_rev: str | None
    node_desc: str | None
    pci_address: str | None
    pci_dir: Path | None  # resolved PCI function directory, for the PCIe collector
    numa_node: int | None
    driver: str | None
    is_vf: bool
    pf_pci_address: str | None
    sriov_numvfs: int | None
    hw_counter_files: tuple[str, ...]
    ports: tuple[PortInfo, ...]
    # Kept here so that the engine's info cache and its udev invalidation (infiniband and net events)
    # cover the netdev and PCIe collectors' static reads too.
    netdevs: tuple[NetdevIdentity, ...] = ()  # the ports' netdevs and bond slaves that existed
    pcie: PcieIdentity | None = None
    hwmon: HwmonIdentity | None = None  # its PCI functions' temperature sensors and their thresholds
    user_verbs_dirs: tuple[str, ...] = ()  # where to look for its uverbsN (verbs.user_verbs_dirs)

    def netdev(self, name: str) -> NetdevIdentity | None:
        return next((n for n in self.netdevs if n.name == name), None)

    @property
    def settled(self) -> bool:
        """False when a static value was read from hardware in transition, so that it is read again soon."""
        return self.pcie is None or not self.pcie.all_ones


@dataclass(frozen=True, slots=True)
class Rate:
    """The port `rate` file: `400 Gb/sec (4X NDR)`, or the old `10 Gb/sec (4X)`, SDR without its name."""

    bits_per_second: float
    lanes: int | None
    speed: str | None

    @property
    def bytes_per_second(self) -> float:
        return self.bits_per_second / 8


_NO_RATE_ERRNOS: Final = frozenset({errno.EINVAL})

# MLNX_OFED's mlx5 prints `0 GB/sec` (capital B) for a port with an empty cage. [0-9], not \d, which takes
# other scripts' digits: `٤٠٠ Gb/sec` is no kernel's text (fuzz review).
_RATE_PATTERN: Final = re.compile(
    r"^\s*([0-9]{1,9}(?:\.[0-9]+)?)\s*G[bB]/sec(?:\s*\(\s*([0-9]{1,9})X\s*([A-Za-z0-9]*)\s*\))?\s*$"
)
# The widths ib_width_enum_to_int() knows: rate_show() fails (EINVAL) for any other, so never prints one.
LANE_COUNTS: Final = frozenset({1, 2, 4, 8, 12})


def parse_rate(text: str) -> Rate | None:
    match = _RATE_PATTERN.match(text)
    if match is None:
        return None
    gbits, lanes, speed = match.groups()
    if lanes and int(lanes) not in LANE_COUNTS:
        return None
    if lanes and not speed:
        speed = "SDR"  # rate_show() before 4.x left the name of SDR (and of unknown speeds) empty
    speed = speed.upper() if speed else None
    if speed is not None and speed not in LANE_SPEEDS:
        speed = None
    return Rate(float(gbits) * 1e9, int(lanes) if lanes else None, speed)


# Bounded digits: int() raises on a run of over 4300 (the state is a u8 anyway).
_STATE_PATTERN: Final = re.compile(r"^\s*([0-9]{1,9})\s*:\s*(\S.*?)?\s*$")


def parse_state(text: str) -> tuple[int, str] | None:
    """`4: ACTIVE` -> (4, "ACTIVE"); `4:` -> (4, ""). Which name is shown is the caller's choice."""
    match = _STATE_PATTERN.match(text)
    if match is None:
        return None
    number = int(match.group(1))
    if number > 255:
        return None
    return number, match.group(2) or ""


@dataclass(slots=True)
class PortSnapshot:
    """One scrape's view of a port. Values a file could not give are None / absent."""

    info: PortInfo
    state: tuple[int, str] | None = None
    phys_state: tuple[int, str] | None = None
    rate: Rate | None = None
    lid: int | None = None
    sm_lid: int | None = None
    counters: dict[str, int] = field(default_factory=dict)
    counters_ext: dict[str, int] = field(default_factory=dict)
    hw_counters: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class DeviceSnapshot:
    info: DeviceInfo
    ports: list[PortSnapshot] = field(default_factory=list)
    hw_counters: dict[str, int] = field(default_factory=dict)
    user_verbs: bool | None = None  # None: not read, or could not be told (verbs.read_user_verbs)
    user_verbs_loaded: bool | None = None  # whether ib_uverbs is loaded, as the same read found it


def list_devices(sys_root: Path, reader: SysfsReader) -> list[str]:
    """Names under class/infiniband. Only the directory is listed: no file of any device is opened."""
    return list_dir(sys_root / CLASS_DIR, reader)


_NUMA_NODE: Final = re.compile(r"^(?:-1|[0-9]{1,9})$")


def _numa_node(path: Path, reader: SysfsReader) -> int | None:
    """The PCI function's NUMA node; None for -1 (NUMA_NO_NODE, not an error) and for garbage (counted)."""
    node = reader.parsed(path, _numa_number, "a NUMA node", optional=True)
    return node if node is not None and node >= 0 else None


def _numa_number(text: str) -> int | None:
    return int(text) if _NUMA_NODE.match(text) else None


def pci_address_of(sys_root: Path, name: str) -> str | None:
    """The PCI address of a device from its `device` link alone: no attribute file is opened, so this is
    safe for a device the filters skip because its reads misbehave."""
    pci_dir = pci_function(sys_root / CLASS_DIR / name)
    return pci_dir.name if pci_dir else None


def _gid_types(port_dir: Path, reader: SysfsReader) -> tuple[tuple[str, int], ...]:
    """Count populated GID table entries by type (IB/RoCE v1, RoCE v2).

    Unpopulated entries hold the all-zero GID and their gid_attrs files fail with EINVAL on a real
    kernel, so they are skipped without reading the attribute and are not errors. (4.19 made the zero
    GID the answer for them again; 4.17 and 4.18 passed the GID cache's EAGAIN through.)
    """
    types: Counter[str] = Counter()
    for index in list_dir(port_dir / "gids", reader):
        gid_path = port_dir / "gids" / index
        gid = reader.text(gid_path, optional=True, absent_errnos=GID_ATTR_NO_VALUE_ERRNOS)
        if gid is None or (gid and not gid.replace(":", "").strip("0")):
            continue  # an unpopulated entry (an empty file is not one: the kernel always prints a GID)
        if not _GID.fullmatch(gid):
            reader.fail(REASON_MALFORMED, gid_path, f"not a GID: {gid[:40]!r}")
            continue
        # Up to 4.18 an IB port's entries have no attributes (EINVAL): the GID is not counted by type then.
        type_path = port_dir / "gid_attrs" / "types" / index
        gid_type = reader.text(type_path, optional=True, absent_errnos=GID_ATTR_NO_VALUE_ERRNOS)
        if gid_type in GID_TYPES:
            types[gid_type] += 1
        elif gid_type is not None:
            reader.fail(REASON_MALFORMED, type_path, f"not a GID type: {gid_type[:40]!r}")
    return tuple(sorted(types.items()))


def read_port_info(
    sys_root: Path,
    device: str,
    port: int,
    reader: SysfsReader,
    *,
    quirks: PmaQuirks = IB_SPEC_PMA,
    single_port: bool,
) -> PortInfo:
    port_dir = sys_root / CLASS_DIR / device / "ports" / str(port)
    counter_files = list_dir(port_dir / "counters", reader)
    # Judged on the kernel's listing, before a driver's constant zeros (hfi1's unicast files) leave it.
    unicast = "unicast_xmit_packets" in counter_files
    counter_files = [name for name in counter_files if name not in quirks.constant_zero]
    ext_listing = list_dir(port_dir / "counters_ext", reader)
    # A 64-bit counters_ext/ file replaces its counters/ twin only if it answers now: an HCA without
    # extended counters may list them and fail each read (EINVAL), and then the 32-bit value is all there
    # is. Any other failure is counted, so the static info is read again soon (engine). One that has
    # answered the device's scrapes stays chosen without a probe: a failed PMA query (EINVAL as well)
    # during a re-read would swap in the 32-bit twin, whose smaller value reads as a counter reset.
    def ext_answers(name: str) -> bool:
        path = port_dir / "counters_ext" / name
        if reader.memory is not None and reader.memory.has_answered(os.fspath(path)):
            return True
        return reader.uint(path, optional=True, absent_errnos=NO_VALUE_ERRNOS) is not None

    counter_ext_files = tuple(name for name in ext_listing if name not in PMA_COUNTERS_EXT or ext_answers(name))
    if counter_ext_files:
        counter_files = [f for f in counter_files if SUPERSEDED_BY_EXT.get(f) not in counter_ext_files]
    netdevs = tuple(rdma_port_netdevs(sys_root, device, port, reader, single_port=single_port))
    return PortInfo(
        number=port,
        # None if unreadable or garbage (counted): read_device_info asks the port's netdevs then.
        link_layer=label_text(port_dir / "link_layer", reader, _LINK_LAYER),
        counter_files=tuple(counter_files),
        counter_ext_files=counter_ext_files,
        hw_counter_files=tuple(list_dir(port_dir / "hw_counters", reader)),
        netdevs=netdevs,
        gid_types=_gid_types(port_dir, reader),
        # counters/ is the 32-bit PortCounters beside a legacy counters_ext/, whether or not its files answer.
        pma_counters={
            file: counter
            for file in counter_files
            if (
                counter := pma_counter(
                    file, legacy=bool(ext_listing), quirks=quirks, unicast=unicast
                )
            )
            is not None
        },
    )


def _with_netdev_link_layer(port: PortInfo, netdevs: dict[str, NetdevIdentity]) -> PortInfo:
    """A port whose link_layer file failed takes the link layer from the ARPHRD type of its first netdev
    that has one: IPoIB interfaces are InfiniBand, RoCE netdevs (and their VLANs and bonds) Ethernet.
    Without it a RoCE port would lose every ethtool series and gain LIDs of 0."""
    if port.link_layer is not None:
        return port
    for name in port.netdevs:
        kind = identity.type if (identity := netdevs.get(name)) is not None else None
        if kind == ARPHRD_INFINIBAND:
            return replace(port, link_layer="InfiniBand")
        if kind == ARPHRD_ETHER:
            return replace(port, link_layer="Ethernet")
    return port


# Port numbers are u32 in the kernel since 5.13 (U32_MAX is reserved): mlx5 in switchdev mode gives its
# representor device one port per vport, more than 255 with enough VFs or SFs. (Only the verbs API still
# says 255.) Port 0 is a switch's management port.
MAX_PORT_NUMBER: Final = 2**32 - 2


# Descriptive attributes become label values: text no kernel prints (control characters, pages of it) is
# a malformed file, not a label (fuzz review). The kernel's own limits are 64 bytes (node_desc, fw_ver).
_LABEL_TEXT: Final = re.compile(r"[^\x00-\x1f\x7f]{0,128}")  # irdma leaves board_id empty
_GUID: Final = re.compile(r"[0-9a-f]{4}(?::[0-9a-f]{4}){3}", re.IGNORECASE)
# node_desc is what an administrator (or the SM's node-name service) wrote, up to 64 bytes, tabs and
# newlines included: the kernel prints it back as written, so any text of that length is real.
_NODE_DESC: Final = re.compile(r".{0,64}", re.DOTALL)
_DRIVER_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # mlx5_core, hfi1, bnxt_en
GID_TYPES: Final = frozenset({"IB/RoCE v1", "RoCE v2"})  # the kernel's gid_type_str
# A GID as the kernel prints it (%pI6): eight groups of four hex digits.
_GID: Final = re.compile(r"[0-9a-f]{4}(?::[0-9a-f]{4}){7}", re.IGNORECASE)
# link_layer_show prints Unknown for any other link layer (EFA's, usNIC's); Unspecified is tolerated.
_LINK_LAYER: Final = re.compile(r"InfiniBand|Ethernet|Unknown|Unspecified")


def label_text(path: Path, reader: SysfsReader, form: re.Pattern[str] = _LABEL_TEXT) -> str | None:
    """An optional attribute that is exported as a label value, if it has the form the kernel gives it."""
    return reader.parsed(path, lambda text: text if form.fullmatch(text) else None, "a label value", optional=True)


def read_device_info(sys_root: Path, name: str, reader: SysfsReader) -> DeviceInfo:
    """Everything static about one device. Only files of this device are read."""
    device_dir = sys_root / CLASS_DIR / name
    node_type = reader.text(device_dir / "node_type", optional=True)
    parsed_type = parse_state(node_type) if node_type else None
    if node_type is not None and parsed_type is None:  # an empty file too: the kernel always prints one
        reader.fail(REASON_MALFORMED, device_dir / "node_type", f"not a '<id>: <name>' type: {node_type[:40]!r}")
    # A number the kernel does not name it prints as `<unknown>`; a name it never prints (pages of text,
    # control characters) would be an unbounded label (fuzz review).
    type_name = NODE_TYPES.get(parsed_type[0]) if parsed_type else None
    if parsed_type and type_name is None:
        if _LABEL_TEXT.fullmatch(parsed_type[1]):
            type_name = parsed_type[1]
        else:
            reader.fail(REASON_MALFORMED, device_dir / "node_type", "a type name no label can hold")
    pci_dir = pci_function(device_dir)
    if pci_dir is None and os.path.islink(device_dir / "device") and not os.path.exists(device_dir / "device"):
        # A parent link into nothing: the PCIe, NUMA and netdev series go, which must not pass in silence
        # (fuzz review). A link to a parent that is no PCI function (an auxiliary device) is no error.
        reader.fail(REASON_MISSING, device_dir / "device", "the parent device link leads nowhere")
    numa = sriov = None
    pf_address = driver = None
    is_vf = False
    if pci_dir is not None:
        numa = _numa_node(pci_dir / "numa_node", reader)
        driver = link_name(pci_dir / "driver", _DRIVER_NAME, under="drivers")
        physfn = pci_dir / "physfn"
        if os.path.islink(physfn):
            is_vf = True
            pf_address = link_name(physfn, PCI_ADDRESS)
        else:
            sriov = reader.uint(pci_dir / "sriov_numvfs", optional=True)
    pma_driver = driver or next((known for prefix, known in _DRIVER_BY_DEVICE_NAME if name.startswith(prefix)), None)
    quirks = PMA_QUIRKS.get(pma_driver or "", IB_SPEC_PMA)
    numbers: list[int] = []
    for entry in list_dir(device_dir / "ports", reader, optional=False):
        number = parse_entry_number(entry)
        entry_path = device_dir / "ports" / entry
        if number is None or number > MAX_PORT_NUMBER:
            reader.fail(REASON_MALFORMED, entry_path, "not a port number")
            continue
        # A port is a directory; a file or a dangling link by a port's name would be a phantom port,
        # with empty labels and failed reads every scrape.
        if not os.path.isdir(entry_path):
            reader.fail(REASON_MALFORMED, entry_path, "not a port directory")
            continue
        numbers.append(number)
    ports = [
        read_port_info(
            sys_root, name, number, reader, quirks=quirks, single_port=len(numbers) == 1
        )
        for number in sorted(numbers)
    ]
    netdevs = _netdev_identities(sys_root, ports, reader)
    by_name = {identity.name: identity for identity in netdevs}
    ports = [_with_netdev_link_layer(port, by_name) for port in ports]
    return DeviceInfo(
        name=name,
        node_type=type_name,
        node_guid=label_text(device_dir / "node_guid", reader, _GUID),
        sys_image_guid=label_text(device_dir / "sys_image_guid", reader, _GUID),
        fw_ver=label_text(device_dir / "fw_ver", reader),
        hca_type=label_text(device_dir / "hca_type", reader),
        board_id=label_text(device_dir / "board_id", reader),
        hw_rev=label_text(device_dir / "hw_rev", reader),
        node_desc=label_text(device_dir / "node_desc", reader, _NODE_DESC),
        pci_address=pci_dir.name if pci_dir else None,
        pci_dir=pci_dir,
        numa_node=numa,
        driver=driver,
        is_vf=is_vf,
        pf_pci_address=pf_address,
        sriov_numvfs=sriov,
        hw_counter_files=tuple(list_dir(device_dir / "hw_counters", reader)),
        ports=tuple(ports),
        netdevs=netdevs,
        pcie=read_pcie_identity(pci_dir, reader) if pci_dir is not None else None,
        hwmon=read_hwmon_identity(_port_functions(sys_root, pci_dir, netdevs, reader), reader) if pci_dir else None,
        user_verbs_dirs=user_verbs_dirs(sys_root, name),
    )


def _port_functions(
    sys_root: Path, pci_dir: Path, netdevs: tuple[NetdevIdentity, ...], reader: SysfsReader
) -> list[Path]:
    """The device's PCI function, then the functions of its card that a RoCE LAG device stands for: its
    bond slaves' functions that have no RDMA device of their own (mlx5 folds both ports of a card into
    mlx5_bond_N on the first function). A bond over functions that keep their RDMA devices, or over
    another card's, is no LAG: those functions' sensors are their own devices'."""
    functions = [pci_dir]
    for slave in card_bond_slaves(pci_dir.name, netdevs).values():
        function = pci_function(sys_root / "class" / "net" / slave)
        if function is not None and has_no_rdma_device(function, reader):  # None: gone since read
            functions.append(function)
    return functions


def _netdev_identities(sys_root: Path, ports: list[PortInfo], reader: SysfsReader) -> tuple[NetdevIdentity, ...]:
    """Static attributes of every netdev the ports name, and of the slaves of those that are bonds."""
    identities: dict[str, NetdevIdentity | None] = {}
    pending = [name for port in ports for name in port.netdevs]
    while pending:
        name = pending.pop(0)
        if name in identities:
            continue
        identity = identities[name] = read_netdev_identity(sys_root, name, reader)
        if identity is not None and identity.is_bond_master:
            pending += identity.bond_slaves
    return tuple(i for i in identities.values() if i is not None)


# Per-scrape reads build paths as plain strings: pathlib joins cost more than the pread of a kept file.


def _read_state(path: str, reader: SysfsReader, names: dict[int, str]) -> tuple[int, str] | None:
    # The spec's name for a known number, whatever the kernel printed (one spelling per state across
    # drivers and kernels); the kernel's only for a number the spec does not name.
    parsed = reader.parsed(path, parse_state, "a '<id>: <name>' state")
    if parsed is None:
        return None
    number, name = parsed
    return number, names.get(number, name)


def read_port_snapshot(device_dir: str | Path, info: PortInfo, reader: SysfsReader) -> PortSnapshot:
    port_dir = f"{os.fspath(device_dir)}/ports/{info.number}"
    snapshot = PortSnapshot(info=info)
    snapshot.state = _read_state(f"{port_dir}/state", reader, PORT_STATES)
    snapshot.phys_state = _read_state(f"{port_dir}/phys_state", reader, PHYS_STATES)
    # Upstream rate_show() answers EINVAL while the port has no valid width (no cable or module in
    # the cage): no rate, not a broken file.
    snapshot.rate = reader.parsed(f"{port_dir}/rate", parse_rate, "a rate", absent_errnos=_NO_RATE_ERRNOS)
    if info.reads_as_infiniband:
        # Only InfiniBand has a subnet manager: the lid files of RoCE ports and of ports of no link layer
        # (Unknown: EFA, usNIC) read 0 and mean nothing, two reads a port and scrape for nothing.
        # lid_show() prints "0x%x": a decimal, octal or binary literal there is not a kernel value.
        snapshot.lid = reader.uint(f"{port_dir}/lid", optional=True, base=16, prefix="0x")
        snapshot.sm_lid = reader.uint(f"{port_dir}/sm_lid", optional=True, base=16, prefix="0x")
    snapshot.counters = reader.uints(f"{port_dir}/counters", info.counter_files)
    if info.counter_ext_files:
        snapshot.counters_ext = reader.uints(f"{port_dir}/counters_ext", info.counter_ext_files)
    if info.hw_counter_files:
        snapshot.hw_counters = reader.uints(f"{port_dir}/hw_counters", info.hw_counter_files)
    return snapshot


def read_device_snapshot(sys_root: Path, info: DeviceInfo, reader: SysfsReader) -> DeviceSnapshot:
    """The per-scrape values of a device whose static info is already known."""
    device_dir = f"{os.fspath(sys_root)}/{CLASS_DIR}/{info.name}"
    snapshot = DeviceSnapshot(info=info)
    if info.hw_counter_files:
        snapshot.hw_counters = reader.uints(f"{device_dir}/hw_counters", info.hw_counter_files)
    snapshot.ports = [read_port_snapshot(device_dir, port, reader) for port in info.ports]
    return snapshot
