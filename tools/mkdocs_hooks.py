# SPDX-License-Identifier: MIT
"""MkDocs hooks (mkdocs.yml ``hooks:``): benchmark charts, and the Sphinx-style bits of the
docstrings.

A ``<!-- chart ... -->`` marker after a table of docs/benchmarks.md becomes an inline SVG
bar chart of that table's figures (tools/bench_chart.py), so the chart can never disagree
with the table.

The docstrings are Google style, read by mkdocstrings, but keep two Sphinx habits that
Markdown would print literally: roles (``:class:`~onceonly.InFlight```) and version
directives (``.. versionadded:: 0.1``). This turns them into code and a short note.
"""

from __future__ import annotations

import re
from typing import Any

import bench_chart  # tools/, beside this file: MkDocs puts a hook's folder on sys.path

_ROLE = re.compile(r":(?:class|func|meth|attr|exc|mod|data|obj):<code>(~?)([\w.]+)(\(\))?</code>")
_PARAGRAPH = re.compile(r"<p>(\.\. (?:versionadded|versionchanged|deprecated)::.*?)</p>", re.S)
_DIRECTIVE = re.compile(r"\.\. (versionadded|versionchanged|deprecated):: ([\w.]+)")
_WORDS = {"versionadded": "Added in", "versionchanged": "Changed in", "deprecated": "Deprecated in"}


def _role(match: re.Match[str]) -> str:
    short, name, call = match.groups()
    return f"<code>{name.rsplit('.', 1)[-1] if short else name}{call or ''}</code>"


def _directives(match: re.Match[str]) -> str:
    """One paragraph of directives (Markdown joins consecutive lines) -> one note each."""
    parts = _DIRECTIVE.split(match.group(1))  # ["", kind, version, text, kind, ...]
    notes = []
    for kind, version, text in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        text = text.strip()
        notes.append(f"{_WORDS[kind]} version {version}" + (f": {text}" if text else "."))
    return '<p class="onceonly-version"><em>' + "<br>".join(notes) + "</em></p>"


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Draw the charts a page asks for, from its own tables, before Markdown runs."""
    return bench_chart.expand(markdown, page.file.src_uri)


def on_page_content(html: str, **kwargs: Any) -> str:
    """Rewrite the page's HTML after Markdown (and mkdocstrings) rendered it."""
    return _PARAGRAPH.sub(_directives, _ROLE.sub(_role, html))
