"""How one kind of task is evaluated with boosting: its examples become cached numbers, and the sweep over the
grid becomes alpha* (and k*) and a report.

1. ``missing`` says which parts of an example's cached record must be (re)computed: ``boost`` (every
   number, for a new or changed example) or the comparison methods whose inputs changed;
2. ``score`` computes them through a scorer (``cblight.scoring.Scorer``, or for multiple choice any
   ``TextScorer`` such as a served model's), one forward pass per context form (docs/design.md, "Speed
   floors");
3. ``update`` feeds records to the kind's sweep metric (``cblight.metrics.sweeps``), synced across processes;
4. ``select`` (end of the validation loop) picks alpha* (and k*), ties to the first grid value as in the
   authors' code; ``report`` (end of the test loop) gives accuracies with standard errors and the
   per-example prediction rows.

The two kinds are multiple choice (paper eq. 2, Table 4) and next-token prediction (paper §3, Tables 1 and
5); a task spec's ``kind`` names which.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from cblight.boosting import binomial_stderr
from cblight.cache import digest
from cblight.data.datamodule import TaskSplit
from cblight.data.examples import Example
from cblight.evaluate.methods import MethodOptions, not_applicable
from cblight.scoring import TextScorer

Rows = list[dict[str, Any]]


class TaskScoring(ABC):
    """One task kind's scoring, sweep, selection and report (see the module docstring).

    A kind scores ``split`` with the grids and method options of ``run`` (a ``BoostedEvaluator``), the
    comparison ``methods`` beside boosting and the label-free rule ``adaptive`` (both on the reported split
    only). ``signature`` holds the settings that change the cached numbers (a cache written under others is
    refused); ``record_fields`` are the keys every record of this kind must carry (a cache row without
    them is corrupt and recomputed).
    """

    kind: ClassVar[str] = ""
    record_fields: ClassVar[tuple[str, ...]] = ("id", "input")

    def __init__(self, run: Any, split: TaskSplit, methods: Sequence[str], adaptive: str | None):
        self.methods = list(methods)
        self.adaptive = adaptive
        self._options: MethodOptions | None = run.method_options

    @property
    def options(self) -> MethodOptions:
        """The comparison methods' options: the run's, or their defaults (built only where a method runs)."""
        return self._options or MethodOptions()

    @property
    def content_free(self) -> list[str]:
        """Contextual calibration's content-free inputs for this kind of task."""
        return self.options.content_free(self.kind)

    def signature(self) -> dict[str, Any]:
        return {}

    # -- scoring -----------------------------------------------------------------------------------------
    @abstractmethod
    def new_sweep(self, split: TaskSplit) -> nn.Module: ...

    @abstractmethod
    def method_digest(self, method: str, example: Example) -> str:
        """A digest of what ``method`` feeds the model for ``example`` (kept in the record)."""

    @abstractmethod
    def score(
        self,
        scorer: TextScorer,
        split: TaskSplit,
        examples: Sequence[Example],
        previous: dict[int, dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """Records of ``examples``; ``previous`` holds their cached records (parts still valid are kept)."""

    @abstractmethod
    def update(self, sweep: Any, records: Sequence[dict[str, Any]]) -> None: ...

    def describe(self, split: TaskSplit, requested: Sequence[str]) -> dict[str, Any]:
        """What ``results.json`` says about each requested comparison method: reported (with the strings
        it used) or why not."""
        return {
            m: {"reported": False, "not_applicable": reason}
            if (reason := not_applicable(m, split))
            else {"reported": True}
            for m in requested
        }

    # -- the cache ---------------------------------------------------------------------------------------
    def missing(self, record: dict[str, Any] | None, example: Example) -> list[str]:
        """The parts of ``record`` to (re)compute for ``example``: ``boost`` (everything, for a new or
        changed example) or the methods whose inputs changed; empty when the record is complete."""
        if not self.matches(record, example):
            return ["boost", *self.methods]
        assert record is not None
        done = record.get("method_inputs", {})
        return [m for m in self.methods if done.get(m) != self.method_digest(m, example)]

    @staticmethod
    def input_digest(example: Example) -> str:
        return digest(example.input_key())

    def matches(self, record: dict[str, Any] | None, example: Example) -> bool:
        """Whether a cached record holds this example's numbers: same input, and as many values as the
        example and grid need (a row of another shape is recomputed, never read)."""
        return (
            record is not None
            and record.get("input") == self.input_digest(example)
            and self._fits(record, example)
        )

    def _fits(self, record: dict[str, Any], example: Example) -> bool:
        return True

    # -- selection and report ------------------------------------------------------------------------------
    @abstractmethod
    def select(self, split: TaskSplit, out: dict[str, torch.Tensor]) -> dict[str, Any]:
        """alpha* (and k*) on the selection split, from the sweep's ``compute()`` output."""

    @abstractmethod
    def report(
        self, split: TaskSplit, out: dict[str, torch.Tensor], selection: dict[str, Any] | None
    ) -> tuple[dict[str, Any], Rows]:
        """The report split's result (``results.json``) and per-example prediction rows."""

    @staticmethod
    def _selection_info(split: TaskSplit, out: dict[str, torch.Tensor]) -> dict[str, Any]:
        info: dict[str, Any] = {"split": split.description, "n": int(out["ids"].numel())}
        if split.sampled_indices is not None:
            info["indices"] = split.sampled_indices
        return info


def accuracy(correct: torch.Tensor, key: str) -> dict[str, float]:
    """``{key: the mean of a 0/1 tensor, key_stderr: its binomial standard error}``."""
    acc = float(correct.double().mean())
    return {key: acc, f"{key}_stderr": binomial_stderr(acc, correct.numel())}
