"""Kept-open files of parse.reader on fixture (non-sysfs) trees: a directory removed or replaced, a file
replaced within one timestamp tick, a kept fd failing, and what each costs in values, errors and fds."""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path

import pytest

from rdma_exporter.parse.reader import FileBudget, OpenFiles, ReadErrors, SysfsReader

from conftest import fail_pread


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def age(path: Path, seconds: float = 60.0) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_removed_directory_gives_back_its_files(tmp_path: Path) -> None:
    port = tmp_path / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    budget = FileBudget(8)
    files = OpenFiles(budget, verify=True)
    before = open_fds()
    files.begin()
    assert files.read(str(port / "state")) == b"4: ACTIVE\n"
    assert budget.used == 1
    shutil.rmtree(tmp_path / "ports")  # a device removed from a fixture tree: its kept fd stays readable
    files.begin()
    assert budget.used == 0 and open_fds() == before and len(files) == 0
    with pytest.raises(FileNotFoundError):
        files.read(str(port / "state"))


def test_a_directory_replaced_within_one_timestamp_tick_is_noticed(tmp_path: Path) -> None:
    # A device re-created under the same name: a new directory, whose mtime a coarse clock may make equal
    # to the old one's. Its inode still tells them apart.
    port = tmp_path / "1"
    port.mkdir()
    (port / "state").write_text("1: DOWN\n")
    age(port)
    files = OpenFiles(FileBudget(8), verify=True)
    files.begin()
    assert files.read(str(port / "state")) == b"1: DOWN\n"
    files.begin()  # quiet for long enough: settled
    recorded = port.stat().st_mtime_ns
    fresh = tmp_path / "1.new"
    fresh.mkdir()
    (fresh / "state").write_text("4: ACTIVE\n")
    os.utime(fresh, ns=(recorded, recorded))
    port.rename(tmp_path / "1.old")
    fresh.rename(port)
    files.begin()
    assert files.read(str(port / "state")) == b"4: ACTIVE\n"


def test_a_young_directory_is_not_trusted_by_its_mtime(tmp_path: Path) -> None:
    # Until a directory has been quiet for two seconds, a file replaced in it may leave its mtime as it
    # was (the same coarse tick): each read must then check its kept file, also after a begin().
    path = tmp_path / "symbol_error"
    path.write_text("1\n")
    # Young however slow this machine is: a directory mtime a minute ahead of the clock.
    recorded = time.time_ns() + 60_000_000_000
    os.utime(tmp_path, ns=(recorded, recorded))
    files = OpenFiles(FileBudget(8), verify=True)
    files.begin()
    assert SysfsReader("mlx5_0", ReadErrors(), files).uints(str(tmp_path), ["symbol_error"]) == {"symbol_error": 1}
    files.begin()  # the directory is young: not settled yet
    replacement = tmp_path / "new"
    replacement.write_text("2\n")
    os.replace(replacement, path)
    os.utime(tmp_path, ns=(recorded, recorded))  # the same tick as when the file was kept
    files.begin()
    reader = SysfsReader("mlx5_0", ReadErrors(), files)
    assert reader.uints(str(tmp_path), ["symbol_error"]) == {"symbol_error": 2}


def test_a_file_replaced_before_the_next_scrape_is_not_read_from_the_old_fd(tmp_path: Path) -> None:
    path = tmp_path / "symbol_error"
    path.write_text("1\n")
    files = OpenFiles(FileBudget(8), verify=True)
    files.begin()
    assert SysfsReader("d", ReadErrors(), files).uints(str(tmp_path), ["symbol_error"]) == {"symbol_error": 1}
    replacement = tmp_path / "new"
    replacement.write_text("2\n")
    os.replace(replacement, path)
    # No begin() in between: an unsettled directory is checked per read, in the fast path too.
    assert SysfsReader("d", ReadErrors(), files).uints(str(tmp_path), ["symbol_error"]) == {"symbol_error": 2}


def test_a_kept_attribute_failing_is_one_error_and_no_second_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # EIO from a kept `rate` (firmware query failed): counted once, not retried through a fresh open,
    # and the fd dropped so that the next scrape opens the path again.
    path = tmp_path / "rate"
    path.write_text("100 Gb/sec (4X EDR)\n")
    budget = FileBudget(8)
    files = OpenFiles(budget)
    assert SysfsReader("mlx5_0", ReadErrors(), files).text(str(path)) == "100 Gb/sec (4X EDR)"
    real_open = os.open
    opens: list[str] = []

    def counting_open(name: str, flags: int, mode: int = 0o777) -> int:
        opens.append(name)
        return real_open(name, flags, mode)

    fail_pread(monkeypatch, errno.EIO)
    monkeypatch.setattr(os, "open", counting_open)
    errors = ReadErrors()
    assert SysfsReader("mlx5_0", errors, files).text(str(path)) is None
    monkeypatch.undo()
    assert errors.counts == {("mlx5_0", "io"): 1}
    assert opens == [] and len(files) == 0 and budget.used == 0
    assert SysfsReader("mlx5_0", ReadErrors(), files).text(str(path)) == "100 Gb/sec (4X EDR)"


