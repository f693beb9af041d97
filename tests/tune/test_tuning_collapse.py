"""Safe from collapse: the trust region and the refreshed live teacher against brute-force
references, the validation's diversity metrics against hand computations, and the collapse guard on a run
that collapses on purpose (stopped, its last good checkpoint kept and named, nothing exported)."""

import logging
import math
from functools import partial

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from cblight.errors import ConfigError
from cblight.metrics.text_stats import ends_in_repetition
from cblight.models import load_causal_lm, load_tokenizer
from cblight.options import Boosting
from cblight.scoring import Encoder
from cblight.tune.callbacks import CollapseGuard, GuardOptions
from cblight.tune.export import ExportOptions
from cblight.tune.loss import LossOptions, tuning_kl_terms
from cblight.tune.prompt_data import PromptDataModule
from cblight.tune.teacher import EMA_KEY, TeacherOptions
from cblight.tune.validation import SampleDiversity, next_token_entropy, sampled_tokens
from tests.tune.tuning_helpers import (
    RUN_PROMPTS,  # for Lightning runs: training and held-out
    SAMPLE_PROMPTS,
    reference_terms,
    sample_rollouts,
    tiny_trainer,
    tiny_tuning,
    with_early_eos,
)

pytestmark = pytest.mark.usefixtures("one_thread")

# ---------------------------------------------------------------------------------------------------------
# The trust region: beta * KL(f_θ || f_0) per position, value and gradient


def _per_prefix_log_probs(model, sampled):
    """f(·|w_<c) of ``model`` at every sampled position, one unpadded forward per prefix, no gradient."""
    out = []
    with torch.no_grad():
        for r, c in zip(*[x.tolist() for x in torch.nonzero(sampled.sampled, as_tuple=True)]):
            start = int((sampled.attention_mask[r] == 0).sum())
            logits = model(input_ids=sampled.sequences[r, start:c].view(1, -1)).logits[0, -1]
            out.append(torch.log_softmax(logits.double(), -1).float())
    return torch.stack(out)


@pytest.mark.parametrize("teacher", ["live", "frozen"])
def test_trust_region_value_and_gradient_match_brute_force(teacher, tiny_gpt2_dir):
    """live: f_0 is a separate model; frozen: the teacher is f_0 and its own pass is reused."""
    model, tok = load_causal_lm(str(tiny_gpt2_dir)), load_tokenizer(str(tiny_gpt2_dir))
    initial = load_causal_lm(str(tiny_gpt2_dir)).eval().requires_grad_(False)
    with torch.no_grad():  # the student has moved away from the initial model, and is peaky
        model.transformer.wte.weight.mul_(4)
    sampled = with_early_eos(sample_rollouts(model, tok, SAMPLE_PROMPTS), tok.eos_token_id)
    k, alpha, beta = 3, -0.7, 0.4
    teacher_model = initial if teacher == "frozen" else None
    terms = tuning_kl_terms(
        model,
        sampled,
        k=k,
        alpha=alpha,
        options=LossOptions(chunk_size=5),
        prefix=Encoder(tok).prefix,
        teacher_model=teacher_model,
        reference_model=initial,
        trust_region=beta,
    )
    (terms.loss_sum / terms.kl.numel() + terms.anchor).backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    teachers, students, _ = reference_terms(model, tok, sampled, k, alpha, teacher_model=teacher_model)
    f0 = _per_prefix_log_probs(initial, sampled)
    kl = F.kl_div(students, teachers, log_target=True, reduction="none").sum(-1)
    trust = (students.exp() * (students - f0)).sum(-1)  # KL(f_θ || f_0), the definition
    # float32 sums over a 1000-token vocabulary, batched vs one prefix at a time: ~1e-6
    assert torch.allclose(terms.kl, kl.detach(), atol=1e-5, rtol=1e-4)
    assert torch.allclose(terms.trust, trust.detach(), atol=1e-5, rtol=1e-4)
    assert terms.trust.min() > 1e-3  # the student differs from f_0 everywhere
    total = float((kl + beta * trust).sum())
    assert terms.loss_sum.item() == pytest.approx(total, rel=1e-4)
    (kl + beta * trust).mean().backward()
    for name, p in model.named_parameters():
        # as tests/tune/test_tuning_divergences.py: 1e-3 relative is loose against float32 reordering (~1e-6) and
        # far below a missing or mis-weighted penalty (its gradient is ~40% of the total here)
        assert torch.allclose(ours[name], p.grad, atol=1e-6, rtol=1e-3), name

    without = tuning_kl_terms(model, sampled, k=k, alpha=alpha, teacher_model=teacher_model)
    assert without.trust.abs().max() == 0 and torch.allclose(without.kl, terms.kl, atol=1e-6)


