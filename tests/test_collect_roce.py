"""RoCE and Ethernet collectors (netdev, ethtool, pcie) on the sample tree, on LAG trees, and under faults.

The acceptance list of issue 3 is checked on the bundled sample tree: PFC pause frames and durations per
priority and direction, pause storm events, discards, ECN state, CNP counters and the PCIe link of a
device that trained below its maximum, all joinable with rdma_port_info on device/port.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import struct
from array import array
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Final

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rdma_exporter.collect import ethtool as ethtool_collector
from rdma_exporter.collect import netdev as netdev_collector
from rdma_exporter.collect.base import FamilySet, ScrapeContext
from rdma_exporter.collect.ethtool import (
    CURATED_LABELS,
    CURATED_RENAMES,
    CURATED_SPECS,
    EthtoolReading,
    EthtoolSource,
    check_extra_stats,
    lint_safe,
    live_sysfs,
    metric_name,
    scaled,
)
from rdma_exporter.collect.infiniband import HW_COUNTER_HELP
from rdma_exporter.collect.netdev import NetdevSource
from rdma_exporter.config import Config, ConfigError, load_config_file, parse_config
from rdma_exporter.daemon import build_collector, build_registry
from rdma_exporter.parse.ethtool import (
    CURATED_HELP,
    ETH_GSTRING_LEN,
    ETH_SS_STATS,
    ETHTOOL_GSSET_INFO,
    ETHTOOL_GSTATS,
    ETHTOOL_GSTRINGS,
    MAX_EXTRA_STATS,
    CuratedStat,
    curate,
    parse_stats_text,
)
from rdma_exporter.parse.infiniband import read_device_info
from rdma_exporter.parse.netdev import NetdevIdentity
from rdma_exporter.parse.reader import NO_VALUE_ERRNOS, SysfsReader, is_sysfs_mount
from rdma_exporter.sample_tree import SAMPLE_SPEC, TreeSpec, build_tree, spec_for_devices

from conftest import (
    FIXTURES,
    prometheus_text,
    promtool_check_metrics,
    samples,
    skip_or_fail,
    symlink,
    write_files,
    write_hwmon,
)

ROCE = {"mlx5_8": "enp220s0f0np0", "mlx5_9": "enp220s0f1np1"}
Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# --- helpers ---------------------------------------------------------------------------------------------


def value(metrics: Sample, name: str, **labels: str) -> float | None:
    """The sample whose labels include `labels` (exactly one must match, or None)."""
    found = [v for (n, ls), v in metrics.items() if n == name and labels.items() <= dict(ls).items()]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def series(metrics: Sample, prefix: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {key for key in metrics if key[0].startswith(prefix)}


def capture(directory: Path, netdev: str) -> dict[str, int]:
    """An ethtool -S capture read independently of the parser under test."""
    values = {}
    for line in (directory / netdev).read_text().splitlines()[1:]:
        name, _, number = line.strip().rpartition(": ")
        values[name] = int(number)
    return values


def sysfs_int(path: Path) -> int:
    return int(path.read_text().strip())


class Exporter:
    """One collector kept across scrapes (error counters are cumulative), with an optional fake ioctl."""

    def __init__(self, sys_root: Path, ethtool_dir: Path | None = None, config: Config | None = None) -> None:
        config = replace(config or Config(), sysfs=sys_root, ethtool_dir=ethtool_dir)
        self.collector = build_collector(config)
        self.registry = build_registry(self.collector)

    @property
    def ethtool(self) -> EthtoolSource:
        return next(s for s in self.collector.sources if isinstance(s, EthtoolSource))

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def scrape(self) -> Sample:
        return samples(self.text())


class FakeNics:
    """SIOCETHTOOL answered like a kernel with these NICs, per interface; faults are set per interface."""

    def __init__(self, stats: dict[str, dict[str, int]]) -> None:
        self.stats = {name: list(values.items()) for name, values in stats.items()}
        self.errno: dict[str, int] = {}
        self.growing: set[str] = set()  # the stat set changes size on every call (channels being added)
        self.calls: Counter[str] = Counter()

    def __call__(self, ifname: str, buffer: array) -> None:
        self.calls[ifname] += 1
        if ifname in self.errno:
            raise OSError(self.errno[ifname], os.strerror(self.errno[ifname]))
        if ifname not in self.stats:
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        current = self.stats[ifname]
        if ifname in self.growing:
            current = current + [(f"ch{n}_poll", n) for n in range(self.calls[ifname])]
        (cmd,) = struct.unpack_from("=I", buffer, 0)
        if cmd == ETHTOOL_GSSET_INFO:
            struct.pack_into("=QI", buffer, 8, 1 << ETH_SS_STATS, len(current))
        elif cmd == ETHTOOL_GSTRINGS:
            (asked,) = struct.unpack_from("=I", buffer, 8)
            n = len(current) if asked == len(current) else 0  # kernels with the 2025 length check
            struct.pack_into("=I", buffer, 8, n)
            for i, (name, _) in enumerate(current[:n]):
                struct.pack_into(f"{ETH_GSTRING_LEN}s", buffer, 12 + i * ETH_GSTRING_LEN, name.encode())
        elif cmd == ETHTOOL_GSTATS:
            (asked,) = struct.unpack_from("=I", buffer, 4)
            n = len(current) if asked == len(current) else 0
            struct.pack_into("=I", buffer, 4, n)
            for i, (_, number) in enumerate(current[:n]):
                struct.pack_into("=Q", buffer, 8 + i * 8, number)
        else:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("roce") / "t"
    build_tree(dest, SAMPLE_SPEC)
    return dest


@pytest.fixture(scope="module")
def sample_text(sample: Path) -> str:
    return Exporter(sample / "sys", sample / "ethtool").text()


@pytest.fixture(scope="module")
def metrics(sample_text: str) -> Sample:
    return samples(sample_text)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A writable sample tree of its own, for fault injection."""
    dest = tmp_path / "t"
    build_tree(dest, SAMPLE_SPEC)
    return dest


def fake_nics(tree: Path) -> FakeNics:
    return FakeNics({netdev: parse_stats_text((tree / "ethtool" / netdev).read_text()) for netdev in ROCE.values()})


# --- acceptance on the sample tree ----------------------------------------------------------------------


@pytest.mark.parametrize("device", sorted(ROCE))
def test_pfc_pause_frames_and_durations_per_priority_and_direction(
    sample: Path, metrics: Sample, device: str
) -> None:
    netdev = ROCE[device]
    raw = capture(sample / "ethtool", netdev)
    port = {"device": device, "port": "1", "netdev": netdev}
    for direction in ("rx", "tx"):
        prio3 = {**port, "direction": direction, "priority": "3"}
        frames = value(metrics, "rdma_ethtool_pfc_pause_frames_total", **prio3)
        assert frames == raw[f"{direction}_prio3_pause"] > 0
        seconds = value(metrics, "rdma_ethtool_pfc_pause_duration_seconds_total", **prio3)
        assert seconds == raw[f"{direction}_prio3_pause_duration"] / 1e6 > 0  # microseconds in ethtool
    transitions = {**port, "direction": "rx", "priority": "3"}
    assert value(metrics, "rdma_ethtool_pfc_pause_transitions_total", **transitions) == raw["rx_prio3_pause_transition"]
    # mlx5 lists pause counters only for priorities with PFC on: nothing is invented for the others.
    priorities = {dict(ls)["priority"] for (n, ls) in metrics if n == "rdma_ethtool_pfc_pause_frames_total"}
    assert priorities == {"3"}
    mac_pause = value(metrics, "rdma_ethtool_pause_mac_control_frames_total", **port, direction="rx")
    assert mac_pause == raw["rx_pause_ctrl_phy"]


@pytest.mark.parametrize("device", sorted(ROCE))
def test_pause_storms_discards_and_phy_errors(sample: Path, metrics: Sample, device: str) -> None:
    netdev = ROCE[device]
    raw = capture(sample / "ethtool", netdev)
    port = {"device": device, "port": "1", "netdev": netdev}
    expected = {
        ("rdma_ethtool_pause_storm_warning_events_total", "tx"): "tx_pause_storm_warning_events",
        ("rdma_ethtool_pause_storm_error_events_total", "tx"): "tx_pause_storm_error_events",
        ("rdma_ethtool_port_discards_total", "rx"): "rx_discards_phy",
        ("rdma_ethtool_port_discards_total", "tx"): "tx_discards_phy",
        ("rdma_ethtool_out_of_buffer_total", "rx"): "rx_out_of_buffer",
        ("rdma_ethtool_pcs_symbol_errors_total", "rx"): "rx_pcs_symbol_err_phy",
        ("rdma_ethtool_symbol_error_packets_total", "rx"): "rx_symbol_err_phy",
        ("rdma_ethtool_crc_error_packets_total", "rx"): "rx_crc_errors_phy",
        ("rdma_ethtool_corrected_bit_errors_total", "rx"): "rx_corrected_bits_phy",
        ("rdma_ethtool_port_bit_count_total", "rx"): "rx_bits_phy",
        ("rdma_ethtool_port_bytes_total", "rx"): "rx_bytes_phy",
        ("rdma_ethtool_pci_signal_integrity_errors_total", "rx"): "rx_pci_signal_integrity",
    }
    for (name, direction), source in expected.items():
        assert value(metrics, name, **port, direction=direction) == raw[source], name
    assert value(metrics, "rdma_ethtool_link_down_events_total", **port) == raw["link_down_events_phy"]
    for priority in map(str, range(8)):
        prio = {**port, "direction": "rx", "priority": priority}
        for name, source in (("buffer_discards", "buf_discard"), ("congestion_discards", "cong_discard"),
                             ("ecn_marked_packets", "marked"), ("discards", "discards")):  # fmt: skip
            assert value(metrics, f"rdma_ethtool_priority_{name}_total", **prio) == raw[f"rx_prio{priority}_{source}"]
    for lane in range(4):
        lane_labels = {**port, "direction": "rx", "lane": str(lane)}
        assert value(metrics, "rdma_ethtool_lane_raw_errors_total", **lane_labels) == raw[f"rx_err_lane_{lane}_phy"]
    stalled = {**port, "operation": "read"}
    stalled_seconds = value(metrics, "rdma_ethtool_pci_outbound_stalled_seconds_total", **stalled)
    assert stalled_seconds == raw["outbound_pci_stalled_rd_events"]
    assert value(metrics, "rdma_ethtool_pci_outbound_stalled_ratio", **stalled) == raw["outbound_pci_stalled_rd"] / 100


def test_faulty_roce_ports_show_nonzero_discards_and_link_errors(tmp_path: Path) -> None:
    # mlx5_8's host side is slow (PCIe faults, buffer discards; the link is shared with mlx5_9, the
    # BlueField's other port); mlx5_9 lost its network link.
    build_tree(tmp_path / "t", TreeSpec(degraded_pcie=("mlx5_8", "mlx5_9"), down_ports=("mlx5_9",)))
    metrics = Exporter(tmp_path / "t" / "sys", tmp_path / "t" / "ethtool").scrape()
    slow = {"device": "mlx5_8", "port": "1", "netdev": ROCE["mlx5_8"]}
    raw = capture(tmp_path / "t" / "ethtool", ROCE["mlx5_8"])
    assert value(metrics, "rdma_ethtool_port_discards_total", **slow, direction="rx") == raw["rx_discards_phy"] > 0
    # A single-host NIC counts its buffer drops per priority in rx_prioN_discards; the per-host
    # rx_prioN_buf_discard of multi-host NICs stays 0.
    assert value(metrics, "rdma_ethtool_priority_discards_total", **slow, direction="rx", priority="3") > 0
    assert value(metrics, "rdma_ethtool_priority_buffer_discards_total", **slow, direction="rx", priority="3") == 0
    assert value(metrics, "rdma_ethtool_out_of_buffer_total", **slow, direction="rx") == raw["rx_out_of_buffer"] > 0
    assert value(metrics, "rdma_ethtool_pci_signal_integrity_errors_total", **slow, direction="tx") > 0
    assert value(metrics, "rdma_pcie_link_speed_transfers_per_second", device="mlx5_8") == 16e9
    down = {"device": "mlx5_9", "port": "1", "netdev": ROCE["mlx5_9"]}
    assert value(metrics, "rdma_ethtool_link_down_events_total", **down) > 0
    assert value(metrics, "rdma_ethtool_pcs_symbol_errors_total", **down, direction="rx") > 0
    assert value(metrics, "rdma_netdev_up", **down) == 0
    assert value(metrics, "rdma_netdev_carrier", **down) == 0
    assert value(metrics, "rdma_netdev_speed_bytes_per_second", **down) is None  # SPEED_UNKNOWN
    assert value(metrics, "rdma_netdev_carrier_down_changes_total", **down) == 1 + value(
        metrics, "rdma_netdev_carrier_up_changes_total", **down
    )


@pytest.mark.parametrize("device", sorted(ROCE))
def test_ecn_enabled_on_the_roce_priority_only(metrics: Sample, device: str) -> None:
    port = {"device": device, "port": "1", "netdev": ROCE[device]}
    for role in ("np", "rp"):
        states = {p: value(metrics, "rdma_netdev_ecn_enabled", **port, role=role, priority=str(p)) for p in range(8)}
        assert states == {p: 1.0 if p == 3 else 0.0 for p in range(8)}


@pytest.mark.parametrize("device", sorted(ROCE))
def test_cnp_counters_and_their_help(sample: Path, sample_text: str, metrics: Sample, device: str) -> None:
    hw = sample / "sys" / "class" / "infiniband" / device / "ports" / "1" / "hw_counters"
    port = {"device": device, "port": "1"}
    congestion = ("np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored", "roce_adp_retrans")
    for counter in congestion:
        assert value(metrics, f"rdma_port_hw_{counter}_total", **port) == sysfs_int(hw / counter)
    assert value(metrics, "rdma_port_hw_np_cnp_sent_total", **port) > 0
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", sample_text, re.MULTILINE))
    assert "notification point" in helps["rdma_port_hw_np_cnp_sent_total"]
    assert "ecn/roce_rp/enable" in helps["rdma_port_hw_rp_cnp_ignored_total"]


