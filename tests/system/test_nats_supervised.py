"""A NATS server of ``quill cluster up`` killed with ``kill -9`` is started again by the launcher's
supervisor, writes resume and no acknowledged write is lost; its output is the launcher's to
keep (``quill_cli.serverlog``: 0600, capped), as under ``quill up`` (``test_supervisor.py``).

The short version runs the ``Cluster`` API with one server; ``-m slow`` runs ``quill cluster up``
(three servers) as a process and kills one of them by its pid in ``stack.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from quill.client import Quill, Workspace
from quill_cli.cluster import Cluster
from tests.helpers import eventually, eventually_sync
from tests.system.test_supervisor import alive, readable, writes_through
from tests.up import Up


async def kill_during_writes(
    ws: Workspace, kill: Callable[[], None], back: Callable[[], int | None]
) -> dict[str, str]:
    """Write all along; ``kill()``; wait for ``back()`` (the new pid); more writes; every
    acknowledged one read back. The acknowledged writes."""
    acked: dict[str, str] = {}
    stop = asyncio.Event()
    writer = asyncio.create_task(writes_through(ws, acked, stop))
    try:
        await eventually(lambda: len(acked) >= 20, 60, "writes before")
        kill()
        counted = len(acked)
        await asyncio.to_thread(eventually_sync, back, 60, "the server started again")
        await eventually(lambda: len(acked) >= counted + 20, 60, "writes after")
    finally:
        stop.set()
        await writer
    await readable(ws, list(acked)[-1])
    for path, text in acked.items():
        assert await ws.read_text(path) == text, path
    return acked


def private(log: Path) -> None:
    assert stat.S_IMODE(log.stat().st_mode) == 0o600, log
    assert log.stat().st_size < 16 * 1024 * 1024


async def test_a_cluster_server_killed_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUILL_RESTART_BACKOFF", "0.2,1")
    small = Cluster(tmp_path, nats=1, writers=1, readers=1, executors=0, partitions=4)
    async with small:
        server = small.child("nats-1")
        first = server.pid
        assert first is not None
        quill = await Quill.connect(small.nats_urls, timeout=5, retries=0)
        try:
            ws = quill.workspace("acme/nats-killed")
            await ws.create()
            await kill_during_writes(
                ws,
                lambda: os.kill(first, signal.SIGKILL),
                lambda: server.pid if server.pid != first and server.alive() else None,
            )
        finally:
            await quill.close()
        assert small.supervisor is not None
        assert small.supervisor.watches["nats-1"].restarts == 1
        private(small.data_dir / "logs" / "nats-1.log")


@pytest.mark.slow
async def test_a_server_of_quill_cluster_up_killed_is_started_again(tmp_path: Path) -> None:
    up = Up(tmp_path / ".quill", ("--executors", "0"), command=("cluster", "up"))
    up.start()
    try:

        def pids() -> dict[str, int]:
            record = json.loads((up.data / "stack.json").read_text())
            return {p["name"]: int(p["pid"]) for p in record["processes"]}

        before = pids()
        quill = await Quill.connect(up.nats_url.split(","), timeout=5, retries=0)
        try:
            ws = quill.workspace("acme/nats-2-killed")
            await ws.create()
            await kill_during_writes(
                ws,
                lambda: os.kill(before["nats-2"], signal.SIGKILL),
                lambda: p if (p := pids()["nats-2"]) != before["nats-2"] and alive(p) else None,
            )
        finally:
            await quill.close()
        after = pids()
        assert {k: v for k, v in after.items() if k != "nats-2"} == {
            k: v for k, v in before.items() if k != "nats-2"
        }
        for name in ("nats-1", "nats-2", "nats-3"):
            private(up.data / "logs" / f"{name}.log")
        assert "quill: nats-2 exited (killed by SIGKILL)" in "".join(up.output)
    finally:
        up.stop()
