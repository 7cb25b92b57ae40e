"""How parse.reader classifies failed reads of real files: each errno the kernel answers ends in one
reason of rdma_exporter_file_read_errors_total, and a failed or short read leaves no fd behind."""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import replace
from pathlib import Path

import pytest

from rdma_exporter.collect.engine import LOGGED_FILES, RdmaCollector
from rdma_exporter.collect.readers import BLOCKED_LOG_QUIET_SECONDS
from rdma_exporter.config import Config
from rdma_exporter.daemon import build_collector
from rdma_exporter.parse.reader import (
    FileBudget,
    OpenFiles,
    ReadErrors,
    SysfsReader,
    exists,
    is_dir,
    link_name,
    list_dir,
    pci_function,
    stat_of,
)
from rdma_exporter.sample_tree import build_tree, spec_for_devices

from conftest import RefusingReads


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        # A device unbound between open and read: its kernfs nodes answer ENODEV, a gone index ENXIO.
        (errno.ENXIO, "missing"),
        (errno.ENODEV, "missing"),
        (errno.ENOENT, "missing"),
        # An attribute whose show() the driver does not implement.
        (errno.ENOSYS, "unsupported"),
        (errno.EOPNOTSUPP, "unsupported"),
        (errno.EPERM, "permission"),
        (errno.EACCES, "permission"),
        # Firmware and kernel-side failures, including EINVAL where it is not declared "no value".
        (errno.EIO, "io"),
        (errno.EINVAL, "io"),
        (errno.EBUSY, "io"),
        (errno.ETIMEDOUT, "io"),
    ],
)
def test_each_errno_is_counted_under_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, reason: str
) -> None:
    (tmp_path / "rate").write_text("100 Gb/sec (4X EDR)\n")
    RefusingReads(monkeypatch, code, {"/rate"})
    errors = ReadErrors()
    assert SysfsReader("mlx5_0", errors).text(tmp_path / "rate") is None
    assert errors.counts == {("mlx5_0", reason): 1}
    assert str(tmp_path / "rate") in errors.last[("mlx5_0", reason)]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_failed_and_one_off_reads_leave_no_fd_open(tmp_path: Path) -> None:
    # A counter file replaced by a directory opens fine and fails on read (EISDIR): that fd, and every fd
    # of a read that is not kept (static reads, reads over the budget), must be closed again, or each
    # scrape leaks until the process hits its fd limit.
    (tmp_path / "good").write_text("1\n")
    (tmp_path / "dir").mkdir()
    before = open_fds()
    for files in (None, OpenFiles(FileBudget(0)), OpenFiles(FileBudget(8))):
        for _ in range(20):
            errors = ReadErrors()
            reader = SysfsReader("mlx5_0", errors, files)
            assert reader.uint(str(tmp_path / "dir")) is None
            assert errors.counts == {("mlx5_0", "io"): 1}
            assert reader.uint(str(tmp_path / "good")) == 1
        kept = len(files) if files is not None else 0
        assert open_fds() == before + kept
        if files is not None:
            files.close()
    assert open_fds() == before


def test_an_optional_attribute_that_fails_is_still_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `optional` excuses a file that does not exist (no `lid` on a RoCE port), not one that fails.
    (tmp_path / "lid").write_text("0x1\n")
    RefusingReads(monkeypatch, errno.EIO, {"/lid"})
    errors = ReadErrors()
    reader = SysfsReader("mlx5_0", errors)
    assert reader.uint(tmp_path / "lid", optional=True, base=0) is None
    assert reader.uint(tmp_path / "sm_lid", optional=True, base=0) is None  # absent: no error
    assert errors.counts == {("mlx5_0", "io"): 1}


def test_a_non_decimal_attribute_is_parsed_in_its_base(tmp_path: Path) -> None:
    # dev_id is hex ("0x1", or bare digits on a hand-written tree): "10" there is sixteen, not ten.
    (tmp_path / "dev_id").write_text("10\n")
    (tmp_path / "lid").write_text("010\n")  # base 0 takes 0x.., but a leading zero is no number there
    errors = ReadErrors()
    reader = SysfsReader("mlx5_0", errors)
    assert reader.uint(tmp_path / "dev_id", base=16) == 16
    assert reader.uint(tmp_path / "lid", base=0) is None
    assert errors.counts == {("mlx5_0", "malformed"): 1}


