"""MCP ``read_file`` as a model reads it: windows anchored where asked, line ranges and numbers,
long lines in parts, and every cut stated in the text with the numbers and the call that reads
the rest."""

from __future__ import annotations

import re
from typing import Any

from mcp import Client

from contracts.limits import LimitsPatch
from quill.client import Quill
from services.gateway.server import Gateway
from tests.gateway.support import (
    agents_page_calls,
    assert_names_missing,
    call,
    mcp_client,
    model_view,
)

LINES = "".join(f"line {i}\n" for i in range(1, 5001))  # 5,000 lines, 48,893 bytes
SIZE = len(LINES)
WAY_ON = re.compile(r"call read_file again with (offset=\d+ limit=\d+(?: char_offset=\d+)?)\]$")


async def view(mcp: Client, **arguments: Any) -> str:
    """The text a model reads for ``read_file(**arguments)``, which must succeed."""
    result = await call(mcp, "read_file", **arguments)
    assert not result.is_error, model_view(result)
    return model_view(result)


def body(text: str) -> str:
    """The file's text in a view: without the ``[truncated: ...]`` note."""
    return text.split("\n\n[truncated: ")[0]


def next_call(text: str) -> dict[str, int]:
    """The read_file arguments the note of ``text`` says to call with."""
    found = WAY_ON.search(text)
    assert found, f"no way on in:\n{text[-400:]}"
    return {k: int(v) for k, v in (pair.split("=") for pair in found.group(1).split())}


async def test_tail_keeps_the_last_lines_and_says_what_it_left_out(
    gateway: Gateway, sdk: Quill
) -> None:
    await sdk.workspace("default/default").write("big.log", LINES)
    async with mcp_client(gateway.url) as mcp:
        tail = await view(mcp, path="big.log", tail=3000)
        assert body(tail).startswith("line 3001\n") and body(tail).endswith("line 5000\n")
        assert_names_missing(
            tail,
            "2000 of 5000 lines shown",
            f"the file has {SIZE} bytes",
            "showing lines 3001-5000",
            "at most 2000 lines",
            "Not shown: lines 2001-3000",
            way_on="call read_file again with offset=2001 limit=1000]",
        )
        before = await view(mcp, path="big.log", **next_call(tail))
        assert before == "".join(f"line {i}\n" for i in range(2001, 3001))  # whole: no note
        head = await view(mcp, path="big.log", head=4000)
        assert body(head) == "".join(f"line {i}\n" for i in range(1, 2001))
        assert_names_missing(
            head,
            "2000 of 5000 lines shown",
            "showing lines 1-2000",
            "Not shown: lines 2001-4000",
            way_on="call read_file again with offset=2001 limit=2000]",
        )
        small = await view(mcp, path="big.log", tail=3)
        assert small == "line 4998\nline 4999\nline 5000\n"


async def test_a_whole_file_reads_page_by_page_as_the_notes_say(
    gateway: Gateway, sdk: Quill
) -> None:
    await sdk.workspace("default/default").write("big.log", LINES)
    async with mcp_client(gateway.url) as mcp:
        first = await view(mcp, path="big.log")
        assert_names_missing(
            first,
            "showing lines 1-2000",
            "Not shown: lines 2001-5000",
            way_on="to read them, call read_file again with offset=2001 limit=3000]",
        )
        pages, text = [body(first)], first
        while "[truncated: " in text:
            text = await view(mcp, path="big.log", **next_call(text))
            pages.append(body(text))
        assert len(pages) == 3 and "".join(pages) == LINES


async def test_line_ranges_and_line_numbers(gateway: Gateway, sdk: Quill) -> None:
    await sdk.workspace("default/default").write("big.log", LINES)
    async with mcp_client(gateway.url) as mcp:
        part = await view(mcp, path="big.log", offset=2001, limit=2000)
        assert part == "".join(f"line {i}\n" for i in range(2001, 4001))
        numbered = await view(mcp, path="big.log", offset=100, limit=3, line_numbers=True)
        assert numbered == "100: line 100\n101: line 101\n102: line 102\n"  # seed 002's form
        end = await view(mcp, path="big.log", offset=4999, line_numbers=True)
        assert end == "4999: line 4999\n5000: line 5000\n"
        past = await view(mcp, path="big.log", offset=6000)
        assert past == "[no lines in this range: the file has 5000 lines]"
        both = await call(mcp, "read_file", path="big.log", tail=5, offset=10)
        assert both.is_error
        assert model_view(both) == "Error: head/tail cannot be combined with offset/limit"
        listed = {t.name: t for t in (await mcp.list_tools()).tools}
        properties = listed["read_file"].input_schema["properties"]
        for name in ("head", "tail", "offset", "limit", "line_numbers", "char_offset"):
            assert "anyOf" not in properties[name], properties[name]  # plain: one type
            assert properties[name]["type"] in ("integer", "boolean"), name
            assert "default" in properties[name], name


