"""Coherence boosting (Malkin, Wang & Jojic, ACL 2022) as a transformers ``custom_generate`` method.

    model.generate(**inputs, custom_generate="<this repo or a local checkout>", trust_remote_code=True,
                   tokenizer=tokenizer, boost_mode="last_k", boost_k=8, boost_alpha=-0.5, max_new_tokens=40)

This file only adapts ``model.generate``'s arguments to ``cblight.generate.boosted_generate`` (installed
from the ``cblight`` package, see requirements.txt); the decoding itself is cblight's. The boosting is
``cblight.options.Boosting``, given whole (``boosting=Boosting(mode="last_k", k=8, alpha=-0.5)``) or field by
field with a ``boost_`` prefix: ``boost_mode`` (``"last_k"``: the last ``boost_k`` tokens, paper §4.1,
Table 2; ``"response"``: the turn separator plus the response so far, dialog, Table 3; ``"marker"``:
``boost_marker`` plus the text so far, summarisation), ``boost_alpha`` (0, the default, is the base model;
usually negative), ``boost_k`` (default 32), ``boost_form`` (``"generation"``: ``(1-alpha) log f + alpha
log f_short``, the default of ``last_k``; ``"next_token"``: ``log f + alpha log f_short``, the default of the
others), ``boost_marker`` (default ``" TL;DR:"``), ``boost_separator`` (default: the tokenizer's EOS) and
``boost_adaptive`` (``"auto"``, ``"jsd"``, ``"jsdist"`` or ``"cocoa"``: alpha set at every token by a
label-free rule, cblight's docs/adaptive.md).
``tokenizer`` is required (BOS handling, separators and markers come from it).

Everything else (``max_new_tokens``, ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``num_beams``,
``num_return_sequences``, ``stopping_criteria``, ``logits_processor``, ``streamer``,
``return_dict_in_generate``, ``output_scores``, ...) keeps its ``generate`` meaning; temperature, top-k and
top-p act on the boosted distribution. The return value is ``generate``'s: the ``[N, prompt + new]`` token
tensor, or a ``GenerateDecoderOnlyOutput`` (``sequences``, ``scores``) with ``return_dict_in_generate=True``.
Prompts are re-padded on the left, so ``sequences`` starts with the prompts as cblight pads them.
"""

from __future__ import annotations

from typing import Any

import torch

from cblight.errors import BoostingError
from cblight.generate import boosted_generate
from cblight.options import Boosting

_UNSUPPORTED = ("assistant_model", "negative_prompt_ids", "negative_prompt_attention_mask")


def _max_new_tokens(model: Any, width: int, kwargs: dict[str, Any]) -> int:
    """``generate``'s rule: ``max_new_tokens``, else ``max_length`` minus the prompt, from the call, the
    passed generation config or the model's."""
    configs = [kwargs.get("generation_config"), model.generation_config]
    if kwargs.get("max_new_tokens") is not None:
        return int(kwargs.pop("max_new_tokens"))
    if kwargs.get("max_length") is not None:
        return int(kwargs.pop("max_length")) - width
    for config in configs:
        if config is not None and getattr(config, "max_new_tokens", None) is not None:
            return int(config.max_new_tokens)
    for config in configs:
        if config is not None and getattr(config, "max_length", None) is not None:
            return int(config.max_length) - width
    return 20 - width  # generate's own default max_length


def generate(
    model: Any,
    inputs: torch.Tensor | None = None,
    *,
    boosting: Boosting | None = None,
    tokenizer: Any = None,
    **kwargs: Any,
) -> Any:
    """Boosted decoding with ``model.generate``'s interface (see the module docstring)."""
    loose = Boosting.from_prefixed(kwargs)
    if boosting is not None and loose is not None:
        raise BoostingError("pass boosting=Boosting(...) or boost_* options, not both")
    boosting = boosting or loose or Boosting()
    if tokenizer is None:
        raise BoostingError(
            "cblight's custom_generate needs the tokenizer: model.generate(..., tokenizer=tok)"
        )
    for name in _UNSUPPORTED:
        if kwargs.pop(name, None) is not None:
            raise BoostingError(f"{name} is not supported with coherence boosting (cblight custom_generate)")
    input_ids = inputs if inputs is not None else kwargs.pop("input_ids", None)
    if input_ids is None:
        raise BoostingError("cblight's custom_generate needs input_ids (or inputs)")
    attention_mask = kwargs.pop("attention_mask", None)
    if kwargs.get("synced_gpus") is None:
        kwargs.pop("synced_gpus", None)
    for name in (
        "logits_processor",
        "stopping_criteria",
        "streamer",
        "generation_config",
        "prefix_allowed_tokens_fn",
    ):
        if kwargs.get(name) is None:
            kwargs.pop(name, None)
    want_dict = kwargs.pop("return_dict_in_generate", None)
    if want_dict is None:
        config = kwargs.get("generation_config") or model.generation_config
        want_dict = bool(getattr(config, "return_dict_in_generate", False))
    width = int(input_ids.shape[1])
    max_new_tokens = _max_new_tokens(model, width, kwargs)
    if max_new_tokens < 1:
        raise BoostingError(
            f"max_length {width + max_new_tokens} leaves no new tokens after the {width}-token prompts; "
            "pass max_new_tokens"
        )
    out = boosted_generate(
        model,
        tokenizer,
        input_ids,
        boosting,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        **kwargs,
    )
    if not want_dict:
        return out.sequences
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    return GenerateDecoderOnlyOutput(sequences=out.sequences, scores=out.scores)
