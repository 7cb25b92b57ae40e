"""Parsing of /sys/class/infiniband: formats, semantics and every kind of bad input."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdma_exporter.collect.engine import RdmaCollector
from rdma_exporter.collect.readers import DeviceReads, shared_reads
from rdma_exporter.config import Config
from rdma_exporter.daemon import build_collector
from rdma_exporter.parse import reader as reader_module
from rdma_exporter.parse.infiniband import (
    CLASS_DIR,
    PMA_COUNTERS,
    PMA_COUNTERS_EXT,
    PMA_QUIRKS,
    SUPERSEDED_BY_EXT,
    hw_counter_is_gauge,
    metric_fragment,
    parse_rate,
    parse_state,
    pma_counter,
    read_device_info,
    read_device_snapshot,
)
from rdma_exporter.parse.reader import U64_MAX, ReadErrors, SysfsReader, parse_uint
from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree

from conftest import SYSFS_FIXTURES, RefusingReads, promtool_check_metrics, samples, scrape, symlink, write_files

LEPTON = SYSFS_FIXTURES / "leptonai-gpud-h100" / "sys"


@pytest.mark.parametrize(
    ("text", "bits", "lanes", "speed"),
    [
        ("400 Gb/sec (4X NDR)", 400e9, 4, "NDR"),
        ("200 Gb/sec (2X NDR)", 200e9, 2, "NDR"),
        ("25 Gb/sec (1X EDR)", 25e9, 1, "EDR"),
        ("10 Gb/sec (4X)", 10e9, 4, "SDR"),  # pre-4.x kernels print no speed name for SDR
        ("2.5 Gb/sec (1X)", 2.5e9, 1, "SDR"),
        ("56 Gb/sec (4X FDR)", 56e9, 4, "FDR"),
        ("2.5 Gb/sec (1X SDR)", 2.5e9, 1, "SDR"),
        ("800 Gb/sec (4X XDR)", 800e9, 4, "XDR"),
        ("40 Gb/sec (4X FDR10)", 40e9, 4, "FDR10"),
        ("120 Gb/sec (12X QDR)", 120e9, 12, "QDR"),
        ("800 Gb/sec (8X NDR)", 800e9, 8, "NDR"),
        ("100 Gb/sec (4X EDR)\n", 100e9, 4, "EDR"),
        ("100 Gb/sec", 100e9, None, None),
        ("0 GB/sec", 0.0, None, None),  # MLNX_OFED mlx5, empty cage
    ],
)
def test_parse_rate_forms(text: str, bits: float, lanes: int | None, speed: str | None) -> None:
    rate = parse_rate(text)
    assert rate is not None
    assert (rate.bits_per_second, rate.lanes, rate.speed) == (bits, lanes, speed)
    assert rate.bytes_per_second == bits / 8


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "Gb/sec",
        "-10 Gb/sec (4X)",
        "N/A (no PMA)",
        "400 Mb/sec (4X NDR)",
        "40 Gb/sec (4X QDR) x",  # the whole line is the format: trailing text is not a rate
        # Widths ib_width_enum_to_int() has no number for: rate_show() fails with EINVAL instead (fuzz review).
        "300 Gb/sec (3X NDR)",
        "400 Gb/sec (999999999X NDR)",
        "0 Gb/sec (0X NDR)",
        "\u0664\u0660\u0660 Gb/sec (\u0664X NDR)",  # Arabic-Indic digits: \d took them, no kernel prints them
    ],
)
def test_parse_rate_rejects_garbage(text: str) -> None:
    assert parse_rate(text) is None


def test_parse_state_and_uint() -> None:
    assert parse_state("4: ACTIVE") == (4, "ACTIVE")
    assert parse_state("5: LinkUp\n") == (5, "LinkUp")
    assert parse_state("ACTIVE") is None
    assert parse_state("4:") == (4, "")
    assert parse_state("\u0664: ACTIVE") is None  # ARABIC-INDIC DIGIT FOUR
    assert parse_state("\uff15: LinkUp") is None  # FULLWIDTH DIGIT FIVE
    # More digits than int() converts (4300) is garbage like any other, not a ValueError for the device.
    assert parse_state("4" * 5000 + ": ACTIVE") is None
    assert parse_rate("400 Gb/sec (" + "4" * 5000 + "X NDR)") is None
    assert parse_rate("4" * 5000 + " Gb/sec (4X NDR)") is None  # not a rate of +Inf
    assert parse_uint("18446744073709551615") == U64_MAX
    assert parse_uint("18446744073709551616") is None  # above 2^64-1: garbage, not a counter
    assert parse_uint("-1") is None
    assert parse_uint("0x1a", base=0) == 26
    assert parse_uint("") is None
    assert parse_uint("1_000") is None
    assert parse_uint("\u0663") is None  # ARABIC-INDIC DIGIT THREE: int() takes it, the kernel never prints it


# Random text is almost never a rate or a state: these are shaped like the kernel's files, with what a
# broken driver could put in their numbers, so that the checks below see parsed values.
rate_like = st.builds(
    "{}{} G{}/sec{}".format,
    st.sampled_from(["", "-", " "]),
    st.from_regex(r"[0-9]{1,12}(\.[0-9]{1,3})?", fullmatch=True),
    st.sampled_from(["b", "B"]),
    st.one_of(st.just(""), st.builds(" ({}X {})".format, st.integers(-1, 10**10), st.sampled_from(["NDR", "", "x"]))),
)
state_like = st.builds(
    "{}{}{}".format,
    st.integers(-300, 10**10).map(str),
    st.sampled_from([": ", ":", ""]),
    st.sampled_from(["ACTIVE", "", "x y"]),
)


@given(st.one_of(st.text(max_size=60), rate_like, state_like))
def test_parsers_never_raise(text: str) -> None:
    rate = parse_rate(text)
    assert rate is None or rate.bits_per_second >= 0
    state = parse_state(text)
    assert state is None or 0 <= state[0] <= 255
    value = parse_uint(text)
    assert value is None or 0 <= value <= U64_MAX


@given(st.text(min_size=0, max_size=40))
def test_metric_fragment_is_a_valid_name_part(name: str) -> None:
    fragment = metric_fragment(name)
    assert fragment
    assert fragment[0].isalpha()
    assert all(c.isascii() and (c.isalnum() or c == "_") for c in fragment)
    assert fragment == fragment.lower()


def test_metric_fragment_driver_names() -> None:
    assert metric_fragment("ip4InOctets") == "ip4_in_octets"
    assert metric_fragment("RxECNMrkd") == "rx_ecn_mrkd"
    assert metric_fragment("tx bytes") == "tx_bytes"
    assert metric_fragment("rx_write_requests") == "rx_write_requests"
    assert metric_fragment(". -") == "unnamed"  # nothing of the name is left: still a valid fragment


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_reader_survives_any_file_content(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "attr"
    path.write_bytes(content)
    reader = SysfsReader("dev")
    text = reader.text(path)
    assert text is None or isinstance(text, str)
    value = reader.uint(path)
    assert value is None or 0 <= value <= U64_MAX
    # Every failure is accounted for: a None from uint() on a non-empty file is a counted error.
    if value is None:
        assert reader.errors.total() >= 1


def test_saturated_counters_are_reported(tmp_path: Path) -> None:
    # mlx5_1 of the real H100 capture: link_downed 255 (8 bit) and excessive_buffer_overrun_errors 15 (4 bit).
    values = samples(scrape(LEPTON))
    port = (("device", "mlx5_1"), ("port", "1"))

    def saturated(counter: str) -> float:
        return values[("rdma_port_pma_saturated", tuple(sorted((*port, ("counter", counter)))))]

    assert saturated("link_downed") == 1
    assert saturated("excessive_buffer_overrun_errors") == 1
    assert saturated("symbol_error") == 0
    assert values[("rdma_port_link_downed_total", port)] == 255
    # 64-bit data counters are in bytes (4-octet words * 4) and have no saturation series.
    assert values[("rdma_port_receive_data_bytes_total", port)] == 205128687774249 * 4
    assert not any(k[0] == "rdma_port_pma_saturated" and ("counter", "port_rcv_data") in k[1] for k in values)


def test_data_counters_that_may_be_32bit_are_judged_at_their_32bit_maximum(captured_copy) -> None:  # type: ignore[no-untyped-def]
    """A port without the unicast files has the kernel's 32-bit PortCounters table or the 64-bit one
    without IETF counters (same file names): its data and packet counters are saturated only if they
    sit at exactly 2^32 - 1; past it they are 64 bit. Ports with the unicast files are 64 bit for sure."""
    procfs = captured_copy("prometheus-procfs")
    counters = procfs / "class/infiniband/mlx4_0/ports/1/counters"
    assert not (counters / "unicast_xmit_packets").exists()
    (counters / "port_xmit_data").write_text("4294967295\n")  # stuck: a link that looks idle
    (counters / "port_rcv_packets").write_text("4294967294\n")
    (counters / "port_xmit_packets").write_text("4294967296\n")  # past it: 64 bit
    values = samples(scrape(procfs))
    port = (("device", "mlx4_0"), ("port", "1"))

    def saturated(values: dict[tuple[str, tuple[tuple[str, str], ...]], float], counter: str) -> float | None:
        return values.get(("rdma_port_pma_saturated", tuple(sorted((*port, ("counter", counter))))))

    assert saturated(values, "port_xmit_data") == 1
    assert saturated(values, "port_rcv_packets") == 0
    assert saturated(values, "port_xmit_packets") == 0
    assert saturated(values, "port_rcv_data") == 0  # 26 billion words in the capture
    assert values[("rdma_port_transmit_data_bytes_total", port)] == 4294967295 * 4

    lepton = captured_copy("leptonai-gpud-h100")
    (lepton / "class/infiniband/mlx5_1/ports/1/counters/port_xmit_data").write_text("4294967295\n")
    values = samples(scrape(lepton))
    port = (("device", "mlx5_1"), ("port", "1"))
    assert saturated(values, "port_xmit_data") is None  # IETF extended counters: 64 bit, no verdict


def test_down_port_is_reported_not_dropped(captured_copy) -> None:  # type: ignore[no-untyped-def]
    root = captured_copy("leptonai-gpud-h100")
    port = root / "class/infiniband/mlx5_4/ports/1"
    (port / "state").write_text("1: DOWN\n")
    (port / "phys_state").write_text("3: Disabled\n")
    values = samples(scrape(root))
    labels = (("device", "mlx5_4"), ("port", "1"))
    assert values[("rdma_port_state_id", labels)] == 1
    assert values[("rdma_port_state", (*labels, ("state", "DOWN")))] == 1
    assert values[("rdma_port_state", (*labels, ("state", "ACTIVE")))] == 0
    assert values[("rdma_port_physical_state_id", labels)] == 3
    assert values[("rdma_port_symbol_errors_total", labels)] == 0  # counters of a down port are still read


MLX5_0 = (("device", "mlx5_0"), ("port", "1"))


def read_errors_key(device: str, reason: str, collector: str = "infiniband") -> tuple[str, tuple[tuple[str, str], ...]]:
    """The samples() key of rdma_exporter_file_read_errors_total for one collector, device and reason."""
    return ("rdma_exporter_file_read_errors_total", (("collector", collector), ("device", device), ("reason", reason)))

# (what to do to counters/symbol_error, expected error reason or None when it is not an error)
BAD_CONTENT = [
    ("", "malformed"),
    ("garbage\n", "malformed"),
    ("N/A (no PMA)\n", "unsupported"),
    ("18446744073709551616\n", "malformed"),
    ("-5\n", "malformed"),
    ("\xff\xfe\n", "malformed"),
    # Digits only, but more than int() converts (4300): a ValueError that cost the whole device.
    pytest.param("9" * 5000 + "\n", "malformed", id="5000-digits"),
]


@pytest.mark.parametrize(("content", "reason"), BAD_CONTENT)
def test_bad_counter_file_costs_only_its_value(captured_copy, content: str, reason: str) -> None:  # type: ignore[no-untyped-def]
    root = captured_copy("leptonai-gpud-h100")
    target = root / "class/infiniband/mlx5_0/ports/1/counters/symbol_error"
    target.write_bytes(content.encode("latin-1"))
    values = samples(scrape(root))
    assert ("rdma_port_symbol_errors_total", MLX5_0) not in values
    # Everything else of the device and the port is still there.
    assert values[("rdma_port_link_downed_total", MLX5_0)] == 0
    assert values[("rdma_port_rate_bytes_per_second", MLX5_0)] == 50e9
    assert values[("rdma_port_state_id", MLX5_0)] == 4
    assert values[read_errors_key("mlx5_0", reason)] == 1
    assert values[("rdma_exporter_scrape_collector_success", (("collector", "infiniband"),))] == 1


def test_value_without_trailing_newline_is_read(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # Every file of the H100 capture lacks the newline; make one have it to compare both forms.
    root = captured_copy("leptonai-gpud-h100")
    (root / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_wait").write_text("2489603687\n")
    values = samples(scrape(root))
    assert values[("rdma_port_transmit_wait_total", MLX5_0)] == 2489603687
    assert values[("rdma_port_transmit_wait_total", (("device", "mlx5_1"), ("port", "1")))] == 2489603687


def test_counter_file_replaced_by_directory_is_an_io_error(captured_copy) -> None:  # type: ignore[no-untyped-def]
    root = captured_copy("leptonai-gpud-h100")
    target = root / "class/infiniband/mlx5_0/ports/1/counters/symbol_error"
    target.unlink()
    target.mkdir()
    values = samples(scrape(root))
    assert ("rdma_port_symbol_errors_total", MLX5_0) not in values
    assert values[("rdma_port_link_downed_total", MLX5_0)] == 0


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (errno.EIO, "io"),
        (errno.ENODEV, "missing"),
        (errno.EOPNOTSUPP, "unsupported"),
        (errno.EACCES, "permission"),
    ],
)
def test_kernel_read_errors_cost_only_the_value(
    monkeypatch: pytest.MonkeyPatch, code: int, reason: str
) -> None:
    RefusingReads(monkeypatch, code, {"mlx5_0/ports/1/rate"})
    values = samples(scrape(LEPTON))
    assert ("rdma_port_rate_bytes_per_second", MLX5_0) not in values
    assert values[("rdma_port_state_id", MLX5_0)] == 4
    assert values[("rdma_port_symbol_errors_total", MLX5_0)] == 0
    assert values[("rdma_port_rate_bytes_per_second", (("device", "mlx5_1"), ("port", "1")))] == 50e9
    assert values[read_errors_key("mlx5_0", reason)] == 1


def test_rate_without_a_valid_width_is_absent_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Upstream rate_show() answers EINVAL for a port with no module in its cage, on every scrape: that
    # must not count as a read error (RdmaExporterReadErrors would fire for every empty cage).
    RefusingReads(monkeypatch, errno.EINVAL, {"mlx5_0/ports/1/rate"})
    values = samples(scrape(LEPTON))
    assert ("rdma_port_rate_bytes_per_second", MLX5_0) not in values
    assert values[("rdma_port_state_id", MLX5_0)] == 4
    assert not any(name == "rdma_exporter_file_read_errors_total" for name, _ in values)


def test_unrecognised_rate_is_a_counted_error_that_costs_only_the_rate(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # A rate file in no known format must show in the read errors (RdmaExporterReadErrors), not leave a
    # silently missing rate; the port's other values stay. Not counting it passed every test (mutation review).
    root = captured_copy("leptonai-gpud-h100")
    (root / "class/infiniband/mlx5_0/ports/1/rate").write_text("400 Gbps (4X NDR)\n")
    values = samples(scrape(root))
    assert ("rdma_port_rate_bytes_per_second", MLX5_0) not in values
    assert ("rdma_port_link_width_lanes", MLX5_0) not in values
    assert values[("rdma_port_state_id", MLX5_0)] == 4
    assert values[("rdma_port_symbol_errors_total", MLX5_0)] == 0
    assert values[read_errors_key("mlx5_0", "malformed")] == 1


@pytest.mark.parametrize("file", ["state", "phys_state"])
def test_unrecognised_state_is_a_counted_error_that_costs_only_the_state(captured_copy, file: str) -> None:  # type: ignore[no-untyped-def]
    # A state file in no '<id>: <name>' form must show in the read errors, not leave a port with no state
    # series and no alert (infiniband mutation review: dropping the reader.fail passed every test).
    root = captured_copy("leptonai-gpud-h100")
    (root / "class/infiniband/mlx5_0/ports/1" / file).write_text("ACTIVE\n")
    values = samples(scrape(root))
    other = "rdma_port_physical_state_id" if file == "state" else "rdma_port_state_id"
    assert {name for name, labels in values if labels == MLX5_0 and name.endswith("state_id")} == {other}
    assert values[("rdma_port_symbol_errors_total", MLX5_0)] == 0
    assert values[read_errors_key("mlx5_0", "malformed")] == 1


def test_missing_rate_file_is_a_counted_error_that_costs_only_the_rate(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # Every port has a rate file; only EINVAL (no module in the cage) means "no rate". A port without one is
    # counted, as a missing state file is. (infiniband mutation review: reading rate as optional passed.)
    root = captured_copy("leptonai-gpud-h100")
    (root / "class/infiniband/mlx5_0/ports/1/rate").unlink()
    values = samples(scrape(root))
    assert ("rdma_port_rate_bytes_per_second", MLX5_0) not in values
    assert values[("rdma_port_state_id", MLX5_0)] == 4
    assert values[read_errors_key("mlx5_0", "missing")] == 1


def test_missing_optional_attributes_are_not_errors() -> None:
    # The H100 capture has no node_guid, lid, gids...: absent facts, not failed reads.
    values = samples(scrape(LEPTON))
    assert not any(name == "rdma_exporter_file_read_errors_total" for name, _ in values)


def test_no_pma_device_keeps_its_other_values() -> None:
    # i40iw0 answers every PMA counter with "N/A (no PMA)" (pre-4.20 kernels).
    values = samples(scrape(SYSFS_FIXTURES / "prometheus-node_exporter" / "sys"))
    port = (("device", "i40iw0"), ("port", "1"))
    assert values[("rdma_port_state_id", port)] == 4
    assert values[("rdma_port_rate_bytes_per_second", port)] == 1.25e9
    assert values[("rdma_port_link_width_lanes", port)] == 4
    assert values[read_errors_key("i40iw0", "unsupported")] == 17


def test_a_no_pma_device_is_counted_once_a_minute_not_at_every_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its counter files say "N/A (no PMA)" at every read for as long as the device exists: counted at every
    # scrape, that was 17 more errors every 15 s (core review, stop 70), where an errno refusal is counted
    # once a minute.
    now = [1000.0]
    monkeypatch.setattr(reader_module, "refusal_clock", lambda: now[0])
    config = replace(Config(), sysfs=SYSFS_FIXTURES / "prometheus-node_exporter" / "sys")
    # Records of its own: the process's may hold this tree's refusals from another test, on the real clock.
    collector = build_collector(config, reads=DeviceReads(shared_reads().pool))
    unsupported = read_errors_key("i40iw0", "unsupported")
    port = (("device", "i40iw0"), ("port", "1"))
    for _ in range(4):
        values = _scrape(collector)
        assert values[unsupported] == 17
        assert values[("rdma_port_state_id", port)] == 4
        now[0] += 15.0
    now[0] = 1000.0 + 60.0
    assert _scrape(collector)[unsupported] == 2 * 17


def test_removed_ports_dir_costs_only_that_device(captured_copy) -> None:  # type: ignore[no-untyped-def]
    root = captured_copy("leptonai-gpud-h100")
    shutil.rmtree(root / "class/infiniband/mlx5_6/ports")
    values = samples(scrape(root))
    assert not any(dict(labels).get("device") == "mlx5_6" and name.startswith("rdma_port_") for name, labels in values)
    assert values[("rdma_port_state_id", (("device", "mlx5_7"), ("port", "1")))] == 4
    assert any(name == "rdma_device_info" and dict(labels)["device"] == "mlx5_6" for name, labels in values)


def test_static_and_snapshot_split() -> None:
    errors = ReadErrors()
    info = read_device_info(LEPTON, "mlx5_bond_0", SysfsReader("mlx5_bond_0", errors))
    assert info.fw_ver == "32.38.3056"
    assert info.hca_type == "MT41692"
    assert info.ports[0].link_layer == "Ethernet"
    assert len(info.ports[0].counter_files) == 21
    snapshot = read_device_snapshot(LEPTON, info, SysfsReader("mlx5_bond_0", errors))
    port = snapshot.ports[0]
    assert port.rate is not None and port.rate.lanes == 2 and port.rate.speed == "NDR"
    assert port.lid is None  # RoCE ports have no subnet manager
    assert port.hw_counters["lifespan"] == 12
    assert errors.total() == 0


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["rate", "state", "phys_state", "link_layer", "counters/symbol_error",
                             "counters/port_rcv_data", "hw_counters/lifespan", "hw_counters/out_of_buffer"]),
            st.binary(max_size=40),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_random_corruption_never_breaks_the_scrape(tmp_path_factory: pytest.TempPathFactory, edits: list) -> None:  # type: ignore[type-arg]
    from conftest import copy_tree

    root = copy_tree(LEPTON, tmp_path_factory.mktemp("fuzz") / "sys")
    for name, content in edits:
        (root / "class/infiniband/mlx5_0/ports/1" / name).write_bytes(content)
    values = samples(scrape(root))
    # The device is never lost and the other devices are untouched.
    assert any(name == "rdma_port_info" and dict(labels)["device"] == "mlx5_0" for name, labels in values)
    assert values[("rdma_port_symbol_errors_total", (("device", "mlx5_1"), ("port", "1")))] == 0
    assert values[("rdma_exporter_scrape_collector_success", (("collector", "infiniband"),))] == 1


@pytest.mark.parametrize(
    ("content", "numa", "errors"),
    [
        ("1\n", 1, 0),
        ("-1\n", None, 0),  # the platform reported no NUMA node: a fact, not a failed read
        ("garbage\n", None, 1),
        ("\n", None, 1),
        ("1.5\n", None, 1),
        ("-2\n", None, 1),  # NUMA_NO_NODE is the only negative node
    ],
)
def test_numa_node(tmp_path: Path, content: str, numa: int | None, errors: int) -> None:
    from rdma_exporter.sample_tree import build_tree, spec_for_devices

    root = build_tree(tmp_path / "t", spec_for_devices(1))
    pci_dir = (root / "class" / "infiniband" / "mlx5_0" / "device").resolve()
    (pci_dir / "numa_node").write_text(content)
    tally = ReadErrors()
    info = read_device_info(root, "mlx5_0", SysfsReader("mlx5_0", tally))
    assert info.numa_node == numa
    assert tally.counts == ({("mlx5_0", "malformed"): errors} if errors else {})
    assert info.fw_ver is not None  # the rest of the device is still read


@pytest.mark.parametrize("attribute", ["numa_node", "sriov_numvfs"])
def test_pci_attributes_a_kernel_may_not_have_are_absent_not_errors(tmp_path: Path, attribute: str) -> None:
    # numa_node exists only in a kernel built with CONFIG_NUMA, sriov_numvfs only on a function with the
    # SR-IOV capability: their absence is no value, not a read error on every device.
    from rdma_exporter.sample_tree import build_tree, spec_for_devices

    root = build_tree(tmp_path / "t", spec_for_devices(1))
    pci_dir = (root / "class" / "infiniband" / "mlx5_0" / "device").resolve()
    (pci_dir / attribute).unlink()
    tally = ReadErrors()
    info = read_device_info(root, "mlx5_0", SysfsReader("mlx5_0", tally))
    assert getattr(info, attribute) is None
    assert tally.counts == {}
    assert not info.is_vf


# node_type_show() (drivers/infiniband/core/sysfs.c) prints these; the label is the verbs name.
@pytest.mark.parametrize(
    ("text", "node_type"),
    [
        ("1: CA", "CA"),
        ("2: switch", "Switch"),
        ("3: router", "Router"),
        ("4: RNIC", "RNIC"),
        ("5: usNIC", "USNIC"),
        ("6: usNIC UDP", "USNIC_UDP"),
        ("7: unspecified", "UNSPECIFIED"),
    ],
)
def test_node_type_label_is_the_verbs_name_whatever_the_kernel_prints(
    captured_copy: Callable[[str], Path], text: str, node_type: str
) -> None:
    root = captured_copy("leptonai-gpud-h100")
    (root / "class/infiniband/mlx5_0/node_type").write_text(f"{text}\n")  # the capture has none
    info = [dict(labels) for (name, labels) in samples(scrape(root)) if name == "rdma_device_info"]
    assert {i["node_type"] for i in info if i["device"] == "mlx5_0"} == {node_type}


@pytest.mark.parametrize(
    ("text", "node_type", "counted"),
    [
        ("9: <unknown>", "<unknown>", 0),  # node_type_show()'s default case
        ("9: " + "X" * 200, "", 1),  # a name no kernel prints, as a label it would be pages long
        ("9: \x1b[31mX", "", 1),  # control characters
        ("1: \x1b[31mX", "CA", 0),  # a known number: its verbs name, whatever text follows
    ],
)
def test_a_node_type_name_that_no_label_can_hold_is_counted(
    captured_copy: Callable[[str], Path], text: str, node_type: str, counted: int
) -> None:
    """A type number the kernel does not know was exported with its file's text as the label, of any
    length and with control characters, and nothing counted (fuzz review)."""
    root = captured_copy("leptonai-gpud-h100")
    (root / "class/infiniband/mlx5_0/node_type").write_text(f"{text}\n")
    values = samples(scrape(root))
    assert values.get(read_errors_key("mlx5_0", "malformed", collector="inventory"), 0) == counted
    info = [dict(labels) for (name, labels) in values if name == "rdma_device_info"]
    assert {i["node_type"] for i in info if i["device"] == "mlx5_0"} == {node_type}


def test_an_empty_node_type_is_counted(captured_copy: Callable[[str], Path]) -> None:
    # node_type_show() always prints a type: an empty file is a fault, counted as any other (parse review).
    root = captured_copy("leptonai-gpud-h100")
    (root / "class/infiniband/mlx5_0/node_type").write_text("")
    values = samples(scrape(root))
    assert values[read_errors_key("mlx5_0", "malformed", collector="inventory")] == 1
    info = [dict(labels) for (name, labels) in values if name == "rdma_device_info"]
    assert {i["node_type"] for i in info if i["device"] == "mlx5_0"} == {""}


NODE_EXPORTER = SYSFS_FIXTURES / "prometheus-node_exporter" / "sys"
MLX4_PORT1 = (("device", "mlx4_0"), ("port", "1"))


def test_legacy_counters_ext_give_the_main_counters_their_64_bit_value(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # Pre-4.5 kernels (mlx4): counters/port_xmit_data is the 32-bit PortCounters field, which stops at
    # 2^32-1 words (16 GiB); counters_ext/port_xmit_data_64 is the same field in 64 bits. Rules and
    # dashboards read rdma_port_transmit_data_bytes_total, so that is where the 64-bit value must go.
    root = captured_copy("prometheus-node_exporter")
    port = root / "class/infiniband/mlx4_0/ports/1"
    (port / "counters/port_xmit_data").write_text("4294967295\n")  # stuck at its 32-bit maximum
    (port / "counters_ext/port_xmit_data_64").write_text("1099511627776\n")
    values = samples(scrape(root))
    assert values[("rdma_port_transmit_data_bytes_total", MLX4_PORT1)] == 4 * 2**40
    assert values[("rdma_port_transmit_packets_total", MLX4_PORT1)] == 0  # counters_ext/port_xmit_packets_64
    assert values[("rdma_port_receive_unicast_packets_total", MLX4_PORT1)] == 61148
    # A 32-bit file that the 64-bit one supersedes gets no saturation verdict (it would be a false ticket).
    saturated = {dict(labels)["counter"] for (name, labels) in values
                 if name == "rdma_port_pma_saturated" and ("device", "mlx4_0") in labels}
    assert not saturated & {"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets"}
    assert values[("rdma_port_pma_saturated", (("counter", "port_xmit_wait"), *MLX4_PORT1))] == 1  # really 32 bit
    # One value per counter: no second family with the same numbers.
    assert not [name for name, _ in values if name.startswith("rdma_port_ext_")]


def test_legacy_superseded_counter_file_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import record_reads

    opened = record_reads(monkeypatch)
    scrape(NODE_EXPORTER)
    read = {os.path.relpath(path, NODE_EXPORTER / "class/infiniband/mlx4_0/ports/1") for path in opened}
    assert "counters_ext/port_rcv_packets_64" in read
    assert "counters/port_rcv_packets" not in read
    assert "counters/port_xmit_wait" in read


def test_unreadable_64_bit_counter_costs_its_value_not_a_fallback(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # Once the 64-bit file has answered, the series keeps that one source: falling back to the 32-bit
    # file for a scrape would make it jump.
    from dataclasses import replace

    from prometheus_client import generate_latest

    from rdma_exporter.config import Config
    from rdma_exporter.daemon import build_collector, build_registry

    root = captured_copy("prometheus-node_exporter")
    registry = build_registry(build_collector(replace(Config(), sysfs=root)))
    assert samples(generate_latest(registry).decode())[("rdma_port_receive_data_bytes_total", MLX4_PORT1)] == (
        4 * 4631917
    )
    (root / "class/infiniband/mlx4_0/ports/1/counters_ext/port_rcv_data_64").write_text("garbage\n")
    values = samples(generate_latest(registry).decode())
    assert ("rdma_port_receive_data_bytes_total", MLX4_PORT1) not in values
    assert values[("rdma_port_transmit_data_bytes_total", MLX4_PORT1)] == 4 * 3733440
    assert values[read_errors_key("mlx4_0", "malformed")] == 1


def test_a_64_bit_file_that_answered_stays_chosen_when_a_static_re_read_meets_a_failed_query(
    captured_copy, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    # Any failed PMA query reads EINVAL, the answer of an HCA without extended counters. When one came in
    # the static re-read (a uevent, the periodic resync), the 32-bit twin was chosen until the next re-read:
    # the throughput counter fell to the stuck 32-bit value (a false reset, then a false spike) and a
    # saturation ticket opened for a file not otherwise read. Found by the counter review.
    root = captured_copy("prometheus-node_exporter")
    port = root / "class/infiniband/mlx4_0/ports/1"
    (port / "counters/port_xmit_data").write_text("4294967295\n")
    (port / "counters_ext/port_xmit_data_64").write_text("1099511627776\n")
    collector = build_collector(replace(Config(), sysfs=root))
    saturated = ("rdma_port_pma_saturated", (("counter", "port_xmit_data"), *MLX4_PORT1))
    assert _scrape(collector)[("rdma_port_transmit_data_bytes_total", MLX4_PORT1)] == 4 * 2**40
    refusing = RefusingReads(monkeypatch, refused={"mlx4_0/ports/1/counters_ext/port_xmit_data_64"})
    collector.inventory.invalidate()
    values = _scrape(collector)
    assert ("rdma_port_transmit_data_bytes_total", MLX4_PORT1) not in values  # a fault for this scrape
    assert values[read_errors_key("mlx4_0", "io")] == 1
    assert saturated not in values
    refusing.refused.clear()
    (port / "counters_ext/port_xmit_data_64").write_text("1099511727776\n")
    values = _scrape(collector)  # static info cached from the re-read above
    assert values[("rdma_port_transmit_data_bytes_total", MLX4_PORT1)] == 4 * 1099511727776
    assert saturated not in values


def test_64_bit_file_that_does_not_answer_leaves_the_32_bit_counter(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # An HCA without extended counters may list counters_ext/ and fail every read: the 32-bit counters/
    # value is then all there is, and it is exported (and watched for saturation) as before.
    root = captured_copy("prometheus-node_exporter")
    port = root / "class/infiniband/mlx4_0/ports/1"
    (port / "counters_ext/port_rcv_data_64").write_text("garbage\n")
    (port / "counters/port_rcv_data").write_text("1000\n")
    values = samples(scrape(root))
    assert values[("rdma_port_receive_data_bytes_total", MLX4_PORT1)] == 4000
    assert values[("rdma_port_pma_saturated", (("counter", "port_rcv_data"), *MLX4_PORT1))] == 0
    assert values[("rdma_port_transmit_data_bytes_total", MLX4_PORT1)] == 4 * 3733440  # its twin answered
    assert values[read_errors_key("mlx4_0", "malformed", collector="inventory")] == 1


def test_64_bit_files_failing_with_einval_are_not_errors(captured_copy, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # An HCA without extended counters lists counters_ext/ and fails each read with EINVAL: the 32-bit
    # counters/ value is then the counter, and that is a fact about the HCA, not a read error that
    # RdmaExporterReadErrors fires for and that has the static info read again every minute.
    # (infiniband mutation review: counting EINVAL there passed every test.) A copy of the capture: the
    # process-wide reads remember the files of the capture itself answering in earlier tests.
    root = captured_copy("prometheus-node_exporter")
    RefusingReads(monkeypatch, errno.EINVAL, {"counters_ext/port_rcv_data_64"})
    values = samples(scrape(root))
    assert not any(name == "rdma_exporter_file_read_errors_total" and ("device", "mlx4_0") in labels
                   for name, labels in values)
    rcv_data = int((root / "class/infiniband/mlx4_0/ports/1/counters/port_rcv_data").read_text())
    assert values[("rdma_port_receive_data_bytes_total", MLX4_PORT1)] == 4 * rcv_data
    assert values[("rdma_port_pma_saturated", (("counter", "port_rcv_data"), *MLX4_PORT1))] == 0
    assert values[("rdma_port_transmit_data_bytes_total", MLX4_PORT1)] == 4 * 3733440  # its twin answered


def _sample_collector(tmp_path: Path) -> RdmaCollector:
    return build_collector(replace(Config(), sysfs=build_tree(tmp_path / "t", SAMPLE_SPEC).resolve()))


def _scrape(collector: RdmaCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return samples(collector.gather().render_text().decode())


def test_counters_a_port_refuses_from_the_start_are_unsupported_and_read_once_a_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The "limited" PFs of HGX B200/B300 boards refuse every PMA counter (EINVAL, and a kernel log line
    # per refused firmware command); a ConnectX-7 port in switching mode refuses VL15_dropped. Read every
    # scrape, each was an `io` error for ever (RdmaExporterReadErrors fired, pointing at firmware resets)
    # and a failed firmware command every 15 s. The static info reads no counter: a hung firmware must
    # not keep the device's ports unknown.
    now = [1000.0]
    monkeypatch.setattr(reader_module, "refusal_clock", lambda: now[0])
    collector = _sample_collector(tmp_path)
    port = collector.inventory.sys_root / CLASS_DIR / "mlx5_0/ports/1"
    counters = sorted(p.name for p in (port / "counters").iterdir())
    refusing = RefusingReads(monkeypatch)
    refusing.refused = {f"mlx5_0/ports/1/counters/{name}" for name in counters}
    refusing.refused.add("mlx5_0/ports/1/hw_counters/out_of_sequence")
    unsupported = read_errors_key("mlx5_0", "unsupported")
    for _ in range(3):
        values = _scrape(collector)
        now[0] += 15.0
        assert ("rdma_port_symbol_errors_total", MLX5_0) not in values
        assert ("rdma_port_hw_out_of_sequence_total", MLX5_0) not in values
        assert values[("rdma_port_state_id", MLX5_0)] == 4  # the rest of the port is there
        assert values[("rdma_port_hw_out_of_buffer_total", MLX5_0)] >= 0
        assert values[("rdma_port_symbol_errors_total", (("device", "mlx5_1"), ("port", "1")))] >= 0
        # Counted once, not again on every scrape, and never as io.
        assert values[unsupported] == len(counters) + 1
        assert not [k for k in values if k[0] == "rdma_exporter_file_read_errors_total"
                    and ("reason", "io") in k[1]]  # fmt: skip
    assert set(refusing.attempts.values()) == {1}
    # Tried again a minute after the refusal (now at +45 s: not yet), and back once the port answers (a
    # firmware update, or a refusal that was transient).
    now[0] = 1000.0 + 59.9
    assert _scrape(collector)[unsupported] == len(counters) + 1
    now[0] = 1000.0 + 60.0
    assert _scrape(collector)[unsupported] == 2 * (len(counters) + 1)
    assert set(refusing.attempts.values()) == {2}
    refusing.refused.clear()
    now[0] += 60.0
    values = _scrape(collector)
    assert values[("rdma_port_symbol_errors_total", MLX5_0)] >= 0
    assert values[("rdma_port_hw_out_of_sequence_total", MLX5_0)] >= 0
    assert values[unsupported] == 2 * (len(counters) + 1)


def test_a_counter_that_answered_and_now_refuses_stays_an_io_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # EINVAL is also what a PMA query that fails in a port that worked gives: that is a fault to count on
    # every scrape, even after the static info is read again (a uevent, the periodic resync).
    collector = _sample_collector(tmp_path)
    refusing = RefusingReads(monkeypatch)
    assert _scrape(collector)[("rdma_port_symbol_errors_total", MLX5_0)] >= 0
    refusing.refused = {"mlx5_0/ports/1/counters/symbol_error", "mlx5_0/ports/1/hw_counters/out_of_sequence"}
    io = read_errors_key("mlx5_0", "io")
    assert _scrape(collector)[io] == 2
    for scrape_number in (2, 3):
        collector.inventory.invalidate()
        values = _scrape(collector)
        assert values[io] == 2 * scrape_number
        assert read_errors_key("mlx5_0", "unsupported") not in values
        assert ("rdma_port_symbol_errors_total", MLX5_0) not in values


def test_a_counter_that_answered_and_now_says_no_pma_is_an_io_error_read_again(tmp_path: Path) -> None:
    # Kernels before 4.20 print "N/A (no PMA)" for any failed PMA query, not only without a PMA: from a
    # file that has given values, one such read hid the counter for a minute as `unsupported` (exposition
    # review). It is a fault, counted at every read, and the value is back at the next scrape.
    collector = _sample_collector(tmp_path)
    counter = collector.inventory.sys_root / CLASS_DIR / "mlx5_0/ports/1/counters/symbol_error"
    assert _scrape(collector)[("rdma_port_symbol_errors_total", MLX5_0)] >= 0
    good = counter.read_text()
    counter.write_text("N/A (no PMA)\n")
    io = read_errors_key("mlx5_0", "io")
    for scrape_number in (1, 2):
        values = _scrape(collector)
        assert values[io] == scrape_number
        assert read_errors_key("mlx5_0", "unsupported") not in values
        assert ("rdma_port_symbol_errors_total", MLX5_0) not in values
    counter.write_text(good)
    assert _scrape(collector)[("rdma_port_symbol_errors_total", MLX5_0)] == int(good)


def test_32_bit_counters_beside_a_silent_counters_ext_are_watched_for_saturation(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # counters_ext/ is listed but none of its files answers: counters/ is still the 32-bit PortCounters,
    # and a data counter stuck at 2^32-1 hides all traffic from then on. Found by review.
    root = captured_copy("prometheus-node_exporter")
    port = root / "class/infiniband/mlx4_0/ports/1"
    for ext in (port / "counters_ext").iterdir():
        ext.write_text("N/A (no PMA)\n")
    (port / "counters/port_xmit_data").write_text("4294967295\n")
    values = samples(scrape(root))
    assert values[("rdma_port_transmit_data_bytes_total", MLX4_PORT1)] == 4 * 4294967295
    assert values[("rdma_port_pma_saturated", (("counter", "port_xmit_data"), *MLX4_PORT1))] == 1
    assert values[("rdma_port_pma_saturated", (("counter", "port_rcv_data"), *MLX4_PORT1))] == 0


def test_omni_path_data_counters_count_8_byte_flits() -> None:
    # hfi1 answers the IB PortCountersExtended query with its OPA flit counters (8 bytes each), where
    # the IB PMA counts 4-octet words. Found by review.
    values = samples(scrape(SYSFS_FIXTURES / "prometheus-procfs" / "sys"))
    port = (("device", "hfi1_0"), ("port", "1"))
    assert values[("rdma_port_transmit_data_bytes_total", port)] == 8 * 273558326543
    assert values[("rdma_port_transmit_data_bytes_total", (("device", "mlx4_0"), ("port", "1")))] == 4 * 26509113295


def test_omni_path_counters_it_does_not_keep_are_not_exported(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # hfi1 lists symbol_error and VL15_dropped but answers a constant 0 (kernel commit b8d114ebb6fb): a 0
    # exported would read as a clean link. Not read, so no read error either. Found by the metric-facts audit.
    root = captured_copy("prometheus-procfs")
    counters = root / "class/infiniband/hfi1_0/ports/1/counters"
    (counters / "symbol_error").write_text("17\n")  # whatever the file says: hfi1 has no such counter
    values = samples(scrape(root))
    hfi1, mlx4 = (("device", "hfi1_0"), ("port", "1")), (("device", "mlx4_0"), ("port", "1"))
    for name in ("rdma_port_symbol_errors_total", "rdma_port_vl15_dropped_total"):
        assert (name, hfi1) not in values
        assert (name, mlx4) in values
    assert values[("rdma_port_link_downed_total", hfi1)] == 0  # the counters it keeps stay
    assert read_errors_key("hfi1_0", "malformed") not in values


def test_omni_path_in_its_real_layout_drops_the_counters_hfi1_never_fills(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # A real hfi1 port lists the unicast files: its PMA says it has IETF extended counters, and then answers
    # them with 0 (mad.c pma_get_ib_portcounters_ext); port_xmit_wait and port_rcv_switch_relay_errors are
    # 0 for ever too. The procfs capture lacks the unicast files. Found by the parsing review.
    root = captured_copy("prometheus-procfs")
    counters = root / "class/infiniband/hfi1_0/ports/1/counters"
    for name in ("unicast_xmit_packets", "unicast_rcv_packets", "multicast_xmit_packets", "multicast_rcv_packets"):
        (counters / name).write_text("0\n")
    (counters / "port_xmit_data").write_text(f"{2**32 - 1}\n")  # passing by in 64 bits, not stuck in 32
    values = samples(scrape(root))
    hfi1, mlx4 = (("device", "hfi1_0"), ("port", "1")), (("device", "mlx4_0"), ("port", "1"))
    for name in (
        "rdma_port_transmit_unicast_packets_total",
        "rdma_port_receive_unicast_packets_total",
        "rdma_port_transmit_wait_total",
        "rdma_port_receive_switch_relay_errors_total",
    ):
        assert (name, hfi1) not in values, name
    assert values[("rdma_port_transmit_wait_total", mlx4)] == 3599
    assert values[("rdma_port_transmit_multicast_packets_total", hfi1)] == 0  # hfi1 keeps multicast counts
    # The kernel's listing says 64 bit even though the unicast files are left out: no 32-bit verdict.
    assert values[("rdma_port_transmit_data_bytes_total", hfi1)] == 8 * (2**32 - 1)
    saturation = _saturation(values, "hfi1_0")
    assert "port_xmit_data" not in saturation and "port_xmit_wait" not in saturation
    assert saturation["link_downed"] == 0  # its narrow counters are still watched


BNXT_RE1 = (("device", "bnxt_re1"), ("port", "1"))


def test_bnxt_re_error_counters_wrap_and_are_never_called_saturated() -> None:
    # bnxt_re fills counters/ error fields by cutting its 64-bit counts to width ((u16)tx_discard_pkts): at
    # 65535 the next discard shows as 0, so the counter is not stuck and no saturation is reported.
    # Found by the parsing review.
    values = samples(scrape(SYSFS_FIXTURES / "built-multi-driver" / "sys"))
    assert values[("rdma_port_transmit_discards_total", BNXT_RE1)] == 65535
    assert values[("rdma_port_receive_constraint_errors_total", BNXT_RE1)] == 17
    assert _saturation(values, "bnxt_re1") == {}
    # Never filled by the driver: not exported as a reassuring 0.
    for name in (
        "rdma_port_transmit_wait_total",
        "rdma_port_vl15_dropped_total",
        "rdma_port_link_error_recovery_total",
        "rdma_port_receive_remote_physical_errors_total",
        "rdma_port_transmit_multicast_packets_total",
    ):
        assert (name, BNXT_RE1) not in values, name
    assert values[("rdma_port_transmit_data_bytes_total", BNXT_RE1)] == 4 * 930264821119


def test_bnxt_re_is_known_by_its_driver_and_only_by_it(tmp_path: Path) -> None:
    # Renamed (rdma_rename NAME_PCI), the function's bnxt_en driver link tells; a device named bnxt_re1
    # on an mlx5_core function is held to the spec: 65535 is a stuck 16-bit counter there.
    renamed_root = shutil.copytree(SYSFS_FIXTURES / "built-multi-driver" / "sys", tmp_path / "renamed")
    (renamed_root / "class/infiniband/bnxt_re1").rename(renamed_root / "class/infiniband/rocep5s0f0")
    on_a_function_bound_to(renamed_root, "rocep5s0f0", "bnxt_en")
    values = samples(scrape(renamed_root))
    renamed = (("device", "rocep5s0f0"), ("port", "1"))
    assert values[("rdma_port_transmit_discards_total", renamed)] == 65535
    assert _saturation(values, "rocep5s0f0") == {}
    assert ("rdma_port_transmit_wait_total", renamed) not in values

    other_root = shutil.copytree(SYSFS_FIXTURES / "built-multi-driver" / "sys", tmp_path / "other")
    on_a_function_bound_to(other_root, "bnxt_re1", "mlx5_core")
    values = samples(scrape(other_root))
    assert _saturation(values, "bnxt_re1")["port_xmit_discards"] == 1
    assert values[("rdma_port_transmit_wait_total", BNXT_RE1)] == 0


def test_names_that_normalise_alike_keep_one_file_when_it_fails(captured_copy) -> None:  # type: ignore[no-untyped-def]
    """`Rx Packets` (7) and `rx_packets` (9) are both rdma_port_hw_rx_packets_total: the first file of the
    listing owns the series. When that file fails a read, the series is missing for the scrape; taking
    the other file's value instead read 7 -> 9 -> 7, a reset and a false increase to Prometheus."""
    root = captured_copy("built-multi-driver")
    key = ("rdma_port_hw_rx_packets_total", (("device", "quirks0"), ("port", "2")))
    assert samples(scrape(root))[key] == 7
    (root / "class/infiniband/quirks0/ports/2/hw_counters/Rx Packets").write_text("garbage\n")
    values = samples(scrape(root))
    assert key not in values
    assert values[read_errors_key("quirks0", "malformed")] == 1


