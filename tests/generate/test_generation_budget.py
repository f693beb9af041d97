"""``cblight generate`` checks its token budget once and fits each prompt once: the budget (``max_new_tokens``
against the model window) once per task, from the checkpoint's config before the model loads, with the same
error and message as ``boosted_generate`` gives a Python caller; each prompt of a batch is fitted to that
budget once, whatever the number of rows decoding it, and nothing fits it again."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from cblight.errors import BoostingError
from tests.helpers import ROOT

WEBTEXT = str(ROOT / "tests" / "fixtures" / "webtext")
TINY_WINDOW = 256  # cblight.tiny's GPT-2: n_positions


def generate(model: Path, out: Path, *extra: str) -> list[str]:
    rows = [{"name": "greedy"}, {"name": "boost", "boosting": {"k": 2, "alpha": -0.5}}]
    return [
        "generate", "-c", str(ROOT / "configs" / "webtext_generation.yaml"), "--model.model", str(model),
        "--data.data_dirs", json.dumps({"webtext": WEBTEXT}), "--data.limit", "2", "--data.batch_size", "1",
        "--model.decodings", json.dumps(rows), "--model.grid", "null", "--model.self_bleu_samples", "null",
        "--model.output_dir", str(out), "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false",
        *extra,
    ]  # fmt: skip


def test_the_budget_is_checked_once_and_each_prompt_fitted_once(
    cli, tiny_gpt2_dir, tmp_path, capsys, monkeypatch
):
    import cblight.generate.decode as decode
    import cblight.generate.generation_evaluator as generation

    budgets, decode_budgets, fits, prepared = [], [], Counter(), []
    real_room, real_fit, real_prepare = (
        generation.prompt_room,
        generation.fit_example,
        generation.prepare_prompts,
    )

    def room(window, max_new_tokens, option="max_new_tokens"):
        budgets.append((window, max_new_tokens, option))
        return real_room(window, max_new_tokens, option)

    def fit(tokenizer, example, budget):
        fits[example.idx] += 1
        return real_fit(tokenizer, example, budget)

    def prepare(*args, **kwargs):
        prepared.append(kwargs.get("room"))
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(generation, "prompt_room", room)
    monkeypatch.setattr(decode, "prompt_room", lambda *a, **k: decode_budgets.append(a) or real_room(*a, **k))
    monkeypatch.setattr(generation, "fit_example", fit)
    monkeypatch.setattr(generation, "prepare_prompts", prepare)
    status, err, _ = cli(generate(tiny_gpt2_dir, tmp_path / "out", "--model.max_new_tokens", "4"))
    assert status in (0, None), err
    results = json.loads((tmp_path / "out" / "results.json").read_text())["tasks"]["webtext"]
    assert list(results["rows"]) == ["greedy", "boost"] and results["human"] is not None  # 3 rows per batch
    # one task: one budget check, from the checkpoint's config, and none inside the decoding
    assert budgets == [(TINY_WINDOW, 4, "model.max_new_tokens")] and decode_budgets == []
    # two batches of one prompt, each fitted once for its three rows (greedy, boost, human)
    assert fits == {0: 1, 1: 1}
    # each generating row of each batch prepares the fitted prompts without fitting them again
    assert prepared == [None] * 4


def test_a_budget_that_leaves_no_prompt_is_refused_before_the_model_loads(
    cli, tiny_gpt2_dir, tmp_path, capsys, monkeypatch
):
    import cblight.evaluator as base
    import cblight.generate.generation_evaluator as generation

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the budget was checked")

    monkeypatch.setattr(base, "build_causal_lm", load)  # the evaluator builds its model through sharding.py
    monkeypatch.setattr(generation, "load_causal_lm", load)  # the metrics model
    status, err, _ = cli(generate(tiny_gpt2_dir, tmp_path / "out", "--model.max_new_tokens", "256"))
    assert status == 2
    assert err[-1:] == [
        "error: model.max_new_tokens=256 leaves no room for a prompt in the model window of 256 tokens; set "
        "model.max_new_tokens to 255 or less"
    ], err
    assert not (tmp_path / "out" / "results.json").exists()


def test_boosted_generate_refuses_the_same_budget_at_its_entry(tiny_gpt2_dir):
    from cblight.generate import boosted_generate
    from cblight.models import load_causal_lm, load_tokenizer

    model, tok = load_causal_lm(str(tiny_gpt2_dir)), load_tokenizer(str(tiny_gpt2_dir))
    with pytest.raises(BoostingError) as err:
        boosted_generate(model, tok, ["Hello there"], max_new_tokens=300)
    assert str(err.value) == (
        "max_new_tokens=300 leaves no room for a prompt in the model window of 256 tokens; set max_new_tokens "
        "to 255 or less"
    )
    with pytest.raises(BoostingError, match=r"max_new_tokens=9 leaves no room .* window of 8 tokens"):
        boosted_generate(model, tok, ["Hello there"], max_new_tokens=9, max_length=8)
