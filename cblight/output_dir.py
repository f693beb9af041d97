"""The output directory of a run: where it is (``{model}`` filled in).

Shared by every evaluation module and the CLI, below all of them: it imports only ``cblight.models``
(for the model's short name: ``offline:smollm2-135m`` -> ``smollm2-135m``).
"""

from __future__ import annotations

from pathlib import Path


def resolve_output_dir(template: str, model: str) -> Path:
    """``template`` with ``{model}`` replaced by the model's short name (``gpt2``, ``Llama-2-7b-hf``, ``smollm2-135m``)."""
    from cblight.models import model_label

    return Path(template.replace("{model}", model_label(model)))
