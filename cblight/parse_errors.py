"""A command line that does not parse, said in one line (every case: docs/errors.md): the parser records each
option's declared type; a failed parse is read again against them, else jsonargparse's first line is said."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import inspect
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any, NoReturn

import yaml
from jsonargparse import ArgumentParser

from cblight.option_types import FiniteFloat, describe
from cblight.suggest import class_named, closest, closest_keys, subclasses

__all__ = ["OneLineErrors", "Parser", "config_options"]

# the parser called, the command line, and each config file's options as read (path as typed: options)
_PARSING: ContextVar[tuple[Any, list[str], dict[str, Any]] | None] = ContextVar(
    "cblight_parsing", default=None
)
_FILE: ContextVar[str | None] = ContextVar("cblight_config_file", default=None)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, as jsonargparse reads a config
_NOT_OPTIONS = ("help", "config", "print_config")
_SCALARS = (int, float, str, bytes, bool, list, tuple, dict, set, os.PathLike, enum.Enum)


class OneLineErrors:
    """Mixin of a jsonargparse ``ArgumentParser`` (put it first): a parse error becomes one line. It keeps
    ``declared`` (option key: type), ``required_params`` (name: positional?) and ``subcommands``."""

    @property
    def declared(self) -> dict[str, Any]:
        return self.__dict__.setdefault("_declared", {})

    def _declare(self, owner: Any, prefix: str | None, kw: dict[str, Any], function: bool = False) -> None:
        for name, (hint, required) in _params(owner).items():
            if name not in (kw.get("skip") or ()):
                self.declared[f"{prefix}.{name}" if prefix else name] = hint
            if required and function:
                self.__dict__.setdefault("required_params", {})[name] = kw.get("as_positional", False)

    def add_argument(self, *args: Any, **kwargs: Any) -> Any:
        action = super().add_argument(*args, **kwargs)  # type: ignore[misc]
        # jsonargparse gives a parser's argument groups this method too: the parser keeps the declaration
        declared = vars(getattr(self, "parser", self)).setdefault("_declared", {})
        if kwargs.get("type") is not None or action.dest not in declared:
            declared[action.dest] = kwargs.get("type")
        return action

    def add_class_arguments(self, cls: Any, nested_key: str | None = None, *args: Any, **kwargs: Any) -> Any:
        self._declare(cls, nested_key, kwargs)
        return super().add_class_arguments(cls, nested_key, *args, **kwargs)  # type: ignore[misc]

    def add_subclass_arguments(self, base: Any, nested_key: str, *args: Any, **kwargs: Any) -> Any:
        self.declared[nested_key] = typing.Union[base] if isinstance(base, tuple) else base  # noqa: UP007
        return super().add_subclass_arguments(base, nested_key, *args, **kwargs)  # type: ignore[misc]

    def add_function_arguments(self, fn: Any, nested_key: str | None = None, *a: Any, **kw: Any) -> Any:
        self._declare(fn, nested_key, kw, function=True)
        return super().add_function_arguments(fn, nested_key, *a, **kw)  # type: ignore[misc]

    def add_subcommands(self, *args: Any, **kwargs: Any) -> Any:
        self.subcommands = super().add_subcommands(*args, **kwargs)  # type: ignore[misc]
        return self.subcommands

    def parse_args(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        argv = list(map(str, sys.argv[1:] if args is None else args))
        token = _PARSING.set(
            (self, argv, (_PARSING.get() or (0, 0, {}))[2])
        )  # a subcommand's: the same files
        try:
            return super().parse_args(args, *rest, **kwargs)  # type: ignore[misc]
        finally:
            _PARSING.reset(token)

    def parse_path(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        token = _FILE.set(str(path))  # as typed: jsonargparse passes its base name on, from the file's folder
        try:
            return super().parse_path(path, *args, **kwargs)  # type: ignore[misc]
        finally:
            _FILE.reset(token)

    def parse_string(self, *args: Any, **kwargs: Any) -> Any:
        path, token = _FILE.get(), _FILE.set(None)
        try:
            if path is not None:  # a config file's one read, jsonargparse's: what is wrong with it said first
                _, argv, configs = _PARSING.get() or (self, [], {})
                configs[path] = config_options(path, args[0] if args else kwargs.get("content"))
                self.check_config(path, configs[path], argv)
            return super().parse_string(*args, **kwargs)  # type: ignore[misc]
        finally:
            _FILE.reset(token)

    def check_config(self, path: str, config: dict[str, Any], args: list[str]) -> None:
        """Checks of a config file's options ``config`` before they are parsed (``args``: the command line);
        none here, a command's parser adds its own (``cblight.cli.CLIParser``)."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        # jsonargparse's inner parsers raise (the outer one reports), and its debug mode wants the traceback
        if os.environ.get("JSONARGPARSE_DEBUG", "").lower() == "true" or not self.exit_on_error:  # type: ignore[attr-defined]
            super().error(message, ex)  # type: ignore[misc]
        missing = re.match(r'Parser key "config": (File does not exist: .*)', message)
        if missing:  # a config file that does not exist (jsonargparse's words)
            _refuse(f"-c/--config: {missing[1]}")
        parser, argv, _ = _PARSING.get() or (self, [], {})
        said = None  # on a declaration this reading does not follow: jsonargparse's own words
        with contextlib.suppress(Exception):
            said = _first_fault(parser, list(argv))
        lines = [line.strip() for line in message.strip().splitlines() if line.strip()] or [message]
        _refuse(said or (" ".join(lines[:2]) if lines[0].endswith(":") else lines[0]))


