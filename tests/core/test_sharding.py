"""What sharding rests on, in one process: the FSDP2 builder gives the whole model's numbers from shards
filled straight from the checkpoint (on a 1-process gloo group), the synced-forward phases pad to the
right number of calls, and what FSDP2 cannot tune is refused in one line before anything loads. With LoRA
the initial model is the student with its adapters disabled, never a copy."""

from functools import partial

import pytest
import torch
import torch.distributed as dist

from cblight.errors import ConfigError
from cblight.models import LoadOptions, ModelLoadError, load_causal_lm
from cblight.sharding import SyncedForwards, build_sharded_causal_lm, full_state_dict, local_numel
from cblight.tune.lora import LoraOptions
from cblight.tune.preflight import check_strategy
from cblight.tune.rollouts import RolloutOptions
from tests.helpers import ROOT

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def mesh():
    """A 1-process gloo group and its mesh: FSDP2 as on a cluster, one shard."""
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def test_the_sharded_build_is_the_checkpoint(tiny_model_dir, mesh):
    from torch.distributed.tensor import DTensor

    whole = load_causal_lm(str(tiny_model_dir))
    sharded = build_sharded_causal_lm(str(tiny_model_dir), LoadOptions(), mesh)
    assert all(isinstance(p, DTensor) for p in sharded.parameters())
    assert local_numel(sharded) == sum(p.numel() for p in whole.parameters())
    tied = whole.get_output_embeddings().weight is whole.get_input_embeddings().weight
    assert (sharded.get_output_embeddings().weight is sharded.get_input_embeddings().weight) == tied
    ids = torch.tensor([[3, 17, 42, 5, 9, 11]])
    with torch.no_grad():
        # the same weights, and the same buffers (rotary inv_freq, built, not read): identical logits
        assert torch.equal(sharded(input_ids=ids).logits, whole(input_ids=ids).logits)
    state = full_state_dict(sharded)
    assert set(state) == set(whole.state_dict()) - ({"lm_head.weight"} if tied else set())
    assert all(torch.equal(v, whole.state_dict()[k]) for k, v in state.items())


def test_a_checkpoint_without_safetensors_is_refused_by_name(tiny_gpt2_dir, tmp_path, mesh):
    model = load_causal_lm(str(tiny_gpt2_dir))
    (tmp_path / "bin").mkdir()
    model.config.save_pretrained(tmp_path / "bin")  # and the weights as pytorch_model.bin, an older format
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    with pytest.raises(ModelLoadError) as refused:
        build_sharded_causal_lm(str(tmp_path / "bin"), LoadOptions(), mesh)
    folder = tmp_path / "bin"
    assert f"error: {refused.value}" == (
        f"error: cannot shard model '{folder}': FSDP2 loading reads safetensors weights one tensor at a time, "
        f"and {folder} has none (config.json, pytorch_model.bin); save it with save_pretrained (safetensors), "
        "or tune it replicated (DDP)"
    )


def test_synced_phases_pad_to_the_agreed_number_of_calls(tiny_gpt2_dir, mesh):
    model = load_causal_lm(str(tiny_gpt2_dir))
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    ids = torch.tensor([[1, 2, 3]])
    synced = SyncedForwards(enabled=True)
    with synced.phase(model, calls=3):
        model(input_ids=ids)
    assert len(calls) == 3  # one real call, two 1-token ones
    calls.clear()
    with synced.phase(model):  # alone, nobody else calls: no padding
        model(input_ids=ids), model(input_ids=ids)
    assert len(calls) == 2
    calls.clear()
    with SyncedForwards(enabled=False).phase(model, calls=5):
        pass
    assert not calls  # one process, or replicated models: nothing


def test_what_fsdp2_cannot_tune_is_refused():
    fsdp, dynamic = "FSDP2Strategy", RolloutOptions()
    with pytest.raises(
        ConfigError, match=r"lora.rank = 8 under FSDP2 .* tune with LoRA on one device or with DDP"
    ):
        check_strategy(fsdp, LoraOptions(rank=8), dynamic)
    with pytest.raises(ConfigError, match=r"rollouts.cache: static / rollouts.compile under FSDP2"):
        check_strategy("ModelParallelStrategy", LoraOptions(), RolloutOptions(cache="static"))
    for name in ("fsdp", "deepspeed_stage_3", "FSDPStrategy"):
        with pytest.raises(
            ConfigError, match=r"cblight tune shards models with FSDP2 .* -c configs/fsdp.yaml"
        ):
            check_strategy(name, LoraOptions(), dynamic)
    check_strategy(fsdp, LoraOptions(), dynamic)
    check_strategy("ddp", LoraOptions(rank=8), RolloutOptions(cache="static"))


