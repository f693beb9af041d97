"""What ``cblight tune`` does to the files of a run, typed as a user would: every output directory is checked
before the model loads, the export directory is one run's alone (locked, never overwritten without
``--model.export.overwrite``), a plain rerun of an interrupted command resumes it, and bad prompts, guard
options or a static cache the model cannot use are refused before the model loads. Refusals are one line
and exit status 2; Lightning's start-up lines do not come before them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT
from tests.tune.tuning_helpers import RUN_PROMPTS, tune_args

ENV = {
    **os.environ,
    "PYTHONPATH": str(ROOT),
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


GUARD_OFF_FIX = "switch the guard off (--model.guard.max_ppl_ratio null --model.guard.min_entropy_ratio null)"


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(RUN_PROMPTS) + "\n")
    return path


def _spawn(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cblight", *args], cwd=cwd, env=ENV, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cblight", *args],
        cwd=cwd,
        env=ENV,
        text=True,
        capture_output=True,
        timeout=1800,  # a hang guard, not a speed limit: a shared machine under load runs a 30 s run 10x slower
    )


# ---------------------------------------------------------------------------------------------------------
# Refused before the model loads, in one line


@pytest.mark.usefixtures("no_loading")
def test_output_directories_are_checked_before_the_model_loads(cli, prompts, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    missing = "/does/not/exist"
    cases = [
        (
            ["--model.export.dir", str(blocker / "export")],
            f"error: model.export.dir '{blocker / 'export'}' cannot be a directory: {blocker} is a file",
        ),
        (
            ["--trainer.default_root_dir", str(blocker / "root")],
            f"error: trainer.default_root_dir '{blocker / 'root'}' cannot be a directory: {blocker} is a file",
        ),
        (
            ["--trainer.logger.save_dir", str(blocker / "logs")],
            f"error: trainer.logger's save_dir '{blocker / 'logs'}' cannot be a directory: {blocker} is a file",
        ),
    ]
    for extra, line in cases:
        assert cli.one_line(tune_args(missing, prompts, *extra)) == line
    assert cli.one_line(["demo", "--output_dir", str(blocker / "demo")]) == (
        f"error: output_dir '{blocker / 'demo'}' cannot be a directory: {blocker} is a file"
    )


@pytest.mark.usefixtures("no_loading")
def test_prompt_and_guard_refusals_come_before_the_model_loads(cli, tiny_gpt2_dir, prompts, tmp_path):
    """Refused with the module made (its options and the checkpoint's config checked) and before its
    tokenizer or weights load (``no_loading``)."""
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    missing = tiny_gpt2_dir
    n = len(RUN_PROMPTS)
    cases = [
        (
            tune_args(missing, empty),
            f"error: the prompt source (prompts_file '{empty}') yields no prompts",
        ),
        (
            tune_args(missing, prompts, "--data.val_size", str(n)),
            f"error: val_size = {n} leaves no training prompts out of {n} from prompts_file '{prompts}'",
        ),
        (
            tune_args(missing, prompts, "--model.guard.min_distinct_ratio", "0.8"),
            "error: the guard checks validation (guard.min_distinct_ratio): set data.val_size > 0",
        ),
        (
            tune_args(missing, prompts, "--model.guard.max_ppl_ratio", "2", "--data.val_size", "2"),
            "error: guard.max_ppl_ratio needs held-out human text: a task source (data.task) with "
            "data.val_size > 0, or data.val_texts_file",
        ),
    ]
    for argv, line in cases:
        assert cli.one_line(argv) == line


@pytest.mark.usefixtures("no_loading")
def test_static_cache_is_refused_from_the_config_alone(cli, tiny_gpt2_dir, prompts, capsys, monkeypatch):
    from transformers import GPT2LMHeadModel

    monkeypatch.setattr(
        GPT2LMHeadModel, "_can_compile_fullgraph", False
    )  # as a model transformers cannot compile
    assert cli.one_line(tune_args(tiny_gpt2_dir, prompts, "--model.rollouts.cache", "static")) == (
        "error: rollouts.cache: static / rollouts.compile: GPT2LMHeadModel does not support transformers' "
        "static cache and compiled decoding; use rollouts.cache: dynamic or auto"
    )


@pytest.mark.usefixtures("no_loading")
def test_an_export_dir_in_use_by_a_running_tune_is_refused(cli, prompts, tmp_path, capsys):
    export = tmp_path / "export"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from cblight.runs import OutputLock; "
         f"OutputLock({str(export)!r}, option='model.export.dir').acquire(); print('held', flush=True); "
         "time.sleep(120)"],
        env=ENV, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        line = cli.one_line(tune_args("/does/not/exist", prompts, "--model.export.dir", str(export)))
    finally:
        holder.kill()
        holder.wait()
    assert line.startswith(
        f"error: model.export.dir '{export}' is in use by another run (pid {holder.pid} on host "
    )
    assert line.endswith("; wait for it to finish or choose another --model.export.dir")


# ---------------------------------------------------------------------------------------------------------
# Whole runs: the export is never overwritten unasked, the start is quiet, a plain rerun resumes


def test_a_finished_export_is_not_overwritten_and_the_run_starts_quietly(tiny_gpt2_dir, prompts, tmp_path):
    args = tune_args(tiny_gpt2_dir, prompts, "--trainer.max_steps", "2", "--model.export.dir", "export")
    args += ["--trainer.enable_progress_bar", "true"]  # Lightning's own bar, which the step bar replaces
    first = _run(args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    noise = (
        "Seed set to",
        "GPU available",
        "TPU available",
        "will override existing callbacks",
        "weights_only",
    )
    assert not [line for line in first.stderr.splitlines() if line.startswith(noise) or noise[3] in line]
    weights = (tmp_path / "export" / "model.safetensors").read_bytes()
    # readable by others, as the offline zoo's models (safetensors writes its file 0600)
    assert {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "export").iterdir() if p.is_file()} == {
        p.name: 0o644 for p in (tmp_path / "export").iterdir() if p.is_file()
    }
    assert (tmp_path / "export").stat().st_mode & 0o777 == 0o755

    second = _run(args, tmp_path)  # the same command again: the finished run's export stays
    assert second.returncode == 2
    assert second.stderr.strip().splitlines() == [
        "error: model.export.dir 'export' already holds an earlier run's export; this run would overwrite it: "
        "choose another --model.export.dir, or pass --model.export.overwrite true to replace it (in Python: "
        "ExportOptions(dir=...) or ExportOptions(overwrite=True))"
    ]
    assert (tmp_path / "export" / "model.safetensors").read_bytes() == weights
    assert not (tmp_path / "outputs" / "coherence_tuning" / "version_1").exists()  # refused before it started

    third = _run([*args, "--model.export.overwrite", "true"], tmp_path)
    assert third.returncode == 0, third.stderr[-3000:]
    assert (tmp_path / "export" / "model.safetensors").exists()
    assert not (tmp_path / "export" / ".cblight.lock").exists()  # released at the end


def _steps_logged(version: Path) -> list[int]:
    import json

    path = version / "samples.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def _interrupt_after(args: list[str], cwd: Path, version: Path, steps: int) -> str:
    proc = _spawn(args, cwd)
    try:
        deadline = time.monotonic() + 240
        while len(set(_steps_logged(version))) < steps:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    return err


@pytest.mark.slow
def test_a_plain_rerun_of_an_interrupted_tune_resumes_it(tiny_gpt2_dir, prompts, tmp_path):
    args = tune_args(tiny_gpt2_dir, prompts, "--trainer.max_steps", "100000", "--model.export.dir", "export")
    runs = tmp_path / "outputs" / "coherence_tuning"
    err = _interrupt_after(args, tmp_path, runs / "version_0", 2)
    ckpt = Path("outputs/coherence_tuning/version_0/checkpoints/last.ckpt")
    saved = torch.load(tmp_path / ckpt, weights_only=True)["global_step"]
    assert (
        f"SIGINT: stopped after step {saved}, checkpoint {ckpt}; rerun the same command to resume from it"
        in err
    )
    assert "weights_only" not in err

    err = _interrupt_after(args, tmp_path, runs / "version_1", 1)  # the same command, typed again
    assert err.splitlines()[0] == (
        f"resuming this command's interrupted run from step {saved} ({ckpt}); to start afresh instead, "
        "delete that checkpoint"
    )
    assert min(_steps_logged(runs / "version_1")) == saved  # went on from the saved step
    assert _steps_logged(runs / "version_0")  # the first run's logs are whole

    other = _interrupt_after([*args, "--model.boosting.k", "2"], tmp_path, runs / "version_2", 1)
    assert "resuming" not in other and min(_steps_logged(runs / "version_2")) == 0  # another config: new run


def test_a_collapsing_tune_is_stopped_by_the_default_guard(peaky_gpt2_dir, prompts, tmp_path):
    """The paper's live teacher at a strong boost and a huge rate, no guard option given: stopped at the
    first validation, exit status 1, the guard's line names the band, nothing exported."""
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(RUN_PROMPTS * 3) + "\n")
    args = tune_args(
        peaky_gpt2_dir, prompts, "--model.boosting.k", "2", "--model.boosting.alpha", "-2",
        "--model.teacher.kind", "live", "--model.optimizer.lr", "0.3", "--model.export.dir", "export",
        "--data.val_size", "2", "--data.val_texts_file", str(texts), "--data.batch_size", "4",
        "--trainer.val_check_interval", "2", "--trainer.max_steps", "6", guard=True,
    )  # fmt: skip
    done = _run(args, tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [x for x in done.stderr.splitlines() if "collapse guard:" in x]
    assert len(lines) == 1, done.stderr[-3000:]  # a failure shows what the run printed instead
    line = lines[0]
    assert " is above guard.max_ppl_ratio = 1.5 x the initial model's " in line or (
        " is below guard.min_entropy_ratio = 0.6 x the initial model's " in line
    ), line
    assert "at step 2; stopped the run, no export; no validation passed before it" in line
    assert "Traceback" not in done.stderr and not (tmp_path / "export").exists()


def test_the_guard_validates_the_final_model_when_its_last_validation_is_stale(
    peaky_gpt2_dir, prompts, tmp_path
):
    """The collapsing run above with validation every 8 steps and 6 steps in all (was: no validation ran, the
    collapsed model was exported, exit 0): the guard has Lightning validate the final model before the
    export, says so, and stops the export."""
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(RUN_PROMPTS * 3) + "\n")
    args = tune_args(
        peaky_gpt2_dir, prompts, "--model.boosting.k", "2", "--model.boosting.alpha", "-2",
        "--model.teacher.kind", "live", "--model.optimizer.lr", "0.3", "--model.export.dir", "export",
        "--data.val_size", "2", "--data.val_texts_file", str(texts), "--data.batch_size", "4",
        "--trainer.val_check_interval", "8", "--trainer.max_steps", "6", guard=True,
    )  # fmt: skip
    done = _run(args, tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "collapse guard: validating the final model (step 6; last validation: none) before the export" in (
        done.stderr
    )
    lines = [x for x in done.stderr.splitlines() if "stopped the run, no export" in x]
    assert len(lines) == 1 and "at step 6; stopped the run, no export" in lines[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "export").exists()


@pytest.mark.usefixtures("no_loading")
def test_a_guard_with_nothing_to_look_at_and_impossible_bands_are_refused(cli, tiny_gpt2_dir, prompts):
    """The default guard with no validation (was: a warning, then an unguarded export), validation turned
    off, and bands typed as percents: one line each, before the model loads."""
    missing = "/does/not/exist"
    line = cli.one_line(tune_args(tiny_gpt2_dir, prompts, guard=True))
    assert line.startswith("error: the collapse guard (on by default)")
    assert line.endswith(f"(data.val_size 0): set data.val_size > 0 (e.g. 8), or {GUARD_OFF_FIX}")
    no_val = tune_args(
        missing, prompts, "--data.val_size", "2", "--trainer.limit_val_batches", "0", guard=True
    )
    assert cli.one_line(no_val).endswith(
        f"trainer.limit_val_batches 0 turns validation off: drop it, or {GUARD_OFF_FIX}"
    )
    line = cli.one_line(tune_args(missing, prompts, "--model.guard.min_distinct_ratio", "80"))
    assert line == "error: model.guard.min_distinct_ratio must be a number in (0, 1] or null, got 80"
    for option, value, words in [("min_entropy_ratio", "60", "(0, 1]"), ("max_ppl_ratio", "0.5", ">= 1")]:
        line = cli.one_line(tune_args(missing, prompts, f"--model.guard.{option}", value))
        assert f"model.guard.{option} must be a" in line and words in line and line.endswith(value), line
