"""Batched scoring against naive one-at-a-time model calls (padding and batching change nothing).

Tolerances: float32 log-probs (magnitude ~10) from batched, padded, shared-context forwards against one
forward per context differ by float32 summation order only, ~1e-6; 1e-5 leaves 10x room and is still far
below a wrong position or token (>1e-2).
"""

import pytest
import torch

from cblight.batching import default_window_chunk, windowed_log_probs, windowed_positions
from cblight.models import ModelLoadError, load_causal_lm, load_tokenizer
from cblight.scoring import Encoder, Scorer, ScoringError, special_prefix

GROUPS = [
    ("The quick brown fox", [" jumps over the lazy dog", " is", " sat on a mat today, or so they say"]),
    ("Question: what is the capital of France?\nAnswer:", [" Paris", " a large city in the north"]),
    ("A", [" b"]),
    ("", [" the answer is: yes", " no"]),  # empty context -> BOS/EOS alone
    (
        "She opened the door because the bell rang, so he went home and the rest of the story is long",
        [" because", " so it goes"],
    ),
]


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    return load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))


def naive_logprobs(model, ids):
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)


def naive_continuation(model, ctx, cont):
    lp = naive_logprobs(model, ctx + cont[:-1])
    toks = [float(lp[len(ctx) - 1 + j, t]) for j, t in enumerate(cont)]
    greedy = all(int(lp[len(ctx) - 1 + j].argmax()) == t for j, t in enumerate(cont))
    return sum(toks), toks, greedy


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_continuations_match_naive(lm, share, batch_size):
    model, tok = lm
    scorer = Scorer(model, tok, batch_size=batch_size, share_context=share)
    enc = Encoder(tok)
    results = scorer.score_text(GROUPS)
    for (ctx, conts), scores in zip(GROUPS, results):
        assert len(scores) == len(conts)
        for cont, score in zip(conts, scores):
            ctx_ids, cont_ids = enc.pair(ctx, cont)
            total, toks, greedy = naive_continuation(model, ctx_ids, cont_ids)
            assert score.num_tokens == len(cont_ids)
            assert score.log_prob == pytest.approx(total, abs=1e-5)
            assert list(score.token_log_probs) == pytest.approx(toks, abs=1e-5)
            assert score.is_greedy == greedy


def test_greedy_flag_true_for_the_greedy_continuation(lm):
    model, tok = lm
    enc = Encoder(tok)
    ctx = enc.context("The quick brown fox")
    ids = list(ctx)
    for _ in range(3):
        ids.append(int(naive_logprobs(model, ids)[-1].argmax()))
    greedy_cont = ids[len(ctx) :]
    other = [(greedy_cont[0] + 1) % len(tok)] + greedy_cont[1:]
    scores = Scorer(model, tok, batch_size=4).score_choices([(ctx, [greedy_cont, other])])[0]
    assert scores[0].is_greedy and not scores[1].is_greedy


def test_boundary_follows_lm_eval(gpt2_tokenizer):
    enc = Encoder(gpt2_tokenizer)
    # trailing space of the context moves into the continuation
    ctx, cont = enc.pair("The answer is: ", "yes")
    assert gpt2_tokenizer.decode(ctx) == "The answer is:" and gpt2_tokenizer.decode(cont) == " yes"
    ctx, cont = enc.pair("This quote has a tone that is", " very negative.<|endoftext|>")
    assert (
        cont[-1] == gpt2_tokenizer.eos_token_id
        and gpt2_tokenizer.decode(cont) == " very negative.<|endoftext|>"
    )
    assert enc.context("") == [gpt2_tokenizer.eos_token_id]
    with pytest.raises(ScoringError, match="no tokens"):
        enc.pair("abc", "")


def test_llama_prefix_is_bos(tiny_llama_dir):
    tok = load_tokenizer(str(tiny_llama_dir))
    assert special_prefix(tok) == [tok.bos_token_id]
    enc = Encoder(tok)
    assert enc.context("") == [tok.bos_token_id]
    ctx, _ = enc.pair(" the answer is:", " yes")
    assert ctx[0] == tok.bos_token_id


