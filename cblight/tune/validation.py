"""Coherence tuning's held-out validation metrics and sample log (paper appendix "From coherence boosting to
coherence tuning").

Validation samples the same held-out prompts with the same seeds at every check and logs
``KL(f_alpha || f_θ)`` under the run's teacher (``val/tuning/kl``, ``kl_long``), against the initial model's
boosted distribution (``kl_initial``, ``top1_initial``: is the model moving toward its boosted self?) and
the perplexity of held-out human text (``val/tuning/ppl``: is it still a language model?). The sample log
writes a few training samples to ``samples.jsonl`` beside the logs and to W&B, on rank 0 only, from the log
directory read on every rank in ``setup`` (reading it here, on rank 0 alone, hung DDP at step 0).

``Validator`` is the validator of ``cblight.tune.coherence_tuning.CoherenceTuning``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path
from typing import Any

import torch
from torchmetrics import MeanMetric, Metric, SumMetric

from cblight.scoring import Encoder, Scorer, empty_context_ids
from cblight.tune.loss import KLTerms, Sampled, TuningConfigError

__all__ = ["ValidationOptions", "Validator"]


def _count(value: object, low: int) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool) and value >= low


@dataclass(frozen=True)
class ValidationOptions:
    """What validation measures and what the sample log keeps.

    Args:
        against_initial: also log ``val/tuning/kl_initial`` and ``top1_initial``, the KL from the boosted
            *initial* model (what tuning approximates) on the validation samples and the top-1 agreement with
            it; always on with the frozen teacher, and with the live or EMA teacher it keeps a frozen copy of
            the initial weights.
        text_tokens: held-out human texts (validation batches' ``texts``) are cut to this many tokens for
            ``val/tuning/ppl``.
        log_samples_every_n_steps: sample generations logged every this many steps as a table (W&B) and
            appended to ``<log_dir>/samples.jsonl`` (0: never).
        num_logged_samples: how many of the step's samples are logged.
    """

    against_initial: bool = False
    text_tokens: int = 128
    log_samples_every_n_steps: int = 8
    num_logged_samples: int = 4

    def __post_init__(self) -> None:
        if not _count(self.text_tokens, 2):
            raise TuningConfigError(
                f"validation.text_tokens must be an integer >= 2, got {self.text_tokens!r}"
            )
        for name in ("log_samples_every_n_steps", "num_logged_samples"):
            if not _count(getattr(self, name), 0):
                raise TuningConfigError(
                    f"validation.{name} must be an integer >= 0 (0: no sample log), got {getattr(self, name)!r}"
                )


class Validator(torch.nn.Module):
    """The validation metrics and the sample log.

    A ``torch.nn.Module`` only because it holds the torchmetrics (registered on the LightningModule as
    before, so that they follow it to its device and ``self.log`` finds them); it has no parameters and
    nothing in the state dict.
    """

    def __init__(self, options: ValidationOptions, tokenizer: Any):
        super().__init__()
        self.options = options
        self.tokenizer = tokenizer
        # separate metric instances for validation (the training loss is logged from the step)
        self.kl = MeanMetric()
        self.kl_long = MeanMetric()
        self.kl_initial = MeanMetric()
        self.top1_initial = MeanMetric()
        self.nll = SumMetric()
        self.tokens = SumMetric()

    def update(self, terms: KLTerms, initial: KLTerms | None) -> dict[str, Metric]:
        """Add a batch's KL terms (under the run's teacher, and under the boosted initial model when
        ``initial`` is given); the metrics to log, by name."""
        self.kl.update(terms.kl)
        self.kl_long.update(terms.kl[terms.long] if bool(terms.long.any()) else terms.kl.new_zeros(0))
        logged: dict[str, Metric] = {"val/tuning/kl": self.kl, "val/tuning/kl_long": self.kl_long}
        if initial is not None:
            self.kl_initial.update(initial.kl)
            self.top1_initial.update(initial.agree.float())
            logged["val/tuning/kl_initial"] = self.kl_initial
            logged["val/tuning/top1_initial"] = self.top1_initial
        return logged

    def update_texts(self, model: Any, texts: Sequence[str]) -> None:
        """Add held-out human texts to the perplexity."""
        nll, tokens = self.text_nll(model, texts)
        self.nll.update(nll)
        self.tokens.update(tokens)

    def perplexity(self) -> torch.Tensor | None:
        """At the end of validation: the perplexity of the held-out texts (``None`` without any), reset."""
        if not self.tokens.update_called:  # no held-out texts (the same on every process)
            return None
        tokens = self.tokens.compute()
        ppl = torch.exp(self.nll.compute() / tokens) if float(tokens) > 0 else None
        self.nll.reset()
        self.tokens.reset()
        return ppl

    def text_nll(self, model: Any, texts: Sequence[str]) -> tuple[float, int]:
        """Summed negative log-likelihood and token count of held-out human texts (``human_text_nll``)."""
        return human_text_nll(model, self.tokenizer, texts, self.options.text_tokens)

    # -- the sample log ---------------------------------------------------------------------------------
    def samples_due(self, step: int) -> bool:
        every = self.options.log_samples_every_n_steps
        return bool(every) and step % every == 0

    def log_samples(
        self, step: int, prompts: Sequence[str], sampled: Sampled, loggers: Sequence[Any], log_dir: str | None
    ) -> None:
        """A few of the step's samples to W&B (a table) and ``<log_dir>/samples.jsonl``; rank 0 calls it."""
        n = min(self.options.num_logged_samples, len(prompts))
        rows = []
        for i in range(n):
            tokens = sampled.sequences[i, sampled.prompt_width :][sampled.sampled[i, sampled.prompt_width :]]
            text = self.tokenizer.decode(tokens.tolist(), skip_special_tokens=False)
            rows.append([int(step), prompts[i], text])
        from lightning.pytorch.loggers import WandbLogger

        for logger in loggers:
            if isinstance(logger, WandbLogger):
                logger.log_text(key="train/tuning/samples", columns=["step", "prompt", "sample"], data=rows)
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            with open(os.path.join(log_dir, "samples.jsonl"), "a", encoding="utf-8") as f:
                for row_step, prompt, text in rows:
                    f.write(json.dumps({"step": row_step, "prompt": prompt, "sample": text}) + "\n")


@torch.no_grad()
def human_text_nll(
    model: Any, tokenizer: Any, texts: Sequence[str], max_tokens: int = 128
) -> tuple[float, int]:
    """Summed negative log-likelihood and token count of texts under ``model``, each cut to its first
    ``max_tokens`` tokens and read after the tokenizer's empty context (BOS, or EOS for GPT-2), as document
    perplexity is; ``exp(nll / tokens)`` is the perplexity. Scored by ``cblight.scoring.Scorer`` in
    batches whose logits stay near 2^26 entries (vocabulary-sized rows)."""
    encoder = Encoder(tokenizer)
    start = empty_context_ids(tokenizer, encoder.prefix)
    groups = [(start, [body[:max_tokens]]) for body in map(encoder.body, texts) if body]
    if not groups:
        return 0.0, 0
    vocab = int(model.get_output_embeddings().weight.shape[0])
    rows = max(1, (1 << 26) // (vocab * (max_tokens + len(start))))
    was_training = model.training
    try:
        scores = Scorer(model, tokenizer, batch_size=rows, share_context=False).score_choices(groups)
    finally:
        model.train(was_training)
    return -sum(s[0].log_prob for s in scores), sum(s[0].num_tokens for s in scores)
