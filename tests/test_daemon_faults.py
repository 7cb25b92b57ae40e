"""Fault injection on generated sysfs trees: reads that block forever, fail with EIO, lose their device or
see their files change mid-scrape. The scrape returns within its deadline, every other device's values
are right, the failures are counted, and a blocked device never holds more than one thread."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from rdma_exporter.collect import readers
from rdma_exporter.collect.base import DynamicMetricSpec, FamilySet, MetricSpec, ScrapeContext, Source
from rdma_exporter.collect.engine import RdmaCollector, _Round
from rdma_exporter.collect.readers import DeviceJob, DeviceReads, WorkerPool
from rdma_exporter.config import Config
from rdma_exporter.daemon import Daemon, ReloadRequests, build_collector, build_registry, build_sources
from rdma_exporter.parse.infiniband import DeviceInfo
from rdma_exporter.parse.reader import FileBudget, OpenFiles, SysfsReader
from rdma_exporter.sample_tree import SAMPLE_SPEC, build_tree, spec_for_devices

from conftest import RefusingReads, Took, prometheus_text, refuse_reload_thread_starts, samples, timed, wait_until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def device_dir(root: Path, device: str) -> Path:
    """The real directory behind class/infiniband/<device> (a kernfs-style symlink)."""
    return (root / "class" / "infiniband" / device).resolve()


class Fifos:
    """FIFOs standing in for attribute files whose read blocks in the kernel; unblocked at teardown."""

    def __init__(self) -> None:
        self.paths: list[Path] = []
        self.held: dict[Path, int] = {}

    def opened_at(self, path: Path) -> list[float]:
        """When a reader opens the FIFO `path` (appended by a thread, no earlier than the open). The thread
        keeps a write end open, so the read stays blocked until `release`."""
        when: list[float] = []

        def hold() -> None:
            self.held[path] = os.open(path, os.O_WRONLY)  # returns once a reader has opened the FIFO
            when.append(time.monotonic())

        threading.Thread(target=hold, daemon=True).start()
        return when

    def make(self, path: Path) -> Path:
        path.unlink()
        os.mkfifo(path)
        self.paths.append(path)
        return path

    def release(self, path: Path, value: bytes = b"") -> None:
        """Answer the reader blocked on `path` (if any), then turn it into a regular file."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody is reading; ENOENT: removed by the test
            pass
        else:
            os.write(fd, value)
            os.close(fd)
        if path in self.held:
            os.close(self.held.pop(path))
        if path.exists():
            path.unlink()
            path.write_bytes(value or b"0\n")

    def answer_when_read(self, path: Path, value: bytes, meanwhile: Callable[[], None]) -> threading.Thread:
        """A thread that waits until a scrape reads the FIFO `path`, runs `meanwhile`, then answers `value`."""

        def answer() -> None:
            fd = os.open(path, os.O_WRONLY)  # returns once a reader has opened the FIFO
            try:
                meanwhile()
                os.write(fd, value)
            finally:
                os.close(fd)

        thread = threading.Thread(target=answer)
        thread.start()
        return thread

    def release_all(self) -> None:
        for path in self.paths:
            with contextlib.suppress(OSError):  # a thread of opened_at still waiting for a reader
                os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
            self.release(path)


@pytest.fixture
def fifos() -> Iterator[Fifos]:
    made = Fifos()
    yield made
    made.release_all()


def settled(reads: DeviceReads) -> bool:
    """No job outstanding and no abandoned one still running. A job stops being outstanding before it logs
    how long its blocked read took, so a test that stopped at outstanding() == 0 could leave that line to
    land in the next test's caplog (it broke a reload test's exact log once, on a loaded CI machine)."""
    return reads.outstanding() == 0 and reads.pool.abandoned == 0


def make_tree(tmp_path: Path, devices: int, name: str = "t") -> Path:
    return build_tree(tmp_path / name, spec_for_devices(devices))


def collector_for(root: Path, timeout: float, reads: DeviceReads | None = None) -> RdmaCollector:
    config = replace(Config(), sysfs=root, scrape_timeout=timeout)
    return build_collector(config, reads=reads or DeviceReads(WorkerPool(parallelism=4, hard_max=8)))


def udev_collector_with_clock(tmp_path: Path) -> tuple[Path, RdmaCollector, list[float]]:
    """A 2-device tree scraped in udev mode (static info kept between scrapes), with a clock the test sets."""
    root = make_tree(tmp_path, 2)
    collector = collector_for(root, 5.0)
    collector.inventory.rescan_each_scrape = False
    now = [1000.0]
    collector.inventory._clock = lambda: now[0]
    return root, collector, now


def timed_scrape(collector: RdmaCollector) -> tuple[Samples, Took]:
    with timed() as took:
        text = generate_latest(build_registry(collector)).decode()
    return samples(text), took[0]


def value(metrics: Samples, name: str, **labels: str) -> float | None:
    return metrics.get((name, tuple(sorted(labels.items()))))


def device_series(metrics: Samples, device: str) -> Samples:
    """The device's own series (not the exporter's self-monitoring)."""
    return {
        key: v
        for key, v in metrics.items()
        if not key[0].startswith("rdma_exporter_") and ("device", device) in key[1]
    }


def pcie_series(metrics: Samples, device: str) -> Samples:
    return {key: v for key, v in device_series(metrics, device).items() if key[0].startswith("rdma_pcie_")}


def baseline(tmp_path: Path, devices: int) -> Samples:
    """A scrape of an identical, untouched tree (the generator is deterministic)."""
    root = make_tree(tmp_path, devices, "baseline")
    return timed_scrape(collector_for(root, 8.0))[0]


def sources_of(collector: RdmaCollector) -> list[str]:
    return [source.name for source in collector.sources]


def daemon_with_a_fifo(tmp_path: Path, fifos: Fifos, scrape_timeout: float) -> tuple[Daemon, Path]:
    """A daemon on a 2-device tree whose mlx5_1 port_rcv_data is a FIFO, reloaded with its own config."""
    root = make_tree(tmp_path, 2)
    fifo = fifos.make(device_dir(root, "mlx5_1") / "ports" / "1" / "counters" / "port_rcv_data")
    config = replace(Config(), sysfs=root, listen_address="127.0.0.1:0", scrape_timeout=scrape_timeout)
    return Daemon(config, reload=lambda: config), fifo


def assert_read_in_full(got: Samples) -> None:
    """mlx5_1's slow read (a FIFO answering 1000, four bytes a unit) was waited for, not taken for blocked."""
    assert value(got, "rdma_port_receive_data_bytes_total", device="mlx5_1", port="1") == 4000
    assert value(got, "rdma_exporter_device_scrape_skipped", device="mlx5_1") is None
    assert value(got, "rdma_exporter_file_read_errors_total", collector="infiniband", device="mlx5_1",
                 reason="timeout") is None  # fmt: skip


def test_a_reload_lets_the_scrape_in_flight_end_before_the_new_collector_serves(
    tmp_path: Path, fifos: Fifos
) -> None:
    """A SIGHUP during a slow scrape (firmware taking seconds): the new collector shares the reads, and its
    first scrape took the old round's unfinished job for a read blocked since an earlier scrape. A healthy
    device was skipped, a timeout counted and a stall logged (review, reproduced with a FIFO)."""
    daemon, fifo = daemon_with_a_fifo(tmp_path, fifos, scrape_timeout=20.0)
    try:
        first: list[Samples] = []
        opened = fifos.opened_at(fifo)
        old = daemon.exporter.serving.collector
        scrape = threading.Thread(target=lambda: first.append(timed_scrape(old)[0]))
        scrape.start()
        wait_until(lambda: bool(opened))
        reloaded: list[bool] = []
        reload = threading.Thread(target=lambda: reloaded.append(daemon.reload()))
        reload.start()
        reload.join(0.5)
        # A scrape that comes meanwhile (Prometheus does not wait for reloads) is served by whichever
        # collector serves now: it must not be the new one over the old round's blocked read.
        during: list[Samples] = []
        meanwhile = threading.Thread(target=lambda: during.append(timed_scrape(daemon.exporter.serving.collector)[0]))
        meanwhile.start()
        time.sleep(0.3)
        assert reload.is_alive(), "the reload did not wait for the scrape in flight"
        fifos.release(fifo, b"1000\n")
        reload.join(20)
        scrape.join(20)
        meanwhile.join(20)
        assert reloaded == [True] and daemon.exporter.serving.collector is not old
        second, _ = timed_scrape(daemon.exporter.serving.collector)
        for got in (first[0], during[0], second):
            assert_read_in_full(got)
    finally:
        daemon.server.shutdown(grace=0)
        if daemon.hotplug is not None:
            daemon.hotplug.stop()


def test_blocked_counter_times_out_skips_and_recovers(tmp_path: Path, fifos: Fifos) -> None:
    root = make_tree(tmp_path, 4)
    expected = baseline(tmp_path, 4)
    fifo = fifos.make(device_dir(root, "mlx5_1") / "ports" / "1" / "counters" / "port_rcv_data")
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8))
    collector = collector_for(root, 1.0, reads)
    fifo_opened = fifos.opened_at(fifo)

    started = time.monotonic()
    first, took = timed_scrape(collector)
    assert took.wall >= 0.9 and took.scheduled < 1.6, f"the scrape took {took} with a 1 s deadline"
    for source in sources_of(collector):
        # The device's job stopped in its infiniband source; the sources after it never ran either. Its
        # PCIe link, which needs no firmware, was read first.
        timeouts = value(first, "rdma_exporter_file_read_errors_total", collector=source, device="mlx5_1",
                         reason="timeout")
        assert value(first, "rdma_exporter_scrape_collector_success", collector=source) == (source == "pcie")
        assert timeouts == (None if source == "pcie" else 1), source
    # Blocked since the device's job started, which was no later than its read of the FIFO: at least from
    # then to the deadline. (Not simply 0.9 s: on a loaded machine the job can start well after the scrape.)
    assert fifo_opened
    blocked_since_read = started + 1.0 - fifo_opened[0]
    blocked = value(first, "rdma_exporter_device_read_blocked_seconds", device="mlx5_1", reads="device")
    assert blocked >= blocked_since_read - 0.001
    assert value(first, "rdma_exporter_device_scrape_skipped", device="mlx5_1") is None
    assert value(first, "rdma_exporter_devices") == 4
    for device in ("mlx5_0", "mlx5_2", "mlx5_3"):
        assert device_series(first, device) == device_series(expected, device), device
    pcie = pcie_series(expected, "mlx5_1")
    assert pcie and device_series(first, "mlx5_1") == pcie

    # While the read is stuck, scrapes do not wait for it, do not start another, and say so; a side job
    # reads the PCIe link of the device each scrape.
    threads_before = threading.active_count()
    for _ in range(20):
        again, took = timed_scrape(collector)
        assert took.scheduled < 0.5, f"a scrape took {took} with a device known to be blocked"
        assert device_series(again, "mlx5_1") == pcie
        wait_until(lambda: reads.outstanding() == 1)  # the side job has ended
    assert value(again, "rdma_exporter_device_scrape_skipped", device="mlx5_1") == 1
    assert value(again, "rdma_exporter_file_read_errors_total", collector="infiniband", device="mlx5_1",
                 reason="timeout") == 21
    assert value(again, "rdma_exporter_file_read_errors_total", collector="pcie", device="mlx5_1",
                 reason="timeout") is None
    assert value(again, "rdma_exporter_scrape_collector_success", collector="pcie") == 1
    # Blocked since the stuck job started, not since this scrape's side job.
    assert value(again, "rdma_exporter_device_read_blocked_seconds", device="mlx5_1", reads="device") > blocked
    assert reads.pool.threads <= 4 + 1
    assert threading.active_count() <= threads_before + 1
    for device in ("mlx5_0", "mlx5_2", "mlx5_3"):
        assert device_series(again, device) == device_series(expected, device), device

    # The firmware answers: the blocked read completes and the device is served again.
    fifos.release(fifo, b"1000\n")
    wait_until(lambda: settled(reads))
    healed, _ = timed_scrape(collector)
    assert value(healed, "rdma_exporter_scrape_collector_success", collector="infiniband") == 1
    assert value(healed, "rdma_exporter_device_scrape_skipped", device="mlx5_1") is None
    assert value(healed, "rdma_port_receive_data_bytes_total", device="mlx5_1", port="1") == 4000


