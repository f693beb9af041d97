"""Coherence tuning's loss as tensor maths and plain model calls (paper appendix "From coherence boosting to
coherence tuning", Table 2), and its options (``LossOptions``).

Starting from a pretrained model ``f(·|·; θ)``, every training step

1. samples sequences ``w_1..w_n`` from the current model (``cblight.tune.rollouts``);
2. computes the coherence-boosted distribution of the model at every position of the samples (or only
   at the last ``m``) with no gradient, in the generation parametrisation of Table 2,
   ``f_alpha ∝ f_max^(1-alpha) · f_k^alpha`` with ``f_k`` the model on the last ``k`` tokens
   (``boosted_teacher``); where the context is no longer than ``k``, ``f_k == f_max`` and so
   ``f_alpha == f_max``;
3. takes a gradient step on ``KL(f_alpha || f_θ)`` with ``f_alpha`` held constant (``tuning_kl_terms``;
   the reverse KL or a generalised JSD on request, ``cblight.tune.divergences``), summed over the positions in
   scope and divided by their number over all processes.

Nothing here imports Lightning: ``cblight.tune.coherence_tuning`` wires these functions into a LightningModule.
``tuning_kl_terms`` and ``LossOptions`` are the loss; ``Sampled`` and ``sampled_token_mask`` describe the
batch it reads.

Conventions: a *position* is the column ``c`` of a target token in a ``[B, L]`` batch; the distributions
at position ``c`` are the ones that predict ``sequences[:, c]`` from the tokens before it (the model's
logits at column ``c - 1``). This matches ``cblight.batching.windowed_positions``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import torch

from cblight.adaptive import mix_per_row, token_alphas
from cblight.batching import (
    accepts_kwarg,
    default_window_chunk,
    last_position_log_probs,
    positions_from_mask,
    windowed_log_probs,
    windowed_positions,
)
from cblight.boosting import boosted_log_probs, log_softmax32
from cblight.errors import CblightError
from cblight.options import Boosting
from cblight.tune.divergences import DIVERGENCES, restrict_to_teacher_top_k
from cblight.tune.divergences import divergence as divergence_fn

__all__ = [
    "KLTerms",
    "LossOptions",
    "Sampled",
    "TuningConfigError",
    "boosted_teacher",
    "check_boosting",
    "default_loss_chunk",
    "kl_scope",
    "longest_useful_position",
    "sampled_token_mask",
    "tuning_kl_terms",
]


class TuningConfigError(CblightError):
    """A coherence-tuning option that cannot work (the error names the option and the fix)."""


def positive_int(value: object) -> bool:
    """An integer >= 1 (``True`` is not an integer here); shared by the tuning option classes."""
    return isinstance(value, Integral) and not isinstance(value, bool) and value >= 1


def finite_number(value: object) -> bool:
    """A real number that is neither NaN nor infinite (``True`` is not a number here)."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


_NULL_MEANS = {
    "teacher_top_k": "the whole vocabulary",
    "last_m": "every sampled position",
    "chunk_size": "about 64 MB per float32 [chunk, V]",
    "window_chunk_size": "32 windows on CPU, 256 on accelerators",
}


