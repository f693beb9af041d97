"""Boosted decoding on top of transformers' ``generate`` (paper §4 and the summarisation appendix).

``boosted_generate`` is the entry point; ``Boosting`` says what to mix (the paper's three modes) and
``Experts`` any list of short-context experts; ``Sampling`` how to draw; ``BoostingLogitsProcessor`` and
``FusedBoostedDecoding`` plug boosting into a ``model.generate`` call of your own. The generation
experiments of Tables 2 and 3 are ``cblight.generate.generation_evaluator``. See ``docs/generation.md``.
"""

import types as _types

from cblight.errors import BoostingError as BoostingError
from cblight.generate.decode import BoostedGeneration as BoostedGeneration
from cblight.generate.decode import BoostingLogitsProcessor as BoostingLogitsProcessor
from cblight.generate.decode import FusedBoostedDecoding as FusedBoostedDecoding
from cblight.generate.decode import boosted_generate as boosted_generate
from cblight.generate.inputs import PreparedPrompts as PreparedPrompts
from cblight.generate.inputs import dialog_prompt as dialog_prompt
from cblight.generate.inputs import fit_marker_prompt as fit_marker_prompt
from cblight.generate.inputs import prepare_prompts as prepare_prompts
from cblight.options import MODES as MODES
from cblight.options import AfterMarker as AfterMarker
from cblight.options import AfterSeparator as AfterSeparator
from cblight.options import Boosting as Boosting
from cblight.options import Experts as Experts
from cblight.options import LastTokens as LastTokens
from cblight.options import Mode as Mode
from cblight.options import Sampling as Sampling
from cblight.options import ShortContext as ShortContext

# the public API: every name imported above (the submodules, bound by those imports, are not part of it)
__all__ = sorted(
    n for n, v in globals().items() if not n.startswith("_") and not isinstance(v, _types.ModuleType)
)
