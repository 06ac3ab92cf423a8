"""Logging in and out: a bearer token checked against the gateway's tokens, kept in an
``HttpOnly``, ``SameSite=Strict`` cookie (``services/gateway/access.py``)."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from services.gateway.access import (
    COOKIE,
    LOGIN_COOKIE,
    Refused,
    cookie_header,
    new_login_nonce,
)
from services.gateway.console.gate import PREFIX

if TYPE_CHECKING:
    from services.gateway.console import Console

TOKEN_MAX = 4096


async def login(c: Console, request: Request) -> Response:
    """GET: the form (without tokens: nothing to log in to, straight to the console);
    POST: check the token, store it, go to the console."""
    secure = request.url.scheme == "https"
    if c.tokens is None:
        return RedirectResponse(f"{PREFIX}/", status_code=303)
    if request.method == "GET":
        nonce = new_login_nonce()
        response = c.page(request, "login.html", {"nonce": nonce, "failed": False})
        response.headers.append(
            "set-cookie", cookie_header(LOGIN_COOKIE, nonce, PREFIX, secure, 600)
        )
        return response
    form = await request.form()
    sent, kept = form.get("csrf"), request.cookies.get(LOGIN_COOKIE)
    if not (isinstance(sent, str) and kept and hmac.compare_digest(sent, kept)):
        raise Refused("missing or wrong CSRF token: reload the login page")
    if not c.csrf.same_origin(request):
        raise Refused("cross-site form")
    token = form.get("token")
    token = token.strip() if isinstance(token, str) else ""
    if not token or len(token) > TOKEN_MAX or not token.isascii() or c.tokens.find(token) is None:
        nonce = new_login_nonce()
        response = c.page(request, "login.html", {"nonce": nonce, "failed": True}, status=401)
        response.headers.append(
            "set-cookie", cookie_header(LOGIN_COOKIE, nonce, PREFIX, secure, 600)
        )
        return response
    response = RedirectResponse(f"{PREFIX}/", status_code=303)
    response.headers.append(
        "set-cookie", cookie_header(COOKIE, quote(token, safe=""), PREFIX, secure)
    )
    response.headers.append("set-cookie", cookie_header(LOGIN_COOKIE, "", PREFIX, secure, 0))
    return response


async def logout(c: Console, request: Request) -> Response:
    await c.csrf.checked_form(request)
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    response.headers.append(
        "set-cookie", cookie_header(COOKIE, "", PREFIX, request.url.scheme == "https", 0)
    )
    return response
