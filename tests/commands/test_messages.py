"""The command line: every message names the fix (docs/errors.md).

Each case types the user's command (in process through ``cblight.__main__.main``, or as a subprocess) and
checks the exit status and the one line it prints:

* 6: a misspelt option or config key, a value outside a Literal's choices, a malformed YAML config;
* 7: the cache refusal names ``--model.overwrite true``; ``contrast --alpha nan``; a multi-token target;
* 8: ``cblight lmeval --help`` opens with cblight's model_args; ``train.py fit --help`` with the module's
  options; ``python -m cblight.contrast``'s usage;
* 9: no Lightning tip, no ``LeafSpec`` warning and no tokenizer length warning on a cblight run.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from cblight.__main__ import main
from tests.helpers import DEMO, EVAL_QUIET_CPU, ROOT, assert_refused, copa_args

# a subprocess imports this checkout first, then what PYTHONPATH held (CI's oldest jsonargparse)
SEARCH_PATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class Loaded(AssertionError):
    pass


def config(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- case 6: misspelt options and keys, Literal values, YAML ----------------------------------------------------
DTYPES = "'auto', 'float32', 'bfloat16', 'float16'"
COMMAND_LINE = [
    # (argv, the line docs/errors.md quotes): the issue's own examples first
    (
        ["evaluate", "--model.choice_alpha", "3"],
        "error: unknown option --model.choice_alpha; did you mean --model.choice_alphas?",
    ),
    (
        ["evaluate", "--model.load.dtype", "float64"],
        f"error: model.load.dtype must be one of {DTYPES}, got 'float64'",
    ),
    (
        ["tune", "--model.boosting.adaptive", "kl"],
        "error: model.boosting.adaptive must be one of 'auto', 'jsd', 'jsdist', 'cocoa' or null, got 'kl'",
    ),
    (
        ["evaluate", "--model.methods", "[boost, pmi]"],
        "error: model.methods[1] must be one of 'boost', 'pmi_dc', 'pmi_empty', 'calibrate', 'channel', got 'pmi'",
    ),
    (
        ["evaluate", "--model.choice_alphas", "{start: 1.0, stop: 0.0, stpe: 0.5}"],
        "error: unknown option model.choice_alphas.stpe; did you mean model.choice_alphas.step?",
    ),
    (
        ["evaluate", "--model.choice_alphas", "[1, foo]"],
        "error: model.choice_alphas[1] must be a number, got 'foo'",
    ),
    (
        ["evaluate", "--model.batch_size", "lots"],
        "error: model.batch_size must be an integer >= 1 or 'auto', got 'lots'",
    ),
    (["evaluate", "--data.taks", "[copa]"], "error: unknown option --data.taks; did you mean --data.tasks?"),
    (["evaluate", "--trainer.max_steps", "abc"], "error: trainer.max_steps must be an integer, got 'abc'"),
    (
        ["evaluate", "--model", "BoostedEvaluatr"],
        "error: model: no class 'BoostedEvaluatr' can be imported; did you mean BoostedEvaluator? "
        "(a class name or a dotted path)",
    ),
    (
        ["evaluate", "copa"],
        "error: unexpected argument 'copa': options are written --name value (cblight evaluate --help lists them)",
    ),
    (
        ["generate", "--model.load.dtype", "float64"],
        f"error: model.load.dtype must be one of {DTYPES}, got 'float64'",
    ),
    (
        ["tune", "--model.boosting.alfa", "3"],
        "error: unknown option --model.boosting.alfa; did you mean --model.boosting.alpha?",
    ),
    (
        ["tune", "--model.load.dtype", "float64"],
        f"error: model.load.dtype must be one of {DTYPES}, got 'float64'",
    ),
    (
        ["tune", "--model.boosting.alpha", "nan"],
        "error: model.boosting.alpha must be a finite number, got nan",
    ),
    (["contrast", "--contxt", "x"], "error: unknown option --contxt; did you mean --context?"),
    (["contrast", "--context", "x", "--k", "two"], "error: k must be an integer >= 1, got 'two'"),
    (
        ["contrast", "--context", "x", "--dtype", "float64"],
        f"error: dtype must be one of {DTYPES}, got 'float64'",
    ),
    (["contrast"], "error: --context is required (cblight contrast --help lists the options)"),
    (
        ["data", "peek", "--taks", "copa"],
        "error: unknown option --taks: TASK is a positional argument, given without an option name: usage: "
        "cblight data peek TASK [options]",
    ),
    (["data", "lst"], "error: unknown subcommand 'lst'; did you mean 'list'? (choose from list, peek)"),
    (["data"], "error: a subcommand is needed: list or peek (cblight data --help lists them)"),
    (
        ["zoo", "list", "--verbos"],
        "error: unknown option --verbos (cblight zoo list --help lists the options)",
    ),
    (["demo", "--quik"], "error: unknown option --quik; did you mean --quick?"),
]


@pytest.mark.parametrize(("argv", "line"), COMMAND_LINE, ids=[" ".join(a) for a, _ in COMMAND_LINE])
def test_a_bad_option_is_one_line_naming_the_fix(cli, argv, line, capsys, no_loading, tmp_path):
    if argv[0] in ("evaluate", "generate"):
        argv = [*argv, "--model.output_dir", str(tmp_path / "out")]
    assert cli.one_line(argv) == line
    assert not (tmp_path / "out").exists()


COMMAND_LINE_PARTS = [
    # (argv, what the line names, its fix): the lines docs/errors.md does not quote word for word
    (["generate", "--model.decodng", "[]"], "--model.decodng", "did you mean --model.decodings?"),
    (
        ["tune", "--model.boosting.mode", "last"],
        ("model.boosting.mode", "got 'last'"),
        "must be one of 'last_k', 'response', 'marker', 'auto'",
    ),
    (["tune", "--trainer.max_stepz", "3"], "--trainer.max_stepz", "did you mean --trainer.max_steps?"),
    (["tune", "--model.optimizer", "Adamm"], ("model.optimizer", "'Adamm'"), "did you mean Adam?"),
]


@pytest.mark.parametrize(
    ("argv", "names", "fix"), COMMAND_LINE_PARTS, ids=[" ".join(a) for a, _, _ in COMMAND_LINE_PARTS]
)
def test_a_bad_option_names_itself_and_the_fix(cli, argv, names, fix, capsys, no_loading, tmp_path):
    if argv[0] in ("evaluate", "generate"):
        argv = [*argv, "--model.output_dir", str(tmp_path / "out")]
    cli.refuses(argv, names=names, fix=fix)
    assert not (tmp_path / "out").exists()


def test_the_parts_check_fails_on_a_wrong_option_fix_or_status():
    """``assert_refused`` (what the tables of parts use) refuses what a drifted message would print."""
    line = "error: unknown option --model.choice_alpha; did you mean --model.choice_alphas?"
    parts = {"names": "--model.choice_alpha", "fix": "did you mean --model.choice_alphas?"}
    assert assert_refused(2, ["a start-up note", line], **parts) == line
    drifted = [
        (2, [line.replace("--model.choice_alpha;", "--model.choice_alphas;")]),  # another option named
        (2, [line.replace("; did you mean --model.choice_alphas?", "")]),  # no fix
        (2, [line.replace("did you mean --", "did you mean ")]),  # the fix as a config key
        (1, [line]),
        (2, [line, "Traceback (most recent call last):"]),
        (2, [line, line]),
    ]
    for status, lines in drifted:
        with pytest.raises(AssertionError):
            assert_refused(status, lines, **parts)
    with pytest.raises(AssertionError, match="more than the one line"):
        assert_refused(2, ["a start-up note", line], alone=True, **parts)
    with pytest.raises(AssertionError, match="does not name 'model\\.choice_alpha'"):
        assert_refused(2, [line], names="model.choice_alpha")  # a config key is printed without --


CONFIGS = [
    # (command, config text, the line docs/errors.md quotes): the same mistakes in a -c config
    (
        "evaluate",
        "model:\n  choice_alpha: 3\n",
        "unknown option model.choice_alpha; did you mean model.choice_alphas?",
    ),
    (
        "evaluate",
        "model:\n  class_path: cblight.evaluate.boosted_evaluator.BoostedEvaluator\n  init_args:\n"
        "    choice_alpha: 3\n",
        "unknown option model.init_args.choice_alpha; did you mean model.init_args.choice_alphas?",
    ),
    (
        "evaluate",
        "model:\n  choice_alphas:\n    start: 2.0\n    stop: -5.0\n    stpe: 0.01\n",
        "unknown option model.choice_alphas.stpe; did you mean model.choice_alphas.step?",
    ),
    (
        "evaluate",
        "model:\n  load:\n    dtype: float64\n",
        f"model.load.dtype must be one of {DTYPES}, got 'float64'",
    ),
    ("evaluate", "modle:\n  model: gpt2\n", "unknown option modle.model; did you mean model.model?"),
    (
        "tune",
        "model:\n  optimizer:\n    class_path: torch.optim.AdamW\n    init_args:\n      lr: 1.0e-05\n"
        "      weight_decai: 0.0\n",
        "unknown option model.optimizer.init_args.weight_decai; did you mean model.optimizer.init_args.weight_decay?",
    ),
    (
        "tune",
        "model:\n  load:\n    dtype: float64\n",
        f"model.load.dtype must be one of {DTYPES}, got 'float64'",
    ),
]


@pytest.mark.parametrize(("command", "text", "line"), CONFIGS, ids=[f"{c}: {t!r}" for c, t, _ in CONFIGS])
def test_a_bad_config_key_is_one_line_naming_the_fix(cli, command, text, line, capsys, no_loading, tmp_path):
    assert cli.one_line(config_command(tmp_path, command, text)) == f"error: {line}"


def config_command(tmp_path: Path, command: str, text: str) -> list[str]:
    """``cblight COMMAND -c FILE`` of a config file holding ``text``."""
    path = config(tmp_path, "bad.yaml", text)
    flag = "--config" if command == "contrast" else "-c"  # the function commands have no -c
    extra = ["--model.output_dir", str(tmp_path / "out")] if command == "evaluate" else []
    return [command, flag, path, *extra]


CONFIG_PARTS = [
    # (command, config text, what the line names, its fix): the same, a config key named without --
    ("evaluate", "data:\n  taks: [copa]\n", "data.taks", "did you mean data.tasks?"),
    ("evaluate", "trainer:\n  max_stepz: 3\n", "trainer.max_stepz", "did you mean trainer.max_steps?"),
    (
        "tune",
        "model:\n  boosting:\n    alfa: 3\n",
        "model.boosting.alfa",
        "did you mean model.boosting.alpha?",
    ),
    ("contrast", "context: x\nalpah: 3\n", "alpah", "did you mean alpha?"),
]


@pytest.mark.parametrize(
    ("command", "text", "names", "fix"), CONFIG_PARTS, ids=[f"{c}: {t!r}" for c, t, _, _ in CONFIG_PARTS]
)
def test_a_bad_config_key_names_itself_and_the_fix(
    cli, command, text, names, fix, capsys, no_loading, tmp_path
):
    cli.refuses(config_command(tmp_path, command, text), names=names, fix=fix)


@pytest.mark.parametrize(
    ("command", "text"),
    [
        ("evaluate", "model:\n  batch_size: 0\n"),  # a value its type refuses
        ("evaluate", "modle:\n  model: gpt2\n"),  # an unknown key
        ("generate", "model:\n  class_path: BoostedEvaluator\n"),  # another command's config: refused at once
        ("tune", "model:\n  boosting:\n    k: 0\n"),
    ],
)
def test_a_config_file_is_read_once_per_command(command, text, cli, no_loading, tmp_path, monkeypatch):
    """The command's checks, the parse and the one-line message all use jsonargparse's one read of the file."""
    import builtins

    path, opened, real_open = config(tmp_path, "bad.yaml", text), [], builtins.open

    def counting_open(file, *args, **kwargs):
        if os.path.realpath(str(file)) == os.path.realpath(path):
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    line = cli.one_line([command, "-c", path])
    assert line.startswith("error: "), line
    assert len(opened) == 1, opened


@pytest.mark.parametrize("command", ["evaluate", "tune"])
def test_malformed_yaml_names_the_file_and_line(cli, command, capsys, no_loading, tmp_path):
    unclosed = config(
        tmp_path,
        "unclosed.yaml",
        "model:\n  model: gpt2\n  choice_alphas: [1.0, 2.0\ndata:\n  tasks: [copa]\n",
    )
    assert cli.one_line([command, "-c", unclosed]) == (
        f"error: {unclosed} line 4, column 5: did not find expected ',' or ']' "
        "(while parsing a flow sequence that starts at line 3, column 18)"
    )
    indented = config(tmp_path, "indented.yaml", "model:\n  model: gpt2\n   dtype: float32\n")
    cli.refuses([command, "-c", indented], names=indented, fix="line 3, column 9:")
    missing = str(tmp_path / "nope.yaml")
    assert cli.one_line([command, "-c", missing]) == f"error: -c/--config: File does not exist: '{missing}'"


def test_jsonargparse_debug_gives_the_whole_report(monkeypatch, no_loading):
    """The details stay one switch away: JSONARGPARSE_DEBUG=true raises jsonargparse's own error."""
    from jsonargparse import ArgumentError

    monkeypatch.setenv("JSONARGPARSE_DEBUG", "true")
    with pytest.raises(ArgumentError, match="Does not validate against any of the Union subtypes"):
        main(["evaluate", "--model.choice_alpha", "3"])


