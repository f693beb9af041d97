"""The LightningCLI wiring of the three ``cblight`` subcommands that drive Lightning (the command's table is
``cblight.__main__``): ``evaluate`` (``BoostedEvaluator``), ``generate`` (``BoostedGenerationEvaluator``) and
``tune`` (``CoherenceTuning``). ``evaluate.py`` and ``train.py`` at the repository root are aliases of
``cblight evaluate`` and ``cblight tune``.

``evaluate`` and ``generate`` parse an evaluator and ``EvalDataModule`` from their signatures (any config
may name either evaluator as ``model.class_path``); the evaluator runs Lightning's validation loop on the
alpha-selection splits when it selects, then its test loop on the reported splits (``cblight.runs``);
``--compare`` runs the same for several checkpoints. ``tune`` is LightningCLI's ``fit``.

Every command fails before any work on bad input (W&B asked for without the ``wandb`` package, a resume
checkpoint that is missing or not a Lightning checkpoint, invalid options) with one line naming the cause
and exit status 2. Logs go to CSV by default; ``configs/logger/wandb.yaml`` is a generic
``trainer.logger`` override for any config. Each command's ``--help`` lists its own options first.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import logging
import os
import re
import sys
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from contextvars import ContextVar
from operator import attrgetter
from pathlib import Path
from typing import Any, Optional, Union

import yaml
from jsonargparse import ArgumentParser, DefaultHelpFormatter
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger

from cblight.data.datamodule import EvalDataModule
from cblight.errors import ConfigError
from cblight.evaluate.boosted_evaluator import DEFAULT_KS
from cblight.generate.generation_evaluator import BoostedGenerationEvaluator  # noqa: F401  (short name for --model)
from cblight.option_types import bases, describe, item_type, members, options_of
from cblight.parse_errors import OneLineErrors, Parser
from cblight.runs import (
    OutputLock,
    check_output_dir,
    check_rerun,
    exit_on_bad_input,
    forget_run_without_results,
    run_comparison,
    run_evaluation,
)
from cblight.suggest import class_named, closest

__all__ = [
    "check_flow_mappings",
    "evaluate_cli",
    "exit_on_bad_input",
    "generate_cli",
    "train_cli",
    "tune_cli",
]


# Lightning's loggers that need a package cblight does not install: the modules (any one will do) and the fix
_LOGGER_PACKAGES = {
    "WandbLogger": (("wandb",), "pip install 'cblight[wandb]'"),
    "TensorBoardLogger": (("tensorboard", "tensorboardX"), "pip install tensorboard"),
    "MLFlowLogger": (("mlflow",), "pip install mlflow"),
    "CometLogger": (("comet_ml",), "pip install comet-ml"),
    "NeptuneLogger": (("neptune",), "pip install neptune"),
}


def _class_paths(value: Any) -> list[str]:
    """The class paths in a ``trainer.logger`` value: a name, a ``{class_path: ...}`` mapping or a list."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [path for item in value for path in _class_paths(item)]
    if hasattr(value, "get"):
        return _class_paths(value.get("class_path"))
    return []


def check_loggers_installed(args: Sequence[str] = (), config: Mapping[str, Any] | None = None) -> None:
    """Refuse, before parsing, a ``trainer.logger`` (on the command line ``args``, or in ``config``, a ``-c``
    file's options as the parser reads it) whose package is missing: jsonargparse would say only that the
    value "does not validate against any of the Union subtypes" (``cblight evaluate``) or print a traceback
    when it builds the logger (``cblight tune``)."""
    trainer = config.get("trainer") if config is not None else None
    found: list[str] = _class_paths(trainer.get("logger") if isinstance(trainer, dict) else None)
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in ("--trainer.logger", "--trainer.logger.class_path"):
            text = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            try:
                found += _class_paths(yaml.safe_load(text))
            except yaml.YAMLError:
                continue
    for class_path in found:
        modules, fix = _LOGGER_PACKAGES.get(str(class_path).rpartition(".")[2], ((), ""))
        if modules and not any(importlib.util.find_spec(m) for m in modules):
            raise ConfigError(
                f"trainer.logger {class_path} needs the {' or '.join(modules)} package, which is not "
                f"installed: {fix} (or log with lightning.pytorch.loggers.CSVLogger, the default)"
            )