def test_teacher_option_checks():
    for make, words in [
        (lambda: TeacherOptions(kind="frozen", refresh_every=4), "teacher.refresh_every applies to the live"),
        (
            lambda: TeacherOptions(kind="live", refresh_every=0),
            r"TeacherOptions\.refresh_every must be an integer >= 1",
        ),
        (lambda: TeacherOptions(trust_region=-0.1), r"TeacherOptions\.trust_region must be a number >= 0"),
        (lambda: TeacherOptions(trust_region=float("nan")), "TeacherOptions.trust_region"),
        (lambda: GuardOptions(max_ppl_ratio=0), r"GuardOptions\.max_ppl_ratio must be a finite number >= 1"),
        (
            lambda: GuardOptions(min_distinct_ratio=80),
            r"GuardOptions\.min_distinct_ratio must be a number in \(0, 1\]",
        ),
        (
            lambda: GuardOptions(max_repetition=1.5),
            r"GuardOptions\.max_repetition must be a number in \[0, 1\]",
        ),
    ]:
        with pytest.raises(ConfigError, match=words):
            make()
    assert not TeacherOptions(kind="live", refresh_every=1).snapshot  # 1 is the live teacher itself
    assert TeacherOptions(kind="live", refresh_every=3).snapshot


# the tuning module's defaults with a learning rate at which a few steps move a tiny model visibly
_tuning = partial(tiny_tuning, optimizer=partial(torch.optim.Adam, lr=1e-2))


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_refreshed_live_teacher_is_a_snapshot_every_n_steps(tiny_gpt2_dir, tmp_path):
    """refresh_every = 2: after steps 2 and 4 the teacher is the student of that step; after step 3 it is
    still step 2's; the snapshot is checkpointed, and a resumed run ends with the uninterrupted run's
    weights."""
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint

    seen = {}

    class Record(Callback):
        def on_train_batch_end(self, trainer, module, *args):
            seen[trainer.global_step] = (_weights(module.model), _weights(module.teacher.model))

    data = partial(PromptDataModule, prompts=RUN_PROMPTS, batch_size=2)
    options = TeacherOptions(kind="live", refresh_every=2)
    module = _tuning(tiny_gpt2_dir, teacher=options)
    module.configure_model()
    initial = _weights(module.model)
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    tiny_trainer(4, tmp_path, [Record(), every]).fit(module, data())
    for name, value in seen[1][1].items():
        assert torch.equal(value, initial[name]), name  # step 1: still the initial weights
    for step, source in ((2, 2), (3, 2), (4, 4)):
        student = seen[source][0]
        assert all(torch.equal(v, student[n]) for n, v in seen[step][1].items()), step
    assert not all(torch.equal(v, seen[3][0][n]) for n, v in seen[3][1].items())  # step 3 moved on

    mid = tmp_path / "ckpt" / "epoch=0-step=3.ckpt"
    assert EMA_KEY in torch.load(mid, weights_only=True)
    resumed = _tuning(tiny_gpt2_dir, teacher=options)
    tiny_trainer(4, tmp_path).fit(resumed, data(), ckpt_path=str(mid))
    for name, value in _weights(module.model).items():
        assert torch.equal(value, _weights(resumed.model)[name]), name


# ---------------------------------------------------------------------------------------------------------
# Validation: entropy, distinct-n, repetition


def test_sample_diversity_matches_hand_counts():
    samples = [[1, 2, 3, 1, 2], [4, 4, 4, 4, 4, 4], [7, 8, 9, 50]]
    metric = SampleDiversity(eos_token_id=50)
    metric.update(samples[:2])
    metric.update(samples[2:])
    values = {k: float(v) for k, v in metric.compute().items()}
    # unigrams: 1,2,3,1,2 | 4 x6 | 7,8,9,50 -> 15 tokens, distinct {1,2,3,4,7,8,9,50} = 8
    assert values["distinct_1"] == pytest.approx(8 / 15)
    # bigrams: (1,2)(2,3)(3,1)(1,2) | (4,4) x5 | (7,8)(8,9)(9,50) -> 12, distinct 3 + 1 + 3 = 7
    assert values["distinct_2"] == pytest.approx(7 / 12)
    # degen's rule: only "4 4 4 4 4 4" ends in a loop (a 1-token span repeated 6 times is not one: m < 3
    # and r <= 50), so none does; "1 2 3 1 2" does not either
    assert [ends_in_repetition(s, eos_token_id=50) for s in samples] == [False, False, False]
    assert values["repetition"] == 0.0
    looping = SampleDiversity(eos_token_id=50)
    looping.update([[5, 6, 7, 5, 6, 7, 5, 6, 7, 50], [1, 2, 3]])
    assert float(looping.compute()["repetition"]) == 0.5


