"""The coherence-tuning LightningModule and prompt data module: a tiny run moves the model towards its
boosted version, resuming from a mid-run checkpoint reaches the uninterrupted run's weights, the Hugging
Face export reloads with the same logits, and bad input fails before any work starts."""

import copy
from functools import partial

import lightning as L
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cblight.errors import CblightError, ConfigError
from cblight.models import ModelLoadError, load_causal_lm
from cblight.options import Boosting, Sampling
from cblight.tune.coherence_tuning import CoherenceTuning
from cblight.tune.export import ExportOptions
from cblight.tune.loss import LossOptions, tuning_kl_terms
from cblight.tune.prompt_data import PromptDataError, PromptDataModule, PromptStream, read_prompts
from cblight.tune.rollouts import RNG_KEY
from cblight.tune.teacher import EMA_KEY, TeacherOptions
from cblight.tune.validation import ValidationOptions
from tests.tune.tuning_helpers import RUN_PROMPTS, tiny_trainer, tiny_tuning

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("teacher", ["frozen", "live"])
def test_tiny_run_moves_the_model_towards_its_boosted_version(tmp_path, peaky_gpt2_dir, teacher):
    """Held-out samples of the initial model: KL(boosted initial model || tuned model) falls.

    With the paper's live teacher the objective itself need not fall (each step re-boosts the current
    model); what tuning buys is a model close to the boosted initial one, which is what this measures.
    """
    torch.manual_seed(0)
    module = CoherenceTuning(
        model=str(peaky_gpt2_dir),
        teacher=TeacherOptions(kind=teacher),
        boosting=Boosting(k=4, alpha=-0.5),
        max_new_tokens=10,
        optimizer=partial(torch.optim.Adam, lr=3e-4),
        export=ExportOptions(enabled=False),
        validation=ValidationOptions(log_samples_every_n_steps=0),
    )
    module.configure_model()  # what fit does first (Lightning's hook), to copy the initial model here
    initial = copy.deepcopy(module.model).eval()
    held_out = [module.sampler.sample(module.model, RUN_PROMPTS, seed=100 + i) for i in range(2)]

    def held_out_kl():
        with torch.no_grad():
            terms = [
                tuning_kl_terms(module.model, s, k=4, alpha=-0.5, teacher_model=initial) for s in held_out
            ]
        return float(torch.cat([t.kl for t in terms]).mean())

    before = held_out_kl()
    tiny_trainer(8, tmp_path).fit(module, PromptDataModule(prompts=RUN_PROMPTS, batch_size=6))
    after = held_out_kl()
    assert before > 0.01
    assert after < 0.8 * before, (before, after)


def _weights(module):
    return {k: v.detach().clone() for k, v in module.model.state_dict().items()}


