"""Evaluation data: one task spec per benchmark of the paper and its readers (docs/data.md).

The public modules: ``registry`` (``get_task``, ``all_tasks``, ``TaskSpec``), ``examples`` (what a task's
records become), ``datamodule`` (``EvalDataModule``) and ``sentences`` (the rule-based sentence splitter).
"""

__all__ = ["datamodule", "examples", "registry", "sentences"]
