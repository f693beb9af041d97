"""The paper's metric sets in the paper's units, as plain floats.

* ``generation_table`` (Table 2, WebText completions): ``ppl`` (raw), ``self_bleu4`` (a fraction, as the
  paper's "BLEU-4" column), ``zipf`` (raw), ``rep``, ``lr_50``, ``lr_100``, ``delta``, ``ltf`` (percent).
* ``dialog_table`` (Table 3, DSTC7): ``nist2``, ``nist4`` (raw), ``bleu2``, ``bleu4``, ``meteor``
  (percent), ``ent4`` (nats), ``dist1``, ``dist2`` (percent), ``avg_len`` (words), and
  ``meteor_synonyms`` (bool: whether WordNet synonyms were matched).
* ``summary_table`` (summarisation appendix): ``rouge1``, ``rouge2``, ``rougeL`` (percent).

The metric classes themselves return fractions; only these tables scale to percent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cblight.metrics.coherence import SHORT_CONTEXT, context_sensitivity
from cblight.metrics.dialog import (
    Normalize,
    corpus_bleu,
    corpus_nist_score,
    meteor,
    ngram_diversity,
    response_length,
)
from cblight.metrics.rouge import rouge
from cblight.metrics.text_stats import (
    TokenDocs,
    long_range_repetition,
    repetition_rate,
    self_bleu,
    zipf_coefficient,
)


def generation_table(
    model: Any,
    contexts: TokenDocs,
    generations: TokenDocs,
    *,
    prefix: Sequence[int] = (),
    eos_token_id: int | None = None,
    k: int = SHORT_CONTEXT,
    self_bleu_samples: int | None = 1000,
    seed: int = 0,
    batch_size: int = 8,
    pad_id: int = 0,
) -> dict[str, float]:
    """Table 2's columns for one set of completions (or the human continuations) under ``model``.

    ``contexts``: prompt ids as the model read them (special prefix included, see ``prefix``);
    ``generations``: the continuation ids; ``eos_token_id``: dropped from a generation's end before
    the repetition test (GPT-2: 50256).
    """
    base = context_sensitivity(
        model, contexts, generations, k=k, prefix=prefix, batch_size=batch_size, pad_id=pad_id
    )
    lr = long_range_repetition(generations, (50, 100))
    return {
        "ppl": base["ppl"],
        "self_bleu4": self_bleu(generations, 4, self_bleu_samples, seed),
        "zipf": zipf_coefficient(generations),
        "rep": 100 * repetition_rate(generations, eos_token_id=eos_token_id),
        "lr_50": 100 * lr["lr_50"],
        "lr_100": 100 * lr["lr_100"],
        "delta": 100 * base["delta"],
        "ltf": 100 * base["ltf"],
    }


def dialog_table(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    *,
    normalize: Normalize = "dstc",
    use_synonyms: bool | None = None,
) -> dict[str, Any]:
    """Table 3's columns for one set of responses against their reference lists."""
    nist = corpus_nist_score(hypotheses, references, (2, 4), normalize)
    bleu = corpus_bleu(hypotheses, references, (2, 4), normalize)
    met = meteor(hypotheses, references, normalize, use_synonyms)
    div = ngram_diversity(hypotheses, (1, 2), (4,), normalize)
    return {
        "nist2": nist["nist2"],
        "nist4": nist["nist4"],
        "bleu2": 100 * bleu["bleu2"],
        "bleu4": 100 * bleu["bleu4"],
        "meteor": 100 * met["meteor"],
        "meteor_synonyms": bool(met["meteor_synonyms"]),
        "ent4": div["ent4"],
        "dist1": 100 * div["dist1"],
        "dist2": 100 * div["dist2"],
        "avg_len": response_length(hypotheses, normalize),
    }


def summary_table(
    predictions: Sequence[str], references: Sequence[str | Sequence[str]], *, use_stemmer: bool = True
) -> dict[str, float]:
    """The summarisation table's ROUGE-1/2/L F-measures in percent."""
    return {
        key: 100 * value for key, value in rouge(predictions, references, use_stemmer=use_stemmer).items()
    }
