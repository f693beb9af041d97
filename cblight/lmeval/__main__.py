"""``python -m cblight.lmeval [lm-eval options]``: lm-evaluation-harness's own CLI with the ``cblight`` model
registered and cblight's local tasks on the include path.

Every lm-eval option works as usual (``--tasks``, ``--model_args``, ``--use_cache``, ``--output_path``,
``--log_samples``, ``--limit``, ...); ``--model`` defaults to ``cblight``, ``--include_path`` to
``cblight/lmeval/tasks`` and ``--device`` to ``cuda`` when a GPU is visible, else ``cpu`` (lm-eval's own
default is ``cuda``, which stops a CPU-only machine). Bad cblight options print one ``error: ...`` line and
exit with status 2.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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
    rows = [
        (f"{name}={'none' if param.default is None else param.default}", about[name])
        for name, param in inspect.signature(CblightLM.__init__).parameters.items()
        if name in about
    ]
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


def _output_types(name: Any, manager: Any, seen: set[str] | None = None) -> dict[str, str]:
    """``{task: output_type}`` of a task, group or tag as lm-eval's task index holds them (no dataset is
    read); a task given as a config mapping carries its own."""
    if isinstance(name, dict):
        kind = name.get("output_type")
        return {str(name.get("task", "?")): kind} if isinstance(kind, str) else {}
    seen = set() if seen is None else seen
    entry = manager.task_index.get(name) if isinstance(name, str) else None
    if entry is None or name in seen:
        return {}
    seen.add(name)
    cfg = entry.cfg or {}
    if isinstance(cfg.get("output_type"), str):
        return {name: cfg["output_type"]}
    members = cfg.get("task") if isinstance(cfg.get("task"), list) else []
    members = members or [n for n, e in manager.task_index.items() if name in (e.tags or ())]
    return {task: kind for member in members for task, kind in _output_types(member, manager, seen).items()}


def check_adaptive_rule(model_args: dict[str, Any], tasks: list[Any], manager: Any) -> None:
    """``alpha=adaptive,adaptive_rule=RULE`` with a rule that does not fit a task of the run, refused
    before the model loads (as ``cblight evaluate --model.adaptive`` is): a multiple-choice task's scores
    take a multiple-choice rule, a ``generate_until`` task a per-token rule, a ``loglikelihood`` task both
    (its scores and its greedy flags)."""
    from cblight.adaptive import CHOICE_RULES, RULES, TOKEN_RULES, RuleName
    from cblight.option_types import describe

    rule = str(model_args.get("adaptive_rule", "auto"))
    if rule not in RULES:  # a name of no rule: not a rule of another kind of task
        raise CblightError(f"adaptive_rule must be {describe(RuleName)}, got {rule!r}")
    if str(model_args.get("alpha")) != "adaptive" or rule == "auto":
        return
    rules_by_output_type = {
        "multiple_choice": ("multiple-choice", CHOICE_RULES),
        "generate_until": ("generate_until", TOKEN_RULES),
        "loglikelihood": (
            "loglikelihood (scores and greedy flags)",
            tuple(r for r in TOKEN_RULES if r in CHOICE_RULES),
        ),
    }
    for task in tasks:
        for name, output_type in _output_types(task, manager).items():
            kind, valid = rules_by_output_type.get(output_type, (output_type, None))
            if valid is not None and rule not in valid:
                raise CblightError(
                    f"--model_args adaptive_rule: task {name}: adaptive rule {rule!r} does not apply to {kind} "
                    f"tasks; use auto or one of {', '.join(valid)}"
                )


@contextmanager
def one_line_task_errors() -> Iterator[None]:
    """lm-eval's own checks of ``--tasks`` (none given, an unknown name: a ``ValueError`` traceback) and the
    adaptive rule of ``--model cblight`` against the tasks' kinds, as one-line errors, all before the
    model loads."""
    import difflib

    from lm_eval.config.evaluate_config import EvaluatorConfig
    from lm_eval.tasks import TaskManager

    validate, process = EvaluatorConfig._validate_arguments, EvaluatorConfig.process_tasks

    def checked_validate(self: Any) -> Any:
        tasks = self.tasks if isinstance(self.tasks, list | tuple) else [self.tasks]
        if not any(str(t).strip(" ,") for t in tasks if t is not None):  # none, or '' (lm-eval: a traceback)
            raise CblightError(
                "--tasks is required: name the tasks to run, e.g. --tasks cblight_copa (cblight lmeval ls tasks lists them)"
            )
        return validate(self)

    def checked_process(self: Any, metadata: Any = None) -> Any:
        try:
            manager = process(self, metadata)
        except ValueError:  # a name lm-eval does not know: the line names it and the closest known names
            tasks = self.tasks.split(",") if isinstance(self.tasks, str) else self.tasks
            names = [t for task in tasks if isinstance(task, str) for t in task.split(",")]
            known = TaskManager(include_path=self.include_path)
            unknown = [n for n in names if not n.endswith(".yaml") and not known.match_tasks([n])]
            if not unknown:
                raise
            close = difflib.get_close_matches(unknown[0], known.all_tasks, n=3)
            mean = f"; did you mean {' or '.join(close)}?" if close else ""
            raise CblightError(
                f"--tasks: unknown task {unknown[0]!r}{mean} (cblight lmeval ls tasks lists them)"
            ) from None
        if self.model == "cblight":
            check_adaptive_rule(self.model_args, self.tasks, manager)
        return manager

    EvaluatorConfig._validate_arguments, EvaluatorConfig.process_tasks = checked_validate, checked_process
    try:
        yield
    finally:
        EvaluatorConfig._validate_arguments, EvaluatorConfig.process_tasks = validate, process


_AROUND_SEPARATORS = re.compile(r"\s*([,=])\s*")


def _tidy_model_args(args: list[str]) -> list[str]:
    """``--model_args "pretrained=M, alpha=-1"`` as meant: the spaces around its commas and equals signs go
    (lm-eval would pass a key ``' alpha'``). A JSON mapping is left as it is."""
    out = list(args)
    for i, arg in enumerate(out):
        name, eq, value = arg.partition("=")
        if name == "--model_args" and eq and not value.lstrip().startswith("{"):
            out[i] = "--model_args=" + _AROUND_SEPARATORS.sub(r"\1", value.strip())
        elif arg == "--model_args" and i + 1 < len(out) and not out[i + 1].lstrip().startswith("{"):
            out[i + 1] = _AROUND_SEPARATORS.sub(r"\1", out[i + 1].strip())
    return out


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
    if not listing and any(a in ("-h", "--help") for a in args):
        print(model_args_help(prog or "cblight lmeval"))
    if not listing and not _has(args, "--model"):
        args = ["--model", "cblight", *args]
    args = _tidy_model_args(args)
    if not _has(args, "--include_path"):
        args = [*args, "--include_path", str(TASKS_DIR)]
    if not listing and not _has(args, "--device"):
        import torch

        args = [*args, "--device", "cuda" if torch.cuda.is_available() else "cpu"]
    saved = sys.argv
    sys.argv = ["lm-eval", *args]
    try:
        with one_line_task_errors():
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
