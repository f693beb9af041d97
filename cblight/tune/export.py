"""Export of the tuned model at the end of ``fit`` (a mixin of ``cblight.tune.coherence_tuning.CoherenceTuning``):
``save_pretrained`` of the weights and the tokenizer, loadable by ``AutoModelForCausalLM.from_pretrained``;
with LoRA, the merged model and the adapter (``cblight.tune.lora``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from cblight.tune.lora import is_peft_model, save_lora_exports

log = logging.getLogger(__name__)

__all__ = ["TunedModelExport"]


class TunedModelExport:
    """Needs ``model``, ``tokenizer``, ``hparams`` (``export``, ``export_dir``) and ``_log_dir``, and the
    LightningModule's ``trainer``/``state_dict``."""

    _trainer: Any
    _log_dir: str | None

    def export_path(self) -> Path:
        """``export_dir`` (a relative path is under ``trainer.default_root_dir``, the working directory
        unless set), or ``<log_dir>/hf_model``."""
        root = Path(self.trainer.default_root_dir) if self._trainer is not None else Path(".")
        if self.hparams.export_dir:
            return root / self.hparams.export_dir
        return Path(self._log_dir or root) / "hf_model"

    def export_pretrained(self, out_dir: str | Path | None = None) -> Path:
        """``save_pretrained`` of the tuned model and its tokenizer, loadable by
        ``AutoModelForCausalLM.from_pretrained``. Call it on every process (sharded weights are gathered)."""
        out = Path(out_dir) if out_dir is not None else self.export_path()
        if self._trainer is not None:
            state = self.trainer.strategy.lightning_module_state_dict()
            is_zero = self.trainer.is_global_zero
        else:
            state, is_zero = self.state_dict(), True
        if is_zero and is_peft_model(self.model):  # LoRA is refused under sharded strategies
            save_lora_exports(self.model, self.tokenizer, out)
        elif is_zero:
            weights = {name[len("model.") :]: t for name, t in state.items() if name.startswith("model.")}
            out.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(out, state_dict=weights)
            self.tokenizer.save_pretrained(out)
        if self._trainer is not None:
            self.trainer.strategy.barrier("cblight-export")
        return out

    def on_fit_end(self) -> None:
        trainer = self.trainer
        if self.hparams.export and trainer.global_step < (trainer.max_steps or 0):
            # stopped early (a signal, or a callback): a half-tuned model must not look like the result
            log.warning(
                "stopped at step %d of %d: no export (resume from the last checkpoint to finish)",
                trainer.global_step,
                trainer.max_steps,
            )
        elif self.hparams.export:
            out = self.export_pretrained()
            if self.trainer.is_global_zero:
                log.info("tuned model saved to %s", out)