def _wandb_key() -> bool:
    """Whether W&B has an API key here: ``WANDB_API_KEY``, or the entry ``wandb login`` writes to netrc."""
    import netrc
    from urllib.parse import urlparse

    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_wandb(logger_config: Any) -> None:
    """A W&B logger (``wandb`` in ``trainer.logger``: its class path; its package is checked by
    ``check_loggers_installed``), before any work: refused when it streams without a W&B login (was: a
    62-line ``UsageError`` once the model had loaded). W&B's own switch, ``WANDB_MODE``, wins over a logger's
    ``offline``: ``WANDB_MODE=online`` streams a logger that a config set to ``offline: true`` (the config's
    value was kept while wandb said to set ``WANDB_MODE=online``), with one line saying so;
    ``offline``/``disabled`` keep it off the network."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    for item in logger_config if isinstance(logger_config, list) else [logger_config]:
        wandb = hasattr(item, "get") and "wandb" in str(item.get("class_path", "")).lower()
        args = item.get("init_args") if wandb else None
        if not args:
            continue
        if mode == "online" and args.get("offline"):
            args["offline"] = False
            print(
                "note: WANDB_MODE=online: the W&B logger streams (its config said offline: true)",
                file=sys.stderr,
            )
        if not args.get("offline") and mode not in ("offline", "dryrun", "disabled") and not _wandb_key():
            raise ConfigError(
                "the W&B logger streams (offline: false) but W&B has no API key here: run wandb login (or set "
                "WANDB_API_KEY), or log offline (offline: true, or WANDB_MODE=offline) and upload later with "
                "wandb sync"
            )


# A negative number argparse takes for an option name (it knows ``-3`` and ``-.5``, not these)
_NEGATIVE_VALUE = re.compile(r"^-(\d+\.?\d*|\.\d+)[eE][-+]?\d+$|^-\.?inf$|^-\.?nan$", re.IGNORECASE)


def join_negative_values(args: Sequence[str]) -> list[str]:
    """``--model.boosting.alpha -1e-2`` as meant, ``--model.boosting.alpha=-1e-2``: argparse reads a negative
    number in scientific notation (or ``-.inf``) as an option name and said "expected one argument"."""
    out: list[str] = []
    for arg in args:
        previous = out[-1] if out else ""
        if _NEGATIVE_VALUE.match(arg) and previous.startswith("--") and "=" not in previous:
            out[-1] = f"{previous}={arg}"
        else:
            out.append(arg)
    return out


def check_checkpoint_path(ckpt_path: str | None) -> None:
    """A resume checkpoint must be an existing Lightning checkpoint: a file, or the directory of a distributed
    (FSDP2) one (``last``/``best``/``hpc`` pass)."""
    if ckpt_path is None or str(ckpt_path) in ("last", "best", "hpc", "registry"):
        return
    path = Path(ckpt_path).expanduser()
    if not path.exists():
        raise ConfigError(f"ckpt_path {str(ckpt_path)!r} does not exist")
    if path.is_dir() and (path / "meta.pt").is_file() and (path / ".metadata").is_file():
        return  # Lightning's distributed checkpoint: *.distcp shards beside meta.pt
    if path.is_dir():
        hint = (
            " (it is a Hugging Face model directory: pass it as the model path, e.g. --model.model, not ckpt_path)"
            if (path / "config.json").exists()
            else ""
        )
        raise ConfigError(
            f"ckpt_path {str(ckpt_path)!r} is a directory, not a Lightning checkpoint file{hint}"
        )
    if not zipfile.is_zipfile(path):
        raise ConfigError(
            f"ckpt_path {str(ckpt_path)!r} is not a Lightning checkpoint (not a torch.save zip archive)"
        )


# Lightning's lines before any work: advertisements, the devices found and the seed (the config says both)
_DROPPED = ("💡 Tip:", "GPU available:", "TPU available:", "HPU available:", "IPU available:", "Seed set to")


def _drop_tips(record: logging.LogRecord) -> bool:
    return not str(record.getMessage()).startswith(_DROPPED)


def quiet_library_notices() -> None:
    """Silence, for the rest of the process (idempotent), notices that every run printed and no user can act
    on, at their source and for cblight's runs only (no log level lowered): LightningCLI's warning that it got
    ``args`` while ``sys.argv`` holds some too, its note on the evaluators' overridden
    ``transfer_batch_to_device``, Lightning's ``_DROPPED`` lines, torch's ``LeafSpec`` deprecation; and in
    runs of several processes, Lightning's advice to ``sync_dist`` the validation values (torchmetrics
    already synced them), the deprecation of the all-gather it calls, and distributed checkpointing's note
    that it replaces ``last.ckpt`` (as it must)."""
    warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
    warnings.filterwarnings("ignore", message=".*overridden `transfer_batch_to_device`.*")
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )
    warnings.filterwarnings("ignore", message=r".*self\.log\('val/tuning/.*sync_dist=True.*")
    warnings.filterwarnings("ignore", message=r"torch\.distributed\.nn\.functional\.all_gather is deprecated")
    warnings.filterwarnings("ignore", message=r"Detected an existing checkpoint in .*, overwriting since")
    # rank_zero_info logs through whichever of the first two Lightning imported last
    for name in ("pytorch.utilities.rank_zero", "fabric.utilities.rank_zero", "fabric.utilities.seed"):
        logging.getLogger(f"lightning.{name}").addFilter(_drop_tips)  # added once: addFilter skips a repeat


# the command whose CLIParser reads the configs: set by the two functions that build one, before they do
_COMMAND: ContextVar[tuple[str, Sequence[str]]] = ContextVar("cblight_command", default=("evaluate", ()))


class CLIParser(OneLineErrors, LightningArgumentParser):
    """LightningCLI's parser with cblight's one-line parse errors (``cblight.parse_errors``); a config file's
    options, read once by jsonargparse, are checked for the command that runs (``check_config_command``)."""

    def check_config(self, path: str, config: dict[str, Any]) -> None:
        command, args = _COMMAND.get()
        check_config_command(config, path, args, command)


class LoggerSaveConfigCallback(SaveConfigCallback):
    """Writes ``config.yaml`` to the log directory and logs the parsed config to every logger."""

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        config = yaml.safe_load(self.parser.dump(self.config, skip_none=False))
        for logger in trainer.loggers:
            logger.log_hyperparams({"config": config})


EVALUATOR = "cblight.evaluate.boosted_evaluator.BoostedEvaluator"
GENERATOR = "cblight.generate.generation_evaluator.BoostedGenerationEvaluator"
TUNER = "cblight.tune.coherence_tuning.CoherenceTuning"
# the module each command runs; evaluate and generate take either evaluator as model.class_path
COMMAND_MODULES = {"evaluate": EVALUATOR, "generate": GENERATOR, "tune": TUNER}
_CLASS_NAMES = {command: path.rpartition(".")[2] for command, path in COMMAND_MODULES.items()}


def _init_keys(class_path: str) -> set[str]:
    return set(inspect.signature(class_named(class_path, [])).parameters) - {"self", "args", "kwargs"}


_FLOW_KEY_WITHOUT_SPACE = re.compile(r"([{,]\s*[A-Za-z_][\w.-]*):(?=[^\s,}])")


def check_flow_mappings(args: Sequence[str]) -> None:
    """A mapping option written ``{rte:/path}`` is YAML's ``{"rte:/path": null}``: refused, saying what YAML wants."""
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        if value.lstrip().startswith("{") and _FLOW_KEY_WITHOUT_SPACE.search(value):
            option = (
                args[i - 1] if i and value is arg and args[i - 1].startswith("--") else arg.split("=", 1)[0]
            )
            fixed = _FLOW_KEY_WITHOUT_SPACE.sub(r"\1: ", value)
            raise ConfigError(
                f"{option} {value!r}: in a YAML mapping each key needs a space after its colon; write {fixed!r}"
            )


