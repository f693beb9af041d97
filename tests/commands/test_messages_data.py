"""Data, models and the served backend: every message names the fix, before any work.

Each case types the user's command in process (``cblight.__main__.main``, as the console script runs it)
and checks the exit status and the one ``error:`` line, with tripwires on the loaders where "before any
work" is the point. docs/errors.md lists these messages (section "every message names the fix (data, models, served backend)"). The served backend's
refused connection is ``tests/served/test_served_client.py``; the zoo's install command ``tests/core/test_zoo.py``.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from tests.helpers import (
    EVAL_QUIET_CPU,
    ROOT,
    assert_refused,
)

FIXTURES = ROOT / "tests" / "fixtures"
DEMO = ROOT / "cblight" / "assets" / "demo_data"
REALDATA = ROOT / "cblight" / "assets" / "realdata"
MC_CONFIG = str(ROOT / "configs" / "multiple_choice.yaml")


class Loaded(AssertionError):
    pass


def refused(cli, *args: str, names: str | tuple[str, ...] = (), fix: str | tuple[str, ...] = ()) -> str:
    """The command exits 2 with exactly one ``error:`` line and no traceback after it, which names ``names``
    and gives ``fix`` (``assert_refused``); that line."""
    status, err, _ = cli(list(args))
    return assert_refused(status, err, names=names, fix=fix)


def evaluate(out: Path, *args: str) -> list[str]:
    """``cblight evaluate ARGS`` writing to ``out`` (after ``args``: a config's output_dir would win)."""
    return ["evaluate", *args, "--model.output_dir", str(out), *EVAL_QUIET_CPU]


@pytest.fixture
def no_model_loading(monkeypatch):
    """Tripwires on the weights: a refusal that needs only configs and tokenizers comes before them."""
    import cblight.evaluator as base
    import cblight.models as models

    def model(*args, **kwargs):
        raise Loaded("model weights were loaded before the bad input was refused")

    monkeypatch.setattr(models, "load_causal_lm", model)
    monkeypatch.setattr(base, "build_causal_lm", model)


@pytest.fixture
def no_data_loading(monkeypatch):
    import cblight.data.datamodule as datamodule

    def data(*args, **kwargs):
        raise Loaded("data was read before the bad input was refused")

    monkeypatch.setattr(datamodule, "load_split_records", data)


# -- 2: max_length past the model's window ---------------------------------------------------------------


def test_max_length_past_learned_positions_is_refused_before_any_work(
    cli, tiny_gpt2_dir, tmp_path, capsys, no_model_loading, no_data_loading
):
    """Was: the selection pass ran, then ``IndexError: index out of range in self`` from the test loop."""
    out = tmp_path / "out"
    line = refused(
        cli,
        *evaluate(out, "-c", MC_CONFIG, "--model.model", str(tiny_gpt2_dir), "--data.tasks", "[copa]"),
        "--model.max_length", "4096",
    )  # fmt: skip
    assert line == (
        f"error: model.max_length 4096 exceeds the window of {tiny_gpt2_dir} (256 positions, n_positions in "
        "its config): its learned absolute position embeddings end there; use model.max_length 256 or less, "
        "or leave it unset to use the whole window"
    )
    assert not out.exists()


def test_max_length_past_a_rotary_window_warns_once_and_runs(cli, tiny_llama_dir, tmp_path, capsys, caplog):
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="cblight.models"):
        status, err, _ = cli([
            *evaluate(out, "-c", MC_CONFIG, "--model.model", str(tiny_llama_dir), "--data.tasks", "[copa]"),
            "--data.data_root", str(DEMO), "--data.limit", "2", "--model.max_length", "4096",
            "--model.choice_alphas", "[0.0, -1.0]",
        ])  # fmt: skip
    assert status in (0, None), err[-30:]
    warnings = [r.getMessage() for r in caplog.records if r.name == "cblight.models"]
    # once, though both the early check and the scorer see the window
    assert warnings == [
        f"model.max_length 4096 exceeds the window {tiny_llama_dir} was trained on (256 positions, "
        "max_position_embeddings in its config): its rotary positions extrapolate beyond it, where quality "
        "usually drops; going on"
    ]
    assert (out / "results.json").is_file()


