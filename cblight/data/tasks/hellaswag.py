"""HellaSwag (paper §5, Table 4): choose the ending of an ActivityNet/WikiHow scene.

As the reference (authors' repo, ``tasks/hellaswag.py``, ``HellaSwag.preprocess``, ``standardize`` and
``get_contrast_ctx``): the context is ``activity_label + ": " + ctx_a + " " + ctx_b.capitalize()`` (so the
rest of ``ctx_b`` is lower-cased), then stripped, WikiHow's bracketed tags (``[title]``, ``[step]``)
removed and double spaces halved once; each ending gets the same preprocessing and is scored as
``" " + ending`` (the text is stripped *before* the tags go, so an ending that starts with a tag keeps
a leading space and is scored after two spaces, as in the reference). The premise-free context is the text after the context's last ``.``: the whole context
when it has no ``.``, and BOS/EOS alone (the reference's ``<|endoftext|>``) when it ends in one.

The test labels are hidden, so the validation split (10042) is reported and alpha* is chosen on a
fixed-seed sample of the training split as large as it (the reference's pseudo-validation, ``main.py``).
Data: hub ``Rowan/hellaswag`` or the original ``hellaswag_{train,val}.jsonl`` (same fields).
"""

from __future__ import annotations

import re

from cblight.data.examples import ChoiceExample, DataError
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sources import DataSource, HubSplit, LocalFiles, SourceRecord, hub_layout

NAME = "hellaswag"
_TAG = re.compile(r"\[.*?\]")


def preprocess(text: str) -> str:
    """``HellaSwag.preprocess`` of the reference."""
    return _TAG.sub("", text.strip()).replace("  ", " ")


def premise_free(context: str) -> str:
    """The text after the context's last period (``get_contrast_ctx``); ``""`` (BOS/EOS) when empty."""
    return context[context.rfind(".") + 1 :]


def render(record: SourceRecord, idx: int, ctx: RenderContext) -> ChoiceExample:
    ctx_b = record.get("ctx_b", NAME)
    full = record.get("ctx_a", NAME) + " " + ctx_b.capitalize()
    context = preprocess(record.get("activity_label", NAME) + ": " + full)
    endings = record.get("endings", NAME, list)
    if any(not isinstance(e, str) for e in endings):
        raise DataError(f"{NAME}: field 'endings' at {record.where} should be a list of strings")
    if record.fields.get("label") in ("", None):
        raise DataError(f"{NAME}: record at {record.where} has no label (the test split is unlabelled)")
    return ChoiceExample.build(
        NAME,
        idx,
        record.where,
        context=context,
        premise_free=premise_free(context),
        answers=[preprocess(e) for e in endings],
        label=record.integer("label", NAME),
    )


SPEC = register(
    TaskSpec(
        name=NAME,
        kind="multiple_choice",
        title="HellaSwag",
        prompt="{activity_label}: {ctx_a} {Ctx_b} (tags removed) -> ' ' + ending",
        premise_free="the context after its last '.' (whole context if none; BOS/EOS if it ends in '.')",
        source=DataSource(
            hub={s: HubSplit("Rowan/hellaswag", None, s) for s in ("train", "validation")},
            local=LocalFiles(
                files={
                    "train": ("hellaswag_train.jsonl", *hub_layout("train")),
                    "validation": ("hellaswag_val.jsonl", "val.jsonl", *hub_layout("validation")),
                },
                hint="Use the original hellaswag_train.jsonl / hellaswag_val.jsonl or the hub schema.",
            ),
        ),
        report_split="validation",
        selection_split="train",
        sample_selection=True,
        render=render,
        sizes={"validation": 10042, "train": 39905},
        reference="tasks/hellaswag.py (HellaSwag.preprocess, standardize, get_contrast_ctx)",
    )
)
