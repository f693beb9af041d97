"""Dialog response metrics as the DSTC7 evaluation computes them (paper §4.2, Table 3; DESIGN.md §3).

Inputs: hypothesis strings and, per example, a non-empty list of reference strings. Texts are normalised
(``normalize="dstc"``: DialoGPT's ``dstc/tokenizers.py`` ``clean_str``, which the DSTC7 evaluation applies
with ``--clean``: lower-casing, URL and markup cleaning, Twitter-style tokenisation, split contractions;
``"lower"``: lower-case only; ``"none"``) and split on whitespace into words.

* ``CorpusBLEU``: corpus BLEU-n with uniform weights, multi-reference (nltk ``corpus_bleu``).
* ``CorpusNIST``: corpus NIST-n (nltk ``corpus_nist``). The paper ran the NIST ``mteval-v14c.pl`` script,
  which pools the references of an example instead of taking nltk's best single reference and tokenises
  again, so absolute NIST values are not comparable with the paper's.
* ``Meteor``: mean of nltk's sentence ``meteor_score`` (the paper used the METEOR 1.5 jar). Exact and
  Porter-stem matches always; WordNet synonyms only where WordNet is installed (``compute()`` reports it
  as ``meteor_synonyms``).
* ``NGramDiversity``: Distinct-n (unique / all n-grams over the corpus) and Entropy-n (natural log), as
  DialoGPT's ``calc_diversity`` / ``calc_entropy``.
* ``ResponseLength``: mean hypothesis length in words.

Values are fractions in [0, 1] for BLEU, METEOR and Distinct (the paper prints percent); NIST and
entropy are raw, length is in words.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Literal

import torch
from torchmetrics import Metric

from cblight.metrics.ngrams import (
    bleu_from_stats,
    bleu_sentence_stats,
    check_order,
    corpus_nist,
    distinct_and_entropy,
)
from cblight.metrics.ragged import RaggedMetric

Normalize = Literal["dstc", "lower", "none"]
NORMALIZERS = ("dstc", "lower", "none")

# ---------------------------------------------------------------------------------------------------------
# Normalisation

_CONTRACTIONS = ("'s", "'m", "'re", "n't", "'ll", "'ve", "'d", "'em")


@lru_cache(maxsize=1)
def _tweet_tokenizer() -> Any:
    from nltk.tokenize import TweetTokenizer

    return TweetTokenizer(preserve_case=False)


def dstc_clean(text: str) -> str:
    """DSTC7's text cleaning (DialoGPT ``dstc/tokenizers.py`` ``clean_str``), re-implemented."""
    words = []
    for word in text.lower().split():
        at = word.find("http")
        words.append((word[:at] + " __url__" if at >= 0 else word).strip())
    text = " ".join(words)
    text = re.sub(r"\[([^\]]*)\] \( *__url__ *\)", r"\1", text)  # markdown links keep their label
    # the URL marker survives the character filter as upper-case "URL" (the text is lower-case by now)
    text = text.replace("__url__", "URL")
    text = re.sub(r"[^A-Za-z0-9():,.!?\"\']", " ", text)
    text = text.replace("URL", "__url__")
    text = " " + " ".join(_tweet_tokenizer().tokenize(text)) + " "
    text = text.replace(" won't ", " will n't ").replace(" can't ", " can n't ")
    for piece in _CONTRACTIONS:
        text = text.replace(piece + " ", " " + piece + " ")
    return " ".join(text.split())


def normalize_words(text: str, normalize: Normalize = "dstc") -> list[str]:
    if normalize == "dstc":
        return dstc_clean(text).split()
    if normalize == "lower":
        return text.lower().split()
    return text.split()


def check_normalize(normalize: str) -> str:
    if normalize not in NORMALIZERS:
        raise ValueError(f"normalize must be one of {NORMALIZERS}, got {normalize!r}")
    return normalize


def dialog_words(
    hypotheses: Sequence[str], references: Sequence[Sequence[str]], normalize: Normalize = "dstc"
) -> tuple[list[list[str]], list[list[list[str]]]]:
    """Validated, normalised words of hypotheses and their references."""
    check_normalize(normalize)
    if isinstance(hypotheses, str):
        raise TypeError("hypotheses must be a list of strings, not one string")
    if isinstance(references, str):
        raise TypeError("references must be a list (one per hypothesis) of lists of reference strings")
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference lists")
    hyps, refs = [], []
    for i, (hyp, ref_list) in enumerate(zip(hypotheses, references)):
        if not isinstance(hyp, str):
            raise TypeError(f"hypotheses[{i}] must be a string, got {type(hyp).__name__}")
        if isinstance(ref_list, str) or not isinstance(ref_list, Sequence):
            raise TypeError(
                f"references[{i}] must be a list of reference strings, got {type(ref_list).__name__}"
            )
        if len(ref_list) == 0:
            raise ValueError(f"references[{i}] is empty: every hypothesis needs at least one reference")
        if not all(isinstance(r, str) for r in ref_list):
            raise TypeError(f"references[{i}] must hold strings only")
        hyps.append(normalize_words(hyp, normalize))
        refs.append([normalize_words(r, normalize) for r in ref_list])
    return hyps, refs


