"""The table of ops: for each, its subject kind, request and result types, errors, an example.

Services dispatch on it, the SDK encodes with it, and the docs, JSON Schemas and AsyncAPI
document are generated from it, so they cannot drift apart.

Size: the registry is a table of every op with its errors and example; splitting a table
would only make it harder to see whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode as E

OpKind = Literal["cmd", "qry", "exec"]
Scope = Literal["workspace", "tenant"]
H = TypeVar("H")

_COMMON_CMD = (
    E.INVALID_ARGUMENT,
    E.WORKSPACE_NOT_FOUND,
    E.CONFLICT,
    E.LOCKED,
    E.APPROVAL_REQUIRED,
    E.DENIED,
    E.UNAVAILABLE,
    E.TIMEOUT,
    E.WORKSPACE_ARCHIVED,
)
_COMMON_QRY = (
    E.INVALID_ARGUMENT,
    E.WORKSPACE_NOT_FOUND,
    E.RUN_NOT_FOUND,
    E.UNAVAILABLE,
    E.TIMEOUT,
)


@dataclass(frozen=True)
class OpSpec:
    kind: OpKind
    name: str
    request: type[rq.Request]
    result: type[rp.Result]
    summary: str
    errors: tuple[E, ...]
    example: dict[str, Any] = field(default_factory=dict)
    scope: Scope = "workspace"
    """``tenant``: an op of the tenant, sent with ``_`` for the workspace
    (``contracts.subjects.TENANT_SCOPE``)."""

    @property
    def key(self) -> str:
        return f"{self.kind}.{self.name}"


def _cmd(
    name: str,
    req: type[rq.Request],
    res: type[rp.Result],
    summary: str,
    errors: tuple[E, ...],
    example: dict[str, Any],
) -> OpSpec:
    return OpSpec("cmd", name, req, res, summary, _COMMON_CMD + errors, example)


def _qry(
    name: str,
    req: type[rq.Request],
    res: type[rp.Result],
    summary: str,
    errors: tuple[E, ...],
    example: dict[str, Any],
) -> OpSpec:
    return OpSpec("qry", name, req, res, summary, _COMMON_QRY + errors, example)


_COMMON_EXEC = (
    E.INVALID_ARGUMENT,
    E.SHELL_NOT_FOUND,
    E.SHELL_LOST,
    E.BUSY,
    E.WORKSPACE_NOT_FOUND,
    E.LOCKED,
    E.APPROVAL_REQUIRED,
    E.DENIED,
    E.ACCESS_DENIED,
    E.FILE_NOT_FOUND,
    E.NOT_A_DIRECTORY,
    E.EXECUTION_FAILED,
    E.SIZE_LIMIT_EXCEEDED,
    E.UNAVAILABLE,
    E.TIMEOUT,
    E.WORKSPACE_ARCHIVED,
)

_TO_LIVE_COMMAND = (
    E.INVALID_ARGUMENT,
    E.COMMAND_NOT_FOUND,
    E.COMMAND_LOST,
    E.COMMAND_ENDED,
    E.UNAVAILABLE,
    E.TIMEOUT,
)
"""The errors of what is sent to a live command (``exec.input``, ``exec.signal``)."""


def _exec(
    name: str,
    req: type[rq.Request],
    res: type[rp.Result],
    summary: str,
    example: dict[str, Any],
) -> OpSpec:
    return OpSpec("exec", name, req, res, summary, _COMMON_EXEC, example)


_ALL: tuple[OpSpec, ...] = (
    _cmd(
        "create",
        rq.CreateWorkspace,
        rp.WorkspaceCreatedResult,
        "Create the workspace.",
        (E.ALREADY_EXISTS,),
        {"trust": "full", "limits": {"max_file_bytes": 1048576}},
    ),
    _cmd(
        "write",
        rq.WriteFile,
        rp.FileWritten,
        "Write a whole file (overwrite, create or append); parents are created.",
        (
            E.ACCESS_DENIED,
            E.ALREADY_EXISTS,
            E.NOT_A_FILE,
            E.NOT_A_DIRECTORY,
            E.FILE_NOT_FOUND,
            E.SIZE_LIMIT_EXCEEDED,
        ),
        {"path": "notes/todo.md", "content": "# TODO\n- ship\n"},
    ),
    _cmd(
        "mkdir",
        rq.MakeDirectory,
        rp.DirectoryMade,
        "Create a directory and its missing parents (like mkdir -p).",
        (E.ACCESS_DENIED, E.NOT_A_DIRECTORY, E.SIZE_LIMIT_EXCEEDED),
        {"path": "data/reports/2025-11"},
    ),
    _cmd(
        "move",
        rq.MovePath,
        rp.PathMoved,
        "Move or rename a file or a directory.",
        (
            E.ACCESS_DENIED,
            E.FILE_NOT_FOUND,
            E.ALREADY_EXISTS,
            E.NOT_A_DIRECTORY,
            E.SIZE_LIMIT_EXCEEDED,
        ),
        {"path": "notes/todo.md", "to": "notes/done.md"},
    ),
    _cmd(
        "apply",
        rq.ApplyChanges,
        rp.ChangesApplied,
        "Commit several puts/deletes/mkdirs as one atomic event against a base version.",
        (E.ACCESS_DENIED, E.NOT_A_FILE, E.NOT_A_DIRECTORY, E.SIZE_LIMIT_EXCEEDED),
        {
            "base_version": 4,
            "changes": [
                {"type": "put", "path": "src/app.py", "content": "print('hi')\n"},
                {"type": "delete", "path": "notes/done.md"},
            ],
        },
    ),
    _cmd(
        "edit",
        rq.EditFile,
        rp.FileEdited,
        "Replace an exact string in a text file (once, or everywhere with replace_all).",
        (
            E.ACCESS_DENIED,
            E.FILE_NOT_FOUND,
            E.NOT_A_FILE,
            E.NO_MATCH,
            E.MULTIPLE_MATCHES,
            E.INVALID_ENCODING,
            E.SIZE_LIMIT_EXCEEDED,
        ),
        {"path": "src/app.py", "old_string": "print('hi')", "new_string": "print('hello')"},
    ),
    _cmd(
        "modify",
        rq.ModifyFile,
        rp.FileModified,
        "Line-range replace/insert/delete and regex replacements, all or nothing.",
        (
            E.ACCESS_DENIED,
            E.FILE_NOT_FOUND,
            E.NOT_A_FILE,
            E.NO_MATCH,
            E.INVALID_ENCODING,
            E.SIZE_LIMIT_EXCEEDED,
        ),
        {
            "path": "src/app.py",
            "operations": [
                {"type": "insert", "after_line": 0, "new_content": "import sys\n"},
                {
                    "type": "regex_replace",
                    "pattern": "print\\((.*)\\)",
                    "replacement": "log($1)",
                    "flags": "g",
                },
            ],
        },
    ),
    _cmd(
        "restore",
        rq.RestorePath,
        rp.Restored,
        "Bring a path or the whole workspace back to an earlier version, as a new event.",
        (E.ACCESS_DENIED, E.SIZE_LIMIT_EXCEEDED),
        {"version": 2, "path": "notes"},
    ),
    _cmd(
        "delete",
        rq.DeletePath,
        rp.PathDeleted,
        "Delete a file, or a directory with recursive.",
        (E.ACCESS_DENIED, E.FILE_NOT_FOUND),
        {"path": "data", "recursive": True},
    ),
    _cmd(
        "run_start",
        rq.RunStart,
        rp.RunInfo,
        "Start an agent run: its queries (Ws-Run) read the workspace as of one version.",
        (E.ALREADY_EXISTS,),
        {"run": "run-7"},
    ),
    _cmd(
        "run_end",
        rq.RunEnd,
        rp.RunInfo,
        "End a run.",
        (),
        {"run": "run-7"},
    ),
    _cmd(
        "lock",
        rq.Lock,
        rp.LockInfo,
        "Hold the workspace for this session (Ws-Session): other sessions' mutations wait or "
        "get LOCKED.",
        (E.LOCKED,),
        {"ttl_ms": 60000},
    ),
    _cmd(
        "unlock",
        rq.Unlock,
        rp.LockInfo,
        "Release this session's lock.",
        (E.LOCKED,),
        {},
    ),
    _cmd(
        "set_trust",
        rq.SetTrust,
        rp.TrustInfo,
        "Make the workspace full or restricted (mutations and commands then need approval).",
        (),
        {"trust": "full"},
    ),
    _cmd(
        "request_approval",
        rq.RequestApproval,
        rp.ApprovalResult,
        "Wait for the approval a restricted workspace requires (executors ask before a command).",
        (E.APPROVAL_REQUIRED, E.DENIED),
        {"op": "exec.run", "summary": "make test"},
    ),
    _cmd(
        "attach",
        rq.Attach,
        rp.Attached,
        "Attach a workspace (server:/t/w, git:<url>, <client>:<path>) to this session.",
        (E.ACCESS_DENIED, E.FILE_NOT_FOUND, E.ALREADY_EXISTS),
        {"uri": "server:/acme/shared-notes"},
    ),
    _cmd(
        "detach",
        rq.Detach,
        rp.Attached,
        "Detach a workspace from this session.",
        (E.FILE_NOT_FOUND,),
        {"uri": "server:/acme/shared-notes"},
    ),
    _cmd(
        "decide",
        rq.Decide,
        rp.ApprovalResult,
        "Approve or deny a request waiting on a restricted workspace.",
        (E.FILE_NOT_FOUND,),
        {"approval_id": "req-42", "approve": True},
    ),
    _qry(
        "read",
        rq.ReadFile,
        rp.FileContent,
        "Read a text file, whole or by line range; binary files give metadata only.",
        (E.ACCESS_DENIED, E.FILE_NOT_FOUND),
        {"path": "src/app.py", "line_numbers": True},
    ),
    _qry(
        "read_bytes",
        rq.ReadBytes,
        rp.FileBytes,
        "Read a chunk of raw bytes of any file.",
        (E.ACCESS_DENIED, E.FILE_NOT_FOUND, E.NOT_A_FILE),
        {"path": "src/app.py", "offset": 0, "length": 5},
    ),
    _qry(
        "list",
        rq.ListDirectory,
        rp.Listing,
        "List a directory.",
        (E.ACCESS_DENIED, E.FILE_NOT_FOUND, E.NOT_A_DIRECTORY),
        {"path": "."},
    ),
    _qry(
        "stat",
        rq.StatPath,
        rp.FileInfo,
        "Metadata of a file or a directory.",
        (E.ACCESS_DENIED, E.FILE_NOT_FOUND),
        {"path": "src/app.py"},
    ),
    _qry(
        "glob",
        rq.GlobQuery,
        rp.Matches,
        "Paths matching a glob, newest first.",
        (E.ACCESS_DENIED, E.FILE_NOT_FOUND, E.NOT_A_DIRECTORY),
        {"pattern": "**/*.py"},
    ),
    _qry(
        "grep",
        rq.GrepQuery,
        rp.GrepResult,
        "Lines matching a regex or literal text, with context.",
        (E.ACCESS_DENIED, E.FILE_NOT_FOUND),
        {"pattern": "log\\(", "include": ["*.py"], "context_lines": 1},
    ),
    _qry(
        "explore",
        rq.ExploreQuery,
        rp.Tree,
        "The tree under a directory, to a depth.",
        (E.ACCESS_DENIED, E.FILE_NOT_FOUND, E.NOT_A_DIRECTORY),
        {"recursive": True, "metadata": True},
    ),
    _qry(
        "diff",
        rq.DiffQuery,
        rp.Diff,
        "Unified diff of a path or the workspace between two versions.",
        (E.ACCESS_DENIED, E.SIZE_LIMIT_EXCEEDED),
        {"from_version": 5, "path": "src/app.py"},
    ),
    _qry(
        "history",
        rq.History,
        rp.HistoryPage,
        "Revisions of a path, or the events of the workspace; newest first.",
        (E.ACCESS_DENIED,),
        {"path": "notes/todo.md"},
    ),
    _qry(
        "info",
        rq.WorkspaceInfoQuery,
        rp.WorkspaceInfo,
        "Root, limits, default exclusions, capabilities and counters.",
        (),
        {},
    ),
    _qry(
        "run",
        rq.RunQuery,
        rp.RunInfo,
        "A run: the version it reads, its parent, whether it ended.",
        (E.FILE_NOT_FOUND,),
        {"run": "run-7"},
    ),
    _qry(
        "attached",
        rq.AttachedQuery,
        rp.Attached,
        "This session's primary workspace and the workspaces attached to it.",
        (),
        {},
    ),
    _qry(
        "approvals",
        rq.ApprovalsQuery,
        rp.ApprovalList,
        "Requests waiting for approval on a restricted workspace.",
        (),
        {},
    ),
    _qry(
        "approval",
        rq.ApprovalQuery,
        rp.ApprovalStatus,
        "One approval: pending, approved (with what carrying it out gave), denied or expired.",
        (E.FILE_NOT_FOUND,),
        {"approval_id": "req-42"},
    ),
    _qry(
        "events",
        rq.EventsQuery,
        rp.EventPage,
        "A page of the workspace's log (contents left out).",
        (),
        {"after": 0, "limit": 2},
    ),
    _qry(
        "tree",
        rq.TreeQuery,
        rp.TreePage,
        "The whole tree as of a version, a page at a time by path, with its files' contents "
        "(what an executor builds a checkout from).",
        (),
        {"limit": 2},
    ),
    OpSpec(
        "qry",
        "workspaces",
        rq.ListWorkspaces,
        rp.WorkspaceList,
        "The tenant's workspaces by name, a page at a time (sent as workspace `_`).",
        (E.INVALID_ARGUMENT, E.UNAVAILABLE, E.TIMEOUT),
        {"limit": 2},
        scope="tenant",
    ),
    _exec(
        "run",
        rq.RunCommand,
        rp.CommandResult,
        "Run a shell command in the workspace's sandbox; the files it changes become one event.",
        {"command": "wc -l app.py && echo ok > check.log", "workdir": "src", "timeout_ms": 10000},
    ),
    OpSpec(
        "exec",
        "output",
        rq.CommandOutputQuery,
        rp.CommandOutput,
        "A page of a command's whole output, kept for a while (an hour) after it ended, by its id.",
        (E.INVALID_ARGUMENT, E.WORKSPACE_NOT_FOUND, E.FILE_NOT_FOUND, E.UNAVAILABLE, E.TIMEOUT),
        {"command_id": "example-run", "stream": "stdout", "offset": 0, "length": 1000},
    ),
    OpSpec(
        "exec",
        "poll",
        rq.CommandPoll,
        rp.CommandStatus,
        "A live command's output after a cursor (waiting up to wait_ms for more) and whether it "
        "still runs; once ended, its exit status and the version of its changes.",
        (E.INVALID_ARGUMENT, E.COMMAND_NOT_FOUND, E.COMMAND_LOST, E.UNAVAILABLE, E.TIMEOUT),
        {"command_id": "c0123456789abexample", "cursor": "120.0", "wait_ms": 5000},
    ),
    OpSpec(
        "exec",
        "input",
        rq.CommandInput,
        rp.InputWritten,
        "Bytes to a live command's standard input; eof closes it.",
        _TO_LIVE_COMMAND,
        {"command_id": "c0123456789abexample", "data": "QWRhCg==", "eof": True},
    ),
    OpSpec(
        "exec",
        "signal",
        rq.CommandSignal,
        rp.SignalSent,
        "INT, TERM, KILL or HUP to every process of a live command (TERM: KILL after 5 s).",
        _TO_LIVE_COMMAND,
        {"command_id": "c0123456789abexample", "signal": "INT"},
    ),
    OpSpec(
        "exec",
        "resize",
        rq.CommandResize,
        rp.TerminalResized,
        "A new size (rows, cols) for the terminal of a live command run with pty: its "
        "processes get SIGWINCH.",
        (*_TO_LIVE_COMMAND, E.BUSY),
        {"command_id": "c0123456789abexample", "rows": 40, "cols": 120},
    ),
    OpSpec(
        "exec",
        "list",
        rq.LiveCommandsQuery,
        rp.LiveCommands,
        "The commands running on in the workspace (exec.run with yield_ms), on every executor.",
        (E.INVALID_ARGUMENT, E.UNAVAILABLE, E.TIMEOUT),
        {},
    ),
    OpSpec(
        "exec",
        "shell_open",
        rq.ShellOpen,
        rp.ShellOpened,
        "Open a shell: one sandbox running bash in a checkout of its own, where exec.run with "
        "shell keeps cwd, variables, functions, /tmp and background processes.",
        (
            E.INVALID_ARGUMENT,
            E.ACCESS_DENIED,
            E.FILE_NOT_FOUND,
            E.NOT_A_DIRECTORY,
            E.WORKSPACE_NOT_FOUND,
            E.WORKSPACE_ARCHIVED,
            E.DENIED,
            E.LOCKED,
            E.SIZE_LIMIT_EXCEEDED,
            E.EXECUTION_FAILED,
            E.UNAVAILABLE,
            E.TIMEOUT,
        ),
        {"workdir": "src", "idle_timeout_ms": 600000},
    ),
    OpSpec(
        "exec",
        "checkpoint",
        rq.ShellCheckpoint,
        rp.ShellCheckpointed,
        "Commit what a shell's background processes changed since its last command.",
        (E.INVALID_ARGUMENT, E.SHELL_NOT_FOUND, E.SHELL_LOST, E.BUSY, E.UNAVAILABLE, E.TIMEOUT),
        {"shell": "s0123456789abexample"},
    ),
    OpSpec(
        "exec",
        "shell_close",
        rq.ShellClose,
        rp.ShellClosed,
        "Close a shell: its processes are killed, what they changed is committed.",
        (E.INVALID_ARGUMENT, E.SHELL_NOT_FOUND, E.SHELL_LOST, E.UNAVAILABLE, E.TIMEOUT),
        {"shell": "s0123456789abexample"},
    ),
    _exec(
        "git",
        rq.GitCommand,
        rp.GitResult,
        "A structured git action (status, diff, commit, checkout, branch, log, push, pull, "
        "clone) on a repository in the workspace.",
        {"action": "log", "limit": 5},
    ),
    _cmd(
        "archive",
        rq.ArchiveWorkspace,
        rp.ArchiveInfo,
        "Archive the workspace: later commands get WORKSPACE_ARCHIVED until unarchive; reads "
        "and history still work.",
        (),
        {"reason": "project finished"},
    ),
    _cmd(
        "unarchive",
        rq.UnarchiveWorkspace,
        rp.ArchiveInfo,
        "Take the workspace out of the archive.",
        (),
        {},
    ),
    _cmd(
        "purge",
        rq.PurgeWorkspace,
        rp.Purged,
        "Delete the workspace for good: its log, kept command output, and every replica's "
        "projection and executor's checkout of it; the name may be created again.",
        (),
        {"confirm": "acme/demo"},
    ),
    # ------------------------------------------------------------ forks (issue 33)
    _cmd(
        "fork",
        rq.ForkWorkspace,
        rp.Forked,
        "Create this workspace as a fork of another of the tenant's at a version: its history "
        "up to there is the source's, nothing copied; it goes on from the next version.",
        (E.ALREADY_EXISTS, E.VERSION_TRIMMED),
        {"from": "demo", "version": 12},
    ),
    _cmd(
        "merge",
        rq.MergeWorkspace,
        rp.Merged,
        "Merge another workspace of the tenant (a fork, its source, a sibling fork) into this "
        "one: three-way per path against the merge base, one event; or a dry run.",
        (E.MERGE_CONFLICT, E.NO_MERGE_BASE),
        {"from": "demo-try1", "strategy": "fail", "dry_run": True},
    ),
    _qry(
        "forks",
        rq.ForksQuery,
        rp.ForkList,
        "The workspace's forks: the version each was forked at, versions ahead and behind.",
        (),
        {},
    ),
)

OPS: dict[str, OpSpec] = {spec.key: spec for spec in _ALL}


def find(kind: str, name: str) -> OpSpec | None:
    return OPS.get(f"{kind}.{name}")


BY_REQUEST: dict[type[rq.Request], OpSpec] = {spec.request: spec for spec in _ALL}
"""Each op's request type is its own: the registry finds an op from the request alone."""


