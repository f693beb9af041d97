"""Padding, position ids and forward passes over batches of token ids: the tensor plumbing shared by
scoring, generation, the coherence metrics and tuning (docs/design.md, "Mathematics" and "Speed floors").

* ``left_pad`` / ``right_pad`` / ``positions_from_mask``: batches whose padded rows start at position 0,
  so a short context sits where it would as the whole input (explicit ``position_ids``);
* ``last_position_log_probs``: the next-token distribution ``f`` after each row, logits only at the end;
* ``windowed_log_probs``: per-position short-context distributions ``f_k`` along whole sequences (LTF and
  delta, the coherence-tuning teacher; paper eq. 1's ``f_k``), one ``k``-token forward per position.

Log-softmax is taken in float32 whatever the model dtype. No Lightning or Hub imports.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from cblight.boosting import log_softmax32
from cblight.option_types import PositiveInt


def _forward_parameters(model: Any) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}


def logits_to_keep(model: Any, n: int) -> dict[str, int]:
    """The keyword argument that sends only the last ``n`` positions through the LM head
    (``logits_to_keep=n``), where the model's ``forward`` takes it; none where it does not."""
    params = _forward_parameters(model)
    takes = "logits_to_keep" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )
    return {"logits_to_keep": n} if takes else {}


@contextlib.contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """``model`` in eval mode (no dropout) inside the block; its own mode is restored on leaving it."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def input_device(model: Any) -> torch.device:
    """Where the model's input ids go: its embedding's device (the first device of a sharded model)."""
    try:
        return model.get_input_embeddings().weight.device
    except AttributeError:
        return next(model.parameters()).device


def cache_argument(model: Any) -> str:
    """The keyword a model's ``forward`` takes its KV cache by: ``cache`` in recent transformers (which warn
    on every call given the older ``past_key_values``), else ``past_key_values``."""
    return "cache" if "cache" in _forward_parameters(model) else "past_key_values"


def output_cache(out: Any) -> Any:
    """The KV cache a forward returned, under either transformers' name (reading the old name warns)."""
    keys = out.keys() if hasattr(out, "keys") else ()
    return out["cache"] if "cache" in keys else getattr(out, "past_key_values", None)


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``[B, L]`` ids and attention mask: the right-padded reversed rows, reversed."""
    ids, mask = right_pad([list(s)[::-1] for s in seqs], pad_id, device)
    return ids.flip(1), mask.flip(1)


def right_pad(seqs: Sequence[Sequence[int]], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``[B, L]`` ids and attention mask."""
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):  # an empty row stays all padding
        ids[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids.to(device), mask.to(device)


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count only real tokens, so a left-padded row starts at position 0."""
    return (mask.cumsum(-1) - 1).clamp_min(0)


def last_position_log_probs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
) -> torch.Tensor:
    """float32 next-token log-probs at the last column of a (left-padded) batch, ``[B, V]``.

    Only the last position goes through the LM head (``logits_to_keep=1``) where the model supports it.
    """
    if attention_mask is not None and "position_ids" not in kwargs:
        kwargs["position_ids"] = positions_from_mask(attention_mask)
    kwargs.update(logits_to_keep(model, 1))
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
    return log_softmax32(out.logits[:, -1, :])


def windowed_positions(
    attention_mask: torch.Tensor, k: int, wanted: torch.Tensor, n_prefix: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, cols)`` of the wanted positions ``t`` whose real content before ``t`` (special prefix
    excluded) is longer than ``k`` tokens. At every other wanted position ``f_k == f_max``."""
    cols = torch.arange(attention_mask.shape[1], device=attention_mask.device).view(1, -1)
    starts = torch.where(attention_mask.bool(), cols, attention_mask.shape[1]).min(dim=1).values  # first real
    content_before = cols - starts.view(-1, 1) - n_prefix
    need = wanted.bool() & attention_mask.bool() & (content_before > k)
    return torch.nonzero(need, as_tuple=True)


def default_window_chunk(device: torch.device) -> int:
    """Short-context windows per forward pass: 32 on CPU, 256 on accelerators.

    On CPU a chunk's activations (``[windows, k, 4 x width]`` in the MLP) must stay in cache: for GPT-2
    small with k = 20, 32 windows ran the LTF/delta pass 1.3x faster than 256 (2 cores, 4 documents of
    100 tokens); GPUs want large batches.
    """
    return 32 if torch.device(device).type == "cpu" else 256


def windowed_log_probs(
    model: Any,
    input_ids: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    k: PositiveInt,
    *,
    prefix: Sequence[int] = (),
    gather_targets: bool = True,
    chunk_size: PositiveInt | None = None,
) -> torch.Tensor:
    """``log f_k`` of the token at each ``(row, col)`` given only the ``k`` tokens before it.

    Each window is ``prefix + input_ids[row, col-k:col]`` at positions ``0..``; windows run in chunks of
    ``chunk_size`` (default: :func:`default_window_chunk`) with logits only at their last position, so
    memory never holds ``[windows, k, V]``.
    Returns ``[N]`` target log-probs (``gather_targets``) or ``[N, V]`` distributions, float32.
    """
    if rows.numel() == 0:
        shape = (0,) if gather_targets else (0, int(model.get_output_embeddings().weight.shape[0]))
        return torch.empty(shape, dtype=torch.float32, device=input_ids.device)
    chunk_size = chunk_size or default_window_chunk(input_ids.device)
    offsets = torch.arange(-k, 0, device=input_ids.device)
    prefix_t = torch.as_tensor(list(prefix), dtype=torch.long, device=input_ids.device)
    pieces: list[torch.Tensor] = []
    with torch.no_grad():
        for lo in range(0, rows.numel(), chunk_size):
            r, c = rows[lo : lo + chunk_size], cols[lo : lo + chunk_size]
            windows = input_ids[r.view(-1, 1), c.view(-1, 1) + offsets.view(1, -1)]  # [n, k]
            if prefix_t.numel():
                windows = torch.cat([prefix_t.view(1, -1).expand(windows.shape[0], -1), windows], dim=1)
            lp = last_position_log_probs(model, windows)
            if gather_targets:
                lp = lp.gather(1, input_ids[r, c].view(-1, 1)).squeeze(1)
            pieces.append(lp)
    return torch.cat(pieces, dim=0)
