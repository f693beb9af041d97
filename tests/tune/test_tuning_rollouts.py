"""Fast rollouts: sampling with transformers' static KV cache, and with a compiled decode step,
draws exactly the dynamic cache's sequences from the same random state (both tiny architectures); ``auto``
picks them only where they pay and the model supports them, and falls back to the dynamic cache elsewhere;
asking for them by name on a model that cannot is one line."""

from functools import partial

import lightning as L
import pytest
import torch

from cblight.batching import left_pad
from cblight.errors import ConfigError
from cblight.models import load_causal_lm, load_tokenizer
from cblight.options import Boosting
from cblight.scoring import Encoder
from cblight.tune.coherence_tuning import CoherenceTuning
from cblight.tune.export import ExportOptions
from cblight.tune.prompt_data import PromptDataModule
from cblight.tune.rollouts import RolloutOptions, sample_sequences
from cblight.tune.validation import ValidationOptions

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["The quick brown fox jumps over the lazy dog", "A journey", "Question: what is the capital of"]


def _batch(tok):
    enc = Encoder(tok)
    return left_pad([enc.context(p) for p in PROMPTS], tok.pad_token_id, "cpu")


def _draw(model, tok, **kwargs):
    ids, mask = _batch(tok)
    torch.manual_seed(0)
    out = sample_sequences(
        model,
        ids,
        mask,
        max_new_tokens=12,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **kwargs,
    )
    return out.sequences, out.sampled


def test_static_cache_samples_what_the_dynamic_cache_samples(tiny_model_dir):
    """Left-padded prompts with explicit position ids; a cache longer than needed (the run's ceiling), then
    reused by a second call of another prompt width."""
    model, tok = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    dynamic = _draw(model, tok)
    static = _draw(model, tok, static_cache_len=64)
    assert torch.equal(dynamic[0], static[0]) and torch.equal(dynamic[1], static[1])
    assert dynamic[1].sum() > 0
    one = tok(PROMPTS[1], return_tensors="pt").input_ids
    torch.manual_seed(1)
    a = sample_sequences(
        model, one, torch.ones_like(one), max_new_tokens=5, eos_token_id=None, pad_token_id=0
    )
    torch.manual_seed(1)
    b = sample_sequences(
        model,
        one,
        torch.ones_like(one),
        max_new_tokens=5,
        eos_token_id=None,
        pad_token_id=0,
        static_cache_len=64,
    )
    assert torch.equal(a.sequences, b.sequences)


@pytest.mark.slow
def test_compiled_decode_step_samples_what_the_dynamic_cache_samples(tiny_llama_dir):
    """torch.compile (inductor; on CPU only when asked for): the same tokens from the same random state.
    Compiling even a tiny model takes a minute on a loaded 2-core machine."""
    model, tok = load_causal_lm(str(tiny_llama_dir)), load_tokenizer(str(tiny_llama_dir))
    dynamic = _draw(model, tok)
    compiled = _draw(model, tok, static_cache_len=64, compile=True)
    assert torch.equal(dynamic[0], compiled[0])
    again = _draw(model, tok, static_cache_len=64, compile=True)  # the compiled step is reused
    assert torch.equal(dynamic[0], again[0])


def test_auto_picks_the_static_cache_only_where_it_pays(tiny_gpt2_dir, monkeypatch):
    model = load_causal_lm(str(tiny_gpt2_dir))
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # resolve() only reads the device type
    auto = RolloutOptions()
    assert auto.resolve(model, cpu) == (False, False)  # CPU: the compile does not pay within 32 steps
    assert auto.resolve(model, cuda) == (True, True)  # GPU: static cache + CUDA graphs
    assert auto.resolve(model, cuda, sharded=True) == (False, False)  # FSDP: left as it was
    assert RolloutOptions(cache="auto", compile=False).resolve(model, cuda) == (True, False)
    assert RolloutOptions(cache="static").resolve(model, cpu) == (True, False)
    assert RolloutOptions(cache="static", compile=True).resolve(model, cpu) == (True, True)
    assert RolloutOptions(cache="dynamic").resolve(model, cuda) == (False, False)

    # a model that transformers cannot compile: auto falls back to the dynamic cache, static is refused
    monkeypatch.setattr(type(model), "_can_compile_fullgraph", False)
    assert auto.resolve(model, cuda) == (False, False)
    with pytest.raises(ConfigError, match="GPT2LMHeadModel does not support transformers' static cache"):
        RolloutOptions(cache="static").resolve(model, cpu)
    with pytest.raises(ConfigError, match=r"rollouts\.cache: dynamic or auto"):
        CoherenceTuning(
            model=str(tiny_gpt2_dir), boosting=Boosting(k=3, alpha=-0.5), rollouts=RolloutOptions("static")
        )


def test_rollout_option_checks():
    for make, words in [
        (
            lambda: RolloutOptions(cache="paged"),
            "RolloutOptions.cache must be one of 'auto', 'dynamic', 'static'",
        ),
        (lambda: RolloutOptions(cache="dynamic", compile=True), "rollouts.compile: true needs"),
        (lambda: RolloutOptions(compile="yes"), "RolloutOptions.compile must be true or false or null"),
    ]:
        with pytest.raises(ConfigError, match=words):
            make()


def test_a_run_with_the_static_cache_reaches_the_dynamic_runs_weights(tmp_path, tiny_gpt2_dir):
    def run(rollouts):
        module = CoherenceTuning(
            model=str(tiny_gpt2_dir),
            boosting=Boosting(k=3, alpha=-0.5),
            max_new_tokens=6,
            rollouts=rollouts,
            optimizer=partial(torch.optim.Adam, lr=1e-3),
            export=ExportOptions(enabled=False),
            validation=ValidationOptions(log_samples_every_n_steps=0),
        )
        L.Trainer(
            default_root_dir=tmp_path,
            max_steps=2,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        ).fit(module, PromptDataModule(prompts=PROMPTS * 2, batch_size=3))
        assert module.sampler.decoding == (rollouts.cache == "static", False)
        return module.model.state_dict()

    dynamic, static = run(RolloutOptions(cache="dynamic")), run(RolloutOptions(cache="static"))
    for name, value in dynamic.items():
        assert torch.equal(value, static[name]), name
