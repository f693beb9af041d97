"""``boosted_generate``: boosted decoding of a batch of prompts with any Hugging Face causal LM.

It validates the options, encodes and fits the prompts (``prepare_prompts``), and calls ``model.generate``:
with the fused ``custom_generate`` loop by default, with ``BoostingLogitsProcessor`` inside generate's own
beam search for ``num_beams > 1`` (or ``decoder="processor"``), and plainly when the boosting is the base
model (``alpha = 0``). Eval mode, no gradients, left padding with explicit position ids, and an optional
seed (pass a per-rank seed under DDP) that does not disturb the global random state.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Literal

import torch

from cblight.boosting import BoostForm
from cblight.generate.fused import FusedBoostedDecoding
from cblight.generate.inputs import PreparedPrompts, Prompts, prepare_prompts
from cblight.generate.processor import BoostingLogitsProcessor
from cblight.generate.spec import Boosting, BoostingError, Mode
from cblight.models import model_window

Decoder = Literal["fused", "processor"]


@dataclass
class BoostedGeneration:
    """What ``boosted_generate`` returns.

    ``sequences`` is generate's ``[N, width + T]`` tensor (left-padded prompts, then new tokens; ``N`` is
    prompts x ``num_return_sequences``, each prompt's rows together). ``tokens`` / ``texts`` are each row's
    new tokens up to (not including) the first EOS, and their decoded text. ``scores`` are generate's
    per-step processed scores when ``output_scores=True`` (boosted log-probabilities after any warpers).
    """

    sequences: torch.Tensor
    prompt_width: int
    tokens: list[list[int]]
    texts: list[str]
    scores: tuple[torch.Tensor, ...] | None
    prompts: PreparedPrompts

    @property
    def new_tokens(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_width :]


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
        raise BoostingError(f"{name} must be an integer >= {low}, got {value!r}")


def check_generate_kwargs(max_new_tokens: int, kwargs: dict[str, Any]) -> None:
    """Clear errors for decoding options generate would reject deep inside (or silently misuse)."""
    _check_int("max_new_tokens", max_new_tokens, 1)
    top_p = kwargs.get("top_p")
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, Real) or not (0.0 < float(top_p) <= 1.0)
    ):
        raise BoostingError(f"top_p must be in (0, 1], got {top_p!r}")
    temperature = kwargs.get("temperature")
    if temperature is not None and (
        not isinstance(temperature, Real) or not math.isfinite(float(temperature)) or float(temperature) <= 0
    ):
        raise BoostingError(f"temperature must be a finite number > 0, got {temperature!r}")
    for name, low in (("top_k", 0), ("num_beams", 1), ("num_return_sequences", 1)):
        if kwargs.get(name) is not None:
            _check_int(name, kwargs[name], low)


def _device(model: Any) -> torch.device:
    try:
        return model.get_input_embeddings().weight.device
    except AttributeError:
        return next(model.parameters()).device


@contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed torch for one call without touching the caller's random state."""
    if seed is None:
        yield
        return
    _check_int("seed", seed, 0)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(seed))
        yield


def _num_beams(model: Any, kwargs: dict[str, Any]) -> int:
    """The beam count generate will use: the keyword, else a passed config, else the checkpoint's."""
    if kwargs.get("num_beams") is not None:
        return int(kwargs["num_beams"])
    for config in (kwargs.get("generation_config"), getattr(model, "generation_config", None)):
        if getattr(config, "num_beams", None) is not None:
            return int(config.num_beams)
    return 1


