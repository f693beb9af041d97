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
from functools import cache
from typing import Any, ClassVar, Literal

from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from cblight.adaptive import RuleName, rule_for
from cblight.boosting import AlphaGrid, too_large_alpha
from cblight.data.datamodule import Role, TaskSplit
from cblight.data.examples import ChoiceExample, DataError
from cblight.data.registry import RenderContext
from cblight.errors import ConfigError
from cblight.evaluate.methods import MethodName, MethodOptions, not_applicable
from cblight.evaluate.multiple_choice import MultipleChoice
from cblight.evaluate.next_token import NextToken
from cblight.evaluate.task_scoring import TaskScoring, compare_accuracy_table, summary_text, write_task_files
from cblight.evaluator import Evaluator
from cblight.models import LoadOptions, check_checkpoint_max_length, check_max_length, checkpoint_window
from cblight.option_types import PositiveInt, check_arguments
from cblight.runs import check_interrupt
from cblight.scoring import Scorer, TextScorer
from cblight.served import ServedModelError, ServedScorer, ServerOptions

__all__ = ["DEFAULT_KS", "BoostedEvaluator"]

KINDS: dict[str, type[TaskScoring]] = {kind.kind: kind for kind in (MultipleChoice, NextToken)}
_STAGE_ROLE: dict[str, Role] = {"validate": "selection", "test": "report"}
DEFAULT_KS = tuple(range(1, 21))  #: the default ``ks``, LAMBADA's grid (Table 1); LAMA's is 1..5 (Table 5)


def _range_form(value: Any, option: str) -> Any:
    """A grid option's range form ``{start, stop, step}`` as the ``AlphaGrid`` it declares, where it comes
    as a mapping (a hyperparameter round trip, e.g. under ``--compare``, or a Python caller) or a jsonargparse
    ``Namespace``; any other value as it is."""
    if hasattr(value, "as_dict"):  # a jsonargparse Namespace
        value = value.as_dict()
    if not isinstance(value, Mapping):
        return value
    if unknown := set(value) - {"start", "stop", "step"}:
        raise ConfigError(
            f"{option}: unknown key {sorted(unknown)[0]!r} (the range form is start, stop, step)"
        )
    try:
        return AlphaGrid(**{k: float(v) for k, v in value.items()})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{option}: {err}") from None


