"""What a new user typed, and the one line each now gets (docs/errors.md, "A new user's second round").

Each case types the command in process (``cblight.__main__.main``) and checks the exit status and the one
``error:`` (or ``note:``) line, with tripwires on the loaders where "before the model loads" is the point:

* lm-eval: an adaptive rule that does not fit a task's kind, no ``--tasks``, an unknown task;
* ``contrast``: a context past the window (a note, and the context printed is the one used), empty input;
* a model directory whose ``model.safetensors`` is empty or cut short (evaluate, contrast, tune);
* a positional argument left out or given as an option (``zoo convert``, ``data peek``);
* a misspelt dotted key, a group given a value, a config that is not a mapping or is another
  command's, ``--model.X.help``;
* transformers' "Token indices sequence length" warning on cblight's tokenizers.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from tests.helpers import (
    EVAL_QUIET_CPU,
    ROOT,
)

DEMO = ROOT / "cblight" / "assets" / "demo_data"


@pytest.fixture
def local_lm_eval_tasks(monkeypatch):
    """lm-eval's task index without its ~14,000 bundled tasks (~10 s): cblight's own tasks only."""
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    original = TaskManager.__init__

    def local_tasks_only(self, *args, include_defaults=True, **kwargs):
        original(self, *args, include_defaults=False, **kwargs)

    monkeypatch.setattr(TaskManager, "__init__", local_tasks_only)


# -- lm-eval: the adaptive rule against the tasks' kinds; --tasks ---------------------------------------------
@pytest.mark.usefixtures("no_loading")
def test_lmeval_refuses_a_per_token_rule_on_a_multiple_choice_task_before_loading(
    cli, tiny_gpt2_dir, capsys, local_lm_eval_tasks
):
    """Was: scored with ``decorrelate`` (per-choice scores identical to it), exit 0."""
    args = ["lmeval", "--tasks", "cblight_copa", "--limit", "1", "--device", "cpu", "--model_args"]
    line = cli.last_error([*args, f"pretrained={tiny_gpt2_dir},alpha=adaptive,adaptive_rule=cocoa"])
    assert line == (
        "error: --model_args adaptive_rule: task cblight_copa: adaptive rule 'cocoa' does not apply to "
        "multiple-choice tasks; use auto or one of gated, jsd, jsd_mean, decorrelate, balance"
    )  # the same words as cblight evaluate --model.adaptive cocoa


@pytest.mark.parametrize(
    ("output_type", "rule", "line"),
    [
        (
            "generate_until",
            "decorrelate",
            "--model_args adaptive_rule: task t: adaptive rule 'decorrelate' does not apply to generate_until "
            "tasks; use auto or one of jsd, jsdist, cocoa",
        ),
        (
            "loglikelihood",
            "cocoa",
            "--model_args adaptive_rule: task t: adaptive rule 'cocoa' does not apply to loglikelihood "
            "(scores and greedy flags) tasks; use auto or one of jsd",
        ),
        ("multiple_choice", "jsd", None),
        ("generate_until", "auto", None),
    ],
)
def test_lmeval_adaptive_rule_fits_each_task_kind(output_type, rule, line, local_lm_eval_tasks):
    from lm_eval.tasks import TaskManager

    from cblight.errors import CblightError
    from cblight.lmeval.__main__ import check_adaptive_rule

    args = {"pretrained": "m", "alpha": "adaptive", "adaptive_rule": rule}
    task = {"task": "t", "output_type": output_type}
    if line is None:
        check_adaptive_rule(args, [task], TaskManager())
        return
    with pytest.raises(CblightError) as err:
        check_adaptive_rule(args, [task], TaskManager())
    assert str(err.value) == line


def test_the_lmeval_model_never_swaps_a_named_rule(tiny_gpt2_dir):
    """From Python (no task kinds known): a per-token rule for scores, a multiple-choice rule for
    ``generate_until``, refused before any model call."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from cblight.errors import CblightError
    from cblight.lmeval.model import CblightLM

    scores = Instance("loglikelihood", doc={}, arguments=("The cat sat on the", " mat"), idx=0)
    lm = CblightLM(pretrained=str(tiny_gpt2_dir), alpha="adaptive", adaptive_rule="cocoa", device="cpu")
    with pytest.raises(CblightError, match="adaptive_rule=cocoa is a per-token rule: it does not apply to"):
        lm.loglikelihood([scores])
    text = Instance(
        "generate_until", doc={}, arguments=("The cat", {"until": ["."], "max_gen_toks": 2}), idx=0
    )
    lm = CblightLM(pretrained=str(tiny_gpt2_dir), alpha="adaptive", adaptive_rule="decorrelate", device="cpu")
    with pytest.raises(CblightError, match="adaptive_rule=decorrelate is a multiple-choice rule"):
        lm.generate_until([text])
    assert len(lm.loglikelihood([scores])) == 1  # decorrelate does apply to scores


