"""The option types every public option is declared with, and the one checker that enforces them.

An option is declared once, with a precise type: a ``Literal``, or one of the constrained types defined
below with ``bounded`` (``PositiveInt``, ``NonNegativeInt``, ``PositiveFloat``, ``NonNegativeFloat``,
``ClosedUnitInterval``, ``OpenUnitInterval``, ``FiniteFloat``, ``PositiveFiniteFloat``,
``PositiveUnitInterval``, ``RatioAtLeastOne``, ``NotEmptyStr``), each carrying its bound in words.
jsonargparse enforces the declaration on the command line and in YAML; ``check_fields`` (a dataclass's ``__post_init__``) and ``check_arguments`` (a LightningModule's
``__init__``) enforce the same declaration for a Python caller. Both refuse with one line that names the
option, what it accepts (``describe``) and the value given. Checks that involve two options together are
written where the options live, once each.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union

from jsonargparse.typing import extend_base_type

from cblight.errors import CblightError, ConfigError

__all__ = [
    "ClosedUnitInterval",
    "FiniteFloat",
    "NonNegativeFloat",
    "NonNegativeInt",
    "NotEmptyStr",
    "OpenUnitInterval",
    "PositiveFiniteFloat",
    "PositiveFloat",
    "PositiveInt",
    "PositiveUnitInterval",
    "RatioAtLeastOne",
    "bases",
    "bounded",
    "check_arguments",
    "check_fields",
    "describe",
    "fits",
    "item_type",
    "members",
    "option_at",
    "option_keys",
    "options_of",
]


def bounded(name: str, base: type, words: str, test: Callable[[Any], bool], module: str = __name__) -> type:
    """A constrained option type: a subclass of ``base`` (int, float or str) whose constructor refuses a value
    that fails ``test``, registered with jsonargparse (its public ``extend_base_type``), so that the parser
    enforces it on the command line and in YAML, and ``check_fields`` for a Python caller.

    Args:
        name: the type's name (``PositiveInt``).
        base: ``int``, ``float`` or ``str``; a bool is none of them, and an int type takes no fractional float.
        words: what a valid value is, as messages say it (``an integer >= 1``), kept as the type's ``words``.
        test: whether a value, converted to ``base``, is valid.
        module: the module that binds the type to ``name`` (where pickle finds it: a value in a checkpoint's
            hyperparameters); this one by default.

    Returns:
        The type, with the public attributes ``base`` and ``words``.

    Examples:
        >>> Even = bounded("Even", int, "an even integer", lambda v: v % 2 == 0)
        >>> Even(4), Even.words
        (4, 'an even integer')
    """

    def validate(cls: type, value: Any) -> None:
        fraction = base is int and isinstance(value, float) and not value.is_integer()
        if isinstance(value, bool) or fraction or not test(base(value)):
            raise ValueError(f"{value!r} is not {words}")

    # created under another name, as jsonargparse refuses one that its own module defines (``PositiveInt``)
    created = extend_base_type(f"cblight_{name}", base, validate, words, {"base": base, "words": words})
    created.__name__, created.__qualname__, created.__module__ = name, name, module
    return created


PositiveInt = bounded("PositiveInt", int, "an integer >= 1", lambda v: v >= 1)
NonNegativeInt = bounded("NonNegativeInt", int, "an integer >= 0", lambda v: v >= 0)
PositiveFloat = bounded("PositiveFloat", float, "a number > 0", lambda v: v > 0)
NonNegativeFloat = bounded("NonNegativeFloat", float, "a number >= 0", lambda v: v >= 0)
ClosedUnitInterval = bounded("ClosedUnitInterval", float, "a number in [0, 1]", lambda v: 0 <= v <= 1)
OpenUnitInterval = bounded("OpenUnitInterval", float, "a number in (0, 1)", lambda v: 0 < v < 1)
#: A float that is neither infinite nor NaN.
FiniteFloat = bounded("FiniteFloat", float, "a finite number", math.isfinite)
#: A positive float that is not infinite (a softmax temperature).
PositiveFiniteFloat = bounded("PositiveFiniteFloat", float, "a finite number > 0", lambda v: 0 < v < math.inf)
#: A probability mass that keeps something: in (0, 1] (nucleus sampling's ``top_p``).
PositiveUnitInterval = bounded("PositiveUnitInterval", float, "a number in (0, 1]", lambda v: 0 < v <= 1)
#: A finite ratio of at least 1: an upper bound relative to a starting value (the collapse guard's perplexity).
RatioAtLeastOne = bounded("RatioAtLeastOne", float, "a finite number >= 1", lambda v: 1 <= v < math.inf)
#: A string with something other than spaces in it.
NotEmptyStr = bounded("NotEmptyStr", str, "a non-empty string", lambda v: bool(v.strip(" ")))

_WORDS: dict[Any, str] = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _restricted(hint: Any) -> bool:
    """A constrained type of ``bounded``'s."""
    return isinstance(hint, type) and issubclass(hint, int | float | str) and hasattr(hint, "words")