def test_parsed_counts_text_its_parser_refuses_and_nothing_else(tmp_path: Path) -> None:
    # The one path every checked attribute (state, rate, speed, carrier, flags...) takes.
    (tmp_path / "carrier").write_text("1\n")
    (tmp_path / "speed").write_text("fast\n")
    flags = {"0": False, "1": True}.get
    errors = ReadErrors()
    reader = SysfsReader("mlx5_0", errors)
    assert reader.parsed(tmp_path / "carrier", flags, "0 or 1") is True
    assert reader.parsed(tmp_path / "speed", flags, "0 or 1") is None
    assert reader.parsed(tmp_path / "duplex", flags, "0 or 1", optional=True) is None  # absent: no error
    assert errors.counts == {("mlx5_0", "malformed"): 1}
    assert errors.last[("mlx5_0", "malformed")] == f"{tmp_path / 'speed'}: not 0 or 1: 'fast'"
    assert reader.parsed(tmp_path / "duplex", flags, "0 or 1") is None  # absent and required: missing
    assert errors.counts == {("mlx5_0", "malformed"): 1, ("mlx5_0", "missing"): 1}


def test_a_driver_link_with_a_trailing_slash_names_the_driver(tmp_path: Path) -> None:
    (tmp_path / "drivers" / "mlx5_core").mkdir(parents=True)
    os.symlink("drivers/mlx5_core/", tmp_path / "driver")
    assert link_name(tmp_path / "driver") == "mlx5_core"
    assert link_name(tmp_path / "drivers") is None  # not a link


def test_a_listing_is_sorted_and_only_a_missing_optional_directory_is_silent(tmp_path: Path) -> None:
    counters = tmp_path / "counters"
    counters.mkdir()
    for name in ("port_xmit_data", "link_downed", "symbol_error", "VL15_dropped"):
        (counters / name).write_text("0\n")
    errors = ReadErrors()
    reader = SysfsReader("mlx5_0", errors)
    assert list_dir(counters, reader) == ["VL15_dropped", "link_downed", "port_xmit_data", "symbol_error"]
    assert list_dir(tmp_path / "hw_counters", reader) == []  # optional and absent: no error
    assert list_dir(counters / "link_downed", reader) == []  # a file, not a directory: ENOTDIR
    assert list_dir(tmp_path / "ports", reader, optional=False) == []
    assert errors.counts == {("mlx5_0", "io"): 1, ("mlx5_0", "missing"): 1}


def test_an_attribute_longer_than_a_small_page_is_read_whole(tmp_path: Path) -> None:
    # Kernels with 64 KiB pages (many aarch64) can print more than 4 KiB; up to 8 KiB is read.
    text = "".join(f"{n:04}\n" for n in range(1300))  # 6500 bytes
    (tmp_path / "gids").write_text(text)
    for files in (None, OpenFiles(FileBudget(8))):
        reader = SysfsReader("mlx5_0", ReadErrors(), files)
        assert reader.text(tmp_path / "gids") == text.strip()
        assert reader.text(tmp_path / "gids") == text.strip()  # kept: pread, small then the rest


def test_a_text_attribute_that_is_not_utf8_is_malformed(tmp_path: Path) -> None:
    # A node_desc with a stray latin-1 byte must not become a mojibake label value: no value, one error.
    (tmp_path / "node_desc").write_bytes(b"gpu-node-07 HCA-1 \xe9\n")
    (tmp_path / "board_id").write_bytes("MT_0000000838 \u00b5\n".encode())
    errors = ReadErrors()
    reader = SysfsReader("mlx5_0", errors)
    assert reader.text(tmp_path / "node_desc") is None
    assert reader.text(tmp_path / "board_id") == "MT_0000000838 \u00b5"
    assert errors.counts == {("mlx5_0", "malformed"): 1}


def test_a_counter_that_answered_without_the_kept_files_is_a_fault_when_it_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engine's device-only job reads beside the job that holds the kept files, with their record as
    # `memory`: a counter that gives a value there has answered, so a later EINVAL is a failing firmware
    # query (io, on every read), not a counter the device does not have (unsupported, left out a minute).
    counters = tmp_path / "counters"
    counters.mkdir()
    (counters / "symbol_error").write_text("7\n")
    kept = OpenFiles(FileBudget(8))
    errors = ReadErrors()
    beside = SysfsReader("mlx5_0", errors, None, memory=kept)
    assert beside.uints(str(counters), ["symbol_error"]) == {"symbol_error": 7}
    RefusingReads(monkeypatch, errno.EINVAL, {"/symbol_error"})
    for reader in (beside, SysfsReader("mlx5_0", errors, kept)):
        assert reader.uints(str(counters), ["symbol_error"]) == {}
    assert errors.counts == {("mlx5_0", "io"): 2}
    assert kept.refused == {}