# How each evaluator takes an option of the other one, where it has its own
_OTHER_EVALUATOR_HINTS = {
    "adaptive": (
        "a decoding's boosting takes it: --model.decodings '[{name: auto, boosting: {k: 8, adaptive: auto}}]' "
        "(docs/adaptive.md)"
    ),
}


def check_options_of_the_other_evaluator(args: Sequence[str], owner: str, path: str) -> None:
    """A ``--model.X`` option of one evaluator given with a config whose ``model.class_path`` is the other
    (``cblight evaluate -c configs/webtext_generation.yaml --model.adaptive auto``): named as such, with how
    that evaluator takes it (jsonargparse blamed a valid option of the config's evaluator, or said only that
    the value does not validate)."""
    mine = _init_keys(COMMAND_MODULES[owner])
    other = "generate" if owner == "evaluate" else "evaluate"
    theirs = _init_keys(COMMAND_MODULES[other])
    for arg in args:
        name = arg.partition("=")[0]
        if not name.startswith("--model.") or name.endswith(".help"):
            continue
        key = name.removeprefix("--model.").split(".")[0]
        if key in mine or key not in theirs:
            continue
        how = _OTHER_EVALUATOR_HINTS.get(key, f"it is cblight {other}'s")
        raise ConfigError(
            f"--model.{key} is an option of {_CLASS_NAMES[other]}, not of {_CLASS_NAMES[owner]}, which {path} "
            f"names as model.class_path; {how}"
        )


