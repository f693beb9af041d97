"""Lightning callbacks that coherence tuning adds to its trainer (``CoherenceTuning.configure_callbacks``).

* ``StopOnSignal``: Ctrl-C (SIGINT) or SIGTERM, as a cluster scheduler sends on preemption, finishes the
  current optimizer step, saves ``last.ckpt`` and stops; the process then exits with ``128 + signal``
  (``train.py``). A plain rerun of the same command resumes from it (``resume_interrupted_run``), as
  ``--ckpt_path .../last.ckpt`` does: from the saved step with the same weights, optimizer, sampling
  random states and prompt position. A second signal (2 s or more after the first) stops at once, without
  a checkpoint. Under SLURM, Lightning's own auto-requeue on SIGUSR1 is left as it is.
* ``CollapseGuard`` (``GuardOptions``, on by default): self-distillation toward a teacher with
  ``alpha < 0`` tilts the model and can collapse its diversity (the paper's live teacher on SmolLM2:
  human-text perplexity 56 -> 1673 in 32 steps; 58 -> 205 at the paper's own boost). After every
  validation it compares the held-out perplexity, the next-token entropy, distinct-2 and repetition of the
  model's samples with the band (relative to the initial model's values, ``cblight.tune.validation``);
  inside it it saves ``last_good.ckpt``, outside it stops the run and names that checkpoint (the run then
  exports nothing).
* ``StepProgressBar`` / ``RichStepProgressBar`` (Lightning's default when ``rich`` is installed): the
  prompt stream is one endless epoch, so the bar counts optimizer steps of ``max_steps`` ("Tuning 12/32")
  instead of an epoch's batches ("Epoch 0/-2").
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities import rank_zero_info

from cblight.option_types import ClosedUnitInterval, PositiveUnitInterval, RatioAtLeastOne, check_fields
from cblight.runs import OutputLock, RunInterrupted, requested, stop_on_signals

log = logging.getLogger(__name__)

__all__ = [
    "CollapseGuard",
    "GuardOptions",
    "RichStepProgressBar",
    "StepProgressBar",
    "StopOnSignal",
    "resume_interrupted_run",
]


class StopOnSignal(Callback):
    """Turn SIGINT/SIGTERM into a checkpointed stop at the next step boundary (``cblight.runs.stop_on_signals``
    with ``defer``: a second signal stops at once).

    After every training batch all processes agree (a max all-reduce that every process joins) on whether
    any of them received one; if so, all save ``last.ckpt`` together (in the checkpoint callback's directory,
    else ``<log_dir>/checkpoints``) and the trainer stops. ``stopped_by`` and ``checkpoint`` tell what
    happened. Installed when training starts, after Lightning's own SIGTERM handler, which it replaces.
    """

    def __init__(self) -> None:
        self.stopped_by: int | None = None
        self.checkpoint: str | None = None
        self._signals = contextlib.ExitStack()
        self._lock: Any = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Lock the run's log directory for this run while it runs: a plain rerun of the same command
        resumes from it (``resume_interrupted_run``) only once this run has ended.

        Args:
            trainer: the trainer (its ``log_dir`` is read on every process, a collective).
            pl_module: the LightningModule (unused).
            stage: the trainer's stage; only ``fit`` locks (``cblight.runs.OutputDirError`` when another run
                holds the directory).
        """
        log_dir = trainer.log_dir  # a collective (rank 0 broadcasts it): every process asks
        if stage == "fit" and log_dir and trainer.is_global_zero:
            self._lock = OutputLock(log_dir, option="trainer.default_root_dir").acquire()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._signals.enter_context(stop_on_signals(defer=True))

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._signals.close()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._signals.close()
        launcher = getattr(trainer.strategy, "launcher", None)
        if isinstance(exception, RunInterrupted) and hasattr(launcher, "kill"):
            launcher.kill(signal.SIGKILL)  # a stop at once: the DDP processes this one started stop too

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        flag = torch.tensor([float(requested() or 0)], device=pl_module.device)
        signum = int(trainer.strategy.reduce(flag, reduce_op="max").item())
        if not signum:
            return
        path = os.path.join(_checkpoint_dir(trainer), "last.ckpt")
        trainer.save_checkpoint(path, weights_only=False)  # resumable; every process: sharded states gathered
        trainer.should_stop = True
        self.stopped_by, self.checkpoint = signum, path
        rank_zero_info(
            f"{signal.Signals(signum).name}: stopped after step {trainer.global_step}, checkpoint {path}; "
            "rerun the same command to resume from it (or pass --ckpt_path)"
        )


