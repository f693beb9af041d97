"""The project's error types, and how an entry point reports them: never a traceback."""

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


def exit_on_bad_input(fn: Any) -> Any:
    """Run ``fn``; bad input (a ``CblightError``, also one jsonargparse wraps while it instantiates a class)
    becomes one line on stderr and exit status 2, a stop by a signal one line and 128 + its number."""
    try:
        return fn()
    except RunInterrupted as stop:
        print(
            f"error: {stop}: finished work is kept (an evaluation's cache, tuning's last checkpoint); "
            "rerun the same command to resume",
            file=sys.stderr,
        )
        raise SystemExit(128 + stop.signum) from None
    except Exception as err:
        bad: BaseException | None = err
        for _ in range(20):
            if bad is None or isinstance(bad, CblightError):
                break
            bad = bad.__cause__ or bad.__context__
        if not isinstance(bad, CblightError):
            raise
        print(f"error: {bad}", file=sys.stderr)
        raise SystemExit(2) from None
