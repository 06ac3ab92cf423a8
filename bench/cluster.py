"""The cluster figures (issue 6): write and read throughput of a 3-node cluster against the
single-node stack in the same run, and how long a writer's failover takes against its lease.

The single node is ``quill up`` (one nats-server, a writer, a reader, an executor, the gateway);
the cluster is ``quill cluster up``'s ``Cluster`` (3 nats-servers, every stream and bucket R3,
2 writers sharing 64 partitions by lease, 2 readers, 2 executors, the gateway); every server
with ``sync_interval: always``. Each system runs alone on the machine while it is measured: an
idle cluster spends most of a core renewing its leases, which would weigh on a baseline measured
beside it. So the rounds are not interleaved; the single node is measured before and after the
cluster instead (its rounds pooled, each phase's rates printed), which brackets the drift of the
machine. After each write round the readers catch up (outside the timing, inside the CPU
account), so that no backlog spills into the read round.

Clients: 32 closed-loop coroutines, each with its own SDK connection (as separate agents would
have; nats-py picks a random server of the cluster, so the clients spread over the three),
writing 200-byte files over 64 workspaces (each workspace has one client), or reading a 1 KB
file there without ``min_version`` (a replica answers from its projection as it stands).
CPU per op is that of the system's processes (servers and services, not the clients).

Failover: a workspace is written, its writer found (the audit record names the instance, the
writers' pings give its pid) and killed with SIGKILL; the figure is the time from the kill to
the reply of the next write, which the SDK retries through the failover (backing off up to 1 s
between attempts); then the writer is started again and the partitions left to rebalance.
Its baseline is the lease TTL: no writer may take a partition before its lease has expired.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from nats.aio.client import Client as NATS

from bench.harness import Load, closed_loop, merge, payload, row
from contracts import replies as rp
from contracts import requests as rq
from contracts.subjects import STREAM_EVENTS, Subjects, split_workspace
from infra import bus
from quill.client import Quill
from quill_cli.cluster import Cluster
from quill_cli.launcher import Launcher
from quill_cli.stack import Stack

CLIENTS = 32
WORKSPACES = 64
PARTITIONS = 64  # quill cluster up's default
LEASE_TTL = 5.0  # the writer's default (quill writer --lease-ttl)
FAILOVERS = 3
PAYLOAD = "x" * 199 + "\n"
DOC = PAYLOAD * 5
HEADER = f"{'figure':<44} {'cluster':>16} {'single node':>16} {'ratio':>8}  goal"
INTRO = (
    f"{CLIENTS} closed-loop SDK clients, each on its own connection, over {WORKSPACES} "
    "workspaces; {rounds} rounds of {seconds:g}s per figure on each system (median round; "
    f"latencies pooled). Cluster: 3 nats-servers (R3), 2 writers ({PARTITIONS} partitions, "
    f"lease TTL {LEASE_TTL:g}s), 2 readers, 2 executors. Single node: quill up, measured "
    "before and after the cluster (each system alone on the machine). sync_interval: always "
    "everywhere; 2 cores."
)


def cpu_seconds(system: Launcher) -> float:
    """CPU time (user + system) its processes have used so far (Linux ``/proc``)."""
    pids = [c.pid for c in system.children if c.alive() and c.pid is not None]
    if isinstance(system, Stack) and system.nats is not None and system.nats.process:
        pids.append(system.nats.process.pid)
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


async def settle(nc: NATS, readers: int, timeout: float = 120.0) -> None:
    """Wait until every reader has applied the whole log.

    Raises:
        TimeoutError: they had not within ``timeout`` seconds.
    """
    js = nc.jetstream()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = (await js.stream_info(STREAM_EVENTS)).state.last_seq
        pongs = await bus.ping_all(nc, Subjects(), "reader", wait_s=0.2)
        if len(pongs) >= readers and all(p["position"] >= last for p in pongs):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the readers did not catch up within {timeout:.0f}s")


@dataclass
class Figures:
    """What one system measured, over one or more phases."""

    loads: dict[str, list[Load]] = field(default_factory=dict)
    """Per figure (``write``, ``read``), its rounds."""
    cpu: dict[str, list[float]] = field(default_factory=dict)
    """Per figure, per round: CPU seconds its processes spent per op (catching up included)."""
    idle: list[float] = field(default_factory=list)
    """Its processes' CPU use with no client, in cores."""

    def load(self, key: str) -> Load:
        return merge(self.loads[key])

    def cpu_us(self, key: str) -> float:
        return statistics.median(self.cpu[key]) * 1e6


