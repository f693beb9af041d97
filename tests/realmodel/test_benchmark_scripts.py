"""The benchmark script that needs the real model's own file (``benchmarks/lmeval_real_model.py``: SmolLM2's
GGUF from the offline zoo's wheel, through lm-eval) at a tiny size, so that it cannot rot unseen. The
numbers of two PIQA fixture questions mean nothing: the script's output lines are what is checked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.realmodel


def test_lmeval_real_model_script():
    script = [sys.executable, str(ROOT / "benchmarks" / "lmeval_real_model.py")]
    args = ["--piqa-dir", str(ROOT / "tests" / "fixtures" / "piqa"), "--limit", "2", "--alphas", "0,-1"]
    args += ["--threads", "1", "--batch-size", "2"]
    proc = subprocess.run(
        [*script, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("0 |", "-1 |"))]
    assert len(rows) == 2 and all(len(row.split("|")) == 5 for row in rows), proc.stdout
