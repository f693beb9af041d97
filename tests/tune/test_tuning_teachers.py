"""The EMA teacher against a brute-force moving average of the student's weights (and through a
checkpoint), LoRA through peft (adapter and merged exports load with from_pretrained and give the tuned
model's logits), and the validation perplexity on held-out human text against transformers' own loss."""

import copy
from functools import partial

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import AutoModelForCausalLM

from cblight.tune.export import ExportOptions
from cblight.tune.lora import LoraOptions
from cblight.tune.loss import tuning_kl_terms
from cblight.tune.prompt_data import PromptDataModule
from cblight.tune.teacher import EMA_KEY, TeacherOptions
from cblight.tune.validation import ValidationOptions, human_text_nll
from tests.tune.tuning_helpers import RUN_PROMPTS, tiny_trainer, tiny_tuning

pytestmark = pytest.mark.usefixtures("one_thread")


class _Weights(Callback):
    """The student's weights after every optimizer step."""

    def __init__(self):
        self.after: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after.append({n: p.detach().clone() for n, p in pl_module.model.named_parameters()})


def test_ema_teacher_is_the_moving_average_of_the_student(tiny_gpt2_dir, tmp_path):
    decay = 0.6
    module = tiny_tuning(tiny_gpt2_dir, teacher=TeacherOptions(kind="ema", ema_decay=decay))
    module.configure_model()  # fit's first hook, called here to read the starting weights
    start = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    weights = _Weights()
    every = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    trainer = tiny_trainer(3, tmp_path, [weights, every])
    trainer.fit(module, PromptDataModule(prompts=RUN_PROMPTS, batch_size=2))
    expected = dict(start)
    for after in weights.after:  # θ_ema ← d θ_ema + (1 - d) θ, step by step
        expected = {n: decay * expected[n] + (1 - decay) * after[n] for n in expected}
    for name, p in module.teacher.model.named_parameters():
        # three float32 lerps against the same three in another order of operations: ~1e-7
        assert torch.allclose(p, expected[name], atol=1e-6), name
    assert any(not torch.equal(expected[n], start[n]) for n in start)  # it moved
    assert any(not torch.equal(expected[n], weights.after[-1][n]) for n in start)  # and lags

    # the EMA is in the checkpoint, and a new module resumes from it
    state = torch.load(tmp_path / "epoch=0-step=3.ckpt", weights_only=True)
    assert set(state[EMA_KEY]) == set(start)
    fresh = tiny_tuning(tiny_gpt2_dir, teacher=TeacherOptions(kind="ema", ema_decay=decay))
    fresh.configure_model()
    fresh.on_load_checkpoint(state)
    for name, p in fresh.teacher.model.named_parameters():
        assert torch.equal(p, module.teacher.model.get_parameter(name)), name

    # the KL terms use the EMA model as the teacher
    sampled = module.sampler.sample(module.model, RUN_PROMPTS[:2])
    ours = module.kl_terms(sampled).kl
    ref = tuning_kl_terms(
        module.model, sampled, k=3, alpha=-0.5, teacher_model=copy.deepcopy(module.teacher.model)
    )
    assert torch.allclose(ours, ref.kl)


def test_lora_trains_adapters_and_exports_adapter_and_merged_models(tiny_model_dir, tmp_path):
    pytest.importorskip("peft")
    out = tmp_path / "hf"
    module = tiny_tuning(
        tiny_model_dir,
        lora=LoraOptions(rank=4),
        optimizer=partial(torch.optim.Adam, lr=3e-2),
        export=ExportOptions(dir=str(out)),
    )
    module.configure_model()
    trainable = [n for n, p in module.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    tiny_trainer(2, tmp_path).fit(module, PromptDataModule(prompts=RUN_PROMPTS, batch_size=2))

    ids = torch.tensor([[5, 9, 13, 17, 21, 25]])
    module.model.eval()
    with torch.no_grad():
        tuned = module.model(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(out).eval()(input_ids=ids).logits
        adapter = AutoModelForCausalLM.from_pretrained(out / "adapter").eval()(input_ids=ids).logits
    assert not torch.allclose(tuned, base, atol=1e-4)  # the adapters trained
    # merging adds B @ A into the weights: float32 rounding of one matmul, ~1e-6
    assert torch.allclose(merged, tuned, atol=1e-5)
    assert torch.allclose(adapter, tuned, atol=1e-5)
    assert (out / "adapter" / "adapter_config.json").exists()


def test_validation_perplexity_on_human_text_matches_transformers(tiny_model_dir, tmp_path):
    texts = [
        "The quick brown fox jumps over the lazy dog.",
        "A journey of a thousand miles begins with one step.",
    ]
    module = tiny_tuning(
        tiny_model_dir, validation=ValidationOptions(text_tokens=8, log_samples_every_n_steps=0)
    )
    module.configure_model()
    nll, tokens = human_text_nll(module.model, module.tokenizer, texts, max_tokens=8)
    start = module.tokenizer.bos_token_id if module.encoder.prefix else module.tokenizer.eos_token_id
    ref_nll, ref_tokens = 0.0, 0
    for text in texts:
        body = module.tokenizer(text, add_special_tokens=False)["input_ids"][:8]
        ids = torch.tensor([[start, *body]])
        with torch.no_grad():
            loss = module.model(input_ids=ids, labels=ids).loss  # mean over the len(body) predicted tokens
        ref_nll += float(loss) * len(body)
        ref_tokens += len(body)
    assert tokens == ref_tokens == 16
    assert nll == pytest.approx(ref_nll, rel=1e-5)  # float32 sums of 16 log-probs

    # and through validation: val/tuning/ppl from the data module's held-out texts
    texts_file = tmp_path / "human.txt"
    texts_file.write_text("\n".join(texts))
    trainer = tiny_trainer(1, tmp_path, val_check_interval=1, check_val_every_n_epoch=None)
    data = PromptDataModule(prompts=RUN_PROMPTS, batch_size=2, val_size=2, val_texts_file=str(texts_file))
    trainer.fit(module, data)
    # the weights moved by one step since ref_nll: compare to a fresh computation, not to ref_nll
    nll_after, tokens_after = human_text_nll(module.model, module.tokenizer, texts, max_tokens=8)
    ppl = trainer.callback_metrics["val/tuning/ppl"]
    assert float(ppl) == pytest.approx(float(torch.exp(torch.tensor(nll_after / tokens_after))), rel=1e-5)


def test_webtext_task_prompts_carry_their_documents(tmp_path):
    import json

    docs = [f"Sentence number {i} is here. And the rest of document {i} follows." for i in range(6)]
    (tmp_path / "webtext.train.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs))
    data = PromptDataModule(task="webtext", data_dir=str(tmp_path), val_size=2)
    val, texts = data.val_prompts(), data.val_texts()
    assert len(texts) == 2 and all(t.startswith(p) and t in docs for p, t in zip(val, texts))
