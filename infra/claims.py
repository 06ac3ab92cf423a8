"""A bridge's claims go through the services: the one way a local workspace's name is held.

A bridge (``quill attach``) once wrote its claim into ``WS_BRIDGES`` itself, so a bridge tenant
held ``$KV`` and JetStream rights: it stored any number of keys of any content (20,000 claims,
62 MB in 0.3 s), and JetStream answered its puts and direct gets on any reply subject it named
(another tenant's inbox, another tenant's log; issue 28). Now a bridge asks, on
``<root>.bridge.<tenant>.<op>``, which only its tenant may publish:

* ``claim`` (one writer answers, queue group): claims the name or renews the bridge's claim.
  The writer refuses a server workspace's name (its log has events) and another live bridge's,
  bounds the claim's fields (``MAX_OWNER``, ``MAX_CLIENT``, ``MAX_PATH_BYTES``) and counts the
  tenant's live claims against its quota: ``MAX_TENANT_CLAIMS`` claims and
  ``MAX_TENANT_CLAIM_BYTES`` bytes of them (``SIZE_LIMIT_EXCEEDED`` past either). The claim's
  expiry is the writer's clock, not the bridge's word.
* ``release`` (one writer): drops the bridge's own claim.
* ``seen`` (every writer, reader and executor answers): how many of the tenant's live claims
  it counts (``local_workspaces``); a bridge serves once each counts its own.

Answers go only into the tenant's own inbox (``bus.reply_allowed``); a request whose reply
subject is not one is not acted upon.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from contracts import codec
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import QUEUE_WRITER, Subjects, check_id
from infra import bridges, bus
from infra import log as eventlog
from infra.bridges import Bridges, Claim
from quill import inboxes

log = logging.getLogger("quill.claims")

MAX_TENANT_CLAIMS = 64
"""Live claims (local workspaces) one tenant may hold at once."""
MAX_TENANT_CLAIM_BYTES = 64 * 1024
"""Bytes of stored claims one tenant may hold at once."""
MAX_OWNER = 128
MAX_CLIENT = 255
MAX_PATH_BYTES = 2048
ANSWER_S = 10.0
"""How long a bridge waits for a writer's answer."""
SEEN_WINDOW_S = 0.3
"""How long the answers to one ``seen`` are gathered."""


class ClaimRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    workspace: str
    owner: str
    """The bridge's instance id: a claim is renewed and released by its owner only."""
    client: str = ""
    path: str = ""


class ReleaseRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    workspace: str
    owner: str


def _text(kind: str, value: str, most: int) -> str:
    if len(value.encode("utf-8", "surrogatepass")) > most:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"A claim's {kind} is at most {most} bytes",
            {"field": kind, "limit": most},
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"A claim's {kind} has control characters")
    return value


