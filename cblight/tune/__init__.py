"""Coherence tuning (paper appendix "From coherence boosting to coherence tuning")."""

__all__ = [
    "callbacks",
    "coherence_tuning",
    "divergences",
    "export",
    "lora",
    "loss",
    "prompt_data",
    "rollouts",
    "teacher",
    "validation",
]
