"""A command line or config that does not parse, said in one line (docs/errors.md).

jsonargparse reports a bad option as a nested dump that runs to 95 lines for one misspelt key. A cblight
parser (``OneLineErrors``) records what it declares: each option's type, read from the signatures it adds
(``add_class_arguments`` and the like) and from ``add_argument``. When a parse fails, it reads the command
line and its config files again against those declarations and prints the first fault as one line, with
exit status 2: an unknown key with the closest valid one, a value with what its type accepts (in the words
of ``cblight.option_types``, as the Python checker says them), a group of options given a value, a class
that cannot be imported, a positional argument, subcommand or required option left out:

    error: unknown option --model.choice_alpha; did you mean --model.choice_alphas?
    error: model.boosting.alpha must be a finite number, got nan
    error: configs/x.yaml line 4, column 5: did not find expected ',' or ']' (while parsing a flow sequence ...)

A fault it does not find is said in jsonargparse's own first line; ``JSONARGPARSE_DEBUG=true`` gives
jsonargparse's whole report as a traceback.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import inspect
import os
import re
import sys
import typing
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any, Literal, NoReturn

import yaml
from jsonargparse import ArgumentParser

from cblight.option_types import describe
from cblight.suggest import class_named, closest, closest_keys, subclasses

__all__ = ["OneLineErrors", "Parser", "check_flow_mappings", "one_line", "run_subcommands"]

# the parser whose parse_args runs, and its command line
_PARSING: ContextVar[tuple[Any, list[str]] | None] = ContextVar("cblight_parsing", default=None)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, as jsonargparse reads a config
_NOT_KEYS = {"help", "config", "print_config"}
_SCALARS = (int, float, str, bytes, bool, list, tuple, dict, set, os.PathLike, enum.Enum)


class OneLineErrors:
    """Mixin of a jsonargparse ``ArgumentParser`` (put it first): a parse error becomes one line. It keeps
    ``declared`` (each option key and its type), ``required_params`` and ``subcommands``."""

    @property
    def declared(self) -> dict[str, Any]:
        return self.__dict__.setdefault("_declared", {})

    def _declare(
        self, owner: Any, prefix: str | None, kwargs: dict[str, Any], function: bool = False
    ) -> None:
        method = not function and not inspect.isclass(owner)
        for name, (hint, required) in _params(owner, method).items():
            if name in (kwargs.get("skip") or ()):
                continue
            self.declared[f"{prefix}.{name}" if prefix else name] = hint
            if required and function:
                self.__dict__.setdefault("required_params", {})[name] = kwargs.get("as_positional", False)

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

    def add_function_arguments(
        self, fn: Any, nested_key: str | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        self._declare(fn, nested_key, kwargs, function=True)
        return super().add_function_arguments(fn, nested_key, *args, **kwargs)  # type: ignore[misc]

    def add_method_arguments(
        self, cls: Any, method: str, nested_key: str | None = None, *a: Any, **k: Any
    ) -> Any:
        self._declare(getattr(cls, method), nested_key, k)
        return super().add_method_arguments(cls, method, nested_key, *a, **k)  # type: ignore[misc]

    def add_subcommands(self, *args: Any, **kwargs: Any) -> Any:
        self.subcommands = super().add_subcommands(*args, **kwargs)  # type: ignore[misc]
        return self.subcommands

    def parse_args(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        argv = list(map(str, sys.argv[1:] if args is None else args))
        said = check_flow_mappings(argv) or _config_shape(argv)
        if said:
            _refuse(said)
        token = _PARSING.set((self, argv))
        try:
            return super().parse_args(args, *rest, **kwargs)  # type: ignore[misc]
        finally:
            _PARSING.reset(token)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        # jsonargparse's inner parsers raise (the outer one reports), and its debug mode wants the traceback
        if os.environ.get("JSONARGPARSE_DEBUG", "").lower() == "true" or not self.exit_on_error:  # type: ignore[attr-defined]
            super().error(message, ex)  # type: ignore[misc]
        parser, argv = _PARSING.get() or (self, [])
        _refuse(one_line(message, parser, argv))


def _refuse(line: str) -> NoReturn:
    print(f"error: {line}", file=sys.stderr)
    raise SystemExit(2)


class Parser(OneLineErrors, ArgumentParser):
    """jsonargparse's ``ArgumentParser`` with one-line errors (``auto_cli(..., parser_class=Parser)``)."""


