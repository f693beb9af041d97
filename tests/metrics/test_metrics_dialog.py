"""Dialog metrics of the official DSTC7 evaluation: BLEU/NIST against NIST's ``mteval-v14.pl`` (its printed
values on tricky texts) and the official DSTC7 figures of three real hypothesis sets, hand-computed
cases; nltk's variants against nltk (``corpus_bleu``, ``corpus_nist``); DialoGPT's DSTC evaluation logic
(``dstc/tokenizers.py`` ``clean_str``, ``dstc/metrics.py`` ``calc_entropy`` / ``calc_diversity``)."""

import json
import math
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from nltk.translate.bleu_score import corpus_bleu as reference_nltk_bleu
from nltk.translate.nist_score import corpus_nist as reference_nltk_nist

from cblight.metrics import (
    CorpusBLEU,
    CorpusNIST,
    NGramDiversity,
    NltkCorpusBLEU,
    NltkCorpusNIST,
    ResponseLength,
    corpus_bleu,
    corpus_nist_score,
    dialog_table,
    dstc_clean,
    format_dialog_table,
    ngram_diversity,
    nltk_corpus_bleu,
    response_length,
)
from cblight.metrics.dialog import cycle_references, dialog_words, mteval_words
from cblight.metrics.ngrams import nist_length_penalty

OFFICIAL = Path(__file__).resolve().parents[1] / "fixtures" / "dstc7_official"

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


def official_sets():
    sets = json.loads((OFFICIAL / "dialog_sets.json").read_text())
    scores = json.loads((OFFICIAL / "official_scores.json").read_text())["scores"]
    return sets["refs"], sets["hyps"], scores


# -- mteval-v14c.pl BLEU and NIST --------------------------------------------------------------------------

# mteval's tokenisation as its -d 3 output prints it (lower-cased A-Z only; ' and - stay inside words)
MTEVAL_WORDS = [
    ("I don't know :) .", ["i", "don't", "know", ":", ")", "."]),
    ("3.5 3,000 5-6 x-y 1. ,2 a.b e.g.", ["3.5", "3,000", "5", "-", "6", "x-y", "1", ".", ",", "2", "a", ".", "b", "e", ".", "g", "."]),
    ("__url__ #tag @u [x] {y} a|b ~", ["_", "_", "url", "_", "_", "#", "tag", "@", "u", "[", "x", "]", "{", "y", "}", "a", "|", "b", "~"]),
    ("Ünï É &amp; <b>", ["Ünï", "É", "amp", ";", "b", ">"]),
    ("  ", []),
]  # fmt: skip


@pytest.mark.parametrize(("text", "words"), MTEVAL_WORDS)
def test_mteval_words(text, words):
    assert mteval_words(text) == words


def test_mteval_words_match_the_script():
    for case in json.loads((OFFICIAL / "mteval_cases.json").read_text())["corpora"]:
        assert [mteval_words(h) for h in case["hyps"]] == case["hyp_words"], case["name"]


@pytest.mark.parametrize("name", ["overlapping", "low_overlap"])
def test_bleu_nist_match_the_mteval_script(name):
    case = next(
        c for c in json.loads((OFFICIAL / "mteval_cases.json").read_text())["corpora"] if c["name"] == name
    )
    # normalize="none": the script's own tokenisation sees the raw texts (no clean_str)
    nist = corpus_nist_score(case["hyps"], case["refs"], orders=(1, 2, 3, 4), normalize="none")
    bleu = corpus_bleu(case["hyps"], case["refs"], orders=(1, 2, 3, 4), normalize="none")
    for n in (1, 2, 3, 4):
        # the script's values printed with 12 decimals: 1e-11 covers the rounding and float summation order
        assert nist[f"nist{n}"] == pytest.approx(case["nist"][n - 1], abs=1e-11), n
        assert bleu[f"bleu{n}"] == pytest.approx(case["bleu"][n - 1], abs=1e-11), n


