"""``infra.storage``: sizes, the limit's arithmetic, what counts as "full"."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

import pytest

from contracts.errors import ErrorCode
from infra.storage import (
    EXECUTOR_BUDGET,
    MIB,
    MIN_RESERVE,
    STORAGE_FULL,
    FullState,
    Limit,
    default_reserve,
    disk_full,
    executor_share,
    is_disk_full,
    is_log_full,
    jetstream_limit,
    log_full,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "size"),
    [("1048576", MIB), ("512MiB", 512 * MIB), ("20GB", 20 * 10**9), ("1.5k", 1500), ("0", 0)],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MiB", "-1MB", "12 parsecs", "1e999999GB", "1;rm"])
def test_not_sizes(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_the_limit_is_the_disk_less_the_reserve_at_most_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "jetstream"
    (store / "x").mkdir(parents=True)
    (store / "x" / "blk").write_bytes(b"a" * 1000)
    # the disk as it is now, for every measure: other processes write to it meanwhile
    now = os.statvfs(tmp_path)
    monkeypatch.setattr("infra.storage.os.statvfs", lambda path: now)
    free_limit = jetstream_limit(store, reserve=0)
    assert free_limit >= 1000
    assert jetstream_limit(store, reserve=10 * MIB) == free_limit - 10 * MIB
    assert jetstream_limit(store, reserve=0, cap=5 * MIB) == 5 * MIB
    # a store that does not exist yet: measured on the nearest existing parent
    assert jetstream_limit(tmp_path / "not" / "yet", reserve=0) > 0
    # a reserve larger than the disk: the least the server starts with, writes refused
    assert jetstream_limit(store, reserve=2**62) == MIB


def test_an_executor_sharing_the_logs_disk_keeps_the_logs_room_free(tmp_path: Path) -> None:
    """Its reserve: the room the log was promised plus the log's reserve; its budget: half of
    the free space beyond that, shared between the executors, at most EXECUTOR_BUDGET."""
    store = tmp_path / "jetstream"
    store.mkdir()
    (store / "blk").write_bytes(b"a" * 1000)
    limit = Limit(store, reserve=10 * MIB, cap=20 * MIB, fraction=0.5)
    limit.start()
    reserve, budget = executor_share([limit], executors=1)
    room = limit.limit - 1000
    assert reserve == 10 * MIB + room
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    assert abs(budget - min(EXECUTOR_BUDGET, (free - reserve) // 2)) < MIB
    shared = executor_share([limit], executors=4)[1]
    assert abs(shared - min(EXECUTOR_BUDGET, (free - reserve) // 2 // 4)) < MIB
    full = Limit(store, reserve=2**50)  # a reserve larger than the disk: no budget
    full.start()
    assert executor_share([full])[1] == 0


def test_the_default_reserve() -> None:
    assert default_reserve(100 * MIB) == MIN_RESERVE
    assert default_reserve(100_000 * MIB) == 5_000 * MIB


def test_what_counts_as_the_log_full() -> None:
    class Api(Exception):
        def __init__(self, err_code: int, description: str) -> None:
            super().__init__(description)
            self.err_code, self.description = err_code, description

    assert is_log_full(Api(10023, "insufficient resources"))
    assert is_log_full(Api(10047, "insufficient storage resources available"))
    assert not is_log_full(Api(10071, "wrong last sequence: 3"))
    assert not is_log_full(TimeoutError())
    error = log_full("insufficient resources")
    assert error.code == ErrorCode.STORAGE_FULL and not error.retriable
    assert error.details == {"service": "log"}


def test_what_counts_as_a_disk_full() -> None:
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(sqlite3.OperationalError("database or disk is full"))
    assert not is_disk_full(OSError(errno.ENOENT, "gone"))
    assert not is_disk_full(sqlite3.OperationalError("no such table: x"))
    error = disk_full("reader", "reader.db")
    assert error.details == {"service": "reader"} and "reader" in error.message


def test_the_state_and_its_gauge() -> None:
    state = FullState("executor")
    assert STORAGE_FULL.labels("executor")._value.get() == 0
    state.mark("no space left on device")
    assert state.full and state.info() == {"storage_full": "no space left on device"}
    assert STORAGE_FULL.labels("executor")._value.get() == 1
    state.clear()
    assert not state.full and state.info() == {}
    assert STORAGE_FULL.labels("executor")._value.get() == 0


@pytest.mark.parametrize("command", [["up"], ["cluster", "up"], ["cluster", "render"]])
@pytest.mark.parametrize("value", ["lots", "-5GB", "1e400", "12 MB; rm -rf /"])
def test_the_cli_refuses_a_size_that_is_not_one(command: list[str], value: str) -> None:
    """Refused while parsing (exit 2, naming the option), before anything starts."""
    from click.testing import CliRunner

    from quill_cli.cli import main

    result = CliRunner().invoke(main, [*command, "--log-max-bytes", value])
    assert result.exit_code == 2, result.output
    assert "--log-max-bytes" in result.output and "not a size" in result.output


def test_render_writes_the_limit(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from quill_cli.cli import main

    out = tmp_path / "deploy"
    args = ["cluster", "render", "--out", str(out), "--log-max-bytes", "20GB"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "max_file_store: 20000000000" in (out / "nats" / "nats-1.conf").read_text()


def test_the_limit_grows_with_the_room_not_with_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log's own growth leaves the room as it is; others' growth lowers nothing; the disk
    growing raises it by the fraction; the cap bounds it."""
    from infra import storage

    disk = {"used": 0, "free": 1000 * MIB, "total": 1000 * MIB}
    monkeypatch.setattr(storage, "measure", lambda _: (disk["used"], disk["free"], disk["total"]))
    limit = storage.Limit(tmp_path, reserve=100 * MIB, fraction=0.5)
    assert limit.start() == 450 * MIB
    disk.update(used=300 * MIB, free=700 * MIB)  # the log grew
    assert limit.grown() is None
    disk.update(free=500 * MIB)  # the services' data grew
    assert limit.grown() is None and limit.limit == 450 * MIB
    assert limit.danger() is False
    disk.update(free=40 * MIB)  # the disk fills under the limit: under half the reserve
    assert limit.danger() is True
    disk.update(free=900 * MIB, total=1400 * MIB)  # room 1200 MiB: 200 more than at start
    assert limit.grown() == 450 * MIB + 100 * MIB
    limit.cap = 500 * MIB
    disk.update(free=1300 * MIB, total=1800 * MIB)
    assert limit.grown() is None and limit.limit == 550 * MIB  # never lowered by the cap


@pytest.mark.parametrize(
    ("jsz", "full"),
    [
        ({"storage": 100, "config": {"max_storage": 100}}, True),
        ({"storage": 99, "config": {"max_storage": 100}}, False),
        ({"storage": 5, "config": {"max_storage": -1}}, False),
        ({"no": "storage"}, False),  # a server that says something else: nothing of the disk
    ],
)
async def test_cluster_health_says_a_full_server(jsz: dict[str, object], full: bool) -> None:
    """``quill cluster health nats``'s reading of the server's /jsz (a fake monitor port)."""
    import asyncio
    import json

    from quill_cli.cluster import _storage_full

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\n\r\n" + json.dumps(jsz).encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        why = await _storage_full(port, 2.0)
    assert (why is not None) == full
    if full:
        assert why is not None and "storage full" in why
