"""Boosted decoding on top of transformers' ``generate`` (paper §4 and the summarisation appendix).

``boosted_generate`` is the entry point; ``Boosting`` says what to mix (the paper's three modes, or any
list of short-context experts); ``BoostingLogitsProcessor`` and ``FusedBoostedDecoding`` plug boosting into
a ``model.generate`` call of your own. See ``docs/generation.md``.
"""

from cblight.generate.decode import BoostedGeneration, boosted_generate, check_generate_kwargs
from cblight.generate.fused import FusedBoostedDecoding
from cblight.generate.inputs import (
    PreparedPrompts,
    dialog_prompt,
    fit_marker_prompt,
    fit_row,
    prepare_prompts,
)
from cblight.generate.processor import BoostingLogitsProcessor
from cblight.generate.spec import (
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