def test_official_dstc7_figures():
    refs, hyps, official = official_sets()
    for name, hyp in hyps.items():
        nist = corpus_nist_score(hyp, refs, orders=(1, 2, 3, 4))
        bleu = corpus_bleu(hyp, refs, orders=(1, 2, 3, 4))
        div = ngram_diversity(hyp, distinct_orders=(1, 2), entropy_orders=(1, 2, 3, 4))
        want = official[name]
        for n in (1, 2, 3, 4):
            # the script prints 4 decimals: within half a unit of the last digit (the issue asks 0.01 NIST,
            # 0.05 BLEU points)
            assert nist[f"nist{n}"] == pytest.approx(want["nist"][n - 1], abs=5.01e-5), (name, n)
            assert bleu[f"bleu{n}"] == pytest.approx(want["bleu"][n - 1], abs=5.01e-5), (name, n)
            # DialoGPT sums numpy float64 terms in dict order, we use fsum: ~1e-12 apart over ~10k n-grams
            assert div[f"ent{n}"] == pytest.approx(want["entropy"][n - 1], abs=1e-9), (name, n)
        assert div["dist1"] == want["div"][0] and div["dist2"] == want["div"][1], name
        assert response_length(hyp) == want["avg_len"], name


def test_bleu_hand_computed_with_mteval_smoothing():
    hyp, refs = ["the cat sat on a mat"], [["the cat sat by a mat"]]
    # p1 = 5/6, p2 = 3/5, p3 = 1/4; no 4-gram match: 1 / (2 * 3); equal lengths: no brevity penalty
    out = corpus_bleu(hyp, refs, orders=(2, 4))
    assert out["bleu2"] == pytest.approx(math.sqrt(5 / 6 * 3 / 5))
    assert out["bleu4"] == pytest.approx((5 / 6 * 3 / 5 * 1 / 4 / 6) ** (1 / 4))
    # two orders without a match: 1 / (2 * 2), then 1 / (4 * 1)
    out = corpus_bleu(["a b x c"], [["a b y c"]], orders=(3, 4))
    assert out["bleu3"] == pytest.approx((3 / 4 * 1 / 3 / 4) ** (1 / 3))
    assert out["bleu4"] == pytest.approx((3 / 4 * 1 / 3 / 4 / 4) ** (1 / 4))
    # nltk (unsmoothed) calls both 0
    assert nltk_corpus_bleu(["a b x c"], [["a b y c"]], orders=(4,))["bleu4"] == 0.0


def test_bleu_pools_references_and_takes_the_closest_length():
    # clipping by the largest count in any one reference: "b" twice (second reference), "a" once, so
    # p1 = 3/3 and p2 = 2/2 ("a b", "b b"); reference lengths 2 and 4 tie around 3: the shorter is taken,
    # and the hypothesis is longer: no brevity penalty
    out = corpus_bleu(["a b b"], [["a b", "b b c d"]], orders=(1, 2))
    assert out == {"bleu1": pytest.approx(1.0), "bleu2": pytest.approx(1.0)}
    # a short hypothesis: brevity penalty exp(1 - 4/2) against the closest length 4
    out = corpus_bleu(["a b"], [["a b c d", "a b c d e f g h"]], orders=(1,))
    assert out["bleu1"] == pytest.approx(math.exp(1 - 4 / 2))


def test_nist_hand_computed():
    # reference words a b b c (4, 2 per reference): info(a) = log2(4/1) = 2, info(b) = 1, info(c) = 2,
    # info(a b) = log2(count(a) / count(a b)) = 0, info(b c) = log2(2/1) = 1; the hypothesis matches all of
    # them across the two references (nltk would take one reference): NIST-1 = 5/3, NIST-2 adds 1/2;
    # 3 hypothesis words vs a mean reference length of 2: no length penalty
    out = corpus_nist_score(["a b c"], [["a b", "b c"]], orders=(1, 2))
    assert out["nist1"] == pytest.approx(5 / 3)
    assert out["nist2"] == pytest.approx(5 / 3 + 1 / 2)
    # two thirds of the mean reference length: penalty 0.5 (Doddington 2002)
    assert nist_length_penalty(2 / 3) == pytest.approx(0.5)
    out = corpus_nist_score(["a b"], [["a b c"]], orders=(1,))
    assert out["nist1"] == pytest.approx((2 * math.log2(3)) / 2 * 0.5)