@dataclass(frozen=True)
class LossOptions:
    """What the loss compares, over which positions, and in what chunks (``tuning_kl_terms``).

    Args:
        divergence: ``forward_kl`` (the paper, ``KL(f_alpha || f_θ)``), ``reverse_kl`` or ``jsd`` (generalised
            Jensen-Shannon with ``beta``, TRL's GKD convention; ``cblight.tune.divergences``).
        beta: the JSD's teacher weight in [0, 1] (0: forward KL, 1: reverse KL).
        teacher_top_k: distil only the teacher's ``k`` most likely tokens, both distributions renormalised
            over them (``None``: the whole vocabulary).
        last_m: the loss only over the last ``m`` columns of the samples (``None``: every sampled position).
        chunk_size: positions per chunk of the loss (``None``: about 64 MB per float32 ``[chunk, V]``,
            ``default_loss_chunk``).
        window_chunk_size: short-context windows per forward pass of the teacher's ``f_k`` (``None``: 32 on
            CPU, 256 on accelerators, ``cblight.batching.default_window_chunk``).
    """

    divergence: str = "forward_kl"
    beta: float = 0.5
    teacher_top_k: int | None = None
    last_m: int | None = None
    chunk_size: int | None = None
    window_chunk_size: int | None = None

    def __post_init__(self) -> None:
        if self.divergence not in DIVERGENCES:
            raise TuningConfigError(
                f"loss.divergence must be one of {', '.join(DIVERGENCES)}, got {self.divergence!r}"
            )
        if not finite_number(self.beta) or not 0.0 <= self.beta <= 1.0:
            raise TuningConfigError(
                f"loss.beta (the JSD's weight of the teacher) must be in [0, 1], got {self.beta!r}"
            )
        for name, null in _NULL_MEANS.items():
            value = getattr(self, name)
            if value is not None and not positive_int(value):
                raise TuningConfigError(
                    f"loss.{name} must be a positive integer or null ({null}), got {value!r}"
                )


def check_boosting(boosting: Boosting) -> None:
    """Refuse a boosting that coherence tuning's teacher is not: the last ``k`` tokens boosted in the
    generation form (Table 2) with a non-zero ``alpha``."""
    if boosting.mode != "last_k":
        raise TuningConfigError(
            f"boosting.mode must be last_k (the teacher boosts against the last k tokens), got {boosting.mode!r}"
        )
    if boosting.resolved_form != "generation":
        raise TuningConfigError(
            "boosting.form must be generation or null (Table 2's (1-alpha) log f_max + alpha log f_k), "
            f"got {boosting.form!r}"
        )
    if boosting.alpha == 0 and boosting.adaptive is None:
        raise TuningConfigError(
            "boosting.alpha = 0 makes the boosted teacher the model itself and the KL identically zero; "
            "use a negative alpha (Table 2: -0.05 or -0.1)"
        )


def longest_useful_position(prompt_lengths: Sequence[int], n_prefix: int, max_new_tokens: int) -> int:
    """The most content tokens any scoped position can have before it.

    The last sampled token of the longest prompt has ``prompt - prefix + max_new_tokens - 1`` content
    tokens before it; boosting changes nothing unless this exceeds ``k`` (``f_k == f_max`` otherwise).
    """
    if not prompt_lengths:
        raise TuningConfigError("there are no prompts to sample from")
    return max(prompt_lengths) - n_prefix + max_new_tokens - 1


# ---------------------------------------------------------------------------------------------------------
# The loss


def boosted_teacher(
    full_log_probs: torch.Tensor,
    short_log_probs: torch.Tensor,
    long: torch.Tensor,
    alpha: float,
    adaptive: str | None = None,
) -> torch.Tensor:
    """``log f_alpha`` at every position in scope (generation parametrisation, Table 2), no gradient.

    ``full_log_probs`` is ``[N, V]`` (``f_max`` at the N positions), ``long`` a ``[N]`` mask of the positions
    whose context exceeds ``k`` and ``short_log_probs`` ``[long.sum(), V]`` (``f_k`` there, in order).
    Elsewhere ``f_k == f_max`` and the generation form gives ``f_alpha == f_max`` exactly. With ``adaptive``
    (a per-token rule of ``cblight.adaptive``, docs/adaptive.md) each position's alpha comes from the rule.
    """
    full = full_log_probs.detach().float()
    teacher = full.clone()
    if short_log_probs.shape[0] != int(long.sum()):
        raise ValueError(
            f"{short_log_probs.shape[0]} short-context rows for {int(long.sum())} long positions"
        )
    if short_log_probs.shape[0] and adaptive is not None:
        short = short_log_probs.detach().float()
        rows = token_alphas(adaptive, full[long], short, "generation")
        teacher[long] = mix_per_row(full[long], short, rows, "generation")
    elif short_log_probs.shape[0]:
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