def test_driver_counter_names_pass_promtool_and_levels_are_gauges(captured_copy) -> None:  # type: ignore[no-untyped-def]
    """hw_counters names come from the driver: an abbreviated unit or a metric type's name in one failed
    `promtool check metrics`, and a CamelCase level (ActiveQPs) was typed counter. Found by review; so were
    levels named as only counters, histograms and summaries may be (active_qp_count, watermark_total)."""
    root = captured_copy("built-multi-driver")
    hw = root / "class/infiniband/bnxt_re0/ports/1/hw_counters"
    levels = {"active_qp_count": "6", "watermark_total": "7", "watermark_sum": "8", "active_bucket": "9"}
    for name, value in {"tx_wait_ms": "5", "rx_histogram_x": "3", "ActiveQPs": "12", "rx_total": "4", **levels}.items():
        (hw / name).write_text(f"{value}\n")
    text = scrape(root)
    promtool_check_metrics(text)
    values = samples(text)
    port = (("device", "bnxt_re0"), ("port", "1"))
    assert values[("rdma_port_hw_tx_wait_msec_total", port)] == 5
    assert values[("rdma_port_hw_rx_histogramx_x_total", port)] == 3
    assert values[("rdma_port_hw_active_q_ps", port)] == 12
    assert "# TYPE rdma_port_hw_active_q_ps gauge" in text
    assert values[("rdma_port_hw_rx_total", port)] == 4  # not rx_total_total, which the daemon's writer would serve
    for name, value in levels.items():
        assert values[(f"rdma_port_hw_{name}x", port)] == int(value)


