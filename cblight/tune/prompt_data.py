"""Prompts for coherence tuning: any list of strings, a text or JSON-lines file, or BOS alone.

The paper samples its tuning sequences from the model itself (appendix "From coherence boosting to
coherence tuning"); a prompt in front of the samples (e.g. the first sentence of a WebText document, as in
Table 2's experiment) makes them longer than the short context ``k``, so that boosting has something to act
on. ``PromptDataModule`` serves batches of prompt *strings*; the LightningModule tokenises them with its own
tokenizer, so one data module works for every model.

A benchmark of ``cblight.data`` is a source too: ``task: webtext`` takes the prompts its task spec renders
(WebText: each document's first sentence, by the offline sentence splitter), from ``data_dir`` and
``split`` (default ``train``, so tuning prompts stay apart from the evaluation's test prompts).
Other sources subclass ``PromptDataModule`` and override ``load_prompts``.

Batches are a pure function of the batch number, the rank and the seed (``PromptStream``), and the data
module records how many batches training consumed in its ``state_dict``, so a run resumed from a
mid-run checkpoint sees exactly the prompts an uninterrupted run would have seen.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, IterableDataset

from cblight.data.sources import json_lines
from cblight.errors import CblightError
from cblight.option_types import NonNegativeInt, PositiveInt, check_arguments

__all__ = ["PromptDataError", "PromptDataModule", "PromptStream", "check_split", "read_prompts"]


class PromptDataError(CblightError):
    """A prompt source that is missing, unreadable or empty."""


def check_split(task: str, split: str) -> None:
    """Refuse a split the task does not have, naming its splits and the closest one, before the model loads.

    Args:
        task: a generation task of ``cblight.data`` (e.g. ``webtext``).
        split: the split asked for (``--data.split``).

    Raises:
        PromptDataError: the task has no such split.
    """
    import difflib

    from cblight.data.registry import get_task

    source = get_task(task).source
    known = list(dict.fromkeys([*(source.local.files if source.local else ()), *source.hub]))
    if split in known:
        return
    close = difflib.get_close_matches(str(split), known, n=1, cutoff=0.3)  # "valid": validation
    hint = f"; use --data.split {close[0]}" if close else ""
    raise PromptDataError(
        f"data.split {split!r} is not a split of task {task!r}: its splits are {', '.join(known)}{hint}"
    )


def read_prompts(path: str | Path, text_field: str = "text") -> list[str]:
    """Prompts from a file: ``.jsonl`` (one object per line, ``text_field`` holds the prompt; a bare JSON
    string per line also works), ``.json`` (a list of strings or of such objects) or plain text (one
    prompt per line). Blank prompts are dropped. ``PromptDataModule`` refuses a missing path when made.

    Args:
        path: the prompt file.
        text_field: the field of a JSON object that holds the prompt.

    Returns:
        The non-blank prompts, in file order.

    Raises:
        PromptDataError: the file is not UTF-8 or not valid JSON, or a record is no string or lacks
            ``text_field``.
    """
    p = Path(path).expanduser()
    suffix = p.suffix.lower()
    try:
        if suffix == ".jsonl":
            items: list[Any] = [value for _, value in json_lines(p)]
        else:
            raw = p.read_text(encoding="utf-8")
            if suffix == ".json":
                try:
                    items = json.loads(raw)
                except json.JSONDecodeError as err:
                    raise PromptDataError(f"{p} is not valid JSON ({err.msg})") from err
                if not isinstance(items, list):
                    raise PromptDataError(f"{p} must hold a JSON list of prompts")
            else:
                items = raw.splitlines()
    except UnicodeDecodeError as err:
        raise PromptDataError(f"prompts_file {str(path)!r} is not UTF-8 text ({err})") from err
    prompts = []
    for n, item in enumerate(items, 1):
        if isinstance(item, dict):
            if text_field not in item:
                raise PromptDataError(f"{p}: record {n} has no field {text_field!r} (set text_field)")
            item = item[text_field]
        if not isinstance(item, str):
            raise PromptDataError(f"{p}: record {n} is a {type(item).__name__}, not a string")
        if item.strip():
            prompts.append(item)
    return prompts


def _rng(*parts: int) -> np.random.Generator:
    return np.random.default_rng([int(x) for x in parts])


@dataclass
class PromptStream(IterableDataset):
    """An endless stream of prompt batches for one process.

    Batch ``i`` holds this rank's share of global batch ``i``: the global batches walk through a seeded
    permutation of the pool per epoch (every prompt once per epoch, ranks disjoint), and pools smaller than
    a global batch are tiled.

    Args:
        pool: the training prompts.
        batch_size: prompts per batch of this process.
        rank: this process's rank.
        world_size: the number of processes.
        seed: the seed of the permutations.
        start: the first batch number to yield (a resumed run's next batch).
    """

    pool: Sequence[str]
    batch_size: int
    rank: int = 0
    world_size: int = 1
    seed: int = 0
    start: int = 0

    def batch(self, i: int) -> dict[str, Any]:
        n, g = len(self.pool), self.batch_size * self.world_size
        if n < g:  # each batch tiles fresh permutations of a small pool
            rng = _rng(self.seed, 1, i)
            idx = np.concatenate([rng.permutation(n) for _ in range(-(-g // n))])[:g]
        else:
            epoch, j = divmod(i, n // g)
            idx = _rng(self.seed, 0, epoch).permutation(n)[j * g : (j + 1) * g]
        mine = idx[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
        return {"prompts": [self.pool[j] for j in mine], "index": i}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return map(self.batch, itertools.count(self.start))


class PromptDataModule(L.LightningDataModule):
    """Batches of prompt strings for coherence tuning.

    Exactly one source: ``prompts`` (a list of strings), ``prompts_file`` (see ``read_prompts``) or
    ``bos_only`` (every sample starts from the model's BOS/EOS token alone, the paper's unconditional
    sampling). ``batch_size`` is per process; the global batch is ``batch_size × processes``. ``val_size``
    prompts are held out (after a seeded shuffle) for a validation KL; with ``bos_only`` the validation
    set is ``val_size`` empty prompts. ``limit`` keeps only the first prompts of the source.

    Held-out human text for the validation perplexity (``val/tuning/ppl``): with a ``task`` source, the
    whole documents of the held-out prompts (e.g. WebText: first sentence and continuation); otherwise
    ``val_texts_file`` (any format ``read_prompts`` reads), cycled to the validation prompts' number.
    Validation batches carry them as ``texts`` beside their ``prompts``.

    Args:
        prompts: the prompts, a list of strings.
        prompts_file: a file of prompts (``read_prompts``).
        text_field: the field of a JSON record that holds the prompt (or text).
        bos_only: sample from the model's BOS/EOS token alone.
        task: a generation benchmark of ``cblight.data`` whose rendered prompts are the source (e.g.
            ``webtext``).
        data_dir: the task's local data directory (``None``: the task's default).
        split: the task's split the prompts come from.
        batch_size: prompts per training batch of each process.
        val_size: prompts held out for validation (0: no validation).
        val_batch_size: prompts per validation batch (``None``: ``batch_size``).
        limit: keep only the first this many prompts of the source.
        seed: the seed of the held-out split and of the training order.
        val_texts_file: held-out human text for the validation perplexity where the source has none.

    Raises:
        PromptDataError: not exactly one source, a missing file, a task that is no generation benchmark or
            lacks ``split``.
    """

    def __init__(
        self,
        prompts: list[str] | None = None,
        prompts_file: str | None = None,
        text_field: str = "text",
        bos_only: bool = False,
        task: str | None = None,
        data_dir: str | None = None,
        split: str = "train",
        batch_size: PositiveInt = 32,
        val_size: NonNegativeInt = 0,
        val_batch_size: PositiveInt | None = None,
        limit: PositiveInt | None = None,
        seed: int = 0,
        val_texts_file: str | None = None,
    ):
        check_arguments(PromptDataModule.__init__, locals(), PromptDataError)
        super().__init__()
        given = {"prompts": prompts, "prompts_file": prompts_file, "bos_only": bos_only or None, "task": task}
        sources = [name for name, value in given.items() if value is not None]
        if len(sources) != 1:
            raise PromptDataError(
                "give exactly one prompt source: prompts (a list), prompts_file (a path), task (a generation "
                "benchmark such as webtext) or bos_only: true"
                + (f"; got {', '.join(sources)}" if sources else "; got none")
            )
        for name, path in (("prompts_file", prompts_file), ("val_texts_file", val_texts_file)):
            if path is not None and not Path(path).expanduser().is_file():
                what = "is a directory, not a file" if Path(path).expanduser().is_dir() else "does not exist"
                raise PromptDataError(f"{name} {path!r} {what}")
        if task is not None:
            from cblight.data.registry import get_task

            spec = get_task(task)  # an unknown name fails here
            if spec.kind != "generation":
                raise PromptDataError(
                    f"task {task!r} is a {spec.kind} benchmark; prompts come from generation tasks"
                )
            check_split(task, split)
        self.task = task
        self.data_dir = data_dir
        self.split = split
        self.prompt_list = list(prompts) if prompts is not None else None
        self.prompts_file = prompts_file
        self.text_field = text_field
        self.bos_only = bos_only
        self.batch_size = batch_size
        self.val_size = val_size
        self.val_batch_size = val_batch_size or batch_size
        self.limit = limit
        self.seed = seed
        self.val_texts_file = val_texts_file
        self._split: tuple[list[str], list[str]] | None = None
        self._val_texts: list[str] = []
        self._documents: list[str] | None = None
        self._next_batch = 0  # training batches consumed so far (checkpointed)

    # -- the prompt pool -----------------------------------------------------------------------------
    def load_prompts(self) -> list[str]:
        """All prompts of the source, in source order (override for a dataset-specific source).

        Returns:
            The prompts (``[""]`` for ``bos_only``), blank ones dropped.
        """
        if self.bos_only:
            return [""]
        if self.prompt_list is not None:
            return [p for p in self.prompt_list if p.strip()]
        if self.task is None:
            return read_prompts(self.prompts_file, self.text_field)
        from cblight.data.registry import RenderContext, get_task
        from cblight.data.sources import load_split_records

        spec = get_task(self.task)
        records = load_split_records(spec.name, self.split, spec.source, data_dir=self.data_dir)
        ctx = RenderContext(split=self.split)
        examples = [spec.render(rec, i, ctx) for i, rec in enumerate(records)]
        # the whole document (prompt + human continuation): held-out human text for the perplexity
        self._documents = [ex.prompt + (getattr(ex, "human", None) or "") for ex in examples]
        return [ex.prompt for ex in examples]

    def _pools(self) -> tuple[list[str], list[str]]:
        if self._split is None:
            pool = self.load_prompts()[: self.limit]
            source = self._source_name()
            if not pool:
                raise PromptDataError(f"the prompt source ({source}) yields no prompts")
            if self.bos_only:
                self._split = (pool, [""] * self.val_size)
            else:
                if self.val_size >= len(pool):
                    raise PromptDataError(
                        f"val_size = {self.val_size} leaves no training prompts out of {len(pool)} from {source}"
                    )
                order = _rng(self.seed, 2).permutation(len(pool)) if self.val_size else np.arange(len(pool))
                val = [pool[i] for i in order[: self.val_size]]
                train = [pool[i] for i in sorted(order[self.val_size :])]
                self._split = (train, val)
                if self._documents is not None:
                    self._val_texts = [self._documents[i] for i in order[: self.val_size]]
            if self.val_texts_file is not None and self._split[1]:
                texts = read_prompts(self.val_texts_file, self.text_field)
                if not texts:
                    raise PromptDataError(f"val_texts_file {self.val_texts_file!r} holds no texts")
                self._val_texts = [texts[i % len(texts)] for i in range(len(self._split[1]))]
        return self._split

    def _source_name(self) -> str:
        if self.bos_only:
            return "bos_only"
        if self.task is not None:
            return f"task {self.task!r} split {self.split!r}"
        return "prompts" if self.prompt_list is not None else f"prompts_file {self.prompts_file!r}"

    def train_prompts(self) -> list[str]:
        return self._pools()[0]

    def check_batch_size(self) -> None:
        """Refuse a batch larger than the training prompts (``bos_only`` aside, whose one prompt serves any
        batch): every step would sample that many sequences from repeats of the same prompts, and a typo such
        as ``batch_size 1000000`` would fill memory before the first step. Known once the prompts are read,
        before the model loads.

        Raises:
            PromptDataError: ``batch_size`` exceeds the training prompts.
        """
        train = self.train_prompts()
        if self.bos_only or self.batch_size <= len(train):
            return
        raise PromptDataError(
            f"data.batch_size = {self.batch_size} is larger than the {len(train)} training prompts of "
            f"{self._source_name()}: each step would sample {self.batch_size} sequences from repeats of them; "
            f"set --data.batch_size {len(train)} or less, or give more prompts"
        )

    def val_prompts(self) -> list[str]:
        return self._pools()[1]

    def val_texts(self) -> list[str]:
        """Held-out human texts for the validation perplexity.

        Returns:
            One text per validation prompt, in the same order; empty when there are none.
        """
        self._pools()
        return self._val_texts

    # -- Lightning ----------------------------------------------------------------------------------
    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        stream = PromptStream(self.train_prompts(), self.batch_size, rank, world, self.seed, self._next_batch)
        return DataLoader(stream, batch_size=None)

    def val_dataloader(self) -> list[Any]:
        val = self.val_prompts()
        if not val:
            return []
        rank, world = self._rank_world()
        texts = self.val_texts()
        # every rank gets the same number of batches (collectives run per batch): the last ones wrap around
        share = -(-len(val) // world)
        mine = [(rank + world * j) % len(val) for j in range(share)]
        size = self.val_batch_size
        batches = [
            {
                "prompts": [val[j] for j in mine[i : i + size]],
                "texts": [texts[j] for j in mine[i : i + size]] if texts else [],
                "index": i // size,
            }
            for i in range(0, len(mine), size)
        ]
        return DataLoader(batches, batch_size=None)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Runs right before the training step, after Lightning's prefetch: the count is what training used.
        if self.trainer.training:
            self._next_batch = int(batch["index"]) + 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"next_batch": self._next_batch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._next_batch = int(state_dict.get("next_batch", 0))
