"""``quill/inboxes.py`` on a real server: every inbox a Quill connection names carries 128
random bits, and the services' user is answered on the tenant's own inbox."""

from __future__ import annotations

import asyncio
import base64
import os

import nats
import nats.errors
import pytest
from nats.aio.msg import Msg

from quill import inboxes
from quill.connection import connect
from quill.credentials import NatsAuth


def random_part(subject: str) -> str:
    token = subject.rsplit(".", 1)[1]
    assert len(token) >= 22, subject
    assert len(base64.urlsafe_b64decode(token[:22] + "==")) == 16, subject
    return token


async def test_a_quill_connection_names_no_inbox_one_could_guess(nats_url: str) -> None:
    nc = await connect(nats_url, "test", auth=NatsAuth())
    try:
        seen: list[str] = []

        async def echo(msg: Msg) -> None:
            seen.append(msg.reply)
            await msg.respond(b"pong")

        await nc.subscribe("echo", cb=echo)
        for _ in range(5):
            assert (await nc.request("echo", b"", timeout=5)).data == b"pong"
        made = [nc.new_inbox() for _ in range(5)]
    finally:
        await nc.close()
    # nats-py's own: its mux prefix, then a token; a NUID would share 12 characters
    for names in (seen, made):
        tokens = [random_part(name)[:22] for name in names]
        for one, other in zip(tokens, tokens[1:], strict=False):
            assert len(os.path.commonprefix([one, other])) < 8, (one, other)
    assert len({name.rsplit(".", 1)[0] for name in seen}) == 1  # one mux, as before


async def test_the_services_user_is_answered_on_the_tenants_inbox(nats_url: str) -> None:
    system = await nats.connect(nats_url, inbox_prefix=inboxes.SYSTEM_INBOX)
    try:
        seen: list[str] = []

        async def echo(msg: Msg) -> None:
            seen.append(msg.reply)
            await msg.respond(msg.data)

        await system.subscribe("ws.qry.*.w.read", cb=echo)
        for tenant in ("acme", "globex", "acme"):
            subject = f"ws.qry.{tenant}.w.read"
            got = await inboxes.request(system, subject, tenant.encode(), timeout=5, tenant=tenant)
            assert got.data == tenant.encode()
        plain = await inboxes.request(system, "ws.qry.acme.w.read", b"x", timeout=5)
        assert plain.data == b"x"
        with pytest.raises(nats.errors.NoRespondersError):
            await inboxes.request(system, "ws.qry.none.w.nothing", b"", timeout=5, tenant="none")
        await system.subscribe("ws.qry.silent.w.stat")  # never answers
        with pytest.raises(nats.errors.TimeoutError):
            await inboxes.request(system, "ws.qry.silent.w.stat", b"", timeout=0.2, tenant="silent")
        muxes = inboxes._muxes[system]
        assert all(not mux.waiting for mux in muxes.values())  # nothing left behind
    finally:
        await system.close()
    acme, globex, again, own = seen
    assert acme.startswith("_INBOX_acme.") and again.startswith("_INBOX_acme.")
    assert globex.startswith("_INBOX_globex.")
    assert own.startswith(inboxes.SYSTEM_INBOX + ".")  # no tenant named: its own inbox
    assert acme.rsplit(".", 1)[0] == again.rsplit(".", 1)[0]  # one subscription per tenant
    assert random_part(acme) != random_part(again)
    for reply in (acme, globex):
        random_part(reply.rsplit(".", 1)[0])  # the tenant mux: 128 bits too


async def test_a_tenant_connection_is_answered_on_its_own_inbox(nats_url: str) -> None:
    """Only the services' user asks on a tenant's behalf: anyone else uses its own."""
    nc = await connect(nats_url, "tenant", auth=NatsAuth(inbox_prefix="_INBOX_acme"))
    try:
        replies: asyncio.Queue[str] = asyncio.Queue()

        async def echo(msg: Msg) -> None:
            await replies.put(msg.reply)
            await msg.respond(b"ok")

        await nc.subscribe("ws.qry.globex.w.read", cb=echo)
        await inboxes.request(nc, "ws.qry.globex.w.read", b"", timeout=5, tenant="globex")
        assert (await replies.get()).startswith("_INBOX_acme.")
    finally:
        await nc.close()