# --- the PMA counter table, against the spec -------------------------------------------------------------
#
# Written out from the IBA's PortCounters (attribute 0x0012) and PortCountersExtended (0x001D) layouts as
# Linux exposes them (drivers/infiniband/core/sysfs.c, PORT_PMA_ATTR and PORT_PMA_ATTR_EXT), not from the
# exporter's table. counters/ file -> (bits with PortCountersExtended, bits beside a legacy counters_ext/).
# The first is the kernel's pma_group_ext, which every HCA with extended counters gets; PortXmitWait is in
# PortCounters only, so it stays 32 bit either way.
SPEC_COUNTERS: dict[str, tuple[int, int]] = {
    "symbol_error": (16, 16),
    "link_error_recovery": (8, 8),
    "link_downed": (8, 8),
    "port_rcv_errors": (16, 16),
    "port_rcv_remote_physical_errors": (16, 16),
    "port_rcv_switch_relay_errors": (16, 16),
    "port_xmit_discards": (16, 16),
    "port_xmit_constraint_errors": (8, 8),
    "port_rcv_constraint_errors": (8, 8),
    "local_link_integrity_errors": (4, 4),
    "excessive_buffer_overrun_errors": (4, 4),
    "VL15_dropped": (16, 16),
    "port_xmit_data": (64, 32),
    "port_rcv_data": (64, 32),
    "port_xmit_packets": (64, 32),
    "port_rcv_packets": (64, 32),
    "port_xmit_wait": (32, 32),
    "unicast_xmit_packets": (64, 64),
    "unicast_rcv_packets": (64, 64),
    "multicast_xmit_packets": (64, 64),
    "multicast_rcv_packets": (64, 64),
}
# Legacy MLNX_OFED counters_ext/ file -> the counters/ file it holds in 64 bits.
SPEC_COUNTERS_EXT: dict[str, str] = {
    "port_xmit_data_64": "port_xmit_data",
    "port_rcv_data_64": "port_rcv_data",
    "port_xmit_packets_64": "port_xmit_packets",
    "port_rcv_packets_64": "port_rcv_packets",
    "port_unicast_xmit_packets": "unicast_xmit_packets",
    "port_unicast_rcv_packets": "unicast_rcv_packets",
    "port_multicast_xmit_packets": "multicast_xmit_packets",
    "port_multicast_rcv_packets": "multicast_rcv_packets",
}
# PortXmitData and PortRcvData count 4-octet words; hfi1 (Omni-Path) answers with 8-byte flits.
SPEC_DATA = frozenset({"port_xmit_data", "port_rcv_data", "port_xmit_data_64", "port_rcv_data_64"})
IB_WORD = 4
OPA_FLIT = 8


