"""Fitting token rows and prompts into the model window (docs/design.md, "Mathematics": contexts longer than the window are
cut from the left, the special prefix kept; for summarisation the article's *tail* is cut and `` TL;DR:``
kept, appendix "GPT-2 summarization experiments").

The one cutting path of the project, shared by the generation evaluator and boosted decoding
(``cblight.generate.inputs``). ``fit_row`` cuts token ids; ``fit_prompt`` encodes a text with the
tokenizer's conventions and cuts it; ``fit_example`` applies an evaluation example's own marker and side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from cblight.errors import BoostingError, DataError
from cblight.scoring import Encoder

__all__ = ["fit_example", "fit_prompt", "fit_row", "has_prefix"]


def has_prefix(row: Sequence[int], prefix: Sequence[int]) -> bool:
    """Whether ``row`` starts with the tokenizer's (non-empty) special prefix."""
    return bool(prefix) and len(row) >= len(prefix) and list(row[: len(prefix)]) == list(prefix)


def fit_row(
    row: Sequence[int], room: int, prefix: Sequence[int] = (), keep_from: int | None = None, index: int = 0
) -> list[int]:
    """Cut a token row to at most ``room`` tokens (docs/design.md, "Mathematics").

    Without ``keep_from`` the row is cut from the left, keeping the special prefix. With ``keep_from`` (a
    marker's position) everything from it on is kept and the tokens just before it are dropped, so the
    head of the text survives (summarisation: the article's tail is cut, the marker kept).
    """
    row = list(row)
    if len(row) <= room:
        return row
    keep_prefix = list(prefix) if has_prefix(row, prefix) else []
    if keep_from is None:
        if room <= len(keep_prefix):
            raise BoostingError(f"prompt {index}: no room for any prompt token (room {room})")
        return keep_prefix + row[len(row) - (room - len(keep_prefix)) :]
    tail = row[keep_from:]
    head_room = room - len(tail)
    if head_room < len(keep_prefix):
        raise BoostingError(
            f"prompt {index}: the marker and the {len(tail)} tokens from it on do not fit in {room} tokens "
            "(model window minus max_new_tokens)"
        )
    return row[:head_room] + tail


def fit_prompt(
    tokenizer: Any,
    prompt: str,
    budget: int,
    *,
    keep_suffix: str = "",
    cut_from: Literal["start", "end"] = "start",
) -> list[int]:
    """Token ids of ``prompt`` (special prefix included) in at most ``budget`` tokens; see the module doc."""
    if keep_suffix and not prompt.endswith(keep_suffix):
        raise DataError(f"prompt does not end with the marker to keep ({keep_suffix!r}): ...{prompt[-40:]!r}")
    enc = Encoder(tokenizer)
    whole = enc.context(prompt)
    if len(whole) <= budget:
        return whole
    body = enc.body(prompt[: len(prompt) - len(keep_suffix)])
    suffix = enc.body(keep_suffix) if keep_suffix else []
    if budget - len(enc.prefix) - len(suffix) < 1:
        raise DataError(
            f"a token budget of {budget} leaves no room for the prompt: the special prefix and the kept "
            f"marker {keep_suffix!r} alone take {len(enc.prefix) + len(suffix)} tokens"
        )
    row = enc.prefix + body + suffix
    # cut_from="end": everything from the marker on is kept and the text just before it goes
    keep_from = len(enc.prefix) + len(body) if cut_from == "end" else None
    return fit_row(row, budget, enc.prefix, keep_from=keep_from)


def fit_example(tokenizer: Any, example: Any, budget: int) -> list[int]:
    """``fit_prompt`` with a generation example's own marker and cutting side (``prompt``, ``keep_suffix``,
    ``cut_from`` of ``cblight.data.examples.GenerationExample``)."""
    return fit_prompt(
        tokenizer, example.prompt, budget, keep_suffix=example.keep_suffix, cut_from=example.cut_from
    )
