"""Parse the temperature sensors a NIC driver registers for its PCI function (the hwmon class).

Pure functions over a PCI function directory returning typed dataclasses; no Prometheus imports.

mlx5 (Linux 6.6 and later, drivers/net/ethernet/mellanox/mlx5/core/hwmon.c) registers one hwmon device
named `mlx5` under each PCI function, at `<function>/hwmon/hwmon<N>/`: a `temp<N>_*` channel for each
ASIC sensor the firmware lists (labelled `asic`) and, when the cage holds a module with a thermal
sensor at probe time, one for the module (`Module0`, `Module1`). A ConnectX that overheats is shut down
by its firmware, and an optical module that runs hot drops its link: both look like a cable or switch
fault on the fabric unless the temperature was recorded. Other RDMA NICs' drivers (bnxt_en, ice)
register hwmon devices under their PCI functions the same way; every temp channel found there is read.

Each `temp<N>_input` read is a firmware register query (MTMP), as a `counters/` read is. The labels and
the critical threshold (the firmware's high threshold, `temp<N>_crit`) are read once with the device's
static info: mlx5 fixes its channels when the driver loads, and an ASIC's threshold does not change. A
module's threshold is the module's own, so a module swapped for another type keeps the old one until
the device's static info is read again (its next uevent, or the periodic resync). `temp<N>_highest`
(the maximum since the driver loaded) is not read: a second firmware query per sensor per scrape for
what the scraped series already shows within an interval, heat moving over minutes.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .reader import REASON_MALFORMED, SysfsReader, list_dir, parse_entry_number

_TEMP_INPUT: Final = re.compile(r"temp([1-9][0-9]{0,2})_input")
# hwmon values are signed millidegrees Celsius; ten digits is more than any sensor prints.
_MILLIDEGREES: Final = re.compile(r"-?[0-9]{1,10}")
# Firmware names its sensors in 8 bytes (mlx5's MTMP sensor_name); other drivers use short words.
# Anything else is not a name a driver gave, and would be a label value.
_SENSOR_NAME: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.\- ]{0,30}[A-Za-z0-9_.\-])?")
# No chip a NIC carries reports outside this range: a value beyond it is a firmware or driver fault
# (mlx5 turns an all-ones MTMP answer into 8191.875 degrees), not a temperature to alert on.
MIN_CELSIUS: Final = -60.0
MAX_CELSIUS: Final = 250.0
# A NIC has a handful of sensors; mlx5 at most 64 ASIC and platform ones and one module.
MAX_SENSORS: Final = 128
# mlx5's module channels: named by the firmware (Module0), or sensor<index> from MTMP's module index 64 on.
_MODULE_SENSOR: Final = re.compile(r"Module[0-9]+|sensor(?:6[4-9]|[7-9][0-9]|[1-9][0-9]{2})")


@dataclass(frozen=True, slots=True)
class TemperatureSensor:
    """One temperature channel: its name, where its reading is, and its critical threshold."""

    sensor: str  # the channel's label (asic, Module0), or temp<N> where the driver gives none
    input_path: str
    critical_celsius: float | None  # None where the driver has no threshold or the firmware sets none
    # A transceiver module's channel: mlx5 registers it only if the module read above 0 when the driver
    # loaded (mlx5_hwmon_is_module_mon_cap), so 0 is the firmware's answer for a cage whose module has
    # left since, or was swapped for one without a sensor (a passive copper cable).
    module: bool = False


@dataclass(frozen=True, slots=True)
class HwmonIdentity:
    """The temperature sensors of an RDMA device's PCI functions, found once with its static info."""

    sensors: tuple[TemperatureSensor, ...]


@dataclass(frozen=True, slots=True)
class SensorReading:
    sensor: str
    celsius: float | None  # None when this scrape's read failed
    critical_celsius: float | None


