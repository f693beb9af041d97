"""Label-free alpha and k rules (cblight.adaptive; docs/adaptive.md) against hand computations.

Tolerances: the per-row mixing runs in float32 on hand-computed float64 references of magnitude ~1, so
float32 rounding (~1e-7) gives 1e-6; divergences and slopes are computed in float64 (choice rules) or
float32 sums over a handful of entries (token rules), so 1e-6 as well.
"""

import math

import pytest
import torch

from cblight.adaptive import (
    GATE_BITS,
    PRIOR_SHARE,
    balance_alpha,
    choice_alphas,
    choice_jsd_alpha,
    cocoa_alpha,
    context_gain,
    decorrelate_alpha,
    gated_alpha,
    js_divergence,
    jsd_alpha,
    jsdist_alpha,
    prior_ranks,
    prior_share,
    same_prior_everywhere,
    token_alphas,
    unit_k,
)
from cblight.boosting import boosted_log_probs, choice_scores

LOG = math.log


def logs(*ps):
    return torch.tensor([[LOG(p) if p > 0 else -math.inf for p in ps]], dtype=torch.float64)


def jsd_bits_by_hand(p, q):
    m = [(a + b) / 2 for a, b in zip(p, q)]
    kl = lambda x: sum(a * LOG(a / c) for a, c in zip(x, m) if a > 0)  # noqa: E731
    return 0.5 * (kl(p) + kl(q)) / LOG(2)


def test_js_divergence_by_hand():
    # P = (.5, .5), Q = (1, 0): M = (.75, .25); KL(P||M) = .5 ln(2/3) + .5 ln 2, KL(Q||M) = ln(4/3)
    expected = 0.5 * ((0.5 * LOG(2 / 3) + 0.5 * LOG(2)) + LOG(4 / 3)) / LOG(2)
    assert expected == pytest.approx(0.311278, abs=1e-6)
    got = js_divergence(logs(0.5, 0.5), logs(1.0, 0.0))
    assert float(got) == pytest.approx(expected, abs=1e-9)
    assert float(js_divergence(logs(0.2, 0.8), logs(0.2, 0.8))) == pytest.approx(0.0, abs=1e-12)
    assert float(js_divergence(logs(1.0, 0.0), logs(0.0, 1.0))) == pytest.approx(1.0, abs=1e-12)
    p, q = (0.5, 0.3, 0.2), (0.7, 0.2, 0.1)
    assert float(js_divergence(logs(*p), logs(*q))) == pytest.approx(jsd_bits_by_hand(p, q), abs=1e-9)


def test_jsd_alpha_is_adacad_in_both_forms():
    p, q = (0.5, 0.3, 0.2), (0.7, 0.2, 0.1)
    a = jsd_bits_by_hand(p, q)
    full, short = logs(*p).float(), logs(*q).float()
    assert float(jsd_alpha(full, short, "generation")) == pytest.approx(-a, abs=1e-6)
    assert float(jsd_alpha(full, short, "next_token")) == pytest.approx(-a / (1 + a), abs=1e-6)
    assert float(token_alphas("jsd", full, short, "generation")) == pytest.approx(-a, abs=1e-6)
    # the generation form with alpha = -a is AdaCAD's (1 + a) log f_max - a log f_short, normalised
    unnorm = [x ** (1 + a) * y**-a for x, y in zip(p, q)]
    expected = torch.tensor([[LOG(u / sum(unnorm)) for u in unnorm]])
    got = boosted_log_probs(full, short, jsd_alpha(full, short, "generation"), "generation")
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    # the next-token alpha -a/(1+a) has the same argmax
    nt = jsd_alpha(full, short, "next_token")
    assert boosted_log_probs(full, short, nt).argmax() == got.argmax()
    # identical experts: no divergence, no boosting
    assert float(jsd_alpha(full, full)) == 0.0