def test_a_device_slow_on_every_scrape_is_logged_once_with_what_it_was_reading(
    tmp_path: Path, fifos: Fifos, caplog: pytest.LogCaptureFixture
) -> None:
    """Firmware that answers a little after every deadline: each scrape is a new episode, and the log had
    a "no answer" and a "returned" warning per scrape, naming neither the file nor the collector (log
    review: 40 lines in 40 scrapes)."""
    root = make_tree(tmp_path, 2)
    path = device_dir(root, "mlx5_1") / "ports" / "1" / "counters" / "port_rcv_data"
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8), FileBudget(0))  # each scrape opens the file anew
    collector = collector_for(root, 0.5, reads)
    caplog.set_level(logging.DEBUG, logger="rdma_exporter")
    for _ in range(3):
        fifo = fifos.make(path)
        scraped, _ = timed_scrape(collector)
        assert value(scraped, "rdma_exporter_device_read_blocked_seconds", device="mlx5_1", reads="device")
        fifos.release(fifo, b"1\n")
        wait_until(lambda: settled(reads))
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith("device mlx5_1:")]
    warnings = [message for level, message in lines if level == logging.WARNING]
    assert len(warnings) == 2, lines
    assert warnings[0].startswith("device mlx5_1: no answer before the scrape deadline (read running for ")
    # The file it is stuck on too (fault-injection review: only the collector was named).
    at = f"{root}/class/infiniband/mlx5_1/ports/1/counters/port_rcv_data"
    assert warnings[0].endswith(f", in its infiniband files, at {at}; not logged again for 10 minutes)")
    assert warnings[1].startswith("device mlx5_1: blocked read returned after ")
    # The later episodes are still there for whoever turns debug on.
    assert sum(message.startswith("device mlx5_1: blocked read returned") for _, message in lines) == 3


def stall_lines(caplog: pytest.LogCaptureFixture, device: str) -> list[str]:
    """The device's log lines from its first "no answer before the scrape deadline" on: the jobs of an
    earlier test's stalls may end (and say so) meanwhile."""
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"device {device}: ")]
    starts = [n for n, line in enumerate(lines) if line.startswith(f"device {device}: no answer before the scrape")]
    return lines[starts[0]:] if starts else lines


def test_a_scrape_that_took_the_old_collector_before_a_reload_gathers_from_the_new_one(
    tmp_path: Path, fifos: Fifos
) -> None:
    """A request reads the serving collector when it starts, then checks its login (a bcrypt hash, about
    0.25 s): a reload in that time left it gathering on the retired collector, whose new round's jobs the
    new collector's scrapes took for blocked reads. A healthy but slow device was skipped, a timeout counted
    and its series dropped for a scrape (review, reproduced with a FIFO and basic auth)."""
    daemon, fifo = daemon_with_a_fifo(tmp_path, fifos, scrape_timeout=20.0)
    try:
        old = daemon.exporter.serving.collector
        assert daemon.reload()
        new = daemon.exporter.serving.collector
        assert new is not old
        late: list[Samples] = []
        opened = fifos.opened_at(fifo)
        request = threading.Thread(target=lambda: late.append(timed_scrape(old)[0]))
        request.start()
        wait_until(lambda: bool(opened))
        current: list[Samples] = []
        scrape = threading.Thread(target=lambda: current.append(timed_scrape(new)[0]))
        scrape.start()
        time.sleep(0.3)
        fifos.release(fifo, b"1000\n")
        request.join(20)
        scrape.join(20)
        for got in (late[0], current[0]):
            assert_read_in_full(got)
    finally:
        daemon.server.shutdown(grace=0)
        if daemon.hotplug is not None:
            daemon.hotplug.stop()


def test_uevents_reach_the_collector_that_starts_rounds_while_a_reload_waits(
    tmp_path: Path, fifos: Fifos, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a reload waits for the round in flight, new rounds are the new collector's, which lists for
    them: the uevents of that time must reach its inventory. Sent to the serving (old) one, a device
    removed then stayed listed by the new collector until the next event or the 15-minute resync (diff
    review, reproduced with apply_event)."""
    inventories: list[Callable[[], object]] = []

    def monitor(sys_root: Path, inventory: Callable[[], object], **_: object) -> tuple[None, str]:
        inventories.append(inventory)  # the getter the uevent monitor would apply each event to
        return None, "rescan (test)"

    monkeypatch.setattr("rdma_exporter.daemon.start_monitor", monitor)
    daemon, fifo = daemon_with_a_fifo(tmp_path, fifos, scrape_timeout=20.0)
    try:
        (events_to,) = inventories
        old = daemon.exporter.serving.collector
        assert events_to() is old.inventory
        opened = fifos.opened_at(fifo)
        scrape = threading.Thread(target=lambda: timed_scrape(old))
        scrape.start()
        wait_until(lambda: bool(opened))
        reload = threading.Thread(target=daemon.reload)
        reload.start()
        # The reload is in its wait for the round in flight: new rounds and uevents go to the new collector.
        wait_until(lambda: events_to() is not old.inventory)
        assert reload.is_alive() and daemon.exporter.serving.collector is old
        fifos.release(fifo, b"1000\n")
        reload.join(20)
        scrape.join(20)
        assert events_to() is daemon.exporter.serving.collector.inventory
    finally:
        daemon.server.shutdown(grace=0)


def test_collectors_retired_while_a_read_hangs_are_not_kept_alive(tmp_path: Path, fifos: Fifos) -> None:
    """A retired collector hands its new rounds to the newest one. Holding its successor itself, each one
    retired while a job of the first hung kept the next alive, a reload after reload, for as long as the
    hang lasts (diff review: 21 collectors alive after 20 reloads)."""
    daemon, fifo = daemon_with_a_fifo(tmp_path, fifos, scrape_timeout=0.3)
    try:
        first = daemon.exporter.serving.collector
        opened = fifos.opened_at(fifo)
        timed_scrape(first)  # its job for mlx5_1 hangs past the deadline, holding the first collector
        assert opened
        retired = []
        for _ in range(3):
            assert daemon.reload()
            retired.append(weakref.ref(daemon.exporter.serving.collector))
        del retired[-1]  # the serving one
        gc.collect()
        assert [ref() for ref in retired] == [None, None]
    finally:
        fifos.release(fifo, b"1000\n")
        wait_until(lambda: settled(daemon.reads), timeout=10)
        daemon.server.shutdown(grace=0)


def test_a_stuck_device_is_not_logged_again_by_each_reload(
    tmp_path: Path, fifos: Fifos, caplog: pytest.LogCaptureFixture
) -> None:
    """Each reload builds a new collector over the process's reads: what the log had said of a stuck HCA
    went with the old one, and 20 reloads said its "not logged again for 10 minutes" 20 times (review)."""
    root = make_tree(tmp_path, 2)
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8))
    caplog.set_level(logging.WARNING, logger="rdma_exporter")
    fifo = fifos.make(device_dir(root, "mlx5_1") / "ports" / "1" / "counters" / "port_rcv_data")
    for _ in range(6):
        scraped, _ = timed_scrape(collector_for(root, 0.5, reads))
        assert value(scraped, "rdma_exporter_device_read_blocked_seconds", device="mlx5_1", reads="device")
    fifos.release(fifo, b"1\n")
    wait_until(lambda: settled(reads))
    # settled(): the end is logged by now.
    warnings = stall_lines(caplog, "mlx5_1")
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("device mlx5_1: no answer before the scrape deadline"), warnings
    assert warnings[1].startswith("device mlx5_1: blocked read returned after "), warnings


def test_a_hang_after_a_slow_episode_is_logged_once_it_is_a_hang(
    tmp_path: Path, fifos: Fifos, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quiet period after a slow read's lines must not hide the stuck HCA that follows: it was never
    logged, not even when the quiet period ended, as its episode had begun inside it (final review)."""
    monkeypatch.setattr(readers, "HUNG_READ_SECONDS", 1.0)
    root = make_tree(tmp_path, 2)
    path = device_dir(root, "mlx5_1") / "ports" / "1" / "counters" / "port_rcv_data"
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8), FileBudget(0))
    collector = collector_for(root, 0.3, reads)
    caplog.set_level(logging.WARNING, logger="rdma_exporter")
    fifo = fifos.make(path)
    timed_scrape(collector)  # slow: answers after the deadline
    fifos.release(fifo, b"1\n")
    wait_until(lambda: settled(reads))
    fifo = fifos.make(path)  # now it hangs
    end = time.monotonic() + 1.6
    while time.monotonic() < end:
        timed_scrape(collector)
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("device mlx5_1: ")]
    assert len(warnings) == 3, warnings  # the slow episode's two lines, and the hang
    assert "still blocked" in warnings[2] or "no answer" in warnings[2], warnings
    fifos.release(fifo, b"1\n")
    wait_until(lambda: settled(reads))
    # Its return is a hang's too: logged, though within the quiet period of the slow read's.
    last = caplog.records[-1]
    assert (last.levelno, last.getMessage()[:43]) == (logging.WARNING, "device mlx5_1: blocked read returned after ")


def test_device_stuck_after_a_healthy_scrape_serves_none_of_its_old_values(tmp_path: Path, fifos: Fifos) -> None:
    # A stuck HCA frozen at its last counters would look healthy and idle to every rate() alert. After a
    # healthy scrape its files are kept open and its round is cached: neither may answer for it now. Only
    # its PCIe link, which needs no firmware, is read, and read anew.
    root = make_tree(tmp_path, 3)
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8))
    collector = collector_for(root, 1.0, reads)
    healthy, _ = timed_scrape(collector)
    assert value(healthy, "rdma_port_receive_data_bytes_total", device="mlx5_1", port="1") is not None
    assert value(healthy, "rdma_pcie_link_width_lanes", device="mlx5_1") == 16
    fifo = fifos.make(device_dir(root, "mlx5_1") / "ports" / "1" / "counters" / "port_rcv_data")
    ((device_dir(root, "mlx5_1") / "device").resolve() / "current_link_width").write_text("8\n")
    pcie = pcie_series(healthy, "mlx5_1")
    pcie[("rdma_pcie_link_width_lanes", (("device", "mlx5_1"),))] = 8

    timed_out, took = timed_scrape(collector)
    skipped, _ = timed_scrape(collector)
    for metrics in (timed_out, skipped):
        assert device_series(metrics, "mlx5_1") == pcie
        assert value(metrics, "rdma_exporter_scrape_collector_success", collector="infiniband") == 0
        blocked = value(metrics, "rdma_exporter_device_read_blocked_seconds", device="mlx5_1", reads="device")
        assert blocked is not None
        assert value(metrics, "rdma_exporter_devices") == 3
        for device in ("mlx5_0", "mlx5_2"):
            assert device_series(metrics, device) == device_series(healthy, device), device
    assert took.wall >= 0.9 and took.scheduled < 1.6, f"the scrape took {took} with a 1 s deadline"
    assert value(timed_out, "rdma_exporter_device_scrape_skipped", device="mlx5_1") is None
    assert value(skipped, "rdma_exporter_device_scrape_skipped", device="mlx5_1") == 1
    timeouts = {"collector": "infiniband", "device": "mlx5_1", "reason": "timeout"}
    assert value(skipped, "rdma_exporter_file_read_errors_total", **timeouts) == 2

    # The firmware answers: the device is served again, with the new value.
    fifos.release(fifo, b"1000\n")
    wait_until(lambda: settled(reads))
    healed, _ = timed_scrape(collector)
    assert value(healed, "rdma_port_receive_data_bytes_total", device="mlx5_1", port="1") == 4000


def rtnl_series(metrics: Samples, device: str) -> tuple[Samples, Samples]:
    """The device's own series split in two: those of the sources that wait for rtnl (netdev, ethtool),
    and the others (InfiniBand, PCIe, static info)."""
    own = device_series(metrics, device)
    netdev = {key: v for key, v in own.items() if key[0].startswith(("rdma_netdev_", "rdma_ethtool_"))}
    return netdev, {key: v for key, v in own.items() if key not in netdev}


def sample_collector(dest: Path, timeout: float, reads: DeviceReads | None = None) -> tuple[Path, RdmaCollector]:
    """The full sample tree (IB and RoCE HCAs) with its ethtool captures, so that every source reads."""
    root = build_tree(dest, SAMPLE_SPEC)
    config = replace(Config(), sysfs=root, ethtool_dir=dest / "ethtool", scrape_timeout=timeout)
    return root, build_collector(config, reads=reads or DeviceReads(WorkerPool(parallelism=4, hard_max=8)))


def netdev_file(root: Path, netdev: str, name: str) -> Path:
    return (root / "class" / "net" / netdev).resolve() / name


# The sample tree's mlx5_0 is an InfiniBand HCA (IPoIB ibp24s0), its mlx5_8 a RoCE one.
STALLED_NETDEVS = {"mlx5_0": "ibp24s0", "mlx5_8": "enp220s0f0np0"}


