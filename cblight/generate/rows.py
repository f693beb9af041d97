"""Decoding rows of the generation experiments (paper Tables 2, 3 and the summarisation table; Figure 3's
(k, alpha) grid) and which table a task fills.

A ``Decoding`` is one row: a name, a ``Boosting`` (what to mix) and a ``Sampling`` (how transformers'
``generate`` draws after mixing), both checked when they are made, before any model is loaded. Each
decoding of a prompt gives one cache record (``generation_record``), seeded by ``decoding_seed``, and its
table's metric suite (``new_suite``) scores those records.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from torch import nn

from cblight.cache import digest
from cblight.data.datamodule import TaskSplit
from cblight.data.examples import DataError, GenerationExample
from cblight.data.sentences import first_sentences
from cblight.errors import ConfigError
from cblight.metrics.coherence import generated_token_log_probs
from cblight.metrics.dialog_meteor import MeteorRoute
from cblight.metrics.tables import DialogSuite, SummarySuite, TextSuite
from cblight.options import Boosting, Mode, Sampling
from cblight.scoring import Encoder

Table = Literal["text", "dialog", "summary"]
_AUTO_MODE: dict[str, Mode] = {"text": "last_k", "dialog": "response", "summary": "marker"}
DEFAULT_MAX_NEW_TOKENS = 64  # tasks whose paper setting gives none (DSTC7 responses end at EOS well before)
GridMode = Literal["auto", "last_k", "response", "marker"]


@dataclass(frozen=True)
class Decoding:
    """One decoding method: a row of Table 2, 3 or the summarisation table.

    Args:
        name: the row's name in the table (and, made file-safe, its cache folder and generations file).
        boosting: what to mix (``cblight.options.Boosting``; mode ``auto`` is the task's own short context:
            ``last_k`` for text, ``response`` for dialog, ``marker`` for summaries); unset (or
            ``alpha = 0``): the base model.
        sampling: how to draw (``cblight.options.Sampling``), after mixing. Unset values decode greedily
            without beams; with ``do_sample`` an unset ``top_k`` means no top-k cut (not transformers'
            default of 50), as the paper's pure sampling and nucleus rows.
    """

    name: str = "greedy"
    boosting: Boosting | None = None
    sampling: Sampling = field(default_factory=Sampling)

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", self.name).strip("_") or "decoding"

    def boosting_for(self, table: Table) -> Boosting | None:
        """The boosting of this row on a task filling ``table`` (``None``: plain decoding)."""
        if self.boosting is None or self.boosting.is_plain:
            return None
        return self.boosting.with_mode(_AUTO_MODE[table])

    def generate_sampling(self, seed: int) -> Sampling:
        """The sampling ``generate`` runs with: greedy and one beam unless set; ``top_k`` 0 (no cut),
        ``top_p`` and ``temperature`` only when sampling."""
        s = self.sampling
        if not s.do_sample:
            return Sampling(do_sample=False, num_beams=s.num_beams or 1, seed=seed)
        top_k = 0 if s.top_k is None else s.top_k
        return Sampling(True, s.temperature, s.top_p, top_k, s.num_beams or 1, seed)

    def describe(self) -> dict[str, Any]:
        """The row's settings for ``results.json``, flat: name, mode (``plain`` without boosting), k, alpha
        and the sampling options."""
        b = self.boosting or Boosting()
        return {
            "name": self.name,
            "mode": b.mode if self.boosting is not None else "plain",
            "k": b.k,
            "alpha": b.alpha,
            **({"adaptive": b.adaptive} if b.adaptive is not None else {}),
            **{k: v for k, v in asdict(self.sampling).items() if k != "seed"},
        }

    def signature(self) -> dict[str, Any]:
        """What the cache of this row's generations is keyed by: its settings under its file-safe name
        (``adaptive`` only when set, so caches written before the option existed stay valid)."""
        sig = asdict(replace(self, name=self.slug))
        if sig["boosting"] is not None and sig["boosting"].get("adaptive") is None:
            sig["boosting"].pop("adaptive", None)
        return sig


@dataclass(frozen=True)
class DecodingGrid:
    """Boosted decodings over a (k, alpha) grid, e.g. Table 2 / Figure 3: k in {8, 16, 32, 64} x alpha in
    {-0.4, -0.2, -0.1, -0.05, -0.025} with top-p 0.95. For the dialog and summary modes ``k`` plays no part:
    leave ``ks`` empty.

    Args:
        alphas: the boosting coefficients.
        ks: the windows of ``last_k`` (empty for the other modes).
        mode: the short context (``auto``: the task's own).
        sampling: how every row draws (``cblight.options.Sampling``).
    """

    alphas: tuple[float, ...] = (-0.4, -0.2, -0.1, -0.05, -0.025)
    ks: tuple[int, ...] = (8, 16, 32, 64)
    mode: GridMode = "auto"
    sampling: Sampling = field(default_factory=Sampling)

    def decodings(self) -> list[Decoding]:
        out = []
        for k in self.ks or (None,):
            for alpha in self.alphas:
                name = f"boost k={k} alpha={alpha:g}" if k is not None else f"boost alpha={alpha:g}"
                boosting = Boosting(mode=self.mode, k=k if k is not None else 32, alpha=float(alpha))
                out.append(Decoding(name=name, boosting=boosting, sampling=self.sampling))
        return out


@dataclass
class GenerationTask:
    """One task of a generation run: its split, the table it fills and its decodings."""

    split: TaskSplit
    table: Table
    max_new_tokens: int
    decodings: list[Decoding] = field(default_factory=list)


def table_of(split: TaskSplit) -> Table:
    """The table a generation task fills: summaries, dialog (examples with turns) or text (WebText)."""
    spec = split.task
    if spec.kind != "generation":
        raise DataError(f"{spec.name} is a {spec.kind} task; evaluate it with configs for BoostedEvaluator")
    if spec.output_sentences:
        return "summary"
    if any(isinstance(ex, GenerationExample) and ex.turns for ex in split.examples):
        return "dialog"
    return "text"


def decoding_seed(seed: int, decoding: Decoding, ids: Sequence[int]) -> int:
    """The seed of one generate call: from the run's seed, the decoding and the example ids, so ranks differ
    under DDP and a rerun with the same data batches draws the same samples."""
    key = f"{seed}|{decoding.slug}|{','.join(map(str, ids))}"
    return zlib.crc32(key.encode("utf-8"))


RECORD_FIELDS = ("id", "input", "prompt", "context", "tokens", "text")


def generation_record(
    task: GenerationTask,
    ex: GenerationExample,
    prompt: list[int],
    tokens: list[int],
    text: str,
    alphas: list[float] | None = None,
) -> dict[str, Any]:
    """The cache record of one generation: what the metrics and ``generations/*.jsonl`` need; with an
    adaptive rule, the alpha of each generated token (docs/adaptive.md)."""
    record: dict[str, Any] = {
        "id": ex.idx,
        "input": digest(ex.input_key()),
        "prompt": ex.prompt,
        "context": list(prompt),
        "tokens": list(tokens),
        "text": text,
    }
    if alphas is not None:
        record["alphas"] = [round(a, 6) for a in alphas]
    if task.table == "summary":
        record["summary"] = first_sentences(text, task.split.task.output_sentences)
    return record


def new_suite(
    table: Table, eos_token_id: int | None, self_bleu_samples: int | None, meteor: MeteorRoute = "auto"
) -> nn.Module:
    """The metric suite of a table: Table 2's (text), Table 3's (dialog; ``meteor`` picks its METEOR) or
    ROUGE (summaries)."""
    if table == "text":
        return TextSuite(eos_token_id=eos_token_id, self_bleu_samples=self_bleu_samples)
    if table == "dialog":
        return DialogSuite(meteor=meteor)
    return SummarySuite()


def resolve_decodings(
    decodings: Sequence[Decoding | dict[str, Any]] | None, grid: DecodingGrid | dict[str, Any] | None
) -> tuple[list[Decoding], DecodingGrid | None]:
    """The rows of a run: ``decodings`` (default: greedy) then the grid's, names distinct. Hparams
    round-trips (checkpoints, comparisons) hand the dataclasses back as dicts: both are accepted."""
    rows = [_decoding(d) for d in decodings or [Decoding()]]
    if isinstance(grid, dict):
        grid = DecodingGrid(
            **{
                k: Sampling(**v)
                if k == "sampling" and isinstance(v, dict)
                else tuple(v)
                if isinstance(v, list)
                else v
                for k, v in grid.items()
            }
        )
    if grid is not None:
        if not grid.alphas:
            raise ConfigError("grid.alphas: the alpha grid is empty")
        if any(k < 1 for k in grid.ks):
            raise ConfigError(f"grid.ks: every k must be >= 1, got {list(grid.ks)}")
        rows += grid.decodings()
    slugs = [d.slug for d in rows]
    if len(set(slugs)) != len(slugs):
        raise ConfigError(f"decodings need distinct names; got {[d.name for d in rows]}")
    return rows, grid


def _decoding(d: Decoding | dict[str, Any]) -> Decoding:
    if isinstance(d, Decoding):
        return d
    d = dict(d)
    if isinstance(d.get("boosting"), dict):
        d["boosting"] = Boosting(**d["boosting"])
    if isinstance(d.get("sampling"), dict):
        d["sampling"] = Sampling(**d["sampling"])
    return Decoding(**d)


def human_records(
    task: GenerationTask, examples: Sequence[GenerationExample], prompts: Sequence[list[int]], tokenizer: Any
) -> list[dict[str, Any]]:
    """The "Human" row's records: each held-out continuation, cut to the generation length."""
    enc = Encoder(tokenizer)
    records = []
    for ex, prompt in zip(examples, prompts):
        tokens = enc.body(ex.human or "")[: task.max_new_tokens]
        records.append(generation_record(task, ex, prompt, tokens, tokenizer.decode(tokens)))
    return records


def add_token_log_probs(
    records: Sequence[dict[str, Any]], model: Any, tokenizer: Any, short_window: int, batch_size: int
) -> None:
    """Per-token ``log p_full`` / ``log p_short`` of each record's tokens under ``model`` (Table 2's
    perplexity, LTF and delta), rounded to 6 decimals for the cache; records that have them are skipped."""
    todo = [r for r in records if r["tokens"] and "lp_full" not in r]
    if not todo:
        return
    scored = generated_token_log_probs(
        model,
        [r["context"] for r in todo],
        [r["tokens"] for r in todo],
        k=short_window,
        prefix=Encoder(tokenizer).prefix,
        batch_size=batch_size,
        pad_id=int(tokenizer.pad_token_id or 0),
    )
    for r, (full, short) in zip(todo, scored):
        r["lp_full"] = [round(x, 6) for x in full.tolist()]
        r["lp_short"] = [round(x, 6) for x in short.tolist()]
