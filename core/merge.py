"""The three-way merge of a workspace into another, decided per path: which changes to make
on the target and which conflicts stop them (issue 33). Pure, like all of ``core``.

**Input is what changed, never the tree.** The caller hands one ``Sides`` per path changed
on either side since the merge base (its ``changed`` versions tell which), with the entry
base, ours (the target) and theirs have there, and a ``content`` getter by sha256. The cost
is O(paths given): a path given whose sides both equal base is dropped; ``needs`` names the
only contents read, those of the texts both sides changed (fetch them first, as the writer
does for its decisions).

**Rules.** A path one side changed is taken from it; both sides made the same change: taken
once. A text both changed merges line by line (``core.diff3``): only overlapping hunks
conflict. Binary files both changed, a file removed on one side and changed on the other
(``delete_modify``), two different new files (``add_add``, merged against an empty base),
and a file on one side where the other has a directory with changes below it
(``file_directory``: the paths below go with it) conflict. Removing a file on both sides
agrees: a directory one side made in its place is taken. A directory one side removed
stays where the other side put or kept a changed path in it (git keeps the file; the
removal of the rest stands). The executable bit merges three-way; two new files with the
same content and a different bit are a ``mode`` conflict.

**Strategies.** ``fail`` (the default): any conflict refuses the plan (no changes, every
conflict listed). ``ours`` / ``theirs``: each conflict is decided for that side, a text
hunk by hunk (git's ``-X ours``), any other conflict for the whole entry (a
``file_directory`` with the paths below it); the conflicts are still listed, each with its
``resolution``. ``markers``: a text conflict is written with git's markers (``diff3``
style by default, labels naming the workspaces and versions) and listed in ``marked``. A
binary, delete/modify, file/directory or mode conflict refuses the plan as ``fail`` does:
markers cannot hold it, and a merge that kept one side would move the merge base past the
other side's change, so a later merge would never offer it again.

**Bounds.** A file the plan puts is at most ``max_file_bytes`` (the target's limit) or the
plan is refused with ``SIZE_LIMIT_EXCEEDED``; the merges stop at the ``remaining`` budget
(``SIZE_LIMIT_EXCEEDED``, "too large to merge here"); a conflict's view holds at most
``VIEW_HUNKS`` hunks of ``VIEW_SIDE_BYTES`` a side and the whole plan's views
``VIEW_BYTES``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

from contracts import hashing
from contracts.errors import ErrorCode, QuillError
from contracts.events import MakeDir, Remove
from contracts.paths import ancestors
from core.diff3 import Labels, Style
from core.merge_text import Texts, View, conflict_of, merge_texts, side_of
from core.merge_types import (
    Conflict,
    ConflictKind,
    Dir,
    Entry,
    File,
    MergePlan,
    PlanChange,
    Put,
    Resolution,
    Sides,
    Strategy,
    same,
)

VIEW_HUNKS = 10
VIEW_SIDE_BYTES = 2048
VIEW_BYTES = 256 * 1024
VIEW_PATHS = 100
STRATEGIES = ("fail", "ours", "theirs", "markers")


def needs(changed: Iterable[Sides]) -> list[str]:
    """The sha256 of the contents ``plan`` will read: base, ours and theirs of each text
    both sides changed differently (nothing else is read)."""
    rows = _rows(changed)
    groups = _groups(rows)
    wanted: dict[str, None] = {}
    for row in rows.values():
        if _grouped(row.path, groups) is None and _text_both(row):
            for entry in (row.base, row.ours, row.theirs):
                if isinstance(entry, File):
                    wanted[entry.sha256] = None
    return list(wanted)


def plan(
    changed: Iterable[Sides],
    strategy: Strategy,
    content: Callable[[str], bytes | None],
    *,
    labels: Labels,
    max_file_bytes: int,
    style: Style = "diff3",
    remaining: Callable[[], float] = lambda: 1.0,
) -> MergePlan:
    """The merge of theirs into ours, given the paths changed on either side.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` (an unknown strategy, a path given twice or the
            root), ``UNAVAILABLE`` (a content ``needs`` named is missing),
            ``SIZE_LIMIT_EXCEEDED`` (a file put over ``max_file_bytes``; the merges past
            the ``remaining`` budget).
    """
    if strategy not in STRATEGIES:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Unknown merge strategy {strategy!r} (one of {', '.join(STRATEGIES)})",
            {"strategy": strategy},
        )
    rows = _rows(changed)
    groups = _groups(rows)
    view = View(VIEW_HUNKS, VIEW_SIDE_BYTES, VIEW_BYTES)
    texts = Texts(content, labels, style, strategy, remaining)
    result: dict[str, Entry] = {}
    data: dict[str, bytes] = {}
    conflicts: list[Conflict] = []
    marked: list[str] = []
    merged: list[str] = []
    pick = side_of(strategy)
    for path, row in rows.items():
        root = _grouped(path, groups)
        if root is not None:
            result[path] = _side(row, pick)  # the side chosen for the root, for all
            if path == root:
                below = groups[root]
                conflicts.append(
                    conflict_of(
                        row,
                        "file_directory",
                        pick,
                        paths=below[:VIEW_PATHS],
                        paths_total=len(below),
                    )
                )
            continue
        kind, entry = _decide(row)
        if kind is None:
            result[path] = entry
        elif kind == "text":
            out = merge_texts(row, texts, view)
            if out.conflict is not None:
                conflicts.append(out.conflict)
            if out.data is None:
                result[path] = _side(row, pick)
                continue
            if out.marked:
                marked.append(path)
            elif out.conflict is None:
                merged.append(path)
            result[path] = File(
                sha256=hashing.content_sha256(out.data),
                size=len(out.data),
                executable=out.executable,
            )
            data[path] = out.data
        else:
            conflicts.append(conflict_of(row, kind, pick))
            result[path] = _side(row, pick)
    refused = _refused(strategy, conflicts)
    if refused is not None:
        return MergePlan(changes=[], conflicts=conflicts, marked=[], merged=merged, refused=refused)
    _promote(result)
    changes = _changes(rows, result, data)
    for change in changes:
        if isinstance(change, Put) and change.size > max_file_bytes:
            raise QuillError(
                ErrorCode.SIZE_LIMIT_EXCEEDED,
                f"Merged file too large: {change.path} would be {change.size} bytes "
                f"(limit {max_file_bytes})",
                {"path": change.path, "size": change.size, "max_file_bytes": max_file_bytes},
            )
    return MergePlan(changes=changes, conflicts=conflicts, marked=marked, merged=merged)


# ---------------------------------------------------------------- which paths, which groups


def _rows(changed: Iterable[Sides]) -> dict[str, Sides]:
    """The paths some side changed, outermost first."""
    rows: dict[str, Sides] = {}
    for row in changed:
        if not row.path:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, "The root is not a path to merge")
        if row.path in rows:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT, f"Path given twice: {row.path}", {"path": row.path}
            )
        if not (same(row.ours, row.base) and same(row.theirs, row.base)):
            rows[row.path] = row
    return {p: rows[p] for p in sorted(rows, key=lambda p: p.split("/"))}


def _groups(rows: dict[str, Sides]) -> dict[str, list[str]]:
    """The ``file_directory`` conflicts: each path where one side has a file it changed
    and the other a directory it changed at or below, with the changed paths below it."""
    clash = {p for p, r in rows.items() if {type(r.ours), type(r.theirs)} == {File, Dir}}
    below: dict[str, list[str]] = {p: [] for p in clash}
    for path in rows:
        for a in ancestors(path):
            if a in below:
                below[a].append(path)
    groups: dict[str, list[str]] = {}
    for p in sorted(clash, key=lambda p: p.split("/")):
        if _grouped(p, groups) is not None:
            continue
        r = rows[p]
        file_side, dir_side = ("ours", "theirs") if isinstance(r.ours, File) else ("theirs", "ours")
        if same(getattr(r, file_side), r.base):
            continue  # only the directory's side changed here: taken from it
        if not same(getattr(r, dir_side), r.base) or any(
            not same(getattr(rows[q], dir_side), rows[q].base) for q in below[p]
        ):
            groups[p] = below[p]
    return groups


def _grouped(path: str, groups: dict[str, list[str]]) -> str | None:
    """The ``file_directory`` conflict ``path`` is part of (its root), if any."""
    if not groups:
        return None
    for a in [*ancestors(path), path]:
        if a in groups:
            return a
    return None


# ---------------------------------------------------------------- one path


def _decide(row: Sides) -> tuple[ConflictKind | Literal["text"] | None, Entry]:
    """``(None, entry)``: the path merges to ``entry``; ``("text", None)``: a text to merge
    by lines; otherwise the kind of conflict."""
    base, ours, theirs = row.base, row.ours, row.theirs
    if same(theirs, base) or same(ours, theirs):
        return None, ours
    if same(ours, base):
        return None, theirs
    if isinstance(ours, File) and isinstance(theirs, File):
        if _text_both(row):
            return "text", None
        return ("binary" if isinstance(base, File) else "add_add"), None
    if ours is None or theirs is None:
        other = theirs if ours is None else ours
        if isinstance(base, File) and isinstance(other, File):
            return "delete_modify", None
        return None, other  # both removed what base had; one side made something new there
    return "file_directory", None  # a file against a directory: ``_groups`` took it first


def _text_both(row: Sides) -> bool:
    """Both sides have a text file there, changed differently: merged by lines."""
    files = [e for e in (row.base, row.ours, row.theirs) if isinstance(e, File)]
    return (
        isinstance(row.ours, File)
        and isinstance(row.theirs, File)
        and not same(row.ours, row.base)
        and not same(row.theirs, row.base)
        and not same(row.ours, row.theirs)
        and not any(f.binary for f in files)
    )


def _side(row: Sides, pick: Resolution | None) -> Entry:
    """The entry a conflict is decided to (ours when undecided: nothing changes)."""
    return row.theirs if pick == "theirs" else row.ours


def _refused(strategy: Strategy, conflicts: list[Conflict]) -> str | None:
    left = [c for c in conflicts if c.resolution is None]
    if not left:
        return None
    if strategy == "fail":
        return f"{len(left)} conflict(s); merge with ours, theirs or markers, or resolve first"
    kinds = sorted({c.kind for c in left})
    return (
        f"{len(left)} conflict(s) markers cannot hold ({', '.join(kinds)}): merge with ours "
        "or theirs, or resolve them on either side first"
    )


# ---------------------------------------------------------------- the changes


def _promote(result: dict[str, Entry]) -> None:
    """A path the merge keeps needs its parents: a parent the merge removed stays, as a
    directory."""
    for path, entry in list(result.items()):
        if entry is None:
            continue
        for a in ancestors(path):
            if a in result and result[a] is None:
                result[a] = Dir()
            elif isinstance(result.get(a), File):  # _groups makes this a conflict
                raise QuillError(ErrorCode.INTERNAL, f"Merge put {path} below the file {a}")


def _changes(
    rows: dict[str, Sides], result: dict[str, Entry], data: dict[str, bytes]
) -> list[PlanChange]:
    """What turns ours into the result, parents first, a removal before what replaces it
    (a removed directory takes what is below it)."""
    changes: list[PlanChange] = []
    removed: set[str] = set()
    for path, entry in result.items():  # outermost first (``_rows``)
        ours = rows[path].ours
        if same(entry, ours):
            continue
        if ours is not None and (entry is None or type(entry) is not type(ours)):
            if not any(a in removed for a in ancestors(path)):
                changes.append(Remove(path=path))
            removed.add(path)
        if isinstance(entry, Dir):
            changes.append(MakeDir(path=path))
        elif isinstance(entry, File):
            kept = isinstance(ours, File) and ours.sha256 == entry.sha256
            source = "merged" if path in data and not kept else "ours" if kept else "theirs"
            changes.append(
                _put(path, entry, data.get(path) if source == "merged" else None, source)
            )
    return changes


def _put(path: str, entry: File, data: bytes | None, source: str) -> Put:
    return Put(
        path=path,
        sha256=entry.sha256,
        size=entry.size,
        executable=entry.executable,
        binary=entry.binary,
        data=data,
        source=source,  # type: ignore[arg-type]
    )
