"""Why an ``edit``'s ``oldString`` cannot be applied, said so the caller can try again.

A refused edit says what the caller needs: where an ambiguous ``oldString`` occurs
(``multiple_matches``: the lines, an excerpt of each, how many more), or the text closest to
one that occurs nowhere (``no_match``: exact but for whitespace or letter case, found by one
regular expression search each; else the most similar by ``difflib``, first where pieces of
``oldString`` point to, then line by line up to a budget), with its line and how it differs.
Seed 002's words start each message. Nothing here changes the file: the closest text is
shown, never applied. The search has ``CLOSEST_BUDGET_S`` (``difflib`` can take quadratic
time): the writer runs ``no_match`` in a worker process, which stops it there
(``Context.compute``, ``infra/offload.py``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Any

from contracts.errors import ErrorCode, QuillError

MATCHES_LISTED = 10
"""Occurrences an ambiguous oldString's error lists (the rest are counted)."""
EXCERPT_CHARS = 120
"""At most this much of a line is shown for each occurrence."""
SCAN_OCCURRENCES = 1000
"""Occurrences looked at to list lines (a line may hold many)."""
CLOSEST_TEXT_CHARS = 800
"""At most this much of the closest text is shown."""
CLOSEST_MIN_SIMILARITY = 0.6
"""A candidate less similar than this (``difflib`` ratio) is not offered."""
Remaining = Callable[[], float]
"""Seconds left of a budget (core reads no clock: the caller hands this in)."""


def _unbounded() -> float:
    return 1.0


CLOSEST_BUDGET_S = 2.0
"""How long the search for the closest text may take (then the answer has none)."""
CLOSEST_BUDGET_CHARS = 1_000_000
"""The fuzzy search compares at most this many characters of the file (a large file is
searched from its start up to this bound; the error says how far)."""
CLOSEST_MAX_OLD_CHARS = 20_000
"""A longer oldString is not searched for fuzzily (exact-but-for-whitespace/case still is)."""
CLOSEST_ANCHORS = 10
"""Runs of lines that pieces of oldString point to, compared first."""
ANCHOR_CHARS = 6
ANCHOR_PIECES = 16
ANCHOR_HITS = 20_000
"""Occurrences of the pieces counted at most (a common piece occurs everywhere)."""


def line_of(text: str, pos: int) -> int:
    """The 1-based line holding ``text[pos]``."""
    return text.count("\n", 0, pos) + 1


