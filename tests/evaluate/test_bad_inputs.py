"""Bad inputs of the evaluation commands: each one is refused with one line naming the option or file (exit status 2),
before any model is loaded, and never turns into a silently wrong number.

Every in-process case runs with the model loader, the tokenizer loader and (for configuration errors) the
data loader replaced by tripwires, so "refused before any loading" is checked, not assumed. The table of
these messages is docs/errors.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cblight.cli import evaluate_cli
from tests.helpers import (
    EVAL_QUIET_CPU,
    ROOT,
    assert_refused,
)

FIXTURES = ROOT / "tests" / "fixtures"
DEMO = ROOT / "cblight" / "assets" / "demo_data"


class Loaded(AssertionError):
    pass


@pytest.fixture
def no_loading(monkeypatch):
    """Tripwires on every loader: a refusal must come before any of them runs. Modules that bind the loaders
    at import are imported first, so none keeps a tripwire after the test."""
    import cblight.contrast as contrast
    import cblight.data.datamodule as datamodule
    import cblight.evaluator as base
    import cblight.generate.generation_evaluator as generation
    import cblight.models as models
    import cblight.sharding as sharding
    import cblight.tune.coherence_tuning  # noqa: F401  (binds load_tokenizer at import)

    def model(*args, **kwargs):
        raise Loaded("a model was loaded before the bad input was refused")

    def data(*args, **kwargs):
        raise Loaded("data was loaded before the bad input was refused")

    for module in (models, generation, contrast, sharding):
        monkeypatch.setattr(module, "load_causal_lm", model)
    monkeypatch.setattr(base, "build_causal_lm", model)
    for module in (models, base, contrast):
        monkeypatch.setattr(module, "load_tokenizer", model)
    monkeypatch.setattr(datamodule, "load_split_records", data)


def refused(
    args: list[str],
    tmp_path: Path,
    capsys,
    names: str | tuple[str, ...] = (),
    fix: str | tuple[str, ...] = (),
) -> str:
    """Run evaluate.py in process; it must exit 2 with one ``error:`` line, the last, which names ``names``
    and gives ``fix`` (``assert_refused``), and write no results; that line."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        evaluate_cli(["--model.output_dir", str(out), *EVAL_QUIET_CPU, *args])
    line = assert_refused(exc.value.code, capsys.readouterr().err.splitlines(), names=names, fix=fix)
    assert not (out / "results.json").exists()
    return line


# -- case 1: NaN and infinity in every grid, alpha and temperature ------------------------------------------
@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        (
            "--model.choice_alphas",
            "[.nan, -1.0]",
            "choice_alphas: every alpha must be a finite number, got nan in [nan, -1.0]",
        ),
        (
            "--model.choice_alphas",
            "{start: .nan, stop: -1.0, step: 0.1}",
            "choice_alphas: alpha grid bounds must be finite, got nan .. -1.0",
        ),
        (
            "--model.choice_alphas",
            "{start: 0.0, stop: -1.0, step: .inf}",
            "choice_alphas: alpha grid step must be positive, got inf",
        ),
    ],
)
def test_nan_and_inf_alphas_are_refused(option, value, message, tmp_path, capsys, no_loading):
    line = refused(
        ["--model.model", "/no/such/model", "--data.tasks", "[copa]", option, value], tmp_path, capsys
    )
    assert line == f"error: {message}"


@pytest.mark.parametrize(
    ("option", "value", "names"),
    [
        ("--model.choice_alphas", "[0.0, .inf]", ("choice_alphas:", "got inf in [0.0, inf]")),
        ("--model.next_token_alphas", "[-.inf]", ("next_token_alphas:", "got -inf in [-inf]")),
    ],
)
def test_inf_alphas_are_refused_naming_the_grid(option, value, names, tmp_path, capsys, no_loading):
    args = ["--model.model", "/no/such/model", "--data.tasks", "[copa]", option, value]
    refused(args, tmp_path, capsys, names=names, fix="every alpha must be a finite number")


