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

from cblight.data.examples import ChoiceExample, DataError, GenerationExample, NextTokenExample
from cblight.data.registry import TaskKind, TaskSpec, all_tasks, get_task
from cblight.errors import CblightError


def _split_label(spec: TaskSpec, split: str | None) -> str:
    if split is None:
        return "-"
    size = spec.sizes.get(split)
    return f"{split} ({size})" if size else split


def _source_label(spec: TaskSpec) -> str:
    hub = sorted({f"{h.path}" + (f" ({h.name})" if h.name else "") for h in spec.source.hub.values()})
    if hub:
        return "hub " + ", ".join(hub) + " or local files"
    return "local files only"


def _local_lines(spec: TaskSpec, shown: int = 3) -> list[str]:
    """The files a task reads from ``data_root/<task>/`` or ``data_dirs.<task>``, per split (the first
    existing match of each split's patterns is read; with ``combine``, every pattern must match)."""
    local = spec.source.local
    if local is None:
        return ["local files: none (Hub only)"]
    out = [f"local files in data_root/{spec.name}/ (or data_dirs.{spec.name}, or data_files per split):"]
    for split, patterns in local.files.items():
        names = list(dict.fromkeys(patterns))
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        join = ", " if local.combine else " or "
        out.append(f"  {split + ':':<12}{'all of ' if local.combine else ''}{join.join(names[:shown])}{more}")
    if local.hint:
        out.append(f"  ({local.hint})")
    return out


def list_tasks(kind: TaskKind | None = None) -> str:
    """Every task: its kind, splits and sizes, prompt, short context and data source.

    Args:
        kind: only tasks of this kind.
    """
    lines = [f"{'task':<15}{'kind':<17}{'reported split':<22}{'alpha (k) chosen on':<34}data"]
    for name, spec in all_tasks().items():
        if kind and spec.kind != kind:
            continue
        if spec.selection_split is None:
            chosen = "-"
        elif spec.sample_selection:
            chosen = f"{spec.selection_split} sample of {spec.sizes.get(spec.report_split, 'n')}"
        else:
            chosen = _split_label(spec, spec.selection_split)
        report = _split_label(spec, spec.report_split)
        lines.append(f"{name:<15}{spec.kind:<17}{report:<22}{chosen:<34}{_source_label(spec)}")
        lines.append(f"{'':<4}prompt: {spec.prompt}")
        lines.append(f"{'':<4}short context: {spec.premise_free}")
        lines += [f"{'':<4}{line}" for line in _local_lines(spec)]
        if spec.aliases:
            lines.append(f"{'':<4}also named: {', '.join(spec.aliases)}")
    return "\n".join(lines)


def describe(task: str, split: str, index: int, example: object) -> str:
    where = getattr(example, "where", "")
    out = [f"{task} / {split} / example {index} ({where})"]
    if isinstance(example, ChoiceExample):
        out.append(f"full context:  {example.context!r}")
        pf = example.premise_free
        out.append(f"premise-free:  {pf!r}" + ("  (BOS/EOS alone)" if pf == "" else ""))
        out.append("answers (scored as continuations):")
        for i, choice in enumerate(example.choices):
            out.append(f"  [{i}] {choice!r}" + ("   <- label" if i == example.label else ""))
    elif isinstance(example, NextTokenExample):
        out.append(f"text:          {example.text!r}")
        out.append(
            "target:        the text's last token" + (f" ({example.answer!r})" if example.answer else "")
        )
    elif isinstance(example, GenerationExample):
        if example.turns:
            out.append("turns:")
            out += [f"  {t!r}" for t in example.turns]
        out.append(f"prompt:        {example.prompt!r}")
        if example.short_prefix:
            out.append(f"short context: {example.short_prefix!r} + the generated text so far")
        for i, ref in enumerate(example.references):
            out.append(f"reference {i}:   {ref!r}")
        if example.human is not None:
            out.append(f"human:         {example.human!r}")
    return "\n".join(out)


def peek(
    task: str,
    data_dir: str | None = None,
    data_root: str | None = None,
    split: str | None = None,
    index: int = 0,
    tokenizer: str | None = None,
    max_k: int = 5,
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
    from cblight.data.datamodule import EvalDataModule, MissingRootError
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
    try:
        dm.check_local()
    except MissingRootError as err:  # the data module names evaluate's options; peek's are these
        raise DataError(err.options(f"--data_dir {err.folder}", "--hub_fallback true")) from None
    examples = dm.examples(spec.name, split)
    if not 0 <= index < len(examples):
        raise CblightError(f"--index {index} is outside the {len(examples)} examples of {spec.name}/{split}")
    return describe(spec.name, split, index, examples[index])


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``cblight data list|peek ...`` (the arguments come from ``sys.argv`` unless given)."""
    from cblight.parse_errors import run_subcommands

    return run_subcommands({"list": list_tasks, "peek": peek}, argv, prog, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main(prog="python -m cblight.data"))
