"""One process of the 2-process CPU DDP test (tests/test_tuning_ddp.py); also importable for the
single-process reference. Each process tunes on its rows of one pre-sampled global batch."""

import os
import sys
from functools import partial
from pathlib import Path

import lightning as L
import torch

from cblight.data.tuning_prompts import PromptDataModule
from cblight.modules.tuning import CoherenceTuning
from cblight.tuning import Sampled


class PresampledTuning(CoherenceTuning):
    """Tunes on this process's rows of a fixed global batch instead of sampling."""

    def __init__(self, batch_file: str = "", **kwargs):
        super().__init__(**kwargs)
        self.batch_file = batch_file
        self.grads: dict[str, torch.Tensor] = {}

    def sample(self, batch):
        saved = torch.load(self.batch_file)
        world, rank = self.trainer.world_size, self.global_rank
        rows = saved["sequences"].shape[0] // world
        whole = Sampled(saved["sequences"], saved["attention_mask"], saved["prompt_width"], saved["sampled"])
        return whole.slice(slice(rank * rows, (rank + 1) * rows))

    def on_before_optimizer_step(self, optimizer):
        self.grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters()}


def run(model_dir: str, batch_file: str, devices: int) -> PresampledTuning:
    torch.set_num_threads(1)
    module = PresampledTuning(
        batch_file=batch_file,
        model=model_dir,
        k=3,
        alpha=-0.5,
        max_new_tokens=6,
        optimizer=partial(torch.optim.SGD, lr=0.5),
        export=False,
        log_samples_every_n_steps=0,
    )
    trainer = L.Trainer(
        max_steps=1,
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, PromptDataModule(prompts=["unused"], batch_size=2))
    return module


if __name__ == "__main__":
    model_dir, batch_file, out_dir = sys.argv[1:4]
    module = run(model_dir, batch_file, devices=2)
    module.trainer.save_checkpoint(Path(out_dir) / "ddp.ckpt")  # every process takes part (RNG gather)
    rank = int(os.environ["LOCAL_RANK"])
    weights = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    torch.save({"grads": module.grads, "weights": weights}, Path(out_dir) / f"rank{rank}.pt")