def test_every_pma_counter_has_the_spec_width_and_unit() -> None:
    # One table for every counter, so a width or unit that drifts (or a counter added without a width
    # checked against the spec) fails here, not in a saturation alert that never fires.
    assert sorted(PMA_COUNTERS) == sorted(SPEC_COUNTERS)
    assert sorted(PMA_COUNTERS_EXT) == sorted(SPEC_COUNTERS_EXT)
    got: dict[str, tuple[int, int, int, int, int]] = {}
    expected: dict[str, tuple[int, int, int, int, int]] = {}
    for file, (bits, legacy_bits) in SPEC_COUNTERS.items():
        ib, legacy, opa = (
            pma_counter(file, legacy=False),
            pma_counter(file, legacy=True),
            pma_counter(file, legacy=False, quirks=PMA_QUIRKS["hfi1"]),
        )
        assert ib is not None and legacy is not None and opa is not None, file
        got[file] = (ib.width, legacy.width, ib.scale, legacy.scale, opa.scale)
        data = file in SPEC_DATA
        expected[file] = (bits, legacy_bits, IB_WORD if data else 1, IB_WORD if data else 1, OPA_FLIT if data else 1)
    for file, counter in PMA_COUNTERS_EXT.items():
        got[file] = (counter.width, counter.width, counter.scale, counter.scale, counter.scale)
        scale = IB_WORD if file in SPEC_DATA else 1
        expected[file] = (64, 64, scale, scale, scale)
    assert got == expected
    # The 64-bit twin of a counter is the same counter: it replaces the 32-bit file (SUPERSEDED_BY_EXT).
    assert {twin: ext for ext, twin in SPEC_COUNTERS_EXT.items()} == SUPERSEDED_BY_EXT
    assert pma_counter("port_rcv_discards", legacy=False) is None  # not a PMA field: no width to judge


