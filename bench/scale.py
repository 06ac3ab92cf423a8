"""Many workspaces (issue 17): the cost of an operation against the number of workspaces, on
``quill up`` (bare nats-py), in steps 1,000 → 10,000 → 100,000 (→ 1,000,000 with ``--max``).

``python -m bench scale [--max 100000] [--plot docs/scale.png]``: one nats-server (with its
monitoring port) for the whole run; at each step ``quill up --nats-url`` on the same data
directory, grown from the last step's to the step's count (64 clients, each workspace a
``create`` and a ``write``: the real command path), then, each figure next to its baseline:

- write and read, p50/p99, serially and alternating (so that the machine's drift falls on
  both alike): cold (a workspace untouched since the build, older than the writer's budget of
  held workspaces, ``--budget``) next to warm (round-robin over 10 workspaces just used);
- throughput of writes from 64 clients spread over all workspaces next to the same 64
  clients on 64 workspaces (one each), interleaved rounds;
- RSS of each process (writer, reader, executor, gateway, nats-server), disk per workspace
  (the services' data and the log's), what nats-server holds per subject (its RSS and its
  ``/jsz`` stream state over the subjects);
- the baseline of cold and warm: the log alone finding a workspace's last event (a direct
  get by subject, what the condition of an append to it looks up on the server);
- reader bootstrap: after the throughput rounds the reader makes a snapshot, then ``TAIL``
  writes to workspaces at random follow it (the most a reader's default policy leaves out of
  a snapshot); ``quill up`` stops, and a reader with no data starts from the snapshot: the
  time until it answers the latest write.

``--plot PATH`` draws latency (p50/p99, warm and cold, write and read) and RSS per process
against the number of workspaces (log x) into a PNG (matplotlib, the ``dev`` extra).

Why one module of over 400 lines: building, each figure, the report, the Markdown table and
the plot all read the same ``Step``; split, each part would only pass it on.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS

from bench.bootstrap import from_snapshot, grow, name_of
from bench.executor import processes
from bench.harness import Load, closed_loop, interleaved, payload, quill_up, settle
from contracts.subjects import STREAM_EVENTS
from quill_cli.natsserver import NatsServer
from quill_cli.ports import free_port
from services.reader.snapshots import SnapshotConfig

TENANT = "bench"  # what ``bootstrap.synthesise`` makes
BUILDERS = 64
CLIENTS = 64
SAMPLES = 1000
PAGES = 200
"""Pages of the listing timed, first and deep alike."""
TAIL = SnapshotConfig().every_events
"""Writes after the reader's snapshot, before a reader with no data starts from it: the most
its default policy (``--snapshot-events``) leaves out of one."""
BUDGET = 500
STEPS = (1_000, 10_000, 100_000, 1_000_000)
ROLES = ("writer", "reader", "executor", "gateway", "nats-server")
RESTARTED = "nats-server restarted"
"""nats-server's RSS once restarted on the step's data: what holding the streams takes."""


async def call(nc: NATS, subject: str, body: dict[str, object]) -> dict[str, Any]:
    msg = await nc.request(subject, json.dumps(body).encode(), timeout=60)
    reply: dict[str, Any] = json.loads(msg.data)
    if not reply.get("ok"):
        raise RuntimeError(f"{subject}: {reply}")
    return reply


async def build(nc: NATS, first: int, count: int, clients: int = BUILDERS) -> None:
    """Workspaces ``w<first>..w<count-1>``, each created and written once, by ``clients`` at
    once."""
    todo = iter(range(first, count))
    t0 = time.perf_counter()

    async def client() -> None:
        for i in todo:
            await call(nc, f"ws.cmd.{TENANT}.{name_of(i)}.create", {})
            body = {"path": "f.txt", "content": payload(i)}
            await call(nc, f"ws.cmd.{TENANT}.{name_of(i)}.write", body)
            if i > first and i % 100_000 == 0:
                rate = (i - first) / (time.perf_counter() - t0)
                print(f"  ... {i:,} workspaces ({rate:,.0f}/s)", flush=True)

    await asyncio.gather(*[client() for _ in range(clients)])


class Ops:
    """Writes and reads of workspace ``w<i>``; remembers the latest write (workspace,
    version) and every workspace touched after its build."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.n = 10_000_000
        self.latest = ("", 0)
        self.touched: set[int] = set()

    async def write(self, i: int, into: list[float] | None = None) -> None:
        self.n += 1
        self.touched.add(i)
        t0 = time.perf_counter()
        body = {"path": "f.txt", "content": payload(self.n)}
        reply = await call(self.nc, f"ws.cmd.{TENANT}.{name_of(i)}.write", body)
        if into is not None:
            into.append(time.perf_counter() - t0)
        if reply["version"] > self.latest[1] or not self.latest[0]:
            self.latest = (name_of(i), reply["version"])

    async def read(self, i: int, into: list[float]) -> None:
        self.touched.add(i)
        t0 = time.perf_counter()
        await call(self.nc, f"ws.qry.{TENANT}.{name_of(i)}.read", {"path": "f.txt"})
        into.append(time.perf_counter() - t0)

    async def page(self, i: int, into: list[float]) -> None:
        """A page of the listing (100 workspaces): the first (``i`` < 0) or after ``w<i>``."""
        body: dict[str, object] = {"limit": 100}
        if i >= 0:
            body["after"] = name_of(i)
        t0 = time.perf_counter()
        reply = await call(self.nc, f"ws.qry.{TENANT}._.workspaces", body)
        into.append(time.perf_counter() - t0)
        assert len(reply["result"]["workspaces"]) == 100 or i >= 0, reply

    async def last(self, i: int, into: list[float]) -> None:
        """The baseline: the log alone finding workspace ``i``'s last event (a direct get by
        subject: what the condition of an append to it looks up on the server)."""
        self.touched.add(i)
        t0 = time.perf_counter()
        await self.js.get_last_msg(STREAM_EVENTS, f"ws.evt.{TENANT}.{name_of(i)}", direct=True)
        into.append(time.perf_counter() - t0)


