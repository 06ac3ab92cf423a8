"""Cold workspaces (issue 17): a write to a workspace the writer does not hold, next to a
write to one it holds, against ``quill up`` with many workspaces (bare nats-py).

``python -m bench scale --workspaces 20000``: builds the workspaces (64 clients, each a
``create`` and a ``write``), then measures serially a write to each of a sample of workspaces
untouched since the build (cold: the writer holds at most its budget of the most recent
ones), alternating with writes round-robin over 10 workspaces (warm), and prints p50/p99 of
each and their ratio, with the RSS of each process and the writer's held count.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import nats
from nats.aio.client import Client as NATS

from bench.executor import processes
from bench.harness import Load, payload, quill_up, settle

TENANT = "scale"
BUILDERS = 64
SAMPLES = 1000


async def call(nc: NATS, subject: str, body: dict[str, object]) -> None:
    msg = await nc.request(subject, json.dumps(body).encode(), timeout=30)
    reply = json.loads(msg.data)
    if not reply.get("ok"):
        raise RuntimeError(f"{subject}: {reply}")


async def build(nc: NATS, count: int, clients: int = BUILDERS) -> None:
    """``count`` workspaces ``w<i>``, each created and written once, by ``clients`` at once."""
    todo = iter(range(count))

    async def client() -> None:
        for i in todo:
            await call(nc, f"ws.cmd.{TENANT}.w{i}.create", {})
            await call(nc, f"ws.cmd.{TENANT}.w{i}.write", {"path": "f", "content": payload(i)})

    await asyncio.gather(*[client() for _ in range(clients)])


async def write(nc: NATS, name: str, n: int, into: list[float]) -> None:
    t0 = time.perf_counter()
    await call(nc, f"ws.cmd.{TENANT}.{name}.write", {"path": "f", "content": payload(n)})
    into.append(time.perf_counter() - t0)


async def writes(nc: NATS, warm: list[str], cold: list[str]) -> tuple[Load, Load]:
    """A write to each of ``warm`` and ``cold`` in turn, alternating (serially, so that the
    machine's drift falls on both alike): their latencies."""
    latencies: tuple[list[float], list[float]] = ([], [])
    t = time.perf_counter()
    for n, (hot, old) in enumerate(zip(warm, cold, strict=True)):
        await write(nc, hot, 2 * n, latencies[0])
        await write(nc, old, 2 * n + 1, latencies[1])
    seconds = time.perf_counter() - t
    return Load(len(warm), seconds, latencies[0]), Load(len(cold), seconds, latencies[1])


def rss_mb(up_pids: dict[int, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pid, role in up_pids.items():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        out[role] = out.get(role, 0.0) + kb / 1024
    return out


async def measure(url: str, count: int, samples: int) -> tuple[Load, Load, dict[str, object]]:
    nc = await nats.connect(url)
    try:
        pong = json.loads((await nc.request("ws.sys.ping.writer", b"", timeout=5)).data)
        budget = int(pong.get("budget", pong["workspaces"]))
        # cold: never touched since the build, and older than the writer's budget
        pool = list(range(max(count - budget - 100, 0)))
        cold_names = [f"w{i}" for i in random.Random(17).sample(pool, min(samples, len(pool)))]
        warm_names = [f"w{count - 1 - i % 10}" for i in range(len(cold_names))]
        for name in warm_names[:10]:  # the warm ones are held
            await write(nc, name, 10_000_000, [])
        warm, cold = await writes(nc, warm_names, cold_names)
        pong = json.loads((await nc.request("ws.sys.ping.writer", b"", timeout=5)).data)
        return warm, cold, pong
    finally:
        await nc.close()


async def main(count: int = 20_000, samples: int = SAMPLES) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        up, url = quill_up(Path(tmp) / "quill")
        try:
            nc = await nats.connect(url)
            t0 = time.perf_counter()
            await build(nc, count)
            built = time.perf_counter() - t0
            await nc.close()
            await settle(url)  # the reader has applied the build: it competes no more
            print(f"built {count} workspaces in {built:.0f} s; measuring", flush=True)
            warm, cold, pong = await measure(url, count, samples)
            rss = rss_mb(processes(up))
        finally:
            up.stop()
    print(f"Scale: {count} workspaces (built in {built:.0f} s, {count / built:.0f}/s)")
    print(f"{'write':<34} {'p50 ms':>8} {'p99 ms':>8}")
    figures = (("warm (round-robin over 10)", warm), ("cold (untouched since built)", cold))
    for label, load in figures:
        print(f"{label:<34} {load.pct(0.5):>8.2f} {load.pct(0.99):>8.2f}")
    print(
        f"{'cold / warm':<34} {cold.pct(0.5) / warm.pct(0.5):>7.2f}x"
        f" {cold.pct(0.99) / warm.pct(0.99):>7.2f}x   goal <= 2x"
    )
    print(f"writer holds {pong['workspaces']} workspaces (budget {pong.get('budget', '?')})")
    print("RSS MB: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(rss.items())))
