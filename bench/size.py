"""Size (``python -m bench size``): every tool on a workspace of 100,000 files and 1,000,000
events, each as its own process, its time and peak memory (resident, VmHWM) printed next to
a baseline measured in the same run.

The log is made here, on a bare nats-server: a workspace created, 100,000 files written 100
per event (2,000 of them with their content in WS_BLOBS), then single-file writes round
robin until the log holds 1,000,000 events, each a writer-shaped event with its hash chain and
tree hash, appended in atomic batches (``--files`` and ``--events`` make it smaller). Then, as
processes: ``quill replay``, a reader replica catching up, ``quill verify`` and ``verify
--deep``, ``quill export`` and ``import``, a writer that compacts the whole workspace (its
``max_versions`` is due after a few more writes), an executor materialising the compaction,
and ``quill replay`` from the compaction. Baselines: reading the raw messages of the log (an
ordered consumer that only counts them), and ``tar`` of the replayed tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import msgspec
import nats

from bench.replay import raw_read
from bench.synthetic import BATCH, SUBJECTS, chained
from contracts.errors import ErrorCode, QuillError
from contracts.events import AnyChange, MakeDir, PutFile
from contracts.limits import DEFAULT_LIMITS
from core.tree import Tree, apply_change
from infra import bus
from infra.blobs import Blobs
from infra.compaction import slack
from quill.client import Quill
from quill.workspace import Workspace
from quill_cli.natsserver import NatsServer
from quill_cli.tools import replay as rpl

FILES = 100_000
EVENTS = 1_000_000
BLOB_EVERY = 50
"""One file in this many has its content in WS_BLOBS."""
PER_EVENT = 100
MAX_VERSIONS = 5
PROBE = (  # VmHWM: the process's own peak (ru_maxrss after a vfork counts the parent's)
    "import atexit, re, sys\n"
    "atexit.register(lambda: sys.stderr.write('\\nMAXRSS %s\\n' % re.search("
    "r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1)))\n"
    "sys.argv = [sys.argv[1], *sys.argv[2:]]\n"
    "if sys.argv[0] == 'raw':\n"
    "    import asyncio, bench.size as s\n"
    "    asyncio.run(s.raw(sys.argv[1], sys.argv[2], int(sys.argv[3])))\n"
    "else:\n"
    "    from quill_cli.cli import main\n"
    "    main()\n"
)


def content(n: int, version: int) -> bytes:
    return f"file {n} at version {version}\n".encode() * 3


def path_of(n: int) -> str:
    return f"d{n % 1000:03}/f{n:06}.txt"


def synthesise(
    tenant: str, workspace: str, files: int, events: int, max_versions: int | None = MAX_VERSIONS
) -> Iterator[tuple[bytes, str, str, list[tuple[str, bytes]]]]:
    """The log: ``(payload, Nats-Msg-Id, hash, [(sha, content) to store in WS_BLOBS])`` of
    each event, in order."""
    limits = msgspec.structs.replace(
        DEFAULT_LIMITS, max_files=10 * files, max_versions=max_versions
    )
    n = 0
    blobs: list[tuple[str, bytes]] = []

    def apply(tree: Tree, version: int, at: datetime) -> tuple[str, list[AnyChange]]:
        nonlocal n
        changes: list[AnyChange] = []
        for _ in range(PER_EVENT if n < files else 1):
            f = n % files
            data, path = content(f, version), path_of(f)
            parent = path.rsplit("/", 1)[0]
            if parent not in tree.dirs:
                mkdir = MakeDir(path=parent)
                apply_change(tree, mkdir, version, at)
                changes.append(mkdir)
            sha = hashlib.sha256(data).hexdigest()
            fv = tree.last_fv.get(path, 0) + 1
            created = tree.files[path].created if path in tree.files else at
            blob = f % BLOB_EVERY == 0
            if blob:
                blobs.append((sha, data))
            change = PutFile(
                path=path,
                sha256=sha,
                size=len(data),
                file_version=fv,
                created=created,
                text=None if blob else data.decode(),
                blob=blob,
            )
            apply_change(tree, change, version, at)
            changes.append(change)
            n += 1
        return "apply", changes

    for payload, msg_id, prev in chained(tenant, workspace, events, apply, limits):
        yield payload, msg_id, prev, blobs[:]
        blobs.clear()


async def build(
    nc: nats.NATS,
    files: int,
    events: int,
    *,
    name: str = "bench/size",
    max_versions: int | None = MAX_VERSIONS,
) -> float:
    """Append the synthesised log of ``bench/size`` (``synthesise``) as workspace ``name``,
    its large contents in WS_BLOBS; return the seconds it took."""
    await bus.ensure_streams(nc, SUBJECTS)
    tenant, workspace = name.split("/")
    js, subject = nc.jetstream(), SUBJECTS.evt(tenant, workspace)
    blobs = Blobs(js).of(tenant, workspace)
    t0 = time.perf_counter()
    batch: list[tuple[bytes, str, str]] = []
    last = 0
    for payload, msg_id, digest, stored in synthesise(
        tenant, workspace, files, events, max_versions
    ):
        for sha, data in stored:
            await blobs.put(sha, data)
        batch.append((payload, msg_id, digest))
        if len(batch) == BATCH:
            last = await rpl.append_batch(nc, subject, last, batch, 0)
            batch = []
    if batch:
        await rpl.append_batch(nc, subject, last, batch, 0)
    return time.perf_counter() - t0


async def raw(url: str, subject: str, count: int) -> None:
    """The baseline: an ordered consumer receives ``count`` messages of ``subject``."""
    nc = await nats.connect(url)
    await raw_read(nc, subject, count)
    await nc.close()


async def measured(url: str, *args: str) -> tuple[float, int, str]:
    """``measured_`` in a thread: this process's connections keep answering the server."""
    return await asyncio.to_thread(measured_, url, *args)


