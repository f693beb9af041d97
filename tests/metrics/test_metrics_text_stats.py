"""LR_n, Zipf, repetition and self-BLEU against hand-computed values and the reference scripts' logic
(the authors' ``generation/metrics/lr.py``; degen's ``metrics/zipf.py``, ``repetition.py``,
``self_bleu.py``), re-implemented here as the plain loops those scripts run."""

import math
import random

import numpy as np
import pytest
import torch
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from cblight.metrics import (
    LongRangeRepetition,
    RepetitionRate,
    SelfBLEU,
    ZipfCoefficient,
    long_range_repetition,
    repetition_rate,
    self_bleu,
    zipf_coefficient,
)


def random_docs(seed, n_docs=30, vocab=15, max_len=40):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(0, max_len))] for _ in range(n_docs)]


# -- LR_n ------------------------------------------------------------------------------------------------


def authors_lr(docs, lengths):
    """The authors' lr.py loop: list.index for the first and last occurrence."""
    rn = dict.fromkeys(lengths, 0)
    s = 0
    for tokens in docs:
        distinct = set(tokens)
        s += len(distinct)
        for t in distinct:
            first = tokens.index(t)
            last = len(tokens) - tokens[::-1].index(t) - 1
            for n in lengths:
                if last - first >= n:
                    rn[n] += 1
    return {f"lr_{n}": rn[n] / s for n in lengths}


def test_lr_hand_computed():
    # doc 1: token 1 at 0 and 5 (span 5), 2 at 1 and 2 (span 1), 3 and 4 once -> S = 4
    # doc 2: token 7 at 0 and 3 (span 3), 8 and 9 once -> S = 3
    docs = [[1, 2, 2, 3, 4, 1], [7, 8, 9, 7]]
    # S = 4 + 3 = 7; R_3 = {1 (5), 7 (3)} = 2; R_5 = {1} = 1; R_1 = {1, 2, 7} = 3
    out = long_range_repetition(docs, ns=(1, 3, 5, 6))
    assert out == pytest.approx({"lr_1": 3 / 7, "lr_3": 2 / 7, "lr_5": 1 / 7, "lr_6": 0.0})


def test_lr_matches_authors_script_over_updates():
    docs = random_docs(0, n_docs=40, vocab=30, max_len=160)
    metric = LongRangeRepetition(ns=(50, 100))
    for i in range(0, len(docs), 7):  # several updates accumulate
        metric.update(docs[i : i + 7])
    got = {k: float(v) for k, v in metric.compute().items()}
    ref = authors_lr(docs, (50, 100))
    assert 0 < ref["lr_100"] < ref["lr_50"] < 1
    # an integer count over an integer count on both sides: one correctly rounded division, so equal
    # (1e-15 only absorbs a float32/float64 cast on the way out of the metric)
    assert got == pytest.approx(ref, abs=1e-15)
    # tensors are accepted as documents
    assert long_range_repetition([torch.tensor(d) for d in docs]) == pytest.approx(ref, abs=1e-15)


# -- Zipf ------------------------------------------------------------------------------------------------


def degen_zipf(docs, top=5000):
    """degen zipf.py with scipy's linregress replaced by numpy's degree-1 least-squares fit."""
    from collections import Counter

    cnt = Counter()
    for d in docs:
        cnt.update(d)
    xs = np.arange(1, min(len(cnt), top) + 1)
    ys = np.array(sorted(cnt.values(), key=lambda v: -v)[:top])
    slope, _ = np.polyfit(np.log(xs), np.log(ys), 1)
    return -slope


