"""Item 4 of issue 28 (its regex and diff part): one tenant's expensive requests cost that
tenant only.

Tenant b sends, through a bare NATS client with its own credentials, the most expensive
requests it can: greps whose regular expression backtracks exponentially (one RE2 can run in
linear time, one it cannot), ``modify`` with such a regex, an ``edit`` whose closest-text
search (``difflib``) took 47 s, a diff of a 1.5 MB file (``difflib``: quadratic), a glob that
backtracked for 10 s per path. Before, each held the reader or the writer for its whole
budget or more, and tenant a's reads and writes waited. Now a regex RE2 can run and every
glob take linear time, the rest runs in worker processes (a few at a time per tenant, under
a budget, on CPU the services leave), and tenant a's latency stays what it was: the p99 of
its reads and writes during b's flood is within 3x of the p99 measured idle, in the same
test, in alternating phases, cycle by cycle (see ``report`` and each test).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS

from contracts.limits import OFFLOAD_PER_TENANT, OFFLOAD_QUEUED_PER_TENANT
from tests.up import PASSWORDS, TENANTS, Up

pytestmark = pytest.mark.up(tenants=TENANTS)

CATASTROPHIC = "(a|aa)+(?=#)"
"""Exponential for a backtracking engine over ``a`` x40 and a ``!``, and no RE2 form
(lookahead): it runs on the fallback engine, within its budget."""
LINEAR = "(a|aa)+$"
"""Exponential for a backtracking engine too, but RE2 runs it in linear time."""
GLOB = "**/a*/**/a*/**/a*/**/a*/**/b"
"""wcmatch's regex took 10 s to match it against one 200-character path."""
EVIL_LINES = 2_000
FLOOD_WAIT_MS = 3_000
"""How long b's client waits for each request of its flood."""
DEEP = "deep/" + "a/" * 60 + "x.txt"


@dataclass
class Tenant:
    """A bare NATS client with one tenant's credentials."""

    name: str
    nc: NATS

    async def ask(
        self, kind: str, workspace: str, op: str, body: dict[str, Any], timeout_ms: int = 60_000
    ) -> dict[str, Any]:
        """The reply (decoded) to one request; ``timeout_ms`` is said in ``Ws-Timeout``."""
        subject = f"ws.{kind}.{self.name}.{workspace}.{op}"
        headers = {"Ws-Timeout": str(timeout_ms)}
        if kind == "cmd":
            headers["Ws-Request-Id"] = f"r{random.getrandbits(64):x}"
        msg = await self.nc.request(
            subject, json.dumps(body).encode(), timeout=timeout_ms / 1000 + 30, headers=headers
        )
        reply: dict[str, Any] = json.loads(msg.data)
        return reply

    async def ok(self, kind: str, workspace: str, op: str, body: dict[str, Any]) -> Any:
        reply = await self.ask(kind, workspace, op, body)
        assert reply["ok"], reply
        return reply


@dataclass
class Stack:
    up: Up
    a: Tenant
    b: Tenant
    diff_versions: tuple[int, int]
    edit_old: str
    answered: dict[str, list[str]] = field(default_factory=dict)
    every_kind: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once each of b's kinds of request has been answered."""
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    """b's loops send no more once set (what they sent is answered: its work is over)."""


@contextlib.asynccontextmanager
async def tenants(up: Up) -> AsyncIterator[Stack]:
    """Both tenants connected, their workspaces made: a's small one, b's hostile one."""
    conns = [
        await nats.connect(up.nats_url, user=t, password=PASSWORDS[t], inbox_prefix=f"_INBOX_{t}")
        for t in ("a", "b")
    ]
    a, b = Tenant("a", conns[0]), Tenant("b", conns[1])
    try:
        await a.ok("cmd", "main", "create", {"exist_ok": True})
        await a.ok("cmd", "main", "write", {"path": "notes.md", "content": "hello\n" * 20})
        await b.ok("cmd", "evil", "create", {"exist_ok": True})
        evil = ("a" * 40 + "!\n") * EVIL_LINES
        await b.ok("cmd", "evil", "write", {"path": "evil/evil.txt", "content": evil})
        await b.ok("cmd", "evil", "write", {"path": DEEP, "content": "x\n"})
        rng = random.Random(7)
        vocabulary = [f"line {i} " * 3 + "\n" for i in range(150)]
        size = 1_500_000 // len(vocabulary[50])
        big = ["".join(rng.choice(vocabulary) for _ in range(size)) for _ in range(2)]
        first = await b.ok("cmd", "evil", "write", {"path": "big/big.txt", "content": big[0]})
        second = await b.ok("cmd", "evil", "write", {"path": "big/big.txt", "content": big[1]})
        lines = ["".join(rng.choice("ab") for _ in range(2000)) for _ in range(500)]
        await b.ok("cmd", "evil", "write", {"path": "edit/edit.txt", "content": "\n".join(lines)})
        edit_old = "".join(rng.choice("ab") for _ in range(2000)) + "c"
        yield Stack(up, a, b, (first["version"], second["version"]), edit_old)
    finally:
        for conn in conns:
            await conn.close()


