"""Optional LoRA adapters for coherence tuning, through ``peft`` (``pip install 'cblight[lora]'``).

With ``lora_rank > 0`` only low-rank adapters on the chosen linear layers train (Hu et al. 2022); the
base weights stay frozen. The tuned model is exported twice: merged into plain weights (a normal Hugging
Face model directory) and as the adapter alone (``adapter_config.json`` + weights, which
``AutoModelForCausalLM.from_pretrained`` also loads, fetching the base model named in it).
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

from cblight.errors import CblightError

__all__ = ["LoraConfigError", "apply_lora", "check_lora_options", "is_peft_model", "save_lora_exports"]


class LoraConfigError(CblightError):
    """A LoRA option that cannot work (the error names the option)."""


def check_lora_options(rank: int, alpha: float, target_modules: str | list[str]) -> None:
    """Refuse bad LoRA options, and LoRA without ``peft``, before anything is loaded."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise LoraConfigError(
            f"lora_rank must be 0 (no LoRA: full fine-tuning) or a positive integer, got {rank!r}"
        )
    if rank == 0:
        return
    if importlib.util.find_spec("peft") is None:
        raise LoraConfigError(
            f"lora_rank = {rank} asks for LoRA, which needs the peft package: pip install 'cblight[lora]' "
            "(or set lora_rank: 0 for full fine-tuning)"
        )
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise LoraConfigError(f"lora_alpha must be a positive number, got {alpha!r}")
    if not target_modules:
        raise LoraConfigError("lora_target_modules must name at least one module (or 'all-linear')")


def apply_lora(model: Any, rank: int, alpha: float, target_modules: str | list[str]) -> Any:
    """``model`` wrapped by ``peft`` with LoRA adapters (no adapter dropout: tuning turns dropout off)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=target_modules, task_type="CAUSAL_LM"
    )
    try:
        return get_peft_model(model, config)
    except ValueError as err:  # e.g. target modules that the model does not have
        raise LoraConfigError(f"lora_target_modules {target_modules!r}: {err}") from err


def is_peft_model(model: Any) -> bool:
    if importlib.util.find_spec("peft") is None:
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def save_lora_exports(model: Any, tokenizer: Any, out: Path) -> tuple[Path, Path]:
    """The merged model to ``out`` and the adapter alone to ``out/adapter``, each with the tokenizer."""
    adapter = out / "adapter"
    model.save_pretrained(adapter)
    tokenizer.save_pretrained(adapter)
    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, adapter
