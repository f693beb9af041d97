"""train.py's LightningCLI: the configs parse, a tiny end-to-end run writes CSV logs, an offline W&B run
(loss, KL, log-prob gap, tokens/s, a samples table, the config) and a loadable Hugging Face export, and
bad options fail before any work starts."""

import contextlib
import glob
import io
import json
import struct
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForCausalLM

from cblight.cli import train_cli
from cblight.errors import ConfigError
from cblight.options import Boosting
from cblight.tune.coherence_tuning import CoherenceTuning
from tests.helpers import ROOT

CONFIG = str(ROOT / "configs" / "coherence_tuning.yaml")
WANDB = str(ROOT / "configs" / "logger" / "wandb.yaml")


pytestmark = pytest.mark.usefixtures("one_thread")


def _print_config(*configs: str) -> dict:
    args = ["fit"] + [a for c in configs for a in ("-c", c)] + ["--print_config"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        train_cli(args=args)
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(out.getvalue())


def test_configs_parse_with_the_paper_defaults():
    config = _print_config(CONFIG)
    assert config["trainer"]["max_steps"] == 32
    assert config["data"]["batch_size"] == 32
    assert (config["data"]["task"], config["data"]["split"]) == ("webtext", "train")  # first sentences
    model = config["model"]
    boosting = model["boosting"]
    assert (model["max_new_tokens"], boosting["mode"], boosting["k"], boosting["alpha"]) == (
        32,
        "last_k",
        32,
        -0.05,
    )
    assert model["teacher"] == {
        "kind": "frozen",
        "ema_decay": 0.9,
        "refresh_every": None,
        "trust_region": 0.0,
    }
    assert model["rollouts"] == {"cache": "auto", "compile": None}
    assert model["guard"] == {  # on by default, with the band docs/tuning.md justifies
        "max_ppl_ratio": 1.5,
        "min_entropy_ratio": 0.6,
        "min_distinct_ratio": None,
        "max_repetition": None,
    }
    assert (model["sampling"]["do_sample"], model["sampling"]["seed"]) == (True, 0)
    assert (model["loss"]["divergence"], model["loss"]["teacher_top_k"], model["lora"]["rank"]) == (
        "forward_kl",
        None,
        0,
    )
    assert model["export"] == {"enabled": True, "dir": "outputs/tuning/gpt2-large/hf", "overwrite": False}
    assert model["optimizer"]["class_path"] == "torch.optim.AdamW"
    assert model["optimizer"]["init_args"]["lr"] == 1e-5
    assert config["trainer"]["logger"]["class_path"].endswith("CSVLogger")

    with_wandb = _print_config(CONFIG, WANDB)
    loggers = with_wandb["trainer"]["logger"]
    assert [lg["class_path"].rsplit(".", 1)[1] for lg in loggers] == ["CSVLogger", "WandbLogger"]
    assert loggers[1]["init_args"]["offline"] is True and loggers[1]["init_args"]["project"] == "cblight"
    first_line = Path(CONFIG).read_text().splitlines()[0]
    assert "Table 2" in first_line or "coherence tuning" in first_line.lower()


def _wandb_records(path: str) -> list:
    """Records of an offline W&B run file (LevelDB-log framing: 32 KiB blocks, 7-byte record headers)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, pending, records = 7, b"", []
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        if room < 7:
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            pos += room - 7
            continue
        chunk, pos = data[pos : pos + length], pos + length
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            records.append(pending + chunk)
    parsed = []
    for raw in records:
        record = pb.Record()
        record.ParseFromString(raw)
        parsed.append(record)
    return parsed


def test_end_to_end_with_csv_and_offline_wandb(tiny_gpt2_dir, tmp_path, monkeypatch):
    """Everything the run writes (CSV and W&B logs, checkpoints, the export) lands under
    --trainer.default_root_dir, nothing in the working directory; learning rate, gradient norm and the
    held-out perplexity are logged to both."""
    import wandb

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps({"text": t})
            # two training prompts for a batch of 2 (a batch larger than the prompts is refused), one held out
            for t in [
                "The quick brown fox jumps",
                "A journey of a thousand miles",
                "Once upon a time there was",
            ]
        )
    )
    human = tmp_path / "human.txt"
    human.write_text("Some held-out human text to score.\nAnd a second line of it.\n")
    root = tmp_path / "run"
    args = [
        "fit", "-c", CONFIG, "-c", WANDB,
        "--model.model", str(tiny_gpt2_dir), "--model.boosting.k", "3", "--model.max_new_tokens", "5",
        "--model.validation.log_samples_every_n_steps", "1",
        "--data.task", "null", "--data.prompts_file", str(prompts), "--data.batch_size", "2",
        "--data.val_size", "1", "--data.val_texts_file", str(human),
        "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.default_root_dir", str(root),
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
    ]  # fmt: skip
    try:
        train_cli(args=args)
    finally:
        wandb.finish()

    assert sorted(p.name for p in tmp_path.iterdir()) == ["human.txt", "prompts.jsonl", "run"]
    (run_dir,) = glob.glob(f"{root}/outputs/*/version_*")
    header = Path(run_dir, "metrics.csv").read_text().splitlines()[0].split(",")
    for name in [
        "train/tuning/loss",
        "train/tuning/kl_long",
        "train/tuning/logprob_gap",
        "train/tuning/lr",
        "train/tuning/grad_norm",
        "val/tuning/kl",
        "val/tuning/ppl",
    ]:
        assert name in header, name
    assert yaml.safe_load(Path(run_dir, "config.yaml").read_text())["model"]["boosting"]["k"] == 3
    samples = [json.loads(line) for line in Path(run_dir, "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {0, 1} and all("sample" in s for s in samples)
    # the config's relative export.dir is under the root too
    assert AutoModelForCausalLM.from_pretrained(root / "outputs/tuning/gpt2-large/hf") is not None
    (last,) = glob.glob(f"{run_dir}/checkpoints/last.ckpt")
    # a checkpoint of a CLI run reloads with its option objects
    reloaded = CoherenceTuning.load_from_checkpoint(last)
    assert reloaded.boosting == Boosting(k=3, alpha=-0.05)
    assert reloaded.validator.options.log_samples_every_n_steps == 1

    (wandb_file,) = glob.glob(f"{root}/outputs/wandb/offline-run-*/run-*.wandb")
    records = _wandb_records(wandb_file)
    history = {
        item.key or "/".join(item.nested_key)
        for r in records
        if r.HasField("history")
        for item in r.history.item
    }
    for name in [
        "train/tuning/loss",
        "train/tuning/kl_long",
        "train/tuning/logprob_gap",
        "train/tuning/tokens_per_s",
        "train/tuning/lr",
        "train/tuning/grad_norm",
        "val/tuning/kl",
        "val/tuning/ppl",
    ]:
        assert name in history, name
    assert any(key.startswith("train/tuning/samples") for key in history)
    config_keys = {u.key for r in records if r.HasField("config") for u in r.config.update}
    assert "config" in config_keys and "boosting" in config_keys
    (table,) = glob.glob(
        f"{root}/outputs/wandb/offline-run-*/files/media/table/train/tuning/samples_*.table.json"
    )[:1]
    assert json.loads(Path(table).read_text())["columns"] == ["step", "prompt", "sample"]


def test_wandb_without_the_package_fails_before_any_work(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    # The model path does not exist either: the W&B check must come first.
    with pytest.raises(
        ConfigError,
        match=r"WandbLogger needs the wandb package, which is not installed: pip install 'cblight\[wandb\]'",
    ):
        train_cli(args=["fit", "-c", CONFIG, "-c", WANDB, "--model.model", "/does/not/exist"])


def test_bad_checkpoint_paths_fail_before_any_work(tiny_gpt2_dir, tmp_path):
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    for ckpt, message in [
        (tmp_path / "missing.ckpt", "does not exist"),
        (tiny_gpt2_dir, "Hugging Face model directory"),
        (tmp_path / "notes.ckpt", "not a Lightning checkpoint"),
    ]:
        with pytest.raises(ConfigError, match=message):
            train_cli(
                args=["fit", "-c", CONFIG, "--model.model", "/does/not/exist", "--ckpt_path", str(ckpt)]
            )


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("--model.loss.divergence", "kl", "loss.divergence"),
        ("--model.teacher.kind", "teacher_model", "teacher.kind"),
        ("--model.loss.beta", "1.5", "loss.beta"),
        ("--model.loss.teacher_top_k", "0", "loss.teacher_top_k"),
        ("--model.teacher.ema_decay", "1.0", "teacher.ema_decay"),
        ("--model.teacher.ema_decay", "0", "teacher.ema_decay"),
        ("--model.lora.rank", "8", "lora.rank"),
        ("--model.boosting.alpha", "0", "boosting.alpha"),
        ("--model.boosting.mode", "response", "boosting.mode"),
        ("--model.sampling.do_sample", "false", "sampling.do_sample"),
        ("--model.validation.text_tokens", "1", "validation.text_tokens"),
    ],
)
def test_bad_tuning_options_exit_2_with_one_line(option, value, named, capsys, monkeypatch):
    """As train.py runs it: one line naming the option, exit status 2, before any work (the model path does
    not exist, so anything that got further would fail differently)."""
    import importlib.util

    from cblight.runs import exit_on_bad_input

    if named == "lora.rank":  # LoRA asked for without peft installed
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "peft" else real(n, *a))
    with pytest.raises(SystemExit) as exit_info:
        exit_on_bad_input(
            lambda: train_cli(args=["fit", "-c", CONFIG, "--model.model", "/does/not/exist", option, value])
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and named in err[0], err


@pytest.mark.slow
def test_train_py_refuses_a_bad_option_in_one_line(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "fit", "-c", CONFIG, "--model.loss.beta", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()  # Lightning's "Seed set to 0" may come first
    assert lines[-1] == "error: model.loss.beta must be a number in [0, 1], got 2"
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--trainer.max_steps", "0", "--model.export.dir", "tuned"],
            "error: trainer.max_steps = 0 takes no optimizer step, so nothing would be tuned or exported; "
            "set it to 1 or more (the paper runs 32)",
        ),
        (
            ["--data.split", "valid"],
            "error: data.split 'valid' is not a split of task 'webtext': its splits are test, train, "
            "validation; use --data.split validation",
        ),
    ],
)
def test_tuning_messages_name_the_fix(args, line, tmp_path):
    """max_steps 0 once exported the base model as "tuned" (exit 0); data.split valid once said
    "looked for nothing ... Use webtext.test.jsonl". Typed as a user would, before any model is loaded (the
    model path does not exist, so anything that got further would fail differently)."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "cblight", "tune", "-c", CONFIG, "--model.model", "/does/not/exist", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr
    errors = [x for x in proc.stderr.strip().splitlines() if not x.startswith("Seed set")]
    assert errors == [line]
    assert not any(tmp_path.iterdir())  # no export, no logs


def test_cblight_tune_checks_each_thing_once(tiny_gpt2_dir, tmp_path, monkeypatch):
    """``cblight tune`` as docs/tuning.md runs it (webtext prompts, the default guard with validation, an
    export directory), at a tiny size: every check runs once in the run, however many layers (the check
    pass, the module, its callbacks) could ask, and the data module and each option group are made once."""
    import collections
    import functools
    import sys

    from cblight.cli import tune_cli
    from cblight.options import Boosting, Sampling
    from cblight.runs import OutputLock
    from cblight.tune import export, preflight, prompt_data
    from cblight.tune.callbacks import GuardOptions
    from cblight.tune.export import ExportOptions
    from cblight.tune.lora import LoraOptions
    from cblight.tune.loss import LossOptions
    from cblight.tune.rollouts import RolloutOptions, RolloutSampler
    from cblight.tune.teacher import TeacherOptions
    from cblight.tune.validation import ValidationOptions

    calls: collections.Counter = collections.Counter()

    def counted(name, fn):
        @functools.wraps(fn)  # the parser reads the signature of what it builds
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    functions = {
        "check_max_steps": preflight.check_max_steps,
        "check_strategy": preflight.check_strategy,
        "check_shared_options": preflight.check_shared_options,
        "check_validation_data": preflight.check_validation_data,
        "check_split": prompt_data.check_split,
        "check_export_dir": export.check_export_dir,
    }
    for name, fn in functions.items():  # every module that imported it by name
        for module in [m for m in list(sys.modules.values()) if m.__name__.startswith("cblight")]:
            if getattr(module, name, None) is fn:
                monkeypatch.setattr(module, name, counted(name, fn))
    methods = {
        "check_prompts": (RolloutSampler, "check_prompts"),
        "check_batch_size": (prompt_data.PromptDataModule, "check_batch_size"),
        "check_config": (RolloutOptions, "check_config"),
        "PromptDataModule": (prompt_data.PromptDataModule, "__init__"),
    }
    groups = (Boosting, Sampling, RolloutOptions, TeacherOptions, LossOptions, LoraOptions, ValidationOptions)
    for cls in (*groups, GuardOptions, ExportOptions):
        methods[cls.__name__] = (cls, "__post_init__")
    for name, (owner, attribute) in methods.items():
        monkeypatch.setattr(owner, attribute, counted(name, getattr(owner, attribute)))
    acquire = OutputLock.acquire

    def export_lock(self):
        calls[f"lock {self.option}"] += 1
        return acquire(self)

    monkeypatch.setattr(OutputLock, "acquire", export_lock)
    monkeypatch.chdir(tmp_path)
    args = [
        "-c", CONFIG, "--model.model", str(tiny_gpt2_dir), "--model.boosting.k", "3",
        "--model.max_new_tokens", "5", "--model.export.dir", "tuned",
        "--data.data_dir", str(ROOT / "tests" / "fixtures" / "webtext"), "--data.split", "test",
        "--data.batch_size", "1", "--data.val_size", "1",
        "--trainer.max_steps", "1", "--trainer.val_check_interval", "1", "--trainer.accelerator", "cpu",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
    ]  # fmt: skip
    tune_cli(args)
    assert (tmp_path / "tuned" / "config.json").is_file()  # the run went through: each check had its say
    once = [*functions, *methods, "lock model.export.dir"]
    assert {name: calls[name] for name in once} == dict.fromkeys(once, 1)
