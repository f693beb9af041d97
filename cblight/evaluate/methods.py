"""The comparison methods of paper Tables 5, 11 and 12: which a run reports, their options, where they apply,
and their maths.

``boost`` is coherence boosting (paper eq. 2 / §3), always computed: its alpha = 0 column is ``f_max`` and
its alpha* column is the tables' "Ours". The others are

* ``pmi_dc``: domain-conditional PMI with the task's domain premise (Holtzman et al. 2021);
* ``pmi_empty``: the same with an empty premise (BOS/EOS alone): lm-evaluation-harness's ``acc_mutual_info``;
* ``calibrate``: contextual calibration (Zhao et al. 2021), for tasks with one fixed label set and for LAMA;
* ``channel``: the noisy channel (Min et al. 2022), for SST-2, SST-5, AGNews and TREC.

A method that does not apply to a task (contextual calibration on CommonsenseQA, whose answers change with
every question) is reported as not applicable with the reason, the "-" of the paper's tables, never as a
number. The strings each method feeds the model are ``cblight.evaluate.method_prompts``. The maths turns
cached log-likelihoods into scores and predictions (no model, no Lightning; unit-tested against
hand-computed numbers):

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from cblight.data.datamodule import TaskSplit
from cblight.data.examples import ChoiceExample, NextTokenExample
from cblight.errors import ConfigError
from cblight.evaluate.method_prompts import method_prompts
from cblight.option_types import NonNegativeInt, check_fields

MethodName = Literal["boost", "pmi_dc", "pmi_empty", "calibrate", "channel"]
# Zhao et al. 2021's content-free inputs: run_classification.py (averaged) and run_lama.py (minimum)
CHOICE_CONTENT_FREE = ("N/A", "", "[MASK]")
LAMA_CONTENT_FREE = ("[MASK]", "N/A", "BLANK")


@dataclass
class MethodOptions:
    """Options of the comparison methods.

    Args:
        domain_premises: per-task PMI_DC premises replacing the defaults (``{csqa: " the answer is:"}``).
        content_free_inputs: contextual calibration's content-free inputs; default Zhao et al.'s:
            ``["N/A", "", "[MASK]"]`` (averaged) for classification, ``["[MASK]", "N/A", "BLANK"]``
            (minimum) for LAMA.
        calibrate_top_n: LAMA's calibration candidates: each example's top-N first tokens (Zhao et al.'s
            API limit, 100); 0 calibrates over the whole vocabulary.
        channel_template: which of Min et al.'s four verbalisation templates the channel method uses (0-3).
    """

    domain_premises: dict[str, str] | None = None
    content_free_inputs: list[str] | None = None
    calibrate_top_n: NonNegativeInt = 100
    channel_template: Literal[0, 1, 2, 3] = 0

    def __post_init__(self) -> None:
        check_fields(self, ConfigError)
        if self.content_free_inputs is not None and not self.content_free_inputs:
            raise ConfigError("method_options.content_free_inputs is empty")

    def content_free(self, kind: str) -> list[str]:
        if self.content_free_inputs is not None:
            return list(self.content_free_inputs)
        return list(LAMA_CONTENT_FREE if kind == "next_token" else CHOICE_CONTENT_FREE)


def fixed_labels(split: TaskSplit) -> tuple[str, ...] | None:
    """The one answer set every example of ``split`` shares, or ``None`` when answers vary."""
    choices = {ex.choices for ex in split.examples if isinstance(ex, ChoiceExample)}
    return next(iter(choices)) if len(choices) == 1 else None


def not_applicable(method: str, split: TaskSplit) -> str | None:
    """Why ``method`` cannot score ``split`` (``None`` when it can)."""
    task, kind = split.task.name, split.task.kind
    if kind == "next_token":
        if method == "calibrate" and all(
            isinstance(ex, NextTokenExample) and ex.template for ex in split.examples
        ):
            return None
        return f"{method} is defined for multiple-choice tasks" + (
            " (and contextual calibration for LAMA)" if method == "calibrate" else ""
        )
    prompts = method_prompts().get(task)
    if method in ("pmi_dc", "pmi_empty"):
        return None
    if method == "calibrate":
        if prompts is None or prompts.content_free is None:
            return "contextual calibration needs one fixed label set and a content-free form of the prompt"
        return "the examples do not share one label set" if fixed_labels(split) is None else None
    if prompts is None or not prompts.channel_templates:  # channel
        return "Min et al. define channel verbalisers for SST-2, SST-5, AGNews and TREC only"
    return None


PREMISE_METHODS = ("pmi_dc", "pmi_empty")
METHOD_FIELDS = {
    "pmi_dc": "ll_domain",
    "pmi_empty": "ll_empty",
    "calibrate": "ll_cf",
    "channel": "ll_channel",
}


def method_scores(methods: Sequence[str], record: dict[str, Any]) -> dict[str, list[float]]:
    """Each comparison method's per-choice scores from one multiple-choice cache record."""
    full = torch.tensor(record["ll_full"], dtype=torch.float64).view(1, -1)
    out: dict[str, list[float]] = {}
    for m in methods:
        if m == "calibrate":
            prior = calibration_prior(torch.tensor(record["ll_cf"], dtype=torch.float64), "mean")
            out[m] = calibrated_scores(full, prior)[0].tolist()
        elif m == "channel":
            out[m] = list(record["ll_channel"])
        else:
            premise = torch.tensor(record[METHOD_FIELDS[m]], dtype=torch.float64).view(1, -1)
            out[m] = pmi_scores(full, premise)[0].tolist()
    return out


