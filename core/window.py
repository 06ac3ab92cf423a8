"""Which lines a ``read`` returns: pure functions, no I/O.

A read asks for a window of lines: the whole file, ``head`` (its first lines), ``tail`` (its
last lines) or ``offset``/``limit`` (a range, 1-based), optionally from a character of its first
line (``char_offset``). The read limits (``max_read_lines``, ``max_read_bytes``) then cut the
window at the end it is anchored to: a ``tail`` keeps its *last* lines, every other window its
first. A line longer than ``max_read_bytes`` is cut within itself (its start, or for a tail its
end). What a limit leaves out is named in the answer (``ReadCut``), with the read that returns
it (for a tail the lines before the ones returned, otherwise the lines after): that read may be
cut in turn, and its own ``ReadCut`` names the next, so following them reads the whole window.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import Limits


@dataclass(frozen=True)
class Window:
    """The lines asked for: ``lines`` are lines ``first``.. of the file, the first of them from
    character ``start_char``; ``from_end``: a limit keeps the window's end (a tail)."""

    first: int
    lines: list[str]
    start_char: int = 0
    from_end: bool = False

    @property
    def last(self) -> int:
        return self.first + len(self.lines) - 1


@dataclass(frozen=True)
class Shown:
    """What a read returns of its window: lines ``first``..``first + len(lines) - 1``, the
    first from character ``start_char``; ``end_char`` when the last one stops within itself;
    ``cut`` what a limit left out."""

    first: int
    lines: list[str]
    start_char: int = 0
    end_char: int | None = None
    cut: rp.ReadCut | None = None


def _refuse(message: str) -> QuillError:
    return QuillError(ErrorCode.INVALID_ARGUMENT, message)


def window(lines: list[str], req: rq.ReadFile) -> Window:
    """The window ``req`` asks for.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for combinations that do not make sense.
    """
    if req.head is not None and req.tail is not None:
        raise _refuse("Give head or tail, not both")
    if (req.head is not None or req.tail is not None) and (
        req.offset is not None or req.limit is not None
    ):
        raise _refuse("head/tail cannot be combined with offset/limit")
    if req.tail is not None:
        if req.char_offset:
            raise _refuse("char_offset cannot be combined with tail: give offset (the line)")
        start = max(len(lines) - req.tail, 0) if req.tail else len(lines)
        return Window(start + 1, lines[start:], from_end=True)
    if req.head is not None:
        chosen = lines[: req.head]
    else:
        start = (req.offset or 1) - 1
        end = len(lines) if req.limit is None else start + req.limit
        chosen = lines[start:end]
    first = 1 if req.head is not None else (req.offset or 1)
    if req.char_offset and chosen:
        line = chosen[0]
        if req.char_offset > len(line):
            raise _refuse(
                f"char_offset {req.char_offset} is past the end of line {first} "
                f"({len(line)} characters)"
            )
        chosen = [line[req.char_offset :], *chosen[1:]]
    return Window(first, chosen, req.char_offset if chosen else 0)


def _part(line: str, most: int, from_end: bool) -> str:
    """As much of ``line`` as fits in ``most`` bytes (its start, or its end), whole characters
    only, at least one character."""
    data = line.encode()
    kept = (data[-most:] if from_end else data[:most]).decode("utf-8", "ignore")
    if kept:
        return kept
    return line[-1:] if from_end else line[:1]


def cap(win: Window, limits: Limits) -> Shown:
    """The part of ``win`` a read returns: at most ``max_read_lines`` lines and
    ``max_read_bytes`` bytes, kept from the window's anchored end."""
    most_lines, most_bytes = limits.max_read_lines, limits.max_read_bytes
    order = reversed(win.lines) if win.from_end else iter(win.lines)
    kept: list[str] = []
    used = 0
    by: rp.ReadLimit | None = None
    for line in order:
        if len(kept) == most_lines:
            by = "lines"
            break
        size = len(line.encode())
        if used + size > most_bytes:
            by = "bytes"
            if not kept:  # one line longer than a read returns: a part of it
                kept.append(_part(line, most_bytes, win.from_end))
            break
        kept.append(line)
        used += size
    if win.from_end:
        kept.reverse()
    if by is None:
        return Shown(win.first, kept, win.start_char if kept else 0)
    return _cut(win, kept, by, limits)


def _cut(win: Window, kept: list[str], by: rp.ReadLimit, limits: Limits) -> Shown:
    """The answer for a window a limit cut, with what it left out and the read that gets it."""
    most = limits.max_read_lines if by == "lines" else limits.max_read_bytes
    first_kept = win.last - len(kept) + 1 if win.from_end else win.first
    whole = win.lines[first_kept - win.first]
    partial = len(kept) == 1 and len(kept[0]) < len(whole)
    if win.from_end:
        # the lines before the ones returned (and the start of a line returned in part)
        start_char = len(whole) - len(kept[0]) if partial else 0
        missing_last = first_kept if partial else first_kept - 1
        cut = rp.ReadCut(
            by=by,
            max=most,
            first_missing=win.first,
            last_missing=missing_last,
            offset=win.first,
            limit=missing_last - win.first + 1,
            char_offset=0,
            line=first_kept if partial else None,
            line_length=len(whole) if partial else None,
        )
        return Shown(first_kept, kept, start_char, None, cut)
    start_char = win.start_char if first_kept == win.first else 0
    if partial:  # the first line returned in part: the rest of it, then the window's rest
        end_char = start_char + len(kept[0])
        missing_first, char_offset = first_kept, end_char
    else:
        end_char, missing_first, char_offset = None, first_kept + len(kept), 0
    cut = rp.ReadCut(
        by=by,
        max=most,
        first_missing=missing_first,
        last_missing=win.last,
        offset=missing_first,
        limit=win.last - missing_first + 1,
        char_offset=char_offset,
        line=first_kept if partial else None,
        line_length=start_char + len(whole) if partial else None,
    )
    return Shown(first_kept, kept, start_char, end_char, cut)
