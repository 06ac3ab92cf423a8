"""openwop's workspace surface as its published text reads, one test per normative sentence.

Each test quotes the sentence it checks: from ``spec/v1/agent-workspace.md`` (RFC 0059),
``spec/v1/capabilities.md`` §"Document-root layout" (RFC 0073) or ``api/openapi.yaml``. Written
from the text, not from openwop's conformance suite; every request goes to a real gateway over
real HTTP, on a real nats-server, with two tenants' tokens. Where Quill departs from a sentence
the test says so and docs/gateway.md ("REST (openwop RFC 0059)") says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from contracts import codec
from contracts import requests as rq
from contracts.events import WorkspaceUpdated
from contracts.limits import LimitsPatch
from quill.client import Quill
from services.gateway.rest.openapi import document
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway

FILES = "/v1/host/workspace/files"
OWNER, STRANGER = "owner-token-1", "stranger-token-1"
TOKENS = {OWNER: "acme/agents", STRANGER: "other/agents"}
FILE_FIELDS = {"path", "content", "contentType", "version", "etag", "updatedAt"}
"""workspace-file.schema.json's properties (``additionalProperties: false``)."""
FAMILY_FIELDS = {"supported", "versioned", "maxFileBytes", "maxFiles", "maxVersions"}


@pytest_asyncio.fixture
async def host(start: StartGateway) -> Gateway:
    return await start(TOKENS)


def client(gateway: Gateway, token: str | None) -> httpx.AsyncClient:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=30)


