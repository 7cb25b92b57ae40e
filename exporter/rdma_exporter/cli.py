"""Command line: node_exporter-style flags, merged over the YAML config file."""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import yaml

from . import __version__
from .config import (
    COLLECTORS,
    DEFAULT_LISTEN,
    DEFAULT_READ_THREADS,
    LOG_LEVELS,
    Config,
    ConfigError,
    check_directory,
    check_listen,
    check_log_level,
    check_open_files,
    check_path,
    check_read_threads,
    check_regex,
    check_seconds,
    check_string,
    check_telemetry_path,
    exit_status,
    filters_matching_nothing,
    load_config_file,
    load_yaml,
    logging_level,
)
from .parse.reader import DEFAULT_MAX_OPEN_FILES

log = logging.getLogger("rdma_exporter")


class _Once(argparse.Action):
    """A setting's flag, which may be given once. argparse lets the last one win, so a unit's
    --config.file and another in its $RDMA_EXPORTER_ARGS, or two --devices.exclude meant to add up, ran
    with one of them silently dropped; kingpin (node_exporter's flags) refuses a repeated flag too."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        if getattr(namespace, self.dest) is not None:
            parser.error(f"flag {option} cannot be repeated")
        setattr(namespace, self.dest, values)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rdma-exporter",
        description="Prometheus exporter for InfiniBand and RoCE devices (reads sysfs; needs no root).",
        # A shortened flag (--web.listen=) is a typo, as node_exporter treats it, not a guess to act on.
        allow_abbrev=False,
    )
    def add(*names: str, **kwargs: Any) -> None:
        parser.add_argument(*names, **({"action": _Once} | kwargs))

    # Defaults are None so that only flags given explicitly override the config file.
    add("--web.listen-address", dest="listen_address", help=f"[host]:port to listen on (default {DEFAULT_LISTEN})")
    add("--web.telemetry-path", dest="telemetry_path", help="path of the metrics (default /metrics)")
    add("--web.config.file", dest="web_config_file", help="TLS and basic-auth config (exporter-toolkit format)")
    add(
        "--web.scrape-timeout",
        dest="scrape_timeout",
        help="deadline of one scrape in seconds (default 8, under Prometheus' 10 s)",
    )
    add(
        "--web.read-threads",
        dest="read_threads",
        help=f"devices read in parallel, 1-64 (default {DEFAULT_READ_THREADS}; more hides firmware latency)",
    )
    add(
        "--read.max-open-files",
        dest="max_open_files",
        help=f"per-scrape sysfs files kept open between scrapes, 0 for none (default {DEFAULT_MAX_OPEN_FILES})",
    )
    add("--path.sysfs", dest="sysfs", help="sysfs mount point (default /sys)")
    add("--path.ethtool", dest="ethtool_dir", help="read `ethtool -S X` captures from DIR/X instead of the ioctl")
    add("--config.file", dest="config_file", help="YAML config file with the same settings as the flags")
    add("--check-config", action="store_true", help="validate the configuration and exit")
    add("--devices.include", dest="device_include", help="regex: only RDMA devices whose full name matches")
    add("--devices.exclude", dest="device_exclude", help="regex: skip RDMA devices whose full name matches")
    add("--log.level", dest="log_level", help=f"log level: {', '.join(LOG_LEVELS)} (default info)")
    add("--sample", action="store_true", help="serve the bundled sample tree of an 8-GPU node (10 RDMA devices)")
    add("--version", action="version", version=f"rdma-exporter {__version__}")
    for name in COLLECTORS:
        group = parser.add_mutually_exclusive_group()
        group.add_argument(
            f"--collector.{name}", dest=f"collector_{name}", action="store_true", default=None,
            help=f"enable the {name} collector (default on)",
        )
        group.add_argument(
            f"--no-collector.{name}", dest=f"collector_{name}", action="store_false",
            help=f"disable the {name} collector",
        )
    return parser


def _as_in_file(text: str) -> int | float | str:
    """A flag's number read as the config file reads it, one YAML scalar, so that a value means the same
    in both (`1_0`, `0x10`; `010` and `1e1` refused in both); anything else as given, for the setting's
    check to report. Not argparse's type=int or float: a bad value is reported by that check as a
    ConfigError, like every other setting, not with argparse's usage text. int() and float() also take
    other scripts' digits and superscripts, which the file does not."""
    try:
        value = load_yaml(text)
    except yaml.YAMLError:  # an octal 010, 5000 digits: the file refuses them as well
        return text
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else text