def _logits(model: Any, sampled: Sampled, rows: slice, first_col: int) -> tuple[torch.Tensor, int]:
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


class _InjectedGradient(torch.autograd.Function):
    """A scalar whose value is given and whose gradient with respect to ``logits`` is ``grad`` (times the
    incoming scale): lets the divergence be computed, and differentiated, chunk by chunk in the forward
    pass while the model's backward pass still runs once."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, grad: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(grad)
        return value.detach().clone()

    @staticmethod
    def backward(ctx: Any, scale: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (grad,) = ctx.saved_tensors
        return grad * scale.to(grad.dtype), None, None


@dataclass
class KLTerms:
    """Per-position terms of one batch, all detached, and the scalar that carries the gradient.

    ``kl`` is the divergence per position (forward KL unless another was asked for); ``loss_sum`` has the
    value ``kl.sum()`` and the gradient of that sum with respect to the student's parameters.
    ``long`` marks positions whose context exceeds ``k`` (where boosting changes the distribution);
    ``gap`` is ``log f_alpha(w) - log f_θ(w)`` of the sampled token ``w``; ``agree`` whether the student's
    most likely token is the teacher's.
    """

    kl: torch.Tensor
    loss_sum: torch.Tensor
    long: torch.Tensor
    gap: torch.Tensor
    agree: torch.Tensor
    anchor: torch.Tensor  # a zero that depends on every parameter: keeps DDP's gradient hooks firing

    @property
    def count(self) -> int:
        return int(self.kl.numel())


def default_loss_chunk(vocab_size: int) -> int:
    """Positions per chunk of the loss: each float32 ``[chunk, V]`` temporary stays near 64 MB (2^24
    entries), e.g. 341 positions for a 49k vocabulary and 64 for Gemma's 262k."""
    return max(1, (1 << 24) // max(int(vocab_size), 1))


def _row_chunks(rows: torch.Tensor, per_chunk: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` ranges of the row-major positions, at most ``per_chunk`` long, never splitting a row
    unless the row alone is longer (a separate teacher then reruns that row's forward)."""
    n = int(rows.numel())
    bounds, lo = [], 0
    counts = torch.bincount(rows).tolist() if n else []
    ends = list(itertools.accumulate(counts))
    while lo < n:
        hi = min(lo + per_chunk, n)
        if hi < n:
            whole_rows = [e for e in ends if lo < e <= hi]
            hi = whole_rows[-1] if whole_rows else hi
        bounds.append((lo, hi))
        lo = hi
    return bounds


def tuning_kl_terms(
    model: Any,
    sampled: Sampled,
    *,
    k: int,
    alpha: float,
    options: LossOptions = LossOptions(),
    prefix: Sequence[int] = (),
    teacher_model: Any | None = None,
    sync_window_calls: Callable[[int], int] | None = None,
    adaptive: str | None = None,
) -> KLTerms:
    """The divergence from the boosted teacher ``f_alpha`` to the model ``f_θ`` at every position in scope
    of a sampled batch (forward ``KL(f_alpha || f_θ)``, the paper, by default; ``options`` chooses the
    divergence, the positions and the chunks; see ``cblight.tune.divergences`` for the divergences and for
    ``teacher_top_k``).

    The teacher is the live model (the paper; its full-context expert is the student's own forward,
    detached) or ``teacher_model`` (a frozen copy of the initial model, or an EMA of the student). Its
    short-context expert runs one ``k``-token window per long position (``windowed_log_probs``) with no
    gradient.

    Memory: the student's logits come from one forward (the model's own output, as in a plain training
    step); everything of vocabulary size after it (the student's float32 log-probabilities, the teacher's
    full and short experts, the divergence and its gradient) is computed ``options.chunk_size`` positions
    at a time (default ``default_loss_chunk``), whole rows per chunk where they fit, so no full
    ``[B, T, V]`` float32 teacher or student tensor is ever held. The gradient of each chunk is taken right
    away and handed to the model's backward pass through ``loss_sum``.

    ``sync_window_calls`` maps this process's number of window forward passes to the largest over all
    processes; the live teacher then runs dummy passes up to it, because a sharded model (FSDP) needs every
    process to make the same forward calls.
    """
    chunk_size = options.window_chunk_size or default_window_chunk(sampled.sequences.device)
    scope = kl_scope(sampled.sampled, options.last_m)
    rows, cols = torch.nonzero(scope, as_tuple=True)
    first_col = int(cols.min()) if cols.numel() else sampled.sequences.shape[1] - 1
    logits, offset = _logits(model, sampled, slice(None), first_col)
    loss_chunk_size = options.chunk_size or default_loss_chunk(logits.shape[-1])
    differentiable = logits.requires_grad
    grad = torch.zeros_like(logits) if differentiable else None
    detached = logits.detach()
    teacher_source = model if teacher_model is None else teacher_model

    long_rows, long_cols = windowed_positions(sampled.attention_mask, k, scope, n_prefix=len(prefix))
    long_grid = torch.zeros_like(scope)
    long_grid[long_rows, long_cols] = True
    long = long_grid[rows, cols]
    kl, gap, agree = (torch.empty(int(rows.numel()), device=logits.device) for _ in range(3))
    window_calls = 0
    for lo, hi in _row_chunks(rows, loss_chunk_size):
        r, c = rows[lo:hi], cols[lo:hi]
        chunk_long = long[lo:hi]
        z = detached[r, c - 1 - offset].requires_grad_(differentiable)
        with torch.enable_grad() if differentiable else torch.no_grad():
            student = log_softmax32(z)
        with torch.no_grad():
            if teacher_model is None:
                full = student.detach()
            else:
                r0, r1 = int(r[0]), int(r[-1]) + 1
                t_logits, t_offset = _logits(teacher_model, sampled, slice(r0, r1), int(c.min()))
                full = log_softmax32(t_logits[r - r0, c - 1 - t_offset])
                del t_logits
            short = windowed_log_probs(
                teacher_source,
                sampled.sequences,
                r[chunk_long],
                c[chunk_long],
                k,
                prefix=prefix,
                gather_targets=False,
                chunk_size=chunk_size,
            )
            window_calls += -(-int(chunk_long.sum()) // chunk_size)
            teacher = boosted_teacher(full, short, chunk_long, alpha, adaptive)
            del full, short
            targets = sampled.sequences[r, c].view(-1, 1)
            gap[lo:hi] = (teacher.gather(1, targets) - student.detach().gather(1, targets)).squeeze(1)
            agree[lo:hi] = (teacher.argmax(-1) == student.detach().argmax(-1)).float()
        with torch.enable_grad() if differentiable else torch.no_grad():
            p, q = teacher, student
            if options.teacher_top_k is not None:
                p, q = restrict_to_teacher_top_k(teacher, student, options.teacher_top_k)
            values = divergence_fn(p, q, options.divergence, options.beta)
        kl[lo:hi] = values.detach()
        if differentiable:
            assert grad is not None
            (chunk_grad,) = torch.autograd.grad(values.sum(), z)
            grad[r, c - 1 - offset] = chunk_grad
    if sync_window_calls is not None and teacher_model is None:
        dummy = sampled.sequences.new_zeros((1, k + len(prefix)))
        with torch.no_grad():
            for _ in range(sync_window_calls(window_calls) - window_calls):
                last_position_log_probs(model, dummy)
    total = kl.sum()
    if differentiable:
        loss_sum = _InjectedGradient.apply(logits, grad, total)
        anchor = logits.sum() * 0.0 if logits.numel() else loss_sum * 0.0
    else:
        loss_sum, anchor = total, total * 0.0
    return KLTerms(kl=kl, loss_sum=loss_sum, long=long, gap=gap, agree=agree.bool(), anchor=anchor)
