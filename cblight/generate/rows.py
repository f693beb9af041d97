"""The generation tables (paper Tables 2, 3 and the summarisation table): their rows, Figure 3's (k, alpha) grid
of boosted rows, and the kinds of table.

A ``Decoding`` is one row: a name, a ``Boosting`` (what to mix) and a ``Sampling`` (how transformers'
``generate`` draws after mixing), both checked when they are made, so a bad row is refused before any model
loads. ``resolve_decodings`` turns the options of a run into its rows.

A ``TableKind`` (``TEXT``, ``DIALOG``, ``SUMMARY``; ``kind_of`` picks a task's) declares, as data, what
differs between the tables while the generation evaluator runs the same loop for all, as evaluate's task
kinds do (``cblight.evaluate.task_scoring``):

* ``mode``: the short context of a row whose boosting mode is ``auto`` (``Decoding.boosting_for``): the last
  ``k`` tokens for text, the turn separator plus the response for dialog, `` TL;DR:`` plus the summary for
  summaries (docs/design.md, "Mathematics");
* ``new_suite``: the metric suite of each row (``cblight.metrics.tables``);
* ``record_extras``: what a generated record carries beyond the generation (a summary's first sentences);
* ``to_score``: the records that need their tokens' log-probabilities under the base LM (Table 2's
  perplexity, LTF and delta; no other table reads them);
* ``update``: how a batch's records update a row's suite;
* ``titles``: the printed column headers (Table 3's N-2, B-4, ...; other tables print the column names).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from operator import itemgetter
from typing import Any, Literal

import torch
from torch import nn

from cblight.boosting import too_large_alpha
from cblight.data.datamodule import TaskSplit
from cblight.data.examples import GenerationExample
from cblight.data.sentences import first_sentences
from cblight.errors import ConfigError
from cblight.metrics.dialog_meteor import MeteorRoute
from cblight.metrics.tables import DIALOG_TITLES, DialogSuite, SummarySuite, TextSuite
from cblight.option_types import FiniteFloat, NotEmptyStr, PositiveInt, check_fields
from cblight.options import Boosting, Mode, Sampling


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

    name: NotEmptyStr = "greedy"
    boosting: Boosting | None = None
    sampling: Sampling = field(default_factory=Sampling)

    def __post_init__(self) -> None:
        check_fields(self, ConfigError)

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", self.name).strip("_") or "decoding"

    def boosting_for(self, kind: TableKind) -> Boosting | None:
        """The boosting of this row on a table of ``kind``, whose short context replaces ``auto``; ``None``:
        plain decoding.

        :meta private:
        """
        if self.boosting is None or self.boosting.is_plain:
            return None
        return self.boosting.with_mode(kind.mode)

    def generate_sampling(self, seed: int) -> Sampling:
        """The sampling ``generate`` runs with: greedy and one beam unless set; ``top_k`` 0 (no cut),
        ``top_p`` and ``temperature`` only when sampling.

        :meta private:
        """
        s = self.sampling
        if not s.do_sample:
            return Sampling(do_sample=False, num_beams=s.num_beams or 1, seed=seed)
        return replace(s, top_k=0 if s.top_k is None else s.top_k, num_beams=s.num_beams or 1, seed=seed)

    def describe(self) -> dict[str, Any]:
        """The row's settings for ``results.json``, flat: name, mode (``plain`` without boosting), k, alpha
        and the sampling options.

        :meta private:
        """
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
        (``adaptive`` only when set, so caches written before the option existed stay valid).

        :meta private:
        """
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

    Examples:
        >>> grid = DecodingGrid(alphas=(-0.4, -0.2), ks=(8, 16), mode="last_k")
        >>> [row.name for row in grid.decodings()]
        ['boost k=8 alpha=-0.4', 'boost k=8 alpha=-0.2', 'boost k=16 alpha=-0.4', 'boost k=16 alpha=-0.2']
    """

    alphas: tuple[FiniteFloat, ...] = (-0.4, -0.2, -0.1, -0.05, -0.025)
    ks: tuple[PositiveInt, ...] = (8, 16, 32, 64)
    mode: Literal["auto", "last_k", "response", "marker"] = "auto"
    sampling: Sampling = field(default_factory=Sampling)

    def __post_init__(self) -> None:
        check_fields(self, ConfigError)
        if not self.alphas:
            raise ConfigError("grid.alphas: the alpha grid is empty")
        if too_large := too_large_alpha(self.alphas):
            raise ConfigError(f"grid.alphas: {too_large}")

    def decodings(self) -> list[Decoding]:
        """The grid's rows, k by k, each alpha in order.

        Returns:
            One ``Decoding`` per (k, alpha), named ``boost k=<k> alpha=<alpha>`` (without ``ks``,
            ``boost alpha=<alpha>``).
        """
        out = []
        for k in self.ks or (None,):
            for alpha in self.alphas:
                name = f"boost k={k} alpha={alpha:g}" if k is not None else f"boost alpha={alpha:g}"
                boosting = Boosting(mode=self.mode, k=k if k is not None else 32, alpha=float(alpha))
                out.append(Decoding(name=name, boosting=boosting, sampling=self.sampling))
        return out


def resolve_decodings(
    decodings: Sequence[Decoding | dict[str, Any]] | None, grid: DecodingGrid | dict[str, Any] | None
) -> tuple[list[Decoding], DecodingGrid | None]:
    """The rows of a run: ``decodings`` (unset: greedy) then the grid's, names distinct; no row at all is
    refused. Hparams round-trips (checkpoints, comparisons) hand the dataclasses back as dicts: both are
    accepted."""
    if decodings is not None and not decodings and grid is None:
        raise ConfigError(
            "model.decodings is empty and model.grid is null: no row to generate; name a decoding "
            "(e.g. --model.decodings '[{name: greedy}]') or a grid"
        )
    rows = [_from_dict(Decoding, d) for d in ([Decoding()] if decodings is None else decodings)]
    grid = _from_dict(DecodingGrid, grid)
    if grid is not None:
        rows += grid.decodings()
    slugs = [d.slug for d in rows]
    if len(set(slugs)) != len(slugs):
        raise ConfigError(f"decodings need distinct names; got {[d.name for d in rows]}")
    return rows, grid


def _from_dict(cls: type, value: Any) -> Any:
    """``value`` as a ``cls`` when it comes as a dict (its nested options and lists too)."""
    if not isinstance(value, dict):
        return value
    value = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    for key, nested in (("boosting", Boosting), ("sampling", Sampling)):
        if isinstance(value.get(key), dict):
            value[key] = nested(**value[key])
    return cls(**value)


#: The name of a kind, as ``results.json`` gives each task's ``table``.
TableName = Literal["text", "dialog", "summary"]

Record = dict[str, Any]


@dataclass(frozen=True)
class TableKind:
    """One kind of generation table (see the module docstring): what differs between the tables, as data.

    Args:
        name: the kind's name, ``results.json``'s ``table``.
        mode: the short context of a row whose boosting mode is ``auto``.
        suite: the metric suite of a row (``cblight.metrics.tables``).
        suite_options: the options of ``new_suite`` the suite takes.
        hypothesis: what of a record a reference-based suite scores; ``None``: Table 2's suite, which scores
            the generated tokens and their ``log p_full`` / ``log p_short`` under the base LM.
        sentences: a record keeps the first ``output_sentences`` of its text (the task spec's) as ``summary``.
        titles: the printed column headers (default: the column names).
    """

    name: TableName
    mode: Mode
    suite: Callable[..., nn.Module]
    suite_options: tuple[str, ...] = ()
    hypothesis: Callable[[Record], str] | None = None
    sentences: bool = False
    titles: Mapping[str, str] = field(default_factory=dict)

    def new_suite(
        self, *, eos_token_id: int | None, self_bleu_samples: int | None, meteor: MeteorRoute
    ) -> nn.Module:
        """A fresh metric suite (``cblight.metrics.tables``) for one row of the table.

        Args:
            eos_token_id: the tokenizer's EOS, dropped from a generation's end before Table 2's repetition
                test.
            self_bleu_samples: hypotheses sampled for Table 2's self-BLEU (``None``: all).
            meteor: Table 3's METEOR route (``cblight.metrics.dialog_meteor``).
        """
        options = {"eos_token_id": eos_token_id, "self_bleu_samples": self_bleu_samples, "meteor": meteor}
        return self.suite(**{name: options[name] for name in self.suite_options})

    def record_extras(self, text: str, split: TaskSplit) -> Record:
        """The fields a fresh record of ``split`` carries beyond its generated (or human) ``text``, for this
        table's metrics (a summary's first sentences)."""
        return {"summary": first_sentences(text, split.task.output_sentences)} if self.sentences else {}

    def to_score(self, records: Sequence[Record]) -> list[Record]:
        """Those of a batch's fresh ``records`` whose tokens need their log-probabilities under the base LM:
        Table 2's, except a record without tokens (EOS at once), which has nothing to score."""
        return [r for r in records if r["tokens"]] if self.hypothesis is None else []

    def update(self, suite: Any, records: Sequence[Record], examples: Sequence[GenerationExample]) -> None:
        """Feed a batch's ``records`` of one row (``to_score``'s with ``lp_full`` and ``lp_short``) to the
        row's ``suite``; ``examples`` are the records' examples, in order (their references)."""
        if self.hypothesis is not None:
            suite.update([self.hypothesis(r) for r in records], [list(ex.references) for ex in examples])
            return
        kept = self.to_score(records)  # the scored ones: a generation without tokens is in no column
        suite.update(
            [r["tokens"] for r in kept],
            [torch.tensor(r["lp_full"]) for r in kept],
            [torch.tensor(r["lp_short"]) for r in kept],
            ids=[r["id"] for r in kept],
        )


#: Table 2 (WebText): the generated tokens and their log-probabilities under the base LM.
TEXT = TableKind("text", "last_k", TextSuite, suite_options=("eos_token_id", "self_bleu_samples"))
#: Table 3 (DSTC7): each response, stripped, against the example's references; the paper's headers.
DIALOG = TableKind(
    "dialog", "response", DialogSuite, ("meteor",), lambda r: r["text"].strip(), titles=DIALOG_TITLES
)
#: The summarisation table: ROUGE of the first sentences of each generation (3 for CNN/DM, 2 for XSum).
SUMMARY = TableKind("summary", "marker", SummarySuite, hypothesis=itemgetter("summary"), sentences=True)


def kind_of(split: TaskSplit) -> TableKind:
    """The kind of table a task's ``split`` fills: ``SUMMARY`` (a spec that keeps the first sentences of the
    output), ``DIALOG`` (examples with turns), else ``TEXT``."""
    if split.task.output_sentences:
        return SUMMARY
    if any(ex.turns for ex in split.examples):
        return DIALOG
    return TEXT
