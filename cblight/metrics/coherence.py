"""Base-LM metrics of generated text: LTF, delta and perplexity (paper §4.1, Table 2).

For every generated token ``w_t`` of a document (prompt ``c``, generation ``g``):

* ``p_full = f(w_t | everything before it)``: prompt and generation so far;
* ``p_short = f(w_t | the k = 20 tokens before it)``; where ``k`` or fewer tokens precede ``w_t`` the short
  context is the whole prefix, so ``p_short = p_full`` (the authors' ``generation/metrics/likelihoods.py``:
  window ``tokens[max(0, t-20):t]`` over prompt + generation).

**LTF** is the fraction of generated tokens with ``p_full > 0.2`` and ``p_short < 0.05``; **delta** the mean
of ``p_full - p_short``; **perplexity** ``exp`` of the mean ``-log p_full``. All are micro-averages over
the tokens of the corpus. A special prefix (Llama's BOS) heads every context and every short window and is
never counted as context content (pass ``prefix=Encoder(tokenizer).prefix`` and contexts that start with it).

Cost: one batched full forward per batch of documents (LM head only from the first generated position),
plus one ``k``-token forward per generated position past the first ``k``, batched across the documents of
the batch, with logits only at the window's end (``cblight.batching.windowed_log_probs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cblight.batching import (
    eval_mode,
    input_device,
    logits_to_keep,
    right_pad,
    windowed_log_probs,
    windowed_positions,
)
from cblight.boosting import log_softmax32
from cblight.metrics.ragged import PaperMetric, score_once
from cblight.metrics.text_stats import TokenDocs, as_token_lists
from cblight.option_types import ClosedUnitInterval, PositiveInt, check_arguments

SHORT_CONTEXT = 20


@torch.no_grad()
def generated_token_log_probs(
    model: Any,
    contexts: TokenDocs,
    generations: TokenDocs,
    *,
    k: PositiveInt = SHORT_CONTEXT,
    prefix: Sequence[int] = (),
    batch_size: PositiveInt = 8,
    chunk_size: PositiveInt | None = None,
    pad_id: int = 0,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per document, ``(log p_full, log p_short)`` of its generated tokens (paper §4.1: what LTF, delta and
    perplexity read), with ``p_short`` on the ``k`` tokens before each token.

    Args:
        model: a Hugging Face causal LM.
        contexts: the prompt ids as the model read them, special prefix included (the authors' jsonl
            ``context``).
        generations: the generated ids (the authors' jsonl ``tokens``).
        k: the short context's length (the paper's 20).
        prefix: the tokenizer's special prefix (``cblight.scoring.Encoder(tokenizer).prefix``); it heads every
            context and short window and never counts as content.
        batch_size: documents per forward pass.
        chunk_size: short-context windows per forward pass (``None``: 32 on CPU, 256 on accelerators).
        pad_id: the id that pads a batch (masked out).

    Returns:
        One ``(full, short)`` pair of float32 CPU tensors per document, one value per generated token.

    Raises:
        ValueError: for unequal numbers of contexts and generations, a context with no token after the
            prefix or not starting with it, or a document longer than the model window.

    Examples:
        >>> import tempfile
        >>> from cblight.models import load_causal_lm
        >>> from cblight.tiny import build_tiny_gpt2
        >>> model = load_causal_lm(str(build_tiny_gpt2(tempfile.mkdtemp())))
        >>> prompt, continuation = [464, 3797, 3332, 319, 262], [2603, 13, 383]  # token ids
        >>> [(full, short)] = generated_token_log_probs(model, [prompt], [continuation], k=2)
        >>> full.shape, short.shape
        (torch.Size([3]), torch.Size([3]))
    """
    from cblight.models import model_window

    check_arguments(generated_token_log_probs, locals())
    ctxs = as_token_lists(contexts, "contexts")
    gens = as_token_lists(generations, "generations")
    prefix = [int(t) for t in prefix]
    if len(ctxs) != len(gens):
        raise ValueError(f"{len(ctxs)} contexts but {len(gens)} generations")
    window = model_window(model)
    for i, (ctx, gen) in enumerate(zip(ctxs, gens)):
        if len(ctx) <= len(prefix):
            raise ValueError(
                f"contexts[{i}] has no tokens after the special prefix: the first generated token "
                "needs a context (use Encoder.context for an empty prompt)"
            )
        if ctx[: len(prefix)] != prefix:
            raise ValueError(f"contexts[{i}] does not start with the special prefix {prefix}")
        if len(ctx) + len(gen) > window:
            raise ValueError(
                f"document {i} has {len(ctx) + len(gen)} tokens; the model reads at most {window} "
                "(cut the context from the left first)"
            )
    device = input_device(model)
    results = [(torch.empty(0), torch.empty(0)) for _ in range(len(ctxs))]
    order = sorted((i for i in range(len(ctxs)) if gens[i]), key=lambda i: -(len(ctxs[i]) + len(gens[i])))
    with eval_mode(model):
        for lo in range(0, len(order), batch_size):
            batch = order[lo : lo + batch_size]
            seqs = [ctxs[i] + gens[i] for i in batch]
            ids, mask = right_pad(seqs, pad_id, device)
            width = ids.shape[1]
            ctx_len = torch.tensor([len(ctxs[i]) for i in batch], device=device)
            wanted = (torch.arange(width, device=device).view(1, -1) >= ctx_len.view(-1, 1)) & mask.bool()
            rows, tgt_cols = torch.nonzero(wanted, as_tuple=True)

            # full context: logits from the position before the first generated token onwards
            keep = logits_to_keep(model, width - (int(ctx_len.min()) - 1))
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False, **keep).logits
            offset = width - logits.shape[1]
            targets = ids[rows, tgt_cols].view(-1, 1)
            full = log_softmax32(logits[rows, tgt_cols - 1 - offset]).gather(1, targets).squeeze(1)
            del logits

            # short context: windows only where more than k content tokens precede the target
            short = full.clone()
            w_rows, w_cols = windowed_positions(mask, k, wanted, n_prefix=len(prefix))
            lp = windowed_log_probs(model, ids, w_rows, w_cols, k, prefix=prefix, chunk_size=chunk_size)
            flat_index = torch.full((len(seqs), width), -1, dtype=torch.long, device=device)
            flat_index[rows, tgt_cols] = torch.arange(rows.numel(), device=device)
            short[flat_index[w_rows, w_cols]] = lp
            counts = [len(gens[i]) for i in batch]
            for i, f, s in zip(batch, full.cpu().split(counts), short.cpu().split(counts)):
                results[i] = (f, s)
    return results


