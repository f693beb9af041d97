"""Multiple-choice boosting without labelled selection data (docs/adaptive.md): every label-free
rule of ``cblight.adaptive`` beside the base model, PMI, the validation-chosen alpha* and the oracle alpha.

For each task the script runs ``cblight evaluate -c configs/multiple_choice.yaml`` on the given files (the
per-example cache under ``--out`` makes a rerun free), reads each question's ``log f(a | full)`` and
``log f(a | premise-free)`` from that cache (paper eq. 2), and prints, per task, accuracy with its standard
error and each row's paired difference from alpha* with the standard error of that difference:

    python benchmarks/adaptive_choice.py --model smollm2 --limit 200 --out /tmp/adaptive-mc \\
        --data csqa=commonsenseqa/ piqa=piqa/ sst2=sst2/

Each folder is read as the task's own files (docs/data.md): ``csqa`` ``{train,dev}_rand_split.jsonl``
(alpha* on a fixed-seed train sample), ``sst2`` ``stsa.binary.{dev,test}`` and ``sst5`` ``stsa.fine.{dev,test}``
(alpha* on dev), ``trec`` ``{train,test}.txt`` and ``cb`` / ``rte`` SuperGLUE's ``{train,val}.jsonl`` (alpha* on
a fixed-seed train sample). Two tasks whose selection split is not at hand are split by a fixed seed into two
halves, alpha* chosen on one and reported on the other: ``piqa`` ``valid.jsonl`` + ``valid-labels.lst``
(PIQA's training file), ``agnews`` ``test.csv`` (AG News' ``train.csv``). ``--limit`` keeps the first N
questions of each split.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import ZOO, BenchError, run_main, write_json  # noqa: E402

TASKS = ("csqa", "piqa", "sst2", "sst5", "trec", "agnews", "cb", "rte")
GRID = [round(2.0 - 0.01 * i, 2) + 0.0 for i in range(701)]  # the multiple-choice grid, 2 .. -5 by 0.01


def piqa_halves(folder: Path, out: Path, seed: int) -> dict[str, str]:
    """PIQA's validation set split in two by a fixed seed: ``train`` (selection) and ``valid`` (report)."""
    jsonl, labels = folder / "valid.jsonl", folder / "valid-labels.lst"
    for path in (jsonl, labels):
        if not path.is_file():
            raise BenchError(f"--data piqa={folder}: no {path.name} there")
    rows = jsonl.read_text(encoding="utf-8").splitlines()
    marks = labels.read_text(encoding="utf-8").splitlines()
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    half = len(order) // 2
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", order[:half]), ("valid", order[half:])):
        (out / f"{name}.jsonl").write_text("".join(rows[i] + "\n" for i in part), encoding="utf-8")
        (out / f"{name}-labels.lst").write_text("".join(marks[i] + "\n" for i in part), encoding="utf-8")
    return {"train": str(out / "train.jsonl"), "validation": str(out / "valid.jsonl")}


def agnews_halves(folder: Path, out: Path, seed: int) -> Path:
    """AG News' ``test.csv`` split in two by a fixed seed: ``train.csv`` (selection) and ``test.csv`` (report),
    each with the header row; returns their folder."""
    path = folder / "test.csv"
    if not path.is_file():
        raise BenchError(f"--data agnews={folder}: no test.csv there")
    with open(path, encoding="utf-8", newline="") as fh:
        header, *rows = list(csv.reader(fh))
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    half = len(order) // 2
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", order[:half]), ("test", order[half:])):
        with open(out / f"{name}.csv", "w", encoding="utf-8", newline="") as fh:
            csv.writer(fh).writerows([header, *(rows[i] for i in part)])
    return out


def evaluate(task: str, folder: Path, args: argparse.Namespace) -> Path:
    """Run ``cblight evaluate`` for one task; returns its output directory."""
    out = Path(args.out) / args.model / task
    cmd = [
        sys.executable, "-m", "cblight", "evaluate", "-c", str(ROOT / "configs" / "multiple_choice.yaml"),
        "--model.model", ZOO.get(args.model, args.model), "--model.output_dir", str(out),
        "--model.plots", "false", "--data.tasks", f"[{task}]", "--data.limit", str(args.limit),
        "--trainer.enable_progress_bar", "false", "--data.batch_size", "8",
    ]  # fmt: skip
    if task == "piqa":
        files = piqa_halves(folder, Path(args.out) / "piqa-halves", args.seed)
        cmd += ["--data.data_files", json.dumps({"piqa": files})]
    elif task == "agnews":
        halves = agnews_halves(folder, Path(args.out) / "agnews-halves", args.seed)
        cmd += ["--data.data_dirs", json.dumps({task: str(halves)})]
    else:
        cmd += ["--data.data_dirs", json.dumps({task: str(folder)})]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
    print(f"{task}: cblight evaluate ... --model.output_dir {out}", flush=True)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise BenchError(f"{task}: cblight evaluate failed:\n{done.stderr[-3000:]}")
    return out


def records(folder: Path) -> dict[str, Any]:
    """The cached numbers of one split (every rank's shard), as tensors ordered by example id."""
    import torch

    rows: dict[int, dict[str, Any]] = {}
    for shard in sorted(folder.glob("rank*.jsonl")):
        for line in shard.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            rows[row["id"]] = row
    if not rows:
        raise BenchError(f"no cached records in {folder}")
    ids = sorted(rows)
    width = max(len(rows[i]["ll_full"]) for i in ids)
    full = torch.full((len(ids), width), -math.inf, dtype=torch.float64)
    short = torch.zeros((len(ids), width), dtype=torch.float64)
    for n, i in enumerate(ids):
        m = len(rows[i]["ll_full"])
        full[n, :m] = torch.tensor(rows[i]["ll_full"], dtype=torch.float64)
        short[n, :m] = torch.tensor(rows[i]["ll_short"], dtype=torch.float64)
    labels = torch.tensor([rows[i]["label"] for i in ids])
    return {"full": full, "short": short, "labels": labels}


