"""Optional LoRA adapters for coherence tuning, through ``peft`` (``pip install 'cblight[lora]'``).

With ``lora.rank > 0`` (``LoraOptions``) only low-rank adapters on the chosen linear layers train (Hu et
al. 2022); the base weights stay frozen. The tuned model is exported twice (``cblight.tune.export``):
merged into plain weights (a normal Hugging Face model directory) and as the adapter alone
(``adapter_config.json`` + weights, which ``AutoModelForCausalLM.from_pretrained`` also loads, fetching
the base model named in it).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from cblight.errors import ConfigError
from cblight.option_types import NonNegativeInt, PositiveFloat, check_fields

__all__ = ["LoraOptions", "apply_lora"]


@dataclass(frozen=True)
class LoraOptions:
    """LoRA adapters through ``peft`` instead of full fine-tuning.

    Args:
        rank: the adapters' rank (0: no LoRA, full fine-tuning); the export then holds the merged model and
            ``adapter/``.
        alpha: LoRA's scaling numerator (``alpha / rank`` scales the adapters' output).
        target_modules: the modules that get adapters (``all-linear``: every linear layer but the output).
    """

    rank: NonNegativeInt = 0
    alpha: PositiveFloat = 16.0
    target_modules: str | list[str] = "all-linear"

    def __post_init__(self) -> None:
        check_fields(self)
        if self.rank and importlib.util.find_spec("peft") is None:
            raise ConfigError(
                f"lora.rank = {self.rank} asks for LoRA, which needs the peft package: pip install 'cblight[lora]' "
                "(or set lora.rank: 0 for full fine-tuning)"
            )
        if self.rank and not self.target_modules:
            raise ConfigError("lora.target_modules must name at least one module (or 'all-linear')")


def apply_lora(model: Any, options: LoraOptions) -> Any:
    """``model`` wrapped by ``peft`` with LoRA adapters (no adapter dropout: tuning turns dropout off)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=options.rank,
        lora_alpha=options.alpha,
        lora_dropout=0.0,
        target_modules=options.target_modules,
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, config)
    except ValueError as err:  # e.g. target modules that the model does not have
        raise ConfigError(f"lora.target_modules {options.target_modules!r}: {err}") from err
