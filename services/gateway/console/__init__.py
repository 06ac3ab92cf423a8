"""The operator's console: HTML pages at ``/ui/`` over the same SDK calls REST makes
(docs/console.md).

``Console`` is an ASGI app; ``Console.gate`` is the middleware ``services/gateway/app.py`` puts
outside ``PrincipalMiddleware`` to send ``/ui`` requests here under the gateway's own
authentication (``gate.py``, over ``services/gateway/access.py``). Pages are Jinja2 templates
(``templates/``), made interactive by htmx and its SSE extension, vendored with their licences
(``static/``); no CDN, no build step. A page reads the workspace as the principal's SDK handle
(``Access.workspace``), so a tenant reaches exactly what it reaches over REST.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jinja2
from pygments.formatters import HtmlFormatter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp

from contracts.errors import QuillError
from quill.client import Workspace
from services.gateway import errors
from services.gateway.access import Access, Csrf, Principal, Refused, Tokens, principal_of
from services.gateway.console import render, words
from services.gateway.console.cluster import Cluster
from services.gateway.console.gate import PREFIX, Gate

log = logging.getLogger("quill.gateway")

HERE = Path(__file__).parent
Handler = Callable[[Request], Awaitable[Response]]
Page = Callable[["Console", Request], Awaitable[Response]]


class Console:
    """The console's pages over ``access`` (the gateway's principals and their workspaces)."""

    def __init__(self, access: Access, tokens: Tokens | None, body_timeout: float) -> None:
        self.access, self.tokens, self.body_timeout = access, tokens, body_timeout
        self.csrf = Csrf()
        self.cluster = Cluster()
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        env.filters["when"] = words.when
        env.filters["op_words"] = words.op_words
        env.filters["mark"] = words.mark
        env.filters["counted"] = words.counted
        env.filters["command_link"] = words.command_link
        env.filters["command_of"] = words.command_of
        env.filters["diff_lines"] = render.unified
        env.filters["filesize"] = lambda n: jinja2.filters.do_filesizeformat(n, binary=True)
        self.templates = Jinja2Templates(env=env)
        formatter: Any = HtmlFormatter(style="default")
        self.pygments_css = str(formatter.get_style_defs(".hl"))
        self.app = Starlette(routes=self.routes())

    def gate(self, app: ASGIApp) -> ASGIApp:
        """The middleware that routes ``/ui`` here (``Middleware(console.gate)``)."""
        return Gate(app, self.app, self.tokens, self.body_timeout)

    def routes(self) -> list[BaseRoute]:
        from services.gateway.console import (
            cluster,
            commands,
            forks,
            history,
            live,
            merges,
            operate,
            processes,
            session,
            workspaces,
        )

        def r(
            path: str, handler: Callable[[Console, Request], Awaitable[Response]], **kw: Any
        ) -> Route:
            return Route(f"{PREFIX}{path}", self.guarded(handler), **kw)

        async def css(request: Request) -> Response:
            return PlainTextResponse(self.pygments_css, media_type="text/css")

        async def home(request: Request) -> Response:
            return RedirectResponse(f"{PREFIX}/", status_code=307)

        return [
            Route(PREFIX, home),
            Route(f"{PREFIX}/static/pygments.css", css),
            Mount(f"{PREFIX}/static", StaticFiles(directory=HERE / "static"), name="static"),
            r("/login", session.login, methods=["GET", "POST"]),
            r("/logout", session.logout, methods=["POST"]),
            r("/", workspaces.page),
            r("/cluster", cluster.page),
            r("/live/workspaces", workspaces.live),
            r("/w/{ws}/", history.timeline),
            r("/w/{ws}/tree", history.tree),
            r("/w/{ws}/file", history.file),
            r("/w/{ws}/history", history.file_history),
            r("/w/{ws}/diff", history.diff),
            r("/w/{ws}/forks", forks.page, methods=["GET"]),
            r("/w/{ws}/forks", forks.make, methods=["POST"]),
            r("/w/{ws}/merge", merges.preview, methods=["GET"]),
            r("/w/{ws}/merge", merges.run, methods=["POST"]),
            r("/w/{ws}/approvals", operate.approvals),
            r("/w/{ws}/approvals/{approval}", operate.decide, methods=["POST"]),
            r("/w/{ws}/approvals/{approval}", operate.approval, methods=["GET"]),
            r("/w/{ws}/runs", operate.runs),
            r("/w/{ws}/audit", operate.audit),
            r("/w/{ws}/live", live.events),
            r("/w/{ws}/audit/live", live.audit),
            r("/w/{ws}/commands", commands.commands),
            r("/w/{ws}/commands/live", commands.commands_live),
            r("/w/{ws}/commands/{command}", commands.command),
            r("/w/{ws}/commands/{command}/output", commands.output_live),
            r("/w/{ws}/processes", processes.page),
            r("/w/{ws}/processes/kill", processes.kill, methods=["POST"]),
        ]

    def guarded(self, handler: Page) -> Handler:
        """``handler``, its ``QuillError`` an error page (with the status of the gateway's one
        table, ``services/gateway/errors.py``, as REST answers it) and a refused form a 403."""

        async def run(request: Request) -> Response:
            try:
                return await handler(self, request)
            except Refused as exc:
                return self.page(request, "error.html", {"message": str(exc)}, status=403)
            except QuillError as exc:
                code = str(exc.code)
                context = {"message": exc.message, "code": code}
                return self.page(request, "error.html", context, status=errors.row(code).status)

        return run

    def principal(self, request: Request) -> Principal:
        return principal_of(request.scope)

    async def workspace(self, request: Request) -> Workspace:
        """The workspace named in the URL, as the caller reaches it (another tenant's never):
        ``name`` of the caller's tenant, or ``tenant:name`` (``tenant/name``, for a caller that
        reaches ``anywhere``; any other's is refused as a bad name)."""
        name = request.path_params["ws"].replace(":", "/", 1)
        return await self.access.workspace(self.principal(request), name)

    def page(
        self, request: Request, template: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        principal = request.scope.get("state", {}).get("principal")
        ws: str | None = request.path_params.get("ws")
        browsed = ws.partition(":")[0] if ws and ":" in ws else None
        base = {
            "prefix": PREFIX,
            "principal": principal,
            "logged_in": self.tokens is not None and principal is not None,
            "csrf": self.csrf.token(request) if principal is not None else "",
            "ws": ws,
            "ws_name": ws.partition(":")[2] if ws and browsed else ws,
            "tenant": browsed or (principal.tenant if principal is not None else None),
        }
        headers = {"Cache-Control": "no-store", "X-Frame-Options": "DENY"}
        return self.templates.TemplateResponse(
            request, template, base | context, status_code=status, headers=headers
        )