def splits(task: str, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from cblight.data.registry import get_task

    spec = get_task(task)
    cache = out / "cache" / spec.name
    selection = spec.selection_split + ("-sample" if spec.sample_selection else "")
    return records(cache / selection), records(cache / spec.report_split)


def paired(a: Any, b: Any) -> tuple[float, float]:
    d = a.double() - b.double()
    return 100 * float(d.mean()), 100 * float(d.std(unbiased=True) / math.sqrt(d.numel()))


def task_table(task: str, sel: dict[str, Any], rep: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    from cblight.adaptive import (
        CHOICE_RULES,
        GATE_BITS,
        PRIOR_SHARE,
        choice_alphas,
        context_gain,
        prior_share,
        same_prior_everywhere,
    )
    from cblight.boosting import choice_accuracy_curve, choice_predictions, choice_scores, first_argmax

    grid = torch.tensor(GRID, dtype=torch.float64)
    star = GRID[first_argmax(choice_accuracy_curve(sel["full"], sel["short"], sel["labels"], grid))]
    curve = choice_accuracy_curve(rep["full"], rep["short"], rep["labels"], grid)
    oracle = GRID[first_argmax(curve)]

    def fixed(alpha: float) -> Any:
        return choice_predictions(rep["full"], rep["short"], alpha) == rep["labels"]

    star_correct = fixed(star)
    rows: list[tuple[str, Any, Any]] = [
        ("base (alpha = 0)", fixed(0.0), None),
        ("PMI (alpha = -1)", fixed(-1.0), None),
        (f"alpha* = {star:g} (selection split)", star_correct, None),
        (f"oracle alpha = {oracle:g} (report labels)", fixed(oracle), None),
    ]
    for rule in CHOICE_RULES:
        alpha = choice_alphas(rule, rep["full"], rep["short"], GRID)
        scores = choice_scores(rep["full"], rep["short"], alpha.view(-1, 1))
        rows.append((f"{rule} (no labels)", scores.argmax(-1) == rep["labels"], alpha))
    n = len(rep["labels"])
    context, context_se = context_gain(rep["full"], rep["short"])
    print(f"\n{task}: report n = {n}, selection n = {len(sel['labels'])}")
    print(
        f"context gain (mean JSD, bits): {context:.3f} ± {context_se:.3f}; the gate opens at a lower bound >= {GATE_BITS}"
    )
    share = (
        prior_share(rep["full"], rep["short"]) if same_prior_everywhere(rep["full"], rep["short"]) else None
    )
    if share is not None:
        print(f"one prior for every question: prior share {share:.3f}, the gate opens at >= {PRIOR_SHARE}")
    print(
        f"{'row':<40} {'acc %':>7} {'± se':>6}   {'vs alpha*':>9} {'± se':>6}   {'vs base':>8} {'± se':>6}   alpha"
    )
    out = []
    for name, correct, alpha in rows:
        acc = 100 * float(correct.double().mean())
        se = 100 * math.sqrt(acc / 100 * (1 - acc / 100) / n)
        diff, diff_se = paired(correct, star_correct)
        gain, gain_se = paired(correct, rows[0][1])
        spread = (
            "" if alpha is None else f"{float(alpha.mean()):+.2f}, {float(alpha.std()) if n > 1 else 0:.2f}"
        )
        print(
            f"{name:<40} {acc:7.2f} {se:6.2f}   {diff:+9.2f} {diff_se:6.2f}   {gain:+8.2f} {gain_se:6.2f}   {spread}"
        )
        out.append({"task": task, "row": name, "acc": acc, "stderr": se, "vs_alpha_star": diff,
                    "vs_alpha_star_stderr": diff_se, "vs_base": gain, "vs_base_stderr": gain_se,
                    "alpha_mean": None if alpha is None else float(alpha.mean()), "n": n,
                    "context_gain": context, "prior_share": share})  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2", help="smollm2, gemma or a local model directory")
    parser.add_argument(
        "--data", nargs="+", required=True, metavar="TASK=DIR", help=f"tasks: {', '.join(TASKS)}"
    )
    parser.add_argument("--limit", type=int, default=200, help="questions of each split")
    parser.add_argument("--out", required=True, help="output folder of the evaluate runs (their caches)")
    parser.add_argument("--seed", type=int, default=2022, help="PIQA's and AG News' split into halves")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    tasks = {}
    for item in args.data:
        task, _, folder = item.partition("=")
        if task not in TASKS or not folder:
            raise BenchError(f"--data {item!r}: give TASK=DIR with TASK one of {', '.join(TASKS)}")
        if not Path(folder).is_dir():
            raise BenchError(f"--data {item!r}: no folder {folder}")
        tasks[task] = Path(folder)
    rows = []
    for task, folder in tasks.items():
        out = evaluate(task, folder, args)
        rows += task_table(task, *splits(task, out))
    if args.json:
        write_json(args.json, {"model": args.model, "limit": args.limit, "rows": rows})


if __name__ == "__main__":
    run_main(main)