@pytest.mark.parametrize(
    ("name", "encoding"),
    [
        ("GPT2", "absolute"),
        ("OPT", "absolute"),
        ("GPTNeo", "absolute"),
        ("Llama", "rotary"),
        ("GPTNeoX", "rotary"),
        ("Phi", "rotary"),
        ("Bloom", "alibi"),
    ],
)
def test_position_encoding_agrees_with_what_the_model_does_past_its_window(name, encoding):
    """The reference is the model itself: a tiny random one of each architecture run on one token more
    than its window. Learned absolute positions fail there (what the refusal prevents); rotary and ALiBi
    positions run (what the warning allows)."""
    import torch
    import transformers

    from cblight.models import position_encoding

    window = 8
    sizes = {
        "GPT2": dict(n_embd=16, n_layer=1, n_head=2, n_positions=window),
        "OPT": dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=32,
                    word_embed_proj_dim=16, max_position_embeddings=window),
        "GPTNeo": dict(hidden_size=16, num_layers=1, num_heads=2, attention_types=[[["global"], 1]],
                       max_position_embeddings=window),
        "Llama": dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                      max_position_embeddings=window),
        "GPTNeoX": dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=window),
        "Phi": dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                    max_position_embeddings=window),
        "Bloom": dict(hidden_size=16, n_layer=1, n_head=2, seq_length=window),
    }  # fmt: skip
    config = getattr(transformers, f"{name}Config")(vocab_size=64, **sizes[name])
    assert position_encoding(config) == encoding
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 64, (1, window + 1))
    if encoding == "absolute":
        with pytest.raises(IndexError):
            model(ids)
    else:
        assert model(ids).logits.shape == (1, window + 1, 64)


def test_max_length_below_two_is_refused(cli, tiny_gpt2_dir, tmp_path, capsys, no_model_loading):
    line = refused(
        cli, *evaluate(tmp_path / "out", "--model.model", str(tiny_gpt2_dir), "--model.max_length", "1")
    )
    assert line == "error: model.max_length must be at least 2, got 1"


# -- 3: a data_root that is mistyped, or whose folder is not named after the task ------------------------


def test_a_mistyped_data_root_is_refused_naming_what_was_looked_for(
    cli, tiny_gpt2_dir, tmp_path, capsys, no_model_loading, no_data_loading
):
    """Was: ``cannot load split 'validation' from aps/super_glue ... (OfflineModeIsEnabled)``, the root never
    named; with internet the Hub copy would have been evaluated instead of the user's files."""
    root = tmp_path / "dta"
    line = refused(
        cli,
        *evaluate(tmp_path / "out", "-c", MC_CONFIG, "--model.model", str(tiny_gpt2_dir)),
        "--data.tasks", "[copa]", "--data.data_root", str(root),
    )  # fmt: skip
    assert line == (
        f"error: copa: data_root {root} does not exist (looked for {root}/copa/): correct data_root, pass "
        "--data.data_dirs '{copa: DIR}' or --data.hub_fallback true to load copa from the Hub "
        "(aps/super_glue copa)"
    )


def test_a_task_folder_under_another_name_is_refused_with_the_folders_tried(
    cli, tiny_gpt2_dir, tmp_path, capsys, no_model_loading, no_data_loading
):
    root = tmp_path / "data"
    shutil.copytree(DEMO / "copa", root / "copa_data")
    (root / "agnews_csv").mkdir()
    line = refused(
        cli,
        *evaluate(tmp_path / "out", "--model.model", str(tiny_gpt2_dir)),
        "--data.tasks", "[copa, agnews]", "--data.data_root", str(root),
    )  # fmt: skip
    assert line == (
        f"error: copa: data_root {root} has no folder copa/ (it holds agnews_csv/, copa_data/): name the "
        f"folder copa/, pass --data.data_dirs '{{copa: {root / 'copa_data'}}}' or --data.hub_fallback true "
        "to load copa from the Hub (aps/super_glue copa)"
    )
    # a task with no Hub copy is offered no fallback; its other names are tried too
    (root / "copa").symlink_to(root / "copa_data")
    line = refused(
        cli,
        *evaluate(tmp_path / "out", "--model.model", str(tiny_gpt2_dir)),
        "--data.tasks", "[copa, agnews]", "--data.data_root", str(root), "--data.hub_fallback", "true",
        names=("agnews:", str(root), "agnews/ or agn/ or ag_news/"),
        fix=("name the folder agnews/", f"--data.data_dirs '{{agnews: {root / 'agnews_csv'}}}'"),
    )  # fmt: skip
    assert "hub_fallback" not in line


def test_a_missing_data_dirs_entry_is_refused_before_any_data_is_read(
    cli, tiny_gpt2_dir, tmp_path, capsys, no_model_loading, no_data_loading
):
    line = refused(
        cli,
        *evaluate(tmp_path / "out", "--model.model", str(tiny_gpt2_dir), "--data.tasks", "[copa]"),
        "--data.data_dirs", json.dumps({"copa": str(tmp_path / "nope")}),
    )  # fmt: skip
    assert line == f"error: data_dirs.copa: {tmp_path / 'nope'} is not a directory"