def test_zipf_exact_power_law():
    # frequencies 60/r for ranks r = 1..5 (60, 30, 20, 15, 12) lie exactly on slope -1
    docs = [[r] * (60 // r) for r in range(1, 6)]
    assert zipf_coefficient(docs) == pytest.approx(1.0, abs=1e-12)
    # the top-2 cut keeps ranks 1 and 2: still slope -1
    assert zipf_coefficient(docs, top=2) == pytest.approx(1.0, abs=1e-12)
    # frequencies 144 / r^2 -> coefficient 2
    assert zipf_coefficient([[r] * (144 // (r * r)) for r in (1, 2, 3, 4)]) == pytest.approx(2.0, abs=1e-12)


@pytest.mark.parametrize("top", [5000, 7])
def test_zipf_matches_degen(top):
    docs = random_docs(1, n_docs=50, vocab=40, max_len=60)
    metric = ZipfCoefficient(top=top)
    metric.update(docs[:20])
    metric.update(docs[20:])
    # two float64 least-squares fits of the same points (ours closed form, numpy's lstsq): ~1e-14
    assert float(metric.compute()) == pytest.approx(degen_zipf(docs, top), abs=1e-10)


# -- repetition --------------------------------------------------------------------------------------------


def degen_is_repeating(gen, sep):
    """degen repetition.py for one generation."""
    gen = list(gen)
    if gen[-1] == sep:
        gen.pop(-1)
    rev_gen = list(reversed(gen))
    max_n = 90
    last_n_repeats = [0] * max_n
    for n in range(1, max_n + 1):
        n_repeat = 1
        while (
            len(rev_gen[n * n_repeat : n * (n_repeat + 1)]) == n
            and rev_gen[n * n_repeat : n * (n_repeat + 1)] == rev_gen[:n]
        ):
            n_repeat += 1
        last_n_repeats[n - 1] = n_repeat
    best = max(range(max_n), key=lambda x: last_n_repeats[x])
    return last_n_repeats[best] > 1 and (best + 1 >= 3 or last_n_repeats[best] > 50)


def test_repetition_hand_cases():
    eos = 99
    assert repetition_rate([[5, 1, 2, 3, 1, 2, 3]]) == 1.0  # "1 2 3" twice at the end
    assert repetition_rate([[5, 1, 2, 3, 1, 2, 3, eos]], eos_token_id=eos) == 1.0  # trailing EOS dropped
    assert repetition_rate([[5, 1, 2, 3, 1, 2, 3, eos]]) == 0.0  # ... only when told which token it is
    assert repetition_rate([[4, 1, 2, 1, 2]]) == 0.0  # a 2-token span repeated twice is not enough
    assert repetition_rate([[7] * 50]) == 0.0  # one token 50 times: 50 repeats, not > 50
    assert repetition_rate([[7] * 51]) == 1.0
    assert repetition_rate([[1, 2, 3, 4]]) == 0.0
    assert repetition_rate([[], [3, 4, 5, 3, 4, 5], [1]]) == pytest.approx(1 / 3)


def test_repetition_matches_degen():
    rng = random.Random(3)
    docs = []
    for _ in range(200):
        base = [rng.randrange(6) for _ in range(rng.randrange(1, 20))]
        span = [rng.randrange(6) for _ in range(rng.randrange(1, 5))]
        doc = base + span * rng.randrange(1, 4)
        if rng.random() < 0.3:
            doc.append(99)
        docs.append(doc)
    ref = [degen_is_repeating(d, 99) for d in docs]
    assert 0.1 < sum(ref) / len(ref) < 0.9
    metric = RepetitionRate(eos_token_id=99)
    metric.update(docs)
    assert float(metric.compute()) == pytest.approx(sum(ref) / len(ref))


# -- self-BLEU -------------------------------------------------------------------------------------------


def degen_self_bleu4(docs, n_sample, seed=0):
    """degen self_bleu.py for BLEU-4: one seeded random.sample per BLEU order 1..4, nltk sentence_bleu."""
    random.seed(seed)
    for _ in range(4):
        picked = random.sample(range(len(docs)), n_sample)
    smoothing = SmoothingFunction().method1
    scores = [
        sentence_bleu(docs[:i] + docs[i + 1 :], docs[i], weights=(0.25,) * 4, smoothing_function=smoothing)
        for i in picked
    ]
    return sum(scores) / n_sample


def test_self_bleu_matches_degen_sample():
    docs = random_docs(4, n_docs=40, vocab=10, max_len=30)
    # nltk's sentence_bleu on both sides, averaged in float64 in the same order: ~1e-16
    assert self_bleu(docs, n_sample=15, seed=0) == pytest.approx(degen_self_bleu4(docs, 15, 0), abs=1e-12)
    assert self_bleu(docs, n_sample=15, seed=7) == pytest.approx(degen_self_bleu4(docs, 15, 7), abs=1e-12)


def test_self_bleu_all_documents_and_orders():
    docs = random_docs(5, n_docs=25, vocab=8, max_len=25)
    docs[3] = list(docs[4])  # an exact duplicate: its best reference count comes from the other copy
    docs[0] = []  # an empty generation scores 0
    smoothing = SmoothingFunction().method1
    for order in (2, 4):
        weights = (1 / order,) * order
        ref = sum(
            sentence_bleu(docs[:i] + docs[i + 1 :], docs[i], weights=weights, smoothing_function=smoothing)
            for i in range(len(docs))
        ) / len(docs)
        metric = SelfBLEU(max_order=order, n_sample=None)
        metric.update(docs[:10])
        metric.update(docs[10:])
        assert float(metric.compute()) == pytest.approx(ref, abs=1e-12)
    # a sample at least as large as the corpus is the whole corpus
    assert self_bleu(docs, n_sample=1000) == pytest.approx(self_bleu(docs, n_sample=None), abs=1e-15)


def test_self_bleu_identical_documents_is_one():
    assert self_bleu([[1, 2, 3, 4, 5]] * 3, n_sample=None) == pytest.approx(1.0)
    # disjoint vocabularies: no unigram match, BLEU 0
    assert self_bleu([[1, 2, 3], [4, 5, 6]], n_sample=None) == 0.0


# -- bad input -------------------------------------------------------------------------------------------


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"ns must be a list, each an integer >= 1, got \(0,\)"):
        LongRangeRepetition(ns=(0,))
    with pytest.raises(ValueError, match="at least one distance"):
        LongRangeRepetition(ns=())
    with pytest.raises(ValueError, match="corpus is empty"):
        long_range_repetition([])
    with pytest.raises(ValueError, match="corpus is empty"):
        long_range_repetition([[], []])
    with pytest.raises(TypeError, match="list of token-id sequences"):
        long_range_repetition([1, 2, 3])  # one document passed bare
    with pytest.raises(TypeError, match="not one tensor"):
        long_range_repetition(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="at least 2 distinct tokens"):
        zipf_coefficient([[1, 1, 1]])
    with (
        pytest.warns(UserWarning, match="before the ``update``"),
        pytest.raises(ValueError, match="2 distinct"),
    ):
        ZipfCoefficient().compute()
    with pytest.raises(ValueError, match="top must be an integer >= 1, got 0"):
        ZipfCoefficient(top=0)
    with pytest.raises(ValueError, match="empty corpus"):
        repetition_rate([])
    with pytest.raises(ValueError, match="at least 2 generations"):
        self_bleu([[1, 2]])
    with pytest.raises(ValueError, match="n_sample must be an integer >= 1 or null, got 0"):
        self_bleu([[1], [2]], n_sample=0)
    assert math.isfinite(self_bleu([[1], [1]], n_sample=None))


def test_self_bleu_of_one_generation_is_undefined_not_an_error():
    """One generation has no others to be compared with: the metric says NaN and Table 2 prints "-"
    (a generation run with --data.limit 1 stopped with a traceback here)."""
    from cblight.metrics.tables import TextSuite

    metric = SelfBLEU()
    metric.update([[1, 2, 3, 4]])
    assert math.isnan(float(metric.compute()))
    suite = TextSuite()
    suite.update([[1, 2, 3, 4]], [torch.tensor([-1.0] * 4)], [torch.tensor([-2.0] * 4)])
    assert suite.compute()["self_bleu4"] is None
    with pytest.raises(ValueError, match="at least 2 generations"):
        self_bleu([[1, 2, 3]])
