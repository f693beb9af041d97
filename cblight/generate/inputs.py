"""Prompts for boosted decoding: encoding, fitting to the model window, and where each short context starts.

Prompts become token rows with the tokenizer's conventions (``cblight.scoring.Encoder``: Llama's BOS in
front, an empty prompt is BOS/EOS alone), are cut to leave room for the new tokens, and are left-padded.
For every anchored expert (``AfterSeparator``, ``AfterMarker``) each row records the column where its short
context starts; the short context is then ``prefix + row[anchor:] + generated`` (docs/design.md, "Mathematics").

Cutting follows docs/design.md, "Mathematics": a prompt longer than ``window - max_new_tokens`` (``prompt_room``,
which refuses a budget that leaves no prompt token) is cut from the left with the special prefix kept; with a
marker, the text just before the marker goes instead (for summarisation: the article's tail is cut, `` TL;DR:``
kept), since the lead of a news article is what a summary needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cblight.batching import left_pad
from cblight.errors import BoostingError
from cblight.options import AfterMarker, AfterSeparator, Boosting, Experts, LastTokens, as_experts
from cblight.scoring import Encoder
from cblight.truncation import fit_prompt, fit_row, has_prefix

Prompts = Sequence[str] | Sequence[Sequence[int]] | torch.Tensor


def separator_ids(tokenizer: Any, separator: str | None) -> list[int]:
    """Token ids of a turn separator: the tokenizer's EOS for ``None`` (DialoGPT), never a literal."""
    if separator is None:
        if tokenizer.eos_token_id is None:
            raise BoostingError(
                "separator=None means the tokenizer's EOS, and this tokenizer has no EOS token"
            )
        return [int(tokenizer.eos_token_id)]
    return marker_ids(tokenizer, separator, "separator")


def marker_ids(tokenizer: Any, marker: str, what: str = "marker") -> list[int]:
    """Token ids of a marker (or, ``what="separator"``, a separator) without the special prefix."""
    ids = Encoder(tokenizer).body(marker) if marker else []
    if not ids:
        raise BoostingError(f"{what} {marker!r} encodes to no tokens")
    return ids


def last_occurrence(row: Sequence[int], pattern: Sequence[int], start: int = 0) -> int:
    """Index of the last occurrence of ``pattern`` in ``row[start:]`` (as an index into ``row``), or -1."""
    n = len(pattern)
    for i in range(len(row) - n, start - 1, -1):
        if list(row[i : i + n]) == list(pattern):
            return i
    return -1


def _pattern(tokenizer: Any, rule: Any) -> list[int] | None:
    """The tokens an anchored rule's short context starts with (``None`` for ``LastTokens``)."""
    if isinstance(rule, AfterSeparator):
        return separator_ids(tokenizer, rule.separator)
    if isinstance(rule, AfterMarker):
        return marker_ids(tokenizer, rule.marker)
    return None


def _anchor(row: Sequence[int], rule: Any, pattern: Sequence[int], n_prefix: int, index: int) -> int:
    """Where the short context of ``rule`` starts in ``row`` (a clear error when it cannot)."""
    if isinstance(rule, AfterSeparator):
        if len(row) - len(pattern) < n_prefix or list(row[len(row) - len(pattern) :]) != list(pattern):
            raise BoostingError(
                f"prompt {index} does not end with the turn separator {pattern} (response mode): the short "
                "context is the separator plus the response, so each prompt must end with it (DialoGPT: "
                "every turn followed by EOS; see dialog_prompt)"
            )
        return len(row) - len(pattern)
    at = last_occurrence(row, pattern, n_prefix)
    if at < 0:
        raise BoostingError(
            f"prompt {index} does not contain the marker {rule.marker!r} (tokens {list(pattern)}); "
            "marker mode needs it in every prompt (see fit_marker_prompt)"
        )
    return at


def prompt_room(window: int, max_new_tokens: int, option: str = "max_new_tokens") -> int:
    """The prompt tokens that fit in the model window beside ``max_new_tokens`` new ones: the one check of the
    generation budget, made once where a run starts (``boosted_generate``'s entry; the generation evaluator's
    set-up, from the checkpoint's config before the model loads).

    Args:
        window: the model window (``cblight.models.model_window`` or ``checkpoint_window``).
        max_new_tokens: the tokens to generate.
        option: how the caller names ``max_new_tokens`` (``model.max_new_tokens`` on the command line).

    Returns:
        ``window - max_new_tokens``, at least 1.

    Raises:
        BoostingError: when no prompt token would fit, naming the option and its largest value.
    """
    room = window - max_new_tokens
    if room < 1:
        raise BoostingError(
            f"{option}={max_new_tokens} leaves no room for a prompt in the model window of {window} tokens; "
            f"set {option} to {window - 1} or less"
        )
    return room