def test_a_counter_the_device_refuses_stays_unsupported_beside_a_stalled_netdev_read(
    tmp_path: Path, fifos: Fifos, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The device-only job that reads a device beside one stuck on rtnl keeps no files, but knows what the
    # kept ones know: a counter the device refuses stays left out and unsupported, not a failed firmware
    # command and an `io` error on every scrape of the stall.
    root, collector = sample_collector(tmp_path / "t", 1.5, DeviceReads(WorkerPool(parallelism=4, hard_max=8)))
    refusing = RefusingReads(monkeypatch)
    refusing.refused = {"mlx5_8/ports/1/counters/symbol_error"}
    timed_scrape(collector)
    fifos.make(netdev_file(root, STALLED_NETDEVS["mlx5_8"], "speed"))
    for _ in range(4):
        metrics, _ = timed_scrape(collector)
        errors = {reason: value(metrics, "rdma_exporter_file_read_errors_total", collector="infiniband",
                                device="mlx5_8", reason=reason) for reason in ("unsupported", "io")}  # fmt: skip
        assert errors == {"unsupported": 1, "io": None}
    assert value(metrics, "rdma_exporter_device_read_blocked_seconds", device="mlx5_8", reads="netdev") is not None
    assert refusing.attempts == {"mlx5_8/ports/1/counters/symbol_error": 1}


def test_a_roce_lag_device_keeps_its_infiniband_series_while_its_bonds_slave_list_waits_for_rtnl(
    tmp_path: Path, fifos: Fifos
) -> None:
    # bonding/slaves takes the rtnl lock too. The device's static info names the bond's slaves from the
    # lower_* links instead, so a stall from the first scrape on (or during a static re-read) costs only
    # the netdev series, read after the device's own (before, the static read blocked, and the LAG
    # device's port state and counters vanished with it).
    from test_collect_roce import _bond, _function

    root = tmp_path / "t"
    _function(root, "0000:3b:00.0", "ens1f0np0", "mlx5_bond_0", ["bond0", "bond0"])
    _function(root, "0000:3b:00.1", "ens1f1np1", None, [])
    _bond(root, "bond0", ["ens1f0np0", "ens1f1np1"])
    fifos.make(root / "devices/virtual/net/bond0/bonding/slaves")
    collector = collector_for(root, 1.5)
    for attempt in range(3):
        metrics, _ = timed_scrape(collector)
        port = {"device": "mlx5_bond_0", "port": "1"}
        assert value(metrics, "rdma_port_state", **port, state="ACTIVE") == 1, attempt
        assert value(metrics, "rdma_port_receive_data_bytes_total", **port) == 4, attempt
        assert value(metrics, "rdma_exporter_device_read_blocked_seconds", device="mlx5_bond_0", reads="device") is None
    assert value(metrics, "rdma_exporter_device_read_blocked_seconds", device="mlx5_bond_0", reads="netdev") is not None


def test_a_device_recreated_during_an_rtnl_stall_starts_without_the_old_devices_answers(
    tmp_path: Path, fifos: Fifos, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A driver reload takes rtnl, so the device's full job may sit in a netdev read while the device is
    # re-created: the device-only job beside it then reads (and caches) the new device's static info. What
    # the old firmware answered must not judge the new one's refusals there, nor in the full jobs after it
    # (review: the record was reset only when a full job read static info, which then never came).
    root, collector = sample_collector(tmp_path / "t", 1.5)
    timed_scrape(collector)
    fifos.make(netdev_file(root, STALLED_NETDEVS["mlx5_8"], "speed"))
    timed_scrape(collector)  # the full job blocks in its netdev reads
    real = (root / "class" / "infiniband" / "mlx5_8").resolve()
    shutil.copytree(real, real.with_name("new"), symlinks=True)
    shutil.rmtree(real)
    real.with_name("new").rename(real)
    refusing = RefusingReads(monkeypatch)
    refusing.refused = {"mlx5_8/ports/1/counters/symbol_error"}
    metrics, _ = timed_scrape(collector)
    errors = {reason: value(metrics, "rdma_exporter_file_read_errors_total", collector="infiniband",
                            device="mlx5_8", reason=reason) for reason in ("unsupported", "io")}  # fmt: skip
    assert errors == {"unsupported": 1, "io": None}
    assert value(metrics, "rdma_exporter_device_read_blocked_seconds", device="mlx5_8", reads="netdev") is not None


def test_a_netdev_read_stalled_on_rtnl_costs_only_that_devices_netdev_series(tmp_path: Path, fifos: Fifos) -> None:
    # class/net attributes such as speed (and the ethtool ioctl) wait in the kernel for the rtnl lock,
    # which another NIC's driver or a busy node can hold for minutes. The HCA's own reads need no rtnl:
    # its port state and counters must keep coming, and it must not be reported as hung (review: every
    # scrape after the first lost all of the device and paged RdmaDeviceUnresponsive).
    _, expected = sample_collector(tmp_path / "baseline", 8.0)
    healthy, _ = timed_scrape(expected)
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8))
    root, collector = sample_collector(tmp_path / "t", 1.5, reads)
    speeds = {netdev_file(root, netdev, "speed"): b"" for netdev in STALLED_NETDEVS.values()}
    for path in speeds:
        speeds[path] = path.read_bytes()
        fifos.make(path)

    for attempt in range(4):  # the scrape whose jobs block in the netdev reads, then scrapes beside them
        metrics, took = timed_scrape(collector)
        if attempt:
            assert took.scheduled < 1.0, f"scrape {attempt} took {took} beside reads known to be blocked"
        assert value(metrics, "rdma_exporter_devices") == 10
        for device in STALLED_NETDEVS:
            netdev, others = rtnl_series(metrics, device)
            assert netdev == {}, (attempt, device)
            assert others == rtnl_series(healthy, device)[1], (attempt, device)
            assert value(metrics, "rdma_port_state_id", device=device, port="1") == 4
            assert value(metrics, "rdma_exporter_device_scrape_skipped", device=device) is None
            assert value(metrics, "rdma_exporter_device_read_blocked_seconds", device=device, reads="device") is None
            assert value(metrics, "rdma_exporter_device_read_blocked_seconds", device=device, reads="netdev") > 0
            for source in ("netdev", "ethtool"):
                timeouts = {"collector": source, "device": device, "reason": "timeout"}
                assert value(metrics, "rdma_exporter_file_read_errors_total", **timeouts) == attempt + 1
            for source in ("infiniband", "pcie"):
                timeouts = {"collector": source, "device": device, "reason": "timeout"}
                assert value(metrics, "rdma_exporter_file_read_errors_total", **timeouts) is None
        for device in ("mlx5_1", "mlx5_7", "mlx5_9"):
            assert device_series(metrics, device) == device_series(healthy, device), (attempt, device)
        blocked = [labels for name, labels in metrics if name == "rdma_exporter_device_read_blocked_seconds"]
        assert len(blocked) == 2, blocked
        for source, ok in (("infiniband", 1), ("pcie", 1), ("netdev", 0), ("ethtool", 0)):
            assert value(metrics, "rdma_exporter_scrape_collector_success", collector=source) == ok, source
        # Each stalled device holds its one blocked job; the device-only jobs beside them have ended.
        wait_until(lambda: reads.outstanding() == 2)

    # The rtnl holder lets go: the blocked reads complete and the netdev series come back.
    for path, speed in speeds.items():
        fifos.release(path, speed)
    wait_until(lambda: settled(reads))
    healed, _ = timed_scrape(collector)
    for device in STALLED_NETDEVS:
        assert device_series(healed, device) == device_series(healthy, device), device
    assert not [k for k in healed if k[0].startswith("rdma_exporter_device_")]
    for source in ("infiniband", "pcie", "netdev", "ethtool"):
        assert value(healed, "rdma_exporter_scrape_collector_success", collector=source) == 1, source


def test_a_device_read_stalled_beside_a_stalled_netdev_read_skips_the_device(tmp_path: Path, fifos: Fifos) -> None:
    # The device-only job beside a job stuck on rtnl blocks too (the firmware hangs as well): the device
    # is skipped and reported blocked as a whole, as any stuck device, and holds no third thread.
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8))
    root, collector = sample_collector(tmp_path / "t", 1.0, reads)
    fifos.make(netdev_file(root, "enp220s0f0np0", "speed"))
    first, _ = timed_scrape(collector)
    assert value(first, "rdma_exporter_device_read_blocked_seconds", device="mlx5_8", reads="netdev") is not None
    fifos.make(device_dir(root, "mlx5_8") / "ports" / "1" / "counters" / "port_rcv_data")

    timed_out, took = timed_scrape(collector)
    assert took.wall >= 0.9, took  # waited for the device-only job
    skipped, _ = timed_scrape(collector)
    # The device-only job read the PCIe link before it stuck; then it is the device's one side job.
    assert device_series(timed_out, "mlx5_8") == pcie_series(first, "mlx5_8") != {}
    assert device_series(skipped, "mlx5_8") == {}
    for metrics in (timed_out, skipped):
        assert value(metrics, "rdma_exporter_device_read_blocked_seconds", device="mlx5_8", reads="device") > 0
        assert value(metrics, "rdma_exporter_device_read_blocked_seconds", device="mlx5_8", reads="netdev") is None
        assert value(metrics, "rdma_exporter_scrape_collector_success", collector="infiniband") == 0
    assert value(timed_out, "rdma_exporter_device_scrape_skipped", device="mlx5_8") is None
    assert value(skipped, "rdma_exporter_device_scrape_skipped", device="mlx5_8") == 1
    for _ in range(5):
        timed_scrape(collector)
    assert reads.outstanding() == 2  # the job stuck on rtnl and the device-only job stuck in firmware


def test_a_pcie_read_stalled_beside_a_firmware_stall_skips_the_device_from_the_first_stall(
    tmp_path: Path, fifos: Fifos, caplog: pytest.LogCaptureFixture
) -> None:
    # The side job beside a job stuck in firmware blocks too (the PCIe read hangs as well): the device is
    # skipped, with no third job, and blocked since its first stall, not since the side job began.
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8))
    root, collector = sample_collector(tmp_path / "t", 1.0, reads)
    caplog.set_level(logging.WARNING, logger="rdma_exporter")
    counter = fifos.make(device_dir(root, "mlx5_8") / "ports" / "1" / "counters" / "port_rcv_data")
    first, _ = timed_scrape(collector)
    assert pcie_series(first, "mlx5_8") != {}
    speed = fifos.make((device_dir(root, "mlx5_8") / "device").resolve() / "current_link_speed")

    timed_out, took = timed_scrape(collector)
    assert took.wall >= 0.9, took  # waited for the side job
    skipped = [timed_scrape(collector)[0] for _ in range(3)]
    blocked = [
        value(metrics, "rdma_exporter_device_read_blocked_seconds", device="mlx5_8", reads="device")
        for metrics in (first, timed_out, *skipped)
    ]
    assert blocked == sorted(blocked) and blocked[1] > 1.8, blocked
    for metrics in (timed_out, *skipped):
        assert device_series(metrics, "mlx5_8") == {}
        assert value(metrics, "rdma_exporter_device_scrape_skipped", device="mlx5_8") == 1
        assert value(metrics, "rdma_exporter_scrape_collector_success", collector="pcie") == 0
    assert reads.outstanding() == 2  # the job stuck in firmware and the side job stuck in the PCIe read

    # The PCIe read returns first: the device's stall goes on, and the log does not say it ended (review:
    # it did, and the real end then fell in that line's quiet period and went to debug).
    fifos.release(speed, b"16.0 GT/s PCIe\n")
    wait_until(lambda: reads.outstanding() == 1)
    assert [line for line in stall_lines(caplog, "mlx5_8") if "returned" in line] == []
    fifos.release(counter, b"0\n")
    wait_until(lambda: settled(reads))
    ended = [line for line in stall_lines(caplog, "mlx5_8") if "returned" in line]
    assert len(ended) == 1 and ended[0].startswith("device mlx5_8: blocked read returned after "), ended


def test_a_device_read_stalled_first_is_not_a_netdev_stall(tmp_path: Path, fifos: Fifos) -> None:
    # A stuck InfiniBand read (or PCIe read) holds up the device as before: its netdev reads, which come
    # after them, are not started, and the device is blocked as a whole, not in its netdev reads; but for
    # its PCIe link, read first as it needs no firmware, and read beside the stuck InfiniBand read.
    _, expected = sample_collector(tmp_path / "baseline", 8.0)
    pcie = pcie_series(timed_scrape(expected)[0], "mlx5_8")
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8))
    root, collector = sample_collector(tmp_path / "t", 1.0, reads)
    fifos.make(device_dir(root, "mlx5_8") / "ports" / "1" / "counters" / "port_rcv_data")
    fifos.make((device_dir(root, "mlx5_1") / "device").resolve() / "current_link_speed")
    metrics = [timed_scrape(collector)[0] for _ in range(3)]
    for attempt, scraped in enumerate(metrics):
        assert device_series(scraped, "mlx5_1") == {}, attempt  # its PCIe read, the first, is stuck
        assert device_series(scraped, "mlx5_8") == pcie != {}, attempt
        for device in ("mlx5_1", "mlx5_8"):
            blocked = value(scraped, "rdma_exporter_device_read_blocked_seconds", device=device, reads="device")
            assert blocked is not None and blocked > 0
            assert value(scraped, "rdma_exporter_device_read_blocked_seconds", device=device, reads="netdev") is None
            skipped = value(scraped, "rdma_exporter_device_scrape_skipped", device=device)
            assert skipped == (None if attempt == 0 else 1), (attempt, device)
    assert reads.outstanding() == 2


