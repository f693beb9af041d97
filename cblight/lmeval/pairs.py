"""Boosted continuation scores: one continuation under a full and a short context (paper eq. 2).

For each item ``(context_ids, short_ids, continuation_ids)`` this returns ``log f(cont | context)``,
``log f(cont | short)`` (both summed over the continuation's tokens) and whether every continuation token
is the argmax over the whole vocabulary of the boosted next-token distribution
``log f(· | context, cont<j) + alpha · log f(· | short, cont<j)`` (the paper's §3 criterion; lm-eval reads
it as ``is_greedy``, which is LAMBADA's accuracy). ``Scorer.score_choices`` cannot give that flag: it keeps
only the continuation tokens' log-probs, and the flag needs both experts' whole distributions at every
continuation position. So both rows of an item run in one right-padded batch, as lm-eval's own HF backend
runs its rows, with logits kept only at continuation positions (``[rows, len(cont), V]`` per chunk).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cblight.batching import right_pad
from cblight.boosting import log_softmax32, mix_log_probs
from cblight.scoring import Scorer

Item = tuple[Sequence[int], Sequence[int] | None, Sequence[int]]


@dataclass(frozen=True)
class PairScore:
    """``full``/``short``: summed log-likelihoods (``short`` is ``None`` for items without a short context);
    ``is_greedy``: greedy under the boosted distribution (under ``f`` alone when there is no short context)."""

    full: float
    short: float | None
    is_greedy: bool

    def boosted(self, alpha: float) -> float:
        return self.full if self.short is None else self.full + alpha * self.short


@torch.no_grad()
def score_pairs(scorer: Scorer, items: Sequence[Item], alpha: float) -> list[PairScore]:
    """Scores of every item (see the module docstring), in order. An item's rows always share a chunk (so
    no distribution outlives its chunk); chunks hold at most ``scorer.rows_per_batch`` rows (one item at
    least), longest first. Contexts are cut to the window as ``Scorer.truncate`` does."""
    prepared: list[tuple[list[list[int]], list[int], list[int]]] = []  # (rows, first positions, cont)
    for i, (ctx, short, cont) in enumerate(items):
        cont = list(cont)
        if not cont:
            raise ValueError(f"item {i} has an empty continuation")
        rows, starts = [], []
        for c in (ctx,) if short is None else (ctx, short):
            cut = scorer.truncate(c, [cont])
            rows.append(cut + cont[:-1])
            starts.append(len(cut) - 1)
        prepared.append((rows, starts, cont))
    order = sorted(range(len(items)), key=lambda i: -max(len(r) for r in prepared[i][0]))
    results: list[PairScore | None] = [None] * len(items)
    limit = scorer.rows_per_batch
    start = 0
    while start < len(order):
        end, n_rows = start, 0
        while end < len(order) and (end == start or n_rows + len(prepared[order[end]][0]) <= limit):
            n_rows += len(prepared[order[end]][0])
            end += 1
        chunk = order[start:end]
        start = end
        rows = [row for i in chunk for row in prepared[i][0]]
        starts = [s for i in chunk for s in prepared[i][1]]
        lengths = [len(prepared[i][2]) for i in chunk for _ in prepared[i][0]]
        ids, mask = right_pad(rows, scorer.pad_id, scorer.device)
        logits = scorer.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        width = max(lengths)
        index = torch.tensor(
            [[s + min(j, n - 1) for j in range(width)] for s, n in zip(starts, lengths)], device=logits.device
        )
        picked = log_softmax32(logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1])))
        r = 0
        for i in chunk:
            cont = prepared[i][2]
            n = len(prepared[i][0])
            results[i] = _finish([picked[r + j, : len(cont)] for j in range(n)], cont, alpha)
            r += n
    return results  # type: ignore[return-value]


def _finish(log_probs: list[torch.Tensor], cont: list[int], alpha: float) -> PairScore:
    """Sums and the greedy flag of one item from its rows' ``[len(cont), V]`` log-probs."""
    target = torch.tensor(cont, device=log_probs[0].device)
    full = log_probs[0]
    full_sum = float(full.gather(1, target[:, None]).double().sum())
    if len(log_probs) == 1:
        return PairScore(full_sum, None, bool((full.argmax(-1) == target).all()))
    short = log_probs[1]
    short_sum = float(short.gather(1, target[:, None]).double().sum())
    boosted = mix_log_probs([full, short], [1.0, alpha])
    return PairScore(full_sum, short_sum, bool((boosted.argmax(-1) == target).all()))
