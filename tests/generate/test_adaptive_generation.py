"""Adaptive (per-token) alpha in boosted decoding, the custom_generate method and the tuning teacher
(docs/adaptive.md), against a brute-force reference: one model call per expert per step on the whole
string, AdaCAD's weight computed by hand from the two distributions, the mix by hand.

The tiny random models predict nearly uniform distributions, on which every rule gives alpha ~ 0 and the
test could not tell adaptive boosting from none: their final norm is scaled up so that predictions are
peaked (a valid model with sharper logits). Tolerance: alphas and mixed log-probs are float32 computations
of magnitude ~1-10 compared with a float64 reference, so 1e-4.
"""

from __future__ import annotations

import math

import pytest
import torch

from cblight.errors import BoostingError
from cblight.generate import Boosting, boosted_generate
from cblight.options import Experts, LastTokens
from cblight.scoring import Encoder
from tests.helpers import ROOT

PROMPTS = ["The quick brown fox jumps over the lazy dog. A journey of a", "Question: what is the capital"]
K = 3
STEPS = 5

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sharp_lm(tiny_lm):
    model, tok = tiny_lm
    norm = model.transformer.ln_f if hasattr(model, "transformer") else model.model.norm
    with torch.no_grad():
        norm.weight.mul_(25.0)
    yield model, tok
    with torch.no_grad():
        norm.weight.div_(25.0)


def log_probs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].double(), -1)


def jsd_bits(lp: torch.Tensor, lq: torch.Tensor) -> float:
    p, q = lp.exp(), lq.exp()
    m = (p + q) / 2
    kl = lambda x: float((x * (x / m).log()).nan_to_num().sum())  # noqa: E731  (0 log 0 = 0)
    return 0.5 * (kl(p) + kl(q)) / math.log(2)


def reference(model, tok, prompt: str, rule_alpha, form: str) -> tuple[list[int], list[float]]:
    """Greedy boosted decoding by brute force: ``(tokens, alphas)``."""
    enc = Encoder(tok)
    ids = enc.context(prompt)
    prefix = list(enc.prefix)
    tokens, alphas = [], []
    for _ in range(STEPS):
        full = log_probs(model, ids)
        content = ids[len(prefix) :]
        short = log_probs(model, prefix + content[-K:]) if len(content) > K else full
        alpha = rule_alpha(full, short)
        w_full, w_short = (1.0 - alpha, alpha) if form == "generation" else (1.0, alpha)
        token = int(torch.argmax(w_full * full + w_short * short))
        tokens.append(token)
        alphas.append(alpha)
        ids = ids + [token]
    return tokens, alphas


def adacad(form: str, distance: bool = False):
    """AdaCAD's weight, the JSD in bits (``jsd``), or its square root, the JS distance (``jsdist``)."""

    def rule(full, short):
        a = jsd_bits(full, short) ** (0.5 if distance else 1.0)
        return -a if form == "generation" else -a / (1 + a)

    return rule


@pytest.mark.parametrize("rule", ["jsd", "jsdist", "auto"])
@pytest.mark.parametrize("form", ["generation", "next_token"])
@pytest.mark.parametrize("decoder", ["fused", "processor"])
def test_adaptive_greedy_decoding_matches_brute_force(sharp_lm, rule, form, decoder):
    """Each per-token rule, and decoding's ``auto`` (the JS distance), against a one-token-at-a-time loop."""
    model, tok = sharp_lm
    boosting = Boosting("last_k", k=K, form=form, adaptive=rule)
    out = boosted_generate(
        model, tok, PROMPTS, boosting, max_new_tokens=STEPS, decoder=decoder, do_sample=False
    )
    assert out.alphas is not None
    changed = False
    for row, prompt in enumerate(PROMPTS):
        tokens, alphas = reference(model, tok, prompt, adacad(form, distance=rule != "jsd"), form)
        assert out.tokens[row] == tokens[: len(out.tokens[row])]
        assert out.alphas[row] == pytest.approx(alphas[: len(out.tokens[row])], abs=1e-4)
        plain, _ = reference(model, tok, prompt, lambda f, s: 0.0, form)
        changed = changed or plain != tokens
    assert changed, "adaptive boosting chose the base model's tokens everywhere: the test cannot fail"
    assert min(a for row in out.alphas for a in row) < -0.05  # the rule acted


@pytest.mark.parametrize("decoder", ["fused", "processor"])
def test_adaptive_rule_with_an_anchored_short_context(sharp_lm, decoder):
    """Marker mode: the short context is the marker and the text after it, decoded with the rule's alpha
    although the expert's fixed weight (alpha = 0) is 0."""
    from cblight.generate.inputs import last_occurrence, marker_ids

    model, tok = sharp_lm
    prompt = "The quick brown fox jumps over the lazy dog. TL;DR:"
    boosting = Boosting("marker", adaptive="jsd")
    out = boosted_generate(
        model, tok, [prompt], boosting, max_new_tokens=STEPS, decoder=decoder, do_sample=False
    )
    enc = Encoder(tok)
    ids, prefix = enc.context(prompt), list(enc.prefix)
    at = last_occurrence(ids, marker_ids(tok, " TL;DR:"), len(prefix))
    assert out.alphas is not None and len(out.tokens[0]) == STEPS
    for token, alpha in zip(out.tokens[0], out.alphas[0]):
        full, short = log_probs(model, ids), log_probs(model, prefix + ids[at:])
        assert alpha == pytest.approx(adacad("next_token")(full, short), abs=1e-4)
        assert token == int(torch.argmax(full + alpha * short))
        ids = ids + [token]


