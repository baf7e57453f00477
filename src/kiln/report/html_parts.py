"""Small HTML builders; every piece of text passes through ``html.escape`` here."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       max-width: 1000px; margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { border-bottom: 2px solid #c0552b; padding-bottom: .2em; }
h2 { margin-top: 1.8em; color: #7a3417; }
table { border-collapse: collapse; margin: .6em 0; }
th, td { border: 1px solid #ddd; padding: .3em .7em; text-align: left; vertical-align: top; }
th { background: #f6efe9; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; border: 1px solid #e3e3e3; padding: .8em; overflow-x: auto;
      white-space: pre-wrap; word-break: break-word; }
img { max-width: 100%; border: 1px solid #eee; margin: .4em 0; }
.missing { color: #8a6d3b; background: #fcf8e3; padding: .3em .6em; display: inline-block; }
.good { color: #2d7a2d; font-weight: bold; }
.bad { color: #a33; font-weight: bold; }
.muted { color: #777; font-size: .9em; }
"""


# C0 controls other than tab and newlines (a sampled NUL token makes the file "binary" to
# grep and is a parse error in HTML) shown as their Unicode control pictures; DEL and C1 as
# \xNN.
_CONTROLS = {c: chr(0x2400 + c) for c in range(32) if chr(c) not in "\t\n\r"}
_CONTROLS |= {c: f"\\x{c:02x}" for c in range(0x7F, 0xA0)}


def esc(text: object) -> str:
    """Escape any value's ``str`` for HTML text or attribute context; control characters
    become visible stand-ins, and a lone surrogate (a JSON ``"\\ud800"`` in samples.json, a
    run folder named in bytes that are not UTF-8) shows as ``\\ud800``: the page is written
    as UTF-8, which cannot hold one, and the whole report failed on it."""
    text = html.escape(str(text), quote=True).translate(_CONTROLS)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def section(title: str, body: str) -> str:
    """A titled section around already-safe ``body`` HTML."""
    return f"<section>\n<h2>{esc(title)}</h2>\n{body}\n</section>"


def unavailable(reason: str) -> str:
    """The note a section shows instead of content, e.g. 'eval.json missing'."""
    return f'<p class="missing">not available ({esc(reason)})</p>'


def paragraph(text: str, css_class: str = "") -> str:
    """One escaped paragraph, optionally with a CSS class."""
    cls = f' class="{esc(css_class)}"' if css_class else ""
    return f"<p{cls}>{esc(text)}</p>"


def pre(text: str) -> str:
    """Verbatim, escaped text."""
    return f"<pre>{esc(text)}</pre>"


def image(src: str, alt: str) -> str:
    """An image referenced by a relative path."""
    return f'<img src="{esc(src)}" alt="{esc(alt)}">'


def key_value_table(rows: Iterable[tuple[str, str]]) -> str:
    """A two-column table of (label, value) text pairs."""
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def grid_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A table with a header row; cells after the first are right-aligned numbers."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{esc(c)}</td>" if i == 0 else f'<td class="num">{esc(c)}</td>'
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def page(title: str, sections: Iterable[str], footer: str = "") -> str:
    """A complete HTML document with the inline stylesheet."""
    parts = "\n".join(sections)
    foot = f'<p class="muted">{esc(footer)}</p>' if footer else ""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"<h1>{esc(title)}</h1>\n{parts}\n{foot}\n</body>\n</html>\n"
    )