def _grid(value: AlphaGrid | Sequence[float] | None, default: AlphaGrid, option: str) -> list[float]:
    """The alpha values of a grid option: a list, or the range form (an ``AlphaGrid``)."""
    value = default if value is None else value
    try:
        values = value.values() if isinstance(value, AlphaGrid) else [float(v) for v in value]
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{option}: {err}") from None
    if not values:
        raise ConfigError(f"{option}: the alpha grid is empty")
    if bad := [v for v in values if not math.isfinite(v)]:
        raise ConfigError(f"{option}: every alpha must be a finite number, got {bad[0]} in {values[:10]}")
    if too_large := too_large_alpha(values):
        raise ConfigError(f"{option}: {too_large}")
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
        load: how the checkpoint loads: ``revision``, ``dtype`` (``auto`` keeps the checkpoint's; log-softmax
            and mixing always run in float32) and ``trust_remote_code`` (``cblight.models.LoadOptions``).
        device_map: accelerate device map (e.g. ``auto``) to spread a large model over one process's
            devices; placement is then left to it (under FSDP2, ``-c configs/fsdp.yaml``, leave it unset).
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
            question or per passage), ``cocoa`` (next-token), ``gated``, ``decorrelate`` or ``balance``
            (multiple choice, one alpha from the unlabelled reported inputs); next-token rules take ``k`` from the
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
        load: LoadOptions = LoadOptions(),
        device_map: str | None = None,
        batch_size: PositiveInt | Literal["auto"] = "auto",
        max_length: PositiveInt | None = None,
        share_context: bool = True,
        choice_alphas: AlphaGrid | list[float] | None = None,
        next_token_alphas: AlphaGrid | list[float] | None = None,
        ks: list[PositiveInt] | None = None,
        length_normalize: bool = False,
        adaptive: RuleName | None = None,
        methods: list[MethodName] | None = None,
        method_options: MethodOptions | None = None,
        backend: Literal["local", "openai"] = "local",
        server: ServerOptions | None = None,
        output_dir: str = "outputs/eval/{model}",
        overwrite: bool = False,
        plots: bool = True,
        run_label: str | None = None,
    ):
        load = LoadOptions.coerce(load)
        choice_alphas = _range_form(choice_alphas, "choice_alphas")
        next_token_alphas = _range_form(next_token_alphas, "next_token_alphas")
        check_arguments(type(self).__init__, locals())
        super().__init__(model, tokenizer, load, output_dir, overwrite, run_label)
        self.save_hyperparameters()
        if backend == "local" and server is not None:
            raise ConfigError("server options are for backend: openai (this run's backend is local)")
        self.backend = ServedBackend(server or ServerOptions()) if backend == "openai" else LocalBackend()
        if backend == "openai":
            self.tokenizer_name = tokenizer  # the server tokenises; a local one only spells special tokens
        self.choice_alphas = _grid(choice_alphas, AlphaGrid(2.0, -5.0, 0.01), "choice_alphas")
        self.next_token_alphas = _grid(next_token_alphas, AlphaGrid(0.0, -1.0, 0.1), "next_token_alphas")
        self.ks = list(ks) if ks is not None else list(DEFAULT_KS)
        if not self.ks:
            raise ConfigError("ks: the grid of short-context lengths is empty")
        if len(set(self.ks)) != len(self.ks):
            raise ConfigError(f"ks repeats a value: {self.ks}")
        if max_length is not None and backend == "local":  # past learned positions a run fails mid-way
            check_checkpoint_max_length(model, max_length, "model.max_length", load)
        self.length_normalize = length_normalize
        self.adaptive = adaptive
        if methods and len(set(methods)) != len(methods):
            raise ConfigError(f"methods repeats a name: {list(methods)}")
        self.methods = ["boost", *[m for m in methods or () if m != "boost"]]  # boost is always computed
        self.method_options = method_options
        self._scorer: TextScorer | None = None
        self._kinds: dict[tuple[Role, str], TaskScoring] = {}
        self.sweeps = nn.ModuleDict()
        self._splits: dict[Role, list[TaskSplit]] = {}
        self.selected: dict[str, dict[str, Any]] = {}
        self._resumed = 0  # examples an earlier run left in the per-example cache

    # -- setup ---------------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        # validate or test: Lightning refuses to fit or predict with an evaluator (no training_step, no forward)
        role = _STAGE_ROLE[stage]
        dm = self._datamodule()
        self._clear_cache_once()
        self._splits[role] = splits = dm.loader_splits(role)
        pending = False
        for split in splits:
            kind = self._kind(split, role)
            if f"{role}_{split.name}" not in self.sweeps:
                self.sweeps[f"{role}_{split.name}"] = kind.new_sweep(split)
            label = f"{split.split}-sample" if split.sampled_indices is not None else split.split
            sig = {**self.cache_signature(split.name, split.split), "max_length": self.hparams.max_length}
            sig.update(**self.backend.signature, **kind.signature())
            path = self.output_dir / "cache" / split.name / label
            cached = self._open_cache((role, split.name), path, sig, kind.record_fields)
            pending = pending or any(kind.missing(cached.get(ex.idx), ex) for ex in split.examples)
        self.backend.prepare(self, dm, splits, pending)

    def _kind(self, split: TaskSplit, role: Role) -> TaskScoring:
        """How examples of this split are scored, selected on and reported; the comparison methods that
        apply and the label-free rule on the reported split only (they choose nothing)."""
        key = (role, split.name)
        if key not in self._kinds:
            if split.task.kind not in KINDS:
                raise DataError(
                    f"{split.name}: tasks of kind {split.task.kind!r} are not evaluated by BoostedEvaluator"
                )
            report = role == "report"
            methods = [m for m in self.methods[1:] if report and not_applicable(m, split) is None]
            rule = rule_for(self.adaptive, split.task.kind) if report and self.adaptive else None
            self._kinds[key] = KINDS[split.task.kind](self, split, methods, rule)
        return self._kinds[key]

    def check_tasks(self, datamodule: Any) -> None:
        """Refuse, before any data or model is loaded, a label-free rule (``adaptive``) that does not apply
        to a task of the run (``cblight.adaptive.rule_for``).

        Args:
            datamodule: the run's ``EvalDataModule`` (its ``specs``, the tasks it holds).

        Returns:
            None, when the rule applies to every task of the run (or no rule is set).

        Raises:
            ConfigError: naming ``--model.adaptive``, the task and the rules that apply to it.

        Examples:
            >>> from types import SimpleNamespace
            >>> from cblight.data.registry import get_task
            >>> datamodule = SimpleNamespace(specs=[get_task("piqa")])
            >>> BoostedEvaluator(model="offline:smollm2-135m", adaptive="cocoa").check_tasks(datamodule)
            Traceback (most recent call last):
            ...
            cblight.errors.ConfigError: --model.adaptive: task piqa: adaptive rule 'cocoa' does not apply to multiple-choice tasks; use auto or one of gated, jsd, jsd_mean, decorrelate, balance
        """
        for spec in getattr(datamodule, "specs", []) if self.adaptive is not None else ():
            if spec.kind in KINDS:
                try:
                    rule_for(self.adaptive, spec.kind)
                except ValueError as err:
                    raise ConfigError(f"--model.adaptive: task {spec.name}: {err}") from None

    def check_checkpoint(self, path: str) -> Any:
        return self.backend.check_checkpoint(self, path)

    def needs_model(self) -> bool:
        return isinstance(self.backend, LocalBackend)

    def _step(self, batch: list[Any], dataloader_idx: int, role: Role) -> None:
        """Score the examples of ``batch`` the cache lacks, then feed every record to the split's sweep."""
        check_interrupt()
        split = self._splits[role][dataloader_idx]
        cached = self._cached[(role, split.name)]  # this process's view, which _store updates
        kind = self._kind(split, role)
        todo = [ex for ex in batch if kind.missing(cached.get(ex.idx), ex)]
        self._resumed += len(batch) - len(todo)
        # under FSDP2 every process makes as many model calls as the busiest (its cache may hold its examples)
        with self.synced.phase(self.model if self.needs_model() else None):
            if todo:
                if self._scorer is None:  # connected when an example needs it
                    self._scorer = self.backend.connect(self)
                self._store((role, split.name), kind.score(self._scorer, split, todo, cached))
        kind.update(self.sweeps[f"{role}_{split.name}"], [cached[ex.idx] for ex in batch])

    def validation_step(self, batch: list[Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._step(batch, dataloader_idx, "selection")

    def test_step(self, batch: list[Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._step(batch, dataloader_idx, "report")

    # -- selection (validation loop) -------------------------------------------------------------------------
    def on_validation_epoch_end(self) -> None:
        for split in self._splits.get("selection", []):
            sweep = self.sweeps[f"selection_{split.name}"]
            self.selected[split.name] = info = self._kind(split, "selection").select(split, sweep.shaped())
            key = f"val/{self._key(split.name)}"
            logged = {f"{key}/{n}": float(info[n]) for n in ("acc", "alpha_star", "k_star") if n in info}
            self.log_dict(logged, sync_dist=True)  # identical on every rank: the sweeps are synced
            sweep.reset()

    # -- report (test loop) -----------------------------------------------------------------------------------
    def on_test_epoch_end(self) -> None:
        self.results = {}
        for split in self._splits.get("report", []):
            sweep = self.sweeps[f"report_{split.name}"]
            kind = self._kind(split, "report")
            result, rows = kind.report(split, sweep.shaped(), self.selected.get(split.name))
            if len(self.methods) > 1:
                result["methods"] = kind.describe(split, self.methods[1:])
            self.results[split.name] = result
            key = f"test/{self._key(split.name)}"
            # the report's numbers: not the split's name, the rule's summary, a bool
            logged = {f"{key}/{k}": float(v) for k, v in result["report"].items() if type(v) in (int, float)}
            self.log_dict(logged, sync_dist=True)  # identical on every rank: the sweeps are synced
            if self.trainer.is_global_zero:
                written = write_task_files(
                    self.output_dir, split, result, rows, self.model_name, self.hparams.plots
                )
                for logger in self.loggers if "plot" in written else ():
                    if hasattr(logger, "log_image"):  # WandbLogger
                        logger.log_image(key=f"{key}/alpha_curve", images=[str(written["plot"])])
            sweep.reset()
        if self.trainer.is_global_zero and self.results:
            settings: dict[str, Any] = {"length_normalize": self.length_normalize}
            if self.adaptive is not None:
                settings["adaptive"] = self.adaptive
            if len(self.methods) > 1:
                settings["methods"] = self.methods
            settings.update(self.backend.settings(self._scorer, self._resumed))
            table, comparison = summary_text(self.results, self.methods, self.adaptive is not None)
            if comparison is not None:
                settings["comparison"] = comparison
            path = self.write_results(settings, table)
            self.summary = (
                f"Coherence boosting, {self.model_name} (accuracy in %)\n{table}\n\nresults: {path}"
            )

    comparison_table = staticmethod(compare_accuracy_table)  # type: ignore[assignment]


class LocalBackend:
    """The model runs in this process (``backend: local``)."""

    signature: ClassVar[dict[str, Any]] = {}

    def prepare(self, run: BoostedEvaluator, dm: Any, splits: list[TaskSplit], pending: bool) -> None:
        """Before any model work: the tokenizer, an answer that alone exceeds the model window refused, the
        model loaded when an example needs it."""
        if run.tokenizer is None:
            run._load_tokenizer()
            window = run.hparams.max_length or checkpoint_window(run.model_name, run.load)
            # answer sets repeat across examples: tokenise each string once
            length = cache(lambda text: len(run.tokenizer(text, add_special_tokens=False)["input_ids"]))
            for split in dm.loader_splits("selection") + dm.loader_splits("report") if window else ():
                for ex in split.examples:
                    for choice in ex.choices if isinstance(ex, ChoiceExample) else ():
                        if (n := length(choice)) > window:
                            raise DataError(
                                f"{split.name}: an answer at {ex.where} has {n} tokens, more than "
                                f"the model window of {window} (answers are never cut; contexts are cut from "
                                "the left)"
                            )
        if pending and run.model is None and not run.synced.enabled:  # FSDP2 builds it in configure_model
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
        """Before any request, what a served model cannot score exactly is refused: next-token tasks (the
        argmax over the vocabulary, ``cblight.served.scorer``), and prompts holding a special token that only
        a local tokenizer can spell (SST-5's answers end with EOS: without ``tokenizer`` it would be GPT-2's
        literal)."""
        run._load_tokenizer()
        placeholder = RenderContext().eos_token
        for split in splits:
            if split.task.kind != "multiple_choice":
                raise ServedModelError(
                    f"{split.name}: next-token prediction needs the model's whole next-token distribution (the "
                    "boosted argmax over the vocabulary), and a completions server returns only the top-N "
                    "log-probs of a position; backend openai scores multiple-choice tasks only (exact from "
                    "prompt log-probs): run next-token tasks with backend local"
                )
            if run.tokenizer is None:
                for ex in split.examples:
                    if placeholder in ex.context or any(placeholder in c for c in ex.choices):
                        raise ServedModelError(
                            f"{split.name}: its prompts contain the tokenizer's EOS token, which a served "
                            "model's name does not tell; give the model's tokenizer as --model.tokenizer (only "
                            "its special tokens are used)"
                        )

    def check_checkpoint(self, run: BoostedEvaluator, path: str) -> None:
        return None  # a served model's name is the server's to check

    def connect(self, run: BoostedEvaluator) -> ServedScorer:
        return ServedScorer.connect(self.server, run.model_name, run.output_dir / "requests.sqlite")

    def settings(self, scorer: TextScorer | None, resumed: int) -> dict[str, Any]:
        """The server's report (none when every example came from the cache); for a run that resumed, one line
        on the examples an earlier run had scored (the per-example cache) and the requests it had paid for
        (the request cache), neither asked again."""
        served = scorer if isinstance(scorer, ServedScorer) else None
        hits, sent = (served.client.cache_hits, served.client.requests_sent) if served else (0, 0)
        if resumed or hits:
            where = f" ({served.client.cache.path})" if served and served.client.cache is not None else ""
            rank_zero_info(
                f"served model at {self.server.base_url}, resumed: {resumed} examples from the per-example "
                f"cache, {hits} requests answered from the request cache{where}, {sent} requests sent (checks "
                "included)"
            )
        return {"backend": "openai", **({"served": served.report()} if served is not None else {})}
