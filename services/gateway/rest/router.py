"""The REST routes, in one table: each route's method, path and handler (a room's method,
answered through ``edge.guard``: a ``QuillError`` by the gateway's one error table), over the
caller's access; and ``GET /openapi.json`` (public: it describes them)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute

from services.gateway.access import Access
from services.gateway.rest import openapi
from services.gateway.rest.approvals import Approvals
from services.gateway.rest.commands import COMMANDS, Commands
from services.gateway.rest.edge import guard
from services.gateway.rest.files import Files
from services.gateway.rest.merges import Merges
from services.gateway.rest.ports import METHODS, PORTS, Ports
from services.gateway.rest.portws import PortSockets
from services.gateway.rest.runs import Runs
from services.gateway.rest.shells import SHELLS, Shells
from services.gateway.rest.workspaces import Workspaces

FILES = "/v1/host/workspace/files"
RUNS = "/v1/runs"
WORKSPACES = "/v1/workspaces"


async def openapi_json(request: Request) -> Response:
    return JSONResponse(openapi.document())


def routes(access: Access) -> list[BaseRoute]:
    """Every REST route, ``/openapi.json`` first."""
    files, runs = Files(access), Runs(access)
    approvals, workspaces = Approvals(access), Workspaces(access)
    commands, shells = Commands(access), Shells(access)
    table = [
        ("GET", FILES, files.list_files),
        ("GET", FILES + "/{path:filepath}", files.get_file),
        ("PUT", FILES + "/{path:filepath}", files.put_file),
        ("DELETE", FILES + "/{path:filepath}", files.delete_file),
        ("GET", "/.well-known/openwop", files.discovery),
        ("POST", COMMANDS, commands.run),
        ("GET", COMMANDS, commands.list),
        ("GET", COMMANDS + "/{command_id}/output", commands.output),
        ("POST", COMMANDS + "/{command_id}/input", commands.input),
        ("POST", COMMANDS + "/{command_id}/signal", commands.signal),
        ("POST", COMMANDS + "/{command_id}/resize", shells.resize),
        ("POST", SHELLS, shells.open),
        ("GET", SHELLS, shells.list),
        ("POST", SHELLS + "/{shell_id}/commands", shells.run),
        ("POST", SHELLS + "/{shell_id}/checkpoint", shells.checkpoint),
        ("DELETE", SHELLS + "/{shell_id}", shells.close),
        ("POST", RUNS, runs.create),
        ("GET", RUNS + "/{run_id}", runs.snapshot),
        ("POST", RUNS + "/{run_id}/cancel", runs.cancel),
        ("GET", "/v1/approvals/{approval_id}", approvals.get),
        ("GET", WORKSPACES, workspaces.list),
        ("POST", WORKSPACES + "/{name}/archive", workspaces.archive),
        ("POST", WORKSPACES + "/{name}/unarchive", workspaces.unarchive),
        ("DELETE", WORKSPACES + "/{name}", workspaces.purge),
        ("POST", WORKSPACES + "/{name}/fork", workspaces.fork),
        ("GET", WORKSPACES + "/{name}/forks", workspaces.forks),
        ("POST", WORKSPACES + "/{name}/merge", Merges(access).merge),
    ]
    ports = guard(Ports(access).forward)  # a shell's port: any method, any path under it
    sockets = PortSockets(access).relay  # and a websocket to it
    return [
        Route("/openapi.json", openapi_json, methods=["GET"]),
        *(Route(path, guard(handler), methods=[method]) for method, path, handler in table),
        Route(PORTS, ports, methods=METHODS),
        Route(PORTS + "/{rest:path}", ports, methods=METHODS),
        WebSocketRoute(PORTS, sockets),
        WebSocketRoute(PORTS + "/{rest:path}", sockets),
    ]
