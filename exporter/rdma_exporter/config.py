"""Settings: defaults, overridden by the YAML config file, overridden by explicit command-line flags.

Every problem in the file stops start-up with the file, the dotted key and the reason, because an
exporter that silently ignores a typo in `devices.exclude` reads the firmware-restricted device it
was told to leave alone.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import yaml

from .collect import ethtool as ethtool_collector
from .collect import expected as expected_collector
from .collect import netdev as netdev_collector
from .collect.readers import DEFAULT_PARALLELISM, HARD_MAX_WORKERS

# Re-exported (the `as` form): the config module is where its users look for its error.
from .configerror import ConfigError as ConfigError
from .configerror import ConfigUnavailable as ConfigUnavailable
from .configerror import check_bool as check_bool
from .configerror import compile_regex
from .parse.infiniband import CLASS_DIR
from .parse.reader import DEFAULT_MAX_OPEN_FILES, read_regular_file

DEFAULT_PORT: Final = 9883
DEFAULT_LISTEN: Final = f":{DEFAULT_PORT}"
COLLECTORS: Final = ("infiniband", "netdev", "ethtool", "pcie", "hwmon", "expected")
LOG_LEVELS: Final = ("debug", "info", "warn", "error")
# Reader threads: the engine's default, and at most its hard limit.
DEFAULT_READ_THREADS: Final = DEFAULT_PARALLELISM
MAX_READ_THREADS: Final = HARD_MAX_WORKERS
# Per-scrape sysfs files kept open between scrapes: the default, DEFAULT_MAX_OPEN_FILES, is 64 MiB of
# kernel memory at a page each (parse.reader); this is the most a config may ask for.
MAX_OPEN_FILES: Final = 1_000_000


# The exit status of an invalid configuration, as argparse's for an unknown flag. Restarting cannot fix
# it, so the systemd unit names it in RestartPreventExitStatus= (a restart loop every RestartSec= otherwise).
EXIT_CONFIG: Final = 2
# A file or directory the configuration names that is not there or cannot be read (ConfigUnavailable):
# it may appear later, as a certificate issued by another unit after boot, so systemd restarts on this one.
EXIT_UNAVAILABLE: Final = 1


def exit_status(exc: ConfigError) -> int:
    return EXIT_UNAVAILABLE if isinstance(exc, ConfigUnavailable) else EXIT_CONFIG


# A named file that is not there, or that this user may not read: either may change without an edit of
# the configuration. Anything else (a directory, a FIFO, EIO, too large) is the file's own fault.
_UNAVAILABLE_ERRNOS: Final = frozenset({errno.ENOENT, errno.EACCES, errno.EPERM})


def file_error(exc: OSError) -> type[ConfigError]:
    """The ConfigError class for a configured file that could not be read with `exc`."""
    return ConfigUnavailable if exc.errno in _UNAVAILABLE_ERRNOS else ConfigError


def require_kind(source: str, key: str, path: Path, *, directory: bool) -> None:
    """Raise the key's error unless `path` is a directory (or, with directory=False, a regular file). One
    not there yet (a certificate issued later, a mount to come) is worth a restart, one of another kind
    is not. A path that cannot even be looked at (a parent directory the user may not search, a name too
    long) says why, as a read of it would: Path.is_dir() raised those as a traceback (daemon review)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except OSError as exc:
        raise file_error(exc)(source, key, f"cannot look at {path}: {exc.strerror or exc}") from None
    if mode is not None and (stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)):
        return
    error = ConfigUnavailable if mode is None else ConfigError
    if directory:
        raise error(source, key, f"{'no such directory' if mode is None else 'not a directory'}: {path}")
    raise error(source, key, f"{path} does not exist or is not a file")


@dataclass(frozen=True)
class Config:
    listen_address: str = DEFAULT_LISTEN
    telemetry_path: str = "/metrics"
    web_config_file: Path | None = None
    sysfs: Path = Path("/sys")
    ethtool_dir: Path | None = None
    collectors: Mapping[str, bool] = field(default_factory=lambda: dict.fromkeys(COLLECTORS, True))
    device_include: re.Pattern[str] | None = None
    device_exclude: re.Pattern[str] | None = None
    log_level: str = "info"
    scrape_timeout: float = 8.0
    read_threads: int = DEFAULT_READ_THREADS
    max_open_files: int = DEFAULT_MAX_OPEN_FILES
    # Per-collector settings (e.g. the ethtool collector's extra stat patterns), validated by
    # the collector that owns them.
    collector_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The file the settings were read from (None: flags and defaults only), for `--check-config` and logs.
    config_file: Path | None = None
    # The config file held no document (empty, or only comments): see read_yaml_file.
    config_file_empty: bool = False
    # `sysfs` is the bundled sample tree of made-up devices (cli.use_sample_tree), said in the metrics.
    sample_tree: bool = False


