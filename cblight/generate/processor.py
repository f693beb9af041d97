"""Boosting as a ``LogitsProcessor`` for users who call ``model.generate`` themselves.

``generate`` computes ``f_max`` with its own KV cache; this processor adds the short-context experts and
returns the normalised boosted log-probabilities. Pass it in ``logits_processor=[...]``: generate runs it
after its own constraint processors (``bad_words_ids``, ``min_new_tokens``, repetition penalties act on
``f_max``; their ``-inf`` vetoes survive mixing because ``f_max`` has a positive weight) and before every
warper, so temperature, top-k and top-p apply to the boosted distribution (docs/design.md, "Mathematics").

Beam search is supported: a processor never sees generate's beam reordering, so before feeding the new
tokens the cached short contexts are matched to the rows they continue (row ``r`` now is a former row plus
one token) and reordered. Last-``k`` windows need no cache and work with anything generate does.
"""

from __future__ import annotations

from typing import Any

import torch

from cblight.boosting import log_softmax32
from cblight.errors import BoostingError
from cblight.generate.experts import CachedRows, active_anchors, boosted_scores, short_groups
from cblight.generate.inputs import PreparedPrompts, RowInfo

try:  # transformers' base class keeps isinstance checks in generate happy; the maths does not need it
    from transformers import LogitsProcessor
except ImportError:  # pragma: no cover
    LogitsProcessor = object  # type: ignore[assignment,misc]


class BoostingLogitsProcessor(LogitsProcessor):
    """Coherence boosting inside ``model.generate`` (greedy, sampling, beam search, streaming, ...).

    Build one per prompt batch::

        prompts = prepare_prompts(tokenizer, texts, boosting, room=window - max_new_tokens)
        proc = BoostingLogitsProcessor(model, prompts)  # mixes the experts prompts was prepared for
        model.generate(prompts.input_ids, attention_mask=prompts.attention_mask,
                       logits_processor=[proc], max_new_tokens=..., do_sample=True, top_p=0.95)

    ``reorders`` counts the steps at which beam search shuffled rows (and the short caches followed); with an
    adaptive rule ``alphas`` holds each step's per-row alphas (``[N]`` tensors, docs/adaptive.md).
    """

    def __init__(self, model: Any, prompts: PreparedPrompts):
        self.model = model
        self.boosting = prompts.experts
        self.prompts = prompts
        self.pad_id = 0  # fills masked padding only, so any id will do
        self.reorders = 0
        self._rows: CachedRows | None = None
        self._info: RowInfo | None = None
        self._last: torch.Tensor | None = None
        self.alphas: list[torch.Tensor] = []

    def _start(self, input_ids: torch.Tensor) -> list[torch.Tensor]:
        info = self.prompts.rows_for(input_ids.shape[0], input_ids.device)
        self._info = info
        self.alphas = []
        self._last = input_ids
        anchors = active_anchors(self.boosting, info)
        if not anchors:
            self._rows = None
            return []
        self._rows = CachedRows(self.model, self.pad_id)
        groups = short_groups(input_ids, anchors, info.has_prefix, self.prompts.prefix, self.pad_id)
        return self._rows.prefill(groups)

    def _parents(self, input_ids: torch.Tensor) -> torch.Tensor | None:
        """For each current row, the former row it extends by one token (``None``: nothing moved)."""
        assert self._last is not None
        n = input_ids.shape[0]
        before = input_ids[:, :-1]
        if torch.equal(before, self._last):
            return None
        width0 = self.prompts.width
        rep = n // len(self.prompts.rows)
        group = torch.arange(n, device=input_ids.device) // rep
        same = (before[:, None, width0:] == self._last[None, :, width0:]).all(-1) & (
            group[:, None] == group[None, :]
        )
        if not bool(same.any(dim=1).all()):
            raise BoostingError(
                "a row does not extend any row of the previous step: this generation method rewrites "
                "sequences in a way the cached short context cannot follow"
            )
        return same.int().argmax(dim=1)

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        full = log_softmax32(scores)
        width = input_ids.shape[1]
        if self._last is None or width == self.prompts.width:
            anchored = self._start(input_ids)
        else:
            if width != self._last.shape[1] + 1:
                raise BoostingError(
                    f"the processor saw {self._last.shape[1]} then {width} tokens: boosting follows one token "
                    "per step (assisted / speculative decoding is not supported)"
                )
            anchored = []
            if self._rows is not None:
                parents = self._parents(input_ids)
                if parents is not None:
                    self._rows.reorder(parents)
                    self.reorders += 1
                anchored = self._rows.step(input_ids[:, -1])
            self._last = input_ids
        assert self._info is not None
        return boosted_scores(
            self.model, self.boosting, input_ids, self._info, self.prompts.prefix, full, anchored, self.alphas
        ).to(scores.dtype)
