"""Plain-text and HTML tables for the inspection views. Pure string building.

HTML is a few ``html.escape``-d tables with inline styles: no scripts, no
external CSS, so it renders the same in Jupyter, VS Code and a saved page.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

_TABLE = "border-collapse:collapse;margin:2px 0 8px 0;font-size:12px"
_CELL = "border:1px solid #d0d0d0;padding:2px 8px;text-align:left;vertical-align:top"
_HEAD = _CELL + ";background:#f3f3f3;font-weight:600"
_TITLE = "margin:8px 0 2px 0;font-size:13px;font-weight:600"


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def html_table(headers: Sequence[str], rows: Iterable[Sequence[object]], caption: str | None = None,
               raw_columns: frozenset[int] = frozenset()) -> str:
    """A ``<table>``; cells are escaped except in ``raw_columns`` (already HTML)."""
    head = "".join(f'<th style="{_HEAD}">{esc(h)}</th>' for h in headers)
    body = "".join(
        "<tr>" + "".join(
            f'<td style="{_CELL}">{cell if i in raw_columns else esc(cell)}</td>'
            for i, cell in enumerate(row)
        ) + "</tr>"
        for row in rows
    )
    cap = f'<caption style="{_TITLE};text-align:left">{esc(caption)}</caption>' if caption else ""
    return f'<table style="{_TABLE}">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def html_pairs(pairs: Iterable[tuple[str, object]], caption: str | None = None) -> str:
    """A two-column key/value table."""
    rows = "".join(
        f'<tr><th style="{_HEAD}">{esc(k)}</th><td style="{_CELL}">{esc(v)}</td></tr>' for k, v in pairs
    )
    cap = f'<caption style="{_TITLE};text-align:left">{esc(caption)}</caption>' if caption else ""
    return f'<table style="{_TABLE}">{cap}<tbody>{rows}</tbody></table>'


def html_title(text: str) -> str:
    return f'<div style="{_TITLE}">{esc(text)}</div>'


def html_block(*parts: str) -> str:
    """Wrap rendered parts in one container ``<div>``."""
    return '<div class="zephon-dask" style="font-family:monospace">' + "".join(parts) + "</div>"


def html_warnings(warnings: Sequence[str]) -> str:
    if not warnings:
        return ""
    items = "".join(f"<li>{esc(w)}</li>" for w in warnings)
    return f'<div style="color:#8a4b00;margin:4px 0">{html_title("warnings")}<ul>{items}</ul></div>'


def text_table(headers: Sequence[str], rows: Iterable[Sequence[object]], indent: str = "  ") -> str:
    """Left-aligned columns separated by two spaces."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(indent + line for line in lines)


def text_pairs(pairs: Iterable[tuple[str, object]], indent: str = "  ") -> str:
    pairs = [(str(k), str(v)) for k, v in pairs]
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{indent}{k.ljust(width)}  {v}" for k, v in pairs)


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more chars)"


def span(values: Sequence[int]) -> str:
    """``"3"`` when all values are equal, else ``"lo-hi"``."""
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi}"