def floods(s: Stack) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """b's most expensive requests, by name: (kind, op, body). Those that were as expensive
    before and take no time now (a regex RE2 runs, a glob) are in
    ``test_each_expensive_request_ends_within_its_budget_with_a_clear_answer``: in a loop
    they would be a flood of cheap requests, which costs every tenant a little (a rate limit's
    matter, not this one's)."""
    regex_op = {"type": "regex_replace", "pattern": CATASTROPHIC, "replacement": "x"}
    return {
        "grep": ("qry", "grep", {"pattern": CATASTROPHIC, "path": "evil"}),
        "modify": ("cmd", "modify", {"path": "evil/evil.txt", "operations": [regex_op]}),
        "edit": (
            "cmd",
            "edit",
            {"path": "edit/edit.txt", "old_string": s.edit_old, "new_string": "x"},
        ),
        "diff": (
            "qry",
            "diff",
            {"path": "big/big.txt", "from_version": s.diff_versions[0]}
            | {"to_version": s.diff_versions[1]},
        ),
    }


async def flood(s: Stack, name: str, kind: str, op: str, body: dict[str, Any]) -> None:
    """One of b's loops: the same expensive request again and again, one at a time, as a
    client would (after a busy answer, no sooner than its ``retry_after_ms``). b waits
    ``FLOOD_WAIT_MS`` for each: its work ends by then, so that a flood ends soon after b
    stops sending (then a is measured idle again)."""
    while not s.stop.is_set():
        reply = await s.b.ask(kind, "evil", op, body, timeout_ms=FLOOD_WAIT_MS)
        error = reply.get("error") or {}
        s.answered.setdefault(name, []).append(error.get("code", "ok"))
        if len(s.answered) == len(floods(s)):
            s.every_kind.set()
        hint = (error.get("details") or {}).get("retry_after_ms")
        if error.get("code") == "UNAVAILABLE" and hint:
            await asyncio.sleep(hint / 1000)  # the client's backoff, not a synchronisation


async def a_latencies(s: Stack, count: int, until: asyncio.Event | None = None) -> Samples:
    """a's reads and writes, one after the other: ``count`` of each at least, and on until
    ``until`` is set."""
    samples = Samples()
    n = 0
    while n < count or (until is not None and not until.is_set()):
        began = time.perf_counter()
        await s.a.ok("qry", "main", "read", {"path": "notes.md"})
        samples.reads.append(time.perf_counter() - began)
        began = time.perf_counter()
        await s.a.ok("cmd", "main", "write", {"path": "notes.md", "content": f"n {n}\n"})
        samples.writes.append(time.perf_counter() - began)
        n += 1
    return samples


