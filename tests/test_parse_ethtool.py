"""ethtool statistics: text parser on real captures, the SIOCETHTOOL reader against the real kernel and a
scripted fake one, and curation into labelled keys."""

from __future__ import annotations

import ctypes
import errno
import gc
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdma_exporter.collect import ethtool as collect_ethtool
from rdma_exporter.parse import ethtool
from rdma_exporter.parse.ethtool import (
    CURATED_HELP,
    DEFAULT_ATTEMPTS,
    ETH_GSTRING_LEN,
    ETHTOOL_GDRVINFO,
    ETHTOOL_GSSET_INFO,
    ETHTOOL_GSTATS,
    ETHTOOL_GSTRINGS,
    MAX_CAPTURE_BYTES,
    MAX_EXTRA_STATS,
    MAX_STATS,
    MODULE_EVENTS,
    CuratedStat,
    EthtoolError,
    GuardedMemory,
    SocketEthtool,
    StatNames,
    StatSetReader,
    _decide,
    curate,
    curate_counted,
    generic_key,
    parse_stats_text,
    read_stat_set,
    read_stats_file,
    read_stats_ioctl,
)
from rdma_exporter.parse.reader import (
    REASON_IO,
    REASON_MISSING,
    REASON_PERMISSION,
    REASON_UNSUPPORTED,
)

from conftest import require_binary, skip_or_fail

FIXTURES = Path(__file__).parent / "fixtures" / "ethtool"
K515 = FIXTURES / "mlx5_cx6dx_100g_k5.15_nonzero_global_pause.txt"
K65 = FIXTURES / "mlx5_cx6dx_100g_k6.5_nonzero_global_pause.txt"
QUIRKS = FIXTURES / "node_exporter_eth0_generic_with_quirks.txt"
BNXT = FIXTURES / "bnxt_en_synthetic_pfc_prio3.txt"
ICE = FIXTURES / "ice_e810_synthetic_pfc_prio3.txt"
EXPORTER_DIR = Path(__file__).resolve().parent.parent / "exporter"

# What a key may look like once the exposition prefixes `rdma_ethtool_` (and maybe appends `_total`).
KEY = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")
LABEL_VALUES = {
    "direction": {"rx", "tx"},
    "priority": {str(p) for p in range(8)},
    "lane": {str(lane) for lane in range(16)},
    "operation": {"read", "write"},
    "event": set(MODULE_EVENTS),
}
EXTRA_LABEL_VALUES = {
    "direction": {"rx", "tx", ""},
    "priority": LABEL_VALUES["priority"],
    "lane": LABEL_VALUES["lane"],
    "queue": {str(q) for q in range(4096)},
    "channel": {str(c) for c in range(4096)},
}


def by_source(stats: list[CuratedStat]) -> dict[str, CuratedStat]:
    return {s.source: s for s in stats}


# --- text parser on the real captures ------------------------------------------------------------------


def test_parse_mlx5_k515_capture() -> None:
    malformed: list[str] = []
    stats = parse_stats_text(K515.read_text(), malformed)
    assert malformed == []
    assert len(stats) == 101
    assert next(iter(stats)) == "rx_packets"
    assert list(stats)[-1] == "rx0_xdp_tx_cqes"
    assert stats["rx_packets"] == 333854100
    assert stats["rx_out_of_buffer"] == 990473555
    assert stats["rx_discards_phy"] == 58591428329
    assert stats["tx_pause_ctrl_phy"] == 5745055
    assert stats["tx_global_pause"] == 5745042
    assert stats["tx_global_pause_duration"] == 771103810
    assert stats["rx_prio0_discards"] == 58591314012
    assert stats["rx_xdp_redirect"] == 0


def test_parse_mlx5_k65_capture() -> None:
    malformed: list[str] = []
    stats = parse_stats_text(K65.read_text(), malformed)
    assert malformed == []
    assert len(stats) == 108
    assert stats["rx_bytes_phy"] == 46609758231313
    assert stats["rx_buffer_passed_thres_phy"] == 1192226
    assert stats["tx_global_pause_duration"] == 5961284324
    assert stats["rx0_pp_recycle_released_ref"] == 0


def test_parse_generic_capture_quirks() -> None:
    malformed: list[str] = []
    text = QUIRKS.read_text()
    assert text.startswith("# ethtool -S eth0\n")
    stats = parse_stats_text(text, malformed)
    assert malformed == []  # the comment and the header are not garbage
    assert len(stats) == 16
    assert "# ethtool -S eth0" not in stats and "NIC statistics" not in stats
    assert stats["port.rx_dropped"] == 12028
    assert stats["rx_missed"] == 401
    # Near-duplicates stay apart in parsing; curation is what merges them (see below).
    assert stats["duplicate metric"] == 1
    assert stats["duplicate_metric"] == 2
    assert list(stats)[:2] == ["tx_packets", "rx_packets"]


def test_parse_garbage_lines_are_reported_not_fatal() -> None:
    text = (
        "NIC statistics:\n"
        "     good: 1\n"
        "this line has no separator\n"
        "     negative: -1\n"
        "     too_big: 18446744073709551616\n"
        "     max: 18446744073709551615\n"
        "     spaced value : 5  \n"
        "     a: b: 7\n"
        "     word: seven\n"
        "     : 4\n"
        "     empty_value:\n"
        "\tindented_header:\n"
        "\n"
        "     good: 99\n"
        "Standard stats for eth0:\n"
    )
    malformed: list[str] = []
    stats = parse_stats_text(text, malformed)
    assert stats == {"good": 1, "max": 2**64 - 1, "spaced value": 5, "a: b": 7}
    assert malformed == [
        "this line has no separator",
        "     negative: -1",
        "     too_big: 18446744073709551616",
        "     word: seven",
        "     : 4",
        "     empty_value:",
        "\tindented_header:",  # indented by a tab is no header either
    ]
    # Counting is the caller's choice: without a list the same text still parses.
    assert parse_stats_text(text) == stats


def test_read_stats_file(tmp_path: Path) -> None:
    shutil.copy(K515, tmp_path / "ens1f0np0")
    assert read_stats_file(tmp_path, "ens1f0np0")["rx_out_of_buffer"] == 990473555
    with pytest.raises(EthtoolError) as missing:
        read_stats_file(tmp_path, "ens9")
    assert missing.value.reason == REASON_MISSING
    assert missing.value.ifname == "ens9"
    with pytest.raises(EthtoolError) as escape:
        read_stats_file(tmp_path, "../etc")
    assert escape.value.reason == REASON_MISSING
    (tmp_path / "adir").mkdir()
    with pytest.raises(EthtoolError) as directory:
        read_stats_file(tmp_path, "adir")
    assert directory.value.reason == REASON_IO
    # A capture of garbage alone (`ethtool -S ... 2>&1` saving an error text): each line is counted as
    # malformed, not taken for a driver without statistics (mutation review).
    (tmp_path / "eth0").write_text("no stats available\n")
    bad: list[str] = []
    assert read_stats_file(tmp_path, "eth0", bad) == {}
    assert bad == ["no stats available"]
    # Names no netdev can have never leave the capture directory, even where the path they make exists.
    captures = tmp_path / "captures"
    captures.mkdir()
    for name in ("../ens1f0np0", ".", ".."):
        with pytest.raises(EthtoolError) as outside:
            read_stats_file(captures, name)
        assert outside.value.reason == REASON_MISSING, name