@pytest.mark.parametrize(
    ("decodings", "message"),
    [
        (
            "[{name: b, boosting: {alpha: .nan}}]",
            "model.decodings[0].boosting.alpha must be a finite number, got nan",
        ),
        (
            "[{name: t, sampling: {do_sample: true, temperature: .nan}}]",
            "model.decodings[0].sampling.temperature must be a finite number > 0 or null, got nan",
        ),
        (
            "[{name: t, sampling: {do_sample: true, temperature: .inf}}]",
            "temperature must be a finite number",
        ),
        (
            "[{name: p, sampling: {do_sample: true, top_p: .nan}}]",
            "model.decodings[0].sampling.top_p must be a number in (0, 1] or null, got nan",
        ),
    ],
)
def test_nan_in_generation_decodings_is_refused(decodings, message, tmp_path, capsys, no_loading):
    args = ["--model", "BoostedGenerationEvaluator", "--model.model", "/no/such/model"]
    line = refused([*args, "--model.decodings", decodings, "--data.tasks", "[webtext]"], tmp_path, capsys)
    assert message in line
    grid = [*args, "--model.grid", "{alphas: [.nan], ks: [8]}", "--data.tasks", "[webtext]"]
    refused(grid, tmp_path, capsys, names=("model.grid.alphas[0]", "got nan"), fix="must be a finite number")


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--model.boosting.alpha", "model.boosting.alpha must be a finite number, got nan"),
        (
            "--model.sampling.temperature",
            "model.sampling.temperature must be a finite number > 0 or null, got nan",
        ),
        ("--model.sampling.top_p", "model.sampling.top_p must be a number in (0, 1] or null, got nan"),
    ],
)
def test_nan_in_tuning_options_is_refused(option, message, capsys, no_loading, monkeypatch):
    import cblight.tune.coherence_tuning as tuning
    from cblight.cli import exit_on_bad_input, train_cli

    def model(*args, **kwargs):
        raise Loaded("a model was loaded before the bad input was refused")

    monkeypatch.setattr(tuning, "build_causal_lm", model)
    monkeypatch.setattr(tuning, "load_tokenizer", model)
    config = str(ROOT / "configs" / "coherence_tuning.yaml")
    with pytest.raises(SystemExit) as exc:
        exit_on_bad_input(
            lambda: train_cli(["fit", "-c", config, "--model.model", "/no/such/model", option, ".nan"])
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert lines == [f"error: {message}"], err


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_nan_in_contrast_is_refused(value, capsys):
    from cblight.contrast import main

    with pytest.raises(SystemExit) as exc:
        main(["--model", "/no/such/model", "--context", "a b c", f"--alpha={value}"])
    assert exc.value.code == 2
    assert "alpha must be a finite number" in capsys.readouterr().err


def test_nan_alpha_refused_in_a_fresh_process_without_loading_the_model(tmp_path):
    """The command line of the issue, as a user runs it: exit 2 naming the option, not the model path (so
    the model was never opened), and quickly (the time is nearly all imports)."""
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "evaluate.py",
            "--model.model",
            "/no/such/model",
            "--model.choice_alphas",
            "[.nan, -1.0]",
            "--model.output_dir",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-3000:]
    assert (
        done.stderr.strip().splitlines()[-1].startswith("error: choice_alphas: every alpha must be a finite")
    )
    assert "Traceback" not in done.stderr
    # generous: imports take ~5 s on an idle 2-core machine, several times that while other jobs run
    assert elapsed < 120, elapsed
    assert not (tmp_path / "out").exists()


# -- cases 2, 3: an empty task list; an unknown split in data_files -----------------------------------------
def test_empty_task_list_is_an_error(tmp_path, capsys, no_loading):
    line = refused(["--model.model", "/no/such/model", "--data.tasks", "[]"], tmp_path, capsys)
    assert line == "error: tasks is empty: name at least one task, e.g. --data.tasks '[copa]'"


