#!/usr/bin/env python3
"""In-process micro-benchmark of one scrape, phase by phase, and of cheaper alternatives per phase.

    python bench/microbench.py [--devices 128] [--iterations 40] [--pyinstrument]

Everything runs in this process on one generated tree (no HTTP), with the collector the daemon builds.
Phases of one scrape (median over --iterations, in ms):

  scrape       generate_latest(registry): what /metrics costs without HTTP (and, where the engine reads
               devices on a thread pool, the same with 1 and 2 reader threads instead of its default)
               "served": the collector's FamilySet.render_text, what the daemon serves since render_text
  inventory    the Inventory's per-scrape pass: list class/infiniband, reuse the cached static info
  read         every source's read() of every device: sysfs I/O and parsing
  expose       every source's expose() into a FamilySet of prometheus_client Metric/Sample objects
  text         prometheus_client.generate_latest over those already-built families
  text_openmetrics  the same in OpenMetrics, which Prometheus servers ask for first

Alternatives, each checked to give the same bytes (text) or the same values (reads):

  text_render  FamilySet.render_text over the same samples, cold and with the previous scrape's series
               prefixes (what the daemon serves)
  text_own     a plain text writer over the same Metric objects (no per-name validation/escaping calls)
  direct       expose() into a recorder of (spec, labels, value) and lines written straight from it,
               without building Metric and Sample objects at all (replaces expose + text)
  direct_cached  the same, with each series' `name{labels} ` prefix kept across scrapes
  counters_*   the counter-file part of `read` four ways: the current SysfsReader.uint over pathlib
               paths (open/read/close), precomputed str paths, os.open(name, dir_fd=...) relative to
               each counters/ directory kept open, and one os.pread(fd, n, 0) per file kept open
               (1 syscall instead of 3; sysfs runs show() again on a read at offset 0)
"""

from __future__ import annotations

import argparse
import errno
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "exporter"))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.core import Metric  # noqa: E402
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics  # noqa: E402
from prometheus_client.utils import floatToGoString  # noqa: E402

from rdma_exporter.collect.base import FamilySet, MetricSpec, ScrapeContext  # noqa: E402
from rdma_exporter.config import Config  # noqa: E402
from rdma_exporter.daemon import build_collector, build_registry  # noqa: E402
from rdma_exporter.parse.infiniband import CLASS_DIR, DeviceInfo  # noqa: E402
from rdma_exporter.parse.reader import NO_PMA, FileBudget, OpenFiles, ReadErrors, SysfsReader, parse_uint  # noqa: E402
from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree, spec_for_devices  # noqa: E402


def timed(fn: Callable[[], Any], iterations: int) -> tuple[float, Any]:
    """Median milliseconds of `fn` and its last result."""
    samples: list[float] = []
    result: Any = None
    for _ in range(iterations):
        started = time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples), result


# --- text writers ------------------------------------------------------------------------------------


def _escape_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def write_families(families: Iterable[Metric]) -> bytes:
    """The text format 0.0.4 for counter/gauge families, as generate_latest writes it."""
    out: list[str] = []
    for metric in families:
        name, kind = metric.name, metric.type
        if kind == "counter":
            name += "_total"
        elif kind == "info":
            name, kind = name + "_info", "gauge"
        out.append(f"# HELP {name} {_help(metric.documentation)}\n# TYPE {name} {kind}\n")
        for sample in metric.samples:
            if sample.labels:
                labels = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(sample.labels.items()))
                out.append(f"{sample.name}{{{labels}}} {floatToGoString(sample.value)}\n")
            else:
                out.append(f"{sample.name} {floatToGoString(sample.value)}\n")
    return "".join(out).encode()


