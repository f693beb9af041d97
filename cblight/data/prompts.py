"""Fitting a prompt into the model window (DESIGN.md §1: contexts longer than the window are cut; for
summarisation the article's *tail* is cut and `` TL;DR:`` kept, appendix "GPT-2 summarization experiments").

``fit_prompt`` is shared by evaluation and generation: it returns the token ids of a prompt in at most
``budget`` tokens (the caller's window minus the tokens it will generate), counting the tokenizer's special
prefix (Llama's BOS). A prompt that fits is encoded whole, exactly as the scorer would; one that does not
keeps ``keep_suffix`` intact and cuts the rest from ``cut_from``: ``"end"`` keeps the beginning of the
text (a news article's lead), ``"start"`` keeps its end (the latest dialog turns, the end of a passage).
"""

from __future__ import annotations

from typing import Any, Literal

from cblight.data.examples import DataError, GenerationExample

__all__ = ["fit_example", "fit_prompt"]


def fit_prompt(
    tokenizer: Any,
    prompt: str,
    budget: int,
    *,
    keep_suffix: str = "",
    cut_from: Literal["start", "end"] = "start",
) -> list[int]:
    """Token ids of ``prompt`` (special prefix included) in at most ``budget`` tokens; see the module doc."""
    from cblight.scoring import Encoder

    if cut_from not in ("start", "end"):
        raise ValueError(f"cut_from must be 'start' or 'end', got {cut_from!r}")
    if keep_suffix and not prompt.endswith(keep_suffix):
        raise DataError(f"prompt does not end with the marker to keep ({keep_suffix!r}): ...{prompt[-40:]!r}")
    from cblight.generation.prompts import fit_row

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


def fit_example(tokenizer: Any, example: GenerationExample, budget: int) -> list[int]:
    """``fit_prompt`` with the example's own marker and cutting side."""
    return fit_prompt(
        tokenizer, example.prompt, budget, keep_suffix=example.keep_suffix, cut_from=example.cut_from
    )
