"""Next-token prediction (paper §3, Tables 1 and 5): LAMBADA's last word, LAMA's object token.

Each passage gives one full pass (``f_max``) and one ``k``-token pass per ``k`` of the grid (``f_k``); the
target's log-prob and rank under ``f_max``, each ``f_k`` and the boosted mix ``log f_max + alpha log f_k``
at every (k, alpha) go into the example's cache record, and the sweep (``NextTokenSweep``) gives the
accuracy and perplexity over the whole grid from those numbers. With ``calibrate`` (LAMA, Table 5's
"Zhao et al." row) the full distribution is also calibrated as Zhao et al.'s ``run_lama.py`` does
(``cblight.evaluate.methods.calibrated_next_token``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from cblight.adaptive import NEXT_TOKEN_UNIT, summary, token_alphas, unit_k
from cblight.boosting import boosted_log_probs, first_argmax, next_token_alpha_sweep
from cblight.cache import digest
from cblight.data.datamodule import TaskSplit
from cblight.data.examples import DataError, Example, NextTokenExample
from cblight.evaluate.methods import calibrated_next_token
from cblight.evaluate.task_scoring import Record, Rows, Sweep, TaskScoring, accuracy
from cblight.metrics.sweeps import NextTokenSweep
from cblight.scoring import Scorer

ADAPTIVE_GRID = [round(-0.01 * i, 2) + 0.0 for i in range(101)]  # a split mean's alpha, rounded to 0.01


class NextToken(TaskScoring):
    """Next-token prediction (paper §3, Tables 1 and 5): one full pass and one k-token pass per k, every
    alpha from those; accuracy and perplexity over (k, alpha), k* and alpha* chosen on the selection split.

    With ``calibrate`` (LAMA, Table 5's "Zhao et al." row) the full distribution is also calibrated as
    Zhao et al.'s ``run_lama.py`` does (``cblight.evaluate.methods.calibrated_next_token``), with one pass per
    relation template and content-free input; the record keeps the calibrated prediction.

    With ``adaptive`` (a rule of ``cblight.adaptive.NEXT_TOKEN_RULES``, docs/adaptive.md) each passage also
    gets one pass on its last sentence (``k`` from the input's structure) and the rule's alpha from ``f_max``
    and that ``f_k``: no labels. Its record holds ``adaptive_*`` numbers under ``adaptive_rule``: the
    per-passage alpha and the target's correctness, log-prob and rank under it, and the target's correctness
    and log-prob at every alpha of ``ADAPTIVE_GRID`` (0 to -1 by 0.01), from which a transductive split
    mean (``jsd_mean``, ``jsdist_mean``: one alpha for the split, rounded to that grid) is read at the end.
    A record scored under another rule (or none) is recomputed.
    """

    kind = "next_token"
    record_fields = ("id", "input", *NextTokenSweep.base_columns)

    def __init__(self, run: Any, split: TaskSplit, methods: Sequence[str], adaptive: str | None):
        super().__init__(run, split, methods, adaptive)
        self.ks = list(run.ks)
        self.alphas = list(run.next_token_alphas)
        # the tokenizer's decode, for the target tokens of the prediction rows (the tokenizer loads later)
        self.decode: Callable[[list[int]], str] = lambda ids: run.tokenizer.decode(ids)
        self._cf: dict[str, torch.Tensor] = {}
        # the per-passage rule (a split mean is read off its numbers); records are keyed by it and the unit
        self.token_rule = adaptive.removesuffix("_mean") if adaptive is not None else None
        self.adaptive_key = f"{self.token_rule}@{NEXT_TOKEN_UNIT}" if adaptive is not None else None

    def signature(self) -> dict[str, Any]:
        return {"ks": self.ks, "alphas": self.alphas}

    def _record_has_shape(self, record: Record, example: Example) -> bool:
        per_k = ("short_log_prob", "short_rank", "boosted_correct", "boosted_log_prob", "boosted_rank")
        return all(isinstance(record[f], list) and len(record[f]) == len(self.ks) for f in per_k) and all(
            isinstance(row, list) and len(row) == len(self.alphas) for f in per_k[2:] for row in record[f]
        )  # the boosted ones: one value per alpha for each k

    def new_sweep(self, split: TaskSplit) -> nn.Module:
        return NextTokenSweep(self.ks, self.alphas, methods=self.methods, adaptive=self.adaptive is not None)

    def method_digest(self, method: str, ex: Example) -> str:
        assert isinstance(ex, NextTokenExample)
        return digest(repr((ex.template, self.content_free, self.options.calibrate_top_n)))

    def missing(self, record: Record | None, ex: Example) -> list[str]:
        stale = super().missing(record, ex) or (  # a record is missing, or scored under another rule
            self.adaptive is not None and record.get("adaptive_rule") != self.adaptive_key
        )
        return ["boost", *self.methods] if stale else []  # calibration and the rule need the full pass again

    def score(
        self, scorer: Scorer, split: TaskSplit, examples: Sequence[Example], previous: dict[int, Record]
    ) -> list[Record]:
        enc = scorer.encoder
        passages = [ex for ex in examples if isinstance(ex, NextTokenExample)]
        contexts, targets = [], []
        for ex in passages:
            ids = enc.context(ex.text)
            if len(ids) - len(enc.prefix) < 2:
                raise DataError(f"{split.name}: the passage at {ex.where} has fewer than 2 tokens")
            contexts.append(ids[:-1])
            targets.append(ids[-1])
        full = scorer.next_token_log_probs(contexts)
        tgt = torch.tensor(targets, device=full.device)
        full_lp = full.gather(1, tgt[:, None]).squeeze(1)
        full_rank = (full > full_lp[:, None]).sum(-1) + 1
        full_correct = full.argmax(-1) == tgt
        per_k: dict[str, list[torch.Tensor]] = defaultdict(list)  # one column per k
        for k in self.ks:
            short = scorer.last_k_log_probs(contexts, k, full=full)
            s_lp = short.gather(1, tgt[:, None]).squeeze(1)
            per_k["short_log_prob"].append(s_lp)
            per_k["short_rank"].append((short > s_lp[:, None]).sum(-1) + 1)
            for name, column in next_token_alpha_sweep(full, short, tgt, torch.tensor(self.alphas)).items():
                per_k[f"boosted_{name}"].append(column.int() if name == "correct" else column)
        calibrated = None
        if "calibrate" in self.methods:  # one pass per relation template and content-free input, kept
            if new := sorted({ex.template for ex in passages} - set(self._cf)):
                prompts = [enc.context(t.replace("[X]", cf)) for t in new for cf in self.content_free]
                lp = scorer.next_token_log_probs(prompts).view(len(new), len(self.content_free), -1)
                self._cf.update({t: lp[i] for i, t in enumerate(new)})
            cf = torch.stack([self._cf[ex.template].to(full.device) for ex in passages])
            calibrated = calibrated_next_token(full, cf, self.options.calibrate_top_n, reduce="min").tolist()
        adaptive = self._adaptive(scorer, contexts, full, tgt) if self.adaptive is not None else None
        stack = {name: torch.stack(columns, 1).tolist() for name, columns in per_k.items()}
        records = []
        for i, ex in enumerate(passages):
            rec = {
                "id": ex.idx,
                "input": self.input_digest(ex),
                "target": targets[i],
                "full_log_prob": float(full_lp[i]),
                "full_rank": int(full_rank[i]),
                "full_correct": int(full_correct[i]),
                **{name: value[i] for name, value in stack.items()},
            }
            if calibrated is not None:
                rec.update(calibrated_pred=calibrated[i], calibrated_correct=int(calibrated[i] == targets[i]))
                rec["method_inputs"] = {"calibrate": self.method_digest("calibrate", ex)}
            if adaptive:
                rec.update(adaptive_rule=self.adaptive_key, **{k: v[i] for k, v in adaptive.items()})
            records.append(rec)
        return records

    def _adaptive(
        self, scorer: Scorer, contexts: list[list[int]], full: torch.Tensor, tgt: torch.Tensor
    ) -> dict[str, list[Any]]:
        """The rule's numbers per passage: ``k`` (the last sentence's tokens), alpha (a split mean: the
        passage's own alpha under the mean's rule, averaged at the end), the target's correctness, log-prob
        and rank under ``log f_max + alpha log f_k`` (normalised), and its correctness and log-prob on
        ``ADAPTIVE_GRID``."""
        prefix = scorer.encoder.prefix
        ks = [unit_k([self.decode([t]) for t in c[len(prefix) :]], NEXT_TOKEN_UNIT) for c in contexts]
        short = scorer.last_k_log_probs(contexts, ks, full=full)
        alpha = token_alphas(self.token_rule or "", full, short, "next_token")
        mixed = boosted_log_probs(full, short, alpha, "next_token")
        lp = mixed.gather(1, tgt[:, None])
        grid = next_token_alpha_sweep(full, short, tgt, torch.tensor(ADAPTIVE_GRID))
        return {
            "adaptive_k": ks,
            "adaptive_alpha": alpha.tolist(),
            "adaptive_correct": (mixed.argmax(-1) == tgt).int().tolist(),
            "adaptive_log_prob": lp.squeeze(1).tolist(),
            "adaptive_rank": ((mixed > lp).sum(-1) + 1).tolist(),
            "adaptive_grid_correct": grid["correct"].int().tolist(),
            "adaptive_grid_log_prob": grid["log_prob"].tolist(),
        }

    def update(self, sweep: Any, records: Sequence[Record]) -> None:
        columns = {name: torch.tensor([r[name] for r in records]) for name in sweep.columns}
        sweep.update([r["id"] for r in records], **columns)

    # -- selection and report ------------------------------------------------------------------------------
    def best(self, out: Sweep) -> dict[str, Any]:
        ki, ai = divmod(first_argmax(out["acc"]), len(self.alphas))
        return {
            "k_star": self.ks[ki],
            "alpha_star": self.alphas[ai],
            "acc": float(out["acc"][ki, ai]),
            "curve": out["acc"].tolist(),
            "ppl": out["ppl"].tolist(),
        }

    def report(
        self, split: TaskSplit, out: Sweep, selection: dict[str, Any] | None
    ) -> tuple[dict[str, Any], Rows]:
        n = int(out["ids"].numel())
        report: dict[str, Any] = {
            "split": split.description,
            "n": n,
            **accuracy(out["full_correct"], "acc_base"),
            "ppl_base": float(torch.exp(-out["full_log_prob"].double().mean())),
        }
        if "calibrate" in self.methods:  # Table 5's "Zhao et al." row
            report.update(accuracy(out["calibrated_correct"], "acc_calibrate"))
        best = self.best(out)  # the report split's own best (k, alpha): the oracle
        report.update(oracle_k=best["k_star"], oracle_alpha=best["alpha_star"], oracle_acc=best["acc"])
        if self.adaptive is not None:  # no labels: k from the input, alpha from the rule
            alpha, correct, log_prob = (out[f"adaptive_{n}"] for n in ("alpha", "correct", "log_prob"))
            rank: torch.Tensor | None = out["adaptive_rank"]
            if self.adaptive.endswith("_mean"):  # the split's one alpha, its passages' mean on ADAPTIVE_GRID
                value = round(float(alpha.double().mean()), 2)
                col = min(range(len(ADAPTIVE_GRID)), key=lambda j: abs(ADAPTIVE_GRID[j] - value))
                alpha = torch.full_like(alpha, ADAPTIVE_GRID[col])
                correct, log_prob = (out[f"adaptive_grid_{n}"][:, col] for n in ("correct", "log_prob"))
                rank = None  # the grid keeps no ranks
            report.update(accuracy(correct, "acc_adaptive"))
            report["ppl_adaptive"] = float(torch.exp(-log_prob.double().mean()))
            k = out["adaptive_k"].double()
            spread = {"k_mean": float(k.mean()), "k_sd": float(k.std(unbiased=False))}
            report["adaptive"] = {"rule": self.adaptive, "unit": NEXT_TOKEN_UNIT, **summary(alpha), **spread}
        if selection is not None:
            ki, ai = self.ks.index(selection["k_star"]), self.alphas.index(selection["alpha_star"])
            report.update(
                k_star=selection["k_star"],
                alpha_star=selection["alpha_star"],
                **accuracy(out["boosted_correct"][:, ki, ai], "acc"),
                ppl=float(out["ppl"][ki, ai]),
            )
        sweep = {"ks": self.ks, "alphas": self.alphas, "report_acc": best["curve"], "report_ppl": best["ppl"]}
        result = self._result(split, report, selection, sweep)
        # the prediction rows, column by column: tensors become Python numbers, 0/1 flags booleans
        columns: dict[str, Any] = {
            "id": out["ids"],
            "target_id": out["target"],
            "target": [self.decode([t]) for t in out["target"].tolist()],
            "full_rank": out["full_rank"],
            "full_log_prob": out["full_log_prob"],
            "correct_base": out["full_correct"].bool(),
            "short_rank": out["short_rank"],
            "short_log_prob": out["short_log_prob"],  # log f_k(target), one per k
        }
        if "calibrate" in self.methods:
            columns["pred_calibrate"] = [self.decode([p]) for p in out["calibrated_pred"].tolist()]
            columns["correct_calibrate"] = out["calibrated_correct"].bool()
        if self.adaptive is not None:
            columns.update(k_adaptive=out["adaptive_k"], alpha_adaptive=alpha, adaptive_log_prob=log_prob)
            columns["correct_adaptive"] = correct.bool()
            if rank is not None:
                columns["adaptive_rank"] = rank
        if selection is not None:
            columns.update(
                k_star=[self.ks[ki]] * n,
                short_rank_k_star=out["short_rank"][:, ki],
                short_log_prob_k_star=out["short_log_prob"][:, ki],
                boosted_rank=out["boosted_rank"][:, ki, ai],
                boosted_log_prob=out["boosted_log_prob"][:, ki, ai],
                correct_boosted=out["boosted_correct"][:, ki, ai].bool(),
            )
        values = [c.tolist() if isinstance(c, torch.Tensor) else c for c in columns.values()]
        return result, [dict(zip(columns, row)) for row in zip(*values)]
