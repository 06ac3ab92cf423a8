"""A merge's answer in words, as the CLI prints it and the MCP tool tells a model (issue 33):
what it changed, then each conflict with both sides' versions and its three-way hunks in
git's ``diff3`` marker form (``<<<<<<< ours`` / ``||||||| base`` / ``=======`` /
``>>>>>>> theirs``: what a model or a person already reads), and how to go on.

**Bounded.** The writer's reply is bounded already (100 conflicts, 10 hunks of 2 KiB a side,
256 KiB of views, 1,000 changes: ``core.merge``, ``core.decide_merge``), which is more than a
model should read: ``Budget`` cuts each side of a hunk to ``side`` characters and the whole
text to ``total``, saying what it left out (the op's reply, in ``structuredContent`` or
``--json``, keeps the rest). The console renders the same structs as HTML of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from contracts import replies as rp
from contracts.merging import Conflict, Dir, Entry, File
from core.words import plural


@dataclass(frozen=True)
class Budget:
    """How much of a merge a text shows: ``side`` characters of each side of a hunk,
    ``changes`` changed paths, ``total`` characters in all."""

    total: int = 12_000
    side: int = 600
    changes: int = 50


MODEL = Budget()
"""What the MCP tool tells a model."""
TERMINAL = Budget(total=200_000, side=4_000, changes=1_000)
"""What ``quill merge`` prints."""

KINDS = {
    "content": "both sides changed the same lines",
    "binary": "a binary file both sides changed",
    "delete_modify": "one side deleted what the other changed",
    "file_directory": "a file on one side, a directory with changes on the other",
    "add_add": "both sides created it, differently",
    "mode": "both created it alike, one executable",
}
"""A conflict's kind, in words."""


def entry_words(entry: Entry) -> str:
    """``file v8 (120 bytes, sha256 1a2b3c4d)``, ``directory v3``, ``absent``."""
    if isinstance(entry, File):
        traits = [f"{entry.size:,} bytes", f"sha256 {entry.sha256[:8]}"]
        traits += ["binary"] * entry.binary + ["executable"] * entry.executable
        return f"file v{entry.version} ({', '.join(traits)})"
    if isinstance(entry, Dir):
        return f"directory v{entry.version}"
    return "absent"


def _cut(text: str, most: int) -> str:
    if len(text) <= most:
        return text
    return f"{text[:most]}\n[... {len(text) - most:,} more characters]\n"