def test_hub_fallback_is_an_explicit_opt_in_and_says_so(
    cli, tiny_gpt2_dir, tmp_path, capsys, caplog, fixture_hub
):
    root = tmp_path / "data"
    shutil.copytree(FIXTURES / "rte", root / "rte")
    args = [*evaluate(tmp_path / "out", "--model.model", str(tiny_gpt2_dir)), "--data.limit", "2"]
    args += ["--data.tasks", "[copa, rte]", "--data.data_root", str(root), "--model.choice_alphas", "[0.0]"]
    line = refused(cli, *args)
    assert line.startswith(f"error: copa: data_root {root} has no folder copa/ (it holds rte/)")
    assert fixture_hub == []  # refused, not quietly read from the Hub
    with caplog.at_level(logging.WARNING, logger="cblight.data.datamodule"):
        status, err, _ = cli([*args, "--data.hub_fallback", "true"])
        assert status in (0, None), err[-30:]
    said = [r.getMessage() for r in caplog.records if r.name == "cblight.data.datamodule"]
    assert said == [
        f"copa: data_root {root} has no folder copa/ (it holds rte/); loading it from the Hub "
        "(aps/super_glue copa), as --data.hub_fallback asks"
    ]
    assert {task for task, _ in fixture_hub} == {"copa"}  # rte came from the root


def test_peek_names_its_own_options(cli, tmp_path, capsys):
    root = tmp_path / "data"
    shutil.copytree(DEMO / "copa", root / "COPA")
    peek = ["data", "peek", "copa", "--data_root", str(root)]
    line = refused(
        cli,
        *peek,
        names=("copa:", str(root), "COPA/"),
        fix=(f"--data_dir {root / 'COPA'}", "--hub_fallback true"),
    )
    assert "--data." not in line  # evaluate's spelling of the options


# -- 5: --compare with a checkpoint that does not load ---------------------------------------------------


def test_compare_checks_every_checkpoint_before_the_first_runs(
    cli, tiny_gpt2_dir, tmp_path, capsys, no_model_loading
):
    """Was: the whole base evaluation ran, then ``cannot load tokenizer '<DIR>'``."""
    out = tmp_path / "out"
    missing = tmp_path / "outputs" / "tuning" / "gpt2" / "hf"
    compare = json.dumps({"base": str(tiny_gpt2_dir), "tuned": str(missing)})
    args = ["-c", MC_CONFIG, "--data.tasks", "[copa]", "--data.data_root", str(DEMO)]
    line = refused(cli, *evaluate(out, *args, "--compare", compare))
    assert line == (
        f"error: --compare tuned: cannot load model '{missing}': no directory {missing} exists; nothing was "
        "evaluated"
    )
    assert not out.exists()  # the base run never started
    not_a_model = tmp_path / "notes"
    not_a_model.mkdir()
    (not_a_model / "README.txt").write_text("results")
    compare = json.dumps({"base": str(tiny_gpt2_dir), "tuned": str(not_a_model)})
    refused(
        cli,
        *evaluate(out, *args, "--compare", compare),
        names=("--compare tuned:", f"'{not_a_model}'", "['README.txt']"),
        fix=("is not a model directory", "(config.json and weights)", "nothing was evaluated"),
    )


def test_compare_checks_max_length_against_every_checkpoint(
    cli, tiny_llama_dir, tmp_path, capsys, no_model_loading
):
    from cblight.tiny import build_tiny_gpt2

    short = build_tiny_gpt2(tmp_path / "short-gpt2", n_positions=32)
    compare = json.dumps({"base": str(tiny_llama_dir), "tuned": str(short)})
    line = refused(
        cli,
        *evaluate(tmp_path / "out", "-c", MC_CONFIG, "--data.tasks", "[copa]", "--data.data_root", str(DEMO)),
        "--model.max_length", "64", "--compare", compare,
    )  # fmt: skip
    assert line.startswith(f"error: --compare tuned: model.max_length 64 exceeds the window of {short} (32 ")


# -- 7: batch sizes name their option; a directory that is not a model ------------------------------------


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            "--model.batch_size",
            "model.batch_size must be an integer >= 1 or 'auto', got 0",
        ),
        (
            "--data.batch_size",
            "data.batch_size must be an integer >= 1, got 0",
        ),
    ],
)
def test_batch_size_errors_name_their_option(cli, option, message, tmp_path, capsys, no_model_loading):
    line = refused(cli, *evaluate(tmp_path / "out", "--model.model", "/no/such/model", option, "0"))
    assert line == f"error: {message}"