class Parser(OneLineErrors, ArgumentParser):
    """jsonargparse's ``ArgumentParser`` with one-line errors (``auto_cli(..., parser_class=Parser)``)."""


def _refuse(line: str) -> NoReturn:
    print(f"error: {line}", file=sys.stderr)
    raise SystemExit(2)


def config_options(path: str, text: str) -> dict[str, Any]:
    """A config file's options, from its ``text`` as read; else says what is wrong with the file ``path``."""
    try:
        content = yaml.load(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as bad:
        mark, ctx = bad.problem_mark, bad.context_mark
        at = f" ({bad.context} that starts at line {ctx.line + 1}, column {ctx.column + 1})" if ctx else ""
        _refuse(f"{path} line {mark.line + 1}, column {mark.column + 1}: {bad.problem}{at}")
    if not isinstance(content, dict):
        kinds = {list: "a list", str: "a string", bool: "true or false", type(None): "an empty file"}
        got = kinds.get(type(content), "a number")
        _refuse(f"{path}: the config file must be a mapping of options (key: value), got {got}")
    return content


def _first_fault(parser: Any, argv: list[str]) -> str | None:
    given: set[str] = set()
    subcommand, i = None, 0
    while i < len(argv):
        token, i = argv[i], i + 1
        name, eq, text = token.lstrip("-").partition("=")
        if not token.startswith("-") or re.fullmatch(r"-[\d.]+", token):  # an argument, not an option
            choices = list((getattr(parser, "subcommands", None) and parser.subcommands.choices) or [])
            if choices and subcommand is None and token not in choices:
                mean = f"; did you mean {closest(token, choices)!r}?" if closest(token, choices) else ""
                return f"unknown subcommand {token!r}{mean} (choose from {', '.join(choices)})"
            if choices and subcommand is None:
                subcommand, parser = token, parser.subcommands.choices[token]
            elif set(_needed(parser, True)) - given:
                given.add(next(n for n in _needed(parser, True) if n not in given))
            else:
                return f"unexpected argument {token!r}: options are written --name value ({_prog(parser)} --help lists them)"
            continue
        if not eq and i < len(argv) and not argv[i].startswith("--") and argv[i] != "-c":
            text, i = argv[i], i + 1
        if name in ("h", "help") or name.endswith(".help") or name.startswith("no_"):
            continue
        if name in _needed(parser, True):
            return _positional(parser, name, name)
        typed = name not in ("c", "config")
        config = (
            {name: _load(text)} if typed else ((_PARSING.get() or (0, 0, {}))[2].get(text) or _load(text))
        )
        for key, value in (config if isinstance(config, dict) else {}).items():
            said = _fault(parser, "", None, value, str(key).split("."), typed, text if typed else None)
            if said:
                return said
            given.add(str(key))
    if getattr(parser, "subcommands", None) is not None and subcommand is None:
        return f"a subcommand is needed: {' or '.join(parser.subcommands.choices)} ({_prog(parser)} --help lists them)"
    for name in [n for n in _needed(parser, True) if n not in given]:
        return f"{_prog(parser)} needs its argument {name.upper()}: usage: {_usage(parser)} ({_prog(parser)} --help)"
    for name in [n for n in _needed(parser, False) if n not in given]:
        return f"--{name} is required ({_prog(parser)} --help lists the options)"
    return None


def _fault(
    parser: Any, key: str, hint: Any, value: Any, rest: list[str], typed: bool, text: str | None
) -> str | None:
    """The first fault in ``value`` given for the option ``key`` + ``rest`` (of type ``hint``; ``text``: as
    typed), walked one option at a time: the dotted key's, then those of a mapping given."""
    prefix = f"{key}." if key else ""
    if hint is None:  # a group of the parser's options (``data.tasks``), or the parser itself
        names = {k[len(prefix) :].split(".")[0] for k in parser.declared if k.startswith(prefix)}
        children = {name: parser.declared.get(prefix + name) for name in names}
    else:  # a dataclass's fields, or those of the class its value, the command line or its default names
        named = value if isinstance(value, Mapping) and "class_path" in value else _class_given(parser, key)
        children = _children(hint, named) or {}
    items: dict[Any, Any] = {rest[0]: value} if rest else {}
    if not rest and isinstance(value, Mapping) and children:  # its options, ``init_args``' among them
        inner = value.get("init_args") if isinstance(value.get("init_args"), Mapping) else {}
        items, typed, text = {**{f"init_args.{k}": v for k, v in inner.items()}, **value}, False, None
    for name, item in items.items():
        within, _, option = str(name).rpartition(".")
        if option in ("class_path", "init_args", "dict_kwargs") and not rest:
            continue
        if option not in children:  # said as the first option under it (``modle: {model: ...}``)
            leaf = ".".join([prefix + str(name), *rest[1:]])
            while isinstance(item, Mapping) and item:
                leaf, item = f"{leaf}.{next(iter(item))}", item[next(iter(item))]
            near = {".".join(filter(None, (key, within, c))) for c in children if c not in _NOT_OPTIONS}
            return _unknown(parser, leaf, typed, near)
        said = _fault(parser, prefix + str(name), children[option], item, rest[1:], typed, text)
        if said or rest:
            return said
    if items:
        return None
    bases, groups = _bases(hint), _groups(hint)
    if isinstance(value, str) and bases and not groups:
        if class_named(value, bases) is not None or _parses_as(hint, value, text):
            return None
        close = closest(value, [c.__name__ for c in subclasses(bases)])
        mean = f"; did you mean {close}?" if close else ""
        return f"{key}: no class {value!r} can be imported{mean} (a class name or a dotted path)"
    lists = [a for m in _members(hint) if typing.get_origin(m) is list for a in typing.get_args(m)]
    for n, item in enumerate(value if isinstance(value, list) and lists else []):
        said = _fault(parser, f"{key}[{n}]", lists[0], item, [], False, None)
        if said:
            return said
    if _parses_as(hint, value, text):
        return None
    if groups and len(_members(hint)) == 1:  # ``--model.teacher live``: a group of options given a value
        option, value = f"{'--' if typed else ''}{key}", text or str(value)
        if value.endswith((".yaml", ".yml", ".json", ".jsonnet")) or os.sep in value:  # meant as a file
            why = "no such file" if not os.path.exists(value) else "not a mapping of its options"
            return f"{option}: cannot read {value!r} as a config of its options ({why})"
        names = sorted(children)
        # the options that take such a value (a Literal's, a flag's true/false), else its string options
        taking = [
            n for n in names if str not in _members(children[n]) and _parses_as(children[n], value, value)
        ]
        taking = taking or [n for n in names if children[n] is str]
        what = f"{option} is a group of options ({', '.join(names)}), not a value"
        if 1 <= len(taking) <= 3:
            return f"{what}; did you mean {' or '.join(f'{option}.{n} {value}' for n in taking)}?"
        return f"{what}; set one of them, e.g. {option}.{names[0]} VALUE" if names else what
    if isinstance(text, str) and not text.strip():  # ``--model.adaptive ""``: YAML reads it as null
        none = type(None) in typing.get_args(hint)
        what = "leave the option out, or write null" if none else "leave the option out for its default"
        return f"{key} must be {describe(hint)}, got an empty value ({what})"
    special = isinstance(value, str) and value.lower().lstrip("+-.") in ("nan", "inf")
    shown = repr(float(value)) if special else repr(value)
    finite = shown in ("nan", "inf", "-inf") and hint is float  # jsonargparse reads no such float from text
    return f"{key} must be {describe(FiniteFloat if finite else hint)}, got {shown}"


def _unknown(parser: Any, key: str, typed: bool, near: set[str]) -> str:
    dashes = "--" if typed else ""
    keys: set[str] = set(near)  # every key the parser accepts: its declarations and their groups' options
    todo = [(k, h, _class_given(parser, k)) for k, h in parser.declared.items() if k not in _NOT_OPTIONS]
    while todo:
        key_, hint, value = todo.pop()
        keys.add(key_)
        todo += [(f"{key_}.{c}", h, None) for c, h in (_children(hint, value) or {}).items()]
    found = closest_keys(key, keys)
    if found and found[0] in _needed(parser, True):
        return _positional(parser, key, found[0])
    if found:
        return f"unknown option {dashes}{key}; did you mean {' or '.join(dashes + k for k in found)}?"
    return f"unknown option {dashes}{key} ({_prog(parser)} --help lists the options)"


def _positional(parser: Any, option: str, name: str) -> str:
    return f"unknown option --{option}: {name.upper()} is a positional argument, given without an option name: usage: {_usage(parser)}"


def _needed(parser: Any, positional: bool) -> list[str]:
    return [n for n, p in getattr(parser, "required_params", {}).items() if p == positional]


def _params(owner: Any) -> dict[str, tuple[Any, bool]]:
    function = owner.__init__ if inspect.isclass(owner) else owner
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # an annotation that does not resolve here: untyped
        hints = {}
    params = list(inspect.signature(function).parameters.values())[inspect.isclass(owner) :]
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return {p.name: (hints.get(p.name), p.default is p.empty) for p in params if p.kind not in kinds}


def _children(hint: Any, value: Any) -> dict[str, Any] | None:
    """The options under a value of type ``hint``: a dataclass's fields, or the class ``value`` names."""
    groups = _groups(hint)
    named = value.get("class_path") if hasattr(value, "get") else value
    cls = groups[0] if groups else class_named(named, _bases(hint)) if isinstance(named, str) else None
    return {name: h for name, (h, _) in _params(cls).items()} if cls is not None else None


def _class_given(parser: Any, key: str) -> Any:
    """The class given for a subclass option ``key`` (``--model NAME``), else its default."""
    argv = (_PARSING.get() or (None, [], {}))[1]
    named = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == f"--{key}" and argv[i + 1][:1] != "{"]
    if named or not _bases(parser.declared.get(key)):
        return named[-1] if named else None
    with contextlib.suppress(KeyError):  # an option without a default
        return parser.get_default(key)
    return None