def _saturation(values: dict[tuple[str, tuple[tuple[str, str], ...]], float], device: str) -> dict[str, float]:
    """{counters/ file: rdma_port_pma_saturated} of port 1 of `device`."""
    return {
        dict(labels)["counter"]: value
        for (name, labels), value in values.items()
        if name == "rdma_port_pma_saturated" and dict(labels)["device"] == device and dict(labels)["port"] == "1"
    }


@pytest.mark.parametrize("legacy", [False, True], ids=["extended", "legacy-counters_ext"])
@pytest.mark.parametrize("below", [0, 1], ids=["at-max", "max-1"])
def test_every_narrow_counter_saturates_exactly_at_its_maximum(captured_copy, legacy: bool, below: int) -> None:  # type: ignore[no-untyped-def]
    # Every counters/ file at 2^bits - 1 (stuck: new events are hidden) or one below it (still counting).
    # 64-bit counters never saturate in practice and get no verdict. Beside a legacy counters_ext/ whose
    # files do not answer, the data and packet counters are the 32-bit PortCounters and are judged too.
    if legacy:
        root, device = captured_copy("prometheus-node_exporter"), "mlx4_0"
        for ext in (root / f"class/infiniband/{device}/ports/1/counters_ext").iterdir():
            ext.write_text("N/A (no PMA)\n")
    else:
        root, device = captured_copy("leptonai-gpud-h100"), "mlx5_0"
    counters = root / f"class/infiniband/{device}/ports/1/counters"
    for file, widths in SPEC_COUNTERS.items():
        (counters / file).write_text(f"{2 ** widths[legacy] - 1 - below}\n")
    values = samples(scrape(root))
    expected = {file: float(below == 0) for file, widths in SPEC_COUNTERS.items() if widths[legacy] < 64}
    assert _saturation(values, device) == expected


