"""Steady state reads no static file and each counter file at most once (issue 7's file target).

Every path opened through the sysfs reader is recorded over two in-process scrapes of the generated
sample tree, with one collector kept across them as the daemon does.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest
from prometheus_client import generate_latest

from rdma_exporter.collect.engine import Inventory, RdmaCollector
from rdma_exporter.config import Config
from rdma_exporter.daemon import build_collector, build_registry
from rdma_exporter.parse.infiniband import read_device_info
from rdma_exporter.parse.reader import ReadErrors, SysfsReader
from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree, spec_for_devices

from conftest import RefusingReads, record_reads, samples

# Identity files: they change only with a uevent (hotplug, driver reload, firmware reset, netdev moves).
STATIC_NAMES = frozenset(
    {
        "node_guid", "sys_image_guid", "fw_ver", "hca_type", "board_id", "hw_rev", "node_desc", "node_type",
        "link_layer", "ifindex", "type", "address", "dev_port", "dev_id", "phys_port_name", "max_link_speed",
        "max_link_width", "vendor", "device", "numa_node", "ibdev", "abi_version",
    }
)  # fmt: skip
STATIC_DIRS = frozenset({"gids", "gid_attrs", "bonding"})
COUNTER_DIRS = frozenset({"counters", "counters_ext", "hw_counters", "statistics"})
COUNTER_NAMES = frozenset(
    {"aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal", "carrier_changes", "carrier_up_count",
     "carrier_down_count"}
)  # fmt: skip


def is_static(rel: PurePosixPath) -> bool:
    return rel.name in STATIC_NAMES or rel.name.startswith("sriov_") or bool(STATIC_DIRS & set(rel.parts[:-1]))


def is_counter(rel: PurePosixPath) -> bool:
    return rel.name in COUNTER_NAMES or bool(COUNTER_DIRS & set(rel.parts[:-1]))


def test_second_scrape_opens_no_static_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys_root = build_tree(tmp_path / "tree", SAMPLE_SPEC).resolve()
    ethtool_dir = tmp_path / "tree" / "ethtool"
    config = replace(Config(), sysfs=sys_root, ethtool_dir=ethtool_dir if ethtool_dir.is_dir() else None)
    registry = build_registry(build_collector(config))

    opened = record_reads(monkeypatch)

    def scrape() -> list[PurePosixPath]:
        opened.clear()
        generate_latest(registry)
        files = [PurePosixPath(os.path.realpath(p)) for p in opened]
        return [p.relative_to(sys_root) for p in files if p.is_relative_to(sys_root) and not os.path.isdir(p)]

    cold = scrape()
    assert [p for p in cold if is_static(p)], "the cold scrape read no static file: the recording hook is broken"
    warm = scrape()
    assert [p for p in warm if is_counter(p)], "the warm scrape read no counter"
    assert sorted({str(p) for p in warm if is_static(p)}) == []
    twice = {str(p): n for p, n in Counter(p for p in warm if is_counter(p)).items() if n > 1}
    assert twice == {}


# --- when cached static info is read again ---------------------------------------------------------------
#
# The periods are written out here rather than imported from the engine, so that a changed constant fails
# these tests as much as a changed comparison does: each is checked just before its end and at its end.
RESCAN_MAX_AGE = 300.0  # rescan mode (no change events): static info is at most 5 minutes old
RETRY = 60.0  # static info read with errors or not settled (a device in reset) is read again after 1 minute
UDEV_RESYNC = 900.0  # udev mode: relist and re-read everything every 15 minutes, in case events were lost
JUST_BEFORE = 0.001
# Below the resync period, as a monotonic clock is for an exporter started soon after boot: the engine
# must only compare differences of its clock.
T0 = 100.0


class FakeClock:
    """The inventory's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def clocked_collector(tmp_path: Path, *, rescan: bool) -> tuple[Path, RdmaCollector, FakeClock]:
    """A 2-device tree (mlx5_0, mlx5_1) and its collector, whose inventory runs on a FakeClock."""
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    collector = build_collector(replace(Config(), sysfs=root), rescan_each_scrape=rescan)
    clock = FakeClock()
    collector.inventory = Inventory(root, rescan_each_scrape=rescan, clock=clock)
    return root, collector, clock


def device_dir(root: Path, device: str) -> Path:
    return (root / "class" / "infiniband" / device).resolve()