def test_unknown_split_key_in_data_files_is_an_error(tmp_path, capsys, no_loading):
    files = json.dumps({"copa": {"bogus": str(DEMO / "copa" / "val.jsonl")}})
    line = refused(
        ["--model.model", "/no/such/model", "--data.tasks", "[copa]", "--data.data_files", files],
        tmp_path,
        capsys,
    )
    assert line == (
        "error: data_files.copa: unknown split 'bogus'; copa reads ['validation', 'train', 'test'] (report: "
        "'validation', alpha* chosen on: 'train')"
    )


# -- case 5: a data file that is not UTF-8 -------------------------------------------------------------------
def test_data_file_that_is_not_utf8(tmp_path, capsys, tiny_gpt2_dir):
    copa = tmp_path / "copa"
    copa.mkdir()
    shutil.copy(DEMO / "copa" / "train.jsonl", copa / "train.jsonl")
    record = (
        '{"premise": "Caf\xe9 closed.", "choice1": "a", "choice2": "b", "question": "effect", "label": 0}\n'
    )
    (copa / "val.jsonl").write_bytes(record.encode("latin-1"))
    line = refused(
        [
            "--model.model",
            str(tiny_gpt2_dir),
            "--data.tasks",
            "[copa]",
            "--data.data_dirs",
            json.dumps({"copa": str(copa)}),
        ],
        tmp_path,
        capsys,
    )
    assert f"{copa / 'val.jsonl'} is not UTF-8 text" in line
    assert "b'\\xe9' at offset" in line


# -- case 6: an output_dir that is a file, or not writable ---------------------------------------------------
def test_output_dir_that_is_a_file(tmp_path, capsys, no_loading):
    a_file = tmp_path / "results.txt"
    a_file.write_text("x")
    for out, where in ((a_file, "it is a file"), (a_file / "sub", f"{a_file} is a file")):
        line = refused(["--model.model", "/no/such/model", "--model.output_dir", str(out)], tmp_path, capsys)
        assert f"model.output_dir {str(out)!r} cannot be a directory: {where}" in line


def test_output_dir_that_is_not_writable(tmp_path, capsys, no_loading):
    if os.geteuid() != 0:
        locked = tmp_path / "readonly"
        locked.mkdir()
        locked.chmod(0o555)
        target = locked / "out"
    else:  # root writes through permission bits; /sys refuses every new file, root's included
        target = Path("/sys/cblight-out")
        if os.access("/sys", os.W_OK) and _can_create_in(Path("/sys")):
            pytest.skip("no directory here refuses writes to this user")
    line = refused(["--model.model", "/no/such/model", "--model.output_dir", str(target)], tmp_path, capsys)
    assert f"model.output_dir {str(target)!r} is not writable" in line


def _can_create_in(directory: Path) -> bool:
    import tempfile

    try:
        fd, path = tempfile.mkstemp(dir=directory)
    except OSError:
        return False
    os.close(fd)
    os.unlink(path)
    return True


# -- case 8: the README's --compare with the range form of the alpha grid ------------------------------------
def test_range_form_of_the_alpha_grid_survives_a_hyperparameter_round_trip():
    from jsonargparse import Namespace

    from cblight.evaluate.boosted_evaluator import BoostedEvaluator

    expected = [1.0, 0.5, 0.0, -0.5, -1.0]
    for grid in ({"start": 1.0, "stop": -1.0, "step": 0.5}, Namespace(start=1.0, stop=-1.0, step=0.5)):
        assert BoostedEvaluator(model="/no/such/model", choice_alphas=grid).choice_alphas == expected
    with pytest.raises(ValueError, match="unknown key 'begin'"):
        BoostedEvaluator(model="/no/such/model", choice_alphas={"begin": 1.0, "stop": 0.0, "step": 0.5})