def test_sriov_virtual_functions_are_flagged_with_their_pf(tmp_path: Path) -> None:
    # A VF's PCI function has a `physfn` link to its PF (pci-sysfs.c); no golden tree has VFs, so dropping
    # the detection changed nothing there. Found by mutation review.
    from rdma_exporter.sample_tree import TreeSpec, build_tree

    root = build_tree(tmp_path / "t", TreeSpec(ib_hcas=1, roce_hcas=0, vfs_per_pf=2, degraded_pcie=()))
    values = samples(scrape(root))
    devices = ("mlx5_0", "mlx5_1", "mlx5_2")
    vf = {dev: values[("rdma_device_sriov_virtual_function", (("device", dev),))] for dev in devices}
    assert vf == {"mlx5_0": 0, "mlx5_1": 1, "mlx5_2": 1}
    assert values[("rdma_device_sriov_vfs", (("device", "mlx5_0"),))] == 2
    assert ("rdma_device_sriov_vfs", (("device", "mlx5_1"),)) not in values  # a VF has no VFs of its own
    pf_of = {
        dict(labels)["device"]: dict(labels)["pf_pci_address"] for name, labels in values if name == "rdma_device_info"
    }
    assert pf_of == {"mlx5_0": "", "mlx5_1": "0000:18:00.0", "mlx5_2": "0000:18:00.0"}


@pytest.mark.parametrize(("text", "lanes"), [("100 Gb/sec (4X GDR)", 4), ("12 Gb/sec (12X)", 12)])
def test_unknown_lane_speed_gives_no_speed_label(text: str, lanes: int) -> None:
    # rate_show() prints only the IB speed names (or none, for SDR on old kernels): any other word is not a
    # generation and must not become a free-form `speed` label value.
    rate = parse_rate(text)
    assert rate is not None
    assert rate.lanes == lanes
    assert rate.speed == ("SDR" if text.endswith("X)") else None)