def check_hypotheses(hypotheses: Sequence[str], normalize: Normalize = "dstc") -> list[list[str]]:
    check_normalize(normalize)
    if isinstance(hypotheses, str):
        raise TypeError("hypotheses must be a list of strings, not one string")
    for i, hyp in enumerate(hypotheses):
        if not isinstance(hyp, str):
            raise TypeError(f"hypotheses[{i}] must be a string, got {type(hyp).__name__}")
    return [normalize_words(h, normalize) for h in hypotheses]


def _orders(orders: Sequence[int]) -> list[int]:
    orders = [check_order(n, "n-gram order") for n in orders]
    if not orders:
        raise ValueError("give at least one n-gram order")
    return orders


def _empty(total: torch.Tensor | int, what: str) -> None:
    if int(total) == 0:
        raise ValueError(f"{what} of an empty corpus: no hypotheses were given")


# ---------------------------------------------------------------------------------------------------------
# BLEU and NIST


class CorpusBLEU(Metric):
    """Corpus BLEU-n for each ``n`` in ``orders`` (keys ``bleu<n>``), from summed n-gram statistics."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, orders: Sequence[int] = (2, 4), normalize: Normalize = "dstc", **kwargs: Any):
        super().__init__(**kwargs)
        self.orders = _orders(orders)
        self.normalize = check_normalize(normalize)
        width = max(self.orders)
        self.add_state("matches", default=torch.zeros(width, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("totals", default=torch.zeros(width, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("hyp_len", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("ref_len", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        hyps, refs = dialog_words(hypotheses, references, self.normalize)
        for hyp, ref in zip(hyps, refs):
            m, t, h, r = bleu_sentence_stats(hyp, ref, max(self.orders))
            self.matches += torch.tensor(m, dtype=torch.long, device=self.device)
            self.totals += torch.tensor(t, dtype=torch.long, device=self.device)
            self.hyp_len += h
            self.ref_len += r
            self.count += 1

    def compute(self) -> dict[str, torch.Tensor]:
        _empty(self.count, "BLEU")
        m, t = self.matches.tolist(), self.totals.tolist()
        h, r = int(self.hyp_len), int(self.ref_len)
        return {
            f"bleu{n}": torch.tensor(bleu_from_stats(m, t, h, r, n), dtype=torch.float64) for n in self.orders
        }


class CorpusNIST(RaggedMetric):
    """Corpus NIST-n for each ``n`` in ``orders`` (keys ``nist<n>``); keeps the corpus, since the
    information weights come from all references."""

    higher_is_better = True

    def __init__(self, orders: Sequence[int] = (2, 4), normalize: Normalize = "dstc", **kwargs: Any):
        super().__init__(**kwargs)
        self.orders = _orders(orders)
        self.normalize = check_normalize(normalize)
        self.add_ragged_state("hyps")
        self.add_ragged_state("refs")
        self.add_state("num_refs", default=[], dist_reduce_fx="cat")

    def update(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        hyps, refs = dialog_words(hypotheses, references, self.normalize)
        self.append_texts("hyps", [" ".join(h) for h in hyps])
        self.append_texts("refs", [" ".join(r) for rs in refs for r in rs])
        self.append_longs("num_refs", [len(rs) for rs in refs])

    def compute(self) -> dict[str, torch.Tensor]:
        hyps = [h.split() for h in self.read_texts("hyps")]
        _empty(len(hyps), "NIST")
        flat = [r.split() for r in self.read_texts("refs")]
        refs, at = [], 0
        for n in self.read_longs("num_refs"):
            refs.append(flat[at : at + n])
            at += n
        return {
            f"nist{n}": torch.tensor(corpus_nist(hyps, refs, n), dtype=torch.float64) for n in self.orders
        }


# ---------------------------------------------------------------------------------------------------------
# METEOR


class _NoSynonyms:
    """Stands in for nltk's WordNet reader: no synsets, so METEOR's synonym stage matches nothing."""

    def synsets(self, *args: Any, **kwargs: Any) -> list:
        return []


def wordnet_reader() -> Any | None:
    """nltk's WordNet reader when the corpus is installed, else ``None``."""
    try:
        from nltk.corpus import wordnet

        wordnet.synsets("dog")
    except (LookupError, OSError):
        return None
    return wordnet


