"""Smoke tests of bench/bench.py (one quick run on a 1-device tree, checking the report's shape only),
bench/microbench.py, bench/attack.py and bench/ethtool_ioctl.py.

Timings depend on the machine, so nothing here asserts a number; bench/RESULTS.md records a real run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from conftest import require_binary

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "bench.py"
ATTACK = ROOT / "bench" / "attack.py"
MICROBENCH = ROOT / "bench" / "microbench.py"
RULES_COST = ROOT / "bench" / "rules_cost.py"
ETHTOOL_IOCTL = ROOT / "bench" / "ethtool_ioctl.py"
# The runs RULES-COST.md reports, before and after each change, and how far samples fell at least.
RULES_COST_RUNS = (
    (ROOT / "bench" / "rules-cost-before.json", ROOT / "bench" / "rules-cost-after.json", 0.5),
    (ROOT / "bench" / "rules-cost-day-maxima-before.json", ROOT / "bench" / "rules-cost-day-maxima-after.json", 0.7),
    # The same rules under Prometheus 2.42 and 3.5: 3.x's ranges leave out a sample at their start.
    (ROOT / "bench" / "rules-cost-prometheus2.json", ROOT / "bench" / "rules-cost-prometheus3.json", 0.99),
)

EXPORTER_KEYS = {
    "latency_ms",
    "cold_scrape_ms",
    "series",
    "fabric_series",
    "body_bytes",
    "p50_us_per_fabric_series",
    "cpu_ms_per_scrape",
    "files_per_scrape",
    "memory",
}
FILE_KEYS = {
    "counter",
    "state",
    "static",
    "directory",
    "other",
    "sysfs_total",
    "failed",
    "max_reads_of_one_counter_file_in_a_scrape",
}


def test_quick_run_writes_markdown_and_json(tmp_path: Path) -> None:
    require_binary("prometheus-node-exporter")
    require_binary("strace")
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--devices", "1", "--traffic", "--json", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr

    assert "| tree | devices | exporter |" in result.stdout
    assert "| 1 | 1 | rdma_exporter |" in result.stdout
    assert "| 1 | 1 | node_exporter |" in result.stdout
    assert "## Targets" in result.stdout

    report = json.loads(out.read_text())
    assert report["schema_version"] == 2
    assert {"machine", "settings", "trees", "scaling", "targets"} <= report.keys()
    assert {"nproc", "cpu_model", "python", "kernel", "node_exporter"} <= report["machine"].keys()
    (tree,) = report["trees"]
    assert tree["tree"] == "1" and tree["devices"] == 1
    assert report["settings"]["traffic"] is True and tree["traffic_files"] > 0
    assert "counters moving between rounds (--traffic)" in result.stdout
    assert set(tree["exporters"]) == {"rdma_exporter", "node_exporter"}
    for name, measured in tree["exporters"].items():
        assert measured.keys() >= EXPORTER_KEYS, name
        assert {"p50", "p90", "p99"} <= measured["latency_ms"].keys()
        assert measured["files_per_scrape"].keys() >= FILE_KEYS
        assert measured["fabric_series"] > 0
        # Both serve the tree's one port, so both open at least one counter file per scrape, and each
        # one once in every traced scrape (each scrape has its own window: one window for both traced
        # scrapes would count 2), with no read outside the scrapes.
        files = measured["files_per_scrape"]
        assert files["counter"] > 0
        assert files["max_reads_of_one_counter_file_in_a_scrape"] == 1, name
        assert files["outside_scrapes"] == 0, name
        fabric_us = measured["latency_ms"]["p50"] * 1000 / measured["fabric_series"]
        assert measured["p50_us_per_fabric_series"] == pytest.approx(fabric_us), name
    # node_exporter tries the port's counters_ext/ each scrape and finds none: failed, not read.
    assert tree["exporters"]["node_exporter"]["files_per_scrape"]["failed"] == 1
    assert "(0; 1) |" in next(line for line in result.stdout.splitlines() if line.startswith("| 1 | 1 | node_exporter"))
    # The only tree is also the memory tree: RSS at half and all of --memory-scrapes, and the readings
    # in between that the growth is fitted over. Quick: 15 scrapes before the memory run (cold, 2 warm-up,
    # 10 timed, 2 traced), so 112 scrapes, readings every 10 from 16 (none paused a timed scrape) to 112.
    assert report["settings"]["memory_scrapes"] == 112
    for name in ("rdma_exporter", "node_exporter"):
        memory = tree["exporters"][name]["memory"]
        assert [n for n, _ in memory["rss_mb_readings"]] == [*range(16, 107, 10), 112], name
        assert len(memory["rss_mb_at"]) == 2
        assert memory["growth_readings"] == 7 and memory["growth_mb_standard_error"] is not None
    assert {"p50", "fabric_series"} <= tree["ours_over_node_exporter"].keys()
    assert all({"target", "met", "measured"} <= t.keys() for t in report["targets"])


def test_microbench_runs_every_phase_on_a_small_tree(tmp_path: Path) -> None:
    # It checks its phases against the scrape (the same text, the same series, reads that do not fail) and
    # exits non-zero when they disagree. Under 1,000 descriptors, an 8-device tree fits only if the engine's
    # kept files are closed before the phases keep their own (about 700 each): at 128 devices and the
    # default 16,384 kept files the phases' reads used to fail.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = 1000 if hard == resource.RLIM_INFINITY else min(1000, hard)  # the script raises soft to hard

    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    result = subprocess.run(
        [sys.executable, str(MICROBENCH), "--devices", "8", "--iterations", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, preexec_fn=few_descriptors,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| read: infiniband |" in result.stdout and "| text_render |" in result.stdout


def test_ethtool_ioctl_run_reads_real_veths_in_its_own_namespace(tmp_path: Path) -> None:
    for tool in ("ip", "ethtool", "prometheus-node-exporter"):
        require_binary(tool)
    out = tmp_path / "ethtool.json"
    result = subprocess.run(
        [sys.executable, str(ETHTOOL_IOCTL), "--queues", "4,16", "--reads", "3", "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["netdevs"]
    # veth: peer_ifindex, then 7 stats per rx queue and 2 per tx queue.
    assert [row["stats"] for row in rows] == [1 + 9 * 4, 1 + 9 * 16]
    for row in rows:
        assert row["cold_ms"] > 0 and row["kept_ms"] > 0
        assert row["node_exporter_series"] >= row["stats"]  # node_exporter exports every stat
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert "rdma-bench-ethtool-" not in namespaces


def test_attack_run_reports_a_remembered_prometheus_answered_through_a_flood(tmp_path: Path) -> None:
    # A short, light attack: the report's shape, and that it costs Prometheus no scrape (the discriminating
    # cases, a flood longer than a scrape timeout, are in test_daemon_http.py; bench/RESULTS.md has the
    # full-size runs, before and after).
    out = tmp_path / "attack.json"
    result = subprocess.run(
        [sys.executable, str(ATTACK), "--seconds", "4", "--flood", "4", "--slow", "3", "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| Prometheus scrapes answered 200 |" in result.stdout
    report = json.loads(out.read_text())
    assert report["scrapes"] >= 3 and report["scrapes_ok"] == report["scrapes"], report
    assert report["scrape_failures"] == {} and report["p50_ms"] > 0
    # Wrong passwords get 401 once checked, or 503 when 32 already wait: nothing else, no dropped connection.
    assert report["flood_answers"] and set(report["flood_answers"]) <= {"401", "503"}, report


def test_unknown_tree_is_rejected(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH), "--devices", "sample,big", "--json", str(tmp_path / "x.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "'big'" in result.stderr
    assert not (tmp_path / "x.json").exists()


def _bench_module(path: Path = BENCH) -> ModuleType:
    # As when run as a script, bench/ is on the path: attack.py and rules_cost.py import from bench.py.
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"{path.stem}_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_rss_growth_is_the_fitted_slope_not_the_difference_of_two_readings() -> None:
    rss_growth = _bench_module().rss_growth
    mb = 2**20
    # Steady growth of 1 MB per 1000 scrapes: 0.5 MB over 500, exactly.
    growth, error = rss_growth([(n, 100 * mb + n * mb // 1000) for n in range(500, 1001, 10)], 500)
    assert abs(growth - 0.5) < 1e-3 and error is not None and error < 1e-3
    # Flipping between two levels 0.6 MB apart, with nothing growing: the end readings alone differ by a
    # whole level (the old estimate), the fit over all of them by almost nothing.
    flips = [(n, 100 * mb + (0 if (n // 10) % 2 else 600 * 2**10)) for n in range(500, 1000, 10)]
    assert (flips[0][1] - flips[-1][1]) / 2**10 == 600
    growth, error = rss_growth(flips, 500)
    assert abs(growth) < 0.05 and error is not None and error < 0.2
    # The same flipping on top of a steady 0.5 MB per 500 scrapes is still seen as that growth.
    growth, _ = rss_growth([(n, rss + (n - 500) * mb // 1000) for n, rss in flips], 500)
    assert abs(growth - 0.5) < 0.05


def test_strace_counts_every_pread_of_a_kept_file_also_after_an_open_in_the_window() -> None:
    parse_strace = _bench_module().parse_strace
    fd = "/t/sys/devices/pci0000:00/0000:00:01.0/0000:18:00.0/infiniband/mlx5_0/ports/1/counters/symbol_error"
    trace = "\n".join(
        [
            # Opened and kept before the window (the cold scrape): its first read is a read(), not traced.
            f'7 0.5 openat(AT_FDCWD</w>, "/t/sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error", '
            f"O_RDONLY|O_CLOEXEC) = 9<{fd}>",
            # Scrape 1 and 2 in the window: one pread each, both re-reads of the kept file.
            f'7 1.5 pread64(9<{fd}>, "0\\n", 448, 0) = 2',
            f"7 2.5 pread64(9<{fd}>, 0x7f00, 448, 0) = -1 EIO (Input/output error)",
            # The continuation of a long file is part of the read at offset 0.
            f'7 2.6 pread64(9<{fd}>, "x", 3648, 448) = 1',
            # Opened in the window: the open is one read, the pread of the next scrape another.
            '8 2.7 openat(AT_FDCWD</w>, "/t/sys/class/infiniband/mlx5_0/fw_ver", O_RDONLY|O_CLOEXEC) = 10</t/sys/fw>',
            '8 2.8 pread64(10</t/sys/fw>, "28.41.1000\\n", 448, 0) = 11',
            # After the last scrape's answer: no scrape's read.
            f'7 3.5 pread64(9<{fd}>, "0\\n", 448, 0) = 2',
            # Between two scrapes' windows: the earlier scrape's (work after its answer).
            f'7 2.1 pread64(9<{fd}>, "0\\n", 448, 0) = 2',
        ]
    )
    assert parse_strace(trace, [(1.0, 2.0), (2.2, 3.0)]) == [
        (fd, True, True, 0),
        (fd, False, True, 1),
        ("/t/sys/class/infiniband/mlx5_0/fw_ver", True, False, 1),
        ("/t/sys/fw", True, True, 1),
        (fd, True, True, None),
        (fd, True, True, 0),
    ]


def test_strace_reads_a_call_interrupted_by_another_thread_from_its_resumed_line() -> None:
    # Reader threads interleave: strace ends a call with `<unfinished ...>` and gives its result (and a
    # pread's offset) on a `<... resumed>` line of the same pid, read the same way as a whole line's.
    parse_strace = _bench_module().parse_strace
    trace = "\n".join(
        [
            '7 1.5 openat(AT_FDCWD</w>, "/t/sys/class/infiniband/mlx5_0/fw_ver", O_RDONLY <unfinished ...>',
            '8 1.5 openat(AT_FDCWD</w>, "/t/sys/class/infiniband/mlx5_1/fw_ver", O_RDONLY <unfinished ...>',
            "8 1.6 <... openat resumed>) = -1 ENOENT (No such file or directory)",
            "7 1.6 <... openat resumed>) = 9</t/sys/devices/fw_ver>",
            # A kept file's read at offset 0 and the rest of a long file, both interrupted.
            "7 1.7 pread64(11</t/sys/a>, <unfinished ...>",
            "8 1.7 pread64(12</t/sys/b>, <unfinished ...>",
            '8 1.8 <... pread64 resumed>"tail", 3648, 448) = 4',
            '7 1.8 <... pread64 resumed>"12\\n", 448, 0) = 3',
        ]
    )
    assert parse_strace(trace, [(1.0, 3.0)]) == [
        ("/t/sys/class/infiniband/mlx5_1/fw_ver", False, False, 0),
        ("/t/sys/class/infiniband/mlx5_0/fw_ver", True, False, 0),
        ("/t/sys/a", True, True, 0),
    ]


def test_a_call_restarted_after_a_signal_is_one_read() -> None:
    # Go's runtime preempts with SIGURG: an interrupted open ends `= ? ERESTARTSYS` and is traced again
    # when it is restarted. A thread that exits in a call leaves `= ? <unavailable>`.
    parse_strace = _bench_module().parse_strace
    path = "/t/sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error"
    trace = "\n".join(
        [
            f'7 1.5 openat(AT_FDCWD</w>, "{path}", O_RDONLY|O_CLOEXEC) = ? ERESTARTSYS '
            "(To be restarted if SA_RESTART is set)",
            "7 1.5 --- SIGURG {si_signo=SIGURG, si_code=SI_TKILL, si_pid=7, si_uid=0} ---",
            f'7 1.6 openat(AT_FDCWD</w>, "{path}", O_RDONLY|O_CLOEXEC) = 9</t/sys/x>',
            "8 1.7 pread64(10</t/sys/y>, <unfinished ...>",
            "8 1.8 <... pread64 resumed>) = ? <unavailable>",
            # A file whose text holds "= ?" is read all the same.
            '7 1.9 pread64(11</t/sys/z>, "a = ? b", 448, 0) = 7',
        ]
    )
    assert parse_strace(trace, [(1.0, 3.0)]) == [(path, True, False, 0), ("/t/sys/z", True, True, 0)]


def test_strace_joins_an_open_relative_to_a_directory_fd_and_reads_a_cwd_with_a_comma() -> None:
    parse_strace = _bench_module().parse_strace
    trace = "\n".join(
        [
            '7 1.5 openat(5</t/sys/class/net/ib0/statistics>, "rx_bytes", O_RDONLY|O_CLOEXEC) = 9</t/x>',
            '7 1.6 openat(AT_FDCWD</home/a,b>, "/t/sys/class/net/ib0/mtu", O_RDONLY|O_CLOEXEC) = 10</t/y>',
            '7 1.7 openat(AT_FDCWD</home/a,b>, "rel/file", O_RDONLY|O_CLOEXEC) = 11</t/z>',
        ]
    )
    assert [read.path for read in parse_strace(trace, [(1.0, 3.0)])] == [
        "/t/sys/class/net/ib0/statistics/rx_bytes",
        "/t/sys/class/net/ib0/mtu",
        "/home/a,b/rel/file",
    ]


def test_strace_escapes_in_a_path_are_undone() -> None:
    parse_strace = _bench_module().parse_strace
    # strace 6.1's own lines for a file `f"q\b é` in a directory `d>ir`, opened by path and through the
    # directory's fd, and each pread at offset 0.
    trace = "\n".join(
        [
            r'7 1.1 openat(AT_FDCWD</t>, "/t/d>ir/f\"q\\b \303\251", O_RDONLY) = 3</t/d\76ir/f\"q\\b \303\251>',
            r'7 1.2 pread64(3</t/d\76ir/f\"q\\b \303\251>, "1", 10, 0) = 1',
            r'7 1.3 openat(4</t/d\76ir>, "f\"q\\b \303\251", O_RDONLY|O_CLOEXEC) = 5</t/d\76ir/f\"q\\b \303\251>',
        ]
    )
    assert {read.path for read in parse_strace(trace, [(1.0, 3.0)])} == {'/t/d>ir/f"q\\b é'}


def test_a_counter_file_read_through_its_link_and_through_a_kept_fd_is_one_file(tmp_path: Path) -> None:
    bench = _bench_module()
    sys_root = tmp_path / "sys"
    port = sys_root / "devices" / "pci0000:00" / "0000:18:00.0" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "counters" / "symbol_error").write_text("0\n")
    (sys_root / "class" / "infiniband").mkdir(parents=True)
    (sys_root / "class" / "infiniband" / "mlx5_0").symlink_to(port.parent.parent)
    linked = str(sys_root / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters" / "symbol_error")
    kept = str(port / "counters" / "symbol_error")
    # One scrape opens the file by its class/ link and also preads a kept fd of it (-y: the real path).
    reads = [bench.FileRead(linked, True, False, 0), bench.FileRead(kept, True, True, 0)]
    counts = bench.count_reads(reads, 1, str(sys_root), None)
    assert counts["counter"] == 2 and counts["kept_open_reads"] == 1
    assert counts["max_reads_of_one_counter_file_in_a_scrape"] == 2


def test_the_most_reads_of_a_counter_file_is_a_scrape_s_not_an_average_and_failed_reads_read_nothing() -> None:
    bench = _bench_module()
    root = "/t/sys"
    counter = f"{root}/devices/pci0000:00/0000:18:00.0/infiniband/mlx5_0/ports/1/counters/symbol_error"
    missing = f"{root}/devices/pci0000:00/0000:18:00.0/infiniband/mlx5_0/ports/1/counters_ext/port_xmit_data_64"
    reads = [
        # Scrape 0 reads the counter twice, scrapes 1 and 2 not at all: 2 in one scrape, 2/3 on average.
        bench.FileRead(counter, True, True, 0),
        bench.FileRead(counter, True, True, 0),
        # node_exporter tries counters_ext each scrape; the open fails, no file was read.
        bench.FileRead(missing, False, False, 0),
        bench.FileRead(missing, False, False, 1),
        bench.FileRead(missing, False, False, 2),
        # A state file read three times in a scrape is no counter file's double read.
        *[bench.FileRead(f"{root}/devices/pci0000:00/0000:18:00.0/infiniband/mlx5_0/ports/1/state", True, True, 1)] * 3,
        # Read after the last scrape's answer: counted apart, in nothing else.
        bench.FileRead(counter, True, True, None),
    ]
    counts = bench.count_reads(reads, 3, root, None)
    assert counts["max_reads_of_one_counter_file_in_a_scrape"] == 2
    assert counts["state"] == 1 and counts["outside_scrapes"] == 1 and counts["kept_open_reads"] == 5 / 3
    assert counts["counter"] == 2 / 3 and counts["directory"] == 0 and counts["failed"] == 1
    assert counts["sysfs_total"] == pytest.approx(2 / 3 + 1)


def test_traffic_moves_non_zero_counters_in_place_and_leaves_zeros_and_settings(tmp_path: Path) -> None:
    bench = _bench_module()
    sys_root = bench.build_tree(tmp_path, bench.SAMPLE_SPEC)
    traffic = bench.Traffic(sys_root, tmp_path / "ethtool", bench.COUNTER_DIRS)
    port = sys_root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    data = port / "counters" / "port_xmit_data"
    quiet = port / "counters" / "symbol_error"
    lifespan = port / "hw_counters" / "lifespan"
    capture = tmp_path / "ethtool" / "enp220s0f0np0"
    temperature = next((sys_root / "class" / "hwmon").glob("*/temp1_input"))
    before = {path: path.read_text() for path in (data, quiet, lifespan, capture, temperature)}
    assert int(before[data]) > 0 and before[quiet] == "0\n"
    inode = data.stat().st_ino
    fd = os.open(data, os.O_RDONLY)  # as the exporter keeps it
    try:
        seen = [int(os.pread(fd, 64, 0))]
        for _ in range(2):
            traffic.advance()
            seen.append(int(os.pread(fd, 64, 0)))
    finally:
        os.close(fd)
    assert seen[0] < seen[1] < seen[2] and data.stat().st_ino == inode and traffic.temperatures
    assert quiet.read_text() == before[quiet] and lifespan.read_text() == before[lifespan]
    assert temperature.read_text() == before[temperature]  # up a degree, and back after the second round

    def capture_values(text: str) -> dict[str, int]:
        return {k.strip(): int(v) for k, v in (line.rsplit(": ", 1) for line in text.splitlines()[1:])}

    old, new = capture_values(before[capture]), capture_values(capture.read_text())
    assert old.keys() == new.keys()
    assert all(new[k] > v if v else new[k] == 0 for k, v in old.items())
    assert len(traffic) == len(traffic.counters) + len(traffic.temperatures) + 2


def test_hw_counters_lifespan_is_a_setting_read_as_state_not_a_counter(tmp_path: Path) -> None:
    classify = _bench_module().classify
    hw = tmp_path / "sys" / "devices" / "pci0000:00" / "0000:18:00.0" / "infiniband" / "mlx5_0" / "ports" / "1"
    hw = hw / "hw_counters"
    hw.mkdir(parents=True)
    root = str(tmp_path / "sys")
    assert classify(str(hw / "lifespan"), root, None) == "state"
    assert classify(str(hw / "out_of_sequence"), root, None) == "counter"


@pytest.mark.parametrize("memory_scrapes", ["100", "-1"])
def test_a_memory_run_too_short_to_keep_its_rss_pauses_out_of_the_timed_scrapes_is_refused(
    tmp_path: Path, memory_scrapes: str
) -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--memory-scrapes", memory_scrapes, "--json", str(tmp_path / "x.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "use at least 112, or 0 for none" in result.stderr, result.stderr
    assert not (tmp_path / "x.json").exists()


def test_report_says_its_targets_do_not_count_when_node_exporter_ran_with_more_collectors() -> None:
    bench = _bench_module()
    report = json.loads((ROOT / "bench" / "RESULTS.json").read_text())
    assert "do not count" not in bench.markdown(report)  # the recorded run is the comparison
    report["settings"]["node_exporter_flags"] = ["--collector.netclass"]
    assert "node_exporter ran with `--collector.netclass` as well" in bench.markdown(report)
    # The option repeats, as --ours-flag does.
    args = bench.build_parser().parse_args(["--node-exporter-flag=--collector.netclass", "--node-exporter-flag=--x"])
    assert args.node_exporter_flag == ["--collector.netclass", "--x"]


# --- bench/rules_cost.py: its full run takes minutes (bench/RULES-COST.md); its planning does not ---


def test_rules_cost_backfills_each_record_after_the_records_it_reads() -> None:
    """The history records read records of the port group: backfilled in the same pass, they would read
    a day that is not there yet, and the day-long rules would look cheaper than they are."""
    rules_cost = _bench_module(RULES_COST)
    groups = rules_cost.load_rules(ROOT / "rules")
    intervals = {group.name: group.interval for group in groups}
    assert intervals["rdma-exporter.history.rules"] == 300
    assert intervals["rdma-exporter.port.rules"] is None
    level, self_reading = rules_cost.record_levels(groups)
    by_name = {rule.name: level[rule.key] for group in groups for rule in group.rules if rule.kind == "record"}
    assert by_name["instance_device_port:rdma_port_state_id:max10m"] == 0
    assert by_name["instance_device_port:rdma_port_state_id:pci_address"] == 0
    assert by_name["instance_device_port:rdma_port_state_id:pci_address_max10m"] == 1
    # The day's maxima read the 10-minute ones of their own group.
    assert by_name["instance_device_port:rdma_port_state_id:max10m_max1d"] == 1
    assert by_name["instance_device_port:rdma_port_state_id:pci_address_max10m_max1d"] == 2
    assert by_name["instance_device_port:rdma_port_rate_bytes_per_second:active_max1d"] == 3
    assert "instance:rdma_exporter_target:known" in self_reading


def test_rules_cost_labels_two_prometheus_versions_by_version() -> None:
    """One set of rules measured under two Prometheus versions: the columns say which version, not which
    commit (both runs may be of one commit)."""
    result = subprocess.run(
        [sys.executable, str(RULES_COST), "--compare", str(RULES_COST_RUNS[-1][0]), str(RULES_COST_RUNS[-1][1])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("## Prometheus 2.42.0+ds ("), result.stdout[:200]
    assert "| group | samples/min 2.42.0+ds | samples/min 3.5.3+ds1 | change |" in result.stdout


def test_rules_cost_reads_metric_names_not_functions_labels_or_strings() -> None:
    names = _bench_module(RULES_COST).metric_names(
        'max by (instance, port) (label_replace(max_over_time(a:b:c{d="e"}[10m]), "window", "10m", "", "")) '
        "* on (instance) group_left (pci_address) rdma_device_info unless up == 0"
    )
    assert names == {"a:b:c", "rdma_device_info", "up"}


@pytest.mark.parametrize(("before", "after", "at_most"), RULES_COST_RUNS, ids=lambda v: getattr(v, "stem", v))
def test_rules_cost_compares_the_recorded_runs(before: Path, after: Path, at_most: float) -> None:
    """`--compare OLD NEW` on each pair of runs RULES-COST.md reports, without running anything."""
    result = subprocess.run(
        [sys.executable, str(RULES_COST), "--compare", str(before), str(after)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    total = next(line for line in result.stdout.splitlines() if line.startswith("| **total**"))
    old, new = (json.loads(path.read_text())["totals"]["samples_per_minute"] for path in (before, after))
    assert new < old * at_most
    assert f"| {100 * (new - old) / old:+.1f} % |" in total, total


def test_a_temperature_reading_is_state_and_its_threshold_static(tmp_path: Path) -> None:
    classify = _bench_module().classify
    hwmon = tmp_path / "sys" / "devices" / "pci0000:00" / "0000:18:00.0" / "hwmon" / "hwmon3"
    hwmon.mkdir(parents=True)
    root = str(tmp_path / "sys")
    assert classify(str(hwmon / "temp1_input"), root, None) == "state"
    assert classify(str(hwmon / "temp12_input"), root, None) == "state"
    for static in ("temp1_crit", "temp1_label", "name", "temp1_highest"):
        assert classify(str(hwmon / static), root, None) == "static"
    # A file of that name outside a hwmon device is not a sensor reading.
    assert classify(str(tmp_path / "sys" / "temp1_input"), root, None) == "static"
