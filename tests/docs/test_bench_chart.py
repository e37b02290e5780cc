# SPDX-License-Identifier: MIT
"""The charts of docs/benchmarks.md are drawn from its tables when the site builds.

``tools/bench_chart.py`` turns each ``<!-- chart ... -->`` marker into an inline SVG of
the table above it; the MkDocs hook (``tools/mkdocs_hooks.py``) runs it on every page.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import xml.etree.ElementTree as ET
from types import ModuleType, SimpleNamespace

import pytest

from tests.docs.test_snippets import ROOT

TOOLS = ROOT / "tools"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
SVG = "{http://www.w3.org/2000/svg}"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


chart = _load("bench_chart")


def _figures(html: str) -> list[ET.Element]:
    return [ET.fromstring(m) for m in re.findall(r"<figure .*?</figure>", html)]


def _bars(figure: ET.Element) -> dict[str, float]:
    """Each bar's tooltip (row, series: value as written) -> its drawn width."""
    return {
        rect.findtext(f"{SVG}title", ""): float(rect.get("width", "nan"))
        for rect in figure.iter(f"{SVG}rect")
        if rect.get("class") == "onceonly-chart-bar"
    }


def test_every_marker_becomes_a_chart_of_its_table() -> None:
    """Each marker of benchmarks.md is replaced by a well-formed SVG of the table's figures."""
    text = BENCHMARKS.read_text(encoding="utf-8")
    markers = len(re.findall(r"(?m)^<!-- chart ", text))
    html = chart.expand(text, "benchmarks.md")
    assert markers >= 5
    assert "<!-- chart " not in html
    figures = _figures(html)
    assert len(figures) == markers
    first = _bars(figures[0])
    assert list(first) == [
        "new keys, concurrency 1: 0.85",
        "new keys, concurrency 8: 0.69",
        "replay, concurrency 1: 0.66",
    ]


def test_changing_a_figure_changes_the_chart() -> None:
    """A ratio edited in the table is the bar's value, label and length in the SVG."""
    text = BENCHMARKS.read_text(encoding="utf-8")
    row = "| new keys, concurrency 1 | 1,369 | 1,612 | **0.85** |"
    assert row in text
    before = _bars(_figures(chart.expand(text))[0])
    after = _bars(_figures(chart.expand(text.replace(row, row.replace("0.85", "0.42"))))[0])
    assert "new keys, concurrency 1: 0.85" not in after
    changed = after["new keys, concurrency 1: 0.42"]
    unchanged = after["new keys, concurrency 8: 0.69"]
    assert unchanged == before["new keys, concurrency 8: 0.69"]
    assert changed / unchanged == pytest.approx(0.42 / 0.69, rel=0.01)


def test_first_number_of_a_cell_and_series_names() -> None:
    """``**2.26x** (2.65x)`` draws 2.26; a "ratio" column is named by the column before it."""
    page = (
        "| workload | a | ratio | b | ratio |\n|---|---:|---:|---:|---:|\n"
        "| new | 1 | **2.26\N{MULTIPLICATION SIGN}** (2.65) | 2 | 1,234.5 |\n"
        "| old | 1 | | 2 | 0.5 |\n\n"
        '<!-- chart values="3,5" label="{1} keys" target="2" title="t" -->\n'
    )
    figure = _figures(chart.expand(page))[0]
    assert list(_bars(figure)) == ["new keys, a: 2.26", "new keys, b: 1,234.5", "old keys, b: 0.5"]
    assert figure.findtext(f"{SVG}svg/{SVG}title") == "t"
    assert figure.findtext("figcaption") == "t"


@pytest.mark.parametrize(
    ("page", "message"),
    [
        ('Some text.\n\n<!-- chart values="2" title="t" -->\n', "must follow a Markdown table"),
        ('| a | b |\n|---|---|\n| x | 1 |\n\n<!-- chart values="3" title="t" -->', "no column 3"),
        ('| a | b |\n|---|---|\n| x | y |\n\n<!-- chart values="2" title="t" -->', "no number"),
        ('| a | b |\n|---|---|\n| x | 1 |\n\n<!-- chart values="2" -->', "title"),
    ],
)
def test_a_marker_that_cannot_be_drawn_stops_the_build(page: str, message: str) -> None:
    """A wrong marker is an error naming the page and line, never a silently missing chart."""
    with pytest.raises(chart.ChartError, match=message) as info:
        chart.expand(page, "x.md")
    assert str(info.value).startswith("x.md:")


def test_the_site_hook_draws_the_charts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook that mkdocs.yml names expands the markers of a page."""
    monkeypatch.syspath_prepend(str(TOOLS))
    hooks = _load("mkdocs_hooks")
    page = SimpleNamespace(file=SimpleNamespace(src_uri="benchmarks.md"))
    out = hooks.on_page_markdown(BENCHMARKS.read_text(encoding="utf-8"), page=page)
    assert '<figure class="onceonly-chart">' in out
    assert "tools/mkdocs_hooks.py" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