def test_a_file_longer_than_any_attribute_is_malformed_not_cut(tmp_path: Path) -> None:
    # Reads stop at 8 KiB, far above any attribute read; what was read of a longer file is not its value.
    (tmp_path / "board_id").write_text("MT_0000000838" + " " * 9000 + "\n")
    (tmp_path / "node_desc").write_text("h" * 8190 + "\n")  # one byte short of the limit: still a value
    errors = ReadErrors()
    for files in (None, OpenFiles(FileBudget(8))):
        reader = SysfsReader("mlx5_0", errors, files)
        assert reader.text(tmp_path / "board_id") is None
        assert reader.text(str(tmp_path / "node_desc")) == "h" * 8190
    assert errors.counts == {("mlx5_0", "malformed"): 2}
    assert "8192 bytes or more" in errors.last[("mlx5_0", "malformed")]


def test_read_errors_keep_each_failed_file_once_with_its_latest_message() -> None:
    errors = ReadErrors()
    for attempt in range(2):  # read twice: still one entry a file, with the latest message
        for index in range(3):
            errors.add("mlx5_0", "malformed", f"/sys/f{index}: not an unsigned integer: '{attempt}'", f"/sys/f{index}")
    errors.add("mlx5_1", "io", "mlx5_1: OSError(5)")  # no path given: what failed is the text before ": "
    assert errors.failed[("mlx5_0", "malformed")] == {
        f"/sys/f{index}": f"/sys/f{index}: not an unsigned integer: '1'" for index in range(3)
    }
    assert errors.counts[("mlx5_0", "malformed")] == 6
    assert errors.failed[("mlx5_1", "io")] == {"mlx5_1": "mlx5_1: OSError(5)"}


def logging_collector(tmp_path: Path, caplog: pytest.LogCaptureFixture, devices: int) -> tuple[Path, RdmaCollector]:
    """A collector on a generated tree of `devices` HCAs, with the daemon's log captured from info up."""
    root = build_tree(tmp_path / "t", spec_for_devices(devices))
    collector = build_collector(replace(Config(), sysfs=root))
    caplog.set_level(logging.INFO, logger="rdma_exporter")
    return root, collector


def read_error_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """The read-error lines (level, text) logged since the last call."""
    found = [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith("read errors ")]
    caplog.clear()
    return found