def test_a_netdev_stall_after_a_device_stall_logs_its_end_as_it_logged_its_start(
    tmp_path: Path, fifos: Fifos, caplog: pytest.LogCaptureFixture
) -> None:
    """The start of each stall is logged per device and per what is blocked (its own reads, its netdev
    reads); its end was logged per device only, so a netdev stall within 10 minutes of the device's
    own stall logged a start and never an end (daemon review)."""
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8))
    root, collector = sample_collector(tmp_path / "t", 1.0, reads)
    caplog.set_level(logging.WARNING, logger="rdma_exporter")
    for path, fill in (
        (device_dir(root, "mlx5_8") / "ports" / "1" / "counters" / "link_downed", b"0\n"),
        (netdev_file(root, "enp220s0f0np0", "speed"), netdev_file(root, "enp220s0f0np0", "speed").read_bytes()),
    ):
        fifo = fifos.make(path)
        for _ in range(2):
            timed_scrape(collector)
        fifos.release(fifo, fill)
        wait_until(lambda: settled(reads))
    # settled(): the end is logged by now.
    lines = stall_lines(caplog, "mlx5_8")
    assert len(lines) == 4, lines
    assert lines[0].startswith("device mlx5_8: no answer before the scrape deadline"), lines
    assert lines[2].startswith("device mlx5_8: its netdev reads (which wait for the kernel's rtnl lock)"), lines
    for end in (lines[1], lines[3]):
        assert end.startswith("device mlx5_8: blocked read returned after "), lines


def test_a_removed_device_takes_its_error_counts_with_it(tmp_path: Path) -> None:
    # Counted per device; kept after the device left, they grew without bound under VF churn (review).
    root = make_tree(tmp_path, 3)
    (device_dir(root, "mlx5_2") / "ports" / "1" / "counters" / "port_rcv_data").write_text("garbage\n")
    collector = collector_for(root, 5.0)
    key = {"collector": "infiniband", "device": "mlx5_2", "reason": "malformed"}
    assert value(timed_scrape(collector)[0], "rdma_exporter_file_read_errors_total", **key) == 1
    shutil.rmtree(device_dir(root, "mlx5_2"), ignore_errors=True)
    (root / "class" / "infiniband" / "mlx5_2").unlink(missing_ok=True)
    metrics = timed_scrape(collector)[0]
    assert value(metrics, "rdma_exporter_devices") == 2
    assert value(metrics, "rdma_exporter_file_read_errors_total", **key) is None


def test_blocked_static_attribute_costs_only_that_device(tmp_path: Path, fifos: Fifos) -> None:
    root = make_tree(tmp_path, 3)
    expected = baseline(tmp_path, 3)
    fifos.make(device_dir(root, "mlx5_2") / "fw_ver")
    collector = collector_for(root, 0.8)
    metrics, took = timed_scrape(collector)
    assert took.scheduled < 1.4, took
    assert device_series(metrics, "mlx5_2") == {}
    assert value(metrics, "rdma_exporter_file_read_errors_total", collector="infiniband", device="mlx5_2",
                 reason="timeout") == 1
    for device in ("mlx5_0", "mlx5_1"):
        assert device_series(metrics, device) == device_series(expected, device)


def test_eio_costs_one_value(tmp_path: Path) -> None:
    root = make_tree(tmp_path, 3)
    expected = baseline(tmp_path, 3)
    counter = device_dir(root, "mlx5_0") / "ports" / "1" / "counters" / "symbol_error"
    counter.unlink()
    counter.symlink_to("/proc/self/mem")  # reading offset 0 of one's own memory fails with EIO
    metrics, _ = timed_scrape(collector_for(root, 5.0))
    assert value(metrics, "rdma_exporter_file_read_errors_total", collector="infiniband", device="mlx5_0",
                 reason="io") == 1
    assert value(metrics, "rdma_exporter_scrape_collector_success", collector="infiniband") == 1
    assert value(metrics, "rdma_port_symbol_errors_total", device="mlx5_0", port="1") is None
    lost = {key for key in device_series(expected, "mlx5_0") if key not in device_series(metrics, "mlx5_0")}
    port = (("device", "mlx5_0"), ("port", "1"))
    assert lost == {
        ("rdma_port_symbol_errors_total", port),
        ("rdma_port_pma_saturated", (("counter", "symbol_error"), *port)),  # no value, no saturation verdict
    }
    for device in ("mlx5_1", "mlx5_2"):
        assert device_series(metrics, device) == device_series(expected, device)


def test_device_removed_in_the_middle_of_a_scrape(tmp_path: Path, fifos: Fifos) -> None:
    root = make_tree(tmp_path, 4)
    expected = baseline(tmp_path, 4)
    collector = collector_for(root, 5.0)
    timed_scrape(collector)  # static info cached, as in steady state
    gone = device_dir(root, "mlx5_2")
    state = fifos.make(gone / "ports" / "1" / "state")

    def unplug() -> None:  # while the scrape's read of mlx5_2 waits on its port state
        shutil.rmtree(gone)
        (root / "class" / "infiniband" / "mlx5_2").unlink()

    unplugger = fifos.answer_when_read(state, b"4: ACTIVE\n", unplug)
    metrics, took = timed_scrape(collector)
    unplugger.join(5)
    assert took.scheduled < 2.0, took
    assert value(metrics, "rdma_exporter_file_read_errors_total", collector="infiniband", device="mlx5_2",
                 reason="missing") >= 1
    assert value(metrics, "rdma_port_state_id", device="mlx5_2", port="1") == 4  # read before the removal
    assert value(metrics, "rdma_port_physical_state_id", device="mlx5_2", port="1") is None
    for device in ("mlx5_0", "mlx5_1", "mlx5_3"):
        assert device_series(metrics, device) == device_series(expected, device)

    after, _ = timed_scrape(collector)
    assert value(after, "rdma_exporter_devices") == 3
    assert device_series(after, "mlx5_2") == {}  # no stale series
    assert value(after, "rdma_exporter_scrape_collector_success", collector="infiniband") == 1


def test_a_device_removed_while_its_read_is_stuck_keeps_its_files_until_the_read_returns(
    tmp_path: Path, fifos: Fifos
) -> None:
    # The stuck job goes on reading with the device's kept fds once the firmware answers: closing them
    # under it would let the numbers be reused for other files. They go at the first scrape after it.
    root = make_tree(tmp_path, 2)
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8), FileBudget(10_000))  # not the shared budget
    collector = collector_for(root, 1.0, reads)
    timed_scrape(collector)
    one_device = reads.open_files() // 2
    fifo = fifos.make(device_dir(root, "mlx5_1") / "ports" / "1" / "counters" / "port_rcv_data")
    timed_scrape(collector)  # mlx5_1 times out on the FIFO, with the files it read before it kept
    stuck = reads.open_files()
    assert stuck > one_device and reads.outstanding() == 1
    (root / "class" / "infiniband" / "mlx5_1").unlink()
    metrics, _ = timed_scrape(collector)
    assert value(metrics, "rdma_exporter_devices") == 1
    assert reads.outstanding() == 1 and reads.open_files() == stuck  # not closed under the running read

    fifos.release(fifo, b"1000\n")
    wait_until(lambda: settled(reads))
    timed_scrape(collector)
    assert reads.open_files() == one_device and reads.budget.used == one_device


def test_port_files_change_between_reads(tmp_path: Path, fifos: Fifos) -> None:
    root = make_tree(tmp_path, 2)
    collector = collector_for(root, 5.0)
    before, _ = timed_scrape(collector)
    counters = device_dir(root, "mlx5_0") / "ports" / "1" / "counters"

    # Between scrapes: a value moves, a file disappears, one turns to garbage, one is new.
    (counters / "port_xmit_wait").write_text("777\n")
    (counters / "VL15_dropped").unlink()
    (counters / "port_rcv_errors").write_text("garbage\n")
    (counters / "link_error_recovery_new").write_text("5\n")
    after, _ = timed_scrape(collector)
    assert value(after, "rdma_port_transmit_wait_total", device="mlx5_0", port="1") == 777
    assert value(after, "rdma_port_vl15_dropped_total", device="mlx5_0", port="1") is None
    assert value(after, "rdma_port_receive_errors_total", device="mlx5_0", port="1") is None
    errors = {
        reason: value(after, "rdma_exporter_file_read_errors_total", collector="infiniband", device="mlx5_0",
                      reason=reason)
        for reason in ("missing", "malformed")
    }
    assert errors == {"missing": 1, "malformed": 1}
    assert value(after, "rdma_exporter_scrape_collector_success", collector="infiniband") == 1
    assert device_series(after, "mlx5_1") == device_series(before, "mlx5_1")

    # During a scrape: files read after the one being read change under it.
    downed = fifos.make(counters / "link_downed")

    def mutate() -> None:  # while the scrape reads link_downed
        (counters / "symbol_error").write_text("31\n")  # read later in the same scrape
        (counters / "port_xmit_data").unlink()

    mutator = fifos.answer_when_read(downed, b"3\n", mutate)
    during, _ = timed_scrape(collector)
    mutator.join(5)
    assert value(during, "rdma_port_link_downed_total", device="mlx5_0", port="1") == 3
    assert value(during, "rdma_port_symbol_errors_total", device="mlx5_0", port="1") == 31
    assert value(during, "rdma_port_transmit_data_bytes_total", device="mlx5_0", port="1") is None
    assert value(during, "rdma_exporter_scrape_collector_success", collector="infiniband") == 1


class HeldSource:
    """A source whose per-device read (for some devices) takes until the test sets `release`, and counts
    its calls: a round stays in flight for as long as the test needs, however slowly the machine runs."""

    name = "slow"
    specs: tuple[MetricSpec, ...] = (MetricSpec("test_slow_reads", "gauge", "Reads.", ("device",)),)
    dynamic_specs = ()

    def __init__(self, devices: frozenset[str] | None = None) -> None:
        self.devices = devices
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()
        self.release = threading.Event()

    def read(self, ctx: ScrapeContext, device: DeviceInfo, reader: SysfsReader) -> int:
        with self.lock:
            self.calls[device.name] = self.calls.get(device.name, 0) + 1
        if self.devices is None or device.name in self.devices:
            self.release.wait(30)
        return self.calls[device.name]

    def expose(self, results: Mapping[str, int], out: FamilySet) -> None:
        for name in sorted(results):
            out.add(self.specs[0], [name], results[name])


def round_in_flight(collector: RdmaCollector) -> _Round | None:
    """The collector's latest round. Read under _round_lock: gather() stores it there after starting
    its jobs, so a job may already run before the round is stored."""
    with collector._round_lock:
        return collector._round


def join_round(collector: RdmaCollector, scraper: threading.Thread, timeout: float = 10.0) -> None:
    """Start `scraper` (a thread calling gather) and wait until it has joined the round in flight, which
    moves the round's deadline to the later of theirs. Fails if it started a round of its own."""
    in_flight = round_in_flight(collector)
    assert in_flight is not None
    deadline = in_flight.deadline
    scraper.start()
    wait_until(lambda: in_flight.deadline > deadline, timeout)


def test_concurrent_scrapes_share_one_collection(tmp_path: Path) -> None:
    root = make_tree(tmp_path, 3)
    source = HeldSource()
    collector = RdmaCollector(root, [source], reads=DeviceReads(WorkerPool(parallelism=4, stuck_after=60.0)))
    results: list[FamilySet] = []
    scrapers = [threading.Thread(target=lambda: results.append(collector.gather(10.0))) for _ in range(3)]
    # The round is held until every scraper has joined it: with a read of fixed length (and 20 ms between
    # the scrapers), a scraper started late on a loaded machine found the round over and started another.
    scrapers[0].start()
    wait_until(lambda: round_in_flight(collector) is not None, 10)
    for scraper in scrapers[1:]:
        join_round(collector, scraper)
    source.release.set()
    for scraper in scrapers:
        scraper.join(10)
    assert source.calls == {"mlx5_0": 1, "mlx5_1": 1, "mlx5_2": 1}  # one firmware query per device
    assert len(results) == 3 and all(result is results[0] for result in results)
    # A scrape after the collection finished starts a fresh one (no stale values).
    collector.gather(5.0)
    assert source.calls == {"mlx5_0": 2, "mlx5_1": 2, "mlx5_2": 2}