def check_config_command(config: Mapping[str, Any], path: str, args: Sequence[str], command: str) -> None:
    """A config file written for another command (``cblight generate -c configs/multiple_choice.yaml``) is
    refused naming that command, read from its ``model.class_path`` or, without one, from the module whose
    options its ``model`` keys are (jsonargparse would say only that one key is unknown); its logger's
    package must be installed (``check_loggers_installed``).

    Args:
        config: the file's options, as the parser reads it (``CLIParser.check_config``).
        path: the file, as typed.
        args: the command line.
        command: ``evaluate``, ``generate`` or ``tune``.
    """
    check_loggers_installed(config=config)
    model = config.get("model")
    if isinstance(model, dict):
        named = model.get("class_path")
        if isinstance(named, str):
            owner = next((c for c, name in _CLASS_NAMES.items() if name == named.rpartition(".")[2]), None)
            if owner and owner != command and {owner, command} != {"evaluate", "generate"}:
                raise ConfigError(
                    f"{path} is a cblight {owner} config (its model.class_path is {named}): use cblight {owner} "
                    f"-c {path}"
                )
            if owner in ("evaluate", "generate"):
                check_options_of_the_other_evaluator(args, owner, path)
            return
        init_args = model.get("init_args")
        keys = (set(model) - {"init_args"}) | (set(init_args) if isinstance(init_args, dict) else set())
        foreign = sorted(keys - _init_keys(COMMAND_MODULES[command]))
        for owner, module in COMMAND_MODULES.items():
            if foreign and owner != command and keys <= _init_keys(module):
                raise ConfigError(
                    f"{path} is a cblight {owner} config (model.{foreign[0]} is an option of {_CLASS_NAMES[owner]}, "
                    f"not of {_CLASS_NAMES[command]}): use cblight {owner} -c {path}"
                )


def _largest_k(model: Any) -> int:
    """The largest short-context length of the next-token grid (LAMA keeps prompts longer than it)."""
    return max(getattr(model, "ks", None) or DEFAULT_KS)


