"""ROUGE-1/2/L against ``rouge_score.rouge_scorer`` directly and a hand-computed case."""

import numpy as np
import pytest
from rouge_score import rouge_scorer

from cblight.metrics import ROUGE, rouge, summary_table

PREDS = [
    "The cats were sitting on the mat all day.",
    "Stocks rose on Monday after the announcement.",
    "Nothing in common here",
    "",
]
REFS = [
    "A cat sat on the mat.",
    "Markets rallied on Monday, and stocks rose after the central bank's announcement.",
    "Completely different words",
    "An empty prediction scores zero.",
]


def test_rouge_hand_computed():
    # unigrams: 3 of 3 predicted, 3 of 4 reference -> F = 2 * 1 * 0.75 / 1.75; bigrams "the cat", "cat sat"
    # of 2 predicted and 3 reference -> F = 2 * 1 * 2/3 / (5/3) = 0.8; LCS = 3 words -> same as ROUGE-1
    out = rouge(["the cat sat"], ["the cat sat down"])
    assert out["rouge1"] == pytest.approx(2 * 0.75 / 1.75)
    assert out["rouge2"] == pytest.approx(0.8)
    assert out["rougeL"] == pytest.approx(2 * 0.75 / 1.75)


@pytest.mark.parametrize("use_stemmer", [True, False])
def test_rouge_matches_rouge_score(use_stemmer):
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=use_stemmer)
    metric = ROUGE(use_stemmer=use_stemmer)
    metric.update(PREDS[:2], REFS[:2])
    metric.update(PREDS[2:], REFS[2:])
    got = metric.compute()
    for t in ("rouge1", "rouge2", "rougeL"):
        ref = np.mean([scorer.score(r, p)[t].fmeasure for p, r in zip(PREDS, REFS)])
        # the same per-document F-measures averaged in float64 (the metric syncs a float64 sum): ~1e-16
        assert float(got[t]) == pytest.approx(ref, abs=1e-12)
    table = summary_table(PREDS, REFS, use_stemmer=use_stemmer)
    assert table["rouge2"] == pytest.approx(100 * float(got["rouge2"]))


def test_rouge_multiple_references_take_the_best():
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    refs = [[REFS[0], PREDS[0]], [REFS[1]]]
    got = rouge(PREDS[:2], refs)
    ref = np.mean([scorer.score_multi(r, p)["rouge2"].fmeasure for p, r in zip(PREDS[:2], refs)])
    assert got["rouge2"] == pytest.approx(ref)


def test_bad_inputs():
    with pytest.raises(ValueError, match="rougeLsum needs nltk's punkt"):
        ROUGE(rouge_types=("rouge1", "rougeLsum"))
    with pytest.raises(ValueError, match="unknown ROUGE type"):
        ROUGE(rouge_types=("rouge0",))
    with pytest.raises(ValueError, match="2 predictions but 1 references"):
        rouge(["a", "b"], ["a"])
    with pytest.raises(ValueError, match=r"references\[0\] is empty"):
        rouge(["a"], [[]])
    with pytest.raises(TypeError, match="not strings"):
        rouge("a b", "a b")
    with pytest.raises(ValueError, match="empty corpus"):
        rouge([], [])
