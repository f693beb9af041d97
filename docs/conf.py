"""Sphinx configuration of cblight's documentation site (``bash scripts/docs.sh``; docs/about.md says why Sphinx).

The pages are CommonMark Markdown read by myst-parser, with ``$...$`` / ``$$...$$`` math (rendered by a
MathJax bundled into the site, so it works offline); the Sphinx-specific syntax is the ``{toctree}`` blocks
of the section index pages and the ``{eval-rst}`` autodoc blocks of ``api/``. The build is
``sphinx-build -n -W``: every warning is an error (a link to a missing page or anchor, a docstring that does
not parse) and so is a cross-reference to an object that does not exist (``nitpicky``).
"""

import os
import re
import sys

sys.path.insert(0, os.path.abspath(".."))  # the checkout's cblight, not an installed copy

from cblight import __version__  # noqa: E402  (after the path above)

project = "cblight"
author = "cblight contributors"
copyright = "2026, cblight contributors"
release = version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax 3 copied into _static/mathjax: formulas render without internet
    "sphinx_copybutton",  # a copy button on every code block; the prompt and output lines are not copied
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# Markdown: GitHub-style anchors for headings up to level 4 (`[x](page.md#a-heading)` is checked); math in
# $...$, $$...$$ and amsmath environments.
myst_heading_anchors = 4
myst_enable_extensions = ["dollarmath", "amsmath"]

# Cross-references: every reference must resolve. Python's, PyTorch's, Lightning's... documentation can
# only be linked through their intersphinx inventories, which need the internet, so references to those
# libraries' objects stay plain text. Never cblight's own: a cblight name that does not resolve is a name
# the API reference lacks, and fails the build.
nitpicky = True
_EXTERNAL = (
    "collections", "typing", "pathlib", "os", "enum", "dataclasses", "concurrent", "subprocess", "threading",
    "torch", "transformers", "lightning", "torchmetrics", "jsonargparse", "datasets", "numpy", "peft",
    "lm_eval", "tokenizers", "huggingface_hub", "matplotlib", "filelock",
)  # fmt: skip
# (a dataclass field's ``tuple[PositiveInt, ...]`` reaches the resolver unparsed, as ``tuple[~jsonargparse...``)
nitpick_ignore_regex = [
    (r"py:.*", rf"(tuple\[~?)?({'|'.join(_EXTERNAL)})(\..*)?"),
    (r"py:.*", r"tuple\[~?cblight\.option_types\..*"),  # the same, for cblight's own (documented) types
]

# Code blocks: the copy button leaves out shell prompts and Python's >>> / ... prompts
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True

# API: Google-style docstrings as the code writes them; members in source order; a module's __all__ decides
# what is documented (autodoc honours it).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_preserve_defaults = True
# An overridden Lightning hook without its own docstring is left out, not documented with Lightning's text
autodoc_inherit_docstrings = False
autodoc_mock_imports = ["lm_eval", "peft", "wandb", "pycocoevalcap"]  # optional extras

html_theme = "pydata_sphinx_theme"
html_title = f"cblight {release}"
html_theme_options = {
    "logo": {"text": f"cblight {release}"},  # the version in the header, on every page
    "navigation_depth": 2,
    "show_toc_level": 2,
    "navbar_align": "left",
    "header_links_before_dropdown": 6,  # the five sections of index.md, none hidden under "More"
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_static_path = ["_static"]
html_css_files = ["cblight.css"]
html_show_sourcelink = False

_FIELD_COLON = re.compile(r"(?<!:):(?!:)")


def _no_inline_attribute_type(app, what, name, obj, options, lines):
    """cblight's attributes and properties take their type from their annotation; their docstrings are
    prose. Napoleon reads a first line ``X: Y`` of such a docstring as "type X, description Y" and renders
    "Type: X"; a leading ``:`` makes it read an empty type, and the line stays the description."""
    if what in ("attribute", "property", "data") and lines and _FIELD_COLON.search(lines[0]):
        lines[0] = ": " + lines[0]


def setup(app):
    # before napoleon (priority 500), which turns the Google-style docstring into reST
    app.connect("autodoc-process-docstring", _no_inline_attribute_type, priority=400)
