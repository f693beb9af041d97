"""Label-free rules for the boosting coefficient alpha (and the short context k) as pure tensor maths
(docs/adaptive.md; the paper's open question of §5: "future work may explore automatic and adaptive
methods for setting this parameter").

The paper chooses alpha (and k for next-token tasks) by grid search on labelled selection data
(docs/design.md, "Selection protocol"). The rules here need no label: each reads only the model's own
predictions on the input.

Per position (next-token prediction, generation) and per example (multiple choice, over the answer set):

* ``jsd``: the weight of AdaCAD (Wang et al. 2024, "AdaCAD: Adaptively Decoding to Balance Conflicts between
  Contextual and Parametric Knowledge"): ``a = JSD(f_max || f_short)`` in bits (in [0, 1]) and the
  context-aware-decoding mix ``(1 + a) log f_max - a log f_short``, i.e. the generation form with
  ``alpha = -a`` and, for an argmax, the next-token form with ``alpha = -a / (1 + a)``;
* ``jsdist``: the same mix with the Jensen-Shannon distance ``a = sqrt(JSD)`` (Endres and Schindelin 2003: the
  square root of the divergence is a metric) as the weight. It is larger than the JSD wherever the experts
  differ little (0.3 at a JSD of 0.09), where AdaCAD's weight all but switches boosting off;
* ``cocoa``: a CoCoA-style weight (Khandelwal et al. 2025), the Rényi divergence of order 1/2 damped by
  ``f_max``'s peakedness (``cocoa_alpha``).

Over the unlabelled inputs of a whole split (transductive):

* ``jsd_mean``: one alpha for the split, the mean of the per-example ``jsd`` alphas (next-token prediction
  and multiple choice): AdaCAD's scale without its per-example variation; ``jsdist_mean`` likewise with
  ``jsdist`` (next-token prediction);
* ``decorrelate``: one alpha for the split, the pooled least-squares slope of the full answer scores on the
  premise-free ones (each question centred on its own answers), ``alpha = -beta``: the boosted score keeps
  no linear trace of the answer's unconditional likelihood. With a fixed answer set (SST-2) it sets the
  mean boosted margin between the labels to zero, the batch-level version of contextual calibration (Zhao
  et al. 2021; Zhou et al. 2024, "Batch Calibration");
* ``balance``: the grid value whose predicted answers are spread most evenly over the answer's rank under
  the premise-free context (a fixed answer set: over the labels), the transductive reading of contextual
  calibration's "a content-free input should get a uniform prediction".

And for next-token prediction, a ``k`` read off the input's structure: the tokens of its last sentence
(``unit_k(..., "sentence")``) or clause (``"clause"``).

Every function takes log-probabilities (next-token rows ``[N, V]``) or log-likelihood sums (answers
``[N, C]``, a missing answer ``-inf`` in ``ll_full``) computed by a model, and returns tensors, so each
rule is tested against a hand computation (tests/core/test_adaptive.py).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from typing import Literal, get_args

import torch
from torch import Tensor

from cblight.boosting import BoostForm, choice_predictions

__all__ = [
    "AUTO",
    "CHOICE_RULES",
    "GATE_BITS",
    "NEXT_TOKEN_RULES",
    "NEXT_TOKEN_UNIT",
    "PRIOR_SHARE",
    "RULES",
    "TOKEN_RULES",
    "ChoiceRule",
    "DecodingRule",
    "NextTokenRule",
    "RuleName",
    "TokenRule",
    "Unit",
    "alpha_of_weight",
    "balance_alpha",
    "choice_alphas",
    "choice_jsd",
    "choice_jsd_alpha",
    "cocoa_alpha",
    "cocoa_weight",
    "context_gain",
    "decorrelate_alpha",
    "gated_alpha",
    "js_divergence",
    "jsd_alpha",
    "jsdist_alpha",
    "prior_ranks",
    "prior_share",
    "rule_for",
    "same_prior_everywhere",
    "summary",
    "token_alphas",
    "unit_k",
]

#: The per-position rules (decoding, tuning, greedy flags).
TokenRule = Literal["jsd", "jsdist", "cocoa"]
#: What a per-position option accepts: ``auto`` (``AUTO["token"]``) or a per-position rule.
DecodingRule = Literal["auto", "jsd", "jsdist", "cocoa"]
#: The rules of next-token tasks (LAMBADA).
NextTokenRule = Literal["jsd", "jsdist", "cocoa", "jsd_mean", "jsdist_mean"]
#: The rules of multiple-choice tasks.
ChoiceRule = Literal["gated", "jsd", "jsd_mean", "decorrelate", "balance"]
#: Every rule name ``adaptive`` accepts.
RuleName = Literal[
    "auto", "gated", "jsd", "jsdist", "cocoa", "jsd_mean", "jsdist_mean", "decorrelate", "balance"
]
#: How ``k`` is read off a next-token input, as its last sentence or its last clause.
Unit = Literal["sentence", "clause"]
TOKEN_RULES: tuple[str, ...] = get_args(TokenRule)  #: the values of ``TokenRule``
NEXT_TOKEN_RULES: tuple[str, ...] = get_args(NextTokenRule)  #: the values of ``NextTokenRule``
CHOICE_RULES: tuple[str, ...] = get_args(ChoiceRule)  #: the values of ``ChoiceRule``
RULES: tuple[str, ...] = get_args(RuleName)  #: the values of ``RuleName``
#: the rule ``auto`` stands for, per task kind (the measurements behind the choice are in docs/adaptive.md)
AUTO = {"multiple_choice": "gated", "next_token": "jsdist_mean", "token": "jsdist"}
#: The gate of ``gated``: the least mean JSD (bits) by which the premise must move a question's answers
#: for boosting to be worth its risk (``context_gain``; docs/adaptive.md).
GATE_BITS = 0.1
#: The gate of ``gated`` where every question has the same premise-free prior (a fixed label set): the least
#: share of the split's mean label preference that lies along that prior (``prior_share``) for calibrating
#: along it to be a correction of the bias rather than a trade of one label for another (docs/adaptive.md).
PRIOR_SHARE = 0.5
NEXT_TOKEN_UNIT: Unit = "sentence"  #: the short context of next-token rules, the input's last sentence


def rule_for(name: str, kind: str) -> str:
    """The rule ``name`` means for a task kind: ``auto`` resolved to ``AUTO[kind]``, any other name checked
    against the kind's rules (docs/adaptive.md, "Which rule auto picks").

    Args:
        name: a rule name (``RuleName``), ``auto`` included.
        kind: the task kind, ``multiple_choice`` or ``next_token``.

    Returns:
        The rule's name, never ``auto``.

    Raises:
        ValueError: when ``name`` does not apply to ``kind``; the message names the rules that do.

    Examples:
        >>> rule_for("auto", "next_token"), rule_for("auto", "multiple_choice")
        ('jsdist_mean', 'gated')
        >>> rule_for("cocoa", "multiple_choice")
        Traceback (most recent call last):
        ...
        ValueError: adaptive rule 'cocoa' does not apply to multiple-choice tasks; use auto or one of gated, jsd, jsd_mean, decorrelate, balance
    """
    valid = {"multiple_choice": CHOICE_RULES, "next_token": NEXT_TOKEN_RULES}[kind]
    rule = AUTO[kind] if name == "auto" else name
    if rule not in valid:
        raise ValueError(
            f"adaptive rule {name!r} does not apply to {kind.replace('_', '-')} tasks; "
            f"use auto or one of {', '.join(valid)}"
        )
    return rule


def summary(alphas: Tensor) -> dict[str, float]:
    """Mean, standard deviation (population), minimum and maximum of per-example or per-token alphas: what
    an evaluation logs for an adaptive rule next to its score.

    Args:
        alphas: the alphas, any shape (flattened); float64 inside, whatever the dtype.

    Returns:
        ``alpha_mean``, ``alpha_sd``, ``alpha_min`` and ``alpha_max`` as floats; all NaN for no alphas.

    Examples:
        >>> import torch
        >>> summary(torch.tensor([-0.5, -0.25, 0.0]))
        {'alpha_mean': -0.25, 'alpha_sd': 0.2041241452319315, 'alpha_min': -0.5, 'alpha_max': 0.0}
    """
    a = alphas.double().reshape(-1)
    stats = (a.mean(), a.std(unbiased=False), a.min(), a.max()) if a.numel() else (math.nan,) * 4
    return dict(zip(("alpha_mean", "alpha_sd", "alpha_min", "alpha_max"), map(float, stats)))


_LN2 = math.log(2.0)


# ---------------------------------------------------------------------------------------------------------
# Divergences of two predictions


def _plogq(logp: Tensor, logq: Tensor) -> Tensor:
    """``p · (log p - log q)`` entrywise, 0 where ``p = 0`` (``0 log 0 = 0``)."""
    p = logp.exp()
    return torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))


def js_divergence(logp: Tensor, logq: Tensor) -> Tensor:
    """Jensen-Shannon divergence in bits (in [0, 1]) between two normalised log-distributions over the last
    axis: ``½ KL(P || M) + ½ KL(Q || M)``, ``M = (P + Q) / 2`` (the weight of ``jsd``; docs/adaptive.md).

    Args:
        logp: log-probabilities of ``P``, normalised over the last axis (``-inf`` for no mass).
        logq: log-probabilities of ``Q``, broadcastable against ``logp``.

    Returns:
        The divergence per row (the last axis summed out), float32 (float64 stays float64), clamped to
        [0, 1].

    Examples:
        >>> import torch
        >>> p = torch.log(torch.tensor([[1.0, 0.0], [0.5, 0.5]]))
        >>> q = torch.log(torch.tensor([[0.0, 1.0], [0.5, 0.5]]))
        >>> js_divergence(p, q)  # disjoint supports: 1 bit; equal distributions: 0
        tensor([1., 0.])
    """
    dtype = torch.promote_types(logp.dtype, torch.float32)
    logp, logq = logp.to(dtype), logq.to(dtype)
    logm = torch.logaddexp(logp, logq) - _LN2
    js = 0.5 * (_plogq(logp, logm).sum(-1) + _plogq(logq, logm).sum(-1)) / _LN2
    return js.clamp(0.0, 1.0)  # rounding can leave it a hair outside


# ---------------------------------------------------------------------------------------------------------
# Per-position rules: a weight from the two experts, as alpha in either form


def cocoa_alpha(full: Tensor, short: Tensor, form: BoostForm = "next_token") -> Tensor:
    """A CoCoA-style weight per row ``[N]`` (after Khandelwal et al. 2025, "CoCoA: Confidence- and
    Context-Aware Adaptive Decoding"): ``a = (1 - exp(-D)) (1 - m)``, ``D`` the Rényi divergence of order
    1/2 of ``f_max`` from ``f_short`` in nats (``-2 log Σ √(p q)``: unlike the JSD it does not saturate when a
    low-probability token moves) and ``m`` the margin between ``f_max``'s two most likely tokens. CoCoA
    trusts a peaked context; here the weight falls as ``f_max`` peaks, as measured on LAMBADA's development
    passages (docs/adaptive.md): a peaked ``f_max`` already decides its argmax, and boosting then only
    amplifies the short expert's tail. ``-a`` in the generation form, ``-a / (1 + a)`` in the next-token form.

    Args:
        full: ``[N, V]`` ``log f_max``, normalised log-probabilities on the whole context.
        short: ``[N, V]`` ``log f_short``, on the short context.
        form: the form of the returned alpha, ``next_token`` or ``generation`` (eq. 1's two-expert forms).

    Returns:
        One alpha per row ``[N]``, in (-1, 0] (generation) or (-0.5, 0] (next-token); 0 for identical
        experts or a one-hot ``f_max``.

    Examples:
        >>> import torch
        >>> full = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0]]), -1)
        >>> short = torch.log_softmax(torch.tensor([[0.0, 2.0, 0.0]]), -1)
        >>> cocoa_alpha(full, short, form="generation")
        tensor([-0.2059])
    """
    full64, short64 = full.double(), short.double()
    divergence = (-2.0 * torch.logsumexp((full64 + short64) / 2.0, dim=-1)).clamp_min(0.0)
    top = full64.exp().topk(min(2, full64.shape[-1]), dim=-1).values
    margin = top[..., 0] - (top[..., 1] if top.shape[-1] > 1 else 0.0)
    a = cocoa_weight(divergence, margin).to(torch.promote_types(full.dtype, torch.float32))
    return alpha_of_weight(a, form)


def cocoa_weight(divergence: Tensor, margin: Tensor) -> Tensor:
    """``cocoa_alpha``'s weight ``a = (1 - exp(-D)) (1 - m)`` from the Rényi-1/2 divergence ``D`` (nats) and
    ``f_max``'s top-two margin ``m``.

    Args:
        divergence: ``D >= 0`` per row, in nats.
        margin: ``m`` per row, ``f_max``'s top-1 minus top-2 probability, in [0, 1].

    Returns:
        The weight ``a`` per row, in [0, 1).

    Examples:
        >>> import math, torch
        >>> cocoa_weight(torch.tensor([0.0, math.log(2)]), torch.tensor([0.5, 0.5]))
        tensor([0.0000, 0.2500])
    """
    return (1.0 - torch.exp(-divergence)) * (1.0 - margin)


def jsd_alpha(full: Tensor, short: Tensor, form: BoostForm = "next_token") -> Tensor:
    """AdaCAD's alpha per row ``[N]``: ``a = JSD(f_max || f_short)`` in bits; ``-a`` in the generation form
    (exactly AdaCAD's ``(1 + a) log f_max - a log f_short``), ``-a / (1 + a)`` in the next-token form (the
    same argmax). Identical experts give 0, the base model.

    Args:
        full: ``[N, V]`` ``log f_max``, normalised log-probabilities on the whole context.
        short: ``[N, V]`` ``log f_short``, on the short context.
        form: the form of the returned alpha, ``next_token`` or ``generation`` (eq. 1's two-expert forms).

    Returns:
        One alpha per row ``[N]``, in [-1, 0] (generation) or [-0.5, 0] (next-token).

    Examples:
        >>> import torch
        >>> full = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0], [1.0, 1.0, 1.0]]), -1)
        >>> short = torch.log_softmax(torch.tensor([[0.0, 2.0, 0.0], [1.0, 1.0, 1.0]]), -1)
        >>> jsd_alpha(full, short, form="generation")  # a = JSD = 0.27 bits; identical rows give 0
        tensor([-0.2711, -0.0000])
    """
    return alpha_of_weight(js_divergence(full, short), form)


def jsdist_alpha(full: Tensor, short: Tensor, form: BoostForm = "next_token") -> Tensor:
    """``jsd_alpha`` with the Jensen-Shannon distance ``a = sqrt(JSD)`` (bits^½, in [0, 1]) as the weight:
    ``-a`` in the generation form, ``-a / (1 + a)`` in the next-token form (decoding's ``auto``).

    Args:
        full: ``[N, V]`` ``log f_max``, normalised log-probabilities on the whole context.
        short: ``[N, V]`` ``log f_short``, on the short context.
        form: the form of the returned alpha, ``next_token`` or ``generation`` (eq. 1's two-expert forms).

    Returns:
        One alpha per row ``[N]``, in [-1, 0] (generation) or [-0.5, 0] (next-token).

    Examples:
        >>> import torch
        >>> full = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0]]), -1)
        >>> short = torch.log_softmax(torch.tensor([[0.0, 2.0, 0.0]]), -1)
        >>> jsdist_alpha(full, short)  # a = sqrt(0.27) = 0.52, next-token form -a / (1 + a)
        tensor([-0.3424])
    """
    return alpha_of_weight(js_divergence(full, short).sqrt(), form)


def alpha_of_weight(a: Tensor, form: BoostForm = "next_token") -> Tensor:
    """Alpha of the context-aware-decoding mix ``(1 + a) log f_max - a log f_short`` for a weight ``a >= 0``:
    ``-a`` in the generation form, ``-a / (1 + a)`` in the next-token form (the same argmax).

    Args:
        a: the weights, ``>= 0``, any shape.
        form: the form of the returned alpha, ``next_token`` or ``generation`` (eq. 1's two-expert forms).

    Returns:
        The alphas, of ``a``'s shape.

    Examples:
        >>> import torch
        >>> alpha_of_weight(torch.tensor([0.25]), "generation"), alpha_of_weight(torch.tensor([0.25]))
        (tensor([-0.2500]), tensor([-0.2000]))
    """
    return -a if form == "generation" else -a / (1.0 + a)


def token_alphas(rule: DecodingRule, full: Tensor, short: Tensor, form: BoostForm = "next_token") -> Tensor:
    """Per-row alpha ``[N]`` of a per-position rule (``auto``: ``AUTO["token"]``) from ``log f_max`` and
    ``log f_short``: what decoding and tuning use for ``Boosting(adaptive=...)``.

    Args:
        rule: ``auto``, ``jsd``, ``jsdist`` or ``cocoa`` (``jsd_alpha``, ``jsdist_alpha``, ``cocoa_alpha``).
        full: ``[N, V]`` ``log f_max``, normalised log-probabilities on the whole context.
        short: ``[N, V]`` ``log f_short``, on the short context.
        form: the form of the returned alpha, ``next_token`` or ``generation`` (eq. 1's two-expert forms).

    Returns:
        One alpha per row ``[N]``.

    Examples:
        >>> import torch
        >>> full = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0]]), -1)
        >>> short = torch.log_softmax(torch.tensor([[0.0, 2.0, 0.0]]), -1)
        >>> token_alphas("auto", full, short)  # auto is jsdist
        tensor([-0.3424])
    """
    rule = AUTO["token"] if rule == "auto" else rule
    return {"jsd": jsd_alpha, "jsdist": jsdist_alpha, "cocoa": cocoa_alpha}[rule](full, short, form)


# ---------------------------------------------------------------------------------------------------------
# Multiple choice: rules over an answer set


def _scores(ll_full: Tensor, ll_short: Tensor, lengths: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Which answers a question has, and both experts' scores of them (per character with ``lengths``, as
    the length-normalised eq. 2), float64, 0 at the missing ones."""
    mask = ~torch.isneginf(ll_full)
    scale = 1.0 if lengths is None else lengths.double().clamp_min(1)
    full, short = (torch.where(mask, ll.double() / scale, 0.0) for ll in (ll_full, ll_short))
    return mask, full, short