def test_rnr_nak_retry_err_help_counts_received_naks_not_exhausted_retries(sample_text: str) -> None:
    # mlx5 and bnxt_re count each RNR NAK received in rnr_nak_retry_err (NVIDIA's mlx5 counter descriptions:
    # "The QP retry limit was not exceeded"; bnxt_re exports its rnr_naks_rcvd under this name). Running
    # out of RNR retries is req_rnr_retries_exceeded (mlx5 counters.c, extended_err_cnts).
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", sample_text, re.MULTILINE))
    rnr = helps["rdma_port_hw_rnr_nak_retry_err_total"]
    assert "received" in rnr and "not exceeded" in rnr
    assert "exceeded (the QP went to error)" in HW_COUNTER_HELP["req_rnr_retries_exceeded"]


# hw_counters names mlx5_ib registers (drivers/infiniband/hw/mlx5/counters.c: basic, out-of-sequence,
# retransmission, extended error, RoCE acceleration, congestion, PPCNT and optional op counters).
MLX5_IB_HW_COUNTERS = frozenset(
    {
        "rx_write_requests", "rx_read_requests", "rx_atomic_requests", "rx_dct_connect", "out_of_buffer",
        "out_of_sequence", "duplicate_request", "rnr_nak_retry_err", "packet_seq_err", "implied_nak_seq_err",
        "local_ack_timeout_err", "resp_local_length_error", "resp_cqe_error", "req_cqe_error",
        "req_remote_invalid_request", "req_remote_access_errors", "resp_remote_access_errors",
        "resp_cqe_flush_error", "req_cqe_flush_error", "req_transport_retries_exceeded",
        "req_rnr_retries_exceeded", "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart",
        "roce_slow_restart_cnps", "roce_slow_restart_trans", "rp_cnp_ignored", "rp_cnp_handled",
        "np_ecn_marked_roce_packets", "np_cnp_sent", "rx_icrc_encapsulated", "cc_rx_ce_pkts", "cc_rx_cnp_pkts",
        "cc_tx_cnp_pkts", "rdma_tx_packets", "rdma_tx_bytes", "rdma_rx_packets", "rdma_rx_bytes",
    }
)


# bnxt_re's error, congestion and out-of-buffer counters as the mainline kernel names them
# (drivers/infiniband/hw/bnxt_re/hw_counters.c); Broadcom's own driver uses the mlx5 names instead, and
# so does the mainline one since its rename of August 2025, but for np_cnp_pkts.
BNXT_RE_HW_COUNTERS = frozenset(
    {
        "to_retransmits", "seq_err_naks_rcvd", "rnr_naks_rcvd", "missing_resp", "max_retry_exceeded",
        "rx_out_of_buffer", "tx_cnp_pkts", "rx_cnp_pkts", "rx_ecn_marked_pkts", "np_cnp_pkts",
        "recoverable_errors", "rx_roce_errors", "rx_roce_discards",  # both drivers' names
    }
)


def test_hw_counter_help_names_only_counters_the_driver_has() -> None:
    # A HELP for a name no driver registers is a meaning given to a file that never exists.
    assert set(HW_COUNTER_HELP) <= MLX5_IB_HW_COUNTERS | BNXT_RE_HW_COUNTERS


def test_netdev_link_and_statistics(sample: Path, metrics: Sample) -> None:
    for device, netdev in ROCE.items():
        port = {"device": device, "port": "1", "netdev": netdev}
        net = sample / "sys" / "class" / "net" / netdev
        assert value(metrics, "rdma_netdev_up", **port) == 1
        assert value(metrics, "rdma_netdev_carrier", **port) == 1
        assert value(metrics, "rdma_netdev_speed_bytes_per_second", **port) == 200e9 / 8
        assert value(metrics, "rdma_netdev_mtu_bytes", **port) == 9000
        assert value(metrics, "rdma_netdev_carrier_changes_total", **port) == sysfs_int(net / "carrier_changes")
        assert value(metrics, "rdma_netdev_carrier_down_changes_total", **port) == sysfs_int(net / "carrier_down_count")
        for stat in os.listdir(net / "statistics"):
            assert value(metrics, f"rdma_netdev_{stat}_total", **port) == sysfs_int(net / "statistics" / stat)
    # IPoIB interfaces get the netdev series too (with no ECN), but no ethtool ones.
    ipoib = {"device": "mlx5_0", "port": "1", "netdev": "ibp24s0"}
    assert value(metrics, "rdma_netdev_mtu_bytes", **ipoib) == 4092
    assert not [k for k in metrics if k[0].startswith("rdma_ethtool_") and dict(k[1])["netdev"].startswith("ib")]
    assert not [k for k in metrics if k[0] == "rdma_netdev_ecn_enabled" and dict(k[1])["netdev"].startswith("ib")]
    assert not series(metrics, "rdma_ethtool_stat_"), "extras are opt-in"


def test_pcie_link_below_max(metrics: Sample) -> None:
    assert value(metrics, "rdma_pcie_link_speed_transfers_per_second", device="mlx5_5") == 16e9
    assert value(metrics, "rdma_pcie_link_max_speed_transfers_per_second", device="mlx5_5") == 32e9
    assert value(metrics, "rdma_pcie_link_width_lanes", device="mlx5_5") == 16
    assert value(metrics, "rdma_pcie_link_max_width_lanes", device="mlx5_5") == 16
    for n in (0, 4, 8, 9):
        assert value(metrics, "rdma_pcie_link_speed_transfers_per_second", device=f"mlx5_{n}") == 32e9
    # The degraded link's correctable errors, per type and as the kernel's report total.
    correctable = {("device", "mlx5_5"), ("error_class", "correctable")}
    aer = [(dict(ls), v) for (n, ls), v in metrics.items() if n == "rdma_pcie_aer_errors_total"]
    aer = [(labels, v) for labels, v in aer if correctable <= labels.items()]
    types = {labels["type"]: v for labels, v in aer}
    assert types["RxErr"] > 0 and types["BadDLLP"] > 0
    reports = value(metrics, "rdma_pcie_aer_reports_total", device="mlx5_5", error_class="correctable")
    assert reports == sum(types.values())  # the sample writes one report per error
    assert value(metrics, "rdma_pcie_aer_reports_total", device="mlx5_0", error_class="fatal") == 0


def test_vfs_report_no_pcie_link_of_their_own(tmp_path: Path) -> None:
    build_tree(tmp_path / "t", spec_for_devices(16))  # 8 IB PFs with one VF each: mlx5_8..mlx5_15
    metrics = Exporter(tmp_path / "t" / "sys", tmp_path / "t" / "ethtool").scrape()
    linked = {dict(ls)["device"] for (n, ls) in metrics if n == "rdma_pcie_link_width_lanes"}
    assert linked == {f"mlx5_{n}" for n in range(8)}
    assert value(metrics, "rdma_device_sriov_virtual_function", device="mlx5_8") == 1
    assert not [k for k in metrics if k[0].startswith("rdma_pcie_") and dict(k[1])["device"] == "mlx5_8"]


def test_every_series_joins_a_port_or_device(metrics: Sample) -> None:
    ports = {(dict(ls)["device"], dict(ls)["port"]) for (n, ls) in metrics if n == "rdma_port_info"}
    devices = {dict(ls)["device"] for (n, ls) in metrics if n == "rdma_device_info"}
    joined = 0
    for name, labels in metrics:
        if name.startswith(("rdma_netdev_", "rdma_ethtool_")):
            assert (dict(labels)["device"], dict(labels)["port"]) in ports, (name, labels)
            joined += 1
        elif name.startswith("rdma_pcie_"):
            assert dict(labels)["device"] in devices
    assert joined > 300  # RoCE netdevs' and ethtool's; IPoIB statistics/ are off by default
    ethernet = {dict(ls)["device"] for (n, ls) in metrics if n == "rdma_port_info" and ("link_layer", "Ethernet") in ls}
    assert ethernet == set(ROCE)


def check_unique_and_promtool(text: str) -> None:
    keys = [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert [k for k, n in Counter(keys).items() if n > 1] == []
    promtool_check_metrics(text)


def test_no_duplicate_series_and_promtool_clean(sample_text: str) -> None:
    check_unique_and_promtool(sample_text)


def test_no_read_errors_on_the_sample(metrics: Sample) -> None:
    assert series(metrics, "rdma_exporter_file_read_errors_total") == set()
    for collector in ("netdev", "ethtool", "pcie"):
        assert value(metrics, "rdma_exporter_scrape_collector_success", collector=collector) == 1


def test_ioctl_path_gives_the_same_series_as_the_captures(tree: Path, metrics: Sample) -> None:
    exporter = Exporter(tree / "sys")
    nics = exporter.ethtool.call = fake_nics(tree)
    got = exporter.scrape()
    assert series(got, "rdma_ethtool_") == series(metrics, "rdma_ethtool_")
    assert all(got[key] == metrics[key] for key in series(metrics, "rdma_ethtool_"))
    # One read (GSSET_INFO, GSTRINGS, GSTATS, GSTRINGS again) per RoCE netdev and scrape; IPoIB
    # interfaces are never asked.
    assert dict(nics.calls) == {netdev: 4 for netdev in ROCE.values()}


def test_fixture_tree_without_captures_reads_no_ethtool(tree: Path) -> None:
    # The tree's netdev names mean nothing to this host's kernel: no ioctl, no error, no series.
    if live_sysfs(str(tree / "sys")):
        skip_or_fail("cannot tell a sysfs mount from a directory here (/proc/self/mountinfo unreadable)")
    metrics = Exporter(tree / "sys").scrape()
    assert series(metrics, "rdma_ethtool_") == set()
    assert series(metrics, "rdma_exporter_file_read_errors_total") == set()
    assert value(metrics, "rdma_netdev_up", device="mlx5_8", port="1") == 1


@pytest.mark.parametrize("device", sorted(ROCE))
def test_module_events_and_frame_size_errors(sample: Path, metrics: Sample, device: str) -> None:
    netdev = ROCE[device]
    raw = capture(sample / "ethtool", netdev)
    port = {"device": device, "port": "1", "netdev": netdev}
    for event in ("bus_stuck", "high_temp", "bad_shorted", "unplug"):
        assert value(metrics, "rdma_ethtool_module_events_total", **port, event=event) == raw[f"module_{event}"]
    expected = {
        ("rdma_ethtool_oversize_packets_total", "rx"): "rx_oversize_pkts_phy",
        ("rdma_ethtool_out_of_range_length_packets_total", "rx"): "rx_out_of_range_len_phy",
        ("rdma_ethtool_in_range_length_error_packets_total", "rx"): "rx_in_range_len_errors_phy",
        ("rdma_ethtool_undersize_packets_total", "rx"): "rx_undersize_pkts_phy",
        ("rdma_ethtool_fragment_packets_total", "rx"): "rx_fragments_phy",
        ("rdma_ethtool_jabber_packets_total", "rx"): "rx_jabbers_phy",
        ("rdma_ethtool_port_errors_total", "tx"): "tx_errors_phy",
    }
    for (name, direction), source in expected.items():
        assert value(metrics, name, **port, direction=direction) == raw[source], name


@pytest.mark.parametrize("device", sorted(ROCE))
def test_curated_stats_counts_the_netdevs_curated_series(metrics: Sample, device: str) -> None:
    port = {"device": device, "port": "1", "netdev": ROCE[device]}
    curated = [
        (n, ls)
        for n, ls in metrics
        if n.startswith("rdma_ethtool_")
        and not n.startswith(("rdma_ethtool_stat_", "rdma_ethtool_curated_stats", "rdma_ethtool_extra_stats_"))
        and port.items() <= dict(ls).items()
    ]
    assert value(metrics, "rdma_ethtool_curated_stats", **port) == len(curated) > 50


def bnxt_and_ice_tree(tree: Path) -> None:
    """The sample tree with mlx5_8's netdev answering like bnxt_en and mlx5_9's like ice (synthetic captures)."""
    for device, capture_name in (("mlx5_8", "bnxt_en_synthetic_pfc_prio3.txt"),
                                 ("mlx5_9", "ice_e810_synthetic_pfc_prio3.txt")):  # fmt: skip
        (tree / "ethtool" / ROCE[device]).write_text((FIXTURES / "ethtool" / capture_name).read_text())


def test_bnxt_en_and_ice_stats_feed_the_mlx5_families(tree: Path) -> None:
    bnxt_and_ice_tree(tree)
    exporter = Exporter(tree / "sys", tree / "ethtool")
    text = exporter.text()
    metrics = samples(text)
    bnxt = {"device": "mlx5_8", "port": "1", "netdev": ROCE["mlx5_8"]}
    expected = {
        # (metric, labels beyond the netdev's): value in base units (durations from microseconds to seconds)
        ("rdma_ethtool_pfc_pause_duration_seconds_total", ("rx", "3")): 3.25,
        ("rdma_ethtool_pfc_pause_duration_seconds_total", ("tx", "3")): 0.125,
        ("rdma_ethtool_pfc_pause_frames_total", ("rx", "3")): 48211,
        ("rdma_ethtool_pfc_pause_frames_total", ("tx", "3")): 1907,
        ("rdma_ethtool_pfc_pause_frames_total", ("rx", "0")): 0,
        ("rdma_ethtool_global_pause_frames_total", ("rx",)): 0,
        ("rdma_ethtool_global_pause_frames_total", ("tx",)): 0,
        ("rdma_ethtool_pcs_symbol_errors_total", ("rx",)): 7,
        ("rdma_ethtool_corrected_bit_errors_total", ("rx",)): 1234567,
        ("rdma_ethtool_port_bit_count_total", ("rx",)): 8e15,
        ("rdma_ethtool_crc_error_packets_total", ("rx",)): 5,
        ("rdma_ethtool_port_buffer_almost_full_events_total", ("rx",)): 31,
        ("rdma_ethtool_link_down_events_total", ()): 2,
        ("rdma_ethtool_port_discards_total", ("rx",)): 17,
        ("rdma_ethtool_undersize_packets_total", ("rx",)): 4,
    }
    for (name, extra), want in expected.items():
        labels = dict(zip(("direction", "priority"), extra, strict=False))
        assert value(metrics, name, **bnxt, **labels) == want, (name, extra)
    # Per class of service, not per priority: no priority-labelled discards, bytes or packets for bnxt_en.
    for name in ("priority_discards", "priority_bytes", "priority_packets"):
        assert value(metrics, f"rdma_ethtool_{name}_total", **bnxt) is None
    assert value(metrics, "rdma_ethtool_curated_stats", **bnxt) == 16 + 7 * 4

    ice = {"device": "mlx5_9", "port": "1", "netdev": ROCE["mlx5_9"]}
    assert value(metrics, "rdma_ethtool_pfc_pause_frames_total", **ice, direction="tx", priority="3") == 6434
    assert value(metrics, "rdma_ethtool_pfc_pause_frames_total", **ice, direction="rx", priority="3") == 129
    assert value(metrics, "rdma_ethtool_global_pause_frames_total", **ice, direction="rx") == 0
    assert value(metrics, "rdma_ethtool_crc_error_packets_total", **ice, direction="rx") == 4
    assert value(metrics, "rdma_ethtool_jabber_packets_total", **ice, direction="rx") == 6
    assert value(metrics, "rdma_ethtool_curated_stats", **ice) == 16 + 3 + 4
    assert value(metrics, "rdma_exporter_scrape_collector_success", collector="ethtool") == 1
    check_unique_and_promtool(text)


def test_netdev_with_no_known_stat_names_shows_zero_curated_stats(tree: Path) -> None:
    # A driver whose names the rule table does not know reads fine: no error, and no series but these two.
    path = tree / "ethtool" / ROCE["mlx5_8"]
    path.write_text((FIXTURES / "ethtool" / "node_exporter_eth0_generic_with_quirks.txt").read_text())
    exporter = Exporter(tree / "sys", tree / "ethtool")
    text = exporter.text()
    metrics = samples(text)
    port = {"device": "mlx5_8", "port": "1", "netdev": ROCE["mlx5_8"]}
    ethtool_series = {n for n, ls in series(metrics, "rdma_ethtool_") if port.items() <= dict(ls).items()}
    assert ethtool_series == {"rdma_ethtool_curated_stats", "rdma_ethtool_extra_stats_over_limit"}
    assert value(metrics, "rdma_ethtool_curated_stats", **port) == 0
    assert value(metrics, "rdma_ethtool_curated_stats", device="mlx5_9") > 0
    assert value(metrics, "rdma_exporter_scrape_collector_success", collector="ethtool") == 1
    assert read_errors(metrics, "ethtool") == {}
    help_line = next(line for line in text.splitlines() if line.startswith("# HELP rdma_ethtool_curated_stats "))
    assert "lists no statistics" in help_line and "CRC counter" in help_line
    check_unique_and_promtool(text)


# --- faults: each costs one netdev's ethtool values, is counted, and leaves the RDMA series alone -------------


def read_errors(metrics: Sample, collector: str) -> dict[tuple[str, str], float]:
    return {
        (dict(ls)["device"], dict(ls)["reason"]): v
        for (n, ls), v in metrics.items()
        if n == "rdma_exporter_file_read_errors_total" and dict(ls)["collector"] == collector
    }


# What is left of a netdev whose driver answers that it has no statistics: none of them curated, so that
# RdmaRoceStatisticsUnknown can see the port.
NO_STATISTICS: Final = {"rdma_ethtool_curated_stats": 0.0, "rdma_ethtool_extra_stats_over_limit": 0.0}


def assert_only_mlx5_8_lost(metrics: Sample, baseline: Sample, left: Mapping[str, float] | None = None) -> None:
    """mlx5_8's netdev lost its ethtool series but `left` (name -> value); nothing else changed."""
    assert series(metrics, "rdma_port_") == series(baseline, "rdma_port_")
    assert series(metrics, "rdma_netdev_") == series(baseline, "rdma_netdev_")
    lost = series(baseline, "rdma_ethtool_") - series(metrics, "rdma_ethtool_")
    assert lost and {dict(ls)["netdev"] for _, ls in lost} == {ROCE["mlx5_8"]}
    kept = {
        n: v for (n, ls), v in metrics.items() if n.startswith("rdma_ethtool_") and dict(ls)["netdev"] == ROCE["mlx5_8"]
    }
    assert kept == (left or {})
    assert {dict(ls)["netdev"] for n, ls in series(metrics, "rdma_ethtool_") if n not in kept} == {ROCE["mlx5_9"]}


@pytest.mark.parametrize(
    ("code", "reason"),
    # ENODEV for a netdev that sysfs still lists: the ioctl's network namespace is not the host's (below).
    [(errno.EOPNOTSUPP, "unsupported"), (errno.ENODEV, "io"), (errno.EPERM, "permission"), (errno.EIO, "io")],
)
def test_ioctl_failure_costs_one_netdev(tree: Path, metrics: Sample, code: int, reason: str) -> None:
    exporter = Exporter(tree / "sys")
    nics = exporter.ethtool.call = fake_nics(tree)
    nics.errno[ROCE["mlx5_8"]] = code
    got = exporter.scrape()
    assert_only_mlx5_8_lost(got, metrics, NO_STATISTICS if reason == "unsupported" else None)
    assert read_errors(got, "ethtool") == {("mlx5_8", reason): 1}
    assert value(got, "rdma_exporter_scrape_collector_success", collector="ethtool") == 1
    del nics.errno[ROCE["mlx5_8"]]  # the next scrape recovers; the counter keeps the past failure
    again = exporter.scrape()
    assert series(again, "rdma_ethtool_") == series(metrics, "rdma_ethtool_")
    assert read_errors(again, "ethtool") == {("mlx5_8", reason): 1}


def test_netdev_the_ioctl_cannot_find_is_an_error_while_sysfs_lists_it(
    tree: Path, metrics: Sample, caplog: pytest.LogCaptureFixture
) -> None:
    """A container without host networking: sysfs shows the host's netdevs, the ioctl looks in another
    namespace. That is a warning and an `io` read error (RdmaExporterReadErrors), not a netdev gone."""
    exporter = Exporter(tree / "sys")
    nics = exporter.ethtool.call = fake_nics(tree)
    del nics.stats[ROCE["mlx5_8"]]  # this namespace has no such interface
    with caplog.at_level(logging.INFO, logger="rdma_exporter"):
        got = exporter.scrape()
    assert_only_mlx5_8_lost(got, metrics)
    assert read_errors(got, "ethtool") == {("mlx5_8", "io"): 1}
    warned = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and ROCE["mlx5_8"] in r.getMessage()
    ]
    assert len(warned) == 1 and "network namespace" in warned[0]