def run_subcommands(
    commands: dict[str, Any], argv: list[str] | None, prog: str | None, description: str
) -> int:
    """A command of subcommands (``cblight data list|peek``): each a function whose docstring and signature
    jsonargparse turns into its options, returning the text to print. Returns the exit status: 0, or 2 for
    a parse error or bad input (one line)."""
    from jsonargparse import auto_cli

    from cblight.errors import exit_on_bad_input

    def run() -> Any:
        return auto_cli(commands, args=argv, prog=prog, description=description, parser_class=Parser)

    try:
        print(exit_on_bad_input(run))
    except SystemExit as stop:  # --help (0), a parse error or bad input (2)
        return stop.code if isinstance(stop.code, int) else 0
    return 0


# -- checks of the command line before it is parsed ------------------------------------------------------------
_FLOW_KEY_WITHOUT_SPACE = re.compile(r"([{,]\s*[A-Za-z_][\w.-]*):(?=[^\s,}])")


def check_flow_mappings(args: Sequence[str]) -> str | None:
    """A mapping option written ``{rte:/path}`` is YAML's ``{"rte:/path": null}``, which parses: what YAML
    wants instead, or None."""
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        if value.lstrip().startswith("{") and _FLOW_KEY_WITHOUT_SPACE.search(value):
            option = (
                args[i - 1] if i and value is arg and args[i - 1].startswith("--") else arg.split("=", 1)[0]
            )
            fixed = _FLOW_KEY_WITHOUT_SPACE.sub(r"\1: ", value)
            return f"{option} {value!r}: in a YAML mapping each key needs a space after its colon; write {fixed!r}"
    return None


def _config_paths(args: Sequence[str]) -> list[str]:
    """The files of ``-c``/``--config`` options on a command line."""
    paths = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg in ("-c", "--config")]
    return paths + [arg.split("=", 1)[1] for arg in args if arg.startswith(("--config=", "-c="))]


def _config_shape(args: Sequence[str]) -> str | None:
    """A config file holds a mapping of options (``model: {...}``): a list or a lone value is refused naming
    the file. A file YAML cannot read is left to the parse, which names the line."""
    for path in _config_paths(args):
        try:
            with open(path, encoding="utf-8") as handle:
                content = yaml.load(handle, Loader=_LOADER)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if content is None:
            return f"{path}: the config file is empty; it must be a mapping of options (key: value)"
        if not isinstance(content, dict):
            got = {list: "a list", str: "a string", bool: "true or false"}.get(type(content), "a number")
            return f"{path}: the config file must be a mapping of options (key: value), got {got}"
    return None


# -- the input read against the declarations -------------------------------------------------------------------
def one_line(message: str, parser: Any, argv: Sequence[str]) -> str:
    """The first fault of ``argv`` (parsed by ``parser``), else jsonargparse's ``message``, as one line."""
    try:
        said = _first_fault(parser, list(argv))
    except Exception:  # a declaration this reading does not follow: jsonargparse's own words
        if os.environ.get("CBLIGHT_DEBUG_PARSE"):
            raise
        said = None
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()] or [message]
    return said or (" ".join(lines[:2]) if lines[0].endswith(":") else lines[0])


