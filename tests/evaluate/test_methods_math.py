"""The comparison methods' maths (``cblight.evaluate.methods``) against hand-computed numbers and against literal
re-statements of the reference code (Zhao et al.'s ``run_classification.py`` / ``run_lama.py``, in numpy)."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from cblight.evaluate.methods import (
    calibrated_next_token,
    calibrated_scores,
    calibration_prior,
    pmi_scores,
    predictions,
)


def test_pmi_by_hand():
    full = torch.tensor([[-1.0, -2.0, -math.inf]])
    premise = torch.tensor([[-3.0, -0.5, 0.0]])
    got = pmi_scores(full, premise)
    assert got[0, :2].tolist() == [2.0, -1.5]  # -1 - (-3), -2 - (-0.5)
    assert got[0, 2] == -math.inf  # a missing choice stays missing
    assert predictions(got).tolist() == [0]


def test_calibration_prior_by_hand():
    # two content-free inputs over two labels: probabilities (0.8, 0.2) and (0.4, 0.6)
    ll = torch.log(torch.tensor([[0.8, 0.2], [0.4, 0.6]], dtype=torch.float64))
    assert calibration_prior(ll, "mean").tolist() == pytest.approx([0.6, 0.4])
    # minimum (0.4, 0.2) renormalised
    assert calibration_prior(ll, "min").tolist() == pytest.approx([2 / 3, 1 / 3])
    # label probabilities are averaged as they are, then normalised (the reference's get_p_content_free):
    # (0.08, 0.02) and (0.4, 0.6) average to (0.24, 0.31)
    raw = torch.log(torch.tensor([[0.08, 0.02], [0.4, 0.6]], dtype=torch.float64))
    assert calibration_prior(raw, "mean").tolist() == pytest.approx([0.24 / 0.55, 0.31 / 0.55])
    # tiny probabilities (long answers) do not underflow
    assert calibration_prior(raw - 2000.0, "mean").tolist() == pytest.approx([0.24 / 0.55, 0.31 / 0.55])


def test_calibration_flips_a_biased_prediction_by_hand():
    # p(y|x) = (0.55, 0.45) favours label 0, but content-free inputs give (0.7, 0.3):
    # W p = (0.55/0.7, 0.45/0.3) = (0.786, 1.5) -> label 1
    full = torch.log(torch.tensor([[0.55, 0.45]], dtype=torch.float64))
    prior = torch.tensor([0.7, 0.3], dtype=torch.float64)
    scores = calibrated_scores(full, prior)
    assert torch.exp(scores).tolist()[0] == pytest.approx([0.55 / 0.7, 0.45 / 0.3])
    assert predictions(scores).tolist() == [1]


def zhao_classification(all_label_probs: np.ndarray, p_cf: np.ndarray) -> list[int]:
    """run_classification.py's eval_accuracy (mode="diagonal_W"), the answer instead of the hit."""
    num_classes = all_label_probs.shape[1]
    W = np.linalg.inv(np.identity(num_classes) * p_cf)
    b = np.zeros([num_classes, 1])
    answers = []
    for label_probs in all_label_probs:
        label_probs = label_probs / np.sum(label_probs)
        calibrate_label_probs = np.matmul(W, np.expand_dims(label_probs, axis=-1)) + b
        answers.append(int(np.argmax(calibrate_label_probs)))
    return answers


def zhao_p_cf(cf_probs: np.ndarray) -> np.ndarray:
    """run_classification.py's get_p_content_free (its per-input label probabilities given)."""
    p_y = np.mean(np.array(cf_probs), axis=0)
    return p_y / np.sum(p_y)


def test_calibration_matches_the_reference_code():
    gen = torch.Generator().manual_seed(0)
    ll_full = torch.randn(200, 4, generator=gen, dtype=torch.float64) * 3 - 5
    ll_cf = torch.randn(3, 4, generator=gen, dtype=torch.float64) * 3 - 5
    prior = calibration_prior(ll_cf, "mean")
    ref_prior = zhao_p_cf(np.exp(ll_cf.numpy()))
    assert prior.tolist() == pytest.approx(ref_prior.tolist(), rel=1e-12)
    ours = predictions(calibrated_scores(ll_full, prior)).tolist()
    assert ours == zhao_classification(np.exp(ll_full.numpy()), ref_prior)
    # calibration changes some answers on this random set, so the comparison is not vacuous
    assert ours != predictions(ll_full).tolist()


def zhao_lama(full_lp: np.ndarray, cf_lp: np.ndarray, top: int) -> int:
    """run_lama.py's calibration of one example: top-``top`` candidates of the first token, p_cf the
    minimum over the content-free inputs, W = I and b = -p_cf over renormalised candidates."""
    order = np.argsort(-full_lp, kind="stable")[:top]
    cf_probs_dict: dict[int, list[float]] = defaultdict(list)
    for row in cf_lp:
        for token, lp in enumerate(row):
            cf_probs_dict[token].append(np.exp(lp))
    cf = {k: np.min(v) for k, v in cf_probs_dict.items()}
    orig = np.array([np.exp(full_lp[t]) for t in order])
    cfp = np.array([cf[t] for t in order])
    orig = orig / np.sum(orig)
    cfp = cfp / np.sum(cfp)
    calibrated = orig - cfp
    return int(order[int(np.argmax(calibrated))])


@pytest.mark.parametrize("top", [5, 50, 0])
def test_lama_calibration_matches_the_reference_code(top):
    gen = torch.Generator().manual_seed(1)
    vocab = 50
    full = torch.log_softmax(torch.randn(30, vocab, generator=gen) * 2, -1)
    cf = torch.log_softmax(torch.randn(30, 3, vocab, generator=gen) * 2, -1)
    got = calibrated_next_token(full, cf, top_n=top).tolist()
    want = [zhao_lama(full[i].double().numpy(), cf[i].double().numpy(), top or vocab) for i in range(30)]
    assert got == want
    # a shared [P, V] content-free table is the same as repeating it per example
    shared = calibrated_next_token(full, cf[0], top_n=top)
    assert shared.tolist() == [
        zhao_lama(full[i].double().numpy(), cf[0].double().numpy(), top or vocab) for i in range(30)
    ]


def test_predictions_ties_go_to_the_first_choice():
    scores = torch.tensor([[1.0, 1.0, 0.0], [0.0, 2.0, 2.0], [-math.inf, -1.0, -1.0]])
    assert predictions(scores).tolist() == [0, 1, 1]