def test_a_round_is_joined_only_until_the_deadline_of_the_scrape_that_started_it(tmp_path: Path) -> None:
    """Found by review: two Prometheus servers whose scrapes overlapped kept joining the round of the
    first, each moving its deadline, and a round with a hung read never completes. That one round lasted
    as long as the hang, every answer took the full deadline, and every healthy device's counters stood
    still in it. A scrape after the starter's deadline starts its own round."""
    root = make_tree(tmp_path, 3)
    source = HeldSource(frozenset({"mlx5_1"}))
    collector = RdmaCollector(root, [source], reads=DeviceReads(WorkerPool(parallelism=4)))
    results: list[FamilySet] = []
    try:
        leader = threading.Thread(target=lambda: collector.gather(1.0))
        leader.start()
        wait_until(lambda: (rnd := round_in_flight(collector)) is not None and all(
            rnd.jobs[name].done.is_set() for name in ("mlx5_0", "mlx5_2")), 10)
        held = round_in_flight(collector)
        assert held is not None
        joiner = threading.Thread(target=lambda: results.append(collector.gather(20.0)))
        join_round(collector, joiner)  # within the leader's second: joined, the deadline moved to 20 s
        leader.join(10)
        wait_until(lambda: time.monotonic() > held.joinable_until, 10)
        started = time.monotonic()
        third = samples(prometheus_text(collector.gather(20.0)).decode())
        assert time.monotonic() - started < 5  # not the 20 s of the held round
        assert round_in_flight(collector) is not held
        assert value(third, "test_slow_reads", device="mlx5_0") == 2  # read again: fresh values
        assert value(third, "test_slow_reads", device="mlx5_1") is None
        assert value(third, "rdma_exporter_device_scrape_skipped", device="mlx5_1") == 1
        assert source.calls["mlx5_1"] == 1  # the stuck device keeps its one read
    finally:
        source.release.set()
    joiner.join(10)
    assert value(samples(prometheus_text(results[0]).decode()), "test_slow_reads", device="mlx5_1") == 1


def test_a_scrape_joins_a_round_whose_device_is_slow_but_reading(tmp_path: Path) -> None:
    """A device that takes 1.5 s to read is slow, not hung: the second of an HA pair, arriving 1.2 s into
    the round, shares the read (found by the final review, against a first fix that started a round of
    its own once a read had run for a second, and reported the device skipped every interval)."""
    root = make_tree(tmp_path, 3)
    source = HeldSource(frozenset({"mlx5_1"}))
    collector = RdmaCollector(root, [source], reads=DeviceReads(WorkerPool(parallelism=4)))
    first: list[FamilySet] = []
    leader = threading.Thread(target=lambda: first.append(collector.gather(5.0)))
    try:
        leader.start()
        wait_until(lambda: source.calls.get("mlx5_1") == 1, 10)
        time.sleep(1.2)
        threading.Timer(0.3, source.release.set).start()
        second = samples(prometheus_text(collector.gather(5.0)).decode())
    finally:
        source.release.set()
    leader.join(10)
    assert source.calls["mlx5_1"] == 1  # one read, shared
    assert value(second, "test_slow_reads", device="mlx5_1") == 1
    assert value(second, "rdma_exporter_device_scrape_skipped", device="mlx5_1") is None


def test_a_shorter_deadline_does_not_wait_for_the_longer_one(tmp_path: Path) -> None:
    root = make_tree(tmp_path, 3)
    source = HeldSource(frozenset({"mlx5_1"}))
    collector = RdmaCollector(root, [source], reads=DeviceReads(WorkerPool(parallelism=4, stuck_after=60.0)))
    leader: list[FamilySet] = []
    thread = threading.Thread(target=lambda: leader.append(collector.gather(5.0)))
    thread.start()
    # The short scrape joins once the leader's round is in flight and mlx5_0 has answered; mlx5_1's read is
    # held until the short scrape is over. (After a fixed 50 ms, a leader not yet scheduled left the short
    # scrape to start the round, and a 1 s read could end before a slowed short scrape did.)
    wait_until(lambda: (rnd := round_in_flight(collector)) is not None and rnd.jobs["mlx5_0"].done.is_set(), 10)
    try:
        with timed() as took:
            short = samples(prometheus_text(collector.gather(0.2)).decode())
        # Its own deadline less the time the machine kept it from running (flaky-test review).
        assert took[0].scheduled < 0.5, took[0]
    finally:
        source.release.set()
    thread.join(5)
    assert source.calls["mlx5_1"] == 1  # the short scrape joined the collection in flight
    assert value(short, "rdma_exporter_scrape_collector_success", collector="slow") == 0
    assert value(short, "test_slow_reads", device="mlx5_0") == 1
    assert value(short, "test_slow_reads", device="mlx5_1") is None
    full = samples(prometheus_text(leader[0]).decode())
    assert value(full, "rdma_exporter_scrape_collector_success", collector="slow") == 1
    assert value(full, "test_slow_reads", device="mlx5_1") == 1
    # The short scrape's timeout was counted once, and stays counted.
    assert value(full, "rdma_exporter_file_read_errors_total", collector="slow", device="mlx5_1",
                 reason="timeout") == 1


def test_a_shorter_deadline_timing_out_does_not_hide_the_read_errors_of_the_longer(
    tmp_path: Path, fifos: Fifos
) -> None:
    # An HA pair scraping at once shares a round. The short scrape gives up on mlx5_0 and counts a
    # timeout; the long one gets its values, and their read errors (a malformed file) must be counted too.
    root = make_tree(tmp_path, 2)
    counters = device_dir(root, "mlx5_0") / "ports" / "1" / "counters"
    (counters / "symbol_error").write_text("garbage\n")
    slow = fifos.make(counters / "VL15_dropped")
    # The short scrape runs once the long one's round is reading the FIFO, and the FIFO answers once the
    # short scrape is over. (With a fixed 50 ms and 1.5 s instead, a long scrape not yet scheduled left the
    # short one to start the round, whose deadline then passed before the long one could join it.)
    reading, short_done = threading.Event(), threading.Event()

    def when_read() -> None:
        reading.set()
        short_done.wait(30)

    answer = fifos.answer_when_read(slow, b"5\n", when_read)
    collector = collector_for(root, 5.0)
    results: list[FamilySet] = []
    long_scrape = threading.Thread(target=lambda: results.append(collector.gather(5.0)))
    long_scrape.start()
    try:
        assert reading.wait(10)
        short = samples(prometheus_text(collector.gather(0.5)).decode())
    finally:
        short_done.set()
    long_scrape.join(5)
    answer.join(5)

    def errors(metrics: Samples) -> dict[str, float | None]:
        return {
            reason: value(metrics, "rdma_exporter_file_read_errors_total", collector="infiniband", device="mlx5_0",
                          reason=reason)
            for reason in ("timeout", "malformed")
        }

    assert value(short, "rdma_port_vl15_dropped_total", device="mlx5_0", port="1") is None
    assert errors(short) == {"timeout": 1, "malformed": None}
    full = samples(prometheus_text(results[0]).decode())
    assert value(full, "rdma_port_vl15_dropped_total", device="mlx5_0", port="1") == 5
    assert value(full, "rdma_port_symbol_errors_total", device="mlx5_0", port="1") is None
    # The short scrape's timeout stays counted (it did serve a scrape without the values), once each.
    assert errors(full) == {"timeout": 1, "malformed": 1}
    # A later scrape, alone in its round, counts the malformed file once more and no timeout. The FIFO
    # has no writer left, so the counter becomes a plain file again first.
    slow.unlink()
    slow.write_text("6\n")
    again = samples(prometheus_text(collector.gather(5.0)).decode())
    assert errors(again) == {"timeout": 1, "malformed": 2}


class FailingSource:
    """A source with a bug: `read` raises for the devices in `read_fails`, `expose` raises if `expose_fails`."""

    name = "failing"
    specs: tuple[MetricSpec, ...] = (MetricSpec("test_failing_reads", "gauge", "Reads.", ("device",)),)
    dynamic_specs: tuple[DynamicMetricSpec, ...] = ()

    def __init__(self, read_fails: frozenset[str] = frozenset(), expose_fails: bool = False) -> None:
        self.read_fails = read_fails
        self.expose_fails = expose_fails

    def read(self, ctx: ScrapeContext, device: DeviceInfo, reader: SysfsReader) -> int:
        if device.name in self.read_fails:
            raise RuntimeError(f"bug reading {device.name}")
        return 1

    def expose(self, results: Mapping[str, int], out: FamilySet) -> None:
        if self.expose_fails:
            raise RuntimeError("bug building the families")
        for name in sorted(results):
            out.add(self.specs[0], [name], results[name])


def collector_with(root: Path, source: FailingSource) -> RdmaCollector:
    """The configured sources with `source` first: a device's later sources must not depend on it."""
    sources: list[Source] = [source, *build_sources(replace(Config(), sysfs=root))]
    return RdmaCollector(root, sources, reads=DeviceReads(WorkerPool(parallelism=4, hard_max=8)))


def test_a_source_raising_in_read_costs_only_that_source_on_that_device(tmp_path: Path) -> None:
    # A parser bug tripped by one device's odd firmware must not cost that device its other collectors,
    # nor the other devices anything, nor any later scrape.
    root = make_tree(tmp_path, 3)
    expected = baseline(tmp_path, 3)
    collector = collector_with(root, FailingSource(read_fails=frozenset({"mlx5_1"})))
    for scrape in (1, 2):
        metrics, _ = timed_scrape(collector)
        assert value(metrics, "test_failing_reads", device="mlx5_0") == 1
        assert value(metrics, "test_failing_reads", device="mlx5_1") is None
        assert value(metrics, "test_failing_reads", device="mlx5_2") == 1
        served = {key: v for key, v in metrics.items() if key[0] != "test_failing_reads"}
        for device in ("mlx5_0", "mlx5_1", "mlx5_2"):
            assert device_series(served, device) == device_series(expected, device), device
        assert value(metrics, "rdma_exporter_scrape_collector_success", collector="failing") == 0
        for name in sources_of(collector)[1:]:
            assert value(metrics, "rdma_exporter_scrape_collector_success", collector=name) == 1, name
        errors = {
            (dict(labels)["collector"], dict(labels)["device"], dict(labels)["reason"]): count
            for (name, labels), count in metrics.items()
            if name == "rdma_exporter_file_read_errors_total"
        }
        assert errors == {("failing", "mlx5_1", "io"): scrape}  # an error, not a timeout


def test_a_source_raising_in_expose_costs_only_that_source(tmp_path: Path) -> None:
    root = make_tree(tmp_path, 3)
    expected = baseline(tmp_path, 3)
    collector = collector_with(root, FailingSource(expose_fails=True))
    for _ in range(2):  # the scrape is served, and so is the next one
        metrics, _ = timed_scrape(collector)
        assert not [key for key in metrics if key[0] == "test_failing_reads"]
        for device in ("mlx5_0", "mlx5_1", "mlx5_2"):
            assert device_series(metrics, device) == device_series(expected, device), device
        assert value(metrics, "rdma_exporter_scrape_collector_success", collector="failing") == 0
        for name in sources_of(collector)[1:]:
            assert value(metrics, "rdma_exporter_scrape_collector_success", collector=name) == 1, name


def test_as_many_stuck_devices_as_read_threads_do_not_hide_the_others(tmp_path: Path, fifos: Fifos) -> None:
    """Four HCAs stuck with the default four read threads: the first scrape used to serve no other
    device, all of them queued behind the stuck reads until the deadline (found by review). A read past
    STUCK_AFTER_SECONDS gives up its slot, so the other devices are read within the same scrape."""
    root = make_tree(tmp_path, 8)
    expected = baseline(tmp_path, 8)
    stuck = [f"mlx5_{n}" for n in range(4)]
    for device in stuck:
        fifos.make(device_dir(root, device) / "ports" / "1" / "counters" / "symbol_error")
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=16))
    first, took = timed_scrape(collector_for(root, 3.0, reads))
    assert took.scheduled < 3.6, took
    for device in (f"mlx5_{n}" for n in range(4, 8)):
        assert device_series(first, device) == device_series(expected, device), device
        assert value(first, "rdma_exporter_device_read_blocked_seconds", device=device, reads="device") is None
    for device in stuck:
        # Read before the stuck counters.
        assert device_series(first, device) == pcie_series(expected, device) != {}
        assert value(first, "rdma_exporter_device_read_blocked_seconds", device=device, reads="device")


