"""The node's boot time: read once from /proc/stat, exported for the rules' reboot guard."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rdma_exporter.config import Config
from rdma_exporter.daemon import build_collector, node_boot_time
from rdma_exporter.parse.node import parse_boot_time, read_boot_time

from conftest import SYSFS_FIXTURES, samples

# The head and tail of a real /proc/stat (Linux 6.1), per-CPU and interrupt lines cut short.
STAT = """cpu  4705 356 1836 2306733 1093 0 1003 0 0 0
cpu0 2313 179 912 1153422 544 0 571 0 0 0
intr 1126430 0 9 0 0 0 0 0 0 1 0 0 0 146 0 0
ctxt 2137463
btime 1764403207
processes 25914
procs_running 1
procs_blocked 0
softirq 1000483 2 131204 1 6357 47364 0 1337 464420 0 349798
"""


def test_boot_time_is_the_btime_line() -> None:
    assert parse_boot_time(STAT) == 1764403207


@pytest.mark.parametrize("text", ["", STAT.replace("btime", "boot"), "btime \n", "btime 17644O3207\n", "btime ١٢\n"])
def test_a_stat_without_a_readable_btime_gives_none(text: str) -> None:
    assert parse_boot_time(text) is None


def test_the_exporter_serves_this_nodes_boot_time() -> None:
    stat = Path("/proc/stat").read_text()
    btime = next(int(line.split()[1]) for line in stat.splitlines() if line.startswith("btime "))
    assert read_boot_time() == btime
    collector = build_collector(Config(sysfs=SYSFS_FIXTURES / "prometheus-procfs" / "sys"))
    served = samples(collector.gather().render_text().decode())
    assert served[("rdma_exporter_node_boot_time_seconds", ())] == btime


def test_an_unreadable_stat_costs_only_the_boot_time(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rdma_exporter.daemon"):
        assert node_boot_time(str(tmp_path / "missing")) is None
        (tmp_path / "stat").write_text("cpu 1 2 3\n")
        assert node_boot_time(str(tmp_path / "stat")) is None
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        f"cannot read the node's boot time from {tmp_path / 'missing'}: No such file or directory",
        f"cannot read the node's boot time from {tmp_path / 'stat'}: no btime line",
    ]
