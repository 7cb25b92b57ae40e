"""rdma_netdev_* exposition of states a healthy capture does not show: links not up, values the kernel cannot
give, a netdev in two devices' readings.

Trees are copies of the real soft-RoCE capture (debian-6.1-rxe: rxe0 on veth0), edited the way the kernel
changes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from rdma_exporter.collect.base import FamilySet
from rdma_exporter.collect.netdev import STATISTICS_HELP, NetdevReading, NetdevSource
from rdma_exporter.config import Config, ConfigError, load_config_file
from rdma_exporter.parse.netdev import read_netdev
from rdma_exporter.parse.reader import SysfsReader
from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree

from conftest import (
    SYSFS_FIXTURES,
    RefusingReads,
    prometheus_text,
    promtool_check_metrics,
    record_reads,
    samples,
    scrape,
)

VETH = "devices/virtual/net/veth0"
PORT = {"device": "rxe0", "port": "1", "netdev": "veth0"}
Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def netdev_series(metrics: Sample) -> dict[str, float]:
    """{metric name: value} of veth0's link series (per-priority and per-slave families have no such sample)."""
    return {name: v for (name, labels), v in metrics.items() if dict(labels) == PORT}


@pytest.fixture
def rxe(captured_copy: Callable[[str], Path]) -> Path:
    return captured_copy("debian-6.1-rxe")


def test_statistics_help_covers_exactly_the_files_a_real_kernel_has() -> None:
    # The capture's statistics/ is what net-sysfs.c creates; a HELP for any other name describes a file
    # that never exists (rx_otherhost_dropped is in rtnl_link_stats64 but netlink only).
    captured = SYSFS_FIXTURES / "debian-6.1-rxe/sys" / VETH / "statistics"
    assert set(STATISTICS_HELP) == {path.name for path in captured.iterdir()}


def test_captured_veth_is_up_with_carrier(rxe: Path) -> None:
    # The baseline the edits below start from.
    got = netdev_series(samples(scrape(rxe)))
    assert (got["rdma_netdev_up"], got["rdma_netdev_admin_up"], got["rdma_netdev_carrier"]) == (1, 1, 1)
    assert got["rdma_netdev_speed_bytes_per_second"] == 10_000e6 / 8


def test_soft_roce_over_a_nic_of_a_pci_function_reads_that_nic(rxe: Path) -> None:
    # rxe0 over the NIC of a PCI function (an e1000 or virtio NIC of a VM rather than the capture's veth):
    # the NIC has no RDMA device of its own and rxe0 is on no PCI card, so the NIC is rxe0's. Judged by
    # card alone, it was on none of rxe0's and had no series.
    function = rxe / "devices/pci0000:00/0000:00:03.0"
    function.mkdir(parents=True)
    (rxe / VETH / "device").symlink_to("../../../pci0000:00/0000:00:03.0")
    got = netdev_series(samples(scrape(rxe)))
    assert got["rdma_netdev_up"] == 1 and got["rdma_netdev_carrier"] == 1


@pytest.mark.parametrize("operstate", ["lowerlayerdown", "dormant", "unknown", "notpresent", "testing"])
def test_any_operstate_but_up_is_0(rxe: Path, operstate: str) -> None:
    # veth0 whose peer went down shows lowerlayerdown (it has a lower, its iflink); carrier is off then.
    (rxe / VETH / "operstate").write_text(f"{operstate}\n")
    (rxe / VETH / "carrier").write_text("0\n")
    got = netdev_series(samples(scrape(rxe)))
    assert (got["rdma_netdev_up"], got["rdma_netdev_carrier"]) == (0, 0)
    assert got["rdma_netdev_admin_up"] == 1  # a lost link, not one set down


