"""Every value node_exporter 1.5's infiniband collector exports has an equal value in ours, and so does
every HCA temperature its hwmon collector exports.

node_exporter (Debian `prometheus-node-exporter`) runs for real on the same tree; its names are mapped
to ours below. A node_exporter metric missing from the map fails the test, so a new upstream metric
cannot be silently ignored.
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree

from conftest import CAPTURED_TREES, SYSFS_FIXTURES, free_port, require_binary, samples, scrape

# node_exporter name (without node_infiniband_) -> ours.
PORT_METRICS = {
    "excessive_buffer_overrun_errors_total": "rdma_port_excessive_buffer_overrun_errors_total",
    "link_downed_total": "rdma_port_link_downed_total",
    "link_error_recovery_total": "rdma_port_link_error_recovery_total",
    "local_link_integrity_errors_total": "rdma_port_local_link_integrity_errors_total",
    "multicast_packets_received_total": "rdma_port_receive_multicast_packets_total",
    "multicast_packets_transmitted_total": "rdma_port_transmit_multicast_packets_total",
    "physical_state_id": "rdma_port_physical_state_id",
    "port_constraint_errors_received_total": "rdma_port_receive_constraint_errors_total",
    "port_constraint_errors_transmitted_total": "rdma_port_transmit_constraint_errors_total",
    "port_data_received_bytes_total": "rdma_port_receive_data_bytes_total",
    "port_data_transmitted_bytes_total": "rdma_port_transmit_data_bytes_total",
    # A driver extension file (counters/port_rcv_discards), exported generically by us.
    "port_discards_received_total": "rdma_port_counters_port_rcv_discards_total",
    "port_discards_transmitted_total": "rdma_port_transmit_discards_total",
    "port_errors_received_total": "rdma_port_receive_errors_total",
    "port_packets_received_total": "rdma_port_receive_packets_total",
    "port_packets_transmitted_total": "rdma_port_transmit_packets_total",
    "port_receive_remote_physical_errors_total": "rdma_port_receive_remote_physical_errors_total",
    "port_receive_switch_relay_errors_total": "rdma_port_receive_switch_relay_errors_total",
    "port_transmit_wait_total": "rdma_port_transmit_wait_total",
    "rate_bytes_per_second": "rdma_port_rate_bytes_per_second",
    "state_id": "rdma_port_state_id",
    "symbol_error_total": "rdma_port_symbol_errors_total",
    "unicast_packets_received_total": "rdma_port_receive_unicast_packets_total",
    "unicast_packets_transmitted_total": "rdma_port_transmit_unicast_packets_total",
    "vl15_dropped_total": "rdma_port_vl15_dropped_total",
    # counters_ext/ of pre-4.5 kernels: the 64-bit twins of counters/ files, exported under the main name.
    "legacy_data_received_bytes_total": "rdma_port_receive_data_bytes_total",
    "legacy_data_transmitted_bytes_total": "rdma_port_transmit_data_bytes_total",
    "legacy_multicast_packets_received_total": "rdma_port_receive_multicast_packets_total",
    "legacy_multicast_packets_transmitted_total": "rdma_port_transmit_multicast_packets_total",
    "legacy_packets_received_total": "rdma_port_receive_packets_total",
    "legacy_packets_transmitted_total": "rdma_port_transmit_packets_total",
    "legacy_unicast_packets_received_total": "rdma_port_receive_unicast_packets_total",
    "legacy_unicast_packets_transmitted_total": "rdma_port_transmit_unicast_packets_total",
}
# Where a port has both, node_exporter exports the 32-bit counters/ value and the 64-bit legacy one; ours
# is the 64-bit value under the main name, so only that one is compared.
SUPERSEDED = {short: legacy for legacy, ours in PORT_METRICS.items() if legacy.startswith("legacy_")
              for short, same in PORT_METRICS.items() if same == ours and not short.startswith("legacy_")}  # fmt: skip
# node_exporter takes every data counter for 4-octet words; Omni-Path's hfi1 counts 8-byte flits, so
# ours is twice its value there (test_parse_infiniband.test_omni_path_data_counters_count_8_byte_flits).
OPA_DATA = {"port_data_received_bytes_total", "port_data_transmitted_bytes_total"}
# hfi1 answers these with a constant 0, which node_exporter exports and we do not
# (test_parse_infiniband.test_omni_path_counters_it_does_not_keep_are_not_exported and
# test_omni_path_in_its_real_layout_drops_the_counters_hfi1_never_fills).
OPA_CONSTANT_ZERO = {
    "symbol_error_total",
    "vl15_dropped_total",
    "port_transmit_wait_total",
    "port_receive_switch_relay_errors_total",
}
# node_exporter info labels -> our rdma_device_info labels.
INFO_LABELS = {"board_id": "board_id", "device": "device", "firmware_version": "fw_ver", "hca_type": "hca_type"}


def node_exporter_scrape(sys_root: Path, collector: str = "infiniband") -> str:
    binary = require_binary("prometheus-node-exporter")
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            "--collector.disable-defaults",
            f"--collector.{collector}",
            f"--path.sysfs={sys_root}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    return response.read().decode()
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=10)


def _compare(sys_root: Path, ethtool_dir: Path | None = None) -> int:
    theirs = samples(node_exporter_scrape(sys_root))
    ours = samples(scrape(sys_root, ethtool_dir=ethtool_dir))
    our_info = {
        dict(labels)["device"]: dict(labels) for (name, labels) in ours if name == "rdma_device_info"
    }
    compared = 0
    problems: list[str] = []
    for (name, labels), value in theirs.items():
        if not name.startswith("node_infiniband_"):
            continue
        short = name[len("node_infiniband_") :]
        label_map = dict(labels)
        if short == "info":
            mine = our_info.get(label_map["device"])
            for theirs_label, our_label in INFO_LABELS.items():
                if mine is None or mine.get(our_label) != label_map[theirs_label]:
                    problems.append(f"info {label_map}: ours {mine}")
                    break
            compared += 1
            continue
        if short not in PORT_METRICS:
            problems.append(f"node_exporter metric {name} has no counterpart in the map")
            continue
        if short in SUPERSEDED and (f"node_infiniband_{SUPERSEDED[short]}", labels) in theirs:
            continue
        key = (PORT_METRICS[short], labels)
        if short in OPA_CONSTANT_ZERO and label_map["device"].startswith("hfi1_"):
            assert key not in ours and value == 0
            compared += 1
            continue
        if short in OPA_DATA and label_map["device"].startswith("hfi1_"):
            value *= 2
        if key not in ours:
            problems.append(f"{name}{label_map}: missing in ours as {PORT_METRICS[short]}")
        elif ours[key] != value:
            problems.append(f"{name}{label_map}: node_exporter {value} != ours {ours[key]}")
        compared += 1
    assert not problems, "\n".join(problems)
    return compared


# Trees on which node_exporter's whole infiniband collector fails (one device without counters/ or with
# an empty attribute costs it every metric of every device); ours must serve them completely. A real
# kernel's rxe0 is one: soft RoCE has no counters/ directory (its counters are in hw_counters/).
BREAKS_NODE_EXPORTER = {"built-multi-driver", "debian-6.1-rxe"}


@pytest.mark.parametrize("tree", sorted(set(CAPTURED_TREES) - BREAKS_NODE_EXPORTER))
def test_captured_tree_values_match_node_exporter(tree: str) -> None:
    compared = _compare(SYSFS_FIXTURES / tree / "sys")
    assert compared > 10  # the tree really produced node_exporter infiniband series


def test_sample_tree_values_match_node_exporter(tmp_path: Path) -> None:
    sys_root = build_tree(tmp_path / "sample", SAMPLE_SPEC)
    compared = _compare(sys_root, tmp_path / "sample" / "ethtool")
    assert compared > 200


@pytest.mark.parametrize("tree", sorted(BREAKS_NODE_EXPORTER))
def test_tree_that_breaks_node_exporter_is_fully_served(tree: str) -> None:
    sys_root = SYSFS_FIXTURES / tree / "sys"
    theirs = samples(node_exporter_scrape(sys_root))
    assert theirs[("node_scrape_collector_success", (("collector", "infiniband"),))] == 0
    ours = samples(scrape(sys_root))
    assert ours[("rdma_exporter_scrape_collector_success", (("collector", "infiniband"),))] == 1
    devices = {dict(labels)["device"] for name, labels in ours if name == "rdma_port_info"}
    assert devices == {p.name for p in (sys_root / "class" / "infiniband").iterdir()}


# node_exporter's hwmon names -> ours. Its `chip` is the PCI path of the function, its `sensor` the
# channel (temp1), whose label it gives in node_hwmon_sensor_label; ours carry the device and that label.
HWMON_METRICS = {
    "node_hwmon_temp_celsius": "rdma_device_temperature_celsius",
    "node_hwmon_temp_crit_celsius": "rdma_device_temperature_critical_celsius",
}


def test_sample_tree_temperatures_match_node_exporters_hwmon(tmp_path: Path) -> None:
    sys_root = build_tree(tmp_path / "sample", SAMPLE_SPEC)
    theirs = samples(node_exporter_scrape(sys_root, "hwmon"))
    ours = samples(scrape(sys_root))
    # The chip name ends with the function's address, its dot made an underscore.
    device_of = {
        info["pci_address"].replace(".", "_"): info["device"]
        for info in (dict(labels) for name, labels in ours if name == "rdma_device_info")
    }
    label_of = {
        (dict(labels)["chip"], dict(labels)["sensor"]): dict(labels)["label"]
        for name, labels in theirs
        if name == "node_hwmon_sensor_label"
    }
    compared = set()
    for (name, labels), value in theirs.items():
        if name not in HWMON_METRICS:
            continue
        chip, channel = dict(labels)["chip"], dict(labels)["sensor"]
        (device,) = [device for address, device in device_of.items() if chip.endswith(f"_{address}")]
        key = (HWMON_METRICS[name], (("device", device), ("sensor", label_of[(chip, channel)])))
        assert ours.get(key) == value, f"{name}{dict(labels)}: node_exporter {value} != ours {ours.get(key)}"
        compared.add(key)
    mine = {key for key in ours if key[0] in HWMON_METRICS.values()}
    assert compared == mine and len(mine) == 36  # ten ASICs and eight optical modules, each with a threshold