# The run-directory layout (``<save_dir>/<name>/version_<N>``) of the loggers a plain rerun can find again.
_VERSIONED_LOGGERS = ("CSVLogger", "TensorBoardLogger")
# What may differ between a run and its resumption: the resume itself and where it was read from.
_RUN_INDEPENDENT = ("ckpt_path", "config", "__path__")


def _run_identity(config: dict[str, Any]) -> dict[str, Any]:
    """A dumped config without what a resumption changes (``ckpt_path``, the logger's version)."""
    same = {k: v for k, v in config.items() if k not in _RUN_INDEPENDENT}
    trainer = dict(same.get("trainer") or {})
    trainer.pop("logger", None)
    return {**same, "trainer": trainer}


def resume_interrupted_run(
    config: Any, saved_config: Any, locks: list[Any] | None = None
) -> tuple[Path, int] | None:
    """A plain rerun of an interrupted ``cblight tune`` resumes it, as ``cblight evaluate`` resumes from its
    cache: the newest ``version_<N>`` of the first logger (CSV or TensorBoard) whose ``config.yaml`` is this
    config and whose ``checkpoints/last.ckpt`` stopped before ``trainer.max_steps`` is resumed: ``ckpt_path``
    is set to that checkpoint (the logs go on in a new version, the next rerun finds it there). With
    ``locks`` (the launching process) it says so in one line and locks that version against a second rerun
    (the lock appended to ``locks``).

    Args:
        config: the parsed ``cblight tune`` config (a mapping); its ``ckpt_path`` is set when a run resumes.
        saved_config: makes the config as ``config.yaml`` would hold it, to compare with the saved ones.
        locks: where the launching process keeps the lock of the resumed version (``None``: in other
            processes, no lock and no message).

    Returns:
        The checkpoint resumed and its step, or ``None`` when there is nothing to resume.
    """
    import sys

    import yaml

    trainer = config.get("trainer") or {}
    loggers = trainer.get("logger")
    first = loggers[0] if isinstance(loggers, list) and loggers else loggers
    logger = first.get("class_path", "") if hasattr(first, "get") else ""
    if str(logger).rpartition(".")[2] not in _VERSIONED_LOGGERS:
        return None
    args = first.get("init_args") or {}
    if args.get("version") is not None or not args.get("save_dir"):
        return None
    runs = Path(args["save_dir"]).expanduser() / (args.get("name") or "lightning_logs")
    versions = sorted(
        (int(d.name[8:]), d) for d in runs.glob("version_*") if d.name[8:].isdigit() and d.is_dir()
    )
    current = _run_identity(saved_config()) if versions else None
    for _, directory in reversed(versions):
        checkpoint = directory / "checkpoints" / "last.ckpt"
        saved = directory / "config.yaml"
        # a file, or under FSDP2 a directory of shards whose meta.pt holds the rest (the step)
        meta = checkpoint / "meta.pt" if checkpoint.is_dir() else checkpoint
        if not (meta.is_file() and saved.is_file()):
            continue
        try:
            same = _run_identity(yaml.safe_load(saved.read_text(encoding="utf-8")) or {}) == current
            step = int(torch.load(meta, map_location="cpu", weights_only=True, mmap=True)["global_step"])
        except Exception:  # an unreadable run is not this one
            continue
        if not same:
            continue
        if step >= (trainer.get("max_steps") or 0):
            return None  # this config's newest run finished: a rerun is a new run
        if locks is not None:  # refused, naming it, while that run still runs
            locks.append(OutputLock(directory, option="trainer.default_root_dir").acquire())
            print(
                f"resuming this command's interrupted run from step {step} ({checkpoint}); to start afresh "
                "instead, delete that checkpoint",
                file=sys.stderr,
            )
        config["ckpt_path"] = str(checkpoint)  # the logs go on in a new version: the old ones stay whole
        return checkpoint, step
    return None


