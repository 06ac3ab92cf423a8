"""The gateway's tool tables against the op registry (``contracts.ops.OPS``), without a server:
every tool names an op that exists, every op is a tool at ``/mcp`` or is listed with why it is
not, and a tool served by the generic path sends only fields of its op's request to an SDK
method that answers its op's result."""

from __future__ import annotations

import inspect
import typing

import msgspec
import pytest

from contracts.ops import OPS
from quill.client import Workspace
from services.gateway.mcp import endpoints, wap
from services.gateway.mcp import table as optable
from services.gateway.mcp.table import Tool

TABLES = {"/mcp": endpoints.MCP_TOOLS, "/mcp/wap": wap.TOOLS}
ROWS = [(endpoint, tool) for endpoint, table in TABLES.items() for tool in table]
GENERIC = [(endpoint, tool) for endpoint, tool in ROWS if tool.call is None and tool.run is None]


def ids(row: tuple[str, Tool]) -> str:
    return f"{row[0]}:{row[1].name}"


@pytest.mark.parametrize("row", ROWS, ids=[ids(r) for r in ROWS])
def test_every_tool_names_an_op(row: tuple[str, Tool]) -> None:
    _, tool = row
    assert tool.op in OPS, f"{tool.name} names {tool.op}, which contracts.ops does not have"


def test_every_op_is_a_tool_or_says_why_not() -> None:
    offered = set(endpoints.TOOL_OPS.values())
    assert offered.isdisjoint(endpoints.NO_TOOL), offered & set(endpoints.NO_TOOL)
    missing = set(OPS) - offered - set(endpoints.NO_TOOL)
    assert not missing, f"ops with no /mcp tool (add a row, or a NO_TOOL line): {missing}"
    assert set(endpoints.NO_TOOL) <= set(OPS), set(endpoints.NO_TOOL) - set(OPS)


def test_tool_names_are_unique() -> None:
    for table in TABLES.values():
        names = [tool.name for tool in table]
        assert len(names) == len(set(names)), names


@pytest.mark.parametrize("row", GENERIC, ids=[ids(r) for r in GENERIC])
def test_a_generic_tool_is_its_op(row: tuple[str, Tool]) -> None:
    """The request the arguments make is the op's (``OPS[op].request``), sent through the SDK
    method whose result is the op's (``OPS[op].result``)."""
    _, tool = row
    spec = OPS[tool.op]
    method = getattr(Workspace, optable.sdk_method(tool.op), None)
    assert method is not None, f"no Workspace method for {tool.op}"
    assert typing.get_type_hints(method)["return"] is spec.result
    fields = {f.name for f in msgspec.structs.fields(spec.request)}
    parameters = set(inspect.signature(method).parameters)
    for arg in tool.args:
        if arg.name == optable.WORKSPACE:
            continue
        assert arg.field in fields, (
            f"{tool.name}.{arg.name}: {spec.request.__name__} has no {arg.field}"
        )
        assert arg.field in parameters, f"{tool.name}.{arg.name}: Workspace has no {arg.field}"


async def test_each_endpoint_lists_its_table() -> None:
    for endpoint, build in (("/mcp", endpoints.build_mcp), ("/mcp/wap", endpoints.build_wap)):
        server = build(None)  # type: ignore[arg-type]  # listing tools reaches no workspace
        listed = [t.name for t in await server.list_tools()]
        table = [t.name for t in TABLES[endpoint]]
        assert listed == [name for name in table if name not in endpoints.OPERATOR_TOOLS]
    every = endpoints.build_mcp(None, tuple(endpoints.OPERATOR_TOOLS))  # type: ignore[arg-type]
    assert [t.name for t in await every.list_tools()] == [t.name for t in endpoints.MCP_TOOLS]