class ContextSensitivity(PaperMetric):
    """LTF, delta and perplexity from per-token log-probabilities (paper Table 2 "δ %", "LTF %", "ppl").

    ``update(full_log_probs, short_log_probs)`` takes the generated tokens' ``log p_full`` and
    ``log p_short`` (tensors per document, or flat tensors; see ``generated_token_log_probs``).
    ``compute()`` gives ``{"ltf": ..., "delta": ..., "ppl": ...}``: LTF and delta as fractions.

    Args:
        full_threshold: a long-range token has ``p_full`` above this (the paper's 0.2).
        short_threshold: and ``p_short`` below this (the paper's 0.05).
        **kwargs: torchmetrics' ``Metric`` options.

    Examples:
        One token the full context makes likely and the short one does not (a long-range token), one the
        two agree on:

        >>> import torch
        >>> metric = ContextSensitivity()
        >>> metric.update(torch.tensor([0.5, 0.1]).log(), torch.tensor([0.01, 0.1]).log())
        >>> {name: round(float(value), 4) for name, value in metric.compute().items()}
        {'ltf': 0.5, 'delta': 0.245, 'ppl': 4.4721}
    """

    higher_is_better = None

    def __init__(
        self,
        full_threshold: ClosedUnitInterval = 0.2,
        short_threshold: ClosedUnitInterval = 0.05,
        **kwargs: Any,
    ):
        check_arguments(ContextSensitivity.__init__, locals())
        super().__init__(**kwargs)
        self.full_threshold, self.short_threshold = full_threshold, short_threshold
        self.add_sums("tokens", "long_dependent")
        self.add_sums("delta_sum", "nll_sum", dtype=torch.float64)

    def update(
        self,
        full_log_probs: torch.Tensor | Sequence[torch.Tensor],
        short_log_probs: torch.Tensor | Sequence[torch.Tensor],
    ) -> None:
        full, short = _flat(full_log_probs).to(self.device), _flat(short_log_probs).to(self.device)
        if full.shape != short.shape:
            raise ValueError(f"{full.numel()} full-context log-probs but {short.numel()} short-context ones")
        if not (torch.isfinite(full).all() and torch.isfinite(short).all()):
            raise ValueError("log-probabilities must be finite (a generated token had probability 0)")
        p_full, p_short = full.exp(), short.exp()
        self.tokens += full.numel()
        self.long_dependent += int(((p_full > self.full_threshold) & (p_short < self.short_threshold)).sum())
        self.delta_sum += (p_full - p_short).sum()
        self.nll_sum -= full.sum()

    def compute(self) -> dict[str, torch.Tensor]:
        if int(self.tokens) == 0:
            raise ValueError("LTF/delta/perplexity need at least one generated token; none were given")
        n = self.tokens.double()
        return {
            "ltf": self.long_dependent.double() / n,
            "delta": self.delta_sum / n,
            "ppl": torch.exp(self.nll_sum / n),
        }


def _flat(values: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """Log-probabilities given per document (or flat) as one float64 vector."""
    parts = [values] if isinstance(values, torch.Tensor) else list(values)
    empty = torch.empty(0, dtype=torch.float64)
    return torch.cat([torch.as_tensor(v).detach().double().reshape(-1) for v in parts] or [empty])


def context_sensitivity(
    model: Any, contexts: TokenDocs, generations: TokenDocs, **options: Any
) -> dict[str, float]:
    """LTF, delta and perplexity of generated documents under ``model`` (Table 2's three base-LM columns),
    LTF and delta as fractions.

    Args:
        model: a Hugging Face causal LM (the base model of the table).
        contexts: the prompt ids as the model read them, special prefix included.
        generations: the generated ids.
        **options: the keywords of ``generated_token_log_probs`` (``k``, ``prefix``, ``batch_size``, ...).

    Returns:
        ``{"ltf": ..., "delta": ..., "ppl": ...}``.
    """
    scored = generated_token_log_probs(model, contexts, generations, **options)
    return score_once(ContextSensitivity(), [f for f, _ in scored], [s for _, s in scored])