class RecordingFamilySet(FamilySet):
    """A FamilySet that keeps (labels, value) rows per spec instead of building Metric objects."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, tuple[MetricSpec, list[tuple[Sequence[str], float]]]] = {}

    def add(self, spec: MetricSpec, labels: Sequence[str], value: float) -> None:
        entry = self.rows.get(spec.name)
        if entry is None:
            entry = self.rows[spec.name] = (spec, [])
        entry[1].append((labels, value))

    def __iter__(self) -> Iterator[Metric]:
        raise TypeError("RecordingFamilySet has no Metric objects")

    def __len__(self) -> int:
        return len(self.rows)


class DirectWriter:
    """Writes recorded rows straight to text; per-spec headers and label layouts are computed once.

    With `cache_prefixes`, the `name{labels} ` prefix of each series is also kept across scrapes: labels
    of a device's series do not change between scrapes, so only the value has to be formatted. (A real
    implementation would drop the cache when the inventory changes, to bound it by the live series.)
    """

    def __init__(self, *, cache_prefixes: bool = False) -> None:
        self._layouts: dict[str, tuple[str, str, tuple[tuple[int, str], ...]]] = {}
        self._prefixes: dict[tuple[str, ...], str] | None = {} if cache_prefixes else None

    def _layout(self, spec: MetricSpec) -> tuple[str, str, tuple[tuple[int, str], ...]]:
        layout = self._layouts.get(spec.name)
        if layout is None:
            kind = "counter" if spec.kind == "counter" else "gauge"
            header = f"# HELP {spec.name} {_help(spec.help)}\n# TYPE {spec.name} {kind}\n"
            # generate_latest sorts label names; keep each label's position in the spec's tuple.
            order = tuple(sorted(((i, name) for i, name in enumerate(spec.labels)), key=lambda p: p[1]))
            layout = self._layouts[spec.name] = (header, spec.name, order)
        return layout

    def write(self, rows: dict[str, tuple[MetricSpec, list[tuple[Sequence[str], float]]]]) -> bytes:
        if self._prefixes is not None:
            return self._write_cached(rows, self._prefixes)
        out: list[str] = []
        append = out.append
        for spec, values in rows.values():
            header, name, order = self._layout(spec)
            append(header)
            if not order:
                for _, value in values:
                    append(f"{name} {floatToGoString(value)}\n")
                continue
            for labels, value in values:
                pairs = ",".join(f'{key}="{_escape_value(labels[i])}"' for i, key in order)
                append(f"{name}{{{pairs}}} {floatToGoString(value)}\n")
        return "".join(out).encode()

    def _write_cached(
        self,
        rows: dict[str, tuple[MetricSpec, list[tuple[Sequence[str], float]]]],
        prefixes: dict[tuple[str, ...], str],
    ) -> bytes:
        out: list[str] = []
        append = out.append
        for spec, values in rows.values():
            header, name, order = self._layout(spec)
            append(header)
            for labels, value in values:
                key = (name, *labels)
                prefix = prefixes.get(key)
                if prefix is None:
                    pairs = ",".join(f'{k}="{_escape_value(labels[i])}"' for i, k in order)
                    prefix = prefixes[key] = f"{name}{{{pairs}}} " if order else f"{name} "
                append(prefix)
                append(floatToGoString(value))
                append("\n")
        return "".join(out).encode()


# --- counter reads -----------------------------------------------------------------------------------


def counter_files(sys_root: Path, devices: Sequence[DeviceInfo]) -> list[tuple[Path, tuple[str, ...]]]:
    """(directory, file names) of every counter directory the infiniband source reads per scrape."""
    dirs: list[tuple[Path, tuple[str, ...]]] = []
    for device in devices:
        device_dir = sys_root / CLASS_DIR / device.name
        dirs.append((device_dir / "hw_counters", device.hw_counter_files))
        for port in device.ports:
            port_dir = device_dir / "ports" / str(port.number)
            dirs.append((port_dir / "counters", port.counter_files))
            dirs.append((port_dir / "counters_ext", port.counter_ext_files))
            dirs.append((port_dir / "hw_counters", port.hw_counter_files))
    return [(d, files) for d, files in dirs if files]


def read_pathlib(dirs: list[tuple[Path, tuple[str, ...]]]) -> list[int | None]:
    reader = SysfsReader("bench", ReadErrors())
    return [reader.uint(directory / name) for directory, files in dirs for name in files]


def _read_int(fd: int) -> int | None:
    # The same checks as SysfsReader.uint (UTF-8, "N/A (no PMA)", u64 range), without its error tally.
    try:
        raw = os.read(fd, 8192)
    finally:
        os.close(fd)
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    if text == NO_PMA:
        return None
    return parse_uint(text)


def read_str_paths(paths: list[str]) -> list[int | None]:
    values: list[int | None] = []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            values.append(None)
            continue
        values.append(_read_int(fd))
    return values


def read_kept_open(fds: list[int]) -> list[int | None]:
    # A read at offset 0 of an open sysfs attribute runs its show() again, so the value is fresh.
    values: list[int | None] = []
    for fd in fds:
        try:
            text = os.pread(fd, 8192, 0).decode("utf-8").strip()
        except UnicodeDecodeError:
            values.append(None)
            continue
        values.append(None if text == NO_PMA else parse_uint(text))
    return values


def read_dir_fd(dir_fds: list[tuple[int, tuple[str, ...]]]) -> list[int | None]:
    values: list[int | None] = []
    for dir_fd, files in dir_fds:
        for name in files:
            values.append(_read_int(os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)))
    return values


def pool_variants(config: Config, iterations: int) -> dict[str, float]:
    """The whole scrape with the engine's reader pool at other parallelisms, where the engine has one.

    On a fixture tree reads cost CPU only, so parallel readers mostly contend for the GIL; on real mlx5
    hardware each counter read also waits on the firmware, which is what the pool is there to overlap.
    """
    try:  # the reader pool moved out of the engine module; older commits have it there, or none
        from rdma_exporter.collect import readers as engine
    except ImportError:
        from rdma_exporter.collect import engine  # type: ignore[no-redef]

    if not hasattr(engine, "WorkerPool") or not hasattr(engine, "DeviceReads"):
        return {}
    timings: dict[str, float] = {}
    for parallelism in (1, 2):
        collector = build_collector(config)
        collector.reads = engine.DeviceReads(engine.WorkerPool(parallelism=parallelism))
        registry = build_registry(collector)
        for _ in range(3):
            generate_latest(registry)
        timings[f"scrape, {parallelism} reader thread(s)"], _ = timed(lambda r=registry: generate_latest(r), iterations)
        collector.reads.prune("", ())  # its kept files: the phases below need the descriptors
    return timings


def inventory_pass(inventory: Any) -> list[DeviceInfo]:
    """One scrape's inventory work and the cached static info of every device.

    The engine's Inventory API has two shapes: `refresh()` returning infos, or `scan()` returning
    entries whose static info was filled by the previous scrapes.
    """
    if hasattr(inventory, "refresh"):
        return list(inventory.refresh(ReadErrors()))
    entries = inventory.scan(ReadErrors())
    infos = [entry.info for entry in entries if entry.info is not None]
    if len(infos) != len(entries):
        raise RuntimeError("the inventory has devices without cached static info after the warm-up scrapes")
    return infos


# --- main --------------------------------------------------------------------------------------------


def run(devices: int | str, iterations: int, use_pyinstrument: bool) -> str:
    # The engine's kept files and the kept-open variant below each hold one fd per counter file.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory(prefix="rdma-microbench-") as tmp:
        dest = Path(tmp)
        sys_root = build_tree(dest, SAMPLE_SPEC if devices == "sample" else spec_for_devices(int(devices)))
        ethtool = dest / "ethtool"
        config = Config(sysfs=sys_root, ethtool_dir=ethtool if ethtool.is_dir() else None)
        collector = build_collector(config)
        registry = build_registry(collector)
        for _ in range(3):  # warm the inventory and every memoised spec
            generate_latest(registry)

        results: dict[str, float] = {}
        results["scrape"], exposition = timed(lambda: generate_latest(registry), iterations)
        if hasattr(FamilySet, "render_text"):
            # What the daemon serves: the round's FamilySet written by render_text.
            results["scrape, served (gather + render_text)"], _ = timed(
                lambda: collector.gather().render_text(), iterations
            )
        collector.reads.prune("", ())  # each collector below keeps its own files open
        results.update(pool_variants(config, iterations))

        results["inventory"], infos = timed(lambda: inventory_pass(collector.inventory), iterations)
        # The phases keep every device's files open once more: close the engine's first, or a 128-device
        # tree (about 11,000 kept files each) runs out of descriptors and its reads fail, unnoticed.
        collector.reads.prune("", ())

        # As the engine reads: through each device's kept-open files (OpenFiles), verified per directory
        # as on any non-sysfs tree. The tree is backdated so its directories count as settled.
        for directory, _, _ in os.walk(dest):
            os.utime(directory, (time.time() - 60, time.time() - 60))
        kept = {d.name: OpenFiles(FileBudget(1_000_000), verify=True) for d in infos}

        def read_all(
            files: dict[str, OpenFiles | None], failed: ReadErrors | None = None
        ) -> dict[str, dict[str, Any]]:
            """Every source's reading of every device; the failed reads go to `failed`, if given."""
            out: dict[str, dict[str, Any]] = {}
            for d in infos:
                opened = files.get(d.name)
                if opened is not None:
                    opened.begin()
            for source in collector.sources:
                ctx = ScrapeContext(sys_root, collector._settings.get(source.name, {}))
                errors = failed if failed is not None else ReadErrors()
                out[source.name] = {
                    d.name: source.read(ctx, d, SysfsReader(d.name, errors, files.get(d.name))) for d in infos
                }
            return out

        failed = ReadErrors()
        read_all(kept, failed)  # opens and keeps every per-scrape file
        if failed.counts:
            raise AssertionError(f"the read phase's reads failed, its times would not be a scrape's: {failed.counts}")
        results["read"], read_results = timed(lambda: read_all(kept), iterations)
        results["read, files opened for each read"], _ = timed(lambda: read_all({}), iterations)

        def expose_all(out: FamilySet) -> FamilySet:
            for source in collector.sources:
                source.expose(read_results[source.name], out)
            return out

        results["expose"], families = timed(lambda: expose_all(FamilySet()), iterations)
        family_list = list(families)

        # Where read and expose time goes, source by source.
        per_source: dict[str, float] = {}
        for source in collector.sources:
            ctx = ScrapeContext(sys_root, collector._settings.get(source.name, {}))

            def read_one(source: Any = source, ctx: ScrapeContext = ctx) -> None:
                errors = ReadErrors()
                for d in infos:
                    source.read(ctx, d, SysfsReader(d.name, errors, kept[d.name]))

            per_source[f"read: {source.name}"], _ = timed(read_one, iterations)
            per_source[f"expose: {source.name}"], _ = timed(
                lambda source=source: source.expose(read_results[source.name], FamilySet()), iterations
            )

        class Families:
            def collect(self) -> list[Metric]:
                return family_list

        prom_registry = CollectorRegistry(auto_describe=False)
        prom_registry.register(Families())  # type: ignore[arg-type]
        results["text"], prom_text = timed(lambda: generate_latest(prom_registry), iterations)
        # What a Prometheus server gets by default: it asks for OpenMetrics first.
        results["text_openmetrics"], _ = timed(lambda: generate_openmetrics(prom_registry), iterations)
        results["text_own"], own_text = timed(lambda: write_families(family_list), iterations)
        if own_text != prom_text:
            raise AssertionError("text_own differs from generate_latest")

        if hasattr(FamilySet, "render_text"):
            results["text_render"], rendered = timed(families.render_text, iterations)
            if rendered != prom_text:
                raise AssertionError("FamilySet.render_text differs from generate_latest")
            from rdma_exporter.collect.base import SeriesPrefixes

            warm = expose_all(FamilySet(SeriesPrefixes()))
            warm.render_text()
            results["text_render, prefixes of the last scrape"], _ = timed(warm.render_text, iterations)

        writer = DirectWriter()

        def direct() -> bytes:
            recorder = RecordingFamilySet()
            expose_all(recorder)
            return writer.write(recorder.rows)

        results["direct"], direct_text = timed(direct, iterations)
        if direct_text != prom_text:
            raise AssertionError("direct writer differs from generate_latest")
        cached_writer = DirectWriter(cache_prefixes=True)

        def direct_cached() -> bytes:
            recorder = RecordingFamilySet()
            expose_all(recorder)
            return cached_writer.write(recorder.rows)

        results["direct_cached"], cached_text = timed(direct_cached, iterations)
        if cached_text != prom_text:
            raise AssertionError("direct writer with cached prefixes differs from generate_latest")

        for opened in kept.values():
            opened.close()  # the kept-open variant below needs the descriptors (128 devices: ~11,000)
        dirs = counter_files(sys_root, infos)
        paths = [str(directory / name) for directory, files in dirs for name in files]
        dir_fds = [(os.open(directory, os.O_RDONLY | os.O_DIRECTORY), files) for directory, files in dirs]
        kept = [os.open(path, os.O_RDONLY | os.O_CLOEXEC) for path in paths]
        try:
            results["counters_pathlib"], v1 = timed(lambda: read_pathlib(dirs), iterations)
            results["counters_str"], v2 = timed(lambda: read_str_paths(paths), iterations)
            results["counters_dirfd"], v3 = timed(lambda: read_dir_fd(dir_fds), iterations)
            results["counters_pread"], v4 = timed(lambda: read_kept_open(kept), iterations)
        finally:
            for fd in kept + [fd for fd, _ in dir_fds]:
                os.close(fd)
        if not v1 == v2 == v3 == v4:
            raise AssertionError("counter reads disagree")

        series = sum(1 for line in exposition.decode().splitlines() if line and not line.startswith("#"))
        source_series = sum(len(family.samples) for family in family_list)
        if not 0 <= series - source_series <= 100:  # the engine's own metrics come on top of the sources'
            raise AssertionError(f"phases cover {source_series} of the scrape's {series} series")
        report = [
            f"# In-process scrape of the {devices} tree ({series} series, {len(paths)} counter files), "
            f"median of {iterations}",
            "",
            "| phase | ms per scrape | share of scrape |",
            "| --- | ---: | ---: |",
        ]
        for name, value in [*results.items(), *per_source.items()]:
            report.append(f"| {name} | {value:.2f} | {100 * value / results['scrape']:.0f}% |")

        if use_pyinstrument:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0005)
            profiler.start()
            for _ in range(iterations):
                generate_latest(registry)
            profiler.stop()
            report += ["", "```", profiler.output_text(unicode=False, color=False, show_all=False).strip(), "```"]
        return "\n".join(report) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--devices", default="128", help="RDMA devices in the generated tree, or 'sample' (default 128)"
    )
    parser.add_argument("--iterations", type=int, default=40, help="scrapes per measurement (default 40)")
    parser.add_argument("--pyinstrument", action="store_true", help="append a pyinstrument profile of the scrape")
    args = parser.parse_args(argv)
    sys.stdout.write(run(args.devices, args.iterations, args.pyinstrument))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
