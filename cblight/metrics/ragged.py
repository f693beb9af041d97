"""The base of the paper's metrics: sum states, variable-length sequences as torchmetrics states that sync
exactly across processes, and the one-call scoring of a metric that every functional form uses.

Corpus-level metrics whose value is not a sum of per-example numbers (NIST's information weights, distinct
n-grams, entropy, Zipf's rank-frequency fit, self-BLEU) keep the sequences themselves: a flat ``long``
tensor of values plus one of lengths, both ``cat``-reduced, so the synced corpus equals the single-process
corpus (ranks concatenated in rank order). Texts are stored as their UTF-8 bytes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat
from torchmetrics.utilities.distributed import gather_all_tensors


def score_once(metric: Metric, *inputs: Any) -> Any:
    """``metric``'s value over one corpus in memory, as ``float``s: the functional form of a metric."""
    metric.update(*inputs)
    value = metric.compute()
    return {k: float(v) for k, v in value.items()} if isinstance(value, dict) else float(value)


def gather_long_states(result: torch.Tensor, group: Any | None = None) -> list[torch.Tensor]:
    """``gather_all_tensors`` that keeps the empty placeholder of a rank without data in ``long``.

    torchmetrics stands in an empty float tensor for an empty list state; gathered beside the ``long``
    tensors of the other ranks it would mismatch dtypes. Every list state of these metrics is ``long``.
    """
    return gather_all_tensors(result.long() if result.numel() == 0 else result, group)


class PaperMetric(Metric):
    """A metric of the paper's tables: not differentiable, each update independent of the state so far."""

    is_differentiable = False
    full_state_update = False

    def add_sums(self, *names: str, size: int | None = None, dtype: torch.dtype = torch.long) -> None:
        """Add zero states (scalars, or vectors of ``size``) summed across processes.

        Args:
            *names: the states' names (attributes of the metric).
            size: the length of vector states; ``None``: scalars.
            dtype: the states' dtype.

        Returns:
            None; the states are registered on the metric (``Metric.add_state``, reduced by ``sum``).
        """
        for name in names:
            default = torch.zeros(() if size is None else size, dtype=dtype)
            self.add_state(name, default=default, dist_reduce_fx="sum")


class RaggedMetric(PaperMetric):
    """A ``Metric`` with helpers for ragged ``cat`` states (see the module docstring)."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("dist_sync_fn", gather_long_states)
        super().__init__(**kwargs)

    def add_ragged_state(self, name: str) -> None:
        self.add_state(f"{name}_values", default=[], dist_reduce_fx="cat")
        self.add_state(f"{name}_lengths", default=[], dist_reduce_fx="cat")

    def append_ragged(self, name: str, seqs: Sequence[Sequence[int]]) -> None:
        self.append_longs(f"{name}_values", [x for s in seqs for x in s])
        self.append_longs(f"{name}_lengths", [len(s) for s in seqs])

    def read_ragged(self, name: str) -> list[list[int]]:
        values = iter(self.read_longs(f"{name}_values"))
        return [list(itertools.islice(values, n)) for n in self.read_longs(f"{name}_lengths")]

    def append_texts(self, name: str, texts: Sequence[str]) -> None:
        self.append_ragged(name, [list(t.encode("utf-8")) for t in texts])

    def read_texts(self, name: str) -> list[str]:
        return [bytes(b).decode("utf-8") for b in self.read_ragged(name)]

    def append_longs(self, name: str, values: Sequence[int]) -> None:
        getattr(self, name).append(torch.tensor(list(values), dtype=torch.long, device=self.device))

    def read_longs(self, name: str) -> list[int]:
        # a process without data holds an empty list (nothing to cat), or after a sync its float placeholder
        state = getattr(self, name)
        return dim_zero_cat(state).long().tolist() if len(state) else []