def _normalised(scores: Tensor, mask: Tensor) -> Tensor:
    """Log-softmax over each question's own answers (missing answers ``-inf``)."""
    return torch.log_softmax(torch.where(mask, scores, -math.inf), dim=-1)


def _centred(scores: Tensor, mask: Tensor) -> Tensor:
    """Each question's scores (0 at missing answers) minus the mean of its own answers, 0 at missing ones."""
    count = mask.sum(-1, keepdim=True).clamp_min(1)
    return torch.where(mask, scores - scores.sum(-1, keepdim=True) / count, 0.0)


def choice_jsd(ll_full: Tensor, ll_short: Tensor, lengths: Tensor | None = None) -> Tensor:
    """Per question ``[N]``, the JSD in bits between the full and premise-free scores normalised over its
    answers (eq. 2's two experts as distributions over the choices).

    Args:
        ll_full: ``[N, C]`` each answer's log-likelihood after the full context, ``-inf`` for a missing
            answer.
        ll_short: ``[N, C]`` the same after the premise-free context.
        lengths: ``[N, C]`` answer lengths in characters, for length-normalised scores, or ``None``.

    Returns:
        The divergence per question ``[N]``, float64, in [0, 1].

    Examples:
        >>> import torch
        >>> ll_full = torch.tensor([[-2.0, -3.0, -float("inf")], [-1.0, -4.0, -2.0]])
        >>> ll_short = torch.tensor([[-1.0, -5.0, -2.0], [-3.0, -1.0, -2.0]])
        >>> choice_jsd(ll_full, ll_short)  # the first question has two answers
        tensor([0.1083, 0.4449], dtype=torch.float64)
    """
    mask, full, short = _scores(ll_full, ll_short, lengths)
    return js_divergence(_normalised(full, mask), _normalised(short, mask))


