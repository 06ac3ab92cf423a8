"""Tenants isolated by the NATS server itself (RFC 0059 WCT-1).

A real nats-server configured from ``quill_cli.tenants.authorization``; a writer, a reader and an
executor connected as the system user; tenants connecting with their own credentials and
inbox prefixes. Whatever tenant ``b`` tries on tenant ``a``'s subjects, the server refuses it
(a permissions violation, reported through nats-py's error callback), while the same request
from the system user is answered, so a refusal is the server's doing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import nacl.signing
import nats
import nats.errors
import nkeys
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig
from nats.js.object_store import ObjectStore

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Subjects
from infra import bridges, bus, claims
from quill import inboxes
from quill.client import Quill
from quill.credentials import ENV_NAMES, SYSTEM_USER, NatsAuth
from quill_cli import tenants
from quill_cli.natsserver import NatsServer
from services.executor.app import ExecutorConfig
from tests.helpers import (
    Refusals,
    start_executor,
    start_reader,
    start_writer,
    subscribed,
    update_from,
)

SYSTEM = NatsAuth(SYSTEM_USER, "system-password-for-tests")
A = tenants.Tenant("a", password="tenant-a-password")
B = tenants.Tenant("b", password="tenant-b-password")
C = tenants.Tenant("c", password="tenant-c-password", bridges=True)
_SEED = nkeys.encode_seed(bytes(nacl.signing.SigningKey.generate()), nkeys.PREFIX_BYTE_USER)
D = tenants.Tenant("d", nkey=nkeys.from_seed(bytearray(_SEED)).public_key.decode())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    assert SYSTEM.password is not None
    block = tenants.authorization([A, B, C, D], SYSTEM.password)
    server = NatsServer(tmp_path_factory.mktemp("nats"), extra_config=block).start()
    yield server
    server.stop()


@pytest_asyncio.fixture
async def url(
    server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[str]:
    """The server's URL, with a writer, a reader and an executor running as the system user
    (they read their credentials from the environment, as ``quill up``'s children do)."""
    for name, value in SYSTEM.environ().items():
        monkeypatch.setenv(name, value)
    async with AsyncExitStack() as stack:
        await start_writer(stack, server.url, tmp_path / "writer")
        await start_reader(stack, server.url, tmp_path / "reader")
        local = ExecutorConfig(sandbox="local")
        await start_executor(stack, server.url, tmp_path / "executor", local)
        for name in ENV_NAMES:  # everyone else names their own credentials
            monkeypatch.delenv(name, raising=False)
        yield server.url


async def bare(url: str, tenant: tenants.Tenant, refusals: Refusals) -> NATS:
    """A bare nats-py client with the tenant's credentials and inbox prefix."""
    return await nats.connect(
        url,
        user=tenant.name,
        password=tenant.password,
        inbox_prefix=tenant.inbox,
        error_cb=refusals.on_error,
        allow_reconnect=False,
    )


async def tenant_sdk(url: str, tenant: tenants.Tenant) -> Quill:
    return await Quill.connect(url, user=tenant.name, password=tenant.password, timeout=5)


async def no_answer(call: Awaitable[Any]) -> None:
    with pytest.raises(nats.errors.TimeoutError):
        await call


@pytest_asyncio.fixture
async def system(url: str) -> AsyncIterator[NATS]:
    nc = await bus.connect(url, "test-system", auth=SYSTEM)
    yield nc
    await nc.close()


@pytest_asyncio.fixture
async def a_workspace(url: str) -> AsyncIterator[int]:
    """Tenant a's workspace ``a/w``, holding ``secret.txt``; its version."""
    async with await tenant_sdk(url, A) as quill:
        ws = quill.workspace("a/w")
        await ws.create(exist_ok=True)
        await ws.write("secret.txt", "a's secret\n")
        yield ws.last_version


REQUESTS = {  # what b tries, and a harmless request the system user makes on each subject
    "ws.cmd.a.w.write": ({"path": "secret.txt", "content": "b was here\n"}, "create"),
    "ws.qry.a.w.read": ({"path": "secret.txt"}, "read"),
    "ws.exec.a.w.run": ({"command": "cat secret.txt"}, "run"),
}
HARMLESS: dict[str, dict[str, Any]] = {
    "create": {"exist_ok": True},
    "read": {"path": "secret.txt"},
    "run": {"command": "true"},
}


async def test_b_cannot_send_requests_to_a(url: str, system: NATS, a_workspace: int) -> None:
    refusals = Refusals()
    nb = await bare(url, B, refusals)
    try:
        attempts = []
        for subject, (body, op) in REQUESTS.items():
            live = subject.rsplit(".", 1)[0] + f".{op}"  # the system user is answered here
            body_ok = {**HARMLESS[op], "min_version": a_workspace} if op == "read" else HARMLESS[op]
            data_ok = json.dumps(body_ok).encode()  # answered on a's own inbox (quill/inboxes.py)
            reply = await inboxes.request(system, live, data_ok, timeout=10, tenant="a")
            assert json.loads(reply.data)["ok"], reply.data
            data = json.dumps(body).encode()
            attempts += [no_answer(nb.request(subject, data, timeout=2))]
            attempts += [refusals.wait("publish", subject)]
        await asyncio.gather(*attempts)
        for subject in ("ws.evt.a.w", "ws.evt.b.w", "ws.audit.b.w", "ws.updated.b.w"):
            await nb.publish(subject, b"{}")  # the log and the notifications are the services'
            await refusals.wait("publish", subject)
    finally:
        await nb.close()
    async with await tenant_sdk(url, A) as quill:
        assert await quill.workspace("a/w").read_text("secret.txt") == "a's secret\n"


DENIED = (
    "ws.updated.a.>",
    "ws.audit.a.>",
    "ws.execout.a.>",
    "ws.evt.>",
    "ws.cmd.a.>",
    "_INBOX.>",
    "_INBOX_a.>",
    ">",
)


async def test_b_cannot_listen_to_a(url: str, a_workspace: int) -> None:
    refusals = Refusals()
    nb = await bare(url, B, refusals)
    try:
        subs = {subject: await nb.subscribe(subject) for subject in DENIED}
        for subject in DENIED:
            await refusals.wait("subscription", subject)
        own = await nb.subscribe("ws.updated.b.>")
        async with await tenant_sdk(url, A) as qa, await tenant_sdk(url, B) as qb:
            a_updates = qa.workspace("a/w").watch()
            seen_by_a = asyncio.ensure_future(anext(a_updates))
            await subscribed(qa.nc, qa.subjects.updated("a", "w"))  # before the write
            await qa.workspace("a/w").write("more.txt", "x")  # replies land on _INBOX_a
            await asyncio.wait_for(seen_by_a, 5)
            await a_updates.aclose()
            # a's update reached the server before b's write was sent: had any of b's
            # subscriptions been admitted, its message would arrive before b's own update.
            await qb.workspace("b/w").create(exist_ok=True)
            await own.next_msg(timeout=5)
        for subject, sub in subs.items():
            assert sub.pending_msgs == 0 and sub.delivered == 0, subject
    finally:
        await nb.close()


async def test_b_has_no_jetstream(url: str, system: NATS, a_workspace: int) -> None:
    assert (await system.jetstream().stream_info("WS_EVENTS")).config.name == "WS_EVENTS"
    refusals = Refusals()
    nb = await bare(url, B, refusals)
    js = nb.jetstream(timeout=1.5)
    blobs = ObjectStore("WS_BLOBS", "OBJ_WS_BLOBS", js)
    attempts = {
        "$JS.API.STREAM.INFO.WS_EVENTS": js.stream_info("WS_EVENTS"),
        "$JS.API.STREAM.INFO.WS_AUDIT": js.stream_info("WS_AUDIT", subjects_filter=">"),
        "$JS.API.CONSUMER.CREATE.WS_EVENTS": js.add_consumer(
            "WS_EVENTS", ConsumerConfig(filter_subject="ws.evt.a.>")
        ),
        "$JS.API.CONSUMER.CREATE.WS_AUDIT.x.ws.audit.a.w": js.add_consumer(
            "WS_AUDIT", ConsumerConfig(name="x", filter_subject="ws.audit.a.w")
        ),
        "$JS.API.DIRECT.GET.WS_EVENTS.ws.evt.a.w": js.get_msg(
            "WS_EVENTS", subject="ws.evt.a.w", direct=True
        ),
        "$JS.API.STREAM.MSG.GET.OBJ_WS_BLOBS": blobs.get("0" * 64),
        "$JS.API.STREAM.DELETE.WS_EVENTS": js.delete_stream("WS_EVENTS"),
    }
    try:
        await asyncio.gather(
            *(no_answer(call) for call in attempts.values()),
            *(refusals.wait("publish", subject) for subject in attempts),
        )
        await nb.publish("$KV.WS_BRIDGES.a.w", b"{}")
        await refusals.wait("publish", "$KV.WS_BRIDGES.a.w")
    finally:
        await nb.close()


class Warnings(logging.Handler):
    """Records of one logger, with an event to wait on."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.news = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._logger = logging.getLogger(name)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self._loop.call_soon_threadsafe(self.news.set)

    async def until(self, count: int, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.messages) < count:
                self.news.clear()
                await self.news.wait()

    def __enter__(self) -> Warnings:
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)


async def test_a_reply_subject_is_no_way_in(url: str, system: NATS, a_workspace: int) -> None:
    """A requester names its reply subject, and services publish with every right: the
    services answer only inboxes, so b cannot make them delete a stream or write a's log."""
    js = system.jetstream()
    events = (await js.stream_info("WS_EVENTS", subjects_filter="ws.evt.a.w")).state.subjects
    async with await tenant_sdk(url, B) as qb:
        await qb.workspace("b/w").create(exist_ok=True)
    nb = await bare(url, B, Refusals())
    try:
        with Warnings("quill.bus") as warnings:
            await nb.publish("ws.qry.b.w.info", b"{}", reply="$JS.API.STREAM.DELETE.WS_AUDIT")
            await nb.publish("ws.cmd.b.w.mkdir", b'{"path": "d"}', reply="ws.evt.a.w")
            await nb.publish("ws.exec.b.w.run", b'{"command": "true"}', reply="$KV.WS_BRIDGES.a.w")
            await warnings.until(3)
        assert all("not replying" in message for message in warnings.messages)
    finally:
        await nb.close()
    assert (await js.stream_info("WS_AUDIT")).config.name == "WS_AUDIT"
    after = (await js.stream_info("WS_EVENTS", subjects_filter="ws.evt.a.w")).state.subjects
    assert after == events


async def test_tenants_work_in_their_own_workspaces(url: str, tmp_path: Path) -> None:
    async with await tenant_sdk(url, B) as quill:
        ws = quill.workspace("b/mine")
        await ws.create(exist_ok=True)
        updates = ws.watch()
        first = asyncio.ensure_future(update_from(updates, ws.last_version + 1))  # the write's
        await subscribed(quill.nc, quill.subjects.updated("b", "mine"))  # before the write
        written = await ws.write("notes.md", "b's notes\n")
        assert (await asyncio.wait_for(first, 5)).version == ws.last_version
        await updates.aclose()
        assert await ws.read_text("notes.md") == "b's notes\n"
        assert (await ws.stat("notes.md")).etag == written.etag
        out: list[bytes] = []
        run = await ws.exec("cat notes.md", on_output=lambda _stream, data: out.append(data))
        assert run.exit_code == 0 and b"".join(out) == b"b's notes\n"
    seed = tmp_path / "d.nk"
    seed.write_bytes(_SEED)
    async with await Quill.connect(
        url, nkey_seed=str(seed), inbox_prefix=D.inbox, timeout=5
    ) as quill:
        ws = quill.workspace("d/w")
        await ws.create(exist_ok=True)
        await ws.write("x.txt", "d\n")
        assert await ws.read_text("x.txt") == "d\n"


async def test_a_bridge_tenant_serves_only_its_own(url: str, system: NATS) -> None:
    system_kv = await bridges.bucket(system.jetstream())
    await bridges.claim(system_kv, "a", "laptop", "bridge-a", "host-a", "~/a")
    refusals = Refusals()
    nc = await bare(url, C, refusals)
    subjects = Subjects()
    try:
        await claims.claim(nc, subjects, "c", "laptop", "bridge-c", "host-c", "~/c")
        await claims.claim(nc, subjects, "c", "laptop", "bridge-c", "host-c", "~/c")  # renewed
        async with asyncio.timeout(20):  # the services count c's claim, and only c's
            while sorted((await claims.seen(nc, subjects, "c")).values()) != [1, 1, 1]:
                pass

        async def serve(msg: Msg) -> None:
            await msg.respond(b'{"ok": true, "version": 0, "result": {"from": "c"}}')

        await nc.subscribe("ws.qry.c.laptop.*", cb=serve)
        await nc.flush()
        data = b'{"path": "x"}'
        reply = await inboxes.request(system, "ws.qry.c.laptop.read", data, timeout=15, tenant="c")
        assert json.loads(reply.data).get("result") == {"from": "c"}, reply.data
        # asked on the services' own inbox, c cannot answer: its answers go to its inbox only
        await no_answer(system.request("ws.qry.c.laptop.read", data, timeout=2))
        await refusals.wait("publish", "_INBOX_quill-system.")

        kv = bridges.tenant_bucket(nc.jetstream(timeout=1.5))
        await asyncio.gather(
            no_answer(kv.put("c.laptop", b"{}")),
            refusals.wait("publish", "$KV.WS_BRIDGES.c.laptop"),
            no_answer(kv.get("a.laptop")),
            refusals.wait("publish", "$JS.API.DIRECT.GET.KV_WS_BRIDGES.$KV.WS_BRIDGES.a."),
        )
        with pytest.raises(QuillError) as other:  # c may not even ask about a's names
            await claims.claim(nc, Subjects(), "a", "laptop", "bridge-c", "host-c", "~/c")
        assert other.value.code == ErrorCode.UNAVAILABLE  # the server refused the publish
        await refusals.wait("publish", "ws.bridge.a.claim")
        assert (await system_kv.get("a.laptop")).value  # a's claim is still there
        await nc.subscribe("ws.cmd.c.>", queue="quill-writer")
        await refusals.wait("subscription", "ws.cmd.c.>")
        await nc.subscribe("ws.qry.a.laptop.*")
        await refusals.wait("subscription", "ws.qry.a.laptop.*")
    finally:
        await claims.release(nc, subjects, "c", "laptop", "bridge-c")
        await bridges.release(system_kv, "a", "laptop")
        await nc.close()


async def test_the_sdk_says_access_denied(url: str, a_workspace: int) -> None:
    """No retries, no TIMEOUT: the server's refusal is the answer (exit status 5 in the CLI)."""
    quill = await Quill.connect(url, user=B.name, password=B.password, timeout=1)
    async with quill:
        with pytest.raises(QuillError) as refused:
            await quill.workspace("a/w").read_text("secret.txt")
        assert refused.value.code == ErrorCode.ACCESS_DENIED
        assert refused.value.details == {"subject": "ws.qry.a.w.read"}
