"""The REST API (RFC 0059 §C) through httpx: methods, hostile paths, query parameters,
``If-Match`` values and bodies, valid (from the published OpenAPI document's schemas) and
mutated; each request gets an answer within 5 s with a status ``/openapi.json`` documents for
that operation (never a 500), errors as JSON ``{"error": ...}``, HEAD as GET."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from tests.contract.conftest import (
    ANSWER_S,
    LEDGER,
    Failure,
    alive,
    connect,
    examples,
    seed,
    verify_all,
)
from tests.contract.strategies import HOSTILE_PATHS, SEEDED_DIRS, SEEDED_FILES, from_schema
from tests.up import Up

EXAMPLES = examples(150)
WORKSPACE = "default/default"
FILES = "/v1/host/workspace/files"


@dataclass(frozen=True, repr=False)
class Request:
    kind: str
    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None

    def show(self) -> str:
        body = "" if self.content is None else self.content[:200].decode("utf-8", "replace")
        more = "..." if self.content and len(self.content) > 200 else ""
        return f"{self.method} {self.url[:200]} {self.headers} {body}{more}"

    def __repr__(self) -> str:  # Hypothesis prints it: keep 5 MB bodies out
        return f"Request({self.show()!r})"


class Rest:
    def __init__(self, up: Up) -> None:
        self.up = up
        self.http = httpx.Client(base_url=up.http_url, timeout=ANSWER_S)
        self.openapi: dict[str, Any] = self.http.get("/openapi.json").json()

        async def prepare() -> None:
            bus = await connect(up)
            try:
                await seed(bus.nc, *WORKSPACE.split("/"))
            finally:
                await bus.close()

        asyncio.run(prepare())

    def documented(self, template: str, method: str) -> set[int]:
        responses = self.openapi["paths"][template][method.lower()]["responses"]
        return {int(code) for code in responses if code.isdecimal()}

    def put_schema(self) -> dict[str, Any]:
        schema = self.openapi["components"]["schemas"]["WorkspaceFileWrite"]
        return {**schema, "$defs": {}}

    def alive(self) -> list[str]:
        async def ping() -> list[str]:
            bus = await connect(self.up)
            try:
                return await alive(bus.nc)
            finally:
                await bus.close()

        return asyncio.run(ping())


@pytest.fixture(scope="module")
def rest(up: Up) -> Iterator[Rest]:
    found = Rest(up)
    yield found
    found.http.close()


def url_path(raw: str) -> str:
    return quote(raw.encode("utf-8", "surrogatepass"), safe="/")


PATHS = st.one_of(
    st.sampled_from(SEEDED_FILES + SEEDED_DIRS + ("new.txt", "dir/new.md")).map(
        lambda p: ("path", p)
    ),
    st.sampled_from(sorted(HOSTILE_PATHS)).map(lambda n: (f"hostile-path:{n}", HOSTILE_PATHS[n])),
    st.text(max_size=12).map(lambda p: ("path:random", p)),
)
IF_MATCH = st.sampled_from(
    [None, None, None, '"v1"', "v1", 'W/"v1"', "*", '"v1", "v2"', "garbage,,", '"' + "9" * 300]
)
VERSION = st.sampled_from([None, None, "1", "2", "0", "-1", "abc", "99999999999999999999", "1.5"])
LIMIT = st.sampled_from([None, "1", "10000", "10001", "0", "-5", "x", "1" * 30])


@st.composite
def put_body(draw: st.DrawFn, schema: dict[str, Any]) -> tuple[str, bytes]:
    choice = draw(st.integers(0, 9))
    if choice < 5:
        return "valid", json.dumps(draw(from_schema(schema))).encode()
    return draw(
        st.sampled_from(
            [
                ("not-json", b"{nope"),
                ("empty", b""),
                ("array", b"[]"),
                ("wrong-type", b'{"content": 5}'),
                ("extra-field", b'{"content": "x", "bogus": 1}'),
                ("invalid-utf8", b'{"content": "\xff\xfe"}'),
                ("deep-100k", b'{"content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
                ("nul", b'{"content": "a\\u0000b"}'),
                ("lone-surrogate", b'{"content": "\\udcff"}'),
                ("too-big", b'{"content": "' + b"x" * (5 * 1024 * 1024) + b'"}'),
            ]
        )
    )


@st.composite
def requests(draw: st.DrawFn, schema: dict[str, Any]) -> Request:
    method = draw(st.sampled_from(["GET", "GET", "PUT", "PUT", "DELETE", "HEAD", "LIST"]))
    if method == "LIST":
        params = {
            k: v
            for k, v in (
                ("limit", draw(LIMIT)),
                ("prefix", draw(st.sampled_from([None, "dir", "", "\x00", "../"]))),
                ("after", draw(st.sampled_from([None, "a.txt", "zzz", "\udcff"]))),
            )
            if v is not None
        }
        query = "&".join(
            f"{k}={quote(v.encode('utf-8', 'surrogatepass'))}" for k, v in params.items()
        )
        return Request("list", "GET", FILES + ("?" + query if query else ""))
    kind, path = draw(PATHS)
    url = f"{FILES}/{url_path(path)}"
    headers: dict[str, str] = {}
    if method in ("PUT", "DELETE") and (tag := draw(IF_MATCH)) is not None:
        headers["If-Match"] = tag
        kind += f" if-match:{tag[:12]}"
    if method in ("GET", "HEAD") and (version := draw(VERSION)) is not None:
        url += f"?version={version}"
    content = None
    if method == "PUT":
        body_kind, content = draw(put_body(schema))
        kind += f" body:{body_kind}"
        headers["Content-Type"] = "application/json"
    return Request(kind, method, url, headers, content)


def template(request: Request) -> str:
    return FILES if request.kind == "list" else FILES + "/{path}"


def judge(rest: Rest, request: Request) -> str | None:
    try:
        response = rest.http.request(
            request.method, request.url, headers=request.headers, content=request.content
        )
    except httpx.TimeoutException:
        return f"no answer within {ANSWER_S:g} s"
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e}"
    status = response.status_code
    LEDGER.saw("rest", request.method, request.kind, str(status), request.show())
    method = "GET" if request.method == "HEAD" else request.method
    if status >= 500 and status != 503:
        return f"HTTP {status}"
    if status == 405 and response.url.path.rstrip("/") == FILES:
        return None  # the client made ".../files/." the collection, which has no PUT: HTTP's 405
    if status not in rest.documented(template(request), method):
        return f"undocumented status {status} for {method}"
    if request.method == "HEAD":
        get = rest.http.get(request.url)
        if get.status_code != status:
            return f"HEAD {status} but GET {get.status_code}"
        return None
    if status >= 400:
        try:
            if "error" not in response.json():
                return f"error body without 'error': {response.text[:100]}"
        except ValueError:
            return f"error body is not JSON: {response.text[:100]!r}"
    if 200 <= status < 300 and request.headers.get("If-Match", "").startswith("W/"):
        return f"weak If-Match satisfied a strong match ({status})"
    return None


def test_fuzz_rest(rest: Rest) -> None:
    @settings(max_examples=EXAMPLES, phases=(Phase.explicit, Phase.generate))
    @given(request=requests(rest.put_schema()))
    def one(request: Request) -> None:
        outcome = judge(rest, request)
        if outcome is not None:
            failure = Failure("rest", request.method, request.kind, outcome, request.show())
            assert LEDGER.record(failure), failure.line()

    one()
    assert not rest.alive()


def test_verify_after_rest(rest: Rest) -> None:
    failed = verify_all(rest.up, {WORKSPACE})
    assert not failed, failed
    assert not rest.alive()
