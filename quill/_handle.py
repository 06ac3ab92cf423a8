"""What every method of a ``Workspace`` stands on: its names, the highest version its client
has seen of it (read-your-writes), and how a request of each kind is sent (``_cmd``,
``_qry``, ``_exec``, ``call``). The op a request is sent as, and the type its result decodes
to, come from the registry (``contracts/ops.py``) by the request's type, so the methods above
this (``quill/_reads.py``, ``quill/workspace.py``) only say how their arguments make the
request.

Why a base class: ``Workspace`` is one public class with some forty methods, too many for
one module; its reads and its commands are written in two modules over this one.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, TypeVar

import msgspec

from contracts import ops
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import SDK_WORKSPACES
from quill._protocols import Client
from quill._transport import ExecOutput, OnOutput

V = TypeVar("V")


def remember(recent: OrderedDict[str, V], key: str, value: V) -> V:
    """Keep ``value`` as ``recent``'s most recent entry; past ``SDK_WORKSPACES`` entries, the
    least recent is forgotten (the bound of a client's handles and of what it has seen)."""
    recent[key] = value
    recent.move_to_end(key)
    if len(recent) > SDK_WORKSPACES:
        recent.popitem(last=False)
    return value


class Handle:
    """One workspace of one client (``Workspace`` is this with its methods)."""

    def __init__(self, client: Client, tenant: str, name: str) -> None:
        self.client = client
        self.tenant, self.name = tenant, name
        self._key = f"{tenant}/{name}"

    @property
    def last_version(self) -> int:
        """The highest version of this workspace the client has seen (read-your-writes)."""
        return self.client._seen.get(self._key, 0)

    @last_version.setter
    def last_version(self, version: int) -> None:
        remember(self.client._seen, self._key, version)

    def __repr__(self) -> str:
        return f"Workspace({self.tenant}/{self.name}, seen v{self.last_version})"

    async def call(self, body: rq.Request) -> Any:
        """Send any op's request (``body``'s type names the op: ``contracts/ops.py``) as its
        method would, and return the registry's result type; what ``quill call`` uses.

        Raises:
            QuillError: as the op's method.
        """
        if type(body) not in ops.BY_REQUEST:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Not an op's request: {body!r}")
        if isinstance(body, rq.Command):
            return await self._cmd(body)
        if isinstance(body, rq.Query):
            return await self._qry(body)
        if isinstance(body, rq.Execution):
            return await self._exec(body, body.timeout_ms, None)
        return (await self.client.send(self.tenant, self.name, body))[1]

    async def _cmd(self, body: rq.Command, *, wait_ms: int | None = None) -> Any:
        with self._parked():
            version, result = await self.client.send(self.tenant, self.name, body, wait_ms=wait_ms)
        self.last_version = max(self.last_version, version or 0)
        return result

    @contextlib.contextmanager
    def _parked(self) -> Iterator[None]:
        """A request parked for approval (``APPROVAL_REQUIRED``) makes a version (its
        ``approval_requested`` event): later queries (``approval``) read as of it."""
        try:
            yield
        except QuillError as exc:
            version = (
                exc.details.get("version") if exc.code == ErrorCode.APPROVAL_REQUIRED else None
            )
            if isinstance(version, int):
                self.last_version = max(self.last_version, version)
            raise

    async def _qry(self, body: rq.Query) -> Any:
        return (await self._qry_at(body))[1]

    async def _qry_at(self, body: rq.Query) -> tuple[int, Any]:
        """The result and the workspace version it was answered at."""
        if body.min_version is None and body.version is None and self.last_version:
            body = msgspec.structs.replace(body, min_version=self.last_version)
        version, result = await self.client.send(self.tenant, self.name, body)
        if body.version is None:
            self.last_version = max(self.last_version, version or 0)
        return version or 0, result

    async def _exec(
        self, body: rq.Request, timeout_ms: int | None, on_output: OnOutput | None
    ) -> Any:
        """Run ``body`` on an executor, ``on_output`` given its live output: the reply comes
        while the executor keeps saying it holds the request (``Quill.exec_request``)."""
        client, spec = self.client, ops.of_request(body)
        request_id = client._nuid.next().decode()
        subject = client.subjects.execout(self.tenant, self.name, request_id)
        async with ExecOutput.listening(client.nc, subject, on_output) as output:
            with self._parked():
                version, result = await client.exec_request(
                    self.tenant,
                    self.name,
                    spec.name,
                    body,
                    spec.result,
                    request_id=request_id,
                    deadline_s=(timeout_ms or 600_000) / 1000 + 600,
                    heard=output.heard,
                )
            await output.finished(5)  # the reply may overtake the last of the output
        self.last_version = max(self.last_version, version or 0)
        return result