def check_regex(source: str, key: str, value: Any) -> re.Pattern[str] | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(source, key, f"expected a regular expression string, got {type(value).__name__}")
    return compile_regex(source, key, value)


def _unquoted_hint(value: Any) -> str:
    """Why a value written as text arrived as something else: the file shows `level: off` and `10:50`,
    the message would show False and 650."""
    if isinstance(value, bool):
        return " (YAML reads an unquoted yes, no, on or off as true or false)"
    if isinstance(value, (int, float)):
        return " (YAML read the unquoted value as a number: 10:50 as base 60, 0x10 as hexadecimal)"
    return ""


def check_string(source: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(source, key, f"expected a non-empty string, got {value!r}{_unquoted_hint(value)}")
    if "\0" in value:  # a quoted YAML "\0": no system call takes it (os.open raised a ValueError traceback)
        raise ConfigError(source, key, f"a NUL character is in {value!r}")
    return value


def check_path(source: str, key: str, value: Any) -> Path:
    if value is None:
        # `config_file:` that a template left empty: it served plain HTTP, without the TLS and passwords
        # the key was written for, and --check-config said OK (daemon review).
        raise ConfigError(source, key, "empty: give the file, or leave the key out to serve plain HTTP without it")
    return Path(check_string(source, key, value))


def check_required_directory(source: str, key: str, value: Any) -> Path:
    """A directory the exporter reads from: a typo (or a missing host mount) stops start-up, rather than
    serving an exporter with no devices that looks like a node whose RDMA modules did not load. For
    `path.sysfs`, whose default is /sys and not "none": an empty `sysfs:` left in a template passed
    --check-config as no directory at all, and the daemon then failed on it with a traceback."""
    path = Path(check_string(source, key, value))
    require_kind(source, key, path, directory=True)
    return path


def check_directory(source: str, key: str, value: Any) -> Path | None:
    """An optional directory (None: not set), else as check_required_directory."""
    return None if value is None else check_required_directory(source, key, value)


def check_listen(source: str, key: str, value: Any) -> str:
    text = check_string(source, key, value)
    host, sep, port = text.rpartition(":")
    # isascii: '²' is a digit to isdigit() but not to int(), and '٣' (Arabic-Indic 3) is one to both.
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ConfigError(source, key, f"expected [host]:port with a port from 1 to 65535, got {text!r}")
    if host.startswith("[") != host.endswith("]"):
        raise ConfigError(source, key, f"unbalanced brackets in IPv6 host {host!r}")
    # A host that can never be bound passed --check-config and then failed every start (exit 1, a restart
    # every 5 s): a space, a stray character. A name that does not resolve at boot still fails only there.
    if host and not _listen_host(host):
        raise ConfigError(source, key, f"host {host!r} is neither an IP address ([...] for IPv6) nor a host name")
    address = ipaddress.ip_address(host[1:-1]) if host.startswith("[") else None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        # An IPv6 socket binds IPv6 only (IPV6_V6ONLY), which no mapped IPv4 address is: every start failed.
        raise ConfigError(source, key, f"{host} is an IPv4 address written as IPv6: listen on it as IPv4")
    return text


# Labels of letters, digits, '-' and '_' (not DNS's, but /etc/hosts and resolvers take it: my_host).
_HOST_NAME: Final = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9_-]{1,63}(?<!-))*\.?")


def _listen_host(host: str) -> bool:
    if host.startswith("["):
        try:
            return isinstance(ipaddress.ip_address(host[1:-1]), ipaddress.IPv6Address)
        except ValueError:
            return False
    try:
        ipaddress.IPv4Address(host)
        return True
    except ValueError:
        return len(host) <= 253 and _HOST_NAME.fullmatch(host) is not None and not host.replace(".", "").isdigit()


