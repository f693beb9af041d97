"""``boosted_generate``: boosted decoding of a batch of prompts with any Hugging Face causal LM.

It validates the options, encodes and fits the prompts (``prepare_prompts``), and calls ``model.generate``:
with the fused ``custom_generate`` loop by default, with ``BoostingLogitsProcessor`` inside generate's own
beam search for ``num_beams > 1`` (or ``decoder="processor"``), and plainly when the boosting is the base
model (``alpha = 0``). Eval mode, no gradients, left padding with explicit position ids, and an optional
seed (pass a per-rank seed under DDP) that does not disturb the global random state.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from numbers import Integral
from typing import Any, Literal

import torch

from cblight.errors import BoostingError
from cblight.generate.fused import FusedBoostedDecoding
from cblight.generate.inputs import PreparedPrompts, Prompts, prepare_prompts
from cblight.generate.processor import BoostingLogitsProcessor
from cblight.models import model_window
from cblight.options import Boosting, Experts, Sampling

Decoder = Literal["fused", "processor"]


@dataclass
class BoostedGeneration:
    """What ``boosted_generate`` returns.

    ``sequences`` is generate's ``[N, width + T]`` tensor (left-padded prompts, then new tokens; ``N`` is
    prompts x ``num_return_sequences``, each prompt's rows together). ``tokens`` / ``texts`` are each row's
    new tokens up to (not including) the first EOS, and their decoded text. ``scores`` are generate's
    per-step processed scores when ``output_scores=True`` (boosted log-probabilities after any warpers).
    ``alphas`` are, with an adaptive rule and no beam search, each row's alpha at each of its ``tokens``
    (docs/adaptive.md); ``None`` otherwise.
    """

    sequences: torch.Tensor
    prompt_width: int
    tokens: list[list[int]]
    texts: list[str]
    scores: tuple[torch.Tensor, ...] | None
    prompts: PreparedPrompts
    alphas: list[list[float]] | None = None

    @property
    def new_tokens(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_width :]


# The six boosting options are fields of ``Boosting``, the sampling ones of ``Sampling``: given loose, they
# are refused with the fix rather than passed to ``generate`` (which would ignore or misread them).
_BOOSTING_KEYS = tuple(f.name for f in fields(Boosting))


def _sampling(sampling: Sampling | None, kwargs: dict[str, Any]) -> Sampling:
    loose = [k for k in _BOOSTING_KEYS if k in kwargs]
    if loose:
        raise BoostingError(
            f"boosted_generate takes boosting=Boosting({loose[0]}=...), not {loose[0]}= on its own"
        )
    given = [k for k in (*Sampling.GENERATE_KEYS, "seed") if k in kwargs]
    if sampling is not None and given:
        raise BoostingError(f"pass {given[0]} inside sampling=Sampling(...) or on its own, not both")
    if sampling is None:
        seed = kwargs.pop("seed", None)
        sampling = Sampling.from_generate_kwargs(kwargs)
        if seed is not None:
            sampling = replace(sampling, seed=seed)
    if not isinstance(sampling, Sampling):
        raise BoostingError(f"sampling must be a Sampling, got {type(sampling).__name__}")
    for name, low in (("num_return_sequences", 1),):
        value = kwargs.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, Integral) or value < low):
            raise BoostingError(f"{name} must be an integer >= {low}, got {value!r}")
    return sampling


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
    boosting: Boosting | Experts | None = None,
    sampling: Sampling | None = None,
    *,
    max_new_tokens: int = 64,
    attention_mask: torch.Tensor | None = None,
    max_length: int | None = None,
    decoder: Decoder = "fused",
    **generate_kwargs: Any,
) -> BoostedGeneration:
    """Generate from ``prompts`` with coherence boosting (paper §4, appendix "GPT-2 summarization").

    ``boosting`` says what to mix (``cblight.options``): ``Boosting(mode="last_k", k, alpha)`` is
    ``(1-alpha) log f_max + alpha log f_k`` (WebText Table 2, Figure 1), ``mode="response"`` is
    ``log f_max + alpha log f_short`` with the separator and the response so far (dialog Table 3),
    ``mode="marker"`` the same after a marker (summaries); ``Experts`` mixes any list of short contexts;
    ``None`` (or ``alpha = 0``) is the base model. ``sampling`` says how to draw from the mix
    (``Sampling(do_sample=True, top_p=0.95, seed=0)``; temperature, top-k and top-p act after mixing); its
    options may also come as ``generate``'s own keywords (``do_sample=True, top_p=0.95``), not both.

    ``prompts`` are strings, token-id lists, or an ``input_ids`` tensor with its ``attention_mask``. They
    are cut to leave ``max_new_tokens`` of the model window (``max_length`` overrides the window): from the
    left, or, with a marker, just before it. Other ``generate_kwargs`` go to ``model.generate``
    (``num_return_sequences``, ``stopping_criteria``, ``streamer``, ``output_scores``, ...).
    ``decoder="processor"`` uses the logits-processor path even without beams (same results, one extra
    forward per step for the short contexts).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, Integral) or max_new_tokens < 1:
        raise BoostingError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if decoder not in ("fused", "processor"):
        raise BoostingError(f"decoder must be 'fused' or 'processor', got {decoder!r}")
    sampling = _sampling(sampling, generate_kwargs)
    device = _device(model)
    window = model_window(model, max_length)
    room = window - max_new_tokens
    if room < 1:
        raise BoostingError(f"max_new_tokens={max_new_tokens} leaves no room in the model window of {window}")
    prepared = prepare_prompts(
        tokenizer,
        prompts,
        Boosting() if boosting is None else boosting,
        room=room,
        attention_mask=attention_mask,
        device=device,
    )
    experts = prepared.experts

    kwargs = {**generate_kwargs, **sampling.generate_kwargs()}
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
    boosted: BoostingLogitsProcessor | FusedBoostedDecoding | None = None
    if experts.is_plain:
        pass
    elif beams > 1 or decoder == "processor":
        from transformers import LogitsProcessorList

        user = list(kwargs.pop("logits_processor", None) or [])
        boosted = BoostingLogitsProcessor(model, prepared)
        kwargs["logits_processor"] = LogitsProcessorList([boosted, *user])
    else:
        boosted = kwargs["custom_generate"] = FusedBoostedDecoding(prepared, streamer=streamer)

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), _seeded(sampling.seed, device):
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
    alphas = None
    if boosted is not None and experts.adaptive is not None and beams == 1 and boosted.alphas:
        steps = torch.stack(boosted.alphas, 1).tolist()  # [N, steps]: row r's alpha at each step
        alphas = [row[: len(t)] for row, t in zip(steps, tokens)]
    return BoostedGeneration(out.sequences, width, tokens, texts, out.scores, prepared, alphas)
