"""Every command the README shows runs, and so does every command of the documentation pages that hold the
README's former sections (``SOURCES``: Getting started, Boosted evaluation, the tutorials, Results,
Development); each of the README's ```python blocks runs on its own, in an empty directory, on the tiny model
(the real-model tier, ``tests/realmodel/test_readme_real.py``, runs them as written on SmolLM2, each in a
fresh process, and compares what they print with the ```text block that follows each).

The commands are read from those files' ```bash blocks at test time, so a section added later is picked up
without touching this file: every line starting with ``cblight``, ``python evaluate.py``, ``python train.py``,
``python -m cblight...`` or ``bash scripts/...`` becomes one test, in README order, then the pages' order.
adapted by generic rules (``Adapter``) and nothing command-specific:

* models: a Hub id (``gpt2``, ``gpt2-xl``, ``openai-community/...``, or any model path that does not exist
  here, such as a tuned model's export directory) becomes a tiny random GPT-2 with the real tokenizer,
  wherever it appears: an option's value, a ``--compare`` mapping, or a key of a ``-c`` config (the config
  is rewritten into a working copy of ``configs/``);
* data: ``data_root``, ``data_dirs``, ``data_dir`` and ``data_files`` that do not exist here point at the
  test fixtures (``tests/fixtures/<task>``), with every split the task reads filled in from a fixture file
  when the fixture lacks it (LAMA's 40 relation folders, a selection split);
* size: tiny limits appended (``--data.limit 2``, 6 new tokens, 2 tuning steps of 2 sequences, k = 4 for
  tuning so that its short sequences stay longer than k); ``--trainer.devices N`` (N > 1, GPUs) becomes 2
  CPU processes, run as a subprocess (Lightning's DDP launcher re-runs the command) in the distributed tier
  (``-m distributed``);
* ``bash scripts/X.sh`` runs the command the script ends with (``exec .venv/bin/python ...``) with this
  interpreter: the set-up step it runs first would rebuild ``.venv``, which is the test's own environment.

Commands run in a scratch directory that holds the rewritten configs and links to the rest of the
checkout, so relative output paths (``outputs/...``) land there and later commands find what earlier ones
wrote (the README's resume command reads the checkpoint its first tuning command saved). A command this
file cannot handle fails its test with a message naming it; ``SKIPPED`` lists the commands deliberately
not run, each with its reason.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cblight.errors import CblightError
from tests.helpers import PYTHON_BLOCKS, README, REAL_MODEL_TIER, ROOT, readme_commands

# in-process runs of a tiny model: one thread (see the fixture; the 2-process commands are their own processes)
pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURES = ROOT / "tests" / "fixtures"
DEMO_DATA = ROOT / "cblight" / "assets" / "demo_data"

# (first tokens) -> why the command is not run
SKIPPED: dict[tuple[str, ...], str] = {
    ("bash", "scripts/test.sh"): "runs this very test suite (CI runs it as .ci/run): from a test it would recurse",
    ("bash", "scripts/demo.sh"): (
        "tests/commands/test_demo.py runs it as this file would (--model tiny --quick) and checks every step's files; "
        "the real-model tier (tests/realmodel) runs it with its defaults"
    ),
    ("cblight", "evaluate", "-c", "configs/table11_methods_served.yaml"): (
        "it scores through a served model: tests/realmodel/test_served_real.py runs this very line against "
        "a llama-cpp-python server it starts (the model name, tokenizer and base_url substituted)"
    ),
    **{
        head: (
            "it converts a real model (minutes): tests/realmodel/test_readme_real.py runs it as written, in "
            "the tier that converts the same models into the same cache (converted once per CI run); the "
            "conversion itself is tested on a fake GGUF by tests/core/test_zoo.py"
        )
        for head in REAL_MODEL_TIER
    },
}  # fmt: skip

MODEL_KEYS = {"model", "tokenizer", "metrics_model", "pretrained"}  # keys whose value names a checkpoint
HUB_ID = re.compile(r"^(offline:)?[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # a Hub id, or a zoo name (a real model)
LIMITS = {
    # the commands run one after another in one directory, several into one output directory with other
    # tasks or limits: each replaces the results of the one before (a rerun with other settings is refused)
    "evaluate": [
        "--data.limit", "2", "--data.batch_size", "4", "--trainer.enable_progress_bar", "false",
        "--model.overwrite", "true",
    ],
    "generation": ["--model.max_new_tokens", "4"],  # two prompts: self-BLEU needs two generations
    # as written (cblight lmeval picks --device cpu on a machine without a GPU)
    "lmeval": ["--limit", "4"],
    "demo": ["--model", "tiny", "--quick"],  # its default real model takes ~5 min: a separate tier
    "tune": [
        "--trainer.max_steps", "2", "--trainer.val_check_interval", "1", "--trainer.enable_progress_bar", "false",
        "--data.batch_size", "2", "--data.val_size", "0",
        # no validation: the collapse guard off (it refuses a run it could not look at)
        "--model.guard.max_ppl_ratio", "null", "--model.guard.min_entropy_ratio", "null",
        "--model.boosting.k", "4", "--model.max_new_tokens", "8", "--model.max_prompt_tokens", "24",
        # the commands run one after another in one directory: each replaces the export of the one before
        "--model.export.overwrite", "true",
    ],
}  # fmt: skip
CONFIG_LIMITS = {"every_n_train_steps": 1}  # inside lists (callbacks), where an option cannot reach


def _option_value(tokens: list[str], name: str) -> str | None:
    for i, tok in enumerate(tokens):
        if tok == name and i + 1 < len(tokens):
            return tokens[i + 1]
        if tok.startswith(name + "="):
            return tok.split("=", 1)[1]
    return None


class Adapter:
    """The generic rules of the module docstring, for one scratch directory."""

    def __init__(self, workdir: Path, tiny_model: Path):
        self.workdir = workdir
        self.tiny = str(tiny_model)
        self._fixtures: dict[str, Path] = {}

    # -- checkpoints -----------------------------------------------------------------------------------
    def model(self, value: Any) -> Any:
        """A checkpoint that is not here (a Hub id, a path from another machine) becomes the tiny model."""
        if not isinstance(value, str) or (self.workdir / value).exists():
            return value
        if HUB_ID.match(value) or "/" in value:
            return self.tiny
        return value

    # -- data ------------------------------------------------------------------------------------------
    def fixture_dir(self, task: str) -> Path:
        """A copy of the task's fixture folder with every split it reads present (missing ones filled
        from a fixture file), so alpha* selection and LAMA's 40 relations have files."""
        from cblight.data.registry import get_task

        spec = get_task(task)
        if spec.name in self._fixtures:
            return self._fixtures[spec.name]
        source = next((p for p in (FIXTURES / spec.name, DEMO_DATA / spec.name) if p.is_dir()), None)
        if source is None:
            raise AssertionError(f"no fixture data for task {task!r}: add tests/fixtures/{spec.name}/")
        target = self.workdir / "fixtures" / spec.name
        if not target.exists():
            shutil.copytree(source, target)
            files = sorted(p for p in target.rglob("*") if p.is_file())
            local = spec.source.local
            for patterns in local.files.values() if local else ():
                # combine (LAMA): every pattern needs a file; otherwise the first match of any pattern is read
                missing = (
                    [p for p in patterns if not any(target.glob(p))]
                    if local.combine
                    else (
                        [next(p for p in patterns if "*" not in p)]
                        if not any(any(target.glob(p)) for p in patterns)
                        else []
                    )
                )
                for pattern in missing:
                    same_kind = [f for f in files if f.suffix == Path(pattern).suffix] or files
                    (target / pattern).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(same_kind[0], target / pattern)
        self._fixtures[spec.name] = target
        return target

    def data_root(self, tasks: list[str]) -> str:
        root = self.workdir / "data_root"
        root.mkdir(exist_ok=True)
        for task in tasks:
            link = root / task
            if not link.exists():
                link.symlink_to(self.fixture_dir(task), target_is_directory=True)
        return str(root)

    def _missing(self, value: Any) -> bool:
        """A path named by the README that is not here (relative paths are the scratch directory's)."""
        return isinstance(value, str) and not (self.workdir / value).exists()

    # -- configs and option values -----------------------------------------------------------------------
    def tree(self, node: Any, key: str = "", tasks: list[str] | None = None) -> Any:
        """A config (or a mapping option's value) with the rules applied at every level."""
        if isinstance(node, list):
            return [self.tree(item, key, tasks) for item in node]
        if not isinstance(node, dict):
            if key in MODEL_KEYS:
                return self.model(node)
            return CONFIG_LIMITS.get(key, node)
        out = {}
        for k, v in node.items():
            if k == "compare" and isinstance(v, dict):
                out[k] = {label: self.model(path) for label, path in v.items()}
            elif k == "data_dirs" and isinstance(v, dict):
                out[k] = {t: str(self.fixture_dir(t)) if self._missing(d) else d for t, d in v.items()}
            elif k == "data_files" and isinstance(v, dict):
                out[k] = {t: self._files(t, splits) for t, splits in v.items()}
            elif k == "data_root" and self._missing(v):
                out[k] = self.data_root(list(node.get("tasks") or tasks or []))
            elif k == "data_dir" and self._missing(v) and node.get("task"):
                out[k] = str(self.fixture_dir(node["task"]))
            else:
                out[k] = self.tree(v, k, node.get("tasks") or tasks)
        return out

    def _files(self, task: str, splits: dict[str, str]) -> dict[str, str]:
        from cblight.data.registry import get_task

        spec_files = get_task(task).source.local.files
        folder = self.fixture_dir(task)
        return {
            split: (
                str(next(p for pat in spec_files[split] for p in sorted(folder.glob(pat))))
                if self._missing(f)
                else f
            )
            for split, f in splits.items()
        }

    def config(self, path: str) -> tuple[str, dict]:
        """``-c path``: the rewritten copy (same relative path, inside the scratch directory)."""
        source = ROOT / path
        if not source.is_file():
            raise AssertionError(f"the README names config {path}, which does not exist")
        loaded = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
        tasks = (loaded.get("data") or {}).get("tasks")
        if (loaded.get("data") or {}).get("tasks") and "data_root" not in loaded["data"]:
            loaded["data"]["data_root"] = "data"  # Hub data otherwise: the fixtures stand in
        rewritten = self.tree(loaded, tasks=tasks)
        target = self.workdir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(rewritten, sort_keys=False), encoding="utf-8")
        return path, rewritten

    def command(self, tokens: list[str]) -> tuple[str, list[str], bool]:
        """``(kind, args after the program, needs a subprocess)`` for a README command."""
        if tokens[0] == "bash":
            return self.command(self._script_command(tokens))
        if tokens[0] == "cblight":
            program, args = tokens[1], tokens[2:]
        elif tokens[1] == "-m" and tokens[2] != "cblight":
            program, args = tokens[2].removeprefix("cblight.").split(".")[0], tokens[3:]
        elif tokens[1] == "-m":
            program, args = tokens[3], tokens[4:]
        else:
            program, args = tokens[1], tokens[2:]
        out: list[str] = []
        configs: list[dict] = []
        i = 0
        while i < len(args):
            tok = args[i]
            name, eq, inline = tok.partition("=")
            has_value = bool(eq) or (
                i + 1 < len(args) and not args[i + 1].startswith("--") and name.startswith("-")
            )
            value = inline if eq else (args[i + 1] if has_value else None)
            step = 1 if eq or not has_value else 2
            if name in ("-c", "--config") and value is not None:
                path, loaded = self.config(value)
                configs.append(loaded)
                value = path
            elif (
                value is not None
                and name.lstrip("-").split(".")[-1] in MODEL_KEYS
                and not (program in LIGHTNING_COMMANDS and "." not in name)
            ):  # evaluate's, generate's and tune's bare --model names the module class, not a checkpoint
                value = self.model(value)
            elif value is not None and name == "--model_args":  # lm-eval's key=value,key=value
                pairs = [p.partition("=") for p in value.split(",")]
                value = ",".join(
                    f"{k}={self.model(v) if k in MODEL_KEYS else v}" if sep else k for k, sep, v in pairs
                )
            elif value is not None and name.lstrip("-").split(".")[-1] in (
                "compare",
                "data_dirs",
                "data_files",
            ):
                key = name.lstrip("-").split(".")[-1]
                value = json.dumps(self.tree({key: yaml.safe_load(value)}, tasks=self._tasks(args))[key])
            elif (
                value is not None
                and name.lstrip("-").split(".")[-1] in ("data_root", "data_dir")
                and self._missing(value)
            ):
                tasks = self._tasks(args)
                value = (
                    self.data_root(tasks) if name.endswith("data_root") else str(self.fixture_dir(tasks[0]))
                )
            elif name == "--trainer.devices" and value is not None and value.isdigit() and int(value) > 1:
                value = "2"
                out += ["--trainer.accelerator", "cpu"]
            out += [name, value] if value is not None and not eq else ([f"{name}={value}"] if eq else [name])
            i += step
        ddp = _option_value(out, "--trainer.devices") == "2"
        kind = {"evaluate.py": "evaluate", "train.py": "tune"}.get(program, program)
        if kind == "tune" and out[:1] == ["fit"]:
            out = out[1:]  # train.py's LightningCLI subcommand: cblight tune runs fit
        if kind in ("evaluate", "generate"):
            if "--compare" not in out and not any(t.startswith("--model.model") for t in out):
                out += ["--model.model", self.tiny]
            out += LIMITS["evaluate"]
            if kind == "generate" or _is_generation(out, configs):
                out += LIMITS["generation"]
        else:
            out += LIMITS.get(kind, [])
        return kind, out, ddp

    def _tasks(self, args: list[str]) -> list[str]:
        """The tasks a command names: ``--data.tasks``, or a positional task name (``peek copa``)."""
        from cblight.data.registry import all_tasks

        value = _option_value(args, "--data.tasks")
        if value:
            return list(yaml.safe_load(value))
        return [a for a in args if a in all_tasks()][:1]

    def _script_command(self, tokens: list[str]) -> list[str]:
        """The command a ``scripts/*.sh`` ends with (``exec <python> ...``), its ``"$@"`` filled in."""
        script = ROOT / tokens[1]
        lines = [ln.strip() for ln in script.read_text().splitlines() if ln.strip().startswith("exec ")]
        if not lines:
            raise AssertionError(
                f"{tokens[1]} has no final 'exec <python> ...' line to run without its set-up"
            )
        words = shlex.split(lines[-1])[1:]
        if not words[0].endswith("python"):
            raise AssertionError(f"{tokens[1]} does not end by running python: {lines[-1]!r}")
        words = [w for w in words[1:] if w != "$@"]
        if words[:2] == ["-m", "cblight"]:
            return ["cblight", *words[2:], *tokens[2:]]
        return ["python", *words, *tokens[2:]]