def rereads(collector: RdmaCollector) -> set[str]:
    """Scrape once; the devices whose static info this scrape read (a new DeviceInfo in the cache)."""
    before = collector.inventory.cached()
    generate_latest(build_registry(collector))
    return {name for name, info in collector.inventory.cached().items() if before.get(name) is not info}


def fw_of(collector: RdmaCollector, device: str) -> str | None:
    """The firmware version the cache holds for `device` (what rdma_device_info says)."""
    info = collector.inventory.cached().get(device)
    return info.fw_ver if info is not None else None


# Rescan mode has no uevents, so a firmware update or a netdev rename is only seen by re-reading: at 300 s,
# not before (every scrape would read every static file again) and not later. udev mode trusts events, so
# complete static info has no maximum age; only the 15-minute resync re-reads it, in case one was lost.
@pytest.mark.parametrize(("rescan", "period"), [(True, RESCAN_MAX_AGE), (False, UDEV_RESYNC)], ids=["rescan", "udev"])
def test_complete_static_info_is_reread_once_per_period(tmp_path: Path, rescan: bool, period: float) -> None:
    root, collector, clock = clocked_collector(tmp_path, rescan=rescan)
    assert rereads(collector) == {"mlx5_0", "mlx5_1"}  # cold
    old = fw_of(collector, "mlx5_0")
    (device_dir(root, "mlx5_0") / "fw_ver").write_text("99.1.2\n")

    clock.now = T0 + period - JUST_BEFORE
    assert rereads(collector) == set()
    assert fw_of(collector, "mlx5_0") == old
    clock.now = T0 + period
    assert rereads(collector) == {"mlx5_0", "mlx5_1"}
    assert fw_of(collector, "mlx5_0") == "99.1.2"
    # The period restarts at the re-read.
    clock.now = T0 + 2 * period - JUST_BEFORE
    assert rereads(collector) == set()


@pytest.mark.parametrize("rescan", [True, False], ids=["rescan", "udev"])
def test_unsettled_static_info_is_reread_after_the_retry_period(tmp_path: Path, rescan: bool) -> None:
    # max_link_width reads 63 (all ones) while the function is in reset: that device alone is read again
    # after 60 s, in either mode, for as long as it stays unsettled; the settled device is kept.
    root, collector, clock = clocked_collector(tmp_path, rescan=rescan)
    (device_dir(root, "mlx5_1") / "device" / "max_link_width").write_text("63\n")
    assert rereads(collector) == {"mlx5_0", "mlx5_1"}

    clock.now = T0 + RETRY - JUST_BEFORE
    assert rereads(collector) == set()
    clock.now = T0 + RETRY
    assert rereads(collector) == {"mlx5_1"}
    clock.now = T0 + 2 * RETRY - JUST_BEFORE
    assert rereads(collector) == set()
    clock.now = T0 + 2 * RETRY
    assert rereads(collector) == {"mlx5_1"}


def test_static_info_whose_only_errors_are_unsupported_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An attribute the driver does not implement (EOPNOTSUPP, counted unsupported) is its answer for good:
    # the device's static info is not read again every minute for it.
    _, collector, clock = clocked_collector(tmp_path, rescan=False)
    RefusingReads(monkeypatch, errno.EOPNOTSUPP).refused = {"mlx5_1/hca_type"}
    assert rereads(collector) == {"mlx5_0", "mlx5_1"}
    clock.now = T0 + RETRY
    assert rereads(collector) == set()
    clock.now = T0 + UDEV_RESYNC
    assert rereads(collector) == {"mlx5_0", "mlx5_1"}


def test_a_full_invalidation_restarts_the_resync_period(tmp_path: Path) -> None:
    # invalidate() with no device (a uevent overflow or an undecodable event) re-reads everything, which
    # is what the resync does: the next resync is due a full period after it, not seconds later.
    _, collector, clock = clocked_collector(tmp_path, rescan=False)
    assert rereads(collector) == {"mlx5_0", "mlx5_1"}
    clock.now = T0 + UDEV_RESYNC / 2
    collector.inventory.invalidate()
    assert rereads(collector) == {"mlx5_0", "mlx5_1"}
    clock.now = T0 + UDEV_RESYNC
    assert rereads(collector) == set()
    clock.now = T0 + UDEV_RESYNC * 1.5 - JUST_BEFORE
    assert rereads(collector) == set()
    clock.now = T0 + UDEV_RESYNC * 1.5
    assert rereads(collector) == {"mlx5_0", "mlx5_1"}


