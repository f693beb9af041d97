"""What a boosted evaluation writes: ``predictions/<task>.<split>.jsonl``, ``plots/<task>.png`` (the
accuracy-vs-alpha curves of paper Figures 2 and 4-6), ``results.json`` and the printed summary table.

Every file is written atomically (``cblight.results``), by rank 0 only; nothing here touches the model.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cblight import __version__
from cblight.data.datamodule import TaskSplit
from cblight.results import atomic_write_json, atomic_write_jsonl, format_table, save_alpha_plot

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
    curves = {f"k = {k}": row for k, row in zip(sweep["ks"], sweep["report_acc"])}
    return save_alpha_plot(
        path,
        f"{split.task.title}: accuracy vs alpha per k ({model_name})",
        sweep["alphas"],
        curves,
        highlight=f"k = {k_star}",
        chosen_alpha=report.get("alpha_star"),
    )


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
    payload = {
        "cblight_version": __version__,
        **settings,
        "seconds": round(time.time() - started, 1),
        "summary": table,
        "tasks": results,
    }
    extra = [m for m in (methods or []) if m != "boost"]
    if extra:
        headers, rows = comparison_table(results, extra)
        payload["comparison"] = {
            "headers": headers,
            "rows": [dict(zip(headers, row)) for row in rows],
            "table": format_table(headers, rows),
        }
        table += "\n\nComparison with other inference methods (paper Tables 5, 11, 12; '-': not applicable)\n"
        table += payload["comparison"]["table"]
    return atomic_write_json(output_dir / "results.json", payload), table


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
