"""Continuation log-likelihoods from a served model's prompt log-probabilities (the paper's GPT-3 rows).

The paper scored GPT-3 through an API that returned the log-probability of every prompt token
(``echo: true, logprobs: N``). OpenAI-compatible servers of open models answer the same request: vLLM
(``vllm serve``; its ``echo`` answers carry the prompt log-probs it computes for ``prompt_logprobs``) and
llama-cpp-python's server. ``ServedScorer.score_text`` has the interface of ``cblight.scoring.Scorer``'s, so
multiple-choice scoring (boosting, PMI, calibration, channel) runs unchanged on a served model.

What is exact: ``log P(continuation | context)`` of any text pair is a sum of prompt log-probs, so every
multiple-choice score is exact (up to the server's arithmetic). What is not: the boosted *argmax over the
vocabulary* of next-token tasks (LAMBADA, LAMA) needs the full distributions of ``f_max`` and ``f_k``; a server
returns only the top-N tokens of each, and a token outside the short context's top-N can have the highest
boosted score (a low ``f_k`` raises it for alpha < 0). The evaluator refuses next-token tasks on a served
model rather than report an approximation.

Token boundaries: the server tokenises ``context + continuation`` itself. The continuation's tokens are the
prompt tokens that start at or after the context's end, located with the answer's ``text_offset``s counted
back from the end of the prompt (servers differ in whether the BOS text counts in the offsets; the end does
not move). As in ``cblight.scoring``, trailing spaces of the context move into the continuation. A token
that straddles the boundary (the server merged the context's end with the continuation's start) is left
out of the continuation and counted in ``boundary_straddles``, which the results report.

Alignment canary (``check_alignment``): the server generates one token after a canary prompt (generation
log-probs come from the right position), then the same text with that token appended is echoed; the two
log-probs of that token must agree. llama-cpp-python (0.2.90 to 0.3.36) reads prompt token ``i`` from row
``i`` instead of ``i - 1`` for models without BOS (SmolLM2): every echoed log-prob is then wrong and the
canary refuses the server. With BOS models it is right, but the first token after BOS gets no log-prob,
so an empty context (PMI over BOS alone, StoryCloze's premise-free context) cannot be scored there: such
a request fails with one line saying so.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cblight.scoring import ContinuationScore
from cblight.served.client import CompletionClient, RequestCache, ServedModelError, ServerOptions

log = logging.getLogger(__name__)

# Prompts whose greedy next token is a word: the canary needs one ordinary token to compare.
CANARIES = ("The capital of France is", "One, two, three, four,", "Monday, Tuesday, Wednesday,")
# Generation and echo compute the same logits row; llama.cpp's batched prompt evaluation differs from the
# one-row generation step only by float rounding (measured: below 1e-3 nats for Gemma-3-270m Q4_K_M),
# while a row misread by one position is off by nats ("of" after "The capital": -10.46 vs -0.41).
ALIGNMENT_TOLERANCE = 0.05


@dataclass(frozen=True)
class EchoedContinuation:
    """The continuation's part of an echoed prompt: its tokens and their log-probs."""

    tokens: tuple[str, ...]
    log_probs: tuple[float, ...]
    greedy: bool
    straddles: bool


def echoed_continuation(
    answer: dict[str, Any], continuation: str, name: str, prompt: str | None = None
) -> EchoedContinuation:
    """The last ``continuation`` characters of an echoed ``prompt``, from a completion ``answer`` with
    ``echo: true`` and ``logprobs`` (see the module docstring for the boundary rule).

    The generated tokens normally follow the prompt's in the list (``usage.completion_tokens`` of them);
    llama-cpp-python leaves them out for models without BOS, which the generated text (``text`` minus the
    prompt) tells apart."""
    try:
        choice = answer["choices"][0]
        logprobs, generated = choice["logprobs"], int(answer["usage"]["completion_tokens"])
        tokens, offsets, values = logprobs["tokens"], logprobs["text_offset"], logprobs["token_logprobs"]
        if not tokens or len(offsets) != len(tokens) or len(values) != len(tokens):
            raise ValueError
    except (KeyError, IndexError, TypeError, ValueError):
        raise ServedModelError(
            f"{name}: the server returned no prompt log-probs (choices[0].logprobs with tokens, text_offset "
            "and token_logprobs, and usage.completion_tokens): does it support echo with logprobs?"
        ) from None
    tops = logprobs.get("top_logprobs") or [None] * len(tokens)
    n_prompt = len(tokens) - generated
    text = choice.get("text")
    listed = "".join(tokens[n_prompt:])
    if generated and prompt is not None and isinstance(text, str) and text.startswith(prompt):
        n_prompt = n_prompt if listed == text[len(prompt) :] else len(tokens)  # generated ones not listed
    if n_prompt <= 0:
        raise ServedModelError(
            f"{name}: the server returned log-probs for generated tokens only, none for the prompt "
            "(it ignores echo)"
        )
    end = offsets[n_prompt] if n_prompt < len(tokens) else offsets[n_prompt - 1] + len(tokens[n_prompt - 1])
    boundary = end - len(continuation)
    first = next((i for i in range(n_prompt) if offsets[i] >= boundary), n_prompt)
    if first == n_prompt:
        raise ServedModelError(f"{name}: no prompt token of the server starts inside the continuation")
    picked = values[first:n_prompt]
    if any(v is None for v in picked):
        raise ServedModelError(
            f"{name}: the server gave no log-prob for a continuation token (the first token of a prompt "
            "gets none; llama-cpp-python gives none to the token right after BOS), so an empty context "
            "cannot be scored on this server"
        )
    # greedy: no continuation token has a more likely alternative in the server's top-N
    greedy = all(
        not isinstance(top, dict) or not top or v >= max(top.values()) - 1e-6
        for v, top in zip(picked, tops[first:n_prompt])
    )
    return EchoedContinuation(
        tuple(tokens[first:n_prompt]), tuple(float(v) for v in picked), greedy, offsets[first] != boundary
    )