def check_telemetry_path(source: str, key: str, value: Any) -> str:
    text = check_string(source, key, value)
    if not text.startswith("/") or text in ("/", "/healthz"):
        raise ConfigError(source, key, f"expected a path starting with / other than / and /healthz, got {text!r}")
    # Requests are routed on the path as sent, without its query: Prometheus percent-encodes what RFC 3986
    # does not allow in a path (Go's url.URL), and '?' and '#' end it. Such a telemetry path would pass
    # here and then answer every scrape with 404.
    if not _PATH_CHARS.fullmatch(text):
        raise ConfigError(
            source, key, f"a request path may hold only letters, digits, '/' and -._~!$&'()*+,;=:@, got {text!r}"
        )
    return text


_PATH_CHARS: Final = re.compile(r"[A-Za-z0-9/\-._~!$&'()*+,;=:@]+")


def logging_level(name: str) -> int:
    """The `logging` level of a LOG_LEVELS name (Prometheus's exporters spell WARNING `warn`)."""
    return {"warn": logging.WARNING}.get(name, getattr(logging, name.upper(), logging.INFO))


def check_log_level(source: str, key: str, value: Any) -> str:
    if value not in LOG_LEVELS:
        raise ConfigError(source, key, f"expected one of {', '.join(LOG_LEVELS)}, got {value!r}{_unquoted_hint(value)}")
    return str(value)


# Below a tenth of a second no device is read in time: every scrape would answer with timeouts only.
MIN_DEADLINE_SECONDS: Final = 0.1


