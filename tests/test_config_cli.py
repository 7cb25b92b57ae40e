"""Config file, flags and their precedence; invalid settings stop start-up with file, key and reason."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rdma_exporter import __version__, cli
from rdma_exporter import config as config_module
from rdma_exporter.cli import LogfmtFormatter, build_parser, resolve_config, use_sample_tree
from rdma_exporter.config import (
    DEFAULT_PORT,
    EXIT_CONFIG,
    EXIT_UNAVAILABLE,
    Config,
    ConfigError,
    check_listen,
    exit_status,
    load_config_file,
)
from rdma_exporter.httpserver import listen_address
from rdma_exporter.webconfig import WebConfig

from conftest import SYSFS_FIXTURES, free_port, record_reads, refuse_stat_of, samples, scrape

LEPTON = SYSFS_FIXTURES / "leptonai-gpud-h100" / "sys"


def run_cli(*args: str, timeout: float = 30, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rdma_exporter", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rdma-exporter.yml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("web:\n  listen_address: 9883\n", "web.listen_address", "expected a non-empty string"),
        ("web:\n  listen_address: 'host'\n", "web.listen_address", "[host]:port"),
        ("web:\n  listen_adress: ':1'\n", "web.listen_adress", "unknown key"),
        ("devices:\n  exclude: 'mlx5_[0-'\n", "devices.exclude", "invalid regular expression"),
        ("collectors:\n  infiniband: 'yes'\n", "collectors.infiniband", "expected true or false"),
        ("collectors:\n  nosuch: true\n", "collectors.nosuch", "unknown collector"),
        # `collectors` and `collector` differ by one letter; each error names the other (operator review).
        ("collectors:\n  netdev:\n    ipoib_statistics: true\n", "collectors.netdev",
         "netdev's settings go under collector.netdev"),
        ("collector:\n  infiniband: true\n", "collector.infiniband", "to switch it on or off: collectors.infiniband"),
        ("collector:\n  ethtool: false\n", "collector.ethtool",
         "got false; to switch it on or off: collectors.ethtool"),
        ("log:\n  level: loud\n", "log.level", "expected one of"),
        ("bogus: 1\n", "bogus", "unknown section"),
        ("- a\n- b\n", "(top level)", "expected a mapping"),
        ("web: [\n", "line 2, column 1", "invalid YAML"),
        ("web:\n  telemetry_path: /healthz\n", "web.telemetry_path", "other than / and /healthz"),
        ("web:\n  read_threads: 0\n", "web.read_threads", "expected an integer from 1 to 64"),
        ("web:\n  read_threads: 65\n", "web.read_threads", "expected an integer from 1 to 64"),
        ("web:\n  read_threads: '4'\n", "web.read_threads", "expected an integer from 1 to 64"),
        # PyYAML keeps the last of two equal keys: the first exclude would be dropped without a word.
        ("devices:\n  exclude: 'mlx5_0'\nlog:\n  level: info\ndevices:\n  include: 'mlx5_.*'\n",
         "line 5, column 1", "duplicate key 'devices'"),
        ("devices:\n  exclude: 'mlx5_0'\n  exclude: 'mlx5_1'\n", "line 3, column 3", "duplicate key 'exclude'"),
        ("path:\n  sysfs: /nonexistent/sys\n", "path.sysfs", "no such directory: /nonexistent/sys"),
        ("path:\n  ethtool: /nonexistent/ethtool\n", "path.ethtool", "no such directory"),
        ("path:\n  sysfs: /dev/null\n", "path.sysfs", "not a directory: /dev/null"),  # there, but no tree
        # Each check on its own: a traceback, or a value served as something else, if it were gone.
        ("devices:\n  include: 5\n", "devices.include", "expected a regular expression string, got int"),
        # Python reads a POSIX class as a set of characters (":digt") and only warns: nothing was excluded
        # (config review). A repeat count too large for the compiler was an OverflowError traceback.
        ("devices:\n  exclude: 'mlx5_[[:digit:]]'\n", "devices.exclude", "POSIX classes such as [[:digit:]]"),
        ("devices:\n  exclude: 'mlx5_[0-9]{1,4294967296}'\n", "devices.exclude", "repetition number is too large"),
        ("collector:\n  ethtool:\n    extra_stats: ['^rx_{4294967296}$']\n", "collector.ethtool.extra_stats[0]",
         "repetition number is too large"),
        ("collector:\n  ethtool:\n    extra_stats: ['rx_[[:alpha:]]+']\n", "collector.ethtool.extra_stats[0]",
         "POSIX classes"),
        ("web:\n  listen_address: '9883'\n", "web.listen_address", "[host]:port with a port from 1 to 65535"),
        ("web:\n  listen_address: '[::1:9883'\n", "web.listen_address", "unbalanced brackets in IPv6 host '[::1'"),
        ("web:\n  listen_address: '::1]:9883'\n", "web.listen_address", "unbalanced brackets in IPv6 host '::1]'"),
        ("web:\n  listen_address: 'a b:9883'\n", "web.listen_address", "host 'a b' is neither an IP address"),
        ("web:\n  listen_address: '127.0.0.1 :9883'\n", "web.listen_address", "host '127.0.0.1 ' is neither"),
        ("web:\n  listen_address: '[10.0.0.1]:9883'\n", "web.listen_address", "host '[10.0.0.1]' is neither"),
        # Passed, then every start failed (EINVAL): an IPv6 socket binds IPv6 only (daemon review).
        ("web:\n  listen_address: '[::ffff:10.0.0.1]:9883'\n", "web.listen_address",
         "[::ffff:10.0.0.1] is an IPv4 address written as IPv6"),
        ("web:\n  listen_address: '::1:9883'\n", "web.listen_address", "host '::1' is neither"),
        ("web:\n  listen_address: '10.0.0.256:9883'\n", "web.listen_address", "host '10.0.0.256' is neither"),
        # Over 253 characters: no resolver takes it; it passed --check-config and failed to bind (mutation review).
        ("web:\n  listen_address: '" + ".".join(["a" * 60] * 5) + ":9883'\n", "web.listen_address",
         "is neither an IP address"),
        ("web:\n  telemetry_path: /\n", "web.telemetry_path", "other than / and /healthz, got '/'"),
        # Routed as sent and without its query: it would pass start-up, then every scrape would get 404, as
        # Prometheus percent-encodes the space, the é and the % (operator review, then the diff review).
        ("web:\n  telemetry_path: /metrics?x\n", "web.telemetry_path", "may hold only letters, digits"),
        ("web:\n  telemetry_path: '/my metrics'\n", "web.telemetry_path", "may hold only letters, digits"),
        ("web:\n  telemetry_path: /m\u00e9trics\n", "web.telemetry_path", "may hold only letters, digits"),
        ("web:\n  telemetry_path: /a%20b\n", "web.telemetry_path", "may hold only letters, digits"),
        ("log:\n  level: warning\n", "log.level", "expected one of debug, info, warn, error, got 'warning'"),
        # What the file shows, not only what YAML made of it (config review: "got False", "got 650").
        ("log:\n  level: off\n", "log.level", "got False (YAML reads an unquoted yes, no, on or off as true or false)"),
        ("web:\n  listen_address: 10:50\n", "web.listen_address",
         "got 650 (YAML read the unquoted value as a number: 10:50 as base 60"),
        ("web:\n  scrape_timeout_seconds: true\n", "web.scrape_timeout_seconds", "from 0.1 to 300, got True"),
        ("web:\n  1: ':9883'\n", "web.1", "keys must be strings"),
        ("path:\n  sysfs_root: /sys\n", "path.sysfs_root", "unknown key (known: path.ethtool, path.sysfs)"),
        ("? [a, b]\n: 1\n", "line 1, column 3", "invalid YAML: found unhashable key"),
        ('log: "\x01"\n', "line 1, column 7", "invalid YAML: character #x0001"),
        # An empty path.ethtool string is a mistake, as path.sysfs's; only an empty YAML value (null) is unset.
        ("path:\n  ethtool: ''\n", "path.ethtool", "expected a non-empty string, got ''"),
        # Not a string: refused, not joined to the file's directory (a TypeError traceback).
        ("path:\n  sysfs: 5\n", "path.sysfs", "expected a non-empty string, got 5"),
        # No path holds a NUL: a ValueError traceback from os.open (config review).
        ('web:\n  config_file: "/etc/web\\0.yml"\n', "web.config_file", "a NUL character is in '/etc/web\\x00.yml'"),
        # 0 == False in Python: a check by equality would take a number for a switch.
        ("collectors:\n  pcie: 0\n", "collectors.pcie", "expected true or false, got 0"),
    ],
)
def test_invalid_config_names_file_key_and_reason(tmp_path: Path, text: str, key: str, reason: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert info.value.source == str(path)
    assert info.value.key == key
    assert reason in info.value.reason
    # The daemon refuses to start with the same message; a directory that is not there may be mounted
    # later, so its exit status lets systemd restart (EXIT_UNAVAILABLE), an invalid value's does not.
    result = run_cli("--config.file", str(path), "--check-config")
    assert result.returncode == (EXIT_UNAVAILABLE if "/nonexistent/" in text else EXIT_CONFIG)
    assert f"{path}: {key}: " in result.stderr


@pytest.mark.parametrize(
    ("key", "outside", "bound", "reason"),
    [
        ("web.read_threads", "0", 1, "expected an integer from 1 to 64, got 0"),
        ("web.read_threads", "65", 64, "expected an integer from 1 to 64, got 65"),
        ("read.max_open_files", "-1", 0, "expected an integer from 0 to 1000000, got -1"),
        ("read.max_open_files", "1000001", 1_000_000, "expected an integer from 0 to 1000000, got 1000001"),
        # Below 0.1 s every device times out on every scrape (operator review: 1e-9 was accepted).
        ("web.scrape_timeout_seconds", "0.099", 0.1, "expected a number of seconds from 0.1 to 300, got 0.099"),
        ("web.scrape_timeout_seconds", "300.001", 300, "expected a number of seconds from 0.1 to 300, got 300.001"),
        ("web.listen_address", "':0'", ":1", "with a port from 1 to 65535, got ':0'"),
        ("web.listen_address", "':65536'", ":65535", "with a port from 1 to 65535, got ':65536'"),
    ],
    ids=["threads-low", "threads-high", "files-low", "files-high", "timeout-low", "timeout-high", "port-0", "port-max"],
)
def test_range_bound_is_accepted_and_one_past_it_refused(
    tmp_path: Path, key: str, outside: str, bound: object, reason: str
) -> None:
    # The bound and the value just past it: an off-by-one in a range check fails one of the two.
    section, name = key.split(".")
    path = write(tmp_path, f"{section}:\n  {name}: {outside}\n")
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert (info.value.source, info.value.key) == (str(path), key)
    assert reason in info.value.reason
    path = write(tmp_path, f"{section}:\n  {name}: {bound!r}\n")
    field = {"web.scrape_timeout_seconds": "scrape_timeout"}.get(key, name)
    assert getattr(load_config_file(path), field) == bound


@pytest.mark.parametrize(("name", "reason"), [("absent.yml", "No such file or directory"), ("", "Is a directory")])
def test_an_unreadable_config_file_is_named_with_the_reason(tmp_path: Path, name: str, reason: str) -> None:
    # The OS's reason alone, not Python's "[Errno 2] ...: '<the path again>'".
    path = tmp_path / name
    result = run_cli("--config.file", str(path))
    # A file not there yet (config management writes it after the unit starts) is worth a restart.
    assert result.returncode == (EXIT_UNAVAILABLE if name else EXIT_CONFIG)
    assert result.stderr == f"rdma-exporter: invalid configuration: {path}: (file): cannot read: {reason}\n"


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM])
def test_a_config_file_the_exporter_may_not_read_is_unavailable_not_invalid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    # Root's tests never see EACCES from chmod: the read is refused here. Permissions that config
    # management fixes after the unit starts are worth a restart, as a file not there yet (mutation review).
    path = write(tmp_path, "log:\n  level: info\n")

    def refused(*args: object) -> bytes:
        raise PermissionError(code, os.strerror(code))

    monkeypatch.setattr(config_module, "read_regular_file", refused)
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert exit_status(info.value) == EXIT_UNAVAILABLE
    assert str(info.value) == f"{path}: (file): cannot read: {os.strerror(code)}"


def test_a_config_path_that_is_a_directory_leaves_no_descriptor_open(tmp_path: Path) -> None:
    # Every reload reads the file again: a path that is a directory must not cost an fd each time.
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with pytest.raises(ConfigError, match="Is a directory"):
            load_config_file(tmp_path)
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("kind", ["fifo", "device", "too large"])
def test_a_config_file_that_is_no_regular_file_is_refused_without_blocking(tmp_path: Path, kind: str) -> None:
    # A FIFO nobody writes to made start-up, --check-config and a reload wait for ever; /dev/zero never ends.
    if kind == "fifo":
        path = tmp_path / "config.yml"
        os.mkfifo(path)
        reason = "not a regular file"
    elif kind == "device":
        path, reason = Path("/dev/zero"), "not a regular file"
    else:
        path = tmp_path / "config.yml"
        path.write_bytes(b"# " + b"x" * (4 * 2**20) + b"\n")
        reason = "larger than 4 MiB"
    result = run_cli("--config.file", str(path), "--check-config", timeout=20)
    assert result.returncode == 2
    assert result.stderr == f"rdma-exporter: invalid configuration: {path}: (file): cannot read: {reason}\n"


def test_valid_config_and_flag_precedence(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "web:\n  listen_address: '127.0.0.1:9999'\n  telemetry_path: /m\n"
        "devices:\n  exclude: 'mlx5_bond_.*'\ncollectors:\n  infiniband: false\nlog:\n  level: debug\n",
    )
    args = build_parser().parse_args(["--config.file", str(path), "--web.listen-address", ":1234",
                                      "--collector.infiniband"])
    config = resolve_config(args)
    assert config.listen_address == ":1234"  # flag beats file
    assert config.telemetry_path == "/m"  # file beats default
    assert config.collectors["infiniband"] is True
    assert config.device_exclude is not None and config.device_exclude.pattern == "mlx5_bond_.*"
    assert config.log_level == "debug"
    result = run_cli("--config.file", str(path), "--check-config")
    assert result.returncode == 0, result.stderr
    assert "configuration OK" in result.stdout


README = Path(__file__).resolve().parent.parent / "README.md"


def readme_flag_defaults() -> dict[str, str]:
    """{flag: default} from README's table of flags (the "default" column, backquotes removed)."""
    defaults: dict[str, str] = {}
    for line in README.read_text().splitlines():
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("--"):
            defaults[cells[0]] = cells[2]
    return defaults


