"""Exposition of the temperature sensors of each RDMA device's PCI functions: the ASIC and its modules.

Series carry `device` and `sensor` (the driver's name for the channel: `asic`, `Module0`). A device with
no hwmon device (a VF, software RDMA, a kernel before 6.6 for mlx5) has no series here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ..parse.hwmon import SensorReading, read_temperatures
from ..parse.infiniband import DeviceInfo
from ..parse.reader import SysfsReader
from .base import DynamicMetricSpec, FamilySet, MetricSpec, ScrapeContext

NAME: Final = "hwmon"
LABELS: Final = ("device", "sensor")

TEMPERATURE: Final = MetricSpec(
    "rdma_device_temperature_celsius",
    "gauge",
    "Temperature of a sensor of the device's PCI functions (a RoCE LAG device's: both of its card's), from "
    "the driver's hwmon devices: the ASIC (sensor asic) and, for mlx5, the transceiver module in a cage "
    "where the module has a sensor (Module0, Module1); mlx5 names a sensor the firmware leaves unnamed "
    "sensor<index>, modules from sensor64 on. Absent for a scrape whose read failed, and for a module "
    "that reads 0 (mlx5's answer for a cage whose module was removed or has no sensor since the driver loaded).",
    LABELS,
)
CRITICAL: Final = MetricSpec(
    "rdma_device_temperature_critical_celsius",
    "gauge",
    "The sensor's critical temperature as the hardware reports it (hwmon temp*_crit; for mlx5 the "
    "firmware's high threshold). Absent where none is set.",
    LABELS,
)


class HwmonSource:
    """Temperatures of every RDMA device's PCI functions."""

    name = NAME
    specs: tuple[MetricSpec, ...] = (TEMPERATURE, CRITICAL)
    dynamic_specs: tuple[DynamicMetricSpec, ...] = ()

    def read(self, ctx: ScrapeContext, device: DeviceInfo, reader: SysfsReader) -> tuple[SensorReading, ...]:
        # The sensors and their thresholds are static and cached in the device's info.
        return read_temperatures(device.hwmon, reader) if device.hwmon is not None else ()

    def expose(self, results: Mapping[str, tuple[SensorReading, ...] | None], out: FamilySet) -> None:
        for device in sorted(results):
            for reading in results[device] or ():
                labels = [device, reading.sensor]
                if reading.celsius is not None:
                    out.add(TEMPERATURE, labels, reading.celsius)
                if reading.critical_celsius is not None:
                    out.add(CRITICAL, labels, reading.critical_celsius)
