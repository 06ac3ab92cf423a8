"""The load test as a benchmark (issue 6): N SDK clients × M workspaces mixing reads, writes,
edits, greps and commands against ``quill up`` (``tests/system/loadgen.py``), printed per op.

Baselines from the same run: the same mix by one client (what concurrency buys per op), and
N clients of a bare nats-py request/reply echo of a write's payload on the same server (the
transport's ceiling, to which the whole mix's throughput is compared).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import nats

from bench.harness import Load, Process, closed_loop, quill_up
from tests.system.loadgen import FILLER, OPS, LoadConfig, Report, run_load

CLIENTS = 16
WORKSPACES = 8


async def echo_load(url: str, clients: int, seconds: float) -> Load:
    nc = await nats.connect(url)
    body = f"client 0 op 0 bench/w0\n{FILLER}".encode()

    async def op(n: int, i: int) -> None:
        await nc.request("bench.echo", body, timeout=10)

    try:
        return await closed_loop(clients, op, seconds)
    finally:
        await nc.close()


def compare(many: Report, one: Report) -> list[str]:
    clients = many.config.clients
    lines = [
        f"{'op':<6} {f'{clients} clients/s':>13} {'1 client/s':>11} {'ratio':>7}"
        f" {f'p50 ms ({clients})':>13} {'p50 ms (1)':>11} {'ratio':>7}"
    ]
    for op in OPS:
        a, b = many.stats[op], one.stats[op]
        rate_a, rate_b = many.rate(op), one.rate(op)
        lines.append(
            f"{op:<6} {rate_a:>13.1f} {rate_b:>11.1f} {rate_a / rate_b if rate_b else 0:>6.2f}x"
            f" {a.pct(0.5):>13.1f} {b.pct(0.5):>11.1f} {a.pct(0.5) / b.pct(0.5):>6.2f}x"
        )
    return lines


def total_rate(report: Report) -> float:
    return sum(s.ok for s in report.stats.values()) / report.seconds


async def main(seconds: float = 20.0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        up, url = quill_up(Path(tmp) / "quill")
        echo = Process([sys.executable, "-m", "bench.echo", url], "echo ready")
        try:
            print(
                f"Quill load benchmark: {CLIENTS} SDK clients x {WORKSPACES} workspaces for "
                f"{seconds:.0f}s, then 1 client for {seconds / 2:.0f}s, then a bare echo; "
                "quill up (one nats-server, sync_interval: always); 2 cores\n"
            )
            many = await run_load(LoadConfig(url, CLIENTS, WORKSPACES, seconds, tenant="bench"))
            one = await run_load(
                LoadConfig(url, 1, WORKSPACES, seconds / 2, tenant="bench", prefix="s")
            )
            base = await echo_load(url, CLIENTS, seconds / 4)
            print(many.table())
            print()
            print("\n".join(compare(many, one)))
            rate = total_rate(many)
            print(
                f"\nwhole mix, {CLIENTS} clients: {rate:,.0f} ops/s; bare echo, {CLIENTS} "
                f"clients: {base.rate:,.0f} req/s; ratio {rate / base.rate:.3f}x "
                f"(p50 {base.pct(0.5):.2f} ms)"
            )
            failures = many.failures + one.failures
            if failures:
                print(f"FAILURES: {len(failures)}")
                print("\n".join(f"  {line}" for line in failures[:10]))
        finally:
            echo.stop()
            up.stop()
