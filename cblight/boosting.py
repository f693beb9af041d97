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

from cblight.option_types import PositiveInt, check_arguments

#: The paper's two two-expert forms, ``log f_max + alpha log f_k`` (next token) and ``(1-alpha) log f_max + alpha log f_k`` (generation).
BoostForm = Literal["next_token", "generation"]

__all__ = [
    "MAX_ALPHA",
    "MAX_GRID",
    "AlphaGrid",
    "BoostForm",
    "binomial_stderr",
    "boosted_log_probs",
    "choice_accuracy",
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
    """Why the first alpha of ``alphas`` beyond ``MAX_ALPHA`` in size cannot be mixed, or ``None``."""
    for alpha in alphas:
        if abs(alpha) > MAX_ALPHA:
            return (
                f"alpha {alpha:g} is past the largest boost, {MAX_ALPHA:g} in size (past it the full model "
                "no longer counts in float32, and far past it the scores overflow); the paper's alphas lie in "
                "[-5, 2]"
            )
    return None


def log_softmax32(logits: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the last axis in float32, whatever dtype the model ran in (docs/design.md, "Mathematics")."""
    return torch.log_softmax(logits.float(), dim=-1)


def two_expert_weights(
    alpha: float | torch.Tensor, form: BoostForm
) -> tuple[float | torch.Tensor, float | torch.Tensor]:
    """Weights ``(w_full, w_short)`` of the paper's two-expert forms (the table of docs/design.md,
    "Mathematics"); a tensor of alphas (one per row) gives tensors of weights."""
    check_arguments(two_expert_weights, {"form": form})
    a = alpha if isinstance(alpha, torch.Tensor) else float(alpha)
    return (1.0, a) if form == "next_token" else (1.0 - a, a)


def mix_log_probs(log_probs: Sequence[torch.Tensor], weights: Sequence[float | torch.Tensor]) -> torch.Tensor:
    """Unnormalised ``Σ_k w_k · log f_k`` (the exponent of eq. 1), free of NaN.

    A weight is a number, or a tensor that broadcasts against its expert (one weight per row, ``[N, 1]``:
    the adaptive rules of docs/adaptive.md). Experts with weight 0 are ignored (``0 · -inf`` would be NaN).
    An entry that an expert with a positive weight rules out (``-inf``) stays ``-inf``: the product of
    experts keeps the support of its positive factors. An entry ruled out only by negatively weighted experts
    becomes ``+inf`` (``0 ^ -a = ∞``); see ``normalize_log_scores`` for what that means after normalisation.
    The rules hold row by row for per-row weights.
    """
    if len(log_probs) != len(weights):
        raise ValueError(f"{len(log_probs)} experts but {len(weights)} weights")
    if not log_probs:
        raise ValueError("product of experts needs at least one expert")
    total: torch.Tensor | None = None
    vetoed: Any = False  # -inf under a positively weighted expert
    forced: Any = False  # -inf under a negatively weighted expert
    for lp, w in zip(log_probs, weights):
        w = w.to(lp.device, torch.float32) if isinstance(w, torch.Tensor) else float(w)
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


def normalize_log_scores(scores: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the last axis that tolerates ``+inf`` entries.

    A row holding ``+inf`` entries puts all its mass, uniformly, on them (the limit of the product of
    experts); other rows are an ordinary float32 log-softmax. The result never holds NaN for rows that
    have at least one entry above ``-inf``.
    """
    scores = scores.float()
    pos_inf = torch.isposinf(scores)
    has_pos_inf = pos_inf.any(dim=-1, keepdim=True)
    finite_view = torch.where(
        has_pos_inf,
        torch.where(pos_inf, torch.zeros_like(scores), torch.full_like(scores, -math.inf)),
        scores,
    )
    return torch.log_softmax(finite_view, dim=-1)


def product_of_experts(log_probs: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """Normalised ``log f_alpha = log_softmax(Σ_k alpha_k log f_k)`` (paper eq. 1), any number of experts."""
    if len(log_probs) == len(weights) and any(float(w) for w in weights):
        lps = [lp.float() for lp, w in zip(log_probs, weights) if float(w)]
        # one host sync for all experts, not one per expert
        finite = torch.stack([torch.isfinite(lp).all() for lp in lps]).all()
        if bool(finite):
            # The usual case, no -inf to keep or force: the same sums and log-softmax as below, bit for bit,
            # in a third of the passes (the coherence-tuning teacher mixes [positions, V] every step).
            terms = [lp * float(w) for lp, w in zip(lps, (w for w in weights if float(w)), strict=True)]
            return torch.log_softmax(sum(terms[1:], terms[0]), dim=-1)
    return normalize_log_scores(mix_log_probs(log_probs, weights))


def boosted_log_probs(
    full: torch.Tensor, short: torch.Tensor, alpha: float | torch.Tensor, form: BoostForm = "next_token"
) -> torch.Tensor:
    """Normalised two-expert boosted log-probabilities (the table of docs/design.md, "Mathematics"), float32.

    ``alpha`` is one number, or one per row of ``full`` (``[N]``, the per-position rules of docs/adaptive.md):
    each row then mixes with its own weights, under the ``-inf`` rules of ``mix_log_probs``, and a row with
    ``alpha = 0`` is ``f_max`` exactly.
    """
    if not isinstance(alpha, torch.Tensor):
        return product_of_experts([full, short], two_expert_weights(alpha, form))
    rows = alpha.to(full.device, torch.float32).view(-1, *([1] * (full.dim() - 1)))
    w_full, w_short = two_expert_weights(rows, form)
    if isinstance(w_full, torch.Tensor) and bool((w_full <= 0).any()):
        raise ValueError("every row's full-context weight must be positive (generation form: alpha < 1)")
    return normalize_log_scores(mix_log_probs([full, short], [w_full, w_short]))


def short_context_ids(ids: Sequence[int], k: PositiveInt, special_prefix: Sequence[int] = ()) -> list[int]:
    """The context of ``f_k``: the last ``k`` tokens of ``ids``, after the tokenizer's special prefix.

    ``ids`` starts with ``special_prefix`` (e.g. Llama's BOS) when the tokenizer adds one; the short context
    keeps that prefix so a model trained always to see BOS sees it here too (docs/design.md, "Mathematics"). When the
    content is no longer than ``k`` the result is ``ids`` itself, i.e. ``f_k == f_max``.
    """
    check_arguments(short_context_ids, {"k": k})
    ids, prefix = list(ids), list(special_prefix)
    if prefix and ids[: len(prefix)] == prefix:
        return prefix + ids[len(prefix) :][-k:]
    return ids[-k:]


def first_argmax(values: torch.Tensor) -> int:
    """Flat index of the first maximum in row-major order: ties go to the first grid value, as the
    reference's ``np.argmax`` does (docs/design.md, "Mathematics")."""
    flat = values.reshape(-1)
    if flat.numel() == 0:
        raise ValueError("cannot choose from an empty grid")
    return int(flat.argmax())  # the first of equal maxima


# ---------------------------------------------------------------------------------------------------------
# Next-token prediction (LAMBADA, LAMA): the whole alpha grid from one full and one short distribution.


def next_token_alpha_sweep(
    full: torch.Tensor,
    short: torch.Tensor,
    targets: torch.Tensor,
    alphas: torch.Tensor,
    form: BoostForm = "next_token",
) -> dict[str, torch.Tensor]:
    """Boosted next-token predictions for every alpha of a grid, from cached expert log-probs.

    ``full`` and ``short`` are ``[B, V]`` log-probabilities of ``f_max`` and ``f_k``; ``targets`` is ``[B]``.
    Returns ``correct`` (argmax over the whole vocabulary equals the target; ties to the lowest token id),
    ``log_prob`` (target log-probability under the normalised boosted model, for perplexity) and ``rank``
    (1 + number of tokens scored strictly higher), each ``[B, A]``. One alpha at a time, so memory stays
    ``[B, V]``; finite inputs (the usual case) skip the ``-inf`` bookkeeping of ``mix_log_probs``.
    """
    if alphas.numel() == 0:
        raise ValueError("the alpha grid is empty")
    full = full.float()
    short = short.float()
    finite = bool(torch.isfinite(full).all()) and bool(torch.isfinite(short).all())
    tgt = targets.to(full.device).view(-1, 1)
    out: dict[str, list[torch.Tensor]] = {"correct": [], "log_prob": [], "rank": []}
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
    ll_full: torch.Tensor,
    ll_short: torch.Tensor,
    alphas: torch.Tensor | float,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """``log f(a | full) + alpha · log f(a | premise-free)`` (paper eq. 2), float64.

    ``ll_full``/``ll_short`` are ``[N, C]`` sums over each answer's tokens; missing choices (ragged choice
    counts) are ``-inf`` in ``ll_full`` and stay ``-inf``. ``lengths`` (answer lengths in characters) divides
    the score, as the reference's length normalisation does. ``alphas`` is one alpha (``[N, C]`` out), a grid
    ``[A]`` (``[A, N, C]`` out) or each question's own alpha ``[N, 1]`` (a label-free rule's; ``[N, C]`` out).
    """
    full = ll_full.double()
    missing = torch.isneginf(full)
    short = ll_short.double()
    short = torch.where(missing | ~torch.isfinite(short), torch.zeros_like(short), short)
    alpha_t = torch.as_tensor(alphas, dtype=torch.float64, device=ll_full.device)
    if alpha_t.dim() == 1:  # a grid
        alpha_t = alpha_t.view(-1, 1, 1)
    scores = full + alpha_t * short
    if lengths is not None:
        scores = scores / lengths.double().clamp_min(1)
    return torch.where(missing, torch.full_like(scores, -math.inf), scores)


def choice_predictions(
    ll_full: torch.Tensor,
    ll_short: torch.Tensor,
    alphas: torch.Tensor | float,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Predicted choice index for every alpha: ``[A, N]`` (``[N]`` for a scalar alpha); ties go to the
    first choice, like ``np.argmax`` in the reference."""
    return choice_scores(ll_full, ll_short, alphas, lengths).argmax(dim=-1)


def choice_accuracy_curve(
    ll_full: torch.Tensor,
    ll_short: torch.Tensor,
    labels: torch.Tensor,
    alphas: torch.Tensor,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Accuracy at every alpha of the grid ``[A]`` (float64), from one pass of cached log-likelihoods."""
    if alphas.numel() == 0:
        raise ValueError("the alpha grid is empty")
    if labels.numel() == 0:
        raise ValueError("no examples to score")
    preds = choice_predictions(ll_full, ll_short, alphas.reshape(-1), lengths)
    return (preds == labels.view(1, -1).to(preds.device)).double().mean(dim=1)


def choice_accuracy(
    ll_full: torch.Tensor,
    ll_short: torch.Tensor,
    labels: torch.Tensor,
    alpha: float,
    lengths: torch.Tensor | None = None,
) -> float:
    """Accuracy at one alpha (e.g. 0 for ``f_max``, -1 for PMI), whether or not it is on the grid."""
    return float(choice_accuracy_curve(ll_full, ll_short, labels, torch.tensor([alpha]), lengths)[0])


def binomial_stderr(accuracy: float, n: int) -> float:
    """Standard error of an accuracy over ``n`` independent examples: ``sqrt(p (1 - p) / n)``."""
    if n <= 0:
        return float("nan")
    return math.sqrt(max(accuracy * (1.0 - accuracy), 0.0) / n)


@dataclass(frozen=True)
class AlphaGrid:
    """An inclusive grid ``start, start ± step, …, stop`` of boosting coefficients.

    The default is the multiple-choice grid of docs/design.md, "Mathematics" (2 down to -5 by 0.01, since Table 4 has
    alpha* down to -4.19). Grid order matters: ties for alpha* go to the first value.
    """

    start: float = 2.0
    stop: float = -5.0
    step: float = 0.01

    def values(self) -> list[float]:
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