def _excerpt(text: str, start: int) -> str:
    """The line holding ``text[start]``, cut to ``EXCERPT_CHARS`` around the match."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", start)
    line = text[line_start : len(text) if line_end < 0 else line_end].rstrip("\r")
    if len(line) <= EXCERPT_CHARS:
        return line
    col = start - line_start
    first = max(0, min(col - EXCERPT_CHARS // 3, len(line) - EXCERPT_CHARS))
    cut = line[first : first + EXCERPT_CHARS]
    return ("..." if first else "") + cut + ("..." if first + EXCERPT_CHARS < len(line) else "")


def occurrences(text: str, old: str) -> tuple[list[dict[str, Any]], int]:
    """Where ``old`` occurs in ``text``: the first ``MATCHES_LISTED`` lines holding it, each
    ``{line, excerpt}`` (``end_line`` when it spans lines, ``times`` when a line holds it more
    than once), and how many occurrences there are in all."""
    listed: list[dict[str, Any]] = []
    pos, line, counted_to, steps = text.find(old), 1, 0, 0
    spans = old.rstrip("\n").count("\n")
    while pos >= 0 and steps < SCAN_OCCURRENCES:
        line += text.count("\n", counted_to, pos)
        counted_to, steps = pos, steps + 1
        if listed and listed[-1]["line"] == line:
            listed[-1]["times"] = listed[-1].get("times", 1) + 1
        elif len(listed) == MATCHES_LISTED:
            break
        else:
            item: dict[str, Any] = {"line": line, "excerpt": _excerpt(text, pos)}
            if spans:
                item["end_line"] = line + spans
            listed.append(item)
        pos = text.find(old, pos + 1)
    total = max(text.count(old), sum(m.get("times", 1) for m in listed))  # count(): no overlaps
    return listed, total


def multiple_matches(path: str, text: str, old: str) -> QuillError:
    """``MULTIPLE_MATCHES`` for ``old`` in ``text`` (seed 002's words first), with where."""
    listed, total = occurrences(text, old)
    lines = [
        f"line {m['line']}"
        + (f"-{m['end_line']}" if "end_line" in m else "")
        + (f" ({m['times']} times)" if "times" in m else "")
        + f": {m['excerpt']}"
        for m in listed
    ]
    more = total - sum(m.get("times", 1) for m in listed)
    message = (
        "Found multiple matches for oldString. Provide more surrounding lines in oldString "
        "to identify the correct match, or set replace_all to replace every occurrence. "
        f"It occurs {total} times in {path}"
        + (f" (listed up to line {listed[-1]['line']}; {more} more after it)" if more > 0 else "")
        + ":\n"
        + "\n".join(lines)
    )
    details = {"path": path, "occurrences": total, "matches": listed}
    return QuillError(ErrorCode.MULTIPLE_MATCHES, message, details)


def no_match(path: str, text: str, old: str, *, remaining: Remaining | None = None) -> QuillError:
    """``NO_MATCH`` for ``old`` (seed 002's words first), with the closest text found before
    ``remaining()`` (seconds left of ``CLOSEST_BUDGET_S``) ran out, if any (without it, only
    ``CLOSEST_BUDGET_CHARS`` bounds the search). The writer runs it in a worker process
    (``Context.compute``)."""
    try:
        found, searched = closest(text, old, remaining or _unbounded)
    except TimeoutError:  # in difflib, at the budget (infra/offload_worker.py)
        found, searched = None, None
        details: dict[str, Any] = {"path": path, "closest": None, "closest_searched": False}
        return QuillError(
            ErrorCode.NO_MATCH,
            "oldString not found in content. The search for the closest text took too long: "
            "read the file again and copy the text exactly.",
            details,
        )
    details = {"path": path, "closest": found}
    if searched is not None:
        details["searched_lines"] = searched
    if found is None:
        where = f"the first {searched} lines of {path}" if searched is not None else path
        tail = f" Nothing in {where} is close to it: read the file again and copy the text exactly."
        return QuillError(ErrorCode.NO_MATCH, "oldString not found in content." + tail, details)
    span = f"line {found['line']}"
    if found["end_line"] != found["line"]:
        span = f"lines {found['line']}-{found['end_line']}"
    message = (
        f"oldString not found in content. The closest text in {path} is at {span} "
        f"({found['difference']}); nothing was changed. The file has there:\n{found['text']}"
    )
    return QuillError(ErrorCode.NO_MATCH, message, details)


def _spaces(ws: str) -> str:
    """``1 space``, ``4 spaces``, ``a tab``, or the whitespace as a literal."""
    if ws and set(ws) == {" "}:
        return "1 space" if len(ws) == 1 else f"{len(ws)} spaces"
    if ws == "\t":
        return "a tab"
    if ws and set(ws) == {"\t"}:
        return f"{len(ws)} tabs"
    return repr(ws) if ws else "none"


def _first_difference(old: str, found: str) -> str:
    """The first line where ``old`` and ``found`` differ, shown side by side."""
    ours, theirs = old.split("\n"), found.split("\n")
    counts = ""
    if len(ours) != len(theirs):
        counts = f"oldString has {len(ours)} lines where the file has {len(theirs)}; "
    pairs = list(zip(ours, theirs, strict=False))
    differing = [k for k, (a, b) in enumerate(pairs, start=1) if a != b]
    if not differing:
        return counts.removesuffix("; ") or "they differ"
    k = differing[0]
    a, b = pairs[k - 1]
    where = f"line {k} of oldString is " if len(ours) > 1 else "oldString has "
    more = f" ({len(differing)} lines differ)" if len(differing) > 1 else ""
    return f"{counts}{where}{a[:EXCERPT_CHARS]!r} where the file has {b[:EXCERPT_CHARS]!r}{more}"


def _whitespace_difference(text: str, start: int, end: int, old: str) -> str:
    """How ``old`` differs from ``text[start:end]`` (equal but for whitespace)."""
    facts: list[str] = []
    lead = old[: len(old) - len(old.lstrip())]
    before = text[max(0, start - 200) : start]
    has = before[len(before.rstrip(" \t")) :]
    if lead and not before.endswith(lead):
        facts.append(
            f"oldString starts with {_spaces(lead)}, the file has {_spaces(has)} before it "
            "(leading whitespace)"
        )
    trail = old[len(old.rstrip()) :]
    if trail and not text.startswith(trail, end):
        after = text[end : end + 200]
        follows = after[: len(after) - len(after.lstrip(" \t"))]
        facts.append(
            f"oldString ends with {_spaces(trail)}, the file has {_spaces(follows)} after it "
            "(trailing whitespace)"
        )
    core, found = old.strip(), text[start:end]
    if "\r" in found and "\r" not in core:
        facts.append("the file's lines end with \\r\\n (line endings)")
    elif core != found:
        facts.append(_first_difference(core, found) + " (spacing inside the text)")
    return "differs only in whitespace: " + "; ".join(facts or ["spacing"])


def _relaxed(text: str, old: str) -> tuple[int, int, str] | None:
    """The first place ``old`` occurs but for whitespace, or letter case, or both:
    ``(start, end, difference)``. Linear: one regular expression search each."""
    tokens = old.split()
    if not tokens:
        return None
    spaced = r"\s+".join(re.escape(t) for t in tokens)
    tries = (
        (spaced, 0, None),
        (re.escape(old), re.IGNORECASE, "differs only in letter case"),
        (spaced, re.IGNORECASE, "differs only in letter case and whitespace"),
    )
    for pattern, flags, difference in tries:
        found = re.search(pattern, text, flags)
        if found is None:
            continue
        start, end = found.span()
        if difference is None:
            return start, end, _whitespace_difference(text, start, end, old)
        return start, end, f"{difference}: " + _first_difference(old, text[start:end])
    return None


def _anchored(text: str, target: list[str]) -> list[int]:
    """Where a run of lines like the lines ``target`` may start (0-based): the starts that
    most pieces of ``target`` (``ANCHOR_CHARS`` characters each, ``ANCHOR_PIECES`` at most,
    spread over it) point to where they occur in ``text`` exactly. One regular expression
    search of the whole file: a near miss shares most of its pieces with the text it misses."""
    pieces: dict[str, set[int]] = {}
    for i, line in enumerate(target):
        core = line.strip()
        for at in range(0, len(core) - ANCHOR_CHARS + 1, ANCHOR_CHARS):
            pieces.setdefault(core[at : at + ANCHOR_CHARS], set()).add(i)
    if not pieces:
        return []
    chosen = list(pieces)
    chosen = chosen[:: max(1, len(chosen) // ANCHOR_PIECES)][:ANCHOR_PIECES]
    pattern = re.compile("|".join(re.escape(piece) for piece in chosen))
    votes: dict[int, int] = {}
    row, counted_to = 0, 0
    for n, found in enumerate(pattern.finditer(text)):
        if n == ANCHOR_HITS:
            break
        row += text.count("\n", counted_to, found.start())
        counted_to = found.start()
        for i in pieces[found.group()]:
            if row >= i:
                votes[row - i] = votes.get(row - i, 0) + 1
    return sorted(votes, key=lambda start: (-votes[start], start))[:CLOSEST_ANCHORS]


def _part(window: str, matcher: difflib.SequenceMatcher[str], size: int) -> tuple[str, float]:
    """The part of the line ``window`` (``matcher``'s first sequence) that the shorter text
    of ``size`` characters (its second) matches best, and how similar they are."""
    blocks = [b for b in matcher.get_matching_blocks() if b.size]
    if not blocks:
        return window, 0.0
    first, last = blocks[0], blocks[-1]
    lo = max(0, first.a - first.b)
    hi = min(len(window), last.a + last.size + (size - last.b - last.size))
    while 0 < lo < len(window) and window[lo - 1].isalnum() and window[lo].isalnum():
        lo -= 1  # whole words: "return 42", not "return 4", is what the file has
    while 0 < hi < len(window) and window[hi - 1].isalnum() and window[hi].isalnum():
        hi += 1
    matched = sum(b.size for b in blocks if lo <= b.a and b.a + b.size <= hi)
    return window[lo:hi], 2 * matched / (size + hi - lo)


def _similar(
    text: str, old: str, remaining: Remaining
) -> tuple[tuple[int, str, float] | None, int | None]:
    """The text most like ``old`` (``difflib``): a run of as many lines as ``old`` has, or for
    a one-line ``old``, part of a line; as ``(first line, text, similarity)``. Also the lines
    searched when the budget (``CLOSEST_BUDGET_CHARS``) ended the search before the end of the
    file (else None). The places pieces of ``old`` point to (``_anchored``) are compared
    first, in full; only when none is close enough is every run compared, in order, up to
    the budget (whole lines only)."""
    target = old.strip("\n")
    if not target.strip() or len(target) > CLOSEST_MAX_OLD_CHARS:
        return None, None
    lines = text.split("\n")
    span = target.count("\n") + 1
    matcher = difflib.SequenceMatcher(None, autojunk=False)
    matcher.set_seq2(target)
    best: tuple[int, str, float] | None = None
    score = CLOSEST_MIN_SIMILARITY

    def compare(first: int, bounded: bool) -> int:
        """Compare the run at ``first``; return what it cost."""
        nonlocal best, score
        window = "\n".join(lines[first : first + span])
        matcher.set_seq1(window)
        if bounded and (matcher.real_quick_ratio() < score or matcher.quick_ratio() < score):
            return len(window) + 1
        found, similarity = window, matcher.ratio()
        if span == 1 and len(window) > len(target) * 1.5:  # a piece of a longer line
            part, closeness = _part(window, matcher, len(target))
            if closeness > similarity:
                found, similarity = part, closeness
        if similarity > score or (best is None and similarity >= score):
            best, score = (first + 1, found, similarity), similarity
        return 10 * (len(window) + 1)  # a full comparison costs more than the cheap bounds

    for first in _anchored(text, target.split("\n")):
        compare(first, bounded=False)
    if best is not None:
        return best, None
    spent = 0
    for first in range(max(1, len(lines) - span + 1)):
        if spent > CLOSEST_BUDGET_CHARS or remaining() <= 0:
            return best, first
        spent += compare(first, bounded=True)
    return best, None


def closest(text: str, old: str, remaining: Remaining) -> tuple[dict[str, Any] | None, int | None]:
    """The text of ``text`` closest to ``old``, which occurs nowhere: ``{line, end_line,
    text, difference, similarity}`` or None; and, when the fuzzy search stopped at its
    budget, the number of lines it searched."""
    relaxed = _relaxed(text, old)
    searched = None
    if relaxed is not None:
        start, end, difference = relaxed
        first, found = line_of(text, start), text[start:end]
        similarity = 1.0
    else:
        best, searched = _similar(text, old, remaining)
        if best is None:
            return None, searched
        first, found, similarity = best
        difference = "differs: " + _first_difference(old.strip("\n"), found)
    shown = found if len(found) <= CLOSEST_TEXT_CHARS else found[:CLOSEST_TEXT_CHARS] + "..."
    item = {
        "line": first,
        "end_line": first + found.count("\n"),
        "text": shown,
        "difference": difference,
        "similarity": round(similarity, 3),
    }
    return item, searched
