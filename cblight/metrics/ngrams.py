"""n-gram statistics shared by BLEU, self-BLEU, NIST, Distinct-n and Entropy-n (paper Tables 2 and 3).

``bleu_stats`` is BLEU's per-segment statistics as both nltk's ``corpus_bleu`` and NIST's ``mteval-v14c.pl``
define them (n-gram matches clipped by the largest count in any one reference, the reference length
closest to the hypothesis with ties to the shorter); ``bleu_from_stats`` and ``corpus_nist`` follow nltk's
``corpus_bleu`` / ``corpus_nist`` number for number (nltk's ``max(1, ·)`` sentence denominators, NIST's
per-reference best match); the tests compare against nltk. ``cblight.metrics.mteval`` builds the official
DSTC7 (``mteval-v14c.pl``) variants on the same pieces.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence

Tokens = Sequence[Hashable]


def ngram_counts(tokens: Tokens, n: int) -> Counter:
    """Counts of the n-grams (tuples) of one sequence; empty when it is shorter than ``n``."""
    return Counter(zip(*(tokens[i:] for i in range(n))))


def ngrams_upto(tokens: Tokens, max_order: int) -> Counter:
    """Counts of every n-gram of orders ``1..max_order`` (tuples), as mteval's ``Words2Ngrams``."""
    return Counter(
        tuple(tokens[i : i + n]) for n in range(1, max_order + 1) for i in range(len(tokens) - n + 1)
    )


def max_reference_counts(references: Sequence[Tokens], max_order: int) -> Counter:
    """Per n-gram its largest count in any one reference (a Counter union keeps the larger count)."""
    best: Counter = Counter()
    for ref in references:
        best |= ngrams_upto(ref, max_order)
    return best


def reference_ngrams(references: Sequence[Sequence[Tokens]], max_order: int) -> tuple[Counter, int]:
    """Counts of every n-gram of orders ``1..max_order`` over all references of a corpus, and their words
    (the counts NIST's information weights come from)."""
    counts: Counter = Counter()
    for ref in (ref for refs in references for ref in refs):
        counts.update(ngrams_upto(ref, max_order))
    return counts, sum(len(ref) for refs in references for ref in refs)


def bleu_stats(
    hypothesis: Tokens, references: Sequence[Tokens], max_order: int, min_total: int = 0
) -> tuple[list[int], list[int], int]:
    """``(matches, totals, ref_length)`` of one segment: per order ``1..max_order`` the hypothesis n-grams
    matched (clipped by the largest count in one reference) and the hypothesis n-grams (at least
    ``min_total``: nltk counts ``max(1, ·)``), and the closest reference length (ties to the shorter)."""
    clip = max_reference_counts(references, max_order)
    matches = [0] * max_order
    for gram, count in ngrams_upto(hypothesis, max_order).items():
        matches[len(gram) - 1] += min(count, clip[gram])
    totals = [max(len(hypothesis) - n + 1, min_total) for n in range(1, max_order + 1)]
    hyp_length = len(hypothesis)
    return matches, totals, min((len(r) for r in references), key=lambda r: (abs(r - hyp_length), r))


def brevity_penalty(ref_length: int, hyp_length: int) -> float:
    if hyp_length > ref_length:
        return 1.0
    if hyp_length == 0:
        return 0.0
    return math.exp(1.0 - ref_length / hyp_length)


def bleu_from_stats(
    matches: Sequence[int],
    totals: Sequence[int],
    hyp_len: int,
    ref_len: int,
    order: int,
    smoothing_epsilon: float | None = None,
) -> float:
    """nltk's BLEU-``order`` (uniform weights) from summed statistics, whose ``totals`` are sums of
    nltk's per-sentence ``max(1, #hypothesis n-grams)``.

    Without smoothing a zero n-gram precision makes BLEU 0 (nltk returns ~1e-77 there and says it
    "evaluates to 0"); ``smoothing_epsilon`` is nltk's ``SmoothingFunction().method1`` (0.1 by default
    there): a zero numerator becomes ``epsilon / total``. No unigram match is 0 either way, as in nltk.

    A hook of ``NltkCorpusBLEU`` (its ``bleu``), not part of the metric's API:

    :meta private:
    """
    if matches[0] == 0 or (smoothing_epsilon is None and 0 in matches[:order]):
        return 0.0
    logs = [math.log((m or smoothing_epsilon) / t) for m, t in zip(matches[:order], totals[:order])]
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
    freq, ref_words = reference_ngrams(references, order)

    def info(g: tuple) -> float:
        return math.log2((freq[g[:-1]] if len(g) > 1 else ref_words) / freq[g])

    precision, ref_total, hyp_total = 0.0, 0, 0
    for n in range(1, order + 1):
        numerator, denominator = 0.0, 0
        for hyp, refs in zip(hypotheses, references):
            hyp_counts = ngram_counts(hyp, n)
            den = sum(hyp_counts.values())
            overlaps = [(hyp_counts & ngram_counts(ref, n), len(ref)) for ref in refs]
            nums = [(sum(info(g) * c for g, c in overlap.items()), length) for overlap, length in overlaps]
            best = max((num / den if den else 0, num, den, length) for num, length in nums)
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