class Registrar:
    """A writer's side: claims and releases names for its tenants' bridges."""

    def __init__(self, js: JetStreamContext, subjects: Subjects, view: Bridges) -> None:
        self._js, self._subjects, self._view = js, subjects, view

    async def _server_workspace(self, tenant: str, workspace: str) -> bool:
        return await eventlog.last_seq(self._js, self._subjects.evt(tenant, workspace)) > 0

    def _quota(self, tenant: str, workspace: str, claim: Claim) -> None:
        others = {w: c for w, c in self._view.of_tenant(tenant).items() if w != workspace}
        if len(others) + 1 > MAX_TENANT_CLAIMS:
            raise QuillError(
                ErrorCode.SIZE_LIMIT_EXCEEDED,
                f"Tenant {tenant} holds {len(others)} local workspaces, the most it may: "
                "stop a bridge (quill attach) first",
                {"limit": MAX_TENANT_CLAIMS, "held": len(others)},
            )
        used = sum(bridges.size(c) for c in others.values())
        size = bridges.size(claim)
        if used + size > MAX_TENANT_CLAIM_BYTES:
            raise QuillError(
                ErrorCode.SIZE_LIMIT_EXCEEDED,
                f"Tenant {tenant}'s local workspaces hold {used} bytes of claims; this one "
                f"({size} bytes) would pass the {MAX_TENANT_CLAIM_BYTES} allowed: stop a "
                "bridge (quill attach) first",
                {"limit_bytes": MAX_TENANT_CLAIM_BYTES, "bytes": used},
            )

    async def claim(self, tenant: str, request: ClaimRequest) -> dict[str, Any]:
        """Claim (or renew) ``tenant/request.workspace`` for ``request.owner``.

        Raises:
            QuillError: ``INVALID_ARGUMENT`` (a name, a field too long), ``ALREADY_EXISTS``
                (a server workspace, another live bridge's), ``SIZE_LIMIT_EXCEEDED`` (the
                tenant's quota).
        """
        workspace = check_id("workspace", request.workspace)
        owner = _text("owner", request.owner, MAX_OWNER)
        client = _text("client", request.client, MAX_CLIENT)
        path = _text("path", request.path, MAX_PATH_BYTES)
        name = f"{tenant}/{workspace}"
        if await self._server_workspace(tenant, workspace):
            raise QuillError(
                ErrorCode.ALREADY_EXISTS,
                f"{name} is a server workspace (its log has events): attach the folder "
                "under another name",
                {"tenant": tenant, "workspace": workspace},
            )
        stored = Claim(
            owner=owner, client=client, path=path, expires=time.time() + bridges.CLAIM_TTL_S
        )
        self._quota(tenant, workspace, stored)
        kv = bridges.tenant_bucket(self._js)
        try:
            await bridges.claim(kv, tenant, workspace, owner, client, path)
        except KeyWrongLastSequenceError:
            raise QuillError(
                ErrorCode.ALREADY_EXISTS, f"{name} was claimed at the same time"
            ) from None
        self._view.note(tenant, workspace, stored)
        if await self._server_workspace(tenant, workspace):  # created just before the claim
            await self._drop(kv, tenant, workspace)
            raise QuillError(
                ErrorCode.ALREADY_EXISTS, f"{name} is a server workspace (created just now)"
            )
        return {"workspace": name, "expires": stored.expires}

    async def release(self, tenant: str, request: ReleaseRequest) -> dict[str, Any]:
        """Drop ``request.owner``'s claim on ``tenant/request.workspace`` (none: nothing to do).

        Raises:
            QuillError: ``CONFLICT`` when another bridge holds it.
        """
        workspace = check_id("workspace", request.workspace)
        kv = bridges.tenant_bucket(self._js)
        try:
            entry = await kv.get(bridges.key(tenant, workspace))
        except (NotFoundError, KeyError):
            entry = None
        if entry is not None and entry.value:
            held = bridges.decode(entry.value)
            if held.owner != request.owner:
                raise QuillError(
                    ErrorCode.CONFLICT,
                    f"{tenant}/{workspace} is held by another bridge ({held.client}:{held.path})",
                )
            await self._drop(kv, tenant, workspace)
        return {"workspace": f"{tenant}/{workspace}"}

    async def _drop(self, kv: KeyValue, tenant: str, workspace: str) -> None:
        await bridges.release(kv, tenant, workspace)
        self._view.note(tenant, workspace, None)


async def serve(
    nc: NATS,
    subjects: Subjects,
    view: Bridges,
    service: str,
    instance: str,
    *,
    registrar: bool = False,
) -> list[Subscription]:
    """Answer ``seen`` for ``service`` (every instance), and, with ``registrar`` (a writer),
    ``claim`` and ``release`` (one writer of the queue group each)."""

    async def seen(msg: Msg) -> None:
        tenant = subjects.parse_bridge(msg.subject)
        if tenant is None:
            return
        body = {
            "service": service,
            "instance": instance,
            "local_workspaces": len(view.of_tenant(tenant)),
        }
        await bus.respond(msg, codec.encode(body))

    subs = [await nc.subscribe(subjects.bridge("*", "seen"), cb=seen)]
    if registrar:
        handler = Registrar(nc.jetstream(), subjects, view)

        async def on_claim(msg: Msg) -> None:
            body = msg.data
            await _answer(msg, subjects, lambda t: handler.claim(t, claim_request(body)))

        async def on_release(msg: Msg) -> None:
            body = msg.data
            await _answer(msg, subjects, lambda t: handler.release(t, release_request(body)))

        subs += [
            await bus.serve(nc, subjects.bridge("*", "claim"), QUEUE_WRITER, on_claim),
            await bus.serve(nc, subjects.bridge("*", "release"), QUEUE_WRITER, on_release),
        ]
    return subs


def claim_request(body: bytes) -> ClaimRequest:
    return codec.decode(body, ClaimRequest)


