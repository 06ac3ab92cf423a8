"""The SDK client as the CLI uses it: fail fast when no server answers (saying how to start
one), refuse a ``--nats-url`` that is not a NATS URL, and make waiting visible.

``CliQuill`` sends each command through ``Noting``, the SDK's hook for how a command waits
(``quill/waiting.py``): once without waiting (``Ws-Wait: 0``) first. When it is refused with
``LOCKED`` or ``APPROVAL_REQUIRED`` and the user asked to ``--wait``, it says on stderr what
it waits for (the lock's holder and expiry, the approval's id and how to decide it) and sends
the *same* request (same request id: one approval, no second change) again with the wait, a
spinner running meanwhile on a terminal. Without ``--wait``, a request held for approval is
kept in ``pending_dir()`` (mode 0600) so that ``quill resume ID`` can finish it once approved.
A command a bridge (``quill attach``) has not answered within ``BRIDGE_NOTE_S`` is said to be
waiting for the bridge's user.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import msgspec
from nats.aio.client import Client as NATS
from rich.console import Console

from contracts.errors import ErrorCode, QuillError
from infra import bridges
from quill import connection
from quill.client import Quill
from quill.waiting import Asked, Waiting

T = TypeVar("T")

SCHEMES = ("nats", "tls", "ws", "wss")
"""What a NATS URL may start with (``nats://``...); a URL without a scheme is ``nats://``."""
CONNECT_WAIT_S = 0.0
"""How long the CLI retries its first connection: not at all (a refused connection is
reported at once)."""
BRIDGE_NOTE_S = 1.0
"""A command a bridge has not answered this long after it was sent is said to wait for the
bridge's user."""
PROBE_S = 2.0
"""How long the look for a listening server waits for a TCP connection."""
CLOSE_S = 2.0
"""How long closing the connection may take before the CLI gives up on it and exits (Ctrl-C
ends a command promptly, whatever state the connection is in)."""
WAITS = (ErrorCode.LOCKED, ErrorCode.APPROVAL_REQUIRED)


def check_url(url: str, source: str) -> None:
    """Refuse a URL that is not NATS's (``http://`` is the gateway's).

    Raises:
        QuillError: ``INVALID_ARGUMENT``, naming ``source`` (``--nats-url``...).
    """
    for one in connection.servers(url):
        scheme, sep, _ = one.partition("://")
        if sep and scheme.lower() not in SCHEMES:
            gateway = (
                " (that is the gateway's address, for MCP and REST)"
                if scheme.lower() in ("http", "https")
                else ""
            )
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"{source} {one}: not a NATS URL{gateway}; a NATS URL starts with nats:// "
                "(or tls://, ws://, wss://), as quill up prints it: nats://127.0.0.1:4222",
                {"url": one},
            )


