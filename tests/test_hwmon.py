"""Temperature sensors (hwmon) of an RDMA device's PCI function: parsing, faults and exposition.

The layout is the one mlx5's hwmon driver (Linux 6.6+) registers under each PCI function: `hwmon<N>/`
with `name` (mlx5), `temp<N>_label` (asic, Module0), `temp<N>_input`, `temp<N>_crit` and
`temp<N>_highest` in millidegrees Celsius, and a write-only `temp<N>_reset_history`.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from rdma_exporter.parse import reader as reader_module
from rdma_exporter.parse.hwmon import (
    _MODULE_SENSOR,
    HwmonIdentity,
    SensorReading,
    TemperatureSensor,
    parse_millidegrees,
    read_hwmon_identity,
    read_temperatures,
)
from rdma_exporter.parse.reader import REASON_IO, REASON_MALFORMED, REASON_MISSING, SysfsReader
from rdma_exporter.sample_tree import TreeSpec, build_tree

from conftest import promtool_check_metrics, samples, scrape, write_hwmon


def asic_and_module(pci: Path, number: int = 3) -> Path:
    return write_hwmon(
        pci,
        number,
        {
            1: {"label": "asic", "input": "61250", "crit": "105000", "highest": "66000"},
            2: {"label": "Module0", "input": "47000", "crit": "75000", "highest": "49000"},
        },
    )


def identity_of(pci: Path) -> tuple[HwmonIdentity | None, SysfsReader]:
    reader = SysfsReader("mlx5_0")
    return read_hwmon_identity([pci], reader), reader


@pytest.mark.parametrize(
    ("text", "celsius"),
    [("61250", 61.25), ("0", 0.0), ("-5000", -5.0), ("250000", 250.0), ("8191875", None), ("-60000", -60.0),
     ("-61000", None),
     ("", None), ("61.5", None), ("+61000", None), ("0x10", None), ("1" * 11, None), ("61000\n", None)],
)  # fmt: skip
def test_parse_millidegrees(text: str, celsius: float | None) -> None:
    assert parse_millidegrees(text) == celsius


@given(st.text(max_size=20))
def test_parse_millidegrees_never_raises(text: str) -> None:
    parse_millidegrees(text)


def test_asic_and_module_sensors_with_their_thresholds(tmp_path: Path) -> None:
    asic_and_module(tmp_path)
    identity, reader = identity_of(tmp_path)
    assert identity is not None and reader.errors.total() == 0
    assert [(s.sensor, s.critical_celsius) for s in identity.sensors] == [("asic", 105.0), ("Module0", 75.0)]
    readings = read_temperatures(identity, reader)
    assert readings == (SensorReading("asic", 61.25, 105.0), SensorReading("Module0", 47.0, 75.0))
    assert reader.errors.total() == 0 and not reader.static_stale


def test_a_module_that_reads_zero_is_no_reading_and_an_asic_at_zero_is_one(tmp_path: Path) -> None:
    # mlx5 registers a module's channel only if it read above 0 at probe: 0 later is an empty cage (the
    # optic pulled, a passive cable in its place), not a module at 0 degrees (parse review).
    directory = write_hwmon(
        tmp_path, 3,
        {1: {"label": "asic", "input": "0"}, 2: {"label": "Module0", "input": "0"},
         3: {"label": "sensor64", "input": "0"}, 4: {"label": "sensor2", "input": "0"}},
    )  # fmt: skip
    identity, reader = identity_of(tmp_path)
    assert identity is not None
    assert [s.module for s in identity.sensors] == [False, True, True, False]
    readings = read_temperatures(identity, reader)
    assert [r.celsius for r in readings] == [0.0, None, None, 0.0]
    assert reader.errors.total() == 0 and not reader.static_stale
    (directory / "temp2_input").write_text("46000\n")
    assert read_temperatures(identity, reader)[1].celsius == 46.0


def test_no_hwmon_directory_is_no_sensor_and_no_error(tmp_path: Path) -> None:
    identity, reader = identity_of(tmp_path)
    assert identity is None and reader.errors.total() == 0
    (tmp_path / "hwmon" / "hwmon0").mkdir(parents=True)  # a hwmon device without temperatures
    identity, reader = identity_of(tmp_path)
    assert identity is None and reader.errors.total() == 0


def test_thresholds_and_labels_are_read_once_and_only_inputs_each_scrape(tmp_path: Path) -> None:
    directory = asic_and_module(tmp_path)
    identity, reader = identity_of(tmp_path)
    assert identity is not None
    (directory / "temp1_crit").write_text("garbage\n")
    (directory / "temp1_label").write_text("changed\n")
    (directory / "temp1_input").write_text("70000\n")
    reader = SysfsReader("mlx5_0")
    assert read_temperatures(identity, reader)[0] == SensorReading("asic", 70.0, 105.0)
    assert reader.files_read == 2 and reader.errors.total() == 0


def test_hwmon_directories_in_numeric_order_and_unlabelled_channels(tmp_path: Path) -> None:
    # Two hwmon devices under one function: hwmon10 comes after hwmon9, not before it as a string.
    write_hwmon(tmp_path, 10, {1: {"input": "40000"}})
    write_hwmon(tmp_path, 9, {1: {"label": "asic", "input": "50000"}, 12: {"input": "30000"}, 2: {"input": "31000"}})
    (tmp_path / "hwmon" / "hwmon").mkdir()  # not a hwmon<N> name: ignored
    identity, reader = identity_of(tmp_path)
    assert identity is not None and reader.errors.total() == 0
    assert [s.sensor for s in identity.sensors] == ["asic", "temp2", "temp12", "temp1"]
    assert [s.input_path.rsplit("/", 2)[1] for s in identity.sensors] == ["hwmon9"] * 3 + ["hwmon10"]
    assert [s.critical_celsius for s in identity.sensors] == [None] * 4


def test_a_repeated_sensor_name_is_counted_and_read_once(tmp_path: Path) -> None:
    write_hwmon(tmp_path, 1, {1: {"label": "asic", "input": "50000"}, 2: {"label": "asic", "input": "51000"}})
    identity, reader = identity_of(tmp_path)
    assert identity is not None and [s.sensor for s in identity.sensors] == ["asic"]
    assert [(e[1], e[2].rsplit("/", 1)[1]) for e in errors(reader)] == [(REASON_MALFORMED, "temp2_input")]


@pytest.mark.parametrize("label", ["", "asic\x00", "a" * 40, "asic\nModule0", "\u00e4sic", "as\"ic"])
def test_a_label_that_is_no_sensor_name_falls_back_to_the_channel(tmp_path: Path, label: str) -> None:
    directory = write_hwmon(tmp_path, 1, {1: {"input": "50000"}})
    (directory / "temp1_label").write_bytes(label.encode() + b"\n")
    identity, reader = identity_of(tmp_path)
    assert identity is not None and [s.sensor for s in identity.sensors] == ["temp1"]
    assert [e[1] for e in errors(reader)] == [REASON_MALFORMED]


def test_a_zero_threshold_is_none_and_a_garbage_one_is_counted(tmp_path: Path) -> None:
    write_hwmon(tmp_path, 1, {1: {"label": "asic", "input": "50000", "crit": "0"},
                        2: {"label": "Module0", "input": "40000", "crit": "hot"}})  # fmt: skip
    identity, reader = identity_of(tmp_path)
    assert identity is not None
    assert [s.critical_celsius for s in identity.sensors] == [None, None]
    assert [e[2].rsplit("/", 1)[1] for e in errors(reader)] == ["temp2_crit"]


@pytest.mark.parametrize("value", ["8191875", "hot", "", "-1\n2"])
def test_a_reading_that_is_no_temperature_costs_that_reading(tmp_path: Path, value: str) -> None:
    directory = asic_and_module(tmp_path)
    identity, _ = identity_of(tmp_path)
    assert identity is not None
    (directory / "temp1_input").write_text(value)
    reader = SysfsReader("mlx5_0")
    assert read_temperatures(identity, reader) == (
        SensorReading("asic", None, 105.0), SensorReading("Module0", 47.0, 75.0)
    )
    assert [e[1] for e in errors(reader)] == [REASON_MALFORMED] and not reader.static_stale


@pytest.mark.parametrize(
    ("code", "reasons"), [(errno.ENODATA, []), (errno.EIO, [REASON_IO]), (errno.EAGAIN, [REASON_IO])]
)
def test_no_value_now_is_no_reading_and_a_failed_query_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, reasons: list[str]
) -> None:
    # ENODATA is hwmon's "no value now"; a firmware command that failed (EIO) or is busy is a read error.
    asic_and_module(tmp_path)
    identity, _ = identity_of(tmp_path)
    assert identity is not None
    real_read_once = reader_module._read_once

    def read_once(path: str | os.PathLike[str]) -> bytes:
        if os.path.basename(path) == "temp2_input":
            raise OSError(code, os.strerror(code))
        return real_read_once(path)

    monkeypatch.setattr(reader_module, "_read_once", read_once)
    reader = SysfsReader("mlx5_0")
    assert [r.celsius for r in read_temperatures(identity, reader)] == [61.25, None]
    assert [e[1] for e in errors(reader)] == reasons and not reader.static_stale


def test_a_hwmon_device_registered_again_marks_the_static_info_stale(tmp_path: Path) -> None:
    asic_and_module(tmp_path, 3)
    identity, _ = identity_of(tmp_path)
    assert identity is not None
    shutil.rmtree(tmp_path / "hwmon")
    asic_and_module(tmp_path, 7)
    reader = SysfsReader("mlx5_0")
    assert [r.celsius for r in read_temperatures(identity, reader)] == [None, None]
    assert reader.static_stale and {e[1] for e in errors(reader)} == {REASON_MISSING}
    again, _ = identity_of(tmp_path)
    assert again is not None and [s.input_path.rsplit("/", 2)[1] for s in again.sensors] == ["hwmon7"] * 2


def test_too_many_sensors_are_cut_off(tmp_path: Path) -> None:
    write_hwmon(tmp_path, 1, {n: {"input": "40000"} for n in range(1, 131)})
    identity, reader = identity_of(tmp_path)
    assert identity is not None and len(identity.sensors) == 128 and len(errors(reader)) == 2


def errors(reader: SysfsReader) -> list[tuple[str, str, str]]:
    """(device, reason, path) of each failure the reader recorded, in order."""
    return [(device, reason, where) for (device, reason), failed in reader.errors.failed.items() for where in failed]


# --- exposition -------------------------------------------------------------------------------------


def test_sample_tree_temperatures_are_exported_per_device_and_sensor(tmp_path: Path) -> None:
    sys_root = build_tree(tmp_path / "t", TreeSpec(ib_hcas=1, roce_hcas=2, degraded_pcie=(), down_ports=()))
    text = scrape(sys_root)
    promtool_check_metrics(text)
    got = {
        (name, dict(labels)["device"], dict(labels)["sensor"]): value
        for (name, labels), value in samples(text).items()
        if name.startswith("rdma_device_temperature")
    }
    # The InfiniBand HCA has an optical module with a sensor; the BlueField-3's ports use copper (DAC)
    # cables, which have none, so the driver registers no module channel for them.
    assert {key[1:] for key in got} == {("mlx5_0", "asic"), ("mlx5_0", "Module0"), ("mlx5_1", "asic"),
                                        ("mlx5_2", "asic")}  # fmt: skip
    assert got[("rdma_device_temperature_critical_celsius", "mlx5_0", "asic")] == 105.0
    assert got[("rdma_device_temperature_critical_celsius", "mlx5_0", "Module0")] == 75.0
    for (name, device, sensor), value in got.items():
        if name == "rdma_device_temperature_celsius":
            assert 30 <= value < got[("rdma_device_temperature_critical_celsius", device, sensor)] - 20


def test_a_failed_reading_drops_its_series_only_and_is_counted(tmp_path: Path) -> None:
    sys_root = build_tree(tmp_path / "t", TreeSpec(ib_hcas=1, roce_hcas=0, degraded_pcie=(), down_ports=()))
    pci = (sys_root / "class/infiniband/mlx5_0/device").resolve()
    (next((pci / "hwmon").iterdir()) / "temp2_input").write_text("8191875\n")
    got = samples(scrape(sys_root))
    assert (("rdma_device_temperature_celsius", (("device", "mlx5_0"), ("sensor", "Module0")))) not in got
    assert got[("rdma_device_temperature_critical_celsius", (("device", "mlx5_0"), ("sensor", "Module0")))] == 75
    assert ("rdma_device_temperature_celsius", (("device", "mlx5_0"), ("sensor", "asic"))) in got
    key = ("rdma_exporter_file_read_errors_total", (("collector", "hwmon"), ("device", "mlx5_0"),
                                                    ("reason", "malformed")))  # fmt: skip
    assert got[key] == 1


def test_the_collector_can_be_switched_off(tmp_path: Path) -> None:
    sys_root = build_tree(tmp_path / "t", TreeSpec(ib_hcas=1, roce_hcas=0, degraded_pcie=(), down_ports=()))
    text = scrape(sys_root, collectors={"hwmon": False})
    assert "rdma_device_temperature" not in text and 'collector="hwmon"' not in text


def test_identity_sensor_tuple_is_hashable_static_info() -> None:
    # DeviceInfo is a frozen dataclass compared on refresh: its hwmon part must compare by value.
    one = HwmonIdentity((TemperatureSensor("asic", "/x/temp1_input", 105.0),))
    assert one == HwmonIdentity((TemperatureSensor("asic", "/x/temp1_input", 105.0),)) and hash(one)


def test_a_hwmon_device_registered_again_is_found_by_the_next_scrape(tmp_path: Path) -> None:
    # The daemon's collector keeps each device's static info between scrapes; a sensor that is gone
    # (the driver registered its hwmon device again, under a new number) costs one scrape, not all.
    from dataclasses import replace

    from rdma_exporter.config import Config
    from rdma_exporter.daemon import build_collector

    sys_root = build_tree(tmp_path / "t", TreeSpec(ib_hcas=1, roce_hcas=0, degraded_pcie=(), down_ports=()))
    collector = build_collector(replace(Config(), sysfs=sys_root), rescan_each_scrape=False)

    def temperatures() -> dict[str, float]:
        text = collector.gather().render_text().decode()
        return {dict(labels)["sensor"]: value for (name, labels), value in samples(text).items()
                if name == "rdma_device_temperature_celsius"}  # fmt: skip

    assert temperatures() == {"asic": 52.0, "Module0": 41.0}
    hwmon_dir = next(((sys_root / "class/infiniband/mlx5_0/device").resolve() / "hwmon").iterdir())
    hwmon_dir.rename(hwmon_dir.with_name("hwmon12"))
    (hwmon_dir.with_name("hwmon12") / "temp1_input").write_text("57125\n")
    assert temperatures() == {}
    assert temperatures() == {"asic": 57.125, "Module0": 41.0}


@pytest.mark.parametrize(
    "text", ["0" * 6 + "61000", "1" * 5000, "-" + "0" * 4400 + "1"], ids=["zero-padded", "5000-digits", "4401-digits"]
)
def test_a_reading_of_more_digits_than_a_sensor_prints_is_no_temperature(text: str) -> None:
    # Ten digits bound what int() is given: it refuses over 4300 digits with a ValueError (a traceback,
    # not a malformed reading), and zero-padding is no number hwmon prints.
    assert parse_millidegrees(text) is None


def test_channels_numbered_zero_or_with_a_leading_zero_are_no_channels(tmp_path: Path) -> None:
    # hwmon numbers temp channels from 1 and prints no leading zero: temp01_input beside temp1_input would
    # be channel 1 read a second time, temp0_input no channel the driver made.
    directory = write_hwmon(tmp_path, 1, {1: {"label": "asic", "input": "50000"}})
    (directory / "temp0_input").write_text("40000\n")
    (directory / "temp01_input").write_text("41000\n")
    identity, reader = identity_of(tmp_path)
    assert identity is not None and reader.errors.total() == 0
    assert [(s.sensor, s.input_path.rsplit("/", 1)[1]) for s in identity.sensors] == [("asic", "temp1_input")]


def test_the_temperature_alert_and_the_parser_agree_on_which_sensors_are_modules() -> None:
    # RdmaDeviceTemperatureHigh warns 5 degrees below a module's threshold and 10 below a chip's; the parser
    # marks module sensors for the same reason. Only a dashboard test tied the alert's pattern to anything
    # (mutation review), so a change made in the alert and the dashboard together went unnoticed.
    rules = yaml.safe_load((Path(__file__).resolve().parent.parent / "rules/rdma-alerts.rules.yml").read_text())
    (warning,) = [
        rule for group in rules["groups"] for rule in group["rules"]
        if rule.get("alert") == "RdmaDeviceTemperatureHigh" and rule["labels"]["severity"] == "warning"
    ]  # fmt: skip
    patterns = set(re.findall(r'sensor[=!]~"([^"]+)"', warning["expr"]))
    assert len(patterns) == 1, patterns  # both branches, one for modules and one for the rest, use one pattern
    (pattern,) = patterns
    names = [f"{prefix}{n}" for prefix in ("sensor", "Module", "asic", "temp") for n in range(0, 1100)]
    names += ["Module", "sensor", "sensor064", "Module 1", "asic"]
    alert = re.compile(pattern)  # Prometheus anchors its regular expressions at both ends
    assert [n for n in names if alert.fullmatch(n)] == [n for n in names if _MODULE_SENSOR.fullmatch(n)]
