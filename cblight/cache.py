"""The per-example cache of an evaluation run: what makes it resumable and re-sweepable.

Append-only JSON lines, one shard per process (``<output_dir>/cache/<task>/<split>/rank<r>.jsonl``), so an
interrupted evaluation resumes where it stopped and a new alpha grid re-sweeps without the model
(docs/design.md, "Runs"). Each row carries the digest of its example's input and a checksum of itself;
``meta.json`` holds the settings that produced the numbers. Never pickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cblight.errors import CblightError
from cblight.results import atomic_write_json, atomic_write_text, jsonable, write_all, write_failure

log = logging.getLogger(__name__)

CACHE_FORMAT = 2  # rows carry a checksum (format 1, before it, had none)


def digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def _row_checksum(row: Mapping[str, Any]) -> str:
    body = {k: v for k, v in row.items() if k != "checksum"}
    return digest(json.dumps(body, sort_keys=True, ensure_ascii=False))


# the options as a user types them (the cache belongs to an evaluator's --model.* options)
_DISCARD = (
    "Choose another --model.output_dir, or add --model.overwrite true (overwrite=True from Python) to discard "
    "the cache"
)


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
        self.signature = {**jsonable(signature), "cache_format": CACHE_FORMAT}
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
            found = None
        if not isinstance(found, dict):
            raise CacheMismatchError(f"cache metadata {meta} is corrupt. {_DISCARD}.")
        if found.get("cache_format") != CACHE_FORMAT:
            raise CacheMismatchError(
                f"the cache in {self.dir} was written by an older cblight, without per-row checksums. "
                f"{_DISCARD} and recompute."
            )
        diff = {k for k in set(found) | set(self.signature) if found.get(k) != self.signature.get(k)}
        if diff:
            detail = "; ".join(
                f"{k}: cached {found.get(k)!r}, now {self.signature.get(k)!r}" for k in sorted(diff)
            )
            raise CacheMismatchError(
                f"the cache in {self.dir} was written under other settings ({detail}). "
                f"{_DISCARD} and recompute."
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
        if type(rec["id"]) is not int:  # a bool is no id
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
                shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
                log.warning("cache %s: %d corrupt row(s) %s (%s)", shard, len(bad), action, shown)
        return out

    def append(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Add rows (each with its checksum) to this process's shard, all or none of them."""
        if not records:
            return
        meta = self.dir / "meta.json"
        if not meta.exists():
            atomic_write_json(meta, self.signature)  # makes the directory
        rows = [jsonable(dict(rec)) for rec in records]
        lines = [
            json.dumps({**row, "checksum": _row_checksum(row)}, ensure_ascii=False) + "\n" for row in rows
        ]
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
                write_all(fd, data)
            except BaseException as err:
                os.ftruncate(fd, start)  # all rows or none: a rerun never reads half a row
                if isinstance(err, OSError):
                    raise write_failure(self.shard, err) from None
                raise
        finally:
            os.close(fd)
