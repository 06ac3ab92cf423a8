"""A command's kept output (``WS_OUTPUT``, read with ``exec.output``) is its tenant's alone.

Tenant a runs a command whose output holds a marker; a reads it back by the command's id.
Tenant b, a bare nats-py client with its own credentials and the command's id, tries every way
there is: ``exec.output`` on its own workspace (the id names nothing there), on a's subject
(refused by the server), a direct get and a message get on the stream (``$JS.API``: refused),
a subscription to the stream's subjects (refused; nothing arrives while a runs another
command), and ids that try to reach out of their subject token. None gives b a byte of it."""

from __future__ import annotations

import json
import secrets
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts.subjects import STREAM_OUTPUT
from tests.helpers import refused
from tests.up import TENANTS, Up, a_against_b

pytestmark = pytest.mark.up(tenants=TENANTS)


async def ask(nc: NATS, subject: str, body: dict[str, Any] | bytes) -> dict[str, Any] | None:
    """The reply to a request, or None when the server refused it (no reply comes)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        msg = await nc.request(subject, data, timeout=3)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return None
    try:
        reply: dict[str, Any] = json.loads(msg.data)
    except ValueError:
        return {"raw": msg.data.decode(errors="replace"), "headers": msg.headers}
    return reply


async def test_another_tenant_cannot_read_a_commands_output(up: Up) -> None:
    marker = f"A-ONLY-{secrets.token_hex(8)}"
    async with a_against_b(up) as (wa, nb, refusals):
        # long: its middle is only in the kept output
        r = await wa.exec(f"for i in $(seq 1 20000); do echo {marker} $i; done")
        assert r.stdout_truncated and r.output_kept
        own = await wa.command_output(r.command_id, offset=r.stdout_omitted_offset)
        assert marker in own.text  # a reads its own

        leaked: list[bytes] = []

        async def collect(msg: Msg) -> None:
            leaked.append(msg.data)

        await nb.subscribe("ws.cmdout.>", cb=collect)
        await nb.subscribe(f"ws.cmdout.a.shared.{r.command_id}.>", cb=collect)
        await nb.flush()

        body = {"command_id": r.command_id, "offset": r.stdout_omitted_offset}
        answers = {"own workspace": await ask(nb, "ws.exec.b.shared.output", body)}
        output = f"ws.cmdout.a.shared.{r.command_id}.stdout.0"
        for subject, asked in (  # refused by the server: reaching nobody, answered by nobody
            ("ws.exec.a.shared.output", body),
            (f"$JS.API.DIRECT.GET.{STREAM_OUTPUT}.{output}", b""),
            (f"$JS.API.STREAM.MSG.GET.{STREAM_OUTPUT}", {"last_by_subj": output}),
            (f"$JS.API.STREAM.INFO.{STREAM_OUTPUT}", b""),
        ):
            await refused(nb, refusals, subject, asked)
        for escape in ("*", ">", f"a.shared.{r.command_id}", "../a/shared"):
            answers[f"id {escape}"] = await ask(
                nb, "ws.exec.b.shared.output", {"command_id": escape}
            )
        assert answers["own workspace"] is not None
        assert answers["own workspace"]["error"]["code"] == "FILE_NOT_FOUND"
        for what, answer in answers.items():
            assert marker not in json.dumps(answer), what
            if what.startswith("id "):
                assert answer is not None and not answer["ok"], (what, answer)
        # what a runs now is not streamed to b's subscriptions either
        again = await wa.exec(f"echo {marker} again")
        assert again.output_kept
        await nb.flush()
        for subscribed in ("ws.cmdout.>", f"ws.cmdout.a.shared.{r.command_id}.>"):
            await refusals.wait("subscription", subscribed)  # both subscriptions were refused
        assert not leaked
