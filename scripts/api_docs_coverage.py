"""How much of the built API reference documents: counted from the HTML of ``docs/_build/html/api/*.html``.

    bash scripts/docs.sh build && .venv/bin/python scripts/api_docs_coverage.py            # the three counts
    .venv/bin/python scripts/api_docs_coverage.py --missing                                # and what lacks what

Three counts, over every callable an API page documents (Sphinx's ``py function``, ``py class``,
``py exception`` and ``py method`` entries; properties and data are not callables):

* **parameters**: the callables whose "Parameters" field list (napoleon's ``Args:``) names every parameter of
  the signature, ``self``, ``cls``, ``*args`` and ``**kwargs`` aside (a class's signature is its
  constructor's, so a class describes its constructor's parameters). A callable without parameters
  describes all of them.
* **returns**: the functions and methods (not classes) with a "Returns" or "Yields" field.
* **examples**: the pages that show an example, a code block with a ``>>>`` prompt (napoleon's
  ``Examples:`` section, or a fenced block on the page itself).

``tests/commands/test_docs.py`` holds the built site to ``PARAMETERS_FLOOR``, ``RETURNS_FLOOR`` and an example on
every page. Needs ``beautifulsoup4`` (a dependency of the docs extra's theme).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib
import inspect
import sys
from pathlib import Path

from bs4 import BeautifulSoup, Tag

#: At least this share of the API's callables describe every parameter.
PARAMETERS_FLOOR = 0.8
#: At least this share of the API's functions and methods have a Returns (or Yields) section.
RETURNS_FLOOR = 0.6

CALLABLE_KINDS = ("function", "class", "exception", "method")
RETURN_FIELDS = ("Returns", "Yields")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One documented callable of one page.

    Args:
        page: The page's file name (``boosting.html``).
        name: The entry's full dotted name (its anchor), e.g. ``cblight.boosting.boosted_log_probs``.
        kind: ``function``, ``class``, ``exception`` or ``method``.
        parameters: The signature's parameters, ``self``, ``cls``, ``*args`` and ``**kwargs`` aside.
        described: The parameters the "Parameters" field list names.
        returns: Whether the entry has a Returns or Yields field.
    """

    page: str
    name: str
    kind: str
    parameters: tuple[str, ...]
    described: frozenset[str]
    returns: bool

    @property
    def undescribed(self) -> list[str]:
        """The signature's parameters the "Parameters" field list does not name."""
        return [p for p in self.parameters if p not in self.described]

    @property
    def wants_returns(self) -> bool:
        """Whether the returns count includes this entry (functions and methods do, classes do not)."""
        return self.kind in ("function", "method")


@dataclasses.dataclass(frozen=True)
class Coverage:
    """The three counts of one built API reference.

    Args:
        entries: Every documented callable.
        pages_with_example: The pages (file names) that show an example.
        pages: Every API page.
    """

    entries: tuple[Entry, ...]
    pages_with_example: frozenset[str]
    pages: tuple[str, ...]

    @property
    def parameters(self) -> tuple[int, int]:
        """(callables that describe every parameter, callables)."""
        return sum(not e.undescribed for e in self.entries), len(self.entries)

    @property
    def returns(self) -> tuple[int, int]:
        """(functions and methods with a Returns or Yields field, functions and methods)."""
        wanted = [e for e in self.entries if e.wants_returns]
        return sum(e.returns for e in wanted), len(wanted)

    @property
    def examples(self) -> tuple[int, int]:
        """(pages with an example, pages)."""
        return len(self.pages_with_example), len(self.pages)


