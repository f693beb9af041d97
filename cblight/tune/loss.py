"""Coherence tuning as tensor maths and plain model calls (paper appendix "From coherence boosting to
coherence tuning"; DESIGN.md §1).

Starting from a pretrained model ``f(·|·; θ)``, every training step

1. samples sequences ``w_1..w_n`` from the current model (``sample_sequences``);
2. computes the coherence-boosted distribution of the model at every position of the samples (or only
   at the last ``m``) with no gradient, in the generation parametrisation of Table 2,
   ``f_alpha ∝ f_max^(1-alpha) · f_k^alpha`` with ``f_k`` the model on the last ``k`` tokens
   (``boosted_teacher``); where the context is no longer than ``k``, ``f_k == f_max`` and so
   ``f_alpha == f_max``;
3. takes a gradient step on ``KL(f_alpha || f_θ)`` with ``f_alpha`` held constant (``tuning_kl_terms``;
   the reverse KL or a generalised JSD on request, ``cblight.tune.divergences``), summed over the positions in
   scope and divided by their number over all processes.

Nothing here imports Lightning: ``cblight.tune.coherence_tuning`` wires these functions into a LightningModule.
Conventions: a *position* is the column ``c`` of a target token in a ``[B, L]`` batch; the distributions
at position ``c`` are the ones that predict ``sequences[:, c]`` from the tokens before it (the model's
logits at column ``c - 1``). This matches ``cblight.batching.windowed_positions``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

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
from cblight.scoring import Encoder, Scorer, empty_context_ids
from cblight.tune.divergences import Divergence, restrict_to_teacher_top_k
from cblight.tune.divergences import divergence as divergence_fn

__all__ = [
    "KLTerms",
    "Sampled",
    "TuningConfigError",
    "boosted_teacher",
    "check_tuning_options",
    "default_loss_chunk",
    "disable_dropout",
    "ema_update",
    "human_text_nll",
    "kl_scope",
    "longest_useful_position",
    "sample_sequences",
    "sampled_token_mask",
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
    last_m: int | None = None,
    prefix: Sequence[int] = (),
    teacher_model: Any | None = None,
    chunk_size: int | None = None,
    sync_window_calls: Callable[[int], int] | None = None,
    divergence: Divergence = "forward_kl",
    beta: float = 0.5,
    teacher_top_k: int | None = None,
    loss_chunk_size: int | None = None,
) -> KLTerms:
    """The divergence from the boosted teacher ``f_alpha`` to the model ``f_θ`` at every position in scope
    of a sampled batch (forward ``KL(f_alpha || f_θ)``, the paper, by default; see
    ``cblight.tune.divergences`` for the others and for ``teacher_top_k``).

    The teacher is the live model (the paper; its full-context expert is the student's own forward,
    detached) or ``teacher_model`` (a frozen copy of the initial model, or an EMA of the student). Its
    short-context expert runs one ``k``-token window per long position (``windowed_log_probs``) with no
    gradient.

    Memory: the student's logits come from one forward (the model's own output, as in a plain training
    step); everything of vocabulary size after it (the student's float32 log-probabilities, the teacher's
    full and short experts, the divergence and its gradient) is computed ``loss_chunk_size`` positions at
    a time (default ``default_loss_chunk``), whole rows per chunk where they fit, so no full
    ``[B, T, V]`` float32 teacher or student tensor is ever held. The gradient of each chunk is taken right
    away and handed to the model's backward pass through ``loss_sum``.

    ``sync_window_calls`` maps this process's number of window forward passes to the largest over all
    processes; the live teacher then runs dummy passes up to it, because a sharded model (FSDP) needs every
    process to make the same forward calls.
    """
    if chunk_size is None:
        chunk_size = default_window_chunk(sampled.sequences.device)
    scope = kl_scope(sampled.sampled, last_m)
    rows, cols = torch.nonzero(scope, as_tuple=True)
    first_col = int(cols.min()) if cols.numel() else sampled.sequences.shape[1] - 1
    logits, offset = _logits(model, sampled, slice(None), first_col)
    if loss_chunk_size is None:
        loss_chunk_size = default_loss_chunk(logits.shape[-1])
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
            teacher = boosted_teacher(full, short, chunk_long, alpha)
            del full, short
            targets = sampled.sequences[r, c].view(-1, 1)
            gap[lo:hi] = (teacher.gather(1, targets) - student.detach().gather(1, targets)).squeeze(1)
            agree[lo:hi] = (teacher.argmax(-1) == student.detach().argmax(-1)).float()
        with torch.enable_grad() if differentiable else torch.no_grad():
            p, q = teacher, student
            if teacher_top_k is not None:
                p, q = restrict_to_teacher_top_k(teacher, student, teacher_top_k)
            values = divergence_fn(p, q, divergence, beta)
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


@torch.no_grad()
def ema_update(teacher: torch.nn.Module, student: torch.nn.Module, decay: float) -> None:
    """``θ_teacher ← decay · θ_teacher + (1 - decay) · θ_student`` for every trainable parameter of the
    student (the two models have the same structure; frozen parameters are equal and stay so)."""
    pairs = [
        (t, s) for t, s in zip(teacher.parameters(), student.parameters(), strict=True) if s.requires_grad
    ]
    if pairs:
        targets = [t for t, _ in pairs]
        torch._foreach_lerp_(targets, [s.detach().to(t.dtype) for t, s in pairs], 1.0 - decay)


@torch.no_grad()
def human_text_nll(
    model: Any, tokenizer: Any, texts: Sequence[str], max_tokens: int = 128
) -> tuple[float, int]:
    """Summed negative log-likelihood and token count of texts under ``model``, each cut to its first
    ``max_tokens`` tokens and read after the tokenizer's empty context (BOS, or EOS for GPT-2), as document
    perplexity is; ``exp(nll / tokens)`` is the perplexity. Scored by ``cblight.scoring.Scorer`` in
    batches whose logits stay near 2^26 entries (vocabulary-sized rows)."""
    encoder = Encoder(tokenizer)
    start = empty_context_ids(tokenizer, encoder.prefix)
    groups = [(start, [body[:max_tokens]]) for body in map(encoder.body, texts) if body]
    if not groups:
        return 0.0, 0
    vocab = int(model.get_output_embeddings().weight.shape[0])
    rows = max(1, (1 << 26) // (vocab * (max_tokens + len(start))))
    was_training = model.training
    try:
        scores = Scorer(model, tokenizer, batch_size=rows, share_context=False).score_choices(groups)
    finally:
        model.train(was_training)
    return -sum(s[0].log_prob for s in scores), sum(s[0].num_tokens for s in scores)
