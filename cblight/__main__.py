"""``cblight``: one command, one table of subcommands (``COMMANDS``), each with its own ``--help``.

    cblight evaluate -c configs/multiple_choice.yaml --model.model gpt2 --data.tasks '[copa]'
    cblight generate -c configs/webtext_generation.yaml --data.data_dirs '{webtext: DIR}'
    cblight tune -c configs/coherence_tuning.yaml
    cblight contrast | data | zoo | demo | lmeval ...

The console script ``cblight`` and ``python -m cblight`` run ``main``. Each subcommand is a function
``module:function(args, prog)``, called with the arguments after the subcommand and ``prog = "cblight
<subcommand>"`` (its usage lines name the command as it was run). ``sys.argv`` is left whole: Lightning's
DDP launcher re-runs it in every worker process. Modules are imported only for the subcommand that runs
(``cblight --help`` stays fast).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from cblight import __version__

__all__ = ["COMMANDS", "main"]


#: Each subcommand: its entry point (``module:function``, called with the remaining arguments and its
#: ``prog``) and the line ``cblight --help`` shows.
COMMANDS: dict[str, tuple[str, str]] = {
    "evaluate": (
        "cblight.cli:evaluate_cli",
        "boosted evaluation: alpha* (k*) chosen, then reported (Tables 1, 4, 5, 11, 12)",
    ),
    "generate": (
        "cblight.cli:generate_cli",
        "generation with and without boosting, the paper's metrics (Tables 2, 3)",
    ),
    "tune": ("cblight.cli:tune_cli", "coherence tuning toward the boosted model (appendix)"),
    "contrast": (
        "cblight.contrast:main",
        "Figure 1: next-token tops under the full, short and boosted model",
    ),
    "data": ("cblight.data.__main__:main", "the benchmarks: list them, peek at a rendered example"),
    "zoo": ("cblight.zoo:main", "the offline pretrained models: list, convert, path"),
    "demo": ("cblight.demo:main", "the paper's whole loop on a real pretrained model, offline"),
    "lmeval": ("cblight.lmeval.__main__:main", "lm-evaluation-harness with the cblight model registered"),
}


def command_help() -> str:
    width = max(map(len, COMMANDS))
    rows = [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    return "\n".join(
        [
            "usage: cblight COMMAND [OPTIONS]   (cblight COMMAND --help: its options)",
            "",
            f"cblight {__version__}: coherence boosting and coherence tuning of causal language models "
            "(Malkin, Wang & Jojic, ACL 2022).",
            "",
            "commands:",
            *rows,
            "",
            "  cblight evaluate -c configs/multiple_choice.yaml --model.model gpt2 --data.tasks '[copa]'",
            "  cblight demo --quick",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``cblight COMMAND ...``: run one subcommand of ``COMMANDS`` with the rest of the arguments."""
    try:
        return _run(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        _drop_stdout()
        return 1
    finally:  # also after --help's SystemExit, whose text argparse wrote into the closed pipe
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _drop_stdout()


def _drop_stdout() -> None:
    """Whoever read the output stopped early (``cblight --help | head``): no traceback, now or when the
    interpreter flushes stdout on exit (the recipe of Python's ``signal`` documentation)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _run(args: list[str]) -> int:
    if args[:1] and args[0] in ("-h", "--help", "help") and args[1:]:
        args = [*args[1:], "--help"]  # ``cblight help evaluate``: that command's help (was: cblight's own)
    if not args or args[0] in ("-h", "--help", "help"):
        print(command_help())
        return 0
    if args[0] in ("-V", "--version"):
        print(f"cblight {__version__}")
        return 0
    name, rest = args[0], args[1:]
    command = COMMANDS.get(name)
    if command is None:
        from cblight.suggest import closest

        close = closest(name, COMMANDS)
        hint = f"; did you mean {close!r}?" if close else ""
        print(f"error: unknown command {name!r}{hint} (cblight --help lists them)", file=sys.stderr)
        return 2
    module, _, function = command[0].partition(":")
    result = getattr(importlib.import_module(module), function)(rest, f"cblight {name}")
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
