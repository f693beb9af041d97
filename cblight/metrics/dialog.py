"""Dialog response metrics of the official DSTC7 evaluation (paper §4.2, Table 3; docs/design.md, "Metrics").

Inputs: hypothesis strings and, per example, a non-empty list of reference strings, normalised as
``cblight.metrics.dialog_text`` says (``normalize="dstc"``: DialoGPT's ``clean_str``, as ``dstc.py
--clean``).

* ``CorpusBLEU``, ``CorpusNIST``: cumulative BLEU-n / NIST-n as NIST's ``mteval-v14c.pl`` computes them
  (``cblight.metrics.mteval``: its tokenisation, information weights, brevity penalty and smoothing,
  multi-reference, corpus level), the numbers of the paper's Table 3.
* ``NltkCorpusBLEU``, ``NltkCorpusNIST``: nltk's ``corpus_bleu`` / ``corpus_nist`` on the normalised
  words (no smoothing; NIST against each example's best single reference), for comparison only: on real
  DSTC7 responses they are up to 3.5 NIST points off the official values.
* METEOR lives in ``cblight.metrics.dialog_meteor`` (the METEOR 1.5 jar, and nltk's variant).
* ``NGramDiversity``: Distinct-n (unique / all n-grams over the corpus) and Entropy-n (natural log), as
  DialoGPT's ``calc_diversity`` / ``calc_entropy``.
* ``ResponseLength``: mean hypothesis length in words.

Values are fractions in [0, 1] for BLEU and Distinct (the paper prints percent); NIST and entropy are raw,
length is in words.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torchmetrics import Metric

from cblight.metrics.dialog_text import (
    DialogCorpus,
    Normalize,
    as_floats,
    check_hypotheses,
    check_n_refs,
    check_nonempty,
    check_normalize,
    cycle_references,
    dialog_words,
    score_once,
)
from cblight.metrics.mteval import bleu_from_counts, bleu_segment_stats, mteval_nist, mteval_words
from cblight.metrics.ngrams import (
    bleu_from_stats,
    bleu_sentence_stats,
    check_order,
    corpus_nist,
    distinct_and_entropy,
)
from cblight.metrics.ragged import RaggedMetric


def _orders(orders: Sequence[int]) -> list[int]:
    orders = [check_order(n, "n-gram order") for n in orders]
    if not orders:
        raise ValueError("give at least one n-gram order")
    return orders


# ---------------------------------------------------------------------------------------------------------
# BLEU and NIST as mteval-v14c.pl (the official DSTC7 evaluation)


class CorpusBLEU(Metric):
    """Cumulative BLEU-n of ``mteval-v14c.pl`` for each ``n`` in ``orders`` (keys ``bleu<n>``), from summed
    per-segment statistics (matches and hypothesis n-grams per order, closest reference length).

    ``n_refs``: cut or cycle each example's references to this many, as ``dstc.py --n_refs`` (``None``:
    as given; cycling alone never changes BLEU).
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(
        self,
        orders: Sequence[int] = (2, 4),
        normalize: Normalize = "dstc",
        n_refs: int | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.orders = _orders(orders)
        self.normalize = check_normalize(normalize)
        self.n_refs = check_n_refs(n_refs)
        width = max(self.orders)
        self.add_state("matches", default=torch.zeros(width, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("totals", default=torch.zeros(width, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("ref_len", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        hyps, refs = dialog_words(hypotheses, references, self.normalize)
        if self.n_refs is not None:
            refs = cycle_references(refs, self.n_refs)
        width = max(self.orders)
        matches, totals, ref_len = [0] * width, [0] * width, 0
        for hyp, ref_list in zip(hyps, refs):
            m, t, r = bleu_segment_stats(
                mteval_words(" ".join(hyp)), [mteval_words(" ".join(x)) for x in ref_list], width
            )
            matches = [a + b for a, b in zip(matches, m)]
            totals = [a + b for a, b in zip(totals, t)]
            ref_len += r
        self.matches += torch.tensor(matches, dtype=torch.long, device=self.device)
        self.totals += torch.tensor(totals, dtype=torch.long, device=self.device)
        self.ref_len += ref_len
        self.count += len(hyps)

    def compute(self) -> dict[str, torch.Tensor]:
        check_nonempty(self.count, "BLEU")
        m, t, r = self.matches.tolist(), self.totals.tolist(), int(self.ref_len)
        return {
            f"bleu{n}": torch.tensor(bleu_from_counts(m, t, r, n), dtype=torch.float64) for n in self.orders
        }


class CorpusNIST(DialogCorpus):
    """Cumulative NIST-n of ``mteval-v14c.pl`` for each ``n`` in ``orders`` (keys ``nist<n>``).

    Keeps the corpus: the information weights come from all references. mteval needs the same number of
    references for every example: they are cycled to ``n_refs`` (``None``: the largest count in the
    corpus), as ``dstc.py`` cycles them to its ``--n_refs``.
    """

    higher_is_better = True

    def __init__(
        self,
        orders: Sequence[int] = (2, 4),
        normalize: Normalize = "dstc",
        n_refs: int | None = None,
        **kwargs: Any,
    ):
        super().__init__(normalize, n_refs, **kwargs)
        self.orders = _orders(orders)

    def compute(self) -> dict[str, torch.Tensor]:
        hyps, refs = self.read_corpus("NIST")
        hyps = [mteval_words(" ".join(h)) for h in hyps]
        refs = [[mteval_words(" ".join(r)) for r in rs] for rs in cycle_references(refs, self.n_refs)]
        scores = mteval_nist(hyps, refs, max(self.orders))
        return {f"nist{n}": torch.tensor(scores[n - 1], dtype=torch.float64) for n in self.orders}


# ---------------------------------------------------------------------------------------------------------
# nltk's BLEU and NIST (for comparison with the official values)


class NltkCorpusBLEU(Metric):
    """nltk's ``corpus_bleu`` (uniform weights, no smoothing) for each ``n`` in ``orders`` (keys
    ``bleu<n>``), from summed n-gram statistics of the normalised words."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, orders: Sequence[int] = (2, 4), normalize: Normalize = "dstc", **kwargs: Any):
        super().__init__(**kwargs)
        self.orders = _orders(orders)
        self.normalize = check_normalize(normalize)
        width = max(self.orders)
        self.add_state("matches", default=torch.zeros(width, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("totals", default=torch.zeros(width, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("hyp_len", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("ref_len", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        hyps, refs = dialog_words(hypotheses, references, self.normalize)
        for hyp, ref in zip(hyps, refs):
            m, t, h, r = bleu_sentence_stats(hyp, ref, max(self.orders))
            self.matches += torch.tensor(m, dtype=torch.long, device=self.device)
            self.totals += torch.tensor(t, dtype=torch.long, device=self.device)
            self.hyp_len += h
            self.ref_len += r
            self.count += 1

    def compute(self) -> dict[str, torch.Tensor]:
        check_nonempty(self.count, "BLEU")
        m, t = self.matches.tolist(), self.totals.tolist()
        h, r = int(self.hyp_len), int(self.ref_len)
        return {
            f"bleu{n}": torch.tensor(bleu_from_stats(m, t, h, r, n), dtype=torch.float64) for n in self.orders
        }


class NltkCorpusNIST(DialogCorpus):
    """nltk's ``corpus_nist`` for each ``n`` in ``orders`` (keys ``nist<n>``) on the normalised words."""

    higher_is_better = True

    def __init__(self, orders: Sequence[int] = (2, 4), normalize: Normalize = "dstc", **kwargs: Any):
        super().__init__(normalize, **kwargs)
        self.orders = _orders(orders)

    def compute(self) -> dict[str, torch.Tensor]:
        hyps, refs = self.read_corpus("NIST")
        return {
            f"nist{n}": torch.tensor(corpus_nist(hyps, refs, n), dtype=torch.float64) for n in self.orders
        }


# ---------------------------------------------------------------------------------------------------------
# Diversity and length


class NGramDiversity(RaggedMetric):
    """Distinct-n (keys ``dist<n>``) and Entropy-n (keys ``ent<n>``, natural log) of the hypotheses."""

    higher_is_better = True

    def __init__(
        self,
        distinct_orders: Sequence[int] = (1, 2),
        entropy_orders: Sequence[int] = (4,),
        normalize: Normalize = "dstc",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.distinct_orders = [check_order(n, "distinct order") for n in distinct_orders]
        self.entropy_orders = [check_order(n, "entropy order") for n in entropy_orders]
        if not self.distinct_orders and not self.entropy_orders:
            raise ValueError("give at least one distinct or entropy order")
        self.normalize = check_normalize(normalize)
        self.add_ragged_state("hyps")

    def update(self, hypotheses: Sequence[str]) -> None:
        self.append_texts("hyps", [" ".join(h) for h in check_hypotheses(hypotheses, self.normalize)])

    def compute(self) -> dict[str, torch.Tensor]:
        hyps = [h.split() for h in self.read_texts("hyps")]
        check_nonempty(len(hyps), "Distinct/Entropy")
        out = {}
        for n in self.distinct_orders:
            out[f"dist{n}"] = torch.tensor(distinct_and_entropy(hyps, n)[0], dtype=torch.float64)
        for n in self.entropy_orders:
            out[f"ent{n}"] = torch.tensor(distinct_and_entropy(hyps, n)[1], dtype=torch.float64)
        return out


class ResponseLength(Metric):
    """Mean hypothesis length in (normalised) words."""

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, normalize: Normalize = "dstc", **kwargs: Any):
        super().__init__(**kwargs)
        self.normalize = check_normalize(normalize)
        self.add_state("words", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, hypotheses: Sequence[str]) -> None:
        hyps = check_hypotheses(hypotheses, self.normalize)
        self.words += sum(len(h) for h in hyps)
        self.count += len(hyps)

    def compute(self) -> torch.Tensor:
        check_nonempty(self.count, "average length")
        return self.words.double() / self.count.double()


# ---------------------------------------------------------------------------------------------------------
# Functional forms


def corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    orders: Sequence[int] = (2, 4),
    normalize: Normalize = "dstc",
    n_refs: int | None = None,
) -> dict[str, float]:
    """``CorpusBLEU`` (mteval-v14c.pl) in one call."""
    return as_floats(score_once(CorpusBLEU(orders, normalize, n_refs), hypotheses, references))


def corpus_nist_score(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    orders: Sequence[int] = (2, 4),
    normalize: Normalize = "dstc",
    n_refs: int | None = None,
) -> dict[str, float]:
    """``CorpusNIST`` (mteval-v14c.pl) in one call."""
    return as_floats(score_once(CorpusNIST(orders, normalize, n_refs), hypotheses, references))


def nltk_corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    orders: Sequence[int] = (2, 4),
    normalize: Normalize = "dstc",
) -> dict[str, float]:
    """``NltkCorpusBLEU`` on one corpus: nltk's ``corpus_bleu`` at each order (kept to compare with the
    official NIST-script BLEU of ``corpus_bleu``)."""
    return as_floats(score_once(NltkCorpusBLEU(orders, normalize), hypotheses, references))


def nltk_corpus_nist(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    orders: Sequence[int] = (2, 4),
    normalize: Normalize = "dstc",
) -> dict[str, float]:
    """``NltkCorpusNIST`` on one corpus: nltk's ``corpus_nist`` at each order (kept to compare with the
    official ``mteval-v14c.pl`` figures of ``corpus_nist_score``)."""
    return as_floats(score_once(NltkCorpusNIST(orders, normalize), hypotheses, references))


def ngram_diversity(
    hypotheses: Sequence[str],
    distinct_orders: Sequence[int] = (1, 2),
    entropy_orders: Sequence[int] = (4,),
    normalize: Normalize = "dstc",
) -> dict[str, float]:
    """``NGramDiversity`` on one corpus: Dist-n and Ent-n of the responses (Table 3, DialoGPT's DSTC scripts)."""
    return as_floats(score_once(NGramDiversity(distinct_orders, entropy_orders, normalize), hypotheses))


def response_length(hypotheses: Sequence[str], normalize: Normalize = "dstc") -> float:
    """``ResponseLength`` on one corpus: the mean response length in words (Table 3's avg len)."""
    return float(score_once(ResponseLength(normalize), hypotheses))
