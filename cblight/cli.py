"""LightningCLI wiring shared by the entry points (``train.py``; ``evaluate.py`` adds its own function here).

``CBLightCLI`` is a LightningCLI with checks that fail before any work starts (W&B asked for without the
``wandb`` package, a resume checkpoint that is missing or is not a Lightning checkpoint) and that logs the
whole parsed config to every logger (the W&B run config). Experiment configs are flat YAML files under
``configs/``; ``configs/logger/wandb.yaml`` is a generic ``trainer.logger`` override for any of them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

__all__ = [
    "CBLightCLI",
    "CLIConfigError",
    "LoggerSaveConfigCallback",
    "check_checkpoint_path",
    "check_wandb_available",
    "train_cli",
]


class CLIConfigError(ValueError):
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


class CBLightCLI(LightningCLI):
    """LightningCLI with cblight's early checks (see the module docstring)."""

    def parse_arguments(self, parser: Any, args: Any) -> None:
        # Checked right after parsing: LightningCLI itself opens ckpt_path next, then builds everything.
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        config = self.config.get(subcommand, self.config) if subcommand else self.config
        check_wandb_available(config.get("trainer", {}).get("logger"))
        check_checkpoint_path(config.get("ckpt_path"))

    def before_fit(self) -> None:
        check = getattr(self.model, "check_prompts", None)
        prompts = getattr(self.datamodule, "train_prompts", None)
        if callable(check) and callable(prompts):
            check(prompts())


def _defaults() -> dict[str, Any]:
    return {
        "logger": {
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": "outputs", "name": "coherence_tuning"},
        }
    }


def train_cli(args: Any = None, run: bool = True) -> CBLightCLI:
    """``python train.py fit -c configs/coherence_tuning.yaml``: coherence tuning (paper appendix)."""
    from cblight.data.prompts import PromptDataModule
    from cblight.modules.tuning import CoherenceTuning

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
