"""The daemon: HTTP endpoint, signal handling, wiring of config to the scrape engine.

Survives what a GPU node does to it: stuck firmware (the engine's deadlines), hotplug (hotplug.py),
idle, slow or hostile clients on the cluster network (the bounded server below), SIGHUP reloads with a
bad file (the running config is kept) and SIGTERM (in-flight requests finish, then exit 0).
"""

from __future__ import annotations

import contextlib
import ctypes
import html
import ipaddress
import logging
import math
import os
import queue
import re
import resource
import selectors
import signal
import socket
import ssl
import threading
import time
import weakref
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, Final, Generic, TypeVar

from prometheus_client import CollectorRegistry

from . import __version__
from .collect.base import FamilySet, Source
from .collect.engine import HARD_MAX_WORKERS, DeviceFilter, DeviceReads, RdmaCollector, WorkerPool
from .collect.ethtool import EthtoolSource
from .collect.expected import ExpectedSource
from .collect.infiniband import InfinibandSource
from .collect.netdev import NetdevSource
from .collect.pcie import PcieSource
from .config import Config, ConfigError
from .hotplug import HotplugMonitor, start_monitor
from .parse.infiniband import CLASS_DIR
from .parse.reader import FileBudget
from .webconfig import WebConfig, load_web_config

log = logging.getLogger(__name__)


def build_sources(config: Config) -> list[Source]:
    """The enabled sources, in exposition order."""
    available: dict[str, Source] = {
        "infiniband": InfinibandSource(),
        "netdev": NetdevSource(),
        "ethtool": EthtoolSource.from_settings(config.collector_settings.get("ethtool", {}), config.ethtool_dir),
        "pcie": PcieSource(),
    }
    expected = config.collector_settings.get("expected", {})
    if expected.get("ports"):
        # Without declared expectations there is nothing to export; skip it so that it adds no series.
        available["expected"] = ExpectedSource.from_settings(expected)
    return [source for name, source in available.items() if config.collectors.get(name, True)]


def build_collector(
    config: Config, *, reads: DeviceReads | None = None, rescan_each_scrape: bool = True
) -> RdmaCollector:
    return RdmaCollector(
        config.sysfs,
        build_sources(config),
        device_filter=DeviceFilter(config.device_include, config.device_exclude),
        settings={name: dict(values) for name, values in config.collector_settings.items()},
        scrape_timeout=config.scrape_timeout,
        reads=reads,
        rescan_each_scrape=rescan_each_scrape,
        sample_tree=config.sample_tree,
    )


def build_registry(collector: RdmaCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


# --- HTTP ---------------------------------------------------------------------------------------------
#
# A small HTTP/1.1 server instead of http.server: there a connection owns a thread from accept to close,
# so a few hundred idle or trickling clients take every thread. Here one loop thread holds every
# connection that is idle, in its TLS handshake or still sending its request head; only a complete
# request goes to one of a fixed number of worker threads.

MAX_REQUEST_LINE: Final = 8192
MAX_REQUEST_HEAD: Final = 16384
MAX_HEADERS: Final = 64
IDLE_TIMEOUT: Final = 90.0  # longer than a 60 s scrape interval, so Prometheus keeps its connection
HEAD_TIMEOUT: Final = 10.0  # from the first byte (or the TCP accept, with TLS) to the end of the head
WRITE_TIMEOUT: Final = 30.0
HTTP_WORKERS: Final = 16
MAX_CONNECTIONS: Final = 512
# After accept() fails (EMFILE: out of fds), the listener is not watched for this long.
ACCEPT_PAUSE: Final = 0.5
# Every Accept header gets the text format 0.0.4, as node_exporter does by default: Prometheus accepts it,
# and prometheus_client's OpenMetrics writer cost twice its text writer per scrape (bench/PROFILE.md).
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
# Time kept back from the X-Prometheus-Scrape-Timeout-Seconds budget to encode and send the answer.
SCRAPE_TIMEOUT_OFFSET: Final = 0.5
MIN_SCRAPE_TIMEOUT: Final = 0.1

_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
_TOKEN: Final = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_ABSOLUTE_FORM: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*")


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]  # lower-case names
    peer: str = ""

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens


@dataclass
class Response:
    status: int
    # A scrape's body is one chunk per metric family, sent in blocks of SEND_BLOCK_BYTES: joining the
    # whole of it would hold a second copy of a multi-megabyte answer.
    body: bytes | tuple[bytes, ...] = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)
    close: bool = False

    @property
    def parts(self) -> tuple[bytes, ...]:
        return self.body if isinstance(self.body, tuple) else (self.body,)

    @property
    def length(self) -> int:
        return sum(len(part) for part in self.parts)


def text_response(status: int, message: str, **kwargs: Any) -> Response:
    return Response(status, (message + "\n").encode(), **kwargs)


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# The blank line that ends a head, whichever of CRLF and a bare LF each of its two line ends uses
# (RFC 9112 2.2 lets a server take a bare LF as a line terminator).
_HEAD_END: Final = re.compile(rb"\r?\n\r?\n")