def test_netdev_removed_before_its_ioctl_is_missing(tree: Path) -> None:
    exporter = Exporter(tree / "sys")
    nics = fake_nics(tree)
    gone = tree / "sys" / "class" / "net" / ROCE["mlx5_8"]

    def unplug_then_call(ifname: str, buffer: array) -> None:
        if ifname == ROCE["mlx5_8"] and os.path.lexists(gone):
            gone.unlink()  # the netdev goes between the listing and its ioctl
            del nics.stats[ifname]
        nics(ifname, buffer)

    exporter.ethtool.call = unplug_then_call
    got = exporter.scrape()
    assert read_errors(got, "ethtool") == {("mlx5_8", "missing"): 1}
    assert {dict(ls)["netdev"] for _, ls in series(got, "rdma_ethtool_")} == {ROCE["mlx5_9"]}


def test_stat_set_changing_size_between_calls_costs_one_netdev(tree: Path, metrics: Sample) -> None:
    exporter = Exporter(tree / "sys")
    nics = exporter.ethtool.call = fake_nics(tree)
    nics.growing.add(ROCE["mlx5_8"])
    got = exporter.scrape()
    assert_only_mlx5_8_lost(got, metrics)
    assert read_errors(got, "ethtool") == {("mlx5_8", "io"): 1}


def test_missing_capture_is_counted(tree: Path, metrics: Sample) -> None:
    (tree / "ethtool" / ROCE["mlx5_8"]).unlink()
    got = Exporter(tree / "sys", tree / "ethtool").scrape()
    assert_only_mlx5_8_lost(got, metrics)
    assert read_errors(got, "ethtool") == {("mlx5_8", "missing"): 1}


