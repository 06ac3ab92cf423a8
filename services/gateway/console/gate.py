"""The console mounted in the gateway: who uses it is who REST knows (``access.py``).

``Gate`` (ASGI middleware, outside ``PrincipalMiddleware``) takes every ``/ui`` request to the
console: ``/ui/static/…`` and ``/ui/login`` as they are; any other through the gateway's own
``PrincipalMiddleware`` (bearer tokens; loopback without tokens), the token read from the
``quill_token`` cookie (``access.with_cookie_token``) when the request has no
``Authorization`` header. A page asked for without a valid token is sent to the login page
(303); anything else answers REST's 401. A form's body is read whole first, at most
``FORM_MAX_BYTES``. The login page, the cookie and each form's CSRF token are
``access.py``'s (``cookie_header``, ``Csrf``).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infra.http.bounds import BodyBounds
from services.gateway.access import PrincipalMiddleware, Tokens, with_cookie_token

PREFIX = "/ui"
FORM_MAX_BYTES = 64 * 1024


def _is_public(path: str) -> bool:
    return path.startswith(f"{PREFIX}/static/") or path == f"{PREFIX}/login"


class Gate:
    """Route ``/ui`` to the console (``console``) under the gateway's authentication."""

    def __init__(
        self, app: ASGIApp, console: ASGIApp, tokens: Tokens | None, body_timeout: float
    ) -> None:
        self.app = app
        bounded = BodyBounds(console, max_body=FORM_MAX_BYTES, body_timeout=body_timeout)
        self.public = bounded
        self.private = PrincipalMiddleware(bounded, tokens)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == PREFIX or path.startswith(f"{PREFIX}/")):
            await self.app(scope, receive, send)
            return
        if _is_public(path):
            await self.public(scope, receive, send)
            return
        try:
            scope = with_cookie_token(scope)
        except UnicodeEncodeError:
            pass  # a cookie that is no token: PrincipalMiddleware answers 401
        page = scope["method"] in ("GET", "HEAD") and "text/html" in HTTPConnection(
            scope
        ).headers.get("accept", "")
        await self.private(scope, receive, _to_login(send) if page else send)


def _to_login(send: Send) -> Send:
    """``send``, turning a 401 into a redirect to the login page."""
    redirected = False

    async def wrapped(message: Message) -> None:
        nonlocal redirected
        if message["type"] == "http.response.start" and message["status"] == 401:
            redirected = True
            headers: list[Any] = [
                (b"location", f"{PREFIX}/login".encode()),
                (b"content-length", b"0"),
            ]
            await send({"type": "http.response.start", "status": 303, "headers": headers})
            return
        if redirected:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                await send({"type": "http.response.body", "body": b""})
            return
        await send(message)

    return wrapped
