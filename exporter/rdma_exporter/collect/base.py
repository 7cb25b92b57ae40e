"""Building blocks of the exposition layer.

Metrics are declared as `MetricSpec`s so that one table drives both the families built at each scrape
and the generated METRICS.md, which therefore cannot drift from the code.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Final, Literal, Protocol

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

    def family(self) -> CounterMetricFamily | GaugeMetricFamily:
        if self.kind == "counter":
            # prometheus_client appends _total itself.
            return CounterMetricFamily(self.name[: -len("_total")], _printable(self.help), labels=self.labels)
        return GaugeMetricFamily(self.name, _printable(self.help), labels=self.labels)


@dataclass(frozen=True, slots=True)
class DynamicMetricSpec:
    """A family of metrics whose names come from the hardware (e.g. one per driver hw_counters file).

    Only used to document the pattern; the concrete `MetricSpec`s are made at scrape time.
    """

    pattern: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    # Labels a metric of the family adds for each dimension its name names (`stat_queue_...`: queue)
    optional_labels: tuple[str, ...] = ()


# `promtool check metrics` rejects some name tokens: non-base units ("bits": it wants bytes; "minutes",
# "milliseconds"...), unit abbreviations ("ms", "kb"...) and the name of any metric type. Names a driver
# makes up (ethtool extras, hw_counters files) are rewritten token by token.
_ABBREVIATIONS: Final = {
    "s": "secs", "sec": "secs", "ms": "msec", "us": "usec", "ns": "nsec", "b": "byte", "kb": "kbyte",
    "mb": "mbyte", "gb": "gbyte", "tb": "tbyte", "pb": "pbyte", "m": "mx", "h": "hx", "d": "dx",
}  # fmt: skip
_NON_BASE_UNITS: Final = frozenset(
    {"bits", "minutes", "hours", "days", "weeks", "kelvins", "fahrenheit", "rankine", "inches", "yards",
     "miles", "calories", "pounds", "ounces"}
)  # fmt: skip
_BASE_UNITS: Final = frozenset(
    {"amperes", "bytes", "celsius", "grams", "joules", "kelvin", "meters", "metres", "seconds", "volts"}
)
_UNIT_PREFIXES: Final = (
    "pico", "nano", "micro", "milli", "centi", "deci", "deca", "hecto", "kilo", "kibi", "mega", "mibi", "giga",
    "gibi", "tera", "tebi", "peta", "pebi",
)  # fmt: skip


def _non_base_unit(token: str) -> bool:
    """A unit promtool wants in another form: "bits", or any unit with an SI prefix ("kilobytes")."""
    units = _NON_BASE_UNITS | _BASE_UNITS
    return token in _NON_BASE_UNITS or any(token.startswith(p) and token[len(p) :] in units for p in _UNIT_PREFIXES)


_TYPE_WORDS: Final = frozenset({"counter", "gauge", "histogram", "summary"})
# Name endings promtool allows only on counters (_total), histograms (_bucket) and both (_count, _sum).
_RESERVED_SUFFIXES: Final = frozenset({"total", "count", "sum", "bucket"})


def lint_safe(key: str, kind: str) -> str:
    """`key` with every token promtool would reject rewritten (milliseconds -> millisecond, ms -> msec,
    histogram -> histogramx: promtool rejects any type's name, not only the family's own `kind`). A name
    that is not a counter's must not end in a suffix promtool keeps for other types (a driver's gauge
    `active_qp_count` -> active_qp_countx); a counter's gets `_total` after it."""
    tokens = []
    for token in key.split("_"):
        if token in _ABBREVIATIONS:
            token = _ABBREVIATIONS[token]
        elif _non_base_unit(token) or token == kind or token in _TYPE_WORDS:
            token = token[:-1] if token.endswith("s") else f"{token}x"
        tokens.append(token)
    if kind != "counter" and tokens[-1] in _RESERVED_SUFFIXES:
        tokens[-1] += "x"
    return "_".join(tokens)


