"""Check once: the README's ``cblight evaluate`` and ``cblight generate`` commands, run on the tiny model as
``tests/commands/test_readme_commands.py`` runs them, make each check of their one check pass (docs/design.md, "One
run through the files") exactly once: the output directory resolved and checked, the options that must fit
the run's tasks, the module's own arguments, generation's token budget and each prompt's fitting."""

from __future__ import annotations

import json
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT

# the size limits tests/commands/test_readme_commands.py appends to every evaluate / generate command
LIMIT = 2
LIMITS = ["--data.limit", str(LIMIT), "--data.batch_size", "4", "--trainer.enable_progress_bar", "false"]


def readme_command(program: str) -> list[str]:
    """The README's first ``cblight <program>`` line, as arguments after the program, comment dropped."""
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith(f"cblight {program} "):
            return shlex.split(line, comments=True)[2:]
    raise AssertionError(f"README.md shows no 'cblight {program}' command")


def counting(monkeypatch: pytest.MonkeyPatch, calls: Counter, owner: Any, name: str) -> None:
    """Replace ``owner.name`` by a wrapper that counts its calls under ``name`` and calls through."""
    real = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


def run(program: str, tiny_gpt2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The README's command, its offline model replaced by the tiny one, in a scratch directory that links
    the checkout's configs and data samples (so its relative paths resolve) and holds its outputs."""
    from cblight.__main__ import main

    for name in ("configs", "cblight"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    args = [str(tiny_gpt2_dir) if a.startswith("offline:") else a for a in readme_command(program)]
    extra = ["--model.max_new_tokens", "4"] if program == "generate" else []
    return main([program, *args, *LIMITS, *extra])


def results(outputs: Path) -> dict[str, Any]:
    """The one ``results.json`` a run wrote under ``outputs``."""
    (path,) = outputs.rglob("results.json")
    return json.loads(path.read_text())


@pytest.mark.slow
def test_evaluate_checks_once(tiny_gpt2_dir, tmp_path, monkeypatch):
    import cblight.cli as cli
    import cblight.evaluate.boosted_evaluator as boosted
    import cblight.evaluator as evaluator

    calls: Counter = Counter()
    counting(monkeypatch, calls, evaluator, "resolve_output_dir")
    counting(monkeypatch, calls, cli, "check_output_dir")
    counting(monkeypatch, calls, boosted.BoostedEvaluator, "check_tasks")
    counting(monkeypatch, calls, boosted, "check_arguments")
    assert run("evaluate", tiny_gpt2_dir, tmp_path, monkeypatch) == 0
    assert results(tmp_path / "outputs")["tasks"]["csqa"]["report"]["n"] == LIMIT  # it ran to the end
    assert calls == {"resolve_output_dir": 1, "check_output_dir": 1, "check_tasks": 1, "check_arguments": 1}


@pytest.mark.slow
def test_generate_checks_once(tiny_gpt2_dir, tmp_path, monkeypatch):
    import cblight.cli as cli
    import cblight.evaluator as evaluator
    import cblight.generate.generation_evaluator as generation

    calls: Counter = Counter()
    counting(monkeypatch, calls, evaluator, "resolve_output_dir")
    counting(monkeypatch, calls, cli, "check_output_dir")
    counting(monkeypatch, calls, generation, "check_arguments")
    counting(monkeypatch, calls, generation, "prompt_room")  # the token budget: one task
    counting(monkeypatch, calls, generation, "fit_example")  # each prompt, for every decoding row
    assert run("generate", tiny_gpt2_dir, tmp_path, monkeypatch) == 0
    assert results(tmp_path / "outputs")["tasks"]["webtext"]["n"] == LIMIT
    assert calls == {
        "resolve_output_dir": 1,
        "check_output_dir": 1,
        "check_arguments": 1,
        "prompt_room": 1,
        "fit_example": LIMIT,
    }