def measured_(url: str, *args: str) -> tuple[float, int, str]:
    """``quill ARGS`` (or ``raw URL SUBJECT COUNT``) as a process: seconds, peak MiB, stdout."""
    env = {**os.environ, "QUILL_NATS_URL": url}
    argv = [sys.executable, "-c", PROBE, *([] if args[0] == "raw" else ["quill"]), *args]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{args}: {done.stdout[-3000:]} {done.stderr[-2000:]}")
    peak = int(done.stderr.rsplit("MAXRSS ", 1)[1].split()[0]) // 1024
    return took, peak, done.stdout


def hwm(pid: int) -> int:
    """Peak resident MiB of a running process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    return 0


def service(url: str, name: str, data: Path, *more: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "quill", name, "--nats-url", url, "--data", str(data), *more]
    log = open(data.with_suffix(".log"), "wb")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


async def pinged(nc: nats.NATS, what: str, deadline_s: float = 3600) -> float:
    """Seconds until a ``what`` service answers the ping (a reader once caught up)."""
    t0 = time.perf_counter()
    async with asyncio.timeout(deadline_s):
        while not await bus.ping_all(nc, SUBJECTS, what, 0.5):
            pass
    return time.perf_counter() - t0


async def applied(quill: Quill, name: str, version: int) -> float:
    """Seconds until a reader replica answers ``name`` at ``version``."""
    ws, t0 = quill.workspace(name), time.perf_counter()
    ws.last_version = version
    while True:
        try:
            await ws.info()
            return time.perf_counter() - t0
        except QuillError as exc:
            if exc.code not in (ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT):
                raise


@contextlib.contextmanager
def bare_nats(name: str) -> Iterator[tuple[Path, NatsServer, list[subprocess.Popen[bytes]]]]:
    """A scratch directory and a bare nats-server in it, and a list of the service processes
    started on it: all stopped and removed at the end."""
    tmp = Path(tempfile.mkdtemp(prefix=f"quill-bench-{name}-"))
    server = NatsServer(tmp / "nats").start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield tmp, server, procs
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


async def materialised(
    nc: nats.NATS,
    ws: Workspace,
    procs: list[subprocess.Popen[bytes]],
    url: str,
    data: Path,
    what: str,
) -> subprocess.Popen[bytes]:
    """Start an executor on ``data`` (one of ``procs``) and print how long its first command
    took (a checkout of the whole workspace) and its peak memory."""
    executor = service(url, "executor", data, "--sandbox", "local")
    procs.append(executor)
    await pinged(nc, "executor")
    t0 = time.perf_counter()
    ran = await ws.exec("find . -type f | wc -l")
    line(f"executor materialising {what}", time.perf_counter() - t0,
         hwm(executor.pid), f"{ran.stdout.strip()} files")  # fmt: skip
    return executor


def line(label: str, took: float, peak: int | None, base: str) -> None:
    mem = f"{peak:,} MiB" if peak is not None else "-"
    print(f"{label:<40} {took:>9.1f} s {mem:>11}   {base}")


async def main(files: int = FILES, events: int = EVENTS) -> None:
    with bare_nats("size") as (tmp, server, procs):
        nc = await bus.connect(server.url, "bench-size")
        subject = SUBJECTS.evt("bench", "size")
        made = await build(nc, files, events)
        url = server.url
        print(f"Size: {files:,} files, {events:,} events ({files // BLOB_EVERY:,} in WS_BLOBS)")
        print(f"(log synthesised and appended in {made:.0f} s)\n")
        print(f"{'tool (a process each)':<40} {'time':>11} {'peak mem':>11}   baseline")
        raw_s, raw_mb, _ = await measured(url, "raw", url, subject, str(events))
        line("read the raw messages (baseline)", raw_s, raw_mb, "")
        base = f"raw read {raw_s:.1f} s, {raw_mb} MiB"
        took, peak, _ = await measured(url, "replay", "bench/size", "--out", str(tmp / "tree"))
        line("quill replay (tree written)", took, peak, base)
        t0 = time.perf_counter()
        subprocess.run(f"tar -cf - -C {tmp} tree | wc -c", shell=True, check=True, text=True,
                       capture_output=True)  # fmt: skip
        line("  tar of the replayed tree (baseline)", time.perf_counter() - t0, None, "")
        reader = service(url, "reader", tmp / "reader")
        procs.append(reader)
        quill = await Quill.connect(url, actor="bench", timeout=3600)
        caught = await applied(quill, "bench/size", events)
        line("reader replica catching up", caught, hwm(reader.pid), base)
        wait = ("--timeout", "600s", "--ping-wait", "2s")
        took, peak, out = await measured(url, "verify", *wait, "bench/size")
        assert ": ok" in out, out
        line("quill verify", took, peak, base)
        took, peak, _ = await measured(url, "verify", "--deep", *wait, "bench/size")
        line("quill verify --deep", took, peak, base)
        line("  the reader replica, after both", 0.0, hwm(reader.pid), "(its peak so far)")
        export = tmp / "size.jsonl.gz"
        took, peak, _ = await measured(url, "export", "bench/size", str(export))
        line("quill export (gzip)", took, peak, base)
        took, peak, _ = await measured(url, "import", str(export), "bench/size-copy")
        line("quill import (checked, appended, replayed)", took, peak, base)
        writer = service(url, "writer", tmp / "writer")
        procs.append(writer)
        await pinged(nc, "writer")
        ws = quill.workspace("bench/size")
        executor = await materialised(nc, ws, procs, url, tmp / "executor", "the whole log")
        updates = await nc.subscribe(SUBJECTS.updated("bench", "size"))
        t0 = time.perf_counter()
        await ws.write(path_of(0), "hot\n")
        line("writer: load (its first write)", time.perf_counter() - t0, hwm(writer.pid), base)
        t0 = time.perf_counter()
        for n in range(MAX_VERSIONS + slack(MAX_VERSIONS) + 1):
            await ws.write(path_of(0), f"hot {n}\n")
        async with asyncio.timeout(3600):
            async for msg in updates.messages:
                if b'"compact"' in msg.data:
                    break
        line("writer: 22 writes, compaction", time.perf_counter() - t0, hwm(writer.pid),
             base)  # fmt: skip
        executor.terminate()
        executor.wait()
        await materialised(nc, ws, procs, url, tmp / "executor-2", "the compaction")
        took, peak, _ = await measured(url, "replay", "bench/size", "--out", str(tmp / "compacted"))
        line("quill replay from the compaction", took, peak, base)
        await quill.close()
        await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
