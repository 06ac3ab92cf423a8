"""The gateway's one error table (``services/gateway/errors.py``): a row for every error code
of ``contracts/errors.py``, and every door (REST, the console, WAP, MCP) answering each code
through it, so that no two doors disagree (the console once said 400 where REST said 404 for
``NOT_A_FILE`` and 409 for ``NOT_A_DIRECTORY``). docs/gateway.md's table says the same."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

import pytest
from starlette.requests import Request
from starlette.responses import Response

from contracts.errors import ErrorCode, QuillError
from services.gateway import errors
from services.gateway.access import ANONYMOUS, Access
from services.gateway.console import Console
from services.gateway.mcp import endpoints, wap
from services.gateway.mcp.engine import Failure
from services.gateway.rest.edge import error_response

CODES = list(ErrorCode)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"


def failing(code: str) -> QuillError:
    """An error of ``code`` whose message every door shows as it is (MCP words a workspace the
    caller may not reach its own way: as this message)."""
    return QuillError(code, "Workspace not found: w", {"workspace": "w"})


def test_every_code_has_one_row() -> None:
    assert set(errors.TABLE) == {str(c) for c in ErrorCode}
    assert errors.row("SOME_NEWER_CODE") == errors.TABLE[ErrorCode.INTERNAL]


@pytest.mark.parametrize("code", CODES)
def test_rest_answers_each_code_by_the_table(code: ErrorCode) -> None:
    row = errors.TABLE[code]
    response = error_response(failing(code))
    assert response.status_code == row.status
    assert json.loads(bytes(response.body))["error"] == row.name


async def console_status(code: str) -> int:
    """The status of the console's error page for a page that failed with ``code``."""
    console = Console(cast(Access, None), None, 1.0)

    async def page(c: Console, request: Request) -> Response:
        raise failing(code)

    scope: dict[str, Any] = {
        "type": "http",
        "method": "GET",
        "path": "/ui/",
        "headers": [(b"host", b"127.0.0.1")],
        "query_string": b"",
        "path_params": {},
        "state": {"principal": ANONYMOUS},
    }
    response = await console.guarded(page)(Request(scope))
    return response.status_code


@pytest.mark.parametrize("code", CODES)
async def test_the_console_answers_each_code_as_rest_does(code: ErrorCode) -> None:
    status = await console_status(code)
    assert status == errors.TABLE[code].status == error_response(failing(code)).status_code


@pytest.mark.parametrize("code", CODES)
def test_wap_names_each_code_by_the_table(code: ErrorCode) -> None:
    result = wap.render(Failure("readFile", failing(code), None, "w"))
    assert result.is_error and result.structured_content is not None
    assert result.structured_content["code"] == (errors.TABLE[code].wap or str(code))
    assert json.loads(result.content[0].text)["code"] == result.structured_content["code"]  # type: ignore[union-attr]


@pytest.mark.parametrize("code", CODES)
def test_mcp_words_each_code_by_the_table(code: ErrorCode) -> None:
    """``read_file`` has no words of its own: each code reads as its row says (or, without a
    text there, ``Error: <message>``)."""
    error = failing(code)
    result = endpoints.render(Failure("read_file", error, "a/b.txt", "w"))
    template = errors.TABLE[code].text or "Error: {message}"
    expected = template.format(path="a/b.txt", message=error.message, workspace="w")
    assert result.is_error
    assert result.content[0].text == expected  # type: ignore[union-attr]
    assert result.structured_content is not None
    assert result.structured_content["code"] == str(code)


def test_the_docs_table_is_the_table() -> None:
    """docs/gateway.md's REST table names every code once, with its row's status and name."""
    text = DOCS.read_text()
    start = text.index("| code | status | `error` |")
    documented: dict[str, tuple[int, str]] = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        codes, status, name = (cell.strip() for cell in line.strip("|").split("|")[:3])
        for code in re.findall(r"`([A-Z_]+)`", codes):
            documented[code] = (int(status), re.findall(r"`([a-z_]+)`", name)[0])
    assert documented == {str(c): (r.status, r.name) for c, r in errors.TABLE.items()}
