"""Lightning callbacks that coherence tuning adds to its trainer (``CoherenceTuning.configure_callbacks``).

* ``StopOnSignal``: Ctrl-C (SIGINT) or SIGTERM, as a cluster scheduler sends on preemption, finishes the
  current optimizer step, saves ``last.ckpt`` and stops; the process then exits with ``128 + signal``
  (``train.py``). Resuming with ``--ckpt_path .../last.ckpt`` continues from the saved step with the same
  weights, optimizer, sampling random states and prompt position. A second signal (2 s or more after the
  first) stops at once, without a checkpoint. Under SLURM, Lightning's own auto-requeue on SIGUSR1 is
  left as it is.
* ``StepProgressBar`` / ``RichStepProgressBar`` (Lightning's default when ``rich`` is installed): the
  prompt stream is one endless epoch, so the bar counts optimizer steps of ``max_steps`` ("Tuning 12/32")
  instead of an epoch's batches ("Epoch 0/-2").
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities import rank_zero_info

__all__ = ["RichStepProgressBar", "StepProgressBar", "StopOnSignal", "step_progress_bar"]

# A signal delivered twice at once (to the process group, and forwarded by Lightning's launcher) is one.
REPEAT_AFTER_S = 2.0


class StopOnSignal(Callback):
    """Turn SIGINT/SIGTERM into a checkpointed stop at the next step boundary.

    The handler only records the signal. After every training batch all processes agree (a max
    all-reduce that every process joins) on whether any of them received one; if so, all save
    ``last.ckpt`` together (in the checkpoint callback's directory, else ``<log_dir>/checkpoints``) and
    the trainer stops. ``stopped_by`` and ``checkpoint`` tell what happened.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.received_at = 0.0
        self.stopped_by: int | None = None
        self.checkpoint: str | None = None
        self._previous: dict[int, Any] = {}
        self._trainer: Trainer | None = None
        self._dirpath: str | None = None

    # Installed when training starts: after Lightning's own SIGTERM handler, which it replaces.
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._trainer = trainer
        callback = trainer.checkpoint_callback
        dirpath = getattr(callback, "dirpath", None)
        self._dirpath = (
            str(dirpath)
            if dirpath
            else str(Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints")
        )
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore()

    def _handle(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.received is not None:
            if now - self.received_at < REPEAT_AFTER_S:
                return
            self._restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received, self.received_at = signum, now
        launcher = getattr(self._trainer.strategy, "launcher", None) if self._trainer is not None else None
        if signum == signal.SIGTERM and launcher is not None and hasattr(launcher, "kill"):
            launcher.kill(signum)  # DDP processes this one started (Ctrl-C reaches them by itself)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        flag = torch.tensor([float(self.received or 0)], device=pl_module.device)
        flag = trainer.strategy.reduce(flag, reduce_op="max")
        signum = int(flag.item())
        if not signum:
            return
        assert self._dirpath is not None
        path = os.path.join(self._dirpath, "last.ckpt")
        trainer.save_checkpoint(path)  # every process: sharded states are gathered
        trainer.should_stop = True
        self.stopped_by, self.checkpoint = signum, path
        rank_zero_info(
            f"{signal.Signals(signum).name}: stopped after step {trainer.global_step}; resume with --ckpt_path {path}"
        )


class StepProgressBar(TQDMProgressBar):
    """TQDM bar in optimizer steps of ``max_steps`` ("Tuning: 12/32"), resumed runs starting where they
    left off."""

    @property
    def total_train_batches(self) -> int | float:
        return self.trainer.max_steps

    def on_train_epoch_start(self, trainer: Trainer, *_: Any) -> None:
        super().on_train_epoch_start(trainer)
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps)
        bar.initial = 0
        bar.n = trainer.global_step
        bar.set_description("Tuning")

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bar = self.train_progress_bar
        n = trainer.global_step
        if bar is not None and self._should_update(n, bar.total):
            bar.n = n
            bar.refresh()
            bar.set_postfix(self.get_metrics(trainer, pl_module))


class RichStepProgressBar(RichProgressBar):
    """Rich bar in optimizer steps of ``max_steps``."""

    @property
    def total_train_batches(self) -> int | float:
        return self.trainer.max_steps

    def _get_train_description(self, current_epoch: int) -> str:
        return "Tuning"

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.is_disabled and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        self._update(self.train_progress_bar_id, trainer.global_step)
        self._update_metrics(trainer, pl_module)


def step_progress_bar(bar: Any) -> Callback | None:
    """The step-counting replacement of Lightning's own default bar (``None`` for any other bar)."""
    if type(bar) is TQDMProgressBar:
        return StepProgressBar(refresh_rate=bar.refresh_rate)
    if type(bar) is RichProgressBar:
        return RichStepProgressBar(refresh_rate=bar.refresh_rate)
    return None
