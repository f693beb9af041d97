"""The output directory of a run: where it is (``{model}`` filled in).

Shared by every evaluation module and the CLI, below all of them: it imports nothing from cblight but its
errors.
"""

from __future__ import annotations

from pathlib import Path


def resolve_output_dir(template: str, model: str) -> Path:
    """``template`` with ``{model}`` replaced by the model's last path component (``gpt2``, ``Llama-2-7b-hf``)."""
    name = Path(model.rstrip("/")).name or "model"
    return Path(template.replace("{model}", name))
