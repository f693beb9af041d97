"""Sampling of coherence tuning's sequences with a random state per process that checkpoints carry
(Lightning does not save random states), so that a resumed run samples exactly what an uninterrupted one
would have; a mixin of ``cblight.tune.coherence_tuning.CoherenceTuning``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cblight.batching import left_pad
from cblight.tune.loss import Sampled, TuningConfigError, sample_sequences

log = logging.getLogger(__name__)

RNG_KEY = "cblight_sampling_rng"

__all__ = ["RNG_KEY", "SampledBatches", "seed_of"]


def seed_of(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


class SampledBatches:
    """Needs ``model``, ``hparams`` (``seed``, ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``),
    ``prompt_ids``, ``pad_id``, ``eos_id`` and the LightningModule's ``device``/``global_rank``/``trainer``.

    Process ``r`` starts from ``seed + r``; every checkpoint stores every process's state.
    """

    _rng: dict[str, torch.Tensor] | None = None
    _loaded_rng: dict[str, Any] | None = None

    def _devices(self) -> list[torch.device]:
        return [self.device] if self.device.type == "cuda" else []

    def _fresh_rng(self, seed: int) -> dict[str, torch.Tensor]:
        with torch.random.fork_rng(devices=self._devices()):
            torch.manual_seed(seed)
            state = {"cpu": torch.get_rng_state()}
            if self.device.type == "cuda":
                state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def restore_sampling_state(self) -> None:
        """At the start of training: this process's state from the checkpoint, or a fresh one."""
        rank, world = self.global_rank, self.trainer.world_size
        loaded = self._loaded_rng
        if loaded is not None and loaded.get("world_size") == world:
            self._rng = {key: rows[rank].clone() for key, rows in loaded.items() if key != "world_size"}
            if self.device.type == "cuda" and "cuda" not in self._rng:
                self._rng["cuda"] = self._fresh_rng(seed_of(self.hparams.seed, rank, self.global_step))[
                    "cuda"
                ]
            if self.device.type != "cuda":
                self._rng.pop("cuda", None)
        else:
            if loaded is not None:
                log.warning(
                    "the checkpoint's sampling states are for %s processes, this run has %s: reseeding",
                    loaded.get("world_size"),
                    world,
                )
            seed = (
                self.hparams.seed + rank
                if loaded is None
                else seed_of(self.hparams.seed, rank, self.global_step)
            )
            self._rng = self._fresh_rng(seed)
        self._loaded_rng = None

    def encode_prompts(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        if not prompts:
            raise TuningConfigError("the prompt data module yielded an empty batch")
        return left_pad([self.prompt_ids(p) for p in prompts], self.pad_id, self.device)

    def _synced(self) -> bool:
        """Sharded strategies (FSDP, DeepSpeed) need every process to run the same forward passes."""
        from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

        trainer = self._trainer
        if trainer is None or trainer.world_size == 1:
            return False
        strategy = trainer.strategy
        replicated = isinstance(strategy, (DDPStrategy, SingleDeviceStrategy))
        return not replicated or "DeepSpeed" in type(strategy).__name__  # DeepSpeed subclasses DDP

    def _generate(self, prompts: Sequence[str]) -> Sampled:
        ids, mask = self.encode_prompts(prompts)
        hp = self.hparams
        return sample_sequences(
            self.model,
            ids,
            mask,
            max_new_tokens=hp.max_new_tokens,
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            temperature=hp.temperature,
            top_p=hp.top_p,
            top_k=hp.top_k,
            synced_gpus=self._synced(),
        )

    def sample(self, batch: dict[str, Any]) -> Sampled:
        """Sample the tuning sequences of a batch, advancing this process's sampling random state."""
        if self._rng is None:  # outside fit (e.g. a direct call): start from the seed
            self._rng = self._fresh_rng(self.hparams.seed + self.global_rank)
        with torch.random.fork_rng(devices=self._devices()):
            torch.set_rng_state(self._rng["cpu"])
            if "cuda" in self._rng:
                torch.cuda.set_rng_state(self._rng["cuda"], self.device)
            sampled = self._generate(batch["prompts"])
            self._rng = {"cpu": torch.get_rng_state()}
            if self.device.type == "cuda":
                self._rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return sampled

    def sample_fixed(self, batch: dict[str, Any], seed: int) -> Sampled:
        """Sample with a given seed, leaving the tuning random state alone (validation)."""
        with torch.random.fork_rng(devices=self._devices()):
            torch.manual_seed(seed)
            return self._generate(batch["prompts"])

    def save_sampling_state(self, checkpoint: dict[str, Any]) -> None:
        """Every process's state into ``checkpoint`` (an all-gather that every process joins)."""
        if self._rng is None:
            return
        world = self.trainer.world_size if self._trainer is not None else 1
        entry: dict[str, Any] = {"world_size": world}
        for key, state in self._rng.items():
            if world > 1:
                gathered = self.all_gather(state.to(self.device)).cpu()
            else:
                gathered = state.unsqueeze(0)
            entry[key] = [row.clone() for row in gathered]
        checkpoint[RNG_KEY] = entry

    def load_sampling_state(self, checkpoint: dict[str, Any]) -> None:
        self._loaded_rng = checkpoint.get(RNG_KEY)
