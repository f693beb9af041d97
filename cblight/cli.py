"""LightningCLI wiring for the entry points (``evaluate.py``, ``train.py``).

``evaluate_cli`` parses ``BoostedEvaluator`` and ``EvalDataModule`` arguments from their signatures, runs
Lightning's validation loop on the alpha-selection splits and then its test loop on the reported splits.
Logs go to a CSV logger under ``model.output_dir`` unless a logger is configured (e.g.
``-c configs/logger/wandb.yaml``).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import Any

from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from cblight.data.datamodule import EvalDataModule
from cblight.errors import CblightError
from cblight.modules.evaluation import DEFAULT_KS, BoostedEvaluator, resolve_output_dir

EVAL_TRAINER_DEFAULTS: dict[str, Any] = {
    "enable_checkpointing": False,
    "enable_model_summary": False,
    "inference_mode": True,
}


def _tokenizer_for(model: str, tokenizer: str | None) -> str:
    return tokenizer or model


def _largest_k(ks: Sequence[int] | None) -> int:
    """The largest short-context length of the next-token grid (LAMA keeps prompts longer than it)."""
    return max(ks) if ks else max(DEFAULT_KS)


def require_wandb(logger_config: Any) -> None:
    """Fail before any work when W&B logging is asked for but the package is missing."""
    text = str(logger_config)
    if "WandbLogger" not in text:
        return
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise SystemExit(
            "W&B logging was requested (WandbLogger) but the 'wandb' package is not installed: "
            "pip install 'cblight[wandb]' or drop -c configs/logger/wandb.yaml"
        ) from None


class EvaluateCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments(("model.model", "model.tokenizer"), "data.tokenizer", compute_fn=_tokenizer_for)
        parser.link_arguments("model.ks", "data.max_k", compute_fn=_largest_k)

    def before_instantiate_classes(self) -> None:
        config = self.config
        logger = config.trainer.logger
        require_wandb(logger)
        if logger is None or logger is True:
            config.trainer.logger = {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {
                    "save_dir": str(resolve_output_dir(config.model.output_dir, config.model.model)),
                    "name": "logs",
                },
            }


def run_evaluation(trainer: Any, model: BoostedEvaluator, datamodule: EvalDataModule) -> dict[str, Any]:
    """Choose alpha* (and k*) on the selection splits, then report on the test splits."""
    datamodule.setup("validate")
    if datamodule.loader_splits("selection"):
        trainer.validate(model, datamodule=datamodule, verbose=False)
    trainer.test(model, datamodule=datamodule, verbose=False)
    if model.summary:
        rank_zero_info("\n" + model.summary)
    return model.results


def exit_on_bad_input(fn: Any) -> Any:
    """Run ``fn``; bad input (``CblightError``) becomes one line on stderr and exit status 2."""
    try:
        return fn()
    except CblightError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def evaluate_cli(args: Sequence[str] | None = None) -> dict[str, Any]:
    return exit_on_bad_input(lambda: _evaluate(args))


def _evaluate(args: Sequence[str] | None) -> dict[str, Any]:
    warnings.filterwarnings("ignore", message=".*overridden `transfer_batch_to_device`.*")
    cli = EvaluateCLI(
        BoostedEvaluator,
        EvalDataModule,
        run=False,
        trainer_defaults=EVAL_TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        seed_everything_default=1234,
        args=list(args) if args is not None else None,
    )
    return run_evaluation(cli.trainer, cli.model, cli.datamodule)
