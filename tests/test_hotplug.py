"""Hotplug: uevents refresh the device set and the static cache; without udev the list is rescanned.

Injected events check every rule of `apply_event`; one test creates a real veth pair in a fresh network
namespace, so the kernel itself sends the uevent that the pyudev monitor turns into a refresh.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import queue
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from rdma_exporter import hotplug
from rdma_exporter.collect.engine import RdmaCollector
from rdma_exporter.config import Config
from rdma_exporter.daemon import Daemon, build_collector, build_registry
from rdma_exporter.hotplug import Event, HotplugMonitor, apply_address_change, apply_event, start_monitor
from rdma_exporter.parse.reader import is_sysfs_mount
from rdma_exporter.sample_tree import build_tree, spec_for_devices

from conftest import (
    SYSFS_FIXTURES,
    copy_tree,
    refuse_stat_of,
    remove_device,
    require_binary,
    samples,
    skip_or_fail,
    wait_until,
)

TESTS = Path(__file__).resolve().parent


def scrape_samples(collector: RdmaCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return samples(generate_latest(build_registry(collector)).decode())


def fw_of(collector: RdmaCollector, device: str) -> str | None:
    for (name, labels), _ in scrape_samples(collector).items():
        if name == "rdma_device_info" and ("device", device) in labels:
            return dict(labels)["fw_ver"]
    return None


def devices_of(collector: RdmaCollector) -> set[str]:
    return {
        dict(labels)["device"] for (name, labels), _ in scrape_samples(collector).items() if name == "rdma_device_info"
    }


def real_dir(root: Path, device: str) -> Path:
    return (root / "class" / "infiniband" / device).resolve()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return build_tree(tmp_path / "t", spec_for_devices(4))


def udev_collector(root: Path) -> RdmaCollector:
    return build_collector(replace(Config(), sysfs=root), rescan_each_scrape=False)


def test_udev_mode_lists_devices_only_when_told(tree: Path, tmp_path: Path) -> None:
    link = tree / "class" / "infiniband" / "mlx5_3"
    target = os.readlink(link)
    link.unlink()  # mlx5_3 not there yet
    collector = udev_collector(tree)
    assert devices_of(collector) == {"mlx5_0", "mlx5_1", "mlx5_2"}

    link.symlink_to(target)  # the HCA appears...
    assert devices_of(collector) == {"mlx5_0", "mlx5_1", "mlx5_2"}  # ...but nobody said so yet
    added = Event("add", "infiniband", "mlx5_3", "/devices/pci0000:c0/0000:c0:00.0/infiniband/mlx5_3")
    assert apply_event(collector.inventory, added) == "device mlx5_3"
    assert devices_of(collector) == {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}

    link.unlink()
    apply_event(collector.inventory, Event("remove", "infiniband", "mlx5_3"))
    metrics = scrape_samples(collector)
    assert not [key for key in metrics if ("device", "mlx5_3") in key[1]]  # no stale series
    assert metrics[("rdma_exporter_devices", ())] == 3
    assert metrics[("rdma_exporter_discovery_mode", (("mode", "udev"),))] == 1
    assert metrics[("rdma_exporter_discovery_mode", (("mode", "rescan"),))] == 0


def test_a_removal_whose_uevent_was_lost_costs_one_scrape_not_the_resync(tree: Path) -> None:
    # udevd drops events when its queue overflows: the removed device must not stay listed, its reads
    # failing, until the 15-minute resync. The scrape that finds its directory gone relists.
    collector = udev_collector(tree)
    assert devices_of(collector) == {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}
    remove_device(tree, "mlx5_3")  # and no event
    first = scrape_samples(collector)
    missing = (("collector", "infiniband"), ("device", "mlx5_3"), ("reason", "missing"))
    assert first[("rdma_exporter_file_read_errors_total", missing)] > 0
    assert all(value == 1 for (name, _), value in first.items() if name == "rdma_exporter_scrape_collector_success")
    second = scrape_samples(collector)
    assert second[("rdma_exporter_devices", ())] == 3
    assert not [key for key in second if ("device", "mlx5_3") in key[1]]  # no stale series, no error series


def sriov_vfs_of(collector: RdmaCollector, device: str) -> float:
    return scrape_samples(collector)[("rdma_device_sriov_vfs", (("device", device),))]


def test_vf_count_follows_the_pf_change_event_and_vf_removal(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "t", spec_for_devices(16))  # 8 PFs with one VF each
    collector = udev_collector(tree)
    scrape_samples(collector)  # the first scrape caches static info
    cached = collector.inventory.cached()
    vf = next(name for name, info in cached.items() if info.is_vf)
    pf = next(name for name, info in cached.items() if info.pci_address == cached[vf].pf_pci_address)
    pci = cached[pf].pci_address
    assert sriov_vfs_of(collector, pf) == 1
    numvfs = real_dir(tree, pf) / "device" / "sriov_numvfs"

    # Writing sriov_numvfs: the PF's pci change event arrives once the VFs exist.
    numvfs.write_text("2\n")
    assert sriov_vfs_of(collector, pf) == 1  # cached: nobody said anything yet
    assert apply_event(collector.inventory, Event("change", "pci", pci, f"/devices/pci0000:00/{pci}")) == f"device {pf}"
    assert sriov_vfs_of(collector, pf) == 2
    # Other PCI events, and functions of no RDMA device, change nothing.
    assert apply_event(collector.inventory, Event("add", "pci", pci, f"/devices/pci0000:00/{pci}")) is None
    assert apply_event(collector.inventory, Event("change", "pci", "0000:99:00.0", "/devices/x/0000:99:00.0")) is None

    # A change on a VF's RDMA device re-reads that VF only: its PF's count of VFs did not move.
    numvfs.write_text("3\n")
    assert apply_event(collector.inventory, Event("change", "infiniband", vf)) == f"device {vf}"
    assert sriov_vfs_of(collector, pf) == 2

    # Disabling VFs sends no event on the PF, but each VF's RDMA device goes: its PF is re-read.
    numvfs.write_text("0\n")
    assert apply_event(collector.inventory, Event("remove", "infiniband", vf)) == f"device {vf}, device {pf}"
    assert sriov_vfs_of(collector, pf) == 0


def test_change_event_refreshes_static_attributes(tree: Path) -> None:
    collector = udev_collector(tree)
    assert fw_of(collector, "mlx5_1") == "28.41.1000"
    (real_dir(tree, "mlx5_1") / "fw_ver").write_text("28.42.1000\n")
    assert fw_of(collector, "mlx5_1") == "28.41.1000"  # static: not re-read on every scrape
    apply_event(collector.inventory, Event("change", "infiniband", "mlx5_1"))
    assert fw_of(collector, "mlx5_1") == "28.42.1000"


def test_net_events_refresh_the_owning_device_only(tree: Path) -> None:
    collector = udev_collector(tree)
    info = collector.inventory
    fw_of(collector, "mlx5_0")
    netdev = info.cached()["mlx5_1"].ports[0].netdevs[0]
    pci = info.cached()["mlx5_2"].pci_address
    assert pci is not None
    for device in ("mlx5_1", "mlx5_2", "mlx5_3"):
        (real_dir(tree, device) / "fw_ver").write_text("99.0.0\n")

    # A container's veth: not an RDMA netdev, nothing is re-read.
    assert apply_event(info, Event("add", "net", "veth1a2b", "/devices/virtual/net/veth1a2b")) is None
    # Renamed by udev rules: matched by the old name.
    renamed = Event("move", "net", "ib-rail1", "/devices/virtual/net/ib-rail1", f"/devices/virtual/net/{netdev}")
    assert apply_event(info, renamed) == "device mlx5_1"
    # A new netdev on the PCI function of mlx5_2 (e.g. after a driver reload).
    assert apply_event(info, Event("add", "net", "eth9", f"/devices/pci0000:00/0000:00:02.0/{pci}/net/eth9")) == (
        "device mlx5_2"
    )
    fw = {device: fw_of(collector, device) for device in ("mlx5_1", "mlx5_2", "mlx5_3")}
    assert fw == {"mlx5_1": "99.0.0", "mlx5_2": "99.0.0", "mlx5_3": "28.41.1000"}

    # uverbs devices name no RDMA device: everything is re-read.
    assert apply_event(info, Event("add", "infiniband_verbs", "uverbs3")) == "all devices"
    assert fw_of(collector, "mlx5_3") == "99.0.0"
    assert apply_event(info, Event("online", "infiniband", "mlx5_0")) is None  # not a change of ours


def test_rescan_mode_sees_devices_without_events(tree: Path) -> None:
    link = tree / "class" / "infiniband" / "mlx5_3"
    target = os.readlink(link)
    link.unlink()
    collector = build_collector(replace(Config(), sysfs=tree))  # the default: rescan
    assert collector.inventory.mode == "rescan"
    assert len(devices_of(collector)) == 3
    link.symlink_to(target)
    assert len(devices_of(collector)) == 4
    # A re-created device (new link target under the old name) is re-read, not served from cache.
    moved = real_dir(tree, "mlx5_3").with_name("mlx5_3-new")
    shutil.copytree(real_dir(tree, "mlx5_3"), moved, symlinks=True)
    (moved / "fw_ver").write_text("1.2.3\n")
    link.unlink()
    link.symlink_to(os.path.relpath(moved, link.parent))
    assert fw_of(collector, "mlx5_3") == "1.2.3"


class FakeDevice:
    def __init__(self, props: dict[str, str]) -> None:
        self.properties = props


class FakeMonitor:
    """Stands in for pyudev.Monitor: poll() returns queued devices, or raises a queued OSError."""

    def __init__(self) -> None:
        self.items: queue.Queue[Any] = queue.Queue()

    def poll(self, timeout: float | None = None) -> FakeDevice | None:
        try:
            item = self.items.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise item
        return item


def monitor_on_fake_events(tree: Path) -> tuple[RdmaCollector, FakeMonitor, HotplugMonitor]:
    """A udev-mode collector with its static info read, and a running monitor fed by a FakeMonitor."""
    collector = udev_collector(tree)
    fw_of(collector, "mlx5_0")
    fake = FakeMonitor()
    monitor = HotplugMonitor(fake, "kernel", lambda: collector.inventory)
    monitor.start()
    return collector, fake, monitor


def test_monitor_thread_applies_events_and_survives_overflow(tree: Path) -> None:
    collector, fake, monitor = monitor_on_fake_events(tree)
    try:
        (real_dir(tree, "mlx5_0") / "fw_ver").write_text("7.7.7\n")
        (real_dir(tree, "mlx5_2") / "fw_ver").write_text("7.7.7\n")
        fake.items.put(FakeDevice({"ACTION": "change", "SUBSYSTEM": "infiniband", "DEVPATH": "/devices/x/mlx5_0"}))
        assert monitor.wait_for_events(1, 5)
        assert fw_of(collector, "mlx5_0") == "7.7.7"
        assert fw_of(collector, "mlx5_2") == "28.41.1000"
        # The netlink socket overflowed: events were lost, so everything is re-read.
        fake.items.put(OSError(errno.ENOBUFS, "No buffer space available"))
        fake.items.put(FakeDevice({"ACTION": "add", "SUBSYSTEM": "net", "DEVPATH": "/devices/virtual/net/v0"}))
        # The monitor thread handles the overflow before it polls the next event, so once it has seen that
        # event the invalidation is done (a fixed wait here failed when the thread was not scheduled in time).
        wait_until(lambda: monitor.seen >= 2)
        assert fw_of(collector, "mlx5_2") == "7.7.7"
        assert monitor.seen == 2
    finally:
        monitor.stop()


class UndecodableDevice:
    """pyudev's Device when a property value is not UTF-8."""

    @property
    def properties(self) -> dict[str, str]:
        raise UnicodeDecodeError("utf-8", b"odd\xff0", 3, 4, "invalid start byte")