def test_jsdist_alpha_is_the_distance_in_adacads_mix():
    p, q = (0.5, 0.3, 0.2), (0.7, 0.2, 0.1)
    d = math.sqrt(jsd_bits_by_hand(p, q))  # the Jensen-Shannon distance: 0.18 where the JSD is 0.03
    full, short = logs(*p).float(), logs(*q).float()
    assert float(jsdist_alpha(full, short, "generation")) == pytest.approx(-d, abs=1e-6)
    assert float(jsdist_alpha(full, short, "next_token")) == pytest.approx(-d / (1 + d), abs=1e-6)
    assert float(token_alphas("jsdist", full, short, "generation")) == pytest.approx(-d, abs=1e-6)
    assert float(jsdist_alpha(full, full)) == 0.0


def test_per_row_alpha_matches_scalar_boosting_row_by_row():
    torch.manual_seed(0)
    full = torch.log_softmax(torch.randn(4, 7), -1)
    short = torch.log_softmax(torch.randn(4, 7), -1)
    alpha = torch.tensor([0.0, -0.3, -1.0, 0.4])
    for form in ("next_token", "generation"):
        got = boosted_log_probs(full, short, alpha, form)
        for i in range(4):
            expected = boosted_log_probs(full[i : i + 1], short[i : i + 1], float(alpha[i]), form)
            torch.testing.assert_close(got[i : i + 1], expected, rtol=0, atol=1e-6)
    # alpha = 0 is f_max exactly
    torch.testing.assert_close(boosted_log_probs(full, short, torch.zeros(4))[0], full[0], rtol=0, atol=1e-6)