# ---------------------------------------------------------------------------------------------------------
# The maths


def pmi_scores(ll_full: torch.Tensor, ll_premise: torch.Tensor) -> torch.Tensor:
    """``log P(a | x) − log P(a | premise)`` (Holtzman et al. 2021 eq. 3), ``[N, C]`` float64.

    Missing choices (ragged choice counts, ``−inf`` in ``ll_full``) stay ``−inf``.
    """
    full = ll_full.double()
    return full - torch.where(torch.isneginf(full), 0.0, ll_premise.double())  # -inf - 0 stays -inf


def calibration_prior(ll_content_free: torch.Tensor, reduce: Literal["mean", "min"] = "mean") -> torch.Tensor:
    """``p_cf`` of Zhao et al. 2021 from the label log-likelihoods after each content-free input.

    ``ll_content_free`` is ``[P, C]``: ``log P(y | prompt(cf_i))`` for ``P`` content-free inputs and ``C``
    labels. The probabilities are averaged over the inputs (``reduce="mean"``, ``run_classification.py``'s
    ``get_p_content_free``) or their element-wise minimum is taken (``reduce="min"``, ``run_lama.py``),
    then normalised over the labels, as the reference does. Returns ``[C]`` float64 probabilities summing
    to 1. The maximum is subtracted before exponentiating (a common factor, so the normalised result is
    unchanged) so that long answers' tiny probabilities do not underflow.
    """
    ll = ll_content_free.double()
    rows = torch.exp(ll - ll.max())
    prior = rows.mean(dim=0) if reduce == "mean" else rows.min(dim=0).values
    return prior / prior.sum()


def calibrated_scores(ll_full: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """``log p̂(y | x) − log p_cf(y)``: the log of Zhao et al.'s ``W p̂`` with ``W = diag(p_cf)^-1``.

    ``ll_full`` is ``[N, C]`` (``log P(y | x)`` per label), ``prior`` is ``[C]`` from ``calibration_prior``.
    ``p̂`` is ``ll_full`` normalised over the labels (``label_probs / np.sum(label_probs)`` in the
    reference); the argmax equals the reference's ``argmax(W p̂ + b)`` with ``b = 0``. ``[N, C]`` float64.
    """
    return torch.log_softmax(ll_full.double(), dim=-1) - torch.log(prior.double()).view(1, -1)


def predictions(scores: torch.Tensor) -> torch.Tensor:
    """The best choice of each row, ties to the first (the reference's ``np.argmax``): ``[N]``."""
    return scores.argmax(dim=-1)  # torch.argmax returns the first of equal maxima


def calibrated_next_token(
    full: torch.Tensor, content_free: torch.Tensor, top_n: int = 100, reduce: Literal["min", "mean"] = "min"
) -> torch.Tensor:
    """Zhao et al. 2021's calibrated first-token prediction for LAMA (``run_lama.py``), ``[B]`` token ids.

    ``full`` is ``[B, V]`` log-probs after each example's prompt; ``content_free`` is ``[B, P, V]`` (or
    ``[P, V]``, shared) log-probs after the same prompt with the subject replaced by each content-free
    input. The candidates are each example's ``top_n`` tokens under ``full`` (``top_n = 0``: the whole
    vocabulary); over them ``p`` (the example) and ``p_cf`` (``reduce`` over the inputs: the reference's
    minimum) are renormalised, and the prediction is ``argmax(p − p_cf)``, i.e. ``W = I, b = −p_cf``.
    """
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
