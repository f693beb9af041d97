"""Raw benchmark records from the Hugging Face Hub or from local files, with their provenance.

Every record carries ``where`` (file and line, or hub id and row) so that a bad record produces an error
naming the file, the line and the field. Hub loading goes through ``datasets.load_dataset``; ``path`` may be
a local directory laid out like the hub repository (that is how tests exercise the hub path offline).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cblight.data.examples import DataError


@dataclass(frozen=True)
class SourceRecord:
    """One raw record (a mapping of fields) and where it came from."""

    fields: Mapping[str, Any]
    where: str

    def get(self, name: str, task: str, kinds: type | tuple[type, ...] = (str,)) -> Any:
        """The field ``name``; a clear ``DataError`` when it is missing, null or of the wrong type."""
        if name not in self.fields or self.fields[name] is None:
            raise DataError(f"{task}: record at {self.where} has no field {name!r}")
        value = self.fields[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in _as_tuple(kinds)):
            expected = " or ".join(t.__name__ for t in _as_tuple(kinds))
            raise DataError(
                f"{task}: field {name!r} at {self.where} should be {expected}, got {type(value).__name__} {value!r}"
            )
        return value


def _as_tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


Reader = Callable[[Path], list[SourceRecord]]


def read_jsonl(path: Path) -> list[SourceRecord]:
    """One JSON object per line; blank lines are skipped; a malformed line is an error naming it."""
    records = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path} line {lineno} is not valid JSON: {err.msg}") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path} line {lineno} is not a JSON object")
            records.append(SourceRecord(obj, f"{path} line {lineno}"))
    return records


def read_csv(path: Path, required_columns: Sequence[str] = ()) -> list[SourceRecord]:
    """A CSV file with a header row."""
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        missing = [c for c in required_columns if c not in header]
        if missing:
            raise DataError(f"{path} has no column {missing[0]!r} (header: {header})")
        return [SourceRecord(row, f"{path} line {reader.line_num}") for row in reader]


@dataclass(frozen=True)
class HubSplit:
    """A split on the Hub: ``load_dataset(path, name, split=split)``."""

    path: str
    name: str | None
    split: str


@dataclass(frozen=True)
class LocalFiles:
    """Where a split lives inside a user's ``data_dir`` (first existing candidate wins), and its reader."""

    files: Mapping[str, tuple[str, ...]]
    reader: Reader = read_jsonl
    hint: str = ""  # what the user should put in data_dir, for error messages


@dataclass(frozen=True)
class DataSource:
    """Hub splits (logical split name -> ``HubSplit``) and the local layout of a benchmark."""

    hub: Mapping[str, HubSplit] = field(default_factory=dict)
    local: LocalFiles | None = None
    hub_refusal: str = (
        ""  # non-empty when the hub copy cannot be loaded (e.g. a loading script): why and what to do
    )


def _hub_records(task: str, split: str, source: HubSplit) -> list[SourceRecord]:
    import datasets

    label = source.path + (f" ({source.name})" if source.name else "")
    try:
        ds = datasets.load_dataset(source.path, source.name, split=source.split)
    except Exception as err:  # datasets raises many types (connection, not-found, script refusal)
        text = str(err)
        if "script" in text.lower():
            why = "it needs a loading script, which datasets refuses"
        else:
            why = f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"
        raise DataError(
            f"{task}: cannot load split {split!r} from {label}: {why}. Pass local copies with "
            f"data_dir/data_files instead."
        ) from None
    return [SourceRecord(row, f"{label} {source.split} row {i}") for i, row in enumerate(ds)]


def iter_candidates(local: LocalFiles, split: str, data_dir: Path) -> Iterator[Path]:
    for pattern in local.files.get(split, ()):
        yield from sorted(data_dir.glob(pattern))


def load_split_records(
    task: str,
    split: str,
    source: DataSource,
    *,
    data_dir: str | Path | None = None,
    data_file: str | Path | None = None,
) -> list[SourceRecord]:
    """Raw records of ``split``: from ``data_file``, else from ``data_dir``, else from the Hub."""
    local = source.local
    if data_file is not None:
        path = Path(data_file).expanduser()
        if not path.is_file():
            raise DataError(f"{task}: data file for split {split!r} not found: {path}")
        if local is None:
            raise DataError(f"{task}: this task has no local file reader")
        return local.reader(path)
    if data_dir is not None:
        root = Path(data_dir).expanduser()
        if not root.is_dir():
            raise DataError(f"{task}: data_dir {root} is not a directory")
        if local is None:
            raise DataError(f"{task}: this task has no local file reader; remove its data_dir")
        for path in iter_candidates(local, split, root):
            return local.reader(path)
        looked = ", ".join(local.files.get(split, ())) or "nothing (no local layout for this split)"
        hint = f" {local.hint}" if local.hint else ""
        raise DataError(f"{task}: no file for split {split!r} in {root} (looked for {looked}).{hint}")
    if source.hub_refusal:
        raise DataError(f"{task}: {source.hub_refusal}")
    if split not in source.hub:
        raise DataError(f"{task}: split {split!r} is not available on the Hub; pass data_dir/data_files")
    return _hub_records(task, split, source.hub[split])