@dataclass
class Samples:
    reads: list[float] = field(default_factory=list)
    writes: list[float] = field(default_factory=list)

    def __iadd__(self, other: Samples) -> Samples:
        self.reads += other.reads
        self.writes += other.writes
        return self


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def measure(s: Stack, cycles: int, count: int, copies: int) -> list[tuple[Samples, Samples]]:
    """a's latencies under b's flood and idle, in alternating phases of as many samples
    each, so that what else the machine runs weighs on both alike. A flood phase runs
    ``copies`` loops of each of b's requests; a samples ``count`` times at least, and on
    until each kind has been answered (so that its samples span b's work). Then b stops, and
    its last requests are answered (no sample is taken meanwhile) before the idle phase.
    Returns each cycle's (idle, flooded) samples."""
    await a_latencies(s, 30)  # warm: connections, caches
    cycled: list[tuple[Samples, Samples]] = []
    for _ in range(cycles):
        s.answered.clear()
        s.every_kind.clear()
        s.stop.clear()
        loops = [
            asyncio.create_task(flood(s, name, kind, op, body))
            for name, (kind, op, body) in floods(s).items()
            for _ in range(copies)
        ]
        await s.b.nc.flush()  # b's first requests are at the server before a's next one
        try:
            flooded = await a_latencies(s, count, s.every_kind)
        finally:
            s.stop.set()  # and wait for b's last answers: no work of b's is left running
            await asyncio.gather(*loops, return_exceptions=True)
        cycled.append((await a_latencies(s, len(flooded.reads)), flooded))
    return cycled


def report(cycled: list[tuple[Samples, Samples]]) -> list[tuple[float, float]]:
    """Prints a's p99 idle and under b's flood, over every cycle and cycle by cycle, and
    returns each cycle's ratios (reads, writes): its flooded phase's p99 over its idle one's.

    Per cycle, because the idle and the flooded phase of one cycle are next to each other in
    time: under ``-n 2`` another test runs beside this one, and its busiest moments fall in
    one phase or the other. Pooled, one such moment in any flooded phase sets the whole p99
    (CI: 3.02x pooled on a run whose flood alone measures 1.25x)."""
    idle, busy = Samples(), Samples()
    ratios: list[tuple[float, float]] = []
    for quiet, flooded in cycled:
        idle += quiet
        busy += flooded
        ratios.append(
            (p99(flooded.reads) / p99(quiet.reads), p99(flooded.writes) / p99(quiet.writes))
        )
    print(
        f"\na's p99 read {p99(idle.reads) * 1000:.1f} ms idle, {p99(busy.reads) * 1000:.1f} ms"
        f" under b's flood ({len(busy.reads)} samples); write {p99(idle.writes) * 1000:.1f}"
        f" -> {p99(busy.writes) * 1000:.1f} ms; per cycle (read, write): "
        + ", ".join(f"{r:.2f}x/{w:.2f}x" for r, w in ratios)
    )
    return ratios


@pytest.mark.timeout(300)
async def test_b_floods_expensive_requests_and_a_keeps_its_latency(up: Up) -> None:
    """The short version, in every run beside other tests (``-n 2``): in its best cycle,
    a's p99 under b's flood is within 3x of its p99 idle. A flood that reaches a (b's regex
    or diff on a service's event loop: a's requests waited seconds behind it, hundreds of
    times its idle p99) moves every cycle; another test's busy moments beside this one move
    some cycles (a full run's: 6.50x, 0.80x, 0.58x, 3.48x) and not all. The bound on the
    median of many cycles is the long version's, run alone."""
    async with tenants(up) as s:
        ratios = report(await measure(s, cycles=4, count=100, copies=1))
        print("b's answers:", {k: sorted(set(v)) for k, v in s.answered.items()})
        assert min(r for r, _ in ratios) <= 3 and min(w for _, w in ratios) <= 3


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_b_floods_harder_and_longer(up: Up) -> None:
    """The same with three loops of each of b's requests (more than its turns and queue),
    over twelve cycles of at least 300 of a's samples each: the median of the cycles' ratios
    within 3x (run it alone: ``pytest -m slow -n 0 -k floods_harder``)."""
    async with tenants(up) as s:
        ratios = report(await measure(s, cycles=12, count=300, copies=3))
        reads = statistics.median(r for r, _ in ratios)
        writes = statistics.median(w for _, w in ratios)
        print(f"median {reads:.2f}x/{writes:.2f}x")
        assert reads <= 3 and writes <= 3