def test_capture_that_is_a_fifo_or_too_large_costs_that_netdev_only(tmp_path: Path) -> None:
    # A FIFO would block the reader thread for ever in open() or read(); a huge file would fill memory.
    os.mkfifo(tmp_path / "eth0")
    with pytest.raises(EthtoolError) as fifo:
        read_stats_file(tmp_path, "eth0")
    assert (fifo.value.reason, fifo.value.detail) == (REASON_IO, "not a regular file")
    with open(tmp_path / "eth1", "wb") as huge:
        huge.truncate(MAX_CAPTURE_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(EthtoolError) as large:
        read_stats_file(tmp_path, "eth1")
    assert (large.value.reason, large.value.detail) == (REASON_IO, f"larger than {MAX_CAPTURE_BYTES} bytes")
    # A capture of exactly the limit is read.
    line = b"     rx_prio3_pause: 5\n"
    (tmp_path / "eth2").write_bytes(b"NIC statistics:\n".ljust(MAX_CAPTURE_BYTES - len(line), b"\n") + line)
    assert read_stats_file(tmp_path, "eth2") == {"rx_prio3_pause": 5}


def test_capture_with_bytes_that_are_not_utf8_keeps_its_stats(tmp_path: Path) -> None:
    # A capture saved through a tool that mangled one byte must not cost every statistic of the netdev.
    (tmp_path / "eth0").write_bytes(b"NIC statistics:\n     rx_prio3_pause: 5\n     bad\xffname: 1\n")
    assert read_stats_file(tmp_path, "eth0") == {"rx_prio3_pause": 5, "bad\ufffdname": 1}


# --- curation ------------------------------------------------------------------------------------------


def test_curate_real_mlx5_capture() -> None:
    curated = curate(parse_stats_text(K515.read_text()))
    got = [(c.key, dict(c.labels), c.value) for c in curated]
    assert got == [
        ("out_of_buffer", {"direction": "rx"}, 990473555),
        ("port_packets", {"direction": "tx"}, 5588396729),
        ("port_packets", {"direction": "rx"}, 97052087562),
        ("port_bytes", {"direction": "tx"}, 357657403514),
        ("port_bytes", {"direction": "rx"}, 6211329423080),
        ("pause_mac_control_frames", {"direction": "tx"}, 5745055),
        ("port_discards", {"direction": "rx"}, 58591428329),
        ("port_discards", {"direction": "tx"}, 0),
        # The poster's filter kept these zero error counters (counters.rst classes them as Error).
        ("port_errors", {"direction": "tx"}, 0),
        ("undersize_packets", {"direction": "rx"}, 0),
        ("fragment_packets", {"direction": "rx"}, 0),
        ("jabber_packets", {"direction": "rx"}, 0),
        ("priority_bytes", {"direction": "rx", "priority": "0"}, 6211318150440),
        ("priority_packets", {"direction": "rx", "priority": "0"}, 38460533605),
        ("priority_discards", {"direction": "rx", "priority": "0"}, 58591314012),
        ("priority_bytes", {"direction": "tx", "priority": "0"}, 357288052986),
        ("priority_packets", {"direction": "tx", "priority": "0"}, 5582625883),
        ("global_pause_frames", {"direction": "tx"}, 5745042),
        ("global_pause_duration_seconds", {"direction": "tx"}, 771103810),
    ]
    duration = by_source(curated)["tx_global_pause_duration"]
    # mlx5 counts pause durations in microseconds (counters.rst).
    assert duration.unit_scale == 1e-6
    assert duration.value * duration.unit_scale == pytest.approx(771.10381)
    assert all(c.kind == "counter" for c in curated)


def test_curate_pfc_ecn_phy_pci_and_lanes() -> None:
    stats = {
        "rx_prio3_pause": 10,
        "tx_prio3_pause": 11,
        "rx_prio3_pause_duration": 2_500_000,
        "tx_prio3_pause_duration": 7,
        "rx_prio3_pause_transition": 5,
        "rx_global_pause": 1,
        "rx_global_pause_duration": 2,
        "rx_global_pause_transition": 3,
        "rx_pause_ctrl_phy": 4,
        "tx_pause_storm_warning_events": 6,
        "tx_pause_storm_error_events": 1,
        "rx_prio3_buf_discard": 12,
        "rx_prio3_cong_discard": 13,
        "rx_prio3_marked": 14,
        "link_down_events_phy": 2,
        "rx_pcs_symbol_err_phy": 3,
        "rx_symbol_err_phy": 4,
        "rx_corrected_bits_phy": 5,
        "rx_crc_errors_phy": 6,
        "rx_bits_phy": 10**15,
        "rx_err_lane_0_phy": 7,
        "rx_err_lane_3_phy": 8,
        "rx_pci_signal_integrity": 9,
        "tx_pci_signal_integrity": 10,
        "outbound_pci_stalled_rd": 42,
        "outbound_pci_stalled_wr": 3,
        "outbound_pci_stalled_rd_events": 100,
        "outbound_pci_stalled_wr_events": 1,
        "rx_fec_corrected_lane_2": 77,  # not listed, but every lane stat is kept
        "rx_prio8_pause": 1,  # not an 802.1p priority
        "rx_err_lane_16_phy": 1,  # beyond any real NIC's lanes: stays in the key
        "rx_vport_unicast_packets": 99,  # not curated by default
    }
    out = by_source(curate(stats))
    assert (out["rx_prio3_pause"].key, dict(out["rx_prio3_pause"].labels)) == (
        "pfc_pause_frames",
        {"direction": "rx", "priority": "3"},
    )
    assert out["tx_prio3_pause"].labels == (("direction", "tx"), ("priority", "3"))
    pause = out["rx_prio3_pause_duration"]
    assert (pause.key, pause.unit_scale, pause.value * pause.unit_scale) == ("pfc_pause_duration_seconds", 1e-6, 2.5)
    assert out["rx_prio3_pause_transition"].key == "pfc_pause_transitions"
    assert out["rx_global_pause"].key == "global_pause_frames"
    assert out["rx_global_pause_duration"].key == "global_pause_duration_seconds"
    assert out["rx_global_pause_transition"].key == "global_pause_transitions"
    assert out["rx_pause_ctrl_phy"].labels == (("direction", "rx"),)
    assert out["tx_pause_storm_error_events"].key == "pause_storm_error_events"
    assert out["rx_prio3_marked"].key == "priority_ecn_marked_packets"
    assert out["rx_prio3_cong_discard"].key == "priority_congestion_discards"
    assert out["rx_prio3_buf_discard"].key == "priority_buffer_discards"
    assert out["link_down_events_phy"].labels == ()
    assert out["rx_bits_phy"].key == "port_bits"
    assert out["rx_err_lane_3_phy"].key == "lane_raw_errors"
    assert dict(out["rx_err_lane_3_phy"].labels) == {"direction": "rx", "lane": "3"}
    assert out["tx_pci_signal_integrity"].key == "pci_signal_integrity_errors"
    stalled = out["outbound_pci_stalled_rd"]
    assert (stalled.key, stalled.kind, stalled.labels) == (
        "pci_outbound_stalled_ratio",
        "gauge",
        (("operation", "read"),),
    )
    assert stalled.value * stalled.unit_scale == pytest.approx(0.42)
    events = out["outbound_pci_stalled_wr_events"]
    assert (events.key, events.kind, events.labels) == (
        "pci_outbound_stalled_seconds",
        "counter",
        (("operation", "write"),),
    )
    lane = out["rx_fec_corrected_lane_2"]
    assert (lane.key, lane.labels) == ("stat_lane_fec_corrected", (("direction", "rx"), ("lane", "2")))
    assert "rx_prio8_pause" not in out
    assert out["rx_err_lane_16_phy"].key == "stat_err_lane_16_phy"
    assert "rx_vport_unicast_packets" not in out


def test_curate_mlx5_module_events_and_frame_size_errors() -> None:
    stats = {
        "module_unplug": 1,
        "module_bus_stuck": 2,
        "module_high_temp": 3,
        "module_bad_shorted": 4,
        "module_plug": 9,  # not an mlx5 ethtool name: no event label value beyond the four
        "rx_oversize_pkts_phy": 5,
        "rx_out_of_range_len_phy": 6,
        "rx_in_range_len_errors_phy": 7,
        "rx_undersize_pkts_phy": 8,
        "rx_fragments_phy": 9,
        "rx_jabbers_phy": 10,
        "tx_errors_phy": 11,
        "rx_oversize_pkts_sw_drop": 12,  # a software (ring) counter, not the port's
    }
    got = {c.source: (c.key, c.labels, c.value) for c in curate(stats)}
    assert got == {
        "module_unplug": ("module_events", (("event", "unplug"),), 1),
        "module_bus_stuck": ("module_events", (("event", "bus_stuck"),), 2),
        "module_high_temp": ("module_events", (("event", "high_temp"),), 3),
        "module_bad_shorted": ("module_events", (("event", "bad_shorted"),), 4),
        "rx_oversize_pkts_phy": ("oversize_packets", (("direction", "rx"),), 5),
        "rx_out_of_range_len_phy": ("out_of_range_length_packets", (("direction", "rx"),), 6),
        "rx_in_range_len_errors_phy": ("in_range_length_error_packets", (("direction", "rx"),), 7),
        "rx_undersize_pkts_phy": ("undersize_packets", (("direction", "rx"),), 8),
        "rx_fragments_phy": ("fragment_packets", (("direction", "rx"),), 9),
        "rx_jabbers_phy": ("jabber_packets", (("direction", "rx"),), 10),
        "tx_errors_phy": ("port_errors", (("direction", "tx"),), 11),
    }


def test_curate_bnxt_en_capture() -> None:
    stats = parse_stats_text(BNXT.read_text())
    out = by_source(curate(stats))
    expect = {
        # source: (key, labels, seconds or count in base units)
        "pfc_pri3_rx_duration_us": ("pfc_pause_duration_seconds", {"direction": "rx", "priority": "3"}, 3.25),
        "pfc_pri3_tx_duration_us": ("pfc_pause_duration_seconds", {"direction": "tx", "priority": "3"}, 0.125),
        "rx_pfc_ena_frames_pri3": ("pfc_pause_frames", {"direction": "rx", "priority": "3"}, 48211),
        "tx_pfc_ena_frames_pri3": ("pfc_pause_frames", {"direction": "tx", "priority": "3"}, 1907),
        "rx_pause_frames": ("global_pause_frames", {"direction": "rx"}, 0),
        "tx_pause_frames": ("global_pause_frames", {"direction": "tx"}, 0),
        "link_down_events": ("link_down_events", {}, 2),
        "rx_pcs_symbol_err": ("pcs_symbol_errors", {"direction": "rx"}, 7),
        "rx_corrected_bits": ("corrected_bits", {"direction": "rx"}, 1234567),
        "rx_bits": ("port_bits", {"direction": "rx"}, 8 * 10**15),
        "rx_fcs_err_frames": ("crc_error_packets", {"direction": "rx"}, 5),
        "rx_buffer_passed_threshold": ("port_buffer_almost_full_events", {"direction": "rx"}, 31),
        "rx_stat_discard": ("port_discards", {"direction": "rx"}, 17),
        "tx_stat_discard": ("port_discards", {"direction": "tx"}, 2),
        "rx_undrsz_frames": ("undersize_packets", {"direction": "rx"}, 4),
        "rx_jbr_frames": ("jabber_packets", {"direction": "rx"}, 6),
    }
    for source, (key, labels, base) in expect.items():
        stat = out[source]
        assert (stat.key, dict(stat.labels)) == (key, labels), source
        assert stat.value * stat.unit_scale == pytest.approx(base), source
    # Label order is the key's, whatever the order in the driver's name (priority before direction).
    assert out["pfc_pri3_rx_duration_us"].labels == (("direction", "rx"), ("priority", "3"))
    # Every priority's PFC counters are listed, as bnxt_en does; nothing else is curated.
    assert len(out) == len(expect) + 7 * 4
    # Per class-of-service counters (and the per-priority views read from a priority's CoS queue) are not
    # per-priority counters: none of them may get a priority label.
    assert not [s for s in out if "cos" in s or s.endswith(("_bytes_pri3", "_packets_pri3"))]
    assert all(not s.startswith("[") for s in out)  # per-ring stats


def test_curate_ice_capture() -> None:
    stats = parse_stats_text(ICE.read_text())
    out = by_source(curate(stats))
    prio3 = {"priority": "3"}
    assert (out["tx_priority_3_xoff.nic"].key, dict(out["tx_priority_3_xoff.nic"].labels)) == (
        "pfc_pause_frames",
        {"direction": "tx", **prio3},
    )
    assert out["tx_priority_3_xoff.nic"].value == 6434
    assert out["rx_priority_3_xoff.nic"].value == 129
    xoff = out["link_xoff_rx.nic"]
    assert (xoff.key, xoff.labels) == ("global_pause_frames", (("direction", "rx"),))
    assert out["link_xoff_tx.nic"].labels == (("direction", "tx"),)
    assert (out["rx_crc_errors.nic"].key, out["rx_crc_errors.nic"].value) == ("crc_error_packets", 4)
    frame_errors = {"rx_oversize.nic": ("oversize_packets", 3), "rx_undersize.nic": ("undersize_packets", 4),
                    "rx_fragments.nic": ("fragment_packets", 5), "rx_jabber.nic": ("jabber_packets", 6)}  # fmt: skip
    for source, (key, count) in frame_errors.items():
        assert (out[source].key, out[source].labels, out[source].value) == (key, (("direction", "rx"),), count)
    # XON frames end a pause; they are not pause frames and are not exported.
    assert not [s for s in out if "xon" in s]
    assert "rx_dropped.nic" not in out
    assert len(out) == 16 + 3 + 4


def test_curate_mlx4_en_and_i40e_names() -> None:
    """ConnectX-3 RoCE (mlx4_en) and X722 iWARP (i40e) netdevs exported no PFC or CRC series (ethtool
    review): names from their drivers' string tables, values made up."""
    mlx4 = {"rx_pause_prio_3": 11, "rx_pause_duration_prio_3": 12, "rx_pause_transition_prio_3": 13,
            "tx_pause_prio_3": 14, "rx_pause": 15, "tx_pause_transition": 16, "rx_crc_errors": 17,
            "rx_dropped": 18}  # fmt: skip
    out = {s.source: (s.key, dict(s.labels), s.value) for s in curate(mlx4)}
    prio3 = {"priority": "3"}
    assert out == {
        "rx_pause_prio_3": ("pfc_pause_frames", {"direction": "rx", **prio3}, 11),
        "rx_pause_transition_prio_3": ("pfc_pause_transitions", {"direction": "rx", **prio3}, 13),
        "tx_pause_prio_3": ("pfc_pause_frames", {"direction": "tx", **prio3}, 14),
        "rx_pause": ("global_pause_frames", {"direction": "rx"}, 15),
        "tx_pause_transition": ("global_pause_transitions", {"direction": "tx"}, 16),
    }  # rx_crc_errors is qede's and ixgbe's too: not curated
    i40e = {"port.rx_priority_3_xoff_rx": 21, "port.tx_priority_3_xoff_tx": 22, "port.rx_priority_3_xon_rx": 23,
            "port.link_xoff_rx": 24, "port.rx_crc_errors": 25, "tx-0.tx_packets": 26}  # fmt: skip
    out = {s.source: (s.key, dict(s.labels), s.value) for s in curate(i40e)}
    assert out == {
        "port.rx_priority_3_xoff_rx": ("pfc_pause_frames", {"direction": "rx", **prio3}, 21),
        "port.tx_priority_3_xoff_tx": ("pfc_pause_frames", {"direction": "tx", **prio3}, 22),
        "port.link_xoff_rx": ("global_pause_frames", {"direction": "rx"}, 24),
        "port.rx_crc_errors": ("crc_error_packets", {"direction": "rx"}, 25),
    }


def test_each_curated_key_has_one_kind_and_is_exposed_as_it() -> None:
    # The exposed type came from a hand-kept list in collect/ that a new gauge rule could miss (code review).
    for rule in ethtool._RULES:
        assert ethtool.CURATED_KINDS[rule.key] == rule.kind, rule.key
        spec = collect_ethtool.CURATED_SPECS[rule.key]
        assert spec.kind == rule.kind and spec.name.endswith("_total") == (rule.kind == "counter"), spec
    assert collect_ethtool.CURATED_SPECS["pci_outbound_stalled_ratio"].kind == "gauge"


def test_every_curated_key_has_help() -> None:
    keys = {rule.key for rule in ethtool._RULES}
    assert keys == set(CURATED_HELP)
    for key, text in CURATED_HELP.items():
        assert KEY.match(key) and not key.endswith("_total") and not key.startswith("stat_")
        assert text and text.endswith(".") and "\n" not in text


def test_extra_patterns_become_labelled_metrics() -> None:
    stats = parse_stats_text(K65.read_text())
    patterns = [re.compile(p) for p in (r"^rx\d+_xdp_drop$", r"^ch\d*_poll$", r"^rx_vport_unicast_bytes$")]
    out = by_source(curate(stats, patterns))
    assert (out["rx0_xdp_drop"].key, out["rx0_xdp_drop"].labels) == (
        "stat_queue_xdp_drop",
        (("direction", "rx"), ("queue", "0")),
    )
    assert out["rx0_xdp_drop"].value == 7783331724
    # Per-channel and port-wide series get different keys, so sum() over one family never double counts.
    assert (out["ch0_poll"].key, out["ch0_poll"].labels) == ("stat_channel_poll", (("direction", ""), ("channel", "0")))
    assert (out["ch_poll"].key, out["ch_poll"].labels) == ("stat_ch_poll", (("direction", ""),))
    assert out["rx_vport_unicast_bytes"].key == "stat_vport_unicast_bytes"
    assert out["rx_vport_unicast_bytes"].value == 18381712744116
    # Curated names keep their curated meaning even when a pattern matches them too.
    everything = by_source(curate(stats, [re.compile(".")]))
    assert everything["rx_prio0_discards"].key == "priority_discards"
    assert len(everything) == len(stats)


def test_extra_generic_naming_rule() -> None:
    assert generic_key("rx_queue_0_xdp_packets") == ("stat_queue_xdp_packets", (("direction", "rx"), ("queue", "0")))
    assert generic_key("tx12_cqe_err") == ("stat_queue_cqe_err", (("direction", "tx"), ("queue", "12")))
    assert generic_key("rx_prio_5_foo") == ("stat_priority_foo", (("direction", "rx"), ("priority", "5")))
    assert generic_key("port.rx_dropped") == ("stat_port_rx_dropped", (("direction", ""),))
    assert generic_key("rxCamelCase_total") == ("stat_rx_camel_case", (("direction", ""),))
    assert generic_key("rx_65_to_127_bytes_phy") == ("stat_n65_to_127_bytes_phy", (("direction", "rx"),))
    assert generic_key("rx01_packets")[0] == "stat_rx01_packets"  # a zero-padded index is not an index
    assert generic_key("tx_q3_bytes") == ("stat_queue_bytes", (("direction", "tx"), ("queue", "3")))
    assert generic_key("channel5_rx_packets") == ("stat_channel_rx_packets", (("direction", ""), ("channel", "5")))
    # Dimensions go into the key in one fixed order, whatever their order in the name, so keys stay stable.
    both = ("stat_priority_lane_x", (("direction", "rx"), ("priority", "3"), ("lane", "2")))
    assert generic_key("rx_prio3_lane2_x") == generic_key("rx_lane2_prio3_x") == both
    # ... and a queue or channel, though taken from the name first, comes after priority and lane.
    queued = ("stat_priority_queue_x", (("direction", "rx"), ("priority", "2"), ("queue", "3")))
    assert generic_key("rx3_prio2_x") == queued
    assert generic_key("ch4_lane1_x") == ("stat_lane_channel_x", (("direction", ""), ("lane", "1"), ("channel", "4")))
    # The exposition appends `_total` itself: every trailing one goes, and a name of nothing else is `value`.
    assert generic_key("tx_bytes_total_total")[0] == "stat_bytes"
    assert generic_key("rx_total") == ("stat_value", (("direction", "rx"),))
    # A priority or lane index ends at `_` or the end: `prio3x` and `lane2b` are words, not dimensions.
    assert generic_key("tx_prio3x_drops") == ("stat_prio3x_drops", (("direction", "tx"),))
    assert generic_key("rx_lane2b_errs") == ("stat_lane2b_errs", (("direction", "rx"),))


def test_extra_bnxt_en_and_ice_priorities_become_the_priority_label() -> None:
    """bnxt_en spells a priority `priN` (pfc_pri3_rx_transitions, rx_bytes_pri3: bnxt_ethtool.c) and ice
    `priority_N` (rx_priority_3_xon.nic: ice_ethtool.c). The README points bnxt_en users to extra_stats for
    the PFC transitions; those must come out as one family with a priority label, not eight metric names."""
    stats = parse_stats_text(BNXT.read_text()) | parse_stats_text(ICE.read_text())
    out = by_source(curate(stats, [re.compile(r"^pfc_pri[0-7]_(rx|tx)_transitions$|_pri[0-7]$|_xon\.nic$")]))
    for source in ("pfc_pri3_rx_transitions", "pfc_pri0_tx_transitions", "rx_bytes_pri3", "tx_priority_5_xon.nic"):
        stat = out[source]
        assert "pri" not in stat.key.removeprefix("stat_priority_"), (source, stat.key)
        assert stat.key.startswith("stat_priority_"), (source, stat.key)
        assert dict(stat.labels)["priority"] == re.search(r"pri(?:ority_)?([0-7])", source)[1], source
    prio3 = ("priority", "3")
    assert generic_key("pfc_pri3_rx_transitions") == ("stat_priority_pfc_rx_transitions", (("direction", ""), prio3))
    assert generic_key("rx_priority_3_xon.nic") == ("stat_priority_xon_nic", (("direction", "rx"), ("priority", "3")))
    assert generic_key("rx_bytes_pri3") == ("stat_priority_bytes", (("direction", "rx"), ("priority", "3")))
    # One family per statistic: the eight priorities of bnxt_en's PFC transitions share one key per direction.
    transitions = {out[f"pfc_pri{p}_rx_transitions"].key for p in range(8)}
    assert transitions == {"stat_priority_pfc_rx_transitions"}
    # A word that merely starts like one (`primary`, `pri3x`) and a priority past 7 stay in the name.
    assert generic_key("rx_primary_drops") == ("stat_primary_drops", (("direction", "rx"),))
    assert generic_key("rx_pri3x_drops") == ("stat_pri3x_drops", (("direction", "rx"),))
    assert generic_key("rx_priority_8_xon")[0] == "stat_all_priority_8_xon"
    check_curated(list(out.values()))


def test_extra_bnxt_en_per_ring_stats_get_a_channel_label() -> None:
    """bnxt_en names its per-ring statistics `[N]: name`, N the completion ring (bnxt_get_strings in
    bnxt_ethtool.c). Selected as extras they must be one family with a channel label, like mlx5's `chN_`,
    not one metric name per ring (stat_n0_rx_discards, stat_n1_rx_discards...)."""
    stats = parse_stats_text(BNXT.read_text())
    out = by_source(curate(stats, [re.compile(r"^\[[0-9]+\]: (rx|tx)_discards$")]))
    extras = {s.key for s in out.values() if s.key.startswith("stat_")}
    assert extras == {"stat_channel_rx_discards", "stat_channel_tx_discards"}
    assert dict(out["[1]: rx_discards"].labels) == {"direction": "", "channel": "1"}
    ring0 = (("direction", ""), ("channel", "0"))
    assert generic_key("[0]: rx_ucast_packets") == ("stat_channel_rx_ucast_packets", ring0)
    assert generic_key("[4095]: missed_irqs")[1] == (("direction", ""), ("channel", "4095"))
    assert generic_key("[4096]: missed_irqs")[0] == "stat_n4096_missed_irqs"  # past the bound: stays in the name
    check_curated(list(out.values()))


def test_colliding_extras_keep_the_first() -> None:
    stats = parse_stats_text(QUIRKS.read_text())
    out = curate(stats, [re.compile("duplicate")])
    assert [(c.key, c.value, c.source) for c in out] == [("stat_duplicate_metric", 1, "duplicate metric")]


stat_names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40)
stat_values = st.integers(min_value=-(2**65), max_value=2**65)