class System:
    """One system under test, alone on the machine while it is up, with its clients."""

    def __init__(self, launcher: Launcher, readers: int, figures: Figures) -> None:
        self.launcher, self.readers, self.figures = launcher, readers, figures
        self.clients: list[Quill] = []
        self.names = [split_workspace(f"bench/w{n}") for n in range(WORKSPACES)]

    async def __aenter__(self) -> System:
        await self.launcher.start()
        try:
            for _ in range(CLIENTS):
                self.clients.append(await Quill.connect(self.launcher.nats_url, timeout=30))
            for tenant, name in self.names:
                ws = self.clients[0].workspace(f"{tenant}/{name}")
                await ws.create(exist_ok=True)
                await ws.write("doc.txt", DOC)
            await settle(self.clients[0].nc, self.readers)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for client in self.clients:
            await client.close()
        await self.launcher.stop()

    async def measure(self, seconds: float, rounds: int, idle_s: float = 3.0) -> str:
        """Idle CPU, then ``rounds`` rounds of writes and of reads; a summary line."""
        cpu0 = cpu_seconds(self.launcher)
        await asyncio.sleep(idle_s)
        self.figures.idle.append((cpu_seconds(self.launcher) - cpu0) / idle_s)
        rates: dict[str, list[float]] = {"write": [], "read": []}
        wall, client = time.perf_counter(), time.process_time()
        for _ in range(rounds):
            for key, run in (("write", self.writes), ("read", self.reads)):
                cpu0 = cpu_seconds(self.launcher)
                load, ops = await run(seconds)
                self.figures.cpu.setdefault(key, []).append(
                    (cpu_seconds(self.launcher) - cpu0) / max(ops, 1)
                )
                self.figures.loads.setdefault(key, []).append(load)
                rates[key].append(load.rate)
        client = (time.process_time() - client) / (time.perf_counter() - wall)
        each = ", ".join(f"{k}s/s " + "/".join(f"{r:,.0f}" for r in v) for k, v in rates.items())
        return f"{each} by round; the clients' process used {client:.2f} cores"

    def _ws(self, n: int, i: int) -> tuple[str, str]:
        return self.names[(n + i * CLIENTS) % WORKSPACES]

    async def writes(self, seconds: float) -> tuple[Load, int]:
        """Closed-loop writes; then the readers catch up (in the CPU account, not the time)."""
        done = 0

        async def op(n: int, i: int) -> None:
            nonlocal done
            tenant, name = self._ws(n, i)
            ws = self.clients[n].workspace(f"{tenant}/{name}")
            await ws.write(f"c{n}/f{i % 10}.txt", payload(n * 1_000_000 + i))
            done += 1

        load = await closed_loop(CLIENTS, op, seconds)
        await settle(self.clients[0].nc, self.readers)
        return load, done

    async def reads(self, seconds: float) -> tuple[Load, int]:
        """Closed-loop reads without ``min_version``: any replica answers as it stands."""
        done = 0
        query = rq.ReadFile(path="doc.txt")

        async def op(n: int, i: int) -> None:
            nonlocal done
            tenant, name = self._ws(n, i)
            await self.clients[n].request("qry", tenant, name, "read", query, rp.FileContent)
            done += 1

        return await closed_loop(CLIENTS, op, seconds), done