class ShadowedFiles:
    """The files of a sorted listing whose metric name an earlier file of it already takes: two driver
    names that normalise alike (`Foo Bar`, `foo_bar`), the first of which is exported. Decided from the
    listing, not from the files a scrape read: a series must not switch files when the first one fails a
    read, which Prometheus would take for a counter reset. Remembered per listing."""

    MAX_LISTINGS: Final = 64

    def __init__(self, name_of: Callable[[str], str | None]) -> None:
        self._name_of = name_of  # a file's metric name; None for a file that is not exported
        self._cache: dict[tuple[str, ...], frozenset[str]] = {}

    def __call__(self, files: tuple[str, ...]) -> frozenset[str]:
        shadowed = self._cache.get(files)
        if shadowed is None:
            if len(self._cache) >= self.MAX_LISTINGS:
                self._cache.clear()  # a node has a handful of listings; more is churn, not a working set
            names: set[str] = set()
            later: set[str] = set()
            for file in files:
                name = self._name_of(file)
                if name in names:
                    later.add(file)
                elif name is not None:
                    names.add(name)
            shadowed = self._cache[files] = frozenset(later)
        return shadowed


def _printable(value: str) -> str:
    """A name the kernel holds as bytes that are not UTF-8 (a netdev or RDMA device renamed to any
    bytes, a driver's hw_counters file named in its family's help) comes from os.listdir with surrogate
    escapes, which UTF-8 cannot encode: show those bytes as \\xNN, as `ip link` does, instead of failing
    the whole answer. Label values and help texts alike; nearly all are ASCII, so test that first."""
    if value.isascii():
        return value
    try:
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no file name decodes to: keep it visible, escaped
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def _escape_help(text: str) -> str:
    return _printable(text).replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(value: str) -> str:
    # The same as prometheus_client's label value escaping; most values need none, so test first.
    value = _printable(value)
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _go_float(number: float) -> str:
    """`number` as Go's shortest formatting writes it, as Prometheus clients do.

    Not prometheus_client.utils.floatToGoString: that is no documented API, and before 0.26 it wrote
    5e10 as `5e+010`, so the exposition depended on the client installed (found by a version review).
    """
    if number != number:
        return "NaN"
    if number in (math.inf, -math.inf):
        return "+Inf" if number > 0 else "-Inf"
    text = repr(number)
    point = text.find(".")
    # repr writes positive numbers from 1e6 to 1e16 in full ("50000000000.0"); Go, from 1e6 up, as
    # "5e+10": the digits without the point and trailing zeros, a point after the first, and an exponent
    # of two digits or more. Negative ones stay as repr writes them, as prometheus_client's writer has it.
    if number <= 0 or point < 7:
        return text
    return _go_exponent(text[:point] + text[point + 1 :], point - 1)


def _go_exponent(digits: str, exponent: int) -> str:
    """Go's form of a positive number with these significant `digits` and this decimal `exponent`."""
    digits = digits.rstrip("0")
    mantissa = f"{digits[0]}.{digits[1:]}" if len(digits) > 1 else digits
    return f"{mantissa}e+{exponent:02d}"


_EXACT_INT_MAX: Final = 2**53  # every integer up to this one is a float exactly, and so has its own digits


def format_value(value: float) -> str:
    """A sample value exactly as prometheus_client's writer (0.26 and later) writes it.

    Most of our values are small integer counts: for those `repr(float(v))` is `v.0` (Python switches to
    an exponent at 1e16, Go-style formatting at 1e6 for positive values), so skip the float round trip.
    """
    if type(value) is int:
        if -1_000_000_000_000_000 < value < 1_000_000:
            return f"{value}.0"
        if 1_000_000 <= value <= _EXACT_INT_MAX:
            # A node's byte and packet counters: _go_float's answer from the integer's own digits, which are
            # repr's for every integer a float holds exactly (1.2 -> 0.7 us; PROFILE.md, Update 22).
            digits = str(value)
            return _go_exponent(digits, len(digits) - 1)
    return _go_float(float(value))


