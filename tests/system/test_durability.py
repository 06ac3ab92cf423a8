"""kill -9 of the whole ``quill up`` mid-load, then ``quill up`` again: nothing acknowledged
is lost, the hash chain verifies, and writing resumes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from contracts import hashing
from contracts.errors import QuillError
from quill.client import Quill
from tests.up import Up

WRITERS = 16


async def _load(url: str, acked: list[tuple[str, int, str]], enough: asyncio.Event) -> None:
    quill = await Quill.connect(url, timeout=2, retries=0)
    try:
        ws = quill.workspace("acme/durable")
        await ws.create(exist_ok=True)

        async def writer(n: int) -> None:
            i = 0
            while True:
                path, content = f"w{n}/f{i % 20}.txt", f"writer {n} write {i}\n"
                try:
                    await ws.write(path, content)
                except QuillError:
                    return  # the stack is gone
                acked.append((path, ws.last_version, content))
                if len(acked) >= 400:
                    enough.set()
                i += 1

        await asyncio.gather(*[writer(n) for n in range(WRITERS)])
    finally:
        try:
            await quill.close()
        except Exception:
            pass


async def test_kill_9_mid_load_loses_no_acknowledged_write(tmp_path: Path) -> None:
    up = Up(tmp_path / ".quill").start()
    acked: list[tuple[str, int, str]] = []
    enough = asyncio.Event()
    load = asyncio.create_task(_load(up.nats_url, acked, enough))
    try:
        await asyncio.wait_for(enough.wait(), 60)
        up.kill()  # kill -9 of nats-server, writer and reader, mid-load
        await asyncio.wait_for(load, 30)
    finally:
        up.kill()
    survivors = list(acked)
    assert len(survivors) >= 400

    up.start()  # same data directory
    try:
        quill = await Quill.connect(up.nats_url, timeout=10)
        ws = quill.workspace("acme/durable")
        latest = max(version for _, version, _ in survivors)
        for path, version, content in survivors:
            got = await ws.read(path, version=version)
            assert got.content == content, (path, version)
        # the chain is whole: every event links to the previous one's hash
        prev, after = hashing.ZERO_HASH, 0
        while True:
            page = await ws.events(after=after, limit=1000)
            for event in page.events:
                assert event.prev_hash == prev and event.version == after + 1
                prev, after = event.hash, event.version
            if not page.has_more:
                break
        assert after >= latest
        # and it keeps working
        written = await ws.write("after-restart.txt", "ok")
        assert written.file_version == 1
        await quill.close()
    finally:
        code = up.stop()  # SIGTERM, as Ctrl-C: a clean stop removes the record of the stack
    assert code == 0 and not (tmp_path / ".quill" / "stack.json").exists()