class EvaluateCLI(LightningCLI):
    """``cblight evaluate`` / ``cblight generate``: an evaluator (``default_class`` unless the config names
    another) and ``EvalDataModule``, instantiated but not run (``cblight.runs`` runs them)."""

    def __init__(self, *args: Any, default_class: str = EVALUATOR, **kwargs: Any):
        self.default_class = default_class
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.set_defaults({"model": {"class_path": self.default_class}})
        parser.link_arguments(
            "model", "data.tokenizer", compute_fn=attrgetter("tokenizer_name"), apply_on="instantiate"
        )
        parser.link_arguments("model", "data.max_k", compute_fn=_largest_k, apply_on="instantiate")
        parser.add_argument(
            "--compare",
            type=Optional[dict[str, str]],  # noqa: UP045  (jsonargparse reads the annotation at runtime)
            default=None,
            help="evaluate several checkpoints ({label: model path}) with this config; one comparison table",
        )

    def instantiate_classes(self) -> None:
        """LightningCLI's, with the run's checks that need the evaluator and the data module (both cheap to
        build: no model or data loads) made once, before the trainer is built: the output directory the
        evaluator resolved (``{model}`` filled in; the default CSV logger writes under it) and the options
        that must fit the run's tasks (``check_tasks``); a W&B logger before them (``check_wandb``)."""
        check_wandb(self.config.trainer.logger)
        self.config_init = self.parser.instantiate_classes(self.config)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        check_output_dir(self.model.output_dir)
        if hasattr(self.model, "check_tasks"):
            self.model.check_tasks(self.datamodule)
        if self.config.trainer.logger in (None, True):  # the default: CSV logs under the output directory
            logs = {"save_dir": str(self.model.output_dir), "name": "logs"}
            self.config.trainer.logger = {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": logs,
            }
            self.config_init.trainer.logger = CSVLogger(**logs)
        self.trainer = self.instantiate_trainer()


