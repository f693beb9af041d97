"""A command line that does not parse, said in one line (every case: docs/errors.md): jsonargparse's own report,
passed to the parser's ``error``, names the key at fault; its innermost fault becomes one line that names the
option, what its declared type accepts (``cblight.option_types.describe``) and the fix."""

from __future__ import annotations

import inspect
import os
import re
import sys
import typing
from contextvars import ContextVar
from typing import Any, NoReturn

import yaml
from jsonargparse import ArgumentParser

from cblight.option_types import (
    FiniteFloat,
    bases,
    describe,
    item_type,
    members,
    option_at,
    option_keys,
    options_of,
)
from cblight.suggest import class_named, closest, closest_keys, subclasses

__all__ = ["OneLineErrors", "Parser", "config_options"]

_FILE: ContextVar[str | None] = ContextVar("cblight_config_file", default=None)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, as jsonargparse reads a config


class OneLineErrors:
    """Mixin of a jsonargparse ``ArgumentParser`` (put it first): a parse error becomes one line. It keeps
    ``declared`` (option key: type) and ``positionals`` (the names of its positional arguments)."""

    def add_argument(self, *args: Any, **kwargs: Any) -> Any:
        action = super().add_argument(*args, **kwargs)  # type: ignore[misc]
        # jsonargparse gives a parser's argument groups this method too: the parser keeps the declaration
        owner = vars(getattr(self, "parser", self))
        if kwargs.get("type") is not None or action.dest not in owner.setdefault("declared", {}):
            owner["declared"][action.dest] = kwargs.get("type")
        if args and not str(args[0]).startswith("-"):
            owner.setdefault("positionals", []).append(action.dest.rpartition(".")[2])
        return action

    def add_class_arguments(self, cls: Any, nested_key: str | None = None, *args: Any, **kwargs: Any) -> Any:
        self.declare(cls, nested_key)
        return super().add_class_arguments(cls, nested_key, *args, **kwargs)  # type: ignore[misc]

    def add_function_arguments(
        self, fn: Any, nested_key: str | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        self.declare(fn, nested_key)
        return super().add_function_arguments(fn, nested_key, *args, **kwargs)  # type: ignore[misc]

    def declare(self, owner: Any, prefix: str | None) -> None:
        """Keep the types of the options ``owner``'s signature declares (under ``prefix``)."""
        for name, hint in options_of(owner, function=not inspect.isclass(owner)).items():
            vars(self).setdefault("declared", {})[f"{prefix}.{name}" if prefix else name] = hint

    def add_subclass_arguments(self, base: Any, nested_key: str, *args: Any, **kwargs: Any) -> Any:
        action = super().add_subclass_arguments(base, nested_key, *args, **kwargs)  # type: ignore[misc]
        union = typing.Union[base] if isinstance(base, tuple) else base  # noqa: UP007
        vars(self).setdefault("declared", {})[nested_key] = union
        return action

    def add_subcommands(self, *args: Any, **kwargs: Any) -> Any:
        self.subcommands = super().add_subcommands(*args, **kwargs)  # type: ignore[misc]
        return self.subcommands

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
                self.check_config(path, config_options(path, args[0] if args else kwargs.get("content")))
            return super().parse_string(*args, **kwargs)  # type: ignore[misc]
        finally:
            _FILE.reset(token)

    def check_config(self, path: str, config: dict[str, Any]) -> None:
        """Checks of a config file's options ``config`` before they are parsed; none here, a command's parser
        adds its own (``cblight.cli.CLIParser``)."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        # jsonargparse's inner parsers raise (the outer one reports), and its debug mode wants the traceback
        if os.environ.get("JSONARGPARSE_DEBUG", "").lower() == "true" or not self.exit_on_error:  # type: ignore[attr-defined]
            super().error(message, ex)  # type: ignore[misc]
        parser = getattr(ex, "subcommand_parser", None) or self
        _refuse(one_line(parser, message))


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


def one_line(parser: Any, message: str) -> str:
    """jsonargparse's ``message`` for a failed parse by ``parser``, as one line naming the option and the fix."""
    prog = str(getattr(parser, "prog", "")).replace(" [options]", "").removesuffix(" fit")
    positionals = getattr(parser, "positionals", [])
    usage = " ".join([prog, *(n.upper() for n in positionals), "[options]"])
    first = message.strip().splitlines()[0] if message.strip() else message
    if m := re.match(r'Parser key "config": (File does not exist: .*)', first):
        return f"-c/--config: {m[1]}"
    if m := re.match(r"unrecognized arguments: (\S+)", first):
        if not m[1].startswith("-"):
            return (
                f"unexpected argument {m[1]!r}: options are written --name value ({prog} --help lists them)"
            )
        return _unknown(parser, None, m[1].partition("=")[0].lstrip("-"), "--", prog, usage)
    if m := re.match(r"Option '(.+)' is not accepted|Group '(.+)' does not accept option '(.+)'", first):
        return _unknown(parser, None, m[1] or f"{m[2]}.{m[3]}", "", prog, usage)
    if m := re.match(r"Subcommand '(.+)' does not accept option '(.+)'", first):
        sub = getattr(parser, "subcommands", None)
        return _unknown(sub.choices[m[1]] if sub else parser, None, m[2], "", prog, usage)
    if m := re.match(r"argument \S+: invalid choice: '(.*)' \(choose from (.*)\)", first):
        choices = re.findall(r"'([^']*)'", m[2])
        mean = f"; did you mean {closest(m[1], choices)!r}?" if closest(m[1], choices) else ""
        return f"unknown subcommand {m[1]!r}{mean} (choose from {', '.join(choices)})"
    if m := re.match(r'expected "\w+" to be one of \{(.*)\}', first):
        return f"a subcommand is needed: {' or '.join(m[1].split(','))} ({prog} --help lists them)"
    if m := re.match(r"the following arguments are required: ([^,\s]+)", first):
        command, _, name = m[1].rpartition(".")
        sub = getattr(parser, "subcommands", None)
        if command and sub is not None and command in sub.choices:
            return one_line(sub.choices[command], f"the following arguments are required: {name}")
        if name in positionals:
            return f"{prog} needs its argument {name.upper()}: usage: {usage} ({prog} --help)"
        return f"--{m[1]} is required ({prog} --help lists the options)"
    lines = [(len(line) - len(line.lstrip(" -")), line.strip(" -")) for line in message.splitlines()]
    said = (
        _fault(parser, [x for x in lines if x[1]], "", None, prog, usage, message)
        if first.startswith("Parser key")
        else None
    )
    return said or " ".join(line for _, line in lines[:2] if line) if first.endswith(":") else said or first


def _fault(
    parser: Any,
    lines: list[tuple[int, str]],
    key: str,
    hint: Any,
    prog: str,
    usage: str,
    whole: str,
    values: Any = None,
) -> str | None:
    """The innermost fault of jsonargparse's report ``lines`` (indent, text) under the option ``key``;
    ``values``: the mapping ``key`` was given, whose entries a fault inside one of them may not repeat."""
    for i, (indent, text) in enumerate(lines):
        inner = []
        for deeper in lines[i + 1 :]:
            if deeper[0] <= indent:
                break
            inner.append(deeper)
        if m := re.match(r'Parser key "([^"]+)":\s*(.*)', text):
            full = f"{key}.{m[1]}" if key else m[1]
            typed = _declared(parser, full) if hint is None else option_at(hint, m[1])
            given = [_load(t[13:]) for d, t in inner if d == indent + 2 and t.startswith("Given value: ")]
            below = [re.match(r'Parser key "([^".]+)', t) for _, t in inner]
            child = next((b[1] for b in below if b), None)
            items = given[0] if given and isinstance(given[0], list) else []
            n = next((n for n, item in enumerate(items) if isinstance(item, dict) and child in item), None)
            sub = full if n is None else f"{full}[{n}]"  # the item of a list at fault
            # a fault in one item of a list names no value: the list is the entry of the enclosing mapping
            own = given[0] if given else values.get(m[1]) if isinstance(values, dict) else None
            said = _fault(parser, inner, sub, typed, prog, usage, whole, own) or _value_fault(
                full, typed, m[2], inner, own
            )
            if said:
                return said
        elif m := re.match(r"Problem with given class_path '(.+)':", text):
            said = _fault(parser, inner, key, class_named(m[1], []), prog, usage, whole, values)
            if said:
                return said
        elif m := re.search(r"Option '(.+)' is not accepted(?:. Got value: .*class_path='([^']+)')?", text):
            within = ".init_args" if "'init_args'" in whole or m[2] else ""
            hint = class_named(m[2], []) if m[2] else hint
            dashes = "--" if f"NestedArg(key='{m[1]}'" in whole else ""
            return _unknown(parser, hint, f"{key}{within}.{m[1]}", dashes, prog, usage, f"{key}{within}")
        elif m := re.match(r"Expected a dot import path string: (.*)", text):
            close = closest(m[1], [c.__name__ for c in subclasses(bases(hint))])
            mean = f"; did you mean {close}?" if close else ""
            return f"{key}: no class {m[1]!r} can be imported{mean} (a class name or a dotted path)"
    return None


def _value_fault(
    key: str, hint: Any, inline: str, inner: list[tuple[int, str]], own: Any = None
) -> str | None:
    """``key`` given a value its type ``hint`` refuses: said with what the type accepts, and the value
    (``own``: the value as the enclosing mapping gave it, where jsonargparse names only the item at fault)."""
    texts = [t for _, t in inner]
    given = next((t[len("Given value: ") :] for t in texts if t.startswith("Given value:")), None)
    found = (
        re.search(r"Got value: (.*)|^Not of type \w+: (?:.*?: )?(.+?)(?: is not .*)?$", t) for t in texts
    )
    got = [m[1] or m[2] for m in found if m]
    if "Unable to load config" in inline or any("Unable to load config" in t for t in texts):
        return _group_value(
            key, hint, re.search(r"Unable to load config ['\"](.*)['\"]", inline or texts[0])[1]
        )
    if given is None and not got:
        return None
    value = _load(given if given is not None else got[-1] or "")
    value = _load(value) if given is None and isinstance(value, str) else value  # a repr: '0' is 0
    if given is None and isinstance(own, list) and not isinstance(value, list):
        value = own  # the list it is an item of, to name the item
    if isinstance(value, list):  # the item at fault, with the type of the list's items
        for n, item in enumerate(value):
            if any(str(item) == g or repr(item) == g for g in got):
                items = [item_type(m) for m in members(hint) if item_type(m) is not m]
                key, value, hint = f"{key}[{n}]", item, items[0] if items else hint
                break
    if value is None and given == "":  # ``--model.adaptive ""``: YAML reads it as null
        none = type(None) in typing.get_args(hint)
        what = "leave the option out, or write null" if none else "leave the option out for its default"
        return f"{key} must be {describe(hint)}, got an empty value ({what})"
    special = isinstance(value, float | str) and str(value).lower().lstrip("+-.") in ("nan", "inf")
    shown = repr(float(str(value).replace(".", "", 1))) if special else repr(value)
    finite = special and hint is float  # jsonargparse reads no such float from text
    return f"{key} must be {describe(FiniteFloat if finite else hint)}, got {shown}"


def _group_value(key: str, hint: Any, value: str) -> str:
    """A group of options (a dataclass) given a value: its options named, and those that take the value."""
    if value.endswith((".yaml", ".yml", ".json", ".jsonnet")) or os.sep in value:  # meant as a file
        why = "no such file" if not os.path.exists(value) else "not a mapping of its options"
        return f"{key}: cannot read {value!r} as a config of its options ({why})"
    children = options_of(hint)
    names = sorted(children)
    taking = [
        n
        for n in names
        if typing.get_origin(children[n]) is typing.Literal and _load(value) in typing.get_args(children[n])
    ]
    taking += [n for n in names if children[n] is bool and isinstance(_load(value), bool)]
    what = f"{key} is a group of options ({', '.join(names)}), not a value"
    if taking:
        return f"{what}; did you mean {' or '.join(f'{key}.{n} {value}' for n in taking)}?"
    return f"{what}; set one of them, e.g. {key}.{names[0]} VALUE" if names else what


def _unknown(parser: Any, hint: Any, key: str, dashes: str, prog: str, usage: str, prefix: str = "") -> str:
    if key in getattr(parser, "positionals", []):
        return f"unknown option --{key}: {key.upper()} is a positional argument, given without an option name: usage: {usage}"
    keys = option_keys(prefix, hint) if hint is not None else set()
    for name, declared in getattr(parser, "declared", {}).items():
        if name not in ("help", "config", "print_config") and not name.endswith(".help"):
            try:  # a class path's default class has the options
                default = parser.get_default(name) if bases(declared) else None
            except KeyError:
                default = None
            named = class_named(default.get("class_path", ""), []) if hasattr(default, "get") else None
            keys |= {name} | option_keys(name, named or declared)
    found = closest_keys(key, keys)
    if found and found[0] in getattr(parser, "positionals", []):
        return _unknown(parser, None, found[0], dashes, prog, usage).replace(f"--{found[0]}:", f"--{key}:")
    if found:
        return f"unknown option {dashes}{key}; did you mean {dashes}{found[0]}?"
    return f"unknown option {dashes}{key} ({prog} --help lists the options)"


def _declared(parser: Any, key: str) -> Any:
    """The declared type of ``key``: its own declaration, else its field in the nearest declared group."""
    declared, parts = getattr(parser, "declared", {}), key.split(".")
    for n in range(len(parts), 0, -1):
        if declared.get(".".join(parts[:n])) is not None:
            hint = declared[".".join(parts[:n])]
            return option_at(hint, ".".join(parts[n:])) if n < len(parts) else hint
    return None


def _load(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text