def check_curated(curated: list[CuratedStat]) -> None:
    names_by_key: dict[str, tuple[str, ...]] = {}
    seen = set()
    for stat in curated:
        assert KEY.match(stat.key), stat.key
        assert not stat.key.endswith("_total")
        assert stat.kind in ("counter", "gauge")
        assert 0 <= stat.value < 2**64
        bounds = EXTRA_LABEL_VALUES if stat.key.startswith("stat_") else LABEL_VALUES
        for name, value in stat.labels:
            assert value in bounds[name], (stat.source, name, value)
        label_names = tuple(name for name, _ in stat.labels)
        assert names_by_key.setdefault(stat.key, label_names) == label_names, stat.key
        assert (stat.key, stat.labels) not in seen
        seen.add((stat.key, stat.labels))
        if not stat.key.startswith("stat_"):
            assert stat.key in CURATED_HELP


@given(st.dictionaries(stat_names, stat_values, max_size=30))
@settings(deadline=None)
def test_curate_never_raises_and_stays_bounded(stats: dict[str, int]) -> None:
    check_curated(curate(stats))
    check_curated(curate(stats, [re.compile(".*")]))


# Names built from the pieces drivers use, so the property test reaches the labelled branches.
name_parts = st.sampled_from(
    ["rx", "tx", "rx0", "tx7", "ch3", "prio", "prio3", "prio9", "lane", "lane_1", "_", "pause", "duration", "phy",
     "err", "lane_3", "rx_queue_2", "1", "99999", "total", "bits", "outbound_pci_stalled", "rd", "events", "X"]
)  # fmt: skip