def test_per_row_alpha_infinities_follow_the_product_of_experts():
    full = logs(0.5, 0.5, 0.0).float()
    short = logs(0.0, 0.6, 0.4).float()
    # f_max rules out token 2: it stays out; f_short (weight -0.5) rules out token 0: all mass goes there
    got = boosted_log_probs(full, short, torch.tensor([-0.5]))
    torch.testing.assert_close(got.exp(), torch.tensor([[1.0, 0.0, 0.0]]), rtol=0, atol=1e-7)
    torch.testing.assert_close(got, boosted_log_probs(full, short, -0.5), rtol=0, atol=0)
    # a positive short weight vetoes what f_short rules out
    got = boosted_log_probs(full, short, torch.tensor([0.5]))
    torch.testing.assert_close(got, boosted_log_probs(full, short, 0.5), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# multiple choice


LL_FULL = torch.tensor([[-2.0, -1.0, -3.0], [-1.5, -2.5, -math.inf], [-4.0, -2.0, -1.0]], dtype=torch.float64)
LL_SHORT = torch.tensor([[-1.0, -0.5, -4.0], [-2.0, -1.0, 0.0], [-3.0, -3.0, -0.5]], dtype=torch.float64)


def test_choice_scores_with_an_alpha_per_question_is_eq2_row_by_row():
    alpha = torch.tensor([-1.0, 0.5, -0.25], dtype=torch.float64)
    got = choice_scores(LL_FULL, LL_SHORT, alpha.view(-1, 1))
    assert got.shape == (3, 3)
    for i in range(3):
        expected = choice_scores(LL_FULL[i : i + 1], LL_SHORT[i : i + 1], float(alpha[i]))
        torch.testing.assert_close(got[i : i + 1], expected, rtol=0, atol=0)
    assert math.isinf(float(got[1, 2]))  # a missing answer stays missing


def test_choice_jsd_alpha_by_hand():
    def softmax(xs):
        z = sum(math.exp(x) for x in xs)
        return [math.exp(x) / z for x in xs]

    got = choice_jsd_alpha(LL_FULL, LL_SHORT)
    for i, n in enumerate((3, 2, 3)):
        a = jsd_bits_by_hand(softmax(LL_FULL[i, :n].tolist()), softmax(LL_SHORT[i, :n].tolist()))
        assert float(got[i]) == pytest.approx(-a / (1 + a), abs=1e-9)


def test_decorrelate_alpha_by_hand():
    # centre each question on its own answers, then the pooled slope of full on premise-free scores
    num = den = 0.0
    for i, n in enumerate((3, 2, 3)):
        f, s = LL_FULL[i, :n].tolist(), LL_SHORT[i, :n].tolist()
        fm, sm = sum(f) / n, sum(s) / n
        num += sum((x - fm) * (y - sm) for x, y in zip(f, s))
        den += sum((y - sm) ** 2 for y in s)
    assert decorrelate_alpha(LL_FULL, LL_SHORT) == pytest.approx(-num / den, abs=1e-12)
    # after boosting with it the pooled within-question covariance is zero
    alpha = decorrelate_alpha(LL_FULL, LL_SHORT)
    boosted = choice_scores(LL_FULL, LL_SHORT, alpha)
    cov = 0.0
    for i, n in enumerate((3, 2, 3)):
        b, s = boosted[i, :n].tolist(), LL_SHORT[i, :n].tolist()
        bm, sm = sum(b) / n, sum(s) / n
        cov += sum((x - bm) * (y - sm) for x, y in zip(b, s))
    assert cov == pytest.approx(0.0, abs=1e-9)
    # a fixed answer set with a constant premise-free context (SST-2): the mean boosted margin is zero
    full = torch.tensor([[-1.0, -2.0], [-0.5, -3.0], [-2.0, -1.5]], dtype=torch.float64)
    short = torch.tensor([[-0.7, -1.9]] * 3, dtype=torch.float64)
    alpha = decorrelate_alpha(full, short)
    margin = choice_scores(full, short, alpha)
    assert float((margin[:, 0] - margin[:, 1]).mean()) == pytest.approx(0.0, abs=1e-12)
    assert decorrelate_alpha(full, torch.zeros_like(full)) == 0.0


def test_cocoa_alpha_by_hand():
    p, q = [0.6, 0.3, 0.1, 0.0], [0.2, 0.2, 0.5, 0.1]
    renyi = -2 * LOG(sum(math.sqrt(a * b) for a, b in zip(p, q)))  # order 1/2, nats
    a = (1 - math.exp(-renyi)) * (1 - (0.6 - 0.3))  # falls as f_max's top-two margin grows
    full, short = logs(*p).float(), logs(*q).float()
    torch.testing.assert_close(cocoa_alpha(full, short, "generation"), torch.tensor([-a]), atol=1e-6, rtol=0)
    torch.testing.assert_close(cocoa_alpha(full, short), torch.tensor([-a / (1 + a)]), atol=1e-6, rtol=0)
    torch.testing.assert_close(token_alphas("cocoa", full, short), cocoa_alpha(full, short))
    # identical experts, or a one-hot f_max (margin 1), leave the base model
    assert float(cocoa_alpha(full, full)) == pytest.approx(0.0, abs=1e-6)
    assert float(cocoa_alpha(logs(1.0, 0.0, 0.0).float(), logs(0.2, 0.3, 0.5).float())) == 0.0


def test_context_gain_and_gate_by_hand():
    # the JSD in bits of each question's two answer distributions, their mean and its standard error
    full = torch.tensor([[-0.1, -2.5], [-2.0, -0.2], [-0.3, -1.5], [-1.0, -0.5]], dtype=torch.float64)
    short = torch.tensor([[-1.0, -0.5], [-0.4, -1.2], [-0.7, -0.7], [-0.9, -0.6]], dtype=torch.float64)

    def softmax(row):
        z = [math.exp(v) for v in row]
        return [v / sum(z) for v in z]

    js = [jsd_bits_by_hand(softmax(f), softmax(s)) for f, s in zip(full.tolist(), short.tolist())]
    mean = sum(js) / 4
    stderr = math.sqrt(sum((v - mean) ** 2 for v in js) / 3 / 4)
    gain, se = context_gain(full, short)
    assert gain == pytest.approx(mean, abs=1e-9)
    assert se == pytest.approx(stderr, abs=1e-9)
    # four questions cannot tell (the mean minus two standard errors is below the gate): no boosting
    assert mean - 2 * stderr < GATE_BITS
    assert gated_alpha(full, short) == 0.0
    # the same questions many times over: the gate opens and the rule is decorrelate's
    many_full, many_short = full.repeat(100, 1), short.repeat(100, 1)
    assert context_gain(many_full, many_short)[0] == pytest.approx(mean, abs=1e-9)
    assert mean >= GATE_BITS + 0.03
    assert gated_alpha(many_full, many_short) == decorrelate_alpha(many_full, many_short)
    assert choice_alphas("gated", many_full, many_short, [0.0]).unique().tolist() == [
        decorrelate_alpha(many_full, many_short)
    ]
    # a premise that moves nothing (full = premise-free + a constant per question): gate shut at any size
    flat = short.repeat(100, 1) + torch.arange(400, dtype=torch.float64)[:, None]
    assert context_gain(flat, short.repeat(100, 1))[0] == pytest.approx(0.0, abs=1e-9)
    assert gated_alpha(flat, short.repeat(100, 1)) == 0.0
    # one premise-free score vector for every question (a fixed label set, SST-2): calibration, at any gain
    same = short[:1].repeat(4, 1) + torch.tensor([[0.0, 5e-5]] * 4, dtype=torch.float64) * torch.rand(4, 1)
    assert same_prior_everywhere(full, same) and not same_prior_everywhere(full, short)
    assert context_gain(full, same)[0] - 2 * context_gain(full, same)[1] < GATE_BITS
    assert gated_alpha(full, same) == decorrelate_alpha(full, same) != 0.0
    ragged = full.clone()
    ragged[0, 1] = -math.inf  # a question with another answer set: not one fixed answer set
    assert not same_prior_everywhere(ragged, same)


def test_prior_share_gate_of_a_fixed_label_set_by_hand():
    # three labels after one premise-free context: every question's prior is s = (0, -1, -2), centred
    # p = (1, 0, -1), |p|^2 = 2
    prior = torch.tensor([[0.0, -1.0, -2.0]] * 2, dtype=torch.float64)
    # the bias lies mostly along the prior. Centred full scores: (4/3, 1/3, -5/3) and (0, 1/2, -1/2), so the
    # mean preference m = (2/3, 5/12, -13/12), m.p = 7/4, |m|^2 = 258/144, share = (7/4)^2 / (2 |m|^2)
    along = torch.tensor([[-1.0, -2.0, -4.0], [-2.0, -1.5, -2.5]], dtype=torch.float64)
    share = (7 / 4) ** 2 / (2 * 258 / 144)
    assert share == pytest.approx(0.8547, abs=1e-4) and share >= PRIOR_SHARE
    assert same_prior_everywhere(along, prior)
    assert prior_share(along, prior) == pytest.approx(share, abs=1e-12)
    # decorrelate removes m's part along p: alpha = -(m.p) / |p|^2 = -7/8, and the gate lets it through
    assert decorrelate_alpha(along, prior) == pytest.approx(-7 / 8, abs=1e-12)
    assert gated_alpha(along, prior) == pytest.approx(-7 / 8, abs=1e-12)
    # the bias lies mostly across the prior: centred (5/6, -7/6, 1/3) and (1/3, -5/3, 4/3), m = (7/12,
    # -17/12, 5/6), m.p = -1/4, |m|^2 = 438/144: the prior explains 1 % of the bias, the gate shuts
    across = torch.tensor([[-1.0, -3.0, -1.5], [-2.0, -4.0, -1.0]], dtype=torch.float64)
    share = (1 / 4) ** 2 / (2 * 438 / 144)
    assert prior_share(across, prior) == pytest.approx(share, abs=1e-12) and share < PRIOR_SHARE
    assert decorrelate_alpha(across, prior) == pytest.approx(1 / 8, abs=1e-12)
    assert gated_alpha(across, prior) == 0.0
    # ... even where the premise moves the answers far past the context gain's gate: with one prior for
    # every question the prior share alone decides
    many, many_prior = across.repeat(200, 1), prior[:1].repeat(400, 1)
    gain, se = context_gain(many, many_prior)
    assert gain - 2 * se >= GATE_BITS
    assert prior_share(many, many_prior) == pytest.approx(share, abs=1e-12)
    assert gated_alpha(many, many_prior) == 0.0
    # two labels: every centred vector lies on (1, -1), so the share is 1 whatever the bias (batch
    # calibration, as on SST-2); no preference at all leaves nothing to explain (share 0, decorrelate 0)
    two = torch.tensor([[-0.2, -1.9], [-1.4, -0.3], [-0.6, -0.8]], dtype=torch.float64)
    two_prior = torch.tensor([[-3.0, -1.0]] * 3, dtype=torch.float64)
    assert prior_share(two, two_prior) == pytest.approx(1.0, abs=1e-12)
    assert gated_alpha(two, two_prior) == decorrelate_alpha(two, two_prior) != 0.0
    balanced = torch.tensor([[-1.0, -2.0], [-2.0, -1.0]], dtype=torch.float64)
    assert prior_share(balanced, two_prior[:2]) == 0.0 == gated_alpha(balanced, two_prior[:2])
    # per character (length-normalised eq. 2): the same formula on the scores divided by the lengths
    lengths = torch.tensor([[2, 4, 1]] * 2)
    assert prior_share(along, prior, lengths) == pytest.approx(
        prior_share(along / lengths, prior / lengths), abs=1e-12
    )


def test_prior_ranks_and_balance_alpha_by_hand():
    torch.testing.assert_close(
        prior_ranks(LL_SHORT, LL_FULL), torch.tensor([[1, 0, 2], [1, 0, 2], [1, 2, 0]])
    )
    # two questions of two answers whose premise-free favourite is answer 0
    full = torch.tensor([[-1.0, -1.5], [-1.0, -3.0]], dtype=torch.float64)
    short = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]], dtype=torch.float64)
    # margins answer0 - answer1: q1 = 0.5 + alpha, q2 = 2 + alpha; ties go to answer 0
    # alpha = 0: both pick the favourite (distance 0.5); alpha = -1: q1 picks answer 1 (balanced, 0);
    # alpha = -3: both pick answer 1 (distance 0.5)
    value, distance = balance_alpha(full, short, [0.0, -1.0, -3.0])
    assert value == -1.0
    torch.testing.assert_close(distance, torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64))
    # -1, -1.2 and -0.6 all balance (q1's margin < 0 < q2's): the value closest to 0 wins
    value, _ = balance_alpha(full, short, [-3.0, -1.0, -1.2, -0.6])
    assert value == -0.6
    per_question = choice_alphas("balance", full, short, [0.0, -1.0, -3.0])
    torch.testing.assert_close(per_question, torch.tensor([-1.0, -1.0], dtype=torch.float64))