def _members(hint: Any) -> list[Any]:
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return [a for a in (typing.get_args(hint) if union else (hint,)) if a not in (None, type(None))]


def _groups(hint: Any) -> list[type]:
    """Groups of options (``--model.boosting.alpha``)."""
    return [m for m in _members(hint) if dataclasses.is_dataclass(m) and inspect.isclass(m)]


def _bases(hint: Any) -> list[type]:
    """The classes a class path names a subclass of (``Callable[..., C]``: C)."""
    found = [typing.get_args(m)[-1] if typing.get_origin(m) is Callable else m for m in _members(hint)]
    classes = [c for c in found if inspect.isclass(c) and not dataclasses.is_dataclass(c)]
    return [c for c in classes if not issubclass(c, _SCALARS)]


def _parses_as(hint: Any, value: Any, text: str | None) -> bool:
    """Whether jsonargparse parses ``text`` (as typed) or ``value`` (from a config) as a ``hint`` option."""
    check = ArgumentParser(exit_on_error=False)
    try:
        check.add_argument("--v", type=hint)
    except Exception:  # a type jsonargparse does not take as an option's type: nothing to say
        return True
    with contextlib.suppress(Exception, SystemExit):
        check.parse_args([f"--v={text}"]) if text is not None else check.parse_object({"v": value})
        return True
    return False


def _load(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _prog(parser: Any) -> str:
    """The command as typed: not argparse's ``cblight data [options] peek``, nor ``cblight tune fit``."""
    prog = str(getattr(parser, "prog", "") or "").replace(" [options]", "")
    return prog[: -len(" fit")] if prog.startswith("cblight tune") and prog.endswith(" fit") else prog


def _usage(parser: Any) -> str:
    return " ".join([_prog(parser), *(n.upper() for n in _needed(parser, True)), "[options]"])
