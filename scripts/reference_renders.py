"""Regenerate tests/fixtures/reference_renders.json: the authors' own prompt code run on our fixtures.

    python scripts/reference_renders.py /path/to/zhenwang9102/coherence-boosting

For every multiple-choice fixture file it runs the reference task class's ``standardize`` and
``get_contrast_ctx`` (authors' repo, ``tasks/<name>.py``) and stores the full context, the premise-free
context, the choices as scored (``" " + choice``) and the label. ``tests/data/test_tasks.py`` checks cblight's
rendering against this file, so the test needs no copy of the authors' repo. Their heavy imports
(``datasets``, ``best_download``, ``pytablewriter``, ``openai``, ``pandas``) are stubbed; their GPT-2
tokenizer is the bundled one. Their file loaders are not run: the records are fed in the schema their
``standardize`` expects (the hub schema; ``sst``'s float sentiment for SST; their TREC/AGNews/StoryCloze
row dicts), built here from the fixture files.
"""

from __future__ import annotations

import csv
import importlib
import json
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def _stub_imports(repo: Path) -> None:
    sys.path.insert(0, str(repo))
    sys.path.insert(0, str(ROOT))
    for name in ("best_download", "pytablewriter", "openai", "pandas", "datasets"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["best_download"].download_file = None
    for name in ("TsvTableWriter", "MarkdownTableWriter", "LatexTableWriter"):
        setattr(sys.modules["pytablewriter"], name, object)
    import transformers

    from cblight.tiny import gpt2_tokenizer

    tok = gpt2_tokenizer()
    transformers.GPT2Tokenizer.from_pretrained = staticmethod(lambda *a, **k: tok)


SST_ANSWERS = {
    "SST2": ["negative\n", "positive\n"],
    "SST5": [
        f"{a}<|endoftext|>"
        for a in ("very negative.", "somewhat negative.", "neutral.", "somewhat positive.", "very positive.")
    ],
}


def reference_render(module: str, cls_name: str, sample: dict) -> dict:
    cls = getattr(importlib.import_module(f"tasks.{module}"), cls_name)
    task = object.__new__(cls)  # skip __init__: it downloads data
    if cls_name in SST_ANSWERS:
        task.answer_set = SST_ANSWERS[cls_name]
    data = task.standardize(dict(sample))
    data["input"] = data["context"]  # zero-shot, no description (utils.construct_fs_prompt)
    premise_free = task.get_contrast_ctx([data])[0]
    return {
        "context": data["context"],
        "premise_free": "" if premise_free == "<|endoftext|>" else premise_free,  # "" = BOS/EOS alone
        "choices": [" " + c for c in data["choices"]],
        "label": int(data["label"]),
    }


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open(encoding="utf-8")]


def sst_rows(path: Path, scores: list[float]) -> list[dict]:
    rows = []
    for line in path.open(encoding="utf-8"):
        label, _, sentence = line.rstrip("\n").partition(" ")
        rows.append({"sentence": sentence, "label": scores[int(label)]})
    return rows


def trec_rows(path: Path) -> list[dict]:
    detokenizer = importlib.import_module("utils").detokenizer
    rows = []
    for raw in path.open("rb"):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            line = raw.decode("latin-1")
        question = detokenizer(line[line.index(" ") + 1 :]).strip()
        rows.append({"label": line[: line.index(" ")].split(":")[0], "question": question})
    return rows


