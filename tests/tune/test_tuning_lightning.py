"""Lightning conventions of coherence tuning: SIGTERM (a scheduler's preemption) and Ctrl-C stop a
train.py run within seconds with a resumable last.ckpt, and the resumed run continues from the saved
step; the progress bar counts steps of max_steps."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cblight.tune.callbacks import RichStepProgressBar, StepProgressBar
from cblight.tune.prompt_data import PromptDataModule
from tests.helpers import ROOT
from tests.tune.tuning_helpers import RUN_PROMPTS, tiny_tuning

CONFIG = str(ROOT / "configs" / "coherence_tuning.yaml")

pytestmark = pytest.mark.usefixtures("one_thread")


def _train(model_dir, prompts, root, *extra):
    cmd = [
        sys.executable, str(ROOT / "train.py"), "fit", "-c", CONFIG,
        "--model.model", str(model_dir), "--model.boosting.k", "3", "--model.max_new_tokens", "5",
        "--model.validation.log_samples_every_n_steps", "1", "--model.export.enabled", "false",
        "--data.task", "null", "--data.prompts_file", str(prompts), "--data.batch_size", "2",
        "--data.val_size", "0", "--trainer.default_root_dir", str(root),
        "--model.guard.max_ppl_ratio", "null", "--model.guard.min_entropy_ratio", "null",  # no validation
        "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false", *extra,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=root.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _steps_logged(root: Path) -> list[int]:
    import json

    files = sorted(root.glob("outputs/coherence_tuning/version_*/samples.jsonl"))
    return [json.loads(line)["step"] for f in files[-1:] for line in f.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_within_seconds_and_leaves_a_resumable_checkpoint(signum, tiny_gpt2_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(RUN_PROMPTS))
    root = tmp_path / "run"
    proc = _train(tiny_gpt2_dir, prompts, root, "--trainer.max_steps", "10000")
    try:
        deadline = time.monotonic() + 240
        while len(set(_steps_logged(root))) < 2:  # two steps done (samples are logged every step)
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signum)
        sent = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        stopped_in = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, out.decode()[-3000:]
    assert stopped_in < 30, stopped_in  # one tiny step and a checkpoint: about a second here
    (ckpt,) = root.glob("outputs/coherence_tuning/version_0/checkpoints/last.ckpt")
    saved = torch.load(ckpt, weights_only=True)["global_step"]
    assert saved >= 2 and f"checkpoint {ckpt}; rerun the same command to resume from it" in out.decode()

    if signum == signal.SIGINT:  # the resume is the same either way: check it once
        return
    resumed = _train(
        tiny_gpt2_dir, prompts, root, "--trainer.max_steps", str(saved + 2), "--ckpt_path", str(ckpt)
    )
    out, _ = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, out.decode()[-3000:]
    assert sorted(set(_steps_logged(root))) == [saved, saved + 1]  # the new run went on from the saved step


@pytest.mark.parametrize("rich", [False, True])
def test_progress_bar_counts_steps_of_max_steps(tmp_path, rich, tiny_gpt2_dir):
    import lightning as L
    from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

    module = tiny_tuning(tiny_gpt2_dir)
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[
            RichProgressBar() if rich else TQDMProgressBar()
        ],  # Lightning's default: rich if installed
    )
    trainer.fit(module, PromptDataModule(prompts=RUN_PROMPTS, batch_size=2))
    bar = trainer.progress_bar_callback
    if rich:
        assert isinstance(bar, RichStepProgressBar)
        task = bar.progress.tasks[bar.train_progress_bar_id]
        assert (task.completed, task.total, task.description) == (3, 3, "Tuning")
    else:
        assert isinstance(bar, StepProgressBar)
        assert (bar.train_progress_bar.n, bar.train_progress_bar.total) == (3, 3)
        assert bar.train_progress_bar.desc.startswith("Tuning")


def test_a_deferred_signal_is_recorded_and_a_second_one_stops_at_once(monkeypatch):
    """Tuning's stop (``stop_on_signals(defer=True)``): the first signal is only recorded, the same signal
    delivered twice at once counts once, and a second one 2 s or more later raises ``RunInterrupted``."""
    from cblight import runs
    from cblight.runs import RunInterrupted

    clock = [100.0]
    monkeypatch.setattr(runs.time, "monotonic", lambda: clock[0])
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under a shell's `&`
    with runs.stop_on_signals(defer=True):
        os.kill(os.getpid(), signal.SIGINT)
        assert runs.requested() == signal.SIGINT
        clock[0] += 1.0
        os.kill(os.getpid(), signal.SIGINT)  # forwarded again by a launcher: the same stop
        clock[0] += 1.5
        with pytest.raises(RunInterrupted) as stop:
            os.kill(os.getpid(), signal.SIGTERM)
    assert stop.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGINT) is before