def _eos_ids(model: Any, tokenizer: Any, kwargs: dict[str, Any]) -> set[int]:
    eos = kwargs.get("eos_token_id", getattr(model.generation_config, "eos_token_id", None))
    ids = set() if eos is None else {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])}
    if tokenizer.eos_token_id is not None and "eos_token_id" not in kwargs:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def boosted_generate(
    model: Any,
    tokenizer: Any,
    prompts: Prompts,
    *,
    mode: Mode = "last_k",
    k: int = 32,
    alpha: float = 0.0,
    form: BoostForm | None = None,
    marker: str = " TL;DR:",
    separator: str | None = None,
    boosting: Boosting | None = None,
    max_new_tokens: int = 64,
    attention_mask: torch.Tensor | None = None,
    seed: int | None = None,
    max_length: int | None = None,
    decoder: Decoder = "fused",
    **generate_kwargs: Any,
) -> BoostedGeneration:
    """Generate from ``prompts`` with coherence boosting (paper §4, appendix "GPT-2 summarization").

    ``mode``: ``"last_k"`` (``(1-alpha) log f_max + alpha log f_k``; WebText Table 2, Figure 1),
    ``"response"`` (``log f_max + alpha log f_short``, short = separator + response so far; dialog Table 3)
    or ``"marker"`` (same form, short = ``marker`` + summary so far; summarisation). ``form`` overrides the
    mode's form; ``boosting`` replaces ``mode``/``k``/``alpha`` by any list of experts.

    ``prompts`` are strings, token-id lists, or an ``input_ids`` tensor with its ``attention_mask``. They
    are cut to leave ``max_new_tokens`` of the model window (``max_length`` overrides the window): from the
    left, or, with a marker, just before it. ``generate_kwargs`` go to ``model.generate``
    (``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``num_return_sequences``, ``num_beams``,
    ``stopping_criteria``, ``streamer``, ``output_scores``, ...). ``decoder="processor"`` uses the
    logits-processor path even without beams (same results, one extra forward per step for the short
    contexts).
    """
    check_generate_kwargs(max_new_tokens, generate_kwargs)
    if decoder not in ("fused", "processor"):
        raise BoostingError(f"decoder must be 'fused' or 'processor', got {decoder!r}")
    if boosting is None:
        boosting = Boosting.from_mode(mode, k=k, alpha=alpha, form=form, marker=marker, separator=separator)
    elif alpha != 0.0:
        raise BoostingError("pass either boosting=... or mode/k/alpha, not both")
    device = _device(model)
    window = model_window(model, max_length)
    room = window - max_new_tokens
    if room < 1:
        raise BoostingError(f"max_new_tokens={max_new_tokens} leaves no room in the model window of {window}")
    prepared = prepare_prompts(
        tokenizer, prompts, boosting, room=room, attention_mask=attention_mask, device=device
    )

    kwargs = dict(generate_kwargs)
    streamer = kwargs.pop("streamer", None)
    if kwargs.get("pad_token_id") is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        kwargs["pad_token_id"] = pad
    kwargs.update(
        input_ids=prepared.input_ids,
        attention_mask=prepared.attention_mask,
        max_new_tokens=max_new_tokens,
        return_dict_in_generate=True,
        streamer=streamer,
    )
    beams = _num_beams(model, kwargs)
    if boosting.is_plain:
        pass
    elif beams > 1 or decoder == "processor":
        from transformers import LogitsProcessorList

        user = list(kwargs.pop("logits_processor", None) or [])
        kwargs["logits_processor"] = LogitsProcessorList(
            [BoostingLogitsProcessor(model, boosting, prepared), *user]
        )
    else:
        kwargs["custom_generate"] = FusedBoostedDecoding(boosting, prepared, streamer=streamer)

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), _seeded(seed, device):
            out = model.generate(**kwargs)
    finally:
        if was_training:
            model.train()

    eos = _eos_ids(model, tokenizer, generate_kwargs)
    width = prepared.width
    tokens: list[list[int]] = []
    for row in out.sequences[:, width:].tolist():
        cut = next((i for i, t in enumerate(row) if t in eos), len(row))
        tokens.append(row[:cut])
    texts = [tokenizer.decode(t, skip_special_tokens=True) for t in tokens]
    return BoostedGeneration(out.sequences, width, tokens, texts, out.scores, prepared)
