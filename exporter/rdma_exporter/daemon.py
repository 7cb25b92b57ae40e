"""The daemon: the exporter's endpoints on the HTTP server (httpserver.py), signal handling, and the
wiring of config to the scrape engine.

Survives what a GPU node does to it: stuck firmware (the engine's deadlines), hotplug (hotplug.py),
idle, slow or hostile clients on the cluster network (httpserver.py's bounds), SIGHUP reloads with a bad
file (the running config is kept) and SIGTERM (in-flight requests finish, then exit 0).
"""

from __future__ import annotations

import ctypes
import html
import logging
import math
import os
import queue
import re
import resource
import signal
import socket
import threading
import time
import weakref
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache, partial
from pathlib import Path
from types import FrameType
from typing import Any, Final

from prometheus_client import CollectorRegistry

from . import __version__, take_early_sighup
from .collect.base import FamilySet, Source
from .collect.engine import RdmaCollector
from .collect.ethtool import EthtoolSource
from .collect.expected import ExpectedSource
from .collect.hwmon import HwmonSource
from .collect.infiniband import InfinibandSource
from .collect.inventory import DeviceFilter
from .collect.netdev import NetdevSource
from .collect.pcie import PcieSource
from .collect.process import ProcessMetrics
from .collect.readers import HARD_MAX_WORKERS, DeviceReads, WorkerPool
from .config import (
    MIN_DEADLINE_SECONDS,
    Config,
    ConfigError,
    empty_on_reload,
    exit_status,
    filters_matching_nothing,
    logging_level,
)
from .hotplug import HotplugMonitor, start_monitor
from .httpserver import MAX_CONNECTIONS, CountedWarning, HttpServer, Request, Response, text_response
from .parse.infiniband import CLASS_DIR
from .parse.reader import FileBudget
from .threadstart import RetriedStart
from .webconfig import FileState, WebConfig, load_web_config

log = logging.getLogger(__name__)


def build_sources(config: Config) -> list[Source]:
    """The enabled sources, in exposition order."""
    available: dict[str, Source] = {
        "infiniband": InfinibandSource(),
        "netdev": NetdevSource.from_settings(config.collector_settings.get("netdev", {})),
        "ethtool": EthtoolSource.from_settings(config.collector_settings.get("ethtool", {}), config.ethtool_dir),
        "pcie": PcieSource(),
        "hwmon": HwmonSource(),
    }
    expected = config.collector_settings.get("expected", {})
    if expected.get("ports"):
        # Without declared expectations there is nothing to export; skip it so that it adds no series.
        available["expected"] = ExpectedSource.from_settings(expected)
    return [source for name, source in available.items() if config.collectors.get(name, True)]


def build_collector(
    config: Config, *, reads: DeviceReads | None = None, rescan_each_scrape: bool = True
) -> RdmaCollector:
    """The collector `config` describes. `config.read_threads` and `config.max_open_files` size `reads`,
    which the Daemon builds once and passes to every collector it makes (a reload keeps its threads and
    kept files); without `reads`, as in tests and bench/microbench.py, the collector shares the process's
    default pool and file budget (collect.readers.shared_reads), and those two settings are not used."""
    return RdmaCollector(
        config.sysfs,
        build_sources(config),
        device_filter=DeviceFilter(config.device_include, config.device_exclude),
        settings={name: dict(values) for name, values in config.collector_settings.items()},
        scrape_timeout=config.scrape_timeout,
        reads=reads,
        rescan_each_scrape=rescan_each_scrape,
        sample_tree=config.sample_tree,
        boot_time=node_boot_time(),
    )


@cache
def node_boot_time() -> int:
    """When the node booted, in seconds since the epoch: the wall clock less the time since boot, as the
    kernel computes btime for /proc/stat. Not read from /proc/stat: the shipped unit's ProcSubset=pid
    hides it. Reboots change it; an exporter restart does not (by a second at most, which the rules
    allow for), unless the wall clock was stepped in between. Taken once per process, so that a reload
    after a step (chrony's first sync, say) does not pass for a reboot."""
    return int(time.time() - time.clock_gettime(time.CLOCK_BOOTTIME))


