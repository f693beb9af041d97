"""TREC question classification, coarse labels (paper §5, Table 4).

As the reference (authors' repo, ``tasks/trec.py``, ``TREC.load_data``, ``standardize`` and
``get_contrast_ctx``): each question goes through the reference's ``detokenizer`` (``utils.py``, ported
below) and is stripped; the prompt is ``"{question} The answer to this question will be"`` with the
premise-free context `` The answer to this question will be``; the answers, in the reference's order
(DESC, ENTY, LOC, NUM, ABBR, HUM), are ``a description.``, ``an entity.``, ``a location.``,
``a number.``, ``an abbreviation.``, ``a person.``.

TREC has no validation split: test (500) is reported and alpha* is chosen on a fixed-seed sample of the
training split (5452) as large as the test split, as the reference's ``main.py`` pseudo-validation does.

Data: the original ``COARSE:fine question`` lines (``train_5500.label`` / ``TREC_10.label``, or the
reference's ``train.txt`` / ``test.txt``). The training file holds a byte that is not UTF-8: lines are read
as UTF-8 with a Latin-1 fallback. Or the hub schema of ``CogComp/trec`` (``text``, ``coarse_label``
0-5 = ABBR, ENTY, DESC, HUM, LOC, NUM), mapped to the reference's answer order.
"""

from __future__ import annotations

import re
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

NAME = "trec"
ANSWERS = {
    "DESC": "a description.",
    "ENTY": "an entity.",
    "LOC": "a location.",
    "NUM": "a number.",
    "ABBR": "an abbreviation.",
    "HUM": "a person.",
}
ORDER = list(ANSWERS)
HUB_COARSE = ("ABBR", "ENTY", "DESC", "HUM", "LOC", "NUM")  # CogComp/trec ClassLabel names


def detokenize(text: str) -> str:
    """The reference's ``utils.detokenizer``, rule for rule and in its order."""
    text = text.replace("`` ", '"').replace(" ''", '"').replace("` ", '"').replace(" ' ", '" ')
    text = text.replace("s '", "s'")
    text = re.sub(r"/' [0-9]/", r"/'[0-9]/", text)
    text = text.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
    for mark in (":", ";", ".", "!", "?", ","):
        text = text.replace(" " + mark, mark)
    text = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", text)
    text = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", text)
    text = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", text)
    text = text.replace("= = = =", "====").replace("= = =", "===").replace("= =", "==")
    text = text.replace(" " + chr(176) + " ", chr(176))
    text = text.replace(" \n", "\n").replace("\n ", "\n")
    text = text.replace(" N ", " 1 ").replace(" 's", "'s")
    for clitic in ("n't", "'d", "'m", "'re", "'ve"):
        text = text.replace(f" {clitic} ", f"{clitic} ")
    return text


def read_trec(path: Path) -> list[SourceRecord]:
    """``COARSE:fine question`` lines; the question keeps its newline, as the reference detokenises it."""
    if path.suffix in (".jsonl", ".json", ".parquet", ".csv"):
        return read_records(path)
    records = []
    for lineno, line in read_text_lines(path):
        if not line.strip():
            continue
        where = f"{path} line {lineno}"
        label, sep, question = line.partition(" ")
        coarse, colon, _ = label.partition(":")
        if not sep or not colon or not question.strip():
            raise DataError(f"{NAME}: {where} is not 'COARSE:fine question' (the TREC format): {line[:60]!r}")
        records.append(SourceRecord({"coarse": coarse, "question": question}, where))
    return records


def render(record: SourceRecord, idx: int, ctx: RenderContext) -> ChoiceExample:
    if "question" in record.fields:
        question = record.get("question", NAME)
        coarse = record.get("coarse", NAME)
    else:  # hub schema
        question = record.get("text", NAME)
        index = record.get("coarse_label", NAME, int)
        if not 0 <= index < len(HUB_COARSE):
            raise DataError(f"{NAME}: field 'coarse_label' at {record.where} is {index}, not 0..5")
        coarse = HUB_COARSE[index]
    if coarse not in ANSWERS:
        raise DataError(f"{NAME}: coarse label {coarse!r} at {record.where} is not one of {ORDER}")
    return ChoiceExample.build(
        NAME,
        idx,
        record.where,
        context=f"{detokenize(question).strip()} The answer to this question will be",
        premise_free=" The answer to this question will be",
        answers=list(ANSWERS.values()),
        label=ORDER.index(coarse),
    )


SPEC = register(
    TaskSpec(
        name=NAME,
        kind="multiple_choice",
        title="TREC",
        prompt="{detokenised question} The answer to this question will be -> ' a description.' | ' an entity.' "
        "| ' a location.' | ' a number.' | ' an abbreviation.' | ' a person.'",
        premise_free="' The answer to this question will be'",
        source=DataSource(
            hub={s: HubSplit("CogComp/trec", None, s) for s in ("train", "test")},
            local=LocalFiles(
                files={
                    "train": ("train.txt", "train_5500.label", "train_*.label", *hub_layout("train")),
                    "test": ("test.txt", "TREC_10.label", "test.label", *hub_layout("test")),
                },
                reader=read_trec,
                hint="Use the original train_5500.label and TREC_10.label (or train.txt / test.txt).",
            ),
        ),
        report_split="test",
        selection_split="train",
        sample_selection=True,
        render=render,
        sizes={"test": 500, "train": 5452},
        reference="tasks/trec.py (TREC.load_data, standardize, get_contrast_ctx); utils.py detokenizer",
    )
)