def test_left_truncation_keeps_continuation(lm):
    model, tok = lm
    scorer = Scorer(model, tok, batch_size=4, max_length=12)
    enc = Encoder(tok)
    ctx, cont = enc.pair(
        "one two three four five six seven eight nine ten eleven twelve thirteen", " fourteen"
    )
    cut = scorer.truncate(ctx, [cont])
    assert len(cut) + len(cont) - 1 == 12
    assert cut[-3:] == ctx[-3:]
    if enc.prefix:
        assert cut[: len(enc.prefix)] == enc.prefix
    score = scorer.score_choices([(ctx, [cont])])[0][0]
    total, _, _ = naive_continuation(model, cut, cont)
    assert score.log_prob == pytest.approx(total, abs=1e-5)
    with pytest.raises(ScoringError, match="exceeds the model window"):
        scorer.score_choices([(ctx, [list(range(5, 18))])])


def test_next_token_and_last_k_match_naive(lm):
    model, tok = lm
    enc = Encoder(tok)
    scorer = Scorer(model, tok, batch_size=2)
    texts = [
        "In my palm is a clear stone, and inside it",
        "Short one",
        "A much longer passage that goes on and on",
    ]
    ctxs = [enc.context(t) for t in texts]
    full = scorer.next_token_log_probs(ctxs)
    for i, c in enumerate(ctxs):
        torch.testing.assert_close(full[i], naive_logprobs(model, c)[-1], atol=1e-5, rtol=0)
    for k in (1, 3, 5):
        short = scorer.last_k_log_probs(ctxs, k, full=full)
        for i, c in enumerate(ctxs):
            body = c[len(enc.prefix) :]
            window = (
                enc.prefix + body[-k:]
            )  # short context at positions 0..k-1, after BOS when the model has one
            torch.testing.assert_close(short[i], naive_logprobs(model, window)[-1], atol=1e-5, rtol=0)
    # a context no longer than k gives f_k == f_max
    short = scorer.last_k_log_probs(ctxs, 50, full=full)
    torch.testing.assert_close(short, full)


def test_windowed_log_probs_match_naive(lm):
    model, tok = lm
    enc = Encoder(tok)
    k = 3
    seqs = [enc.context("the quick brown fox jumps over the lazy dog"), enc.context("a short one here")]
    width = max(len(s) for s in seqs)
    ids = torch.full((2, width), tok.pad_token_id)
    mask = torch.zeros((2, width), dtype=torch.long)
    for i, s in enumerate(seqs):  # left padding, as generated batches have
        ids[i, width - len(s) :] = torch.tensor(s)
        mask[i, width - len(s) :] = 1
    wanted = torch.ones_like(mask)
    rows, cols = windowed_positions(mask, k, wanted, n_prefix=len(enc.prefix))
    got = windowed_log_probs(model, ids, rows, cols, k, prefix=enc.prefix, chunk_size=4)
    dists = windowed_log_probs(model, ids, rows, cols, k, prefix=enc.prefix, gather_targets=False)
    n_expected = sum(max(0, len(s) - len(enc.prefix) - k - 1) for s in seqs)
    assert got.shape == (n_expected,) and dists.shape == (n_expected, len(tok))
    for n, (r, c) in enumerate(zip(rows.tolist(), cols.tolist())):
        window = enc.prefix + ids[r, c - k : c].tolist()
        ref = naive_logprobs(model, window)[-1]
        assert float(got[n]) == pytest.approx(float(ref[ids[r, c]]), abs=1e-5)
        torch.testing.assert_close(dists[n], ref, atol=1e-5, rtol=0)
    assert (
        default_window_chunk(torch.device("cpu")) == 32 and default_window_chunk(torch.device("cuda")) == 256
    )
    with pytest.raises(ValueError, match="chunk_size"):  # refused by the public entry point that takes it
        from cblight.metrics import generated_token_log_probs

        generated_token_log_probs(model, [seqs[0]], [seqs[1]], k=k, chunk_size=0)


def test_bad_inputs(lm, tmp_path):
    model, tok = lm
    scorer = Scorer(model, tok, batch_size=2)
    with pytest.raises(ScoringError, match="no continuations"):
        scorer.score_choices([([1, 2], [])])
    with pytest.raises(ValueError, match="batch_size"):
        Scorer(model, tok, batch_size=0)
    with pytest.raises(ModelLoadError, match="no directory"):
        load_causal_lm(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="not a model directory"):
        load_causal_lm(str(tmp_path / "empty"))
    with pytest.raises(ModelLoadError, match="Hub is disabled"):
        load_causal_lm("no-such-org/no-such-model")
