"""What the evaluation modules share: the Hugging Face model they hold, loaded lazily, and metric keys."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule

from cblight.models import load_causal_lm


class LanguageModelModule(LightningModule):
    """A LightningModule around one causal LM, loaded only when a step needs it (a fully cached run
    never loads it). A ``device_map`` model is placed by accelerate and kept out of Lightning's device
    management; any other is a registered submodule that Lightning moves. Subclasses save ``model``,
    ``dtype``, ``device_map``, ``revision``, ``trust_remote_code`` and ``run_label`` as hyperparameters
    and set ``model_name``."""

    # Annotations only: a class-level ``lm = None`` would shadow the submodule that nn.Module keeps in
    # ``_modules``, so subclasses set both in ``__init__``.
    model_name: str
    lm: Any
    _sharded_lm: Any

    @property
    def language_model(self) -> Any:
        return self._sharded_lm if self._sharded_lm is not None else self.lm

    def _load_model(self) -> None:
        device_map = self.hparams.device_map
        model = load_causal_lm(
            self.model_name,
            dtype=self.hparams.dtype,
            device_map=device_map,
            revision=self.hparams.revision,
            trust_remote_code=self.hparams.trust_remote_code,
        )
        if device_map is not None:
            self._sharded_lm = model
        else:
            self.lm = model.to(self.device)

    def _key(self, task: str) -> str:
        """The task part of a metric name: ``<task>`` or ``<task>/<run_label>`` in comparisons."""
        label = self.hparams.run_label
        return f"{task}/{label}" if label else task
