"""What both evaluators share: the ``Evaluator`` base of ``BoostedEvaluator`` (``cblight.evaluate``) and
``BoostedGenerationEvaluator`` (``cblight.generate``).

An evaluator is a LightningModule around one causal LM that Lightning's loops drive over an
``EvalDataModule``. The base owns everything that is not about how an example is scored or generated:

* the model, built by ``cblight.sharding.build_causal_lm`` from ``model`` and ``load`` (``LoadOptions``):
  loaded only when a step needs it (a fully cached run never loads it), except under FSDP2, where every
  process builds its shards in ``configure_model`` and scores in phases of synced forwards
  (``cblight.sharding.SyncedForwards``); a ``device_map`` model is placed by accelerate and kept out of
  Lightning's device management, any other is a submodule Lightning moves;
* the tokenizer, the output directory (``{model}`` filled in) and ``overwrite``, which discards the cache
  once per run, on rank 0, before any process reads it;
* one ``RecordCache`` per (task, split or decoding), keyed by a signature of every setting that changes the
  cached numbers (``cache_signature``; a cache written under others is refused, not mixed);
* ``results.json`` with the run's settings (``write_results``), metric keys (``stage/task[/run_label]/...``)
  and the hooks ``cblight.runs`` needs: whether the evaluator selects alpha* on a validation loop
  (``selects``) and, for ``--compare``, how checkpoints' runs become one table (``comparison_table``).
"""

from __future__ import annotations

import shutil
import time
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from lightning.pytorch import LightningModule

from cblight.cache import RecordCache
from cblight.errors import DataError
from cblight.models import LoadOptions, check_loadable, load_tokenizer, model_label
from cblight.results import atomic_write_json
from cblight.runs import resolve_output_dir
from cblight.sharding import SyncedForwards, build_causal_lm, fsdp_mesh, is_sharded

__all__ = ["Evaluator"]


