"""The experts of boosted decoding, shared by both decoders (``cblight.generate.decode``): their model calls
per step and their mixture (paper eq. 1).

* the full context and each anchored expert's growing short context (separator or marker plus the text so
  far) as groups of rows of one batch with one KV cache (``CachedRows``, its short contexts from
  ``short_groups``), so a step is one forward for every anchored expert;
* last-``k`` windows, which start at a new position every step and so reuse no cache: one batched ``k``-token
  forward per step, logits only at its end (``window_log_probs``);
* the mixture of a step's experts, with a fixed weight or an adaptive rule's per-row alpha
  (``boosted_scores``, ``mix_experts``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from cblight.adaptive import token_alphas
from cblight.batching import (
    cache_argument,
    last_position_log_probs,
    left_pad,
    logits_to_keep,
    output_cache,
    positions_from_mask,
)
from cblight.boosting import boosted_log_probs, log_softmax32, product_of_experts
from cblight.generate.inputs import PreparedPrompts, RowInfo
from cblight.options import LastTokens


def boosted_scores(
    model: Any,
    prompts: PreparedPrompts,
    input_ids: torch.Tensor,
    info: RowInfo,
    full: torch.Tensor,
    anchored: Sequence[torch.Tensor],
    trace: list[torch.Tensor],
) -> torch.Tensor:
    """``log_softmax(w_full log f_max + Σ w_i log f_i)`` (paper eq. 1) for the current rows, float32.

    ``anchored`` holds ``log f`` of the anchored experts in expert order; last-``k`` experts are run here.
    With an adaptive rule the two weights are ``two_expert_weights(alpha_r, form)`` with each row's own
    ``alpha_r`` from the rule, and ``trace`` receives this step's alphas ``[N]``.
    """
    experts = prompts.experts
    lps, weights = [full], [experts.full_weight]
    it = iter(anchored)
    for rule, weight in experts.active:
        if isinstance(rule, LastTokens):
            lps.append(window_log_probs(model, input_ids, info, prompts.prefix, rule.k, full))
        else:
            lps.append(next(it))
        weights.append(weight)
    if experts.adaptive is not None:
        alpha = token_alphas(experts.adaptive, full, lps[1], experts.form)
        trace.append(alpha)
        return boosted_log_probs(full, lps[1], alpha, experts.form)
    return mix_experts(lps, weights)


def mix_experts(log_probs: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """``product_of_experts`` (paper eq. 1) with a fast path for the usual case.

    When no expert holds ``-inf`` (nothing has masked ``f_max``), the NaN-safe bookkeeping of
    ``cblight.boosting.mix_log_probs`` is not needed: a weighted sum and one log-softmax give the same
    numbers with a third of the passes over ``[N, vocab]``, which matters on CPU at every decoding step.
    """
    if all(bool(lp.amin() > -math.inf) for lp in log_probs):
        total = log_probs[0] * weights[0]
        for lp, w in zip(log_probs[1:], weights[1:]):
            total.add_(lp, alpha=w)
        return torch.log_softmax(total, dim=-1)
    return product_of_experts(log_probs, weights)


def window_log_probs(
    model: Any, input_ids: torch.Tensor, info: RowInfo, prefix: Sequence[int], k: int, full: torch.Tensor
) -> torch.Tensor:
    """``log f_k`` at the end of every row of a left-padded ``input_ids`` ``[N, T]``: ``[N, V]`` float32.

    A window starts at a new position every step, so no cache can be reused: one batched ``k``-token
    forward, logits only at its last position, the window at positions ``0..k-1`` (after BOS where the
    tokenizer adds one). Rows whose content is at most ``k`` tokens take ``full`` (``f_max``) itself.
    """
    width = input_ids.shape[1]
    content = width - info.content_start - len(prefix) * info.has_prefix.long()
    need = content > k
    if not bool(need.any()):
        return full
    out = full  # cloned before its first row is replaced
    tail = input_ids[:, width - k :]
    for with_prefix in (True, False):
        rows = torch.nonzero(need & (info.has_prefix == with_prefix), as_tuple=True)[0]
        if rows.numel() == 0:
            continue
        windows = tail.index_select(0, rows)
        if with_prefix and prefix:
            pre = torch.as_tensor(list(prefix), dtype=windows.dtype, device=windows.device)
            windows = torch.cat([pre.view(1, -1).expand(rows.numel(), -1), windows], dim=1)
        lp = last_position_log_probs(model, windows)
        if rows.numel() == full.shape[0]:
            return lp  # every row has a window: no copy of f_max needed
        if out is full:
            out = full.clone()
        out[rows] = lp
    return out


def short_groups(
    prompts: PreparedPrompts, info: RowInfo, input_ids: torch.Tensor, pad_id: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Left-padded ``(ids, mask)`` of each active anchored expert's short contexts ``prefix + row[anchor:]``
    (the separator or marker and what follows), in expert order, ready for ``CachedRows.prefill``."""
    rows, flags = input_ids.tolist(), info.has_prefix.tolist()
    active = prompts.experts.active  # an adaptive rule's expert too, whatever its fixed weight
    groups = []
    for expert, anchor in zip(prompts.experts.experts, info.anchors):
        if expert in active and anchor is not None:  # anchored: not LastTokens
            contexts = [
                (list(prompts.prefix) if flag else []) + row[a:]
                for row, a, flag in zip(rows, anchor.tolist(), flags)
            ]
            groups.append(left_pad(contexts, pad_id, input_ids.device))
    return groups


