"""Running one evaluation: alpha* (and k*) chosen on the selection splits, then the report splits.

Below both the CLI (``cblight.cli``) and the comparison of checkpoints (``cblight.compare``), which call
``run_evaluation`` once per checkpoint. SIGINT and SIGTERM stop it promptly (``cblight.interrupt``).
"""

from __future__ import annotations

import signal
from typing import Any

from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info

from cblight.data.datamodule import EvalDataModule
from cblight.evaluate.boosted_evaluator import BoostedEvaluator
from cblight.interrupt import RunInterrupted, stop_on_signals


def run_evaluation(
    trainer: Any, model: LightningModule, datamodule: EvalDataModule, print_summary: bool = True
) -> dict[str, Any]:
    """Choose alpha* (and k*) on the selection splits, then report on the test splits."""
    with stop_on_signals():
        try:
            datamodule.setup("validate")
            if isinstance(model, BoostedEvaluator) and datamodule.loader_splits("selection"):
                trainer.validate(model, datamodule=datamodule, verbose=False)
            trainer.test(model, datamodule=datamodule, verbose=False)
        except RunInterrupted:
            launcher = getattr(trainer.strategy, "launcher", None)
            if hasattr(launcher, "kill"):  # DDP worker processes started by this one stop too
                launcher.kill(signal.SIGTERM)
            raise
    if print_summary and model.summary:
        rank_zero_info("\n" + model.summary)
    return model.results
