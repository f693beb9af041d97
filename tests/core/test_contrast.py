"""The Figure-1 contrast command against a naive computation on the model."""

import math

import pytest
import torch

from cblight.contrast import contrast, format_contrast, main
from cblight.models import load_causal_lm, load_tokenizer
from cblight.scoring import Encoder

CONTEXT = ' Ballad metre is "less regular and more conversational" than common metre'


def naive_last(model, ids):
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)


def test_contrast_matches_naive(tiny_model_dir):
    model, tok = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    res = contrast(model, tok, CONTEXT, k=8, alpha=-0.5, top=4)
    enc = Encoder(tok)
    ids = enc.context(CONTEXT)
    ctx, target = ids[:-1], ids[-1]
    full = naive_last(model, ctx)
    short = naive_last(model, enc.prefix + ctx[len(enc.prefix) :][-8:])
    boosted = torch.log_softmax(1.5 * full - 0.5 * short, -1)  # p_full^1.5 p_short^-0.5, normalised
    for name, lp in (("full", full), ("short", short), ("boosted", boosted)):
        assert res.target_rank[name] == 1 + int((lp > lp[target]).sum())
        rows = res.tables[name]
        top = torch.argsort(lp, descending=True)[:4].tolist()
        assert [r.token for r in rows[:4]] == [repr(tok.decode([t])) for t in top]
        assert [r.log_prob for r in rows[:4]] == pytest.approx([float(lp[t]) for t in top], abs=1e-5)
    assert math.isclose(sum(math.exp(x) for x in boosted.tolist()), 1.0, rel_tol=1e-4)
    assert "rank" in format_contrast(res, 8, -0.5)


def test_contrast_with_explicit_target_and_bad_k(tiny_gpt2_dir, capsys):
    model, tok = load_causal_lm(str(tiny_gpt2_dir)), load_tokenizer(str(tiny_gpt2_dir))
    res = contrast(model, tok, CONTEXT[: -len(" metre")], target=" metre", k=3, alpha=-1.0)
    assert res.target == " metre"
    with pytest.raises(SystemExit) as exc:
        main(["--model", str(tiny_gpt2_dir), "--context", CONTEXT, "--k", "0"])
    assert exc.value.code == 2 and "error: k" in capsys.readouterr().err  # k must be at least 1
