"""``docs/design.md`` stays true: its module table names every module, and its three run paths are the files
the commands actually run through, functions called at import time included (measured by
``tests/core/run_path_worker.py`` on a tiny model), and each path keeps docs/design.md's layer rules: a run
passes through its own wing only, through no command but the ``cblight`` table and the CLI, and through its
own task's spec only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT

DESIGN = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
PACKAGES_AS_A_WHOLE = ("data", "metrics", "served", "lmeval")  # listed as one row each
WINGS = ("evaluate", "generate", "tune")
# the command layer (docs/design.md, "Layers"): a run enters through the `cblight` table and the CLI only
COMMANDS = ("cblight/demo.py", "cblight/contrast.py", "cblight/lmeval/", "custom_generate/")
TASK = {"evaluate": "copa", "generate": "webtext", "tune": "webtext"}  # what run_path_worker.py runs

pytestmark = pytest.mark.slow


def documented_path(kind: str) -> list[str]:
    block = re.search(rf"```text path:{kind}\n(.*?)```", DESIGN, re.S)
    assert block, f"docs/design.md has no 'path:{kind}' block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def test_every_module_is_in_the_module_table():
    table = DESIGN[DESIGN.index("## Modules") : DESIGN.index("## One run through the files")]
    missing = []
    for path in sorted((ROOT / "cblight").rglob("*.py")):
        rel = path.relative_to(ROOT / "cblight")
        if rel.name == "__init__.py" and len(rel.parts) > 1:
            continue
        top = rel.parts[0]
        name = f"`{top}/`" if top in PACKAGES_AS_A_WHOLE else f"`{rel.as_posix()}`"
        if name not in table:
            missing.append(name)
    assert not missing, f"docs/design.md's module table lacks {missing}"


@pytest.fixture(scope="module")
def workers(tmp_path_factory, tiny_gpt2_dir) -> Iterator[dict[str, tuple[subprocess.Popen, Path]]]:
    """The three measured runs, each a fresh process (its imports are the command's), started together: a
    run is mostly one busy thread, so the three overlap on a machine of two cores or more. Their output goes
    to files (a pipe nobody reads yet could fill and stall a run)."""
    procs = {}
    for kind in WINGS:
        out = tmp_path_factory.mktemp(f"path-{kind}")
        with open(out / "stdout", "w") as stdout, open(out / "stderr", "w") as stderr:
            procs[kind] = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "core" / "run_path_worker.py"), str(out), kind, str(tiny_gpt2_dir)],
                cwd=out, stdout=stdout, stderr=stderr,
            ), out  # fmt: skip
    yield procs
    for proc, _ in procs.values():
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("kind", WINGS)
def test_the_documented_run_path_is_the_real_one(kind, workers):
    proc, out = workers[kind]
    assert proc.wait(timeout=900) == 0, (out / "stderr").read_text()[-3000:]
    stdout = (out / "stdout").read_text()
    ran = json.loads(stdout.strip().splitlines()[-1])
    assert ran["status"] in (0, None)
    files = ran["files"]
    documented = documented_path(kind)
    wings = [f for f in files if f.split("/")[1] in WINGS and f.split("/")[1] != kind]
    assert not wings, f"cblight {kind} ran through another wing's files: {wings}"
    commands = [f for f in files if f.startswith(COMMANDS)]
    assert not commands, f"cblight {kind} ran through another command's files: {commands}"
    tasks = [f for f in files if f.startswith("cblight/data/tasks/")]
    assert tasks == [f"cblight/data/tasks/{TASK[kind]}.py"], f"cblight {kind} ran through task specs {tasks}"
    assert files == documented, (
        f"cblight {kind} ran through files docs/design.md does not list: {sorted(set(files) - set(documented))}; "
        f"listed but not run: {sorted(set(documented) - set(files))}"
    )
