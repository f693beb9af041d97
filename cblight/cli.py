"""LightningCLI wiring shared by the entry points (``evaluate.py``, ``train.py``).

``evaluate_cli`` parses the evaluation module (``BoostedEvaluator`` by default; a config may name
``cblight.generate.generation_evaluator.BoostedGenerationEvaluator`` as ``model.class_path``) and ``EvalDataModule``
from their signatures. ``BoostedEvaluator`` runs Lightning's validation loop on the alpha-selection splits,
then its test loop on the reported splits; the generation module runs the test loop; ``--compare`` runs
either for several checkpoints (``cblight.runs.run_comparison``). ``train_cli`` is coherence tuning's LightningCLI.

Both fail before any work on bad input (W&B asked for without the ``wandb`` package, a resume checkpoint
that is missing or not a Lightning checkpoint, invalid options) with one line naming the cause. Logs go to
CSV by default; ``configs/logger/wandb.yaml`` is a generic ``trainer.logger`` override for any config.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import yaml
from jsonargparse import DefaultHelpFormatter
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

from cblight.data.datamodule import EvalDataModule
from cblight.errors import CblightError
from cblight.evaluate.boosted_evaluator import DEFAULT_KS
from cblight.generate.generation_evaluator import BoostedGenerationEvaluator  # noqa: F401  (short name for --model)
from cblight.runs import (
    OutputLock,
    RunInterrupted,
    check_output_dir,
    resolve_output_dir,
    run_comparison,
    run_evaluation,
)

__all__ = ["evaluate_cli", "exit_on_bad_input", "run_evaluation", "train_cli"]


class CLIConfigError(CblightError):
    """A command-line or config option that cannot work."""


def _class_paths(value: Any) -> list[str]:
    """Every ``class_path`` inside a parsed config value (a dict, a list, a jsonargparse Namespace)."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    found: list[str] = []
    if isinstance(value, dict):
        if isinstance(value.get("class_path"), str):
            found.append(value["class_path"])
        for item in value.values():
            found.extend(_class_paths(item))
    elif isinstance(value, (list, tuple)):
        for item in value:
            found.extend(_class_paths(item))
    elif isinstance(value, str):
        found.append(value)
    return found


def check_wandb_available(logger_config: Any) -> None:
    """Refuse a W&B logger when the ``wandb`` package is missing (Lightning would fail later, deep inside)."""
    wants_wandb = any("wandb" in path.lower() for path in _class_paths(logger_config))
    if wants_wandb and importlib.util.find_spec("wandb") is None:
        raise CLIConfigError(
            "W&B logging was asked for (trainer.logger holds a WandbLogger, e.g. via -c configs/logger/wandb.yaml) "
            "but the wandb package is not installed: pip install 'cblight[wandb]' (or drop the W&B logger)"
        )


def check_checkpoint_path(ckpt_path: str | None) -> None:
    """A resume checkpoint must be an existing Lightning checkpoint file (``last``/``best``/``hpc`` pass)."""
    if ckpt_path is None or str(ckpt_path) in ("last", "best", "hpc", "registry"):
        return
    path = Path(ckpt_path).expanduser()
    if not path.exists():
        raise CLIConfigError(f"ckpt_path {str(ckpt_path)!r} does not exist")
    if path.is_dir():
        hint = (
            " (it is a Hugging Face model directory: pass it as the model path, e.g. --model.model, not ckpt_path)"
            if (path / "config.json").exists()
            else ""
        )
        raise CLIConfigError(
            f"ckpt_path {str(ckpt_path)!r} is a directory, not a Lightning checkpoint file{hint}"
        )
    import zipfile

    if not zipfile.is_zipfile(path):
        raise CLIConfigError(
            f"ckpt_path {str(ckpt_path)!r} is not a Lightning checkpoint (not a torch.save zip archive)"
        )


class LoggerSaveConfigCallback(SaveConfigCallback):
    """Writes ``config.yaml`` to the log directory and logs the parsed config to every logger."""

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        config = yaml.safe_load(self.parser.dump(self.config, skip_none=False))
        for logger in trainer.loggers:
            logger.log_hyperparams({"config": config})


EVAL_TRAINER_DEFAULTS: dict[str, Any] = {
    "enable_checkpointing": False,
    "enable_model_summary": False,
    "inference_mode": True,
}


def _tokenizer_of(model: Any) -> str:
    return model.tokenizer_name


def _largest_k(model: Any) -> int:
    """The largest short-context length of the next-token grid (LAMA keeps prompts longer than it)."""
    return max(getattr(model, "ks", None) or DEFAULT_KS)


class EvaluateCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.set_defaults({"model": {"class_path": "cblight.evaluate.boosted_evaluator.BoostedEvaluator"}})
        parser.link_arguments("model", "data.tokenizer", compute_fn=_tokenizer_of, apply_on="instantiate")
        parser.link_arguments("model", "data.max_k", compute_fn=_largest_k, apply_on="instantiate")
        parser.add_argument(
            "--compare",
            type=Optional[dict[str, str]],  # noqa: UP045  (jsonargparse reads the annotation at runtime)
            default=None,
            help="evaluate several checkpoints ({label: model path}) with this config; one comparison table",
        )

    def before_instantiate_classes(self) -> None:
        config = self.config
        logger = config.trainer.logger
        check_wandb_available(logger)
        args = config.model.init_args
        default_dir = (
            inspect.signature(_model_class(config.model.class_path)).parameters["output_dir"].default
        )
        output_dir = resolve_output_dir(args.get("output_dir") or default_dir, args.model)
        check_output_dir(output_dir)
        if logger is None or logger is True:
            config.trainer.logger = {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(output_dir), "name": "logs"},
            }


def _model_class(class_path: str) -> Any:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _bad_input(err: BaseException) -> CblightError | None:
    """The ``CblightError`` behind ``err``: jsonargparse wraps errors raised while it instantiates a class."""
    seen: BaseException | None = err
    for _ in range(20):
        if seen is None:
            return None
        if isinstance(seen, CblightError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def exit_on_bad_input(fn: Any) -> Any:
    """Run ``fn``; bad input (``CblightError``) becomes one line on stderr and exit status 2, a stop by
    SIGINT/SIGTERM one line and status 128 + the signal number."""
    try:
        return fn()
    except RunInterrupted as stop:
        print(
            f"error: {stop}: finished examples are kept in the cache; rerun the same command to resume",
            file=sys.stderr,
        )
        raise SystemExit(stop.exit_code) from None
    except Exception as err:
        bad = _bad_input(err)
        if bad is None:
            raise
        print(f"error: {bad}", file=sys.stderr)
        raise SystemExit(2) from None


def evaluate_cli(args: Sequence[str] | None = None) -> dict[str, Any]:
    return exit_on_bad_input(lambda: _evaluate(args))


EVALUATE_USAGE = (
    "%(prog)s -c CONFIG [--model.OPTION VALUE ...] [--data.OPTION VALUE ...] [--trainer.OPTION VALUE ...]"
)


class _HelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help, with the description's line breaks kept (it lists the evaluator's options)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(indent + line for line in text.splitlines(keepends=True))


def _documented_args(cls: Any) -> dict[str, str]:
    """``name: text`` of a class docstring's ``Args:`` section (continuation lines joined)."""
    doc = inspect.getdoc(cls) or ""
    section = doc.split("Args:", 1)[1] if "Args:" in doc else ""
    found: dict[str, str] = {}
    name = None
    for line in section.splitlines():
        match = re.match(r"^    (\w+): (.*)$", line)
        if match:
            name = match.group(1)
            found[name] = match.group(2).strip()
        elif name and line.startswith("        "):
            found[name] += " " + line.strip()
        elif line.strip():
            break
    return found


def evaluate_help() -> str:
    """The first lines of ``evaluate.py --help``: what it does, then every option of the default evaluator
    (LightningCLI lists a subclass-mode module's options only under ``--model.help``)."""
    from cblight.evaluate.boosted_evaluator import BoostedEvaluator

    defaults = inspect.signature(BoostedEvaluator.__init__).parameters
    lines = [
        "Coherence-boosted evaluation (paper Tables 1-5): choose alpha* (and k*) on each task's selection",
        "split, then report on its test split; generation configs name BoostedGenerationEvaluator.",
        "  python evaluate.py -c configs/multiple_choice.yaml --model.model gpt2 --data.tasks '[copa]'",
        "",
        "Model options (--model.*) of BoostedEvaluator, the default module; for generation configs see",
        "  python evaluate.py --model.help BoostedGenerationEvaluator",
    ]
    for name, text in _documented_args(BoostedEvaluator).items():
        default = defaults[name].default if name in defaults else None
        lines.append(f"  --model.{name} (default: {default!r})")
        lines += [f"      {chunk}" for chunk in textwrap.wrap(text, 92)]
    lines += [
        "",
        "Data (--data.*), trainer (--trainer.*) and other options follow; every option with its value in a",
        "config: python evaluate.py -c CONFIG --print_config. Bad input and its messages: docs/errors.md",
    ]
    return "\n".join(lines)


_FLOW_KEY_WITHOUT_SPACE = re.compile(r"[{,]\s*[A-Za-z_][\w.-]*:(?=[^\s,}])")


