"""The scrape engine's own series, on stand-in sources whose reads the test controls: what a scrape
serves when a device's read is stuck, fails or raises, and what the exporter says about itself."""

from __future__ import annotations

import gc
import logging
import platform
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from test_daemon_faults import PausedClock

from rdma_exporter import __version__
from rdma_exporter.collect import engine, inventory, readers
from rdma_exporter.collect.base import FamilySet, MetricSpec, ScrapeContext
from rdma_exporter.collect.engine import RdmaCollector
from rdma_exporter.collect.readers import STUCK_AFTER_SECONDS, DeviceReads, WorkerPool
from rdma_exporter.parse.infiniband import DeviceInfo
from rdma_exporter.parse.reader import REASON_IO, REASON_PERMISSION, SysfsReader
from rdma_exporter.sample_tree import build_tree, spec_for_devices

from conftest import samples, wait_until

VALUE = MetricSpec("x_value", "gauge", "The stand-in source's value.", ("device",))
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class StandIn:
    """A source whose read of a device blocks on that device's gate, counts a read error or raises, as told."""

    name = "standin"
    specs = (VALUE,)
    dynamic_specs = ()

    def __init__(self) -> None:
        self.gates: dict[str, threading.Event] = {}
        self.errors: set[str] = set()  # devices whose read counts one io error (their value still stands)
        self.raises: set[str] = set()  # devices whose read raises
        self.failure: Exception = OSError("the device went away")  # what their read raises
        self.seconds = 0.0  # how long each read takes
        self.reading: set[str] = set()  # devices whose read has begun

    def read(self, ctx: ScrapeContext, device: DeviceInfo, reader: SysfsReader) -> Any:
        self.reading.add(device.name)
        gate = self.gates.get(device.name)
        if gate is not None:
            gate.wait(30)
        time.sleep(self.seconds)
        if device.name in self.raises:
            raise self.failure
        if device.name in self.errors:
            reader.errors.add(device.name, REASON_IO, "EIO")
        return 1

    def expose(self, results: Mapping[str, Any], out: FamilySet) -> None:
        for name, value in sorted(results.items()):
            out.add(VALUE, [name], value)

    def release(self) -> None:
        for gate in self.gates.values():
            gate.set()


@pytest.fixture
def standin() -> Iterator[StandIn]:
    source = StandIn()
    yield source
    source.release()


def collector(
    tmp_path: Path,
    source: StandIn,
    devices: int = 2,
    parallelism: int = 4,
    hard_max: int = 8,
    stuck_after: float = STUCK_AFTER_SECONDS,
) -> RdmaCollector:
    root = build_tree(tmp_path / "t", spec_for_devices(devices))
    reads = DeviceReads(WorkerPool(parallelism=parallelism, hard_max=hard_max, stuck_after=stuck_after))
    return RdmaCollector(root, [source], scrape_timeout=5.0, reads=reads)


def scrape(rdma: RdmaCollector, timeout: float = 5.0) -> Samples:
    return samples(rdma.gather(timeout).render_text().decode())


