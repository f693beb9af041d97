"""Task specifications: one small spec per benchmark, and the registry that names them.

A spec says where the data lives (``DataSource``), which split is reported and which one alpha* (and k*)
is chosen on (DESIGN.md §2), and how a raw record becomes an ``Example`` (``render``). Task modules in
``cblight.data.tasks`` register themselves on import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from cblight.data.examples import DataError, Example
from cblight.data.sources import DataSource, SourceRecord

TaskKind = Literal["multiple_choice", "next_token", "generation"]


@dataclass(frozen=True)
class RenderContext:
    """What rendering may need: the split being rendered, and the tokenizer's special tokens (they come
    from the tokenizer, never from literals)."""

    split: str = "test"
    eos_token: str = "<|endoftext|>"
    bos_token: str = "<|endoftext|>"


@dataclass(frozen=True)
class TaskSpec:
    """One benchmark.

    ``report_split`` is the split whose accuracy is reported; ``selection_split`` the one alpha* is chosen
    on. With ``sample_selection`` the selection split is a fixed-seed sample of ``selection_split`` as large
    as the report split (the paper's protocol where the reported split is validation, DESIGN.md §2).
    ``render(record, idx, ctx)`` turns a raw record into an ``Example`` or raises ``DataError``.
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


_REGISTRY: dict[str, TaskSpec] = {}


def register(spec: TaskSpec) -> TaskSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"task {spec.name!r} registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def _load_all() -> None:
    import cblight.data.tasks  # noqa: F401  (registers every task)


def get_task(name: str) -> TaskSpec:
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise DataError(f"unknown task {name!r}; known tasks: {known}") from None


def all_tasks() -> dict[str, TaskSpec]:
    _load_all()
    return dict(sorted(_REGISTRY.items()))
