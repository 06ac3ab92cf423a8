"""Every tool at size (issue 11): replay, verify, verify --deep, export, import, compaction and
an executor materialising the compaction, on a workspace of 8,000 files (the 100,000-file,
1,000,000-event figures are ``python -m bench size``, docs/performance.md).

One workspace is built per module, fast: 8,000 files in applies of 4,000 (1,200 of them
named by ``blob``, stored in WS_BLOBS first: more than the server's 1,000 consumers per
stream, which a consumer per blob get used to reach), then one path written until the writer
compacts the whole workspace. The CLI runs as a process whose peak memory is measured.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from contracts import codec
from contracts import requests as rq
from contracts.events import WorkspaceUpdated
from contracts.limits import LimitsPatch
from contracts.subjects import Subjects
from infra.blobs import Blobs
from quill.client import Quill, Workspace
from quill_cli.natsserver import NatsServer
from services.executor.app import ExecutorConfig
from tests.helpers import start_executor, start_reader, start_writer

# The module's fixture builds 8,000 files and waits for their compaction: on a loaded
# 2-core machine that took past the default 120 s guard (a guard against a hang, not a
# measure: the figures are bench size's).
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(400)]

FILES = 8_000
BLOB_FILES = 1_200
BATCH = 4_000
MEMORY_MB = 400
"""Most a CLI process may hold at its peak (resident), here where the tree is 8,000 files."""
SUBJECTS = Subjects()


@dataclass
class Big:
    nats_url: str
    quill: Quill
    ws: Workspace
    compacted_at: int


def content(n: int) -> bytes:
    return f"file {n}\n".encode() * (1 + n % 5)


async def build(quill: Quill, name: str) -> tuple[Workspace, int]:
    """``name`` with ``FILES`` files in 100 directories, then compacted; returns the
    compaction's version."""
    ws = quill.workspace(name)
    await ws.create(limits=LimitsPatch(max_versions=1))
    blobs = Blobs(quill.nc.jetstream()).of(*name.split("/"))
    items: list[rq.ApplyItem] = []
    for n in range(FILES):
        path, data = f"d{n % 100:02}/f{n:05}.txt", content(n)
        if n < BLOB_FILES:
            sha = hashlib.sha256(data).hexdigest()
            await blobs.put(sha, data)
            items.append(rq.PutChange(path=path, blob=sha))
        else:
            items.append(rq.PutChange(path=path, content=data.decode()))
        if len(items) == BATCH:
            await ws.apply(items)
            items = []
    updates = await quill.nc.subscribe(SUBJECTS.updated(ws.tenant, ws.name))
    try:
        async with asyncio.timeout(300):
            for n in range(40):  # max_versions 1 + slack 16: compaction comes within 18
                await ws.write("hot.md", f"write {n}\n")
            async for msg in updates.messages:
                update = codec.decode(msg.data, WorkspaceUpdated)
                if update.op == "compact":
                    return ws, update.version
    finally:
        await updates.unsubscribe()
    raise AssertionError("unreachable")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def big(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Big]:
    root = tmp_path_factory.mktemp("size")
    server = NatsServer(root / "nats").start()
    try:
        async with AsyncExitStack() as stack:
            await start_writer(stack, server.url, root / "writer")
            await start_reader(stack, server.url, root / "r1", instance="r1")
            quill = await Quill.connect(server.url, actor="tester", timeout=60)
            stack.push_async_callback(quill.close)
            ws, compacted_at = await build(quill, "acme/big")
            yield Big(server.url, quill, ws, compacted_at)
    finally:
        server.stop()


async def cli(big: Big, *args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """``quill ARGS`` as a process (stdout and stderr not a terminal); its peak resident
    memory in MiB: its own (``VmHWM``), not ``ru_maxrss``, which a child started by vfork
    inherits from its parent (the test process, hundreds of MiB late in a run)."""
    probe = (
        "import atexit, re, sys\n"
        "atexit.register(lambda: sys.stderr.write('\\nMAXRSS %s\\n' % re.search("
        "r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1)))\n"
        "from quill_cli.cli import main\n"
        "sys.argv = ['quill', *sys.argv[1:]]\n"
        "main()\n"
    )
    env = {**os.environ, "QUILL_NATS_URL": big.nats_url}
    argv = [sys.executable, "-c", probe, *args]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, env=env, timeout=300
    )
    assert "Traceback" not in done.stderr and "never awaited" not in done.stderr, done.stderr
    assert done.returncode == 0, (args, done.stderr)
    peak = int(done.stderr.rsplit("MAXRSS ", 1)[1].split()[0]) // 1024
    assert "\r" not in done.stderr  # no progress bar off a terminal
    return done, peak


async def test_replay_writes_every_file_from_the_compaction(big: Big, tmp_path: Path) -> None:
    out = tmp_path / "tree"
    done, peak = await cli(big, "replay", "acme/big", "--out", str(out))
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) == FILES + 1  # and hot.md
    for n in (0, BLOB_FILES - 1, BLOB_FILES, FILES - 1):
        assert (out / f"d{n % 100:02}/f{n:05}.txt").read_bytes() == content(n)
    assert peak < MEMORY_MB, peak


async def test_verify_and_verify_deep_agree_with_the_replica(big: Big) -> None:
    done, peak = await cli(big, "verify", "acme/big")
    assert "reader r1: ok" in done.stdout, done.stdout
    deep, deep_peak = await cli(big, "verify", "--deep", "--timeout", "60s", "acme/big")
    assert "reader r1: ok" in deep.stdout, deep.stdout
    assert max(peak, deep_peak) < MEMORY_MB, (peak, deep_peak)


async def test_export_and_import_move_the_workspace(big: Big, tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl.gz"
    _, peak = await cli(big, "export", "acme/big", str(path))
    done, import_peak = await cli(big, "--json", "import", str(path), "acme/big-copy")
    assert '"version"' in done.stdout
    copy, original = await big.quill.workspace("acme/big-copy").info(), await big.ws.info()
    assert (copy.version, copy.tree_hash, copy.files) == (
        original.version,
        original.tree_hash,
        original.files,
    )
    assert max(peak, import_peak) < MEMORY_MB, (peak, import_peak)


async def test_an_executor_materialises_the_compacted_workspace(big: Big, tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        await start_executor(stack, big.nats_url, tmp_path / "x", ExecutorConfig(sandbox="local"))
        last = f"d{(FILES - 1) % 100:02}/f{FILES - 1:05}.txt"
        ran = await big.ws.exec(f"find d* -type f | wc -l && cat {last} | head -1")
    assert ran.exit_code == 0, ran.stderr
    assert ran.stdout.split()[:1] == [str(FILES)], ran.stdout
    assert f"file {FILES - 1}" in ran.stdout
