"""A workspace of the SDK: ``Workspace`` (every op on one workspace) and ``Run`` (a
workspace as one agent run sees it).

::

    ws = quill.workspace("acme/demo")
    await ws.create(exist_ok=True)
    written = await ws.write("notes.txt", "hello\\n")
    text = await ws.read_text("notes.txt")

Methods mirror the ops of the wire contract (``docs/contract.md``); each says how its
arguments make the request, since the op and the result type come from the registry
(``contracts/ops.py``). The commands, runs, locks, approvals and commands run in the sandbox
are here; the reads and streams are ``quill/_reads.py``, which ``Workspace`` inherits; how a
request of each kind is sent, and the read-your-writes version, ``quill/_handle.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Literal

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch, check_stdin
from quill._protocols import Client
from quill._reads import Reads
from quill._transport import OnOutput, check_size
from quill.command import Command
from quill.shell import Shell


class Workspace(Reads):
    """One workspace. Methods mirror the ops of the wire contract (``docs/contract.md``)."""

    # ------------------------------------------------------------------ commands
    async def create(
        self,
        *,
        trust: Literal["full", "restricted"] = "full",
        limits: LimitsPatch | None = None,
        exist_ok: bool = False,
    ) -> rp.WorkspaceCreatedResult:
        body = rq.CreateWorkspace(trust=trust, limits=limits, exist_ok=exist_ok)
        return await self._cmd(body)

    async def write(
        self,
        path: str,
        content: str | bytes,
        *,
        mode: Literal["overwrite", "create", "append"] = "overwrite",
        if_match: str | None = None,
        expected_version: int | None = None,
        create_parents: bool = True,
    ) -> rp.FileWritten:
        """Write ``path`` (the writer checks the workspace's ``max_file_bytes``).

        Raises:
            QuillError: ``SIZE_LIMIT_EXCEEDED`` before anything is sent for content over
                ``CEILINGS.max_file_bytes``, the largest file any workspace takes; as the
                writer answers otherwise.
        """
        check_size(content)
        text, data = (content, None) if isinstance(content, str) else (None, content)
        body = rq.WriteFile(
            path=path,
            content=text,
            data=data,
            mode=mode,
            if_match=if_match,
            expected_version=expected_version,
            create_parents=create_parents,
        )
        return await self._cmd(body)

    async def mkdir(self, path: str) -> rp.DirectoryMade:
        return await self._cmd(rq.MakeDirectory(path=path))

    async def delete(
        self,
        path: str,
        *,
        recursive: bool = False,
        if_match: str | None = None,
        missing_ok: bool = False,
    ) -> rp.PathDeleted:
        body = rq.DeletePath(
            path=path, recursive=recursive, if_match=if_match, missing_ok=missing_ok
        )
        return await self._cmd(body)

    async def move(
        self, path: str, to: str, *, overwrite: bool = False, if_match: str | None = None
    ) -> rp.PathMoved:
        body = rq.MovePath(path=path, to=to, overwrite=overwrite, if_match=if_match)
        return await self._cmd(body)

    async def apply(
        self,
        changes: Sequence[rq.ApplyItem],
        *,
        base_version: int | None = None,
        on_conflict: Literal["fail", "skip"] = "fail",
        message: str | None = None,
    ) -> rp.ChangesApplied:
        """Commit several changes as one event (``base_version`` defaults to the last seen)."""
        body = rq.ApplyChanges(
            base_version=base_version or self.last_version or 1,
            changes=list(changes),
            on_conflict=on_conflict,
            message=message,
        )
        return await self._cmd(body)

    async def edit(
        self,
        path: str,
        old_string: str,
        new_string: str,
        *,
        replace_all: bool = False,
        if_match: str | None = None,
        expected_version: int | None = None,
    ) -> rp.FileEdited:
        body = rq.EditFile(
            path=path,
            old_string=old_string,
            new_string=new_string,
            replace_all=replace_all,
            if_match=if_match,
            expected_version=expected_version,
        )
        return await self._cmd(body)

    async def modify(
        self,
        path: str,
        operations: Sequence[rq.ModifyOperation],
        *,
        if_match: str | None = None,
        expected_version: int | None = None,
    ) -> rp.FileModified:
        body = rq.ModifyFile(
            path=path,
            operations=list(operations),
            if_match=if_match,
            expected_version=expected_version,
        )
        return await self._cmd(body)

    async def update(
        self,
        path: str,
        change: Callable[[str], str | Awaitable[str]],
        *,
        retries: int | None = None,
    ) -> rp.FileWritten:
        """Read the text of ``path``, write ``change(text)`` back with ``if_match`` (the etag
        read), and on ``CONFLICT`` (someone wrote the file in between) read and change again,
        up to ``retries`` times (default: the client's ``conflict_retries``) with a jittered
        backoff (``Quill.retry_conflicts``). Changes that do not depend on each other need
        none of this: ``write(mode="append")`` and ``edit`` without ``if_match`` are decided
        by the writer, in order, against the file as it is.

        Raises:
            QuillError: ``CONFLICT`` when the last attempt conflicted; as ``read_text`` and
                ``write`` otherwise.
        """

        async def attempt() -> rp.FileWritten:
            first = await self.read(path)
            if first.kind == "file" and first.content is not None and not first.truncated:
                text = first.content
            else:  # a long file (or an error to raise): read whole; if it changed since
                text = await self.read_text(path)  # ``first``, its etag makes a CONFLICT
            new = change(text)
            if inspect.isawaitable(new):
                new = await new
            return await self.write(path, new, if_match=first.etag)

        return await self.client.retry_conflicts(attempt, retries=retries)

    # ------------------------------------------------------------------ runs, locks, trust
    @contextlib.asynccontextmanager
    async def run(
        self, run: str | None = None, *, version: int | None = None
    ) -> AsyncIterator[Run]:
        """An agent run (RFC 0059 §D): inside ``async with ws.run() as run:``, what ``run``
        reads is the workspace as of the version the run started at, whatever is written
        meanwhile (by the run itself included); ``run.run()`` dispatches a sub-run reading
        the same version."""
        async with self._run(run, None, version) as handle:
            yield handle

    @contextlib.asynccontextmanager
    async def _run(
        self, run: str | None, parent: str | None, version: int | None
    ) -> AsyncIterator[Run]:
        info = await self.start_run(run, parent=parent, version=version)
        client = self.client
        view = client.as_actor(client.actor, session=client.session, run=info.run)
        handle = Run(view, self.tenant, self.name, info)
        try:
            yield handle
        finally:
            await self.end_run(info.run)

    async def start_run(
        self, run: str | None = None, *, parent: str | None = None, version: int | None = None
    ) -> rp.RunInfo:
        body = rq.RunStart(run=run, parent=parent, version=version)
        return await self._cmd(body)

    async def end_run(self, run: str) -> rp.RunInfo:
        return await self._cmd(rq.RunEnd(run=run))

    async def run_info(self, run: str) -> rp.RunInfo:
        return await self._qry(rq.RunQuery(run=run))

    async def lock(self, *, ttl_ms: int = 60_000, wait_ms: int | None = None) -> rp.LockInfo:
        """Hold the workspace for this client's session (``Quill(session=...)``); if another
        session holds it, wait up to ``wait_ms`` (default: the client's ``wait_ms``)."""
        return await self._cmd(rq.Lock(ttl_ms=ttl_ms), wait_ms=wait_ms)

    async def unlock(self) -> rp.LockInfo:
        return await self._cmd(rq.Unlock())

    async def set_trust(
        self, trust: Literal["full", "restricted"], *, commands: bool = False
    ) -> rp.TrustInfo:
        """Make the workspace ``full`` or ``restricted`` (every mutation then waits for
        approval; ``commands``: offer exec, each approved first)."""
        body = rq.SetTrust(trust=trust, commands=commands)
        return await self._cmd(body)

    async def approvals(self) -> rp.ApprovalList:
        return await self._qry(rq.ApprovalsQuery())

    async def approval(self, approval_id: str) -> rp.ApprovalStatus:
        """Approval ``approval_id`` (from an ``APPROVAL_REQUIRED`` error's details): ``pending``,
        ``approved`` (with ``outcome``, what Quill's carrying it out gave, once ``done``),
        ``denied`` or ``expired``.

        Raises:
            QuillError: ``FILE_NOT_FOUND`` when the workspace has no such approval.
        """
        status: rp.ApprovalStatus = await self._qry(rq.ApprovalQuery(approval_id=approval_id))
        if status.outcome is not None and status.outcome.version is not None:
            # what it committed is read back as with one's own writes (read-your-writes)
            self.last_version = max(self.last_version, status.outcome.version)
        return status

    async def wait_approval(self, approval_id: str, timeout: float = 60.0) -> rp.ApprovalStatus:
        """``approval(approval_id)`` once it is ``done`` (denied, expired, or approved and
        carried out), or as it stands after ``timeout`` seconds (``done`` false). Asks again
        at growing intervals (up to 2 s): the outcome is kept, so a client that went away
        can ask later.

        Raises:
            QuillError: ``FILE_NOT_FOUND`` when the workspace has no such approval.
        """
        start = time.monotonic()
        deadline = start + max(0.0, timeout)
        pause = 0.05
        while True:
            try:
                status = await self.approval(approval_id)
            except QuillError as exc:  # a replica a moment behind the writer: ask again
                behind = exc.code == ErrorCode.FILE_NOT_FOUND and time.monotonic() - start < 2
                if not behind or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(pause)
                continue
            left = deadline - time.monotonic()
            if status.done or left <= 0:
                return status
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, 2.0)

    async def approve(self, approval_id: str, reason: str | None = None) -> rp.ApprovalResult:
        body = rq.Decide(approval_id=approval_id, approve=True, reason=reason)
        return await self._cmd(body)

    async def deny(self, approval_id: str, reason: str | None = None) -> rp.ApprovalResult:
        body = rq.Decide(approval_id=approval_id, approve=False, reason=reason)
        return await self._cmd(body)

    async def request_approval(
        self,
        op: str,
        summary: str,
        *,
        request_id: str | None = None,
        wait_ms: int | None = None,
        digest: str | None = None,
    ) -> rp.ApprovalResult:
        """Ask for the approval a restricted workspace needs before ``op`` (``exec.run``,
        ``exec.git``) is done outside the writer; returns once it is decided (what executors
        do before running a command there).

        Raises:
            QuillError: ``DENIED`` when denied; ``APPROVAL_REQUIRED`` while undecided past
                ``wait_ms``.
        """
        body = rq.RequestApproval(op=op, summary=summary[:4096], digest=digest)
        version, result = await self.client.send(
            self.tenant, self.name, body, request_id=request_id, wait_ms=wait_ms
        )
        self.last_version = max(self.last_version, version or 0)
        return result

    async def archive(self, reason: str | None = None) -> rp.ArchiveInfo:
        """Archive the workspace: every later command is refused (``WORKSPACE_ARCHIVED``)
        until ``unarchive``; reads and history still work."""
        return await self._cmd(rq.ArchiveWorkspace(reason=reason))

    async def unarchive(self) -> rp.ArchiveInfo:
        return await self._cmd(rq.UnarchiveWorkspace())

    async def purge(self, *, expected_version: int | None = None) -> rp.Purged:
        """Delete the workspace for good: its log, kept output, every replica's projection
        and executor's checkout of it (``expected_version``: only if nothing changed it since,
        e.g. since an export). Its name may then be created again, at version 1."""
        body = rq.PurgeWorkspace(confirm=self._key, expected_version=expected_version)
        result: rp.Purged = await self._cmd(body)
        self.last_version = 0
        return result

    async def restore(self, version: int, path: str | None = None) -> rp.Restored:
        return await self._cmd(rq.RestorePath(version=version, path=path))

    async def merge(
        self,
        source: str,
        *,
        strategy: Literal["fail", "ours", "theirs", "markers"] = "fail",
        dry_run: bool = False,
    ) -> rp.Merged:
        """Merge ``source`` (a workspace of the same tenant: ``name`` or ``tenant/name``; a
        fork of this one, its source, a sibling fork) into this workspace: three-way per path
        against the merge base, one event. ``dry_run``: answer what it would change and the
        conflicts, commit nothing.

        Raises:
            QuillError: ``MERGE_CONFLICT`` (conflicts ``strategy`` leaves: nothing committed;
                details list them), ``NO_MERGE_BASE`` (no shared history),
                ``WORKSPACE_NOT_FOUND``, ``SIZE_LIMIT_EXCEEDED`` (over this workspace's
                limits), ``INVALID_ARGUMENT`` (another tenant's, itself).
        """
        tenant, _, name = source.rpartition("/")
        if tenant and tenant != self.tenant:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"A merge stays within its tenant: {source} is not {self.tenant}'s",
                {"from": source},
            )
        body = rq.MergeWorkspace(source=name, strategy=strategy, dry_run=dry_run)
        result: rp.Merged = await self._cmd(body)
        return result

    # ------------------------------------------------------------------ exec
    async def exec(
        self,
        command: str,
        *,
        workdir: str = "",
        timeout_ms: int | None = None,
        env: Mapping[str, str] | None = None,
        version: int | None = None,
        on_output: OnOutput | None = None,
        stdin: bytes | None = None,
        yield_ms: int | None = None,
        shell: str | None = None,
        queue: bool = False,
        pty: tuple[int, int] | None = None,
    ) -> rp.CommandResult:
        """Run ``command`` (``bash -c``) in the workspace's sandbox; the files it changes are
        committed as one event. ``on_output`` receives its output live; ``stdin`` is its
        standard input, given whole (default: closed). ``yield_ms``: answer then if it still
        runs (``running``; go on with ``command(result.command_id, result.cursor)``), its
        stdin a pipe for ``Command.input`` unless ``stdin`` is given. ``pty``: (rows, cols) of
        a terminal to run it in (with ``yield_ms``; ``Command.resize``).

        Raises:
            QuillError: ``SIZE_LIMIT_EXCEEDED`` for a ``stdin`` over
                ``limits.EXEC_STDIN_MAX_BYTES`` (not sent); what ``exec.run`` answers.
        """
        check_stdin(stdin)
        body = rq.RunCommand(
            command=command,
            workdir=workdir,
            timeout_ms=timeout_ms,
            env=dict(env) if env is not None else None,
            version=version,
            min_version=self.last_version or None if version is None else None,
            stdin=stdin,
            yield_ms=yield_ms,
            shell=shell,
            queue=queue,
            pty=rq.TerminalSize(rows=pty[0], cols=pty[1]) if pty is not None else None,
        )
        return await self._exec(body, timeout_ms, on_output)

    async def shell(
        self,
        *,
        workdir: str = "",
        env: Mapping[str, str] | None = None,
        idle_timeout_ms: int | None = None,
    ) -> Shell:
        """Open a shell on the workspace (``exec.shell_open``): close it with ``Shell.close``
        (or ``async with``)."""
        body = rq.ShellOpen(
            workdir=workdir,
            env=dict(env) if env is not None else None,
            idle_timeout_ms=idle_timeout_ms,
        )
        opened: rp.ShellOpened = await self._exec(body, None, None)
        return Shell(self, opened.shell, opened)

    def shell_of(self, shell_id: str) -> Shell:
        """The handle of an open shell of this workspace, by its id."""
        return Shell(self, shell_id)

    def command(self, command_id: str, cursor: str = "") -> Command:
        """The handle of a live command of this workspace (``exec`` with ``yield_ms``), read
        on from ``cursor``: from any client of the tenant, for as long as it runs and its
        output is kept."""
        return Command(self, command_id, cursor)

    async def running(self) -> rp.LiveCommands:
        """The commands running on in this workspace (``exec.list``), on every executor."""
        return (await self.client.send(self.tenant, self.name, rq.LiveCommandsQuery()))[1]

    async def git(
        self,
        action: rq.GitAction,
        *,
        workdir: str = "",
        message: str | None = None,
        files: Sequence[str] | None = None,
        branch: str | None = None,
        remote: str = "origin",
        url: str | None = None,
        path: str | None = None,
        limit: int = 20,
        timeout_ms: int | None = None,
    ) -> rp.GitResult:
        """A git action on the repository at ``workdir`` (``.git`` is in the workspace)."""
        body = rq.GitCommand(
            action=action,
            workdir=workdir,
            message=message,
            files=list(files) if files is not None else None,
            branch=branch,
            remote=remote,
            url=url,
            path=path,
            limit=limit,
            timeout_ms=timeout_ms,
            min_version=self.last_version or None,
        )
        return await self._exec(body, timeout_ms, None)

    async def command_output(
        self,
        command_id: str,
        *,
        stream: rq.OutputStream = "stdout",
        offset: int = 0,
        length: int = 64 * 1024,
    ) -> rp.CommandOutput:
        """A page of a command's whole output (``exec.output``), kept for a while (an hour
        by default) after it ended: ``length`` bytes from byte ``offset`` of ``stream``. A
        long output's reply (``exec``) shows its head and tail; the middle is
        ``stdout_omitted_bytes`` from ``stdout_omitted_offset``. Page on with
        ``offset + page.length`` while ``page.more``.

        Raises:
            QuillError: ``FILE_NOT_FOUND`` when nothing is kept under ``command_id`` for this
                workspace (another workspace's command, or too old).
        """
        body = rq.CommandOutputQuery(
            command_id=command_id, stream=stream, offset=offset, length=length
        )
        return (await self.client.send(self.tenant, self.name, body))[1]


class Run(Workspace):
    """A workspace as one agent run sees it: every request carries ``Ws-Run``, and queries
    read the version the run is pinned to (``started.version``)."""

    def __init__(self, client: Client, tenant: str, name: str, started: rp.RunInfo) -> None:
        super().__init__(client, tenant, name)
        self.started = started
        self.id = started.run

    @contextlib.asynccontextmanager
    async def run(
        self, run: str | None = None, *, version: int | None = None
    ) -> AsyncIterator[Run]:
        """A sub-run of this run (a dispatched agent): same workspace, same version unless
        ``version`` says otherwise."""
        async with self._run(run, self.id, version) as handle:
            yield handle
