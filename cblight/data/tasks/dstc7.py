"""DSTC7 task 2 dialog responses (paper §4.2, Table 3): 2208 Reddit contexts, several human references.

Prompt: the context turns, each followed by the model's turn separator (its EOS token: DialoGPT's
``<|endoftext|>``), as DialoGPT is fed; the response follows. The short context of boosting is the
separator plus the response so far (``GenerationExample.short_prefix``); a context too long for the
window loses its oldest turns first (``cut_from="start"``).

Human row: as the DSTC7 evaluation (``dstc.py --vshuman 1``) and DialoGPT's ``extract_human.py`` do, the
reference at index 1 (the second) is held out as the "Human" response and the others are the references.

Accepted files (``data_dir`` with ``test.jsonl`` / ``test.refs.txt``, or ``data_files``):

* jsonl, one object per line: ``{"id": ..., "context": ["turn 1", "turn 2", ...] or "turn 1 EOS turn 2",
  "references": ["response", ...], "human": "..."}``; with ``human`` given, all ``references`` are kept.
* The DSTC7 multi-reference file (``test.refs.txt``, tab-separated): ``first<TAB>score|response<TAB>...``.
  ``first`` is the context (turns separated by `` EOS ``, the layout DialoGPT's README builds) or, in the
  official ``data_extraction`` output, the example's hash; the context then comes from the
  ``*.convos.txt`` beside it (7 columns: hash, subreddit, conversation id, score, turn, context, response),
  and a keys file beside it (``keys.2k.txt`` or ``test.2k.txt``, one hash per line; the paper's 2208)
  selects and orders the examples. A response is the text between the first and the second ``|`` of its
  cell, as the DSTC7 scripts read it. A leading ``START`` turn marker is dropped.
"""

from __future__ import annotations

import re
from pathlib import Path

from cblight.data.examples import DataError, GenerationExample
from cblight.data.registry import RenderContext, TaskSpec, register
from cblight.data.sources import DataSource, LocalFiles, SourceRecord, read_records, read_text_lines

NAME = "dstc7"
HUMAN_INDEX = 1
_HASH = re.compile(r"[0-9a-f]{32,64}")
KEY_FILES = ("keys.2k.txt", "test.2k.txt")


def split_turns(context: str) -> list[str]:
    """DSTC7's `` EOS ``-separated context as turns, without the ``START`` marker."""
    turns = [t.strip() for t in re.split(r"(?:^|\s)EOS(?:\s|$)", context)]
    turns = [t for t in turns if t]
    if turns and turns[0] == "START":
        turns = turns[1:]
    elif turns and turns[0].startswith("START "):
        turns[0] = turns[0][len("START ") :]
    return turns


def _response(cell: str) -> str:
    return cell.split("|")[1] if "|" in cell else cell


def _contexts(folder: Path) -> dict[str, str]:
    contexts: dict[str, str] = {}
    for path in sorted(folder.glob("*.convos.txt")):
        for lineno, line in read_text_lines(path):
            cells = line.rstrip("\r\n").split("\t")
            if len(cells) != 7:
                raise DataError(
                    f"{NAME}: {path} line {lineno} has {len(cells)} tab-separated fields, expected 7"
                )
            contexts[cells[0]] = cells[5]
    return contexts


def read_refs(path: Path) -> list[SourceRecord]:
    """A DSTC7 multi-reference file (see the module doc) as ``{id, context, references}`` records."""
    rows = []
    for lineno, line in read_text_lines(path):
        cells = line.rstrip("\r\n").split("\t")
        if not line.strip():
            continue
        if len(cells) < 2:
            raise DataError(f"{NAME}: {path} line {lineno} has no tab-separated references")
        rows.append((lineno, cells[0], [_response(c) for c in cells[1:]]))
    if not rows or not all(_HASH.fullmatch(first) for _, first, _ in rows):
        return [
            SourceRecord({"id": n, "context": first, "references": refs}, f"{path} line {n}")
            for n, first, refs in rows
        ]
    contexts = _contexts(path.parent)
    if not contexts:
        raise DataError(
            f"{NAME}: {path} is keyed by hashes; its contexts come from a *.convos.txt file beside it "
            "(DSTC7 data_extraction test.convos.txt), and there is none"
        )
    by_key = {first: (n, refs) for n, first, refs in rows}
    keys = list(by_key)
    for name in KEY_FILES:
        key_file = path.parent / name
        if key_file.is_file():
            keys = [line.strip() for _, line in read_text_lines(key_file) if line.strip()]
            break
    records = []
    for key in keys:
        if key not in by_key:
            raise DataError(f"{NAME}: key {key} of the keys file has no line in {path}")
        if key not in contexts:
            raise DataError(f"{NAME}: key {key} ({path}) has no context in the *.convos.txt beside it")
        n, refs = by_key[key]
        records.append(
            SourceRecord({"id": key, "context": contexts[key], "references": refs}, f"{path} line {n}")
        )
    return records


def read_dstc7(path: Path) -> list[SourceRecord]:
    if path.suffix in (".jsonl", ".json", ".parquet"):
        return read_records(path)
    return read_refs(path)


def render(record: SourceRecord, idx: int, ctx: RenderContext) -> GenerationExample:
    context = record.get("context", NAME, str | list)
    turns = split_turns(context) if isinstance(context, str) else [str(t).strip() for t in context]
    if not turns or not all(turns):
        raise DataError(f"{NAME}: record at {record.where} has an empty context or an empty turn")
    refs = record.get("references", NAME, list)
    if not refs or not all(isinstance(r, str) for r in refs):
        raise DataError(f"{NAME}: field 'references' at {record.where} should be a non-empty list of texts")
    human = record.fields.get("human")
    if human is None and len(refs) > HUMAN_INDEX:
        human = refs[HUMAN_INDEX]
        refs = refs[:HUMAN_INDEX] + refs[HUMAN_INDEX + 1 :]
    sep = ctx.eos_token
    return GenerationExample(
        idx=idx,
        prompt="".join(turn + sep for turn in turns),
        references=tuple(refs),
        where=record.where,
        human=human,
        turns=tuple(turns),
        cut_from="start",
        short_prefix=sep,
    )


SPEC = register(
    TaskSpec(
        name=NAME,
        kind="generation",
        title="DSTC7 (task 2)",
        prompt="turn<sep>turn<sep>... (sep = the model's EOS) -> response, greedy",
        premise_free="<sep> + the response so far",
        source=DataSource(
            local=LocalFiles(
                files={"test": ("test.jsonl", "test.refs.txt", "test.refs", "*.refs.txt")},
                reader=read_dstc7,
                hint="Use a jsonl ({context, references[, human]}) or DSTC7's multi-reference test.refs.txt.",
            ),
            hub_refusal="DSTC7 is read from local files: pass data_dir=<folder with test.jsonl or DSTC7's "
            "multi-reference test.refs.txt> (see cblight/data/tasks/dstc7.py for the formats).",
        ),
        report_split="test",
        selection_split=None,
        render=render,
        sizes={"test": 2208},
        reference="paper §4.2; DSTC7 evaluation/src/dstc.py and DialoGPT dstc/extract_human.py (human row)",
    )
)