def test_no_flags_and_no_file_give_the_readme_defaults() -> None:
    """README's table of flags: what a bare run serves (debug logging or a missing collector by default
    would show up on every node)."""
    config = resolve_config(build_parser().parse_args([]))
    assert (config.listen_address, config.telemetry_path) == (f":{DEFAULT_PORT}", "/metrics")
    assert config.web_config_file is None
    assert (config.scrape_timeout, config.sysfs, config.ethtool_dir) == (8.0, Path("/sys"), None)
    assert (config.device_include, config.device_exclude, config.log_level) == (None, None, "info")
    assert set(config.collectors.values()) == {True}
    # Compared with README itself too, not only with the constants: a changed DEFAULT_PORT passed the
    # lines above, while every scrape config and firewall rule written from README would miss the exporter.
    served = {
        "--web.listen-address": config.listen_address,
        "--web.telemetry-path": config.telemetry_path,
        "--web.config.file": str(config.web_config_file or "none"),
        "--web.scrape-timeout": f"{config.scrape_timeout:g}",
        "--web.read-threads": str(config.read_threads),
        "--path.sysfs": str(config.sysfs),
        "--path.ethtool": str(config.ethtool_dir or "none"),
        "--devices.exclude": "none" if config.device_exclude is None else config.device_exclude.pattern,
        "--log.level": config.log_level,
    }
    documented = readme_flag_defaults()
    assert {flag: documented.get(flag) for flag in served} == served


@pytest.mark.parametrize(
    ("flag", "value"), [("--web.listen-address", "nonsense"), ("--web.scrape-timeout", "abc"), ("--log.level", "x")]
)
def test_invalid_flag_value(flag: str, value: str) -> None:
    # One line naming the flag and the reason, exit 2; no usage text before it.
    result = run_cli(flag, value, "--check-config")
    assert result.returncode == 2
    assert result.stderr.startswith(f"rdma-exporter: invalid configuration: command line: {flag}:")
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("flag", ["--path.sysfs", "--path.ethtool"])
def test_missing_directory_flag_stops_start_up(tmp_path: Path, flag: str) -> None:
    # A typo, or a container started without its host /sys mount, must not look like a node without RDMA.
    result = run_cli(flag, str(tmp_path / "absent"), "--check-config")
    assert result.returncode == EXIT_UNAVAILABLE
    assert f"command line: {flag}: no such directory: {tmp_path / 'absent'}" in result.stderr
    (tmp_path / "a-file").write_text("")  # there, and no directory: that stays so
    result = run_cli(flag, str(tmp_path / "a-file"), "--check-config")
    assert result.returncode == EXIT_CONFIG


