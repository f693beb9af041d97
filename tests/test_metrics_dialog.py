"""Dialog metrics against nltk (``corpus_bleu``, ``corpus_nist``, ``meteor_score``), DialoGPT's DSTC
evaluation logic (``dstc/tokenizers.py`` ``clean_str``, ``dstc/metrics.py`` ``calc_entropy`` /
``calc_diversity``) and hand-computed values."""

import math
import random
from collections import defaultdict

import numpy as np
import pytest
from nltk.translate.bleu_score import corpus_bleu as nltk_corpus_bleu
from nltk.translate.meteor_score import meteor_score
from nltk.translate.nist_score import corpus_nist as nltk_corpus_nist

from cblight.metrics import (
    CorpusBLEU,
    CorpusNIST,
    Meteor,
    NGramDiversity,
    ResponseLength,
    corpus_bleu,
    corpus_nist_score,
    dialog_table,
    dstc_clean,
    meteor,
    ngram_diversity,
    response_length,
)
from cblight.metrics.dialog import _NoSynonyms, dialog_words, wordnet_reader

# clean_str outputs printed by DialoGPT's dstc/tokenizers.py (nltk 3.10 TweetTokenizer)
DSTC_CLEAN = [
    (
        " I don't know:). how about this?https://github.com/golsun/deep-RL-time-series",
        "i do n't know :) . how about this ? __url__",
    ),
    ("please try [ GitHub ] ( https://github.com )", "please try github"),
    (
        "I WON'T go, you can't make me!! It's 5:30 & we're late... ¿Qué? 😀 #tag @user",
        "i will n't go , you can n't make me ! ! it 's 5:30 we 're late ... qu ? tag user",
    ),
    ("", ""),
    ("   multiple   spaces\there ", "multiple spaces here"),
    ("they'll've done it, y'all'd 'em", "they'll 've done it , y'all 'd ' em"),
]


@pytest.mark.parametrize(("raw", "clean"), DSTC_CLEAN)
def test_dstc_clean_matches_dialogpt(raw, clean):
    assert dstc_clean(raw) == clean


def random_corpus(seed, n=40):
    rng = random.Random(seed)
    words = [
        "the",
        "a",
        "cat",
        "dog",
        "sat",
        "on",
        "mat",
        "is",
        "was",
        "big",
        "small",
        "I",
        "you",
        "it",
        ",",
        ".",
        "?",
    ]

    def sentence(lo):
        return " ".join(rng.choice(words) for _ in range(rng.randrange(lo, 14)))

    def edit(text):  # a reference that shares longer n-grams with its hypothesis
        return " ".join(w if rng.random() < 0.8 else rng.choice(words) for w in text.split()) or "it"

    hyps = [sentence(0) for _ in range(n)]
    refs = [[sentence(1)] + [edit(h) for _ in range(rng.randrange(0, 4))] for h in hyps]
    return hyps, refs


# -- BLEU ------------------------------------------------------------------------------------------------


def test_bleu_hand_computed():
    hyp = ["the cat sat on the mat"]
    refs = [["the cat is on the mat", "there is a cat on the mat"]]
    # p1 = 5/6 (one "sat" unmatched), p2 = 3/5 ("the cat", "on the", "the mat"), closest ref length 6: BP 1
    out = corpus_bleu(hyp, refs, orders=(1, 2))
    assert out["bleu1"] == pytest.approx(5 / 6)
    assert out["bleu2"] == pytest.approx(math.sqrt(5 / 6 * 3 / 5))


@pytest.mark.parametrize("normalize", ["dstc", "lower", "none"])
def test_bleu_matches_nltk(normalize):
    hyps, refs = random_corpus(0)
    h, r = dialog_words(hyps, refs, normalize)
    metric = CorpusBLEU(orders=(1, 2, 3, 4), normalize=normalize)
    metric.update(hyps[:15], refs[:15])
    metric.update(hyps[15:], refs[15:])
    got = {k: float(v) for k, v in metric.compute().items()}
    for n in (1, 2, 3, 4):
        ref = nltk_corpus_bleu(r, h, weights=(1 / n,) * n)
        # the same float64 formula from the same integer counts: only log/exp rounding (~1e-16) differs
        assert got[f"bleu{n}"] == pytest.approx(ref, abs=1e-12)
    assert got["bleu4"] > 0.05


def test_bleu_zero_higher_order_is_zero():
    # no bigram match: nltk's unsmoothed value is ~1e-154 and it says the score "evaluates to 0"
    with pytest.warns(UserWarning, match="evaluates to 0"):
        ref = nltk_corpus_bleu([[["a", "b"]]], [["b", "a"]], weights=(0.5, 0.5))
    assert ref < 1e-100
    assert corpus_bleu(["b a"], [["a b"]], orders=(2,))["bleu2"] == 0.0


