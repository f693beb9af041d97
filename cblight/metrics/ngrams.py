"""n-gram statistics shared by BLEU, self-BLEU, NIST, Distinct-n and Entropy-n (paper Tables 2 and 3), and
BLEU and NIST as nltk and as NIST's ``mteval-v14c.pl`` (the official DSTC7 evaluation) compute them.

``bleu_stats`` is BLEU's per-segment statistics as both define them (n-gram matches clipped by the largest
count in any one reference, the reference length closest to the hypothesis with ties to the shorter).

* nltk: ``bleu_from_stats`` and ``corpus_nist`` follow nltk's ``corpus_bleu`` / ``corpus_nist`` number for
  number (nltk's ``max(1, ·)`` sentence denominators, NIST's per-reference best match); the tests compare
  against nltk.
* mteval, as DialoGPT's ``dstc/dstc.py`` runs it (without options: case-insensitive, default tokenisation,
  ``cblight.metrics.dialog.mteval_words``; smoothed BLEU, closest-reference brevity penalty), the paper's
  NIST-2/4 and BLEU-2/4, re-implemented from the script's definitions (Papineni et al. 2002 for BLEU,
  Doddington 2002 for NIST). ``bleu_from_counts``: corpus sums of ``bleu_stats``; an order with no match
  counts as ``1 / (2^k · #hypothesis n-grams)`` for its k-th such order, an order with no hypothesis n-gram
  as precision 1; brevity penalty ``exp(min(0, 1 - ref/hyp))``, 0 for an empty corpus of hypotheses.
  ``mteval_nist``: information weight ``info(w1..wn) = log2(count(w1..wn-1) / count(w1..wn))`` over all
  reference segments (the unigram denominator is the number of reference words); per order the summed
  weights of the clipped matches over the number of hypothesis n-grams, accumulated over orders; length
  penalty ``exp(-β log²(hyp words / mean reference words))`` below 1 with β = ``log 2 / log² 1.5``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence

Tokens = Sequence[Hashable]
Words = Sequence[str]


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


def bleu_from_counts(
    matches: Sequence[int], totals: Sequence[int], hyp_length: int, ref_length: int, order: int
) -> float:
    """mteval's smoothed cumulative BLEU-``order`` from corpus sums of ``bleu_stats`` (see the module doc).

    A hook of ``CorpusBLEU`` (its ``bleu``), not part of the metric's API:

    :meta private:
    """
    log_sum, smooth = 0.0, 1
    for n in range(order):
        if totals[n] == 0:
            continue  # log precision 0, as mteval
        if matches[n] == 0:
            smooth *= 2
            log_sum += math.log(1 / (smooth * totals[n]))
        else:
            log_sum += math.log(matches[n] / totals[n])
    return math.exp(log_sum / order) * brevity_penalty(ref_length, hyp_length)


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


def mteval_nist(
    hypotheses: Sequence[Words], references: Sequence[Sequence[Words]], max_order: int
) -> list[float]:
    """Cumulative NIST-1..``max_order`` of a corpus whose examples all have the same number of references
    (mteval's reference sets; see ``cblight.metrics.dialog.cycle_references``)."""
    counts, ref_words = reference_ngrams(references, max_order)
    if ref_words == 0:
        raise ValueError("NIST of references without a single word: mteval divides by their length")

    def info(gram: tuple) -> float:
        """The information of an n-gram in bits (mteval's ``compute_ngram_info``). Perl reads the (n-1)-gram
        string "0" as false: a bigram after the word "0" is weighed like a unigram, against all words."""
        context = counts[gram[:-1]] if len(gram) > 1 and gram[:-1] != ("0",) else ref_words
        return -math.log(counts[gram] / context) / math.log(2)

    matched_info = [0.0] * max_order
    hyp_ngrams = [0] * max_order
    for hyp, refs in zip(hypotheses, references):
        clip = max_reference_counts(refs, max_order)
        for gram, count in ngrams_upto(hyp, max_order).items():
            if gram in clip:
                matched_info[len(gram) - 1] += info(gram) * min(count, clip[gram])
        for n in range(1, max_order + 1):
            hyp_ngrams[n - 1] += max(len(hyp) - n + 1, 0)
    penalty = nist_length_penalty(hyp_ngrams[0] / (ref_words / len(references[0])))
    scores, total = [], 0.0
    for n in range(max_order):
        total += matched_info[n] / max(hyp_ngrams[n], 1)
        scores.append(total * penalty)
    return scores


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
