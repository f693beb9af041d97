"""Which scoring methods a run reports, with what options, and which ones apply to a task.

``boost`` is coherence boosting (paper eq. 2 / §3), always computed: its alpha = 0 column is ``f_max`` and
its alpha* column is the tables' "Ours". The comparison methods of Tables 5, 11 and 12 are

* ``pmi_dc``: domain-conditional PMI with the task's domain premise (Holtzman et al. 2021);
* ``pmi_empty``: the same with an empty premise (BOS/EOS alone): lm-evaluation-harness's ``acc_mutual_info``;
* ``calibrate``: contextual calibration (Zhao et al. 2021), for tasks with one fixed label set and for LAMA;
* ``channel``: the noisy channel (Min et al. 2022), for SST-2, SST-5, AGNews and TREC.

The maths is ``cblight.evaluate.baselines``; the strings ``cblight.evaluate.method_prompts``. A method that does not
apply to a task (contextual calibration on CommonsenseQA, whose answers change with every question) is
reported as not applicable with the reason, the "-" of the paper's tables, never as a number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from cblight.data.datamodule import TaskSplit
from cblight.data.examples import ChoiceExample, NextTokenExample
from cblight.errors import ConfigError
from cblight.evaluate.method_prompts import BASELINE_PROMPTS

MethodName = Literal["boost", "pmi_dc", "pmi_empty", "calibrate", "channel"]
METHODS: tuple[str, ...] = ("boost", "pmi_dc", "pmi_empty", "calibrate", "channel")
# Zhao et al. 2021's content-free inputs: run_classification.py (averaged) and run_lama.py (minimum)
CHOICE_CONTENT_FREE = ("N/A", "", "[MASK]")
LAMA_CONTENT_FREE = ("[MASK]", "N/A", "BLANK")


@dataclass
class BaselineOptions:
    """Options of the comparison methods.

    Args:
        domain_premises: per-task PMI_DC premises replacing the defaults (``{csqa: " the answer is:"}``).
        content_free_inputs: contextual calibration's content-free inputs; default Zhao et al.'s:
            ``["N/A", "", "[MASK]"]`` (averaged) for classification, ``["[MASK]", "N/A", "BLANK"]``
            (minimum) for LAMA.
        calibrate_top_n: LAMA's calibration candidates: each example's top-N first tokens (Zhao et al.'s
            API limit, 100); 0 calibrates over the whole vocabulary.
        channel_template: which of Min et al.'s four verbalisation templates the channel method uses (0-3).
    """

    domain_premises: dict[str, str] | None = None
    content_free_inputs: list[str] | None = None
    calibrate_top_n: int = 100
    channel_template: int = 0

    def check(self) -> None:
        if self.calibrate_top_n < 0:
            raise ConfigError(f"baselines.calibrate_top_n must be >= 0, got {self.calibrate_top_n}")
        if not 0 <= self.channel_template < 4:
            raise ConfigError(f"baselines.channel_template must be 0..3, got {self.channel_template}")
        if self.content_free_inputs is not None and not self.content_free_inputs:
            raise ConfigError("baselines.content_free_inputs is empty")

    def content_free(self, kind: str) -> list[str]:
        if self.content_free_inputs is not None:
            return list(self.content_free_inputs)
        return list(LAMA_CONTENT_FREE if kind == "next_token" else CHOICE_CONTENT_FREE)


def check_methods(methods: Sequence[str]) -> list[str]:
    """The methods in the order given, ``boost`` first (always computed); unknown names refused."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"methods: unknown {unknown}; choose from {list(METHODS)}")
    if len(set(methods)) != len(methods):
        raise ConfigError(f"methods repeats a name: {list(methods)}")
    return ["boost", *[m for m in methods if m != "boost"]]


def fixed_labels(split: TaskSplit) -> tuple[str, ...] | None:
    """The one answer set every example of ``split`` shares, or ``None`` when answers vary."""
    choices = {ex.choices for ex in split.examples if isinstance(ex, ChoiceExample)}
    return next(iter(choices)) if len(choices) == 1 else None


def not_applicable(method: str, split: TaskSplit) -> str | None:
    """Why ``method`` cannot score ``split`` (``None`` when it can)."""
    task, kind = split.task.name, split.task.kind
    if method == "boost":
        return None
    if kind == "next_token":
        if method == "calibrate" and all(
            isinstance(ex, NextTokenExample) and ex.template for ex in split.examples
        ):
            return None
        return f"{method} is defined for multiple-choice tasks" + (
            " (and contextual calibration for LAMA)" if method == "calibrate" else ""
        )
    prompts = BASELINE_PROMPTS.get(task)
    if method in ("pmi_dc", "pmi_empty"):
        return None
    if method == "calibrate":
        if prompts is None or prompts.content_free is None:
            return "contextual calibration needs one fixed label set and a content-free form of the prompt"
        if fixed_labels(split) is None:
            return "the examples do not share one label set"
        return None
    if method == "channel":
        if prompts is None or not prompts.channel_templates:
            return "Min et al. define channel verbalisers for SST-2, SST-5, AGNews and TREC only"
        return None
    raise ConfigError(f"unknown method {method!r}")
