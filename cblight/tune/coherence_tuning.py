"""Coherence tuning as a LightningModule (paper appendix "From coherence boosting to coherence tuning",
Table 2's "self-tune" row; DESIGN.md §1).

Each training step samples a batch from the current model, computes its coherence-boosted distribution
``f_alpha ∝ f_max^(1-alpha) f_k^alpha`` with no gradient, and steps on ``KL(f_alpha || f_θ)``; the maths
lives in ``cblight.tune.loss``. Distribution is Lightning's (DDP; FSDP for models that outgrow one GPU).

Defaults follow the paper where it speaks (32 steps of 32 sequences of 32 sampled tokens, set in the
trainer and data module, the forward KL) and are ours where its code figure is missing: ``k = 32`` and
``alpha = -0.05`` (Table 2's first boost row, the one whose ``k`` fits inside a WebText first sentence plus
32 sampled tokens), AdamW with learning rate 1e-5, and the frozen initial model as the teacher (the paper
re-boosts the live model). See docs/tuning.md for the reasoning and for the teachers, divergences, top-k
teachers and LoRA.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import lightning as L
import torch

from cblight.models import DTypeName, load_causal_lm, load_tokenizer, model_window
from cblight.scoring import Encoder
from cblight.tune.divergences import check_divergence
from cblight.tune.export import TunedModelExport
from cblight.tune.lora import apply_lora, check_lora_options
from cblight.tune.loss import (
    KLTerms,
    Sampled,
    TuningConfigError,
    check_tuning_options,
    disable_dropout,
    ema_update,
    longest_useful_position,
    tuning_kl_terms,
)
from cblight.tune.rollouts import RNG_KEY, SampledBatches
from cblight.tune.validation import TuningValidation

log = logging.getLogger(__name__)

OptimizerCallable = Callable[[Iterable], torch.optim.Optimizer]
LRSchedulerCallable = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]

EMA_KEY = "cblight_ema_teacher"
TEACHERS = ("live", "frozen", "ema")

__all__ = ["EMA_KEY", "RNG_KEY", "CoherenceTuning"]


def _constant_rate(step: int) -> float:
    return 1.0


def check_teacher(teacher: str, ema_decay: float) -> None:
    if teacher not in TEACHERS:
        raise TuningConfigError(f"teacher must be one of {', '.join(TEACHERS)}; got {teacher!r}")
    if isinstance(ema_decay, bool) or not isinstance(ema_decay, (int, float)) or not 0.0 < ema_decay < 1.0:
        raise TuningConfigError(f"ema_decay must be in (0, 1), got {ema_decay!r}")


class CoherenceTuning(SampledBatches, TuningValidation, TunedModelExport, L.LightningModule):
    """Coherence tuning of any Hugging Face causal LM.

    Args:
        model: Hub id or local directory of the pretrained model (``AutoModelForCausalLM``).
        tokenizer: tokenizer id/directory (default: ``model``).
        k: short-context length of the boosted teacher's short expert ``f_k``.
        alpha: boosting weight in the generation form ``(1-alpha) log f_max + alpha log f_k``
            (Table 2; negative boosts long-range context).
        teacher: ``"frozen"`` (a frozen copy of the initial model boosted: a fixed target, the default),
            ``"live"`` (the paper: the current model boosted, which overshoots when run long; see
            docs/tuning.md) or ``"ema"`` (an exponential moving average of the student, boosted);
            ``frozen`` and ``ema`` cost one extra full forward per step and a copy of the weights.
        ema_decay: decay ``d`` of the EMA teacher, ``θ_ema ← d θ_ema + (1 - d) θ`` after every optimizer step.
        divergence: ``"forward_kl"`` (the paper, ``KL(f_alpha || f_θ)``), ``"reverse_kl"`` or ``"jsd"``
            (generalised Jensen-Shannon with ``beta``, TRL's GKD convention; ``cblight.tune.divergences``).
        beta: the JSD's teacher weight in [0, 1] (0: forward KL, 1: reverse KL).
        teacher_top_k: distil only the teacher's ``k`` most likely tokens, both distributions renormalised
            over them (``None``: the whole vocabulary).
        loss_chunk_size: positions per chunk of the loss (default: about 64 MB per float32 ``[chunk, V]``).
        last_m: KL only over the last ``m`` positions of the samples (``None``: every sampled position).
        max_new_tokens: tokens sampled after each prompt (the paper: 32).
        max_prompt_tokens: prompts are cut from the left to this many tokens (BOS kept).
        temperature, top_p, top_k: sampling of the tuning sequences (defaults: plain sampling from ``f``).
        seed: sampling seed; process ``r`` starts from ``seed + r``, and the state is checkpointed.
        optimizer, lr_scheduler: factories called with the parameters / the optimizer
            (default: AdamW lr 1e-5, weight decay 0, constant rate). Schedulers step every optimizer step.
        gradient_checkpointing: recompute activations in the backward pass (transformers' implementation).
        dtype: dtype the weights are loaded in (use the trainer's ``precision`` for mixed precision).
        window_chunk_size: short-context windows per forward pass of the teacher (default: 32 on CPU, 256
            on accelerators, ``batching.default_window_chunk``).
        val_against_initial: also log ``val/tuning/kl_initial``, the KL from the boosted *initial* model
            (what tuning approximates) on the validation samples; with the live teacher this keeps a
            frozen copy of the initial weights.
        export_dir: where ``save_pretrained`` writes the tuned model and tokenizer at the end of ``fit``
            (default ``<log_dir>/hf_model``); ``export: false`` skips it.
        log_samples_every_n_steps, num_logged_samples: sample generations logged as a table (W&B) and
            appended to ``<log_dir>/samples.jsonl``.
        val_text_tokens: held-out human texts (validation batches' ``texts``) are cut to this many tokens
            for ``val/tuning/ppl``.
        lora_rank, lora_alpha, lora_target_modules: LoRA adapters through ``peft`` (``lora_rank = 0``: full
            fine-tuning); the export then holds the merged model and ``adapter/``.
    """

    def __init__(
        self,
        model: str = "gpt2",
        tokenizer: str | None = None,
        k: int = 32,
        alpha: float = -0.05,
        teacher: str = "frozen",
        ema_decay: float = 0.9,
        divergence: str = "forward_kl",
        beta: float = 0.5,
        teacher_top_k: int | None = None,
        loss_chunk_size: int | None = None,
        last_m: int | None = None,
        max_new_tokens: int = 32,
        max_prompt_tokens: int = 128,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 0,
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
        gradient_checkpointing: bool = False,
        dtype: DTypeName = "float32",
        revision: str | None = None,
        trust_remote_code: bool = False,
        window_chunk_size: int | None = None,
        val_against_initial: bool = False,
        export: bool = True,
        export_dir: str | None = None,
        log_samples_every_n_steps: int = 8,
        num_logged_samples: int = 4,
        val_text_tokens: int = 128,
        lora_rank: int = 0,
        lora_alpha: float = 16.0,
        lora_target_modules: str | list[str] = "all-linear",
    ):
        super().__init__()
        check_tuning_options(k=k, alpha=alpha, last_m=last_m, max_new_tokens=max_new_tokens)
        check_teacher(teacher, ema_decay)
        check_divergence(divergence, beta, teacher_top_k)
        check_lora_options(lora_rank, lora_alpha, lora_target_modules)
        if loss_chunk_size is not None and loss_chunk_size < 1:
            raise TuningConfigError(
                f"loss_chunk_size must be a positive integer or null, got {loss_chunk_size}"
            )
        if val_text_tokens < 2:
            raise TuningConfigError(f"val_text_tokens must be at least 2, got {val_text_tokens}")
        if not (temperature > 0 and math.isfinite(temperature)):
            raise TuningConfigError(f"temperature must be positive, got {temperature}")
        if not 0 < top_p <= 1:
            raise TuningConfigError(f"top_p must be in (0, 1], got {top_p}")
        if top_k < 0:
            raise TuningConfigError(f"top_k must be at least 0 (0 disables it), got {top_k}")
        if max_prompt_tokens < 1 or (window_chunk_size is not None and window_chunk_size < 1):
            raise TuningConfigError("max_prompt_tokens and window_chunk_size must be positive")
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler

        self.tokenizer = load_tokenizer(
            tokenizer or model, revision=revision, trust_remote_code=trust_remote_code
        )
        self.model = load_causal_lm(
            model, dtype=dtype, revision=revision, trust_remote_code=trust_remote_code
        )
        self.encoder = Encoder(self.tokenizer)
        self.window = model_window(self.model)
        check_tuning_options(
            k=k,
            alpha=alpha,
            last_m=last_m,
            max_new_tokens=max_new_tokens,
            window=self.window - len(self.encoder.prefix),
        )
        if max_new_tokens + len(self.encoder.prefix) + 1 > self.window:
            raise TuningConfigError(
                f"max_new_tokens = {max_new_tokens} does not fit the model window of {self.window}"
            )
        self.max_prompt_tokens = min(max_prompt_tokens, self.window - max_new_tokens)
        disable_dropout(self.model)
        self.model.train()
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # Teacher copies are not registered submodules: they stay out of DDP and the optimizer, and only the
        # EMA (which training changes) goes into checkpoints, by on_save_checkpoint.
        initial = None
        if teacher == "frozen" or val_against_initial:
            initial = copy.deepcopy(self.model).eval().requires_grad_(False)
        if lora_rank:
            self.model = apply_lora(self.model, lora_rank, lora_alpha, lora_target_modules)
        teacher_copy = initial if teacher == "frozen" else None
        if teacher == "ema":
            teacher_copy = copy.deepcopy(self.model).eval().requires_grad_(False)
        object.__setattr__(self, "initial_model", initial)
        object.__setattr__(self, "teacher_model", teacher_copy)
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.eos_id = self.tokenizer.eos_token_id
        self.init_validation_metrics()
        self._log_dir: str | None = None
        self._step_start = 0.0
        self._step_tokens = 0

    # -- checks ---------------------------------------------------------------------------------------
    def prompt_ids(self, text: str) -> list[int]:
        """Token ids of a prompt (BOS/EOS alone for an empty one), cut from the left, special prefix kept."""
        ids = self.encoder.context(text)
        if len(ids) <= self.max_prompt_tokens:
            return ids
        prefix = self.encoder.prefix
        keep = self.max_prompt_tokens - len(prefix)
        return prefix + ids[len(ids) - keep :] if prefix else ids[-self.max_prompt_tokens :]

    def check_prompts(self, prompts: Sequence[str]) -> None:
        """Refuse prompts with which no sampled sequence can be longer than ``k`` (the KL would be zero).

        Stops at the first prompt that is long enough, so large prompt files cost little."""
        if not prompts:
            raise TuningConfigError("the prompt data module yields no prompts")
        n_prefix, new = len(self.encoder.prefix), self.hparams.max_new_tokens
        longest = 0
        for prompt in dict.fromkeys(prompts):
            longest = max(longest, len(self.prompt_ids(prompt)))
            if longest_useful_position([longest], n_prefix, new) > self.hparams.k:
                return
        raise TuningConfigError(
            f"no sampled position can see more than {longest_useful_position([longest], n_prefix, new)} tokens "
            f"of context (longest prompt {longest} tokens + max_new_tokens {new}), which is not more than "
            f"k = {self.hparams.k}: f_k would equal f_max everywhere and the KL would be identically zero. "
            "Use longer prompts, more max_new_tokens or a smaller k."
        )

    def setup(self, stage: str) -> None:
        # trainer.log_dir broadcasts from rank 0: every process reads it here, once, and never again (a
        # collective that only rank 0 joins, as sample logging once did, hangs the run).
        self._log_dir = self.trainer.log_dir
        if stage != "fit":
            return
        trainer = self.trainer
        if self._synced() and (self.hparams.teacher == "ema" or self.hparams.lora_rank):
            raise TuningConfigError(
                "teacher: ema and lora_rank > 0 need every process to hold the whole model; "
                "use a replicated strategy (DDP) or teacher: live without LoRA under FSDP/DeepSpeed"
            )
        if trainer.max_steps is None or trainer.max_steps < 0:
            raise TuningConfigError(
                "set trainer.max_steps: the prompt stream never ends (the paper runs 32 steps)"
            )
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is not None and hasattr(datamodule, "train_prompts"):
            self.check_prompts(datamodule.train_prompts())

    # -- optimisation ---------------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        params = [p for p in self.parameters() if p.requires_grad]
        if self.optimizer_factory is None:
            optimizer = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)
        else:
            optimizer = self.optimizer_factory(params)
        # One endless epoch: a scheduler must step per optimizer step, never per epoch. A constant rate
        # still goes through a (no-op) scheduler so that LearningRateMonitor logs it under our name.
        if self.scheduler_factory is None:
            scheduler: Any = torch.optim.lr_scheduler.LambdaLR(optimizer, _constant_rate)
        else:
            scheduler = self.scheduler_factory(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "train/tuning/lr"},
        }

    def configure_callbacks(self) -> list[L.Callback]:
        """Stop cleanly on Ctrl-C / SIGTERM, log the learning rate, count the progress bar in steps."""
        from lightning.pytorch.callbacks import LearningRateMonitor

        from cblight.tune.callbacks import StopOnSignal, step_progress_bar

        trainer = self.trainer
        callbacks: list[L.Callback] = []
        if not any(isinstance(c, StopOnSignal) for c in trainer.callbacks):
            callbacks.append(StopOnSignal())
        if trainer.loggers and not any(isinstance(c, LearningRateMonitor) for c in trainer.callbacks):
            callbacks.append(LearningRateMonitor(logging_interval="step"))
        bar = step_progress_bar(trainer.progress_bar_callback)  # Lightning's counts epochs; ours steps
        return callbacks + ([bar] if bar is not None else [])

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        # The EMA follows every optimizer step right away, before any callback (a checkpoint) sees it.
        super().optimizer_step(*args, **kwargs)
        if self.hparams.teacher == "ema":
            assert self.teacher_model is not None
            ema_update(self.teacher_model, self.model, self.hparams.ema_decay)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The gradient's 2-norm before clipping (over all processes' shards under FSDP)."""
        grads = [p.grad.detach().float() for p in self.parameters() if p.grad is not None]
        squares = (
            torch.stack([g.square().sum() for g in grads]).sum()
            if grads
            else torch.zeros((), device=self.device)
        )
        if self._synced():
            squares = self.trainer.strategy.reduce(squares, reduce_op="sum")
        self.log("train/tuning/grad_norm", squares.sqrt(), batch_size=1)

    # -- devices of the teacher copies ---------------------------------------------------------------
    def _move_copies(self) -> None:
        for copy_ in (self.initial_model, self.teacher_model):
            if copy_ is not None:
                copy_.to(self.device)

    def on_train_start(self) -> None:
        self._move_copies()
        self.restore_sampling_state()

    def on_validation_start(self) -> None:
        self._move_copies()

    # -- the loss ------------------------------------------------------------------------------------
    def kl_terms(self, sampled: Sampled, teacher_model: Any | None = None) -> KLTerms:
        """The KL terms of a sampled batch under the configured teacher (or ``teacher_model``)."""
        hp = self.hparams
        sync = self._window_call_sync if self._synced() else None
        return tuning_kl_terms(
            self.model,
            sampled,
            k=hp.k,
            alpha=hp.alpha,
            last_m=hp.last_m,
            prefix=self.encoder.prefix,
            teacher_model=teacher_model if teacher_model is not None else self.teacher_model,
            chunk_size=hp.window_chunk_size,
            sync_window_calls=sync,
            divergence=hp.divergence,
            beta=hp.beta,
            teacher_top_k=hp.teacher_top_k,
            loss_chunk_size=hp.loss_chunk_size,
        )

    def _window_call_sync(self, local_calls: int) -> int:
        t = torch.tensor([local_calls], device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t.item())

    def _global_sums(self, terms: KLTerms, sampled: Sampled) -> dict[str, float]:
        """Counts and sums over every process in one all-reduce."""
        long = terms.long
        kl = terms.kl.detach()
        local = torch.stack(
            [
                torch.tensor(float(terms.count), device=self.device),
                long.sum().float(),
                sampled.sampled.sum().float(),
                kl.sum(),
                (kl * long).sum(),
                (terms.gap * long).sum(),
            ]
        ).to(self.device, torch.float64)
        total = self.trainer.strategy.reduce(local, reduce_op="sum") if self._trainer is not None else local
        names = ["count", "long", "sampled_tokens", "kl_sum", "kl_long_sum", "gap_long_sum"]
        return dict(zip(names, total.tolist()))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        sampled = self.sample(batch)
        terms = self.kl_terms(sampled)
        sums = self._global_sums(terms, sampled)
        count = max(sums["count"], 1.0)
        # Sum over this process's positions / positions of all processes, times the number of processes
        # because DDP averages gradients: the update is the gradient of the global per-position mean.
        loss = terms.loss_sum * (self.trainer.world_size / count) + terms.anchor
        long = max(sums["long"], 1.0)
        prefix = "train/tuning"
        self.log(f"{prefix}/loss", sums["kl_sum"] / count, prog_bar=True, batch_size=len(batch["prompts"]))
        self.log(f"{prefix}/kl_long", sums["kl_long_sum"] / long, batch_size=len(batch["prompts"]))
        self.log(f"{prefix}/logprob_gap", sums["gap_long_sum"] / long, batch_size=len(batch["prompts"]))
        self.log(f"{prefix}/long_fraction", sums["long"] / count, batch_size=len(batch["prompts"]))
        self._step_tokens = int(sums["sampled_tokens"])
        self._maybe_log_samples(batch["prompts"], sampled)
        return loss

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._step_start = time.perf_counter()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        elapsed = time.perf_counter() - self._step_start
        if elapsed > 0:
            self.log("train/tuning/tokens_per_s", self._step_tokens / elapsed, batch_size=1)

    # -- checkpoints and export ---------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Store every process's sampling random state (Lightning does not save random states) and the
        EMA teacher's trainable weights (the copy is not a registered submodule)."""
        if self.hparams.teacher == "ema" and self.teacher_model is not None:
            trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
            checkpoint[EMA_KEY] = {
                n: p.detach().cpu().clone()
                for n, p in self.teacher_model.named_parameters()
                if n in trainable
            }
        self.save_sampling_state(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.load_sampling_state(checkpoint)
        ema = checkpoint.get(EMA_KEY)
        if ema is not None and self.teacher_model is not None:
            params = dict(self.teacher_model.named_parameters())
            with torch.no_grad():
                for name, value in ema.items():
                    params[name].copy_(value)
