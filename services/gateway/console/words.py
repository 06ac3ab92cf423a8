"""What the console says for the machine's names: ops in words (``cmd.write`` is "write a
file"), a change as git marks it (A, M, R, D), times with their zone, counts with their
plural, and a command's id as its page's URL names it.

The technical name stays in reach: a page shows an op's words with its name as the title (and
the audit's filter still takes the name)."""

from __future__ import annotations

from datetime import UTC, datetime

from markupsafe import Markup

from contracts import replies as rp
from contracts.subjects import CHANGES_SUFFIX
from core.words import plural

OPS: dict[str, str] = {
    "create": "create the workspace",
    "write": "write a file",
    "mkdir": "make a directory",
    "move": "move",
    "apply": "apply changes",
    "edit": "edit a file",
    "modify": "modify a file",
    "restore": "restore",
    "delete": "delete",
    "run_start": "start a run",
    "run_end": "end a run",
    "lock": "lock",
    "unlock": "unlock",
    "set_trust": "set trust",
    "request_approval": "ask for approval",
    "attach": "attach a workspace",
    "detach": "detach a workspace",
    "decide": "decide an approval",
    "read": "read a file",
    "read_bytes": "read a file's bytes",
    "list": "list a directory",
    "stat": "look at a path",
    "glob": "find paths",
    "grep": "search contents",
    "explore": "explore files",
    "diff": "diff",
    "history": "read history",
    "info": "read workspace info",
    "attached": "list attached workspaces",
    "approvals": "list approvals",
    "events": "read the log",
    "workspaces": "list workspaces",
    "output": "read a command's output",
    "git": "run git",
    "archive": "archive",
    "unarchive": "unarchive",
    "purge": "purge",
    "compact": "compact history",
}
"""An op's words, by its name without its kind (``write`` of ``cmd.write``)."""
KIND_OPS = {"exec.run": "run a command", "qry.run": "read a run"}
"""Ops whose name alone is ambiguous (``run``)."""
MARKS = {"added": "A", "modified": "M", "moved": "R", "deleted": "D"}
"""A change as git marks it (``git status --short``)."""


def op_words(op: str | None) -> Markup:
    """``cmd.write`` (or ``write``) as ``write a file``, its name the title."""
    if not op:
        return Markup("")
    kind, _, name = op.rpartition(".")
    words = KIND_OPS.get(op) or OPS.get(name) or name.replace("_", " ")
    if not kind and name == "run":
        words = "run a command"
    return Markup('<span title="{}">{}</span>').format(op, words)


def mark(change: rp.ChangeSummary) -> str:
    """The letter of a change: A, M, R or D (a put an older event recorded without saying
    what it did: M)."""
    if change.change in MARKS:
        return MARKS[change.change]
    return {"mkdir": "A", "delete": "D"}.get(change.kind, "M")


def when(at: datetime | None) -> str:
    """A time in UTC, saying so (``2026-05-01 12:00:03 UTC``)."""
    if at is None:
        return ""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def counted(n: int, word: str) -> str:
    """``1 entry``, ``2 entries``."""
    return plural(n, word)


def command_link(command_id: str) -> str:
    """A command's id as its page's URL names it: one subject token (``.`` as ``_``, the
    token its kept output and live output are under, ``Subjects.cmdout``)."""
    return command_id.replace(".", "_")


def command_of(request_id: str | None) -> str | None:
    """The command whose commit an event is (its request id is the command's with
    ``CHANGES_SUFFIX``), else None."""
    if not request_id or not request_id.endswith(CHANGES_SUFFIX):
        return None
    return request_id.removesuffix(CHANGES_SUFFIX) or None