def _first_fault(parser: Any, argv: list[str]) -> str | None:
    given: set[str] = set()
    positionals = [n for n, positional in getattr(parser, "required_params", {}).items() if positional]
    subcommand, i = None, 0
    while i < len(argv):
        token, i = argv[i], i + 1
        name, eq, text = token.lstrip("-").partition("=")
        if not token.startswith("-") or re.fullmatch(r"-[\d.]+", token):  # an argument, not an option
            if getattr(parser, "subcommands", None) is not None and subcommand is None:
                choices = list(parser.subcommands.choices)
                if token not in choices:
                    close = closest(token, choices)
                    mean = f"; did you mean {close!r}?" if close else ""
                    return f"unknown subcommand {token!r}{mean} (choose from {', '.join(choices)})"
                subcommand, parser = token, parser.subcommands.choices[token]
                positionals = [
                    n for n, positional in getattr(parser, "required_params", {}).items() if positional
                ]
            elif positionals:
                given.add(positionals.pop(0))
            else:
                return f"unexpected argument {token!r}: options are written --name value ({_prog(parser)} --help lists them)"
            continue
        if not eq and i < len(argv) and not argv[i].startswith("--") and argv[i] != "-c":
            text, i = argv[i], i + 1
        if name in ("c", "config"):
            said = _config_fault(parser, text, given)
        elif name in ("h", "help") or name.endswith(".help") or name.startswith("no_"):
            continue
        elif getattr(parser, "required_params", {}).get(name):
            return _positional(parser, name, name)
        else:
            said = _check(parser, name, _load(text), True, text, given)
        if said:
            return said
    if getattr(parser, "subcommands", None) is not None and subcommand is None:
        return f"a subcommand is needed: {' or '.join(parser.subcommands.choices)} ({_prog(parser)} --help lists them)"
    for name, positional in getattr(parser, "required_params", {}).items():
        if name not in given and positional:
            return f"{_prog(parser)} needs its argument {name.upper()}: usage: {_usage(parser)} ({_prog(parser)} --help)"
        if name not in given:
            return f"--{name} is required ({_prog(parser)} --help lists the options)"
    return None


def _config_fault(parser: Any, path: str, given: set[str]) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            content = yaml.load(handle, Loader=_LOADER)
    except OSError:
        return f"-c/--config: File does not exist: {path!r}"
    except yaml.MarkedYAMLError as bad:
        mark, start = bad.problem_mark, bad.context_mark
        line = f"{path} line {mark.line + 1}, column {mark.column + 1}: {bad.problem}"
        return line + (
            f" ({bad.context} that starts at line {start.line + 1}, column {start.column + 1})"
            if start
            else ""
        )
    for key, value in content.items():
        said = _check(parser, str(key), value, False, None, given)
        if said:
            return said
    return None


def _check(parser: Any, key: str, value: Any, typed: bool, text: str | None, given: set[str]) -> str | None:
    """The fault of option ``key`` given ``value`` (``text`` as typed), or None."""
    if (
        isinstance(value, Mapping)
        and parser.declared.get(key) is None
        and any(k.startswith(f"{key}.") for k in parser.declared)
    ):
        for name, item in value.items():  # a group of options in a config (``data: {tasks: [copa]}``)
            said = _check(parser, f"{key}.{name}", item, False, None, given)
            if said:
                return said
        return None
    parts = key.split(".")
    heads = [".".join(parts[:n]) for n in range(len(parts), 0, -1)]
    head = next((h for h in heads if parser.declared.get(h) is not None), None)  # the nearest typed one
    if head is None:
        return None if key in parser.declared else _unknown(parser, _leaf(key, value), typed, {})
    hint, path = parser.declared[head], head
    if key == head and isinstance(value, Mapping) and "class_path" not in value and _bases(hint):
        named = _class_given(parser, key)  # the options of the class given before, or of the default
        value = {"class_path": named.get("class_path") if hasattr(named, "get") else named, **value}
    for part in parts[len(head.split(".")) :]:
        children = _children(hint, _class_given(parser, path) if path == head else None)
        if children is None or part not in children:
            return _unknown(
                parser, _leaf(key, value), typed, {f"{path}.{c}": h for c, h in (children or {}).items()}
            )
        hint, path = children[part], f"{path}.{part}"
    given.add(key)
    return _value_fault(parser, key, hint, value, typed, text)


