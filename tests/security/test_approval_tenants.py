"""Approvals: what is approved is what is carried out, and another tenant sees none of it.

Tenant a parks changes on its restricted workspace; Quill keeps each parked request
(``WS_APPROVALS``) and carries it out once approved. The attacks: a request id reused with
another body to have something else carried out under an approval; retries and floods that
pile up approvals; tenant b (a bare nats-py client with its own credentials) asking a's
approval by id on its own workspace and on a's subject, reading or writing ``WS_APPROVALS``
(a direct get, or a publish that would plant a request to be carried out), subscribing to it,
and malformed ids; tenant a asking for the approval of its own command with a summary of its
choosing (``cmd.request_approval``). None works."""

from __future__ import annotations

import json
import secrets
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.msg import Msg

from contracts import codec, hashing
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import MAX_PENDING_APPROVALS
from contracts.subjects import STREAM_APPROVALS
from tests.helpers import Refusals, bare_as, parked
from tests.security.test_command_output_tenants import ask
from tests.up import PASSWORDS, TENANTS, Up, quill_as

pytestmark = pytest.mark.up(tenants=TENANTS)


async def test_an_approval_carries_out_the_body_approved_and_no_other(up: Up) -> None:
    qa = await quill_as(up, "a")
    try:
        ws = qa.workspace("a/careful")
        await ws.create(exist_ok=True)
        await ws.set_trust("restricted")
        benign = rq.WriteFile(path="plan.md", content="benign\n")
        evil = rq.WriteFile(path="plan.md", content="EVIL\n")
        rid = f"req-{secrets.token_hex(6)}"

        async def send(body: rq.WriteFile) -> Any:
            return await qa.request("cmd", "a", "careful", "write", body, dict, request_id=rid)

        assert await parked(send(benign)) == rid
        with pytest.raises(QuillError) as info:  # the same id, another body: not this one
            await send(evil)
        assert info.value.code == ErrorCode.CONFLICT
        await ws.approve(rid)
        done = await ws.wait_approval(rid, timeout=30)
        assert done.outcome is not None and done.outcome.error is None, done
        # sent again with the other body once approved: answered with what was approved
        await send(evil)
        assert await ws.read_text("plan.md") == "benign\n"
        revisions = (await ws.history("plan.md")).revisions
        assert len(revisions) == 1
    finally:
        await qa.close()


async def test_retries_and_floods_do_not_pile_up_approvals(up: Up) -> None:
    qa = await quill_as(up, "a")
    try:
        ws = qa.workspace("a/flooded")
        await ws.create(exist_ok=True)
        await ws.set_trust("restricted")
        ids = {await parked(ws.write("same.md", "again\n")) for _ in range(5)}
        assert len(ids) == 1  # five retries, one approval
        for i in range(MAX_PENDING_APPROVALS - 1):
            await parked(ws.write(f"f{i}.md", "x\n"))
        with pytest.raises(QuillError) as info:
            await ws.write("one-too-many.md", "x\n")
        assert info.value.code == ErrorCode.UNAVAILABLE
        assert info.value.details["queue"] == "approvals"
        assert len((await ws.approvals()).pending) == MAX_PENDING_APPROVALS
    finally:
        await qa.close()


