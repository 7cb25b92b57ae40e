"""process_* series: /proc/self/stat parsed as prometheus_client's own process collector reads it."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest
from prometheus_client import ProcessCollector

from rdma_exporter.collect.process import OPEN_FDS_MAX_AGE_SECONDS, ProcessMetrics
from rdma_exporter.daemon import node_boot_time
from rdma_exporter.parse.process import parse_proc_stat, read_process_stat

from conftest import samples


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() -> None:
    # comm is field 2, in parentheses, and may itself hold ") (" and spaces (prctl PR_SET_NAME).
    line = "4242 (a) (b c) S 1 4242 4242 0 -1 4194560 10 0 0 0 250 50 0 0 20 0 3 0 1000 181510144 8076 x\n"
    stat = parse_proc_stat(line, boot_time=1_700_000_000, ticks_per_second=100, page_size=4096)
    assert stat is not None
    assert (stat.cpu_seconds, stat.virtual_bytes, stat.resident_bytes) == (3.0, 181510144, 8076 * 4096)
    assert stat.start_time_seconds == 1_700_000_010


def test_what_is_not_a_stat_line_is_no_value() -> None:
    for text in ("", "4242 (a) S 1 2", "4242 (a) S " + "x " * 30, "no parenthesis " + "1 " * 30):
        assert parse_proc_stat(text, 0, 100, 4096) is None, text


def test_the_values_match_prometheus_clients_process_collector() -> None:
    ours = samples(ProcessMetrics(node_boot_time()).families().render_text().decode())
    theirs = {
        sample.name: sample.value for family in ProcessCollector(registry=None).collect() for sample in family.samples
    }
    for name, tolerance in (
        ("process_start_time_seconds", 1.0),  # they read btime from /proc/stat; we from the clocks
        ("process_cpu_seconds_total", 0.5),
        ("process_resident_memory_bytes", 8 << 20),
        ("process_virtual_memory_bytes", 64 << 20),
        ("process_open_fds", 8),
        ("process_max_fds", 0),
    ):
        assert abs(ours[(name, ())] - theirs[name]) <= tolerance, (name, ours[(name, ())], theirs[name])


def test_open_files_are_counted_at_most_once_a_minute(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "self" / "fd").mkdir(parents=True)
    (proc / "self" / "stat").write_text(Path("/proc/self/stat").read_text())
    for fd in range(3):
        (proc / "self" / "fd" / str(fd)).touch()
    metrics = ProcessMetrics(0.0, proc)
    assert samples(metrics.families(now=100.0).render_text().decode())[("process_open_fds", ())] == 3
    (proc / "self" / "fd" / "3").touch()
    assert samples(metrics.families(now=130.0).render_text().decode())[("process_open_fds", ())] == 3
    later = samples(metrics.families(now=100.0 + OPEN_FDS_MAX_AGE_SECONDS).render_text().decode())
    assert later[("process_open_fds", ())] == 4
    assert later[("process_max_fds", ())] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def test_an_unreadable_proc_leaves_the_values_out(tmp_path: Path) -> None:
    # A sandbox that hides /proc/self (or a non-Linux /proc): no made-up zeros, only the limit.
    found = samples(ProcessMetrics(0.0, tmp_path / "none").families().render_text().decode())
    assert set(found) == {("process_max_fds", ())}
    assert os.path.exists("/proc/self/stat")  # the other tests read the real one


def test_a_stat_line_that_ends_at_rss_is_enough() -> None:
    # rss (field 24) is the last field read: a line that stops there still has every value.
    line = "4242 (a) S 1 4242 4242 0 -1 4194560 10 0 0 0 250 50 0 0 20 0 3 0 1000 181510144 8076\n"
    stat = parse_proc_stat(line, boot_time=0, ticks_per_second=100, page_size=4096)
    assert stat is not None and stat.resident_bytes == 8076 * 4096
    assert parse_proc_stat(line.rsplit(" ", 1)[0], 0, 100, 4096) is None


def test_a_command_name_that_is_not_utf8_does_not_cost_the_values(tmp_path: Path) -> None:
    # comm is whatever bytes the executable's name or prctl(PR_SET_NAME) gave: the numbers after it are
    # still read, not a UnicodeDecodeError out of the scrape.
    (tmp_path / "self").mkdir()
    line = b"4242 (rdma\xff\xfe) S 1 4242 4242 0 -1 4194560 10 0 0 0 250 50 0 0 20 0 3 0 1000 181510144 8076 x\n"
    (tmp_path / "self" / "stat").write_bytes(line)
    stat = read_process_stat(tmp_path, boot_time=0)
    assert stat is not None and stat.virtual_bytes == 181510144


def test_an_unlimited_open_file_limit_has_no_max_fds(monkeypatch: pytest.MonkeyPatch) -> None:
    # RLIM_INFINITY is -1 in Python: exported, it would read as a limit below any fd count (an alert).
    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    found = samples(ProcessMetrics(node_boot_time()).families().render_text().decode())
    assert ("process_max_fds", ()) not in found and ("process_open_fds", ()) in found


def test_a_refused_open_file_limit_costs_max_fds_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A seccomp filter refusing prlimit64, which start-up allows for (daemon.raise_fd_limit): every
    /metrics answered 500 (the process series are rendered with it) while /healthz said 200 (review)."""

    def refuse(which: int) -> tuple[int, int]:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(resource, "getrlimit", refuse)
    found = samples(ProcessMetrics(node_boot_time()).families().render_text().decode())
    assert ("process_max_fds", ()) not in found
    assert {("process_open_fds", ()), ("process_resident_memory_bytes", ())} <= set(found)