def test_next_token_entropy_matches_per_prefix_calls(tiny_model_dir):
    model, tok = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    model.train()
    sampled = with_early_eos(sample_rollouts(model, tok, SAMPLE_PROMPTS), tok.eos_token_id)
    ours = next_token_entropy(model, sampled)
    assert model.training  # measured in eval mode, the training mode given back
    ref = _per_prefix_log_probs(model.eval(), sampled)
    expected = -(ref.exp() * ref).sum(-1)  # H = -Σ f log f
    assert ours.shape == expected.shape == (int(sampled.sampled.sum()),)
    assert torch.allclose(ours, expected, atol=1e-5, rtol=1e-5)
    assert expected.max() <= math.log(model.config.vocab_size) + 1e-5
    tokens = sampled_tokens(sampled)
    assert tokens[0][-1] == tok.eos_token_id and len(tokens[0]) == 3  # up to the early EOS


def test_validation_logs_diversity_beside_the_initial_models(tiny_gpt2_dir, tmp_path):
    """Every validation logs entropy, distinct-1/2, repetition and the held-out perplexity, and (with a
    frozen copy of the initial model) the same of the initial model, measured once."""
    from lightning.pytorch.loggers import CSVLogger

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(RUN_PROMPTS) + "\n")
    module = _tuning(tiny_gpt2_dir, teacher=TeacherOptions(kind="frozen"))
    data = PromptDataModule(prompts=RUN_PROMPTS, batch_size=2, val_size=2, val_texts_file=str(texts))
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        max_steps=2,
        accelerator="cpu",
        logger=CSVLogger(tmp_path, name="run"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        val_check_interval=1,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, data)
    import csv

    with open(tmp_path / "run" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    logged = {k for row in rows for k, v in row.items() if v}
    for name in ("ppl", "entropy", "distinct_1", "distinct_2", "repetition", "kl_initial"):
        assert f"val/tuning/{name}" in logged, name
    for name in ("ppl", "entropy", "distinct_2"):
        values = [float(r[f"val/tuning/{name}_initial"]) for r in rows if r.get(f"val/tuning/{name}_initial")]
        assert len(values) == 2 and values[0] == values[1] > 0  # measured once, logged at each check


# ---------------------------------------------------------------------------------------------------------
# The guard


def test_guard_bands():
    guard = GuardOptions(max_ppl_ratio=1.5, min_distinct_ratio=0.8, max_repetition=0.25)
    base = {"ppl": 10.0, "ppl_initial": 10.0, "distinct_2": 0.9, "distinct_2_initial": 0.9, "repetition": 0.0}
    assert guard.violation(base) is None
    assert guard.violation({**base, "ppl": 14.9}) is None
    assert guard.violation({**base, "ppl": 15.1}) == (
        "val/tuning/ppl = 15.1 is above guard.max_ppl_ratio = 1.5 x the initial model's 10 (= 15)"
    )
    assert "val/tuning/distinct_2 = 0.7 is below guard.min_distinct_ratio" in guard.violation(
        {**base, "distinct_2": 0.7}
    )
    assert "is above guard.max_ppl_ratio" in guard.violation({**base, "ppl": float("nan")})
    assert "val/tuning/repetition = 0.5 is above guard.max_repetition = 0.25" in guard.violation(
        {**base, "repetition": 0.5}
    )
    assert GuardOptions(min_entropy_ratio=0.5).violation(base) is None  # entropy not measured: not checked
    off = GuardOptions(max_ppl_ratio=None, min_entropy_ratio=None)
    assert not off.enabled and guard.enabled and GuardOptions().enabled  # on by default


def test_guard_stops_a_collapsing_run_and_keeps_its_last_good_checkpoint(peaky_gpt2_dir, tmp_path, caplog):
    """The learning rate is 0 for 2 steps (the validation at step 2 passes: the model is the initial one)
    and then huge, with the paper's live teacher at a strong boost: the model collapses, the validation at
    step 4 fails its perplexity band, the run stops there (of 12 steps) and the checkpoint of step 2 is kept,
    named, and holds step 2's weights; nothing is exported."""
    from lightning.pytorch.callbacks import Callback

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(RUN_PROMPTS * 3) + "\n")
    weights = {}

    class Record(Callback):
        def on_train_batch_end(self, trainer, module, *args):
            weights[trainer.global_step] = _weights(module.model)

    module = _tuning(
        peaky_gpt2_dir,
        boosting=Boosting(k=2, alpha=-2.0),
        teacher=TeacherOptions(kind="live"),
        guard=GuardOptions(max_ppl_ratio=1.5),
        optimizer=partial(torch.optim.Adam, lr=0.3),
        lr_scheduler=partial(
            torch.optim.lr_scheduler.LambdaLR, lr_lambda=lambda step: 0.0 if step < 2 else 1.0
        ),
        export=ExportOptions(dir=str(tmp_path / "export")),
    )
    data = PromptDataModule(prompts=RUN_PROMPTS, batch_size=4, val_size=2, val_texts_file=str(texts))
    trainer = tiny_trainer(12, tmp_path, [Record()], val_check_interval=2, check_val_every_n_epoch=None)
    with caplog.at_level(logging.WARNING):
        trainer.fit(module, data)
    guard = next(c for c in trainer.callbacks if isinstance(c, CollapseGuard))
    assert trainer.global_step == 4, trainer.global_step
    assert guard.reason.startswith("val/tuning/ppl = ") and "guard.max_ppl_ratio = 1.5" in guard.reason
    good = tmp_path / "checkpoints" / "last_good.ckpt"
    assert guard.good_checkpoint == str(good) and guard.good_step == 2 and good.exists()
    message = f"collapse guard: {guard.reason} at step 4; stopped the run, no export; the last good checkpoint is {good} (step 2)"
    assert message in caplog.text
    state = torch.load(good, weights_only=True)
    assert state["global_step"] == 2
    for name, value in weights[2].items():
        assert torch.equal(state["state_dict"][f"model.{name}"], value), name
    assert not (tmp_path / "export").exists()


