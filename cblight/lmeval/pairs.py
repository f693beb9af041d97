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

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from cblight.adaptive import choice_alphas, token_alphas
from cblight.boosting import AlphaGrid, boosted_log_probs, choice_scores, mix_log_probs
from cblight.metrics.sweeps import padded
from cblight.scoring import Scorer

Item = tuple[Sequence[int], Sequence[int] | None, Sequence[int]]
#: ``(log f(cont | context), log f(cont | short) or None without a short context, is_greedy)``: greedy under
#: the boosted distribution (under ``f`` alone when there is no short context)
Pair = tuple[float, float | None, bool]


@torch.no_grad()
def score_pairs(
    scorer: Scorer, items: Sequence[Item], alpha: float, token_rule: str | None = None
) -> list[Pair]:
    """Scores of every item (see the module docstring), in order. An item's rows always share a chunk (so
    no distribution outlives its chunk), longest first, in ``Scorer.in_batches``' chunks of at most
    ``scorer.rows_per_batch`` rows. Contexts are cut to the window as ``Scorer.truncate`` does. With
    ``token_rule`` (``cblight.adaptive.TOKEN_RULES``; docs/adaptive.md) the greedy flag mixes each
    continuation position with that position's own alpha instead of ``alpha``."""
    prepared: list[tuple[list[list[int]], list[int], list[int]]] = []  # (rows, first positions, cont)
    for ctx, short, cont in items:  # continuations are never empty: the model refuses those first
        cont = list(cont)
        cuts = [scorer.truncate(c, [cont]) for c in ((ctx,) if short is None else (ctx, short))]
        prepared.append(([cut + cont[:-1] for cut in cuts], [len(cut) - 1 for cut in cuts], cont))
    order = sorted(range(len(items)), key=lambda i: -max(len(r) for r in prepared[i][0]))

    def run(chunk: list[int]) -> list[Pair]:
        rows = [row for i in chunk for row in prepared[i][0]]
        starts = [s for i in chunk for s in prepared[i][1]]
        lengths = [len(prepared[i][2]) for i in chunk for _ in prepared[i][0]]
        picked = scorer.continuation_log_probs(rows, starts, lengths)
        pairs, r = [], 0
        for i in chunk:  # each item's rows: [len(cont), V] log-probs after the full (and the short) context
            cont = prepared[i][2]
            target = torch.tensor(cont, device=picked.device)
            lps = [picked[r + j, : len(cont)] for j in range(len(prepared[i][0]))]
            r += len(lps)
            sums = [float(lp.gather(1, target[:, None]).double().sum()) for lp in lps]
            if len(lps) == 1:
                boosted = lps[0]
            elif token_rule is not None:
                boosted = boosted_log_probs(*lps, token_alphas(token_rule, *lps, "next_token"))
            else:
                boosted = mix_log_probs(lps, [1.0, alpha])
            greedy = bool((boosted.argmax(-1) == target).all())
            pairs.append((sums[0], sums[1] if len(sums) > 1 else None, greedy))
        return pairs

    done = dict(zip(order, scorer.in_batches(order, lambda i: len(prepared[i][0]), run)))
    return [done[i] for i in range(len(items))]


def boosted_scores(
    requests: Sequence[Any], pairs: Sequence[Pair], alpha: float, rule: str | None
) -> list[float]:
    """Each lm-eval request's ``log f(cont | context) + alpha · log f(cont | short)`` (paper eq. 2;
    ``log f(cont | context)`` where there is no short score). With a multiple-choice ``rule`` of
    ``cblight.adaptive`` (docs/adaptive.md) alpha is each question's own, computed from the question's own
    requests (lm-eval's ``doc_id`` within its task, choices in ``idx`` order); the transductive rules see a
    task's questions together."""
    out = [full for full, _, _ in pairs]
    tasks: dict[Any, dict[Any, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (req, (_, short, _)) in enumerate(zip(requests, pairs)):
        if short is not None:  # without a rule, each request is a question of its own
            tasks[req.task_name if rule else None][req.doc_id if rule else i].append(i)
    for questions in tasks.values():
        rows = [sorted(q, key=lambda i: requests[i].idx) for q in questions.values()]
        width = max(len(r) for r in rows)  # a question's missing choices: no full score, never picked
        full = padded([[pairs[i][0] for i in row] for row in rows], width, -math.inf)
        short = padded([[pairs[i][1] for i in row] for row in rows], width, 0.0)
        alphas = choice_alphas(rule, full, short, AlphaGrid().values())[:, None] if rule else alpha
        for row, scores in zip(rows, choice_scores(full, short, alphas).tolist()):
            for i, score in zip(row, scores):
                out[i] = score
    return out