def test_mark_dirty_relists_but_keeps_static_info(tmp_path: Path) -> None:
    # udev mode lists only when told. mark_dirty (a physical netdev of no known device appeared, or a
    # device directory vanished under its job) must relist at the next scrape, but re-read the static info
    # of no listed device: that is what invalidate is for (test_hotplug covers it).
    root, collector, _ = clocked_collector(tmp_path, rescan=False)
    link = root / "class" / "infiniband" / "mlx5_1"
    target = os.readlink(link)
    link.unlink()  # mlx5_1 not there yet
    assert rereads(collector) == {"mlx5_0"}
    link.symlink_to(target)
    assert rereads(collector) == set()  # nobody said anything
    collector.inventory.mark_dirty()
    assert rereads(collector) == {"mlx5_1"}


def test_invalidation_during_a_static_read_is_not_undone_by_it(tmp_path: Path) -> None:
    # A uevent arriving while a job reads static info means what the job read may already be stale: its
    # late store must not put it in the cache, or the event would be lost until the next resync.
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    inventory = Inventory(root, rescan_each_scrape=False, clock=FakeClock())
    entries = {entry.name: entry for entry in inventory.scan(ReadErrors())}
    infos = {name: read_device_info(root, name, SysfsReader(name, ReadErrors())) for name in entries}

    inventory.invalidate("mlx5_0")  # the event, while both reads are in flight
    for name, entry in entries.items():
        inventory.store(entry, infos[name])
    assert set(inventory.cached()) == {"mlx5_1"}  # the other device's read stands
    again = {entry.name: entry.info for entry in inventory.scan(ReadErrors())}
    assert again == {"mlx5_0": None, "mlx5_1": infos["mlx5_1"]}

    entries = {entry.name: entry for entry in inventory.scan(ReadErrors())}
    inventory.invalidate()  # every device (uverbs event, socket overflow)
    inventory.store(entries["mlx5_0"], infos["mlx5_0"])
    assert inventory.cached() == {}


def test_a_read_from_before_an_invalidation_stays_out_after_the_name_left_and_came_back(tmp_path: Path) -> None:
    # A uevent invalidates mlx5_0 while its static read runs; then a listing without it prunes its epoch,
    # and it comes back with the same identity (the same link target and inode: a fixture's plain
    # directory, or a kernel before 4.14). The pruned epoch starts again at 0, so the late store of the
    # pre-event read must still be refused, or it would be served until the next resync (mutation review).
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    inventory = Inventory(root, rescan_each_scrape=True, clock=FakeClock())
    before = {entry.name: entry for entry in inventory.scan(ReadErrors())}["mlx5_0"]
    stale = read_device_info(root, "mlx5_0", SysfsReader("mlx5_0", ReadErrors()))
    inventory.invalidate("mlx5_0")
    link = root / "class" / "infiniband" / "mlx5_0"
    target = os.readlink(link)
    link.unlink()
    inventory.scan(ReadErrors())
    link.symlink_to(target)
    assert [entry.name for entry in inventory.scan(ReadErrors())] == ["mlx5_0", "mlx5_1"]
    inventory.store(before, stale)
    assert "mlx5_0" not in inventory.cached()


def test_a_class_entry_that_is_no_directory_is_no_device(tmp_path: Path) -> None:
    # A stray file under class/infiniband, or a link to one, is not a device: listed, it would be a
    # phantom device whose every read fails and is counted (mutation review).
    root = build_tree(tmp_path / "t", spec_for_devices(1))
    class_dir = root / "class" / "infiniband"
    (tmp_path / "stray").write_text("x\n")
    (class_dir / "mlx5_8").write_text("x\n")
    (class_dir / "mlx5_9").symlink_to(tmp_path / "stray")
    errors = ReadErrors()
    assert [entry.name for entry in Inventory(root).scan(errors)] == ["mlx5_0"]
    assert not errors.counts


def test_rescan_mode_rereads_a_device_that_was_removed_and_came_back(tmp_path: Path) -> None:
    # A driver reload re-creates the device under the same name and the same link target: the listing in
    # between, without it, must have dropped its static info, even though 300 s have not passed.
    root, collector, clock = clocked_collector(tmp_path, rescan=True)
    rereads(collector)
    link = root / "class" / "infiniband" / "mlx5_1"
    target, real = os.readlink(link), device_dir(root, "mlx5_1")
    link.unlink()
    clock.now += 1.0
    assert rereads(collector) == set()
    assert set(collector.inventory.cached()) == {"mlx5_0"}
    (real / "fw_ver").write_text("99.1.2\n")
    link.symlink_to(target)
    clock.now += 1.0
    assert rereads(collector) == {"mlx5_1"}
    assert fw_of(collector, "mlx5_1") == "99.1.2"


