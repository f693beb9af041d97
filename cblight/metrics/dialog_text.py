"""Dialog texts as the DSTC7 evaluation reads them (paper §4.2, Table 3): normalisation, validation, and
the corpus state of the metrics that need the whole corpus at ``compute()``.

``normalize="dstc"`` is DialoGPT's ``dstc/tokenizers.py`` ``clean_str``, which the DSTC7 evaluation
applies with ``--clean``: lower-casing, URL and markup cleaning, Twitter-style tokenisation, split
contractions; ``"lower"``: lower-case only; ``"none"``. Texts are then split on whitespace into words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Literal

import torch
from torchmetrics import Metric

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


@lru_cache(maxsize=1 << 16)  # a suite's five metrics clean the same texts: once is enough
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


def check_nonempty(total: torch.Tensor | int, what: str) -> None:
    if int(total) == 0:
        raise ValueError(f"{what} of an empty corpus: no hypotheses were given")


def cycle_references(references: Sequence[Sequence[Any]], n_refs: int | None = None) -> list[list[Any]]:
    """Every example's references cycled (or cut) to ``n_refs``, as ``dstc.py --n_refs`` writes its
    reference files; ``None``: to the largest count in the corpus (mteval needs the same count for all)."""
    if n_refs is None:
        n_refs = max((len(refs) for refs in references), default=0)
    return [[refs[k % len(refs)] for k in range(n_refs)] for refs in references]


def check_n_refs(n_refs: int | None) -> int | None:
    if n_refs is not None and (isinstance(n_refs, bool) or not isinstance(n_refs, int) or n_refs < 1):
        raise ValueError(f"n_refs must be a positive integer or None, got {n_refs!r}")
    return n_refs


def score_once(metric: Metric, *inputs: Any) -> Any:
    """``metric``'s value over one corpus in memory (the functional forms)."""
    metric.update(*inputs)
    return metric.compute()


def as_floats(values: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items()}


class DialogCorpus(RaggedMetric):
    """The normalised hypotheses and references themselves as ``cat`` states (for corpus-level values:
    NIST's information weights come from all references, METEOR 1.5 scores the corpus in one run).

    ``update(hypotheses, references)``; ``read_corpus()`` gives the (synced) words. ``n_refs`` is for
    subclasses that cycle the references (see ``cycle_references``).
    """

    def __init__(self, normalize: Normalize = "dstc", n_refs: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.normalize = check_normalize(normalize)
        self.n_refs = check_n_refs(n_refs)
        self.add_ragged_state("hyps")
        self.add_ragged_state("refs")
        self.add_state("num_refs", default=[], dist_reduce_fx="cat")

    def update(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        hyps, refs = dialog_words(hypotheses, references, self.normalize)
        self.append_texts("hyps", [" ".join(h) for h in hyps])
        self.append_texts("refs", [" ".join(r) for rs in refs for r in rs])
        self.append_longs("num_refs", [len(rs) for rs in refs])

    def read_corpus(self, what: str) -> tuple[list[list[str]], list[list[list[str]]]]:
        hyps = [h.split() for h in self.read_texts("hyps")]
        check_nonempty(len(hyps), what)
        flat = [r.split() for r in self.read_texts("refs")]
        refs, at = [], 0
        for n in self.read_longs("num_refs"):
            refs.append(flat[at : at + n])
            at += n
        return hyps, refs
