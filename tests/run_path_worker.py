"""Run one ``cblight`` command under a profiler and print, as JSON, every package file in which a function
ran: the run path ``docs/design.md`` lists. What runs while a module is being imported (module and class
bodies, registrations) does not count: it is the import, not the run.

    python tests/run_path_worker.py OUT_DIR evaluate|generate|tune

Used by ``tests/test_design_map.py``; a tiny random GPT-2 and the fixtures stand in for the configs' models
and data.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = str(ROOT / "cblight") + os.sep


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
    out, kind = Path(sys.argv[1]), sys.argv[2]
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("WANDB_MODE", "disabled")
    sys.path.insert(0, str(ROOT))
    from cblight.__main__ import main as cblight
    from cblight.tiny import build_tiny_gpt2

    model = build_tiny_gpt2(out / "tiny-gpt2")
    args = arguments(kind, out, model)
    seen: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if event != "call" or code.co_filename in seen or not code.co_filename.startswith(PACKAGE):
            return
        if not code.co_flags & inspect.CO_OPTIMIZED:  # a module or class body
            return
        caller = frame.f_back
        while caller is not None:  # called while a module is being imported (this script's own aside)
            if caller.f_code.co_name == "<module>" and caller.f_globals.get("__name__") != "__main__":
                return
            caller = caller.f_back
        seen.add(code.co_filename)

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        status = cblight(args)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    files = sorted(os.path.relpath(f, ROOT) for f in seen)
    print(json.dumps({"status": status, "files": files}))


if __name__ == "__main__":
    main()
