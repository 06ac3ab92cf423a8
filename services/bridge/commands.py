"""Commands and git on a local folder, run by the local sandbox provider with the folder as
the checkout (``infra.exec``, as on an executor).

A command is a plain process in its own session (``infra.exec.sandbox.local``): the same
clean environment (``PATH``, a private ``HOME``), limits, timeout (SIGTERM, SIGKILL 5 s later,
nothing left running) and output caps as on an executor, but no sandbox: it runs as the
bridge's user, in the folder, and can reach whatever that user can. On a restricted workspace
its user approves each command first. One command runs at a time.

There is no log to commit to: what a command changed is found by comparing the folder's stat
signatures before and after (the executor's ignore patterns, ``node_modules`` and the like,
left out) and reported in ``changes.paths`` with ``committed: false``; the version does not
move. Output is redacted and the result assembled as on an executor (``infra.exec.results``;
past the output cap, its beginning only). Git actions go through ``infra.exec.git``
(hardened git, the actor as author); ``push``, ``pull`` and ``clone`` need credentials a bridge
does not hold nor lend: refused.
"""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import msgspec

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import check_stdin
from contracts.paths import display, normalize, printable
from core.globs import Globs
from infra.exec import sandbox
from infra.exec.answer import timeout_ms
from infra.exec.capture import invalid
from infra.exec.checkout import DEFAULT_IGNORE
from infra.exec.commit import MAX_SKIPPED, SHOWN
from infra.exec.git import READ_ONLY_GIT, Credentials, run_git, sandbox_runner
from infra.exec.results import Output, command_result
from infra.safefs import Dir, walk
from infra.secret_registry import secrets_from_env
from services.bridge.folder import Folder, Sig, sig_of

NETWORK_GIT = frozenset({"push", "pull", "clone"})
Snapshot = dict[str, tuple[bool, Sig]]
"""Per path: (is a directory, stat signature)."""
Invalid = dict[str, tuple[str, Sig]]
"""Per entry whose name breaks the workspace path rule (shown escaped, as ``printable``
does): (why, stat signature). What is below such a directory is not looked at."""


def snapshot(root: Path) -> tuple[Snapshot, Invalid]:
    """Every entry of the folder but what the ignore patterns leave out, and apart the entries
    whose names are not workspace names (``contracts.paths``) (blocking)."""
    ignore = Globs.names(DEFAULT_IGNORE)
    out: Snapshot = {}
    bad: Invalid = {}

    def prune(rel: str) -> bool:
        return invalid(rel) is None and ignore.match_dir(rel)

    def enter(rel: str) -> bool:
        return invalid(rel) is None

    with Dir.open(root) as top:  # each directory from its parent's descriptor, no link followed
        for rel, _, _, st in walk(top, prune, enter=enter):
            why = invalid(rel)
            if why is not None:
                bad[printable(rel)] = (why, sig_of(st))
            else:
                out[rel] = (stat.S_ISDIR(st.st_mode), sig_of(st))
    return out, bad


def skipped(before: Invalid, after: Invalid) -> list[rp.SkippedPath]:
    """The entries with names that are not workspace names the command made or changed."""
    return [
        rp.SkippedPath(path=path, reason=f"invalid name: {why}: not shown")
        for path, (why, sig) in sorted(after.items())
        if before.get(path) != (why, sig)
    ][:MAX_SKIPPED]


def compare(before: Snapshot, after: Snapshot) -> list[rp.ChangedPath]:
    """What changed between two snapshots: created and modified entries, and the topmost
    deleted ones (a directory's own signature changing is not a change)."""
    out: list[rp.ChangedPath] = []
    for path, (is_dir, sig) in after.items():
        kind: rp.Kind = "directory" if is_dir else "file"
        was = before.get(path)
        if was is None or was[0] != is_dir:
            out.append(rp.ChangedPath(path=path, change="created", kind=kind))
        elif not is_dir and was[1] != sig:
            out.append(rp.ChangedPath(path=path, change="modified", kind=kind))
    gone = {p for p, (d, _) in before.items() if p not in after or after[p][0] != d}
    for path in gone:
        if path.rpartition("/")[0] in gone:
            continue
        kind = "directory" if before[path][0] else "file"
        out.append(rp.ChangedPath(path=path, change="deleted", kind=kind))
    out.sort(key=lambda c: (c.path, c.change != "deleted"))
    return out


