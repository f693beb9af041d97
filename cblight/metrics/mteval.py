"""BLEU and NIST as NIST's ``mteval-v14c.pl`` computes them for the DSTC7 evaluation (paper Table 3).

DialoGPT's ``dstc/dstc.py`` writes hypotheses and references as mteval XML and runs the script without
options (case-insensitive, default tokenisation, smoothed BLEU, closest-reference brevity penalty); the
paper's NIST-2/4 and BLEU-2/4 are its cumulative scores. Re-implemented here from the script's
definitions (Papineni et al. 2002 for BLEU, Doddington 2002 for NIST), pure Python:

* ``mteval_words``: DialoGPT's XML writer blanks ``&`` and ``<``; mteval's default tokenisation then
  lower-cases A-Z, splits off the ASCII punctuation ``{|}~[\\]^_`` `` !"#$%&()*+:;<=>?@/`` (not ``'`` or
  ``-``), a period or comma unless it sits between digits, and a dash after a digit.
* BLEU: per segment, n-gram matches clipped by the largest count in any one reference, and the reference
  length closest to the hypothesis (ties to the shorter); corpus sums; an order with no match counts as
  ``1 / (2^k · #hypothesis n-grams)`` for its k-th such order, an order with no hypothesis n-gram as
  precision 1; brevity penalty ``exp(min(0, 1 - ref/hyp))``, 0 for an empty corpus of hypotheses.
* NIST: information weight ``info(w1..wn) = log2(count(w1..wn-1) / count(w1..wn))`` over all reference
  segments (the unigram denominator is the number of reference words); per order the summed weights of the
  clipped matches over the number of hypothesis n-grams, accumulated over orders; length penalty
  ``exp(-β log²(hyp words / mean reference words))`` below 1 with β = ``log 2 / log² 1.5``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from cblight.metrics.ngrams import (
    brevity_penalty,
    max_reference_counts,
    ngrams_upto,
    nist_length_penalty,
    reference_ngrams,
)

Words = Sequence[str]

_PUNCTUATION = re.compile(r"([{-~\[-` -&(-+:-@/])")
_BEFORE_PERIOD_COMMA = re.compile(r"([^0-9])([.,])")
_AFTER_PERIOD_COMMA = re.compile(r"([.,])([^0-9])")
_DIGIT_DASH = re.compile(r"([0-9])(-)")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def mteval_words(text: str, preserve_case: bool = False) -> list[str]:
    """The words mteval scores for one segment written by DialoGPT's ``_write_xml``."""
    # the XML writer blanks the two characters that would break its XML; the parser turns \r\n into \n
    text = text.replace("&", " ").replace("<", " ").replace("\r\n", "\n").replace("\r", "\n")
    # mteval's language-independent part (its <skipped> and &quot;-style entity rules cannot fire here)
    text = text.replace("-\n", "").replace("\n", " ")
    if not preserve_case:
        text = text.translate(_ASCII_LOWER)  # mteval's tr/A-Z/a-z/: ASCII only
    text = _PUNCTUATION.sub(r" \1 ", f" {text} ")
    text = _BEFORE_PERIOD_COMMA.sub(r"\1 \2 ", text)
    text = _AFTER_PERIOD_COMMA.sub(r" \1 \2", text)
    text = _DIGIT_DASH.sub(r"\1 \2 ", text)
    return text.split()


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
