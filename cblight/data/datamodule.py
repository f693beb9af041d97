"""The evaluation data module: every requested task's report split and alpha-selection split.

Lightning's validation loop runs the *selection* splits (alpha* and k* are chosen there) and its test loop
the *report* splits (DESIGN.md §2); one dataloader per task, in the order of ``tasks``. Batches are lists of
rendered examples, longest first so that padding stays small.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader

from cblight.data.examples import ChoiceExample, DataError, Example, NextTokenExample
from cblight.data.registry import RenderContext, TaskSpec, get_task
from cblight.data.sources import load_split_records

Role = Literal["report", "selection"]


@dataclass
class TaskSplit:
    """The rendered examples of one task's report or selection split."""

    task: TaskSpec
    role: Role
    split: str
    examples: list[Example]
    sampled_indices: list[int] | None = None
    seed: int | None = None
    by_idx: dict[int, Example] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.by_idx = {ex.idx: ex for ex in self.examples}

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def description(self) -> str:
        if self.sampled_indices is not None:
            return f"{self.split} sample of {len(self.examples)} (seed {self.seed})"
        return self.split

    @property
    def max_choices(self) -> int:
        return max((len(ex.choices) for ex in self.examples if isinstance(ex, ChoiceExample)), default=0)


def _length(ex: Example) -> int:
    if isinstance(ex, ChoiceExample):
        return len(ex.context) + max(len(c) for c in ex.choices)
    return len(ex.text)


class _ExampleList(Sequence):
    def __init__(self, examples: list[Example]):
        self.examples = sorted(examples, key=lambda ex: (-_length(ex), ex.idx))

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> Example:  # type: ignore[override]
        return self.examples[i]


def _collate(batch: list[Example]) -> list[Example]:
    return batch