class LocalCommands:
    """``exec.run`` and ``exec.git`` on one attached folder."""

    def __init__(self, folder: Folder, uri: str) -> None:
        self.folder, self.uri = folder, uri
        self.provider = sandbox.LocalProvider()
        self.secrets = secrets_from_env()
        self._one = asyncio.Lock()

    def workdir(self, workdir: str) -> str:
        """The working directory, relative to the folder, links resolved.

        Raises:
            QuillError: ``ACCESS_DENIED`` out of the folder, ``FILE_NOT_FOUND``,
                ``NOT_A_DIRECTORY``.
        """
        path = normalize(workdir)
        real = self.folder.locate(path)
        if not real.exists():
            raise QuillError(
                ErrorCode.FILE_NOT_FOUND, f"Directory not found: {display(path)}", {"path": path}
            )
        if not real.is_dir():
            raise QuillError(
                ErrorCode.NOT_A_DIRECTORY, f"Not a directory: {display(path)}", {"path": path}
            )
        rel = real.relative_to(self.folder.root).as_posix()
        return "" if rel == "." else rel

    def _limits(self, timeout_s: float) -> sandbox.Limits:
        return sandbox.Limits(cpu_s=int(timeout_s) + 2)

    def _timeout_ms(self, req: rq.Execution) -> int:
        return timeout_ms(req, self.folder.limits.max_exec_ms)

    def _changes(
        self, before: tuple[Snapshot, Invalid], after: tuple[Snapshot, Invalid]
    ) -> rp.CapturedChanges:
        changed = compare(before[0], after[0])
        version = self.folder.version
        return rp.CapturedChanges(
            base_version=version,
            committed=False,
            version=version,
            paths=changed[:SHOWN],
            total=len(changed),
            conflicts=[],
            skipped=skipped(before[1], after[1]),
            ignored=[],
        )

    async def run(
        self, req: rq.RunCommand, workdir: str, on_output: sandbox.OnOutput | None
    ) -> tuple[sandbox.Outcome, Output, rp.CommandResult]:
        """Run ``req`` in the folder (``workdir`` from ``self.workdir``): its outcome, its output
        (redacted, ``Output.redacted`` says which secrets), and the result to answer.

        Raises:
            QuillError: ``EXECUTION_FAILED`` when it cannot be started, ``SIZE_LIMIT_EXCEEDED``
                for a standard input over ``EXEC_STDIN_MAX_BYTES``.
        """
        check_stdin(req.stdin)
        cap = self.folder.limits.max_output_bytes
        timeout_s = self._timeout_ms(req) / 1000
        spawn = sandbox.Spawn(
            argv=["bash", "-c", req.command],
            workdir=workdir,
            env=dict(req.env or {}),
            timeout_s=timeout_s,
            output_cap=cap,
            stdin=req.stdin,
        )
        output = Output(cap, self.secrets, head_only=True)  # no output kept to page through

        async def feed(stream: sandbox.StreamName, chunk: bytes) -> None:
            output.feed(stream, chunk)
            if on_output is not None:
                await on_output(stream, chunk)

        async with self._one:
            before = await asyncio.to_thread(snapshot, self.folder.root)
            try:
                outcome = await self.provider.run(
                    self.folder.root, spawn, self._limits(timeout_s), feed
                )
            except sandbox.SandboxError as exc:
                raise QuillError(
                    ErrorCode.EXECUTION_FAILED, f"The command could not be started: {exc}"
                ) from exc
            after = await asyncio.to_thread(snapshot, self.folder.root)
        output.finish(outcome)
        return outcome, output, command_result(outcome, output, self._changes(before, after))

    def check_git(self, req: rq.GitCommand) -> None:
        """Raises:
        QuillError: ``ACCESS_DENIED`` for ``push``, ``pull`` and ``clone``."""
        if req.action in NETWORK_GIT:
            raise QuillError(
                ErrorCode.ACCESS_DENIED,
                f"git {req.action} is not available on a local workspace ({self.uri}): the "
                "bridge holds no git credentials and does not lend its user's; its user can "
                "run it in the folder",
                {"action": req.action},
            )

    async def git(self, req: rq.GitCommand, actor: str | None) -> rp.GitResult:
        """A git action on the repository at ``req.workdir``.

        Raises:
            QuillError: as ``infra.exec.git`` documents, and ``check_git``.
        """
        self.check_git(req)
        timeout_ms = self._timeout_ms(req)
        mutating = req.action not in READ_ONLY_GIT
        async with self._one:
            before = await asyncio.to_thread(snapshot, self.folder.root) if mutating else None
            result = await run_git(
                msgspec.structs.replace(req, timeout_ms=timeout_ms),
                checkout=self.folder.root,
                run=sandbox_runner(self.provider, self._limits(timeout_ms / 1000)),
                actor=actor,
                credentials=Credentials(),
                output_cap=self.folder.limits.max_output_bytes,
            )
            if before is None:
                return result
            after = await asyncio.to_thread(snapshot, self.folder.root)
        return msgspec.structs.replace(result, changes=self._changes(before, after))
