"""A new user's second round of inputs, typed as they would be (docs/errors.md, "A guard that always looks,
reruns that keep results, limits before work"): a rerun into an output directory with other settings, and
the tracebacks and misleading lines of that round. Each test checks the exit status and the decisive part of
the line: the option named and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import (
    ROOT,
    assert_refused,
    copa_args,
    generate_args,
)
from tests.tune.tuning_helpers import tune_args

RESWEEP_NOTE = (
    "holds this run's cached scores under other model.choice_alphas: reusing them; results.json and "
    "predictions/ are replaced"
)
RERUN_FIX = "choose another --model.output_dir, or pass --model.overwrite true to replace its results"


def test_a_rerun_with_other_limits_keeps_the_results_and_a_same_rerun_resumes(
    cli, tiny_gpt2_dir, tmp_path, capsys
):
    """``--data.limit 4`` then ``--data.limit 2`` into one directory (was: the 4-question results.json and
    predictions replaced by the 2-question ones, exit 0)."""
    out = tmp_path / "out"
    status, err, _ = cli(copa_args(tiny_gpt2_dir, out, "--data.limit", "4"))
    assert status == 0, err
    before = (out / "results.json").read_text()
    predictions = {p.name: p.read_text() for p in (out / "predictions").iterdir()}
    line = cli.one_line(copa_args(tiny_gpt2_dir, out, "--data.limit", "2"))
    assert line.startswith(f"error: model.output_dir '{out}' holds the results of a run with other settings")
    assert line.endswith(f"(data.limit 4 there, 2 now): rerun with its settings to resume it, {RERUN_FIX}")
    assert (out / "results.json").read_text() == before
    assert {p.name: p.read_text() for p in (out / "predictions").iterdir()} == predictions
    # the same settings again: resumed from the cache, the same numbers
    status, err, _ = cli(copa_args(tiny_gpt2_dir, out, "--data.limit", "4"))
    assert status == 0, err
    assert json.loads((out / "results.json").read_text())["tasks"] == json.loads(before)["tasks"]
    # a new alpha grid re-sweeps the cached scores, and says that it replaces the results
    status, err, _ = cli(
        copa_args(tiny_gpt2_dir, out, "--data.limit", "4", "--model.choice_alphas", "[0.0, -0.5]")
    )
    assert status == 0, err
    assert any(x.startswith("note: ") and x.endswith(RESWEEP_NOTE) for x in err), err
    # what the refusal says to type works
    status, err, _ = cli(copa_args(tiny_gpt2_dir, out, "--data.limit", "2", "--model.overwrite", "true"))
    assert status == 0, err
    assert json.loads((out / "results.json").read_text())["tasks"]["copa"]["report"]["n"] == 2


@pytest.mark.usefixtures("no_loading")
def test_a_generate_rerun_with_other_settings_is_refused_before_the_model_loads(cli, tmp_path, capsys):
    out = tmp_path / "gen"
    out.mkdir()
    recorded = {"settings": {"model.max_new_tokens": 8}}
    (out / "run.json").write_text(json.dumps(recorded))
    (out / "results.json").write_text("{}")  # that run's results
    line = cli.one_line(generate_args(Path("/no/such/model"), out))
    assert "holds the results of a run with other settings (model.max_new_tokens 8 there, 4 now)" in line
    assert line.endswith(RERUN_FIX)


@pytest.mark.usefixtures("no_loading")
def test_a_path_too_long_for_the_file_system_is_one_line(cli, tmp_path, capsys):
    """A 300-character directory name, or 25 names of 200 (was: ``OSError: [Errno 36] File name too long``
    from the output lock)."""
    long_name = tmp_path / ("a" * 300)
    line = cli.one_line(copa_args(Path("/no/such/model"), long_name))
    assert line.startswith("error: model.output_dir '")
    assert line.endswith(
        "is too long for the file system (a name of 300 bytes, where the limit is 255): choose a shorter "
        "model.output_dir"
    )
    deep = tmp_path.joinpath(*["b" * 200] * 25)
    line = cli.one_line(copa_args(Path("/no/such/model"), deep))
    assert "is too long for the file system (" in line and line.endswith("choose a shorter model.output_dir")


@pytest.mark.usefixtures("no_loading")
def test_lmeval_empty_tasks_spaced_model_args_and_an_unknown_rule(cli, capsys):
    """``--tasks ""`` (was lm-eval's ValueError traceback after 16 s); ``pretrained=M, alpha=-1`` (was
    "unknown ' alpha'; did you mean alpha?"); ``adaptive_rule=bogus`` (was "does not apply to multiple-choice
    tasks", as if it were a rule of another kind)."""
    model = "pretrained=/no/such/model"
    line = cli.one_line(["lmeval", "--tasks", "", "--model_args", model])
    assert line.startswith("error: --tasks is required: name the tasks to run, e.g. --tasks cblight_copa")
    line = cli.one_line(
        ["lmeval", "--tasks", "cblight_copa", "--model_args", f"{model},alpha=adaptive,adaptive_rule=bogus"]
    )
    assert line == (
        "error: adaptive_rule must be one of 'auto', 'gated', 'jsd', 'jsdist', 'cocoa', 'jsd_mean', "
        "'jsdist_mean', 'decorrelate', 'balance', got 'bogus'"
    )


def test_lmeval_model_args_with_spaces_after_commas_are_read_as_meant(cli, capsys):
    argv = ["lmeval", "--tasks", "cblight_copa", "--model_args", "pretrained=/no/such/model, alpha=-1"]
    status, err, _ = cli(argv)
    assert not any("unknown --model_args" in x for x in err), err
    # read as meant: the next check opens the model
    assert_refused(status, err, names="'/no/such/model'", fix="cannot load model")


WANDB_STREAMING = """\
trainer:
  logger:
    - class_path: lightning.pytorch.loggers.WandbLogger
      init_args: {project: cblight, save_dir: outputs, offline: false}
"""
NO_WANDB_KEY = (
    "the W&B logger streams (offline: false) but W&B has no API key here: run wandb login (or set "
    "WANDB_API_KEY), or log offline (offline: true, or WANDB_MODE=offline) and upload later with wandb sync"
)


@pytest.fixture
def no_wandb_login(tmp_path, monkeypatch):
    """A machine where nobody ran ``wandb login``."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NETRC", str(tmp_path / "home" / ".netrc"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)


@pytest.mark.usefixtures("no_loading", "no_wandb_login")
def test_wandb_streaming_without_a_login_and_wandb_mode_online(cli, tmp_path, capsys, monkeypatch):
    """``offline: false`` with no API key (was: a 62-line UsageError once the model had loaded);
    ``WANDB_MODE=online`` with the shipped config's ``offline: true`` (was: kept offline while wandb said to
    set ``WANDB_MODE=online``)."""
    pytest.importorskip("wandb")
    streaming = tmp_path / "wandb_streaming.yaml"
    streaming.write_text(WANDB_STREAMING)
    run = [
        "evaluate",
        "-c",
        str(ROOT / "configs" / "multiple_choice.yaml"),
        "--model.model",
        "/no/such/model",
    ]
    assert cli.one_line([*run, "-c", str(streaming)]) == f"error: {NO_WANDB_KEY}"
    monkeypatch.setenv("WANDB_MODE", "online")
    status, err, _ = cli([*run, "-c", str(ROOT / "configs" / "logger" / "wandb.yaml")])
    assert status == 2 and err[-1] == f"error: {NO_WANDB_KEY}", err
    assert "note: WANDB_MODE=online: the W&B logger streams (its config said offline: true)" in err
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B's own switch keeps a streaming config offline
    line = cli.one_line([*run, "-c", str(streaming), "--data.tasks", "[nope]"])
    assert "unknown task 'nope'" in line


@pytest.mark.usefixtures("no_loading")
@pytest.mark.parametrize("command", ["evaluate", "tune"])
def test_a_logger_whose_package_is_missing_is_one_line(cli, command, capsys, monkeypatch):
    """``--trainer.logger lightning.pytorch.loggers.TensorBoardLogger`` without tensorboard (was: 105 lines
    of jsonargparse and Lightning for tune, "does not validate against any of the Union subtypes" for
    evaluate)."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("tensorboard") else find_spec(name, *a),
    )
    config = {"evaluate": "multiple_choice.yaml", "tune": "coherence_tuning.yaml"}[command]
    argv = [command, "-c", str(ROOT / "configs" / config), "--model.model", "/no/such/model"]
    line = cli.one_line([*argv, "--trainer.logger", "lightning.pytorch.loggers.TensorBoardLogger"])
    assert line == (
        "error: trainer.logger lightning.pytorch.loggers.TensorBoardLogger needs the tensorboard or "
        "tensorboardX package, which is not installed: pip install tensorboard (or log with "
        "lightning.pytorch.loggers.CSVLogger, the default)"
    )


