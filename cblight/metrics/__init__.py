"""The paper's generation, dialog and summarisation metrics as torchmetrics classes.

Each class reduces its states across processes (sums, or the corpus itself where a corpus-level value
needs it), and each has a functional form. ``cblight.metrics.tables`` gives the paper's Tables 2 and 3.
"""

import types as _types

from cblight.metrics.coherence import ContextSensitivity as ContextSensitivity
from cblight.metrics.coherence import context_sensitivity as context_sensitivity
from cblight.metrics.coherence import generated_token_log_probs as generated_token_log_probs
from cblight.metrics.dialog import CorpusBLEU as CorpusBLEU
from cblight.metrics.dialog import CorpusNIST as CorpusNIST
from cblight.metrics.dialog import NGramDiversity as NGramDiversity
from cblight.metrics.dialog import NltkCorpusBLEU as NltkCorpusBLEU
from cblight.metrics.dialog import NltkCorpusNIST as NltkCorpusNIST
from cblight.metrics.dialog import ResponseLength as ResponseLength
from cblight.metrics.dialog import corpus_bleu as corpus_bleu
from cblight.metrics.dialog import corpus_nist_score as corpus_nist_score
from cblight.metrics.dialog import dstc_clean as dstc_clean
from cblight.metrics.dialog import ngram_diversity as ngram_diversity
from cblight.metrics.dialog import nltk_corpus_bleu as nltk_corpus_bleu
from cblight.metrics.dialog import nltk_corpus_nist as nltk_corpus_nist
from cblight.metrics.dialog import response_length as response_length
from cblight.metrics.dialog_meteor import Meteor as Meteor
from cblight.metrics.dialog_meteor import NltkMeteor as NltkMeteor
from cblight.metrics.dialog_meteor import meteor as meteor
from cblight.metrics.dialog_meteor import nltk_meteor as nltk_meteor
from cblight.metrics.rouge import ROUGE as ROUGE
from cblight.metrics.rouge import rouge as rouge
from cblight.metrics.tables import dialog_table as dialog_table
from cblight.metrics.tables import format_dialog_table as format_dialog_table
from cblight.metrics.tables import generation_table as generation_table
from cblight.metrics.tables import summary_table as summary_table
from cblight.metrics.text_stats import LongRangeRepetition as LongRangeRepetition
from cblight.metrics.text_stats import RepetitionRate as RepetitionRate
from cblight.metrics.text_stats import SelfBLEU as SelfBLEU
from cblight.metrics.text_stats import ZipfCoefficient as ZipfCoefficient
from cblight.metrics.text_stats import long_range_repetition as long_range_repetition
from cblight.metrics.text_stats import repetition_rate as repetition_rate
from cblight.metrics.text_stats import self_bleu as self_bleu
from cblight.metrics.text_stats import zipf_coefficient as zipf_coefficient

# the public API: every name imported above (the submodules, bound by those imports, are not part of it)
__all__ = sorted(
    n for n, v in globals().items() if not n.startswith("_") and not isinstance(v, _types.ModuleType)
)
