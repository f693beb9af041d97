"""Writing results: atomic files, the resumable per-example cache, summary tables and alpha-curve plots.

Every final file is written to a temporary name and moved into place (``os.replace``), so a crash never
leaves a half-written ``results.json``. The per-example cache is append-only JSON lines, one shard per
process, so an interrupted evaluation resumes where it stopped and a new alpha grid re-sweeps without the
model (DESIGN.md §2, issue "Foundation" item 5). Never pickle.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cblight.errors import CblightError


def _tmp_path(path: Path) -> tuple[int, str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)


def atomic_write_text(path: str | Path, text: str) -> Path:
    path = Path(path)
    fd, tmp = _tmp_path(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
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


def atomic_write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    return atomic_write_text(path, "".join(json.dumps(_jsonable(r), ensure_ascii=False) + "\n" for r in rows))


def digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


class CacheMismatchError(CblightError):
    """A cache directory written by a different model or grid."""


class RecordCache:
    """Per-example results of one (task, split), append-only, one JSONL shard per process.

    ``meta.json`` holds the signature (model, dtype, grid for next-token tasks, ...): a cache written under
    another signature is refused with a clear error, not silently mixed. Each record stores the digest of the
    example's input; a record whose input changed is recomputed.
    """

    def __init__(self, directory: str | Path, signature: Mapping[str, Any], rank: int = 0):
        self.dir = Path(directory)
        self.signature = dict(_jsonable(signature))
        self.rank = rank

    @property
    def shard(self) -> Path:
        return self.dir / f"rank{self.rank}.jsonl"

    def check(self) -> None:
        meta = self.dir / "meta.json"
        if not meta.exists():
            return
        try:
            found = json.loads(meta.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            raise CacheMismatchError(f"cache metadata {meta} is corrupt; delete {self.dir}") from None
        diff = {k for k in set(found) | set(self.signature) if found.get(k) != self.signature.get(k)}
        if diff:
            detail = "; ".join(
                f"{k}: cached {found.get(k)!r}, now {self.signature.get(k)!r}" for k in sorted(diff)
            )
            raise CacheMismatchError(
                f"the cache in {self.dir} was written under other settings ({detail}). "
                "Use another output_dir, or overwrite=true to discard it."
            )

    def load(self) -> dict[int, dict[str, Any]]:
        """All cached records by example id (every shard; a torn last line is ignored). An example scored again
        (new input, or a comparison method added) appends a complete record; the last one wins."""
        self.check()
        out: dict[int, dict[str, Any]] = {}
        if not self.dir.is_dir():
            return out
        for shard in sorted(self.dir.glob("rank*.jsonl")):
            with open(shard, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # interrupted mid-write
                    out[int(rec["id"])] = rec  # a later record of an example supersedes an earlier one
        return out

    def append(self, records: Sequence[Mapping[str, Any]]) -> None:
        if not records:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = self.dir / "meta.json"
        if not meta.exists():
            atomic_write_json(meta, self.signature)
        with open(self.shard, "a", encoding="utf-8") as fh:
            for rec in records:
                fh.write(json.dumps(_jsonable(rec), ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


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
    alpha = -1 (unconditional normalisation), and the chosen alpha* marked."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, ys in curves.items():
        bold = highlight is None or label == highlight
        ax.plot(
            alphas,
            [100 * y for y in ys],
            label=label,
            linewidth=2.0 if bold else 0.8,
            alpha=1 if bold else 0.5,
        )
    ax.axvline(0.0, color="red", linewidth=1, label="alpha = 0 (base)")
    if min(alphas) <= -1.0 <= max(alphas):
        ax.axvline(-1.0, color="blue", linewidth=1, linestyle=":", label="alpha = -1")
    if chosen_alpha is not None:
        ax.axvline(
            chosen_alpha, color="green", linewidth=1, linestyle="--", label=f"alpha* = {chosen_alpha:g}"
        )
    ax.set_xlabel("alpha")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def save_figure(fig: Any, path: str | Path, dpi: int = 100) -> Path:
    """Write a matplotlib figure as PNG atomically, then close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fd, tmp = _tmp_path(path)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=dpi)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)
    return path
