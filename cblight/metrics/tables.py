"""The paper's metric sets in the paper's units: streaming suites and their one-call functional forms.

* Table 2 (WebText completions), ``TextSuite`` / ``generation_table``: ``ppl`` (raw), ``self_bleu4`` (a
  fraction, as the paper's "BLEU-4" column), ``zipf`` (raw), ``rep``, ``lr_50``, ``lr_100``, ``delta``,
  ``ltf`` (percent).
* Table 3 (DSTC7), ``DialogSuite`` / ``dialog_table`` / ``format_dialog_table``, the official DSTC7
  evaluation: ``nist2``, ``nist4`` (raw) and ``bleu2``, ``bleu4`` (percent) as ``mteval-v14c.pl``;
  ``meteor`` (percent) by the METEOR 1.5 jar, or ``meteor_nltk`` (nltk's mean sentence METEOR, with
  ``meteor_synonyms``: whether WordNet synonyms were matched) where the jar cannot run or is not asked
  for; ``ent4`` (nats), ``dist1``, ``dist2`` (percent), ``avg_len`` (words).
* Summarisation appendix, ``SummarySuite`` / ``summary_table``: ``rouge1``, ``rouge2``, ``rougeL`` (percent).

A suite is a torchmetrics ``MetricCollection`` (states synced across processes at ``compute``); the metric
classes themselves return fractions, and only the suites scale to the paper's units.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torchmetrics import Metric, MetricCollection

from cblight.metrics.coherence import ContextSensitivity, generated_token_log_probs
from cblight.metrics.dialog import CorpusBLEU, CorpusNIST, NGramDiversity, Normalize, ResponseLength
from cblight.metrics.dialog_meteor import Meteor, MeteorRoute, NltkMeteor, resolve_meteor_route
from cblight.metrics.rouge import ROUGE
from cblight.metrics.text_stats import (
    LongRangeRepetition,
    RepetitionRate,
    SelfBLEU,
    TokenDocs,
    ZipfCoefficient,
    as_token_lists,
)
from cblight.option_types import check_arguments
from cblight.results import format_table

# the paper's Table 3 headers; "meteor_nltk" replaces "meteor" where nltk's METEOR was computed
DIALOG_TITLES = {
    "nist2": "N-2",
    "nist4": "N-4",
    "bleu2": "B-2",
    "bleu4": "B-4",
    "meteor": "METEOR",
    "meteor_nltk": "METEOR (nltk)",
    "ent4": "Ent-4",
    "dist1": "Dist-1",
    "dist2": "Dist-2",
    "avg_len": "avg len",
}


class _Suite(MetricCollection):
    """Metrics computed together (a ``MetricCollection``: each metric's states synced at ``compute``, its
    values under their own keys, or the collection's key for a single value), reported as ``columns`` in
    the paper's units (``percent``: the columns the paper prints in percent, of which the metric classes
    give fractions)."""

    columns: tuple[str, ...] = ()
    percent: frozenset[str] = frozenset()

    def __init__(self, metrics: dict[str, Metric]):
        super().__init__(metrics, compute_groups=False)

    def report(self, values: Mapping[str, Any]) -> dict[str, float | None]:
        """``values`` in the paper's units: percent for ``percent``, else raw; ``None`` (printed
        "-") for a statistic undefined on this data, e.g. self-BLEU of one generation."""
        out = {c: float(values[c]) * (100 if c in self.percent else 1) for c in self.columns}
        return {c: None if math.isnan(v) else v for c, v in out.items()}

    def compute(self) -> dict[str, Any]:
        return self.report(super().compute())

    def score(self, *inputs: Any) -> dict[str, Any]:
        """The columns of one set of inputs in memory (the tables' functional forms)."""
        self.update(*inputs)
        return self.compute()


class TextSuite(_Suite):
    """Table 2's columns, accumulated batch by batch.

    ``update(generations, full_log_probs, short_log_probs, ids)``: the generated token ids, their
    ``log p_full`` / ``log p_short`` under the base LM (``generated_token_log_probs``), and document ids
    (they fix the self-BLEU sample's order under DDP).
    """

    columns = ("ppl", "self_bleu4", "zipf", "rep", "lr_50", "lr_100", "delta", "ltf")
    percent = frozenset({"rep", "lr_50", "lr_100", "delta", "ltf"})

    def __init__(self, eos_token_id: int | None = None, self_bleu_samples: int | None = 1000, seed: int = 0):
        super().__init__(
            {
                "lr": LongRangeRepetition((50, 100)),
                "zipf": ZipfCoefficient(),
                "rep": RepetitionRate(eos_token_id=eos_token_id),
                "self_bleu4": SelfBLEU(4, self_bleu_samples, seed),
                "sensitivity": ContextSensitivity(),
            }
        )

    def update(
        self,
        generations: TokenDocs,
        full_log_probs: Sequence[torch.Tensor],
        short_log_probs: Sequence[torch.Tensor],
        ids: Sequence[int] | None = None,
    ) -> None:
        # each metric takes the inputs its update names
        docs = as_token_lists(generations, "generations")
        super().update(
            documents=docs, ids=ids, full_log_probs=full_log_probs, short_log_probs=short_log_probs
        )


class DialogSuite(_Suite):
    """Table 3's columns, accumulated batch by batch: ``update(hypotheses, references)``.

    ``meteor``: ``"official"`` (the METEOR 1.5 jar; a ``ConfigError`` naming what to install where it
    cannot run), ``"nltk"``, or ``"auto"`` (official where Java and the jar are there). ``columns`` then
    holds ``meteor`` or ``meteor_nltk``. ``use_synonyms`` is nltk's (``NltkMeteor``); ``n_refs`` cuts or
    cycles the references as ``dstc.py --n_refs`` (``None``: as given, cycled to the largest count for
    NIST).
    """

    percent = frozenset({"bleu2", "bleu4", "meteor", "meteor_nltk", "dist1", "dist2"})

    def __init__(
        self,
        normalize: Normalize = "dstc",
        meteor: MeteorRoute = "auto",
        use_synonyms: bool | None = None,
        n_refs: int | None = None,
    ):
        check_arguments(DialogSuite.__init__, locals())
        official = resolve_meteor_route(meteor) == "official"
        super().__init__(
            {
                "nist": CorpusNIST((2, 4), normalize, n_refs),
                "bleu": CorpusBLEU((2, 4), normalize, n_refs),
                "meteor": Meteor(normalize, n_refs) if official else NltkMeteor(normalize, use_synonyms),
                "diversity": NGramDiversity((1, 2), (4,), normalize),
                "avg_len": ResponseLength(normalize),
            }
        )
        self.columns = tuple(c for c in DIALOG_TITLES if c != ("meteor_nltk" if official else "meteor"))

    def update(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        super().update(hypotheses=hypotheses, references=references)

    def report(self, values: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = super().report(values)
        if "meteor_synonyms" in values:
            out["meteor_synonyms"] = bool(values["meteor_synonyms"])
        return out


class SummarySuite(_Suite):
    """The summarisation table's ROUGE-1/2/L F-measures: ``update(predictions, references)``."""

    columns = ("rouge1", "rouge2", "rougeL")
    percent = frozenset(columns)

    def __init__(self, use_stemmer: bool = True):
        super().__init__({"rouge": ROUGE(use_stemmer=use_stemmer)})


def generation_table(
    model: Any,
    contexts: TokenDocs,
    generations: TokenDocs,
    *,
    eos_token_id: int | None = None,
    self_bleu_samples: int | None = 1000,
    seed: int = 0,
    **options: Any,
) -> dict[str, float]:
    """Table 2's columns for one set of completions (or the human continuations) under ``model``.

    Args:
        model: the base LM the likelihood columns (``ppl``, ``delta``, ``ltf``) are read from.
        contexts: prompt ids as the model read them (special prefix included).
        generations: the continuation ids.
        eos_token_id: dropped from a generation's end before the repetition test (GPT-2: 50256).
        self_bleu_samples: how many documents self-BLEU scores (``None``: all).
        seed: the seed of self-BLEU's sample.
        **options: the keywords of ``generated_token_log_probs`` (``k``, ``prefix``, ``batch_size``, ...).

    Returns:
        ``{"ppl", "self_bleu4", "zipf", "rep", "lr_50", "lr_100", "delta", "ltf"}`` in the paper's units
        (``rep``, ``lr_*``, ``delta``, ``ltf`` in percent).
    """
    scored = generated_token_log_probs(model, contexts, generations, **options)
    suite = TextSuite(eos_token_id=eos_token_id, self_bleu_samples=self_bleu_samples, seed=seed)
    return suite.score(generations, [f for f, _ in scored], [s for _, s in scored])


def dialog_table(
    hypotheses: Sequence[str], references: Sequence[Sequence[str]], **options: Any
) -> dict[str, Any]:
    """Table 3's columns for one set of responses against their reference lists.

    Args:
        hypotheses: the responses.
        references: per response, a non-empty list of reference strings.
        **options: the keywords of ``DialogSuite`` (``normalize``, ``meteor``, ``use_synonyms``, ``n_refs``).

    Returns:
        ``{"nist2", "nist4", "bleu2", "bleu4", "meteor" or "meteor_nltk", "ent4", "dist1", "dist2",
        "avg_len"}`` in the paper's units, and ``meteor_synonyms`` with nltk's METEOR.

    Examples:
        >>> row = dialog_table(["i am fine , thanks .", "no idea what you mean"],
        ...                    [["i'm fine, thank you."], ["what do you mean?", "no idea."]],
        ...                    meteor="nltk", use_synonyms=False)
        >>> print(format_dialog_table({"greedy": row}))
        Inference method  N-2   N-4   B-2    B-4    METEOR (nltk)  Ent-4  Dist-1  Dist-2  avg len
        ----------------  ----  ----  -----  -----  -------------  -----  ------  ------  -------
        greedy            3.26  3.26  47.69  16.13  61.62          1.61   100.00  100.00  5.50
    """
    return DialogSuite(**options).score(hypotheses, references)


def format_dialog_table(rows: Mapping[str, Mapping[str, Any]]) -> str:
    """Rows of ``dialog_table`` values in the paper's Table 3 layout: N-2, N-4, B-2, B-4, METEOR, Ent-4,
    Dist-1, Dist-2, avg len, two decimals.

    Args:
        rows: each decoding's ``dialog_table`` values by its name, e.g. ``{"greedy": ..., "Human": ...}``.

    Returns:
        The table as fixed-width text.

    Raises:
        ValueError: for no rows, or rows with different columns.
    """
    if not rows:
        raise ValueError("format_dialog_table needs at least one row")
    columns = [c for c in DIALOG_TITLES if c in next(iter(rows.values()))]
    for name, row in rows.items():
        if [c for c in DIALOG_TITLES if c in row] != columns:
            raise ValueError(f"row {name!r} has other columns than the first row: {sorted(row)}")
    return format_table(
        ["Inference method", *(DIALOG_TITLES[c] for c in columns)],
        [[name, *(row[c] for c in columns)] for name, row in rows.items()],
    )


def summary_table(
    predictions: Sequence[str], references: Sequence[str | Sequence[str]], *, use_stemmer: bool = True
) -> dict[str, float]:
    """The summarisation table's ROUGE-1/2/L F-measures in percent (the summarisation appendix).

    Args:
        predictions: the generated summaries.
        references: one reference string per summary, or a list of references each.
        use_stemmer: apply the Porter stemmer before matching.

    Returns:
        ``{"rouge1", "rouge2", "rougeL"}`` in percent.

    Examples:
        >>> scores = summary_table(["the cat sat on the mat"], ["a cat sat on a mat"])
        >>> {name: round(value, 2) for name, value in scores.items()}
        {'rouge1': 66.67, 'rouge2': 40.0, 'rougeL': 66.67}
    """
    return SummarySuite(use_stemmer).score(predictions, references)
