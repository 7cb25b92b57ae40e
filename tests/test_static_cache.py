"""Steady state reads no static file and each counter file at most once (issue 7's file target).

Every path opened through the sysfs reader is recorded over two in-process scrapes of the generated
sample tree, with one collector kept across them as the daemon does.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest
from prometheus_client import generate_latest

from rdma_exporter.config import Config
from rdma_exporter.daemon import build_collector, build_registry
from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree

from conftest import record_reads

# Identity files: they change only with a uevent (hotplug, driver reload, firmware reset, netdev moves).
STATIC_NAMES = frozenset(
    {
        "node_guid", "sys_image_guid", "fw_ver", "hca_type", "board_id", "hw_rev", "node_desc", "node_type",
        "link_layer", "ifindex", "type", "address", "dev_port", "dev_id", "phys_port_name", "max_link_speed",
        "max_link_width", "vendor", "device", "numa_node",
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
