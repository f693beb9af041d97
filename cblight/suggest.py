"""The valid name nearest a misspelt one, for "did you mean ...?" (docs/errors.md): the keys a
jsonargparse parser or a class's signature accepts, the public subclasses of a base class, and ``closest``
(``difflib``'s close matches, the fewest typing edits first). Imports nothing heavy at module level, so that
``cblight --help`` stays fast.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Iterable
from typing import Any

__all__ = [
    "class_keys",
    "closest",
    "closest_key",
    "closest_keys",
    "import_object",
    "leaf_keys",
    "parser_keys",
    "subclass_names",
    "typing_edits",
]

_NOT_KEYS = {"help", "config", "print_config", "__default_config__", "subcommand"}


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice nearest ``word``: ``difflib``'s close matches, the fewest typing edits first (a swapped
    pair of letters is one edit, so ``stpe`` gives ``step``, not ``stop``, which difflib rates the same)."""
    close = difflib.get_close_matches(word, sorted(set(choices)), n=5)
    return min(close, key=lambda c: typing_edits(word, c), default=None)


def typing_edits(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of neighbours turning ``a`` into ``b``."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[-1][-1]


def closest_key(key: str, keys: Iterable[str]) -> str | None:
    """The valid dotted key nearest ``key`` (the first of ``closest_keys``), or None."""
    return next(iter(closest_keys(key, keys)), None)


def closest_keys(key: str, keys: Iterable[str]) -> list[str]:
    """The valid dotted keys nearest ``key``, leaf options rather than the group that holds them: its longest
    known prefix kept, the rest matched among the keys under that prefix (``model.export_dir`` gives
    ``model.export.dir``, not the group ``model.export``; ``model.lora_rnk`` gives ``model.lora.rank``), or,
    when the unknown part has parts after it, that part among the prefix's children (``modle.model`` gives
    ``model.model``). A rest that is the name of leaves deeper down gives those leaves (``model.k``:
    ``model.boosting.k``; ``model.alpha``: ``model.boosting.alpha`` and ``model.lora.alpha``)."""
    keys = set(keys)
    parts = key.split(".")
    for depth in range(len(parts) - 1, -1, -1):
        prefix = ".".join(parts[:depth])
        under = {
            k[len(prefix) + 1 :] if prefix else k for k in keys if not prefix or k.startswith(prefix + ".")
        }
        if not under:
            continue
        rest = ".".join(parts[depth:])
        leaves = leaf_keys(under)
        same_words = sorted(k for k in leaves if k.replace(".", "_") == rest.replace(".", "_"))
        deeper = sorted(k for k in leaves if "." not in rest and k.rpartition(".")[2] == rest)
        if "." in rest:  # its first part is the unknown one (``modle.model``): matched among the children
            child = closest(parts[depth], {k.split(".")[0] for k in under})
            close = ".".join([child, *parts[depth + 1 :]]) if child else None
        else:  # matched among the keys under the prefix, whole (``lora_rnk``: ``lora.rank``)
            close = closest(rest, under)
        found = same_words or deeper or ([close] if close else [])
        return [f"{prefix}.{k}" if prefix else k for k in found]
    return []


def leaf_keys(keys: Iterable[str]) -> set[str]:
    """The keys that hold a value, not a group of other keys."""
    keys = set(keys)
    return {k for k in keys if not any(o.startswith(k + ".") for o in keys)}


def parser_keys(parser: Any) -> set[str]:
    """Every option key of a jsonargparse parser (its subcommands' too), dotted, without the meta options."""
    keys: set[str] = set()
    for action in getattr(parser, "_actions", []):
        for sub in getattr(action, "_name_parser_map", {}).values():
            keys |= parser_keys(sub)
        dest = str(action.dest)
        if dest not in _NOT_KEYS and not dest.endswith((".help", "__default_config__")):
            keys.add(dest)
    return keys


def class_keys(class_path: str, path: list[str]) -> set[str]:
    """The init keys of ``class_path`` (as jsonargparse reads its signature), under the dotted ``path``."""
    from jsonargparse import ArgumentParser

    target = import_object(class_path)
    if target is None:
        return set()
    try:
        parser = ArgumentParser(exit_on_error=False)
        if inspect.isclass(target):
            parser.add_class_arguments(target, fail_untyped=False)
        else:
            parser.add_function_arguments(target, fail_untyped=False)
        names = parser_keys(parser)
    except Exception:  # a signature jsonargparse cannot read: its plain parameter names
        names = {p for p in inspect.signature(target).parameters if p not in ("self", "args", "kwargs")}
    prefix = ".".join(path)
    return {f"{prefix}.{name}" if prefix else name for name in names}


def import_object(class_path: str) -> Any:
    """The object a dotted path names, or None."""
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def subclass_names(bases: list[str]) -> list[str]:
    """Short names of the imported, public subclasses of ``bases`` (what jsonargparse resolves a name to)."""
    names: set[str] = set()
    todo = [
        b
        for b in map(import_object, bases)
        if inspect.isclass(b) and b.__module__ not in ("collections.abc", "typing")
    ]
    seen: set[type] = set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if "._" not in f"{cls.__module__}." and "<locals>" not in cls.__qualname__:
            names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return sorted(names)
