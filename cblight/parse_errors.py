"""A command line that does not parse, said in one line (every case: docs/errors.md): jsonargparse's own report,
passed to the parser's ``error``, names the key at fault; its innermost fault becomes one line that names the
option, what its declared type (as the parser keeps it) accepts (``cblight.option_types.describe``) and the fix."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import typing
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

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, as jsonargparse reads a config


class OneLineErrors:
    """Mixin of a jsonargparse ``ArgumentParser`` (put it first): a parse error becomes one line. It keeps
    ``declared`` (option key: type), ``positionals`` (the names of its positional arguments) and
    ``subcommands`` as it declares them: jsonargparse keeps them only in private attributes."""

    _config_path: str | None = None
    subcommands: Any = None

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
        self.declare(options_of(cls), nested_key)
        return super().add_class_arguments(cls, nested_key, *args, **kwargs)  # type: ignore[misc]

    def add_function_arguments(
        self, fn: Any, nested_key: str | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        self.declare(options_of(fn, function=True), nested_key)
        return super().add_function_arguments(fn, nested_key, *args, **kwargs)  # type: ignore[misc]

    def add_subclass_arguments(self, base: Any, nested_key: str, *args: Any, **kwargs: Any) -> Any:
        action = super().add_subclass_arguments(base, nested_key, *args, **kwargs)  # type: ignore[misc]
        self.declare({nested_key: typing.Union[base] if isinstance(base, tuple) else base}, None)  # noqa: UP007
        return action

    def add_subcommands(self, *args: Any, **kwargs: Any) -> Any:
        self.subcommands = super().add_subcommands(*args, **kwargs)  # type: ignore[misc]
        return self.subcommands

    def declare(self, options: dict[str, Any], prefix: str | None) -> None:
        """Keep the types of ``options`` (name: type), declared under ``prefix``."""
        for name, hint in options.items():
            vars(self).setdefault("declared", {})[f"{prefix}.{name}" if prefix else name] = hint

    def parse_path(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        # as typed: jsonargparse passes its base name on, from the file's folder
        self._config_path = str(path)
        try:
            return super().parse_path(path, *args, **kwargs)  # type: ignore[misc]
        finally:
            self._config_path = None

    def parse_string(self, content: str, *args: Any, **kwargs: Any) -> Any:
        path, self._config_path = self._config_path, None
        if path is not None:  # a config file's one read, jsonargparse's: what is wrong with it said first
            self.check_config(path, config_options(path, content))
        return super().parse_string(content, *args, **kwargs)  # type: ignore[misc]

    def check_config(self, path: str, config: dict[str, Any]) -> None:
        """Checks of a config file's options ``config`` before they are parsed; none here, a command's parser
        adds its own (``cblight.cli.CLIParser``)."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        # jsonargparse's inner parsers raise (the outer one reports), and its debug mode wants the traceback
        if os.environ.get("JSONARGPARSE_DEBUG", "").lower() == "true" or not self.exit_on_error:  # type: ignore[attr-defined]
            super().error(message, ex)  # type: ignore[misc]
        _refuse(one_line(getattr(ex, "subcommand_parser", None) or self, message))


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
    prog, sub = _prog(parser), getattr(parser, "subcommands", None)
    first = message.strip().splitlines()[0] if message.strip() else message
    if m := re.match(r'Parser key "config": (File does not exist: .*)', first):
        return f"-c/--config: {m[1]}"
    if m := re.match(r"unrecognized arguments: (\S+)", first):
        if not m[1].startswith("-"):
            return (
                f"unexpected argument {m[1]!r}: options are written --name value ({prog} --help lists them)"
            )
        return _unknown(parser, m[1].partition("=")[0].lstrip("-"), "--")
    if m := re.match(r"Option '(.+)' is not accepted|Group '(.+)' does not accept option '(.+)'", first):
        return _unknown(parser, m[1] or f"{m[2]}.{m[3]}")
    if m := re.match(r"Subcommand '(.+)' does not accept option '(.+)'", first):
        return _unknown(sub.choices[m[1]] if sub else parser, m[2])
    if m := re.match(r"argument \S+: invalid choice: '(.*)' \(choose from (.*)\)", first):
        choices = re.findall(r"'([^']*)'", m[2])
        mean = f"; did you mean {closest(m[1], choices)!r}?" if closest(m[1], choices) else ""
        return f"unknown subcommand {m[1]!r}{mean} (choose from {', '.join(choices)})"
    if m := re.match(r'expected "\w+" to be one of \{(.*)\}', first):
        return f"a subcommand is needed: {' or '.join(m[1].split(','))} ({prog} --help lists them)"
    if m := re.match(r"the following arguments are required: ([^,\s]+)", first):
        command, _, name = m[1].rpartition(".")
        if command and sub is not None and command in sub.choices:
            return one_line(sub.choices[command], f"the following arguments are required: {name}")
        if name in _positionals(parser):
            return f"{prog} needs its argument {name.upper()}: usage: {_usage(parser)} ({prog} --help)"
        return f"--{m[1]} is required ({prog} --help lists the options)"
    lines = [(len(line) - len(line.lstrip(" -")), line.strip(" -")) for line in message.splitlines()]
    if first.startswith("Parser key") and (said := _fault(parser, message, [x for x in lines if x[1]], "")):
        return said
    return " ".join(line for _, line in lines[:2] if line) if first.endswith(":") else first