@lru_cache(maxsize=4096)
def _layout(spec: MetricSpec) -> tuple[str, tuple[tuple[int, str], ...]]:
    """The HELP/TYPE header of a spec and its label positions in name order (the order of the writer)."""
    kind = "counter" if spec.kind == "counter" else "gauge"  # info metrics are gauges in text 0.0.4
    header = f"# HELP {spec.name} {_escape_help(spec.help)}\n# TYPE {spec.name} {kind}\n"
    return header, tuple(sorted(enumerate(spec.labels), key=lambda pair: pair[1]))


def _label_text(order: tuple[tuple[int, str], ...], labels: tuple[str, ...]) -> str:
    """`{a="x",b="y"} ` for a sample's label values, in the writer's order; a bare space without labels."""
    if not order:
        return " "
    pairs = ",".join(f'{key}="{_escape_value(labels[i])}"' for i, key in order)
    return f"{{{pairs}}} "


# A family's chunk and what it was written from: its spec, a copy of its label rows and of its values.
_Written = tuple[MetricSpec, list[tuple[str, ...]], list[float], bytes]


class SeriesPrefixes:
    """The `{labels} ` text of each label set, kept from one render to the next.

    A device's series keep their labels between scrapes, so only values need formatting. The text is
    shared by every family with the same label names (the dozens of per-port counter families all use
    the same `{device,port}` texts), which keeps the cache at the number of distinct label sets, not
    series. Every PRUNE_EVERY-th render rebuilds the cache from the label sets it writes, so sets that
    are gone (a removed device) are dropped within that many scrapes; the renders in between only look
    texts up, with no per-series bookkeeping. Renders may overlap: texts are a pure function of their
    key, and the rebuilt cache is swapped in whole (atomic under the GIL).

    It also keeps each family's chunk of the last render with what it was written from, so a family
    whose samples did not change since (link states, speeds, PCIe and AER counts, error counters that
    stay at 0: most families between two scrapes, even on a busy node) costs a comparison of two lists
    instead of a line per series. Equal values give the same text, but for a zero's sign (0.0 == -0.0):
    a gauge flipping between them keeps the sign it was first written with until its family changes.
    """

    PRUNE_EVERY: Final = 32

    def __init__(self) -> None:
        self._by_layout: dict[tuple[tuple[int, str], ...], dict[tuple[str, ...], str]] = {}
        self._renders = 0
        # Family name -> what its chunk was written from at the last render, and the chunk: a family whose
        # spec, label values and values are all equal to those is written as the same bytes (FamilySet.
        # render_chunks). Replaced whole by each render, so families that are gone go with it.
        self._chunks: dict[str, _Written] = {}

    def __len__(self) -> int:
        return sum(len(texts) for texts in self._by_layout.values())


def _keep_texts(
    order: tuple[tuple[int, str], ...],
    label_rows: list[tuple[str, ...]],
    previous: dict[tuple[tuple[int, str], ...], dict[tuple[str, ...], str]],
    by_layout: dict[tuple[tuple[int, str], ...], dict[tuple[str, ...], str]],
) -> None:
    """Carry the texts of `label_rows` from the cache being replaced into the one a pruning render builds."""
    known = previous.get(order)
    if not known:
        return
    texts = by_layout.get(order)
    if texts is None:
        texts = by_layout[order] = {}
    for labels in label_rows:
        text = known.get(labels)
        if text is not None:
            texts[labels] = text


