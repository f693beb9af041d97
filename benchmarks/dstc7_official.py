"""cblight's Table 3 dialog metrics against the official DSTC7 evaluation, on three real hypothesis sets.

Reads ``tests/fixtures/dstc7_official`` (1000 DSTC7 responses x 3 references per set, and the figures that
DialoGPT's ``dstc/dstc.py --clean`` printed for them: ``mteval-v14c.pl``, the METEOR 1.5 jar,
``dstc/metrics.py``) and prints, per set and metric, the official value, cblight's (the default
``dialog_table`` route: mteval BLEU/NIST, the METEOR jar) and nltk's variants, with the time each took::

    python benchmarks/dstc7_official.py                    # all three sets
    python benchmarks/dstc7_official.py --sets unrelated   # one
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from cblight.metrics import (
    corpus_bleu,
    corpus_nist_score,
    meteor,
    ngram_diversity,
    nltk_corpus_bleu,
    nltk_corpus_nist,
    nltk_meteor,
    response_length,
)

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "dstc7_official"
SETS = ("perturbed", "unrelated", "with_empty")
DIGITS = {"NIST-2": 4, "NIST-4": 4, "METEOR": 3}  # the official NIST has 4 decimals; the rest 2


def official_rows(scores: dict) -> dict[str, float]:
    return {
        "NIST-2": scores["nist"][1],
        "NIST-4": scores["nist"][3],
        "BLEU-2": 100 * scores["bleu"][1],
        "BLEU-4": 100 * scores["bleu"][3],
        "METEOR": 100 * scores["meteor"],
        "Ent-4": scores["entropy"][3],
        "Dist-1": 100 * scores["div"][0],
        "Dist-2": 100 * scores["div"][1],
        "avg len": scores["avg_len"],
    }


def cblight_rows(hyps: list[str], refs: list[list[str]]) -> tuple[dict[str, float], float]:
    start = time.perf_counter()
    nist, bleu = corpus_nist_score(hyps, refs), corpus_bleu(hyps, refs)
    div = ngram_diversity(hyps)
    rows = {
        "NIST-2": nist["nist2"],
        "NIST-4": nist["nist4"],
        "BLEU-2": 100 * bleu["bleu2"],
        "BLEU-4": 100 * bleu["bleu4"],
        "METEOR": 100 * meteor(hyps, refs),
        "Ent-4": div["ent4"],
        "Dist-1": 100 * div["dist1"],
        "Dist-2": 100 * div["dist2"],
        "avg len": response_length(hyps),
    }
    return rows, time.perf_counter() - start


def nltk_rows(hyps: list[str], refs: list[list[str]]) -> tuple[dict[str, float], float]:
    start = time.perf_counter()
    nist, bleu = nltk_corpus_nist(hyps, refs), nltk_corpus_bleu(hyps, refs)
    met = nltk_meteor(hyps, refs)
    rows = {
        "NIST-2": nist["nist2"],
        "NIST-4": nist["nist4"],
        "BLEU-2": 100 * bleu["bleu2"],
        "BLEU-4": 100 * bleu["bleu4"],
        "METEOR": 100 * met["meteor_nltk"],
    }
    return rows, time.perf_counter() - start


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    args = parser.parse_args(argv)
    data = json.loads((FIXTURES / "dialog_sets.json").read_text())
    official = json.loads((FIXTURES / "official_scores.json").read_text())["scores"]
    lines = ["| set | metric | official | cblight | nltk |", "|---|---|---|---|---|"]
    times = []
    for name in args.sets:
        ours, t_ours = cblight_rows(data["hyps"][name], data["refs"])
        nltk, t_nltk = nltk_rows(data["hyps"][name], data["refs"])
        times.append(f"{name}: cblight {t_ours:.1f} s, nltk {t_nltk:.1f} s")
        for metric, want in official_rows(official[name]).items():
            d = DIGITS.get(metric, 2)
            theirs = f"{nltk[metric]:.{d}f}" if metric in nltk else "(same)"
            lines.append(f"| {name} | {metric} | {want:.{d}f} | {ours[metric]:.{d}f} | {theirs} |")
    text = "\n".join(lines) + "\n\ntime (METEOR jar start-up included in the first set): " + "; ".join(times)
    print(text)
    return text


if __name__ == "__main__":
    main()
