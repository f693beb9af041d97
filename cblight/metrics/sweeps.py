"""Accuracy sweeps over the boosting grid as torchmetrics (paper Tables 1, 4, 5; Figures 2, 4-6).

Both metrics keep one row per example in ``cat`` states, so after the cross-process sync every rank holds
every example; rows are then deduplicated by example id, because a distributed sampler pads each rank's
share with repeated examples. ``compute`` returns the accuracy curve over the whole grid,
derived from the cached per-example numbers without any model call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from cblight.boosting import choice_accuracy_curve


def padded(rows: Sequence[Sequence[float]], width: int, fill: float) -> torch.Tensor:
    """``rows`` as a float64 ``[len(rows), width]`` table, each row padded with ``fill``."""
    out = torch.full((len(rows), width), fill, dtype=torch.float64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
    return out


class _ExampleTable(Metric):
    """A metric whose state is a table of per-example rows keyed by an integer id: ``columns`` (one
    ``cat`` state each, beside ``ids``; ``update(ids, **columns)`` appends rows) and the shape of the grid
    its ``compute`` sweeps."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, columns: Sequence[str], grid_shape: tuple[int, ...], **kwargs: Any):
        super().__init__(**kwargs)
        self.columns, self.grid_shape = tuple(columns), grid_shape
        for name in ("ids", *self.columns):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, ids: Sequence[int], **columns: Any) -> None:
        self.ids.append(torch.tensor(list(ids), dtype=torch.long, device=self.device))
        for name in self.columns:
            value = torch.as_tensor(columns[name])
            if value.dtype == torch.bool:
                value = value.to(torch.uint8)  # bool tensors do not all-gather on every backend
            getattr(self, name).append(value.to(self.device))

    def table(self) -> dict[str, torch.Tensor]:
        """The synced rows, one per distinct id (its first row), ordered by id."""
        cols = {name: dim_zero_cat(getattr(self, name)) for name in ("ids", *self.columns)}
        _, inverse = torch.unique(cols["ids"], return_inverse=True)
        rows = torch.arange(inverse.numel(), device=inverse.device)
        first = torch.full((int(inverse.max()) + 1,), inverse.numel(), device=inverse.device)
        first = first.scatter_reduce(0, inverse, rows, "amin")
        return {name: value[first] for name, value in cols.items()}

    def shaped(self) -> dict[str, torch.Tensor]:
        """``compute()`` with its shapes: torchmetrics squeezes every one-element tensor of a ``compute``
        result, so a one-example table (or a one-value grid) would lose its axes."""
        out = self.compute()
        n = int(out["ids"].numel())
        for name in ("ids", *self.columns):
            out[name] = out[name].reshape(n, *dim_zero_cat(getattr(self, name)).shape[1:])
        for name in ("acc", "ppl"):
            if name in out:
                out[name] = out[name].reshape(self.grid_shape)
        return out


class ChoiceSweep(_ExampleTable):
    """Multiple-choice accuracy over an alpha grid from cached log-likelihoods (paper eq. 2).

    Rows: example id, label, and per choice ``log f(a | full)``, ``log f(a | premise-free)`` and the answer's
    length in characters; with ``methods`` (the comparison methods of Tables 11/12), each method's
    per-choice score as column ``method_<name>``. Choices beyond an example's own count are padded (``-inf``
    full score and method scores) up to ``max_choices``. ``compute`` returns ``{"acc": [A] float64}`` plus
    the deduplicated, synced table.
    """

    def __init__(
        self,
        alphas: Sequence[float],
        max_choices: int,
        length_normalize: bool = False,
        methods: Sequence[str] = (),
        **kwargs: Any,
    ):
        columns = ("labels", "ll_full", "ll_short", "char_lengths", *(f"method_{m}" for m in methods))
        super().__init__(columns, (len(alphas),), **kwargs)
        self.methods = list(methods)
        self.alphas = [float(a) for a in alphas]
        self.max_choices, self.length_normalize = max_choices, length_normalize

    def update(
        self,
        ids: Sequence[int],
        labels: Sequence[int],
        ll_full: Sequence[Sequence[float]],
        ll_short: Sequence[Sequence[float]],
        char_lengths: Sequence[Sequence[int]],
        method_scores: Sequence[dict[str, Sequence[float]]] | None = None,
    ) -> None:
        c = self.max_choices
        columns = {
            "labels": torch.tensor(list(labels), dtype=torch.long),
            "ll_full": padded(ll_full, c, -math.inf),
            "ll_short": padded(ll_short, c, 0.0),
            "char_lengths": padded(char_lengths, c, 1.0),
        }
        for m in self.methods:
            columns[f"method_{m}"] = padded([scores[m] for scores in method_scores], c, -math.inf)
        super().update(ids, **columns)

    def compute(self) -> dict[str, torch.Tensor]:
        rows = self.table()
        grid = torch.tensor(self.alphas, dtype=torch.float64)
        lengths = rows["char_lengths"] if self.length_normalize else None
        acc = choice_accuracy_curve(rows["ll_full"], rows["ll_short"], rows["labels"], grid, lengths)
        return {"acc": acc, **rows}


class NextTokenSweep(_ExampleTable):
    """Next-token accuracy and boosted perplexity over a (k, alpha) grid (paper Tables 1 and 5).

    Rows: example id; the target's log-prob/rank/correctness under ``f_max``; its log-prob and rank under
    each ``f_k``; and, for every (k, alpha), correctness, log-prob and rank under the normalised boosted
    model; with ``methods=["calibrate"]`` (LAMA, Table 5) also ``calibrated_pred`` and ``calibrated_correct``;
    with ``adaptive`` a label-free rule's ``k``, alpha, correctness, log-prob and rank. ``compute`` returns
    ``{"acc": [K, A], "ppl": [K, A]}`` plus the deduplicated, synced table.
    """

    base_columns = (
        "target",
        "full_log_prob",
        "full_rank",
        "full_correct",
        "short_log_prob",
        "short_rank",
        "boosted_correct",
        "boosted_log_prob",
        "boosted_rank",
    )

    adaptive_columns = (
        "adaptive_k",
        "adaptive_alpha",
        "adaptive_correct",
        "adaptive_log_prob",
        "adaptive_rank",
        "adaptive_grid_correct",
        "adaptive_grid_log_prob",
    )

    def __init__(
        self,
        ks: Sequence[int],
        alphas: Sequence[float],
        methods: Sequence[str] = (),
        adaptive: bool = False,
        **kwargs: Any,
    ):
        columns = (
            *self.base_columns,
            *(("calibrated_pred", "calibrated_correct") if "calibrate" in methods else ()),
            *(self.adaptive_columns if adaptive else ()),
        )
        super().__init__(columns, (len(ks), len(alphas)), **kwargs)

    def compute(self) -> dict[str, torch.Tensor]:
        rows = self.table()
        acc = rows["boosted_correct"].double().mean(dim=0)
        ppl = torch.exp(-rows["boosted_log_prob"].double().mean(dim=0))
        return {"acc": acc, "ppl": ppl, **rows}
