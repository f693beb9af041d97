"""The ``adaptive`` row of ``cblight evaluate`` (docs/adaptive.md) on a tiny random GPT-2 and the bundled demo
data: recomputed independently (multiple choice: the rule by hand from the predictions file; LAMBADA: a
naive one-passage-at-a-time model loop on the full and the last-sentence context, AdaCAD's weight by hand),
and every other number identical to a run without the rule.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from cblight.adaptive import unit_k
from cblight.cli import evaluate_cli
from cblight.data.registry import RenderContext, get_task
from cblight.data.sources import read_jsonl
from cblight.models import load_causal_lm, load_tokenizer
from cblight.scoring import Encoder
from tests.helpers import EVAL_QUIET_CPU

DEMO = Path(__file__).resolve().parents[2] / "cblight" / "assets" / "demo_data"
ARGS = ["--data.tasks", "[copa, lambada]", "--data.batch_size", "3", "--model.batch_size", "4"]
ARGS += ["--model.ks", "[1, 3, 6]", "--model.next_token_alphas", "[0.0, -0.5, -1.0]"]

pytestmark = pytest.mark.usefixtures("one_thread")


def run(model_dir: Path, out: Path, *extra: str) -> dict:
    evaluate_cli(
        [
            "--data.data_root",
            str(DEMO),
            "--model.output_dir",
            str(out),
            "--model.model",
            str(model_dir),
            *EVAL_QUIET_CPU,
            *ARGS,
            *extra,
        ]
    )
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def runs(tiny_gpt2_dir, tmp_path_factory):
    plain_dir = tmp_path_factory.mktemp("plain")
    plain = run(tiny_gpt2_dir, plain_dir)
    adaptive_dir = tmp_path_factory.mktemp("adaptive")
    shutil.copytree(plain_dir / "cache", adaptive_dir / "cache")  # the multiple-choice rule needs no new pass
    adaptive = run(tiny_gpt2_dir, adaptive_dir, "--model.adaptive", "auto")
    return plain, adaptive, adaptive_dir


@pytest.fixture(scope="module")
def per_passage(runs, tiny_gpt2_dir, tmp_path_factory):
    """The per-passage ``jsd`` rule on the ``auto`` run's cache (only the rule's own numbers are new)."""
    out = tmp_path_factory.mktemp("jsd")
    shutil.copytree(runs[2] / "cache", out / "cache")
    return run(tiny_gpt2_dir, out, "--model.adaptive", "jsd"), out


def predictions(out: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions" / name).read_text().splitlines()]


def test_every_other_number_is_unchanged(runs):
    plain, adaptive, _ = runs
    for task in ("copa", "lambada"):
        a, b = plain["tasks"][task], adaptive["tasks"][task]
        extra = {k for k in b["report"] if "adaptive" in k}
        assert extra == {"acc_adaptive", "acc_adaptive_stderr", "adaptive"} | (
            {"ppl_adaptive"} if task == "lambada" else set()
        )
        assert {k: v for k, v in b["report"].items() if k not in extra} == a["report"]
        assert b["sweep"] == a["sweep"] and b["selection"] == a["selection"]
    assert "acc@adaptive" in adaptive["summary"] and "acc@adaptive" not in plain["summary"]


def decorrelate_by_hand(rows: list[dict]) -> float:
    num = den = 0.0
    for r in rows:  # pooled slope of full on premise-free scores, each question centred on its answers
        f, s = r["ll_full"], r["ll_short"]
        fm, sm = sum(f) / len(f), sum(s) / len(s)
        num += sum((x - fm) * (y - sm) for x, y in zip(f, s))
        den += sum((y - sm) ** 2 for y in s)
    return -num / den


def check_rows(out: Path, report: dict, alpha: float, rule: str) -> None:
    rows = predictions(out, "copa.validation.jsonl")
    hits = 0
    for r in rows:
        assert r["alpha_adaptive"] == pytest.approx(alpha, abs=1e-12)
        scores = [f + alpha * s for f, s in zip(r["ll_full"], r["ll_short"])]
        pred = scores.index(max(scores))
        assert r["pred_adaptive"] == pred
        hits += pred == r["label"]
    assert report["acc_adaptive"] == hits / len(rows)
    assert report["acc_adaptive_stderr"] == pytest.approx(math.sqrt(hits / 10 * (1 - hits / 10) / 10))
    assert report["adaptive"]["rule"] == rule
    assert report["adaptive"]["alpha_mean"] == pytest.approx(alpha) and report["adaptive"]["alpha_sd"] < 1e-12


def test_multiple_choice_auto_is_the_gate_then_decorrelate_by_hand(runs):
    _, adaptive, out = runs
    rows = predictions(out, "copa.validation.jsonl")
    bits = []
    for r in rows:  # the JSD (bits) of each question's full and premise-free answer distributions
        p, q = (torch.softmax(torch.tensor(r[k], dtype=torch.float64), 0) for k in ("ll_full", "ll_short"))
        m = (p + q) / 2
        bits.append(float(((p * (p / m).log()).sum() + (q * (q / m).log()).sum()) / 2 / math.log(2)))
    mean = sum(bits) / len(bits)
    stderr = math.sqrt(sum((b - mean) ** 2 for b in bits) / (len(bits) - 1) / len(bits))
    same_prior = all(r["ll_short"] == rows[0]["ll_short"] for r in rows)  # one fixed label set: calibrate
    alpha = decorrelate_by_hand(rows) if same_prior or mean - 2 * stderr >= 0.1 else 0.0
    report = adaptive["tasks"]["copa"]["report"]
    check_rows(out, report, alpha, "gated")
    gate = report["adaptive"]["gate"]  # what the gate read, in results.json
    assert gate["context_gain"] == pytest.approx(mean, abs=1e-9)
    assert gate["stderr"] == pytest.approx(stderr, abs=1e-9)
    assert gate["same_prior"] is same_prior
    assert gate["prior_share"] is None  # the fixed-label-set gate reads nothing where the priors differ


def test_fixed_label_set_gate_is_the_prior_share_by_hand(tiny_gpt2_dir, tmp_path):
    # SST-5's five labels after one premise-free context: the gate is the share of the split's mean label
    # preference that lies along the prior (docs/adaptive.md), recomputed here from the predictions file
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "sst5"
    result = run(tiny_gpt2_dir, tmp_path, "--model.adaptive", "auto", "--data.tasks", "[sst5]",
                 "--data.data_dirs", json.dumps({"sst5": str(fixtures)}))  # fmt: skip
    rows = predictions(tmp_path, "sst5.test.jsonl")
    prior = rows[0]["ll_short"]
    assert all(r["ll_short"] == pytest.approx(prior, abs=1e-4) for r in rows)  # one prior (float32 batches)
    centred = [[v - sum(r["ll_full"]) / 5 for v in r["ll_full"]] for r in rows]
    m = [sum(c[a] for c in centred) / len(rows) for a in range(5)]
    p = [v - sum(prior) / 5 for v in prior]
    dot = sum(x * y for x, y in zip(m, p))
    share = dot**2 / (sum(x * x for x in m) * sum(y * y for y in p))
    report = result["tasks"]["sst5"]["report"]
    gate = report["adaptive"]["gate"]
    assert gate["same_prior"] is True
    # the same stored scores through float64 sums in another order: rounding is ~1e-15, 1e-9 leaves room
    assert gate["prior_share"] == pytest.approx(share, abs=1e-9)
    alpha = decorrelate_by_hand(rows) if share >= 0.5 else 0.0
    for r in rows:
        assert r["alpha_adaptive"] == pytest.approx(alpha, abs=1e-9)


def test_multiple_choice_decorrelate_by_hand(runs, tiny_gpt2_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("decorrelate")
    shutil.copytree(runs[2] / "cache", out / "cache")  # the same numbers: no model pass
    result = run(tiny_gpt2_dir, out, "--model.adaptive", "decorrelate", "--data.tasks", "[copa]")
    alpha = decorrelate_by_hand(predictions(out, "copa.validation.jsonl"))
    check_rows(out, result["tasks"]["copa"]["report"], alpha, "decorrelate")


def naive_lambada(model_dir: Path) -> list[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """Per passage of the demo test file: ``(k, target, log f_max, log f_k)`` from one model call each on
    the whole context and on its last sentence (float64 log-softmax)."""
    model = load_causal_lm(str(model_dir))
    tok = load_tokenizer(str(model_dir))
    enc = Encoder(tok)
    spec = get_task("lambada")
    out = []
    for idx, rec in enumerate(read_jsonl(DEMO / "lambada" / "test.jsonl")):
        ids = enc.context(spec.render(rec, idx, RenderContext(split="test")).text)
        ctx, target = ids[:-1], ids[-1]
        k = unit_k([tok.decode([t]) for t in ctx], "sentence")
        with torch.no_grad():
            full = torch.log_softmax(model(torch.tensor([ctx])).logits[0, -1].double(), -1)
            short = torch.log_softmax(model(torch.tensor([ctx[-k:]])).logits[0, -1].double(), -1)
        out.append((k, target, full, short))
    return out


def adacad_alpha(full: torch.Tensor, short: torch.Tensor, distance: bool = False) -> float:
    """AdaCAD's next-token alpha from the JSD in bits, or (``distance``) from its square root."""
    p, q = full.exp(), short.exp()
    m = (p + q) / 2
    a = 0.5 * float((p * (p / m).log()).sum() + (q * (q / m).log()).sum()) / math.log(2)
    a = math.sqrt(a) if distance else a
    return -a / (1 + a)