async def test_another_tenant_cannot_see_or_plant_an_approval(up: Up) -> None:
    marker = f"A-ONLY-{secrets.token_hex(8)}"
    qa = await quill_as(up, "a")
    qb = await quill_as(up, "b")
    refusals = Refusals()
    nb = await bare_as(up.nats_url, "b", refusals)
    try:
        wa = qa.workspace("a/shared")
        await wa.create(exist_ok=True)
        await wa.set_trust("restricted")
        await qb.workspace("b/shared").create(exist_ok=True)
        approval_id = await parked(wa.write("secret.md", f"{marker}\n"))
        assert (await wa.approval(approval_id)).state == "pending"

        leaked: list[bytes] = []

        async def collect(msg: Msg) -> None:
            leaked.append(msg.data)

        await nb.subscribe("ws.approval.>", cb=collect)
        await nb.flush()
        body = {"approval_id": approval_id}
        kept = f"ws.approval.a.shared.{approval_id}.request"
        answers = {
            "own workspace": await ask(nb, "ws.qry.b.shared.approval", body),
            "a's subject": await ask(nb, "ws.qry.a.shared.approval", body),
            "direct get": await ask(nb, f"$JS.API.DIRECT.GET.{STREAM_APPROVALS}.{kept}", b""),
            "msg get": await ask(
                nb, f"$JS.API.STREAM.MSG.GET.{STREAM_APPROVALS}", {"last_by_subj": kept}
            ),
        }
        assert answers["own workspace"] is not None
        assert answers["own workspace"]["error"]["code"] == "FILE_NOT_FOUND"
        for what in ("a's subject", "direct get", "msg get"):
            assert answers[what] is None, (what, answers[what])  # refused by the server
        for bad in ("*", ">", "a.shared.x y", "../a/shared", "x" * 129, 7, ""):
            answer = await ask(nb, "ws.qry.b.shared.approval", {"approval_id": bad})
            assert answer is not None and answer["error"]["code"] == "INVALID_ARGUMENT", (
                bad,
                answer,
            )
        for what, answer in answers.items():
            assert marker not in json.dumps(answer), what

        # b plants a request of its own under a's approval: refused, and never carried out
        planted = {"op": "cmd.write", "headers": {"Ws-Request-Id": approval_id}, "body": ""}
        await nb.publish(kept, json.dumps(planted).encode())
        await nb.flush()
        await refusals.wait("subscription", "ws.approval.>")
        await refusals.wait("publish", kept)
        await wa.approve(approval_id)
        done = await wa.wait_approval(approval_id, timeout=30)
        assert done.outcome is not None and done.outcome.error is None, done
        assert await wa.read_text("secret.md") == f"{marker}\n"
        assert not leaked
    finally:
        await nb.close()
        await qa.close()
        await qb.close()


async def test_a_tenant_cannot_name_what_an_approver_is_shown(up: Up) -> None:
    """Tenant a asks for the approval of a command itself (``cmd.request_approval``, the
    executors' op) under the id and digest of the command it then sends: the approver would
    be shown "ls" and approve another command. The server refuses the ask (only the services'
    user may send it), and what an approver is shown is the command kept, what will run."""
    qa = await quill_as(up, "a")
    refusals: list[Exception] = []

    async def refused(exc: Exception) -> None:
        refusals.append(exc)

    na = await nats.connect(
        up.nats_url, user="a", password=PASSWORDS["a"], inbox_prefix="_INBOX_a", error_cb=refused
    )
    try:
        ws = qa.workspace("a/shown")
        await ws.create(exist_ok=True)
        await ws.set_trust("restricted", commands=True)
        evil = f"echo EVIL-{secrets.token_hex(4)} > pwned.txt"
        rid = f"req-{secrets.token_hex(6)}"
        digest = hashing.content_sha256(codec.encode(rq.RunCommand(command=evil)))
        headers = {"Ws-Request-Id": rid, "Ws-Session": "s-evil", "Ws-Actor": "a"}

        async def send(subject: str, body: dict[str, Any]) -> dict[str, Any] | None:
            try:
                msg = await na.request(subject, json.dumps(body).encode(), 5, headers=headers)
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                return None  # refused by the server: no answer comes
            answer: dict[str, Any] = json.loads(msg.data)
            return answer

        asked = await send(
            "ws.cmd.a.shown.request_approval",
            {"op": "exec.run", "summary": "ls", "digest": digest},
        )
        assert asked is None, asked
        assert any("request_approval" in str(e) for e in refusals), refusals
        ran = await send("ws.exec.a.shown.run", {"command": evil})
        assert ran is not None and ran["error"]["code"] == "APPROVAL_REQUIRED", ran
        ws.last_version = ran["error"]["details"]["version"]  # read once the reader has it
        pending = {a.approval_id: a for a in (await ws.approvals()).pending}
        assert rid in pending, pending
        assert pending[rid].summary == evil  # what will run, not "ls"
        await ws.deny(rid, reason="not that")
    finally:
        await na.close()
        await qa.close()
