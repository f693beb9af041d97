"""Boosted evaluation as a LightningModule: next-token (LAMBADA, LAMA) and multiple choice (Table 4).

Lightning's validation loop runs each task's *selection* split and chooses alpha* (and k*) there; its test
loop runs the *report* split and applies them (docs/design.md, "Selection protocol"). One forward pass per context form feeds the
whole grid: multiple choice scores every choice after the full and the premise-free context once (paper
eq. 2), next-token prediction runs one full pass plus one k-token pass per k (paper §3), and the sweeps are
computed from those cached numbers (``cblight.boosting``).

Per-example numbers go to an append-only cache under ``output_dir/cache`` as they are computed, so an
interrupted run resumes and a rerun with a new alpha grid (multiple choice) never loads the model. At the end
of the test loop rank 0 writes ``results.json``, per-example predictions and one alpha-curve plot per task,
and prints a summary table.

Scores come from the model in this process (``LocalBackend``) or from an OpenAI-compatible completions
server (``ServedBackend``, multiple choice only: docs/served.md); how a kind of task is scored, selected on and
reported is its ``TaskScoring``, picked by the task spec's ``kind``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from cblight.adaptive import RULES, rule_for
from cblight.boosting import AlphaGrid
from cblight.data.datamodule import Role, TaskSplit
from cblight.data.examples import ChoiceExample, DataError
from cblight.errors import ConfigError
from cblight.evaluate.methods import MethodName, MethodOptions, check_methods, not_applicable
from cblight.evaluate.multiple_choice import MultipleChoice
from cblight.evaluate.next_token import NextToken
from cblight.evaluate.predictions import (
    compare_accuracy_table,
    comparison_payload,
    summary_text,
    write_task_files,
)
from cblight.evaluate.task_scoring import TaskScoring
from cblight.evaluator import Evaluator
from cblight.models import DTypeName, check_checkpoint_max_length, check_max_length, checkpoint_window
from cblight.runs import check_interrupt
from cblight.scoring import BatchSize, Scorer, TextScorer
from cblight.served import ServedScorer, ServerOptions, check_served_splits, resumed_line

__all__ = ["DEFAULT_KS", "BoostedEvaluator"]

KINDS: dict[str, type[TaskScoring]] = {kind.kind: kind for kind in (MultipleChoice, NextToken)}
_STAGE_ROLE: dict[str, Role] = {"validate": "selection", "test": "report"}
_PREFIX = {"selection": "val", "report": "test"}
DEFAULT_KS = tuple(range(1, 21))  #: the default ``ks``, LAMBADA's grid (Table 1); LAMA's is 1..5 (Table 5)


def _grid(value: AlphaGrid | Sequence[float] | None, default: AlphaGrid, option: str) -> list[float]:
    """The alpha values of a grid option: a list, or the range form ``{start, stop, step}`` (as an
    ``AlphaGrid``, or the mapping a hyperparameter round trip hands back, e.g. under ``--compare``)."""
    if value is None:
        value = default
    if hasattr(value, "as_dict"):  # a jsonargparse Namespace
        value = value.as_dict()
    try:
        if isinstance(value, Mapping):
            unknown = set(value) - {"start", "stop", "step"}
            if unknown:
                raise ConfigError(
                    f"{option}: unknown key {sorted(unknown)[0]!r} (the range form is start, stop, step)"
                )
            value = AlphaGrid(**{k: float(v) for k, v in value.items()})
        values = value.values() if isinstance(value, AlphaGrid) else [float(v) for v in value]
    except (TypeError, ValueError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"{option}: {err}") from None
    if not values:
        raise ConfigError(f"{option}: the alpha grid is empty")
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise ConfigError(f"{option}: every alpha must be a finite number, got {bad[0]} in {values[:10]}")
    if len(set(values)) != len(values):
        raise ConfigError(f"{option}: the alpha grid repeats a value")
    return values


class BoostedEvaluator(Evaluator):
    """Coherence-boosted evaluation of any Hugging Face causal LM.

    Args:
        model: Hub id or local directory of a causal LM (``AutoModelForCausalLM``); with
            ``backend: openai``, the model's name on the server.
        tokenizer: tokenizer id or directory; defaults to ``model``. With ``backend: openai`` the server
            tokenises; a local tokenizer (optional) only spells special tokens in prompts (SST-5's EOS).
        revision: model revision on the Hub.
        dtype: weights dtype (``auto`` keeps the checkpoint's); log-softmax and mixing always run in float32.
        device_map: accelerate device map (e.g. ``auto``) to shard a large model; placement is then left to it.
        trust_remote_code: allow custom model code from the Hub (off unless asked).
        batch_size: sequences per forward pass, or ``auto`` (halves on CUDA out-of-memory; 16 on CPU).
        max_length: override the model window; longer contexts are cut from the left. Past the window of
            learned absolute positions (GPT-2) it is refused; past a rotary one (Llama, Gemma) a warning says
            the model extrapolates.
        share_context: encode the context of a question once and share its KV cache across the choices.
        choice_alphas: multiple-choice grid (paper eq. 2), default 2 down to -5 by 0.01.
        next_token_alphas: next-token grid (``log f_max + alpha log f_k``), default 0 down to -1 by 0.1.
        ks: short-context lengths for next-token tasks (default 1..20, LAMBADA's grid; LAMA uses 1..5).
        length_normalize: divide each answer's score by its length in characters, as the reference can.
        adaptive: a label-free rule reported beside base, PMI and alpha* as the row ``adaptive``
            (``docs/adaptive.md``): ``auto`` (each kind's recommended rule), ``jsd`` (AdaCAD's weight, per
            question or per passage), ``residual`` (next-token), ``decorrelate`` or ``balance`` (multiple
            choice, one alpha from the unlabelled reported inputs); next-token rules take ``k`` from the
            passage's last sentence. Its alphas go to the predictions, their mean and spread to
            ``results.json``.
        methods: scoring methods reported side by side (``docs/methods.md``): ``boost`` (always computed),
            ``pmi_dc`` (Holtzman et al.'s domain-conditional PMI), ``pmi_empty`` (PMI after BOS/EOS alone,
            lm-eval's ``acc_mutual_info``), ``calibrate`` (Zhao et al.'s contextual calibration), ``channel``
            (Min et al.'s noisy channel); the comparison methods of paper Tables 5, 11 and 12.
        method_options: options of those methods (domain premises, content-free inputs, ...).
        backend: ``local`` (the model runs here) or ``openai``: an OpenAI-compatible completions server
            (vLLM, llama-cpp-python) scores multiple-choice tasks from prompt log-probs (``docs/served.md``).
        server: where that server is and how to talk to it (``base_url``, API key variable, retries, ...).
        output_dir: where results, predictions, plots, the per-example cache and logs go; ``{model}`` is
            replaced by the model's name (its last path component), so one config serves many models.
        run_label: names this run in logged metrics (``test/<task>/<run_label>/acc``), for comparisons
            of several checkpoints in one logger.
        overwrite: discard an existing per-example cache in ``output_dir`` instead of resuming from it.
        plots: write one accuracy-vs-alpha PNG per task.
    """

    selects = True  # alpha* (and k*) are chosen on Lightning's validation loop, then applied on its test loop

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
        adaptive: str | None = None,
        methods: list[MethodName] | None = None,
        method_options: MethodOptions | None = None,
        backend: Literal["local", "openai"] = "local",
        server: ServerOptions | None = None,
        output_dir: str = "outputs/eval/{model}",
        overwrite: bool = False,
        plots: bool = True,
        run_label: str | None = None,
    ):
        super().__init__(model, tokenizer, output_dir, overwrite, run_label)
        self.save_hyperparameters()
        self.backend: LocalBackend | ServedBackend
        if backend == "openai":
            self.backend = ServedBackend(server or ServerOptions())
            self.tokenizer_name = (
                tokenizer  # the server tokenises; a local tokenizer only spells special tokens
            )
        elif server is not None:
            raise ConfigError("server options are for backend: openai (this run's backend is local)")
        else:
            self.backend = LocalBackend()
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
            raise ConfigError(
                f"model.batch_size must be a positive integer or 'auto', got {batch_size!r} (sequences per "
                "forward pass; data.batch_size is the examples per step)"
            )
        if max_length is not None and backend == "local":  # past learned positions a run fails mid-way
            check_checkpoint_max_length(model, max_length, "model.max_length", revision, trust_remote_code)
        self.length_normalize = length_normalize
        if adaptive is not None and adaptive not in RULES:
            raise ConfigError(
                f"--model.adaptive must be one of {', '.join(RULES)} (docs/adaptive.md) or null, got {adaptive!r}"
            )
        self.adaptive = adaptive
        self.methods = check_methods(methods) if methods else ["boost"]
        self.method_options = method_options
        if method_options is not None:
            method_options.check()
        self._scorer: TextScorer | None = None
        self._kinds: dict[tuple[Role, str], TaskScoring] = {}
        self.sweeps = nn.ModuleDict()
        self._splits: dict[Role, list[TaskSplit]] = {}
        self.selected: dict[str, dict[str, Any]] = {}
        self._resumed = 0  # examples an earlier run left in the per-example cache

    # -- setup ---------------------------------------------------------------------------------------------
    def _signature(self, split: TaskSplit, role: Role) -> dict[str, Any]:
        sig = self.cache_signature(split.name, split.split)
        sig["max_length"] = self.hparams.max_length
        sig.update(self.backend.signature)
        sig.update(self._kind(split, role).signature())
        return sig

    def _cache_dir(self, split: TaskSplit) -> Path:
        label = f"{split.split}-sample" if split.sampled_indices is not None else split.split
        return self.output_dir / "cache" / split.name / label

    def setup(self, stage: str) -> None:
        if stage not in _STAGE_ROLE:
            raise ValueError(f"BoostedEvaluator evaluates; it cannot run stage {stage!r} (use evaluate.py)")
        role = _STAGE_ROLE[stage]
        dm = self._datamodule()
        self._check_adaptive(dm.specs)
        self._clear_cache_once()
        splits = dm.loader_splits(role)
        self._splits[role] = splits
        pending = False
        for split in splits:
            key = f"{_PREFIX[role]}_{split.name}"
            if key not in self.sweeps:
                self.sweeps[key] = self._kind(split, role).new_sweep(split)
            kind = self._kind(split, role)
            cached = self._open_cache(
                (role, split.name),
                self._cache_dir(split),
                self._signature(split, role),
                kind.record_fields,
            )
            pending = pending or any(kind.missing(cached.get(ex.idx), ex) for ex in split.examples)
        self.backend.prepare(self, dm, splits, pending)

    def _methods(self, split: TaskSplit, role: Role) -> list[str]:
        """The comparison methods scored on ``split``: those that apply, on the reported split only (they
        choose nothing on the selection split)."""
        if role != "report":
            return []
        return [m for m in self.methods[1:] if not_applicable(m, split) is None]

    def _kind(self, split: TaskSplit, role: Role) -> TaskScoring:
        """How examples of this split are scored, selected on and reported."""
        key = (role, split.name)
        if key not in self._kinds:
            if split.task.kind not in KINDS:
                raise DataError(
                    f"{split.name}: tasks of kind {split.task.kind!r} are not evaluated by BoostedEvaluator"
                )
            scoring = KINDS[split.task.kind]
            methods, adaptive = self._methods(split, role), self._adaptive_rule(split, role)
            self._kinds[key] = scoring.for_run(self, split, methods, adaptive)
        return self._kinds[key]

    def check_tasks(self, datamodule: Any) -> None:
        """Refuse, before any data or model is loaded (``runs.run_evaluation``), a label-free rule that does
        not apply to a task of the run."""
        self._check_adaptive(getattr(datamodule, "specs", []))

    def _check_adaptive(self, specs: Sequence[Any]) -> None:
        for spec in specs if self.adaptive is not None else ():
            if spec.kind in KINDS:
                try:
                    rule_for(self.adaptive, spec.kind)
                except ValueError as err:
                    raise ConfigError(f"--model.adaptive: task {spec.name}: {err}") from None

    def _adaptive_rule(self, split: TaskSplit, role: Role) -> str | None:
        """The label-free rule of this split's kind (reported splits only: it chooses nothing)."""
        if self.adaptive is None or role != "report" or split.task.kind not in KINDS:
            return None
        return rule_for(self.adaptive, split.task.kind)  # checked in setup

    def decode_tokens(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def _check_lengths(self, splits: list[TaskSplit]) -> None:
        """Refuse, before any model work, an answer that alone exceeds the model window."""
        window = self.hparams.max_length or checkpoint_window(self.model_name, self.hparams.revision)
        if window is None:
            return
        lengths: dict[str, int] = {}  # answer sets repeat across examples: tokenise each string once
        for split in splits:
            for ex in split.examples:
                if not isinstance(ex, ChoiceExample):
                    continue
                for choice in ex.choices:
                    if choice not in lengths:
                        lengths[choice] = len(self.tokenizer(choice, add_special_tokens=False)["input_ids"])
                    n = lengths[choice]
                    if n > window:
                        raise DataError(
                            f"{split.name}: an answer at {ex.where} has {n} tokens, more than the model "
                            f"window of {window} (answers are never cut; contexts are cut from the left)"
                        )

    def check_checkpoint(self, path: str) -> Any:
        return self.backend.check_checkpoint(self, path)

    @property
    def scorer(self) -> TextScorer:
        if self._scorer is None:
            self._scorer = self.backend.connect(self)
        return self._scorer

    def _records(self, role: Role, split: TaskSplit, batch: list[Any]) -> list[dict[str, Any]]:
        cached = self._cached[(role, split.name)]
        records: dict[int, dict[str, Any]] = {}
        todo = []
        kind = self._kind(split, role)
        for ex in batch:
            rec = cached.get(ex.idx)
            if kind.missing(rec, ex):
                todo.append(ex)
            else:
                records[ex.idx] = rec
        self._resumed += len(batch) - len(todo)
        if todo:
            fresh = kind.score(self.scorer, split, todo, cached)
            self._store((role, split.name), fresh)
            records.update((rec["id"], rec) for rec in fresh)
        return [records[ex.idx] for ex in batch]

    def _update(self, role: Role, split: TaskSplit, records: list[dict[str, Any]]) -> None:
        self._kind(split, role).update(self.sweeps[f"{_PREFIX[role]}_{split.name}"], records)

    def _step(self, batch: list[Any], dataloader_idx: int, role: Role) -> None:
        check_interrupt()
        split = self._splits[role][dataloader_idx]
        self._update(role, split, self._records(role, split, batch))

    def validation_step(self, batch: list[Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._step(batch, dataloader_idx, "selection")

    def test_step(self, batch: list[Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._step(batch, dataloader_idx, "report")

    # -- selection (validation loop) -------------------------------------------------------------------------
    def on_validation_epoch_end(self) -> None:
        for split in self._splits.get("selection", []):
            sweep = self.sweeps[f"val_{split.name}"]
            info = self._kind(split, "selection").select(split, sweep.shaped())
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
        self.results = {}
        for split in self._splits.get("report", []):
            sweep = self.sweeps[f"test_{split.name}"]
            result, rows = self._kind(split, "report").report(
                split, sweep.shaped(), self.selected.get(split.name)
            )
            if len(self.methods) > 1:
                result["methods"] = self._kind(split, "report").describe(split, self.methods[1:])
            self.results[split.name] = result
            logged = {
                f"test/{self._key(split.name)}/{k}": float(v)
                for k, v in result["report"].items()
                if _is_number(v)
            }
            self.log_dict(logged, sync_dist=True)  # identical on every rank: the sweeps are synced
            if self.trainer.is_global_zero:
                written = write_task_files(
                    self.output_dir, split, result, rows, self.model_name, self.hparams.plots
                )
                if "plot" in written:
                    self._log_plot(split.name, written["plot"])
            sweep.reset()
        if self.trainer.is_global_zero and self.results:
            settings: dict[str, Any] = {"length_normalize": self.length_normalize}
            if self.adaptive is not None:
                settings["adaptive"] = self.adaptive
            if len(self.methods) > 1:
                settings["methods"] = self.methods
            settings.update(self.backend.settings(self._scorer, self._resumed))
            comparison = comparison_payload(self.results, self.methods, self.adaptive is not None)
            if comparison is not None:
                settings["comparison"] = comparison
            table = summary_text(self.results, self.methods, self.adaptive is not None)
            path = self.write_results(settings, table)
            self.summary = (
                f"Coherence boosting, {self.model_name} (accuracy in %)\n{table}\n\nresults: {path}"
            )

    @classmethod
    def comparison_table(cls, runs: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
        return compare_accuracy_table(runs)

    def _log_plot(self, task: str, path: Path) -> None:
        for logger in self.loggers:
            if hasattr(logger, "log_image"):  # WandbLogger
                logger.log_image(key=f"test/{self._key(task)}/alpha_curve", images=[str(path)])


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class LocalBackend:
    """The model runs in this process (``backend: local``)."""

    signature: ClassVar[dict[str, Any]] = {}

    def prepare(self, run: BoostedEvaluator, dm: Any, splits: list[TaskSplit], pending: bool) -> None:
        """Before any model work: the tokenizer, answers longer than the window refused, the model loaded
        when an example needs it."""
        if run.tokenizer is None:
            run._load_tokenizer()
            run._check_lengths(dm.loader_splits("selection") + dm.loader_splits("report"))
        if pending and run.model is None:
            run._load_model()

    def check_checkpoint(self, run: BoostedEvaluator, path: str) -> Any:
        """The checkpoint loads (config, tokenizer) and takes this run's ``max_length``."""
        config = Evaluator.check_checkpoint(run, path)
        if run.hparams.max_length is not None:
            check_max_length(config, run.hparams.max_length, "model.max_length", path)
        return config

    def connect(self, run: BoostedEvaluator) -> Scorer:
        if run.model is None:
            run._load_model()
        hp = run.hparams
        return Scorer(
            run.model,
            run.tokenizer,
            batch_size=hp.batch_size,
            max_length=hp.max_length,
            share_context=hp.share_context,
        )

    def settings(self, scorer: TextScorer | None, resumed: int) -> dict[str, Any]:
        return {}


class ServedBackend:
    """An OpenAI-compatible completions server scores (``backend: openai``, docs/served.md)."""

    signature: ClassVar[dict[str, Any]] = {"backend": "openai"}

    def __init__(self, server: ServerOptions):
        self.server = server

    def prepare(self, run: BoostedEvaluator, dm: Any, splits: list[TaskSplit], pending: bool) -> None:
        """Before any request: what a served model cannot score exactly is refused."""
        run._load_tokenizer()
        check_served_splits(splits, run.tokenizer is not None)

    def check_checkpoint(self, run: BoostedEvaluator, path: str) -> None:
        return None  # a served model's name is the server's to check

    def connect(self, run: BoostedEvaluator) -> ServedScorer:
        return ServedScorer.connect(self.server, run.model_name, run.output_dir / "requests.sqlite")

    def settings(self, scorer: TextScorer | None, resumed: int) -> dict[str, Any]:
        """The server's report (none when every example came from the cache), and a line on what resumed."""
        served = scorer if isinstance(scorer, ServedScorer) else None
        if line := resumed_line(self.server.base_url, resumed, served):
            rank_zero_info(line)
        return {"backend": "openai", **({"served": served.report()} if served is not None else {})}
