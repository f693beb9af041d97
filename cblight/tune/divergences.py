"""Divergences between a teacher and a student next-token distribution, as pure tensor maths.

Coherence tuning (paper appendix "From coherence boosting to coherence tuning") minimises the forward KL
``KL(f_alpha || f_θ)`` from the boosted teacher to the model. On-policy distillation trainers offer two
more, and so does ``cblight.tune.loss``; the conventions follow TRL's ``GKDTrainer.generalized_jsd_loss``
(Agarwal et al. 2024, "On-policy distillation of language models", eq. 1), with ``p`` the teacher and
``q`` the student:

* ``forward_kl``: ``KL(p || q) = Σ_w p(w) (log p(w) - log q(w))`` (the paper; mass-covering);
* ``reverse_kl``: ``KL(q || p) = Σ_w q(w) (log q(w) - log p(w))`` (mode-seeking);
* ``jsd``: the generalised Jensen-Shannon divergence with ``m = beta · p + (1 - beta) · q``,
  ``JSD_beta = beta · KL(p || m) + (1 - beta) · KL(q || m)``. As in TRL, ``beta = 0`` and ``beta = 1``
  are the forward and the reverse KL exactly (the JSD formula itself vanishes at both ends).

Top-k teacher distillation (``restrict_to_teacher_top_k``) keeps the teacher's ``k`` most likely tokens
and renormalises **both** distributions over them, as TRL's GOLD trainer does with its ``top_k``: the
loss compares the shapes of the two distributions on the teacher's top ``k``; the student's mass on the
other tokens (the tail) gets no direct gradient, so it is neither pushed to zero nor kept.

Everything is computed in float32 over the last axis; the teacher is a constant (no gradient flows into
it). Nothing here imports a model, Lightning or the Hub.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

#: The divergence of ``LossOptions``, ``KL(teacher || student)`` (the paper), ``KL(student || teacher)`` or generalised JSD.
Divergence = Literal["forward_kl", "reverse_kl", "jsd"]

__all__ = ["Divergence", "divergence", "restrict_to_teacher_top_k"]


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """``Σ p (log p - log q)``; entries with ``p = 0`` contribute nothing (``0 log 0 = 0``)."""
    p = p_log.exp()
    return torch.where(p > 0, p * (p_log - q_log), torch.zeros_like(p)).sum(dim=-1)


def divergence(
    teacher_log_probs: torch.Tensor,
    student_log_probs: torch.Tensor,
    kind: Divergence = "forward_kl",
    beta: float = 0.5,
) -> torch.Tensor:
    """A divergence from the teacher ``p`` to the student ``q`` per row, over the last axis.

    ``forward_kl`` is ``KL(p || q)``, coherence tuning's objective (paper appendix "From coherence boosting
    to coherence tuning"; docs/tuning.md); ``reverse_kl`` is ``KL(q || p)`` (infinite where the student puts
    mass on a token with ``p = 0``); ``jsd`` is ``beta · KL(p || m) + (1 - beta) · KL(q || m)`` with
    ``m = beta · p + (1 - beta) · q`` (TRL's GKD), the forward / reverse KL at ``beta`` 0 / 1.

    Args:
        teacher_log_probs: ``[..., V]`` log-probabilities of the teacher (detached: no gradient flows into
            it).
        student_log_probs: ``[..., V]`` log-probabilities of the student.
        kind: ``forward_kl``, ``reverse_kl`` or ``jsd``.
        beta: the JSD's teacher weight in [0, 1]; only ``jsd`` reads it.

    Returns:
        ``[...]`` float32 divergences in nats, one per row, differentiable with respect to the student.
    """
    p_log, q_log = teacher_log_probs.detach().float(), student_log_probs.float()
    beta = {"forward_kl": 0.0, "reverse_kl": 1.0}.get(kind, beta)
    if beta == 0:
        return _kl(p_log, q_log)
    if beta == 1:
        return _kl(q_log, p_log)
    m_log = torch.logaddexp(p_log + math.log(beta), q_log + math.log(1.0 - beta))
    return beta * _kl(p_log, m_log) + (1.0 - beta) * _kl(q_log, m_log)


def restrict_to_teacher_top_k(
    teacher_log_probs: torch.Tensor, student_log_probs: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both distributions over the teacher's ``k`` most likely tokens, renormalised there (top-k teacher
    distillation, as TRL's GOLD trainer's ``top_k``).

    Args:
        teacher_log_probs: ``[..., V]`` log-probabilities of the teacher.
        student_log_probs: ``[..., V]`` log-probabilities of the student.
        k: how many of the teacher's most likely tokens are kept (ties broken by ``torch.topk``).

    Returns:
        The teacher's (detached) and the student's float32 ``[..., k]`` log-probabilities over those tokens,
        each summing to 1; with ``k`` at least the vocabulary size, the two inputs unchanged.
    """
    if k >= teacher_log_probs.shape[-1]:
        return teacher_log_probs, student_log_probs
    top = torch.topk(teacher_log_probs.detach(), k, dim=-1).indices
    teacher = torch.log_softmax(teacher_log_probs.detach().float().gather(-1, top), dim=-1)
    student = torch.log_softmax(student_log_probs.float().gather(-1, top), dim=-1)
    return teacher, student
