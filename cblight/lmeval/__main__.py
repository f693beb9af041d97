"""``python -m cblight.lmeval [lm-eval options]``: lm-evaluation-harness's own CLI with the ``cblight`` model
registered and cblight's local tasks on the include path.

Every lm-eval option works as usual (``--tasks``, ``--model_args``, ``--use_cache``, ``--output_path``,
``--log_samples``, ``--limit``, ...); ``--model`` defaults to ``cblight``, ``--include_path`` to
``cblight/lmeval/tasks`` and ``--device`` to ``cuda`` when a GPU is visible, else ``cpu`` (lm-eval's own
default is ``cuda``, which stops a CPU-only machine). Bad cblight options print one ``error: ...`` line and
exit with status 2.
"""

from __future__ import annotations

import sys

from cblight.errors import CblightError


def _has(argv: list[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in argv)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        print("error: lm-eval is not installed; pip install 'cblight[lmeval]'", file=sys.stderr)
        return 2
    import cblight.lmeval.model  # noqa: F401  (registers the cblight model)
    from cblight.lmeval import TASKS_DIR

    listing = bool(args) and args[0] in ("ls", "validate")
    if not listing and not _has(args, "--model"):
        args = ["--model", "cblight", *args]
    if not _has(args, "--include_path"):
        args = [*args, "--include_path", str(TASKS_DIR)]
    if not listing and not _has(args, "--device"):
        import torch

        args = [*args, "--device", "cuda" if torch.cuda.is_available() else "cpu"]
    saved = sys.argv
    sys.argv = ["lm-eval", *args]
    try:
        cli_evaluate()
    except CblightError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