def cases() -> list[tuple[str, str, str, str, str, list[dict]]]:
    """(task, split, fixture file, reference module, reference class, records in the reference's schema)."""
    f = FIXTURES
    agnews_cols = ["Class Index", "Title", "Description"]
    sc_test = "storycloze/cloze_test_test__spring2016 - cloze_test_ALL_test.csv"
    sc_val = "storycloze/cloze_test_val__spring2016 - cloze_test_ALL_val.csv"
    return [
        (
            "storycloze",
            "test",
            sc_test,
            "storycloze",
            "StoryCloze",
            list(csv.DictReader((f / sc_test).open())),
        ),
        (
            "storycloze",
            "test",
            "storycloze/hub/test.jsonl",
            "storycloze",
            "StoryCloze",
            list(csv.DictReader((f / sc_test).open())),
        ),
        (
            "storycloze",
            "validation",
            sc_val,
            "storycloze",
            "StoryCloze",
            list(csv.DictReader((f / sc_val).open())),
        ),
        (
            "hellaswag",
            "validation",
            "hellaswag/hellaswag_val.jsonl",
            "hellaswag",
            "HellaSwag",
            jsonl(f / "hellaswag/hub/validation.jsonl"),
        ),
        (
            "hellaswag",
            "validation",
            "hellaswag/hub/validation.jsonl",
            "hellaswag",
            "HellaSwag",
            jsonl(f / "hellaswag/hub/validation.jsonl"),
        ),
        ("copa", "validation", "copa/val.jsonl", "copa", "COPA", jsonl(f / "copa/val.jsonl")),
        (
            "csqa",
            "validation",
            "csqa/dev_rand_split.jsonl",
            "csqa",
            "CommonsenseQA",
            jsonl(f / "csqa/hub/validation.jsonl"),
        ),
        (
            "csqa",
            "validation",
            "csqa/hub/validation.jsonl",
            "csqa",
            "CommonsenseQA",
            jsonl(f / "csqa/hub/validation.jsonl"),
        ),
        (
            "csqa",
            "train",
            "csqa/train_rand_split.jsonl",
            "csqa",
            "CommonsenseQA",
            jsonl(f / "csqa/hub/train.jsonl"),
        ),
        (
            "openbookqa",
            "test",
            "openbookqa/test.jsonl",
            "openbookqa",
            "OpenBookQA",
            jsonl(f / "openbookqa/hub/test.jsonl"),
        ),
        (
            "openbookqa",
            "test",
            "openbookqa/hub/test.jsonl",
            "openbookqa",
            "OpenBookQA",
            jsonl(f / "openbookqa/hub/test.jsonl"),
        ),
        (
            "arc_easy",
            "validation",
            "arc_easy/ARC-Easy-Dev.jsonl",
            "arc",
            "ARCEasy",
            jsonl(f / "arc_easy/hub/validation.jsonl"),
        ),
        (
            "arc_challenge",
            "test",
            "arc_challenge/ARC-Challenge-Test.jsonl",
            "arc",
            "ARCChallenge",
            jsonl(f / "arc_challenge/hub/test.jsonl"),
        ),
        (
            "arc_challenge",
            "test",
            "arc_challenge/hub/test.jsonl",
            "arc",
            "ARCChallenge",
            jsonl(f / "arc_challenge/hub/test.jsonl"),
        ),
        ("piqa", "validation", "piqa/valid.jsonl", "piqa", "PIQA", jsonl(f / "piqa/hub/validation.jsonl")),
        (
            "piqa",
            "validation",
            "piqa/hub/validation.jsonl",
            "piqa",
            "PIQA",
            jsonl(f / "piqa/hub/validation.jsonl"),
        ),
        (
            "sst2",
            "test",
            "sst2/stsa.binary.test",
            "sst",
            "SST2",
            sst_rows(f / "sst2/stsa.binary.test", [0.1, 0.9]),
        ),
        (
            "sst5",
            "test",
            "sst5/stsa.fine.test",
            "sst",
            "SST5",
            sst_rows(f / "sst5/stsa.fine.test", [0.1, 0.3, 0.5, 0.7, 0.9]),
        ),
        (
            "agnews",
            "test",
            "agnews/test.csv",
            "agn",
            "AGNews",
            list(csv.DictReader((f / "agnews/test.csv").open())),
        ),
        (
            "agnews",
            "train",
            "agnews/train.csv",
            "agn",
            "AGNews",
            [dict(zip(agnews_cols, r)) for r in csv.reader((f / "agnews/train.csv").open())],
        ),
        ("trec", "test", "trec/TREC_10.label", "trec", "TREC", trec_rows(f / "trec/TREC_10.label")),
        ("trec", "train", "trec/train_5500.label", "trec", "TREC", trec_rows(f / "trec/train_5500.label")),
        ("trec", "test", "trec/hub/test.jsonl", "trec", "TREC", trec_rows(f / "trec/TREC_10.label")),
        ("boolq", "validation", "boolq/val.jsonl", "boolq", "BoolQ", jsonl(f / "boolq/hub/validation.jsonl")),
        (
            "boolq",
            "validation",
            "boolq/hub/validation.jsonl",
            "boolq",
            "BoolQ",
            jsonl(f / "boolq/hub/validation.jsonl"),
        ),
        ("rte", "validation", "rte/val.jsonl", "rte", "RTE", jsonl(f / "rte/hub/validation.jsonl")),
        (
            "rte",
            "validation",
            "rte/hub/validation.jsonl",
            "rte",
            "RTE",
            jsonl(f / "rte/hub/validation.jsonl"),
        ),
        ("cb", "validation", "cb/val.jsonl", "cb", "CommitmentBank", jsonl(f / "cb/hub/validation.jsonl")),
        (
            "cb",
            "validation",
            "cb/hub/validation.jsonl",
            "cb",
            "CommitmentBank",
            jsonl(f / "cb/hub/validation.jsonl"),
        ),
    ]


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    _stub_imports(Path(sys.argv[1]))
    out = []
    for task, split, file, module, cls_name, records in cases():
        out.append(
            {
                "task": task,
                "split": split,
                "file": file,
                "reference": f"tasks/{module}.py {cls_name}",
                "examples": [reference_render(module, cls_name, r) for r in records],
            }
        )
    path = FIXTURES / "reference_renders.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(
        f"wrote {path}: {sum(len(c['examples']) for c in out)} examples of {len({c['task'] for c in out})} tasks"
    )


if __name__ == "__main__":
    main()
