"""Boosted evaluation as a LightningModule: next-token (LAMBADA, LAMA) and multiple choice (Table 4).

Lightning's validation loop runs each task's *selection* split and chooses alpha* (and k*) there; its test
loop runs the *report* split and applies them (DESIGN.md §2). One forward pass per context form feeds the
whole grid: multiple choice scores every choice after the full and the premise-free context once (paper
eq. 2), next-token prediction runs one full pass plus one k-token pass per k (paper §3), and the sweeps are
computed from those cached numbers (``cblight.boosting``).

Per-example numbers go to an append-only cache under ``output_dir/cache`` as they are computed, so an
interrupted run resumes and a rerun with a new alpha grid (multiple choice) never loads the model. At the end
of the test loop rank 0 writes ``results.json``, per-example predictions and one alpha-curve plot per task,
and prints a summary table.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from cblight import __version__
from cblight.boosting import (
    AlphaGrid,
    binomial_stderr,
    choice_predictions,
    first_argmax,
    next_token_alpha_sweep,
)
from cblight.data.datamodule import TaskSplit
from cblight.data.examples import ChoiceExample, DataError, NextTokenExample
from cblight.errors import ConfigError
from cblight.metrics.sweeps import ChoiceSweep, NextTokenSweep
from cblight.models import DTypeName, load_tokenizer, model_label
from cblight.modules.base import LanguageModelModule
from cblight.results import (
    RecordCache,
    atomic_write_json,
    atomic_write_jsonl,
    digest,
    format_table,
    save_alpha_plot,
)
from cblight.scoring import BatchSize, Scorer

Role = Literal["report", "selection"]
_STAGE_ROLE: dict[str, Role] = {"validate": "selection", "test": "report", "predict": "report"}
_PREFIX = {"selection": "val", "report": "test"}
DEFAULT_KS = tuple(range(1, 21))  # LAMBADA's grid (Table 1); LAMA's is 1..5 (Table 5)


def _grid(value: AlphaGrid | Sequence[float] | None, default: AlphaGrid, option: str) -> list[float]:
    if value is None:
        value = default
    try:
        values = value.values() if isinstance(value, AlphaGrid) else [float(v) for v in value]
    except ValueError as err:
        raise ConfigError(f"{option}: {err}") from None
    if not values:
        raise ConfigError(f"{option}: the alpha grid is empty")
    if len(set(values)) != len(values):
        raise ConfigError(f"{option}: the alpha grid repeats a value")
    return values


class BoostedEvaluator(LanguageModelModule):
    """Coherence-boosted evaluation of any Hugging Face causal LM.

    Args:
        model: Hub id or local directory of a causal LM (``AutoModelForCausalLM``).
        tokenizer: tokenizer id or directory; defaults to ``model``.
        revision: model revision on the Hub.
        dtype: weights dtype (``auto`` keeps the checkpoint's); log-softmax and mixing always run in float32.
        device_map: accelerate device map (e.g. ``auto``) to shard a large model; placement is then left to it.
        trust_remote_code: allow custom model code from the Hub (off unless asked).
        batch_size: sequences per forward pass, or ``auto`` (halves on CUDA out-of-memory; 16 on CPU).
        max_length: override the model window; longer contexts are cut from the left.
        share_context: encode the context of a question once and share its KV cache across the choices.
        choice_alphas: multiple-choice grid (paper eq. 2), default 2 down to -5 by 0.01.
        next_token_alphas: next-token grid (``log f_max + alpha log f_k``), default 0 down to -1 by 0.1.
        ks: short-context lengths for next-token tasks (default 1..20, LAMBADA's grid; LAMA uses 1..5).
        length_normalize: divide each answer's score by its length in characters, as the reference can.
        output_dir: where results, predictions, plots, the per-example cache and logs go; ``{model}`` is
            replaced by the model's name (its last path component), so one config serves many models.
        run_label: names this run in logged metrics (``test/<task>/<run_label>/acc``), for comparisons
            of several checkpoints in one logger.
        overwrite: discard an existing per-example cache in ``output_dir`` instead of resuming from it.
        plots: write one accuracy-vs-alpha PNG per task.
    """

    def __init__(
        self,
        model: str = "gpt2",
        tokenizer: str | None = None,
        revision: str | None = None,
        dtype: DTypeName = "float32",
        device_map: str | None = None,
        trust_remote_code: bool = False,
        batch_size: BatchSize = "auto",
        max_length: int | None = None,
        share_context: bool = True,
        choice_alphas: AlphaGrid | list[float] | None = None,
        next_token_alphas: AlphaGrid | list[float] | None = None,
        ks: list[int] | None = None,
        length_normalize: bool = False,
        output_dir: str = "outputs/eval/{model}",
        overwrite: bool = False,
        plots: bool = True,
        run_label: str | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.model_name = model
        self.tokenizer_name = tokenizer or model
        self.choice_alphas = _grid(choice_alphas, AlphaGrid(2.0, -5.0, 0.01), "choice_alphas")
        self.next_token_alphas = _grid(next_token_alphas, AlphaGrid(0.0, -1.0, 0.1), "next_token_alphas")
        self.ks = list(ks) if ks is not None else list(DEFAULT_KS)
        if not self.ks:
            raise ConfigError("ks: the grid of short-context lengths is empty")
        if any(int(k) != k or k < 1 for k in self.ks):
            raise ConfigError(f"ks: every short-context length must be an integer >= 1, got {self.ks}")
        if len(set(self.ks)) != len(self.ks):
            raise ConfigError(f"ks repeats a value: {self.ks}")
        if batch_size != "auto" and (not isinstance(batch_size, int) or batch_size < 1):
            raise ConfigError(f"batch_size must be a positive integer or 'auto', got {batch_size!r}")
        self.output_dir = resolve_output_dir(output_dir, model)
        self.length_normalize = length_normalize
        self.lm: nn.Module | None = None
        self._sharded_lm: Any = None  # a device_map model lives outside Lightning's device management
        self.tok: Any = None
        self._scorer: Scorer | None = None
        self.sweeps = nn.ModuleDict()
        self._splits: dict[Role, list[TaskSplit]] = {}
        self._caches: dict[tuple[Role, str], RecordCache] = {}
        self._cached: dict[tuple[Role, str], dict[int, dict[str, Any]]] = {}
        self.selected: dict[str, dict[str, Any]] = {}
        self.results: dict[str, Any] = {}
        self.summary = ""
        self._cleared = False
        self._started = time.time()

    # -- setup ---------------------------------------------------------------------------------------------
    def _signature(self, split: TaskSplit) -> dict[str, Any]:
        sig = {
            "model": self.model_name,
            "tokenizer": self.tokenizer_name,
            "revision": self.hparams.revision,
            "dtype": self.hparams.dtype,
            "max_length": self.hparams.max_length,
            "task": split.name,
            "split": split.split,
        }
        if split.task.kind == "next_token":
            sig.update(ks=self.ks, alphas=self.next_token_alphas)
        return sig

    def _cache_dir(self, split: TaskSplit) -> Path:
        label = f"{split.split}-sample" if split.sampled_indices is not None else split.split
        return self.output_dir / "cache" / split.name / label

    def setup(self, stage: str) -> None:
        if stage not in _STAGE_ROLE:
            raise ValueError(f"BoostedEvaluator evaluates; it cannot run stage {stage!r} (use evaluate.py)")
        role = _STAGE_ROLE[stage]
        dm = getattr(self.trainer, "datamodule", None)
        if dm is None or not hasattr(dm, "loader_splits"):
            raise DataError("BoostedEvaluator needs an EvalDataModule (trainer.*(model, datamodule=...))")
        if self.hparams.overwrite and not self._cleared:
            if self.trainer.is_global_zero:
                shutil.rmtree(self.output_dir / "cache", ignore_errors=True)
            self.trainer.strategy.barrier()
            self._cleared = True
        splits = dm.loader_splits(role)
        self._splits[role] = splits
        pending = False
        for split in splits:
            key = f"{_PREFIX[role]}_{split.name}"
            if key not in self.sweeps:
                self.sweeps[key] = self._new_sweep(split)
            cache = RecordCache(self._cache_dir(split), self._signature(split), rank=self.global_rank)
            cached = cache.load()
            self._caches[(role, split.name)] = cache
            self._cached[(role, split.name)] = cached
            pending = pending or any(
                cached.get(ex.idx, {}).get("input") != digest(ex.input_key()) for ex in split.examples
            )
        if self.tok is None:
            self.tok = load_tokenizer(
                self.tokenizer_name,
                revision=self.hparams.revision,
                trust_remote_code=self.hparams.trust_remote_code,
            )
            self._check_lengths(dm.loader_splits("selection") + dm.loader_splits("report"))
        if pending and self.language_model is None:
            self._load_model()

    def _new_sweep(self, split: TaskSplit) -> nn.Module:
        if split.task.kind == "multiple_choice":
            return ChoiceSweep(self.choice_alphas, split.max_choices, self.length_normalize)
        if split.task.kind == "next_token":
            return NextTokenSweep(self.ks, self.next_token_alphas)
        raise DataError(
            f"{split.name}: tasks of kind {split.task.kind!r} are not evaluated by BoostedEvaluator"
        )

    def _check_lengths(self, splits: list[TaskSplit]) -> None:
        """Refuse, before any model work, an answer that alone exceeds the model window."""
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(self.model_name, revision=self.hparams.revision)
        except (OSError, ValueError):
            return  # the model load will report the path problem
        window = self.hparams.max_length or next(
            (
                getattr(config, a)
                for a in ("n_positions", "max_position_embeddings", "n_ctx")
                if isinstance(getattr(config, a, None), int)
            ),
            None,
        )
        if window is None:
            return
        lengths: dict[str, int] = {}  # answer sets repeat across examples: tokenise each string once
        for split in splits:
            for ex in split.examples:
                if not isinstance(ex, ChoiceExample):
                    continue
                for choice in ex.choices:
                    if choice not in lengths:
                        lengths[choice] = len(self.tok(choice, add_special_tokens=False)["input_ids"])
                    n = lengths[choice]
                    if n > window:
                        raise DataError(
                            f"{split.name}: an answer at {ex.where} has {n} tokens, more than the model "
                            f"window of {window} (answers are never cut; contexts are cut from the left)"
                        )

    @property
    def scorer(self) -> Scorer:
        if self._scorer is None:
            if self.language_model is None:
                self._load_model()
            self._scorer = Scorer(
                self.language_model,
                self.tok,
                batch_size=self.hparams.batch_size,
                max_length=self.hparams.max_length,
                share_context=self.hparams.share_context,
            )
        return self._scorer

    # -- scoring ---------------------------------------------------------------------------------------------
    def _score_choices(self, split: TaskSplit, examples: list[ChoiceExample]) -> list[dict[str, Any]]:
        groups = [(ex.context, ex.choices) for ex in examples] + [
            (ex.premise_free, ex.choices) for ex in examples
        ]
        names = [f"{split.name} {ex.where} (full context)" for ex in examples]
        names += [f"{split.name} {ex.where} (premise-free context)" for ex in examples]
        scores = self.scorer.score_text(groups, names)
        full, short = scores[: len(examples)], scores[len(examples) :]
        return [
            {
                "id": ex.idx,
                "input": digest(ex.input_key()),
                "label": ex.label,
                "ll_full": [s.log_prob for s in f],
                "ll_short": [s.log_prob for s in s_],
                "n_tokens": [s.num_tokens for s in f],
                "greedy_full": [s.is_greedy for s in f],
                "char_lengths": [len(c) for c in ex.choices],
            }
            for ex, f, s_ in zip(examples, full, short)
        ]

    def _score_next_token(self, split: TaskSplit, examples: list[NextTokenExample]) -> list[dict[str, Any]]:
        scorer = self.scorer
        enc = scorer.encoder
        contexts, targets = [], []
        for ex in examples:
            ids = enc.context(ex.text)
            if len(ids) - len(enc.prefix) < 2:
                raise DataError(f"{split.name}: the passage at {ex.where} has fewer than 2 tokens")
            contexts.append(ids[:-1])
            targets.append(ids[-1])
        full = scorer.next_token_log_probs(contexts)
        tgt = torch.tensor(targets, device=full.device)
        alphas = torch.tensor(self.next_token_alphas)
        full_lp = full.gather(1, tgt[:, None]).squeeze(1)
        full_rank = (full > full_lp[:, None]).sum(-1) + 1
        full_correct = full.argmax(-1) == tgt
        short_lp, short_rank, correct, log_prob, rank = [], [], [], [], []
        for k in self.ks:
            short = scorer.last_k_log_probs(contexts, k, full=full)
            s_lp = short.gather(1, tgt[:, None]).squeeze(1)
            short_lp.append(s_lp)
            short_rank.append((short > s_lp[:, None]).sum(-1) + 1)
            sweep = next_token_alpha_sweep(full, short, tgt, alphas, "next_token")
            correct.append(sweep["correct"])
            log_prob.append(sweep["log_prob"])
            rank.append(sweep["rank"])
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
                "input": digest(ex.input_key()),
                "target": targets[i],
                "full_log_prob": float(full_lp[i]),
                "full_rank": int(full_rank[i]),
                "full_correct": int(full_correct[i]),
                **{name: value[i] for name, value in stack.items()},
            }
            for i, ex in enumerate(examples)
        ]

    def _records(self, role: Role, split: TaskSplit, batch: list[Any]) -> list[dict[str, Any]]:
        cached = self._cached[(role, split.name)]
        records: dict[int, dict[str, Any]] = {}
        todo = []
        for ex in batch:
            rec = cached.get(ex.idx)
            if rec is not None and rec.get("input") == digest(ex.input_key()):
                records[ex.idx] = rec
            else:
                todo.append(ex)
        if todo:
            fresh = (
                self._score_choices(split, todo)
                if split.task.kind == "multiple_choice"
                else self._score_next_token(split, todo)
            )
            self._caches[(role, split.name)].append(fresh)
            for rec in fresh:
                cached[rec["id"]] = rec
                records[rec["id"]] = rec
        return [records[ex.idx] for ex in batch]

    def _update(self, role: Role, split: TaskSplit, records: list[dict[str, Any]]) -> None:
        sweep = self.sweeps[f"{_PREFIX[role]}_{split.name}"]
        ids = [r["id"] for r in records]
        if isinstance(sweep, ChoiceSweep):
            sweep.update(
                ids,
                [r["label"] for r in records],
                [r["ll_full"] for r in records],
                [r["ll_short"] for r in records],
                [r["char_lengths"] for r in records],
            )
        else:
            sweep.update(ids, **{name: torch.tensor([r[name] for r in records]) for name in sweep.columns})

    def _step(self, batch: list[Any], dataloader_idx: int, role: Role) -> None:
        split = self._splits[role][dataloader_idx]
        self._update(role, split, self._records(role, split, batch))

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch  # rendered text examples: tokenisation happens on the model's device inside the step

    def validation_step(self, batch: list[Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._step(batch, dataloader_idx, "selection")

    def test_step(self, batch: list[Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._step(batch, dataloader_idx, "report")

    def predict_step(self, batch: list[Any], batch_idx: int, dataloader_idx: int = 0) -> list[dict[str, Any]]:
        return self._records("report", self._splits["report"][dataloader_idx], batch)

    # -- selection (validation loop) -------------------------------------------------------------------------
    def on_validation_epoch_end(self) -> None:
        for split in self._splits.get("selection", []):
            sweep = self.sweeps[f"val_{split.name}"]
            out = sweep.compute()
            n = int(out["ids"].numel())
            info: dict[str, Any] = {"split": split.description, "n": n}
            if split.sampled_indices is not None:
                info["indices"] = split.sampled_indices
            if isinstance(sweep, ChoiceSweep):
                best = first_argmax(out["acc"])
                info.update(
                    alpha_star=self.choice_alphas[best],
                    acc=float(out["acc"][best]),
                    curve=out["acc"].tolist(),
                )
            else:
                best = first_argmax(out["acc"])
                ki, ai = divmod(best, len(self.next_token_alphas))
                info.update(
                    k_star=self.ks[ki],
                    alpha_star=self.next_token_alphas[ai],
                    acc=float(out["acc"][ki, ai]),
                    curve=out["acc"].tolist(),
                    ppl=out["ppl"].tolist(),
                )
            self.selected[split.name] = info
            logged = {
                f"val/{self._key(split.name)}/acc": info["acc"],
                f"val/{self._key(split.name)}/alpha_star": info["alpha_star"],
            }
            if "k_star" in info:
                logged[f"val/{self._key(split.name)}/k_star"] = float(info["k_star"])
            self.log_dict(logged, sync_dist=True)  # identical on every rank: the sweeps are synced
            sweep.reset()

    # -- report (test loop) -----------------------------------------------------------------------------------
    def on_test_epoch_end(self) -> None:
        summary_rows = []
        self.results = {}
        for split in self._splits.get("report", []):
            sweep = self.sweeps[f"test_{split.name}"]
            out = sweep.compute()
            if isinstance(sweep, ChoiceSweep):
                result, rows = self._report_choices(split, sweep, out)
            else:
                result, rows = self._report_next_token(split, out)
            self.results[split.name] = result
            logged = {
                f"test/{self._key(split.name)}/{k}": float(v)
                for k, v in result["report"].items()
                if _is_number(v)
            }
            self.log_dict(logged, sync_dist=True)  # identical on every rank: the sweeps are synced
            summary_rows.append(_summary_row(split.name, result))
            if self.trainer.is_global_zero:
                self._write_task_files(split, result, rows)
            sweep.reset()
        if self.trainer.is_global_zero and self.results:
            self._write_results(summary_rows)

    def _report_choices(
        self, split: TaskSplit, sweep: ChoiceSweep, out: dict[str, torch.Tensor]
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
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
        curve = out["acc"]
        oracle = first_argmax(curve)
        report["oracle_alpha"] = self.choice_alphas[oracle]
        report["oracle_acc"] = float(curve[oracle])
        selection = self.selected.get(split.name)
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
                "alphas": self.choice_alphas,
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
            }
            for name, pred in preds.items():
                row[f"pred_{name}"] = int(pred[i])
                row[f"correct_{name}"] = bool(pred[i] == labels[i])
            rows.append(row)
        return result, rows

    def _report_next_token(
        self, split: TaskSplit, out: dict[str, torch.Tensor]
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        n = int(out["ids"].numel())
        acc_base = float(out["full_correct"].double().mean())
        report: dict[str, Any] = {
            "split": split.description,
            "n": n,
            "acc_base": acc_base,
            "acc_base_stderr": binomial_stderr(acc_base, n),
            "ppl_base": float(torch.exp(-out["full_log_prob"].double().mean())),
        }
        best = first_argmax(out["acc"])
        ko, ao = divmod(best, len(self.next_token_alphas))
        report.update(
            oracle_k=self.ks[ko],
            oracle_alpha=self.next_token_alphas[ao],
            oracle_acc=float(out["acc"][ko, ao]),
        )
        selection = self.selected.get(split.name)
        ki = ai = None
        if selection is not None:
            ki, ai = self.ks.index(selection["k_star"]), self.next_token_alphas.index(selection["alpha_star"])
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
                "alphas": self.next_token_alphas,
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
                "target": self.tok.decode([target]),
                "full_rank": int(out["full_rank"][i]),
                "full_log_prob": float(out["full_log_prob"][i]),
                "correct_base": bool(out["full_correct"][i]),
                "short_rank": out["short_rank"][i].tolist(),
            }
            if ki is not None and ai is not None:
                row.update(
                    k_star=self.ks[ki],
                    short_rank_k_star=int(out["short_rank"][i, ki]),
                    boosted_rank=int(out["boosted_rank"][i, ki, ai]),
                    boosted_log_prob=float(out["boosted_log_prob"][i, ki, ai]),
                    correct_boosted=bool(out["boosted_correct"][i, ki, ai]),
                )
            rows.append(row)
        return result, rows

    # -- files ------------------------------------------------------------------------------------------------
    def _write_task_files(self, split: TaskSplit, result: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        files = {}
        pred_path = self.output_dir / "predictions" / f"{split.name}.{split.split}.jsonl"
        atomic_write_jsonl(pred_path, rows)
        files["predictions"] = str(pred_path.relative_to(self.output_dir))
        if self.hparams.plots:
            plot_path = self.output_dir / "plots" / f"{split.name}.png"
            sweep = result["sweep"]
            report = result["report"]
            if result["kind"] == "multiple_choice":
                curves = {f"{split.split} (reported)": sweep["report_acc"]}
                if sweep["selection_acc"] is not None:
                    curves[f"{result['selection']['split']} (alpha selection)"] = sweep["selection_acc"]
                save_alpha_plot(
                    plot_path,
                    f"{split.task.title}: accuracy vs alpha ({self.model_name})",
                    sweep["alphas"],
                    curves,
                    highlight=f"{split.split} (reported)",
                    chosen_alpha=report.get("alpha_star"),
                )
            else:
                k_star = report.get("k_star", report["oracle_k"])
                curves = {f"k = {k}": row for k, row in zip(sweep["ks"], sweep["report_acc"])}
                save_alpha_plot(
                    plot_path,
                    f"{split.task.title}: accuracy vs alpha per k ({self.model_name})",
                    sweep["alphas"],
                    curves,
                    highlight=f"k = {k_star}",
                    chosen_alpha=report.get("alpha_star"),
                )
            files["plot"] = str(plot_path.relative_to(self.output_dir))
            self._log_plot(split.name, plot_path)
        result["files"] = files

    def _log_plot(self, task: str, path: Path) -> None:
        for logger in self.loggers:
            if hasattr(logger, "log_image"):  # WandbLogger
                logger.log_image(key=f"test/{self._key(task)}/alpha_curve", images=[str(path)])

    def _write_results(self, summary_rows: list[list[Any]]) -> None:
        table = format_table(
            ["task", "split", "n", "acc@0", "acc@-1", "acc@alpha*", "alpha*", "k*", "alpha* chosen on"],
            summary_rows,
        )
        payload = {
            "cblight_version": __version__,
            "model": self.model_name,
            "tokenizer": self.tokenizer_name,
            "dtype": self.hparams.dtype,
            "revision": self.hparams.revision,
            "length_normalize": self.length_normalize,
            "seconds": round(time.time() - self._started, 1),
            "summary": table,
            "tasks": self.results,
        }
        path = atomic_write_json(self.output_dir / "results.json", payload)
        self.summary = f"Coherence boosting, {self.model_name} (accuracy in %)\n{table}\n\nresults: {path}"


def resolve_output_dir(template: str, model: str) -> Path:
    """``template`` with ``{model}`` replaced by the model's last path component (``gpt2``, ``Llama-2-7b-hf``)."""
    return Path(template.replace("{model}", model_label(model)))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _pct(value: Any) -> float | None:
    return None if value is None else 100.0 * float(value)


def _summary_row(task: str, result: dict[str, Any]) -> list[Any]:
    report = result["report"]
    selection = result.get("selection") or {}
    return [
        task,
        report["split"],
        report["n"],
        _pct(report.get("acc_base")),
        _pct(report.get("acc_pmi")),
        _pct(report.get("acc")),
        report.get("alpha_star"),
        report.get("k_star"),
        selection.get("split"),
    ]
