"""Multiple-choice answer selection (paper eq. 2, Table 4) and its comparison methods (Tables 11, 12).

Every choice ``a`` of a question is scored after the full context and after the premise-free context
(paper Table 10) once; ``log f(a | full) + alpha · log f(a | premise-free)`` at every alpha of the grid is
then arithmetic on the cached numbers (``ChoiceSweep``), so the whole curve costs the two passes. The
comparison methods add their own passes (their strings: ``cblight.evaluate.method_prompts``) and their
scores (``cblight.evaluate.methods``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from cblight.adaptive import choice_alphas, context_gain, prior_share, same_prior_everywhere, summary
from cblight.boosting import choice_predictions, first_argmax
from cblight.cache import digest
from cblight.data.datamodule import TaskSplit
from cblight.data.examples import ChoiceExample, Example
from cblight.evaluate.method_prompts import channel_prefixes, domain_premise, method_prompts
from cblight.evaluate.methods import METHOD_FIELDS, PREMISE_METHODS, fixed_labels, method_scores, predictions
from cblight.evaluate.task_scoring import Record, Rows, Sweep, TaskScoring, accuracy
from cblight.metrics.sweeps import ChoiceSweep
from cblight.scoring import TextScorer


class MultipleChoice(TaskScoring):
    """Multiple choice (paper eq. 2, Table 4): ``log f(a | full)`` and ``log f(a | premise-free)`` per choice,
    accuracy at alpha = 0, -1 (PMI) and alpha*, and the whole curve; and the numbers of the comparison
    methods asked for (``cblight.evaluate.methods``, Tables 11/12: ``acc_pmi_dc``, ``acc_calibrate``, ...):

    * ``pmi_dc``: ``ll_domain``, each choice after the domain premise (Holtzman et al. 2021);
    * ``pmi_empty``: ``ll_empty``, each choice after BOS/EOS alone (lm-eval's ``acc_mutual_info``);
    * ``calibrate``: ``ll_cf``, each label after every content-free context (Zhao et al. 2021; task-level,
      computed once per split and kept in every record so that a rerun needs no model);
    * ``channel``: ``ll_channel``, the input ``x`` after each verbalised label (Min et al. 2022).

    Each record keeps, per method, a digest of the strings that method fed the model
    (``method_inputs``): a rerun that adds a method, or changes a premise, computes only what is missing.

    With ``adaptive`` (a rule of ``cblight.adaptive.CHOICE_RULES``, docs/adaptive.md) the report adds a row
    boosted with each question's label-free alpha, computed from the same two numbers per choice.
    """

    kind = "multiple_choice"
    record_fields = ("id", "input", "label", "ll_full", "ll_short", "n_tokens", "char_lengths")

    def __init__(self, run: Any, split: TaskSplit, methods: Sequence[str], adaptive: str | None):
        super().__init__(run, split, methods, adaptive)
        self.alphas = list(run.choice_alphas)
        self.length_normalize = run.length_normalize
        self.task = split.task.name
        self.labels = fixed_labels(split) if "calibrate" in self.methods else None
        self.channel = (
            channel_prefixes(self.task, self.options.channel_template) if "channel" in self.methods else []
        )
        self._cf: list[list[float]] | None = None

    def _record_has_shape(self, record: Record, example: Example) -> bool:
        n = len(example.choices) if isinstance(example, ChoiceExample) else -1
        return all(
            isinstance(record[f], list) and len(record[f]) == n
            for f in ("ll_full", "ll_short", "char_lengths")
        )

    def new_sweep(self, split: TaskSplit) -> nn.Module:
        return ChoiceSweep(self.alphas, split.max_choices, self.length_normalize, methods=self.methods)

    # -- what each method feeds the model ------------------------------------------------------------------
    def _cf_groups(self) -> list[tuple[str, Sequence[str]]]:
        form = method_prompts()[self.task].content_free
        assert form is not None and self.labels is not None
        return [(form(cf), self.labels) for cf in self.content_free]

    def _groups(self, method: str, ex: ChoiceExample) -> list[tuple[str, Sequence[str]]]:
        if method == "pmi_dc":
            return [(domain_premise(self.task, ex, self.options.domain_premises), ex.choices)]
        if method == "pmi_empty":
            return [("", ex.choices)]
        if method == "calibrate":
            return self._cf_groups()
        form = method_prompts()[self.task].channel_input  # channel: the input after each label
        assert form is not None
        return [(prefix, [" " + form(ex.context)]) for prefix in self.channel]

    def method_digest(self, method: str, ex: Example) -> str:
        assert isinstance(ex, ChoiceExample)
        return digest(repr(self._groups(method, ex)))

    def score(
        self, scorer: TextScorer, split: TaskSplit, examples: Sequence[Example], previous: dict[int, Record]
    ) -> list[Record]:
        choices = [ex for ex in examples if isinstance(ex, ChoiceExample)]
        groups: list[tuple[str, Sequence[str]]] = []
        names: list[str] = []
        slots: list[tuple[int, str, int]] = []  # (example position, part, number of groups)
        need_cf = False
        for i, ex in enumerate(choices):
            for part in self.missing(previous.get(ex.idx), ex):
                if part == "boost":
                    new = [(ex.context, ex.choices), (ex.premise_free, ex.choices)]
                    labels = ["full context", "premise-free context"]
                elif part == "calibrate":
                    need_cf = need_cf or self._cf is None
                    continue
                else:
                    new = self._groups(part, ex)
                    if part in PREMISE_METHODS and new[0][0] == ex.premise_free:
                        new = []  # the premise-free context's numbers serve: no new pass
                    labels = [part] * len(new)
                groups += new
                names += [f"{split.name} {ex.where} ({label})" for label in labels]
                slots.append((i, part, len(new)))
        if need_cf:
            groups += self._cf_groups()
            names += [f"{split.name} content-free input {c!r}" for c in self.content_free]
        scores = scorer.score_text(groups, names) if groups else []
        if need_cf:
            self._cf = [[s.log_prob for s in row] for row in scores[len(scores) - len(self.content_free) :]]
        records: dict[int, Record] = {}
        for ex in choices:  # the cached record of the same input keeps its valid parts
            old = previous.get(ex.idx) or {}
            old = old if old.get("input") == self.input_digest(ex) else {}
            records[ex.idx] = {**old, "method_inputs": dict(old.get("method_inputs", {}))}
        at = 0
        for i, part, n in slots:
            self._fill(records[choices[i].idx], part, choices[i], scores[at : at + n])
            at += n
        for ex in choices if "calibrate" in self.methods else ():  # task-level numbers, kept in every record
            rec, inputs = records[ex.idx], self.method_digest("calibrate", ex)
            if rec["method_inputs"].get("calibrate") != inputs:
                assert self._cf is not None
                rec["ll_cf"] = self._cf
                rec["method_inputs"]["calibrate"] = inputs
        return [records[ex.idx] for ex in choices]

    def _fill(self, rec: dict[str, Any], part: str, ex: ChoiceExample, got: list[list[Any]]) -> None:
        if part == "boost":
            full, short = got
            rec.update(
                id=ex.idx,
                input=self.input_digest(ex),
                label=ex.label,
                ll_full=[s.log_prob for s in full],
                ll_short=[s.log_prob for s in short],
                n_tokens=[s.num_tokens for s in full],
                greedy_full=[s.is_greedy for s in full],
                char_lengths=[len(c) for c in ex.choices],
            )
            return
        if part == "channel":
            values = [row[0].log_prob for row in got]
        elif not got:  # the premise is the premise-free context (CommonsenseQA's " the answer is:")
            values = list(rec["ll_short"])
        else:
            values = [s.log_prob for s in got[0]]
        rec[METHOD_FIELDS[part]] = values
        rec["method_inputs"][part] = self.method_digest(part, ex)

    def describe(self, split: TaskSplit, requested: Sequence[str]) -> dict[str, Any]:
        info = super().describe(split, requested)
        if "pmi_dc" in self.methods:
            premises = {domain_premise(self.task, ex, self.options.domain_premises) for ex in split.examples}
            info["pmi_dc"]["domain_premise"] = sorted(premises) if len(premises) > 1 else premises.pop()
        if "channel" in self.methods:
            info["channel"]["label_prefixes"] = self.channel
        return info

    def update(self, sweep: Any, records: Sequence[Record]) -> None:
        columns = ([r[f] for r in records] for f in ("id", "label", "ll_full", "ll_short", "char_lengths"))
        scores = [method_scores(self.methods, r) for r in records] if self.methods else None
        sweep.update(*columns, method_scores=scores)

    # -- selection and report ------------------------------------------------------------------------------
    def best(self, out: Sweep) -> dict[str, Any]:
        best = first_argmax(out["acc"])
        return {"alpha_star": self.alphas[best], "acc": float(out["acc"][best]), "curve": out["acc"].tolist()}

    def report(
        self, split: TaskSplit, out: Sweep, selection: dict[str, Any] | None
    ) -> tuple[dict[str, Any], Rows]:
        full, short = out["ll_full"], out["ll_short"]
        lengths = out["char_lengths"] if self.length_normalize else None
        preds = {
            name: choice_predictions(full, short, a, lengths) for name, a in (("base", 0.0), ("pmi", -1.0))
        }
        preds.update((m, predictions(out[f"method_{m}"])) for m in self.methods)
        labels = out["labels"]
        report: dict[str, Any] = {"split": split.description, "n": int(out["ids"].numel())}
        for name, pred in preds.items():
            report.update(accuracy(pred == labels, f"acc_{name}"))
        best = self.best(out)  # the report split's own best alpha: the oracle
        report.update(oracle_alpha=best["alpha_star"], oracle_acc=best["acc"])
        if selection is not None:
            alpha = selection["alpha_star"]
            preds["boosted"] = choice_predictions(full, short, alpha, lengths)
            report.update(alpha_star=alpha, **accuracy(preds["boosted"] == labels, "acc"))
        adaptive = None
        if self.adaptive is not None:  # no labels: each question's alpha from its own numbers
            adaptive = choice_alphas(self.adaptive, full, short, self.alphas, lengths)
            preds["adaptive"] = choice_predictions(full, short, adaptive.view(-1, 1), lengths)
            report.update(accuracy(preds["adaptive"] == labels, "acc_adaptive"))
            info = report["adaptive"] = {"rule": self.adaptive, **summary(adaptive)}
            if self.adaptive == "gated":  # what the gate read, so a fallback to the base model is visible
                gain, stderr = context_gain(full, short, lengths)
                same = same_prior_everywhere(full, short)
                share = prior_share(full, short, lengths) if same else None  # the gate of a fixed label set
                info["gate"] = dict(context_gain=gain, stderr=stderr, same_prior=same, prior_share=share)
        sweep = {"alphas": self.alphas, "report_acc": best["curve"]}
        result = self._result(split, report, selection, sweep, length_normalize=self.length_normalize)
        rows = []
        for i, idx in enumerate(out["ids"].tolist()):
            ex = split.by_idx[idx]
            assert isinstance(ex, ChoiceExample)
            m = len(ex.choices)
            row = {
                "id": idx,
                "label": int(labels[i]),
                "context": ex.context,
                "premise_free": ex.premise_free,
                "choices": list(ex.choices),
                "ll_full": out["ll_full"][i, :m].tolist(),
                "ll_short": out["ll_short"][i, :m].tolist(),
                **{f"score_{name}": out[f"method_{name}"][i, :m].tolist() for name in self.methods},
            }
            for name, pred in preds.items():
                row[f"pred_{name}"] = int(pred[i])
                row[f"correct_{name}"] = bool(pred[i] == labels[i])
            if adaptive is not None:
                row["alpha_adaptive"] = float(adaptive[i])
            rows.append(row)
        return result, rows
