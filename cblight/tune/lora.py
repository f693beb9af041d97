"""Optional LoRA adapters for coherence tuning, through ``peft`` (``pip install 'cblight[lora]'``).

With ``lora.rank > 0`` (``LoraOptions``) only low-rank adapters on the chosen linear layers train (Hu et
al. 2022); the base weights stay frozen. The tuned model is exported twice (``cblight.tune.export``):
merged into plain weights (a normal Hugging Face model directory) and as the adapter alone
(``adapter_config.json`` + weights, which ``AutoModelForCausalLM.from_pretrained`` also loads, fetching
the base model named in it).

The initial model that the frozen teacher, the trust region and the collapse guard need is no copy: it is
the tuned model with its adapters switched off (``AdaptersDisabled``, peft's ``disable_adapter``), the base
weights shared, which is what lets a model that fits one device only once be tuned there. Under FSDP2
(``-c configs/fsdp.yaml``) LoRA is refused before anything loads: tune with it on one device or with DDP.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from cblight.errors import ConfigError
from cblight.option_types import NonNegativeInt, PositiveFloat, check_fields

__all__ = ["AdaptersDisabled", "LoraOptions", "apply_lora"]


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
    """A model wrapped by ``peft`` with LoRA adapters (Hu et al. 2022), its base weights frozen.

    Args:
        model: the causal LM to tune.
        options: the adapters' rank, scaling and target modules (no adapter dropout: tuning turns dropout
            off).

    Returns:
        The ``peft`` model, only its adapters trainable.

    Raises:
        ConfigError: ``options.target_modules`` names modules the model does not have.
    """
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


class AdaptersDisabled:
    """The base model of a LoRA model: every call (``model(...)``, ``generate``) runs under peft's
    ``disable_adapter``, so it computes the initial model with the tuned model's own base weights, no copy.
    Anything else (``config``, ``generation_config``, ``eval()``, ``to()``) is the LoRA model's.

    Args:
        peft_model: the model with LoRA adapters (``apply_lora``).
    """

    def __init__(self, peft_model: Any):
        object.__setattr__(self, "peft_model", peft_model)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.peft_model.disable_adapter():
            return self.peft_model(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """``generate`` of the base model, the adapters disabled.

        Args:
            *args: ``generate``'s positional arguments.
            **kwargs: ``generate``'s keyword arguments.

        Returns:
            What the model's ``generate`` returns (the token ids).
        """
        with self.peft_model.disable_adapter():
            return self.peft_model.generate(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.peft_model, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.peft_model, name, value)  # e.g. generation_config, hidden while sampling
