"""netdev parsing on the copied procfs eth0 capture and on small trees in the real sysfs layout."""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdma_exporter.collect.base import FamilySet
from rdma_exporter.collect.netdev import expose_netdev
from rdma_exporter.parse import reader as reader_module
from rdma_exporter.parse.infiniband import read_device_info
from rdma_exporter.parse.netdev import (
    NetdevIdentity,
    card_bond_slaves,
    parse_speed,
    rdma_port_netdevs,
    read_netdev,
    read_netdev_identity,
    read_netdev_state,
    valid_ifname,
)
from rdma_exporter.parse.reader import REASON_MALFORMED, REASON_MISSING, ReadErrors, SysfsReader

from conftest import RefusingReads, symlink, write_files

FIXTURES = Path(__file__).parent / "fixtures" / "sysfs"
PROCFS_SYS = FIXTURES / "prometheus-procfs" / "sys"
GPUD_SYS = FIXTURES / "leptonai-gpud-h100" / "sys"


def reasons(reader: SysfsReader) -> dict[str, int]:
    out: dict[str, int] = {}
    for (_, reason), count in reader.errors.counts.items():
        out[reason] = out.get(reason, 0) + count
    return out


def test_procfs_eth0_capture() -> None:
    reader = SysfsReader("eth0")
    dev = read_netdev(PROCFS_SYS, "eth0", reader)
    assert dev is not None
    assert reader.errors.total() == 0
    assert (dev.ifindex, dev.type, dev.mtu, dev.address) == (2, 1, 1500, "01:01:01:01:01:01")
    assert (dev.operstate, dev.carrier) == ("up", True)
    assert dev.admin_up is True  # flags 0x1303
    assert (dev.carrier_changes, dev.carrier_up_count, dev.carrier_down_count) == (2, 1, 1)
    assert dev.speed_bps == 1_000_000_000
    assert dev.statistics == {}  # the capture has no statistics/ directory
    assert (dev.is_bond_master, dev.bond_slaves, dev.master) == (False, (), None)
    # MLNX_OFED per-priority ECN switches, as captured: np has 2 and 5 off, rp has 2, 5 and 7 off.
    assert len(dev.ecn) == 16
    assert [p for p in range(8) if dev.ecn[("np", p)]] == [0, 1, 3, 4, 6, 7]
    assert [p for p in range(8) if dev.ecn[("rp", p)]] == [0, 1, 3, 4, 6]


def test_missing_netdev_is_none_not_an_error(tmp_path: Path) -> None:
    reader = SysfsReader("x")
    assert read_netdev(PROCFS_SYS, "eth1", reader) is None
    assert read_netdev(PROCFS_SYS, "../net", reader) is None
    # "." and ".." are directories under class/net, but no netdev can have those names.
    assert read_netdev(PROCFS_SYS, ".", reader) is None
    assert read_netdev(PROCFS_SYS, "..", reader) is None
    assert read_netdev(tmp_path, "eth0", reader) is None
    # The empty name joins to class/net itself, a directory; neither half of the read may take it.
    assert read_netdev(PROCFS_SYS, "", reader) is None
    # The static half alone: a GID table can name a netdev of another namespace (net1), which must not
    # leave an empty identity in the device's cached info (it would shadow the netdev once it moves here).
    assert read_netdev_identity(PROCFS_SYS, "net1", reader) is None
    assert read_netdev_identity(PROCFS_SYS, "", reader) is None
    assert reader.errors.total() == 0


def test_netdev_unregistered_after_its_identity_was_read_is_none(tmp_path: Path) -> None:
    # The identity is cached at startup; `ip link del` (or a driver unbind) removes class/net/<name>
    # before the uevent is handled. The next scrape's state read must say "gone", not a netdev of Nones.
    write_files(tmp_path, {"devices/virtual/net/veth0/operstate": "up\n", "devices/virtual/net/veth0/mtu": "1500\n"})
    symlink(tmp_path, "class/net/veth0", "devices/virtual/net/veth0")
    reader = SysfsReader("rxe0")
    identity = read_netdev_identity(tmp_path, "veth0", reader)
    assert identity is not None
    state = read_netdev_state(tmp_path, identity, reader)
    assert state is not None and (state.operstate, state.mtu) == ("up", 1500)
    (tmp_path / "class/net/veth0").unlink()
    assert read_netdev_state(tmp_path, identity, reader) is None
    assert reader.errors.total() == 0


def test_sparse_tree_gives_nones_without_errors(tmp_path: Path) -> None:
    write_files(tmp_path, {"class/net/eth5/operstate": "unknown\n"})
    reader = SysfsReader("eth5")
    dev = read_netdev(tmp_path, "eth5", reader)
    assert dev is not None
    assert dev.operstate == "unknown"
    assert None is dev.carrier is dev.speed_bps is dev.mtu is dev.carrier_up_count is dev.address
    assert (dev.statistics, dev.ecn, dev.bond_slaves) == ({}, {}, ())
    assert reader.errors.total() == 0


