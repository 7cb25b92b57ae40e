"""State kept between scrapes stays bounded while devices and netdevs come and go.

SR-IOV VFs created per job, netdevs renamed or moved between namespaces: over weeks a node sees names
that never come back. What the exporter remembers of a name must go with the name (found by review:
the names of netdevs ever read, and the epochs of devices ever named by a uevent, grew without bound).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from rdma_exporter.collect.base import ShadowedFiles
from rdma_exporter.collect.engine import RdmaCollector
from rdma_exporter.collect.ethtool import EthtoolSource
from rdma_exporter.collect.infiniband import HwCounterSpecs
from rdma_exporter.collect.netdev import NetdevSource, SeenNetdevs
from rdma_exporter.config import Config
from rdma_exporter.daemon import build_collector
from rdma_exporter.hotplug import Event, apply_event
from rdma_exporter.parse.netdev import Locality
from rdma_exporter.parse.reader import ReadErrors, SysfsReader
from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree, spec_for_devices

from conftest import remove_device


def netdev_source(collector: RdmaCollector) -> NetdevSource:
    source = next(source for source in collector.sources if source.name == "netdev")
    assert isinstance(source, NetdevSource)
    return source


def test_devices_that_come_and_go_are_logged_once_each(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Without the uevent monitor (rescan mode) nothing in the log said a device came or went, even at
    # debug: a start-up "no class/infiniband" warning stayed the last word after the devices appeared
    # (log review).
    root = build_tree(tmp_path / "t", spec_for_devices(3))
    collector = build_collector(replace(Config(), sysfs=root))
    caplog.set_level(logging.INFO, logger="rdma_exporter")

    def lines() -> list[str]:
        found = [r.getMessage() for r in caplog.records if r.getMessage().startswith("RDMA devices ")]
        caplog.clear()
        return found

    collector.gather()
    assert lines() == ["RDMA devices listed: mlx5_0, mlx5_1, mlx5_2 (3 in all)"]
    collector.gather()
    assert lines() == []
    remove_device(root, "mlx5_2")
    collector.gather()
    assert lines() == ["RDMA devices no longer listed: mlx5_2 (2 in all)"]


def test_the_netdevs_of_a_removed_device_are_forgotten(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "t", SAMPLE_SPEC)
    collector = build_collector(replace(Config(), sysfs=root))
    collector.gather(5.0)
    seen = netdev_source(collector).seen
    before = len(seen)
    assert before >= 10  # every device's port netdev
    remove_device(root, "mlx5_8")
    collector.gather(5.0)
    assert len(seen) == before - 1


def test_the_ethtool_state_of_a_removed_device_is_forgotten(tmp_path: Path) -> None:
    dest = tmp_path / "t"
    root = build_tree(dest, SAMPLE_SPEC)
    collector = build_collector(replace(Config(), sysfs=root, ethtool_dir=dest / "ethtool"))
    collector.gather(5.0)
    ethtool = next(source for source in collector.sources if source.name == "ethtool")
    assert isinstance(ethtool, EthtoolSource)
    before = len(ethtool.seen)
    assert before >= 2  # the two RoCE ports' netdevs
    remove_device(root, "mlx5_8")
    collector.gather(5.0)
    assert len(ethtool.seen) == before - 1


def test_a_netdev_no_longer_named_by_its_device_is_forgotten(tmp_path: Path) -> None:
    # A rename in udev mode: the event refreshes the device's static info, which names the new netdev only.
    root = tmp_path / "sys"
    seen = SeenNetdevs()
    reader = SysfsReader("mlx5_0", ReadErrors())
    for step in range(100):
        seen.add("mlx5_0", f"rail{step}")
        seen.retain("mlx5_0", {f"rail{step}"})
    assert len(seen) == 1
    # The one still named and now gone is counted once, and the device's static info marked stale.
    (root / "class" / "net").mkdir(parents=True)
    seen.check_vanished(Locality(root, "mlx5_0", reader), "mlx5_0", "rail99", reader)
    seen.check_vanished(Locality(root, "mlx5_0", reader), "mlx5_0", "rail99", reader)
    assert dict(reader.errors.counts) == {("mlx5_0", "missing"): 1}
    assert reader.static_stale and len(seen) == 0


def test_uevents_naming_devices_that_are_gone_leave_no_trace(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "t", spec_for_devices(4))
    collector = build_collector(replace(Config(), sysfs=root), rescan_each_scrape=False)
    collector.gather(5.0)
    inventory = collector.inventory
    for number in range(100, 300):  # VFs of jobs come and go, each under a new name
        apply_event(inventory, Event("add", "infiniband", f"mlx5_{number}"))
        apply_event(inventory, Event("remove", "infiniband", f"mlx5_{number}"))
    collector.gather(5.0)
    assert set(inventory._epochs) <= {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}
    # And a device that was invalidated stays cached once read again.
    apply_event(inventory, Event("change", "infiniband", "mlx5_1"))
    collector.gather(5.0)
    assert "mlx5_1" in inventory.cached()


def test_hw_counter_listings_remembered_are_bounded() -> None:
    specs = HwCounterSpecs("rdma_port_hw_", ("device", "port"), "hw_counters")
    for step in range(3 * ShadowedFiles.MAX_LISTINGS):
        # "a b" and "a_b" normalise alike: the later file of the sorted listing is shadowed.
        assert specs.shadowed(("a b", "a_b", f"optional_{step}")) == frozenset({"a_b"})
    assert len(specs.shadowed._cache) <= ShadowedFiles.MAX_LISTINGS
