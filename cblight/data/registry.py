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


def _import(*modules: str) -> None:
    """Import task modules by name (every one when none is named); importing one registers its specs."""
    package = importlib.import_module(_TASKS)
    names = {module.name for module in pkgutil.iter_modules(package.__path__)}
    for name in [m for m in modules if m in names] if modules else sorted(names):
        importlib.import_module(f"{_TASKS}.{name}")


def get_task(name: str) -> TaskSpec:
    """The task spec named ``name`` or one of its aliases; ``DataError`` listing the known tasks otherwise."""
    for modules in ((name,), ()):  # most tasks live in a module of their name; else import them all
        if _ALIASES.get(name, name) not in _REGISTRY:
            _import(*modules)
    try:
        return _REGISTRY[_ALIASES.get(name, name)]
    except KeyError:
        raise DataError(f"unknown task {name!r}; known tasks: {', '.join(sorted(_REGISTRY))}") from None


def all_tasks() -> dict[str, TaskSpec]:
    """Every registered task spec by name, sorted."""
    _import()
    return dict(sorted(_REGISTRY.items()))