@pytest.mark.usefixtures("no_loading")
def test_a_tuning_batch_larger_than_the_prompts_is_refused_before_the_model_loads(
    cli, tiny_gpt2_dir, tmp_path
):
    """``--data.batch_size 1000000`` with 6 prompts (was: no step, no message, 23 GB in 250 s, then the
    kernel's out-of-memory killer). Refused with the module made and before its tokenizer or weights load
    (``no_loading``)."""
    from tests.tune.tuning_helpers import RUN_PROMPTS

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(RUN_PROMPTS) + "\n")
    line = cli.one_line(tune_args(tiny_gpt2_dir, prompts, "--data.batch_size", "1000000"))
    assert line == (
        f"error: data.batch_size = 1000000 is larger than the 6 training prompts of prompts_file '{prompts}': "
        "each step would sample 1000000 sequences from repeats of them; set --data.batch_size 6 or less, or give "
        "more prompts"
    )


def test_tuning_that_diverges_to_non_finite_weights_is_one_line(cli, tiny_gpt2_dir, tmp_path, capsys):
    """A learning rate of 1e30 without clipping (was: torch's ``probability tensor contains either inf, nan``
    traceback from the next step's sampling)."""
    from tests.tune.tuning_helpers import RUN_PROMPTS

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(RUN_PROMPTS) + "\n")
    argv = tune_args(
        tiny_gpt2_dir, prompts, "--model.optimizer.init_args.lr", "1e30", "--trainer.gradient_clip_val", "null",
        "--trainer.max_steps", "3", "--trainer.default_root_dir", str(tmp_path / "run"),
        "--model.export.dir", str(tmp_path / "export"),
    )  # fmt: skip
    status, err, _ = cli(argv)
    assert status == 2, err
    assert err[-1].startswith("error: tuning diverged by step ")
    assert err[-1].endswith(
        ": the model's next-token probabilities are no longer finite (its weights or their outputs overflowed); "
        "lower the learning rate (--model.optimizer.init_args.lr, now 1e+30) or keep trainer.gradient_clip_val "
        "on; nothing was exported"
    )
    assert not any("Traceback" in x for x in err) and not (tmp_path / "export" / "config.json").exists()


