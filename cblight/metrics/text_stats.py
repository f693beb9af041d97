"""Token statistics of generated text (paper §4.1, Table 2; docs/design.md, "Metrics").

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
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cblight.metrics.ngrams import bleu_from_stats, check_order, clipped_matches, ngram_counts
from cblight.metrics.ragged import RaggedMetric

TokenDocs = Sequence[Sequence[int]] | Sequence[torch.Tensor]


def as_token_lists(documents: Any, name: str = "documents") -> list[list[int]]:
    """Documents as lists of ints; a flat list of ints (one document passed bare) is an error."""
    if isinstance(documents, torch.Tensor):
        raise TypeError(
            f"{name} must be a list of token-id sequences, not one tensor (ragged lengths differ)"
        )
    out = []
    for i, doc in enumerate(documents):
        if isinstance(doc, torch.Tensor):
            if doc.dim() != 1:
                raise ValueError(
                    f"{name}[{i}] must be a 1-D tensor of token ids, got shape {tuple(doc.shape)}"
                )
            doc = doc.tolist()
        elif isinstance(doc, (int, str, bytes)) or not isinstance(doc, Sequence):
            raise TypeError(
                f"{name} must be a list of token-id sequences; {name}[{i}] is {type(doc).__name__}"
            )
        out.append([int(t) for t in doc])
    return out


# ---------------------------------------------------------------------------------------------------------
# LR_n


def long_range_counts(tokens: Sequence[int], ns: Sequence[int]) -> tuple[int, list[int]]:
    """``(S, [R_n for n in ns])`` of one document: distinct tokens, and those whose first and last
    occurrences are at least ``n`` positions apart."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, t in enumerate(tokens):
        first.setdefault(t, i)
        last[t] = i
    spans = [last[t] - first[t] for t in first]
    return len(first), [sum(s >= n for s in spans) for n in ns]


def _check_ns(ns: Sequence[int]) -> list[int]:
    ns = list(ns)
    if not ns:
        raise ValueError("ns must name at least one distance n for LR_n")
    return [check_order(n, "LR_n distance n") for n in ns]


def long_range_repetition(documents: TokenDocs, ns: Sequence[int] = (50, 100)) -> dict[str, float]:
    """Corpus ``LR_n = Σ R_n / Σ S`` for each ``n`` (fractions), keyed ``lr_<n>``."""
    metric = LongRangeRepetition(ns)
    metric.update(documents)
    return {k: float(v) for k, v in metric.compute().items()}


