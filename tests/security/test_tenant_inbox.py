"""Item 7 of the adversarial suite: a tenant cannot make a service answer into another tenant's
inbox. Tenant a sends requests (as any bare client could) whose reply subject is tenant b's
inbox; b, listening there, receives nothing, and each request is refused and audited as
``ACCESS_DENIED``. The same requests with a's own inbox are answered."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator

import nats
import pytest
from nats.aio.msg import Msg

from tests.system.conftest import Up
from tests.system.test_tenants import PASSWORDS, with_tenants

SUBJECTS = (
    ("ws.qry.a.shared.read", b'{"path": "notes.md"}'),
    ("ws.cmd.a.shared.write", b'{"path": "hostile.md", "content": "x"}'),
    ("ws.exec.a.shared.run", b'{"command": "touch pwned"}'),
)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with with_tenants(tmp_path_factory.mktemp("tenants")) as stack:
        yield stack


async def test_a_reply_into_another_tenants_inbox_is_refused_and_audited(up: Up) -> None:
    conf = (up.data / "nats" / "nats-server.conf").read_text()
    system = re.search(r'user: "quill-system", password: "([^"]+)"', conf)
    assert system is not None
    na = await nats.connect(up.nats_url, user="a", password=PASSWORDS["a"], inbox_prefix="_INBOX_a")
    nb = await nats.connect(up.nats_url, user="b", password=PASSWORDS["b"], inbox_prefix="_INBOX_b")
    ns = await nats.connect(up.nats_url, user="quill-system", password=system.group(1))
    try:
        received: list[Msg] = []

        async def collect(msg: Msg) -> None:
            received.append(msg)

        await nb.subscribe("_INBOX_b.>", cb=collect)
        await nb.flush()
        audit = await ns.jetstream().subscribe("ws.audit.a.shared", ordered_consumer=True)
        for subject, body in SUBJECTS:
            await na.publish(subject, body, reply="_INBOX_b.stolen")
        await na.flush()
        denied: list[dict[str, object]] = []
        async with asyncio.timeout(20):
            while len(denied) < len(SUBJECTS):
                record = json.loads((await audit.next_msg(timeout=20)).data)
                if record["error_code"] == "ACCESS_DENIED":
                    denied.append(record)
        # A reply, had there been one, was published before its audit record, by the same
        # connection: once b's round trip returns, the server has handed b all it would get.
        await nb.flush()
        assert received == []
        assert sorted(str(r["op"]) for r in denied) == ["read", "run", "write"]
        # the same read with a's own inbox is answered
        reply = await na.request(SUBJECTS[0][0], SUBJECTS[0][1], timeout=10)
        assert b"ACCESS_DENIED" not in reply.data
    finally:
        for conn in (na, nb, ns):
            await conn.close()