# -- NIST ------------------------------------------------------------------------------------------------


def test_nist_hand_computed():
    # reference words: a a b d (4); info(a) = log2(4/2) = 1, info(b) = info(d) = 2, info(a b) = log2(2/1) = 1
    # NIST-1: matched info (1 + 2) + 1 over 4 hypothesis words = 1; NIST-2 adds (1 + 0) / 2; lengths equal
    out = corpus_nist_score(["a b", "a c"], [["a b"], ["a d"]], orders=(1, 2))
    assert out["nist1"] == pytest.approx(1.0)
    assert out["nist2"] == pytest.approx(1.5)


def test_nist_matches_nltk():
    hyps, refs = random_corpus(1)
    h, r = dialog_words(hyps, refs)
    metric = CorpusNIST(orders=(1, 2, 4))
    metric.update(hyps[:25], refs[:25])
    metric.update(hyps[25:], refs[25:])
    got = metric.compute()
    for n in (1, 2, 4):
        # float64 sums of ~1e3 information weights in another order: ~1e-13 on values ~1-10
        assert float(got[f"nist{n}"]) == pytest.approx(nltk_corpus_nist(r, h, n), abs=1e-12)
    assert float(got["nist2"]) > 0.1


# -- METEOR ----------------------------------------------------------------------------------------------


def test_meteor_exact_and_stem_stages_hand_computed():
    # "the" and "sat" match exactly, "cats" ~ "cat" by Porter stem: P = R = 1, one chunk of 3 matches
    # -> score = 1 - 0.5 * (1/3)^3
    out = meteor(["the cats sat"], [["the cat sat"]], use_synonyms=False)
    assert out["meteor"] == pytest.approx(1 - 0.5 / 27)
    assert out["meteor_synonyms"] == 0.0
    # without the stem stage only 2 of 3 words would match
    assert out["meteor"] > 0.9


def test_meteor_matches_nltk_over_references():
    hyps, refs = random_corpus(2)
    h, r = dialog_words(hyps, refs)
    metric = Meteor(use_synonyms=False)
    metric.update(hyps, refs)
    ref = np.mean([meteor_score(rr, hh, wordnet=_NoSynonyms()) for hh, rr in zip(h, r)])
    # a float64 mean of per-sentence scores in [0, 1], summed in another order: ~1e-16 per term
    assert float(metric.compute()["meteor"]) == pytest.approx(ref, abs=1e-12)


def test_meteor_reports_synonym_stage():
    available = wordnet_reader() is not None
    assert meteor(["a"], [["a"]])["meteor_synonyms"] == float(available)
    if available:
        assert Meteor(use_synonyms=True).synonyms
    else:
        with pytest.raises(LookupError, match="WordNet"):
            Meteor(use_synonyms=True)


class _FakeWordNet:
    """A WordNet reader knowing one synset {big, huge}, to exercise the synonym stage offline (nltk looks
    synonyms up after Porter stemming, so the pair must be stems already)."""

    class _Lemma:
        def __init__(self, name):
            self._name = name

        def name(self):
            return self._name

    class _Synset:
        def lemmas(self):
            return [_FakeWordNet._Lemma("big"), _FakeWordNet._Lemma("huge")]

    def synsets(self, word, *args, **kwargs):
        return [self._Synset()] if word in ("big", "huge") else []


def test_meteor_synonym_stage_when_wordnet_is_there(monkeypatch):
    import cblight.metrics.dialog as dialog

    # without synonyms "a" and "cat" match in 2 chunks: P = R = 2/3, score = 2/3 * (1 - 0.5 * 1)
    off = meteor(["a big cat"], [["a huge cat"]], use_synonyms=False)
    assert off == {"meteor": pytest.approx(1 / 3), "meteor_synonyms": 0.0}
    monkeypatch.setattr(dialog, "wordnet_reader", lambda: _FakeWordNet())
    on = meteor(["a big cat"], [["a huge cat"]])
    assert on == {"meteor": pytest.approx(1 - 0.5 / 27), "meteor_synonyms": 1.0}


# -- diversity and length --------------------------------------------------------------------------------