def test_one_line_in_a_fresh_process(tmp_path):
    """As the user types it: ``python -m cblight evaluate --model.choice_alpha 3``."""
    done = subprocess.run(
        [sys.executable, "-m", "cblight", "evaluate", "--model.choice_alpha", "3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**OFFLINE, "PYTHONPATH": SEARCH_PATH},
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: unknown option --model.choice_alpha; did you mean --model.choice_alphas?"
    ]


def test_a_subprocess_imports_this_jsonargparse():
    """CI runs these tests again with the oldest allowed jsonargparse first on PYTHONPATH (.ci/run): the
    commands run as subprocesses import it too."""
    import jsonargparse

    code = "import jsonargparse; print(jsonargparse.__version__)"
    env = {**OFFLINE, "PYTHONPATH": SEARCH_PATH}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert done.stdout.strip() == jsonargparse.__version__


def test_closest_prefers_the_same_letters_on_a_tie():
    """difflib rates ``stop`` and ``step`` the same for ``stpe`` (ratio 0.75 each); ``step`` has its letters."""
    import difflib

    from cblight.suggest import closest

    ratios = {c: difflib.SequenceMatcher(None, "stpe", c).ratio() for c in ("stop", "step")}
    assert ratios["stop"] == ratios["step"] == 0.75
    assert closest("stpe", ["start", "stop", "step"]) == "step"
    assert closest("zzzz", ["start", "stop", "step"]) is None


def test_lmeval_unknown_model_arg_names_the_closest(cli, tiny_gpt2_dir, capsys, monkeypatch):
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    original = TaskManager.__init__

    def local_tasks_only(self, *args, include_defaults=True, **kwargs):  # lm-eval's whole index takes ~10 s
        original(self, *args, include_defaults=False, **kwargs)

    monkeypatch.setattr(TaskManager, "__init__", local_tasks_only)
    args = ["lmeval", "--tasks", "cblight_copa", "--limit", "1", "--device", "cpu"]
    line = cli.last_error([*args, "--model_args", f"pretrained={tiny_gpt2_dir},alpah=-1"])
    assert line == (
        "error: unknown --model_args for model cblight: alpah; did you mean alpha? (cblight lmeval --help lists them)"
    )


# -- case 7: messages that name the right thing --------------------------------------------------------------


def test_cache_refusal_names_the_option_as_typed_and_the_option_works(cli, tiny_gpt2_dir, tmp_path, capsys):
    out = tmp_path / "out"
    status, _, _ = cli(copa_args(tiny_gpt2_dir, out))
    assert status == 0
    # the cache's own refusal, behind the output directory's record of its run's settings (which refuses
    # the same rerun first: tests/commands/test_messages_second_wave.py): a directory written without that record
    (out / "run.json").unlink()
    line = cli.last_error(copa_args(tiny_gpt2_dir, out, "--model.load.dtype", "bfloat16"))
    assert line.startswith(f"error: the cache in {out / 'cache'}")
    assert "dtype: cached 'float32', now 'bfloat16'" in line
    assert line.endswith(
        "Choose another --model.output_dir, or add --model.overwrite true (overwrite=True from Python) to "
        "discard the cache and recompute."
    )
    assert "overwrite=true" not in line
    # what the line says to type works
    status, err, _ = cli(
        copa_args(tiny_gpt2_dir, out, "--model.load.dtype", "bfloat16", "--model.overwrite", "true")
    )
    assert status == 0, err
    results = json.loads((out / "results.json").read_text())
    assert results["dtype"] == "bfloat16" and results["tasks"]["copa"]["report"]["n"] == 2


@pytest.mark.parametrize("value", ["nan", ".nan", "inf", "-.inf"])
def test_contrast_alpha_nan_is_the_finite_number_message(cli, value, capsys, no_loading):
    line = cli.one_line(["contrast", "--context", "a b c", "--model", "/no/such/model", f"--alpha={value}"])
    assert line.startswith("error: alpha must be a finite number, got ")


def test_contrast_notes_that_only_the_first_target_token_is_ranked(
    cli, tiny_gpt2_dir, gpt2_tokenizer, capsys
):
    context = ' Ballad metre is "less regular and more conversational" than common'
    args = ["contrast", "--model", str(tiny_gpt2_dir), "--context", context, "--k", "4"]
    status, err, out = cli([*args, "--target", " metre and rhyme"])
    tokens = gpt2_tokenizer(" metre and rhyme", add_special_tokens=False)["input_ids"]  # the reference
    first = gpt2_tokenizer.decode(tokens[:1])
    assert status == 0 and len(tokens) > 1 and first == " metre"
    notes = [line for line in err if line.startswith(("note:", "error:"))]  # not transformers' loading bar
    assert notes == [
        f"note: --target ' metre and rhyme' is {len(tokens)} tokens; only its first, ' metre', is ranked "
        "(the next token after the context)"
    ]
    assert "** target ' metre': rank full" in out
    status, err, _ = cli([*args, "--target", " metre"])
    assert status == 0 and not [line for line in err if line.startswith(("note:", "error:"))]


# -- case 8: help ------------------------------------------------------------------------------------------
def test_lmeval_help_opens_with_cblights_model_args(cli, capsys):
    pytest.importorskip("lm_eval")
    from cblight.lmeval.model import CblightLM

    status, _, out = cli(["lmeval", "--help"])
    assert status == 0
    ours, _, theirs = out.partition("lm-eval's own options follow.")
    assert out.startswith("cblight lmeval: lm-evaluation-harness with cblight's model")
    assert "--model cblight" in ours and "--model defaults to cblight" in ours
    rows = {line.split()[0] for line in ours.splitlines() if line.startswith("  ") and "=" in line.split()[0]}
    for name, param in inspect.signature(
        CblightLM.__init__
    ).parameters.items():  # the reference: the signature
        if name in ("self", "unused"):
            continue
        default = "none" if param.default is None else param.default
        assert f"{name}={default}" in rows, name
    assert "usage: lm-eval" in theirs and "--model_args" in theirs  # then lm-eval's whole help


def test_train_py_fit_help_lists_the_module_options_first():
    done = subprocess.run(
        [sys.executable, "train.py", "fit", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: train.py fit -c CONFIG")
    options = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("  --")]
    first = {
        p: next(i for i, o in enumerate(options) if o.startswith(p))
        for p in ("--model.", "--data.", "--trainer.")
    }
    assert first["--model."] < first["--data."] < first["--trainer."], first


def test_contrast_usage_names_the_command_as_run():
    done = subprocess.run(
        [sys.executable, "-m", "cblight.contrast", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m cblight.contrast "), done.stdout[
        :200
    ]


# -- case 9: no noise on a run -----------------------------------------------------------------------------
NOISE = ("💡 Tip", "LeafSpec", "Token indices sequence length is longer")


@pytest.fixture(scope="module")
def tiny64(tmp_path_factory) -> Path:
    """A tiny GPT-2 with a 64-token window: the demo's LAMBADA passages (up to ~100 tokens) exceed it."""
    from cblight.tiny import build_tiny_gpt2

    return build_tiny_gpt2(tmp_path_factory.mktemp("models") / "tiny64", n_positions=64)


def test_a_cblight_evaluate_run_prints_no_library_noise(tiny64, tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable, "-m", "cblight", "evaluate", "-c", "configs/lambada.yaml",
            "--model.model", str(tiny64), "--model.output_dir", str(out),
            "--data.tasks", "[lambada]", "--data.data_root", str(DEMO), "--data.limit", "2",
            "--model.ks", "[1, 2]", "--model.plots", "false",
            *EVAL_QUIET_CPU,
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**OFFLINE, "PYTHONPATH": SEARCH_PATH},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "results.json").exists()
    for noise in NOISE:
        assert noise not in done.stderr, done.stderr


def test_a_cblight_tune_run_prints_no_library_noise(tiny64, tmp_path, caplog, monkeypatch):
    """In process, through the records every log handler gets (pytest itself swallows the LeafSpec warning
    here: the evaluate run above and the targeted test below check that one); the tip filter is taken away
    first, so the run must add it."""
    from cblight.cli import tune_cli

    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        monkeypatch.setattr(logging.getLogger(name), "filters", [])

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(["The first prompt of the run.", "A second, rather longer prompt."] * 4))
    tune_cli(
        [
            "-c", str(ROOT / "configs" / "coherence_tuning.yaml"),
            "--model.model", str(tiny64), "--model.export.enabled", "false",
            "--model.boosting.k", "4", "--model.max_new_tokens", "8", "--model.max_prompt_tokens", "24",
            "--data.task", "null", "--data.prompts_file", str(prompts), "--data.batch_size", "2",
            "--data.val_size", "0", "--trainer.max_steps", "1", "--trainer.accelerator", "cpu",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "false",
            "--trainer.callbacks", "[]", "--trainer.default_root_dir", str(tmp_path / "run"),
            # no validation: the collapse guard off (it refuses a run it could not look at)
            "--model.guard.max_ppl_ratio", "null", "--model.guard.min_entropy_ratio", "null",
        ]
    )  # fmt: skip
    assert "max_steps=1` reached" in caplog.text  # Lightning's own notes still print
    for noise in NOISE:
        assert noise not in caplog.text, caplog.text


def test_the_silencers_are_targeted(caplog):
    """Lightning's tip goes, other rank-zero messages stay; torch's LeafSpec warning goes only when
    Lightning's ``_pytree`` raises it; the tokenizer's length warning goes only for cblight's Encoder."""
    import lightning.pytorch  # noqa: F401  (its handlers)
    from lightning.pytorch.utilities import rank_zero_info

    from cblight.cli import quiet_library_notices
    from cblight.scoring import Encoder
    from cblight.tiny import gpt2_tokenizer

    levels = {name: logging.getLogger(name).level for name in ("", "lightning.pytorch", "lightning.fabric")}
    quiet_library_notices()
    rank_zero_info("💡 Tip: For seamless cloud logging ... litlogger")
    rank_zero_info("a user's own note")
    # the records as every handler gets them (Lightning's own stderr handler may hold an earlier test's stream)
    assert "a user's own note" in caplog.text and "💡 Tip" not in caplog.text
    assert levels == {name: logging.getLogger(name).level for name in levels}  # no log level lowered

    from lightning.pytorch.utilities._pytree import _tree_flatten

    text = "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec)` instead."
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()  # pyproject's pytest filters ignore this text everywhere: out of the way
        warnings.simplefilter("always")
        quiet_library_notices()
        _tree_flatten([1, 2])  # Lightning's own call, which builds a LeafSpec
        warnings.warn_explicit(text, FutureWarning, "user.py", 1, module="user")  # anyone else's: shown
    assert [str(w.message) for w in caught] == [text]

    seen: list[str] = []
    collect = logging.Handler()
    collect.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    transformers_logger = logging.getLogger("transformers")  # its records do not reach the root (caplog)
    transformers_logger.addHandler(collect)
    try:
        tok = gpt2_tokenizer()
        tok.model_max_length = 8
        long_text = " a" * 20
        assert len(Encoder(tok).body(long_text)) == 20
        assert not [m for m in seen if "Token indices sequence length" in m]
        tok(long_text)  # the same call without verbose=False warns: the check above can fail
        assert [m for m in seen if "Token indices sequence length" in m]
    finally:
        transformers_logger.removeHandler(collect)