# Each value from its own field, exactly: resident and virtual size not swapped, CPU seconds not truncated,
# the page size the system's (16K or 64K on some arm64 and ppc64 kernels). The comparison with
# prometheus_client above has tolerances that a small process's RSS and VSZ and sub-second CPU time fit.


def test_each_value_is_the_stat_line_field_it_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = tmp_path / "proc"
    (proc / "self" / "fd").mkdir(parents=True)
    line = "4242 (rdma-exporter) S 1 4242 4242 0 -1 4194560 10 0 0 0 257 51 0 0 20 0 3 0 1234 181510144 8076 x\n"
    (proc / "self" / "stat").write_text(line)
    sysconf = os.sysconf
    fake = {"SC_CLK_TCK": 100, "SC_PAGE_SIZE": 65536}  # an arm64 kernel with 64K pages
    monkeypatch.setattr(os, "sysconf", lambda name: fake.get(name) or sysconf(name))
    found = samples(ProcessMetrics(1_700_000_000.0, proc).families(now=0.0).render_text().decode())
    assert found[("process_cpu_seconds_total", ())] == pytest.approx(3.08)
    assert found[("process_resident_memory_bytes", ())] == 8076 * 65536
    assert found[("process_virtual_memory_bytes", ())] == 181510144
    assert found[("process_start_time_seconds", ())] == pytest.approx(1_700_000_012.34)


# The soft open-file limit, which is what open() fails at (and what prometheus_client reports from
# /proc/self/limits); the comparison above cannot tell it from the hard one where both are equal.


def test_max_fds_is_the_soft_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 524288))
    found = samples(ProcessMetrics(0.0).families().render_text().decode())
    assert found[("process_max_fds", ())] == 1024


# The open-fd count ages on the monotonic clock: on the wall clock an NTP step back would freeze the
# count for as long as the step, and one forward would recount it on every scrape.


def test_open_files_age_on_the_monotonic_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = tmp_path / "proc"
    (proc / "self" / "fd").mkdir(parents=True)
    (proc / "self" / "fd" / "0").touch()
    clocks = {"monotonic": 1000.0, "time": 1_700_000_000.0}
    monkeypatch.setattr(time, "monotonic", lambda: clocks["monotonic"])
    monkeypatch.setattr(time, "time", lambda: clocks["time"])
    metrics = ProcessMetrics(0.0, proc)
    assert samples(metrics.families().render_text().decode())[("process_open_fds", ())] == 1
    (proc / "self" / "fd" / "1").touch()
    clocks["time"] -= 3600  # the wall clock stepped back an hour; a minute passed
    clocks["monotonic"] += 61
    assert samples(metrics.families().render_text().decode())[("process_open_fds", ())] == 2
