"""REST (RFC 0059 §C) over real HTTP: CRUD, etags, versions, limits, path tricks, discovery."""

from __future__ import annotations

import re
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from contracts import requests as rq
from contracts.limits import LimitsPatch
from quill.client import Quill
from services.gateway.server import GatewayConfig, start_gateway
from tests.gateway.conftest import StartGateway
from tests.helpers import start_reader, start_writer

FILES = "/v1/host/workspace/files"
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


async def test_put_get_list_delete_round_trip(http: httpx.AsyncClient) -> None:
    created = await http.put(f"{FILES}/DIRECTIVES.md", json={"content": "# Be kind\n"})
    assert created.status_code == 200  # created or replaced: the API lists only 200
    assert created.headers["etag"] == '"v1"'
    body = created.json()
    assert STAMP.fullmatch(body.pop("updatedAt"))
    assert body == {
        "path": "DIRECTIVES.md",
        "content": "# Be kind\n",
        "contentType": "text/markdown",
        "version": 1,
        "etag": "v1",
    }
    replaced = await http.put(
        f"{FILES}/DIRECTIVES.md", json={"content": "# Be brief\n", "contentType": "text/markdown"}
    )
    assert (replaced.status_code, replaced.json()["version"]) == (200, 2)
    got = await http.get(f"{FILES}/DIRECTIVES.md")
    assert got.status_code == 200 and got.headers["etag"] == '"v2"'
    assert got.json()["content"] == "# Be brief\n"
    assert got.json()["updatedAt"] == replaced.json()["updatedAt"]
    await http.put(f"{FILES}/memory/index.json", json={"content": "{}"})
    listing = (await http.get(FILES)).json()
    assert set(listing) == {"files"}
    assert [f["path"] for f in listing["files"]] == ["DIRECTIVES.md", "memory/index.json"]
    first = listing["files"][0]
    assert set(first) == {"path", "contentType", "version", "etag", "updatedAt"}
    assert (first["version"], first["etag"]) == (2, "v2")
    deleted = await http.delete(f"{FILES}/DIRECTIVES.md")
    assert (deleted.status_code, deleted.content) == (204, b"")
    gone = await http.get(f"{FILES}/DIRECTIVES.md")
    assert (gone.status_code, gone.json()) == (404, {"error": "not_found"})
    assert (await http.delete(f"{FILES}/DIRECTIVES.md")).status_code == 404
    assert [f["path"] for f in (await http.get(FILES)).json()["files"]] == ["memory/index.json"]


async def test_if_match_quoted_or_not_and_conflicts(http: httpx.AsyncClient) -> None:
    await http.put(f"{FILES}/a.md", json={"content": "1"})
    quoted = await http.put(f"{FILES}/a.md", json={"content": "2"}, headers={"If-Match": '"v1"'})
    assert (quoted.status_code, quoted.json()["version"]) == (200, 2)
    bare = await http.put(f"{FILES}/a.md", json={"content": "3"}, headers={"If-Match": "v2"})
    assert (bare.status_code, bare.json()["version"]) == (200, 3)
    stale = await http.put(f"{FILES}/a.md", json={"content": "4"}, headers={"If-Match": '"v1"'})
    assert stale.status_code == 409
    assert stale.json()["error"] == "workspace_conflict"
    assert stale.json()["details"] == {"currentVersion": 3}
    refused = await http.delete(f"{FILES}/a.md", headers={"If-Match": '"v2"'})
    assert refused.status_code == 409 and refused.json()["details"] == {"currentVersion": 3}
    assert (await http.get(f"{FILES}/a.md")).json()["content"] == "3"
    assert (await http.delete(f"{FILES}/a.md", headers={"If-Match": '"v3"'})).status_code == 204


