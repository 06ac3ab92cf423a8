"""REST: a port of a shell, reached through the gateway as E2B's and Daytona's preview URLs are
(``/v1/workspaces/{tenant}/{workspace}/shells/{shell}/ports/{port}/…``, any method).

The caller's token must reach the workspace (``reaches``: the rules of ``access.py``);
anything else, a malformed or made-up shell id, a closed shell or another tenant's, is a
bare ``404 {"error": "not_found"}``, as for every route. The request goes over NATS to the
executor holding the shell (``contracts.ports``; only services may publish there), which
performs it on ``127.0.0.1:<port>`` in the shell's sandbox (``services/executor/ports.py``)
and answers with the port's status, headers and body. What is passed on: the method, the
path after the port (dot segments refused) and the query, the client's headers but the
hop-by-hop ones, ``Host`` (the executor sets ``127.0.0.1:<port>``) and the client's
credentials (``Authorization``, ``Cookie``: the workspace's token never reaches the
sandbox). What comes back: the port's headers but hop-by-hop ones and ``Set-Cookie`` (the
gateway's origin is not the sandbox's to set cookies on), and a ``Content-Security-Policy:
sandbox`` so that a page the port serves runs in an origin of its own, not the gateway's.

Bounds: ports ``LOWEST_PORT``-65535 (400 otherwise); a body of at most ``BODY_MAX_BYTES``
each way (413 for a request's; a response's: 502); ``TIMEOUT_S`` for the whole answer (504).
Nothing listening on the port is ``502 {"error": "bad_gateway", "message": ...}`` saying so.
One request per connection to the port; a websocket upgrade on the same path is
``portws.py``'s. The executor audits
each request it gets (``exec.port``), naming the principal's actor and session, which the
gateway sends as ``Ws-*`` headers; what the gateway refuses itself (no token, another
tenant's workspace, a bad port or path, a body too large) never reaches an executor and is
not audited, as no refused REST call is.
"""

from __future__ import annotations

from urllib.parse import unquote

import msgspec
import nats.errors
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response

from contracts import requests as rq
from contracts.errors import QuillError
from contracts.ports import (
    BODY_MAX_BYTES,
    HOP_BY_HOP,
    LOWEST_PORT,
    TIMEOUT_S,
    PortRequest,
    PortResponse,
    frame,
    route_of,
    unframe,
)
from contracts.subjects import Origin, check_id, new_request_id
from services.gateway.access import Access, Principal, principal_of

PORTS = "/v1/workspaces/{tenant}/{workspace}/shells/{shell}/ports/{port}"
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
"""The methods passed on (``HEAD`` too: Starlette adds it to ``GET``)."""
DROPPED = HOP_BY_HOP | {"expect", "authorization", "cookie"}
"""Request headers never passed on to the port."""
NOT_BACK = frozenset({"set-cookie", "set-cookie2", "content-security-policy"})
"""Response headers never passed back (a CSP of the gateway's own replaces the port's)."""
SANDBOXED = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"
STATUS = {
    "not_found": (404, "not_found"),
    "bad_gateway": (502, "bad_gateway"),
    "timeout": (504, "gateway_timeout"),
    "invalid": (400, "invalid_argument"),
    "busy": (503, "unavailable"),
}


def reaches(principal: Principal, tenant: str, workspace: str) -> bool:
    """Whether ``principal`` may reach ``tenant``/``workspace`` (``access.py``'s rules)."""
    try:
        check_id("tenant", tenant)
        check_id("workspace", workspace)
    except QuillError:
        return False
    if principal.anywhere:
        return True
    if tenant != principal.tenant:
        return False
    return not principal.pinned or workspace == principal.workspace


def refused(name: str, message: str | None = None) -> JSONResponse:
    status, error = STATUS.get(name, (502, "bad_gateway"))
    body = {"error": error} if status == 404 else {"error": error, "message": message or ""}
    return JSONResponse(body, status_code=status)