def resolve_config(args: argparse.Namespace, notes: list[str] | None = None) -> Config:
    """Defaults < config file < explicit flags; every invalid value raises ConfigError. What is worth a
    warning goes to `notes` if given (at start-up, before logging is set up), else to the log (a reload)."""
    config = Config()
    if args.config_file is not None:
        # An empty value (`--config.file=$CONFIG`, the variable unset) is refused, not taken for "no file":
        # the exporter would run on the defaults, without the file's devices.exclude.
        config = load_config_file(Path(check_string("command line", "--config.file", args.config_file)), config)
    flag: dict[str, Any] = {}
    if args.listen_address is not None:
        flag["listen_address"] = check_listen("command line", "--web.listen-address", args.listen_address)
    if args.telemetry_path is not None:
        flag["telemetry_path"] = check_telemetry_path("command line", "--web.telemetry-path", args.telemetry_path)
    if args.web_config_file is not None:
        flag["web_config_file"] = check_path("command line", "--web.config.file", args.web_config_file)
    if args.scrape_timeout is not None:
        flag["scrape_timeout"] = check_seconds("command line", "--web.scrape-timeout", _as_in_file(args.scrape_timeout))
    if args.read_threads is not None:
        flag["read_threads"] = check_read_threads("command line", "--web.read-threads", _as_in_file(args.read_threads))
    if args.max_open_files is not None:
        value = _as_in_file(args.max_open_files)
        flag["max_open_files"] = check_open_files("command line", "--read.max-open-files", value)
    if args.sysfs is not None:
        flag["sysfs"] = check_directory("command line", "--path.sysfs", args.sysfs)
    if args.ethtool_dir is not None:
        flag["ethtool_dir"] = check_directory("command line", "--path.ethtool", args.ethtool_dir)
    for key, given in (("include", args.device_include), ("exclude", args.device_exclude)):
        if given is None:
            continue
        flag[f"device_{key}"] = check_regex("command line", f"--devices.{key}", given)
        dropped = getattr(config, f"device_{key}")
        if given == "" and dropped is not None:
            # The way to drop the file's filter for one run, and also what `--devices.exclude=$EXCLUDE` gives
            # with the variable unset: said, so that the second does not read an excluded HCA in silence.
            note = f"--devices.{key} is empty: {config.config_file}'s devices.{key} {dropped.pattern!r} is not applied"
            if notes is None:
                log.warning("%s", note)
            else:
                notes.append(note)
    if args.log_level is not None:
        flag["log_level"] = check_log_level("command line", "--log.level", args.log_level)
    collectors = dict(config.collectors)
    for name in COLLECTORS:
        value = getattr(args, f"collector_{name}")
        if value is not None:
            collectors[name] = value
    flag["collectors"] = collectors
    return replace(config, **flag)


def logfmt_value(text: str) -> str:
    """A logfmt value: bare when it can be, else quoted with \\, " and control characters escaped as JSON
    escapes them (as go-logfmt does), so a quoted value reads back with any JSON string decoder."""
    if text and not any(c in text for c in ' ="\\') and text.isprintable():
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return '"' + "".join(c if c.isprintable() else _json_escape(c) for c in escaped) + '"'


def _json_escape(char: str) -> str:
    """\\uXXXX, or above U+FFFF the UTF-16 surrogate pair: a JSON escape has exactly four hex digits."""
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


# node_exporter's level names.
LEVEL_NAMES: Final = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn", logging.ERROR: "error"}