def test_nist_reads_the_word_0_as_perl_does():
    # Perl takes the context string "0" for false: the bigram "0 x" is weighed against all 2 reference words
    # (log2(2/1) = 1, not log2(count("0") / 1) = 0); mteval-v14.pl prints NIST-2 = 2.0 here, 1.0 for "o x"
    assert corpus_nist_score(["0 x"], [["0 x"]], orders=(2,))["nist2"] == pytest.approx(2.0)
    assert corpus_nist_score(["o x"], [["o x"]], orders=(2,))["nist2"] == pytest.approx(1.0)


def test_references_cycled_to_a_common_count():
    hyps, refs = random_corpus(4)  # 1 to 4 references per example
    assert len({len(r) for r in refs}) > 1
    cycled = cycle_references(refs)
    assert {len(r) for r in cycled} == {max(len(r) for r in refs)}
    # NIST cycles to the largest count itself, as dstc.py does to its --n_refs
    assert corpus_nist_score(hyps, refs) == pytest.approx(corpus_nist_score(hyps, cycled))
    assert corpus_nist_score(hyps, refs, n_refs=6) == pytest.approx(
        corpus_nist_score(hyps, cycle_references(refs, 6))
    )
    # BLEU does not change when references repeat; n_refs=1 keeps only each first reference
    assert corpus_bleu(hyps, refs) == pytest.approx(corpus_bleu(hyps, cycled))
    assert corpus_bleu(hyps, refs, n_refs=1) == pytest.approx(corpus_bleu(hyps, [r[:1] for r in refs]))


def test_streaming_equals_one_call():
    hyps, refs = random_corpus(5)
    bleu, nist = CorpusBLEU(orders=(1, 4)), CorpusNIST(orders=(1, 4))
    for lo in range(0, len(hyps), 7):
        bleu.update(hyps[lo : lo + 7], refs[lo : lo + 7])
        nist.update(hyps[lo : lo + 7], refs[lo : lo + 7])
    assert {k: float(v) for k, v in bleu.compute().items()} == pytest.approx(corpus_bleu(hyps, refs, (1, 4)))
    assert {k: float(v) for k, v in nist.compute().items()} == pytest.approx(
        corpus_nist_score(hyps, refs, (1, 4))
    )


# -- nltk's BLEU and NIST --------------------------------------------------------------------------------


@pytest.mark.parametrize("normalize", ["dstc", "lower", "none"])
def test_nltk_bleu_matches_nltk(normalize):
    hyps, refs = random_corpus(0)
    h, r = dialog_words(hyps, refs, normalize)
    metric = NltkCorpusBLEU(orders=(1, 2, 3, 4), normalize=normalize)
    metric.update(hyps[:15], refs[:15])
    metric.update(hyps[15:], refs[15:])
    got = {k: float(v) for k, v in metric.compute().items()}
    for n in (1, 2, 3, 4):
        # the same float64 formula from the same integer counts: only log/exp rounding (~1e-16) differs
        assert got[f"bleu{n}"] == pytest.approx(reference_nltk_bleu(r, h, weights=(1 / n,) * n), abs=1e-12)
    assert got["bleu4"] > 0.05


def test_nltk_bleu_zero_higher_order_is_zero():
    # no bigram match: nltk's unsmoothed value is ~1e-154 and it says the score "evaluates to 0"
    with pytest.warns(UserWarning, match="evaluates to 0"):
        ref = reference_nltk_bleu([[["a", "b"]]], [["b", "a"]], weights=(0.5, 0.5))
    assert ref < 1e-100
    assert nltk_corpus_bleu(["b a"], [["a b"]], orders=(2,))["bleu2"] == 0.0


def test_nltk_nist_matches_nltk():
    hyps, refs = random_corpus(1)
    h, r = dialog_words(hyps, refs)
    metric = NltkCorpusNIST(orders=(1, 2, 4))
    metric.update(hyps[:25], refs[:25])
    metric.update(hyps[25:], refs[25:])
    got = metric.compute()
    for n in (1, 2, 4):
        # float64 sums of ~1e3 information weights in another order: ~1e-13 on values ~1-10
        assert float(got[f"nist{n}"]) == pytest.approx(reference_nltk_nist(r, h, n), abs=1e-12)
    assert float(got["nist2"]) > 0.1


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


# -- Table 3 ---------------------------------------------------------------------------------------------