async def balanced(cluster: Cluster, nc: NATS, timeout: float = 60.0) -> bool:
    """Wait until every writer holds its fair share of the partitions; False if not in time."""
    writers = cluster.deployment.writers
    share = -(-PARTITIONS // writers)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pongs = await bus.ping_all(nc, Subjects(), "writer", wait_s=0.3)
        held: list[list[int]] = [p.get("partitions", {}).get("held", []) for p in pongs]
        every = {p for h in held for p in h}
        if len(held) == writers and len(every) == PARTITIONS and all(len(h) <= share for h in held):
            return True
        await asyncio.sleep(0.5)
    return False


async def failovers(cluster: Cluster, count: int) -> tuple[list[float], list[str]]:
    """``count`` failovers: seconds from kill -9 of a workspace's writer to its next write."""
    quill = await Quill.connect(cluster.nats_url, timeout=5)
    took, notes = [], []
    try:
        for k in range(count):
            ws = quill.workspace(f"bench/failover-{k}")
            victim, seconds = await cluster.failover(ws)
            took.append(seconds)
            served = await cluster.writer_of(ws)
            t1 = time.perf_counter()
            await cluster.start(victim)
            rebalanced = await balanced(cluster, quill.nc)
            back = f"in {time.perf_counter() - t1:.1f}s" if rebalanced else "NOT within 60s"
            notes.append(
                f"failover {k + 1}: killed {victim}, {served} wrote after {took[-1]:.2f}s; "
                f"{victim} started again, partitions rebalanced {back}"
            )
    finally:
        await quill.close()
    return took, notes


def log_findings(data: Path, limit: int = 16) -> list[str]:
    """Warnings, errors and tracebacks in the services' and servers' logs, grouped by message
    (numbers masked) with a count, most frequent first."""
    noisy = re.compile(r"\b(WARNING|ERROR|CRITICAL|Traceback)\b|\[(WRN|ERR|FTL)\]")
    stamp = re.compile(r"^(\[\d+\] )?[\d/:.,-]+ [\d:.,]+ ")  # nats-server's and Python's
    found: Counter[str] = Counter()
    for path in sorted(data.rglob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if noisy.search(line):
                text = re.sub(r"\d+", "N", stamp.sub("", line))[:150]
                found[f"{path.parent.parent.name}/{path.stem}: {text}"] += 1
    lines = [f"  {n:>4}x {text}" for text, n in found.most_common(limit)]
    if len(found) > limit:
        lines.append(f"  (and {len(found) - limit} other messages)")
    return lines or ["  none"]


async def single_phase(data: Path, figures: Figures, seconds: float, rounds: int) -> str:
    t0 = time.perf_counter()
    stack = Stack(data, nats_port=0, http_port=0, sandbox="local")
    async with System(stack, 1, figures) as system:
        up = time.perf_counter() - t0
        return f"up in {up:.0f}s; {await system.measure(seconds, rounds)}"


async def cluster_phase(data: Path, figures: Figures, seconds: float, rounds: int) -> list[float]:
    """The cluster's rounds, then its failovers (their seconds)."""
    t0 = time.perf_counter()
    launcher = Cluster(
        data,
        partitions=PARTITIONS,
        lease_ttl=LEASE_TTL,
        sandbox="local",
        restart=False,  # the failover decides when a killed writer comes back
    )
    async with System(launcher, 2, figures) as system:
        up = time.perf_counter() - t0
        print(f"cluster: up in {up:.0f}s; {await system.measure(seconds, rounds)}", flush=True)
        took, notes = await failovers(launcher, FAILOVERS)
    print("\n".join(notes))
    return took


async def main(seconds: float = 4.0, rounds: int = 3, keep: Path | None = None) -> None:
    """The figures; ``keep``: run in that directory and leave it (the logs) behind."""
    intro = INTRO.format(rounds=rounds, seconds=seconds)
    print(f"Quill cluster benchmark: {intro}\n", flush=True)
    single, multi = Figures(), Figures()
    with tempfile.TemporaryDirectory() as tmp:
        data = keep or Path(tmp)
        begun = time.perf_counter()
        before = await single_phase(data / "single-1", single, seconds, rounds)
        print(f"single node: {before}", flush=True)
        took = await cluster_phase(data / "cluster", multi, seconds, rounds)
        after = await single_phase(data / "single-2", single, seconds, rounds)
        print(f"single node again: {after}")
        print(f"(whole run {time.perf_counter() - begun:.0f}s)\n")
        lines = table(single, multi, took)
        print("\n".join(lines))
        print("\nwarnings and errors in the logs (grouped, most frequent first):")
        print("\n".join(log_findings(data)))
    print("\n--- for docs/performance.md ---\n")
    print(f"## Cluster vs single node\n\n`python -m bench cluster`: {intro}\n")
    print("```\n" + "\n".join(lines) + "\n```")


def table(single: Figures, multi: Figures, took: list[float]) -> list[str]:
    lines = [HEADER]
    for key in ("write", "read"):
        a, b = multi.load(key), single.load(key)
        label = f"{key}: {CLIENTS} clients on {WORKSPACES} workspaces"
        lines.append(row(label, f"{a.rate:,.0f}/s", f"{b.rate:,.0f}/s", a.rate / b.rate, "(ratio)"))
        lines.append(
            row(
                f"  {key} p50/p99 latency",
                f"{a.pct(0.5):.1f}/{a.pct(0.99):.1f} ms",
                f"{b.pct(0.5):.1f}/{b.pct(0.99):.1f} ms",
                a.pct(0.5) / b.pct(0.5),
                "(latency ratio)",
            )
        )
        ours, base = multi.cpu_us(key), single.cpu_us(key)
        label = f"  CPU per {key}, all server processes"
        lines.append(row(label, f"{ours:,.0f} us", f"{base:,.0f} us", ours / base, "(ratio)"))
    ours, base = statistics.median(multi.idle), statistics.median(single.idle)
    lines.append(f"CPU with no clients: cluster {ours:.2f} cores, single node {base:.2f} cores")
    median = statistics.median(took)
    lines += [
        "",
        HEADER.replace("single node", "  lease TTL"),
        row(
            f"failover (kill -9 writer), median of {len(took)}",
            f"{median:.2f} s",
            f"{LEASE_TTL:.2f} s",
            median / LEASE_TTL,
            "< 10 s (issue 6)",
        ),
        row(
            "  min / max",
            f"{min(took):.2f}/{max(took):.2f} s",
            f"{LEASE_TTL:.2f} s",
            max(took) / LEASE_TTL,
            "(ratio of the max)",
        ),
    ]
    return lines