class ServedScorer:
    """Multiple-choice scoring through a served model (module docstring); ``score_text`` as ``Scorer``'s."""

    def __init__(self, client: CompletionClient, model: str):
        self.client = client
        self.model = model
        self.boundary_straddles = 0
        self.alignment: dict[str, Any] | None = None

    @classmethod
    def connect(cls, options: ServerOptions, model: str, cache_path: str | Path) -> ServedScorer:
        """A scorer for ``model`` at ``options.base_url`` whose server passed the checks (model name, and
        the alignment canary unless switched off); answers cached in ``options.request_cache`` or
        ``cache_path``."""
        scorer = cls(CompletionClient(options, RequestCache(options.request_cache or cache_path)), model)
        # a model name the server does not list is refused: llama-cpp-python silently answers with its
        # default model whatever the name
        ids = scorer.client.model_ids()
        if ids is not None and model not in ids:
            raise ServedModelError(
                f"model {model!r} is not served at {scorer.client.base_url} (it serves: {', '.join(ids) or 'nothing'})"
            )
        if options.check_alignment:
            scorer.check_alignment()
        return scorer

    def report(self) -> dict[str, Any]:
        """What ``results.json`` records about the server and this run's requests."""
        return {
            "base_url": self.client.base_url,
            "alignment_canary": self.alignment,
            "boundary_straddles": self.boundary_straddles,
            "requests_sent": self.client.requests_sent,
            "requests_from_cache": self.client.cache_hits,
            "retries": self.client.retries,
        }

    def _body(self, prompt: str, echo: bool) -> dict[str, Any]:
        # max_tokens=1, not 0: llama-cpp-python reads 0 as "until the window is full"; logprobs=1: the top
        # token of each position beside the prompt token's own, for the greedy flag
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
        return {**body, "logprobs": 1, **({"echo": True} if echo else {})}

    def check_alignment(self) -> dict[str, Any]:
        """The canary of the module docstring; returns what it compared, or raises ``ServedModelError``."""
        for prompt in CANARIES:
            gen = self.client.complete(self._body(prompt, echo=False), use_cache=False)
            try:
                lp = gen["choices"][0]["logprobs"]
                token, generated = lp["tokens"][0], lp["token_logprobs"][0]
            except (KeyError, IndexError, TypeError):
                raise ServedModelError(
                    f"{self.client.base_url}: the server returned no log-probs for a generated token"
                ) from None
            if not token.strip() or generated is None:
                continue
            echo = self.client.complete(self._body(prompt + token, echo=True), use_cache=False)
            got = echoed_continuation(echo, token, f"alignment canary {prompt!r}", prompt + token)
            if len(got.log_probs) != 1 or got.straddles:
                continue  # the server tokenises prompt + token differently: try another canary
            diff = abs(got.log_probs[0] - generated)
            if not math.isfinite(diff) or diff > ALIGNMENT_TOLERANCE:
                raise ServedModelError(
                    f"{self.client.base_url} serves misaligned prompt log-probs: {token!r} after {prompt!r} "
                    f"gets {got.log_probs[0]:.3f} when the prompt is echoed but {generated:.3f} when generated "
                    "(llama-cpp-python reads each prompt token's log-prob one position late for models "
                    "without BOS); serve this model with vLLM, or check_alignment=false at your own risk"
                )
            self.alignment = {
                "prompt": prompt,
                "token": token,
                "generated": generated,
                "echoed": got.log_probs[0],
            }
            return self.alignment
        raise ServedModelError(
            f"{self.client.base_url}: could not check the alignment of its prompt log-probs (no canary "
            "prompt gave one ordinary token); pass server.check_alignment=false to skip the check"
        )

    def score_text(
        self, groups: Sequence[tuple[str, Sequence[str]]], names: Sequence[str] | None = None
    ) -> list[list[ContinuationScore]]:
        """``log P(continuation | context)`` of every continuation of every ``(context, [continuation])``."""
        bodies, spans = [], []
        for g, (context, continuations) in enumerate(groups):
            for continuation in continuations:
                cont = context[len(context.rstrip(" ")) :] + continuation  # the context's trailing spaces
                bodies.append(self._body(context + continuation, echo=True))
                spans.append((g, cont, context + continuation))
        answers = self.client.complete_many(bodies)
        out: list[list[ContinuationScore]] = [[] for _ in groups]
        for (g, cont, prompt), answer in zip(spans, answers):
            name = names[g] if names is not None else f"group {g}"
            got = echoed_continuation(answer, cont, name, prompt)
            if got.straddles:
                self.boundary_straddles += 1
                log.warning("%s: the server's tokens straddle the context/continuation boundary", name)
            out[g].append(ContinuationScore(sum(got.log_probs), got.log_probs, got.greedy))
        return out
