"""The HTTP/1.1 server the daemon answers on: keep-alive, optional TLS, GET and HEAD without bodies.

Instead of http.server: there a connection owns a thread from accept to close,
so a few hundred idle or trickling clients take every thread. Here one loop thread holds every
connection that is idle, in its TLS handshake or still sending its request head; only a complete
request goes to one of a fixed number of worker threads.

Bounded in every resource a client can take: connections, buffered bytes, worker threads, the
costly-login lane, bytes of answers waiting for slow readers, and time in each phase of a connection.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import os
import queue
import re
import selectors
import socket
import ssl
import struct
import sys
import threading
import time
import weakref
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Generic, TypeVar

from . import __version__

log = logging.getLogger(__name__)

MAX_REQUEST_LINE: Final = 8192
MAX_REQUEST_HEAD: Final = 16384
MAX_HEADERS: Final = 64
# The content type that opens every TLS record of a handshake (RFC 8446 5.1): the first byte a TLS client
# sends, and one no HTTP request starts with.
TLS_HANDSHAKE_RECORD: Final = b"\x16"
CLOSED_OUTDATED: Final = "closed %d idle connection(s) opened under the previous TLS settings"
IDLE_TIMEOUT: Final = 90.0  # longer than a 60 s scrape interval, so Prometheus keeps its connection
HEAD_TIMEOUT: Final = 10.0  # from the first byte (or the TCP accept, with TLS) to the end of the head
WRITE_TIMEOUT: Final = 30.0
HTTP_WORKERS: Final = 16
MAX_CONNECTIONS: Final = 512
# After accept() fails (EMFILE: out of fds), the listener is not watched for this long.
ACCEPT_PAUSE: Final = 0.5
# Connections taken from the listen queue in one pass of the loop; the rest wait for the next pass.
MAX_ACCEPTS_PER_PASS: Final = 64
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


class CountedWarning:
    """Refusals of one kind, logged as one warning per REFUSED_LOG_INTERVAL with their count since the last.

    A client with a wrong password or certificate repeats it every scrape, and anyone can repeat it in a
    loop: a line per refusal would flood the journal. The first one is logged at once; those counted after
    it are logged when the interval is over (`flush_all`, from the server's loop), not when the next
    refusal comes: that could be minutes later, from another client, or never.
    """

    _every: ClassVar[weakref.WeakSet[CountedWarning]] = weakref.WeakSet()

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._lock = threading.Lock()  # some refusals are counted on HTTP workers, some on the loop thread
        self.count = 0  # since the last warning
        self.logged = -REFUSED_LOG_INTERVAL  # when that warning was (monotonic)
        self._pending: tuple[str, tuple[object, ...]] | None = None  # the last refusal not logged yet
        CountedWarning._every.add(self)

    def add(self, message: str, *args: object) -> None:
        """Count one refusal; `message`'s first %d is the count, `args` fill the rest."""
        with self._lock:
            self.count += 1
            self._pending = (message, args)
        self.flush(time.monotonic())

    def flush(self, now: float) -> None:
        """Log the refusals counted since the last line, once its interval is over."""
        with self._lock:
            if self._pending is None or now - self.logged < REFUSED_LOG_INTERVAL:
                return
            (message, args), count = self._pending, self.count
            self.count, self.logged, self._pending = 0, now, None
        self._log.warning(message, count, *args)

    @classmethod
    def flush_all(cls, now: float) -> None:
        for warning in list(cls._every):
            warning.flush(now)


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]  # lower-case names
    peer: str = ""
    # When its head was complete (parsed as soon as it was): what it then waited for a worker, or behind
    # password checks, is part of the scraper's timeout.
    received: float = field(default_factory=time.monotonic)

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
    # What the body was made from (a scrape's families): freed on the worker once the answer is out, not
    # while the client waits for it.
    made_from: object = field(default=None, repr=False, compare=False)

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
    lines = [
        line[:-1] if line.endswith("\r") else line  # the CR of CRLF: any other CR is a bare one
        for line in head[_leading_empty_line(head) :].decode("latin-1").split("\n")
    ]
    request_line = lines[0]
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
    for line in lines[1:]:
        if not line:
            continue
        count += 1
        if count > MAX_HEADERS:
            raise BadRequest(431, "too many header fields")
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name):
            raise BadRequest(400, "malformed header field")
        if "\r" in value or "\0" in value:
            # RFC 9112 2.2 and RFC 9110 5.5: a bare CR or a NUL makes the field invalid. A proxy in front
            # that splits on a bare CR would see two fields where this server sees one.
            raise BadRequest(400, "bare CR or NUL in a header field")
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
# One client's share of them (or one answer, if larger). Past it, an answer of a client that has not read
# the earlier ones is dropped with its connection rather than left to a worker: one host opening 200
# connections that asked and never read took the whole 32 MiB, then every worker for 30 s at a time, and
# Prometheus missed scrapes.
MAX_PENDING_PER_CLIENT: Final = MAX_PENDING_BYTES // 4
# Past MAX_PENDING_BYTES, at most this share of the workers write their own answers at once; a further
# answer that does not fit its socket's buffer is dropped with its connection. Four hosts' slow readers
# filled the pool, and a fifth's then held all 16 workers for the write timeout at a time: Prometheus
# waited 27 s for a scrape, and a kubelet's /healthz probe failed (daemon review). Prometheus asks for
# gzip, whose answer fits the buffer at once, so it is not among the dropped.
FINISHING_WORKERS_SHARE: Final = 4
# Each accepted socket's kernel send buffer (Linux doubles it for its own overhead). Left to autotuning it
# grew to tcp_wmem's maximum, 4 MB, for a client that pipelined requests and read nothing: 200 such
# connections held 839 MB of kernel memory, charged to the exporter's cgroup (security review). Fixed,
# the kernel holds at most about 256 KB a connection and the rest waits in MAX_PENDING_BYTES; it still
# takes a gzip answer of 128 devices (75 KB measured) in one send, and a LAN window needs no more.
SEND_BUFFER_BYTES: Final = 128 * 1024
# ioctl for the bytes a socket holds and has not sent yet (linux/sockios.h): a closed socket with such
# bytes stays in the kernel as an orphan, holding them, for as long as its client keeps the connection
# open without reading, outside every bound here and outside the connection count (security review:
# 1,000 such closes held 260 MB). What a connection closes on is sent to the end first, or reset.
SIOCOUTQNSD: Final = 0x894B
TCP_CLOSE: Final = 7  # tcp_states.h: reset or closed, its write queue purged
REFUSED_LOG_INTERVAL: Final = 60.0  # at most one warning per kind of refusal (CountedWarning) per interval
# Logins waiting for (or in) a bcrypt check from one client: a flood from a few hosts cannot take all of
# the lane's places, so another client's first login (a Prometheus after a restart) still gets one.
MAX_COSTLY_PER_CLIENT: Final = 4


