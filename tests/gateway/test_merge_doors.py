"""Merges at the gateway's doors (issue 33, item 6): MCP's ``merge_workspace``, REST's
``POST /v1/workspaces/{name}/merge`` (as the OpenAPI document describes it) and the console's
merge preview with its Merge form; each through a real gateway, writer and reader, the result
read back through the SDK. A dry run commits nothing; conflicts come with their three-way
hunks; a restricted target parks the merge for approval, as any call there; ``quill merge``
prints the conflicts and exits non-zero while they stand. Refusals are
``tests/security/test_merge_doors.py``'s."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import jsonschema
import pytest_asyncio
from click.testing import CliRunner

from quill.client import Quill
from quill_cli.cli import main
from services.gateway.access import Principal, Tokens
from services.gateway.rest.openapi import document
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway
from tests.gateway.support import call, error, mcp_client, ok
from tests.security.test_console_processes import csrf_of

TOKENS = Tokens({"acme-admin-token": Principal("acme", "ops", pinned=False, actor="ann")})
ADMIN = {"Authorization": "Bearer acme-admin-token"}
TEXT = "".join(f"line {i}\n" for i in range(1, 11))


async def forked(sdk: Quill, tenant: str = "acme") -> None:
    """``book`` (t.txt) forked as ``try``; ``try`` adds new.md and changes line 2, ``book``
    changes line 2 otherwise (a conflict) and line 9 (merged line by line)."""
    book = sdk.workspace(f"{tenant}/book")
    await book.create(exist_ok=True)
    await book.write("t.txt", TEXT)
    await sdk.fork(f"{tenant}/book", "try")
    fork = sdk.workspace(f"{tenant}/try")
    await fork.write("new.md", "from the fork\n")
    await fork.write("t.txt", TEXT.replace("line 2\n", "line two (fork)\n"))
    await book.write("t.txt", TEXT.replace("line 2\n", "line 2 (book)\n"))
    await book.info()
    await fork.info()


@pytest_asyncio.fixture
async def gateway(start: StartGateway) -> Gateway:
    """A gateway with ``TOKENS``, its workspaces made (``forked``)."""
    running = await start(TOKENS)
    await forked(running.quill)
    return running


async def test_mcp_previews_refuses_and_merges(gateway: Gateway) -> None:
    sdk = gateway.quill
    book = sdk.workspace("acme/book")
    before = (await book.info()).version
    async with mcp_client(gateway.url, token="acme-admin-token") as mcp:
        dry = await ok(mcp, "merge_workspace", workspace="book", dry_run=True, **{"from": "try"})
        assert dry.startswith("Dry run of merging acme/try@")
        assert "it would refuse" in dry and "CONFLICT t.txt: content" in dry
        assert "<<<<<<< ours\nline 2 (book)\n||||||| base\nline 2\n=======\n" in dry
        assert 'strategy="markers"' in dry and 'strategy="theirs"' in dry
        theirs = await ok(
            mcp, "merge_workspace", workspace="book", dry_run=True, strategy="theirs",
            **{"from": "try"},
        )  # fmt: skip
        assert "put    new.md (theirs, 14 bytes)" in theirs and "decided: theirs" in theirs
        refused = await call(mcp, "merge_workspace", workspace="book", **{"from": "try"})
        assert refused.is_error
        data: Any = refused.structured_content
        assert data["code"] == "MERGE_CONFLICT" and data["details"]["conflicts_total"] == 1
        assert "line two (fork)" in refused.content[0].text  # type: ignore[union-attr]
        assert (await book.info()).version == before  # nothing committed
        done = await call(
            mcp, "merge_workspace", workspace="book", strategy="theirs", **{"from": "try"}
        )
        said = done.content[0].text  # type: ignore[union-attr]
        assert not done.is_error and said.startswith("Merged acme/try@"), said
        reply: Any = done.structured_content
        assert reply["committed"] and reply["strategy"] == "theirs"
        assert f"version {before + 1}" in said
        again = await ok(mcp, "merge_workspace", workspace="book", **{"from": "try"})
        assert again.startswith("Nothing to merge")
        assert await error(mcp, "merge_workspace", **{"from": "book"}) == (
            "Error: acme/book and acme/ops share no history (neither was forked from the "
            "other, nor both from one workspace): nothing to merge against"
        )
    assert (await book.read_text("t.txt")).startswith("line 1\nline two (fork)\n")
    assert (await book.read_text("new.md")) == "from the fork\n"


async def test_rest_merges_as_openapi_says(gateway: Gateway) -> None:
    sdk = gateway.quill
    spec = document()["paths"]["/v1/workspaces/{name}/merge"]["post"]

    def check(reply: httpx.Response) -> Any:
        schema = spec["responses"][str(reply.status_code)]["content"]["application/json"]
        jsonschema.validate(reply.json(), schema["schema"])
        return reply.json()

    async with httpx.AsyncClient(base_url=gateway.url, timeout=30, headers=ADMIN) as http:
        body = {"from": "try", "dryRun": True}
        jsonschema.validate(body, spec["requestBody"]["content"]["application/json"]["schema"])
        dry = check(await http.post("/v1/workspaces/book/merge", json=body))
        assert (dry["name"], dry["from"], dry["committed"], dry["dryRun"]) == (
            "book",
            "try",
            False,
            True,
        )
        assert dry["conflictsTotal"] == 1 and dry["conflicts"][0]["hunks"][0]["baseLine"] == 2
        assert dry["refused"] and dry["changes"] == []
        refused = await http.post("/v1/workspaces/book/merge", json={"from": "try"})
        assert refused.status_code == 409
        said = check(refused)
        assert said["error"] == "merge_conflict" and said["details"]["conflictsTotal"] == 1
        assert said["details"]["conflicts"][0]["path"] == "t.txt"
        done = await http.post(
            "/v1/workspaces/book/merge", json={"from": "try", "strategy": "markers"}
        )
        merged = check(done)
        assert done.status_code == 200 and merged["committed"] and merged["marked"] == ["t.txt"]
        assert merged["version"] == (await sdk.workspace("acme/book").info()).version
    assert "<<<<<<<" in await sdk.workspace("acme/book").read_text("t.txt")


async def test_rest_and_mcp_park_a_merge_into_a_restricted_workspace(gateway: Gateway) -> None:
    sdk = gateway.quill
    book = sdk.workspace("acme/book")
    await book.set_trust("restricted")
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30, headers=ADMIN) as http:
        dry = await http.post("/v1/workspaces/book/merge", json={"from": "try", "dryRun": True})
        assert dry.status_code == 200  # a dry run changes nothing: nothing to approve
        parked = await http.post(
            "/v1/workspaces/book/merge", json={"from": "try", "strategy": "ours"}
        )
        assert parked.status_code == 202, parked.text
        approval_id = parked.json()["details"]["approvalId"]
        assert parked.headers["location"] == f"/v1/approvals/{approval_id}"
    async with mcp_client(gateway.url, token="acme-admin-token") as mcp:
        said = await error(
            mcp, "merge_workspace", workspace="book", strategy="ours", **{"from": "try"}
        )
        assert "a person must approve it" in said and "wait_for_approval" in said
    status = await sdk.as_actor("alice").workspace("acme/book").approve(approval_id)
    assert status.approved
    done = await book.wait_approval(approval_id, 30)
    assert done.outcome is not None and done.outcome.version is not None
    assert (await book.read_text("new.md")) == "from the fork\n"


async def test_the_console_previews_and_merges_through_its_form(start: StartGateway) -> None:
    gateway = await start()  # no tokens: the loopback caller, tenant default
    sdk = gateway.quill
    await forked(sdk, "default")
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        forks = await http.get("/ui/w/book/forks")
        assert '/ui/w/book/merge?from=try" class="merge-preview">Preview merge' in forks.text
        page = await http.get("/ui/w/book/merge?from=try")
        assert page.status_code == 200
        assert 'id="preview"' in page.text and "It would be refused" in page.text
        assert 'id="conflict-1"' in page.text and "line two (fork)" in page.text
        theirs = await http.get("/ui/w/book/merge?from=try&strategy=theirs")
        assert "<code>new.md</code>" in theirs.text and "(decided: theirs)" in theirs.text
        token = csrf_of(page.text)
        refused = await http.post(
            "/ui/w/book/merge", data={"from": "try", "strategy": "fail", "csrf": token}
        )
        assert refused.status_code == 409 and 'id="refused"' in refused.text
        assert 'id="conflict-1"' in refused.text
        done = await http.post(
            "/ui/w/book/merge", data={"from": "try", "strategy": "ours", "csrf": token}
        )
        assert done.status_code == 303
        after = await http.get(done.headers["location"])
        assert 'id="merged"' in after.text and "Merged default/try@" in after.text
        await sdk.workspace("default/book").set_trust("restricted")
        await sdk.workspace("default/try").write("late.md", "late\n")
        parked = await http.post(
            "/ui/w/book/merge", data={"from": "try", "strategy": "ours", "csrf": token}
        )
        shown = await http.get(parked.headers["location"])
        assert 'id="parked"' in shown.text and "/ui/w/book/approvals/" in shown.text
    assert (await sdk.workspace("default/book").read_text("new.md")) == "from the fork\n"


async def quill(nats_url: str, *argv: str) -> Any:
    """``quill ARGV`` in this process (in a thread: the services answer from this loop)."""
    env = {"QUILL_NATS_URL": nats_url}
    return await asyncio.to_thread(CliRunner().invoke, main, list(argv), env=env)


async def test_quill_merge_prints_conflicts_and_exits_non_zero(
    start: StartGateway, nats_url: str
) -> None:
    gateway = await start()
    await forked(gateway.quill)
    dry = await quill(nats_url, "merge", "try", "acme/book", "--dry-run")
    assert dry.exit_code == 1, dry.output  # conflicts fail would leave
    assert "CONFLICT t.txt: content" in dry.stdout and '--strategy "theirs"' in dry.stdout
    assert "<<<<<<< ours\nline 2 (book)\n||||||| base\nline 2\n" in dry.stdout
    refused = await quill(nats_url, "merge", "acme/try", "acme/book")
    assert refused.exit_code == 1 and "quill: MERGE_CONFLICT:" in refused.stderr
    assert "line two (fork)" in refused.stderr
    as_json = await quill(nats_url, "--json", "merge", "try", "acme/book")
    assert json.loads(as_json.stderr)["details"]["conflicts_total"] == 1
    done = await quill(nats_url, "merge", "try", "acme/book", "--strategy", "ours")
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("Merged acme/try@") and "put    new.md (theirs" in done.stdout
    other = await quill(nats_url, "merge", "acme/try", "globex/book")  # another tenant's
    assert other.exit_code == 2 and "stays within its tenant" in other.stderr
