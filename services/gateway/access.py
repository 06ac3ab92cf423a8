"""Who is calling, and what they reach: the one place REST, MCP and the console use.

``PrincipalMiddleware`` turns ``Authorization: Bearer <token>`` into a ``Principal`` stored in
``scope["state"]["principal"]`` (401 ``{"error": "unauthorized"}`` when the token is missing or
unknown). Without a tokens file every caller is tenant ``default``, workspace ``default``.
``Access`` hands out the SDK workspace a principal may use:

* a pinned token (the default, ``scope = "workspace"``): only the token's own
  tenant·workspace; any other name is ``WORKSPACE_NOT_FOUND`` whether or not it exists, so
  nothing leaks;
* a token with ``scope = "tenant"``: its own workspace first (the primary of its MCP
  sessions), and any other workspace of its tenant, created on first use; never another
  tenant's;
* without tokens (the gateway then serves loopback only), as ``scope = "tenant"`` in tenant
  ``default`` (workspace ``default``), and any workspace of any tenant named
  ``tenant/workspace``: whoever reaches a loopback gateway without tokens runs it.

The tenant's workspaces (``listing``, ``target``): a pinned token sees its own in a listing
and nothing else, and may not archive, unarchive or purge any (``ACCESS_DENIED``). Forks
(``fork``, ``forks``: every door's) and merges (``merge``) need both names reached: a pinned
token could not reach the fork it would make (or merge), so it neither forks, lists forks nor
merges; a fork and a merge stay in their tenant.

A browser (the console) carries its token in a cookie (``COOKIE``, read as the bearer token
by ``with_cookie_token``: ``HttpOnly``, ``SameSite=Strict``, ``Secure`` behind HTTPS, limited to
the console's path) and each form it posts a CSRF token (``Csrf``): an HMAC of the caller's
credential under ``state_key()``, checked with the form's origin. The login form, which has no
credential yet, uses a random cookie (double submit: ``LOGIN_COOKIE``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import time
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from starlette.datastructures import FormData
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from contracts.errors import ErrorCode, QuillError
from contracts.limits import GATEWAY_SESSIONS, GATEWAY_WORKSPACES
from contracts.subjects import check_id
from core.lru import LRU
from quill.client import Quill, Workspace

log = logging.getLogger("quill.gateway")

DEFAULT_TENANT = "default"
DEFAULT_WORKSPACE = "default"
SCOPES = ("workspace", "tenant")
"""A token's ``scope``: its own workspace only (pinned), or any workspace of its tenant."""
PUBLIC_PATHS = frozenset({"/health", "/metrics", "/openapi.json"})
"""Paths anyone may fetch, token or not (nothing workspace-specific)."""
OPEN_PATHS = frozenset({"/.well-known/openwop"})
"""Paths anyone may fetch too, where a caller with a valid token is still known (its
principal stored); without one the handler answers what it tells everyone."""


@dataclass(frozen=True)
class Principal:
    """A caller: the tenant·workspace it acts in (its sessions' primary); ``pinned`` when it
    may reach no other (``scope = "tenant"`` tokens and callers without tokens are not)."""

    tenant: str
    workspace: str
    pinned: bool = True
    actor: str = "local"
    """Who the caller is in events and audit records."""
    anywhere: bool = False
    """May name a workspace of any tenant as ``tenant/workspace`` (no tokens: loopback only)."""
    session: str | None = None
    """The caller's session in events and audit records (an MCP client's: ``mcp/clients.py``)."""

    @property
    def name(self) -> str:
        return f"{self.tenant}/{self.workspace}"


