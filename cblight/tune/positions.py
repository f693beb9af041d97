"""The batch coherence tuning learns from and the positions whose distributions enter its loss (paper
appendix "From coherence boosting to coherence tuning": the KL "at every position, or the last m").

Conventions: a *position* is the column ``c`` of a target token in a ``[B, L]`` batch; the distributions at
position ``c`` are the ones that predict ``sequences[:, c]`` from the tokens before it (the model's logits
at column ``c - 1``). This matches ``cblight.batching.windowed_positions``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cblight.batching import accepts_kwarg, positions_from_mask

__all__ = ["Sampled", "kl_scope", "sampled_logits", "sampled_token_mask"]


@dataclass
class Sampled:
    """A batch sampled from the model: left-padded prompts followed by sampled tokens.

    ``attention_mask`` covers prompts and samples (1 after the prompt); ``sampled`` marks the sampled
    tokens up to each row's first EOS (``sampled_token_mask``).
    """

    sequences: torch.Tensor
    attention_mask: torch.Tensor
    prompt_width: int
    sampled: torch.Tensor

    def slice(self, rows: slice) -> Sampled:
        return Sampled(self.sequences[rows], self.attention_mask[rows], self.prompt_width, self.sampled[rows])


def sampled_logits(model: Any, sampled: Sampled, rows: slice, first_col: int) -> tuple[torch.Tensor, int]:
    """The model's logits on ``rows`` of the batch from column ``first_col - 1`` on (where the model
    supports ``logits_to_keep``), and the column of ``logits[:, 0]``."""
    seq, mask = sampled.sequences[rows], sampled.attention_mask[rows]
    width = seq.shape[1]
    kwargs: dict[str, Any] = {}
    if accepts_kwarg(model, "logits_to_keep"):
        kwargs["logits_to_keep"] = width - first_col + 1
    out = model(
        input_ids=seq, attention_mask=mask, position_ids=positions_from_mask(mask), use_cache=False, **kwargs
    )
    return out.logits, width - out.logits.shape[1]


def sampled_token_mask(
    sequences: torch.Tensor, prompt_width: int, eos_token_id: int | Sequence[int] | None
) -> torch.Tensor:
    """``[B, L]`` bool: the sampled tokens (columns from ``prompt_width`` on) up to and including each
    row's first EOS (any of several ids); whatever ``generate`` put after it is padding."""
    mask = torch.zeros_like(sequences, dtype=torch.bool)
    mask[:, prompt_width:] = True
    if eos_token_id is not None and sequences.shape[1] > prompt_width:
        gen = sequences[:, prompt_width:]
        ids = torch.as_tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
        eos = torch.isin(gen, ids.to(gen.device)).long()
        after_eos = (eos.cumsum(dim=1) - eos) > 0  # an EOS strictly earlier in the row
        mask[:, prompt_width:] &= ~after_eos
    return mask


def kl_scope(sampled: torch.Tensor, last_m: int | None) -> torch.Tensor:
    """Positions whose distributions enter the KL: every sampled token, or only those in the last ``m``
    columns of the batch (the end of the samples, as the paper allows); tokens after EOS stay out."""
    if last_m is None:
        return sampled
    scope = torch.zeros_like(sampled)
    scope[:, -last_m:] = sampled[:, -last_m:]
    return scope
