"""COPA (paper §5, Table 4): choose the more plausible cause or effect.

Prompt as the reference (authors' repo, ``tasks/copa.py``, ``COPA.standardize`` and
``get_contrast_ctx``): the premise without its final period, then `` because`` (cause) or `` so``
(effect); each choice with its first letter lower-cased, scored as ``" " + choice``; the premise-free
context is ``" " +`` the connector word. The paper reports the validation split (test labels are hidden),
so alpha* is chosen on a fixed-seed sample of the training split as large as the validation split.
Data: hub ``aps/super_glue`` (copa) or the SuperGLUE ``COPA/{train,val}.jsonl`` files (same fields).
"""

from __future__ import annotations

from cblight.data.examples import ChoiceExample, DataError
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sources import DataSource, HubSplit, LocalFiles, SourceRecord, hub_layout

NAME = "copa"
CONNECTORS = {"cause": "because", "effect": "so"}


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def render(record: SourceRecord, idx: int, ctx: RenderContext) -> ChoiceExample:
    premise = record.get("premise", NAME)
    question = record.get("question", NAME)
    if question not in CONNECTORS:
        raise DataError(
            f"{NAME}: field 'question' at {record.where} must be 'cause' or 'effect', got {question!r}"
        )
    connector = CONNECTORS[question]
    return ChoiceExample.build(
        NAME,
        idx,
        record.where,
        context=premise.strip()[:-1] + " " + connector,
        premise_free=" " + connector,
        answers=[_lower_first(record.get("choice1", NAME)), _lower_first(record.get("choice2", NAME))],
        label=record.integer("label", NAME),
    )


SPEC = register(
    TaskSpec(
        name=NAME,
        kind="multiple_choice",
        title="COPA",
        prompt="{premise minus final period} because|so -> ' ' + choice with its first letter lower-cased",
        premise_free="' because' | ' so'",
        source=DataSource(
            hub={s: HubSplit("aps/super_glue", "copa", s) for s in ("train", "validation", "test")},
            local=LocalFiles(
                files={
                    "train": ("train.jsonl", *hub_layout("train")),
                    "validation": ("val.jsonl", *hub_layout("validation")),
                    "test": ("test.jsonl", *hub_layout("test")),
                },
                hint="Use the SuperGLUE COPA jsonl files (train.jsonl, val.jsonl) or any jsonl in that schema.",
            ),
        ),
        report_split="validation",
        selection_split="train",
        sample_selection=True,
        render=render,
        sizes={"validation": 100, "train": 400},
        reference="tasks/copa.py (COPA.standardize, get_contrast_ctx)",
    )
)