ANONYMOUS = Principal(DEFAULT_TENANT, DEFAULT_WORKSPACE, pinned=False, anywhere=True)
"""Every caller when the gateway runs without a tokens file."""


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when the file is edited or replaced (``quill token`` replaces it)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class Tokens:
    """Bearer tokens and their principals (kept as sha256 digests, never as plain text).

    Loaded from a file, they follow it: each lookup checks the file's modification time,
    size and inode (one ``stat``), and reads it again when it changed (``quill token add``,
    ``revoke``), so a token works, or stops working, without a restart. A file that no
    longer reads (malformed, removed) keeps the tokens read last, with a warning."""

    def __init__(
        self,
        principals: dict[str, Principal],
        path: Path | None = None,
        stamp: tuple[int, int, int] | None = None,
    ) -> None:
        """``path``: the file they were read from, as it was (``stamp``) before reading."""
        self._by_digest = {_digest(token): p for token, p in principals.items()}
        self._path, self._stamp = path, stamp

    def _refresh(self) -> None:
        if self._path is None or (stamp := _stamp(self._path)) == self._stamp:
            return
        self._stamp = stamp
        try:
            fresh = Tokens.load(self._path)
        except ValueError as exc:
            log.warning("tokens file not reloaded (the previous tokens stay): %s", exc)
            return
        self._by_digest = fresh._by_digest
        log.info("tokens reloaded from %s: %d token(s)", self._path, len(self._by_digest))

    @classmethod
    def load(cls, path: Path) -> Tokens:
        """Read a TOML file of ``[tokens."<token>"]`` tables with ``tenant`` and ``workspace``,
        or a tenants file (``quill_cli/tenants.py``), whose ``[tenants.<t>.tokens."<token>"]``
        tables name only the ``workspace`` (a tenants file may have no tokens at all: the
        gateway then admits no one). Either may add ``actor`` and ``scope`` (``workspace``,
        the default: the token reaches its workspace only; ``tenant``: any of its tenant's).

        Raises:
            ValueError: the file is missing, not TOML, or a table is malformed.
        """
        stamp = _stamp(path)  # before reading: a change made meanwhile is read next time
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read tokens file {path}: {exc}") from None
        tables = data.get("tokens", {})
        tenants = data.get("tenants")
        if not isinstance(tables, dict) or not (tables or isinstance(tenants, dict)):
            raise ValueError(f'{path}: no [tokens."<token>"] tables')
        entries = [(f'[tokens."{token[:4]}…"]', token, table) for token, table in tables.items()]
        for tenant, settings in (tenants or {}).items():
            nested = settings.get("tokens", {}) if isinstance(settings, dict) else None
            if not isinstance(nested, dict):
                raise ValueError(f'{path}: [tenants.{tenant}.tokens."<token>"] must be tables')
            for token, table in nested.items():
                label = f'[tenants.{tenant}.tokens."{token[:4]}…"]'
                if isinstance(table, dict) and "tenant" in table:
                    raise ValueError(f"{path}: {label}: the tenant is {tenant}: drop tenant =")
                if isinstance(table, dict):
                    table = {**table, "tenant": tenant}
                entries.append((label, token, table))
        principals: dict[str, Principal] = {}
        for label, token, table in entries:
            where = f"{path}: {label}"
            if token in principals:
                raise ValueError(f"{where}: the same token appears twice")
            if len(token) < 8:
                raise ValueError(f"{where}: a token needs at least 8 characters")
            if not isinstance(table, dict) or not (
                {"tenant", "workspace"} <= set(table) <= {"tenant", "workspace", "actor", "scope"}
            ):
                raise ValueError(
                    f"{where}: needs tenant = and workspace = (and maybe actor =, scope =)"
                )
            scope = table.get("scope", "workspace")
            if scope not in SCOPES:
                raise ValueError(f'{where}: scope must be "workspace" or "tenant", not {scope!r}')
            actor = str(table.get("actor") or f"token:{_digest(token)[:8]}")
            if len(actor) > 128 or not actor.isprintable():
                raise ValueError(f"{where}: actor must be up to 128 printable characters")
            try:
                tenant = check_id("tenant", str(table["tenant"]))
                workspace = check_id("workspace", str(table["workspace"]))
            except QuillError as exc:
                raise ValueError(f"{where}: {exc.message}") from None
            pinned = scope == "workspace"
            principals[token] = Principal(tenant, workspace, pinned=pinned, actor=actor)
        return cls(principals, path, stamp)

    def find(self, token: str) -> Principal | None:
        self._refresh()
        return self._by_digest.get(_digest(token))

    def principals(self) -> list[Principal]:
        self._refresh()
        return sorted(set(self._by_digest.values()), key=lambda p: p.name)


@functools.lru_cache(maxsize=256)
def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.1``, ``::1``...); asked on
    every request, remembered for the few hosts a gateway sees (parsing cost ~2% of a call)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """The host of a ``Host`` header: ``[::1]:8080`` → ``::1``, ``localhost:80`` → ``localhost``."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0]


class PrincipalMiddleware:
    """Resolve the caller once per HTTP request; refuse unknown callers with 401.

    Without tokens the gateway listens on loopback only, and also refuses (403) a request whose
    ``Host`` is not a loopback name: a web page that rebinds its DNS name to 127.0.0.1 gets
    nothing.
    """

    def __init__(self, app: ASGIApp, tokens: Tokens | None) -> None:
        self.app, self.tokens = app, tokens

    def resolve(self, scope: Scope) -> Principal | None:
        if self.tokens is None:
            return ANONYMOUS
        header = HTTPConnection(scope).headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self.tokens.find(token.strip())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        if scope["path"] in OPEN_PATHS:
            host = host_of(HTTPConnection(scope).headers.get("host", ""))
            known = self.tokens is not None or is_loopback(host)
            principal = self.resolve(scope) if known else None
            if principal is not None:
                scope.setdefault("state", {})["principal"] = principal
            await self.app(scope, receive, send)
            return
        if self.tokens is None:
            host = host_of(HTTPConnection(scope).headers.get("host", ""))
            if not is_loopback(host):
                refused = JSONResponse(
                    {"error": "access_denied", "message": f"Host {host!r} is not loopback"},
                    status_code=403,
                )
                await refused(scope, receive, send)
                return
        principal = self.resolve(scope)
        if principal is None:
            response = JSONResponse(
                {"error": "unauthorized"},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="quill"'},
            )
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


def principal_of(scope: Scope | Any) -> Principal:
    """The principal ``PrincipalMiddleware`` stored for this request."""
    principal = scope.get("state", {}).get("principal")
    if not isinstance(principal, Principal):  # a route mounted outside the middleware: a bug
        raise QuillError(ErrorCode.INTERNAL, "No principal for this request")
    return principal


# ---------------------------------------------------------------- browsers: cookies and CSRF

COOKIE = "quill_token"
"""The cookie a browser carries its token in (``with_cookie_token``)."""
LOGIN_COOKIE = "quill_login"
"""The login form's double-submit nonce."""
STATE_KEY_ENV = "QUILL_GATEWAY_STATE_KEY"
"""A secret of 32+ characters gateways behind one address share: what one signs (a CSRF
token, a sealed MCP request state) another accepts."""


