"""Three-way merge of one text, line by line (diff3), with git's conflict markers.

Why written here: the one well-kept pure-Python diff3 on PyPI, Breezy's ``merge3``, is
GPL-2.0-or-later, which Quill (MIT) does not take in; ``diff-match-patch`` based mergers
(``three-merge``) merge characters, not lines, and report no conflicts. So this is the
classic algorithm (Khanna, Kuber and Pierce, "A formal investigation of diff3", 2007) on
``difflib.SequenceMatcher``: match base to ours and base to theirs; a base line matched on
both sides, next to the previous one on all three, is *stable*; the runs between stable
lines are *chunks*. A chunk one side left as in base takes the other side; a chunk both
sides made the same takes it once; any other chunk is a conflict. Changes that touch
(no stable line between them) conflict, as in ``git merge-file`` and GNU ``diff3``.

Lines end with ``\\n`` only (``core.content.split_lines``): a ``\\r`` stays part of its
line and a last line without a newline is a line, so a clean merge is the concatenation of
the three files' own lines: line endings and a missing final newline survive byte for byte.

Markers are git's (``xdiff/xmerge.c``, ``git merge-file --diff3``): seven ``<``, ``|``,
``=``, ``>``, then a space and the label; a side whose last line has no newline gets one;
the markers and that newline end with ``\\r\\n`` where the lines around them do (git's
``is_cr_needed``). The ``merge`` style leaves out the base section; git also narrows a
conflict to the lines the two sides do not share there (its "zealous" level), this does
not. ``SequenceMatcher`` runs with ``autojunk`` off (on, it ignores lines frequent in a
file, such as blank lines, as anchors) after trimming the common head and tail, so the usual
merge (small edits to a large file) costs time linear in the file; its worst case is
quadratic, which the caller bounds (``remaining``, and the writer's worker process).
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Literal

Style = Literal["diff3", "merge"]
"""``diff3``: conflicts show the base between the sides (``|||||||``); ``merge``: they don't."""


@dataclass(frozen=True)
class Clean:
    """Lines every side agrees on, or that one side changed alone."""

    lines: list[str]


@dataclass(frozen=True)
class Clash:
    """A chunk both sides changed, each differently; ``*_at``: its first line (0-based) in
    each file."""

    base: list[str]
    ours: list[str]
    theirs: list[str]
    base_at: int
    ours_at: int
    theirs_at: int


Chunk = Clean | Clash


def chunks(base: list[str], ours: list[str], theirs: list[str]) -> list[Chunk]:
    """The three files cut into clean runs and conflicts (adjacent clean runs joined)."""
    to_ours, to_theirs = _matched(base, ours), _matched(base, theirs)
    out: list[Chunk] = []
    b = o = t = 0
    while True:
        run = 0
        while b + run < len(base) and to_ours[b + run] == o + run and to_theirs[b + run] == t + run:
            run += 1
        if run:
            _clean(out, base[b : b + run])
            b, o, t = b + run, o + run, t + run
        if b == len(base) and o == len(ours) and t == len(theirs):
            return out
        j = b
        while j < len(base) and (to_ours[j] < 0 or to_theirs[j] < 0):
            j += 1
        jo, jt = (to_ours[j], to_theirs[j]) if j < len(base) else (len(ours), len(theirs))
        was, mine, other = base[b:j], ours[o:jo], theirs[t:jt]
        if mine == was or mine == other:
            _clean(out, other)
        elif other == was:
            _clean(out, mine)
        else:
            out.append(Clash(was, mine, other, b, o, t))
        b, o, t = j, jo, jt


def _clean(out: list[Chunk], lines: list[str]) -> None:
    if not lines:
        return
    if out and isinstance(out[-1], Clean):
        out[-1].lines.extend(lines)
    else:
        out.append(Clean(list(lines)))


def _matched(a: list[str], b: list[str]) -> list[int]:
    """For each line of ``a``, the line of ``b`` it is matched with (-1: none); the matches
    increase. The common head and tail are matched first, the rest by ``SequenceMatcher``."""
    n = min(len(a), len(b))
    head = 0
    while head < n and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < n - head and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    out = [-1] * len(a)
    for i in range(head):
        out[i] = i
    for i in range(tail):
        out[len(a) - tail + i] = len(b) - tail + i
    middle = SequenceMatcher(None, a[head : len(a) - tail], b[head : len(b) - tail], False)
    for i, j, size in middle.get_matching_blocks():
        for k in range(size):
            out[head + i + k] = head + j + k
    return out


def conflicts(merged: list[Chunk]) -> list[Clash]:
    return [c for c in merged if isinstance(c, Clash)]


def resolved(merged: list[Chunk], side: Literal["ours", "theirs"]) -> str:
    """The merged text, each conflict decided for ``side``."""
    parts: list[str] = []
    for c in merged:
        if isinstance(c, Clean):
            parts.extend(c.lines)
        else:
            parts.extend(c.ours if side == "ours" else c.theirs)
    return "".join(parts)


@dataclass(frozen=True)
class Labels:
    """What the markers name each side by (``<<<<<<< main@12``)."""

    ours: str
    base: str
    theirs: str


def marked(
    base: list[str],
    ours: list[str],
    theirs: list[str],
    merged: list[Chunk],
    labels: Labels,
    style: Style = "diff3",
) -> str:
    """The merged text with each conflict written between git's markers."""
    parts: list[str] = []
    for c in merged:
        if isinstance(c, Clean):
            parts.extend(c.lines)
            continue
        eol = "\r\n" if _needs_cr(base, ours, theirs, c) else "\n"
        parts.append(f"<<<<<<< {_label(labels.ours)}{eol}")
        parts.extend(_ended(c.ours, eol))
        if style == "diff3":
            parts.append(f"||||||| {_label(labels.base)}{eol}")
            parts.extend(_ended(c.base, eol))
        parts.append(f"======={eol}")
        parts.extend(_ended(c.theirs, eol))
        parts.append(f">>>>>>> {_label(labels.theirs)}{eol}")
    return "".join(parts)


def _label(text: str) -> str:
    """A label on one line (a name with a newline would end its marker early)."""
    return " ".join(text.split())


def _ended(lines: list[str], eol: str) -> list[str]:
    """``lines``, the last one given a newline if it has none (the marker after it must
    start a line)."""
    if lines and not lines[-1].endswith("\n"):
        return [*lines[:-1], lines[-1] + eol]
    return lines


def _needs_cr(base: list[str], ours: list[str], theirs: list[str], c: Clash) -> bool:
    """Whether the markers of ``c`` end in CRLF: the line before it on ours, then on
    theirs, then base's first line, as far as each says (git's ``is_cr_needed``)."""
    crlf: bool | None = None
    for lines, at in ((ours, c.ours_at), (theirs, c.theirs_at), (base, 0)):
        crlf = _crlf(lines, at - 1 if at else 0)
        if crlf is False:
            return False
    return crlf is True  # base's first line settles it


def _crlf(lines: list[str], i: int) -> bool | None:
    """Whether line ``i`` ends in CRLF (a last line without a newline: the one before it);
    None: cannot tell."""
    if not lines:
        return None
    line = lines[i]
    if i < len(lines) - 1 or line.endswith("\n"):
        return line.endswith("\r\n")
    if i == 0:
        return None
    return lines[i - 1].endswith("\r\n")