def unsent_bytes(sock: socket.socket) -> int:
    """Bytes the kernel holds for `sock` and has not sent (the client's window is closed on them); 0 if
    it cannot tell (a closed socket), or once the client has reset the connection: the kernel then drops
    them, but SIOCOUTQNSD goes on counting them (diff review)."""
    try:
        if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == TCP_CLOSE:
            return 0
        raw = fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, bytes(4))
    except (OSError, ValueError):
        return 0
    return int.from_bytes(raw, sys.byteorder, signed=True)


def listen_address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    """The family and socket address to bind for an IP address or a host name: its first IPv4 address, as
    Go exporters listen, else its first IPv6 one. Bound as AF_INET, a name with only an IPv6 address passed
    --check-config and then failed every start. The whole socket address, not (host, port): a link-local
    IPv6 address's scope (fe80::1%eth0) is in it, and without it every start failed with EINVAL (daemon
    review)."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, _, _, _, sockaddr = min(found, key=lambda info: info[0] != socket.AF_INET)
    return family, sockaddr


def client_of(host: str) -> str:
    """The client a peer address counts as for MAX_COSTLY_PER_CLIENT and MAX_PENDING_PER_CLIENT: the IPv4
    address, or the IPv6 /64 (one host can use a whole /64 of addresses)."""
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
        "buffer", "client", "context", "costly", "cut", "deadline", "draining", "first", "handshaking", "keep",
        "last_active", "peer", "pending", "pending_bytes", "searched", "sock", "started",
    )

    def __init__(
        self, sock: socket.socket, peer: str, client: str, now: float, handshaking: bool, deadline: float
    ) -> None:
        self.sock = sock
        self.peer = peer
        self.client = client  # client_of() the peer's address
        self.costly = False  # its request holds one of the client's MAX_COSTLY_PER_CLIENT places
        self.buffer = bytearray()
        self.first = True  # buffer starts with the first bytes the client sent
        self.searched = 0  # leading bytes of buffer that hold no end of a head
        self.handshaking = handshaking
        self.started = False  # bytes of the current request have arrived
        self.last_active = now
        self.deadline = deadline
        self.pending: Outgoing | None = None  # the rest of an answer the loop thread is writing
        self.pending_bytes = 0  # its share of HttpServer's MAX_PENDING_BYTES
        self.keep = False  # whether the connection stays open once `pending` is written
        # Its answer was given up before the kernel had it all (the client read too little): nothing of it
        # is worth waiting for when the connection closes.
        self.cut = False
        # Closed but for what the kernel has not sent yet, its write side shut: it stays counted until that
        # is sent or its deadline (the write timeout) passes (HttpServer._close).
        self.draining = False
        # The TLS context (None: plain HTTP) it was accepted under: once a reload has replaced it, the
        # connection is closed when idle, so the new TLS settings apply to every later request.
        self.context: ssl.SSLContext | None = None

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
    lock and queue Prometheus's scrape behind seconds or minutes of hashing. The lane takes its clients in
    turn, not first come first served: a Prometheus not yet remembered (after a restart) waits for at most
    one check of each other client, not for everything a flood from several hosts has queued (found by
    review: 7.4-8.0 s behind 28 queued checks from 7 addresses).
    """

    def __init__(self, costly_workers: int = 1, costly_backlog: int = 32) -> None:
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[T | None]] = []  # the inboxes of waiting workers, newest last
        self._backlog: deque[T] = deque()  # jobs that arrived while every worker was busy
        self._costly: OrderedDict[str, deque[T]] = OrderedDict()  # costly jobs waiting, by client, in turn
        self._costly_waiting = 0
        self._costly_running: set[int] = set()  # id() of the inboxes whose worker runs a costly job
        self.costly_workers = costly_workers
        self.costly_backlog = costly_backlog
        self._closed = False

    def put(self, job: T, costly: bool = False, client: str = "") -> bool:
        """Hand `job` out or queue it; False (not taken) when the costly lane's backlog is full."""
        with self._lock:
            if costly and (len(self._costly_running) >= self.costly_workers or not self._idle):
                if self._costly_waiting >= self.costly_backlog:
                    return False
                self._costly.setdefault(client, deque()).append(job)
                self._costly_waiting += 1
                return True
            if not self._idle:
                self._backlog.append(job)
                return True
            inbox = self._idle.pop()
            if costly:
                self._costly_running.add(id(inbox))
        inbox.put(job)
        return True

    def displace(self, client: str) -> T | None:
        """Make room in a full costly lane for a job of `client`: take out and return the newest waiting
        job of the client holding the most places, if it would still hold more than `client` then; None
        if none may go. So a client holding none gets a place unless every place is another client's
        only one: a flood from 8 hosts kept every place taken, and a Prometheus not yet remembered got
        503s until it stopped (security review); it now takes one from fewer than `costly_backlog`."""
        with self._lock:
            if not self._costly:
                return None
            top, jobs = max(self._costly.items(), key=lambda item: len(item[1]))
            if len(jobs) <= len(self._costly.get(client, ())) + 1:
                return None
            job = jobs.pop()
            self._costly_waiting -= 1
            if not jobs:
                del self._costly[top]
            return job

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
        client, jobs = next(iter(self._costly.items()))
        job = jobs.popleft()
        self._costly_waiting -= 1
        if jobs:
            self._costly.move_to_end(client)  # its next job after every other client's
        else:
            del self._costly[client]
        return job

    def close(self) -> None:
        """Workers finish the jobs already received but password checks not started, then get None."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            # A flood of wrong passwords queued here held the exit for the whole grace period, a check at a
            # time (daemon review). Their connections are closed with the others.
            self._costly.clear()
            self._costly_waiting = 0
        for inbox in idle:
            inbox.put(None)


class HttpServer:
    """HTTP/1.1 (keep-alive, optional TLS) for GET/HEAD requests without bodies.

    Bounded: `max_connections` sockets, `workers` threads, MAX_REQUEST_HEAD bytes buffered per connection,
    and every phase of a connection has a timeout. A full server makes room for a newcomer by closing the
    oldest connection of the client (client_of) holding the most, if that is another client holding more
    than the newcomer; a newcomer from the client holding the most may only close its own longest idle
    one; otherwise the longest idle one goes, or the newcomer is refused. So one host holding every slot
    with slow heads or unfinished TLS handshakes cannot keep another out, and hosts holding more than
    Prometheus lose their own connections before its idle one.
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
        tick: Callable[[float], None] = lambda now: None,
        workers: int = HTTP_WORKERS,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT,
        head_timeout: float = HEAD_TIMEOUT,
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        host, port = address
        if host in ("", "::") and socket.has_dualstack_ipv6():
            self._listener = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
        elif not host:
            self._listener = socket.create_server(("0.0.0.0", port), backlog=128)
        else:
            family, sockaddr = listen_address(host, port)
            self._listener = socket.create_server(sockaddr, family=family, backlog=128)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._handler = handler
        self._after_response = after_response  # runs on the worker after the answer, before it waits
        self._tls = tls
        self._peer_allowed = peer_allowed
        self._headers = headers
        self._costly = costly  # runs on the loop thread: must be cheap
        self._tick = tick  # each quarter second on the loop thread: must be cheap
        self._costly_clients: Counter[str] = Counter()  # places in the costly lane taken, by client
        self.refused_logins = CountedWarning(log)  # 503s of the login lane
        self.refused_certificates = CountedWarning(log)  # certificates naming none of client_allowed_sans
        self.refused_connections = CountedWarning(log)  # accepted and closed at once: no room
        self.evicted_connections = CountedWarning(log)  # closed to make room for a newcomer
        self.failed_accepts = CountedWarning(log)  # out of descriptors: retried every ACCEPT_PAUSE
        self.failed_handshakes = CountedWarning(log)  # TLS: no or untrusted client certificate, no common version
        self.plain_handshakes = CountedWarning(log)  # TLS ClientHellos sent to this server without TLS
        self.dropped_answers = CountedWarning(log)  # to clients that read none of their earlier answers
        self.dropped_unsent = CountedWarning(log)  # no room left for slow readers' answers, nor a worker
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
        self._pending_by_client: Counter[str] = Counter()  # the same by client (MAX_PENDING_PER_CLIENT)
        self._finishing = 0  # workers writing their own answers past MAX_PENDING_BYTES
        self._max_finishing = max(1, workers // FINISHING_WORKERS_SHARE)
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
                    CountedWarning.flush_all(now)
                    try:
                        self._tick(now)
                    except Exception:  # a hook's fault must not end the server
                        log.exception("the server loop's periodic hook failed")
                    next_sweep = now + 0.25
        finally:
            try:
                self._close_all()
            finally:  # shutdown() waits for this to finish the answers already begun
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
            # Answered after the loop stopped: whole in the kernel, or pending (_finish_pending).
            while self._returned:
                conn, _ = self._returned.popleft()
                if not conn.pending:
                    self._close(conn, drain=not conn.cut)
            self._finish_pending(end)
            while time.monotonic() < end and any(c.draining and unsent_bytes(c.sock) for c in self._conns.values()):
                time.sleep(0.05)
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
                        self._close(conn, drain=True)

    def connections(self) -> int:
        return len(self._conns)

    def _accept(self) -> None:
        # At most MAX_ACCEPTS_PER_PASS at a time: a flood of connections arriving as fast as they are
        # accepted would keep the loop from its timers (idle and head deadlines, the watchdog).
        for _ in range(MAX_ACCEPTS_PER_PASS):
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: keep serving who is connected
                # The listener stays readable: stop watching it for a moment instead of spinning on it.
                self.failed_accepts.add(
                    "%d accept(s) failed since the last such line, accepts paused for %.1f s after each: %s",
                    ACCEPT_PAUSE, exc,
                )
                self._selector.unregister(self._listener)
                self._accept_resume = time.monotonic() + ACCEPT_PAUSE
                return
            now = time.monotonic()
            peer = f"{address[0]}:{address[1]}"
            client = client_of(str(address[0]))
            if len(self._conns) >= self.max_connections and not self._make_room(client, peer):
                sock.close()
                self._log_refused_connection(peer)
                continue
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            context = self._tls()
            if context is not None:
                try:
                    sock = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except OSError:  # the client already went away (ENOTCONN)
                    sock.close()
                    continue
            handshaking = context is not None
            deadline = now + (self.head_timeout if handshaking else self.idle_timeout)
            conn = _Conn(sock, peer, client, now, handshaking, deadline)
            conn.context = context
            self._conns[id(conn)] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _longest_idle(self, client: str | None = None) -> _Conn | None:
        """The longest idle connection (of `client`, if given), if there is one."""
        idle = [  # a draining one too: what it has not sent, its client is not reading
            c for c in self._conns.values()
            if id(c) not in self._busy and (c.draining or (not c.started and not c.handshaking)) and not c.pending
            and (client is None or c.client == client)
        ]
        return min(idle, key=lambda c: c.last_active) if idle else None

    def _make_room(self, client: str, peer: str) -> bool:
        """Close a connection for a newcomer `peer` from `client` on a full server (HttpServer); False if
        none may go."""
        # Counted here, on a full server only, rather than kept up to date on every accept and close.
        holders = Counter(c.client for c in self._conns.values())
        biggest, held = max(holders.items(), key=lambda item: item[1], default=("", 0))
        if holders[client] >= held:
            # A top holder, tied ones too, makes room from its own idle connections only: otherwise a tie
            # would fall through to the longest idle of all, most often Prometheus's keep-alive one.
            victim = self._longest_idle(client)
        else:
            # From the biggest holder, any phase (a head sent a byte at a time, a TLS handshake never
            # finished) but not one being answered: those end by their own timeouts.
            candidates = [
                c for c in self._conns.values() if c.client == biggest and id(c) not in self._busy and not c.pending
            ]
            victim = min(candidates, key=lambda c: c.last_active) if candidates else self._longest_idle()
        if victim is None:
            return False
        # Logged: a closed connection may have had its request in the socket, unread (an accepted
        # connection counts as idle until its first bytes are read), and its client sees only a reset.
        self.evicted_connections.add(
            "%d connection(s) closed since the last such line to make room on a full server (%d connections; "
            "the last from %s, for a newcomer from %s)",
            self.max_connections, victim.peer, peer,
        )
        self._close(victim)
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
            if isinstance(exc, ssl.SSLError) and exc.reason == "HTTP_REQUEST":
                # A scrape config with `scheme: http` against a TLS port. As Go's servers do, answer it
                # in plain text, so that Prometheus shows the reason rather than an EOF. Written past
                # the TLS layer, to the socket's fd: the few bytes fit its empty send buffer at once.
                # The rest of the request is read first: closing with unread bytes sends a reset, which
                # can discard the answer before the client reads it.
                with contextlib.suppress(OSError):
                    for _ in range(MAX_REQUEST_HEAD // 4096):
                        if not os.read(sock.fileno(), 4096):
                            break
                answer = text_response(400, "Client sent an HTTP request to an HTTPS server.")
                with contextlib.suppress(OSError):
                    os.write(sock.fileno(), render_response(answer, head_only=False, keep_alive=False, extra={}))
                self._close(conn, drain=True)
                return
            elif isinstance(exc, ssl.SSLError) and not isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
                # A scraper without a client certificate or with one we do not trust, or one that speaks no
                # TLS version or cipher we do: Prometheus shows the target down and nothing more, so say it
                # here. Not a client that connects and closes (a load balancer's TCP check: EOF).
                self.failed_handshakes.add(
                    "%d TLS handshake(s) failed since the last such line (the last from %s: %s)",
                    conn.peer, exc.reason or exc,
                )
            self._close(conn)
            return
        if not self._peer_allowed(sock.getpeercert()):
            self._log_refused_certificate(conn.peer)
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
                # The client closed before its head was whole (the loop reads only then): nothing to
                # answer. A client that closes after a whole request is answered, and its next read
                # here finds the end with an empty buffer.
                self._close(conn)
                return
            now = time.monotonic()
            if not conn.started:
                conn.started = True
                conn.deadline = now + self.head_timeout
            conn.last_active = now
            conn.buffer += data
        self._dispatch(conn)

    def _dispatch(self, conn: _Conn) -> None:
        if conn.first and conn.buffer[:1] == TLS_HANDSHAKE_RECORD and not isinstance(conn.sock, ssl.SSLSocket):
            # A scrape config with `scheme: https` against this plain port. A ClientHello rarely holds a
            # head end, so it would wait out the head timeout, and Prometheus would show only "context
            # deadline exceeded". An answer starting "HTTP/" is what Go's TLS client recognises: it reports
            # "server gave HTTP response to HTTPS client".
            self._reject(conn, 400, "Client sent a TLS handshake to an HTTP server.")
            self.plain_handshakes.add(
                "%d TLS handshake(s) answered 400 since the last such line: this port serves plain HTTP, so a "
                "scraper's `scheme: https` needs tls_server_config in a --web.config.file here, or `scheme: http` "
                "there (the last from %s)",
                conn.peer,
            )
            return
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
        conn.first = False
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
        taken = self._jobs.put((conn, request), costly, conn.client)
        if not taken and costly and (displaced := self._jobs.displace(conn.client)) is not None:
            self._busy.discard(id(displaced[0]))
            self._refuse_login(displaced[0])
            taken = self._jobs.put((conn, request), costly, conn.client)  # only this thread adds jobs
        if not taken:
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
        self.refused_logins.add(
            "%d login(s) refused with 503 since the last such line: too many waiting for a password check "
            "(%d in all, or %d from one client; the last from %s)",
            self._jobs.costly_backlog, MAX_COSTLY_PER_CLIENT, peer,
        )

    def _log_refused_connection(self, peer: str) -> None:
        self.refused_connections.add(
            "%d connection(s) closed at once since the last such line: no room (%d connections; the last from %s)",
            self.max_connections, peer,
        )

    def _log_dropped_answer(self, peer: str, held: int) -> None:
        self.dropped_answers.add(
            "%d answer(s) dropped with their connection since the last such line: their client has not read "
            "its earlier ones (%d bytes waiting for it, and the next past its share of %d; the last from %s)",
            held, MAX_PENDING_PER_CLIENT, peer,
        )

    def _log_refused_certificate(self, peer: str) -> None:
        # A scraper with the wrong certificate reconnects every scrape, and any holder of a certificate from
        # the client CA can connect in a loop.
        self.refused_certificates.add(
            "%d client certificate(s) refused since the last such line: they name none of "
            "client_allowed_sans (the last from %s)",
            peer,
        )

    def _reject(self, conn: _Conn, status: int, message: str) -> None:
        """Best-effort error answer from the loop thread: never blocks, then closes."""
        log.debug("rejecting %s: %d %s", conn.peer, status, message)
        data = render_response(text_response(status, message), head_only=False, keep_alive=False, extra={})
        with contextlib.suppress(OSError, ssl.SSLError):
            conn.sock.send(data)
        self._close(conn, drain=True)

    def _sweep(self, now: float) -> None:
        context = self._tls()
        outdated = 0
        for conn in list(self._conns.values()):
            if conn.draining:
                if now >= conn.deadline or not unsent_bytes(conn.sock):
                    self._close(conn)  # sent, or reset at the deadline
            elif (
                conn.context is not context
                and not conn.first  # has had an answer: idle between requests, as a kept-alive one is
                and not conn.started
                and id(conn) not in self._busy
                and not conn.pending
            ):
                # Certificates and client_allowed_sans are checked at the handshake only: a kept-alive
                # connection would go on under the old TLS settings (or none) as long as it is used.
                # One with a request on its way, or none yet (in its handshake, or just accepted), is
                # closed once answered (_resume): a client retries a request on a reused connection
                # that closed, not on a new one (Go's http.Transport). Its last answer was whole: sent on.
                self._close(conn, drain=True)
                outdated += 1
            elif id(conn) not in self._busy and now >= conn.deadline:
                if conn.pending:
                    log.debug("answer to %s not read in %.0f s, closing", conn.peer, self.write_timeout)
                    self._close(conn)
                elif conn.started:
                    self._reject(conn, 408, "request head not received in time")
                else:
                    self._close(conn)
        if outdated:
            log.info(CLOSED_OUTDATED, outdated)

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
            self._close(conn, drain=not conn.cut)
            return
        if conn.context is not self._tls():
            # Answered as kept alive, then a reload replaced its TLS settings before the loop took it back:
            # idle now, closed as _sweep closes the others, and said alike (this one went unsaid, and a
            # test waiting for the line failed under load).
            self._close(conn, drain=not conn.cut)
            log.info(CLOSED_OUTDATED, 1)
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
            self._pending_by_client[conn.client] -= conn.pending_bytes
            if self._pending_by_client[conn.client] <= 0:
                del self._pending_by_client[conn.client]
        conn.pending_bytes = 0

    def _close(self, conn: _Conn, *, drain: bool = False) -> None:
        """Close a connection. What the kernel has not sent of it is reset away (SIOCOUTQNSD), unless
        `drain` (an answer the connection closes after, whole in the kernel): then the write side is shut
        and the connection stays, counted and off the selector, until _sweep finds it sent or its write
        deadline passed."""
        self._costly_done(conn)
        if conn.pending_bytes:
            self._release_pending(conn)
        self._busy.discard(id(conn))
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn.sock)
        unsent = unsent_bytes(conn.sock)
        if unsent and drain and not conn.draining:
            conn.draining = True
            conn.deadline = time.monotonic() + self.write_timeout
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)  # the client reads the end of the answer, then its end
            return
        self._conns.pop(id(conn), None)
        if unsent:
            with contextlib.suppress(OSError):  # a reset frees the bytes at once
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _close_all(self) -> None:
        # KeyError: accepts are paused (EMFILE), and the listener is off the selector until they resume.
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(self._listener)
        self._listener.close()
        for conn in list(self._conns.values()):
            # shutdown() finishes pending answers and waits for draining ones. The others are idle or
            # part-way through a head: what the kernel still sends of them is a whole answer.
            if id(conn) not in self._busy and not conn.pending and not conn.draining:
                self._close(conn, drain=not conn.cut)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # -- worker threads --

    def _work(self) -> None:
        inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        sent: Response | None = None

        def after_sent() -> None:
            nonlocal sent
            if sent is None:
                return
            sent.made_from = None  # first, so that the clean-up below finds that memory free
            if self._after_response is not None:
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
        # A connection accepted under TLS settings a reload has replaced is closed after this answer
        # (_resume): say so, rather than keep-alive.
        keep = (
            request.keep_alive
            and not response.close
            and not self._stopping.is_set()
            and conn.context is self._tls()
        )
        head = render_response(response, head_only=True, keep_alive=keep, extra=self._headers())
        parts = (head,) if request.method == "HEAD" else (head, *response.parts)
        outgoing = Outgoing(parts)
        sock = conn.sock
        try:
            sock.setblocking(False)
            if not outgoing.send_some(sock):
                return keep, response  # the common case: the whole answer fit in the socket's buffer
            with self._pending_lock:
                held = self._pending_by_client[conn.client]
                over_share = held > 0 and held + outgoing.left > MAX_PENDING_PER_CLIENT
                handed = not over_share and self._pending_bytes + outgoing.left <= MAX_PENDING_BYTES
                if handed:
                    self._pending_bytes += outgoing.left
                    self._pending_by_client[conn.client] += outgoing.left
                finishing = not handed and not over_share and self._finishing < self._max_finishing
                if finishing:
                    self._finishing += 1
            deadline = time.monotonic() + self.write_timeout
            if handed:  # the loop thread writes the rest as the client reads
                conn.pending, conn.pending_bytes, conn.deadline = outgoing, outgoing.left, deadline
                return keep, response
            if over_share:
                # Its client has not read what it asked for before: no worker waits on it.
                self._log_dropped_answer(conn.peer, held)
                conn.cut = True
                return False, response
            if not finishing:
                # Room for neither the loop nor another worker: the rest must stay free for Prometheus.
                self.dropped_unsent.add(
                    "%d answer(s) dropped with their connection since the last such line: %d bytes of "
                    "answers wait for slow readers and %d worker(s) write others (the last to %s)",
                    MAX_PENDING_BYTES, self._max_finishing, conn.peer,
                )
                conn.cut = True
                return False, response
            # Too much is waiting for slow readers already: this worker finishes its own answer, also when
            # the connection closes after it. One deadline for the whole answer: a client reading one byte
            # a second cannot hold a worker. What the body was made from is not needed for that and could
            # be held for the whole write timeout: freed first.
            try:
                response.made_from = None
                finished = outgoing.finish(sock, deadline)
            finally:
                with self._pending_lock:
                    self._finishing -= 1
            conn.cut = not finished
            return keep and finished, response
        except (OSError, ssl.SSLError):
            conn.cut = True
            return False, response


