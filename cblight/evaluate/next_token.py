"""How one batch of examples is scored: the per-example numbers every sweep is computed from.

One class per task kind turns examples into cache records with one forward pass per context form
(DESIGN.md §5) and feeds those records to the kind's sweep metric:

* ``ChoiceScoring`` (paper eq. 2, Table 4; ``cblight.evaluate.multiple_choice``): every choice's
  log-likelihood after the full and after the premise-free context;
* ``NextTokenScoring`` (paper §3, Tables 1 and 5; here): the target's log-prob and rank under ``f_max``,
  each ``f_k`` and the boosted mix at every (k, alpha) of the grid.

Both also compute the comparison methods of Tables 5, 11 and 12 that a run asks for
(``cblight.evaluate.methods``): PMI_DC, contextual calibration and the noisy channel.

They talk to the model only through a *backend* with ``Scorer``'s interface (``score_text``,
``encoder``, ``next_token_log_probs``, ``last_k_log_probs``), so another backend (``cblight.served``)
or another scoring method (a new ``ExampleScoring`` subclass, picked in ``BoostedEvaluator._scoring``)
plugs in without touching the Lightning loop (``cblight.evaluate.boosted_evaluator``) or the selection and report
(``cblight.evaluate.selection``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from cblight.boosting import next_token_alpha_sweep
from cblight.data.datamodule import TaskSplit
from cblight.data.examples import DataError, Example, NextTokenExample
from cblight.evaluate.baselines import calibrated_next_token
from cblight.evaluate.methods import BaselineOptions, not_applicable
from cblight.metrics.sweeps import NextTokenSweep
from cblight.results import digest


class ExampleScoring(ABC):
    """One task kind's scoring: records from examples, and the sweep metric those records update.

    ``signature`` holds the settings that change the cached numbers (a cache written under others is
    refused); ``record_fields`` are the keys every record of this kind must carry (a cache row without
    them is corrupt and recomputed).
    """

    kind: ClassVar[str] = ""
    record_fields: ClassVar[tuple[str, ...]] = ("id", "input")

    def signature(self) -> dict[str, Any]:
        return {}

    @abstractmethod
    def new_sweep(self, split: TaskSplit) -> nn.Module: ...

    methods: Sequence[str] = ()  # the comparison methods this scoring adds to boosting

    @abstractmethod
    def method_digest(self, method: str, example: Example) -> str:
        """A digest of what ``method`` feeds the model for ``example`` (kept in the record)."""
        ...

    def describe(self, split: TaskSplit, requested: Sequence[str]) -> dict[str, Any]:
        """What ``results.json`` says about each requested comparison method: reported (with the strings
        it used) or why not."""
        info: dict[str, Any] = {}
        for m in requested:
            reason = not_applicable(m, split)
            info[m] = {"reported": True} if reason is None else {"reported": False, "not_applicable": reason}
        return info

    def missing(self, record: dict[str, Any] | None, example: Example) -> list[str]:
        """The parts of ``record`` to (re)compute for ``example``: ``boost`` (everything, for a new or
        changed example) or the methods whose inputs changed; empty when the record is complete."""
        if not self.matches(record, example):
            return ["boost", *self.methods]
        assert record is not None
        done = record.get("method_inputs", {})
        return [m for m in self.methods if done.get(m) != self.method_digest(m, example)]

    @abstractmethod
    def score(
        self,
        backend: Any,
        split: TaskSplit,
        examples: Sequence[Example],
        previous: dict[int, dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """Records of ``examples``; ``previous`` holds their cached records (parts still valid are kept)."""
        ...

    @abstractmethod
    def update(self, sweep: Any, records: Sequence[dict[str, Any]]) -> None: ...

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


class NextTokenScoring(ExampleScoring):
    """Next-token prediction: one full pass and one k-token pass per k; every alpha from those (paper §3).

    With ``calibrate`` (LAMA, Table 5's "Zhao et al." row) the full distribution is also calibrated as
    Zhao et al.'s ``run_lama.py`` does (``cblight.evaluate.baselines.calibrated_next_token``), with one pass per
    relation template and content-free input; the record keeps the calibrated prediction.
    """

    kind = "next_token"
    record_fields = ("id", "input", *NextTokenSweep.base_columns)

    def __init__(
        self,
        ks: Sequence[int],
        alphas: Sequence[float],
        methods: Sequence[str] = (),
        options: BaselineOptions | None = None,
    ):
        self.ks = list(ks)
        self.alphas = list(alphas)
        self.methods = [m for m in methods if m != "boost"]
        self.options = options or BaselineOptions()
        self.content_free = self.options.content_free("next_token")
        self._cf: dict[str, torch.Tensor] = {}

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
        return NextTokenSweep(self.ks, self.alphas, methods=self.methods)

    def method_digest(self, method: str, ex: Example) -> str:
        assert isinstance(ex, NextTokenExample)
        return digest(repr((ex.template, self.content_free, self.options.calibrate_top_n)))

    def describe(self, split: TaskSplit, requested: Sequence[str]) -> dict[str, Any]:
        info = super().describe(split, requested)
        if "calibrate" in self.methods:
            info["calibrate"]["content_free_inputs"] = self.content_free
        return info

    def missing(self, record: dict[str, Any] | None, ex: Example) -> list[str]:
        stale = super().missing(record, ex)
        return ["boost", *self.methods] if stale else []  # calibration needs the full pass again

    def _calibrated(
        self, backend: Any, passages: Sequence[NextTokenExample], full: torch.Tensor
    ) -> list[int]:
        enc = backend.encoder
        new = sorted({ex.template for ex in passages} - set(self._cf))
        if new:
            prompts = [enc.context(t.replace("[X]", cf)) for t in new for cf in self.content_free]
            lp = backend.next_token_log_probs(prompts).view(len(new), len(self.content_free), -1)
            self._cf.update({t: lp[i] for i, t in enumerate(new)})
        cf = torch.stack([self._cf[ex.template].to(full.device) for ex in passages])
        return calibrated_next_token(full, cf, self.options.calibrate_top_n, reduce="min").tolist()

    def score(
        self,
        backend: Any,
        split: TaskSplit,
        examples: Sequence[Example],
        previous: dict[int, dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
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
        calibrated = self._calibrated(backend, passages, full) if "calibrate" in self.methods else None
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
                **(
                    {
                        "calibrated_pred": calibrated[i],
                        "calibrated_correct": int(calibrated[i] == targets[i]),
                        "method_inputs": {"calibrate": self.method_digest("calibrate", ex)},
                    }
                    if calibrated is not None
                    else {}
                ),
            }
            for i, ex in enumerate(passages)
        ]

    def update(self, sweep: Any, records: Sequence[dict[str, Any]]) -> None:
        sweep.update(
            [r["id"] for r in records],
            **{name: torch.tensor([r[name] for r in records]) for name in sweep.columns},
        )
