"""Live commands (``exec.run`` with ``yield_ms``) are their tenant's and workspace's alone, and
bounded.

Tenant a starts a command that waits for input. Tenant b, a bare nats-py client with its own
credentials and a's command id, polls it, feeds it and signals it on its own workspace: each
gets the very error a made-up id gets (``COMMAND_NOT_FOUND``, no oracle) and nothing reaches
a's command (a feeds it afterwards and reads back exactly what a sent). b publishing on the
services' forwarding subject (``ws.exechold.…``) or asking every executor for a's list
(``ws.execlist.…``) is refused by the server. Input to an ended command is refused
(``COMMAND_ENDED``). A flood of live commands past the tenant's limit is refused before any
runs (in-process executor with ``tenant_live=2``)."""

from __future__ import annotations

import json

import pytest

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from tests.executor.conftest import StartExecutor, provider, stack  # noqa: F401
from tests.helpers import ask, error_shape, refused
from tests.up import TENANTS, Up, a_against_b

pytestmark = pytest.mark.up(tenants=TENANTS)

MADE_UP = "c0123456789abMadeUpHandle0"


async def test_another_tenants_handle_is_unknown_and_does_nothing(up: Up) -> None:
    async with a_against_b(up) as (wa, nb, refusals):
        r = await wa.exec("read x; echo got:$x", yield_ms=200)
        assert r.running
        handle = r.command_id
        bodies = {
            "poll": {"command_id": handle},
            "input": {"command_id": handle, "data": "ZXZpbAo=", "eof": True},  # "evil\n"
            "signal": {"command_id": handle, "signal": "KILL"},
        }
        for op, body in bodies.items():
            foreign = await ask(nb, f"ws.exec.b.shared.{op}", body, timeout=5)
            made_up = await ask(
                nb, f"ws.exec.b.shared.{op}", {**body, "command_id": MADE_UP}, timeout=5
            )
            assert error_shape(foreign, handle) == error_shape(made_up, MADE_UP)
            assert error_shape(foreign, handle)[0] == "COMMAND_NOT_FOUND"
            await refused(nb, refusals, f"ws.exec.a.shared.{op}", body)  # a's subject
        # the services' own subjects: refused by the server, nothing delivered
        route = handle[1:13]
        await nb.publish(
            f"ws.exechold.{route}.a.shared.input",
            json.dumps(bodies["input"]).encode(),
            reply=nb.new_inbox(),
        )
        await nb.publish("ws.execlist.a.shared", b"", reply=nb.new_inbox())
        await nb.flush()
        await refusals.wait("publish", f"ws.exechold.{route}.a.shared.input")
        await refusals.wait("publish", "ws.execlist.a.shared")
        assert (await wa.running()).commands[0].stdin_open  # nobody closed its stdin
        cmd = wa.command(handle)
        await cmd.input("mine\n", eof=True)
        done = await cmd.wait()
        assert (done.stdout, done.exit_code) == ("got:mine\n", 0)  # none of b's input, no KILL
        with pytest.raises(QuillError) as ended:
            await cmd.input("late\n")
        assert ended.value.code == ErrorCode.COMMAND_ENDED
        after = await ask(nb, "ws.exec.b.shared.input", bodies["input"], timeout=5)
        assert error_shape(after, handle)[0] == "COMMAND_NOT_FOUND"  # ended or not: unknown to b


async def test_a_flood_of_live_commands_is_refused_past_the_limit(
    stack: StartExecutor,  # noqa: F811
    quill: Quill,
) -> None:
    await stack(tenant_live=2, max_runs=8, tenant_runs=8)
    names = [f"acme/flood-{n}" for n in range(4)]
    for name in names:
        await quill.workspace(name).create(exist_ok=True)
    first = [await quill.workspace(n).exec("read x", yield_ms=100) for n in names[:2]]
    assert all(r.running for r in first)
    for name in names[2:]:
        with pytest.raises(QuillError) as refused:
            await quill.workspace(name).exec("echo ran > ran.txt; read x", yield_ms=100)
        assert refused.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED
        assert refused.value.details["max_live_commands"] == 2
        with pytest.raises(QuillError) as missing:  # it never ran
            await quill.workspace(name).read("ran.txt")
        assert missing.value.code == ErrorCode.FILE_NOT_FOUND
    for name, r in zip(names, first, strict=False):
        cmd = quill.workspace(name).command(r.command_id)
        await cmd.input(eof=True)
        assert (await cmd.wait()).exit_code == 1
    again = await quill.workspace(names[2]).exec("true", yield_ms=100)  # room again once ended
    assert again.exit_code == 0
