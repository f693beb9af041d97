"""What a boosted evaluation writes: ``predictions/<task>.<split>.jsonl``, ``plots/<task>.png`` (the
accuracy-vs-alpha curves of paper Figures 2 and 4-6), ``results.json`` and the printed summary table.

Every file is written atomically (``cblight.results``), by rank 0 only; nothing here touches the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cblight.data.datamodule import TaskSplit
from cblight.results import atomic_write_jsonl, format_table, save_alpha_plot, write_run_results

SUMMARY_HEADERS = ["task", "split", "n", "acc@0", "acc@-1", "acc@alpha*", "alpha*", "k*", "alpha* chosen on"]


def write_task_files(
    output_dir: Path,
    split: TaskSplit,
    result: dict[str, Any],
    rows: list[dict[str, Any]],
    model_name: str,
    plots: bool,
) -> dict[str, Path]:
    """Predictions (and the alpha plot with ``plots``) of one task; paths recorded in ``result["files"]``."""
    written: dict[str, Path] = {}
    written["predictions"] = atomic_write_jsonl(
        output_dir / "predictions" / f"{split.name}.{split.split}.jsonl", rows
    )
    if plots:
        written["plot"] = write_alpha_plot(
            output_dir / "plots" / f"{split.name}.png", split, result, model_name
        )
    result["files"] = {key: str(path.relative_to(output_dir)) for key, path in written.items()}
    return written


def write_alpha_plot(path: Path, split: TaskSplit, result: dict[str, Any], model_name: str) -> Path:
    sweep = result["sweep"]
    report = result["report"]
    if result["kind"] == "multiple_choice":
        curves = {f"{split.split} (reported)": sweep["report_acc"]}
        if sweep["selection_acc"] is not None:
            curves[f"{result['selection']['split']} (alpha selection)"] = sweep["selection_acc"]
        return save_alpha_plot(
            path,
            f"{split.task.title}: accuracy vs alpha ({model_name})",
            sweep["alphas"],
            curves,
            highlight=f"{split.split} (reported)",
            chosen_alpha=report.get("alpha_star"),
        )
    k_star = report.get("k_star", report["oracle_k"])
    curves, highlight = next_token_curves(sweep["ks"], sweep["report_acc"], k_star, report["oracle_k"])
    return save_alpha_plot(
        path,
        f"{split.task.title}: accuracy vs alpha ({model_name})",
        sweep["alphas"],
        curves,
        highlight=highlight,
        chosen_alpha=report.get("alpha_star"),
    )


def next_token_curves(
    ks: list[int], accuracy: list[list[float]], k_star: int, oracle_k: int, most: int = 5
) -> tuple[dict[str, list[float]], str]:
    """The lines worth drawing of a (k, alpha) accuracy grid: k* (bold), the report split's best k, the
    smallest and the largest k, and evenly spaced ones up to ``most``; k values whose curves coincide share
    one line (``k = 1, 2, 3``). Returns the curves by label and the label of k*'s line."""
    picked = [k_star, oracle_k, ks[0], ks[-1]]
    step = max(1, len(ks) // (most - 1))
    picked += ks[::step]
    chosen = [k for k in ks if k in set(picked)]
    while len(chosen) > most:  # drop the spaced ones nearest their neighbours, never k* or the best k
        spare = [k for k in chosen if k not in (k_star, oracle_k, ks[0], ks[-1])]
        if not spare:
            break
        chosen.remove(spare[len(spare) // 2])
    groups: dict[tuple[float, ...], list[int]] = {}
    for k in chosen:
        groups.setdefault(tuple(accuracy[ks.index(k)]), []).append(k)
    curves, highlight = {}, ""
    for curve, members in groups.items():
        label = "k = " + ", ".join(map(str, members)) + (" (k*)" if k_star in members else "")
        curves[label] = list(curve)
        if k_star in members:
            highlight = label
    return curves, highlight


def write_results(
    output_dir: Path,
    results: dict[str, Any],
    settings: dict[str, Any],
    started: float,
    methods: list[str] | None = None,
) -> tuple[Path, str]:
    """``results.json`` (the run's settings, every task's result and the summary table); returns its path
    and the table. With comparison methods, the layout of Tables 5, 11 and 12 too (``comparison``),
    appended to the returned table."""
    table = format_table(SUMMARY_HEADERS, [summary_row(task, result) for task, result in results.items()])
    extra = [m for m in (methods or []) if m != "boost"]
    if extra:
        headers, rows = comparison_table(results, extra)
        comparison = {
            "headers": headers,
            "rows": [dict(zip(headers, row)) for row in rows],
            "table": format_table(headers, rows),
        }
        settings = {**settings, "comparison": comparison}
        table += "\n\nComparison with other inference methods (paper Tables 5, 11, 12; '-': not applicable)\n"
        table += comparison["table"]
    return write_run_results(output_dir, settings, table, results, started), table


# column name of each comparison method in the paper's Tables 5, 11 and 12
METHOD_COLUMNS = {"pmi_dc": "PMI", "pmi_empty": "PMI (empty)", "calibrate": "CC", "channel": "Channel"}


def comparison_table(results: dict[str, Any], methods: list[str]) -> tuple[list[str], list[list[Any]]]:
    """One row per task in the layout of Tables 11/12 (``f_max``, PMI, CC, Channel, Ours = boosting at
    alpha*) and Table 5 for LAMA (``f_max``, CC, Ours with k*); accuracies in %, ``None`` ("-") where a
    method does not apply to the task."""
    headers = ["task", "n", "f_max", *(METHOD_COLUMNS[m] for m in methods), "Ours", "alpha*", "k*"]
    rows = []
    for task, result in results.items():
        report = result["report"]
        rows.append(
            [
                task,
                report["n"],
                _pct(report.get("acc_base")),
                *(_pct(report.get(f"acc_{m}")) for m in methods),
                _pct(report.get("acc")),
                report.get("alpha_star"),
                report.get("k_star"),
            ]
        )
    return headers, rows


def _pct(value: Any) -> float | None:
    return None if value is None else 100.0 * float(value)


def summary_row(task: str, result: dict[str, Any]) -> list[Any]:
    report = result["report"]
    selection = result.get("selection") or {}
    return [
        task,
        report["split"],
        report["n"],
        _pct(report.get("acc_base")),
        _pct(report.get("acc_pmi")),
        _pct(report.get("acc")),
        report.get("alpha_star"),
        report.get("k_star"),
        selection.get("split"),
    ]
