"""Reply subjects nobody else can guess, on an inbox only the tenant concerned may read.

A request's reply subject is the requester's secret: whoever can publish on it answers in the
requester's place. nats-py names them from a NUID (a random prefix, then a counter with a
fixed step: predictable once one is seen) and adds 16 random bits per request; a tenant that
saw one of the gateway's reply subjects on its own request subjects (a bridge tenant does)
could reach every other tenant's in-flight requests of the same connection in a few seconds
(issue 28, item 5). Two things here close that:

* ``harden`` gives a connection a generator of 128-bit random names from the operating
  system's source (``secrets``) in place of its NUID, for every inbox nats-py makes: its
  request mux and its tokens, ``new_inbox``, JetStream's deliver subjects. It keeps the NUID's
  22 characters, which nats-py's request mux relies on.
* ``request`` answers a request for a tenant on that tenant's own inbox (``_INBOX_<tenant>``)
  when the connection is the services' user, who acts for every tenant (the gateway, the CLI
  of an operator): the services answer a tenant's request only into the tenant's own inbox
  (``infra/bus.py: reply_allowed``), and what a tenant sees on its request subjects is then
  an inbox of its own, nothing of another tenant's. One wildcard subscription per tenant
  inbox, a fresh 128-bit token per request (as nats-py's own mux, on another prefix).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import weakref
from collections import OrderedDict

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from quill.credentials import DEFAULT_INBOX, SYSTEM_USER

SYSTEM_INBOX = f"{DEFAULT_INBOX}_{SYSTEM_USER}"
"""The services' inbox prefix under ``--tenants``."""
TENANT_INBOXES = 1024
"""Tenant inboxes one connection keeps subscribed at most (the least recently used idle one
goes first)."""
_NO_RESPONDERS = "503"


def token() -> str:
    """22 characters of base64url: 128 bits from the operating system's random source."""
    return secrets.token_urlsafe(16)


class StrongNUID:
    """What nats-py asks its NUID for (``next``: 22 characters), but unguessable."""

    def next(self) -> bytearray:
        return bytearray(token(), "ascii")


def harden(nc: NATS) -> NATS:
    """Make every inbox nats-py names for ``nc`` from now on unguessable (``StrongNUID``).
    A request mux it made before keeps its prefix; its tokens are strong from now on."""
    if not isinstance(getattr(nc, "_nuid", None), StrongNUID):
        nc._nuid = StrongNUID()  # type: ignore[assignment]
    return nc


def own_inbox(nc: NATS) -> str | None:
    """The inbox prefix of a connection (``_INBOX`` or ``_INBOX_<user>``)."""
    prefix = getattr(nc, "_inbox_prefix", None)
    return bytes(prefix).decode() if prefix else None


def tenant_inbox(tenant: str) -> str:
    """``_INBOX_<tenant>``: the only inbox prefix a tenant's NATS user may subscribe to."""
    return f"{DEFAULT_INBOX}_{tenant}"


def inbox_for(nc: NATS, tenant: str | None) -> str | None:
    """The inbox prefix a request for ``tenant`` is answered on: the tenant's own when ``nc``
    is the services' user, else the connection's own (None)."""
    if tenant is not None and own_inbox(nc) == SYSTEM_INBOX:
        return tenant_inbox(tenant)
    return None


class _Mux:
    """One inbox prefix's replies: ``<prefix>.<128 bits>.*``, a future per token."""

    def __init__(self, nc: NATS, prefix: str) -> None:
        self._nc = nc
        self.subject = f"{prefix}.{token()}."
        self.waiting: dict[str, asyncio.Future[Msg]] = {}
        self._sub: Subscription | None = None
        self._lock = asyncio.Lock()

    async def _subscribed(self) -> None:
        async with self._lock:
            if self._sub is None:
                self._sub = await self._nc.subscribe(self.subject + "*", cb=self._on_reply)

    async def _on_reply(self, msg: Msg) -> None:
        future = self.waiting.get(msg.subject[len(self.subject) :])
        if future is not None and not future.done():
            future.set_result(msg)

    async def request(
        self, subject: str, data: bytes, timeout: float, headers: dict[str, str] | None
    ) -> Msg:
        await self._subscribed()
        key = token()
        future: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self.waiting[key] = future
        try:
            await self._nc.publish(subject, data, reply=self.subject + key, headers=headers)
            try:
                msg = await asyncio.wait_for(future, timeout)
            except TimeoutError:
                raise nats.errors.TimeoutError from None
        finally:
            del self.waiting[key]
        if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            raise nats.errors.NoRespondersError
        return msg

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()


_muxes: weakref.WeakKeyDictionary[NATS, OrderedDict[str, _Mux]] = weakref.WeakKeyDictionary()


def _mux(nc: NATS, prefix: str) -> _Mux:
    muxes = _muxes.setdefault(nc, OrderedDict())
    mux = muxes.get(prefix)
    if mux is None:
        mux = muxes[prefix] = _Mux(nc, prefix)
        idle = [p for p, m in muxes.items() if not m.waiting and p != prefix]
        for old in idle[: max(0, len(muxes) - TENANT_INBOXES)]:
            asyncio.ensure_future(muxes.pop(old).close())
    else:
        muxes.move_to_end(prefix)
    return mux


async def request(
    nc: NATS,
    subject: str,
    data: bytes,
    *,
    timeout: float,
    headers: dict[str, str] | None = None,
    tenant: str | None = None,
) -> Msg:
    """``nc.request``, answered on ``tenant``'s own inbox when ``nc`` acts for every tenant
    (``inbox_for``); the reply subject carries 128 random bits either way (``harden``).

    Raises:
        nats.errors.TimeoutError: no reply within ``timeout``.
        nats.errors.NoRespondersError: nobody listens on ``subject``.
        nats.errors.Error: the connection's own errors.
    """
    harden(nc)
    prefix = inbox_for(nc, tenant)
    if prefix is None:
        return await nc.request(subject, data, timeout=timeout, headers=headers)
    return await _mux(nc, prefix).request(subject, data, timeout, headers)
