"""Boosted decoding: option checks, prompt encoding and fitting to the model window (docs/design.md, "Mathematics")."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cblight.data.examples import DataError
from cblight.generate import (
    AfterMarker,
    AfterSeparator,
    Boosting,
    BoostingError,
    Experts,
    LastTokens,
    Sampling,
    boosted_generate,
    dialog_prompt,
    fit_marker_prompt,
    prepare_prompts,
)
from cblight.generate.inputs import marker_ids
from cblight.scoring import Encoder

ARTICLE = "The quick brown fox jumps over the lazy dog. " * 12


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(
        tiny_model_dir
    )


# ---------------------------------------------------------------------------------------------------------
# Options


@pytest.mark.parametrize("k", [0, -3, 2.5, True, "8"])
def test_bad_k(k):
    with pytest.raises(BoostingError, match="k"):
        Boosting("last_k", k=k, alpha=-0.1)


@pytest.mark.parametrize("alpha", [math.nan, math.inf, -math.inf, "0.1", None])
def test_bad_alpha(alpha):
    with pytest.raises(BoostingError, match="alpha"):
        Boosting("marker", alpha=alpha)


@pytest.mark.parametrize("alpha", [1.0, 1.5])
def test_generation_form_needs_alpha_below_one(alpha):
    with pytest.raises(BoostingError, match="alpha must be < 1"):
        Boosting("last_k", k=4, alpha=alpha)
    # the next-token form keeps f_max at weight 1, so any finite alpha is a valid product of experts
    assert Boosting("response", alpha=alpha).experts().full_weight == 1.0


def test_bad_mode_form_and_experts():
    with pytest.raises(BoostingError, match="mode"):
        Boosting("window", alpha=-0.1)
    with pytest.raises(BoostingError, match="form"):
        Boosting("last_k", alpha=-0.1, form="cfg")
    with pytest.raises(BoostingError, match="full-context weight"):
        Experts(experts=((LastTokens(4), -0.1),), full_weight=0.0)
    with pytest.raises(
        BoostingError, match=r"Experts.experts must be a list, each a 2-item list .*; a finite number\), got"
    ):
        Experts(experts=((LastTokens(4), math.nan),))
    with pytest.raises(
        BoostingError,
        match=r"each a 2-item list \(a LastTokens or an AfterSeparator or an AfterMarker; .*got \(\(8, -0.1\),\)",
    ):
        Experts(experts=((8, -0.1),))
    with pytest.raises(BoostingError, match="'auto' means the task's own short context"):
        Boosting("auto", alpha=-0.1).experts()
    with pytest.raises(BoostingError, match="marker"):
        AfterMarker("")


def test_weights_of_the_paper_forms():
    gen = Boosting("last_k", k=32, alpha=-0.05).experts()
    assert gen.full_weight == pytest.approx(1.05) and gen.experts == ((LastTokens(32), -0.05),)
    dia = Boosting("response", alpha=-0.3).experts()
    assert dia.full_weight == 1.0 and dia.experts == ((AfterSeparator(None), -0.3),)
    assert Boosting("marker", alpha=0.0).is_plain and Boosting("marker", alpha=0.0).experts().is_plain


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.2}, "top_p"),
        ({"temperature": 0.0}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"num_beams": 0}, "num_beams"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 1000}, "max_new_tokens"),
        ({"decoder": "beams"}, "decoder"),
        ({"seed": -1}, "seed"),
        ({"alpha": -0.2}, r"boosting=Boosting\(alpha=\.\.\.\)"),
        ({"top_p": 0.9, "sampling": Sampling(do_sample=True)}, "not both"),
        ({"sampling": {"do_sample": True}}, "sampling must be a Sampling"),
    ],
)
def test_bad_generate_options(lm, kwargs, field):
    model, tok = lm
    with pytest.raises(BoostingError, match=field):
        boosted_generate(model, tok, ["Hello there"], Boosting("last_k", k=2, alpha=-0.1), **kwargs)


def test_marker_absent_is_a_clear_error(lm):
    model, tok = lm
    with pytest.raises(BoostingError, match=r"prompt 1 does not contain the marker ' TL;DR:'"):
        boosted_generate(
            model,
            tok,
            ["A TL;DR:", "no marker here"],
            boosting=Boosting(mode="marker", alpha=-0.3),
            max_new_tokens=2,
        )
    # the check does not depend on alpha: a bad prompt is bad for the baseline too
    with pytest.raises(BoostingError, match="marker"):
        boosted_generate(
            model, tok, ["no marker here"], boosting=Boosting(mode="marker", alpha=0.0), max_new_tokens=2
        )


def test_response_prompt_must_end_with_separator(lm):
    model, tok = lm
    with pytest.raises(BoostingError, match="does not end with the turn separator"):
        boosted_generate(
            model, tok, ["Hello there"], boosting=Boosting(mode="response", alpha=-0.3), max_new_tokens=2
        )


def test_prompt_types(lm):
    model, tok = lm
    with pytest.raises(BoostingError, match="list of strings"):
        boosted_generate(model, tok, "one string", boosting=Boosting(alpha=-0.1), max_new_tokens=2)
    with pytest.raises(BoostingError, match="prompt 0 is empty"):
        boosted_generate(model, tok, [[]], boosting=Boosting(alpha=-0.1), max_new_tokens=2)
    with pytest.raises(BoostingError, match="prompt 0 must be"):
        boosted_generate(model, tok, [3.5], boosting=Boosting(alpha=-0.1), max_new_tokens=2)


def test_tensor_prompts_with_mask_equal_strings(lm):
    _, tok = lm
    texts = ["A journey of a thousand miles", "She"]
    boosting = Boosting("last_k", k=2, alpha=-0.3)
    a = prepare_prompts(tok, texts, boosting)
    b = prepare_prompts(tok, a.input_ids, boosting, attention_mask=a.attention_mask)
    assert a.rows == b.rows and torch.equal(a.input_ids, b.input_ids)


# ---------------------------------------------------------------------------------------------------------
# Prompt construction and fitting


def test_dialog_prompt(lm):
    _, tok = lm
    enc = Encoder(tok)
    row = dialog_prompt(tok, ["Hi", "Hello there"])
    eos = tok.eos_token_id
    assert row == enc.prefix + enc.body("Hi") + [eos] + enc.body("Hello there") + [eos]
    with pytest.raises(BoostingError, match="at least one turn"):
        dialog_prompt(tok, [])


def test_fit_marker_prompt_cuts_the_article_tail(lm):
    _, tok = lm
    enc = Encoder(tok)
    mark = marker_ids(tok, " TL;DR:")
    whole = enc.prefix + enc.body(ARTICLE) + mark
    fitted = fit_marker_prompt(tok, ARTICLE, max_tokens=30)
    assert len(fitted) == 30 < len(whole)
    assert fitted[-len(mark) :] == mark  # the marker is kept
    assert fitted[: 30 - len(mark)] == whole[: 30 - len(mark)]  # the head (and BOS) kept, the tail cut
    assert fit_marker_prompt(tok, "Short.", max_tokens=30) == enc.prefix + enc.body("Short.") + mark
    with pytest.raises(DataError, match="leaves no room"):
        fit_marker_prompt(tok, ARTICLE, max_tokens=len(mark) - 1)


def test_long_prompts_fit_the_window(lm):
    """Prompts are cut to window - max_new_tokens: from the left (prefix kept), or before the marker."""
    model, tok = lm
    enc = Encoder(tok)
    window, new = 40, 8
    room = window - new

    out = boosted_generate(
        model,
        tok,
        [ARTICLE],
        boosting=Boosting(mode="last_k", k=4, alpha=-0.2),
        max_new_tokens=new,
        max_length=window,
    )
    whole = enc.context(ARTICLE)
    assert out.prompts.rows[0] == enc.prefix + whole[len(whole) - (room - len(enc.prefix)) :]
    assert out.sequences.shape[1] == room + new

    tail = " TL;DR: a fox"
    out = boosted_generate(
        model,
        tok,
        [ARTICLE + tail],
        boosting=Boosting(mode="marker", alpha=-0.2),
        max_new_tokens=new,
        max_length=window,
    )
    row = out.prompts.rows[0]
    body = enc.body(ARTICLE + tail)
    kept = body[len(enc.body(ARTICLE)) :]  # the marker and the text after it
    assert len(row) == room and row[-len(kept) :] == kept
    assert row[: room - len(kept)] == (enc.prefix + body)[: room - len(kept)]


def test_marker_position_and_prefix_flags(lm):
    _, tok = lm
    enc = Encoder(tok)
    boosting = Experts(experts=((AfterMarker(), -0.2), (LastTokens(3), -0.1)))
    p = prepare_prompts(tok, ["A fox TL;DR: it ran", " TL;DR:"], boosting)
    mark = marker_ids(tok, " TL;DR:")
    for r, row in enumerate(p.rows):
        start = int(p.info.content_start[r])
        anchor = int(p.info.anchors[0][r])
        assert p.input_ids[r, anchor : anchor + len(mark)].tolist() == mark
        assert p.input_ids[r, start:].tolist() == row
        assert bool(p.info.has_prefix[r]) == bool(enc.prefix)
    assert p.info.anchors[1] is None
