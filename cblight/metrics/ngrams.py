"""n-gram statistics shared by BLEU, self-BLEU, NIST, Distinct-n and Entropy-n (paper Tables 2 and 3).

``bleu_sentence_stats`` / ``bleu_from_stats`` / ``corpus_nist`` follow nltk's ``corpus_bleu`` /
``corpus_nist`` number for number (clipping against the per-n-gram maximum over references, closest
reference length with ties to the shorter, nltk's ``max(1, ·)`` sentence denominators, NIST's
per-reference best match); the tests compare against nltk. ``cblight.metrics.mteval`` builds the official
DSTC7 (``mteval-v14c.pl``) variants on the same pieces.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence

Tokens = Sequence[Hashable]


def check_order(n: int, name: str = "n") -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {n!r}")
    return n


def ngram_counts(tokens: Tokens, n: int) -> Counter:
    """Counts of the n-grams (tuples) of one sequence; empty when it is shorter than ``n``."""
    return Counter(zip(*(tokens[i:] for i in range(n))))


def closest_ref_length(ref_lengths: Sequence[int], hyp_length: int) -> int:
    """BLEU's effective reference length: the closest to the hypothesis, ties to the shorter."""
    return min(ref_lengths, key=lambda r: (abs(r - hyp_length), r))


def brevity_penalty(ref_length: int, hyp_length: int) -> float:
    if hyp_length > ref_length:
        return 1.0
    if hyp_length == 0:
        return 0.0
    return math.exp(1.0 - ref_length / hyp_length)


def clipped_matches(hyp_counts: Counter, max_ref_counts: dict) -> int:
    return sum(min(c, max_ref_counts.get(g, 0)) for g, c in hyp_counts.items())


def bleu_sentence_stats(
    hypothesis: Tokens, references: Sequence[Tokens], max_order: int
) -> tuple[list[int], list[int], int, int]:
    """``(matches, totals, hyp_len, ref_len)`` of one hypothesis: per order ``n = 1..max_order`` the
    clipped n-gram matches and ``max(1, #hypothesis n-grams)``, and the lengths for the brevity penalty."""
    matches, totals = [], []
    for n in range(1, max_order + 1):
        counts = ngram_counts(hypothesis, n)
        max_ref: dict = {}
        for ref in references:
            ref_counts = ngram_counts(ref, n)
            for g in counts:
                max_ref[g] = max(max_ref.get(g, 0), ref_counts[g])
        matches.append(clipped_matches(counts, max_ref))
        totals.append(max(1, sum(counts.values())))
    hyp_len = len(hypothesis)
    return matches, totals, hyp_len, closest_ref_length([len(r) for r in references], hyp_len)


def bleu_from_stats(
    matches: Sequence[int],
    totals: Sequence[int],
    hyp_len: int,
    ref_len: int,
    order: int,
    smoothing_epsilon: float | None = None,
) -> float:
    """BLEU-``order`` (uniform weights) from summed statistics.

    Without smoothing a zero n-gram precision makes BLEU 0 (nltk returns ~1e-77 there and says it
    "evaluates to 0"); ``smoothing_epsilon`` is nltk's ``SmoothingFunction().method1`` (0.1 by default
    there): a zero numerator becomes ``epsilon / total``. No unigram match is 0 either way, as in nltk.
    """
    if matches[0] == 0:
        return 0.0
    logs = []
    for i in range(order):
        if matches[i] == 0:
            if smoothing_epsilon is None:
                return 0.0
            logs.append(math.log(smoothing_epsilon / totals[i]))
        else:
            logs.append(math.log(matches[i] / totals[i]))
    return brevity_penalty(ref_len, hyp_len) * math.exp(math.fsum(lg / order for lg in logs))


def nist_length_penalty(ratio: float) -> float:
    """Doddington (2002) eq. 3 of ``hyp words / reference words``: 1 from 1 up, 0.5 at two thirds."""
    if ratio >= 1:
        return 1.0
    if ratio <= 0:
        return 0.0
    beta = -math.log(0.5) / math.log(1.5) / math.log(1.5)
    return math.exp(-beta * math.log(ratio) * math.log(ratio))


def corpus_nist(hypotheses: Sequence[Tokens], references: Sequence[Sequence[Tokens]], order: int) -> float:
    """Corpus NIST-``order`` as nltk's ``corpus_nist``: information weights from the reference corpus,
    and per hypothesis and order the reference with the best (precision, numerator, denominator,
    length). An order with no hypothesis n-grams at all adds 0 (nltk divides by zero there)."""
    freq: Counter = Counter()
    ref_words = 0
    for refs in references:
        for ref in refs:
            for n in range(1, order + 1):
                freq.update(ngram_counts(ref, n))
            ref_words += len(ref)

    def info(g: tuple) -> float:
        return math.log2((freq[g[:-1]] if len(g) > 1 else ref_words) / freq[g])

    precision, ref_total, hyp_total = 0.0, 0, 0
    for n in range(1, order + 1):
        numerator, denominator = 0.0, 0
        for hyp, refs in zip(hypotheses, references):
            hyp_counts = ngram_counts(hyp, n)
            den = sum(hyp_counts.values())
            best = None
            for ref in refs:
                overlap = hyp_counts & ngram_counts(ref, n)
                num = sum(info(g) * c for g, c in overlap.items())
                cand = (num / den if den else 0, num, den, len(ref))
                best = cand if best is None else max(best, cand)
            assert best is not None
            numerator += best[1]
            denominator += den
            ref_total += best[3]
            hyp_total += len(hyp)
        if denominator:
            precision += numerator / denominator
    return precision * nist_length_penalty(hyp_total / ref_total if ref_total else 0.0)


def distinct_and_entropy(sequences: Sequence[Tokens], n: int) -> tuple[float, float, int]:
    """``(distinct, entropy, total)`` of the corpus's n-grams: unique/total and the natural-log entropy
    of their frequency distribution (as DialoGPT's DSTC ``calc_diversity`` / ``calc_entropy``).
    Both are 0 when the corpus has no n-gram of this order."""
    counts: Counter = Counter()
    for seq in sequences:
        counts.update(ngram_counts(seq, n))
    total = sum(counts.values())
    if total == 0:
        return 0.0, 0.0, 0
    entropy = -math.fsum(v / total * (math.log(v) - math.log(total)) for v in counts.values())
    return len(counts) / total, entropy, total