@pytest.mark.parametrize("how", ["EINVAL", "absent"])
def test_administratively_down_netdev_has_no_carrier_or_speed(
    rxe: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # `ip link set veth0 down`: carrier, speed and duplex have no value. A live kernel answers their reads
    # with EINVAL, which is no value and no error, as an absent file is. No carrier series: 0 would claim a
    # cable problem.
    (rxe / VETH / "operstate").write_text("down\n")
    (rxe / VETH / "flags").write_text("0x1002\n")  # the captured 0x1003 less IFF_UP
    names = ("carrier", "speed", "duplex")
    if how == "absent":
        for name in names:
            (rxe / VETH / name).unlink()
    else:
        refusing = RefusingReads(monkeypatch, refused=[f"veth0/{name}" for name in names])
    metrics = samples(scrape(rxe))
    got = netdev_series(metrics)
    assert (got["rdma_netdev_up"], got["rdma_netdev_admin_up"]) == (0, 0)
    assert "rdma_netdev_carrier" not in got and "rdma_netdev_speed_bytes_per_second" not in got
    assert got["rdma_netdev_mtu_bytes"] == 1500
    assert not [k for k in metrics if k[0] == "rdma_exporter_file_read_errors_total"]
    if how == "EINVAL":
        assert set(refusing.attempts) == {"veth0/carrier", "veth0/speed"}  # duplex is not read


def test_unreadable_operstate_is_no_up_series_and_an_error(rxe: Path) -> None:
    # A state that cannot be read is unknown, not "down": no rdma_netdev_up sample, and the read is counted.
    (rxe / VETH / "operstate").write_bytes(b"\xff\xfe\n")
    metrics = samples(scrape(rxe))
    got = netdev_series(metrics)
    assert "rdma_netdev_up" not in got and got["rdma_netdev_carrier"] == 1
    errors = {dict(ls)["reason"]: v for (n, ls), v in metrics.items() if n == "rdma_exporter_file_read_errors_total"}
    assert errors == {"malformed": 1}


@pytest.mark.parametrize("text", ["garbage\n", "UP\n", "1\n", "\n"])
def test_operstate_that_is_no_kernel_state_is_no_up_series_and_an_error(rxe: Path, text: str) -> None:
    # The kernel prints one of RFC 2863's seven names; anything else says nothing about the link. Read as
    # "not up", it gave rdma_netdev_up 0, a link-down alert, with no read error to explain it.
    (rxe / VETH / "operstate").write_text(text)
    metrics = samples(scrape(rxe))
    got = netdev_series(metrics)
    assert "rdma_netdev_up" not in got and got["rdma_netdev_carrier"] == 1
    errors = {dict(ls)["reason"]: v for (n, ls), v in metrics.items() if n == "rdma_exporter_file_read_errors_total"}
    assert errors == {"malformed": 1}


def test_netdev_in_two_devices_readings_is_exposed_once_under_the_first() -> None:
    # Locality gives each netdev one reader; should two devices still both read one (a scrape racing a
    # change of the RDMA devices on the NIC), the series must not be doubled, whatever the read order.
    veth = read_netdev(SYSFS_FIXTURES / "debian-6.1-rxe" / "sys", "veth0", SysfsReader("rxe0"))
    assert veth is not None
    single = FamilySet()
    NetdevSource().expose({"rxe0": NetdevReading(((1, veth),))}, single)
    out = FamilySet()
    NetdevSource().expose({"rxe1": NetdevReading(((1, veth),)), "rxe0": NetdevReading(((1, veth),))}, out)
    assert prometheus_text(out) == prometheus_text(single)


def test_statistics_files_that_normalise_alike_give_one_series() -> None:
    # statistics/ is exported file by file, the names made metric-safe: two files that map to one metric
    # name (a driver's "rx-bytes" beside the kernel's rx_bytes) must not give it two samples of one series
    # (the first file in sorted order is kept).
    veth = read_netdev(SYSFS_FIXTURES / "debian-6.1-rxe" / "sys", "veth0", SysfsReader("rxe0"))
    assert veth is not None
    out = FamilySet()
    stats = {"rx-bytes": 7, "rx_bytes": 726, "rx_packets": 9}
    reading = replace(veth, statistics=stats, statistics_files=tuple(sorted(stats)))
    NetdevSource().expose({"rxe0": NetdevReading(((1, reading),))}, out)
    got = sorted((s.name, s.value) for family in out for s in family.samples if s.name.startswith("rdma_netdev_rx_"))
    assert got == [("rdma_netdev_rx_bytes_total", 7), ("rdma_netdev_rx_packets_total", 9)]


def test_statistics_file_that_owns_a_name_keeps_it_when_it_fails(rxe: Path) -> None:
    # The first file of the listing owns the series. When its read fails, the series is missing for that
    # scrape: taking the other file's value instead read 7 -> 726 -> 7, a reset and a false increase to
    # Prometheus (review; the hw_counters/ files were already decided from the listing).
    statistics = rxe / VETH / "statistics"
    (statistics / "rx-bytes").write_text("7\n")
    assert netdev_series(samples(scrape(rxe)))["rdma_netdev_rx_bytes_total"] == 7
    (statistics / "rx-bytes").write_text("garbage\n")
    got = samples(scrape(rxe))
    assert "rdma_netdev_rx_bytes_total" not in netdev_series(got)
    labels = (("collector", "netdev"), ("device", "rxe0"), ("reason", "malformed"))
    assert got[("rdma_exporter_file_read_errors_total", labels)] == 1


def test_statistics_files_get_names_promtool_accepts(rxe: Path) -> None:
    # A statistics/ file name is turned into a metric name token by token, as hw_counters/ names are: a
    # unit promtool refuses (bits, ms) or a type's name must not fail `promtool check metrics` on the node.
    for name, value in (("rx_bits", "5\n"), ("tx_gauge_ms", "6\n"), ("rx histogram", "7\n")):
        (rxe / VETH / "statistics" / name).write_text(value)
    text = scrape(rxe)
    promtool_check_metrics(text)
    got = netdev_series(samples(text))
    assert (got["rdma_netdev_rx_bit_total"], got["rdma_netdev_tx_gaugex_msec_total"]) == (5, 6)
    assert got["rdma_netdev_rx_histogramx_total"] == 7
    assert got["rdma_netdev_rx_bytes_total"] == 726  # the kernel's own names are unchanged


def ipoib_and_roce(metrics: Sample) -> tuple[set[str], set[str]]:
    """Netdev names of InfiniBand ports (IPoIB) and of Ethernet ports (RoCE), from the port info."""
    layer = {(d["device"], d["port"]): d["link_layer"]
             for d in (dict(ls) for n, ls in metrics if n == "rdma_port_info")}  # fmt: skip
    by_layer: dict[str, set[str]] = {"InfiniBand": set(), "Ethernet": set()}
    for name, labels in metrics:
        if name == "rdma_netdev_up":
            d = dict(labels)
            by_layer[layer[(d["device"], d["port"])]].add(d["netdev"])
    return by_layer["InfiniBand"], by_layer["Ethernet"]


STATISTICS_NAMES = frozenset(f"rdma_netdev_{file}_total" for file in STATISTICS_HELP)


def statistics_of(metrics: Sample, netdev: str) -> dict[str, float]:
    return {name: v for (name, ls), v in metrics.items() if name in STATISTICS_NAMES and ("netdev", netdev) in ls}


RX_BYTES = "statistics/rx_bytes"


def test_ipoib_statistics_are_read_only_when_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys_root = build_tree(tmp_path / "t", SAMPLE_SPEC)
    ethtool_dir = tmp_path / "t" / "ethtool"
    opened = record_reads(monkeypatch)
    default = samples(scrape(sys_root, ethtool_dir=ethtool_dir))
    ipoib, roce = ipoib_and_roce(default)
    assert len(ipoib) == 8 and len(roce) == 2, (ipoib, roce)
    # Off by default: an IPoIB interface keeps its link series, and not one statistics/ file is opened.
    for name in ipoib:
        assert [v for (n, ls), v in default.items() if n == "rdma_netdev_up" and ("netdev", name) in ls] == [1]
        assert not statistics_of(default, name), name
    read_statistics = {parts[parts.index("statistics") - 1] for parts in (path.split("/") for path in opened)
                       if "statistics" in parts}  # fmt: skip
    assert read_statistics == roce, read_statistics
    # RoCE netdevs carry the RDMA traffic: always read.
    for name in roce:
        got = statistics_of(default, name)
        assert got["rdma_netdev_rx_bytes_total"] == int((sys_root / "class/net" / name / RX_BYTES).read_text())

    config = Config(collector_settings={"netdev": {"ipoib_statistics": True}})
    asked = samples(scrape(sys_root, config, ethtool_dir=ethtool_dir))
    for name in ipoib:
        got = statistics_of(asked, name)
        assert got["rdma_netdev_rx_bytes_total"] == int((sys_root / "class/net" / name / RX_BYTES).read_text())
        assert len(got) >= 20
    assert set(asked) - set(default) == {
        key for key in asked if key[0] in STATISTICS_NAMES and dict(key[1])["netdev"] in ipoib
    }


@pytest.mark.parametrize("garbage", ["", "x\n", "-5\n"])
def test_an_ipoib_netdev_with_a_garbled_type_keeps_its_statistics_off(tmp_path: Path, garbage: str) -> None:
    # An unreadable type counted as "not IPoIB" and turned on the 24 statistics series that
    # collector.netdev.ipoib_statistics keeps off (fuzz review): the port's link layer decides then. A RoCE
    # netdev's garbled type keeps its statistics on.
    sys_root = build_tree(tmp_path / "t", SAMPLE_SPEC)
    ethtool_dir = tmp_path / "t" / "ethtool"
    ipoib, roce = ipoib_and_roce(samples(scrape(sys_root, ethtool_dir=ethtool_dir)))
    for name in (min(ipoib), min(roce)):
        (sys_root / "class/net" / name / "type").write_text(garbage)
    garbled = samples(scrape(sys_root, ethtool_dir=ethtool_dir))
    assert not statistics_of(garbled, min(ipoib))
    assert statistics_of(garbled, min(roce))


def test_a_netdev_whose_type_and_port_link_layer_are_both_unreadable_keeps_statistics_off(tmp_path: Path) -> None:
    # With neither readable, the port counts as InfiniBand, as a port without a link_layer file (kernels
    # before RoCE) was, so its IPoIB netdev's statistics stay off (mutation review: no test reached it).
    sys_root = build_tree(tmp_path / "t", SAMPLE_SPEC)
    ethtool_dir = tmp_path / "t" / "ethtool"
    metrics = samples(scrape(sys_root, ethtool_dir=ethtool_dir))
    ipoib, _ = ipoib_and_roce(metrics)
    name = min(ipoib)
    (labels,) = [dict(ls) for n, ls in metrics if n == "rdma_netdev_up" and ("netdev", name) in ls]
    (sys_root / "class/net" / name / "type").write_text("x\n")
    (sys_root / "class/infiniband" / labels["device"] / "ports" / labels["port"] / "link_layer").write_text("x\n")
    garbled = samples(scrape(sys_root, ethtool_dir=ethtool_dir))
    assert ("rdma_netdev_up", tuple(sorted(labels.items()))) in garbled  # the netdev is still there
    assert not statistics_of(garbled, name)


@pytest.mark.parametrize("value", ["yes", 1, None, "true"])
def test_ipoib_statistics_must_be_true_or_false(tmp_path: Path, value: object) -> None:
    path = tmp_path / "c.yml"
    path.write_text(yaml.safe_dump({"collector": {"netdev": {"ipoib_statistics": value}}}))
    with pytest.raises(ConfigError) as raised:
        load_config_file(path)
    assert "collector.netdev.ipoib_statistics" in str(raised.value) and "true or false" in str(raised.value)
