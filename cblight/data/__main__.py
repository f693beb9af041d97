"""``cblight data``: list the benchmarks, or print one rendered example of a task (the reference code's
``--peek``).

    cblight data list [--kind multiple_choice|next_token|generation]
    cblight data peek copa --data_dir cblight/assets/demo_data/copa
    cblight data peek sst5 --data_root /data --split test --index 3 --tokenizer gpt2

``list`` needs no data: sizes are the paper's documented split sizes. ``peek`` loads the split like
``evaluate.py`` (``--data_dir``, ``--data_root`` or the Hub) and prints the full context, the premise-free
context and the answers exactly as scored (repr, so leading spaces and newlines show). Special tokens come
from ``--tokenizer`` (default: the bundled GPT-2 tokenizer); ``--max_k`` is LAMA's filter length.
"""

from __future__ import annotations

import sys

from cblight.data.examples import ChoiceExample, NextTokenExample
from cblight.data.registry import TaskKind, all_tasks, get_task
from cblight.errors import CblightError
from cblight.option_types import PositiveInt


def list_tasks(kind: TaskKind | None = None) -> str:
    """Every task: its kind, splits and sizes, prompt, short context and data source; and the files it
    reads from ``data_root/<task>/`` or ``data_dirs.<task>``, per split (the first existing match of each
    split's patterns is read; with ``combine``, every pattern must match).

    Args:
        kind: only tasks of this kind.
    """
    lines = [f"{'task':<15}{'kind':<17}{'reported split':<22}{'alpha (k) chosen on':<34}data"]
    for name, spec in all_tasks().items():
        if kind and spec.kind != kind:
            continue
        label = {split: f"{split} ({size})" for split, size in spec.sizes.items() if size}
        chosen = label.get(spec.selection_split, spec.selection_split) or "-"
        if spec.sample_selection:
            chosen = f"{spec.selection_split} sample of {spec.sizes.get(spec.report_split, 'n')}"
        hub = sorted({h.path + (f" ({h.name})" if h.name else "") for h in spec.source.hub.values()})
        source = f"hub {', '.join(hub)} or local files" if hub else "local files only"
        report = label.get(spec.report_split, spec.report_split)
        lines.append(f"{name:<15}{spec.kind:<17}{report:<22}{chosen:<34}{source}")
        lines += [f"    prompt: {spec.prompt}", f"    short context: {spec.premise_free}"]
        local = spec.source.local
        lines.append(f"    local files in data_root/{name}/ (or data_dirs.{name}, or data_files per split):")
        for split, patterns in local.files.items():
            names = list(dict.fromkeys(patterns))
            shown = (", " if local.combine else " or ").join(names[:3])
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            lines.append(f"      {split + ':':<12}{'all of ' if local.combine else ''}{shown}{more}")
        if local.hint:
            lines.append(f"      ({local.hint})")
        if spec.aliases:
            lines.append(f"    also named: {', '.join(spec.aliases)}")
    return "\n".join(lines)


def peek(
    task: str,
    data_dir: str | None = None,
    data_root: str | None = None,
    split: str | None = None,
    index: int = 0,
    tokenizer: str | None = None,
    max_k: PositiveInt = 5,
    hub_fallback: bool = False,
) -> str:
    """One rendered example of a task, exactly as it is scored.

    The full context, the premise-free context and the answers (repr, so leading spaces and newlines show).

    Args:
        task: the task's name (``cblight data list``).
        data_dir: folder with the task's files (else ``data_root/<task>``, else the Hub).
        data_root: folder holding one sub-folder per task.
        split: split to show (default: the reported split).
        index: which example.
        tokenizer: tokenizer whose special tokens appear in prompts (default: the bundled GPT-2 tokenizer).
        max_k: the largest k of the grid, for LAMA's filter.
        hub_fallback: with ``data_root``, read a task that has no folder there from the Hub.
    """
    from cblight.data.datamodule import EvalDataModule
    from cblight.tiny import GPT2_TOKENIZER_DIR

    spec = get_task(task)
    split = split or spec.report_split
    dm = EvalDataModule(
        tasks=[spec.name],
        data_root=data_root,
        data_dirs={spec.name: data_dir} if data_dir else None,
        hub_fallback=hub_fallback,
        tokenizer=tokenizer or str(GPT2_TOKENIZER_DIR),
        max_k=max_k,
    )
    dm.fixes = ("--data_dir {folder}", "--hub_fallback true")  # peek's options, not evaluate's
    examples = dm.examples(spec.name, split)
    if not 0 <= index < len(examples):
        raise CblightError(f"--index {index} is outside the {len(examples)} examples of {spec.name}/{split}")
    ex = examples[index]
    out = [f"{spec.name} / {split} / example {index} ({ex.where})"]
    if isinstance(ex, ChoiceExample):
        out.append(f"full context:  {ex.context!r}")
        out.append(f"premise-free:  {ex.premise_free!r}" + ("" if ex.premise_free else "  (BOS/EOS alone)"))
        out.append("answers (scored as continuations):")
        out += [f"  [{i}] {c!r}" + ("   <- label" if i == ex.label else "") for i, c in enumerate(ex.choices)]
    elif isinstance(ex, NextTokenExample):
        out.append(f"text:          {ex.text!r}")
        out.append("target:        the text's last token" + (f" ({ex.answer!r})" if ex.answer else ""))
    else:
        out += ["turns:", *(f"  {t!r}" for t in ex.turns)] if ex.turns else []
        out.append(f"prompt:        {ex.prompt!r}")
        if ex.short_prefix:
            out.append(f"short context: {ex.short_prefix!r} + the generated text so far")
        out += [f"reference {i}:   {ref!r}" for i, ref in enumerate(ex.references)]
        if ex.human is not None:
            out.append(f"human:         {ex.human!r}")
    return "\n".join(out)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``cblight data list|peek ...`` (the arguments come from ``sys.argv`` unless given)."""
    from cblight.runs import run_subcommands

    return run_subcommands({"list": list_tasks, "peek": peek}, argv, prog, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main(prog="python -m cblight.data"))
