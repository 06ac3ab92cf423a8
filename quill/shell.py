"""An open shell of a workspace (``Workspace.shell``): one sandbox running bash where commands
run one at a time, and what one leaves (cwd, exported variables, functions, ``/tmp``,
background processes) the next finds. ``run`` runs a command in it; ``checkpoint`` commits what
its background processes changed since; ``close`` ends it (its processes with it). A shell is
its id only: ``Workspace.shell_of(id)`` makes a handle again from any client of the tenant.
"""

from __future__ import annotations

from contracts import replies as rp
from contracts import requests as rq
from quill._protocols import Handle
from quill._transport import OnOutput


class Shell:
    """An open shell of ``workspace`` (see the module docstring)."""

    def __init__(
        self, workspace: Handle, shell_id: str, opened: rp.ShellOpened | None = None
    ) -> None:
        self.workspace, self.id = workspace, shell_id
        self.opened = opened
        """``exec.shell_open``'s answer (its version, idle timeout, expiry) when this handle
        opened it."""

    def __repr__(self) -> str:
        return f"Shell({self.id!r})"

    async def run(
        self,
        command: str,
        *,
        timeout_ms: int | None = None,
        queue: bool = False,
        stdin: bytes | None = None,
        on_output: OnOutput | None = None,
    ) -> rp.CommandResult:
        """Run ``command`` in the shell (``eval`` by its bash); its changes are committed when
        it returns. ``queue``: wait for a command it runs already instead of ``BUSY``;
        ``stdin``: its standard input, whole (else it is ``/dev/null``)."""
        return await self.workspace.exec(
            command,
            shell=self.id,
            timeout_ms=timeout_ms,
            queue=queue,
            stdin=stdin,
            on_output=on_output,
        )

    async def checkpoint(self) -> rp.ShellCheckpointed:
        """Commit what its background processes changed since its last command."""
        result: rp.ShellCheckpointed = await self.workspace._exec(
            rq.ShellCheckpoint(shell=self.id), None, None
        )
        return result

    async def close(self) -> rp.ShellClosed:
        """End it: its processes are killed, what they changed is committed."""
        result: rp.ShellClosed = await self.workspace._exec(
            rq.ShellClose(shell=self.id), None, None
        )
        return result

    async def __aenter__(self) -> Shell:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