def test_monitor_survives_an_undecodable_event_and_falls_back_to_rescans_if_it_dies(tree: Path) -> None:
    collector, fake, monitor = monitor_on_fake_events(tree)
    invalidate = collector.inventory.invalidate
    counted_at_invalidation: list[int] = []

    def watched_invalidate(name: str | None = None) -> None:
        counted_at_invalidation.append(monitor.undecodable)
        invalidate(name)

    collector.inventory.invalidate = watched_invalidate  # type: ignore[method-assign]
    try:
        (real_dir(tree, "mlx5_2") / "fw_ver").write_text("7.7.7\n")
        fake.items.put(UndecodableDevice())  # lost: every device is read again
        # Counted once acted on: whoever sees the count sees the invalidation too.
        wait_until(lambda: monitor.undecodable == 1)
        assert counted_at_invalidation == [0]
        fake.items.put(FakeDevice({"ACTION": "change", "SUBSYSTEM": "infiniband", "DEVPATH": "/devices/x/mlx5_0"}))
        assert monitor.wait_for_events(1, 5)
        assert monitor.running
        assert fw_of(collector, "mlx5_2") == "7.7.7"
        # Anything else that escapes the loop stops the thread: scrapes then rescan instead of trusting
        # a cache nobody refreshes.
        assert not collector.inventory.rescan_each_scrape
        fake.items.put(RuntimeError("libudev went away"))
        wait_until(lambda: not monitor.running)
        assert collector.inventory.rescan_each_scrape
    finally:
        monitor.stop()


def test_an_event_that_cannot_be_applied_costs_that_event_only(tree: Path) -> None:
    # A failure applying one event is logged and the monitor goes on: the next event still refreshes its
    # device, and scrapes keep the udev mode's cache instead of falling back to rescans.
    collector = udev_collector(tree)
    fw_of(collector, "mlx5_0")
    calls = iter([RuntimeError("a malformed event")])

    def inventory() -> Any:
        failure = next(calls, None)
        if failure is not None:
            raise failure
        return collector.inventory

    fake = FakeMonitor()
    monitor = HotplugMonitor(fake, "kernel", inventory)
    monitor.start()
    try:
        (real_dir(tree, "mlx5_1") / "fw_ver").write_text("99.0.0\n")
        for _ in range(2):
            fake.items.put(FakeDevice({"ACTION": "change", "SUBSYSTEM": "infiniband", "DEVPATH": "/devices/x/mlx5_1"}))
        assert monitor.wait_for_events(1, UEVENT_DEADLINE)
        assert monitor.running and not collector.inventory.rescan_each_scrape
        assert fw_of(collector, "mlx5_1") == "99.0.0"
    finally:
        monitor.stop()


def test_events_after_a_reload_refresh_the_new_collectors_cache(tree: Path) -> None:
    # The daemon keeps one monitor across config reloads and hands it the collector in use: an event after
    # a reload must refresh the new collector's cache, not the replaced one's.
    serving = [udev_collector(tree)]
    fake = FakeMonitor()
    monitor = HotplugMonitor(fake, "kernel", lambda: serving[0].inventory)
    monitor.start()
    try:
        serving[0] = reloaded = udev_collector(tree)
        fw_of(reloaded, "mlx5_1")
        (real_dir(tree, "mlx5_1") / "fw_ver").write_text("99.0.0\n")
        fake.items.put(FakeDevice({"ACTION": "change", "SUBSYSTEM": "infiniband", "DEVPATH": "/devices/x/mlx5_1"}))
        assert monitor.wait_for_events(1, UEVENT_DEADLINE)
        assert fw_of(reloaded, "mlx5_1") == "99.0.0"
    finally:
        monitor.stop()


def test_mode_is_rescan_for_trees_that_are_not_sysfs(tree: Path) -> None:
    collector = build_collector(replace(Config(), sysfs=tree))
    monitor, mode = start_monitor(tree, lambda: collector.inventory)
    assert monitor is None
    assert mode.startswith("rescan (") and str(tree) in mode
    assert is_sysfs_mount(tree) is False


