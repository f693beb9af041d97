"""The paper's Figure 1 as a command: next-token tops under the full context, the short context and the mix.

    cblight contrast --model gpt2 \\
        --context ' Ballad metre is "less regular and more conversational" than common metre'

Without ``--target`` the context's last token is the target and the prediction is made from the tokens
before it (as the authors' ``cb_demo.py``). The boosted model is the generation form of docs/design.md, "Mathematics",
``softmax((1 - alpha) log f_max + alpha log f_k)`` with ``alpha = -0.5`` and ``k = 8`` by default (the paper's
``p_full^1.5 p_short^-0.5``). Unlike ``cb_demo.py``, which prints the unnormalised mix, the boosted
log-probabilities printed here are normalised.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import torch

from cblight.boosting import boosted_log_probs, short_context_ids
from cblight.errors import ConfigError
from cblight.models import DTypeName, LoadOptions, load_causal_lm, load_tokenizer
from cblight.option_types import FiniteFloat, PositiveInt
from cblight.runs import exit_on_bad_input
from cblight.scoring import Encoder, Scorer


@dataclass(frozen=True)
class Ranked:
    rank: int
    token: str
    log_prob: float
    is_target: bool


@dataclass(frozen=True)
class Contrast:
    context: str
    short_context: str
    target: str
    tables: dict[str, list[Ranked]]  # "full", "short", "boosted"
    target_rank: dict[str, int]
    target_tokens: int = 1  # tokens of the --target given; only the first is ranked
    context_tokens: int = 0  # tokens of the context given (special prefix included)
    used_tokens: int = 0  # of them, the tokens the model sees: a context past its window is cut from the left
    window: int = 0  # the model's window


def check_texts(context: str, target: str | None) -> None:
    """An empty context or target, refused before any tokenizer or model loads."""
    if context == "":
        raise ConfigError("--context is empty: give the text whose next token is ranked")
    if target == "":
        raise ConfigError(
            "--target is empty: give the continuation whose first token is ranked (e.g. ' metre'), or leave it "
            "out to rank the context's last token"
        )


def contrast(
    model: Any,
    tokenizer: Any,
    context: str,
    *,
    target: str | None = None,
    k: PositiveInt = 8,
    alpha: FiniteFloat = -0.5,
    top: PositiveInt = 5,
) -> Contrast:
    """Top tokens and the target's rank under ``f_max``, ``f_k`` and the boosted mix (Figure 1), for inputs
    ``contrast_command`` (or the demo) has checked."""
    scorer = Scorer(model, tokenizer, batch_size=2)
    enc = scorer.encoder
    ctx, target_id, n_target = contrast_ids(enc, context, target)
    given = len(ctx)
    ctx = scorer.cut_context(ctx)  # what the model sees, printed as the full context
    full = scorer.next_token_log_probs([ctx])[0]
    short = scorer.last_k_log_probs([ctx], k, full=full[None])[0]
    boosted = boosted_log_probs(full, short, alpha, "generation")
    tables, ranks = {}, {}
    for name, lp in (("full", full.cpu()), ("short", short.cpu()), ("boosted", boosted.cpu())):
        order = torch.argsort(lp, descending=True, stable=True)
        ranks[name] = int((order == target_id).nonzero()[0, 0]) + 1  # the target last when not in the top
        shown = order[:top].tolist() + ([target_id] if ranks[name] > top else [])
        tables[name] = [
            Ranked(
                i + 1 if i < top else ranks[name], repr(tokenizer.decode([t])), float(lp[t]), t == target_id
            )
            for i, t in enumerate(shown)
        ]
    return Contrast(
        context=tokenizer.decode(ctx, skip_special_tokens=True),
        short_context=tokenizer.decode(short_context_ids(ctx, k, enc.prefix), skip_special_tokens=True),
        target=tokenizer.decode([target_id]),
        tables=tables,
        target_rank=ranks,
        target_tokens=n_target,
        context_tokens=given,
        used_tokens=len(ctx),
        window=scorer.window,
    )


def contrast_ids(enc: Encoder, context: str, target: str | None) -> tuple[list[int], int, int]:
    """``(context ids, the target token, tokens of the target given)``: without a target the context's last
    token is the target (``ConfigError`` when the context has fewer than two tokens)."""
    if target is None:
        ids = enc.context(context)
        if len(ids) - len(enc.prefix) < 2:
            raise ConfigError("the context needs at least two tokens when no --target is given")
        return ids[:-1], ids[-1], 1
    ctx, cont = enc.pair(context, target)  # ScoringError when the target encodes to no tokens
    return ctx, cont[0], len(cont)  # Figure 1 ranks one next token


def format_contrast(result: Contrast, k: int, alpha: float) -> str:
    from cblight.results import format_table

    titles = {
        "full": f"Full context:\n{result.context}",
        "short": f"Short context (last {k} tokens):\n{result.short_context}",
        "boosted": f"Boosted: (1 - alpha) log f_full + alpha log f_{k}, alpha = {alpha:g} (normalised)",
    }
    parts = []
    for name, rows in result.tables.items():
        body = [
            [
                r.rank,
                r.token + (" **" if r.is_target else ""),
                f"{r.log_prob:.3f}",
                f"{100 * math.exp(r.log_prob):.4g}%",
            ]
            for r in rows
        ]
        parts.append(titles[name] + "\n\n" + format_table(["rank", "token", "log-prob", "prob"], body))
    parts.append(
        f"** target {result.target!r}: rank " + ", ".join(f"{n} {r}" for n, r in result.target_rank.items())
    )
    return "\n\n".join(parts)


def contrast_command(
    context: str,
    model: str = "gpt2",
    target: str | None = None,
    k: PositiveInt = 8,
    alpha: FiniteFloat = -0.5,
    top: PositiveInt = 5,
    dtype: DTypeName = "float32",
    device: str | None = None,
) -> None:
    """Print the Figure-1 contrast for CONTEXT.

    Args:
        context: the text; without --target its last token is the one to predict.
        model: Hub id or local directory of a causal LM.
        target: the continuation whose first token is ranked, e.g. ' metre' (a longer one: a note says so).
        k: short-context length (the authors' demo uses 8).
        alpha: boosting coefficient of the generation form (-0.5 gives p_full^1.5 p_short^-0.5).
        top: how many top tokens to list.
        dtype: model weights dtype.
        device: e.g. cuda; default CPU.
    """
    check_texts(context, target)  # before the model is loaded
    tok = load_tokenizer(model)
    contrast_ids(Encoder(tok), context, target)  # the token counts, before the model too
    lm = load_causal_lm(model, LoadOptions(dtype=dtype), device=device)
    result = contrast(lm, tok, context, target=target, k=k, alpha=alpha, top=top)
    if result.used_tokens < result.context_tokens:
        print(
            f"note: the context is {result.context_tokens} tokens, longer than the window of {model} "
            f"({result.window} tokens): only its last {result.used_tokens} are used (printed as the full context)",
            file=sys.stderr,
        )
    if result.target_tokens > 1:
        print(
            f"note: --target {target!r} is {result.target_tokens} tokens; only its first, {result.target!r}, "
            "is ranked (the next token after the context)",
            file=sys.stderr,
        )
    print(format_contrast(result, k, alpha))


def main(args: list[str] | None = None, prog: str | None = None) -> None:
    """``cblight contrast --context TEXT ...`` (``args`` default to ``sys.argv[1:]``)."""
    from jsonargparse import auto_cli

    from cblight.parse_errors import Parser

    exit_on_bad_input(
        lambda: auto_cli(contrast_command, args=args, as_positional=False, prog=prog, parser_class=Parser)
    )


if __name__ == "__main__":
    main(prog="python -m cblight.contrast")
