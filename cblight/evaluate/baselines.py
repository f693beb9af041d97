"""The paper's comparison methods (Tables 5, 11, 12) as pure tensor maths.

The paper compares coherence boosting with three other inference-time methods; each is a different function
of answer likelihoods that one model computes, so, like ``cblight.boosting``, this module only turns cached
log-likelihoods into scores and predictions (no Lightning, no Hub; unit-tested against hand-computed
numbers). Which strings go into the model for each method is the data layer's business
(``cblight.evaluate.method_prompts``).

* **Domain-conditional PMI** (Holtzman et al. 2021, "Surface form competition", eq. 3; Tables 11/12 "PMI"):

      score(a) = log P(a | x) − log P(a | x_domain)

  where ``x_domain`` is a short, task-level *domain premise* (e.g. ``" the answer is:"``). With an empty
  premise (BOS/EOS alone) it is lm-evaluation-harness's ``acc_mutual_info``. ``pmi_scores``.

* **Contextual calibration** (Zhao et al. 2021, "Calibrate before use", §5 eq. in "Contextual
  calibration"; Tables 11/12 "CC" and Table 5): for a fixed label set, the label distribution after a
  *content-free* input (``"N/A"``, ``""``, ``"[MASK]"`` in the task's prompt) is averaged over those inputs,

      p_cf = normalise( mean_i P(y | prompt(cf_i)) ),

  and the prediction is ``argmax_y (W p̂(y | x) + b)`` with ``W = diag(p_cf)^-1`` and ``b = 0``, where
  ``p̂(y | x)`` is the label distribution normalised over the labels. Dividing by ``p_cf`` is a subtraction
  in log space, so ``calibrated_scores`` returns ``log p̂(y | x) − log p_cf(y)`` (same argmax).
  ``calibration_prior``. For LAMA (Table 5) Zhao et al.'s code (``run_lama.py``) calibrates the first
  answer token over the model's top-``N`` candidates (``N = 100``, the API limit) with ``W = I`` and
  ``b = −p_cf``, ``p_cf`` being the *minimum* over the content-free inputs ``"[MASK]"``, ``"N/A"``,
  ``"BLANK"`` and both distributions renormalised over the candidates: ``calibrated_next_token``.

* **Noisy channel** (Min et al. 2022, "Noisy channel language model prompting", §3 eq. 2; Table 12
  "Channel"): ``argmax_y P(x | v(y))``, the probability of the *input* after the verbalised label ``v(y)``
  as a prefix. The scores are the cached ``log P(x | v(y))`` themselves; nothing to compute here beyond the
  argmax (``predictions``).
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "calibrated_next_token",
    "calibrated_scores",
    "calibration_prior",
    "pmi_scores",
    "predictions",
]


def _missing(ll: torch.Tensor) -> torch.Tensor:
    return torch.isneginf(ll)


def pmi_scores(ll_full: torch.Tensor, ll_premise: torch.Tensor) -> torch.Tensor:
    """``log P(a | x) − log P(a | premise)`` (Holtzman et al. 2021 eq. 3), ``[N, C]`` float64.

    Missing choices (ragged choice counts, ``−inf`` in ``ll_full``) stay ``−inf``.
    """
    full = ll_full.double()
    premise = torch.where(_missing(full), torch.zeros_like(full), ll_premise.double())
    return torch.where(_missing(full), full, full - premise)


def calibration_prior(ll_content_free: torch.Tensor, reduce: str = "mean") -> torch.Tensor:
    """``p_cf`` of Zhao et al. 2021 from the label log-likelihoods after each content-free input.

    ``ll_content_free`` is ``[P, C]``: ``log P(y | prompt(cf_i))`` for ``P`` content-free inputs and ``C``
    labels. The probabilities are averaged over the inputs (``reduce="mean"``, ``run_classification.py``'s
    ``get_p_content_free``) or their element-wise minimum is taken (``reduce="min"``, ``run_lama.py``),
    then normalised over the labels, as the reference does. Returns ``[C]`` float64 probabilities summing
    to 1. The maximum is subtracted before exponentiating (a common factor, so the normalised result is
    unchanged) so that long answers' tiny probabilities do not underflow.
    """
    if ll_content_free.dim() != 2 or ll_content_free.shape[0] == 0:
        raise ValueError(
            f"content-free log-likelihoods must be [inputs, labels], got {tuple(ll_content_free.shape)}"
        )
    ll = ll_content_free.double()
    rows = torch.exp(ll - ll.max())
    if reduce == "mean":
        prior = rows.mean(dim=0)
    elif reduce == "min":
        prior = rows.min(dim=0).values
    else:
        raise ValueError(f"reduce must be 'mean' or 'min', got {reduce!r}")
    return prior / prior.sum()


def calibrated_scores(ll_full: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """``log p̂(y | x) − log p_cf(y)``: the log of Zhao et al.'s ``W p̂`` with ``W = diag(p_cf)^-1``.

    ``ll_full`` is ``[N, C]`` (``log P(y | x)`` per label), ``prior`` is ``[C]`` from ``calibration_prior``.
    ``p̂`` is ``ll_full`` normalised over the labels (``label_probs / np.sum(label_probs)`` in the
    reference); the argmax equals the reference's ``argmax(W p̂ + b)`` with ``b = 0``. ``[N, C]`` float64.
    """
    full = ll_full.double()
    if full.shape[-1] != prior.numel():
        raise ValueError(f"{full.shape[-1]} labels but a prior over {prior.numel()}")
    return torch.log_softmax(full, dim=-1) - torch.log(prior.double()).view(1, -1)


def predictions(scores: torch.Tensor) -> torch.Tensor:
    """The best choice of each row, ties to the first (the reference's ``np.argmax``): ``[N]``."""
    best = scores.max(dim=-1, keepdim=True).values
    hit = scores == best
    return torch.where(hit, torch.arange(scores.shape[-1]).view(1, -1), scores.shape[-1]).min(dim=-1).values


def calibrated_next_token(
    full: torch.Tensor, content_free: torch.Tensor, top_n: int = 100, reduce: str = "min"
) -> torch.Tensor:
    """Zhao et al. 2021's calibrated first-token prediction for LAMA (``run_lama.py``), ``[B]`` token ids.

    ``full`` is ``[B, V]`` log-probs after each example's prompt; ``content_free`` is ``[B, P, V]`` (or
    ``[P, V]``, shared) log-probs after the same prompt with the subject replaced by each content-free
    input. The candidates are each example's ``top_n`` tokens under ``full`` (``top_n = 0``: the whole
    vocabulary); over them ``p`` (the example) and ``p_cf`` (``reduce`` over the inputs: the reference's
    minimum) are renormalised, and the prediction is ``argmax(p − p_cf)``, i.e. ``W = I, b = −p_cf``.
    """
    if full.dim() != 2:
        raise ValueError(f"full must be [batch, vocab], got {tuple(full.shape)}")
    cf = content_free if content_free.dim() == 3 else content_free.unsqueeze(0).expand(full.shape[0], -1, -1)
    vocab = full.shape[-1]
    n = vocab if top_n <= 0 else min(top_n, vocab)
    cand = full.topk(n, dim=-1).indices  # [B, n], best first
    p = torch.softmax(full.double(), dim=-1).gather(1, cand)
    p = p / p.sum(dim=-1, keepdim=True)
    q_all = torch.softmax(cf.double(), dim=-1)  # [B, P, V]
    q_each = q_all.gather(2, cand.unsqueeze(1).expand(-1, q_all.shape[1], -1))
    q = q_each.min(dim=1).values if reduce == "min" else q_each.mean(dim=1)
    q = q / q.sum(dim=-1, keepdim=True).clamp_min(math.ulp(0.0))
    best = predictions(p - q)
    return cand.gather(1, best.view(-1, 1)).squeeze(1)
