"""The valid name nearest a misspelt one, for "did you mean ...?": a word, a dotted option key, or a
subclass of a base class. Imports nothing heavy, so that ``cblight --help`` stays fast."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
from collections.abc import Iterable

__all__ = ["class_named", "closest", "closest_keys", "subclasses"]


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice nearest ``word`` by difflib; of equal ratios, the same letters (``stpe``: ``step``)."""
    close = difflib.get_close_matches(word, sorted(set(choices)), n=5)
    matchers = [difflib.SequenceMatcher(None, word, choice) for choice in close]
    best = max(matchers, key=lambda m: (m.ratio(), m.quick_ratio()), default=None)
    return best.b if best else None


def closest_keys(key: str, keys: set[str]) -> list[str]:
    """The valid key nearest ``key`` under its longest known prefix, a dot read as an underscore
    (``model.lora_rnk``: ``model.lora.rank``), as a list of none or one."""
    parts = key.split(".")
    for depth in range(len(parts) - 1, -1, -1):
        prefix = "".join(f"{part}." for part in parts[:depth])
        under = {k[len(prefix) :]: k for k in sorted(keys) if k.startswith(prefix)}
        if under:
            rest = key[len(prefix) :]
            words = {u.replace(".", "_"): k for u, k in under.items()}
            close = closest(rest.replace(".", "_"), words)
            return [words[close]] if close else []
    return []


def subclasses(bases: Iterable[type]) -> list[type]:
    """The imported, public subclasses of ``bases`` (the classes jsonargparse resolves a short name to)."""
    todo = [b for b in bases if b.__module__ not in ("collections.abc", "typing")]
    seen: dict[type, None] = {}
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen[cls] = None
            todo.extend(cls.__subclasses__())
    return [c for c in seen if "._" not in f"{c.__module__}." and "<locals>" not in c.__qualname__]


def class_named(name: str, bases: Iterable[type]) -> type | None:
    """The class a ``class_path`` names: a dotted path, or the short name of one of ``bases``' subclasses."""
    module, _, attr = name.rpartition(".")
    with contextlib.suppress(ImportError, AttributeError, ValueError):  # not a dotted path to a class
        found = getattr(importlib.import_module(module), attr)
        if inspect.isclass(found):
            return found
    return next((c for c in subclasses(bases) if c.__name__ == name), None)
