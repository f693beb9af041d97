"""The divergences, the top-k teacher and the chunked loss of coherence tuning against brute-force
references: explicit float64 sums over the vocabulary, TRL's ``generalized_jsd_loss`` formulation through
``F.kl_div``, and per-prefix model calls (``tests.tune.tuning_helpers.reference_terms``)."""

import math

import pytest
import torch
import torch.nn.functional as F

from cblight.errors import ConfigError
from cblight.models import load_causal_lm, load_tokenizer
from cblight.scoring import Encoder
from cblight.tune.divergences import divergence, restrict_to_teacher_top_k
from cblight.tune.loss import LossOptions, tuning_kl_terms
from tests.tune.tuning_helpers import SAMPLE_PROMPTS, reference_terms, sample_rollouts, with_early_eos

pytestmark = pytest.mark.usefixtures("one_thread")


def _brute(kind: str, p: list[float], q: list[float], beta: float = 0.5) -> float:
    """The definitions, one token at a time in float64."""

    def kl(a, b):
        return sum(x * math.log(x / y) for x, y in zip(a, b) if x > 0)

    if kind == "forward_kl" or (kind == "jsd" and beta == 0):
        return kl(p, q)
    if kind == "reverse_kl" or (kind == "jsd" and beta == 1):
        return kl(q, p)
    m = [beta * x + (1 - beta) * y for x, y in zip(p, q)]
    return beta * kl(p, m) + (1 - beta) * kl(q, m)


def _trl(p_log, q_log, beta):
    """TRL's GKDTrainer.generalized_jsd_loss, per row (F.kl_div(input, target) = KL(target || input))."""
    if beta == 0:
        return F.kl_div(q_log, p_log, reduction="none", log_target=True).sum(-1)
    if beta == 1:
        return F.kl_div(p_log, q_log, reduction="none", log_target=True).sum(-1)
    b = torch.tensor(beta, dtype=q_log.dtype)
    m = torch.logsumexp(torch.stack([q_log + torch.log(1 - b), p_log + torch.log(b)]), dim=0)
    kl_teacher = F.kl_div(m, p_log, reduction="none", log_target=True).sum(-1)
    kl_student = F.kl_div(m, q_log, reduction="none", log_target=True).sum(-1)
    return beta * kl_teacher + (1 - beta) * kl_student


def _rows(seed=0, n=4, v=9):
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(n, v, generator=g) * 2, -1), torch.randn(n, v, generator=g)


@pytest.mark.parametrize(
    ("kind", "beta"),
    [("forward_kl", 0.5), ("reverse_kl", 0.5), ("jsd", 0.0), ("jsd", 0.3), ("jsd", 0.5), ("jsd", 1.0)],
)
def test_divergences_match_the_definitions_and_trl(kind, beta):
    p_log, logits = _rows()
    q_log = torch.log_softmax(logits, -1)
    ours = divergence(p_log, q_log, kind, beta)
    # float32 log-probs of 9 tokens summed: ~1e-6 absolute against float64
    for row in range(len(ours)):
        ref = _brute(kind, p_log[row].double().exp().tolist(), q_log[row].double().exp().tolist(), beta)
        assert ours[row].item() == pytest.approx(ref, abs=2e-6)
    b = {"forward_kl": 0.0, "reverse_kl": 1.0}.get(kind, beta)
    assert torch.allclose(ours, _trl(p_log, q_log, b), atol=2e-6)


