"""The registry that names the tasks: each module of ``cblight.data.tasks`` registers its specs when it is
imported; ``get_task`` imports the module named like the task (every module only for a name that is not one)
and looks the task up by name or alias, ``all_tasks`` imports them all.

A spec (``cblight.data.spec``, re-exported here) says where the data lives (``DataSource``), which split is
reported and which one alpha* (and k*) is chosen on (docs/design.md, "Selection protocol"), and how a raw
record becomes an ``Example`` (``render``).
"""

from __future__ import annotations

import importlib
import pkgutil

from cblight.data.examples import DataError
from cblight.data.spec import RenderContext, TaskKind, TaskSpec

__all__ = ["RenderContext", "TaskKind", "TaskSpec", "all_tasks", "get_task", "register"]

_TASKS = "cblight.data.tasks"
_REGISTRY: dict[str, TaskSpec] = {}
_ALIASES: dict[str, str] = {}


def register(spec: TaskSpec) -> TaskSpec:
    """Add a task spec under its name and aliases (a task module calls it on import); a name taken twice
    is a ``ValueError``."""
    for name in (spec.name, *spec.aliases):
        if name in _REGISTRY or name in _ALIASES:
            raise ValueError(f"task name {name!r} registered twice")
    _REGISTRY[spec.name] = spec
    _ALIASES.update({alias: spec.name for alias in spec.aliases})
    return spec


def _load_all() -> None:
    package = importlib.import_module(_TASKS)
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{_TASKS}.{module.name}")


def get_task(name: str) -> TaskSpec:
    """The task spec named ``name`` or one of its aliases; ``DataError`` listing the known tasks otherwise."""
    if _ALIASES.get(name, name) not in _REGISTRY:
        package = importlib.import_module(_TASKS)
        if name in {m.name for m in pkgutil.iter_modules(package.__path__)}:
            importlib.import_module(f"{_TASKS}.{name}")  # most tasks live in a module of their name
        if _ALIASES.get(name, name) not in _REGISTRY:
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
