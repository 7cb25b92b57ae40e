"""Building blocks of the exposition layer.

Metrics are declared as `MetricSpec`s so that one table drives both the families built at each scrape
and the generated METRICS.md, which therefore cannot drift from the code.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..parse.infiniband import DeviceInfo
from ..parse.reader import SysfsReader

Kind = Literal["counter", "gauge", "info"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family. `name` is the exposed name (counters end in `_total`, info metrics in `_info`)."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.kind == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"counter {self.name} must end in _total")
        if self.kind == "info" and not self.name.endswith("_info"):
            raise ValueError(f"info metric {self.name} must end in _info")

    def family(self) -> Metric:
        if self.kind == "counter":
            # prometheus_client appends _total itself.
            return CounterMetricFamily(self.name[: -len("_total")], self.help, labels=self.labels)
        return GaugeMetricFamily(self.name, self.help, labels=self.labels)


@dataclass(frozen=True, slots=True)
class DynamicMetricSpec:
    """A family of metrics whose names come from the hardware (e.g. one per driver hw_counters file).

    Only used to document the pattern; the concrete `MetricSpec`s are made at scrape time.
    """

    pattern: str
    kind: Kind
    help: str
    labels: tuple[str, ...]


@dataclass
class FamilySet:
    """The metric families of one scrape, created on first use so that empty ones are not exposed."""

    _families: dict[str, Metric] = field(default_factory=dict)
    _specs: dict[str, MetricSpec] = field(default_factory=dict)

    def add(self, spec: MetricSpec, labels: Sequence[str], value: float) -> None:
        family = self._families.get(spec.name)
        if family is None:
            family = self._families[spec.name] = spec.family()
            self._specs[spec.name] = spec
        family.add_metric(list(labels), value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())

    def __len__(self) -> int:
        return len(self._families)


@dataclass(frozen=True, slots=True)
class ScrapeContext:
    """What a source may consult besides the device: paths and its own settings."""

    sys_root: Path
    settings: Mapping[str, Any]


class Source(Protocol):
    """A collector of one data source, split into per-device I/O and pure exposition.

    `read` does all file and ioctl access for one RDMA device and returns a plain value; the scrape
    engine may run it in a worker thread with a deadline. `expose` turns the values of every device
    that answered into metric families and must not do I/O.

    A source whose `read` only looks at the cached `DeviceInfo` sets `io_free = True`: the engine then
    evaluates it for every listed device with known static info, even one whose reads are stuck, so that
    (for example) a device in a firmware stall is still reported present.
    """

    name: str
    specs: tuple[MetricSpec, ...]
    dynamic_specs: tuple[DynamicMetricSpec, ...]

    def read(self, ctx: ScrapeContext, device: DeviceInfo, reader: SysfsReader) -> Any: ...

    def expose(self, results: Mapping[str, Any], out: FamilySet) -> None: ...


def label(value: str | int | None) -> str:
    """Label values are strings; an unknown attribute is the empty string, as Prometheus treats absence."""
    return "" if value is None else str(value)