def test_mode_is_rescan_when_the_mount_table_cannot_be_read(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # is_sysfs_mount says None when /proc/self/mountinfo is unreadable: whether uevents describe the tree is
    # unknown, so scrapes rescan rather than trust a cache that events may never refresh.
    monkeypatch.setattr(hotplug, "is_sysfs_mount", lambda path: None)
    collector = build_collector(replace(Config(), sysfs=tree))
    monitor, mode = start_monitor(tree, lambda: collector.inventory)
    assert monitor is None
    assert mode.startswith("rescan (")


def test_mode_is_udev_on_the_kernel_sysfs() -> None:
    if not is_sysfs_mount("/sys"):
        skip_or_fail("/sys is not a sysfs mount here")
    collector = build_collector(replace(Config(), sysfs=Path("/sys")))
    monitor, mode = start_monitor(Path("/sys"), lambda: collector.inventory)
    if monitor is None:
        skip_or_fail(f"no uevent socket here: {mode}")
    monitor.stop()
    assert mode.startswith("udev (") and "infiniband, infiniband_verbs, net" in mode


# --- a real uevent: a veth pair created in a new network namespace ----------------------------------------


# Bounds a failure only: a loaded 2-core CI VM can leave the monitor thread unscheduled for seconds.
UEVENT_DEADLINE = 30.0


def poll_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Whether `condition` came true within `timeout` seconds (the helper reports, the test asserts)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def uevent_helper(workdir: str) -> None:
    """Runs inside `unshare --net`: the veth's uevents reach sockets of this namespace only."""
    root = build_tree(Path(workdir) / "t", spec_for_devices(2))
    collector = udev_collector(root)
    before = fw_of(collector, "mlx5_1")
    netdev = collector.inventory.cached()["mlx5_1"].ports[0].netdevs[0]
    monitor, mode = start_monitor(root, lambda: collector.inventory, source="kernel")
    assert monitor is not None, mode
    fw_ver = real_dir(root, "mlx5_1") / "fw_ver"
    fw_ver.write_text("28.50.0001\n")
    stale = fw_of(collector, "mlx5_1")  # static info is cached: no event, no re-read
    # A netdev named with bytes that are not UTF-8, which pyudev cannot decode: it once killed the
    # monitor thread, and the cache went stale until the next resync. The lost event must re-read every
    # device. Wait for that re-read itself: it is what an operator needs from the lost event.
    subprocess.run([b"ip", b"link", b"add", b"odd\xff0", b"type", b"veth", b"peer", b"name", b"oddpeer0"], check=True)
    reread = poll_until(lambda: fw_of(collector, "mlx5_1") == "28.50.0001", UEVENT_DEADLINE)
    undecodable = monitor.undecodable
    fw_ver.write_text("28.99.0001\n")
    cached = fw_of(collector, "mlx5_1")  # no event since the re-read: still cached
    # Its netdev (re)appears, as after a driver reload: here a veth of that name stands in for it.
    subprocess.run(["ip", "link", "add", netdev, "type", "veth", "peer", "name", "rdmapeer0"], check=True)
    received = monitor.wait_for_events(1, UEVENT_DEADLINE)  # counted once the cache was invalidated
    after = fw_of(collector, "mlx5_1")
    alive = monitor.running
    # Addresses send no uevent: the rtnetlink watch must re-read the device (its GIDs follow them). First
    # an IPv6 address on an upper of the port's netdev, whose lower link is in the exporter's tree only
    # (read from its sys_root, not from this namespace's /sys); then an IPv4 one on the netdev itself.
    upper = f"{netdev}.7"
    (root / "class" / "net" / upper).mkdir()
    os.symlink(f"../{netdev}", root / "class" / "net" / upper / f"lower_{netdev}")
    subprocess.run(["ip", "link", "add", upper, "type", "veth", "peer", "name", "rdmapeer1"], check=True)
    addresses: dict[str, bool] = {}
    for step, (family, address, dev) in enumerate((("-6", "fd00::7/64", upper), ("-4", "10.7.7.7/24", netdev))):
        fw_ver.write_text(f"28.99.{step + 2}\n")
        counted = monitor.events
        nodad = ["nodad"] if family == "-6" else []  # no duplicate address detection: no wait, no link needed
        subprocess.run(["ip", family, "addr", "add", address, "dev", dev, *nodad], check=True)
        received_address = monitor.wait_for_events(counted + 1, UEVENT_DEADLINE)
        addresses[f"{family} {dev}"] = received_address and fw_of(collector, "mlx5_1") == f"28.99.{step + 2}"
    monitor.stop()
    report = {
        "before": before,
        "stale": stale,
        "reread": reread,
        "cached": cached,
        "after": after,
        "received": received,
        "seen": monitor.seen,
        "netdev": netdev,
        "alive": alive,
        "undecodable": undecodable,
        "addresses": addresses,
    }
    print(json.dumps(report))


def run_in_network_namespace(helper: str, tmp_path: Path) -> dict[str, Any]:
    """Run `helper` of this module in a network namespace of its own; its JSON report."""
    require_binary("ip")  # iproute2, from the setup script
    require_binary("unshare")  # util-linux, Essential in Debian
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import test_hotplug as t; t.{helper}(sys.argv[1])"
    attempts = [["unshare", "--net"], ["unshare", "--user", "--map-root-user", "--net"]]
    result = None
    for prefix in attempts:
        result = subprocess.run(
            [*prefix, sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=180
        )
        if result.returncode == 0 or "unshare failed" not in result.stderr:
            break
        shutil.rmtree(tmp_path / "t", ignore_errors=True)
    assert result is not None
    if result.returncode != 0 and "unshare failed" in result.stderr:
        skip_or_fail(f"cannot create a network namespace here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stdout + result.stderr
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def set_receive_buffer(monitor: Any, size: int) -> None:
    """SO_RCVBUF of a pyudev monitor's socket (pyudev's own setter forces it, which needs CAP_NET_ADMIN in
    the initial user namespace: not there under `unshare --user`)."""
    with socket.socket(fileno=os.dup(monitor.fileno())) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


def overflow_helper(workdir: str) -> None:
    """Runs inside `unshare --net`: a burst of veth uevents overflows the uevent socket before the monitor
    reads it, as creating many VFs or reloading a driver can on a node."""
    import pyudev

    root = build_tree(Path(workdir) / "t", spec_for_devices(2))
    collector = udev_collector(root)
    assert fw_of(collector, "mlx5_1") == "28.41.1000"  # read once, then cached
    netdev = collector.inventory.cached()["mlx5_1"].ports[0].netdevs[0]
    fw_ver = real_dir(root, "mlx5_1") / "fw_ver"
    udev_monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
    for subsystem in hotplug.SUBSYSTEMS:
        udev_monitor.filter_by(subsystem)
    udev_monitor.start()
    set_receive_buffer(udev_monitor, 4096)  # the kernel's minimum or near it: a few events fill it
    fw_ver.write_text("28.60.0001\n")
    burst = "".join(f"link add burst{n} type veth peer name burstpeer{n}\n" for n in range(100))
    subprocess.run(["ip", "-batch", "-"], input=burst, text=True, check=True)
    monitor = HotplugMonitor(udev_monitor, "kernel", lambda: collector.inventory, sys_root=root)
    monitor.start()
    overflowed = poll_until(lambda: monitor.overflows >= 1, UEVENT_DEADLINE)
    reread = fw_of(collector, "mlx5_1")  # the overflow lost events: every device is read again
    alive = monitor.running
    # Still listening: its netdev's next event re-reads the device (with room for that event's burst
    # now, so that it is not lost to a second overflow).
    set_receive_buffer(udev_monitor, 1 << 20)
    fw_ver.write_text("28.60.0002\n")
    counted = monitor.events
    subprocess.run(["ip", "link", "add", netdev, "type", "veth", "peer", "name", "rdmapeer0"], check=True)
    received = monitor.wait_for_events(counted + 1, UEVENT_DEADLINE)
    after = fw_of(collector, "mlx5_1")
    monitor.stop()
    report = {
        "overflowed": overflowed,
        "reread": reread,
        "alive": alive,
        "rescanning": collector.inventory.rescan_each_scrape,
        "received": received,
        "after": after,
    }
    print(json.dumps(report))


def test_a_real_uevent_socket_overflow_rereads_every_device_and_keeps_listening(tmp_path: Path) -> None:
    # pyudev reports the overflow as "Error while polling fd" without errno; the kernel's ENOBUFS is in
    # SO_ERROR (review: the monitor took it for a dead socket and stopped for good, every scrape rescanning).
    report = run_in_network_namespace("overflow_helper", tmp_path)
    assert report["overflowed"] and report["reread"] == "28.60.0001", report
    assert report["alive"] and not report["rescanning"], report
    assert report["received"] and report["after"] == "28.60.0002", report


def test_real_uevent_from_a_veth_in_a_network_namespace(tmp_path: Path) -> None:
    report = run_in_network_namespace("uevent_helper", tmp_path)
    assert report["before"] == report["stale"] == "28.41.1000", report
    # The monitor survived the undecodable event, and losing it re-read every device.
    assert report["alive"] and report["undecodable"] >= 1 and report["reread"], report
    assert report["cached"] == "28.50.0001", report
    # The netdev's event reached the monitor and re-read its RDMA device.
    assert report["received"] and report["after"] == "28.99.0001", report
    # Each address change reached the rtnetlink watch (IPv4 and IPv6 groups) and re-read the device.
    assert report["addresses"] == {f"-6 {report['netdev']}.7": True, f"-4 {report['netdev']}": True}, report


class MonitorDyingDuringReload:
    """A HotplugMonitor that is alive when a reload asks, and failed by the time the new collector is in."""

    def __init__(self) -> None:
        self._answers = iter([False])

    @property
    def failed(self) -> bool:
        return next(self._answers, True)

    def stop(self) -> None:
        pass


def test_reload_while_the_monitor_dies_leaves_the_new_collector_rescanning(tree: Path) -> None:
    config = replace(Config(), sysfs=tree, listen_address="127.0.0.1:0")
    daemon = Daemon(config, reload=lambda: config)
    try:
        daemon.hotplug = MonitorDyingDuringReload()  # type: ignore[assignment]
        assert daemon._reload()
        assert daemon.exporter.serving.collector.inventory.rescan_each_scrape
    finally:
        daemon.server.shutdown(grace=0)


def test_a_monitor_that_fails_at_start_up_leaves_the_collector_rescanning(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The monitor's thread failed before the daemon set its inventory's mode: its fallback had already
    # switched that inventory, which the daemon then set back to udev mode because the monitor existed
    # (review). The monitor's `running` is still true for a moment after it failed, so `failed` is asked.
    from rdma_exporter import daemon as daemon_module

    class FailingMonitor(FakeMonitor):
        def poll(self, timeout: float | None = None) -> None:
            raise OSError(errno.EBADF, "Bad file descriptor")

    started: list[HotplugMonitor] = []

    def start_failing(sys_root: Path, inventory: Callable[[], Any], **kwargs: object) -> tuple[HotplugMonitor, str]:
        monitor = HotplugMonitor(FailingMonitor(), "kernel", inventory)
        monitor.start()
        wait_until(lambda: monitor.failed)
        started.append(monitor)
        return monitor, "udev (kernel uevents, no udevd running)"

    monkeypatch.setattr(daemon_module, "start_monitor", start_failing)
    config = replace(Config(), sysfs=tree, listen_address="127.0.0.1:0")
    daemon = Daemon(config, reload=lambda: config)
    try:
        assert started and daemon.hotplug is started[0]
        assert daemon.exporter.serving.collector.inventory.rescan_each_scrape
        # Said on every scrape, for a fleet query (the log says why, once).
        served = samples(daemon.exporter.serving.collector.gather().render_text().decode())
        modes = {dict(ls)["mode"]: v for (n, ls), v in served.items() if n == "rdma_exporter_discovery_mode"}
        assert modes == {"rescan": 1, "udev": 0}
        assert daemon._reload()  # and a reload builds the new collector rescanning too
        assert daemon.exporter.serving.collector.inventory.rescan_each_scrape
    finally:
        daemon.server.shutdown(grace=0)


# --- uevent and rtnetlink edge cases ------------------------------------------------------------------


def test_a_netdev_rename_decoded_from_the_uevent_refreshes_the_device_of_its_old_name(tree: Path) -> None:
    # What the monitor thread gets from udev: the new name in INTERFACE and DEVPATH, the old one only in
    # DEVPATH_OLD. A rename by udev rules must re-read the RDMA device that owned the old name.
    collector, fake, monitor = monitor_on_fake_events(tree)
    try:
        netdev = collector.inventory.cached()["mlx5_1"].ports[0].netdevs[0]
        (real_dir(tree, "mlx5_1") / "fw_ver").write_text("99.0.0\n")
        props = {
            "ACTION": "move",
            "SUBSYSTEM": "net",
            "INTERFACE": "ib-rail1",
            "DEVPATH": "/devices/virtual/net/ib-rail1",
            "DEVPATH_OLD": f"/devices/virtual/net/{netdev}",
        }
        assert Event.from_properties(props) == Event(
            "move", "net", "ib-rail1", "/devices/virtual/net/ib-rail1", f"/devices/virtual/net/{netdev}"
        )
        fake.items.put(FakeDevice(props))
        assert monitor.wait_for_events(1, UEVENT_DEADLINE)
        assert fw_of(collector, "mlx5_1") == "99.0.0"
    finally:
        monitor.stop()


def test_a_hwmon_device_registered_after_its_rdma_device_is_read_on_its_event(tree: Path, tmp_path: Path) -> None:
    # mlx5 registers its hwmon device after the RDMA device: a first read in between caches no sensors.
    function = real_dir(tree, "mlx5_0") / "device"
    hwmon = next((function / "hwmon").iterdir())
    hidden = tmp_path / "hidden"
    hwmon.rename(hidden)
    collector = udev_collector(tree)

    def sensors() -> list[str]:
        return sorted(dict(labels)["sensor"] for (name, labels) in scrape_samples(collector)
                      if name == "rdma_device_temperature_celsius" and ("device", "mlx5_0") in labels)  # fmt: skip

    assert sensors() == []
    hidden.rename(hwmon)
    assert sensors() == []  # cached: nobody said anything yet
    address = function.resolve().name
    devpath = f"/devices/pci0000:00/0000:00:01.0/{address}/hwmon/{hwmon.name}"
    # A hwmon device of something else, or an event that registers nothing, changes nothing.
    cpu = Event("add", "hwmon", "hwmon1", "/devices/platform/coretemp.0/hwmon/hwmon1")
    assert apply_event(collector.inventory, cpu) is None
    assert apply_event(collector.inventory, Event("change", "hwmon", hwmon.name, devpath)) is None
    assert sensors() == []
    assert apply_event(collector.inventory, Event("add", "hwmon", hwmon.name, devpath)) == "device mlx5_0"
    assert sensors() == ["Module0", "asic"]
    # A device not cached yet (its static read may be in flight, to be stored without sensors) is named
    # from its function's infiniband/ directory, so that the read is done again.
    fresh = udev_collector(tree)
    assert fresh.inventory.cached() == {}
    assert apply_event(fresh.inventory, Event("add", "hwmon", hwmon.name, devpath)) == "device mlx5_0"


def test_an_infiniband_event_on_a_device_without_pci_function_refreshes_that_device_only(tmp_path: Path) -> None:
    # Devices with no PCI function in sysfs (mlx4_0 and i40iw0 of this capture): `that device`, not every
    # device whose PCI address is equally unknown.
    root = copy_tree(SYSFS_FIXTURES / "prometheus-node_exporter" / "sys", tmp_path / "sys")
    collector = udev_collector(root)
    scrape_samples(collector)
    assert {name: info.pci_address for name, info in collector.inventory.cached().items()} == {
        "mlx4_0": None,
        "i40iw0": None,
    }
    assert apply_event(collector.inventory, Event("change", "infiniband", "mlx4_0")) == "device mlx4_0"
    assert set(collector.inventory.cached()) == {"i40iw0"}
    scrape_samples(collector)
    assert apply_event(collector.inventory, Event("remove", "infiniband", "i40iw0")) == "device i40iw0"
    assert set(collector.inventory.cached()) == {"mlx4_0"}


def move_to_domain(root: Path, buses: tuple[str, ...], domain: str) -> None:
    """Move PCI buses of domain 0000 into `domain`: every directory name and symlink target naming them."""

    def moved(text: str) -> str:
        for bus in buses:
            text = text.replace(f"0000:{bus}", f"{domain}:{bus}")
        return text

    for dirpath, dirnames, filenames in os.walk(root, topdown=False):  # children before their parents
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink() and moved(os.readlink(path)) != os.readlink(path):
                target = moved(os.readlink(path))
                path.unlink()
                path.symlink_to(target)
            if moved(name) != name:
                path.rename(path.with_name(moved(name)))


def test_a_netdev_event_in_a_five_digit_pci_domain_refreshes_its_device(tree: Path) -> None:
    # Intel VMD puts the devices behind it in PCI domains from 10000 up: five hex digits, where a plain
    # host has four. A netdev appearing on such a function must still be matched to its RDMA device.
    function = real_dir(tree, "mlx5_2").parent.parent
    root_bus = function.parent.name.split(":")[1]  # the root port, 0000:<bus>:01.0
    bus = function.name.split(":")[1]
    move_to_domain(tree, (root_bus, bus), "10000")
    collector = udev_collector(tree)
    fw_of(collector, "mlx5_0")
    pci = collector.inventory.cached()["mlx5_2"].pci_address
    assert pci == f"10000:{bus}:00.0"
    (real_dir(tree, "mlx5_2") / "fw_ver").write_text("99.0.0\n")
    devpath = f"/devices/pci10000:{root_bus}/10000:{root_bus}:01.0/{pci}/net/eth9"
    assert apply_event(collector.inventory, Event("add", "net", "eth9", devpath)) == "device mlx5_2"
    assert fw_of(collector, "mlx5_2") == "99.0.0"


def test_container_veths_do_not_relist_but_an_unknown_physical_netdev_does(tree: Path) -> None:
    link = tree / "class" / "infiniband" / "mlx5_3"
    target = os.readlink(link)
    link.unlink()
    collector = udev_collector(tree)
    assert devices_of(collector) == {"mlx5_0", "mlx5_1", "mlx5_2"}
    link.symlink_to(target)  # an HCA appears; its infiniband event has not come yet
    # A container's veth or a bridge changes nothing: not even a relist.
    assert apply_event(collector.inventory, Event("add", "net", "veth1a2b", "/devices/virtual/net/veth1a2b")) is None
    assert devices_of(collector) == {"mlx5_0", "mlx5_1", "mlx5_2"}
    # A netdev on a PCI function of no cached device may be the new HCA's: the device list is re-read.
    physical = Event("add", "net", "eth7", "/devices/pci0000:e0/0000:e0:01.0/0000:e1:00.0/net/eth7")
    assert apply_event(collector.inventory, physical) is None  # no cached device to re-read
    assert devices_of(collector) == {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}


def test_a_failed_uevent_socket_stops_the_monitor_and_leaves_the_collector_rescanning(tree: Path) -> None:
    # Any error but an overflow: no more events will come, so the cache must not be trusted any longer.
    collector, fake, monitor = monitor_on_fake_events(tree)
    try:
        assert not collector.inventory.rescan_each_scrape
        fake.items.put(OSError(errno.EBADF, "Bad file descriptor"))
        wait_until(lambda: not monitor.running, UEVENT_DEADLINE)
        assert collector.inventory.rescan_each_scrape
    finally:
        monitor.stop()


def test_stop_ends_the_monitor_thread(tree: Path) -> None:
    _, _, monitor = monitor_on_fake_events(tree)
    assert monitor.running
    monitor.stop()
    wait_until(lambda: not monitor.running, UEVENT_DEADLINE)


class OpenedMonitor(FakeMonitor):
    """Stands in for the pyudev.Monitor that start_monitor opens: records its source and filters."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source
        self.subsystems: list[str] = []

    def filter_by(self, subsystem: str) -> None:
        self.subsystems.append(subsystem)

    def start(self) -> None:
        pass


@pytest.mark.parametrize(("udevd", "source"), [("running", "udev"), ("absent", "kernel"), ("hidden", "kernel")])
def test_udevd_events_are_used_when_udevd_runs_else_the_kernels(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, udevd: str, source: str
) -> None:
    # udevd's events come after its rules renamed the netdevs; without udevd none would ever come on its
    # multicast group, so the kernel's are listened to instead (operations.md: "device discovery: udev
    # (kernel uevents, no udevd running ...)"). All four subsystems are listened to.
    import pyudev

    control = tmp_path / "control"
    if udevd != "absent":
        control.touch()
    if udevd == "hidden":
        # InaccessiblePaths=/run/udev: the stat fails with EACCES, which is "no udevd to be heard here"
        # (review: Path.exists raised it, and start-up logged it as a failure to listen on the port).
        refuse_stat_of(monkeypatch, control)
    monkeypatch.setattr(hotplug, "UDEVD_CONTROL", control)
    monkeypatch.setattr(hotplug, "is_sysfs_mount", lambda path: True)  # as if `tree` were /sys
    opened: list[OpenedMonitor] = []

    def from_netlink(context: object, source: str = "udev") -> OpenedMonitor:
        opened.append(OpenedMonitor(source))
        return opened[-1]

    monkeypatch.setattr(pyudev.Monitor, "from_netlink", staticmethod(from_netlink))
    collector = udev_collector(tree)
    monitor, mode = start_monitor(tree, lambda: collector.inventory)
    assert monitor is not None, mode
    try:
        assert monitor.running  # listening from start-up on, not from some later call
    finally:
        monitor.stop()
    subsystems = ["infiniband", "infiniband_verbs", "net", "pci", "hwmon"]
    assert [(m.source, m.subsystems) for m in opened] == [(source, subsystems)]
    assert monitor.source == source
    how = "udevd events" if source == "udev" else "kernel uevents, no udevd running"
    assert mode == f"udev ({how} on infiniband, infiniband_verbs, net, pci, hwmon)"


def test_a_refused_uevent_socket_means_rescan_mode(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # operations.md: "rescan (...)" when the netlink socket is refused (a seccomp or address-family filter).
    import pyudev

    def refused(context: object, source: str = "udev") -> OpenedMonitor:
        raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")

    monkeypatch.setattr(hotplug, "is_sysfs_mount", lambda path: True)
    monkeypatch.setattr(pyudev.Monitor, "from_netlink", staticmethod(refused))
    collector = udev_collector(tree)
    monitor, mode = start_monitor(tree, lambda: collector.inventory)
    assert monitor is None
    assert mode.startswith("rescan (cannot open the uevent socket: ") and "Address family not supported" in mode



def test_a_refused_uevent_socket_is_a_warning(
    tree: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # On the real /sys a refused socket is a sandbox refusing what the unit allows, and costs a rescan per
    # scrape: a warning, not only the info line "device discovery: rescan (...)" (seen under systemd with
    # AF_NETLINK taken out of RestrictAddressFamilies=).
    import pyudev

    def refused(context: object, source: str = "udev") -> OpenedMonitor:
        raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")

    monkeypatch.setattr(hotplug, "is_sysfs_mount", lambda path: True)
    monkeypatch.setattr(pyudev.Monitor, "from_netlink", staticmethod(refused))
    collector = udev_collector(tree)
    with caplog.at_level(logging.WARNING, logger="rdma_exporter.hotplug"):
        monitor, _ = start_monitor(tree, lambda: collector.inventory)
    assert monitor is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "cannot open the uevent socket ([Errno 97] Address family not supported by protocol): "
        "hotplug is found by a rescan on every scrape"
    ]


def rtnetlink_message(kind: int, index: int) -> bytes:
    """One rtnetlink message: nlmsghdr, an ifaddrmsg for `index`, one 8-byte attribute (IFA_ADDRESS)."""
    body = struct.pack("=BBBBI", socket.AF_INET, 24, 0, 0, index) + struct.pack("=HH4s", 8, 1, bytes([10, 0, 0, 1]))
    return struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body


def test_address_changes_are_read_from_rtnetlink_datagrams() -> None:
    newlink = struct.pack("=IHHII", 16 + 16, 16, 0, 0, 0) + bytes(16)  # RTM_NEWLINK: not an address change
    data = rtnetlink_message(hotplug.RTM_NEWADDR, 7) + newlink + rtnetlink_message(hotplug.RTM_DELADDR, 9)
    assert hotplug.address_changes(data) == [("add", 7), ("remove", 9)]
    assert hotplug.address_changes(data[:-3]) == [("add", 7)]  # a truncated message is not read
    # A length that is not a multiple of 4 (a last attribute of 2 bytes): the next message starts at the
    # 4-byte boundary (NLMSG_ALIGN), not in the padding.
    body = struct.pack("=BBBBI", socket.AF_INET6, 64, 0, 0, 5) + struct.pack("=HH2s", 6, 3, b"x\0")
    unaligned = struct.pack("=IHHII", 16 + len(body), hotplug.RTM_NEWADDR, 0, 0, 0) + body + bytes(2)
    assert hotplug.address_changes(unaligned + rtnetlink_message(hotplug.RTM_DELADDR, 9)) == [("add", 5), ("remove", 9)]


def test_an_address_on_a_port_netdev_or_an_upper_of_it_refreshes_that_device(tree: Path) -> None:
    """The kernel adds a GID for a new address without any uevent (a real rxe0 showed it: 3 RoCE v2 GIDs
    while rdma_port_gids said 2 until the resync); the rtnetlink address watch refreshes the device."""
    collector = udev_collector(tree)
    info = collector.inventory
    fw_of(collector, "mlx5_0")
    netdev = info.cached()["mlx5_1"].ports[0].netdevs[0]
    (real_dir(tree, "mlx5_1") / "fw_ver").write_text("99.0.0\n")
    assert apply_address_change(info, "veth1a2b", tree) is None  # a container's veth
    assert fw_of(collector, "mlx5_1") == "28.41.1000"
    assert apply_address_change(info, netdev, tree) == "device mlx5_1"
    assert fw_of(collector, "mlx5_1") == "99.0.0"
    # A VLAN on the port's netdev is not among the port's netdevs before its address makes a GID.
    vlan = tree / "class" / "net" / f"{netdev}.100"
    vlan.mkdir()
    os.symlink(f"../{netdev}", vlan / f"lower_{netdev}")
    (real_dir(tree, "mlx5_1") / "fw_ver").write_text("99.1.0\n")
    assert apply_address_change(info, f"{netdev}.100", tree) == "device mlx5_1"
    assert fw_of(collector, "mlx5_1") == "99.1.0"


def test_malformed_rtnetlink_messages_end_the_datagram_without_hanging_or_raising() -> None:
    """The watch thread reads every datagram with address_changes and has no handler around it: a message
    claiming zero bytes must not spin it forever, nor one too short for its ifaddrmsg raise."""
    zero = struct.pack("=IHHII", 0, hotplug.RTM_NEWADDR, 0, 0, 0)
    short = struct.pack("=IHHII", 20, hotplug.RTM_DELADDR, 0, 0, 0) + bytes(4)  # header and 4 bytes of body
    results: list[list[tuple[str, int]]] = []
    reader = threading.Thread(
        target=lambda: results.extend(hotplug.address_changes(d) for d in (zero + rtnetlink_message(20, 7), short)),
        daemon=True,
    )
    reader.start()
    reader.join(5)
    assert results == [[], []]
    # A short message is skipped, not read into the next one's bytes.
    assert hotplug.address_changes(short + rtnetlink_message(hotplug.RTM_NEWADDR, 9)) == [("add", 9)]


def cached_with_netdev(tree: Path) -> tuple[RdmaCollector, str]:
    """A collector that has read (and cached) every device once, and the netdev of mlx5_1's port."""
    collector = udev_collector(tree)
    fw_of(collector, "mlx5_0")
    return collector, collector.inventory.cached()["mlx5_1"].ports[0].netdevs[0]


class FakeRouteSocket:
    """Stands in for the rtnetlink socket: recv() returns queued datagrams, raises queued errors, and times
    out as the real one does when nothing is queued."""

    def __init__(self) -> None:
        self.items: queue.Queue[bytes | BaseException] = queue.Queue()
        self.timeout: float | None = None
        self.closed = False

    def settimeout(self, timeout: float) -> None:
        self.timeout = timeout

    def recv(self, size: int) -> bytes:
        try:
            item = self.items.get(timeout=self.timeout)
        except queue.Empty:
            raise TimeoutError("timed out") from None
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self.closed = True


def name_indexes(monkeypatch: pytest.MonkeyPatch, indexes: dict[int, str]) -> None:
    """socket.if_indextoname for the watch, knowing only `indexes`: any other index is gone."""

    def if_indextoname(index: int) -> str:
        if index not in indexes:
            raise OSError(errno.ENXIO, "No such device or address")  # what the kernel says for a gone index
        return indexes[index]

    monkeypatch.setattr(hotplug.socket, "if_indextoname", if_indextoname)


def test_address_watch_survives_quiet_gone_netdevs_and_overflow(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A quiet second, a netdev gone before its index is named, or an overflowed socket must not end the
    watch: after any of them, GIDs would again follow addresses only at the 15-minute resync."""
    collector, netdev = cached_with_netdev(tree)
    name_indexes(monkeypatch, {7: netdev})
    route = FakeRouteSocket()
    # No settle re-apply within the test: each event counted is one a datagram's change made.
    monitor = HotplugMonitor(
        FakeMonitor(), "kernel", lambda: collector.inventory, addresses=route, address_settle_seconds=3600  # type: ignore[arg-type]
    )
    monitor.start()
    try:
        (real_dir(tree, "mlx5_1") / "fw_ver").write_text("99.0.0\n")
        route.items.put(TimeoutError("timed out"))
        route.items.put(rtnetlink_message(hotplug.RTM_NEWADDR, 7))
        assert monitor.wait_for_events(1, UEVENT_DEADLINE)
        assert fw_of(collector, "mlx5_1") == "99.0.0"
        # Index 8 is gone; the change on 7 after it in the same datagram is still read.
        (real_dir(tree, "mlx5_1") / "fw_ver").write_text("99.1.0\n")
        route.items.put(rtnetlink_message(hotplug.RTM_DELADDR, 8) + rtnetlink_message(hotplug.RTM_DELADDR, 7))
        assert monitor.wait_for_events(2, UEVENT_DEADLINE)
        assert fw_of(collector, "mlx5_1") == "99.1.0"
        # Overflowed: the changes lost are unknown, so every device is re-read.
        (real_dir(tree, "mlx5_2") / "fw_ver").write_text("99.2.0\n")
        route.items.put(OSError(errno.ENOBUFS, "No buffer space available"))
        route.items.put(rtnetlink_message(hotplug.RTM_NEWADDR, 7))
        # Seen after the overflow was handled (counted as no event: the cache it would refresh is empty).
        wait_until(lambda: monitor.seen >= 3, UEVENT_DEADLINE)
        assert fw_of(collector, "mlx5_2") == "99.2.0"
    finally:
        monitor.stop()


def test_stop_ends_the_address_watch_and_closes_its_socket(tree: Path) -> None:
    # The rtnetlink socket is the monitor's own (open_address_socket): stop() must not leak it.
    collector = udev_collector(tree)
    route = FakeRouteSocket()
    monitor = HotplugMonitor(
        FakeMonitor(), "kernel", lambda: collector.inventory, addresses=route, sys_root=tree  # type: ignore[arg-type]
    )
    monitor.start()
    monitor.stop()
    assert route.closed
    wait_until(lambda: not monitor.running, UEVENT_DEADLINE)
    # `running` is the uevent thread's; the address watch must have ended too (the fake socket's close
    # does not fail its recv: only stop() can end the watch here).
    assert monitor._address_thread is not None
    assert not monitor._address_thread.is_alive()


def test_a_failed_rtnetlink_socket_ends_the_address_watch_with_one_error(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Any error but an overflow leaves a socket that fails every read: the watch says so once and stops
    reading, instead of spinning on it and filling the error log."""
    collector = udev_collector(tree)
    route = FakeRouteSocket()
    monitor = HotplugMonitor(FakeMonitor(), "kernel", lambda: collector.inventory, addresses=route)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="rdma_exporter.hotplug"):
        for _ in range(3):
            route.items.put(OSError(errno.EBADF, "Bad file descriptor"))
        monitor.start()
        try:
            wait_until(lambda: route.items.qsize() < 3, UEVENT_DEADLINE)
            time.sleep(0.5)  # time for a watch that went on to read the other two
            assert route.items.qsize() == 2
        finally:
            monitor.stop()
    errors = [r.getMessage() for r in caplog.records if r.name == hotplug.__name__ and r.levelno >= logging.ERROR]
    assert errors == [
        "address watch failed ([Errno 9] Bad file descriptor); GID counts follow address changes only at resync"
    ]


class RefusedTimeoutRouteSocket(FakeRouteSocket):
    """settimeout is an ioctl (FIONBIO): under a seccomp filter that refuses ioctl it raises EPERM."""

    def settimeout(self, timeout: float) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")


def test_a_refused_settimeout_ends_the_address_watch_with_one_error(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before, the EPERM escaped the loop and the thread died with an unhandled-exception traceback.
    collector = udev_collector(tree)
    monitor = HotplugMonitor(
        FakeMonitor(), "kernel", lambda: collector.inventory, addresses=RefusedTimeoutRouteSocket()  # type: ignore[arg-type]
    )
    unhandled: list[threading.ExceptHookArgs] = []
    previous_hook = threading.excepthook
    threading.excepthook = unhandled.append
    try:
        with caplog.at_level(logging.ERROR, logger="rdma_exporter.hotplug"):
            monitor.start()
            try:
                assert monitor._address_thread is not None
                monitor._address_thread.join(UEVENT_DEADLINE)
                assert not monitor._address_thread.is_alive()
            finally:
                monitor.stop()
    finally:
        threading.excepthook = previous_hook
    assert unhandled == []
    errors = [r.getMessage() for r in caplog.records if r.name == hotplug.__name__ and r.levelno >= logging.ERROR]
    assert errors == [
        "address watch failed ([Errno 1] Operation not permitted); GID counts follow address changes only at resync"
    ]


def test_an_address_on_a_stack_of_uppers_refreshes_the_device_below(tree: Path) -> None:
    """A macvlan on a VLAN of the port's netdev (a container's address on a tagged RoCE port): its GID is
    the port's, two lower links down."""
    collector, netdev = cached_with_netdev(tree)
    net = tree / "class" / "net"
    for upper, lower in ((f"{netdev}.100", netdev), ("mv0", f"{netdev}.100")):
        (net / upper).mkdir()
        os.symlink(f"../{lower}", net / upper / f"lower_{lower}")
    (real_dir(tree, "mlx5_1") / "fw_ver").write_text("99.0.0\n")
    assert apply_address_change(collector.inventory, "mv0", tree) == "device mlx5_1"
    assert fw_of(collector, "mlx5_1") == "99.0.0"


def test_an_address_on_the_second_port_of_a_two_port_device_refreshes_it(tree: Path) -> None:
    """A two-port function (a ConnectX-3 VPI): an address on port 2's netdev adds a GID of port 2, so the
    device is refreshed although port 1's netdev did not change."""
    device = real_dir(tree, "mlx5_1")
    shutil.copytree(device / "ports" / "1", device / "ports" / "2", symlinks=True)
    own = next((device / "device" / "net").iterdir())
    second = own.with_name(f"{own.name}d1")  # the mlx4 name of a port-2 netdev
    second.mkdir()
    (second / "dev_port").write_text("1\n")
    collector = udev_collector(tree)
    fw_of(collector, "mlx5_0")
    assert [port.netdevs for port in collector.inventory.cached()["mlx5_1"].ports] == [(own.name,), (second.name,)]
    (device / "fw_ver").write_text("99.0.0\n")
    assert apply_address_change(collector.inventory, second.name, tree) == "device mlx5_1"
    assert fw_of(collector, "mlx5_1") == "99.0.0"


def test_changes_to_container_veths_are_neither_counted_nor_logged_at_info(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A busy Kubernetes node creates a veth, and addresses on it, for every pod: those refresh nothing and
    must not fill the info log (nor count as events, which tests and debug logs rely on)."""
    collector = udev_collector(tree)
    fw_of(collector, "mlx5_0")
    monitor = HotplugMonitor(FakeMonitor(), "kernel", lambda: collector.inventory, sys_root=tree)
    with caplog.at_level(logging.INFO, logger="rdma_exporter.hotplug"):
        monitor.handle(Event("add", "net", "veth1a2b", "/devices/virtual/net/veth1a2b"))
        monitor.handle_address("add", "veth1a2b")
    assert (monitor.seen, monitor.events) == (2, 0)
    assert [r.getMessage() for r in caplog.records if r.name == hotplug.__name__ and r.levelno >= logging.INFO] == []
    netdev = collector.inventory.cached()["mlx5_1"].ports[0].netdevs[0]
    with caplog.at_level(logging.INFO, logger="rdma_exporter.hotplug"):
        monitor.handle_address("add", netdev)
    assert monitor.events == 1
    logged = [r.getMessage() for r in caplog.records if r.name == hotplug.__name__]
    assert logged == [f"address add on {netdev}: refreshing device mlx5_1"]


def test_a_flood_of_address_changes_on_one_netdev_is_logged_at_info_once_a_minute(
    tree: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A router advertisement flood on a RoCE segment sends an address change per advertisement: each one
    that finds the device cached (a scrape came in between) still refreshes it, but the info log gets one
    line per netdev and minute, the rest go to debug."""
    collector = udev_collector(tree)
    fw_of(collector, "mlx5_0")
    monitor = HotplugMonitor(FakeMonitor(), "kernel", lambda: collector.inventory, sys_root=tree)
    netdev = collector.inventory.cached()["mlx5_1"].ports[0].netdevs[0]
    other = collector.inventory.cached()["mlx5_2"].ports[0].netdevs[0]
    clock = [1000.0]
    monkeypatch.setattr(hotplug, "log_clock", lambda: clock[0])
    with caplog.at_level(logging.DEBUG, logger="rdma_exporter.hotplug"):
        for _ in range(50):
            fw_of(collector, "mlx5_1")  # a scrape between changes: each one has a cache to refresh
            monitor.handle_address("add", netdev)
            clock[0] += 1.0  # 50 changes in 50 s
        fw_of(collector, "mlx5_2")
        monitor.handle_address("add", other)  # another netdev has its own minute
        clock[0] += 10.0
        fw_of(collector, "mlx5_1")
        monitor.handle_address("del", netdev)  # a minute after the first line
    assert monitor.events == 52
    info = [r.getMessage() for r in caplog.records if r.name == hotplug.__name__ and r.levelno >= logging.INFO]
    assert info == [
        f"address add on {netdev}: refreshing device mlx5_1",
        f"address add on {other}: refreshing device mlx5_2",
        f"address del on {netdev}: refreshing device mlx5_1",
    ]


def test_the_address_log_throttle_forgets_netdevs_quiet_for_a_minute(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """VLANs come and go, each with its addresses: the throttle forgets the netdevs whose last info line
    is over a minute old once it remembers 256, so its memory stays bounded."""
    collector = udev_collector(tree)
    fw_of(collector, "mlx5_0")
    monitor = HotplugMonitor(FakeMonitor(), "kernel", lambda: collector.inventory, sys_root=tree)
    netdev = collector.inventory.cached()["mlx5_1"].ports[0].netdevs[0]
    net = tree / "class" / "net"
    clock = [1000.0]
    monkeypatch.setattr(hotplug, "log_clock", lambda: clock[0])
    for vlan in range(1, 301):
        upper = net / f"{netdev}.{vlan}"
        upper.mkdir()
        os.symlink(f"../{netdev}", upper / f"lower_{netdev}")
        fw_of(collector, "mlx5_1")  # a scrape between changes: each one has a cache to refresh
        monitor.handle_address("add", upper.name)
        clock[0] += 1.0  # a new VLAN a second
    assert monitor.events == 300
    assert len(monitor._address_logged) <= 256


def test_an_address_change_is_applied_again_once_the_gid_table_settled(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel writes an address's GID from a workqueue after RTM_NEWADDR went out: a scrape that came
    in between cached the old GID table until the next event or the 15-minute resync. The watch applies
    each change once more after the settle time. (Static info read after the scrape stands in for the
    GID: fw_ver is re-read by the same invalidation, and fw_of shows it.)"""
    collector, netdev = cached_with_netdev(tree)
    name_indexes(monkeypatch, {7: netdev})
    route = FakeRouteSocket()
    settle = 1.0
    monitor = HotplugMonitor(
        FakeMonitor(),
        "kernel",
        lambda: collector.inventory,
        addresses=route,  # type: ignore[arg-type]
        sys_root=tree,
        address_settle_seconds=settle,
    )
    monitor.start()
    try:
        sent = time.monotonic()
        route.items.put(rtnetlink_message(hotplug.RTM_NEWADDR, 7) + rtnetlink_message(hotplug.RTM_NEWADDR, 8))
        assert monitor.wait_for_events(1, 5)
        assert fw_of(collector, "mlx5_1") == "28.41.1000"  # the scrape in between: cached again
        (real_dir(tree, "mlx5_1") / "fw_ver").write_text("99.0.0\n")  # the kernel's late change
        assert fw_of(collector, "mlx5_1") == "28.41.1000"
        assert monitor.wait_for_events(2, 5)
        assert time.monotonic() - sent >= settle
        assert fw_of(collector, "mlx5_1") == "99.0.0"
        # Applied once more, not again and again: nothing is cached-and-invalidated a third time.
        time.sleep(settle * 1.5)
        assert monitor.events == 2
        # And the watch goes on reading changes after a settle.
        (real_dir(tree, "mlx5_1") / "fw_ver").write_text("99.1.0\n")
        route.items.put(rtnetlink_message(hotplug.RTM_DELADDR, 7))
        assert monitor.wait_for_events(3, 5)
        assert fw_of(collector, "mlx5_1") == "99.1.0"
    finally:
        monitor.stop()


class TimedRouteSocket(FakeRouteSocket):
    """A FakeRouteSocket that keeps every timeout the watch set."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float] = []

    def settimeout(self, timeout: float) -> None:
        self.timeouts.append(timeout)
        super().settimeout(timeout)


def test_the_watch_wakes_for_a_settle_due_before_its_usual_second(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a change settling, the watch waits only until it is due, not its usual 1 s: the scrape that
    comes in a late re-apply's extra second caches the old GID table. Told from the timeouts it sets, not
    from timings, which a loaded machine stretches."""
    collector, netdev = cached_with_netdev(tree)
    name_indexes(monkeypatch, {7: netdev})
    route = TimedRouteSocket()
    monitor = HotplugMonitor(
        FakeMonitor(), "kernel", lambda: collector.inventory, addresses=route,  # type: ignore[arg-type]
        sys_root=tree, address_settle_seconds=0.3,
    )  # fmt: skip
    monitor.start()
    try:
        route.items.put(rtnetlink_message(hotplug.RTM_NEWADDR, 7))
        assert monitor.wait_for_events(1, 5)
        fw_of(collector, "mlx5_1")  # a scrape in between caches the device again: the re-apply has work
        assert monitor.wait_for_events(2, 5)
        assert any(0 <= timeout < 1.0 for timeout in route.timeouts), route.timeouts
    finally:
        monitor.stop()


def test_an_address_change_that_cannot_be_applied_costs_that_change_only(
    tree: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An error applying one change is logged and the watch goes on: escaping, it ended the watch thread,
    and every later change was ignored until a restart."""
    collector, netdev = cached_with_netdev(tree)
    name_indexes(monkeypatch, {7: netdev})
    calls = 0

    def inventory() -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("inventory in the middle of a reload")
        return collector.inventory

    route = FakeRouteSocket()
    monitor = HotplugMonitor(
        FakeMonitor(), "kernel", inventory, addresses=route,  # type: ignore[arg-type]
        sys_root=tree, address_settle_seconds=600,
    )  # fmt: skip
    monitor.start()
    try:
        with caplog.at_level(logging.ERROR, logger="rdma_exporter.hotplug"):
            route.items.put(rtnetlink_message(hotplug.RTM_NEWADDR, 7))
            wait_until(lambda: monitor.seen == 1, 5)
            assert monitor.events == 0
            assert any(f"cannot apply an address change on {netdev}" in r.getMessage() for r in caplog.records)
        (real_dir(tree, "mlx5_1") / "fw_ver").write_text("99.0.0\n")
        route.items.put(rtnetlink_message(hotplug.RTM_NEWADDR, 7))
        assert monitor.wait_for_events(1, 5)
        assert fw_of(collector, "mlx5_1") == "99.0.0"
    finally:
        monitor.stop()


def test_the_address_socket_watches_ipv4_and_ipv6_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """RoCE v2 GIDs follow IPv6 addresses too (SLAAC, router advertisements): the socket joins both groups."""
    bound: list[object] = []

    class RecordingSocket:
        def __init__(self, *args: object) -> None:
            self.args = args

        def bind(self, address: object) -> None:
            bound.append(address)

        def close(self) -> None:
            pass

    monkeypatch.setattr(hotplug.socket, "socket", RecordingSocket)
    route = hotplug.open_address_socket()
    assert route is not None
    assert route.args == (socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)  # type: ignore[attr-defined]
    assert bound == [(0, 0x10 | 0x100)]  # RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR, linux/rtnetlink.h


def test_a_daemon_without_uevents_sees_new_devices_before_and_after_a_reload(tree: Path) -> None:
    """No uevents (a tree that is not the kernel's sysfs, a container, a refused uevent socket): the Daemon's
    collector must rescan on every scrape, and so must the one a SIGHUP builds, or an HCA or VF that
    appears is never served until a restart. test_rescan_mode_sees_devices_without_events checks the
    collector build_collector makes; this checks the ones the Daemon makes."""
    link = tree / "class" / "infiniband" / "mlx5_3"
    target = os.readlink(link)
    link.unlink()
    config = replace(Config(), sysfs=tree, listen_address="127.0.0.1:0")
    daemon = Daemon(config, reload=lambda: config)
    try:
        assert daemon.hotplug is None  # rescan mode
        assert devices_of(daemon.exporter.serving.collector) == {"mlx5_0", "mlx5_1", "mlx5_2"}
        link.symlink_to(target)
        assert "mlx5_3" in devices_of(daemon.exporter.serving.collector)
        link.unlink()
        assert daemon._reload()
        assert devices_of(daemon.exporter.serving.collector) == {"mlx5_0", "mlx5_1", "mlx5_2"}
        link.symlink_to(target)  # appears after the reload, without an event
        assert "mlx5_3" in devices_of(daemon.exporter.serving.collector)
    finally:
        daemon.server.shutdown(grace=0)


def test_a_hwmon_device_removed_from_a_cached_device_stops_its_sensors_reads(tree: Path) -> None:
    """A firmware reset or a driver's hwmon teardown removes the function's hwmon device: the cached device
    kept reading the gone sensor files, each scrape adding to rdma_exporter_file_read_errors_total (an
    alert's input) until the 15-minute resync. The removal's event names the device from the cache: its
    hwmon directory, and so the function's infiniband/ beside it, cannot be listed any more."""
    collector = udev_collector(tree)
    function = real_dir(tree, "mlx5_0") / "device"
    hwmon = next((function / "hwmon").iterdir())

    def sensors_and_errors() -> tuple[list[str], float]:
        metrics = scrape_samples(collector)
        sensors = sorted(dict(labels)["sensor"] for (name, labels) in metrics
                         if name == "rdma_device_temperature_celsius" and ("device", "mlx5_0") in labels)  # fmt: skip
        errors = sum(value for (name, labels), value in metrics.items()
                     if name == "rdma_exporter_file_read_errors_total" and ("device", "mlx5_0") in labels)  # fmt: skip
        return sensors, errors

    assert sensors_and_errors() == (["Module0", "asic"], 0)
    devpath = f"/devices/pci0000:00/0000:00:01.0/{function.resolve().name}/hwmon/{hwmon.name}"
    shutil.rmtree(hwmon.resolve())
    assert apply_event(collector.inventory, Event("remove", "hwmon", hwmon.name, devpath)) == "device mlx5_0"
    assert sensors_and_errors() == ([], 0)
    assert sensors_and_errors() == ([], 0)


def test_an_rtnetlink_socket_the_host_refuses_is_a_warning_not_a_failed_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An LSM that allows the uevent socket but not NETLINK_ROUTE (SELinux tells the two apart), or a bind
    refused: the exporter still starts, without the address watch, says why, and leaks no descriptor."""
    opened: list[RefusingBindSocket] = []

    class RefusingBindSocket:
        def __init__(self, *args: object) -> None:
            self.closed = False
            opened.append(self)

        def bind(self, address: object) -> None:
            raise PermissionError(errno.EACCES, "Permission denied")

        def close(self) -> None:
            self.closed = True

    def refused(*args: object) -> socket.socket:
        raise PermissionError(errno.EACCES, "Permission denied")

    with caplog.at_level(logging.WARNING, logger="rdma_exporter.hotplug"):
        monkeypatch.setattr(hotplug.socket, "socket", refused)
        assert hotplug.open_address_socket() is None
        monkeypatch.setattr(hotplug.socket, "socket", RefusingBindSocket)
        assert hotplug.open_address_socket() is None
    assert [route.closed for route in opened] == [True]
    assert [r.getMessage() for r in caplog.records if r.name == hotplug.__name__] == [
        "cannot open an rtnetlink socket ([Errno 13] Permission denied): "
        "GID counts follow address changes only at resync",
        "cannot watch address changes ([Errno 13] Permission denied): GID counts follow them only at resync",
    ]


def test_a_started_monitor_watches_addresses_on_the_tree_it_serves(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """start_monitor gives the monitor its rtnetlink socket and the sysfs root served: without the socket
    GID counts follow addresses only at the resync; with /sys instead of --path.sysfs (a container reading
    the host's sysfs at /host/sys), a VLAN's lower links are looked up in the wrong tree, and an address on
    the VLAN refreshes nothing."""
    import pyudev

    monkeypatch.setattr(hotplug, "is_sysfs_mount", lambda path: True)  # as if `tree` were the host's sysfs
    opened = staticmethod(lambda context, source="udev": OpenedMonitor(source))
    monkeypatch.setattr(pyudev.Monitor, "from_netlink", opened)
    route = FakeRouteSocket()
    monkeypatch.setattr(hotplug, "open_address_socket", lambda: route)
    collector, netdev = cached_with_netdev(tree)
    vlan = tree / "class" / "net" / f"{netdev}.100"  # in the tree only, not in this machine's /sys
    vlan.mkdir()
    os.symlink(f"../{netdev}", vlan / f"lower_{netdev}")
    name_indexes(monkeypatch, {7: vlan.name})
    monitor, mode = start_monitor(tree, lambda: collector.inventory, source="kernel")
    assert monitor is not None, mode
    try:
        (real_dir(tree, "mlx5_1") / "fw_ver").write_text("99.0.0\n")
        route.items.put(rtnetlink_message(hotplug.RTM_NEWADDR, 7))
        assert monitor.wait_for_events(1, UEVENT_DEADLINE)
        assert fw_of(collector, "mlx5_1") == "99.0.0"
    finally:
        monitor.stop()
    assert route.closed


def test_a_socket_closed_by_stop_ends_the_address_watch_without_an_error(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """stop() closes the rtnetlink socket: a watch still in recv() (a thread the 3-s join did not see end)
    then gets EBADF, which is the shutdown and not a failed watch, so nothing is logged as an error."""
    collector = udev_collector(tree)
    route = FakeRouteSocket()
    monitor = HotplugMonitor(FakeMonitor(), "kernel", lambda: collector.inventory, addresses=route)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="rdma_exporter.hotplug"):
        monitor.start()
        try:
            wait_until(lambda: route.timeout is not None, UEVENT_DEADLINE)  # the watch is reading
            monitor._stop.set()  # stop() under way ...
            route.items.put(OSError(errno.EBADF, "Bad file descriptor"))  # ... and its close() seen by recv()
            assert monitor._address_thread is not None
            monitor._address_thread.join(UEVENT_DEADLINE)
            assert not monitor._address_thread.is_alive()
        finally:
            monitor.stop()
    assert [r.getMessage() for r in caplog.records if r.name == hotplug.__name__] == []


def test_an_address_change_is_applied_again_only_after_the_default_settle_time(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A monitor built without a settle time, as start_monitor builds it, waits the default one before it
    applies an address change again, and then does: a re-apply straight after the change comes before
    the kernel's GID work, and so re-reads the same stale GID table; none leaves it stale until the
    15-minute resync."""
    collector, netdev = cached_with_netdev(tree)
    name_indexes(monkeypatch, {7: netdev})
    route = FakeRouteSocket()
    monitor = HotplugMonitor(FakeMonitor(), "kernel", lambda: collector.inventory, addresses=route)  # type: ignore[arg-type]
    monitor.start()
    try:
        sent = time.monotonic()
        route.items.put(rtnetlink_message(hotplug.RTM_NEWADDR, 7))
        wait_until(lambda: monitor.seen >= 1, UEVENT_DEADLINE)
        # The default is 2 s: stated here, not read from the module, so that changing it fails this test.
        time.sleep(max(0.0, sent + 1.5 - time.monotonic()))
        assert monitor.seen == 1  # not yet applied again
        wait_until(lambda: monitor.seen >= 2, 0.5 + UEVENT_DEADLINE)
        assert time.monotonic() - sent >= 2.0
    finally:
        monitor.stop()