def test_lora_keeps_no_copy_of_the_initial_model(tmp_path, tiny_gpt2_dir, monkeypatch):
    """The frozen teacher, the trust region's anchor and the guard's reference are the base model behind
    the adapters: no parameter beyond the student's exists, and after training the base computes the
    initial model's logits while the student has moved."""
    pytest.importorskip("peft")
    import cblight.tune.coherence_tuning as tuning
    from cblight.tune.prompt_data import PromptDataModule
    from cblight.tune.teacher import TeacherOptions
    from tests.tune.tuning_helpers import RUN_PROMPTS, tiny_trainer, tiny_tuning

    def no_copy(model):
        raise AssertionError("frozen_copy taken with LoRA")

    monkeypatch.setattr(tuning, "frozen_copy", no_copy)
    module = tiny_tuning(
        tiny_gpt2_dir,
        lora=LoraOptions(rank=4),
        teacher=TeacherOptions(trust_region=0.1),
        optimizer=partial(torch.optim.Adam, lr=3e-2),
    )
    tiny_trainer(2, tmp_path, val_check_interval=1, check_val_every_n_epoch=None).fit(
        module, PromptDataModule(prompts=RUN_PROMPTS, batch_size=2, val_size=2)
    )
    teacher = module.teacher
    assert teacher.model is teacher.initial is not None  # the frozen teacher is the initial model
    student = {p.data_ptr() for p in module.model.parameters()}
    assert {p.data_ptr() for p in teacher.initial.parameters()} == student  # the same tensors, no more
    base = load_causal_lm(str(tiny_gpt2_dir))
    ids = torch.tensor([[464, 2068, 7586, 21831, 18045, 625]])
    module.model.eval()
    with torch.no_grad():
        initial, tuned, reference = (m(input_ids=ids).logits for m in (teacher.initial, module.model, base))
    assert torch.allclose(initial, reference, atol=1e-6)  # adapters off: the base model's own numbers
    assert not torch.allclose(tuned, reference, atol=1e-4)  # adapters on: it trained


FSDP = str(ROOT / "configs" / "fsdp.yaml")
CONFIG = str(ROOT / "configs" / "coherence_tuning.yaml")


def test_the_refusals_are_one_line_before_the_model_loads(cli, tiny_gpt2_dir, tmp_path, capsys, monkeypatch):
    """Typed as a user would, the shipped config under the overlay: one line, exit 2, no model loaded."""

    import cblight.sharding as sharding

    def tripwire(*args, **kwargs):
        raise AssertionError("a model was built before the refusal")

    monkeypatch.setattr(sharding, "build_sharded_causal_lm", tripwire)
    monkeypatch.setattr(sharding, "load_causal_lm", tripwire)
    monkeypatch.chdir(tmp_path)  # the config's relative directories
    tune = ["tune", "-c", CONFIG, "--model.model", str(tiny_gpt2_dir), "--data.task", "null"]
    tune += ["--data.prompts", "[one, two, three, four, five, six, seven, eight, nine, ten]"]
    tune += ["--data.batch_size", "2", "--data.val_size", "2"]
    assert cli.one_line([*tune, "-c", FSDP, "--model.lora.rank", "8"]) == (
        "error: lora.rank = 8 under FSDP2 (trainer.strategy FSDP2Strategy): LoRA adapters are not sharded; tune "
        "with LoRA on one device or with DDP (--trainer.strategy ddp), where the initial model is the base model "
        "with its adapters disabled, not a copy"
    )
    assert cli.one_line([*tune, "-c", FSDP, "--model.rollouts.cache", "static"]) == (
        "error: rollouts.cache: static / rollouts.compile under FSDP2 (trainer.strategy FSDP2Strategy): sharded "
        "sampling runs transformers' dynamic KV cache with synced steps; use rollouts.cache: dynamic or auto"
    )
    assert cli.one_line([*tune, "--trainer.strategy", "fsdp"]) == (
        "error: trainer.strategy fsdp: cblight tune shards models with FSDP2 (Lightning's ModelParallelStrategy): "
        "use -c configs/fsdp.yaml, or DDP (--trainer.strategy ddp) for a model that fits one device"
    )