def build_registry(collector: RdmaCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


# --- the exporter's endpoints --------------------------------------------------------------------------

# Every Accept header gets the text format 0.0.4, as node_exporter does by default: Prometheus accepts it,
# and prometheus_client's OpenMetrics writer cost twice its text writer per scrape (bench/PROFILE.md).
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
# Time kept back from the X-Prometheus-Scrape-Timeout-Seconds budget to encode and send the answer.
SCRAPE_TIMEOUT_OFFSET: Final = 0.5
MIN_SCRAPE_TIMEOUT: Final = MIN_DEADLINE_SECONDS  # also the floor of the header's budget

_LANDING = """<!doctype html>
<html><head><title>rdma-exporter</title></head>
<body><h1>rdma-exporter {version}</h1>
<p>Prometheus exporter for InfiniBand and RoCE devices.</p>
<ul><li><a href="{path}">{path}</a>: metrics</li><li><a href="/healthz">/healthz</a>: liveness</li></ul>
</body></html>
"""


@dataclass(frozen=True)
class Serving:
    """Everything a request needs, replaced as a whole on reload so no request sees half of each."""

    config: Config
    collector: RdmaCollector
    web: WebConfig


_ZERO_QUALITY = re.compile(r"^q=0(\.0{0,3})?$")


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether the client takes gzip: named with a quality above 0 (RFC 9110 12.5.3: `gzip;q=0` refuses
    it). Like Prometheus' own exporters, `*` is not taken for gzip."""
    qualities: dict[str, bool] = {}
    for item in accept_encoding.split(","):
        coding, *params = (part.strip().lower() for part in item.split(";"))
        if coding:
            qualities[coding] = not any(_ZERO_QUALITY.match(param.replace(" ", "")) for param in params)
    return qualities.get("gzip", False) or qualities.get("x-gzip", False)


def header_timeout(header: str | None) -> float:
    """Prometheus's own scrape timeout from its header; infinite without one, or with junk."""
    try:
        value = float(header) if header else math.inf
    except ValueError:
        return math.inf
    return value if math.isfinite(value) and value > 0 else math.inf


def scrape_timeout(config: Config, header: str | None, waited: float = 0.0) -> float:
    """The configured deadline, shortened to Prometheus's own timeout (minus an offset) when that is less,
    less the `waited` seconds the request spent queued before a worker took it up: a scrape that waited
    for a worker or behind password checks, then for a stuck device, outlived Prometheus's timeout and
    was lost whole, where what the deadline had read would have come back in time (daemon review)."""
    timeout = min(config.scrape_timeout, header_timeout(header) - SCRAPE_TIMEOUT_OFFSET)
    return max(timeout - max(waited, 0.0), MIN_SCRAPE_TIMEOUT)


# zlib level for gzipped answers. The exposition is repetitive text that compresses well at any level:
# the sample tree's 177 KB answer gives 21.3 KB at level 1 and 18.3 KB at the default level 6, which
# takes two to three times as long (0.77 against 1.69 ms when measured on a quiet machine, PROFILE.md).
# Every scrape by a Prometheus server asks for gzip.
GZIP_LEVEL: Final = 1


def gzip_chunks(chunks: tuple[bytes, ...]) -> bytes:
    """One gzip member of the chunks, compressed as they come (no joined copy of the plain text)."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # wbits 31: gzip header and trailer
    return b"".join([*(compressor.compress(chunk) for chunk in chunks), compressor.flush()])


class Exporter:
    """Routes requests: the metrics path, `/` and `/healthz`; everything else is 404."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving
        self.process = ProcessMetrics(node_boot_time())
        # Scrapes that shared one collection get the same FamilySet: encode (and gzip) it once. Only a weak
        # reference: the bodies must not keep a finished scrape's rows alive into the next scrape.
        self._encoded: tuple[weakref.ref[FamilySet] | None, dict[bool, bytes | tuple[bytes, ...]]] = (None, {})
        # Reentrant: dereferencing the weak reference under the lock can free the FamilySet right there,
        # which runs _forget on this very thread.
        self._encoded_lock = threading.RLock()
        # A Prometheus with the wrong password, or none, sees only its target down: say so here too.
        self.refused_passwords = CountedWarning(log)
        self.refused_anonymous = CountedWarning(log)

    def _forget(self, gone: weakref.ref[FamilySet]) -> None:
        # The collection was freed (the last answer made from it is sent): drop its encoded bodies with it.
        with self._encoded_lock:
            if self._encoded[0] is gone:
                self._encoded = (None, {})

    def costly(self, request: Request) -> bool:
        """Whether answering `request` starts with a bcrypt check (a login not remembered yet)."""
        auth = self.serving.web.auth
        return auth is not None and auth.needs_bcrypt(request.headers.get("authorization"))

    def handle(self, request: Request) -> Response:
        serving = self.serving  # one read: a reload during this request does not mix configs
        auth = serving.web.auth
        if auth is not None and not auth.check(credentials := request.headers.get("authorization")):
            agent = request.headers.get("user-agent", "")
            if credentials is not None:
                self.refused_passwords.add(
                    "%d request(s) refused with 401 since the last such line: unknown user or wrong password "
                    "(the last from %s)",
                    request.peer,
                )
            elif request.path == serving.config.telemetry_path and not agent.startswith("Mozilla/"):
                # A scraper without basic_auth; not a browser's first request (it asks for the login form),
                # nor a liveness probe of /healthz, which gets no credentials (deploy/kubernetes-tls).
                self.refused_anonymous.add(
                    "%d request(s) without credentials refused with 401 since the last such line: the client "
                    "sends no basic auth (the last from %s, user agent %r)",
                    request.peer, agent[:80],
                )
            return text_response(401, "unauthorized", headers=[("WWW-Authenticate", 'Basic realm="rdma-exporter"')])
        if request.method not in ("GET", "HEAD"):
            return text_response(405, "method not allowed", headers=[("Allow", "GET, HEAD")])
        path = request.path
        if path == serving.config.telemetry_path:
            return self.metrics(serving, request)
        if path == "/":
            page = _LANDING.format(version=__version__, path=html.escape(serving.config.telemetry_path))
            return Response(200, page.encode(), "text/html; charset=utf-8")
        if path == "/healthz":
            return text_response(200, "ok")  # liveness only: it does not scrape
        return text_response(404, "not found")

    def _bodies_of(self, families: FamilySet) -> dict[bool, bytes | tuple[bytes, ...]]:
        """The encoded bodies of `families`, a new empty record if they are not the ones cached (under
        _encoded_lock)."""
        cached_for = self._encoded[0]
        if cached_for is None or cached_for() is not families:
            self._encoded = (weakref.ref(families, self._forget), {})
        return self._encoded[1]

    def metrics(self, serving: Serving, request: Request) -> Response:
        header = request.headers.get("x-prometheus-scrape-timeout-seconds")
        waited = time.monotonic() - request.received
        if waited >= header_timeout(header):
            # Its Prometheus has given up already: a round of the floor's 0.1 s would only count timeouts
            # for every healthy device not read by then, and cut the reads the next scrape needs (review).
            return text_response(503, f"the scrape waited {waited:.1f} s for a worker, past its timeout\n")
        timeout = scrape_timeout(serving.config, header, waited)
        families = serving.collector.gather(timeout)
        compress = accepts_gzip(request.headers.get("accept-encoding", ""))
        with self._encoded_lock:
            bodies = self._bodies_of(families)
            body, plain = bodies.get(compress), bodies.get(False)
        if body is None:
            # The plain text is rendered once per round, process_* series included, and every encoding of
            # the round is made from the text stored first, so that they all say the same.
            if not isinstance(plain, tuple):
                rendered = (*families.render_chunks(), *self.process.families().render_chunks())
                with self._encoded_lock:
                    plain = self._bodies_of(families).setdefault(False, rendered)
            assert isinstance(plain, tuple)
            body = gzip_chunks(plain) if compress else plain
            if compress:
                with self._encoded_lock:
                    self._bodies_of(families)[True] = body
        headers = [("Vary", "Accept-Encoding")]
        if compress:
            headers.append(("Content-Encoding", "gzip"))
        return Response(200, body, CONTENT_TYPE, headers, made_from=families)


# --- process: start-up, reload, shutdown ---------------------------------------------------------------


def parse_listen(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "", int(port)


def sd_notify(state: str, *, warn: bool = True) -> bool:
    """Tell systemd (Type=notify) about readiness, reloads and stopping; a no-op elsewhere. False if the
    notification could not be sent."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return True
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(state.encode(), address)
    except OSError as exc:
        # Otherwise the journal only says "start operation timed out" (AF_UNIX missing from the unit's
        # RestrictAddressFamilies=, or a socket path this process cannot reach).
        if warn:
            log.warning("cannot notify systemd of %s at %s: %s", state.split("\n", 1)[0], path, exc)
        return False
    return True


# How often the web config file and its TLS files are compared with what was loaded: a few stat calls, on
# a thread of their own.
WEB_FILES_CHECK_SECONDS: Final = 5.0
# A reload for changed web config files that was rejected is tried again after this long while they stay
# changed: the main config file may have been the one at fault, and a new certificate must not wait for a
# signal.
WEB_RELOAD_RETRY_SECONDS: Final = 300.0


# How long the exit waits, after the HTTP server's own grace, for a reload that is still running: a daemon
# thread inside bcrypt when the interpreter exits aborts the process (SIGABRT, a failed stop for systemd).
# The unit's TimeoutStopSec=20s covers the grace (scrape deadline + 2 s) and this.
RELOAD_STOP_WAIT_SECONDS: Final = 5.0


class ReloadRequests:
    """The reloads SIGHUP asks for, run one at a time on one thread that lives as long as the server.

    The signal handler only queues: SimpleQueue.put is reentrant, so a second SIGHUP may interrupt the
    first put. Starting a thread per signal (as before) failed with RuntimeError once the unit's TasksMax
    was reached, and that error left the handler through the server loop and ended the process; a burst of
    signals also left one thread each waiting on the reload lock. Requests that come while a reload runs
    are answered by one more reload, which reads the files as they are by then.
    """

    def __init__(self, reload: Callable[[], object]) -> None:
        self._reload = reload
        self._requests: queue.SimpleQueue[bool] = queue.SimpleQueue()  # True: reload; False: stop
        self._thread: threading.Thread | None = None
        self._starts = RetriedStart(log, "cannot start the reload thread (%s); reloads wait until it starts",
                                    "reload thread started")  # fmt: skip
        # Set by stop(): no thread starts again, and a reload still running gives up (load_web_config).
        self.stopping = threading.Event()

    def request(self) -> None:
        self._requests.put(True)

    def ensure_running(self) -> None:
        """Start the thread if it is not running: at serve() and at each tick of the server loop, so a
        start that failed (out of tasks) is tried again, and queued requests wait for it."""
        if self.stopping.is_set() or (self._thread is not None and self._thread.is_alive()):
            return
        thread = threading.Thread(target=self._run, name="reload", daemon=True)
        if self._starts.start(thread):
            self._thread = thread

    def _run(self) -> None:
        while self._requests.get():
            while True:  # the requests queued meanwhile: one reload answers them all
                try:
                    if not self._requests.get_nowait():
                        return
                except queue.Empty:
                    break
            try:
                self._reload()
            except Exception:  # the thread must outlive a reload that fails in a way nobody foresaw
                log.exception("reload failed")

    def stop(self) -> None:
        """Run no queued reload, start no thread again, and end a running reload early."""
        self.stopping.set()
        self._requests.put(False)


class Watchdog:
    """systemd's watchdog (WatchdogSec=): WATCHDOG=1 at half its interval, sent from the HTTP server's loop,
    so a loop that stopped turning (a deadlock) gets the process killed and restarted. Device reads stuck
    in the kernel run on other threads and do not stop it, and a restart could not end them."""

    def __init__(self, interval: float | None) -> None:
        self.interval = interval
        self._next = 0.0
        self._failing = False

    @classmethod
    def from_environment(cls) -> Watchdog:
        usec, pid = os.environ.get("WATCHDOG_USEC", ""), os.environ.get("WATCHDOG_PID", "")
        if not usec or (pid and pid != str(os.getpid())):  # not asked, or asked of another process
            return cls(None)
        if not usec.isascii() or not usec.isdigit() or int(usec) == 0:
            log.warning("WATCHDOG_USEC=%r is not a number of microseconds: no watchdog notifications", usec)
            return cls(None)
        return cls(int(usec) / 2e6)

    def tick(self, now: float) -> None:
        if self.interval is None or now < self._next:
            return
        self._next = now + self.interval
        sent = sd_notify("WATCHDOG=1", warn=not self._failing)  # one warning, not one per interval
        if sent and self._failing:
            log.info("systemd watchdog notifications are getting through again")
        self._failing = not sent


# A scrape of many devices allocates and frees megabytes; glibc keeps freed pages mapped in its arenas,
# so resident memory would settle near the sum of the scrapes' peaks. Returning them after each large
# answer (malloc_trim, a few hundred microseconds, after the answer is sent) keeps RSS near the live set.
TRIM_AFTER_BYTES: Final = 256 * 1024


def _glibc(name: str, *argtypes: type[Any]) -> Any | None:
    """The C library's function `name` returning int, or None where there is none (musl, other platforms)."""
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function


_MALLOC_TRIM = _glibc("malloc_trim", ctypes.c_size_t)
_TRIM: Callable[[], object] | None = None if _MALLOC_TRIM is None else partial(_MALLOC_TRIM, 0)


def release_memory(response: Response) -> None:
    if _TRIM is not None and response.length >= TRIM_AFTER_BYTES:
        _TRIM()


# glibc serves a block of 128 KB or more from its own mmap, but once such a block is freed it raises that
# threshold to the block's size (up to 32 MB). From then on a scrape's answer and family texts come from
# the heap, and resident memory depends on where they land: it flipped by about 0.6 MB from one scrape to
# the next (bench/RESULTS.md), which hid any real growth. A fixed threshold keeps those short-lived
# blocks in mappings of their own, returned to the kernel when they are freed.
M_MMAP_THRESHOLD: Final = -3
MMAP_THRESHOLD_BYTES: Final = 128 * 1024


def fix_mmap_threshold() -> bool:
    """Pin glibc's mmap threshold; False where the operator set it or there is no glibc mallopt."""
    return _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES, "MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold")


# glibc gives each new thread a malloc arena of its own (up to 8 per CPU). Under the GIL threads rarely
# malloc at the same moment, so more arenas buy no speed (A/B: 6.59 vs 6.54 ms a scrape), but each keeps
# free pages of its own: with two, resident memory moved by +-0.15 MB from one scrape to the next as a
# scrape's blocks landed in one or the other, and sat 0.4 MB higher than with one (bench/PROFILE.md).
M_ARENA_MAX: Final = -8


def use_one_malloc_arena() -> bool:
    """Make every thread created from now on share the main malloc arena; False where the operator set
    the arena count or there is no glibc mallopt."""
    return _mallopt(M_ARENA_MAX, 1, "MALLOC_ARENA_MAX", "glibc.malloc.arena_max")


def _mallopt(param: int, value: int, variable: str, tunable: str) -> bool:
    if variable in os.environ or tunable in os.environ.get("GLIBC_TUNABLES", ""):
        return False  # the operator's own setting
    mallopt = _glibc("mallopt", ctypes.c_int, ctypes.c_int)
    return mallopt is not None and bool(mallopt(param, value))


# File descriptors besides connections and kept files: one being opened by each possible reader thread,
# and the listener, epoll, wake pipe, udev monitor, stdio and log handlers.
OWN_FDS: Final = HARD_MAX_WORKERS + 64
# Kept free for every connection and those.
FD_RESERVE: Final = MAX_CONNECTIONS + OWN_FDS
# Taken as the soft open-file limit when it cannot be read: systemd's default.
ASSUMED_FD_LIMIT: Final = 1024


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard limit to fit `wanted` kept files plus a reserve;
    return how many files may be kept open (systemd's default soft limit is 1024, the hard one 512K)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except OSError as exc:  # a seccomp filter that refuses prlimit64 (old systemd @resources)
        log.warning("cannot read the open-file limit (%s): assuming %d", exc, ASSUMED_FD_LIMIT)
        return max(0, min(wanted, ASSUMED_FD_LIMIT - FD_RESERVE))
    need = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit to %d: %s", target, exc)
    room = wanted if soft == resource.RLIM_INFINITY else max(0, min(wanted, soft - FD_RESERVE))
    if room < wanted:
        log.warning("open-file limit %d: keeping %d sysfs files open instead of %d", soft, room, wanted)
    return room


def connection_cap() -> int:
    """How many connections the open-file limit leaves room for: MAX_CONNECTIONS, or under a limit below
    FD_RESERVE that could not be raised, what is left after the daemon's own descriptors. With the full
    cap there, descriptors ran out before the cap was reached, so no connection was ever made room for,
    and one client holding idle connections locked every other out."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except OSError:
        soft = ASSUMED_FD_LIMIT
    if soft == resource.RLIM_INFINITY or soft >= FD_RESERVE:
        return MAX_CONNECTIONS
    cap = max(1, soft - OWN_FDS)
    log.warning("open-file limit %d: at most %d connections at a time instead of %d", soft, cap, MAX_CONNECTIONS)
    return cap


def warn_of_filters_matching_nothing(config: Config) -> None:
    for note in filters_matching_nothing(config):
        log.warning("%s", note)


class Daemon:
    """The running exporter: server, current collector, hotplug monitor and signal handling."""

    def __init__(
        self, config: Config, reload: Callable[[], Config] | None = None, web: WebConfig | None = None
    ) -> None:
        self._reload_source = reload
        self._reload_lock = threading.Lock()
        self.reloads = ReloadRequests(self.reload)
        self._watchdog = Watchdog.from_environment()
        self._next_files_check = 0.0
        self._files_checker: threading.Thread | None = None
        self._files_check_starts = RetriedStart(
            log, f"cannot start the web config file check (%s); retrying every {WEB_FILES_CHECK_SECONDS:g} s",
            "web config file check started again")  # fmt: skip
        # The web config files' states a reload was last started for, and when (monotonic).
        self._files_tried: tuple[tuple[FileState, ...], float] = ((), -math.inf)
        budget = FileBudget(raise_fd_limit(config.max_open_files))
        self.reads = DeviceReads(WorkerPool(parallelism=config.read_threads), budget)
        if web is None:  # cli.main hands over the web config it checked
            web = load_web_config(config.web_config_file)
        collector = build_collector(config, reads=self.reads)
        # The collector new rounds start on: the serving one, or during a reload the one replacing it
        # (RdmaCollector.retire). Uevents go to its inventory, the one that lists for those rounds.
        self.newest = collector
        self.exporter = Exporter(Serving(config, collector, web))
        hotplug, mode = start_monitor(config.sysfs, lambda: self.newest.inventory)
        self.hotplug: HotplugMonitor | None = hotplug
        collector.inventory.rescan_each_scrape = hotplug is None
        # Then `failed` (not `running`): a monitor that failed before the line above had switched this
        # inventory already, and one that fails after it switches it itself (HotplugMonitor._fall_back).
        if hotplug is not None and hotplug.failed:
            collector.inventory.rescan_each_scrape = True
        self.server = HttpServer(
            parse_listen(config.listen_address),
            self.exporter.handle,
            tls=lambda: self.exporter.serving.web.ssl_context,
            after_response=release_memory,
            peer_allowed=lambda cert: self.exporter.serving.web.peer_allowed(cert),
            headers=lambda: self.exporter.serving.web.headers,
            costly=self.exporter.costly,
            tick=self._tick,
            max_connections=connection_cap(),
        )
        log.info(
            "rdma-exporter %s listening on %s (%s), metrics at %s, sysfs %s, scrape deadline %.1f s, config "
            "file %s, web config file %s",
            __version__,
            config.listen_address,
            web.describe(),
            config.telemetry_path,
            Path(config.sysfs),
            config.scrape_timeout,
            config.config_file or "none",
            config.web_config_file or "none",
        )
        log.info("device discovery: %s", mode)
        warn_of_filters_matching_nothing(config)
        class_dir = config.sysfs / CLASS_DIR
        if not os.path.isdir(class_dir):  # not Path.is_dir(): it raises on EACCES (review)
            log.warning("no %s: no RDMA devices to export (RDMA modules not loaded?)", class_dir)

    def _tick(self, now: float) -> None:
        """Each quarter second on the HTTP server's loop thread: the watchdog, the reload thread, and the
        web config files."""
        self._watchdog.tick(now)
        self.reloads.ensure_running()
        if now >= self._next_files_check and self.exporter.serving.web.watched_files:
            self._next_files_check = now + WEB_FILES_CHECK_SECONDS
            # Not on this thread: a stat on a hung file system (an NFS-mounted /etc) would stop every
            # answer and the watchdog. A check still blocked is not joined by another.
            checker = self._files_checker
            if checker is None or not checker.is_alive():
                checker = threading.Thread(
                    target=self._check_web_files, args=(now,), name="web-files-check", daemon=True
                )
                self._files_checker = checker
                self._files_check_starts.start(checker)  # out of tasks, the next check tries again

    def _check_web_files(self, now: float) -> None:
        """Reload once the web config file, or the certificate, key or client CA it names, differ from
        what was loaded. cert-manager renews a certificate into its Secret and the kubelet swaps the
        mounted files, and nobody sends a SIGHUP into a pod: served until a restart, the old certificate
        would expire on every node at once. A user removed from the file is refused from the next check
        on, as exporter-toolkit, which reads the file for every request, refuses them at once.
        Runs on the web-files-check thread (_tick), which also does the reload: no check starts meanwhile."""
        web = self.exporter.serving.web
        states = web.watched_file_states()  # each file stat'ed once a check
        changed = web.watched_files_changed(states)
        if not changed or self._reload_source is None:
            return
        tried, when = self._files_tried
        if states == tried and now - when < WEB_RELOAD_RETRY_SECONDS:
            return  # a reload for these files was rejected (logged): not again at once
        self._files_tried = states, now
        log.info("web config files changed (%s): reloading the web config", ", ".join(str(path) for path in changed))
        self.reload(web_only=True)

    def reload(self, *, web_only: bool = False) -> bool:
        """Re-read the config (and web config) file, or with `web_only` the web config file alone;
        anything invalid keeps the running config."""
        if self._reload_source is None:
            log.warning("SIGHUP: nothing to reload (started without a config source)")
            return False
        with self._reload_lock:
            sd_notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
            try:
                return self._reload_web() if web_only else self._reload()
            finally:
                sd_notify("READY=1")

    def _load_web(self, path: Path | None, old: WebConfig) -> WebConfig:
        """The web config a reload takes (ConfigError if none), with what it can keep of the running one."""
        web = load_web_config(path, self.reloads.stopping)  # the TLS check's reloads too
        # A file that config management has truncated and not yet written: taking it would drop every
        # setting of the running web config, TLS and users among them. Without settings to lose (no web
        # config file, or an empty one) an empty file is the defaults, as at start-up.
        if web.empty and old.source and not old.empty:
            raise ConfigError(web.source, "(file)", empty_on_reload(old.source))
        if web.auth is not None and old.auth is not None:
            web.auth.remember_from(old.auth)  # no bcrypt wait for Prometheus after a reload
        if web.same_tls(old):
            # The same context: connections kept alive under it stay open (HttpServer closes those of a
            # replaced one), so a reload for the log level costs Prometheus no new handshake.
            web.ssl_context = old.ssl_context
        return web

    def _warn_of_dropped_protections(self, old: WebConfig, web: WebConfig) -> None:
        dropped = old.protections() - web.protections()
        if dropped:
            # Taken, as the file says, but not in silence: an edit that lost a section opens the port.
            log.warning(
                "reload: %s no longer asks for %s; served without from now on",
                web.source or "the configuration (no web config file)", ", ".join(sorted(dropped)),
            )

    def _reload_web(self) -> bool:
        """For a changed web config file or renewed TLS files: the web config file only. The main config
        file may be mid-edit, and a certificate renewal must neither take that edit nor wait for it."""
        old = self.exporter.serving
        try:
            web = self._load_web(old.config.web_config_file, old.web)
        except ConfigError as exc:
            log.error("web config reload rejected, keeping the running one: %s", exc)
            return False
        except Exception:
            log.exception("web config reload failed, keeping the running one")
            return False
        self._warn_of_dropped_protections(old.web, web)
        self.exporter.serving = replace(old, web=web)
        log.info("reloaded %s (%s)", web.source, web.describe())
        return True

    def _reload(self) -> bool:
        assert self._reload_source is not None
        old = self.exporter.serving
        try:
            config = self._reload_source()
            # The socket and the uevent monitor are bound at start-up. Said once the reload is taken: an
            # emptied file, refused below, would otherwise announce the defaults as coming.
            bound = [
                (name, getattr(config, name))
                for name in ("listen_address", "sysfs")
                if getattr(config, name) != getattr(old.config, name)
            ]
            config = replace(config, **{name: getattr(old.config, name) for name, _ in bound})
            # A file that config management has truncated and not yet written: taking it would drop every
            # setting in it. One that was empty already is fine.
            if config.config_file_empty and not old.config.config_file_empty:
                raise ConfigError(str(config.config_file), "(file)", empty_on_reload(str(config.config_file)))
            web = self._load_web(config.web_config_file, old.web)
            udev = self.hotplug is not None and not self.hotplug.failed
            collector = build_collector(config, reads=self.reads, rescan_each_scrape=not udev)
        except ConfigError as exc:
            log.error("reload rejected, keeping the running configuration: %s", exc)
            return False
        except Exception:
            log.exception("reload failed, keeping the running configuration")
            return False
        for name, value in bound:
            log.warning("reload: %s changed to %s; restart to apply it", name, value)
        self._warn_of_dropped_protections(old.web, web)
        logging.getLogger().setLevel(logging_level(config.log_level))
        # The pool is shared across reloads; surplus threads exit as they finish their jobs.
        self.reads.pool.parallelism = config.read_threads
        # A lowered cap takes effect at each device's next read (OpenFiles.begin closes files over it).
        self.reads.budget.limit = raise_fd_limit(config.max_open_files)
        self.server.max_connections = connection_cap()  # the limit may have been raised just now
        self.newest = collector
        old.collector.retire(lambda: self.newest)  # a scrape in flight ends on the collector that started it
        self.exporter.serving = Serving(config, collector, web)
        if udev and self.hotplug.failed:  # type: ignore[union-attr]
            # The monitor failed after it was asked above: its fallback may have gone to the old collector.
            collector.inventory.rescan_each_scrape = True
        log.info("reloaded %s (%s)", config.config_file or "configuration", web.describe())
        warn_of_filters_matching_nothing(config)
        return True

    def serve(self) -> int:
        def on_term(signum: int, frame: FrameType | None) -> None:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            sd_notify("STOPPING=1")
            self.server.stop()

        def on_hup(signum: int, frame: FrameType | None) -> None:
            log.info("received SIGHUP, reloading")
            self.reloads.request()

        def on_unused(signum: int, frame: FrameType | None) -> None:
            # Their default action ends the process, without a line: a `kill -USR1` meant for log
            # rotation (as nginx takes it) would leave the node without an exporter until a restart.
            log.warning("received %s, which the exporter does not use: ignored", signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGHUP, on_hup)
        signal.signal(signal.SIGUSR1, on_unused)
        signal.signal(signal.SIGUSR2, on_unused)
        self.reloads.ensure_running()
        sd_notify("READY=1")
        if take_early_sighup():  # sent while starting: the files may have changed since they were read
            on_hup(signal.SIGHUP, None)
        try:
            self.server.serve_forever()
        finally:
            self.reloads.stop()
            if self.hotplug is not None:
                self.hotplug.stop()
        # Requests being answered may finish (a scrape takes at most its deadline); reads blocked in the
        # kernel are daemon threads and do not hold the exit.
        self.server.shutdown(grace=self.exporter.serving.config.scrape_timeout + 2.0)
        # A reload still running (SIGHUP's, or the TLS check's) is waited for, and none starts after.
        if not self._reload_lock.acquire(timeout=RELOAD_STOP_WAIT_SECONDS):
            log.warning("a reload is still running after %.0f s; stopping without it", RELOAD_STOP_WAIT_SECONDS)
        log.info("stopped")
        return 0


def run(config: Config, reload: Callable[[], Config] | None = None, web: WebConfig | None = None) -> int:
    fix_mmap_threshold()  # before the first scrape allocates anything large
    use_one_malloc_arena()  # before the first thread starts
    try:
        daemon = Daemon(config, reload, web)
    except ConfigError as exc:
        log.error("invalid web configuration: %s", exc)
        return exit_status(exc)
    except OSError as exc:
        log.error("cannot listen on %s: %s", config.listen_address, exc)
        return 1
    return daemon.serve()
