"""Kept-open attribute files (parse.reader.OpenFiles), the reader pool that adds threads only for slow
jobs, and the engine's handling of both: values stay fresh, replaced or removed files are noticed,
the file budget holds, and a vanished device's files are closed."""

from __future__ import annotations

import ctypes
import errno
import gc
import logging
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest

from rdma_exporter import daemon as daemon_module
from rdma_exporter.collect.readers import DeviceJob, DeviceReads, WorkerPool
from rdma_exporter.config import Config
from rdma_exporter.daemon import FD_RESERVE, build_collector, build_registry, raise_fd_limit
from rdma_exporter.httpserver import Response
from rdma_exporter.parse import reader as reader_module
from rdma_exporter.parse.reader import (
    FileBudget,
    OpenFiles,
    ReadErrors,
    SysfsReader,
    is_sysfs_mount,
    sysfs_mount_points,
)
from rdma_exporter.sample_tree import build_tree, spec_for_devices

from conftest import fail_pread, fake_fd_limits, samples, skip_or_fail


def age(path: Path, seconds: float = 60.0) -> None:
    """Backdate a directory's mtime, as if the tree had been quiet for a while (a settled directory)."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_kept_file_is_reread_in_place_and_counts_against_the_budget(tmp_path: Path) -> None:
    counter = tmp_path / "port_xmit_data"
    counter.write_text("10\n")
    budget = FileBudget(8)
    files = OpenFiles(budget)
    assert files.read(str(counter)) == b"10\n"
    assert len(files) == 1 and budget.used == 1
    with counter.open("r+") as handle:  # the same inode, as a sysfs attribute keeps its inode
        handle.write("11\n")
    assert files.read(str(counter)) == b"11\n"
    assert len(files) == 1 and budget.used == 1  # no second fd
    files.close()
    assert len(files) == 0 and budget.used == 0


def test_dropped_files_close_their_fds(tmp_path: Path) -> None:
    path = tmp_path / "port_rcv_data"
    path.write_text("1\n")
    budget = FileBudget(8)
    files = OpenFiles(budget)
    files.read(str(path))
    (fd,) = files._dirs[str(tmp_path)].fds.values()
    inode = path.stat().st_ino
    del files
    gc.collect()
    try:
        released = os.fstat(fd).st_ino != inode  # the number may already serve another file
    except OSError:
        released = True
    assert released and budget.used == 0


def test_readers_without_a_budget_of_their_own_share_one() -> None:
    assert DeviceReads().budget is DeviceReads().budget  # kept fds are bounded per process


def test_a_long_kept_file_is_read_whole(tmp_path: Path) -> None:
    aer = tmp_path / "aer_dev_correctable"
    text = "".join(f"Type{n} {n}\n" for n in range(100))  # longer than the first, small read
    aer.write_text(text)
    files = OpenFiles(FileBudget(8))
    assert files.read(str(aer)).decode() == text
    assert files.read(str(aer)).decode() == text  # kept: pread, small read, then the whole page


def test_files_over_the_budget_are_read_but_not_kept(tmp_path: Path) -> None:
    paths = []
    for n in range(3):
        path = tmp_path / f"c{n}"
        path.write_text(f"{n}\n")
        paths.append(str(path))
    budget = FileBudget(2)
    first, second = OpenFiles(budget), OpenFiles(budget)
    assert first.read(paths[0]) == b"0\n" and second.read(paths[1]) == b"1\n"
    assert second.read(paths[2]) == b"2\n"  # budget spent: opened, read, closed
    assert (len(first), len(second), budget.used) == (1, 1, 2)
    first.close()
    assert second.read(paths[2]) == b"2\n"
    assert (len(second), budget.used) == (2, 2)


def test_reads_beyond_the_budget_leave_nothing_behind(tmp_path: Path) -> None:
    path = tmp_path / "rate"
    path.write_text("400 Gb/sec (4X NDR)\n")
    files = OpenFiles(FileBudget(0), verify=True)
    for _ in range(5):
        files.begin()
        assert files.read(str(path)) == b"400 Gb/sec (4X NDR)\n"
    assert len(files) == 0 and not files._dirs  # nothing grows per scrape


def test_a_failing_kept_fd_is_dropped_and_the_path_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state"
    path.write_text("4: ACTIVE\n")
    files = OpenFiles(FileBudget(8))
    files.read(str(path))
    calls = fail_pread(monkeypatch, errno.ENODEV, on=lambda fd: not calls)  # the first: a removed kernfs node
    assert files.read(str(path)) == b"4: ACTIVE\n"  # re-opened by path, not an error
    assert len(files) == 1


def test_a_file_that_reads_empty_is_not_kept_and_a_kept_fd_that_reads_empty_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Older kernels' seq_file answers an fd that once read empty with nothing for good, whatever the
    # attribute shows since (parse review): a bond's slaves, empty for a moment, would stay empty.
    slaves = tmp_path / "slaves"
    slaves.write_text("")
    budget = FileBudget(8)
    files = OpenFiles(budget)
    assert files.read(str(slaves)) == b""
    assert len(files) == 0 and budget.used == 0
    slaves.write_text("ens1f0np0 ens1f1np1\n")
    assert files.read(str(slaves)) == b"ens1f0np0 ens1f1np1\n"
    assert len(files) == 1
    (kept,) = files._dirs[str(tmp_path)].fds.values()
    real_pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: b"" if fd == kept else real_pread(fd, n, at))
    assert files.read(str(slaves)) == b"ens1f0np0 ens1f1np1\n"  # the stuck fd dropped, the path read afresh
    assert len(files) == 1 and budget.used == 1  # kept again (the fd number may well be the same)


def test_a_kept_counter_that_reads_empty_is_read_once_more_through_a_fresh_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each read of an mlx5 counter is a firmware query: the fast path's empty answer must not be asked of
    # the same fd again before the path is opened afresh (review: three queries for one value).
    counter = tmp_path / "port_rcv_data"
    counter.write_text("7\n")
    age(tmp_path)
    files = OpenFiles(FileBudget(8), verify=True)
    files.begin()
    assert SysfsReader("d", ReadErrors(), files).uints(str(tmp_path), ["port_rcv_data"]) == {"port_rcv_data": 7}
    files.begin()
    (kept,) = files._dirs[str(tmp_path)].fds.values()
    real_pread, real_open = os.pread, os.open
    preads: list[int] = []
    opens: list[str] = []

    def pread(fd: int, n: int, at: int) -> bytes:
        if fd == kept and not opens:
            preads.append(fd)
            return b""
        return real_pread(fd, n, at)

    def open_(path: str, flags: int, *args: int) -> int:
        opens.append(os.fspath(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "open", open_)
    assert SysfsReader("d", ReadErrors(), files).uints(str(tmp_path), ["port_rcv_data"]) == {"port_rcv_data": 7}
    assert (len(preads), opens) == (1, [str(counter)])


def test_unsettled_directory_notices_a_replaced_file_on_every_read(tmp_path: Path) -> None:
    path = tmp_path / "symbol_error"
    path.write_text("1\n")
    files = OpenFiles(FileBudget(8), verify=True)
    files.begin()
    assert files.read(str(path)) == b"1\n"
    replacement = tmp_path / "new"
    replacement.write_text("2\n")
    os.replace(replacement, path)  # the kept fd now points at an unlinked inode
    assert files.read(str(path)) == b"2\n"
    path.unlink()
    with pytest.raises(FileNotFoundError):
        files.read(str(path))


def test_settled_directory_is_checked_once_per_scrape(tmp_path: Path) -> None:
    counters = tmp_path / "counters"
    counters.mkdir()
    (counters / "a").write_text("1\n")
    (counters / "b").write_text("2\n")
    age(counters)
    files = OpenFiles(FileBudget(8), verify=True)
    files.begin()
    assert files.read(str(counters / "a")) == b"1\n" and files.read(str(counters / "b")) == b"2\n"
    assert files.trusted(str(counters)) is None  # just kept: each read checks its file
    files.begin()  # the directory is old enough: its mtime now proves the files unchanged
    assert files.trusted(str(counters)) is not None
    (counters / "b").unlink()
    (counters / "b").write_text("3\n")
    files.begin()  # the directory changed: its kept files are dropped and reopened by path
    assert files.read(str(counters / "b")) == b"3\n"
    assert files.read(str(counters / "a")) == b"1\n"


def test_uints_fast_path_and_fallback_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    contents = {
        "plain": "5\n",
        "zero": "0\n",
        "big": "18446744073709551615\n",
        "too_big": "18446744073709551616\n",
        "signed": "+5\n",
        "underscore": "1_000\n",
        "garbage": "x\n",
        "no_pma": "N/A (no PMA)\n",
        "blank_padded": " 7 \n",
        "no_newline": "8",
    }
    for name, text in contents.items():
        (tmp_path / name).write_text(text)
    expected = {"plain": 5, "zero": 0, "big": 2**64 - 1, "blank_padded": 7, "no_newline": 8}

    plain_errors = ReadErrors()
    assert SysfsReader("d", plain_errors).uints(str(tmp_path), sorted(contents)) == expected
    assert plain_errors.counts == {("d", "malformed"): 4, ("d", "unsupported"): 1}
    files = OpenFiles(FileBudget(64))
    kept_errors = ReadErrors()
    reader = SysfsReader("d", kept_errors, files)
    assert reader.uints(str(tmp_path), sorted(contents)) == expected
    assert reader.files_read == len(contents)
    assert kept_errors.counts == plain_errors.counts
    # The second pass reads kept files through the fast path, each file once, odd content too (core
    # review, stop 70: uint() read those again, a second firmware query). The no-PMA file is left out for
    # a minute, as a refusing one is, instead of being counted at every scrape.
    preads: list[int] = []
    real_pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, size, offset: preads.append(fd) or real_pread(fd, size, offset))
    kept_errors = ReadErrors()
    reader = SysfsReader("d", kept_errors, files)
    assert reader.uints(str(tmp_path), sorted(contents)) == expected
    assert reader.files_read == len(preads) == len(set(preads)) == len(contents) - 1
    assert kept_errors.counts == {("d", "malformed"): 4}


def test_a_refusal_by_a_device_only_job_holds_for_the_job_that_keeps_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The device-only job (beside a full job stuck in its netdev reads) records its refusals in the full
    # job's OpenFiles but may not close that job's files. The full job's kept read came before its refusal
    # check, so it read the file again, counted it again and restarted the minute (review, stop 71).
    now = [1000.0]
    monkeypatch.setattr(reader_module, "refusal_clock", lambda: now[0])
    counters = tmp_path / "counters"
    counters.mkdir()
    # Kept open by the full job, and no value given yet (one that did is an io error, not a refusal).
    (counters / "port_rcv_data").write_text("N/A (no PMA)\n")
    files = OpenFiles(FileBudget(16))
    assert files.read(str(counters / "port_rcv_data")) == b"N/A (no PMA)\n"
    assert len(files) == 1
    now[0] += 15.0
    device_only = ReadErrors()
    assert SysfsReader("d", device_only, memory=files).uints(str(counters), ["port_rcv_data"]) == {}
    assert device_only.counts == {("d", "unsupported"): 1}
    now[0] += 15.0
    full = ReadErrors()
    reader = SysfsReader("d", full, files)
    assert reader.uints(str(counters), ["port_rcv_data"]) == {}
    assert (full.counts, reader.files_read, len(files)) == ({}, 0, 0)  # not read, and the kept file closed
    # Back to numbers: read again once the minute from the refusal is over, not before.
    (counters / "port_rcv_data").write_text("7\n")
    now[0] = 1015.0 + 59.9
    assert SysfsReader("d", ReadErrors(), files).uints(str(counters), ["port_rcv_data"]) == {}
    now[0] = 1015.0 + 60.0
    assert SysfsReader("d", ReadErrors(), files).uints(str(counters), ["port_rcv_data"]) == {"port_rcv_data": 7}


def test_sysfs_mount_points() -> None:
    text = (
        "22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n"
        "40 22 0:6 / /sys/kernel/debug rw - debugfs debugfs rw\n"
        "77 1 0:21 / /host/my\\040sys rw shared:5 - sysfs sysfs rw\n"
        "78 1 0:21 / /host/tab\\011back\\134slash rw - sysfs sysfs rw\n"
        "garbage\n"
        "1 2 3 4 /tmp/x - tmpfs tmpfs rw\n"
        # A container runtime mounting a tmpfs over a sysfs hides it, as the kernel does.
        "90 1 0:21 / /covered rw - sysfs sysfs rw\n"
        "91 1 0:40 / /covered rw - tmpfs tmpfs rw\n"
    )
    assert sysfs_mount_points(text) == {"/sys", "/host/my sys", "/host/tab\tback\\slash"}


# Random text never holds a `fields - type ...` line; these do, with too few fields, escapes cut short
# and empty tails, so that the parsing behind the separator runs.
mountinfo_line_like = st.builds(
    "{}{}{}".format,
    st.lists(st.one_of(st.sampled_from(["22", "1", "0:21", "/", "/sys", "rw", "/a\\040b", "/x\\0", "\\"]),
                       st.text(max_size=6)), max_size=7).map(" ".join),
    st.sampled_from([" - ", " -", "- ", " - - "]),
    st.one_of(st.sampled_from(["sysfs sysfs rw", "sysfs", "tmpfs tmpfs rw", "", " sysfs"]), st.text(max_size=12)),
)


@given(st.one_of(st.text(max_size=200), st.lists(mountinfo_line_like, max_size=8).map("\n".join)))
def test_sysfs_mount_points_never_raises(text: str) -> None:
    points = sysfs_mount_points(text)
    assert isinstance(points, frozenset) and all(isinstance(point, str) for point in points)


def test_is_sysfs_mount(tmp_path: Path) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(f"22 1 0:21 / {tmp_path} rw - sysfs sysfs rw\n")
    assert is_sysfs_mount(tmp_path, str(table)) is True
    # The mount point itself, not a directory inside it: that is no sysfs root.
    assert is_sysfs_mount(tmp_path / "class", str(table)) is False
    # An unreadable table is neither answer; each caller picks its safe guess.
    assert is_sysfs_mount(tmp_path, str(tmp_path / "absent")) is None
    assert is_sysfs_mount(tmp_path) is False
    # The live kernel's, by the real table: what decides udev mode and the ethtool ioctl in production.
    if not is_sysfs_mount("/sys"):
        skip_or_fail("/sys is not a sysfs mount here")



def test_mount_table_lines_cut_short_are_ignored() -> None:
    # A line with fewer than five fields before the separator has no mount point: skipped, not a crash
    # that would take the mode decision (udev, ethtool ioctl) down with it.
    text = "1 2 3 4 - sysfs sysfs rw\n1 2 3 - sysfs sysfs rw\n22 1 0:21 / /sys rw - sysfs sysfs rw\n"
    assert sysfs_mount_points(text) == {"/sys"}


def test_is_sysfs_mount_resolves_the_path_it_is_given(tmp_path: Path) -> None:
    # --sysfs may be given through a symlink or with a trailing slash; the table lists the real path.
    root = tmp_path / "host" / "sys"
    root.mkdir(parents=True)
    (tmp_path / "sys-link").symlink_to(root)
    table = tmp_path / "mountinfo"
    table.write_text(f"22 1 0:21 / {root} rw - sysfs sysfs rw\n")
    assert is_sysfs_mount(tmp_path / "sys-link", str(table)) is True
    assert is_sysfs_mount(f"{root}/", str(table)) is True
    assert is_sysfs_mount(root / ".." / "sys", str(table)) is True

# --- the pool -----------------------------------------------------------------------------------------


def run_jobs(pool: WorkerPool, jobs: list[DeviceJob], timeout: float = 5.0) -> None:
    """Wait for `jobs` as a scrape does: the waiting thread calls rebalance() while it waits."""
    for job in jobs:
        pool.submit(job)
    end = time.monotonic() + timeout
    while not all(job.done.is_set() for job in jobs):
        assert time.monotonic() < end, "jobs did not finish"
        time.sleep(min(pool.spill_after / 2, 0.01))
        pool.rebalance()


def test_quick_jobs_share_one_thread() -> None:
    # "Quick" is relative to spill_after, in wall-clock time: with the default 20 ms, a loaded CI machine
    # that leaves the reader thread without a CPU for that long rightly spills to a second thread
    # (seen once: the first job on rdma-read-1, the other seven on rdma-read-2).
    pool = WorkerPool(parallelism=4, spill_after=5.0)
    names: list[str] = []
    jobs = [DeviceJob(f"k{n}", f"d{n}", lambda job: names.append(threading.current_thread().name)) for n in range(8)]
    run_jobs(pool, jobs)
    assert len(names) == 8 and len(set(names)) == 1
    assert pool.threads == 1


def test_a_slow_job_lets_another_thread_take_the_queue() -> None:
    pool = WorkerPool(parallelism=4, spill_after=0.02)
    quick_done = threading.Event()
    finished: list[str] = []
    released: list[bool] = []
    threads: set[str] = set()

    def slow(job: DeviceJob) -> None:
        threads.add(threading.current_thread().name)
        # Blocked until the quick job has run, which only another thread can do meanwhile. (Released by
        # a timer, the quick job had to finish within a fixed time, which a loaded machine missed.)
        released.append(quick_done.wait(5))
        finished.append(job.device)

    def quick(job: DeviceJob) -> None:
        threads.add(threading.current_thread().name)
        finished.append(job.device)
        quick_done.set()

    jobs = [DeviceJob("k0", "slow", slow), DeviceJob("k1", "quick", quick)]
    run_jobs(pool, jobs, timeout=10.0)
    assert released == [True] and finished == ["quick", "slow"]  # not queued behind the slow one
    assert len(threads) == 2


def test_stuck_jobs_do_not_hold_the_parallelism() -> None:
    """As many stuck reads as read threads held every slot until a scrape abandoned them at its deadline,
    so in the first scrape of such a fault no healthy device was read (found by review: 4 stuck HCAs
    with the default 4 threads served none of the others). Past stuck_after they no longer count."""
    pool = WorkerPool(parallelism=2, spill_after=0.02, stuck_after=0.2)
    healthy_done = threading.Event()
    released: list[bool] = []
    lock = threading.Lock()
    in_flight = [0]
    peak = [0]

    def counted(body: Callable[[], None]) -> None:
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        try:
            body()
        finally:
            with lock:
                in_flight[0] -= 1

    def stuck(job: DeviceJob) -> None:
        # blocked until the healthy jobs ran, which needs a third thread
        counted(lambda: released.append(healthy_done.wait(5)))

    done: list[str] = []

    def healthy(job: DeviceJob) -> None:
        def body() -> None:
            time.sleep(0.05)  # long enough for a pool without its bound to run them side by side
            done.append(job.device)
            if len(done) == 3:
                healthy_done.set()

        counted(body)

    jobs = [DeviceJob(f"s{n}", f"stuck{n}", stuck) for n in range(2)]
    jobs += [DeviceJob(f"h{n}", f"healthy{n}", healthy) for n in range(3)]
    run_jobs(pool, jobs, timeout=10.0)
    assert released == [True, True]
    assert sorted(done) == ["healthy0", "healthy1", "healthy2"]
    assert 2 < peak[0] <= 4, peak[0]  # two stuck, at most two more: the parallelism still bounds the others


def test_slow_jobs_read_at_most_twice_the_parallelism_at_once() -> None:
    """Jobs past stuck_after give up their slot, but where every device is merely slow (busy firmware) that
    must not let reads in parallel climb to hard_max: at most `parallelism` stuck ones count (found by
    the final review: 16 jobs of 3.5 s ran 16 at once with 4 read threads)."""
    pool = WorkerPool(parallelism=2, hard_max=16, spill_after=0.02, stuck_after=0.05)
    lock = threading.Lock()
    running = [0]
    peak = [0]

    def slow(job: DeviceJob) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.3)
        with lock:
            running[0] -= 1

    run_jobs(pool, [DeviceJob(f"k{n}", f"d{n}", slow) for n in range(12)], timeout=20.0)
    assert 2 < peak[0] <= 4, peak[0]  # the stuck allowance is used, and bounded


# --- the engine and the daemon ------------------------------------------------------------------------


def scrape(collector: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return samples(generate_latest(build_registry(collector)).decode())  # type: ignore[arg-type]


def test_removed_device_closes_its_files_and_returns_the_budget(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    reads = DeviceReads(WorkerPool(), FileBudget(10_000))
    collector = build_collector(replace(Config(), sysfs=root), reads=reads)
    scrape(collector)
    both = reads.open_files()
    assert both > 0 and reads.budget.used == both
    (root / "class" / "infiniband" / "mlx5_1").unlink()
    scrape(collector)
    one = reads.open_files()
    assert 0 < one < both and reads.budget.used == one


def test_collectors_sharing_the_reads_keep_each_others_files(tmp_path: Path) -> None:
    # One DeviceReads serves every collector of the process: a scrape of one tree closes the files of the
    # devices gone from that tree, not those of another tree's devices.
    reads = DeviceReads(WorkerPool(), FileBudget(10_000))
    first, second = (
        build_collector(replace(Config(), sysfs=build_tree(tmp_path / name, spec_for_devices(1))), reads=reads)
        for name in ("a", "b")
    )
    scrape(first)
    kept = reads.open_files()
    scrape(second)
    assert kept > 0 and reads.open_files() > kept


def test_a_device_reads_through_the_same_kept_files_scrape_after_scrape(tmp_path: Path) -> None:
    # What its job kept open is what the device's next job reads through (the point of keeping files), not a
    # fresh set opened again each scrape.
    root = build_tree(tmp_path / "t", spec_for_devices(1))
    reads = DeviceReads(WorkerPool(), FileBudget(10_000))
    collector = build_collector(replace(Config(), sysfs=root), reads=reads)
    scrape(collector)
    key = collector.inventory.class_dir + "mlx5_0"
    kept = reads.files(key, verify=True)
    assert len(kept) > 0 and len(kept) == reads.open_files() == reads.budget.used
    scrape(collector)
    assert reads.files(key, verify=True) is kept and reads.budget.used == len(kept)


def test_static_info_read_again_starts_the_device_on_fresh_kept_files(tmp_path: Path) -> None:
    # A device whose static info is read again (a uevent) may have lost files since (a counter gone after a
    # firmware update): its kept files are closed first, so none of a file it no longer reads stays open.
    # Kept files are checked as on sysfs (not at all), so nothing but that closing would notice.
    root = build_tree(tmp_path / "t", spec_for_devices(1))
    reads = DeviceReads(WorkerPool(), FileBudget(10_000))
    collector = build_collector(replace(Config(), sysfs=root), reads=reads)
    collector._verify_files = False
    scrape(collector)
    (root / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters" / "port_rcv_data").unlink()
    collector.inventory.invalidate("mlx5_0")
    scrape(collector)
    fresh = DeviceReads(WorkerPool(), FileBudget(10_000))
    scrape(build_collector(replace(Config(), sysfs=root), reads=fresh))
    assert reads.budget.used == reads.open_files() == fresh.open_files() > 0


def test_a_budget_lowered_by_a_reload_closes_the_engines_kept_files(tmp_path: Path) -> None:
    # A reload with a lower --read.max-open-files sets the shared budget's limit: each device's job gives its
    # kept files back at its next scrape, before its reads, which then keep none over the new limit.
    root = build_tree(tmp_path / "t", spec_for_devices(2))
    reads = DeviceReads(WorkerPool(), FileBudget(10_000))
    collector = build_collector(replace(Config(), sysfs=root), reads=reads)
    scrape(collector)
    assert reads.open_files() > 0
    reads.budget.limit = 0
    metrics = scrape(collector)
    assert reads.open_files() == reads.budget.used == 0
    assert metrics[("rdma_exporter_devices", ())] == 2


def test_settled_tree_sees_files_replaced_between_scrapes(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "t", spec_for_devices(1))
    counters = (root / "class" / "infiniband" / "mlx5_0").resolve() / "ports" / "1" / "counters"
    for directory, _, _ in os.walk(root):
        age(Path(directory))
    collector = build_collector(replace(Config(), sysfs=root), reads=DeviceReads(WorkerPool(), FileBudget(10_000)))
    key = ("rdma_port_symbol_errors_total", (("device", "mlx5_0"), ("port", "1")))
    first = scrape(collector)[key]
    scrape(collector)  # every directory now counts as settled
    replacement = counters / "symbol_error.new"
    replacement.write_text(f"{int(first) + 5}\n")
    os.replace(replacement, counters / "symbol_error")
    assert scrape(collector)[key] == first + 5
    (counters / "symbol_error").unlink()
    assert key not in scrape(collector)


def test_fd_limit_is_raised_to_fit_the_kept_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))  # systemd's default soft limit
        room = raise_fd_limit(100)
        now, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert room == 100 and now >= 100 + FD_RESERVE
        if hard != resource.RLIM_INFINITY:
            # Asking past the hard limit raises the soft one to it, instead of failing to raise it at all.
            assert raise_fd_limit(hard) == hard - FD_RESERVE  # capped by the hard limit, minus the reserve
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_fd_limits_below_the_reserve_leave_no_kept_files_and_one_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    # A container's hard limit of 100 cannot be raised: no file is kept (not a negative budget) and one
    # connection at a time is served (not none). Exactly the reserve is room for every connection.
    from rdma_exporter import daemon
    from rdma_exporter.httpserver import MAX_CONNECTIONS

    limits = fake_fd_limits(monkeypatch, 100, 100)
    assert (daemon.raise_fd_limit(500), daemon.connection_cap()) == (0, 1)
    limits[:] = [FD_RESERVE, FD_RESERVE]
    assert daemon.connection_cap() == MAX_CONNECTIONS


def test_large_answers_return_freed_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    from rdma_exporter import daemon

    calls: list[int] = []
    monkeypatch.setattr(daemon, "_TRIM", lambda: calls.append(1))
    daemon.release_memory(daemon.Response(200, b"x" * daemon.TRIM_AFTER_BYTES, "text/plain"))
    daemon.release_memory(daemon.Response(200, b"ok", "text/plain"))  # /healthz and friends: not worth it
    assert calls == [1]


def test_default_budget_leaves_room_under_a_low_fd_limit() -> None:
    from rdma_exporter.collect.readers import default_file_budget

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # systemd's and many shells' default
        assert default_file_budget() == 448
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_real_sysfs_kept_file_gives_fresh_values() -> None:
    """The kernel behaviour the design rests on: pread at offset 0 re-runs show() on a kept sysfs fd."""
    import socket

    path = "/sys/class/net/lo/statistics/tx_packets"
    if not os.path.exists(path):
        skip_or_fail(f"no sysfs loopback ({path})")
    assert is_sysfs_mount("/sys")
    files = OpenFiles(FileBudget(4))
    before = int(files.read(path))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver, socket.socket(
        socket.AF_INET, socket.SOCK_DGRAM
    ) as sender:
        receiver.bind(("127.0.0.1", 0))
        for _ in range(20):
            sender.sendto(b"x", receiver.getsockname())
    after = int(files.read(path))
    assert len(files) == 1  # the same kept fd answered both reads
    assert after >= before + 20
    files.close()


def test_a_failing_attribute_is_read_once_and_counted_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stuck or failing mlx5 counter costs a firmware query per read: no retry through a fresh open.
    (tmp_path / "good").write_text("1\n")
    (tmp_path / "bad").write_text("2\n")
    files = OpenFiles(FileBudget(8))
    reader = SysfsReader("mlx5_0", ReadErrors(), files)
    assert reader.uints(str(tmp_path), ["bad", "good"]) == {"bad": 2, "good": 1}
    bad_fd = files._dirs[str(tmp_path)].fds["bad"]
    reads = fail_pread(monkeypatch, errno.EIO, on=lambda fd: fd == bad_fd)
    errors = ReadErrors()
    reader = SysfsReader("mlx5_0", errors, files)
    assert reader.uints(str(tmp_path), ["bad", "good"]) == {"good": 1}
    assert reads.count(bad_fd) == 1 and errors.counts == {("mlx5_0", "io"): 1}
    assert "bad" not in files._dirs[str(tmp_path)].fds  # opened afresh next scrape


def test_settling_checks_files_replaced_within_one_timestamp_tick(tmp_path: Path) -> None:
    path = tmp_path / "symbol_error"
    path.write_text("1\n")
    files = OpenFiles(FileBudget(8), verify=True)
    assert files.read(str(path)) == b"1\n"
    replacement = tmp_path / "new"
    replacement.write_text("2\n")
    os.replace(replacement, path)
    # The directory's mtime as recorded when the file was kept (a coarse clock: the same tick), and old.
    then = time.time_ns() - 10_000_000_000
    os.utime(tmp_path, ns=(then, then))
    kept = files._dirs[str(tmp_path)]
    kept.mtime_ns = then
    files.begin()
    assert kept.settled
    assert files.read(str(path)) == b"2\n"


def test_a_lowered_budget_closes_kept_files_at_the_next_scrape(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("1\n")
    budget = FileBudget(8)
    files = OpenFiles(budget)
    files.read(str(tmp_path / "a"))
    budget.limit = 0  # a reload with --read.max-open-files=0
    files.begin()
    assert len(files) == 0 and budget.used == 0
    assert files.read(str(tmp_path / "a")) == b"1\n" and len(files) == 0


def test_pool_recovers_from_a_thread_that_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = WorkerPool(parallelism=2)
    real_start = threading.Thread.start
    failures = [1]

    def start_once_failing(thread: threading.Thread) -> None:
        if failures:
            failures.pop()
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_once_failing)
    ran: list[str] = []
    first = DeviceJob("k0", "d0", lambda job: ran.append(job.device))
    pool.submit(first)  # no thread could start: the job waits in the queue
    assert not first.done.wait(0.1) and pool.threads == 0
    run_jobs(pool, [DeviceJob("k1", "d1", lambda job: ran.append(job.device))])
    assert first.done.wait(2) and sorted(ran) == ["d0", "d1"]


def test_encoded_body_cache_can_forget_under_its_own_lock() -> None:
    # Dereferencing the cache's weak reference under the lock may free the FamilySet right there, which
    # runs the forget callback on the same thread: the lock must be reentrant or /metrics hangs for good.
    import weakref

    from rdma_exporter import daemon
    from rdma_exporter.collect.base import FamilySet

    exporter = daemon.Exporter(None)  # type: ignore[arg-type]
    families = FamilySet()
    ref = weakref.ref(families, exporter._forget)
    exporter._encoded = (ref, {False: b"x"})
    finished = threading.Event()

    def drop_under_lock() -> None:
        nonlocal families
        with exporter._encoded_lock:
            del families  # the last reference: the callback runs now, on this thread
        finished.set()

    worker = threading.Thread(target=drop_under_lock, daemon=True)
    worker.start()
    assert finished.wait(2), "the forget callback deadlocked on the cache lock"
    assert exporter._encoded == (None, {})


# Run in a child: the allocator state of the test process is not ours to change or to rely on.
_MMAP_PROBE = """
import ctypes, os, sys
from rdma_exporter import daemon

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
fixed = daemon.fix_mmap_threshold() if sys.argv[1] == "fix" else None
big = bytearray(4 << 20)
del big  # glibc raises a dynamic threshold to this size here
# glibc only consults the threshold when no free chunk of the heap can serve a request, and how much is
# free after start-up depends on the environment: allocate past all of it (fordblks, not only the top
# that keepcost counts: in one fresh-clone CI run every block came from the heap, most likely from free
# chunks in the bins, which keepcost leaves out), in blocks the size of a large family's text.
size = 300 << 10
before = mallinfo2().hblkhd
blocks = [bytearray(size) for _ in range(mallinfo2().fordblks // size + 2)]
print(fixed, mallinfo2().hblkhd - before)
"""


def run_allocator_probe(script: str, mode: str) -> list[str]:
    """Run `script` in a child with glibc's allocator at its defaults (no MALLOC_* or tunables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run(
        [sys.executable, "-c", script, mode], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.split()


def test_mmap_threshold_stays_fixed_after_large_blocks_are_freed() -> None:
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        skip_or_fail("no mallinfo2 in this libc (needs glibc 2.33 or later)")
    # Default glibc behaviour: after a 4 MB block is freed, 300 KB ones come from the heap.
    assert run_allocator_probe(_MMAP_PROBE, "default") == ["None", "0"]
    fixed, grown = run_allocator_probe(_MMAP_PROBE, "fix")
    assert fixed == "True" and int(grown) >= 300 << 10


_ARENA_PROBE = """
import ctypes, os, sys, tempfile, threading
from rdma_exporter import daemon

one = daemon.use_one_malloc_arena() if sys.argv[1] == "one" else None
threads = [threading.Thread(target=lambda: [bytearray(2000) for _ in range(100)]) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "malloc.xml")
    stream = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print(one, open(path).read().count("<heap nr="))
"""


@pytest.mark.parametrize(
    ("variable", "value"),
    [("MALLOC_ARENA_MAX", "4"), ("GLIBC_TUNABLES", "glibc.malloc.check=0:glibc.malloc.arena_max=4")],
)
def test_an_operators_own_arena_setting_is_kept(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    # The environment variable or the glibc tunable, whichever the unit's Environment= sets, wins.
    from rdma_exporter import daemon

    monkeypatch.setenv(variable, value)
    assert daemon.use_one_malloc_arena() is False


def test_threads_share_one_malloc_arena() -> None:
    # Default glibc behaviour: a thread's first malloc gives it an arena of its own.
    default, heaps = run_allocator_probe(_ARENA_PROBE, "default")
    assert default == "None" and int(heaps) >= 2
    assert run_allocator_probe(_ARENA_PROBE, "one") == ["True", "1"]


def test_a_failing_close_costs_neither_the_read_nor_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).write_text("1\n")
    budget = FileBudget(8)
    files = OpenFiles(budget, verify=True)
    for name in ("a", "b", "c"):
        files.read(str(tmp_path / name))
    real_close = os.close
    closed: list[int] = []

    def close_reporting_eio(fd: int) -> None:
        real_close(fd)  # Linux has freed the fd whatever close(2) then says
        closed.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "close", close_reporting_eio)
    replaced = tmp_path / "a.new"
    replaced.write_text("2\n")
    replaced.rename(tmp_path / "a")  # a new inode: the kept fd is dropped on the next read
    assert files.read(str(tmp_path / "a")) == b"2\n"
    assert len(closed) == 1 and len(files) == 3 and budget.used == 3
    files.close()  # every directory's fds, though each close reports an error
    assert len(closed) == 4 and len(files) == 0 and budget.used == 0


def test_an_unreadable_fd_limit_keeps_room_for_the_reserve(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A seccomp filter refusing prlimit64: the limit is taken as systemd's 1024, and the kept files must
    leave FD_RESERVE of it for connections and the daemon's own descriptors, or EMFILE on accept."""

    def refuse(which: int) -> tuple[int, int]:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(daemon_module.resource, "getrlimit", refuse)
    with caplog.at_level(logging.WARNING, logger="rdma_exporter.daemon"):
        room = daemon_module.raise_fd_limit(1000)
    assert room == daemon_module.ASSUMED_FD_LIMIT - daemon_module.FD_RESERVE
    assert "cannot read the open-file limit" in caplog.text


def test_a_large_scrapes_answer_is_followed_by_a_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node with many devices answers with a megabyte or more (sample tree with 16 devices and VFs):
    after such an answer freed memory is returned, whatever the exact threshold."""
    calls: list[int] = []
    monkeypatch.setattr(daemon_module, "_TRIM", lambda: calls.append(1))
    daemon_module.release_memory(Response(200, b"x" * (1024 * 1024), "text/plain"))
    assert calls == [1]


def test_run_sets_the_allocator_up_before_the_daemon_starts_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests of fix_mmap_threshold and use_one_malloc_arena call them directly; nothing checked that
    run() calls them, and before the first thread starts (an arena setting applies to new threads only)."""
    calls: list[str] = []
    monkeypatch.setattr(daemon_module, "fix_mmap_threshold", lambda: calls.append("mmap") or True)
    monkeypatch.setattr(daemon_module, "use_one_malloc_arena", lambda: calls.append("arena") or True)

    def daemon(*args: object) -> None:
        calls.append("daemon")
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(daemon_module, "Daemon", daemon)
    assert daemon_module.run(Config()) == 1
    assert calls == ["mmap", "arena", "daemon"]
