"""Issue 32, items 4 and 9: a shell's ports through the gateway reach that shell's sandbox
loopback only, for its own tenant only, within bounds.

Each test first shows the owner reaching the shell's test server through the gateway (so each
fails where there is no such route), then the attack: another tenant's token (404, like a
made-up shell), a privileged or malformed port (400), a response without end (502 once past
the bound, the executor's memory held to it), a server that never answers (504 at the
relay's timeout, the relay still serving), a request target with dot segments (400) or an
absolute URL (it reaches the shell's own server as a path; a host server listening on the
URL's port gets no connection), a port only the host listens on (bwrap: 502, the host server
untouched), and the workspace's token (``Authorization``), the client's cookies and ``Host``
never reaching the sandbox, nor a ``Set-Cookie`` of the sandbox the client. Each request is
audited once, without the token or the query's values. Through a real ``quill up``, tenants'
bare nats-py clients can neither publish on the services' port subject nor subscribe to it.
Websockets on the route: another tenant's, no token or a foreign ``Origin`` refused before the
handshake; a sandbox flooding a client that never reads held to the relay's window; messages,
websockets per shell and idle time bounded; the gateway's head deadline never firing into one."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging

import httpx
import msgspec
import pytest
import websockets
from nats.aio.msg import Msg
from websockets.exceptions import InvalidStatus

from contracts.events import AuditRecord
from contracts.ports import (
    BODY_MAX_BYTES,
    WS_MESSAGE_MAX,
    WS_PER_SHELL,
    WS_WINDOW_BYTES,
    PortRequest,
    WsOpen,
    WsOpened,
    frame,
    route_of,
    unframe,
    ws_unpack,
)
from contracts.subjects import Origin, new_request_id
from infra.wsstream import Stream
from services.executor.ports import AUDIT_PATH_MAX
from services.executor.portws import Socket
from services.gateway.access import Tokens
from tests.gateway.conftest import StartGateway
from tests.gateway.ports_support import (  # noqa: F401
    ACME,
    ECHO,
    TOKEN_A,
    TOKEN_B,
    WS_ECHO,
    A,
    B,
    Stack,
    as_,
    free_port,
    raw_http,
    serve,
    serve_ws,
    st,
    ws_as,
    ws_url,
)
from tests.helpers import Refusals, eventually
from tests.security.conftest import bwrap_only
from tests.up import TENANTS, TOKENS, Up, bare_as, quill_as

pytestmark = pytest.mark.up(tenants=TENANTS)


class HostServer:
    """A server on the host's loopback that counts the connections it gets."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0

    async def __aenter__(self) -> HostServer:
        async def on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\nhost")
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(on, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        self.server.close()
        await self.server.wait_closed()


async def test_another_tenant_gets_not_found(st: Stack) -> None:  # noqa: F811
    port = st.port()
    shell = await serve(st, A, port, "acme")
    async with as_(TOKEN_A) as own:
        assert (await own.get(st.url(A, shell, port, "/"))).json()["tag"] == "acme"
    async with as_(TOKEN_B) as rival:
        for url in (st.url(A, shell, port, "/"), st.url(B, shell, port, "/")):
            for method in ("GET", "POST", "DELETE"):
                r = await rival.request(method, url, content=b"x")
                assert (r.status_code, r.json()) == (404, {"error": "not_found"}), (method, url)
    async with httpx.AsyncClient(timeout=60) as anonymous:
        assert (await anonymous.get(st.url(A, shell, port, "/"))).status_code == 401


async def test_privileged_and_malformed_ports_refused(st: Stack) -> None:  # noqa: F811
    port = st.port()
    shell = await serve(st, A, port, "acme")
    async with as_(TOKEN_A) as http:
        assert (await http.get(st.url(A, shell, port, "/"))).status_code == 200
        for bad in ("22", "80", "1023", "0", "65536", "99999999", "-1", "8e3", "abc"):
            r = await http.get(f"{st.gateway.url}/v1/workspaces/{A}/shells/{shell}/ports/{bad}/")
            assert r.status_code == 400, (bad, r.text)
            assert r.json()["error"] == "invalid_argument"


async def test_endless_response_is_bounded(st: Stack) -> None:  # noqa: F811
    port = st.port()
    shell = await serve(st, A, port, "acme")
    async with as_(TOKEN_A) as http:
        r = await http.get(st.url(A, shell, port, "/endless"))
        assert r.status_code == 502, r.text[:200]
        assert r.json()["message"].endswith(f"is over {BODY_MAX_BYTES} bytes")
        assert (await http.get(st.url(A, shell, port, "/again"))).status_code == 200


async def test_slow_server_times_out(st: Stack) -> None:  # noqa: F811
    port = st.port()
    shell = await serve(st, A, port, "acme")
    st.executor.ports.timeout_s = 1.0
    async with as_(TOKEN_A) as http:
        r = await http.get(st.url(A, shell, port, "/slow"))
        assert r.status_code == 504, r.text
        assert r.json() == {
            "error": "gateway_timeout",
            "message": f"No whole answer from port {port} of shell {shell} in 1 s",
        }
        assert st.executor.ports.serving == 0
        assert (await http.get(st.url(A, shell, port, "/after"))).status_code == 200


async def test_request_target_reaches_the_shells_port_only(st: Stack) -> None:  # noqa: F811
    port = st.port()
    shell = await serve(st, A, port, "acme")
    base = f"/v1/workspaces/{A}/shells/{shell}/ports/{port}"
    auth = f"Authorization: Bearer {TOKEN_A}\r\nConnection: close\r\nHost: 127.0.0.1\r\n"
    async with HostServer() as host:
        status, data = await raw_http(
            st.gateway.url, f"GET {base}/ok HTTP/1.1\r\n{auth}\r\n".encode()
        )
        assert status == 200 and b'"tag": "acme"' in data
        for path in ("/../../../../../health", "/a/../../x", "/%2e%2e/x", "/./x", "/a/%2E%2e"):
            status, data = await raw_http(
                st.gateway.url, f"GET {base}{path} HTTP/1.1\r\n{auth}\r\n".encode()
            )
            assert status == 400, (path, data)
        absolute = f"/http://127.0.0.1:{host.port}/secret"
        async with as_(TOKEN_A) as http:
            r = await http.get(st.url(A, shell, port, absolute))
            assert r.status_code == 200 and r.json()["path"] == absolute  # the shell's server
            assert r.json()["headers"]["host"] == f"127.0.0.1:{port}"
        status, _ = await raw_http(
            st.gateway.url,
            f"GET http://127.0.0.1:{host.port}{base}/ HTTP/1.1\r\n{auth}\r\n".encode(),
        )
        assert host.connections == 0
        bwrap_only(st.provider, "a local shell has the host's network: it reaches host ports")
        async with as_(TOKEN_A) as http:
            r = await http.get(st.url(A, shell, host.port, "/"))
        assert r.status_code == 502 and "Nothing listens" in r.json()["message"]
        assert host.connections == 0


async def test_credentials_never_reach_the_sandbox(st: Stack) -> None:  # noqa: F811
    port = st.port()
    shell = await serve(st, A, port, "acme")
    headers = {"Cookie": "quill_token=secret", "Proxy-Authorization": "Basic eA==", "X-Ok": "1"}
    async with as_(TOKEN_A) as http:
        r = await http.get(st.url(A, shell, port, "/"), headers=headers)
    assert r.status_code == 200
    seen = r.json()["headers"]
    assert seen["x-ok"] == "1" and seen["host"] == f"127.0.0.1:{port}"
    for name in ("authorization", "cookie", "proxy-authorization"):
        assert name not in seen, name
    assert TOKEN_A not in r.text
    assert "set-cookie" not in r.headers
    assert r.headers["content-security-policy"].startswith("sandbox")


async def test_each_request_audited_once_without_credentials(st: Stack) -> None:  # noqa: F811
    port = st.port()
    shell = await serve(st, A, port, "acme")
    secret = "query-secret-0123456789"
    async with as_(TOKEN_A) as http:
        r = await http.post(
            st.url(A, shell, port, f"/audited/{'p' * 300}?key={secret}"),
            content=b"abc",
            headers={"Cookie": f"quill_token={TOKEN_A}"},
        )
        assert r.status_code == 201
        after = await http.get(st.url(A, shell, port, "/after"))
        assert after.status_code == 200
    ws = st.quill.workspace(A)

    async def records() -> list[AuditRecord]:
        mine = (r async for r in ws.audit() if r.op == "port" and r.details is not None)
        return [r async for r in mine if r.details and r.details["shell"] == shell]

    async def both() -> list[AuditRecord] | None:
        found = await records()
        paths = [str((r.details or {}).get("path")) for r in found]
        return found if "/after" in paths else None

    found = await eventually(both, 15, "the request after it audited")
    audited = [r for r in found if str((r.details or {}).get("path")).startswith("/audited/")]
    assert len(audited) == 1, audited  # exactly one, and its record came before the next's
    record = audited[0]
    assert (record.tenant, record.workspace) == ("acme", "w")
    assert (record.kind, record.op) == ("exec", "port")
    assert (record.actor, record.outcome, record.service) == ("ada", "ok", "executor")
    assert record.duration_ms > 0
    assert record.details == {
        "shell": shell,
        "port": port,
        "method": "POST",
        "path": "/audited/" + "p" * (AUDIT_PATH_MAX - len("/audited/")) + "…",
        "query_bytes": len(f"key={secret}"),
        "status": 201,
        "request_bytes": 3,
        "response_bytes": len(r.content),
    }
    encoded = msgspec.json.encode(record).decode()
    for never in (TOKEN_A, secret, "Bearer", "quill_token"):
        assert never not in encoded, never
    refused = await records()
    async with as_(TOKEN_A) as http:  # a refusal is audited too, with its reason
        assert (await http.get(st.url(A, shell, port + 1, "/"))).status_code == 502

    async def refusal() -> AuditRecord | None:
        new = [r for r in await records() if r not in refused]
        return new[0] if new else None

    bad = await eventually(refusal, 15, "the refused request audited")
    assert (bad.outcome, bad.error_code, bad.actor) == ("error", "UNAVAILABLE", "ada")
    assert bad.details is not None and bad.details["status"] == 0
    assert "Nothing listens" in str(bad.details["reason"])


async def test_tenants_cannot_use_the_port_subject(up: Up) -> None:
    """Through a real ``quill up``: tenant a (the shell's own) and tenant b, bare nats-py
    clients with their own credentials, can neither publish a port request on the services'
    subject (``ws.exechold.<route>.<t>.<w>.port``: it would bypass the gateway's token check
    and name any principal in the audit) nor subscribe to it (they would read every
    request's headers and bodies); the gateway's own request still goes through, and neither
    sees it. A websocket through that gateway echoes with a's token; b's token gets 404."""
    qa = await quill_as(up, "a")
    refusals = {t: Refusals() for t in ("a", "b")}
    bare = {t: await bare_as(up, t, error_cb=refusals[t].on_error) for t in ("a", "b")}
    try:
        wa = qa.workspace("a/shared")
        await wa.create(exist_ok=True)
        await wa.write("echo.py", ECHO)
        sh = await wa.shell()
        port = free_port()
        assert (await sh.run(f"python3 echo.py {port} up >/dev/null 2>&1 &")).exit_code == 0
        url = f"{up.http_url}/v1/workspaces/a/shared/shells/{sh.id}/ports/{port}"
        async with as_(TOKENS["a"]) as http:

            async def answers() -> bool:
                return (await http.get(f"{url}/up")).status_code == 200

            await eventually(answers, 30, "the shell's server answers through the gateway")
            subject = f"ws.exechold.{route_of(sh.id)}.a.shared.port"
            forged = frame(PortRequest(shell=sh.id, port=port, method="GET", target="/forged"))
            seen: dict[str, list[Msg]] = {}
            for t, nc in bare.items():
                got = seen[t] = []

                async def keep(msg: Msg, got: list[Msg] = got) -> None:
                    got.append(msg)

                inbox = nc.new_inbox()
                await nc.subscribe(inbox, cb=keep)
                for pattern in (subject, "ws.exechold.>", f"ws.exechold.{route_of(sh.id)}.>"):
                    await nc.subscribe(pattern, cb=keep)
                headers = {"Ws-Actor": "forged"}
                await nc.publish(subject, forged, reply=inbox, headers=headers)
                await nc.publish("ws.exechold.x.a.shared.port", forged, reply=inbox)
                await nc.flush()
            for t in bare:
                await refusals[t].wait("publish", subject)
                await refusals[t].wait("publish", "ws.exechold.x.a.shared.port")
                for pattern in (subject, "ws.exechold.>", f"ws.exechold.{route_of(sh.id)}.>"):
                    await refusals[t].wait("subscription", pattern)
            r = await http.get(f"{url}/through-the-gateway")  # delivered to the executor only
            assert r.status_code == 200 and r.json()["path"] == "/through-the-gateway"
        for t, nc in bare.items():
            await nc.flush()
            assert seen[t] == [], t  # no answer to a forged request, no request seen
        await wa.write("ws.py", WS_ECHO)  # and a websocket through the real gateway
        wport = free_port()
        assert (await sh.run(f"python3 ws.py {wport} up >/dev/null 2>&1 &")).exit_code == 0
        wurl = f"{up.http_url}/v1/workspaces/a/shared/shells/{sh.id}/ports/{wport}/"
        wurl = wurl.replace("http://", "ws://", 1)

        async def echoes() -> bool:
            try:
                async with ws_as(TOKENS["a"], wurl) as ws:
                    await ws.send("through up")
                    return await ws.recv() == "through up"
            except InvalidStatus as exc:
                assert exc.response.status_code == 502  # not listening yet
                return False

        await eventually(echoes, 30, "a websocket through quill up echoes")
        with pytest.raises(InvalidStatus) as rival:
            async with ws_as(TOKENS["b"], wurl):
                pass
        assert rival.value.response.status_code == 404
        await sh.close()
    finally:
        for nc in bare.values():
            await nc.close()
        await qa.close()


async def test_websocket_needs_the_workspaces_token_and_origin(
    st: Stack,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each refused as an HTTP answer, and none logged as an error (uvicorn logged ``ASGI
    callable returned without completing handshake`` at ERROR for every one: an operator's
    alert on errors fired on every bad token)."""
    caplog.set_level(logging.INFO, "uvicorn.error")
    port = st.port()
    shell = await serve_ws(st, A, port, "acme")
    url = ws_url(st, A, shell, port, "/")
    host = st.gateway.url.removeprefix("http://")
    async with ws_as(TOKEN_A, url, origin=f"http://{host}") as ws:  # the owner, same origin
        await ws.send("mine")
        assert await ws.recv() == "mine"
    refusals = [
        (TOKEN_B, url, None, 404),  # another tenant's token
        (TOKEN_B, ws_url(st, B, shell, port, "/"), None, 404),  # the id under its own tenant
        (None, url, None, 401),  # no token
        ("not-a-token", url, None, 401),
        (TOKEN_A, ws_url(st, A, "s0123456789abMadeUpShell0", port), None, 404),
        (TOKEN_A, ws_url(st, A, shell, 80), None, 400),
        (TOKEN_A, url, "http://evil.example", 403),  # a page of another site
        (TOKEN_A, url, f"http://{host}.evil.example", 403),
    ]
    for token, target, origin, status in refusals:
        with pytest.raises(InvalidStatus) as refused:
            async with ws_as(token, target, origin=origin):
                pass
        assert refused.value.response.status_code == status, (token, target, origin)
    rejected = [r for r in caplog.records if "connection rejected" in r.getMessage()]
    assert len(rejected) == len(refusals)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]

    async def none_open() -> bool:  # the owner's one closed, no refused one ever opened
        return not st.executor.sockets.open and not st.executor.sockets.per_tenant["acme"]

    await eventually(none_open, 15, "no websocket open at the executor")


async def raw_websocket(
    stack: Stack, path: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A websocket to the gateway by hand, handshake done: a client that need never read."""
    host, port = stack.gateway.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {base64.b64encode(b'k' * 16).decode()}\r\n"
        f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {TOKEN_A}\r\n\r\n".encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    assert head.startswith(b"HTTP/1.1 101"), head
    return reader, writer


def masked(text: str) -> bytes:
    """A client's text frame (masked with a zero key)."""
    data = text.encode()
    assert len(data) < 126
    return bytes([0x81, 0x80 | len(data)]) + b"\0\0\0\0" + data


async def test_websocket_flood_to_a_client_that_never_reads(st: Stack) -> None:  # noqa: F811
    port = st.port()
    shell = await serve_ws(st, A, port, "acme")
    base = f"/v1/workspaces/{A}/shells/{shell}/ports/{port}/flood"
    reader, writer = await raw_websocket(st, base)
    writer.write(masked(f"flood:{64 * 1024}"))  # the port sends without end; nobody reads
    await writer.drain()

    def stalled() -> Socket | None:
        held = list(st.executor.sockets.open)
        return held[0] if held and held[0].stream.waiting else None

    relayed = await eventually(stalled, 30, "the port's messages wait for the gateway's credit")
    assert relayed.stream.unacked <= WS_WINDOW_BYTES  # what the executor holds unacknowledged
    writer.close()  # the client goes away without a close frame

    async def ended() -> bool:
        return not st.executor.sockets.open and not st.executor.sockets.per_shell[shell]

    await eventually(ended, 30, "the relay ends with the client")
    records = await eventually(lambda: _websockets_audited(st, shell), 15, "audited")
    assert records[-1]["closed_by"] == "client" and records[-1]["path"] == "/flood"
    del reader


async def _websockets_audited(stack: Stack, shell: str) -> list[dict[str, object]] | None:
    found = [
        r.details
        async for r in stack.quill.workspace(A).audit()
        if r.op == "port" and r.details and r.details["shell"] == shell
        if r.details["method"] == "WEBSOCKET" and r.outcome == "ok"
    ]
    return found or None


async def test_websocket_bounds(st: Stack) -> None:  # noqa: F811
    port = st.port()
    shell = await serve_ws(st, A, port, "acme")
    url = ws_url(st, A, shell, port, "/")
    async with ws_as(TOKEN_A, url, max_size=None) as ws:  # a client's message too large
        await ws.send("x" * (WS_MESSAGE_MAX + 1))
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
    assert ws.close_code == 1009
    async with ws_as(TOKEN_A, url, max_size=None) as ws:  # the port's message too large
        await ws.send(f"flood:{WS_MESSAGE_MAX + 1}")
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
    assert ws.close_code == 1009, (ws.close_code, ws.close_reason)
    async with contextlib.AsyncExitStack() as many:  # at most WS_PER_SHELL at once
        for _ in range(WS_PER_SHELL):
            await many.enter_async_context(ws_as(TOKEN_A, url))
        with pytest.raises(InvalidStatus) as busy:
            async with ws_as(TOKEN_A, url):
                pass
        assert busy.value.response.status_code == 503

    async def all_closed() -> bool:
        return not st.executor.sockets.per_shell[shell]

    await eventually(all_closed, 30, "the executor saw them closed")
    st.executor.sockets.idle_s = 0.5  # nothing moves: closed as idle
    async with ws_as(TOKEN_A, url) as ws:
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
    assert (ws.close_code, ws.close_reason) == (1001, "idle")


async def test_websocket_outlives_the_header_deadline(
    st: Stack,  # noqa: F811
    start: StartGateway,
) -> None:
    """A gateway's deadline for a request's head (here 0.3 s) never fires into a websocket
    (it wrote its ``408`` into the stream: the client failed on reserved bits): the
    connection lasts until the executor closes it as idle, well after the deadline."""
    port = st.port()
    shell = await serve_ws(st, A, port, "acme")
    quick = await start(tokens=Tokens({TOKEN_A: ACME}), header_timeout=0.3)
    url = ws_url(st, A, shell, port, "/").replace(st.gateway.url[7:], quick.url[7:], 1)
    st.executor.sockets.idle_s = 1.5
    async with ws_as(TOKEN_A, url) as ws:
        await ws.send("first")
        assert await ws.recv() == "first"
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
    assert (ws.close_code, ws.close_reason) == (1001, "idle")


async def test_a_websocket_whose_executor_went_silent_is_closed(
    st: Stack,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An executor killed while it relays a websocket never says ``close``: the gateway,
    hearing nothing from it for three beats, closes the client's websocket (1011) instead
    of holding it open for ever (uvicorn's pings kept the client's side alive). The executor
    is played by a bare NATS client that opens the websocket and then goes silent; it hears
    the gateway's beats meanwhile."""
    monkeypatch.setattr(Stream, "beat_s", 0.2)
    nc = st.quill.nc
    shell = "s0123456789abSilentExecutor"
    beats: list[bytes] = []

    async def heard(msg: Msg) -> None:
        beats.append(msg.data)

    inbox = nc.new_inbox()
    await nc.subscribe(inbox, cb=heard)

    async def opened(msg: Msg) -> None:  # the executor's answer, then nothing
        await msg.respond(frame(WsOpened(inbox=inbox)))

    await nc.subscribe(f"ws.exechold.{route_of(shell)}.acme.w.portws", cb=opened)
    await nc.flush()  # both subscriptions are at the server before the gateway asks
    async with ws_as(TOKEN_A, ws_url(st, A, shell, 8000, "/")) as ws:
        with pytest.raises(websockets.ConnectionClosedError):
            async with asyncio.timeout(30):
                await ws.recv()
        assert ws.close_code == 1011
        assert ws.close_reason == "the executor holding the shell is gone"
    assert [ws_unpack(b)[0] for b in beats[:2]] == ["ack", "ack"]


async def test_a_websocket_whose_gateway_went_silent_is_closed(
    st: Stack,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same the other way: a gateway killed while it relays never says ``close``; the
    executor, hearing nothing from it for three beats, closes the port's websocket and
    audits it (``closed_by`` ``silent``) instead of waiting ``WS_IDLE_S`` (5 minutes; the
    port's messages reset even that). The gateway is played by a bare NATS client."""
    monkeypatch.setattr(Stream, "beat_s", 0.2)
    port = st.port()
    shell = await serve_ws(st, A, port, "acme")
    nc = st.quill.nc
    inbox = nc.new_inbox()
    await nc.subscribe(inbox)  # what the executor sends: never read, never acknowledged
    head = WsOpen(shell=shell, port=port, target="/", inbox=inbox)
    who = Origin(new_request_id(), "silent-gateway", "s-1")
    subject = f"ws.exechold.{route_of(shell)}.acme.w.portws"
    answer = await nc.request(subject, frame(head), timeout=30, headers=who.headers())
    assert unframe(answer.data, WsOpened)[0].error is None

    async def ended() -> bool:
        return not st.executor.sockets.open and not st.executor.sockets.per_shell[shell]

    await eventually(ended, 30, "the executor ends the relay")
    records = await eventually(lambda: _websockets_audited(st, shell), 15, "audited")
    assert records[-1]["closed_by"] == "silent" and records[-1]["close_code"] == 1001