def release_request(body: bytes) -> ReleaseRequest:
    return codec.decode(body, ReleaseRequest)


Act = Callable[[str], Awaitable[dict[str, Any]]]
"""What a request asks, given its tenant: the result."""


async def _answer(msg: Msg, subjects: Subjects, act: Act) -> None:
    """Answer ``msg`` with what ``act`` makes of it, or the error it raised; a request whose
    reply subject is not its tenant's inbox is not acted upon."""
    tenant = subjects.parse_bridge(msg.subject)
    if tenant is None or not msg.reply:
        return
    if not bus.reply_allowed(msg.subject, msg.reply, inboxes.own_inbox(msg._client)):
        log.warning("not acting on %s: its reply subject is not the tenant's inbox", msg.subject)
        return
    try:
        reply = codec.ok_reply(None, await act(tenant))
    except QuillError as exc:
        reply = codec.error_reply(exc)
    except Exception as exc:  # a lost log, a bug: still one answer
        log.warning("%s failed: %r", msg.subject, exc)
        reply = codec.error_reply(
            QuillError(ErrorCode.UNAVAILABLE, f"Could not change the claim now: {exc!r}")
        )
    await bus.respond(msg, reply)


# ------------------------------------------------------------------ the bridge's side


async def _ask(nc: NATS, subjects: Subjects, tenant: str, op: str, body: msgspec.Struct) -> Any:
    subject = subjects.bridge(tenant, op)
    try:
        msg = await inboxes.request(
            nc, subject, codec.encode(body), timeout=ANSWER_S, tenant=tenant
        )
    except nats.errors.NoRespondersError:
        raise QuillError(ErrorCode.UNAVAILABLE, "No Quill writer is running") from None
    except nats.errors.TimeoutError:
        raise QuillError(
            ErrorCode.UNAVAILABLE, f"No writer answered {op} within {ANSWER_S:.0f}s"
        ) from None
    return codec.decode_reply(msg.data, dict)[1]


async def claim(
    nc: NATS,
    subjects: Subjects,
    tenant: str,
    workspace: str,
    owner: str,
    client: str,
    path: str,
) -> None:
    """Claim ``tenant/workspace`` for the bridge ``owner`` (or renew its claim).

    Raises:
        QuillError: as ``Registrar.claim``; ``UNAVAILABLE`` when no writer answers.
    """
    await _ask(nc, subjects, tenant, "claim", ClaimRequest(workspace, owner, client, path))


async def release(nc: NATS, subjects: Subjects, tenant: str, workspace: str, owner: str) -> None:
    """Release the bridge ``owner``'s claim (errors are logged: the claim lapses anyway)."""
    try:
        await _ask(nc, subjects, tenant, "release", ReleaseRequest(workspace, owner))
    except QuillError as exc:
        log.warning("releasing %s/%s: %s", tenant, workspace, exc.message)


async def seen(
    nc: NATS, subjects: Subjects, tenant: str, expect: int | None = None
) -> dict[str, int]:
    """The live claims of ``tenant`` each service counts, by instance (the answers gathered
    within ``SEEN_WINDOW_S``, or until ``expect`` have answered)."""
    answers = await bus.gather(nc, subjects.bridge(tenant, "seen"), SEEN_WINDOW_S, expect=expect)
    return {
        str(pong.get("instance")): pong["local_workspaces"]
        for pong in answers
        if isinstance(pong, dict) and isinstance(pong.get("local_workspaces"), int)
    }


async def await_seen(
    nc: NATS, subjects: Subjects, tenant: str, before: dict[str, int], timeout: float
) -> list[str]:
    """Wait until every service counts one more of ``tenant``'s live claims than ``before``
    (``seen`` before the claim was made; a service that appeared since: at least one). A
    service known from ``before`` or from an earlier answer that misses a gather's window is
    waited for, not taken for one that has seen the claim: on a loaded host an executor can
    answer after the window, and a request it took for a workspace it did not know was local
    would be answered by it, not by the bridge. Returns the instances still behind after
    ``timeout`` (slow, or gone: the bridge serves anyway, saying so)."""
    deadline = time.monotonic() + timeout
    known = set(before)
    while True:
        counts = await seen(nc, subjects, tenant, expect=len(known) or None)
        known |= set(counts)
        behind = sorted(i for i in known if counts.get(i, -1) < before.get(i, 0) + 1)
        if not behind or time.monotonic() > deadline:
            return behind
