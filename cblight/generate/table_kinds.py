"""The kinds of generation table: what differs between WebText's Table 2, DSTC7's Table 3 and the summarisation
table (appendix "GPT-2 summarization experiments") while the generation evaluator runs the same loop for all.

A ``TableKind`` says, for the tasks that fill its table:

* ``mode``: the short context of a row whose boosting mode is ``auto`` (``Decoding.boosting_for``): the last
  ``k`` tokens for text, the turn separator plus the response for dialog, `` TL;DR:`` plus the summary for
  summaries (docs/design.md, "Mathematics");
* ``new_suite``: the metric suite of each row (``cblight.metrics.tables``);
* ``record_extras``: what a generated record carries beyond the generation (a summary's first sentences);
* ``to_score``: the records that need their tokens' log-probabilities under the base LM (Table 2's
  perplexity, LTF and delta; no other table reads them);
* ``update``: how a batch's records update a row's suite;
* ``titles``: the printed column headers (Table 3's N-2, B-4, ...; other tables print the column names).

``kind_of`` picks a task's kind from its spec and examples, as evaluate's task kinds are picked by a spec's
``kind`` (``cblight.evaluate.task_scoring``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from cblight.data.datamodule import TaskSplit
from cblight.data.examples import GenerationExample
from cblight.data.sentences import first_sentences
from cblight.metrics.dialog_meteor import MeteorRoute
from cblight.metrics.tables import DIALOG_TITLES, DialogSuite, SummarySuite, TextSuite
from cblight.options import Mode

#: The name of a kind, as ``results.json`` gives each task's ``table``.
TableName = Literal["text", "dialog", "summary"]

Record = dict[str, Any]


class TableKind(ABC):
    """One kind of generation table (see the module docstring); the kinds hold no state, one object each."""

    name: ClassVar[TableName]
    mode: ClassVar[Mode]
    titles: ClassVar[Mapping[str, str]] = {}

    @abstractmethod
    def new_suite(
        self, *, eos_token_id: int | None, self_bleu_samples: int | None, meteor: MeteorRoute
    ) -> nn.Module:
        """A fresh metric suite for one row of the table.

        Args:
            eos_token_id: the tokenizer's EOS, dropped from a generation's end before Table 2's repetition
                test.
            self_bleu_samples: hypotheses sampled for Table 2's self-BLEU (``None``: all).
            meteor: Table 3's METEOR route (``cblight.metrics.dialog_meteor``).

        Returns:
            The suite (``cblight.metrics.tables``), whose ``update`` this kind's ``update`` calls.
        """

    def record_extras(self, text: str, split: TaskSplit) -> Record:
        """What a fresh record carries beyond the generation, for this table's metrics (nothing here).

        Args:
            text: the generated (or human) text.
            split: the task split it belongs to.

        Returns:
            The fields to add to the record.
        """
        return {}

    def to_score(self, records: Sequence[Record]) -> list[Record]:
        """The records whose tokens need their log-probabilities under the base LM (none here).

        Args:
            records: a batch's fresh records.

        Returns:
            Those of ``records`` to score, in order.
        """
        return []

    @abstractmethod
    def update(self, suite: Any, records: Sequence[Record], examples: Sequence[GenerationExample]) -> None:
        """Feed a batch's records of one row to that row's suite.

        Args:
            suite: the row's suite (``new_suite``).
            records: the batch's records, complete (``to_score``'s ones with ``lp_full`` and ``lp_short``).
            examples: the example of each record, in the same order (its references).
        """


class TextTable(TableKind):
    """Table 2 (WebText): the suite scores the generated tokens, and their ``log p_full`` / ``log p_short``
    under the base LM; a record without tokens (EOS at once) has nothing to score and is left out."""

    name = "text"
    mode = "last_k"

    def new_suite(
        self, *, eos_token_id: int | None, self_bleu_samples: int | None, meteor: MeteorRoute
    ) -> nn.Module:
        return TextSuite(eos_token_id=eos_token_id, self_bleu_samples=self_bleu_samples)

    def to_score(self, records: Sequence[Record]) -> list[Record]:
        return [r for r in records if r["tokens"]]

    def update(self, suite: Any, records: Sequence[Record], examples: Sequence[GenerationExample]) -> None:
        kept = self.to_score(records)
        suite.update(
            [r["tokens"] for r in kept],
            [torch.tensor(r["lp_full"]) for r in kept],
            [torch.tensor(r["lp_short"]) for r in kept],
            ids=[r["id"] for r in kept],
        )


class DialogTable(TableKind):
    """Table 3 (DSTC7): each response, stripped, against the example's references; the paper's headers."""

    name = "dialog"
    mode = "response"
    titles = DIALOG_TITLES

    def new_suite(
        self, *, eos_token_id: int | None, self_bleu_samples: int | None, meteor: MeteorRoute
    ) -> nn.Module:
        return DialogSuite(meteor=meteor)

    def update(self, suite: Any, records: Sequence[Record], examples: Sequence[GenerationExample]) -> None:
        suite.update([r["text"].strip() for r in records], [list(ex.references) for ex in examples])


class SummaryTable(TableKind):
    """The summarisation table: ROUGE of the first sentences of each generation (3 for CNN/DM, 2 for XSum:
    the task spec's ``output_sentences``), kept in the record as ``summary``."""

    name = "summary"
    mode = "marker"

    def new_suite(
        self, *, eos_token_id: int | None, self_bleu_samples: int | None, meteor: MeteorRoute
    ) -> nn.Module:
        return SummarySuite()

    def record_extras(self, text: str, split: TaskSplit) -> Record:
        return {"summary": first_sentences(text, split.task.output_sentences)}

    def update(self, suite: Any, records: Sequence[Record], examples: Sequence[GenerationExample]) -> None:
        suite.update([r["summary"] for r in records], [list(ex.references) for ex in examples])


#: The three kinds, one object each.
TEXT, DIALOG, SUMMARY = TextTable(), DialogTable(), SummaryTable()


def kind_of(split: TaskSplit) -> TableKind:
    """The table a task fills: summaries (a spec that keeps the first sentences of the output), dialog
    (examples with turns), else text.

    Args:
        split: the task's split, its spec and examples.

    Returns:
        ``SUMMARY``, ``DIALOG`` or ``TEXT``.
    """
    if split.task.output_sentences:
        return SUMMARY
    if any(isinstance(ex, GenerationExample) and ex.turns for ex in split.examples):
        return DIALOG
    return TEXT