def _checkpoint_dir(trainer: Trainer) -> str:
    """The checkpoint callback's directory, else ``<log_dir>/checkpoints``."""
    dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
    return str(dirpath) if dirpath else str(Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints")


# The default band, from the measurements of docs/tuning.md ("Collapse"). Human-text perplexity, tuned / base:
# frozen teacher 1.03-1.06 in three runs (SmolLM2: 56.5 -> 59.8 GPU 32x32; 48.7 -> 50.2 and 53.4 -> 56.5
# CPU), live teacher with the trust region 1.08; collapsing runs 2.1 (live, refresh 8), 3.5 (live at the
# paper's k 32, alpha -0.05: 58 -> 205), 21-56 (live at alpha -0.4). Next-token entropy, tuned / base: the
# live run at the paper's setting 0.55 (3.44 -> 1.88); the frozen teacher's nucleus samples lost less than
# boosting itself gives (log generated-text ppl 3.12 -> 2.59, ratio 0.83; the boosted base 0.75).
DEFAULT_MAX_PPL_RATIO = 1.5
DEFAULT_MIN_ENTROPY_RATIO = 0.6


@dataclass(frozen=True)
class GuardOptions:
    """The band a tuning run must stay in (``CollapseGuard``); each bound is relative to the initial model's
    value on the same held-out prompts, seeds and texts, and ``None`` leaves it out. A band is checked at
    every validation that measures its value (validation needs ``data.val_size > 0``; the perplexity
    held-out human text); the defaults pass every frozen-teacher run measured and stop every collapsed one
    (``DEFAULT_MAX_PPL_RATIO``). The band's values are those of ``cblight.tune.validation``.

    Args:
        max_ppl_ratio: stop when the held-out human-text perplexity exceeds this times the initial model's
            (measured where there is held-out human text: a task source with ``data.val_size``, or
            ``data.val_texts_file``); a ratio of at least 1 (a bound below the initial model's value would
            stop every run).
        min_entropy_ratio: stop when the mean next-token entropy at the validation samples' positions falls
            below this times the initial model's; a ratio in (0, 1] (``60`` would be a percent).
        min_distinct_ratio: stop when distinct-2 of the validation samples falls below this times the
            initial model's (e.g. 0.8; off by default: no frozen-teacher run has measured it yet); in (0, 1].
        max_repetition: stop when more than this share of the validation samples ends in a repetition loop
            (absolute: the initial model's share is often 0).
    """

    max_ppl_ratio: RatioAtLeastOne | None = DEFAULT_MAX_PPL_RATIO
    min_entropy_ratio: PositiveUnitInterval | None = DEFAULT_MIN_ENTROPY_RATIO
    min_distinct_ratio: PositiveUnitInterval | None = None
    max_repetition: ClosedUnitInterval | None = None

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in vars(self).values())

    def violation(self, values: dict[str, float]) -> str | None:
        """Why a validation's values leave the band; a bound whose value this validation did not measure is
        not checked.

        Args:
            values: validation metrics by short name (``ppl``, ``ppl_initial``, ``entropy``, ...).

        Returns:
            One line naming the value, the option and the bound it crossed, or ``None`` inside the band.
        """
        checks = (
            ("ppl", self.max_ppl_ratio, 1, "max_ppl_ratio"),
            ("entropy", self.min_entropy_ratio, -1, "min_entropy_ratio"),
            ("distinct_2", self.min_distinct_ratio, -1, "min_distinct_ratio"),
        )
        for name, ratio, sign, option in checks:
            if ratio is None or name not in values or f"{name}_initial" not in values:
                continue
            value, initial = values[name], values[f"{name}_initial"]
            bound = ratio * initial
            if sign * (value - bound) > 0 or value != value:  # NaN is out of every band
                side = "above" if sign > 0 else "below"
                return (
                    f"val/tuning/{name} = {value:.4g} is {side} guard.{option} = {ratio:g} x the initial "
                    f"model's {initial:.4g} (= {bound:.4g})"
                )
        if self.max_repetition is not None and values.get("repetition", 0.0) > self.max_repetition:
            return (
                f"val/tuning/repetition = {values['repetition']:.4g} is above guard.max_repetition = "
                f"{self.max_repetition:g}"
            )
        return None