def _is_generation(args: list[str], configs: list[dict]) -> bool:
    paths = [
        str((c.get("model") or {}).get("class_path", "")) for c in configs if isinstance(c.get("model"), dict)
    ]
    named = _option_value(args, "--model") or ""
    return any("Generation" in p for p in paths) or "Generation" in named


LIGHTNING_COMMANDS = ("evaluate", "generate", "tune", "evaluate.py", "train.py")


def _run_command(kind: str, args: list[str]) -> Any:
    """``cblight <kind> <args>`` in this process, as the console script runs it (``cblight.__main__.main``)."""
    from cblight.__main__ import main

    saved = list(sys.argv)
    try:
        return main([kind, *args])
    finally:
        sys.argv[:] = saved


COMMANDS = readme_commands()


def _shape(tokens: list[str]) -> tuple:
    """A command up to its options' values: the program, its words and configs (``-c X``), and the names of
    its other options."""
    shape, i = list(tokens[:2]), 2
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--") and tok != "--print_config":
            shape.append(tok.split("=", 1)[0])
            i += 1 if "=" in tok else 2
        else:
            shape.append(tok)
            i += 1
    return (*shape[:2], *sorted(shape[2:]))


def distinct_runs(commands: list[list[str]], readme: int) -> list[list[str]]:
    """The commands to run: each of the README's (its first ``readme``), and a page's command unless an
    earlier one is the same command up to its options' values (the same code runs again on other text or
    another path: a run of its own would only repeat the work)."""
    runs, shapes = [], set()
    for i, tokens in enumerate(commands):
        if i < readme or _shape(tokens) not in shapes:
            runs.append(tokens)
        shapes.add(_shape(tokens))
    return runs