def test_a_file_that_fails_to_read_is_logged_once_per_episode_with_its_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Garbage in a counter file, a directory in its place: the value was lost and counted, but the log
    said nothing at info, and at debug one line a scrape (log review)."""
    root, collector = logging_collector(tmp_path, caplog, devices=2)
    counter = root / "class/infiniband/mlx5_1/ports/1/counters/symbol_error"

    def lines() -> list[tuple[int, str]]:
        return read_error_lines(caplog)

    collector.gather()
    assert lines() == []
    counter.write_text("junk\n")
    for _ in range(3):
        collector.gather()
    assert lines() == [(
        logging.WARNING,
        f"read errors [infiniband] mlx5_1 (malformed): {counter}: not an unsigned integer: 'junk'; "
        "counted in rdma_exporter_file_read_errors_total, not logged again while they go on",
    )]
    counter.write_text("0\n")
    collector.gather()
    assert lines() == [(logging.INFO, "read errors [infiniband] mlx5_1 (malformed) stopped")]
    # Two files of one device failing together are both named, and one that starts failing while the
    # episode goes on gets a line of its own, once: the log named only the first file, so that after it
    # was mended the count kept rising with no file named (operator review).
    other = root / "class/infiniband/mlx5_0/ports/1/counters/link_downed"
    third = root / "class/infiniband/mlx5_0/ports/1/counters/port_rcv_errors"
    first = root / "class/infiniband/mlx5_0/ports/1/counters/symbol_error"
    first.write_text("junk\n")
    other.write_text("99999999999999999999999\n")
    collector.gather()
    (started,) = lines()
    assert started[0] == logging.WARNING and str(first) in started[1] and str(other) in started[1], started
    first.write_text("0\n")
    collector.gather()
    assert lines() == []
    third.write_text("-1\n")
    for _ in range(2):
        collector.gather()
    assert lines() == [(logging.WARNING, f"read errors [infiniband] mlx5_0 (malformed), also: {third}: "
                                         "not an unsigned integer: '-1'")]
    # A file whose bad value changes every scrape is still the one file (diff review: an "also" line a
    # scrape, and a set of messages that grew with every value).
    for value in range(-2, -5, -1):
        third.write_text(f"{value}\n")
        collector.gather()
    assert lines() == []
    other.write_text("0\n")
    third.write_text("0\n")
    collector.gather()
    assert lines() == [(logging.INFO, "read errors [infiniband] mlx5_0 (malformed) stopped")]
    # Again within ten minutes: a flapping file is not two lines a scrape.
    counter.write_text("junk\n")
    collector.gather()
    counter.write_text("0\n")
    collector.gather()
    assert lines() == []
    # A file such a quiet episode had not seen is a new fault: logged at once, with its end (second diff
    # review: it was never named).
    counter.write_text("junk\n")
    collector.gather()
    assert lines() == []
    newcomer = root / "class/infiniband/mlx5_1/ports/1/counters/link_downed"
    newcomer.write_text("junk\n")
    collector.gather()
    (started,) = lines()
    assert started[0] == logging.WARNING and str(counter) in started[1] and str(newcomer) in started[1], started
    counter.write_text("0\n")
    newcomer.write_text("0\n")
    collector.gather()
    assert lines() == [(logging.INFO, "read errors [infiniband] mlx5_1 (malformed) stopped")]
    # A static file is read with the device's static info, not every scrape: a scrape on the cached info
    # says nothing of it, and must not end its episode (final review: a false "stopped").
    guid = root / "class/infiniband/mlx5_0/node_guid"
    guid.unlink()
    guid.mkdir()
    collector.inventory.invalidate()
    collector.gather()
    assert [level for level, _ in lines()] == [logging.WARNING]
    collector.gather()
    assert lines() == []


def test_a_device_whose_many_files_fail_is_one_line_naming_a_few(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, collector = logging_collector(tmp_path, caplog, devices=1)
    counters = sorted((root / "class/infiniband/mlx5_0/ports/1/counters").iterdir())
    assert len(counters) > LOGGED_FILES
    for counter in counters:
        counter.write_text("junk\n")
    collector.gather()
    ((_, line),) = read_error_lines(caplog)
    assert line.count("not an unsigned integer") == LOGGED_FILES, line
    assert f"(and {len(counters) - LOGGED_FILES} more)" in line, line
    # Mending the named files one by one names none of the others, which failed from the start (diff
    # review: they came up as "also" lines); the episode ends once every file reads again.
    for counter in counters:
        counter.write_text("0\n")
        collector.gather()
    lines = read_error_lines(caplog)
    assert lines == [(logging.INFO, "read errors [infiniband] mlx5_0 (malformed) stopped")], lines


def test_a_device_that_comes_back_has_its_broken_file_logged_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Removed and added again within the quiet period (a driver reload), a device is a new device: its
    broken file was not logged (second diff review)."""
    root, collector = logging_collector(tmp_path, caplog, devices=2)
    (root / "class/infiniband/mlx5_1/ports/1/counters/symbol_error").write_text("junk\n")

    def warnings() -> int:
        return sum(level == logging.WARNING for level, _ in read_error_lines(caplog))

    collector.gather()
    assert warnings() == 1
    link = root / "class/infiniband/mlx5_1"
    target = link.readlink()
    link.unlink()
    collector.inventory.invalidate()
    collector.gather()
    link.symlink_to(target)
    collector.inventory.invalidate()
    collector.gather()
    assert warnings() == 1


