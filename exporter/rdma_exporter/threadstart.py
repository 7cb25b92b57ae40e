"""Starting a thread that the caller retries later, logged once per run of failures."""

from __future__ import annotations

import logging
import threading


class RetriedStart:
    """Starts threads of one kind; a failure is logged once until a start succeeds again.

    Out of tasks or memory (the unit's TasksMax=, MemoryMax=), `Thread.start` raises RuntimeError. The
    callers try again on their own clock (the watchdog every 20 ms, the server loop every tick), so a line
    per failed try would flood the journal with the same news.
    """

    def __init__(self, logger: logging.Logger, failed: str, started: str) -> None:
        self._log = logger
        self._failed = failed  # a warning; its %s is the error
        self._started = started  # logged at info when a start succeeds after failures
        self.failing = False

    def start(self, thread: threading.Thread) -> bool:
        """Start `thread`; False (and the warning, the first time) if it cannot start."""
        try:
            thread.start()
        except RuntimeError as exc:
            if not self.failing:
                self._log.warning(self._failed, exc)
            self.failing = True
            return False
        if self.failing:
            self._log.info(self._started)
        self.failing = False
        return True
