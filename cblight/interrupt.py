"""Stopping a run promptly on SIGINT or SIGTERM (issue 14, case 10).

``stop_on_signals`` installs handlers that raise ``RunInterrupted`` at once, in the middle of a batch if
need be; ``check_interrupt``, called by the evaluation modules before every batch, raises it too should a
library have swallowed the first one. Cache rows are appended all-or-none (``cblight.results``), so the
cache stays consistent and a rerun resumes. The entry point turns ``RunInterrupted`` into one line and exit
status 128 + the signal number (130 for SIGINT, 143 for SIGTERM), as a shell reports a killed command.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_requested: list[int] = []


class RunInterrupted(BaseException):
    """A run stopped by a signal. A BaseException, so no ``except Exception`` on the way swallows it."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def check_interrupt() -> None:
    """Raise ``RunInterrupted`` if a stop was requested (called between batches)."""
    if _requested:
        raise RunInterrupted(_requested[0])


def _handler(signum: int, frame: Any) -> None:
    first = not _requested
    _requested.append(signum)
    if first:
        raise RunInterrupted(signum)


@contextmanager
def stop_on_signals(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise ``RunInterrupted`` (main thread only; elsewhere a no-op).
    Lightning chains its own SIGTERM handler in front of ours while a trainer runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _requested.clear()
    previous = {s: signal.getsignal(s) for s in signals}
    for s in signals:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
