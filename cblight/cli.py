"""LightningCLI wiring for the entry points (``evaluate.py``, ``train.py``).

``evaluate_cli`` parses the evaluation module (``BoostedEvaluator`` by default; a config may name
``cblight.modules.generation.BoostedGenerationEvaluator`` as ``model.class_path``) and ``EvalDataModule``
from their signatures. ``BoostedEvaluator`` runs Lightning's validation loop on the alpha-selection splits,
then its test loop on the reported splits; the generation module runs the test loop. Logs go to a CSV logger
under ``model.output_dir`` unless a logger is configured (e.g. ``-c configs/logger/wandb.yaml``).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import warnings
from collections.abc import Sequence
from typing import Any, Optional

from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from cblight.data.datamodule import EvalDataModule
from cblight.errors import CblightError
from cblight.modules.evaluation import DEFAULT_KS, BoostedEvaluator, resolve_output_dir
from cblight.modules.generation import BoostedGenerationEvaluator  # noqa: F401  (short name for --model)

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
        parser.set_defaults({"model": {"class_path": "cblight.modules.evaluation.BoostedEvaluator"}})
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
        require_wandb(logger)
        if logger is None or logger is True:
            args = config.model.init_args
            default_dir = (
                inspect.signature(_model_class(config.model.class_path)).parameters["output_dir"].default
            )
            config.trainer.logger = {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {
                    "save_dir": str(resolve_output_dir(args.get("output_dir") or default_dir, args.model)),
                    "name": "logs",
                },
            }


def _model_class(class_path: str) -> Any:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def run_evaluation(
    trainer: Any, model: LightningModule, datamodule: EvalDataModule, print_summary: bool = True
) -> dict[str, Any]:
    """Choose alpha* (and k*) on the selection splits, then report on the test splits."""
    datamodule.setup("validate")
    if isinstance(model, BoostedEvaluator) and datamodule.loader_splits("selection"):
        trainer.validate(model, datamodule=datamodule, verbose=False)
    trainer.test(model, datamodule=datamodule, verbose=False)
    if print_summary and model.summary:
        rank_zero_info("\n" + model.summary)
    return model.results


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
    """Run ``fn``; bad input (``CblightError``) becomes one line on stderr and exit status 2."""
    try:
        return fn()
    except Exception as err:
        bad = _bad_input(err)
        if bad is None:
            raise
        print(f"error: {bad}", file=sys.stderr)
        raise SystemExit(2) from None


def evaluate_cli(args: Sequence[str] | None = None) -> dict[str, Any]:
    return exit_on_bad_input(lambda: _evaluate(args))


def build_evaluate_cli(args: Sequence[str] | None = None) -> EvaluateCLI:
    """Parse ``args`` (default: ``sys.argv``) and instantiate the trainer, module and data module."""
    warnings.filterwarnings("ignore", message=".*overridden `transfer_batch_to_device`.*")
    return EvaluateCLI(
        LightningModule,
        EvalDataModule,
        subclass_mode_model=True,
        run=False,
        trainer_defaults=EVAL_TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        seed_everything_default=1234,
        args=list(args) if args is not None else None,
    )


def _evaluate(args: Sequence[str] | None) -> dict[str, Any]:
    cli = build_evaluate_cli(args)
    if cli.config.get("compare"):
        from cblight.compare import run_comparison

        return run_comparison(cli, cli.config["compare"])
    return run_evaluation(cli.trainer, cli.model, cli.datamodule)
