"""The error every configuration check raises, and the checks both the config and the collectors use.

Its own module so that collectors can validate their `collector.<name>` settings without importing the
config module, which imports them.
"""

from __future__ import annotations

import re
import warnings
from typing import Any


class ConfigError(Exception):
    """An invalid setting: `str()` names the source (file or flag), the key and the reason."""

    def __init__(self, source: str, key: str, reason: str) -> None:
        super().__init__(f"{source}: {key}: {reason}")
        self.source = source
        self.key = key
        self.reason = reason


class ConfigUnavailable(ConfigError):
    """A file or directory the configuration names is missing or unreadable, rather than invalid."""


def check_bool(source: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(source, key, f"expected true or false, got {value!r}")
    return value


def compile_regex(source: str, key: str, pattern: str) -> re.Pattern[str]:
    """`pattern` compiled, or a ConfigError that names the setting.

    A warning of the compiler refuses the pattern too: it means the pattern does not say what it seems
    to. `[[:digit:]]`, a digit in RE2 (node_exporter's and Prometheus's engine), is here a set of the
    characters `:digt` followed by `]`, and only a FutureWarning said so. A repeat count or a nesting
    too large for the compiler raises OverflowError or RecursionError, which were tracebacks."""
    # FutureWarning only: the filter is the process's, and a reload compiles on its own thread while the
    # HTTP and reader threads run.
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        try:
            return re.compile(pattern)
        except (re.error, Warning, OverflowError, RecursionError) as exc:
            reason = str(exc) if not isinstance(exc, RecursionError) else "nested too deeply"
            if "[:" in pattern:
                reason += "; POSIX classes such as [[:digit:]] are not supported: write [0-9]"
            raise ConfigError(source, key, f"invalid regular expression {pattern!r}: {reason}") from None
