"""METEOR: the official METEOR 1.5 jar (pycocoevalcap's) against the official DSTC7 figures of three real
hypothesis sets and the METEOR 1.5 formula by hand; the route choice and its errors; nltk's variant
against nltk's ``meteor_score``.

The jar needs Java and pycocoevalcap (``.ci/run`` installs both); without them the official tests skip,
saying why. One jar process serves the whole test session (loading its paraphrase table takes ~10 s)."""

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from nltk.translate.meteor_score import meteor_score

import cblight.metrics.dialog_meteor as meteor_module
from cblight.errors import ConfigError
from cblight.metrics import Meteor, NltkMeteor, dialog_table, meteor, nltk_meteor
from cblight.metrics.dialog import dialog_words
from cblight.metrics.dialog_meteor import (
    NO_SYNONYMS,
    official_meteor_missing,
    resolve_meteor_route,
    wordnet_reader,
)
from cblight.metrics.tables import DialogSuite

OFFICIAL = Path(__file__).resolve().parents[1] / "fixtures" / "dstc7_official"
MISSING = official_meteor_missing()
needs_jar = pytest.mark.skipif(MISSING is not None, reason=f"official METEOR cannot run here: {MISSING}")

# METEOR 1.5's English parameters (Denkowski & Lavie 2014): alpha, beta, gamma, delta; module weights
ALPHA, BETA, GAMMA, DELTA = 0.85, 0.2, 0.6, 0.75
W_STEM = 0.6


def fmean(p, r):
    return p * r / (ALPHA * p + (1 - ALPHA) * r)


# -- the official METEOR 1.5 -----------------------------------------------------------------------------


@needs_jar
def test_meteor_jar_hand_computed():
    # "a" / "the" are function words (weight 1 - delta), "cat" / "sat" content words (delta); only "cat"
    # matches: P = 0.75 / (0.75 + 0.25), R = 0.75 / (2 * 0.75 + 0.25); one chunk over one match: the
    # fragmentation penalty is gamma * (1/1)^beta
    p, r = 0.75, 0.75 / 1.75
    assert meteor(["a cat"], [["the cat sat"]]) == pytest.approx(fmean(p, r) * (1 - GAMMA), abs=1e-12)
    # every word aligned, two chunks of three: penalty gamma * (2/6)^beta
    got = meteor(["the cat sat on the mat"], [["on the mat the cat sat"]])
    assert got == pytest.approx(1 - GAMMA * (2 / 6) ** BETA, abs=1e-12)
    # "cats" ~ "cat" by the stem stage (weight 0.6); one chunk covering both sentences: no penalty
    got = meteor(["The cats sat"], [["the cat sat"]])
    assert got == pytest.approx((DELTA * (W_STEM + 1) + (1 - DELTA)) / (DELTA * 2 + (1 - DELTA)), abs=1e-12)
    # the best of several references; the corpus score pools the statistics of both examples
    assert meteor(["the cat sat"], [["a dog", "the cat sat"]]) == pytest.approx(1.0)
    # pooled: "cat sat mat" vs "mat cat sat" has two chunks over three content-word matches; the sums of
    # the weighted lengths and matches, chunks (1 + 2) and matches (1 + 3) of both examples make one score
    pooled = meteor(["a cat", "cat sat mat"], [["the cat sat"], ["mat cat sat"]])
    p, r = (0.75 + 2.25) / (1 + 2.25), (0.75 + 2.25) / (1.75 + 2.25)
    assert pooled == pytest.approx(fmean(p, r) * (1 - GAMMA * (3 / 4) ** BETA), abs=1e-12)


@needs_jar
@pytest.mark.slow
def test_meteor_official_dstc7_figures():
    sets = json.loads((OFFICIAL / "dialog_sets.json").read_text())
    official = json.loads((OFFICIAL / "official_scores.json").read_text())["scores"]
    for name, hyps in sets["hyps"].items():
        metric = Meteor()
        for lo in range(0, len(hyps), 250):  # streamed in batches, scored once as a corpus
            metric.update(hyps[lo : lo + 250], sets["refs"][lo : lo + 250])
        # the same jar on the same statistics as the official file-mode run: equal up to float printing
        assert float(metric.compute()) == pytest.approx(official[name]["meteor"], abs=1e-12), name


@needs_jar
def test_dialog_table_reports_the_official_meteor():
    hyps, refs = ["a cat", "the cat sat"], [["the cat sat"], ["the cat sat"]]
    table = dialog_table(hyps, refs)
    assert "meteor" in table and "meteor_nltk" not in table and "meteor_synonyms" not in table
    assert table["meteor"] == pytest.approx(100 * meteor(hyps, refs))
    assert resolve_meteor_route("auto") == "official"


def test_meteor_jar_that_stops_is_one_clear_error(tmp_path):
    fake_java = tmp_path / "java"
    fake_java.write_text(
        "#!/bin/sh\necho 'Exception in thread main: java.lang.OutOfMemoryError' >&2\nexit 1\n"
    )
    fake_java.chmod(0o755)
    runner = meteor_module.MeteorJar(tmp_path / "meteor-1.5.jar", java=str(fake_java))
    with pytest.raises(RuntimeError, match=r"the METEOR 1.5 jar stopped \(.*OutOfMemoryError\)"):
        runner.corpus_score(["a"], [["a"]])
    runner.close()


