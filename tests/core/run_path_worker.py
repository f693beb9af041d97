"""Run one ``cblight`` command under a profiler and print, as JSON, every package file in which a function
ran, from the first import of the package on: the run path ``docs/design.md`` lists. Functions called while
a module is imported (a task spec's ``register``) count; module and class bodies alone do not.

    python tests/core/run_path_worker.py OUT_DIR evaluate|generate|tune MODEL_DIR

Used by ``tests/core/test_design_map.py``; a tiny random GPT-2 (the test session's, built by another process, so
that its imports are not taken for the command's) and the fixtures stand in for the configs' models and
data.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

PACKAGE = str(ROOT / "cblight") + os.sep
# a comprehension is an expression of the body it sits in (Python 3.12 inlines it), not a function that runs
COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


def arguments(kind: str, out: Path, model: Path) -> list[str]:
    quiet = ["--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false"]
    if kind == "evaluate":
        return [
            "evaluate", "-c", str(ROOT / "configs/multiple_choice.yaml"), "--model.model", str(model),
            "--data.tasks", "[copa]", "--data.data_dirs", json.dumps({"copa": str(ROOT / "tests/fixtures/copa")}),
            "--model.output_dir", str(out / "evaluate"), *quiet,
        ]  # fmt: skip
    if kind == "generate":
        return [
            "generate", "-c", str(ROOT / "configs/webtext_generation.yaml"), "--model.model", str(model),
            "--data.data_dirs", json.dumps({"webtext": str(ROOT / "tests/fixtures/webtext")}),
            "--model.output_dir", str(out / "generate"), "--model.max_new_tokens", "6", "--data.limit", "2",
            "--model.grid.ks", "[4]", "--model.grid.alphas", "[-0.5]", *quiet,
        ]  # fmt: skip
    return [
        "tune", "-c", str(ROOT / "configs/coherence_tuning.yaml"), "--model.model", str(model),
        "--data.data_dir", str(ROOT / "cblight/assets/realdata/webtext"), "--data.split", "test",
        "--data.batch_size", "2", "--data.val_size", "2", "--trainer.max_steps", "2",
        "--model.boosting.k", "4", "--trainer.val_check_interval", "1",
        "--trainer.default_root_dir", str(out / "tune"), "--model.export.dir", str(out / "tune" / "hf"), *quiet,
    ]  # fmt: skip


def main() -> None:
    out, kind, model = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("WANDB_MODE", "disabled")
    sys.path.insert(0, str(ROOT))
    args = arguments(kind, out, model)
    seen: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if event != "call" or code.co_filename in seen or not code.co_filename.startswith(PACKAGE):
            return
        if code.co_flags & inspect.CO_OPTIMIZED and code.co_name not in COMPREHENSIONS:  # not a module body
            seen.add(code.co_filename)

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        from cblight.__main__ import main as cblight

        status = cblight(args)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    files = sorted(os.path.relpath(f, ROOT) for f in seen)
    print(json.dumps({"status": status, "files": files}))


if __name__ == "__main__":
    main()