@pytest.mark.usefixtures("no_loading")
def test_lmeval_without_tasks_or_with_an_unknown_task_is_one_line(
    cli, tiny_gpt2_dir, capsys, local_lm_eval_tasks
):
    """Was: lm-eval's ``ValueError`` traceback (``No tasks specified``, ``Tasks not found: ...``)."""
    args = ["lmeval", "--limit", "1", "--device", "cpu", "--model_args", f"pretrained={tiny_gpt2_dir}"]
    assert cli.last_error(args) == (
        "error: --tasks is required: name the tasks to run, e.g. --tasks cblight_copa (cblight lmeval ls tasks "
        "lists them)"
    )
    assert cli.last_error([*args, "--tasks", "cblight_cpa"]) == (
        "error: --tasks: unknown task 'cblight_cpa'; did you mean cblight_copa or cblight_piqa? (cblight lmeval "
        "ls tasks lists them)"
    )


# -- contrast: what is used, and empty input ----------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny16(tmp_path_factory) -> Path:
    from cblight.tiny import build_tiny_gpt2

    return build_tiny_gpt2(tmp_path_factory.mktemp("models") / "tiny16", n_positions=16)


def test_contrast_says_a_context_past_the_window_was_cut_and_prints_what_was_used(cli, tiny16, capsys):
    """Was: the whole context printed as "Full context", ranked from its last window, nothing said."""
    from cblight.tiny import gpt2_tokenizer

    context = " one two three four five six" * 4
    status, err, out = cli(["contrast", "--model", str(tiny16), "--context", context, "--top", "2"])
    ids = gpt2_tokenizer()(context)["input_ids"]  # the reference: 24 tokens, the last one the target
    assert status == 0 and len(ids) == 24
    assert [line for line in err if line.startswith(("note:", "error:"))] == [
        f"note: the context is 23 tokens, longer than the window of {tiny16} (16 tokens): only its last 16 are "
        "used (printed as the full context)"
    ]
    used = gpt2_tokenizer().decode(ids[-17:-1])
    assert out.startswith(f"Full context:\n{used}\n")
    status, err, _ = cli(["contrast", "--model", str(tiny16), "--context", " one two three"])
    assert status == 0 and not [line for line in err if line.startswith(("note:", "error:"))]


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (["--context", ""], "error: --context is empty: give the text whose next token is ranked"),
        (
            ["--context", "a b c", "--target", ""],
            "error: --target is empty: give the continuation whose first token is ranked (e.g. ' metre'), or "
            "leave it out to rank the context's last token",
        ),
    ],
)
@pytest.mark.usefixtures("no_loading")
def test_contrast_refuses_empty_input_before_loading(cli, extra, line, capsys):
    assert cli.one_line(["contrast", "--model", "/no/such/model", *extra]) == line


