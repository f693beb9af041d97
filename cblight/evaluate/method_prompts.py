"""What the paper's comparison methods feed the model, per task (Tables 5, 11, 12; maths in
``cblight.evaluate.methods``).

* **Domain premise** of domain-conditional PMI (Holtzman et al. 2021): a short task-level string after which
  the answer's prior probability is measured. Where the paper's Table 10 premise-free context is such a
  task-level string, it is the default (``" the answer is:"`` for CommonsenseQA, ``" Answer:"`` for ARC and
  PIQA, ...); where Table 10's is example-specific (BoolQ, RTE, CB hold the question) or empty (StoryCloze),
  Holtzman et al.'s own string for the dataset (their ``data_loaders.py``, ``uncond_premise``) is used,
  reworded to the tail of cblight's prompt where the two prompts differ. COPA's (the connector) and
  HellaSwag's (the context's last word, Holtzman et al.'s rule) depend on the example. ``--model.method_options
  .domain_premises`` overrides any of them.
* **Content-free contexts** of contextual calibration (Zhao et al. 2021): the task's prompt with every
  input field replaced by a content-free string (``"N/A"``, ``""``, ``"[MASK]"``). Defined for the tasks
  whose answers are one fixed label set (the classification tasks: SST-2/5, AGNews, TREC, BoolQ, RTE, CB),
  as Zhao et al.'s calibration needs; for LAMA the relation template with ``[X]`` replaced
  (``NextTokenExample.template``).
* **Channel prompts** of the noisy-channel method (Min et al. 2022): each label verbalised by one of their
  four templates for the dataset (``util.py``, ``get_prompts``), as a prefix, followed by the example's input
  ``x`` (with a leading space). Defined for the four tasks Table 12 reports Channel on: SST-2, SST-5,
  AGNews, TREC. Min et al. also wrap the sequence in GPT-2's ``<|endoftext|>`` and score a final one; here
  the prefix gets the model's usual special prefix (BOS where it has one, as every cblight score) and only
  ``x`` is scored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from cblight.data.examples import ChoiceExample, DataError

__all__ = ["MethodPrompts", "channel_prefixes", "domain_premise", "method_prompts"]

# Min et al. 2022, util.py get_prompts: four templates per dataset (``%s`` is the label word)
_SST_TEMPLATES = ("A %s one . ", "It was %s . ", "All in all %s . ", "A %s piece . ")
_TREC_TEMPLATES = ("%s : ", "Q: %s : ", "Why %s ? ", "Answer: %s . ")
_TOPIC_TEMPLATES = ("Topic: %s. ", "Subject: %s. ", "This is about %s. ", "It is about %s. ")


def _strip(context: str, head: str, tail: str, task: str) -> str:
    """The text of ``context`` between ``head`` and ``tail``, which the task's prompt puts around it."""
    if not (context.startswith(head) and context.endswith(tail)) or len(context) < len(head) + len(tail):
        raise DataError(f"{task}: context {context[:60]!r} is not {head!r} + input + {tail!r}")
    return context[len(head) : len(context) - len(tail)]


def _agnews_input(context: str) -> str:
    """Min et al.'s AGNews input: title and description joined by a space."""
    body = _strip(context, "Title: ", "\nTopic:", "agnews")
    title, sep, description = body.partition("\nSummary: ")
    if not sep:
        raise DataError(f"agnews: context {context[:60]!r} has no '\\nSummary: '")
    return f"{title} {description}"


@dataclass(frozen=True)
class MethodPrompts:
    """One task's strings for PMI_DC, contextual calibration and the noisy channel (module docstring).

    ``domain_premise`` is the task-level premise, or where the premise depends on the example the rule that
    gives it. ``content_free(cf)`` renders the task's context around a content-free input (``None``:
    calibration does not apply). ``channel_templates`` and ``channel_words`` are Min et al.'s (one word
    per answer, in the task's answer order); ``channel_input`` recovers ``x`` from a rendered context.
    """

    domain_premise: str | Callable[[ChoiceExample], str]
    content_free: Callable[[str], str] | None = None
    channel_templates: tuple[str, ...] = ()
    channel_words: tuple[str, ...] = ()
    channel_input: Callable[[str], str] | None = None


def _last_word(example: ChoiceExample) -> str:
    """Holtzman et al.'s HellaSwag premise: the context from its last space on (``premise[rfind(' '):]``)."""
    context = example.context.strip()
    return context[context.rfind(" ") :] if " " in context else " " + context