def test_capture_read_errors_name_the_capture_file(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    """In fixture mode the debug log blames the capture file, the one thing to fix, not an ioctl never made."""
    missing = tree / "ethtool" / ROCE["mlx5_8"]
    missing.unlink()
    garbage = tree / "ethtool" / ROCE["mlx5_9"]
    garbage.write_text(garbage.read_text() + "     half a line\n")
    with caplog.at_level(logging.DEBUG, logger="rdma_exporter"):
        Exporter(tree / "sys", tree / "ethtool").scrape()
    logged = {r.getMessage() for r in caplog.records if r.getMessage().startswith("read error [ethtool]")}
    assert len(logged) == 2
    assert f"read error [ethtool] mlx5_8 missing: {missing}: No such file or directory" in logged  # path once
    assert any(m.startswith(f"read error [ethtool] mlx5_9 malformed: {garbage}: ") for m in logged)
    # The engine's episode lines name sysfs files only: the missing capture has the ethtool collector's own
    # warning, and a malformed line is not worth one (the rest of the capture is kept).
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert not [m for _, m in said if m.startswith("read errors ")], said
    assert [level for level, m in said if m.startswith(f"ethtool statistics of {ROCE['mlx5_8']} ")] == ["INFO"]


def test_an_ethtool_read_that_fails_is_logged_once_per_episode(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The engine's read-error lines name sysfs files only: a failed ioctl was counted and its netdev's PFC,
    # ECN and PHY series vanished with nothing in the log (fault-injection review).
    exporter = Exporter(tree / "sys")
    nics = fake_nics(tree)
    exporter.ethtool.call = nics
    netdev = ROCE["mlx5_8"]
    with caplog.at_level(logging.INFO, logger="rdma_exporter.collect.ethtool"):
        nics.errno[netdev] = errno.EPERM
        for _ in range(3):
            got = exporter.scrape()
        assert read_errors(got, "ethtool") == {("mlx5_8", "permission"): 3}
        nics.errno[netdev] = errno.EOPNOTSUPP  # another reason: another episode
        exporter.scrape()
        del nics.errno[netdev]
        exporter.scrape()
        exporter.scrape()
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert logged == [
        ("WARNING", f"ethtool statistics of {netdev} (device mlx5_8) cannot be read (permission): SIOCETHTOOL "
                    f"{netdev}: ETHTOOL_GSSET_INFO: Operation not permitted; counted in "
                    "rdma_exporter_file_read_errors_total, not logged again while it goes on"),
        ("INFO", f"ethtool statistics of {netdev} (device mlx5_8) cannot be read (unsupported): SIOCETHTOOL "
                 f"{netdev}: ETHTOOL_GDRVINFO: Operation not supported; counted in "
                 "rdma_exporter_file_read_errors_total, not logged again while it goes on"),
        ("INFO", f"ethtool statistics of {netdev} (device mlx5_8) read again"),
    ], logged


def test_an_empty_capture_is_counted_as_no_statistics(tree: Path, metrics: Sample) -> None:
    # What `ethtool -S` of a driver without statistics leaves in a file: the ioctl's "no statistics set".
    (tree / "ethtool" / ROCE["mlx5_8"]).write_text("")
    got = Exporter(tree / "sys", tree / "ethtool").scrape()
    assert_only_mlx5_8_lost(got, metrics, NO_STATISTICS)
    assert read_errors(got, "ethtool") == {("mlx5_8", "unsupported"): 1}
    (tree / "ethtool" / ROCE["mlx5_8"]).write_text("NIC statistics:\n")
    assert read_errors(Exporter(tree / "sys", tree / "ethtool").scrape(), "ethtool") == {("mlx5_8", "unsupported"): 1}


def test_garbage_capture_lines_are_counted_and_the_rest_kept(tree: Path, metrics: Sample) -> None:
    path = tree / "ethtool" / ROCE["mlx5_8"]
    path.write_text(path.read_text() + "     rx_prio3_pause: lots\n     half a line\n\x00\x01\n")
    got = Exporter(tree / "sys", tree / "ethtool").scrape()
    assert read_errors(got, "ethtool") == {("mlx5_8", "malformed"): 3}
    assert series(got, "rdma_ethtool_") == series(metrics, "rdma_ethtool_")
    prio3 = {"device": "mlx5_8", "direction": "rx", "priority": "3"}
    assert value(got, "rdma_ethtool_pfc_pause_frames_total", **prio3) == value(
        metrics, "rdma_ethtool_pfc_pause_frames_total", **prio3
    )


def test_vanished_netdev_costs_its_series_and_is_counted_once(tree: Path, metrics: Sample) -> None:
    exporter = Exporter(tree / "sys", tree / "ethtool")
    assert series(exporter.scrape(), "rdma_ethtool_") == series(metrics, "rdma_ethtool_")
    (tree / "sys" / "class" / "net" / ROCE["mlx5_8"]).unlink()  # the netdev is unregistered
    for _ in range(2):
        got = exporter.scrape()
        assert series(got, "rdma_port_") == series(metrics, "rdma_port_")
        assert {dict(ls)["netdev"] for n, ls in series(got, "rdma_ethtool_")} == {ROCE["mlx5_9"]}
        assert not [k for k in series(got, "rdma_netdev_") if dict(k[1])["netdev"] == ROCE["mlx5_8"]]
        # Counted once per disappearance, not on every scrape while it stays away.
        assert read_errors(got, "ethtool") == {("mlx5_8", "missing"): 1}
        assert read_errors(got, "netdev") == {("mlx5_8", "missing"): 1}


def test_unknown_gid_netdev_is_not_an_error(tree: Path) -> None:
    # GID tables name netdevs of containers' namespaces, which this sysfs never shows.
    ndevs = next((tree / "sys" / "class" / "infiniband" / "mlx5_8" / "ports" / "1" / "gid_attrs" / "ndevs").iterdir())
    ndevs.write_text("net1\n")
    got = Exporter(tree / "sys", tree / "ethtool").scrape()
    assert read_errors(got, "netdev") == read_errors(got, "ethtool") == {}


# --- RoCE LAG and bonds: every netdev read once and exported once ----------------------------------------------


PCI = "devices/pci0000:00/0000:00:02.0"


def _function(root: Path, bdf: str, netdev: str, rdma: str | None, gids: list[str]) -> None:
    """A PCI function with one Ethernet netdev and, unless folded into a LAG device, its RDMA device."""
    fn = f"{PCI}/{bdf}"
    write_files(root, {f"{fn}/current_link_speed": "32.0 GT/s PCIe\n", f"{fn}/max_link_speed": "32.0 GT/s PCIe\n",
                  f"{fn}/current_link_width": "16\n", f"{fn}/max_link_width": "16\n"})  # fmt: skip
    net = f"{fn}/net/{netdev}"
    write_files(root, {f"{net}/{k}": v for k, v in {"operstate": "up\n", "carrier": "1\n", "speed": "200000\n",
                                                  "mtu": "9000\n", "dev_port": "0\n", "statistics/rx_bytes": "5\n",
                                                  "ecn/roce_np/enable/3": "1\n"}.items()})  # fmt: skip
    symlink(root, f"{net}/device", fn)
    symlink(root, f"class/net/{netdev}", net)
    if rdma is None:
        return
    dev = f"{fn}/infiniband/{rdma}"
    port = f"{dev}/ports/1"
    attrs = {"link_layer": "Ethernet", "state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "200 Gb/sec (2X NDR)",
             "counters/port_rcv_data": "1"}  # fmt: skip
    write_files(root, {f"{port}/{name}": f"{text}\n" for name, text in attrs.items()})
    write_files(root, {f"{port}/gid_attrs/ndevs/{i}": f"{name}\n" for i, name in enumerate(gids)})
    symlink(root, f"{dev}/device", fn)
    symlink(root, f"class/infiniband/{rdma}", dev)


def _bond(root: Path, name: str, slaves: list[str], uppers: bool = True) -> None:
    bond = f"devices/virtual/net/{name}"
    write_files(root, {f"{bond}/bonding/slaves": " ".join(slaves) + "\n", f"{bond}/bonding/mode": "802.3ad 4\n",
                  f"{bond}/operstate": "up\n", f"{bond}/speed": "400000\n", f"{bond}/mtu": "9000\n",
                  f"{bond}/type": "1\n", f"{bond}/statistics/rx_bytes": "11\n"})  # fmt: skip
    symlink(root, f"class/net/{name}", bond)
    for slave in slaves:
        symlink(root, f"{bond}/lower_{slave}", f"class/net/{slave}")
        if uppers:
            symlink(root, f"class/net/{slave}/master", bond)


def _vlan(root: Path, name: str, lower: str) -> None:
    vlan = f"devices/virtual/net/{name}"
    write_files(root, {f"{vlan}/operstate": "up\n", f"{vlan}/mtu": "9000\n"})
    symlink(root, f"{vlan}/lower_{lower}", f"class/net/{lower}")
    symlink(root, f"class/net/{name}", vlan)


STATS = {"rx_prio3_pause": 7, "tx_prio3_pause": 3, "rx_discards_phy": 1, "rx_packets": 9}


def scrape_lag(root: Path, nics: tuple[str, ...] = ("ens1f0np0", "ens1f1np1")) -> tuple[Sample, FakeNics, str]:
    exporter = Exporter(root)
    fake = exporter.ethtool.call = FakeNics(dict.fromkeys(nics, STATS))
    text = exporter.text()
    return samples(text), fake, text


def count_netdev_reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often each netdev's state is read from now on."""
    reads: Counter[str] = Counter()
    real = netdev_collector.read_netdev_state

    def counting(sys_root: Path, identity: NetdevIdentity, reader: SysfsReader, *, statistics: bool) -> object:
        reads[identity.name] += 1
        return real(sys_root, identity, reader, statistics=statistics)

    monkeypatch.setattr(netdev_collector, "read_netdev_state", counting)
    return reads


def count_text_reads(monkeypatch: pytest.MonkeyPatch, suffix: str) -> Counter[str]:
    """How often each device's reader reads a file whose path ends in `suffix` from now on."""
    reads: Counter[str] = Counter()
    real_text = SysfsReader.text

    def counting(self: SysfsReader, path: str | Path, *args: object, **kwargs: object) -> str | None:
        if str(path).endswith(suffix):
            reads[self.device] += 1
        return real_text(self, path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SysfsReader, "text", counting)
    return reads


def test_roce_lag_reads_each_slave_once_under_the_bond_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # mlx5_bond_0 sits on the first function; the second function has no RDMA device while bonded.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_bond_0", ["bond0", "bond0"])
    _function(tmp_path, "0000:3b:00.1", "ens1f1np1", None, [])
    _bond(tmp_path, "bond0", ["ens1f0np0", "ens1f1np1"])
    reads = count_netdev_reads(monkeypatch)
    metrics, nics, text = scrape_lag(tmp_path)
    assert dict(reads) == {"bond0": 1, "ens1f0np0": 1, "ens1f1np1": 1}
    assert dict(nics.calls) == {"ens1f0np0": 4, "ens1f1np1": 4}  # the bond itself has no ethtool stats
    lag = {"device": "mlx5_bond_0", "port": "1"}
    for netdev in ("bond0", "ens1f0np0", "ens1f1np1"):
        assert value(metrics, "rdma_netdev_up", **lag, netdev=netdev) == 1
    for slave in ("ens1f0np0", "ens1f1np1"):
        assert value(metrics, "rdma_netdev_bond_slave_info", **lag, netdev="bond0", slave=slave, mode="802.3ad") == 1
        prio3 = {**lag, "netdev": slave, "direction": "rx", "priority": "3"}
        assert value(metrics, "rdma_ethtool_pfc_pause_frames_total", **prio3) == 7
    assert value(metrics, "rdma_netdev_speed_bytes_per_second", **lag, netdev="bond0") == 400e9 / 8
    # statistics/ of the bond (an Ethernet netdev) and of its slaves (no `type` file: unknown is not
    # IPoIB) are read without collector.netdev.ipoib_statistics.
    assert value(metrics, "rdma_netdev_rx_bytes_total", **lag, netdev="bond0") == 11
    for slave in ("ens1f0np0", "ens1f1np1"):
        assert value(metrics, "rdma_netdev_rx_bytes_total", **lag, netdev=slave) == 5
    check_unique_and_promtool(text)


def _hwmon(root: Path, bdf: str, number: int, sensors: dict[str, int]) -> None:
    """mlx5's hwmon device of a function: one channel per (label, millidegrees), threshold 90 degrees."""
    channels = {n: {"label": label, "input": str(value), "crit": "90000"}
                for n, (label, value) in enumerate(sensors.items(), start=1)}  # fmt: skip
    write_hwmon(root / PCI / bdf, number, channels)


def test_roce_lag_device_reports_both_functions_modules_and_the_cards_asic_once(tmp_path: Path) -> None:
    # mlx5_bond_0 sits on the first function; the second port's module is the second function's sensor.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_bond_0", ["bond0", "bond0"])
    _function(tmp_path, "0000:3b:00.1", "ens1f1np1", None, [])
    _bond(tmp_path, "bond0", ["ens1f0np0", "ens1f1np1"])
    _hwmon(tmp_path, "0000:3b:00.0", 4, {"asic": 61000, "Module0": 45000})
    _hwmon(tmp_path, "0000:3b:00.1", 5, {"asic": 61125, "Module1": 52000})
    metrics, _, text = scrape_lag(tmp_path)
    temperatures = {dict(labels)["sensor"]: v for (name, labels), v in metrics.items()
                    if name == "rdma_device_temperature_celsius" and ("device", "mlx5_bond_0") in labels}  # fmt: skip
    # The card's one ASIC, as its first function reports it; each port's module.
    assert temperatures == {"asic": 61.0, "Module0": 45.0, "Module1": 52.0}
    assert not [key for key in metrics if key[0] == "rdma_exporter_file_read_errors_total"]
    check_unique_and_promtool(text)


@pytest.mark.parametrize(
    ("second", "rdma"),
    [("0000:3b:00.1", "mlx5_1"), ("0000:5e:00.1", "mlx5_1"), ("0000:5e:00.1", None)],
    ids=["same card", "other card", "other card without RDMA"],
)
def test_a_bond_without_lag_leaves_each_functions_sensors_to_its_own_device(
    tmp_path: Path, second: str, rdma: str | None
) -> None:
    # An active-backup bond over a port of mlx5_0 and a port of another function: mlx5_0's GID table names
    # the bond, yet the other function's sensors are not mlx5_0's (review: mlx5_0 reported them too).
    # Only a function of mlx5_0's own card without an RDMA device of its own is folded into it (LAG).
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", ["ens1f0np0", "bond0"])
    _function(tmp_path, second, "ens2f1np1", rdma, ["ens2f1np1"])
    _bond(tmp_path, "bond0", ["ens1f0np0", "ens2f1np1"])
    _hwmon(tmp_path, "0000:3b:00.0", 4, {"asic": 61000, "Module0": 45000})
    _hwmon(tmp_path, second, 5, {"asic": 80000, "Module1": 70000})
    exporter = Exporter(tmp_path)
    exporter.ethtool.call = FakeNics(dict.fromkeys(("ens1f0np0", "ens2f1np1"), STATS))
    metrics = exporter.scrape()
    temperatures = {(dict(labels)["device"], dict(labels)["sensor"]): v for (name, labels), v in metrics.items()
                    if name == "rdma_device_temperature_celsius"}  # fmt: skip
    own = {("mlx5_0", "asic"): 61.0, ("mlx5_0", "Module0"): 45.0}
    theirs = {("mlx5_1", "asic"): 80.0, ("mlx5_1", "Module1"): 70.0} if rdma else {}
    assert temperatures == own | theirs
    # The other function's hwmon uevent re-reads its own device, never mlx5_0.
    from rdma_exporter.hotplug import Event, apply_event

    event = Event("add", "hwmon", "hwmon5", f"/{PCI}/{second}/hwmon/hwmon5")
    assert apply_event(exporter.collector.inventory, event) == ("device mlx5_1" if rdma else None)


def test_roce_lag_device_is_read_again_when_its_second_function_registers_sensors(tmp_path: Path) -> None:
    # mlx5 registers a function's hwmon device after its RDMA device; the event names the second function.
    from rdma_exporter.hotplug import Event, apply_event

    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_bond_0", ["bond0", "bond0"])
    _function(tmp_path, "0000:3b:00.1", "ens1f1np1", None, [])
    _bond(tmp_path, "bond0", ["ens1f0np0", "ens1f1np1"])
    _hwmon(tmp_path, "0000:3b:00.0", 4, {"asic": 61000, "Module0": 45000})
    exporter = Exporter(tmp_path)
    exporter.ethtool.call = FakeNics(dict.fromkeys(("ens1f0np0", "ens1f1np1"), STATS))

    def sensors() -> list[str]:
        return sorted(dict(labels)["sensor"] for (name, labels) in exporter.scrape()
                      if name == "rdma_device_temperature_celsius")  # fmt: skip

    assert sensors() == ["Module0", "asic"]
    _hwmon(tmp_path, "0000:3b:00.1", 5, {"asic": 61125, "Module1": 52000})
    assert sensors() == ["Module0", "asic"]  # cached: nobody said anything yet
    event = Event("add", "hwmon", "hwmon5", f"/{PCI}/0000:3b:00.1/hwmon/hwmon5")
    assert apply_event(exporter.collector.inventory, event) == "device mlx5_bond_0"
    assert sensors() == ["Module0", "Module1", "asic"]


def test_roce_lag_slaves_static_attributes_are_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A LAG bond's slaves are no port's own netdevs, yet their static attributes (ifindex, type, address)
    are kept in the device's static info like the bond's: the next scrape reads none of them again, as
    for every other static file (infiniband mutation review: not following the bond to its slaves in
    the static info passed every test, the slaves' identity being read again on every scrape)."""
    from conftest import record_reads

    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_bond_0", ["bond0", "bond0"])
    _function(tmp_path, "0000:3b:00.1", "ens1f1np1", None, [])
    _bond(tmp_path, "bond0", ["ens1f0np0", "ens1f1np1"])
    exporter = Exporter(tmp_path)
    exporter.ethtool.call = FakeNics(dict.fromkeys(("ens1f0np0", "ens1f1np1"), STATS))
    opened = record_reads(monkeypatch)

    def identity_reads() -> set[str]:
        return {os.path.relpath(p, tmp_path) for p in opened if os.path.basename(p) in ("ifindex", "type", "address")}

    cold = exporter.scrape()
    assert identity_reads() >= {f"class/net/{n}/ifindex" for n in ("bond0", "ens1f0np0", "ens1f1np1")}
    opened.clear()
    warm = exporter.scrape()
    assert identity_reads() == set()
    slave = {"device": "mlx5_bond_0", "port": "1", "netdev": "ens1f1np1"}
    assert value(cold, "rdma_netdev_up", **slave) == value(warm, "rdma_netdev_up", **slave) == 1  # still exported


@pytest.mark.parametrize(
    ("rdma", "present"), [("mlx5_bond_0", 1), ("rocep59s0f0", 1), ("mlx5_0", 0)], ids=["lag", "lag-renamed", "no-lag"]
)
def test_an_expected_function_that_a_roce_lag_device_stands_for_is_present(
    tmp_path: Path, rdma: str, present: int
) -> None:
    """While a card's two ports are one RoCE LAG device (mlx5_bond_0, on the first function), the second
    function has no RDMA device: expected by address, it was paged missing (RdmaExpectedDeviceMissing,
    critical) for as long as the LAG was up (found by the bandwidth alerts review). The LAG device stands
    for the functions of its bond's slaves on its card. A plain device whose GIDs name a bond over both
    functions is no LAG: the other function's missing RDMA device is still missing. A LAG device renamed by
    rdma-core's udev rule (rocep59s0f0) is one too: told by the name alone, it paged (driver review)."""
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", rdma, ["bond0", "bond0"])
    _function(tmp_path, "0000:3b:00.1", "ens1f1np1", None, [])
    _bond(tmp_path, "bond0", ["ens1f0np0", "ens1f1np1"])
    config = parse_config(
        yaml.safe_load(
            "collector: {expected: {ports: [{pci_addresses: ['0000:3b:00.0', '0000:3b:00.1'], port: 1, "
            "link_layer: Ethernet}]}}"
        ),
        "test.yml",
    )
    exporter = Exporter(tmp_path, config=config)
    exporter.ethtool.call = FakeNics(dict.fromkeys(("ens1f0np0", "ens1f1np1"), STATS))
    metrics = exporter.scrape()
    assert value(metrics, "rdma_expected_pci_device_present", pci_address="0000:3b:00.0") == 1
    assert value(metrics, "rdma_expected_pci_device_present", pci_address="0000:3b:00.1") == present
    # One port expectation, under the device's name, whichever function's entry it came from.
    expected_ports = [labels for name, labels in metrics if name == "rdma_expected_port_info"]
    assert expected_ports == [(("device", rdma), ("link_layer", "Ethernet"), ("port", "1"))]


def test_bond_slaves_are_read_every_scrape(tmp_path: Path) -> None:
    """Releasing a slave (`ip link set X nomaster`) sends no uevent, so the cached static info does not
    change: the slave list must still be current on the next scrape (RdmaRoceLagSlaveMissing reads it)."""
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_bond_0", ["bond0", "bond0"])
    _function(tmp_path, "0000:3b:00.1", "ens1f1np1", None, [])
    _bond(tmp_path, "bond0", ["ens1f0np0", "ens1f1np1"])
    exporter = Exporter(tmp_path)
    exporter.ethtool.call = FakeNics(dict.fromkeys(("ens1f0np0", "ens1f1np1"), STATS))
    lag = {"device": "mlx5_bond_0", "port": "1", "netdev": "bond0", "mode": "802.3ad"}

    def slaves() -> set[str]:
        """The bond's slaves as listed, after checking that the netdev and ethtool series agree."""
        series = [(n, dict(ls)) for (n, ls) in exporter.scrape()]
        listed = {
            labels["slave"]
            for name, labels in series
            if name == "rdma_netdev_bond_slave_info" and all(labels[k] == v for k, v in lag.items())
        }
        netdevs = {labels["netdev"] for name, labels in series if name == "rdma_netdev_up"}
        pfc = {labels["netdev"] for name, labels in series if name.startswith("rdma_ethtool_pfc_")}
        assert netdevs == {"bond0", *listed} and pfc == listed
        return listed

    assert slaves() == {"ens1f0np0", "ens1f1np1"}
    write_files(tmp_path, {"devices/virtual/net/bond0/bonding/slaves": "ens1f0np0\n"})
    assert slaves() == {"ens1f0np0"}
    write_files(tmp_path, {"devices/virtual/net/bond0/bonding/slaves": "ens1f0np0 ens1f1np1\n"})
    assert slaves() == {"ens1f0np0", "ens1f1np1"}
    # Reconfigured (emptied, mode changed, enslaved again): the mode label follows at once too.
    write_files(tmp_path, {"devices/virtual/net/bond0/bonding/mode": "active-backup 1\n"})
    modes = {dict(ls)["mode"] for (n, ls) in exporter.scrape() if n == "rdma_netdev_bond_slave_info"}
    assert modes == {"active-backup"}


def test_a_bond_slave_list_that_is_no_names_is_counted_by_the_ethtool_collector_too(tmp_path: Path) -> None:
    # The ethtool collector reads bonding/slaves itself (parse.netdev.Locality) to find the slaves whose PFC
    # counters it reads. A list that is no netdev names cost its value uncounted there, and its entries
    # became paths under class/net; it is now checked as the netdev collector checks its own read, and the
    # bond's lower_* links name the slaves instead, as the netdev collector keeps the slaves it knew.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_bond_0", ["bond0", "bond0"])
    _function(tmp_path, "0000:3b:00.1", "ens1f1np1", None, [])
    _bond(tmp_path, "bond0", ["ens1f0np0", "ens1f1np1"])
    exporter = Exporter(tmp_path)
    nics = FakeNics(dict.fromkeys(("ens1f0np0", "ens1f1np1"), STATS))
    exporter.ethtool.call = nics
    assert read_errors(exporter.scrape(), "ethtool") == {}
    write_files(tmp_path, {"devices/virtual/net/bond0/bonding/slaves": "ens1f0np0 ../../devices/virtual\n"})
    nics.calls.clear()
    metrics = exporter.scrape()
    assert read_errors(metrics, "ethtool") == {("mlx5_bond_0", "malformed"): 1}
    assert read_errors(metrics, "netdev") == {("mlx5_bond_0", "malformed"): 1}
    assert {dict(ls)["netdev"] for _, ls in series(metrics, "rdma_ethtool_pfc_")} == {"ens1f0np0", "ens1f1np1"}
    assert set(nics.calls) == {"ens1f0np0", "ens1f1np1"}  # nothing asked of a name from the garbage
    write_files(tmp_path, {"devices/virtual/net/bond0/bonding/slaves": "ens1f0np0 ens1f1np1\n"})
    metrics = exporter.scrape()
    assert {dict(ls)["netdev"] for _, ls in series(metrics, "rdma_ethtool_pfc_")} == {"ens1f0np0", "ens1f1np1"}
    assert read_errors(metrics, "ethtool") == {("mlx5_bond_0", "malformed"): 1}  # counted once, not again
    # A file that cannot be read at all (a directory in its place: EISDIR) says nothing of the slaves either.
    slaves = tmp_path / "devices/virtual/net/bond0/bonding/slaves"
    slaves.unlink()
    slaves.mkdir()
    metrics = exporter.scrape()
    assert {dict(ls)["netdev"] for _, ls in series(metrics, "rdma_ethtool_pfc_")} == {"ens1f0np0", "ens1f1np1"}
    assert read_errors(metrics, "ethtool") == {("mlx5_bond_0", "malformed"): 1, ("mlx5_bond_0", "io"): 1}


def test_slave_enslaved_after_startup_is_read_without_a_uevent(tmp_path: Path) -> None:
    """`ip link set ens1f1np1 master bond0` after the device's static info was read: no uevent refreshes
    that info, yet the new slave's series (its statistics too) must show on the next scrape."""
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_bond_0", ["bond0", "bond0"])
    _function(tmp_path, "0000:3b:00.1", "ens1f1np1", None, [])
    _bond(tmp_path, "bond0", ["ens1f0np0"])
    exporter = Exporter(tmp_path)
    exporter.ethtool.call = FakeNics(dict.fromkeys(("ens1f0np0", "ens1f1np1"), STATS))
    lag = {"device": "mlx5_bond_0", "port": "1"}
    assert value(exporter.scrape(), "rdma_netdev_up", **lag, netdev="ens1f1np1") is None
    write_files(tmp_path, {"devices/virtual/net/bond0/bonding/slaves": "ens1f0np0 ens1f1np1\n"})
    symlink(tmp_path, "devices/virtual/net/bond0/lower_ens1f1np1", "class/net/ens1f1np1")
    symlink(tmp_path, "class/net/ens1f1np1/master", "devices/virtual/net/bond0")
    for _ in range(2):
        metrics = exporter.scrape()
        new = {**lag, "netdev": "ens1f1np1"}
        assert value(metrics, "rdma_netdev_up", **new) == 1
        assert value(metrics, "rdma_netdev_rx_bytes_total", **new) == 5
        assert value(metrics, "rdma_netdev_ecn_enabled", **new, role="np", priority="3") == 1
        assert value(metrics, "rdma_netdev_bond_slave_info", **lag, netdev="bond0", slave="ens1f1np1") == 1
        assert series(metrics, "rdma_exporter_file_read_errors_total") == set()


def test_bond_across_two_rdma_devices_is_read_by_one(tmp_path: Path) -> None:
    # Active-backup over two single-port NICs: both GID tables name the bond as an upper, and a VLAN on the
    # first one; a container's macvlan (net1) appears in the second but not in this namespace.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", ["ens1f0np0", "ens1f0np0", "bond0", "ens1f0np0.7"])
    _function(tmp_path, "0000:3b:00.1", "ens1f1np1", "mlx5_1", ["ens1f1np1", "ens1f1np1", "bond0", "net1"])
    _bond(tmp_path, "bond0", ["ens1f1np1", "ens1f0np0"])
    _vlan(tmp_path, "ens1f0np0.7", "ens1f0np0")
    metrics, nics, text = scrape_lag(tmp_path)
    up = [dict(ls) for (n, ls) in metrics if n == "rdma_netdev_up"]
    owners = {labels["netdev"]: (labels["device"], labels["port"]) for labels in up}
    # The bond's first lower (in name order) is mlx5_0's: mlx5_0 reads and exports it.
    assert owners == {"ens1f0np0": ("mlx5_0", "1"), "ens1f0np0.7": ("mlx5_0", "1"), "bond0": ("mlx5_0", "1"),
                      "ens1f1np1": ("mlx5_1", "1")}  # fmt: skip
    assert dict(nics.calls) == {"ens1f0np0": 4, "ens1f1np1": 4}  # no ioctl for the bond or the VLAN
    # Each port lists every netdev bound to it, its VLAN and bond too, not just the first one.
    bound = {(dict(ls)["device"], dict(ls)["netdev"]) for (n, ls) in metrics if n == "rdma_port_netdev_info"}
    assert bound >= {("mlx5_0", "ens1f0np0"), ("mlx5_0", "ens1f0np0.7"), ("mlx5_1", "ens1f1np1")}
    ethtool = {dict(ls)["netdev"]: dict(ls)["device"] for (n, ls) in metrics if n.startswith("rdma_ethtool_")}
    assert ethtool == {"ens1f0np0": "mlx5_0", "ens1f1np1": "mlx5_1"}
    assert series(metrics, "rdma_exporter_file_read_errors_total") == set()
    check_unique_and_promtool(text)


@pytest.mark.parametrize(
    ("mode", "gids_0", "gids_1"),
    [
        ("active-backup, the first card's link active", ["bond0", "bond0"], []),
        ("active-backup, the second card's link active", [], ["bond0", "bond0"]),
        ("802.3ad, both links active", ["bond0", "bond0"], ["bond0", "bond0"]),
    ],
)
def test_a_bond_over_two_cards_keeps_each_cards_own_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, gids_0: list[str], gids_1: list[str]
) -> None:
    # Two single-port cards bonded without RoCE LAG, with GID tables as the kernel fills them
    # (roce_gid_mgmt.c): a bond slave gets no GIDs of its own, an active slave's port lists the bond, an
    # inactive one's lists nothing (the port falls back to its function's netdev). The bond is mlx5_0's
    # (its first lower) unless mlx5_1's link is the active one; mlx5_1's link is reached only through the
    # bond, and (as a review found) it had no rdma_netdev_* series at all when its port listed the bond,
    # so RdmaRocePortAdminDown and the link alerts could not see it; nor had the bond.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", gids_0)
    _function(tmp_path, "0000:5e:00.0", "ens2f0np0", "mlx5_1", gids_1)
    _bond(tmp_path, "bond0", ["ens1f0np0", "ens2f0np0"])
    active = "ens1f0np0" if not gids_1 else "ens2f0np0" if not gids_0 else ""
    write_files(tmp_path, {"devices/virtual/net/bond0/bonding/active_slave": f"{active}\n"})
    reads = count_netdev_reads(monkeypatch)
    metrics, nics, text = scrape_lag(tmp_path, nics=("ens1f0np0", "ens2f0np0"))
    up = [dict(ls) for (n, ls) in metrics if n == "rdma_netdev_up"]
    owners = {labels["netdev"]: (labels["device"], labels["port"]) for labels in up}
    assert owners.get("ens1f0np0") == ("mlx5_0", "1"), mode
    assert owners.get("ens2f0np0") == ("mlx5_1", "1"), mode
    # The bond is read once, by the device whose port lists it: the active link's in active-backup, else
    # its first lower's.
    assert owners.get("bond0") == ("mlx5_0" if gids_0 else "mlx5_1", "1"), mode
    # Each port still says it is bound to the bond: the bond stacks on a link of each card.
    bound = {(dict(ls)["device"], dict(ls)["netdev"]) for (n, ls) in metrics if n == "rdma_port_netdev_info"}
    assert {("mlx5_0", "bond0")} <= bound if gids_0 else ("mlx5_0", "bond0") not in bound, bound
    assert {("mlx5_1", "bond0")} <= bound if gids_1 else ("mlx5_1", "bond0") not in bound, bound
    assert all(count == 1 for count in reads.values()), reads
    assert dict(nics.calls) == {"ens1f0np0": 4, "ens2f0np0": 4}
    ethtool = {dict(ls)["netdev"]: dict(ls)["device"] for (n, ls) in metrics if n.startswith("rdma_ethtool_")}
    assert ethtool == {"ens1f0np0": "mlx5_0", "ens2f0np0": "mlx5_1"}
    assert series(metrics, "rdma_exporter_file_read_errors_total") == set()
    check_unique_and_promtool(text)


def test_an_active_backup_bond_and_its_vlan_go_with_the_active_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel moves an active-backup bond's GIDs (and its VLAN's) to the active slave's RDMA device:
    # that device reads both, though the bond's first lower is mlx5_0's. The active slave is read once a
    # scrape, not once for the bond and again for the VLAN stacked on it.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", [])
    _function(tmp_path, "0000:5e:00.0", "ens2f0np0", "mlx5_1", ["bond0", "bond0", "bond0.100"])
    _bond(tmp_path, "bond0", ["ens1f0np0", "ens2f0np0"])
    _vlan(tmp_path, "bond0.100", "bond0")
    write_files(tmp_path, {"devices/virtual/net/bond0/bonding/active_slave": "ens2f0np0\n"})
    active_reads = count_text_reads(monkeypatch, "/bonding/active_slave")
    metrics, _, text = scrape_lag(tmp_path, nics=("ens1f0np0", "ens2f0np0"))
    owners = {dict(ls)["netdev"]: dict(ls)["device"] for (n, ls) in metrics if n == "rdma_netdev_up"}
    assert owners == {"ens1f0np0": "mlx5_0", "ens2f0np0": "mlx5_1", "bond0": "mlx5_1", "bond0.100": "mlx5_1"}
    assert active_reads == {"mlx5_1": 1}
    check_unique_and_promtool(text)


def test_vlan_on_a_bond_is_read_by_the_device_under_the_bond(tmp_path: Path) -> None:
    # A VLAN on a bond over two NICs (bond0.100 -> bond0 -> enp1s0np0 and enp2s0np0) is followed down two
    # levels to the bond's first lower, here mlx5_1's netdev: mlx5_1 reads the bond and its VLAN, even
    # though mlx5_0 comes first in device order and reaches both through its GID table.
    _function(tmp_path, "0000:3b:00.0", "enp2s0np0", "mlx5_0", ["enp2s0np0", "enp2s0np0", "bond0", "bond0.100"])
    _function(tmp_path, "0000:3b:00.1", "enp1s0np0", "mlx5_1", ["enp1s0np0", "enp1s0np0", "bond0", "bond0.100"])
    _bond(tmp_path, "bond0", ["enp2s0np0", "enp1s0np0"])
    _vlan(tmp_path, "bond0.100", "bond0")
    metrics, _, text = scrape_lag(tmp_path)
    owners = {dict(ls)["netdev"]: dict(ls)["device"] for (n, ls) in metrics if n == "rdma_netdev_up"}
    assert owners == {"enp2s0np0": "mlx5_0", "enp1s0np0": "mlx5_1", "bond0": "mlx5_1", "bond0.100": "mlx5_1"}
    check_unique_and_promtool(text)


def test_bond_without_lower_links_is_read_by_one_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A tree without the bond's lower_* links (kernels before 3.13 lack them): bonding/slaves names the
    # lowers instead, so the bond still has one reader, the device of its first slave.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", ["ens1f0np0", "ens1f0np0", "bond0"])
    _function(tmp_path, "0000:3b:00.1", "ens1f1np1", "mlx5_1", ["ens1f1np1", "ens1f1np1", "bond0"])
    _bond(tmp_path, "bond0", ["ens1f1np1", "ens1f0np0"])
    for lower in (tmp_path / "devices/virtual/net/bond0").glob("lower_*"):
        lower.unlink()
    reads = count_netdev_reads(monkeypatch)
    metrics, _, text = scrape_lag(tmp_path)
    assert dict(reads) == {"ens1f0np0": 1, "ens1f1np1": 1, "bond0": 1}
    owners = {dict(ls)["netdev"]: dict(ls)["device"] for (n, ls) in metrics if n == "rdma_netdev_up"}
    assert owners == {"ens1f0np0": "mlx5_0", "ens1f1np1": "mlx5_1", "bond0": "mlx5_1"}
    check_unique_and_promtool(text)


@pytest.mark.parametrize("plain", ["eth9", "enp94s0f0"], ids=["plain-nic-sorts-last", "plain-nic-sorts-first"])
def test_a_bond_over_an_rdma_nic_and_a_plain_nic_of_another_card_is_the_rdma_devices(
    tmp_path: Path, plain: str
) -> None:
    # A bond over mlx5_0's link and a NIC of another card with no RDMA device (802.3ad: no active slave to
    # follow). mlx5_0 reads the bond whatever the names' order: anchored on the first name, the bond had
    # no reader at all when the plain NIC's sorted first (review). The plain NIC is none of mlx5_0's: no
    # series and no ioctl for it.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", ["ens1f0np0", "ens1f0np0", "bond0"])
    _function(tmp_path, "0000:5e:00.0", plain, None, [])
    _bond(tmp_path, "bond0", sorted(["ens1f0np0", plain]))
    metrics, nics, text = scrape_lag(tmp_path, nics=("ens1f0np0", plain))
    owners = {dict(ls)["netdev"]: dict(ls)["device"] for (n, ls) in metrics if n == "rdma_netdev_up"}
    assert owners == {"ens1f0np0": "mlx5_0", "bond0": "mlx5_0"}
    assert dict(nics.calls) == {"ens1f0np0": 4}
    assert series(metrics, "rdma_exporter_file_read_errors_total") == set()
    check_unique_and_promtool(text)


def test_an_active_slave_that_is_no_slave_leaves_the_bond_with_its_first_lower(tmp_path: Path) -> None:
    # bonding/active_slave naming a netdev that is not one of the bond's lowers (a stale or odd read) is
    # not followed: it would anchor the bond on no device's link and the bond would lose its series.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", ["bond0", "bond0"])
    _function(tmp_path, "0000:5e:00.0", "ens2f0np0", "mlx5_1", [])
    _bond(tmp_path, "bond0", ["ens1f0np0", "ens2f0np0"])
    write_files(tmp_path, {"devices/virtual/net/bond0/bonding/active_slave": "ens9f9\n"})
    metrics, _, text = scrape_lag(tmp_path, nics=("ens1f0np0", "ens2f0np0"))
    owners = {dict(ls)["netdev"]: dict(ls)["device"] for (n, ls) in metrics if n == "rdma_netdev_up"}
    assert owners == {"bond0": "mlx5_0", "ens1f0np0": "mlx5_0", "ens2f0np0": "mlx5_1"}
    check_unique_and_promtool(text)


def test_a_bonds_slave_list_is_read_once_per_device_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # bonding/slaves waits for the rtnl lock: without lower_* links, a device reaching a bond and a VLAN
    # on it reads the list once for each source's locality (netdev, ethtool), not once per upper, and the
    # device that reads the bond once more for the bond's own state.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", ["ens1f0np0", "ens1f0np0", "bond0", "bond0.100"])
    _function(tmp_path, "0000:3b:00.1", "ens1f1np1", "mlx5_1", ["ens1f1np1", "ens1f1np1", "bond0", "bond0.100"])
    _bond(tmp_path, "bond0", ["ens1f1np1", "ens1f0np0"])
    _vlan(tmp_path, "bond0.100", "bond0")
    for lower in (tmp_path / "devices/virtual/net/bond0").glob("lower_*"):
        lower.unlink()
    exporter = Exporter(tmp_path)
    exporter.ethtool.call = FakeNics(dict.fromkeys(("ens1f0np0", "ens1f1np1"), STATS))
    exporter.text()  # the static reads
    reads = count_text_reads(monkeypatch, "/bonding/slaves")
    metrics = samples(exporter.text())
    owners = {dict(ls)["netdev"]: dict(ls)["device"] for (n, ls) in metrics if n == "rdma_netdev_up"}
    assert owners["bond0"] == owners["bond0.100"] == "mlx5_1"  # bonding/slaves names ens1f1np1 first
    assert dict(reads) == {"mlx5_0": 2, "mlx5_1": 3}


def _two_port_mlx4(root: Path, gids: tuple[list[str], list[str]], slaves: list[str]) -> None:
    """A two-port function (ConnectX-3: one PCI function, mlx4_0 with ports 1 and 2, dev_port 0 and 1,
    eth0 with carrier and eth1 without), its ports' GID netdevs and a bond0 of `slaves`, no RoCE LAG."""
    fn = f"{PCI}/0000:3b:00.0"
    rdma = f"{fn}/infiniband/mlx4_0"
    for i in (0, 1):
        net = f"{fn}/net/eth{i}"
        write_files(root, {f"{net}/operstate": "up\n", f"{net}/carrier": f"{1 - i}\n", f"{net}/mtu": "1500\n",
                           f"{net}/dev_port": f"{i}\n"})  # fmt: skip
        symlink(root, f"{net}/device", fn)
        symlink(root, f"class/net/eth{i}", net)
        port = f"{rdma}/ports/{i + 1}"
        write_files(root, {f"{port}/link_layer": "Ethernet\n", f"{port}/state": "4: ACTIVE\n",
                           f"{port}/phys_state": "5: LinkUp\n"})  # fmt: skip
        write_files(root, {f"{port}/gid_attrs/ndevs/{n}": f"{name}\n" for n, name in enumerate(gids[i])})
    symlink(root, f"{rdma}/device", fn)
    symlink(root, "class/infiniband/mlx4_0", rdma)
    _bond(root, "bond0", slaves)


def test_bond_over_both_ports_of_one_device_keeps_each_slave_on_its_port(tmp_path: Path) -> None:
    # Netdevs of a two-port function bonded without a RoCE LAG: the bond's address GIDs go to the active
    # slave's port only. eth1 is still port 2's netdev: its link state must join port 2, which lost its
    # link, and not make port 1 look down beside its up eth0.
    _two_port_mlx4(tmp_path, (["eth0", "eth0", "bond0"], ["eth1", "eth1"]), ["eth0", "eth1"])
    metrics, nics, text = scrape_lag(tmp_path, nics=("eth0", "eth1"))
    ports = {dict(ls)["netdev"]: dict(ls)["port"] for (n, ls) in metrics if n == "rdma_netdev_up"}
    assert ports == {"eth0": "1", "bond0": "1", "eth1": "2"}
    # The ethtool series of each slave join the same port as its netdev series, read once each.
    ethtool_ports = {dict(ls)["netdev"]: dict(ls)["port"] for (n, ls) in metrics if n.startswith("rdma_ethtool_")}
    assert ethtool_ports == {"eth0": "1", "eth1": "2"}
    assert dict(nics.calls) == {"eth0": 4, "eth1": 4}
    assert value(metrics, "rdma_netdev_carrier", device="mlx4_0", port="2", netdev="eth1") == 0
    assert value(metrics, "rdma_netdev_carrier", device="mlx4_0", port="1", netdev="eth0") == 1
    slaves = {dict(ls)["slave"] for (n, ls) in metrics if n == "rdma_netdev_bond_slave_info"}
    assert slaves == {"eth0", "eth1"}
    check_unique_and_promtool(text)


def test_a_devices_netdev_series_are_written_in_port_order(tmp_path: Path) -> None:
    # Port 1's netdev is a bond, read after the plain netdevs: its series (and its slave's ethtool series)
    # still come before port 2's, so that a device's lines read port by port.
    _two_port_mlx4(tmp_path, (["bond0", "bond0"], ["eth1", "eth1"]), ["eth0"])
    _, _, text = scrape_lag(tmp_path, nics=("eth0", "eth1"))
    ports = [m.group(1) for m in re.finditer(r'^rdma_netdev_up\{[^}]*port="(\d+)"', text, re.MULTILINE)]
    assert len(ports) == 3 and ports == sorted(ports), ports
    ports = [m.group(1) for m in re.finditer(r'^rdma_ethtool_curated_stats\{[^}]*port="(\d+)"', text, re.MULTILINE)]
    assert len(ports) == 2 and ports == sorted(ports), ports


def test_each_device_keeps_its_netdevs_stat_names_between_scrapes_until_it_is_forgotten(tmp_path: Path) -> None:
    # The second scrape reads the values and then the names once (3 ioctls, not 4), with the same series.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", ["ens1f0np0"])
    exporter = Exporter(tmp_path)
    nics = exporter.ethtool.call = FakeNics({"ens1f0np0": STATS})

    def ethtool_series() -> Sample:
        return {k: v for k, v in exporter.scrape().items() if k[0].startswith("rdma_ethtool_")}

    first = ethtool_series()
    assert nics.calls["ens1f0np0"] == 4
    assert ethtool_series() == first
    assert nics.calls["ens1f0np0"] == 4 + 3
    assert len(first) == 5  # three curated stats, the curated count and the extras over the limit
    exporter.ethtool.forget_device("mlx5_0")
    ethtool_series()
    assert nics.calls["ens1f0np0"] == 4 + 3 + 4  # a new reader starts from nothing


def test_a_netdev_that_leaves_its_device_is_read_from_nothing_when_it_comes_back(tmp_path: Path) -> None:
    # The names kept for a netdev go with it (StatSetReader.retain): kept for every netdev a device ever
    # had, a node whose VFs or bonds come and go would hold a name table for each (mutation review).
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", ["ens1f0np0"])
    exporter = Exporter(tmp_path)
    nics = exporter.ethtool.call = FakeNics({"ens1f0np0": STATS})
    link = tmp_path / "class/net/ens1f0np0"
    target = link.readlink()
    exporter.scrape()
    link.unlink()
    exporter.scrape()
    assert nics.calls["ens1f0np0"] == 4  # gone: not read
    link.symlink_to(target)
    series = exporter.scrape()
    assert nics.calls["ens1f0np0"] == 4 + 4
    assert value(series, "rdma_ethtool_pfc_pause_frames_total", device="mlx5_0", port="1", netdev="ens1f0np0",
                 direction="rx", priority="3") == 7  # fmt: skip


def test_every_source_reads_through_one_process_socket_across_reloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reload builds new sources; a socket of their own left the old one to the garbage collector, with a
    # ResourceWarning, at every SIGHUP. The process's socket serves the new sources as it served the old.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", ["ens1f0np0"])
    nics = FakeNics({"ens1f0np0": STATS})
    opened: list[FakeNics] = []

    def open_socket() -> FakeNics:
        opened.append(nics)
        return nics

    monkeypatch.setattr(ethtool_collector, "_socket", None)
    monkeypatch.setattr(ethtool_collector, "SocketEthtool", open_socket)
    monkeypatch.setattr(ethtool_collector, "live_sysfs", lambda root: True)
    for _ in range(2):  # the running sources, then those a reload builds
        exporter = Exporter(tmp_path)
        for _ in range(2):
            assert value(exporter.scrape(), "rdma_ethtool_pfc_pause_frames_total", device="mlx5_0", port="1",
                         netdev="ens1f0np0", direction="rx", priority="3") == 7  # fmt: skip
    assert len(opened) == 1
    assert nics.calls["ens1f0np0"] == 2 * (4 + 3)


def test_a_slave_reached_only_through_a_bond_on_port_2_joins_port_2(tmp_path: Path) -> None:
    # Port 2's GIDs name only its bond: the slave found through it is port 2's, in its netdev and its
    # ethtool series alike, or the joins with rdma_port_* put port 2's link on port 1 (mutation review).
    _two_port_mlx4(tmp_path, (["eth0", "eth0"], ["bond0", "bond0"]), ["eth1"])
    metrics, _, text = scrape_lag(tmp_path, nics=("eth0", "eth1"))
    ports = {dict(ls)["netdev"]: dict(ls)["port"] for (n, ls) in metrics if n == "rdma_netdev_up"}
    assert ports == {"eth0": "1", "bond0": "2", "eth1": "2"}
    ethtool_ports = {dict(ls)["netdev"]: dict(ls)["port"] for (n, ls) in metrics if n.startswith("rdma_ethtool_")}
    assert ethtool_ports == {"eth0": "1", "eth1": "2"}
    check_unique_and_promtool(text)


def test_read_order_does_not_change_the_exposition(tmp_path: Path) -> None:
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", ["ens1f0np0", "bond0"])
    _function(tmp_path, "0000:3b:00.1", "ens1f1np1", "mlx5_1", ["ens1f1np1", "bond0"])
    _bond(tmp_path, "bond0", ["ens1f0np0", "ens1f1np1"])
    infos = {d: read_device_info(tmp_path, d, SysfsReader(d)) for d in ("mlx5_0", "mlx5_1")}
    ctx = ScrapeContext(tmp_path, {})
    texts = []
    for order in (["mlx5_0", "mlx5_1"], ["mlx5_1", "mlx5_0"]):
        out = FamilySet()
        nics = FakeNics(dict.fromkeys(("ens1f0np0", "ens1f1np1"), STATS))
        for source in (NetdevSource(), EthtoolSource(call=nics)):
            results = {d: source.read(ctx, infos[d], SysfsReader(d)) for d in order}
            source.expose(results, out)
        texts.append(render(out))
    assert texts[0] == texts[1]
    assert "bond0" in texts[0]


def render(out: FamilySet) -> str:
    return prometheus_text(out).decode()


# --- configuration of extra stats ---------------------------------------------------------------------------


def test_extra_stats_are_exported_labelled(tree: Path) -> None:
    config = parse_config(
        yaml.safe_load("collector: {ethtool: {extra_stats: ['^rx_vport_rdma_unicast_bytes$', '^ch[0-9]+_poll$']}}"),
        "test",
    )
    exporter = Exporter(tree / "sys", tree / "ethtool", config)
    metrics = exporter.scrape()
    raw = capture(tree / "ethtool", ROCE["mlx5_8"])
    port = {"device": "mlx5_8", "port": "1", "netdev": ROCE["mlx5_8"]}
    got = value(metrics, "rdma_ethtool_stat_vport_rdma_unicast_bytes_total", **port, direction="rx")
    assert got == raw["rx_vport_rdma_unicast_bytes"]
    for channel in ("0", "1"):
        polls = value(metrics, "rdma_ethtool_stat_channel_poll_total", **port, direction="", channel=channel)
        assert polls == raw[f"ch{channel}_poll"]
    promtool_check_metrics(exporter.text())


def test_extras_past_the_limit_are_counted_logged_once_and_not_exported(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A broken driver or capture listing 200,000 lane_N names took 7 s a scrape, past the deadline the
    # reads keep, and a 79 MB answer, with nothing counted (review).
    netdev, other = ROCE["mlx5_8"], ROCE["mlx5_9"]
    path = tree / "ethtool" / netdev
    original = path.read_text()
    flood = original + "".join(f"     s{i}_lane_0: {i}\n" for i in range(MAX_EXTRA_STATS + 10))
    port = {"device": "mlx5_8", "port": "1", "netdev": netdev}
    exporter = Exporter(tree / "sys", tree / "ethtool")
    baseline = exporter.scrape()

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if "rdma_ethtool_extra_stats_over_limit" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="rdma_exporter.collect.ethtool"):
        path.write_text(flood)
        for _ in range(2):
            metrics = exporter.scrape()
        assert value(metrics, "rdma_ethtool_extra_stats_over_limit", **port) == 10
        assert value(metrics, "rdma_ethtool_extra_stats_over_limit", netdev=other) == 0
        extras = {(n, ls) for n, ls in series(metrics, "rdma_ethtool_stat_") if ("netdev", netdev) in ls}
        assert len(extras) == MAX_EXTRA_STATS
        # The first ones in the driver's order are kept, and every curated series is still there.
        assert value(metrics, "rdma_ethtool_stat_lane_s0_total", **port) == 0
        assert value(metrics, f"rdma_ethtool_stat_lane_s{MAX_EXTRA_STATS}_total", **port) is None
        curated = {key for key in series(baseline, "rdma_ethtool_") if not key[0].startswith("rdma_ethtool_stat_")}
        assert curated <= set(metrics)
        known = "rdma_ethtool_curated_stats"
        assert value(metrics, known, **port) == value(baseline, known, **port)
        (line,) = lines()  # once for the episode, not every scrape
        assert netdev in line and " 10 " in line
        assert "mlx5_8" in line and "lane_N" in line  # no extra_stats here: the driver's names are the cause
        # Back under the limit: 0 and the episode over; a new one is logged again.
        path.write_text(original)
        assert value(exporter.scrape(), "rdma_ethtool_extra_stats_over_limit", **port) == 0
        path.write_text(flood)
        exporter.scrape()
        assert len(lines()) == 2
        # A device that goes and comes back (a driver reload) is a new device: its episode is new too. So
        # is a netdev that goes and comes back while its device stays.
        for logged, link in enumerate((tree / "sys/class/infiniband/mlx5_8", tree / "sys/class/net" / netdev), 3):
            target = link.readlink()
            link.unlink()
            assert value(exporter.scrape(), "rdma_ethtool_extra_stats_over_limit", **port) is None
            link.symlink_to(target)
            assert value(exporter.scrape(), "rdma_ethtool_extra_stats_over_limit", **port) == 10
            assert len(lines()) == logged, link
    promtool_check_metrics(exporter.text())


def test_bad_extra_stats_regex_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "rdma.yml"
    path.write_text("collector:\n  ethtool:\n    extra_stats: ['^rx_', 'tx_(']\n")
    with pytest.raises(ConfigError) as err:
        load_config_file(path)
    assert (err.value.source, err.value.key) == (str(path), "collector.ethtool.extra_stats[1]")
    assert "invalid regular expression" in err.value.reason
    for bad in ("^rx_", [""], [3], {"a": 1}):
        with pytest.raises(ConfigError):
            check_extra_stats("f", "k", bad)
    assert check_extra_stats("f", "k", None) == ()


# Patterns that reach each of the validator's refusals, not only a plain syntax error: a repeat count
# past the engine's limit, nesting past the recursion limit, a set that warns of a future meaning.
awkward_patterns = st.sampled_from(
    ["a{4294967296}", "(" * 1200 + ")" * 1200, "[[:alpha:]]", "[a--b]", "x{2,1}", "rx_.*", "(" * 200 + ")" * 200]
)


@given(st.one_of(st.none(), st.text(max_size=10),
                 st.lists(st.one_of(st.text(max_size=24), st.integers(), awkward_patterns), max_size=5)))  # fmt: skip
def test_extra_stats_validator_accepts_or_explains(value: object) -> None:
    try:
        patterns = check_extra_stats("file.yml", "collector.ethtool.extra_stats", value)
    except ConfigError as exc:
        assert exc.source == "file.yml" and exc.key.startswith("collector.ethtool.extra_stats")
    else:
        assert all(isinstance(p, re.Pattern) for p in patterns)


# --- naming, units, curated label table -----------------------------------------------------------------------

PROMTOOL_UNITS = re.compile(
    r"(^|_)(bits|minutes|hours|days|weeks|kelvins|inches|yards|miles|calories|pounds|ounces|s|ms|us|ns|sec|b|kb|mb|gb|tb"
    r"|pb|m|h|d|(pico|nano|micro|milli|centi|deci|deca|hecto|kilo|kibi|mega|mibi|giga|gibi|tera|tebi|peta|pebi)"
    r"(seconds|bytes|meters|grams|volts|amperes|joules|bits))(_|$)"
)


def test_curated_label_table_matches_the_parser() -> None:
    assert set(CURATED_LABELS) == set(CURATED_HELP)
    captures = [FIXTURES / "ethtool" / p for p in os.listdir(FIXTURES / "ethtool")]
    seen = set()
    for path in captures:
        for stat in curate(parse_stats_text(path.read_text(errors="replace"))):
            if stat.key in CURATED_LABELS:
                assert tuple(name for name, _ in stat.labels) == CURATED_LABELS[stat.key], stat
                seen.add(stat.key)
    assert len(seen) > 10
    for spec in CURATED_SPECS.values():
        assert not PROMTOOL_UNITS.search(spec.name), spec.name
    assert set(CURATED_RENAMES) <= set(CURATED_LABELS)


@given(
    st.from_regex(r"([a-z0-9]{1,8}|histogram|summary|gauge|counter)(_([a-z0-9]{1,8}|histogram|gauge|total|count|sum"
                  r"|bucket)){0,5}", fullmatch=True),
    st.sampled_from(["counter", "gauge"]),
)
def test_lint_safe_names_pass_the_promtool_unit_rules(key: str, kind: str) -> None:
    name = metric_name(key, kind)
    assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name)
    body = name[: -len("_total")] if kind == "counter" else name
    assert not PROMTOOL_UNITS.search(body), name
    # promtool rejects the name of any metric type in a name, not only the family's own.
    assert not re.search(r"(^|_)(counter|gauge|histogram|summary)(_|$)", body), name
    # promtool keeps these endings for counters, histograms and summaries.
    assert kind == "counter" or not re.search(r"_(total|count|sum|bucket)$", name), name
    assert lint_safe(lint_safe(key, kind), kind) == lint_safe(key, kind)


