"""REST: a websocket to a port of a shell, on the ports route's own path
(``/v1/workspaces/{tenant}/{workspace}/shells/{shell}/ports/{port}/…``, ``Upgrade: websocket``).

It is checked as the route's HTTP requests are (``ports.address_of``: the token must reach
the workspace, else ``404``; a bad port or path ``400``), before the handshake, and these are
refused as HTTP answers (the websocket denial response). Origin: a browser names the page's
origin in ``Origin``; when the header is there, its host must be the gateway's own (``Host``),
else ``403 access_denied``, whatever the token (a page of another site never talks to a
sandbox in the caller's name). Clients other than browsers send no ``Origin`` and pass.

The gateway asks the executor holding the shell to open the port's websocket (``WsOpen`` on
``<root>.exechold.<route>.<t>.<w>.portws``, with the principal's ``Ws-*`` headers: it audits
the websocket once closed), and only then accepts the client's, with the subprotocol the port
chose. Messages go both ways over ``infra.wsstream`` (credit-bounded: a client that never
reads stops the port's messages at ``WS_WINDOW_BYTES``); a close from either side is passed
on with its code; a message over ``WS_MESSAGE_MAX`` closes the connection (1009, uvicorn's
``ws_max_size``).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import nats.errors
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from contracts.ports import (
    WS_OPEN_S,
    WsOpen,
    WsOpened,
    frame,
    route_of,
    unframe,
)
from contracts.subjects import Origin, new_request_id
from infra.wsstream import Stream, StreamBroken, close_of, close_payload, until_one_ends
from services.gateway.access import Access, principal_of
from services.gateway.rest.ports import address_of, passed_on, refused


def foreign_origin(websocket: WebSocket) -> str | None:
    """The ``Origin`` header when it names another host than the gateway's (see above)."""
    origin = websocket.headers.get("origin")
    if origin is None:
        return None
    host = websocket.headers.get("host", "").lower()
    return None if urlsplit(origin).netloc.lower() == host else origin


class PortSockets:
    """The websocket route (see the module docstring)."""

    def __init__(self, access: Access) -> None:
        self.access = access

    async def relay(self, websocket: WebSocket) -> None:
        principal = principal_of(websocket.scope)
        addressed = address_of(websocket, principal)
        if isinstance(addressed, JSONResponse):
            await websocket.send_denial_response(addressed)
            return
        if (origin := foreign_origin(websocket)) is not None:
            message = f"Origin {origin[:200]!r} is not this gateway's"
            body = {"error": "access_denied", "message": message}
            await websocket.send_denial_response(JSONResponse(body, 403))
            return
        shell, port, target = addressed
        p = websocket.path_params
        tenant, workspace = p["tenant"], p["workspace"]
        nc = self.access.quill.nc
        stream = Stream(nc, nc.new_inbox())
        await stream.start()
        try:
            headers = [
                (k, v) for k, v in passed_on(websocket) if not k.startswith("sec-websocket-")
            ]
            head = WsOpen(
                shell=shell,
                port=port,
                target=target,
                headers=headers,
                subprotocols=list(websocket.scope.get("subprotocols", []))[:16],
                inbox=stream.inbox,
            )
            subject = self.access.quill.subjects.exec_holder(
                route_of(shell), tenant, workspace, "portws"
            )
            who = Origin(new_request_id(), principal.actor, principal.session)
            try:
                msg = await nc.request(
                    subject, frame(head), timeout=WS_OPEN_S + 5, headers=who.headers()
                )
                opened = unframe(msg.data, WsOpened)[0]
            except nats.errors.NoRespondersError:
                await websocket.send_denial_response(refused("not_found"))
                return
            except nats.errors.TimeoutError:
                answer = refused("timeout", f"No websocket from port {port} in {WS_OPEN_S:g} s")
                await websocket.send_denial_response(answer)
                return
            except ValueError:
                answer = refused("bad_gateway", "The executor's answer was malformed")
                await websocket.send_denial_response(answer)
                return
            if opened.error is not None:
                await websocket.send_denial_response(refused(opened.error, opened.message))
                return
            stream.peer = opened.inbox
            await websocket.accept(subprotocol=opened.subprotocol)
            await _pump(websocket, stream)
        finally:
            await stream.stop()


async def _pump(websocket: WebSocket, stream: Stream) -> None:
    """Messages both ways until either side closes, or the executor's goes silent."""

    async def from_client() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                code = int(message.get("code") or 1005)
                await stream.send("close", close_payload(code, message.get("reason") or ""))
                return
            if message.get("text") is not None:
                await stream.send("text", message["text"].encode())
            elif message.get("bytes") is not None:
                await stream.send("binary", message["bytes"])

    async def from_port() -> None:
        while True:
            try:
                kind, payload = await stream.receive()
            except StreamBroken:
                await websocket.close(1011, "relay lost a message")
                return
            if kind == "close":
                code, reason = close_of(payload)
                sendable = code not in (1005, 1006, 1015)
                await websocket.close(code if sendable else 1011, reason)
                return
            if kind == "text":
                await websocket.send_text(payload.decode(errors="replace"))
            else:
                await websocket.send_bytes(payload)
            await stream.delivered()

    async def beat() -> None:  # the executor holding the shell killed, or cut off
        await stream.heartbeat()
        await websocket.close(1011, "the executor holding the shell is gone")

    try:
        await until_one_ends(from_client, from_port, beat)
    finally:
        # however it ended (a client gone while a send waited): the executor hears of it
        await stream.send("close", close_payload(1001, "the client is gone"))
