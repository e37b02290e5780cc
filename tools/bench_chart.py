# SPDX-License-Identifier: MIT
"""Bar charts of the tables of docs/benchmarks.md, drawn as inline SVG when the site builds.

The figures stay where the benchmarks put them, in the Markdown tables; a marker on the
line after a table (a blank line between is allowed) asks for a chart of some of its
columns, and the MkDocs hook (tools/mkdocs_hooks.py) replaces the marker with the chart.
Pure Python, no plotting library, and no script in the page: the chart is in the HTML.

    | config | onceonly | baseline | ratio |
    |---|---:|---:|---:|
    | new keys | 1,369 | 1,612 | **0.85** |

    <!-- chart values="4" target="0.9" title="onceonly / baseline, msg/s" -->

Attributes of the marker:

* ``values`` (required): 1-based column numbers, comma-separated: one series each. A cell's
  value is the first number in it (``**2.26x** (2.65x)`` is 2.26); an empty cell draws
  no bar.
* ``names``: the series' names, comma-separated; by default each column's header, and
  for a header that is only "ratio", the header of the column before it.
* ``label``: each row's label, ``{n}`` standing for the text of column n (default ``{1}``).
* ``rows``: draw only the rows whose label contains this text.
* ``target``: a dashed line at this value, named "target".
* ``title`` (required): the caption, also the image's accessible name.

A line at 1 marks parity with the table's baseline. A marker that matches no table, names
a column the table does not have, or finds no number at all stops the build.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

MARKER = re.compile(r"^<!--\s*chart\s+(?P<attrs>.*?)\s*-->\s*$")
_ATTR = re.compile(r'(\w+)="([^"]*)"')
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_COLORS = ("#3f6ec6", "#e0862b", "#2e9e6b", "#9b59b6")

# geometry, in SVG user units (the SVG scales down to the column's width)
_CHAR = 6.6  # a generous width of one character at font-size 12
_PLOT_WIDTH = 400
_VALUE_ROOM = 60  # right of the plot, for the value of the longest bar
_BAR = 14
_BAR_GAP = 2
_GROUP_GAP = 10
_LEGEND_ROW = 20
_AXIS = 24
_TEXT = "fill:currentColor"
_HALO = "paint-order:stroke;stroke:var(--md-default-bg-color,#fff);stroke-width:3px"


class ChartError(ValueError):
    """A chart marker that cannot be drawn (the message names the file and line)."""


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Bar:
    row: str
    series: int
    value: float
    text: str


def _cells(line: str) -> list[str]:
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|"):
        body = body[:-1]
    return [_plain(cell) for cell in body.split("|")]


def _plain(cell: str) -> str:
    """A cell's text without Markdown emphasis and code marks."""
    return re.sub(r"[*`]", "", cell).strip()


def table_before(lines: Sequence[str], end: int) -> Table | None:
    """The Markdown table whose last row is at or just above ``lines[end - 1]``."""
    i = end
    if i > 0 and not lines[i - 1].strip():
        i -= 1  # one blank line between the table and the marker
    last = i
    while i > 0 and lines[i - 1].lstrip().startswith("|"):
        i -= 1
    block = lines[i:last]
    if len(block) < 3 or not re.fullmatch(r"\s*\|?[\s:|-]+\|?\s*", block[1]):
        return None
    return Table(_cells(block[0]), [_cells(row) for row in block[2:]])


def number(cell: str) -> tuple[float, str] | None:
    """The first number of a cell, as a value and as written (``1,369`` -> 1369.0)."""
    match = _NUMBER.search(cell)
    if match is None:
        return None
    text = match.group(0)
    return float(text.replace(",", "")), text


def _attrs(text: str) -> dict[str, str]:
    return dict(_ATTR.findall(text))


def _columns(spec: str, table: Table, where: str) -> list[int]:
    try:
        columns = [int(part) for part in spec.split(",")]
    except ValueError:
        raise ChartError(f"{where}: values must be column numbers, got {spec!r}") from None
    for column in columns:
        if not 1 <= column <= len(table.header):
            raise ChartError(f"{where}: the table has no column {column}")
    return columns


