"""The evaluation data module: every requested task's report split and alpha-selection split.

Lightning's validation loop runs the *selection* splits (alpha* and k* are chosen there) and its test loop
the *report* splits (docs/design.md, "Selection protocol"); one dataloader per task, in the order of ``tasks``. Batches are lists of
rendered examples, longest first so that padding stays small.
"""

from __future__ import annotations

import functools
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch.distributed as dist
from lightning.pytorch import LightningDataModule
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader

from cblight.data.examples import ChoiceExample, DataError, Example, GenerationExample, NextTokenExample
from cblight.data.registry import RenderContext, TaskSpec, get_task
from cblight.data.sources import MissingDataError, load_split_records
from cblight.option_types import NonNegativeInt, PositiveInt, check_arguments

Role = Literal["report", "selection"]
log = logging.getLogger(__name__)


@dataclass
class TaskSplit:
    """The rendered examples of one task's report or selection split (``EvalDataModule.loader_splits``).

    Args:
        task: the task's spec.
        role: ``report`` (the split whose numbers are reported) or ``selection`` (where alpha* is chosen).
        split: the split's name (``validation``).
        examples: the rendered examples, filters and ``limit`` applied.
        sampled_indices: for a sampled selection split, the indices drawn from the full split.
        seed: the seed that drew the sample (``selection_seed``), when there is one.
        file: the ``data_files`` entry the split was read from, when one was given.
    """

    task: TaskSpec
    role: Role
    split: str
    examples: list[Example]
    sampled_indices: list[int] | None = None
    seed: int | None = None  # selection_seed, which draws the sample (when there is one)
    file: str | None = None  # the data_files entry the split was read from, when one was given

    @functools.cached_property
    def by_idx(self) -> dict[int, Example]:
        return {ex.idx: ex for ex in self.examples}

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def description(self) -> str:
        where = f"{self.split} ({self.file})" if self.file else self.split
        sample = "" if self.sampled_indices is None else f" sample of {len(self.examples)} (seed {self.seed})"
        return where + sample

    @property
    def max_choices(self) -> int:
        return max((len(ex.choices) for ex in self.examples if isinstance(ex, ChoiceExample)), default=0)


def _length(ex: Example) -> int:
    """The characters an example puts through the model: batches are formed longest first."""
    if isinstance(ex, ChoiceExample):
        return len(ex.context) + max(len(c) for c in ex.choices)
    return len(ex.prompt) if isinstance(ex, GenerationExample) else len(ex.text)


