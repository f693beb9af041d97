"""Export of the tuned model at the end of ``fit``: ``save_pretrained`` of the weights and the tokenizer,
loadable by ``AutoModelForCausalLM.from_pretrained`` and ``evaluate.py`` like any Hub model; with LoRA, the
merged model and the adapter (``cblight.tune.lora``). ``Exporter`` is the exporter of
``cblight.tune.coherence_tuning.CoherenceTuning``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cblight.tune.lora import is_peft_model, save_lora_exports
from cblight.tune.loss import TuningConfigError

log = logging.getLogger(__name__)

__all__ = ["ExportOptions", "Exporter"]


@dataclass(frozen=True)
class ExportOptions:
    """Where the tuned model goes at the end of ``fit``.

    Args:
        enabled: write the export (``false``: checkpoints only).
        dir: the export directory; a relative path is under ``trainer.default_root_dir`` (the working
            directory unless set); ``None``: ``<log_dir>/hf_model``.
    """

    enabled: bool = True
    dir: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise TuningConfigError(f"export.enabled must be true or false, got {self.enabled!r}")


class Exporter:
    """Writes the tuned model with ``save_pretrained`` (tokenizer included) when ``fit`` ends, unless the run
    stopped early (a half-tuned model must not look like the result)."""

    def __init__(self, options: ExportOptions):
        self.options = options
        self.first_step: int | None = None  # the global step this run's training started from

    def path(self, root: Path, log_dir: str | None) -> Path:
        """``dir`` under ``root`` (``trainer.default_root_dir``), or ``<log_dir>/hf_model``."""
        if self.options.dir:
            return root / self.options.dir
        return Path(log_dir or root) / "hf_model"

    def export(
        self,
        model: Any,
        tokenizer: Any,
        trainer: Any | None,
        log_dir: str | None,
        out_dir: str | Path | None = None,
    ) -> Path:
        """``save_pretrained`` of ``model`` and ``tokenizer`` to ``out_dir`` (default: ``path``). With a
        trainer, call it on every process: sharded weights are gathered and rank 0 writes."""
        root = Path(trainer.default_root_dir) if trainer is not None else Path(".")
        out = Path(out_dir) if out_dir is not None else self.path(root, log_dir)
        weights, is_zero = None, True
        if trainer is not None:
            state = trainer.strategy.lightning_module_state_dict()
            weights = {name[len("model.") :]: t for name, t in state.items() if name.startswith("model.")}
            is_zero = trainer.is_global_zero
        if is_zero and is_peft_model(model):  # LoRA is refused under sharded strategies
            save_lora_exports(model, tokenizer, out)
        elif is_zero:
            out.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(out, state_dict=weights)
            tokenizer.save_pretrained(out)
        if trainer is not None:
            trainer.strategy.barrier("cblight-export")
        return out

    def at_fit_end(self, model: Any, tokenizer: Any, trainer: Any, log_dir: str | None) -> Path | None:
        """The export, on every process, if enabled, the run reached ``max_steps`` and took a step."""
        if not self.options.enabled:
            return None
        if trainer.global_step < (trainer.max_steps or 0):
            # stopped early (a signal, or a callback): a half-tuned model must not look like the result
            log.warning(
                "stopped at step %d of %d: no export (resume from the last checkpoint to finish)",
                trainer.global_step,
                trainer.max_steps,
            )
            return None
        if self.first_step is None or trainer.global_step <= self.first_step:
            # e.g. resumed from a checkpoint already at max_steps: the weights are the checkpoint's, and
            # writing them again as "the tuned model" would hide that nothing ran (issue 19)
            log.warning(
                "no optimizer step was taken in this run (it started at step %s of max_steps %d): no export; "
                "to export a checkpoint's weights: CoherenceTuning.load_from_checkpoint(CKPT)"
                ".export_pretrained(DIR)",
                trainer.global_step if self.first_step is None else self.first_step,
                trainer.max_steps,
            )
            return None
        out = self.export(model, tokenizer, trainer, log_dir)
        if trainer.is_global_zero:
            log.info("tuned model saved to %s", out)
        return out
