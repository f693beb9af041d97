"""The report of a generation run: everything it writes, logs and prints once its tables are computed
(``BoostedGenerationEvaluator.on_test_epoch_end``): each task's table (``TaskTable``: logged metrics, its
``results.json`` entry, the printed table), and on rank 0 (``GenerationReport``) ``generations/<task>/<row>.jsonl``,
the adaptive rows' alpha statistics, W&B samples and Figure 3; and the ``--compare`` table of several
checkpoints' runs (Table 2's layout).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cblight.adaptive import summary
from cblight.data.datamodule import TaskSplit
from cblight.generate.rows import Decoding, DecodingGrid, TableKind
from cblight.results import atomic_write_jsonl, format_table, save_figure

__all__ = ["GenerationReport", "TaskTable", "comparison_table"]

#: The fields of a cached record that ``generations/<task>/<row>.jsonl`` keeps.
GENERATION_FIELDS = ("id", "prompt", "context", "tokens", "text", "summary", "alphas")


@dataclass
class TaskTable:
    """One task's table as computed from its synced suites.

    Args:
        split: the task's split (name, split, examples, spec).
        kind: the kind of table it fills.
        max_new_tokens: the generation length of its rows.
        columns: the table's columns (its suite's).
        rows: ``(name, file-safe name, values)`` of each decoding, in the run's order.
        human: the human row's values (``None``: the task has no human row).
    """

    split: TaskSplit
    kind: TableKind
    max_new_tokens: int
    columns: list[str]
    rows: list[tuple[str, str, dict[str, Any]]]
    human: dict[str, Any] | None

    @property
    def shown(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Every row of the table, the human row (``Human``, ``human``) last."""
        return [*self.rows, *([("Human", "human", self.human)] if self.human is not None else [])]

    def metrics(self, key: str) -> dict[str, float]:
        """Every value as a logged metric, ``test/<key>/<row>/<column>`` (``key``: the task, or
        ``<task>/<run_label>``)."""
        return {
            f"test/{key}/{slug}/{col}": float(values[col])
            for _, slug, values in self.shown
            for col in self.columns
        }

    def result(self, decodings: Sequence[Decoding]) -> dict[str, Any]:
        """The task's entry of ``results.json``: the table's kind, split, size, generation length, columns,
        rows by name, human row and the settings of ``decodings`` (``GenerationReport.write_task_files`` adds
        ``adaptive`` and ``files``)."""
        return {
            "table": self.kind.name,
            "split": self.split.split,
            "n": len(self.split.examples),
            "max_new_tokens": self.max_new_tokens,
            "columns": self.columns,
            "rows": {name: values for name, _, values in self.rows},
            "human": self.human,
            "decodings": {d.name: d.describe() for d in decodings},
        }

    def printed(self, result: Mapping[str, Any]) -> str:
        """The printed table: its title, a line per decoding, then Human, then each adaptive row's alphas
        (``result``'s ``adaptive`` statistics, where rank 0 wrote them)."""
        titles = self.kind.titles
        block = f"{self.split.task.title} ({self.split.split}, n={result['n']})\n" + format_table(
            ["decoding", *(titles.get(c, c) for c in self.columns)],
            [[name, *(values[c] for c in self.columns)] for name, _, values in self.shown],
        )
        for decoding, s in result.get("adaptive", {}).items():
            block += (
                f"\n{decoding}: adaptive rule {s['rule']}, alpha per token mean {s['alpha_mean']:.4f}, "
                f"sd {s['alpha_sd']:.4f}, min {s['alpha_min']:.4f}, max {s['alpha_max']:.4f} "
                f"({s['tokens']} tokens)"
            )
        return block