class EvalDataModule(LightningDataModule):
    """Evaluation data for boosted scoring.

    Args:
        tasks: task names (``cblight.data.registry``; ``python -m cblight.data list``), e.g. ``[copa, lambada]``;
            the reference code's names are accepted too (``agn``).
        data_root: a directory holding one sub-directory per task (``<data_root>/<task>/``, or under one of
            the task's other names, e.g. the reference's ``data/agn``) with local files. A task without
            its folder there is refused (naming the folders looked for) unless ``hub_fallback``.
        data_dirs: per-task local directories (``{copa: /data/COPA}``); these win over ``data_root``.
        data_files: per-task, per-split files (``{lambada: {test: lambada_test.jsonl}}``); these win over both.
        hub_fallback: with ``data_root``, load a task that has no folder there from the Hub (one line says
            so) instead of refusing it. Off: a root you give is used or refused, never quietly replaced.
        tokenizer: tokenizer whose special tokens appear in some prompts (linked to the model by the CLI).
        selection: choose alpha* on the selection split; off reports only the report split's curve.
        selection_seed: seed of the training-split sample where the paper chooses alpha* on one.
        limit: keep only the first ``limit`` examples of each split (quick runs); the sampled selection split
            is then as large as the limited report split.
        max_k: the largest short-context length of the grid, for tasks that filter on it (LAMA keeps
            prompts longer than it); ``evaluate.py`` links it to ``max(model.ks)``.
        batch_size: examples per step (each multiple-choice example is one row per choice).
        num_workers: dataloader workers.

    Examples:
        Two CommonsenseQA questions from the sample shipped with cblight:

        >>> from pathlib import Path
        >>> import cblight
        >>> root = Path(cblight.__file__).parent / "assets" / "realdata"
        >>> data = EvalDataModule(tasks=["csqa"], data_root=str(root), limit=2, selection=False)
        >>> question = data.examples("csqa")[0]
        >>> question.choices, question.label
        ((' bank', ' library', ' department store', ' mall', ' new york'), 0)
        >>> [(split.name, split.role, len(split.examples)) for split in data.loader_splits("report")]
        [('csqa', 'report', 2)]
    """

    #: How a refusal for a task without its folder under ``data_root`` spells the two fixes: naming the
    #: task's folder (``{task}``, ``{folder}``) and the Hub fallback; ``cblight evaluate``'s options here.
    fixes = ("--data.data_dirs '{{{task}: {folder}}}'", "--data.hub_fallback true")

    def __init__(
        self,
        tasks: list[str] | None = None,
        data_root: str | None = None,
        data_dirs: dict[str, str] | None = None,
        data_files: dict[str, dict[str, str]] | None = None,
        hub_fallback: bool = False,
        tokenizer: str | None = None,
        selection: bool = True,
        selection_seed: int = 1234,
        limit: PositiveInt | None = None,
        max_k: PositiveInt | None = None,
        batch_size: PositiveInt = 16,
        num_workers: NonNegativeInt = 0,
    ):
        super().__init__()
        check_arguments(type(self).__init__, locals(), DataError)
        if tasks is not None and not tasks:
            raise DataError("tasks is empty: name at least one task, e.g. --data.tasks '[copa]'")
        self.specs = [get_task(name) for name in (tasks or ["copa"])]  # unknown names fail here
        self.task_names = [spec.name for spec in self.specs]
        if len(set(self.task_names)) != len(self.task_names):
            raise DataError(f"tasks lists a task twice: {list(tasks or [])}")
        self.data_root = data_root
        self.data_dirs = {self._own_task(k): v for k, v in (data_dirs or {}).items()}
        self.data_files = {self._own_task(k): dict(v) for k, v in (data_files or {}).items()}
        for spec in self.specs:  # an unknown split in data_files would quietly read the Hub copy instead
            named = (spec.report_split, spec.selection_split, *spec.source.hub, *spec.source.local.files)
            known = [n for n in dict.fromkeys(named) if n]
            unknown = [split for split in self.data_files.get(spec.name, {}) if split not in known]
            if unknown:
                raise DataError(
                    f"data_files.{spec.name}: unknown split {unknown[0]!r}; {spec.name} reads {known} "
                    f"(report: {spec.report_split!r}, alpha* chosen on: {spec.selection_split!r})"
                )
        self.max_k = max_k
        self.tokenizer = tokenizer
        self.selection = selection
        self.selection_seed = selection_seed
        self.limit = limit
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.splits: dict[str, dict[Role, TaskSplit]] = {}
        self.hub_fallback = hub_fallback

    def _own_task(self, name: str) -> str:
        """The canonical name of a task named in data_dirs/data_files, which must be one of ``tasks``."""
        for spec in self.specs:
            if name in (spec.name, *spec.aliases):
                return spec.name
        raise DataError(f"data_dirs/data_files name task {name!r}, which is not in tasks {self.task_names}")

    # -- loading -------------------------------------------------------------------------------------------
    @functools.cached_property
    def loaded_tokenizer(self) -> Any:
        """``tokenizer`` loaded on first use (``None`` without one)."""
        from cblight.models import load_tokenizer

        return None if self.tokenizer is None else load_tokenizer(self.tokenizer)

    @functools.cached_property
    def roots(self) -> dict[str, str | Path | None]:
        """Each task's folder (``None``: read from the Hub), checked before any data is read: every
        ``data_dirs`` entry exists, and a ``data_root`` is used or refused, never quietly replaced by the
        Hub (``hub_fallback`` asks for that)."""
        for name, folder in self.data_dirs.items():
            if not Path(folder).expanduser().is_dir():
                raise DataError(f"data_dirs.{name}: {folder} is not a directory")
        return {s.name: self.data_dirs.get(s.name) or self._task_root(s) for s in self.specs}

    def _task_root(self, spec: TaskSpec) -> Path | None:
        """The task's folder under ``data_root`` (``None``: no root, or the Hub by ``hub_fallback``); a task
        that needs the root and has no folder there is refused with the names looked for."""
        if self.data_root is None:
            return None
        root = Path(self.data_root).expanduser().absolute()
        tried = [root / name for name in (spec.name, *spec.aliases)]
        found = next((path for path in tried if path.is_dir()), None)
        needed = {spec.report_split, spec.selection_split if self.selection else None} - {None}
        if found is not None or needed <= self.data_files.get(spec.name, {}).keys():
            return found
        looked = " or ".join(f"{path.name}/" for path in tried)
        near: list[Path] = []  # a folder whose name holds the task's, to suggest
        if not root.is_dir():
            state = "is a file" if root.exists() else "does not exist"
            why = f"data_root {root} {state} (looked for {', '.join(f'{path}/' for path in tried)})"
        else:
            folders = [p for p in root.iterdir() if p.is_dir()]
            near = [p for p in folders if spec.name in p.name.lower()]
            held = sorted(f"{p.name}/" for p in folders)
            listing = ", ".join(held[:8]) + (", ..." if len(held) > 8 else "") or "no folders"
            why = f"data_root {root} has no folder {looked} (it holds {listing})"
        hubs = dict.fromkeys(f"{h.path} {h.name}" if h.name else h.path for h in spec.source.hub.values())
        hub = "" if spec.source.hub_refusal else ", ".join(hubs)
        if hub and self.hub_fallback:
            log.warning(
                "%s: %s; loading it from the Hub (%s), as --data.hub_fallback asks", spec.name, why, hub
            )
            return None
        folder = str(near[0]) if len(near) == 1 else "DIR"
        fixes = [f"name the folder {spec.name}/" if root.is_dir() else "correct data_root"]
        fixes.append("pass " + self.fixes[0].format(task=spec.name, folder=folder))
        if hub:
            fixes.append(f"{self.fixes[1]} to load {spec.name} from the Hub ({hub})")
        raise DataError(f"{spec.name}: {why}: {', '.join(fixes[:-1])} or {fixes[-1]}")

    def _load_split(
        self, spec: TaskSpec, split: str, role: Role = "report", sample_size: int | None = None
    ) -> TaskSplit:
        """One split: its records rendered, those the task keeps (``keep``), with ``sample_size`` a fixed-seed
        sample of that many of them (sorted indices kept), cut to ``limit``; it names the ``data_files``
        entry it was read from, if any."""
        given = self.data_files.get(spec.name, {}).get(split)  # a data_files entry wins over the folder
        root = self.roots[spec.name]
        records = load_split_records(spec.name, split, spec.source, data_dir=root, data_file=given)
        if not records:
            raise DataError(f"{spec.name}: split {split!r} is empty")
        tok = self.loaded_tokenizer
        ctx = RenderContext(split)
        if tok is not None:
            ctx = RenderContext(split, tok.eos_token or tok.bos_token, tok.bos_token or tok.eos_token)
        if spec.keep is None:
            pool: list[int] = list(range(len(records)))
            rendered: dict[int, Example] = {}
        else:  # filter first, so that a sample is drawn from the examples the task keeps
            rendered = {i: spec.render(r, i, ctx) for i, r in enumerate(records)}
            pool = [i for i, ex in rendered.items() if spec.keep(ex, tok, self.max_k)]
            if not pool:
                raise DataError(f"{spec.name}: no example of split {split!r} passes the task's filter")
        indices = None
        if sample_size is not None:
            pool = indices = sorted(
                random.Random(self.selection_seed).sample(pool, min(sample_size, len(pool)))
            )
        examples = [rendered[i] if i in rendered else spec.render(records[i], i, ctx) for i in pool]
        file = Path(given).name if given else None
        return TaskSplit(spec, role, split, examples[: self.limit], indices, self.selection_seed, file)

    def examples(self, task: str, split: str | None = None) -> list[Example]:
        """The rendered examples of one split of a task, filters applied.

        Args:
            task: the task's name.
            split: the split (default: the task's report split).

        Returns:
            The examples, at most ``limit``.
        """
        spec = get_task(task)
        return self._load_split(spec, split or spec.report_split).examples

    def load_task(self, spec: TaskSpec) -> dict[Role, TaskSplit]:
        out = {"report": self._load_split(spec, spec.report_split)}
        split = spec.selection_split
        if not (self.selection and split):
            return out
        # a sampled selection split is as large as the (limited) report split, so the limit holds for it too
        size = len(out["report"].examples) if spec.sample_selection else None
        try:
            out["selection"] = self._load_split(spec, split, "selection", size)
        except MissingDataError as err:
            raise MissingDataError(
                f"{err} alpha* is chosen on {spec.name}'s {split!r} split: add its file, or pass "
                "--data.selection false to report the whole alpha curve without choosing alpha*"
            ) from None
        return out

    def setup(self, stage: str | None = None) -> None:
        if not self.splits:  # every task's folder is checked as the first split is located (roots)
            self.splits = {spec.name: self.load_task(spec) for spec in self.specs}

    # -- loaders -------------------------------------------------------------------------------------------
    def loader_splits(self, role: Role) -> list[TaskSplit]:
        """The task splits behind ``val_dataloader`` (selection) or ``test_dataloader`` (report), in order.

        Args:
            role: ``selection`` or ``report``.

        Returns:
            One ``TaskSplit`` per task that has a split of that role.
        """
        self.setup()
        return [self.splits[name][role] for name in self.task_names if role in self.splits[name]]

    def _loader(self, split: TaskSplit) -> DataLoader:
        dataset = sorted(split.examples, key=lambda ex: (-_length(ex), ex.idx))
        # generation metrics stream per document: a padded DistributedSampler would score repeats twice
        unrepeated = split.task.kind == "generation" and dist.is_available() and dist.is_initialized()
        sampler = UnrepeatedDistributedSampler(dataset, shuffle=False) if unrepeated else None
        return DataLoader(
            dataset, self.batch_size, sampler=sampler, num_workers=self.num_workers, collate_fn=list
        )

    def val_dataloader(self) -> list[DataLoader]:
        return [self._loader(s) for s in self.loader_splits("selection")]

    def test_dataloader(self) -> list[DataLoader]:
        return [self._loader(s) for s in self.loader_splits("report")]


__all__ = ["ChoiceExample", "EvalDataModule", "NextTokenExample", "TaskSplit"]
