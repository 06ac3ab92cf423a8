"""A full disk under a real ``quill up``: a named state that ends when space returns.

``quill up --data`` on a small tmpfs; 200 KB files until the log refuses one; the refusal is
``STORAGE_FULL`` (not retriable, naming the log), ``/health`` answers 503 with the reason and
the gateway's ``quill_storage_full{service="log"}`` is 1; the tmpfs is grown (remount) and
writes go through again within a bounded wait, with nothing restarted (the same pids), and
every acknowledged write reads back. Needs root (``mount``): skipped with the reason elsewhere.
The short run (a 100 MB disk) always runs; ``-m slow`` fills 300 MB.

And a disk filled from outside to its last byte (issue 28): JetStream's real ``ENOSPC``, the
launcher restarting nats-server with a lower limit, nats-server's log unwritable, its
configuration unwritable: once the space is freed the whole stack serves again by itself, every
acknowledged write is there, and no service was restarted. Before, the launcher's reader of
the server's output died on the full disk, and the restarted server never answered again.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill, Workspace
from tests.helpers import eventually, mount_tmpfs
from tests.up import Up

FILE_CHARS = 200_000
"""Each file: 200 KB of text that never repeats (no dedup helps)."""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs at ``tmp_path/disk``, unmounted after the test (lazily: a process may linger)."""
    disk = tmp_path / "disk"
    why = mount_tmpfs(disk, "100m")
    if why is not None:
        print(f"skipped: {why}")
        pytest.skip(why)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _grow(disk: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


def _health(http_url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"{http_url}/health", timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _metric(http_url: str, line_start: str, path: str = "/metrics") -> float | None:
    with urllib.request.urlopen(f"{http_url}{path}", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(line_start):
                return float(line.rsplit(" ", 1)[1])
    return None


def _rest_put(http_url: str, path: str, text: str) -> int:
    """PUT a file through the REST API (no tokens: workspace ``default/default``): its
    status."""
    body = json.dumps({"content": text}).encode()
    request = urllib.request.Request(
        f"{http_url}/v1/host/workspace/files/{path}",
        data=body,
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _content() -> str:
    return os.urandom(FILE_CHARS // 2).hex()


async def _fill(ws: Workspace, acked: dict[str, str], most: int) -> QuillError:
    """Write files until one is refused; the refusal."""
    for i in range(most):
        content = _content()
        try:
            await ws.write(f"fill/{i}.txt", content)
        except QuillError as exc:
            return exc
        acked[f"fill/{i}.txt"] = content
    raise AssertionError(f"{most} files of 200 KB were all accepted: the disk never filled")


def _pids(up: Up) -> set[int]:
    record = json.loads((up.data / "stack.json").read_text())
    pids = {int(record["pid"])}
    out = subprocess.run(["pgrep", "-P", str(up.process.pid)], capture_output=True, text=True)  # type: ignore[union-attr]
    pids |= {int(p) for p in out.stdout.split()}
    return pids


def _samples(up: Up, role: str) -> dict[str, float]:
    """Every sample of the metrics of the process of ``role`` that stack.json lists."""
    record = json.loads((up.data / "stack.json").read_text())
    (url,) = [p["metrics"] for p in record["processes"] if p["role"] == role]
    with urllib.request.urlopen(url, timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    pairs = (line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))
    return {name: float(value) for name, value in pairs}


def _scrape(up: Up, role: str, line_start: str) -> float | None:
    """A sample of the metrics of the process of ``role`` that stack.json lists."""
    record = json.loads((up.data / "stack.json").read_text())
    (url,) = [p["metrics"] for p in record["processes"] if p["role"] == role]
    return _metric(url, line_start, "")


async def _back_to_normal(up: Up, ws: Workspace, acked: dict[str, str], pids: set[int]) -> None:
    """/health green again, nothing restarted, every acknowledged write as written."""
    await eventually(lambda: _health(up.http_url)[0] == 200, 20, "/health green again")
    assert _pids(up) == pids, "a process was restarted"
    for path, content in acked.items():
        assert (await ws.read(path)).content == content, path


async def _full_and_back(disk: Path, grow_to: str, most: int) -> None:
    up = Up(disk / "q").start()
    try:
        quill = await Quill.connect(up.nats_url, timeout=15, retries=0)
        try:
            ws = quill.workspace("acme/full")
            await ws.create(exist_ok=True)
            await quill.workspace("default/default").create(exist_ok=True)  # REST's
            before = _pids(up)
            acked: dict[str, str] = {}
            refused = await _fill(ws, acked, most)
            assert refused.code == ErrorCode.STORAGE_FULL, refused
            assert refused.details.get("service") == "log"
            assert not refused.retriable
            assert "full" in refused.message and "docs/operations.md" in refused.message
            assert acked, "nothing was accepted before the disk filled"

            await eventually(lambda: _health(up.http_url)[0] == 503, 20, "/health turns red")
            status, body = _health(up.http_url)
            assert body["status"] == "storage_full"
            assert [f["service"] for f in body["storage_full"]] == ["log"]  # type: ignore[index, union-attr]
            assert _metric(up.http_url, 'quill_storage_full{service="log"}') == 1.0
            writer = _samples(up, "writer")
            refused = [v for k, v in writer.items() if 'outcome="STORAGE_FULL"' in k]
            assert sum(refused) >= 1, "the writer did not count the refused writes"
            limit = _scrape(up, "launcher", "quill_jetstream_storage_limit_bytes")
            conf = (up.data / "nats" / "nats-server.conf").read_text()
            assert limit == float(re.search(r"max_file_store: (\d+)", conf)[1])  # type: ignore[index]
            # the other front doors, while full: the CLI's exit status, REST's 507
            big = disk.parent / "big.txt"
            big.write_text(_content())
            cli = up.cli("put", "acme/full", "cli.txt", str(big), check=False)
            assert cli.returncode == 9 and "STORAGE_FULL" in cli.stderr, cli
            assert _rest_put(up.http_url, "rest.txt", _content()) == 507

            _grow(disk, grow_to)

            async def writes() -> bool:
                content = _content()
                try:
                    await ws.write("after-grow.txt", content)
                except QuillError as exc:
                    assert exc.code == ErrorCode.STORAGE_FULL, exc  # nothing else meanwhile
                    return False
                acked["after-grow.txt"] = content
                return True

            await eventually(writes, 30, "writes resume after the disk grew")
            for i in range(5):
                content = _content()
                await ws.write(f"more/{i}.txt", content)
                acked[f"more/{i}.txt"] = content
            await _back_to_normal(up, ws, acked, before)
            raised = _scrape(up, "launcher", "quill_jetstream_storage_limit_bytes")
            assert raised is not None and raised > limit, "the limit's gauge did not rise"
            assert _metric(up.http_url, 'quill_storage_full{service="log"}') == 0.0
        finally:
            await quill.close()
    finally:
        up.stop()


async def test_log_full_is_named_and_ends_when_the_disk_grows(small_disk: Path) -> None:
    await _full_and_back(small_disk, "200m", most=1000)


@pytest.mark.slow
async def test_log_full_on_a_bigger_disk(small_disk: Path) -> None:
    _grow(small_disk, "300m")
    await _full_and_back(small_disk, "600m", most=3000)


@pytest.fixture
def reader_disk(tmp_path: Path) -> Iterator[Path]:
    """``quill up``'s data directory, its reader's own directory a small tmpfs."""
    data = tmp_path / "q"
    why = mount_tmpfs(data / "reader", "16m")
    if why is not None:
        print(f"skipped: {why}")
        pytest.skip(why)
    try:
        yield data
    finally:
        subprocess.run(["umount", "-l", str(data / "reader")], check=False)


async def test_a_readers_full_disk_is_named_and_ends_when_it_grows(reader_disk: Path) -> None:
    """The reader's projection cannot take the log: it says so (ping, /health, the metric),
    does not crash, and catches up by itself once its disk grows; writes go on meanwhile."""
    up = Up(reader_disk).start()
    try:
        quill = await Quill.connect(up.nats_url, timeout=15, retries=0)
        try:
            ws = quill.workspace("acme/reader-full")
            await ws.create(exist_ok=True)
            before = _pids(up)
            acked: dict[str, str] = {}

            def reader_full() -> bool:
                status, body = _health(up.http_url)
                full = body.get("storage_full") or []
                return status == 503 and any(f["service"] == "reader" for f in full)  # type: ignore[index, union-attr]

            for i in range(400):  # 50 KB each: inline in the events, so in reader.db
                content = os.urandom(25_000).hex()
                await ws.write(f"inline/{i}.txt", content)  # the log takes them all
                acked[f"inline/{i}.txt"] = content
                if i % 20 == 19 and reader_full():
                    break
            await eventually(reader_full, 20, "/health names the reader's full disk")
            assert _metric(up.http_url, 'quill_storage_full{service="reader"}') == 1.0
            with pytest.raises(QuillError) as refused:
                await ws.read(list(acked)[-1])
            assert refused.value.code in (ErrorCode.UNAVAILABLE, ErrorCode.STORAGE_FULL)
            assert "disk is full" in refused.value.message, refused.value

            _grow(reader_disk / "reader", "200m")

            async def reads() -> bool:
                try:
                    got = await ws.read(list(acked)[-1])
                except QuillError:
                    return False
                return got.content == list(acked.values())[-1]

            await eventually(reads, 30, "the reader catches up after its disk grew")
            await _back_to_normal(up, ws, acked, before)
        finally:
            await quill.close()
    finally:
        up.stop()


def _stack_pids(up: Up) -> dict[str, int]:
    record = json.loads((up.data / "stack.json").read_text())
    return {p["name"]: int(p["pid"]) for p in record["processes"]}


def _fill_to_the_last_byte(disk: Path) -> Path:
    """A host file taking every free block of ``disk`` (as root: no reserve stops it)."""
    hog = disk / "hog"
    with open(hog, "wb") as out:
        for chunk in (1024 * 1024, 4096):  # MiBs, then the last pages
            while True:
                try:
                    os.posix_fallocate(out.fileno(), os.fstat(out.fileno()).st_size, chunk)
                except OSError:
                    break
    return hog


async def test_a_disk_full_to_the_last_byte_serves_again_once_freed(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUILL_RESTART_BACKOFF", "0.2,2")
    up = Up(small_disk / "q", args=("--sandbox", "local")).start()
    try:
        quill = await Quill.connect(up.nats_url, timeout=5, retries=0)
        try:
            ws = quill.workspace("acme/last-byte")
            await ws.create()
            acked = {f"before/{i}.txt": f"before {i}\n" for i in range(10)}
            for path, text in acked.items():
                await ws.write(path, text)
            before = _stack_pids(up)
            hog = _fill_to_the_last_byte(small_disk)

            async def refused() -> bool:
                return not await _took(ws, acked, "during.txt", "during\n")

            await eventually(refused, 30, "a write refused on the full disk")
            # the launcher sees the disk full under the log's limit and restarts the server
            # (the only way out of JetStream's sticky write error), which cannot start on the
            # full disk (its configuration, its log, its store): it stays down, retried
            await eventually(lambda: _refuses(up.nats_url), 30, "nats-server down on the full disk")
            hog.unlink()

            async def writes() -> bool:
                return await _took(ws, acked, "after.txt", "after\n")

            await eventually(writes, 60, "writes resume once the disk is freed")
            for i in range(5):
                await ws.write(f"more/{i}.txt", f"more {i}\n")
                acked[f"more/{i}.txt"] = f"more {i}\n"

            async def reads() -> bool:
                try:
                    return await ws.read_text("more/4.txt") == "more 4\n"
                except QuillError:
                    return False

            await eventually(reads, 60, "reads resume")
            for path, text in acked.items():
                assert await ws.read_text(path) == text, path
            after = _stack_pids(up)
            services = ("writer", "reader", "executor", "gateway", "launcher")
            assert {s: after[s] for s in services} == {s: before[s] for s in services}
            assert Path(f"/proc/{after['nats']}/exe").resolve().name == "nats-server"
            assert _health(up.http_url)[0] == 200
        finally:
            await quill.close()
    finally:
        up.stop()


async def _took(ws: Workspace, acked: dict[str, str], path: str, text: str) -> bool:
    """Whether ``ws`` took the write of ``text`` at ``path`` (then kept in ``acked``, to read
    back) or refused it."""
    try:
        await ws.write(path, text)
    except QuillError:
        return False
    acked[path] = text
    return True


def _refuses(nats_url: str) -> bool:
    """Whether nothing listens at ``nats_url`` (the server is down)."""
    address = urllib.parse.urlsplit(nats_url)
    try:
        socket.create_connection((address.hostname, address.port), timeout=1).close()
    except OSError:
        return True
    return False