def _block(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n[no newline at end]\n"


def conflict_lines(c: Conflict, ours: str, theirs: str, side: int) -> list[str]:
    """One conflict: its path and kind, each side's entry, how it was decided, its hunks."""
    decided = f"; decided: {c.resolution}" if c.resolution else ""
    lines = [
        f"CONFLICT {c.path}: {c.kind} ({KINDS.get(c.kind, c.kind)}){decided}",
        f"  base:   {entry_words(c.base)}",
        f"  ours:   {entry_words(c.ours)}  [{ours}]",
        f"  theirs: {entry_words(c.theirs)}  [{theirs}]",
    ]
    for n, h in enumerate(c.hunks, 1):
        cut = " (cut by the writer)" if h.cut else ""
        lines.append(
            f"  hunk {n} of {c.hunks_total or len(c.hunks)}: base line {h.base_line}, ours "
            f"line {h.ours_line}, theirs line {h.theirs_line}{cut}"
        )
        lines.append(
            f"<<<<<<< ours\n{_block(_cut(h.ours, side))}||||||| base\n{_block(_cut(h.base, side))}"
            f"=======\n{_block(_cut(h.theirs, side))}>>>>>>> theirs"
        )
    if c.hunks_total > len(c.hunks):
        lines.append(f"  ({c.hunks_total - len(c.hunks)} more hunks not shown)")
    if c.paths:
        below = ", ".join(c.paths)
        more = f" and {c.paths_total - len(c.paths)} more" if c.paths_total > len(c.paths) else ""
        lines.append(f"  with it, below it: {below}{more}")
    return lines


def conflicts_text(
    conflicts: Sequence[Conflict], total: int, ours: str, theirs: str, budget: Budget
) -> list[str]:
    """Every conflict given, as ``conflict_lines``, until ``budget.total`` characters; then
    how many were left out (of ``total``, the merge's count)."""
    out: list[str] = []
    used = 0
    shown = 0
    for c in conflicts:
        lines = conflict_lines(c, ours, theirs, budget.side)
        size = sum(len(line) + 1 for line in lines)
        if out and used + size > budget.total:
            break
        out += lines
        used += size
        shown += 1
    if total > shown:
        out.append(f"({total - shown} more conflicts not shown here: {total} in all)")
    return out


def changes_lines(changes: Iterable[rp.MergeChange], total: int, most: int) -> list[str]:
    """``  put    a.txt (theirs, 12 bytes)``, a line a change, the first ``most``."""
    lines = []
    for n, ch in enumerate(changes):
        if n == most:
            break
        said: list[str] = [ch.source] if ch.source else []
        said += [f"{ch.size:,} bytes"] if ch.size is not None else []
        extra = f" ({', '.join(said)})" if said else ""
        lines.append(f"  {ch.kind:<6} {ch.path}{extra}")
    if total > len(lines):
        lines.append(f"  ... and {total - len(lines)} more changes")
    return lines


def how_to_go_on(tool: str) -> str:
    """What to do about conflicts, in the calling door's words (``tool``: ``strategy=`` for
    MCP, ``--strategy`` for the CLI)."""
    return (
        f'To go on: {tool}"markers" writes git-style conflict markers into the texts (then '
        "edit those files and commit), or "
        f'{tool}"ours" / {tool}"theirs" decides every conflict for the target / the merged '
        "workspace (a text hunk by hunk); binary, delete/modify, file/directory and mode "
        "conflicts need ours or theirs, or a change on either side first"
    )


def merged_text(m: rp.Merged, version: int | None, budget: Budget, option: str) -> str:
    """A merge's (or a dry run's) reply in words; ``version``: the target's after a commit."""
    head = f"{m.source}@{m.from_version} into {m.workspace}"
    base = f"(base: {m.workspace} v{m.base_version}, {m.source} v{m.from_base})"
    if m.committed:
        first = f"Merged {head} {base}: version {version}, {plural(m.changes_total, 'change')}"
    elif m.dry_run:
        would = "would refuse" if m.refused else f"would make {plural(m.changes_total, 'change')}"
        first = f"Dry run of merging {head} {base}: it {would}; nothing committed"
    else:
        first = f"Nothing to merge: {head} {base} changes nothing"
    lines = [first]
    lines += changes_lines(m.changes, m.changes_total, budget.changes)
    if m.merged:
        lines.append(f"Merged line by line: {', '.join(m.merged[: budget.changes])}")
    if m.marked:
        marked = ", ".join(m.marked[: budget.changes])
        lines.append(f"Written with conflict markers (edit them): {marked}")
    if m.conflicts_total:
        lines.append(f"{plural(m.conflicts_total, 'conflict')} (strategy {m.strategy}):")
        ours, theirs = m.workspace, m.source
        lines += conflicts_text(m.conflicts, m.conflicts_total, ours, theirs, budget)
    if m.refused:
        lines += [f"Refused: {m.refused}", how_to_go_on(option)]
    return "\n".join(lines)


def refused_text(
    message: str, details: dict[str, Any], ours: str, theirs: str, budget: Budget, option: str
) -> str:
    """A ``MERGE_CONFLICT`` (nothing committed) in words: the message, every conflict its
    details hold (the first 100; ``ours`` the target, ``theirs`` the workspace merged) and
    how to go on (no ``message``: the conflicts alone, where the caller says it after)."""
    try:
        conflicts = msgspec.convert(details.get("conflicts") or [], list[Conflict])
    except msgspec.ValidationError:
        conflicts = []
    total = details.get("conflicts_total")
    total = total if isinstance(total, int) else len(conflicts)
    lines = [message] if message else []
    lines += [*conflicts_text(conflicts, total, ours, theirs, budget), how_to_go_on(option)]
    return "\n".join(lines)