def _split_top_level(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{<":
            depth += 1
        elif char in ")]}>":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def _signature_parameters(dt: Tag) -> tuple[str, ...]:
    # One entry per parameter, or, where Sphinx could not parse a signature (a dataclass field whose default
    # is a factory), the parameter list cut at every comma, brackets or not: joined again and cut at the
    # commas outside brackets and quotes, both give the parameters.
    text = ", ".join(param.get_text() for param in dt.find_all("em", class_="sig-param"))
    names = []
    for part in _split_top_level(text):
        part = part.strip()
        if not part or part.startswith("*") or part == "/":  # *args, **kwargs, the bare * and /
            continue
        name = part.split(":")[0].split("=")[0].strip()
        if name not in ("self", "cls"):
            names.append(name)
    return tuple(names)


def _fields(dd: Tag) -> dict[str, Tag]:
    """The entry's own field lists (not those of the members nested in it), by field name."""
    fields = {}
    for field_list in dd.find_all("dl", class_="field-list", recursive=False):
        for dt in field_list.find_all("dt", recursive=False):
            name = dt.get_text().strip().rstrip(":").strip()
            fields[name] = dt.find_next_sibling("dd")
    return fields


def page_entries(path: Path) -> tuple[list[Entry], bool]:
    """The callables one built API page documents, and whether the page shows an example.

    Args:
        path: A built page, ``docs/_build/html/api/<page>.html``.

    Returns:
        The page's entries in page order, and True when one of its code blocks has a ``>>>`` prompt.
    """
    soup = BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")
    entries = []
    for dl in soup.select("dl.py"):
        kind = next((k for k in CALLABLE_KINDS if k in dl["class"]), None)
        dt = dl.find("dt", recursive=False)
        dd = dl.find("dd", recursive=False)
        if kind is None or dt is None or dd is None or not dt.get("id"):
            continue
        described = _fields(dd).get("Parameters")
        named = (
            frozenset(s.get_text().strip() for s in described.find_all("strong"))
            if described
            else frozenset()
        )
        entries.append(
            Entry(
                page=path.name,
                name=dt["id"],
                kind=kind,
                parameters=_signature_parameters(dt),
                described=named,
                returns=any(f in _fields(dd) for f in RETURN_FIELDS),
            )
        )
    example = any(">>>" in block.get_text() for block in soup.find_all("pre"))
    return entries, example


def coverage(api_dir: Path) -> Coverage:
    """The three counts over every page of a built API reference.

    Args:
        api_dir: The built reference's folder, ``docs/_build/html/api``.

    Returns:
        The entries of every page, and the pages that show an example.
    """
    pages = sorted(api_dir.glob("*.html"))
    if not pages:
        raise FileNotFoundError(f"{api_dir}: no built API pages (run: bash scripts/docs.sh build)")
    entries: list[Entry] = []
    with_example = set()
    for page in pages:
        found, example = page_entries(page)
        entries.extend(found)
        if example:
            with_example.add(page.name)
    return Coverage(tuple(entries), frozenset(with_example), tuple(p.name for p in pages))


def defined_in(name: str) -> str | None:
    """The source file, relative to the package's parent folder, that defines a documented callable.

    Args:
        name: The entry's dotted name, e.g. ``cblight.metrics.self_bleu`` (a re-export is followed to its
            definition, ``cblight/metrics/text_stats.py``).

    Returns:
        The file as ``cblight/...``, or ``None`` when the name does not import.
    """
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            path = Path(inspect.getsourcefile(inspect.unwrap(obj)) or "")
        except (AttributeError, TypeError):
            return None
        top = importlib.import_module(parts[0])
        return path.relative_to(Path(top.__file__).parent.parent).as_posix()
    return None


def _share(counted: tuple[int, int]) -> str:
    done, total = counted
    return f"{done}/{total} ({done / total:.0%})" if total else "0/0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("api_dir", nargs="?", default="docs/_build/html/api", type=Path)
    parser.add_argument("--missing", action="store_true", help="list each callable's missing parts")
    parser.add_argument("--by-file", action="store_true", help="the counts per source file")
    args = parser.parse_args(argv)
    found = coverage(args.api_dir)
    print(
        f"callables that describe every parameter: {_share(found.parameters)} (floor {PARAMETERS_FLOOR:.0%})"
    )
    print(f"functions and methods with Returns/Yields: {_share(found.returns)} (floor {RETURNS_FLOOR:.0%})")
    print(f"pages with an example: {_share(found.examples)}")
    if args.by_file:
        files: dict[str, list[Entry]] = collections.defaultdict(list)
        for e in found.entries:
            files[defined_in(e.name) or "?"].append(e)
        for file, entries in sorted(files.items()):
            params = sum(not e.undescribed for e in entries)
            wanted = [e for e in entries if e.wants_returns]
            print(
                f"  {file}: parameters {params}/{len(entries)}, returns {sum(e.returns for e in wanted)}/{len(wanted)}"
            )
    if args.missing:
        for e in found.entries:
            gaps = []
            if e.undescribed:
                gaps.append("parameters " + ", ".join(e.undescribed))
            if e.wants_returns and not e.returns:
                gaps.append("Returns")
            if gaps:
                print(f"  {e.page}: {e.kind} {e.name}: {'; '.join(gaps)}")
        for page in found.pages:
            if page not in found.pages_with_example:
                print(f"  {page}: no example")
    return 0


if __name__ == "__main__":
    sys.exit(main())
