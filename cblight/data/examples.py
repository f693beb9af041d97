"""Rendered evaluation examples: what the scoring core consumes, whatever the benchmark's file format."""

from __future__ import annotations

from dataclasses import dataclass

from cblight.errors import CblightError


class DataError(CblightError):
    """Bad or missing evaluation data; the message names the task, the file or split, and the field."""


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


@dataclass(frozen=True)
class NextTokenExample:
    """A passage whose final token is to be predicted (LAMBADA, LAMA; paper §3 and Table 5)."""

    idx: int
    text: str
    where: str = ""

    def input_key(self) -> str:
        return self.text


Example = ChoiceExample | NextTokenExample