@pytest.mark.parametrize(("kind", "beta"), [("forward_kl", 0.5), ("reverse_kl", 0.5), ("jsd", 0.3)])
def test_divergence_gradients_match_float64_autograd(kind, beta):
    p_log, logits = _rows(seed=1)
    logits = logits.requires_grad_()
    divergence(p_log.requires_grad_(), torch.log_softmax(logits, -1), kind, beta).sum().backward()
    ref_logits = logits.detach().double().requires_grad_()
    p, q = p_log.detach().double().exp(), torch.softmax(ref_logits, -1)
    if kind == "forward_kl":
        ref = (p * (p.log() - q.log())).sum()
    elif kind == "reverse_kl":
        ref = (q * (q.log() - p.log())).sum()
    else:
        m = beta * p + (1 - beta) * q
        ref = (beta * p * (p.log() - m.log()) + (1 - beta) * q * (q.log() - m.log())).sum()
    ref.backward()
    assert p_log.grad is None  # the teacher is a constant
    assert torch.allclose(logits.grad.double(), ref_logits.grad, atol=1e-6)


def test_top_k_renormalises_both_over_the_teachers_top_k():
    p_log, logits = _rows(seed=2, n=3, v=8)
    q_log = torch.log_softmax(logits, -1)
    k = 3
    tp, tq = restrict_to_teacher_top_k(p_log, q_log, k)
    for row in range(3):
        p, q = p_log[row].double().exp().tolist(), q_log[row].double().exp().tolist()
        top = sorted(range(8), key=lambda w: -p[w])[:k]
        pk = [p[w] / sum(p[v] for v in top) for w in top]
        qk = [q[w] / sum(q[v] for v in top) for w in top]
        assert tp[row].exp().tolist() == pytest.approx(pk, abs=1e-6)
        assert tq[row].exp().tolist() == pytest.approx(qk, abs=1e-6)
        assert divergence(tp, tq, "jsd", 0.4)[row].item() == pytest.approx(
            _brute("jsd", pk, qk, 0.4), abs=2e-6
        )
    # the tail gets no gradient: only the teacher's top-k logits move
    logits = logits.requires_grad_()
    divergence(*restrict_to_teacher_top_k(p_log, torch.log_softmax(logits, -1), k)).sum().backward()
    top = torch.topk(p_log, k, -1).indices
    tail = torch.ones_like(logits, dtype=torch.bool).scatter(1, top, False)
    assert torch.all(logits.grad[tail].abs() < 1e-7) and logits.grad[~tail].abs().max() > 1e-3
    assert restrict_to_teacher_top_k(p_log, q_log, 8)[0] is p_log  # k >= V: the whole vocabulary


def test_bad_divergence_options_name_the_option():
    for kwargs, word in [
        ({"divergence": "kl"}, "LossOptions.divergence must be one of 'forward_kl', 'reverse_kl', 'jsd'"),
        ({"divergence": "jsd", "beta": 1.5}, "LossOptions.beta"),
        ({"divergence": "jsd", "beta": -0.1}, "LossOptions.beta"),
        ({"divergence": "forward_kl", "teacher_top_k": 0}, "LossOptions.teacher_top_k"),
        ({"divergence": "forward_kl", "teacher_top_k": -3}, "LossOptions.teacher_top_k"),
    ]:
        with pytest.raises(ConfigError, match=word):
            LossOptions(**kwargs)


# ---------------------------------------------------------------------------------------------------------
# Through the model: chunked terms and gradients against per-prefix model calls


def _reference_loss(teacher, student, kind, beta, top_k):
    if top_k is not None:
        teacher, student = restrict_to_teacher_top_k(teacher, student, top_k)
    return divergence(teacher, student, kind, beta)


