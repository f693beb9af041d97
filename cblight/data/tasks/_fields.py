"""Field helpers shared by the task specs: labels in their several on-disk spellings, each failure a
``DataError`` naming the task, the record (file and line, or hub row) and the field."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cblight.data.examples import DataError
from cblight.data.sources import SourceRecord


def int_field(record: SourceRecord, name: str, task: str) -> int:
    """An integer field that may be stored as a number or as text (CSV cells)."""
    value = record.get(name, task, (int, str))
    try:
        return int(value)
    except ValueError:
        raise DataError(
            f"{task}: field {name!r} at {record.where} is not a whole number: {value!r}"
        ) from None


def mapped_label(record: SourceRecord, name: str, task: str, spellings: Sequence[tuple[Any, int]]) -> int:
    """The answer index of a label written in any of ``spellings`` (``(label, index)`` pairs: hub ints,
    jsonl strings or booleans). Pairs, not a dict: ``False`` and ``0`` are equal keys in a dict, and a
    boolean label must match only a boolean spelling."""
    value = record.get(name, task, (int, str, bool))
    key = value.strip() if isinstance(value, str) else value
    for candidate, index in spellings:
        if type(candidate) is type(key) and candidate == key:
            return index
    allowed = ", ".join(repr(k) for k, _ in spellings)
    raise DataError(
        f"{task}: field {name!r} at {record.where} is {value!r}, not one of the answer labels ({allowed}); "
        "an unlabelled test split?"
    )


def key_index(
    record: SourceRecord, name: str, task: str, keys: Sequence[str], normalize: Callable[[str], str] = str
) -> int:
    """Position of an answer key (``"A"``..) in ``keys``, after ``normalize`` (ARC's ``"1"`` -> ``"A"``)."""
    value = normalize(str(record.get(name, task, (str, int))).strip())
    if value not in keys:
        raise DataError(
            f"{task}: field {name!r} at {record.where} is {value!r}, not one of the choice labels "
            f"{list(keys)}; an unlabelled test split?"
        )
    return list(keys).index(value)


def qa_fields(record: SourceRecord, task: str, stem_field: str) -> tuple[str, list[str], list[str]]:
    """``(question, choice texts, choice labels)`` of a lettered QA record in either of its two schemas:
    the hub's (``stem_field`` a string, ``choices = {"text": [...], "label": [...]}``) or the original
    jsonl's (``question = {"stem": ..., "choices": [{"text": ..., "label": ...}, ...]}``; CommonsenseQA,
    OpenBookQA and ARC are all distributed that way)."""
    question = record.fields.get("question")
    if isinstance(question, dict):
        nested = SourceRecord(question, record.where)
        stem = nested.get("stem", task)
        choices = nested.get("choices", task, list)
        texts, labels = [], []
        for choice in choices:
            if not isinstance(choice, dict) or "text" not in choice or "label" not in choice:
                raise DataError(
                    f"{task}: question.choices at {record.where} should hold {{'text', 'label'}} objects"
                )
            texts.append(choice["text"])
            labels.append(str(choice["label"]))
        _some_choices(task, "question.choices", record, texts)
        return stem, texts, labels
    stem = record.get(stem_field, task)
    choices = record.get("choices", task, dict)
    texts, labels = choices.get("text"), choices.get("label")
    if not isinstance(texts, list) or not isinstance(labels, list) or len(texts) != len(labels):
        raise DataError(
            f"{task}: field 'choices' at {record.where} should be {{'text': [...], 'label': [...]}} of equal length"
        )
    _some_choices(task, "choices", record, texts)
    return stem, [str(t) for t in texts], [str(lab) for lab in labels]


def _some_choices(task: str, field: str, record: SourceRecord, texts: Sequence[Any]) -> None:
    if not texts:
        raise DataError(f"{task}: field {field!r} at {record.where} has no choices (an empty list)")