def test_stray_entry_in_ports_costs_only_itself(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # ports/ holds port numbers only; anything else is counted and skipped, the real ports are still read.
    root = captured_copy("leptonai-gpud-h100")
    (root / "class/infiniband/mlx5_0/ports/lost+found").mkdir()
    (root / "class/infiniband/mlx5_0/ports/4294967295").mkdir()  # U32_MAX: the kernel's "no port"
    # A port's name that is no directory (fault review): a file, a dangling link.
    (root / "class/infiniband/mlx5_0/ports/4").write_text("")
    (root / "class/infiniband/mlx5_0/ports/3").symlink_to("nowhere")
    values = samples(scrape(root))
    assert values[("rdma_port_state_id", MLX5_0)] == 4
    assert values[("rdma_port_symbol_errors_total", MLX5_0)] == 0
    assert values[read_errors_key("mlx5_0", "malformed", collector="inventory")] == 4
    ports = {dict(ls)["port"] for name, ls in values if name == "rdma_port_info" and ("device", "mlx5_0") in ls}
    assert ports == {"1"}


def test_a_port_entry_with_a_leading_zero_is_not_the_port_again(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # The kernel names ports with %u: `01` beside `1` is a stray entry, not port 1 a second time, which
    # would export every series of the port twice (duplicate samples Prometheus drops).
    root = captured_copy("leptonai-gpud-h100")
    shutil.copytree(root / "class/infiniband/mlx5_0/ports/1", root / "class/infiniband/mlx5_0/ports/01", symlinks=True)
    text = scrape(root)
    assert text.count('rdma_port_state_id{device="mlx5_0",port="1"}') == 1
    values = samples(text)
    assert values[("rdma_port_state_id", MLX5_0)] == 4
    assert values[read_errors_key("mlx5_0", "malformed", collector="inventory")] == 1


def test_port_numbers_above_255_are_ports(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # mlx5 in switchdev mode gives its representor device one port per vport: with enough VFs or SFs
    # they pass 255 (port numbers are u32 since kernel 5.13). Such a port is read like any other.
    root = captured_copy("leptonai-gpud-h100")
    ports = root / "class/infiniband/mlx5_0/ports"
    for number in ("300", "4294967294"):  # and the last u32 short of U32_MAX (the kernel's "no port")
        shutil.copytree(ports / "1", ports / number, symlinks=True)
    values = samples(scrape(root))
    port_300 = (("device", "mlx5_0"), ("port", "300"))
    assert values[("rdma_port_state_id", port_300)] == values[("rdma_port_state_id", MLX5_0)] == 4
    assert values[("rdma_port_state_id", (("device", "mlx5_0"), ("port", "4294967294")))] == 4
    assert values[("rdma_port_symbol_errors_total", port_300)] == 0
    assert not [key for key in values if key[0] == "rdma_exporter_file_read_errors_total"]


@pytest.mark.parametrize(
    ("name", "gauge"),
    [
        ("active_qps", True),  # bnxt_re resource counts
        ("watermark_qps", True),  # bnxt_re high-water marks
        ("ActiveQPs", True),
        ("qp_wm", True),
        ("qp_active", True),  # hns_roce (outside mainline) resource counts and their high-water marks
        ("srq_active_max", True),
        ("qp_alloc", False),  # ... beside its event counts
        ("lifespan", True),
        ("rx_packets", False),
        ("inactive_timeouts", False),  # a count of events, only the prefix active_ is a level
        ("rx_wmark_drops", False),
    ],
)
def test_hw_counter_levels_are_gauges(name: str, gauge: bool) -> None:
    assert hw_counter_is_gauge(name) is gauge


def test_unknown_counters_ext_file_is_exported_generically(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # A legacy counters_ext/ file outside the PMA table is a driver extension: exported as is, like counters/.
    root = captured_copy("prometheus-node_exporter")
    (root / "class/infiniband/mlx4_0/ports/1/counters_ext/port_rcv_ecn_marked").write_text("42\n")
    values = samples(scrape(root))
    assert values[("rdma_port_counters_port_rcv_ecn_marked_total", MLX4_PORT1)] == 42
    assert values[("rdma_port_receive_unicast_packets_total", MLX4_PORT1)] == 61148  # the known ones unaffected


def test_port_no_subnet_manager_has_swept_reports_lid_zero(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # Until an SM sweeps the subnet an InfiniBand port sits in INIT and lid_show()/sm_lid_show() print
    # 0x0: the 0 sample is how a dashboard tells "no SM" from "no data". Exporting only non-zero LIDs
    # passed every test (mutation review).
    root = captured_copy("prometheus-node_exporter")
    port = root / "class/infiniband/mlx4_0/ports/1"
    (port / "state").write_text("2: INIT\n")
    (port / "lid").write_text("0x0\n")
    (port / "sm_lid").write_text("0x0\n")
    values = samples(scrape(root))
    assert values[("rdma_port_state_id", MLX4_PORT1)] == 2
    assert values[("rdma_port_lid", MLX4_PORT1)] == 0
    assert values[("rdma_port_sm_lid", MLX4_PORT1)] == 0
    # An assigned LID is read in the kernel's hex form.
    (port / "lid").write_text("0x1a\n")
    assert samples(scrape(root))[("rdma_port_lid", MLX4_PORT1)] == 26


def test_a_port_of_no_link_layer_has_no_lid(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # EFA's ports (link layer Unknown) have no subnet manager: their lid files read 0 and mean
    # nothing, two reads a port and scrape on nodes with 16 or 32 of them (parse review).
    root = captured_copy("built-multi-driver")
    port = root / "class/infiniband/efa_0/ports/1"
    (port / "lid").write_text("0x0\n")
    (port / "sm_lid").write_text("0x0\n")
    values = samples(scrape(root))
    assert ("rdma_port_state_id", (("device", "efa_0"), ("port", "1"))) in values
    lids = [key for key in values if key[0] in ("rdma_port_lid", "rdma_port_sm_lid")]
    assert not [key for key in lids if ("device", "efa_0") in key[1]], lids


@pytest.mark.parametrize(
    "content", ["26\n", "0o32\n", "0b11010\n", "0x0x1a\n", "0x0X1a\n", "0x 1a\n", "0x\n", "0x-1a\n", "0x1_a\n"]
)
def test_lid_not_in_the_kernels_hex_form_is_malformed(captured_copy, content: str) -> None:  # type: ignore[no-untyped-def]
    # lid_show() prints "0x%x". Read with int(x, 0), "26" was taken as LID 26 and "0o32" as an octal 26,
    # values no kernel prints; such a file is garbage, counted, and costs only the LID.
    root = captured_copy("prometheus-node_exporter")
    port = root / "class/infiniband/mlx4_0/ports/1"
    (port / "lid").write_text(content)
    (port / "sm_lid").write_text("0x1\n")
    values = samples(scrape(root))
    assert ("rdma_port_lid", MLX4_PORT1) not in values
    assert values[read_errors_key("mlx4_0", "malformed")] == 1
    assert values[("rdma_port_sm_lid", MLX4_PORT1)] == 1


def test_port_whose_link_layer_cannot_be_read_keeps_its_lids(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # Only a port known to be Ethernet (RoCE) has meaningless LIDs: an InfiniBand port whose link_layer
    # read failed still shows its LID, and the failure is counted. (infiniband mutation review: reading
    # LIDs only for link_layer "InfiniBand", or the state only with a link layer, passed every test.)
    root = captured_copy("prometheus-node_exporter")
    port = root / "class/infiniband/mlx4_0/ports/1"
    (port / "link_layer").write_bytes(b"\xff\n")
    (port / "lid").write_text("0x1a\n")
    values = samples(scrape(root))
    assert values[("rdma_port_lid", MLX4_PORT1)] == 26
    assert values[("rdma_port_state_id", MLX4_PORT1)] == 4  # and the rest of the port
    assert values[("rdma_port_info", tuple(sorted((*MLX4_PORT1, ("link_layer", "")))))] == 1
    assert values[read_errors_key("mlx4_0", "malformed", collector="inventory")] == 1


def test_a_port_whose_link_layer_cannot_be_read_takes_its_netdevs(tmp_path: Path) -> None:
    """A garbage link_layer (or one failed read at the static read, kept a minute): the RoCE port lost every
    ethtool series, RdmaRoceStatisticsUnknown's included, and gained LIDs of 0 (exposition review). Its
    netdev's type tells the link layer; the failure is still counted."""
    from rdma_exporter.sample_tree import TreeSpec, build_tree

    root = build_tree(tmp_path / "t", TreeSpec(ib_hcas=1, roce_hcas=1, degraded_pcie=()))
    ethtool = tmp_path / "t" / "ethtool"
    baseline = samples(scrape(root, ethtool_dir=ethtool))
    for device in ("mlx5_0", "mlx5_1"):
        (root / f"class/infiniband/{device}/ports/1/link_layer").write_text("xyz\n")
    values = samples(scrape(root, ethtool_dir=ethtool))
    assert values[read_errors_key("mlx5_0", "malformed", collector="inventory")] == 1
    assert values[read_errors_key("mlx5_1", "malformed", collector="inventory")] == 1
    layers = {dict(k[1])["device"]: dict(k[1])["link_layer"] for k in values if k[0] == "rdma_port_info"}
    assert layers == {"mlx5_0": "InfiniBand", "mlx5_1": "Ethernet"}
    ethtool_series = {k for k in baseline if k[0].startswith("rdma_ethtool_")}
    assert ethtool_series and ethtool_series <= values.keys()
    lids = {dict(k[1])["device"] for k in values if k[0] == "rdma_port_lid"}
    assert lids == {"mlx5_0"}
    # The netdev's type is the one its identity read: a garbage one is counted once, not once more here.
    (netdev,) = (root / "class/infiniband/mlx5_1/ports/1/gid_attrs/ndevs").glob("0")
    (root / "class/net" / netdev.read_text().strip() / "type").write_text("eth\n")
    values = samples(scrape(root, ethtool_dir=ethtool))
    assert values[read_errors_key("mlx5_1", "malformed", collector="inventory")] == 2
    layers = {dict(k[1])["device"]: dict(k[1])["link_layer"] for k in values if k[0] == "rdma_port_info"}
    assert layers == {"mlx5_0": "InfiniBand", "mlx5_1": ""}


def test_parse_state_bounds() -> None:
    # PortState and PortPhysicalState are small IB enums and node_type a u8 in the kernel: a number past
    # 255 is garbage, not a state.
    assert parse_state("255: X") == (255, "X")
    assert parse_state("256: X") is None
    assert parse_state("7: unspecified") == (7, "unspecified")
    assert parse_state("4:") == (4, "")  # no name printed: the exporter's table supplies it


def test_unpopulated_gid_entries_are_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # On a real kernel gid_attrs/types/N of an all-zero GID entry exists and its read fails with EINVAL:
    # the entry must be skipped on its GID alone, or every scrape counts one read error per empty entry.
    from rdma_exporter.sample_tree import build_tree, spec_for_devices

    root = build_tree(tmp_path / "t", spec_for_devices(1))
    port = root / "class/infiniband/mlx5_0/ports/1"
    gids = {p.name: p.read_text().strip() for p in (port / "gids").iterdir()}
    empty = sorted((i for i, gid in gids.items() if not gid.replace(":", "").strip("0")), key=int)
    assert empty  # the sample tree has unpopulated entries
    baseline = samples(scrape(root))
    (port / "gid_attrs/types" / empty[0]).write_text("IB/RoCE v1\n")
    RefusingReads(monkeypatch, errno.EINVAL, {f"gid_attrs/types/{empty[0]}"})
    values = samples(scrape(root))
    assert not any(name == "rdma_exporter_file_read_errors_total" for name, _ in values)
    gid_series = {k: v for k, v in values.items() if k[0] == "rdma_port_gids"}
    assert gid_series and gid_series == {k: v for k, v in baseline.items() if k[0] == "rdma_port_gids"}
    # The EINVAL above is absence whether or not the file is read: where the type does read (kernels that
    # print one for an empty entry), the zero GID must still count as no entry. (Mutation review: skipping
    # on the type read alone passed this test.)
    monkeypatch.undo()
    assert (port / "gid_attrs/types" / empty[0]).read_text() == "IB/RoCE v1\n"
    assert {k: v for k, v in samples(scrape(root)).items() if k[0] == "rdma_port_gids"} == gid_series


@pytest.mark.parametrize("emptied", ["gids", "gid_attrs/types"])
def test_an_empty_gid_or_gid_type_file_is_malformed(tmp_path: Path, emptied: str) -> None:
    # The kernel always prints a GID (all zeros when unpopulated) and a populated entry's type: an empty
    # file took a populated entry out of rdma_port_gids as if unpopulated, and no error said so (fuzz review).
    from rdma_exporter.sample_tree import build_tree, spec_for_devices

    root = build_tree(tmp_path / "t", spec_for_devices(1))
    port = root / "class/infiniband/mlx5_0/ports/1"
    populated = min((p.name for p in (port / "gids").iterdir() if p.read_text().replace(":", "").strip().strip("0")),
                    key=int)  # fmt: skip
    (port / emptied / populated).write_text("")
    values = samples(scrape(root))
    assert values.get(read_errors_key("mlx5_0", "malformed", "inventory")) == 1


def test_gid_attrs_of_a_4_18_kernel_are_absent_not_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Up to Linux 4.18 sysfs read gid_attrs through ib_query_gid(): an IB port's entries had no attributes
    # (EINVAL, populated ones too), and a RoCE port's unpopulated entries answered EAGAIN from the GID
    # cache. Neither is a broken file: counted, they were read errors on every static read of every port.
    from rdma_exporter.sample_tree import TreeSpec, build_tree

    root = build_tree(tmp_path / "t", TreeSpec(ib_hcas=1, roce_hcas=1, degraded_pcie=()))
    ib_port = root / "class/infiniband/mlx5_0/ports/1"
    roce_port = root / "class/infiniband/mlx5_1/ports/1"
    assert (roce_port / "link_layer").read_text().strip() == "Ethernet"
    baseline = samples(scrape(root))
    roce_gids = {k: v for k, v in baseline.items() if k[0] == "rdma_port_gids" and ("device", "mlx5_1") in k[1]}
    assert roce_gids
    # A RoCE port: an unpopulated entry's ndevs file exists and fails with EAGAIN.
    empty = max((p.name for p in (roce_port / "gids").iterdir()), key=int)
    (roce_port / "gid_attrs/ndevs" / empty).write_text("")
    RefusingReads(monkeypatch, errno.EAGAIN, {f"mlx5_1/ports/1/gid_attrs/ndevs/{empty}"})
    values = samples(scrape(root))
    assert not any(name == "rdma_exporter_file_read_errors_total" for name, _ in values)
    assert {k: v for k, v in values.items() if k[0] == "rdma_port_gids" and ("device", "mlx5_1") in k[1]} == roce_gids
    # An IB port: the populated entry 0's type fails with EINVAL.
    assert (ib_port / "gid_attrs/types/0").read_text().strip() == "IB/RoCE v1"
    RefusingReads(monkeypatch, errno.EINVAL, {"mlx5_0/ports/1/gid_attrs/types/0"})
    values = samples(scrape(root))
    assert not any(name == "rdma_exporter_file_read_errors_total" for name, _ in values)
    assert not any(k[0] == "rdma_port_gids" and ("device", "mlx5_0") in k[1] for k in values)
    assert values[("rdma_port_state_id", (("device", "mlx5_0"), ("port", "1")))] == 4


def test_an_empty_gid_entry_that_fails_with_eagain_is_empty_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4.17 and 4.18 answered gids/N of an unpopulated entry with the GID cache's EAGAIN; 4.19 went back to
    # the zero GID ("as before", sysfs.c show_port_gid). Up to 256 entries a port: counted, they swamped
    # the read errors.
    from rdma_exporter.sample_tree import build_tree, spec_for_devices

    root = build_tree(tmp_path / "t", spec_for_devices(1))
    port = root / "class/infiniband/mlx5_0/ports/1"
    empty = max((p.name for p in (port / "gids").iterdir()), key=int)
    assert not (port / "gids" / empty).read_text().replace(":", "").strip().strip("0")
    baseline = samples(scrape(root))
    RefusingReads(monkeypatch, errno.EAGAIN, {f"mlx5_0/ports/1/gids/{empty}"})
    values = samples(scrape(root))
    assert not any(name == "rdma_exporter_file_read_errors_total" for name, _ in values)
    assert {k: v for k, v in values.items() if k[0] == "rdma_port_gids"} == {
        k: v for k, v in baseline.items() if k[0] == "rdma_port_gids"
    }


def on_a_function_bound_to(root: Path, device: str, driver: str) -> None:
    """Give `device` a PCI function (0000:05:00.0) whose driver link names `driver`."""
    pci = "devices/pci0000:00/0000:05:00.0"
    (root / pci).mkdir(parents=True)
    (root / "bus/pci/drivers" / driver).mkdir(parents=True)
    symlink(root, f"{pci}/driver", f"bus/pci/drivers/{driver}")
    symlink(root, f"class/infiniband/{device}/device", pci)


def test_omni_path_is_known_by_its_driver_under_any_device_name(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # rdma-core's rdma_rename (NAME_PCI, NAME_GUID) renames hfi1_0 to e.g. ibp5s0: the flit unit must then
    # come from the PCI function's driver link, not from the name.
    root = captured_copy("prometheus-procfs")
    (root / "class/infiniband/hfi1_0").rename(root / "class/infiniband/ibp5s0")
    on_a_function_bound_to(root, "ibp5s0", "hfi1")
    values = samples(scrape(root))
    port = (("device", "ibp5s0"), ("port", "1"))
    assert values[("rdma_port_transmit_data_bytes_total", port)] == 8 * 273558326543
    info = next(dict(ls) for name, ls in values if name == "rdma_device_info" and ("device", "ibp5s0") in ls)
    assert (info["driver"], info["pci_address"]) == ("hfi1", "0000:05:00.0")


def test_a_device_named_hfi1_of_another_driver_counts_4_octet_words(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # The name decides the data unit only where no driver link tells: a device renamed hfi1_0 (`rdma dev
    # set ... name`) whose function is bound to mlx5_core counts IB words, not flits.
    root = captured_copy("prometheus-procfs")
    on_a_function_bound_to(root, "hfi1_0", "mlx5_core")
    values = samples(scrape(root))
    assert values[("rdma_port_transmit_data_bytes_total", (("device", "hfi1_0"), ("port", "1")))] == 4 * 273558326543


def test_pci_address_comes_from_a_device_link_to_a_pci_function(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # Behind an Intel VMD the PCI domain is wider than 4 digits (10000:01:00.0); a dangling link (the function
    # already gone in a hot-unplug) names no PCI function. (infiniband mutation review: a 4-digit-only
    # domain, and taking a dangling link's name as the address, passed every test.)
    root = captured_copy("prometheus-procfs")
    vmd = "devices/pci10000:00/10000:01:00.0"
    (root / vmd).mkdir(parents=True)
    symlink(root, "class/infiniband/mlx4_0/device", vmd)
    symlink(root, "class/infiniband/mlx5_0/device", "devices/pci0000:00/0000:05:00.0")  # never created
    values = samples(scrape(root))
    pci = {dict(ls)["device"]: dict(ls)["pci_address"] for name, ls in values if name == "rdma_device_info"}
    assert (pci["mlx4_0"], pci["mlx5_0"]) == ("10000:01:00.0", "")
    assert values[("rdma_device_sriov_virtual_function", (("device", "mlx4_0"),))] == 0
    assert ("rdma_device_sriov_virtual_function", (("device", "mlx5_0"),)) not in values
    assert values[("rdma_port_state_id", (("device", "mlx5_0"), ("port", "1")))] == 4  # the device is still read


def test_ports_are_in_numeric_order(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # mlx5 in switchdev mode gives one RDMA device a port per representor (ports/1..N, often past 9); the
    # directory listing sorts as text ("10" < "2"), the exposition follows port numbers.
    root = captured_copy("leptonai-gpud-h100")
    ports = root / "class/infiniband/mlx5_0/ports"
    for number in (2, 10):
        shutil.copytree(ports / "1", ports / str(number), symlinks=True)
    info = read_device_info(root, "mlx5_0", SysfsReader("mlx5_0", ReadErrors()))
    assert [p.number for p in info.ports] == [1, 2, 10]


def test_generic_counters_that_normalise_alike_give_one_series(captured_copy) -> None:  # type: ignore[no-untyped-def]
    # counters/ and counters_ext/ files outside the PMA table go under rdma_port_counters_<name>_total, as
    # hw_counters/ files go under rdma_port_hw_*: two files with one metric name must give one series (the
    # first file of the listing, as for hw_counters), not two samples with the same labels, which promtool
    # rejects and Prometheus drops as duplicates. Found by mutation review.
    root = captured_copy("prometheus-node_exporter")
    port = root / "class/infiniband/mlx4_0/ports/1"
    (port / "counters/Foo Bar").write_text("3\n")
    (port / "counters/foo_bar").write_text("4\n")
    (port / "counters/port_rcv_ecn").write_text("1\n")
    (port / "counters_ext/port_rcv_ecn").write_text("2\n")
    # The listing spans both directories: a counters_ext/ file can shadow, or be shadowed by, a counters/ one.
    (port / "counters/Baz Qux").write_text("5\n")
    (port / "counters_ext/baz_qux").write_text("6\n")
    text = scrape(root)
    series = [line.rsplit(" ", 1)[0] for line in text.splitlines() if line.startswith("rdma_port_counters_")]
    assert sorted(series) == sorted(set(series))
    values = samples(text)
    assert values[("rdma_port_counters_foo_bar_total", MLX4_PORT1)] == 3
    assert values[("rdma_port_counters_baz_qux_total", MLX4_PORT1)] == 5
    # The listing decides, not the files read this scrape: when the owner fails a read, its twin must
    # not take the series over (Prometheus would see a counter jump or reset).
    (port / "counters/Foo Bar").write_text("garbage\n")
    assert ("rdma_port_counters_foo_bar_total", MLX4_PORT1) not in samples(scrape(root))


# Levels among hw_counters, each beside a real count of the same driver. bnxt_re's db_fifo_register is
# readl() of the doorbell FIFO register in bnxt_re_copy_db_pacing_stats(), the FIFO's occupancy at that
# moment (drivers/infiniband/hw/bnxt_re/hw_counters.c, doorbell pacing, Linux 6.6 until 2025); hfi1's
# device-level DRIVER_CtxtsOpen is hfi1_stats.sps_ctxts, "number of contexts currently open", which
# file_ops.c decrements whenever a context is freed (hfi1/verbs.c and file_ops.c, Linux 5.x-6.x). Typed
# counter, each fall would read as a reset to rate() and increase(). mana_ib's port-level current_rate
# is the send rate the firmware's congestion control allows now (drivers/infiniband/hw/mana/counters.c),
# beside its count of rate increases.
@pytest.mark.parametrize(
    ("hw", "level", "count", "labels"),
    [
        ("class/infiniband/mana_0/ports/1/hw_counters", ("current_rate", "rdma_port_hw_current_rate"),
         ("rate_inc_events", "rdma_port_hw_rate_inc_events_total"), (("device", "mana_0"), ("port", "1"))),
        ("class/infiniband/bnxt_re0/ports/1/hw_counters", ("db_fifo_register", "rdma_port_hw_db_fifo_register"),
         ("pacing_alerts", "rdma_port_hw_pacing_alerts_total"), (("device", "bnxt_re0"), ("port", "1"))),
        ("class/infiniband/hfi1_0/hw_counters", ("DRIVER_CtxtsOpen", "rdma_device_hw_driver_ctxts_open"),
         ("DRIVER_KernIntr", "rdma_device_hw_driver_kern_intr_total"), (("device", "hfi1_0"),)),
    ],
    ids=["mana_ib current_rate", "bnxt_re db_fifo_register", "hfi1 DRIVER_CtxtsOpen"],
)  # fmt: skip
def test_levels_among_hw_counters_are_gauges(
    tmp_path: Path, hw: str, level: tuple[str, str], count: tuple[str, str], labels: tuple[tuple[str, str], ...]
) -> None:
    device = labels[0][1]
    write_files(
        tmp_path,
        {
            f"class/infiniband/{device}/ports/1/state": "4: ACTIVE\n",
            f"{hw}/{level[0]}": "37\n",
            f"{hw}/{count[0]}": "123456\n",
            f"{hw}/lifespan": "10\n",
        },
    )
    text = scrape(tmp_path)
    values = samples(text)
    assert f"# TYPE {level[1]} gauge" in text
    assert values[(level[1], labels)] == 37
    assert values[(count[1], labels)] == 123456
    # lifespan is in milliseconds: the driver's cache time of these values, in base units.
    scope = "port" if len(labels) == 2 else "device"
    assert values[(f"rdma_{scope}_hw_lifespan_seconds", labels)] == 0.01