async def test_version_query_returns_history(http: httpx.AsyncClient) -> None:
    for text in ("first", "second", "third"):
        await http.put(f"{FILES}/notes.txt", json={"content": text})
    old = await http.get(f"{FILES}/notes.txt", params={"version": 1})
    assert old.status_code == 200 and old.headers["etag"] == '"v1"'
    assert (old.json()["content"], old.json()["version"]) == ("first", 1)
    assert (await http.get(f"{FILES}/notes.txt", params={"version": 2})).json()["content"] == (
        "second"
    )
    await http.delete(f"{FILES}/notes.txt")
    kept = await http.get(f"{FILES}/notes.txt", params={"version": 3})
    assert kept.json()["content"] == "third"  # history outlives a delete
    missing = await http.get(f"{FILES}/notes.txt", params={"version": 9})
    assert (missing.status_code, missing.json()) == (404, {"error": "not_found"})
    for bad in ("0", "abc", "-1", "9" * 5000, "\u0663"):
        wrong = await http.get(f"{FILES}/notes.txt", params={"version": bad})
        assert (wrong.status_code, wrong.json()["error"]) == (400, "invalid_argument")


async def test_big_files_are_read_whole(http: httpx.AsyncClient) -> None:
    content = "".join(f"line {i:05}\n" for i in range(30_000))  # 330 KB, past the read limits
    assert (await http.put(f"{FILES}/big.log", json={"content": content})).status_code == 200
    await http.put(f"{FILES}/big.log", json={"content": "small"})
    assert (await http.get(f"{FILES}/big.log", params={"version": 1})).json()["content"] == content
    await http.put(f"{FILES}/big.log", json={"content": content + "end\n"})
    latest = (await http.get(f"{FILES}/big.log")).json()
    assert latest["content"] == content + "end\n" and latest["version"] == 3


async def test_over_max_file_bytes_is_413(nats_url: str, start: StartGateway) -> None:
    quill = await Quill.connect(nats_url)
    try:
        small = quill.workspace("acme/small")
        await small.create(limits=LimitsPatch(max_file_bytes=1024))
    finally:
        await quill.close()
    gateway = await start({"token-small-1": "acme/small"})
    auth = {"Authorization": "Bearer token-small-1"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=auth) as http:
        fits = await http.put(f"{FILES}/a.txt", json={"content": "x" * 1024})
        assert fits.status_code == 200
        big = await http.put(f"{FILES}/a.txt", json={"content": "x" * 1025})
        assert big.status_code == 413 and big.json()["error"] == "workspace_too_large"
        assert (await http.get(f"{FILES}/a.txt")).json()["version"] == 1
        discovery = (await http.get("/.well-known/openwop")).json()
        assert discovery["workspace"]["maxFileBytes"] == 1024  # the caller's own workspace
        assert discovery["capabilities"]["workspace"] == discovery["workspace"]
    async with httpx.AsyncClient(base_url=gateway.url) as anonymous:
        public = (await anonymous.get("/.well-known/openwop")).json()
        assert public["workspace"]["maxFileBytes"] == 4 * 1024 * 1024  # what a new one gets


async def test_bad_bodies_and_non_files(http: httpx.AsyncClient, sdk: Quill) -> None:
    await sdk.workspace("default/default").write("bin.dat", b"\x00\xff")
    bodies = [
        b"not json",
        b'{"contents": "typo"}',
        b'{"content": 3}',
        b"[]",
        b'{"content": "lone \\ud800 surrogate"}',
    ]
    for raw in bodies:
        reply = await http.put(f"{FILES}/x.txt", content=raw)
        assert (reply.status_code, reply.json()["error"]) == (400, "invalid_argument"), raw
    await http.put(f"{FILES}/dir/inner.txt", json={"content": "x"})
    assert (await http.get(f"{FILES}/dir")).json() == {"error": "not_found"}
    assert (await http.delete(f"{FILES}/dir")).status_code == 404
    under_file = await http.put(f"{FILES}/dir/inner.txt/deeper.txt", json={"content": "x"})
    assert (under_file.status_code, under_file.json()["error"]) == (409, "path_conflict")
    binary = await http.get(f"{FILES}/bin.dat")
    assert (binary.status_code, binary.json()["error"]) == (422, "invalid_encoding")


