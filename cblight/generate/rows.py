"""The rows of the generation tables (paper Tables 2, 3 and the summarisation table) and Figure 3's (k, alpha)
grid of boosted rows.

A ``Decoding`` is one row: a name, a ``Boosting`` (what to mix) and a ``Sampling`` (how transformers'
``generate`` draws after mixing), both checked when they are made, so a bad row is refused before any model
loads. ``resolve_decodings`` turns the options of a run into its rows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from cblight.boosting import too_large_alpha
from cblight.errors import ConfigError
from cblight.option_types import FiniteFloat, NotEmptyStr, PositiveInt, check_fields
from cblight.options import Boosting, Mode, Sampling

Table = Literal["text", "dialog", "summary"]
_AUTO_MODE: dict[str, Mode] = {"text": "last_k", "dialog": "response", "summary": "marker"}
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

    name: NotEmptyStr = "greedy"
    boosting: Boosting | None = None
    sampling: Sampling = field(default_factory=Sampling)

    def __post_init__(self) -> None:
        check_fields(self, ConfigError)

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

    alphas: tuple[FiniteFloat, ...] = (-0.4, -0.2, -0.1, -0.05, -0.025)
    ks: tuple[PositiveInt, ...] = (8, 16, 32, 64)
    mode: GridMode = "auto"
    sampling: Sampling = field(default_factory=Sampling)

    def __post_init__(self) -> None:
        check_fields(self, ConfigError)
        if not self.alphas:
            raise ConfigError("grid.alphas: the alpha grid is empty")
        if too_large := too_large_alpha(self.alphas):
            raise ConfigError(f"grid.alphas: {too_large}")

    def decodings(self) -> list[Decoding]:
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
    nested = {"boosting": Boosting, "sampling": Sampling}
    return cls(
        **{
            k: nested[k](**v)
            if k in nested and isinstance(v, dict)
            else tuple(v)
            if isinstance(v, list)
            else v
            for k, v in value.items()
        }
    )