# Superscript two is a digit to str.isdigit() but not to int(): it once ended start-up with a ValueError
# traceback (exit 1) instead of the flag and reason. An Arabic-Indic three is an int() digit, but the
# config file's YAML would refuse it: the flag refuses it too.
@pytest.mark.parametrize("value", ["0", "65", "two", "-1", "1.5", "\u00b2", "\u0663"])
def test_invalid_read_threads_flag(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_config(build_parser().parse_args(["--web.read-threads", value]))
    assert info.value.key == "--web.read-threads"


@pytest.mark.parametrize("flag", ["--web.read-threads", "--read.max-open-files", "--web.scrape-timeout"])
def test_a_flag_that_yaml_would_read_as_a_switch_is_reported_as_typed(flag: str) -> None:
    # YAML reads `true` as a boolean, which no number setting takes: the message quotes what was typed,
    # not Python's True, which no one typed on the command line.
    with pytest.raises(ConfigError) as info:
        resolve_config(build_parser().parse_args([flag, "true"]))
    assert (info.value.key, info.value.reason.endswith("got 'true'")) == (flag, True), info.value.reason


@pytest.mark.parametrize(
    ("flag", "value", "setting", "expected"),
    [
        ("--web.scrape-timeout", "1_0", "scrape_timeout", 10.0),
        ("--web.scrape-timeout", "2.5", "scrape_timeout", 2.5),
        ("--web.read-threads", "0x10", "read_threads", 16),
        ("--read.max-open-files", "1_000", "max_open_files", 1000),
    ],
)
def test_a_flag_reads_a_number_as_the_config_file_does(flag: str, value: str, setting: str, expected: float) -> None:
    # One value, one meaning (final review: 1_0 and 0x10 were taken by the file and refused by the flag,
    # 010 the other way round).
    assert getattr(resolve_config(build_parser().parse_args([flag, value])), setting) == expected
    with pytest.raises(ConfigError):
        resolve_config(build_parser().parse_args(["--web.read-threads", "010"]))


def test_read_threads_default_flag_and_file(tmp_path: Path) -> None:
    from rdma_exporter.collect.readers import DEFAULT_PARALLELISM, HARD_MAX_WORKERS
    from rdma_exporter.config import DEFAULT_READ_THREADS, MAX_READ_THREADS

    assert (DEFAULT_READ_THREADS, MAX_READ_THREADS) == (DEFAULT_PARALLELISM, HARD_MAX_WORKERS) == (4, 64)
    assert resolve_config(build_parser().parse_args([])).read_threads == 4
    path = write(tmp_path, "web:\n  read_threads: 8\n")
    assert resolve_config(build_parser().parse_args(["--config.file", str(path)])).read_threads == 8
    args = build_parser().parse_args(["--config.file", str(path), "--web.read-threads", "1"])
    assert resolve_config(args).read_threads == 1  # flag beats file
    # A value templated from a YAML block scalar ends in a newline: still the number, for both count flags.
    args = build_parser().parse_args(["--web.read-threads", "2\n", "--read.max-open-files", " 100 "])
    assert (resolve_config(args).read_threads, resolve_config(args).max_open_files) == (2, 100)


def test_max_open_files_default_flag_file_and_errors(tmp_path: Path) -> None:
    from rdma_exporter.collect.readers import DEFAULT_MAX_OPEN_FILES as ENGINE_DEFAULT
    from rdma_exporter.config import DEFAULT_MAX_OPEN_FILES

    # 64 MiB of kernel memory, a page per kept file: 16384 files with 4 KiB pages, 1024 with 64 KiB.
    assert DEFAULT_MAX_OPEN_FILES == ENGINE_DEFAULT == 64 * 1024 * 1024 // os.sysconf("SC_PAGE_SIZE")
    if os.sysconf("SC_PAGE_SIZE") == 4096:
        assert DEFAULT_MAX_OPEN_FILES == 16384
    assert resolve_config(build_parser().parse_args([])).max_open_files == DEFAULT_MAX_OPEN_FILES
    path = write(tmp_path, "read:\n  max_open_files: 0\n")
    assert resolve_config(build_parser().parse_args(["--config.file", str(path)])).max_open_files == 0
    args = build_parser().parse_args(["--config.file", str(path), "--read.max-open-files", "100"])
    assert resolve_config(args).max_open_files == 100
    for bad in ("-1", "many", "2000000", "\u00b2", "\u0663"):  # not ASCII digits: as --web.read-threads
        with pytest.raises(ConfigError) as info:
            resolve_config(build_parser().parse_args(["--read.max-open-files", bad]))
        assert info.value.key == "--read.max-open-files"
    path = write(tmp_path, "read:\n  max_open_files: yes\n")
    with pytest.raises(ConfigError) as info:
        resolve_config(build_parser().parse_args(["--config.file", str(path)]))
    assert info.value.key == "read.max_open_files"


def test_version_and_default_port() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert __version__ in result.stdout
    # The default port is none of the anchors' (node_exporter 9100, infiniband_exporter 9315,
    # rdma_exporter 9879).
    assert DEFAULT_PORT not in (9100, 9315, 9879)
    assert f":{DEFAULT_PORT}" in run_cli("--help").stdout


def test_disabled_collector_exports_nothing() -> None:
    config_args = build_parser().parse_args(["--no-collector.infiniband"])
    config = resolve_config(config_args)
    names = {name for name, _ in samples(scrape(LEPTON, config))}
    assert not any(name.startswith("rdma_port_") for name in names)
    assert "rdma_exporter_devices" in names


def test_excluded_devices_are_never_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    opened = record_reads(monkeypatch)
    args = build_parser().parse_args(["--devices.exclude", "mlx5_[0-4]", "--devices.include", "mlx5_.*"])
    values = samples(scrape(LEPTON, resolve_config(args)))
    devices = {dict(labels)["device"] for name, labels in values if name == "rdma_device_info"}
    assert devices == {"mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_bond_0"}
    assert opened, "the recording hook saw no reads"
    for excluded in ("mlx5_0", "mlx5_1", "mlx5_4"):
        assert not [p for p in opened if f"/{excluded}/" in p], f"a file of excluded {excluded} was opened"
    assert values[("rdma_exporter_devices_excluded", ())] == 3


def test_device_filters_match_whole_names_not_parts() -> None:
    # README: "must match in full". Matched anywhere, `mlx5_bond` would drop mlx5_bond_0 and `mlx5_1`
    # mlx5_10 to mlx5_17 on a 16-rail node (mutation review: the exclude side was untested).
    args = build_parser().parse_args(["--devices.exclude", "mlx5_bond|mlx5_"])
    values = samples(scrape(LEPTON, resolve_config(args)))
    devices = {dict(labels)["device"] for name, labels in values if name == "rdma_device_info"}
    assert "mlx5_bond_0" in devices and "mlx5_1" in devices
    assert values[("rdma_exporter_devices_excluded", ())] == 0
    args = build_parser().parse_args(["--devices.include", "mlx5_bond|mlx5_1"])
    values = samples(scrape(LEPTON, resolve_config(args)))
    assert {dict(labels)["device"] for name, labels in values if name == "rdma_device_info"} == {"mlx5_1"}


def first_answer(url: str, timeout: float = 30) -> tuple[int, str]:
    """The status and body of `url` once the daemon just started answers it ((0, "") if it never does)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as answered:
            return answered.code, ""
        except OSError:  # not listening yet
            time.sleep(0.2)
    return 0, ""


def test_sample_tree_fallback_is_logged(tmp_path: Path) -> None:
    # --sample forces what a machine without /sys/class/infiniband does by default.
    port = free_port()
    # The tree is built under TMPDIR, and removed on exit: restarts must not pile up copies.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "rdma_exporter", "--sample", "--web.listen-address", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    try:
        _, body = first_answer(f"http://127.0.0.1:{port}/metrics")
        assert 'rdma_port_rate_bytes_per_second{device="mlx5_7",port="1"} 5e+10' in body
        # Said in the metrics too, where an alert can see it: a log line alone reaches nobody.
        assert "\nrdma_exporter_sample_tree 1.0\n" in body
        # The RoCE ports' ethtool view comes from the sample's own captures (no ioctl reads a made-up netdev).
        assert "\nrdma_ethtool_pfc_pause_frames_total{" in body
        assert [p.name[:21] for p in scratch.iterdir()] == ["rdma-exporter-sample-"]
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=15)
    assert process.returncode == 0, stderr
    warning = next(line for line in stderr.splitlines() if "sample tree of an 8-GPU node (10 RDMA devices)" in line)
    # logfmt, as node_exporter's, for whoever filters the log by level or logger.
    fields = parse_logfmt(warning)
    assert list(fields) == ["ts", "level", "logger", "msg"], warning
    assert (fields["level"], fields["logger"]) == ("warn", "rdma_exporter")
    assert fields["msg"].startswith("--sample given: serving the bundled sample tree")
    assert list(scratch.iterdir()) == []


def test_what_the_web_config_warns_of_at_start_is_logged_once_in_logfmt(tmp_path: Path) -> None:
    """The web config is read before anything listens, and its warnings (here a bcrypt cost of 4) are log
    lines like the rest: it was read twice, once before logging was set up, which put a bare line without
    ts=, level= or logger= into the journal beside the logfmt one."""
    import bcrypt

    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "rdma_exporter", "--path.sysfs", str(tmp_path), "--web.config.file", str(web),
         "--web.listen-address", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert first_answer(f"http://127.0.0.1:{port}/healthz") == (401, "")  # no credentials given
        assert process.poll() is None
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=15)
    assert process.returncode == 0, stderr
    lines = stderr.splitlines()
    assert [list(parse_logfmt(line))[:4] for line in lines] == [["ts", "level", "logger", "msg"]] * len(lines), stderr
    cheap = [line for line in lines if "hashes at bcrypt cost 4 are quick to crack" in line]
    assert len(cheap) == 1, stderr
    assert parse_logfmt(cheap[0])["level"] == "warn" and parse_logfmt(cheap[0])["logger"] == "rdma_exporter.webconfig"


def test_sample_tree_forced_on_a_node_with_rdma_devices_does_not_claim_they_are_missing(
    recorded_run: RunRecorder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # `--sample` on a GPU node (a demo) or next to --path.sysfs: the node's class/infiniband is there, and the
    # log must not send whoever reads it looking for RDMA modules that did not load.
    (tmp_path / "sys" / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="rdma_exporter"):
        assert cli.main(["--sample", "--path.sysfs", str(tmp_path / "sys")]) == 0
    assert recorded_run.config is not None and recorded_run.config.sample_tree
    warning = next(r.getMessage() for r in caplog.records if "bundled sample tree" in r.getMessage())
    assert warning.startswith("--sample given: serving the bundled sample tree"), warning
    assert "class/infiniband" not in warning.split(":")[0]


def test_sample_tree_only_for_a_bare_first_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A deployed exporter (a config file or --path.sysfs) on a node without class/infiniband, e.g. its
    modules failed to load, serves that node's empty tree, never the sample's devices."""
    empty = Config(sysfs=tmp_path / "sys")
    assert use_sample_tree(empty, forced=False, configured=True) is empty
    default = Config()
    if (default.sysfs / "class" / "infiniband").is_dir():
        pytest.skip("this machine has RDMA devices: the bare run serves them")
    assert use_sample_tree(default, forced=False, configured=True) is default
    with caplog.at_level(logging.WARNING, logger="rdma_exporter"):
        served = use_sample_tree(default, forced=False, configured=False)
    assert (served.sysfs / "class" / "infiniband" / "mlx5_0").is_dir()
    # Without --sample the reason is the missing directory, and the log names the tree actually served.
    warning = next(r.getMessage() for r in caplog.records if "bundled sample tree" in r.getMessage())
    assert warning.startswith("no /sys/class/infiniband on this machine: serving the bundled sample tree"), warning
    assert f" from {served.sysfs} " in warning, warning
    assert use_sample_tree(empty, forced=True, configured=True).sysfs != empty.sysfs


def test_a_bare_run_on_a_node_with_rdma_devices_serves_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The sample is for machines without /sys/class/infiniband: a bare run on an HCA node must serve the
    node's own devices, never eight made-up healthy ones under its name. (The test above can check only
    the other case on a machine without RDMA, so the node's class directory is made to exist here.)"""
    stat = os.stat
    directory = stat(tmp_path)

    def class_dir_present(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if os.fspath(path) == "/sys/class/infiniband":  # type: ignore[arg-type]
            return directory
        return stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", class_dir_present)
    default = Config()
    assert default.sysfs == Path("/sys")
    assert use_sample_tree(default, forced=False, configured=False) is default


def test_an_unreadable_class_directory_is_served_as_it_is_not_replaced_by_the_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Path.is_dir raises PermissionError on EACCES (review): the bare run died with a traceback. And a
    # directory that cannot be looked at may hold the node's devices (second review): the node's tree is
    # served, whose failed listing is counted, never made-up HCAs under its name.
    sysfs = tmp_path / "sys"
    (sysfs / "class" / "infiniband").mkdir(parents=True)
    refuse_stat_of(monkeypatch, sysfs / "class" / "infiniband")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    bare = Config(sysfs=sysfs)
    assert use_sample_tree(bare, forced=False, configured=False) is bare
    # Known to be absent: the sample, as on any machine without RDMA.
    absent = Config(sysfs=tmp_path / "none")
    assert use_sample_tree(absent, forced=False, configured=False).sample_tree


def test_a_sample_tree_that_cannot_be_built_leaves_the_machines_tree_or_stops_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, recorded_run: RunRecorder,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A read-only container without a writable temporary directory: a bare run serves the machine's own
    # (empty) tree and says why; --sample, which asked for the sample only, stops with the reason.
    import tempfile

    def read_only(*args: object, **kwargs: object) -> str:
        raise OSError(errno.EROFS, "Read-only file system", "/tmp")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    bare = Config(sysfs=tmp_path / "sys")
    with caplog.at_level(logging.ERROR, logger="rdma_exporter"):
        assert use_sample_tree(bare, forced=False, configured=False) is bare
    assert any(r.getMessage().startswith("cannot build the sample tree ([Errno 30]") for r in caplog.records)
    assert cli.main(["--sample"]) == 1
    assert recorded_run.config is None
    assert "cannot build the sample tree for --sample: [Errno 30] Read-only file system" in capsys.readouterr().err


def test_relative_paths_in_the_file_are_relative_to_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # systemd runs the exporter in /: a relative web.config_file must not depend on where it is checked from.
    etc = tmp_path / "etc"
    for directory in (etc / "sys", etc / "ethtool", tmp_path / "abs"):
        directory.mkdir(parents=True)
    (etc / "web.yml").write_text("http_server_config:\n  headers:\n    X-XSS-Protection: a\n")
    path = etc / "rdma-exporter.yml"
    path.write_text(f"web:\n  config_file: web.yml\npath:\n  sysfs: sys\n  ethtool: {tmp_path / 'abs'}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config_file(path)
    assert config.web_config_file == etc / "web.yml"
    assert config.sysfs == etc / "sys"
    assert config.ethtool_dir == tmp_path / "abs"  # absolute: unchanged
    for cwd in (etc, Path("/")):
        result = run_cli("--check-config", f"--config.file={path}", cwd=cwd)
        assert result.returncode == 0, result.stderr
    # A relative --config.file works too; flags stay relative to the working directory, as for any CLI.
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["--config.file", "etc/rdma-exporter.yml", "--path.ethtool", "etc/ethtool"])
    config = resolve_config(args)
    assert config.sysfs.resolve() == etc / "sys"
    assert config.ethtool_dir == Path("etc/ethtool")
    # A missing relative directory is reported where it was looked for.
    path.write_text("path:\n  sysfs: nosuch\n")
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert info.value.key == "path.sysfs" and str(etc / "nosuch") in info.value.reason


def _hash(cost: int = 4) -> str:
    import bcrypt

    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    return f"$2b${cost:02d}${hashed[7:]}"


def test_malformed_bcrypt_salt_stops_start_up(tmp_path: Path) -> None:
    from rdma_exporter.webconfig import load_web_config

    # A salt's last character carries 2 of its 6 bits: only . O e u are valid there, and bcrypt refuses
    # anything else ("Invalid salt") on every login, which would be a silent 401.
    for cost in (4, 31):  # 31: checked without paying for the cost
        malformed = _hash(cost)[:28] + "/" + _hash(cost)[29:]
        web = tmp_path / "web.yml"
        web.write_text(f"basic_auth_users:\n  ok: '{_hash()}'\n  prometheus: '{malformed}'\n")
        with pytest.raises(ConfigError) as info:
            load_web_config(web)
        assert info.value.key == "basic_auth_users.prometheus"
        assert "Invalid salt" in info.value.reason
    result = run_cli("--check-config", f"--web.config.file={web}")
    assert result.returncode == 2
    assert f"{web}: basic_auth_users.prometheus: bcrypt cannot check this hash" in result.stderr
    # A well-formed hash of the highest cost loads at once.
    web.write_text(f"basic_auth_users:\n  prometheus: '{_hash(31)}'\n")
    auth = load_web_config(web).auth
    assert auth is not None and set(auth.users) == {"prometheus"}


ALIAS_BOMB = "basic_auth_users:\n  a:\n    - &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"    - &{name} [{', '.join([f'*{previous}'] * 9)}]\n" for previous, name in zip("abcde", "bcdef", strict=True)
)


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("basic_auth_users: [\n", "line 2, column 1", "invalid YAML: expected the node content"),
        ("basic_auth_users:\n  a: 'x\x01'\n", "line 2, column 8", "invalid YAML: character #x0001"),
        ("http_server_config:\n\theaders: {}\n", "line 2, column 1", "invalid YAML: found character '\\t'"),
        # Scalars PyYAML resolves but cannot build raise ValueError, not a YAML error: no traceback either.
        ("basic_auth_users:\n  a: 2024-13-45\n", "line 2, column 6", "invalid YAML: cannot read this value: month"),
        ("basic_auth_users:\n  a: 1" + "0" * 5000 + "\n", "line 2, column 6", "invalid YAML: cannot read this value"),
        # A few lines whose aliases expand to 9^6 values: the repr of one in an error message took memory
        # without bound (9^8, a 3 GB message; a reload could get the daemon OOM-killed).
        (ALIAS_BOMB, "line 1, column 1", "invalid YAML: its aliases expand to more than 100000 values"),
        # PyYAML recurses per level: 3000 nested lists ended start-up with a RecursionError traceback.
        ("basic_auth_users:\n  a: " + "[" * 3000 + "]" * 3000, "(file)", "invalid YAML: values nested too deeply"),
        # A value that contains itself: counted once, it let a bomb through under a small count (a list of
        # 5000 aliases to it, each printed in full in the error message: 76 MB from a 20 KB file).
        ("basic_auth_users: &u\n  a: [*u, *u]\n", "line 1, column 1",
         "invalid YAML: an alias refers to a value that contains it"),
        # A list that holds itself directly passed the check, which looked at the path before adding the list
        # to it: 5000 aliases to it in a 40 KB file made a 175 MB message (review).
        ("basic_auth_users:\n  a: [&l [" + ", ".join(["*l"] * 5000) + "]]\n", "line 1, column 1",
         "invalid YAML: an alias refers to a value that contains it"),
        # YAML 1.1 octal: the flag reads --web.read-threads=010 as 10, the file read 8 (config review).
        ("web:\n  read_threads: 010\n", "line 2, column 17",
         "invalid YAML: 010 starts with 0, which YAML reads as an octal number (8): write it without"),
        # YAML 1.1 drops underscores before it reads the octal: 0_10 is 8 as well (mutation review).
        ("web:\n  read_threads: 0_10\n", "line 2, column 17",
         "invalid YAML: 0_10 starts with 0, which YAML reads as an octal number (8): write it without"),
    ],
    ids=["flow", "control-character", "tab", "impossible-date", "5001-digit-integer", "alias-bomb", "deep-nesting",
         "recursive-alias", "self-holding-list", "octal", "octal-with-underscore"],
)
def test_yaml_errors_name_line_and_column_in_both_files(tmp_path: Path, text: str, key: str, reason: str) -> None:
    from rdma_exporter.webconfig import load_web_config

    web = tmp_path / "web.yml"
    web.write_text(text)
    main = write(tmp_path, text)
    for path, load in ((web, load_web_config), (main, load_config_file)):
        with pytest.raises(ConfigError) as info:
            load(path)
        assert (info.value.source, info.value.key) == (str(path), key)
        assert info.value.reason.startswith(reason) and "\n" not in info.value.reason
        assert "<unicode string>" not in str(info.value)
    result = run_cli("--check-config", f"--web.config.file={web}")
    assert result.returncode == 2
    assert f"{web}: {key}: {reason}" in result.stderr and "<unicode string>" not in result.stderr