def test_link_down_and_garbage(tmp_path: Path) -> None:
    write_files(
        tmp_path,
        {
            "class/net/ens1f0np0/operstate": "down\n",
            "class/net/ens1f0np0/carrier": "0\n",
            "class/net/ens1f0np0/speed": "-1\n",  # SPEED_UNKNOWN while the link is down
            "class/net/ens1f0np0/duplex": "unknown\n",
            "class/net/ens1f0np0/mtu": "9000\n",
            "class/net/ens1f0np0/statistics/rx_bytes": "123\n",
            "class/net/ens1f0np0/statistics/rx_crc_errors": "7\n",
            "class/net/ens1f0np0/statistics/tx_dropped": "Invalid argument\n",
            "class/net/ens1f1np1/carrier": "yes\n",
            "class/net/ens1f1np1/speed": "fast\n",
            "class/net/ens1f1np1/mtu": "-5\n",
            "class/net/ens1f1np1/carrier_changes": "\n",
            "class/net/old0/speed": "4294967295\n",  # SPEED_UNKNOWN printed with %u by old kernels
            "class/net/old0/carrier": "1\n",
        },
    )
    reader = SysfsReader("ens1f0np0")
    down = read_netdev(tmp_path, "ens1f0np0", reader)
    assert down is not None
    assert (down.operstate, down.carrier, down.speed_bps, down.mtu) == ("down", False, None, 9000)
    assert down.statistics == {"rx_bytes": 123, "rx_crc_errors": 7}
    assert reasons(reader) == {REASON_MALFORMED: 1}  # only the garbage statistics file

    reader = SysfsReader("ens1f1np1")
    bad = read_netdev(tmp_path, "ens1f1np1", reader)
    assert bad is not None
    assert None is bad.carrier is bad.speed_bps is bad.mtu is bad.carrier_changes
    assert reasons(reader) == {REASON_MALFORMED: 4}

    reader = SysfsReader("old0")
    old = read_netdev(tmp_path, "old0", reader)
    assert old is not None and old.speed_bps is None and old.carrier is True
    assert reader.errors.total() == 0


@pytest.mark.parametrize(
    "text",
    # int() takes signs, underscores and other scripts' digits ("\u0663" is 3); the kernel prints none of
    # them, nor a number above a u32, nor a negative but SPEED_UNKNOWN's -1: garbage, counted, not a speed
    # of 5 or 1000 Mb/s. 5,000 digits: int() itself refuses them with a ValueError (found by review).
    ["+5\n", "1_000\n", "\u0663\n", "99999999999999999999\n", "4294967296\n", "-2\n", "1" * 5000 + "\n"],
)
def test_a_speed_the_kernel_cannot_print_is_malformed(tmp_path: Path, text: str) -> None:
    write_files(tmp_path, {"class/net/ens1f0np0/speed": text, "class/net/ens1f0np0/carrier": "1\n"})
    reader = SysfsReader("ens1f0np0")
    dev = read_netdev(tmp_path, "ens1f0np0", reader)
    assert dev is not None and dev.speed_bps is None
    assert reasons(reader) == {REASON_MALFORMED: 1}


@pytest.mark.parametrize(
    ("text", "admin_up", "malformed"),
    # "%#x" prints 0 without its prefix. Anything else the kernel cannot print is counted, and tells
    # nothing: read as "not up" it would hide the difference between a lost link and one set down.
    [("0x1003\n", True, 0), ("0x1002\n", False, 0), ("0\n", False, 0), ("0x9\n", True, 0), (None, None, 0),
     ("4099\n", None, 1), ("0x\n", None, 1), ("0X1003\n", None, 1), ("up\n", None, 1), ("0x1_003\n", None, 1),
     ("0x0\n", None, 1), ("0x01003\n", None, 1),
     ("0x1" + "0" * 40 + "\n", None, 1)],
)  # fmt: skip
def test_admin_state_from_flags(tmp_path: Path, text: str | None, admin_up: bool | None, malformed: int) -> None:
    write_files(tmp_path, {"class/net/ens1f0np0/operstate": "down\n"})
    if text is not None:
        write_files(tmp_path, {"class/net/ens1f0np0/flags": text})
    reader = SysfsReader("ens1f0np0")
    dev = read_netdev(tmp_path, "ens1f0np0", reader)
    assert dev is not None and dev.admin_up is admin_up
    assert reasons(reader) == ({REASON_MALFORMED: 1} if malformed else {})


@pytest.mark.parametrize(
    ("text", "bps"),
    [("100000", 100_000_000_000), ("400000\n", 400_000_000_000), ("25000", 25 * 10**9), ("-1", None), ("0", None),
     ("4294967295", None), ("", None), ("1e3", None), ("Unknown!", None), ("+5", None), ("1_000", None),
     ("\u0663", None), ("99999999999999999999", None)],
)  # fmt: skip
def test_parse_speed(text: str, bps: int | None) -> None:
    assert parse_speed(text) == bps


@given(st.text(max_size=30))
def test_parse_speed_never_raises(text: str) -> None:
    bps = parse_speed(text)
    assert bps is None or (bps > 0 and bps % 1_000_000 == 0)