def _series_names(columns: list[int], table: Table, names: str | None) -> list[str]:
    if names is not None:
        return [name.strip() for name in names.split(",")]
    out = []
    for column in columns:
        header = table.header[column - 1]
        if header.lower() == "ratio" and column > 1:
            header = table.header[column - 2]
        out.append(header)
    return out


def _label(template: str, row: list[str], where: str) -> str:
    def cell(match: re.Match[str]) -> str:
        column = int(match.group(1))
        if not 1 <= column <= len(row):
            raise ChartError(f"{where}: the label names column {column}, rows have {len(row)}")
        return row[column - 1]

    return re.sub(r"\{(\d+)\}", cell, template)


def bars(table: Table, attrs: dict[str, str], where: str) -> tuple[list[str], list[Bar]]:
    """The series' names and the bars of a table, in the table's order."""
    if "values" not in attrs or "title" not in attrs:
        raise ChartError(f'{where}: a chart marker needs values="…" and title="…"')
    columns = _columns(attrs["values"], table, where)
    names = _series_names(columns, table, attrs.get("names"))
    if len(names) != len(columns):
        raise ChartError(f"{where}: {len(columns)} value columns but {len(names)} names")
    out = []
    for row in table.rows:
        label = _label(attrs.get("label", "{1}"), row, where)
        if attrs.get("rows", "") not in label:
            continue
        for series, column in enumerate(columns):
            found = number(row[column - 1]) if column <= len(row) else None
            if found is not None:
                out.append(Bar(label, series, found[0], found[1]))
    if not out:
        raise ChartError(f"{where}: no number in columns {attrs['values']}")
    return names, out


def _step(top: float) -> float:
    """A round tick step giving at most 6 ticks up to ``top``."""
    for step in (0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5, 10, 20, 25, 50, 100):
        if top / step <= 6:
            return step
    return float(10 ** math.ceil(math.log10(top)))


def _tick(value: float) -> str:
    return f"{value:g}"


def _width(text: str) -> float:
    return len(text) * _CHAR


def _legend(
    names: list[str], target: float | None, left: float, width: float
) -> tuple[list[str], int]:
    """Keys for the series (when there are several) and the lines, wrapped to ``width``;
    and how many rows they took."""
    keys: list[tuple[str, str]] = []
    if len(names) > 1:
        for series, name in enumerate(names):
            color = _COLORS[series % len(_COLORS)]
            keys.append(
                (f'<rect x="{{x}}" y="{{y}}" width="12" height="12" fill="{color}"/>', name)
            )
    keys.append(
        (
            '<line x1="{x}" y1="{m}" x2="{x12}" y2="{m}" style="stroke:currentColor" '
            'stroke-width="2"/>',
            "1 = baseline",
        )
    )
    if target is not None:
        keys.append(
            (
                '<line x1="{x}" y1="{m}" x2="{x12}" y2="{m}" stroke="#d0342c" stroke-width="2" '
                'stroke-dasharray="4 2"/>',
                f"target {_tick(target)}",
            )
        )
    out, x, row = [], left, 0
    for mark, name in keys:
        room = 18 + _width(name) + 16
        if x + room > left + width and x > left:
            x, row = left, row + 1
        y = 4 + row * _LEGEND_ROW
        out.append(
            mark.format(x=x, y=y, m=y + 6, x12=x + 12)
            + f'<text x="{x + 18}" y="{y + 10}" style="{_TEXT}">{escape(name)}</text>'
        )
        x += room
    return out, row + 1


