"""Library notices that every cblight run printed and no user can act on, each silenced at its source for
cblight's own runs (docs/errors.md): no log level is lowered, and a user's own Lightning logging and
warnings print as before. The tokenizer's "sequence length is longer than the specified maximum" warning
is switched off where cblight tokenizes (``cblight.scoring.Encoder``), not here.
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["quiet_library_notices"]

# rank_zero_info logs through whichever of these two loggers Lightning imported last
_RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


# Lightning's lines that open every run and precede any error: its advertisements, which devices it found
# (the config says which it uses), and the seed (the config holds it)
_DROPPED = (
    "💡 Tip:",
    "GPU available:",
    "TPU available:",
    "HPU available:",
    "IPU available:",
    "Seed set to",
)
_SEED_LOGGERS = ("lightning.fabric.utilities.seed",)


class _DropLightningTips(logging.Filter):
    """Lightning's lines named in ``_DROPPED``, nothing else it logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(_DROPPED)


def quiet_library_notices() -> None:
    """Silence, for the rest of the process (idempotent):

    * LightningCLI's warning whenever it is given ``args`` while ``sys.argv`` holds arguments too, which is
      how ``cblight <command>`` calls it (``sys.argv`` stays whole, so that Lightning's DDP launcher re-runs
      the very command);
    * Lightning's "💡 Tip" advertisements (litlogger, litmodels), its "GPU available: ..." device lines and
      "Seed set to N", on their own loggers only;
    * torch's ``LeafSpec`` deprecation, raised from Lightning's own ``_pytree`` module on every run.
    """
    warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )
    for name in (*_RANK_ZERO_LOGGERS, *_SEED_LOGGERS):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLightningTips) for f in logger.filters):
            logger.addFilter(_DropLightningTips())