async def alternate(op: Any, warm: list[int], cold: list[int]) -> tuple[Load, Load]:
    """``op`` on each of ``warm`` and ``cold`` in turn, serially: their latencies."""
    out: tuple[list[float], list[float]] = ([], [])
    t = time.perf_counter()
    for hot, old in zip(warm, cold, strict=True):
        await op(hot, out[0])
        await op(old, out[1])
    seconds = time.perf_counter() - t
    return Load(len(warm), seconds, out[0]), Load(len(cold), seconds, out[1])


def rss_mb(pids: dict[int, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pid, role in pids.items():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        out[role] = out.get(role, 0.0) + kb / 1024
    return out


def du_mb(path: Path) -> float:
    done = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True)
    return int(done.stdout.split()[0]) / 1024 if done.returncode == 0 else float("nan")


def jsz(monitor: int) -> dict[str, Any]:
    """The server's ``/jsz`` with stream details: its streams' state by name."""
    url = f"http://127.0.0.1:{monitor}/jsz?streams=true"
    with urllib.request.urlopen(url, timeout=30) as got:
        data = json.load(got)
    streams: dict[str, Any] = {}
    for account in data.get("account_details", []):
        for stream in account.get("stream_detail", []):
            streams[stream["name"]] = stream["state"]
    return {"memory": data.get("memory", 0), "store": data.get("storage", 0), "streams": streams}


@dataclass
class Step:
    count: int
    built_s: float = 0.0
    figures: dict[str, Load] = field(default_factory=dict)
    rss: dict[str, float] = field(default_factory=dict)
    disk: dict[str, float] = field(default_factory=dict)
    subjects: int = 0
    snapshot_s: float = 0.0
    bootstrap_s: float = 0.0
    caught_up_s: float = 0.0
    held: int = 0
    tail: int = 0
    stream: dict[str, Any] = field(default_factory=dict)


async def measure(url: str, step: Step, samples: int, seconds: float, touched: set[int]) -> Ops:
    """The latencies and throughputs of ``step`` on the running ``quill up``."""
    nc = await nats.connect(url)
    ops = Ops(nc)
    ops.touched = touched
    count = step.count
    try:
        # cold: untouched since the build, older than the writer's budget (the last built
        # are held), one sample to write and another to read
        pool = [i for i in range(max(count - BUDGET - 100, 0)) if i not in touched]
        rng = random.Random(count)
        picked = rng.sample(pool, min(3 * samples, len(pool)))
        third = len(picked) // 3
        cold, cold_r = picked[:third], picked[third : 2 * third]
        cold_l = picked[2 * third : 3 * third]
        warm = [count - 1 - k % 10 for k in range(third)]
        for i in warm[:10]:  # the warm ones are held, and read once
            await ops.write(i)
            await ops.read(i, [])
        w, c = await alternate(ops.last, warm, cold_l)
        step.figures |= {"log warm": w, "log cold": c}
        w, c = await alternate(ops.write, warm, cold)
        step.figures |= {"write warm": w, "write cold": c}
        r, c = await alternate(ops.read, warm, cold_r)
        step.figures |= {"read warm": r, "read cold": c}
        deep = [rng.randrange(max(count - 100, 1)) for _ in range(PAGES)]
        first, after = await alternate(ops.page, [-1] * PAGES, deep)
        step.figures |= {"page first": first, "page deep": after}
        spread_rng = random.Random(-count)

        async def spread(client: int, n: int) -> None:
            await ops.write(spread_rng.randrange(count))

        async def concentrated(client: int, n: int) -> None:
            await ops.write(count - 1 - client)

        step.figures["spread"], step.figures["64 workspaces"] = await interleaved(
            3,
            lambda: closed_loop(CLIENTS, spread, seconds),
            lambda: closed_loop(CLIENTS, concentrated, seconds),
        )
        pong = json.loads((await nc.request("ws.sys.ping.writer", b"", timeout=10)).data)
        step.held = pong["workspaces"]
        # a snapshot, then as many writes after it as a reader's default policy leaves out
        # of one at most (``--snapshot-events``), to workspaces at random: the worst tail
        t0 = time.perf_counter()
        made = json.loads((await nc.request("ws.sys.snapshot.reader", b"", timeout=3600)).data)
        assert made.get("ok"), made
        step.snapshot_s = time.perf_counter() - t0
        before = ops.n
        todo = iter(range(TAIL))

        async def tail() -> None:
            for _ in todo:
                await ops.write(spread_rng.randrange(count))

        await asyncio.gather(*[tail() for _ in range(CLIENTS)])
        step.tail = ops.n - before
        return ops
    finally:
        await nc.close()


async def run_step(
    server: NatsServer,
    monitor: int,
    tmp: Path,
    step: Step,
    built: int,
    ops_state: set[int],
    *,
    samples: int,
    seconds: float,
    batches: bool,
) -> None:
    data = tmp / "quill"
    t0 = time.perf_counter()
    if batches:
        await grow(server.url, data, built, step.count)
    up, url = quill_up(data, "--nats-url", server.url)
    try:
        if not batches:
            nc = await nats.connect(url)
            await build(nc, built, step.count)
            await nc.close()
        step.built_s = time.perf_counter() - t0
        await settle(url)  # the reader has applied the build: it competes no more
        print(f"  built {built:,} → {step.count:,} in {step.built_s:.0f} s; measuring", flush=True)
        ops = await measure(url, step, samples, seconds, ops_state)
        await settle(url)
        pids = processes(up)
        assert server.process is not None
        pids[server.process.pid] = "nats-server"
        step.rss = rss_mb(pids)
    finally:
        up.stop()
    state = jsz(monitor)
    events = state["streams"].get("WS_EVENTS", {})
    step.subjects = int(events.get("num_subjects", 0))
    step.stream = events
    step.disk = {"services": du_mb(data), "log": du_mb(server.store_dir)}
    # what the server needs to hold the subjects, apart from what the load left in its heap
    server.stop()
    server.start()
    assert server.process is not None
    step.rss[RESTARTED] = rss_mb({server.process.pid: RESTARTED})[RESTARTED]
    name, version = ops.latest
    boot = tmp / f"boot-{step.count}"
    took = await from_snapshot(server.url, boot, f"{TENANT}/{name}", version, step.tail)
    step.bootstrap_s, step.caught_up_s = took.served, took.caught_up
    shutil.rmtree(boot, ignore_errors=True)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def per_subject(step: Step, before: Step | None, role: str = "nats-server") -> float:
    """nats-server's RSS (``role``: running, or restarted) per subject of WS_EVENTS, in
    bytes: what the subjects added since the step ``before`` (the whole RSS over the subjects
    at the first step)."""
    rss, subjects = step.rss.get(role, 0.0), step.subjects
    if before is not None:
        rss -= before.rss.get(role, 0.0)
        subjects -= before.subjects
    return rss * 2**20 / max(subjects, 1)


def report(step: Step, before: Step | None) -> None:
    f = step.figures
    n = step.count
    print(f"\nScale: {n:,} workspaces (built in {step.built_s:.0f} s this step)")
    print(
        f"{'':<10} {'warm p50':>9} {'cold p50':>9} {'ratio':>7} {'warm p99':>9} "
        f"{'cold p99':>9} {'ratio':>7}   goal <= 2x"
    )
    for op in ("log", "write", "read"):
        w, c = f[f"{op} warm"], f[f"{op} cold"]
        print(
            f"{op:<10} {w.pct(0.5):>9.2f} {c.pct(0.5):>9.2f} {ratio(c.pct(0.5), w.pct(0.5)):>7}"
            f" {w.pct(0.99):>9.2f} {c.pct(0.99):>9.2f} {ratio(c.pct(0.99), w.pct(0.99)):>7}"
        )
    first, deep = f["page first"], f["page deep"]
    print(
        f"listing, a page of 100: first {first.pct(0.5):.2f} / {first.pct(0.99):.2f} ms, after a "
        f"random name {deep.pct(0.5):.2f} / {deep.pct(0.99):.2f} ms (p50 / p99)"
    )
    s, b = f["spread"], f["64 workspaces"]
    print(
        f"writes/s, 64 clients: spread over all {s.rate:,.0f}, on 64 workspaces {b.rate:,.0f}"
        f" ({ratio(s.rate, b.rate)}; goal >= 0.80x)"
    )
    print("RSS MB: " + ", ".join(f"{k} {step.rss.get(k, 0):.0f}" for k in ROLES))
    services, log = step.disk["services"], step.disk["log"]
    per = f"{(services + log) * 2**20 / n:,.0f} B/workspace"
    print(f"disk: services {services:,.0f} MB, log {log:,.0f} MB ({per})")
    nats_per = per_subject(step, before)
    print(
        f"nats-server: {step.subjects:,} subjects in WS_EVENTS, {nats_per:,.0f} B RSS per "
        f"subject added ({step.stream.get('messages', 0):,} messages, "
        f"{step.stream.get('bytes', 0) / 2**20:,.0f} MB); restarted: "
        f"{step.rss.get(RESTARTED, 0):,.0f} MB, {per_subject(step, before, RESTARTED):,.0f} B "
        "per subject added"
    )
    print(
        f"writer holds {step.held:,} (budget {BUDGET}); snapshot made in {step.snapshot_s:.1f} s,"
        f" a reader with no data served the latest write in {step.bootstrap_s:.1f} s,"
        f" had applied the whole tail in {step.caught_up_s:.1f} s"
    )


def table(steps: list[Step]) -> str:
    """The figures per step as a Markdown table (docs/performance.md)."""
    head = ["workspaces", *(f"{s.count:,}" for s in steps)]
    rows: list[list[str]] = []

    def lat(op: str, q: float) -> list[str]:
        out = []
        for s in steps:
            w, c = s.figures[f"{op} warm"].pct(q), s.figures[f"{op} cold"].pct(q)
            out.append(f"{w:.2f} / {c:.2f} ({c / w:.2f}x)")
        return out

    for op in ("log", "write", "read"):
        name = "the log alone (last event by subject)" if op == "log" else op
        rows.append([f"{name} p50 ms, warm / cold (ratio)", *lat(op, 0.5)])
        rows.append([f"{name} p99 ms, warm / cold (ratio)", *lat(op, 0.99)])
    rows.append(
        [
            "listing, a page of 100 after a random name / the first, p50 ms (ratio)",
            *(
                f"{s.figures['page deep'].pct(0.5):.2f} / {s.figures['page first'].pct(0.5):.2f}"
                f" ({s.figures['page deep'].pct(0.5) / s.figures['page first'].pct(0.5):.2f}x)"
                for s in steps
            ),
        ]
    )
    rows.append(
        [
            "writes/s, 64 clients: spread / on 64 (ratio)",
            *(
                f"{s.figures['spread'].rate:,.0f} / {s.figures['64 workspaces'].rate:,.0f} "
                f"({s.figures['spread'].rate / s.figures['64 workspaces'].rate:.2f}x)"
                for s in steps
            ),
        ]
    )
    for role in ROLES:
        rows.append([f"RSS {role}, MB", *(f"{s.rss.get(role, 0):.0f}" for s in steps)])
    rows.append(
        [
            "nats-server RSS per subject added, B",
            *(f"{per_subject(s, b):,.0f}" for s, b in zip(steps, [None, *steps], strict=False)),
        ]
    )
    rows.append([f"RSS {RESTARTED}, MB", *(f"{s.rss.get(RESTARTED, 0):.0f}" for s in steps)])
    rows.append(
        [
            "nats-server restarted, RSS per subject added, B",
            *(
                f"{per_subject(s, b, RESTARTED):,.0f}"
                for s, b in zip(steps, [None, *steps], strict=False)
            ),
        ]
    )
    rows.append(
        [
            "disk per workspace (services + log), B",
            *(f"{(s.disk['services'] + s.disk['log']) * 2**20 / s.count:,.0f}" for s in steps),
        ]
    )
    rows.append(
        [
            f"reader with no data, from snapshot + {TAIL:,} events, to the latest write, s",
            *(f"{s.bootstrap_s:.1f}" for s in steps),
        ]
    )
    rows.append(
        [
            "... until it had applied the whole tail (caught up), s",
            *(f"{s.caught_up_s:.1f}" for s in steps),
        ]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def plot(steps: list[Step], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [s.count for s in steps]
    fig, (p50, p99, mem) = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, q in ((p50, 0.5), (p99, 0.99)):
        for op, marker, colour in (("write", "o", "tab:blue"), ("read", "s", "tab:green")):
            for kind, style in (("warm", "-"), ("cold", "--")):
                ys = [s.figures[f"{op} {kind}"].pct(q) for s in steps]
                label = f"{op} {kind}"
                ax.plot(xs, ys, style, marker=marker, color=colour, label=label)
        title = f"Latency p{int(q * 100)}, serial requests"
        ax.set(xscale="log", xlabel="workspaces", ylabel="ms", title=title)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    for role in (*ROLES, RESTARTED):
        style = "--" if role == RESTARTED else "-"
        mem.plot(xs, [s.rss.get(role, 0) for s in steps], style, marker="o", label=role)
    mem.set(xscale="log", xlabel="workspaces", ylabel="MB", title="RSS per process")
    mem.set_ylim(bottom=0)
    mem.legend(fontsize=8)
    for ax in (p50, p99, mem):
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


async def main(
    largest: int = 100_000,
    samples: int = SAMPLES,
    seconds: float = 3.0,
    plot_to: Path | None = None,
    steps: tuple[int, ...] = STEPS,
    batches: bool = True,
) -> list[Step]:
    os.environ["QUILL_WRITER_WORKSPACES"] = str(BUDGET)  # quill up's writer inherits it
    done: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="quill-bench-scale-") as name:
        tmp = Path(name)
        monitor = free_port()
        server = NatsServer(tmp / "nats", extra_config=f"http: 127.0.0.1:{monitor}\n").start()
        touched: set[int] = set()
        try:
            built = 0
            for count in [c for c in steps if c <= largest]:
                step = Step(count)
                await run_step(
                    server,
                    monitor,
                    tmp,
                    step,
                    built,
                    touched,
                    samples=samples,
                    seconds=seconds,
                    batches=batches,
                )
                built = count
                report(step, done[-1] if done else None)
                done.append(step)
                print("\n" + table(done), flush=True)  # each step's: a long run may be cut
                if plot_to is not None:
                    plot(done, plot_to)
        finally:
            server.stop()
    return done