def test_cocoa_rule_and_custom_generate_agree_with_boosted_generate(sharp_lm):
    model, tok = sharp_lm
    rows = [tok(p)["input_ids"] for p in PROMPTS]
    from cblight.batching import left_pad

    ids, mask = left_pad(rows, tok.pad_token_id if tok.pad_token_id is not None else 0, "cpu")
    direct = boosted_generate(
        model,
        tok,
        ids,
        Boosting("last_k", k=K, adaptive="cocoa"),
        attention_mask=mask,
        max_new_tokens=STEPS,
    )
    hub = model.generate(
        input_ids=ids,
        attention_mask=mask,
        custom_generate=str(ROOT),
        trust_remote_code=True,
        tokenizer=tok,
        boost_k=K,
        boost_adaptive="cocoa",
        max_new_tokens=STEPS,
        do_sample=False,
    )
    assert torch.equal(hub, direct.sequences)
    assert direct.alphas is not None and any(a < 0 for row in direct.alphas for a in row)


def test_adaptive_options_are_checked_once():
    with pytest.raises(BoostingError) as err:
        Boosting("last_k", adaptive="kl")
    assert (
        str(err.value)
        == "Boosting.adaptive must be one of 'auto', 'jsd', 'jsdist', 'cocoa' or null, got 'kl'"
    )
    with pytest.raises(BoostingError) as err:
        Boosting("last_k", alpha=-0.2, adaptive="jsd")
    assert str(err.value) == "adaptive=jsd sets alpha at every token; leave alpha at 0 (got alpha=-0.2)"
    with pytest.raises(BoostingError, match="one short expert"):
        Experts(experts=((LastTokens(2), -0.1), (LastTokens(4), -0.1)), adaptive="jsd")
    b = Boosting("last_k", k=4, adaptive="jsd")
    assert not b.is_plain and not b.experts().is_plain and b.experts().adaptive == "jsd"
    assert Boosting("auto", adaptive="jsd").with_mode("response").adaptive == "jsd"


def test_adaptive_tuning_teacher_is_the_per_position_mix():
    from cblight.adaptive import js_divergence
    from cblight.options import Sampling
    from cblight.tune.loss import boosted_teacher
    from cblight.tune.preflight import check_shared_options

    torch.manual_seed(0)
    full = torch.log_softmax(3 * torch.randn(4, 6), -1)
    short = torch.log_softmax(3 * torch.randn(2, 6), -1)
    long = torch.tensor([True, False, True, False])
    teacher = boosted_teacher(full, short, long, 0.0, adaptive="jsd")
    torch.testing.assert_close(teacher[~long], full[~long], rtol=0, atol=0)
    for row, s in zip((0, 2), short):
        a = float(js_divergence(full[row].double(), s.double()))
        expected = torch.log_softmax((1 + a) * full[row].double() - a * s.double(), -1).float()
        torch.testing.assert_close(teacher[row], expected, rtol=0, atol=1e-5)
    check_shared_options(Boosting(k=8, adaptive="jsd"), Sampling(do_sample=True))  # alpha 0: fine with a rule


def test_generation_evaluator_saves_and_summarises_the_alphas(tiny_gpt2_dir, tmp_path):
    """The generation evaluator's adaptive row: each token's alpha cached and written with its generation
    (equal to a direct ``boosted_generate`` call on the same prompts), their mean and spread in
    ``results.json``, and a line under the table."""
    import json

    from cblight.cli import evaluate_cli
    from cblight.models import load_causal_lm, load_tokenizer

    decodings = [{"name": "adaptive", "boosting": {"k": 2, "adaptive": "jsd"}}]
    evaluate_cli(
        [
            "--model", "BoostedGenerationEvaluator", "--model.model", str(tiny_gpt2_dir),
            "--model.max_new_tokens", "5", "--model.self_bleu_samples", "null",
            "--model.decodings", json.dumps(decodings), "--model.output_dir", str(tmp_path),
            "--data.tasks", "[webtext]", "--data.data_dirs", json.dumps({"webtext": str(ROOT / "tests/fixtures/webtext")}),
            "--data.limit", "3", "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false",
        ]
    )  # fmt: skip
    rows = [json.loads(x) for x in (tmp_path / "generations/webtext/adaptive.jsonl").read_text().splitlines()]
    results = json.loads((tmp_path / "results.json").read_text())["tasks"]["webtext"]
    model, tok = load_causal_lm(str(tiny_gpt2_dir)), load_tokenizer(str(tiny_gpt2_dir))
    direct = boosted_generate(
        model, tok, [r["context"] for r in rows], Boosting("last_k", k=2, adaptive="jsd"), max_new_tokens=5
    )
    values = []
    for row, tokens, alphas in zip(rows, direct.tokens, direct.alphas):
        assert row["tokens"] == tokens and len(row["alphas"]) == len(tokens)
        assert row["alphas"] == pytest.approx(alphas, abs=1e-6)  # cached rounded to 6 decimals
        values += row["alphas"]
    summary = results["adaptive"]["adaptive"]
    mean = sum(values) / len(values)
    assert summary["rule"] == "jsd" and summary["tokens"] == len(values) > 0
    assert summary["alpha_mean"] == pytest.approx(mean)
    assert summary["alpha_sd"] == pytest.approx(math.sqrt(sum((a - mean) ** 2 for a in values) / len(values)))
    assert summary["alpha_min"] == min(values) < 0
    assert results["decodings"]["adaptive"]["adaptive"] == "jsd"