def check_seconds(source: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_DEADLINE_SECONDS <= value <= 300:
        reason = f"expected a number of seconds from {MIN_DEADLINE_SECONDS:g} to 300, got {value!r}"
        raise ConfigError(source, key, reason)
    return float(value)


def _check_int(source: str, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(source, key, f"expected an integer from {low} to {high}, got {value!r}")
    return value


def check_read_threads(source: str, key: str, value: Any) -> int:
    return _check_int(source, key, value, 1, MAX_READ_THREADS)


def check_open_files(source: str, key: str, value: Any) -> int:
    return _check_int(source, key, value, 0, MAX_OPEN_FILES)


# YAML key -> (Config field, validator). The YAML mirrors the flag names: `--web.listen-address`
# is `web: {listen_address: ...}`.
_FIELDS: Final[dict[str, tuple[str, Callable[[str, str, Any], Any]]]] = {
    "web.listen_address": ("listen_address", check_listen),
    "web.telemetry_path": ("telemetry_path", check_telemetry_path),
    "web.config_file": ("web_config_file", check_path),
    "web.scrape_timeout_seconds": ("scrape_timeout", check_seconds),
    "web.read_threads": ("read_threads", check_read_threads),
    "read.max_open_files": ("max_open_files", check_open_files),
    "path.sysfs": ("sysfs", check_required_directory),
    "path.ethtool": ("ethtool_dir", check_directory),
    "devices.include": ("device_include", check_regex),
    "devices.exclude": ("device_exclude", check_regex),
    "log.level": ("log_level", check_log_level),
}
_SECTIONS: Final = frozenset(key.split(".")[0] for key in _FIELDS) | {"collectors", "collector"}
# Path-valued keys: a relative value in the file is relative to the file's directory, as in the web
# config, so a check from another working directory (systemd's is /) resolves it the same way.
_PATH_CHECKS: Final = (check_path, check_directory, check_required_directory)
_PATH_KEYS: Final = frozenset(key for key, (_, check) in _FIELDS.items() if check in _PATH_CHECKS)

# Per-collector setting validators, owned by the collectors they configure: name -> key -> validator.
COLLECTOR_SETTINGS: Final[dict[str, dict[str, Callable[[str, str, Any], Any]]]] = {
    module.NAME: module.SETTINGS for module in (ethtool_collector, expected_collector, netdev_collector)
}


def check_mapping(source: str, key: str, value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(source, key, f"expected a mapping, got {type(value).__name__}")
    for sub in value:
        if not isinstance(sub, str):
            raise ConfigError(source, f"{key}.{sub}", "keys must be strings")
    return value


def parse_config(document: Any, source: str, base: Config | None = None, directory: Path | None = None) -> Config:
    """Validate a parsed YAML document into a Config on top of `base` (the defaults). Relative paths are
    relative to `directory` (the config file's), or to the working directory without one."""
    config = base or Config()
    top = check_mapping(source, "(top level)", document)
    for section in top:
        if section not in _SECTIONS:
            raise ConfigError(source, section, f"unknown section (known: {', '.join(sorted(_SECTIONS))})")
    updates: dict[str, Any] = {}
    for section in sorted(_SECTIONS - {"collectors", "collector"}):
        body = check_mapping(source, section, top.get(section))
        for key, value in body.items():
            dotted = f"{section}.{key}"
            if dotted not in _FIELDS:
                known = ", ".join(sorted(k for k in _FIELDS if k.startswith(section + ".")))
                raise ConfigError(source, dotted, f"unknown key (known: {known})")
            name, validate = _FIELDS[dotted]
            if dotted in _PATH_KEYS and directory is not None and isinstance(value, str) and value:
                value = str(directory / value)  # an absolute value stays as it is
            updates[name] = validate(source, dotted, value)

    enabled = dict(config.collectors)
    for name, value in check_mapping(source, "collectors", top.get("collectors")).items():
        if name not in COLLECTORS:
            raise ConfigError(source, f"collectors.{name}", f"unknown collector (known: {', '.join(COLLECTORS)})")
        if isinstance(value, Mapping) and name in COLLECTOR_SETTINGS:
            # `collectors` and `collector` differ by one letter: say which is which.
            reason = (
                f"expected true or false (this section switches collectors on and off; {name}'s settings go "
                f"under collector.{name})"
            )
            raise ConfigError(source, f"collectors.{name}", reason)
        enabled[name] = check_bool(source, f"collectors.{name}", value)
    updates["collectors"] = enabled

    settings = {name: dict(values) for name, values in config.collector_settings.items()}
    for name, body in check_mapping(source, "collector", top.get("collector")).items():
        switch = f"to switch it on or off: collectors.{name}"  # for a true/false given here by mistake
        if name not in COLLECTOR_SETTINGS:
            known = ", ".join(sorted(COLLECTOR_SETTINGS)) or "none"
            reason = f"no settings for this collector (settings exist for: {known})"
            if name in COLLECTORS and isinstance(body, bool):
                reason += f"; {switch}"
            raise ConfigError(source, f"collector.{name}", reason)
        if isinstance(body, bool):
            reason = f"expected a mapping of {name}'s settings, got {str(body).lower()}; {switch}"
            raise ConfigError(source, f"collector.{name}", reason)
        validators = COLLECTOR_SETTINGS[name]
        for key, value in check_mapping(source, f"collector.{name}", body).items():
            dotted = f"collector.{name}.{key}"
            if key not in validators:
                raise ConfigError(source, dotted, f"unknown key (known: {', '.join(sorted(validators))})")
            settings.setdefault(name, {})[key] = validators[key](source, dotted, value)
    updates["collector_settings"] = settings
    return replace(config, **updates)


# Values a document may hold with its aliases expanded. A shipped config holds a few hundred; a few lines
# of nested aliases ("billion laughs") hold billions, and the repr of one in an error message (`got [...]`)
# took gigabytes: a SIGHUP with such a file could get the running daemon OOM-killed.
MAX_YAML_VALUES: Final = 100_000


def expanded_size(root: yaml.Node) -> int | None:
    """The number of nodes of a composed document with every alias expanded, computed once per distinct
    node, so aliases cost nothing to count; None when a value contains itself through an alias. No setting
    is recursive, and a recursive value under many aliases escapes any count: its repr in an error
    message is as large as the count would have been."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # the current path: visited, children not yet counted
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes and not done:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        if done:
            open_nodes.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            continue
        open_nodes.add(id(node))  # before the check, so that a value holding itself directly is caught
        if any(id(child) in open_nodes for child in children):
            return None
        sizes[id(node)] = 0  # counted when done; marks it as visited meanwhile
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping, where PyYAML keeps the last one: a
    second `devices:` section further down would otherwise silently replace the first. Keys a merge
    (`<<: *defaults`) brings in are not the mapping's own: a key given next to it overrides them, as YAML
    says. It also refuses a document whose aliases expand to more than MAX_YAML_VALUES values."""

    def construct_document(self, node: yaml.Node) -> Any:
        size = expanded_size(node)
        if size is None or size > MAX_YAML_VALUES:
            reason = (
                "an alias refers to a value that contains it"
                if size is None
                else f"its aliases expand to more than {MAX_YAML_VALUES} values"
            )
            raise yaml.constructor.ConstructorError(None, None, reason, node.start_mark)
        return super().construct_document(node)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """SafeConstructor's, with the ValueError of a scalar it resolved but cannot build (an integer of
        more than 4300 digits, a date like 2024-13-45) turned into a YAML error at the node, which names
        its line and column like any other instead of escaping as a traceback."""
        try:
            return super().construct_object(node, deep)
        except ValueError as exc:
            reason = f"cannot read this value: {exc}"
            raise yaml.constructor.ConstructorError(None, None, reason, node.start_mark) from None


def _unique_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # construct_mapping puts its keys before the mapping's own, which so override them
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:
            continue  # unhashable: construct_mapping reports it
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep)  # SafeConstructor's flattens the merges first


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def _integer_without_octal(loader: UniqueKeyLoader, node: yaml.ScalarNode) -> int:
    """YAML 1.1 reads `read_threads: 010` as the octal 8, where the flag reads 10 and YAML 1.2 says 10:
    refused, with the number meant."""
    text = node.value.replace("_", "")
    if re.fullmatch(r"[-+]?0[0-7]+", text):
        reason = f"{node.value} starts with 0, which YAML reads as an octal number ({int(text, 8)}): write it without"
        raise yaml.constructor.ConstructorError(None, None, reason, node.start_mark)
    return int(loader.construct_yaml_int(node))


UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _integer_without_octal)


def load_yaml(text: str) -> Any:
    """One YAML document, with duplicate keys refused (UniqueKeyLoader)."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects


def _yaml_error(source: str, text: str, exc: yaml.YAMLError) -> ConfigError:
    """`file: line N, column M: invalid YAML: reason`, rather than PyYAML's multi-line message about
    "<unicode string>"."""
    if isinstance(exc, yaml.reader.ReaderError):  # a control character: only an offset into the text
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)  # rfind is -1 on the first line
        where = f"line {line}, column {column}"
        character = ord(exc.character) if isinstance(exc.character, str) else exc.character
        problem = f"character #x{character:04x}: {exc.reason}"
    else:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(syntax)"
        problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
    return ConfigError(source, where, f"invalid YAML: {problem}")


# Far above any real config (a few KB); a path to /dev/zero or a log file must not fill memory.
MAX_CONFIG_BYTES: Final = 4 * 2**20


def read_yaml_file(path: Path) -> Any:
    """The one YAML document in `path` (load_yaml), None for an empty file (no bytes, or only comments);
    any problem is a ConfigError naming the file, and a syntax error its line and column. Shared by the
    config and the web config file."""
    source = str(path)
    try:
        text = read_regular_file(path, MAX_CONFIG_BYTES, f"{MAX_CONFIG_BYTES // 2**20} MiB").decode("utf-8")
    except OSError as exc:
        raise file_error(exc)(source, "(file)", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(source, "(file)", "not UTF-8 text") from None
    try:
        return load_yaml(text)
    except RecursionError:  # PyYAML composes and constructs nested values recursively
        raise ConfigError(source, "(file)", "invalid YAML: values nested too deeply") from None
    except yaml.YAMLError as exc:
        raise _yaml_error(source, text, exc) from None


def load_config_file(path: Path, base: Config | None = None) -> Config:
    document = read_yaml_file(path)
    config = parse_config(document, str(path), base, path.absolute().parent)
    return replace(config, config_file=path, config_file_empty=document is None)


def empty_on_reload(running: str) -> str:
    """Why a reload refuses an empty file: `running` is the file whose settings it would drop (a main
    config may name another, empty, web config file than the one running)."""
    return f"empty: taking it would drop the settings running from {running} (write {{}} to mean the defaults)"


def filters_matching_nothing(config: Config) -> list[str]:
    """What is wrong with the device filters on this node: an include that matches none of the devices
    present serves nothing. An exclude that matches none in full but part of one was most often written as
    node_exporter's (a substring: `mlx5_bond`) or as a glob (`mlx5_*`), while these match the whole name:
    it reads the device it was meant to keep away from. One that matches nothing at all is a fleet-wide
    setting for devices this node does not have. Said by the daemon at start and reload, and by
    --check-config, which would otherwise pass a glob the daemon then ignores (review)."""
    try:
        names = sorted(os.listdir(config.sysfs / CLASS_DIR))
    except OSError:
        return []

    def idle(pattern: re.Pattern[str], partly: bool) -> bool:
        whole = any(pattern.fullmatch(name) for name in names)
        return not whole and (not partly or any(pattern.search(name) for name in names))

    present = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return [
        f"{key} {pattern.pattern!r} matches none of the {len(names)} RDMA devices present ({present}): it must "
        "match a whole name, as mlx5_bond_.* does"
        for key, pattern, partly in (
            ("devices.include", config.device_include, False),
            ("devices.exclude", config.device_exclude, True),
        )
        if names and pattern is not None and idle(pattern, partly)
    ]
