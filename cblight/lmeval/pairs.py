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

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cblight.adaptive import choice_alphas, token_alphas
from cblight.batching import right_pad
from cblight.boosting import AlphaGrid, boosted_log_probs, log_softmax32, mix_log_probs
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
def score_pairs(
    scorer: Scorer, items: Sequence[Item], alpha: float, token_rule: str | None = None
) -> list[PairScore]:
    """Scores of every item (see the module docstring), in order. An item's rows always share a chunk (so
    no distribution outlives its chunk); chunks hold at most ``scorer.rows_per_batch`` rows (one item at
    least), longest first. Contexts are cut to the window as ``Scorer.truncate`` does. With ``token_rule``
    (``cblight.adaptive.TOKEN_RULES``; docs/adaptive.md) the greedy flag mixes each continuation position
    with that position's own alpha instead of ``alpha``."""
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
            results[i] = _finish([picked[r + j, : len(cont)] for j in range(n)], cont, alpha, token_rule)
            r += n
    return results  # type: ignore[return-value]


def _finish(
    log_probs: list[torch.Tensor], cont: list[int], alpha: float, token_rule: str | None = None
) -> PairScore:
    """Sums and the greedy flag of one item from its rows' ``[len(cont), V]`` log-probs."""
    target = torch.tensor(cont, device=log_probs[0].device)
    full = log_probs[0]
    full_sum = float(full.gather(1, target[:, None]).double().sum())
    if len(log_probs) == 1:
        return PairScore(full_sum, None, bool((full.argmax(-1) == target).all()))
    short = log_probs[1]
    short_sum = float(short.gather(1, target[:, None]).double().sum())
    if token_rule is not None:
        boosted = boosted_log_probs(full, short, token_alphas(token_rule, full, short, "next_token"))
    else:
        boosted = mix_log_probs([full, short], [1.0, alpha])
    return PairScore(full_sum, short_sum, bool((boosted.argmax(-1) == target).all()))


def adaptive_scores(
    requests: Sequence[Any], pairs: Sequence[tuple[float, float | None, bool]], rule: str
) -> list[tuple[float, bool]]:
    """``(ll_full + alpha_q · ll_short, is_greedy)`` per lm-eval request, ``alpha_q`` its question's alpha under
    a multiple-choice rule of ``cblight.adaptive`` (docs/adaptive.md) computed from the question's own
    requests (lm-eval's ``doc_id`` within its task, choices in ``idx`` order); the transductive rules see a
    task's questions together. ``pairs`` are ``(ll_full, ll_short, is_greedy)``; requests without a short
    score (``ll_short`` ``None``) keep ``ll_full``."""
    alpha = [0.0] * len(requests)
    tasks: dict[Any, dict[Any, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (req, (_, short, _)) in enumerate(zip(requests, pairs)):
        if short is not None:
            tasks[req.task_name][req.doc_id].append(i)
    grid = AlphaGrid().values()
    for questions in tasks.values():
        rows = [sorted(q, key=lambda i: requests[i].idx) for q in questions.values()]
        width = max(len(r) for r in rows)
        full = torch.full((len(rows), width), float("-inf"), dtype=torch.float64)
        short = torch.zeros((len(rows), width), dtype=torch.float64)
        for n, row in enumerate(rows):
            full[n, : len(row)] = torch.tensor([pairs[i][0] for i in row], dtype=torch.float64)
            short[n, : len(row)] = torch.tensor([pairs[i][1] for i in row], dtype=torch.float64)
        for n, a in enumerate(choice_alphas(rule, full, short, grid).tolist()):
            for i in rows[n]:
                alpha[i] = a
    return [
        (full if short is None else full + a * short, greedy)
        for (full, short, greedy), a in zip(pairs, alpha)
    ]