def of_kind(kind: OpKind) -> list[OpSpec]:
    return [spec for spec in _ALL if spec.kind == kind]


def of_request(request: rq.Request) -> OpSpec:
    """The op ``request`` is the body of.

    Raises:
        KeyError: ``request`` is no op's request type.
    """
    return BY_REQUEST[type(request)]


class RegistryError(Exception):
    """A service's handler table does not cover exactly the registry's ops of its kind."""


def table(
    kind: OpKind, handlers: Mapping[str, H], *, served_elsewhere: tuple[str, ...] = ()
) -> dict[str, H]:
    """``handlers`` (op name → handler) as the handler table of ``kind``'s ops, checked
    against the registry, so that an op added here without a handler (or a handler left behind
    by a removed op) stops the service from importing, and the test of the registry fails.

    ``served_elsewhere``: ops of ``kind`` the table's owner answers on another path.

    Raises:
        RegistryError: naming each op without a handler and each handler without an op.
    """
    names = {spec.name for spec in of_kind(kind)} - set(served_elsewhere)
    missing = sorted(names - set(handlers))
    unknown = sorted(set(handlers) - names)
    if missing or unknown:
        raise RegistryError(
            f"The {kind} handler table does not match contracts/ops.py: "
            f"no handler for {missing}, no op for {unknown}"
        )
    return dict(handlers)