class LongRangeRepetition(RaggedMetric):
    """LR_n (paper §4.1): ``Σ_i R_n(D_i) / Σ_i S(D_i)``; ``compute()`` gives ``{"lr_50": ..., ...}``."""

    higher_is_better = None

    def __init__(self, ns: Sequence[int] = (50, 100), **kwargs: Any):
        super().__init__(**kwargs)
        self.ns = _check_ns(ns)
        self.add_state("distinct", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("repeated", default=torch.zeros(len(self.ns), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, documents: TokenDocs) -> None:
        for doc in as_token_lists(documents):
            s, rs = long_range_counts(doc, self.ns)
            self.distinct += s
            self.repeated += torch.tensor(rs, dtype=torch.long, device=self.device)

    def compute(self) -> dict[str, torch.Tensor]:
        if int(self.distinct) == 0:
            raise ValueError("LR_n needs at least one generated token; the corpus is empty")
        frac = self.repeated.double() / self.distinct.double()
        return {f"lr_{n}": frac[i] for i, n in enumerate(self.ns)}


# ---------------------------------------------------------------------------------------------------------
# Zipf coefficient


def zipf_from_counts(counts: Sequence[int], top: int = 5000) -> float:
    """Minus the least-squares slope of log frequency on log rank over the ``top`` most frequent types."""
    freqs = np.sort(np.asarray(counts, dtype=np.float64))[::-1][:top]
    if freqs.size < 2:
        raise ValueError(f"the Zipf fit needs at least 2 distinct tokens, the corpus has {freqs.size}")
    x = np.log(np.arange(1, freqs.size + 1, dtype=np.float64))
    y = np.log(freqs)
    xc = x - x.mean()
    return float(-(xc * (y - y.mean())).sum() / (xc * xc).sum())


def zipf_coefficient(documents: TokenDocs, top: int = 5000) -> float:
    """``ZipfCoefficient`` of one set of token documents (Table 2's Zipf column)."""
    metric = ZipfCoefficient(top)
    metric.update(documents)
    return float(metric.compute())


class ZipfCoefficient(RaggedMetric):
    """Zipf coefficient of the generated tokens (degen ``metrics/zipf.py``: ``-slope`` of
    ``linregress(log rank, log count)`` over the ``top`` ranks)."""

    higher_is_better = None

    def __init__(self, top: int = 5000, **kwargs: Any):
        super().__init__(**kwargs)
        self.top = check_order(top, "top")
        self.add_state("tokens", default=[], dist_reduce_fx="cat")

    def update(self, documents: TokenDocs) -> None:
        self.append_longs("tokens", [t for doc in as_token_lists(documents) for t in doc])

    def compute(self) -> torch.Tensor:
        tokens = torch.tensor(self.read_longs("tokens"), dtype=torch.long)
        _, counts = torch.unique(tokens, return_counts=True)
        return torch.tensor(zipf_from_counts(counts.tolist(), self.top), dtype=torch.float64)


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


def repetition_rate(documents: TokenDocs, max_n: int = 90, eos_token_id: int | None = None) -> float:
    """``RepetitionRate`` of one set of token documents (Table 2's rep %)."""
    metric = RepetitionRate(max_n, eos_token_id)
    metric.update(documents)
    return float(metric.compute())


class RepetitionRate(RaggedMetric):
    """Share of generations ending in a repeating span (degen ``metrics/repetition.py``; paper Table 2
    "rep %", which is 100x this). Pass the tokenizer's EOS (GPT-2: 50256) as ``eos_token_id``."""

    higher_is_better = False

    def __init__(self, max_n: int = 90, eos_token_id: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.max_n = check_order(max_n, "max_n")
        self.eos_token_id = eos_token_id
        self.add_state("repeating", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

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


def degen_sample(num_docs: int, n_sample: int | None, seed: int, draw: int) -> list[int]:
    """Indices of the hypotheses to score. degen seeds ``random`` once and draws a fresh
    ``random.sample`` for each BLEU order 1..5, so its BLEU-``n`` uses the ``n``-th draw; a sample at
    least as large as the corpus (or ``None``) means every document."""
    if n_sample is None or n_sample >= num_docs:
        return list(range(num_docs))
    rng = random.Random(seed)
    picked: list[int] = []
    for _ in range(draw):
        picked = rng.sample(range(num_docs), n_sample)
    return picked


def self_bleu(documents: TokenDocs, max_order: int = 4, n_sample: int | None = 1000, seed: int = 0) -> float:
    """Mean BLEU-``max_order`` of sampled documents, each against all other documents as references
    (nltk ``sentence_bleu``, uniform weights, ``SmoothingFunction().method1``), as degen.

    Exact and fast: the best reference count of each n-gram over "all documents but ``i``" is the top
    count over the corpus unless document ``i`` holds it, then the runner-up.
    """
    docs = as_token_lists(documents)
    check_order(max_order, "max_order")
    if n_sample is not None:
        check_order(n_sample, "n_sample")
    if len(docs) < 2:
        raise ValueError(f"self-BLEU needs at least 2 generations, got {len(docs)}")
    picked = degen_sample(len(docs), n_sample, seed, draw=max_order)
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    matches = {i: [0] * max_order for i in picked}
    totals = {i: [0] * max_order for i in picked}
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
            others = {g: (e[2] if e[1] == i else e[0]) for g, e in ((g, best[g]) for g in hyp_counts[i])}
            matches[i][n - 1] = clipped_matches(hyp_counts[i], others)
            totals[i][n - 1] = max(1, sum(hyp_counts[i].values()))
    scores = []
    scale = int(lengths.max()) + 1
    for i in picked:
        # nltk's closest reference length: nearest to the hypothesis, ties to the shorter
        key = np.abs(lengths - lengths[i]) * scale + lengths
        key[i] = np.iinfo(np.int64).max  # a hypothesis is not its own reference
        ref_len = int(lengths[int(key.argmin())])
        scores.append(bleu_from_stats(matches[i], totals[i], len(docs[i]), ref_len, max_order, 0.1))
    return math.fsum(scores) / len(scores)


class SelfBLEU(RaggedMetric):
    """Self-BLEU-``max_order`` (paper Table 2 "BLEU-4", a fraction there). With ``n_sample`` smaller than
    the corpus the sample is drawn from the gathered corpus: pass each document's ``ids`` to ``update`` so
    the corpus is put in id order first and the value does not depend on how it was split across
    processes (or use ``n_sample=None``, every generation). Undefined (NaN) for fewer than two generations."""

    higher_is_better = None

    def __init__(self, max_order: int = 4, n_sample: int | None = 1000, seed: int = 0, **kwargs: Any):
        super().__init__(**kwargs)
        self.max_order = check_order(max_order, "max_order")
        self.n_sample = None if n_sample is None else check_order(n_sample, "n_sample")
        self.seed = seed
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
        value = self_bleu(docs, self.max_order, self.n_sample, self.seed)
        return torch.tensor(value, dtype=torch.float64)
