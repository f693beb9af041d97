"""Sphinx configuration of cblight's documentation site (``bash scripts/docs.sh``; docs/about.md says why Sphinx).

The pages are plain CommonMark Markdown read by myst-parser; the only Sphinx-specific syntax is the
``{toctree}`` blocks of ``index.md`` and the ``{automodule}`` blocks of ``api/``. ``sphinx-build -W`` turns
every warning into an error: a link to a missing page or anchor, a docstring that does not parse.
"""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # the checkout's cblight, not an installed copy

project = "cblight"
author = "cblight contributors"
copyright = "2026, cblight contributors"
release = "0.1.0"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# Markdown: GitHub-style anchors for headings up to level 4 (`[x](page.md#a-heading)` is checked), `$...$`
# left alone (the pages write formulas in code spans), no extension beyond CommonMark tables and fences.
myst_heading_anchors = 4
myst_enable_extensions: list[str] = []

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
html_title = "cblight documentation"
html_theme_options = {
    "navigation_depth": 2,
    "show_toc_level": 2,
    "navbar_align": "left",
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_static_path: list[str] = []
html_show_sourcelink = False
