"""The demo's plumbing on the 2-layer random GPT-2 (``--model tiny --quick``): every step runs through the
real entry points and writes its files. The real model's numbers are checked by the real-model tier."""

import json

import pytest

from cblight import demo

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tiny_quick_demo_runs_every_step(tmp_path, capsys):
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    demo.main(["--model", "tiny", "--quick", "--output_dir", str(tmp_path)])
    # the demo quiets transformers and Lightning only while it runs (later tests read their output)
    assert hf_logging.is_progress_bar_enabled() == was_enabled
    out = capsys.readouterr().out
    for i in range(1, 7):
        assert f"[demo {i}/6] done in" in out
    assert "[demo] summary (random model: the numbers mean nothing)" in out
    lam = json.loads((tmp_path / "lambada" / "results.json").read_text())["tasks"]["lambada"]["report"]
    assert lam["n"] == demo.QUICK.lambada and lam["k_star"] in demo.LAMBADA_KS
    mc = json.loads((tmp_path / "multiple_choice" / "results.json").read_text())["tasks"]
    assert set(mc) == {"csqa", "piqa"} and all(t["report"]["n"] == demo.QUICK.choice for t in mc.values())
    # PIQA's alpha* comes from the shipped held-out validation questions, and results say so
    assert mc["piqa"]["report"]["split"] == "validation (valid.jsonl)"
    assert mc["piqa"]["selection"]["split"].startswith("train (heldout-valid.jsonl) sample of")
    gen = json.loads((tmp_path / "generation" / "results.json").read_text())
    assert {(r["checkpoint"], r["decoding"].split()[0]) for r in gen["rows"]} >= {
        ("base", "nucleus"),
        ("base", "boost"),
        ("tuned", "nucleus"),
        ("tuned", "boost"),
    }
    assert (tmp_path / "tuning" / "hf" / "config.json").is_file()
