"""Variable-length sequences as torchmetrics states that sync exactly across processes.

Corpus-level metrics whose value is not a sum of per-example numbers (NIST's information weights, distinct
n-grams, entropy, Zipf's rank-frequency fit, self-BLEU) keep the sequences themselves: a flat ``long``
tensor of values plus one of lengths, both ``cat``-reduced, so the synced corpus equals the single-process
corpus (ranks concatenated in rank order). Texts are stored as their UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat
from torchmetrics.utilities.distributed import gather_all_tensors


def gather_long_states(result: torch.Tensor, group: Any | None = None) -> list[torch.Tensor]:
    """``gather_all_tensors`` that keeps the empty placeholder of a rank without data in ``long``.

    torchmetrics stands in an empty float tensor for an empty list state; gathered beside the ``long``
    tensors of the other ranks it would mismatch dtypes. Every list state of these metrics is ``long``.
    """
    if result.numel() == 0 and result.is_floating_point():
        result = result.long()
    return gather_all_tensors(result, group)


class RaggedMetric(Metric):
    """A ``Metric`` with helpers for ragged ``cat`` states (see the module docstring)."""

    is_differentiable = False
    full_state_update = False

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("dist_sync_fn", gather_long_states)
        super().__init__(**kwargs)

    def add_ragged_state(self, name: str) -> None:
        self.add_state(f"{name}_values", default=[], dist_reduce_fx="cat")
        self.add_state(f"{name}_lengths", default=[], dist_reduce_fx="cat")

    def append_ragged(self, name: str, seqs: Sequence[Sequence[int]]) -> None:
        lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long, device=self.device)
        values = torch.tensor([x for s in seqs for x in s], dtype=torch.long, device=self.device)
        getattr(self, f"{name}_values").append(values)
        getattr(self, f"{name}_lengths").append(lengths)

    def _longs(self, name: str) -> torch.Tensor:
        # a process without data holds an empty list (nothing to cat), or after a sync its float placeholder
        state = getattr(self, name)
        return dim_zero_cat(state).long() if len(state) else torch.empty(0, dtype=torch.long)

    def read_ragged(self, name: str) -> list[list[int]]:
        values = self._longs(f"{name}_values")
        lengths = self._longs(f"{name}_lengths")
        return [chunk.tolist() for chunk in values.cpu().split(lengths.cpu().tolist())]

    def append_texts(self, name: str, texts: Sequence[str]) -> None:
        self.append_ragged(name, [list(t.encode("utf-8")) for t in texts])

    def read_texts(self, name: str) -> list[str]:
        return [bytes(b).decode("utf-8") for b in self.read_ragged(name)]

    def append_longs(self, name: str, values: Sequence[int]) -> None:
        getattr(self, name).append(torch.tensor(list(values), dtype=torch.long, device=self.device))

    def read_longs(self, name: str) -> list[int]:
        return self._longs(name).tolist()