def choice_jsd_alpha(ll_full: Tensor, ll_short: Tensor, lengths: Tensor | None = None) -> Tensor:
    """AdaCAD's weight over each question's answer set ``[N]``: ``a = choice_jsd``,
    ``alpha = -a / (1 + a)`` (eq. 2's argmax of ``(1 + a) l_full - a l_short``).

    Args:
        ll_full: ``[N, C]`` each answer's log-likelihood after the full context, ``-inf`` for a missing
            answer.
        ll_short: ``[N, C]`` the same after the premise-free context.
        lengths: ``[N, C]`` answer lengths in characters, for length-normalised scores, or ``None``.

    Returns:
        One alpha per question ``[N]``, float64, in [-0.5, 0].

    Examples:
        >>> import torch
        >>> ll_full = torch.tensor([[-2.0, -3.0, -float("inf")], [-1.0, -4.0, -2.0]])
        >>> ll_short = torch.tensor([[-1.0, -5.0, -2.0], [-3.0, -1.0, -2.0]])
        >>> choice_jsd_alpha(ll_full, ll_short)
        tensor([-0.0977, -0.3079], dtype=torch.float64)
    """
    return alpha_of_weight(choice_jsd(ll_full, ll_short, lengths)).double()


def decorrelate_alpha(ll_full: Tensor, ll_short: Tensor, lengths: Tensor | None = None) -> float:
    """One alpha for a split: ``-beta``, ``beta`` the pooled least-squares slope of the full answer scores on
    the premise-free ones, each question centred on the mean of its own answers:

        beta = Σ_i Σ_c (f_ic - f̄_i)(s_ic - s̄_i) / Σ_i Σ_c (s_ic - s̄_i)²

    (scores per character with ``lengths``, as the length-normalised eq. 2). 0 when the premise-free scores
    never vary within a question (nothing to remove).

    Args:
        ll_full: ``[N, C]`` each answer's log-likelihood after the full context, ``-inf`` for a missing
            answer.
        ll_short: ``[N, C]`` the same after the premise-free context.
        lengths: ``[N, C]`` answer lengths in characters, for length-normalised scores, or ``None``.

    Returns:
        The split's alpha, ``-beta``.

    Examples:
        >>> import torch
        >>> ll_short = torch.tensor([[-1.0, -5.0, -2.0], [-3.0, -1.0, -2.0]])
        >>> decorrelate_alpha(ll_short - 1.0, ll_short)  # scores that are the prior: alpha -1 removes it
        -1.0
    """
    mask, f, s = _scores(ll_full, ll_short, lengths)
    fc, sc = _centred(f, mask), _centred(s, mask)
    var = float((sc * sc).sum())
    if var <= 1e-12:
        return 0.0
    return -float((fc * sc).sum()) / var