def fit_marker_prompt(
    tokenizer: Any, article: str, *, marker: str = " TL;DR:", max_tokens: int = 1024
) -> list[int]:
    """``article + marker`` as token ids in at most ``max_tokens`` tokens, the article cut from its end
    (the paper's summarisation prompt, appendix "GPT-2 summarization experiments").

    Args:
        tokenizer: the model's tokenizer.
        article: the text to summarise.
        marker: the marker that follows it, kept whole.
        max_tokens: the prompt's budget in tokens (the model window minus the summary's length).

    Returns:
        The prompt's token ids (with the tokenizer's special prefix).

    Examples:
        >>> from cblight.tiny import gpt2_tokenizer
        >>> tokenizer = gpt2_tokenizer()
        >>> ids = fit_marker_prompt(tokenizer, "A long article. " * 20, max_tokens=12)
        >>> len(ids), tokenizer.decode(ids)
        (12, 'A long article. A long article. TL;DR:')
    """
    return fit_prompt(tokenizer, article + marker, max_tokens, keep_suffix=marker, cut_from="end")


def dialog_prompt(tokenizer: Any, turns: Sequence[str], separator: str | None = None) -> list[int]:
    """DialoGPT's prompt: every turn followed by the separator (EOS by default), as token ids (Table 3's
    prompts, for ``Boosting(mode="response")``).

    Args:
        tokenizer: the model's tokenizer.
        turns: the dialog's turns, oldest first.
        separator: the turn separator as text, or ``None`` for the tokenizer's EOS (DialoGPT's).

    Returns:
        The prompt's token ids, ending with the separator.

    Raises:
        ~cblight.errors.BoostingError: for no turns, or a separator the tokenizer cannot give.

    Examples:
        >>> from cblight.tiny import gpt2_tokenizer
        >>> tokenizer = gpt2_tokenizer()
        >>> tokenizer.decode(dialog_prompt(tokenizer, ["Hi!", "Hello."]))
        'Hi!<|endoftext|>Hello.<|endoftext|>'
    """
    if not turns:
        raise BoostingError("a dialog prompt needs at least one turn")
    enc = Encoder(tokenizer)
    sep = separator_ids(tokenizer, separator)
    row = list(enc.prefix)
    for turn in turns:
        row += enc.body(turn) + sep
    return row


@dataclass
class RowInfo:
    """Per-row facts the decoders need, for ``N`` rows (prompts repeated for beams / return sequences).

    Args:
        content_start: ``[N]`` the first real column of each left-padded prompt.
        has_prefix: ``[N]`` whether the row starts with the tokenizer's special prefix (BOS).
        anchors: per expert, ``[N]`` the column where its short context starts (``None`` for ``LastTokens``).
    """

    content_start: torch.Tensor
    has_prefix: torch.Tensor
    anchors: tuple[torch.Tensor | None, ...]


@dataclass
class PreparedPrompts:
    """Left-padded prompt batch, the experts it was prepared for, and where their short contexts start
    (``prepare_prompts`` makes it).

    Args:
        experts: the weighted product the batch is decoded with.
        rows: each prompt's token ids after fitting, unpadded.
        input_ids: ``[B, width]`` the left-padded prompts.
        attention_mask: ``[B, width]`` their mask.
        prefix: the tokenizer's special prefix.
        info: per row, where the content and each anchored expert's short context start.
    """

    experts: Experts
    rows: list[list[int]]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prefix: tuple[int, ...]
    info: RowInfo

    @property
    def width(self) -> int:
        return int(self.input_ids.shape[1])

    def rows_for(self, n_rows: int, device: Any) -> RowInfo:
        """``RowInfo`` for ``n_rows`` rows: generate repeats each prompt ``n_rows / B`` times in a row.

        :meta private:
        """
        batch = len(self.rows)
        if n_rows % batch:
            raise BoostingError(f"generate produced {n_rows} rows for {batch} prompts (not a multiple)")
        rep = n_rows // batch

        def expand(t: Any) -> Any:  # a [B] tensor (or None: a LastTokens expert has no anchors)
            return None if t is None else t.repeat_interleave(rep, dim=0).to(device)

        info = self.info
        return RowInfo(expand(info.content_start), expand(info.has_prefix), tuple(map(expand, info.anchors)))


