"""The project's error types. Entry points print these as one clear line (exit status 2), not a traceback."""


class CblightError(ValueError):
    """Bad input: a message that names the option, file, field or record at fault."""


class ConfigError(CblightError):
    """An invalid option value (an empty grid, k < 1, ...)."""
