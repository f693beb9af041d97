"""Export of the tuned model at the end of ``fit``: ``save_pretrained`` of the weights and the tokenizer,
loadable by ``AutoModelForCausalLM.from_pretrained`` and ``evaluate.py`` like any Hub model; with LoRA, the
merged model and the adapter (``cblight.tune.lora``).

The export directory is one run's alone: ``Exporter`` locks it (``cblight.runs.OutputLock``) for the whole
``fit``, and refuses a directory that already holds an export unless ``overwrite`` is set, so that neither a
second run nor a rerun replaces a tuned model without a word.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback

from cblight.option_types import check_fields
from cblight.runs import LOCK_NAME, OutputDirError, OutputLock, readable_by_all

log = logging.getLogger(__name__)

__all__ = ["ExportOptions", "Exporter", "check_export_dir"]


@dataclass(frozen=True)
class ExportOptions:
    """Where the tuned model goes at the end of ``fit``.

    Args:
        enabled: write the export (``false``: checkpoints only).
        dir: the export directory; a relative path is under ``trainer.default_root_dir`` (the working
            directory unless set); ``None``: ``<log_dir>/hf_model``.
        overwrite: replace an export already in ``dir`` (left by an earlier run); otherwise such a run is
            refused before it starts.
    """

    enabled: bool = True
    dir: str | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        check_fields(self)


def check_export_dir(path: Path, overwrite: bool) -> None:
    """Refuse an export directory that holds files already (an earlier run's export). A lock file alone (left
    by a killed run) is no export.

    Args:
        path: the export directory (it need not exist).
        overwrite: allow replacing what it holds; otherwise a directory with files in it is refused
            (``cblight.runs.OutputDirError``).
    """
    path = Path(path).expanduser()
    if overwrite or not path.is_dir():
        return
    held = sorted(p.name for p in path.iterdir() if not p.name.startswith(LOCK_NAME))
    if held:
        what = "an earlier run's export" if "config.json" in held else f"{len(held)} files, e.g. {held[0]}"
        raise OutputDirError(
            f"model.export.dir {str(path)!r} already holds {what}; this run would overwrite it: choose "
            "another --model.export.dir, or pass --model.export.overwrite true to replace it (in Python: "
            "ExportOptions(dir=...) or ExportOptions(overwrite=True))"
        )


class Exporter(Callback):
    """Writes the tuned model with ``save_pretrained`` (tokenizer included) when ``fit`` ends, unless the run
    stopped early (a half-tuned model must not look like the result) or took no step. From ``setup`` on it
    holds the export directory's lock, and refuses a directory with an export in it (``overwrite``: replace
    it), unless ``cblight tune`` did both before the run (the module's ``run_checked``, with ``dir`` set).

    Args:
        options: whether and where to export.
    """

    def __init__(self, options: ExportOptions):
        self.options = options
        self.first_step: int | None = None  # the global step this run's training started from
        self._lock: OutputLock | None = None

    def path(self, root: Path, log_dir: str | None) -> Path:
        """The export directory.

        Args:
            root: the run's root directory (``trainer.default_root_dir``); a relative ``dir`` is under it.
            log_dir: the run's log directory (``None``: ``root``).

        Returns:
            ``dir`` under ``root``, or ``<log_dir>/hf_model`` when ``dir`` is unset.
        """
        if self.options.dir:
            return root / self.options.dir
        return Path(log_dir or root) / "hf_model"

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # ``cblight tune``'s check pass (``run_checked``) checked and locked a ``dir`` set before the run
        if stage != "fit" or not self.options.enabled or (pl_module.run_checked and self.options.dir):
            return
        log_dir = trainer.log_dir  # a collective (rank 0 broadcasts it): every process asks
        if not trainer.is_global_zero:
            return
        out = self.path(Path(trainer.default_root_dir), log_dir)
        check_export_dir(out, self.options.overwrite)
        self._lock = OutputLock(out, option="model.export.dir").acquire()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.first_step = trainer.global_step

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """The export, on every process, if enabled, the run reached ``max_steps``, took a step and stayed in
        the collapse guard's band.

        Args:
            trainer: the trainer that ran ``fit``.
            pl_module: the ``CoherenceTuning`` module (its ``model``, ``tokenizer`` and log directory).
        """
        from cblight.tune.callbacks import CollapseGuard

        if not self.options.enabled:
            return
        guards = [c for c in trainer.callbacks if isinstance(c, CollapseGuard)]
        if any(c.reason for c in guards):
            return  # the run left the guard's band (said when it did): a collapsed model is no result
        if trainer.global_step < (trainer.max_steps or 0):
            # stopped early (a signal, or a callback): a half-tuned model must not look like the result
            log.warning(
                "stopped at step %d of %d: no export (resume from the last checkpoint to finish)",
                trainer.global_step,
                trainer.max_steps,
            )
            return
        if self.first_step is None or trainer.global_step <= self.first_step:
            # e.g. resumed from a checkpoint already at max_steps: the weights are the checkpoint's, and
            # writing them again as "the tuned model" would hide that nothing ran
            log.warning(
                "no optimizer step was taken in this run (it started at step %s of max_steps %d): no export; "
                "to export a checkpoint's weights: CoherenceTuning.load_from_checkpoint(CKPT)"
                ".export_pretrained(DIR)",
                trainer.global_step if self.first_step is None else self.first_step,
                trainer.max_steps,
            )
            return
        unchecked = [why for why in (c.unchecked(trainer) for c in guards) if why]
        out = self.export(pl_module.model, pl_module.tokenizer, trainer, pl_module._log_dir)
        if trainer.is_global_zero:
            log.info("tuned model saved to %s", out)
            for why in unchecked:  # no validation data (said when the run started): said again here
                log.warning("collapse guard: %s; the exported model is not guarded", why)

    def export(
        self,
        model: Any,
        tokenizer: Any,
        trainer: Any | None,
        log_dir: str | None,
        out_dir: str | Path | None = None,
    ) -> Path:
        """``save_pretrained`` of ``model`` and ``tokenizer`` to ``out_dir`` (default: ``path``). With a
        trainer, call it on every process: under FSDP2 the whole weights are gathered once, tensor by tensor,
        onto rank 0's CPU (``cblight.sharding.full_state_dict``), and rank 0 writes. With LoRA, the adapter
        goes to ``adapter/`` and the merged model to the directory itself.

        Args:
            model: the tuned model.
            tokenizer: its tokenizer.
            trainer: the trainer, or ``None`` outside a run (then only this process writes).
            log_dir: the run's log directory, for the default path.
            out_dir: where to write (default: ``path``).

        Returns:
            The export directory.
        """
        from cblight.sharding import full_state_dict, is_sharded

        root = Path(trainer.default_root_dir) if trainer is not None else Path(".")
        out = Path(out_dir) if out_dir is not None else self.path(root, log_dir)
        weights = full_state_dict(model) if is_sharded(trainer) else None  # None: the model's own
        if trainer is None or trainer.is_global_zero:
            if hasattr(model, "merge_and_unload"):  # LoRA (peft; refused under FSDP2)
                model.save_pretrained(out / "adapter")  # the adapter alone, then the merged model
                tokenizer.save_pretrained(out / "adapter")
                model = copy.deepcopy(model).merge_and_unload()
            out.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(out, state_dict=weights)
            tokenizer.save_pretrained(out)
            readable_by_all(out)  # loadable by others, as the offline zoo's models are
        if trainer is not None:
            trainer.strategy.barrier("cblight-export")
        return out