@pytest.mark.usefixtures("no_loading")
def test_an_export_dir_that_is_the_runs_root_is_named_as_such(cli, tmp_path, capsys):
    """``--model.export.dir .`` with a fresh ``--trainer.default_root_dir R`` (was: "already holds 1 files,
    e.g. outputs; this run would overwrite it", the run's own log folder made a moment before)."""
    from tests.tune.tuning_helpers import RUN_PROMPTS

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(RUN_PROMPTS) + "\n")
    root = tmp_path / "R"
    argv = tune_args(
        "/no/such/model", prompts, "--trainer.default_root_dir", str(root), "--model.export.dir", "."
    )
    assert cli.one_line(argv) == (
        f"error: model.export.dir '{root}' holds this run's own files (trainer.default_root_dir '{root}': its logs "
        "and checkpoints): choose a directory of its own, e.g. --model.export.dir hf_model"
    )
    assert not root.exists()


@pytest.mark.usefixtures("no_loading")
def test_misleading_lines_of_the_command_line_now_name_the_cause(cli, capsys):
    """``--model.adaptive ""`` (was "... or null, got None"); an option of the other evaluator with a config
    naming this one (was: a valid option blamed, or "does not validate against any of the Union subtypes");
    ``.help`` on an option that has none (was "expected one argument", or "unrecognized arguments")."""
    mc = ["evaluate", "-c", str(ROOT / "configs" / "multiple_choice.yaml"), "--model.model", "/no/such/model"]
    assert cli.one_line([*mc, "--model.adaptive", ""]) == (
        "error: model.adaptive must be one of 'auto', 'gated', 'jsd', 'jsdist', 'cocoa', 'jsd_mean', "
        "'jsdist_mean', 'decorrelate', 'balance' or null, got an empty value (leave the option out, or write null)"
    )
    webtext = str(ROOT / "configs" / "webtext_generation.yaml")
    for command in ("evaluate", "generate"):
        argv = [command, "-c", webtext, "--model.model", "/no/such/model", "--model.max_new_tokens", "4"]
        line = cli.one_line([*argv, "--model.adaptive", "auto"])
        assert line == (
            "error: --model.adaptive is an option of BoostedEvaluator, not of BoostedGenerationEvaluator, which "
            f"{webtext} names as model.class_path; a decoding's boosting takes it: --model.decodings "
            "'[{name: auto, boosting: {k: 8, adaptive: auto}}]' (docs/adaptive.md)"
        )
    assert cli.one_line(["evaluate", "--model.batch_size.help"]) == (
        "error: --model.batch_size takes a value (an integer >= 1 or 'auto'), not options of its own, so it has "
        "no .help: cblight evaluate --help describes it"
    )
    line = cli.one_line(["evaluate", "--model.choice_alpha.help"])
    assert (
        line
        == "error: unknown option --model.choice_alpha; did you mean --model.choice_alphas? (cblight evaluate --help lists the options)"
    )
    assert cli.one_line(["tune", "--model.max_new_tokens.help"]).startswith(
        "error: --model.max_new_tokens takes a value (an integer >= 1), not options of its own"
    )
    status, _, out = cli(["tune", "--model.guard.help"])
    assert status == 0 and "--model.guard.min_distinct_ratio" in out