def test_threads_stay_bounded_when_every_device_blocks(tmp_path: Path, fifos: Fifos) -> None:
    root = make_tree(tmp_path, 8)
    for n in range(8):
        fifos.make(device_dir(root, f"mlx5_{n}") / "ports" / "1" / "counters" / "symbol_error")
    pool = WorkerPool(parallelism=2, hard_max=5)
    reads = DeviceReads(pool)
    collector = collector_for(root, 0.3, reads)
    threads_before = threading.active_count()
    peak = 0
    for _ in range(15):
        metrics, took = timed_scrape(collector)
        assert took.scheduled < 0.8, took
        peak = max(peak, pool.threads, threading.active_count() - threads_before)
    assert peak <= 5, f"{peak} reader threads for a cap of 5"
    assert value(metrics, "rdma_exporter_devices") == 8
    assert value(metrics, "rdma_exporter_scrape_collector_success", collector="infiniband") == 0
    # Every device is either blocked in a thread or queued behind them, and reported.
    reported = {
        device
        for (name, labels), _ in metrics.items()
        if name == "rdma_exporter_device_read_blocked_seconds"
        for key, device in labels
        if key == "device"
    }
    assert reported == {f"mlx5_{n}" for n in range(8)}

    fifos.release_all()
    wait_until(lambda: settled(reads))
    healed, _ = timed_scrape(collector_for(root, 5.0, reads))
    assert value(healed, "rdma_exporter_scrape_collector_success", collector="infiniband") == 1


def test_stuck_device_is_still_present_for_the_expected_topology(tmp_path: Path, fifos: Fifos) -> None:
    # A firmware stall must not look like a missing HCA: presence comes from the inventory, not reads.
    from rdma_exporter.config import load_config_file

    root = make_tree(tmp_path, 4)
    config_file = tmp_path / "expected.yml"
    config_file.write_text(
        "collector:\n  expected:\n    ports:\n      - devices: 'mlx5_[0-3]'\n        port: 1\n"
        "        link_layer: InfiniBand\n        rate_gbps: 400\n"
    )
    config = replace(load_config_file(config_file), sysfs=root, scrape_timeout=1.0)
    fifos.make(device_dir(root, "mlx5_2") / "ports" / "1" / "counters" / "symbol_error")
    collector = build_collector(config, reads=DeviceReads(WorkerPool(parallelism=4, hard_max=8)))
    assert "expected" in sources_of(collector)
    for attempt in range(3):  # the timed-out scrape, then scrapes that skip the stuck device
        metrics, _ = timed_scrape(collector)
        assert value(metrics, "rdma_expected_device_present", device="mlx5_2") == 1, attempt
        assert value(metrics, "rdma_expected_port_present", device="mlx5_2", port="1") == 1, attempt
        assert value(metrics, "rdma_exporter_scrape_collector_success", collector="expected") == 1
        assert value(metrics, "rdma_exporter_scrape_collector_success", collector="infiniband") == 0


def test_device_stuck_in_its_static_read_is_present_with_ports_unknown(tmp_path: Path, fifos: Fifos) -> None:
    # Listed but its static info never came (first scrape, or a udev re-read stuck in firmware): the
    # device is there, so not "missing"; which ports it has is unknown, so they are not reported at all.
    from rdma_exporter.config import load_config_file

    root = make_tree(tmp_path, 3)
    config_file = tmp_path / "expected.yml"
    config_file.write_text("collector:\n  expected:\n    ports:\n      - devices: 'mlx5_[0-3]'\n        port: 1\n")
    config = replace(load_config_file(config_file), sysfs=root, scrape_timeout=1.0)
    fifo = fifos.make(device_dir(root, "mlx5_2") / "fw_ver")
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8))
    collector = build_collector(config, reads=reads)
    for attempt in range(3):  # the timed-out scrape, then scrapes that skip the stuck device
        metrics, _ = timed_scrape(collector)
        assert value(metrics, "rdma_expected_device_present", device="mlx5_2") == 1, attempt
        assert value(metrics, "rdma_expected_port_present", device="mlx5_2", port="1") is None, attempt
        assert value(metrics, "rdma_expected_port_info", device="mlx5_2", port="1", link_layer="") == 1
        for device in ("mlx5_0", "mlx5_1"):
            assert value(metrics, "rdma_expected_device_present", device=device) == 1
            assert value(metrics, "rdma_expected_port_present", device=device, port="1") == 1
        # Really missing is still missing.
        assert value(metrics, "rdma_expected_device_present", device="mlx5_3") == 0
        assert value(metrics, "rdma_expected_port_present", device="mlx5_3", port="1") == 0
        assert value(metrics, "rdma_exporter_scrape_collector_success", collector="expected") == 1
        assert value(metrics, "rdma_exporter_scrape_collector_success", collector="infiniband") == 0
        assert not [
            labels
            for (name, labels), _ in metrics.items()
            if name == "rdma_exporter_file_read_errors_total" and ("collector", "expected") in labels
        ], attempt
    assert value(metrics, "rdma_exporter_file_read_errors_total", collector="infiniband", device="mlx5_2",
                 reason="timeout") == 3

    # The firmware answers: the ports are known again.
    fifos.release(fifo, b"20.39.1002\n")
    wait_until(lambda: settled(reads))
    healed, _ = timed_scrape(collector)
    assert value(healed, "rdma_expected_port_present", device="mlx5_2", port="1") == 1


def test_udev_reread_stuck_keeps_the_device_present(tmp_path: Path, fifos: Fifos) -> None:
    # udev mode: the device's info was known, then an event invalidated it and the re-read blocks.
    from rdma_exporter.config import load_config_file

    root = make_tree(tmp_path, 2)
    config_file = tmp_path / "expected.yml"
    config_file.write_text("collector:\n  expected:\n    ports:\n      - devices: 'mlx5_[0-1]'\n")
    config = replace(load_config_file(config_file), sysfs=root, scrape_timeout=1.0)
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8))
    collector = build_collector(config, reads=reads)
    collector.inventory.rescan_each_scrape = False
    metrics, _ = timed_scrape(collector)
    assert value(metrics, "rdma_expected_port_present", device="mlx5_1", port="1") == 1
    fifos.make(device_dir(root, "mlx5_1") / "fw_ver")
    collector.inventory.invalidate("mlx5_1")
    for attempt in range(2):
        metrics, _ = timed_scrape(collector)
        assert value(metrics, "rdma_expected_device_present", device="mlx5_1") == 1, attempt
        assert value(metrics, "rdma_expected_port_present", device="mlx5_1", port="1") is None, attempt
        assert value(metrics, "rdma_exporter_file_read_errors_total", collector="expected", device="mlx5_1",
                     reason="timeout") is None, attempt


def test_static_read_error_is_retried_before_the_cache_period(tmp_path: Path) -> None:
    # udev mode keeps static info until a uevent or the 15-minute resync. A counters/ listing that failed
    # once (EIO while the firmware resets) must not cost the port every counter for that long.
    root, collector, now = udev_collector_with_clock(tmp_path)
    counters = device_dir(root, "mlx5_1") / "ports" / "1" / "counters"
    counters.rename(counters.with_name("counters.away"))
    counters.write_text("")  # listing it fails with ENOTDIR, an io error
    first, _ = timed_scrape(collector)
    assert value(first, "rdma_port_symbol_errors_total", device="mlx5_1", port="1") is None
    assert value(first, "rdma_exporter_file_read_errors_total", collector="inventory", device="mlx5_1",
                 reason="io") == 1
    clean = collector.inventory.cached()["mlx5_0"]

    counters.unlink()
    counters.with_name("counters.away").rename(counters)
    now[0] += 10.0
    soon, _ = timed_scrape(collector)
    assert value(soon, "rdma_port_symbol_errors_total", device="mlx5_1", port="1") is None  # not every scrape
    now[0] += 60.0
    later, _ = timed_scrape(collector)
    assert value(later, "rdma_port_symbol_errors_total", device="mlx5_1", port="1") is not None
    assert value(later, "rdma_port_symbol_errors_total", device="mlx5_0", port="1") is not None
    assert collector.inventory.cached()["mlx5_0"] is clean  # a device read without errors is not re-read


def test_pcie_capability_read_all_ones_is_read_again(tmp_path: Path) -> None:
    # A device in reset answers config reads with all ones, and max_link_width then reads 63. Read at the
    # static read, that "unknown" would be kept until a uevent or the 15-minute resync, leaving the PCIe
    # degradation alert without its maximum; it is read again after STATIC_RETRY_SECONDS instead.
    root, collector, now = udev_collector_with_clock(tmp_path)
    pci = device_dir(root, "mlx5_1") / "device"
    max_width = pci / "max_link_width"
    max_width.write_text("63\n")
    first, _ = timed_scrape(collector)
    assert value(first, "rdma_pcie_link_max_width_lanes", device="mlx5_1") is None
    assert value(first, "rdma_pcie_link_max_width_lanes", device="mlx5_0") == 16
    assert value(first, "rdma_exporter_file_read_errors_total", collector="inventory", device="mlx5_1",
                 reason="malformed") is None  # unknown, not garbage
    clean = collector.inventory.cached()["mlx5_0"]

    max_width.write_text("16\n")  # the reset is over
    now[0] += 10.0
    soon, _ = timed_scrape(collector)
    assert value(soon, "rdma_pcie_link_max_width_lanes", device="mlx5_1") is None  # not on every scrape
    now[0] += 60.0
    later, _ = timed_scrape(collector)
    assert value(later, "rdma_pcie_link_max_width_lanes", device="mlx5_1") == 16
    assert collector.inventory.cached()["mlx5_0"] is clean  # a device read settled is not re-read


def test_pcie_capability_that_reads_zero_is_kept(tmp_path: Path) -> None:
    # A passed-through VF's link registers are reserved and read 0: unknown for good, so its static info
    # is kept like any other (no static re-read every minute on every VF of a VM).
    root, collector, now = udev_collector_with_clock(tmp_path)
    (device_dir(root, "mlx5_1") / "device" / "max_link_width").write_text("0\n")
    timed_scrape(collector)
    kept = collector.inventory.cached()["mlx5_1"]
    now[0] += 120.0
    timed_scrape(collector)
    assert collector.inventory.cached()["mlx5_1"] is kept


def test_node_without_class_infiniband_is_not_a_failure(tmp_path: Path) -> None:
    # A node without RDMA modules (a DaemonSet runs everywhere) has no devices; that is not a failing
    # collector, which would open a ticket on every such node. A class directory that cannot be listed is.
    root = tmp_path / "sys"
    root.mkdir()
    metrics, _ = timed_scrape(collector_for(root, 5.0))
    assert value(metrics, "rdma_exporter_scrape_collector_success", collector="inventory") == 1
    assert value(metrics, "rdma_exporter_devices") == 0
    assert not [key for key in metrics if key[0] == "rdma_exporter_file_read_errors_total"]
    assert value(metrics, "rdma_exporter_sample_tree") == 0

    (root / "class").mkdir()
    (root / "class" / "infiniband").write_text("")  # listing it fails with ENOTDIR
    metrics, _ = timed_scrape(collector_for(root, 5.0))
    assert value(metrics, "rdma_exporter_scrape_collector_success", collector="inventory") == 0
    assert value(metrics, "rdma_exporter_file_read_errors_total", collector="inventory", device="",
                 reason="io") == 1


def test_dangling_class_entry_is_not_a_device(tmp_path: Path) -> None:
    # class/infiniband/<dev> is a symlink into the device tree; caught mid-removal it leads nowhere. That
    # is not a device with every attribute empty (an rdma_device_info of blank labels, counted in devices).
    root = make_tree(tmp_path, 2)
    (root / "class" / "infiniband" / "mlx5_9").symlink_to("../../devices/pci0000:00/0000:00:09.0/infiniband/mlx5_9")
    metrics, _ = timed_scrape(collector_for(root, 5.0))
    assert value(metrics, "rdma_exporter_devices") == 2
    assert not [key for key in metrics if key[0] == "rdma_device_info" and ("device", "mlx5_9") in key[1]]
    assert [key for key in metrics if key[0] == "rdma_device_info" and ("device", "mlx5_1") in key[1]]
    assert value(metrics, "rdma_exporter_scrape_collector_success", collector="inventory") == 1


