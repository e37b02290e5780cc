# SPDX-License-Identifier: MIT
"""MkDocs hooks (mkdocs.yml ``hooks:``): render the Sphinx-style bits of the docstrings.

The docstrings are Google style, read by mkdocstrings, but keep two Sphinx habits that
Markdown would print literally: roles (``:class:`~onceonly.InFlight```) and version
directives (``.. versionadded:: 0.1``). This turns them into code and a short note.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|attr|exc|mod|data|obj):<code>(~?)([\w.]+)(\(\))?</code>")
_DIRECTIVE = re.compile(r"<p>\.\. (versionadded|versionchanged|deprecated):: ([\w.]+)</p>")
_WORDS = {"versionadded": "Added in", "versionchanged": "Changed in", "deprecated": "Deprecated in"}


def _role(match: re.Match[str]) -> str:
    short, name, call = match.groups()
    return f"<code>{name.rsplit('.', 1)[-1] if short else name}{call or ''}</code>"


def _directive(match: re.Match[str]) -> str:
    kind, version = match.groups()
    return f'<p class="onceonly-version"><em>{_WORDS[kind]} version {version}.</em></p>'


def on_page_content(html: str, **kwargs: Any) -> str:
    """Rewrite the page's HTML after Markdown (and mkdocstrings) rendered it."""
    return _DIRECTIVE.sub(_directive, _ROLE.sub(_role, html))