class LogfmtFormatter(logging.Formatter):
    """One record per line in logfmt, as node_exporter writes: `ts=<RFC 3339, UTC> level=info logger=...
    msg="..."`. A traceback goes in `exc`, escaped, so that a log shipper's logfmt parser (Loki,
    Vector) sees one record and not a dozen broken ones."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        level = LEVEL_NAMES.get(record.levelno, record.levelname.lower())
        fields = [f"ts={ts}", f"level={level}", f"logger={logfmt_value(record.name)}"]
        fields.append(f"msg={logfmt_value(record.getMessage())}")
        if record.exc_info:
            fields.append(f"exc={logfmt_value(self.formatException(record.exc_info))}")
        elif record.exc_text:
            fields.append(f"exc={logfmt_value(record.exc_text)}")
        return " ".join(fields)


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    logging.basicConfig(
        level=logging_level(level),
        handlers=[handler],
    )


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _may_have_rdma(class_dir: Path) -> bool:
    """Whether `class_dir` is there, or may be: only a directory known to be absent lets a bare run serve
    the sample. One that cannot be looked at (EACCES under a sandbox) may hold this node's devices: it is
    served as it is, and its failed listing is counted, rather than made-up HCAs under the node's name.
    Not Path.is_dir, which raises on EACCES."""
    try:
        return stat.S_ISDIR(os.stat(class_dir).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True


def use_sample_tree(config: Config, forced: bool, configured: bool) -> Config:
    """Without RDMA hardware, build the bundled sample tree so that a first run shows real output.

    Only a bare first run gets it (`configured` is False: neither --path.sysfs nor --config.file). A
    deployed exporter on a node whose RDMA modules failed to load must report no devices, not the
    sample's eight healthy-looking HCAs under this node's name.
    """
    if not forced and (configured or _may_have_rdma(config.sysfs / "class" / "infiniband")):
        return config  # an explicit tree (configured) is served as it is, even without RDMA devices
    from .sample_tree import SAMPLE_SPEC, build_tree

    try:
        # The tree is this process's own scratch: remove it on exit so restarts do not pile up copies.
        # SIGTERM waits while the directory is made and its removal registered: between the two it would
        # leave it.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            dest = Path(tempfile.mkdtemp(prefix="rdma-exporter-sample-"))
            atexit.register(shutil.rmtree, dest, ignore_errors=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        sys_root = build_tree(dest, SAMPLE_SPEC)
    except OSError as exc:  # no writable temporary directory (a read-only container), a full disk
        if forced:
            raise
        log.error("cannot build the sample tree (%s): serving %s, which has no RDMA devices", exc, config.sysfs)
        return config
    # --sample is served whatever the machine has: then the flag is the reason, not a missing directory.
    reason = "--sample given" if forced else f"no {config.sysfs / 'class' / 'infiniband'} on this machine"
    log.warning(
        "%s: serving the bundled sample tree of an 8-GPU node (10 RDMA devices) from %s "
        "(ethtool captures from %s); these are NOT this machine's devices",
        reason,
        sys_root,
        dest / "ethtool",
    )
    return replace(config, sysfs=sys_root, ethtool_dir=config.ethtool_dir or dest / "ethtool", sample_tree=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    notes: list[str] = []
    try:
        config = resolve_config(args, notes)
    except ConfigError as exc:
        print(f"rdma-exporter: invalid configuration: {exc}", file=sys.stderr)
        return exit_status(exc)
    from .webconfig import load_web_config

    if not args.check_config:
        # Before the web config is read: what it warns of (cheap hashes, an old TLS minimum) are log lines
        # like any other, said once, since the daemon is handed this reading instead of reading it again.
        setup_logging(config.log_level)
    for note in notes:
        if args.check_config:
            print(f"rdma-exporter: warning: {note}", file=sys.stderr)
        else:
            log.warning("%s", note)
    try:
        # Certificates and hashes are checked before anything listens: a typo must stop start-up.
        web = load_web_config(config.web_config_file)
    except ConfigError as exc:
        # Which setting named the file: a path relative to the config file's directory, or a `~` that
        # YAML does not expand, is otherwise hard to trace back.
        origin = "--web.config.file" if args.web_config_file is not None else f"{config.config_file}: web.config_file"
        print(f"rdma-exporter: invalid web configuration: {exc} (named by {origin})", file=sys.stderr)
        return exit_status(exc)
    if args.check_config:
        for note in filters_matching_nothing(config):
            print(f"rdma-exporter: warning: {note}", file=sys.stderr)
        source = config.config_file or "defaults and flags"
        print(f"rdma-exporter: configuration OK ({source}; web: {web.describe()})")
        return 0
    configured = args.sysfs is not None or args.config_file is not None
    if args.sample or not configured:
        # A bare run may build the sample tree, which only atexit removes: until the daemon takes SIGTERM
        # over, end through Python rather than by the signal's default action, which skips atexit and left
        # the tree behind. A deployment (configured) keeps the default: systemd reads that death as a stop.
        signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        served = use_sample_tree(config, args.sample, configured)
    except OSError as exc:  # --sample given: nothing else to serve
        print(f"rdma-exporter: cannot build the sample tree for --sample: {exc}", file=sys.stderr)
        return 1
    # A reload re-reads the config file and re-applies the flags; the sample tree, if any, stays.
    sample: dict[str, Any] = {}
    if served is not config:
        sample = {"sysfs": served.sysfs, "ethtool_dir": served.ethtool_dir, "sample_tree": True}
    if os.geteuid() == 0:
        log.warning("running as root: nothing rdma-exporter reads needs it; run it as an unprivileged user")
    from .daemon import run

    return run(served, reload=lambda: replace(resolve_config(args), **sample), web=web)