RUNS = distinct_runs(COMMANDS, len(readme_commands([README])))


def _is_ddp(tokens: list[str]) -> bool:
    """``--trainer.devices N`` (N > 1): the command runs as 2 CPU processes (``Adapter.command``)."""
    value = _option_value(tokens, "--trainer.devices")
    return value is not None and value.isdigit() and int(value) > 1


def _run_params(runs: list[list[str]]) -> list:
    """One parameter per command; a multi-process one (``--trainer.devices N``) belongs to the distributed
    tier (``-m distributed``, the run of the multi-process tests), not to the tiny suite."""
    return [
        pytest.param(
            tokens, id=" ".join(tokens)[:90], marks=[pytest.mark.distributed] if _is_ddp(tokens) else []
        )
        for tokens in runs
    ]


def test_the_readme_has_the_commands_this_file_was_written_for():
    """The extraction itself: a change of the README's format must not quietly leave nothing to run."""
    programs = {" ".join(c[:2]) for c in COMMANDS}
    assert {
        "cblight evaluate",
        "cblight generate",
        "cblight tune",
        "cblight contrast",
        "cblight data",
        "cblight zoo",
        "cblight lmeval",
        "bash scripts/demo.sh",
    } <= programs
    assert len(COMMANDS) >= 40
    readme = readme_commands([README])
    assert {"cblight contrast", "cblight evaluate", "cblight generate", "cblight tune", "cblight lmeval"} <= {
        " ".join(c[:2]) for c in readme
    }
    assert readme == COMMANDS[: len(readme)]  # the README's own commands are all among them, first
    # every README command runs; a page's command runs, or one that differs from it only in option values
    assert RUNS[: len(readme)] == readme
    assert {_shape(c) for c in COMMANDS} == {_shape(c) for c in RUNS}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_gpt2_dir):
    """The scratch directory the commands run in (see the module docstring)."""
    work = tmp_path_factory.mktemp("readme")
    for name in ("cblight", "scripts", "evaluate.py", "train.py", "tests", "custom_generate"):
        (work / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / "configs", work / "configs")
    return Adapter(work, tiny_gpt2_dir)


