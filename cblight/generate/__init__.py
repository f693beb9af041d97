"""Boosted decoding on top of transformers' ``generate`` (paper §4 and the summarisation appendix).

``boosted_generate`` is the entry point; ``Boosting`` says what to mix (the paper's three modes) and
``Experts`` any list of short-context experts; ``Sampling`` how to draw; ``BoostingLogitsProcessor`` and
``FusedBoostedDecoding`` plug boosting into a ``model.generate`` call of your own. The generation
experiments of Tables 2 and 3 are ``cblight.generate.generation_evaluator``. See ``docs/generation.md``.
"""

from cblight.errors import BoostingError
from cblight.generate.decode import (
    BoostedGeneration,
    BoostingLogitsProcessor,
    FusedBoostedDecoding,
    boosted_generate,
)
from cblight.generate.inputs import (
    PreparedPrompts,
    dialog_prompt,
    fit_marker_prompt,
    fit_row,
    prepare_prompts,
)
from cblight.options import (
    MODES,
    AfterMarker,
    AfterSeparator,
    Boosting,
    Experts,
    LastTokens,
    Mode,
    Sampling,
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
    "Experts",
    "FusedBoostedDecoding",
    "LastTokens",
    "Mode",
    "PreparedPrompts",
    "Sampling",
    "ShortContext",
    "boosted_generate",
    "dialog_prompt",
    "fit_marker_prompt",
    "fit_row",
    "prepare_prompts",
]