def _leading_empty_line(buffer: bytes | bytearray) -> int:
    """Length of an empty line before the request line, which RFC 9112 2.2 says to skip."""
    return 2 if buffer.startswith(b"\r\n") else 1 if buffer.startswith(b"\n") else 0


def head_end(buffer: bytes | bytearray, searched: int = 0) -> int:
    """Index just past the blank line that ends a request head, or -1.

    `searched`: how many leading bytes an earlier call found no end in. The search resumes 3 bytes before
    them (a blank line is at most 4 bytes), so a head trickled in byte by byte costs linear time, not
    a rescan of up to MAX_REQUEST_HEAD bytes per byte on the loop thread that every connection shares.
    """
    found = _HEAD_END.search(buffer, max(_leading_empty_line(buffer), searched - 3))
    return found.end() if found else -1


def parse_head(head: bytes) -> Request:
    """A GET-style request head (no body); BadRequest names the status to answer with."""
    lines = head[_leading_empty_line(head) :].decode("latin-1").split("\n")
    request_line = lines[0].rstrip("\r")
    if len(request_line) > MAX_REQUEST_LINE:
        raise BadRequest(414, "request line too long")
    parts = request_line.split(" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[1]:
        raise BadRequest(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(505, "only HTTP/1.0 and HTTP/1.1 are supported")
    if _ABSOLUTE_FORM.match(target):
        # RFC 9112 3.2.2: a server must accept the absolute form (as a proxy sends it); the path is ours.
        target = _ABSOLUTE_FORM.sub("", target, count=1) or "/"
        if not target.startswith(("/", "?")):
            raise BadRequest(400, "malformed request target")
        target = "/" + target if target.startswith("?") else target
    headers: dict[str, str] = {}
    count = 0
    for raw in lines[1:]:
        line = raw.rstrip("\r")
        if not line:
            continue
        count += 1
        if count > MAX_HEADERS:
            raise BadRequest(431, "too many header fields")
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name):
            raise BadRequest(400, "malformed header field")
        key = name.lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    if "transfer-encoding" in headers:
        raise BadRequest(400, "request bodies are not accepted")
    # A repeated Content-Length with one value throughout is that value (RFC 9110 8.6).
    lengths = {value.strip() for value in headers.get("content-length", "0").split(",")}
    length = lengths.pop() if len(lengths) == 1 else ""
    if not (length.isascii() and length.isdigit()):
        raise BadRequest(400, "malformed Content-Length")
    # Compared as text: int() refuses more than 4300 digits with a ValueError, which is no BadRequest.
    if length.lstrip("0"):
        raise BadRequest(413, "request bodies are not accepted")
    return Request(method, target, version, headers)


def render_response(response: Response, *, head_only: bool, keep_alive: bool, extra: Mapping[str, str]) -> bytes:
    lines = [
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Status')}",
        f"Server: rdma-exporter/{__version__}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {response.length}",
        "Connection: " + ("keep-alive" if keep_alive else "close"),
    ]
    lines += [f"{name}: {value}" for name, value in response.headers]
    lines += [f"{name}: {value}" for name, value in extra.items()]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + b"".join(response.parts)


# Sent in blocks of about this size: a send (and its timeout poll) per family chunk cost more than the
# scrape's file reads, and joining the whole body would copy a multi-megabyte answer once more.
SEND_BLOCK_BYTES: Final = 256 * 1024
# Answers that the client does not read fast enough are finished by the loop thread, so a client that
# stops reading cannot hold an HTTP worker for WRITE_TIMEOUT; up to this many bytes of them in all. Past
# it a worker finishes its own answer, as before: the bound keeps a flood of slow readers from holding
# hundreds of MB of answers.
MAX_PENDING_BYTES: Final = 32 * 1024 * 1024
REFUSED_LOG_INTERVAL: Final = 60.0  # at most one warning about refused logins per interval
# Logins waiting for (or in) a bcrypt check from one client: a flood from a few hosts cannot take all of
# the lane's places, so another client's first login (a Prometheus after a restart) still gets one.
MAX_COSTLY_PER_CLIENT: Final = 4


def client_of(host: str) -> str:
    """The client a peer address counts as for MAX_COSTLY_PER_CLIENT: the IPv4 address, or the IPv6 /64
    (one host can use a whole /64 of addresses)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # a dual-stack listener sees IPv4 clients this way
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def send_blocks(parts: tuple[bytes, ...]) -> Iterator[bytes]:
    """The parts joined into blocks of at least SEND_BLOCK_BYTES (but the last), in order."""
    batch: list[bytes] = []
    size = 0
    for part in parts:
        batch.append(part)
        size += len(part)
        if size >= SEND_BLOCK_BYTES:
            yield batch[0] if len(batch) == 1 else b"".join(batch)
            batch, size = [], 0
    if batch:
        yield batch[0] if len(batch) == 1 else b"".join(batch)


class Outgoing:
    """An answer being sent: the block under way, then the rest, joined into blocks only as they are due
    (joining all at once would copy a multi-megabyte answer)."""

    __slots__ = ("left", "rest", "view")

    def __init__(self, parts: tuple[bytes, ...]) -> None:
        self.rest = send_blocks(parts)
        self.view = memoryview(b"")
        self.left = sum(map(len, parts))  # bytes not sent yet

    def send_some(self, sock: socket.socket) -> int:
        """Send without blocking until all is sent or the socket is full. Returns the selector event to
        wait for before the next try, 0 once all is sent. After a TLS want-write the block is offered
        again unchanged, as OpenSSL requires."""
        while True:
            if not self.view:
                block = next(self.rest, None)
                if block is None:
                    return 0
                self.view = memoryview(block)
                continue  # an empty block has nothing to send
            try:
                sent = sock.send(self.view)
            except (BlockingIOError, ssl.SSLWantWriteError):
                return selectors.EVENT_WRITE
            except ssl.SSLWantReadError:  # TLS must read (a key update) before it can write more
                return selectors.EVENT_READ
            self.view = self.view[sent:]
            self.left -= sent

    def finish(self, sock: socket.socket, deadline: float) -> bool:
        """Send the rest, waiting for the socket as needed; False if the deadline (monotonic) passed."""
        with selectors.DefaultSelector() as ready:
            ready.register(sock, selectors.EVENT_WRITE)
            while wanted := self.send_some(sock):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                ready.modify(sock, wanted)
                ready.select(remaining)
        return True


class _Conn:
    __slots__ = (
        "buffer", "client", "costly", "deadline", "eof", "handshaking", "keep", "last_active", "peer", "pending",
        "pending_bytes", "searched", "sock", "started",
    )

    def __init__(
        self, sock: socket.socket, peer: str, client: str, now: float, handshaking: bool, deadline: float
    ) -> None:
        self.sock = sock
        self.peer = peer
        self.client = client  # client_of() the peer's address
        self.costly = False  # its request holds one of the client's MAX_COSTLY_PER_CLIENT places
        self.buffer = bytearray()
        self.searched = 0  # leading bytes of buffer that hold no end of a head
        self.handshaking = handshaking
        self.started = False  # bytes of the current request have arrived
        self.eof = False  # the client half-closed: answer what it sent, then close
        self.last_active = now
        self.deadline = deadline
        self.pending: Outgoing | None = None  # the rest of an answer the loop thread is writing
        self.pending_bytes = 0  # its share of HttpServer's MAX_PENDING_BYTES
        self.keep = False  # whether the connection stays open once `pending` is written

    def head_end(self) -> int:
        end = head_end(self.buffer, self.searched)
        if end < 0:
            self.searched = len(self.buffer)
        return end


Handler = Callable[[Request], Response]
Job = tuple[_Conn, Request]
T = TypeVar("T")


class LastIdleFirst(Generic[T]):
    """Jobs for a fixed set of worker threads, each handed to the worker that went idle most recently.

    With one shared FIFO queue the workers take turns, so Prometheus scraping every 15 s walks through
    all of them; each thread's glibc tcache keeps up to ~230 KB of freed blocks, and one more of the 16
    filled a little with every turn: RSS crept by ~0.1 MB per 500 scrapes for thousands of scrapes. With
    the most recent idler first, sequential scrapes run on one warm thread and the others stay untouched
    until requests really overlap.

    Costly jobs (a login that needs a bcrypt check) have a lane of their own: at most `costly_workers` run
    at once and at most `costly_backlog` wait, and every other job goes first. bcrypt runs one check at a
    time anyway, so without the lane a flood of wrong passwords would hold every worker waiting for that
    lock and queue Prometheus's scrape behind seconds or minutes of hashing.
    """

    def __init__(self, costly_workers: int = 1, costly_backlog: int = 32) -> None:
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[T | None]] = []  # the inboxes of waiting workers, newest last
        self._backlog: deque[T] = deque()  # jobs that arrived while every worker was busy
        self._costly: deque[T] = deque()  # costly jobs waiting for their lane
        self._costly_running: set[int] = set()  # id() of the inboxes whose worker runs a costly job
        self.costly_workers = costly_workers
        self.costly_backlog = costly_backlog
        self._closed = False

    def put(self, job: T, costly: bool = False) -> bool:
        """Hand `job` out or queue it; False (not taken) when the costly lane's backlog is full."""
        with self._lock:
            if costly and (len(self._costly_running) >= self.costly_workers or not self._idle):
                if len(self._costly) >= self.costly_backlog:
                    return False
                self._costly.append(job)
                return True
            if not self._idle:
                self._backlog.append(job)
                return True
            inbox = self._idle.pop()
            if costly:
                self._costly_running.add(id(inbox))
        inbox.put(job)
        return True

    def get(self, inbox: queue.SimpleQueue[T | None], meanwhile: Callable[[], object] = lambda: None) -> T | None:
        """The next job for the worker that owns `inbox` (blocks); None once closed and nothing is left.

        `meanwhile` runs once the worker can be found, before it waits: the clean-up after an answer, during
        which a request sent right after that answer waits in the inbox instead of waking a cold thread.
        """
        with self._lock:
            # Its last job, if costly, is done. No other worker can be idle while a costly job waits for
            # that room: a worker only goes idle when neither lane has a job it may take.
            self._costly_running.discard(id(inbox))
            job = self._backlog.popleft() if self._backlog else self._next_costly(inbox)
            waiting = job is None and not self._closed
            if waiting:
                self._idle.append(inbox)
        meanwhile()
        return inbox.get() if waiting else job

    def _next_costly(self, inbox: queue.SimpleQueue[T | None]) -> T | None:
        if not self._costly or len(self._costly_running) >= self.costly_workers:
            return None
        self._costly_running.add(id(inbox))
        return self._costly.popleft()

    def close(self) -> None:
        """Workers finish the jobs already received, then get None."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for inbox in idle:
            inbox.put(None)


class HttpServer:
    """HTTP/1.1 (keep-alive, optional TLS) for GET/HEAD requests without bodies.

    Bounded: `max_connections` sockets (the longest idle one is closed to make room), `workers` threads,
    MAX_REQUEST_HEAD bytes buffered per connection, and every phase of a connection has a timeout.
    """

    def __init__(
        self,
        address: tuple[str, int],
        handler: Handler,
        *,
        tls: Callable[[], ssl.SSLContext | None] = lambda: None,
        after_response: Callable[[Response], None] | None = None,
        peer_allowed: Callable[[Mapping[str, Any] | None], bool] = lambda cert: True,
        headers: Callable[[], Mapping[str, str]] = dict,
        costly: Callable[[Request], bool] = lambda request: False,
        workers: int = HTTP_WORKERS,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT,
        head_timeout: float = HEAD_TIMEOUT,
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        host, port = address
        if host in ("", "::") and socket.has_dualstack_ipv6():
            self._listener = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
        elif ":" in host:
            self._listener = socket.create_server((host, port), family=socket.AF_INET6)
        else:
            self._listener = socket.create_server((host or "0.0.0.0", port), backlog=128)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._handler = handler
        self._after_response = after_response  # runs on the worker after the answer, before it waits
        self._tls = tls
        self._peer_allowed = peer_allowed
        self._headers = headers
        self._costly = costly  # runs on the loop thread: must be cheap
        self._refused_logins = 0  # since the last warning about them
        self._costly_clients: Counter[str] = Counter()  # places in the costly lane taken, by client
        self._refused_logged = -REFUSED_LOG_INTERVAL  # when that warning was (monotonic)
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.head_timeout = head_timeout
        self.write_timeout = write_timeout
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._accept_resume = 0.0  # when accepts paused after EMFILE resume (monotonic), 0 if not paused
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: dict[int, _Conn] = {}  # every open connection, by id(); busy ones too
        self._busy: set[int] = set()
        self._returned: deque[tuple[_Conn, bool]] = deque()
        self._pending_lock = threading.Lock()
        self._pending_bytes = 0  # of every answer left to the loop thread (MAX_PENDING_BYTES)
        self._jobs: LastIdleFirst[Job] = LastIdleFirst()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._workers = [
            threading.Thread(target=self._work, name=f"http-{i}", daemon=True) for i in range(max(1, workers))
        ]
        for thread in self._workers:
            thread.start()

    # -- loop thread --

    def serve_forever(self) -> None:
        try:
            next_sweep = 0.0
            while not self._stopping.is_set():
                for key, mask in self._selector.select(timeout=0.5):
                    if key.data == "listener":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._on_ready(key.data, mask)
                now = time.monotonic()
                if self._accept_resume and now >= self._accept_resume:
                    self._accept_resume = 0.0
                    self._selector.register(self._listener, selectors.EVENT_READ, "listener")
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + 0.25
        finally:
            self._close_all()
            self._stopped.set()

    def stop(self) -> None:
        """Make serve_forever return (safe in a signal handler: an Event and a socket write)."""
        self._stopping.set()
        self._wake()

    def shutdown(self, grace: float = 10.0) -> None:
        """Stop accepting, let requests already received finish (up to `grace` s), close everything."""
        self.stop()
        end = time.monotonic() + grace
        self._stopped.wait(grace)
        self._jobs.close()
        for thread in self._workers:
            thread.join(max(0.0, end - time.monotonic()))
        if self._stopped.is_set():  # the loop thread is gone: nobody else touches the connections
            self._finish_pending(end)
        for conn in list(self._conns.values()):
            self._close(conn)

    def _finish_pending(self, end: float) -> None:
        """Write the answers the loop thread left unfinished, all at once, until they are sent or `end`
        (monotonic): a scrape answered before SIGTERM must not be cut short."""
        with selectors.DefaultSelector() as ready:
            for conn in self._conns.values():
                if conn.pending:
                    ready.register(conn.sock, selectors.EVENT_WRITE, conn)
            while ready.get_map() and (remaining := end - time.monotonic()) > 0:
                for key, _ in ready.select(remaining):
                    conn = key.data
                    try:
                        wanted = conn.pending.send_some(conn.sock)
                    except (OSError, ssl.SSLError):
                        wanted = 0
                    if wanted:
                        ready.modify(conn.sock, wanted, conn)
                    else:
                        ready.unregister(conn.sock)
                        self._close(conn)

    def connections(self) -> int:
        return len(self._conns)

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: keep serving who is connected
                # The listener stays readable: stop watching it for a moment instead of spinning on it.
                log.warning("accept failed, pausing accepts for %.1f s: %s", ACCEPT_PAUSE, exc)
                self._selector.unregister(self._listener)
                self._accept_resume = time.monotonic() + ACCEPT_PAUSE
                return
            now = time.monotonic()
            if len(self._conns) >= self.max_connections and not self._evict_idle():
                sock.close()
                continue
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            context = self._tls()
            peer = f"{address[0]}:{address[1]}"
            if context is not None:
                try:
                    sock = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except OSError:  # the client already went away (ENOTCONN)
                    sock.close()
                    continue
            handshaking = context is not None
            deadline = now + (self.head_timeout if handshaking else self.idle_timeout)
            conn = _Conn(sock, peer, client_of(str(address[0])), now, handshaking, deadline)
            self._conns[id(conn)] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _evict_idle(self) -> bool:
        idle = [
            c for c in self._conns.values()
            if id(c) not in self._busy and not c.started and not c.handshaking and not c.pending
        ]
        if not idle:
            return False
        self._close(min(idle, key=lambda c: c.last_active))
        return True

    def _on_ready(self, conn: _Conn, mask: int) -> None:
        try:
            if conn.pending:
                self._write(conn)
            elif conn.handshaking:
                self._handshake(conn)
            else:
                self._read(conn)
        except Exception:  # a bug on what one client sent costs that client, not the loop every client needs
            log.exception("reading from %s failed", conn.peer)
            self._close(conn)

    def _handshake(self, conn: _Conn) -> None:
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(sock, selectors.EVENT_READ, conn)
            return
        except ssl.SSLWantWriteError:
            self._selector.modify(sock, selectors.EVENT_WRITE, conn)
            return
        except (ssl.SSLError, OSError) as exc:
            log.debug("TLS handshake with %s failed: %s", conn.peer, exc)
            self._close(conn)
            return
        if not self._peer_allowed(sock.getpeercert()):
            log.warning("client %s: certificate names none of client_allowed_sans", conn.peer)
            self._close(conn)
            return
        conn.handshaking = False
        conn.deadline = time.monotonic() + self.idle_timeout
        self._selector.modify(sock, selectors.EVENT_READ, conn)
        self._read(conn)  # the request may already sit decrypted in the TLS buffer

    def _read(self, conn: _Conn) -> None:
        # Stop at one complete head (or too many bytes): a client cannot make the loop buffer more.
        while conn.head_end() < 0 and len(conn.buffer) <= MAX_REQUEST_HEAD:
            try:
                data = conn.sock.recv(8192)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError:
                self._close(conn)
                return
            if not data:
                conn.eof = True
                break
            now = time.monotonic()
            if not conn.started:
                conn.started = True
                conn.deadline = now + self.head_timeout
            conn.last_active = now
            conn.buffer += data
        if conn.eof and conn.head_end() < 0:
            self._close(conn)
            return
        self._dispatch(conn)

    def _dispatch(self, conn: _Conn) -> None:
        end = conn.head_end()
        if end < 0:
            if len(conn.buffer) > MAX_REQUEST_HEAD:
                first = bytes(conn.buffer[: MAX_REQUEST_LINE + 2])
                status = 414 if b"\n" not in first else 431
                self._reject(conn, status, "request head too large")
            return
        if end > MAX_REQUEST_HEAD:
            self._reject(conn, 431, "request head too large")
            return
        head = bytes(conn.buffer[:end])
        del conn.buffer[:end]
        conn.searched = 0  # what follows (a pipelined request) is not searched yet
        try:
            request = parse_head(head)
        except BadRequest as exc:
            self._reject(conn, exc.status, str(exc))
            return
        request.peer = conn.peer
        costly = self._costly(request)
        if costly and self._costly_clients[conn.client] >= MAX_COSTLY_PER_CLIENT:
            self._refuse_login(conn)
            return
        self._selector.unregister(conn.sock)
        self._busy.add(id(conn))
        if not self._jobs.put((conn, request), costly):
            self._busy.discard(id(conn))
            self._refuse_login(conn)
            return
        if costly:
            conn.costly = True
            self._costly_clients[conn.client] += 1

    def _costly_done(self, conn: _Conn) -> None:
        if conn.costly:
            conn.costly = False
            self._costly_clients[conn.client] -= 1
            if not self._costly_clients[conn.client]:
                del self._costly_clients[conn.client]

    def _refuse_login(self, conn: _Conn) -> None:
        self._reject(conn, 503, "too many logins waiting for a password check, try again later")
        self._log_refused_login(conn.peer)

    def _log_refused_login(self, peer: str) -> None:
        # A flood of wrong passwords is worth a warning, but not one line per refused request.
        self._refused_logins += 1
        now = time.monotonic()
        if now - self._refused_logged >= REFUSED_LOG_INTERVAL:
            log.warning(
                "%d login(s) refused with 503 since the last such line: too many waiting for a password check "
                "(%d in all, or %d from one client; the last from %s)",
                self._refused_logins, self._jobs.costly_backlog, MAX_COSTLY_PER_CLIENT, peer,
            )
            self._refused_logins, self._refused_logged = 0, now

    def _reject(self, conn: _Conn, status: int, message: str) -> None:
        """Best-effort error answer from the loop thread: never blocks, then closes."""
        log.debug("rejecting %s: %d %s", conn.peer, status, message)
        data = render_response(text_response(status, message), head_only=False, keep_alive=False, extra={})
        with contextlib.suppress(OSError, ssl.SSLError):
            conn.sock.send(data)
        self._close(conn)

    def _sweep(self, now: float) -> None:
        for conn in list(self._conns.values()):
            if id(conn) not in self._busy and now >= conn.deadline:
                if conn.pending:
                    log.debug("answer to %s not read in %.0f s, closing", conn.peer, self.write_timeout)
                    self._close(conn)
                elif conn.started:
                    self._reject(conn, 408, "request head not received in time")
                else:
                    self._close(conn)

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        while self._returned:
            conn, keep = self._returned.popleft()
            self._busy.discard(id(conn))
            self._costly_done(conn)
            if conn.pending:
                # The client reads slowly: the loop writes the rest (conn.deadline is the write deadline),
                # or shutdown() does if the loop stops first.
                conn.keep = keep
                try:
                    self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)
                except (OSError, ValueError):
                    self._close(conn)
                continue
            self._resume(conn, keep)

    def _write(self, conn: _Conn) -> None:
        try:
            assert conn.pending is not None
            wanted = conn.pending.send_some(conn.sock)
        except (OSError, ssl.SSLError):
            self._close(conn)
            return
        if wanted:
            self._selector.modify(conn.sock, wanted, conn)
            return
        self._release_pending(conn)
        self._selector.unregister(conn.sock)
        self._resume(conn, conn.keep)

    def _resume(self, conn: _Conn, keep: bool) -> None:
        """After an answer: wait for the next request on the connection, or close it."""
        if not keep or self._stopping.is_set():
            self._close(conn)
            return
        now = time.monotonic()
        conn.started = bool(conn.buffer)
        conn.last_active = now
        conn.deadline = now + (self.head_timeout if conn.started else self.idle_timeout)
        try:
            conn.sock.setblocking(False)
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
        except (OSError, ValueError):
            self._close(conn)
            return
        self._on_ready(conn, selectors.EVENT_READ)  # pipelined bytes, or data already decrypted by TLS

    def _release_pending(self, conn: _Conn) -> None:
        conn.pending = None
        with self._pending_lock:
            self._pending_bytes -= conn.pending_bytes
        conn.pending_bytes = 0

    def _close(self, conn: _Conn) -> None:
        self._costly_done(conn)
        if conn.pending_bytes:
            self._release_pending(conn)
        self._conns.pop(id(conn), None)
        self._busy.discard(id(conn))
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _close_all(self) -> None:
        with contextlib.suppress(OSError):
            self._selector.unregister(self._listener)
        self._listener.close()
        for conn in list(self._conns.values()):
            if id(conn) not in self._busy and not conn.pending:  # shutdown() finishes pending answers
                self._close(conn)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # -- worker threads --

    def _work(self) -> None:
        inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        sent: Response | None = None

        def after_sent() -> None:
            nonlocal sent
            if sent is not None and self._after_response is not None:
                try:
                    self._after_response(sent)
                except Exception:
                    log.exception("clean-up after an answer failed")
            sent = None

        while (job := self._jobs.get(inbox, after_sent)) is not None:
            conn, request = job
            keep = False
            try:
                keep, sent = self._serve(conn, request)
            except Exception:  # a handler bug costs one request, not a worker
                log.exception("request %s %s from %s failed", request.method, request.target, request.peer)
            self._returned.append((conn, keep))
            self._wake()

    def _serve(self, conn: _Conn, request: Request) -> tuple[bool, Response]:
        try:
            response = self._handler(request)
        except Exception:
            log.exception("handling %s %s failed", request.method, request.path)
            response = text_response(500, "internal error, see the exporter log", close=True)
        keep = request.keep_alive and not response.close and not conn.eof and not self._stopping.is_set()
        head = render_response(response, head_only=True, keep_alive=keep, extra=self._headers())
        parts = (head,) if request.method == "HEAD" else (head, *response.parts)
        outgoing = Outgoing(parts)
        sock = conn.sock
        try:
            sock.setblocking(False)
            if not outgoing.send_some(sock):
                return keep, response  # the common case: the whole answer fit in the socket's buffer
            with self._pending_lock:
                handed = self._pending_bytes + outgoing.left <= MAX_PENDING_BYTES
                if handed:
                    self._pending_bytes += outgoing.left
            deadline = time.monotonic() + self.write_timeout
            if handed:  # the loop thread writes the rest as the client reads
                conn.pending, conn.pending_bytes, conn.deadline = outgoing, outgoing.left, deadline
                return keep, response
            # Too much is waiting for slow readers already: this worker finishes its own answer, also when
            # the connection closes after it. One deadline for the whole answer: a client reading one byte
            # a second cannot hold a worker.
            finished = outgoing.finish(sock, deadline)
            return keep and finished, response
        except (OSError, ssl.SSLError):
            return False, response


# --- the exporter's endpoints --------------------------------------------------------------------------

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


def scrape_timeout(config: Config, header: str | None) -> float:
    """The configured deadline, shortened to Prometheus's own timeout (minus an offset) when that is less."""
    timeout = config.scrape_timeout
    if header:
        try:
            value = float(header)
        except ValueError:
            return timeout
        if math.isfinite(value) and value > 0:
            timeout = min(timeout, max(value - SCRAPE_TIMEOUT_OFFSET, MIN_SCRAPE_TIMEOUT))
    return timeout


# zlib level for gzipped answers. The exposition is repetitive text that compresses well at any level:
# compressing the sample tree's 181 KB answer family by family takes 0.77 ms at level 1 (20.0 KB) and
# 1.69 ms at the default level 6 (17.2 KB). Every scrape by a Prometheus server asks for gzip.
GZIP_LEVEL: Final = 1


def gzip_chunks(chunks: tuple[bytes, ...]) -> bytes:
    """One gzip member of the chunks, compressed as they come (no joined copy of the plain text)."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # wbits 31: gzip header and trailer
    return b"".join([*(compressor.compress(chunk) for chunk in chunks), compressor.flush()])


class Exporter:
    """Routes requests: the metrics path, `/` and `/healthz`; everything else is 404."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving
        # Scrapes that shared one collection get the same FamilySet: encode (and gzip) it once. Only a weak
        # reference: the bodies must not keep a finished scrape's rows alive into the next scrape.
        self._encoded: tuple[weakref.ref[FamilySet] | None, dict[bool, bytes | tuple[bytes, ...]]] = (None, {})
        # Reentrant: dereferencing the weak reference under the lock can free the FamilySet right there,
        # which runs _forget on this very thread.
        self._encoded_lock = threading.RLock()

    def _forget(self, gone: weakref.ref[FamilySet]) -> None:
        # The collection was dropped (a new scrape started its own): drop its encoded bodies with it.
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
        if auth is not None and not auth.check(request.headers.get("authorization")):
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

    def metrics(self, serving: Serving, request: Request) -> Response:
        timeout = scrape_timeout(serving.config, request.headers.get("x-prometheus-scrape-timeout-seconds"))
        families = serving.collector.gather(timeout)
        compress = accepts_gzip(request.headers.get("accept-encoding", ""))
        with self._encoded_lock:
            cached_for, bodies = self._encoded
            body = bodies.get(compress) if cached_for is not None and cached_for() is families else None
        if body is None:
            chunks = families.render_chunks()
            body = gzip_chunks(chunks) if compress else chunks
            with self._encoded_lock:
                cached_for = self._encoded[0]
                if cached_for is None or cached_for() is not families:
                    self._encoded = (weakref.ref(families, self._forget), {})
                self._encoded[1][compress] = body
        headers = [("Vary", "Accept-Encoding")]
        if compress:
            headers.append(("Content-Encoding", "gzip"))
        return Response(200, body, CONTENT_TYPE, headers)


# --- process: start-up, reload, shutdown ---------------------------------------------------------------


def parse_listen(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "", int(port)


def sd_notify(state: str) -> None:
    """Tell systemd (Type=notify) about readiness, reloads and stopping; a no-op elsewhere."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    address = "\0" + path[1:] if path.startswith("@") else path
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(state.encode(), address)


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


# File descriptors kept free for every connection, a file being opened by each possible reader thread,
# and the listener, epoll, wake pipe, udev monitor, stdio and log handlers.
FD_RESERVE: Final = MAX_CONNECTIONS + HARD_MAX_WORKERS + 64


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard limit to fit `wanted` kept files plus a reserve;
    return how many files may be kept open (systemd's default soft limit is 1024, the hard one 512K)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except OSError as exc:  # a seccomp filter that refuses prlimit64 (old systemd @resources)
        log.warning("cannot read the open-file limit (%s): assuming 1024", exc)
        return max(0, min(wanted, 1024 - FD_RESERVE))
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


class Daemon:
    """The running exporter: server, current collector, hotplug monitor and signal handling."""

    def __init__(self, config: Config, reload: Callable[[], Config] | None = None) -> None:
        self._reload_source = reload
        self._reload_lock = threading.Lock()
        budget = FileBudget(raise_fd_limit(config.max_open_files))
        self.reads = DeviceReads(WorkerPool(parallelism=config.read_threads), budget)
        web = load_web_config(config.web_config_file)
        collector = build_collector(config, reads=self.reads)
        self.exporter = Exporter(Serving(config, collector, web))
        hotplug, mode = start_monitor(config.sysfs, lambda: self.exporter.serving.collector.inventory)
        self.hotplug: HotplugMonitor | None = hotplug
        collector.inventory.rescan_each_scrape = hotplug is None
        self.server = HttpServer(
            parse_listen(config.listen_address),
            self.exporter.handle,
            tls=lambda: self.exporter.serving.web.ssl_context,
            after_response=release_memory,
            peer_allowed=lambda cert: self.exporter.serving.web.peer_allowed(cert),
            headers=lambda: self.exporter.serving.web.headers,
            costly=self.exporter.costly,
        )
        log.info(
            "rdma-exporter %s listening on %s (%s), metrics at %s, sysfs %s, scrape deadline %.1f s",
            __version__,
            config.listen_address,
            web.describe(),
            config.telemetry_path,
            Path(config.sysfs),
            config.scrape_timeout,
        )
        log.info("device discovery: %s", mode)
        class_dir = config.sysfs / CLASS_DIR
        if not class_dir.is_dir():
            log.warning("no %s: no RDMA devices to export (RDMA modules not loaded?)", class_dir)

    def reload(self) -> bool:
        """Re-read the config (and web config) file; anything invalid keeps the running config."""
        if self._reload_source is None:
            log.warning("SIGHUP: nothing to reload (started without a config source)")
            return False
        with self._reload_lock:
            sd_notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
            try:
                return self._reload()
            finally:
                sd_notify("READY=1")

    def _reload(self) -> bool:
        assert self._reload_source is not None
        old = self.exporter.serving
        try:
            config = self._reload_source()
            # The socket and the uevent monitor are bound at start-up.
            for name in ("listen_address", "sysfs"):
                if getattr(config, name) != getattr(old.config, name):
                    log.warning("reload: %s changed to %s; restart to apply it", name, getattr(config, name))
                    config = replace(config, **{name: getattr(old.config, name)})
            web = load_web_config(config.web_config_file)
            if web.auth is not None and old.web.auth is not None:
                web.auth.remember_from(old.web.auth)  # no bcrypt wait for Prometheus after a reload
            udev = self.hotplug is not None and self.hotplug.running
            collector = build_collector(config, reads=self.reads, rescan_each_scrape=not udev)
        except ConfigError as exc:
            log.error("reload rejected, keeping the running configuration: %s", exc)
            return False
        except Exception:
            log.exception("reload failed, keeping the running configuration")
            return False
        logging.getLogger().setLevel(log_level(config.log_level))
        # The pool is shared across reloads; surplus threads exit as they finish their jobs.
        self.reads.pool.parallelism = config.read_threads
        # A lowered cap takes effect at each device's next read (OpenFiles.begin closes files over it).
        self.reads.budget.limit = raise_fd_limit(config.max_open_files)
        self.exporter.serving = Serving(config, collector, web)
        if udev and not self.hotplug.running:  # type: ignore[union-attr]
            # The monitor died after it was asked above: its fallback went to the old collector.
            collector.inventory.rescan_each_scrape = True
        log.info("reloaded %s (%s)", config.config_file or "configuration", web.describe())
        return True

    def serve(self) -> int:
        def on_term(signum: int, frame: FrameType | None) -> None:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            sd_notify("STOPPING=1")
            self.server.stop()

        def on_hup(signum: int, frame: FrameType | None) -> None:
            log.info("received SIGHUP, reloading")
            threading.Thread(target=self.reload, name="reload", daemon=True).start()

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGHUP, on_hup)
        sd_notify("READY=1")
        try:
            self.server.serve_forever()
        finally:
            if self.hotplug is not None:
                self.hotplug.stop()
        # Requests being answered may finish (a scrape takes at most its deadline); reads blocked in the
        # kernel are daemon threads and do not hold the exit.
        self.server.shutdown(grace=self.exporter.serving.config.scrape_timeout + 2.0)
        log.info("stopped")
        return 0


def log_level(name: str) -> int:
    return {"warn": logging.WARNING}.get(name, getattr(logging, name.upper(), logging.INFO))


def run(config: Config, reload: Callable[[], Config] | None = None) -> int:
    fix_mmap_threshold()  # before the first scrape allocates anything large
    use_one_malloc_arena()  # before the first thread starts
    try:
        daemon = Daemon(config, reload)
    except ConfigError as exc:
        log.error("invalid web configuration: %s", exc)
        return 2
    except OSError as exc:
        log.error("cannot listen on %s: %s", config.listen_address, exc)
        return 1
    return daemon.serve()
