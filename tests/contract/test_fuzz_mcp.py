"""Every MCP tool through the official MCP client: arguments drawn from the tool's published
input schema (``tools/list``), valid and mutated; each call gets one answer within 5 s, a tool
result (never a JSON-RPC error) whose error code is one the tool's op documents, never INTERNAL.
Raw JSON-RPC bodies (invalid UTF-8, 100,000 deep, not JSON) get an HTTP answer, never a 500."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from mcp import Client

from contracts.errors import ErrorCode as E
from contracts.ops import OPS, OpSpec
from services.gateway.mcp import endpoints, table
from services.gateway.mcp import wap as wap_tools
from tests.contract.conftest import (
    ANSWER_S,
    LEDGER,
    Failure,
    LoopDriver,
    alive,
    examples,
    judge_code,
    seed,
    verify_all,
)
from tests.contract.strategies import from_schema, mutated_body, narrow
from tests.gateway.support import mcp_client
from tests.up import Up

EXAMPLES = examples(10)
WORKSPACE = "default/default"
"""Where the gateway without ``--tokens`` sends every tool call."""

TOOL_OPS = table.ops_of(endpoints.offered())
"""Each tool ``quill up``'s gateway offers and the op it is (docs/gateway.md), whose documented
errors it may answer (an operator's tool is offered only when asked: not here)."""
WAP_TOOL_OPS = wap_tools.TOOL_OPS
"""The tools at ``/mcp/wap`` and their ops."""


MCP_ANY = (E.ACCESS_DENIED, E.FILE_NOT_FOUND, E.NOT_A_FILE, E.NOT_A_DIRECTORY, E.INVALID_ENCODING)
"""Codes docs/gateway.md ("Error texts") documents for any tool: the workspace tool's own
semantics (``read_file`` of a directory is ``NOT_A_FILE``, where ``qry.read`` lists it)."""
MCP_SPECS: dict[str, OpSpec] = {
    key: dataclasses.replace(spec, errors=spec.errors + MCP_ANY) for key, spec in OPS.items()
}
ALSO: dict[str, str] = {"read_command_output": "exec.poll"}
"""A tool that is a second op too: ``read_command_output`` with a ``cursor`` polls a live
command (docs/gateway.md), so ``exec.poll``'s errors are its own as well."""


class McpDriver(LoopDriver):
    """An MCP client session on its own event loop, for the synchronous Hypothesis tests."""

    def __init__(self, up: Up, path: str = "/mcp") -> None:
        super().__init__(up)
        self.path = path
        self.open()
        tools = self.run(self.client.list_tools()).tools
        self.schemas: dict[str, dict[str, Any]] = {t.name: dict(t.input_schema) for t in tools}
        tenant, name = WORKSPACE.split("/")
        self.run(seed(self.bus.nc, tenant, name))

    def open(self) -> None:
        """(Re)open the MCP session (after a failure broke it, the next cases still run)."""
        self.stop = asyncio.Event()
        ready: asyncio.Future[Client] = self.loop.create_future()
        up = self.up

        async def hold() -> None:  # enters and leaves the client in one task (anyio needs it)
            async with mcp_client(up.http_url, self.path) as client:
                ready.set_result(client)
                await self.stop.wait()

        self.holder = self.loop.create_task(hold())
        self.client: Client = self.run(ready)

    def reopen(self) -> None:
        self.stop.set()
        with contextlib.suppress(Exception):
            self.run(self.holder)
        self.open()

    def close(self) -> None:
        self.stop.set()
        self.run(self.holder)
        super().close()


@pytest.fixture(scope="module")
def mcp(up: Up) -> Iterator[McpDriver]:
    found = McpDriver(up)
    yield found
    found.close()


@pytest.fixture(scope="module")
def wap(up: Up) -> Iterator[McpDriver]:
    found = McpDriver(up, "/mcp/wap")
    yield found
    found.close()


def arguments(schema: dict[str, Any], key: str) -> st.SearchStrategy[tuple[str, Any]]:
    """(kind, arguments) for a tool: valid ones, or one JSON mutation of them."""
    schema = {**schema, "properties": dict(schema.get("properties", {}))}
    schema["properties"].pop("workspace", None)  # the session's: default/default
    valid = from_schema(schema).map(lambda body: ("valid", narrow(key, body)))
    bad = mutated_body(schema, key, raw=False).map(lambda m: (m[0], m[1]))
    return valid | bad


async def call(client: Client, tool: str, args: Any) -> tuple[str, Any]:
    """('answer', result) or ('error', what went wrong) within ``ANSWER_S``."""
    try:
        async with asyncio.timeout(ANSWER_S):
            return "answer", await client.call_tool(tool, args)
    except TimeoutError:
        return "error", f"no answer within {ANSWER_S:g} s"
    except Exception as e:  # a JSON-RPC error, or the transport broke
        return "error", f"{type(e).__name__}: {str(e)[:160]}"


def judge_tool(
    tool: str, kind: str, args: Any, got: tuple[str, Any], tools: dict[str, str] = TOOL_OPS
) -> str | None:
    key = tools[tool]
    what, result = got
    shown = json.dumps(args, default=str)[:300]
    if what == "error":
        outcome: str | None = f"not a tool result: {result}"
    elif not result.is_error:
        LEDGER.saw("mcp", key, kind, "ok", shown)
        return None
    else:
        structured = result.structured_content or {}
        code = structured.get("code")
        if tools is WAP_TOOL_OPS and code == "PERMISSION_DENIED":
            code = "ACCESS_DENIED"  # WAP's name for it (docs/gateway.md)
        LEDGER.saw("mcp", key, kind, str(code), shown)
        spec = MCP_SPECS[key]
        if tool in ALSO:
            spec = dataclasses.replace(spec, errors=spec.errors + OPS[ALSO[tool]].errors)
        outcome = judge_code(spec, code, str(structured.get("error")))
    if outcome is None:
        return None
    failure = Failure("mcp", f"{key}:{tool}", kind, outcome, f"arguments={shown}")
    return None if LEDGER.record(failure) else failure.line()


def test_every_tool_has_an_op(mcp: McpDriver) -> None:
    assert set(mcp.schemas) == set(TOOL_OPS)


def fuzz(driver: McpDriver, tool: str, tools: dict[str, str]) -> None:
    """``EXAMPLES`` drawn arguments of ``tool`` (of ``tools``: tool → op) through ``driver``,
    each answer judged (``judge_tool``)."""

    @settings(max_examples=EXAMPLES, phases=(Phase.explicit, Phase.generate))
    @given(case=arguments(driver.schemas[tool], tools[tool]))
    def one(case: tuple[str, Any]) -> None:
        kind, args = case
        got = driver.run(call(driver.client, tool, args))
        if got[0] == "error":
            driver.reopen()  # whatever broke the session, the next case gets a fresh one
        problem = judge_tool(tool, kind, args, got, tools)
        assert problem is None, problem

    one()


@pytest.mark.parametrize("tool", sorted(TOOL_OPS))
def test_fuzz_tool(mcp: McpDriver, tool: str) -> None:
    fuzz(mcp, tool, TOOL_OPS)
    dead = mcp.run(alive(mcp.bus.nc))
    assert not dead, f"services stopped answering pings: {dead}"


def test_every_wap_tool_has_an_op(wap: McpDriver) -> None:
    assert set(wap.schemas) == set(WAP_TOOL_OPS)


@pytest.mark.parametrize("tool", sorted(WAP_TOOL_OPS))
def test_fuzz_wap_tool(wap: McpDriver, tool: str) -> None:
    """The same at ``/mcp/wap`` (WAP's camelCase tools and ``PERMISSION_DENIED``)."""
    fuzz(wap, tool, WAP_TOOL_OPS)


RAW_BODIES: dict[str, bytes] = {
    "invalid-utf8": b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file",'
    b'"arguments":{"path":"\xff\xfe"}}}',
    "deep-100k": b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file",'
    b'"arguments":{"path":' + b"[" * 100_000 + b"]" * 100_000 + b"}}}",
    "not-json": b'{"jsonrpc":"2.0",',
    "array": b"[]",
    "unknown-tool": b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"nope",'
    b'"arguments":{}}}',
    "lone-surrogate": b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":'
    b'"write_file","arguments":{"path":"\\udcff.txt","content":"\\ud800"}}}',
    "nul-path": b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file",'
    b'"arguments":{"path":"a\\u0000b"}}}',
}


@pytest.mark.parametrize("name", sorted(RAW_BODIES))
def test_raw_jsonrpc_bodies(mcp: McpDriver, name: str) -> None:
    """A malformed JSON-RPC body gets an answer (a JSON-RPC error or a 4xx), never a 500."""
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    response = httpx.post(
        mcp.up.http_url + "/mcp", content=RAW_BODIES[name], headers=headers, timeout=ANSWER_S
    )
    outcome = None
    if response.status_code >= 500:
        outcome = f"HTTP {response.status_code}"
    elif response.status_code == 200 and '"code":"INTERNAL"' in response.text.replace(" ", ""):
        outcome = "INTERNAL"
    if outcome is not None:
        failure = Failure("mcp", "http:/mcp", f"raw:{name}", outcome, response.text[:200])
        assert LEDGER.record(failure), failure.line()


def test_verify_after_mcp(mcp: McpDriver) -> None:
    failed = verify_all(mcp.up, {WORKSPACE})
    assert not failed, failed
    dead = mcp.run(alive(mcp.bus.nc))
    assert not dead, f"services stopped answering pings: {dead}"
