"""Coherence tuning as a LightningModule (paper appendix "From coherence boosting to coherence tuning",
Table 2's "+ self-tune" row).

Each training step samples a batch from the current model, computes its coherence-boosted distribution
``f_alpha ∝ f_max^(1-alpha) f_k^alpha`` with no gradient, and steps on ``KL(f_alpha || f_θ)``; the maths
lives in ``cblight.tune.loss``. Distribution is Lightning's: DDP, or FSDP2 (``-c configs/fsdp.yaml``,
``cblight.sharding``) for models that outgrow one device, which shards the student and every teacher copy
over the processes.

``__init__`` only stores and checks the options (and reads the checkpoint's config: ``boosting.k`` must fit
its window); ``configure_model``, which Lightning calls on every process once the strategy is set up, builds
the model for the strategy (``cblight.sharding.build_causal_lm``), the teacher's copies and the validator.
The tokenizer and the sampler load on first use (the prompt check before ``fit`` needs them; no weights).

``CoherenceTuning`` holds four helpers and its Lightning hooks delegate to them: the sampler
(``cblight.tune.rollouts``: prompts, samples, the per-process random state), the teacher
(``cblight.tune.teacher``: the frozen / live / EMA copies), the validator (``cblight.tune.validation``:
held-out metrics and the sample log) and the exporter (``cblight.tune.export``, a callback of the run:
``save_pretrained`` at the end of ``fit``). Options come grouped, each group validated when it is made: ``boosting`` and ``sampling``
(``cblight.options``), ``teacher``, ``loss``, ``lora``, ``validation`` and ``export``.

Defaults follow the paper where it speaks (32 steps of 32 sequences of 32 sampled tokens, set in the
trainer and data module, the forward KL) and are ours where its code figure is missing: ``k = 32`` and
``alpha = -0.05`` (Table 2's first boost row, the one whose ``k`` fits inside a WebText first sentence plus
32 sampled tokens), AdamW with learning rate 1e-5, and the frozen initial model as the teacher (the paper
re-boosts the live model). See docs/tuning.md for the reasoning and for the teachers, divergences, top-k
teachers and LoRA.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import torch

from cblight.errors import CblightError, ConfigError
from cblight.models import LoadOptions, checkpoint_config, load_tokenizer, model_window
from cblight.option_types import PositiveInt, check_arguments
from cblight.options import Boosting, Sampling
from cblight.scoring import Encoder
from cblight.sharding import SyncedForwards, build_causal_lm, fsdp_mesh, is_sharded
from cblight.tune.callbacks import GuardOptions
from cblight.tune.export import Exporter, ExportOptions
from cblight.tune.lora import AdaptersDisabled, LoraOptions, apply_lora
from cblight.tune.loss import KLTerms, LossOptions, Sampled, tuning_kl_terms
from cblight.tune.preflight import (
    check_max_steps,
    check_shared_options,
    check_strategy,
    check_validation_data,
)
from cblight.tune.rollouts import RNG_KEY, RolloutOptions, RolloutSampler, seed_of
from cblight.tune.teacher import EMA_KEY, Teacher, TeacherOptions, frozen_copy, local_shard
from cblight.tune.validation import ValidationOptions, Validator

OptimizerCallable = Callable[[Iterable], torch.optim.Optimizer]
LRSchedulerCallable = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]

# load_from_checkpoint rebuilds the option objects from their plain mappings with LightningCLI's instantiator
CLI_INSTANTIATOR = "lightning.pytorch.cli.instantiate_module"

__all__ = ["CoherenceTuning"]


class TuningDivergedError(CblightError):
    """A tuning run whose weights became non-finite."""


def disable_dropout(model: torch.nn.Module) -> None:
    """Dropout off while the model stays in train mode (which gradient checkpointing needs): every
    ``nn.Dropout`` gets ``p = 0`` and every float ``*dropout*`` attribute (functional attention dropout)
    becomes 0. The model's config is left alone, so an exported model keeps its dropout settings."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name.lower() and isinstance(value, float):
                setattr(module, name, 0.0)


