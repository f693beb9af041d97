"""Boosted decoding with any Hugging Face causal LM: ``boosted_generate`` and the two decoders it runs inside
``model.generate`` (paper eq. 1, §4); the experts' model calls and mixture they share are
``cblight.generate.experts``.

``boosted_generate`` checks the options and the token budget, prepares the prompts (``cblight.generate.inputs``)
and hands them to ``generate_prepared``, which calls ``model.generate`` in eval mode with no gradient and an
optional seed that leaves the caller's random state alone (the generation evaluator, which fits its prompts and
checks its budget itself, calls ``generate_prepared`` directly):

* ``FusedBoostedDecoding`` (the default): a ``custom_generate`` loop that keeps everything generate prepares
  (generation config, ``num_return_sequences``, stopping criteria, warpers, user logits processors) and
  replaces only the token loop. The full contexts and the growing short contexts (separator or marker plus
  the text so far) are rows of **one** batch with one KV cache, so a dialog or summary step is one forward
  of ``2N`` rows instead of two of ``N`` (transformers' CFG runs two; docs/design.md, "Speed floors");
  last-``k`` windows are one extra batched ``k``-token forward per step with logits only at the end.
* ``BoostingLogitsProcessor``, for beam search (``num_beams > 1``), ``decoder="processor"`` and users' own
  ``generate`` calls: generate computes ``f_max`` with its own KV cache, the processor adds the short
  experts. Generate runs it after its constraint processors (``bad_words_ids``, ``min_new_tokens``,
  repetition penalties act on ``f_max``; their ``-inf`` vetoes survive mixing because ``f_max`` has a
  positive weight). A processor never sees beam search's reordering, so before feeding the new tokens the
  cached short contexts are matched to the rows they continue and reordered.

Either way boosting comes **first** and every warper after it: temperature, top-k and top-p act on the
boosted distribution (docs/design.md, "Mathematics"). With ``alpha = 0`` generate runs plainly.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from cblight.batching import eval_mode, input_device
from cblight.boosting import log_softmax32
from cblight.errors import BoostingError
from cblight.generate.experts import CachedRows, boosted_scores, short_groups
from cblight.generate.inputs import PreparedPrompts, Prompts, RowInfo, prepare_prompts, prompt_room
from cblight.models import model_window
from cblight.option_types import PositiveInt, check_arguments
from cblight.options import Boosting, Experts, Sampling

Decoder = Literal["fused", "processor"]


@dataclass
class BoostedGeneration:
    """What ``boosted_generate`` returns.

    Args:
        sequences: generate's ``[N, width + T]`` tensor: left-padded prompts, then new tokens; ``N`` is
            prompts x ``num_return_sequences``, each prompt's rows together.
        prompt_width: ``width``, the left-padded prompts' length (the new tokens start there).
        tokens: each row's new tokens up to (not including) the first EOS.
        texts: those tokens decoded, special tokens skipped.
        scores: generate's per-step processed scores when ``output_scores=True`` (boosted log-probabilities
            after any warpers), else ``None``.
        prompts: the prepared prompt batch the rows continue.
        alphas: with an adaptive rule and no beam search, each row's alpha at each of its ``tokens``
            (docs/adaptive.md); ``None`` otherwise.
    """

    sequences: torch.Tensor
    prompt_width: int
    tokens: list[list[int]]
    texts: list[str]
    scores: tuple[torch.Tensor, ...] | None
    prompts: PreparedPrompts
    alphas: list[list[float]] | None = None

    @property
    def new_tokens(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_width :]


def boosted_generate(
    model: Any,
    tokenizer: Any,
    prompts: Prompts,
    boosting: Boosting | Experts | None = None,
    sampling: Sampling | None = None,
    *,
    max_new_tokens: PositiveInt = 64,
    attention_mask: torch.Tensor | None = None,
    max_length: int | None = None,
    decoder: Decoder = "fused",
    **generate_kwargs: Any,
) -> BoostedGeneration:
    """Generate from ``prompts`` with coherence boosting (paper §4, appendix "GPT-2 summarization").

    Boosting comes first and every warper after it: temperature, top-k and top-p act on the boosted
    distribution. With ``num_beams > 1`` (or ``decoder="processor"``) the mixing runs as a
    ``BoostingLogitsProcessor`` inside generate's own loop, otherwise as ``FusedBoostedDecoding``.

    Args:
        model: a Hugging Face causal LM.
        tokenizer: its tokenizer (encoding, padding, EOS, decoding the new tokens).
        prompts: strings, token-id lists, or an ``input_ids`` tensor with its ``attention_mask``. They are
            cut to leave ``max_new_tokens`` of the model window: from the left (the special prefix kept), or,
            with a marker, just before it.
        boosting: what to mix (``cblight.options``): ``Boosting(mode="last_k", k, alpha)`` is
            ``(1-alpha) log f_max + alpha log f_k`` (WebText Table 2, Figure 1), ``mode="response"`` is
            ``log f_max + alpha log f_short`` with the separator and the response so far (dialog Table 3),
            ``mode="marker"`` the same after a marker (summaries); ``Experts`` mixes any list of short
            contexts; ``None`` (or ``alpha = 0``) is the base model.
        sampling: how to draw from the mix (``Sampling(do_sample=True, top_p=0.95, seed=0)``); its options may
            also come as ``generate``'s own keywords (``do_sample=True, top_p=0.95``), not both.
        max_new_tokens: how many tokens to generate at most.
        attention_mask: the mask of a padded ``input_ids`` tensor given as ``prompts``.
        max_length: the model window to use instead of the config's.
        decoder: ``fused`` (per step one batched call for the full model and one per expert) or
            ``processor`` (the logits-processor path even without beams: same results, one extra forward per
            step for the short contexts).
        **generate_kwargs: further keywords of ``model.generate`` (``num_return_sequences``,
            ``stopping_criteria``, ``streamer``, ``output_scores``, ...).

    Returns:
        A ``BoostedGeneration``: the sequences, each row's new tokens and text, and (with an adaptive rule)
        each token's alpha.

    Raises:
        ~cblight.errors.BoostingError: for an option outside its type, a boosting option given loose
            (``alpha=...``), a sampling option given twice, a token budget that leaves no room for a prompt,
            or a prompt that does not suit the mode (no marker, no final separator).

    Examples:
        Two prompts, the last 4 tokens as the short context at alpha -0.5, nucleus sampling with a seed, on a
        tiny random GPT-2 (``offline:smollm2-135m`` and any Hub model load the same way):

        >>> import tempfile
        >>> from cblight.generate import Boosting, Sampling, boosted_generate
        >>> from cblight.models import load_causal_lm, load_tokenizer
        >>> from cblight.tiny import build_tiny_gpt2
        >>> path = str(build_tiny_gpt2(tempfile.mkdtemp()))
        >>> model, tokenizer = load_causal_lm(path), load_tokenizer(path)
        >>> out = boosted_generate(
        ...     model,
        ...     tokenizer,
        ...     ["The cat sat on the", "Once upon a time"],
        ...     Boosting(mode="last_k", k=4, alpha=-0.5),
        ...     Sampling(do_sample=True, top_p=0.95, seed=0),
        ...     max_new_tokens=5,
        ... )
        >>> out.sequences.shape, [len(tokens) for tokens in out.tokens], len(out.texts)
        (torch.Size([2, 10]), [5, 5], 2)
    """
    check_arguments(boosted_generate, locals(), BoostingError)
    # the boosting options (fields of ``Boosting``) given loose are refused with the fix rather than passed to
    # ``generate``, which would ignore or misread them
    loose = [f.name for f in fields(Boosting) if f.name in generate_kwargs]
    if loose:
        raise BoostingError(
            f"boosted_generate takes boosting=Boosting({loose[0]}=...), not {loose[0]}= on its own"
        )
    given = [k for k in (*Sampling.GENERATE_KEYS, "seed") if k in generate_kwargs]
    if sampling is not None and given:
        raise BoostingError(f"pass {given[0]} inside sampling=Sampling(...) or on its own, not both")
    if sampling is None:
        sampling = replace(
            Sampling.from_generate_kwargs(generate_kwargs), seed=generate_kwargs.pop("seed", None)
        )
    room = prompt_room(model_window(model, max_length), max_new_tokens)
    prepared = prepare_prompts(
        tokenizer, prompts, boosting, room=room, attention_mask=attention_mask, device=input_device(model)
    )
    return generate_prepared(
        model,
        tokenizer,
        prepared,
        sampling,
        max_new_tokens=max_new_tokens,
        decoder=decoder,
        **generate_kwargs,
    )


def generate_prepared(
    model: Any,
    tokenizer: Any,
    prepared: PreparedPrompts,
    sampling: Sampling,
    *,
    max_new_tokens: int,
    decoder: Decoder = "fused",
    **generate_kwargs: Any,
) -> BoostedGeneration:
    """``boosted_generate`` after its checks: decode a batch whose prompts are already encoded, fitted to the
    window and anchored (``cblight.generate.inputs.prepare_prompts``), with options already checked.

    The generation evaluator calls it with prompts it fitted once per batch (``fit_example``) and a budget it
    checked once per run (``prompt_room``); ``boosted_generate`` calls it for Python callers.

    Args:
        model: the causal LM.
        tokenizer: its tokenizer (padding, EOS, decoding the new tokens).
        prepared: the prompt batch and the experts it was prepared for.
        sampling: how to draw after mixing.
        max_new_tokens: tokens to generate; the prompts must leave room for them in the window.
        decoder: ``fused`` or ``processor`` (see ``boosted_generate``).
        **generate_kwargs: further keywords of ``model.generate``, none of them a sampling option.

    Returns:
        The sequences, each row's new tokens and text, and (with an adaptive rule) each token's alpha.
    """
    device = input_device(model)
    kwargs = {**generate_kwargs, **sampling.generate_kwargs()}
    if kwargs.get("pad_token_id") is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        kwargs["pad_token_id"] = pad
    kwargs.update(
        input_ids=prepared.input_ids,
        attention_mask=prepared.attention_mask,
        max_new_tokens=max_new_tokens,
        return_dict_in_generate=True,
    )
    # the beam count generate will use: the keyword, else a passed config, else the checkpoint's
    configs = (kwargs.get("generation_config"), getattr(model, "generation_config", None))
    given_beams = (kwargs.get("num_beams"), *(getattr(c, "num_beams", None) for c in configs))
    beams = int(next((b for b in given_beams if b is not None), 1))
    boosted: BoostingLogitsProcessor | FusedBoostedDecoding | None = None
    if not prepared.experts.is_plain and (beams > 1 or decoder == "processor"):
        boosted = BoostingLogitsProcessor(model, prepared)
        kwargs["logits_processor"] = LogitsProcessorList([boosted, *(kwargs.get("logits_processor") or [])])
    elif not prepared.experts.is_plain:
        boosted = kwargs["custom_generate"] = FusedBoostedDecoding(prepared, streamer=kwargs.get("streamer"))

    seeded = sampling.seed is not None
    with (
        eval_mode(model),
        torch.no_grad(),
        torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], enabled=seeded),
    ):
        if seeded:
            torch.manual_seed(int(sampling.seed))
        out = model.generate(**kwargs)

    eos = generate_kwargs.get("eos_token_id", getattr(model.generation_config, "eos_token_id", None))
    eos = set() if eos is None else {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])}
    if tokenizer.eos_token_id is not None and "eos_token_id" not in generate_kwargs:
        eos.add(int(tokenizer.eos_token_id))
    rows = out.sequences[:, prepared.width :].tolist()
    tokens = [next((row[:i] for i, t in enumerate(row) if t in eos), row) for row in rows]
    texts = [tokenizer.decode(t, skip_special_tokens=True) for t in tokens]
    alphas = None
    if boosted is not None and prepared.experts.adaptive is not None and beams == 1 and boosted.alphas:
        steps = torch.stack(boosted.alphas, 1).tolist()  # [N, steps]: row r's alpha at each step
        alphas = [row[: len(t)] for row, t in zip(steps, tokens)]
    return BoostedGeneration(out.sequences, prepared.width, tokens, texts, out.scores, prepared, alphas)


class FusedBoostedDecoding:
    """A ``custom_generate`` callable for one prompt batch, mixing the experts the batch was prepared for
    (see the module docstring). ``boosted_generate`` uses it by default.

    With an adaptive rule, ``alphas`` holds each step's per-row alphas (``[N]`` tensors, docs/adaptive.md).

    Args:
        prompts: the prompt batch (``prepare_prompts``) whose ``input_ids`` go to ``generate``.
        streamer: the streamer given to ``generate`` as well (generate does not pass it on to a callable).

    Examples:
        >>> import tempfile
        >>> from cblight.generate import Boosting, FusedBoostedDecoding, prepare_prompts
        >>> from cblight.models import load_causal_lm, load_tokenizer
        >>> from cblight.tiny import build_tiny_gpt2
        >>> path = str(build_tiny_gpt2(tempfile.mkdtemp()))
        >>> model, tokenizer = load_causal_lm(path), load_tokenizer(path)
        >>> boosting = Boosting(k=4, alpha=-0.5)
        >>> prompts = prepare_prompts(tokenizer, ["The cat sat on the", "Hi"], boosting, room=200)
        >>> model.generate(
        ...     prompts.input_ids,
        ...     attention_mask=prompts.attention_mask,
        ...     custom_generate=FusedBoostedDecoding(prompts),
        ...     max_new_tokens=3,
        ...     do_sample=False,
        ...     pad_token_id=tokenizer.eos_token_id,
        ... ).shape
        torch.Size([2, 8])
    """

    def __init__(self, prompts: PreparedPrompts, streamer: Any = None):
        self.prompts = prompts
        self.streamer = streamer
        self.alphas: list[torch.Tensor] = []

    @torch.no_grad()
    def __call__(
        self,
        model: Any,
        input_ids: torch.Tensor,
        logits_processor: Any,
        stopping_criteria: Any,
        generation_config: Any,
        synced_gpus: bool = False,
        streamer: Any = None,
        **model_kwargs: Any,
    ) -> Any:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        if generation_config.num_beams not in (None, 1):
            raise BoostingError(
                "the fused boosted decoder does not do beam search; use BoostingLogitsProcessor with "
                "generate's beam search (boosted_generate does this for num_beams > 1)"
            )
        if synced_gpus:
            raise BoostingError(
                "synced_gpus is not supported by boosted decoding: with a model sharded over processes (FSDP2) "
                "run it inside cblight.sharding.SyncedForwards(True).phase(model), which pads the processes' "
                "forward calls to the same number (as cblight generate does)"
            )
        if input_ids.shape[1] != self.prompts.width:
            raise BoostingError("FusedBoostedDecoding must be given the input_ids of its PreparedPrompts")
        streamer = streamer if streamer is not None else self.streamer
        n_rows = input_ids.shape[0]
        mask = model_kwargs.get("attention_mask")
        if mask is None:
            mask = torch.ones_like(input_ids)
        info = self.prompts.rows_for(n_rows, input_ids.device)
        pad = generation_config._pad_token_tensor  # set by generate from pad/EOS
        pad_id = int(pad.reshape(-1)[0]) if pad is not None else 0
        has_eos = any(hasattr(c, "eos_token_id") for c in stopping_criteria)

        rows = CachedRows(model, pad_id)
        lps = rows.prefill([(input_ids, mask), *short_groups(self.prompts, info, input_ids, pad_id)])
        want = generation_config.return_dict_in_generate
        scores_out: list[torch.Tensor] = []
        logits_out: list[torch.Tensor] = []
        unfinished = torch.ones(n_rows, dtype=torch.bool, device=input_ids.device)
        while True:
            boosted = boosted_scores(model, self.prompts, input_ids, info, lps[0], lps[1:], self.alphas)
            scores = logits_processor(input_ids, boosted)
            if want and generation_config.output_scores:
                scores_out.append(scores)
            if want and generation_config.output_logits:
                logits_out.append(lps[0])
            if generation_config.do_sample:
                tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
            else:
                tokens = torch.argmax(scores, dim=-1)
            if has_eos:
                tokens = torch.where(unfinished, tokens, torch.full_like(tokens, pad_id))
            input_ids = torch.cat([input_ids, tokens[:, None]], dim=-1)
            if streamer is not None:
                streamer.put(tokens.cpu())
            unfinished = unfinished & ~stopping_criteria(input_ids, tuple(scores_out))
            if not bool(unfinished.any()):
                break
            lps = rows.step(tokens)
        if streamer is not None:
            streamer.end()
        if not want:
            return input_ids
        return GenerateDecoderOnlyOutput(
            sequences=input_ids,
            scores=tuple(scores_out) if generation_config.output_scores else None,
            logits=tuple(logits_out) if generation_config.output_logits else None,
        )


class BoostingLogitsProcessor(LogitsProcessor):
    """Coherence boosting inside ``model.generate`` (greedy, sampling, beam search, streaming, ...).

    Build one per prompt batch. ``reorders`` counts the steps at which beam search shuffled rows (and the
    short caches followed); with an adaptive rule ``alphas`` holds each step's per-row alphas (``[N]``
    tensors, docs/adaptive.md). Last-``k`` windows need no cache and work with anything generate does.

    Args:
        model: the causal LM ``generate`` runs (the processor calls it for the short contexts).
        prompts: the prompt batch (``prepare_prompts``) whose ``input_ids`` go to ``generate``; the processor
            mixes the experts it was prepared for.

    Examples:
        Beam search over boosted scores, with generate's own loop:

        >>> import tempfile
        >>> from cblight.generate import Boosting, BoostingLogitsProcessor, prepare_prompts
        >>> from cblight.models import load_causal_lm, load_tokenizer
        >>> from cblight.tiny import build_tiny_gpt2
        >>> path = str(build_tiny_gpt2(tempfile.mkdtemp()))
        >>> model, tokenizer = load_causal_lm(path), load_tokenizer(path)
        >>> prompts = prepare_prompts(tokenizer, ["The cat sat on the"], Boosting(k=4, alpha=-0.5), room=200)
        >>> model.generate(
        ...     prompts.input_ids,
        ...     attention_mask=prompts.attention_mask,
        ...     logits_processor=[BoostingLogitsProcessor(model, prompts)],
        ...     max_new_tokens=3,
        ...     num_beams=2,
        ...     pad_token_id=tokenizer.eos_token_id,
        ... ).shape
        torch.Size([1, 8])
    """

    def __init__(self, model: Any, prompts: PreparedPrompts):
        self.model = model
        self.prompts = prompts
        self.reorders = 0
        self._rows: CachedRows | None = None
        self._info: RowInfo | None = None
        self._last: torch.Tensor | None = None
        self.alphas: list[torch.Tensor] = []

    def _parents(self, input_ids: torch.Tensor) -> torch.Tensor | None:
        """For each current row, the former row it extends by one token (``None``: nothing moved)."""
        assert self._last is not None
        before = input_ids[:, :-1]
        if torch.equal(before, self._last):
            return None
        n, width0 = input_ids.shape[0], self.prompts.width
        group = torch.arange(n, device=input_ids.device) // (n // len(self.prompts.rows))  # each row's prompt
        same = (before[:, None, width0:] == self._last[None, :, width0:]).all(-1) & (
            group[:, None] == group[None, :]
        )
        if not bool(same.any(dim=1).all()):
            raise BoostingError(
                "a row does not extend any row of the previous step: this generation method rewrites "
                "sequences in a way the cached short context cannot follow"
            )
        return same.int().argmax(dim=1)

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        full = log_softmax32(scores)
        width = input_ids.shape[1]
        anchored: list[torch.Tensor] = []
        if self._last is None or width == self.prompts.width:  # a new generate call
            self._info = self.prompts.rows_for(input_ids.shape[0], input_ids.device)
            self.alphas = []
            groups = short_groups(self.prompts, self._info, input_ids, pad_id=0)  # any id fills padding
            self._rows = CachedRows(self.model, 0) if groups else None
            if self._rows is not None:
                anchored = self._rows.prefill(groups)
        else:
            if width != self._last.shape[1] + 1:
                raise BoostingError(
                    f"the processor saw {self._last.shape[1]} then {width} tokens: boosting follows one token "
                    "per step (assisted / speculative decoding is not supported)"
                )
            if self._rows is not None:
                parents = self._parents(input_ids)
                if parents is not None:
                    self._rows.reorder(parents)
                    self.reorders += 1
                anchored = self._rows.step(input_ids[:, -1])
        self._last = input_ids
        assert self._info is not None
        return boosted_scores(
            self.model, self.prompts, input_ids, self._info, full, anchored, self.alphas
        ).to(scores.dtype)
