"""Coherence tuning maths and teacher (cblight.tune.loss, cblight.tune.rollouts) against hand-computed values, torch's kl_div and a
brute-force reference that runs the model on every prefix and every short window separately."""

import math

import pytest
import torch
import torch.nn.functional as F

from cblight.batching import left_pad
from cblight.errors import BoostingError, ConfigError
from cblight.models import load_causal_lm, load_tokenizer
from cblight.options import Boosting, Sampling
from cblight.scoring import Encoder
from cblight.tune.coherence_tuning import disable_dropout
from cblight.tune.divergences import divergence
from cblight.tune.loss import (
    LossOptions,
    boosted_teacher,
    kl_scope,
    sampled_token_mask,
    tuning_kl_terms,
)
from cblight.tune.preflight import check_shared_options
from cblight.tune.rollouts import sample_sequences
from tests.tune.tuning_helpers import SAMPLE_PROMPTS, reference_terms, sample_rollouts, with_early_eos

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------------
# The loss on small distributions


def test_kl_hand_computed():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.7, 0.2, 0.1]]).log()  # p = 0 (log p = -inf) contributes nothing
    q = torch.tensor([[0.25, 0.70, 0.05], [0.5, 0.3, 0.2]]).log()
    expected = [
        0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.7),
        0.7 * math.log(0.7 / 0.5) + 0.2 * math.log(0.2 / 0.3) + 0.1 * math.log(0.1 / 0.2),
    ]
    assert divergence(p, q).tolist() == pytest.approx(expected, abs=1e-6)
    assert divergence(p[0, :2], p[0, :2]).item() == pytest.approx(0.0, abs=1e-7)


def test_kl_matches_torch_kl_div():
    g = torch.Generator().manual_seed(0)
    p = torch.log_softmax(torch.randn(5, 7, generator=g) * 2, -1)
    q = torch.log_softmax(torch.randn(5, 7, generator=g), -1)
    ref = F.kl_div(q, p, log_target=True, reduction="none").sum(-1)
    assert torch.allclose(divergence(p, q), ref, atol=1e-6)
    assert torch.allclose(divergence(p, p), torch.zeros(5), atol=1e-6)


def test_kl_gradient_flows_only_into_the_student():
    p = torch.tensor([0.2, 0.3, 0.5]).log().requires_grad_()
    logits = torch.tensor([0.1, -0.4, 0.3], requires_grad=True)
    divergence(p, torch.log_softmax(logits, -1)).backward()
    assert p.grad is None
    # d KL / d logits = softmax(logits) - p
    assert torch.allclose(logits.grad, torch.softmax(logits.detach(), -1) - p.detach().exp(), atol=1e-6)


def test_boosted_teacher_generation_form_hand_computed():
    full = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]]).log()
    short = torch.tensor([[0.2, 0.3, 0.5]]).log()
    long = torch.tensor([True, False])
    teacher = boosted_teacher(full, short, long, alpha=-0.5)
    # p_full^1.5 p_short^-0.5, normalised; the short row is f_max itself
    raw = [0.5**1.5 / 0.2**0.5, 0.3**1.5 / 0.3**0.5, 0.2**1.5 / 0.5**0.5]
    assert teacher[0].exp().tolist() == pytest.approx([r / sum(raw) for r in raw], abs=1e-6)
    assert teacher[1].exp().tolist() == pytest.approx([0.6, 0.3, 0.1], abs=1e-6)


# ---------------------------------------------------------------------------------------------------------
# Scope


