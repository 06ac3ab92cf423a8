"""Issue 32, item 4: a port of a shell through the gateway (``/v1/workspaces/{t}/{w}/shells/
{id}/ports/{port}/…``), under both sandbox providers: ``python3 -m http.server`` started by
one command answers a GET; a POST's body reaches the shell's server and its answer comes back;
a closed shell and another tenant's token get 404, a port nobody listens on 502; two tenants'
shells both listen on 8000 (bwrap: each sandbox has its own network) and each URL reaches its
own. (Hostile uses: ``tests/security/test_shell_ports.py``.)"""

from __future__ import annotations

import json

import httpx
import pytest
import websockets

from tests.executor.conftest import provider  # noqa: F401
from tests.gateway.ports_support import (  # noqa: F401
    TOKEN_A,
    TOKEN_B,
    A,
    B,
    Stack,
    as_,
    serve,
    serve_ws,
    st,
    ws_as,
    ws_url,
)
from tests.helpers import eventually


async def test_http_server_of_a_shell(st: Stack) -> None:  # noqa: F811
    ws = st.quill.workspace(A)
    await ws.write("site/hello.txt", "hello from the shell\n")
    port = st.port()
    sh = await ws.shell()
    r = await sh.run(f"cd site && python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 &")
    assert r.exit_code == 0, r
    async with as_(TOKEN_A) as http:
        listing = await eventually(
            lambda: _ok(http.get(st.url(A, sh.id, port, "/"))), what="the server answers"
        )
        assert "hello.txt" in listing.text
        got = await http.get(st.url(A, sh.id, port, "/hello.txt"))
        assert (got.status_code, got.text) == (200, "hello from the shell\n")
        assert got.headers["content-security-policy"].startswith("sandbox")
        assert (await http.get(st.url(A, sh.id, port, "/missing"))).status_code == 404
        nobody = await http.get(st.url(A, sh.id, port + 1, "/"))
        assert nobody.status_code == 502
        assert nobody.json() == {
            "error": "bad_gateway",
            "message": f"Nothing listens on port {port + 1} in the shell",
        }
        await sh.close()
        closed = await http.get(st.url(A, sh.id, port, "/"))
        assert (closed.status_code, closed.json()) == (404, {"error": "not_found"})


async def _ok(answer: object) -> httpx.Response | None:
    response = await answer  # type: ignore[misc]
    assert isinstance(response, httpx.Response)
    return response if response.status_code == 200 else None


async def test_post_body_echoed(st: Stack) -> None:  # noqa: F811
    port = st.port()
    shell = await serve(st, A, port, "a")
    async with as_(TOKEN_A) as http:
        r = await http.post(
            st.url(A, shell, port, "/form?x=1&y=%20z"),
            content=b"name=ada",
            headers={"X-Custom": "kept", "Content-Type": "text/plain"},
        )
        assert r.status_code == 201
        seen = r.json()
        assert seen["method"] == "POST" and seen["path"] == "/form?x=1&y=%20z"
        assert seen["body"] == "name=ada" and seen["headers"]["x-custom"] == "kept"
        assert seen["headers"]["host"] == f"127.0.0.1:{port}"
        assert "set-cookie" not in r.headers  # the gateway's origin is not the shell's
        put = await http.put(st.url(A, shell, port, "/x"), content=b"y" * 100_000)
        assert put.status_code == 200 and len(put.json()["body"]) == 100_000


async def test_another_tenants_token_is_not_found(st: Stack) -> None:  # noqa: F811
    port = st.port()
    shell = await serve(st, A, port, "a")
    async with as_(TOKEN_B) as rival:
        for url in (st.url(A, shell, port, "/"), st.url(B, shell, port, "/")):
            r = await rival.get(url)
            assert (r.status_code, r.json()) == (404, {"error": "not_found"}), url
    async with as_(TOKEN_A) as http:
        made_up = "s0123456789abMadeUpShell0"
        r = await http.get(st.url(A, made_up, port, "/"))
        assert (r.status_code, r.json()) == (404, {"error": "not_found"})


async def test_two_tenants_both_listen_on_8000(st: Stack) -> None:  # noqa: F811
    if st.provider != "bwrap":
        print("skipped under local: its shells share the host's network (one port 8000)")
        pytest.skip("local: no network namespace of its own")
    a = await serve(st, A, 8000, "acme")
    b = await serve(st, B, 8000, "rival")
    async with as_(TOKEN_A) as ha, as_(TOKEN_B) as hb:
        assert (await ha.get(st.url(A, a, 8000, "/"))).json()["tag"] == "acme"
        assert (await hb.get(st.url(B, b, 8000, "/"))).json()["tag"] == "rival"


async def test_websocket_both_ways_closed_from_either_side(st: Stack) -> None:  # noqa: F811
    port = st.port()
    shell = await serve_ws(st, A, port, "acme")
    url = ws_url(st, A, shell, port, "/chat?room=1")
    async with ws_as(TOKEN_A, url, subprotocols=["chat.v1"]) as ws:
        assert ws.subprotocol == "chat.v1"
        await ws.send("hello")
        assert await ws.recv() == "hello"
        await ws.send(b"\x00\xffbinary")
        assert await ws.recv() == b"\x00\xffbinary"
        big = "y" * 500_000
        await ws.send(big)
        assert await ws.recv() == big
        await ws.send("headers")
        seen = json.loads(await ws.recv())
        assert seen["path"] == "/chat?room=1" and seen["tag"] == "acme"
        assert seen["headers"]["host"] == f"127.0.0.1:{port}"
        assert "authorization" not in seen["headers"] and "cookie" not in seen["headers"]
    assert ws.close_code == 1000  # the client closed
    async with ws_as(TOKEN_A, url) as ws:
        await ws.send("close:4001")  # the port closes
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
    assert (ws.close_code, ws.close_reason) == (4001, "bye")
    records = await eventually(lambda: _sockets_audited(st, shell, 2), 15, "both audited")
    client, port_side = records
    assert client["closed_by"] == "client" and client["close_code"] == 1000
    assert port_side["closed_by"] == "port" and port_side["close_code"] == 4001
    assert client["method"] == "WEBSOCKET" and client["status"] == 101
    assert client["path"] == "/chat" and client["query_bytes"] == len("room=1")
    sent = len("hello") + 8 + len(big) + len("headers")
    assert (client["request_bytes"], client["messages_in"]) == (sent, 4)
    assert client["response_bytes"] == sent - len("headers") + len(json.dumps(seen))
    assert not st.executor.sockets.open


async def _sockets_audited(stack: Stack, shell: str, n: int) -> list[dict[str, object]] | None:
    found = [
        r.details
        async for r in stack.quill.workspace(A).audit()
        if r.op == "port" and r.details and r.details["shell"] == shell
        if r.details["method"] == "WEBSOCKET"
    ]
    return found if len(found) >= n else None