# --- flags against the file, log levels, the sample fallback, logfmt ----------------------------------


def test_device_filter_flags_override_the_file(tmp_path: Path) -> None:
    # Each flag replaces the file's regex, not just adds to it; the file's one stays when no flag is given.
    path = write(tmp_path, "devices:\n  include: 'mlx5_0'\n  exclude: 'mlx5_9'\n")
    config = resolve_config(build_parser().parse_args(["--config.file", str(path)]))
    assert config.device_include is not None and config.device_include.pattern == "mlx5_0"
    assert config.device_exclude is not None and config.device_exclude.pattern == "mlx5_9"
    args = ["--config.file", str(path), "--devices.include", "mlx5_1", "--devices.exclude", "mlx5_8"]
    config = resolve_config(build_parser().parse_args(args))
    assert config.device_include is not None and config.device_include.pattern == "mlx5_1"
    assert config.device_exclude is not None and config.device_exclude.pattern == "mlx5_8"


def test_empty_filter_flag_clears_the_file_filter(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # `--devices.include ''` is how an operator drops the file's filter for one run; compiled as a regex,
    # '' would fullmatch no device name and silently export nothing. It is also what an unset variable
    # gives (`--devices.exclude=$EXCLUDE`): said in the log (daemon review).
    path = write(tmp_path, "devices:\n  include: 'mlx5_0'\n  exclude: ''\n")
    caplog.set_level(logging.WARNING, logger="rdma_exporter")
    config = resolve_config(build_parser().parse_args(["--config.file", str(path), "--devices.include", ""]))
    assert config.device_include is None
    assert config.device_exclude is None
    said = f"--devices.include is empty: {path}'s devices.include 'mlx5_0' is not applied"
    assert [r.getMessage() for r in caplog.records] == [said]
    caplog.clear()
    resolve_config(build_parser().parse_args(["--config.file", str(path), "--devices.exclude", ""]))
    assert caplog.records == []  # the file's exclude was empty already: nothing dropped
    # At start-up it is said once logging is set up (a logfmt line), or by --check-config (review).
    result = run_cli("--config.file", str(path), "--devices.include=", "--check-config")
    assert result.returncode == 0 and result.stderr == f"rdma-exporter: warning: {said}\n", result.stderr
    metrics = samples(scrape(LEPTON, config))
    assert metrics[("rdma_exporter_devices_excluded", ())] == 0
    assert metrics[("rdma_exporter_devices", ())] > 0


def test_check_config_warns_of_a_filter_that_matches_no_device_whole() -> None:
    """A glob where a regex belongs (mlx5_*) matches part of every name and none whole: the daemon warned of
    it at start, but --check-config said "configuration OK" and nothing else, so a fleet check passed a
    filter that excludes nothing (review). It is still no error: the same file serves other nodes."""
    result = run_cli("--path.sysfs", str(LEPTON), "--devices.exclude", "mlx5_*", "--check-config")
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("rdma-exporter: warning: devices.exclude 'mlx5_*' matches none of the "), line
    assert "configuration OK" in result.stdout
    result = run_cli("--path.sysfs", str(LEPTON), "--devices.exclude", "mlx5_.*", "--check-config")
    assert (result.returncode, result.stderr) == (0, "")


def test_collector_flags_override_the_file_both_ways(tmp_path: Path) -> None:
    path = write(tmp_path, "collectors:\n  pcie: false\n  netdev: true\n")
    config = resolve_config(build_parser().parse_args(["--config.file", str(path)]))
    assert (config.collectors["pcie"], config.collectors["netdev"], config.collectors["ethtool"]) == (False, True, True)
    args = ["--config.file", str(path), "--collector.pcie", "--no-collector.netdev"]
    config = resolve_config(build_parser().parse_args(args))
    assert (config.collectors["pcie"], config.collectors["netdev"], config.collectors["ethtool"]) == (True, False, True)


def test_settings_for_a_collector_without_settings_are_refused(tmp_path: Path) -> None:
    # `collector.pcie.*` has no validator: a setting there would otherwise be silently ignored.
    path = write(tmp_path, "collector:\n  pcie:\n    extra: [a]\n")
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert (info.value.source, info.value.key) == (str(path), "collector.pcie")
    assert "no settings for this collector" in info.value.reason
    assert "expected" in info.value.reason  # names the collectors that do have settings


def test_every_setting_flag_beats_the_file(tmp_path: Path) -> None:
    # README: flags given on the command line win over the file, the file wins over the defaults.
    # --path.sysfs is how a container reads the host's /sys mounted elsewhere: ignored, it would serve the
    # container's own (often empty) tree.
    for directory in ("sys", "host-sys", "ethtool-file", "ethtool-flag"):
        (tmp_path / directory).mkdir()
    path = write(
        tmp_path,
        "web:\n  telemetry_path: /file\n  scrape_timeout_seconds: 5\n  config_file: web-file.yml\n"
        "log:\n  level: error\npath:\n  sysfs: sys\n  ethtool: ethtool-file\n",
    )
    config = resolve_config(build_parser().parse_args(["--config.file", str(path)]))
    assert (config.telemetry_path, config.scrape_timeout, config.log_level) == ("/file", 5.0, "error")
    assert config.web_config_file == tmp_path / "web-file.yml"
    assert (config.sysfs, config.ethtool_dir) == (tmp_path / "sys", tmp_path / "ethtool-file")
    args = [
        "--config.file", str(path), "--web.telemetry-path", "/flag", "--web.scrape-timeout", "2.5",
        "--log.level", "debug", "--web.config.file", "web-flag.yml",
        "--path.sysfs", str(tmp_path / "host-sys"), "--path.ethtool", str(tmp_path / "ethtool-flag"),
    ]
    config = resolve_config(build_parser().parse_args(args))
    assert (config.telemetry_path, config.scrape_timeout, config.log_level) == ("/flag", 2.5, "debug")
    assert config.web_config_file == Path("web-flag.yml")
    assert (config.sysfs, config.ethtool_dir) == (tmp_path / "host-sys", tmp_path / "ethtool-flag")


@pytest.mark.parametrize(
    ("flag", "value", "reason"),
    [
        ("--web.telemetry-path", "/healthz", "other than / and /healthz"),
        ("--web.telemetry-path", "metrics", "starting with /"),
        ("--web.scrape-timeout", "0", "expected a number of seconds from 0.1 to 300, got 0"),
        ("--web.scrape-timeout", "301", "expected a number of seconds from 0.1 to 300, got 301"),
        # Not numbers, or not a level: the same one-line reason, not argparse's usage text.
        ("--web.scrape-timeout", "abc", "expected a number of seconds from 0.1 to 300, got 'abc'"),
        ("--web.scrape-timeout", "nan", "expected a number of seconds from 0.1 to 300, got 'nan'"),
        # What float() reads and the file refuses: one value, one meaning (config review).
        ("--web.scrape-timeout", "1e1", "expected a number of seconds from 0.1 to 300, got '1e1'"),
        ("--web.scrape-timeout", "\u0661\u0663", "expected a number of seconds from 0.1 to 300, got '\u0661\u0663'"),
        ("--log.level", "verbose", "expected one of debug, info, warn, error, got 'verbose'"),
        ("--devices.include", "mlx5_[0-", "invalid regular expression"),
        ("--devices.exclude", "mlx5_[0-", "invalid regular expression"),
        ("--devices.exclude", "mlx5_[[:digit:]]", "POSIX classes such as [[:digit:]] are not supported"),
        ("--devices.include", "a{4294967296}", "the repetition number is too large"),
        ("--devices.include", "(" * 2000 + "a" + ")" * 2000, "nested too deeply"),
        # More digits than int() converts (4300): refused like any other out-of-range value, no traceback.
        ("--web.read-threads", "9" * 5000, "expected an integer from 1 to 64, got '999"),
        ("--read.max-open-files", "9" * 5000, "expected an integer from 0 to 1000000, got '999"),
    ],
    ids=lambda value: value if len(value) < 40 else f"{value[:5]}...({len(value)} characters)",
)
def test_invalid_flag_values_are_refused_with_the_flag_and_reason(flag: str, value: str, reason: str) -> None:
    # The same checks as the file's keys: a bad flag stops start-up instead of serving something else.
    with pytest.raises(ConfigError) as info:
        resolve_config(build_parser().parse_args([flag, value]))
    assert (info.value.source, info.value.key) == ("command line", flag)
    assert reason in info.value.reason


@pytest.mark.parametrize("flag", ["--web.listen=:9999", "--path.sys=/tmp", "--log=debug"])
def test_an_abbreviated_flag_is_refused_not_guessed(flag: str) -> None:
    # argparse would take --web.listen= for --web.listen-address=; node_exporter refuses it, and so do we.
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([flag])
    assert info.value.code == 2


@pytest.mark.parametrize(
    "flag",
    [action.option_strings[0] for action in build_parser()._actions
     if action.option_strings and action.option_strings[0].startswith("--") and action.nargs is None
     and action.const is None],
)
def test_a_setting_flag_given_twice_is_refused_not_the_last_taken(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A unit's --config.file and another in $RDMA_EXPORTER_ARGS, or two --devices.exclude meant to add up:
    # argparse kept the last one without a word (config review); kingpin, node_exporter's, refuses.
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([flag, "1", flag, "2"])
    assert info.value.code == 2
    assert f"flag {flag} cannot be repeated" in capsys.readouterr().err


def test_a_switch_given_twice_is_still_the_switch() -> None:
    args = build_parser().parse_args(["--check-config", "--check-config", "--collector.pcie", "--collector.pcie"])
    assert args.check_config and args.collector_pcie


def test_both_forms_of_a_collector_flag_are_refused() -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--collector.pcie", "--no-collector.pcie"])
    assert info.value.code == 2


@pytest.mark.parametrize(
    ("level", "expected"),
    [("debug", logging.DEBUG), ("info", logging.INFO), ("warn", logging.WARNING), ("error", logging.ERROR)],
)
def test_log_level_sets_the_level_of_the_log(monkeypatch: pytest.MonkeyPatch, level: str, expected: int) -> None:
    calls: list[dict[str, object]] = []
    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: calls.append(kwargs))
    cli.setup_logging(level)
    assert [call["level"] for call in calls] == [expected]


class RunRecorder:
    """Stands in for daemon.run: records what main() would serve, and how it would reload."""

    def __init__(self) -> None:
        self.config: Config | None = None
        self.reload: Callable[[], Config] | None = None
        self.log_levels: list[str] = []
        self.web: WebConfig | None = None

    def __call__(self, config: Config, reload: Callable[[], Config] | None = None, web: WebConfig | None = None) -> int:
        self.config, self.reload, self.web = config, reload, web
        return 0


@pytest.fixture
def recorded_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> RunRecorder:
    import tempfile

    from rdma_exporter import daemon

    recorder = RunRecorder()
    monkeypatch.setattr(daemon, "run", recorder)
    monkeypatch.setattr(cli, "setup_logging", recorder.log_levels.append)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where --sample builds its tree
    return recorder


@pytest.mark.parametrize(
    ("args", "forced", "configured"),
    [
        ([], False, False),
        (["--sample"], True, False),
        (["--path.sysfs", "{tmp}"], False, True),
        (["--config.file", "{config}"], False, True),
    ],
    ids=["bare", "sample", "path-sysfs", "config-file"],
)
def test_only_a_bare_run_may_fall_back_to_the_sample_tree(
    recorded_run: RunRecorder, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    args: list[str], forced: bool, configured: bool,
) -> None:
    # README: given --config.file or --path.sysfs, it serves the node's own tree, even without devices.
    config_file = write(tmp_path, "log:\n  level: info\n")
    asked: list[tuple[bool, bool]] = []

    def recording(config: Config, forced: bool, configured: bool) -> Config:
        asked.append((forced, configured))
        return config

    monkeypatch.setattr(cli, "use_sample_tree", recording)
    argv = [arg.format(tmp=tmp_path, config=config_file) for arg in args]
    assert cli.main(argv) == 0
    assert asked == [(forced, configured)]


def test_a_reload_rereads_the_file_and_keeps_the_sample_tree(recorded_run: RunRecorder, tmp_path: Path) -> None:
    # operations.md: SIGHUP re-reads the config file and re-applies the flags; the sample tree stays.
    path = write(tmp_path, "web:\n  telemetry_path: /before\n")
    assert cli.main(["--sample", "--config.file", str(path), "--log.level", "debug"]) == 0
    served, reload = recorded_run.config, recorded_run.reload
    assert recorded_run.log_levels == ["debug"]  # the log is set up before anything is served
    assert recorded_run.web == WebConfig()  # the web config main checked, handed over (none named here)
    assert served is not None and reload is not None
    assert served.sample_tree and (served.sysfs / "class" / "infiniband" / "mlx5_0").is_dir()
    path.write_text("web:\n  telemetry_path: /after\nlog:\n  level: error\n")
    reloaded = reload()
    assert reloaded.telemetry_path == "/after"
    assert reloaded.log_level == "debug"  # the flag still beats the file
    assert (reloaded.sysfs, reloaded.ethtool_dir, reloaded.sample_tree) == (served.sysfs, served.ethtool_dir, True)


def test_the_sample_tree_uses_the_ethtool_captures_the_flag_names(recorded_run: RunRecorder, tmp_path: Path) -> None:
    # --sample builds its sysfs tree but --path.ethtool still says where the ethtool captures are read.
    captures = tmp_path / "captures"
    captures.mkdir()
    assert cli.main(["--sample", "--path.ethtool", str(captures)]) == 0
    served = recorded_run.config
    assert served is not None and served.sample_tree
    assert served.ethtool_dir == captures


@pytest.mark.parametrize("uid", [0, 1000])
def test_running_as_root_is_warned_about(
    recorded_run: RunRecorder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path,
    uid: int,
) -> None:
    monkeypatch.setattr(cli.os, "geteuid", lambda: uid)
    with caplog.at_level(logging.WARNING, logger="rdma_exporter"):
        assert cli.main(["--path.sysfs", str(tmp_path)]) == 0
    warned = [r.getMessage() for r in caplog.records if "running as root" in r.getMessage()]
    assert warned == (["running as root: nothing rdma-exporter reads needs it; run it as an unprivileged user"]
                      if uid == 0 else [])


LOGFMT_PAIR = re.compile(r'([^\s=]+)=("(?:[^"\\]|\\.)*"|[^\s"=]*)(?: |$)')


def parse_logfmt(line: str) -> dict[str, str]:
    """A strict logfmt reader: the whole line must be key=value pairs, quoted values JSON-escaped."""
    fields: dict[str, str] = {}
    position = 0
    while position < len(line):
        match = LOGFMT_PAIR.match(line, position)
        assert match, f"not logfmt at column {position}: {line!r}"
        key, raw = match.groups()
        assert key not in fields, f"{key} twice in {line!r}"
        fields[key] = json.loads(raw) if raw.startswith('"') else raw
        position = match.end()
    return fields


def test_log_records_are_one_logfmt_line_each() -> None:
    """A log shipper's logfmt parser (Loki, Vector) must get one whole record per line: a space in the
    time stamp, or an unquoted message, split records into stray keys; a traceback split them into lines."""
    formatter = LogfmtFormatter()
    record = logging.LogRecord("rdma_exporter.daemon", logging.WARNING, __file__, 1, "device %s: %s", None, None)
    record.args = ("mlx5_1", 'no answer before "the deadline"\tx=1\x07')
    line = formatter.format(record)
    fields = parse_logfmt(line)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", fields["ts"]), line
    assert fields["level"] == "warn" and fields["logger"] == "rdma_exporter.daemon"
    assert fields["msg"] == 'device mlx5_1: no answer before "the deadline"\tx=1\x07'
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        record = logging.LogRecord("rdma_exporter", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    line = formatter.format(record)
    assert "\n" not in line
    fields = parse_logfmt(line)
    assert (fields["level"], fields["msg"]) == ("error", "failed")
    assert fields["exc"].startswith("Traceback (most recent call last):\n") and fields["exc"].endswith("bad\nvalue")
    assert parse_logfmt(formatter.format(logging.LogRecord("x", logging.INFO, "", 1, "up", None, None)))["msg"] == "up"


def test_operations_md_names_every_logger_that_logs() -> None:
    """operations.md's Logs section says which `logger` value each part of the daemon writes, for those who
    filter the journal with `| logfmt | logger=...`. A module that logs under a name the page does not
    give is invisible to such a filter: the sample-tree and running-as-root warnings at start-up are
    `rdma_exporter` (the command line), not `rdma_exporter.daemon`."""
    package = Path(cli.__file__).parent
    loggers: set[str] = set()
    for source in package.rglob("*.py"):
        text = source.read_text()
        if not re.search(r"\blog\.(debug|info|warning|error|exception|log)\(|CountedWarning\(log\)", text):
            continue
        module = ".".join(source.relative_to(package.parent).with_suffix("").parts)
        for name in re.findall(r"\blog = logging\.getLogger\(([^)]*)\)", text):
            loggers.add(module if name == "__name__" else name.strip("\"'"))
    assert {"rdma_exporter", "rdma_exporter.daemon", "rdma_exporter.collect.engine"} <= loggers, loggers
    doc = (package.parent.parent / "docs" / "operations.md").read_text()
    section = doc.split("\n## Logs\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(rdma_exporter(?:\.[a-z_.]+)?)`", section))
    assert sorted(loggers - named) == []


# --- empty keys, non-ASCII ports, encodings -----------------------------------------------------------


def test_an_empty_sysfs_or_web_config_key_is_refused_and_an_empty_ethtool_key_is_not_set(tmp_path: Path) -> None:
    # `sysfs:` left empty in a template is None in YAML: --check-config passed it, and the daemon then
    # stopped with a TypeError traceback on `None / "class"`. path.ethtool has no default: empty is unset.
    # An empty web.config_file served plain HTTP without the TLS and passwords it was written for, and
    # --check-config said OK (daemon review): refused.
    for text in ("path:\n  sysfs:\n", "path:\n  sysfs: ''\n"):
        path = write(tmp_path, text)
        with pytest.raises(ConfigError) as info:
            load_config_file(path)
        assert (info.value.source, info.value.key) == (str(path), "path.sysfs")
        assert "expected a non-empty string" in info.value.reason
        result = run_cli("--config.file", str(path), "--check-config")
        assert result.returncode == 2
        assert f"{path}: path.sysfs: expected a non-empty string, got " in result.stderr
    config = load_config_file(write(tmp_path, "path:\n  ethtool:\n"))
    assert (config.sysfs, config.ethtool_dir, config.web_config_file) == (Path("/sys"), None, None)
    path = write(tmp_path, "web:\n  config_file:\n")
    result = run_cli("--config.file", str(path), "--check-config")
    assert result.returncode == 2, result.stdout
    assert f"{path}: web.config_file: empty: give the file, or leave the key out" in result.stderr


def test_a_path_that_cannot_be_looked_at_names_the_key_and_why(tmp_path: Path) -> None:
    # Path.is_dir() and is_file() raise on anything but "not there" (EACCES on a parent, a name too long,
    # a link loop): start-up ended in a traceback, not the file, key and reason (daemon review).
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    long_name = tmp_path / ("a" * 300)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {loop}\n  key_file: {loop}\n")
    for args, where in (
        (("--path.sysfs", str(long_name)), f"--path.sysfs: cannot look at {long_name}: File name too long"),
        (("--path.ethtool", str(loop)), f"--path.ethtool: cannot look at {loop}: Too many levels of symbolic links"),
        (("--web.config.file", str(web)), f"tls_server_config.cert_file: cannot look at {loop}: Too many levels"),
    ):
        result = run_cli(*args, "--check-config")
        assert result.returncode == 2, result.stderr
        assert where in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("port", ["\u00b2", "\u0663", "９８８３"])
def test_a_listen_port_of_non_ascii_digits_is_refused(tmp_path: Path, port: str) -> None:
    # '²' is a digit to str.isdigit() but not to int(): start-up ended in a ValueError traceback (exit 1)
    # instead of the key and reason. '٣' and fullwidth digits are int() digits; the flags refuse them too.
    path = write(tmp_path, f"web:\n  listen_address: ':{port}'\n")
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert (info.value.key, info.value.reason) == (
        "web.listen_address", f"expected [host]:port with a port from 1 to 65535, got ':{port}'"
    )
    result = run_cli("--config.file", str(path), "--check-config")
    assert result.returncode == 2, result.stderr
    assert f"{path}: web.listen_address: expected [host]:port" in result.stderr


def test_a_config_file_that_is_not_utf8_is_refused_and_a_good_one_is_named(tmp_path: Path) -> None:
    # UTF-16 from a Windows editor: a UnicodeDecodeError traceback, or (read as Latin-1) a file of NULs.
    path = tmp_path / "rdma-exporter.yml"
    path.write_text("log:\n  level: info\n", encoding="utf-16")
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert (info.value.source, info.value.key, info.value.reason) == (str(path), "(file)", "not UTF-8 text")
    result = run_cli("--config.file", str(path), "--check-config")
    assert result.returncode == 2
    assert result.stderr == f"rdma-exporter: invalid configuration: {path}: (file): not UTF-8 text\n"
    # --check-config says which file it checked (a wrong path in a unit file shows up here).
    path.write_text("log:\n  level: info\n", encoding="utf-8")
    assert load_config_file(path).config_file == path
    result = run_cli("--config.file", str(path), "--check-config")
    assert result.returncode == 0 and f"configuration OK ({path}; web: " in result.stdout, result.stderr


# --- reasons exact, flags never silently empty, reloads -----------------------------------------------


@pytest.mark.parametrize("flag", ["--config.file", "--web.config.file"])
def test_an_empty_file_flag_stops_start_up(flag: str) -> None:
    # `--config.file=$CONFIG` with the variable unset: the exporter ran on the defaults, without the file's
    # devices.exclude, and said "configuration OK"; an empty --web.config.file was reported as the file ".".
    result = run_cli(f"{flag}=", "--check-config")
    assert result.returncode == 2
    expected = f"rdma-exporter: invalid configuration: command line: {flag}: expected a non-empty string, got ''\n"
    assert result.stderr == expected


def test_check_config_without_a_file_says_what_it_checked() -> None:
    result = run_cli("--check-config")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "rdma-exporter: configuration OK (defaults and flags; web: HTTP)\n"


def test_a_reload_of_a_run_without_the_sample_applies_the_file(recorded_run: RunRecorder, tmp_path: Path) -> None:
    # Only a sample run keeps its tree over a reload: a deployed exporter must not start reporting
    # rdma_exporter_sample_tree 1, nor keep a sysfs the file no longer names.
    for directory in ("before", "after"):
        (tmp_path / directory).mkdir()
    path = write(tmp_path, "path:\n  sysfs: before\n")
    assert cli.main(["--config.file", str(path)]) == 0
    served, reload = recorded_run.config, recorded_run.reload
    assert served is not None and reload is not None
    assert (served.sysfs, served.sample_tree) == (tmp_path / "before", False)
    path.write_text("path:\n  sysfs: after\n")
    reloaded = reload()
    assert (reloaded.sysfs, reloaded.ethtool_dir, reloaded.sample_tree) == (tmp_path / "after", None, False)


@pytest.mark.parametrize(
    "message",
    ["k=v", 'say"hi"', "bell\x07", "C:\\new", "tag\U000e0001", "a\U0010ffff", "eth\udcff"],
)
def test_a_message_without_spaces_is_still_one_logfmt_value(message: str) -> None:
    # Without a space the value may be bare: an '=', a quote, a control character or a backslash in it must
    # still be quoted and escaped, or a logfmt parser splits it, or reads another string back. Above U+FFFF
    # a JSON escape is a surrogate pair (review: "\ue0001" read back as U+E000 and "1"); a lone surrogate
    # (a netdev name's undecodable byte) is its own escape.
    record = logging.LogRecord("rdma_exporter", logging.INFO, __file__, 1, "%s", (message,), None)
    line = LogfmtFormatter().format(record)
    assert line.isprintable(), line
    assert parse_logfmt(line)["msg"] == message


@pytest.mark.parametrize(
    "address",
    [":9883", "0.0.0.0:9883", "[::]:9883", "[fe80::1%eth0]:9883", "localhost:9883", "node_01.cluster.local:9883"],
)
def test_listen_addresses_operators_use_are_accepted(address: str) -> None:
    # Review: underscores, which /etc/hosts and resolvers take, were refused after the host check came in.
    assert check_listen("test.yml", "web.listen_address", address) == address


def test_a_link_local_listen_address_keeps_its_scope() -> None:
    # Daemon review: bound as (host, port), fe80::1%eth0 lost its scope and every start failed with EINVAL.
    assert listen_address("fe80::1%lo", 9883) == (socket.AF_INET6, ("fe80::1", 9883, 0, socket.if_nametoindex("lo")))
    assert listen_address("::1", 9883) == (socket.AF_INET6, ("::1", 9883, 0, 0))


def test_a_web_config_file_that_fails_names_the_setting_that_named_it(tmp_path: Path) -> None:
    # `~/web.yml` in the config file is not expanded (YAML is no shell): the message named only
    # "<config dir>/~/web.yml", not the key to fix (config review).
    config = tmp_path / "rdma-exporter.yml"
    config.write_text("web:\n  config_file: ~/web.yml\n")
    result = run_cli("--config.file", str(config), "--check-config")
    assert result.returncode == 1  # missing: may appear later
    assert result.stderr.rstrip().endswith(f"(named by {config}: web.config_file)"), result.stderr
    assert f"{tmp_path}/~/web.yml" in result.stderr
    result = run_cli("--web.config.file", str(tmp_path / "none.yml"), "--check-config")
    assert result.stderr.rstrip().endswith("(named by --web.config.file)"), result.stderr


@pytest.mark.parametrize(
    ("flags", "delay"), [(["--sample"], 0.0), (["--sample"], 0.05), (["--sample"], 0.15), ([], 0.0), ([], 0.05)]
)
def test_a_sigterm_during_start_up_leaves_no_sample_tree_behind(tmp_path: Path, flags: list[str], delay: float) -> None:
    """A bare run builds the sample tree in TMPDIR and removes it at exit. A SIGTERM in the first fraction of
    a second, before the daemon takes the signal over, ended the process by the default action, which runs
    no atexit: the tree stayed (operator review). Sent as soon as the tree's directory exists, and a little
    later (while it is built, while the daemon starts). With no flag at all (README's first command) the
    tree is built only because this machine has no RDMA devices."""
    if not flags and Path("/sys/class/infiniband").exists():
        pytest.skip("a bare run serves this machine's own RDMA devices, not the sample tree")
    env = dict(os.environ, TMPDIR=str(tmp_path))
    cmd = [sys.executable, "-m", "rdma_exporter", *flags, "--web.listen-address", f"127.0.0.1:{free_port()}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob("rdma-exporter-sample-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert list(tmp_path.glob("rdma-exporter-sample-*")), "the sample tree was never made"
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert list(tmp_path.glob("rdma-exporter-sample-*")) == []


def test_log_time_stamps_are_utc_whatever_the_host_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `ts` field ends in Z: it must be UTC on a host whose TZ is not (a node set to local time), or
    its lines sort hours away from node_exporter's and the journal's in Loki."""
    monkeypatch.setenv("TZ", "IST-5:30")  # UTC+05:30 as a POSIX rule: no tzdata needed
    time.tzset()
    try:
        record = logging.LogRecord("rdma_exporter", logging.INFO, __file__, 1, "up", None, None)
        record.created, record.msecs = 1_700_000_000.25, 250.0
        assert parse_logfmt(LogfmtFormatter().format(record))["ts"] == "2023-11-14T22:13:20.250Z"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_a_sigterm_before_the_daemon_takes_it_over_exits_as_the_signal_would() -> None:
    """During a bare run's start-up SIGTERM ends the process through Python (so atexit removes the sample
    tree) with the status a shell reports for a death by SIGTERM, 128 + 15, not 0 as if it had finished."""
    with pytest.raises(SystemExit) as info:
        cli._exit_on_term(signal.SIGTERM, None)
    assert info.value.code == 143


def test_sigterm_waits_while_the_sample_tree_is_made_and_its_removal_registered(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A SIGTERM between mkdtemp and atexit.register ended the process with the tree made and its removal
    not registered: the tree stayed in TMPDIR. A window of microseconds, which the test sending SIGTERM
    at start-up hits only by chance, so the signal mask is checked in it instead."""
    import atexit
    import tempfile

    from rdma_exporter import sample_tree

    blocked: dict[str, bool] = {}

    def mkdtemp(prefix: str) -> str:
        blocked["mkdtemp"] = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, set())
        path = tmp_path / f"{prefix}made"
        path.mkdir()
        return str(path)

    def register(function: Callable[..., object], *args: object, **kwargs: object) -> None:
        blocked["register"] = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, set())

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(atexit, "register", register)
    monkeypatch.setattr(sample_tree, "build_tree", lambda dest, spec: dest / "sys")
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    served = use_sample_tree(Config(), forced=True, configured=False)
    assert served.sysfs == tmp_path / "rdma-exporter-sample-made" / "sys"
    assert blocked == {"mkdtemp": True, "register": True}
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before  # and delivered again afterwards