class FamilySet:
    """The samples of one scrape, per family; families are created on first use, so empty ones are
    absent unless declared.

    Samples are kept as plain (label values, value) rows: building prometheus_client Metric objects
    and running its writer dominated the scrape (bench/PROFILE.md). `render_text` writes the text
    format directly; iterating still yields Metric objects, built on demand, for registry users.
    """

    def __init__(self, prefixes: SeriesPrefixes | None = None) -> None:
        # name -> (spec, label values of each sample, value of each sample): two flat lists rather than
        # a tuple per sample, which a 128-device scrape would allocate 15,000 times.
        self._rows: dict[str, tuple[MetricSpec, list[tuple[str, ...]], list[float]]] = {}
        self._prefixes = prefixes

    def declare(self, spec: MetricSpec) -> None:
        """A family that is written even with no sample yet (its HELP and TYPE alone, as prometheus_client
        writes a labelled metric without children): one an operator looks for before it ever counts."""
        if spec.name not in self._rows:
            self._rows[spec.name] = (spec, [], [])

    def add(self, spec: MetricSpec, labels: Sequence[str], value: float) -> None:
        entry = self._rows.get(spec.name)
        if entry is None:
            entry = self._rows[spec.name] = (spec, [], [])
        entry[1].append(labels if type(labels) is tuple else tuple(labels))
        entry[2].append(value)

    def __iter__(self) -> Iterator[Metric]:
        for spec, label_rows, values in self._rows.values():
            family = spec.family()
            for labels, value in zip(label_rows, values, strict=True):
                # As render_chunks shows them: prometheus_client's writer cannot encode surrogate escapes.
                family.add_metric([_printable(label) for label in labels], value)
            yield family

    def __len__(self) -> int:
        return len(self._rows)

    def render_text(self) -> bytes:
        """Text format 0.0.4, byte-identical to prometheus_client's `generate_latest` of these families."""
        return b"".join(self.render_chunks())

    def render_chunks(self) -> tuple[bytes, ...]:
        """`render_text` one family per chunk, for a writer that sends them without joining them first."""
        chunks: list[bytes] = []
        cache = self._prefixes if self._prefixes is not None else SeriesPrefixes()
        cache._renders += 1
        previous = cache._by_layout
        # A pruning render fills a new cache with the texts it uses (from the old one where it can).
        prune = cache._renders % SeriesPrefixes.PRUNE_EVERY == 1
        by_layout = {} if prune else previous
        last = cache._chunks
        written: dict[str, _Written] = {}
        for spec, label_rows, values in self._rows.values():
            name = spec.name
            before = last.get(name)
            # Values first: where a family changed, they differ and the comparison stops early.
            if before is not None and before[2] == values and before[1] == label_rows and before[0] == spec:
                written[name] = before
                chunks.append(before[3])
                if prune:  # its label sets are still written: their texts stay in the rebuilt cache
                    _keep_texts(_layout(spec)[1], label_rows, previous, by_layout)
                continue
            header, order = _layout(spec)
            texts = by_layout.get(order)
            if texts is None:
                texts = by_layout[order] = {}
            known = previous.get(order, texts) if prune else texts
            lines = [header]
            append = lines.append
            for labels, value in zip(label_rows, values, strict=True):
                text = texts.get(labels)
                if text is None:
                    text = known.get(labels)
                    if text is None:
                        text = _label_text(order, labels)
                    texts[labels] = text
                # format_value inlined for its common case, small integer counts (this loop runs per series)
                if type(value) is int and 0 <= value < 1_000_000:
                    append(f"{name}{text}{value}.0\n")
                else:
                    append(f"{name}{text}{format_value(value)}\n")
            # One family at a time: the peak is one family's lines, not the whole scrape's twice over.
            chunk = "".join(lines).encode("utf-8")
            # Copies: rows added to this FamilySet after the render must not match the chunk written now.
            written[name] = (spec, label_rows[:], values[:], chunk)
            chunks.append(chunk)
        cache._chunks = written
        if prune:
            cache._by_layout = by_layout
        return tuple(chunks)


@dataclass(frozen=True, slots=True)
class ScrapeContext:
    """What a source may consult besides the device: paths, its own settings, and the scrape's claims."""

    sys_root: Path
    settings: Mapping[str, Any]
    # One scrape's claims (the engine gives each round a new dict, shared by its sources): what several
    # devices share, such as the PCIe port above a card's two functions, is read by one of them.
    claims: dict[str, str] = field(default_factory=dict)

    def claim_once(self, key: str, device: str) -> bool:
        """True for the first device of the scrape to claim `key` (and again for it), else False."""
        return self.claims.setdefault(key, device) == device  # one dict call: atomic between threads


