"""Logs that can be followed, through a real ``quill up --log-format json``: a request without
``Ws-Request-Id`` (a bare nats-py client) gets the id the service gave it in its reply, and the
same id names its audit record, its event and, for a failure, its one JSON line in the
service's log (DIR/logs/<service>.log); the gateway answers ``X-Request-Id`` and the commands
it sends carry it; a registered secret named by a request appears in no log."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts.subjects import HEADER_REQUEST_ID, STREAM_EVENTS, Subjects
from tests.helpers import eventually
from tests.up import Up

SUBJECTS = Subjects("ws")
SECRET = "zq9secretvalue4real"
"""A registered secret, short enough to be a workspace id and a request id."""
WAIT_S = 20.0
pytestmark = pytest.mark.up("--log-format", "json", secrets=f'[secrets]\ndemo = "{SECRET}"\n')


@pytest_asyncio.fixture
async def bare(up: Up) -> AsyncIterator[NATS]:
    """A plain nats-py connection: requests with no headers at all."""
    nc = await nats.connect(up.nats_url)
    yield nc
    await nc.close()


def log_lines(up: Up, service: str) -> list[dict[str, Any]]:
    path = up.data / "logs" / f"{service}.log"
    lines = []
    for raw in path.read_text(errors="replace").splitlines():
        if raw.startswith("{"):
            lines.append(json.loads(raw))
    return lines


async def line_naming(up: Up, service: str, request_id: str) -> dict[str, Any]:
    """The service's JSON log line with ``request_id`` (waited for: a log write is not part of
    the reply)."""
    found = await eventually(
        lambda: [x for x in log_lines(up, service) if x.get("request_id") == request_id],
        WAIT_S,
        f"a line of {request_id} in {service}.log",
    )
    assert len(found) == 1, found  # one line per failure
    return found[0]


async def audited(nc: NATS, tenant: str, workspace: str, request_id: str) -> dict[str, Any]:
    """The audit record of ``request_id`` (from WS_AUDIT, where the service published it)."""
    js = nc.jetstream()

    async def found() -> dict[str, Any] | None:
        sub = await js.subscribe(SUBJECTS.audit(tenant, workspace), ordered_consumer=True)
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=1)
                except nats.errors.TimeoutError:
                    return None  # read to the end: not there yet
                record: dict[str, Any] = json.loads(msg.data)
                if record["request_id"] == request_id:
                    return record
        finally:
            await sub.unsubscribe()

    return await eventually(found, WAIT_S, f"the audit record of {request_id}")


async def request(nc: NATS, subject: str, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A request with no headers: its reply and the ``Ws-Request-Id`` it came back with."""
    reply: Msg = await nc.request(subject, json.dumps(body).encode(), timeout=10)
    assert reply.headers is not None and reply.headers.get(HEADER_REQUEST_ID), reply.headers
    return json.loads(reply.data), reply.headers[HEADER_REQUEST_ID]


async def test_a_request_without_an_id_is_followed_by_the_one_it_was_given(
    up: Up, bare: NATS
) -> None:
    created, _ = await request(bare, SUBJECTS.cmd("acme", "logs", "create"), {})
    assert created["ok"], created
    written, rid = await request(
        bare, SUBJECTS.cmd("acme", "logs", "write"), {"path": "a.txt", "content": "hello"}
    )
    assert written["ok"], written
    record = await audited(bare, "acme", "logs", rid)
    assert (record["op"], record["outcome"]) == ("write", "ok")
    last = await bare.jetstream().get_last_msg(STREAM_EVENTS, SUBJECTS.evt("acme", "logs"))
    assert json.loads(last.data)["request_id"] == rid

    # a refused command: the reply, the audit record and one JSON line in writer.log
    refused, rid = await request(
        bare, SUBJECTS.cmd("acme", "logs", "write"), {"path": "../out", "content": "x"}
    )
    assert refused["error"]["code"] == "ACCESS_DENIED"
    line = await line_naming(up, "writer", rid)
    assert line["level"] == "info"  # the caller's mistake (docs/operations.md#logs)
    fields = {k: line[k] for k in ("tenant", "workspace", "op", "code")}
    assert fields == {
        "tenant": "acme",
        "workspace": "logs",
        "op": "cmd.write",
        "code": "ACCESS_DENIED",
    }
    assert (await audited(bare, "acme", "logs", rid))["error_code"] == "ACCESS_DENIED"

    # a failed query, sent with no id either: given one for its reply, record and line
    missing, rid = await request(bare, SUBJECTS.qry("acme", "logs", "read"), {"path": "no.txt"})
    assert missing["error"]["code"] == "FILE_NOT_FOUND"
    line = await line_naming(up, "reader", rid)
    assert (line["op"], line["code"], line["workspace"]) == ("qry.read", "FILE_NOT_FOUND", "logs")
    assert (await audited(bare, "acme", "logs", rid))["error_code"] == "FILE_NOT_FOUND"