def evaluate_cli(args: Sequence[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    """``cblight evaluate`` (and ``evaluate.py``): boosted evaluation, Tables 1, 4, 5, 11, 12."""
    return exit_on_bad_input(lambda: _evaluate(args, EVALUATOR, prog))


def generate_cli(args: Sequence[str] | None = None, prog: str | None = None) -> dict[str, Any]:
    """``cblight generate``: generation with and without boosting and the paper's metrics, Tables 2, 3."""
    return exit_on_bad_input(lambda: _evaluate(args, GENERATOR, prog))


RUN_USAGE = (
    "%(prog)s -c CONFIG [--model.OPTION VALUE ...] [--data.OPTION VALUE ...] [--trainer.OPTION VALUE ...]"
)
EVALUATE_ABOUT = {
    EVALUATOR: (
        "Coherence-boosted evaluation (paper Tables 1, 4, 5, 11, 12): choose alpha* (and k*) on each task's "
        "selection split, then report on its test split.",
        "cblight evaluate -c configs/multiple_choice.yaml --model.model gpt2 --data.tasks '[copa]'",
    ),
    GENERATOR: (
        "Generation with and without coherence boosting, scored with the paper's metrics (Tables 2, 3, "
        "the summarisation table, Figure 3).",
        "cblight generate -c configs/webtext_generation.yaml --data.data_dirs '{webtext: DIR}'",
    ),
}


class _HelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help, with the description's line breaks kept (it lists the module's options)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(indent + line for line in text.splitlines(keepends=True))


def options_help(cls: type, key: str, title: str) -> str:
    """``--<key>.*`` options of ``cls`` with their types, defaults and docstring text, as jsonargparse
    formats them (``docstring-parser`` reads the ``Args:`` section), under ``title``."""
    parser = ArgumentParser(formatter_class=_HelpFormatter, add_help=False, usage="-")
    # under the parser's own title, without --<key> CONFIG
    parser.add_class_arguments(cls, key, as_group=False)
    text = parser.format_help()
    return title + ":" + text[text.index("\n\n") + 2 :].split(":", 1)[1].rstrip() + "\n"


def evaluate_help(default_class: str) -> str:
    """The start of ``cblight evaluate --help`` / ``cblight generate --help``: what it does, then every
    option of its evaluator (LightningCLI lists a subclass-mode module's options only under
    ``--model.help``), then the data module's."""
    about, example = EVALUATE_ABOUT[default_class]
    cls = class_named(default_class, [])
    other = GENERATOR if default_class == EVALUATOR else EVALUATOR
    lines = [
        about,
        f"  {example}",
        f"A config may name the other evaluator ({other.rpartition('.')[2]}) as model.class_path.",
        "",
        options_help(cls, "model", f"Model options (--model.*) of {cls.__name__}"),
        options_help(EvalDataModule, "data", "Data options (--data.*) of EvalDataModule"),
        "Trainer options (--trainer.*) and the rest follow; every option with its value in a config:",
        f"  {example.split(' -c ')[0]} -c CONFIG --print_config. Bad input and its messages: docs/errors.md",
    ]
    return "\n".join(lines)


def nested_help(args: Sequence[str], cls: type, prog: str) -> None:
    """``--model.choice_alphas.help``, ``cblight tune --model.guard.help`` and the like, which ``--help``
    lists among the module's options: the help of that option's class, printed by jsonargparse (LightningCLI's
    parser holds the evaluators in subclass mode, where only ``--model.help`` exists, and gives a group of
    options no ``.help``), then exit 0. An option that does not exist or takes a plain value is refused in one
    line (jsonargparse said "expected one argument" or "unrecognized arguments"); a class path
    (``--model.optimizer.help torch.optim.AdamW``) is left to LightningCLI."""
    for i, arg in enumerate(args):
        if not (arg.startswith("--model.") and arg.endswith(".help")):
            continue
        key, options = arg.removeprefix("--model.").removesuffix(".help").split(".")[0], options_of(cls)
        if key not in options:
            close = closest(key, options)
            mean = f"; did you mean --model.{close}?" if close else ""
            raise ConfigError(f"unknown option --model.{key}{mean} ({prog} --help lists the options)")
        # the classes with options of their own (a dataclass, an AlphaGrid, a class path; in a list too)
        classes = [c for m in members(options[key]) for c in bases(item_type(m))]
        if not classes:
            raise ConfigError(
                f"--model.{key} takes a value ({describe(options[key])}), not options of its own, so it has no "
                f".help: {prog} --help describes it"
            )
        if groups := tuple(c for c in classes if dataclasses.is_dataclass(c)):
            parser = Parser(prog=prog, formatter_class=_HelpFormatter)
            # Optional: jsonargparse gives a dataclass its .help where None is allowed too
            parser.add_argument(f"--model.{key}", type=Optional[Union[groups]])  # noqa: UP007, UP045
            parser.parse_args([arg, *(v for v in args[i + 1 : i + 2] if not v.startswith("-"))])


def build_evaluate_cli(
    args: Sequence[str] | None = None, default_class: str = EVALUATOR, prog: str | None = None
) -> EvaluateCLI:
    """Parse ``args`` (default: ``sys.argv``) and instantiate the trainer, module and data module."""
    prog, argv = prog or _prog(), join_negative_values(sys.argv[1:] if args is None else args)
    nested_help(argv, class_named(default_class, []), prog)
    quiet_library_notices()
    check_flow_mappings(argv)
    _COMMAND.set(("generate" if default_class == GENERATOR else "evaluate", argv))
    check_loggers_installed(argv)
    return EvaluateCLI(
        LightningModule,
        EvalDataModule,
        default_class=default_class,
        subclass_mode_model=True,
        run=False,
        parser_class=CLIParser,
        parser_kwargs={
            "prog": prog,
            "usage": RUN_USAGE,
            "description": evaluate_help(default_class),
            "formatter_class": _HelpFormatter,
        },
        trainer_defaults={
            "enable_checkpointing": False,
            "enable_model_summary": False,
            "inference_mode": True,
        },
        save_config_kwargs={"overwrite": True},
        seed_everything_default=1234,
        args=argv,
    )


def _is_launching_process() -> bool:
    """Not a DDP worker that Lightning (or torchrun) started: only the first process locks the output."""
    env = os.environ
    return int(env.get("RANK", env.get("LOCAL_RANK", "0"))) == 0 and int(env.get("NODE_RANK", "0")) == 0


# Options a rerun into the same output directory may change without changing its results (where and in what
# batches it runs, what it draws); the trainer's options that do change them (precision, limits)
_RUN_INDEPENDENT = (
    "model.output_dir", "model.overwrite", "model.batch_size", "model.score_batch_size", "model.device_map",
    "model.plots", "model.log_samples", "data.batch_size", "data.num_workers",
)  # fmt: skip
_TRAINER_SETTINGS = ("precision", "limit_val_batches", "limit_test_batches")
# A new analysis of the cached numbers (docs/evaluate.md), or methods added to them that compute only their
# own passes (docs/methods.md): a rerun reuses the cache
_RESWEEP = (
    "model.choice_alphas",
    "model.length_normalize",
    "model.adaptive",
    "model.methods",
    "model.method_options",
)


def run_settings(config: Any) -> dict[str, Any]:
    """The settings of an evaluate or generate run that change its results, as ``option: value`` (the
    evaluator's and the data module's options, the trainer's precision and limits, the seed, ``compare``):
    what ``check_rerun`` records in the output directory."""
    plain = config.as_dict() if hasattr(config, "as_dict") else dict(config)
    model = plain.get("model") or {}
    trainer = plain.get("trainer") or {}
    flat: dict[str, Any] = {"model": model.get("class_path")}
    flat.update({f"model.{k}": v for k, v in (model.get("init_args") or {}).items()})
    flat.update({f"data.{k}": v for k, v in (plain.get("data") or {}).items()})
    flat.update({f"trainer.{k}": trainer.get(k) for k in _TRAINER_SETTINGS})
    flat.update(seed_everything=plain.get("seed_everything"), compare=plain.get("compare"))
    return {k: v for k, v in flat.items() if k not in _RUN_INDEPENDENT and not k.startswith("data.__")}


def _evaluate(args: Sequence[str] | None, default_class: str, prog: str | None) -> dict[str, Any]:
    cli = build_evaluate_cli(args, default_class, prog)
    with ExitStack() as held:
        if _is_launching_process():
            held.callback(OutputLock(cli.model.output_dir).acquire().release)
            check_rerun(cli.model.output_dir, run_settings(cli.config), cli.model.overwrite, _RESWEEP)
            held.callback(forget_run_without_results, cli.model.output_dir)  # before the lock's release
        if cli.config.get("compare"):
            return run_comparison(cli, cli.config["compare"])
        return run_evaluation(cli.trainer, cli.model, cli.datamodule)


class TuneCLI(LightningCLI):
    """``cblight tune`` / ``train.py fit``: coherence tuning's LightningCLI with cblight's early checks (see
    the module docstring); ``--help`` lists the module's and the prompt data's options before the
    trainer's."""

    def __init__(self, *args: Any, locks: list[Any] | None = None, **kwargs: Any):
        self.locks: list[Any] = [] if locks is None else locks  # the run's directories, released by train_cli
        super().__init__(*args, **kwargs)

    def add_core_arguments_to_parser(self, parser: Any) -> None:
        # LightningCLI adds the trainer first; ours come first so that --help opens with them. The data
        # module is made once, by the check pass (``instantiate_classes``), not by the parser.
        parser.add_lightning_class_args(self._model_class, "model", subclass_mode=self.subclass_mode_model)
        parser.add_class_arguments(
            self._datamodule_class, "data", fail_untyped=False, instantiate=False, sub_configs=True
        )
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.set_defaults({"trainer." + k: v for k, v in self.trainer_defaults.items() if k != "callbacks"})

    def parse_arguments(self, parser: Any, args: Any) -> None:
        # what LightningCLI reads right after parsing (it loads ckpt_path's hyperparameters), and W&B
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        config = self.config.get(subcommand, self.config) if subcommand else self.config
        check_wandb(config["trainer"].get("logger"))
        check_checkpoint_path(config.get("ckpt_path"))

    def instantiate_classes(self) -> None:
        """Parse, check, build, fit: everything the run will write, read or refuse is checked here, once,
        before the model loads (``cblight.tune.preflight.check_before_loading``, which makes the module and
        the data module once each); the objects are trusted from there on."""
        from cblight.tune.preflight import check_before_loading

        subcommand = self.config.get("subcommand")
        config = self.config.get(subcommand, self.config) if subcommand else self.config
        logger, root = config["trainer"].get("logger"), config["trainer"].get("default_root_dir")
        # with trainer.default_root_dir set, every relative logger save_dir lives under it (as the model's
        # relative export.dir does), so that nothing of the run lands in the working directory
        for item in (logger if isinstance(logger, list) else [logger]) if root else []:
            args = item.get("init_args") if hasattr(item, "get") else None
            save_dir = args.get("save_dir") if args is not None else None
            if isinstance(save_dir, str) and not Path(save_dir).expanduser().is_absolute():
                args["save_dir"] = str(Path(root) / save_dir)
        self.model, self.datamodule = check_before_loading(
            config,
            self._datamodule_class,
            lambda: (super(TuneCLI, self).instantiate_classes(), self.model)[1],
            self.locks if _is_launching_process() else None,
            saved_config=lambda: yaml.safe_load(self._parser(subcommand).dump(config, skip_none=False)),
        )
        if config.get("ckpt_path") is not None:  # an interrupted run found: resumed
            init = self.config_init[subcommand] if subcommand else self.config_init
            init["ckpt_path"] = config["ckpt_path"]

    def after_fit(self) -> None:
        """A run stopped by Ctrl-C or SIGTERM exits with ``128 + signal`` (130, 143), as the shell would; one
        stopped by the collapse guard (said when it stopped) with 1: it exported nothing."""
        from cblight.tune.callbacks import CollapseGuard, StopOnSignal

        for callback in self.trainer.callbacks:
            if isinstance(callback, StopOnSignal) and callback.stopped_by:
                raise SystemExit(128 + callback.stopped_by)
            if isinstance(callback, CollapseGuard) and callback.reason:
                raise SystemExit(1)


def train_cli(args: Any = None, run: bool = True, prog: str | None = None) -> TuneCLI:
    """``python train.py fit -c configs/coherence_tuning.yaml``: coherence tuning (paper appendix), with
    LightningCLI's subcommands (``fit``)."""
    from cblight.tune.coherence_tuning import CoherenceTuning
    from cblight.tune.prompt_data import PromptDataModule

    prog, args = prog or _prog(), join_negative_values(sys.argv[1:] if args is None else list(args))
    check_flow_mappings(args)
    _COMMAND.set(("tune", args))
    nested_help(args, CoherenceTuning, prog)
    check_loggers_installed(args)
    quiet_library_notices()
    usage = (
        RUN_USAGE.replace("%(prog)s", f"{prog} fit" if prog.endswith(".py") else prog) + " [--ckpt_path CKPT]"
    )
    locks: list[Any] = []
    try:
        return TuneCLI(
            CoherenceTuning,
            PromptDataModule,
            locks=locks,
            save_config_callback=LoggerSaveConfigCallback,
            save_config_kwargs={"overwrite": True},
            trainer_defaults={
                "logger": {
                    "class_path": "lightning.pytorch.loggers.CSVLogger",
                    "init_args": {"save_dir": "outputs", "name": "coherence_tuning"},
                }
            },
            seed_everything_default=0,
            auto_configure_optimizers=False,
            parser_class=CLIParser,
            parser_kwargs={"prog": prog, "fit": {"usage": usage, "description": TUNE_ABOUT}},
            args=args,
            run=run,
        )
    finally:  # a run called in process (the demo, tests) frees its directories when it ends
        for lock in reversed(locks):
            lock.release()


def _prog() -> str:
    """The program name of a command run as a script (``evaluate.py``, ``train.py``)."""
    return os.path.basename(sys.argv[0])


TUNE_ABOUT = (
    "Coherence tuning (paper appendix): fine-tune a model toward its own boosted version on self-generated "
    "text, e.g. cblight tune -c configs/coherence_tuning.yaml. The module's options (--model.*) come first, "
    "then the prompt data's (--data.*), then the trainer's (--trainer.*)."
)


def tune_cli(args: Sequence[str] | None = None, prog: str | None = None) -> TuneCLI:
    """``cblight tune -c configs/coherence_tuning.yaml``: ``train.py fit`` (the ``fit`` may be left out)."""
    prog = prog or _prog()
    argv = list(sys.argv[1:] if args is None else args)
    if argv and argv[0] in ("validate", "test", "predict"):
        print(f"error: {prog} runs fit only, not {argv[0]!r}", file=sys.stderr)
        raise SystemExit(2)
    if not argv or argv[0] != "fit":
        argv = ["fit", *argv]
    return exit_on_bad_input(lambda: train_cli(argv, prog=prog))