class Evaluator(LightningModule):
    """The shared part of cblight's evaluators (see the module docstring). Subclasses call
    ``super().__init__`` with the loading options, then ``save_hyperparameters()`` themselves (so that
    their own arguments are saved too), and define ``comparison_table``.

    Args:
        model: Hub id, local directory or ``offline:<name>`` of the causal LM; loaded only when a step
            needs it (under FSDP2, ``-c configs/fsdp.yaml``: built in ``configure_model`` on every process).
        tokenizer: tokenizer id or directory (``None``: ``model``'s).
        load: how the checkpoint loads (``cblight.models.LoadOptions``: ``revision``, ``dtype``,
            ``trust_remote_code``; ``--model.load.*``).
        output_dir: where the run's results and per-example cache go; ``{model}`` is replaced by the
            model's short name (``cblight.models.model_label``).
        overwrite: discard the cache under ``output_dir`` once, at the start of the run, instead of
            resuming from it.
        run_label: names this run in logged metrics (``stage/<task>/<run_label>/...``), for comparisons of
            several checkpoints in one logger; ``None`` leaves it out.

    Examples:
        Subclasses add how an example is scored; the shared settings are what the cache is keyed by.

        >>> from cblight.evaluate.boosted_evaluator import BoostedEvaluator
        >>> evaluator = BoostedEvaluator(model="offline:smollm2-135m", output_dir="outputs/eval/{model}")
        >>> evaluator.output_dir.as_posix()
        'outputs/eval/smollm2-135m'
        >>> evaluator.cache_signature("sst2", "validation")
        {'model': 'offline:smollm2-135m', 'tokenizer': 'offline:smollm2-135m', 'revision': None, 'dtype': 'float32', 'task': 'sst2', 'split': 'validation'}
    """

    selects: ClassVar[bool] = False  # runs Lightning's validation loop to choose alpha* before testing

    def __init__(
        self,
        model: str,
        tokenizer: str | None,
        load: LoadOptions,
        output_dir: str,
        overwrite: bool,
        run_label: str | None,
    ):
        super().__init__()
        self.model_name = model
        self.load = LoadOptions.coerce(load)
        self.tokenizer_name: str | None = tokenizer or model
        self.output_dir = resolve_output_dir(output_dir, model_label(model))
        self.run_label = run_label
        self.overwrite = overwrite
        # Not class attributes: a class-level ``_lm = None`` would shadow the submodule nn.Module keeps.
        self._lm: torch.nn.Module | None = None
        self._sharded_lm: Any = None  # a device_map model lives outside Lightning's device management
        self.tokenizer: Any = None
        self._caches: dict[Any, RecordCache] = {}
        self._cached: dict[Any, dict[int, dict[str, Any]]] = {}
        self._cleared = False
        self.results: dict[str, Any] = {}
        self.summary = ""
        self._started = time.time()

    # -- the model and its tokenizer -------------------------------------------------------------------------
    @property
    def model(self) -> Any:
        """The causal LM (``None`` until loaded), sharded by a device map or on this module's device."""
        return self._sharded_lm if self._sharded_lm is not None else self._lm

    @property
    def synced(self) -> SyncedForwards:
        """The phases of synced forward calls of a model sharded over processes (disabled otherwise)."""
        trainer = self._trainer
        return SyncedForwards(is_sharded(trainer) and trainer.world_size > 1, self.device)

    def _load_model(self) -> None:
        device_map, mesh = self.hparams.device_map, fsdp_mesh(self._trainer)
        model = build_causal_lm(
            self.model_name, self.load, mesh=mesh, device=self.device, device_map=device_map
        )
        if device_map is not None:
            self._sharded_lm = model
        else:
            self._lm = model

    def needs_model(self) -> bool:
        """Whether this run scores with a model of its own (a served model's run does not)."""
        return True

    def configure_model(self) -> None:
        """Under FSDP2 every process builds its shards of the model here, before any step (each forward is
        a collective that every process joins); otherwise the model loads when a step first needs it."""
        if self.model is None and is_sharded(self._trainer) and self.needs_model():
            self._load_model()

    def _load_tokenizer(self) -> None:
        if self.tokenizer is None and self.tokenizer_name is not None:
            self.tokenizer = load_tokenizer(self.tokenizer_name, self.load)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch  # lists of text examples: tokenisation happens on the model's device inside the step

    # -- set-up shared by every stage ------------------------------------------------------------------------
    def _datamodule(self) -> Any:
        dm = getattr(self.trainer, "datamodule", None)
        if dm is None or not hasattr(dm, "loader_splits"):
            raise DataError(
                f"{type(self).__name__} needs an EvalDataModule (trainer.*(model, datamodule=...))"
            )
        return dm

    def _clear_cache_once(self) -> None:
        """``overwrite``: the cache directory goes once per run, on rank 0, before any process reads it."""
        if self.overwrite and not self._cleared:
            if self.trainer.is_global_zero:
                shutil.rmtree(self.output_dir / "cache", ignore_errors=True)
            self.trainer.strategy.barrier()
            self._cleared = True

    @property
    def model_settings(self) -> dict[str, Any]:
        """The model's settings: in every cache signature and in ``results.json``."""
        return {
            "model": self.model_name,
            "tokenizer": self.tokenizer_name,
            "revision": self.load.revision,
            "dtype": self.load.dtype,
        }

    def cache_signature(self, task: str, split: str) -> dict[str, Any]:
        """The settings every cached number of a (task, split) depends on; subclasses add their own. A cache
        written under another signature is refused, never mixed (``cblight.cache.RecordCache``).

        Args:
            task: the task's name (``sst2``).
            split: the split's name (``validation``).

        Returns:
            ``model_settings`` with ``task`` and ``split``.
        """
        return {**self.model_settings, "task": task, "split": split}

    def _open_cache(
        self, key: Any, directory: Path, signature: Mapping[str, Any], fields: Sequence[str]
    ) -> dict[int, dict[str, Any]]:
        """Load (and keep, under ``key``) this process's view of one cache directory: records by example id."""
        self._caches[key] = RecordCache(directory, signature, rank=self.global_rank, fields=fields)
        self._cached[key] = self._caches[key].load()
        return self._cached[key]

    def _store(self, key: Any, records: Sequence[dict[str, Any]]) -> None:
        """Append fresh records to the cache under ``key`` and to this process's view of it."""
        self._caches[key].append(records)
        self._cached[key].update((rec["id"], rec) for rec in records)

    # -- results -------------------------------------------------------------------------------------------
    def _key(self, task: str) -> str:
        """The task part of a metric name: ``<task>``, or ``<task>/<run_label>`` in comparisons."""
        return f"{task}/{self.run_label}" if self.run_label else task

    def write_results(self, settings: Mapping[str, Any], summary: str) -> Path:
        """``<output_dir>/results.json``, written atomically: cblight's version, the model settings,
        ``settings``, wall time, the printed ``summary`` and every task's result (``self.results``). Called on
        rank 0 only.

        Args:
            settings: the run's own settings (beyond ``model_settings``), JSON-serialisable.
            summary: the summary table the run prints.

        Returns:
            The path of the written ``results.json``.
        """
        from cblight import __version__

        run = {"cblight_version": __version__, **self.model_settings, **settings}
        run.update(seconds=round(time.time() - self._started, 1), summary=summary, tasks=self.results)
        return atomic_write_json(self.output_dir / "results.json", run)

    # -- comparisons (``--compare``, ``cblight.runs.run_comparison``) ------------------------------------------
    def check_checkpoint(self, path: str) -> Any:
        """That a compared checkpoint loads (its config and tokenizer; no weights), before the first
        comparison run starts.

        Args:
            path: the checkpoint's Hub id or directory.

        Returns:
            Its ``transformers`` config (subclasses may return ``None`` where nothing can be loaded here).

        Raises:
            ModelLoadError: naming what fails to load.
        """
        return check_loadable(path, load=self.load)

    def comparison_overrides(self, hparams: Mapping[str, Any], first: str) -> dict[str, Any]:
        """Arguments every compared checkpoint's evaluator gets beyond its model path (``--compare``).

        Args:
            hparams: the evaluator's hyperparameters as configured.
            first: the first compared checkpoint, the base model.

        Returns:
            Constructor arguments to override; none in the base class.
        """
        return {}

    @classmethod
    @abstractmethod
    def comparison_table(cls, runs: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
        """One table of several checkpoints' results (``--compare``), in the layout of the paper's table for
        the evaluator's kind of task.

        Args:
            runs: each checkpoint's per-task results (the ``tasks`` of its ``results.json``) by its label,
                the base model first.

        Returns:
            The table as printed text, and its rows as dicts.
        """
