"""CommonsenseQA (paper §5, Table 4): five-way commonsense questions.

As the reference (authors' repo, ``tasks/csqa.py``, ``CommonsenseQA.standardize`` and
``get_contrast_ctx``): the question loses a final ``?``, ``.`` or ``!``, then ``"{question}? the answer
is:"``; each choice is scored as ``" " + choice``; the premise-free context is `` the answer is:``. The
test labels are hidden, so the validation split (1221) is reported and alpha* is chosen on a fixed-seed
sample of the training split as large as it. Data: hub ``tau/commonsense_qa`` or the original
``{train,dev}_rand_split.jsonl`` (nested ``question.stem``/``question.choices``).
"""

from __future__ import annotations

from cblight.data.examples import ChoiceExample
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sources import DataSource, HubSplit, LocalFiles, SourceRecord, hub_layout

NAME = "csqa"


def render(record: SourceRecord, idx: int, ctx: RenderContext) -> ChoiceExample:
    question, texts, labels = record.qa_fields(NAME, "question")
    if question[-1:] in ("?", ".", "!"):
        question = question[:-1]
    return ChoiceExample.build(
        NAME,
        idx,
        record.where,
        context=f"{question}? the answer is:",
        premise_free=" the answer is:",
        answers=texts,
        label=record.key_index("answerKey", NAME, labels),
    )


SPEC = register(
    TaskSpec(
        name=NAME,
        kind="multiple_choice",
        title="CommonsenseQA",
        prompt="{question without final punctuation}? the answer is: -> ' ' + choice",
        premise_free="' the answer is:'",
        source=DataSource(
            hub={s: HubSplit("tau/commonsense_qa", None, s) for s in ("train", "validation")},
            local=LocalFiles(
                files={
                    "train": ("train_rand_split.jsonl", *hub_layout("train")),
                    "validation": (
                        "dev_rand_split.jsonl",
                        "*dev_rand_split.jsonl",
                        *hub_layout("validation"),
                    ),
                },
                hint="Use the original train_rand_split.jsonl / dev_rand_split.jsonl or the hub schema.",
            ),
        ),
        report_split="validation",
        selection_split="train",
        sample_selection=True,
        render=render,
        sizes={"validation": 1221, "train": 9741},
        aliases=("commonsenseqa", "commonsense_qa"),
        reference="tasks/csqa.py (CommonsenseQA.standardize, get_contrast_ctx)",
    )
)
