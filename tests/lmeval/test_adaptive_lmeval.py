"""``alpha=adaptive`` in the lm-eval model (docs/adaptive.md, docs/lmeval.md) against references: each
request's full and short scores from lm-eval's own HF backend, the question's alpha by hand, and the greedy
flag from a naive per-position loop with AdaCAD's weight computed by hand at each position.

Tolerances: log-likelihood sums of float32 token log-probs computed in different batch shapes agree to
~1e-5 (tests/lmeval/test_lmeval.py's LL_TOL); the adaptive alpha multiplies a short score of magnitude < 100, so
1e-4 on the boosted sum too.
"""

from __future__ import annotations

import math

import pytest
import torch

LL_TOL = 1e-4
K = 3
QUESTIONS = [  # (task, context, answers)
    ("demo", "Question: what is the capital of France? The answer is", [" Paris", " Lyon", " the sea"]),
    ("demo", "She opened the door because someone knocked loudly at", [" night", " the door"]),
    ("demo", "A journey of a thousand miles begins with a single", [" step", " mile", " car"]),
]

pytestmark = pytest.mark.usefixtures("one_thread")


def with_greedy_answers(hf):
    """The questions with one more answer each: the base model's greedy next token (so that some greedy
    flags are true and the flag test can fail both ways)."""
    out = []
    for task, ctx, answers in QUESTIONS:
        ids = hf.tok_encode(ctx)
        with torch.no_grad():
            token = int(hf.model(torch.tensor([ids])).logits[0, -1].argmax())
        out.append((task, ctx, [*answers, hf.tokenizer.decode([token])]))
    return out


def requests(questions=QUESTIONS):
    from lm_eval.api.instance import Instance

    out = []
    for doc, (task, ctx, answers) in enumerate(questions):
        for i, a in enumerate(answers):
            out.append(
                Instance(
                    request_type="loglikelihood", doc={}, arguments=(ctx, a), idx=i, metadata=(task, doc, 1)
                )
            )
    return out


@pytest.fixture(scope="module")
def backends(tiny_model_dir):
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(tiny_model_dir), dtype="float32", device="cpu", batch_size=1), tiny_model_dir


def reference_scores(hf, questions=QUESTIONS):
    """Each request's ``(ll_full, ll_short, ctx_ids, short_ids, cont_ids)`` from lm-eval's HF backend."""
    tok = hf.tokenizer
    adds_bos = tok("a")["input_ids"][0] == tok.bos_token_id
    out = []
    for req in requests(questions):
        ctx, cont = req.args
        full = hf.loglikelihood([req], disable_tqdm=True)[0][0]
        ctx_ids, cont_ids = hf._encode_pair(ctx, cont)
        short_ids = ctx_ids[:1] + ctx_ids[1:][-K:] if adds_bos else ctx_ids[-K:]
        short = hf._loglikelihood_tokens([((ctx, cont), short_ids, cont_ids)], disable_tqdm=True)[0][0]
        out.append((full, short, ctx_ids, short_ids, cont_ids))
    return out


def adacad_greedy(model, ctx, short, cont) -> bool:
    with torch.no_grad():
        full = torch.log_softmax(model(torch.tensor([ctx + cont[:-1]])).logits[0].double(), -1)[
            len(ctx) - 1 :
        ]
        sh = torch.log_softmax(model(torch.tensor([short + cont[:-1]])).logits[0].double(), -1)[
            len(short) - 1 :
        ]
    for j, token in enumerate(cont):
        p, q = full[j].exp(), sh[j].exp()
        m = (p + q) / 2
        a = 0.5 * float((p * (p / m).log()).sum() + (q * (q / m).log()).sum()) / math.log(2)
        if int(torch.argmax(full[j] - a / (1 + a) * sh[j])) != token:
            return False
    return True


def test_adaptive_loglikelihood_is_the_rule_over_each_question(backends):
    from cblight.lmeval.model import CblightLM

    hf, model_dir = backends
    questions = with_greedy_answers(hf)
    ref = reference_scores(hf, questions)
    lm = CblightLM(
        pretrained=str(model_dir), alpha="adaptive", adaptive_rule="decorrelate", k=K, batch_size=3
    )
    got = lm.loglikelihood(requests(questions))
    # the decorrelation slope by hand: each question centred on its own answers, pooled over the task
    num = den = 0.0
    at = 0
    for _, _, answers in questions:
        f = [r[0] for r in ref[at : at + len(answers)]]
        s = [r[1] for r in ref[at : at + len(answers)]]
        fm, sm = sum(f) / len(f), sum(s) / len(s)
        num += sum((x - fm) * (y - sm) for x, y in zip(f, s))
        den += sum((y - sm) ** 2 for y in s)
        at += len(answers)
    alpha = -num / den
    flags = []
    for (full, short, ctx, short_ids, cont), (ll, greedy) in zip(ref, got):
        assert ll == pytest.approx(full + alpha * short, abs=LL_TOL)
        flags.append(adacad_greedy(lm.model, ctx, short_ids, cont))
        assert greedy == flags[-1]
    assert any(flags) and not all(flags)


def test_per_question_rule_and_settings(backends):
    from cblight.adaptive import choice_jsd_alpha
    from cblight.errors import CblightError
    from cblight.lmeval.model import CblightLM

    hf, model_dir = backends
    ref = reference_scores(hf)
    lm = CblightLM(pretrained=str(model_dir), alpha="adaptive", adaptive_rule="jsd", k=K, batch_size=3)
    got = lm.loglikelihood(requests())
    at = 0
    for _, _, answers in QUESTIONS:
        rows = ref[at : at + len(answers)]
        full = torch.tensor([[r[0] for r in rows]], dtype=torch.float64)
        short = torch.tensor([[r[1] for r in rows]], dtype=torch.float64)
        a = float(choice_jsd_alpha(full, short))  # hand-checked in tests/core/test_adaptive.py
        for (f, s, *_), (ll, _) in zip(rows, got[at : at + len(answers)]):
            assert ll == pytest.approx(f + a * s, abs=LL_TOL)
        at += len(answers)
    assert lm.get_model_info()["cblight"]["adaptive"] == "jsd"
    with pytest.raises(CblightError) as err:
        CblightLM(pretrained=str(model_dir), adaptive_rule="jsd")
    assert str(err.value) == "adaptive_rule=jsd needs alpha=adaptive (got alpha=0.0)"
    with pytest.raises(CblightError) as err:
        CblightLM(pretrained=str(model_dir), alpha="adaptive", adaptive_rule="median")
    assert str(err.value) == (
        "adaptive_rule must be one of 'auto', 'gated', 'jsd', 'jsdist', 'cocoa', 'jsd_mean', 'jsdist_mean', 'decorrelate', 'balance', got 'median'"
    )
