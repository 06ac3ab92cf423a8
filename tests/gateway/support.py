"""Driving the gateway's MCP endpoints with the official MCP client."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
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


async def refused(client: Client, tool: str, **arguments: Any) -> tuple[str, str]:
    """Call ``tool``, insist it failed as a tool result: its error code and its text."""
    result = await call(client, tool, **arguments)
    assert result.is_error, text(result)
    data: Any = result.structured_content
    return str(data["code"]), text(result)


async def wap(client: Client, tool: str, **arguments: Any) -> tuple[bool, Any]:
    """Call a WAP tool: (is_error, its JSON), checking text and structuredContent agree."""
    result = await call(client, tool, **arguments)
    data = json.loads(text(result))
    assert data == result.structured_content
    return result.is_error, data


def model_view(result: CallToolResult) -> str:
    """The tool result as a model reads it: its text blocks in order, ``Error:``-led when the
    tool failed. A model acts on this text: ``structuredContent`` is for programs, and what
    only it says the model does not know."""
    texts = [block.text for block in result.content if isinstance(block, TextContent)]
    view = "\n".join(texts)
    if result.is_error:
        assert view.startswith("Error"), view
    return view


def assert_names_missing(view: str, *facts: str, way_on: str) -> None:
    """A partial result, as the model reads it, names what is missing (each of ``facts``,
    e.g. ``"5000 lines"``, ``"lines 2001-4000"``) and how to get the rest (``way_on``: the
    parameter or tool to call again with)."""
    missing = [fact for fact in facts if fact not in view]
    assert not missing, f"the model is not told {missing}:\n{view}"
    assert way_on in view, f"the model is not told how to get the rest ({way_on!r}):\n{view}"


def agents_page_calls(section: str, tool: str) -> list[tuple[str, dict[str, Any], str]]:
    """The calls of ``tool`` that docs/agents.md shows under ``### section``, in its ``text``
    blocks: each as written (``tool(...)`` on a line of its own), its arguments, and the text
    shown after it (what a model must read for it)."""
    page = (Path(__file__).parents[2] / "docs" / "agents.md").read_text()
    part = page.split(f"### {section}", 1)[1].split("\n### ", 1)[0]
    shown = re.findall(r"```text\n(.*?)```", part, re.S)
    calls = re.split(rf"^({tool}\(.*\))$", "".join(shown), flags=re.M)[1:]
    return [
        (text, eval(text, {tool: dict, "true": True}), expected)  # noqa: S307
        for text, expected in zip(calls[::2], calls[1::2], strict=True)
    ]
