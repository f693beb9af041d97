"""Boosting maths against hand-computed numbers (paper eq. 1, eq. 2; docs/design.md, "Mathematics").

Tolerances: the mixing runs in float32 on hand-computed float64 references of magnitude ~1: float32
rounding gives ~1e-7, so 1e-6; sweeps over a model's log-probs (magnitude ~10) get 1e-5.
"""

import math

import pytest
import torch

from cblight.boosting import (
    AlphaGrid,
    binomial_stderr,
    boosted_log_probs,
    choice_accuracy_curve,
    choice_predictions,
    first_argmax,
    mix_log_probs,
    next_token_alpha_sweep,
    normalize_log_scores,
    product_of_experts,
    short_context_ids,
    two_expert_weights,
)

LOG = math.log


def test_two_expert_product_by_hand():
    # f_full = (0.5, 0.3, 0.2), f_short = (0.7, 0.2, 0.1), alpha = -0.5 in the next-token form:
    # f_alpha ∝ f_full · f_short^-0.5
    full = torch.tensor([[LOG(0.5), LOG(0.3), LOG(0.2)]])
    short = torch.tensor([[LOG(0.7), LOG(0.2), LOG(0.1)]])
    unnorm = [0.5 / math.sqrt(0.7), 0.3 / math.sqrt(0.2), 0.2 / math.sqrt(0.1)]
    z = sum(unnorm)
    expected = torch.tensor([[LOG(u / z) for u in unnorm]])
    got = boosted_log_probs(full, short, -0.5, "next_token")
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    # generation form: f_full^1.5 f_short^-0.5 (Figure 1's "p_full^1.5 p_short^-0.5")
    unnorm = [0.5**1.5 / 0.7**0.5, 0.3**1.5 / 0.2**0.5, 0.2**1.5 / 0.1**0.5]
    z = sum(unnorm)
    expected = torch.tensor([[LOG(u / z) for u in unnorm]])
    torch.testing.assert_close(
        boosted_log_probs(full, short, -0.5, "generation"), expected, rtol=0, atol=1e-6
    )


def test_three_experts_and_weights():
    a = torch.tensor([LOG(0.6), LOG(0.4)])
    b = torch.tensor([LOG(0.1), LOG(0.9)])
    c = torch.tensor([LOG(0.5), LOG(0.5)])
    unnorm = [0.6**1 * 0.1**-0.25 * 0.5**0.5, 0.4**1 * 0.9**-0.25 * 0.5**0.5]
    z = sum(unnorm)
    got = product_of_experts([a, b, c], [1.0, -0.25, 0.5])
    torch.testing.assert_close(got, torch.tensor([LOG(u / z) for u in unnorm]), rtol=0, atol=1e-6)
    assert two_expert_weights(-0.3, "generation") == pytest.approx((1.3, -0.3))
    assert two_expert_weights(-0.3, "next_token") == pytest.approx((1.0, -0.3))
    with pytest.raises(ValueError, match="form"):  # the boundary that refuses a form: the option object
        from cblight.options import Boosting

        Boosting(mode="last_k", k=2, alpha=0.1, form="bogus")


def test_alpha_zero_is_base_model():
    torch.manual_seed(0)
    full = torch.log_softmax(torch.randn(4, 11), -1)
    short = torch.log_softmax(torch.randn(4, 11), -1)
    for form in ("next_token", "generation"):
        torch.testing.assert_close(boosted_log_probs(full, short, 0.0, form), full, rtol=0, atol=1e-6)


def test_generation_form_equals_base_when_short_equals_full():
    torch.manual_seed(1)
    full = torch.log_softmax(torch.randn(3, 7), -1)
    for alpha in (-0.4, -0.05, 0.3):
        torch.testing.assert_close(
            boosted_log_probs(full, full, alpha, "generation"), full, atol=1e-6, rtol=0
        )
    # next-token form gives (1 + alpha) log f_max: a tempered base model whose ranking flips below -1
    got = boosted_log_probs(full, full, -1.5, "next_token")
    assert torch.equal(got.argmax(-1), full.argmin(-1))