@given(st.dictionaries(st.lists(name_parts, min_size=1, max_size=6).map("_".join), stat_values, max_size=30))
@settings(deadline=None)
def test_curate_driver_like_names(stats: dict[str, int]) -> None:
    check_curated(curate(stats))
    check_curated(curate(stats, [re.compile("")]))


def curate_one_by_one(stats: dict[str, int], patterns: tuple[re.Pattern[str], ...]) -> list[CuratedStat]:
    """The definition curate's cached plan must agree with: every name decided in order, first one wins."""
    out: list[CuratedStat] = []
    seen: set[object] = set()
    for name, value in stats.items():
        decided = _decide(name, patterns) if 0 <= value < 2**64 else None
        if decided is not None and (decided[0], decided[1]) not in seen:
            seen.add((decided[0], decided[1]))
            out.append(CuratedStat(decided[0], value, decided[1], decided[2], decided[3], name))
    return out


@given(st.dictionaries(st.lists(name_parts, min_size=1, max_size=6).map("_".join), stat_values, max_size=30))
@settings(deadline=None)
def test_curate_plan_agrees_with_deciding_each_name(stats: dict[str, int]) -> None:
    for patterns in ((), (re.compile("rx"),)):
        for _ in range(2):  # the second call runs from the cached plan
            assert curate(stats, patterns) == curate_one_by_one(stats, patterns)


@given(
    st.dictionaries(
        st.lists(name_parts, min_size=1, max_size=6).map("_".join), st.integers(0, 2**64 - 1), max_size=30
    )
)
@settings(deadline=None)
def test_curating_from_kept_names_agrees_with_curating_the_dict(stats: dict[str, int]) -> None:
    # What the ioctl path exports (positions planned once per set of names) against what the capture
    # path exports from a {name: value} dict, for the same stats.
    names = StatNames(b"", tuple(stats), by_position=True)
    for patterns in ((), (re.compile("rx"),)):
        for _ in range(2):  # the second call runs from the kept plan
            assert names.curate(tuple(stats.values()), patterns) == curate_counted(stats, patterns)


def test_curating_names_that_do_not_pair_by_position_keeps_the_text_rules() -> None:
    names = StatNames(b"", ("rx_discards_phy", "", "rx_discards_phy", "tx_pause_ctrl_phy"), by_position=False)
    curated, over_limit = names.curate((1, 2, 3, 4))
    assert [(c.source, c.value) for c in curated] == [("rx_discards_phy", 1), ("tx_pause_ctrl_phy", 4)]
    assert over_limit == 0


# Random text almost never holds a `name: value` line; these lines are shaped like ethtool's, with what
# a broken capture could put in the name and the value, so that the checks below see parsed stats.
stats_line_like = st.builds(
    "{}{}{}{}".format,
    st.sampled_from(["     ", "\t", "", "  # "]),
    st.one_of(st.lists(name_parts, min_size=1, max_size=4).map("_".join), stat_names),
    st.sampled_from([": ", ":", " : ", ": : "]),
    st.one_of(stat_values.map(str), st.text(max_size=8)),
)
stats_text_like = st.lists(st.one_of(stats_line_like, st.text(max_size=20)), max_size=40).map("\n".join)


@given(st.one_of(st.text(max_size=2000), stats_text_like))
@settings(deadline=None)
def test_parse_stats_text_never_raises(text: str) -> None:
    malformed: list[str] = []
    stats = parse_stats_text(text, malformed)
    for name, value in stats.items():
        assert name and name == name.strip()
        assert 0 <= value < 2**64
    assert len(stats) + len(malformed) <= len(text.splitlines())


printable_name = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=ETH_GSTRING_LEN
).filter(lambda n: n == n.strip())


@given(st.dictionaries(printable_name, st.integers(0, 2**64 - 1), max_size=40))
@settings(deadline=None)
def test_parse_stats_text_round_trips_ethtool_output(stats: dict[str, int]) -> None:
    # The exact format ethtool prints: printf("     %.*s: %llu\n", ETH_GSTRING_LEN, name, value).
    text = "NIC statistics:\n" + "".join(f"     {name}: {value}\n" for name, value in stats.items())
    malformed: list[str] = []
    assert parse_stats_text(text, malformed) == stats
    assert malformed == []


# --- SIOCETHTOOL against the real kernel ----------------------------------------------------------------


def test_ioctl_loopback_has_no_stats() -> None:
    with pytest.raises(EthtoolError) as err:
        read_stats_ioctl("lo")
    assert err.value.reason == REASON_UNSUPPORTED


def test_ioctl_missing_interface() -> None:
    with pytest.raises(EthtoolError) as err:
        read_stats_ioctl("rdmaexp-none0")
    assert err.value.reason == REASON_MISSING
    # Refused before any ioctl: the kernel would answer ENODEV (missing as well) for most, but cuts a
    # 16-byte name to its first 15 and would read another interface's statistics.
    def no_ioctl(ifname: str, buffer: array[int]) -> None:
        raise AssertionError(f"ioctl for the invalid name {ifname!r}")

    for bad in ("", "x" * 16, "a/b", "nul\0"):
        with pytest.raises(EthtoolError) as invalid:
            read_stats_ioctl(bad, call=no_ioctl)
        assert invalid.value.reason == REASON_MISSING


@pytest.mark.parametrize("blocked", [(socket.AF_INET,), (socket.AF_INET, socket.AF_NETLINK)])
def test_ioctl_falls_back_to_other_socket_families(monkeypatch: pytest.MonkeyPatch, blocked: tuple[int, ...]) -> None:
    real_socket = socket.socket
    opened: list[int] = []

    def sandboxed(family: int = socket.AF_INET, *args: object, **kwargs: object) -> socket.socket:
        if family in blocked:
            raise OSError(errno.EAFNOSUPPORT, os.strerror(errno.EAFNOSUPPORT))
        opened.append(family)
        return real_socket(family, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ethtool.socket, "socket", sandboxed)
    # The kernel still answers through the fallback socket: lo has no stats set, a bogus name no device.
    with pytest.raises(EthtoolError) as err:
        read_stats_ioctl("lo")
    assert err.value.reason == REASON_UNSUPPORTED
    with pytest.raises(EthtoolError) as err:
        read_stats_ioctl("rdmaexp-none0")
    assert err.value.reason == REASON_MISSING
    assert opened and opened[0] == (socket.AF_UNIX if socket.AF_NETLINK in blocked else socket.AF_NETLINK)


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=60)


