"""Tuned vs boosted vs base: several checkpoints through one evaluation, one comparison table.

``evaluate.py -c <config> --compare '{base: gpt2, tuned: outputs/tuning/gpt2/hf}'`` evaluates every
checkpoint with the config's evaluation module and data, each into ``<output_dir>/<label>/``, and prints one
table:

* multiple choice and next-token tasks (the paper's Table 4 layout): per task, each checkpoint's accuracy
  without boosting (``alpha = 0``) and with it (``alpha*`` chosen on the selection split), and ``alpha*``;
* generation (Table 2 layout): one row per checkpoint and decoding (e.g. nucleus and boosted nucleus for
  the base and the tuned model), plus the human row. Perplexity, LTF and delta are measured under the
  *first* checkpoint (the base LM) unless the config sets ``metrics_model``.

The table, the labels' checkpoints and every run's results go to ``<output_dir>/results.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from cblight.errors import ConfigError
from cblight.generate.generation_evaluator import BoostedGenerationEvaluator
from cblight.results import atomic_write_json, format_table
from cblight.runs import run_evaluation


def _check(checkpoints: Mapping[str, str]) -> None:
    if len(checkpoints) < 2:
        raise ConfigError(f"--compare needs at least two checkpoints (label: path), got {dict(checkpoints)}")
    for label in checkpoints:
        if not label or "/" in label or label.startswith("."):
            raise ConfigError(f"--compare: {label!r} cannot name an output folder; use a plain word")


def run_comparison(cli: Any, checkpoints: Mapping[str, str]) -> dict[str, Any]:
    """Evaluate every checkpoint with the parsed config (see the module docstring)."""
    _check(checkpoints)
    template = cli.model
    base_dir = Path(template.output_dir)
    hparams = {k: v for k, v in template.hparams.items() if not k.startswith("_")}  # init args only
    generation = isinstance(template, BoostedGenerationEvaluator)
    first = next(iter(checkpoints.values()))
    if cli.datamodule.splits == {} and hasattr(cli.datamodule, "tokenizer"):
        # prompts render with the special tokens of the checkpoints compared, not of the config's model
        cli.datamodule.tokenizer = first
    runs: dict[str, Any] = {}
    for label, path in checkpoints.items():
        args = {
            **hparams,
            "model": path,
            "tokenizer": None,
            "output_dir": str(base_dir / label),
            "run_label": label,
        }
        if generation and not hparams.get("metrics_model"):
            args["metrics_model"] = first  # perplexity, LTF and delta under the base LM (Table 2)
        module = type(template)(**args)
        trainer = cli.instantiate_trainer(logger=cli.trainer.loggers or False, callbacks=[])
        runs[label] = run_evaluation(trainer, module, cli.datamodule, print_summary=False)
    table, rows = generation_table(runs) if generation else accuracy_table(runs)
    payload = {"checkpoints": dict(checkpoints), "summary": table, "rows": rows, "runs": runs}
    if cli.trainer.is_global_zero:
        path = atomic_write_json(base_dir / "results.json", payload)
        rank_zero_info(f"\nComparison ({', '.join(checkpoints)})\n{table}\n\nresults: {path}")
    return payload


def _pct(value: Any) -> float | None:
    return None if value is None else 100.0 * float(value)


def accuracy_table(runs: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Table 4 layout: per task, each checkpoint's accuracy at ``alpha = 0`` and ``alpha*``, and ``alpha*``."""
    labels = list(runs)
    tasks = list(next(iter(runs.values())))
    rows: list[dict[str, Any]] = []
    for task in tasks:
        row: dict[str, Any] = {"task": task}
        for label in labels:
            report = runs[label][task]["report"]
            row[f"{label}"] = _pct(report.get("acc_base"))
            row[f"{label} + CB"] = _pct(report.get("acc"))
            row[f"{label} alpha*"] = report.get("alpha_star")
        rows.append(row)
    if len(rows) > 1:
        avg: dict[str, Any] = {"task": "average"}
        for key in rows[0]:
            if key == "task":
                continue
            values = [r[key] for r in rows if r[key] is not None]
            avg[key] = sum(values) / len(values) if len(values) == len(rows) else None
        rows.append(avg)
    headers = list(rows[0])
    return format_table(headers, [[r[h] for h in headers] for r in rows]), rows


def generation_table(runs: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Table 2 layout: one row per (checkpoint, decoding) and the human row, per task."""
    blocks, rows = [], []
    first = next(iter(runs.values()))
    for task, result in first.items():
        columns = result["columns"]
        body = []
        for label, run in runs.items():
            for decoding, values in run[task]["rows"].items():
                rows.append({"task": task, "checkpoint": label, "decoding": decoding, **values})
                body.append([f"{label}: {decoding}", *(values[c] for c in columns)])
        if result.get("human"):
            rows.append({"task": task, "checkpoint": "human", "decoding": "human", **result["human"]})
            body.append(["Human", *(result["human"][c] for c in columns)])
        blocks.append(f"{task}\n" + format_table(["row", *columns], body))
    return "\n\n".join(blocks), rows
