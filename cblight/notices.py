"""Library notices that every cblight run printed and no user can act on, silenced at their source for
cblight's runs only: no log level is lowered, a user's own logs and warnings print as before."""

from __future__ import annotations

import logging
import warnings

# Lightning's lines before any work: advertisements, the devices found and the seed (the config says both)
_DROPPED = ("💡 Tip:", "GPU available:", "TPU available:", "HPU available:", "IPU available:", "Seed set to")


def _drop_tips(record: logging.LogRecord) -> bool:
    return not str(record.getMessage()).startswith(_DROPPED)


def quiet_library_notices() -> None:
    """Silence, for the rest of the process (idempotent): LightningCLI's warning that it got ``args`` while
    ``sys.argv`` holds some too, its note on the evaluators' overridden ``transfer_batch_to_device``,
    Lightning's ``_DROPPED`` lines, and torch's ``LeafSpec`` deprecation from Lightning's ``_pytree``."""
    warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
    warnings.filterwarnings("ignore", message=".*overridden `transfer_batch_to_device`.*")
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )
    # rank_zero_info logs through whichever of the first two Lightning imported last
    for name in ("pytorch.utilities.rank_zero", "fabric.utilities.rank_zero", "fabric.utilities.seed"):
        logging.getLogger(f"lightning.{name}").addFilter(_drop_tips)  # added once: addFilter skips a repeat
