"""REST on a restricted workspace: a PUT or DELETE is answered ``202`` with the approval's id
and ``Location``; Quill makes the change once someone approves it, and ``GET
/v1/approvals/{id}`` answers what came of it. Over real HTTP."""

from __future__ import annotations

import asyncio

import httpx

from quill.client import Quill
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway

FILES = "/v1/host/workspace/files"


async def test_a_parked_put_is_made_once_approved(
    gateway: Gateway, sdk: Quill, http: httpx.AsyncClient
) -> None:
    ws = sdk.workspace("default/default")
    await ws.set_trust("restricted")
    put = await http.put(f"{FILES}/plan.md", json={"content": "the plan\n"})
    assert put.status_code == 202, put.text
    body = put.json()
    assert body["error"] == "approval_required"
    approval_id = body["details"]["approvalId"]
    assert put.headers["Location"] == f"/v1/approvals/{approval_id}"
    again = await http.put(f"{FILES}/plan.md", json={"content": "the plan\n"})
    assert again.json()["details"]["approvalId"] == approval_id  # a retry: the same one

    pending = await http.get(put.headers["Location"])
    assert pending.status_code == 200 and pending.json()["state"] == "pending"
    waiting = asyncio.create_task(http.get(put.headers["Location"], params={"wait_ms": 30_000}))
    await ws.approve(approval_id)
    done = (await asyncio.wait_for(waiting, 30)).json()
    assert (done["state"], done["done"]) == ("approved", True), done
    assert done["outcome"]["result"]["path"] == "plan.md"
    assert (await http.get(f"{FILES}/plan.md")).json()["content"] == "the plan\n"

    deleted = await http.delete(f"{FILES}/plan.md")
    assert deleted.status_code == 202
    refused_id = deleted.json()["details"]["approvalId"]
    await ws.deny(refused_id, reason="keep it")
    denied = (await http.get(f"/v1/approvals/{refused_id}", params={"wait_ms": 30_000})).json()
    assert (denied["state"], denied["reason"], denied["done"]) == ("denied", "keep it", True)
    assert (await http.get(f"{FILES}/plan.md")).status_code == 200

    for bad in ("no-such-approval", "%20", "a" * 200):
        missing = await http.get(f"/v1/approvals/{bad}")
        assert missing.status_code == 404 and missing.json() == {"error": "not_found"}
    slow = await http.get(f"/v1/approvals/{approval_id}", params={"wait_ms": "99999999"})
    assert slow.status_code == 400


async def test_another_workspaces_approval_is_not_found(start: StartGateway) -> None:
    """An approval id of another tenant's workspace reads as one that never was."""
    gateway = await start({"acme-token-12345": "acme/w", "globex-token-1234": "globex/w"})
    sdk = gateway.quill
    theirs = sdk.workspace("globex/w")
    await theirs.create(exist_ok=True)
    await theirs.set_trust("restricted")
    headers = {"Authorization": "Bearer globex-token-1234"}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        put = await http.put(f"{FILES}/secret.md", json={"content": "x\n"}, headers=headers)
        assert put.status_code == 202
        location = put.headers["Location"]
        assert (await http.get(location, headers=headers)).json()["state"] == "pending"
        mine = {"Authorization": "Bearer acme-token-12345"}
        other = await http.get(location, headers=mine)
        assert other.status_code == 404 and other.json() == {"error": "not_found"}