def target_of(request: HTTPConnection) -> str | None:
    """The origin-form target after ``…/ports/{port}``: the raw path (as sent, percent-encoded)
    and the query; None for dot segments or characters HTTP does not allow in a target."""
    raw: bytes = request.scope.get("raw_path") or request.url.path.encode()
    parts = raw.split(b"/", 9)  # '', v1, workspaces, t, w, shells, id, ports, port, rest
    rest = parts[9] if len(parts) > 9 else b""
    segments = [unquote(s.decode("latin-1")) for s in rest.split(b"/")]
    if any(s in (".", "..") for s in segments):
        return None
    target = b"/" + rest
    query: bytes = request.scope.get("query_string", b"")
    if query:
        target += b"?" + query
    if any(c <= 0x20 or c >= 0x7F for c in target):
        return None
    return target.decode("ascii")


def address_of(conn: HTTPConnection, principal: Principal) -> tuple[str, int, str] | JSONResponse:
    """The shell, port and target a request to the route names (its path), or its refusal."""
    p = conn.path_params
    tenant, workspace, shell, raw_port = p["tenant"], p["workspace"], p["shell"], p["port"]
    if not reaches(principal, tenant, workspace):
        return refused("not_found")
    try:
        shell = msgspec.convert(shell, rq.ShellHandle)
    except msgspec.ValidationError:
        return refused("not_found")
    if not (raw_port.isascii() and raw_port.isdecimal() and len(raw_port) <= 5):
        return refused("invalid", f"The port must be from {LOWEST_PORT} to 65535")
    port = int(raw_port)
    if not LOWEST_PORT <= port <= 65535:
        return refused("invalid", f"The port must be from {LOWEST_PORT} to 65535")
    target = target_of(conn)
    if target is None:
        return refused("invalid", "The path may hold no '.' or '..' segment")
    return shell, port, target


def passed_on(conn: HTTPConnection) -> list[tuple[str, str]]:
    """The client's headers the port gets: all but the ``DROPPED`` ones."""
    return [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in conn.headers.raw
        if k.decode("latin-1").lower() not in DROPPED
    ]


class Ports:
    """The route (see the module docstring)."""

    def __init__(self, access: Access) -> None:
        self.access = access

    async def forward(self, request: Request) -> Response:
        principal = principal_of(request.scope)
        p = request.path_params
        tenant, workspace = p["tenant"], p["workspace"]
        addressed = address_of(request, principal)
        if isinstance(addressed, JSONResponse):
            return addressed
        shell, port, target = addressed
        body = await request.body()
        if len(body) > BODY_MAX_BYTES:
            message = f"The body is over {BODY_MAX_BYTES} bytes"
            return JSONResponse({"error": "payload_too_large", "message": message}, 413)
        headers = passed_on(request)
        head = PortRequest(
            shell=shell, port=port, method=request.method, target=target, headers=headers
        )
        quill = self.access.quill
        subject = quill.subjects.exec_holder(route_of(shell), tenant, workspace, "port")
        origin = Origin(new_request_id(), principal.actor, principal.session)
        try:
            msg = await quill.nc.request(
                subject, frame(head, body), timeout=TIMEOUT_S + 5, headers=origin.headers()
            )
        except nats.errors.NoRespondersError:
            return refused("not_found")  # no executor holds it (gone with its shell)
        except nats.errors.TimeoutError:
            return refused("timeout", f"No answer from port {port} in {TIMEOUT_S:g} s")
        try:
            answer, content = unframe(msg.data, PortResponse)
        except ValueError:
            return refused("bad_gateway", "The executor's answer was malformed")
        if answer.error is not None:
            return refused(answer.error, answer.message)
        response = Response(content, status_code=answer.status)
        response.raw_headers += [
            (k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in answer.headers
            if k.lower() not in NOT_BACK
        ]
        response.raw_headers += [
            (b"content-security-policy", SANDBOXED.encode()),
            (b"x-content-type-options", b"nosniff"),
        ]
        return response