TRICKS = [
    ("%2e%2e/%2e%2e/etc/passwd", 403, "access_denied"),
    ("..%2f..%2fetc%2fpasswd", 403, "access_denied"),
    ("/etc/passwd", 403, "access_denied"),
    ("/workspace/secret.txt", 400, "invalid_argument"),
    ("a/%2E%2E/secret.txt", 400, "invalid_argument"),
    ("%2e/secret.txt", 400, "invalid_argument"),
    ("a//secret.txt", 400, "invalid_argument"),
    ("secret%00.txt", 400, "invalid_argument"),
    ("secret%0a.txt", 400, "invalid_argument"),
    ("x" * 300, 400, "invalid_argument"),
    ("/".join(["d" * 200] * 6), 400, "invalid_argument"),
    ("cafe%CC%81.md", 400, "invalid_argument"),  # NFD: not the normal form
    ("evil%E2%80%AEtxt.md", 400, "invalid_argument"),  # right-to-left override
    ("zero%E2%80%8Bwidth.md", 400, "invalid_argument"),
]


@pytest.mark.parametrize(("raw", "status", "name"), TRICKS)
async def test_path_tricks_are_refused_cleanly(
    http: httpx.AsyncClient, raw: str, status: int, name: str
) -> None:
    for method in ("GET", "PUT", "DELETE"):
        body = b'{"content": "pwned"}' if method == "PUT" else None
        reply = await http.request(method, f"{FILES}/{raw}", content=body)
        assert (reply.status_code, reply.json()["error"]) == (status, name), method
    assert (await http.get(FILES)).json()["files"] == []  # nothing was written anywhere


async def test_unicode_names_in_normal_form_work(http: httpx.AsyncClient) -> None:
    put = await http.put(f"{FILES}/caf%C3%A9/r%C3%A9sum%C3%A9.md", json={"content": "ok"})
    assert put.status_code == 200 and put.json()["path"] == "café/résumé.md"
    assert (await http.get(f"{FILES}/café/résumé.md")).json()["content"] == "ok"
    assert [f["path"] for f in (await http.get(FILES)).json()["files"]] == ["café/résumé.md"]


async def test_list_filters_by_prefix(http: httpx.AsyncClient) -> None:
    for path in ("notes/a.md", "notes/ab.md", "notes/b.md", "nodes.md", "x/node_modules/m.js"):
        await http.put(f"{FILES}/{path}", json={"content": path})

    async def paths(prefix: str) -> list[str]:
        reply = await http.get(FILES, params={"prefix": prefix})
        assert reply.status_code == 200
        return [f["path"] for f in reply.json()["files"]]

    assert await paths("notes/") == ["notes/a.md", "notes/ab.md", "notes/b.md"]
    assert await paths("notes/a") == ["notes/a.md", "notes/ab.md"]
    assert await paths("no") == ["nodes.md", "notes/a.md", "notes/ab.md", "notes/b.md"]
    assert await paths("missing/dir/") == []
    assert "x/node_modules/m.js" in await paths("")  # a file store lists every file
    assert "content" not in (await http.get(FILES)).json()["files"][0]


async def test_list_pages_through_every_file(http: httpx.AsyncClient, sdk: Quill) -> None:
    # More files than a search returns (100) or a page of the bus holds (500).
    ws = sdk.workspace("default/default")
    names = [f"logs/{i:04}.txt" for i in range(1200)] + ["notes/zz.md", "top.md"]
    await ws.apply([rq.PutChange(path=p, content="x") for p in names])

    whole = await http.get(FILES)  # a client that does not ask for pages gets every file
    assert "link" not in whole.headers
    assert [f["path"] for f in whole.json()["files"]] == sorted(names)

    first = await http.get(FILES, params={"limit": "1000"})
    assert set(first.json()) == {"files"} and len(first.json()["files"]) == 1000
    link = first.headers["link"]
    assert link.endswith('>; rel="next"') and "after=logs%2F0999.txt" in link
    rest = await http.get(link[1 : link.index(">")])
    assert "link" not in rest.headers
    assert [f["path"] for f in first.json()["files"] + rest.json()["files"]] == sorted(names)

    paged: list[str] = []
    url: str | None = f"{FILES}?prefix=logs/01&limit=30"
    while url is not None:
        page = await http.get(url)
        paged += [f["path"] for f in page.json()["files"]]
        next_link = page.headers.get("link")
        url = None if next_link is None else next_link[1 : next_link.index(">")]
    assert paged == [f"logs/{i:04}.txt" for i in range(100, 200)]

    for bad in ("0", "10001", "ten", "9" * 5000, "-1", "1.5", "\u0663"):
        reply = await http.get(FILES, params={"limit": bad})
        assert reply.status_code == 400, bad
        assert reply.json()["error"] == "invalid_argument"
    escape = await http.get(FILES, params={"after": "../x"})
    assert escape.status_code == 403