def test_ecn_tree_priority_3(tmp_path: Path) -> None:
    files = {f"class/net/eth2/ecn/roce_{role}/enable/{p}": ("1\n" if p == 3 else "0\n") for role in ("np", "rp")
             for p in range(8)}  # fmt: skip
    files["class/net/eth2/ecn/roce_np/cnp_dscp"] = "48\n"  # tuning knobs beside enable/ are not states
    files["class/net/eth2/ecn/roce_rp/enable/9"] = "1\n"  # not an 802.1p priority
    files["class/net/eth2/ecn/roce_rp/enable/x"] = "1\n"
    files["class/net/eth2/ecn/roce_np/enable/7"] = "2\n"  # neither on nor off
    files["class/net/eth2/ecn/roce_np/enable/03"] = "0\n"  # not what %d prints: no second priority 3
    write_files(tmp_path, files)
    reader = SysfsReader("eth2")
    dev = read_netdev(tmp_path, "eth2", reader)
    assert dev is not None
    assert {k for k, on in dev.ecn.items() if on} == {("np", 3), ("rp", 3)}
    assert len(dev.ecn) == 15
    assert ("np", 7) not in dev.ecn
    assert reasons(reader) == {REASON_MALFORMED: 4}
    identity = read_netdev_identity(tmp_path, "eth2", SysfsReader("eth2"))
    assert identity is not None
    assert [(role, p) for role, p, _ in identity.ecn_layout].count(("np", 3)) == 1


def test_ecn_switch_that_cannot_be_read_is_absent_not_off(tmp_path: Path) -> None:
    # A switch whose value cannot be read this scrape is unknown: reporting it as 0 would raise a false
    # "ECN off on the RoCE priority" (RdmaRoceEcnDisabled fires on == 0).
    files = {f"class/net/eth2/ecn/roce_{role}/enable/{p}": "1\n" for role in ("np", "rp") for p in range(8)}
    files["class/net/eth2/ecn/roce_np/enable/3"] = "on\n"
    write_files(tmp_path, files)
    reader = SysfsReader("eth2")
    identity = read_netdev_identity(tmp_path, "eth2", reader)
    assert identity is not None and len(identity.ecn_layout) == 16
    dev = read_netdev_state(tmp_path, identity, reader)
    assert dev is not None
    assert ("np", 3) not in dev.ecn and len(dev.ecn) == 15 and all(dev.ecn.values())
    assert reasons(reader) == {REASON_MALFORMED: 1}
    # A switch that disappeared after the layout was read (the driver reloaded without its sysfs extension).
    (tmp_path / "class/net/eth2/ecn/roce_rp/enable/5").unlink()
    dev = read_netdev_state(tmp_path, identity, reader)
    assert dev is not None and ("rp", 5) not in dev.ecn and len(dev.ecn) == 14 and all(dev.ecn.values())
    # It was listed and is gone: a failed read, as a vanished statistics/ file is (np/3 failed again too).
    assert reasons(reader) == {REASON_MALFORMED: 2, REASON_MISSING: 1}


def bond_tree(root: Path) -> None:
    write_files(
        root,
        {
            "class/net/bond0/bonding/slaves": "ens1f0np0 ens1f1np1\n",
            "class/net/bond0/bonding/mode": "802.3ad 4\n",
            "class/net/bond0/operstate": "up\n",
            "class/net/bond0/speed": "400000\n",
            "class/net/ens1f0np0/operstate": "up\n",
            "class/net/ens1f1np1/operstate": "up\n",
        },
    )
    symlink(root, "class/net/ens1f0np0/master", "class/net/bond0")
    symlink(root, "class/net/ens1f1np1/master", "class/net/bond0")


def test_bond_with_two_slaves(tmp_path: Path) -> None:
    bond_tree(tmp_path)
    errors = ReadErrors()
    bond = read_netdev(tmp_path, "bond0", SysfsReader("bond0", errors))
    slave = read_netdev(tmp_path, "ens1f1np1", SysfsReader("ens1f1np1", errors))
    assert bond is not None and slave is not None
    assert (bond.is_bond_master, bond.bond_mode, bond.bond_slaves, bond.master) == (
        True,
        "802.3ad",
        ("ens1f0np0", "ens1f1np1"),
        None,
    )
    assert bond.speed_bps == 400 * 10**9
    assert (slave.is_bond_master, slave.bond_slaves, slave.master) == (False, (), "bond0")
    assert errors.total() == 0


def test_a_bond_lists_at_most_64_slaves(tmp_path: Path) -> None:
    """64 names (a large bond) are its slaves; a 65th makes the list garbage (counted), and the slaves of
    the static read are kept rather than a list nothing bounds."""
    bond_tree(tmp_path)
    identity = read_netdev_identity(tmp_path, "bond0", SysfsReader("bond0"))
    assert identity is not None and identity.bond_slaves == ("ens1f0np0", "ens1f1np1")
    names = [f"eth{n}" for n in range(64)]
    slaves = tmp_path / "class/net/bond0/bonding/slaves"
    slaves.write_text(" ".join(names) + "\n")
    reader = SysfsReader("bond0")
    state = read_netdev_state(tmp_path, identity, reader)
    assert state is not None and state.bond_slaves == tuple(names) and reasons(reader) == {}
    slaves.write_text(" ".join([*names, "eth64"]) + "\n")
    reader = SysfsReader("bond0")
    state = read_netdev_state(tmp_path, identity, reader)
    assert state is not None and state.bond_slaves == ("ens1f0np0", "ens1f1np1")
    assert reasons(reader) == {REASON_MALFORMED: 1}


# --- RDMA port -> netdevs ------------------------------------------------------------------------------