# promtool's own list of unit abbreviations, each of which must be spelled out: the hypothesis test
# above seldom draws a two-letter token such as `us`.
PROMTOOL_ABBREVIATIONS = ("s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d")


@pytest.mark.parametrize("abbreviation", PROMTOOL_ABBREVIATIONS)
@pytest.mark.parametrize("kind", ["counter", "gauge"])
def test_every_unit_abbreviation_promtool_rejects_is_spelled_out(abbreviation: str, kind: str) -> None:
    for key in (f"rx_{abbreviation}", f"{abbreviation}_latency", f"rx_{abbreviation}_lane_1"):
        safe = lint_safe(key, kind)
        assert not PROMTOOL_UNITS.search(safe), (key, safe)


def test_a_stat_whose_labels_do_not_fit_its_family_is_left_out() -> None:
    # A curated stat carries its family's labels; one that does not (a rule's mistake) is left out and not
    # counted, rather than exported under a family whose other series have other labels.
    stats = (
        CuratedStat("pfc_pause_frames", 5, (("direction", "rx"), ("priority", "3")), "counter", 1.0, "rx_prio3_pause"),
        CuratedStat("pfc_pause_frames", 9, (("direction", "rx"),), "counter", 1.0, "bogus"),  # no priority
        CuratedStat("stat_x", 1, (("direction", "rx"),), "counter", 1.0, "rx_x"),
        CuratedStat("stat_x", 2, (("direction", "rx"), ("queue", "1")), "counter", 1.0, "rx1_x"),
    )
    out = FamilySet()
    EthtoolSource().expose({"mlx5_0": EthtoolReading(((1, "eth0", stats, 0),))}, out)
    base = {"device": "mlx5_0", "port": "1", "netdev": "eth0"}
    got = {(name, tuple(sorted(labels))): v for (name, labels), v in samples(render(out)).items()}
    assert got == {
        ("rdma_ethtool_pfc_pause_frames_total", tuple(sorted({**base, "direction": "rx", "priority": "3"}.items()))): 5,
        ("rdma_ethtool_stat_x_total", tuple(sorted({**base, "direction": "rx"}.items()))): 1,
        ("rdma_ethtool_curated_stats", tuple(sorted(base.items()))): 1,
        ("rdma_ethtool_extra_stats_over_limit", tuple(sorted(base.items()))): 0,
    }, got