def test_lambada_rows_match_a_naive_model_loop(runs, per_passage, tiny_gpt2_dir):
    passages = naive_lambada(tiny_gpt2_dir)
    alphas = [adacad_alpha(full, short) for _, _, full, short in passages]
    # jsdist_mean (auto): one alpha for the split, the mean of the passages' own under the JS distance,
    # rounded to 0.01
    distances = [adacad_alpha(full, short, distance=True) for _, _, full, short in passages]
    split_alpha = round(sum(distances) / len(distances), 2)
    for result, out, per_row in ((runs[1], runs[2], False), (per_passage[0], per_passage[1], True)):
        by_id = {r["id"]: r for r in predictions(out, "lambada.test.jsonl")}
        hits, log_probs = 0, []
        for idx, (k, target, full, short) in enumerate(passages):
            alpha = alphas[idx] if per_row else split_alpha
            mixed = torch.log_softmax(full + alpha * short, -1)
            row = by_id[idx]
            assert row["k_adaptive"] == k
            # float32 model and mixing against this float64 loop: alphas of magnitude < 1 agree to ~1e-6
            assert row["alpha_adaptive"] == pytest.approx(alpha, abs=1e-5)
            assert row["correct_adaptive"] == (int(mixed.argmax()) == target)
            hits += int(mixed.argmax()) == target
            log_probs.append(float(mixed[target]))
        report = result["tasks"]["lambada"]["report"]
        assert report["acc_adaptive"] == hits / len(passages)
        # perplexity: exp of a mean of float32 log-probs of magnitude ~10 vs float64: 1e-4 relative is 100x
        assert report["ppl_adaptive"] == pytest.approx(math.exp(-sum(log_probs) / len(log_probs)), rel=1e-4)
        assert report["adaptive"]["rule"] == ("jsd" if per_row else "jsdist_mean")
        assert report["adaptive"]["unit"] == "sentence"


