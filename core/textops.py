"""Pure text operations of ``modify``: line ranges and regex replacements.

Line operations name lines of the file as it was before the call (1-based) and must not
overlap; inserts at the same place keep their order. Regex replacements use Python ``re``
syntax (on RE2 in linear time where it says the same, else on ``regex``: ``core/regexes.py``)
and WAP's JavaScript-style replacement strings: ``$1``/``${1}``/``$<name>`` insert groups,
``$&`` the whole match, ``$$`` a dollar sign; any other character, backslashes included, is
literal. A modify's replacements together have ``REGEX_BUDGET_S``; the writer runs them in a
worker process (``Context.compute``, ``infra/offload.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from core.regexes import Spans, Subject, UserPattern

REGEX_BUDGET_S = 2.0
"""How long a modify's regex replacements may take, together."""
_TEMPLATE = re.compile(r"\$(?:(\$)|(&)|(\d+)|\{(\d+)\}|<([A-Za-z_]\w*)>)")

Remaining = Callable[[], float]
"""Seconds left of a budget (core reads no clock: the caller hands this in)."""

LineOp = rq.ReplaceLines | rq.InsertLines | rq.DeleteLines


def _block(content: str) -> list[str]:
    """New content as lines, each ending with a newline."""
    if not content:
        return []
    return [line + "\n" for line in content.removesuffix("\n").split("\n")]


def _invalid(message: str) -> QuillError:
    return QuillError(ErrorCode.INVALID_ARGUMENT, message)


def modify_lines(lines: Sequence[str], ops: Sequence[LineOp]) -> list[str]:
    """Apply the line operations to ``lines`` (each ending with its newline).

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a range outside the file or overlapping ranges.
    """
    n = len(lines)
    spans: list[tuple[int, int, int]] = []  # (start, end, op index), 1-based inclusive lines
    inserts: dict[int, list[str]] = {}
    replacements: dict[int, tuple[int, list[str]]] = {}
    for i, op in enumerate(ops):
        if isinstance(op, rq.InsertLines):
            if op.after_line > n:
                raise _invalid(f"insert after line {op.after_line}: the file has {n} lines")
            inserts.setdefault(op.after_line, []).extend(_block(op.new_content))
            continue
        if op.end_line < op.start_line:
            raise _invalid(f"line range {op.start_line}-{op.end_line} is reversed")
        if op.end_line > n:
            raise _invalid(
                f"line range {op.start_line}-{op.end_line} is outside the file ({n} lines)"
            )
        spans.append((op.start_line, op.end_line, i))
        new = _block(op.new_content) if isinstance(op, rq.ReplaceLines) else []
        replacements[op.start_line] = (op.end_line, new)
    spans.sort()
    for (s1, e1, _), (s2, e2, _) in zip(spans, spans[1:], strict=False):
        if s2 <= e1:
            raise _invalid(f"line ranges {s1}-{e1} and {s2}-{e2} overlap")
    for point in inserts:
        if any(s <= point < e for s, e, _ in spans):
            raise _invalid(f"insert after line {point} falls inside a replaced or deleted range")
    out = list(inserts.get(0, []))
    line = 1
    while line <= n:
        if line in replacements:
            end, new = replacements[line]
            out += new
            out += inserts.get(end, [])
            line = end + 1
            continue
        out.append(lines[line - 1] if lines[line - 1].endswith("\n") or line < n else lines[-1])
        if inserts.get(line) and not out[-1].endswith("\n"):
            out[-1] += "\n"
        out += inserts.get(line, [])
        line += 1
    return out


def regex_replaced(
    text: str, ops: Sequence[rq.RegexReplace], *, remaining: Remaining
) -> tuple[str, int]:
    """Apply the regex replacements ``ops`` in order; return the new text and the number of
    replacements.

    Raises:
        QuillError: what ``regex_replace`` raises.
    """
    replacements = 0
    for op in ops:
        text, n = regex_replace(text, op, remaining=remaining)
        replacements += n
    return text, replacements


def regex_replace(text: str, op: rq.RegexReplace, *, remaining: Remaining) -> tuple[str, int]:
    """Apply one regex replacement; return the new text and the number of replacements.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a bad pattern or group reference, ``NO_MATCH``
            when the pattern matches nothing, ``TIMEOUT`` when matching takes longer than
            ``remaining()``.
    """
    every = "g" in op.flags
    pattern = UserPattern(op.pattern, op.flags.replace("g", ""))
    subject = pattern.over(text, global_replace=every)
    names = pattern.groupindex
    try:
        out, count = subject.sub(
            lambda spans: _expand(subject, spans, names, op.replacement), every, remaining
        )
    except TimeoutError:
        raise QuillError(ErrorCode.TIMEOUT, f"regex {op.pattern!r} took too long") from None
    if count == 0:
        raise QuillError(
            ErrorCode.NO_MATCH, f"regex_replace pattern {op.pattern!r} matched nothing"
        )
    return out, count


def _expand(subject: Subject, spans: Spans, names: dict[str, int], replacement: str) -> str:
    """``replacement`` for one match: ``$1``, ``${1}``, ``$<name>``, ``$&`` and ``$$``."""

    def group(m: re.Match[str]) -> str:
        dollar, whole, num, braced, name = m.groups()
        if dollar:
            return "$"
        key = 0 if whole else int(num or braced) if (num or braced) else names.get(name, -1)
        if not 0 <= key < len(spans):
            raise _invalid(f"replacement refers to a missing group: {m.group(0)}")
        start, end = spans[key]
        return "" if start < 0 else subject.decode(subject.text[start:end])

    return _TEMPLATE.sub(group, replacement)