def test_sampled_token_mask_stops_after_first_eos():
    eos = 9
    seqs = torch.tensor([[0, 5, 1, eos, eos, eos], [5, 5, 1, 2, 3, 4], [0, 5, eos, 2, eos, 4]])
    mask = sampled_token_mask(seqs, prompt_width=2, eos_token_id=eos)
    assert mask.int().tolist() == [[0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [0, 0, 1, 0, 0, 0]]
    assert kl_scope(mask, last_m=3).int().tolist() == [[0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 1, 1], [0] * 6]
    assert torch.equal(kl_scope(mask, None), mask)


def test_option_checks():
    sampled, boosted = Sampling(do_sample=True, num_beams=1), Boosting(k=4, alpha=-0.1)
    check_shared_options(Boosting(k=32, alpha=-0.05), sampled)
    LossOptions(last_m=8)
    for make, word in [  # the shared option objects check themselves
        (lambda: Boosting(k=0, alpha=-0.1), "k"),
        (lambda: Boosting(k=2.5, alpha=-0.1), "k"),
        (lambda: Boosting(k=4, alpha=float("nan")), "alpha"),
        (lambda: Boosting(k=4, alpha=float("-inf")), "alpha"),
    ]:
        with pytest.raises(BoostingError, match=word):
            make()
    for make, word in [  # and tuning checks what it asks of them, and its own options
        (lambda: check_shared_options(Boosting(k=4, alpha=0.0), sampled), "boosting.alpha = 0"),
        (lambda: check_shared_options(Boosting(mode="response", alpha=-0.1), sampled), "boosting.mode"),
        (
            lambda: check_shared_options(Boosting(k=4, alpha=-0.1, form="next_token"), sampled),
            "boosting.form",
        ),
        (lambda: check_shared_options(boosted, Sampling(do_sample=False)), "sampling.do_sample"),
        (lambda: check_shared_options(boosted, Sampling(do_sample=True, num_beams=4)), "sampling.num_beams"),
        (lambda: LossOptions(last_m=0), "LossOptions.last_m must be an integer >= 1 or null, got 0"),
        (lambda: LossOptions(chunk_size=0), "LossOptions.chunk_size"),
        (lambda: LossOptions(window_chunk_size=-1), "LossOptions.window_chunk_size"),
    ]:
        with pytest.raises(ConfigError, match=word):
            make()


# ---------------------------------------------------------------------------------------------------------
# The teacher and the loss on a real (tiny) model, against a brute-force reference


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_kl_terms_match_brute_force(arch, tiny_gpt2_dir, tiny_llama_dir):
    path = tiny_gpt2_dir if arch == "gpt2" else tiny_llama_dir
    model, tok = load_causal_lm(str(path)), load_tokenizer(str(path))
    sampled = with_early_eos(sample_rollouts(model, tok, SAMPLE_PROMPTS), tok.eos_token_id)
    k, alpha = 3, -0.7
    terms = tuning_kl_terms(
        model, sampled, k=k, alpha=alpha, options=LossOptions(window_chunk_size=5), prefix=Encoder(tok).prefix
    )
    teacher, student, long = reference_terms(model, tok, sampled, k, alpha)
    ref_kl = F.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)
    assert terms.kl.numel() == int(sampled.sampled.sum()) == len(ref_kl)
    assert torch.equal(terms.long, long) and long.any() and not long.all()
    assert torch.allclose(terms.kl, ref_kl, atol=1e-5, rtol=1e-4)
    assert torch.all(terms.kl[~long] == 0)  # live teacher: f_alpha == f_max where the context is short
    targets = sampled.sequences[torch.nonzero(sampled.sampled, as_tuple=True)].view(-1, 1)
    ref_gap = (teacher.gather(1, targets) - student.detach().gather(1, targets)).squeeze(1)
    assert torch.allclose(terms.gap, ref_gap, atol=1e-5)

    # last_m: the same values at the positions of the last m columns
    last = tuning_kl_terms(
        model, sampled, k=k, alpha=alpha, options=LossOptions(last_m=4), prefix=Encoder(tok).prefix
    )
    in_last = kl_scope(sampled.sampled, 4)[torch.nonzero(sampled.sampled, as_tuple=True)]
    assert torch.allclose(last.kl, ref_kl[in_last], atol=1e-5, rtol=1e-4)