def context_gain(ll_full: Tensor, ll_short: Tensor, lengths: Tensor | None = None) -> tuple[float, float]:
    """How far the premise moves the answers: the mean over the split's questions of the JSD (bits) between
    the full and the premise-free scores normalised over each question's answers, and its standard error.

    Near 0 the premise adds nothing the answers' own likelihood did not say (PIQA's solutions: the full
    and the premise-free model pick the same one), and boosting, which removes that likelihood, leaves
    noise: the case NWCAD's gate falls back to plain decoding for (arXiv 2604.16686).

    Args:
        ll_full: ``[N, C]`` each answer's log-likelihood after the full context, ``-inf`` for a missing
            answer.
        ll_short: ``[N, C]`` the same after the premise-free context.
        lengths: ``[N, C]`` answer lengths in characters, for length-normalised scores, or ``None``.

    Returns:
        The mean JSD (bits; 0 for no questions) and its standard error (``inf`` for fewer than two
        questions).

    Examples:
        >>> import torch
        >>> ll_full = torch.tensor([[-2.0, -3.0, -float("inf")], [-1.0, -4.0, -2.0]])
        >>> ll_short = torch.tensor([[-1.0, -5.0, -2.0], [-3.0, -1.0, -2.0]])
        >>> gain, stderr = context_gain(ll_full, ll_short)
        >>> round(gain, 4), round(stderr, 4)
        (0.2766, 0.1683)
    """
    js = choice_jsd(ll_full, ll_short, lengths)
    n = js.numel()
    return float(js.mean()) if n else 0.0, float(js.std(unbiased=True) / math.sqrt(n)) if n > 1 else math.inf


