"""The projection's workspace rows at scale (``python -m bench.rows``, issue 17): how long
opening a projection of ``--workspaces`` workspaces takes, and what the process holds after
opening it and after touching ``--touch`` workspaces of it (each process measured alone).

``build`` makes the projection (writer or reader role) with the store's own batch apply: each
workspace created and written once, the events of ``bootstrap.synthesise``. ``measure`` opens
it in a new process and prints one JSON line: open seconds, rows loaded at open, RSS after
open, and RSS and rows held after touching workspaces at random (``Store.workspace``, what a
read or a cold write asks first).

    python -m bench.rows build /tmp/rows/reader.db --role reader --workspaces 200000
    python -m bench.rows measure /tmp/rows/reader.db --role reader --touch 50000

``cpu`` starts ``quill up`` and prints the CPU time the writer and the reader spend per write
(64 clients over 64 workspaces, every write applied by the reader) and the reader per read,
from their ``/proc`` counters: what the projection's hot paths cost, whatever else the
machine runs.

    python -m bench.rows cpu --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import tempfile
import time
from pathlib import Path

from bench.bootstrap import name_of, project, synthesise
from bench.harness import closed_loop, payload, quill_up, settle
from infra.store import Store
from quill.client import Quill

BATCH = 2_000


def rss_mb() -> float:
    """The process's resident set now (``/proc/self/status``), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def build(path: Path, role: str, workspaces: int) -> None:
    store = await Store.open(path, role=role)
    stores = [(store, "log" if role == "reader" else None)]
    batch: list[tuple[str, bytes, str, str]] = []
    seq = 0
    for item in synthesise(0, workspaces, 2 * workspaces):
        batch.append(item)
        if len(batch) >= BATCH:
            await project(stores, batch, seq)
            seq, batch = seq + len(batch), []
    if batch:
        await project(stores, batch, seq)
    await store.close()


async def measure(path: Path, role: str, touch: int, workspaces: int) -> dict[str, object]:
    before = rss_mb()
    started = time.perf_counter()
    store = await Store.open(path, role=role)
    opened = time.perf_counter() - started
    out: dict[str, object] = {
        "role": role,
        "open_s": round(opened, 3),
        "rss_before_open_mb": round(before, 1),
        "rss_open_mb": round(rss_mb(), 1),
        "rows_loaded_at_open": getattr(store, "rows_loaded", None),
    }
    rng = random.Random(17)
    started = time.perf_counter()
    for _ in range(touch):
        assert store.workspace("bench", name_of(rng.randrange(workspaces))) is not None
    out["touch_us_each"] = round((time.perf_counter() - started) / max(touch, 1) * 1e6, 1)
    out["rss_touched_mb"] = round(rss_mb(), 1)
    out["rows_held"] = getattr(store, "rows_held", None)
    await store.close()
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def services(parent: int) -> dict[str, int]:
    """The pids of ``quill up``'s writer and reader."""
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for name in ("writer", "reader"):
            if ppid == parent and name.encode() in argv:
                found[name] = int(entry.name)
    return found


async def cpu(seconds: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = quill_up(Path(tmp) / "quill")
        try:
            pids = services(proc.proc.pid)
            quill = await Quill.connect(url)
            names = [f"bench/cpu-{n}" for n in range(64)]
            for name in names:
                await quill.workspace(name).create(exist_ok=True)
            await settle(url)

            async def write(n: int, i: int) -> None:
                await quill.workspace(names[n]).write(f"f{i % 10}.txt", payload(n * 10**6 + i))

            before = {k: cpu_seconds(p) for k, p in pids.items()}
            writes = await closed_loop(64, write, seconds)
            await settle(url)
            after = {k: cpu_seconds(p) for k, p in pids.items()}

            async def read(n: int, i: int) -> None:
                await quill.workspace(names[n]).read(f"f{i % 10}.txt")

            reads = await closed_loop(64, read, seconds)
            done = cpu_seconds(pids["reader"])
            await quill.close()
        finally:
            proc.stop()
    count, read_count = writes.ops, reads.ops
    return {
        "writes": count,
        "writer_us_per_write": round((after["writer"] - before["writer"]) / count * 1e6),
        "reader_us_per_write": round((after["reader"] - before["reader"]) / count * 1e6),
        "reads": read_count,
        "reader_us_per_read": round((done - after["reader"]) / read_count * 1e6),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rows")
    parser.add_argument("what", choices=["build", "measure", "cpu"])
    parser.add_argument("path", type=Path, nargs="?")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--role", choices=["writer", "reader"], default="reader")
    parser.add_argument("--workspaces", type=int, default=20_000)
    parser.add_argument("--touch", type=int, default=20_000)
    args = parser.parse_args()
    if args.what == "cpu":
        print(json.dumps(asyncio.run(cpu(args.seconds))))
    elif args.what == "build":
        asyncio.run(build(args.path, args.role, args.workspaces))
    else:
        print(json.dumps(asyncio.run(measure(args.path, args.role, args.touch, args.workspaces))))


if __name__ == "__main__":
    main()
