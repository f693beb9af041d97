"""Fitting a prompt into the model window (DESIGN.md §1: contexts longer than the window are cut; for
summarisation the article's *tail* is cut and `` TL;DR:`` kept, appendix "GPT-2 summarization experiments").

``fit_prompt`` (its home is ``cblight.fitting``, below both data and generation) is shared by evaluation
and generation: it returns the token ids of a prompt in at most ``budget`` tokens (the caller's window
minus the tokens it will generate), counting the tokenizer's special prefix (Llama's BOS). A prompt that fits is encoded whole, exactly as the scorer would; one that does not
keeps ``keep_suffix`` intact and cuts the rest from ``cut_from``: ``"end"`` keeps the beginning of the
text (a news article's lead), ``"start"`` keeps its end (the latest dialog turns, the end of a passage).
"""

from __future__ import annotations

from typing import Any

from cblight.data.examples import GenerationExample
from cblight.fitting import fit_prompt

__all__ = ["fit_example", "fit_prompt"]  # fit_prompt re-exported: its home is cblight.fitting


def fit_example(tokenizer: Any, example: GenerationExample, budget: int) -> list[int]:
    """``fit_prompt`` with the example's own marker and cutting side."""
    return fit_prompt(
        tokenizer, example.prompt, budget, keep_suffix=example.keep_suffix, cut_from=example.cut_from
    )