class Source(Protocol):
    """A collector of one data source, split into per-device I/O and pure exposition.

    `read` does all file and ioctl access for one RDMA device and returns a plain value; the scrape
    engine may run it in a worker thread with a deadline. `expose` turns the values of every device
    that answered into metric families and must not do I/O.

    A source whose `read` only looks at the cached `DeviceInfo` sets `io_free = True`: the engine then
    evaluates it for every listed device, even one whose reads are stuck, so that (for example) a device
    in a firmware stall is still reported present. Its `expose` gets None for a listed device whose static
    info is not known yet, and no timeout is ever counted against it. It may also define
    `read_excluded(pci_address)`, the value for a listed device the filters skip, whose address is known
    from its class link alone (None for a non-PCI device).

    A source whose `read` waits in the kernel for the rtnl lock (class/net attributes such as `speed`,
    the SIOCETHTOOL ioctl) sets `needs_rtnl = True`: the engine reads it after the device's other
    sources, and a stall in it, which any other NIC's driver can cause, does not hold up their reads in
    later scrapes (engine module docstring).

    A source whose reads never reach the device's firmware (PCI config space, the PCI core's own AER
    counts) sets `firmware_free = True`: the engine reads it before the device's other sources, so that
    a counter read stuck in a hung firmware does not take it down with the rest of the device's job.
    """

    name: str
    specs: tuple[MetricSpec, ...]
    dynamic_specs: tuple[DynamicMetricSpec, ...]

    def read(self, ctx: ScrapeContext, device: DeviceInfo, reader: SysfsReader) -> Any: ...

    def expose(self, results: Mapping[str, Any], out: FamilySet) -> None: ...


def needs_rtnl(source: Source) -> bool:
    """Whether the source's reads wait for the kernel's rtnl lock (Source)."""
    return bool(getattr(source, "needs_rtnl", False))


def firmware_free(source: Source) -> bool:
    """Whether none of the source's reads waits on the device's firmware (Source)."""
    return bool(getattr(source, "firmware_free", False))


def label(value: str | int | None) -> str:
    """Label values are strings; an unknown attribute is the empty string, as Prometheus treats absence."""
    return "" if value is None else str(value)


class FailureEpisodes:
    """Which (device, what) reads are failing, so that a persistent fault is logged once, not per scrape.

    A failure is logged when it starts or its exception type changes; repeats go to debug. The first
    success after it is logged as the end of the episode. Reader threads call it concurrently.
    """

    def __init__(self) -> None:
        self._failing: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def record_failure(self, key: tuple[str, str], exc: BaseException) -> int:
        """The level to log this failure at: WARNING when it starts an episode (or changes its kind),
        DEBUG when it repeats one."""
        return logging.WARNING if self.start(key, type(exc).__name__) else logging.DEBUG

    def log_failure(
        self, logger: logging.Logger, key: tuple[str, str], exc: BaseException, msg: str, *args: object
    ) -> None:
        """Log `msg` at record_failure's level. An exception that is no kernel answer (not an OSError) is a
        bug in this code, whose message alone would read like one: the episode's first line carries its
        traceback."""
        level = self.record_failure(key, exc)
        bug = level >= logging.WARNING and not isinstance(exc, OSError)
        logger.log(level, msg, *args, exc_info=exc if bug else None)

    def start(self, key: tuple[str, str], kind: str) -> bool:
        """Record a failure of `kind`: True when it starts an episode (or changes its kind)."""
        with self._lock:
            new = self._failing.get(key) != kind
            self._failing[key] = kind
        return new

    def succeeded(self, key: tuple[str, str]) -> bool:
        """True when this success ends an episode."""
        if key not in self._failing:
            return False  # the common case, every read of every scrape: no lock taken
        with self._lock:
            return self._failing.pop(key, None) is not None

    def forget(self, device: str) -> None:
        """A removed device's episodes end with it, unlogged: the engine logs the device's removal."""
        self.retain(device, ())

    def retain(self, device: str, whats: Collection[str]) -> list[str]:
        """End the device's episodes of anything not in `whats` (a netdev that went away); the ended ones'
        `what`s, for the caller to log."""
        if not self._failing:
            return []  # the common case, every device of every scrape: no lock taken
        with self._lock:
            ended = [key for key in self._failing if key[0] == device and key[1] not in whats]
            for key in ended:
                del self._failing[key]
        return sorted(what for _, what in ended)