def same_prior_everywhere(ll_full: Tensor, ll_short: Tensor) -> bool:
    """Whether every question has the same answers' premise-free scores (a fixed answer set after a constant
    premise-free context, as SST-2's labels): such a prior cannot tell one question's answer from another's,
    so it is a bias to calibrate away, never evidence. Scores within 1e-4 nats count as equal (the same
    text scored in different float32 batches differs by about 1e-5)."""
    mask, _, s = _scores(ll_full, ll_short, None)
    if ll_full.shape[0] < 2 or not bool((mask == mask[:1]).all()):
        return False
    return bool(((s - s[:1]).abs() <= 1e-4).all())


def prior_share(ll_full: Tensor, ll_short: Tensor, lengths: Tensor | None = None) -> float:
    """How much of the split's label bias the premise-free prior accounts for, where every question has the
    same prior (``same_prior_everywhere``: a fixed label set): the squared cosine between the split's mean
    label preference and the prior, each centred over the labels::

        m = mean_i (f_i - mean_a f_ia),   p = s - mean_a s_a,   share = (m · p)² / (|m|² |p|²)   (in [0, 1])

    (``f_i`` question ``i``'s full scores, ``s`` the premise-free scores of the first question; per character
    with ``lengths``). ``decorrelate_alpha`` is then ``-(m · p) / |p|²``: it removes the part of ``m`` along
    ``p``, a share ``share`` of ``|m|²``. With two labels every centred vector lies on one line, so the share
    is 1 (or 0 when ``m`` or ``p`` vanishes, where ``decorrelate`` is 0 as well).

    Args:
        ll_full: ``[N, C]`` each answer's log-likelihood after the full context (eq. 2), ``-inf`` where a
            question has fewer answers.
        ll_short: ``[N, C]`` the same after the premise-free context; only the first question's row is read
            (the caller has checked ``same_prior_everywhere``).
        lengths: ``[N, C]`` answer lengths (characters) for the length-normalised eq. 2, or None.

    Returns:
        The share in ``[0, 1]``; ``gated_alpha`` calibrates where it is at least ``PRIOR_SHARE``."""
    mask, f, s = _scores(ll_full, ll_short, lengths)
    m, p = _centred(f, mask).mean(0), _centred(s, mask)[0]
    mm, pp = float(m @ m), float(p @ p)
    if mm <= 1e-24 or pp <= 1e-12:  # no preference or no prior: nothing to explain, nothing to remove
        return 0.0
    return min(float(m @ p) ** 2 / (mm * pp), 1.0)  # rounding can leave it a hair above 1


