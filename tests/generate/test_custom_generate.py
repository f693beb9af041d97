"""The transformers ``custom_generate`` decoder (``custom_generate/generate.py``), loaded from this checkout
by the installed transformers exactly as from the Hub (``trust_remote_code=True``), against
``boosted_generate`` called directly and, at alpha = 0, transformers' plain ``generate``."""

from __future__ import annotations

import pytest
import torch

from cblight.batching import left_pad
from cblight.generate import Boosting, BoostingError, boosted_generate, dialog_prompt
from tests.helpers import ROOT

TEXTS = [
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles",
    "Question: what is the capital of France?",
    "She",
]
STEPS = 6

pytestmark = pytest.mark.usefixtures("one_thread")


def inputs_for(tok, mode: str) -> dict[str, torch.Tensor]:
    """Left-padded prompts of each mode, as a user would hand them to ``generate``."""
    if mode == "response":
        rows = [dialog_prompt(tok, [t]) for t in TEXTS]
    else:
        texts = [t + " TL;DR:" for t in TEXTS] if mode == "marker" else TEXTS
        rows = [tok(t)["input_ids"] for t in texts]
    ids, mask = left_pad(rows, tok.pad_token_id if tok.pad_token_id is not None else 0, "cpu")
    return {"input_ids": ids, "attention_mask": mask}


def hub_style(model, tok, inputs, **kwargs):
    return model.generate(
        **inputs, custom_generate=str(ROOT), trust_remote_code=True, tokenizer=tok, **kwargs
    )


def direct(model, tok, inputs, mode, alpha, k=3, **kwargs):
    return boosted_generate(
        model,
        tok,
        inputs["input_ids"],
        boosting=Boosting(mode=mode, k=k, alpha=alpha),
        attention_mask=inputs["attention_mask"],
        **kwargs,
    ).sequences


@pytest.mark.parametrize("mode", ["last_k", "response", "marker"])
def test_greedy_and_seeded_sampling_equal_boosted_generate(tiny_lm, mode):
    model, tok = tiny_lm
    inputs = inputs_for(tok, mode)
    boost = {"boost_mode": mode, "boost_k": 3, "boost_alpha": -0.5}
    ours = hub_style(model, tok, inputs, max_new_tokens=STEPS, **boost)
    ref = direct(model, tok, inputs, mode, -0.5, max_new_tokens=STEPS)
    assert torch.equal(ours, ref)
    sampling = {"do_sample": True, "top_k": 0, "top_p": 0.9, "temperature": 0.8, "num_return_sequences": 2}
    torch.manual_seed(7)
    ours = hub_style(model, tok, inputs, max_new_tokens=STEPS, **boost, **sampling)
    torch.manual_seed(7)
    ref = direct(model, tok, inputs, mode, -0.5, max_new_tokens=STEPS, **sampling)
    assert ours.shape[0] == 2 * len(TEXTS) and torch.equal(ours, ref)


def test_a_boosting_object_equals_its_boost_fields_and_a_misspelt_field_is_refused(tiny_lm):
    """``boosting=Boosting(...)`` and ``boost_<field>=`` are one definition (``Boosting.from_prefixed``)."""
    model, tok = tiny_lm
    inputs = inputs_for(tok, "last_k")
    whole = hub_style(model, tok, inputs, max_new_tokens=STEPS, boosting=Boosting(k=3, alpha=-0.5))
    fields = hub_style(model, tok, inputs, max_new_tokens=STEPS, boost_k=3, boost_alpha=-0.5)
    assert torch.equal(whole, fields)
    with pytest.raises(
        BoostingError, match=r"unknown boosting option 'boost_alph'; the options are boost_mode"
    ):
        hub_style(model, tok, inputs, max_new_tokens=STEPS, boost_alph=-0.5)
    with pytest.raises(BoostingError, match="not both"):
        hub_style(model, tok, inputs, max_new_tokens=STEPS, boosting=Boosting(alpha=-0.5), boost_k=3)


def test_beams_forms_and_dict_output(tiny_lm):
    model, tok = tiny_lm
    inputs = inputs_for(tok, "marker")
    ours = hub_style(
        model, tok, inputs, max_new_tokens=STEPS, num_beams=3, boost_mode="marker", boost_alpha=-0.5
    )
    ref = direct(model, tok, inputs, "marker", -0.5, max_new_tokens=STEPS, num_beams=3)
    assert torch.equal(ours, ref)
    out = hub_style(
        model,
        tok,
        inputs,
        max_new_tokens=STEPS,
        boost_mode="last_k",
        boost_k=2,
        boost_alpha=-0.3,
        boost_form="next_token",
        return_dict_in_generate=True,
        output_scores=True,
    )
    ref = boosted_generate(
        model,
        tok,
        inputs["input_ids"],
        boosting=Boosting(mode="last_k", k=2, alpha=-0.3, form="next_token"),
        attention_mask=inputs["attention_mask"],
        max_new_tokens=STEPS,
        output_scores=True,
    )
    assert torch.equal(out.sequences, ref.sequences) and len(out.scores) == STEPS
    for a, b in zip(out.scores, ref.scores):
        assert torch.equal(a, b)


def test_alpha_zero_is_plain_generate(tiny_lm):
    model, tok = tiny_lm
    inputs = inputs_for(tok, "last_k")
    plain = model.generate(**inputs, max_new_tokens=STEPS, do_sample=False, pad_token_id=tok.pad_token_id)
    width = inputs["input_ids"].shape[1]
    new_tokens = plain[:, width:]  # the prompts' padding ids may differ (cblight pads with EOS)
    assert torch.equal(hub_style(model, tok, inputs, max_new_tokens=STEPS)[:, width:], new_tokens)
    # max_length instead of max_new_tokens, as generate counts it
    assert torch.equal(hub_style(model, tok, inputs, max_length=width + STEPS)[:, width:], new_tokens)


def test_bad_input_is_one_clear_error(tiny_lm):
    model, tok = tiny_lm
    inputs = inputs_for(tok, "last_k")
    with pytest.raises(BoostingError, match="needs the tokenizer"):
        model.generate(**inputs, custom_generate=str(ROOT), trust_remote_code=True, boost_alpha=-0.5)
    with pytest.raises(BoostingError, match=r"Boosting\.mode must be one of .last_k., .response."):
        hub_style(model, tok, inputs, boost_mode="window", boost_alpha=-0.5, max_new_tokens=2)
    with pytest.raises(BoostingError, match="leaves no new tokens after the"):
        hub_style(model, tok, inputs, boost_alpha=-0.5, max_length=3)
    with pytest.raises(BoostingError, match="negative_prompt_ids is not supported"):
        hub_style(model, tok, inputs, negative_prompt_ids=inputs["input_ids"], boost_alpha=-0.5)


def test_readme_snippet_and_hub_card(tiny_gpt2_dir, monkeypatch, capsys):
    tutorial = (ROOT / "docs" / "tutorials" / "lmeval.md").read_text()  # the README's former section
    block = tutorial.split("## cblight in lm-evaluation-harness and model.generate", 1)[1]
    code = block.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(ROOT)  # custom_generate="." is the checkout
    exec(compile(code.replace('"gpt2"', repr(str(tiny_gpt2_dir))), "docs/tutorials/lmeval.md", "exec"), {})
    assert capsys.readouterr().out.strip()
    card = (ROOT / "custom_generate" / "README.md").read_text()
    front = card.split("---\n")[1]
    assert "library_name: transformers" in front and "- custom_generate" in front
    assert (ROOT / "custom_generate" / "requirements.txt").read_text().split() == ["cblight>=0.1.0"]
