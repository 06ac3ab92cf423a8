"""One file both sides of a merge changed, as text: merged line by line (``core.diff3``),
its conflicts decided by the strategy, and the bounded three-way view of them
(``core.merge``'s rules)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from contracts.errors import ErrorCode, QuillError, no_content
from core.content import as_text, split_lines
from core.diff3 import Clash, Labels, Style, chunks, conflicts, marked, resolved
from core.merge_types import Conflict, ConflictKind, Entry, File, Hunk, Resolution, Side, Sides


@dataclass(frozen=True)
class Texts:
    """What merging texts reads: contents by sha256, the markers' labels and style, the
    strategy and the time left."""

    content: Callable[[str], bytes | None]
    labels: Labels
    style: Style
    strategy: str
    remaining: Callable[[], float]


@dataclass
class View:
    """The three-way views still to give: ``hunks`` a conflict, ``side_bytes`` a side of a
    hunk, ``left`` bytes for the whole plan."""

    hunks: int
    side_bytes: int
    left: int

    def of(self, clashes: list[Clash]) -> list[Hunk]:
        out: list[Hunk] = []
        for c in clashes[: self.hunks]:
            if self.left <= 0:
                break
            (base, b_cut), (ours, o_cut), (theirs, t_cut) = (
                self._cut(c.base),
                self._cut(c.ours),
                self._cut(c.theirs),
            )
            self.left -= len(base) + len(ours) + len(theirs)
            out.append(
                Hunk(
                    base_line=c.base_at + 1,
                    ours_line=c.ours_at + 1,
                    theirs_line=c.theirs_at + 1,
                    base=base,
                    ours=ours,
                    theirs=theirs,
                    cut=b_cut or o_cut or t_cut,
                )
            )
        return out

    def _cut(self, lines: list[str]) -> tuple[str, bool]:
        text = "".join(lines)
        raw = text.encode()
        if len(raw) <= self.side_bytes:
            return text, False
        head = raw[: self.side_bytes].decode("utf-8", "ignore")
        end = head.rfind("\n")
        return (head[: end + 1] if end >= 0 else head), True


@dataclass(frozen=True)
class Outcome:
    data: bytes | None
    """The file's merged content; None: the path goes to the side its conflict was decided
    for (or stays ours, the plan refused)."""
    executable: bool = False
    conflict: Conflict | None = None
    marked: bool = False


def merge_texts(row: Sides, texts: Texts, view: View) -> Outcome:
    """Merge ``row`` 's three texts (no base file: an empty base, as git merges two new
    files).

    Raises:
        QuillError: ``UNAVAILABLE`` (a content missing), ``SIZE_LIMIT_EXCEEDED`` (no time
            left to merge it).
    """
    assert isinstance(row.ours, File) and isinstance(row.theirs, File)
    if texts.remaining() <= 0:
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"Too large to merge here: {row.path} did not merge in the time a merge has; "
            "merge with ours or theirs, or make the change smaller",
            {"path": row.path, "reason": "merge_budget"},
        )
    pick = side_of(texts.strategy)
    has_base = isinstance(row.base, File)
    base = as_text(_read(row.base, row.path, texts)) if has_base else ""
    ours, theirs = (as_text(_read(e, row.path, texts)) for e in (row.ours, row.theirs))
    if base is None or ours is None or theirs is None:
        kind: ConflictKind = "binary" if has_base else "add_add"
        return Outcome(None, conflict=conflict_of(row, kind, pick))
    if isinstance(row.base, File) and row.ours.executable == row.base.executable:
        executable = row.theirs.executable
    elif has_base or row.ours.executable == row.theirs.executable:
        executable = row.ours.executable
    elif ours == theirs:  # two new files, the same text, one executable
        return Outcome(None, conflict=conflict_of(row, "mode", pick))
    else:
        executable = (row.theirs if pick == "theirs" else row.ours).executable
    lines = split_lines(base), split_lines(ours), split_lines(theirs)
    merged = chunks(*lines)
    clashes = conflicts(merged)
    if not clashes:
        return Outcome(resolved(merged, "ours").encode(), executable)
    hunks = view.of(clashes)
    kind = "content" if has_base else "add_add"
    if pick is not None:
        data = resolved(merged, pick).encode()
        return Outcome(data, executable, conflict_of(row, kind, pick, hunks, len(clashes)))
    if texts.strategy == "markers":
        text = marked(*lines, merged, texts.labels, texts.style)
        conflict = conflict_of(row, kind, "markers", hunks, len(clashes))
        return Outcome(text.encode(), executable, conflict, marked=True)
    return Outcome(None, conflict=conflict_of(row, kind, None, hunks, len(clashes)))


def side_of(strategy: str) -> Side | None:
    """The side a strategy decides every conflict for, if it does."""
    return "ours" if strategy == "ours" else "theirs" if strategy == "theirs" else None


def _read(entry: Entry, path: str, texts: Texts) -> bytes:
    assert isinstance(entry, File)
    data = texts.content(entry.sha256)
    if data is None:
        raise no_content(path, entry.sha256)
    return data


def conflict_of(
    row: Sides,
    kind: ConflictKind,
    resolution: Resolution | None,
    hunks: list[Hunk] | None = None,
    total: int = 0,
    paths: list[str] | None = None,
    paths_total: int = 0,
) -> Conflict:
    """The conflict at ``row`` 's path, with both sides' entries."""
    return Conflict(
        path=row.path,
        kind=kind,
        base=row.base,
        ours=row.ours,
        theirs=row.theirs,
        hunks=hunks or [],
        hunks_total=total,
        paths=paths or [],
        paths_total=paths_total,
        resolution=resolution,
    )