def test_official_meteor_without_java_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(meteor_module.shutil, "which", lambda name: None)
    with pytest.raises(
        ConfigError, match=r"no `java` is on PATH: apt-get install default-jre-headless"
    ) as exc:
        Meteor()
    assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match="Java runtime"):
        dialog_table(["a"], [["a"]], meteor="official")
    # auto falls back to nltk's METEOR and says so in the column name
    assert resolve_meteor_route("auto") == "nltk" and "meteor_nltk" in dialog_table(["a"], [["a"]])
    # the evaluate entry point refuses before any work: one "error:" line, exit 2
    from cblight.cli import evaluate_cli

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    with pytest.raises(SystemExit) as stop:
        evaluate_cli(["--model", "BoostedGenerationEvaluator", "--model.meteor", "official",
                      "--model.output_dir", str(tmp_path / "o"), "--data.tasks", "[dstc7]",
                      "--data.data_dirs", json.dumps({"dstc7": str(fixtures / "dstc7")})])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err[-1].startswith("error: meteor='official': ")
    assert "apt-get install default-jre-headless" in err[-1] and not (tmp_path / "o").exists()


def test_official_meteor_without_pycocoevalcap(monkeypatch):
    monkeypatch.setattr(meteor_module.shutil, "which", lambda name: "/usr/bin/java")
    monkeypatch.setattr(meteor_module, "find_meteor_jar", lambda: None)
    with pytest.raises(ConfigError, match=r"pip install 'cblight\[dialog\]'"):
        resolve_meteor_route("official")
    with pytest.raises(ConfigError, match="meteor must be one of"):  # refused by the suite that takes it
        DialogSuite(meteor="jar")


# -- nltk's METEOR ---------------------------------------------------------------------------------------


def random_corpus(seed, n=30):
    rng = random.Random(seed)
    words = ["the", "a", "cat", "cats", "dog", "sat", "sits", "on", "mat", "is", "big", "I", "you", ","]
    hyps = [" ".join(rng.choice(words) for _ in range(rng.randrange(0, 10))) for _ in range(n)]
    refs = [
        [" ".join(rng.choice(words) for _ in range(rng.randrange(1, 10))) for _ in range(1 + i % 3)]
        for i in range(n)
    ]
    return hyps, refs


def test_nltk_meteor_exact_and_stem_stages_hand_computed():
    # "the" and "sat" match exactly, "cats" ~ "cat" by Porter stem: P = R = 1, one chunk of 3 matches
    # -> score = 1 - 0.5 * (1/3)^3
    out = nltk_meteor(["the cats sat"], [["the cat sat"]], use_synonyms=False)
    assert out == {"meteor_nltk": pytest.approx(1 - 0.5 / 27), "meteor_synonyms": 0.0}


def test_nltk_meteor_matches_nltk_over_references():
    hyps, refs = random_corpus(2)
    h, r = dialog_words(hyps, refs)
    metric = NltkMeteor(use_synonyms=False)
    metric.update(hyps, refs)
    ref = np.mean([meteor_score(rr, hh, wordnet=NO_SYNONYMS) for hh, rr in zip(h, r)])
    assert float(metric.compute()["meteor_nltk"]) == pytest.approx(ref, abs=1e-12)


def test_nltk_meteor_reports_synonym_stage():
    available = wordnet_reader() is not None
    assert nltk_meteor(["a"], [["a"]])["meteor_synonyms"] == float(available)
    if available:
        assert NltkMeteor(use_synonyms=True).synonyms
    else:
        with pytest.raises(LookupError, match="WordNet"):
            NltkMeteor(use_synonyms=True)


class _FakeWordNet:
    """A WordNet reader knowing one synset {big, huge}, to exercise the synonym stage offline (nltk looks
    synonyms up after Porter stemming, so the pair must be stems already)."""

    class _Lemma:
        def __init__(self, name):
            self._name = name

        def name(self):
            return self._name

    class _Synset:
        def lemmas(self):
            return [_FakeWordNet._Lemma("big"), _FakeWordNet._Lemma("huge")]

    def synsets(self, word, *args, **kwargs):
        return [self._Synset()] if word in ("big", "huge") else []


def test_nltk_meteor_synonym_stage_when_wordnet_is_there(monkeypatch):
    # without synonyms "a" and "cat" match in 2 chunks: P = R = 2/3, score = 2/3 * (1 - 0.5 * 1)
    off = nltk_meteor(["a big cat"], [["a huge cat"]], use_synonyms=False)
    assert off == {"meteor_nltk": pytest.approx(1 / 3), "meteor_synonyms": 0.0}
    monkeypatch.setattr(meteor_module, "wordnet_reader", lambda: _FakeWordNet())
    on = nltk_meteor(["a big cat"], [["a huge cat"]])
    assert on == {"meteor_nltk": pytest.approx(1 - 0.5 / 27), "meteor_synonyms": 1.0}
    assert math.isclose(on["meteor_nltk"], 1 - 0.5 / 27)


def test_meteor_bad_input():
    with pytest.raises(ValueError, match="2 hypotheses but 1 reference lists"):
        nltk_meteor(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="empty corpus"):
        nltk_meteor([], [])


@needs_jar
def test_official_comparison_script(capsys):
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "dstc7_official.py"
    spec = importlib.util.spec_from_file_location("dstc7_official", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rows = [line.split(" | ") for line in script.main(["--sets", "unrelated"]).splitlines()[2:11]]
    assert [r[1] for r in rows] == [
        "NIST-2",
        "NIST-4",
        "BLEU-2",
        "BLEU-4",
        "METEOR",
        "Ent-4",
        "Dist-1",
        "Dist-2",
    ] + ["avg len"]
    assert all(official == ours for _, _, official, ours, _ in rows)  # equal to the printed digits
    assert rows[4][4] == "6.505 |"  # nltk's METEOR, far from the official 4.361
