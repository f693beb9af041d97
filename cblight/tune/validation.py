"""Coherence tuning's held-out validation and sample log, a mixin of
``cblight.tune.coherence_tuning.CoherenceTuning`` (paper appendix "From coherence boosting to coherence tuning").

Validation samples the same held-out prompts with the same seeds at every check and logs
``KL(f_alpha || f_θ)`` under the run's teacher (``val/tuning/kl``, ``kl_long``), against the initial model's
boosted distribution (``kl_initial``, ``top1_initial``: is the model moving toward its boosted self?) and
the perplexity of held-out human text (``val/tuning/ppl``: is it still a language model?). The sample log
writes a few training samples to ``samples.jsonl`` beside the logs and to W&B, on rank 0 only, from the log
directory read on every rank in ``setup`` (reading it here, on rank 0 alone, hung DDP at step 0).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torchmetrics import MeanMetric, SumMetric

from cblight.tune.loss import Sampled, human_text_nll
from cblight.tune.rollouts import seed_of

__all__ = ["TuningValidation"]


class TuningValidation:
    """Needs ``model``, ``tokenizer``, ``hparams`` (``seed``, ``teacher``, ``val_text_tokens``,
    ``log_samples_every_n_steps``, ``num_logged_samples``), ``initial_model``, ``kl_terms``, ``sample_fixed``,
    ``_log_dir`` and the LightningModule's ``log``/``global_rank``/``global_step``/``trainer``/``loggers``."""

    def init_validation_metrics(self) -> None:
        """Separate metric instances for validation (the training loss is logged from the step)."""
        self.val_kl = MeanMetric()
        self.val_kl_long = MeanMetric()
        self.val_kl_initial = MeanMetric()
        self.val_top1_initial = MeanMetric()
        self.val_nll = SumMetric()
        self.val_tokens = SumMetric()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        # The same held-out prompts and random seeds every time, so values are comparable across the run.
        sampled = self.sample_fixed(batch, seed_of(self.hparams.seed, 1_000_003, batch_idx, self.global_rank))
        n = len(batch["prompts"])
        with torch.no_grad():
            terms = self.kl_terms(sampled)
            initial = None
            if self.initial_model is not None:
                same = self.hparams.teacher == "frozen"
                initial = terms if same else self.kl_terms(sampled, teacher_model=self.initial_model)
        self.val_kl.update(terms.kl)
        self.val_kl_long.update(terms.kl[terms.long] if bool(terms.long.any()) else terms.kl.new_zeros(0))
        self.log("val/tuning/kl", self.val_kl, on_step=False, on_epoch=True, batch_size=n)
        self.log("val/tuning/kl_long", self.val_kl_long, on_step=False, on_epoch=True, batch_size=n)
        if initial is not None:
            self.val_kl_initial.update(initial.kl)
            self.val_top1_initial.update(initial.agree.float())
            self.log("val/tuning/kl_initial", self.val_kl_initial, on_step=False, on_epoch=True, batch_size=n)
            self.log(
                "val/tuning/top1_initial", self.val_top1_initial, on_step=False, on_epoch=True, batch_size=n
            )
        texts = batch.get("texts") or []
        if texts:
            nll, tokens = self.text_nll(texts)
            self.val_nll.update(nll)
            self.val_tokens.update(tokens)

    def on_validation_epoch_end(self) -> None:
        if not self.val_tokens.update_called:  # no held-out texts (the same on every process)
            return
        tokens = self.val_tokens.compute()
        if float(tokens) > 0:
            self.log("val/tuning/ppl", torch.exp(self.val_nll.compute() / tokens), batch_size=1)
        self.val_nll.reset()
        self.val_tokens.reset()

    def text_nll(self, texts: Sequence[str]) -> tuple[float, int]:
        """Summed negative log-likelihood and token count of held-out human texts (``human_text_nll``)."""
        return human_text_nll(self.model, self.tokenizer, texts, self.hparams.val_text_tokens)

    # -- tracking -------------------------------------------------------------------------------------
    def _maybe_log_samples(self, prompts: Sequence[str], sampled: Sampled) -> None:
        every = self.hparams.log_samples_every_n_steps
        if not every or self.global_step % every or not self.trainer.is_global_zero:
            return
        n = min(self.hparams.num_logged_samples, len(prompts))
        rows = []
        for i in range(n):
            tokens = sampled.sequences[i, sampled.prompt_width :][sampled.sampled[i, sampled.prompt_width :]]
            text = self.tokenizer.decode(tokens.tolist(), skip_special_tokens=False)
            rows.append([int(self.global_step), prompts[i], text])
        from lightning.pytorch.loggers import WandbLogger

        for logger in self.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_text(key="train/tuning/samples", columns=["step", "prompt", "sample"], data=rows)
        log_dir = self._log_dir
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            with open(os.path.join(log_dir, "samples.jsonl"), "a", encoding="utf-8") as f:
                for step, prompt, text in rows:
                    f.write(json.dumps({"step": step, "prompt": prompt, "sample": text}) + "\n")
