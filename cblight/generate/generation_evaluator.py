"""The generation tables as a LightningModule: paper Tables 2 and 3, the summarisation table and Figure 3.

The evaluator reads top to bottom:

1. set-up: each task's kind of table (``cblight.generate.rows``: text, dialog or summary) and its rows (plain
   sampling, nucleus, beam search and boosted rows), a metric suite per row, the caches, and the token
   budget, checked once (``prompt_room``) from the checkpoint's config before the model loads (a config that
   names no window: from the model, at the first batch with work to do);
2. each test batch: its prompts fitted to the budget once (``cblight.truncation.fit_example``), then decoded
   once per row (``generate_prepared``, ``boosted_generate`` without its checks); the records update the
   row's suite through the kind (Table 2's columns for WebText, with perplexity, LTF and delta under the base
   LM; Table 3's for DSTC7; ROUGE-1/2/L of the first 3 or 2 sentences for summaries). The "Human" row scores
   the held-out human text the same way;
3. the report (``cblight.generate.report``: ``TaskTable``, ``GenerationReport``): the logged metrics, and
   on rank 0 ``generations/<task>/<row>.jsonl``, the adaptive rows' alpha statistics, W&B samples, Figure 3
   when a grid is given, ``results.json`` and the printed table.

Every generation is appended to a per-(task, row) cache as it is produced, with the per-token
log-probabilities the Table 2 metrics need, so an interrupted run resumes and a finished one recomputes its
tables without the model.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from cblight.batching import input_device
from cblight.cache import digest
from cblight.data.datamodule import TaskSplit
from cblight.data.examples import DataError, GenerationExample
from cblight.errors import CblightError, ConfigError
from cblight.evaluator import Evaluator
from cblight.generate.decode import generate_prepared
from cblight.generate.inputs import prepare_prompts, prompt_room
from cblight.generate.report import GenerationReport, TaskTable, comparison_table
from cblight.generate.rows import Decoding, DecodingGrid, TableKind, kind_of, resolve_decodings
from cblight.metrics.coherence import generated_token_log_probs
from cblight.metrics.dialog_meteor import MeteorRoute, resolve_meteor_route
from cblight.models import LoadOptions, checkpoint_window, load_causal_lm, model_window
from cblight.option_types import NonNegativeInt, PositiveInt, check_arguments
from cblight.runs import check_interrupt
from cblight.scoring import Encoder
from cblight.truncation import fit_example

__all__ = ["BoostedGenerationEvaluator"]

DEFAULT_MAX_NEW_TOKENS = 64  # tasks whose paper setting gives none (DSTC7 responses end at EOS well before)
RECORD_FIELDS = ("id", "input", "prompt", "context", "tokens", "text")


@dataclass
class GenerationTask:
    """One task of a generation run: its split, the kind of table it fills, its rows (the run's decodings, then
    ``None``, the human row, when the task has human text to score), and the prompt tokens that fit in the
    window beside ``max_new_tokens`` (``prompt_room``; ``None`` until the window is known)."""

    split: TaskSplit
    kind: TableKind
    max_new_tokens: int
    rows: list[Decoding | None]
    room: int | None = None


class BoostedGenerationEvaluator(Evaluator):
    """Generation with and without coherence boosting, scored with the paper's metrics.

    Args:
        model: Hub id or local directory of the causal LM that generates.
        tokenizer: its tokenizer (default: ``model``).
        load: how the checkpoint (and ``metrics_model``) loads: ``revision``, ``dtype`` (mixing and
            log-softmax run in float32) and ``trust_remote_code`` (``cblight.models.LoadOptions``).
        device_map: accelerate device map to spread a large model over one process's devices (under FSDP2,
            ``-c configs/fsdp.yaml``, leave it unset).
        decodings: the rows to generate (default: greedy).
        grid: boosted decodings over a (k, alpha) grid, appended to ``decodings`` (Figure 3's plot).
        max_new_tokens: tokens to generate (default: the task's, 200 for WebText and 100 for summaries).
        seed: base seed; each generate call is seeded from it, the row and the batch's example ids, so a
            rerun draws the same samples and each process (holding other examples under DDP) other ones.
        metrics_model: the base LM of perplexity, LTF and delta (default: ``model``; set it to the base
            checkpoint when ``model`` is a tuned one).
        short_window: the short context of LTF and delta (20 tokens in the paper).
        self_bleu_samples: hypotheses sampled for self-BLEU (degen's 1000; ``None`` scores all).
        meteor: dialog tables' METEOR: ``official`` (the METEOR 1.5 jar of the DSTC7 evaluation; needs
            Java and ``cblight[dialog]``), ``nltk`` (column ``meteor_nltk``), or ``auto`` (official where
            it can run, else nltk). ``official`` where it cannot run is refused when given; ``auto`` is
            resolved only when a dialog task is set up.
        human: also score the held-out human text (the "Human" row).
        score_batch_size: documents per forward pass of the metrics model when scoring with the base LM
            (``data.batch_size`` is the prompts per generate call).
        output_dir: where generations, results, plots, cache and logs go (``{model}`` = the model's name).
        overwrite: discard the generation cache in ``output_dir`` instead of resuming from it.
        plots: write Figure 3 (metrics vs alpha per k, with the human line) when a grid is given.
        log_samples: generations per decoding logged as a W&B table (when W&B logs).
        run_label: names this run in logged metrics (``test/<task>/<run_label>/<decoding>/<metric>``), for
            comparisons of several checkpoints in one logger.
    """

    def __init__(
        self,
        model: str = "gpt2",
        tokenizer: str | None = None,
        load: LoadOptions = LoadOptions(),
        device_map: str | None = None,
        decodings: list[Decoding] | None = None,
        grid: DecodingGrid | None = None,
        max_new_tokens: PositiveInt | None = None,
        seed: int = 1234,
        metrics_model: str | None = None,
        short_window: PositiveInt = 20,
        self_bleu_samples: PositiveInt | None = 1000,
        meteor: MeteorRoute = "auto",
        human: bool = True,
        score_batch_size: PositiveInt = 8,
        output_dir: str = "outputs/generation/{model}",
        overwrite: bool = False,
        plots: bool = True,
        log_samples: NonNegativeInt = 16,
        run_label: str | None = None,
    ):
        super().__init__(model, tokenizer, load, output_dir, overwrite, run_label)
        self.save_hyperparameters()
        self.decodings, self.grid = resolve_decodings(decodings, grid)
        # the rows come back from checkpoints as dicts: checked as the resolved dataclasses
        check_arguments(
            type(self).__init__,
            {**self.hparams, "decodings": self.decodings, "grid": self.grid, "load": self.load},
        )
        if meteor == "official":  # asked for by name: refused here, before any work, where it cannot run
            resolve_meteor_route(meteor)
        self._metrics_lm: Any = None
        self.suites = nn.ModuleDict()
        self._tasks: list[GenerationTask] = []

    # -- setup ---------------------------------------------------------------------------------------------
    def _signature(self, task: GenerationTask, decoding: Decoding | None) -> dict[str, Any]:
        sig = self.cache_signature(task.split.name, task.split.split)
        sig.update(
            max_new_tokens=task.max_new_tokens,
            metrics_model=self.hparams.metrics_model or self.model_name,
            short_window=self.hparams.short_window,
        )
        if decoding is None:  # the human row draws nothing: no seed
            return {**sig, "decoding": "human"}
        return {**sig, "seed": self.hparams.seed, "decoding": decoding.signature()}

    def setup(self, stage: str) -> None:
        if stage != "test":
            raise ConfigError(
                "BoostedGenerationEvaluator runs the test loop only (cblight generate does that)"
            )
        dm = self._datamodule()
        self._clear_cache_once()
        self._load_tokenizer()
        window = checkpoint_window(self.model_name, self.load)  # from the config, no weights
        self._tasks = []
        pending = False
        for split in dm.loader_splits("report"):
            spec = split.task
            if spec.kind != "generation":
                raise DataError(
                    f"{spec.name} is a {spec.kind} task; evaluate it with configs for BoostedEvaluator"
                )
            max_new = self.hparams.max_new_tokens or spec.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
            human = self.hparams.human and any(ex.human for ex in split.examples)
            # the one budget check, before the model loads where the config names the window (else in the
            # first batch with work to do, from the model loaded here or, under FSDP2, built in configure_model)
            room = None if window is None else prompt_room(window, max_new, "model.max_new_tokens")
            task = GenerationTask(
                split, kind_of(split), max_new, [*self.decodings, *([None] if human else [])], room
            )
            self._tasks.append(task)
            for i, decoding in enumerate(task.rows):
                slug = decoding.slug if decoding is not None else "human"
                # a suite per row, keyed by its position (ModuleDict keys may not hold the "." of alphas)
                if f"{split.name}__{i}" not in self.suites:  # the dialog suite resolves the METEOR route
                    self.suites[f"{split.name}__{i}"] = task.kind.new_suite(
                        eos_token_id=self.tokenizer.eos_token_id,
                        self_bleu_samples=self.hparams.self_bleu_samples,
                        meteor=self.hparams.meteor,
                    )
                cached = self._open_cache(
                    (split.name, slug),
                    self.output_dir / "cache" / split.name / slug,
                    self._signature(task, decoding),
                    RECORD_FIELDS,
                )
                pending = pending or not all(_current(cached, ex) for ex in split.examples)
        if pending and self.model is None and not self.synced.enabled:
            self._load_model()

    # -- one batch -----------------------------------------------------------------------------------------
    def test_step(self, batch: list[GenerationExample], batch_idx: int, dataloader_idx: int = 0) -> None:
        task = self._tasks[dataloader_idx]
        fitted: dict[int, list[int]] = {}  # each prompt of the batch fitted once, for every row
        total = self.trainer.num_test_batches[dataloader_idx]  # Lightning counts them before the first step
        for i, decoding in enumerate(task.rows, 1):
            if decoding is not None:
                check_interrupt()
                show_progress(
                    self.trainer,
                    f"{task.split.name} batch {batch_idx + 1}/{total} ({len(batch)} prompts): "
                    f"decoding {i}/{len(self.decodings)} {decoding.name!r}",
                )
            # under FSDP2 every process makes as many model calls (decoding steps, scoring passes) as the
            # busiest: one that finished, or had its records cached, pads with 1-token forwards
            with self.synced.phase(self.model):
                records = self._records(task, decoding, batch, fitted)
            if not records:
                continue
            examples = [task.split.by_idx[r["id"]] for r in records]
            task.kind.update(self.suites[f"{task.split.name}__{i - 1}"], records, examples)

    def _records(
        self,
        task: GenerationTask,
        decoding: Decoding | None,
        batch: list[GenerationExample],
        fitted: dict[int, list[int]],
    ) -> list[dict[str, Any]]:
        """The batch's records of one row (``None``: the human row), from the cache or made now: generated
        (or, for the human row, each held-out continuation cut to the generation length), and for Table 2
        with the per-token ``log p_full`` / ``log p_short`` of their tokens under the base LM (perplexity,
        LTF and delta), rounded to 6 decimals for the cache. ``fitted`` holds the batch's prompts fitted to
        the task's room so far, by example id (filled here, once per prompt)."""
        key = (task.split.name, decoding.slug if decoding is not None else "human")
        cached = self._cached[key]
        todo = [ex for ex in batch if not _current(cached, ex) and (decoding is not None or ex.human)]
        if not todo:
            return [cached[ex.idx] for ex in batch if _current(cached, ex)]
        if task.room is None:  # the checkpoint's config names no window: the model's
            task.room = prompt_room(model_window(self.model), task.max_new_tokens, "model.max_new_tokens")
        fitted.update(
            (ex.idx, fit_example(self.tokenizer, ex, task.room)) for ex in todo if ex.idx not in fitted
        )
        prompts = [fitted[ex.idx] for ex in todo]
        alphas = None  # with an adaptive rule, each row's alpha at each of its tokens
        if decoding is None:
            enc = Encoder(self.tokenizer)
            tokens = [enc.body(ex.human or "")[: task.max_new_tokens] for ex in todo]
            texts = [self.tokenizer.decode(t) for t in tokens]
        else:
            # seeded by the run's seed, the row and the batch's example ids: a rerun draws the same samples,
            # and each process (holding other examples under DDP) other ones
            key_text = f"{self.hparams.seed}|{decoding.slug}|{','.join(str(ex.idx) for ex in todo)}"
            try:
                sampling = decoding.generate_sampling(zlib.crc32(key_text.encode("utf-8")))
                prepared = prepare_prompts(
                    self.tokenizer, prompts, decoding.boosting_for(task.kind), device=input_device(self.model)
                )
                out = generate_prepared(
                    self.model, self.tokenizer, prepared, sampling, max_new_tokens=task.max_new_tokens
                )
            except CblightError as err:
                raise type(err)(f"decoding {decoding.name!r}: {err}") from None
            tokens, texts, alphas = out.tokens, out.texts, out.alphas
        fresh = []
        for j, ex in enumerate(todo):
            # what the metrics and generations/*.jsonl need
            record: dict[str, Any] = {
                "id": ex.idx,
                "input": digest(ex.input_key()),
                "prompt": ex.prompt,
                "context": list(prompts[j]),
                "tokens": list(tokens[j]),
                "text": texts[j],
            }
            if alphas is not None:
                record["alphas"] = [round(a, 6) for a in alphas[j]]
            fresh.append({**record, **task.kind.record_extras(texts[j], task.split)})
        scored = task.kind.to_score(fresh)
        if scored:
            # the model itself unless another is named (loaded here, once): setup, seeing work to do, loaded it
            name = self.hparams.metrics_model
            own = name is None or name == self.model_name
            if not own and self._metrics_lm is None:
                self._metrics_lm = load_causal_lm(name, self.load).to(self.device)
            metrics_lm = self.model if own else self._metrics_lm
            log_probs = generated_token_log_probs(
                metrics_lm,
                [r["context"] for r in scored],
                [r["tokens"] for r in scored],
                k=self.hparams.short_window,
                prefix=Encoder(self.tokenizer).prefix,
                batch_size=self.hparams.score_batch_size,
                pad_id=int(self.tokenizer.pad_token_id or 0),
            )
            for r, (full, short) in zip(scored, log_probs):
                r["lp_full"] = [round(x, 6) for x in full.tolist()]
                r["lp_short"] = [round(x, 6) for x in short.tolist()]
        self._store(key, fresh)  # into ``cached`` too
        return [cached[ex.idx] for ex in batch if _current(cached, ex)]

    # -- report (rank 0 writes every file, atomically: ``cblight.generate.report``) --------------------------
    def on_test_epoch_end(self) -> None:
        report = GenerationReport(
            self.output_dir, self.decodings, self.grid, self.hparams.plots, self.hparams.log_samples
        )
        self.results = {}
        blocks = []
        for task in self._tasks:
            table = self._table(task)
            name = task.split.name
            self.log_dict(table.metrics(self._key(name)), sync_dist=True)  # the suites are synced: one value
            result = self.results[name] = table.result(self.decodings)
            if self.trainer.is_global_zero:
                caches = {d.slug: self._caches[(name, d.slug)] for d in self.decodings}
                report.write_task_files(table, result, caches, self.loggers, self._key(name))
            blocks.append(table.printed(result))
        self.trainer.strategy.barrier()
        if self.trainer.is_global_zero and self.results:
            text = "\n\n".join(blocks)
            metrics_model = self.hparams.metrics_model or self.model_name
            path = self.write_results({"metrics_model": metrics_model, "seed": self.hparams.seed}, text)
            self.summary = (
                f"Generation with coherence boosting, {self.model_name}\n\n{text}\n\nresults: {path}"
            )

    def _table(self, task: GenerationTask) -> TaskTable:
        """The task's table from its rows' suites (computed across processes, then reset)."""
        suites = [self.suites[f"{task.split.name}__{i}"] for i in range(len(task.rows))]
        values = [suite.compute() for suite in suites]
        for suite in suites:
            suite.reset()
        rows = [(d.name, d.slug, v) for d, v in zip(self.decodings, values)]
        human = values[-1] if task.rows[-1] is None else None
        return TaskTable(task.split, task.kind, task.max_new_tokens, list(suites[0].columns), rows, human)

    # -- comparisons of several checkpoints (``--compare``) ------------------------------------------------
    def comparison_overrides(self, hparams: Mapping[str, Any], first: str) -> dict[str, Any]:
        # perplexity, LTF and delta under the base LM (Table 2), unless the config names one
        return {} if hparams.get("metrics_model") else {"metrics_model": first}

    comparison_table = staticmethod(comparison_table)  # type: ignore[assignment]


def _current(cached: Mapping[int, Mapping[str, Any]], example: GenerationExample) -> bool:
    """Whether ``cached`` holds a record of ``example`` made from its present input."""
    return cached.get(example.idx, {}).get("input") == digest(example.input_key())


def show_progress(trainer: Any, text: str) -> None:
    """Which decoding of which prompt batch runs now (one batch can take minutes): on Lightning's progress
    bar when it shows (tqdm's postfix, rich's description), else one log line per (batch, decoding)."""
    callback = trainer.progress_bar_callback
    try:  # TQDMProgressBar raises while it has no test bar
        bar = callback.test_progress_bar
    except (AttributeError, TypeError, AssertionError):
        bar = None
    if hasattr(bar, "set_postfix_str"):  # TQDMProgressBar
        bar.set_postfix_str(text, refresh=True)
    elif getattr(callback, "test_progress_bar_id", None) is not None:  # RichProgressBar, while it tests
        callback.progress.update(callback.test_progress_bar_id, description=f"Testing {text}")
        callback.refresh()
    else:
        rank_zero_info(f"generation: {text}")