def parse_millidegrees(text: str) -> float | None:
    """`65000` -> 65.0; None for anything that is not a signed integer within MIN..MAX_CELSIUS."""
    if not _MILLIDEGREES.fullmatch(text):
        return None
    celsius = int(text) / 1000
    return celsius if MIN_CELSIUS <= celsius <= MAX_CELSIUS else None


# hwmon's "no value now" (a sensor that is not ready): no reading this scrape, and no error.
_NO_READING_ERRNOS: Final = frozenset({errno.ENODATA})


def _celsius(path: str, reader: SysfsReader, *, optional: bool = False) -> float | None:
    return reader.parsed(
        path, parse_millidegrees, "a temperature in millidegrees Celsius",
        optional=optional, absent_errnos=_NO_READING_ERRNOS,
    )


def _hwmon_dirs(pci_dir: Path, reader: SysfsReader) -> list[str]:
    """The function's hwmon<N> directories, by number (hwmon10 after hwmon9)."""
    base = os.fspath(pci_dir / "hwmon")
    numbered = []
    for entry in list_dir(base, reader):
        number = parse_entry_number(entry[len("hwmon") :]) if entry.startswith("hwmon") else None
        if number is not None:
            numbered.append((number, f"{base}/{entry}"))
    return [path for _, path in sorted(numbered)]


def read_hwmon_identity(pci_dirs: Sequence[Path], reader: SysfsReader) -> HwmonIdentity | None:
    """The temperature sensors registered for an RDMA device's PCI functions: its own, then those of the
    other functions its ports use (a RoCE LAG device sits on its first function; the second port's module
    is the second function's). None when there are none.

    Each function of a card reports the card's one ASIC: a name that an earlier function gave is that
    sensor again, and is skipped. Within one function a repeated name is a fault, counted."""
    sensors: list[TemperatureSensor] = []
    names: set[str] = set()
    for pci_dir in pci_dirs:
        own: set[str] = set()
        for hwmon_dir in _hwmon_dirs(pci_dir, reader):
            channels = sorted(
                int(match.group(1)) for match in map(_TEMP_INPUT.fullmatch, list_dir(hwmon_dir, reader)) if match
            )
            for channel in channels:
                stem = f"{hwmon_dir}/temp{channel}"
                label = reader.text(f"{stem}_label", optional=True)
                if label is not None and not _SENSOR_NAME.fullmatch(label):
                    reader.fail(REASON_MALFORMED, f"{stem}_label", f"not a sensor name: {label[:40]!r}")
                    label = None
                sensor = label or f"temp{channel}"
                if sensor in own or len(sensors) >= MAX_SENSORS:
                    # Two channels of one name would be one series written twice.
                    reader.fail(REASON_MALFORMED, f"{stem}_input", f"sensor {sensor!r} is a duplicate or one too many")
                    continue
                own.add(sensor)
                if sensor in names:
                    continue  # another function's view of the same chip
                names.add(sensor)
                critical = _celsius(f"{stem}_crit", reader, optional=True)
                # mlx5 reports a threshold of 0 where the firmware sets none.
                module = _MODULE_SENSOR.fullmatch(sensor) is not None
                sensors.append(TemperatureSensor(sensor, f"{stem}_input", critical or None, module))
    return HwmonIdentity(tuple(sensors)) if sensors else None


def read_temperatures(identity: HwmonIdentity, reader: SysfsReader) -> tuple[SensorReading, ...]:
    """This scrape's reading of every sensor. A sensor gone since the static read (the driver registered
    its hwmon device again, under a new number) marks the static info stale, to be found again."""
    readings = []
    for sensor in identity.sensors:
        celsius = _celsius(sensor.input_path, reader)
        if celsius is None and not os.path.exists(sensor.input_path):
            reader.static_stale = True
        elif celsius == 0 and sensor.module:
            celsius = None  # no module in the cage now, not a module at 0 degrees (TemperatureSensor)
        readings.append(SensorReading(sensor.sensor, celsius, sensor.critical_celsius))
    return tuple(readings)
