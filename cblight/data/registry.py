"""What a task is and the registry that names the tasks.

A ``TaskSpec`` (one small spec per benchmark) says where the data lives (``DataSource``), which split is
reported and which one alpha* (and k*) is chosen on (docs/design.md, "Selection protocol"), and how a raw
record becomes an ``Example`` (``render``, given a ``RenderContext``). Each module of ``cblight.data.tasks``
registers its specs when it is imported; ``get_task`` imports the module named like the task (every module
only for a name that is not one) and looks the task up by name or alias, ``all_tasks`` imports them all.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cblight.data.examples import DataError, Example
from cblight.data.sources import DataSource, SourceRecord

__all__ = ["RenderContext", "TaskKind", "TaskSpec", "all_tasks", "get_task", "register"]

#: What a task scores, answer choices (eq. 2), the next token (Tables 1, 5) or generated text (Tables 2, 3).
TaskKind = Literal["multiple_choice", "next_token", "generation"]


@dataclass(frozen=True)
class RenderContext:
    """What rendering may need: the split being rendered, and the tokenizer's special tokens (they come
    from the tokenizer, never from literals).

    Args:
        split: the split being rendered (``test``, ``validation``, ...).
        eos_token: the tokenizer's EOS token as text (DialoGPT's turn separator).
        bos_token: the tokenizer's BOS token as text.
    """

    split: str = "test"
    eos_token: str = "<|endoftext|>"
    bos_token: str = "<|endoftext|>"


@dataclass(frozen=True)
class TaskSpec:
    """One benchmark: where its data lives, which split is reported and which one alpha* (and k*) is chosen on
    (docs/design.md, "Selection protocol"), and how a raw record becomes an ``Example``.

    Args:
        name: the task's name (``copa``).
        kind: what the task scores: ``multiple_choice`` (eq. 2), ``next_token`` (Tables 1, 5) or
            ``generation`` (Tables 2, 3).
        title: the benchmark's name as the paper writes it.
        prompt: the prompt format in words, for listings.
        source: where the records come from (the Hub dataset, local file names and formats).
        report_split: the split whose accuracy is reported.
        selection_split: the split alpha* is chosen on (``None``: none).
        render: ``render(record, idx, ctx)`` turns a raw record into an ``Example`` or raises ``DataError``.
        sample_selection: the selection split is a fixed-seed sample of ``selection_split`` as large as the
            report split (the paper's protocol where the reported split is validation).
        premise_free: the premise-free (short) context in words, for listings.
        keep: ``keep(example, tokenizer, max_k)`` drops examples the paper leaves out (LAMA: objects that are
            not one token, prompts no longer than the largest k of the grid).
        sizes: the paper's split sizes (documented numbers, for ``python -m cblight.data list``).
        aliases: other accepted names (the reference code's, e.g. ``agn``).
        reference: the authors' file (and function) this spec follows.
        output_sentences: generation tasks: keep the first n sentences of the generated text (summaries).
        max_new_tokens: generation tasks: the paper's generation length.

    Examples:
        >>> spec = get_task("copa")
        >>> spec.kind, spec.report_split, spec.selection_split
        ('multiple_choice', 'validation', 'train')
    """

    name: str
    kind: TaskKind
    title: str
    prompt: str
    source: DataSource
    report_split: str
    selection_split: str | None
    render: Callable[[SourceRecord, int, RenderContext], Example]
    sample_selection: bool = False
    premise_free: str = ""  # the premise-free (short) context in words, for listings
    keep: Callable[[Any, Any, int | None], bool] | None = None
    sizes: Mapping[str, int] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    reference: str = ""  # the authors' file (and function) this spec follows
    output_sentences: int | None = None
    max_new_tokens: int | None = None


_TASKS = "cblight.data.tasks"
_NAMES: dict[str, TaskSpec] = {}  # every task's name and aliases


def register(spec: TaskSpec) -> TaskSpec:
    """Add a task spec under its name and aliases: each module of ``cblight.data.tasks`` registers its specs
    this way when it is imported.

    Args:
        spec: the new task.

    Returns:
        ``spec``, so that a module can write ``COPA = register(TaskSpec(...))``.

    Raises:
        ValueError: for a name or alias that is taken.
    """
    for name in (spec.name, *spec.aliases):
        if name in _NAMES:
            raise ValueError(f"task name {name!r} registered twice")
    _NAMES.update(dict.fromkeys((spec.name, *spec.aliases), spec))
    return spec


def _import(*modules: str) -> None:
    """Import task modules by name (every one when none is named); importing one registers its specs."""
    names = {module.name for module in pkgutil.iter_modules(importlib.import_module(_TASKS).__path__)}
    for name in [m for m in modules if m in names] if modules else sorted(names):
        importlib.import_module(f"{_TASKS}.{name}")


def get_task(name: str) -> TaskSpec:
    """The task spec named ``name`` or one of its aliases (``python -m cblight.data list`` lists them).

    Args:
        name: a task name, or an alias such as the reference code's ``agn``.

    Returns:
        The ``TaskSpec``.

    Raises:
        ~cblight.errors.DataError: for an unknown name, listing the known tasks.

    Examples:
        >>> get_task("agn").name
        'agnews'
    """
    for modules in ((name,), ()):  # most tasks live in a module of their name; else import them all
        if name not in _NAMES:
            _import(*modules)
    if name not in _NAMES:
        raise DataError(f"unknown task {name!r}; known tasks: {', '.join(sorted(all_tasks()))}")
    return _NAMES[name]


def all_tasks() -> dict[str, TaskSpec]:
    """Every registered task spec by name, sorted (every task module imported).

    Returns:
        ``{name: TaskSpec}``.

    Examples:
        >>> "lambada" in all_tasks()
        True
    """
    _import()
    return dict(sorted({spec.name: spec for spec in _NAMES.values()}.items()))
