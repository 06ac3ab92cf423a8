"""The REST routes, as the gateway's app includes them: each room's routes over the caller's
access, and ``GET /openapi.json`` (public: it describes them)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from services.gateway.access import Access
from services.gateway.rest import openapi
from services.gateway.rest.approvals import Approvals
from services.gateway.rest.files import Files
from services.gateway.rest.runs import Runs
from services.gateway.rest.workspaces import Workspaces


async def openapi_json(request: Request) -> Response:
    return JSONResponse(openapi.document())


def routes(access: Access) -> list[BaseRoute]:
    """Every REST route, ``/openapi.json`` first."""
    return [
        Route("/openapi.json", openapi_json, methods=["GET"]),
        *Files(access).routes(),
        *Runs(access).routes(),
        *Approvals(access).routes(),
        *Workspaces(access).routes(),
    ]
