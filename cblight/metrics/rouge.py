"""ROUGE-1/2/L F-measures for summarisation (paper appendix "GPT-2 summarization experiments").

Per-example F-measures come from Google's ``rouge-score`` package; the corpus value is their mean (a
fraction; the paper prints 100x). ``rougeLsum`` is refused: it splits sentences with nltk's punkt model,
a download. ``rougeL`` here is sentence-level LCS, so it can differ from the summary-level ROUGE-L of the
ROUGE-1.5.5 perl script behind the paper's numbers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from cblight.metrics.ragged import PaperMetric, score_once

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


class ROUGE(PaperMetric):
    """Mean ROUGE F-measure per type (the summarisation appendix); ``compute()`` gives
    ``{"rouge1": ..., "rouge2": ..., "rougeL": ...}`` as fractions.

    ``update(predictions, references)`` takes one reference string per prediction, or a list of them (then
    ``rouge-score``'s ``score_multi`` takes the best reference per type).

    Args:
        rouge_types: ``rouge1`` .. ``rouge9`` and ``rougeL`` (``rougeLsum`` needs a download and is refused).
        use_stemmer: apply the Porter stemmer before matching.
        **kwargs: torchmetrics' ``Metric`` options.

    Raises:
        ValueError: for ``rougeLsum`` or an unknown type.

    Examples:
        >>> metric = ROUGE()
        >>> metric.update(["the cat sat on the mat"], ["a cat sat on a mat"])
        >>> {name: round(float(value), 4) for name, value in metric.compute().items()}
        {'rouge1': 0.6667, 'rouge2': 0.4, 'rougeL': 0.6667}
    """

    higher_is_better = True

    def __init__(self, rouge_types: Sequence[str] = ROUGE_TYPES, use_stemmer: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        from rouge_score import rouge_scorer

        self.rouge_types = list(rouge_types)
        if "rougeLsum" in self.rouge_types:
            raise ValueError("rougeLsum needs nltk's punkt sentence splitter (a download); use rougeL")
        for t in self.rouge_types:  # the types rouge-score computes
            if not re.fullmatch("rouge[1-9L]", t):
                raise ValueError(f"unknown ROUGE type {t!r}; use rouge1 .. rouge9 or rougeL")
        self.scorer = rouge_scorer.RougeScorer(self.rouge_types, use_stemmer=use_stemmer)
        self.add_sums("fmeasure", size=len(self.rouge_types), dtype=torch.float64)
        self.add_sums("count")

    def update(self, predictions: Sequence[str], references: Sequence[str | Sequence[str]]) -> None:
        if isinstance(predictions, str) or isinstance(references, str):
            raise TypeError("predictions and references must be lists (one entry per example), not strings")
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
        for i, (pred, ref) in enumerate(zip(predictions, references)):
            refs = [ref] if isinstance(ref, str) else list(ref)
            if not refs:
                raise ValueError(f"references[{i}] is empty: every prediction needs a reference")
            scores = self.scorer.score_multi(refs, pred)  # of one reference: its scores
            self.fmeasure += torch.tensor(
                [scores[t].fmeasure for t in self.rouge_types], dtype=torch.float64, device=self.device
            )
            self.count += 1

    def compute(self) -> dict[str, torch.Tensor]:
        if int(self.count) == 0:
            raise ValueError("ROUGE of an empty corpus: no predictions were given")
        mean = self.fmeasure / self.count
        return {t: mean[i] for i, t in enumerate(self.rouge_types)}


def rouge(
    predictions: Sequence[str],
    references: Sequence[str | Sequence[str]],
    rouge_types: Sequence[str] = ROUGE_TYPES,
    use_stemmer: bool = True,
) -> dict[str, float]:
    """``ROUGE`` F-measures of predictions against their references (the summarisation appendix's ROUGE-1/2/L).

    Args:
        predictions: the generated summaries.
        references: one reference string per prediction, or a list of references each.
        rouge_types: the ROUGE types (see ``ROUGE``).
        use_stemmer: apply the Porter stemmer before matching.

    Returns:
        ``{type: F-measure}``, fractions.

    Examples:
        >>> scores = rouge(["the cat sat on the mat"], ["a cat sat on a mat"])
        >>> {name: round(value, 4) for name, value in scores.items()}
        {'rouge1': 0.6667, 'rouge2': 0.4, 'rougeL': 0.6667}
    """
    return score_once(ROUGE(rouge_types, use_stemmer), predictions, references)