def test_score_batch_size_names_its_option(cli, tmp_path, capsys, no_model_loading):
    args = ["--model", "BoostedGenerationEvaluator", "--model.model", "/no/such/model"]
    line = refused(cli, *evaluate(tmp_path / "out", *args, "--model.score_batch_size", "0"))
    assert line == "error: model.score_batch_size must be an integer >= 1, got 0"


def test_a_directory_that_is_not_a_model_gets_no_tokenizer_conversion_hint(cli, tmp_path, capsys):
    """Was: ``... (ValueError: Couldn't instantiate the backend tokenizer from one of: (1) ...`` over five
    lines, ending with ``You need to have sentencepiece or tiktoken installed``."""
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "results.json").write_text("{}")
    line = refused(
        cli, *evaluate(tmp_path / "out", "--model.model", str(folder), "--data.data_root", str(DEMO))
    )
    assert line == (
        f"error: cannot load tokenizer '{folder}': the directory {folder} is not a tokenizer directory: it "
        "holds ['results.json'], none of the files save_pretrained writes (tokenizer.json, "
        "tokenizer_config.json)"
    )
    assert "sentencepiece" not in line


def test_the_conversion_hint_is_kept_for_a_slow_tokenizer():
    """The one case transformers' hint is about: a SentencePiece/tiktoken vocabulary and no converter."""
    import importlib.util

    from cblight.models import ModelLoadError, load_tokenizer

    if importlib.util.find_spec("sentencepiece") or importlib.util.find_spec("tiktoken"):
        pytest.skip("a converter is installed: the vocabulary below would fail differently")
    folder = Path(pytest.importorskip("tempfile").mkdtemp())
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    (folder / "tokenizer.model").write_bytes(b"not a sentencepiece model")
    with pytest.raises(ModelLoadError) as err:
        load_tokenizer(str(folder))
    assert str(err.value) == (
        f"cannot load tokenizer '{folder}': its slow tokenizer (tokenizer.model) must be converted, which "
        "needs sentencepiece or tiktoken: pip install sentencepiece tiktoken"
    )
    shutil.rmtree(folder)


# -- 10: a resumed served run says what came from its caches ----------------------------------------------


def _served_model(path: str, body: dict | None):
    """A deterministic completions server: a prompt's tokens are its words with their leading spaces, and
    a token's log-prob depends on the token alone, so the alignment canary passes."""
    import re

    from tests.served.http_stub import echo_answer

    if path.endswith("/models"):
        return 200, {"data": [{"id": "served-model"}]}, {}
    assert body is not None

    def lp(token: str) -> float:
        return -0.1 * len(token)

    if not body.get("echo"):
        lps = {"tokens": [" Paris"], "token_logprobs": [lp(" Paris")]}
        return 200, {"choices": [{"text": " Paris", "logprobs": lps}], "usage": {"completion_tokens": 1}}, {}
    pieces = re.findall(r"\s*\S+", body["prompt"])
    return 200, echo_answer(body["prompt"], [None] + [lp(p) for p in pieces[1:]], pieces), {}


def test_a_resumed_served_run_says_how_much_came_from_its_caches(cli, tmp_path, capsys, caplog):
    from tests.served.http_stub import Stub

    # csqa: 5 answers x 2 contexts = 10 requests a question; the canary's echo is the first one answered
    state = {"answered": 0, "fail_after": 1 + 24}

    def reply(path, body):
        scored = body is not None and body.get("echo")
        if scored and state["fail_after"] is not None and state["answered"] >= state["fail_after"]:
            return 400, {"error": "stopped by the test"}, {}
        state["answered"] += bool(scored)
        return _served_model(path, body)

    server = Stub(reply)
    out = tmp_path / "out"
    args = evaluate(
        out, "--model.model", "served-model", "--model.backend", "openai",
        "--model.server.base_url", server.url, "--model.server.concurrency", "1",
        "--data.tasks", "[csqa]", "--data.data_dirs", json.dumps({"csqa": str(REALDATA / "csqa")}),
        "--data.selection", "false", "--data.limit", "4", "--data.batch_size", "1",
    )  # fmt: skip
    try:
        assert "HTTP 400" in refused(cli, *args)  # questions 1, 2 scored; 4 of question 3's requests
        state["fail_after"] = None
        with caplog.at_level(logging.INFO):
            status, err, _ = cli(list(args))
            assert status in (0, None), err[-30:]
    finally:
        server.close()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("served model at")]
    assert said == [
        f"served model at {server.url}, resumed: 2 examples from the per-example cache, 4 requests answered "
        f"from the request cache ({out / 'requests.sqlite'}), 19 requests sent (checks included)"
    ]  # 19 = /models + the canary's 2 + question 3's other 6 + question 4's 10
    served = json.loads((out / "results.json").read_text())["served"]
    assert served["requests_from_cache"] == 4 and served["requests_sent"] == 19
