"""Driving the gateway's MCP endpoints with the official MCP client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent


@asynccontextmanager
async def mcp_client(
    base: str, path: str = "/mcp", token: str | None = None, **options: Any
) -> AsyncIterator[Client]:
    """An MCP client session on ``base + path`` (with ``Authorization: Bearer token``);
    ``options`` go to ``Client`` (``elicitation_callback=``, ``mode=``...)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        transport = streamable_http_client(base + path, http_client=http)
        async with Client(transport, **options) as client:
            yield client


def text(result: CallToolResult) -> str:
    """The tool result's single text block."""
    assert len(result.content) == 1, result.content
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def call(client: Client, tool: str, **arguments: Any) -> CallToolResult:
    return await client.call_tool(tool, arguments)


async def ok(client: Client, tool: str, **arguments: Any) -> str:
    """Call ``tool``, insist it succeeded, return its text."""
    result = await call(client, tool, **arguments)
    assert not result.is_error, text(result)
    return text(result)


async def error(client: Client, tool: str, **arguments: Any) -> str:
    """Call ``tool``, insist it failed as a tool result, return its text."""
    result = await call(client, tool, **arguments)
    assert result.is_error, text(result)
    return text(result)


async def wap(client: Client, tool: str, **arguments: Any) -> tuple[bool, Any]:
    """Call a WAP tool: (is_error, its JSON), checking text and structuredContent agree."""
    result = await call(client, tool, **arguments)
    data = json.loads(text(result))
    assert data == result.structured_content
    return result.is_error, data
