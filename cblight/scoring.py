"""Batched log-likelihoods from any Hugging Face causal LM (docs/design.md, "Mathematics" and "Speed floors").

* ``Scorer.score_choices``: log f(continuation | context) for groups of continuations sharing one context
  (the choices of a question), token by token with greedy flags. The context of a group is encoded once
  and its KV cache fanned out to the choices, where the model's cache allows it.
* ``Scorer.next_token_log_probs`` / ``Scorer.last_k_log_probs``: the next-token distribution after a
  whole context (``f_max``) and after its last ``k`` tokens (``f_k``), batched.

(Padding, position ids and the windowed per-position passes are in ``cblight.batching``.)

Token boundaries follow lm-evaluation-harness: the continuation is what ``encode(context + continuation)``
holds after the tokens of ``encode(context)``; trailing spaces of the context move into the continuation.
Short contexts sit at positions ``0..k-1`` exactly as if they were the whole input (left padding comes with
explicit ``position_ids``). Log-softmax is taken in float32 whatever the model dtype.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from cblight.batching import (
    cache_argument,
    input_device,
    last_position_log_probs,
    left_pad,
    logits_to_keep,
    output_cache,
    positions_from_mask,
    right_pad,
)
from cblight.boosting import log_softmax32, short_context_ids
from cblight.errors import CblightError
from cblight.option_types import PositiveInt, check_arguments

__all__ = [
    "BatchSize",
    "ContinuationScore",
    "Encoder",
    "Scorer",
    "ScoringError",
    "empty_context_ids",
    "special_prefix",
]

log = logging.getLogger(__name__)

#: Sequences per forward pass, a positive integer or ``"auto"`` (halves on CUDA out-of-memory).
BatchSize = PositiveInt | Literal["auto"]


class ScoringError(CblightError):
    """An input that cannot be scored (e.g. a continuation longer than the model window)."""


# ---------------------------------------------------------------------------------------------------------
# Tokenisation


def special_prefix(tokenizer: Any) -> list[int]:
    """Special tokens the tokenizer puts in front of every text (Llama's BOS; nothing for GPT-2).

    Args:
        tokenizer: a Hugging Face tokenizer.

    Returns:
        The prefix's token ids, empty when there is none.

    Examples:
        >>> from cblight.tiny import gpt2_tokenizer
        >>> special_prefix(gpt2_tokenizer())
        []
    """
    probe = tokenizer("a", add_special_tokens=True)["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    specials = set(tokenizer.all_special_ids)
    return list(itertools.takewhile(specials.__contains__, probe[: max(0, len(probe) - len(plain))]))


def empty_context_ids(tokenizer: Any, prefix: Sequence[int]) -> list[int]:
    """The token(s) standing for an empty context: the special prefix, else BOS, else EOS (docs/design.md, "Mathematics").

    Args:
        tokenizer: a Hugging Face tokenizer.
        prefix: its special prefix (``special_prefix``).

    Returns:
        The token ids of the empty context.

    Raises:
        ~cblight.scoring.ScoringError: when there is no prefix and the tokenizer has neither BOS nor EOS.

    Examples:
        >>> from cblight.tiny import gpt2_tokenizer
        >>> empty_context_ids(gpt2_tokenizer(), [])  # GPT-2's <|endoftext|>
        [50256]
    """
    if prefix:
        return list(prefix)
    tok = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if tok is None:
        raise ScoringError("an empty context needs a BOS or EOS token, and the tokenizer has neither")
    return [int(tok)]


class Encoder:
    """Tokenisation with the conventions of the module docstring, shared by scoring and generation.

    Args:
        tokenizer: a Hugging Face tokenizer.

    Examples:
        >>> from cblight.tiny import gpt2_tokenizer
        >>> encoder = Encoder(gpt2_tokenizer())
        >>> encoder.context("Hello world"), encoder.context("")
        ([15496, 995], [50256])
        >>> encoder.pair("The cat sat on the ", "mat")  # the trailing space moves into the continuation
        ([464, 3797, 3332, 319, 262], [2603])
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.prefix = special_prefix(tokenizer)

    def body(self, text: str) -> list[int]:
        # verbose=False: no "sequence length is longer than the specified maximum" warning for a text longer
        # than the model window; it is cut to fit before any forward pass (Scorer, cblight.truncation)
        return list(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def context(self, text: str) -> list[int]:
        """Context ids: the special prefix plus the text; an empty text is BOS/EOS alone.

        Args:
            text: the context.

        Returns:
            Its token ids.
        """
        body = self.body(text) if text else []
        return self.prefix + body if body else empty_context_ids(self.tokenizer, self.prefix)

    def pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """``(context_ids, continuation_ids)`` split as lm-evaluation-harness does: the continuation is what
        ``encode(context + continuation)`` holds after the tokens of the context, trailing spaces of the context
        moved into the continuation.

        Args:
            context: the context text.
            continuation: the text scored after it.

        Returns:
            The context's ids (with the special prefix; BOS/EOS alone for an empty context) and the
            continuation's ids.

        Raises:
            ~cblight.scoring.ScoringError: when the continuation encodes to no tokens.
        """
        stripped = context.rstrip(" ")
        context, continuation = stripped, context[len(stripped) :] + continuation
        ctx_body = self.body(context) if context else []
        cont = self.body(context + continuation)[len(ctx_body) :]
        if not cont:
            raise ScoringError(f"continuation {continuation!r} encodes to no tokens after its context")
        ctx = self.prefix + ctx_body if ctx_body else empty_context_ids(self.tokenizer, self.prefix)
        return ctx, cont


# ---------------------------------------------------------------------------------------------------------
# Continuation scores


@dataclass(frozen=True)
class ContinuationScore:
    """Log-likelihood of one continuation: its sum, per-token values, and whether greedy decoding
    would have produced every one of its tokens.

    Args:
        log_prob: the sum of the token log-probabilities.
        token_log_probs: each continuation token's log-probability.
        is_greedy: whether every continuation token is the model's argmax at its position.
    """

    log_prob: float
    token_log_probs: tuple[float, ...]
    is_greedy: bool

    @property
    def num_tokens(self) -> int:
        return len(self.token_log_probs)


@dataclass
class _Group:
    index: int
    context: list[int]
    continuations: list[list[int]]


class TextScorer(Protocol):
    """What multiple-choice scoring needs of a model, here (``Scorer``) or on a server
    (``cblight.served.ServedScorer``): each continuation's log-likelihood after its context."""

    def score_text(
        self, groups: Sequence[tuple[str, Sequence[str]]], names: Sequence[str] | None = None
    ) -> list[list[ContinuationScore]]: ...


class Scorer:
    """Batched scoring with one model; see the module docstring.

    Args:
        model: a Hugging Face causal LM.
        tokenizer: its tokenizer.
        batch_size: the number of sequences (rows) per forward pass, or ``"auto"``: 64 rows on a GPU,
            halved on out-of-memory, 16 on CPU.
        max_length: the model window to use instead of the config's (checked against it); default: the
            config's position-embedding size.
        share_context: encode the context of a group once and fan its KV cache out to the choices (off:
            one row per context and continuation, as lm-evaluation-harness runs them).

    Examples:
        Two answers after one context, on a tiny random GPT-2 (any causal LM loads the same way):

        >>> import tempfile
        >>> from cblight.models import load_causal_lm, load_tokenizer
        >>> from cblight.tiny import build_tiny_gpt2
        >>> path = str(build_tiny_gpt2(tempfile.mkdtemp()))
        >>> scorer = Scorer(load_causal_lm(path), load_tokenizer(path))
        >>> mat, table = scorer.score_text([("The cat sat on the", [" mat", " kitchen table"])])[0]
        >>> len(mat.token_log_probs), len(table.token_log_probs), table.log_prob < 0
        (1, 2, True)
        >>> context = scorer.encoder.context("The cat sat on the")
        >>> full = scorer.next_token_log_probs([context])  # f_max
        >>> short = scorer.last_k_log_probs([context], 2, full=full)  # f_2, on " on the"
        >>> full.shape, short.shape
        (torch.Size([1, 50257]), torch.Size([1, 50257]))
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: BatchSize = "auto",
        max_length: int | None = None,
        share_context: bool = True,
    ):
        from cblight.models import model_window

        check_arguments(Scorer.__init__, {"batch_size": batch_size})
        self.model = model
        self.encoder = Encoder(tokenizer)
        self.window = model_window(model, max_length)
        self.batch_size = batch_size
        self.share_context = share_context
        self._auto_rows = 64
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)

    # -- plumbing ------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return input_device(self.model)

    @property
    def rows_per_batch(self) -> int:
        if self.batch_size != "auto":
            return int(self.batch_size)
        return self._auto_rows if self.device.type == "cuda" else 16

    def in_batches(self, items: list[Any], cost: Any, run: Any) -> list[Any]:
        """Run ``run(chunk)`` over consecutive chunks holding at most ``rows_per_batch`` rows (by
        ``cost(item)``), halving the automatic batch size on CUDA out-of-memory.

        :meta private:
        """
        out: list[Any] = []
        start = 0
        while start < len(items):
            limit = self.rows_per_batch
            end, rows = start, 0
            while end < len(items) and (end == start or rows + cost(items[end]) <= limit):
                rows += cost(items[end])
                end += 1
            try:
                out.extend(run(items[start:end]))
            except RuntimeError as err:  # torch.OutOfMemoryError is one
                oom = isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()
                if self.batch_size == "auto" and oom and limit > 1:
                    torch.cuda.empty_cache()
                    self._auto_rows = max(1, limit // 2)
                    log.warning(
                        "out of memory at %d rows per batch; retrying with %d", limit, self._auto_rows
                    )
                    continue
                raise
            start = end
        return out

    # -- continuations ---------------------------------------------------------------------------------
    def score_text(
        self, groups: Sequence[tuple[str, Sequence[str]]], names: Sequence[str] | None = None
    ) -> list[list[ContinuationScore]]:
        """``score_choices`` on strings, split at the lm-eval boundary (``Encoder.pair``).

        Args:
            groups: ``(context, [continuation, ...])`` pairs, e.g. a question and its answers.
            names: a label per group for error messages (default ``group <i>``).

        Returns:
            One list per group, a ``ContinuationScore`` per continuation, in the order given.

        Raises:
            ~cblight.scoring.ScoringError: for a continuation that encodes to no tokens or does not fit the
                window.
        """
        pairs = [[self.encoder.pair(ctx, c) for c in conts] for ctx, conts in groups]
        return self.score_choices([(p[0][0], [cont for _, cont in p]) for p in pairs], names)

    def truncate(self, context: Sequence[int], continuations: Sequence[Sequence[int]]) -> list[int]:
        """Cut the context from the left so that it and the longest continuation fit the window
        (the last continuation token is never an input); the special prefix (BOS) is kept.

        Args:
            context: the context's token ids.
            continuations: the token ids of the continuations scored after it.

        Returns:
            The context's ids as the model will see them.

        Raises:
            ~cblight.scoring.ScoringError: when a continuation alone exceeds the window.
        """
        longest = max(len(c) for c in continuations)
        if longest > self.window:
            raise ScoringError(
                f"a continuation of {longest} tokens exceeds the model window of {self.window} tokens"
            )
        room = self.window + 1 - longest
        ctx, prefix = list(context), self.encoder.prefix
        if len(ctx) <= room:
            return ctx
        keep = prefix if prefix and ctx[: len(prefix)] == prefix and room > len(prefix) else []
        return keep + ctx[len(ctx) - (room - len(keep)) :]

    @torch.no_grad()
    def score_choices(
        self,
        groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]],
        names: Sequence[str] | None = None,
    ) -> list[list[ContinuationScore]]:
        """Log-likelihood of every continuation of every group (paper eq. 2's terms).

        Groups run longest first; the context of a group is encoded once when ``share_context`` is on.

        Args:
            groups: ``(context_ids, [continuation_ids, ...])`` pairs; an empty context is written as
                ``Encoder.context("")``.
            names: a label per group for error messages (default ``group <i>``).

        Returns:
            One list per group, a ``ContinuationScore`` per continuation, in the order given.

        Raises:
            ~cblight.scoring.ScoringError: for a group without continuations, an empty context or
                continuation, or a continuation that alone exceeds the window.
        """
        prepared: list[_Group] = []
        for i, (ctx, conts) in enumerate(groups):
            name = names[i] if names is not None else f"group {i}"
            if not conts:
                raise ScoringError(f"{name} has no continuations to score")
            if any(len(c) == 0 for c in conts):
                raise ScoringError(f"{name} has an empty continuation")
            if len(ctx) == 0:
                raise ScoringError(f"{name} has an empty context (use Encoder.context for BOS/EOS)")
            conts = [list(c) for c in conts]
            try:
                cut = self.truncate(ctx, conts)
            except ScoringError as err:
                raise ScoringError(f"{name}: {err}") from None
            prepared.append(_Group(i, cut, conts))
        order = sorted(prepared, key=lambda g: -(len(g.context) + max(len(c) for c in g.continuations)))
        run = self._score_shared if self.share_context else self._score_rows
        scored = self.in_batches(order, lambda g: len(g.continuations), run)
        done = {group.index: scores for group, scores in zip(order, scored)}
        return [done[i] for i in range(len(groups))]

    def _score_shared(self, groups: list[_Group]) -> list[list[ContinuationScore]]:
        device = self.device
        ids, mask = left_pad([g.context for g in groups], self.pad_id, device)
        conts = [c for g in groups for c in g.continuations]
        need_tail = any(len(c) > 1 for c in conts)
        kwargs = {"position_ids": positions_from_mask(mask), **logits_to_keep(self.model, 1)}
        out = self.model(input_ids=ids, attention_mask=mask, use_cache=need_tail, **kwargs)
        first = log_softmax32(out.logits[:, -1, :])  # [G, V]: the first continuation token of each group
        group_of_row = [gi for gi, g in enumerate(groups) for _ in g.continuations]
        row_group = torch.tensor(group_of_row, dtype=torch.long, device=device)
        first_rows = first.index_select(0, row_group)
        first_tok = torch.tensor([c[0] for c in conts], dtype=torch.long, device=device)
        tok_lp = first_rows.gather(1, first_tok[:, None])
        greedy = (first_rows.argmax(-1) == first_tok)[:, None]
        if need_tail:
            cache = output_cache(out)
            if cache is None or not hasattr(cache, "reorder_cache"):
                # this model's cache cannot be fanned out: score whole rows instead
                return self._score_rows(groups)
            cache.reorder_cache(row_group)
            tail_ids, tail_mask = right_pad([c[:-1] for c in conts], self.pad_id, device)
            ctx_len = mask.sum(-1).index_select(0, row_group)
            full_mask = torch.cat([mask.index_select(0, row_group), tail_mask], dim=1)
            pos = ctx_len.view(-1, 1) + torch.arange(tail_ids.shape[1], device=device).view(1, -1)
            # padding after a short continuation would otherwise run past the position table when a
            # long context shares the batch (masked, but still an embedding lookup)
            pos = torch.where(tail_mask.bool(), pos, ctx_len.view(-1, 1) - 1)
            past = {cache_argument(self.model): cache}
            out2 = self.model(
                input_ids=tail_ids, attention_mask=full_mask, position_ids=pos, use_cache=False, **past
            )
            tail_targets, _ = right_pad([c[1:] for c in conts], self.pad_id, device)
            lp = log_softmax32(out2.logits)
            tok_lp = torch.cat([tok_lp, lp.gather(-1, tail_targets[..., None]).squeeze(-1)], dim=1)
            greedy = torch.cat([greedy, lp.argmax(-1) == tail_targets], dim=1)
        return self._collect(groups, conts, tok_lp, greedy)

    @staticmethod
    def _collect(
        groups: list[_Group], conts: list[list[int]], tok_lp: torch.Tensor, greedy: torch.Tensor
    ) -> list[list[ContinuationScore]]:
        """Each continuation's score from its row of per-token log-probs and greedy flags ``[R, W]``."""
        rows = iter(zip(conts, tok_lp.tolist(), greedy.tolist()))
        return [
            [
                ContinuationScore(float(sum(lp[: len(c)])), tuple(lp[: len(c)]), all(flags[: len(c)]))
                for c, lp, flags in itertools.islice(rows, len(g.continuations))
            ]
            for g in groups
        ]

    def continuation_log_probs(
        self, rows: Sequence[Sequence[int]], starts: Sequence[int], lengths: Sequence[int]
    ) -> torch.Tensor:
        """Next-token log-probabilities of one right-padded pass over ``rows``, kept at the positions that
        predict each continuation's tokens.

        Args:
            rows: each a context and its continuation but the last token, as lm-evaluation-harness runs them.
            starts: each row's position that predicts its continuation's first token.
            lengths: each continuation's length in tokens.

        Returns:
            float32 ``[R, max(lengths), V]``; row ``r`` holds its distributions at positions
            ``starts[r] .. starts[r] + lengths[r] - 1`` (later entries repeat the last one).
        """
        ids, mask = right_pad(rows, self.pad_id, self.device)
        logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        positions = [[s + min(j, n - 1) for j in range(max(lengths))] for s, n in zip(starts, lengths)]
        index = torch.tensor(positions, device=logits.device)
        return log_softmax32(logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1])))

    def _score_rows(self, groups: list[_Group]) -> list[list[ContinuationScore]]:
        """One right-padded row per (context, continuation), as lm-evaluation-harness runs them."""
        conts = [c for g in groups for c in g.continuations]
        lp = self.continuation_log_probs(
            [g.context + c[:-1] for g in groups for c in g.continuations],
            [len(g.context) - 1 for g in groups for _ in g.continuations],
            [len(c) for c in conts],
        )
        targets, _ = right_pad(conts, self.pad_id, lp.device)
        tok_lp = lp.gather(-1, targets[..., None]).squeeze(-1)
        return self._collect(groups, conts, tok_lp, lp.argmax(-1) == targets)

    # -- next-token distributions ------------------------------------------------------------------------
    def cut_context(self, ids: Sequence[int]) -> list[int]:
        """A context for next-token prediction, cut from the left to the window (special prefix kept).

        Args:
            ids: the context's token ids.

        Returns:
            The ids the model sees.
        """
        return self.truncate(ids, [[0]])

    @torch.no_grad()
    def next_token_log_probs(self, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
        """``log f_max(· | context)`` for each context, batched (longest first) and returned in the order given.

        Args:
            contexts: token ids of each context, cut to the window from the left when longer.

        Returns:
            float32 ``[B, V]`` on the model's device.

        Raises:
            ~cblight.scoring.ScoringError: for an empty context.
        """
        if any(len(c) == 0 for c in contexts):
            raise ScoringError("next-token prediction needs a non-empty context")
        cut = [self.cut_context(c) for c in contexts]
        order = sorted(range(len(cut)), key=lambda i: -len(cut[i]))

        def run(chunk: list[int]) -> list[torch.Tensor]:
            ids, mask = left_pad([cut[i] for i in chunk], self.pad_id, self.device)
            return list(last_position_log_probs(self.model, ids, mask))

        rows = torch.stack(self.in_batches(order, lambda _: 1, run))
        return rows[torch.tensor(order, device=rows.device).argsort()]  # back in the order given

    @torch.no_grad()
    def last_k_log_probs(
        self, contexts: Sequence[Sequence[int]], k: int | Sequence[int], full: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``log f_k(· | context)``: the model on the last ``k`` tokens (after the special prefix), at
        positions ``0..k-1`` (paper §3).

        Args:
            contexts: token ids of each full context.
            k: the short context's length, one for all contexts or each context's own.
            full: the contexts' ``next_token_log_probs``; when given, contexts no longer than their ``k`` reuse
                it (``f_k == f_max``) instead of a second forward pass.

        Returns:
            float32 ``[B, V]`` on the model's device.
        """
        ks = [k] * len(contexts) if isinstance(k, int) else k
        shorts = [short_context_ids(c, n, self.encoder.prefix) for c, n in zip(contexts, ks)]
        if full is None:
            return self.next_token_log_probs(shorts)
        out = full.clone()
        if todo := [i for i, (s, c) in enumerate(zip(shorts, contexts)) if len(s) < len(c)]:
            out[torch.tensor(todo, device=out.device)] = self.next_token_log_probs([shorts[i] for i in todo])
        return out