def pending_dir() -> Path:
    """Where requests held for approval wait for ``quill resume`` (``$XDG_STATE_HOME``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "quill" / "pending"


def pending_file(approval_id: str) -> Path:
    """Raises: QuillError: ``INVALID_ARGUMENT`` for an id that is not one."""
    if not approval_id or not all(c.isalnum() or c in "-_:" for c in approval_id):
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Not an approval id: {approval_id!r}")
    return pending_dir() / f"{approval_id.replace(':', '_')}.json"


def keep_pending(approval_id: str, tenant: str, workspace: str, kind: str, op: str) -> Path:
    """Note where the request ``approval_id`` waits, for ``quill resume ID`` (Quill keeps the
    request itself and carries it out once approved: no contents are kept here)."""
    path = pending_file(approval_id)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    record = {
        "approval_id": approval_id,
        "workspace": f"{tenant}/{workspace}",
        "op": f"{kind}.{op}",
    }
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(record, out)
    os.replace(tmp, path)
    return path


def load_pending(approval_id: str) -> dict[str, Any]:
    """Raises: QuillError: ``FILE_NOT_FOUND`` when no request of that id is kept here."""
    try:
        return dict(json.loads(pending_file(approval_id).read_text()))
    except (OSError, ValueError):
        raise QuillError(
            ErrorCode.FILE_NOT_FOUND,
            f"Approval {approval_id} is not one this user asked for here: name its workspace "
            f"(quill resume WORKSPACE {approval_id})",
            {"approval_id": approval_id},
        ) from None


def drop_pending(approval_id: str) -> None:
    with contextlib.suppress(OSError, QuillError):
        pending_file(approval_id).unlink()


@contextlib.contextmanager
def spinner(text: str) -> Iterator[None]:
    """A spinner after ``text`` on stderr, on a terminal only."""
    if not (sys.stderr.isatty() and sys.stdout.isatty()):
        yield
        return
    with Console(stderr=True).status(text):
        yield


def _when(value: Any) -> str:
    """An ISO time as the CLI shows every time (``2025-06-01 10:42:07``, UTC)."""
    text = str(value or "")
    return text[:19].replace("T", " ") if text else "-"


def waiting_text(exc: QuillError, tenant: str, workspace: str, wait_ms: int) -> str:
    """What a command waits for, from the refusal that made it wait."""
    name, details, up_to = f"{tenant}/{workspace}", exc.details, f"up to {wait_ms / 1000:g}s"
    if exc.code == ErrorCode.LOCKED:
        holder = details.get("holder") or "another session"
        return (
            f"quill: waiting ({up_to}) for session {holder}'s lock on {name} to go "
            f"(it expires {_when(details.get('expires'))})"
        )
    approval = details.get("approval_id", "?")
    return (
        f"quill: waiting ({up_to}) for approval {approval} on {name}: "
        f"quill approve {name} {approval} (or quill deny {name} {approval})"
    )


class Noting(Waiting):
    """The CLI's waiting (module docstring), as its ``Quill`` sends each command and exec
    request (``quill/waiting.py``). ``say`` prints a note."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
        self.keep_for_resume = True

    async def send(self, asked: Asked, send: Callable[[int], Awaitable[T]]) -> T:
        """A change: sent without waiting, then, refused for a lock or an approval, said
        what it waits for and sent again with the wait. An exec request: sent with its wait.
        Either, left waiting for approval, noted for ``quill resume ID``."""
        try:
            if asked.kind != "cmd":
                return await send(asked.wait_ms)
            return await self._waiting(asked, send)
        except QuillError as exc:
            if exc.code == ErrorCode.APPROVAL_REQUIRED and self.keep_for_resume:
                approval = str(exc.details.get("approval_id", asked.request_id))
                keep_pending(approval, asked.tenant, asked.workspace, asked.kind, asked.op)
            raise

    async def _waiting(self, asked: Asked, send: Callable[[int], Awaitable[T]]) -> T:
        try:
            return await self._noting_bridge(send(0), asked.tenant, asked.workspace)
        except QuillError as exc:
            if exc.code not in WAITS or asked.wait_ms <= 0:
                raise
            line = waiting_text(exc, asked.tenant, asked.workspace, asked.wait_ms)
        self.say(line)
        with spinner("waiting"):
            return await send(asked.wait_ms)

    async def _noting_bridge(self, reply: Awaitable[T], tenant: str, workspace: str) -> T:
        """``await reply``; if it takes ``BRIDGE_NOTE_S`` and a bridge serves the workspace,
        say that its user is asked."""
        task = asyncio.ensure_future(reply)
        done, _ = await asyncio.wait({task}, timeout=BRIDGE_NOTE_S)
        if done:
            return task.result()
        try:
            claim = await self._bridge(tenant, workspace)
        except BaseException:
            task.cancel()
            raise
        if claim is None:
            return await task
        self.say(
            f"quill: waiting for the user of the bridge serving {tenant}/{workspace} "
            f"({claim.client}:{claim.path}, quill attach) to answer"
        )
        with spinner("waiting for the bridge's user"):
            return await task

    async def _bridge(self, tenant: str, workspace: str) -> bridges.Claim | None:
        """The live claim of a bridge on the workspace, if any (a failed look is none)."""
        try:
            kv = bridges.tenant_bucket(self.nc.jetstream())
            entry = await asyncio.wait_for(kv.get(bridges.key(tenant, workspace)), 2.0)
            claim = msgspec.json.decode(entry.value or b"", type=bridges.Claim)
        except Exception:  # no bucket, no key, no permission: not known to be a bridge
            return None
        return claim if claim.live else None


class CliQuill(Quill):
    """``Quill`` with the CLI's waiting (``Noting``) and a close that gives up."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting = Noting(self.nc)

    async def close(self) -> None:
        """Close the connection; after ``CLOSE_S`` give up (the process is about to exit)."""
        closing = asyncio.ensure_future(super().close())
        done, _ = await asyncio.wait({closing}, timeout=CLOSE_S)
        if not done:
            closing.cancel()
            return
        closing.result()


async def _refused(url: str) -> str | None:
    """Why no server of ``url`` takes a TCP connection (each tried once, briefly), or None
    when one does: a refused port is known in a millisecond, where the client would retry."""
    reasons = []
    for one in connection.servers(url):
        parsed = urlsplit(one if "://" in one else f"nats://{one}")
        try:
            host, port = parsed.hostname or "127.0.0.1", parsed.port or 4222
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), PROBE_S)
        except TimeoutError:
            reasons.append(f"{one}: no answer in {PROBE_S:g}s")
            continue
        except (OSError, ValueError) as exc:
            reasons.append(f"{one}: {getattr(exc, 'strerror', None) or exc}")
            continue
        writer.close()
        return None
    return "; ".join(reasons) or "no server URL"


async def connect(url: str, source: str, **options: Any) -> CliQuill:
    """A ``CliQuill`` on ``url``, failing at once when nothing answers.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` (not a NATS URL), ``UNAVAILABLE`` (saying how to
            start Quill).
    """
    check_url(url, source)
    start = "Is Quill running? Start it with `quill up` (here, or point --nats-url or "
    start += "$QUILL_NATS_URL at yours)"
    why = await _refused(url)
    if why is not None:
        raise QuillError(
            ErrorCode.UNAVAILABLE, f"Cannot connect to NATS at {url} ({why}). {start}", {"url": url}
        )
    try:
        quill = await CliQuill.connect(url, connect_wait=CONNECT_WAIT_S, **options)
    except QuillError as exc:
        if exc.code != ErrorCode.UNAVAILABLE or "Authorization" in exc.message:
            raise
        raise QuillError(ErrorCode.UNAVAILABLE, f"{exc.message}. {start}", {"url": url}) from None
    assert isinstance(quill, CliQuill)
    return quill
