"""Sphinx configuration of tapegrad's documentation site.

Build it with ``python -m sphinx -W -b html docs docs/_build/html`` (the ``[docs]`` extra;
``tests/test_docs.py`` builds it in CI with warnings as errors).  The guides are the Markdown
files of this folder (MyST); the API reference, ``api/``, is rendered from the docstrings.
"""

from __future__ import annotations

import tapegrad

project = "tapegrad"
author = "the tapegrad developers"
copyright = "2026, the tapegrad developers"
release = tapegrad.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]

myst_heading_anchors = 3          # the guides link to each other's sections by their titles
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = True

html_theme = "pydata_sphinx_theme"
html_title = f"tapegrad {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
