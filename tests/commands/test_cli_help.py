"""The ``cblight`` command: one table of subcommands, and each subcommand's ``--help`` opening with its own
options (not behind ``--model.help BoostedEvaluator``, where a user would not look for them)."""

from __future__ import annotations

import inspect
import runpy
import subprocess
import sys

import pytest

from cblight.__main__ import COMMANDS, main
from cblight.evaluate.boosted_evaluator import BoostedEvaluator
from cblight.generate.generation_evaluator import BoostedGenerationEvaluator
from cblight.tune.coherence_tuning import CoherenceTuning
from tests.helpers import ROOT


def help_of(cli, argv: list[str]) -> str:
    """What ``cblight <argv>`` prints, checking that it exits with status 0."""
    status, _, out = cli(argv)
    assert status in (0, None), argv
    return out


def test_cblight_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("evaluate", "generate", "tune", "contrast", "data", "zoo", "demo", "lmeval"):
        assert f"\n  {name} " in out, name
    assert set(COMMANDS) == {"evaluate", "generate", "tune", "contrast", "data", "zoo", "demo", "lmeval"}


def test_an_unknown_subcommand_is_one_line_with_the_closest_name(capsys):
    assert main(["evalute"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: unknown command 'evalute'; did you mean 'evaluate'? (cblight --help lists them)"]


def _init_args(cls: type) -> list[str]:
    return [
        name for name in inspect.signature(cls.__init__).parameters if name not in ("self", "args", "kwargs")
    ]


@pytest.mark.parametrize(
    ("command", "cls"), [("evaluate", BoostedEvaluator), ("generate", BoostedGenerationEvaluator)]
)
def test_evaluate_and_generate_help_open_with_their_evaluator_options(cli, command, cls, capsys):
    out = help_of(cli, [command, "--help"])
    assert out.startswith(f"usage: cblight {command} -c CONFIG")
    head = out.split("\noptions:", 1)[0]  # before LightningCLI's own option list (trainer, ...)
    for name in _init_args(cls):
        assert f"--model.{name} " in head or f"--model.{name}\n" in head, name
    assert "--data.tasks" in head and head.index("--model.model") < head.index("--data.tasks")
    # the docstring's text, parsed by jsonargparse (no hand-written regex)
    doc = "multiple-choice grid (paper eq. 2)" if cls is BoostedEvaluator else "base LM of perplexity, LTF"
    assert doc in " ".join(head.split())


def test_tune_help_opens_with_the_module_options(cli, capsys):
    out = help_of(cli, ["tune", "--help"])
    assert out.startswith("usage: cblight tune -c CONFIG")
    lines = [line.split()[0] for line in out.splitlines() if line.startswith("  --")]  # option lines
    first = {
        prefix: next(i for i, o in enumerate(lines) if o.startswith(prefix))
        for prefix in ("--model.", "--data.", "--trainer.")
    }
    assert first["--model."] < first["--data."] < first["--trainer."], first
    for name in _init_args(CoherenceTuning):
        assert f"--model.{name}" in out, name


@pytest.mark.parametrize("command", ["contrast", "data", "zoo", "demo"])
def test_other_subcommands_name_themselves_in_their_usage(cli, command, capsys):
    out = help_of(cli, [command, "--help"])
    assert out.startswith(f"usage: cblight {command} "), out[:200]


def test_console_script_and_python_m_cblight_are_the_same_command():
    """``python -m cblight`` runs ``cblight.__main__.main``, the ``cblight`` console script of pyproject.toml."""
    assert 'cblight = "cblight.__main__:main"' in (ROOT / "pyproject.toml").read_text()
    done = subprocess.run(
        [sys.executable, "-m", "cblight", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "commands:" in done.stdout


def test_evaluate_py_is_an_alias_of_cblight_evaluate(monkeypatch, capsys):
    # the script run as ``python evaluate.py --help`` runs it, in this process (a fresh one would only add
    # the import of Lightning: the closed-pipe test below runs the command as a process)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "evaluate.py"), "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "evaluate.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert done.value.code in (0, None) and out.startswith("usage: evaluate.py -c CONFIG"), out[:500]


@pytest.mark.parametrize("argv", [["--help"], ["evaluate", "--help"]])
def test_help_into_a_closed_pipe_leaves_no_traceback(argv):
    # ``cblight --help | head -1``: the reader is gone before cblight writes (closed right after the start)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cblight", *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert err.decode() == "", err.decode()[-2000:]