class CachedRows:
    """Groups of ``N`` growing contexts decoded together: one KV cache, one forward per step.

    Every group (e.g. the full prompts, then the short contexts of each anchored expert) gains the same
    token per row each step. Position ids count real tokens only, so a short context sits at positions
    ``0..`` exactly as if it were the whole input, and left padding is invisible to absolute-position models.
    ``reorder`` follows beam search's row shuffles.
    """

    def __init__(self, model: Any, pad_id: int):
        self.model = model
        self.pad_id = pad_id
        self.keep = logits_to_keep(model, 1)
        self.cache: Any = None
        self.mask: torch.Tensor | None = None
        self.next_pos: torch.Tensor | None = None
        self.groups = 0
        self.rows = 0

    def _run(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any = None) -> Any:
        return self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            **{cache_argument(self.model): cache},
            **self.keep,
        )

    def prefill(self, groups: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """Encode each group ``(ids [N, W_g], left-padded mask)``; returns ``log f`` ``[N, V]`` per group.

        Each group runs at its own width (a short context is not padded to the prompt's length) and the
        caches are then joined; models whose cache cannot be joined run one padded batch instead.
        """
        self.groups = len(groups)
        self.rows = int(groups[0][0].shape[0])
        width = max(int(ids.shape[1]) for ids, _ in groups)
        outs = [self._run(ids, mask, positions_from_mask(mask)) for ids, mask in groups]
        if len(outs) == 1:
            cache = output_cache(outs[0])
        else:
            cache = _merge_left_padded([output_cache(o) for o in outs], width)
        self.mask = torch.cat([torch.nn.functional.pad(m, (width - m.shape[1], 0)) for _, m in groups])
        self.next_pos = self.mask.sum(-1)  # a row's real tokens: the position of its next one
        if cache is None:
            ids = torch.cat(
                [torch.nn.functional.pad(i, (width - i.shape[1], 0), value=self.pad_id) for i, _ in groups]
            )
            out = self._run(ids, self.mask, positions_from_mask(self.mask))
            self.cache = output_cache(out)
            return list(log_softmax32(out.logits[:, -1, :]).split(self.rows, dim=0))
        self.cache = cache
        return [log_softmax32(o.logits[:, -1, :]) for o in outs]

    def step(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        """Append ``tokens`` ``[N]`` to every group; returns the next ``log f`` ``[N, V]`` per group."""
        assert self.mask is not None and self.next_pos is not None
        ids = tokens.repeat(self.groups).view(-1, 1)
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        out = self._run(ids, self.mask, self.next_pos.view(-1, 1), self.cache)
        self.cache = output_cache(out)
        self.next_pos = self.next_pos + 1
        return list(log_softmax32(out.logits[:, -1, :]).split(self.rows, dim=0))

    def reorder(self, parents: torch.Tensor) -> None:
        """Row ``r`` of every group continues former row ``parents[r]`` (beam search)."""
        assert self.mask is not None and self.next_pos is not None
        index = torch.cat([parents + g * self.rows for g in range(self.groups)])
        self.cache.reorder_cache(index)
        self.mask = self.mask.index_select(0, index)
        self.next_pos = self.next_pos.index_select(0, index)


def _merge_left_padded(caches: Sequence[Any], width: int) -> Any | None:
    """One ``DynamicCache`` holding the rows of several, each left-padded with zeros to ``width`` (the
    padding is masked out). ``None`` when a cache is not a plain dynamic one (sliding windows, ...)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if not all(
        type(c) is DynamicCache and c.layers and all(type(la) is DynamicLayer for la in c.layers)
        for c in caches
    ):
        return None

    def joined(i: int, name: str) -> torch.Tensor:  # layer i's keys or values of every cache, left-padded
        parts = [getattr(cache.layers[i], name) for cache in caches]
        return torch.cat([torch.nn.functional.pad(t, (0, 0, width - t.shape[-2], 0)) for t in parts])

    data = [(joined(i, "keys"), joined(i, "values")) for i in range(len(caches[0].layers))]
    return DynamicCache(ddp_cache_data=data)
