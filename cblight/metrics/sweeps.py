"""Accuracy sweeps over the boosting grid as torchmetrics (paper Tables 1, 4, 5; Figures 2, 4-6).

Both metrics keep one row per example in ``cat`` states, so after the cross-process sync every rank holds
every example; rows are then deduplicated by example id, because a distributed sampler pads each rank's
share with repeated examples (docs/design.md, "Metrics"). ``compute`` returns the accuracy curve over the whole grid,
derived from the cached per-example numbers without any model call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from cblight.boosting import choice_accuracy_curve


def first_occurrence(ids: torch.Tensor) -> torch.Tensor:
    """Indices of the first row of each distinct id, ordered by id."""
    if ids.numel() == 0:
        return ids.new_zeros(0)
    order = torch.argsort(ids, stable=True)
    sorted_ids = ids[order]
    keep = torch.ones_like(sorted_ids, dtype=torch.bool)
    keep[1:] = sorted_ids[1:] != sorted_ids[:-1]
    return order[keep]


class _ExampleTable(Metric):
    """A metric whose state is a table of per-example rows keyed by an integer id."""

    full_state_update = False
    higher_is_better = True
    columns: tuple[str, ...] = ()

    def table(self) -> dict[str, torch.Tensor]:
        """The synced rows, one per distinct id, ordered by id."""
        cols = {name: dim_zero_cat(getattr(self, name)) for name in ("ids", *self.columns)}
        keep = first_occurrence(cols["ids"])
        return {name: value[keep] for name, value in cols.items()}

    def grid_shape(self) -> tuple[int, ...]:
        return ()

    def shaped(self) -> dict[str, torch.Tensor]:
        """``compute()`` with its shapes: torchmetrics squeezes every one-element tensor of a ``compute``
        result, so a one-example table (or a one-value grid) would lose its axes."""
        out = self.compute()
        n = int(out["ids"].numel())
        for name in ("ids", *self.columns):
            out[name] = out[name].reshape(n, *dim_zero_cat(getattr(self, name)).shape[1:])
        for name in ("acc", "ppl"):
            if name in out:
                out[name] = out[name].reshape(self.grid_shape())
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
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.methods = list(methods)
        self.columns = (
            "labels",
            "ll_full",
            "ll_short",
            "char_lengths",
            *(f"method_{m}" for m in self.methods),
        )
        if not alphas:
            raise ValueError("the alpha grid is empty")
        if max_choices < 1:
            raise ValueError("max_choices must be at least 1")
        self.alphas = [float(a) for a in alphas]
        self.max_choices = max_choices
        self.length_normalize = length_normalize
        self.add_state("ids", default=[], dist_reduce_fx="cat")
        for name in self.columns:
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(
        self,
        ids: Sequence[int],
        labels: Sequence[int],
        ll_full: Sequence[Sequence[float]],
        ll_short: Sequence[Sequence[float]],
        char_lengths: Sequence[Sequence[int]],
        method_scores: Sequence[dict[str, Sequence[float]]] | None = None,
    ) -> None:
        n, c = len(ids), self.max_choices
        full = torch.full((n, c), -math.inf, dtype=torch.float64)
        short = torch.zeros((n, c), dtype=torch.float64)
        lengths = torch.ones((n, c), dtype=torch.float64)
        methods = {m: torch.full((n, c), -math.inf, dtype=torch.float64) for m in self.methods}
        if self.methods and (method_scores is None or len(method_scores) != n):
            raise ValueError(f"ChoiceSweep with methods {self.methods} needs method_scores for every example")
        for i in range(n):
            m = len(ll_full[i])
            if m > c:
                raise ValueError(f"example {ids[i]} has {m} choices, more than max_choices={c}")
            full[i, :m] = torch.tensor(ll_full[i], dtype=torch.float64)
            short[i, :m] = torch.tensor(ll_short[i], dtype=torch.float64)
            lengths[i, :m] = torch.tensor(char_lengths[i], dtype=torch.float64)
            for name, table in methods.items():
                assert method_scores is not None
                table[i, :m] = torch.tensor(method_scores[i][name], dtype=torch.float64)
        self.ids.append(torch.tensor(list(ids), dtype=torch.long, device=self.device))
        self.labels.append(torch.tensor(list(labels), dtype=torch.long, device=self.device))
        self.ll_full.append(full.to(self.device))
        self.ll_short.append(short.to(self.device))
        self.char_lengths.append(lengths.to(self.device))
        for name, table in methods.items():
            getattr(self, f"method_{name}").append(table.to(self.device))

    def grid_shape(self) -> tuple[int, ...]:
        return (len(self.alphas),)

    def curve(self, rows: dict[str, torch.Tensor], alphas: Sequence[float] | None = None) -> torch.Tensor:
        grid = torch.tensor(self.alphas if alphas is None else list(alphas), dtype=torch.float64)
        lengths = rows["char_lengths"] if self.length_normalize else None
        return choice_accuracy_curve(rows["ll_full"], rows["ll_short"], rows["labels"], grid, lengths)

    def compute(self) -> dict[str, torch.Tensor]:
        rows = self.table()
        if rows["ids"].numel() == 0:
            raise ValueError("ChoiceSweep has no examples")
        return {"acc": self.curve(rows), **rows}


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
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.methods = list(methods)
        self.columns = (
            *self.base_columns,
            *(("calibrated_pred", "calibrated_correct") if "calibrate" in self.methods else ()),
            *(self.adaptive_columns if adaptive else ()),
        )
        if not ks or not alphas:
            raise ValueError("the (k, alpha) grid is empty")
        self.ks = [int(k) for k in ks]
        self.alphas = [float(a) for a in alphas]
        self.add_state("ids", default=[], dist_reduce_fx="cat")
        for name in self.columns:
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def grid_shape(self) -> tuple[int, ...]:
        return (len(self.ks), len(self.alphas))

    def update(self, ids: Sequence[int], **columns: torch.Tensor) -> None:
        missing = set(self.columns) - set(columns)
        if missing:
            raise ValueError(f"NextTokenSweep.update needs {sorted(missing)}")
        self.ids.append(torch.tensor(list(ids), dtype=torch.long, device=self.device))
        for name in self.columns:
            value = torch.as_tensor(columns[name])
            if value.dtype == torch.bool:
                value = value.to(torch.uint8)  # bool tensors do not all-gather on every backend
            getattr(self, name).append(value.to(self.device))

    def compute(self) -> dict[str, torch.Tensor]:
        rows = self.table()
        if rows["ids"].numel() == 0:
            raise ValueError("NextTokenSweep has no examples")
        acc = rows["boosted_correct"].double().mean(dim=0)
        ppl = torch.exp(-rows["boosted_log_prob"].double().mean(dim=0))
        return {"acc": acc, "ppl": ppl, **rows}