class CollapseGuard(Callback):
    """After every validation: inside ``options``' band, save ``last_good.ckpt`` (every process takes part;
    in the checkpoint callback's directory, else ``<log_dir>/checkpoints``); outside it, stop the run and say
    which value left the band and which checkpoint was the last good one. The model that is exported is one
    the guard looked at: when the run reaches ``max_steps`` after its last validation, it has Lightning
    validate once more (``trainer.should_stop``, on which Lightning's loop validates before it stops, on
    every process alike) and says so. ``good_checkpoint``, ``good_step`` and ``reason`` tell what happened;
    the first two are kept in checkpoints, as is ``validated_step`` (the step of the last validation).

    Args:
        options: the band.
    """

    def __init__(self, options: GuardOptions):
        self.options = options
        self.good_checkpoint: str | None = None
        self.good_step: int | None = None
        self.reason: str | None = None
        self.validated_step: int | None = None
        self._final = False  # the validation asked for at max_steps is running

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # without validation (said when the run started) there is nothing to run: ``unchecked`` says so again
        step = trainer.global_step
        if step < trainer.max_steps or self.validated_step == step or not trainer.enable_validation:
            return
        trainer.should_stop = True  # Lightning validates before it stops (its loop's should-stop rule)
        self._final = True
        # the trainer's own schedule (``val_check_interval`` in steps) may validate after this batch anyway
        every, loop = trainer.val_check_batch, trainer.fit_loop.epoch_loop
        done = loop.total_batch_idx if trainer.check_val_every_n_epoch is None else loop.batch_idx
        if not (isinstance(every, int) and every >= 1 and (done + 1) % every == 0):
            before = "none" if self.validated_step is None else f"step {self.validated_step}"
            rank_zero_info(
                f"collapse guard: validating the final model (step {step}; last validation: {before}) before "
                "the export"
            )

    def unchecked(self, trainer: Trainer) -> str | None:
        """Why the model at the current step was not checked against the band.

        Args:
            trainer: the trainer (its ``global_step``).

        Returns:
            One line saying which step was last validated, or ``None`` if the current one was.
        """
        if self.validated_step == trainer.global_step:
            return None
        before = (
            "no validation ran"
            if self.validated_step is None
            else f"the last validation was at step {self.validated_step}"
        )
        return f"the model at step {trainer.global_step} was not validated ({before})"

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        prefix = "val/tuning/"
        values = {
            k[len(prefix) :]: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(prefix)
        }
        reason = self.options.violation(values)
        step = trainer.global_step
        self.validated_step = step
        final, self._final = self._final, False
        if reason is None:
            if final:
                rank_zero_info(f"collapse guard: the final model (step {step}) is inside the band")
            if trainer.checkpoint_callback is None:  # a run without checkpoints gets none from the guard
                return
            path = os.path.join(_checkpoint_dir(trainer), "last_good.ckpt")
            trainer.save_checkpoint(path, weights_only=False)  # a full, resumable checkpoint
            self.good_checkpoint, self.good_step = path, step
            return
        trainer.should_stop = True
        self.reason = reason
        if self.good_checkpoint is not None:
            shards = Path(self.good_checkpoint).is_dir()  # FSDP2's distributed checkpoint
            load = "cblight.sharding.consolidate_checkpoint(...)" if shards else "..."
            keep = (
                f"the last good checkpoint is {self.good_checkpoint} (step {self.good_step}); export it with "
                f"CoherenceTuning.load_from_checkpoint({load}).export_pretrained(DIR)"
            )
        elif trainer.checkpoint_callback is None:
            keep = "checkpointing is off, so no good checkpoint was kept"
        else:
            keep = "no validation passed before it: the initial model is the last good one"
        message = (
            f"collapse guard: {reason} at step {step}; stopped the run, no export; {keep}; to tune past it "
            "anyway, widen or switch off that band (--model.guard.*: null)"
        )
        if trainer.is_global_zero:
            log.warning(message)

    def state_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in _GUARD_STATE}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in _GUARD_STATE:
            setattr(self, key, state_dict.get(key))


# What a checkpoint keeps of the guard
_GUARD_STATE = ("good_checkpoint", "good_step", "validated_step")


class StepProgressBar(TQDMProgressBar):
    """TQDM bar in optimizer steps of ``max_steps`` ("Tuning: 12/32"), resumed runs starting where they
    left off. Its arguments are Lightning's ``TQDMProgressBar``'s.

    Args:
        refresh_rate: redraw the bar every this many steps (0: no bar).
        process_position: the bar's line, when several processes draw bars.
        leave: keep the finished bar on screen.
    """

    @property
    def total_train_batches(self) -> int | float:
        return self.trainer.max_steps

    def on_train_epoch_start(self, trainer: Trainer, *_: Any) -> None:
        super().on_train_epoch_start(trainer)  # the bar reset to a total of total_train_batches
        self.train_progress_bar.n = trainer.global_step  # a resumed run starts where it left off
        self.train_progress_bar.set_description("Tuning")

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
    """Rich bar in optimizer steps of ``max_steps``. Its arguments are Lightning's ``RichProgressBar``'s.

    Args:
        refresh_rate: redraw the bar every this many steps (0: no bar).
        leave: keep the finished bar on screen.
        theme: the bar's colours and styles.
        console_kwargs: arguments of the ``rich`` console the bar draws on.
    """

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