def gated_alpha(ll_full: Tensor, ll_short: Tensor, lengths: Tensor | None = None) -> float:
    """``decorrelate_alpha`` where boosting removes a bias, else 0, the base model. Two gates, by the kind of
    prior:

    * every question has the same prior (``same_prior_everywhere``: a fixed label set, where ``decorrelate``
      is batch calibration): the prior is a bias by construction, and calibrating along it removes the bias
      where the prior is what the bias is made of: ``prior_share`` at least ``PRIOR_SHARE`` (always with two
      labels). Below it (SST-5 on SmolLM2: 0.12) moving the scores along the prior trades one label for
      another and loses to the base model;
    * otherwise, where the premise demonstrably moves the answers (``context_gain``'s mean minus two
      standard errors at least ``GATE_BITS``). Where the premise adds little the premise-free likelihood is
      the evidence (PIQA's fluent right solutions) and removing it loses; where the split is too small to
      tell, the base model is kept.

    docs/adaptive.md measures both."""
    if same_prior_everywhere(ll_full, ll_short):
        calibrates = prior_share(ll_full, ll_short, lengths) >= PRIOR_SHARE
    else:
        gain, stderr = context_gain(ll_full, ll_short, lengths)
        calibrates = gain - 2.0 * stderr >= GATE_BITS
    return decorrelate_alpha(ll_full, ll_short, lengths) if calibrates else 0.0