def check_flow_mappings(args: Sequence[str]) -> None:
    """A mapping option written ``{rte:/path}`` is YAML's ``{"rte:/path": null}``: say what YAML wants."""
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        if value.lstrip().startswith("{") and _FLOW_KEY_WITHOUT_SPACE.search(value):
            option = (
                args[i - 1] if i and value is arg and args[i - 1].startswith("--") else arg.split("=", 1)[0]
            )
            fixed = re.sub(r"([{,]\s*[A-Za-z_][\w.-]*):(?=[^\s,}])", r"\1: ", value)
            raise CLIConfigError(
                f"{option} {value!r}: in a YAML mapping each key needs a space after its colon; write {fixed!r}"
            )


def build_evaluate_cli(args: Sequence[str] | None = None) -> EvaluateCLI:
    """Parse ``args`` (default: ``sys.argv``) and instantiate the trainer, module and data module."""
    warnings.filterwarnings("ignore", message=".*overridden `transfer_batch_to_device`.*")
    check_flow_mappings(sys.argv[1:] if args is None else args)
    return EvaluateCLI(
        LightningModule,
        EvalDataModule,
        subclass_mode_model=True,
        run=False,
        parser_kwargs={
            "usage": EVALUATE_USAGE,
            "description": evaluate_help(),
            "formatter_class": _HelpFormatter,
        },
        trainer_defaults=EVAL_TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        seed_everything_default=1234,
        args=list(args) if args is not None else None,
    )


def _is_launching_process() -> bool:
    """Not a DDP worker that Lightning (or torchrun) started: only the first process locks the output."""
    env = os.environ
    return int(env.get("RANK", env.get("LOCAL_RANK", "0"))) == 0 and int(env.get("NODE_RANK", "0")) == 0


def _evaluate(args: Sequence[str] | None) -> dict[str, Any]:
    cli = build_evaluate_cli(args)
    lock = OutputLock(cli.model.output_dir) if _is_launching_process() else None
    if lock is not None:
        lock.acquire()
    try:
        if cli.config.get("compare"):
            return run_comparison(cli, cli.config["compare"])
        return run_evaluation(cli.trainer, cli.model, cli.datamodule)
    finally:
        if lock is not None:
            lock.release()


class CBLightCLI(LightningCLI):
    """LightningCLI with cblight's early checks (see the module docstring)."""

    def parse_arguments(self, parser: Any, args: Any) -> None:
        # Checked right after parsing: LightningCLI itself opens ckpt_path next, then builds everything.
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        config = self.config.get(subcommand, self.config) if subcommand else self.config
        check_wandb_available(config.get("trainer", {}).get("logger"))
        check_checkpoint_path(config.get("ckpt_path"))

    def before_instantiate_classes(self) -> None:
        subcommand = self.config.get("subcommand")
        config = self.config.get(subcommand, self.config) if subcommand else self.config
        root = config.get("trainer", {}).get("default_root_dir")
        if root:
            _loggers_under(config.trainer.get("logger"), root)

    def before_fit(self) -> None:
        check = getattr(self.model, "check_prompts", None)
        prompts = getattr(self.datamodule, "train_prompts", None)
        if callable(check) and callable(prompts):
            check(prompts())

    def after_fit(self) -> None:
        """A run stopped by Ctrl-C or SIGTERM exits with ``128 + signal`` (130, 143), as the shell would."""
        from cblight.tune.callbacks import StopOnSignal

        for callback in self.trainer.callbacks:
            if isinstance(callback, StopOnSignal) and callback.stopped_by:
                raise SystemExit(128 + callback.stopped_by)


def _loggers_under(logger: Any, root: str) -> None:
    """With ``trainer.default_root_dir`` set, every relative logger ``save_dir`` lives under it (as the
    model's relative ``export_dir`` does), so that nothing of the run lands in the working directory."""
    for item in logger if isinstance(logger, list) else [logger]:
        args = item.get("init_args") if hasattr(item, "get") else None
        save_dir = args.get("save_dir") if args is not None else None
        if isinstance(save_dir, str) and not Path(save_dir).expanduser().is_absolute():
            args["save_dir"] = str(Path(root) / save_dir)


def _defaults() -> dict[str, Any]:
    return {
        "logger": {
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": "outputs", "name": "coherence_tuning"},
        }
    }


def train_cli(args: Any = None, run: bool = True) -> CBLightCLI:
    """``python train.py fit -c configs/coherence_tuning.yaml``: coherence tuning (paper appendix)."""
    from cblight.tune.coherence_tuning import CoherenceTuning
    from cblight.tune.prompt_data import PromptDataModule

    check_flow_mappings(sys.argv[1:] if args is None else list(args))
    return CBLightCLI(
        CoherenceTuning,
        PromptDataModule,
        save_config_callback=LoggerSaveConfigCallback,
        save_config_kwargs={"overwrite": True},
        trainer_defaults=_defaults(),
        seed_everything_default=0,
        auto_configure_optimizers=False,
        args=args,
        run=run,
    )