def test_a_removed_kernfs_node_in_the_counter_loop_is_read_again_by_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A kept counter fd answering ENODEV (the device was removed and re-created) is no error: the path
    # is opened afresh and its value read.
    (tmp_path / "a").write_text("1\n")
    (tmp_path / "b").write_text("2\n")
    budget = FileBudget(8)
    files = OpenFiles(budget)
    assert SysfsReader("d", ReadErrors(), files).uints(str(tmp_path), ["a", "b"]) == {"a": 1, "b": 2}
    fds_before = open_fds()
    stale = files.trusted(str(tmp_path))["a"]  # type: ignore[index]
    fail_pread(monkeypatch, errno.ENODEV, on=lambda fd: fd == stale)
    errors = ReadErrors()
    reader = SysfsReader("d", errors, files)
    assert reader.uints(str(tmp_path), ["a", "b"]) == {"a": 1, "b": 2}
    assert errors.total() == 0 and reader.files_read == 2
    assert budget.used == 2 and len(files) == 2 and open_fds() == fds_before


def test_a_stuck_fast_read_is_placed_at_its_directory_after_a_slow_read_of_another_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The blocked-read line names `reader.at`. A file of the loop that takes the slow path (garbage here)
    # sets it to that file; the kept files read fast after it must not be blamed on it.
    for name, text in (("a", "1\n"), ("b", "2\n"), ("c", "3\n")):
        (tmp_path / name).write_text(text)
    files = OpenFiles(FileBudget(8))
    assert SysfsReader("d", ReadErrors(), files).uints(str(tmp_path), ["a", "b", "c"]) == {"a": 1, "b": 2, "c": 3}
    (tmp_path / "b").write_text("junk\n")
    reader = SysfsReader("d", ReadErrors(), files)
    kept_c = files.trusted(str(tmp_path))["c"]  # type: ignore[index]
    at_c: list[object] = []
    real_pread = os.pread

    def pread(fd: int, size: int, offset: int) -> bytes:
        if fd == kept_c:
            at_c.append(reader.at)
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", pread)
    assert reader.uints(str(tmp_path), ["a", "b", "c"]) == {"a": 1, "c": 3}
    assert at_c == [str(tmp_path)]


def test_a_failing_counter_counts_as_a_file_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").write_text("1\n")
    files = OpenFiles(FileBudget(8))
    SysfsReader("d", ReadErrors(), files).uints(str(tmp_path), ["a"])
    fail_pread(monkeypatch, errno.EIO)
    reader = SysfsReader("d", ReadErrors(), files)
    assert reader.uints(str(tmp_path), ["a"]) == {}
    assert reader.files_read == 1


def test_a_file_that_cannot_be_kept_gives_its_budget_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A path whose directory cannot be watched (here: relative, so its directory "" does not stat) is
    # read but not kept, and neither its fd nor its share of the budget stays behind.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rate").write_text("100 Gb/sec (4X EDR)\n")
    budget = FileBudget(8)
    files = OpenFiles(budget, verify=True)
    before = open_fds()
    for _ in range(3):
        files.begin()
        assert files.read("rate") == b"100 Gb/sec (4X EDR)\n"
    assert budget.used == 0 and len(files) == 0 and open_fds() == before


def test_the_budget_is_never_exceeded_by_racing_takers() -> None:
    # Readers check `used < limit` unlocked first; two of them may pass it together, so take() itself
    # must refuse the one over the limit.
    budget = FileBudget(2)
    assert [budget.take() for _ in range(3)] == [True, True, False]
    assert budget.used == 2
    budget.give(1)
    assert budget.take() and not budget.take()


def test_a_full_budget_keeps_its_files_across_scrapes(tmp_path: Path) -> None:
    # begin() gives files back only when the budget was lowered below what is kept (a reload); a budget
    # used exactly to its limit is the steady state of a large node, not a reason to reopen every file.
    for name in ("a", "b"):
        (tmp_path / name).write_text("1\n")
    budget = FileBudget(2)
    files = OpenFiles(budget)
    SysfsReader("d", ReadErrors(), files).uints(str(tmp_path), ["a", "b"])
    kept = dict(files.trusted(str(tmp_path)) or {})
    assert len(kept) == 2 and budget.used == 2
    files.begin()
    assert files.trusted(str(tmp_path)) == kept and budget.used == 2
    budget.limit = 1  # a reload lowered it: everything is given back, reopened within the new limit
    files.begin()
    assert len(files) == 0 and budget.used == 0


def test_a_young_directory_is_not_settled_by_a_begin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A directory counts as settled only once its mtime is two seconds old: a file replaced within the
    # same tick before that leaves the mtime as it was, and only the per-read st_nlink check notices.
    path = tmp_path / "symbol_error"
    path.write_text("1\n")
    files = OpenFiles(FileBudget(8), verify=True)
    files.begin()
    recorded = time.time_ns() - 1_000_000_000
    monkeypatch.setattr(time, "time_ns", lambda: recorded + 1_000_000_000)  # the mtime is one second old
    os.utime(tmp_path, ns=(recorded, recorded))
    assert SysfsReader("d", ReadErrors(), files).uints(str(tmp_path), ["symbol_error"]) == {"symbol_error": 1}
    files.begin()  # not settled yet
    replacement = tmp_path / "new"
    replacement.write_text("2\n")
    os.replace(replacement, path)
    os.utime(tmp_path, ns=(recorded, recorded))  # the same tick as when the file was kept
    assert SysfsReader("d", ReadErrors(), files).uints(str(tmp_path), ["symbol_error"]) == {"symbol_error": 2}
