"""OpenBookQA (paper §5, Table 4): four-way elementary science questions, no open book.

As the reference (authors' repo, ``tasks/openbookqa.py``, ``OpenBookQA.standardize`` and
``get_contrast_ctx``): ``"{question_stem} the answer is:"``, each choice scored as ``" " + choice``, the
premise-free context `` the answer is:``, the label the position of ``answerKey`` in A-D. Test (500) is
reported and alpha* chosen on validation (500). Data: hub ``allenai/openbookqa`` (main) or the original
``Data/Main/{train,dev,test}.jsonl`` (nested ``question.stem``/``question.choices``).
"""

from __future__ import annotations

from cblight.data.examples import ChoiceExample
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sources import DataSource, HubSplit, LocalFiles, SourceRecord, hub_layout

NAME = "openbookqa"
KEYS = ("A", "B", "C", "D")


def render(record: SourceRecord, idx: int, ctx: RenderContext) -> ChoiceExample:
    stem, texts, _ = record.qa_fields(NAME, "question_stem")
    return ChoiceExample.build(
        NAME,
        idx,
        record.where,
        context=f"{stem} the answer is:",
        premise_free=" the answer is:",
        answers=texts,
        label=record.key_index("answerKey", NAME, KEYS),
    )


SPEC = register(
    TaskSpec(
        name=NAME,
        kind="multiple_choice",
        title="OpenBookQA",
        prompt="{question_stem} the answer is: -> ' ' + choice",
        premise_free="' the answer is:'",
        source=DataSource(
            hub={s: HubSplit("allenai/openbookqa", "main", s) for s in ("train", "validation", "test")},
            local=LocalFiles(
                files={
                    "train": ("train.jsonl", *hub_layout("train")),
                    "validation": ("dev.jsonl", *hub_layout("validation")),
                    "test": ("test.jsonl", *hub_layout("test")),
                },
                hint="Use the original Data/Main/{train,dev,test}.jsonl or the hub schema.",
            ),
        ),
        report_split="test",
        selection_split="validation",
        render=render,
        sizes={"test": 500, "validation": 500, "train": 4957},
        aliases=("obqa",),
        reference="tasks/openbookqa.py (OpenBookQA.standardize, get_contrast_ctx)",
    )
)