@dataclass
class GenerationReport:
    """The files of a generation run (rank 0 writes them) and its summary.

    Args:
        output_dir: the run's output directory.
        decodings: the run's rows.
        grid: the (k, alpha) grid of boosted rows, if any (Figure 3).
        plots: write Figure 3 when a grid is given.
        log_samples: generations per row logged as a W&B table (when W&B logs).
    """

    output_dir: Path
    decodings: Sequence[Decoding]
    grid: DecodingGrid | None
    plots: bool
    log_samples: int

    def write_task_files(
        self,
        table: TaskTable,
        result: dict[str, Any],
        caches: Mapping[str, Any],
        loggers: Sequence[Any],
        key: str,
    ) -> None:
        """``generations/<task>/<row>.jsonl`` (per prompt of this run's split), each adaptive row's alpha
        statistics, W&B samples and Figure 3; ``result`` gains ``adaptive`` (where a row has a rule) and
        ``files`` (paths relative to the output directory).

        Args:
            table: the task's computed table.
            result: its entry of ``results.json``, changed in place.
            caches: each row's ``cblight.cache.RecordCache`` by its file-safe name (read one row at a time,
                from every rank's shard).
            loggers: the run's loggers (W&B's get the sample tables).
            key: the task part of the logged names.
        """
        name = table.split.name
        files: dict[str, str] = {}
        wandb = [lg for lg in loggers if hasattr(lg, "log_table")] if self.log_samples else []  # WandbLogger
        for decoding in self.decodings:
            cached = caches[decoding.slug].load()
            rows = [
                {k: v for k, v in cached[i].items() if k in GENERATION_FIELDS}
                for i in sorted(cached)
                if i in table.split.by_idx
            ]
            path = self.output_dir / "generations" / name / f"{decoding.slug}.jsonl"
            files[decoding.name] = str(atomic_write_jsonl(path, rows).relative_to(self.output_dir))
            if decoding.boosting is not None and decoding.boosting.adaptive is not None:
                # the rule, token count and summary of the per-token alphas (docs/adaptive.md); NaN for none
                alphas = torch.tensor([a for r in rows for a in r.get("alphas", [])], dtype=torch.float64)
                stats = {"rule": decoding.boosting.adaptive, "tokens": len(alphas), **summary(alphas)}
                result.setdefault("adaptive", {})[decoding.name] = stats
            samples = [[r["id"], r["prompt"][-500:], r["text"]] for r in rows[: self.log_samples]]
            for logger in wandb:
                logger.log_table(
                    key=f"test/{key}/{decoding.slug}/samples", columns=["id", "prompt", "text"], data=samples
                )
        result["files"] = files
        if self.plots and self.grid is not None:
            plot = self.output_dir / "plots" / f"{name}_figure3.png"
            save_figure3(plot, table.split.task.title, self.grid, self.decodings, result)
            files["figure3"] = str(plot.relative_to(self.output_dir))


def comparison_table(runs: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Several checkpoints' runs (``--compare``) in Table 2's layout: one row per (checkpoint, decoding)
    and the human row, per task.

    Args:
        runs: each checkpoint's per-task results (the ``tasks`` of its ``results.json``: ``columns``,
            ``rows`` by decoding, ``human``) by its label, the base model first.

    Returns:
        The printed tables, one per task, and their rows as dicts (``task``, ``checkpoint``,
        ``decoding`` and the columns).

    Examples:
        >>> task = {"columns": ["ppl", "ltf"], "human": {"ppl": 18.2, "ltf": 0.3}}
        >>> runs = {
        ...     "base": {"webtext": {**task, "rows": {"greedy": {"ppl": 3.1, "ltf": 0.42}}}},
        ...     "tuned": {"webtext": {**task, "rows": {"greedy": {"ppl": 3.4, "ltf": 0.47}}}},
        ... }
        >>> text, rows = comparison_table(runs)
        >>> print(text)
        webtext
        row            ppl    ltf
        -------------  -----  ----
        base: greedy   3.10   0.42
        tuned: greedy  3.40   0.47
        Human          18.20  0.30
        >>> rows[0]
        {'task': 'webtext', 'checkpoint': 'base', 'decoding': 'greedy', 'ppl': 3.1, 'ltf': 0.42}
    """
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
    path: Path, title: str, grid: DecodingGrid, decodings: Sequence[Decoding], result: Mapping[str, Any]
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
        ax.set(title=col, xlabel="alpha")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(columns) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{title}: metrics vs alpha (Figure 3)")
    fig.tight_layout()
    return save_figure(fig, path)
