"""Writing results: atomic files, the resumable per-example cache, summary tables and alpha-curve plots.

Every final file is written to a temporary name and moved into place (``os.replace``), so a crash never
leaves a half-written ``results.json``. The per-example cache is append-only JSON lines, one shard per
process, so an interrupted evaluation resumes where it stopped and a new alpha grid re-sweeps without the
model (DESIGN.md §2, issue "Foundation" item 5). Never pickle.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cblight.errors import CblightError

log = logging.getLogger(__name__)

CACHE_FORMAT = 2  # rows carry a checksum (format 1, before it, had none)


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


def _write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to ``fd`` (``os.write`` may write fewer), then to the disk."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


def _tmp_path(path: Path) -> tuple[int, str]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise write_failure(path, err) from None


def atomic_write_text(path: str | Path, text: str) -> Path:
    """``text`` written to a temporary file beside ``path`` and moved into place: ``path`` is either the
    old file or the whole new one, and a failed write (disk full) leaves no temporary file behind."""
    path = Path(path)
    fd, tmp = _tmp_path(path)
    try:
        try:
            _write_all(fd, text.encode("utf-8"))
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise write_failure(path, err) from None
        raise
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    return value


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(_jsonable(obj), indent=2, ensure_ascii=False) + "\n")


def write_run_results(
    output_dir: Path, settings: Mapping[str, Any], summary: str, tasks: Mapping[str, Any], started: float
) -> Path:
    """``<output_dir>/results.json`` of a run, atomically: cblight's version, the run's settings, its wall
    time, the printed summary and every task's result."""
    from cblight import __version__

    payload = {
        "cblight_version": __version__,
        **settings,
        "seconds": round(time.time() - started, 1),
        "summary": summary,
        "tasks": tasks,
    }
    return atomic_write_json(Path(output_dir) / "results.json", payload)


def atomic_write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    return atomic_write_text(path, "".join(json.dumps(_jsonable(r), ensure_ascii=False) + "\n" for r in rows))


def digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def _row_checksum(row: Mapping[str, Any]) -> str:
    body = {k: v for k, v in row.items() if k != "checksum"}
    return digest(json.dumps(body, sort_keys=True, ensure_ascii=False))


class CacheMismatchError(CblightError):
    """A cache directory written by a different model or grid."""


