"""Writing a run's final files: atomically, in plain formats (JSON, JSON lines, PNG), never pickled.

Every file is written to a temporary name beside its destination and moved into place (``os.replace``),
so a crash never leaves a half-written ``results.json``; a failed write (disk full, read-only file system)
becomes one ``OutputWriteError`` line that says so. ``format_table`` writes the fixed-width tables every
command prints, ``save_figure`` a matplotlib figure; ``results.json`` itself is ``Evaluator.write_results``.
The per-example cache that makes runs resumable is ``cblight.cache``.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cblight.errors import CblightError


class OutputWriteError(CblightError):
    """A result or cache file that cannot be written (disk full, read-only file system, permissions)."""


def write_failure(path: Path, err: OSError) -> OutputWriteError:
    """One clear line for a failed write: what, where, and that nothing half-written was kept."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        why = "no space left on device" if err.errno == errno.ENOSPC else "disk quota exceeded"
        return OutputWriteError(
            f"{why} while writing {path}: free some space and rerun the same command (finished examples "
            "stay in the cache and are not recomputed; nothing half-written was kept)"
        )
    if err.errno == errno.EROFS:
        return OutputWriteError(f"cannot write {path}: read-only file system (choose another output_dir)")
    return OutputWriteError(f"cannot write {path}: {err.strerror or err}")


def write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to ``fd`` (``os.write`` may write fewer), then to the disk."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


def atomic_write_text(path: str | Path, text: str | bytes) -> Path:
    """``text`` (or bytes) written to a temporary file beside ``path`` and moved into place: ``path`` is
    either the old file or the whole new one, and a failed write (disk full) leaves no temporary file
    behind."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")  # each writer its own (ranks, hosts)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # 0o666 less the umask: the mode any new file gets (0644 under umask 022), not mkstemp's private 0600
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as err:
        raise write_failure(path, err) from None
    try:
        try:
            write_all(fd, text.encode("utf-8") if isinstance(text, str) else text)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise write_failure(path, err) from None
        raise
    return path


def jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return jsonable(value.tolist())
    return value


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(jsonable(obj), indent=2, ensure_ascii=False) + "\n")


def atomic_write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    return atomic_write_text(path, "".join(json.dumps(jsonable(r), ensure_ascii=False) + "\n" for r in rows))


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width table: ``-`` for ``None``, floats to two decimals."""
    cells = [[str(h) for h in headers]] + [
        ["-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v) for v in row] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def save_figure(fig: Any, path: str | Path, dpi: int = 100) -> Path:
    """Write a matplotlib figure as PNG atomically, then close it."""
    import matplotlib.pyplot as plt

    png = io.BytesIO()
    try:
        fig.savefig(png, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return atomic_write_text(path, png.getvalue())
