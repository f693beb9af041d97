"""benchmarks/tuning_evidence.py end to end on a tiny model and a few WebText-format documents (the real
run reads the GPT-2 output dataset given by --webtext-dir and a real model): one table, one JSON file, every
row's numbers present."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


def test_evidence_script_runs_and_writes_its_table(tiny_gpt2_dir, tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import tuning_evidence
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    words = "the quick brown fox jumps over a lazy dog while the sun sets slowly behind green hills".split()
    for name in ("webtext.valid.jsonl", "webtext.test.jsonl"):
        docs = [
            " ".join(words[i % 5 :] + words[: i % 5]).capitalize() + ". " + " ".join(words[::-1]) + "."
            for i in range(12)
        ]
        (tmp_path / name).write_text("\n".join(json.dumps({"text": d}) for d in docs))
    out = tmp_path / "evidence.json"
    argv = [
        "--device", "cpu", "--model", str(tiny_gpt2_dir), "--webtext-dir", str(tmp_path), "--out", str(out),
        "--teachers", "frozen,live", "--steps", "2", "--batch", "2", "--new", "6", "--k", "4",
        "--eval-prompts", "3", "--gen-tokens", "8", "--gen-batch", "3", "--train-prompts", "8",
    ]  # fmt: skip
    (result,) = tuning_evidence.main(argv)
    printed = capsys.readouterr().out
    assert "KL(boost0||f)" in printed and "+ self-tune (live teacher)" in printed
    assert json.loads(out.read_text())[0]["model"] == str(tiny_gpt2_dir)
    labels = [row["model"] for row in result["rows"]]
    assert labels[:2] == ["base, nucleus", "base + boost (k=4, alpha=-0.4)"] and len(labels) == 4
    base, _boosted, *tuned = result["rows"]
    for row in (base, *tuned):
        assert (
            0 <= row["top1_boosted_initial"] <= 1 and row["kl_boosted_initial"] > 0 and row["human_ppl"] > 1
        )
    for row in result["rows"]:
        assert {"ltf", "delta", "ppl", "repetition"} <= set(row)