PF0 = "devices/pci0000:00/0000:00:02.0/0000:3b:00.0"


def rdma_device(root: Path, name: str, pci: str = PF0) -> None:
    """class/infiniband/<name>/device -> the PCI function, as on a real kernel."""
    (root / pci).mkdir(parents=True, exist_ok=True)
    symlink(root, f"class/infiniband/{name}/device", pci)


def test_roce_lag_maps_to_bond_master_via_gid_table(tmp_path: Path) -> None:
    bond_tree(tmp_path)
    rdma_device(tmp_path, "mlx5_bond_0")
    write_files(
        tmp_path,
        {
            f"{PF0}/net/ens1f0np0/dev_port": "0\n",
            # GID 0/1: default GIDs of the bond; 2: empty (an unpopulated entry that a test tree can hold).
            "class/infiniband/mlx5_bond_0/ports/1/gid_attrs/ndevs/0": "bond0\n",
            "class/infiniband/mlx5_bond_0/ports/1/gid_attrs/ndevs/1": "bond0\n",
            "class/infiniband/mlx5_bond_0/ports/1/gid_attrs/ndevs/2": "",
        },
    )
    reader = SysfsReader("mlx5_bond_0")
    assert rdma_port_netdevs(tmp_path, "mlx5_bond_0", 1, reader, single_port=True) == ["bond0"]
    assert reader.errors.total() == 0


def test_a_gid_entry_not_named_by_a_number_is_skipped(tmp_path: Path) -> None:
    # '²' is a digit to str.isdigit() but not to int(): such an entry once raised a ValueError from the
    # sort, and the whole device's static read failed. Only the kernel's decimal indexes are GID entries.
    bond_tree(tmp_path)
    rdma_device(tmp_path, "mlx5_bond_0")
    write_files(
        tmp_path,
        {
            f"{PF0}/net/ens1f0np0/dev_port": "0\n",
            "class/infiniband/mlx5_bond_0/ports/1/gid_attrs/ndevs/10": "eth10\n",
            "class/infiniband/mlx5_bond_0/ports/1/gid_attrs/ndevs/2": "bond0\n",
            "class/infiniband/mlx5_bond_0/ports/1/gid_attrs/ndevs/\u00b2": "eth2\n",
        },
    )
    symlink(tmp_path, "class/net/eth10/lower_bond0", "class/net/bond0")  # a VLAN on the bond
    reader = SysfsReader("mlx5_bond_0")
    assert rdma_port_netdevs(tmp_path, "mlx5_bond_0", 1, reader, single_port=True) == ["bond0", "eth10"]


PF1 = "devices/pci0000:00/0000:00:02.0/0000:3b:00.1"


def lag_card(root: Path, second_rdma: str | None) -> None:
    """Both functions of one card as slaves of bond0, with lower_* links and class/net links into the
    functions as on a real kernel; `second_rdma` is the second function's own RDMA device, if any."""
    bond_tree(root)
    for function, netdev in ((PF0, "ens1f0np0"), (PF1, "ens1f1np1")):
        shutil.rmtree(root / "class/net" / netdev)
        write_files(root, {f"{function}/net/{netdev}/dev_port": "0\n", f"{function}/net/{netdev}/operstate": "up\n"})
        symlink(root, f"{function}/net/{netdev}/device", function)
        symlink(root, f"{function}/net/{netdev}/master", "class/net/bond0")
        symlink(root, f"class/net/{netdev}", f"{function}/net/{netdev}")
        symlink(root, f"class/net/bond0/lower_{netdev}", f"class/net/{netdev}")
    if second_rdma is not None:
        (root / PF1 / "infiniband" / second_rdma).mkdir(parents=True)


@pytest.mark.parametrize(
    ("name", "second_rdma", "netdevs"),
    [
        ("mlx5_bond_0", None, ["bond0"]),
        ("rocep59s0f0", None, ["bond0"]),
        ("mlx5_0", None, ["ens1f0np0"]),
        ("rocep59s0f0", "rocep59s0f1", ["ens1f0np0"]),
    ],
    ids=["lag", "lag-renamed", "no-lag", "no-lag-renamed"],
)
def test_roce_lag_without_gid_table_is_told_by_the_card_not_the_name(
    tmp_path: Path, name: str, second_rdma: str | None, netdevs: list[str]
) -> None:
    # The real mlx5_bond_0 capture (no gid_attrs, no device link) plus the PCI and bond parts it lacks.
    # With no GIDs to ask, the kernel's name tells (mlx5_bond_N, not mlx5_N). rdma-core's udev rule renames
    # both (rocep59s0f0): then a LAG device is one whose bond's other slave on its card has no RDMA device
    # of its own, which mlx5 folded in. Told by the name alone before, so a renamed LAG was not one.
    shutil.copytree(GPUD_SYS / "class/infiniband/mlx5_bond_0", tmp_path / "class/infiniband" / name)
    lag_card(tmp_path, second_rdma)
    rdma_device(tmp_path, name)
    reader = SysfsReader(name)
    assert rdma_port_netdevs(tmp_path, name, 1, reader, single_port=True) == netdevs
    assert reader.errors.total() == 0


