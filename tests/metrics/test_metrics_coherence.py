"""LTF, delta and perplexity against the authors' ``generation/metrics/likelihoods.py`` logic,
re-implemented naively: one unpadded full pass per document and one model call per short window
``tokens[max(0, t-k):t]`` over prompt + generation (after the special prefix, which heads every window)."""

import math
import random

import pytest
import torch

from cblight.metrics import (
    ContextSensitivity,
    context_sensitivity,
    generated_token_log_probs,
    generation_table,
    long_range_repetition,
    repetition_rate,
    self_bleu,
    zipf_coefficient,
)
from cblight.models import load_causal_lm, load_tokenizer
from cblight.scoring import Encoder

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A",
    "Question: what is the capital of France? Answer: Paris. The answer is: yes, it is.",
    "She opened the door because the bell rang, so he went home.",
    "Title: Markets rally.",
]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir))
    tok = load_tokenizer(str(tiny_model_dir))
    return model, tok


def documents(tok, gen_lengths=(40, 3, 25, 0, 31), seed=0):
    enc = Encoder(tok)
    rng = random.Random(seed)
    vocab = len(tok)
    ctxs = [enc.context(p) for p in PROMPTS]
    gens = [[rng.randrange(vocab) for _ in range(n)] for n in gen_lengths]
    return enc.prefix, ctxs, gens


def naive_log_probs(model, ctx, gen, k, prefix):
    def last_log_probs(ids):
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)

    tokens = ctx + gen
    lp = last_log_probs(tokens)
    full = [float(lp[len(ctx) - 1 + i, g]) for i, g in enumerate(gen)]
    content = tokens[len(prefix) :]
    short = []
    for i, g in enumerate(gen):
        t = len(ctx) - len(prefix) + i
        window = prefix + content[max(0, t - k) : t]
        short.append(float(last_log_probs(window)[-1, g]))
    return full, short


def threshold_in_gap(values, q):
    """A threshold near quantile ``q`` in a gap between values, so float noise cannot flip a count."""
    vals = sorted(values)
    i = int(q * len(vals))
    while i + 1 < len(vals) and vals[i + 1] - vals[i] < 1e-4 * vals[i + 1]:
        i += 1
    return (vals[i] + vals[i + 1]) / 2


@pytest.mark.parametrize("k", [5, 20])
def test_per_token_log_probs_match_authors_loop(lm, k):
    model, tok = lm
    prefix, ctxs, gens = documents(tok)
    got = generated_token_log_probs(model, ctxs, gens, k=k, prefix=prefix, batch_size=2, chunk_size=7)
    n_windowed = 0
    for (full, short), ctx, gen in zip(got, ctxs, gens):
        ref_full, ref_short = naive_log_probs(model, ctx, gen, k, prefix)
        assert full.dtype == torch.float32 and full.shape == (len(gen),) and short.shape == (len(gen),)
        # batched 20-token windows vs one forward per window: float32 matmul order, ~1e-6 on log-probs ~10
        torch.testing.assert_close(full, torch.tensor(ref_full), atol=2e-5, rtol=0)
        torch.testing.assert_close(short, torch.tensor(ref_short), atol=2e-5, rtol=0)
        n_windowed += int((full - short).abs().gt(1e-3).sum())
    assert n_windowed > 10  # the short windows really differ from the full context somewhere


def test_ltf_delta_ppl_match_authors_formulas(lm):
    model, tok = lm
    prefix, ctxs, gens = documents(tok, seed=1)
    k = 4
    ref_full, ref_short = [], []
    for ctx, gen in zip(ctxs, gens):
        f, s = naive_log_probs(model, ctx, gen, k, prefix)
        ref_full += f
        ref_short += s
    p_full = [math.exp(v) for v in ref_full]
    p_short = [math.exp(v) for v in ref_short]
    # a random tiny model never reaches the paper's 0.2 / 0.05: place the thresholds inside its range
    hi, lo = threshold_in_gap(p_full, 0.3), threshold_in_gap(p_short, 0.7)
    ltf = sum(pf > hi and ps < lo for pf, ps in zip(p_full, p_short)) / len(p_full)
    delta = sum(pf - ps for pf, ps in zip(p_full, p_short)) / len(p_full)
    ppl = math.exp(-sum(ref_full) / len(ref_full))
    assert 0 < ltf < 1

    scored = generated_token_log_probs(model, ctxs, gens, k=k, prefix=prefix)
    metric = ContextSensitivity(full_threshold=hi, short_threshold=lo)
    for full, short in scored:  # per-document updates accumulate
        metric.update(full, short)
    got = metric.compute()
    # ltf is a count over a count (exact up to one float64 rounding). The reference takes p = exp of the
    # same float32 log-probs in float64, the metric may sum in another order: delta's ~100 terms of size
    # <= 1 agree to ~1e-14, so 1e-8 is loose yet far below any real difference (1/100 of one token's p).
    # ppl exponentiates a mean of float32 log-probs: 1e-5 relative covers float32 summation order.
    assert float(got["ltf"]) == pytest.approx(ltf, abs=1e-12)
    assert float(got["delta"]) == pytest.approx(delta, abs=1e-8)
    assert float(got["ppl"]) == pytest.approx(ppl, rel=1e-5)

    # the functional form, with the paper's thresholds: nothing is long-dependent for a random model
    out = context_sensitivity(model, ctxs, gens, k=k, prefix=prefix, batch_size=3)
    assert out["ltf"] == 0.0
    assert out["delta"] == pytest.approx(delta, abs=1e-8)
    assert out["ppl"] == pytest.approx(ppl, rel=1e-5)


