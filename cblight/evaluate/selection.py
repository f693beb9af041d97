"""How the sweep becomes a choice and a report: alpha* (and k*) on the selection split, accuracies with
standard errors on the report split, and the per-example prediction rows.

Pure functions of a sweep metric's ``compute()`` output and the grid, free of Lightning: the evaluator
(``cblight.evaluate.boosted_evaluator``) calls ``select`` at the end of the validation loop and ``report`` at the
end of the test loop. Ties for alpha* go to the first value in grid order, as in the reference
(DESIGN.md §1). One class per task kind, registered in ``REPORTS``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from cblight.boosting import binomial_stderr, choice_predictions, first_argmax
from cblight.data.datamodule import TaskSplit
from cblight.data.examples import ChoiceExample
from cblight.evaluate.baselines import predictions

Rows = list[dict[str, Any]]


class SweepReport(ABC):
    """One task kind's selection (``select``) and report (``report``) from its sweep's output."""

    kind: ClassVar[str] = ""

    @abstractmethod
    def select(self, split: TaskSplit, out: dict[str, torch.Tensor]) -> dict[str, Any]: ...

    @abstractmethod
    def report(
        self, split: TaskSplit, out: dict[str, torch.Tensor], selection: dict[str, Any] | None
    ) -> tuple[dict[str, Any], Rows]: ...

    @staticmethod
    def _selection_info(split: TaskSplit, out: dict[str, torch.Tensor]) -> dict[str, Any]:
        info: dict[str, Any] = {"split": split.description, "n": int(out["ids"].numel())}
        if split.sampled_indices is not None:
            info["indices"] = split.sampled_indices
        return info


class ChoiceReport(SweepReport):
    """Multiple choice (paper Table 4): accuracy at alpha = 0, -1 (PMI) and alpha*, and the whole curve;
    with ``methods``, each comparison method's accuracy (Tables 11/12: ``acc_pmi_dc``, ``acc_calibrate``,
    ``acc_channel``, ...) from its per-choice scores (``cblight.evaluate.baselines``)."""

    kind = "multiple_choice"

    def __init__(self, alphas: Sequence[float], length_normalize: bool = False, methods: Sequence[str] = ()):
        self.alphas = list(alphas)
        self.length_normalize = length_normalize
        self.methods = [m for m in methods if m != "boost"]

    def select(self, split: TaskSplit, out: dict[str, torch.Tensor]) -> dict[str, Any]:
        info = self._selection_info(split, out)
        best = first_argmax(out["acc"])
        info.update(alpha_star=self.alphas[best], acc=float(out["acc"][best]), curve=out["acc"].tolist())
        return info

    def report(
        self, split: TaskSplit, out: dict[str, torch.Tensor], selection: dict[str, Any] | None
    ) -> tuple[dict[str, Any], Rows]:
        n = int(out["ids"].numel())
        lengths = out["char_lengths"] if self.length_normalize else None
        preds = {
            name: choice_predictions(out["ll_full"], out["ll_short"], alpha, lengths)
            for name, alpha in (("base", 0.0), ("pmi", -1.0))
        }
        labels = out["labels"]
        report: dict[str, Any] = {"split": split.description, "n": n}
        for name in ("base", "pmi"):
            acc = float((preds[name] == labels).double().mean())
            report[f"acc_{name}"] = acc
            report[f"acc_{name}_stderr"] = binomial_stderr(acc, n)
        for m in self.methods:
            preds[m] = predictions(out[f"method_{m}"])
            acc = float((preds[m] == labels).double().mean())
            report[f"acc_{m}"] = acc
            report[f"acc_{m}_stderr"] = binomial_stderr(acc, n)
        curve = out["acc"]
        oracle = first_argmax(curve)
        report["oracle_alpha"] = self.alphas[oracle]
        report["oracle_acc"] = float(curve[oracle])
        if selection is not None:
            alpha = selection["alpha_star"]
            preds["boosted"] = choice_predictions(out["ll_full"], out["ll_short"], alpha, lengths)
            acc = float((preds["boosted"] == labels).double().mean())
            report.update(alpha_star=alpha, acc=acc, acc_stderr=binomial_stderr(acc, n))
        result = {
            "kind": "multiple_choice",
            "title": split.task.title,
            "length_normalize": self.length_normalize,
            "report": report,
            "selection": {k: v for k, v in (selection or {}).items() if k != "curve"} or None,
            "sweep": {
                "alphas": self.alphas,
                "report_acc": curve.tolist(),
                "selection_acc": selection["curve"] if selection else None,
            },
        }
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
            rows.append(row)
        return result, rows


class NextTokenReport(SweepReport):
    """Next-token prediction (paper Tables 1 and 5): accuracy and perplexity over (k, alpha); k*, alpha*."""

    kind = "next_token"

    def __init__(
        self,
        ks: Sequence[int],
        alphas: Sequence[float],
        decode: Callable[[list[int]], str],
        methods: Sequence[str] = (),
    ):
        self.ks = list(ks)
        self.alphas = list(alphas)
        self.decode = decode
        self.methods = [m for m in methods if m != "boost"]

    def select(self, split: TaskSplit, out: dict[str, torch.Tensor]) -> dict[str, Any]:
        info = self._selection_info(split, out)
        ki, ai = divmod(first_argmax(out["acc"]), len(self.alphas))
        info.update(
            k_star=self.ks[ki],
            alpha_star=self.alphas[ai],
            acc=float(out["acc"][ki, ai]),
            curve=out["acc"].tolist(),
            ppl=out["ppl"].tolist(),
        )
        return info

    def report(
        self, split: TaskSplit, out: dict[str, torch.Tensor], selection: dict[str, Any] | None
    ) -> tuple[dict[str, Any], Rows]:
        n = int(out["ids"].numel())
        acc_base = float(out["full_correct"].double().mean())
        report: dict[str, Any] = {
            "split": split.description,
            "n": n,
            "acc_base": acc_base,
            "acc_base_stderr": binomial_stderr(acc_base, n),
            "ppl_base": float(torch.exp(-out["full_log_prob"].double().mean())),
        }
        if "calibrate" in self.methods:  # Table 5's "Zhao et al." row
            acc = float(out["calibrated_correct"].double().mean())
            report.update(acc_calibrate=acc, acc_calibrate_stderr=binomial_stderr(acc, n))
        ko, ao = divmod(first_argmax(out["acc"]), len(self.alphas))
        report.update(
            oracle_k=self.ks[ko], oracle_alpha=self.alphas[ao], oracle_acc=float(out["acc"][ko, ao])
        )
        ki = ai = None
        if selection is not None:
            ki, ai = self.ks.index(selection["k_star"]), self.alphas.index(selection["alpha_star"])
            acc = float(out["acc"][ki, ai])
            report.update(
                k_star=selection["k_star"],
                alpha_star=selection["alpha_star"],
                acc=acc,
                acc_stderr=binomial_stderr(acc, n),
                ppl=float(out["ppl"][ki, ai]),
            )
        result = {
            "kind": "next_token",
            "title": split.task.title,
            "report": report,
            "selection": {k: v for k, v in (selection or {}).items() if k not in ("curve", "ppl")} or None,
            "sweep": {
                "ks": self.ks,
                "alphas": self.alphas,
                "report_acc": out["acc"].tolist(),
                "report_ppl": out["ppl"].tolist(),
                "selection_acc": selection["curve"] if selection else None,
            },
        }
        rows = []
        for i, idx in enumerate(out["ids"].tolist()):
            target = int(out["target"][i])
            row = {
                "id": idx,
                "target_id": target,
                "target": self.decode([target]),
                "full_rank": int(out["full_rank"][i]),
                "full_log_prob": float(out["full_log_prob"][i]),
                "correct_base": bool(out["full_correct"][i]),
                "short_rank": out["short_rank"][i].tolist(),
                "short_log_prob": out["short_log_prob"][i].tolist(),  # log f_k(target), one per k
            }
            if "calibrate" in self.methods:
                pred = int(out["calibrated_pred"][i])
                row.update(
                    pred_calibrate=self.decode([pred]), correct_calibrate=bool(out["calibrated_correct"][i])
                )
            if ki is not None and ai is not None:
                row.update(
                    k_star=self.ks[ki],
                    short_rank_k_star=int(out["short_rank"][i, ki]),
                    short_log_prob_k_star=float(out["short_log_prob"][i, ki]),
                    boosted_rank=int(out["boosted_rank"][i, ki, ai]),
                    boosted_log_prob=float(out["boosted_log_prob"][i, ki, ai]),
                    correct_boosted=bool(out["boosted_correct"][i, ki, ai]),
                )
            rows.append(row)
        return result, rows


REPORTS: dict[str, type[SweepReport]] = {cls.kind: cls for cls in (ChoiceReport, NextTokenReport)}
