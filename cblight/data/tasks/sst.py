"""SST-2 and SST-5 (paper §5, Table 4): sentiment of a movie-review sentence.

As the reference (authors' repo, ``tasks/sst.py``, ``SST2.standardize``/``get_contrast_ctx`` and
``SST5``): ``"{sentence} This quote has a tone that is"`` with the premise-free context `` This quote has
a tone that is``. SST-2 answers are ``negative\\n`` / ``positive\\n`` (with the newline, as the
reference's ``answer_set``); SST-5 answers are ``very negative.``, ``somewhat negative.``, ``neutral.``,
``somewhat positive.``, ``very positive.``, each followed by the tokenizer's EOS token (the reference's
literal ``<|endoftext|>``). All scored as ``" " + answer``. Test is reported and alpha* chosen on the SST
dev split (SST-2: 1821 / 872 sentences, SST-5: 2210 / 1101).

Data: the reference read the cased treebank sentences of hub ``sst`` (float sentiment, neutral
(0.4, 0.6] dropped for SST-2); that hub id needs a loading script, which datasets 5 refuses. Here:
the ``stsa.binary.*`` / ``stsa.fine.*`` files (``label sentence`` per line; Kim 2014's split of the same
sentences), the hub's ``SetFit/sst2`` / ``SetFit/sst5`` (the same stsa data as parquet), or a local copy of
the ``sst`` schema (``sentence`` + float ``label``, mapped with the reference's thresholds). The stsa and
SetFit copies are lower-cased, so numbers differ slightly from the reference's.
"""

from __future__ import annotations

from collections.abc import Callable
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

CONTEXT = "{} This quote has a tone that is"
PREMISE_FREE = " This quote has a tone that is"
SST5_ANSWERS = ("very negative.", "somewhat negative.", "neutral.", "somewhat positive.", "very positive.")


def sst2_class(score: float) -> int | None:
    """``SST2.labeling``: 0 negative, 1 positive, ``None`` for the dropped neutral band (0.4, 0.6]."""
    if 0 <= score <= 0.4:
        return 0
    if 0.4 < score <= 0.6:
        return None
    if 0.6 < score <= 1:
        return 1
    raise ValueError(f"sentiment score {score} outside [0, 1]")


def sst5_class(score: float) -> int:
    """``SST5.labeling``: five bands of width 0.2, closed on the right."""
    for label, upper in enumerate((0.2, 0.4, 0.6, 0.8, 1.0)):
        if 0 <= score <= upper:
            return label
    raise ValueError(f"sentiment score {score} outside [0, 1]")


def read_stsa(path: Path, task: str) -> list[SourceRecord]:
    """``label sentence`` lines (stsa.binary.*, stsa.fine.*)."""
    records = []
    for lineno, line in read_text_lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        label, _, sentence = line.partition(" ")
        if not label.isdigit() or not sentence.strip():
            raise DataError(
                f"{task}: {path} line {lineno} is not '<label> <sentence>' (the stsa format): {line[:60]!r}"
            )
        records.append(SourceRecord({"label": int(label), "text": sentence.strip()}, f"{path} line {lineno}"))
    return records


def _reader(task: str, to_class: Callable[[float], int | None]) -> Callable[[Path], list[SourceRecord]]:
    def read(path: Path) -> list[SourceRecord]:
        if path.suffix not in (".jsonl", ".json", ".parquet", ".csv"):
            return read_stsa(path, task)
        out = []
        for record in read_records(path):
            label = record.fields.get("label")
            if isinstance(label, float):  # the `sst` treebank schema: a sentiment score in [0, 1]
                try:
                    cls = to_class(label)
                except ValueError as err:
                    raise DataError(f"{task}: field 'label' at {record.where}: {err}") from None
                if cls is None:
                    continue
                record = SourceRecord({**record.fields, "label": cls}, record.where)
            out.append(record)
        return out

    return read


def _render(task: str, answers: Callable[[RenderContext], list[str]]):
    def render(record: SourceRecord, idx: int, ctx: RenderContext) -> ChoiceExample:
        field = "text" if "text" in record.fields else "sentence"
        label = record.get("label", task, int)
        return ChoiceExample.build(
            task,
            idx,
            record.where,
            context=CONTEXT.format(record.get(field, task)),
            premise_free=PREMISE_FREE,
            answers=answers(ctx),
            label=label,
        )

    return render


def _spec(
    name: str,
    title: str,
    hub_id: str,
    stem: str,
    to_class: Callable[[float], int | None],
    answers: Callable[[RenderContext], list[str]],
    shown: str,
    sizes: dict[str, int],
    reference: str,
) -> TaskSpec:
    return register(
        TaskSpec(
            name=name,
            kind="multiple_choice",
            title=title,
            prompt=CONTEXT.format("{sentence}") + " -> " + shown,
            premise_free=repr(PREMISE_FREE),
            source=DataSource(
                hub={s: HubSplit(hub_id, None, s) for s in ("train", "validation", "test")},
                local=LocalFiles(
                    files={
                        "train": (f"*{stem}.train", *hub_layout("train")),
                        "validation": (f"*{stem}.dev", "dev.txt", *hub_layout("validation")),
                        "test": (f"*{stem}.test", "test.txt", *hub_layout("test")),
                    },
                    reader=_reader(name, to_class),
                    hint=f"Use the {stem}.{{train,dev,test}} files ('label sentence' lines) or the {hub_id} "
                    "schema. (Hub 'sst', which the reference read, needs a loading script that datasets refuses.)",
                ),
            ),
            report_split="test",
            selection_split="validation",
            render=_render(name, answers),
            sizes=sizes,
            aliases=(title.lower(),),
            reference=reference,
        )
    )


SST2 = _spec(
    "sst2",
    "SST-2",
    "SetFit/sst2",
    "stsa.binary",
    sst2_class,
    lambda ctx: ["negative\n", "positive\n"],
    "' negative\\n' | ' positive\\n'",
    {"test": 1821, "validation": 872, "train": 6920},
    "tasks/sst.py (SST2.standardize, labeling, get_contrast_ctx)",
)
SST5 = _spec(
    "sst5",
    "SST-5",
    "SetFit/sst5",
    "stsa.fine",
    sst5_class,
    lambda ctx: [a + ctx.eos_token for a in SST5_ANSWERS],
    "' very negative.<eos>' ... ' very positive.<eos>'",
    {"test": 2210, "validation": 1101, "train": 8544},
    "tasks/sst.py (SST5: answer_set, labeling)",
)