def test_awkward_extra_names_pass_promtool() -> None:
    out = FamilySet()
    names = ["rx_timeout_ms", "tx_kilobytes", "rx_fec_corrected_bits_lane_1", "rx_counter_counter", "tx_s_b_kb",
             "rx_total_total", "rx_q7_hours", "rx_prio_9_x"]  # fmt: skip
    stats = tuple(curate(dict.fromkeys(names, 1), [re.compile(".")]))
    EthtoolSource().expose({"mlx5_0": EthtoolReading(((1, "eth0", stats, 0),))}, out)
    promtool_check_metrics(render(out))


# Names that lint_safe makes into one metric name (a unit suffix renamed, a `_total` dropped), so that
# the uniqueness check below meets the collisions it guards against.
colliding_names = st.sampled_from(["rx_ms", "rx_msec", "tx_bits", "tx_bit", "rx_x_total", "rx_x", "tx_s", "tx_sec"])


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.one_of(st.from_regex(r"[a-z]{1,3}(_[a-z0-9]{1,4}){0,3}", fullmatch=True), colliding_names),
                       st.integers(0, 2**64 - 1), max_size=12))  # fmt: skip
def test_expose_of_any_extras_is_valid_and_unique(stats: dict[str, int]) -> None:
    curated = tuple(curate(stats, [re.compile(".")]))
    out = FamilySet()
    EthtoolSource().expose({"mlx5_0": EthtoolReading(((1, "eth0", curated, 0),))}, out)
    text = render(out)
    keys = [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert len(keys) == len(set(keys))
    list(text_string_to_metric_families(text))


@pytest.mark.parametrize(
    ("raw", "scale", "expected"),
    [(4061709, 1e-6, 4.061709), (221261, 1e-6, 0.221261), (37, 0.01, 0.37), (5, 1.0, 5), (3, 0.5, 1.5),
     (10, 0.4, 4.0), (3, 2.0, 6.0)],  # 0.4 and 2 are no 1/n: multiplied, not divided by round(1/scale)
)
def test_scaled_values_are_exact(raw: int, scale: float, expected: float) -> None:
    assert scaled(CuratedStat("k", raw, (), "counter", scale)) == expected


# --- live sysfs detection and the reader's absent errnos ------------------------------------------------------


def test_live_sysfs(tmp_path: Path) -> None:
    if not is_sysfs_mount("/sys"):
        skip_or_fail("/sys is not a sysfs mount here")
    assert live_sysfs("/sys")
    assert not live_sysfs(str(tmp_path))


def test_live_sysfs_when_mountinfo_cannot_tell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Unreadable mountinfo (is_sysfs_mount answers None): a real host must not go silent, so the ioctl is used.
    from rdma_exporter.collect import ethtool as collect_ethtool

    monkeypatch.setattr(collect_ethtool, "is_sysfs_mount", lambda root: None)
    live_sysfs.cache_clear()
    try:
        assert live_sysfs(str(tmp_path / "unknown"))
    finally:
        live_sysfs.cache_clear()


def test_not_a_sysfs_mount_is_warned_about_once(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every scrape finds the same fixture tree: one warning says why there is no ethtool data, not one per scrape."""
    if live_sysfs(str(tree / "sys")):
        skip_or_fail("cannot tell a sysfs mount from a directory here (/proc/self/mountinfo unreadable)")
    from rdma_exporter.collect import ethtool

    ethtool._WARNED_NOT_SYSFS.discard(str(tree / "sys"))
    with caplog.at_level(logging.WARNING, logger="rdma_exporter.collect.ethtool"):
        # A reload builds a new source: it said it again on each (log review).
        for _ in range(2):
            exporter = Exporter(tree / "sys")
            for _ in range(3):
                exporter.scrape()
    assert len([r for r in caplog.records if "not a mounted sysfs" in r.getMessage()]) == 1


def test_reader_absent_errnos_on_a_real_attribute() -> None:
    # Loopback has no link speed: the kernel answers EINVAL, "no value", not a failure.
    speed = Path("/sys/class/net/lo/speed")
    if not speed.exists():
        skip_or_fail("no /sys/class/net/lo")
    reader = SysfsReader("lo")
    assert reader.text(speed, absent_errnos=NO_VALUE_ERRNOS) is None
    assert reader.errors.total() == 0
    assert reader.text(speed) is None
    assert dict(reader.errors.counts) == {("lo", "io"): 1}


def test_reader_absent_errnos_covers_open_and_read(tmp_path: Path) -> None:
    reader = SysfsReader("x")
    assert reader.text(tmp_path, absent_errnos={errno.EISDIR}) is None  # read() of a directory: EISDIR
    assert reader.uint(tmp_path / "none", absent_errnos={errno.ENOENT}) is None
    assert reader.errors.total() == 0


# --- exposition bounds and bookkeeping --------------------------------------------------------------------------


def exposed(out: FamilySet) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(render(out))
            for s in family.samples]  # fmt: skip


def test_netdev_in_two_devices_readings_is_exposed_once_under_the_first() -> None:
    stats = tuple(curate({"rx_prio3_pause": 7, "rx_discards_phy": 1}))
    out = FamilySet()
    # The second device's reading of eth0 (say a scrape that raced a LAG change) must not double its series.
    EthtoolSource().expose({d: EthtoolReading(((1, "eth0", stats, 0),)) for d in ("mlx5_1", "mlx5_0")}, out)
    got = exposed(out)
    assert len(got) == 4  # two curated, curated_stats and extra_stats_over_limit
    assert {labels["device"] for _, labels, _ in got} == {"mlx5_0"}


def test_curated_stats_counts_neither_extras_nor_uncurated_lanes() -> None:
    names = {"rx_prio3_pause": 1, "rx_err_lane_2_phy": 2, "rx_fec_corrected_lane_1": 3, "rx_vport_unicast_bytes": 4}
    stats = tuple(curate(names, [re.compile("vport")]))
    assert len(stats) == 4
    out = FamilySet()
    EthtoolSource().expose({"mlx5_0": EthtoolReading(((1, "eth0", stats, 0),))}, out)
    counts = [v for n, _, v in exposed(out) if n == "rdma_ethtool_curated_stats"]
    assert counts == [2]


def test_series_memo_stays_bounded_and_exposition_survives_its_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    from rdma_exporter.collect import ethtool as collect_ethtool

    monkeypatch.setattr(collect_ethtool, "MAX_SERIES_MEMO", 4)
    # A driver inventing names (per-channel stats of a growing channel count) under a broad extra pattern.
    stats = tuple(curate({f"ch{i}_poll": i for i in range(10)}, [re.compile("poll")]))
    source = EthtoolSource()
    for _ in range(2):
        out = FamilySet()
        source.expose({"mlx5_0": EthtoolReading(((1, "eth0", stats, 0),))}, out)
        polls = {labels["channel"]: v for n, labels, v in exposed(out) if n == "rdma_ethtool_stat_channel_poll_total"}
        assert polls == {str(i): float(i) for i in range(10)}
        assert len(source._series) <= 4


def test_extra_port_wide_and_per_queue_stats_are_all_exposed() -> None:
    # mlx5's port-wide tx_queue_stopped and per-queue txN_stopped, both opted in: today the per-queue series
    # are dropped without a trace (their labels differ from the spec the first name created).
    stats = tuple(curate({"tx_queue_stopped": 5, "tx0_stopped": 2, "tx1_stopped": 3}, [re.compile("stopped")]))
    out = FamilySet()
    EthtoolSource().expose({"mlx5_0": EthtoolReading(((1, "eth0", stats, 0),))}, out)
    values = sorted(v for n, _, v in exposed(out) if n.startswith("rdma_ethtool_stat_"))
    assert values == [2, 3, 5]


def test_extra_stats_pattern_count_limit_is_inclusive() -> None:
    from rdma_exporter.collect.ethtool import MAX_EXTRA_PATTERNS

    patterns = [f"^stat{i}$" for i in range(MAX_EXTRA_PATTERNS + 1)]
    assert len(check_extra_stats("f", "k", patterns[:MAX_EXTRA_PATTERNS])) == MAX_EXTRA_PATTERNS
    with pytest.raises(ConfigError) as err:
        check_extra_stats("f", "k", patterns)
    assert "combine names with |" in err.value.reason


def test_unexpected_exception_while_reading_costs_one_netdev(
    tree: Path, metrics: Sample, caplog: pytest.LogCaptureFixture
) -> None:
    # Not an EthtoolError (a parser bug, a driver answer nobody foresaw): still one netdev's loss, counted.
    exporter = Exporter(tree / "sys")
    nics = fake_nics(tree)

    calls = iter(range(1, 100))

    def buggy(ifname: str, buffer: array) -> None:
        if ifname == ROCE["mlx5_8"]:
            # A message that changes every time must not make every scrape's line a warning.
            raise struct.error(f"unpack requires a buffer of {8 * next(calls)} bytes")
        nics(ifname, buffer)

    exporter.ethtool.call = buggy
    with caplog.at_level(logging.DEBUG, logger="rdma_exporter.collect.ethtool"):
        got = exporter.scrape()
        assert_only_mlx5_8_lost(got, metrics)
        assert read_errors(got, "ethtool") == {("mlx5_8", "io"): 1}
        assert value(got, "rdma_exporter_scrape_collector_success", collector="ethtool") == 1
        # Logged as a warning once per episode, not on every scrape; its end is logged too.
        exporter.scrape()
        exporter.ethtool.call = nics
        exporter.scrape()
        exporter.ethtool.call = buggy
        exporter.scrape()
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    def failed(size: int) -> str:
        return f"ethtool statistics of {ROCE['mlx5_8']} failed: error('unpack requires a buffer of {size} bytes')"

    assert logged == [
        ("WARNING", failed(8)),
        ("DEBUG", failed(16)),
        ("INFO", f"ethtool statistics of {ROCE['mlx5_8']} (device mlx5_8) read again"),
        ("WARNING", failed(24)),
    ], logged
    # A struct.error is no kernel answer but a bug here: each episode's warning carries its traceback.
    assert [r.exc_info is not None and r.exc_info[0] is struct.error for r in caplog.records] == [
        True, False, False, True
    ]


def test_failing_netdev_that_vanishes_ends_its_episode(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A netdev unregistered while its reads fail, then registered again (a driver reload): the state of
    # the old episode goes with it, so the new netdev's first failure is a warning, not a repeat.
    exporter = Exporter(tree / "sys")
    nics = fake_nics(tree)

    def buggy(ifname: str, buffer: array) -> None:
        if ifname == ROCE["mlx5_8"]:
            raise struct.error("unpack requires a buffer of 8 bytes")
        nics(ifname, buffer)

    exporter.ethtool.call = buggy
    link = tree / "sys" / "class" / "net" / ROCE["mlx5_8"]
    target = os.readlink(link)
    with caplog.at_level(logging.DEBUG, logger="rdma_exporter.collect.ethtool"):
        exporter.scrape()
        link.unlink()
        exporter.scrape()
        link.symlink_to(target)
        exporter.scrape()
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    logged = [(level, message) for level, message in logged if message.startswith("ethtool statistics of")]
    # The end is said (fault review, stop 60): the log's last word on the netdev was that it failed.
    assert [level for level, _ in logged] == ["WARNING", "INFO", "WARNING"], logged
    assert logged[1][1] == (
        f"ethtool statistics of {ROCE['mlx5_8']} (device mlx5_8) are no longer read: the netdev is gone or no "
        "longer one of the device's RoCE netdevs"
    )


def test_failing_netdev_of_a_port_that_turns_infiniband_ends_its_episode(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The device has no Ethernet port left (a VPI port set to InfiniBand): nothing of it is read any more,
    # and that ends its netdevs' failures as a netdev going away does, with a line (diff review, stop 61).
    exporter = Exporter(tree / "sys")
    nics = fake_nics(tree)
    exporter.ethtool.call = nics
    netdev = ROCE["mlx5_8"]
    nics.errno[netdev] = errno.EIO
    with caplog.at_level(logging.INFO, logger="rdma_exporter.collect.ethtool"):
        exporter.scrape()
        (tree / "sys" / "class" / "infiniband" / "mlx5_8" / "ports" / "1" / "link_layer").write_text("InfiniBand\n")
        exporter.collector.inventory.invalidate("mlx5_8")
        exporter.scrape()
        exporter.scrape()
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in logged] == ["WARNING", "INFO"], logged
    assert logged[1][1] == (
        f"ethtool statistics of {netdev} (device mlx5_8) are no longer read: the netdev is gone or no longer "
        "one of the device's RoCE netdevs"
    )


def test_ipoib_netdev_of_a_vpi_devices_infiniband_port_is_not_read(tmp_path: Path) -> None:
    # A VPI NIC (e.g. ConnectX-3, mlx4) with port 1 on Ethernet and port 2 on InfiniBand: the device is read
    # for port 1's netdev, but port 2's IPoIB netdev (dev_port 1) has no PFC or PHY counters of the RDMA link.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", ["ens1f0np0"])
    fn = f"{PCI}/0000:3b:00.0"
    write_files(tmp_path, {f"{fn}/net/ib0/operstate": "up\n", f"{fn}/net/ib0/dev_port": "1\n",
                           f"{fn}/infiniband/mlx5_0/ports/2/link_layer": "InfiniBand\n",
                           f"{fn}/infiniband/mlx5_0/ports/2/state": "4: ACTIVE\n",
                           f"{fn}/infiniband/mlx5_0/ports/2/phys_state": "5: LinkUp\n"})  # fmt: skip
    symlink(tmp_path, f"{fn}/net/ib0/device", fn)
    symlink(tmp_path, "class/net/ib0", f"{fn}/net/ib0")
    ports = {p.number: p for p in read_device_info(tmp_path, "mlx5_0", SysfsReader("mlx5_0")).ports}
    assert ports[2].link_layer == "InfiniBand" and "ib0" in ports[2].netdevs  # the tree is what it claims
    exporter = Exporter(tmp_path)
    nics = exporter.ethtool.call = FakeNics(dict.fromkeys(("ens1f0np0", "ib0"), STATS))
    metrics = exporter.scrape()
    assert set(nics.calls) == {"ens1f0np0"}
    assert {dict(ls)["netdev"] for n, ls in series(metrics, "rdma_ethtool_")} == {"ens1f0np0"}


def test_other_devices_netdev_in_the_gid_table_is_read_by_its_own_device(tmp_path: Path) -> None:
    # mlx5_0's GID table names mlx5_1's physical netdev (no bond, no VLAN between them): that netdev's
    # PFC and PHY counters are mlx5_1's link's, read once and joined to mlx5_1 only.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", ["ens1f0np0", "ens1f1np1"])
    _function(tmp_path, "0000:3b:00.1", "ens1f1np1", "mlx5_1", ["ens1f1np1"])
    metrics, nics, text = scrape_lag(tmp_path)
    assert dict(nics.calls) == {"ens1f0np0": 4, "ens1f1np1": 4}
    ethtool = {(dict(ls)["netdev"], dict(ls)["device"]) for (n, ls) in metrics if n.startswith("rdma_ethtool_")}
    assert ethtool == {("ens1f0np0", "mlx5_0"), ("ens1f1np1", "mlx5_1")}
    check_unique_and_promtool(text)


def test_a_host_netdev_named_like_a_containers_is_not_read_for_a_vf(tmp_path: Path) -> None:
    # An SR-IOV VF's RDMA device stays in the host's class/infiniband while its netdev, eth1, lives in a
    # pod; its GID table still names eth1. The host's own eth1, on another card without RDMA, is not the
    # VF's: its statistics were exported under the VF's device (found by the ethtool review). The second
    # port of a RoCE LAG, a function of the same card, stays local (test_roce_lag_* above).
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", ["ens1f0np0"])
    _function(tmp_path, "0000:01:00.0", "eth1", None, [])
    vf = f"{PCI}/0000:3b:00.2/infiniband/mlx5_4"
    port = f"{vf}/ports/1"
    write_files(tmp_path, {f"{port}/link_layer": "Ethernet\n", f"{port}/state": "4: ACTIVE\n",
                           f"{port}/phys_state": "5: LinkUp\n", f"{port}/gid_attrs/ndevs/0": "eth1\n"})  # fmt: skip
    symlink(tmp_path, f"{vf}/device", f"{PCI}/0000:3b:00.2")
    symlink(tmp_path, "class/infiniband/mlx5_4", vf)
    metrics, nics, text = scrape_lag(tmp_path, ("ens1f0np0", "eth1"))
    assert "eth1" not in nics.calls
    # No statistics of the host's eth1, and no rdma_port_netdev_info binding it to the VF either: joined
    # on netdev with node_exporter's series (docs/operations.md), it put the host's eth1 under mlx5_4
    # (found by review). A name from another namespace says nothing this namespace can join on.
    read = {(dict(ls)["netdev"], dict(ls)["device"]) for (n, ls) in metrics
            if n.startswith(("rdma_netdev_", "rdma_ethtool_", "rdma_port_netdev_info"))}  # fmt: skip
    assert read == {("ens1f0np0", "mlx5_0")}, read
    errors = [k for k in metrics if k[0] == "rdma_exporter_file_read_errors_total"
              and dict(k[1])["collector"] in ("netdev", "ethtool")]  # fmt: skip
    assert errors == [], "a netdev in a pod's namespace is no error"
    check_unique_and_promtool(text)


def test_bond_over_a_vlan_reads_no_ethtool_of_the_vlan(tmp_path: Path) -> None:
    # A bond whose slave is a VLAN of the port's netdev: the VLAN has no hardware statistics (the ioctl
    # would fail and count an error every scrape); the port's own netdev is read, once.
    _function(tmp_path, "0000:3b:00.0", "ens1f0np0", "mlx5_0", ["ens1f0np0", "bond0"])
    _vlan(tmp_path, "ens1f0np0.7", "ens1f0np0")
    _bond(tmp_path, "bond0", ["ens1f0np0.7"])
    metrics, nics, _ = scrape_lag(tmp_path, nics=("ens1f0np0",))
    assert dict(nics.calls) == {"ens1f0np0": 4}
    assert {dict(ls)["netdev"] for (n, ls) in metrics if n.startswith("rdma_ethtool_")} == {"ens1f0np0"}
    assert series(metrics, "rdma_exporter_file_read_errors_total") == set()


def test_extras_that_lint_to_one_name_are_exposed_once_with_the_first_value() -> None:
    # `ms` is spelled `msec` for promtool, so rx_wait_ms and rx_wait_msec make one metric and label set.
    stats = tuple(curate({"rx_wait_ms": 1, "rx_wait_msec": 2}, [re.compile("wait")]))
    assert len(stats) == 2
    out = FamilySet()
    EthtoolSource().expose({"mlx5_0": EthtoolReading(((1, "eth0", stats, 0),))}, out)
    assert [(n, v) for n, _, v in exposed(out) if n.startswith("rdma_ethtool_stat_")] == [
        ("rdma_ethtool_stat_wait_msec_total", 1)
    ]
