"""Shared test helpers: fixture trees, in-process scrapes and exposition parsing."""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import re
import resource
import shutil
import socket
import subprocess
import threading
import time
import types
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
from hypothesis import HealthCheck, settings
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rdma_exporter.collect.base import FamilySet
from rdma_exporter.collect.readers import DeviceReads, shared_reads
from rdma_exporter.config import Config
from rdma_exporter.daemon import build_collector

# Property tests check behaviour, not speed (bench/ measures that): no per-example time limit, which a
# busy 2-core CI machine can overrun. Loaded here, before any test module builds its @settings on it.
settings.register_profile("rdma-exporter", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("rdma-exporter")

FIXTURES = Path(__file__).parent / "fixtures"
SYSFS_FIXTURES = FIXTURES / "sysfs"
GOLDEN = Path(__file__).parent / "golden"

# Captured trees copied from shared/fixtures (see fixtures/SOURCES.md).
CAPTURED_TREES = sorted(p.name for p in SYSFS_FIXTURES.iterdir() if (p / "sys").is_dir())

# Lines that legitimately differ between runs: timings and the Python version.
VOLATILE_PREFIXES = (
    "rdma_exporter_scrape_collector_duration_seconds{",
    "rdma_exporter_build_info{",
    "rdma_exporter_node_boot_time_seconds ",  # the machine's own
)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def skip_or_fail(reason: str) -> NoReturn:
    """For what .ci/run's machine is sure to have (root, netns, a sysfs /sys, the setup's tools): a skip
    locally, a failure under CI=1, so a broken CI machine cannot pass by skipping."""
    __tracebackhide__ = True  # report the caller's line, not this one
    if in_ci():
        pytest.fail(f"{reason}; CI=1 and .ci/run's machine must provide it, so this is a failure, not a skip")
    pytest.skip(reason)


def require_vm(*tools: str, files: tuple[str, ...] = ()) -> None:
    """What a test booting tests/vm's qemu VM needs: the unpacked kernel, qemu, busybox-static, and
    `tools` on PATH and `files` in place; skipped locally when absent, a failure in CI."""
    __tracebackhide__ = True
    from vm.harness import find_kernel

    if find_kernel() is None:
        skip_or_fail("no Debian kernel unpacked for the VM (scripts/install-test-deps.sh)")
    for tool in ("qemu-system-x86_64", *tools):
        require_binary(tool)
    for path in ("/bin/busybox", *files):
        if not Path(path).is_file():
            skip_or_fail(f"{path} is missing (scripts/install-test-deps.sh)")


def require_binary(name: str) -> str:
    """Path of a tool the suite needs; skipped locally when absent, a failure in CI (.ci/run installs it)."""
    __tracebackhide__ = True
    path = shutil.which(name)
    if path is None:
        skip_or_fail(f"{name} is not installed (scripts/install-test-deps.sh installs it)")
    return path


@dataclass(frozen=True)
class PrometheusRelease:
    """One Prometheus line the alert pack is tested with, and the Alertmanager that goes with it."""

    name: str  # the test id
    major: int  # of prometheus and promtool
    alertmanager_minors: range  # of Alertmanager 0.x and amtool
    bin_dir: Path | None  # None: the PATH

    def binary(self, *names: str) -> str:
        """The first of `names` this release has (Debian names Alertmanager prometheus-alertmanager,
        upstream alertmanager), checked to be of this release: with the other line's directory first on
        PATH, a test would otherwise run one line twice. Skipped locally when absent, a failure in CI."""
        __tracebackhide__ = True
        search = None if self.bin_dir is None else str(self.bin_dir)
        for name in names:
            path = shutil.which(name, path=search)
            if path is None:
                continue
            version = _version(path)
            if name in ("prometheus", "promtool"):
                fits = version is not None and version[0] == self.major
                wanted = f"{self.major}.x"
            else:
                fits = version is not None and version[0] == 0 and version[1] in self.alertmanager_minors
                first, last = self.alertmanager_minors[0], self.alertmanager_minors[-1]
                wanted = f"0.{first}" if first == last else f"0.{first} to 0.{last}"
            if not fits:
                found = "unknown (it did not run)" if version is None else ".".join(map(str, version))
                skip_or_fail(f"{path} is version {found}, not {wanted} (scripts/install-test-deps.sh)")
            return path
        where = "PATH" if self.bin_dir is None else str(self.bin_dir)
        skip_or_fail(f"{' / '.join(names)} not found in {where} (scripts/install-test-deps.sh installs it)")


@functools.cache
def _version(binary: str) -> tuple[int, int] | None:
    """Major and minor of what `binary --version` reports ("promtool, version 3.5.3+ds1 (branch: ..."),
    or None if it does not run here."""
    try:
        # env: called from BackgroundRuns' threads too (see there).
        result = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30,
                                env=dict(os.environ))  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"\bversion (\d+)\.(\d+)", result.stdout + result.stderr)
    return (int(found.group(1)), int(found.group(2))) if found else None


