"""One process of the sharded-tuning tests (tests/tune/test_tuning_sharded.py): a tune run through train.py's CLI
with the shipped config, one process, DDP or FSDP2 (``-c configs/fsdp.yaml``), on the rows of one
pre-sampled global batch (``tests.tune.tuning_ddp_worker.presampled``) every step. It records each step's
logged loss and gradient norm, and this process's share of the student's and the teacher's parameters.

    python tests/tune/sharded_tuning_worker.py STRATEGY MODEL_DIR BATCH_FILE PROMPTS_FILE OUT_DIR [CLI ARGS...]
"""

import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback

from cblight.cli import train_cli
from cblight.sharding import local_numel
from cblight.tune.rollouts import RolloutSampler
from tests.helpers import ROOT
from tests.tune.tuning_ddp_worker import presampled

CONFIG = str(ROOT / "configs" / "coherence_tuning.yaml")
FSDP = str(ROOT / "configs" / "fsdp.yaml")
STEPS = 3


class Record(Callback):
    """Each step's logged ``train/tuning/loss`` and ``grad_norm``; at the end, this process's parameter
    elements of the student and of the teacher's copies, and the whole student's."""

    def __init__(self, out_dir: str = "", name: str = ""):
        self.out_dir, self.name = Path(out_dir), name
        self.loss: list[float] = []
        self.grad_norm: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        metrics = trainer.callback_metrics
        self.loss.append(float(metrics["train/tuning/loss"]))
        self.grad_norm.append(float(metrics["train/tuning/grad_norm"]))

    def on_train_end(self, trainer, pl_module):
        teacher = pl_module.teacher
        copies = {id(m): m for m in (teacher.model, teacher.initial) if m is not None}
        record = {
            "loss": self.loss,
            "grad_norm": self.grad_norm,
            "student_local": local_numel(pl_module.model),
            "student_total": sum(p.numel() for p in pl_module.model.parameters()),
            "teacher_local": sum(local_numel(m) for m in copies.values()),
            "teacher_total": sum(sum(p.numel() for p in m.parameters()) for m in copies.values()),
        }
        torch.save(record, self.out_dir / f"{self.name}-rank{trainer.global_rank}.pt")


def run(strategy: str, model_dir: str, batch_file: str, prompts_file: str, out_dir: str, *extra: str):
    """Tune ``STEPS`` steps on the pre-sampled batch; ``strategy``: ``one`` (one process), ``ddp`` or
    ``fsdp2`` (two processes); the export lands in ``OUT_DIR/<strategy>/export``."""
    RolloutSampler.sample = presampled(batch_file)
    devices = 1 if strategy == "one" else 2
    args = ["fit", "-c", CONFIG, *(["-c", FSDP] if strategy == "fsdp2" else [])]
    args += [
        "--model.model", model_dir, "--model.boosting.k", "3", "--model.boosting.alpha", "-0.5",
        "--model.max_new_tokens", "6", "--model.export.dir", "export",
        "--data.task", "null", "--data.prompts_file", prompts_file, "--data.batch_size", str(4 // devices),
        "--data.val_size", "2",
        "--trainer.accelerator", "cpu", "--trainer.devices", str(devices), "--trainer.max_steps", str(STEPS),
        "--trainer.default_root_dir", str(Path(out_dir) / strategy),
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.callbacks+=tests.tune.sharded_tuning_worker.Record", f"--trainer.callbacks.out_dir={out_dir}",
        f"--trainer.callbacks.name={strategy}",
        *(["--trainer.strategy", "ddp"] if strategy == "ddp" else []),
        *extra,
    ]  # fmt: skip
    return train_cli(args=args)


if __name__ == "__main__":
    torch.set_num_threads(1)
    run(*sys.argv[1:])