def test_compare_with_the_range_form_of_the_alpha_grid(tiny_gpt2_dir, tmp_path):
    """The README's command (``-c configs/multiple_choice.yaml --compare ...``) on the demo COPA data."""
    compare = json.dumps({"base": str(tiny_gpt2_dir), "again": str(tiny_gpt2_dir)})
    out = tmp_path / "cmp"
    payload = evaluate_cli(
        [
            "-c",
            str(ROOT / "configs" / "multiple_choice.yaml"),
            "--compare",
            compare,
            "--data.tasks",
            "[copa]",
            "--data.data_root",
            str(DEMO),
            "--data.limit",
            "4",
            "--model.output_dir",
            str(out),
            "--model.plots",
            "false",
            "--trainer.enable_progress_bar",
            "false",
        ]
    )
    for label in ("base", "again"):
        sweep = payload["runs"][label]["copa"]["sweep"]
        assert len(sweep["alphas"]) == 701 and sweep["alphas"][0] == 2.0 and sweep["alphas"][-1] == -5.0
    assert payload["rows"][0]["base"] == payload["rows"][0]["again"]  # the same checkpoint twice


# -- case 9: messages that say how to proceed -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("task", "keep", "missing"),
    [
        ("piqa", ["valid.jsonl", "valid-labels.lst"], "train.jsonl"),
        ("agnews", ["test.csv"], "train.csv"),
        ("lambada", ["test.jsonl"], "validation.jsonl"),
    ],
)
def test_missing_selection_split_says_how_to_proceed(
    task, keep, missing, tmp_path, capsys, gpt2_tokenizer, monkeypatch
):
    import cblight.data.datamodule as datamodule

    monkeypatch.setattr(datamodule.EvalDataModule, "loaded_tokenizer", gpt2_tokenizer)
    folder = tmp_path / task
    folder.mkdir()
    for name in keep:
        shutil.copy(FIXTURES / task / name, folder / name)
    line = refused(
        [
            "--model.model",
            "/no/such/model",
            "--data.tasks",
            f"[{task}]",
            "--data.data_dirs",
            json.dumps({task: str(folder)}),
        ],
        tmp_path,
        capsys,
    )
    assert "--data.selection false" in line, line
    assert missing in line, line
    looked = line.split("looked for ", 1)[1].split(")", 1)[0].split(", ")
    assert len(looked) == len(set(looked)), f"a file name is listed twice: {looked}"


def test_csqa_record_with_no_choices(tmp_path, capsys, monkeypatch, gpt2_tokenizer):
    import cblight.data.datamodule as datamodule

    monkeypatch.setattr(datamodule.EvalDataModule, "loaded_tokenizer", gpt2_tokenizer)
    folder = tmp_path / "csqa"
    folder.mkdir()
    shutil.copy(FIXTURES / "csqa" / "train_rand_split.jsonl", folder / "train_rand_split.jsonl")
    record = {"id": "x", "answerKey": "A", "question": {"stem": "Where?", "choices": []}}
    (folder / "dev_rand_split.jsonl").write_text(json.dumps(record) + "\n")
    line = refused(
        [
            "--model.model",
            "/no/such/model",
            "--data.tasks",
            "[csqa]",
            "--data.data_dirs",
            json.dumps({"csqa": str(folder)}),
        ],
        tmp_path,
        capsys,
    )
    assert "has no choices" in line and "dev_rand_split.jsonl line 1" in line
    assert "not one of the choice labels" not in line


@pytest.mark.parametrize(
    ("args", "fixed"),
    [
        (["--data.data_dirs", "{rte:/data/rte}"], "'{rte: /data/rte}'"),
        (["--data.data_dirs={rte:/data/rte, cb: /data/cb}"], "'{rte: /data/rte, cb: /data/cb}'"),
        (["--data.data_files", "{rte: {val:/x.jsonl}}"], "'{rte: {val: /x.jsonl}}'"),
    ],
)
def test_yaml_mapping_without_a_space_after_the_colon(args, fixed, tmp_path, capsys, no_loading):
    line = refused(["--model.model", "/no/such/model", "--data.tasks", "[rte]", *args], tmp_path, capsys)
    assert "each key needs a space after its colon" in line and f"write {fixed}" in line


def test_yaml_hint_leaves_valid_mappings_alone():
    from cblight.cli import check_flow_mappings

    assert not check_flow_mappings(
        ["--compare", "{base: gpt2, tuned: hf://org/model}", "--data.data_dirs", "{lama: C:/x}"]
    )