@pytest.mark.parametrize(
    ("scrapes", "expected"),
    [
        # A and B take turns, with a clean scrape between rounds: named once, then quiet (third diff
        # review: a start and a stop every round, each resetting the quiet period).
        ("A B - A B - A B -", ["start A", "also B", "stopped"]),
        ("A AB - A AB -", ["start A", "also B", "stopped"]),
        # B, new, already failing when a quiet episode starts: named (it was never named before).
        ("A - B - AB -", ["start A", "stopped", "start B", "stopped"]),
        ("A - AB - AB -", ["start A", "stopped", "start A B", "stopped"]),
    ],
)
def test_read_error_lines_name_each_file_once_per_quiet_period(
    scrapes: str, expected: list[str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, collector = logging_collector(tmp_path, caplog, devices=1)
    counters = root / "class/infiniband/mlx5_0/ports/1/counters"
    files = {"A": counters / "symbol_error", "B": counters / "link_downed"}
    for scrape in scrapes.split():
        for letter, path in files.items():
            path.write_text("junk\n" if letter in scrape else "0\n")
        collector.gather()
    said = []
    for _, message in read_error_lines(caplog):
        kind = "stopped" if message.endswith("stopped") else "also" if ", also: " in message else "start"
        named = [letter for letter, path in files.items() if f"{path}:" in message]
        said.append(" ".join([kind, *named]))
    assert said == expected


def test_each_file_has_its_own_quiet_period(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A file named ten minutes ago is named again, even when the device's other files were named since:
    the quiet period is the file's, not its device's."""
    root, collector = logging_collector(tmp_path, caplog, devices=1)
    counters = root / "class/infiniband/mlx5_0/ports/1/counters"
    a, b = counters / "symbol_error", counters / "link_downed"

    def fail_once(path: Path) -> list[str]:
        path.write_text("junk\n")
        collector.gather()
        path.write_text("0\n")
        collector.gather()
        return [message for _, message in read_error_lines(caplog)]

    def age(seconds: float) -> None:  # as if that much time had passed since each file was named
        for named in collector._errors_logged:
            collector._errors_logged[named] -= seconds

    assert len(fail_once(a)) == 2
    age(BLOCKED_LOG_QUIET_SECONDS * 0.8)
    assert len(fail_once(a)) == 0  # within its quiet period
    assert len(fail_once(b)) == 2
    age(BLOCKED_LOG_QUIET_SECONDS * 0.3)  # a's period is over, b's is not
    assert [str(a) in line for line in fail_once(a)] == [True, False]
    assert fail_once(b) == []
    # Mended and broken again while another file keeps the episode going: named again once its quiet
    # period is over (fourth diff review: a path once in an episode was never news again).
    age(BLOCKED_LOG_QUIET_SECONDS)
    b.write_text("junk\n")
    collector.gather()
    said = fail_once(a)
    assert len(said) == 2 and str(b) in said[0] and ", also: " in said[1] and str(a) in said[1], said
    age(BLOCKED_LOG_QUIET_SECONDS * 0.5)
    assert fail_once(a) == []  # within a's new quiet period
    age(BLOCKED_LOG_QUIET_SECONDS * 0.5)
    said = fail_once(a)
    assert len(said) == 1 and ", also: " in said[0] and str(a) in said[0], said


def test_a_file_broken_again_within_its_quiet_period_is_named_when_the_period_is_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Mended, then broken again for good within ten minutes: quiet at first, as a flapping file is, but
    named once its quiet period is over, and its end said (fault-injection review: never named again, the
    log's last word on it was "stopped")."""
    root, collector = logging_collector(tmp_path, caplog, devices=1)
    a = root / "class/infiniband/mlx5_0/ports/1/counters/symbol_error"
    a.write_text("junk\n")
    collector.gather()
    a.write_text("0\n")
    collector.gather()
    a.write_text("junk\n")
    for _ in range(3):
        collector.gather()
    assert len(read_error_lines(caplog)) == 2  # the first start and stop; the second breakage is quiet
    for named in collector._errors_logged:  # as if the quiet period were over
        collector._errors_logged[named] -= BLOCKED_LOG_QUIET_SECONDS
    collector.gather()
    collector.gather()
    a.write_text("0\n")
    collector.gather()
    said = read_error_lines(caplog)
    assert [level for level, _ in said] == [logging.WARNING, logging.INFO], said
    assert str(a) in said[0][1] and said[1][1].endswith("stopped"), said


def test_a_file_broken_again_within_its_quiet_period_beside_a_logged_episode_is_named_in_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The same while another file of the device and reason keeps a logged episode going: an "also" line
    once the quiet period is over (diff review: only files new at a scrape were looked at)."""
    root, collector = logging_collector(tmp_path, caplog, devices=1)
    counters = root / "class/infiniband/mlx5_0/ports/1/counters"
    a, b = counters / "link_downed", counters / "symbol_error"
    a.write_text("junk\n")
    collector.gather()
    a.write_text("0\n")
    collector.gather()
    b.write_text("junk\n")
    collector.gather()  # b's episode starts, and is logged
    a.write_text("junk\n")
    for _ in range(3):
        collector.gather()
    said = read_error_lines(caplog)
    assert len(said) == 3 and str(b) in said[2][1] and str(a) not in said[2][1], said  # a: within its period
    for named in collector._errors_logged:  # as if the quiet periods were over
        collector._errors_logged[named] -= BLOCKED_LOG_QUIET_SECONDS
    collector.gather()
    collector.gather()
    said = read_error_lines(caplog)
    assert len(said) == 1 and ", also: " in said[0][1] and str(a) in said[0][1], said


def test_a_line_naming_exactly_as_many_files_as_it_may_says_no_more() -> None:
    from rdma_exporter.collect.engine import _some_files

    files = {f"/sys/f{n}": f"f{n}: bad" for n in range(LOGGED_FILES)}
    assert _some_files(files) == "; ".join(files[path] for path in sorted(files))
    files["/sys/g"] = "g: bad"
    assert _some_files(files).endswith(" (and 1 more)")


def test_a_failed_path_holding_a_colon_and_space_is_logged_whole() -> None:
    # ReadErrors.failed names every failed file for the log; a fixture or bind-mount path may itself hold
    # ": ", so the path the reader passes is the key, not the detail cut at its first ": ".
    errors = ReadErrors()
    reader = SysfsReader("mlx5_0", errors)
    for name in ("a: b/rate", "a: c/rate"):
        reader.fail("io", name, "Input/output error")
    assert list(errors.failed[("mlx5_0", "io")]) == ["a: b/rate", "a: c/rate"]


def test_a_device_recreated_under_its_name_reads_again_what_the_old_one_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # adopt() forgets the refusals of the device directory before a driver reload as well as its answers:
    # the new firmware may give a counter the old one refused, and must not wait out the old minute for it.
    counters = tmp_path / "counters"
    counters.mkdir()
    (counters / "VL15_dropped").write_text("3\n")
    kept = OpenFiles(FileBudget(8))
    kept.adopt(1)
    refusing = RefusingReads(monkeypatch, errno.EINVAL, {"/VL15_dropped"})
    assert SysfsReader("mlx5_0", ReadErrors(), kept).uints(str(counters), ["VL15_dropped"]) == {}
    refusing.refused = set()
    kept.adopt(1)  # the same directory (a resync): still left out for the minute
    assert SysfsReader("mlx5_0", ReadErrors(), kept).uints(str(counters), ["VL15_dropped"]) == {}
    kept.adopt(2)  # re-created: a new directory inode
    errors = ReadErrors()
    assert SysfsReader("mlx5_0", errors, kept).uints(str(counters), ["VL15_dropped"]) == {"VL15_dropped": 3}
    assert errors.total() == 0


def test_a_path_through_a_file_or_into_a_link_loop_is_absent_not_an_error(tmp_path: Path) -> None:
    # stat() answers ENOTDIR for a path through a file and ELOOP for a link that leads back to itself:
    # like ENOENT, facts about the path (a class entry mid-removal), not failed reads to count.
    (tmp_path / "rate").write_text("100 Gb/sec (4X EDR)\n")
    os.symlink("loop", tmp_path / "loop")
    errors = ReadErrors()
    reader = SysfsReader("mlx5_0", errors)
    assert stat_of(tmp_path / "rate" / "counters", reader) is None
    assert not exists(tmp_path / "loop", reader) and not is_dir(tmp_path / "loop" / "ports", reader)
    assert errors.total() == 0


def test_a_device_link_to_something_other_than_a_pci_function_is_no_pci_function(tmp_path: Path) -> None:
    # hns_roce of HiSilicon's Hip06/Hip07 sits on a platform device, not a PCI function: its name would
    # be a wrong pci label, and its directory has no PCIe attributes to read.
    platform = tmp_path / "devices" / "platform" / "HISI00D1:00"
    function = tmp_path / "devices" / "pci0000:00" / "0000:3b:00.1"
    for target, device in ((platform, "hns_0"), (function, "mlx5_0")):
        target.mkdir(parents=True)
        (tmp_path / device).mkdir()
        os.symlink(target, tmp_path / device / "device")
    assert pci_function(tmp_path / "hns_0") is None
    assert pci_function(tmp_path / "mlx5_0") == function
