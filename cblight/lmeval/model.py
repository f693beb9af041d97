"""``cblight``: an lm-evaluation-harness model backed by cblight's scorer and boosted decoder.

Registered with lm-eval's ``@register_model`` when this module is imported (``python -m cblight.lmeval``
does that, then runs lm-eval's own CLI). ``--model_args``:

* ``pretrained``: a Hub id, a local directory, or a name ``cblight.models.load_causal_lm`` accepts; or a
  loaded model object (with ``tokenizer=``) from Python;
* ``alpha`` (default 0: the base model) and ``k`` (default 32); ``alpha=adaptive`` sets alpha with no
  labels (docs/adaptive.md): ``adaptive_rule`` (default ``auto``) names the rule;
* ``short_context``: ``last_k`` (default), ``empty`` or ``premise_free`` (``cblight.lmeval.contexts``);
* ``premise_free_rule``: force one premise-free rule for every task (local tasks lm-eval's names miss);
* ``form``: the boosting form of ``generate_until`` (``next_token``, the default, is the same boosted model
  whose greedy tokens ``loglikelihood`` checks; ``generation`` is Table 2's ``(1-alpha) log f + alpha log f_k``);
* ``dtype``, ``device``, ``batch_size``, ``max_length``, ``revision``, ``trust_remote_code``.

Tokenisation follows lm-eval's HF backend exactly (its ``tok_encode``, context/continuation split and
empty-context convention), so with ``alpha=0`` the numbers are those of ``--model hf``. Boosted requests:

* ``loglikelihood``: ``log f(cont | context) + alpha · log f(cont | short)`` (paper eq. 2), with ``is_greedy``
  under the boosted next-token distribution (``cblight.lmeval.pairs``); a request whose context is empty
  (lm-eval's own unconditional requests of ``acc_mutual_info``) is left unboosted;
* ``loglikelihood_rolling``: never boosted (perplexity of the base model);
* ``generate_until``: ``boosted_generate`` with the last-``k`` window, ``until`` stop strings and
  ``max_gen_toks`` as lm-eval's HF backend handles them.

With ``alpha=adaptive`` a ``loglikelihood`` request returns ``log f(cont | context) + alpha_q · log f(cont |
short)`` with its question's alpha from a multiple-choice rule over the question's requests (a task's
requests together for the transductive rules; a question is lm-eval's ``doc_id`` within its task), its
``is_greedy`` flag and ``generate_until`` use a per-token rule. ``adaptive_rule`` names a rule
(``cblight.adaptive.RULES``; ``auto``: each kind's own). A named rule is used where it applies and refused
where a metric would need the other kind (``cocoa`` for scores, ``decorrelate`` for ``generate_until``;
``cblight lmeval`` checks the tasks' kinds before the model loads); the greedy flags of a multiple-choice task,
which no metric reads, take the per-token ``auto`` under a multiple-choice rule.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from typing import Any, Literal

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.models.utils_hf import stop_sequences_criteria
from tqdm import tqdm

from cblight.adaptive import AUTO, CHOICE_RULES, TOKEN_RULES, RuleName
from cblight.boosting import short_context_ids
from cblight.errors import CblightError
from cblight.lmeval.contexts import RULES, PremiseFreeRule, ShortContextMode, rule_for
from cblight.lmeval.pairs import Pair, boosted_scores, score_pairs
from cblight.models import DTypeName
from cblight.option_types import FiniteFloat, PositiveInt, check_arguments
from cblight.scoring import Scorer

log = logging.getLogger(__name__)

CACHE_STAMP_KEY = "__cblight_model_args__"
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's HF backend default


@register_model("cblight")
class CblightLM(TemplateLM):
    """lm-eval's ``--model cblight``: boosted ``loglikelihood`` (paper eq. 2) and ``generate_until`` (the module
    docstring says what each request returns). ``cblight lmeval --help`` lists these arguments.

    Args:
        pretrained: Hub id, local directory or offline zoo name (offline:smollm2-135m); from Python, a loaded model.
        tokenizer: tokenizer name or directory (default: the model's); from Python, a loaded tokenizer.
        alpha: boosting coefficient; 0 is the base model, -1 with short_context=empty is PMI; adaptive: set
            with no labels by adaptive_rule (docs/adaptive.md).
        k: tokens of the last_k short context.
        adaptive_rule: the label-free rule of alpha=adaptive: auto (gated for scores, jsdist for greedy
            flags and generate_until), gated, jsd, jsdist, cocoa, jsd_mean, jsdist_mean, decorrelate or
            balance.
        short_context: last_k (the context's last k tokens), empty (BOS/EOS) or premise_free (Table 10).
        premise_free_rule: force one premise-free rule for every task (answer_cue, question, connector,
            after_last_period, empty, last_k); default: each task's own (docs/lmeval.md).
        form: boosting form of generate_until: next_token (log f + alpha log f_k) or generation
            ((1-alpha) log f + alpha log f_k, Table 2).
        dtype: weights dtype: float32, bfloat16, float16 or auto.
        device: cuda or cpu (default: cuda when a GPU is visible).
        batch_size: requests per forward pass, or auto.
        max_batch_size: lm-eval passes its --max_batch_size here; cblight's scorer does not use it.
        max_length: model window (default: the model config's).
        revision: Hub revision of the model.
        trust_remote_code: allow the model's own code from the Hub.
    """

    # lm-eval's HF backend's own tokenisation (its tok_encode; BOS, else EOS, as the empty context), so
    # that with alpha=0 the numbers are those of --model hf; none of its add_bos_token or prefix overrides
    add_bos_token = custom_prefix_token_id = None
    eot_token_id = HFLM.eot_token_id
    prefix_token_id = HFLM.prefix_token_id
    tokenizer_name = HFLM.tokenizer_name
    tok_encode = HFLM.tok_encode

    def __init__(
        self,
        pretrained: Any = "gpt2",
        tokenizer: Any = None,
        alpha: FiniteFloat | Literal["adaptive"] = 0.0,
        k: PositiveInt = 32,
        adaptive_rule: RuleName = "auto",
        short_context: ShortContextMode = "last_k",
        premise_free_rule: PremiseFreeRule | None = None,
        form: Literal["next_token", "generation"] = "next_token",
        dtype: DTypeName = "float32",
        device: str | None = None,
        batch_size: PositiveInt | Literal["auto"] = 16,
        max_batch_size: int | None = None,
        max_length: PositiveInt | None = None,
        revision: str | None = None,
        trust_remote_code: bool = False,
        **unused: Any,
    ):
        super().__init__()
        if unused:
            from cblight.suggest import closest

            close = closest(min(unused), [p for p in type(self).__init__.__annotations__ if p != "unused"])
            raise CblightError(
                f"unknown --model_args for model cblight: {', '.join(sorted(unused))}"
                f"{f'; did you mean {close}?' if close else ''} (cblight lmeval --help lists them)"
            )
        if isinstance(batch_size, str) and batch_size.startswith("auto"):  # lm-eval's auto:N
            batch_size = "auto"
        elif isinstance(batch_size, str) and batch_size.isdigit():  # lm-eval's --batch_size is text
            batch_size = int(batch_size)
        check_arguments(type(self).__init__, locals(), CblightError)
        if alpha != "adaptive" and adaptive_rule != "auto":
            raise CblightError(f"adaptive_rule={adaptive_rule} needs alpha=adaptive (got alpha={alpha})")
        self.adaptive = adaptive_rule if alpha == "adaptive" else None
        self.alpha = 0.0 if alpha == "adaptive" else float(alpha)
        self.k = k
        self.short_context = short_context
        self.premise_free_rule = premise_free_rule
        self.form = form
        if isinstance(pretrained, str):
            from cblight.models import LoadOptions, load_causal_lm, load_tokenizer

            # lm-eval's model_args are flat key=value pairs (its hf model's spelling): one LoadOptions here
            load = LoadOptions(revision=revision, dtype=dtype, trust_remote_code=trust_remote_code)
            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            self.model = load_causal_lm(pretrained, load, device=device)
            loads = isinstance(tokenizer, str | None)
            self.tokenizer = load_tokenizer(tokenizer or pretrained, load) if loads else tokenizer
            name = pretrained
        else:
            if tokenizer is None or isinstance(tokenizer, str):
                raise CblightError(
                    "a loaded model needs its tokenizer object: CblightLM(model, tokenizer=...)"
                )
            self.model, self.tokenizer = pretrained.eval(), tokenizer
            name = getattr(pretrained.config, "_name_or_path", type(pretrained).__name__)
        self.scorer = Scorer(self.model, self.tokenizer, batch_size=batch_size, max_length=max_length)
        self._device = self.scorer.device
        self._settings = {
            "model": str(name),
            "alpha": self.alpha,
            "k": self.k,
            "short_context": self.short_context,
            "premise_free_rule": self.premise_free_rule,
            "form": self.form,
            "dtype": dtype,
            "max_length": self.scorer.window,
            **({"adaptive": self.adaptive} if self.adaptive is not None else {}),
        }

    # -- what lm-eval asks of a TemplateLM -------------------------------------------------------------
    @property
    def boosted(self) -> bool:
        return self.alpha != 0.0 or self.adaptive is not None

    def _rule(self, kind: str) -> str | None:
        """The adaptive rule of a kind: ``multiple_choice`` for scores, ``next_token`` for greedy flags,
        ``generate_until``. ``auto`` is each kind's own; a rule named for scores keeps the flags of a
        multiple-choice task at the per-token ``auto`` (they are no metric there); a named rule is never swapped for
        another where it would make a metric (scores, generations): ``CblightError``."""
        if self.adaptive is None:
            return None
        valid, other, use = {
            "multiple_choice": (CHOICE_RULES, "per-token", "loglikelihood scores"),
            "generate_until": (TOKEN_RULES, "multiple-choice", "generate_until"),
        }.get(kind, ((self.adaptive,), "", ""))
        if self.adaptive not in ("auto", *valid):
            raise CblightError(
                f"adaptive_rule={self.adaptive} is a {other} rule: it does not apply to {use}; "
                f"use auto or one of {', '.join(valid)}"
            )
        if kind == "multiple_choice":
            return AUTO[kind] if self.adaptive == "auto" else self.adaptive
        return self.adaptive if self.adaptive in TOKEN_RULES else "auto"  # per position: no split mean

    @property
    def max_length(self) -> int:
        return self.scorer.window

    @property
    def batch_size(self) -> int:
        """The windows per ``_loglikelihood_tokens`` call of ``loglikelihood_rolling``."""
        return self.scorer.rows_per_batch

    def get_model_info(self) -> dict[str, Any]:
        return {"cblight": dict(self._settings)}

    # -- caching ---------------------------------------------------------------------------------------
    def set_cache_hook(self, cache_hook: Any) -> None:
        """lm-eval's ``--use_cache`` keys results by request text alone, not by alpha, k or mode: the cache
        database remembers the settings it was written with and refuses others (one clear error rather
        than silently reusing unboosted numbers)."""
        super().set_cache_hook(cache_hook)
        db = getattr(cache_hook, "dbdict", None)
        if db is None:
            return
        stamp = json.dumps(self._settings, sort_keys=True)
        old = db.setdefault(CACHE_STAMP_KEY, stamp)  # lm-eval's cache database commits every write
        if old != stamp:
            raise CblightError(
                f"the --use_cache database was written by model cblight with {old}, not {stamp}; "
                "use a different --use_cache path for each alpha / k / short_context"
            )

    # -- log-likelihoods -------------------------------------------------------------------------------
    def _encode(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """``TemplateLM.loglikelihood``'s encoding: an empty context is the prefix token (unless the
        continuation itself starts with it); otherwise lm-eval's context/continuation split."""
        if context == "":
            cont = self.tok_encode(continuation, add_special_tokens=False)
            if cont and cont[0] == self.prefix_token_id:
                return cont[:1], cont[1:]
            return [self.prefix_token_id], cont
        return self._encode_pair(context, continuation)

    def _short(
        self, request: Any, ctx_ids: list[int], cont_ids: list[int]
    ) -> tuple[list[int], list[int]] | None:
        """``(short context ids, continuation ids)`` of a request (``None``: the request is not boosted).

        A text short context is encoded as its own request, so its continuation is split from it exactly
        as evaluate.py splits it (``""`` is lm-eval's unconditional request)."""
        context, continuation = request.args
        if context == "":
            return None
        rule = rule_for(self.short_context, request.task_name, self.premise_free_rule)
        if rule == "last_k":
            return short_context_ids(ctx_ids, self.k, self.scorer.encoder.prefix), cont_ids
        return self._encode(RULES[rule](context), continuation)

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        choice_rule = self._rule("multiple_choice")  # refused before any model call
        encoded = [self._encode(*req.args) for req in requests]
        for req, (_, cont) in zip(requests, encoded):
            if not cont:
                raise CblightError(f"{req.task_name}: continuation {req.args[1]!r} encodes to no tokens")
        # every short context before any model call: a task without a rule fails at once
        shorts = [self._short(req, *enc) for req, enc in zip(requests, encoded)] if self.boosted else []
        # blocks of requests in lm-eval's order (a question's choices stay together), with a progress bar
        block = 32 * self.scorer.rows_per_batch
        blocks = [slice(lo, lo + block) for lo in range(0, len(encoded), block)]
        progress = tqdm(blocks, desc="cblight loglikelihood", disable=disable_tqdm)
        if self.boosted:
            pairs = [pair for b in progress for pair in self._pairs(encoded[b], shorts[b])]
            scores = boosted_scores(requests, pairs, self.alpha, choice_rule)
            out = [(score, greedy) for score, (_, _, greedy) in zip(scores, pairs)]
        else:
            out = [result for b in progress for result in self._plain(encoded[b])]
        for req, res in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", req.args, res)
        return out

    def _plain(self, encoded: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """Unboosted: ``Scorer.score_choices``, one group per distinct context (its KV cache is shared)."""
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, (ctx, _) in enumerate(encoded):
            groups[tuple(ctx)].append(i)
        scored = self.scorer.score_choices([(list(c), [encoded[i][1] for i in g]) for c, g in groups.items()])
        out = {i: (s.log_prob, s.is_greedy) for g, ss in zip(groups.values(), scored) for i, s in zip(g, ss)}
        return [out[i] for i in range(len(encoded))]

    def _pairs(
        self, encoded: list[tuple[list[int], list[int]]], shorts: list[tuple[list[int], list[int]] | None]
    ) -> list[Pair]:
        """``(ll_full, ll_short, is_greedy)`` per request (``ll_short`` ``None``: not boosted). Where the short
        request continues with the same tokens (nearly always) both are scored as a pair, with the greedy
        flag under the boosted distribution; a short context that splits the continuation into other tokens
        is scored on its own, and the flag is the full context's."""
        same = [s is None or s[1] == cont for s, (_, cont) in zip(shorts, encoded)]
        paired = [
            (ctx, s[0] if (s is not None and ok) else None, cont)
            for (ctx, cont), s, ok in zip(encoded, shorts, same)
        ]
        scores = score_pairs(self.scorer, paired, self.alpha, self._rule("next_token"))
        odd = [i for i, ok in enumerate(same) if not ok]
        alone = dict(zip(odd, self._plain([shorts[i] for i in odd]))) if odd else {}  # type: ignore[misc]
        return [(f, alone[i][0] if i in alone else s, greedy) for i, (f, s, greedy) in enumerate(scores)]

    def _loglikelihood_tokens(self, requests: list[Any], **kwargs: Any) -> list[tuple[float, bool]]:
        """Token-level requests ``((context, continuation), context_ids, continuation_ids)``, unboosted."""
        return self._plain([(list(ctx), list(cont)) for _, ctx, cont in requests])

    # perplexity windows through lm-eval's HF backend's own loop (windows, batches, sums); never boosted
    loglikelihood_rolling = HFLM.loglikelihood_rolling

    # -- generation ------------------------------------------------------------------------------------
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled) continuations through ``boosted_generate``, grouped by generation options."""
        from cblight.generate import boosted_generate
        from cblight.generate.inputs import prompt_room
        from cblight.options import Boosting, Sampling

        if self.boosted and self.short_context != "last_k":
            raise CblightError(
                "generate_until boosts with short_context=last_k only (the paper's generation mode, §4.1); "
                f"got short_context={self.short_context}"
            )
        eos = self.tokenizer.decode(self.eot_token_id, skip_special_tokens=False)
        groups: dict[str, list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            groups[json.dumps(req.args[1], sort_keys=True, default=str)].append(i)
        out: list[str | None] = [None] * len(requests)
        rule = self._rule("generate_until")
        boosting = Boosting("last_k", k=self.k, alpha=self.alpha, form=self.form, adaptive=rule)  # type: ignore[arg-type]
        for indices in groups.values():
            kwargs = normalize_gen_kwargs(requests[indices[0]].args[1], DEFAULT_MAX_GEN_TOKS)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen_toks = kwargs.pop("max_gen_toks")
            kwargs.pop("max_length", None)
            if not kwargs["do_sample"]:  # lm-eval's greedy temperature 0.0 is no Sampling temperature
                kwargs.pop("temperature", None)
            sampling = Sampling.from_generate_kwargs(kwargs)
            room = prompt_room(self.max_length, max_gen_toks, "max_gen_toks")
            rows = {i: self.tok_encode(requests[i].args[0])[-room:] for i in indices}
            order = sorted(indices, key=lambda i: -len(rows[i]))  # as lm-eval: longest first
            for lo in range(0, len(order), self.scorer.rows_per_batch):
                chunk = order[lo : lo + self.scorer.rows_per_batch]
                prompts = [rows[i] for i in chunk]
                width = max(len(p) for p in prompts)
                result = boosted_generate(
                    self.model,
                    self.tokenizer,
                    prompts,
                    boosting,
                    sampling,
                    max_new_tokens=max_gen_toks,
                    max_length=self.max_length,
                    stopping_criteria=stop_sequences_criteria(self.tokenizer, until, width, len(chunk)),
                    pad_token_id=self.tokenizer.pad_token_id,
                    **kwargs,
                )
                for n, i in enumerate(chunk):
                    text = self.tokenizer.decode(result.new_tokens[n].tolist(), skip_special_tokens=True)
                    out[i] = postprocess_generated_text(text, until, None)
                    self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
        return out  # type: ignore[return-value]