def test_hand_computed_ltf_and_delta():
    metric = ContextSensitivity()
    full = torch.log(torch.tensor([0.5, 0.3, 0.1, 0.9]))
    short = torch.log(torch.tensor([0.01, 0.3, 0.01, 0.04]))
    metric.update(full, short)
    got = metric.compute()
    # long-dependent: 0.5/0.01 and 0.9/0.04; 0.3/0.3 fails p_short < 0.05, 0.1/0.01 fails p_full > 0.2
    assert float(got["ltf"]) == pytest.approx(0.5)
    assert float(got["delta"]) == pytest.approx((0.49 + 0.0 + 0.09 + 0.86) / 4)
    assert float(got["ppl"]) == pytest.approx((0.5 * 0.3 * 0.1 * 0.9) ** -0.25)


def test_generation_table_units(tiny_gpt2_dir):
    model = load_causal_lm(str(tiny_gpt2_dir))
    rng = random.Random(0)
    ctxs = [[rng.randrange(50257) for _ in range(8)] for _ in range(6)]
    gens = [[rng.randrange(40) for _ in range(rng.randrange(30, 130))] for _ in range(6)]
    gens[2] = [5, 6, 7] * 20 + [50256]
    table = generation_table(model, ctxs, gens, eos_token_id=50256, self_bleu_samples=4, k=20)
    assert list(table) == ["ppl", "self_bleu4", "zipf", "rep", "lr_50", "lr_100", "delta", "ltf"]
    base = context_sensitivity(model, ctxs, gens, k=20)
    lr = long_range_repetition(gens)
    assert table["ppl"] == pytest.approx(base["ppl"])
    assert table["delta"] == pytest.approx(100 * base["delta"])
    assert table["ltf"] == pytest.approx(100 * base["ltf"])
    assert table["self_bleu4"] == pytest.approx(self_bleu(gens, 4, 4, 0))  # a fraction, as the paper
    assert table["zipf"] == pytest.approx(zipf_coefficient(gens))
    assert (
        table["rep"]
        == pytest.approx(100 * repetition_rate(gens, eos_token_id=50256))
        == pytest.approx(100 / 6)
    )
    assert table["lr_50"] == pytest.approx(100 * lr["lr_50"]) and table["lr_50"] > 1
    assert table["lr_100"] == pytest.approx(100 * lr["lr_100"])


def test_bad_inputs(lm):
    model, tok = lm
    prefix, ctxs, gens = documents(tok)
    with pytest.raises(ValueError, match="5 contexts but 4 generations"):
        generated_token_log_probs(model, ctxs, gens[:4], prefix=prefix)
    with pytest.raises(ValueError, match=r"contexts\[0\] has no tokens"):
        generated_token_log_probs(model, [list(prefix)], [[1, 2]], prefix=prefix)
    with pytest.raises(ValueError, match="k must be an integer >= 1, got 0"):
        generated_token_log_probs(model, ctxs, gens, k=0, prefix=prefix)
    with pytest.raises(ValueError, match="document 0 has 300 tokens; the model reads at most 256"):
        generated_token_log_probs(model, [ctxs[0][:1] * 200], [[1] * 100], prefix=prefix)
    if prefix:
        with pytest.raises(ValueError, match="does not start with the special prefix"):
            generated_token_log_probs(model, [ctxs[0][len(prefix) :]], [[1, 2]], prefix=prefix)
    with pytest.raises(ValueError, match=r"full_threshold must be a number in \[0, 1\], got 2.0"):
        ContextSensitivity(full_threshold=2.0)
    metric = ContextSensitivity()
    with pytest.raises(ValueError, match="must be finite"):
        metric.update(torch.tensor([-float("inf")]), torch.tensor([-1.0]))
    with pytest.raises(ValueError, match="2 full-context log-probs but 1"):
        metric.update(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0]))
    with pytest.raises(ValueError, match="at least one generated token"):
        metric.compute()
