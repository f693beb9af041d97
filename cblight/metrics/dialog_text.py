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

from cblight.metrics.ragged import RaggedMetric
from cblight.option_types import PositiveInt, check_arguments

Normalize = Literal["dstc", "lower", "none"]

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
    return (text.lower() if normalize == "lower" else text).split()


def check_hypotheses(hypotheses: Sequence[str], normalize: Normalize = "dstc") -> list[list[str]]:
    """The normalised words of each hypothesis string."""
    if isinstance(hypotheses, str):
        raise TypeError("hypotheses must be a list of strings, not one string")
    for i, hyp in enumerate(hypotheses):
        if not isinstance(hyp, str):
            raise TypeError(f"hypotheses[{i}] must be a string, got {type(hyp).__name__}")
    return [normalize_words(h, normalize) for h in hypotheses]


def dialog_words(
    hypotheses: Sequence[str], references: Sequence[Sequence[str]], normalize: Normalize = "dstc"
) -> tuple[list[list[str]], list[list[list[str]]]]:
    """Validated, normalised words of hypotheses and their references."""
    hyps = check_hypotheses(hypotheses, normalize)
    if isinstance(references, str):
        raise TypeError("references must be a list (one per hypothesis) of lists of reference strings")
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference lists")
    refs = []
    for i, ref_list in enumerate(references):
        if isinstance(ref_list, str) or not isinstance(ref_list, Sequence):
            raise TypeError(
                f"references[{i}] must be a list of reference strings, got {type(ref_list).__name__}"
            )
        if len(ref_list) == 0:
            raise ValueError(f"references[{i}] is empty: every hypothesis needs at least one reference")
        if not all(isinstance(r, str) for r in ref_list):
            raise TypeError(f"references[{i}] must hold strings only")
        refs.append([normalize_words(r, normalize) for r in ref_list])
    return hyps, refs


def check_nonempty(total: torch.Tensor | int, what: str) -> None:
    if int(total) == 0:
        raise ValueError(f"{what} of an empty corpus: no hypotheses were given")


def cycle_references(references: Sequence[Sequence[Any]], n_refs: int | None = None) -> list[list[Any]]:
    """Every example's references cycled (or cut) to ``n_refs``, as ``dstc.py --n_refs`` writes its
    reference files; ``None``: to the largest count in the corpus (mteval needs the same count for all)."""
    if n_refs is None:
        n_refs = max((len(refs) for refs in references), default=0)
    return [[refs[k % len(refs)] for k in range(n_refs)] for refs in references]


class DialogCorpus(RaggedMetric):
    """The normalised hypotheses and references themselves as ``cat`` states (for corpus-level values:
    NIST's information weights come from all references, METEOR 1.5 scores the corpus in one run).

    ``update(hypotheses, references)``; ``read_corpus()`` gives the (synced) words. ``n_refs`` is for
    subclasses that cycle the references (see ``cycle_references``).
    """

    def __init__(self, normalize: Normalize = "dstc", n_refs: PositiveInt | None = None, **kwargs: Any):
        check_arguments(DialogCorpus.__init__, locals())
        super().__init__(**kwargs)
        self.normalize, self.n_refs = normalize, n_refs
        self.add_ragged_state("hyps")
        self.add_ragged_state("refs")

    def update(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        hyps, refs = dialog_words(hypotheses, references, self.normalize)
        self.append_texts("hyps", [" ".join(h) for h in hyps])
        # one text per example: its references one per line (normalised words hold no whitespace)
        self.append_texts("refs", ["\n".join(" ".join(r) for r in rs) for rs in refs])

    def read_corpus(self, what: str) -> tuple[list[list[str]], list[list[list[str]]]]:
        hyps = [h.split() for h in self.read_texts("hyps")]
        check_nonempty(len(hyps), what)
        return hyps, [[r.split() for r in rs.split("\n")] for rs in self.read_texts("refs")]
