"""Item 7 of the adversarial suite: a tenant cannot make a service answer into another tenant's
inbox. Tenant a sends requests (as any bare client could) whose reply subject is tenant b's
inbox; b, listening there, receives nothing, and each request is refused and audited as
``ACCESS_DENIED``. The same requests with a's own inbox are answered. And the other way round:
b is a bridge tenant (issue 28), attacked and attacking like any other; the services' own
inbox is no way in either."""

from __future__ import annotations

import asyncio
import json
import re

import nats
import pytest
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from tests.up import PASSWORDS, TENANTS, Up

pytestmark = pytest.mark.up(tenants=TENANTS)

SUBJECTS = (
    ("ws.qry.{t}.shared.read", b'{"path": "notes.md"}'),
    ("ws.cmd.{t}.shared.write", b'{"path": "hostile.md", "content": "x"}'),
    ("ws.exec.{t}.shared.run", b'{"command": "touch pwned"}'),
)


@pytest.mark.parametrize(("attacker", "victim"), [("a", "b"), ("b", "a"), ("a", "quill-system")])
async def test_a_reply_into_another_tenants_inbox_is_refused_and_audited(
    up: Up, attacker: str, victim: str
) -> None:
    conf = (up.data / "nats" / "nats-server.conf").read_text()
    system = re.search(r'user: "quill-system", password: "([^"]+)"', conf)
    assert system is not None
    password = {**PASSWORDS, "quill-system": system.group(1)}
    na = await nats.connect(
        up.nats_url, user=attacker, password=password[attacker], inbox_prefix=f"_INBOX_{attacker}"
    )
    nb = await nats.connect(
        up.nats_url, user=victim, password=password[victim], inbox_prefix=f"_INBOX_{victim}"
    )
    ns = await nats.connect(up.nats_url, user="quill-system", password=system.group(1))
    subjects = [(subject.format(t=attacker), body) for subject, body in SUBJECTS]
    try:
        received: list[Msg] = []

        async def collect(msg: Msg) -> None:
            received.append(msg)

        await nb.subscribe(f"_INBOX_{victim}.>", cb=collect)
        await nb.flush()
        audit = await ns.jetstream().subscribe(  # from now on: not an earlier case's records
            f"ws.audit.{attacker}.shared", ordered_consumer=True, deliver_policy=DeliverPolicy.NEW
        )
        for subject, body in subjects:
            await na.publish(subject, body, reply=f"_INBOX_{victim}.stolen")
        await na.flush()
        denied: list[dict[str, object]] = []
        async with asyncio.timeout(20):
            while len(denied) < len(subjects):
                record = json.loads((await audit.next_msg(timeout=20)).data)
                if record["error_code"] == "ACCESS_DENIED":
                    denied.append(record)
        # A reply, had there been one, was published before its audit record, by the same
        # connection: once the victim's round trip returns, the server has handed it all.
        await nb.flush()
        assert received == []
        assert sorted(str(r["op"]) for r in denied) == ["read", "run", "write"]
        # the same read with the attacker's own inbox is answered
        reply = await na.request(subjects[0][0], subjects[0][1], timeout=10)
        assert b"ACCESS_DENIED" not in reply.data
    finally:
        for conn in (na, nb, ns):
            await conn.close()