def describe(hint: Any) -> str:
    """What a value of type ``hint`` is, in words: ``an integer >= 1``, ``one of 'jsd', 'cocoa'``, ..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _WORDS:
        return _WORDS[hint]
    if _restricted(hint):
        return hint.words
    if origin is Literal:
        return ("one of " if len(args) > 1 else "") + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        words = " or ".join(describe(a) for a in kept)
        return words + (" or null" if len(kept) < len(args) else "")
    if origin is tuple and args and args[-1] is not Ellipsis:
        return f"a {len(args)}-item list ({'; '.join(describe(a) for a in args)})"
    if origin in (list, tuple) or hint in (list, tuple):
        inner = args[0] if args else None
        return "a list" + (f", each {describe(inner)}" if inner is not None else "")
    if origin is dict or hint is dict:
        return "a mapping"
    name = getattr(hint, "__name__", str(hint))
    return f"{'an' if name[:1] in 'AEIOU' else 'a'} {name}"


def fits(hint: Any, value: Any) -> bool:
    """Whether ``value`` is a value of type ``hint``, as jsonargparse would parse it from text (an int is a
    float; a bool is neither)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or isinstance(hint, typing.TypeVar):
        return True
    if hint is None or hint is type(None):
        return value is None
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (Union, types.UnionType):
        return any(fits(a, value) for a in args)
    if _restricted(hint):
        if isinstance(value, bool) or not isinstance(value, int | float if hint.base is float else hint.base):
            return False
        try:
            hint(value)
        except ValueError:
            return False
        return True
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if origin is tuple:
        if not isinstance(value, tuple | list):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(fits(args[0], v) for v in value)
        return len(args) == len(value) and all(fits(a, v) for a, v in zip(args, value, strict=True))
    if origin is list:
        return isinstance(value, list | tuple) and all(fits(args[0], v) for v in value) if args else True
    if origin is dict:
        return isinstance(value, Mapping)
    if origin is not None:  # Callable[...], Iterable[...]: not checked here
        return True
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _is_float(hint: Any) -> bool:
    kept = members(hint)
    return len(kept) == 1 and (kept[0] is float or (_restricted(kept[0]) and kept[0].base is float))


@functools.cache
def _hints(owner: Any) -> dict[str, Any]:
    return typing.get_type_hints(owner)


def _refuse(error: type[CblightError], name: str, hint: Any, value: Any) -> None:
    raise error(f"{name} must be {describe(hint)}, got {value!r}")


def check_fields(obj: Any, error: type[CblightError] = ConfigError) -> None:
    """Check every field of the dataclass ``obj`` against its declared type; the first that does not fit
    raises ``error`` with one line (``Boosting.k must be an integer >= 1, got 0``)."""
    hints = _hints(type(obj))
    for field in dataclasses.fields(obj):
        hint, value = hints[field.name], getattr(obj, field.name)
        if not fits(hint, value):
            _refuse(error, f"{type(obj).__name__}.{field.name}", hint, value)
        if type(value) is int and _is_float(hint):  # as jsonargparse parses 2 for a float: 2.0
            object.__setattr__(obj, field.name, float(value))


def check_arguments(
    fn: Callable[..., Any], values: Mapping[str, Any], error: type[CblightError] = ConfigError
) -> None:
    """Check the arguments ``values`` (a function's ``locals()``) against ``fn``'s annotations; for a
    LightningModule's ``__init__``, whose arguments are its command-line options."""
    hints = _hints(fn)
    for name, value in values.items():
        if name in hints and name != "return" and not fits(hints[name], value):
            _refuse(error, name, hints[name], value)


# the types whose values are plain (no options of their own, no class path)
_PLAIN = (int, float, str, bytes, bool, list, tuple, dict, set, os.PathLike)


def option_keys(prefix: str, hint: Any, depth: int = 3) -> set[str]:
    """The option keys under ``prefix``, an option of type ``hint``: its fields' and their fields'."""
    found = set()
    for name, inner in options_of(hint).items() if depth else ():
        key = f"{prefix}.{name}" if prefix else name
        found |= {key} | option_keys(key, inner, depth - 1)
    return found


def option_at(hint: Any, key: str) -> Any:
    """The type of the option ``key`` (dotted) under a value of type ``hint``; None where it has none."""
    for part in key.split("."):
        hint = options_of(hint).get(part)
    return hint


def options_of(hint: Any, function: bool = False) -> dict[str, Any]:
    """The options under a value of type ``hint``: a dataclass's fields, or a class's ``__init__`` parameters
    (a ``function``'s parameters)."""
    for member in [hint] if function else map(item_type, members(hint)):
        if function or (
            inspect.isclass(member) and not issubclass(member, _PLAIN) and member.__module__ != "typing"
        ):
            try:
                plain = function or dataclasses.is_dataclass(member)
                hints = typing.get_type_hints(member if plain else member.__init__)
                params = inspect.signature(member).parameters
            except Exception:  # an annotation that does not resolve here, or no signature: untyped
                continue
            kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            return {n: hints.get(n) for n, p in params.items() if p.kind not in kinds}
    return {}


def item_type(hint: Any) -> Any:
    """The type of a list's or tuple's items (``tuple[X, ...]``: X); any other type itself."""
    args = typing.get_args(hint)
    return args[0] if typing.get_origin(hint) in (list, tuple) and args else hint


def members(hint: Any) -> list[Any]:
    """The types a ``hint`` admits other than None: a union's members, else the type itself."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return [a for a in (typing.get_args(hint) if union else (hint,)) if a not in (None, type(None))]


def bases(hint: Any) -> list[type]:
    """The classes a class path names a subclass of (``Callable[..., C]``: C)."""
    found = [typing.get_args(m)[-1] if typing.get_origin(m) is Callable else m for m in members(hint)]
    return [c for c in found if inspect.isclass(c) and not issubclass(c, _PLAIN)]