def test_netdev_named_with_bytes_that_are_not_utf8_costs_nothing(tmp_path: Path) -> None:
    """A netdev may be renamed to any bytes (`ip link set X name $'\\xff'`); os.listdir hands them over
    with surrogate escapes, which the UTF-8 answer cannot encode. Such a name once failed every scrape of
    the node with HTTP 500. It is served with the bytes as \\xNN, and every other series stays."""
    root = build_tree(tmp_path / "t", SAMPLE_SPEC)
    expected = samples(build_collector(replace(Config(), sysfs=root)).gather(5.0).render_text().decode())
    function = root / "devices" / "pci0000:d7" / "0000:d7:01.0" / "0000:dc:00.0"
    os.rename(function / "net" / "enp220s0f0np0", os.fsencode(function / "net") + b"/enp220\xff")
    (root / "class" / "net" / "enp220s0f0np0").unlink()
    os.symlink(b"../../devices/pci0000:d7/0000:d7:01.0/0000:dc:00.0/net/enp220\xff",
               os.fsencode(root / "class" / "net") + b"/enp220\xff")
    text = build_collector(replace(Config(), sysfs=root)).gather(5.0).render_text().decode("utf-8")
    served = samples(text)
    renamed = {key for key in served if ("netdev", "enp220\\xff") in key[1]}
    assert ("rdma_port_netdev_info", (("device", "mlx5_8"), ("netdev", "enp220\\xff"), ("port", "1"))) in renamed
    untouched = {key for key in expected if not any(value == "enp220s0f0np0" for _, value in key[1])}
    assert untouched - set(served) == set()


def test_a_renamed_netdev_is_served_under_its_new_name_from_the_next_scrape(tmp_path: Path) -> None:
    """Found by review: without uevents (rescan mode: containers, fixture trees) a netdev renamed after
    the device's static info was read stayed unread, and counted missing, until that info aged out, up to
    5 minutes later. The read that finds it gone counts it once and has the static info read again."""
    root = build_tree(tmp_path / "t", SAMPLE_SPEC)
    collector = build_collector(replace(Config(), sysfs=root))
    assert collector.inventory.mode == "rescan"
    before = samples(collector.gather(5.0).render_text().decode())
    assert value(before, "rdma_netdev_up", device="mlx5_8", port="1", netdev="enp220s0f0np0") == 1
    function = root / "devices" / "pci0000:d7" / "0000:d7:01.0" / "0000:dc:00.0"
    (function / "net" / "enp220s0f0np0").rename(function / "net" / "rail8")
    (root / "class" / "net" / "enp220s0f0np0").unlink()
    (root / "class" / "net" / "rail8").symlink_to("../../devices/pci0000:d7/0000:d7:01.0/0000:dc:00.0/net/rail8")
    for ndev in (device_dir(root, "mlx5_8") / "ports" / "1" / "gid_attrs" / "ndevs").iterdir():
        if ndev.read_text() == "enp220s0f0np0\n":  # the kernel shows a GID's netdev by its current name
            ndev.write_text("rail8\n")
    first = samples(collector.gather(5.0).render_text().decode())
    missing = {"collector": "netdev", "device": "mlx5_8", "reason": "missing"}
    assert value(first, "rdma_exporter_file_read_errors_total", **missing) == 1
    second = samples(collector.gather(5.0).render_text().decode())
    assert value(second, "rdma_netdev_up", device="mlx5_8", port="1", netdev="rail8") == 1
    assert not [key for key in second if ("netdev", "enp220s0f0np0") in key[1]]
    assert value(second, "rdma_exporter_file_read_errors_total", **missing) == 1  # once, not per scrape


# --- the reader pool on its own -------------------------------------------------------------------


def pool_job(name: str, gate: threading.Event | None = None, ran: list[threading.Thread] | None = None) -> DeviceJob:
    """A job that records the thread running it, then blocks on `gate` (a read stuck in the kernel)."""

    def work(job: DeviceJob) -> None:
        if ran is not None:
            # The thread itself, not its name: other tests' pools name their threads alike.
            ran.append(threading.current_thread())
        if gate is not None:
            gate.wait(30)

    return DeviceJob(f"/x/{name}", name, work)


def test_a_side_job_beside_a_firmware_stall_needs_firmware_free_reads_to_give_it() -> None:
    # After a reload that disabled the pcie collector, the new collector has nothing for such a side job:
    # the stuck device is skipped as before, instead of a job that reads nothing every scrape (review).
    gate = threading.Event()
    reads = DeviceReads(WorkerPool(parallelism=2, hard_max=4))

    def stuck_in_firmware(job: DeviceJob) -> None:
        job.firmware_free_done = True
        gate.wait(30)

    try:
        stuck, new = reads.start("/x/mlx5_0", "mlx5_0", stuck_in_firmware)
        assert new
        wait_until(lambda: stuck.firmware_free_done)
        assert reads.start("/x/mlx5_0", "mlx5_0", lambda job: None, firmware_free_reads=False) == (stuck, False)
        side, new = reads.start("/x/mlx5_0", "mlx5_0", lambda job: None)
        assert new and side.beside is stuck and side.stall == "device"
    finally:
        gate.set()
    wait_until(lambda: reads.outstanding() == 0)


def test_pool_lets_a_second_thread_in_while_a_job_is_slow() -> None:
    # One job stuck in firmware must not hold up the other devices' jobs until the deadline.
    pool = WorkerPool(parallelism=2, hard_max=4, idle_seconds=30.0, spill_after=0.02)
    gate = threading.Event()
    stuck, quick = pool_job("stuck", gate), pool_job("quick")
    try:
        pool.submit(stuck)
        pool.submit(quick)

        def quick_done() -> bool:
            pool.rebalance()  # what a waiting scrape does
            return quick.done.is_set()

        wait_until(quick_done, timeout=10.0)
        assert not stuck.done.is_set()
    finally:
        gate.set()
    wait_until(stuck.done.is_set, timeout=10.0)


