"""The paper's generation, dialog and summarisation metrics as torchmetrics classes.

Each class reduces its states across processes (sums, or the corpus itself where a corpus-level value
needs it), and each has a functional form. ``cblight.metrics.tables`` gives the paper's Tables 2 and 3.
"""

from cblight.metrics.coherence import ContextSensitivity, context_sensitivity, generated_token_log_probs
from cblight.metrics.dialog import (
    CorpusBLEU,
    CorpusNIST,
    NGramDiversity,
    NltkCorpusBLEU,
    NltkCorpusNIST,
    ResponseLength,
    corpus_bleu,
    corpus_nist_score,
    dstc_clean,
    ngram_diversity,
    nltk_corpus_bleu,
    nltk_corpus_nist,
    response_length,
)
from cblight.metrics.dialog_meteor import Meteor, NltkMeteor, meteor, nltk_meteor, resolve_meteor_route
from cblight.metrics.rouge import ROUGE, rouge
from cblight.metrics.tables import dialog_table, format_dialog_table, generation_table, summary_table
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
    "NltkCorpusBLEU",
    "NltkCorpusNIST",
    "NltkMeteor",
    "RepetitionRate",
    "ResponseLength",
    "SelfBLEU",
    "ZipfCoefficient",
    "context_sensitivity",
    "corpus_bleu",
    "corpus_nist_score",
    "dialog_table",
    "dstc_clean",
    "format_dialog_table",
    "generated_token_log_probs",
    "generation_table",
    "long_range_repetition",
    "meteor",
    "ngram_diversity",
    "nltk_corpus_bleu",
    "nltk_corpus_nist",
    "nltk_meteor",
    "repetition_rate",
    "resolve_meteor_route",
    "response_length",
    "rouge",
    "self_bleu",
    "summary_table",
    "zipf_coefficient",
]