async def test_each_expensive_request_ends_within_its_budget_with_a_clear_answer(
    up: Up,
) -> None:
    """Each answered within its budget, with its own clear answer; asked at once (the grep
    and the diff are the reader's, the modify and the edit the writer's: within b's turns),
    as a client may."""
    async with tenants(up) as s:
        b = s.b
        linear = await b.ask("qry", "evil", "grep", {"pattern": LINEAR, "path": "evil"})
        assert linear["ok"] and linear["result"]["total"] == 0  # RE2: no budget needed

        async def grep() -> None:
            body = {"pattern": CATASTROPHIC, "path": "evil"}
            grep = await b.ask("qry", "evil", "grep", body)
            assert grep["error"]["code"] == "TIMEOUT"
            assert grep["error"]["message"] == "Search took too long: narrow the pattern or path"

        async def diff() -> None:
            kind, op, body = floods(s)["diff"]
            diff = await b.ask(kind, "evil", op, body)
            assert diff["error"]["code"] == "SIZE_LIMIT_EXCEEDED", diff
            assert diff["error"]["message"].startswith("Too large to diff here: big/big.txt (")
            details = diff["error"]["details"]
            assert details["from_bytes"] > 1_000_000 and details["to_bytes"] > 1_000_000

        async def modify_then_edit() -> None:  # one workspace's commands: one at a time
            kind, op, body = floods(s)["modify"]
            modify = await b.ask(kind, "evil", op, body)
            assert modify["error"]["code"] == "TIMEOUT"
            assert modify["error"]["message"] == f"regex {CATASTROPHIC!r} took too long"
            kind, op, body = floods(s)["edit"]
            edit = await b.ask(kind, "evil", op, body)
            assert edit["error"]["code"] == "NO_MATCH"
            assert "took too long" in edit["error"]["message"]

        await asyncio.gather(grep(), diff(), modify_then_edit())
        glob = await b.ask("qry", "evil", "glob", {"pattern": GLOB, "path": "deep"})
        assert glob["ok"] and glob["result"]["total"] == 0


async def test_a_tenant_past_its_turns_and_queue_is_answered_busy(up: Up) -> None:
    async with tenants(up) as s:
        body = {"pattern": CATASTROPHIC, "path": "evil"}
        many = OFFLOAD_PER_TENANT + OFFLOAD_QUEUED_PER_TENANT + 3
        asked = [  # each client waits 6 s: its work stops (or never starts) then; a's one
            # grep is answered well before, even on a loaded host
            asyncio.create_task(s.b.ask("qry", "evil", "grep", body, timeout_ms=6000))
            for _ in range(many)
        ]
        await asyncio.wait(asked, return_when=asyncio.FIRST_COMPLETED)
        # a's grep, while b's turns and queue are full, is answered at once (its own turn)
        mine = await s.a.ask("qry", "main", "grep", {"pattern": "hel+o"})
        still_waiting = sum(not t.done() for t in asked)
        replies = await asyncio.gather(*asked)
        assert mine["ok"] and mine["result"]["total"] == 20
        assert still_waiting >= OFFLOAD_PER_TENANT  # a was not queued behind b
        refused = [r["error"] for r in replies if r["error"]["code"] == "UNAVAILABLE"]
        assert len(refused) >= 3
        for error in refused:
            assert error["details"]["reason"] == "busy"
            assert error["details"]["queue"] == "tenant_work"
            assert error["details"]["retry_after_ms"] > 0


async def test_work_whose_client_has_gone_never_starts_or_stops(up: Up) -> None:
    async with tenants(up) as s:
        body = {"pattern": CATASTROPHIC, "path": "evil"}
        blockers = [  # b's turns, taken by clients that wait 3 s (the budget is 10 s)
            asyncio.create_task(s.b.ask("qry", "evil", "grep", body, timeout_ms=3000))
            for _ in range(OFFLOAD_PER_TENANT)
        ]
        await s.b.nc.flush()
        # queued behind them by a client that waits 300 ms: it never starts
        gone = await s.b.ask("qry", "evil", "grep", body, timeout_ms=300)
        assert not any(t.done() for t in blockers)
        assert gone["error"]["code"] == "TIMEOUT"
        assert "not started" in gone["error"]["message"]
        # the running ones stop when their clients stop waiting, and give their turns back:
        # a grep whose client waits 2 s more gets one (had they run on for their budget, it
        # would have waited 7 s for a turn, and never started)
        stopped = await asyncio.gather(*blockers)
        assert all(r["error"]["code"] == "TIMEOUT" for r in stopped)
        after = await s.b.ask("qry", "evil", "grep", {"pattern": "a!", "path": "evil"}, 2000)
        assert after["ok"] and after["result"]["total"] == EVIL_LINES