@pytest.mark.slow
@pytest.mark.parametrize("tokens", _run_params(RUNS))
def test_readme_command_runs(tokens, workdir, monkeypatch):
    skip = next((why for head, why in SKIPPED.items() if tuple(tokens[: len(head)]) == head), None)
    if skip:
        pytest.skip(skip)
    kind, args, ddp = workdir.command(tokens)
    monkeypatch.chdir(workdir.workdir)
    # W&B keeps process-wide state (its settings, the current run): a command that logs to it runs alone
    wandb = any("wandb" in a for a in args)
    if ddp or wandb:
        done = subprocess.run(
            [sys.executable, "-m", "cblight", kind, *args],
            cwd=workdir.workdir,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"},
        )
        assert done.returncode == 0, (
            f"{shlex.join(tokens)}\nran as: cblight {kind} {shlex.join(args)}\n{done.stderr[-4000:]}"
        )
        return
    ran = f"{shlex.join(tokens)}\nran as: cblight {kind} {shlex.join(args)}"
    try:
        result = _run_command(kind, args)
    except SystemExit as exc:
        assert exc.code in (0, None), f"{ran}: exit {exc.code}"
        return
    if isinstance(result, int) and not isinstance(result, bool):  # a main() that returns its exit status
        assert result == 0, f"{ran}: exit {result}"