async def test_the_byte_limit_keeps_a_tails_end(gateway: Gateway, sdk: Quill) -> None:
    small = sdk.workspace("default/small")
    await small.create(limits=LimitsPatch(max_read_bytes=1000))
    await small.write("big.log", LINES)  # lines 1000-5000 are 10 bytes each
    async with mcp_client(gateway.url) as mcp:
        tail = await view(mcp, path="big.log", tail=500, workspace="small")
        assert body(tail) == "".join(f"line {i}\n" for i in range(4901, 5001))
        assert_names_missing(
            tail,
            "100 of 5000 lines shown",
            "showing lines 4901-5000",
            "at most 1000 bytes",
            "Not shown: lines 4501-4900",
            way_on="to read them, call read_file again with offset=4501 limit=400]",
        )
        head = await view(mcp, path="big.log", offset=4001, limit=500, workspace="small")
        assert body(head) == "".join(f"line {i}\n" for i in range(4001, 4101))
        assert_names_missing(
            head,
            "showing lines 4001-4100",
            "Not shown: lines 4101-4500",
            way_on="to read them, call read_file again with offset=4101 limit=400]",
        )


async def test_a_line_longer_than_a_read_is_read_in_parts(gateway: Gateway, sdk: Quill) -> None:
    small = sdk.workspace("default/small")
    await small.create(limits=LimitsPatch(max_read_bytes=1000))
    long_line = "é" * 1200 + "x" * 300 + "\n"  # 1,501 characters (its newline too), 2,701 bytes
    await small.write("wide.txt", "first\n" + long_line + "last\n")
    async with mcp_client(gateway.url) as mcp:
        first = await view(mcp, path="wide.txt", workspace="small")
        assert body(first) == "first\n"
        assert_names_missing(first, "Not shown: lines 2-3", way_on="offset=2 limit=2]")
        text = await view(mcp, path="wide.txt", offset=2, limit=2, workspace="small")
        assert body(text) == "é" * 500
        assert_names_missing(
            text,
            "part of line 2 shown",
            "line 2 has 1501 characters",
            "showing characters 0-499 of it",
            "Not shown: characters 500-1500 of line 2, line 3",
            way_on="call read_file again with offset=2 limit=2 char_offset=500]",
        )
        parts = [body(text)]
        while "[truncated: " in text:
            text = await view(mcp, path="wide.txt", workspace="small", **next_call(text))
            parts.append(body(text))
        assert "".join(parts) == long_line + "last\n"
        await small.write("wide_end.txt", "first\n" + long_line)
        end = await view(mcp, path="wide_end.txt", tail=1, workspace="small")
        assert body(end) == "é" * 349 + "x" * 300 + "\n"  # a tail keeps the line's end
        assert_names_missing(
            end,
            "part of line 2 shown",
            "showing characters 851-1500 of it",
            "Not shown: characters 0-850 of line 2",
            way_on="to read them, call read_file again with offset=2 limit=1]",
        )
        past = await call(
            mcp, "read_file", path="wide.txt", offset=3, char_offset=9, workspace="small"
        )
        assert model_view(past) == ("Error: char_offset 9 is past the end of line 3 (5 characters)")


async def test_the_reads_in_the_agents_page_are_what_a_model_reads(
    gateway: Gateway, sdk: Quill
) -> None:
    """docs/agents.md "### Reads": each ``read_file(...)`` shown gives that text (``...`` and
    ``é...é`` stand for the lines between)."""
    calls = agents_page_calls("Reads", "read_file")
    assert len(calls) == 5
    small = sdk.workspace("default/small")
    await small.create(limits=LimitsPatch(max_read_bytes=1000))
    await small.write("wide.txt", "first\n" + "é" * 1200 + "x" * 300 + "\n" + "last\n")
    await sdk.workspace("default/default").write("big.log", LINES)
    async with mcp_client(gateway.url) as mcp:
        for call_text, arguments, expected in calls:
            if arguments["path"] == "wide.txt":
                arguments["workspace"] = "small"
            actual = await view(mcp, **arguments)
            expected = expected.strip("\n")
            head, _, tail = expected.partition("...")
            assert actual.startswith(head.removesuffix("éééé")), call_text
            assert actual.rstrip("\n").endswith(tail.removeprefix("é")), call_text