class CoherenceTuning(L.LightningModule):
    """Coherence tuning of any Hugging Face causal LM.

    Args:
        model: Hub id or local directory of the pretrained model (``AutoModelForCausalLM``).
        tokenizer: tokenizer id/directory (default: ``model``).
        load: how the checkpoint loads: ``revision``, ``dtype`` (use the trainer's ``precision`` for mixed
            precision) and ``trust_remote_code`` (``cblight.models.LoadOptions``).
        gradient_checkpointing: recompute activations in the backward pass (transformers' implementation).
        boosting: the teacher's boosting: ``mode: last_k`` (the short expert ``f_k`` sees the last ``k``
            tokens) in the generation form ``(1-alpha) log f_max + alpha log f_k`` (Table 2; negative
            ``alpha`` boosts long-range context; ``alpha`` 0 is refused), or ``adaptive: jsd`` for a teacher
            whose alpha is set at every position by a label-free rule (docs/adaptive.md).
        sampling: sampling of the tuning sequences: ``do_sample: true`` (no beams), ``temperature``,
            ``top_p``, ``top_k`` (defaults: plain sampling from ``f``) and ``seed``; process ``r`` starts
            from ``seed + r``, and the state is checkpointed.
        max_new_tokens: tokens sampled after each prompt (the paper: 32).
        max_prompt_tokens: prompts are cut from the left to this many tokens (BOS kept).
        rollouts: how the samples are decoded: ``cache`` (``auto``, ``dynamic``, ``static``) and ``compile``
            (``cblight.tune.rollouts.RolloutOptions``).
        teacher: which model is boosted into the teacher: ``kind`` ``frozen`` (the default), ``live`` (the
            paper) or ``ema`` with ``ema_decay`` (``cblight.tune.teacher.TeacherOptions``).
        loss: ``divergence`` (``forward_kl``, the paper; ``reverse_kl``; ``jsd`` with ``beta``),
            ``teacher_top_k``, ``last_m``, ``chunk_size`` and ``window_chunk_size``
            (``cblight.tune.loss.LossOptions``).
        lora: LoRA adapters through ``peft``: ``rank`` (0: full fine-tuning), ``alpha``, ``target_modules``
            (``cblight.tune.lora.LoraOptions``).
        validation: ``against_initial``, ``text_tokens``, ``log_samples_every_n_steps``,
            ``num_logged_samples`` (``cblight.tune.validation.ValidationOptions``).
        guard: the band a run must stay in (``max_ppl_ratio``, ``min_entropy_ratio``, ``min_distinct_ratio``,
            ``max_repetition``; ``cblight.tune.callbacks.GuardOptions``, on by default), checked after every
            validation: a run that leaves it stops, its last good checkpoint named, and exports nothing.
        export: ``enabled``, ``dir`` and ``overwrite`` of the ``save_pretrained`` export at the end of ``fit``
            (default ``<log_dir>/hf_model``; ``cblight.tune.export.ExportOptions``).
        optimizer: factory called with the trainable parameters (default: AdamW lr 1e-5, weight decay 0).
        lr_scheduler: factory called with the optimizer (default: a constant rate); it steps every
            optimizer step.
    """

    def __init__(
        self,
        model: str = "gpt2",
        tokenizer: str | None = None,
        load: LoadOptions = LoadOptions(),
        gradient_checkpointing: bool = False,
        boosting: Boosting = Boosting(k=32, alpha=-0.05),
        sampling: Sampling = Sampling(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, seed=0),
        max_new_tokens: PositiveInt = 32,
        max_prompt_tokens: PositiveInt = 128,
        rollouts: RolloutOptions = RolloutOptions(),
        teacher: TeacherOptions = TeacherOptions(),
        loss: LossOptions = LossOptions(),
        lora: LoraOptions = LoraOptions(),
        validation: ValidationOptions = ValidationOptions(),
        guard: GuardOptions = GuardOptions(),
        export: ExportOptions = ExportOptions(),
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
    ):
        check_arguments(CoherenceTuning.__init__, locals())
        super().__init__()
        # Every option group checked itself when it was made; what remains is what tuning asks of the
        # shared ones, checked before anything is loaded.
        check_shared_options(boosting, sampling)
        # Option objects go into ``hparams`` (checkpoints, logged configs) as plain mappings, as LightningCLI
        # stores them, so that checkpoints load with ``torch.load(weights_only=True)`` and
        # ``load_from_checkpoint`` rebuilds the objects with LightningCLI's instantiator.
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        if "_instantiator" not in self.hparams:  # made by LightningCLI: already plain
            plain = {name: asdict(v) if is_dataclass(v) else v for name, v in self.hparams.items()}
            self.save_hyperparameters({**plain, "_instantiator": CLI_INSTANTIATOR})
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        self.model_name = model
        self.tokenizer_name = tokenizer or model
        self.load_options = load
        self.boosting = boosting
        self.sampling = sampling
        self.rollouts = rollouts
        self.loss_options = loss
        self.lora_options = lora
        self.teacher_options = teacher
        self.validation_options = validation
        self.guard_options = guard
        # from the checkpoint's config, before any weights load (a path that is no model fails here): the
        # window, and a static cache or compiled decoding the model's class cannot do
        config = checkpoint_config(model, load)
        self.window = model_window(SimpleNamespace(config=config))
        rollouts.check_config(config)
        if boosting.k >= self.window:
            raise ConfigError(
                f"boosting.k = {boosting.k} must be smaller than the model window of {self.window} tokens"
            )
        self.model: torch.nn.Module | None = None  # built by configure_model
        self.teacher: Teacher | None = None
        self.validator: Validator | None = None
        self.exporter = Exporter(export)
        self._log_dir: str | None = None
        self._step_start = 0.0
        self._step_tokens = 0
        # set by ``cblight tune`` once its check pass has run: ``setup`` then trusts the run
        self.run_checked = False

    # -- what is built, and where ---------------------------------------------------------------------
    @functools.cached_property
    def tokenizer(self) -> Any:
        """The tokenizer, loaded on first use."""
        return load_tokenizer(self.tokenizer_name, self.load_options)

    @property
    def encoder(self) -> Encoder:
        """The tokenizer's conventions (its special prefix, BOS for Llama)."""
        return self.sampler.encoder

    @functools.cached_property
    def sampler(self) -> RolloutSampler:
        """The rollout sampler, made on first use; ``boosting.k`` is checked against the window the
        tokenizer's special prefix leaves."""
        encoder = Encoder(self.tokenizer)
        room = self.window - len(encoder.prefix)
        if self.boosting.k >= room:
            raise ConfigError(
                f"boosting.k = {self.boosting.k} must be smaller than the model window of {room} tokens"
            )
        return RolloutSampler(
            encoder,
            self.sampling,
            self.hparams.max_new_tokens,
            self.hparams.max_prompt_tokens,
            self.window,
            self.rollouts,
        )

    @property
    def synced(self) -> SyncedForwards:
        """The phases of synced forward calls, enabled when FSDP2 shards the models over several processes:
        every process must then make the same forward calls (``cblight.sharding.SyncedForwards``)."""
        trainer = self._trainer
        return SyncedForwards(is_sharded(trainer) and trainer.world_size > 1, self.device)

    def configure_model(self) -> None:
        """Build the model for the run's strategy (whole, or under FSDP2 sharded over the processes, no
        process holding it whole), the teacher's copies and the validator; Lightning calls it on every
        process once the strategy is set up (and ``load_from_checkpoint`` without one). Idempotent."""
        if self.model is not None:
            return
        trainer = self._trainer
        mesh = fsdp_mesh(trainer)
        model = build_causal_lm(self.model_name, self.load_options, mesh=mesh)
        disable_dropout(model)
        model.train()
        if self.hparams.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        teacher, validation = self.teacher_options, self.validation_options
        datamodule = getattr(trainer, "datamodule", None)
        guarded = self.guard_options.enabled and not (
            hasattr(datamodule, "val_prompts") and not datamodule.val_prompts()
        )  # nothing to guard without validation: no initial model kept for it
        needed = (
            guarded or teacher.kind == "frozen" or validation.against_initial or bool(teacher.trust_region)
        )

        def frozen_student() -> torch.nn.Module:
            # under FSDP2 a second sharded build from the checkpoint (the initial weights, no whole copy);
            # else a copy of ``model`` as it is when called (the initial model, or with LoRA the student)
            if mesh is not None:
                return build_causal_lm(self.model_name, self.load_options, mesh=mesh).requires_grad_(False)
            return frozen_copy(model)

        initial: Any = None
        if self.lora_options.rank:
            model = apply_lora(model, self.lora_options)
        if needed:  # with LoRA the base model with the adapters switched off: no second copy
            initial = AdaptersDisabled(model) if self.lora_options.rank else frozen_student()
        self.model = model
        self.teacher = Teacher(teacher, initial, frozen_student)
        self.validator = Validator(validation, self.tokenizer)

    # -- checks ---------------------------------------------------------------------------------------
    def check_prompts(self, prompts: Sequence[str]) -> None:
        """Refuse prompts with which no sampled sequence can be longer than ``boosting.k`` (the KL would be
        identically zero).

        Args:
            prompts: the training prompts.

        Raises:
            ConfigError: no prompt is long enough.
        """
        self.sampler.check_prompts(prompts, self.boosting.k)

    def setup(self, stage: str) -> None:
        # trainer.log_dir broadcasts from rank 0: every process reads it here, once, and never again (a
        # collective that only rank 0 joins, as sample logging once did, hangs the run).
        self._log_dir = self.trainer.log_dir
        if stage != "fit" or self.run_checked:
            return  # ``cblight tune`` checked the run before it made this module (cblight.tune.preflight)
        # a ``Trainer.fit`` called from Python: the run's checks, once, before the model is built
        check_strategy(self.trainer.strategy, self.lora_options, self.rollouts)
        check_max_steps(self.trainer.max_steps)
        datamodule = getattr(self.trainer, "datamodule", None)
        if hasattr(datamodule, "train_prompts"):
            self.check_prompts(datamodule.train_prompts())
            datamodule.check_batch_size()
        check_validation_data(self.guard_options, datamodule)  # no validation in the data: no check

    # -- optimisation ---------------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        adamw = functools.partial(torch.optim.AdamW, lr=1e-5, weight_decay=0.0)
        optimizer = (self.optimizer_factory or adamw)([p for p in self.parameters() if p.requires_grad])
        # One endless epoch: a scheduler must step per optimizer step, never per epoch. A constant rate
        # still goes through a (no-op) scheduler so that LearningRateMonitor logs it under our name.
        constant = functools.partial(torch.optim.lr_scheduler.LambdaLR, lr_lambda=lambda step: 1.0)
        scheduler = (self.scheduler_factory or constant)(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "train/tuning/lr"},
        }

    def configure_callbacks(self) -> list[L.Callback]:
        """The run's callbacks: stop cleanly on Ctrl-C / SIGTERM, guard against collapse (with ``guard``
        bands), export at the end of ``fit``, log the learning rate; the trainer's progress bar is swapped in
        place for one that counts optimizer steps.

        Returns:
            The callbacks the trainer does not hold already (one of each type).
        """
        from lightning.pytorch.callbacks import LearningRateMonitor, RichProgressBar, TQDMProgressBar

        from cblight.tune.callbacks import CollapseGuard, RichStepProgressBar, StepProgressBar, StopOnSignal

        trainer = self.trainer
        wanted = [
            StopOnSignal(),
            *([CollapseGuard(self.guard_options)] if self.guard_options.enabled else []),
            self.exporter,
            *([LearningRateMonitor(logging_interval="step")] if trainer.loggers else []),
        ]
        callbacks = [c for c in wanted if not any(isinstance(t, type(c)) for t in trainer.callbacks)]
        # Lightning's default bar counts epochs, ours steps. Swapped in place: a bar returned from here would
        # make Lightning announce, on every run, that it overrides the trainer's own.
        bar = trainer.progress_bar_callback
        steps = {TQDMProgressBar: StepProgressBar, RichProgressBar: RichStepProgressBar}.get(type(bar))
        if steps is not None:
            trainer.callbacks[trainer.callbacks.index(bar)] = steps(refresh_rate=bar.refresh_rate)
        return callbacks

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        # The EMA follows every optimizer step right away, before any callback (a checkpoint) sees it.
        super().optimizer_step(*args, **kwargs)
        self.teacher.update(self.model, self.global_step + 1)  # Lightning counts the step after this hook

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Log the gradient's 2-norm before clipping, ``train/tuning/grad_norm`` (under FSDP2 over every
        process's shards).

        Args:
            optimizer: the optimizer about to step (unused).
        """
        local = [local_shard(p.grad.detach()) for p in self.parameters() if p.grad is not None]
        squares = torch.stack(
            [g.float().square().sum() for g in local] or [torch.zeros((), device=self.device)]
        ).sum()
        if self.synced.enabled:
            squares = self.trainer.strategy.reduce(squares, reduce_op="sum")
        self.log("train/tuning/grad_norm", squares.sqrt(), batch_size=1)

    # -- the training step ----------------------------------------------------------------------------
    def on_train_start(self) -> None:
        self.teacher.to(self.device)  # the copies are not submodules: Lightning does not move them
        self.sampler.start(self.global_rank, self.trainer.world_size, self.global_step, self.device)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._step_start = time.perf_counter()

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        prompts = batch["prompts"]
        # 1. sample from the current model (this process's random state advances)
        with self._diverged_at_sampling():
            sampled = self.sampler.sample(
                self.model, prompts, self.device, rank=self.global_rank, synced=self.synced.enabled
            )
        # 2-3. the boosted teacher at every position in scope (no gradient) and the divergence to it
        terms = self.kl_terms(sampled)
        sums = terms.global_sums(sampled.sampled, self.device, self.trainer.strategy.reduce)
        count = max(sums["count"], 1.0)
        # Sum over this process's positions / positions of all processes, times the number of processes
        # because DDP averages gradients: the update is the gradient of the global per-position mean.
        loss = terms.loss_sum * (self.trainer.world_size / count) + terms.anchor
        long = max(sums["long"], 1.0)
        prefix, n = "train/tuning", len(prompts)
        beta = self.teacher.options.trust_region
        objective = sums["kl_sum"] + beta * sums["trust_sum"]
        self.log(f"{prefix}/loss", objective / count, prog_bar=True, batch_size=n)
        if beta:
            self.log(f"{prefix}/trust_kl", sums["trust_sum"] / count, batch_size=n)
        self.log(f"{prefix}/kl_long", sums["kl_long_sum"] / long, batch_size=n)
        self.log(f"{prefix}/logprob_gap", sums["gap_long_sum"] / long, batch_size=n)
        self.log(f"{prefix}/long_fraction", sums["long"] / count, batch_size=n)
        self._step_tokens = int(sums["sampled_tokens"])
        every = self.validator.options.log_samples_every_n_steps
        if every and self.global_step % every == 0 and self.trainer.is_global_zero:
            self.validator.log_samples(self.global_step, prompts, sampled, self.loggers, self._log_dir)
        return loss

    @contextlib.contextmanager
    def _diverged_at_sampling(self) -> Iterator[None]:
        """A model whose weights training made non-finite (a learning rate far too large) cannot be sampled:
        torch's sampler fails on its probabilities. Said as one line naming the fix, not as torch's
        traceback."""
        try:
            yield
        except RuntimeError as err:
            if "probability tensor contains either" not in str(err):
                raise
            optimizers = self.trainer.optimizers
            lr = optimizers[0].param_groups[0].get("lr") if optimizers else None
            raise TuningDivergedError(
                f"tuning diverged by step {self.global_step}: the model's next-token probabilities are no longer "
                "finite (its weights or their outputs overflowed); lower the learning rate "
                f"(--model.optimizer.init_args.lr{f', now {lr:g}' if lr is not None else ''}) or keep "
                "trainer.gradient_clip_val on; nothing was exported"
            ) from None

    def kl_terms(self, sampled: Sampled, teacher_model: Any | None = None) -> KLTerms:
        """The loss terms of a sampled batch: the divergence from the boosted teacher ``f_alpha`` to the model
        (``cblight.tune.loss.tuning_kl_terms``; the paper's ``KL(f_alpha || f_θ)`` by default).

        Args:
            sampled: the batch sampled from the model.
            teacher_model: the model boosted into the teacher instead of the run's (validation's initial
                model; no trust region then).

        Returns:
            The per-position terms and the scalar that carries the gradient.
        """
        return tuning_kl_terms(
            self.model,
            sampled,
            k=self.boosting.k,
            alpha=self.boosting.alpha,
            options=self.loss_options,
            prefix=self.encoder.prefix,
            teacher_model=teacher_model if teacher_model is not None else self.teacher.model,
            synced=self.synced,
            # the trust region's f_0 (used while trust_region > 0): the initial copy, under the run's teacher
            reference_model=self.teacher.initial if teacher_model is None else None,
            trust_region=self.teacher.options.trust_region,
            adaptive=self.boosting.adaptive,
        )

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        elapsed = time.perf_counter() - self._step_start
        if elapsed > 0:
            self.log("train/tuning/tokens_per_s", self._step_tokens / elapsed, batch_size=1)

    # -- validation -----------------------------------------------------------------------------------
    def on_validation_start(self) -> None:
        self.teacher.to(self.device)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        # The same held-out prompts and random seeds every time, so values are comparable across the run.
        prompts = batch["prompts"]
        seed = seed_of(self.sampler.seed, 1_000_003, batch_idx, self.global_rank)
        with self._diverged_at_sampling():
            logged = self.validator.validation_batch(
                self.model,
                self.teacher.initial,
                lambda model: self.sampler.sample(
                    model, prompts, self.device, synced=self.synced.enabled, seed=seed
                ),
                self.kl_terms,
                same_initial=self.teacher.options.kind == "frozen",
                texts=batch.get("texts") or [],
                synced=self.synced,
            )
        for name, metric in logged.items():
            self.log(name, metric, on_step=False, on_epoch=True, batch_size=len(prompts))

    def on_validation_epoch_end(self) -> None:
        for name, value in self.validator.epoch_values().items():
            self.log(f"val/tuning/{name}", value, batch_size=1)

    # -- checkpoints and export -----------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Store every process's sampling random state (Lightning does not save random states) and the
        EMA teacher's trainable weights (the copy is not a registered submodule); under FSDP2 the EMA's
        shards go with the model's into the distributed checkpoint, under ``EMA_KEY.<parameter>``.

        Args:
            checkpoint: the checkpoint being written, changed in place.
        """
        if is_sharded(self._trainer):
            checkpoint["state_dict"].update(self.teacher.sharded_state(self.model))
        else:
            ema = self.teacher.state_dict(self.model)
            if ema is not None:
                checkpoint[EMA_KEY] = ema
        world = self.trainer.world_size
        rng = self.sampler.state_dict(world, lambda t: self.all_gather(t.to(self.device)).cpu())
        if rng is not None:
            checkpoint[RNG_KEY] = rng

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the sampling random states and the EMA teacher: from ``EMA_KEY``, from the distributed
        checkpoint's shards (FSDP2), or from its ``EMA_KEY.*`` entries once consolidated into one file.

        Args:
            checkpoint: the checkpoint being read (its ``EMA_KEY.*`` entries are taken out of ``state_dict``).
        """
        self.sampler.load_state_dict(checkpoint.get(RNG_KEY))
        trainer = self._trainer
        state, prefix = checkpoint.get("state_dict") or {}, f"{EMA_KEY}."
        consolidated = {k[len(prefix) :]: state.pop(k) for k in list(state) if k.startswith(prefix)}
        if is_sharded(trainer) and trainer.ckpt_path is not None and Path(trainer.ckpt_path).is_dir():
            self.teacher.load_sharded_state(self.model, trainer.ckpt_path)
        else:
            self.teacher.load_state_dict(consolidated or checkpoint.get(EMA_KEY))

    def export_pretrained(self, out_dir: str | Path | None = None) -> Path:
        """``save_pretrained`` of the tuned model and its tokenizer, loadable by
        ``AutoModelForCausalLM.from_pretrained``. Call it on every process (sharded weights are gathered).

        Args:
            out_dir: where to write (default: ``export.dir``, else ``<log_dir>/hf_model``).

        Returns:
            The export directory.
        """
        return self.exporter.export(self.model, self.tokenizer, self._trainer, self._log_dir, out_dir)
