"""Dialog response metrics of the official DSTC7 evaluation (paper §4.2, Table 3), and the dialog texts as
that evaluation reads them.

Inputs: hypothesis strings and, per example, a non-empty list of reference strings. ``normalize="dstc"``
is DialoGPT's ``dstc/tokenizers.py`` ``clean_str``, which the DSTC7 evaluation applies with ``--clean``:
lower-casing, URL and markup cleaning, Twitter-style tokenisation, split contractions; ``"lower"``:
lower-case only; ``"none"``. Texts are then split on whitespace into words.

* ``CorpusBLEU``, ``CorpusNIST``: cumulative BLEU-n / NIST-n as NIST's ``mteval-v14c.pl`` computes them
  (``mteval_words``, its tokenisation; ``cblight.metrics.ngrams``: its information weights, brevity
  penalty and smoothing, multi-reference, corpus level), the numbers of the paper's Table 3.
* ``NltkCorpusBLEU``, ``NltkCorpusNIST``: nltk's ``corpus_bleu`` / ``corpus_nist`` on the normalised
  words (no smoothing; NIST against each example's best single reference), for comparison only: on real
  DSTC7 responses they are up to 3.5 NIST points off the official values.
* METEOR lives in ``cblight.metrics.dialog_meteor`` (the METEOR 1.5 jar, and nltk's variant).
* ``NGramDiversity``: Distinct-n (unique / all n-grams over the corpus) and Entropy-n (natural log), as
  DialoGPT's ``calc_diversity`` / ``calc_entropy``.
* ``ResponseLength``: mean hypothesis length in words.

Values are fractions in [0, 1] for BLEU and Distinct (the paper prints percent); NIST and entropy are raw,
length is in words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Literal

import torch

from cblight.metrics import ngrams
from cblight.metrics.ragged import PaperMetric, RaggedMetric, score_once
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
    """DSTC7's text cleaning (DialoGPT ``dstc/tokenizers.py`` ``clean_str``, which the official evaluation
    applies with ``--clean``), re-implemented: lower case, URLs as ``__url__``, Twitter-style tokens, split
    contractions.

    Args:
        text: a response or reference.

    Returns:
        The cleaned text, words separated by single spaces.

    Examples:
        >>> dstc_clean("I can't see https://example.org !")
        "i can n't see __url__ !"
    """
    text = re.sub(r"http\S*", " __url__", " ".join(text.lower().split()))  # a word from "http" on is a URL
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


def _is_strings(value: Any) -> bool:
    """Whether ``value`` is a list (or tuple) of strings: a string alone is not."""
    return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)


def check_hypotheses(hypotheses: Sequence[str], normalize: Normalize = "dstc") -> list[list[str]]:
    """The normalised words of each hypothesis string."""
    if not _is_strings(hypotheses):
        raise TypeError(f"hypotheses must be a list of strings (not one string), got {hypotheses!r:.80}")
    return [normalize_words(h, normalize) for h in hypotheses]


def dialog_words(
    hypotheses: Sequence[str], references: Sequence[Sequence[str]], normalize: Normalize = "dstc"
) -> tuple[list[list[str]], list[list[list[str]]]]:
    """Validated, normalised words of hypotheses and their references."""
    hyps, refs = check_hypotheses(hypotheses, normalize), []
    for i, ref_list in enumerate(references):
        if not _is_strings(ref_list):
            raise TypeError(f"references[{i}] must be a list of reference strings, got {ref_list!r}")
        if len(ref_list) == 0:
            raise ValueError(f"references[{i}] is empty: every hypothesis needs at least one reference")
        refs.append([normalize_words(r, normalize) for r in ref_list])
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} reference lists")
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

    ``update(hypotheses, references)``; ``read_corpus()`` gives the (synced) words.

    Args:
        normalize: ``dstc`` (``dstc_clean``), ``lower`` or ``none``.
        n_refs: for subclasses that cycle the references (see ``cycle_references``).
        **kwargs: torchmetrics' ``Metric`` options.
    """

    def __init__(self, normalize: Normalize = "dstc", n_refs: PositiveInt | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.normalize, self.n_refs = normalize, n_refs
        self.add_ragged_state("examples")

    def update(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        # one text per example: the hypothesis, then its references, one per line (words hold no whitespace)
        examples = [[h, *rs] for h, rs in zip(*dialog_words(hypotheses, references, self.normalize))]
        self.append_texts("examples", ["\n".join(" ".join(words) for words in ex) for ex in examples])

    def read_corpus(self, what: str) -> tuple[list[list[str]], list[list[list[str]]]]:
        examples = [[line.split() for line in text.split("\n")] for text in self.read_texts("examples")]
        check_nonempty(len(examples), what)
        return [ex[0] for ex in examples], [ex[1:] for ex in examples]


Orders = tuple[PositiveInt, ...]


def _orders(orders: Orders) -> list[int]:
    if not orders:
        raise ValueError("give at least one n-gram order")
    return list(orders)


_PUNCTUATION = re.compile(r"([{-~\[-` -&(-+:-@/])")
_BEFORE_PERIOD_COMMA = re.compile(r"([^0-9])([.,])")
_AFTER_PERIOD_COMMA = re.compile(r"([.,])([^0-9])")
_DIGIT_DASH = re.compile(r"([0-9])(-)")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def mteval_words(text: str) -> list[str]:
    """The words ``mteval-v14c.pl`` scores for one segment written by DialoGPT's ``_write_xml``: the writer
    blanks ``&`` and ``<``; mteval's default tokenisation then lower-cases A-Z, splits off the ASCII
    punctuation ``{|}~[\\]^_`` `` !"#$%&()*+:;<=>?@/`` (not ``'`` or ``-``), a period or comma unless it sits
    between digits, and a dash after a digit."""
    # the XML writer blanks the two characters that would break its XML; the parser turns \r\n into \n
    text = text.replace("&", " ").replace("<", " ").replace("\r\n", "\n").replace("\r", "\n")
    # mteval's language-independent part (its <skipped> and &quot;-style entity rules cannot fire here)
    text = text.replace("-\n", "").replace("\n", " ")
    text = text.translate(_ASCII_LOWER)  # mteval's tr/A-Z/a-z/: ASCII only
    text = _PUNCTUATION.sub(r" \1 ", f" {text} ")
    text = _BEFORE_PERIOD_COMMA.sub(r"\1 \2 ", text)
    text = _AFTER_PERIOD_COMMA.sub(r" \1 \2", text)
    text = _DIGIT_DASH.sub(r"\1 \2 ", text)
    return text.split()


def _mteval_words(hyps: list[list[str]], refs: list[list[list[str]]]) -> tuple[list, list]:
    """The normalised words as ``mteval-v14c.pl`` tokenises the text ``dstc.py`` writes of them."""
    return [mteval_words(" ".join(h)) for h in hyps], [[mteval_words(" ".join(r)) for r in rs] for rs in refs]


# ---------------------------------------------------------------------------------------------------------
# BLEU and NIST as mteval-v14c.pl (the official DSTC7 evaluation), and nltk's for comparison


class CorpusBLEU(PaperMetric):
    """Cumulative BLEU-n of ``mteval-v14c.pl`` for each ``n`` in ``orders`` (keys ``bleu<n>``; paper Table 3),
    from summed per-segment statistics (matches and hypothesis n-grams per order, closest reference length).

    ``update(hypotheses, references)`` takes hypothesis strings and, per hypothesis, a list of reference
    strings.

    Args:
        orders: the BLEU orders ``n``.
        normalize: ``dstc`` (``dstc_clean``, the official evaluation's ``--clean``), ``lower`` or ``none``.
        n_refs: cut or cycle each example's references to this many, as ``dstc.py --n_refs`` (``None``: as
            given; cycling alone never changes BLEU).
        **kwargs: torchmetrics' ``Metric`` options.

    Examples:
        >>> metric = CorpusBLEU(orders=(2, 4))
        >>> metric.update(["i am fine , thanks .", "no idea what you mean"],
        ...               [["i'm fine, thank you."], ["what do you mean?", "no idea."]])
        >>> {name: round(float(value), 4) for name, value in metric.compute().items()}
        {'bleu2': 0.4769, 'bleu4': 0.1613}
    """

    higher_is_better = True
    bleu = staticmethod(ngrams.bleu_from_counts)
    min_total = 0  # a segment's hypothesis n-grams per order as they are summed

    def __init__(
        self,
        orders: Orders = (2, 4),
        normalize: Normalize = "dstc",
        n_refs: PositiveInt | None = None,
        **kwargs: Any,
    ):
        check_arguments(CorpusBLEU.__init__, locals())
        super().__init__(**kwargs)
        self.orders, self.normalize, self.n_refs = _orders(orders), normalize, n_refs
        self.add_sums("matches", "totals", size=max(self.orders))
        self.add_sums("hyp_len", "ref_len", "count")

    def segments(self, hyps: list[list[str]], refs: list[list[list[str]]]) -> tuple[list, list]:
        """The words BLEU counts: mteval's tokens, references cycled to ``n_refs``.

        :meta private:
        """
        return _mteval_words(hyps, refs if self.n_refs is None else cycle_references(refs, self.n_refs))

    def update(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        hyps, refs = self.segments(*dialog_words(hypotheses, references, self.normalize))
        for hyp, ref_list in zip(hyps, refs):
            matches, totals, ref_len = ngrams.bleu_stats(hyp, ref_list, len(self.matches), self.min_total)
            self.matches += torch.tensor(matches, dtype=torch.long, device=self.device)
            self.totals += torch.tensor(totals, dtype=torch.long, device=self.device)
            self.hyp_len += len(hyp)
            self.ref_len += ref_len
        self.count += len(hyps)

    def compute(self) -> dict[str, torch.Tensor]:
        check_nonempty(self.count, "BLEU")
        stats = self.matches.tolist(), self.totals.tolist(), int(self.hyp_len), int(self.ref_len)
        return {f"bleu{n}": torch.tensor(self.bleu(*stats, n), dtype=torch.float64) for n in self.orders}


class NltkCorpusBLEU(CorpusBLEU):
    """nltk's ``corpus_bleu`` (uniform weights, no smoothing) for each ``n`` in ``orders`` (keys
    ``bleu<n>``), from summed n-gram statistics of the normalised words; for comparison with the official
    ``CorpusBLEU``.

    Args:
        orders: the BLEU orders ``n``.
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).
        **kwargs: torchmetrics' ``Metric`` options.
    """

    bleu = staticmethod(ngrams.bleu_from_stats)
    min_total = 1  # nltk's max(1, ·) sentence denominators

    def __init__(self, orders: Orders = (2, 4), normalize: Normalize = "dstc", **kwargs: Any):
        super().__init__(orders, normalize, **kwargs)

    def segments(self, hyps: list[list[str]], refs: list[list[list[str]]]) -> tuple[list, list]:
        return hyps, refs


class CorpusNIST(DialogCorpus):
    """Cumulative NIST-n of ``mteval-v14c.pl`` for each ``n`` in ``orders`` (keys ``nist<n>``; paper Table 3).

    Keeps the corpus: the information weights come from all references. mteval needs the same number of
    references for every example: they are cycled to ``n_refs`` (``None``: the largest count in the
    corpus), as ``dstc.py`` cycles them to its ``--n_refs``.

    Args:
        orders: the NIST orders ``n``.
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).
        n_refs: the references per example after cycling.
        **kwargs: torchmetrics' ``Metric`` options.
    """

    higher_is_better = True

    def __init__(
        self,
        orders: Orders = (2, 4),
        normalize: Normalize = "dstc",
        n_refs: PositiveInt | None = None,
        **kwargs: Any,
    ):
        check_arguments(CorpusNIST.__init__, locals())
        super().__init__(normalize, n_refs, **kwargs)
        self.orders = _orders(orders)

    def nist(self, hyps: list[list[str]], refs: list[list[list[str]]]) -> list[float]:
        """NIST-n of the corpus for each ``n`` in ``orders``.

        :meta private:
        """
        scores = ngrams.mteval_nist(
            *_mteval_words(hyps, cycle_references(refs, self.n_refs)), max(self.orders)
        )
        return [scores[n - 1] for n in self.orders]

    def compute(self) -> dict[str, torch.Tensor]:
        scores = self.nist(*self.read_corpus("NIST"))
        return {f"nist{n}": torch.tensor(v, dtype=torch.float64) for n, v in zip(self.orders, scores)}


class NltkCorpusNIST(CorpusNIST):
    """nltk's ``corpus_nist`` for each ``n`` in ``orders`` (keys ``nist<n>``) on the normalised words; for
    comparison with the official ``CorpusNIST``.

    Args:
        orders: the NIST orders ``n``.
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).
        **kwargs: torchmetrics' ``Metric`` options.
    """

    def __init__(self, orders: Orders = (2, 4), normalize: Normalize = "dstc", **kwargs: Any):
        super().__init__(orders, normalize, **kwargs)

    def nist(self, hyps: list[list[str]], refs: list[list[list[str]]]) -> list[float]:
        return [ngrams.corpus_nist(hyps, refs, n) for n in self.orders]


# ---------------------------------------------------------------------------------------------------------
# Diversity and length


class NGramDiversity(RaggedMetric):
    """Distinct-n (keys ``dist<n>``) and Entropy-n (keys ``ent<n>``, natural log) of the hypotheses (Table 3,
    DialoGPT's ``calc_diversity`` / ``calc_entropy``). ``update(hypotheses)`` takes response strings.

    Args:
        distinct_orders: the orders of Distinct-n (unique / all n-grams over the corpus).
        entropy_orders: the orders of Entropy-n.
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).
        **kwargs: torchmetrics' ``Metric`` options.

    Raises:
        ValueError: when both order lists are empty.
    """

    higher_is_better = True

    def __init__(
        self,
        distinct_orders: Orders = (1, 2),
        entropy_orders: Orders = (4,),
        normalize: Normalize = "dstc",
        **kwargs: Any,
    ):
        check_arguments(NGramDiversity.__init__, locals())
        super().__init__(**kwargs)
        if not distinct_orders and not entropy_orders:
            raise ValueError("give at least one distinct or entropy order")
        self.distinct_orders, self.entropy_orders = list(distinct_orders), list(entropy_orders)
        self.normalize = normalize
        self.add_ragged_state("hyps")

    def update(self, hypotheses: Sequence[str]) -> None:
        self.append_texts("hyps", [" ".join(h) for h in check_hypotheses(hypotheses, self.normalize)])

    def compute(self) -> dict[str, torch.Tensor]:
        hyps = [h.split() for h in self.read_texts("hyps")]
        check_nonempty(len(hyps), "Distinct/Entropy")
        out = {f"dist{n}": ngrams.distinct_and_entropy(hyps, n)[0] for n in self.distinct_orders}
        out.update({f"ent{n}": ngrams.distinct_and_entropy(hyps, n)[1] for n in self.entropy_orders})
        return {key: torch.tensor(value, dtype=torch.float64) for key, value in out.items()}


class ResponseLength(PaperMetric):
    """Mean hypothesis length in (normalised) words (Table 3's avg len). ``update(hypotheses)`` takes response
    strings.

    Args:
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).
        **kwargs: torchmetrics' ``Metric`` options.
    """

    higher_is_better = None

    def __init__(self, normalize: Normalize = "dstc", **kwargs: Any):
        check_arguments(ResponseLength.__init__, locals())
        super().__init__(**kwargs)
        self.normalize = normalize
        self.add_sums("words", "count")

    def update(self, hypotheses: Sequence[str]) -> None:
        hyps = check_hypotheses(hypotheses, self.normalize)
        self.words += sum(len(h) for h in hyps)
        self.count += len(hyps)

    def compute(self) -> torch.Tensor:
        check_nonempty(self.count, "average length")
        return self.words.double() / self.count.double()


# ---------------------------------------------------------------------------------------------------------
# Functional forms


def corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    orders: Orders = (2, 4),
    normalize: Normalize = "dstc",
    n_refs: PositiveInt | None = None,
) -> dict[str, float]:
    """``CorpusBLEU`` (mteval-v14c.pl, Table 3's B-2 and B-4 as fractions) in one call.

    Args:
        hypotheses: the responses.
        references: per response, a non-empty list of reference strings.
        orders: the BLEU orders ``n``.
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).
        n_refs: cut or cycle each example's references to this many (``None``: as given).

    Returns:
        ``{"bleu<n>": value}`` for each order.

    Examples:
        >>> scores = corpus_bleu(["i am fine , thanks .", "no idea what you mean"],
        ...                      [["i'm fine, thank you."], ["what do you mean?", "no idea."]])
        >>> {name: round(value, 4) for name, value in scores.items()}
        {'bleu2': 0.4769, 'bleu4': 0.1613}
    """
    return score_once(CorpusBLEU(orders, normalize, n_refs), hypotheses, references)


def corpus_nist_score(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    orders: Orders = (2, 4),
    normalize: Normalize = "dstc",
    n_refs: PositiveInt | None = None,
) -> dict[str, float]:
    """``CorpusNIST`` (mteval-v14c.pl, Table 3's N-2 and N-4) in one call.

    Args:
        hypotheses: the responses.
        references: per response, a non-empty list of reference strings.
        orders: the NIST orders ``n``.
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).
        n_refs: the references per example after cycling (``None``: the largest count in the corpus).

    Returns:
        ``{"nist<n>": value}`` for each order.

    Examples:
        >>> scores = corpus_nist_score(["i am fine , thanks .", "no idea what you mean"],
        ...                            [["i'm fine, thank you."], ["what do you mean?", "no idea."]])
        >>> {name: round(value, 4) for name, value in scores.items()}
        {'nist2': 3.2638, 'nist4': 3.2638}
    """
    return score_once(CorpusNIST(orders, normalize, n_refs), hypotheses, references)


def nltk_corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    orders: Orders = (2, 4),
    normalize: Normalize = "dstc",
) -> dict[str, float]:
    """``NltkCorpusBLEU`` on one corpus: nltk's ``corpus_bleu`` at each order (kept to compare with the
    official NIST-script BLEU of ``corpus_bleu``).

    Args:
        hypotheses: the responses.
        references: per response, a non-empty list of reference strings.
        orders: the BLEU orders ``n``.
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).

    Returns:
        ``{"bleu<n>": value}`` for each order.
    """
    return score_once(NltkCorpusBLEU(orders, normalize), hypotheses, references)


def nltk_corpus_nist(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    orders: Orders = (2, 4),
    normalize: Normalize = "dstc",
) -> dict[str, float]:
    """``NltkCorpusNIST`` on one corpus: nltk's ``corpus_nist`` at each order (kept to compare with the
    official ``mteval-v14c.pl`` figures of ``corpus_nist_score``).

    Args:
        hypotheses: the responses.
        references: per response, a non-empty list of reference strings.
        orders: the NIST orders ``n``.
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).

    Returns:
        ``{"nist<n>": value}`` for each order.
    """
    return score_once(NltkCorpusNIST(orders, normalize), hypotheses, references)


def ngram_diversity(
    hypotheses: Sequence[str],
    distinct_orders: Orders = (1, 2),
    entropy_orders: Orders = (4,),
    normalize: Normalize = "dstc",
) -> dict[str, float]:
    """``NGramDiversity`` on one corpus: Dist-n and Ent-n of the responses (Table 3, DialoGPT's DSTC scripts).

    Args:
        hypotheses: the responses.
        distinct_orders: the orders of Distinct-n.
        entropy_orders: the orders of Entropy-n.
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).

    Returns:
        ``{"dist<n>": ..., "ent<n>": ...}``, Distinct as fractions, Entropy in nats.

    Examples:
        >>> scores = ngram_diversity(["i am fine , thanks .", "no idea what you mean"])
        >>> {name: round(value, 4) for name, value in scores.items()}
        {'dist1': 1.0, 'dist2': 1.0, 'ent4': 1.6094}
    """
    return score_once(NGramDiversity(distinct_orders, entropy_orders, normalize), hypotheses)


def response_length(hypotheses: Sequence[str], normalize: Normalize = "dstc") -> float:
    """``ResponseLength`` on one corpus: the mean response length in words (Table 3's avg len).

    Args:
        hypotheses: the responses.
        normalize: ``dstc``, ``lower`` or ``none`` (see ``CorpusBLEU``).

    Returns:
        The mean number of words.

    Examples:
        >>> response_length(["i am fine , thanks .", "no idea what you mean"])
        5.5
    """
    return score_once(ResponseLength(normalize), hypotheses)
