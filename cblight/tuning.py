"""Coherence tuning as tensor maths and plain model calls (paper appendix "From coherence boosting to
coherence tuning"; DESIGN.md §1).

Starting from a pretrained model ``f(·|·; θ)``, every training step

1. samples sequences ``w_1..w_n`` from the current model (``sample_sequences``);
2. computes the coherence-boosted distribution of the model at every position of the samples (or only
   at the last ``m``) with no gradient, in the generation parametrisation of Table 2,
   ``f_alpha ∝ f_max^(1-alpha) · f_k^alpha`` with ``f_k`` the model on the last ``k`` tokens
   (``boosted_teacher``); where the context is no longer than ``k``, ``f_k == f_max`` and so
   ``f_alpha == f_max``;
3. takes a gradient step on ``KL(f_alpha || f_θ)`` with ``f_alpha`` held constant (``kl_divergence``),
   summed over the positions in scope and divided by their number over all processes.

Nothing here imports Lightning: ``cblight.modules.tuning`` wires these functions into a LightningModule.
Conventions: a *position* is the column ``c`` of a target token in a ``[B, L]`` batch; the distributions
at position ``c`` are the ones that predict ``sequences[:, c]`` from the tokens before it (the model's
logits at column ``c - 1``). This matches ``cblight.scoring.windowed_positions``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cblight.boosting import boosted_log_probs, log_softmax32
from cblight.errors import CblightError
from cblight.scoring import (
    accepts_kwarg,
    default_window_chunk,
    last_position_log_probs,
    positions_from_mask,
    windowed_log_probs,
    windowed_positions,
)

__all__ = [
    "KLTerms",
    "Sampled",
    "TuningConfigError",
    "boosted_teacher",
    "check_tuning_options",
    "disable_dropout",
    "kl_divergence",
    "kl_scope",
    "longest_useful_position",
    "sample_sequences",
    "sampled_token_mask",
    "student_log_probs",
    "tuning_kl_terms",
]


class TuningConfigError(CblightError):
    """A coherence-tuning option that cannot work (the error names the option)."""


def check_tuning_options(
    *, k: int, alpha: float, last_m: int | None = None, max_new_tokens: int = 1, window: int | None = None
) -> None:
    """Refuse options for which tuning is undefined or does nothing, before any work starts."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise TuningConfigError(f"k (short-context length) must be a positive integer, got {k!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise TuningConfigError(f"alpha must be a finite number, got {alpha!r}")
    if alpha == 0:
        raise TuningConfigError(
            "alpha = 0 makes the boosted teacher equal to the model itself: the KL is identically zero "
            "(the paper's boosting uses a negative alpha, e.g. -0.05 or -0.1 in Table 2)"
        )
    if last_m is not None and (isinstance(last_m, bool) or not isinstance(last_m, int) or last_m < 1):
        raise TuningConfigError(f"last_m must be a positive integer or null (all positions), got {last_m!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise TuningConfigError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if window is not None and k >= window:
        raise TuningConfigError(f"k = {k} must be smaller than the model window of {window} tokens")


def longest_useful_position(prompt_lengths: Sequence[int], n_prefix: int, max_new_tokens: int) -> int:
    """The most content tokens any scoped position can have before it.

    The last sampled token of the longest prompt has ``prompt - prefix + max_new_tokens - 1`` content
    tokens before it; boosting changes nothing unless this exceeds ``k`` (``f_k == f_max`` otherwise).
    """
    if not prompt_lengths:
        raise TuningConfigError("there are no prompts to sample from")
    return max(prompt_lengths) - n_prefix + max_new_tokens - 1


def disable_dropout(model: torch.nn.Module) -> None:
    """Dropout off while the model stays in train mode (which gradient checkpointing needs): every
    ``nn.Dropout`` gets ``p = 0`` and every float ``*dropout*`` attribute (functional attention dropout)
    becomes 0. The model's config is left alone, so an exported model keeps its dropout settings."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name.lower() and isinstance(value, float):
                setattr(module, name, 0.0)


# ---------------------------------------------------------------------------------------------------------
# The loss


def kl_divergence(teacher_log_probs: torch.Tensor, student_log_probs: torch.Tensor) -> torch.Tensor:
    """``KL(p || q) = Σ_w p(w) (log p(w) - log q(w))`` over the last axis, in float32.

    ``p = exp(teacher_log_probs)`` is a constant (no gradient flows into it); entries with ``p = 0``
    (``-inf`` log-probability, e.g. truncated by the product of experts) contribute nothing.
    """
    p_log = teacher_log_probs.detach().float()
    q_log = student_log_probs.float()
    p = p_log.exp()
    terms = torch.where(p > 0, p * (p_log - q_log), torch.zeros_like(q_log))
    return terms.sum(dim=-1)


def boosted_teacher(
    full_log_probs: torch.Tensor, short_log_probs: torch.Tensor, long: torch.Tensor, alpha: float
) -> torch.Tensor:
    """``log f_alpha`` at every position in scope (generation parametrisation, Table 2), no gradient.

    ``full_log_probs`` is ``[N, V]`` (``f_max`` at the N positions), ``long`` a ``[N]`` mask of the positions
    whose context exceeds ``k`` and ``short_log_probs`` ``[long.sum(), V]`` (``f_k`` there, in order).
    Elsewhere ``f_k == f_max`` and the generation form gives ``f_alpha == f_max`` exactly.
    """
    full = full_log_probs.detach().float()
    teacher = full.clone()
    if short_log_probs.shape[0] != int(long.sum()):
        raise ValueError(
            f"{short_log_probs.shape[0]} short-context rows for {int(long.sum())} long positions"
        )
    if short_log_probs.shape[0]:
        teacher[long] = boosted_log_probs(full[long], short_log_probs.detach().float(), alpha, "generation")
    return teacher


# ---------------------------------------------------------------------------------------------------------
# Which positions enter the KL


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


# ---------------------------------------------------------------------------------------------------------
# Model calls


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


@torch.no_grad()
def sample_sequences(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None,
    pad_token_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    synced_gpus: bool = False,
) -> Sampled:
    """Sample continuations of left-padded prompts with ``model.generate``: eval mode (no dropout), no
    gradient, explicit position ids. The caller owns the random state (see the LightningModule).

    ``synced_gpus`` keeps every process stepping until all are done, which sharded models (FSDP) need.
    ``eos_token_id=None`` means the model's own (``generate`` stops there either way).
    """
    from transformers import GenerationConfig

    if eos_token_id is None:
        eos_token_id = getattr(model.generation_config, "eos_token_id", None)
    config = GenerationConfig(
        do_sample=True,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    # generate() fills every option we leave unset from the model's own generation config (a chat model's
    # temperature 0.6 / top_p 0.9 / repetition penalty...): hide it, so the samples come from f itself.
    own_config = model.generation_config
    was_training = model.training
    model.generation_config = GenerationConfig(bos_token_id=own_config.bos_token_id)
    model.eval()
    try:
        out = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=positions_from_mask(prompt_mask),
            generation_config=config,
            synced_gpus=synced_gpus,
        )
    finally:
        model.generation_config = own_config
        model.train(was_training)
    sequences = out if torch.is_tensor(out) else out.sequences
    width = prompt_ids.shape[1]
    new = sequences.shape[1] - width
    mask = torch.cat([prompt_mask, prompt_mask.new_ones((prompt_mask.shape[0], new))], dim=1)
    return Sampled(sequences, mask, width, sampled_token_mask(sequences, width, eos_token_id))


def student_log_probs(
    model: Any, sampled: Sampled, rows: torch.Tensor, cols: torch.Tensor, *, first_col: int | None = None
) -> torch.Tensor:
    """float32 ``log f_θ`` at positions ``(rows, cols)``: one forward over the whole batch (with gradient
    when enabled), logits only from column ``first_col - 1`` on where the model supports it."""
    seq, mask = sampled.sequences, sampled.attention_mask
    width = seq.shape[1]
    first = int(cols.min()) if first_col is None and cols.numel() else (first_col or 1)
    keep = width - first + 1  # columns first-1 .. width-1
    kwargs: dict[str, Any] = {}
    if accepts_kwarg(model, "logits_to_keep"):
        kwargs["logits_to_keep"] = keep
    out = model(
        input_ids=seq, attention_mask=mask, position_ids=positions_from_mask(mask), use_cache=False, **kwargs
    )
    logits = out.logits
    offset = width - logits.shape[1]  # column of logits[:, 0]
    return log_softmax32(logits[rows, cols - 1 - offset])


@dataclass
class KLTerms:
    """Per-position terms of one batch. ``kl`` carries the gradient; the rest are detached.

    ``long`` marks positions whose context exceeds ``k`` (where boosting changes the distribution);
    ``gap`` is ``log f_alpha(w) - log f_θ(w)`` of the sampled token ``w``.
    """

    kl: torch.Tensor
    long: torch.Tensor
    gap: torch.Tensor
    anchor: torch.Tensor  # a zero that depends on every parameter: keeps DDP's gradient hooks firing

    @property
    def count(self) -> int:
        return int(self.kl.numel())


def tuning_kl_terms(
    model: Any,
    sampled: Sampled,
    *,
    k: int,
    alpha: float,
    last_m: int | None = None,
    prefix: Sequence[int] = (),
    teacher_model: Any | None = None,
    chunk_size: int | None = None,
    sync_window_calls: Callable[[int], int] | None = None,
) -> KLTerms:
    """``KL(f_alpha || f_θ)`` at every position in scope of a sampled batch.

    The teacher is the live model (the paper; its full-context expert is the student's own forward,
    detached) or ``teacher_model`` (e.g. a frozen copy of the initial model). Its short-context expert runs
    one ``k``-token window per long position (``windowed_log_probs``) with no gradient.

    ``sync_window_calls`` maps this process's number of window forward passes to the largest over all
    processes; the live teacher then runs dummy passes up to it, because a sharded model (FSDP) needs every
    process to make the same forward calls.
    """
    if chunk_size is None:
        chunk_size = default_window_chunk(sampled.sequences.device)
    scope = kl_scope(sampled.sampled, last_m)
    rows, cols = torch.nonzero(scope, as_tuple=True)
    first_col = int(cols.min()) if cols.numel() else sampled.sequences.shape[1] - 1
    student = student_log_probs(model, sampled, rows, cols, first_col=first_col)
    teacher_source = model if teacher_model is None else teacher_model
    with torch.no_grad():
        if teacher_model is None:
            full = student.detach()
        else:
            full = student_log_probs(teacher_model, sampled, rows, cols, first_col=first_col)
        long_rows, long_cols = windowed_positions(sampled.attention_mask, k, scope, n_prefix=len(prefix))
        long_grid = torch.zeros_like(scope)
        long_grid[long_rows, long_cols] = True
        long = long_grid[rows, cols]
        short = windowed_log_probs(
            teacher_source,
            sampled.sequences,
            long_rows,
            long_cols,
            k,
            prefix=prefix,
            gather_targets=False,
            chunk_size=chunk_size,
        )
        if sync_window_calls is not None and teacher_model is None:
            local_calls = -(-int(long_rows.numel()) // chunk_size)
            dummy = sampled.sequences.new_zeros((1, k + len(prefix)))
            for _ in range(sync_window_calls(local_calls) - local_calls):
                last_position_log_probs(model, dummy)
        teacher = boosted_teacher(full, short, long, alpha)
        targets = sampled.sequences[rows, cols].view(-1, 1)
        gap = (teacher.gather(1, targets) - student.detach().gather(1, targets)).squeeze(1)
    kl = kl_divergence(teacher, student)
    # the student's forward always runs, so even a batch with nothing in scope reaches every parameter
    return KLTerms(kl=kl, long=long, gap=gap, anchor=student.sum() * 0.0)
