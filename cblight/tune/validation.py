"""Coherence tuning's held-out validation metrics and sample log (paper appendix "From coherence boosting to
coherence tuning").

Validation samples the same held-out prompts with the same seeds at every check and logs
``KL(f_alpha || f_θ)`` under the run's teacher (``val/tuning/kl``, ``kl_long``), against the initial model's
boosted distribution (``kl_initial``, ``top1_initial``: is the model moving toward its boosted self?), the
perplexity of held-out human text (``val/tuning/ppl``: is it still a language model?) and the diversity of
what it samples (self-distillation toward ``alpha < 0`` can collapse it): the mean entropy of its
next-token distributions at the sampled positions (``entropy``), token-level distinct-1/2 of the samples
(``distinct_1``, ``distinct_2``) and the share of samples that end in a repetition loop (``repetition``,
degen's rule, ``cblight.metrics.text_stats``). Where a frozen copy of the initial model is kept, the same
four are measured once for it on the same prompts and seeds (``*_initial``): the reference of the collapse
guard's bands (``cblight.tune.callbacks.CollapseGuard``). The sample log
writes a few training samples to ``samples.jsonl`` beside the logs and to W&B, on rank 0 only, from the log
directory read on every rank in ``setup`` (reading it here, on rank 0 alone, hung DDP at step 0).

``Validator`` is the validator of ``cblight.tune.coherence_tuning.CoherenceTuning``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torchmetrics import MeanMetric, Metric, SumMetric

from cblight.batching import eval_mode
from cblight.boosting import log_softmax32
from cblight.metrics.ngrams import distinct_and_entropy
from cblight.metrics.ragged import RaggedMetric
from cblight.metrics.text_stats import ends_in_repetition
from cblight.option_types import NonNegativeInt, bounded, check_fields
from cblight.scoring import Encoder, Scorer, empty_context_ids
from cblight.sharding import SyncedForwards
from cblight.tune.loss import KLTerms, Sampled, default_loss_chunk, sampled_logits

__all__ = [
    "AtLeastTwo",
    "SampleDiversity",
    "ValidationOptions",
    "Validator",
    "next_token_entropy",
    "sampled_tokens",
]


#: A text cut for its perplexity keeps a token to predict after the first.
AtLeastTwo = bounded("AtLeastTwo", int, "an integer >= 2", lambda v: v >= 2, module=__name__)


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
    text_tokens: AtLeastTwo = 128
    log_samples_every_n_steps: NonNegativeInt = 8
    num_logged_samples: NonNegativeInt = 4

    def __post_init__(self) -> None:
        check_fields(self)


class SampleDiversity(RaggedMetric):
    """Token-level distinct-1 and distinct-2 of a corpus of samples (distinct n-grams / all n-grams, as
    DialoGPT's ``calc_diversity``; ``cblight.metrics.ngrams``) and the share of samples ending in a repeated
    span (degen's rule, ``cblight.metrics.text_stats.ends_in_repetition``; a trailing EOS dropped). The
    samples themselves are the state, so the value over several processes is the value of their union.

    Args:
        eos_token_id: the end-of-sequence id dropped from the end of a sample before the repetition test.
        **kwargs: torchmetrics' ``Metric`` options.
    """

    def __init__(self, eos_token_id: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.eos_token_id = eos_token_id
        self.add_ragged_state("samples")

    def update(self, samples: Sequence[Sequence[int]]) -> None:
        self.append_ragged("samples", samples)

    def compute(self) -> dict[str, torch.Tensor]:
        samples = self.read_ragged("samples")
        values = {f"distinct_{n}": distinct_and_entropy(samples, n)[0] for n in (1, 2)}
        values["repetition"] = sum(
            ends_in_repetition(x, eos_token_id=self.eos_token_id) for x in samples
        ) / max(len(samples), 1)
        return {k: torch.tensor(v, dtype=torch.float64) for k, v in values.items()}


def sampled_tokens(sampled: Sampled) -> list[list[int]]:
    """Each row's sampled tokens, up to and including its first EOS.

    Args:
        sampled: a sampled batch.

    Returns:
        One list of token ids per row.
    """
    width = sampled.prompt_width
    return [
        row[width:][mask[width:]].tolist()
        for row, mask in zip(sampled.sequences, sampled.sampled, strict=True)
    ]


@torch.no_grad()
def next_token_entropy(model: Any, sampled: Sampled) -> torch.Tensor:
    """``H(f(·|w_<c)) = -Σ_w f log f`` (nats) at every sampled position ``c`` of ``sampled`` (the positions
    the loss reads with ``last_m`` unset), row-major; vocabulary-sized rows in float32, a chunk at a time.

    Args:
        model: the causal LM (run in eval mode, no gradient).
        sampled: a sampled batch.

    Returns:
        ``[N]`` float32 entropies, one per sampled position (empty when there is none).
    """
    rows, cols = torch.nonzero(sampled.sampled, as_tuple=True)
    if not rows.numel():
        return torch.zeros(0)
    with eval_mode(model):
        logits, offset = sampled_logits(model, sampled, slice(None), int(cols.min()))
    step = default_loss_chunk(logits.shape[-1])
    pieces = []
    for lo in range(0, int(rows.numel()), step):
        lp = log_softmax32(logits[rows[lo : lo + step], cols[lo : lo + step] - 1 - offset])
        pieces.append(-(lp.exp() * lp).sum(-1))
    return torch.cat(pieces)


class _ModelStats(torch.nn.Module):
    """One model's validation statistics: next-token entropy and diversity of its samples, perplexity of
    the held-out human texts."""

    def __init__(self, tokenizer: Any, max_tokens: int):
        super().__init__()
        self.tokenizer, self.max_tokens = tokenizer, max_tokens
        self.entropy = MeanMetric()
        self.diversity = SampleDiversity(tokenizer.eos_token_id)
        self.nll = SumMetric()
        self.tokens = SumMetric()

    def update(self, model: Any, sampled: Sampled, texts: Sequence[str], synced: SyncedForwards) -> None:
        """Entropy and diversity of ``model``'s samples ``sampled``, and the likelihood of ``texts`` (cut to
        ``max_tokens``); under FSDP2 each model call in a phase of ``synced`` (a process may hold no
        sampled position, or fewer texts)."""
        with synced.phase(model, calls=1):
            self.entropy.update(next_token_entropy(model, sampled))
        with synced.phase(model):
            nll, tokens = human_text_nll(model, self.tokenizer, texts, self.max_tokens)
        self.diversity.update(sampled_tokens(sampled))
        self.nll.update(nll)
        self.tokens.update(tokens)

    def compute(self) -> dict[str, torch.Tensor]:
        """``ppl`` (``exp(nll / tokens)``, where there were texts), ``entropy``, ``distinct_1/2`` and
        ``repetition`` (where there were samples), synced over processes; the metrics reset."""
        values: dict[str, torch.Tensor] = {}
        if self.entropy.update_called:  # a validation ran, on every process alike
            count = self.tokens.compute()
            if float(count) > 0:
                values["ppl"] = torch.exp(self.nll.compute() / count)
            values.update(entropy=self.entropy.compute(), **self.diversity.compute())
        for metric in (self.entropy, self.diversity, self.nll, self.tokens):
            metric.reset()
        return values


class Validator(torch.nn.Module):
    """The validation metrics and the sample log.

    A ``torch.nn.Module`` only because it holds the torchmetrics (registered on the LightningModule as
    before, so that they follow it to its device and ``self.log`` finds them); it has no parameters and
    nothing in the state dict.

    Args:
        options: what validation measures and what the sample log keeps.
        tokenizer: the model's tokenizer (EOS, decoding, the held-out texts).
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
        # the current model's statistics, and once the initial model's (the guard's reference)
        self.current = _ModelStats(tokenizer, options.text_tokens)
        self.initial = _ModelStats(tokenizer, options.text_tokens)
        self.reference: dict[str, float] | None = None  # the initial model's values, once measured

    @torch.no_grad()
    def validation_batch(
        self,
        model: Any,
        initial: Any | None,
        sample: Callable[[Any], Sampled],
        kl_terms: Callable[[Sampled, Any | None], KLTerms],
        same_initial: bool,
        texts: Sequence[str],
        synced: SyncedForwards,
    ) -> dict[str, Metric]:
        """One validation batch, no gradient: ``sample(model)`` draws the held-out samples (fixed seeds),
        ``kl_terms`` scores them under the run's teacher (``None``) and the boosted ``initial`` model
        (``same_initial``: the teacher is it); entropy, diversity and, with ``texts``, perplexity follow, and
        once, the same of the initial model on its own samples.

        Args:
            model: the model being tuned.
            initial: the initial model (``None``: no ``kl_initial`` nor ``*_initial`` values).
            sample: draws the held-out samples of a model, from fixed seeds.
            kl_terms: scores samples under a teacher (``None``: the run's).
            same_initial: the run's teacher is the initial model, so its terms are reused.
            texts: held-out human texts for the perplexity.
            synced: under FSDP2, the phases of synced model calls.

        Returns:
            The KL metrics to log, by name (``val/tuning/kl``, ``kl_long``, and with ``initial``
            ``kl_initial`` and ``top1_initial``).
        """
        sampled = sample(model)
        terms = kl_terms(sampled, None)
        self.kl.update(terms.kl)
        self.kl_long.update(terms.kl[terms.long])
        logged: dict[str, Metric] = {"val/tuning/kl": self.kl, "val/tuning/kl_long": self.kl_long}
        if initial is not None:
            scored = terms if same_initial else kl_terms(sampled, initial)
            self.kl_initial.update(scored.kl)
            self.top1_initial.update(scored.agree.float())
            logged["val/tuning/kl_initial"] = self.kl_initial
            logged["val/tuning/top1_initial"] = self.top1_initial
        self.current.update(model, sampled, texts, synced)
        if self.reference is None and initial is not None:  # once: the guard's reference values
            self.initial.update(initial, sample(initial), texts, synced)
        return logged

    def epoch_values(self) -> dict[str, torch.Tensor]:
        """The epoch's model statistics, at the end of validation, on every process; the metrics reset.

        Returns:
            Perplexity, entropy, distinct-1/2 and repetition of the current model by short name (``ppl``,
            ...), and the initial model's (``*_initial``) once measured.
        """
        values = self.current.compute()
        if self.reference is None and self.initial.entropy.update_called:
            self.reference = {k: float(v) for k, v in self.initial.compute().items()}
        for name, value in (self.reference or {}).items():
            values[f"{name}_initial"] = torch.tensor(value, dtype=torch.float64)
        return values

    # -- the sample log ---------------------------------------------------------------------------------
    def log_samples(
        self, step: int, prompts: Sequence[str], sampled: Sampled, loggers: Sequence[Any], log_dir: str | None
    ) -> None:
        """Log a few of the step's samples to W&B (a table) and ``<log_dir>/samples.jsonl``; rank 0 calls it.

        Args:
            step: the training step.
            prompts: the batch's prompts.
            sampled: the batch's samples.
            loggers: the trainer's loggers (W&B ones get the table).
            log_dir: where ``samples.jsonl`` goes (``None``: no file).
        """
        samples = sampled_tokens(sampled)[: self.options.num_logged_samples]
        decode = self.tokenizer.decode
        rows = [[int(step), prompts[i], decode(x, skip_special_tokens=False)] for i, x in enumerate(samples)]
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
    with eval_mode(model):
        scores = Scorer(model, tokenizer, batch_size=rows, share_context=False).score_choices(groups)
    return -sum(s[0].log_prob for s in scores), sum(s[0].num_tokens for s in scores)
