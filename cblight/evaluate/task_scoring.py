"""How one kind of task is evaluated with boosting: its examples become cached numbers, and the sweep over the
grid becomes alpha* (and k*) and a report.

1. ``missing`` says which parts of an example's cached record must be (re)computed: ``boost`` (every
   number, for a new or changed example) or the comparison methods whose inputs changed;
2. ``score`` computes them through a scorer (``cblight.scoring.Scorer``, or for multiple choice any
   ``TextScorer`` such as a served model's), one forward pass per context form (docs/design.md, "Speed
   floors");
3. ``update`` feeds records to the kind's sweep metric (``cblight.metrics.sweeps``), synced across processes;
4. ``select`` (end of the validation loop) picks alpha* (and k*), ties to the first grid value as in the
   authors' code; ``report`` (end of the test loop) gives accuracies with standard errors and the
   per-example prediction rows.

The two kinds are multiple choice (paper eq. 2, Table 4) and next-token prediction (paper §3, Tables 1 and
5); a task spec's ``kind`` names which.

A kind's report is written here too, by rank 0, atomically (``cblight.results``), never touching the model:
``predictions/<task>.<split>.jsonl``, ``plots/<task>.png`` (the accuracy-vs-alpha curves of paper Figures 2
and 4-6, drawn from each kind's sweep), the summary table of ``results.json``, the comparison-methods table
(Tables 5, 11, 12) and the tuned-vs-boosted table of ``--compare`` (Table 4).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from cblight.boosting import binomial_stderr
from cblight.cache import digest
from cblight.data.datamodule import TaskSplit
from cblight.data.examples import Example
from cblight.evaluate.methods import MethodOptions, not_applicable
from cblight.results import atomic_write_jsonl, format_table, save_figure
from cblight.scoring import TextScorer

Record = dict[str, Any]  #: one example's numbers, as the per-example cache keeps them
Rows = list[dict[str, Any]]  #: the per-example prediction rows of a report
#: a sweep metric's ``compute()`` output: the grid's curves and the synced table
Sweep = dict[str, torch.Tensor]


class TaskScoring(ABC):
    """One task kind's scoring, sweep, selection and report (see the module docstring).

    A kind scores ``split`` with the grids and method options of ``run`` (a ``BoostedEvaluator``), the
    comparison ``methods`` beside boosting and the label-free rule ``adaptive`` (both on the reported split
    only). ``signature`` holds the settings that change the cached numbers (a cache written under others is
    refused); ``record_fields`` are the keys every record of this kind must carry (a cache row without
    them is corrupt and recomputed).
    """

    kind: ClassVar[str] = ""
    record_fields: ClassVar[tuple[str, ...]] = ("id", "input")

    def __init__(self, run: Any, split: TaskSplit, methods: Sequence[str], adaptive: str | None):
        self.methods = list(methods)
        self.adaptive = adaptive
        self.options: MethodOptions = run.method_options or MethodOptions()  # the run's, or the defaults
        self.content_free = self.options.content_free(self.kind)  # contextual calibration's inputs

    def signature(self) -> dict[str, Any]:
        return {}

    # -- scoring -----------------------------------------------------------------------------------------
    @abstractmethod
    def new_sweep(self, split: TaskSplit) -> nn.Module: ...

    @abstractmethod
    def method_digest(self, method: str, example: Example) -> str:
        """A digest of what ``method`` feeds the model for ``example`` (kept in the record)."""

    @abstractmethod
    def score(
        self, scorer: TextScorer, split: TaskSplit, examples: Sequence[Example], previous: dict[int, Record]
    ) -> list[Record]:
        """Records of ``examples``; ``previous`` holds their cached records (parts still valid are kept)."""

    @abstractmethod
    def update(self, sweep: Any, records: Sequence[Record]) -> None: ...

    def describe(self, split: TaskSplit, requested: Sequence[str]) -> dict[str, Any]:
        """What ``results.json`` says about each requested comparison method: reported (with the strings
        it used: calibration's content-free inputs here, a kind's own strings in its override) or why not."""
        info = {
            m: {"reported": False, "not_applicable": reason}
            if (reason := not_applicable(m, split))
            else {"reported": True}
            for m in requested
        }
        if "calibrate" in self.methods:
            info["calibrate"]["content_free_inputs"] = self.content_free
        return info

    # -- the cache ---------------------------------------------------------------------------------------
    def missing(self, record: Record | None, example: Example) -> list[str]:
        """The parts of ``record`` to (re)compute for ``example``: ``boost`` (everything, for a new or
        changed example: another input, or not as many values as the example and grid need, which each kind's
        ``_record_has_shape`` checks; a row of another shape is recomputed, never read) or the methods whose
        inputs changed; empty when it is complete."""
        fresh = record is not None and record.get("input") == self.input_digest(example)
        if not (fresh and self._record_has_shape(record, example)):
            return ["boost", *self.methods]
        done = record.get("method_inputs", {})
        return [m for m in self.methods if done.get(m) != self.method_digest(m, example)]

    @staticmethod
    def input_digest(example: Example) -> str:
        return digest(example.input_key())

    # -- selection and report ------------------------------------------------------------------------------
    def select(self, split: TaskSplit, out: Sweep) -> dict[str, Any]:
        """alpha* (and k*) on the selection split, from the sweep's ``compute()`` output."""
        info: dict[str, Any] = {"split": split.description, "n": int(out["ids"].numel())}
        if split.sampled_indices is not None:
            info["indices"] = split.sampled_indices
        return {**info, **self.best(out)}

    @abstractmethod
    def best(self, out: Sweep) -> dict[str, Any]:
        """The best grid point of a sweep's ``compute()`` output (ties to the first), its accuracy and the
        accuracy curve: alpha* (and k*) on the selection split, the oracle on the reported one."""

    @abstractmethod
    def report(
        self, split: TaskSplit, out: Sweep, selection: dict[str, Any] | None
    ) -> tuple[dict[str, Any], Rows]:
        """The report split's result (``results.json``) and per-example prediction rows."""

    def _result(
        self, split: TaskSplit, report: dict, selection: dict | None, sweep: dict, **extra: Any
    ) -> dict:
        """The split's entry of ``results.json``: ``extra`` settings, its report, the selection without its
        curves, and the reported sweep beside the selection split's accuracy curve."""
        chosen = {k: v for k, v in (selection or {}).items() if k not in ("curve", "ppl")}
        return {
            "kind": self.kind,
            "title": split.task.title,
            **extra,
            "report": report,
            "selection": chosen or None,
            "sweep": {**sweep, "selection_acc": selection["curve"] if selection else None},
        }