@cache
def method_prompts() -> dict[str, MethodPrompts]:
    """Each task's ``MethodPrompts``, built on first use (the SST and SuperGLUE task modules load then)."""
    from cblight.data.tasks import sst, superglue

    sst_forms = {
        "content_free": lambda cf: sst.CONTEXT.format(cf),
        "channel_templates": _SST_TEMPLATES,
        "channel_input": lambda ctx: _strip(ctx, "", sst.PREMISE_FREE, "sst"),
    }

    # The source of each domain premise is in the comment above its task.
    return {
        # Holtzman et al. 2021 (load_examples_storycloze)
        "storycloze": MethodPrompts(" The story continues:"),
        # Holtzman et al. 2021 (load_examples_hellaswag: the last word)
        "hellaswag": MethodPrompts(_last_word),
        # paper Table 10 = Holtzman et al. 2021 (the connector " because" / " so")
        "copa": MethodPrompts(lambda example: example.premise_free),
        # paper Table 10 = Holtzman et al. 2021
        "csqa": MethodPrompts(" the answer is:"),
        "openbookqa": MethodPrompts(" the answer is:"),
        # paper Table 10, as for every task below unless said otherwise
        "arc_easy": MethodPrompts(" Answer:"),
        "arc_challenge": MethodPrompts(" Answer:"),
        "piqa": MethodPrompts(" Answer:"),
        "sst2": MethodPrompts(sst.PREMISE_FREE, channel_words=("terrible", "great"), **sst_forms),
        "sst5": MethodPrompts(
            sst.PREMISE_FREE, channel_words=("terrible", "bad", "okay", "good", "great"), **sst_forms
        ),
        "agnews": MethodPrompts(
            "\nTopic:",
            content_free=lambda cf: f"Title: {cf}\nSummary: {cf}\nTopic:",
            channel_templates=_TOPIC_TEMPLATES,
            channel_words=("World", "Sports", "Business", "Technology"),
            channel_input=_agnews_input,
        ),
        # paper Table 10 = Holtzman et al. 2021
        "trec": MethodPrompts(
            " The answer to this question will be",
            content_free=lambda cf: f"{cf} The answer to this question will be",
            channel_templates=_TREC_TEMPLATES,
            # trec.ANSWERS order: DESC, ENTY, LOC, NUM, ABBR, HUM (Min et al.'s words for those classes)
            channel_words=("Description", "Entity", "Location", "Number", "Expression", "Human"),
            channel_input=lambda ctx: _strip(ctx, "", " The answer to this question will be", "trec"),
        ),
        # BoolQ and CB: Holtzman et al. 2021 (uncond_premise), worded as the tail of cblight's prompt
        "boolq": MethodPrompts(
            "\n The answer is:",
            content_free=lambda cf: (
                f"Title: {cf}\n Question: {superglue.boolq_question(cf)}?\n The answer is:"
            ),
        ),
        # Holtzman et al. 2021 (load_examples_rte)
        "rte": MethodPrompts(
            " true or false?\n answer:",
            content_free=lambda cf: f"{cf}\n question: {cf} true or false?\n answer:",
        ),
        "cb": MethodPrompts(
            " true, false, or neither?\n The answer is:",
            content_free=lambda cf: (
                f" Given question: {cf} Is {cf} true, false, or neither?\n The answer is:"
            ),
        ),
    }


def domain_premise(task: str, example: ChoiceExample, overrides: dict[str, str] | None = None) -> str:
    """PMI_DC's domain premise for ``example`` of ``task`` (an override first, then the table above)."""
    if overrides and task in overrides:
        return overrides[task]
    prompts = method_prompts().get(task)
    if prompts is None:
        raise DataError(
            f"{task}: no domain premise is defined; give one with --model.method_options.domain_premises"
        )
    premise = prompts.domain_premise
    return premise if isinstance(premise, str) else premise(example)


def channel_prefixes(task: str, template: int = 0) -> list[str]:
    """Min et al.'s verbalised labels of ``task`` in answer order (template ``template`` of their four),
    stripped as their ``prepare_data`` does for the channel direction."""
    prompts = method_prompts()[task]  # one of the tasks methods.not_applicable lets the channel method score
    return [(prompts.channel_templates[template] % word).strip() for word in prompts.channel_words]
