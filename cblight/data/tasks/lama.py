"""LAMA, T-REx facts (paper §5, Table 5): predict a fact's object as the next token.

Data: the split of Zhao et al. (2021), one folder per relation holding ``train.jsonl``, ``dev.jsonl`` and
``test.jsonl`` (their few-shot-learning repo, ``data/lama/original_rob/P*/``; records with ``sub_label``,
``obj_label`` and ``predicate_id``). Point ``data_dir`` at the folder that holds ``P19/``, ``P20/``, ...:
all 40 relations of the reference must be there (a missing one is an error, as in the reference).

As the reference (authors' repo, ``tasks/lama.py``, ``LAMA.__init__``, ``prepare_prompt``, ``load_data``
and ``standardize``): the 40 relations and templates below; the prompt is the template with ``[X]``
replaced by the subject and cut before ``[Y]`` (and its space); the example text is ``prompt + " " +
object`` and the target its last token. Facts are kept when ``" " + object`` is a single token and the
prompt is longer than the largest k of the grid (the reference drops ``len(encode(prompt)) <= max_len``;
the paper: "We limit the prompt length to be larger than 5 tokens"), which is why this filter needs the
tokenizer and the grid (``EvalDataModule(max_k=...)``, linked from ``model.ks`` by ``evaluate.py``).
Token counts exclude special tokens (the reference's GPT-2 adds none). Test is reported and (k*,
alpha*) are chosen on dev; Table 5's grid is k in 1..5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cblight.data.examples import DataError, NextTokenExample
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sources import DataSource, LocalFiles, SourceRecord, read_jsonl

NAME = "lama"
RELATIONS = {
    "P19": "[X] was born in [Y] .",
    "P20": "[X] died in [Y] .",
    "P279": "[X] is a subclass of [Y] .",
    "P37": "The official language of [X] is [Y] .",
    "P413": "[X] plays in [Y] position .",
    "P449": "[X] was originally aired on [Y] .",
    "P47": "[X] shares border with [Y] .",
    "P138": "[X] is named after [Y] .",
    "P364": "The original language of [X] is [Y] .",
    "P463": "[X] is a member of [Y] .",
    "P101": "[X] works in the field of [Y] .",
    "P106": "The profession of [X] is [Y] .",
    "P527": "[X] consists of [Y] .",
    "P530": "[X] maintains diplomatic relations with [Y] .",
    "P176": "[X] is produced by [Y] .",
    "P27": "[X] is a citizen of [Y] .",
    "P407": "[X] was written in [Y] .",
    "P30": "[X] is located in [Y] .",
    "P178": "[X] is developed by [Y] .",
    "P1376": "[X] is the capital of [Y] .",
    "P131": "[X] is located in [Y] .",
    "P1412": "[X] used to communicate in [Y] .",
    "P108": "[X] works for [Y] .",
    "P136": "[X] plays [Y] music .",
    "P17": "[X] is located in [Y] .",
    "P39": "[X] has the position of [Y] .",
    "P264": "[X] is represented by music label [Y] .",
    "P276": "[X] is located in [Y] .",
    "P937": "[X] used to work in [Y] .",
    "P140": "[X] is affiliated with the [Y] religion .",
    "P1303": "[X] plays [Y] .",
    "P127": "[X] is owned by [Y] .",
    "P103": "The native language of [X] is [Y] .",
    "P1001": "[X] is a legal term in [Y] .",
    "P31": "[X] is a [Y] .",
    "P495": "[X] was created in [Y] .",
    "P159": "The headquarter of [X] is in [Y] .",
    "P36": "The capital of [X] is [Y] .",
    "P740": "[X] was founded in [Y] .",
    "P361": "[X] is part of [Y] .",
}
SPLIT_FILES = {"train": "train.jsonl", "validation": "dev.jsonl", "test": "test.jsonl"}


def prepare_prompt(subject: str, template: str) -> str:
    """``LAMA.prepare_prompt``: the template up to ``[Y]`` with ``[X]`` filled, minus its last character."""
    x, y = template.find("[X]"), template.find("[Y]")
    return f"{template[:x]}{subject}{template[x + 3 : y]}"[:-1]


def read_lama(path: Path) -> list[SourceRecord]:
    """A relation's jsonl; a record without ``predicate_id`` takes its folder's name (``P19/test.jsonl``)."""
    return [
        r
        if "predicate_id" in r.fields
        else SourceRecord({**r.fields, "predicate_id": path.parent.name}, r.where)
        for r in read_jsonl(path)
    ]


def render(record: SourceRecord, idx: int, ctx: RenderContext) -> NextTokenExample:
    relation = record.get("predicate_id", NAME)
    if relation not in RELATIONS:
        raise DataError(
            f"{NAME}: relation {relation!r} at {record.where} is not one of the reference's 40 relations"
        )
    obj = record.get("obj_label", NAME)
    prompt = prepare_prompt(record.get("sub_label", NAME), RELATIONS[relation])
    template = prepare_prompt("[X]", RELATIONS[relation])
    return NextTokenExample(
        idx=idx, text=f"{prompt} {obj}", where=record.where, answer=" " + obj, template=template
    )


def keep(example: NextTokenExample, tokenizer: Any, max_k: int | None) -> bool:
    """The reference's filter: a one-token object and a prompt longer than the largest k."""
    if tokenizer is None or max_k is None:
        raise DataError(
            f"{NAME}: its filter (one-token objects, prompts longer than the largest k) needs the tokenizer and "
            "the grid's largest k: EvalDataModule(tokenizer=..., max_k=...); cblight evaluate links both from the model"
        )
    prompt = example.text[: len(example.text) - len(example.answer)]
    n_answer = len(tokenizer(example.answer, add_special_tokens=False)["input_ids"])
    return n_answer == 1 and len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) > max_k


SPEC = register(
    TaskSpec(
        name=NAME,
        kind="next_token",
        title="LAMA (T-REx)",
        prompt="template with [X] filled, cut before [Y] -> ' ' + object (one token)",
        premise_free="the last k tokens",
        source=DataSource(
            local=LocalFiles(
                files={
                    split: tuple(f"{rel}/{name}" for rel in RELATIONS) for split, name in SPLIT_FILES.items()
                },
                reader=read_lama,
                combine=True,
                hint="data_dir must hold the 40 relation folders P19/, P20/, ... each with train.jsonl, dev.jsonl "
                "and test.jsonl (Zhao et al. 2021's split: github.com/tonyzhaozh/few-shot-learning, "
                "data/lama/original_rob).",
            ),
            hub_refusal="LAMA is read from local files only: pass data_dir=<folder holding the relation folders "
            "P19/, P20/, ... of Zhao et al. 2021's T-REx split (github.com/tonyzhaozh/few-shot-learning, "
            "data/lama/original_rob)>, e.g. --data.data_dirs '{lama: /data/lama/original_rob}'.",
        ),
        report_split="test",
        selection_split="validation",
        render=render,
        keep=keep,
        reference="tasks/lama.py (LAMA.__init__ relations, prepare_prompt, load_data, standardize)",
    )
)