def _value_fault(parser: Any, key: str, hint: Any, value: Any, typed: bool, text: str | None) -> str | None:
    dashes = "--" if typed else ""
    bases = _bases(hint)
    children = _children(hint, value)
    if isinstance(value, Mapping) and children is not None:
        inner = value.get("init_args") if isinstance(value.get("init_args"), Mapping) else {}
        items = {**{f"init_args.{k}": v for k, v in inner.items()}, **value}
        for name, item in items.items():
            if name in ("class_path", "init_args", "dict_kwargs"):
                continue
            if name.rpartition(".")[2] not in children:
                known = {
                    f"{key}.{name.rpartition('.')[0]}.{c}".replace("..", "."): h for c, h in children.items()
                }
                return _unknown(parser, f"{key}.{name}", False, known)
            said = _value_fault(parser, f"{key}.{name}", children[name.rpartition(".")[2]], item, False, None)
            if said:
                return said
        return None
    if isinstance(value, str) and bases and not _groups(hint):
        if class_named(value, bases) is not None or _fits(hint, value, text):
            return None
        close = closest(value, [c.__name__ for c in subclasses(bases)])
        mean = f"; did you mean {close}?" if close else ""
        return f"{key}: no class {value!r} can be imported{mean} (a class name or a dotted path)"
    element = next(
        (typing.get_args(m)[0] for m in _members(hint) if _origin(m) is list and typing.get_args(m)), None
    )
    if isinstance(value, list) and element is not None:
        for n, item in enumerate(value):
            said = _value_fault(parser, f"{key}[{n}]", element, item, False, None)
            if said:
                return said
    if _fits(hint, value, text):
        return None
    if _groups(hint) and len(_members(hint)) == 1:
        return _group_given_a_value(key, _params(_groups(hint)[0]), text or str(value), dashes)
    return f"{key} must be {describe(hint)}, got {_shown(value)}"


def _leaf(key: str, value: Any) -> str:
    """The key of the first option under ``key`` in a config's mapping ``value`` (``modle: {model: ...}``)."""
    while isinstance(value, Mapping) and value:
        name = next(iter(value))
        key, value = f"{key}.{name}", value[name]
    return key


def _group_given_a_value(key: str, children: dict[str, tuple[Any, bool]], value: str, dashes: str) -> str:
    """``--model.teacher live``: the group's option that takes such a value (a Literal's value, a flag's
    true/false, else its one string option), else the group's options; or a file not read as its config."""
    if value.endswith((".yaml", ".yml", ".json", ".jsonnet")) or os.sep in value:  # meant as a file
        why = "no such file" if not os.path.exists(value) else "not a mapping of its options"
        return f"{dashes}{key}: cannot read {value!r} as a config of its options ({why})"
    names = sorted(children)
    taking = [n for n in names if _takes(children[n][0], value)] or [
        n for n in names if children[n][0] is str
    ]
    what = f"{dashes}{key} is a group of options ({', '.join(names)}), not a value"
    if 1 <= len(taking) <= 3:
        return f"{what}; did you mean {' or '.join(f'{dashes}{key}.{n} {value}' for n in taking)}?"
    return f"{what}; set one of them, e.g. {dashes}{key}.{names[0]} VALUE" if names else what


def _takes(hint: Any, value: str) -> bool:
    """Whether a Literal among ``hint``'s members holds ``value``, or it is a bool and ``value`` one."""
    if hint is bool:
        return value.lower() in ("true", "false")
    if typing.get_origin(hint) is Literal:
        return value in [str(v) for v in typing.get_args(hint)]
    return any(_takes(member, value) for member in _members(hint) if member is not hint)


def _unknown(parser: Any, key: str, typed: bool, near: dict[str, Any]) -> str:
    dashes = "--" if typed else ""
    found = closest_keys(key, _keys(parser) | set(near))
    if found and getattr(parser, "required_params", {}).get(found[0]):
        return _positional(parser, key, found[0])
    if found:
        return f"unknown option {dashes}{key}; did you mean {' or '.join(dashes + k for k in found)}?"
    return f"unknown option {dashes}{key} ({_prog(parser)} --help lists the options)"


def _positional(parser: Any, option: str, name: str) -> str:
    usage = f"usage: {_usage(parser)}"
    return f"unknown option --{option}: {name.upper()} is a positional argument, given without an option name: {usage}"


def _keys(parser: Any) -> set[str]:
    """Every option key the parser accepts, dotted: its declarations, and the options of their groups."""
    todo = [(k, h, _class_given(parser, k)) for k, h in parser.declared.items() if k not in _NOT_KEYS]
    keys: set[str] = set()
    while todo:
        key, hint, value = todo.pop()
        keys.add(key)
        todo += [(f"{key}.{c}", h, None) for c, h in (_children(hint, value) or {}).items()]
    return keys


