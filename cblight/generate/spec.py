"""What to boost with: short-context rules and their weights (paper eq. 1; DESIGN.md §1).

A boosted decoder mixes the full-context model ``f_max`` with any number of short-context experts,

    log f_alpha(w | prefix)  =  log_softmax( w_full · log f_max(w) + Σ_i w_i · log f_{s_i}(w) ),

where each short context ``s_i`` follows one rule:

* ``LastTokens(k)``: the last ``k`` tokens (generic text, WebText Table 2, Figure 1);
* ``AfterSeparator(sep)``: the turn separator plus the response so far (dialog, Table 3: the paper's
  ``f_{k+1}`` on ``S <sep> w_1..w_k``); the separator defaults to the tokenizer's EOS (DialoGPT);
* ``AfterMarker(marker)``: a marker such as `` TL;DR:`` plus the summary so far (appendix "GPT-2
  summarization experiments"; the marker is our choice so that the first step has a context).

``Boosting.from_mode`` builds the paper's two-expert forms: ``"generation"``
(``(1-alpha) log f_max + alpha log f_k``, the default for ``last_k``) and ``"next_token"``
(``log f_max + alpha log f_short``, the default for ``response`` and ``marker``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Literal

from cblight.boosting import BoostForm, two_expert_weights
from cblight.errors import BoostingError

Mode = Literal["last_k", "response", "marker"]
MODES: tuple[str, ...] = ("last_k", "response", "marker")
DEFAULT_FORMS: dict[str, BoostForm] = {
    "last_k": "generation",
    "response": "next_token",
    "marker": "next_token",
}


@dataclass(frozen=True)
class LastTokens:
    """Short context: the last ``k`` tokens, after the tokenizer's special prefix (BOS), at positions 0.."""

    k: int = 32

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise BoostingError(f"k (short-context length) must be an integer >= 1, got {self.k!r}")


@dataclass(frozen=True)
class AfterSeparator:
    """Short context: the prompt's final turn separator plus the response so far.

    ``separator`` is text (encoded without special tokens) or ``None`` for the tokenizer's EOS token, which
    is DialoGPT's separator. Every prompt must end with the separator.
    """

    separator: str | None = None


@dataclass(frozen=True)
class AfterMarker:
    """Short context: the last occurrence of ``marker`` in the prompt, whatever follows it, and the text
    generated so far. A prompt without the marker is an error."""

    marker: str = " TL;DR:"

    def __post_init__(self) -> None:
        if not isinstance(self.marker, str) or not self.marker:
            raise BoostingError(f"marker must be a non-empty string, got {self.marker!r}")


ShortContext = LastTokens | AfterSeparator | AfterMarker


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise BoostingError(f"{name} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Boosting:
    """A weighted product of the full-context model and short-context experts (paper eq. 1).

    ``experts`` holds ``(rule, weight)`` pairs; ``full_weight`` is the weight of ``f_max``. It must be
    positive: tokens the full model (or a constraint such as ``bad_words_ids``) rules out stay ruled out,
    and the decoder stays a boosted version of the full model rather than of a short one.
    """

    experts: tuple[tuple[ShortContext, float], ...] = ()
    full_weight: float = 1.0

    def __post_init__(self) -> None:
        full = _finite("full_weight", self.full_weight)
        if full <= 0:
            raise BoostingError(
                f"the full-context weight must be positive, got {full}; with the generation form "
                "(1-alpha) log f_max + alpha log f_k this means alpha < 1"
            )
        experts = []
        for i, pair in enumerate(self.experts):
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise BoostingError(f"experts[{i}] must be a (short-context rule, weight) pair, got {pair!r}")
            rule, weight = pair
            if not isinstance(rule, LastTokens | AfterSeparator | AfterMarker):
                raise BoostingError(
                    f"experts[{i}] rule must be LastTokens, AfterSeparator or AfterMarker, got {rule!r}"
                )
            experts.append((rule, _finite(f"experts[{i}] weight", weight)))
        object.__setattr__(self, "experts", tuple(experts))
        object.__setattr__(self, "full_weight", full)

    @classmethod
    def from_mode(
        cls,
        mode: Mode = "last_k",
        *,
        k: int = 32,
        alpha: float = 0.0,
        form: BoostForm | None = None,
        marker: str = " TL;DR:",
        separator: str | None = None,
    ) -> Boosting:
        """The paper's two-expert boosting for one of the three generation modes (DESIGN.md §1 table).

        ``form`` defaults to ``"generation"`` for ``last_k`` and ``"next_token"`` otherwise. With the
        generation form ``alpha`` must be below 1 (the full model keeps a positive weight).
        """
        if mode not in MODES:
            raise BoostingError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        alpha = _finite("alpha", alpha)
        form = DEFAULT_FORMS[mode] if form is None else form
        if form not in ("generation", "next_token"):
            raise BoostingError(f"form must be 'generation' or 'next_token', got {form!r}")
        if form == "generation" and alpha >= 1:
            raise BoostingError(
                f"alpha must be < 1 with the generation form (1-alpha) log f_max + alpha log f_k "
                f"(alpha >= 1 gives f_max a weight <= 0); got alpha={alpha}"
            )
        rule: ShortContext
        if mode == "last_k":
            rule = LastTokens(k)
        elif mode == "response":
            rule = AfterSeparator(separator)
        else:
            rule = AfterMarker(marker)
        w_full, w_short = two_expert_weights(alpha, form)
        return cls(experts=((rule, w_short),), full_weight=w_full)

    @property
    def active(self) -> tuple[tuple[ShortContext, float], ...]:
        """Experts with a non-zero weight (a zero weight never costs a model call)."""
        return tuple((r, w) for r, w in self.experts if w != 0.0)

    @property
    def is_plain(self) -> bool:
        """True when this is the untempered base model (e.g. alpha = 0)."""
        return not self.active and self.full_weight == 1.0
