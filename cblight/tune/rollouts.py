"""The tuning sequences (paper appendix "From coherence boosting to coherence tuning": "sample sequences
from the current model"): prompts encoded and cut to fit, continuations sampled with ``model.generate``,
and the per-process random state that checkpoints carry.

``RolloutSampler`` is the sampler of ``cblight.tune.coherence_tuning.CoherenceTuning``. Process ``r`` starts
from ``sampling.seed + r``; every checkpoint stores every process's state (Lightning does not save random
states), so that a resumed run samples exactly what an uninterrupted one would have. ``sample_sequences``
is the sampling itself, usable without Lightning.

How the tokens are decoded is ``RolloutOptions``: transformers' dynamic KV cache, or its static cache with
a decode step compiled with ``torch.compile`` (CUDA graphs on a GPU), the lever where sampling is latency-bound (a small
model on a GPU: docs/tuning.md, "Speed and memory"). What is sampled is the same either way.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from cblight.batching import eval_mode, left_pad, positions_from_mask
from cblight.errors import ConfigError
from cblight.option_types import check_fields
from cblight.options import Sampling
from cblight.scoring import Encoder
from cblight.tune.loss import Sampled, sampled_token_mask

log = logging.getLogger(__name__)

#: The checkpoint key under which every process's sampling random state is saved.
RNG_KEY = "cblight_sampling_rng"
__all__ = [
    "RNG_KEY",
    "RolloutOptions",
    "RolloutSampler",
    "sample_sequences",
    "seed_of",
]


@dataclass(frozen=True)
class RolloutOptions:
    """How the tuning sequences are decoded (``sampling`` says what is drawn).

    Args:
        cache: ``dynamic`` (transformers' growing KV cache), ``static`` (a fixed-size cache, allocated once
            for ``max_prompt_tokens + max_new_tokens``, the shape that a compiled decode step needs) or
            ``auto``: static on CUDA where the model supports compilation (transformers'
            ``_can_compile_fullgraph``) and the model is not sharded, dynamic elsewhere.
        compile: ``torch.compile`` the decode step (with the static cache only; ``reduce-overhead``, i.e. CUDA
            graphs, on a GPU); ``None``: where the static cache is used on CUDA. On CPU it does not pay for
            itself within the paper's 32 steps (docs/tuning.md), so ``auto`` leaves it off there.
    """

    cache: Literal["auto", "dynamic", "static"] = "auto"
    compile: bool | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        if self.compile and self.cache == "dynamic":
            raise ConfigError(
                "rollouts.compile: true needs rollouts.cache: static or auto (a compiled decode step needs the "
                "static cache's fixed shapes)"
            )

    def _check_compilable(self, model_class: type) -> None:
        """Refuse a model class transformers cannot compile (its ``_can_compile_fullgraph``, a class
        attribute: checked from the config alone, before any weights) for ``cache: static`` or
        ``compile: true``, which the caller asked for.

        Args:
            model_class: the transformers model class.

        Raises:
            ConfigError: the static cache or compilation was asked for and the class does not support it.
        """
        if not getattr(model_class, "_can_compile_fullgraph", False):
            raise ConfigError(
                f"rollouts.cache: static / rollouts.compile: {model_class.__name__} does not support "
                "transformers' static cache and compiled decoding; use rollouts.cache: dynamic or auto"
            )

    def check_config(self, config: Any) -> None:
        """``_check_compilable`` for the model class of a checkpoint's config, before any weights load (a model
        of remote code is checked once it loads).

        Args:
            config: the checkpoint's transformers config.

        Raises:
            ConfigError: the static cache or compilation was asked for and the model class does not support
                it.
        """
        if self.cache == "static" or self.compile:
            from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

            if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
                self._check_compilable(MODEL_FOR_CAUSAL_LM_MAPPING[type(config)])

    def resolve(self, model: Any, device: torch.device, sharded: bool = False) -> tuple[bool, bool]:
        """The decoding these options give for a model on a device.

        Args:
            model: the loaded model.
            device: the device it samples on.
            sharded: whether the model is sharded over processes (``auto`` then keeps the dynamic cache).

        Returns:
            ``(static cache, compiled)``; a model that cannot be compiled gets the dynamic cache under
            ``auto``.

        Raises:
            ConfigError: the static cache or compilation was asked for by name and the model does not
                support it.
        """
        if self.cache == "static" or self.compile:
            self._check_compilable(type(model))
            return True, bool(self.compile)
        if self.cache == "dynamic":
            return False, False
        static = getattr(model, "_can_compile_fullgraph", False) and device.type == "cuda" and not sharded
        return static, static if self.compile is None else bool(self.compile) and static


def seed_of(*parts: int) -> int:
    """A 32-bit seed mixed from integers by numpy's ``SeedSequence``.

    Args:
        *parts: the integers mixed (base seed, process rank, step).

    Returns:
        The seed, in [0, 2^32).
    """
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


@torch.no_grad()
def sample_sequences(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None,
    pad_token_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    synced_gpus: bool = False,
    static_cache_len: int | None = None,
    compile: bool = False,
) -> Sampled:
    """Sample continuations of left-padded prompts with ``model.generate``: the tuning sequences of the paper's
    appendix ("sample sequences from the current model"). Eval mode (no dropout), no gradient, explicit
    position ids, none of the model's own generation config. The caller owns the random state (see
    ``RolloutSampler``).

    Args:
        model: the causal LM.
        prompt_ids: ``[B, P]`` left-padded prompt token ids.
        prompt_mask: ``[B, P]`` attention mask of the prompts.
        max_new_tokens: tokens sampled after each prompt.
        eos_token_id: the end-of-sequence id(s) where a row stops; ``None``: the model's own.
        pad_token_id: the id that fills a row after it stops.
        temperature: the sampling temperature.
        top_p: nucleus sampling's probability mass (1.0: off).
        top_k: sample from the ``k`` most likely tokens only (0: off).
        synced_gpus: keep every process stepping until all are done, which sharded models (FSDP) need.
        static_cache_len: decode with transformers' static cache of that many positions (at least the
            prompt width + ``max_new_tokens``; one size for every call, so the cache and a compiled step are
            reused); ``None``: the dynamic cache.
        compile: with the static cache, ``torch.compile`` the decode step (CUDA graphs on a GPU).

    Returns:
        The prompts and samples, with their attention mask and the mask of sampled tokens up to each row's
        first EOS.
    """
    from transformers import GenerationConfig

    if eos_token_id is None:
        eos_token_id = getattr(model.generation_config, "eos_token_id", None)
    cache: dict[str, Any] = {"disable_compile": True}
    if static_cache_len is not None:
        cache = {
            "cache_implementation": "static",
            "max_cache_len": max(static_cache_len, prompt_ids.shape[1] + max_new_tokens),
            "disable_compile": not compile,
        }
        if compile:
            cache["compile_config"] = compile_config(prompt_ids.device.type)
    config = GenerationConfig(
        do_sample=True,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        **cache,
    )
    # generate() fills every option we leave unset from the model's own generation config (a chat model's
    # temperature 0.6 / top_p 0.9 / repetition penalty...): hide it, so the samples come from f itself.
    own_config = model.generation_config
    model.generation_config = GenerationConfig(bos_token_id=own_config.bos_token_id)
    try:
        with eval_mode(model):
            sequences = model.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                position_ids=positions_from_mask(prompt_mask),
                generation_config=config,
                synced_gpus=synced_gpus,
            )
    finally:
        model.generation_config = own_config
    width = prompt_ids.shape[1]
    new = sequences.shape[1] - width
    mask = torch.cat([prompt_mask, prompt_mask.new_ones((prompt_mask.shape[0], new))], dim=1)
    return Sampled(sequences, mask, width, sampled_token_mask(sequences, width, eos_token_id))


@functools.cache
def compile_config(kind: str) -> Any:
    """transformers' ``CompileConfig`` of the decode step, one object per device type (``generate`` keeps its
    compiled call while the config compares equal).

    Args:
        kind: the device type (``cuda``, ``cpu``, ...).

    Returns:
        CUDA graphs (``reduce-overhead``) on a GPU; on other devices inductor's default mode, which
        ``generate`` only uses when told to compile everywhere.
    """
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=False, mode="reduce-overhead" if kind == "cuda" else "default")
    config._compile_all_devices = kind != "cuda"
    return config


def _devices(device: torch.device) -> list[torch.device]:
    return [device] if device.type == "cuda" else []


def _rng_state(device: torch.device, seed: int | None = None) -> dict[str, torch.Tensor]:
    """The torch random state of the CPU and ``device`` (with ``seed``: a fresh one from it); the global
    state is left as it was."""
    with torch.random.fork_rng(devices=_devices(device)):
        if seed is not None:
            torch.manual_seed(seed)
        state = {"cpu": torch.get_rng_state()}
        if device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(device)
    return state


class RolloutSampler:
    """Encodes and cuts the prompts, samples the tuning sequences from the model it is given, and owns this
    process's sampling random state (saved in and restored from checkpoints).

    Args:
        encoder: the tokenizer's ``Encoder`` (prompts keep its special prefix, BOS, when they are cut; its
            tokenizer's padding and end-of-sequence ids are the samples').
        sampling: how tokens are drawn (``do_sample`` true; unset ``temperature`` / ``top_p`` / ``top_k`` /
            ``seed`` mean 1.0 / 1.0 / 0 / 0: plain sampling from ``f``, never the model's own generation
            config).
        max_new_tokens: tokens sampled after each prompt.
        max_prompt_tokens: prompts are cut from the left to this many tokens, and to the room the model
            window leaves after ``max_new_tokens``.
        window: the model window.
        rollouts: the decoding machinery (KV cache, compiled decode step), resolved for the model and device
            at the first call.
    """

    def __init__(
        self,
        encoder: Encoder,
        sampling: Sampling,
        max_new_tokens: int,
        max_prompt_tokens: int,
        window: int,
        rollouts: RolloutOptions = RolloutOptions(),
    ):
        if max_new_tokens + len(encoder.prefix) + 1 > window:
            raise ConfigError(
                f"max_new_tokens = {max_new_tokens} does not fit the model window of {window}; lower it"
            )
        self.encoder = encoder
        self.max_new_tokens = max_new_tokens
        self.max_prompt_tokens = min(max_prompt_tokens, window - max_new_tokens)
        self.temperature = 1.0 if sampling.temperature is None else sampling.temperature
        self.top_p = 1.0 if sampling.top_p is None else sampling.top_p
        self.top_k = 0 if sampling.top_k is None else sampling.top_k
        self.seed = 0 if sampling.seed is None else sampling.seed
        self.pad_id = int(encoder.tokenizer.pad_token_id)
        self.eos_id = encoder.tokenizer.eos_token_id
        self._rng: dict[str, torch.Tensor] | None = None
        self._loaded_rng: dict[str, Any] | None = None
        self.rollouts = rollouts
        self.decoding: tuple[bool, bool] | None = None  # (static cache, compiled), once resolved

    # -- prompts ------------------------------------------------------------------------------------------
    def prompt_ids(self, text: str) -> list[int]:
        """The token ids of a prompt, cut from the left to ``max_prompt_tokens``, its special prefix kept.

        Args:
            text: the prompt.

        Returns:
            Its token ids (BOS/EOS alone for an empty prompt).
        """
        ids, prefix = self.encoder.context(text), self.encoder.prefix
        if len(ids) <= self.max_prompt_tokens:
            return ids
        return prefix + ids[len(ids) - (self.max_prompt_tokens - len(prefix)) :]

    def check_prompts(self, prompts: Sequence[str], k: int) -> None:
        """Refuse prompts with which no sampled sequence can be longer than ``k`` (``f_k`` would equal ``f_max``
        everywhere and the KL would be zero). Stops at the first prompt that is long enough, so large prompt
        files cost little.

        Args:
            prompts: the training prompts.
            k: the teacher's short context (``boosting.k``).

        Raises:
            ConfigError: no prompt is long enough.
        """
        # the last sampled token of a prompt has ``prompt - prefix + max_new_tokens - 1`` content tokens before
        # it; boosting changes nothing unless that exceeds k (f_k == f_max otherwise)
        new, longest, seen = self.max_new_tokens, 0, 0
        for prompt in dict.fromkeys(prompts):
            longest = max(longest, len(self.prompt_ids(prompt)))
            seen = longest - len(self.encoder.prefix) + new - 1
            if seen > k:
                return
        raise ConfigError(
            f"no sampled position can see more than {seen} tokens "
            f"of context (longest prompt {longest} tokens + max_new_tokens {new}), which is not more than "
            f"boosting.k = {k}: f_k would equal f_max everywhere and the KL would be identically zero. "
            "Use longer prompts, more max_new_tokens or a smaller boosting.k."
        )

    # -- sampling -----------------------------------------------------------------------------------------
    def _generate(self, model: Any, prompts: Sequence[str], device: torch.device, synced: bool) -> Sampled:
        ids, mask = left_pad([self.prompt_ids(p) for p in prompts], self.pad_id, device)
        if self.decoding is None:  # (static cache, compiled) for this run, logged once
            self.decoding = self.rollouts.resolve(model, torch.device(device), synced)
            log.info(
                "rollouts: %s KV cache%s",
                "static" if self.decoding[0] else "dynamic",
                ", compiled decode step" if self.decoding[1] else "",
            )
        static, compiled = self.decoding
        return sample_sequences(
            model,
            ids,
            mask,
            max_new_tokens=self.max_new_tokens,
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            synced_gpus=synced,
            static_cache_len=self.max_prompt_tokens + self.max_new_tokens if static else None,
            compile=compiled,
        )

    def sample(
        self,
        model: Any,
        prompts: Sequence[str],
        device: torch.device | str = "cpu",
        rank: int = 0,
        synced: bool = False,
        seed: int | None = None,
    ) -> Sampled:
        """Sample the tuning sequences of some prompts, advancing this process's random state.

        Args:
            model: the model sampled from.
            prompts: the batch's prompts.
            device: where the model is.
            rank: this process's rank, which seeds the state when sampling starts outside ``fit``.
            synced: the model is sharded over processes (every process steps until all are done).
            seed: sample from this seed instead (validation), leaving the tuning random state alone.

        Returns:
            The sampled batch.
        """
        device = torch.device(device)
        if self._rng is None and seed is None:  # outside fit (e.g. a direct call): start from the seed
            self._rng = _rng_state(device, self.seed + rank)
        with torch.random.fork_rng(devices=_devices(device)):
            if seed is not None:
                torch.manual_seed(seed)
                return self._generate(model, prompts, device, synced)
            torch.set_rng_state(self._rng["cpu"])
            if "cuda" in self._rng:
                torch.cuda.set_rng_state(self._rng["cuda"], device)
            sampled = self._generate(model, prompts, device, synced)
            self._rng = _rng_state(device)
        return sampled

    # -- random state in checkpoints ---------------------------------------------------------------------
    def start(self, rank: int, world_size: int, global_step: int, device: torch.device) -> None:
        """At the start of training: this process's random state from the checkpoint, or a fresh one (reseeded
        when the checkpoint was written by another number of processes).

        Args:
            rank: this process's rank.
            world_size: the number of processes.
            global_step: the step training starts from (mixed into a fresh seed when resuming).
            device: the device this process samples on.
        """
        loaded = self._loaded_rng
        if loaded is not None and loaded.get("world_size") == world_size:
            self._rng = {key: rows[rank].clone() for key, rows in loaded.items() if key != "world_size"}
            if device.type == "cuda" and "cuda" not in self._rng:
                self._rng["cuda"] = _rng_state(device, seed_of(self.seed, rank, global_step))["cuda"]
            if device.type != "cuda":
                self._rng.pop("cuda", None)
        else:
            if loaded is not None:
                log.warning(
                    "the checkpoint's sampling states are for %s processes, this run has %s: reseeding",
                    loaded.get("world_size"),
                    world_size,
                )
            seed = self.seed + rank if loaded is None else seed_of(self.seed, rank, global_step)
            self._rng = _rng_state(device, seed)
        self._loaded_rng = None

    def state_dict(
        self, world_size: int, all_gather: Callable[[torch.Tensor], torch.Tensor]
    ) -> dict[str, Any] | None:
        """Every process's random state, for ``checkpoint[RNG_KEY]``.

        Args:
            world_size: the number of processes.
            all_gather: a collective that every process joins, stacking one tensor per process.

        Returns:
            The states by generator (``cpu``, ``cuda``), one per process, and ``world_size``; ``None`` before
            any sampling.
        """
        if self._rng is None:
            return None
        entry: dict[str, Any] = {"world_size": world_size}
        for key, state in self._rng.items():
            gathered = all_gather(state) if world_size > 1 else state.unsqueeze(0)
            entry[key] = [row.clone() for row in gathered]
        return entry

    def load_state_dict(self, entry: dict[str, Any] | None) -> None:
        """Keep a checkpoint's random states until ``start`` picks this process's.

        Args:
            entry: the checkpoint's ``RNG_KEY`` entry (``state_dict``'s result), or ``None``.
        """
        self._loaded_rng = entry
