"""The paper's generation, dialog and summarisation metrics as torchmetrics classes (DESIGN.md §3).

Each class reduces its states across processes (sums, or the corpus itself where a corpus-level value
needs it), and each has a functional form. ``cblight.metrics.tables`` gives the paper's Tables 2 and 3.
"""

from cblight.metrics.coherence import ContextSensitivity, context_sensitivity, generated_token_log_probs
from cblight.metrics.dialog import (
    CorpusBLEU,
    CorpusNIST,
    Meteor,
    NGramDiversity,
    ResponseLength,
    corpus_bleu,
    corpus_nist_score,
    dstc_clean,
    meteor,
    ngram_diversity,
    response_length,
)
from cblight.metrics.rouge import ROUGE, rouge
from cblight.metrics.tables import dialog_table, generation_table, summary_table
from cblight.metrics.text_stats import (
    LongRangeRepetition,
    RepetitionRate,
    SelfBLEU,
    ZipfCoefficient,
    long_range_repetition,
    repetition_rate,
    self_bleu,
    zipf_coefficient,
)

__all__ = [
    "ROUGE",
    "ContextSensitivity",
    "CorpusBLEU",
    "CorpusNIST",
    "LongRangeRepetition",
    "Meteor",
    "NGramDiversity",
    "RepetitionRate",
    "ResponseLength",
    "SelfBLEU",
    "ZipfCoefficient",
    "context_sensitivity",
    "corpus_bleu",
    "corpus_nist_score",
    "dialog_table",
    "dstc_clean",
    "generated_token_log_probs",
    "generation_table",
    "long_range_repetition",
    "meteor",
    "ngram_diversity",
    "repetition_rate",
    "response_length",
    "rouge",
    "self_bleu",
    "summary_table",
    "zipf_coefficient",
]