@pytest.mark.parametrize(
    "rule, message",
    [
        (
            "cocoa",
            "--model.adaptive: task copa: adaptive rule 'cocoa' does not apply to multiple-choice tasks; "
            "use auto or one of gated, jsd, jsd_mean, decorrelate, balance",
        ),
        (
            "nope",
            "model.adaptive must be one of 'auto', 'gated', 'jsd', 'jsdist', 'cocoa', 'jsd_mean', 'jsdist_mean', 'decorrelate', 'balance' or null, "
            "got 'nope'",
        ),
    ],
)
def test_a_rule_that_does_not_apply_is_refused_before_loading(
    rule, message, tiny_gpt2_dir, tmp_path, capsys, monkeypatch
):
    import cblight.data.datamodule as datamodule
    import cblight.evaluator as base

    def tripwire(*args, **kwargs):
        raise AssertionError("loaded before the refusal")

    monkeypatch.setattr(base, "build_causal_lm", tripwire)
    monkeypatch.setattr(datamodule.EvalDataModule, "loader_splits", tripwire)
    with pytest.raises(SystemExit) as exc:
        evaluate_cli(
            [
                "--data.data_root",
                str(DEMO),
                "--model.output_dir",
                str(tmp_path),
                "--model.model",
                str(tiny_gpt2_dir),
                *EVAL_QUIET_CPU,
                "--data.tasks",
                "[copa]",
                "--model.adaptive",
                rule,
            ]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"error: {message}"
