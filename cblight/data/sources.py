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
from cblight.option_types import describe, fits


class MissingDataError(DataError):
    """A split whose data cannot be found: no local file, no loadable Hub copy."""


@dataclass(frozen=True)
class SourceRecord:
    """One raw record (a mapping of fields) and where it came from."""

    fields: Mapping[str, Any]
    where: str

    def get(self, name: str, task: str, hint: Any = str) -> Any:
        """The field ``name``; a clear ``DataError`` when it is missing, null or not of type ``hint``."""
        value = self.fields.get(name)
        if value is None:
            raise DataError(f"{task}: record at {self.where} has no field {name!r}")
        if not fits(hint, value):
            raise DataError(
                f"{task}: field {name!r} at {self.where} should be {describe(hint)}, got {type(value).__name__} {value!r}"
            )
        return value

    # Typed readers of the fields task specs parse: labels in their several on-disk spellings, each failure a
    # ``DataError`` naming the task, the record (file and line, or hub row) and the field.
    def integer(self, name: str, task: str) -> int:
        """An integer field that may be stored as a number or as text (CSV cells)."""
        value = self.get(name, task, int | str)
        try:
            return int(value)
        except ValueError:
            raise DataError(
                f"{task}: field {name!r} at {self.where} is not a whole number: {value!r}"
            ) from None

    def label(self, name: str, task: str, spellings: Sequence[tuple[Any, int]]) -> int:
        """The answer index of a label written in any of ``spellings`` (``(label, index)`` pairs: hub ints,
        jsonl strings or booleans). Pairs, not a dict: ``False`` and ``0`` are equal keys in a dict, and a
        boolean label must match only a boolean spelling."""
        value = self.get(name, task, int | str | bool)
        key = value.strip() if isinstance(value, str) else value
        for candidate, index in spellings:
            if type(candidate) is type(key) and candidate == key:
                return index
        allowed = ", ".join(repr(k) for k, _ in spellings)
        raise DataError(
            f"{task}: field {name!r} at {self.where} is {value!r}, not one of the answer labels ({allowed}); "
            "an unlabelled test split?"
        )

    def key_index(
        self, name: str, task: str, keys: Sequence[str], normalize: Callable[[str], str] = str
    ) -> int:
        """Position of an answer key (``"A"``..) in ``keys``, after ``normalize`` (ARC's ``"1"`` -> ``"A"``)."""
        value = normalize(str(self.get(name, task, str | int)).strip())
        if value not in keys:
            raise DataError(
                f"{task}: field {name!r} at {self.where} is {value!r}, not one of the choice labels "
                f"{list(keys)}; an unlabelled test split?"
            )
        return list(keys).index(value)

    def qa_fields(self, task: str, stem_field: str) -> tuple[str, list[str], list[str]]:
        """``(question, choice texts, choice labels)`` of a lettered QA self in either of its two schemas:
        the hub's (``stem_field`` a string, ``choices = {"text": [...], "label": [...]}``) or the original
        jsonl's (``question = {"stem": ..., "choices": [{"text": ..., "label": ...}, ...]}``; CommonsenseQA,
        OpenBookQA and ARC are all distributed that way)."""
        question = self.fields.get("question")
        if isinstance(question, dict):
            nested = SourceRecord(question, self.where)
            stem, choices = nested.get("stem", task), nested.get("choices", task, list)
            if not all(isinstance(c, dict) and "text" in c and "label" in c for c in choices):
                raise DataError(
                    f"{task}: question.choices at {self.where} should hold {{'text', 'label'}} objects"
                )
            texts, labels = [c["text"] for c in choices], [c["label"] for c in choices]
        else:
            stem, choices = self.get(stem_field, task), self.get("choices", task, dict)
            texts, labels = choices.get("text"), choices.get("label")
            if not isinstance(texts, list) or not isinstance(labels, list) or len(texts) != len(labels):
                raise DataError(
                    f"{task}: field 'choices' at {self.where} should be {{'text': [...], 'label': [...]}} of equal length"
                )
        if not texts:
            field = "question.choices" if isinstance(question, dict) else "choices"
            raise DataError(f"{task}: field {field!r} at {self.where} has no choices (an empty list)")
        return stem, [str(t) for t in texts], [str(lab) for lab in labels]


Reader = Callable[[Path], list[SourceRecord]]


