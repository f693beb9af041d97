"""Boosted decoding against independent references (docs/design.md, "Mathematics", paper §4, summarisation appendix).

References: a naive loop that re-runs the model on the explicit full and short contexts at every step
(one prompt at a time: no cache, no padding, no position-id bookkeeping), transformers' plain ``generate``
and its classifier-free guidance (``guidance_scale`` + ``negative_prompt_ids``), and transformers' own
beam search driven by a stateless naive processor.

Tolerances: scores are float32 log-probs of magnitude ~10. A left-padded, KV-cached batch and a
one-prompt-at-a-time reference differ only in float32 summation order, ~1e-6; 1e-5 where both sides run
the same shapes (fused loop vs plain generate), 1e-4 where padding, caches or beams change the shapes
(and a few steps accumulate). A wrong expert or weight moves scores by >1e-2.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, TopPLogitsWarper

from cblight.boosting import log_softmax32, product_of_experts, short_context_ids
from cblight.generate import (
    AfterMarker,
    AfterSeparator,
    Boosting,
    BoostingLogitsProcessor,
    Experts,
    FusedBoostedDecoding,
    LastTokens,
    boosted_generate,
    dialog_prompt,
    experts,
    prepare_prompts,
)
from cblight.generate.inputs import last_occurrence, marker_ids, separator_ids
from cblight.options import as_experts
from cblight.scoring import Encoder

STEPS = 6
TEXTS = [
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles",
    "Question: what is the capital of France?",
    "She",
]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return model, tok


def prompts_for(tok, mode: str) -> list[str] | list[list[int]]:
    if mode == "response":
        return [dialog_prompt(tok, [t]) for t in TEXTS[:2]] + [dialog_prompt(tok, ["Hi", "Hello there"])]
    if mode == "marker":
        return [TEXTS[0] + " TL;DR:", TEXTS[1] + " TL;DR: it", " TL;DR:"]
    return TEXTS


# ---------------------------------------------------------------------------------------------------------
# The naive reference: explicit contexts, one prompt at a time, the model re-run from scratch every step.


def naive_short(tok, rule, prompt: list[int], generated: list[int]) -> list[int]:
    """The short context written out by hand from docs/design.md, "Mathematics"."""
    prefix = Encoder(tok).prefix
    has_prefix = bool(prefix) and prompt[: len(prefix)] == prefix
    pre = prefix if has_prefix else []
    if isinstance(rule, LastTokens):
        return short_context_ids(prompt + generated, rule.k, prefix)
    if isinstance(rule, AfterSeparator):
        return pre + separator_ids(tok, rule.separator) + generated
    pattern = marker_ids(tok, rule.marker)
    at = last_occurrence(prompt, pattern, len(pre))
    assert at >= 0
    return pre + prompt[at:] + generated


def lp_of(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return log_softmax32(model(torch.tensor([ids])).logits[0, -1])


def naive_step(
    model, tok, boosting: Boosting | Experts, prompt: list[int], generated: list[int]
) -> torch.Tensor:
    boosting = as_experts(boosting)
    lps = [lp_of(model, prompt + generated)]
    weights = [boosting.full_weight]
    for rule, w in boosting.experts:
        lps.append(lp_of(model, naive_short(tok, rule, prompt, generated)))
        weights.append(w)
    return product_of_experts(lps, weights)


def naive_greedy(model, tok, boosting, prompt: list[int], steps: int):
    generated: list[int] = []
    scores = []
    for _ in range(steps):
        s = naive_step(model, tok, boosting, prompt, generated)
        scores.append(s)
        generated.append(int(s.argmax()))
        if generated[-1] == tok.eos_token_id:
            break
    return generated, scores


def check_against_naive(model, tok, boosting, out, steps=STEPS):
    for row, prompt in enumerate(out.prompts.rows):
        ref_tokens, ref_scores = naive_greedy(model, tok, boosting, prompt, steps)
        got = out.new_tokens[row, : len(ref_tokens)].tolist()
        assert got == ref_tokens, f"row {row}"
        for t, ref in enumerate(ref_scores):
            torch.testing.assert_close(out.scores[t][row], ref, atol=1e-4, rtol=0)


BOOSTINGS = {
    "last_k": Boosting("last_k", k=3, alpha=-0.8),
    "response": Boosting("response", alpha=-0.6),
    "marker": Boosting("marker", alpha=-0.6),
}


@pytest.mark.parametrize("decoder", ["fused", "processor"])
@pytest.mark.parametrize("mode", ["last_k", "response", "marker"])
def test_each_mode_matches_naive_loop(lm, mode, decoder):
    model, tok = lm
    boosting = BOOSTINGS[mode]
    out = boosted_generate(
        model,
        tok,
        prompts_for(tok, mode),
        boosting=boosting,
        max_new_tokens=STEPS,
        decoder=decoder,
        output_scores=True,
    )
    widths = {len(r) for r in out.prompts.rows}
    assert len(widths) == 3  # left padding really happens
    check_against_naive(model, tok, boosting, out)


@pytest.mark.parametrize("decoder", ["fused", "processor"])
def test_several_experts_match_naive_product(lm, decoder):
    model, tok = lm
    boosting = Experts(
        experts=((LastTokens(2), -0.3), (AfterMarker(), -0.4), (LastTokens(5), 0.2)), full_weight=1.1
    )
    out = boosted_generate(
        model,
        tok,
        prompts_for(tok, "marker"),
        boosting=boosting,
        max_new_tokens=4,
        decoder=decoder,
        output_scores=True,
    )
    check_against_naive(model, tok, boosting, out, steps=4)


def test_fused_cache_fallback_matches(lm, monkeypatch):
    """Models whose caches cannot be joined run one padded prefill; same numbers."""
    model, tok = lm
    boosting = BOOSTINGS["marker"]
    kw = dict(boosting=boosting, max_new_tokens=4, output_scores=True)
    joined = boosted_generate(model, tok, prompts_for(tok, "marker"), **kw)
    monkeypatch.setattr(experts, "_merge_left_padded", lambda caches, width: None)
    padded = boosted_generate(model, tok, prompts_for(tok, "marker"), **kw)
    assert torch.equal(joined.sequences, padded.sequences)
    for a, b in zip(joined.scores, padded.scores):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------------------------
# Against transformers' classifier-free guidance, where it is the same model.


def plain_generate(model, prepared, steps, **kw):
    return model.generate(
        prepared.input_ids,
        attention_mask=prepared.attention_mask,
        max_new_tokens=steps,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        **kw,
    )


def cfg_generate(model, prepared, negative: list[int], scale: float, steps: int):
    neg = torch.tensor([negative] * prepared.input_ids.shape[0])
    return plain_generate(
        model, prepared, steps, guidance_scale=scale, negative_prompt_ids=neg, do_sample=False
    )


def test_generation_form_equals_cfg(lm):
    """(1-a) log f_max + a log f_short is CFG with guidance_scale = 1 - a (scores, after normalising)."""
    model, tok = lm
    alpha = -0.7
    boosting = Boosting("marker", alpha=alpha, form="generation")
    prompts = [TEXTS[0] + " TL;DR:", TEXTS[1] + " TL;DR:", "She TL;DR:"]
    out = boosted_generate(model, tok, prompts, boosting=boosting, max_new_tokens=STEPS, output_scores=True)
    negative = list(Encoder(tok).prefix) + marker_ids(tok, " TL;DR:")
    cfg = cfg_generate(model, out.prompts, negative, 1 - alpha, STEPS)
    assert torch.equal(out.sequences, cfg.sequences)
    for ours, theirs in zip(out.scores, cfg.scores):
        torch.testing.assert_close(ours, torch.log_softmax(theirs, -1), atol=1e-4, rtol=0)


def test_dialog_form_is_rescaled_cfg(lm):
    """log f_max + a log f_short = (1+a) · CFG(guidance_scale = 1/(1+a)): same greedy tokens."""
    model, tok = lm
    alpha = -0.5
    out = boosted_generate(
        model,
        tok,
        prompts_for(tok, "response"),
        boosting=Boosting(mode="response", alpha=alpha),
        max_new_tokens=STEPS,
    )
    negative = list(Encoder(tok).prefix) + separator_ids(tok, None)
    cfg = cfg_generate(model, out.prompts, negative, 1 / (1 + alpha), STEPS)
    assert torch.equal(out.sequences, cfg.sequences)


# ---------------------------------------------------------------------------------------------------------
# Limits: the base model comes back where it should.


def test_k_at_least_context_is_the_base_model(lm):
    """Content no longer than k: f_k == f_max, and the generation form is the untempered base model."""
    model, tok = lm
    out = boosted_generate(
        model,
        tok,
        TEXTS,
        boosting=Boosting(mode="last_k", k=200, alpha=-0.5),
        max_new_tokens=STEPS,
        output_scores=True,
    )
    plain = plain_generate(model, out.prompts, STEPS, do_sample=False)
    assert torch.equal(out.sequences, plain.sequences)
    for ours, theirs in zip(out.scores, plain.scores):
        torch.testing.assert_close(ours, torch.log_softmax(theirs, -1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ["last_k", "response", "marker"])
def test_alpha_zero_is_plain_generate(lm, mode):
    model, tok = lm
    out = boosted_generate(
        model, tok, prompts_for(tok, mode), boosting=Boosting(mode=mode, alpha=0.0), max_new_tokens=STEPS
    )
    plain = plain_generate(model, out.prompts, STEPS, do_sample=False)
    assert torch.equal(out.sequences, plain.sequences)


def test_fused_loop_without_experts_is_plain_generate(lm):
    """The fused loop itself (prefill, cached steps, processors, stopping) reproduces generate."""
    model, tok = lm
    boosting = Boosting("marker", alpha=0.0)
    prepared = prepare_prompts(tok, prompts_for(tok, "marker"), boosting)
    fused = plain_generate(model, prepared, STEPS, custom_generate=FusedBoostedDecoding(prepared))
    plain = plain_generate(model, prepared, STEPS)
    assert torch.equal(fused.sequences, plain.sequences)
    for ours, theirs in zip(fused.scores, plain.scores):
        torch.testing.assert_close(ours, torch.log_softmax(theirs, -1), atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------------------
# Sampling: seeds, warpers after mixing, several return sequences.


def test_sampling_seeded_reproducible_and_paths_agree(lm):
    model, tok = lm
    kw = dict(
        boosting=Boosting("marker", alpha=-0.5),
        max_new_tokens=5,
        do_sample=True,
        top_p=0.9,
        num_return_sequences=2,
    )
    prompts = prompts_for(tok, "marker")
    before = torch.random.get_rng_state()
    a = boosted_generate(model, tok, prompts, seed=7, **kw)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's random state is untouched
    b = boosted_generate(model, tok, prompts, seed=7, **kw)
    c = boosted_generate(model, tok, prompts, seed=7, decoder="processor", **kw)
    d = boosted_generate(model, tok, prompts, seed=8, **kw)
    assert a.sequences.shape[0] == 2 * len(prompts)
    assert torch.equal(a.sequences, b.sequences)
    assert torch.equal(a.sequences, c.sequences)  # same boosted distribution, same random draws
    assert not torch.equal(a.sequences, d.sequences)


@pytest.mark.parametrize("decoder", ["fused", "processor"])
def test_top_p_and_temperature_apply_after_mixing(lm, decoder):
    model, tok = lm
    boosting = Boosting("last_k", k=2, alpha=-2.0)
    prompts = TEXTS[:2]
    boosted = [naive_step(model, tok, boosting, Encoder(tok).context(p), []) for p in prompts]
    full = [lp_of(model, Encoder(tok).context(p)) for p in prompts]

    out = boosted_generate(
        model,
        tok,
        prompts,
        boosting=boosting,
        max_new_tokens=1,
        do_sample=True,
        top_p=0.3,
        top_k=0,
        seed=0,
        output_scores=True,
        decoder=decoder,
    )
    warper = TopPLogitsWarper(top_p=0.3)
    for row in range(2):
        want = warper(None, boosted[row][None].clone())[0]
        kept = torch.isfinite(out.scores[0][row])
        assert torch.equal(kept, torch.isfinite(want))
        torch.testing.assert_close(out.scores[0][row][kept], boosted[row][kept], atol=1e-4, rtol=0)
        base_kept = torch.isfinite(warper(None, full[row][None].clone())[0])
        assert not torch.equal(kept, base_kept)  # the nucleus of the boosted model, not of f_max

    out = boosted_generate(
        model,
        tok,
        prompts,
        boosting=boosting,
        max_new_tokens=1,
        do_sample=True,
        temperature=0.7,
        top_k=0,
        seed=0,
        output_scores=True,
        decoder=decoder,
    )
    for row in range(2):
        torch.testing.assert_close(out.scores[0][row], boosted[row] / 0.7, atol=1e-4, rtol=0)


def test_stopping_criteria_and_streaming(lm):
    from transformers import StoppingCriteria, StoppingCriteriaList

    class AfterThree(StoppingCriteria):
        def __init__(self, width):
            self.width = width

        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.width + 3, dtype=torch.bool)

    class Recorder:
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.reshape(value.shape[0], -1) if value.dim() > 1 else value[:, None])

        def end(self):
            self.ended = True

    model, tok = lm
    prompts = prompts_for(tok, "marker")
    width = prepare_prompts(tok, prompts, BOOSTINGS["marker"]).width
    rec = Recorder()
    out = boosted_generate(
        model,
        tok,
        prompts,
        boosting=BOOSTINGS["marker"],
        max_new_tokens=10,
        stopping_criteria=StoppingCriteriaList([AfterThree(width)]),
        streamer=rec,
    )
    assert out.sequences.shape[1] == width + 3
    assert rec.ended
    assert torch.equal(torch.cat(rec.chunks, dim=1), out.sequences)


# ---------------------------------------------------------------------------------------------------------
# Beam search: cached short contexts follow beam reordering.


class NaiveBoostProcessor(LogitsProcessor):
    """Stateless reference: every row's full and short contexts rebuilt and re-run from scratch."""

    def __init__(self, model, tok, boosting, prepared):
        self.model, self.tok, self.boosting, self.prepared = model, tok, boosting, prepared

    def __call__(self, input_ids, scores):
        rows = self.prepared.rows
        rep = input_ids.shape[0] // len(rows)
        width = self.prepared.width
        out = [
            naive_step(self.model, self.tok, self.boosting, rows[r // rep], input_ids[r, width:].tolist())
            for r in range(input_ids.shape[0])
        ]
        return torch.stack(out)


@pytest.mark.parametrize("mode", ["last_k", "response", "marker"])
def test_beam_search_follows_reordering(lm, mode):
    model, tok = lm
    boosting = BOOSTINGS[mode]
    prepared = prepare_prompts(tok, prompts_for(tok, mode)[:2], boosting)
    common = dict(
        attention_mask=prepared.attention_mask,
        num_beams=3,
        num_return_sequences=2,
        max_new_tokens=5,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        do_sample=False,
    )
    proc = BoostingLogitsProcessor(model, prepared)
    ours = model.generate(prepared.input_ids, logits_processor=[proc], **common)
    ref = model.generate(
        prepared.input_ids, logits_processor=[NaiveBoostProcessor(model, tok, boosting, prepared)], **common
    )
    if mode != "last_k":  # windows are rebuilt from the rows every step: nothing cached to reorder
        assert proc.reorders > 0  # beams really were reshuffled, and the short caches followed
    assert torch.equal(ours.sequences, ref.sequences)
    torch.testing.assert_close(ours.sequences_scores, ref.sequences_scores, atol=1e-4, rtol=0)
    from transformers import GenerationConfig

    config = GenerationConfig(num_beams=3, num_return_sequences=2, do_sample=False)
    via_config = boosted_generate(
        model, tok, prompts_for(tok, mode)[:2], boosting=boosting, generation_config=config, max_new_tokens=5
    )
    assert torch.equal(via_config.sequences, ours.sequences)
    via_api = boosted_generate(
        model,
        tok,
        prompts_for(tok, mode)[:2],
        boosting=boosting,
        num_beams=3,
        num_return_sequences=2,
        max_new_tokens=5,
    )
    assert torch.equal(via_api.sequences, ours.sequences)


# ---------------------------------------------------------------------------------------------------------
# Mixing: the fast path is the product of experts, and -inf vetoes survive.


def test_mix_fast_path_equals_product_of_experts():
    from cblight.generate.experts import mix_experts

    gen = torch.Generator().manual_seed(0)
    lps = [torch.log_softmax(torch.randn(3, 50, generator=gen), -1) for _ in range(3)]
    weights = [1.2, -0.4, 0.3]
    torch.testing.assert_close(mix_experts(lps, weights), product_of_experts(lps, weights))
    masked = [lps[0].clone(), lps[1].clone(), lps[2]]
    masked[0][0, 5] = -math.inf  # vetoed by the positively weighted full model
    masked[1][1, 7] = -math.inf  # ruled out by a negatively weighted expert only: +inf, all the mass
    out = mix_experts(masked, weights)
    torch.testing.assert_close(out, product_of_experts(masked, weights))
    assert out[0, 5] == -math.inf and out[1, 7] == 0.0 and not torch.isnan(out).any()


@pytest.mark.parametrize("decoder", ["fused", "processor"])
def test_constraints_on_f_max_survive_boosting(lm, decoder):
    """bad_words_ids puts -inf in f_max; with f_max's weight positive the token stays banned."""
    model, tok = lm
    prompts = prompts_for(tok, "marker")
    kw = dict(boosting=Boosting("marker", alpha=-0.9), max_new_tokens=4, decoder=decoder)
    free = boosted_generate(model, tok, prompts, **kw)
    banned = int(free.new_tokens[0, 0])
    out = boosted_generate(model, tok, prompts, bad_words_ids=[[banned]], **kw)
    assert banned not in out.new_tokens.reshape(-1).tolist()