def _fault(
    parser: Any, whole: str, lines: list[tuple[int, str]], key: str, hint: Any = None, values: Any = None
) -> str | None:
    """The innermost fault of jsonargparse's report ``whole``, of which ``lines`` (indent, text) are under the
    option ``key`` of type ``hint``; ``values``: the mapping ``key`` was given, whose entries a fault inside
    one of them may not repeat."""
    for i, (indent, text) in enumerate(lines):
        end = next((j for j in range(i + 1, len(lines)) if lines[j][0] <= indent), len(lines))
        inner = lines[i + 1 : end]
        if m := re.match(r'Parser key "([^"]+)":\s*(.*)', text):
            full = f"{key}.{m[1]}" if key else m[1]
            typed = _type_of(parser, full) if hint is None else option_at(hint, m[1])
            given = [_load(t[13:]) for d, t in inner if d == indent + 2 and t.startswith("Given value: ")]
            child = next((b[1] for _, t in inner if (b := re.match(r'Parser key "([^".]+)', t))), None)
            items = given[0] if given and isinstance(given[0], list) else []
            n = next((n for n, item in enumerate(items) if isinstance(item, dict) and child in item), None)
            # a fault in one item of a list names no value: the list is the entry of the enclosing mapping
            own = given[0] if given else values.get(m[1]) if isinstance(values, dict) else None
            sub = full if n is None else f"{full}[{n}]"  # the item of a list at fault
            if said := _fault(parser, whole, inner, sub, typed, own) or _value_fault(
                full, typed, m[2], inner, own
            ):
                return said
        elif m := re.match(r"Problem with given class_path '(.+)':", text):
            if said := _fault(parser, whole, inner, key, class_named(m[1], []), values):
                return said
        elif m := re.search(r"Option '(.+)' is not accepted(?:. Got value: .*class_path='([^']+)')?", text):
            within = f"{key}.init_args" if "'init_args'" in whole or m[2] else key
            dashes = "--" if f"NestedArg(key='{m[1]}'" in whole else ""
            return _unknown(
                parser, f"{within}.{m[1]}", dashes, class_named(m[2], []) if m[2] else hint, within
            )
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
    for text in [inline, *texts]:
        if m := re.search(r"Unable to load config ['\"](.*)['\"]", text):
            return _group_value(key, hint, m[1])
    given = next((t[len("Given value: ") :] for t in texts if t.startswith("Given value:")), None)
    found = (
        re.search(r"Got value: (.*)|^Not of type \w+: (?:.*?: )?(.+?)(?: is not .*)?$", t) for t in texts
    )
    got = [m[1] or m[2] for m in found if m]
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
    children, loaded = options_of(hint), _load(value)
    names = sorted(children)
    choices = {n: typing.get_args(h) for n, h in children.items() if typing.get_origin(h) is typing.Literal}
    taking = [n for n in names if loaded in choices.get(n, ())]
    taking += [n for n in names if children[n] is bool and isinstance(loaded, bool)]
    what = f"{key} is a group of options ({', '.join(names)}), not a value"
    if taking:
        return f"{what}; did you mean {' or '.join(f'{key}.{n} {value}' for n in taking)}?"
    return f"{what}; set one of them, e.g. {key}.{names[0]} VALUE" if names else what


def _unknown(parser: Any, key: str, dashes: str = "", hint: Any = None, prefix: str = "") -> str:
    """An unknown option ``key`` (typed with ``dashes``), with the closest of ``parser``'s options (and of
    those under ``prefix``, of type ``hint``)."""
    positionals, keys = _positionals(parser), option_keys(prefix, hint) if hint is not None else set()
    for name, declared in _declared(parser).items():
        default = None
        with contextlib.suppress(KeyError):  # a class path's default class has the options
            default = parser.get_default(name) if bases(declared) else None
        named = class_named(default.get("class_path", ""), []) if hasattr(default, "get") else None
        keys |= {name} | option_keys(name, named or declared)
    found = key if key in positionals else next(iter(closest_keys(key, keys)), None)
    if found in positionals:
        return (
            f"unknown option --{key}: {found.upper()} is a positional argument, given without an option name: "
            f"usage: {_usage(parser)}"
        )
    if found:
        return f"unknown option {dashes}{key}; did you mean {dashes}{found}?"
    return f"unknown option {dashes}{key} ({_prog(parser)} --help lists the options)"


def _declared(parser: Any) -> dict[str, Any]:
    """``parser``'s options (no help, config or subcommands) and the type of each as it declared them."""
    skip = ("help", "config", "print_config")
    return {
        k: v for k, v in vars(parser).get("declared", {}).items() if k not in skip and not k.endswith(".help")
    }


def _type_of(parser: Any, key: str) -> Any:
    """The declared type of ``key``: its own declaration, else its field in the nearest declared group."""
    declared, parts = _declared(parser), key.split(".")
    for n in range(len(parts), 0, -1):
        if (hint := declared.get(".".join(parts[:n]))) is not None:
            return option_at(hint, ".".join(parts[n:])) if n < len(parts) else hint
    return None


def _positionals(parser: Any) -> list[str]:
    return vars(parser).get("positionals", [])


def _prog(parser: Any) -> str:
    return str(getattr(parser, "prog", "")).replace(" [options]", "").removesuffix(" fit")


def _usage(parser: Any) -> str:
    return " ".join([_prog(parser), *(n.upper() for n in _positionals(parser)), "[options]"])


def _load(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text