async def test_discovery_and_openapi(http: httpx.AsyncClient) -> None:
    discovery = (await http.get("/.well-known/openwop")).json()
    family = {
        "supported": True,
        "versioned": True,
        "maxFileBytes": 4 * 1024 * 1024,
        "maxFiles": 100_000,
    }  # no maxVersions: every version is kept
    assert discovery["workspace"] == discovery["capabilities"]["workspace"] == family
    spec = (await http.get("/openapi.json")).json()
    assert spec["openapi"] == "3.1.0"
    assert set(spec["paths"]["/v1/host/workspace/files/{path}"]) >= {"get", "put", "delete"}
    assert "get" in spec["paths"]["/v1/host/workspace/files"]
    assert spec["paths"]["/.well-known/openwop"]["get"]["security"] == []
    put = spec["paths"]["/v1/host/workspace/files/{path}"]["put"]
    assert {"200", "409", "413"} <= set(put["responses"]) and "201" not in put["responses"]


async def test_no_reader_is_503_and_the_write_still_lands(nats_url: str, tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "writer")  # and no reader at all
        gateway = await start_gateway(GatewayConfig(nats_url, port=0))
        stack.push_async_callback(gateway.stop)
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
            reply = await http.get(f"{FILES}/a.txt")
            assert reply.status_code == 503
            assert reply.json() == {"error": "unavailable", "message": "No Quill reader is running"}
            health = await http.get("/health")
            assert health.status_code == 200  # the gateway itself is fine
            put = await http.put(f"{FILES}/a.txt", json={"content": "kept"})
            assert (put.status_code, put.json()["version"]) == (200, 1)  # committed: not a 503
        await start_reader(stack, nats_url, tmp_path / "reader")
        async with httpx.AsyncClient(base_url=gateway.url) as http:
            got = (await http.get(f"{FILES}/a.txt")).json()
            assert got["content"] == "kept"
            assert got["updatedAt"] == put.json()["updatedAt"]  # the commit time, from the writer


async def test_a_weak_if_match_never_matches(http: httpx.AsyncClient) -> None:
    # RFC 9110 §13.1.1: If-Match uses the strong comparison, so a weak etag never matches.
    await http.put(f"{FILES}/a.md", json={"content": "1"})
    for weak in ('W/"v1"', "W/v1", 'W/"v1", W/"v2"'):
        put = await http.put(f"{FILES}/a.md", json={"content": "2"}, headers={"If-Match": weak})
        assert (put.status_code, put.json()["error"]) == (412, "precondition_failed"), weak
        gone = await http.delete(f"{FILES}/a.md", headers={"If-Match": weak})
        assert gone.status_code == 412, weak
    assert (await http.get(f"{FILES}/a.md")).json()["version"] == 1
    listed = await http.put(
        f"{FILES}/a.md", json={"content": "2"}, headers={"If-Match": 'W/"v1", "v0", "v1"'}
    )
    assert (listed.status_code, listed.json()["version"]) == (200, 2)  # the strong "v1" matches
    stale = await http.put(
        f"{FILES}/a.md", json={"content": "3"}, headers={"If-Match": '"v0", "v1"'}
    )
    assert (stale.status_code, stale.json()["details"]) == (409, {"currentVersion": 2})
    bad = await http.put(f"{FILES}/a.md", json={"content": "3"}, headers={"If-Match": '"v2'})
    assert (bad.status_code, bad.json()["error"]) == (400, "invalid_argument")


