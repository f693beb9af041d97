"""What a generation run reports: the one home of everything the generation evaluator writes, logs and prints
once its tables are computed (paper Tables 2, 3, the summarisation table and Figure 3).

* ``TaskTable``: one task's computed table (each row's values, the human row's), as metric values for the
  logger (``test/<task>/<row>/<column>``), as its entry of ``results.json`` and as the printed table (Table 3's
  headers for dialog, each adaptive row's alpha statistics below it);
* ``GenerationReport``: the files of a task, written by rank 0, atomically (``cblight.results``):
  ``generations/<task>/<row>.jsonl`` (per prompt, what the metrics read, from every rank's shard of the
  cache), the adaptive rows' alpha statistics (docs/adaptive.md), W&B sample tables and Figure 3
  (``plots/<task>_figure3.png``) when a grid is given; and the run's summary;
* ``comparison_table``: several checkpoints' runs (``--compare``) in Table 2's layout.

``results.json`` itself is written through the evaluators' shared ``Evaluator.write_results``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cblight.data.datamodule import TaskSplit
from cblight.generate.rows import Decoding, DecodingGrid
from cblight.generate.table_kinds import TableKind
from cblight.results import atomic_write_jsonl, format_table, save_figure

#: The fields of a cached record that ``generations/<task>/<row>.jsonl`` keeps.
GENERATION_FIELDS = ("id", "prompt", "context", "tokens", "text", "summary", "alphas")

Values = dict[str, Any]


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
    rows: list[tuple[str, str, Values]]
    human: Values | None

    @property
    def shown(self) -> list[tuple[str, str, Values]]:
        """Every row of the table, the human row (``Human``, ``human``) last."""
        return [*self.rows, *([("Human", "human", self.human)] if self.human is not None else [])]

    def metrics(self, key: str) -> dict[str, float]:
        """Every value as a logged metric.

        Args:
            key: the task part of the names (``<task>`` or ``<task>/<run_label>``).

        Returns:
            ``{"test/<key>/<row>/<column>": value}`` for every row, the human row included.
        """
        return {
            f"test/{key}/{slug}/{col}": float(values[col])
            for _, slug, values in self.shown
            for col in self.columns
        }

    def result(self, decodings: Sequence[Decoding]) -> dict[str, Any]:
        """The task's entry of ``results.json`` (``GenerationReport.write_task_files`` adds ``adaptive`` and
        ``files``).

        Args:
            decodings: the run's rows, whose settings it records.

        Returns:
            The table's kind, split, size, generation length, columns, rows by name, human row and the rows'
            settings.
        """
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
        """The printed table: its title, a line per decoding, then Human, then each adaptive row's alphas.

        Args:
            result: the task's entry of ``results.json`` (its ``adaptive`` statistics, where written).

        Returns:
            The table as text.
        """
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


class GenerationReport:
    """The files of a generation run (rank 0 writes them) and its summary.

    Args:
        output_dir: the run's output directory.
        decodings: the run's rows.
        grid: the (k, alpha) grid of boosted rows, if any (Figure 3).
        plots: write Figure 3 when a grid is given.
        log_samples: generations per row logged as a W&B table (when W&B logs).
    """

    def __init__(
        self,
        output_dir: Path,
        decodings: Sequence[Decoding],
        grid: DecodingGrid | None,
        plots: bool,
        log_samples: int,
    ):
        self.output_dir = output_dir
        self.decodings = list(decodings)
        self.grid = grid
        self.plots = plots
        self.log_samples = log_samples

    def write_task_files(
        self,
        table: TaskTable,
        result: dict[str, Any],
        records: Callable[[Decoding], Mapping[int, Mapping[str, Any]]],
        loggers: Sequence[Any],
        key: str,
    ) -> None:
        """``generations/<task>/<row>.jsonl`` (per prompt of this run's split), each adaptive row's alpha
        statistics, W&B samples and Figure 3; ``result`` gains ``adaptive`` (where a row has a rule) and
        ``files`` (paths relative to the output directory).

        Args:
            table: the task's computed table.
            result: its entry of ``results.json``, changed in place.
            records: a row's cached records by example id, from every rank's shard (read one row at a time).
            loggers: the run's loggers (W&B's get the sample tables).
            key: the task part of the logged names.
        """
        name = table.split.name
        files: dict[str, str] = {}
        for decoding in self.decodings:
            cached = records(decoding)
            rows = [
                {k: v for k, v in cached[i].items() if k in GENERATION_FIELDS}
                for i in sorted(cached)
                if i in table.split.by_idx
            ]
            path = self.output_dir / "generations" / name / f"{decoding.slug}.jsonl"
            files[decoding.name] = str(atomic_write_jsonl(path, rows).relative_to(self.output_dir))
            if decoding.boosting is not None and decoding.boosting.adaptive is not None:
                result.setdefault("adaptive", {})[decoding.name] = alpha_statistics(
                    decoding.boosting.adaptive, rows
                )
            if self.log_samples:
                for logger in loggers:
                    if hasattr(logger, "log_table"):  # WandbLogger
                        logger.log_table(
                            key=f"test/{key}/{decoding.slug}/samples",
                            columns=["id", "prompt", "text"],
                            data=[[r["id"], r["prompt"][-500:], r["text"]] for r in rows[: self.log_samples]],
                        )
        result["files"] = files
        if self.plots and self.grid is not None:
            plot = self.output_dir / "plots" / f"{name}_figure3.png"
            save_figure3(plot, table.split.task.title, self.grid, self.decodings, result)
            files["figure3"] = str(plot.relative_to(self.output_dir))

    @staticmethod
    def summary(model_name: str, text: str, path: Path) -> str:
        """The run's summary: a title, every task's printed table and where ``results.json`` is.

        Args:
            model_name: the model as the run names it.
            text: the tasks' printed tables.
            path: the written ``results.json``.

        Returns:
            The summary the command prints.
        """
        return f"Generation with coherence boosting, {model_name}\n\n{text}\n\nresults: {path}"


def alpha_statistics(rule: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean, spread and range of an adaptive row's per-token alphas over a task (docs/adaptive.md).

    Args:
        rule: the row's adaptive rule.
        rows: the row's generations, each with its tokens' ``alphas``.

    Returns:
        ``rule``, ``tokens`` (how many alphas), ``alpha_mean``, ``alpha_sd`` (population), ``alpha_min`` and
        ``alpha_max``; NaN for each statistic where there is no alpha.
    """
    values = [a for r in rows for a in r.get("alphas", [])]
    mean = sum(values) / len(values) if values else math.nan
    sd = math.sqrt(sum((a - mean) ** 2 for a in values) / len(values)) if values else math.nan
    return {
        "rule": rule,
        "tokens": len(values),
        "alpha_mean": mean,
        "alpha_sd": sd,
        "alpha_min": min(values, default=math.nan),
        "alpha_max": max(values, default=math.nan),
    }


def comparison_table(runs: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Several checkpoints' runs in Table 2's layout: one row per (checkpoint, decoding) and the human row, per
    task.

    Args:
        runs: each checkpoint's ``results.json`` tasks, by label.

    Returns:
        The printed tables and their rows (``task``, ``checkpoint``, ``decoding`` and the values).
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
    """Paper Figure 3: each metric against alpha, one line per k, the human score as a horizontal line.

    Args:
        path: the PNG to write.
        title: the task's title.
        grid: the run's (k, alpha) grid.
        decodings: the run's rows (the grid's among them).
        result: the task's entry of ``results.json`` (its columns, rows and human row).

    Returns:
        ``path``.
    """
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