def test_the_readme_python_blocks_are_the_ones_this_file_was_written_for():
    """Score, generate, tune: each a README block of its own with what it prints (a change of the README's
    format must not quietly leave nothing to run)."""
    readme = [code for where, code, _ in PYTHON_BLOCKS if where.startswith("README")]
    assert len(readme) >= 3
    for name in ["choice_scores", "boosted_generate", "CoherenceTuning"]:
        assert sum(name in code for code in readme) == 1, name
    assert all(printed for _, _, printed in PYTHON_BLOCKS)


def _run_block(code: str, model: Path, workdir: Path) -> str:
    """``code`` run as a program of its own: a fresh namespace (no name from another block), ``workdir`` as
    the current directory, SmolLM2 replaced by ``model``; what it printed."""
    code = code.replace('"offline:smollm2-135m"', repr(str(model)))
    out = io.StringIO()
    saved = Path.cwd()
    os.chdir(workdir)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})
    finally:
        os.chdir(saved)
    return out.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)), ids=[where for where, _, _ in PYTHON_BLOCKS])
def test_readme_python_block_runs_on_its_own(index, tiny_gpt2_dir, tmp_path):
    """Each README python block (and each tutorial block that shows its output) runs alone, in an empty directory, on the tiny GPT-2 (the real-model tier runs
    it as written on SmolLM2 in a fresh process and compares what it prints: tests/realmodel). It writes only
    under ``outputs/`` (in .gitignore), and run again in the same directory it either runs or is refused with
    a message that names the Python fix (``in Python: ...``), not only a command-line flag."""
    _, code, _ = PYTHON_BLOCKS[index]
    printed = _run_block(code, tiny_gpt2_dir, tmp_path)
    assert printed.strip(), "the block printed nothing"
    assert {p.name for p in tmp_path.iterdir()} <= {"outputs"}, sorted(p.name for p in tmp_path.iterdir())
    if (
        "CoherenceTuning" in code
    ):  # the README names the directory the tuning block writes and the rerun's fix
        assert (tmp_path / "outputs" / "readme-tuning" / "hf" / "config.json").is_file()
        assert (tmp_path / "outputs" / "readme-tuning" / "samples.jsonl").is_file()
        with pytest.raises(CblightError, match=r"in Python: .*ExportOptions\(overwrite=True\)"):
            _run_block(code, tiny_gpt2_dir, tmp_path)
        return
    try:
        _run_block(code, tiny_gpt2_dir, tmp_path)
    except CblightError as err:
        assert "in Python: " in str(err), str(err)
