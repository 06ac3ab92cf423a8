"""A client in any language: bare nats-py speaking the documented JSON (docs/contract.md)."""

from __future__ import annotations

import json

import nats

from tests.up import Up


async def test_documented_json_over_bare_nats(up: Up) -> None:
    nc = await nats.connect(up.nats_url)
    try:

        async def call(kind: str, op: str, body: object, **headers: str) -> dict:
            msg = await nc.request(
                f"ws.{kind}.acme.bare.{op}",
                json.dumps(body).encode(),
                timeout=10,
                headers=headers or None,
            )
            return json.loads(msg.data)

        assert (await call("cmd", "create", {}))["version"] == 1
        w = await call(
            "cmd",
            "write",
            {"path": "hello.txt", "content": "hi\n"},
            **{"Ws-Request-Id": "bare-1", "Ws-Actor": "bash-bot"},
        )
        assert w == {
            "ok": True,
            "version": 2,
            "result": {
                "path": "hello.txt",
                "bytes_written": 3,
                "size": 3,
                "file_version": 1,
                "etag": "v1",
                "created": True,
                "modified": w["result"]["modified"],
                "previous_size": None,
                "committed": True,
            },
        }
        assert (
            await call(
                "cmd",
                "write",
                {"path": "hello.txt", "content": "hi\n"},
                **{"Ws-Request-Id": "bare-1"},
            )
            == w
        )
        r = await call("qry", "read", {"path": "/workspace/hello.txt", "min_version": 2})
        assert r["ok"] and r["version"] == 2 and r["result"]["content"] == "hi\n"
        conflict = await call(
            "cmd", "write", {"path": "hello.txt", "content": "x", "if_match": "v9"}
        )
        assert conflict["error"]["code"] == "CONFLICT"
        assert conflict["error"]["details"]["current_etag"] == "v1"
        updates = await nc.subscribe("ws.updated.acme.bare")
        await call("cmd", "delete", {"path": "hello.txt"})
        update = json.loads((await updates.next_msg(timeout=5)).data)
        assert (update["version"], update["op"], update["paths"]) == (3, "delete", ["hello.txt"])
        audit = json.loads(
            (await nc.jetstream().get_last_msg("WS_AUDIT", "ws.audit.acme.bare")).data
        )
        assert {"op", "outcome", "duration_ms", "request_id"} <= audit.keys()
        assert "content" not in json.dumps(audit)
    finally:
        await nc.close()