def accuracy(correct: torch.Tensor, key: str) -> dict[str, float]:
    """``{key: the mean of a 0/1 tensor, key_stderr: its binomial standard error}``."""
    acc = float(correct.double().mean())
    return {key: acc, f"{key}_stderr": binomial_stderr(acc, correct.numel())}


SUMMARY_HEADERS = ["task", "split", "n", "acc@0", "acc@-1", "acc@alpha*", "alpha*", "k*", "alpha* chosen on"]


def write_task_files(
    output_dir: Path, split: TaskSplit, result: dict[str, Any], rows: Rows, model_name: str, plots: bool
) -> dict[str, Path]:
    """Predictions (and with ``plots`` the accuracy-vs-alpha plot: the reported and selection curves of a
    multiple-choice task, a next-token task's curves per k) of one task; paths recorded in
    ``result["files"]``."""
    predictions = output_dir / "predictions" / f"{split.name}.{split.split}.jsonl"
    written = {"predictions": atomic_write_jsonl(predictions, rows)}
    if plots:
        sweep, report = result["sweep"], result["report"]
        if result["kind"] == "multiple_choice":
            highlight = f"{split.split} (reported)"
            curves = {highlight: sweep["report_acc"]}
            if sweep["selection_acc"] is not None:
                curves[f"{result['selection']['split']} (alpha selection)"] = sweep["selection_acc"]
        else:
            oracle_k = report["oracle_k"]
            k_star = report.get("k_star", oracle_k)
            curves, highlight = next_token_curves(sweep["ks"], sweep["report_acc"], k_star, oracle_k)
        plot = output_dir / "plots" / f"{split.name}.png"
        title = f"{split.task.title}: accuracy vs alpha ({model_name})"
        written["plot"] = save_alpha_plot(
            plot, title, sweep["alphas"], curves, highlight=highlight, chosen_alpha=report.get("alpha_star")
        )
    result["files"] = {key: str(path.relative_to(output_dir)) for key, path in written.items()}
    return written


