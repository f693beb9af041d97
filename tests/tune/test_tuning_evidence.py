"""benchmarks/tuning_evidence.py end to end on a tiny model and a few WebText-format documents (the real
run reads the GPT-2 output dataset given by --webtext-dir and a real model): one table, one JSON file, every
row's numbers present."""

import json
import sys

import pytest

from tests.helpers import ROOT

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
        "--teachers", "frozen,live+trust=0.5", "--steps", "2", "--batch", "2", "--new", "6", "--k", "4",
        "--eval-prompts", "3", "--gen-tokens", "8", "--gen-batch", "3", "--train-prompts", "8",
        "--lambada-dir", str(ROOT / "tests" / "fixtures" / "lambada"), "--lambada-passages", "3",
    ]  # fmt: skip
    (result,) = tuning_evidence.main(argv)
    printed = capsys.readouterr().out
    assert "KL(boost0||f)" in printed and "+ self-tune (live+trust=0.5 teacher)" in printed
    assert json.loads(out.read_text())[0]["model"] == str(tiny_gpt2_dir)
    labels = [row["model"] for row in result["rows"]]
    assert labels[:2] == ["base, nucleus", "base + boost (k=4, alpha=-0.4)"] and len(labels) == 4
    base, _boosted, *tuned = result["rows"]
    for row in (base, *tuned):
        assert (
            0 <= row["top1_boosted_initial"] <= 1 and row["kl_boosted_initial"] > 0 and row["human_ppl"] > 1
        )
    for row in result["rows"]:
        assert {"ltf", "delta", "ppl", "repetition", "lambada_acc"} <= set(row)


def test_lambada_accuracy_matches_one_forward_per_passage(tiny_gpt2_dir):
    """The evidence's LAMBADA accuracy (cblight evaluate's functions) against the definition: the argmax of
    ``log f_max + alpha log f_k``, one unpadded forward per passage and per window. Half of the passages end
    in the model's own top token, so that the accuracy is neither 0 nor 1."""
    import torch

    from cblight.models import load_causal_lm, load_tokenizer
    from cblight.scoring import Encoder

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import tuning_evidence
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    model, tok = load_causal_lm(str(tiny_gpt2_dir)), load_tokenizer(str(tiny_gpt2_dir))
    enc = Encoder(tok)
    words = "the quick brown fox jumps over a lazy dog while the sun sets slowly behind green hills".split()
    passages = []
    with torch.no_grad():
        for i in range(8):
            ids = enc.context(" ".join(words[i:] + words[:i]))
            if i % 2:  # end in the model's top token, where the text round-trips
                top = int(model(input_ids=torch.tensor([ids[:-1]])).logits[0, -1].argmax())
                text = tok.decode(ids[:-1] + [top])
                if enc.context(text) == ids[:-1] + [top]:
                    passages.append(text)
                    continue
            passages.append(tok.decode(ids))

    def brute(alpha: float, k: int = 3) -> float:
        hits = 0
        with torch.no_grad():
            for text in passages:
                ids = enc.context(text)
                full = torch.log_softmax(model(input_ids=torch.tensor([ids[:-1]])).logits[0, -1], -1)
                short = torch.log_softmax(model(input_ids=torch.tensor([ids[-1 - k : -1]])).logits[0, -1], -1)
                hits += int((full + alpha * short).argmax()) == ids[-1]
        return hits / len(passages)

    ours = tuning_evidence.lambada_accuracy(model, tok, passages, 3, [0.0, -0.3, -0.8])
    assert 0 < ours[0.0] < 1
    for alpha, acc in ours.items():
        assert acc == brute(alpha), alpha