# Debian 12's Prometheus 2.42 and Alertmanager 0.25 (apt, on the PATH), and Prometheus 3 with its
# Alertmanager as Debian testing ships them, unpacked by scripts/install-test-deps.sh into a cache (the
# packages cannot be installed beside 2.42). Prometheus 3's range selectors are left-open, so the rules'
# unit tests must hold under both.
PROMETHEUS3_ROOT = Path(
    os.environ.get("RDMA_EXPORTER_PROMETHEUS3_DIR", Path.home() / ".cache/rdma-exporter-prometheus3")
)
PROMETHEUS_RELEASES = (
    PrometheusRelease("prometheus2", 2, range(25, 26), None),
    PrometheusRelease("prometheus3", 3, range(27, 100), PROMETHEUS3_ROOT / "usr/bin"),
)


def alternatives(regex: str) -> list[str]:
    """The branches of an alertname regex: top-level `|`, and one `(a|b)` group inside a branch expanded."""
    branches, depth, start = [], 0, 0
    for i, char in enumerate(regex + "|"):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "|" and depth == 0:
            branches.append(regex[start:i])
            start = i + 1
    out = []
    for branch in branches:
        group = re.fullmatch(r"([^()]*)\(([^()]*)\)([^()]*)", branch)
        if group:
            out += [group[1] + inner + group[3] for inner in group[2].split("|")]
        else:
            out.append(branch)
    return out


def scrape(sys_root: Path, config: Config | None = None, **overrides: object) -> str:
    """One in-process scrape of `sys_root`, as the HTTP endpoint would serve it: the daemon's own writer,
    checked against prometheus_client's (which alone would hide a difference, e.g. it strips a doubled
    `_total` that the daemon's writer would serve)."""
    from dataclasses import replace

    config = replace(config or Config(), sysfs=sys_root, **overrides)  # type: ignore[arg-type]
    # Its own kept files and refusal records, as a fresh process has: with the process's, a counter file
    # another test's scrape of the same tree refused in the last minute would be left out, uncounted.
    reads = DeviceReads(shared_reads().pool)
    families = build_collector(config, reads=reads).gather()
    text = families.render_text()
    assert text == prometheus_text(families), "the daemon's writer differs from prometheus_client's"
    return text.decode()


class _Families:
    """A registry collector that yields one scrape's families as they are."""

    def __init__(self, families: FamilySet) -> None:
        self.families = families

    def collect(self) -> Iterator[object]:
        return iter(self.families)


