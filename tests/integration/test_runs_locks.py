"""Runs (RFC 0059 §D: a read snapshot per run), locks between sessions, trust changes: all
recorded as events."""

from __future__ import annotations

import asyncio

import pytest

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from tests.conftest import StartReader
from tests.helpers import eventually, new_workspace, writer_waiting


async def test_a_run_reads_the_version_it_started_at(services: StartReader, quill: Quill) -> None:
    """The RFC's conformance case: a write in turn i is invisible to turn i and visible to
    turn i + 1, however it was written (by the run itself, or by someone else)."""
    ws = await new_workspace(services, quill, "acme/runs")
    await ws.write("DIRECTIVES.md", "turn 0\n")
    async with ws.run() as turn1:
        assert await turn1.read_text("DIRECTIVES.md") == "turn 0\n"
        await turn1.write("DIRECTIVES.md", "turn 1\n")  # the run's own write
        await ws.write("other.md", "meanwhile\n")  # someone else's
        assert await turn1.read_text("DIRECTIVES.md") == "turn 0\n"
        assert [e.name for e in (await turn1.list()).entries] == ["DIRECTIVES.md"]
        async with turn1.run() as sub:  # a dispatched agent sees the parent's snapshot
            assert sub.started.parent == turn1.id
            assert sub.started.version == turn1.started.version
            assert await sub.read_text("DIRECTIVES.md") == "turn 0\n"
        assert await ws.read_text("DIRECTIVES.md") == "turn 1\n"  # outside the run: latest
    async with ws.run() as turn2:
        assert await turn2.read_text("DIRECTIVES.md") == "turn 1\n"
        assert await turn2.read_text("other.md") == "meanwhile\n"

    seen = await ws.run_info(turn1.id)  # the log tells which version a run saw
    assert seen.version == turn1.started.version and seen.ended_version is not None
    history = await ws.history("DIRECTIVES.md")
    assert history.revisions[0].version > seen.version
    with pytest.raises(QuillError) as info:
        await turn1.write("late.md", "after the end")
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    assert info.value.message.startswith(f"Run {turn1.id} has ended")
    async with ws.run(version=2) as old:  # a run may pin an older version
        assert await old.read_text("DIRECTIVES.md") == "turn 0\n"
    with pytest.raises(QuillError) as info:
        await ws.start_run(turn2.id)
    assert info.value.code == ErrorCode.ALREADY_EXISTS


async def test_locks_between_sessions(services: StartReader, nats_url: str) -> None:
    await services("r1")
    alice = await Quill.connect(nats_url, actor="alice", session="s-alice", retries=0)
    bob = await Quill.connect(nats_url, actor="bob", session="s-bob", retries=0)
    try:
        wa, wb = alice.workspace("acme/locks"), bob.workspace("acme/locks")
        await wa.create()
        held = await wa.lock(ttl_ms=60_000)
        assert held.holder == "s-alice" and held.expires is not None
        with pytest.raises(QuillError) as info:
            await wb.write("b.txt", "bob")
        assert info.value.code == ErrorCode.LOCKED
        assert info.value.details["holder"] == "s-alice"
        await wa.write("a.txt", "alice")  # the holder writes
        wb.last_version = wa.last_version
        assert await wb.read_text("a.txt") == "alice"  # reads are never locked
        with pytest.raises(QuillError):
            await wb.unlock()  # not bob's to release

        bob.wait_ms = 30_000
        late = asyncio.create_task(wb.write("b.txt", "bob waited"))  # waits for the lock
        await writer_waiting(alice.nc, 1)
        await wa.unlock()
        await asyncio.wait_for(late, 30)
        bob.wait_ms = 0
        wa.last_version = wb.last_version
        assert await wa.read_text("b.txt") == "bob waited"

        await wb.lock(ttl_ms=1000)  # expires on its own

        async def written() -> bool:
            try:
                await wa.write("c.txt", "after the expiry")
            except QuillError as exc:
                assert exc.code == ErrorCode.LOCKED
                return False
            return True

        await eventually(written, 10, "a write once the lock expired")
        kinds = [e.type for e in (await wa.events()).events]
        assert kinds.count("lock_acquired") == 2 and kinds.count("lock_released") == 1
        with pytest.raises(QuillError) as info:
            await Quill(alice.nc).workspace("acme/locks").lock()  # no session
        assert info.value.message.startswith("A lock is held by a session")
    finally:
        await alice.close()
        await bob.close()


async def test_trust_changes_are_events(services: StartReader, quill: Quill) -> None:
    ws = await new_workspace(services, quill, "acme/trust")
    assert (await ws.set_trust("restricted")).changed
    assert not (await ws.set_trust("restricted")).changed
    assert (await ws.info()).trust == "restricted"
    assert (await ws.events()).events[-1].type == "trust_changed"
    assert (await ws.set_trust("full")).changed
