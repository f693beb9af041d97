"""Rendered evaluation examples: what the scoring core consumes, whatever the benchmark's file format."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from cblight.errors import DataError

__all__ = ["ChoiceExample", "DataError", "Example", "GenerationExample", "NextTokenExample"]


@dataclass(frozen=True)
class ChoiceExample:
    """One multiple-choice question (paper §2 eq. 2, Table 10).

    ``choices`` are the continuations exactly as scored, each with its leading space (``" " + answer``);
    ``premise_free`` is the short context of eq. 2 (``""`` stands for BOS/EOS alone). ``idx`` identifies
    the example within its split (for a sampled selection split: its index in the sampled-from split).
    """

    idx: int
    context: str
    premise_free: str
    choices: tuple[str, ...]
    label: int
    where: str = ""

    def input_key(self) -> str:
        """Everything the model sees, for checking a cached result still belongs to this example."""
        return "\x1e".join([self.context, self.premise_free, *self.choices])

    @classmethod
    def build(
        cls,
        task: str,
        idx: int,
        where: str,
        *,
        context: str,
        premise_free: str,
        answers: Sequence[str],
        label: int,
    ) -> ChoiceExample:
        """An example whose choices are ``" " + answer`` (paper eq. 2: answers are scored as continuations
        with their leading space); a label outside the answers is a ``DataError`` naming the record."""
        if not answers:
            raise DataError(f"{task}: record at {where} has no answer choices")
        if not 0 <= label < len(answers):  # an int from the record's typed readers; in range here
            raise DataError(
                f"{task}: label at {where} is {label!r}, outside the {len(answers)} answers "
                f"(0..{len(answers) - 1}); an unlabelled test split?"
            )
        if not all(answer.strip() for answer in answers):
            raise DataError(f"{task}: empty answer choice at {where}")
        return cls(idx, context, premise_free, tuple(" " + a for a in answers), label, where)


@dataclass(frozen=True)
class NextTokenExample:
    """A passage whose final token is to be predicted (LAMBADA, LAMA; paper §3 and Table 5).

    ``answer`` is the text the final token should spell (LAMA: ``" " + object``), for filters and reports;
    empty where the target is just the passage's last token (LAMBADA). ``template`` is the prompt with
    ``[X]`` in place of the example's input (LAMA: the relation template cut before ``[Y]``), from which
    contextual calibration builds its content-free prompts (Zhao et al. 2021); empty where there is none.
    """

    idx: int
    text: str
    where: str = ""
    answer: str = ""
    template: str = ""

    def input_key(self) -> str:
        return self.text


@dataclass(frozen=True)
class GenerationExample:
    """A prompt to continue, with its human references (paper §4: WebText, DSTC7; appendix: CNN/DM, XSum).

    ``prompt`` is the whole prompt as the paper builds it: a WebText document's first sentence; the dialog
    turns each followed by the model's turn separator; ``{article} TL;DR:``. ``references`` are what
    generations are scored against; ``human`` is the held-out human text that forms the "Human" row of
    Tables 2 and 3 (the document's continuation; one of DSTC7's references), ``None`` where there is none.
    ``turns`` are the dialog context turns (empty elsewhere).

    Fitting the prompt to the model window (``cblight.truncation.fit_prompt``): ``keep_suffix`` is the
    tail of ``prompt`` that must survive (``" TL;DR:"``), ``cut_from`` the end of the rest that is cut
    (summaries keep the article's beginning and cut its end; dialog keeps the latest turns).
    ``short_prefix`` starts the growing short context of the paper's dialog/summary boosting (the turn
    separator; ``" TL;DR:"``); empty where the short context is the last ``k`` tokens (WebText).
    """

    idx: int
    prompt: str
    references: tuple[str, ...]
    where: str = ""
    human: str | None = None
    turns: tuple[str, ...] = ()
    keep_suffix: str = ""
    cut_from: Literal["start", "end"] = "start"
    short_prefix: str = ""

    def input_key(self) -> str:
        return self.prompt


#: Any example a task produces.
Example = ChoiceExample | NextTokenExample | GenerationExample