def prior_ranks(ll_short: Tensor, ll_full: Tensor) -> Tensor:
    """Each answer's rank (0 = most likely) under the premise-free context within its question ``[N, C]``;
    ties by answer order (the first listed ranks first); missing answers rank last (``balance``'s ranks).

    Args:
        ll_short: ``[N, C]`` each answer's log-likelihood after the premise-free context.
        ll_full: ``[N, C]`` the same after the full context; only its ``-inf`` entries (missing answers) are
            read.

    Returns:
        The ranks ``[N, C]``, int64.

    Examples:
        >>> import torch
        >>> ll_full = torch.tensor([[-2.0, -3.0, -float("inf")], [-1.0, -4.0, -2.0]])
        >>> ll_short = torch.tensor([[-1.0, -5.0, -2.0], [-3.0, -1.0, -2.0]])
        >>> prior_ranks(ll_short, ll_full)
        tensor([[0, 1, 2],
                [2, 0, 1]])
    """
    key = torch.where(~torch.isneginf(ll_full), ll_short.double(), -math.inf)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    return order.argsort(dim=-1)  # the inverse permutation: each answer's place in the order


def balance_alpha(
    ll_full: Tensor, ll_short: Tensor, alphas: Sequence[float] | Tensor, lengths: Tensor | None = None
) -> tuple[float, Tensor]:
    """The grid value whose predictions are spread most evenly over the premise-free rank of the predicted
    answer, and the distance at every grid value ``[A]``.

    The distance is the total variation ``½ Σ_r |h(r) - u(r)|`` between the share ``h(r)`` of questions
    whose predicted answer has premise-free rank ``r`` and its expectation ``u(r) = mean_i 1[r < C_i] / C_i``
    had the prediction been independent of that rank. Among equal distances (hard counts tie often) the
    value closest to 0 wins (the least change to the base model), then the first in grid order.

    Args:
        ll_full: ``[N, C]`` each answer's log-likelihood after the full context, ``-inf`` for a missing
            answer.
        ll_short: ``[N, C]`` the same after the premise-free context.
        alphas: the grid of candidate alphas (eq. 2's alpha), at least one.
        lengths: ``[N, C]`` answer lengths in characters, for length-normalised scores, or ``None``.

    Returns:
        The chosen alpha and the distance at every grid value ``[A]`` (float64).

    Examples:
        Two labels whose premise-free prior favours the first by 0.5 nats: at alpha 0 three of four
        predictions are the first label, at -0.5 two of four.

        >>> import torch
        >>> ll_full = torch.tensor([[-0.6, -1.0], [-0.5, -1.2], [-0.7, -0.9], [-1.2, -0.4]])
        >>> ll_short = torch.tensor([[-0.5, -1.0]]).expand(4, 2)
        >>> balance_alpha(ll_full, ll_short, [0.0, -0.5, -1.0])
        (-0.5, tensor([0.2500, 0.0000, 0.2500], dtype=torch.float64))
    """
    grid = torch.as_tensor(alphas, dtype=torch.float64).reshape(-1)
    c = ll_full.shape[1]
    ranks = prior_ranks(ll_short, ll_full)  # [N, C]
    counts = (~torch.isneginf(ll_full)).sum(-1)
    expected = torch.stack([((counts > r).double() / counts.clamp_min(1).double()).mean() for r in range(c)])
    preds = choice_predictions(ll_full, ll_short, grid, lengths)  # [A, N]
    pred_rank = ranks.unsqueeze(0).expand(grid.numel(), -1, -1).gather(-1, preds.unsqueeze(-1)).squeeze(-1)
    hist = torch.nn.functional.one_hot(pred_rank, c).double().mean(1)  # [A, C]
    distance = 0.5 * (hist - expected.view(1, -1)).abs().sum(-1)
    best = distance.min()
    tied = torch.nonzero(distance <= best + 1e-12).view(-1)
    pick = tied[torch.argmin(grid[tied].abs())]  # argmin returns the first of equal |alpha|
    return float(grid[pick]), distance