def test_minus_inf_handling_is_nan_free():
    full = torch.tensor([[LOG(0.5), LOG(0.5), -math.inf, -math.inf]])
    short = torch.tensor([[LOG(0.5), -math.inf, LOG(0.5), -math.inf]])
    mixed = mix_log_probs([full, short], [1.0, -0.5])
    # token 1: excluded by the short expert only, negative weight -> +inf; token 2/3: excluded by full -> -inf
    assert mixed[0, 1] == math.inf and mixed[0, 2] == -math.inf and mixed[0, 3] == -math.inf
    out = normalize_log_scores(mixed)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.exp(), torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    # positive weights: -inf anywhere stays -inf, the rest renormalises
    out = product_of_experts([full, short], [1.0, 0.5])
    torch.testing.assert_close(out.exp(), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    # zero weight ignores the expert entirely, even its -inf
    out = product_of_experts([full, short], [1.0, 0.0])
    torch.testing.assert_close(out, torch.log_softmax(full, -1))


def test_per_row_weights_are_each_rows_scalar_mix():
    # one weight per row mixes every row exactly as that row's number would (the -inf rules included)
    full = torch.tensor([[0.0, -1.0, -math.inf], [-0.5, -math.inf, -2.0], [-1.0, -2.0, -3.0]])
    short = torch.tensor([[-math.inf, -0.5, -1.0], [-1.0, -0.1, -math.inf], [-math.inf, -1.0, -2.0]])
    w_short = [-0.5, 0.7, 0.0]
    mixed = mix_log_probs([full, short], [torch.ones(3, 1), torch.tensor(w_short).view(3, 1)])
    for i, w in enumerate(w_short):
        expected = mix_log_probs([full[i : i + 1], short[i : i + 1]], [1.0, w])
        torch.testing.assert_close(mixed[i : i + 1], expected, rtol=0, atol=0)
    # by hand, to float32 rounding (values near 1: 1e-6 is a few float32 ulps)
    assert mixed[0].tolist() == pytest.approx(
        [math.inf, -1.0 - 0.5 * -0.5, -math.inf], abs=1e-6
    )  # forced, vetoed
    assert mixed[1].tolist() == pytest.approx(
        [-0.5 + 0.7 * -1.0, -math.inf, -math.inf], abs=1e-6
    )  # short vetoes
    assert mixed[2].tolist() == full[2].tolist()  # weight 0 ignores f_short's -inf


def test_short_context_ids():
    assert short_context_ids([5, 6, 7, 8], 2) == [7, 8]
    assert short_context_ids([5, 6, 7, 8], 10) == [5, 6, 7, 8]
    # BOS-prefixed models keep BOS in front of the short window
    assert short_context_ids([1, 6, 7, 8], 2, special_prefix=[1]) == [1, 7, 8]
    assert short_context_ids([1, 6, 7, 8], 3, special_prefix=[1]) == [1, 6, 7, 8]
    with pytest.raises(ValueError, match="k must be an integer >= 1"):  # refused by the option object
        from cblight.options import Boosting

        Boosting(mode="last_k", k=0)


def test_alpha_grid():
    grid = AlphaGrid(2.0, -5.0, 0.01).values()
    assert len(grid) == 701 and grid[0] == 2.0 and grid[-1] == -5.0
    assert -1.0 in grid and 0.0 in grid and -4.19 in grid
    assert AlphaGrid(0.0, -1.0, 0.1).values() == [
        0.0,
        -0.1,
        -0.2,
        -0.3,
        -0.4,
        -0.5,
        -0.6,
        -0.7,
        -0.8,
        -0.9,
        -1.0,
    ]
    assert AlphaGrid(-1.0, 0.0, 0.5).values() == [-1.0, -0.5, 0.0]
    with pytest.raises(ValueError, match="positive"):
        AlphaGrid(0.0, -1.0, 0.0).values()


def test_choice_accuracy_curve_by_hand():
    # two questions, two choices each. Q0: full favours choice 0, short favours choice 0 strongly.
    ll_full = torch.tensor([[-1.0, -2.0], [-3.0, -2.5]])
    ll_short = torch.tensor([[-0.5, -4.0], [-1.0, -3.0]])
    labels = torch.tensor([1, 0])
    alphas = torch.tensor([0.0, -1.0, -2.0])
    # alpha=0: preds [0, 1] -> 0/2; alpha=-1: Q0 -0.5 vs 2.0 -> 1, Q1 -2.0 vs 0.5 -> 1 -> 1/2
    # alpha=-2: Q0 0 vs 6 -> 1, Q1 -1 vs 3.5 -> 1 -> 1/2
    curve = choice_accuracy_curve(ll_full, ll_short, labels, alphas)
    assert curve.tolist() == [0.0, 0.5, 0.5]
    assert first_argmax(curve) == 1  # tie: the first alpha in grid order
    assert choice_accuracy_curve(ll_full, ll_short, labels, torch.tensor([-1.0])).tolist() == [0.5]
    # length normalisation divides each choice's score by its length in characters
    lengths = torch.tensor([[1.0, 10.0], [1.0, 1.0]])
    preds = choice_predictions(ll_full, ll_short, 0.0, lengths)
    assert preds.tolist() == [1, 1]  # -1/1 < -2/10


def test_choice_ties_go_to_first_choice_and_ragged_choices():
    ll_full = torch.tensor([[-1.0, -1.0, -math.inf]])
    ll_short = torch.tensor([[0.0, 0.0, 0.0]])
    assert choice_predictions(ll_full, ll_short, -0.7).tolist() == [0]
    # a padded (missing) third choice never wins even with a huge alpha
    ll_short = torch.tensor([[-5.0, -5.0, -100.0]])
    assert choice_predictions(ll_full, ll_short, -3.0).tolist() == [0]


def test_next_token_alpha_sweep_against_loop():
    torch.manual_seed(3)
    full = torch.log_softmax(torch.randn(5, 13), -1)
    short = torch.log_softmax(torch.randn(5, 13), -1)
    targets = torch.randint(0, 13, (5,))
    alphas = torch.tensor([0.5, 0.0, -0.3, -1.0, -2.0])
    out = next_token_alpha_sweep(full, short, targets, alphas)
    for j, a in enumerate(alphas.tolist()):
        mixed = full + a * short
        lp = torch.log_softmax(mixed, -1)
        for i in range(5):
            t = int(targets[i])
            assert bool(out["correct"][i, j]) == (int(mixed[i].argmax()) == t)
            assert int(out["rank"][i, j]) == 1 + int((mixed[i] > mixed[i, t]).sum())
            assert float(out["log_prob"][i, j]) == pytest.approx(float(lp[i, t]), abs=1e-5)


def test_stderr():
    assert binomial_stderr(0.5, 100) == pytest.approx(0.05)
    assert math.isnan(binomial_stderr(0.5, 0))


def test_choice_sweep_follows_the_log_likelihoods_device():
    """The alpha grid moves to the scores' device (it broke the multiple-choice sweep on CUDA: cached
    log-likelihoods live on the GPU, the grid on the CPU). The meta device stands in for a GPU here."""
    from cblight.boosting import choice_scores

    ll = torch.zeros(3, 2, device="meta")
    assert choice_scores(ll, ll, torch.tensor([0.0, -1.0])).shape == (2, 3, 2)
    assert choice_scores(ll, ll, torch.tensor([0.0, -1.0])).device.type == "meta"
