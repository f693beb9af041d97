"""LAMBADA (paper §3, Table 1): predict the final token of a passage.

Test: the OpenAI detokenised test set (hub ``EleutherAI/lambada_openai``, 5153 passages, or its
``lambada_test.jsonl``), preprocessed as the reference does for its test file only (authors' repo,
``tasks/lambada.py``, ``LAMBADA.preprocess``): curly and doubled quotes straightened, the text stripped and
prefixed with a newline. Validation, where (k*, alpha*) are chosen: the original LAMBADA development set
(hub ``cimec/lambada``), used as is, like the reference's ``datasets.load_dataset('lambada')['validation']``.
Following the paper's footnote, the target is the last *token* (subword) of the passage
(``LAMBADA.standardize``: ``context = ids[:-1]``, ``target = ids[-1]``).
"""

from __future__ import annotations

from pathlib import Path

from cblight.data.examples import DataError, NextTokenExample
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sources import DataSource, HubSplit, LocalFiles, SourceRecord, read_jsonl


def preprocess_test(text: str) -> str:
    """The reference's test-set preprocessing (``tasks/lambada.py``, ``preprocess``)."""
    text = text.replace("“", '"').replace("”", '"').replace("''", '"').replace("``", '"')
    return "\n" + text.strip()


def read_passages(path: Path) -> list[SourceRecord]:
    """``{"text": ...}`` jsonl (the OpenAI/EleutherAI layout) or plain text with one passage per line
    (the original ``lambada_development_plain_text.txt``)."""
    if path.suffix == ".txt":
        with open(path, encoding="utf-8") as fh:
            return [
                SourceRecord({"text": line.rstrip("\n")}, f"{path} line {n}")
                for n, line in enumerate(fh, 1)
                if line.strip()
            ]
    return read_jsonl(path)


def render(record: SourceRecord, idx: int, ctx: RenderContext) -> NextTokenExample:
    text = record.get("text", "lambada")
    if not text.strip():
        raise DataError(f"lambada: empty passage at {record.where}")
    if ctx.split == "test":
        text = preprocess_test(text.strip())
    return NextTokenExample(idx=idx, text=text, where=record.where)


SPEC = register(
    TaskSpec(
        name="lambada",
        kind="next_token",
        title="LAMBADA",
        prompt="passage -> its last token",
        premise_free="the last k tokens",
        source=DataSource(
            hub={
                "test": HubSplit("EleutherAI/lambada_openai", None, "test"),
                "validation": HubSplit("cimec/lambada", None, "validation"),
            },
            local=LocalFiles(
                files={
                    "test": ("test.jsonl", "lambada_test.jsonl", "lambada_openai*.jsonl"),
                    "validation": (
                        "validation.jsonl",
                        "val.jsonl",
                        "lambada_development*.txt",
                        "*dev*.jsonl",
                    ),
                },
                reader=read_passages,
                hint='Use {"text": ...} jsonl files (test.jsonl, validation.jsonl) or the plain-text dev file.',
            ),
        ),
        report_split="test",
        selection_split="validation",
        render=render,
        sizes={"test": 5153, "validation": 4869},
        reference="tasks/lambada.py (LAMBADA.preprocess, get_test_set, standardize)",
    )
)
