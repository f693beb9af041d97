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

    Args:
        idx: the example's index within its split (for a sampled selection split: its index in the
            sampled-from split).
        context: the full context, the question as the task's prompt writes it.
        premise_free: the short context of eq. 2 (``""`` stands for BOS/EOS alone).
        choices: the continuations exactly as scored, each with its leading space (``" " + answer``).
        label: the index of the correct choice.
        where: the file and line (or Hub row) the record came from, for messages.

    Examples:
        >>> example = ChoiceExample.build(
        ...     "copa", 0, "val.jsonl line 1",
        ...     context="The man broke his toe because",
        ...     premise_free=" because",
        ...     answers=["he dropped a hammer on his foot.", "he got a hole in his sock."],
        ...     label=0,
        ... )
        >>> example.choices
        (' he dropped a hammer on his foot.', ' he got a hole in his sock.')
    """

    idx: int
    context: str
    premise_free: str
    choices: tuple[str, ...]
    label: int
    where: str = ""

    def input_key(self) -> str:
        """Everything the model sees, for checking a cached result still belongs to this example.

        Returns:
            The context, premise-free context and choices joined by a record separator.
        """
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
        with their leading space).

        Args:
            task: the task's name, for messages.
            idx: the example's index within its split.
            where: the file and line the record came from, for messages.
            context: the full context.
            premise_free: the premise-free context.
            answers: the answers without their leading space.
            label: the index of the correct answer.

        Returns:
            The ``ChoiceExample``.

        Raises:
            ~cblight.errors.DataError: for no answers, an empty answer, or a label outside the answers, naming
                the record.
        """
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

    Args:
        idx: the example's index within its split.
        text: the passage, its final token included (the target).
        where: the file and line the record came from, for messages.
        answer: the text the final token should spell (LAMA: ``" " + object``), for filters and reports;
            empty where the target is just the passage's last token (LAMBADA).
        template: the prompt with ``[X]`` in place of the example's input (LAMA: the relation template cut
            before ``[Y]``), from which contextual calibration builds its content-free prompts (Zhao et al.
            2021); empty where there is none.
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

    Args:
        idx: the example's index within its split.
        prompt: the whole prompt as the paper builds it: a WebText document's first sentence; the dialog
            turns each followed by the model's turn separator; ``{article} TL;DR:``.
        references: what generations are scored against.
        where: the file and line the record came from, for messages.
        human: the held-out human text that forms the "Human" row of Tables 2 and 3 (the document's
            continuation; one of DSTC7's references), ``None`` where there is none.
        turns: the dialog context turns (empty elsewhere).
        keep_suffix: the tail of ``prompt`` that must survive fitting to the window (``" TL;DR:"``).
        cut_from: the end of the rest that is cut (summaries keep the article's beginning and cut its end,
            ``end``; dialog keeps the latest turns, ``start``).
        short_prefix: what starts the growing short context of the paper's dialog/summary boosting (the
            turn separator; ``" TL;DR:"``); empty where the short context is the last ``k`` tokens (WebText).
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
