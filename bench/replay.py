"""Replay (``quill replay``): rebuilding a 100,000-event workspace from the log alone, next to
reading the same messages from JetStream and doing nothing with them.

The log is made here, on a bare nats-server (``sync_interval: always``, no Quill service
running to compete for the CPU): a workspace created, a directory, then 99,998 writes spread
over 1,000 files of ~100 bytes, each a ``changes_committed`` event of the writer's shape with
its hash chain and tree hash (folded by ``core.tree``, as the writer does), appended
in atomic batches. Replay reads the log back (a pull consumer of its own, fetching 1,024
messages at a time), checks every hash and tree hash, folds it in memory and writes the 1,000
files. Two baselines, each only receiving the messages: an ordered consumer on the same subject
(what nats-py does at its fastest), and replay's own reader with nothing done to what it
yields (so the ratio shows what the checking and folding cost, whatever the read costs). The
goal: >= 50,000 events/s and >= 0.8x the raw read.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import nats
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from bench.harness import Row, table
from bench.synthetic import BATCH, chained
from contracts import hashing
from contracts.events import AnyChange, MakeDir, PutFile
from contracts.subjects import Subjects
from core.tree import Tree, apply_change
from infra import bus
from infra.blobs import Blobs
from quill_cli.natsserver import NatsServer
from quill_cli.tools import replay as rpl

EVENTS = 100_000
FILES = 1_000


def synthesise(tenant: str, workspace: str, events: int) -> list[tuple[bytes, str, str]]:
    """The log of a workspace: ``(payload, Nats-Msg-Id, hash)`` of each event, in order: a
    directory, then writes of ``FILES`` files in turn."""

    def write(tree: Tree, version: int, at: datetime) -> tuple[str, list[AnyChange]]:
        if version == 2:
            change: MakeDir | PutFile = MakeDir(path="src")
        else:
            n = version % FILES
            text = f"file {n} at version {version}\n" * 4
            path = f"src/f{n:04}.txt"
            fv = tree.last_fv.get(path, 0) + 1
            created = tree.files[path].created if path in tree.files else at
            change = PutFile(
                path=path,
                sha256=hashing.content_sha256(text.encode()),
                size=len(text),
                file_version=fv,
                created=created,
                text=text,
            )
        apply_change(tree, change, version, at)
        return "write", [change]

    return list(chained(tenant, workspace, events, write))


Timing = tuple[float, float]
"""(wall seconds, CPU seconds of this process)."""


async def raw_read(nc: nats.NATS, subject: str, count: int) -> Timing:
    """How long an ordered consumer takes to receive ``count`` messages of ``subject``."""
    done = asyncio.get_running_loop().create_future()
    seen = 0

    async def on_msg(msg: Msg) -> None:
        nonlocal seen
        seen += 1
        if seen == count and not done.done():
            done.set_result(None)

    t0, c0 = time.perf_counter(), time.process_time()
    sub = await nc.jetstream().subscribe(
        subject,
        cb=on_msg,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        pending_msgs_limit=4 * rpl.BUFFER_MAX,
        pending_bytes_limit=256 * 1024 * 1024,
    )
    await done
    took = time.perf_counter() - t0, time.process_time() - c0
    await sub.unsubscribe()
    return took


async def same_read(nc: nats.NATS, subject: str) -> Timing:
    """How long replay's reader takes to yield every message of ``subject``, nothing done."""
    t0, c0 = time.perf_counter(), time.process_time()
    async with contextlib.aclosing(rpl.messages(nc.jetstream(), subject)) as batches:
        async for _ in batches:
            pass
    return time.perf_counter() - t0, time.process_time() - c0


async def replay_once(nc: nats.NATS, tenant: str, workspace: str, out: Path) -> Timing:
    """How long a checked replay of the whole log written to ``out`` takes."""
    js = nc.jetstream()
    t0, c0 = time.perf_counter(), time.process_time()
    contents = rpl.Contents()
    fold = await rpl.replay(js, Subjects(), tenant, workspace, contents=contents)
    await rpl.write_tree(fold, Blobs(js), out, contents)
    contents.close()
    return time.perf_counter() - t0, time.process_time() - c0


def cli_once(url: str, name: str, out: Path) -> float:
    """Seconds for ``quill replay`` as a process, start to exit."""
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "quill", "--nats-url", url, "replay", name, "--out", str(out)],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


async def main(rounds: int = 3, events: int = EVENTS) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats").start()
        try:
            nc = await bus.connect(server.url, "bench-replay")
            await bus.ensure_streams(nc, Subjects())
            log = synthesise("bench", "replay", events)
            subject = Subjects().evt("bench", "replay")
            last = 0
            for i in range(0, len(log), BATCH):
                last = await rpl.append_batch(nc, subject, last, log[i : i + BATCH], i + 1)
            raw, read, ours, cli = [], [], [], []
            for r in range(rounds):
                raw.append(await raw_read(nc, subject, events))
                read.append(await same_read(nc, subject))
                ours.append(await replay_once(nc, "bench", "replay", Path(tmp) / f"out{r}"))
                cli.append(cli_once(server.url, "bench/replay", Path(tmp) / f"cli{r}"))
            identical = subprocess.run(["diff", "-r", f"{tmp}/out0", f"{tmp}/cli0"]).returncode == 0
            await nc.close()
        finally:
            server.stop()
    base, mine = statistics.median(t[0] for t in raw), statistics.median(t[0] for t in ours)
    base_cpu, mine_cpu = statistics.median(t[1] for t in raw), statistics.median(t[1] for t in ours)
    same, same_cpu = statistics.median(t[0] for t in read), statistics.median(t[1] for t in read)
    proc = statistics.median(cli)
    title = f"Replay: {events:,} events, {FILES:,} files, median of {rounds}"
    figures: list[Row] = [
        (
            "replay (checked, tree written)",
            f"{events / mine:,.0f} ev/s",
            f"{events / base:,.0f} ev/s",
            base / mine,
            ">= 50,000 ev/s, >= 0.8x; baseline: an ordered consumer",
        ),
        (
            "  against replay's reader alone",
            f"{events / mine:,.0f} ev/s",
            f"{events / same:,.0f} ev/s",
            same / mine,
            "baseline: the same fetches, nothing folded",
        ),
        (
            "  quill replay as a process, end to end",
            f"{proc:.2f} s",
            f"{base:.2f} s",
            proc / base,
            "(time ratio)",
        ),
        (
            "  CPU of the reading process per event",
            f"{mine_cpu / events * 1e6:.1f} us",
            f"{base_cpu / events * 1e6:.1f} us",
            mine_cpu / base_cpu,
            "(ratio; what the figures are when the machine is not shared)",
        ),
        (
            "  CPU per event, against replay's reader alone",
            f"{mine_cpu / events * 1e6:.1f} us",
            f"{same_cpu / events * 1e6:.1f} us",
            mine_cpu / same_cpu,
            "(ratio)",
        ),
    ]
    table(title, figures)
    print(f"two replays byte-identical (diff -r): {'yes' if identical else 'NO'}")


if __name__ == "__main__":
    asyncio.run(main())
