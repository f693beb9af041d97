"""A command line or config that does not parse, said in one line (docs/errors.md).

jsonargparse reports a bad option as a nested dump (the Union subtypes it tried, the class paths, the value
given) that runs to 95 lines for one misspelt key. ``OneLineErrors`` is the ``error`` of every cblight
parser (LightningCLI's, through ``cblight.cli``; ``auto_cli``'s and the demo's, through ``Parser``): it reads
that report and prints one line naming the key and the fix, then exits with status 2:

    error: unknown option --model.choice_alpha; did you mean --model.choice_alphas?
    error: model.dtype: 'float64' is not one of 'auto', 'float32', 'bfloat16', 'float16'
    error: configs/x.yaml line 4, column 5: did not find expected ',' or ']' (while parsing a flow sequence ...)

The closest valid key comes from ``cblight.suggest`` (difflib over the keys the parser, or the class named
by the value's ``class_path``, accepts). ``JSONARGPARSE_DEBUG=true`` gives jsonargparse's whole report as a
traceback.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, get_args, get_origin

import yaml
from jsonargparse import ArgumentParser

from cblight.suggest import class_keys, closest, closest_keys, parser_keys, subclass_names

__all__ = ["OneLineErrors", "Parser", "check_flow_mappings", "one_line"]

# the config file being read, for a YAML error's file name (jsonargparse parses its text as "<unicode string>")
_CONFIG_FILE: ContextVar[str | None] = ContextVar("cblight_config_file", default=None)
# the command line being parsed: whether a key was typed as --a.b or written in a config
_ARGV: ContextVar[tuple[str, ...]] = ContextVar("cblight_argv", default=())
_NON_FINITE = {"nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"}
# lines of a report that describe the value or the type tried, not a fault
_CONTEXT_LINES = ("Subtypes:", "Errors:", "Given value", "Subclass types expect")
_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "list": "a list",
    "dict": "a mapping",
    "NoneType": "null",
}


class OneLineErrors:
    """Mixin of a jsonargparse ``ArgumentParser`` (put it first): a parse error becomes one line."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        # jsonargparse's inner parsers raise (the outer one reports), and its debug mode wants the traceback
        debug = os.environ.get("JSONARGPARSE_DEBUG", "").lower() == "true"
        if debug or not self.exit_on_error:  # type: ignore[attr-defined]
            super().error(message, ex)  # type: ignore[misc]
        parser = getattr(ex, "subcommand_parser", None) or self
        said = _cause(ex, "one_line")
        print(
            f"error: {said.one_line if said is not None else one_line(message, parser, ex)}", file=sys.stderr
        )
        raise SystemExit(2)

    def parse_args(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        token = _ARGV.set(tuple(map(str, sys.argv[1:] if args is None else args)))
        try:
            return super().parse_args(args, *rest, **kwargs)  # type: ignore[misc]
        finally:
            _ARGV.reset(token)

    def parse_path(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        token = _CONFIG_FILE.set(str(path))
        try:
            check_config_shape(path)
            return super().parse_path(path, *args, **kwargs)  # type: ignore[misc]
        finally:
            _CONFIG_FILE.reset(token)


class ConfigShapeError(TypeError):
    """A config file that is not a mapping of options; ``one_line`` is what the command prints."""

    def __init__(self, one_line: str):
        super().__init__(one_line)
        self.one_line = one_line


_SHAPES = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "true or false"}


def check_config_shape(path: Any) -> None:
    """A config file holds a mapping of options (``model: {...}``); a list or a lone value is refused naming
    the file (jsonargparse says ``Unexpected config: <the text>``). A file YAML cannot read is left to the
    parser, which names the line."""
    try:
        with open(path, encoding="utf-8") as handle:
            content = yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return
    if content is None:
        raise ConfigShapeError(
            f"{path}: the config file is empty; it must be a mapping of options (key: value)"
        )
    if not isinstance(content, dict):
        got = _SHAPES.get(type(content), type(content).__name__)
        raise ConfigShapeError(
            f"{path}: the config file must be a mapping of options (key: value), got {got}"
        )


class Parser(OneLineErrors, ArgumentParser):
    """jsonargparse's ``ArgumentParser`` with one-line errors (``auto_cli(..., parser_class=Parser)``)."""


_UNLOADABLE = re.compile(r"Unable to load config ['\"](.*)['\"]$")
_FLOW_KEY_WITHOUT_SPACE = re.compile(r"[{,]\s*[A-Za-z_][\w.-]*:(?=[^\s,}])")


def check_flow_mappings(args: Sequence[str]) -> None:
    """A mapping option written ``{rte:/path}`` is YAML's ``{"rte:/path": null}``, which parses: say what YAML
    wants, as a parse error (one line, exit status 2), before jsonargparse reads it."""
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        if value.lstrip().startswith("{") and _FLOW_KEY_WITHOUT_SPACE.search(value):
            option = (
                args[i - 1] if i and value is arg and args[i - 1].startswith("--") else arg.split("=", 1)[0]
            )
            fixed = re.sub(r"([{,]\s*[A-Za-z_][\w.-]*):(?=[^\s,}])", r"\1: ", value)
            print(
                f"error: {option} {value!r}: in a YAML mapping each key needs a space after its colon; "
                f"write {fixed!r}",
                file=sys.stderr,
            )
            raise SystemExit(2)


def one_line(message: str, parser: Any = None, ex: BaseException | None = None) -> str:
    """jsonargparse's error ``message`` (raised by ``parser``, caused by ``ex``) as one line."""
    try:
        line = _explain(message, parser, ex)
    except Exception:  # a report of a shape not met before: all of it, on one line, rather than a traceback
        line = None
    return line or " ".join(message.split())


# ---------------------------------------------------------------------------------------------------------
# What the report says


def _explain(message: str, parser: Any, ex: BaseException | None) -> str | None:
    text = message.strip()
    hint = _help_hint(parser)
    if text.startswith("Problems parsing config"):
        return _yaml_error(text, ex)
    m = re.match(r"unrecognized arguments: (.*)", text, re.S)
    if m:
        return _unrecognized(m.group(1).split(), parser, hint)
    m = re.match(r"the following arguments are required: (.*)", text)
    if m:
        dests = [name.strip() for name in m.group(1).split(",")]
        found = [_find_action(parser, dest) for dest in dests]
        missing = [(sub, action) for sub, action in found if action is not None and not action.option_strings]
        if missing:  # positional arguments, written without a --name
            sub = missing[0][0]
            names = " ".join(_metavar(action) for _, action in missing)
            return f"{_prog(sub)} needs its argument {names}: usage: {_usage(sub)} ({_prog(sub)} --help)"
        names = [f"--{dest}" for dest in dests]
        verb = "is" if len(names) == 1 else "are"
        return f"{', '.join(names)} {verb} required ({hint} lists the options)"
    m = re.match(r"argument (\w+): invalid choice: '([^']*)' \(choose from (.*)\)", text)
    if m:
        choices = re.findall(r"'([^']*)'", m.group(3))
        close = closest(m.group(2), choices)
        mean = f"; did you mean {close!r}?" if close else ""
        return f"unknown {m.group(1)} {m.group(2)!r}{mean} (choose from {', '.join(choices)})"
    m = re.match(r'expected "(\w+)" to be one of \{(.*)\}, but it was not provided', text)
    if m:
        return f"a {m.group(1)} is needed: {' or '.join(m.group(2).split(','))} ({hint} lists them)"
    finding = _best(_findings(_tree(text), [], None, None))
    if finding is None:
        return None
    return finding.render(parser, hint, _given_option(text))


def _prog(parser: Any) -> str:
    """The command as typed: ``cblight data peek`` (argparse's subcommand prog says ``cblight data [options]
    peek``; ``cblight tune`` runs LightningCLI's ``fit`` without the word)."""
    prog = str(getattr(parser, "prog", "") or "").replace(" [options]", "")
    return prog[: -len(" fit")] if prog.startswith("cblight tune") and prog.endswith(" fit") else prog


def _help_hint(parser: Any) -> str:
    prog = _prog(parser)
    return f"{prog} --help" if prog else "--help"


def _find_action(parser: Any, dest: str) -> tuple[Any, Any]:
    """``(the parser or subcommand parser holding it, the action)`` of a dotted ``dest`` (``convert.name``:
    the ``name`` of subcommand ``convert``); ``(parser, None)`` when none holds it."""
    for action in getattr(parser, "_actions", []):
        if action.dest == dest:
            return parser, action
        for name, sub in (getattr(action, "_name_parser_map", None) or {}).items():
            if dest.startswith(name + "."):
                return _find_action(sub, dest[len(name) + 1 :])
    return parser, None


def _metavar(action: Any) -> str:
    return str(action.metavar or action.dest.rpartition(".")[2].upper())


def _usage(parser: Any) -> str:
    """One line: the command, its positional arguments, ``[options]``."""
    positional = [_metavar(a) for a in parser._actions if not a.option_strings and a.dest != "subcommand"]
    return " ".join([_prog(parser), *positional, "[options]"])


def _unrecognized(tokens: list[str], parser: Any, hint: str) -> str:
    option = next((t for t in tokens if t.startswith("-")), None)
    if option is None:
        return f"unexpected argument {tokens[0]!r}: options are written --name value ({hint} lists them)"
    key = option.split("=", 1)[0].lstrip("-")
    suggestions = closest_keys(key, parser_keys(parser))
    if suggestions:
        holder, action = _find_action(parser, suggestions[0])
        if action is not None and not action.option_strings:
            return (
                f"unknown option --{key}: {_metavar(action)} is a positional argument, given without an "
                f"option name: usage: {_usage(holder)}"
            )
    return f"unknown option --{key}{_did_you_mean(suggestions, '--', hint)}"


def _did_you_mean(suggestions: list[str], dashes: str, hint: str) -> str:
    if not suggestions:
        return f" ({hint} lists the options)"
    return f"; did you mean {' or '.join(dashes + s for s in suggestions)}?"


def _yaml_error(text: str, ex: BaseException | None) -> str:
    where = _CONFIG_FILE.get() or "the config"
    mark_error = _cause(ex, "problem_mark")
    if mark_error is not None and mark_error.problem_mark is not None:
        mark = mark_error.problem_mark
        line = f"{where} line {mark.line + 1}, column {mark.column + 1}: {mark_error.problem}"
        context, start = mark_error.context, mark_error.context_mark
        if context and start is not None:
            line += f" ({context} that starts at line {start.line + 1}, column {start.column + 1})"
        return line
    detail = " ".join(text.split(":", 1)[1].replace('in "<unicode string>",', "").split())
    return f"{where}: {detail}"


def _cause(ex: BaseException | None, attribute: str) -> Any:
    seen = 0
    while ex is not None and seen < 20:
        if hasattr(ex, attribute):
            return ex
        ex, seen = ex.__cause__ or ex.__context__, seen + 1
    return None


def _given_option(text: str) -> str | None:
    """The dotted option of a report about ``--a.b VALUE`` typed on the command line (not a config key)."""
    top = re.match(r'Parser key "([^"]+)":', text)
    nested = re.search(r"\n  Given value: NestedArg\(key='([^']+)'", text)
    return f"{top.group(1)}.{nested.group(1)}" if top and nested else None


# -- the report as a tree of lines ---------------------------------------------------------------------------
@dataclass
class _Node:
    text: str
    indent: int
    children: list[_Node] = field(default_factory=list)


def _tree(text: str) -> list[_Node]:
    """Lines nested by indentation; a ``- item`` line's own continuation lines are its children."""
    root = _Node("", -1)
    stack = [root]
    for raw in text.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        body = raw.strip()
        if body.startswith("- "):
            body = body[2:]
        while stack[-1].indent >= indent:
            stack.pop()
        node = _Node(body, indent)
        stack[-1].children.append(node)
        stack.append(node)
    return root.children


@dataclass
class _Finding:
    """One thing wrong: ``kind`` ('unknown', 'choice', 'type', 'import', 'union', 'text') at ``path``."""

    kind: str
    path: list[str]
    rank: int
    value: str | None = None
    allowed: list[Any] = field(default_factory=list)
    expected: list[str] = field(default_factory=list)
    class_path: str | None = None
    bases: list[str] = field(default_factory=list)
    text: str = ""

    @property
    def key(self) -> str:
        return ".".join(self.path)

    def render(self, parser: Any, hint: str, typed: str | None) -> str:
        key = self.key
        if self.kind == "unknown":
            keys = class_keys(self.class_path, self.path[:-1]) if self.class_path else parser_keys(parser)
            suggestions = closest_keys(key, keys)
            dashes = "--" if typed == key else ""
            if suggestions:
                return f"unknown option {dashes}{key}{_did_you_mean(suggestions, dashes, hint)}"
            names = sorted(k.rpartition(".")[2] for k in keys)
            if self.class_path and names and len(names) <= 12:  # e.g. the base class of an optimizer
                return f"unknown option {dashes}{key}: {self.class_path} takes {', '.join(names)}"
            return f"unknown option {dashes}{key} ({hint} lists the options)"
        if self.kind == "group":
            return _group_given_a_value(parser, key, str(self.value))
        if self.kind == "choice":
            allowed = ", ".join(repr(a) for a in self.allowed)
            return f"{key}: {self.value!r} is not one of {allowed}"
        if self.kind in ("type", "union"):
            words = [_type_words(e) for e in self.expected]
            words = [w for w in dict.fromkeys(words) if w != "null"] or words
            if "a number" in words and str(self.value).strip().lower() in _NON_FINITE:
                return f"{key} must be a finite number, got {self.value}"
            return f"{key}: expected {' or '.join(words)}, got {self.value!r}"
        if self.kind == "import":
            close = closest(str(self.value), subclass_names(self.bases))
            mean = f"; did you mean {close}?" if close else ""
            return f"{key}: no class {self.value!r} can be imported{mean} (a class name or a dotted path)"
        where = {"config": "-c/--config"}.get(key, key)
        return f"{where}: {self.text}" if where else self.text


def _group_given_a_value(parser: Any, key: str, value: str) -> str:
    """``--model.teacher live``: the group's option that takes such a value (a Literal's value, a flag's
    true/false, else its one string option), else the group's options."""
    dashes = "--" if f"--{key}" in _ARGV.get() else ""
    if value.endswith((".yaml", ".yml", ".json", ".jsonnet")) or os.sep in value:  # meant as a file
        why = "no such file" if not os.path.exists(value) else "not a mapping of its options"
        return f"{dashes}{key}: cannot read {value!r} as a config of its options ({why})"
    leaves = sorted(k for k in parser_keys(parser) if k.startswith(key + "."))
    hints = {k: getattr(_find_action(parser, k)[1], "_typehint", None) for k in leaves}
    taking = [k for k in leaves if _takes(hints[k], value)] or [k for k in leaves if hints[k] is str]
    what = f"{dashes}{key} is a group of options ({', '.join(k.rpartition('.')[2] for k in leaves)}), not a value"
    if 1 <= len(taking) <= 3:
        return f"{what}; did you mean {' or '.join(f'{dashes}{k} {value}' for k in taking)}?"
    return f"{what}; set one of them, e.g. {dashes}{leaves[0]} VALUE" if leaves else what


def _takes(typehint: Any, value: str) -> bool:
    """Whether a Literal among ``typehint``'s members holds ``value``, or it is a bool and ``value`` one."""
    if typehint is bool:
        return value.lower() in ("true", "false")
    if get_origin(typehint) is Literal:
        return value in [str(v) for v in get_args(typehint)]
    return any(_takes(member, value) for member in get_args(typehint) if get_origin(typehint) is not Literal)


def _best(findings: list[_Finding]) -> _Finding | None:
    return max(findings, key=lambda f: (f.rank, len(f.path)), default=None)


def _findings(
    nodes: list[_Node], path: list[str], class_path: str | None, bases: list[str] | None
) -> list[_Finding]:
    """What the sibling lines ``nodes`` say went wrong at ``path`` (inside ``class_path``, if any)."""
    found: list[_Finding] = []
    given = next((n.text.split(": ", 1)[1] for n in nodes if n.text.startswith("Given value: ")), None)
    subtypes = next((n.text for n in nodes if n.text.startswith("Subtypes: ")), None)
    for node in nodes:
        text = node.text
        if text.startswith(_CONTEXT_LINES):
            continue
        m = re.match(r'Parser key "([^"]+)":\s*(.*)', text)
        if m:
            inner = [*path, *m.group(1).split(".")]
            unloadable = _UNLOADABLE.match(m.group(2))
            if unloadable:
                found.append(_Finding("group", inner, 3, value=unloadable.group(1)))
            elif m.group(2):
                found.append(_Finding("text", inner, 1, text=m.group(2)))
            found.extend(_findings(node.children, inner, None, None))
            continue
        m = re.match(r"Problem with given class_path '([^']+)':", text)
        if m:
            found.extend(_findings(node.children, path, m.group(1), None))
            continue
        if text == "Does not validate against any of the Union subtypes":
            found.extend(_union(nodes, path, given, subtypes))
            continue
        found.extend(_leaf(node, path, class_path, bases or _dotted_names(subtypes)))
    return found


def _union(siblings: list[_Node], path: list[str], given: str | None, subtypes: str | None) -> list[_Finding]:
    """The union's most telling branch, or (when each branch only says what it expected) all of them."""
    errors = next((n for n in siblings if n.text == "Errors:"), None)
    branches = errors.children if errors is not None else []
    bases = _dotted_names(subtypes)
    found = [f for branch in branches for f in _findings([branch], path, None, bases)]
    best = _best(found)
    if best is not None and (best.rank >= 2 or len(best.path) > len(path)):
        return [best]
    expected = [f.expected[0] for f in found if f.kind == "type" and f.expected]
    if expected:
        return [_Finding("union", path, 1, value=given, expected=expected)]
    return found


def _leaf(node: _Node, path: list[str], class_path: str | None, bases: list[str]) -> list[_Finding]:
    text = node.text
    m = re.search(r"Option '([^']+)' is not accepted", text)
    if m:
        # a callable given as {class_path, init_args} (an optimizer): the key lives under init_args
        callable_class = re.search(r"Namespace\(class_path='([^']+)'", text)
        if callable_class:
            return [
                _Finding("unknown", [*path, "init_args", m.group(1)], 4, class_path=callable_class.group(1))
            ]
        return [_Finding("unknown", [*path, *m.group(1).split(".")], 4, class_path=class_path)]
    m = re.match(r"(?:Group|Subcommand) '([^']+)' does not accept option '([^']+)'", text)
    if m:
        prefix = m.group(1).split(".") if text.startswith("Group") else []
        return [_Finding("unknown", [*path, *prefix, *m.group(2).split(".")], 4)]
    m = re.match(r"Expected a typing\.Literal\[(.*)\]\. Got value: (.*)", text, re.S)
    if m:
        return [_Finding("choice", path, 4, value=m.group(2), allowed=_literal_values(m.group(1)))]
    m = re.match(r"Expected a (.*?)\. Got value: (.*)", text, re.S)
    if m:
        return [_Finding("type", path, 3, value=m.group(2), expected=[m.group(1)])]
    m = re.match(r"Expected a (<class '[^']+'>|typing\..*)$", text)
    if m:
        rank = -1 if m.group(1) == "<class 'NoneType'>" else 0
        return [_Finding("type", path, rank, expected=[m.group(1)])]
    m = _UNLOADABLE.match(text)
    if m:  # a scalar given to a group of options (a dataclass), read as a config file's path
        inner = _findings(node.children, path, class_path, bases)
        return inner + ([_Finding("group", path, 3, value=m.group(1))] if path else [])
    m = re.match(r"Expected a dot import path string: (.*)", text)
    if m:
        return [_Finding("import", path, 3, value=m.group(1), bases=bases)]
    m = re.match(r"Not a valid subclass of .*\. Got value: ", text)
    if m:  # the value does not have the class's shape at all: another branch says more
        return [_Finding("text", path, 0, text=text)]
    return [_Finding("text", path, 0, text=" ".join(text.split()))]


def _type_words(expected: str) -> str:
    m = re.fullmatch(r"<class '(?:[\w.]+\.)?(\w+)'>", expected)
    if m:
        return _TYPE_WORDS.get(m.group(1), m.group(1))
    m = re.fullmatch(r"typing\.Literal\[(.*)\]", expected)
    if m:
        return " or ".join(repr(v) for v in _literal_values(m.group(1)))
    return expected


def _literal_values(text: str) -> list[Any]:
    """The values of ``Literal[<text>]`` as jsonargparse prints them (reprs; an enum's stays text)."""
    try:
        return list(ast.literal_eval(f"[{text}]"))
    except (ValueError, SyntaxError):
        return [v.strip() for v in text.split(",")]


def _dotted_names(subtypes: str | None) -> list[str]:
    """The dotted class names in a report's ``Subtypes: [...]`` line (the bases a class path may name)."""
    if not subtypes:
        return []
    return re.findall(r"(?<![\w.])((?:[A-Za-z_]\w*\.)+[A-Z]\w*)", subtypes)