def next_token_curves(
    ks: list[int], accuracy: list[list[float]], k_star: int, oracle_k: int, most: int = 5
) -> tuple[dict[str, list[float]], str]:
    """The lines worth drawing of a (k, alpha) accuracy grid: k* (bold), the report split's best k, the
    smallest and the largest k, and evenly spaced ones up to ``most``; k values whose curves coincide share
    one line (``k = 1, 2, 3``). Returns the curves by label and the label of k*'s line."""
    kept = {k_star, oracle_k, ks[0], ks[-1]}
    chosen = [k for k in ks if k in kept or k in ks[:: max(1, len(ks) // (most - 1))]]
    while len(chosen) > most:  # drop the spaced ones nearest their neighbours, never k* or the best k
        spare = [k for k in chosen if k not in kept]
        if not spare:
            break
        chosen.remove(spare[len(spare) // 2])
    groups: dict[tuple[float, ...], list[int]] = {}
    for k in chosen:
        groups.setdefault(tuple(accuracy[ks.index(k)]), []).append(k)
    curves = {
        "k = " + ", ".join(map(str, members)) + (" (k*)" if k_star in members else ""): list(curve)
        for curve, members in groups.items()
    }
    return curves, next(label for label in curves if label.endswith(" (k*)"))  # k* is always drawn


# column name of each comparison method in the paper's Tables 5, 11 and 12
METHOD_COLUMNS = {"pmi_dc": "PMI", "pmi_empty": "PMI (empty)", "calibrate": "CC", "channel": "Channel"}


def summary_text(
    results: dict[str, Any], methods: Sequence[str] = (), adaptive: bool = False
) -> tuple[str, dict[str, Any] | None]:
    """The printed summary of a run (and ``results.json``'s ``summary``): one row per task (with a label-free
    rule, its accuracy and mean alpha after alpha*'s); with comparison methods, the layout of Tables 5, 11
    and 12 below it, also returned as ``results.json``'s ``comparison`` (headers, rows and text; ``None``
    without comparison methods). That layout is one row per task of ``f_max``, PMI, CC, Channel, Ours =
    boosting at alpha* (Tables 11/12) or ``f_max``, CC, Ours with k* (Table 5, LAMA); accuracies in %,
    ``None`` ("-") where a method does not apply to the task; with a label-free rule, its column
    ``Adaptive`` last."""
    headers = [*SUMMARY_HEADERS[:-1], *(["acc@adaptive", "adaptive alpha (mean)"] if adaptive else ())]
    headers.append(SUMMARY_HEADERS[-1])
    rows = []
    for task, result in results.items():
        report = result["report"]
        row = [task, report["split"], report["n"], _pct(report.get("acc_base")), _pct(report.get("acc_pmi"))]
        row += [_pct(report.get("acc")), report.get("alpha_star"), report.get("k_star")]
        if adaptive:
            row += [_pct(report.get("acc_adaptive")), (report.get("adaptive") or {}).get("alpha_mean")]
        rows.append([*row, (result.get("selection") or {}).get("split")])
    table = format_table(headers, rows)
    extra = [m for m in methods if m != "boost"]
    if not extra:
        return table, None
    headers = ["task", "n", "f_max", *(METHOD_COLUMNS[m] for m in extra), "Ours", "alpha*", "k*"]
    headers += ["Adaptive"] if adaptive else []
    rows = []
    for task, result in results.items():
        report = result["report"]
        accuracies = [_pct(report.get(key)) for key in ["acc_base", *(f"acc_{m}" for m in extra), "acc"]]
        row = [task, report["n"], *accuracies, report.get("alpha_star"), report.get("k_star")]
        rows.append([*row, _pct(report.get("acc_adaptive"))] if adaptive else row)
    comparison = format_table(headers, rows)
    table += f"\n\nComparison with other inference methods (paper Tables 5, 11, 12; '-': not applicable)\n{comparison}"
    return table, {"headers": headers, "rows": [dict(zip(headers, row)) for row in rows], "table": comparison}


def _pct(value: Any) -> float | None:
    return None if value is None else 100.0 * float(value)


def compare_accuracy_table(runs: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Several checkpoints' runs (``--compare``) in Table 4's layout: per task, each checkpoint's accuracy at
    ``alpha = 0`` and at ``alpha*``, and ``alpha*``; an average row when there are several tasks.

    Args:
        runs: each checkpoint's ``results.json`` entries by its label: per task, the ``report`` values
            (``acc_base``, ``acc``, ``alpha_star``).

    Returns:
        The table as fixed-width text, and its rows as dicts (accuracies in percent).
    """
    rows: list[dict[str, Any]] = []
    for task in next(iter(runs.values())):
        row: dict[str, Any] = {"task": task}
        for label in runs:
            report = runs[label][task]["report"]
            row[label] = _pct(report.get("acc_base"))
            row[f"{label} + CB"] = _pct(report.get("acc"))
            row[f"{label} alpha*"] = report.get("alpha_star")
        rows.append(row)
    if len(rows) > 1:
        avg: dict[str, Any] = {"task": "average"}
        for key in list(rows[0])[1:]:  # after "task"
            values = [r[key] for r in rows if r[key] is not None]
            avg[key] = sum(values) / len(values) if len(values) == len(rows) else None
        rows.append(avg)
    headers = list(rows[0])
    return format_table(headers, [[r[h] for h in headers] for r in rows]), rows


def save_alpha_plot(
    path: str | Path,
    title: str,
    alphas: Sequence[float],
    curves: Mapping[str, Sequence[float]],
    *,
    highlight: str | None = None,
    chosen_alpha: float | None = None,
) -> Path:
    """Accuracy vs alpha, as the paper's Figures 2 and 4-6: red line at alpha = 0 (the base model), blue at
    alpha = -1 (unconditional normalisation), and the chosen alpha* marked. The legend sits outside the
    axes (never over the title or the curves); the y-axis spans the data with a margin, at least 2 points,
    so an all-zero curve is a flat line at the bottom rather than a band around 0."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4))
    values = [100 * y for ys in curves.values() for y in ys]
    for label, ys in curves.items():
        width, opacity = (2.0, 1) if highlight is None or label == highlight else (0.9, 0.6)
        ax.plot(alphas, [100 * y for y in ys], label=label, linewidth=width, alpha=opacity)
    ax.axvline(0.0, color="red", linewidth=1, label="alpha = 0 (base)")
    if min(alphas) <= -1.0 <= max(alphas):
        ax.axvline(-1.0, color="blue", linewidth=1, linestyle=":", label="alpha = -1")
    if chosen_alpha is not None:
        ax.axvline(
            chosen_alpha, color="green", linewidth=1, linestyle="--", label=f"alpha* = {chosen_alpha:g}"
        )
    ax.set(xlabel="alpha", ylabel="accuracy (%)", ylim=_accuracy_limits(values))
    if values and all(v == 0 for v in values):
        ax.text(0.5, 0.5, "every accuracy is 0%", transform=ax.transAxes, ha="center", color="gray")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def _accuracy_limits(values: Sequence[float]) -> tuple[float, float]:
    """Y limits (in %) around ``values``: a 10% margin, at least 2 points tall, within [0, 100] (a sliver
    below 0 so that a curve at 0 shows)."""
    finite = [v for v in values if math.isfinite(v)] or [0.0]
    low, high = min(finite), max(finite)
    pad = max(0.1 * (high - low), 1.0)
    low, high = max(0.0, low - pad), min(100.0, high + pad)
    if high - low < 2.0:
        high = min(100.0, low + 2.0)
        low = min(low, high - 2.0)
    if low == 0.0:  # a curve at 0 would hide under the axis line
        low = -0.03 * high
    return low, high