class EvalDataModule(LightningDataModule):
    """Evaluation data for boosted scoring.

    Args:
        tasks: task names (``cblight.data.registry``), e.g. ``[copa, lambada]``.
        data_root: a directory holding one sub-directory per task (``<data_root>/<task>/``) with local files.
        data_dirs: per-task local directories (``{copa: /data/COPA}``); these win over ``data_root``.
        data_files: per-task, per-split files (``{lambada: {test: lambada_test.jsonl}}``); these win over both.
        tokenizer: tokenizer whose special tokens appear in some prompts (linked to the model by the CLI).
        selection: choose alpha* on the selection split; off reports only the report split's curve.
        selection_seed: seed of the training-split sample where the paper chooses alpha* on one.
        limit: keep only the first ``limit`` examples of each split (quick runs); the sampled selection split
            is then as large as the limited report split.
        batch_size: examples per step (each multiple-choice example is one row per choice).
        num_workers: dataloader workers.
    """

    def __init__(
        self,
        tasks: list[str] | None = None,
        data_root: str | None = None,
        data_dirs: dict[str, str] | None = None,
        data_files: dict[str, dict[str, str]] | None = None,
        tokenizer: str | None = None,
        selection: bool = True,
        selection_seed: int = 1234,
        limit: int | None = None,
        batch_size: int = 16,
        num_workers: int = 0,
    ):
        super().__init__()
        self.task_names = list(tasks) if tasks else ["copa"]
        if len(set(self.task_names)) != len(self.task_names):
            raise DataError(f"tasks lists a task twice: {self.task_names}")
        self.specs = [get_task(name) for name in self.task_names]  # unknown names fail here
        self.data_root = data_root
        self.data_dirs = dict(data_dirs or {})
        self.data_files = {k: dict(v) for k, v in (data_files or {}).items()}
        for name in list(self.data_dirs) + list(self.data_files):
            if name not in self.task_names:
                raise DataError(
                    f"data_dirs/data_files name task {name!r}, which is not in tasks {self.task_names}"
                )
        self.tokenizer = tokenizer
        self.selection = selection
        self.selection_seed = selection_seed
        if limit is not None and limit < 1:
            raise DataError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        if batch_size < 1:
            raise DataError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.splits: dict[str, dict[Role, TaskSplit]] = {}
        self._tokenizer: Any = None

    # -- loading -------------------------------------------------------------------------------------------
    def _render_context(self, split: str) -> RenderContext:
        if self.tokenizer is None:
            return RenderContext(split=split)
        if self._tokenizer is None:
            from cblight.models import load_tokenizer

            self._tokenizer = load_tokenizer(self.tokenizer)
        tok = self._tokenizer
        eos = tok.eos_token or tok.bos_token
        bos = tok.bos_token or tok.eos_token
        return RenderContext(split=split, eos_token=eos, bos_token=bos)

    def _local(self, spec: TaskSpec, split: str) -> dict[str, Any]:
        files = self.data_files.get(spec.name, {})
        if split in files:
            return {"data_file": files[split]}
        if spec.name in self.data_dirs:
            return {"data_dir": self.data_dirs[spec.name]}
        if self.data_root is not None:
            from pathlib import Path

            candidate = Path(self.data_root).expanduser() / spec.name
            if candidate.is_dir():
                return {"data_dir": str(candidate)}
        return {}

    def _render(
        self, spec: TaskSpec, split: str, sample_size: int | None = None
    ) -> tuple[list[Example], list[int] | None]:
        """Rendered examples of ``split``; with ``sample_size``, a fixed-seed sample of that many records
        (sorted indices returned too)."""
        records = load_split_records(spec.name, split, spec.source, **self._local(spec, split))
        if not records:
            raise DataError(f"{spec.name}: split {split!r} is empty")
        ctx = self._render_context(split)
        indices = None
        if sample_size is not None:
            size = min(sample_size, len(records))
            indices = sorted(random.Random(self.selection_seed).sample(range(len(records)), size))
        chosen = range(len(records)) if indices is None else indices
        return [spec.render(records[i], i, ctx) for i in chosen], indices

    def load_task(self, spec: TaskSpec) -> dict[Role, TaskSplit]:
        report, _ = self._render(spec, spec.report_split)
        if self.limit is not None:
            report = report[: self.limit]
        out: dict[Role, TaskSplit] = {"report": TaskSplit(spec, "report", spec.report_split, report)}
        if not (self.selection and spec.selection_split):
            return out
        split = spec.selection_split
        if spec.sample_selection:
            examples, indices = self._render(spec, split, sample_size=len(report))
            out["selection"] = TaskSplit(spec, "selection", split, examples, indices, self.selection_seed)
        else:
            examples, _ = self._render(spec, split)
            if self.limit is not None:
                examples = examples[: self.limit]
            out["selection"] = TaskSplit(spec, "selection", split, examples)
        return out

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.splits = {spec.name: self.load_task(spec) for spec in self.specs}

    # -- loaders -------------------------------------------------------------------------------------------
    def loader_splits(self, role: Role) -> list[TaskSplit]:
        """The task splits behind ``val_dataloader`` (selection) or ``test_dataloader`` (report), in order."""
        self.setup()
        return [self.splits[name][role] for name in self.task_names if role in self.splits[name]]

    def _loader(self, split: TaskSplit) -> DataLoader:
        return DataLoader(
            _ExampleList(split.examples),  # type: ignore[arg-type]
            batch_size=self.batch_size,
            shuffle=False,
            num_workers=self.num_workers,
            collate_fn=_collate,
        )

    def val_dataloader(self) -> list[DataLoader]:
        return [self._loader(s) for s in self.loader_splits("selection")]

    def test_dataloader(self) -> list[DataLoader]:
        return [self._loader(s) for s in self.loader_splits("report")]

    def predict_dataloader(self) -> list[DataLoader]:
        return self.test_dataloader()


__all__ = ["ChoiceExample", "EvalDataModule", "NextTokenExample", "TaskSplit"]