@pytest_asyncio.fixture
async def owner(host: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with client(host, OWNER) as http:
        yield http


@pytest_asyncio.fixture
async def stranger(host: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with client(host, STRANGER) as http:
        yield http


@pytest_asyncio.fixture
async def anonymous(host: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with client(host, None) as http:
        yield http


async def put(http: httpx.AsyncClient, path: str, content: str, **headers: str) -> httpx.Response:
    return await http.put(f"{FILES}/{path}", json={"content": content}, headers=headers)


async def start_run(http: httpx.AsyncClient, workflow: str = "nightly") -> str:
    created = await http.post("/v1/runs", json={"workflowId": workflow})
    assert created.status_code == 201, created.text
    run: str = created.json()["runId"]
    return run


# ---------------------------------------------------------------- discovery (RFC 0073)


async def test_families_are_document_root_properties(anonymous: httpx.AsyncClient) -> None:
    """capabilities.md §"Document-root layout": "Every capability family [...] MUST appear as
    a property of the document root of the GET /.well-known/openwop response. A host MUST NOT
    require a capabilities wrapper object to convey them." """
    doc = (await anonymous.get("/.well-known/openwop")).json()
    assert doc["workspace"]["supported"] is True
    for required in ("protocolVersion", "supportedEnvelopes", "schemaVersions", "limits"):
        assert required in doc, required  # capabilities.schema.json's required families
    assert isinstance(doc["protocolVersion"], str) and doc["protocolVersion"]
    assert isinstance(doc["supportedEnvelopes"], list)
    assert isinstance(doc["schemaVersions"], dict)
    limits = doc["limits"]
    assert {"clarificationRounds", "schemaRounds", "envelopesPerTurn"} <= set(limits)
    assert set(limits) <= {
        "clarificationRounds",
        "schemaRounds",
        "envelopesPerTurn",
        "maxNodeExecutions",
        "maxRunDurationMs",
        "maxLoopIterations",
        "maxBudgetTokens",
        "maxBudgetCostUsd",
        "maxRequestBodyBytes",
    }  # the schema's limits object is closed


async def test_the_wrapper_is_only_a_mirror(anonymous: httpx.AsyncClient) -> None:
    """capabilities.md §"Document-root layout": "Through the v1.x migration window hosts MAY
    additionally mirror families under a capabilities object for backward compatibility." """
    doc = (await anonymous.get("/.well-known/openwop")).json()
    assert doc["capabilities"] == {"workspace": doc["workspace"]}


async def test_discovery_needs_no_credential(anonymous: httpx.AsyncClient) -> None:
    """openapi.yaml, getCapabilities: "security: []" (tag discovery: "Public capability +
    spec discovery (no auth required).")"""
    reply = await anonymous.get("/.well-known/openwop")
    assert reply.status_code == 200
    assert reply.headers["cache-control"].startswith("public")
    spec = document()["paths"]["/.well-known/openwop"]["get"]
    assert spec["security"] == []


async def test_the_workspace_block_has_the_schema_shape(anonymous: httpx.AsyncClient) -> None:
    """agent-workspace.md §"Capability advertisement": "supported is the only REQUIRED field"
    (capabilities.schema.json's workspace block: additionalProperties false, maxFileBytes and
    maxFiles at least 1)."""
    block = (await anonymous.get("/.well-known/openwop")).json()["workspace"]
    assert set(block) <= FAMILY_FIELDS
    assert block["supported"] is True and block["versioned"] is True
    assert block["maxFileBytes"] >= 1 and block["maxFiles"] >= 1


# ---------------------------------------------------------------- file model


async def test_paths_are_flat_names_without_dot_dot_or_leading_slash(
    owner: httpx.AsyncClient,
) -> None:
    """agent-workspace.md §"File model": "The pattern ^[A-Za-z0-9][A-Za-z0-9._/-]{0,255}$
    forbids .. and a leading /." """
    for raw in ("%2e%2e/escape.md", "..%2fescape.md", "%2Fescape.md", "a/%2e%2e/escape.md"):
        reply = await put(owner, raw, "x")
        assert reply.status_code in (400, 403), raw
        assert (await owner.get(f"{FILES}/{raw}")).status_code in (400, 403), raw
    assert (await owner.get(FILES)).json() == {"files": []}
    nested = await put(owner, "memory/2026/index.json", "{}")  # "/" in names is fine
    assert (nested.status_code, nested.json()["path"]) == (200, "memory/2026/index.json")


async def test_version_starts_at_1_and_each_put_bumps_it(owner: httpx.AsyncClient) -> None:
    """agent-workspace.md §"File model": "version is monotonic, starting at 1 on first
    create; each successful PUT bumps it by one."

    Monotonic across a delete too (a DELETE writes a tombstone, §C): created again, a file goes
    on from its last version, so no etag or ?version=N ever names two contents."""
    versions = [(await put(owner, "IDENTITY.md", f"v{i}")).json()["version"] for i in range(3)]
    assert versions == [1, 2, 3]
    assert (await owner.delete(f"{FILES}/IDENTITY.md")).status_code == 204
    again = (await put(owner, "IDENTITY.md", "reborn")).json()
    assert (again["version"], again["etag"]) == (4, "v4")
    assert (await owner.get(f"{FILES}/IDENTITY.md?version=1")).json()["content"] == "v0"


async def test_the_etag_is_the_token_if_match_takes(owner: httpx.AsyncClient) -> None:
    """agent-workspace.md §"File model": "etag is an opaque optimistic-concurrency token for
    If-Match." """
    first = (await put(owner, "a.md", "1")).json()
    assert isinstance(first["etag"], str) and first["etag"]
    got = await owner.get(f"{FILES}/a.md")
    assert got.json()["etag"] == first["etag"] and got.headers["etag"] == f'"{first["etag"]}"'
    matched = await put(owner, "a.md", "2", **{"If-Match": first["etag"]})
    assert matched.status_code == 200


# ---------------------------------------------------------------- §C endpoints


async def test_list_is_metadata_without_bodies(owner: httpx.AsyncClient) -> None:
    """agent-workspace.md §C: "GET /v1/host/workspace/files: List file metadata (no bodies)
    for the caller's {tenant, workspace}." openapi.yaml: the 200 body is {files} with
    additionalProperties: false, each item a WorkspaceFile (additionalProperties: false)."""
    await put(owner, "DIRECTIVES.md", "be brief")
    await put(owner, "MEMORY-INDEX.json", "{}")
    reply = await owner.get(FILES)
    body = reply.json()
    assert set(body) == {"files"} and "link" not in reply.headers
    assert [f["path"] for f in body["files"]] == ["DIRECTIVES.md", "MEMORY-INDEX.json"]
    for row in body["files"]:
        assert "content" not in row and set(row) <= FILE_FIELDS
        assert {"path", "version", "updatedAt"} <= set(row)


async def test_the_list_holds_every_file_however_many(
    owner: httpx.AsyncClient, nats_url: str
) -> None:
    """agent-workspace.md §C: the list is the metadata of the caller's files (all of them: no
    paging field exists in the schema). Past many of the reader's pages it still answers them
    all, as one JSON document the gateway streams instead of holding."""
    quill = await Quill.connect(nats_url)
    try:
        ws = quill.workspace("acme/agents")
        await ws.info()  # the gateway made it: the base version is the one seen
        paths = [f"many/{i:05}.md" for i in range(6000)]
        await ws.apply([rq.PutChange(path=p, content="x") for p in paths])
        await ws.info(version=ws.last_version)  # the reader has it
    finally:
        await quill.close()
    reply = await owner.get(FILES)
    assert reply.status_code == 200 and "link" not in reply.headers
    assert "content-length" not in reply.headers  # streamed, not built whole
    assert [f["path"] for f in reply.json()["files"]] == paths


async def test_prefix_filters_the_flat_namespace(owner: httpx.AsyncClient) -> None:
    """agent-workspace.md §C: "Optional ?prefix= filters the flat path namespace." """
    for path in ("notes/a.md", "notes/ab.md", "notes/b.md", "nodes.md", "top.md"):
        await put(owner, path, path)

    async def paths(prefix: str) -> list[str]:
        return [
            f["path"] for f in (await owner.get(FILES, params={"prefix": prefix})).json()["files"]
        ]

    assert await paths("notes/a") == ["notes/a.md", "notes/ab.md"]  # a name prefix, not a dir
    assert await paths("no") == ["nodes.md", "notes/a.md", "notes/ab.md", "notes/b.md"]
    assert await paths("absent/") == []


async def test_get_returns_one_file_or_404_not_found(owner: httpx.AsyncClient) -> None:
    """agent-workspace.md §C: "GET /v1/host/workspace/files/{path}: Return one WorkspaceFile.
    404 not_found when absent." """
    await put(owner, "IDENTITY.md", "I am")
    got = (await owner.get(f"{FILES}/IDENTITY.md")).json()
    assert set(got) == FILE_FIELDS and got["content"] == "I am"
    absent = await owner.get(f"{FILES}/NOPE.md")
    assert (absent.status_code, absent.json()["error"]) == (404, "not_found")


async def test_version_query_returns_the_historical_snapshot(owner: httpx.AsyncClient) -> None:
    """agent-workspace.md §C: "When versioned: true, ?version=N returns the historical
    snapshot." """
    for text in ("one", "two", "three"):
        await put(owner, "log.md", text)
    old = (await owner.get(f"{FILES}/log.md", params={"version": 2})).json()
    assert (old["content"], old["version"], old["etag"]) == ("two", 2, "v2")


async def test_every_retained_version_is_returned(owner: httpx.AsyncClient) -> None:
    """agent-workspace.md §C: "GET …/files/{path}?version=N MUST return the historical
    snapshot for any version still retained." (No maxVersions advertised: all are.)"""
    texts = [f"text {i}" for i in range(6)]
    for text in texts:
        await put(owner, "h.md", text)
    await owner.delete(f"{FILES}/h.md")  # history outlives the file
    for n, text in enumerate(texts, start=1):
        assert (await owner.get(f"{FILES}/h.md", params={"version": n})).json()["content"] == text


async def test_a_version_never_retained_is_404(owner: httpx.AsyncClient) -> None:
    """agent-workspace.md §"Open spec gaps": "a ?version=N for a purged version returns 404
    not_found." (Quill purges none: a version the file never had answers the same.)"""
    await put(owner, "p.md", "only")
    missing = await owner.get(f"{FILES}/p.md", params={"version": 7})
    assert (missing.status_code, missing.json()) == (404, {"error": "not_found"})


async def test_put_creates_or_replaces_with_200(owner: httpx.AsyncClient) -> None:
    """openapi.yaml, putWorkspaceFile: "'200': File created or replaced. Returns the persisted
    WorkspaceFile." (the only success the API description lists)"""
    created = await put(owner, "new.md", "first")
    replaced = await put(owner, "new.md", "second")
    assert (created.status_code, replaced.status_code) == (200, 200)
    assert set(created.json()) == FILE_FIELDS and created.json()["content"] == "first"
    assert document()["paths"][f"{FILES}/{{path}}"]["put"]["responses"].keys() >= {"200"}
    assert "201" not in document()["paths"][f"{FILES}/{{path}}"]["put"]["responses"]


async def test_a_stale_if_match_is_409_with_the_current_version(owner: httpx.AsyncClient) -> None:
    """agent-workspace.md §C: "MUST honor If-Match: <etag>; on mismatch the host MUST return
    409 workspace_conflict (with details.currentVersion)." """
    first = (await put(owner, "DIRECTIVES.md", "v1")).json()
    await put(owner, "DIRECTIVES.md", "v2")
    stale = await put(owner, "DIRECTIVES.md", "lost", **{"If-Match": f'"{first["etag"]}"'})
    assert stale.status_code == 409
    assert stale.json()["error"] == "workspace_conflict"
    assert stale.json()["details"] == {"currentVersion": 2}
    assert (await owner.get(f"{FILES}/DIRECTIVES.md")).json()["content"] == "v2"


async def test_a_successful_put_bumps_recomputes_and_emits(
    owner: httpx.AsyncClient, nats_url: str
) -> None:
    """agent-workspace.md §C: "On success the host MUST bump version, recompute etag, and emit
    workspace.updated." (Quill's workspace.updated: ws.updated.<tenant>.<workspace>.)"""
    first = (await put(owner, "DIRECTIVES.md", "v1")).json()
    quill = await Quill.connect(nats_url)
    try:
        sub = await quill.nc.subscribe(quill.subjects.updated("acme", "agents"))
        await quill.nc.flush()  # the server has the subscription before the write
        second = (await put(owner, "DIRECTIVES.md", "v2", **{"If-Match": first["etag"]})).json()
        note = codec.decode((await sub.next_msg(timeout=30)).data, WorkspaceUpdated)
        await sub.unsubscribe()
    finally:
        await quill.close()
    assert second["version"] == first["version"] + 1 and second["etag"] != first["etag"]
    assert note.paths == ["DIRECTIVES.md"]


async def test_content_beyond_max_file_bytes_is_workspace_too_large(
    nats_url: str, start: StartGateway
) -> None:
    """agent-workspace.md §C: "content beyond maxFileBytes MUST return workspace_too_large."
    (openapi.yaml: 413.)"""
    quill = await Quill.connect(nats_url)
    try:
        await quill.workspace("acme/small").create(limits=LimitsPatch(max_file_bytes=100))
    finally:
        await quill.close()
    gateway = await start({"small-token-1": "acme/small"})
    async with client(gateway, "small-token-1") as http:
        advertised = (await http.get("/.well-known/openwop")).json()["workspace"]["maxFileBytes"]
        assert advertised == 100
        over = await put(http, "big.md", "x" * (advertised + 1))
        assert (over.status_code, over.json()["error"]) == (413, "workspace_too_large")
        assert (await put(http, "big.md", "x" * advertised)).status_code == 200


async def test_delete_removes_the_file_and_keeps_a_tombstone(owner: httpx.AsyncClient) -> None:
    """agent-workspace.md §C: "DELETE /v1/host/workspace/files/{path}: Remove the file (and,
    when versioned: true, write a tombstone)." """
    await put(owner, "gone.md", "bye")
    deleted = await owner.delete(f"{FILES}/gone.md")
    assert (deleted.status_code, deleted.content) == (204, b"")
    assert (await owner.get(f"{FILES}/gone.md")).status_code == 404
    assert (await owner.get(FILES)).json() == {"files": []}
    assert (await owner.delete(f"{FILES}/gone.md")).status_code == 404
    kept = await owner.get(f"{FILES}/gone.md", params={"version": 1})
    assert kept.json()["content"] == "bye"


async def test_a_concurrent_reader_sees_old_or_new_never_a_mix(owner: httpx.AsyncClient) -> None:
    """agent-workspace.md §C: "A write MUST be atomic — a concurrent reader MUST observe either
    the prior or the new content, never a partial." """
    old, new = "a" * 400_000, "b" * 400_000  # past one read's limit: read in chunks
    await put(owner, "big.txt", old)
    reads = [owner.get(f"{FILES}/big.txt") for _ in range(6)]
    results = await asyncio.gather(put(owner, "big.txt", new), *reads)
    assert results[0].status_code == 200
    for reply in results[1:]:
        body = reply.json()
        assert body["content"] in (old, new)
        assert (body["content"] == new) == (body["version"] == 2)  # content and metadata agree


# ---------------------------------------------------------------- §E WCT-1 isolation


async def test_no_get_or_list_returns_another_owners_file(
    owner: httpx.AsyncClient, stranger: httpx.AsyncClient
) -> None:
    """agent-workspace.md §E WCT-1: "No GET or list against a workspace owned by {T, W} MAY
    return a file owned by {T′, W′} ≠ {T, W}, regardless of the calling principal's permissions
    elsewhere." """
    await put(owner, "SECRET.md", "owner-only 4f1c")
    read = await stranger.get(f"{FILES}/SECRET.md")
    assert read.status_code == 404 and "4f1c" not in read.text
    assert (await stranger.get(FILES)).json() == {"files": []}
    assert (await stranger.get(FILES, params={"prefix": "SEC"})).json() == {"files": []}
    await put(stranger, "SECRET.md", "stranger's own")  # same path, its own workspace
    assert (await owner.get(f"{FILES}/SECRET.md")).json()["content"] == "owner-only 4f1c"


async def test_scope_hints_from_the_caller_are_not_trusted(
    owner: httpx.AsyncClient, stranger: httpx.AsyncClient
) -> None:
    """agent-workspace.md §E WCT-1: "Hosts MUST validate the {tenant, workspace} binding at
    resolution time from the authenticated identity — caller-supplied scope hints MUST NOT be
    trusted as authorization (fail-closed)." """
    await put(owner, "SECRET.md", "owner-only 9b2e")
    hints = {"X-Tenant": "acme", "X-Workspace": "agents", "Ws-Tenant": "acme"}
    for params in ({"tenantId": "acme"}, {"tenant": "acme", "workspace": "agents"}, {}):
        read = await stranger.get(f"{FILES}/SECRET.md", params=params, headers=hints)
        assert read.status_code == 404 and "9b2e" not in read.text
    claimed = await stranger.post("/v1/runs", json={"workflowId": "w", "tenantId": "acme"})
    assert claimed.status_code == 403


async def test_errors_do_not_tell_another_owners_file_exists(
    owner: httpx.AsyncClient, stranger: httpx.AsyncClient
) -> None:
    """agent-workspace.md §E WCT-1: "Errors MUST NOT leak file contents or the existence of
    another tenant's file (404 over 403 is acceptable to avoid existence disclosure)." """
    await put(owner, "EXISTS.md", "here")
    there = await stranger.get(f"{FILES}/EXISTS.md")
    nowhere = await stranger.get(f"{FILES}/NEVER.md")
    assert (there.status_code, there.json()) == (nowhere.status_code, nowhere.json())
    deleted = await stranger.delete(f"{FILES}/EXISTS.md")
    assert (deleted.status_code, deleted.json()) == (404, {"error": "not_found"})
    old = await stranger.get(f"{FILES}/EXISTS.md", params={"version": 1})
    assert (old.status_code, old.json()) == (404, {"error": "not_found"})
    assert (await owner.get(f"{FILES}/EXISTS.md")).json()["content"] == "here"


async def test_persisted_content_has_secrets_redacted(
    owner: httpx.AsyncClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """agent-workspace.md §E WSR-1: "A workspace write whose content contains a value the run's
    BYOK vault resolved during the run MUST persist [REDACTED:<secretId>] in place of the
    plaintext. A subsequent GET/list MUST NOT surface the plaintext." (Quill's vault: the
    registry $QUILL_SECRETS names.)"""
    registry = tmp_path / "secrets.toml"
    registry.write_text('[secrets]\napi_key = "sk-live-0123456789abcdef"\n')
    monkeypatch.setenv("QUILL_SECRETS", str(registry))
    written = await put(owner, "NOTES.md", "key: sk-live-0123456789abcdef\n")
    assert written.json()["content"] == "key: [REDACTED:api_key]\n"
    got = await owner.get(f"{FILES}/NOTES.md")
    assert got.json()["content"] == "key: [REDACTED:api_key]\n"
    assert "sk-live" not in got.text and "sk-live" not in (await owner.get(FILES)).text


# ---------------------------------------------------------------- §D run snapshot


async def test_a_run_exposes_the_snapshot_taken_at_its_start(owner: httpx.AsyncClient) -> None:
    """agent-workspace.md §D: "the host MUST expose the workspace as a read snapshot taken at
    run.started under ctx.workspace.get(path) / ctx.workspace.list()." (Over REST: the
    RunSnapshot's workspace, and ?runId= on get and list.)"""
    await put(owner, "DIRECTIVES.md", "at start")
    run = await start_run(owner)
    snap = (await owner.get(f"/v1/runs/{run}")).json()
    assert [f["path"] for f in snap["workspace"]] == ["DIRECTIVES.md"]
    assert (snap["runId"], snap["workflowId"], snap["status"]) == (run, "nightly", "running")
    got = await owner.get(f"{FILES}/DIRECTIVES.md", params={"runId": run})
    assert got.json()["content"] == "at start"
    listed = await owner.get(FILES, params={"runId": run})
    assert [f["path"] for f in listed.json()["files"]] == ["DIRECTIVES.md"]


async def test_the_snapshot_is_immutable_for_the_run(owner: httpx.AsyncClient) -> None:
    """agent-workspace.md §D: "The snapshot MUST be immutable for the run's duration —
    mirroring RFC 0004 memory's read-as-of-run-start rule — so replay is deterministic." """
    await put(owner, "DIRECTIVES.md", "at start")
    await put(owner, "OLD.md", "old")
    run = await start_run(owner)
    await put(owner, "DIRECTIVES.md", "changed")
    await put(owner, "NEW.md", "new")
    await owner.delete(f"{FILES}/OLD.md")
    for _ in range(2):  # and still after the run ends
        got = await owner.get(f"{FILES}/DIRECTIVES.md", params={"runId": run})
        assert (got.json()["content"], got.json()["version"]) == ("at start", 1)
        assert (await owner.get(f"{FILES}/NEW.md", params={"runId": run})).status_code == 404
        assert (await owner.get(f"{FILES}/OLD.md", params={"runId": run})).status_code == 200
        listed = (await owner.get(FILES, params={"runId": run})).json()["files"]
        assert [f["path"] for f in listed] == ["DIRECTIVES.md", "OLD.md"]
        ended = await owner.post(f"/v1/runs/{run}/cancel")
        assert ended.json() == {"runId": run, "status": "cancelled"}
    assert (await owner.get(f"/v1/runs/{run}")).json()["status"] == "completed"


async def test_writes_in_a_run_reach_the_next_run_not_this_one(owner: httpx.AsyncClient) -> None:
    """agent-workspace.md §D: "Writes from within a run go through the same PUT contract and
    are visible to subsequent runs / loop iterations, NOT the current snapshot." """
    await put(owner, "MEMORY-INDEX.json", "[]")
    first = await start_run(owner, "loop")
    written = await put(owner, "MEMORY-INDEX.json", '["learned"]')  # the run's own write
    assert written.status_code == 200
    now = await owner.get(f"{FILES}/MEMORY-INDEX.json", params={"runId": first})
    assert now.json()["content"] == "[]"
    second = await start_run(owner, "loop")
    after = await owner.get(f"{FILES}/MEMORY-INDEX.json", params={"runId": second})
    assert after.json()["content"] == '["learned"]'


async def test_another_host_observes_the_same_snapshot(
    owner: httpx.AsyncClient, start: StartGateway
) -> None:
    """agent-workspace.md §D: "a run replayed on another host MUST observe the same workspace
    snapshot it observed originally." (Another gateway on the same Quill.)"""
    await put(owner, "DIRECTIVES.md", "seen by the run")
    run = await start_run(owner)
    await put(owner, "DIRECTIVES.md", "later")
    here = (await owner.get(f"/v1/runs/{run}")).json()
    other = await start(TOKENS)
    async with client(other, OWNER) as elsewhere:
        there = (await elsewhere.get(f"/v1/runs/{run}")).json()
        got = await elsewhere.get(f"{FILES}/DIRECTIVES.md", params={"runId": run})
    assert there["workspace"] == here["workspace"]
    assert got.json()["content"] == "seen by the run"


async def test_run_creation_answers_201_with_the_required_fields(owner: httpx.AsyncClient) -> None:
    """openapi.yaml, createRun: "'201': Run accepted." with "required: [runId, status,
    eventsUrl]" and status one of pending, running, waiting-*."""
    created = await owner.post("/v1/runs", json={"workflowId": "conformance-noop"})
    assert created.status_code == 201
    body = created.json()
    assert {"runId", "status", "eventsUrl"} <= set(body) and body["status"] == "running"
    assert body["eventsUrl"].startswith("http") and body["statusUrl"] == created.headers["location"]
    snapshot = await owner.get(body["statusUrl"])
    assert snapshot.json()["runId"] == body["runId"]


async def test_the_run_snapshot_has_its_required_fields(owner: httpx.AsyncClient) -> None:
    """run-snapshot.schema.json: "required": ["runId", "workflowId", "status"]; "owner"
    carries the RFC 0048 triple that owns the run."""
    run = await start_run(owner, "weekly")
    snap = (await owner.get(f"/v1/runs/{run}")).json()
    assert {"runId", "workflowId", "status"} <= set(snap)
    assert snap["owner"] == {"tenant": "acme", "workspace": "agents"}


async def test_a_run_another_owner_started_is_not_found(
    owner: httpx.AsyncClient, stranger: httpx.AsyncClient
) -> None:
    """openapi.yaml, NotFound: "Resource doesn't exist or caller can't see it (do not leak
    existence)." (run-snapshot.schema.json: "A principal scoped to one workspace MUST NOT read a
    run owned by another.")"""
    await put(owner, "SECRET.md", "owner-only 77aa")
    run = await start_run(owner)
    never = "nightly:0000000000000000"
    for path in (f"/v1/runs/{run}", f"/v1/runs/{never}"):
        reply = await stranger.get(path)
        assert (reply.status_code, reply.json()) == (404, {"error": "not_found"}), path
    cancel = await stranger.post(f"/v1/runs/{run}/cancel")
    assert (cancel.status_code, cancel.json()) == (404, {"error": "not_found"})
    under = await stranger.get(f"{FILES}/SECRET.md", params={"runId": run})
    assert under.status_code == 404 and "77aa" not in under.text
    assert (await owner.get(f"/v1/runs/{run}")).json()["status"] == "running"
