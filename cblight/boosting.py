"""Coherence boosting as pure tensor maths (paper §2, eq. 1 and eq. 2; docs/design.md, "Mathematics").

Nothing here imports Lightning or the Hub: every function takes log-probabilities (or log-likelihood sums)
already computed by a model and returns tensors, so the whole module is unit-tested against hand-computed
numbers.

Vocabulary-level mixing always happens on float32 log-probabilities (log-softmax of each expert), never on
raw logits of different experts and never on probabilities. The paper's weighted product of experts

    f_alpha(w | w_1..w_n)  ∝  Π_k f_k(w | w_1..w_n) ^ alpha_k            (eq. 1)

is ``product_of_experts``; the two-expert forms of the paper are ``two_expert_weights``:

* ``"next_token"``: ``log f_max + alpha · log f_k`` (LAMBADA Tab. 1, LAMA Tab. 5, dialog Tab. 3, summaries);
* ``"generation"``: ``(1 - alpha) · log f_max + alpha · log f_k`` (WebText Tab. 2, Figure 1), which equals
  the untempered base model whenever ``f_k == f_max``.

Multiple-choice answer selection (eq. 2) mixes sequence log-likelihoods instead: ``choice_scores``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from cblight.option_types import PositiveInt

#: The paper's two two-expert forms, ``log f_max + alpha log f_k`` (next token) and ``(1-alpha) log f_max + alpha log f_k`` (generation).
BoostForm = Literal["next_token", "generation"]

__all__ = [
    "MAX_ALPHA",
    "MAX_GRID",
    "AlphaGrid",
    "BoostForm",
    "binomial_stderr",
    "boosted_log_probs",
    "choice_accuracy_curve",
    "choice_predictions",
    "choice_scores",
    "first_argmax",
    "log_softmax32",
    "mix_log_probs",
    "next_token_alpha_sweep",
    "normalize_log_scores",
    "product_of_experts",
    "short_context_ids",
    "too_large_alpha",
    "two_expert_weights",
]

#: The largest ``|alpha|`` a mix takes. Beyond about 1e7 the full model's float32 log-probabilities (24-bit
#: mantissa: a relative precision of 6e-8) vanish next to ``alpha`` times the short one's, so the mix is the
#: short context alone; far beyond (about 1e34) it overflows, and a table's accuracies and perplexities come
#: from infinite or NaN scores. The paper's grids lie in [-5, 2].
MAX_ALPHA = 1e6
#: The most values an ``AlphaGrid`` holds (the default multiple-choice grid has 701; each value costs a column
#: of every sweep).
MAX_GRID = 100_000


def too_large_alpha(alphas: Sequence[float]) -> str | None:
    """Why the first alpha of ``alphas`` beyond ``MAX_ALPHA`` in size cannot be mixed, or ``None``: the check
    every alpha option runs before any model work.

    Args:
        alphas: the alphas of an option (a grid, or one value in a list).

    Returns:
        One sentence naming the first alpha past ``MAX_ALPHA`` and the paper's range, or ``None`` when every
        alpha can be mixed.

    Examples:
        >>> too_large_alpha([0.0, -0.5]) is None
        True
        >>> print(too_large_alpha([-0.5, 1e9]))
        alpha 1e+09 is past the largest boost, 1e+06 in size (past it the full model no longer counts in
        float32, and far past it the scores overflow); the paper's alphas lie in [-5, 2]
    """
    for alpha in alphas:
        if abs(alpha) > MAX_ALPHA:
            return (
                f"alpha {alpha:g} is past the largest boost, {MAX_ALPHA:g} in size (past it the full model "
                "no longer counts in float32, and far past it the scores overflow); the paper's alphas lie in "
                "[-5, 2]"
            )
    return None


def log_softmax32(logits: Tensor) -> Tensor:
    """Log-softmax over the last axis in float32, whatever dtype the model ran in (docs/design.md, "Mathematics").

    Args:
        logits: a model's logits, any float dtype, vocabulary on the last axis.

    Returns:
        The log-probabilities, float32, of the same shape.

    Examples:
        >>> import torch
        >>> log_softmax32(torch.zeros(2, dtype=torch.float16))
        tensor([-0.6931, -0.6931])
    """
    return torch.log_softmax(logits.float(), dim=-1)


def two_expert_weights(alpha: float | Tensor, form: BoostForm) -> tuple[float | Tensor, float | Tensor]:
    """Weights ``(w_full, w_short)`` of the paper's two-expert forms (the table of docs/design.md,
    "Mathematics").

    Args:
        alpha: the boosting coefficient, one number or a tensor of one alpha per row.
        form: ``next_token`` (``log f_max + alpha log f_k``) or ``generation``
            (``(1 - alpha) log f_max + alpha log f_k``).

    Returns:
        The weights of ``f_max`` and ``f_k``, numbers, or tensors for a tensor of alphas.

    Examples:
        >>> two_expert_weights(-0.5, "next_token")
        (1.0, -0.5)
        >>> two_expert_weights(-0.5, "generation")
        (1.5, -0.5)
    """
    a = alpha if isinstance(alpha, Tensor) else float(alpha)
    return (1.0, a) if form == "next_token" else (1.0 - a, a)


def mix_log_probs(log_probs: Sequence[Tensor], weights: Sequence[float | Tensor]) -> Tensor:
    """Unnormalised ``Σ_k w_k · log f_k`` (the exponent of eq. 1), free of NaN.

    A weight is a number, or a tensor that broadcasts against its expert (one weight per row, ``[N, 1]``:
    the adaptive rules of docs/adaptive.md). Experts with weight 0 are ignored (``0 · -inf`` would be NaN).
    An entry that an expert with a positive weight rules out (``-inf``) stays ``-inf``: the product of
    experts keeps the support of its positive factors. An entry ruled out only by negatively weighted experts
    becomes ``+inf`` (``0 ^ -a = ∞``); see ``normalize_log_scores`` for what that means after normalisation.
    The rules hold row by row for per-row weights.

    Args:
        log_probs: each expert's log-probabilities, all of one shape (vocabulary last).
        weights: one weight per expert, a number or a tensor broadcasting against it.

    Returns:
        The weighted sum, float32, of the experts' shape; all zeros when every weight is 0.

    Raises:
        ValueError: when there is not one weight per expert.

    Examples:
        >>> import torch
        >>> full = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0]]), -1)
        >>> short = torch.log_softmax(torch.tensor([[0.0, 2.0, 0.0]]), -1)
        >>> mix_log_probs([full, short], [1.0, -0.5])
        tensor([[ 0.7122, -1.2878, -1.2878]])
    """
    total: Tensor | None = None
    vetoed: Any = False  # -inf under a positively weighted expert
    forced: Any = False  # -inf under a negatively weighted expert
    for lp, w in zip(log_probs, weights, strict=True):
        w = w.to(lp.device, torch.float32) if isinstance(w, Tensor) else float(w)
        if isinstance(w, float) and w == 0.0:
            continue
        lp = lp.float()
        minus_inf = torch.isneginf(lp)
        term = torch.where(minus_inf, torch.zeros_like(lp), lp) * w
        total = term if total is None else total + term
        vetoed, forced = vetoed | (minus_inf & (w > 0)), forced | (minus_inf & (w < 0))
    if total is None:  # every weight is zero: the uniform distribution (all exponents 0)
        return torch.zeros_like(log_probs[0], dtype=torch.float32)
    total = torch.where(forced, torch.full_like(total, math.inf), total)
    return torch.where(vetoed, torch.full_like(total, -math.inf), total)


def normalize_log_scores(scores: Tensor) -> Tensor:
    """Log-softmax over the last axis that tolerates ``+inf`` entries.

    A row holding ``+inf`` entries puts all its mass, uniformly, on them (the limit of the product of
    experts); other rows are an ordinary float32 log-softmax. The result never holds NaN for rows that
    have at least one entry above ``-inf``.

    Args:
        scores: unnormalised log-scores such as ``mix_log_probs`` returns.

    Returns:
        Normalised log-probabilities, float32, of the same shape.

    Examples:
        >>> import math, torch
        >>> normalize_log_scores(torch.tensor([0.0, math.inf, 1.0, math.inf])).exp()
        tensor([0.0000, 0.5000, 0.0000, 0.5000])
    """
    scores = scores.float()
    pos_inf = torch.isposinf(scores)
    has_pos_inf = pos_inf.any(dim=-1, keepdim=True)
    only_pos_inf = torch.where(pos_inf, 0.0, -math.inf)  # a row's mass, uniformly on its +inf entries
    return torch.log_softmax(torch.where(has_pos_inf, only_pos_inf, scores), dim=-1)


def product_of_experts(log_probs: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    """Normalised ``log f_alpha = log_softmax(Σ_k alpha_k log f_k)`` (paper eq. 1), any number of experts.

    Args:
        log_probs: each expert's log-probabilities, all of one shape (vocabulary last).
        weights: one exponent ``alpha_k`` per expert.

    Returns:
        The normalised log-probabilities of the weighted product, float32, under the ``-inf`` rules of
        ``mix_log_probs``.

    Examples:
        >>> import torch
        >>> full = torch.log_softmax(torch.tensor([2.0, 1.0, 0.0]), -1)
        >>> short = torch.log_softmax(torch.tensor([0.0, 2.0, 0.0]), -1)
        >>> product_of_experts([full, short], [1.0, -0.5]).exp()
        tensor([0.7870, 0.1065, 0.1065])
    """
    active = [(lp.float(), float(w)) for lp, w in zip(log_probs, weights, strict=True) if float(w)]
    # one host sync for all experts, not one per expert
    if active and bool(torch.stack([torch.isfinite(lp).all() for lp, _ in active]).all()):
        # The usual case, no -inf to keep or force: the same sums and log-softmax as below, bit for bit,
        # in a third of the passes (the coherence-tuning teacher mixes [positions, V] every step).
        terms = [lp * w for lp, w in active]
        return torch.log_softmax(sum(terms[1:], terms[0]), dim=-1)
    return normalize_log_scores(mix_log_probs(log_probs, weights))


def boosted_log_probs(
    full: Tensor, short: Tensor, alpha: float | Tensor, form: BoostForm = "next_token"
) -> Tensor:
    """Normalised two-expert boosted log-probabilities (the table of docs/design.md, "Mathematics"), float32.

    ``alpha`` is one number, or one per row of ``full`` (``[N]``, the per-position rules of docs/adaptive.md):
    each row then mixes with its own weights, under the ``-inf`` rules of ``mix_log_probs``, and a row with
    ``alpha = 0`` is ``f_max`` exactly.

    Args:
        full: log-probabilities of ``f_max``, the model on the whole context (``[N, V]`` or ``[V]``).
        short: log-probabilities of ``f_k``, the model on the short context, the shape of ``full``.
        alpha: the boosting coefficient (usually negative), or a tensor of one alpha per row.
        form: ``next_token`` (``log f_max + alpha log f_k``; Tables 1, 3, 5) or ``generation``
            (``(1 - alpha) log f_max + alpha log f_k``; Table 2, Figure 1).

    Returns:
        The boosted log-probabilities, float32, of the shape of ``full``.

    Examples:
        The next token after a context whose short version favours token 1: boosting takes mass from it.

        >>> import torch
        >>> full = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0]]), -1)
        >>> short = torch.log_softmax(torch.tensor([[0.0, 2.0, 0.0]]), -1)
        >>> full.exp()
        tensor([[0.6652, 0.2447, 0.0900]])
        >>> boosted_log_probs(full, short, alpha=-0.5).exp()
        tensor([[0.7870, 0.1065, 0.1065]])
        >>> boosted_log_probs(full, short, alpha=-0.5, form="generation").exp()
        tensor([[0.8835, 0.0725, 0.0440]])
    """
    if not isinstance(alpha, Tensor):
        return product_of_experts([full, short], two_expert_weights(alpha, form))
    rows = alpha.to(full.device, torch.float32).view(-1, *([1] * (full.dim() - 1)))
    return normalize_log_scores(mix_log_probs([full, short], two_expert_weights(rows, form)))


def short_context_ids(ids: Sequence[int], k: PositiveInt, special_prefix: Sequence[int] = ()) -> list[int]:
    """The context of ``f_k``: the last ``k`` tokens of ``ids``, after the tokenizer's special prefix.

    ``ids`` starts with ``special_prefix`` (e.g. Llama's BOS) when the tokenizer adds one; the short context
    keeps that prefix so a model trained always to see BOS sees it here too (docs/design.md, "Mathematics").
    When the content is no longer than ``k`` the result is ``ids`` itself, i.e. ``f_k == f_max``.

    Args:
        ids: the full context's token ids.
        k: how many tokens the short context keeps (positive).
        special_prefix: the tokenizer's special prefix (``cblight.scoring.special_prefix``), kept in front.

    Returns:
        The short context's token ids.

    Examples:
        >>> short_context_ids([5, 6, 7, 8], 2)
        [7, 8]
        >>> short_context_ids([1, 5, 6, 7, 8], 2, special_prefix=[1])
        [1, 7, 8]
    """
    ids, prefix = list(ids), list(special_prefix)
    if prefix and ids[: len(prefix)] == prefix:
        return prefix + ids[len(prefix) :][-k:]
    return ids[-k:]


def first_argmax(values: Tensor) -> int:
    """Flat index of the first maximum in row-major order: ties go to the first grid value, as the
    reference's ``np.argmax`` does (docs/design.md, "Mathematics").

    Args:
        values: a grid of values, e.g. accuracy over (k, alpha).

    Returns:
        The flat index of the first largest value.

    Examples:
        >>> import torch
        >>> first_argmax(torch.tensor([[0.1, 0.3], [0.3, 0.2]]))
        1
    """
    return int(values.reshape(-1).argmax())  # the first of equal maxima


# ---------------------------------------------------------------------------------------------------------
# Next-token prediction (LAMBADA, LAMA): the whole alpha grid from one full and one short distribution.


def next_token_alpha_sweep(
    full: Tensor, short: Tensor, targets: Tensor, alphas: Tensor, form: BoostForm = "next_token"
) -> dict[str, Tensor]:
    """Boosted next-token predictions for every alpha of a grid, from cached expert log-probs (paper §3,
    Tables 1 and 5).

    One alpha at a time, so memory stays ``[B, V]``; finite inputs (the usual case) skip the ``-inf``
    bookkeeping of ``mix_log_probs``.

    Args:
        full: ``[B, V]`` log-probabilities of ``f_max``.
        short: ``[B, V]`` log-probabilities of ``f_k``.
        targets: ``[B]`` the token each row should predict.
        alphas: ``[A]`` the grid of boosting coefficients.
        form: the two-expert form (``two_expert_weights``).

    Returns:
        A dict of ``[B, A]`` tensors. ``correct`` says whether the argmax over the whole vocabulary is the
        target (ties to the lowest token id), ``log_prob`` is the target's log-probability under the
        normalised boosted model (for perplexity), ``rank`` is 1 + the number of tokens scored strictly higher.

    Examples:
        >>> import torch
        >>> full = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0]]), -1)
        >>> short = torch.log_softmax(torch.tensor([[0.0, 2.0, 0.0]]), -1)
        >>> sweep = next_token_alpha_sweep(full, short, torch.tensor([0]), torch.tensor([0.0, -0.5]))
        >>> sweep["log_prob"]
        tensor([[-0.4076, -0.2395]])
        >>> sweep["rank"]
        tensor([[1, 1]])
    """
    full, short = full.float(), short.float()
    finite = bool(torch.isfinite(full).all()) and bool(torch.isfinite(short).all())
    tgt = targets.to(full.device).view(-1, 1)
    out: dict[str, list[Tensor]] = {"correct": [], "log_prob": [], "rank": []}
    for alpha in alphas.tolist():
        w_full, w_short = two_expert_weights(alpha, form)
        if finite:
            scores = torch.add(full if w_full == 1.0 else full * w_full, short, alpha=w_short)
            target_score = scores.gather(1, tgt)
            out["log_prob"].append(target_score.squeeze(1) - torch.logsumexp(scores, dim=-1))
        else:
            scores = mix_log_probs([full, short], (w_full, w_short))
            target_score = scores.gather(1, tgt)
            out["log_prob"].append(normalize_log_scores(scores).gather(1, tgt).squeeze(1))
        out["correct"].append(scores.argmax(dim=-1) == tgt.squeeze(1))
        out["rank"].append((scores > target_score).sum(dim=-1) + 1)
    return {name: torch.stack(columns, 1) for name, columns in out.items()}


# ---------------------------------------------------------------------------------------------------------
# Multiple-choice answer selection (eq. 2): sweeps over cached log-likelihood sums, no model calls.


def choice_scores(
    ll_full: Tensor, ll_short: Tensor, alphas: Tensor | float, lengths: Tensor | None = None
) -> Tensor:
    """``log f(a | full) + alpha · log f(a | premise-free)`` (paper eq. 2), float64.

    Missing choices (ragged choice counts) are ``-inf`` in ``ll_full`` and stay ``-inf``.

    Args:
        ll_full: ``[N, C]`` each answer's log-likelihood sum after the full context.
        ll_short: ``[N, C]`` the same after the premise-free context.
        alphas: one alpha, a grid ``[A]``, or each question's own alpha ``[N, 1]`` (a label-free rule's,
            docs/adaptive.md).
        lengths: ``[N, C]`` answer lengths in characters; when given the score is divided by them, as the
            reference's length normalisation does.

    Returns:
        The scores, float64, ``[N, C]`` for one alpha or per-question alphas, ``[A, N, C]`` for a grid.

    Examples:
        >>> import torch
        >>> ll_full = torch.tensor([[-2.0, -1.0], [-1.0, -3.0]])
        >>> ll_short = torch.tensor([[-1.0, -3.0], [-2.0, -1.0]])
        >>> choice_scores(ll_full, ll_short, -1.0)
        tensor([[-1.,  2.],
                [ 1., -2.]], dtype=torch.float64)
    """
    full = ll_full.double()
    missing = torch.isneginf(full)
    short = torch.where(missing | ~torch.isfinite(ll_short), 0.0, ll_short.double())
    alpha_t = torch.as_tensor(alphas, dtype=torch.float64, device=ll_full.device)
    if alpha_t.dim() == 1:  # a grid
        alpha_t = alpha_t.view(-1, 1, 1)
    scores = full + alpha_t * short
    if lengths is not None:
        scores = scores / lengths.double().clamp_min(1)
    return torch.where(missing, torch.full_like(scores, -math.inf), scores)


def choice_predictions(
    ll_full: Tensor, ll_short: Tensor, alphas: Tensor | float, lengths: Tensor | None = None
) -> Tensor:
    """Predicted choice index for every alpha (paper eq. 2); ties go to the first choice, like ``np.argmax`` in
    the reference.

    Args:
        ll_full: ``[N, C]`` each answer's log-likelihood after the full context.
        ll_short: ``[N, C]`` the same after the premise-free context.
        alphas: one alpha, a grid ``[A]`` or per-question alphas ``[N, 1]`` (as ``choice_scores``).
        lengths: ``[N, C]`` answer lengths in characters, for length normalisation.

    Returns:
        The chosen indices, ``[A, N]`` for a grid, ``[N]`` otherwise.

    Examples:
        >>> import torch
        >>> ll_full = torch.tensor([[-2.0, -1.0], [-1.0, -3.0]])
        >>> ll_short = torch.tensor([[-1.0, -3.0], [-2.0, -1.0]])
        >>> choice_predictions(ll_full, ll_short, torch.tensor([0.0, -1.0]))
        tensor([[1, 0],
                [1, 0]])
    """
    return choice_scores(ll_full, ll_short, alphas, lengths).argmax(dim=-1)


def choice_accuracy_curve(
    ll_full: Tensor, ll_short: Tensor, labels: Tensor, alphas: Tensor, lengths: Tensor | None = None
) -> Tensor:
    """Accuracy at every alpha of a grid (paper eq. 2, Table 4's sweep), from one pass of cached
    log-likelihoods.

    Args:
        ll_full: ``[N, C]`` each answer's log-likelihood after the full context.
        ll_short: ``[N, C]`` the same after the premise-free context.
        labels: ``[N]`` the correct choice of each question.
        alphas: ``[A]`` the grid.
        lengths: ``[N, C]`` answer lengths in characters, for length normalisation.

    Returns:
        ``[A]`` accuracies, float64.

    Examples:
        >>> import torch
        >>> ll_full = torch.tensor([[-2.0, -1.0], [-1.0, -3.0]])
        >>> ll_short = torch.tensor([[-1.0, -3.0], [-2.0, -1.0]])
        >>> choice_accuracy_curve(ll_full, ll_short, torch.tensor([0, 0]), torch.tensor([0.0, -1.0]))
        tensor([0.5000, 0.5000], dtype=torch.float64)
    """
    preds = choice_predictions(ll_full, ll_short, alphas.reshape(-1), lengths)
    return (preds == labels.view(1, -1).to(preds.device)).double().mean(dim=1)


def binomial_stderr(accuracy: float, n: int) -> float:
    """Standard error of an accuracy over ``n`` independent examples, ``sqrt(p (1 - p) / n)``.

    Args:
        accuracy: the accuracy ``p``, in [0, 1].
        n: the number of examples.

    Returns:
        The standard error; NaN when ``n`` is not positive.

    Examples:
        >>> round(binomial_stderr(0.75, 100), 4)
        0.0433
    """
    if n <= 0:
        return float("nan")
    return math.sqrt(max(accuracy * (1.0 - accuracy), 0.0) / n)


@dataclass(frozen=True)
class AlphaGrid:
    """An inclusive grid ``start, start ± step, …, stop`` of boosting coefficients.

    The default is the multiple-choice grid of docs/design.md, "Mathematics" (2 down to -5 by 0.01, since
    Table 4 has alpha* down to -4.19). Grid order matters: ties for alpha* go to the first value.

    Args:
        start: the first alpha.
        stop: the last alpha (included when the steps reach it), above or below ``start``.
        step: the distance between neighbours, positive.

    Examples:
        >>> AlphaGrid(0.0, -1.0, 0.25).values()
        [0.0, -0.25, -0.5, -0.75, -1.0]
        >>> len(AlphaGrid().values())
        701
    """

    start: float = 2.0
    stop: float = -5.0
    step: float = 0.01

    def values(self) -> list[float]:
        """The grid's alphas, in order from ``start`` to ``stop``, rounded to the step's decimals.

        Returns:
            The alphas.

        Raises:
            ValueError: when the step is not positive or a bound is not finite.
        """
        if self.step <= 0 or not math.isfinite(self.step):
            raise ValueError(f"alpha grid step must be positive, got {self.step}")
        if not (math.isfinite(self.start) and math.isfinite(self.stop)):
            raise ValueError(f"alpha grid bounds must be finite, got {self.start} .. {self.stop}")
        if too_large := too_large_alpha([self.start, self.stop]):  # before a grid of 1e11 values is built
            raise ValueError(too_large)
        direction = -1.0 if self.stop < self.start else 1.0
        n = math.floor(abs(self.stop - self.start) / self.step + 1e-9) + 1
        if n > MAX_GRID:
            raise ValueError(
                f"alpha grid {self.start:g} .. {self.stop:g} by {self.step:g} has {n} values, more than "
                f"{MAX_GRID}: take a larger step"
            )
        decimals = max(0, -math.floor(math.log10(self.step)) + 2)
        return [round(self.start + direction * i * self.step, decimals) for i in range(n)]
