"""The project's error types, and how an entry point reports them: bad input as one clear line (exit status
2), a run stopped by a signal as one line and ``128 + signal`` (``exit_on_bad_input``), never a traceback."""

from __future__ import annotations

import signal
import sys
from typing import Any


class CblightError(ValueError):
    """Bad input: a message that names the option, file, field or record at fault."""


class ConfigError(CblightError):
    """An invalid option value (an empty grid, k < 1, ...)."""


class DataError(CblightError):
    """Bad or missing evaluation data; the message names the task, the file or split, and the field."""


class BoostingError(CblightError):
    """A boosting configuration or prompt that cannot be decoded (names the offending option)."""


class RunInterrupted(BaseException):
    """A run stopped by a signal. A BaseException, so no ``except Exception`` on the way swallows it."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _bad_input(err: BaseException | None) -> CblightError | None:
    """The ``CblightError`` behind ``err``: jsonargparse wraps errors raised while it instantiates a class."""
    for _ in range(20):
        if err is None or isinstance(err, CblightError):
            return err
        err = err.__cause__ or err.__context__
    return None


def exit_on_bad_input(fn: Any) -> Any:
    """Run ``fn``; bad input (``CblightError``) becomes one line on stderr and exit status 2, a stop by
    SIGINT/SIGTERM one line and status 128 + the signal number."""
    try:
        return fn()
    except RunInterrupted as stop:
        print(
            f"error: {stop}: finished examples are kept in the cache; rerun the same command to resume",
            file=sys.stderr,
        )
        raise SystemExit(stop.exit_code) from None
    except Exception as err:
        bad = _bad_input(err)
        if bad is None:
            raise
        print(f"error: {bad}", file=sys.stderr)
        raise SystemExit(2) from None
