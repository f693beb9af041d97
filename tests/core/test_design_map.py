"""``docs/design.md`` stays true: its module table names every module, and its three run paths are the files
the commands actually run through, functions called at import time included (measured by
``tests/core/run_path_worker.py`` on a tiny model), and no longer than they were when import-time calls were first
counted."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

DESIGN = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
PACKAGES_AS_A_WHOLE = ("data", "metrics", "served", "lmeval")  # listed as one row each
# files a run passes through; before import-time calls were counted the paths were 23, 34 and 28 files long,
# then 21, 29 and 28; sharding.py (the one home of building a model for the run's strategy, whole or FSDP2's
# shards) joined all three
LONGEST_PATH = {"evaluate": 22, "generate": 30, "tune": 29}

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


@pytest.mark.parametrize("kind", ["evaluate", "generate", "tune"])
def test_the_documented_run_path_is_the_real_one(kind, tmp_path, tiny_gpt2_dir):
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "core" / "run_path_worker.py"), str(tmp_path), kind, str(tiny_gpt2_dir)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ran = json.loads(done.stdout.strip().splitlines()[-1])
    assert ran["status"] in (0, None)
    files = ran["files"]
    documented = documented_path(kind)
    assert len(documented) <= LONGEST_PATH[kind], f"the {kind} run path grew to {len(documented)} files"
    assert files == documented, (
        f"cblight {kind} ran through files docs/design.md does not list: {sorted(set(files) - set(documented))}; "
        f"listed but not run: {sorted(set(documented) - set(files))}"
    )
