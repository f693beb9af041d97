"""One process of the 2-process CPU DDP test (tests/tune/test_tuning_ddp.py), run through train.py's CLI with the
shipped config (sample logging every 8 steps, so at step 0; CSV logger; checkpointing; export; AdamW;
gradient clipping); also called in-process for the single-process reference. Each process tunes on its
rows of one pre-sampled global batch instead of sampling."""

import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback

from cblight.cli import train_cli
from cblight.tune.loss import Sampled
from cblight.tune.rollouts import RolloutSampler
from tests.helpers import ROOT

CONFIG = str(ROOT / "configs" / "coherence_tuning.yaml")


def presampled(batch_file: str):
    def sample(self, model, prompts, device="cpu", rank=0, synced=False, seed=None):
        # validation (the collapse guard's look at the final model, on every rank) samples with its own seed;
        # it gets the saved batch too
        saved = torch.load(batch_file)
        dist = torch.distributed
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        rows = saved["sequences"].shape[0] // world
        mine = slice(rank * rows, (rank + 1) * rows)
        return Sampled(
            saved["sequences"][mine],
            saved["attention_mask"][mine],
            saved["prompt_width"],
            saved["sampled"][mine],
        )

    return sample


class Capture(Callback):
    """Gradients before the optimizer step, weights after training, and a checkpoint (all processes)."""

    def __init__(self, out_dir: str = ""):
        self.out_dir = Path(out_dir)
        self.grads: dict[str, torch.Tensor] = {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads = {n: p.grad.detach().clone() for n, p in pl_module.model.named_parameters()}

    def on_train_end(self, trainer, pl_module):
        trainer.save_checkpoint(self.out_dir / f"world{trainer.world_size}.ckpt")  # RNG gather: every rank
        weights = {n: p.detach().clone() for n, p in pl_module.model.named_parameters()}
        name = f"world{trainer.world_size}-rank{trainer.global_rank}.pt"
        torch.save({"grads": self.grads, "weights": weights}, self.out_dir / name)


def run(model_dir: str, batch_file: str, prompts_file: str, out_dir: str, devices: int):
    RolloutSampler.sample = presampled(batch_file)
    args = [
        "fit", "-c", CONFIG,
        "--model.model", model_dir, "--model.boosting.k", "3", "--model.boosting.alpha", "-0.5",
        "--model.max_new_tokens", "6",
        "--data.task", "null", "--data.prompts_file", prompts_file, "--data.batch_size", str(4 // devices),
        "--data.val_size", "2",
        "--trainer.accelerator", "cpu", "--trainer.devices", str(devices), "--trainer.max_steps", "1",
        "--trainer.strategy", "ddp" if devices > 1 else "auto",
        "--trainer.default_root_dir", str(Path(out_dir) / f"world{devices}"),
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.callbacks+=tests.tune.tuning_ddp_worker.Capture", f"--trainer.callbacks.out_dir={out_dir}",
    ]  # fmt: skip
    return train_cli(args=args)


if __name__ == "__main__":
    torch.set_num_threads(1)
    run(*sys.argv[1:5], devices=2)