def test_a_reader_thread_that_cannot_start_is_reported_once_until_one_starts(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Under TasksMax= a waiting scrape's watchdog tries a second thread every 20 ms: a warning each time
    was about 50 lines a second, 147 in one 3-second scrape (review). Once, and a line when one starts."""
    start = threading.Thread.start
    refusing = True

    def refuse_second(thread: threading.Thread) -> None:
        if refusing and thread.name.startswith("rdma-read-") and thread.name != "rdma-read-1":
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refuse_second)
    pool = WorkerPool(parallelism=2, hard_max=4, idle_seconds=30.0, spill_after=0.01)
    gate = threading.Event()
    stuck, quick = pool_job("stuck", gate), pool_job("quick")
    try:
        with caplog.at_level(logging.INFO, logger=readers.log.name):
            pool.submit(stuck)
            pool.submit(quick)
            time.sleep(0.05)
            for _ in range(50):
                pool.rebalance()  # what a waiting scrape does every 20 ms
            assert not quick.done.is_set()
            refusing = False
            wait_until(lambda: pool.rebalance() or quick.done.is_set(), timeout=10.0)
        failures = [r for r in caplog.records if "cannot start a reader thread" in r.getMessage()]
        assert len(failures) == 1, [r.getMessage() for r in caplog.records]
        assert any("reader thread started again" in r.getMessage() for r in caplog.records)
    finally:
        gate.set()
    wait_until(stuck.done.is_set, timeout=10.0)


def test_pool_threads_end_when_idle_and_are_reused_before() -> None:
    pool = WorkerPool(parallelism=2, idle_seconds=0.3)
    ran: list[threading.Thread] = []
    first = pool_job("a", ran=ran)
    pool.submit(first)
    wait_until(first.done.is_set, timeout=10.0)
    second = pool_job("b", ran=ran)
    pool.submit(second)  # well within idle_seconds: the same thread takes it
    wait_until(second.done.is_set, timeout=10.0)
    assert len(set(ran)) == 1, ran
    # A quiet exporter holds no reader threads.
    wait_until(lambda: pool.threads == 0, timeout=10.0)
    wait_until(lambda: not ran[0].is_alive(), timeout=10.0)


def test_pool_threads_let_in_by_abandoned_jobs_leave_once_they_return() -> None:
    # Threads a stuck episode added must not linger (idle_seconds is long here) once the reads return.
    pool = WorkerPool(parallelism=1, hard_max=4, idle_seconds=60.0, spill_after=60.0)
    gates = [threading.Event() for _ in range(3)]
    jobs = [pool_job(f"j{n}", gate) for n, gate in enumerate(gates)]
    try:
        for job in jobs:
            pool.submit(job)
        for job in jobs:  # each scrape gives up on the job that blocks, which lets the next one start
            wait_until(lambda job=job: job.running, timeout=10.0)
            pool.abandon(job)
            pool.abandon(job)  # another scrape of the round gives up too: one more thread, not two
        assert pool.threads == 3
    finally:
        for gate in gates:
            gate.set()
    wait_until(lambda: all(job.done.is_set() for job in jobs), timeout=10.0)
    wait_until(lambda: pool.threads <= 1, timeout=10.0)
    assert pool.abandoned == 0


def test_pool_starts_threads_for_the_queue_only_as_far_as_its_capacity() -> None:
    # A stuck job that a scrape gave up on lets exactly one more thread in, however long it has been
    # running (abandoned, it no longer counts as slow too), and jobs submitted while that thread is still
    # starting need no other: capacity 2 (parallelism 4), so 2 threads whatever the number of queued jobs.
    pool = WorkerPool(parallelism=4, hard_max=8, idle_seconds=60.0, spill_after=0.05)
    gate = threading.Event()
    stuck = pool_job("stuck", gate)
    queued = [pool_job(f"q{n}", gate) for n in range(3)]
    try:
        pool.submit(stuck)
        wait_until(lambda: stuck.running and time.monotonic() - stuck.since() >= 0.05, timeout=10.0)
        pool.abandon(stuck)
        with pool._cond:  # no thread reaches the queue (and no queued job gets slow) until all are submitted
            for job in queued:
                pool.submit(job)
            assert pool.threads == 2
    finally:
        gate.set()
    wait_until(lambda: all(job.done.is_set() for job in [stuck, *queued]), timeout=10.0)


def test_pool_survives_a_job_whose_work_raises() -> None:
    # A bug in the work function (device faults are handled inside it) ends that job only: its thread goes
    # on to the next job, and the pool still counts it as free.
    pool = WorkerPool(parallelism=1, hard_max=4, idle_seconds=60.0, spill_after=60.0)
    ran: list[threading.Thread] = []

    def broken(job: DeviceJob) -> None:
        ran.append(threading.current_thread())
        raise ValueError("a bug")

    jobs = [DeviceJob("/x/broken", "broken", broken), pool_job("after", ran=ran)]
    for job in jobs:
        pool.submit(job)
    wait_until(lambda: all(job.done.is_set() for job in jobs), timeout=10.0)
    assert len(ran) == 2 and ran[0] is ran[1] and pool.threads == 1


def test_a_device_job_leaves_the_outstanding_jobs_before_it_is_done() -> None:
    # A scrape that sees a job done and starts a round at once must not find the device still outstanding
    # and skip it as stuck.
    reads = DeviceReads(WorkerPool())
    outstanding_when_done: list[int] = []

    class WatchedDone(threading.Event):
        def set(self) -> None:
            outstanding_when_done.append(reads.outstanding())
            super().set()

    def work(job: DeviceJob) -> None:
        job.done = WatchedDone()

    reads.start("/x/d", "d", work)
    wait_until(lambda: outstanding_when_done, timeout=10.0)
    assert outstanding_when_done == [0]


def test_two_rounds_starting_one_device_at_the_same_moment_start_one_job() -> None:
    # Collectors sharing the reads (a config reload) can start rounds at once: of two start() calls for one
    # device, only one may find it without a job and submit one, else the device holds two threads.
    reads = DeviceReads(WorkerPool())
    both_looked = threading.Barrier(2, timeout=2.0)

    class Outstanding(dict[str, DeviceJob]):
        """Each lookup waits (at most the barrier's timeout) for the other start() to look too."""

        def get(self, key: str, default: DeviceJob | None = None) -> DeviceJob | None:
            found = super().get(key, default)
            with contextlib.suppress(threading.BrokenBarrierError):
                both_looked.wait()
            return found

    reads._outstanding = Outstanding()
    gate = threading.Event()
    started: list[bool] = []
    starters = [
        threading.Thread(target=lambda: started.append(reads.start("/x/d", "d", lambda job: gate.wait(30))[1]))
        for _ in range(2)
    ]
    try:
        for starter in starters:
            starter.start()
        for starter in starters:
            starter.join(10)
        assert sorted(started) == [False, True]
    finally:
        gate.set()
    wait_until(lambda: settled(reads), timeout=10.0)


def test_pool_never_exceeds_its_hard_max_however_many_jobs_are_abandoned() -> None:
    # Each abandoned (stuck) job lets one more thread in, but never past hard_max.
    pool = WorkerPool(parallelism=1, hard_max=3, idle_seconds=60.0, spill_after=60.0)
    gate = threading.Event()
    jobs = [pool_job(f"j{n}", gate) for n in range(6)]
    try:
        for job in jobs:
            pool.submit(job)
        for _ in range(3):
            wait_until(lambda: any(job.running and not job.abandoned for job in jobs), timeout=10.0)
            for job in jobs:
                if job.running:
                    pool.abandon(job)
        # Every thread is now stuck; abandoning them again must not let a fourth in.
        for job in jobs:
            if job.running:
                pool.abandon(job)
        pool.rebalance()
        assert pool.threads == 3
        assert sum(job.running for job in jobs) == 3
    finally:
        gate.set()
    wait_until(lambda: all(job.done.is_set() for job in jobs), timeout=10.0)


class PausedClock:
    """Stands in for the engine's `time` module: monotonic() stands still until `resume()`, then runs on
    from where it stopped; perf_counter() and the rest are the real ones."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paused_at: float | None = time.monotonic()
        self._offset = 0.0

    def monotonic(self) -> float:
        with self._lock:
            return (time.monotonic() if self._paused_at is None else self._paused_at) - self._offset

    def advance(self, seconds: float) -> None:
        """Move the clock on by `seconds` while it stands still."""
        with self._lock:
            assert self._paused_at is not None, "advance() is for a paused clock"
            self._paused_at += seconds

    def resume(self) -> None:
        with self._lock:
            if self._paused_at is not None:
                self._offset += time.monotonic() - self._paused_at
                self._paused_at = None

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


class WatchedPool(WorkerPool):
    """A WorkerPool that records which threads wait for a round: a scrape calls rebalance() while it waits."""

    def __init__(self, **options: int) -> None:
        super().__init__(**options)
        self.waiting: set[str] = set()

    def rebalance(self) -> None:
        self.waiting.add(threading.current_thread().name)
        super().rebalance()


def test_scrapes_sharing_a_round_count_a_device_timing_out_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three replicas timing out on one stuck device are one missed read, not three.
    from rdma_exporter.collect import engine

    root = make_tree(tmp_path, 2)
    source = HeldSource(frozenset({"mlx5_1"}))
    pool = WatchedPool(parallelism=4)
    reads = DeviceReads(pool)
    collector = RdmaCollector(root, [source], reads=reads)
    # The replicas arrive at the same moment: the engine's clock stands still until all three wait on the
    # round. (Started at once against the real clock, a scraper that reached gather() more than its 0.6 s
    # after the first, on a loaded machine, found the round over, started another and counted again.)
    clock = PausedClock()
    # The reader threads' module too: a job's start and the round's "now" must come from one clock.
    monkeypatch.setattr(engine, "time", clock)
    monkeypatch.setattr(readers, "time", clock)
    results: list[FamilySet] = []
    scrapers = [
        threading.Thread(target=lambda: results.append(collector.gather(0.6)), name=f"scraper-{n}")
        for n in range(3)
    ]
    try:
        for scraper in scrapers:
            scraper.start()
        wait_until(lambda: pool.waiting >= {scraper.name for scraper in scrapers}, 10)
        clock.resume()
        for scraper in scrapers:
            scraper.join(10)
        assert len(results) == 3
        assert source.calls["mlx5_1"] == 1  # one round
        key = {"collector": "slow", "device": "mlx5_1", "reason": "timeout"}
        for result in results:
            metrics = samples(prometheus_text(result).decode())
            assert value(metrics, "test_slow_reads", device="mlx5_1") is None
            assert value(metrics, "rdma_exporter_file_read_errors_total", **key) == 1
    finally:
        clock.resume()
        source.release.set()
    wait_until(lambda: settled(reads), timeout=10.0)


def test_a_pool_thread_stays_while_jobs_are_queued_whether_surplus_or_idle() -> None:
    # j0, stuck and abandoned, let a second thread in for j1. When j0 returns the pool is one thread over its
    # capacity, but j2 is queued: the thread waits for room to run it rather than leave for another to be
    # started in its place, however many idle periods it waits.
    pool = WorkerPool(parallelism=1, hard_max=4, idle_seconds=0.2, spill_after=60.0)
    gates = [threading.Event() for _ in range(2)]
    first, second, third = jobs = [pool_job("j0", gates[0]), pool_job("j1", gates[1]), pool_job("j2")]
    try:
        pool.submit(first)
        wait_until(lambda: first.running, timeout=10.0)
        pool.abandon(first)
        pool.submit(second)
        wait_until(lambda: second.running, timeout=10.0)
        pool.submit(third)
        gates[0].set()
        wait_until(lambda: first.done.is_set() and (pool._idle == 1 or pool.threads < 2), timeout=10.0)
        assert pool.threads == 2 and not third.running
        time.sleep(1.0)  # at least five idle periods
        assert pool.threads == 2 and not third.running
    finally:
        for gate in gates:
            gate.set()
    wait_until(lambda: all(job.done.is_set() for job in jobs), timeout=10.0)


def test_a_device_job_is_done_before_its_round_is_told_it_ended() -> None:
    # The scrape that all_done wakes judges each job by job.done: a job not done yet is reported blocked
    # (rdma_exporter_device_read_blocked_seconds, a warning) and the round's families are not cached.
    reads = DeviceReads(WorkerPool())
    gate = threading.Event()
    done_when_told: list[bool] = []
    holder: list[DeviceJob] = []
    job, new = reads.start(
        "/x/d", "d", lambda job: gate.wait(30), on_round_done=lambda: done_when_told.append(holder[0].done.is_set())
    )
    holder.append(job)
    gate.set()
    wait_until(lambda: done_when_told, timeout=10.0)
    assert new and done_when_told == [True]


def test_a_netdev_stall_is_timed_from_the_stuck_reads_start_on_every_scrape(tmp_path: Path, fifos: Fifos) -> None:
    # reads="netdev" is how long the stuck netdev read has been running: it grows from scrape to scrape,
    # not from the start of each device-only job that reads the device beside it.
    root, collector = sample_collector(tmp_path / "t", 1.5)
    opened = fifos.opened_at(fifos.make(netdev_file(root, STALLED_NETDEVS["mlx5_8"], "speed")))
    timed_scrape(collector)  # the full job blocks in its netdev reads; the scrape waits its 1.5 s deadline
    time.sleep(0.5)
    asked = time.monotonic()
    metrics, _ = timed_scrape(collector)  # a device-only job reads mlx5_8 beside the stuck one
    # At least since the stuck read opened its file (about 2 s), not since this scrape's job began. Not
    # from the first scrape's start: on a loaded machine the read reached the file 0.3 s into it (CI).
    blocked = value(metrics, "rdma_exporter_device_read_blocked_seconds", device="mlx5_8", reads="netdev")
    assert blocked is not None and blocked >= asked - opened[0] >= 1.0


def test_a_device_only_job_beside_a_stalled_netdev_read_keeps_no_files(
    tmp_path: Path, fifos: Fifos, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A device's kept files are its full job's, and that job is blocked in a netdev read: the device-only
    # job beside it must not use them (nor begin() or close() them under the stuck read).
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8))
    root, collector = sample_collector(tmp_path / "t", 1.5, reads)
    fifos.make(netdev_file(root, STALLED_NETDEVS["mlx5_8"], "speed"))
    timed_scrape(collector)  # the full job blocks in its netdev reads
    asked: list[str] = []
    real = reads.files

    def files(key: str, *, verify: bool) -> OpenFiles:
        asked.append(key)
        return real(key, verify=verify)

    monkeypatch.setattr(reads, "files", files)
    for _ in range(2):
        metrics, _ = timed_scrape(collector)
        assert value(metrics, "rdma_port_state_id", device="mlx5_8", port="1") == 4
    assert [key for key in asked if key.endswith("/mlx5_1")]  # the other devices' full jobs keep theirs
    assert not [key for key in asked if key.endswith("/mlx5_8")]


def test_a_device_blocked_again_within_its_quiet_period_is_logged_once_the_period_is_over(
    tmp_path: Path, fifos: Fifos, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Blocked again soon after a logged episode: a debug line only, but the episode is not "reported", so
    # a device still missing its deadline once the quiet period is over gets its warning then.
    root = make_tree(tmp_path, 2)
    path = device_dir(root, "mlx5_1") / "ports" / "1" / "counters" / "port_rcv_data"
    reads = DeviceReads(WorkerPool(parallelism=4, hard_max=8), FileBudget(0))  # each scrape opens the file anew
    collector = collector_for(root, 0.5, reads)
    caplog.set_level(logging.DEBUG, logger="rdma_exporter")

    def scrape(blocked: bool) -> None:
        fifo = fifos.make(path) if blocked else None
        timed_scrape(collector)
        if fifo is not None:
            fifos.release(fifo, b"1\n")
        wait_until(lambda: settled(reads))

    scrape(True)  # logged
    scrape(False)  # the episode ends
    scrape(True)  # blocked again within the quiet period: debug only
    monkeypatch.setattr(readers, "BLOCKED_LOG_QUIET_SECONDS", 0.0)  # the quiet period is over
    scrape(True)  # still missing its deadline: logged again
    starts = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith("device mlx5_1: no answer before the scrape")
    ]
    assert len(starts) == 2, starts


def test_a_reload_thread_that_cannot_start_is_started_by_a_later_tick_and_runs_what_was_asked(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Out of tasks (TasksMax=) when the server starts: SIGHUPs queue, the warning is logged once, and the
    server loop's next ticks start the thread once tasks are free again."""
    ran: list[int] = []
    reloads = ReloadRequests(lambda: ran.append(1))
    before = set(threading.enumerate())
    refuse_reload_thread_starts(monkeypatch, 2)
    with caplog.at_level(logging.INFO, logger="rdma_exporter.daemon"):
        reloads.ensure_running()
        reloads.request()
        reloads.request()
        reloads.ensure_running()  # a tick, still out of tasks
        assert ran == []
        reloads.ensure_running()
        wait_until(lambda: ran == [1])
        reloads.ensure_running()  # running: no second thread
    said = [record.getMessage() for record in caplog.records if record.name == "rdma_exporter.daemon"]
    assert said == [
        "cannot start the reload thread (can't start new thread); reloads wait until it starts",
        "reload thread started",
    ]
    assert [thread.name for thread in set(threading.enumerate()) - before] == ["reload"]
    reloads.stop()
    wait_until(lambda: not set(threading.enumerate()) - before)


def test_requests_during_a_reload_are_one_more_reload_and_none_runs_after_stop() -> None:
    running = threading.Event()
    release = threading.Event()
    ran: list[int] = []

    def slow_reload() -> None:
        running.set()
        release.wait(10)
        ran.append(1)

    reloads = ReloadRequests(slow_reload)
    before = set(threading.enumerate())
    reloads.ensure_running()
    reloads.request()
    assert running.wait(5)
    for _ in range(10):
        reloads.request()
    running.clear()
    release.set()
    wait_until(lambda: len(ran) == 2)
    time.sleep(0.1)
    assert len(ran) == 2  # the ten queued during the first made one more, not ten

    release.clear()
    running.clear()
    reloads.request()
    assert running.wait(5)
    reloads.request()  # queued behind a running reload when the exporter stops: not run
    reloads.stop()
    reloads.ensure_running()  # a tick after stop() starts nothing
    release.set()
    wait_until(lambda: not set(threading.enumerate()) - before)
    assert len(ran) == 3


def test_a_reload_that_raises_leaves_the_thread_answering(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def broken_then_fine() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("unforeseen")

    reloads = ReloadRequests(broken_then_fine)
    reloads.ensure_running()
    with caplog.at_level(logging.ERROR, logger="rdma_exporter.daemon"):
        reloads.request()
        wait_until(lambda: len(calls) == 1)
        reloads.request()
        wait_until(lambda: len(calls) == 2)
    assert [r.getMessage() for r in caplog.records if r.name == "rdma_exporter.daemon"] == ["reload failed"]
    reloads.stop()


def test_no_reload_thread_starts_again_once_stopped_even_after_the_last_one_ended() -> None:
    """test_requests_during_a_reload_are_one_more_reload_and_none_runs_after_stop ticks while the old
    thread is still alive, which starts nothing either way. Once it has ended, a tick must not start a
    thread that would wait on the queue (and run a SIGHUP queued during shutdown) for good."""
    ran: list[int] = []
    reloads = ReloadRequests(lambda: ran.append(1))
    before = set(threading.enumerate())
    reloads.ensure_running()
    reloads.stop()
    wait_until(lambda: not set(threading.enumerate()) - before)
    reloads.request()
    reloads.ensure_running()  # a tick of a server loop still turning
    time.sleep(0.2)
    assert not set(threading.enumerate()) - before
    assert ran == []