def choice_alphas(
    rule: ChoiceRule,
    ll_full: Tensor,
    ll_short: Tensor,
    alphas: Sequence[float] | Tensor,
    lengths: Tensor | None = None,
) -> Tensor:
    """Each question's alpha ``[N]`` (float64) under a multiple-choice rule; the transductive rules give
    every question of the split the same value (eq. 2's alpha, per question).

    Args:
        rule: ``gated``, ``jsd``, ``jsd_mean``, ``decorrelate`` or ``balance`` (docs/adaptive.md).
        ll_full: ``[N, C]`` each answer's log-likelihood after the full context, ``-inf`` for a missing
            answer.
        ll_short: ``[N, C]`` the same after the premise-free context.
        alphas: the grid ``balance`` chooses from (the other rules ignore it).
        lengths: ``[N, C]`` answer lengths in characters, for length-normalised scores, or ``None``.

    Returns:
        One alpha per question ``[N]``, float64.

    Examples:
        >>> import torch
        >>> ll_full = torch.tensor([[-2.0, -3.0, -float("inf")], [-1.0, -4.0, -2.0]])
        >>> ll_short = torch.tensor([[-1.0, -5.0, -2.0], [-3.0, -1.0, -2.0]])
        >>> choice_alphas("jsd_mean", ll_full, ll_short, alphas=[])
        tensor([-0.2028, -0.2028], dtype=torch.float64)
    """
    if rule == "jsd":
        return choice_jsd_alpha(ll_full, ll_short, lengths)
    if rule == "jsd_mean":
        value = float(choice_jsd_alpha(ll_full, ll_short, lengths).mean())
    elif rule == "decorrelate":
        value = decorrelate_alpha(ll_full, ll_short, lengths)
    elif rule == "gated":
        value = gated_alpha(ll_full, ll_short, lengths)
    else:
        value = balance_alpha(ll_full, ll_short, alphas, lengths)[0]
    return torch.full((ll_full.shape[0],), value, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------------
# k from the input's structure (next-token prediction)

_SENTENCE_END = re.compile(r"""[.!?]+["'”’)\]]*(?=\s)|\n""")
_CLAUSE_END = re.compile(r"""[.!?,;:]+["'”’)\]]*(?=\s)|\n|\s[-–—]+(?=\s)""")


def unit_k(pieces: Sequence[str], unit: Unit = "sentence") -> int:
    """The number of trailing tokens that make up the input's last sentence (or clause), at least 1.

    ``pieces`` are the decoded strings of the context's tokens (special prefix excluded), in order. A
    sentence ends at ``.``, ``!`` or ``?`` (closing quotes and brackets kept with it) before whitespace, or at
    a newline; a clause also at ``,``, ``;``, ``:`` and a free-standing dash. The short context is every token
    that starts at or after the last end: with no end in the text it is the whole context (``f_k == f_max``).

    Args:
        pieces: the decoded text of each context token, in order.
        unit: ``sentence`` or ``clause``.

    Returns:
        ``k``, the number of trailing tokens in the last unit (1 for no pieces).

    Examples:
        >>> unit_k(["The", " cat", " sat", ".", " It", " was", " warm"])  # " It was warm"
        3
        >>> unit_k(["Yes", ",", " and", " no"], unit="clause")  # " and no"
        2
    """
    if not pieces:
        return 1
    pattern = _SENTENCE_END if unit == "sentence" else _CLAUSE_END
    # ends followed by nothing but whitespace do not open a new unit: look for the last end before the
    # final non-space character
    ends = [m.end() for m in pattern.finditer("".join(pieces).rstrip())]
    if not ends:
        return len(pieces)
    starts = itertools.accumulate((len(p) for p in pieces[:-1]), initial=0)  # where each piece starts
    return max(sum(s >= ends[-1] for s in starts), 1)
