"""COPA (paper §5, Table 4): choose the more plausible cause or effect.

Prompt as the reference (authors' repo, ``tasks/copa.py``, ``COPA.standardize`` and
``get_contrast_ctx``): the premise without its final period, then `` because`` (cause) or `` so``
(effect); each choice with its first letter lower-cased, scored as ``" " + choice``; the premise-free
context is ``" " +`` the connector word. The paper reports the validation split (test labels are hidden),
so alpha* is chosen on a fixed-seed sample of the training split as large as the validation split.
"""

from __future__ import annotations

from cblight.data.examples import ChoiceExample, DataError
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sources import DataSource, HubSplit, LocalFiles, SourceRecord

CONNECTORS = {"cause": "because", "effect": "so"}


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def render(record: SourceRecord, idx: int, ctx: RenderContext) -> ChoiceExample:
    premise = record.get("premise", "copa")
    question = record.get("question", "copa")
    if question not in CONNECTORS:
        raise DataError(
            f"copa: field 'question' at {record.where} must be 'cause' or 'effect', got {question!r}"
        )
    choices = [record.get("choice1", "copa"), record.get("choice2", "copa")]
    if any(not c.strip() for c in choices):
        raise DataError(f"copa: empty choice at {record.where}")
    label = record.get("label", "copa", int)
    if label not in (0, 1):
        raise DataError(f"copa: label at {record.where} must be 0 or 1, got {label} (unlabelled test split?)")
    connector = CONNECTORS[question]
    context = premise.strip()[:-1] + " " + connector
    return ChoiceExample(
        idx=idx,
        context=context,
        premise_free=" " + connector,
        choices=tuple(" " + _lower_first(c) for c in choices),
        label=label,
        where=record.where,
    )


SPEC = register(
    TaskSpec(
        name="copa",
        kind="multiple_choice",
        title="COPA",
        prompt="{premise minus final period} because|so -> {choice, first letter lower-cased}; premise-free: ' because'|' so'",
        source=DataSource(
            hub={s: HubSplit("aps/super_glue", "copa", s) for s in ("train", "validation", "test")},
            local=LocalFiles(
                files={
                    "train": ("train.jsonl",),
                    "validation": ("val.jsonl", "validation.jsonl"),
                    "test": ("test.jsonl",),
                },
                hint="Use the SuperGLUE COPA jsonl files (train.jsonl, val.jsonl) or any jsonl in that schema.",
            ),
        ),
        report_split="validation",
        selection_split="train",
        sample_selection=True,
        render=render,
    )
)