def test_resume_from_mid_run_checkpoint_matches_uninterrupted_run(tiny_gpt2_dir, tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    data = partial(PromptDataModule, prompts=RUN_PROMPTS, batch_size=4)
    every2 = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    full = tiny_tuning(tiny_gpt2_dir)
    tiny_trainer(4, tmp_path, [every2]).fit(full, data())
    mid = tmp_path / "ckpt" / "epoch=0-step=2.ckpt"
    assert mid.exists()

    resumed = tiny_tuning(tiny_gpt2_dir)
    tiny_trainer(4, tmp_path).fit(resumed, data(), ckpt_path=str(mid))
    for name, value in _weights(full).items():
        assert torch.equal(value, _weights(resumed)[name]), name

    # The sampling state in the checkpoint is what makes this work: without it the samples differ.
    state = torch.load(mid, weights_only=True)
    assert state[RNG_KEY]["world_size"] == 1 and len(state[RNG_KEY]["cpu"]) == 1
    del state[RNG_KEY]
    torch.save(state, tmp_path / "no_rng.ckpt")
    reseeded = tiny_tuning(tiny_gpt2_dir)
    tiny_trainer(4, tmp_path).fit(reseeded, data(), ckpt_path=str(tmp_path / "no_rng.ckpt"))
    assert any(not torch.equal(v, _weights(reseeded)[n]) for n, v in _weights(full).items())


def test_checkpoint_reloads_with_its_option_objects(tiny_gpt2_dir, tmp_path):
    """save_hyperparameters round-trips: the checkpoint holds the option groups as plain mappings (it loads
    with weights_only=True) and load_from_checkpoint rebuilds the same objects, weights and EMA."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    options = dict(
        teacher=TeacherOptions(kind="ema", ema_decay=0.5),
        loss=LossOptions(divergence="jsd", beta=0.3, last_m=4),
        sampling=Sampling(do_sample=True, top_k=50, seed=7),
    )
    module = tiny_tuning(tiny_gpt2_dir, **options)
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    tiny_trainer(1, tmp_path, [every]).fit(module, PromptDataModule(prompts=RUN_PROMPTS, batch_size=2))
    ckpt = tmp_path / "ckpt" / "epoch=0-step=1.ckpt"
    saved = torch.load(ckpt, weights_only=True)
    assert saved["hyper_parameters"]["teacher"] == {
        "kind": "ema",
        "ema_decay": 0.5,
        "refresh_every": None,
        "trust_region": 0.0,
    }
    assert saved["hyper_parameters"]["boosting"]["k"] == 3 and EMA_KEY in saved

    reloaded = CoherenceTuning.load_from_checkpoint(ckpt)
    assert reloaded.boosting == Boosting(k=3, alpha=-0.5)
    assert reloaded.loss_options == options["loss"] and reloaded.teacher.options == options["teacher"]
    assert (reloaded.sampler.top_k, reloaded.sampler.seed, reloaded.sampler.max_new_tokens) == (50, 7, 6)
    assert reloaded.validator.options == ValidationOptions(log_samples_every_n_steps=0)
    assert reloaded.exporter.options == ExportOptions(enabled=False)
    for name, value in _weights(module).items():
        assert torch.equal(value, _weights(reloaded)[name]), name
    for name, p in module.teacher.model.named_parameters():
        assert torch.equal(p, reloaded.teacher.model.get_parameter(name)), name


def test_k_must_fit_the_model_window(tiny_gpt2_dir):
    with pytest.raises(ConfigError, match=r"boosting\.k = 300 must be smaller than the model window"):
        tiny_tuning(tiny_gpt2_dir, boosting=Boosting(k=300, alpha=-0.5))


def test_hf_export_reloads_with_the_same_logits(tiny_model_dir, tmp_path):
    module = tiny_tuning(tiny_model_dir, export=ExportOptions(dir=str(tmp_path / "hf")))
    tiny_trainer(2, tmp_path).fit(module, PromptDataModule(prompts=RUN_PROMPTS, batch_size=2))
    untouched = load_causal_lm(str(tiny_model_dir))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = tok(RUN_PROMPTS[0], return_tensors="pt")["input_ids"]
    module.model.eval()
    with torch.no_grad():
        ours, theirs = module.model(input_ids=ids).logits, reloaded(input_ids=ids).logits
        assert not torch.allclose(ours, untouched(input_ids=ids).logits)  # it did train
    assert torch.allclose(ours, theirs, atol=1e-6)  # the same float32 weights, saved and reloaded
    assert reloaded.config.to_dict().get("resid_pdrop", 0.1) == untouched.config.to_dict().get(
        "resid_pdrop", 0.1
    )


def test_validation_logs_held_out_kl(tmp_path, peaky_gpt2_dir):
    module = tiny_tuning(
        peaky_gpt2_dir, validation=ValidationOptions(against_initial=True, log_samples_every_n_steps=0)
    )
    trainer = tiny_trainer(2, tmp_path, val_check_interval=2, check_val_every_n_epoch=None)
    trainer.fit(module, PromptDataModule(prompts=RUN_PROMPTS, batch_size=3, val_size=2))
    metrics = trainer.callback_metrics
    for name in ["val/tuning/kl", "val/tuning/kl_long", "val/tuning/kl_initial", "train/tuning/loss"]:
        assert name in metrics and torch.isfinite(metrics[name]), name
    assert metrics["val/tuning/kl_initial"] > 0


def test_gradient_checkpointing_gives_the_same_gradients(tiny_gpt2_dir):
    plain, checkpointed = tiny_tuning(tiny_gpt2_dir), tiny_tuning(tiny_gpt2_dir, gradient_checkpointing=True)
    plain.configure_model(), checkpointed.configure_model()
    assert checkpointed.model.is_gradient_checkpointing and checkpointed.model.training
    sampled = plain.sampler.sample(plain.model, RUN_PROMPTS[:3])
    grads = []
    for module in (plain, checkpointed):
        terms = module.kl_terms(sampled)
        (terms.loss_sum / terms.kl.numel() + terms.anchor).backward()
        grads.append({n: p.grad for n, p in module.model.named_parameters()})
    for name, grad in grads[0].items():
        # checkpointing recomputes the forward in backward: same maths, float32 kernels may reorder sums
        assert torch.allclose(grad, grads[1][name], atol=1e-7, rtol=1e-4), name


def test_bf16_mixed_precision_step(tmp_path, tiny_gpt2_dir):
    module = tiny_tuning(tiny_gpt2_dir)
    module.configure_model()
    before = _weights(module)
    trainer = tiny_trainer(1, tmp_path, precision="bf16-mixed")
    trainer.fit(module, PromptDataModule(prompts=RUN_PROMPTS, batch_size=2))
    assert torch.isfinite(trainer.callback_metrics["train/tuning/loss"])
    assert any(not torch.equal(v, _weights(module)[n]) for n, v in before.items())
    assert all(p.dtype == torch.float32 for p in module.model.parameters())


# ---------------------------------------------------------------------------------------------------------
# Prompt batches


def test_prompt_stream_ranks_share_the_global_batch():
    pool = [f"p{i}" for i in range(10)]
    one = PromptStream(pool, 4, seed=1)
    ranks = [PromptStream(pool, 2, rank=r, world_size=2, seed=1) for r in range(2)]
    for i in range(7):
        assert ranks[0].batch(i)["prompts"] + ranks[1].batch(i)["prompts"] == one.batch(i)["prompts"]
    # one epoch (2 global batches of 4 from 10 prompts) has no repeats
    seen = one.batch(0)["prompts"] + one.batch(1)["prompts"]
    assert len(set(seen)) == 8
    assert [b["index"] for b, _ in zip(PromptStream(pool, 4, start=5), range(3))] == [5, 6, 7]
    tiled = PromptStream(["a", "b"], 5).batch(0)["prompts"]
    assert sorted(tiled) in (["a", "a", "a", "b", "b"], ["a", "a", "b", "b", "b"])


def test_read_prompts_formats(tmp_path):
    (tmp_path / "p.txt").write_text("first\n\n second \n")
    (tmp_path / "p.jsonl").write_text('{"text": "a"}\n\n{"text": "b"}\n"c"\n')
    (tmp_path / "p.json").write_text('["x", {"prompt": "y"}]')
    assert read_prompts(tmp_path / "p.txt") == ["first", " second "]
    assert read_prompts(tmp_path / "p.jsonl") == ["a", "b", "c"]
    with pytest.raises(PromptDataError, match="field 'text'"):
        read_prompts(tmp_path / "p.json")
    (tmp_path / "q.jsonl").write_text('{"text": "a"}\n{oops\n')
    with pytest.raises(CblightError, match=r"q\.jsonl line 2 is not valid JSON"):  # the data layer's reader
        read_prompts(tmp_path / "q.jsonl")


def test_bos_only_and_held_out_split():
    dm = PromptDataModule(bos_only=True, val_size=3)
    assert dm.train_prompts() == [""] and dm.val_prompts() == ["", "", ""]
    dm = PromptDataModule(prompts=RUN_PROMPTS, val_size=2, seed=0)
    assert len(dm.val_prompts()) == 2 and set(dm.val_prompts()).isdisjoint(dm.train_prompts())
    assert sorted(dm.val_prompts() + dm.train_prompts()) == sorted(RUN_PROMPTS)


# ---------------------------------------------------------------------------------------------------------
# Bad input: clear errors before any work starts


def test_invalid_options_fail_before_the_model_loads():
    for kwargs, word in [
        ({"boosting": Boosting(k=4, alpha=0)}, "boosting.alpha = 0"),
        ({"boosting": Boosting(mode="marker", alpha=-0.5)}, "boosting.mode"),
        ({"sampling": Sampling(do_sample=True, num_beams=2, seed=0)}, "sampling.num_beams"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_prompt_tokens": -1}, "max_prompt_tokens"),
    ]:
        with pytest.raises(ConfigError, match=word):
            CoherenceTuning(model="/does/not/exist", **kwargs)
    for make, word in [
        (lambda: TeacherOptions(kind="other"), "TeacherOptions.kind"),
        (
            lambda: TeacherOptions(ema_decay=1.5),
            r"TeacherOptions.ema_decay must be a number in \(0, 1\), got 1.5",
        ),
        (
            lambda: ValidationOptions(text_tokens=1),
            r"ValidationOptions.text_tokens must be an integer >= 2, got 1",
        ),
        (lambda: ExportOptions(enabled="no"), "ExportOptions.enabled must be true or false"),
    ]:
        with pytest.raises(ConfigError, match=word):
            make()


def test_missing_or_non_model_paths(tmp_path):
    with pytest.raises(ModelLoadError, match="no directory"):
        CoherenceTuning(model=str(tmp_path / "missing"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hi")
    with pytest.raises(ModelLoadError, match=r"not a (tokenizer|model) directory"):
        CoherenceTuning(model=str(tmp_path / "notes"))


def test_prompt_sources_that_yield_nothing(tmp_path):
    with pytest.raises(PromptDataError, match="exactly one prompt source"):
        PromptDataModule()
    with pytest.raises(PromptDataError, match="exactly one prompt source"):
        PromptDataModule(prompts=["a"], bos_only=True)
    with pytest.raises(PromptDataError, match="does not exist"):
        PromptDataModule(prompts_file=str(tmp_path / "missing.txt"))
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(PromptDataError, match="yields no prompts"):
        PromptDataModule(prompts_file=str(tmp_path / "blank.txt")).train_prompts()
    with pytest.raises(PromptDataError, match="yields no prompts"):
        PromptDataModule(prompts=[]).train_prompts()
    with pytest.raises(PromptDataError, match="leaves no training prompts"):
        PromptDataModule(prompts=["a", "b"], val_size=2).train_prompts()


def test_sequences_never_longer_than_k_are_refused_before_sampling(tmp_path, tiny_gpt2_dir):
    module = tiny_tuning(tiny_gpt2_dir, boosting=Boosting(k=8, alpha=-0.5), max_new_tokens=4)
    calls = []
    module.sampler.sample = lambda *args, **kwargs: calls.append(args)  # must never be reached
    trainer = tiny_trainer(2, tmp_path)
    with pytest.raises(ConfigError, match="identically zero"):
        trainer.fit(module, PromptDataModule(prompts=["Hi there"], batch_size=2))
    assert not calls and trainer.global_step == 0
    with pytest.raises(ConfigError, match="identically zero"):
        module.check_prompts([""])  # BOS alone + 4 tokens
    module.check_prompts(["one two three four five six seven"])  # 7 + 4 - 1 > 8
    with pytest.raises(ConfigError, match="max_steps"):
        L.Trainer(default_root_dir=tmp_path, max_epochs=1, logger=False, enable_progress_bar=False).fit(
            module, PromptDataModule(prompts=RUN_PROMPTS)
        )


def test_a_run_that_takes_no_step_exports_nothing_and_says_so(tiny_gpt2_dir, tmp_path, caplog):
    """Resuming from a checkpoint already at max_steps takes no optimizer step; its "tuned" export
    would be the checkpoint's weights written again as a result. A warning says so and nothing is written."""
    import logging

    from lightning.pytorch.callbacks import ModelCheckpoint

    data = partial(PromptDataModule, prompts=RUN_PROMPTS, batch_size=2)
    last = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    first = tiny_tuning(tiny_gpt2_dir, export=ExportOptions(dir=str(tmp_path / "first")))
    tiny_trainer(2, tmp_path, [last]).fit(first, data())
    assert (tmp_path / "first" / "config.json").exists()  # a run that took its steps exports

    again = tiny_tuning(tiny_gpt2_dir, export=ExportOptions(dir=str(tmp_path / "again")))
    with caplog.at_level(logging.WARNING, logger="cblight.tune.export"):
        tiny_trainer(2, tmp_path).fit(again, data(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert not (tmp_path / "again").exists()
    assert (
        "no optimizer step was taken in this run (it started at step 2 of max_steps 2): no export"
        in caplog.text
    )

    with pytest.raises(ConfigError, match=r"trainer\.max_steps = 0 takes no optimizer step"):
        tiny_trainer(0, tmp_path).fit(tiny_tuning(tiny_gpt2_dir), data())
