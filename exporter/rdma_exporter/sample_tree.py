"""Deterministic sysfs trees of GPU-cluster RDMA nodes, in the exact format of a real Linux kernel.

The exporter serves such a tree when a machine has no /sys/class/infiniband, the tests build golden
files from it and the benchmark builds trees of 1 to 128 RDMA devices. The sample node is a DGX-H100-like
host: eight ConnectX-7 NDR InfiniBand HCAs (mlx5_0..7, IPoIB netdevs ibp<bus>s0) and one dual-port
BlueField-3 in NIC mode running RoCE at 200G (mlx5_8/9, netdevs enp220s0f0np0/enp220s0f1np1).

Formats follow the kernel (drivers/infiniband/core/sysfs.c, net-sysfs.c, pci-sysfs.c, pcie/aer.c, mlx5's
hwmon.c) and the real captures in shared/fixtures: every attribute ends in a newline, GUIDs are 4-hex
groups, GIDs are 8 zero-padded groups, states are "<num>: <NAME>". Symlinks are relative and built the way kernfs
builds them, so resolving them inside the tree works like on a real /sys.

Pure stdlib. Usage: ``python -m rdma_exporter.sample_tree DEST [--devices N] [--healthy]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["HEALTHY_SPEC", "SAMPLE_SPEC", "TreeSpec", "build_tree", "main", "spec_for_devices"]


@dataclass(frozen=True)
class TreeSpec:
    """What to put in a sample tree. Device names follow mlx5 probe order: IB PFs, RoCE PFs, then VFs."""

    hostname: str = "dgx-h100-01"
    ib_hcas: int = 8  # ConnectX-7 NDR 400G InfiniBand, mlx5_0..mlx5_{n-1}, one port each
    roce_hcas: int = 2  # BlueField-3 Ethernet RoCE 200G ports after them (two PCI functions per card)
    vfs_per_pf: int = 0  # SR-IOV VFs per IB PF, each its own RDMA device, numbered after all PFs
    degraded_pcie: tuple[str, ...] = ("mlx5_5",)  # PCIe link trained at 16.0 GT/s (Gen4) below max 32.0
    gen4_slots: tuple[str, ...] = ()  # the root port above is Gen4: the link trains at Gen4 and is not degraded
    down_ports: tuple[str, ...] = ()  # port 1 is "1: DOWN" / "3: Disabled"; VFs of a down PF go down too
    # The RoCE cards show the host a PCIe switch of their own (as a ConnectX-8 SuperNIC does): their
    # functions hang below it on an on-chip link, and the card's link to the slot is the switch's.
    card_switch: bool = False
    seed: int = 1


SAMPLE_SPEC = TreeSpec()
HEALTHY_SPEC = TreeSpec(degraded_pcie=(), down_ports=())

MAX_IB_PFS = 8  # a DGX/HGX node has one NDR HCA per GPU

# --- hardware identity (data facts from the fixtures: leptonai H100 capture, gpud ibstat outputs) -------

VENDOR_MELLANOX = "0x15b3"
_CX7 = {"device": "0x1021", "hca_type": "MT4129", "fw_ver": "28.41.1000", "board_id": "MT_0000000838"}
_BF3 = {"device": "0xa2dc", "hca_type": "MT41692", "fw_ver": "32.38.3056", "board_id": "MT_0000000884"}
# mlx5 VFs of every ConnectX generation share one device id; hca_type is the id in decimal (0x101e).
_VF = {"device": "0x101e", "hca_type": "MT4126", "fw_ver": "28.41.1000", "board_id": "MT_0000000838"}
_CAP_MASK_IB = "0xa751e848"  # CX-7 IB port, as ibstat shows it on H100 nodes
_CAP_MASK_ROCE = "0x00010000"
_RATE_IB = "400 Gb/sec (4X NDR)"
_RATE_ROCE = "200 Gb/sec (2X NDR)"  # 200GbE is two 100G PAM4 lanes, which the IB core names 2X NDR
# A port without link still reports a rate: mlx5 firmware leaves width 4X / speed QDR, which ibstat
# shows as "Rate: 40" on down ports (gpud_h100_roce_some_down_polling fixture).
_RATE_DOWN = "40 Gb/sec (4X QDR)"
_SPEED_MBPS_IB, _SPEED_MBPS_ROCE, _SPEED_MBPS_DOWN_IB = 400000, 200000, 40000

_GEN5, _GEN4 = "32.0 GT/s PCIe", "16.0 GT/s PCIe"

# PCI placement: (root bus, endpoint bus) per card. Seven of the IB buses are a DGX H100's compute rails
# (ibp24s0, ibp64s0, ...); its eighth is 0xdc, which the BlueField-3 has here, and 0xaa is none of
# them: the sample is like a DGX H100, not its layout (deploy/examples/expected-dgx-h100.yml has that).
# Each HCA sits behind its own root port 01.0. More cards than listed wrap into further PCI domains,
# which is how a big host enumerates and keeps every address unique.
_IB_SLOTS = (
    (0x00, 0x18), (0x37, 0x40), (0x48, 0x4F), (0x57, 0x5E), (0x97, 0x9A), (0xA7, 0xAA), (0xB7, 0xC0), (0xC7, 0xCE),
)  # fmt: skip
# The BlueField-3 sits on a bus above every IB HCA so that it probes, and is numbered, after them.
# Each leaves two buses between the root port and the functions for a card's own switch (card_switch).
_ROCE_SLOTS = ((0xD7, 0xDC), (0xE7, 0xEA), (0xF0, 0xF4))
_MAX_VFS = 254  # VF routing IDs must stay on the PF's bus (devfn 1..255, ARI with offset 1, stride 1)

GID_TABLE_LEN = 16  # real mlx5 tables have 256 entries (IB) / 255 (RoCE); 16 keep trees small
PKEY_TABLE_LEN = 16  # real CX-7 IB ports have 128

# --- attribute file sets ---------------------------------------------------------------------------

# ports/N/counters: the 21 files of the leptonai H100 capture. Data counters are in 4-octet words.
_IB_COUNTERS = (
    "VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
    "local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets",
    "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_constraint_errors",
    "port_xmit_data", "port_xmit_discards", "port_xmit_packets", "port_xmit_wait", "symbol_error",
    "unicast_rcv_packets", "unicast_xmit_packets",
)  # fmt: skip
# ports/N/hw_counters of an mlx5 port (the capture's 26 files); RoCE ports add the congestion counters.
_HW_COUNTERS = (
    "duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err", "out_of_buffer",
    "out_of_sequence", "packet_seq_err", "req_cqe_error", "req_cqe_flush_error", "req_remote_access_errors",
    "req_remote_invalid_request", "resp_cqe_error", "resp_cqe_flush_error", "resp_local_length_error",
    "resp_remote_access_errors", "rnr_nak_retry_err", "roce_adp_retrans", "roce_adp_retrans_to",
    "roce_slow_restart", "roce_slow_restart_cnps", "roce_slow_restart_trans", "rx_atomic_requests",
    "rx_dct_connect", "rx_icrc_encapsulated", "rx_read_requests", "rx_write_requests",
)  # fmt: skip
_HW_COUNTERS_CC = ("np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored")
# net/<if>/statistics: the 24 files of struct rtnl_link_stats64 that a kernel >= 4.6 exposes.
_NET_STATS = (
    "collisions", "multicast", "rx_bytes", "rx_compressed", "rx_crc_errors", "rx_dropped", "rx_errors",
    "rx_fifo_errors", "rx_frame_errors", "rx_length_errors", "rx_missed_errors", "rx_nohandler",
    "rx_over_errors", "rx_packets", "tx_aborted_errors", "tx_bytes", "tx_carrier_errors", "tx_compressed",
    "tx_dropped", "tx_errors", "tx_fifo_errors", "tx_heartbeat_errors", "tx_packets", "tx_window_errors",
)  # fmt: skip
# AER strings of drivers/pci/pcie/aer.c, in bit order; the kernel prints one "<name> <count>" line each.
_AER_COR = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
_AER_UNCOR = (
    "Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
    "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
    "PoisonTLPBlocked",
)  # fmt: skip
# MLNX_OFED / DOCA-OFED DCQCN knobs under net/<if>/ecn (inbox mlx5 has no such directory); values are
# the driver defaults seen in the procfs fixture. enable/<prio> is written separately.
_ECN_NP = {"cnp_802p_prio": 6, "cnp_dscp": 48, "min_time_between_cnps": 4}
_ECN_RP = {
    "clamp_tgt_rate": 0, "clamp_tgt_rate_after_time_inc": 1, "dce_tcp_g": 1019, "dce_tcp_rtt": 1,
    "initial_alpha_value": 1023, "rate_reduce_monitor_period": 4, "rate_to_set_on_first_cnp": 0,
    "rpg_ai_rate": 5, "rpg_byte_reset": 32767, "rpg_gd": 11, "rpg_hai_rate": 50, "rpg_max_rate": 0,
    "rpg_min_dec_fac": 50, "rpg_min_rate": 1, "rpg_threshold": 1, "rpg_time_reset": 300,
}  # fmt: skip
_ROCE_PRIO = 3  # RoCE traffic class: PFC and ECN enabled on priority 3 only
_CNP_PRIO = _ECN_NP["cnp_802p_prio"]
_CNP_FRAME_BYTES = 78  # Eth + IPv4 + UDP + BTH + 16 reserved + ICRC + FCS


# --- the node model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Func:
    """A PCI function placed under its root port, the way a real sysfs devices/ hierarchy nests it."""

    domain: int
    root_bus: int
    bus: int
    devfn: int
    card_switch: bool = False

    @property
    def bdf(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.devfn >> 3:02x}.{self.devfn & 7}"

    @property
    def root_port(self) -> str:
        return f"{self.domain:04x}:{self.root_bus:02x}:01.0"

    @property
    def root_port_path(self) -> str:
        return f"devices/pci{self.domain:04x}:{self.root_bus:02x}/{self.root_port}"

    @property
    def switch_ports(self) -> tuple[str, ...]:
        """The card's own switch between the root port and the function: its upstream port, then the
        downstream port the function hangs from (the two buses below the function's)."""
        if not self.card_switch:
            return ()
        return tuple(f"{self.domain:04x}:{self.bus - n:02x}:00.0" for n in (2, 1))

    @property
    def path(self) -> str:
        return "/".join((self.root_port_path, *self.switch_ports, self.bdf))

    def netdev_stem(self) -> str:
        """systemd's predictable path name stem: P<domain> only outside domain 0, then p<bus>s<slot>."""
        dom = f"P{self.domain}" if self.domain else ""
        return f"{dom}p{self.bus}s{self.devfn >> 3}"


@dataclass
class _Dev:
    """One RDMA device (one port) with its PCI function and netdev."""

    index: int
    kind: str  # "ib", "roce" or "vf"
    func: _Func
    netdev: str
    numa: int
    degraded: bool = False
    gen4_slot: bool = False
    down: bool = False
    pf: _Dev | None = None
    vfs: list[_Dev] = field(default_factory=list)
    ifindex: int = 0

    @property
    def name(self) -> str:
        return f"mlx5_{self.index}"

    @property
    def link_speed(self) -> str:
        """The speed its PCIe link trained at, which both ends show: Gen4 when degraded or in a Gen4 slot."""
        return _GEN4 if self.degraded or self.gen4_slot else _GEN5

    @property
    def ethernet(self) -> bool:
        return self.kind == "roce"


def _plan(spec: TreeSpec) -> list[_Dev]:
    """Lay out devices in mlx5 probe order: IB PFs, RoCE PFs by PCI address, then VFs PF by PF."""
    if spec.ib_hcas < 0 or spec.roce_hcas < 0 or spec.ib_hcas + spec.roce_hcas == 0:
        raise ValueError("a tree needs at least one InfiniBand or RoCE HCA")
    if not 0 <= spec.vfs_per_pf <= _MAX_VFS:
        raise ValueError(f"vfs_per_pf must be within 0..{_MAX_VFS}")
    devs: list[_Dev] = []
    for i in range(spec.ib_hcas):
        root, bus = _IB_SLOTS[i % len(_IB_SLOTS)]
        func = _Func(i // len(_IB_SLOTS), root, bus, 0)
        # NUMA follows the slot: the first half of the slots hang off socket 0.
        numa = 0 if i % len(_IB_SLOTS) < len(_IB_SLOTS) // 2 else 1
        devs.append(_Dev(len(devs), "ib", func, f"ib{func.netdev_stem()}", numa))
    for r in range(spec.roce_hcas):
        card, fn = divmod(r, 2)  # a BlueField-3 is one card with one PCI function per port
        root, bus = _ROCE_SLOTS[card % len(_ROCE_SLOTS)]
        func = _Func(card // len(_ROCE_SLOTS), root, bus, fn, spec.card_switch)
        # enp<bus>s0f<fn>np<port>: the "np<N>" suffix is phys_port_name "p<N>" of the uplink.
        devs.append(_Dev(len(devs), "roce", func, f"en{func.netdev_stem()}f{fn}np{fn}", 1))
    for pf in [d for d in devs if d.kind == "ib"]:
        for n in range(spec.vfs_per_pf):
            func = dataclasses.replace(pf.func, devfn=pf.func.devfn + 1 + n)
            # systemd >= 249 names a VF after its PF with a v<N> suffix.
            vf = _Dev(len(devs), "vf", func, f"{pf.netdev}v{n}", pf.numa, pf=pf)
            pf.vfs.append(vf)
            devs.append(vf)
    by_name = {d.name: d for d in devs}
    for name in spec.degraded_pcie:
        if name not in by_name:
            raise ValueError(f"degraded_pcie names {name!r}, which this tree does not have")
        if by_name[name].kind == "vf":
            raise ValueError(f"{name} is a VF: a VF has no PCIe link of its own to degrade")
        by_name[name].degraded = True
    for name in spec.gen4_slots:
        if name not in by_name or by_name[name].kind == "vf":
            raise ValueError(f"gen4_slots names {name!r}, which is not a PF of this tree")
        by_name[name].gen4_slot = True
    # Functions under one root port share one link (the two ports of a BlueField): its speed and the
    # port's maximum are one value for all of them.
    links: dict[str, _Dev] = {}
    for d in devs:
        if d.kind != "vf":
            first = links.setdefault(d.func.root_port_path, d)
            if (first.degraded, first.gen4_slot) != (d.degraded, d.gen4_slot):
                raise ValueError(f"{first.name} and {d.name} share one PCIe link: name both or neither")
    for name in spec.down_ports:
        if name not in by_name:
            raise ValueError(f"down_ports names {name!r}, which this tree does not have")
        by_name[name].down = True
    for d in devs:
        if d.pf is not None and d.pf.down:
            d.down = True  # a VF port is only as up as the physical link under it
        d.ifindex = 4 + d.index  # 1 is lo, 2-3 the on-board management NICs; then probe order
    return devs


def spec_for_devices(n: int) -> TreeSpec:
    """A spec with exactly ``n`` RDMA devices, for benchmarks.

    Up to 8 devices are IB PFs only. Beyond that the node has the 8 IB PFs, ``(n - 8) // 8`` VFs per PF,
    and the ``(n - 8) % 8`` left over become RoCE ports: 10 gives the sample topology (8 IB + 2 RoCE),
    32 and 128 give 8 PFs with 3 and 15 VFs each. mlx5_5 has the degraded PCIe link whenever it is a PF.
    """
    if n < 1:
        raise ValueError("a tree needs at least one RDMA device")
    ib = min(n, MAX_IB_PFS)
    vfs, roce = divmod(n - ib, MAX_IB_PFS)
    degraded = ("mlx5_5",) if ib > 5 else ()
    return TreeSpec(ib_hcas=ib, roce_hcas=roce, vfs_per_pf=vfs, degraded_pcie=degraded)


# --- identities ------------------------------------------------------------------------------------


def _guid(value: int) -> str:
    """64-bit GUID the way sysfs prints node_guid: four 16-bit hex groups."""
    return ":".join(f"{(value >> s) & 0xFFFF:04x}" for s in (48, 32, 16, 0))


def _gid(prefix: int, iid: int) -> str:
    """128-bit GID as %pI6 prints it: eight zero-padded groups, never compressed."""
    return f"{_guid(prefix)}:{_guid(iid)}"


def _mac(value: int) -> str:
    return ":".join(f"{(value >> s) & 0xFF:02x}" for s in range(40, -8, -8))


def _eui64(mac: int) -> int:
    """Modified EUI-64 interface id of a MAC (flip U/L, insert ff:fe): the RoCE link-local GID's half."""
    oui, nic = mac >> 24, mac & 0xFFFFFF
    return ((oui ^ 0x020000) << 40) | (0xFFFE << 24) | nic


_LINK_LOCAL = 0xFE80 << 48
_OUI_IB = 0xB8CEF6  # ConnectX-7 InfiniBand GUIDs, b8ce:f603:00xx:xxxx
_OUI_ETH = 0xA088C2  # BlueField-3 MACs


@dataclass(frozen=True)
class _Ident:
    node_guid: int
    sys_image_guid: int
    port_guid: int  # interface id of GID 0
    lid: int
    mac: int  # Ethernet MAC (RoCE) or 0
    ipv4: int  # RoCE IPv4 address (GID entries 2/3) or 0
    qpn: int  # IPoIB QPN, the first bytes of the 20-byte IPoIB hardware address


def _identity(d: _Dev, rng: random.Random, roce_base_mac: dict[tuple[int, int], int]) -> _Ident:
    # The device index goes into the low bits so identities stay unique however many devices there are.
    low = (rng.getrandbits(12) << 12) | (d.index & 0xFFF)
    lid = 0x100 + d.index * 7 + rng.randrange(7)  # SM-assigned, distinct per port
    lid = 0 if d.down else lid  # drawn anyway: a fault must not shift the device's other values
    qpn = rng.randrange(0x100, 0x1000)
    if d.kind == "roce":
        # Both functions of a card have consecutive MACs and the card's system image GUID.
        card = (d.func.domain, d.func.bus)
        base = roce_base_mac.setdefault(card, (_OUI_ETH << 24) | (low & 0xFFFFF0))
        mac = base + d.func.devfn
        sys_guid = (_OUI_ETH << 40) | (0x0300 << 24) | (base & 0xFFFFFF)
        ip = (10 << 24) | ((100 + d.func.devfn) << 16) | (rng.randrange(1, 255) << 8) | rng.randrange(1, 255)
        return _Ident((_OUI_ETH << 40) | (0x0300 << 24) | (mac & 0xFFFFFF), sys_guid, _eui64(mac), 0, mac, ip, qpn)
    # IB: single-port CX-7, so node, system image and port GUID are equal (as ibstat shows on H100s).
    # VF GUIDs are the ones an admin assigns with `ip link set <pf> vf N node_guid/port_guid`.
    guid = (_OUI_IB << 40) | (0x03 << 32 if d.kind == "ib" else 0x04 << 32) | low
    return _Ident(guid, guid, guid, lid, 0, 0, qpn)


# --- writing ---------------------------------------------------------------------------------------


def _kernfs_link(link_dir: str, target: str) -> str:
    """Relative symlink target as kernfs builds it: up to the deepest common ancestor of the link's
    directory and the target's parent, then down. So a `device` link reads ../../../0000:18:00.0, not
    ../.., exactly like on a real /sys."""
    base = link_dir.split("/") if link_dir else []
    tparts = target.split("/")
    common = 0
    for a, b in zip(base, tparts[:-1], strict=False):
        if a != b:
            break
        common += 1
    return "../" * (len(base) - common) + "/".join(tparts[common:])


class _Writer:
    """Creates files and links under one root with plain os calls (cheap enough for 25k files)."""

    def __init__(self, root: Path) -> None:
        self._root = str(root)
        self._dirs: set[str] = set()

    def mkdir(self, rel: str) -> None:
        if rel and rel not in self._dirs:
            os.makedirs(os.path.join(self._root, rel), exist_ok=True)
            while rel and rel not in self._dirs:
                self._dirs.add(rel)
                rel = rel.rpartition("/")[0]

    def raw(self, rel: str, text: str) -> None:
        self.mkdir(rel.rpartition("/")[0])
        with open(os.path.join(self._root, rel), "w", encoding="ascii") as f:
            f.write(text)

    def attrs(self, dir_rel: str, items: Iterable[tuple[str, object]]) -> None:
        self.mkdir(dir_rel)
        for name, value in items:
            with open(os.path.join(self._root, dir_rel, name), "w", encoding="ascii") as f:
                f.write(f"{value}\n")

    def link(self, rel: str, target: str) -> None:
        link_dir = rel.rpartition("/")[0]
        self.mkdir(link_dir)
        os.symlink(_kernfs_link(link_dir, target), os.path.join(self._root, rel))


# --- counter generation ----------------------------------------------------------------------------


@dataclass
class _Traffic:
    """Port counters plus the figures the netdev and ethtool views of the same port must agree with."""

    counters: dict[str, int]
    hw: dict[str, int]
    cnp_sent: int = 0
    cnp_handled: int = 0
    ecn_marked: int = 0


def _port_traffic(d: _Dev, rng: random.Random) -> _Traffic:
    # Busy NCCL ports move ~1e14..3e14 words since boot (the capture shows 2.3e14); a VF carries a slice.
    scale = 1.0 if d.kind != "vf" else rng.uniform(0.02, 0.12)
    xmit = int(rng.uniform(1.0e14, 2.6e14) * scale)
    rcv = int(xmit * rng.uniform(0.97, 1.03))
    # 4 KiB MTU data plus small ACKs/reads: ~2.9 KB per packet on average, as in the capture.
    xmit_pkts = int(xmit * 4 / rng.uniform(2700, 3500))
    rcv_pkts = int(rcv * 4 / rng.uniform(2700, 3500))
    mc_x, mc_r = rng.randrange(2_000, 60_000), rng.randrange(20_000, 400_000)
    c = dict.fromkeys(_IB_COUNTERS, 0)
    c.update(
        port_xmit_data=xmit, port_rcv_data=rcv, port_xmit_packets=xmit_pkts, port_rcv_packets=rcv_pkts,
        multicast_xmit_packets=mc_x, multicast_rcv_packets=mc_r,
        unicast_xmit_packets=xmit_pkts - mc_x, unicast_rcv_packets=rcv_pkts - mc_r,
        port_xmit_wait=int(rng.uniform(4e8, 4e9) * scale),  # credit stalls: normal under all-reduce load
    )  # fmt: skip
    hw = dict.fromkeys(_HW_COUNTERS, 0)
    hw.update(
        # lifespan is in ms but rounded to jiffies: 10 ms reads 12 on an HZ=250 kernel (the capture).
        lifespan=12,
        rx_write_requests=int(rng.uniform(1.5e9, 6e9) * scale),
        rx_read_requests=int(rng.uniform(2e6, 3e7) * scale),
        rx_dct_connect=int(rng.uniform(1e5, 9e5) * scale),
    )
    t = _Traffic(c, hw)
    if d.ethernet:
        hw.update(dict.fromkeys(_HW_COUNTERS_CC, 0))
        # DCQCN at work: the NP sends CNPs for ECN-marked packets (rate-limited, so marked >= sent) and
        # the RP handles the CNPs its peers send. Adaptive retransmission fires now and then.
        t.cnp_sent = int(rng.uniform(1e6, 3e7))
        t.ecn_marked = int(t.cnp_sent * rng.uniform(1.0, 1.6))
        t.cnp_handled = int(rng.uniform(1e6, 3e7))
        hw.update(
            np_cnp_sent=t.cnp_sent, np_ecn_marked_roce_packets=t.ecn_marked, rp_cnp_handled=t.cnp_handled,
            roce_adp_retrans=rng.randrange(0, 200), roce_slow_restart_cnps=rng.randrange(0, 50),
        )  # fmt: skip
    # The link went away under load: downed/recovery/symbol errors, and the QPs were flushed. Drawn for
    # every port so that a fault changes only the fault counters of the device.
    down_c = dict(
        link_downed=rng.randrange(1, 5), link_error_recovery=rng.randrange(0, 3),
        symbol_error=rng.randrange(200, 9000), port_rcv_errors=rng.randrange(10, 500),
        local_link_integrity_errors=rng.randrange(1, 20), port_xmit_discards=rng.randrange(100, 5000),
    )  # fmt: skip
    down_hw = dict(
        local_ack_timeout_err=rng.randrange(10, 400), req_cqe_error=rng.randrange(10, 400),
        req_cqe_flush_error=rng.randrange(1000, 50000), resp_cqe_flush_error=rng.randrange(1000, 50000),
    )  # fmt: skip
    if d.down:
        c.update(down_c)
        hw.update(down_hw)
    return t


def _aer(names: tuple[str, ...], counts: dict[str, int], total: str) -> str:
    lines = [f"{n} {counts.get(n, 0)}" for n in names]
    lines.append(f"{total} {sum(counts.values())}")
    return "\n".join(lines) + "\n"


# --- the tree --------------------------------------------------------------------------------------


def _write_pci(w: _Writer, d: _Dev, rng: random.Random) -> None:
    f = d.func
    hw = _VF if d.kind == "vf" else _BF3 if d.ethernet else _CX7
    attrs: list[tuple[str, object]] = [
        ("vendor", VENDOR_MELLANOX),
        ("device", hw["device"]),
        ("subsystem_vendor", VENDOR_MELLANOX),
        ("subsystem_device", "0x0007" if d.ethernet else "0x0027"),
        ("class", "0x020000" if d.ethernet else "0x020700"),  # Ethernet / InfiniBand controller
        ("revision", "0x00"),
        ("numa_node", d.numa),
    ]
    if d.kind == "vf":
        # A VF's link registers are reserved and read 0: the kernel shows "Unknown" and width 0 (lspci:
        # "Speed unknown (downgraded), Width x0"). A VF has no AER capability, so no aer_dev_* files.
        attrs += [("current_link_speed", "Unknown"), ("max_link_speed", "Unknown")]
        attrs += [("current_link_width", 0), ("max_link_width", 0)]
    else:
        attrs += [
            # Below the card's own switch the function's link is on the chip and always at its best.
            ("current_link_speed", _GEN5 if f.card_switch else d.link_speed),
            ("max_link_speed", _GEN5),
            ("current_link_width", 16),
            ("max_link_width", 16),
            ("sriov_totalvfs", max(16, len(d.vfs))),
            ("sriov_numvfs", len(d.vfs)),
            ("sriov_offset", 1),
            ("sriov_stride", 1),
            ("sriov_vf_device", "101e"),  # printed with %x, no 0x prefix
            ("sriov_drivers_autoprobe", 1),
        ]
    w.attrs(f.path, attrs)
    if d.kind != "vf":
        # A link that trained below its capability usually did so on a marginal channel: receiver and
        # bad-DLLP replays show up as correctable errors on the device.
        cor = {"RxErr": rng.randrange(5, 60), "BadTLP": rng.randrange(1, 8), "BadDLLP": rng.randrange(10, 90)}
        cor["Timeout"] = rng.randrange(0, 4)
        if not d.degraded:
            cor = {}
        w.raw(f"{f.path}/aer_dev_correctable", _aer(_AER_COR, cor, "TOTAL_ERR_COR"))
        w.raw(f"{f.path}/aer_dev_nonfatal", _aer(_AER_UNCOR, {}, "TOTAL_ERR_NONFATAL"))
        w.raw(f"{f.path}/aer_dev_fatal", _aer(_AER_UNCOR, {}, "TOTAL_ERR_FATAL"))
        for n, vf in enumerate(d.vfs):
            w.link(f"{f.path}/virtfn{n}", vf.func.path)
        _write_hwmon(w, d)
    if d.pf is not None:
        w.link(f"{f.path}/physfn", d.pf.func.path)
    w.link(f"{f.path}/driver", "bus/pci/drivers/mlx5_core")
    w.link(f"bus/pci/drivers/mlx5_core/{f.bdf}", f.path)
    w.link(f"bus/pci/devices/{f.bdf}", f.path)


def _write_hwmon(w: _Writer, d: _Dev) -> None:
    """mlx5's hwmon device of a PF (Linux 6.6+; a VF has none): the ASIC sensor and, for the InfiniBand
    HCAs' optical modules, the module's. The BlueField-3's ports use copper (DAC) cables, whose modules
    have no thermal sensor, so the driver registers no module channel for them. Millidegrees in steps of
    125 (the firmware's 0.125 degree unit); thresholds as NVIDIA documents for the ASIC (105 degrees, the
    top of the operating range) and a typical optical module's high alarm (75). hwmon0-2 are the host's
    own (ACPI, CPU packages), so the HCAs' numbers start at 3 in probe order."""
    hwmon = f"hwmon{3 + d.index}"
    rel = f"{d.func.path}/hwmon/{hwmon}"
    channels = [("asic", 52_000 + (d.index * 2_375) % 11_000, 105_000)]
    if not d.ethernet:
        channels.append(("Module0", 41_000 + (d.index * 1_625) % 8_000, 75_000))
    attrs: list[tuple[str, object]] = [("name", "mlx5")]
    for n, (label, temp, crit) in enumerate(channels, start=1):
        attrs += [(f"temp{n}_label", label), (f"temp{n}_input", temp), (f"temp{n}_crit", crit)]
        attrs += [(f"temp{n}_highest", temp + 3_250), (f"temp{n}_reset_history", "")]
    w.attrs(rel, attrs)
    w.link(f"{rel}/device", d.func.path)
    w.link(f"{rel}/subsystem", "class/hwmon")
    w.link(f"class/hwmon/{hwmon}", rel)


def _write_root_port(w: _Writer, d: _Dev, seen: set[str]) -> None:
    f = d.func
    if f.root_port_path in seen:
        return
    seen.add(f.root_port_path)
    # An Intel root port (class 0x0604: PCI bridge) with its end of the device's link: Gen5 x16, or
    # Gen4 x16 for a device in a Gen4 slot, where the link trains at Gen4 without being degraded.
    w.attrs(f.root_port_path, [
        ("vendor", "0x8086"),
        ("device", "0x352a"),
        ("class", "0x060400"),
        ("current_link_speed", d.link_speed),
        ("max_link_speed", _GEN4 if d.gen4_slot else _GEN5),
        ("current_link_width", 16),
        ("max_link_width", 16),
    ])
    # The port's own AER counts: what it saw in the card's transmissions. A marginal channel corrupts
    # both directions, so the port of a degraded link saw receiver errors and bad DLLPs too. A root port
    # also has the totals of the messages it received from below (aer_rootport_total_err_*).
    cor = {"RxErr": 7 + d.index, "BadDLLP": 3} if d.degraded else {}
    w.raw(f"{f.root_port_path}/aer_dev_correctable", _aer(_AER_COR, cor, "TOTAL_ERR_COR"))
    w.raw(f"{f.root_port_path}/aer_dev_nonfatal", _aer(_AER_UNCOR, {}, "TOTAL_ERR_NONFATAL"))
    w.raw(f"{f.root_port_path}/aer_dev_fatal", _aer(_AER_UNCOR, {}, "TOTAL_ERR_FATAL"))
    for kind, count in (("cor", sum(cor.values())), ("fatal", 0), ("nonfatal", 0)):
        w.raw(f"{f.root_port_path}/aer_rootport_total_err_{kind}", f"{count}\n")
    # The card's own switch: its upstream port has the card's end of the slot link, its downstream port
    # the on-chip link to the functions.
    upstream = f.root_port_path
    for n, port in enumerate(f.switch_ports):
        upstream = f"{upstream}/{port}"
        w.attrs(upstream, [
            ("vendor", VENDOR_MELLANOX),
            ("device", "0x197b"),
            ("class", "0x060400"),
            ("current_link_speed", d.link_speed if n == 0 else _GEN5),
            ("max_link_speed", _GEN5),
            ("current_link_width", 16),
            ("max_link_width", 16),
        ])


def _write_rdma(w: _Writer, d: _Dev, ident: _Ident, traffic: _Traffic, sm_lid: int, hostname: str) -> None:
    hw = _VF if d.kind == "vf" else _BF3 if d.ethernet else _CX7
    dev_path = f"{d.func.path}/infiniband/{d.name}"
    w.attrs(
        dev_path,
        [
            ("node_type", "1: CA"),
            ("node_guid", _guid(ident.node_guid)),
            ("sys_image_guid", _guid(ident.sys_image_guid)),
            ("node_desc", f"{hostname} {d.name}"),  # rdma-ndd's default "%h %d"
            ("fw_ver", hw["fw_ver"]),
            ("hca_type", hw["hca_type"]),
            ("hw_rev", "0x0"),
            ("board_id", hw["board_id"]),
        ],
    )
    w.link(f"{dev_path}/device", d.func.path)
    w.link(f"class/infiniband/{d.name}", dev_path)
    # ib_uverbs' character device, under the same parent; abi_version is mlx5's user ABI.
    verbs = f"{d.func.path}/infiniband_verbs/uverbs{d.index}"
    w.attrs(verbs, [("ibdev", d.name), ("abi_version", 1)])
    w.link(f"class/infiniband_verbs/uverbs{d.index}", verbs)

    port = f"{dev_path}/ports/1"
    if d.down:
        state, phys = "1: DOWN", "3: Disabled"
    else:
        state, phys = "4: ACTIVE", "5: LinkUp"
    rate = _RATE_DOWN if d.down else _RATE_ROCE if d.ethernet else _RATE_IB
    w.attrs(
        port,
        [
            ("state", state),
            ("phys_state", phys),
            ("rate", rate),
            ("link_layer", "Ethernet" if d.ethernet else "InfiniBand"),
            ("lid", f"0x{ident.lid:x}"),
            ("sm_lid", "0x0" if d.ethernet or d.down else f"0x{sm_lid:x}"),
            ("lid_mask_count", 0),
            ("sm_sl", 0),
            ("cap_mask", _CAP_MASK_ROCE if d.ethernet else _CAP_MASK_IB),
        ],
    )
    w.attrs(f"{port}/counters", traffic.counters.items())
    w.attrs(f"{port}/hw_counters", sorted(traffic.hw.items()))

    # GID table. On a real kernel, reading gid_attrs/{types,ndevs}/N of an unpopulated (all-zero) entry
    # fails with EINVAL; a file cannot do that, so those attribute files are simply left out here.
    if d.ethernet:
        # Default link-local GIDs first (v1 then v2), then the IPv4-mapped GIDs of the netdev address.
        v4 = (0xFFFF << 32) | ident.ipv4
        populated = [(_LINK_LOCAL, ident.port_guid, "IB/RoCE v1"), (_LINK_LOCAL, ident.port_guid, "RoCE v2")]
        populated += [(0, v4, "IB/RoCE v1"), (0, v4, "RoCE v2")]
    else:
        populated = [(_LINK_LOCAL, ident.port_guid, "IB/RoCE v1")]
    gids: list[tuple[str, object]] = []
    for i in range(GID_TABLE_LEN):
        gids.append((str(i), _gid(*populated[i][:2]) if i < len(populated) else _gid(0, 0)))
    w.attrs(f"{port}/gids", gids)
    w.attrs(f"{port}/gid_attrs/types", [(str(i), g[2]) for i, g in enumerate(populated)])
    if d.ethernet:
        w.attrs(f"{port}/gid_attrs/ndevs", [(str(i), d.netdev) for i in range(len(populated))])
    else:
        # IB GIDs have no netdev: the kernel returns EINVAL for every ndevs/N of an IB port, so the
        # directory is empty. The IPoIB netdev is found under device/net instead.
        w.mkdir(f"{port}/gid_attrs/ndevs")
    # mlx5 RoCE ports have a one-entry P_Key table; IB ports hold the default full-membership key first.
    pkeys = 1 if d.ethernet else PKEY_TABLE_LEN
    w.attrs(f"{port}/pkeys", [(str(i), "0xffff" if i == 0 else "0x0000") for i in range(pkeys)])


def _netdev_common(
    d: _Dev,
    *,
    mtu: int,
    type_: int,
    addr_len: int,
    address: str,
    broadcast: str,
    speed: int,
    duplex: str,
    flaps: int,
) -> list[tuple[str, object]]:
    # A netdev registers with carrier on and the driver turns it off until the link trains, so an up
    # link has equal up/down counts and a down one has one more down than up.
    up, down = (1 + flaps, 1 + flaps) if not d.down else (1 + flaps, 2 + flaps)
    return [
        ("addr_assign_type", 0),
        ("addr_len", addr_len),
        ("address", address),
        ("broadcast", broadcast),
        ("carrier", 0 if d.down else 1),
        ("carrier_changes", up + down),
        ("carrier_down_count", down),
        ("carrier_up_count", up),
        ("dev_id", "0x0"),
        ("dev_port", 0),
        ("dormant", 0),
        ("duplex", duplex),
        ("flags", "0x1003"),  # IFF_UP | IFF_BROADCAST | IFF_MULTICAST
        ("ifindex", d.ifindex),
        ("iflink", d.ifindex),
        ("link_mode", 0),
        ("mtu", mtu),
        ("name_assign_type", 4),  # NET_NAME_RENAMED: udev gave it its predictable name
        ("netdev_group", 0),
        ("operstate", "down" if d.down else "up"),
        ("proto_down", 0),
        ("speed", speed),
        ("testing", 0),
        ("tx_queue_len", 1000 if d.ethernet else 256),  # IPoIB: 2 x the 128-entry send queue
        ("type", type_),
    ]


def _write_netdev(
    w: _Writer, d: _Dev, attrs: list[tuple[str, object]], stats: dict[str, int], extra: dict[str, object]
) -> str:
    path = f"{d.func.path}/net/{d.netdev}"
    w.attrs(path, [*attrs, *extra.items()])
    w.raw(f"{path}/ifalias", "")  # no alias set: the kernel returns zero bytes, not even a newline
    w.attrs(f"{path}/statistics", [(n, stats.get(n, 0)) for n in _NET_STATS])
    w.link(f"{path}/device", d.func.path)
    w.link(f"class/net/{d.netdev}", path)
    return path


def _write_ipoib(w: _Writer, d: _Dev, ident: _Ident, rng: random.Random) -> None:
    # 20-byte IPoIB hardware address: flags + 24-bit QPN, then the port's GID 0.
    hw = ident.qpn.to_bytes(4, "big") + _LINK_LOCAL.to_bytes(8, "big") + ident.port_guid.to_bytes(8, "big")
    # IPoIB carries only kernel TCP/IP (NCCL uses verbs), so these stay small next to the port counters.
    rx_p, tx_p = rng.randrange(1_000_000, 60_000_000), rng.randrange(1_000_000, 60_000_000)
    stats = {
        "rx_packets": rx_p, "rx_bytes": rx_p * rng.randrange(200, 1400),
        "tx_packets": tx_p, "tx_bytes": tx_p * rng.randrange(200, 1400),
        "multicast": rng.randrange(10_000, 200_000),
    }  # fmt: skip
    attrs = _netdev_common(
        d, mtu=4092, type_=32, addr_len=20, address=":".join(f"{b:02x}" for b in hw),
        broadcast="00:ff:ff:ff:ff:12:40:1b:ff:ff:00:00:00:00:00:00:ff:ff:ff:ff",
        speed=_SPEED_MBPS_DOWN_IB if d.down else _SPEED_MBPS_IB, duplex="full", flaps=rng.randrange(0, 2),
    )  # fmt: skip
    _write_netdev(w, d, attrs, stats, {"pkey": "0xffff", "mode": "datagram", "umcast": 0})


def _ethtool(d: _Dev, t: _Traffic, rng: random.Random) -> tuple[list[tuple[str, int]], dict[str, int]]:
    """`ethtool -S` of an mlx5 uplink, in the driver's group order, plus the matching netdev stats.

    Unlike the fixtures (the poster dropped zero lines) every counter is listed, as ethtool does. Pause
    counters appear only for priorities with PFC enabled, as mlx5 reports them: here priority 3.
    """
    c = t.counters
    rdma_rx_b, rdma_tx_b = c["port_rcv_data"] * 4, c["port_xmit_data"] * 4
    rdma_rx_p, rdma_tx_p = c["unicast_rcv_packets"], c["unicast_xmit_packets"]
    # Kernel TCP/IP over the uplink: the only traffic the netdev's own (software) counters see.
    sw_rx_p, sw_tx_p = rng.randrange(5_000_000, 80_000_000), rng.randrange(5_000_000, 80_000_000)
    sw_rx_b, sw_tx_b = sw_rx_p * rng.randrange(180, 1400), sw_tx_p * rng.randrange(180, 1400)
    mc_rx, bc_rx = rng.randrange(10_000, 300_000), rng.randrange(1_000, 50_000)
    mc_tx, bc_tx = rng.randrange(1_000, 30_000), rng.randrange(100, 5_000)
    rx_pause, tx_pause = rng.randrange(10_000, 2_000_000), rng.randrange(1_000, 200_000)
    rx_pause_us, tx_pause_us = int(rx_pause * rng.uniform(2, 20)), int(tx_pause * rng.uniform(2, 20))
    corrected = int(rng.uniform(1e7, 5e9))  # FEC corrects bits all the time on 100G PAM4 lanes
    lane0 = int(corrected * rng.uniform(0.4, 0.6))
    marked = rng.randrange(0, 5000)
    ch_split = rng.uniform(0.4, 0.6)
    cnp_rx = t.cnp_handled
    # Fault values are drawn for every port, and used only by a faulty one, so that a fault changes
    # nothing else. A lost link leaves link-down events and symbol/PCS/CRC errors; a host that cannot
    # drain the NIC over a slow PCIe link shows signal-integrity events, stalls, and packets dropped for
    # lack of receive buffers.
    link_fault = {"down_events": rng.randrange(1, 6), "symbol": rng.randrange(100, 5000)}
    link_fault |= {"pcs": rng.randrange(1000, 90000), "crc": rng.randrange(10, 900)}
    pci_fault = {"pci_rx": rng.randrange(20, 800), "pci_tx": rng.randrange(5, 200)}
    pci_fault |= {"stall_rd": rng.randrange(10, 500), "stall_wr": rng.randrange(10, 500)}
    pci_fault |= {"oob": rng.randrange(10_000, 1_000_000), "discards": rng.randrange(1_000, 100_000)}
    fault = dict.fromkeys([*link_fault, *pci_fault], 0)
    if d.down:
        fault |= link_fault
    if d.degraded:
        fault |= pci_fault

    prio_rx_b = {0: sw_rx_b, _ROCE_PRIO: rdma_rx_b, _CNP_PRIO: cnp_rx * _CNP_FRAME_BYTES}
    prio_rx_p = {0: sw_rx_p + mc_rx + bc_rx, _ROCE_PRIO: rdma_rx_p, _CNP_PRIO: cnp_rx}
    prio_tx_b = {0: sw_tx_b, _ROCE_PRIO: rdma_tx_b, _CNP_PRIO: t.cnp_sent * _CNP_FRAME_BYTES}
    prio_tx_p = {0: sw_tx_p + mc_tx + bc_tx, _ROCE_PRIO: rdma_tx_p, _CNP_PRIO: t.cnp_sent}
    rx_p_phy = sum(prio_rx_p.values()) + rx_pause + fault["discards"]
    tx_p_phy = sum(prio_tx_p.values()) + tx_pause
    rx_b_phy = sum(prio_rx_b.values()) + 64 * rx_pause + 4 * rx_p_phy  # + FCS
    tx_b_phy = sum(prio_tx_b.values()) + 64 * tx_pause + 4 * tx_p_phy
    ch0_rx, ch0_tx = int(sw_rx_p * ch_split), int(sw_tx_p * ch_split)
    ch0_rxb, ch0_txb = int(sw_rx_b * ch_split), int(sw_tx_b * ch_split)

    s: list[tuple[str, int]] = [
        ("rx_packets", sw_rx_p), ("rx_bytes", sw_rx_b), ("tx_packets", sw_tx_p), ("tx_bytes", sw_tx_b),
        ("rx_csum_unnecessary", sw_rx_p - mc_rx), ("rx_csum_none", mc_rx), ("rx_ecn_mark", 0),
        ("tx_tso_packets", sw_tx_p // 20), ("tx_csum_partial", sw_tx_p), ("tx_queue_stopped", 0),
        ("tx_queue_dropped", 0), ("tx_queue_wake", 0), ("tx_cqe_err", 0), ("rx_wqe_err", 0),
        ("rx_buff_alloc_err", 0), ("ch_events", sw_rx_p // 40), ("ch_poll", sw_rx_p // 30),
        ("rx_out_of_buffer", fault["oob"]), ("rx_if_down_packets", 0), ("rx_steer_missed_packets", 0),
        ("rx_vport_unicast_packets", sw_rx_p), ("rx_vport_unicast_bytes", sw_rx_b),
        ("tx_vport_unicast_packets", sw_tx_p), ("tx_vport_unicast_bytes", sw_tx_b),
        ("rx_vport_multicast_packets", mc_rx), ("rx_vport_multicast_bytes", mc_rx * 90),
        ("tx_vport_multicast_packets", mc_tx), ("tx_vport_multicast_bytes", mc_tx * 90),
        ("rx_vport_broadcast_packets", bc_rx), ("rx_vport_broadcast_bytes", bc_rx * 64),
        ("tx_vport_broadcast_packets", bc_tx), ("tx_vport_broadcast_bytes", bc_tx * 64),
        ("rx_vport_rdma_unicast_packets", rdma_rx_p), ("rx_vport_rdma_unicast_bytes", rdma_rx_b),
        ("tx_vport_rdma_unicast_packets", rdma_tx_p), ("tx_vport_rdma_unicast_bytes", rdma_tx_b),
        ("rx_vport_rdma_multicast_packets", 0), ("rx_vport_rdma_multicast_bytes", 0),
        ("tx_vport_rdma_multicast_packets", 0), ("tx_vport_rdma_multicast_bytes", 0),
        ("tx_packets_phy", tx_p_phy), ("rx_packets_phy", rx_p_phy), ("rx_crc_errors_phy", fault["crc"]),
        ("tx_bytes_phy", tx_b_phy), ("rx_bytes_phy", rx_b_phy), ("tx_multicast_phy", mc_tx),
        ("tx_broadcast_phy", bc_tx), ("rx_multicast_phy", mc_rx), ("rx_broadcast_phy", bc_rx),
        ("rx_in_range_len_errors_phy", 0), ("rx_out_of_range_len_phy", 0), ("rx_oversize_pkts_phy", 0),
        ("rx_symbol_err_phy", fault["symbol"]), ("tx_mac_control_phy", tx_pause),
        ("rx_mac_control_phy", rx_pause), ("rx_unsupported_op_phy", 0), ("rx_pause_ctrl_phy", rx_pause),
        ("tx_pause_ctrl_phy", tx_pause), ("rx_discards_phy", fault["discards"]), ("tx_discards_phy", 0),
        ("tx_errors_phy", 0), ("rx_undersize_pkts_phy", 0), ("rx_fragments_phy", 0), ("rx_jabbers_phy", 0),
        ("rx_64_bytes_phy", rx_pause + cnp_rx), ("rx_65_to_127_bytes_phy", rdma_rx_p // 6),
        ("rx_128_to_255_bytes_phy", mc_rx), ("rx_256_to_511_bytes_phy", bc_rx),
        ("rx_512_to_1023_bytes_phy", sw_rx_p // 3), ("rx_1024_to_1518_bytes_phy", sw_rx_p - sw_rx_p // 3),
        ("rx_1519_to_2047_bytes_phy", 0), ("rx_2048_to_4095_bytes_phy", 0),
        ("rx_4096_to_8191_bytes_phy", rdma_rx_p - rdma_rx_p // 6), ("rx_8192_to_10239_bytes_phy", 0),
        ("link_down_events_phy", fault["down_events"]), ("rx_pcs_symbol_err_phy", fault["pcs"]),
        # rx_bits_phy: kernels with the 2026 mlx5 patch that exposes it (mainline before has none).
        ("rx_corrected_bits_phy", corrected), ("rx_bits_phy", rx_b_phy * 8 + 160 * rx_p_phy),
        # 200GbE runs on two lanes; the unused lanes 2 and 3 count nothing.
        ("rx_err_lane_0_phy", lane0), ("rx_err_lane_1_phy", corrected - lane0),
        ("rx_err_lane_2_phy", 0), ("rx_err_lane_3_phy", 0),
        ("rx_buffer_passed_thres_phy", rng.randrange(0, 20000)),
        ("rx_pci_signal_integrity", fault["pci_rx"]), ("tx_pci_signal_integrity", fault["pci_tx"]),
        ("outbound_pci_buffer_overflow", 0),
        # stalled_rd/wr are the percentage of the last second spent stalled; *_events count bad seconds.
        ("outbound_pci_stalled_rd", 0), ("outbound_pci_stalled_wr", 0),
        ("outbound_pci_stalled_rd_events", fault["stall_rd"]),
        ("outbound_pci_stalled_wr_events", fault["stall_wr"]),
    ]  # fmt: skip
    for p in range(8):
        s += [
            (f"rx_prio{p}_bytes", prio_rx_b.get(p, 0)), (f"rx_prio{p}_packets", prio_rx_p.get(p, 0)),
            (f"rx_prio{p}_discards", fault["discards"] if p == _ROCE_PRIO else 0),
            (f"tx_prio{p}_bytes", prio_tx_b.get(p, 0)), (f"tx_prio{p}_packets", prio_tx_p.get(p, 0)),
        ]  # fmt: skip
    s += [
        (f"rx_prio{_ROCE_PRIO}_pause", rx_pause), (f"rx_prio{_ROCE_PRIO}_pause_duration", rx_pause_us),
        (f"tx_prio{_ROCE_PRIO}_pause", tx_pause), (f"tx_prio{_ROCE_PRIO}_pause_duration", tx_pause_us),
        (f"rx_prio{_ROCE_PRIO}_pause_transition", rx_pause // 2),
        ("tx_pause_storm_warning_events", 0), ("tx_pause_storm_error_events", 0),
    ]  # fmt: skip
    # Per-host buffer drops: a multi-host NIC's counter (the driver lists it where the NIC has the
    # SBCAM register); on this single-host port the buffer drops are rx_prioN_discards above.
    for p in range(8):
        s += [
            (f"rx_prio{p}_buf_discard", 0),
            (f"rx_prio{p}_cong_discard", 0),
            (f"rx_prio{p}_marked", marked if p == _ROCE_PRIO else 0),
        ]
    s += [("module_unplug", 0), ("module_bus_stuck", 0), ("module_high_temp", 0), ("module_bad_shorted", 0)]
    for ch, rx_p in enumerate((ch0_rx, sw_rx_p - ch0_rx)):
        s += [
            (f"ch{ch}_events", rx_p // 40), (f"ch{ch}_poll", rx_p // 30), (f"ch{ch}_arm", rx_p // 41),
            (f"ch{ch}_aff_change", 0), (f"ch{ch}_force_irq", 0), (f"ch{ch}_eq_rearm", 0),
        ]  # fmt: skip
    for ch, (rx_p, rx_b) in enumerate(((ch0_rx, ch0_rxb), (sw_rx_p - ch0_rx, sw_rx_b - ch0_rxb))):
        s += [
            (f"rx{ch}_packets", rx_p), (f"rx{ch}_bytes", rx_b), (f"rx{ch}_csum_complete", 0),
            (f"rx{ch}_csum_unnecessary", rx_p), (f"rx{ch}_csum_none", 0), (f"rx{ch}_xdp_drop", 0),
            (f"rx{ch}_lro_packets", 0), (f"rx{ch}_lro_bytes", 0), (f"rx{ch}_ecn_mark", 0),
            (f"rx{ch}_removed_vlan_packets", 0), (f"rx{ch}_wqe_err", 0), (f"rx{ch}_buff_alloc_err", 0),
            (f"rx{ch}_cqe_compress_blks", 0), (f"rx{ch}_cqe_compress_pkts", 0), (f"rx{ch}_congst_umr", 0),
            (f"rx{ch}_arfs_err", 0), (f"rx{ch}_recover", 0),
        ]  # fmt: skip
    for ch, (tx_p, tx_b) in enumerate(((ch0_tx, ch0_txb), (sw_tx_p - ch0_tx, sw_tx_b - ch0_txb))):
        s += [
            (f"tx{ch}_packets", tx_p), (f"tx{ch}_bytes", tx_b), (f"tx{ch}_tso_packets", tx_p // 20),
            (f"tx{ch}_csum_partial", tx_p), (f"tx{ch}_stopped", 0), (f"tx{ch}_dropped", 0),
            (f"tx{ch}_xmit_more", tx_p // 9), (f"tx{ch}_recover", 0), (f"tx{ch}_cqes", tx_p // 2),
            (f"tx{ch}_wake", 0), (f"tx{ch}_cqe_err", 0),
        ]  # fmt: skip
    # mlx5e's ndo_get_stats64: software counters for traffic, firmware counters for drops and errors.
    stats = {
        "rx_packets": sw_rx_p, "rx_bytes": sw_rx_b, "tx_packets": sw_tx_p, "tx_bytes": sw_tx_b,
        "multicast": mc_rx, "rx_dropped": fault["oob"], "rx_crc_errors": fault["crc"],
        "rx_errors": fault["crc"], "rx_missed_errors": fault["discards"],
    }  # fmt: skip
    return s, stats


def _write_roce_netdev(w: _Writer, d: _Dev, ident: _Ident, t: _Traffic, rng: random.Random) -> str:
    lines, stats = _ethtool(d, t, rng)
    attrs = _netdev_common(
        d, mtu=9000, type_=1, addr_len=6, address=_mac(ident.mac), broadcast="ff:ff:ff:ff:ff:ff",
        speed=-1 if d.down else _SPEED_MBPS_ROCE,  # SPEED_UNKNOWN without link
        duplex="unknown" if d.down else "full", flaps=rng.randrange(0, 2),
    )  # fmt: skip
    path = _write_netdev(w, d, attrs, stats, {"phys_port_name": f"p{d.func.devfn}"})
    ecn = f"{path}/ecn"
    for point, knobs in (("roce_np", _ECN_NP), ("roce_rp", _ECN_RP)):
        w.attrs(f"{ecn}/{point}", knobs.items())
        w.attrs(f"{ecn}/{point}/enable", [(str(p), int(p == _ROCE_PRIO)) for p in range(8)])
    return "NIC statistics:\n" + "".join(f"     {name}: {value}\n" for name, value in lines)


def _write_loopback(w: _Writer) -> None:
    # A real class/net always has lo, a virtual device with no PCI parent: readers must skip it.
    path = "devices/virtual/net/lo"
    w.attrs(
        path,
        [
            ("addr_len", 6), ("address", "00:00:00:00:00:00"), ("carrier", 1), ("flags", "0x9"),
            ("ifindex", 1), ("iflink", 1), ("mtu", 65536), ("operstate", "unknown"), ("type", 772),
        ],
    )  # fmt: skip
    w.attrs(f"{path}/statistics", [(n, 0) for n in _NET_STATS])
    w.link("class/net/lo", path)


def build_tree(dest: Path, spec: TreeSpec = SAMPLE_SPEC) -> Path:
    """Write ``dest/sys/...`` and ``dest/ethtool/<netdev>`` for ``spec`` and return ``dest/sys``.

    Everything, symlink targets included, stays inside ``dest``. Refuses to write over an existing
    tree, because leftovers from another spec would make the result differ from a fresh build.
    """
    devs = _plan(spec)
    dest = Path(dest)
    sys_root, ethtool_dir = dest / "sys", dest / "ethtool"
    for p in (sys_root, ethtool_dir):
        if p.exists():
            raise FileExistsError(f"{p} already exists")
    w = _Writer(sys_root)
    # The directories a reader may list even when they turn out empty.
    for rel in ("class/infiniband", "class/net", "bus/pci/drivers/mlx5_core", "bus/pci/devices"):
        w.mkdir(rel)
    w.raw("class/infiniband_verbs/abi_version", "6\n")  # the uverbs ABI of the kernel, not of a device
    _write_loopback(w)
    sm_lid = random.Random(spec.seed).randrange(0x1, 0x200)  # one subnet manager for the whole fabric
    roce_macs: dict[tuple[int, int], int] = {}
    root_ports: set[str] = set()
    ethtool: dict[str, str] = {}
    for d in devs:
        rng = random.Random(spec.seed + d.index)
        ident = _identity(d, rng, roce_macs)
        traffic = _port_traffic(d, rng)
        _write_root_port(w, d, root_ports)
        _write_pci(w, d, rng)
        _write_rdma(w, d, ident, traffic, sm_lid, spec.hostname)
        if d.ethernet:
            ethtool[d.netdev] = _write_roce_netdev(w, d, ident, traffic, rng)
        else:
            _write_ipoib(w, d, ident, rng)
    if ethtool:
        ethtool_dir.mkdir(parents=True)
        for name, text in ethtool.items():
            (ethtool_dir / name).write_text(text, encoding="ascii")
    return sys_root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rdma_exporter.sample_tree",
        description="Write a deterministic sample sysfs tree of a GPU-cluster RDMA node to DEST/sys "
        "(and `ethtool -S` captures to DEST/ethtool).",
    )
    parser.add_argument("dest", type=Path, metavar="DEST")
    parser.add_argument("--devices", type=int, metavar="N", help="exactly N RDMA devices (see spec_for_devices)")
    parser.add_argument("--healthy", action="store_true", help="no degraded PCIe link, no down port")
    parser.add_argument("--seed", type=int, default=SAMPLE_SPEC.seed, help="counter and identity seed")
    args = parser.parse_args(argv)
    try:
        # Inside the try: spec_for_devices refuses --devices 0 with a ValueError the user must see as
        # a one-line error, not a traceback.
        spec = SAMPLE_SPEC if args.devices is None else spec_for_devices(args.devices)
        spec = dataclasses.replace(spec, seed=args.seed)
        if args.healthy:
            spec = dataclasses.replace(spec, degraded_pcie=(), down_ports=())
        sys_root = build_tree(args.dest, spec)
    except (FileExistsError, ValueError) as exc:
        print(f"sample_tree: {exc}", file=sys.stderr)
        return 1
    print(sys_root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
