"""Who uses the console, exactly as REST knows callers, and CSRF protection for its forms.

* ``Gate`` (ASGI middleware, outside ``PrincipalMiddleware``) takes every ``/ui`` request to the
  console: ``/ui/static/…`` and ``/ui/login`` as they are; any other through the gateway's own
  ``PrincipalMiddleware`` (bearer tokens; loopback without tokens), the token read from the
  ``quill_token`` cookie when the request has no ``Authorization`` header. A page asked for
  without a valid token is sent to the login page (303); anything else answers REST's 401.
* The login page checks a token against the same ``Tokens`` and stores it in a cookie that
  scripts cannot read (``HttpOnly``), sent on same-site requests only (``SameSite=Strict``),
  limited to ``/ui``, ``Secure`` behind HTTPS.
* Every mutating form carries a CSRF token: an HMAC, under a key of this process (or
  ``QUILL_GATEWAY_STATE_KEY``, shared by gateways behind one address), of the caller's
  credential; ``checked_form`` refuses (403) a POST without the right one, or whose ``Origin``
  is another site's. The login form, which has no credential yet, uses a random cookie
  (double submit).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from typing import Any
from urllib.parse import unquote

from starlette.datastructures import FormData
from starlette.requests import HTTPConnection, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infra.http.bounds import BodyBounds
from services.gateway.principals import PrincipalMiddleware, Tokens

PREFIX = "/ui"
COOKIE = "quill_token"
LOGIN_COOKIE = "quill_login"
FORM_MAX_BYTES = 64 * 1024
STATE_KEY_ENV = "QUILL_GATEWAY_STATE_KEY"


class Refused(Exception):
    """A form refused (403): no or a wrong CSRF token, or a cross-site origin."""


def _key() -> bytes:
    shared = os.environ.get(STATE_KEY_ENV, "")
    return shared.encode() if len(shared) >= 32 else os.urandom(32)


class Csrf:
    """CSRF tokens bound to the caller's credential."""

    def __init__(self) -> None:
        self.key = _key()

    @staticmethod
    def credential(conn: HTTPConnection) -> str:
        header = conn.headers.get("authorization", "")
        return hashlib.sha256(header.encode()).hexdigest()

    def token(self, conn: HTTPConnection) -> str:
        mac = hmac.new(self.key, b"csrf|" + self.credential(conn).encode(), hashlib.sha256)
        return mac.hexdigest()

    def same_origin(self, conn: HTTPConnection) -> bool:
        """No ``Origin`` (a client that is no browser) or this gateway's own; a browser that
        sends only ``Sec-Fetch-Site`` must say ``same-origin``."""
        origin = conn.headers.get("origin")
        if origin is None:
            return conn.headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")
        return origin.split("://", 1)[-1] == conn.headers.get("host", "")

    async def checked_form(self, request: Request) -> FormData:
        """The POSTed form, once its CSRF token and origin are right.

        Raises:
            Refused: they are not.
        """
        form = await request.form()
        sent = form.get("csrf")
        if not isinstance(sent, str) or not hmac.compare_digest(sent, self.token(request)):
            raise Refused("missing or wrong CSRF token")
        if not self.same_origin(request):
            raise Refused("cross-site form")
        return form


def cookie_header(name: str, value: str, secure: bool, max_age: int | None = None) -> str:
    parts = [f"{name}={value}", f"Path={PREFIX}", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def new_login_nonce() -> str:
    return secrets.token_urlsafe(24)


def _is_public(path: str) -> bool:
    return path.startswith(f"{PREFIX}/static/") or path == f"{PREFIX}/login"


def _with_cookie_token(scope: Scope) -> Scope:
    """``scope`` with ``Authorization: Bearer <cookie>`` when it has a cookie and no header."""
    conn = HTTPConnection(scope)
    token = unquote(conn.cookies.get(COOKIE, ""))
    if not token or "authorization" in conn.headers:
        return scope
    headers = [*scope["headers"], (b"authorization", f"Bearer {token}".encode("latin-1"))]
    return {**scope, "headers": headers}


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
            scope = _with_cookie_token(scope)
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
