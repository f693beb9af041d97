"""The documentation site: the strict Sphinx build of docs/ (every warning an error, offline), the README's
links into it, and a docstring for every public name (a module's ``__all__``) of the API reference.

The strict build is what ``bash scripts/docs.sh build`` runs. Three small sites built with the same
``docs/conf.py`` show that it fails on a link to a missing page, on a page no toctree reaches, and on an
anchor that no heading makes.
"""

from __future__ import annotations

import ast
import dataclasses
import doctest
import importlib
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.helpers import ROOT

DOCS = ROOT / "docs"

# The modules the API reference documents (docs/api/index.md); a package whose __all__ names modules
# documents those modules.
PUBLIC_MODULES = [
    "cblight.boosting",
    "cblight.options",
    "cblight.generate",
    "cblight.scoring",
    "cblight.models",
    "cblight.sharding",
    "cblight.metrics",
    "cblight.data",
    "cblight.tune",
    "cblight.adaptive",
    "cblight.errors",
    "cblight.evaluator",
    "cblight.evaluate.boosted_evaluator",
    "cblight.generate.generation_evaluator",
]


def sphinx_build(source: Path, out: Path) -> subprocess.CompletedProcess:
    """``sphinx-build -n -W`` of ``source`` into ``out``, offline, as scripts/docs.sh builds."""
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-n", "-W", "--keep-going", "-q", "-b", "html", "-d", str(out / ".doctrees"),
         str(source), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )  # fmt: skip