def test_a_renamed_device_bonded_with_a_plain_nic_of_another_card_keeps_its_own_netdev(tmp_path: Path) -> None:
    # A renamed device (no mlx5_bond_N name to tell it) with no GID table to ask, whose netdev is bonded
    # with a NIC of another card that has no RDMA device: no RoCE LAG folds a function of another card, so
    # the port's netdev stays its own, not the bond.
    shutil.copytree(GPUD_SYS / "class/infiniband/mlx5_bond_0", tmp_path / "class/infiniband/rocep59s0f0")
    lag_card(tmp_path, None)
    other = "devices/pci0000:00/0000:00:03.0/0000:5e:00.0"
    shutil.rmtree(tmp_path / PF1)
    (tmp_path / "class/net/ens1f1np1").unlink()
    write_files(tmp_path, {f"{other}/net/ens1f1np1/dev_port": "0\n", f"{other}/net/ens1f1np1/operstate": "up\n"})
    symlink(tmp_path, f"{other}/net/ens1f1np1/device", other)
    symlink(tmp_path, f"{other}/net/ens1f1np1/master", "class/net/bond0")
    symlink(tmp_path, "class/net/ens1f1np1", f"{other}/net/ens1f1np1")
    rdma_device(tmp_path, "rocep59s0f0")
    reader = SysfsReader("rocep59s0f0")
    assert rdma_port_netdevs(tmp_path, "rocep59s0f0", 1, reader, single_port=True) == ["ens1f0np0"]
    assert reader.errors.total() == 0


def test_a_soft_roce_port_leaves_out_a_gid_netdev_of_another_namespace(captured_copy: Callable[[str], Path]) -> None:
    # rxe0 is on no PCI card, so any netdev of this namespace may carry it; a GID entry naming a netdev
    # this namespace does not have (a container's net1) is none of its netdevs.
    root = captured_copy("debian-6.1-rxe")
    write_files(root, {"devices/virtual/infiniband/rxe0/ports/1/gid_attrs/ndevs/2": "net1\n"})
    reader = SysfsReader("rxe0")
    assert rdma_port_netdevs(root, "rxe0", 1, reader, single_port=True) == ["veth0"]
    assert reader.errors.total() == 0


def test_gpud_capture_has_nothing_to_map() -> None:
    reader = SysfsReader("mlx5_bond_0")
    assert rdma_port_netdevs(GPUD_SYS, "mlx5_bond_0", 1, reader, single_port=True) == []
    assert reader.errors.total() == 0


def test_bonded_slave_of_a_non_lag_device_stays_itself(tmp_path: Path) -> None:
    # active-backup across two NICs: the active slave's GID table holds its own default GID and the
    # bond's address GIDs; the RDMA port is the slave's, with the bond as an upper.
    bond_tree(tmp_path)
    rdma_device(tmp_path, "mlx5_0")
    write_files(
        tmp_path,
        {
            f"{PF0}/net/ens1f0np0/dev_port": "0\n",
            "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0": "ens1f0np0\n",
            "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/2": "bond0\n",
        },
    )
    reader = SysfsReader("mlx5_0")
    assert rdma_port_netdevs(tmp_path, "mlx5_0", 1, reader, single_port=True) == ["ens1f0np0", "bond0"]


def test_bonded_slave_of_a_non_lag_device_stays_itself_while_its_gids_are_gone(tmp_path: Path) -> None:
    # The same active-backup bond with mlx5_0's port down: its GID table is empty, so it cannot tell the
    # bond is an upper. Only a LAG device (the bond's other slave on its card has no RDMA device) is
    # folded into the bond; mlx5_0 is a NIC of its own whose port is the slave's.
    bond_tree(tmp_path)
    rdma_device(tmp_path, "mlx5_0")
    write_files(tmp_path, {f"{PF0}/net/ens1f0np0/dev_port": "0\n"})
    reader = SysfsReader("mlx5_0")
    assert rdma_port_netdevs(tmp_path, "mlx5_0", 1, reader, single_port=True) == ["ens1f0np0"]
    assert reader.errors.total() == 0


def test_roce_lag_over_a_team_keeps_the_physical_netdev(tmp_path: Path) -> None:
    # mlx5 also forms a RoCE LAG under a team device, which has no bonding/ directory to list its ports.
    # The GID table names team0; the function's netdev is kept beside it rather than folded into a master
    # whose slaves cannot be read (its link state and counters would be lost).
    write_files(tmp_path, {"class/net/team0/operstate": "up\n", "class/net/ens1f0np0/operstate": "up\n",
                           f"{PF0}/net/ens1f0np0/dev_port": "0\n",
                           "class/infiniband/mlx5_bond_0/ports/1/gid_attrs/ndevs/0": "team0\n",
                           "class/infiniband/mlx5_bond_0/ports/1/gid_attrs/ndevs/1": "team0\n"})  # fmt: skip
    symlink(tmp_path, "class/net/ens1f0np0/master", "class/net/team0")
    symlink(tmp_path, "class/net/team0/lower_ens1f0np0", "class/net/ens1f0np0")
    rdma_device(tmp_path, "mlx5_bond_0")
    reader = SysfsReader("mlx5_bond_0")
    assert rdma_port_netdevs(tmp_path, "mlx5_bond_0", 1, reader, single_port=True) == ["team0", "ens1f0np0"]
    assert reader.errors.total() == 0


