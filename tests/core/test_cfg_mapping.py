"""docs/cfg_vs_boosting.md: transformers' classifier-free guidance is boosting with a growing short context.

transformers' ``UnbatchedClassifierFreeGuidanceLogitsProcessor`` returns
``g · log p(w | prompt) + (1 - g) · log p(w | negative prompt + generated)`` (both log-softmaxed), before
every warper. With the negative prompt set to cblight's short context (marker or separator, after BOS where
the tokenizer adds one) this is, token for token, under seeded sampling with temperature:

* the generation form ``(1-a) log f + a log f_short`` with ``g = 1 - a`` and the same temperature;
* the next-token form ``log f + a log f_short`` with ``g = 1 / (1 + a)`` (a > -1) and temperature
  ``T · (1 + a)`` for CFG's ``T`` (the CFG scores are the boosted ones times ``g``).
"""

from __future__ import annotations

import pytest
import torch

from cblight.generate import boosted_generate, dialog_prompt
from cblight.generate.inputs import marker_ids, separator_ids
from cblight.options import Boosting
from cblight.scoring import Encoder

STEPS = 8
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles TL;DR:",
    "Question: what is the capital of France? TL;DR:",
    "She TL;DR:",
]

pytestmark = pytest.mark.usefixtures("one_thread")


def cfg(model, prepared, negative, scale, seed=None, **kwargs):
    """transformers' own CFG on the prompts exactly as cblight padded them."""
    n = prepared.input_ids.shape[0]
    if seed is not None:
        torch.manual_seed(seed)
    return model.generate(
        input_ids=prepared.input_ids,
        attention_mask=prepared.attention_mask,
        guidance_scale=scale,
        negative_prompt_ids=torch.tensor([negative] * n),
        max_new_tokens=STEPS,
        pad_token_id=0,
        **kwargs,
    )


@pytest.mark.parametrize("alpha", [-0.5, -2.0])
def test_generation_form_is_cfg_with_scale_one_minus_alpha(tiny_lm, alpha):
    model, tok = tiny_lm
    negative = list(Encoder(tok).prefix) + marker_ids(tok, " TL;DR:")
    for sampling in ({"do_sample": False}, {"do_sample": True, "temperature": 0.7, "top_k": 0}):
        ours = boosted_generate(model, tok, PROMPTS, boosting=Boosting(mode='marker', alpha=alpha, form='generation'), max_new_tokens=STEPS, seed=11, **sampling)  # fmt: skip
        theirs = cfg(model, ours.prompts, negative, 1 - alpha, seed=11, **sampling)
        assert torch.equal(ours.sequences, theirs), sampling


@pytest.mark.parametrize("alpha", [-0.5, -0.8])
def test_next_token_form_is_cfg_with_rescaled_temperature(tiny_lm, alpha):
    model, tok = tiny_lm
    negative = list(Encoder(tok).prefix) + marker_ids(tok, " TL;DR:")
    scale, temperature = 1 / (1 + alpha), 0.9
    ours = boosted_generate(model, tok, PROMPTS, boosting=Boosting(mode='marker', alpha=alpha), max_new_tokens=STEPS, seed=5, do_sample=True, top_k=0, temperature=temperature * (1 + alpha))  # fmt: skip
    theirs = cfg(
        model, ours.prompts, negative, scale, seed=5, do_sample=True, top_k=0, temperature=temperature
    )
    assert torch.equal(ours.sequences, theirs)
    # the same temperature on both sides is a different distribution: sampled tokens drift apart
    same_t = boosted_generate(model, tok, PROMPTS, boosting=Boosting(mode='marker', alpha=alpha), max_new_tokens=STEPS, seed=5, do_sample=True, top_k=0, temperature=temperature)  # fmt: skip
    assert not torch.equal(same_t.sequences, theirs)


def test_dialog_response_is_cfg_on_separator(tiny_lm):
    """Response mode (separator + response so far) is CFG whose negative prompt is the separator: for
    GPT-2, whose tokenizer adds no BOS, that is CFG's default negative prompt (the prompt's last token)."""
    model, tok = tiny_lm
    alpha = -0.5
    prompts = [
        dialog_prompt(tok, [t]) for t in ("Hi there", "Question: what is the capital of France?", "She")
    ]
    ours = boosted_generate(
        model, tok, prompts, boosting=Boosting(mode="response", alpha=alpha), max_new_tokens=STEPS
    )
    prefix = list(Encoder(tok).prefix)
    negative = prefix + separator_ids(tok, None)
    assert torch.equal(ours.sequences, cfg(model, ours.prompts, negative, 1 / (1 + alpha), do_sample=False))
    if not prefix:
        default = model.generate(
            input_ids=ours.prompts.input_ids,
            attention_mask=ours.prompts.attention_mask,
            guidance_scale=1 / (1 + alpha),
            max_new_tokens=STEPS,
            pad_token_id=0,
            do_sample=False,
        )
        assert torch.equal(ours.sequences, default)