def test_the_decoding_rules_are_documented_as_they_are():
    """custom_generate's README documented ``boost_adaptive`` as ``jsd`` or the retired ``residual``, and
    docs/generation.md decoding's ``auto`` as ``jsd`` (it is ``jsdist``): each now names every decoding rule
    and what ``auto`` is."""
    import re
    import typing

    from cblight.adaptive import AUTO, DecodingRule

    rules = set(typing.get_args(DecodingRule))
    row = next(
        line
        for line in (ROOT / "custom_generate" / "README.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| `boost_adaptive`")
    )
    named = set(re.findall(r"`(\w+)`", row.split("|")[3]))
    assert rules <= named and not named & {"residual"}, row
    assert f"`auto` (= `{AUTO['token']}`)" in row
    generation = (ROOT / "docs" / "generation.md").read_text(encoding="utf-8")
    assert f'`adaptive="auto"` (`"{AUTO["token"]}"` today)' in generation
    assert all(f'`"{rule}"`' in generation for rule in rules - {"auto"})


def test_cblight_help_with_a_command_word_reads_the_word(cli, capsys):
    """``cblight help evaluate`` printed cblight's own help, the command word ignored: it is that command's
    help now; an unknown word is refused as a command."""
    status, _, out = cli(["help", "evaluate"])
    assert status == 0 and out.startswith("usage: cblight evaluate -c CONFIG")
    status, _, out = cli(["help", "data", "peek"])
    assert status == 0 and out.startswith("usage: cblight data [options] peek")
    assert cli.one_line(["help", "evalute"]) == (
        "error: unknown command 'evalute'; did you mean 'evaluate'? (cblight --help lists them)"
    )


def test_a_model_directory_without_its_tokenizer_files_is_named(cli, tiny_gpt2_dir, tmp_path, capsys):
    """A model directory whose tokenizer.json is missing (was: the model loaded, then "continuation ...
    encodes to no tokens after its context", as if the data were at fault)."""
    import shutil

    folder = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_gpt2_dir, folder)
    (folder / "tokenizer.json").unlink()
    line = last_error_line(cli, copa_args(folder, tmp_path / "out"))
    assert line.startswith(f"error: tokenizer '{folder}' has no vocabulary: it encodes text to no tokens")
    assert line.endswith(
        "copy the tokenizer's files there (tokenizer.json, or vocab.json and merges.txt, or tokenizer.model), or "
        "name another with --model.tokenizer"
    )


def last_error_line(cli, argv: list[str]) -> str:
    status, err, _ = cli(argv)
    assert status == 2 and err[-1].startswith("error: "), err
    return err[-1]


TOO_LARGE = (
    "alpha 1e+38 is past the largest boost, 1e+06 in size (past it the full model no longer counts in "
    "float32, and far past it the scores overflow); the paper's alphas lie in [-5, 2]"
)


@pytest.mark.usefixtures("no_loading")
def test_a_numerically_extreme_alpha_is_refused_before_the_model_loads(cli, capsys):
    """``--model.choice_alphas '[1e38, 0.0]'`` (was: a table whose alpha* row came from overflowed scores;
    next-token and generation mixes in float32 gave NaN perplexities); the generation grid and the boosting
    of a decoding or tuning alike."""
    assert cli.one_line(
        ["evaluate", "--model.model", "/no/such/model", "--model.choice_alphas", "[1e38, 0.0]"]
    ) == (f"error: choice_alphas: {TOO_LARGE}")
    webtext = str(ROOT / "configs" / "webtext_generation.yaml")
    cli.refuses(
        ["generate", "-c", webtext, "--model.model", "/no/such/model", "--model.grid.alphas", "[-1e38]"],
        names=("grid.alphas:", "alpha -1e+38"),
        fix=("the largest boost, 1e+06 in size", "the paper's alphas lie in [-5, 2]"),
    )
    tune = ["tune", "-c", str(ROOT / "configs" / "coherence_tuning.yaml"), "--model.model", "/no/such/model"]
    line = cli.one_line([*tune, "--model.boosting.alpha=1e38"])
    assert line.endswith(TOO_LARGE), line
    # a negative number in scientific notation is a value (argparse took it for an option name: "expected one
    # argument"), and a range bound of -1e9 is refused before its grid of 1e11 values is built (was: a hang)
    mc = ["evaluate", "--model.model", "/no/such/model", "--data.tasks", "[copa]"]
    cli.refuses(
        [*mc, "--model.choice_alphas.start", "-1e38"],
        names=("choice_alphas:", "alpha -1e+38"),
        fix=("the largest boost, 1e+06 in size", "the paper's alphas lie in [-5, 2]"),
    )
    assert cli.one_line([*mc, "--model.choice_alphas", "{start: 0, stop: -5, step: 1e-6}"]) == (
        "error: choice_alphas: alpha grid 0 .. -5 by 1e-06 has 5000001 values, more than 100000: take a larger step"
    )
