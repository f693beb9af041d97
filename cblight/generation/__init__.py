"""Boosted decoding on top of transformers' ``generate`` (paper §4 and the summarisation appendix).

``boosted_generate`` is the entry point; ``Boosting`` says what to mix (the paper's three modes, or any
list of short-context experts); ``BoostingLogitsProcessor`` and ``FusedBoostedDecoding`` plug boosting into
a ``model.generate`` call of your own. See ``docs/generation.md``.
"""

from cblight.generation.api import BoostedGeneration, boosted_generate, check_generate_kwargs
from cblight.generation.fused import FusedBoostedDecoding
from cblight.generation.processor import BoostingLogitsProcessor
from cblight.generation.prompts import (
    PreparedPrompts,
    dialog_prompt,
    fit_marker_prompt,
    fit_row,
    prepare_prompts,
)
from cblight.generation.spec import (
    MODES,
    AfterMarker,
    AfterSeparator,
    Boosting,
    BoostingError,
    LastTokens,
    Mode,
    ShortContext,
)

__all__ = [
    "MODES",
    "AfterMarker",
    "AfterSeparator",
    "BoostedGeneration",
    "Boosting",
    "BoostingError",
    "BoostingLogitsProcessor",
    "FusedBoostedDecoding",
    "LastTokens",
    "Mode",
    "PreparedPrompts",
    "ShortContext",
    "boosted_generate",
    "check_generate_kwargs",
    "dialog_prompt",
    "fit_marker_prompt",
    "fit_row",
    "prepare_prompts",
]