def needs_sphinx() -> None:
    pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("myst_parser", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip(
        "pydata_sphinx_theme", reason="the docs extra is not installed: pip install -e '.[docs]'"
    )
    pytest.importorskip(
        "sphinx_copybutton", reason="the docs extra is not installed: pip install -e '.[docs]'"
    )


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    needs_sphinx()
    out = tmp_path_factory.mktemp("site")
    done = sphinx_build(DOCS, out)
    assert done.returncode == 0, f"sphinx-build -W docs failed:\n{done.stderr[-6000:]}"
    return out


def test_the_site_builds_strictly_with_every_page_and_the_api(built_site):
    for page in ("index", "getting-started", "tutorials/reproduce-tables", "results", "speed", "design",
                 "api/index", "api/boosting", "api/modules"):  # fmt: skip
        assert (built_site / f"{page}.html").is_file(), page
    api = "".join(p.read_text(encoding="utf-8") for p in (built_site / "api").glob("*.html"))
    absent = []
    for module in public_modules():
        for name in module.__all__:
            obj = getattr(module, name, None)
            if isinstance(obj, types.ModuleType) or obj is None:
                ids = {f"module-{module.__name__}.{name}"}
            else:  # documented where it is public, or (a re-export) where it is defined
                callable_ = inspect.isclass(obj) or inspect.isroutine(obj)
                origin = f"{obj.__module__}.{obj.__qualname__}" if callable_ else imported_from(module, name)
                ids = {f"{module.__name__}.{name}", origin}
            if not any(f'id="{i}"' in api for i in ids if i):
                absent.append(f"{module.__name__}.{name}")
    assert not absent, f"public names the API reference does not show: {absent}"
    assert 'id="cblight.tune.coherence_tuning.CoherenceTuning"' in api


def test_the_site_has_its_sections_rendered_math_offline_and_its_version(built_site):
    """The navbar holds the five sections (none under "More"), each an index page whose toctree the sidebar
    shows; formulas are typeset by the MathJax copied into the site (no request leaves the machine); the
    header names the version; wide tables sit in a scrolling container (the theme's, styled by cblight.css)."""
    from cblight import __version__

    home = (built_site / "index.html").read_text(encoding="utf-8")
    navbar = home[home.index('class="bd-navbar-elements navbar-nav"') :]
    navbar = navbar[: navbar.index("</nav>")]
    for page in ("getting-started", "tutorials/index", "howto", "measurements", "reference"):
        assert f'href="{page}.html"' in navbar, page
    assert "More" not in navbar
    tutorial = (built_site / "tutorials" / "generate.html").read_text(encoding="utf-8")
    sidebar = tutorial[tutorial.index('class="bd-docs-nav') :]
    assert 'href="tune.html"' in sidebar[: sidebar.index("</nav>")]  # the section's other pages
    assert '<script defer="defer" src="_static/mathjax/tex-chtml.js">' in home
    assert (built_site / "_static" / "mathjax" / "tex-chtml.js").is_file()
    assert home.count('class="math notranslate') >= 4  # eq. 1, the two forms, eq. 2
    assert f"cblight {__version__}" in home[: home.index("</header>")]
    assert (built_site / "_static" / "cblight.css").is_file() and "cblight.css" in home
    speed = (built_site / "speed.html").read_text(encoding="utf-8")
    assert speed.count('class="pst-scrollable-table-container"') == speed.count("<table")
    assert "copybutton" in home


def test_the_readme_links_into_pages_and_anchors_that_exist(built_site):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert len(links) >= 20, links
    for path, anchor in links:
        assert (ROOT / path).is_file(), f"README links to {path}, which does not exist"
        if anchor:
            html = (built_site / Path(path).relative_to("docs").with_suffix(".html")).read_text(
                encoding="utf-8"
            )
            assert f'id="{anchor}"' in html, (
                f"README links to {path}#{anchor}: no such anchor in the built page"
            )


BROKEN = {
    "a link to a missing page": ("See [there](missing.md).\n", "missing.md"),
    "a page no toctree reaches": (None, "document isn't included in any toctree"),
    "an anchor no heading makes": ("See [the part](page.md#no-such-heading).\n", "no-such-heading"),
    # nitpicky: cblight's own names must resolve (a library's, e.g. torch.Tensor on the page, need not)
    "a reference to an object that does not exist": (
        "See {py:class}`cblight.options.NoSuchOption`.\n",
        "cblight.options.NoSuchOption",
    ),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_the_strict_build_fails_on(case, tmp_path):
    """A two-page site with ``docs/conf.py``: the build passes as written and fails with the one broken thing."""
    needs_sphinx()
    text, expected = BROKEN[case]
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(DOCS / "conf.py", source / "conf.py")
    shutil.copytree(DOCS / "_static", source / "_static")
    (source / "index.md").write_text("# Home\n\n```{toctree}\npage\n```\n", encoding="utf-8")
    (source / "page.md").write_text(
        "# Page\n\n## A heading\n\nSee [the part](#a-heading) and {py:class}`torch.Tensor`.\n",
        encoding="utf-8",
    )
    assert sphinx_build(source, tmp_path / "ok").returncode == 0
    if text is None:
        (source / "orphan.md").write_text("# Nobody links here\n", encoding="utf-8")
    else:
        (source / "page.md").write_text(f"# Page\n\n{text}", encoding="utf-8")
    done = sphinx_build(source, tmp_path / "out")
    assert done.returncode != 0
    assert expected in done.stderr, done.stderr


# ---------------------------------------------------------------------------------------------------------
# Docstrings of public names


def _own_docstring(obj: object) -> str | None:
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
        if dataclasses.is_dataclass(obj) and doc and doc.startswith(f"{obj.__name__}("):
            return None  # the signature dataclasses write when a class has no docstring
        return doc
    return getattr(obj, "__doc__", None)


def _attribute_documented(module: types.ModuleType, name: str) -> bool:
    """A constant or type alias is documented as autodoc reads it: a ``#:`` comment on the line just above
    its assignment or at its end, or a string right after it; looked up where it is assigned (following
    ``from x import name``)."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return False
    lines = source.splitlines()
    body = ast.parse(source).body
    for i, node in enumerate(body):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
            after = body[i + 1] if i + 1 < len(body) else None
            string_after = (
                isinstance(after, ast.Expr)
                and isinstance(getattr(after, "value", None), ast.Constant)
                and isinstance(after.value.value, str)
            )
            trailing = "#: " in lines[node.lineno - 1]
            return above.startswith("#:") or trailing or string_after
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            origin = importlib.util.resolve_name(
                "." * node.level + (node.module or ""), module.__package__ or module.__name__
            )
            return _attribute_documented(
                importlib.import_module(origin),
                next(a.name for a in node.names if (a.asname or a.name) == name),
            )
    return False  # fmt: skip


def imported_from(module: types.ModuleType, name: str) -> str | None:
    """``package.module.name`` where ``module`` took ``name`` from (``from x import name``), else None."""
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    base = "." * node.level + (node.module or "")
                    return f"{importlib.util.resolve_name(base, module.__package__ or module.__name__)}.{alias.name}"
    return None


def undocumented(module: types.ModuleType) -> list[str]:
    """The names of ``module.__all__`` without a docstring (modules, classes, functions) or a doc comment."""
    missing = []
    for name in module.__all__:
        obj = getattr(module, name, None)
        if obj is None and module.__spec__ and module.__spec__.submodule_search_locations:
            obj = importlib.import_module(f"{module.__name__}.{name}")
        if isinstance(obj, types.ModuleType) or inspect.isclass(obj) or inspect.isroutine(obj):
            if not (_own_docstring(obj) or "").strip():
                missing.append(f"{module.__name__}.{name}")
        elif not _attribute_documented(module, name):
            missing.append(f"{module.__name__}.{name}")
    return missing


def public_modules() -> list[types.ModuleType]:
    modules = []
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        modules.append(module)
        for sub in module.__all__:  # a package that lists its public modules
            value = getattr(module, sub, None)
            if isinstance(value, types.ModuleType) or (value is None and hasattr(module, "__path__")):
                modules.append(importlib.import_module(f"{name}.{sub}"))
    return modules


def test_every_public_name_has_a_docstring():
    modules = public_modules()
    assert all(hasattr(m, "__all__") for m in modules), [
        m.__name__ for m in modules if not hasattr(m, "__all__")
    ]
    missing = [name for module in modules for name in undocumented(module)]
    assert not missing, f"public names (in __all__) without a docstring or a '#:' comment: {missing}"


def test_the_docstring_check_can_fail(tmp_path, monkeypatch):
    (tmp_path / "fake_public.py").write_text(
        '"""A module."""\n__all__ = ["f", "g", "C", "D", "K", "L"]\n\ndef f():\n    pass\n\ndef g():\n    """Documented."""\n\n'
        "import dataclasses\n\n@dataclasses.dataclass\nclass C:\n    x: int = 0\n\nclass D:\n    \"\"\"Documented.\"\"\"\n\n"
        "K = 1\n\n#: Documented.\nL = 2\n",
        encoding="utf-8",
    )  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("fake_public")
    assert undocumented(module) == ["fake_public.f", "fake_public.C", "fake_public.K"]


# ---------------------------------------------------------------------------------------------------------
# How much the API reference documents (scripts/api_docs_coverage.py counts it from the built pages)


def _coverage_script() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(
        "api_docs_coverage", ROOT / "scripts" / "api_docs_coverage.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module's names through sys.modules
    spec.loader.exec_module(module)
    return module


def test_the_api_reference_describes_parameters_and_returns_and_shows_examples(built_site):
    counts = _coverage_script()
    found = counts.coverage(built_site / "api")
    missing_examples = sorted(set(found.pages) - found.pages_with_example)
    assert not missing_examples, f"API pages without an example (a >>> block): {missing_examples}"
    done = found.entries  # the floors hold over the whole reference
    assert len(done) >= 50, len(done)  # the floors hold over a real part of the reference, not an empty one
    described = [e for e in done if not e.undescribed]
    assert len(described) >= counts.PARAMETERS_FLOOR * len(done), (
        f"{len(described)}/{len(done)} callables describe every parameter (Args:), below "
        f"{counts.PARAMETERS_FLOOR:.0%}; e.g. {[(e.name, e.undescribed) for e in done if e.undescribed][:8]}"
    )
    wanted = [e for e in done if e.wants_returns]
    returning = [e for e in wanted if e.returns]
    assert len(returning) >= counts.RETURNS_FLOOR * len(wanted), (
        f"{len(returning)}/{len(wanted)} functions and methods have Returns/Yields, below "
        f"{counts.RETURNS_FLOOR:.0%}; e.g. {[e.name for e in wanted if not e.returns][:8]}"
    )


def test_the_coverage_count_reads_parameters_returns_and_examples(tmp_path):
    """A page built with ``docs/conf.py``: one function describes its parameters and return and shows an
    example, one leaves a parameter out, one class describes its constructor, and a dataclass whose
    signature Sphinx cannot parse (a factory default) leaves one field out; the counts see exactly that."""
    needs_sphinx()
    source = tmp_path / "src"
    (source / "api").mkdir(parents=True)
    shutil.copy(DOCS / "conf.py", source / "conf.py")
    if (DOCS / "_static").is_dir():  # what conf.py's html_static_path names, when it names one
        shutil.copytree(DOCS / "_static", source / "_static")
    (source / "index.md").write_text("# Home\n\n```{toctree}\napi/page\n```\n", encoding="utf-8")
    (tmp_path / "fake_api.py").write_text(
        '"""A module."""\nimport dataclasses\n__all__ = ["good", "partial", "Thing", "Made"]\n\n'
        "def good(a: int, *args, b: int = 1, **kwargs) -> int:\n"
        '    """Add.\n\n    Args:\n        a: One.\n        b: Two.\n\n    Returns:\n        The sum.\n\n'
        '    Examples:\n        >>> good(1)\n        2\n    """\n    return a + b\n\n'
        'def partial(a: int, b: int) -> None:\n    """Half.\n\n    Args:\n        a: One.\n    """\n\n'
        'class Thing:\n    """A thing.\n\n    Args:\n        size: How big.\n    """\n\n'
        "    def __init__(self, size: int) -> None:\n        self.size = size\n\n"
        '@dataclasses.dataclass\nclass Made:\n    """Made.\n\n    Args:\n        a: One.\n    """\n\n'
        "    a: int\n    items: list = dataclasses.field(default_factory=list)\n",
        encoding="utf-8",
    )  # fmt: skip
    (source / "api" / "page.md").write_text(
        "# Page\n\n```{eval-rst}\n.. automodule:: fake_api\n```\n", encoding="utf-8"
    )
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(source), str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = _coverage_script().coverage(out / "api")
    by_name = {e.name: e for e in found.entries}
    assert set(by_name) == {"fake_api.good", "fake_api.partial", "fake_api.Thing", "fake_api.Made"}
    assert by_name["fake_api.good"].parameters == ("a", "b") and not by_name["fake_api.good"].undescribed
    assert by_name["fake_api.partial"].undescribed == ["b"]
    assert not by_name["fake_api.Thing"].undescribed and not by_name["fake_api.Thing"].wants_returns
    assert by_name["fake_api.Made"].parameters == ("a", "items") and by_name["fake_api.Made"].undescribed == [
        "items"
    ]
    assert found.parameters == (2, 4) and found.returns == (1, 2) and found.examples == (1, 1)


# ---------------------------------------------------------------------------------------------------------
# The API pages' examples run: every docstring's ``>>>`` lines in the modules docs/api/*.md document, and
# the pages' own ``>>>`` blocks, as doctests (one seed, one thread)

API_PAGES = sorted(p.stem for p in (DOCS / "api").glob("*.md"))
_DIRECTIVE = re.compile(r"^\.\. (automodule|autoclass|autodata|autofunction)::\s*(\S+)((?:\n   :.*)*)", re.M)
_FENCE = re.compile(r"^```(?:python|pycon)\n(.*?)^```", re.M | re.S)


def page_modules(page: str) -> list[str]:
    """The modules whose docstrings an API page shows: each automodule (and, for a package re-exporting
    names in its ``__all__``, the modules defining those names, ``:exclude-members:`` left out), and the
    module of each autoclass and autodata."""
    text = (DOCS / "api" / f"{page}.md").read_text(encoding="utf-8")
    names: dict[str, None] = {}
    for kind, target, options in _DIRECTIVE.findall(text):
        if kind != "automodule":
            names[target.rsplit(".", 1)[0]] = None
            continue
        names[target] = None
        excluded = set(re.findall(r"\w+", options.partition(":exclude-members:")[2]))
        module = importlib.import_module(target)
        for name in getattr(module, "__all__", []):
            origin = getattr(getattr(module, name, None), "__module__", None) or ""  # modules have none
            if name not in excluded and origin.startswith("cblight") and origin != target:
                names[origin] = None
    return list(names)


def page_doctests(page: str) -> list[doctest.DocTest]:
    """The doctests of one API page: its modules' docstrings and the page's own ``>>>`` blocks."""
    finder, parser = doctest.DocTestFinder(exclude_empty=True), doctest.DocTestParser()
    tests = [t for name in page_modules(page) for t in finder.find(importlib.import_module(name))]
    path = DOCS / "api" / f"{page}.md"
    text = path.read_text(encoding="utf-8")
    for block in _FENCE.finditer(text):
        if ">>>" in block.group(1):
            line = text.count("\n", 0, block.start(1))
            tests.append(parser.get_doctest(block.group(1), {}, f"docs/api/{page}.md", str(path), line))
    return [t for t in tests if t.examples]


@pytest.mark.parametrize("page", API_PAGES)
def test_the_api_examples_run(page, tmp_path, monkeypatch):
    """Each example as a user pastes it: a fixed seed, one thread, temporary files under the test's folder."""
    import random

    import torch

    tests = page_doctests(page)
    assert tests, f"docs/api/{page}.md shows no example (an Examples: section or a >>> block)"
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # tempfile.mkdtemp() in an example lands here
    threads = torch.get_num_threads()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    try:
        torch.set_num_threads(1)
        for test in tests:
            random.seed(0)
            torch.manual_seed(0)
            runner.run(test, out=report.append)
    finally:
        torch.set_num_threads(threads)
    assert not runner.failures, "".join(report)