def test_guard_needs_what_it_checks(tiny_gpt2_dir, tmp_path):
    """A band set by hand must be checkable (the default band is checked where the run measures it)."""
    module = _tuning(tiny_gpt2_dir, guard=GuardOptions(max_ppl_ratio=1.4))
    with pytest.raises(ConfigError, match=r"guard\.max_ppl_ratio needs held-out human text"):
        tiny_trainer(2, tmp_path).fit(module, PromptDataModule(prompts=RUN_PROMPTS, batch_size=2, val_size=2))
    with pytest.raises(ConfigError, match=r"\(guard\.max_ppl_ratio\): set data\.val_size > 0"):
        tiny_trainer(2, tmp_path).fit(module, PromptDataModule(prompts=RUN_PROMPTS, batch_size=2))


@pytest.mark.parametrize(
    ("teacher", "alpha", "lr", "collapses"),
    [("live", -2.0, 0.3, True), ("frozen", -0.5, 1e-3, False)],
)
def test_default_guard_stops_a_collapsing_run_and_exports_a_healthy_one(
    teacher, alpha, lr, collapses, peaky_gpt2_dir, tmp_path, caplog
):
    """With no guard option given: the live teacher at a strong boost and a huge learning rate collapses the
    peaked tiny model and is stopped at its first validation, nothing exported; the frozen teacher at the
    tests' usual rate stays inside the default band and exports."""
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(RUN_PROMPTS * 3) + "\n")
    module = _tuning(
        peaky_gpt2_dir,
        boosting=Boosting(k=2, alpha=alpha),
        teacher=TeacherOptions(kind=teacher),
        optimizer=partial(torch.optim.Adam, lr=lr),
        export=ExportOptions(dir=str(tmp_path / "export")),
    )
    assert module.guard_options == GuardOptions(max_ppl_ratio=1.5, min_entropy_ratio=0.6)
    data = PromptDataModule(prompts=RUN_PROMPTS, batch_size=4, val_size=2, val_texts_file=str(texts))
    trainer = tiny_trainer(4, tmp_path, val_check_interval=2, check_val_every_n_epoch=None)
    with caplog.at_level(logging.WARNING):
        trainer.fit(module, data)
    guard = next(c for c in trainer.callbacks if isinstance(c, CollapseGuard))
    values = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if collapses:
        assert trainer.global_step == 2 and guard.reason is not None
        assert f"collapse guard: {guard.reason} at step 2; stopped the run, no export" in caplog.text
        assert not (tmp_path / "export").exists()
    else:
        assert trainer.global_step == 4 and guard.reason is None, guard.reason
        assert values["val/tuning/ppl"] < 1.5 * values["val/tuning/ppl_initial"]
        assert (tmp_path / "export" / "model.safetensors").exists()
