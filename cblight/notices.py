"""Library notices that every cblight run printed and no user can act on, silenced at their source for
cblight's runs only: no log level is lowered, a user's own Lightning logs and warnings print as before.
(The tokenizer's "sequence length is longer" warning is switched off where cblight tokenizes.)"""

from __future__ import annotations

import logging
import warnings

__all__ = ["quiet_library_notices"]

# Lightning's lines before any work: advertisements, the devices found and the seed (the config says both)
_DROPPED = ("💡 Tip:", "GPU available:", "TPU available:", "HPU available:", "IPU available:", "Seed set to")
# rank_zero_info logs through whichever of the first two Lightning imported last
_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning.fabric.utilities.seed",
)


class _DropLightningTips(logging.Filter):
    """Lightning's lines named in ``_DROPPED``, nothing else it logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(_DROPPED)


def quiet_library_notices() -> None:
    """Silence, for the rest of the process (idempotent): LightningCLI's warning that it got ``args`` while
    ``sys.argv`` holds arguments too (so Lightning's DDP launcher re-runs the very command), its note that an
    evaluator overrides ``transfer_batch_to_device``, Lightning's ``_DROPPED`` lines on their own loggers,
    and torch's ``LeafSpec`` deprecation raised from Lightning's ``_pytree`` module on every run."""
    warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
    warnings.filterwarnings("ignore", message=".*overridden `transfer_batch_to_device`.*")
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLightningTips) for f in logger.filters):
            logger.addFilter(_DropLightningTips())