def state_key() -> bytes:
    """``QUILL_GATEWAY_STATE_KEY``, or (unset, or too short: a warning) a key of this process."""
    shared = os.environ.get(STATE_KEY_ENV)
    if shared and len(shared) < 32:
        log.warning("%s is under 32 characters: ignored (this gateway's own key)", STATE_KEY_ENV)
    return shared.encode() if shared and len(shared) >= 32 else os.urandom(32)


def cookie_header(
    name: str, value: str, path: str, secure: bool, max_age: int | None = None
) -> str:
    """A ``Set-Cookie`` value scripts cannot read, sent on same-site requests to ``path``."""
    parts = [f"{name}={value}", f"Path={path}", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def new_login_nonce() -> str:
    return secrets.token_urlsafe(24)


def with_cookie_token(scope: Scope) -> Scope:
    """``scope`` with ``Authorization: Bearer <cookie>`` when it has a cookie and no header.

    Raises:
        UnicodeEncodeError: a cookie that is no token (not latin-1).
    """
    conn = HTTPConnection(scope)
    token = unquote(conn.cookies.get(COOKIE, ""))
    if not token or "authorization" in conn.headers:
        return scope
    headers = [*scope["headers"], (b"authorization", f"Bearer {token}".encode("latin-1"))]
    return {**scope, "headers": headers}


class Refused(Exception):
    """A form refused (403): no or a wrong CSRF token, or a cross-site origin."""


class Csrf:
    """CSRF tokens bound to the caller's credential."""

    def __init__(self) -> None:
        self.key = state_key()

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


class Access:
    """The SDK workspaces principals may use, created (``exist_ok``) before first use."""

    def __init__(self, quill: Quill) -> None:
        self.quill = quill
        self._ready: LRU[str, bool] = LRU(GATEWAY_WORKSPACES)
        """Workspaces created (``exist_ok``) by this process, the most recently used."""
        self._views: LRU[tuple[str, str | None], Quill] = LRU(GATEWAY_SESSIONS)
        """Per principal's actor and session (MCP clients name theirs: the most recently
        used)."""

    def _client(self, principal: Principal) -> Quill:
        """The SDK client that names the principal's actor (and session) in its requests."""
        key = (principal.actor, principal.session)
        view = self._views.get(key)
        if view is None:
            view = self.quill.as_actor(principal.actor, session=principal.session)
            self._views.put(key, view)
        return view

    async def prepare(self, principals: Iterable[Principal], timeout: float = 30.0) -> None:
        """Create each principal's workspace if missing, waiting (bounded) for a writer.

        Raises:
            QuillError: ``UNAVAILABLE``/``TIMEOUT`` if no writer answered in ``timeout``.
        """
        deadline = time.monotonic() + timeout
        for principal in principals:
            while True:
                try:
                    await self._ensure(self.quill.workspace(principal.name))
                    break
                except QuillError as exc:
                    if not exc.retriable or time.monotonic() > deadline:
                        raise
                    log.info("waiting for a writer to create %s: %s", principal.name, exc)
                    await asyncio.sleep(0.5)

    async def _ensure(self, ws: Workspace) -> Workspace:
        key = f"{ws.tenant}/{ws.name}"
        if self._ready.get(key) is None:
            await ws.create(exist_ok=True)
            self._ready.put(key, True)
        return ws

    def forget(self, name: str) -> None:
        """``tenant/workspace`` was purged: create it again on its next use."""
        self._ready.pop(name)

    async def workspace(self, principal: Principal, name: str | None = None) -> Workspace:
        """The workspace ``name`` of the principal's tenant (default: the principal's own), or
        for a principal that reaches ``anywhere``, ``tenant/workspace`` of any tenant.

        Raises:
            QuillError: ``WORKSPACE_NOT_FOUND`` for a workspace the principal may not reach,
                ``INVALID_ARGUMENT`` for a malformed name.
        """
        client = self._client(principal)
        if name is None or name == "" or name == principal.workspace:
            return await self._ensure(client.workspace(principal.name))
        if principal.pinned:
            raise QuillError(
                ErrorCode.WORKSPACE_NOT_FOUND, f"Workspace not found: {name}", {"workspace": name}
            )
        tenant, _, rest = name.rpartition("/")
        if tenant and principal.anywhere:
            check_id("tenant", tenant)
            check_id("workspace", rest)
            return await self._ensure(client.workspace(name))
        check_id("workspace", name)
        return await self._ensure(client.workspace(f"{principal.tenant}/{name}"))