def test_dual_port_function_picks_the_port_by_dev_port(tmp_path: Path) -> None:
    rdma_device(tmp_path, "mlx4_0")
    write_files(tmp_path, {f"{PF0}/net/eth0/dev_port": "0\n", f"{PF0}/net/eth1/dev_port": "1\n"})
    reader = SysfsReader("mlx4_0")
    assert rdma_port_netdevs(tmp_path, "mlx4_0", 1, reader, single_port=False) == ["eth0"]
    assert rdma_port_netdevs(tmp_path, "mlx4_0", 2, reader, single_port=False) == ["eth1"]
    assert reader.errors.total() == 0


def test_dual_port_function_on_a_kernel_without_dev_port(tmp_path: Path) -> None:
    rdma_device(tmp_path, "mlx4_0")
    write_files(tmp_path, {f"{PF0}/net/eth0/dev_id": "0x0\n", f"{PF0}/net/eth1/dev_id": "0x1\n"})
    assert rdma_port_netdevs(tmp_path, "mlx4_0", 2, SysfsReader("mlx4_0"), single_port=False) == ["eth1"]


@pytest.mark.parametrize(
    "netdevs",
    [
        # Until 5.3 ipoib_add_port() set dev_id = port - 1 and left dev_port at 0 (the file exists since
        # 3.15), so ib0 and ib1 of a two-port mlx4 HCA both read dev_port 0. dev_id tells the ports apart.
        {"ib0": ("0", "0x0", "32"), "ib1": ("0", "0x1", "32")},
        # dev_id of an Ethernet netdev tells apart devices sharing a MAC, not ports: with dev_port 0 it
        # stays port 1's.
        {"eth0": ("0", "0x1", "1"), "eth1": ("1", None, "1")},
    ],
    ids=["ipoib-numbered-by-dev-id-before-5.3", "ethernet-dev-id-is-not-a-port"],
)
def test_port_of_a_two_port_function_with_dev_port_zero(
    tmp_path: Path, netdevs: dict[str, tuple[str, str | None, str]]
) -> None:
    rdma_device(tmp_path, "mlx4_0")
    files: dict[str, str] = {}
    for name, (dev_port, dev_id, link_type) in netdevs.items():
        files |= {f"{PF0}/net/{name}/dev_port": f"{dev_port}\n", f"{PF0}/net/{name}/type": f"{link_type}\n"}
        if dev_id is not None:
            files[f"{PF0}/net/{name}/dev_id"] = f"{dev_id}\n"
    write_files(tmp_path, files)
    reader = SysfsReader("mlx4_0")
    first, second = sorted(netdevs)
    assert rdma_port_netdevs(tmp_path, "mlx4_0", 1, reader, single_port=False) == [first]
    assert rdma_port_netdevs(tmp_path, "mlx4_0", 2, reader, single_port=False) == [second]
    assert reader.errors.total() == 0


def test_switchdev_representors_are_not_the_port(tmp_path: Path) -> None:
    rdma_device(tmp_path, "mlx5_0")
    write_files(
        tmp_path,
        {
            f"{PF0}/net/ens1f0np0/dev_port": "0\n",
            f"{PF0}/net/ens1f0np0/phys_port_name": "p0\n",
            f"{PF0}/net/ens1f0_0/dev_port": "0\n",
            f"{PF0}/net/ens1f0_0/phys_port_name": "pf0vf0\n",
            f"{PF0}/net/ens1f0_1/dev_port": "0\n",
            f"{PF0}/net/ens1f0_1/phys_port_name": "c1pf0sf3\n",
            # A BlueField's representors of the host PF, local and on an external controller: they
            # once counted as port 1's netdevs, each with its own series and ethtool ioctl.
            f"{PF0}/net/pf0hpf/dev_port": "0\n",
            f"{PF0}/net/pf0hpf/phys_port_name": "pf0\n",
            f"{PF0}/net/c1rep/dev_port": "0\n",
            f"{PF0}/net/c1rep/phys_port_name": "c1pf0\n",
        },
    )
    assert rdma_port_netdevs(tmp_path, "mlx5_0", 1, SysfsReader("mlx5_0"), single_port=True) == ["ens1f0np0"]


def test_gid_entries_in_numeric_order_and_bad_names(tmp_path: Path) -> None:
    rdma_device(tmp_path, "mlx5_2")
    ndevs = "class/infiniband/mlx5_2/ports/1/gid_attrs/ndevs"
    write_files(
        tmp_path,
        {
            f"{PF0}/net/eth2/dev_port": "0\n",
            f"{ndevs}/0": "eth2\n",
            f"{ndevs}/10": "eth2.200\n",
            f"{ndevs}/2": "eth2.100\n",
            f"{ndevs}/3": "eth2.100\n",
            f"{ndevs}/4": "../../etc\n",
            f"{ndevs}/5": "eth\0\n",  # a torn read: no netdev name holds a NUL
            f"{ndevs}/6": "e" * 300 + "\n",  # longer than IFNAMSIZ allows: garbage, not a netdev
            f"{ndevs}/x": "eth9\n",  # not a GID index: no entry of the table, and no reason to fail the port
        },
    )
    symlink(tmp_path, "class/net/eth2", f"{PF0}/net/eth2")
    for vlan in ("eth2.100", "eth2.200"):
        symlink(tmp_path, f"class/net/{vlan}/lower_eth2", "class/net/eth2")
    reader = SysfsReader("mlx5_2")
    # Numeric GID order (a plain sort would put 10 before 2): own netdev first, then the VLAN uppers.
    assert rdma_port_netdevs(tmp_path, "mlx5_2", 1, reader, single_port=True) == ["eth2", "eth2.100", "eth2.200"]
    assert reasons(reader) == {REASON_MALFORMED: 3}
    # As a path component such a name fails with ENAMETOOLONG, which cost the whole device its static read.
    assert read_netdev_identity(tmp_path, "e" * 300, reader) is None


