"""Token statistics of generated text (paper §4.1, Table 2).

Inputs are documents as token-id sequences (the generated continuation only, as the authors' jsonl
``tokens`` field). All values are fractions in [0, 1] (the tables in ``cblight.metrics.tables`` turn them
into the paper's percentages), except the Zipf coefficient.

* ``long_range_repetition`` / ``LongRangeRepetition``: LR_n, the paper's §4.1 definition and the authors'
  ``generation/metrics/lr.py``.
* ``zipf_coefficient`` / ``ZipfCoefficient``, ``repetition_rate`` / ``RepetitionRate``,
  ``self_bleu`` / ``SelfBLEU``: as Holtzman et al.'s ``degen`` scripts (``metrics/zipf.py``,
  ``metrics/repetition.py``, ``metrics/self_bleu.py``).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cblight.metrics.ngrams import bleu_from_stats, ngram_counts
from cblight.metrics.ragged import PaperMetric, RaggedMetric, score_once
from cblight.option_types import PositiveInt, check_arguments

TokenDocs = Sequence[Sequence[int]] | Sequence[torch.Tensor]


def as_token_lists(documents: Any, name: str = "documents") -> list[list[int]]:
    """Documents as lists of ints; a flat list of ints (one document passed bare) is an error."""
    if isinstance(documents, torch.Tensor):
        raise TypeError(
            f"{name} must be a list of token-id sequences, not one tensor (ragged lengths differ)"
        )
    out = []
    for i, doc in enumerate(documents):
        if isinstance(doc, torch.Tensor) and doc.dim() == 1:
            doc = doc.tolist()
        if isinstance(doc, int | str | bytes | torch.Tensor) or not isinstance(doc, Sequence):
            kind = f"a {doc.dim()}-D tensor" if isinstance(doc, torch.Tensor) else type(doc).__name__
            raise TypeError(f"{name} must be a list of token-id sequences; {name}[{i}] is {kind}")
        out.append([int(t) for t in doc])
    return out


# ---------------------------------------------------------------------------------------------------------
# LR_n


def long_range_repetition(documents: TokenDocs, ns: tuple[PositiveInt, ...] = (50, 100)) -> dict[str, float]:
    """Corpus ``LR_n = Σ R_n / Σ S`` for each ``n`` (paper §4.1, Table 2's LR columns), as fractions.

    Args:
        documents: generated documents as token-id sequences (lists or 1-D tensors).
        ns: the distances ``n``.

    Returns:
        ``{"lr_<n>": value}`` for each ``n``.

    Raises:
        ValueError: for an empty corpus.

    Examples:
        >>> long_range_repetition([[1, 2, 3, 1, 2, 3, 1, 2, 3], [4, 5, 6, 7, 8, 9, 4, 5]], ns=(3, 6))
        {'lr_3': 0.5555555555555556, 'lr_6': 0.5555555555555556}
    """
    return score_once(LongRangeRepetition(ns), documents)


class LongRangeRepetition(PaperMetric):
    """LR_n (paper §4.1): ``Σ_i R_n(D_i) / Σ_i S(D_i)`` over documents ``D_i``, with ``S`` the distinct
    tokens of a document and ``R_n`` those whose first and last occurrences are at least ``n`` positions
    apart; ``compute()`` gives ``{"lr_50": ..., ...}``. ``update(documents)`` takes token-id sequences.

    Args:
        ns: the distances ``n``, at least one.
        **kwargs: torchmetrics' ``Metric`` options (``dist_sync_on_step``, ``process_group``, ...).

    Examples:
        >>> metric = LongRangeRepetition(ns=(3,))
        >>> metric.update([[1, 2, 3, 1, 2, 3, 1, 2, 3], [4, 5, 6, 7, 8, 9, 4, 5]])
        >>> metric.compute()
        {'lr_3': tensor(0.5556, dtype=torch.float64)}
    """

    higher_is_better = None

    def __init__(self, ns: tuple[PositiveInt, ...] = (50, 100), **kwargs: Any):
        check_arguments(LongRangeRepetition.__init__, locals())
        super().__init__(**kwargs)
        if not ns:
            raise ValueError("ns must name at least one distance n for LR_n")
        self.ns = list(ns)
        self.add_sums("distinct")
        self.add_sums("repeated", size=len(self.ns))

    def update(self, documents: TokenDocs) -> None:
        for doc in as_token_lists(documents):
            last = {t: i for i, t in enumerate(doc)}
            first = {t: i for i, t in reversed(list(enumerate(doc)))}
            spans = [last[t] - first[t] for t in first]
            self.distinct += len(first)
            repeated = [sum(s >= n for s in spans) for n in self.ns]
            self.repeated += torch.tensor(repeated, dtype=torch.long, device=self.device)

    def compute(self) -> dict[str, torch.Tensor]:
        if int(self.distinct) == 0:
            raise ValueError("LR_n needs at least one generated token; the corpus is empty")
        frac = self.repeated.double() / self.distinct.double()
        return {f"lr_{n}": frac[i] for i, n in enumerate(self.ns)}


# ---------------------------------------------------------------------------------------------------------
# Zipf coefficient


def zipf_coefficient(documents: TokenDocs, top: PositiveInt = 5000) -> float:
    """``ZipfCoefficient`` of one set of token documents (Table 2's Zipf column).

    Args:
        documents: generated documents as token-id sequences.
        top: how many of the most frequent token types the fit uses.

    Returns:
        The Zipf coefficient.

    Raises:
        ValueError: when the corpus has fewer than 2 distinct tokens.

    Examples:
        >>> round(zipf_coefficient([[1, 2, 3, 1, 2, 3, 1, 2, 3], [4, 5, 6, 7, 8, 9, 4, 5]]), 4)
        0.6319
    """
    return score_once(ZipfCoefficient(top), documents)


class ZipfCoefficient(RaggedMetric):
    """Zipf coefficient of the generated tokens (Table 2; degen ``metrics/zipf.py``: ``-slope`` of
    ``linregress(log rank, log count)`` over the ``top`` ranks). ``update(documents)`` takes token-id
    sequences.

    Args:
        top: how many of the most frequent token types the fit uses.
        **kwargs: torchmetrics' ``Metric`` options.
    """

    higher_is_better = None

    def __init__(self, top: PositiveInt = 5000, **kwargs: Any):
        check_arguments(ZipfCoefficient.__init__, locals())
        super().__init__(**kwargs)
        self.top = top
        self.add_state("tokens", default=[], dist_reduce_fx="cat")

    def update(self, documents: TokenDocs) -> None:
        self.append_longs("tokens", [t for doc in as_token_lists(documents) for t in doc])

    def compute(self) -> torch.Tensor:
        """Minus the least-squares slope of log frequency on log rank over the ``top`` most frequent types.

        Returns:
            The coefficient, a float64 scalar tensor.

        Raises:
            ValueError: when the corpus has fewer than 2 distinct tokens.
        """
        counts = Counter(self.read_longs("tokens")).values()
        freqs = np.sort(np.fromiter(counts, dtype=np.float64))[::-1][: self.top]
        if freqs.size < 2:
            raise ValueError(f"the Zipf fit needs at least 2 distinct tokens, the corpus has {freqs.size}")
        x = np.log(np.arange(1, freqs.size + 1, dtype=np.float64))
        y = np.log(freqs)
        xc = x - x.mean()
        return torch.tensor(float(-(xc * (y - y.mean())).sum() / (xc * xc).sum()), dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------------
# Repetition


def ends_in_repetition(tokens: Sequence[int], max_n: int = 90, eos_token_id: int | None = None) -> bool:
    """degen's rule: the generation (one trailing EOS dropped) ends in a span of ``m <= max_n`` tokens
    repeated ``r > 1`` times back to back, for the ``m`` with the most repeats (the shortest on ties), and
    either ``m >= 3`` or ``r > 50``."""
    gen = list(tokens)
    if gen and eos_token_id is not None and gen[-1] == eos_token_id:
        gen.pop()
    rev = gen[::-1]
    best_n, best_r = 1, 0
    for n in range(1, max_n + 1):
        r = 1
        while len(rev[n * r : n * (r + 1)]) == n and rev[n * r : n * (r + 1)] == rev[:n]:
            r += 1
        if r > best_r:
            best_n, best_r = n, r
    return best_r > 1 and (best_n >= 3 or best_r > 50)


def repetition_rate(documents: TokenDocs, max_n: PositiveInt = 90, eos_token_id: int | None = None) -> float:
    """``RepetitionRate`` of one set of token documents (Table 2's rep %, as a fraction).

    Args:
        documents: generated documents as token-id sequences.
        max_n: the longest repeating span looked for.
        eos_token_id: the EOS id dropped from a generation's end before the test (GPT-2: 50256).

    Returns:
        The share of documents that end in a repetition.

    Examples:
        >>> repetition_rate([[1, 2, 3, 1, 2, 3, 1, 2, 3], [4, 5, 6, 7, 8, 9, 4, 5]])
        0.5
    """
    return score_once(RepetitionRate(max_n, eos_token_id), documents)


class RepetitionRate(PaperMetric):
    """Share of generations ending in a repeating span (degen ``metrics/repetition.py``; paper Table 2
    "rep %", which is 100x this): the last span of ``m <= max_n`` tokens repeated back to back most often, when
    ``m >= 3`` or it repeats more than 50 times. ``update(documents)`` takes token-id sequences.

    Args:
        max_n: the longest repeating span looked for.
        eos_token_id: the EOS id dropped from a generation's end first (the tokenizer's; GPT-2: 50256).
        **kwargs: torchmetrics' ``Metric`` options.
    """

    higher_is_better = False

    def __init__(self, max_n: PositiveInt = 90, eos_token_id: int | None = None, **kwargs: Any):
        check_arguments(RepetitionRate.__init__, locals())
        super().__init__(**kwargs)
        self.max_n, self.eos_token_id = max_n, eos_token_id
        self.add_sums("repeating", "total")

    def update(self, documents: TokenDocs) -> None:
        for doc in as_token_lists(documents):
            self.repeating += int(ends_in_repetition(doc, self.max_n, self.eos_token_id))
            self.total += 1

    def compute(self) -> torch.Tensor:
        if int(self.total) == 0:
            raise ValueError("repetition rate of an empty corpus: no generations were given")
        return self.repeating.double() / self.total.double()


# ---------------------------------------------------------------------------------------------------------
# Self-BLEU


def self_bleu(
    documents: TokenDocs, max_order: PositiveInt = 4, n_sample: PositiveInt | None = 1000, seed: int = 0
) -> float:
    """Mean BLEU-``max_order`` of sampled documents, each against all other documents as references
    (nltk ``sentence_bleu``, uniform weights, ``SmoothingFunction().method1``), as degen (Table 2's
    "BLEU-4", a fraction).

    degen seeds ``random`` once and draws a fresh ``random.sample`` for each BLEU order 1..5, so its
    BLEU-``n`` scores the ``n``-th draw; a sample at least as large as the corpus (or ``None``) means every
    document. Exact and fast: the best reference count of each n-gram over "all documents but ``i``" is the
    top count over the corpus unless document ``i`` holds it, then the runner-up.

    Args:
        documents: generated documents as token-id sequences, at least 2.
        max_order: the BLEU order.
        n_sample: how many documents are scored (each against all others); ``None``: every one.
        seed: the seed of the sample.

    Returns:
        The mean self-BLEU.

    Raises:
        ValueError: for fewer than 2 documents.

    Examples:
        >>> round(self_bleu([[1, 2, 3, 4], [1, 2, 3, 5], [6, 7, 8, 9]], max_order=2), 4)
        0.4714
    """
    check_arguments(self_bleu, locals())
    docs = as_token_lists(documents)
    if len(docs) < 2:
        raise ValueError(f"self-BLEU needs at least 2 generations, got {len(docs)}")
    picked = list(range(len(docs)))
    if n_sample is not None and n_sample < len(docs):
        rng = random.Random(seed)
        for _ in range(max_order):
            picked = rng.sample(range(len(docs)), n_sample)
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    matches = {i: [0] * max_order for i in picked}
    for n in range(1, max_order + 1):
        hyp_counts = {i: ngram_counts(docs[i], n) for i in picked}
        wanted = set().union(*hyp_counts.values())
        best: dict[tuple, list[int]] = {}  # n-gram -> [top count, its document, runner-up count]
        for j, doc in enumerate(docs):
            for g, c in ngram_counts(doc, n).items():
                if g not in wanted:
                    continue
                entry = best.setdefault(g, [0, -1, 0])
                if c > entry[0]:
                    entry[:] = [c, j, entry[0]]
                elif c > entry[2]:
                    entry[2] = c
        for i in picked:
            others = Counter({g: best[g][2] if best[g][1] == i else best[g][0] for g in hyp_counts[i]})
            matches[i][n - 1] = sum((hyp_counts[i] & others).values())
    scores = []
    scale = int(lengths.max()) + 1
    for i in picked:
        # nltk's closest reference length: nearest to the hypothesis, ties to the shorter
        key = np.abs(lengths - lengths[i]) * scale + lengths
        key[i] = np.iinfo(np.int64).max  # a hypothesis is not its own reference
        ref_len = int(lengths[int(key.argmin())])
        totals = [max(1, len(docs[i]) - n + 1) for n in range(1, max_order + 1)]  # nltk's max(1, #n-grams)
        scores.append(bleu_from_stats(matches[i], totals, len(docs[i]), ref_len, max_order, 0.1))
    return math.fsum(scores) / len(scores)


class SelfBLEU(RaggedMetric):
    """Self-BLEU-``max_order`` (paper Table 2 "BLEU-4", a fraction there); ``self_bleu`` at ``compute()``.

    With ``n_sample`` smaller than the corpus the sample is drawn from the gathered corpus: pass each
    document's ``ids`` to ``update(documents, ids)`` so the corpus is put in id order first and the value
    does not depend on how it was split across processes (or use ``n_sample=None``, every generation).
    Undefined (NaN) for fewer than two generations.

    Args:
        max_order: the BLEU order.
        n_sample: how many documents are scored; ``None``: every one.
        seed: the seed of the sample.
        **kwargs: torchmetrics' ``Metric`` options.
    """

    higher_is_better = None

    def __init__(
        self, max_order: PositiveInt = 4, n_sample: PositiveInt | None = 1000, seed: int = 0, **kwargs: Any
    ):
        check_arguments(SelfBLEU.__init__, locals())
        super().__init__(**kwargs)
        self.max_order, self.n_sample, self.seed = max_order, n_sample, seed
        self.add_ragged_state("docs")
        self.add_state("ids", default=[], dist_reduce_fx="cat")

    def update(self, documents: TokenDocs, ids: Sequence[int] | None = None) -> None:
        docs = as_token_lists(documents)
        if ids is not None:
            if len(ids) != len(docs):
                raise ValueError(f"{len(ids)} ids for {len(docs)} documents")
            self.append_longs("ids", ids)
        self.append_ragged("docs", docs)

    def compute(self) -> torch.Tensor:
        docs = self.read_ragged("docs")
        ids = self.read_longs("ids")
        if ids:
            if len(ids) != len(docs):
                raise ValueError("SelfBLEU.update was called both with and without ids")
            docs = [doc for _, doc in sorted(zip(ids, docs), key=lambda pair: pair[0])]
        if len(docs) < 2:  # each generation is scored against the others: undefined for one
            return torch.tensor(float("nan"), dtype=torch.float64)
        return torch.tensor(self_bleu(docs, self.max_order, self.n_sample, self.seed), dtype=torch.float64)
