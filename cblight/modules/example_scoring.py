"""How one batch of examples is scored: the per-example numbers every sweep is computed from.

One class per task kind turns examples into cache records with one forward pass per context form
(DESIGN.md §5) and feeds those records to the kind's sweep metric:

* ``ChoiceScoring`` (paper eq. 2, Table 4): every choice's log-likelihood after the full and after the
  premise-free context;
* ``NextTokenScoring`` (paper §3, Tables 1 and 5): the target's log-prob and rank under ``f_max``, each
  ``f_k`` and the boosted mix at every (k, alpha) of the grid.

They talk to the model only through a *backend* with ``Scorer``'s interface (``score_text``,
``encoder``, ``next_token_log_probs``, ``last_k_log_probs``), so another backend (e.g. a served model)
or another scoring method (a new ``ExampleScoring`` subclass registered in ``SCORINGS``) plugs in here
without touching the Lightning loop (``cblight.modules.evaluation``) or the selection and report
(``cblight.modules.selection``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from cblight.boosting import next_token_alpha_sweep
from cblight.data.datamodule import TaskSplit
from cblight.data.examples import ChoiceExample, DataError, Example, NextTokenExample
from cblight.metrics.sweeps import ChoiceSweep, NextTokenSweep
from cblight.results import digest


class ExampleScoring:
    """One task kind's scoring: records from examples, and the sweep metric those records update.

    ``signature`` holds the settings that change the cached numbers (a cache written under others is
    refused); ``record_fields`` are the keys every record of this kind must carry (a cache row without
    them is corrupt and recomputed).
    """

    kind: ClassVar[str] = ""
    record_fields: ClassVar[tuple[str, ...]] = ("id", "input")

    def signature(self) -> dict[str, Any]:
        return {}

    def new_sweep(self, split: TaskSplit) -> nn.Module:
        raise NotImplementedError

    def score(self, backend: Any, split: TaskSplit, examples: Sequence[Example]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def update(self, sweep: Any, records: Sequence[dict[str, Any]]) -> None:
        raise NotImplementedError

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


class ChoiceScoring(ExampleScoring):
    """Multiple choice: ``log f(a | full)`` and ``log f(a | premise-free)`` per choice (paper eq. 2)."""

    kind = "multiple_choice"
    record_fields = ("id", "input", "label", "ll_full", "ll_short", "n_tokens", "char_lengths")

    def __init__(self, alphas: Sequence[float], length_normalize: bool = False):
        self.alphas = list(alphas)
        self.length_normalize = length_normalize

    def _fits(self, record: dict[str, Any], example: Example) -> bool:
        n = len(example.choices) if isinstance(example, ChoiceExample) else -1
        return all(
            isinstance(record[f], list) and len(record[f]) == n
            for f in ("ll_full", "ll_short", "char_lengths")
        )

    def new_sweep(self, split: TaskSplit) -> nn.Module:
        return ChoiceSweep(self.alphas, split.max_choices, self.length_normalize)

    def score(self, backend: Any, split: TaskSplit, examples: Sequence[Example]) -> list[dict[str, Any]]:
        choices = [ex for ex in examples if isinstance(ex, ChoiceExample)]
        groups = [(ex.context, ex.choices) for ex in choices] + [
            (ex.premise_free, ex.choices) for ex in choices
        ]
        names = [f"{split.name} {ex.where} (full context)" for ex in choices]
        names += [f"{split.name} {ex.where} (premise-free context)" for ex in choices]
        scores = backend.score_text(groups, names)
        full, short = scores[: len(choices)], scores[len(choices) :]
        return [
            {
                "id": ex.idx,
                "input": self.input_digest(ex),
                "label": ex.label,
                "ll_full": [s.log_prob for s in f],
                "ll_short": [s.log_prob for s in s_],
                "n_tokens": [s.num_tokens for s in f],
                "greedy_full": [s.is_greedy for s in f],
                "char_lengths": [len(c) for c in ex.choices],
            }
            for ex, f, s_ in zip(choices, full, short)
        ]

    def update(self, sweep: Any, records: Sequence[dict[str, Any]]) -> None:
        sweep.update(
            [r["id"] for r in records],
            [r["label"] for r in records],
            [r["ll_full"] for r in records],
            [r["ll_short"] for r in records],
            [r["char_lengths"] for r in records],
        )


class NextTokenScoring(ExampleScoring):
    """Next-token prediction: one full pass and one k-token pass per k; every alpha from those (paper §3)."""

    kind = "next_token"
    record_fields = ("id", "input", *NextTokenSweep.columns)

    def __init__(self, ks: Sequence[int], alphas: Sequence[float]):
        self.ks = list(ks)
        self.alphas = list(alphas)

    def signature(self) -> dict[str, Any]:
        return {"ks": self.ks, "alphas": self.alphas}

    def _fits(self, record: dict[str, Any], example: Example) -> bool:
        per_k = ("short_log_prob", "short_rank", "boosted_correct", "boosted_log_prob", "boosted_rank")
        if not all(isinstance(record[f], list) and len(record[f]) == len(self.ks) for f in per_k):
            return False
        per_alpha = ("boosted_correct", "boosted_log_prob", "boosted_rank")
        return all(
            isinstance(row, list) and len(row) == len(self.alphas) for f in per_alpha for row in record[f]
        )

    def new_sweep(self, split: TaskSplit) -> nn.Module:
        return NextTokenSweep(self.ks, self.alphas)

    def score(self, backend: Any, split: TaskSplit, examples: Sequence[Example]) -> list[dict[str, Any]]:
        enc = backend.encoder
        passages = [ex for ex in examples if isinstance(ex, NextTokenExample)]
        contexts, targets = [], []
        for ex in passages:
            ids = enc.context(ex.text)
            if len(ids) - len(enc.prefix) < 2:
                raise DataError(f"{split.name}: the passage at {ex.where} has fewer than 2 tokens")
            contexts.append(ids[:-1])
            targets.append(ids[-1])
        full = backend.next_token_log_probs(contexts)
        tgt = torch.tensor(targets, device=full.device)
        alphas = torch.tensor(self.alphas)
        full_lp = full.gather(1, tgt[:, None]).squeeze(1)
        full_rank = (full > full_lp[:, None]).sum(-1) + 1
        full_correct = full.argmax(-1) == tgt
        short_lp, short_rank, correct, log_prob, rank = [], [], [], [], []
        for k in self.ks:
            short = backend.last_k_log_probs(contexts, k, full=full)
            s_lp = short.gather(1, tgt[:, None]).squeeze(1)
            short_lp.append(s_lp)
            short_rank.append((short > s_lp[:, None]).sum(-1) + 1)
            sweep = next_token_alpha_sweep(full, short, tgt, alphas, "next_token")
            correct.append(sweep["correct"])
            log_prob.append(sweep["log_prob"])
            rank.append(sweep["rank"])
        stack = {
            "short_log_prob": torch.stack(short_lp, 1).tolist(),
            "short_rank": torch.stack(short_rank, 1).tolist(),
            "boosted_correct": torch.stack(correct, 1).int().tolist(),
            "boosted_log_prob": torch.stack(log_prob, 1).tolist(),
            "boosted_rank": torch.stack(rank, 1).tolist(),
        }
        return [
            {
                "id": ex.idx,
                "input": self.input_digest(ex),
                "target": targets[i],
                "full_log_prob": float(full_lp[i]),
                "full_rank": int(full_rank[i]),
                "full_correct": int(full_correct[i]),
                **{name: value[i] for name, value in stack.items()},
            }
            for i, ex in enumerate(passages)
        ]

    def update(self, sweep: Any, records: Sequence[dict[str, Any]]) -> None:
        sweep.update(
            [r["id"] for r in records],
            **{name: torch.tensor([r[name] for r in records]) for name in sweep.columns},
        )


SCORINGS: dict[str, type[ExampleScoring]] = {cls.kind: cls for cls in (ChoiceScoring, NextTokenScoring)}