def test_admin_down_attributes_answer_einval_which_is_no_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # While a netdev is administratively down, carrier, speed and duplex fail their read with EINVAL
    # (the kernel has no answer, as for lo's speed); an unpopulated GID entry answers ENODATA.
    write_files(
        tmp_path,
        {
            "class/net/ens1f0np0/operstate": "down\n",
            "class/net/ens1f0np0/address": "\n",  # a device without a hardware address prints an empty line
            "class/net/ens1f0np0/carrier": "",
            "class/net/ens1f0np0/speed": "",
            "class/net/ens1f0np0/duplex": "",
            "class/net/ens1f0np0/mtu": "4200\n",
            "class/net/ens1f0np0/flags": "0x1002\n",  # IFF_BROADCAST | IFF_MULTICAST, IFF_UP cleared
            f"{PF0}/net/ens1f0np0/dev_port": "0\n",
            "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0": "ens1f0np0\n",
            "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/1": "",
        },
    )
    symlink(tmp_path, "class/infiniband/mlx5_0/device", PF0)
    answers = {"carrier": errno.EINVAL, "speed": errno.EINVAL, "duplex": errno.EINVAL, "1": errno.ENODATA}
    real_read_once = reader_module._read_once

    def read_once(path: str | os.PathLike[str]) -> bytes:
        code = answers.get(os.path.basename(path))
        if code is not None:
            raise OSError(code, os.strerror(code))
        return real_read_once(path)

    monkeypatch.setattr(reader_module, "_read_once", read_once)
    reader = SysfsReader("mlx5_0")
    dev = read_netdev(tmp_path, "ens1f0np0", reader)
    assert dev is not None
    assert (dev.operstate, dev.carrier, dev.speed_bps, dev.mtu, dev.address) == (
        "down", None, None, 4200, None
    )  # fmt: skip
    assert dev.admin_up is False
    assert rdma_port_netdevs(tmp_path, "mlx5_0", 1, reader, single_port=True) == ["ens1f0np0"]
    assert reader.errors.total() == 0


def test_bond_slaves_and_mode_are_state_not_identity(tmp_path: Path) -> None:
    # Enslaving and releasing send no uevent: the identity read at startup must not freeze the slaves.
    bond_tree(tmp_path)
    reader = SysfsReader("bond0")
    identity = read_netdev_identity(tmp_path, "bond0", reader)
    assert identity is not None and identity.bond_slaves == ("ens1f0np0", "ens1f1np1")
    write_files(
        tmp_path, {"class/net/bond0/bonding/slaves": "ens1f1np1\n", "class/net/bond0/bonding/mode": "active-backup 1\n"}
    )
    bond = read_netdev_state(tmp_path, identity, reader)
    assert bond is not None
    assert (bond.bond_slaves, bond.bond_mode) == (("ens1f1np1",), "active-backup")
    assert reader.errors.total() == 0


def test_a_bond_whose_slaves_were_all_released_has_none(tmp_path: Path) -> None:
    # An empty bonding/slaves is a bond without slaves, not a failed read: the slaves of the static read
    # must not stay in rdma_netdev_bond_slave_info.
    bond_tree(tmp_path)
    reader = SysfsReader("bond0")
    identity = read_netdev_identity(tmp_path, "bond0", reader)
    assert identity is not None and identity.bond_slaves == ("ens1f0np0", "ens1f1np1")
    write_files(tmp_path, {"class/net/bond0/bonding/slaves": "\n"})
    bond = read_netdev_state(tmp_path, identity, reader)
    assert bond is not None and bond.bond_slaves == ()
    assert reader.errors.total() == 0


def test_a_failed_read_of_a_bonds_slaves_keeps_the_slaves_of_its_static_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, a refused bonding/slaves read gave no slaves: their series vanished for that scrape and the
    # netdev source forgot them, though the read said nothing about membership.
    bond_tree(tmp_path)
    reader = SysfsReader("bond0")
    identity = read_netdev_identity(tmp_path, "bond0", reader)
    assert identity is not None and identity.bond_slaves == ("ens1f0np0", "ens1f1np1")
    RefusingReads(monkeypatch, errno.EIO, {"/bonding/slaves"})
    bond = read_netdev_state(tmp_path, identity, reader)
    assert bond is not None and bond.bond_slaves == ("ens1f0np0", "ens1f1np1")
    assert reader.errors.total() == 1  # the failed read is still counted


