"""The project's error types: bad input, said in one line that names what is at fault."""

__all__ = ["BoostingError", "CblightError", "ConfigError", "DataError"]


class CblightError(ValueError):
    """Bad input: a message that names the option, file, field or record at fault."""


class ConfigError(CblightError):
    """An invalid option value (an empty grid, k < 1, ...)."""


class DataError(CblightError):
    """Bad or missing evaluation data; the message names the task, the file or split, and the field."""


class BoostingError(CblightError):
    """A boosting configuration or prompt that cannot be decoded (names the offending option)."""