def test_teacher_carries_no_gradient(tiny_gpt2_dir):
    model, tok = load_causal_lm(str(tiny_gpt2_dir)), load_tokenizer(str(tiny_gpt2_dir))
    with torch.no_grad():  # peakier distributions, so the gradients are far from zero
        model.transformer.wte.weight.mul_(5)
    disable_dropout(model)  # the tiny GPT-2 has dropout 0.1, as GPT-2 does
    model.train()
    sampled = sample_rollouts(model, tok, SAMPLE_PROMPTS, max_new_tokens=8)
    k, alpha = 3, -0.5
    terms = tuning_kl_terms(model, sampled, k=k, alpha=alpha)
    (terms.loss_sum / terms.kl.numel() + terms.anchor).backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    teacher, student, _ = reference_terms(model, tok, sampled, k, alpha)
    assert not teacher.requires_grad
    F.kl_div(student, teacher, log_target=True, reduction="batchmean").backward()
    for name, p in model.named_parameters():
        # chunked KL vs torch's kl_div on the whole batch: float32 sums in another order; gradients
        # ~1e-4..1e-2 agree to ~1e-6 relative, so 1e-3 is loose but far below a wrong term (~100%)
        assert torch.allclose(ours[name], p.grad, atol=1e-6, rtol=1e-3), name
    assert max(g.abs().max().item() for g in ours.values()) > 1e-4


def test_frozen_teacher_uses_the_other_model(tiny_gpt2_dir):
    model, tok = load_causal_lm(str(tiny_gpt2_dir)), load_tokenizer(str(tiny_gpt2_dir))
    frozen = load_causal_lm(str(tiny_gpt2_dir))
    with torch.no_grad():
        model.transformer.wte.weight.mul_(1.5)
    sampled = sample_rollouts(model, tok, SAMPLE_PROMPTS[:2], max_new_tokens=6)
    terms = tuning_kl_terms(model, sampled, k=3, alpha=-0.3, teacher_model=frozen)
    teacher, student, _ = reference_terms(model, tok, sampled, 3, -0.3, teacher_model=frozen)
    ref_kl = F.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)
    assert torch.allclose(terms.kl, ref_kl, atol=1e-5, rtol=1e-4)
    assert terms.kl.min() > 0  # a different model: nonzero even where the context is short


def test_left_padded_sampling_matches_unpadded(tiny_gpt2_dir):
    """Explicit position ids: with top_k = 1 (deterministic), a left-padded batch samples what each
    prompt samples alone."""
    model, tok = load_causal_lm(str(tiny_gpt2_dir)), load_tokenizer(str(tiny_gpt2_dir))
    enc = Encoder(tok)
    ids, mask = left_pad([enc.context(p) for p in SAMPLE_PROMPTS], tok.pad_token_id, "cpu")
    kw = {"max_new_tokens": 6, "eos_token_id": None, "pad_token_id": tok.pad_token_id, "top_k": 1}
    model.train()
    batch = sample_sequences(model, ids, mask, **kw)
    assert model.training  # sampling ran in eval mode and gave the training mode back
    for i, p in enumerate(SAMPLE_PROMPTS):
        one = torch.tensor([enc.context(p)])
        alone = sample_sequences(model, one, torch.ones_like(one), **kw)
        mine = batch.sequences[i][batch.sampled[i]].tolist()
        assert mine == alone.sequences[0][alone.sampled[0]].tolist()
        assert len(mine) == 6 or mine[-1] == tok.eos_token_id
    assert batch.attention_mask[:, batch.prompt_width :].all()


def test_disable_dropout_makes_train_mode_deterministic(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir))
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    reference = model(input_ids=ids).logits
    for (
        module
    ) in model.modules():  # every kind of dropout on: modules and Llama's functional attention dropout
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.5
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.5
    model.train()
    assert not torch.allclose(model(input_ids=ids).logits, reference)
    disable_dropout(model)
    assert model.training
    # eval-mode reference vs train mode without dropout: identical kernels, ~1e-7 float32 noise at most
    assert torch.allclose(model(input_ids=ids).logits, reference, atol=1e-6)
    assert torch.allclose(model(input_ids=ids).logits, reference, atol=1e-6)


def test_sampling_ignores_the_models_own_generation_settings(tiny_gpt2_dir):
    """generate() fills unset options from the model's generation config; here that config suppresses
    all but the last 257 tokens, which must not leak into the tuning samples (they come from f)."""
    model, tok = load_causal_lm(str(tiny_gpt2_dir)), load_tokenizer(str(tiny_gpt2_dir))
    model.generation_config.suppress_tokens = list(range(50000))
    sampled = sample_rollouts(model, tok, SAMPLE_PROMPTS[:2], max_new_tokens=8)
    assert (sampled.sequences[sampled.sampled] < 50000).any()
    assert model.generation_config.suppress_tokens == list(range(50000))  # given back
