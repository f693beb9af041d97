"""The README as a new user pastes it, on the model it names (SmolLM2-135M from the offline zoo): each
```python block run as written, alone, in a fresh process and an empty directory, prints the lines of the
```text block that follows it (so do the tutorials' blocks that show their output); the Figure 1 command
prints the line the README shows.

The tiny suite runs the same blocks on a tiny model (``tests/commands/test_readme_commands.py``); only here are the
printed lines compared. They are compared exactly: the same weights, inputs and seeds on CPU in float32 give
the same scores and the same sampled tokens; a different CPU changes logits in their last digits, which can
move a nucleus-sampling draw only if it falls within about 1e-6 of a token's boundary, once in about 1e4
runs of the generation block's 80 draws. Lightning's model summary and progress bar come between the lines
(the tuning block's), so the README's lines must appear in order, not alone.

The documentation's ``cblight zoo convert``/``path`` commands run here, as written, rather than in the tiny
suite: they convert real models, which this tier converts anyway into the same cache, so each model is
converted once per CI run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import PYTHON_BLOCKS, README, REAL_MODEL_TIER, Command, readme_commands

pytestmark = pytest.mark.realmodel
ROOT = Path(__file__).resolve().parents[2]
ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "PYTHONUNBUFFERED": "1",
}


def shows_in_order(expected: list[str], printed: list[str]) -> bool:
    """Every line of ``expected`` is a line of ``printed``, in the same order (other lines may come between)."""
    lines = iter(printed)
    return all(any(line == want for line in lines) for want in expected)


def test_the_order_check_can_fail():
    assert shows_in_order(["a", "c"], ["a", "b", "c"])
    assert not shows_in_order(["c", "a"], ["a", "b", "c"])
    assert not shows_in_order(["a", "x"], ["a", "b", "c"])


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)), ids=[where for where, _, _ in PYTHON_BLOCKS])
def test_readme_python_block_prints_what_the_readme_shows(index, smollm2_dir, tmp_path):
    _, code, expected = PYTHON_BLOCKS[index]
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, **ENV, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.splitlines()
    assert shows_in_order(expected, printed), (
        f"README shows:\n{expected}\nthe block printed:\n{printed[-20:]}"
    )
    assert {p.name for p in tmp_path.iterdir()} <= {"outputs"}  # everything it writes is under outputs/


def _figure1_command() -> tuple[list[str], list[str]]:
    """The README's ``cblight contrast`` line and the ```text block right after its ```bash block."""
    text = README.read_text(encoding="utf-8")
    found = re.search(r"```bash\n(cblight contrast [^\n]*)\n```\n+```text\n(.*?)```", text, re.S)
    assert found, "the README's Figure 1 command is not followed by what it prints"
    return shlex.split(found.group(1)), found.group(2).splitlines()


def test_readme_figure1_command_prints_what_the_readme_shows(smollm2_dir, tmp_path):
    command, expected = _figure1_command()
    done = subprocess.run(
        [sys.executable, "-m", "cblight", *command[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **ENV, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert shows_in_order(expected, done.stdout.splitlines()), done.stdout[-3000:]


# the commands the tiny suite leaves to this tier, as written
ZOO_COMMANDS = [
    c for c in readme_commands() if any(tuple(c[: len(head)]) == head for head in REAL_MODEL_TIER)
]


def test_the_tiny_suite_leaves_the_zoo_commands_to_this_tier():
    assert {tuple(c[:3]) for c in ZOO_COMMANDS} == set(REAL_MODEL_TIER)


@pytest.mark.parametrize("tokens", ZOO_COMMANDS, ids=[" ".join(c) for c in ZOO_COMMANDS])
def test_readme_zoo_command_prints_the_converted_directory(tokens, capsys):
    """``cblight zoo convert NAME`` / ``cblight zoo path NAME`` as the documentation shows them: exit 0, and
    the one line on stdout is the verified conversion in the zoo's cache."""
    from cblight import zoo

    status, err, out = Command(capsys)(tokens[1:])
    assert status in (0, None), "\n".join(err[-20:])
    assert out.strip().splitlines() == [str(zoo.model_dir(zoo.lookup(tokens[-1])))]
    assert (Path(out.strip()) / zoo.MANIFEST).is_file()  # a finished conversion (resolve verified it)