@pytest.fixture
def veth_netns() -> Iterator[str]:
    """A throwaway network namespace with veth pair va<->vb up (IPv6 off: no autoconf chatter) and vc<->vd down."""
    for tool in ("ip", "ethtool"):  # Debian packages iproute2, ethtool
        require_binary(tool)
    name = f"rdmaexp-test-{os.getpid()}"
    run("ip", "netns", "del", name, check=False)  # a leftover of a killed run with the same pid
    created = run("ip", "netns", "add", name, check=False)
    if created.returncode != 0:
        skip_or_fail(f"cannot create a network namespace (needs root or CAP_NET_ADMIN): {created.stderr.strip()}")
    try:
        for key in ("all", "default"):
            run("ip", "netns", "exec", name, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1", check=False)
        run("ip", "-n", name, "link", "add", "va", "type", "veth", "peer", "name", "vb")
        run("ip", "-n", name, "link", "add", "vc", "type", "veth", "peer", "name", "vd")
        for dev in ("lo", "va", "vb"):
            run("ip", "-n", name, "link", "set", dev, "up")
        yield name
    finally:
        run("ip", "netns", "del", name, check=False)


SEND_FRAMES = """
import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
# Broadcast frame with the IEEE local-experimental EtherType 0x88B5.
frame = b"\\xff" * 6 + b"\\x02\\x00\\x00\\x00\\x00\\x01" + b"\\x88\\xb5" + b"rdma-exporter test".ljust(46, b"\\0")
for _ in range(int(sys.argv[2])):
    s.send(frame)
"""

READ_IN_NETNS = """
import json, sys
from pathlib import Path
from rdma_exporter.parse.ethtool import EthtoolError, read_stats_ioctl
from rdma_exporter.parse.netdev import read_netdev
from rdma_exporter.parse.reader import SysfsReader
out = {"ethtool": {}, "netdev": {}}
for name in sys.argv[1].split(","):
    try:
        out["ethtool"][name] = {"stats": list(read_stats_ioctl(name).items())}
    except EthtoolError as exc:
        out["ethtool"][name] = {"error": exc.reason}
for name in sys.argv[2].split(","):
    reader = SysfsReader(name)
    dev = read_netdev(Path("/sys"), name, reader)  # ip netns exec mounts this namespace's /sys
    out["netdev"][name] = {
        "operstate": dev.operstate, "admin_up": dev.admin_up, "carrier": dev.carrier, "speed_bps": dev.speed_bps,
        "rx_packets": dev.statistics.get("rx_packets"), "errors": reader.errors.total(),
    }
print(json.dumps(out))
"""


def in_netns(ns: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(EXPORTER_DIR), os.environ.get("PYTHONPATH")])))
    return subprocess.run(
        ["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, check=True, env=env, timeout=60
    )


SHORT_BUFFER_IN_NETNS = """
import errno, json, struct
from array import array
from rdma_exporter.parse.ethtool import ETH_GSTRING_LEN, ETH_SS_STATS, ETHTOOL_GSTRINGS, SocketEthtool, _stat_count
out = {}
with SocketEthtool() as call:
    count = _stat_count(call, "va")
    for room in (count - 1, count):  # the kernel writes `count` names either way, as an old kernel would
        buffer = array("B", bytes(12 + room * ETH_GSTRING_LEN))
        struct.pack_into("=III", buffer, 0, ETHTOOL_GSTRINGS, ETH_SS_STATS, count)
        try:
            call("va", buffer)
            out[str(room)] = struct.unpack_from("=I", buffer, 8)[0]
        except OSError as exc:
            out[str(room)] = errno.errorcode[exc.errno]
out["count"] = count
print(json.dumps(out))
"""


def test_a_kernel_writing_past_the_buffer_gets_efault_not_our_heap(veth_netns: str) -> None:
    # A real kernel writing more names than the buffer holds, as a pre-Dec-2025 kernel does when the set
    # grew past the headroom: SocketEthtool's guard page turns that into EFAULT, and the heap is untouched.
    result = json.loads(in_netns(veth_netns, sys.executable, "-c", SHORT_BUFFER_IN_NETNS).stdout)
    count = result["count"]
    assert count == len(parse_stats_text(in_netns(veth_netns, "ethtool", "-S", "va").stdout))
    assert result == {str(count - 1): "EFAULT", str(count): count, "count": count}


def test_ioctl_matches_ethtool_in_a_namespace(veth_netns: str) -> None:
    in_netns(veth_netns, sys.executable, "-c", SEND_FRAMES, "va", "5")
    for _ in range(5):
        before = parse_stats_text(in_netns(veth_netns, "ethtool", "-S", "va").stdout)
        result = json.loads(
            in_netns(veth_netns, sys.executable, "-c", READ_IN_NETNS, "va,vb,lo,nosuch0", "vb,vc").stdout
        )
        after = parse_stats_text(in_netns(veth_netns, "ethtool", "-S", "va").stdout)
        if before == after:
            break
    assert before == after, "veth stats kept moving without traffic"
    ours = result["ethtool"]["va"]["stats"]
    assert [name for name, _ in ours] == list(before)  # same names, same order
    assert dict(ours) == before
    assert "peer_ifindex" in before and before["peer_ifindex"] > 0
    assert "stats" in result["ethtool"]["vb"]
    assert result["ethtool"]["lo"] == {"error": REASON_UNSUPPORTED}
    assert result["ethtool"]["nosuch0"] == {"error": REASON_MISSING}
    # The frames really crossed the pair, and netdev parsing of a live tree agrees.
    vb = result["netdev"]["vb"]
    assert (vb["operstate"], vb["admin_up"], vb["carrier"], vb["errors"]) == ("up", True, True, 0)
    assert vb["rx_packets"] >= 5
    assert vb["speed_bps"] == 10_000 * 1_000_000  # veth reports 10000 Mb/s
    # vc is administratively down: the kernel answers EINVAL for carrier/speed, which is "no value", not an error.
    vc = result["netdev"]["vc"]
    assert vc == {
        "operstate": "down", "admin_up": False, "carrier": None, "speed_bps": None, "rx_packets": 0, "errors": 0
    }  # fmt: skip


def test_a_stat_set_reader_keeps_the_names_of_the_netdevs_it_is_told_to() -> None:
    kernel = FakeKernel([WITH_PFC], [0])
    stat_reader = StatSetReader()
    for name in ("eth0", "eth1", "eth0", "eth1"):
        assert stat_reader.read(name, kernel) == dict(WITH_PFC)
    assert kernel.calls == (FULL_READ * 2) + (GSSET_INFO_GSTATS_GSTRINGS * 2)
    kernel.calls.clear()
    stat_reader.retain({"eth1"})
    stat_reader.read("eth0", kernel)
    stat_reader.read("eth1", kernel)
    assert kernel.calls == FULL_READ + GSSET_INFO_GSTATS_GSTRINGS


def test_guarded_memory_is_unmapped_when_dropped_unclosed() -> None:
    # A SocketEthtool dropped without close() (the collector's is the process's, but a caller's own may be).
    memory = GuardedMemory()
    assert memory.place(array("B", [1]) * 100) is not None
    base, span = memory._base, memory._span
    assert base is not None
    del memory
    gc.collect()
    with open("/proc/self/maps") as maps:
        ranges = [tuple(int(end, 16) for end in line.split(None, 1)[0].split("-")) for line in maps]
    assert not any(start <= base < end for start, end in ranges), f"{base:#x}+{span} still mapped"


def test_a_kept_read_whose_values_grew_meanwhile_is_read_again_in_full() -> None:
    # An old kernel writes the set of the moment: GSTATS sees PFC just enabled (8 values), the names after
    # it the kept 2 again. The values must not be taken, by position or by name.
    _, names = read_stat_set("eth0", None, call=FakeKernel([PRIO3], [0]))
    kernel = FakeKernel([PRIO3, WITH_PFC], [0, 1, 0], honours_len=False, guarded=True)
    assert read_stat_set("eth0", names, call=kernel)[0] == dict(PRIO3)
    stat_reader = StatSetReader()
    stat_reader.read("eth0", FakeKernel([PRIO3], [0]))
    kernel = FakeKernel([PRIO3, WITH_PFC], [0, 1, 0], honours_len=False, guarded=True)
    assert stat_reader.read_curated("eth0", (), kernel) == curate_counted(dict(PRIO3))


def test_a_stat_set_reader_keeps_the_names_read_after_a_change() -> None:
    kernel = FakeKernel([BASE], [0])
    stat_reader = StatSetReader()
    stat_reader.read("eth0", kernel)
    kernel.sets[0] = WITH_PFC
    kernel.calls.clear()
    assert stat_reader.read("eth0", kernel) == dict(WITH_PFC)
    assert kernel.calls == FULL_READ
    kernel.calls.clear()
    assert stat_reader.read("eth0", kernel) == dict(WITH_PFC)
    assert kernel.calls == GSSET_INFO_GSTATS_GSTRINGS


SHARED_SOCKET_IN_NETNS = """
import json, sys, threading
from rdma_exporter.parse.ethtool import EthtoolError, SocketEthtool, StatSetReader, read_stats_ioctl
expected = {name: set(read_stats_ioctl(name)) for name in ("va", "vc")}
sock = SocketEthtool()
wrong, errors = [], []
def work(name):
    stat_reader = StatSetReader()
    for _ in range(int(sys.argv[1])):
        try:
            if set(stat_reader.read(name, sock)) != expected[name]:
                wrong.append(name)
        except (EthtoolError, ValueError) as exc:
            errors.append(repr(exc))
threads = [threading.Thread(target=work, args=(name,)) for name in ("va", "vc", "va", "vc")]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps({"wrong": len(wrong), "errors": errors[:3]}))
"""


def test_threads_sharing_one_socket_each_read_their_own_netdev(veth_netns: str) -> None:
    # The ethtool source's one SocketEthtool serves every device's job; its guarded memory is shared, so
    # calls must take turns (without the lock: hundreds of errors and some wrong name sets in 1,600 reads).
    result = json.loads(in_netns(veth_netns, sys.executable, "-c", SHARED_SOCKET_IN_NETNS, "400").stdout)
    assert result == {"wrong": 0, "errors": []}


KEPT_NAMES_IN_NETNS = """
import json, subprocess, sys
from rdma_exporter.parse.ethtool import SocketEthtool, parse_stats_text, read_stat_set
ifname = sys.argv[1]
out = []
with SocketEthtool() as sock:
    calls = []
    def call(name, buffer):
        calls.append(buffer[0])
        sock(name, buffer)
    known = None
    for rx, tx in ((3, 1), (3, 1), (1, 8)):
        subprocess.run(["ethtool", "-L", ifname, "rx", str(rx), "tx", str(tx)], check=True)
        calls.clear()
        stats, known = read_stat_set(ifname, known, call=call)
        shown = parse_stats_text(subprocess.run(["ethtool", "-S", ifname], capture_output=True, text=True).stdout)
        out.append({"stats": list(stats.items()), "shown": list(shown.items()), "calls": len(calls)})
print(json.dumps(out))
"""


def test_kept_names_on_a_real_veth_whose_channels_change_to_as_many_stats(veth_netns: str) -> None:
    # veth has 7 stats per rx queue and 2 per tx queue: 3 rx + 1 tx and 1 rx + 8 tx channels both give 24,
    # under other names. The kernel's own set swap, same size, read with the names kept from before it.
    run("ip", "-n", veth_netns, "link", "add", "ra", "numrxqueues", "4", "numtxqueues", "9", "type", "veth",
        "peer", "name", "rb", "numrxqueues", "9", "numtxqueues", "4")  # fmt: skip
    reads = json.loads(in_netns(veth_netns, sys.executable, "-c", KEPT_NAMES_IN_NETNS, "ra").stdout)
    for read in reads:
        assert read["stats"] == read["shown"]
    assert [read["calls"] for read in reads] == [4, 3, 3 + 3]  # cold; names kept; kept names no longer fit
    assert len(reads[0]["stats"]) == len(reads[2]["stats"]) == 24
    assert "tx_queue_7_xdp_xmit" in dict(reads[2]["stats"])
    assert "rx_queue_2_drops" in dict(reads[0]["stats"])
    assert "rx_queue_2_drops" not in dict(reads[2]["stats"])


# --- SIOCETHTOOL against a scripted kernel -------------------------------------------------------------


class FakeKernel:
    """Answers the four ethtool commands from a script of stat sets, one set index per call.

    `honours_len` mimics kernels with the Dec 2025 fix (mismatching count -> 0 entries); without it the
    kernel writes the current set whatever we asked for, as older kernels do, so the fake checks that the
    buffer has room for it (a real old kernel would overwrite memory instead), or with `guarded` answers
    EFAULT, as SocketEthtool's GuardedMemory makes such a kernel do.
    """

    def __init__(
        self, sets: list[list[tuple[str, int]]], script: list[int], *, honours_len: bool = True, guarded: bool = False
    ) -> None:
        self.sets = sets
        self.script = script
        self.honours_len = honours_len
        self.guarded = guarded
        self.calls: list[int] = []
        self.gsset_info_errno: int | None = None
        self.errno_for: dict[int, int] = {}

    def __call__(self, ifname: str, buffer: array) -> None:
        (cmd,) = struct.unpack_from("=I", buffer, 0)
        current = self.sets[self.script[min(len(self.calls), len(self.script) - 1)]]
        self.calls.append(cmd)
        if cmd in self.errno_for:
            raise OSError(self.errno_for[cmd], os.strerror(self.errno_for[cmd]))
        if cmd == ETHTOOL_GSSET_INFO:
            if self.gsset_info_errno is not None:
                raise OSError(self.gsset_info_errno, os.strerror(self.gsset_info_errno))
            (mask,) = struct.unpack_from("=Q", buffer, 8)
            assert mask == 1 << 1
            struct.pack_into("=QI", buffer, 8, mask if current else 0, len(current))
        elif cmd == ETHTOOL_GDRVINFO:
            struct.pack_into("=I", buffer, 180, len(current))
        elif cmd == ETHTOOL_GSTRINGS:
            (asked,) = struct.unpack_from("=I", buffer, 8)
            n = 0 if self.honours_len and asked != len(current) else len(current)
            if self.guarded and len(buffer) < 12 + n * ETH_GSTRING_LEN:
                raise OSError(errno.EFAULT, "Bad address")
            assert len(buffer) >= 12 + n * ETH_GSTRING_LEN, "would overrun the caller's buffer"
            struct.pack_into("=I", buffer, 8, n)
            for i, (name, _) in enumerate(current[:n]):
                struct.pack_into(f"{ETH_GSTRING_LEN}s", buffer, 12 + i * ETH_GSTRING_LEN, name.encode())
        elif cmd == ETHTOOL_GSTATS:
            (asked,) = struct.unpack_from("=I", buffer, 4)
            n = 0 if self.honours_len and asked != len(current) else len(current)
            if self.guarded and len(buffer) < 8 + n * 8:
                raise OSError(errno.EFAULT, "Bad address")
            assert len(buffer) >= 8 + n * 8, "would overrun the caller's buffer"
            struct.pack_into("=I", buffer, 4, n)
            for i, (_, value) in enumerate(current[:n]):
                struct.pack_into("=Q", buffer, 8 + i * 8, value)
        else:
            raise OSError(errno.EOPNOTSUPP, "unknown")


BASE = [("rx_packets", 1), ("tx_packets", 2), ("rx_discards_phy", 3)]
# PFC enabled on priority 3 between two calls: the driver adds its five pause counters.
WITH_PFC = BASE + [(f"{d}_prio3_pause{s}", 10 + i) for i, (d, s) in enumerate(
    [("rx", ""), ("rx", "_duration"), ("tx", ""), ("tx", "_duration"), ("rx", "_transition")]
)]  # fmt: skip


@pytest.mark.parametrize("honours_len", [True, False])
def test_stat_set_growing_between_count_and_strings_is_retried(honours_len: bool) -> None:
    # Call 0 (GSSET_INFO) sees 3 stats, every later call sees 8.
    kernel = FakeKernel([BASE, WITH_PFC], [0, 1], honours_len=honours_len)
    assert read_stats_ioctl("eth0", call=kernel) == dict(WITH_PFC)
    assert kernel.calls == [
        ETHTOOL_GSSET_INFO, ETHTOOL_GSTRINGS, ETHTOOL_GSSET_INFO, ETHTOOL_GSTRINGS, ETHTOOL_GSTATS, ETHTOOL_GSTRINGS
    ]


@pytest.mark.parametrize("honours_len", [True, False])
def test_stat_set_shrinking_between_strings_and_values_is_retried(honours_len: bool) -> None:
    kernel = FakeKernel([WITH_PFC, BASE], [0, 0, 1], honours_len=honours_len)
    assert read_stats_ioctl("eth0", call=kernel) == dict(BASE)
    assert kernel.calls.count(ETHTOOL_GSTATS) == 2


# PFC moved from priority 3 to 4 (or channels swapped rx for tx queues): as many stats, other names.
PRIO3 = [("rx_prio3_pause", 5), ("tx_prio3_pause", 6)]
PRIO4 = [("rx_prio4_pause", 7), ("tx_prio4_pause", 8)]


def test_a_stat_set_replaced_by_one_of_the_same_size_between_names_and_values_is_retried() -> None:
    # The count and the names see PRIO3, the values PRIO4: the counts agree, and without a second look at
    # the names PRIO4's values came out under PRIO3's names (review: reproduced on a real veth with
    # ethtool -L between the two calls).
    kernel = FakeKernel([PRIO3, PRIO4], [0, 0, 1])
    assert read_stats_ioctl("eth0", call=kernel) == dict(PRIO4)
    assert kernel.calls == [ETHTOOL_GSSET_INFO, ETHTOOL_GSTRINGS, ETHTOOL_GSTATS, ETHTOOL_GSTRINGS] * 2
    kernel = FakeKernel([PRIO3, PRIO4], [0, 0, 1, 1] * 10)  # the swap again at every attempt
    with pytest.raises(EthtoolError) as err:
        read_stats_ioctl("eth0", call=kernel, max_attempts=2)
    assert "2 strings replaced by as many others" in err.value.detail, err.value.detail


def test_old_kernel_growth_lands_in_headroom() -> None:
    big = [(f"ch{i}_poll", i) for i in range(900)]
    kernel = FakeKernel([BASE, big], [0, 1], honours_len=False)
    assert read_stats_ioctl("eth0", call=kernel) == dict(big)


def test_old_kernel_growth_past_the_headroom_faults_and_is_retried() -> None:
    # mlx5 going from 1 to 8 traffic classes on many channels grows its set several thousand stats: past
    # the headroom, an old kernel's write meets the guard page (EFAULT) and the read starts again.
    big = [(f"ch{i}_poll", i) for i in range(3000)]
    kernel = FakeKernel([BASE, big], [0, 1], honours_len=False, guarded=True)
    assert read_stats_ioctl("eth0", call=kernel) == dict(big)
    assert kernel.calls == [
        ETHTOOL_GSSET_INFO, ETHTOOL_GSTRINGS, ETHTOOL_GSSET_INFO, ETHTOOL_GSTRINGS, ETHTOOL_GSTATS, ETHTOOL_GSTRINGS
    ]
    kernel = FakeKernel([BASE, big], [0, 1] * 10, honours_len=False, guarded=True)
    with pytest.raises(EthtoolError) as err:
        read_stats_ioctl("eth0", call=kernel, max_attempts=2)
    assert err.value.reason == REASON_IO and "3->more than 1027 strings" in err.value.detail, err.value.detail


def test_guarded_memory_ends_at_a_page_the_kernel_cannot_write() -> None:
    # What a kernel copy past the buffer meets: read(2) from /dev/zero writes like copy_to_user does.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    libc.read.restype = ctypes.c_ssize_t
    memory = GuardedMemory()
    fd = os.open("/dev/zero", os.O_RDONLY)
    try:
        for size in (24, 4096, 5000, 100):  # grows, then reuses the larger mapping
            data = array("B", b"\x07" * size)
            address = memory.place(data)
            assert address is not None and ctypes.string_at(address, size) == data.tobytes()
            assert libc.read(fd, address, size) == size  # all of it is the caller's
            assert libc.read(fd, address + size, 1) == -1 and ctypes.get_errno() == errno.EFAULT
            memory.take(address, data)
            assert data.tobytes() == bytes(size)
    finally:
        os.close(fd)
        memory.close()


def test_stat_set_that_never_settles_gives_up() -> None:
    kernel = FakeKernel([BASE, WITH_PFC], [0, 1] * 50)
    with pytest.raises(EthtoolError) as err:
        read_stats_ioctl("eth0", call=kernel, max_attempts=4)
    assert err.value.reason == REASON_IO
    assert "changed on every attempt" in err.value.detail
    assert kernel.calls.count(ETHTOOL_GSSET_INFO) == 4  # bounded
    assert ETHTOOL_GSTATS not in kernel.calls


def test_kernel_without_gsset_info_uses_drvinfo() -> None:
    kernel = FakeKernel([BASE], [0])
    kernel.gsset_info_errno = errno.EOPNOTSUPP
    assert read_stats_ioctl("eth0", call=kernel) == dict(BASE)
    assert kernel.calls[:2] == [ETHTOOL_GSSET_INFO, ETHTOOL_GDRVINFO]


def test_no_stats_set_is_unsupported() -> None:
    with pytest.raises(EthtoolError) as err:
        read_stats_ioctl("eth0", call=FakeKernel([[]], [0]))
    assert err.value.reason == REASON_UNSUPPORTED


@pytest.mark.parametrize(
    ("cmd", "code", "reason"),
    [
        (ETHTOOL_GSSET_INFO, errno.ENODEV, REASON_MISSING),
        (ETHTOOL_GSSET_INFO, errno.EPERM, REASON_PERMISSION),
        (ETHTOOL_GSTRINGS, errno.EACCES, REASON_PERMISSION),
        (ETHTOOL_GSTRINGS, errno.EOPNOTSUPP, REASON_UNSUPPORTED),
        (ETHTOOL_GSTATS, errno.EIO, REASON_IO),
        (ETHTOOL_GSTATS, errno.ENODEV, REASON_MISSING),  # unplugged between calls
    ],
)
def test_errno_to_reason(cmd: int, code: int, reason: str) -> None:
    kernel = FakeKernel([BASE], [0])
    kernel.errno_for[cmd] = code
    with pytest.raises(EthtoolError) as err:
        read_stats_ioctl("eth0", call=kernel)
    assert (err.value.ifname, err.value.reason) == ("eth0", reason)


def test_duplicate_and_padded_names_follow_the_text_rules() -> None:
    stats = [("a", 1), ("  b ", 2), ("a", 3), ("", 4)]
    got = read_stats_ioctl("eth0", call=FakeKernel([stats], [0]))
    text = "NIC statistics:\n" + "".join(f"     {n}: {v}\n" for n, v in stats)
    assert got == parse_stats_text(text) == {"a": 1, "b": 2}


# --- reads that start from the names kept from the last one -------------------------------------------------

GSSET_INFO_GSTATS_GSTRINGS = [ETHTOOL_GSSET_INFO, ETHTOOL_GSTATS, ETHTOOL_GSTRINGS]
FULL_READ = [ETHTOOL_GSSET_INFO, ETHTOOL_GSTRINGS, ETHTOOL_GSTATS, ETHTOOL_GSTRINGS]


def test_an_unchanged_set_is_read_with_its_names_read_once() -> None:
    kernel = FakeKernel([WITH_PFC], [0])
    cold, names = read_stat_set("eth0", None, call=kernel)
    assert kernel.calls == FULL_READ
    kernel.calls.clear()
    again, kept = read_stat_set("eth0", names, call=kernel)
    assert again == cold == dict(WITH_PFC)
    assert kept is names
    assert kernel.calls == GSSET_INFO_GSTATS_GSTRINGS


def test_kept_names_of_a_set_since_replaced_by_one_of_the_same_size_are_not_used() -> None:
    # PFC moved from priority 3 to 4 between two scrapes: same count, other names. PRIO4's values must not
    # come out under the kept PRIO3 names.
    _, names = read_stat_set("eth0", None, call=FakeKernel([PRIO3], [0]))
    kernel = FakeKernel([PRIO4], [0])
    stats, now = read_stat_set("eth0", names, call=kernel)
    assert stats == dict(PRIO4)
    assert now.names == ("rx_prio4_pause", "tx_prio4_pause")
    assert kernel.calls == GSSET_INFO_GSTATS_GSTRINGS + FULL_READ[1:]


def test_a_swap_between_the_kept_count_and_the_values_is_caught_by_the_names_after_them() -> None:
    # The count sees PRIO3, as kept; the values and names after it see PRIO4.
    _, names = read_stat_set("eth0", None, call=FakeKernel([PRIO3], [0]))
    kernel = FakeKernel([PRIO3, PRIO4], [0, 1])
    assert read_stat_set("eth0", names, call=kernel)[0] == dict(PRIO4)
    # The swap after the values, seen by the names after them: not the kept names, so read again in full.
    _, names = read_stat_set("eth0", None, call=FakeKernel([PRIO3], [0]))
    kernel = FakeKernel([PRIO3, PRIO4], [0, 0, 1])
    assert read_stat_set("eth0", names, call=kernel)[0] == dict(PRIO4)
    assert kernel.calls == GSSET_INFO_GSTATS_GSTRINGS + FULL_READ[1:]
    # A set swapped and swapped back between two reads of the names passes, kept names or not: a read of
    # the names around the values cannot see it (the full read's check has the same limit).


def test_kept_names_that_failed_once_are_not_tried_again_on_the_next_attempts() -> None:
    # A set swapping back and forth (PFC moving between priorities): after the kept check has failed, each
    # further attempt is a full read. Trying the weaker kept check again would give it a fresh chance to
    # meet the kept names at the wrong moment, and PRIO4's values would come out under PRIO3's names.
    _, names = read_stat_set("eth0", None, call=FakeKernel([PRIO3], [0]))
    kernel = FakeKernel([PRIO3, PRIO4], [(call // 2) % 2 for call in range(40)])
    with pytest.raises(EthtoolError, match="changed on every attempt"):
        read_stat_set("eth0", names, call=kernel)
    assert kernel.calls == GSSET_INFO_GSTATS_GSTRINGS + FULL_READ[1:] + FULL_READ * (DEFAULT_ATTEMPTS - 1)


def test_kept_names_of_another_size_start_a_full_read() -> None:
    _, names = read_stat_set("eth0", None, call=FakeKernel([BASE], [0]))
    kernel = FakeKernel([WITH_PFC], [0])
    stats, now = read_stat_set("eth0", names, call=kernel)
    assert stats == dict(WITH_PFC)
    assert len(now.names) == len(WITH_PFC)
    assert kernel.calls == FULL_READ


def test_kept_names_with_empty_and_repeated_names_follow_the_text_rules() -> None:
    stats = [("a", 1), ("  b ", 2), ("a", 3), ("", 4)]
    kernel = FakeKernel([stats], [0])
    _, names = read_stat_set("eth0", None, call=kernel)
    assert read_stat_set("eth0", names, call=kernel)[0] == {"a": 1, "b": 2}
    unique = [("a", 1), ("b", 2)]
    assert StatNames.decode(read_stat_set("eth0", None, call=FakeKernel([unique], [0]))[1].table).by_position
    assert not names.by_position


# --- boundaries the fixtures above do not reach ------------------------------------------------------------


def test_names_the_kernel_would_truncate_never_reach_it() -> None:
    # dev_ioctl() NUL-terminates ifr_name at byte 15: a 16-byte name would read the netdev named by its
    # first 15 bytes, another NIC's statistics under this one's name.
    kernel = FakeKernel([BASE], [0])
    assert read_stats_ioctl("a" * 15, call=kernel) == dict(BASE)
    for name in ("a" * 16, "é" * 8):  # 16 bytes, in characters or in UTF-8
        with pytest.raises(EthtoolError) as err:
            read_stats_ioctl(name, call=kernel)
        assert err.value.reason == REASON_MISSING
    assert kernel.calls.count(ETHTOOL_GSSET_INFO) == 1


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EINVAL])
def test_gsset_info_refusals_fall_back_to_drvinfo(code: int) -> None:
    kernel = FakeKernel([BASE], [0])
    kernel.gsset_info_errno = code
    assert read_stats_ioctl("eth0", call=kernel) == dict(BASE)
    assert ETHTOOL_GDRVINFO in kernel.calls


def test_old_kernel_growth_filling_the_headroom_exactly_is_retried() -> None:
    # The buffer holds count + headroom entries: growth to exactly that fits, so it is a retry, not a failure.
    grown = [(f"ch{i}_poll", i) for i in range(len(BASE) + ethtool._MIN_HEADROOM)]
    kernel = FakeKernel([BASE, grown], [0, 1], honours_len=False)
    assert read_stats_ioctl("eth0", call=kernel) == dict(grown)


def test_old_kernel_growth_filling_the_headroom_between_strings_and_values_is_retried() -> None:
    # The same boundary for GSTATS: an old kernel that grew the set after GSTRINGS writes exactly our capacity.
    grown = [(f"ch{i}_poll", i) for i in range(len(BASE) + ethtool._MIN_HEADROOM)]
    kernel = FakeKernel([BASE, grown], [0, 0, 1], honours_len=False)
    assert read_stats_ioctl("eth0", call=kernel) == dict(grown)
    assert kernel.calls.count(ETHTOOL_GSTATS) == 2


def test_headroom_grows_with_a_large_stat_set() -> None:
    # mlx5 with many channels lists thousands of stats; adding channels adds more than the fixed minimum
    # headroom. An old kernel writes the grown set whatever we asked, so the buffer must hold it.
    big = [(f"ch{i}_poll", i) for i in range(3000)]
    bigger = big + [(f"ch{i}_poll", i) for i in range(3000, 5500)]
    kernel = FakeKernel([big, bigger], [0, 1], honours_len=False)
    assert read_stats_ioctl("eth0", call=kernel) == dict(bigger)


class LyingKernel:
    """Answers GSSET_INFO with `count`, GSTRINGS with `strings` entries (default `count`) and GSTATS with
    `reported`, writing none of them."""

    def __init__(self, count: int, reported: int, strings: int | None = None) -> None:
        self.count, self.reported = count, reported
        self.strings = count if strings is None else strings
        self.calls: list[int] = []

    def __call__(self, ifname: str, buffer: array) -> None:
        (cmd,) = struct.unpack_from("=I", buffer, 0)
        self.calls.append(cmd)
        if cmd == ETHTOOL_GSSET_INFO:
            struct.pack_into("=QI", buffer, 8, 1 << 1, self.count)
        elif cmd == ETHTOOL_GSTRINGS:
            struct.pack_into("=I", buffer, 8, self.strings)  # the names themselves stay empty
        elif cmd == ETHTOOL_GSTATS:
            struct.pack_into("=I", buffer, 4, self.reported)


def test_implausible_stat_count_is_refused_before_allocating() -> None:
    kernel = LyingKernel(ethtool.MAX_STATS + 1, 0)
    with pytest.raises(EthtoolError) as err:
        read_stats_ioctl("eth0", call=kernel)
    assert err.value.reason == REASON_IO and "implausible" in err.value.detail
    assert kernel.calls == [ETHTOOL_GSSET_INFO]


def test_the_largest_accepted_stat_count_fits_the_memory_limit() -> None:
    # A read holds the name buffer (with its headroom) more than once at its peak: at the old ceiling of
    # 1 << 20 that was 64 MB a copy, and the process reached 268 MB, past the shipped 256 MB limits.
    names_buffer = 2 * ethtool.MAX_STATS * ethtool.ETH_GSTRING_LEN
    assert names_buffer <= 8 << 20


def test_value_count_beyond_the_buffer_is_an_io_error_not_a_crash() -> None:
    # A count past our buffer cannot be unpacked; it must surface as EthtoolError like every other fault.
    kernel = LyingKernel(3, 10**6)
    with pytest.raises(EthtoolError) as err:
        read_stats_ioctl("eth0", call=kernel)
    assert err.value.reason == REASON_IO


def test_label_bounds_are_inclusive() -> None:
    # Lanes 0-15, priorities 0-7 and queues/channels 0-4095 are label values; one past each stays in the name.
    out = by_source(curate({"rx_err_lane_15_phy": 1, "rx_err_lane_10_phy": 2, "tx_prio7_pause": 3}))
    # Lane 15 is curated as lane 10 is, not left to the generic per-lane name.
    assert (out["rx_err_lane_15_phy"].key, dict(out["rx_err_lane_15_phy"].labels)) == (
        "lane_raw_errors",
        {"direction": "rx", "lane": "15"},
    )
    assert out["rx_err_lane_10_phy"].key == "lane_raw_errors"
    assert dict(out["tx_prio7_pause"].labels) == {"direction": "tx", "priority": "7"}
    assert generic_key("rx_fec_corrected_lane_15") == ("stat_lane_fec_corrected", (("direction", "rx"), ("lane", "15")))
    assert generic_key("rx_fec_corrected_lane_16")[0] == "stat_fec_corrected_lane_16"
    # `laneN` is a lane as much as `lane_N` (generic_key's rule), and any lane stat is kept uncurated.
    lane0 = by_source(curate({"rx_fec_corrected_lane0": 4}))["rx_fec_corrected_lane0"]
    assert (lane0.key, lane0.labels) == ("stat_lane_fec_corrected", (("direction", "rx"), ("lane", "0")))
    assert generic_key("rx_prio_7_x") == ("stat_priority_x", (("direction", "rx"), ("priority", "7")))
    assert generic_key("rx_prio_8_x")[0] == "stat_prio_8_x"
    # mlx5's send queues of 8 traffic classes over 256 channels go up to tx2047 (ethtool review).
    assert generic_key("tx2047_packets") == ("stat_queue_packets", (("direction", "tx"), ("queue", "2047")))
    assert generic_key("tx4095_cqe_err") == ("stat_queue_cqe_err", (("direction", "tx"), ("queue", "4095")))
    assert generic_key("tx4096_cqe_err")[0] == "stat_tx4096_cqe_err"
    assert generic_key("ch4095_poll") == ("stat_channel_poll", (("direction", ""), ("channel", "4095")))
    assert generic_key("ch4096_poll")[0] == "stat_ch4096_poll"
    # i40e and ixgbe put the queue before a dot: one family, not one per queue.
    assert generic_key("tx-0.tx_packets") == ("stat_queue_tx_packets", (("direction", "tx"), ("queue", "0")))
    assert generic_key("rx-17.rx_bytes") == ("stat_queue_rx_bytes", (("direction", "rx"), ("queue", "17")))


def test_values_at_and_past_two_to_the_64_are_dropped() -> None:
    # One bad value at a time: each out-of-range value alone must be enough to drop its name.
    for bad in (2**64, -1):
        stats = {"rx_prio3_pause": bad, "tx_prio3_pause": 2**64 - 1, "tx_discards_phy": 0}
        assert [(c.source, c.value) for c in curate(stats)] == [("tx_prio3_pause", 2**64 - 1), ("tx_discards_phy", 0)]


def test_port_wide_queue_totals_and_per_queue_stats_get_different_keys() -> None:
    # mlx5 lists port-wide totals tx_queue_{stopped,dropped,wake} (sw stats) and per-SQ txN_{stopped,...}.
    # generic_key strips `tx_` from the first, leaving `queue_stopped`, the very key the queue dimension
    # gives the second: one key with and without a queue label, which the exposition cannot keep apart.
    stats = {"tx_queue_stopped": 5, "tx0_stopped": 2, "tx_queue_dropped": 1, "tx3_dropped": 0}
    curated = curate(stats, [re.compile("stopped|dropped")])
    assert len(curated) == 4
    check_curated(curated)


def test_names_end_at_their_first_nul_like_ethtool_prints_them() -> None:
    # ethtool prints a name with %.*s, which stops at the first NUL: a driver that copies a fixed 32 bytes
    # from a shorter string leaves bytes after it, and they are no part of the name.
    class PaddedKernel(FakeKernel):
        def __call__(self, ifname: str, buffer: array) -> None:
            super().__call__(ifname, buffer)
            if struct.unpack_from("=I", buffer, 0)[0] == ETHTOOL_GSTRINGS:
                struct.pack_into("10s", buffer, 12 + len("rx_bytes"), b"\0tx_bytes\0")

    assert read_stats_ioctl("eth0", call=PaddedKernel([[("rx_bytes", 7), ("tx_bytes", 8)]], [0])) == {
        "rx_bytes": 7,
        "tx_bytes": 8,
    }


def test_no_attempts_asked_still_reads_once() -> None:
    kernel = FakeKernel([BASE], [0])
    assert read_stats_ioctl("eth0", call=kernel, max_attempts=0) == dict(BASE)
    assert kernel.calls.count(ETHTOOL_GSTATS) == 1


def test_ioctl_socket_is_closed_when_the_read_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    # One socket per read: a scrape of many netdevs must not leave one open per netdev until the GC runs.
    real_socket = socket.socket
    opened: list[socket.socket] = []

    def recorded(*args: object, **kwargs: object) -> socket.socket:
        sock = real_socket(*args, **kwargs)  # type: ignore[arg-type]
        opened.append(sock)
        return sock

    monkeypatch.setattr(ethtool.socket, "socket", recorded)
    for name, reason in (("lo", REASON_UNSUPPORTED), ("rdmaexp-none0", REASON_MISSING)):
        with pytest.raises(EthtoolError) as err:
            read_stats_ioctl(name)
        assert err.value.reason == reason
    assert len(opened) == 2
    assert [sock.fileno() for sock in opened] == [-1, -1]


def test_indented_name_starting_with_hash_is_a_statistic() -> None:
    # Only an unindented `#` line is a comment: ethtool prints a driver's `#name` indented like any other,
    # and the ioctl path keeps it, so the fixture path must too.
    stats = parse_stats_text("# saved from host1\nNIC statistics:\n     #drops: 3\n     rx_packets: 4\n")
    assert stats == {"#drops": 3, "rx_packets": 4}


def test_parsed_stats_are_the_callers_own() -> None:
    # Parses are cached per text: a caller changing its dict must not change what the next scrape parses.
    text = "NIC statistics:\n     rx_prio3_pause: 5\n"
    first = parse_stats_text(text)
    first["rx_prio3_pause"] = 99
    del first["rx_prio3_pause"]
    first["injected"] = 1
    assert parse_stats_text(text) == {"rx_prio3_pause": 5}


def test_extra_starting_with_all_keeps_apart_from_the_escaped_one() -> None:
    # `tx_queue_stopped` is escaped to all_queue_stopped; a driver's own `tx_all_queue_stopped` must not land
    # on the same key and labels, where the second would be lost.
    stats = {"tx_queue_stopped": 5, "tx_all_queue_stopped": 7}
    out = curate(stats, [re.compile("stopped")])
    assert [(c.key, c.labels, c.value) for c in out] == [
        ("stat_all_queue_stopped", (("direction", "tx"),), 5),
        ("stat_all_all_queue_stopped", (("direction", "tx"),), 7),
    ]


def test_dropped_value_frees_its_key_for_the_next_name() -> None:
    # mlx5's and ice's names for priority 3's rx pause frames share one key and labels; the first wins,
    # unless its value is dropped as outside u64, when the other one's is exported.
    stats = {"rx_prio3_pause": 2**64, "rx_priority_3_xoff.nic": 5}
    assert [(c.key, c.labels, c.value, c.source) for c in curate(stats)] == [
        ("pfc_pause_frames", (("direction", "rx"), ("priority", "3")), 5, "rx_priority_3_xoff.nic")
    ]


def test_bnxt_and_ice_priorities_past_seven_are_not_curated() -> None:
    # 802.1p has priorities 0-7: a larger index in a bnxt_en or ice name is no priority label value.
    assert curate({"pfc_pri8_rx_duration_us": 1, "rx_priority_8_xoff.nic": 2}) == []


def test_lane_inside_a_word_is_no_lane_stat() -> None:
    # Uncurated names are kept for a lane index only; `plane1` is a word, and nobody opted in to it.
    assert curate({"rx_plane1_drops": 1}) == []


def test_extras_past_the_limit_are_counted_and_curated_names_are_not_limited() -> None:
    flood = {f"s{i}_lane_0": i for i in range(MAX_EXTRA_STATS + 3)}
    # A name that lands on a key already planned (S0_lane_0 on s0_lane_0's) is no new series: it neither
    # takes a place under the limit nor is counted past it.
    # Past it, each series left out is counted once (x_lane_0 and X_lane_0 are one).
    stats = {
        "s0_lane_0": 0, "S0_lane_0": 7, **flood, "x_lane_0": 1, "X_lane_0": 2, "rx_prio3_pause": 5,
        "tx_vport_unicast_bytes": 9,
    }  # fmt: skip
    curated, over_limit = curate_counted(stats, [re.compile("vport")])
    extras = [c.source for c in curated if c.key.startswith("stat_")]
    assert extras == list(flood)[:MAX_EXTRA_STATS]  # the first in the driver's order
    assert over_limit == 5  # three flood names, x_lane_0 and the vport extra past the limit
    assert [c.source for c in curated if not c.key.startswith("stat_")] == ["rx_prio3_pause"]
    assert curate_counted(dict(list(flood.items())[:MAX_EXTRA_STATS]))[1] == 0


# --- mutation review: EFAULT retries without a namespace, the guard page, odd kernel answers ---------------

BIG = [(f"ch{i}_poll", i) for i in range(3000)]  # past any headroom: EFAULT on a kernel before Dec 2025


def test_a_kept_names_read_whose_values_fault_is_read_again_in_full() -> None:
    # The set grew past the headroom between two scrapes: the kept path's values read faults, and the
    # netdev is read again from its names, not counted as a failure for the scrape.
    _, names = read_stat_set("eth0", None, call=FakeKernel([BASE], [0]))
    kernel = FakeKernel([BASE, BIG], [0, 1], honours_len=False, guarded=True)
    assert read_stat_set("eth0", names, call=kernel)[0] == dict(BIG)


def test_values_that_fault_after_the_names_were_read_are_read_again() -> None:
    # GSSET_INFO and GSTRINGS see 3 stats, GSTATS 3000: the values read faults and the set is read again.
    kernel = FakeKernel([BASE, BIG], [0, 0, 1], honours_len=False, guarded=True)
    assert read_stats_ioctl("eth0", call=kernel) == dict(BIG)
    assert kernel.calls.count(ETHTOOL_GSTATS) == 2


def test_one_empty_name_without_repeats_is_not_paired_by_position() -> None:
    stats, names = read_stat_set("eth0", None, call=FakeKernel([[("rx_crc_errors_phy", 1), ("", 2)]], [0]))
    assert stats == {"rx_crc_errors_phy": 1}
    assert not names.by_position


def test_the_socket_hands_the_kernel_memory_that_ends_at_the_guard_page(monkeypatch: pytest.MonkeyPatch) -> None:
    # A kernel writing past the buffer must fault on the PROT_NONE page, not write over the heap: the
    # ioctl gets the guarded copy, and what it wrote comes back in the caller's buffer.
    seen: list[int] = []

    def fake_ioctl(fd: int, request: int, ifreq: bytearray, mutate: bool) -> int:
        _, address = struct.unpack_from("16sP", ifreq, 0)
        seen.append(address)
        ctypes.memmove(address + 4, struct.pack("=I", 77), 4)  # the kernel answers n_stats
        return 0

    monkeypatch.setattr(ethtool.fcntl, "ioctl", fake_ioctl)
    with SocketEthtool() as sock:
        buffer = array("B", bytes(8 + 3 * 8))
        struct.pack_into("=II", buffer, 0, ETHTOOL_GSTATS, 3)
        sock("eth0", buffer)
        memory = sock._memory
        assert memory._base is not None
        assert seen == [memory._base + memory._span - len(buffer)]
        assert seen[0] != buffer.buffer_info()[0]
    assert struct.unpack_from("=I", buffer, 4) == (77,)


def test_max_stats_itself_is_accepted() -> None:
    kernel = LyingKernel(MAX_STATS, MAX_STATS)  # every name empty: nothing to pair, but read
    assert read_stats_ioctl("eth0", call=kernel, max_attempts=1) == {}
    assert kernel.calls == [ETHTOOL_GSSET_INFO, ETHTOOL_GSTRINGS, ETHTOOL_GSTATS, ETHTOOL_GSTRINGS]


def test_a_name_count_beyond_the_buffer_is_refused_at_once() -> None:
    # GSTRINGS claims one name more than its buffer holds (3 + 1024 headroom), without faulting.
    kernel = LyingKernel(3, 0, strings=1028)
    with pytest.raises(EthtoolError) as err:
        read_stats_ioctl("eth0", call=kernel)
    assert "grew from <=1027 to 1028 strings mid-read" in err.value.detail, err.value.detail
    assert kernel.calls == [ETHTOOL_GSSET_INFO, ETHTOOL_GSTRINGS]


def test_a_cleared_stats_bit_is_no_stats_set_whatever_data_holds() -> None:
    def kernel(ifname: str, buffer: array) -> None:
        struct.pack_into("=QI", buffer, 8, 0, 5)  # ETH_SS_STATS cleared, a stale count left in data[0]

    with pytest.raises(EthtoolError) as err:
        read_stats_ioctl("eth0", call=kernel)
    assert err.value.reason == REASON_UNSUPPORTED