class Meteor(Metric):
    """Mean sentence METEOR (nltk ``meteor_score`` against all references of an example).

    ``use_synonyms``: ``None`` uses WordNet when installed; ``True`` requires it; ``False`` never uses
    it. ``compute()`` gives ``{"meteor": ..., "meteor_synonyms": 1.0 or 0.0}``.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, normalize: Normalize = "dstc", use_synonyms: bool | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.normalize = check_normalize(normalize)
        self.synonyms = use_synonyms is not False and wordnet_reader() is not None
        if use_synonyms and not self.synonyms:
            raise LookupError(
                "use_synonyms=True needs nltk's WordNet corpus (python -m nltk.downloader wordnet); "
                "pass use_synonyms=None to fall back to exact and stem matches"
            )
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        from nltk.translate.meteor_score import meteor_score

        hyps, refs = dialog_words(hypotheses, references, self.normalize)
        reader = wordnet_reader() if self.synonyms else _NoSynonyms()
        scores = [meteor_score(ref, hyp, wordnet=reader) for hyp, ref in zip(hyps, refs)]
        self.total += math.fsum(scores)
        self.count += len(scores)

    def compute(self) -> dict[str, torch.Tensor]:
        _empty(self.count, "METEOR")
        return {
            "meteor": self.total / self.count,
            "meteor_synonyms": torch.tensor(float(self.synonyms), dtype=torch.float64),
        }


# ---------------------------------------------------------------------------------------------------------
# Diversity and length


class NGramDiversity(RaggedMetric):
    """Distinct-n (keys ``dist<n>``) and Entropy-n (keys ``ent<n>``, natural log) of the hypotheses."""

    higher_is_better = True

    def __init__(
        self,
        distinct_orders: Sequence[int] = (1, 2),
        entropy_orders: Sequence[int] = (4,),
        normalize: Normalize = "dstc",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.distinct_orders = [check_order(n, "distinct order") for n in distinct_orders]
        self.entropy_orders = [check_order(n, "entropy order") for n in entropy_orders]
        if not self.distinct_orders and not self.entropy_orders:
            raise ValueError("give at least one distinct or entropy order")
        self.normalize = check_normalize(normalize)
        self.add_ragged_state("hyps")

    def update(self, hypotheses: Sequence[str]) -> None:
        self.append_texts("hyps", [" ".join(h) for h in check_hypotheses(hypotheses, self.normalize)])

    def compute(self) -> dict[str, torch.Tensor]:
        hyps = [h.split() for h in self.read_texts("hyps")]
        _empty(len(hyps), "Distinct/Entropy")
        out = {}
        for n in self.distinct_orders:
            out[f"dist{n}"] = torch.tensor(distinct_and_entropy(hyps, n)[0], dtype=torch.float64)
        for n in self.entropy_orders:
            out[f"ent{n}"] = torch.tensor(distinct_and_entropy(hyps, n)[1], dtype=torch.float64)
        return out


class ResponseLength(Metric):
    """Mean hypothesis length in (normalised) words."""

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, normalize: Normalize = "dstc", **kwargs: Any):
        super().__init__(**kwargs)
        self.normalize = check_normalize(normalize)
        self.add_state("words", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, hypotheses: Sequence[str]) -> None:
        hyps = check_hypotheses(hypotheses, self.normalize)
        self.words += sum(len(h) for h in hyps)
        self.count += len(hyps)

    def compute(self) -> torch.Tensor:
        _empty(self.count, "average length")
        return self.words.double() / self.count.double()


# ---------------------------------------------------------------------------------------------------------
# Functional forms


def _floats(values: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items()}


def corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    orders: Sequence[int] = (2, 4),
    normalize: Normalize = "dstc",
) -> dict[str, float]:
    metric = CorpusBLEU(orders, normalize)
    metric.update(hypotheses, references)
    return _floats(metric.compute())


def corpus_nist_score(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    orders: Sequence[int] = (2, 4),
    normalize: Normalize = "dstc",
) -> dict[str, float]:
    metric = CorpusNIST(orders, normalize)
    metric.update(hypotheses, references)
    return _floats(metric.compute())


def meteor(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    normalize: Normalize = "dstc",
    use_synonyms: bool | None = None,
) -> dict[str, float]:
    metric = Meteor(normalize, use_synonyms)
    metric.update(hypotheses, references)
    return _floats(metric.compute())


def ngram_diversity(
    hypotheses: Sequence[str],
    distinct_orders: Sequence[int] = (1, 2),
    entropy_orders: Sequence[int] = (4,),
    normalize: Normalize = "dstc",
) -> dict[str, float]:
    metric = NGramDiversity(distinct_orders, entropy_orders, normalize)
    metric.update(hypotheses)
    return _floats(metric.compute())


def response_length(hypotheses: Sequence[str], normalize: Normalize = "dstc") -> float:
    metric = ResponseLength(normalize)
    metric.update(hypotheses)
    return float(metric.compute())
