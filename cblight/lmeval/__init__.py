"""cblight in lm-evaluation-harness: the ``cblight`` model (``cblight.lmeval.model``, needs the ``lmeval``
extra), the short-context rules of boosted requests (``cblight.lmeval.contexts``, pure Python) and local
tasks in cblight's prompts (``tasks/``). Run it with ``python -m cblight.lmeval``; see docs/lmeval.md.

Importing this package does not import lm-eval.
"""

from pathlib import Path

#: lm-eval task YAMLs in cblight's prompts over local files (added to lm-eval's ``--include_path``).
TASKS_DIR = Path(__file__).resolve().parent / "tasks"

__all__ = ["TASKS_DIR"]
