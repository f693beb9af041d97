"""The fast path: a ``custom_generate`` decoding loop that batches the full and the anchored short contexts.

``model.generate(..., custom_generate=FusedBoostedDecoding(...))`` keeps everything generate prepares
(generation config, ``num_return_sequences``, stopping criteria from ``max_new_tokens`` / EOS / stop
strings, temperature / top-k / top-p warpers, user logits processors) and replaces only the token loop:

* the full contexts and the growing short contexts (separator or marker plus the text so far) are rows
  of **one** batch with one KV cache, so a dialog or summary step is one forward of ``2N`` rows instead of
  two forwards of ``N`` (transformers' CFG runs two; docs/design.md, "Speed floors");
* last-``k`` windows are one extra batched ``k``-token forward per step with logits only at the end;
* boosting is applied **first**, then generate's processors and warpers (temperature, top-k, top-p act on
  the boosted distribution, docs/design.md, "Mathematics"); then greedy or multinomial choice as in ``_sample``.

Beam search needs generate's own beam loop: ``boosted_generate`` uses ``BoostingLogitsProcessor`` for it.
"""

from __future__ import annotations

from typing import Any

import torch

from cblight.errors import BoostingError
from cblight.generate.experts import CachedRows, active_anchors, boosted_scores, short_groups
from cblight.generate.inputs import PreparedPrompts


class FusedBoostedDecoding:
    """A ``custom_generate`` callable for one prompt batch, mixing the experts the batch was prepared for
    (see the module docstring).

    ``streamer`` is given here as well as to ``generate``: generate does not pass it on to a callable.
    With an adaptive rule, ``alphas`` holds each step's per-row alphas (``[N]`` tensors, docs/adaptive.md).
    """

    def __init__(self, prompts: PreparedPrompts, streamer: Any = None):
        self.boosting = prompts.experts
        self.prompts = prompts
        self.streamer = streamer
        self.alphas: list[torch.Tensor] = []

    @torch.no_grad()
    def __call__(
        self,
        model: Any,
        input_ids: torch.Tensor,
        logits_processor: Any,
        stopping_criteria: Any,
        generation_config: Any,
        synced_gpus: bool = False,
        streamer: Any = None,
        **model_kwargs: Any,
    ) -> Any:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        if generation_config.num_beams not in (None, 1):
            raise BoostingError(
                "the fused boosted decoder does not do beam search; use BoostingLogitsProcessor with "
                "generate's beam search (boosted_generate does this for num_beams > 1)"
            )
        if synced_gpus:
            raise BoostingError("synced_gpus (FSDP / DeepSpeed ZeRO-3) is not supported by boosted decoding")
        if input_ids.shape[1] != self.prompts.width:
            raise BoostingError("FusedBoostedDecoding must be given the input_ids of its PreparedPrompts")
        streamer = streamer if streamer is not None else self.streamer
        n_rows = input_ids.shape[0]
        device = input_ids.device
        mask = model_kwargs.get("attention_mask")
        if mask is None:
            mask = torch.ones_like(input_ids)
        info = self.prompts.rows_for(n_rows, device)
        prefix = self.prompts.prefix
        pad = getattr(generation_config, "_pad_token_tensor", None)  # set by generate from pad/EOS
        if pad is None:
            pad = generation_config.pad_token_id
        pad_id = int(torch.as_tensor(pad).reshape(-1)[0]) if pad is not None else 0
        has_eos = any(hasattr(c, "eos_token_id") for c in stopping_criteria)

        rows = CachedRows(model, pad_id)
        anchors = active_anchors(self.boosting, info)
        lps = rows.prefill(
            [(input_ids, mask), *short_groups(input_ids, anchors, info.has_prefix, prefix, pad_id)]
        )

        want = generation_config.return_dict_in_generate
        scores_out: list[torch.Tensor] = []
        logits_out: list[torch.Tensor] = []
        unfinished = torch.ones(n_rows, dtype=torch.bool, device=device)
        while True:
            full, anchored = lps[0], lps[1:]
            boosted = boosted_scores(
                model, self.boosting, input_ids, info, prefix, full, anchored, self.alphas
            )
            scores = logits_processor(input_ids, boosted)
            if want and generation_config.output_scores:
                scores_out.append(scores)
            if want and generation_config.output_logits:
                logits_out.append(full)
            if generation_config.do_sample:
                tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
            else:
                tokens = torch.argmax(scores, dim=-1)
            if has_eos:
                tokens = torch.where(unfinished, tokens, torch.full_like(tokens, pad_id))
            input_ids = torch.cat([input_ids, tokens[:, None]], dim=-1)
            if streamer is not None:
                streamer.put(tokens.cpu())
            unfinished = unfinished & ~stopping_criteria(input_ids, tuple(scores_out))
            if not bool(unfinished.any()):
                break
            lps = rows.step(tokens)
        if streamer is not None:
            streamer.end()
        if not want:
            return input_ids
        return GenerateDecoderOnlyOutput(
            sequences=input_ids,
            scores=tuple(scores_out) if generation_config.output_scores else None,
            logits=tuple(logits_out) if generation_config.output_logits else None,
        )
