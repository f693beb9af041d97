"""Tuned vs boosted vs base: several checkpoints through one evaluate.py invocation."""

import json

import pytest

from cblight.cli import evaluate_cli
from cblight.tiny import build_tiny_gpt2
from tests.helpers import ROOT

DEMO = ROOT / "cblight" / "assets" / "demo_data"
WEBTEXT = ROOT / "tests" / "fixtures" / "webtext"


@pytest.fixture(scope="module")
def other_gpt2(tmp_path_factory):
    return build_tiny_gpt2(tmp_path_factory.mktemp("models") / "other-gpt2", seed=1)


def test_multiple_choice_comparison_table(tiny_gpt2_dir, other_gpt2, tmp_path):
    out = tmp_path / "cmp"
    payload = evaluate_cli(
        ["--model.model", str(tiny_gpt2_dir), "--model.output_dir", str(out), "--data.tasks", "[copa, lambada]",
         "--data.data_root", str(DEMO), "--model.ks", "[2, 4]", "--trainer.accelerator", "cpu",
         "--trainer.enable_progress_bar", "false",
         "--compare", json.dumps({"base": str(tiny_gpt2_dir), "tuned": str(other_gpt2)})]
    )  # fmt: skip
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["checkpoints"] == {"base": str(tiny_gpt2_dir), "tuned": str(other_gpt2)}
    for label in ("base", "tuned"):
        run = json.loads((out / label / "results.json").read_text())["tasks"]
        assert run["copa"]["report"] == payload["runs"][label]["copa"]["report"]
        row = next(r for r in payload["rows"] if r["task"] == "copa")
        assert row[label] == pytest.approx(100 * run["copa"]["report"]["acc_base"])
        assert row[f"{label} + CB"] == pytest.approx(100 * run["copa"]["report"]["acc"])
        assert row[f"{label} alpha*"] == run["copa"]["report"]["alpha_star"]
    avg = payload["rows"][-1]
    assert avg["task"] == "average"
    assert avg["base"] == pytest.approx(sum(r["base"] for r in payload["rows"][:2]) / 2)
    # the two checkpoints differ, so their log-likelihoods do
    a = (out / "base/predictions/copa.validation.jsonl").read_text()
    b = (out / "tuned/predictions/copa.validation.jsonl").read_text()
    assert a != b
    metrics = (next((out / "logs").glob("version_*")) / "metrics.csv").read_text()
    assert "test/copa/base/acc" in metrics and "test/copa/tuned/acc" in metrics


def test_generation_comparison_uses_the_base_lm_for_ppl(tiny_gpt2_dir, other_gpt2, tmp_path):
    out = tmp_path / "cmpgen"
    payload = evaluate_cli(
        ["--model", "BoostedGenerationEvaluator", "--model.model", str(tiny_gpt2_dir),
         "--model.max_new_tokens", "8", "--model.self_bleu_samples", "null",
         "--model.decodings", '[{"name": "greedy"}, {"name": "boost", "boosting": {"mode": "auto", "k": 3, "alpha": -0.5}}]',
         "--model.output_dir", str(out), "--data.tasks", "[webtext]",
         "--data.data_dirs", json.dumps({"webtext": str(WEBTEXT)}), "--trainer.accelerator", "cpu",
         "--trainer.enable_progress_bar", "false",
         "--compare", json.dumps({"base": str(tiny_gpt2_dir), "tuned": str(other_gpt2)})]
    )  # fmt: skip
    rows = [(r["checkpoint"], r["decoding"]) for r in payload["rows"]]
    assert rows == [
        ("base", "greedy"),
        ("base", "boost"),
        ("tuned", "greedy"),
        ("tuned", "boost"),
        ("human", "human"),
    ]
    tuned = json.loads((out / "tuned/results.json").read_text())
    assert tuned["metrics_model"] == str(tiny_gpt2_dir)  # Table 2's ppl/LTF/delta under the base LM
    assert "Human" in payload["summary"] and "tuned: boost" in payload["summary"]


def test_compare_needs_two_checkpoints(tiny_gpt2_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        evaluate_cli(["--model.model", str(tiny_gpt2_dir), "--model.output_dir", str(tmp_path / "o"),
                      "--data.tasks", "[copa]", "--data.data_root", str(DEMO),
                      "--compare", json.dumps({"base": str(tiny_gpt2_dir)})])  # fmt: skip
    assert exc.value.code == 2 and "at least two checkpoints" in capsys.readouterr().err