# -- types -----------------------------------------------------------------------------------------------------
def _params(owner: Any, method: bool = False) -> dict[str, tuple[Any, bool]]:
    """``{parameter: (its type, whether it is required)}`` of a function, a ``method`` (``self`` left out)
    or a class's ``__init__``."""
    function = owner.__init__ if inspect.isclass(owner) else owner
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # an annotation that does not resolve here: untyped
        hints = {}
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    parameters = list(inspect.signature(function).parameters.values())[
        1 if method or inspect.isclass(owner) else 0 :
    ]
    return {p.name: (hints.get(p.name), p.default is p.empty) for p in parameters if p.kind not in skip}


def _children(hint: Any, value: Any) -> dict[str, Any] | None:
    """The options under a value of type ``hint``: a dataclass's fields, or the init parameters of the class
    that ``value`` names (``class_path``) among hint's subclasses; None for a type without options."""
    groups = _groups(hint)
    named = value.get("class_path") if hasattr(value, "get") else value if isinstance(value, str) else None
    cls = groups[0] if groups else class_named(named, _bases(hint)) if isinstance(named, str) else None
    return {name: h for name, (h, _) in _params(cls).items()} if cls is not None else None


def _class_given(parser: Any, key: str) -> Any:
    """The class path given for a subclass option ``key`` (``--model NAME``), else its default."""
    argv = (_PARSING.get() or (None, []))[1]
    named = [
        argv[i + 1]
        for i, arg in enumerate(argv[:-1])
        if arg == f"--{key}" and not argv[i + 1].startswith("{")
    ]
    if named or not _bases(parser.declared.get(key)):
        return named[-1] if named else None
    try:
        return parser.get_default(key)
    except KeyError:  # an option without a default
        return None


def _members(hint: Any) -> list[Any]:
    """The types a value of ``hint`` may have (a Union's members, None left out)."""
    args = typing.get_args(hint) if _origin(hint) is typing.Union else (hint,)
    return [a for a in args if a is not type(None) and a is not None]


def _origin(hint: Any) -> Any:
    origin = typing.get_origin(hint)
    return typing.Union if origin is getattr(__import__("types"), "UnionType", None) else origin


def _groups(hint: Any) -> list[type]:
    """The dataclasses among ``hint``'s members: groups of options (``--model.boosting.alpha``)."""
    return [m for m in _members(hint) if dataclasses.is_dataclass(m) and inspect.isclass(m)]


def _bases(hint: Any) -> list[type]:
    """The classes among ``hint``'s members that a class path names a subclass of (``Callable[..., C]``: C)."""
    found = [typing.get_args(m)[-1] if _origin(m) is collections.abc.Callable else m for m in _members(hint)]
    return [
        c
        for c in found
        if inspect.isclass(c) and not issubclass(c, _SCALARS) and not dataclasses.is_dataclass(c)
    ]


def _fits(hint: Any, value: Any, text: str | None) -> bool:
    """Whether jsonargparse accepts ``value`` (``text`` as typed) for an option of type ``hint``."""
    check = ArgumentParser(exit_on_error=False)
    try:
        check.add_argument("--v", type=hint)
    except Exception:  # a type jsonargparse does not take as an option's type: nothing to say
        return True
    try:
        check.parse_args([f"--v={text}"]) if text is not None else check.parse_object({"v": value})
    except (Exception, SystemExit):
        return False
    return True


def _load(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _shown(value: Any) -> str:
    """A value as the checker shows it: a repr, with nan and inf as numbers (YAML 1.1 reads them as text)."""
    if isinstance(value, str) and value.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
        return repr(float(value))
    return repr(value)


def _prog(parser: Any) -> str:
    """The command as typed: ``cblight data peek`` (argparse's subcommand prog says ``cblight data [options]
    peek``; ``cblight tune`` runs LightningCLI's ``fit`` without the word)."""
    prog = str(getattr(parser, "prog", "") or "").replace(" [options]", "")
    return prog[: -len(" fit")] if prog.startswith("cblight tune") and prog.endswith(" fit") else prog


def _usage(parser: Any) -> str:
    """One line: the command, its positional arguments, ``[options]``."""
    positional = [n.upper() for n, positional in getattr(parser, "required_params", {}).items() if positional]
    return " ".join([_prog(parser), *positional, "[options]"])