def test_choice_alphas_dispatch():
    grid = [0.0, -1.0]
    torch.testing.assert_close(
        choice_alphas("jsd", LL_FULL, LL_SHORT, grid), choice_jsd_alpha(LL_FULL, LL_SHORT)
    )
    assert (
        choice_alphas("decorrelate", LL_FULL, LL_SHORT, grid).tolist()
        == [decorrelate_alpha(LL_FULL, LL_SHORT)] * 3
    )
    with pytest.raises(ValueError, match="adaptive must be one of"):  # refused where the rule is an option
        from cblight.evaluate.boosted_evaluator import BoostedEvaluator

        BoostedEvaluator(model="/no/such/model", adaptive="nope")


# ---------------------------------------------------------------------------------------------------------
# k from the input's structure


def test_unit_k_counts_the_last_sentence_and_clause():
    pieces = ["He", " left", ".", " She", " said", ",", ' "', "I", " will", " call"]
    assert unit_k(pieces, "sentence") == 7  # ' She said, "I will call'
    assert unit_k(pieces, "clause") == 4  # ' "I will call'
    assert unit_k([" no", " end", " here"], "sentence") == 3  # the whole context
    assert unit_k(["Done", '."'], "sentence") == 2  # a final end opens no new unit
    assert unit_k(["a", ".", "\n", "b"], "sentence") == 1
    # LAMBADA's development text is tokenised: " . " and " `` " stand alone
    dev = [" he", " nodded", " .", " ``", " i", " 'm", " sure"]
    assert unit_k(dev, "sentence") == 4
