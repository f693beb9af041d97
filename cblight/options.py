r"""The validated option objects every entry point shares: ``Boosting`` (what to mix) and ``Sampling`` (how to
draw from the mix).

Each is checked once, when it is made, and then passed as it is to ``boosted_generate``, the generation
evaluator's decodings, coherence tuning, the lm-eval model and ``custom_generate``; configs spell them as
nested mappings (``boosting: {k: 8, alpha: -0.4}``, ``sampling: {do_sample: true, top_p: 0.95}``).

``Boosting`` is the paper's two-expert boosting (eq. 1 with one short expert) in one of three modes; its
``experts()`` is the general form every decoder consumes, ``Experts``: the full-context model ``f_max``
mixed with any number of short-context experts,

.. math::

    \log f_\alpha(w \mid \text{prefix}) = \log \operatorname{softmax}\Big( w_{\text{full}} \log f_{\max}(w)
    + \sum_i w_i \log f_{s_i}(w) \Big),

where each short context ``s_i`` follows one rule:

* ``LastTokens(k)``: the last ``k`` tokens (generic text, WebText Table 2, Figure 1);
* ``AfterSeparator(sep)``: the turn separator plus the response so far (dialog, Table 3: the paper's
  ``f_{k+1}`` on ``S <sep> w_1..w_k``); the separator defaults to the tokenizer's EOS (DialoGPT);
* ``AfterMarker(marker)``: a marker such as ``" TL;DR:"`` plus the summary so far (appendix "GPT-2
  summarization experiments"; the marker is our choice so that the first step has a context).

The two forms (docs/design.md, "Mathematics"): ``generation``, :math:`(1-\alpha) \log f_{\max} + \alpha \log
f_k` (Table 2, the default for ``last_k``), and ``next_token``, :math:`\log f_{\max} + \alpha \log f_{\text{short}}`
(§3, Tables 1 and 3, the default for ``response`` and ``marker``).

``adaptive`` (``Boosting.adaptive``, ``Experts.adaptive``) names a label-free rule of ``cblight.adaptive``
that sets alpha afresh at every decoding step and for every row from ``f_max`` and the short expert
(docs/adaptive.md); ``alpha`` is then left at 0.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, Literal, get_args

from cblight.adaptive import DecodingRule
from cblight.boosting import BoostForm, too_large_alpha, two_expert_weights
from cblight.errors import BoostingError
from cblight.option_types import (
    FiniteFloat,
    NonNegativeInt,
    NotEmptyStr,
    PositiveFiniteFloat,
    PositiveInt,
    PositiveUnitInterval,
    check_fields,
)

__all__ = [
    "MODES",
    "AfterMarker",
    "AfterSeparator",
    "Boosting",
    "Experts",
    "LastTokens",
    "Mode",
    "Sampling",
    "ShortContext",
]

#: The paper's three short contexts, the last ``k`` tokens, separator + response so far (dialog), marker + text so far (summaries).
Mode = Literal["last_k", "response", "marker"]
#: The values of ``Mode``.
MODES: tuple[str, ...] = get_args(Mode)


# ---------------------------------------------------------------------------------------------------------
# Short-context rules and their weighted product


@dataclass(frozen=True)
class LastTokens:
    """Short context: the last ``k`` tokens, after the tokenizer's special prefix (BOS), at positions 0..

    Args:
        k: how many tokens the short context keeps (positive).

    Examples:
        >>> LastTokens(8)
        LastTokens(k=8)
    """

    k: PositiveInt = 32

    def __post_init__(self) -> None:
        check_fields(self, BoostingError)


@dataclass(frozen=True)
class AfterSeparator:
    """Short context: the prompt's final turn separator plus the response so far (dialog, Table 3).

    Every prompt must end with the separator (``cblight.generate.dialog_prompt`` builds such prompts).

    Args:
        separator: the separator as text (encoded without special tokens), or ``None`` for the tokenizer's
            EOS token, which is DialoGPT's separator.
    """

    separator: str | None = None


@dataclass(frozen=True)
class AfterMarker:
    """Short context: the last occurrence of ``marker`` in the prompt, whatever follows it, and the text
    generated so far (summaries). A prompt without the marker is an error.

    Args:
        marker: the marker text (not empty).
    """

    marker: NotEmptyStr = " TL;DR:"

    def __post_init__(self) -> None:
        check_fields(self, BoostingError)


#: One short-context rule of ``Experts``.
ShortContext = LastTokens | AfterSeparator | AfterMarker


@dataclass(frozen=True)
class Experts:
    """A weighted product of the full-context model and short-context experts (paper eq. 1).

    The full-context weight must be positive: tokens the full model (or a constraint such as
    ``bad_words_ids``) rules out stay ruled out, and the decoder stays a boosted version of the full model
    rather than of a short one.

    Args:
        experts: ``(rule, weight)`` pairs, one per short-context expert (``LastTokens``, ``AfterSeparator``,
            ``AfterMarker``).
        full_weight: the weight of ``f_max``, positive.
        adaptive: a per-token rule (``auto`` or one of ``cblight.adaptive.TOKEN_RULES``) that replaces the
            two fixed weights by ``two_expert_weights(alpha_t, form)`` with each row's ``alpha_t`` at each
            step, read from ``f_max`` and the (single) short expert; the weights given are then unused.
        form: the two-expert form an adaptive rule's alpha is used in
            (``cblight.boosting.two_expert_weights``).

    Raises:
        ~cblight.errors.BoostingError: when ``full_weight`` is not positive, or an adaptive rule is given more
            than one short expert.

    Examples:
        The last 8 tokens and the text after `` TL;DR:`` as two experts against ``f_max``:

        >>> product = Experts(((LastTokens(8), -0.3), (AfterMarker(), -0.2)), full_weight=1.5)
        >>> [type(rule).__name__ for rule, weight in product.active]
        ['LastTokens', 'AfterMarker']
    """

    experts: tuple[tuple[ShortContext, FiniteFloat], ...] = ()
    full_weight: FiniteFloat = 1.0
    adaptive: DecodingRule | None = None
    form: BoostForm = "generation"

    def __post_init__(self) -> None:
        check_fields(self, BoostingError)
        if self.full_weight <= 0:
            raise BoostingError(
                f"the full-context weight must be positive, got {self.full_weight}; with the generation form "
                "(1-alpha) log f_max + alpha log f_k this means alpha < 1"
            )
        # weights as floats, as the decoders multiply them into float tensors
        object.__setattr__(self, "experts", tuple((rule, float(w)) for rule, w in self.experts))
        if self.adaptive is not None and len(self.experts) != 1:
            raise BoostingError(
                f"an adaptive rule weighs f_max against one short expert; this product has {len(self.experts)}"
            )

    @property
    def active(self) -> tuple[tuple[ShortContext, float], ...]:
        """Experts with a non-zero weight (a zero weight never costs a model call); with an adaptive rule,
        the short expert whatever its fixed weight."""
        return tuple((r, w) for r, w in self.experts if w != 0.0 or self.adaptive is not None)

    @property
    def is_plain(self) -> bool:
        """True when this is the untempered base model (e.g. alpha = 0 and no adaptive rule)."""
        return not self.active and self.full_weight == 1.0


# ---------------------------------------------------------------------------------------------------------
# The paper's boosting, and sampling


@dataclass(frozen=True)
class Boosting:
    """Coherence boosting with one short context (paper eq. 1; §3, §4.1, §4.2).

    Args:
        mode: the short context: ``last_k`` (the last ``k`` tokens; WebText Table 2, Figure 1), ``response``
            (the turn separator plus the response so far; dialog, Table 3) or ``marker`` (``marker`` plus
            the text so far; summaries). In a generation evaluator's decodings, ``auto`` is the task's own
            (``last_k`` for text, ``response`` for dialog, ``marker`` for summaries).
        k: the window of ``last_k``.
        alpha: the boosting coefficient; 0 is the base model, usually negative.
        form: ``generation`` (``(1-alpha) log f_max + alpha log f_short``, the default of ``last_k``) or
            ``next_token`` (``log f_max + alpha log f_short``, the default of ``response`` and ``marker``).
        marker: the marker of ``marker`` mode.
        separator: the separator of ``response`` mode (``None``: the tokenizer's EOS, DialoGPT's).
        adaptive: a label-free rule that sets alpha per token instead (``jsd``: AdaCAD's Jensen-Shannon
            weight; ``jsdist``: the Jensen-Shannon distance as that weight; ``cocoa``: a CoCoA-style weight;
            ``auto``: ``jsdist``; docs/adaptive.md); ``alpha`` is then left at 0.

    Raises:
        ~cblight.errors.BoostingError: for a value outside its type, ``alpha >= 1`` with the generation form,
            or an adaptive rule with a non-zero ``alpha``.

    Examples:
        The last 8 tokens at alpha -0.4 in the generation form weigh ``f_max`` by 1.4 and ``f_8`` by -0.4:

        >>> boosting = Boosting(mode="last_k", k=8, alpha=-0.4)
        >>> boosting.experts()
        Experts(experts=((LastTokens(k=8), -0.4),), full_weight=1.4, adaptive=None, form='generation')
        >>> Boosting(alpha=1.5)
        Traceback (most recent call last):
        ...
        cblight.errors.BoostingError: alpha must be < 1 with the generation form ...
    """

    mode: Literal["last_k", "response", "marker", "auto"] = "last_k"
    k: PositiveInt = 32
    alpha: FiniteFloat = 0.0
    form: BoostForm | None = None
    marker: NotEmptyStr = " TL;DR:"
    separator: str | None = None
    adaptive: DecodingRule | None = None

    def __post_init__(self) -> None:
        check_fields(self, BoostingError)
        if too_large := too_large_alpha([self.alpha]):
            raise BoostingError(too_large)
        if self.mode != "auto" and self.resolved_form == "generation" and self.alpha >= 1:
            raise BoostingError(
                f"alpha must be < 1 with the generation form (1-alpha) log f_max + alpha log f_k "
                f"(alpha >= 1 gives f_max a weight <= 0); got alpha={self.alpha}"
            )
        if self.adaptive is not None and self.alpha != 0.0:
            raise BoostingError(
                f"adaptive={self.adaptive} sets alpha at every token; leave alpha at 0 (got alpha={self.alpha})"
            )

    @property
    def resolved_form(self) -> BoostForm:
        return self.form or ("generation" if self.mode in ("last_k", "auto") else "next_token")

    @property
    def is_plain(self) -> bool:
        """True at ``alpha = 0`` without an adaptive rule: the base model, decoded without any short-context
        call."""
        return self.alpha == 0.0 and self.adaptive is None

    def with_mode(self, mode: Mode) -> Boosting:
        """This boosting with ``auto`` replaced by a concrete mode (other modes are kept).

        Args:
            mode: the task's own short context, ``last_k``, ``response`` or ``marker``.

        Returns:
            A ``Boosting`` of that mode when this one is ``auto``, else this one.

        Examples:
            >>> Boosting(mode="auto", alpha=-0.5).with_mode("marker").mode
            'marker'
        """
        return replace(self, mode=mode) if self.mode == "auto" else self

    def experts(self) -> Experts:
        """The weighted product this boosting is (the ``form``'s two weights on ``f_max`` and the short
        expert).

        Returns:
            The ``Experts`` every decoder consumes.

        Raises:
            ~cblight.errors.BoostingError: for mode ``auto``, which only a generation evaluator resolves.

        Examples:
            >>> Boosting(mode="response", alpha=-0.5).experts()
            Experts(experts=((AfterSeparator(separator=None), -0.5),), full_weight=1.0, adaptive=None, form='next_token')
        """
        if self.mode == "auto":
            raise BoostingError(
                "boosting mode 'auto' means the task's own short context and is resolved by the generation "
                "evaluator; here give last_k, response or marker"
            )
        rule = {
            "last_k": LastTokens(self.k),
            "response": AfterSeparator(self.separator),
            "marker": AfterMarker(self.marker),
        }[self.mode]
        w_full, w_short = two_expert_weights(self.alpha, self.resolved_form)
        return Experts(((rule, w_short),), w_full, self.adaptive, self.resolved_form)

    @classmethod
    def from_prefixed(cls, kwargs: dict[str, Any], prefix: str = "boost_") -> Boosting | None:
        """A ``Boosting`` from ``<prefix><field>`` keys popped out of ``kwargs`` (transformers' ``generate``
        keyword style, ``boost_alpha=-0.5``).

        Args:
            kwargs: keyword arguments; the boosting ones are removed from it.
            prefix: the prefix of the boosting keys.

        Returns:
            The boosting, or ``None`` when ``kwargs`` holds no boosting key.

        Raises:
            ~cblight.errors.BoostingError: for a key with the prefix that names no field.

        Examples:
            >>> kwargs = {"boost_alpha": -0.5, "boost_k": 4, "max_new_tokens": 8}
            >>> Boosting.from_prefixed(kwargs).k, kwargs
            (4, {'max_new_tokens': 8})
        """
        given = {f.name: kwargs.pop(prefix + f.name) for f in fields(cls) if prefix + f.name in kwargs}
        if unknown := [k for k in kwargs if k.startswith(prefix)]:
            names = ", ".join(prefix + f.name for f in fields(cls))
            raise BoostingError(f"unknown boosting option {unknown[0]!r}; the options are {names}")
        return cls(**given) if given else None


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn from the (boosted) distribution: transformers' ``generate`` options, applied
    after mixing. A value left unset (``None``) is left to the model's generation config, as ``generate``
    does.

    Args:
        do_sample: sample (``true``) or decode greedily / by beam search (``false``).
        temperature: softmax temperature (> 0).
        top_p: nucleus sampling's probability mass, in (0, 1].
        top_k: keep the ``k`` most likely tokens (0 keeps all).
        num_beams: beam search width (1: no beam search).
        seed: seed of the random draws (give each process its own under DDP); the caller's random state is
            left untouched.

    Examples:
        >>> Sampling(do_sample=True, top_p=0.95, seed=0).generate_kwargs()
        {'do_sample': True, 'top_p': 0.95}
    """

    do_sample: bool | None = None
    temperature: PositiveFiniteFloat | None = None
    top_p: PositiveUnitInterval | None = None
    top_k: NonNegativeInt | None = None
    num_beams: PositiveInt | None = None
    seed: NonNegativeInt | None = None

    GENERATE_KEYS: ClassVar[tuple[str, ...]] = ("do_sample", "temperature", "top_p", "top_k", "num_beams")

    def __post_init__(self) -> None:
        check_fields(self, BoostingError)

    def generate_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``model.generate`` this stands for (unset ones and ``seed`` left out).

        Returns:
            A dict of ``generate`` keywords.
        """
        return {k: getattr(self, k) for k in self.GENERATE_KEYS if getattr(self, k) is not None}

    @classmethod
    def from_generate_kwargs(cls, kwargs: dict[str, Any]) -> Sampling:
        """A ``Sampling`` from ``generate``-style keywords popped out of ``kwargs`` (``None`` counts as unset).

        Args:
            kwargs: keyword arguments of ``model.generate``; the sampling ones are removed from it.

        Returns:
            The sampling options they give.

        Examples:
            >>> kwargs = {"do_sample": True, "temperature": None, "max_new_tokens": 8}
            >>> Sampling.from_generate_kwargs(kwargs).do_sample, kwargs
            (True, {'max_new_tokens': 8})
        """
        given = {k: kwargs.pop(k) for k in cls.GENERATE_KEYS if k in kwargs}
        return cls(**{k: v for k, v in given.items() if v is not None})


def as_experts(boosting: Boosting | Experts) -> Experts:
    """The weighted product a decoder consumes, from either option object.

    Args:
        boosting: a ``Boosting`` or an ``Experts``.

    Returns:
        ``boosting`` itself when it is an ``Experts``, else ``boosting.experts()``.
    """
    return boosting if isinstance(boosting, Experts) else boosting.experts()