async def test_a_request_id_sent_is_the_one_answered(up: Up, bare: NATS) -> None:
    headers = {HEADER_REQUEST_ID: "mine-42"}
    reply = await bare.request(
        SUBJECTS.qry("acme", "nowhere", "read"), b'{"path": "x"}', headers=headers, timeout=10
    )
    assert reply.headers is not None and reply.headers[HEADER_REQUEST_ID] == "mine-42"
    line = await line_naming(up, "reader", "mine-42")
    assert line["code"] == "WORKSPACE_NOT_FOUND"


async def test_the_gateway_names_each_http_request(up: Up, bare: NATS) -> None:
    url = f"{up.http_url}/v1/host/workspace/files/notes.md"
    async with httpx.AsyncClient(timeout=30) as http:
        mine = await http.put(url, json={"content": "one"}, headers={"X-Request-Id": "trace-7"})
        assert mine.status_code == 200, mine.text
        assert mine.headers["x-request-id"] == "trace-7"
        given = await http.put(url, json={"content": "two"})
        rid = given.headers["x-request-id"]
        assert len(rid) == 32 and rid != "trace-7"
        for bad in ("a b", "x" * 65, "é"):  # not kept: replaced by one of the gateway's
            answered = await http.get(url, headers={"X-Request-Id": bad.encode()})
            assert answered.headers["x-request-id"] != bad
            assert len(answered.headers["x-request-id"]) == 32
        again = await http.put(url, json={"content": "three"}, headers={"X-Request-Id": "trace-7"})
        assert again.status_code == 200 and again.json()["content"] == "three"  # not a replay
    # the commands it sent are named after it: the event and the audit record show it
    js = bare.jetstream()
    last = await js.get_last_msg(STREAM_EVENTS, SUBJECTS.evt("default", "default"))
    assert json.loads(last.data)["request_id"].startswith("trace-7_")


async def test_a_registered_secret_named_by_a_request_is_in_no_log(up: Up, bare: NATS) -> None:
    attempts = [
        (SUBJECTS.cmd("acme", SECRET, "write"), {"path": "a", "content": "x"}, None),
        (SUBJECTS.cmd("acme", "logs", "write"), {"path": f"{SECRET}/a", "content": "x"}, None),
        (SUBJECTS.qry("acme", "logs", "read"), {"path": SECRET}, None),
        (SUBJECTS.qry("acme", "logs", "read"), {"path": "x"}, SECRET),
        (SUBJECTS.cmd("acme", "logs", "write"), {"path": "../x", "content": SECRET}, None),
    ]
    ids = []
    for subject, body, request_id in attempts:
        headers = {HEADER_REQUEST_ID: request_id} if request_id else None
        reply = await bare.request(subject, json.dumps(body).encode(), headers=headers, timeout=10)
        assert not json.loads(reply.data)["ok"]
        assert reply.headers is not None
        ids.append(reply.headers[HEADER_REQUEST_ID])
        assert SECRET not in reply.data.decode() + ids[-1]
    # each refusal has its line (under the id it was answered with), and none shows the secret
    for request_id, (subject, _, _) in zip(ids, attempts, strict=True):
        service = "writer" if ".cmd." in subject else "reader"
        await line_naming(up, service, request_id)
    for log in Path(up.data / "logs").glob("*.log"):
        assert SECRET not in log.read_text(errors="replace"), log.name
