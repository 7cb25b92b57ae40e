"""The node's boot time, exported for the rules' reboot guard (instance:rdma_exporter_node_rebooted:*)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rdma_exporter.config import Config
from rdma_exporter.daemon import build_collector, node_boot_time

from conftest import SYSFS_FIXTURES, samples


def proc_stat_btime() -> int:
    stat = Path("/proc/stat").read_text()
    return next(int(line.split()[1]) for line in stat.splitlines() if line.startswith("btime "))


def test_the_boot_time_is_the_kernels_btime() -> None:
    # Computed from clocks, since the shipped unit's ProcSubset=pid hides /proc/stat; the kernel's btime
    # is the same difference, so at most a second apart (the two reads straddling a second).
    assert abs(node_boot_time() - proc_stat_btime()) <= 1


def test_the_exporter_serves_the_boot_time() -> None:
    collector = build_collector(Config(sysfs=SYSFS_FIXTURES / "prometheus-procfs" / "sys"))
    served = samples(collector.gather().render_text().decode())
    assert abs(served[("rdma_exporter_node_boot_time_seconds", ())] - proc_stat_btime()) <= 1


def test_a_reload_after_a_clock_step_keeps_the_boot_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # Review: a reload (a new collector) computed it again, so a wall-clock step since start-up (chrony's
    # first sync) moved it as a reboot would, and the rules took an hour for one.
    config = Config(sysfs=SYSFS_FIXTURES / "prometheus-procfs" / "sys")
    first = build_collector(config).boot_time
    stepped = time.time() + 300
    monkeypatch.setattr(time, "time", lambda: stepped)
    assert build_collector(config).boot_time == first


def test_boot_time_counts_the_time_the_node_was_suspended(monkeypatch: pytest.MonkeyPatch) -> None:
    """CLOCK_MONOTONIC stops while the node (or its VM) is suspended, CLOCK_BOOTTIME does not: a boot
    time taken from the monotonic clock moves forward by every suspension, which the rules read as a
    reboot, and disagrees with node_exporter's node_boot_time_seconds (btime)."""
    clocks = {time.CLOCK_BOOTTIME: 5000.0, time.CLOCK_MONOTONIC: 3000.0}  # suspended for 2000 s
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)
    monkeypatch.setattr(time, "clock_gettime", lambda clock: clocks[clock])
    assert node_boot_time.__wrapped__() == 1_700_000_000 - 5000  # type: ignore[attr-defined]
