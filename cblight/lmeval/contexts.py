"""Short contexts for boosted lm-evaluation-harness requests (paper §2 eq. 2, §3, Table 10).

An lm-eval ``loglikelihood`` request is a ``(context, continuation)`` pair. Boosting scores it as

    score = log f(continuation | context) + alpha · log f(continuation | short context)

and the short context follows one of three modes (``short_context=`` in ``--model_args``):

* ``last_k``: the last ``k`` tokens of the request's context (generic; the paper's LAMBADA, §3);
* ``empty``: BOS/EOS alone, exactly lm-eval's unconditional context for ``acc_mutual_info`` (the request
  ``("", continuation)``: lm-eval's ``prefix_token_id``, BOS else EOS, and the continuation encoded alone);
  with ``alpha = -1`` this is lm-eval's own ``acc_mutual_info``;
* ``premise_free``: the paper's premise-free context (Table 10), derived from the request's context by the
  rule its lm-eval task has in ``TASK_RULES`` (or the rule forced with ``premise_free_rule=``).

The rules are plain string functions of the request's context, so they also hold for few-shot prompts (they
look only at the last question). Where lm-eval's prompt matches cblight's (PIQA, ARC, HellaSwag, COPA
apart from its connector word) the rule reproduces cblight's premise-free context exactly; elsewhere it
is the same idea applied to lm-eval's prompt (the question without its passage or premise; the answer cue).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

from cblight.errors import CblightError

ShortContextMode = Literal["last_k", "empty", "premise_free"]
#: The premise-free rules: the text rules of ``RULES``, and ``last_k``, token-level, applied by the model.
PremiseFreeRule = Literal["answer_cue", "question", "connector", "after_last_period", "empty", "last_k"]


class ShortContextError(CblightError):
    """A boosted request whose short context cannot be built (unknown mode, task without a rule)."""


def answer_cue(context: str) -> str:
    """The context's last line with a leading space: ``"Question: ...\\nAnswer:"`` -> ``" Answer:"``
    (cblight's PIQA and ARC premise-free context, Table 10)."""
    _, sep, last = context.rpartition("\n")
    if not sep or not last.strip():
        raise ShortContextError(
            f"rule answer_cue needs a context whose last line is an answer cue (e.g. 'Answer:'); "
            f"got ...{context[-60:]!r}"
        )
    return " " + last.lstrip()


def question(context: str) -> str:
    """Everything from the last line starting with ``Question:``, with a leading space: the question and
    answer cue without the passage or premise above them (BoolQ, RTE, CB, SST-2 in lm-eval's prompts; the
    analogue of cblight's ``" Question: {q}?\\n The answer is:"`` for BoolQ)."""
    at = context.rfind("\nQuestion:")
    if at < 0:
        raise ShortContextError(
            f"rule question needs a context with a line starting with 'Question:'; got ...{context[-60:]!r}"
        )
    return " " + context[at + 1 :]


def connector(context: str) -> str:
    """The context's last word with a leading space: COPA's `` because`` / `` so`` (lm-eval: ``therefore``)."""
    _, sep, last = context.rstrip().rpartition(" ")
    if not sep or not last:
        raise ShortContextError(f"rule connector needs a context ending in a connector word; got {context!r}")
    return " " + last


def after_last_period(context: str) -> str:
    """HellaSwag's premise-free context: the text after the last ``.`` (cblight's rule, the reference's
    ``get_contrast_ctx``); ``""`` (BOS/EOS alone) when the context ends with a period."""
    from cblight.data.tasks.hellaswag import premise_free

    return premise_free(context)


#: Rules that turn a request's context into its premise-free context.
RULES: dict[str, Callable[[str], str]] = {
    "answer_cue": answer_cue,
    "question": question,
    "connector": connector,
    "after_last_period": after_last_period,
    "empty": lambda context: "",  # BOS/EOS alone, as lm-eval's unconditional requests
}

#: lm-eval task name -> premise-free rule (docs/lmeval.md explains each choice).
TASK_RULES: dict[str, str] = {
    # "Question: {q}\nAnswer:" in lm-eval and in cblight: exactly cblight's " Answer:".
    "piqa": "answer_cue",
    "arc_easy": "answer_cue",
    "arc_challenge": "answer_cue",
    # lm-eval lists the lettered choices in the prompt; the answer cue is the premise-free part.
    "commonsense_qa": "answer_cue",
    # same prompt and rule as cblight (text after the last period).
    "hellaswag": "after_last_period",
    # "{premise} because|therefore": the connector word (cblight's prompt says "so" for effects).
    "copa": "connector",
    # lm-eval's prompt is the bare question stem, with no answer cue to keep: BOS/EOS alone.
    "openbookqa": "empty",
    "storycloze_2016": "empty",
    "storycloze_2018": "empty",
    # "{passage|premise|sentence}\nQuestion: ...\nAnswer:": the question without the passage.
    "boolq": "question",
    "cb": "question",
    "rte": "question",
    "sglue_rte": "question",
    "sst2": "question",
    # next-word prediction: the last k tokens, as the paper's LAMBADA (§3).
    "lambada_openai": "last_k",
    "lambada_standard": "last_k",
    # cblight's own prompts over local files (cblight/lmeval/tasks/).
    "cblight_copa": "connector",
    "cblight_piqa": "answer_cue",
}


def rule_for(mode: str, task: str | None, forced_rule: str | None = None) -> str:
    """The rule that builds the short context of a request of ``task`` under ``mode``."""
    if mode != "premise_free":
        return mode  # last_k, empty
    if forced_rule is not None:
        return forced_rule
    if task in TASK_RULES:
        return TASK_RULES[task]
    known = ", ".join(sorted(TASK_RULES))
    raise ShortContextError(
        f"no premise-free context is defined for lm-eval task {task!r} (short_context=premise_free); "
        f"tasks with a rule: {known}. Pass premise_free_rule=<{'|'.join(get_args(PremiseFreeRule))}> in --model_args, "
        "or use short_context=last_k or short_context=empty"
    )