class RecordCache:
    """Per-example results of one (task, split), append-only, one JSONL shard per process.

    ``meta.json`` holds the signature (model, dtype, grid for next-token tasks, ...): a cache written under
    another signature is refused with a clear error, not silently mixed. Each record stores the digest of the
    example's input (a record whose input changed is recomputed) and a checksum of itself: a row edited by
    hand, torn by an interrupted write or missing one of ``fields`` is reported, dropped from the shard and
    its example recomputed. An append that fails (disk full) is cut back, so the shard never ends in half
    a row.
    """

    def __init__(
        self,
        directory: str | Path,
        signature: Mapping[str, Any],
        rank: int = 0,
        fields: Sequence[str] = ("id",),
    ):
        self.dir = Path(directory)
        self.signature = {**_jsonable(signature), "cache_format": CACHE_FORMAT}
        self.rank = rank
        self.fields = tuple(dict.fromkeys(("id", *fields)))
        self.problems: list[str] = []

    @property
    def shard(self) -> Path:
        return self.dir / f"rank{self.rank}.jsonl"

    def check(self) -> None:
        meta = self.dir / "meta.json"
        if not meta.exists():
            return
        try:
            found = json.loads(meta.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CacheMismatchError(f"cache metadata {meta} is corrupt; delete {self.dir}") from None
        if not isinstance(found, dict):
            raise CacheMismatchError(f"cache metadata {meta} is corrupt; delete {self.dir}")
        if found.get("cache_format") != CACHE_FORMAT:
            raise CacheMismatchError(
                f"the cache in {self.dir} was written by an older cblight, without per-row checksums. "
                "Use another output_dir, or overwrite=true to discard it and recompute."
            )
        diff = {k for k in set(found) | set(self.signature) if found.get(k) != self.signature.get(k)}
        if diff:
            detail = "; ".join(
                f"{k}: cached {found.get(k)!r}, now {self.signature.get(k)!r}" for k in sorted(diff)
            )
            raise CacheMismatchError(
                f"the cache in {self.dir} was written under other settings ({detail}). "
                "Use another output_dir, or overwrite=true to discard it."
            )

    def _parse_row(self, line: str) -> tuple[dict[str, Any] | None, str]:
        """The record of a shard line, or why it is corrupt."""
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            return None, "not a JSON row (torn by an interrupted write, or edited)"
        if not isinstance(rec, dict):
            return None, "not a JSON object"
        missing = [f for f in self.fields if f not in rec]
        if missing:
            return None, f"no field {missing[0]!r}"
        if not isinstance(rec["id"], int) or isinstance(rec["id"], bool):
            return None, f"id {rec['id']!r} is not an integer"
        if rec.get("checksum") != _row_checksum(rec):
            return None, "checksum mismatch (the row was changed after it was written)"
        return rec, ""

    def load(self) -> dict[int, dict[str, Any]]:
        """All valid cached records by example id, from every shard. Corrupt rows are reported (a warning
        naming file, line and cause; ``self.problems``), ignored, and removed from this process's own shard.
        An example scored again (new input, or a comparison method added) appends a complete record: the
        last one wins."""
        self.check()
        self.problems = []
        out: dict[int, dict[str, Any]] = {}
        if not self.dir.is_dir():
            return out
        for shard in sorted(self.dir.glob("rank*.jsonl")):
            kept: list[str] = []
            bad: list[str] = []
            with open(shard, encoding="utf-8", errors="replace") as fh:
                for lineno, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    rec, why = self._parse_row(line)
                    if rec is None:
                        bad.append(f"line {lineno}: {why}")
                        continue
                    kept.append(line if line.endswith("\n") else line + "\n")
                    out[rec["id"]] = rec  # a later record of an example supersedes an earlier one
            if bad:
                self.problems += [f"{shard} {b}" for b in bad]
                action = "removed from it; their examples are recomputed"
                if shard == self.shard:
                    atomic_write_text(shard, "".join(kept))
                else:
                    action = "ignored; their examples are recomputed unless another row holds them"
                log.warning(
                    "cache %s: %d corrupt row(s) %s (%s)",
                    shard,
                    len(bad),
                    action,
                    "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else ""),
                )
        return out

    def append(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Add rows (each with its checksum) to this process's shard, all or none of them."""
        if not records:
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise write_failure(self.dir, err) from None
        meta = self.dir / "meta.json"
        if not meta.exists():
            atomic_write_json(meta, self.signature)
        lines = []
        for rec in records:
            row = _jsonable(dict(rec))
            row["checksum"] = _row_checksum(row)
            lines.append(json.dumps(row, ensure_ascii=False) + "\n")
        data = "".join(lines).encode("utf-8")
        try:
            fd = os.open(self.shard, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as err:
            raise write_failure(self.shard, err) from None
        try:
            start = os.fstat(fd).st_size
            if start and os.pread(fd, 1, start - 1) != b"\n":
                data = b"\n" + data  # a row torn by a kill stays alone on its line (reported, not merged)
            try:
                _write_all(fd, data)
            except BaseException as err:
                os.ftruncate(fd, start)  # all rows or none: a rerun never reads half a row
                if isinstance(err, OSError):
                    raise write_failure(self.shard, err) from None
                raise
        finally:
            os.close(fd)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width table."""
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def save_alpha_plot(
    path: str | Path,
    title: str,
    alphas: Sequence[float],
    curves: Mapping[str, Sequence[float]],
    *,
    highlight: str | None = None,
    chosen_alpha: float | None = None,
    ylabel: str = "accuracy (%)",
) -> Path:
    """Accuracy vs alpha, as the paper's Figures 2 and 4-6: red line at alpha = 0 (the base model), blue at
    alpha = -1 (unconditional normalisation), and the chosen alpha* marked. The legend sits outside the
    axes (never over the title or the curves); the y-axis spans the data with a margin, at least 2 points,
    so an all-zero curve is a flat line at the bottom rather than a band around 0."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4))
    values = [100 * y for ys in curves.values() for y in ys]
    for label, ys in curves.items():
        bold = highlight is None or label == highlight
        ax.plot(
            alphas,
            [100 * y for y in ys],
            label=label,
            linewidth=2.0 if bold else 0.9,
            alpha=1 if bold else 0.6,
        )
    ax.axvline(0.0, color="red", linewidth=1, label="alpha = 0 (base)")
    if min(alphas) <= -1.0 <= max(alphas):
        ax.axvline(-1.0, color="blue", linewidth=1, linestyle=":", label="alpha = -1")
    if chosen_alpha is not None:
        ax.axvline(
            chosen_alpha, color="green", linewidth=1, linestyle="--", label=f"alpha* = {chosen_alpha:g}"
        )
    ax.set_ylim(*_accuracy_limits(values))
    if values and all(v == 0 for v in values):
        ax.text(0.5, 0.5, "every accuracy is 0%", transform=ax.transAxes, ha="center", color="gray")
    ax.set_xlabel("alpha")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def _accuracy_limits(values: Sequence[float]) -> tuple[float, float]:
    """Y limits (in %) around ``values``: a 10% margin, at least 2 points tall, within [0, 100] (a sliver
    below 0 so that a curve at 0 shows)."""
    finite = [v for v in values if math.isfinite(v)] or [0.0]
    low, high = min(finite), max(finite)
    pad = max(0.1 * (high - low), 1.0)
    low, high = max(0.0, low - pad), min(100.0, high + pad)
    if high - low < 2.0:
        high = min(100.0, low + 2.0)
        low = min(low, high - 2.0)
    if low == 0.0:  # a curve at 0 would hide under the axis line
        low = -0.03 * high
    return low, high


def save_figure(fig: Any, path: str | Path, dpi: int = 100) -> Path:
    """Write a matplotlib figure as PNG atomically, then close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fd, tmp = _tmp_path(path)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=dpi)
        os.replace(tmp, path)
    except OSError as err:
        raise write_failure(path, err) from None
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)
    return path