def test_a_bonds_identity_names_its_slaves_from_lower_links_without_rtnl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bonding/slaves waits in the kernel for the rtnl lock, which a busy node can hold for minutes; the
    # static read of a RoCE LAG device must not, or the stall hides its InfiniBand side too. Its per-scrape
    # read (the netdev source, read after the device's own sources) still takes it.
    bond_tree(tmp_path)
    for slave in ("ens1f1np1", "ens1f0np0"):
        symlink(tmp_path, f"class/net/bond0/lower_{slave}", f"class/net/{slave}")
    stalled = RefusingReads(monkeypatch, errno.EIO, {"/bonding/slaves"})
    reader = SysfsReader("bond0")
    identity = read_netdev_identity(tmp_path, "bond0", reader)
    assert identity is not None and set(identity.bond_slaves) == {"ens1f0np0", "ens1f1np1"}
    assert stalled.attempts == {} and reader.errors.total() == 0


def test_function_netdevs_without_port_numbers_all_belong_to_the_port(tmp_path: Path) -> None:
    # Neither dev_port nor dev_id to tell ports apart: every (non-representor) netdev of the function is kept.
    rdma_device(tmp_path, "mlx5_0")
    write_files(tmp_path, {f"{PF0}/net/eth0/operstate": "up\n", f"{PF0}/net/eth1/operstate": "up\n"})
    reader = SysfsReader("mlx5_0")
    assert sorted(rdma_port_netdevs(tmp_path, "mlx5_0", 1, reader, single_port=True)) == ["eth0", "eth1"]
    assert reader.errors.total() == 0


def test_a_driver_statistics_file_cannot_shadow_a_link_counter() -> None:
    # statistics/ is exported file by file; one named like a link-state counter (carrier_changes) would
    # give rdma_netdev_carrier_changes_total a second sample for the same labels.
    dev = read_netdev(PROCFS_SYS, "eth0", SysfsReader("eth0"))
    assert dev is not None and dev.carrier_changes == 2
    out = FamilySet()
    expose_netdev(dataclasses.replace(dev, statistics={"carrier_changes": 99, "rx_bytes": 5}), "mlx5_0", 1, out)
    samples = {(s.name, s.value) for family in out for s in family.samples if "carrier_changes" in s.name}
    assert samples == {("rdma_netdev_carrier_changes_total", 2)}
    assert any(s.name == "rdma_netdev_rx_bytes_total" and s.value == 5 for family in out for s in family.samples)


def test_a_lone_netdev_of_the_other_port_is_not_this_ports(tmp_path: Path) -> None:
    # A ConnectX-3 VPI with port 1 InfiniBand and port 2 Ethernet, IPoIB not loaded: the function's one
    # netdev is port 2's (mlx4_en sets dev_port = port - 1), and the IB port's GID table names no netdev.
    # Port 1 must not claim it: the netdev's series would carry port="1" and miss the port-2 join.
    rdma_device(tmp_path, "mlx4_0")
    write_files(
        tmp_path,
        {
            f"{PF0}/net/ens2p1/dev_port": "1\n",
            "class/infiniband/mlx4_0/ports/1/link_layer": "InfiniBand\n",
            "class/infiniband/mlx4_0/ports/2/link_layer": "Ethernet\n",
        },
    )
    info = read_device_info(tmp_path, "mlx4_0", SysfsReader("mlx4_0"))
    assert [(port.number, port.netdevs) for port in info.ports] == [(1, ()), (2, ("ens2p1",))]


def test_a_one_port_devices_lone_netdev_is_its_own_whatever_dev_port_says(tmp_path: Path) -> None:
    # dev_port numbers a netdev among its function's ports; a driver of a one-port function has no
    # reason to set it, and a value from elsewhere must not cost the RDMA port its netdev.
    rdma_device(tmp_path, "mlx5_3")
    write_files(
        tmp_path,
        {f"{PF0}/net/ens3np0/dev_port": "1\n", "class/infiniband/mlx5_3/ports/1/link_layer": "Ethernet\n"},
    )
    info = read_device_info(tmp_path, "mlx5_3", SysfsReader("mlx5_3"))
    assert [(port.number, port.netdevs) for port in info.ports] == [(1, ("ens3np0",))]


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("a" * 15, True),  # IFNAMSIZ is 16 bytes with the terminating NUL
        ("\u00e9" * 7, True),  # 14 bytes in UTF-8
        ("a" * 16, False),
        ("\u00e9" * 8, False),  # 8 characters, 16 bytes
        ("eth0:1", False),  # an old alias label, never a netdev name
        ("eth 0", False),
        ("..", False),
        ("", False),
    ],
)
def test_a_netdev_name_is_what_the_kernel_could_name_one(name: str, valid: bool) -> None:
    assert valid_ifname(name) is valid


def _identity(name: str, pci_address: str | None, slaves: tuple[str, ...] = ()) -> NetdevIdentity:
    return NetdevIdentity(name, None, 1, None, bool(slaves), slaves, None, pci_address=pci_address)


def test_card_bond_slaves_are_the_other_functions_of_the_card_only() -> None:
    netdevs = [
        _identity("bond0", None, ("ens1f0np0", "ens1f1np1", "ens2f0np0")),
        _identity("ens1f0np0", "0000:3b:00.0"),  # the device's own function
        _identity("ens1f1np1", "0000:3b:00.1"),
        _identity("ens2f0np0", "0000:5e:00.0"),  # another card
    ]
    assert card_bond_slaves("0000:3b:00.0", netdevs) == {"0000:3b:00.1": "ens1f1np1"}