def test_rescan_mode_rereads_a_device_recreated_between_two_listings(tmp_path: Path) -> None:
    # A driver reload that ends before the next scrape: no listing saw the device gone, and its link target
    # is the same. Its directory is a new one (kernfs numbers it anew since 4.14), so the new firmware version
    # shows at once, not up to 300 s later.
    root, collector, clock = clocked_collector(tmp_path, rescan=True)
    rereads(collector)
    real = device_dir(root, "mlx5_1")
    shutil.copytree(real, real.with_name("new"), symlinks=True)
    shutil.rmtree(real)
    real.with_name("new").rename(real)
    (real / "fw_ver").write_text("99.1.2\n")
    clock.now += 1.0
    assert rereads(collector) == {"mlx5_1"}
    assert fw_of(collector, "mlx5_1") == "99.1.2"
    clock.now += 1.0
    assert rereads(collector) == set()


def test_a_device_recreated_under_its_name_starts_without_the_old_devices_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A driver reload after a firmware update re-creates the device under the same name and path, and the
    # new firmware may refuse a counter the old one gave: that is a counter the device does not have
    # (unsupported, left out a minute at a time), not a failing firmware query on every scrape (io). A
    # static re-read of the same directory (the resync) keeps what it knows: there EINVAL stays a fault.
    root, collector, _ = clocked_collector(tmp_path, rescan=False)
    registry = build_registry(collector)
    generate_latest(registry)
    refusing = RefusingReads(monkeypatch)
    refusing.refused = {"mlx5_0/ports/1/counters/symbol_error", "mlx5_1/ports/1/counters/symbol_error"}
    real = device_dir(root, "mlx5_1")
    shutil.copytree(real, real.with_name("new"), symlinks=True)
    shutil.rmtree(real)
    real.with_name("new").rename(real)  # the same path, a new directory
    collector.inventory.invalidate("mlx5_1")  # the remove and add uevents
    collector.inventory.invalidate("mlx5_0")  # a resync: the same directory
    text = generate_latest(registry).decode()

    def errors(device: str, reason: str) -> float | None:
        labels = (("collector", "infiniband"), ("device", device), ("reason", reason))
        return samples(text).get(("rdma_exporter_file_read_errors_total", labels))

    assert (errors("mlx5_1", "unsupported"), errors("mlx5_1", "io")) == (1, None)
    assert (errors("mlx5_0", "unsupported"), errors("mlx5_0", "io")) == (None, 1)


def test_udev_resync_is_not_postponed_by_an_event_in_between(tmp_path: Path) -> None:
    # The resync re-reads static info in case an event was lost. An event for another device relists, and
    # re-reads that device only: it says nothing about the others, so it must not restart their 15 minutes.
    # Found by review: a relist restarts the resync timer, so on a node with an event (say a VF's netdev
    # moved into a pod) at least every 15 minutes, static info is never resynced.
    _, collector, clock = clocked_collector(tmp_path, rescan=False)
    rereads(collector)
    clock.now = T0 + UDEV_RESYNC / 2
    collector.inventory.invalidate("mlx5_1")
    assert rereads(collector) == {"mlx5_1"}
    clock.now = T0 + UDEV_RESYNC
    assert "mlx5_0" in rereads(collector)


@pytest.mark.parametrize("event", ["device", "relist"])
def test_udev_resync_rereads_everything_when_an_event_just_came(tmp_path: Path, event: str) -> None:
    # The resync is due at the first scrape after 15 minutes, whatever happened since the scrape before:
    # an event in between (a device's uevent, or a netdev of no known device asking for a relist) says
    # nothing about the other devices, so it must not make this resync skip their re-read (found by the
    # exposition layer's mutation review: the resync only dropped static info if nothing asked for a
    # relist since the previous scrape, and the next chance was 15 minutes later).
    _, collector, clock = clocked_collector(tmp_path, rescan=False)
    rereads(collector)
    clock.now = T0 + UDEV_RESYNC
    if event == "device":
        collector.inventory.invalidate("mlx5_1")
    else:
        collector.inventory.mark_dirty()
    assert rereads(collector) == {"mlx5_0", "mlx5_1"}
    clock.now = T0 + 2 * UDEV_RESYNC - JUST_BEFORE  # and the period restarts at it
    assert rereads(collector) == set()
