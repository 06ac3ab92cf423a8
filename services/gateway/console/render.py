"""What the console shows of a file's text: lines highlighted by Pygments, and diffs (unified,
as the ``qry.diff`` op answers them, or side by side, from ``difflib``'s opcodes).

Highlighting is done token by token and cut at line ends here (not by Pygments' HTML
formatter), so that each line is a whole piece of markup a table cell can hold: a token that
spans lines (a docstring) is closed at each line end and opened again on the next.
Every line also carries its meaning in text (``+``, ``-``, a line number), never in colour alone.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from markupsafe import Markup, escape
from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_for_filename
from pygments.lexers.diff import DiffLexer
from pygments.token import STANDARD_TYPES, _TokenType
from pygments.util import ClassNotFound

HIGHLIGHT_MAX_BYTES = 512 * 1024
"""Past this, text is shown plain (Pygments on megabytes would hold the event loop)."""


def lexer_for(path: str) -> Lexer:
    try:
        lexer: Lexer = get_lexer_for_filename(path.rsplit("/", 1)[-1], stripnl=False)
        return lexer
    except ClassNotFound:
        plain: Lexer = TextLexer(stripnl=False)
        return plain


def _css_class(ttype: _TokenType) -> str:
    kind: _TokenType | None = ttype
    while kind is not None and kind not in STANDARD_TYPES:
        kind = kind.parent
    return "" if kind is None else str(STANDARD_TYPES[kind])


def highlight_lines(text: str, path: str, lexer: Lexer | None = None) -> list[Markup]:
    """Each line of ``text`` (without its newline) as escaped, highlighted HTML."""
    if len(text) > HIGHLIGHT_MAX_BYTES:
        return [escape(line) for line in text.split("\n")]
    lexer = lexer or lexer_for(path)
    lines: list[list[str]] = [[]]
    for ttype, value in lexer.get_tokens(text):
        css = _css_class(ttype)
        for i, part in enumerate(value.split("\n")):
            if i:
                lines.append([])
            if part:
                piece = str(escape(part))
                lines[-1].append(f'<span class="{css}">{piece}</span>' if css else piece)
    if text.endswith("\n") and lines and not lines[-1]:
        lines.pop()  # Pygments ends with a newline: not a line of the file
    wanted = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    return [Markup("".join(parts)) for parts in lines[:wanted]] if text else []


@dataclass(frozen=True)
class Side:
    number: int | None
    html: Markup


@dataclass(frozen=True)
class Row:
    """One row of a side-by-side diff: ``kind`` is ``same``, ``del``, ``add`` or ``change``."""

    kind: str
    old: Side
    new: Side


EMPTY = Side(None, Markup(""))


def side_by_side(old: str, new: str, path: str, context: int = 3) -> list[list[Row]]:
    """Hunks of rows, ``context`` unchanged lines around each change."""
    a, b = old.splitlines(), new.splitlines()
    lexer = lexer_for(path)
    ha, hb = highlight_lines(old, path, lexer), highlight_lines(new, path, lexer)
    hunks: list[list[Row]] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        rows: list[Row] = []
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                rows += [
                    Row("same", Side(i + 1, ha[i]), Side(j + 1, hb[j]))
                    for i, j in zip(range(i1, i2), range(j1, j2), strict=True)
                ]
                continue
            olds, news = list(range(i1, i2)), list(range(j1, j2))
            for k in range(max(len(olds), len(news))):
                left = Side(olds[k] + 1, ha[olds[k]]) if k < len(olds) else EMPTY
                right = Side(news[k] + 1, hb[news[k]]) if k < len(news) else EMPTY
                kind = "change" if left.number and right.number else "del" if left.number else "add"
                rows.append(Row(kind, left, right))
        hunks.append(rows)
    return hunks


@dataclass(frozen=True)
class Line:
    """One line of a unified diff: ``kind`` is ``add``, ``del``, ``hunk``, ``head`` or ``same``."""

    kind: str
    html: Markup


_KINDS = {"+": "add", "-": "del", "@": "hunk", " ": "same"}


def unified(diff: str) -> list[Line]:
    """A unified diff's lines, highlighted as a diff (the sign stays the first character)."""
    out: list[Line] = []
    for line, html in zip(
        diff.splitlines(), highlight_lines(diff, "x.diff", DiffLexer()), strict=False
    ):
        kind = _KINDS.get(line[:1], "same")
        if line.startswith(("+++", "---", "diff ", "index ")):
            kind = "head"
        out.append(Line(kind, html))
    return out
