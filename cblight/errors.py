"""The project's error types: bad input, said in one line that names what is at fault."""

__all__ = ["BoostingError", "CblightError", "ConfigError", "DataError"]


class CblightError(ValueError):
    """Bad input: a message that names the option, file, field or record at fault (docs/errors.md lists them).

    Every refusal of bad input is one; it is a ``ValueError``, so code that catches those keeps working.

    Examples:
        >>> from cblight.options import Boosting
        >>> try:
        ...     Boosting(k=0)
        ... except CblightError as err:
        ...     print(err)
        Boosting.k must be an integer >= 1, got 0
    """


class ConfigError(CblightError):
    """An invalid option value (an empty grid, k < 1, ...)."""


class DataError(CblightError):
    """Bad or missing evaluation data; the message names the task, the file or split, and the field."""


class BoostingError(CblightError):
    """A boosting configuration or prompt that cannot be decoded (names the offending option)."""
