"""BoolQ, RTE and CB from SuperGLUE (paper §5, Table 4).

Prompts as the reference (authors' repo, ``tasks/boolq.py``, ``tasks/rte.py``, ``tasks/cb.py``; each
``standardize`` and ``get_contrast_ctx``), answers scored as ``" " + answer``:

* BoolQ: the question gets its first letter upper-cased, `` i `` -> `` I `` and a ``?`` appended
  (``BoolQ.proc_question``); the context is ``"Title: {passage}\\n Question: {question}?\\n The answer
  is:"``, so the question ends in ``??``, as in the reference (the paper's table shows one). Premise-free:
  ``" Question: {question}?\\n The answer is:"``. Answers ``no`` / ``yes`` (label 0 = False).
* RTE: ``"{premise}\\n question: {hypothesis} true or false?\\n answer:"``, premise-free
  ``" question: {hypothesis} true or false?\\n answer:"``; answers ``true`` (entailment) / ``false``.
* CB: ``" Given question: {premise} Is {hypothesis} true, false, or neither?\\n The answer is:"`` (with the
  reference's leading space; the paper's table has no comma before "or"), premise-free
  ``" Is {hypothesis} true, false, or neither?\\n The answer is:"``; answers ``true`` (entailment),
  ``false`` (contradiction), ``neither`` (neutral).

Test labels are hidden: validation is reported (BoolQ 3270, RTE 277, CB 56) and alpha* chosen on a
fixed-seed sample of train as large as it. Data: hub ``aps/super_glue`` (integer labels) or the SuperGLUE
``{train,val}.jsonl`` files (labels as ``true``/``false`` booleans for BoolQ and as strings
``entailment``/``not_entailment``/``contradiction``/``neutral`` for RTE and CB), mapped to the same order.
"""

from __future__ import annotations

from collections.abc import Callable

from cblight.data.examples import ChoiceExample
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sources import DataSource, HubSplit, LocalFiles, SourceRecord, hub_layout

# (spelling, answer index): hub integers first, then the SuperGLUE jsonl spellings
BOOLQ_LABELS = ((0, 0), (1, 1), (False, 0), (True, 1))
RTE_LABELS = ((0, 0), (1, 1), ("entailment", 0), ("not_entailment", 1))
CB_LABELS = ((0, 0), (1, 1), (2, 2), ("entailment", 0), ("contradiction", 1), ("neutral", 2))


def boolq_question(question: str) -> str:
    """``BoolQ.proc_question`` of the reference."""
    question = question[:1].upper() + question[1:]
    return question.replace(" i ", " I ") + "?"


def render_boolq(record: SourceRecord, idx: int, ctx: RenderContext) -> ChoiceExample:
    question = boolq_question(record.get("question", "boolq"))
    tail = f" Question: {question}?\n The answer is:"
    return ChoiceExample.build(
        "boolq",
        idx,
        record.where,
        context=f"Title: {record.get('passage', 'boolq')}\n" + tail,
        premise_free=tail,
        answers=["no", "yes"],
        label=record.label("label", "boolq", BOOLQ_LABELS),
    )


def _entailment(task: str, head: str, tail: str, answers: list[str], spellings: tuple) -> Callable:
    """A premise/hypothesis task: ``head`` holds the premise, ``tail`` (the premise-free context) the
    hypothesis."""

    def render(record: SourceRecord, idx: int, ctx: RenderContext) -> ChoiceExample:
        premise_free = tail.format(hypothesis=record.get("hypothesis", task))
        return ChoiceExample.build(
            task,
            idx,
            record.where,
            context=head.format(premise=record.get("premise", task)) + premise_free,
            premise_free=premise_free,
            answers=answers,
            label=record.label("label", task, spellings),
        )

    return render


render_rte = _entailment(
    "rte", "{premise}\n", " question: {hypothesis} true or false?\n answer:", ["true", "false"], RTE_LABELS
)
render_cb = _entailment(
    "cb",
    " Given question: {premise}",
    " Is {hypothesis} true, false, or neither?\n The answer is:",
    ["true", "false", "neither"],
    CB_LABELS,
)


def _spec(name: str, title: str, render: Callable, prompt: str, premise_free: str, **kw) -> TaskSpec:
    """A SuperGLUE task: validation reported, alpha* chosen on a train sample as large as it."""
    return register(
        TaskSpec(
            name=name,
            kind="multiple_choice",
            title=title,
            prompt=prompt,
            premise_free=premise_free,
            source=DataSource(
                hub={s: HubSplit("aps/super_glue", name, s) for s in ("train", "validation", "test")},
                local=LocalFiles(
                    files={
                        "train": ("train.jsonl", *hub_layout("train")),
                        "validation": ("val.jsonl", *hub_layout("validation")),
                        "test": ("test.jsonl", *hub_layout("test")),
                    },
                    hint=f"Use the SuperGLUE {title}/train.jsonl and {title}/val.jsonl files or the hub schema.",
                ),
            ),
            report_split="validation",
            selection_split="train",
            sample_selection=True,
            render=render,
            **kw,
        )
    )


BOOLQ = _spec(
    "boolq",
    "BoolQ",
    render_boolq,
    "Title: {passage}\\n Question: {Question}??\\n The answer is: -> ' no' | ' yes'",
    "' Question: {Question}??\\n The answer is:'",
    sizes={"validation": 3270, "train": 9427},
    reference="tasks/boolq.py (BoolQ.proc_question, standardize, get_contrast_ctx)",
)
RTE = _spec(
    "rte",
    "RTE",
    render_rte,
    "{premise}\\n question: {hypothesis} true or false?\\n answer: -> ' true' | ' false'",
    "' question: {hypothesis} true or false?\\n answer:'",
    sizes={"validation": 277, "train": 2490},
    reference="tasks/rte.py (RTE.standardize, get_contrast_ctx)",
)
CB = _spec(
    "cb",
    "CB",
    render_cb,
    "' Given question: {premise} Is {hypothesis} true, false, or neither?\\n The answer is:' "
    "-> ' true' | ' false' | ' neither'",
    "' Is {hypothesis} true, false, or neither?\\n The answer is:'",
    sizes={"validation": 56, "train": 250},
    aliases=("commitmentbank",),
    reference="tasks/cb.py (CommitmentBank.standardize, get_contrast_ctx)",
)