def dialogpt_entropy_diversity(lines):
    """DialoGPT dstc/metrics.py calc_entropy and calc_diversity on already-cleaned lines."""
    etp = [0.0] * 4
    counter = [defaultdict(int) for _ in range(4)]
    for line in lines:
        words = line.split()
        for n in range(4):
            for idx in range(len(words) - n):
                counter[n][" ".join(words[idx : idx + n + 1])] += 1
    for n in range(4):
        total = sum(counter[n].values())
        for v in counter[n].values():
            etp[n] += -v / total * (np.log(v) - np.log(total))
    div = [len(counter[n]) / sum(counter[n].values()) for n in range(2)]
    return etp, div


def test_diversity_hand_computed():
    # unigrams a a a b b c: 3 distinct of 6; bigrams "a b" x2, "b a", "b c": 3 distinct of 4; no 4-gram
    out = ngram_diversity(["a b a", "a b c"], distinct_orders=(1, 2), entropy_orders=(1, 4))
    assert out["dist1"] == pytest.approx(0.5)
    assert out["dist2"] == pytest.approx(0.75)
    assert out["ent1"] == pytest.approx(-(0.5 * math.log(0.5) + math.log(1 / 3) / 3 + math.log(1 / 6) / 6))
    assert out["ent4"] == 0.0
    assert response_length(["a b a", "a b c", ""]) == pytest.approx(2.0)


def test_diversity_and_length_match_dialogpt():
    hyps, _ = random_corpus(3, n=60)
    clean = [dstc_clean(h) for h in hyps]
    etp, div = dialogpt_entropy_diversity(clean)
    metric = NGramDiversity(distinct_orders=(1, 2), entropy_orders=(1, 2, 3, 4))
    metric.update(hyps[:20])
    metric.update(hyps[20:])
    got = metric.compute()
    for n in (1, 2, 3, 4):
        # entropy sums ~1e3 terms p log p in float64 in another order than DialoGPT's loop: ~1e-13
        assert float(got[f"ent{n}"]) == pytest.approx(etp[n - 1], abs=1e-10)
    assert float(got["dist1"]) == pytest.approx(div[0])
    assert float(got["dist2"]) == pytest.approx(div[1])
    length = ResponseLength()
    length.update(hyps)
    assert float(length.compute()) == pytest.approx(np.mean([len(c.split()) for c in clean]))


def test_dialog_table_units():
    hyps = ["I do not know what you mean .", "that is a big cat !", "yes"]
    refs = [["I don't know what you mean.", "no idea"], ["what a big cat!"], ["yes , sure", "no"]]
    table = dialog_table(hyps, refs)
    assert list(table) == [
        "nist2",
        "nist4",
        "bleu2",
        "bleu4",
        "meteor",
        "meteor_synonyms",
        "ent4",
        "dist1",
        "dist2",
        "avg_len",
    ]
    nist, bleu = corpus_nist_score(hyps, refs), corpus_bleu(hyps, refs)
    div = ngram_diversity(hyps)
    assert table["nist2"] == pytest.approx(nist["nist2"]) and table["nist4"] == pytest.approx(nist["nist4"])
    assert table["bleu2"] == pytest.approx(100 * bleu["bleu2"]) and table["bleu2"] > 10
    assert table["bleu4"] == pytest.approx(100 * bleu["bleu4"])
    assert table["meteor"] == pytest.approx(100 * meteor(hyps, refs)["meteor"])
    assert isinstance(table["meteor_synonyms"], bool)
    assert table["ent4"] == pytest.approx(div["ent4"])
    assert table["dist1"] == pytest.approx(100 * div["dist1"])
    assert table["dist2"] == pytest.approx(100 * div["dist2"])
    assert table["avg_len"] == pytest.approx(response_length(hyps)) == pytest.approx((8 + 6 + 1) / 3)


# -- bad input -------------------------------------------------------------------------------------------


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"references\[1\] is empty"):
        corpus_bleu(["a", "b"], [["a"], []])
    with pytest.raises(TypeError, match=r"references\[0\] must be a list"):
        corpus_nist_score(["a"], ["a"])
    with pytest.raises(ValueError, match="2 hypotheses but 1 reference lists"):
        meteor(["a", "b"], [["a"]])
    with pytest.raises(TypeError, match="not one string"):
        ngram_diversity("a b c")
    with pytest.raises(ValueError, match="normalize must be one of"):
        CorpusBLEU(normalize="upper")
    with pytest.raises(ValueError, match="n-gram order must be a positive integer"):
        CorpusBLEU(orders=(0, 2))
    with pytest.raises(ValueError, match="empty corpus"):
        corpus_bleu([], [])
    with pytest.raises(ValueError, match="empty corpus"):
        corpus_nist_score([], [])
    with pytest.raises(ValueError, match="empty corpus"):
        ngram_diversity([])
    with pytest.raises(ValueError, match="empty corpus"):
        response_length([])