def prepare_prompts(
    tokenizer: Any,
    prompts: Prompts,
    boosting: Boosting | Experts | None,
    *,
    room: int | None = None,
    attention_mask: torch.Tensor | None = None,
    device: Any = "cpu",
) -> PreparedPrompts:
    """Encode, fit and left-pad prompts for boosted decoding, recording where each anchored expert's
    short context starts (docs/design.md, "Mathematics").

    Args:
        tokenizer: the model's tokenizer.
        prompts: strings, token-id lists, or an ``input_ids`` tensor (with its ``attention_mask`` when
            padded).
        boosting: the ``Boosting`` or ``Experts`` the batch is decoded with (``None``: the base model).
        room: the most tokens a prompt may keep, usually the window minus ``max_new_tokens``; longer ones
            are cut from the left (the special prefix kept) or, with a marker, just before it. ``None``: no
            cutting.
        attention_mask: the mask of a padded ``input_ids`` tensor.
        device: where the padded tensors go.

    Returns:
        The ``PreparedPrompts``.

    Raises:
        ~cblight.errors.BoostingError: for prompts of a wrong type, an empty prompt, a prompt without the
            marker, or a response-mode prompt not ending with the separator.

    Examples:
        >>> from cblight.generate import Boosting
        >>> from cblight.tiny import gpt2_tokenizer
        >>> boosting = Boosting(k=4, alpha=-0.5)
        >>> prompts = prepare_prompts(gpt2_tokenizer(), ["The cat sat on the", "Hi"], boosting)
        >>> prompts.input_ids
        tensor([[  464,  3797,  3332,   319,   262],
                [50256, 50256, 50256, 50256, 17250]])
        >>> prompts.attention_mask
        tensor([[1, 1, 1, 1, 1],
                [0, 0, 0, 0, 1]])
    """
    experts = as_experts(Boosting() if boosting is None else boosting)
    enc = Encoder(tokenizer)
    prefix = list(enc.prefix)
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() != 2:
            raise BoostingError(f"input_ids must be [batch, length], got shape {tuple(prompts.shape)}")
        mask = torch.ones_like(prompts) if attention_mask is None else attention_mask
        if mask.shape != prompts.shape:
            raise BoostingError("attention_mask must have the shape of input_ids")
        rows = [[int(t) for t, m in zip(r, mr) if m] for r, mr in zip(prompts.tolist(), mask.tolist())]
    elif isinstance(prompts, str):
        raise BoostingError("prompts must be a list of strings (or token-id rows), not one string")
    else:
        rows = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                rows.append(enc.context(p))
            elif isinstance(p, Sequence) and all(isinstance(t, int) for t in p):
                rows.append(list(p))
            else:
                raise BoostingError(
                    f"prompt {i} must be a string or a list of token ids, got {type(p).__name__}"
                )
    if not rows:
        raise BoostingError("no prompts to generate from")

    patterns = [_pattern(tokenizer, rule) for rule, _ in experts.experts]

    def anchors_of(row: list[int], index: int) -> list[int | None]:
        n_prefix = len(prefix) if has_prefix(row, prefix) else 0
        return [
            None if pat is None else _anchor(row, rule, pat, n_prefix, index)
            for (rule, _), pat in zip(experts.experts, patterns)
        ]

    fitted: list[list[int]] = []
    for i, row in enumerate(rows):
        if not row:
            raise BoostingError(f"prompt {i} is empty (use Encoder.context('') for BOS/EOS alone)")
        if room is not None and len(row) > room:  # fit_row refuses a room that holds no prompt token
            found = anchors_of(row, i)
            marks = [a for (rule, _), a in zip(experts.experts, found) if isinstance(rule, AfterMarker)]
            row = fit_row(row, room, prefix, keep_from=min(marks) if marks else None, index=i)
        fitted.append(row)

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids, mask = left_pad(fitted, int(pad_id if pad_id is not None else 0), device)
    width = ids.shape[1]
    starts = [width - len(r) for r in fitted]
    per_row = [anchors_of(r, i) for i, r in enumerate(fitted)]
    anchors = tuple(
        None if isinstance(rule, LastTokens) else torch.tensor([s + a[e] for s, a in zip(starts, per_row)])
        for e, (rule, _) in enumerate(experts.experts)
    )
    info = RowInfo(
        content_start=torch.tensor(starts, dtype=torch.long),
        has_prefix=torch.tensor([has_prefix(r, prefix) for r in fitted], dtype=torch.bool),
        anchors=anchors,
    )
    return PreparedPrompts(experts, fitted, ids, mask, tuple(prefix), info)
