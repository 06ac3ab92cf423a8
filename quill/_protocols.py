"""What a workspace's handle needs of its client: the ``Client`` protocol.

``Quill`` (``quill/client.py``) makes ``Workspace`` handles, so the handles cannot import it
back, not even for their annotations (``TYPE_CHECKING``): that would be a circle, only
hidden. They name this protocol instead, the few attributes and methods of a client they
use; ``Quill`` has them (mypy checks it where ``Quill`` hands itself to a ``Workspace``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import msgspec
from nats.aio.client import Client as NATS
from nats.nuid import NUID

from contracts import replies as rp
from contracts import requests as rq
from contracts.subjects import Subjects
from quill._transport import OnOutput

R = TypeVar("R")
T = TypeVar("T")


class Client(Protocol):
    """A connection to Quill as a workspace's handle uses it (``quill.client.Quill``)."""

    nc: NATS
    subjects: Subjects
    timeout: float
    actor: str | None
    session: str | None
    _nuid: NUID
    """Request ids (shared by every view of a client)."""
    _seen: OrderedDict[str, int]
    """The highest version seen per workspace (read-your-writes)."""

    def as_actor(
        self, actor: str | None, *, session: str | None = None, run: str | None = None
    ) -> Client: ...

    async def send(
        self,
        tenant: str,
        workspace: str,
        body: rq.Request,
        *,
        request_id: str | None = None,
        wait_ms: int | None = None,
    ) -> tuple[int | None, Any]: ...

    async def exec_request(
        self,
        tenant: str,
        workspace: str,
        op: str,
        body: msgspec.Struct,
        result_type: type[R],
        *,
        request_id: str,
        deadline_s: float,
        heard: Callable[[], float],
    ) -> tuple[int | None, R]: ...

    async def retry_conflicts(
        self, attempt: Callable[[], Awaitable[T]], *, retries: int | None = None
    ) -> T: ...


class Handle(Protocol):
    """What a command's or a shell's handle (``quill/command.py``, ``quill/shell.py``) needs
    of its workspace: ``Workspace`` makes them, so they name this instead of importing it
    back (the same reason as ``Client``)."""

    client: Client
    tenant: str
    name: str
    last_version: int

    async def _exec(
        self, body: rq.Request, timeout_ms: int | None, on_output: OnOutput | None
    ) -> Any: ...

    async def exec(
        self,
        command: str,
        *,
        timeout_ms: int | None = None,
        on_output: OnOutput | None = None,
        stdin: bytes | None = None,
        shell: str | None = None,
        queue: bool = False,
    ) -> rp.CommandResult: ...