def json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of every non-blank line of a JSON-lines file; a malformed line is an error
    naming the file and the line."""
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path} line {lineno} is not valid JSON: {err.msg}") from None


def read_jsonl(path: Path) -> list[SourceRecord]:
    """One JSON object per line; blank lines are skipped; a malformed line is an error naming it."""
    records = []
    for lineno, obj in json_lines(path):
        if not isinstance(obj, dict):
            raise DataError(f"{path} line {lineno} is not a JSON object")
        records.append(SourceRecord(obj, f"{path} line {lineno}"))
    return records


def read_csv(
    path: Path, required_columns: Sequence[str] = (), headerless: Sequence[str] | None = None
) -> list[SourceRecord]:
    """A CSV file with a header row; or, with ``headerless``, one whose first row is data (the original AG
    News CSVs have none): those column names are then used for every row."""
    with open(path, encoding="utf-8", newline="") as fh:
        rows = csv.reader(fh)
        header = next(rows, None) or []
        if headerless is not None and header and [h.strip() for h in header] != list(headerless):
            fh.seek(0)
            rows = csv.reader(fh)
            header = list(headerless)
        missing = [c for c in required_columns if c not in header]
        if missing:
            raise DataError(f"{path} has no column {missing[0]!r} (header: {header})")
        records = []
        for row in rows:
            if not row:
                continue
            if len(row) != len(header):
                raise DataError(
                    f"{path} line {rows.line_num} has {len(row)} fields, expected {len(header)} ({header})"
                )
            records.append(SourceRecord(dict(zip(header, row)), f"{path} line {rows.line_num}"))
        return records


def read_records(path: Path) -> list[SourceRecord]:
    """A local copy in the hub schema, by suffix: jsonl (one object per line), csv, or parquet as the Hub
    stores it (``<split>-00000-of-00001.parquet``, one record per row)."""
    if path.suffix in (".jsonl", ".json"):
        return read_jsonl(path)
    if path.suffix == ".csv":
        return read_csv(path)
    if path.suffix != ".parquet":
        raise DataError(f"{path}: unknown file type {path.suffix!r} (expected .jsonl, .parquet or .csv)")
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises several types for a corrupt or non-parquet file
        raise DataError(f"{path} is not a readable parquet file: {err}") from None
    return [SourceRecord(row, f"{path} row {i}") for i, row in enumerate(rows)]


def read_text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` pairs with the newline kept. Lines are UTF-8; a line that is not (the TREC
    training file has a Latin-1 byte) is decoded as Latin-1, which never fails, rather than dropped."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError:
                yield lineno, raw.decode("latin-1")


def hub_layout(*splits: str) -> tuple[str, ...]:
    """File patterns of a local copy of a hub split (its jsonl export or the repo's parquet files)."""
    return tuple(
        p for s in splits for p in (f"{s}.jsonl", f"{s}-*.parquet", f"data/{s}-*.parquet", f"{s}.parquet")
    )


@dataclass(frozen=True)
class HubSplit:
    """A split on the Hub: ``load_dataset(path, name, split=split)``."""

    path: str
    name: str | None
    split: str


@dataclass(frozen=True)
class LocalFiles:
    """Where a split lives inside a user's ``data_dir``, and its reader.

    ``files`` maps a split to glob patterns relative to ``data_dir``: the first existing match wins. With
    ``combine`` every pattern of the split must match and the records of all matches are concatenated in
    pattern order (LAMA: one file per relation); a pattern matching nothing is then an error.
    """

    files: Mapping[str, tuple[str, ...]]
    reader: Reader = read_records
    hint: str = ""  # what the user should put in data_dir, for error messages
    combine: bool = False


@dataclass(frozen=True)
class DataSource:
    """The local layout of a benchmark (every task reads local files) and its Hub splits (logical split name
    -> ``HubSplit``); ``hub_refusal``, when not empty, says why the hub copy cannot be loaded (e.g. a loading
    script) and what to do."""

    local: LocalFiles
    hub: Mapping[str, HubSplit] = field(default_factory=dict)
    hub_refusal: str = ""


def read_local(reader: Reader, path: Path, task: str) -> list[SourceRecord]:
    """``reader(path)``, with a file that is not UTF-8 text reported as such (not a UnicodeDecodeError)."""
    try:
        return reader(path)
    except UnicodeDecodeError as err:
        raise DataError(
            f"{task}: {path} is not UTF-8 text (byte {err.object[err.start : err.start + 1]!r} at offset "
            f"{err.start}); convert it, e.g. iconv -f latin1 -t utf-8 {path.name} > utf8-{path.name}"
        ) from None
    except PermissionError:
        raise DataError(f"{task}: {path} cannot be read (permission denied)") from None


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
            raise MissingDataError(f"{task}: data file for split {split!r} not found: {path}")
        return read_local(local.reader, path, task)
    if data_dir is not None:
        root = Path(data_dir).expanduser()
        if not root.is_dir():
            raise DataError(f"{task}: data_dir {root} is not a directory")
        patterns = local.files.get(split, ())
        found = [sorted(p for p in root.glob(pattern) if p.is_file()) for pattern in patterns]
        hint = f" {local.hint}" if local.hint else ""
        if local.combine and split in local.files:
            missing = [p for p, paths in zip(patterns, found, strict=True) if not paths]
            if missing:
                shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                raise MissingDataError(
                    f"{task}: split {split!r} needs {len(patterns)} files in {root}; missing {shown}.{hint}"
                )
            return [r for paths in found for path in paths for r in read_local(local.reader, path, task)]
        for paths in found:
            if paths:
                return read_local(local.reader, paths[0], task)
        looked = ", ".join(dict.fromkeys(patterns)) or "nothing (no local layout for this split)"
        raise MissingDataError(f"{task}: no file for split {split!r} in {root} (looked for {looked}).{hint}")
    if source.hub_refusal:
        raise MissingDataError(f"{task}: {source.hub_refusal}")
    if split not in source.hub:
        raise MissingDataError(
            f"{task}: split {split!r} is not available on the Hub; pass data_dir/data_files"
        )
    return _hub_records(task, split, source.hub[split])


def _hub_records(task: str, split: str, hub: HubSplit) -> list[SourceRecord]:
    """The records of a Hub split, through ``datasets.load_dataset``; the one place the Hub is read."""
    import datasets

    label = hub.path + (f" ({hub.name})" if hub.name else "")
    try:
        ds = datasets.load_dataset(hub.path, hub.name, split=hub.split)
    except Exception as err:  # datasets raises many types (connection, not-found, script refusal)
        text = str(err)
        why = f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"
        if "script" in text.lower():
            why = "it needs a loading script, which datasets refuses"
        raise MissingDataError(
            f"{task}: cannot load split {split!r} from {label}: {why}. Pass local copies with "
            f"data_dir/data_files instead."
        ) from None
    return [SourceRecord(row, f"{label} {hub.split} row {i}") for i, row in enumerate(ds)]