async def test_head_answers_like_get_without_a_body(http: httpx.AsyncClient) -> None:
    await http.put(f"{FILES}/notes/a.md", json={"content": "hello\n"})
    got = await http.get(f"{FILES}/notes/a.md")
    head = await http.head(f"{FILES}/notes/a.md")
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["etag"] == got.headers["etag"] == '"v1"'
    assert int(head.headers["content-length"]) == len(got.content)
    assert head.headers["content-type"] == got.headers["content-type"]
    old = await http.head(f"{FILES}/notes/a.md", params={"version": 1})
    assert old.status_code == 200 and old.headers["etag"] == '"v1"'
    listing = await http.head(FILES)
    assert (listing.status_code, listing.content) == (200, b"")
    missing = await http.head(f"{FILES}/nope.md")
    assert (missing.status_code, missing.content) == (404, b"")
    escape = await http.head(f"{FILES}/%2e%2e/x")
    assert escape.status_code == 403


async def test_a_deeply_nested_body_is_400(http: httpx.AsyncClient) -> None:
    for deep in (b"[" * 100_000 + b"]" * 100_000, b'{"content": ' + b"[" * 100_000):
        reply = await http.put(f"{FILES}/x.txt", content=deep)
        assert (reply.status_code, reply.json()["error"]) == (400, "invalid_argument")
        assert "nested" in reply.json()["message"] or "JSON" in reply.json()["message"]
    assert (await http.get(FILES)).json()["files"] == []


async def test_what_is_served_matches_openapi_json(http: httpx.AsyncClient) -> None:
    spec = (await http.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]

    def inline(node: Any) -> Any:  # the document's own $refs, resolved in place
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                return inline(schemas[ref.removeprefix("#/components/schemas/")])
            return {key: inline(value) for key, value in node.items()}
        return [inline(item) for item in node] if isinstance(node, list) else node

    def check(instance: object, schema: dict[str, object]) -> None:
        jsonschema.Draft202012Validator(inline(schema)).validate(instance)

    paths = spec["paths"]
    put = await http.put(f"{FILES}/notes/a.md", json={"content": "x"})
    file_ops = paths["/v1/host/workspace/files/{path}"]
    check(
        put.json(),
        file_ops["put"]["responses"][str(put.status_code)]["content"]["application/json"]["schema"],
    )
    got = await http.get(f"{FILES}/notes/a.md")
    check(got.json(), file_ops["get"]["responses"]["200"]["content"]["application/json"]["schema"])
    for params in ({}, {"limit": "1"}, {"prefix": "notes/"}):
        listed = await http.get(FILES, params=params)
        schema = paths[FILES]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        check(listed.json(), schema)
    created = await http.post("/v1/runs", json={"workflowId": "nightly"})
    runs = paths["/v1/runs"]["post"]["responses"]
    check(created.json(), runs[str(created.status_code)]["content"]["application/json"]["schema"])
    snap = await http.get(f"/v1/runs/{created.json()['runId']}")
    schema = paths["/v1/runs/{runId}"]["get"]["responses"]["200"]["content"]["application/json"]
    check(snap.json(), schema["schema"])
    ended = await http.post(f"/v1/runs/{created.json()['runId']}/cancel")
    schema = paths["/v1/runs/{runId}/cancel"]["post"]["responses"]["200"]["content"]
    check(ended.json(), schema["application/json"]["schema"])
    discovery = await http.get("/.well-known/openwop")
    schema = paths["/.well-known/openwop"]["get"]["responses"]["200"]["content"]
    check(discovery.json(), schema["application/json"]["schema"])
    missing = await http.get(f"{FILES}/nope.md")
    check(missing.json(), spec["components"]["schemas"]["Error"])
