"""PIQA (paper §5, Table 4): choose the solution that achieves a physical goal.

As the reference (authors' repo, ``tasks/piqa.py``, ``PIQA.standardize`` and ``get_contrast_ctx``):
``"Question: {goal}\\nAnswer:"``, each solution scored as ``" " + solution`` (kept verbatim, trailing
spaces included), the premise-free context `` Answer:``. The test labels are hidden, so the validation
split (1838) is reported and alpha* chosen on a fixed-seed sample of train as large as it.

Data: the original files (``train.jsonl`` + ``train-labels.lst``, ``valid.jsonl`` + ``valid-labels.lst``:
the labels, one 0/1 per line, sit in a separate file next to each jsonl), or the hub schema (``goal``,
``sol1``, ``sol2``, ``label``). The hub default is the parquet mirror ``baber/piqa``: ``ybisk/piqa``
needs a loading script, which datasets 5 refuses.
"""

from __future__ import annotations

from pathlib import Path

from cblight.data.examples import ChoiceExample, DataError
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sources import (
    DataSource,
    HubSplit,
    LocalFiles,
    SourceRecord,
    hub_layout,
    read_records,
    read_text_lines,
)

NAME = "piqa"


def labels_file(path: Path) -> Path:
    """``valid.jsonl`` -> ``valid-labels.lst`` (the original distribution's naming)."""
    return path.with_name(path.stem + "-labels.lst")


def read_piqa(path: Path) -> list[SourceRecord]:
    """Records of a PIQA file; an original jsonl without labels gets them from its ``-labels.lst``."""
    records = read_records(path)
    if path.suffix != ".jsonl" or all("label" in r.fields for r in records):
        return records
    lst = labels_file(path)
    if not lst.is_file():
        raise DataError(
            f"{NAME}: {path} has no 'label' field and its labels file {lst} is missing "
            "(the original PIQA keeps labels in <split>-labels.lst next to <split>.jsonl)"
        )
    labels = [(n, line.strip()) for n, line in read_text_lines(lst) if line.strip()]
    if len(labels) != len(records):
        raise DataError(f"{NAME}: {lst} has {len(labels)} labels but {path} has {len(records)} records")
    out = []
    for record, (lineno, label) in zip(records, labels):
        if label not in ("0", "1"):
            raise DataError(f"{NAME}: {lst} line {lineno} is {label!r}, not a label 0 or 1")
        out.append(SourceRecord({**record.fields, "label": int(label)}, record.where))
    return out


def render(record: SourceRecord, idx: int, ctx: RenderContext) -> ChoiceExample:
    return ChoiceExample.build(
        NAME,
        idx,
        record.where,
        context=f"Question: {record.get('goal', NAME)}\nAnswer:",
        premise_free=" Answer:",
        answers=[record.get("sol1", NAME), record.get("sol2", NAME)],
        label=record.integer("label", NAME),
    )


SPEC = register(
    TaskSpec(
        name=NAME,
        kind="multiple_choice",
        title="PIQA",
        prompt="Question: {goal}\\nAnswer: -> ' ' + solution",
        premise_free="' Answer:'",
        source=DataSource(
            hub={s: HubSplit("baber/piqa", None, s) for s in ("train", "validation")},
            local=LocalFiles(
                files={
                    "train": ("train.jsonl", *hub_layout("train")),
                    "validation": ("valid.jsonl", "dev.jsonl", *hub_layout("validation")),
                },
                reader=read_piqa,
                hint="Use the original train.jsonl + train-labels.lst and valid.jsonl + valid-labels.lst.",
            ),
        ),
        report_split="validation",
        selection_split="train",
        sample_selection=True,
        render=render,
        sizes={"validation": 1838, "train": 16113},
        reference="tasks/piqa.py (PIQA.standardize, get_contrast_ctx)",
    )
)
