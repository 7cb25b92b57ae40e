"""rdma-exporter: Prometheus metrics for InfiniBand and RoCE fabrics."""

from __future__ import annotations

import signal
from types import FrameType

__version__ = "0.1.0"

# SIGHUPs that came while the exporter was starting, before the daemon's own handler was in place.
_early_sighups: list[int] = []


def _note_sighup(signum: int, frame: FrameType | None) -> None:
    _early_sighups.append(signum)


def take_early_sighup() -> bool:
    """Whether a SIGHUP came during start-up (and forget it): the daemon reloads once it serves."""
    came = bool(_early_sighups)
    _early_sighups.clear()
    return came


def main() -> int:
    """The `rdma-exporter` command and `python -m rdma_exporter`.

    SIGHUP is taken over before anything is imported: its default action ends the process, and
    systemd's Restart=on-failure counts a death by SIGHUP as a clean exit, so a reload sent while the
    exporter starts (about half a second) would leave it down for good. SIGUSR1 and SIGUSR2, which it does
    not use, are ignored from here on: their default action ends the process without a word (the daemon
    logs them once it serves).
    """
    signal.signal(signal.SIGHUP, _note_sighup)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    from .cli import main as run_command_line

    return run_command_line()
