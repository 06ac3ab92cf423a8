"""JetStream's storage limit is Quill's (``quill_cli.natsserver``, ``infra.storage``): set at
start, raised while the server runs by a reload (no restart), never lowered; a write over it is
refused cleanly (err_code 10023) and goes through once the limit is raised."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from infra.storage import MIB, is_log_full
from quill_cli.natsserver import NatsServer
from tests.helpers import eventually, eventually_sync

PAYLOAD = b"x" * 200_000


@pytest.fixture
def small_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats", log_max_bytes=4 * MIB, watch=False).start()
    try:
        yield server
    finally:
        server.stop()


async def _publish(nc: nats.NATS) -> dict[str, object]:
    reply = await nc.request("full.x", PAYLOAD, timeout=5)
    ack: dict[str, object] = json.loads(reply.data)
    return ack


async def test_the_limit_is_raised_by_a_reload_without_a_restart(
    small_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    assert "max_file_store: 4194304" in (small_server.data_dir / "nats-server.conf").read_text()
    nc = await nats.connect(small_server.url)
    try:
        await nc.jetstream().add_stream(name="FULL", subjects=["full.>"])
        for _ in range(100):
            ack = await _publish(nc)
            if "error" in ack:
                break
        else:
            raise AssertionError("100 writes of 200 KB went through a 4 MiB limit")
        error = ack["error"]
        assert isinstance(error, dict) and error["err_code"] == 10023
        assert is_log_full(Exception(error["description"]))
        pid = small_server.process.pid  # type: ignore[union-attr]

        small_server.limits.cap = 16 * MIB
        with caplog.at_level(logging.INFO, logger="quill_cli.natsserver"):
            assert small_server.raise_limit()
        raised = [r for r in caplog.records if "raising JetStream's storage" in r.getMessage()]
        assert [r.levelno for r in raised] == [logging.INFO]  # routine, not a warning

        async def accepted() -> bool:
            return "error" not in await _publish(nc)

        await eventually(accepted, 10, "a write accepted after the reload")
        assert small_server.process.pid == pid  # type: ignore[union-attr]

        async def logged() -> bool:  # nats-server logs a reload after it applied it
            return "Reloaded: JetStream max_file_store" in small_server.log_path.read_text()

        await eventually(logged, 10, "the server's log of the reload")
    finally:
        await nc.close()


def test_the_limit_never_goes_down(small_server: NatsServer) -> None:
    """nats-server refuses a reload that lowers max_file_store: it is never asked to."""
    small_server.limits.cap = 2 * MIB
    assert not small_server.raise_limit()
    assert small_server.limit == 4 * MIB
    small_server.limits.cap = 4 * MIB + 1000  # less than a step: no reload for nothing
    assert not small_server.raise_limit()


def test_a_disk_filling_under_the_limit_restarts_the_server_below_it(tmp_path: Path) -> None:
    """Something else takes the disk (a file here): before JetStream meets the disk's end
    (a write error it keeps until restarted), the watcher restarts the server with a limit at
    what it holds; writes are then refused cleanly, and the server answers."""
    import os
    import subprocess

    if os.geteuid() != 0:
        print("skipped: mounting a tmpfs needs root")
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)])
    if mounted.returncode != 0:
        pytest.skip("mount refused")
    try:
        server = NatsServer(disk / "nats", disk_reserve=8 * MIB).start()
        try:
            first_pid, limit = server.process.pid, server.limit  # type: ignore[union-attr]
            (disk / "other").write_bytes(b"\0" * (61 * MIB))  # leaves about 3 MiB free
            eventually_sync(
                lambda: server.process is not None and server.process.pid != first_pid,
                20,
                "the server restarted",
            )
            assert server.limit < limit

            async def refused() -> dict[str, object]:
                nc = await nats.connect(server.url)
                try:
                    await nc.jetstream().add_stream(name="FULL", subjects=["full.>"])
                    for _ in range(10):  # 2 MB at most: the disk has about 3 MiB
                        if "error" in (ack := await _publish(nc)):
                            return ack
                    raise AssertionError("10 writes of 200 KB went through")
                finally:
                    await nc.close()

            error = asyncio.run(refused())["error"]
            assert isinstance(error, dict) and error["err_code"] == 10023, error
        finally:
            server.stop()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
