"""What a generation run writes and prints: ``generations/<task>/<decoding>.jsonl``, the task's table (a
row per decoding and the Human row: paper Tables 2, 3 and the summarisation table), ``plots/<task>_figure3.png``
(paper Figure 3), samples for W&B, and the tuned-vs-boosted table of ``--compare`` (Table 2's layout).

Rank 0 writes; every file atomically (``cblight.results``). Nothing here touches a model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from cblight.generate.decodings import Decoding, DecodingGrid, GenerationTask
from cblight.metrics.tables import DIALOG_TITLES
from cblight.results import atomic_write_jsonl, format_table, save_figure

GENERATION_FIELDS = ("id", "prompt", "context", "tokens", "text", "summary", "alphas")


def task_result(
    task: GenerationTask, columns: list[str], rows: dict[str, dict[str, Any]], human: dict[str, Any] | None
) -> dict[str, Any]:
    """One task's entry of ``results.json``: a row of metric values per decoding, and the human row."""
    return {
        "table": task.table,
        "split": task.split.split,
        "n": len(task.split.examples),
        "max_new_tokens": task.max_new_tokens,
        "columns": columns,
        "rows": rows,
        "human": human,
        "decodings": {d.name: d.describe() for d in task.decodings},
    }


def task_block(task: GenerationTask, result: dict[str, Any]) -> str:
    """The printed table of one task: a line per decoding, then Human."""
    columns, rows, human = result["columns"], result["rows"], result["human"]
    table_rows = [[d, *(rows[d][c] for c in columns)] for d in rows]
    if human is not None:
        table_rows.append(["Human", *(human[c] for c in columns)])
    title = f"{task.split.task.title} ({task.split.split}, n={result['n']})\n"
    titles = DIALOG_TITLES if result["table"] == "dialog" else {}  # Table 3's headers: N-2, B-4, ...
    block = title + format_table(["decoding", *(titles.get(c, c) for c in columns)], table_rows)
    for name, s in result.get("adaptive", {}).items():
        block += (
            f"\n{name}: adaptive rule {s['rule']}, alpha per token mean {s['alpha_mean']:.4f}, "
            f"sd {s['alpha_sd']:.4f}, min {s['alpha_min']:.4f}, max {s['alpha_max']:.4f} ({s['tokens']} tokens)"
        )
    return block


def alpha_summary(decoding: Decoding, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean, spread and range of an adaptive decoding's per-token alphas (``results.json``'s
    ``adaptive``; docs/adaptive.md), over every generated token of the task."""
    values = [a for r in rows for a in r.get("alphas", [])]
    assert decoding.boosting is not None
    out: dict[str, Any] = {"rule": decoding.boosting.adaptive, "tokens": len(values)}
    if not values:
        return {
            **out,
            "alpha_mean": math.nan,
            "alpha_sd": math.nan,
            "alpha_min": math.nan,
            "alpha_max": math.nan,
        }
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((a - mean) ** 2 for a in values) / len(values))
    return {**out, "alpha_mean": mean, "alpha_sd": sd, "alpha_min": min(values), "alpha_max": max(values)}


def write_generations(
    output_dir: Path, task: GenerationTask, decoding: Decoding, records: dict[int, dict[str, Any]]
) -> tuple[Path, list[dict[str, Any]]]:
    """``generations/<task>/<decoding>.jsonl``: per prompt of this run's split, what the metrics need."""
    ids = set(task.split.by_idx)
    rows = [
        {k: v for k, v in records[i].items() if k in GENERATION_FIELDS} for i in sorted(records) if i in ids
    ]
    path = output_dir / "generations" / task.split.name / f"{decoding.slug}.jsonl"
    return atomic_write_jsonl(path, rows), rows


def show_progress(trainer: Any, text: str) -> None:
    """Which decoding of which prompt batch runs now (one batch can take minutes): on Lightning's progress
    bar when it shows (tqdm's postfix, rich's description), else one log line per (batch, decoding)."""
    callback = trainer.progress_bar_callback
    try:  # TQDMProgressBar raises while it has no test bar
        bar = callback.test_progress_bar
    except (AttributeError, TypeError, AssertionError):
        bar = None
    if hasattr(bar, "set_postfix_str"):  # TQDMProgressBar
        bar.set_postfix_str(text, refresh=True)
    elif (
        getattr(callback, "progress", None) is not None
        and getattr(callback, "test_progress_bar_id", None) is not None
    ):
        callback.progress.update(
            callback.test_progress_bar_id, description=f"Testing {text}"
        )  # RichProgressBar
        callback.refresh()
    else:
        rank_zero_info(f"generation: {text}")


def log_samples(loggers: Any, key: str, rows: list[dict[str, Any]], n: int) -> None:
    """The first ``n`` generations as a W&B table (loggers without ``log_table`` are skipped)."""
    if n <= 0:
        return
    for logger in loggers:
        if hasattr(logger, "log_table"):  # WandbLogger
            data = [[r["id"], r["prompt"][-500:], r["text"]] for r in rows[:n]]
            logger.log_table(key=key, columns=["id", "prompt", "text"], data=data)


def compare_generation_table(runs: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Several checkpoints' runs (``--compare``) in Table 2's layout: one row per (checkpoint, decoding) and
    the human row, per task."""
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


def save_figure3(
    path: Path, title: str, grid: DecodingGrid, decodings: list[Decoding], result: dict[str, Any]
) -> Path:
    """Paper Figure 3: each metric against alpha, one line per k, the human score as a horizontal line."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    columns = [c for c in result["columns"] if c != "meteor_synonyms"]
    names = {(d.boosting.k if grid.ks else None, d.boosting.alpha): d.name for d in decodings if d.boosting}
    ncols = 4
    nrows = math.ceil(len(columns) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4 * ncols, 3 * nrows), squeeze=False)
    alphas = sorted(grid.alphas)
    for ax, col in zip(axes.flat, columns):
        for k in grid.ks or (None,):
            ys = [result["rows"][names[(k, a)]][col] for a in alphas]
            ax.plot(alphas, ys, marker="o", label=f"k = {k}" if k is not None else "boosted")
        if result.get("human"):
            ax.axhline(result["human"][col], color="black", linestyle="--", linewidth=1, label="human")
        ax.set_title(col)
        ax.set_xlabel("alpha")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(columns) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{title}: metrics vs alpha (Figure 3)")
    fig.tight_layout()
    return save_figure(fig, path)
