"""What a task is: ``TaskSpec`` (one small spec per benchmark) and the ``RenderContext`` its examples are
rendered with. The specs are registered and looked up by name in ``cblight.data.registry``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cblight.data.examples import Example
from cblight.data.sources import DataSource, SourceRecord

#: What a task scores, answer choices (eq. 2), the next token (Tables 1, 5) or generated text (Tables 2, 3).
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
    as the report split (the paper's protocol where the reported split is validation, docs/design.md, "Selection protocol").
    ``render(record, idx, ctx)`` turns a raw record into an ``Example`` or raises ``DataError``.

    ``keep(example, tokenizer, max_k)``, where given, drops examples the paper leaves out (LAMA: objects
    that are not one token, prompts no longer than the largest k); it sees the tokenizer and the largest k
    of the grid. ``sizes`` are the paper's split sizes (documented numbers, for ``python -m cblight.data
    list``); ``aliases`` are other accepted names (the reference code's, e.g. ``agn``). Generation tasks
    say how their output is cut: ``output_sentences`` keeps the first n sentences of the generated text
    (summaries) and ``max_new_tokens`` is the paper's generation length.
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