@pytest.mark.parametrize(
    ("kind", "beta", "top_k", "chunk"),
    [
        ("forward_kl", 0.5, None, 1),
        ("reverse_kl", 0.5, None, 3),
        ("jsd", 0.3, 5, 4),
        ("forward_kl", 0.5, 7, 2),
    ],
)
def test_chunked_terms_and_gradients_match_brute_force(tiny_gpt2_dir, kind, beta, top_k, chunk):
    model, tok = load_causal_lm(str(tiny_gpt2_dir)), load_tokenizer(str(tiny_gpt2_dir))
    with torch.no_grad():
        model.transformer.wte.weight.mul_(5)
    sampled = with_early_eos(sample_rollouts(model, tok, SAMPLE_PROMPTS), tok.eos_token_id)
    k, alpha, prefix = 3, -0.7, Encoder(tok).prefix
    options = {"divergence": kind, "beta": beta, "teacher_top_k": top_k}

    grads = []
    for size in (chunk, None):  # None: one chunk holds every position (341+ for this vocabulary)
        model.zero_grad()
        terms = tuning_kl_terms(
            model, sampled, k=k, alpha=alpha, options=LossOptions(chunk_size=size, **options), prefix=prefix
        )
        (terms.loss_sum / terms.kl.numel() + terms.anchor).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        if size == chunk:
            chunked = terms
    model.zero_grad()
    teacher, student, long = reference_terms(model, tok, sampled, k, alpha)
    ref = _reference_loss(teacher, student, kind, beta, top_k)
    ref.mean().backward()
    assert torch.equal(chunked.long, long)
    # per-position float32 sums over 1000 tokens, batched vs one prefix at a time: ~1e-6
    assert torch.allclose(chunked.kl, ref.detach(), atol=1e-5, rtol=1e-4)
    assert chunked.loss_sum.detach().item() == pytest.approx(float(ref.detach().sum()), rel=1e-4)
    for name, p in model.named_parameters():
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-7, rtol=1e-4), name  # chunked == whole
        assert torch.allclose(grads[0][name], p.grad, atol=1e-6, rtol=1e-3), name  # == brute force
    assert max(g.abs().max().item() for g in grads[0].values()) > 1e-4
    agree = teacher.argmax(-1) == student.detach().argmax(-1)
    assert torch.equal(chunked.agree, agree)


def test_chunks_that_split_rows_with_a_separate_teacher(tiny_gpt2_dir):
    """A frozen/EMA teacher runs its own forward per chunk; a chunk smaller than a row splits it."""
    model, tok = load_causal_lm(str(tiny_gpt2_dir)), load_tokenizer(str(tiny_gpt2_dir))
    teacher_model = load_causal_lm(str(tiny_gpt2_dir))
    with torch.no_grad():
        model.transformer.wte.weight.mul_(1.5)
    sampled = sample_rollouts(model, tok, SAMPLE_PROMPTS, max_new_tokens=7)
    terms = [
        tuning_kl_terms(
            model, sampled, k=3, alpha=-0.3, options=LossOptions(chunk_size=size), teacher_model=teacher_model
        )
        for size in (2, 5, None)
    ]
    teacher, student, _ = reference_terms(model, tok, sampled, 3, -0.3, teacher_model=teacher_model)
    ref = F.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)
    for t in terms:
        assert torch.allclose(t.kl, ref.detach(), atol=1e-5, rtol=1e-4)


def test_teacher_mixing_fast_path_is_the_general_path_bit_for_bit():
    """boosting.product_of_experts skips the -inf bookkeeping when every expert is finite (the coherence
    tuning teacher's usual case, 2.7x faster on [341, 49152]): the numbers must be identical, and inputs
    with -inf still go through the general path."""
    from cblight.boosting import mix_log_probs, normalize_log_scores, product_of_experts

    g = torch.Generator().manual_seed(0)
    full = torch.log_softmax(torch.randn(7, 300, generator=g) * 3, -1)
    short = torch.log_softmax(torch.randn(7, 300, generator=g) * 3, -1)
    for weights in ((1.4, -0.4), (1.0, -0.7), (0.0, 1.0), (1.05, -0.05)):
        general = normalize_log_scores(mix_log_probs([full, short], weights))
        assert torch.equal(product_of_experts([full, short], weights), general), weights
    vetoed = short.clone()
    vetoed[0, :5] = -math.inf
    weights = (1.4, -0.4)
    out = product_of_experts([full, vetoed], weights)
    assert torch.equal(out, normalize_log_scores(mix_log_probs([full, vetoed], weights)))
    assert torch.isfinite(out[1:]).all() and out[0, :5].exp().sum() > 0.99  # 0 ^ -a: the mass goes there
