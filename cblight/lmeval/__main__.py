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


def model_args_help(prog: str = "cblight lmeval") -> str:
    """The start of ``cblight lmeval --help``: what ``--model cblight`` is and its ``--model_args`` with their
    defaults (read from ``CblightLM``'s signature and docstring), before lm-eval's own help."""
    import inspect
    import textwrap

    from docstring_parser import parse

    from cblight.lmeval.model import CblightLM

    about = {
        p.arg_name: " ".join((p.description or "").split()) for p in parse(CblightLM.__doc__ or "").params
    }
    rows = []
    for name, param in inspect.signature(CblightLM.__init__).parameters.items():
        if name in about:
            default = "none" if param.default is None else param.default
            rows.append((f"{name}={default}", about[name]))
    width = max(len(left) for left, _ in rows)
    lines = [
        f"{prog}: lm-evaluation-harness with cblight's model (docs/lmeval.md). Here --model defaults to cblight",
        "(lm-eval's text below says hf), --include_path to cblight/lmeval/tasks (cblight_copa, cblight_piqa) and",
        "--device to cuda when a GPU is visible, else cpu.",
        "",
        "--model cblight: lm-eval's requests scored by the coherence-boosted model: loglikelihood is",
        "log f(cont | context) + alpha * log f(cont | short context) (paper eq. 2); generate_until decodes with",
        "the last-k boosted model; loglikelihood_rolling (perplexity) is never boosted.",
        "",
        "--model_args for cblight (key=value,key=value; default after '='):",
        *(
            textwrap.fill(
                text, 110, initial_indent=f"  {left:<{width}}  ", subsequent_indent=" " * (width + 4)
            )
            for left, text in rows
        ),
        "",
        f"  {prog} --tasks cblight_copa --model_args pretrained=gpt2,alpha=-1,short_context=premise_free",
        "",
        "lm-eval's own options follow.",
        "",
    ]
    return "\n".join(lines)


def _wants_help(args: list[str]) -> bool:
    return any(a in ("-h", "--help") for a in args)


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
    if not listing and _wants_help(args):
        print(model_args_help(prog or "cblight lmeval"))
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