def svg(title: str, names: list[str], chart: list[Bar], target: float | None) -> str:
    """One horizontal bar chart: one group of bars per row, one bar per series."""
    rows = list(dict.fromkeys(bar.row for bar in chart))
    per_row = len(names)
    label_right = 10 + max(_width(row) for row in rows)
    plot_left = label_right + 10
    width = plot_left + _PLOT_WIDTH + _VALUE_ROOM
    legend, legend_rows = _legend(names, target, plot_left, _PLOT_WIDTH + _VALUE_ROOM)
    top = legend_rows * _LEGEND_ROW + 10
    group = per_row * _BAR + (per_row - 1) * _BAR_GAP
    plot_height = len(rows) * group + (len(rows) - 1) * _GROUP_GAP
    bottom = top + plot_height
    height = bottom + _AXIS + 4
    peak = max([bar.value for bar in chart] + [1.0] + ([target] if target is not None else []))
    step = _step(peak * 1.08)
    scale_max = step * math.ceil(peak * 1.08 / step)

    def x(value: float) -> float:
        return plot_left + _PLOT_WIDTH * max(value, 0.0) / scale_max

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height}" '
        f'width="{width:.0f}" height="{height}" role="img" aria-label="{escape(title)}" '
        'font-size="12" style="font-family:var(--md-text-font-family,sans-serif)">',
        f"<title>{escape(title)}</title>",
        *legend,
    ]
    tick = 0.0
    while tick <= scale_max + 1e-9:
        tx = x(tick)
        out.append(
            f'<line x1="{tx:.1f}" y1="{top - 4}" x2="{tx:.1f}" y2="{bottom + 4}" '
            'style="stroke:currentColor" stroke-opacity="0.12"/>'
            f'<text x="{tx:.1f}" y="{bottom + 18}" text-anchor="middle" style="{_TEXT}" '
            f'fill-opacity="0.7">{_tick(tick)}</text>'
        )
        tick = round(tick + step, 6)
    values = []
    for index, row in enumerate(rows):
        y0 = top + index * (group + _GROUP_GAP)
        out.append(
            f'<text x="{label_right:.1f}" y="{y0 + group / 2 + 4:.1f}" text-anchor="end" '
            f'style="{_TEXT}">{escape(row)}</text>'
        )
        for bar in (b for b in chart if b.row == row):
            y = y0 + bar.series * (_BAR + _BAR_GAP)
            color = _COLORS[bar.series % len(_COLORS)]
            name = f"{row}, {names[bar.series]}" if per_row > 1 else row
            out.append(
                f'<rect class="onceonly-chart-bar" x="{plot_left:.1f}" y="{y}" '
                f'width="{x(bar.value) - plot_left:.1f}" height="{_BAR}" fill="{color}" '
                f'data-value="{bar.value:g}"><title>{escape(name)}: {escape(bar.text)}'
                "</title></rect>"
            )
            values.append(
                f'<text x="{x(bar.value) + 4:.1f}" y="{y + _BAR - 3}" '
                f'style="{_TEXT};{_HALO}">{escape(bar.text)}</text>'
            )
    lines = [(1.0, 'style="stroke:currentColor" stroke-width="1.5"')]
    if target is not None:
        lines.append((target, 'stroke="#d0342c" stroke-width="1.5" stroke-dasharray="5 3"'))
    for value, stroke in lines:
        out.append(
            f'<line x1="{x(value):.1f}" y1="{top - 6}" x2="{x(value):.1f}" y2="{bottom + 4}" '
            f"{stroke}/>"
        )
    out.extend(values)
    out.append("</svg>")
    return "".join(out)


def figure(table: Table, attrs: dict[str, str], where: str) -> str:
    """The chart of one marker as a raw-HTML block (one line: Markdown keeps it whole)."""
    names, chart = bars(table, attrs, where)
    target = None
    if "target" in attrs:
        try:
            target = float(attrs["target"])
        except ValueError:
            raise ChartError(f"{where}: target must be a number") from None
    title = attrs["title"]
    return (
        '<figure class="onceonly-chart">'
        + svg(title, names, chart, target)
        + f"<figcaption>{escape(title)}</figcaption></figure>"
    )


def expand(markdown: str, path: str = "<page>") -> str:
    """Replace every chart marker of a page with the chart of the table above it."""
    lines = markdown.split("\n")
    out = list(lines)
    for i, line in enumerate(lines):
        match = MARKER.match(line)
        if match is None:
            continue
        where = f"{path}:{i + 1}"
        table = table_before(lines, i)
        if table is None:
            raise ChartError(f"{where}: a chart marker must follow a Markdown table")
        out[i] = figure(table, _attrs(match.group("attrs")), where)
    return "\n".join(out)
