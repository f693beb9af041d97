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

It is a pure function of the model's logits, with no Lightning in it (as TRL's GKD loss beside its
trainer's step): ``tuning_kl_terms`` and its options ``LossOptions``, over a sampled batch (``Sampled``) and
the positions in scope (``sampled_token_mask``, ``kl_scope``: the KL "at every position, or the last m").
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cblight.adaptive import token_alphas
from cblight.batching import (
    default_window_chunk,
    logits_to_keep,
    positions_from_mask,
    windowed_log_probs,
    windowed_positions,
)
from cblight.boosting import boosted_log_probs, log_softmax32
from cblight.option_types import ClosedUnitInterval, PositiveInt, check_fields
from cblight.sharding import SyncedForwards
from cblight.tune.divergences import Divergence, restrict_to_teacher_top_k
from cblight.tune.divergences import divergence as divergence_fn

__all__ = [
    "KLTerms",
    "LossOptions",
    "Sampled",
    "boosted_teacher",
    "default_loss_chunk",
    "kl_scope",
    "sampled_logits",
    "sampled_token_mask",
    "tuning_kl_terms",
]


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
        window_chunk_size: short-context windows per forward pass of the teacher's ``f_k`` (``None``: about
            1024 window tokens on CPU, 256 windows on accelerators, ``tuning_window_chunk``).
    """

    divergence: Divergence = "forward_kl"
    beta: ClosedUnitInterval = 0.5
    teacher_top_k: PositiveInt | None = None
    last_m: PositiveInt | None = None
    chunk_size: PositiveInt | None = None
    window_chunk_size: PositiveInt | None = None

    def __post_init__(self) -> None:
        check_fields(self)


# ---------------------------------------------------------------------------------------------------------
# The sampled batch and the positions in scope. A *position* is the column ``c`` of a target token in a
# ``[B, L]`` batch; its distributions predict ``sequences[:, c]`` from the tokens before it (the model's
# logits at column ``c - 1``), as in ``cblight.batching.windowed_positions``.


@dataclass
class Sampled:
    """A batch sampled from the model: left-padded prompts followed by sampled tokens.

    Args:
        sequences: ``[B, L]`` token ids, prompts then samples.
        attention_mask: ``[B, L]``, covering prompts and samples (1 everywhere after the prompt's padding).
        prompt_width: the column where the samples start (the padded prompts' width).
        sampled: ``[B, L]`` bool, the sampled tokens up to each row's first EOS (``sampled_token_mask``).
    """

    sequences: torch.Tensor
    attention_mask: torch.Tensor
    prompt_width: int
    sampled: torch.Tensor


def sampled_logits(model: Any, sampled: Sampled, rows: slice, first_col: int) -> tuple[torch.Tensor, int]:
    """The model's logits on some rows of a sampled batch, from the column that predicts ``first_col`` on.

    Args:
        model: the causal LM.
        sampled: the batch.
        rows: the rows to run.
        first_col: the first position wanted (its logits sit at column ``first_col - 1``); earlier columns
            are left out where the model supports ``logits_to_keep``.

    Returns:
        ``[rows, T, V]`` logits and the column of ``logits[:, 0]``.
    """
    seq, mask = sampled.sequences[rows], sampled.attention_mask[rows]
    width = seq.shape[1]
    keep = logits_to_keep(model, width - first_col + 1)
    out = model(
        input_ids=seq, attention_mask=mask, position_ids=positions_from_mask(mask), use_cache=False, **keep
    )
    return out.logits, width - out.logits.shape[1]


def sampled_token_mask(
    sequences: torch.Tensor, prompt_width: int, eos_token_id: int | Sequence[int] | None
) -> torch.Tensor:
    """The sampled tokens of a batch, up to and including each row's first EOS; whatever ``generate`` put
    after it is padding.

    Args:
        sequences: ``[B, L]`` token ids, prompts then samples.
        prompt_width: the column where the samples start.
        eos_token_id: the end-of-sequence id, or several (any ends a row); ``None``: no row ends early.

    Returns:
        ``[B, L]`` bool, true at the sampled tokens.
    """
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
    """The positions whose distributions enter the KL: the paper's "at every position, or the last m".

    Args:
        sampled: ``[B, L]`` bool mask of the sampled tokens (``sampled_token_mask``; tokens after EOS are
            out).
        last_m: keep only the last ``m`` columns of the batch (the end of the samples); ``None``: every
            sampled token.

    Returns:
        ``[B, L]`` bool mask of the positions in scope.
    """
    if last_m is None:
        return sampled
    scope = torch.zeros_like(sampled)
    scope[:, -last_m:] = sampled[:, -last_m:]
    return scope


# ---------------------------------------------------------------------------------------------------------
# The loss


def boosted_teacher(
    full_log_probs: torch.Tensor,
    short_log_probs: torch.Tensor,
    long: torch.Tensor,
    alpha: float,
    adaptive: str | None = None,
) -> torch.Tensor:
    """The boosted teacher ``log f_alpha`` at every position in scope, no gradient: the generation
    parametrisation of Table 2, ``f_alpha ∝ f_max^(1-alpha) · f_k^alpha``. Where the context is no longer
    than ``k``, ``f_k == f_max`` and the generation form gives ``f_alpha == f_max`` exactly.

    Args:
        full_log_probs: ``[N, V]``, the full-context ``log f_max`` at the N positions.
        short_log_probs: ``[long.sum(), V]``, the short-context ``log f_k`` at the long positions, in order.
        long: ``[N]`` bool, the positions whose context exceeds ``k``.
        alpha: the boost (Table 2's generation alpha), used where ``adaptive`` is ``None``.
        adaptive: a per-token rule of ``cblight.adaptive`` (docs/adaptive.md) that gives each position its
            alpha instead.

    Returns:
        ``[N, V]`` float32 log-probabilities of the teacher.
    """
    full = full_log_probs.detach().float()
    teacher = full.clone()
    if short_log_probs.shape[0]:
        short = short_log_probs.detach().float()
        at_long = full[long]
        weight = alpha if adaptive is None else token_alphas(adaptive, at_long, short, "generation")
        teacher[long] = boosted_log_probs(at_long, short, weight, "generation")
    return teacher


# ---------------------------------------------------------------------------------------------------------
# Model calls


def _full_log_probs(model: Any, sampled: Sampled, r: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 full-context ``log f`` of ``model`` at positions ``(r, c)`` of whole consecutive rows."""
    r0, r1 = int(r[0]), int(r[-1]) + 1
    logits, offset = sampled_logits(model, sampled, slice(r0, r1), int(c.min()))
    return log_softmax32(logits[r - r0, c - 1 - offset])


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
    """Per-position terms of one batch, all detached, and the scalar that carries the gradient
    (``tuning_kl_terms``).

    Args:
        kl: the divergence per position (the forward ``KL(f_alpha || f_θ)`` unless another was asked for).
        loss_sum: a scalar whose value is ``kl.sum()`` and whose gradient is that sum's with respect to the
            student's parameters (with a trust region: of ``kl + trust_region · trust``).
        long: the positions whose context exceeds ``k`` (where boosting changes the distribution).
        gap: ``log f_alpha(w) - log f_θ(w)`` of the sampled token ``w`` per position.
        agree: whether the student's most likely token is the teacher's, per position.
        anchor: a zero that depends on every parameter, added to the loss to keep DDP's gradient hooks
            firing.
        trust: ``KL(f_θ || f_0)`` per position when a trust region is on, else zeros.
    """

    kl: torch.Tensor
    loss_sum: torch.Tensor
    long: torch.Tensor
    gap: torch.Tensor
    agree: torch.Tensor
    anchor: torch.Tensor  # a zero that depends on every parameter: keeps DDP's gradient hooks firing
    trust: torch.Tensor

    def global_sums(
        self, sampled: torch.Tensor, device: torch.device, reduce: Callable[..., torch.Tensor]
    ) -> dict[str, float]:
        """Counts and sums of the batch's terms over every process, in one all-reduce.

        Args:
            sampled: the batch's ``[B, L]`` mask of sampled tokens.
            device: the device the all-reduce runs on.
            reduce: a strategy's ``reduce`` (called with ``reduce_op="sum"``).

        Returns:
            ``count`` (positions), ``long``, ``sampled_tokens``, ``kl_sum``, ``kl_long_sum``, ``gap_long_sum``
            and ``trust_sum``, summed over the processes.
        """
        kl, long = self.kl.detach(), self.long
        local = {
            "count": torch.tensor(float(kl.numel()), device=device),
            "long": long.sum().float(),
            "sampled_tokens": sampled.sum().float(),
            "kl_sum": kl.sum(),
            "kl_long_sum": (kl * long).sum(),
            "gap_long_sum": (self.gap * long).sum(),
            "trust_sum": self.trust.sum(),
        }
        total = reduce(torch.stack(list(local.values())).to(device, torch.float64), reduce_op="sum")
        return dict(zip(local, total.tolist(), strict=True))


def default_loss_chunk(vocab_size: int) -> int:
    """Positions per chunk of the loss, so that each float32 ``[chunk, V]`` temporary stays near 64 MB
    (2^24 entries).

    Args:
        vocab_size: the vocabulary size ``V``.

    Returns:
        The chunk size, at least 1 (e.g. 341 positions for a 49k vocabulary and 64 for Gemma's 262k).
    """
    return max(1, (1 << 24) // max(int(vocab_size), 1))


def tuning_window_chunk(device: torch.device, window_tokens: int) -> int:
    """Windows per forward pass of the teacher's ``f_k``: 256 on accelerators
    (``cblight.batching.default_window_chunk``); on CPU about 1024 window tokens (``k`` + the special prefix
    per window), the size that keeps the projections' matrices large without leaving the caches: 512
    windows of 8 SmolLM2 tokens took 0.92x the CPU time in passes of 128 windows as of 32 (16: 1.11x, 64:
    0.94x, 512: 0.98x; one thread, 2026-11-24)."""
    if torch.device(device).type != "cpu":
        return default_window_chunk(device)
    return max(1, 1024 // max(window_tokens, 1))


def _row_chunks(rows: torch.Tensor, per_chunk: int) -> Iterator[tuple[int, int]]:
    """``[lo, hi)`` ranges of the row-major positions, at most ``per_chunk`` long, never splitting a row
    unless the row alone is longer (a separate teacher then reruns that row's forward)."""
    n, lo = int(rows.numel()), 0
    ends = list(itertools.accumulate(torch.bincount(rows).tolist())) if n else []
    while lo < n:
        hi = min(lo + per_chunk, n)
        if hi < n:
            whole_rows = [e for e in ends if lo < e <= hi]
            hi = whole_rows[-1] if whole_rows else hi
        yield lo, hi
        lo = hi


def tuning_kl_terms(
    model: Any,
    sampled: Sampled,
    *,
    k: int,
    alpha: float,
    options: LossOptions = LossOptions(),
    prefix: Sequence[int] = (),
    teacher_model: Any | None = None,
    synced: SyncedForwards | None = None,
    reference_model: Any | None = None,
    trust_region: float = 0.0,
    adaptive: str | None = None,
) -> KLTerms:
    """Coherence tuning's loss: the divergence from the boosted teacher ``f_alpha`` (Table 2's generation
    parametrisation) to the model ``f_θ`` at every position in scope of a sampled batch; by default the
    paper's forward ``KL(f_alpha || f_θ)`` (appendix "From coherence boosting to coherence tuning";
    docs/tuning.md).

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

    ``synced`` (``cblight.sharding.SyncedForwards``): under FSDP2 every process must make the same calls of
    each sharded model, while the number of chunks and of windows follows this process's samples. Every
    process then walks as many chunks as the busiest, each in the same phases (the teacher's full pass, the
    initial model's, the windows), and pads each phase with 1-token forwards.

    ``trust_region > 0`` with ``reference_model`` (the initial model ``f_0``) adds ``trust_region ·
    KL(f_θ || f_0)`` per position to the objective (RLHF's KL penalty; docs/tuning.md, "Trust region"),
    over the whole vocabulary; ``f_0`` is the teacher's own full-context pass when the teacher is that model.

    Args:
        model: the student ``f_θ``.
        sampled: the batch sampled from it (``cblight.tune.rollouts``).
        k: the short context of the teacher's ``f_k``, in tokens.
        alpha: the boost (Table 2's generation alpha).
        options: the divergence, the positions in scope and the chunk sizes (see ``cblight.tune.divergences``
            for the divergences and ``teacher_top_k``).
        prefix: special tokens (BOS) put before every short-context window.
        teacher_model: the model boosted into the teacher; ``None``: the live model itself (the paper).
        synced: the phases of synced forward calls under FSDP2 (``None``: unsynced).
        reference_model: the initial model ``f_0`` of the trust region.
        trust_region: the trust region's weight (0: off).
        adaptive: a per-token alpha rule of ``cblight.adaptive`` instead of ``alpha``.

    Returns:
        The per-position terms and the scalar ``loss_sum`` that carries the gradient.
    """
    chunk_size = options.window_chunk_size or tuning_window_chunk(sampled.sequences.device, k + len(prefix))
    scope = kl_scope(sampled.sampled, options.last_m)
    rows, cols = torch.nonzero(scope, as_tuple=True)
    first_col = int(cols.min()) if cols.numel() else sampled.sequences.shape[1] - 1
    logits, offset = sampled_logits(model, sampled, slice(None), first_col)
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
    penalised = trust_region > 0 and reference_model is not None
    trust = torch.zeros(int(rows.numel()), device=logits.device)
    synced = synced or SyncedForwards()
    separate_reference = penalised and reference_model is not teacher_model
    chunks = list(_row_chunks(rows, loss_chunk_size))
    with torch.no_grad():  # a process with fewer chunks joins the others' calls of the ones it lacks
        for _ in range(synced.most(len(chunks)) - len(chunks)):
            with synced.phase(teacher_model, calls=1):
                pass
            with synced.phase(reference_model if separate_reference else None, calls=1):
                pass
            with synced.phase(teacher_source):
                pass
    for lo, hi in chunks:
        r, c = rows[lo:hi], cols[lo:hi]
        chunk_long = long[lo:hi]
        z = detached[r, c - 1 - offset].requires_grad_(differentiable)
        student = log_softmax32(z)  # a graph only where the model's logits have one (grad mode is on then)
        with torch.no_grad():
            with synced.phase(teacher_model, calls=1):
                full = (
                    student.detach()
                    if teacher_model is None
                    else _full_log_probs(teacher_model, sampled, r, c)
                )
            reference = full if penalised and not separate_reference else None
            with synced.phase(reference_model if separate_reference else None, calls=1):
                if separate_reference:
                    reference = _full_log_probs(reference_model, sampled, r, c)
            with synced.phase(teacher_source):
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
            teacher = boosted_teacher(full, short, chunk_long, alpha, adaptive)
            del full, short
            targets = sampled.sequences[r, c].view(-1, 1)
            gap[lo:hi] = (teacher.gather(1, targets) - student.detach().gather(1, targets)).squeeze(1)
            agree[lo:hi] = (teacher.argmax(-1) == student.detach().argmax(-1)).float()
        p, q = teacher, student
        if options.teacher_top_k is not None:
            p, q = restrict_to_teacher_top_k(teacher, student, options.teacher_top_k)
        values = divergence_fn(p, q, options.divergence, options.beta)
        objective = values
        if reference is not None:
            penalty = divergence_fn(reference, student, "reverse_kl")  # KL(f_θ || f_0)
            trust[lo:hi] = penalty.detach()
            objective = values + trust_region * penalty
        kl[lo:hi] = values.detach()
        if differentiable:
            (chunk_grad,) = torch.autograd.grad(objective.sum(), z)
            grad[r, c - 1 - offset] = chunk_grad
    total = (kl + trust_region * trust).sum()  # trust is zero without a trust region
    if differentiable:
        loss_sum = _InjectedGradient.apply(logits, grad, total)
        anchor = logits.sum() * 0.0 if logits.numel() else loss_sum * 0.0
    else:
        loss_sum, anchor = total, total * 0.0
    return KLTerms(
        kl=kl, loss_sum=loss_sum, long=long, gap=gap, agree=agree.bool(), anchor=anchor, trust=trust
    )