def prometheus_text(families: FamilySet) -> bytes:
    """The families written by prometheus_client's own writer: the reference our render must match."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))  # type: ignore[arg-type]
    return generate_latest(registry)


def refuse_stat_of(monkeypatch: pytest.MonkeyPatch, refused: Path) -> None:
    """os.stat of `refused` fails with EACCES, as under a sandbox that hides it (InaccessiblePaths=)."""
    stat = os.stat

    def refusing(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if os.fspath(path) == os.fspath(refused):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(refused))
        return stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", refusing)


def wait_until(
    condition: Callable[[], object], timeout: float = 5.0, *, explain: Callable[[], str] | None = None
) -> None:
    """Poll `condition` until it holds; fail the test after `timeout` seconds, with what `explain` says
    then (a daemon's log) in the message."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition not reached in time" + (f"\n{explain()}" if explain else "")
        time.sleep(0.02)


def selected_params(request: pytest.FixtureRequest, test_name: str) -> list[dict[str, Any]]:
    """The parameters of every selected run of the requesting module's test `test_name`, in the order
    pytest runs them."""
    items = [item for item in request.session.items if isinstance(item, pytest.Function)]
    return params_of([item for item in items if item.module is request.module], test_name)


def params_of(items: Iterable[pytest.Function], test_name: str) -> list[dict[str, Any]]:
    """The parameters of the runs of test `test_name` among `items`, in their order."""
    return [item.callspec.params for item in items if item.originalname == test_name and hasattr(item, "callspec")]


class DescriptorTakeover:
    """Background runs open files and pipes at any moment, beside the test in progress; a test that takes
    every descriptor of the process (the accept-EMFILE tests) made them fail with EMFILE (28 promtool
    checks in one fresh-clone CI run). Runs share this; such a test holds it alone (exclusive()), which
    waits for the runs in progress to end and keeps new ones from starting meanwhile."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._sharing = 0
        self._wanted = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._wanted)
            self._sharing += 1
        try:
            yield
        finally:
            with self._changed:
                self._sharing -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._wanted)
            self._wanted = True
            self._changed.wait_for(lambda: self._sharing == 0)
        try:
            yield
        finally:
            with self._changed:
                self._wanted = False
                self._changed.notify_all()


DESCRIPTORS = DescriptorTakeover()


class BackgroundRuns:
    """Slow work behind parametrized tests, all of it submitted at once and done `workers` at a time;
    each test waits for its own run and judges it. For runs that leave a CPU idle (promtool keeps about
    one of the CI machine's two busy; an end-to-end run mostly waits on evaluation intervals). An
    exception of a run (a failed or skipped check in it) is raised again in the test that waits for it.

    A process a run starts must be given its environment (`env=`): without one, subprocess's vfork child
    executes with the C library's environment array, which pytest's own thread reallocates as it adds
    and removes PYTEST_CURRENT_TEST around every test, and the exec fails with EFAULT ("Bad address"):
    once in a CI run, and in 321 of 1,500 spawns with a thread doing the same beside them (0 with env=)."""

    def __init__(self, workers: int = 2) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="background-run")
        self._runs: dict[Hashable, Future[Any]] = {}

    def submit(self, key: Hashable, run: Callable[..., Any], *args: Any) -> None:
        def shared() -> Any:
            with DESCRIPTORS.shared():
                return run(*args)

        self._start(key, shared)

    def _start(self, key: Hashable, job: Callable[[], Any]) -> None:
        self._runs[key] = self._pool.submit(job)

    def result(self, key: Hashable) -> Any:
        __tracebackhide__ = True
        return self._runs[key].result()

    def wait(self) -> None:
        """Until every run submitted has ended; their outcomes stay for result()."""
        futures.wait(self._runs.values())

    def __enter__(self) -> BackgroundRuns:
        return self

    def __exit__(self, *exc: object) -> None:
        # Runs no test waited for (an earlier test stopped the session) are not started.
        self._pool.shutdown(wait=True, cancel_futures=True)


# Slow set-ups (the VM boots) that start in the background as the session starts, while the other
# modules' tests run on the second CPU, instead of when their module comes up: module name -> set-up.
EARLY_SETUPS: dict[str, Callable[[Path], Any]] = {}


def early_setup(setup: Callable[[Path], Any]) -> Callable[[Path], Any]:
    """Register a test module's slow module-level set-up, given a fresh directory of its own; its
    fixture gets the result (or the set-up's exception, a skip too) from early_runs.result(module)."""
    EARLY_SETUPS[setup.__module__] = setup
    return setup


@pytest.fixture(scope="session", autouse=True)
def early_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundRuns]:
    """Starts, one at a time, the registered set-ups of the modules that have a test selected. A VM boot
    under TCG keeps about one CPU busy for 40-120 s; started here it overlaps the tests that wait on a
    daemon or a clock (about 2 minutes off the CI machine's run)."""
    selected = {item.module.__name__ for item in request.session.items if isinstance(item, pytest.Function)}
    modules = [module for module in EARLY_SETUPS if module in selected]
    with BackgroundRuns(workers=1) as runs:
        for module in modules:
            runs.submit(module, EARLY_SETUPS[module], tmp_path_factory.mktemp(module.removeprefix("test_")))
        yield runs
        if modules:  # by now every boot has ended, unless the session stopped early (-x, Ctrl-C)
            from vm.harness import stop_all

            stop_all()


class GatedRuns(BackgroundRuns):
    """Background runs that start once `after` has ended, one at a time until widen(), then two."""

    def __init__(self, after: BackgroundRuns) -> None:
        super().__init__(workers=2)
        self._after = after
        self._gate = threading.Semaphore(1)
        self._widened = False

    def submit(self, key: Hashable, run: Callable[..., Any], *args: Any) -> None:
        def gated() -> Any:
            self._after.wait()
            with self._gate, DESCRIPTORS.shared():  # shared while it runs, not while it waits its turn
                return run(*args)

        self._start(key, gated)

    def widen(self) -> None:
        if not self._widened:
            self._widened = True
            self._gate.release()


BatchRun = tuple[Hashable, Callable[..., Any], tuple[Any, ...]]
# Slow runs behind a module's parametrized tests (promtool's unit tests): module name -> the runs for the
# session's selected tests, given a scratch directory. Submitted as the session starts, they run one at
# a time once the VM boots have ended, beside the tests that wait on daemons and clocks and leave a CPU
# idle, and two at a time once their module's tests come up (early_batches(...).widen()). Started with
# their module instead, they kept both CPUs busy for 5 minutes at the end of the run, which then took
# 16 minutes on an Intel CI machine.
EARLY_BATCHES: dict[str, Callable[[list[pytest.Function], Path], list[BatchRun]]] = {}


@pytest.fixture(scope="session", autouse=True)
def early_batches(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, early_runs: BackgroundRuns
) -> Iterator[GatedRuns]:
    items = [item for item in request.session.items if isinstance(item, pytest.Function)]
    runs = GatedRuns(after=early_runs)
    with runs:
        for module, batch in EARLY_BATCHES.items():
            mine = [item for item in items if item.module.__name__ == module]
            if mine:
                for key, run, args in batch(mine, tmp_path_factory.mktemp(module.removeprefix("test_"))):
                    runs.submit(key, run, *args)
        yield runs


@pytest.fixture(scope="session")
def early_runs_done(early_runs: BackgroundRuns) -> None:
    """For tests that patch what a running early set-up uses (tests/vm/harness.py's functions)."""
    early_runs.wait()


def free_port() -> int:
    """A loopback TCP port free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def accept_backlog(port: int) -> int:
    """Connections the kernel has completed on the IPv4 listener of `port` that the server has not
    accept()ed yet (a listener's rx_queue in /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rpartition(":")[2], 16) == port and fields[3] == "0A":  # 0A: LISTEN
            return int(fields[4].partition(":")[2], 16)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


def distinct_free_ports(count: int) -> list[int]:
    """`count` different loopback ports free right now: free_port() twice can give one port twice, as the
    socket is closed before the next is asked for (about 1 in 5,000 triples; flaky-test review)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def openssl(*args: str | Path, cwd: Path) -> None:
    """Run the openssl CLI in `cwd` (the tests make their certificates with it)."""
    # env: the systemd VM's set-up makes its certificates from an early_runs thread (BackgroundRuns).
    subprocess.run([require_binary("openssl"), *map(str, args)], cwd=cwd, check=True, capture_output=True,
                   timeout=60, env=dict(os.environ))


def make_ca(name: str, cwd: Path) -> None:
    """A self-signed EC CA, `name`.crt and `name`.key in `cwd`."""
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=cwd,
    )


def make_leaf(name: str, ca: str, san: str, usage: str, cwd: Path) -> None:
    """`name`.crt and `name`.key in `cwd`, signed by the CA `ca` (make_ca), for `san` (e.g. "DNS:x") and the
    extended key usage `usage` (serverAuth or clientAuth)."""
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=cwd,
    )
    (cwd / f"{name}.ext").write_text(
        f"subjectAltName={san}\nextendedKeyUsage={usage}\nkeyUsage=critical,digitalSignature\n"
        "basicConstraints=CA:FALSE\nauthorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    )
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
        "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=cwd,
    )


def stable(exposition: str) -> str:
    """Exposition text without the run-dependent sample lines (HELP/TYPE lines stay)."""
    return "".join(
        line + "\n" for line in exposition.splitlines() if not line.startswith(VOLATILE_PREFIXES)
    )


def family_pattern(name: str) -> re.Pattern[str]:
    """A declared family's name as a pattern: `<counter>` (one metric per driver file) matches any."""
    return re.compile(re.escape(name).replace(re.escape("<counter>"), "[a-z0-9_]+"))


def samples(exposition: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of an exposition text."""
    result: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            result[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return result


def promtool_failures(*args: str, input: str | None = None, timeout: float = 60) -> list[str]:
    """`promtool ARGS` under each Prometheus line; for every line it failed under, the line's name and
    promtool's output."""
    failures = []
    for release in PROMETHEUS_RELEASES:
        result = subprocess.run([release.binary("promtool"), *args], input=input, capture_output=True, text=True,
                                timeout=timeout)  # fmt: skip
        if result.returncode != 0:
            failures.append(f"{release.name}: {result.stdout}{result.stderr}")
    return failures


def promtool_check_metrics(exposition: str) -> None:
    """`promtool check metrics` of both Prometheus lines: no lint finding, no parse error."""
    failures = promtool_failures("check", "metrics", input=exposition)
    assert not failures, "promtool check metrics:\n" + "\n".join(failures)


def copy_tree(source: Path, dest: Path) -> Path:
    """A writable copy of a fixture tree, symlinks preserved."""
    shutil.copytree(source, dest, symlinks=True)
    for root, dirs, files in os.walk(dest):
        for name in dirs + files:
            path = Path(root) / name
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


def write_files(root: Path, files: dict[str, str]) -> None:
    """Write `{relative path: content}` under root, creating directories: small hand-made sysfs trees."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def write_hwmon(function: Path, number: int, channels: dict[int, dict[str, str]]) -> Path:
    """mlx5's hwmon device `function/hwmon/hwmon<number>`, with the given temp<N>_* files per channel
    (values as the kernel prints them, millidegrees): a PCI function's temperature sensors."""
    directory = function / "hwmon" / f"hwmon{number}"
    directory.mkdir(parents=True)
    (directory / "name").write_text("mlx5\n")
    for channel, files in channels.items():
        for attribute, value in files.items():
            (directory / f"temp{channel}_{attribute}").write_text(f"{value}\n")
    return directory


def remove_device(sys_root: Path, device: str) -> None:
    """Unregister an RDMA device from a tree as the kernel does: its class link and its directory go."""
    link = sys_root / "class" / "infiniband" / device
    target = link.resolve()
    link.unlink()
    shutil.rmtree(target)


def symlink(root: Path, rel: str, target: str) -> None:
    """A relative symlink root/rel -> root/target, as kernfs links are (they survive copying the tree)."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(root / target, path.parent), path)


@pytest.fixture(autouse=True)
def root_log_level() -> Iterator[None]:
    """A reload sets the root logger's level; without this, later tests' caplog saw INFO records of other
    threads that a test left behind (flaky-test review)."""
    level = logging.getLogger().level
    yield
    logging.getLogger().setLevel(level)


@pytest.fixture
def captured_copy(tmp_path: Path) -> Iterator[callable]:  # type: ignore[valid-type]
    def make(tree: str) -> Path:
        return copy_tree(SYSFS_FIXTURES / tree / "sys", tmp_path / tree / "sys")

    yield make


def record_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The path of every file parse.reader reads from now on, once per read: each open, and each pread
    at offset 0 of a kept-open file (os.open/os.pread through a recording stand-in for its `os`)."""
    from rdma_exporter.parse import reader as reader_module

    reads: list[str] = []
    paths: dict[int, str] = {}

    def recording_open(path: str | os.PathLike[str], flags: int, *args: int) -> int:
        reads.append(os.fspath(path))
        fd = os.open(path, flags, *args)
        paths[fd] = os.fspath(path)
        return fd

    def recording_pread(fd: int, size: int, offset: int) -> bytes:
        if offset == 0:
            reads.append(paths.get(fd, f"<fd {fd}>"))
        return os.pread(fd, size, offset)

    fake = types.SimpleNamespace(**{n: getattr(os, n) for n in dir(os) if not n.startswith("__")})
    fake.open = recording_open
    fake.pread = recording_pread
    monkeypatch.setattr(reader_module, "os", fake)
    return reads


class RefusingReads:
    """The reader's `os`, except that reads of files whose path ends in one of `refused` fail with `code`
    (EINVAL: counters the firmware will not give); `attempts` counts those reads by suffix."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, code: int = errno.EINVAL, refused: Iterable[str] = ()) -> None:
        self.code = code
        self.refused: set[str] = set(refused)
        self.attempts: dict[str, int] = {}
        fake = types.SimpleNamespace(**{name: getattr(os, name) for name in dir(os) if not name.startswith("__")})
        fake.read = lambda fd, size: self._check(fd) or os.read(fd, size)
        fake.pread = lambda fd, size, offset: self._check(fd) or os.pread(fd, size, offset)
        from rdma_exporter.parse import reader as reader_module  # as record_reads does

        monkeypatch.setattr(reader_module, "os", fake)

    def _check(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        for suffix in self.refused:
            if path.endswith(suffix):
                self.attempts[suffix] = self.attempts.get(suffix, 0) + 1
                raise OSError(self.code, os.strerror(self.code))


def fake_fd_limits(monkeypatch: pytest.MonkeyPatch, soft: int, hard: int) -> list[int]:
    """RLIMIT_NOFILE as [soft, hard], which the test may change as `prlimit --pid` would; raising the soft
    limit above the hard one fails, as the kernel refuses it to an unprivileged process."""
    limits = [soft, hard]

    def setrlimit(which: int, pair: tuple[int, int]) -> None:
        if pair[0] > limits[1]:
            raise ValueError("not allowed to raise maximum limit")
        limits[0] = pair[0]

    monkeypatch.setattr(resource, "getrlimit", lambda which: tuple(limits))
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    return limits


def refuse_thread_starts(monkeypatch: pytest.MonkeyPatch, name: str, times: int) -> None:
    """The first `times` starts of threads named `name` fail as under TasksMax= ("can't start new thread")."""
    start = threading.Thread.start
    refusals = times

    def refusing(thread: threading.Thread) -> None:
        nonlocal refusals
        if thread.name == name and refusals:
            refusals -= 1
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refusing)


def refuse_reload_thread_starts(monkeypatch: pytest.MonkeyPatch, times: int) -> None:
    refuse_thread_starts(monkeypatch, "reload", times)


def fail_pread(monkeypatch: pytest.MonkeyPatch, code: int, on: Callable[[int], bool] = lambda fd: True) -> list[int]:
    """Make os.pread raise OSError(code) for the fds `on` picks (every one by default), as a failing sysfs
    attribute (EIO) or a removed kernfs node (ENODEV) does; the other reads go through. Returns the fd of
    every pread from now on, in order."""
    real_pread = os.pread
    reads: list[int] = []

    def pread(fd: int, size: int, offset: int) -> bytes:
        failing = on(fd)
        reads.append(fd)
        if failing:
            raise OSError(code, os.strerror(code))
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", pread)
    return reads


# --- timing under load ------------------------------------------------------------------------------


def run_delays(*pids: int) -> dict[tuple[int, str], int]:
    """{(pid, thread id): nanoseconds that thread has spent runnable but waiting for a CPU} (schedstat)."""
    delays: dict[tuple[int, str], int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):  # a process that just ended
            for task in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, IndexError, ValueError):  # a thread that just ended
                    delays[(pid, task)] = int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[1])
    return delays


@dataclass(frozen=True)
class Took:
    wall: float  # seconds from the request to the answer
    queued: float  # what the threads of the processes watched spent meanwhile waiting for a CPU, summed

    @property
    def scheduled(self) -> float:
        """Wall time less the waits for a CPU: what the deadline and the code decide, not the machine's load.
        Upper bounds use this; a lower bound (a deadline was waited for) uses `wall`."""
        return max(0.0, self.wall - self.queued)

    def __str__(self) -> str:
        return f"{self.wall:.2f} s ({self.queued:.2f} s waiting for a CPU)"


@contextlib.contextmanager
def timed(*pids: int) -> Iterator[list[Took]]:
    """Time the with block; its Took (appended on exit) counts the CPU waits of this process's threads and
    of those of `pids`. A thread that ends inside the block takes its waits with it: that errs strict."""
    took: list[Took] = []
    before = run_delays(os.getpid(), *pids)
    started = time.monotonic()
    yield took
    wall = time.monotonic() - started
    after = run_delays(os.getpid(), *pids)
    queued = sum(max(0, delay - before.get(task, 0)) for task, delay in after.items())
    took.append(Took(wall, queued / 1e9))
