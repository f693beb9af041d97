"""How one batch of examples is scored: the per-example numbers every sweep is computed from.

One class per task kind turns examples into cache records with one forward pass per context form
(DESIGN.md §5) and feeds those records to the kind's sweep metric:

* ``ChoiceScoring`` (paper eq. 2, Table 4): every choice's log-likelihood after the full and after the
  premise-free context;
* ``NextTokenScoring`` (paper §3, Tables 1 and 5): the target's log-prob and rank under ``f_max``, each
  ``f_k`` and the boosted mix at every (k, alpha) of the grid.

Both also compute the comparison methods of Tables 5, 11 and 12 that a run asks for
(``cblight.modules.methods``): PMI_DC, contextual calibration and the noisy channel.

They talk to the model only through a *backend* with ``Scorer``'s interface (``score_text``,
``encoder``, ``next_token_log_probs``, ``last_k_log_probs``), so another backend (e.g. a served model)
or another scoring method (a new ``ExampleScoring`` subclass registered in ``SCORINGS``) plugs in here
without touching the Lightning loop (``cblight.modules.evaluation``) or the selection and report
(``cblight.modules.selection``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from cblight.baselines import calibrated_next_token, calibrated_scores, calibration_prior, pmi_scores
from cblight.boosting import next_token_alpha_sweep
from cblight.data.baseline_prompts import BASELINE_PROMPTS, channel_prefixes, domain_premise
from cblight.data.datamodule import TaskSplit
from cblight.data.examples import ChoiceExample, DataError, Example, NextTokenExample
from cblight.metrics.sweeps import ChoiceSweep, NextTokenSweep
from cblight.modules.methods import BaselineOptions, fixed_labels, not_applicable
from cblight.results import digest


class ExampleScoring:
    """One task kind's scoring: records from examples, and the sweep metric those records update.

    ``signature`` holds the settings that change the cached numbers (a cache written under others is
    refused); ``record_fields`` are the keys every record of this kind must carry (a cache row without
    them is corrupt and recomputed).
    """

    kind: ClassVar[str] = ""
    record_fields: ClassVar[tuple[str, ...]] = ("id", "input")

    def signature(self) -> dict[str, Any]:
        return {}

    def new_sweep(self, split: TaskSplit) -> nn.Module:
        raise NotImplementedError

    methods: Sequence[str] = ()  # the comparison methods this scoring adds to boosting

    def method_digest(self, method: str, example: Example) -> str:
        """A digest of what ``method`` feeds the model for ``example`` (kept in the record)."""
        raise NotImplementedError

    def describe(self, split: TaskSplit, requested: Sequence[str]) -> dict[str, Any]:
        """What ``results.json`` says about each requested comparison method: reported (with the strings
        it used) or why not."""
        info: dict[str, Any] = {}
        for m in requested:
            reason = not_applicable(m, split)
            info[m] = {"reported": True} if reason is None else {"reported": False, "not_applicable": reason}
        return info

    def missing(self, record: dict[str, Any] | None, example: Example) -> list[str]:
        """The parts of ``record`` to (re)compute for ``example``: ``boost`` (everything, for a new or
        changed example) or the methods whose inputs changed; empty when the record is complete."""
        if record is None or record.get("input") != self.input_digest(example):
            return ["boost", *self.methods]
        done = record.get("method_inputs", {})
        return [m for m in self.methods if done.get(m) != self.method_digest(m, example)]

    def score(
        self,
        backend: Any,
        split: TaskSplit,
        examples: Sequence[Example],
        previous: dict[int, dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """Records of ``examples``; ``previous`` holds their cached records (parts still valid are kept)."""
        raise NotImplementedError

    def update(self, sweep: Any, records: Sequence[dict[str, Any]]) -> None:
        raise NotImplementedError

    @staticmethod
    def input_digest(example: Example) -> str:
        return digest(example.input_key())


class ChoiceScoring(ExampleScoring):
    """Multiple choice: ``log f(a | full)`` and ``log f(a | premise-free)`` per choice (paper eq. 2), and the
    numbers of the comparison methods asked for (``cblight.modules.methods``):

    * ``pmi_dc``: ``ll_domain``, each choice after the domain premise (Holtzman et al. 2021);
    * ``pmi_empty``: ``ll_empty``, each choice after BOS/EOS alone (lm-eval's ``acc_mutual_info``);
    * ``calibrate``: ``ll_cf``, each label after every content-free context (Zhao et al. 2021; task-level,
      computed once per split and kept in every record so that a rerun needs no model);
    * ``channel``: ``ll_channel``, the input ``x`` after each verbalised label (Min et al. 2022).

    Each record keeps, per method, a digest of the strings that method fed the model
    (``method_inputs``): a rerun that adds a method, or changes a premise, computes only what is missing.
    """

    kind = "multiple_choice"
    record_fields = ("id", "input", "label", "ll_full", "ll_short", "n_tokens", "char_lengths")

    def __init__(
        self,
        alphas: Sequence[float],
        length_normalize: bool = False,
        methods: Sequence[str] = (),
        split: TaskSplit | None = None,
        options: BaselineOptions | None = None,
    ):
        self.alphas = list(alphas)
        self.length_normalize = length_normalize
        self.methods = [m for m in methods if m != "boost"]
        self.options = options or BaselineOptions()
        self.task = split.task.name if split is not None else ""
        if self.methods and split is None:
            raise ValueError("comparison methods need the split they score")
        self.labels = fixed_labels(split) if "calibrate" in self.methods and split is not None else None
        self.content_free = self.options.content_free("multiple_choice")
        self.channel = (
            channel_prefixes(self.task, self.options.channel_template) if "channel" in self.methods else []
        )
        self._cf: list[list[float]] | None = None

    def new_sweep(self, split: TaskSplit) -> nn.Module:
        return ChoiceSweep(self.alphas, split.max_choices, self.length_normalize, methods=self.methods)

    # -- what each method feeds the model ------------------------------------------------------------------
    def _cf_groups(self) -> list[tuple[str, Sequence[str]]]:
        form = BASELINE_PROMPTS[self.task].content_free
        assert form is not None and self.labels is not None
        return [(form(cf), self.labels) for cf in self.content_free]

    def _groups(self, method: str, ex: ChoiceExample) -> list[tuple[str, Sequence[str]]]:
        if method == "pmi_dc":
            return [(domain_premise(self.task, ex, self.options.domain_premises), ex.choices)]
        if method == "pmi_empty":
            return [("", ex.choices)]
        if method == "calibrate":
            return self._cf_groups()
        if method == "channel":
            form = BASELINE_PROMPTS[self.task].channel_input
            assert form is not None
            x = " " + form(ex.context)
            return [(prefix, [x]) for prefix in self.channel]
        raise ValueError(method)

    def method_digest(self, method: str, ex: Example) -> str:
        assert isinstance(ex, ChoiceExample)
        return digest(repr(self._groups(method, ex)))

    def score(
        self,
        backend: Any,
        split: TaskSplit,
        examples: Sequence[Example],
        previous: dict[int, dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        previous = previous or {}
        choices = [ex for ex in examples if isinstance(ex, ChoiceExample)]
        groups: list[tuple[str, Sequence[str]]] = []
        names: list[str] = []
        slots: list[tuple[int, str, int]] = []  # (example position, part, number of groups)
        need_cf = False
        for i, ex in enumerate(choices):
            for part in self.missing(previous.get(ex.idx), ex):
                if part == "boost":
                    parts = [("full context", ex.context), ("premise-free context", ex.premise_free)]
                    new = [(ctx, ex.choices) for _, ctx in parts]
                    labels = [label for label, _ in parts]
                elif part == "calibrate":
                    need_cf = need_cf or self._cf is None
                    continue
                elif part in PREMISE_METHODS and self._groups(part, ex)[0][0] == ex.premise_free:
                    slots.append((i, part, 0))  # the premise-free context's numbers serve: no new pass
                    continue
                else:
                    new = self._groups(part, ex)
                    labels = [part] * len(new)
                groups += new
                names += [f"{split.name} {ex.where} ({label})" for label in labels]
                slots.append((i, part, len(new)))
        if need_cf:
            cf = self._cf_groups()
            groups += cf
            names += [f"{split.name} content-free input {c!r}" for c in self.content_free]
        scores = backend.score_text(groups, names) if groups else []
        if need_cf:
            self._cf = [[s.log_prob for s in row] for row in scores[len(scores) - len(self.content_free) :]]
        records: dict[int, dict[str, Any]] = {}
        at = 0
        for i, part, n in slots:
            ex = choices[i]
            rec = records.get(ex.idx)
            if rec is None:
                old = previous.get(ex.idx)
                keep = old is not None and old.get("input") == self.input_digest(ex)
                rec = records[ex.idx] = dict(old) if keep and old else {}
                rec["method_inputs"] = dict(rec.get("method_inputs", {}))
            got = scores[at : at + n]
            at += n
            self._fill(rec, part, ex, got)
        for ex in choices:
            if ex.idx not in records:  # only its calibration numbers were missing
                records[ex.idx] = {
                    **previous[ex.idx],
                    "method_inputs": dict(previous[ex.idx]["method_inputs"]),
                }
            rec = records[ex.idx]
            if "calibrate" in self.methods and rec.get("method_inputs", {}).get("calibrate") != (
                self.method_digest("calibrate", ex)
            ):
                assert self._cf is not None
                rec["ll_cf"] = self._cf
                rec.setdefault("method_inputs", {})["calibrate"] = self.method_digest("calibrate", ex)
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
        if "calibrate" in self.methods:
            info["calibrate"]["content_free_inputs"] = self.content_free
        if "channel" in self.methods:
            info["channel"]["label_prefixes"] = self.channel
        return info

    def method_scores(self, record: dict[str, Any]) -> dict[str, list[float]]:
        """Each comparison method's per-choice scores (``cblight.baselines``) from one record."""
        full = torch.tensor(record["ll_full"], dtype=torch.float64).view(1, -1)
        out: dict[str, list[float]] = {}
        for m in self.methods:
            if m == "calibrate":
                prior = calibration_prior(torch.tensor(record["ll_cf"], dtype=torch.float64), "mean")
                out[m] = calibrated_scores(full, prior)[0].tolist()
            elif m == "channel":
                out[m] = list(record["ll_channel"])
            else:
                premise = torch.tensor(record[METHOD_FIELDS[m]], dtype=torch.float64).view(1, -1)
                out[m] = pmi_scores(full, premise)[0].tolist()
        return out

    def update(self, sweep: Any, records: Sequence[dict[str, Any]]) -> None:
        sweep.update(
            [r["id"] for r in records],
            [r["label"] for r in records],
            [r["ll_full"] for r in records],
            [r["ll_short"] for r in records],
            [r["char_lengths"] for r in records],
            method_scores=[self.method_scores(r) for r in records] if self.methods else None,
        )


PREMISE_METHODS = ("pmi_dc", "pmi_empty")
METHOD_FIELDS = {
    "pmi_dc": "ll_domain",
    "pmi_empty": "ll_empty",
    "calibrate": "ll_cf",
    "channel": "ll_channel",
}


class NextTokenScoring(ExampleScoring):
    """Next-token prediction: one full pass and one k-token pass per k; every alpha from those (paper §3).

    With ``calibrate`` (LAMA, Table 5's "Zhao et al." row) the full distribution is also calibrated as
    Zhao et al.'s ``run_lama.py`` does (``cblight.baselines.calibrated_next_token``), with one pass per
    relation template and content-free input; the record keeps the calibrated prediction.
    """

    kind = "next_token"
    record_fields = ("id", "input", *NextTokenSweep.base_columns)

    def __init__(
        self,
        ks: Sequence[int],
        alphas: Sequence[float],
        methods: Sequence[str] = (),
        options: BaselineOptions | None = None,
    ):
        self.ks = list(ks)
        self.alphas = list(alphas)
        self.methods = [m for m in methods if m != "boost"]
        self.options = options or BaselineOptions()
        self.content_free = self.options.content_free("next_token")
        self._cf: dict[str, torch.Tensor] = {}

    def signature(self) -> dict[str, Any]:
        return {"ks": self.ks, "alphas": self.alphas}

    def new_sweep(self, split: TaskSplit) -> nn.Module:
        return NextTokenSweep(self.ks, self.alphas, methods=self.methods)

    def method_digest(self, method: str, ex: Example) -> str:
        assert isinstance(ex, NextTokenExample)
        return digest(repr((ex.template, self.content_free, self.options.calibrate_top_n)))

    def describe(self, split: TaskSplit, requested: Sequence[str]) -> dict[str, Any]:
        info = super().describe(split, requested)
        if "calibrate" in self.methods:
            info["calibrate"]["content_free_inputs"] = self.content_free
        return info

    def missing(self, record: dict[str, Any] | None, ex: Example) -> list[str]:
        stale = super().missing(record, ex)
        return ["boost", *self.methods] if stale else []  # calibration needs the full pass again

    def _calibrated(
        self, backend: Any, passages: Sequence[NextTokenExample], full: torch.Tensor
    ) -> list[int]:
        enc = backend.encoder
        new = sorted({ex.template for ex in passages} - set(self._cf))
        if new:
            prompts = [enc.context(t.replace("[X]", cf)) for t in new for cf in self.content_free]
            lp = backend.next_token_log_probs(prompts).view(len(new), len(self.content_free), -1)
            self._cf.update({t: lp[i] for i, t in enumerate(new)})
        cf = torch.stack([self._cf[ex.template].to(full.device) for ex in passages])
        return calibrated_next_token(full, cf, self.options.calibrate_top_n, reduce="min").tolist()

    def score(
        self,
        backend: Any,
        split: TaskSplit,
        examples: Sequence[Example],
        previous: dict[int, dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        enc = backend.encoder
        passages = [ex for ex in examples if isinstance(ex, NextTokenExample)]
        contexts, targets = [], []
        for ex in passages:
            ids = enc.context(ex.text)
            if len(ids) - len(enc.prefix) < 2:
                raise DataError(f"{split.name}: the passage at {ex.where} has fewer than 2 tokens")
            contexts.append(ids[:-1])
            targets.append(ids[-1])
        full = backend.next_token_log_probs(contexts)
        tgt = torch.tensor(targets, device=full.device)
        alphas = torch.tensor(self.alphas)
        full_lp = full.gather(1, tgt[:, None]).squeeze(1)
        full_rank = (full > full_lp[:, None]).sum(-1) + 1
        full_correct = full.argmax(-1) == tgt
        short_lp, short_rank, correct, log_prob, rank = [], [], [], [], []
        for k in self.ks:
            short = backend.last_k_log_probs(contexts, k, full=full)
            s_lp = short.gather(1, tgt[:, None]).squeeze(1)
            short_lp.append(s_lp)
            short_rank.append((short > s_lp[:, None]).sum(-1) + 1)
            sweep = next_token_alpha_sweep(full, short, tgt, alphas, "next_token")
            correct.append(sweep["correct"])
            log_prob.append(sweep["log_prob"])
            rank.append(sweep["rank"])
        calibrated = self._calibrated(backend, passages, full) if "calibrate" in self.methods else None
        stack = {
            "short_log_prob": torch.stack(short_lp, 1).tolist(),
            "short_rank": torch.stack(short_rank, 1).tolist(),
            "boosted_correct": torch.stack(correct, 1).int().tolist(),
            "boosted_log_prob": torch.stack(log_prob, 1).tolist(),
            "boosted_rank": torch.stack(rank, 1).tolist(),
        }
        return [
            {
                "id": ex.idx,
                "input": self.input_digest(ex),
                "target": targets[i],
                "full_log_prob": float(full_lp[i]),
                "full_rank": int(full_rank[i]),
                "full_correct": int(full_correct[i]),
                **{name: value[i] for name, value in stack.items()},
                **(
                    {
                        "calibrated_pred": calibrated[i],
                        "calibrated_correct": int(calibrated[i] == targets[i]),
                        "method_inputs": {"calibrate": self.method_digest("calibrate", ex)},
                    }
                    if calibrated is not None
                    else {}
                ),
            }
            for i, ex in enumerate(passages)
        ]

    def update(self, sweep: Any, records: Sequence[dict[str, Any]]) -> None:
        sweep.update(
            [r["id"] for r in records],
            **{name: torch.tensor([r[name] for r in records]) for name in sweep.columns},
        )


SCORINGS: dict[str, type[ExampleScoring]] = {cls.kind: cls for cls in (ChoiceScoring, NextTokenScoring)}