def test_a_device_queued_behind_a_stuck_one_is_read_by_the_next_scrape(
    tmp_path: Path, standin: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    # One reader thread: mlx5_1's job waits behind mlx5_0's, stuck in firmware. The scrape that gives up at
    # its deadline drops the job that never started and lets another thread past the stuck one, so the next
    # scrape reads mlx5_1 instead of reporting it skipped behind a read that never began.
    standin.gates["mlx5_0"] = threading.Event()
    # Never stuck by the pool's measure: on a loaded machine the first scrape could end after the 1 s at
    # which a stuck job lets another thread in, and find mlx5_1 read by it.
    rdma = collector(tmp_path, standin, parallelism=1, stuck_after=60.0)
    caplog.set_level(logging.WARNING, logger="rdma_exporter")
    first = scrape(rdma, 0.5)
    assert ("x_value", (("device", "mlx5_1"),)) not in first
    # Said as it is: waiting, not a read running (daemon review).
    logged = {r.getMessage().split(":")[0]: r.getMessage() for r in caplog.records}
    assert "(read running for " in logged["device mlx5_0"], logged
    assert "(queued for " in logged["device mlx5_1"], logged
    assert logged["device mlx5_1"].endswith(", waiting for a reader thread; not logged again for 10 minutes)"), logged
    # mlx5_1's job ends (dropped, or run by the thread let in): only the stuck read is left outstanding.
    wait_until(lambda: rdma.reads.outstanding() == 1)
    second = scrape(rdma, 30.0)
    # Over once mlx5_1 is read: the skipped device, which has no job in this round, is not waited for. A
    # round is dropped once it has finished (an unfinished one stays, joinable until its deadline).
    assert rdma._round is None
    assert second[("x_value", (("device", "mlx5_1"),))] == 1
    assert second[("rdma_exporter_device_scrape_skipped", (("device", "mlx5_0"),))] == 1
    assert ("rdma_exporter_device_scrape_skipped", (("device", "mlx5_1"),)) not in second


def errors_of(metrics: Samples, device: str, reason: str = "io", collector: str = "standin") -> float | None:
    key = (("collector", collector), ("device", device), ("reason", reason))
    return metrics.get(("rdma_exporter_file_read_errors_total", key))


def success_of(metrics: Samples, collector: str = "standin") -> float | None:
    return metrics.get(("rdma_exporter_scrape_collector_success", (("collector", collector),)))


def test_a_device_that_fails_fails_the_collector_whatever_the_devices_after_it(
    tmp_path: Path, standin: StandIn
) -> None:
    # mlx5_0 is read first: mlx5_1 answering afterwards must not make the scrape a success again.
    standin.raises.add("mlx5_0")
    metrics = scrape(collector(tmp_path, standin))
    assert success_of(metrics) == 0
    assert success_of(metrics, "inventory") == 1
    assert metrics[("x_value", (("device", "mlx5_1"),))] == 1
    assert ("x_value", (("device", "mlx5_0"),)) not in metrics
    assert errors_of(metrics, "mlx5_0") == 1
    assert metrics[("rdma_exporter_devices", ())] == 2


def test_read_errors_accumulate_and_go_with_their_device(tmp_path: Path, standin: StandIn) -> None:
    # A counter: each scrape's errors add to the last, and a read error costs only its value (the source
    # still succeeds). A device that is no longer listed takes its error series with it, as every other
    # series of it; a device listed again starts from nothing.
    standin.errors.update({"mlx5_0", "mlx5_1"})
    rdma = collector(tmp_path, standin)
    assert errors_of(scrape(rdma), "mlx5_1") == 1
    metrics = scrape(rdma)
    assert (errors_of(metrics, "mlx5_0"), errors_of(metrics, "mlx5_1"), success_of(metrics)) == (2, 2, 1)
    link = rdma.sys_root / "class" / "infiniband" / "mlx5_1"
    target = link.readlink()
    link.unlink()
    metrics = scrape(rdma)
    assert (errors_of(metrics, "mlx5_0"), errors_of(metrics, "mlx5_1")) == (3, None)
    link.symlink_to(target)
    metrics = scrape(rdma)
    assert (errors_of(metrics, "mlx5_0"), errors_of(metrics, "mlx5_1")) == (4, 1)


def test_build_info_names_this_version_and_python(tmp_path: Path, standin: StandIn) -> None:
    metrics = scrape(collector(tmp_path, standin))
    labels = (("python_version", platform.python_version()), ("version", __version__))
    assert metrics[("rdma_exporter_build_info", labels)] == 1


def test_scrapes_sharing_a_round_count_each_error_once(tmp_path: Path, standin: StandIn) -> None:
    # Two scrapes (two Prometheus replicas) join one round, in which mlx5_0's static read has an error and
    # its source read is stuck, and mlx5_1's source read has an error: each is counted once, however many
    # scrapes serve the round.
    standin.gates["mlx5_0"] = threading.Event()
    standin.errors.add("mlx5_1")
    rdma = collector(tmp_path, standin)
    fw_ver = rdma.sys_root / "class" / "infiniband" / "mlx5_0" / "fw_ver"
    fw_ver.unlink()
    fw_ver.mkdir()  # reading it fails with EISDIR: an io error of the static attributes
    longer: list[Samples] = []
    thread = threading.Thread(target=lambda: longer.append(scrape(rdma, 3.0)))
    thread.start()
    wait_until(lambda: rdma._round is not None, 10)  # the longer scrape started the round (not a fixed sleep)
    shorter = scrape(rdma, 1.5)
    thread.join()
    for metrics in (shorter, longer[0]):
        assert errors_of(metrics, "mlx5_0", "io", "inventory") == 1
        assert errors_of(metrics, "mlx5_0", "timeout") == 1
        assert errors_of(metrics, "mlx5_1") == 1
        assert success_of(metrics) == 0
    assert rdma._round is not None and rdma._round.result is None  # one round, still unfinished


def durations_of(metrics: Samples) -> dict[str, float]:
    """{collector: seconds} of rdma_exporter_scrape_collector_duration_seconds."""
    return {
        labels[0][1]: value for (name, labels), value in metrics.items()
        if name == "rdma_exporter_scrape_collector_duration_seconds"
    }


def test_durations_include_static_and_source_reads(
    tmp_path: Path, standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Time a collector spent in this scrape, summed over devices: the inventory's is the listing plus each
    # device's static read, done in the device's job.
    real = engine.read_device_info
    real_list = inventory.list_devices

    def slow_read_device_info(*args: Any, **kwargs: Any) -> DeviceInfo:
        time.sleep(0.1)
        return real(*args, **kwargs)

    def slow_list_devices(*args: Any, **kwargs: Any) -> list[str]:
        time.sleep(0.5)
        return real_list(*args, **kwargs)

    monkeypatch.setattr(engine, "read_device_info", slow_read_device_info)
    monkeypatch.setattr(inventory, "list_devices", slow_list_devices)
    standin.seconds = 0.1
    durations = durations_of(scrape(collector(tmp_path, standin)))
    assert durations.keys() == {"inventory", "standin"}
    assert durations["inventory"] >= 0.7
    assert durations["standin"] >= 0.2


@pytest.mark.parametrize(
    ("error", "reason"),
    [(OSError("EIO"), "io"), (ValueError("a parser bug"), "io"), (PermissionError(13, "denied"), "permission")],
    ids=["io", "bug", "permission"],
)
def test_a_device_whose_static_read_raises_is_an_inventory_error_and_fails_the_sources(
    tmp_path: Path, standin: StandIn, monkeypatch: pytest.MonkeyPatch, error: Exception, reason: str
) -> None:
    # Without its static info the device has no reads to time out: the failure is an inventory read error
    # (by its errno: an unreadable device directory is `permission`, once, not also `io`), not a timeout
    # of every source. The device is still one found under class/infiniband (rdma_exporter_devices), and
    # it failed as a whole for every source that reads files (their success is 0, as their HELP says;
    # before, a device nothing could be read of left every collector at 1, found by review). A parser
    # tripped by odd attributes is no different from a read that failed.
    real = engine.read_device_info

    def failing(sys_root: Path, name: str, reader: SysfsReader) -> DeviceInfo:
        if name == "mlx5_0":
            raise error
        return real(sys_root, name, reader)

    monkeypatch.setattr(engine, "read_device_info", failing)
    metrics = scrape(collector(tmp_path, standin))
    assert errors_of(metrics, "mlx5_0", reason, "inventory") == 1
    assert {key[1] for key in metrics if key[0] == "rdma_exporter_file_read_errors_total"} == {
        (("collector", "inventory"), ("device", "mlx5_0"), ("reason", reason))
    }
    assert (success_of(metrics), metrics[("rdma_exporter_devices", ())]) == (0, 2)
    assert success_of(metrics, "inventory") == 1  # the listing itself worked
    assert metrics[("x_value", (("device", "mlx5_1"),))] == 1


def device_logs(caplog: pytest.LogCaptureFixture, device: str) -> list[tuple[str, str]]:
    """(level, message) of the INFO and louder lines that name `device`."""
    return [
        (record.levelname, record.getMessage())
        for record in caplog.records
        if record.levelno >= logging.INFO and f"device {device}" in record.getMessage()
    ]


def test_a_source_failing_on_a_device_is_logged_once_per_episode(
    tmp_path: Path, standin: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    # A persistent fault is counted every scrape (rdma_exporter_file_read_errors_total) but logged when it
    # starts and when it ends: at a 15 s interval a line per scrape is 5,760 lines a day per device.
    caplog.set_level(logging.DEBUG, logger=engine.log.name)
    rdma = collector(tmp_path, standin)
    standin.raises.add("mlx5_0")
    for _ in range(3):
        scrape(rdma)
    standin.raises.clear()
    scrape(rdma)
    scrape(rdma)
    standin.raises.add("mlx5_0")
    assert errors_of(scrape(rdma), "mlx5_0") == 4
    failed = ("WARNING", "collector standin failed on device mlx5_0: the device went away")
    assert device_logs(caplog, "mlx5_0") == [failed, ("INFO", "collector standin works again on device mlx5_0"), failed]
    assert device_logs(caplog, "mlx5_1") == []
    standin.raises.add("mlx5_1")
    scrape(rdma)
    # A device that is unlisted while failing ends its episode with it: listed again, still failing, it is
    # a new fault to report (a replaced HCA under the same name). mlx5_1, failing all along, is not news.
    caplog.clear()
    link = rdma.sys_root / "class" / "infiniband" / "mlx5_0"
    target = link.readlink()
    link.unlink()
    scrape(rdma)
    link.symlink_to(target)
    scrape(rdma)
    assert device_logs(caplog, "mlx5_0") == [failed]
    assert device_logs(caplog, "mlx5_1") == []


def scrape_one_failing_device(
    tmp_path: Path, standin: StandIn, caplog: pytest.LogCaptureFixture, failures: list[Exception]
) -> RdmaCollector:
    """A collector of one device, mlx5_0, whose stand-in source raises each of `failures` in turn, one
    scrape each, with the engine's log captured from DEBUG."""
    caplog.set_level(logging.DEBUG, logger=engine.log.name)
    rdma = collector(tmp_path, standin, devices=1)
    standin.raises.add("mlx5_0")
    for failure in failures:
        standin.failure = failure
        scrape(rdma)
    return rdma


def test_a_failure_is_logged_again_when_its_kind_changes_not_its_wording(
    tmp_path: Path, standin: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    # The episode is the fault, not its wording: a read naming another file each scrape is one fault. An
    # exception of another type is another fault (EIO, then a parser tripping on what came back), and the
    # first line alone would send the operator after the wrong one.
    failures = [OSError("port 1: EIO"), OSError("port 2: EIO"), ValueError("garbage"), ValueError("more garbage")]
    scrape_one_failing_device(tmp_path, standin, caplog, [*failures, failures[2]])
    assert device_logs(caplog, "mlx5_0") == [
        ("WARNING", "collector standin failed on device mlx5_0: port 1: EIO"),
        ("WARNING", "collector standin failed on device mlx5_0: garbage"),
    ]


def test_a_bug_is_logged_with_its_traceback_and_a_kernel_error_without(
    tmp_path: Path, standin: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    # An OSError is the kernel's answer and its message says it all. Anything else is a bug in this code,
    # which is counted as the same io reason: only its traceback tells the two apart, once an episode.
    failures = [OSError("port 1: EIO"), AttributeError("'NoneType' object has no attribute 'counters'")] * 2
    rdma = scrape_one_failing_device(tmp_path, standin, caplog, failures)
    records = [r for r in caplog.records if r.getMessage().startswith("collector standin failed on device mlx5_0")]
    assert [(r.levelname, r.exc_info is not None) for r in records] == [
        ("WARNING", False), ("WARNING", True), ("WARNING", False), ("WARNING", True)
    ]
    assert records[1].exc_info is not None and records[1].exc_info[0] is AttributeError
    standin.failure = records[1].exc_info[1]  # the same kind again: a DEBUG line, no second traceback
    scrape(rdma)
    last = [r for r in caplog.records if r.getMessage().startswith("collector standin failed on device mlx5_0")][-1]
    assert (last.levelname, last.exc_info) == ("DEBUG", None)


def test_each_source_and_the_static_read_have_their_own_failure_episode(
    tmp_path: Path, standin: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    # A node runs several sources: one failing on a device while another reads it fine is one steady fault,
    # not a fault that starts and ends every scrape. Nor does static info read again (udev resync, a
    # changed link) end a source's fault, or the next scrape would log it anew.
    caplog.set_level(logging.DEBUG, logger=engine.log.name)
    rdma, _ = iofree_collector(tmp_path, standin)  # the I/O-free source raises on mlx5_0
    standin.raises.add("mlx5_1")
    for _ in range(3):
        scrape(rdma)
    rdma.inventory.invalidate()
    scrape(rdma)
    assert device_logs(caplog, "mlx5_0") == [
        ("WARNING", "collector iofree failed on device mlx5_0: a bug in the source"),
    ]
    assert device_logs(caplog, "mlx5_1") == [
        ("WARNING", "collector standin failed on device mlx5_1: the device went away"),
    ]


def test_a_device_whose_static_read_keeps_raising_is_logged_once_per_episode(
    tmp_path: Path, standin: StandIn, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Static info that failed is read again every scrape until it works; the log says so at both ends only.
    caplog.set_level(logging.DEBUG, logger=engine.log.name)
    real = engine.read_device_info
    broken = {"mlx5_0"}

    def failing(sys_root: Path, name: str, reader: SysfsReader) -> DeviceInfo:
        if name in broken:
            raise ValueError("a parser bug")
        return real(sys_root, name, reader)

    monkeypatch.setattr(engine, "read_device_info", failing)
    rdma = collector(tmp_path, standin)
    for _ in range(3):
        scrape(rdma)
    broken.clear()
    assert scrape(rdma)[("x_value", (("device", "mlx5_0"),))] == 1
    scrape(rdma)
    assert device_logs(caplog, "mlx5_0") == [
        ("WARNING", "cannot read device mlx5_0: a parser bug"),
        ("INFO", "device mlx5_0 is readable again"),
    ]
    first = next(r for r in caplog.records if r.getMessage() == "cannot read device mlx5_0: a parser bug")
    assert first.exc_info is not None and first.exc_info[0] is ValueError


def blocked_logs(caplog: pytest.LogCaptureFixture, device: str) -> list[str]:
    return [
        record.getMessage() for record in caplog.records
        if record.name == engine.log.name and record.getMessage().startswith(f"device {device}: no answer")
    ]


def test_a_device_missing_the_short_deadline_of_each_round_is_logged_once(
    tmp_path: Path, standin: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    # Whether a device is stuck is judged by the first scrape of each round to be served. An HA pair with
    # different scrape timeouts shares each round: mlx5_0 misses the short scrape's deadline and answers the
    # long one, round after round. The short scrapes see one stall, logged once (docs/operations.md: once
    # per episode, not once per scrape); the long scrape getting the values later in the same round does not
    # end the episode, else every round would log it anew.
    caplog.set_level(logging.WARNING, logger=engine.log.name)
    rdma = collector(tmp_path, standin, devices=1)
    longer: list[Samples] = []
    for rounds in (1, 2):
        gate = standin.gates["mlx5_0"] = threading.Event()
        thread = threading.Thread(target=lambda: longer.append(scrape(rdma, 30.0)))
        thread.start()
        # The long scrape's round is in flight (its job submitted), so the short scrape joins that round.
        wait_until(lambda: rdma.reads.outstanding() == 1, 10)
        short = scrape(rdma, 0.2)
        gate.set()
        thread.join(30)
        assert ("x_value", (("device", "mlx5_0"),)) not in short
        assert len(longer) == rounds and longer[-1][("x_value", (("device", "mlx5_0"),))] == 1
    assert len(blocked_logs(caplog, "mlx5_0")) == 1


def test_a_device_blocked_again_after_a_healthy_scrape_is_logged_again(
    tmp_path: Path, standin: StandIn, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Once per episode: a round in which the device answered ends the episode, and its next stall is news,
    # logged again once BLOCKED_LOG_QUIET_SECONDS have passed since the last line (none here; within them,
    # test_daemon_faults.py's slow device).
    monkeypatch.setattr(readers, "BLOCKED_LOG_QUIET_SECONDS", 0.0)
    caplog.set_level(logging.WARNING, logger=engine.log.name)
    rdma = collector(tmp_path, standin, devices=1)
    for _ in range(2):
        gate = standin.gates["mlx5_0"] = threading.Event()
        assert ("x_value", (("device", "mlx5_0"),)) not in scrape(rdma, 0.2)
        gate.set()
        wait_until(lambda: rdma.reads.outstanding() == 0, 10)
        assert scrape(rdma, 30.0)[("x_value", (("device", "mlx5_0"),))] == 1
    assert len(blocked_logs(caplog, "mlx5_0")) == 2


PRESENT = MetricSpec("x_present", "gauge", "The I/O-free stand-in's value.", ("device",))


class IoFreeStandIn:
    """An I/O-free source (reads only the cached static info) whose read of mlx5_0 raises."""

    name = "iofree"
    io_free = True
    specs = (PRESENT,)
    dynamic_specs = ()

    def __init__(self) -> None:
        self.read_devices: set[str] = set()

    def read(self, ctx: ScrapeContext, device: DeviceInfo, reader: SysfsReader) -> Any:
        self.read_devices.add(device.name)
        if device.name == "mlx5_0":
            raise ValueError("a bug in the source")
        return 1

    def expose(self, results: Mapping[str, Any], out: FamilySet) -> None:
        for name, value in sorted(results.items()):
            out.add(PRESENT, [name], value)


def iofree_collector(tmp_path: Path, standin: StandIn) -> tuple[RdmaCollector, IoFreeStandIn]:
    """Two devices read by the stand-in, then by an I/O-free source."""
    iofree = IoFreeStandIn()
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8))
    return RdmaCollector(root, [standin, iofree], scrape_timeout=5.0, reads=reads), iofree


def test_an_io_free_source_raising_on_the_cached_info_of_a_stuck_device_fails(
    tmp_path: Path, standin: StandIn
) -> None:
    # mlx5_0's read is stuck after its static info was read: a scrape that stops waiting for it evaluates the
    # I/O-free source on that cached info itself. The source raising there fails the source (base.Source:
    # "The source fails the round only if it raises"), though it counts no timeout and mlx5_1 still answers.
    gate = standin.gates["mlx5_0"] = threading.Event()
    rdma, iofree = iofree_collector(tmp_path, standin)
    thread = threading.Thread(target=lambda: scrape(rdma, 30.0))
    thread.start()
    try:
        # The long scrape's round has mlx5_0's static info and is stuck in its read; mlx5_1 has been read.
        wait_until(lambda: "mlx5_0" in standin.reading and "mlx5_1" in iofree.read_devices, 10)
        metrics = scrape(rdma, 0.2)  # joins the round, and stops waiting for mlx5_0
    finally:
        gate.set()
        thread.join(30)
    assert metrics[("x_present", (("device", "mlx5_1"),))] == 1
    assert ("x_present", (("device", "mlx5_0"),)) not in metrics
    assert success_of(metrics, "iofree") == 0
    assert errors_of(metrics, "mlx5_0", "timeout", "iofree") is None
    assert success_of(metrics) == 0  # the stand-in's read of mlx5_0 did time out


@pytest.mark.parametrize("udev", [False, True], ids=["rescan", "udev"])
def test_a_listing_that_fails_forgets_no_device_error_counts(tmp_path: Path, standin: StandIn, udev: bool) -> None:
    # A class/infiniband that cannot be listed (EIO, EACCES) says nothing about which devices are gone: the
    # devices' error counters stay, and go on from where they were once the listing works again (a counter
    # that dropped to nothing and restarted would read as a reset to rate()). udev mode lists only when an
    # event says the devices changed, and a listing that failed is no listing: it is tried again at the next
    # scrape, not served as a node without devices until the next event or the 15-minute resync.
    standin.errors.add("mlx5_0")
    rdma = collector(tmp_path, standin)
    rdma.inventory.rescan_each_scrape = not udev
    assert errors_of(scrape(rdma), "mlx5_0") == 1
    class_dir = rdma.sys_root / "class" / "infiniband"
    class_dir.rename(class_dir.with_name("infiniband.away"))
    class_dir.write_text("")  # listing it fails with ENOTDIR
    rdma.inventory.mark_dirty()  # the event that makes udev mode list again
    metrics = scrape(rdma)
    assert success_of(metrics, "inventory") == 0
    assert errors_of(metrics, "mlx5_0") == 1
    class_dir.unlink()
    class_dir.with_name("infiniband.away").rename(class_dir)
    assert errors_of(scrape(rdma), "mlx5_0") == 2


def test_a_listing_that_fails_is_logged_once_per_episode(
    tmp_path: Path, standin: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    # A class/infiniband that cannot be listed serves no device: the whole node is unmonitored, and
    # RdmaExporterCollectorFailing's runbook sends the operator to the log. It says so once, with the path
    # and the reason, not every scrape, and once more when the listing works again.
    caplog.set_level(logging.INFO, logger=engine.log.name)
    rdma = collector(tmp_path, standin)
    class_dir = rdma.sys_root / "class" / "infiniband"
    class_dir.rename(class_dir.with_name("infiniband.away"))
    class_dir.write_text("")  # listing it fails with ENOTDIR
    for _ in range(3):
        assert success_of(scrape(rdma), "inventory") == 0
    class_dir.unlink()
    class_dir.with_name("infiniband.away").rename(class_dir)
    assert success_of(scrape(rdma), "inventory") == 1
    assert success_of(scrape(rdma), "inventory") == 1
    logged = [m for m in (r.getMessage() for r in caplog.records) if "list" in m and not m.startswith("RDMA devices ")]
    assert logged == [
        f"cannot list the RDMA devices, none is exported until it works again: {class_dir}: Not a directory",
        f"listing {class_dir} works again",
    ]


def test_a_listing_failing_for_another_reason_is_logged_again(
    tmp_path: Path, standin: StandIn, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # EACCES (a hardened mount) and EIO are different faults with different fixes: the log that said the
    # first must say when the second takes over, once.
    caplog.set_level(logging.INFO, logger=engine.log.name)
    rdma = collector(tmp_path, standin)
    class_dir = rdma.sys_root / "class" / "infiniband"
    real = inventory.list_devices
    failures = [(REASON_PERMISSION, "Permission denied")] * 2 + [(REASON_IO, "Input/output error")] * 2

    def listing(sys_root: Path, reader: SysfsReader) -> list[str]:
        if not failures:
            return real(sys_root, reader)
        reason, detail = failures.pop(0)
        reader.fail(reason, class_dir, detail)
        return []

    monkeypatch.setattr(inventory, "list_devices", listing)
    for _ in range(5):
        scrape(rdma)
    logged = [m for m in (r.getMessage() for r in caplog.records) if "list" in m and not m.startswith("RDMA devices ")]
    assert logged == [
        f"cannot list the RDMA devices, none is exported until it works again: {class_dir}: Permission denied",
        f"cannot list the RDMA devices, none is exported until it works again: {class_dir}: Input/output error",
        f"listing {class_dir} works again",
    ]


def test_a_short_scrape_joining_a_round_drops_no_job_the_long_one_waits_for(
    tmp_path: Path, standin: StandIn
) -> None:
    # One reader thread, and no room for another: mlx5_1's job is queued behind mlx5_0's, held. A short
    # scrape joins the long scrape's round and serves without both; the round's deadline stays the long
    # scrape's, so the short one's end drops nothing, and the long scrape gets mlx5_1 once mlx5_0 answers.
    gate = standin.gates["mlx5_0"] = threading.Event()
    rdma = collector(tmp_path, standin, parallelism=1, hard_max=1)
    longer: list[Samples] = []
    thread = threading.Thread(target=lambda: longer.append(scrape(rdma, 30.0)))
    thread.start()
    try:
        wait_until(lambda: "mlx5_0" in standin.reading, 10)  # the long scrape's round is in flight
        short = scrape(rdma, 0.2)
    finally:
        gate.set()
        thread.join(30)
    assert ("x_value", (("device", "mlx5_1"),)) not in short
    assert longer[0][("x_value", (("device", "mlx5_1"),))] == 1


def test_a_finished_round_is_freed_with_its_scrape_without_the_cyclic_gc(tmp_path: Path, standin: StandIn) -> None:
    # The round holds its jobs; a job that kept the round's callback once called would make every scrape's
    # readings a reference cycle, freed only whenever the cyclic GC next runs. Nor does the collector keep
    # a finished round until the next scrape, out of reach of the clean-up after the answer.
    rdma = collector(tmp_path, standin)
    rounds: list[weakref.ref[Any]] = []
    start_round = rdma._start_round

    def recorded(deadline: float) -> Any:
        started = start_round(deadline)
        rounds.append(weakref.ref(started))
        return started

    rdma._start_round = recorded  # type: ignore[method-assign]
    gc.collect()
    gc.disable()
    try:
        families = rdma.gather()
        # Gone once its scrape had the families (the reader thread that ended its last job may still hold
        # it for a moment after waking the scrape up).
        assert len(rounds) == 1
        wait_until(lambda: rounds[0]() is None)
        assert ("x_value", (("device", "mlx5_0"),)) in samples(families.render_text().decode())
    finally:
        gc.enable()


def test_a_read_still_running_counts_in_its_collectors_duration(tmp_path: Path, standin: StandIn) -> None:
    # A scrape that stops waiting for a read still running counts the time it has run so far: a stuck
    # device shows as a collector that took its whole deadline, not as one that took nothing.
    gate = standin.gates["mlx5_0"] = threading.Event()
    rdma = collector(tmp_path, standin, devices=1)
    thread = threading.Thread(target=lambda: scrape(rdma, 30.0))
    thread.start()
    try:
        wait_until(lambda: "mlx5_0" in standin.reading, 10)
        time.sleep(0.5)  # the read has run 0.5 s before this scrape starts
        metrics = scrape(rdma, 0.3)  # joins the round, whose read began before this scrape did
    finally:
        gate.set()
        thread.join(30)
    assert ("x_value", (("device", "mlx5_0"),)) not in metrics
    # From the read's start, not this scrape's: more than this scrape's own 0.3 s of waiting.
    assert durations_of(metrics)["standin"] >= 0.8


def test_a_skipped_device_is_evaluated_on_the_static_info_its_stuck_job_read(
    tmp_path: Path, standin: StandIn
) -> None:
    # mlx5_1's read is stuck after its job read its static info, and that info has since left the cache (an
    # event, or its age). The next scrape skips the device; an I/O-free source still evaluates it on the info
    # the stuck job read, not as a device whose layout is unknown.
    gate = standin.gates["mlx5_1"] = threading.Event()
    rdma, _ = iofree_collector(tmp_path, standin)
    try:
        scrape(rdma, 0.2)
        wait_until(lambda: "mlx5_1" in standin.reading, 10)
        rdma.inventory.invalidate("mlx5_1")
        metrics = scrape(rdma)
    finally:
        gate.set()
    assert metrics[("rdma_exporter_device_scrape_skipped", (("device", "mlx5_1"),))] == 1
    assert metrics[("x_present", (("device", "mlx5_1"),))] == 1


BLOCKED_MLX5_1 = ("rdma_exporter_device_read_blocked_seconds", (("device", "mlx5_1"), ("reads", "device")))


def scrape_with_mlx5_1_queued_40_s_then_read_60_s(
    rdma: RdmaCollector, standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> Samples:
    """One scrape with a 100 s deadline on one reader thread: mlx5_1's job waits 40 s behind mlx5_0's,
    then its read runs the last 60 s and does not end. The engine's clock moves only when the test says."""
    first = standin.gates["mlx5_0"] = threading.Event()
    standin.gates["mlx5_1"] = threading.Event()
    clock = PausedClock()
    monkeypatch.setattr(engine, "time", clock)
    monkeypatch.setattr(readers, "time", clock)  # the jobs' start times: one clock with the round's
    result: list[Samples] = []
    thread = threading.Thread(target=lambda: result.append(scrape(rdma, 100.0)))
    thread.start()
    wait_until(lambda: "mlx5_0" in standin.reading, 10)
    clock.advance(40.0)  # mlx5_1's job has been queued for 40 s
    first.set()
    wait_until(lambda: "mlx5_1" in standin.reading, 10)
    clock.advance(60.0)  # the scrape's deadline: mlx5_1's read has been running for 60 s
    thread.join(30)
    return result[0]


def test_a_blocked_read_is_timed_from_its_start_not_from_its_submission(
    tmp_path: Path, standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rdma_exporter_device_read_blocked_seconds is how long the read has been running: the time its job
    # spent queued behind another device's job is no part of it.
    rdma = collector(tmp_path, standin, parallelism=1, hard_max=1)
    assert scrape_with_mlx5_1_queued_40_s_then_read_60_s(rdma, standin, monkeypatch)[BLOCKED_MLX5_1] == 60.0


def test_a_scrape_ending_exactly_at_its_deadline_drops_the_jobs_that_never_started(
    tmp_path: Path, standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The deadline is the last moment the scrape waits: assembled at that very instant (the engine's clock
    # moves only when the test says), the round gives up on its jobs, so mlx5_1's, queued behind the stuck
    # mlx5_0 on the one reader thread, is dropped rather than left outstanding for the next scrape to skip.
    standin.gates["mlx5_0"] = threading.Event()
    clock = PausedClock()
    monkeypatch.setattr(engine, "time", clock)
    monkeypatch.setattr(readers, "time", clock)  # the jobs' start times: one clock with the round's
    rdma = collector(tmp_path, standin, parallelism=1, hard_max=1)
    scraper = threading.Thread(target=lambda: scrape(rdma, 10.0))
    scraper.start()
    wait_until(lambda: "mlx5_0" in standin.reading, 10)
    clock.advance(10.0)
    scraper.join(30)
    assert rdma.reads.outstanding() == 1  # mlx5_0's stuck read only


def test_udev_mode_relists_after_a_device_vanished_under_its_read(tmp_path: Path, standin: StandIn) -> None:
    # udev mode lists only on events; a device whose directory is gone by the end of its job was removed
    # under it, so the next scrape lists again even if the remove event never came (netlink drops events).
    gate = standin.gates["mlx5_1"] = threading.Event()
    rdma = collector(tmp_path, standin)
    rdma.inventory.rescan_each_scrape = False
    scraper = threading.Thread(target=lambda: scrape(rdma, 30.0))
    scraper.start()
    try:
        wait_until(lambda: "mlx5_1" in standin.reading, 10)
        (rdma.sys_root / "class" / "infiniband" / "mlx5_1").unlink()
    finally:
        gate.set()
        scraper.join(30)
    metrics = scrape(rdma)
    assert metrics[("rdma_exporter_devices", ())] == 1
    assert ("x_value", (("device", "mlx5_1"),)) not in metrics


def test_a_skipped_device_is_timed_from_its_reads_start_not_from_its_submission(
    tmp_path: Path, standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As above, in the scrape after: mlx5_1's read still runs, so it is skipped, and its blocked seconds
    # still count from when the read began (60 s ago), not from when its job was queued (100 s ago).
    # One thread until mlx5_1 is abandoned, which lets a second in for the next scrape's mlx5_0.
    rdma = collector(tmp_path, standin, parallelism=1, hard_max=2, stuck_after=1000.0)
    scrape_with_mlx5_1_queued_40_s_then_read_60_s(rdma, standin, monkeypatch)
    metrics = scrape(rdma, 100.0)
    assert metrics[("rdma_exporter_device_scrape_skipped", (("device", "mlx5_1"),))] == 1
    assert metrics[BLOCKED_MLX5_1] == 60.0
    standin.release()
    wait_until(lambda: rdma.reads.outstanding() == 0, 10)  # ended on the paused clock