# -- a damaged weights file ---------------------------------------------------------------------------------
@pytest.fixture(params=["empty", "truncated"])
def damaged_model(request, tiny_gpt2_dir, tmp_path) -> tuple[Path, str]:
    folder = tmp_path / f"{request.param}-model"
    shutil.copytree(tiny_gpt2_dir, folder)
    weights = folder / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(b"" if request.param == "empty" else whole[: len(whole) // 2])
    detail = "header too small" if request.param == "empty" else "incomplete metadata, file not fully covered"
    return folder, (
        f"error: cannot load model '{folder}': {weights} ({weights.stat().st_size} bytes) is not a whole "
        f"safetensors file (Error while deserializing header: {detail}): it is empty or was cut short (an "
        "interrupted download or copy); download or convert the model again"
    )


def test_a_damaged_safetensors_file_is_named_by_every_command(cli, damaged_model, tmp_path, capsys):
    """Was: ``SafetensorError: Error while deserializing header: header too small`` traceback."""
    folder, line = damaged_model
    assert cli.last_error(["contrast", "--model", str(folder), "--context", "a b c"]) == line
    evaluate = ["evaluate", "--model.model", str(folder), "--model.output_dir", str(tmp_path / "out")]
    evaluate += [
        "--data.tasks",
        "[copa]",
        "--data.data_root",
        str(DEMO),
        "--data.limit",
        "1",
        *EVAL_QUIET_CPU,
    ]
    assert cli.last_error(evaluate) == line
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("A first prompt.\nA second prompt.\n")
    tune = ["tune", "--model.model", str(folder), "--data.task", "null", "--data.prompts_file", str(prompts)]
    tune += ["--trainer.max_steps", "1", "--trainer.accelerator", "cpu", "--model.export.enabled", "false"]
    # a batch no larger than the prompts, and no validation: the collapse guard off (it refuses a run it
    # could not look at)
    tune += [
        "--data.batch_size",
        "2",
        "--model.guard.max_ppl_ratio",
        "null",
        "--model.guard.min_entropy_ratio",
        "null",
    ]
    tune += ["--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.enable_progress_bar", "false"]
    assert cli.last_error(tune) == line


# -- positional arguments ------------------------------------------------------------------------------------
POSITIONAL = [
    (
        ["zoo", "convert"],
        "error: cblight zoo convert needs its argument NAME: usage: cblight zoo convert NAME [options] (cblight "
        "zoo convert --help)",
    ),
    (
        ["zoo", "convert", "--name", "smollm2-135m"],
        "error: unknown option --name: NAME is a positional argument, given without an option name: usage: "
        "cblight zoo convert NAME [options]",
    ),
]
# data peek's TASK the same way (docs/errors.md quotes zoo convert's lines): what the line names, its fix
POSITIONAL_PARTS = [
    (["data", "peek"], ("cblight data peek", "TASK:"), "usage: cblight data peek TASK [options]"),
    (
        ["data", "peek", "--task", "copa"],
        ("--task:", "TASK is a positional argument"),
        ("given without an option name", "usage: cblight data peek TASK [options]"),
    ),
]


@pytest.mark.parametrize(("argv", "line"), POSITIONAL, ids=[" ".join(a) for a, _ in POSITIONAL])
def test_a_positional_argument_is_named_as_one(cli, argv, line, capsys):
    """Was: ``--convert.name is required`` / ``--peek.task is required`` (no such options), then "unknown
    option --name; did you mean --name?"."""
    assert cli.one_line(argv) == line


@pytest.mark.parametrize(
    ("argv", "names", "fix"), POSITIONAL_PARTS, ids=[" ".join(a) for a, _, _ in POSITIONAL_PARTS]
)
def test_data_peeks_task_is_named_as_a_positional_argument(cli, argv, names, fix, capsys):
    cli.refuses(argv, names=names, fix=fix)


def test_the_usage_the_line_gives_works(cli, capsys):
    status, err, out = cli(["data", "peek", "copa", "--data_dir", str(DEMO / "copa")])
    assert status == 0, err
    assert "copa" in out


# -- a misspelt dotted key, a group given a value -------------------------------------------------------------
DOTTED = [
    (["--model.lora_rnk", "8"], "unknown option --model.lora_rnk; did you mean --model.lora.rank?"),
    (
        ["--model.teacher", "live"],
        "model.teacher is a group of options (ema_decay, kind, refresh_every, trust_region), not a value; did "
        "you mean model.teacher.kind live?",
    ),
    (
        ["--model.teacher", "teacher.yaml"],
        "model.teacher: cannot read 'teacher.yaml' as a config of its options (no such file)",
    ),
]


@pytest.mark.parametrize(("argv", "line"), DOTTED, ids=[" ".join(a) for a, _ in DOTTED])
@pytest.mark.usefixtures("no_loading")
def test_a_misspelt_dotted_key_or_a_group_given_a_value_is_named(cli, argv, line):
    """Was: a group suggested (``--model.export``), which then failed with "Unable to load config"."""
    assert cli.one_line(["tune", *argv]) == f"error: {line}"


@pytest.mark.usefixtures("no_loading")
def test_a_group_given_a_value_is_named_with_the_options_that_take_it(cli):
    cli.refuses(
        ["tune", "--model.export", "false"],
        names=("model.export", "(dir, enabled, overwrite)"),
        fix="did you mean model.export.enabled false or model.export.overwrite false?",
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--model.export.dir", "DIR"],
        ["--model.lora.rank", "8"],
        ["--model.boosting.k", "32"],
        ["--model.teacher.kind", "live"],
        ["--model.export.enabled", "false"],
    ],
)
@pytest.mark.usefixtures("no_loading")
def test_the_new_spelling_parses(cli, argv, capsys):
    """What the lines suggest is accepted: the run goes on to the next check (no prompts' end)."""
    cli.refuses(["tune", *argv], names="trainer.max_steps", fix="set trainer.max_steps:")


@pytest.mark.usefixtures("no_loading")
def test_a_group_given_a_value_in_a_config(cli, tmp_path, capsys):
    path = tmp_path / "old.yaml"
    path.write_text("model:\n  teacher: live\n")
    assert cli.one_line(["tune", "-c", str(path)]) == (
        "error: model.teacher is a group of options (ema_decay, kind, refresh_every, trust_region), not a "
        "value; did you mean model.teacher.kind live?"
    )


# -- config files ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "got"),
    [("[1, 2]\n", "a list"), ("3\n", "a number"), ("just words\n", "a string"), ("", "an empty file")],
)
@pytest.mark.parametrize("command", ["evaluate", "tune", "contrast"])
@pytest.mark.usefixtures("no_loading")
def test_a_config_that_is_not_a_mapping_names_the_file(cli, command, text, got, tmp_path, capsys):
    """Was: ``error: Unexpected config: [1, 2]``, the file unnamed."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    flag = "--config" if command == "contrast" else "-c"
    line = f"error: {path}: the config file must be a mapping of options (key: value), got {got}"
    assert cli.one_line([command, flag, str(path)]) == line


@pytest.mark.parametrize(
    ("command", "config", "line"),
    [
        (
            "generate",
            "configs/multiple_choice.yaml",
            "is a cblight evaluate config (model.batch_size is an option of BoostedEvaluator, not of "
            "BoostedGenerationEvaluator): use cblight evaluate -c configs/multiple_choice.yaml",
        ),
    ],
)
@pytest.mark.usefixtures("no_loading")
def test_another_commands_config_names_that_command(cli, command, config, line, capsys, monkeypatch):
    """Was: ``unknown option model.choice_alphas.start``. (Evaluate and generate take either evaluator as
    ``model.class_path``: a generation config with its class path runs under evaluate.)"""
    monkeypatch.chdir(ROOT)
    assert cli.one_line([command, "-c", config]) == f"error: {config} {line}"


@pytest.mark.parametrize(
    ("command", "config", "option", "other"),
    [
        ("evaluate", "configs/coherence_tuning.yaml", "model.boosting", "tune"),
        ("tune", "configs/lambada.yaml", "model.batch_size", "evaluate"),
    ],
)
@pytest.mark.usefixtures("no_loading")
def test_another_commands_config_names_the_option_and_that_command(
    cli, command, config, option, other, capsys, monkeypatch
):
    monkeypatch.chdir(ROOT)
    cli.refuses(
        [command, "-c", config],
        names=(config, option),
        fix=(f"is a cblight {other} config", f"use cblight {other} -c {config}"),
    )


# -- --model.X.help -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("command", "option", "shown"),
    [
        ("evaluate", "--model.choice_alphas.help", "--model.choice_alphas.step STEP"),
        ("evaluate", "--model.server.help", "--model.server.base_url"),
        ("generate", "--model.decodings.help", "--model.decodings.sampling.top_p TOP_P"),
        ("generate", "--model.grid.help", "--model.grid"),
    ],
)
def test_the_help_of_an_options_class_that_help_advertises(cli, command, option, shown, capsys):
    """Was: ``error: argument --model: expected one argument``."""
    status, _, out = cli([command, "--help"])
    assert status == 0 and option in out  # advertised
    status, err, out = cli([command, option])
    assert status == 0, err
    assert shown in out


# -- transformers' length warning ---------------------------------------------------------------------------
def test_cblights_tokenizers_do_not_warn_about_a_text_past_the_window(tiny16):
    """Every tokenizer cblight loads: lm-eval's ``tok_encode``, the LAMA filter, the rollouts' encoding call
    it directly, and cblight cuts every text to the window itself."""
    from transformers import AutoTokenizer

    from cblight.models import load_tokenizer

    seen: list[str] = []
    collect = logging.Handler()
    collect.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    transformers_logger = logging.getLogger("transformers")
    transformers_logger.addHandler(collect)
    long_text = " a" * 40
    try:
        tok = load_tokenizer(str(tiny16))
        tok.model_max_length = 16
        assert len(tok(long_text)["input_ids"]) == 40 and len(tok.encode(long_text)) == 40
        assert not [m for m in seen if "Token indices sequence length" in m]
        plain = AutoTokenizer.from_pretrained(
            str(tiny16)
        )  # the same tokenizer as transformers loads it warns
        plain.model_max_length = 16
        plain(long_text)
        assert [m for m in seen if "Token indices sequence length" in m]
    finally:
        transformers_logger.removeHandler(collect)


@pytest.mark.usefixtures("no_loading")
def test_a_config_naming_another_commands_class(cli, tmp_path, capsys):
    path = tmp_path / "tuning.yaml"
    path.write_text("model:\n  class_path: cblight.tune.coherence_tuning.CoherenceTuning\n")
    assert cli.one_line(["evaluate", "-c", str(path)]) == (
        f"error: {path} is a cblight tune config (its model.class_path is "
        f"cblight.tune.coherence_tuning.CoherenceTuning): use cblight tune -c {path}"
    )


@pytest.mark.usefixtures("no_loading")
def test_the_help_hint_names_the_command_as_typed(cli, capsys):
    """``cblight tune`` runs LightningCLI's ``fit`` without the word: the hint said ``cblight tune fit --help``."""
    cli.refuses(["tune", "--model.fooo", "3"], names="--model.fooo", fix="cblight tune --help")