def test_dialog_table_units():
    hyps = ["I do not know what you mean .", "that is a big cat !", "yes"]
    refs = [["I don't know what you mean.", "no idea"], ["what a big cat!"], ["yes , sure", "no"]]
    table = dialog_table(hyps, refs, meteor="nltk")
    assert list(table) == [
        "nist2",
        "nist4",
        "bleu2",
        "bleu4",
        "meteor_nltk",
        "ent4",
        "dist1",
        "dist2",
        "avg_len",
        "meteor_synonyms",
    ]
    nist, bleu = corpus_nist_score(hyps, refs), corpus_bleu(hyps, refs)
    div = ngram_diversity(hyps)
    assert table["nist2"] == pytest.approx(nist["nist2"]) and table["nist4"] == pytest.approx(nist["nist4"])
    assert table["bleu2"] == pytest.approx(100 * bleu["bleu2"]) and table["bleu2"] > 10
    assert table["bleu4"] == pytest.approx(100 * bleu["bleu4"])
    assert isinstance(table["meteor_synonyms"], bool) and 0 < table["meteor_nltk"] < 100
    assert table["ent4"] == pytest.approx(div["ent4"])
    assert table["dist1"] == pytest.approx(100 * div["dist1"])
    assert table["dist2"] == pytest.approx(100 * div["dist2"])
    assert table["avg_len"] == pytest.approx(response_length(hyps)) == pytest.approx((8 + 6 + 1) / 3)


def test_table3_layout_and_a_human_row_without_4gram_matches():
    refs = [["a b y c"], ["the cat sat by a mat"]]
    rows = {
        "greedy": dialog_table(["a b y c", "the cat sat by a mat"], refs, meteor="nltk"),
        "Human": dialog_table(["a b x c", "the cat sat on a mat"], refs, meteor="nltk"),
    }
    # no 4-gram of the human row matches: mteval's smoothing gives p4 = 1 / (2 * 4), not BLEU 0;
    # p1 = 8/10, p2 = 4/8, p3 = 1/6 (the only trigram match is "the cat sat")
    bleu4 = 100 * (8 / 10 * 4 / 8 * 1 / 6 / 8) ** (1 / 4)
    assert rows["Human"]["bleu4"] == pytest.approx(bleu4)
    lines = format_dialog_table(rows).splitlines()
    assert lines[0].split() == [
        "Inference",
        "method",
        "N-2",
        "N-4",
        "B-2",
        "B-4",
        "METEOR",
        "(nltk)",
        "Ent-4",
    ] + [
        "Dist-1",
        "Dist-2",
        "avg",
        "len",
    ]
    assert lines[3].split()[0] == "Human" and lines[3].split()[4] == f"{bleu4:.2f}" != "0.00"
    with pytest.raises(ValueError, match="other columns"):
        format_dialog_table({"a": rows["greedy"], "b": {"nist2": 1.0}})


# -- bad input -------------------------------------------------------------------------------------------


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"references\[1\] is empty"):
        corpus_bleu(["a", "b"], [["a"], []])
    with pytest.raises(TypeError, match=r"references\[0\] must be a list"):
        corpus_nist_score(["a"], ["a"])
    with pytest.raises(ValueError, match="2 hypotheses but 1 reference lists"):
        corpus_bleu(["a", "b"], [["a"]])
    with pytest.raises(TypeError, match="not one string"):
        ngram_diversity("a b c")
    with pytest.raises(ValueError, match="normalize must be one of"):
        CorpusBLEU(normalize="upper")
    with pytest.raises(ValueError, match=r"orders must be a list, each an integer >= 1, got \(0, 2\)"):
        CorpusBLEU(orders=(0, 2))
    with pytest.raises(ValueError, match="n_refs must be an integer >= 1 or null, got 0"):
        CorpusNIST(n_refs=0)
    with pytest.raises(ValueError, match="empty corpus"):
        corpus_bleu([], [])
    with pytest.raises(ValueError, match="empty corpus"):
        corpus_nist_score([], [])
    with pytest.raises(ValueError, match="references without a single word"):
        corpus_nist_score(["a"], [["😀 ~"]])
    with pytest.raises(ValueError, match="empty corpus"):
        ngram_diversity([])
    with pytest.raises(ValueError, match="empty corpus"):
        response_length([])
