"""The daemon: HTTP endpoint, signal handling, wiring of config to the scrape engine."""

from __future__ import annotations

import logging
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from . import __version__
from .collect.base import Source
from .collect.engine import DeviceFilter, RdmaCollector
from .collect.ethtool import EthtoolSource
from .collect.expected import ExpectedSource
from .collect.infiniband import InfinibandSource
from .collect.netdev import NetdevSource
from .collect.pcie import PcieSource
from .config import Config

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


def build_collector(config: Config) -> RdmaCollector:
    return RdmaCollector(
        config.sysfs,
        build_sources(config),
        device_filter=DeviceFilter(config.device_include, config.device_exclude),
        settings={name: dict(values) for name, values in config.collector_settings.items()},
    )


def build_registry(collector: RdmaCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


_LANDING = """<!doctype html>
<html><head><title>rdma-exporter</title></head>
<body><h1>rdma-exporter {version}</h1>
<p>Prometheus exporter for InfiniBand and RoCE devices.</p>
<ul><li><a href="{path}">{path}</a>: metrics</li><li><a href="/healthz">/healthz</a>: liveness</li></ul>
</body></html>
"""


class ExporterServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry, telemetry_path: str) -> None:
        super().__init__(address, MetricsHandler)
        self.registry = registry
        self.telemetry_path = telemetry_path


class MetricsHandler(BaseHTTPRequestHandler):
    server: ExporterServer
    server_version = f"rdma-exporter/{__version__}"
    # Idle or slow clients are cut off instead of holding a thread.
    timeout = 30

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == self.server.telemetry_path:
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            try:
                body = encoder(self.server.registry)
            except Exception:
                log.exception("scrape failed")
                self._send(500, "text/plain; charset=utf-8", b"scrape failed, see the exporter log\n")
                return
            self._send(200, content_type, body)
        elif path == "/":
            page = _LANDING.format(version=__version__, path=self.server.telemetry_path)
            self._send(200, "text/html; charset=utf-8", page.encode())
        elif path == "/healthz":
            self._send(200, "text/plain; charset=utf-8", b"ok\n")
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def parse_listen(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "", int(port)


def run(config: Config) -> int:
    collector = build_collector(config)
    registry = build_registry(collector)
    host, port = parse_listen(config.listen_address)
    server = ExporterServer((host, port), registry, config.telemetry_path)
    log.info(
        "rdma-exporter %s listening on %s, metrics at %s, sysfs %s",
        __version__,
        config.listen_address,
        config.telemetry_path,
        Path(config.sysfs),
    )
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
