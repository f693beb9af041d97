"""The registry that names the tasks: ``get_task`` and ``all_tasks`` load every task module of
``cblight.data.tasks`` (each registers its spec on import) and look a task up by name or alias.

A spec (``cblight.data.spec``, re-exported here) says where the data lives (``DataSource``), which split is
reported and which one alpha* (and k*) is chosen on (docs/design.md, "Selection protocol"), and how a raw record becomes an
``Example`` (``render``).
"""

from __future__ import annotations

from cblight.data.examples import DataError
from cblight.data.spec import _ALIASES, _REGISTRY, RenderContext, TaskKind, TaskSpec, register

__all__ = ["RenderContext", "TaskKind", "TaskSpec", "all_tasks", "get_task", "register"]


def _load_all() -> None:
    import cblight.data.tasks  # noqa: F401  (registers every task)


def get_task(name: str) -> TaskSpec:
    """The task spec named ``name`` or one of its aliases; ``DataError`` listing the known tasks otherwise."""
    _load_all()
    try:
        return _REGISTRY[_ALIASES.get(name, name)]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise DataError(f"unknown task {name!r}; known tasks: {known}") from None


def all_tasks() -> dict[str, TaskSpec]:
    """Every registered task spec by name, sorted."""
    _load_all()
    return dict(sorted(_REGISTRY.items()))
