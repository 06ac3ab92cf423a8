"""Load, and load with chaos, against ``quill up`` (issue 6).

N clients × M workspaces mix reads, writes, edits, greps and commands (``loadgen``); with
chaos, one of ``quill up``'s services (writer, reader, executor in turn) is killed with
SIGKILL every few seconds and its supervisor restarts it. Afterwards: clients saw only the
documented retriable codes (and edit conflicts), every acknowledged change is there, each
workspace's hash chain verifies, and every reader replica (``quill up``'s and a second one
started here) answers the log's tree hash. The short versions always run; ``-m slow`` runs a
minute of each. Run with ``-s`` (or ``-rA``) to see the report tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from contracts import codec, hashing
from contracts import requests as rq
from contracts.events import Event
from contracts.subjects import HEADER_EVENT_HASH, Subjects, split_workspace
from infra import bus
from infra.log import CorruptEvent
from quill.client import Quill
from tests.helpers import LogBuilder, eventually
from tests.system.checks import pings, replicas_converge, verify_acked, verify_chain, verify_run
from tests.system.loadgen import Chaos, LoadConfig, Report, Victim, run_load
from tests.up import Up, running

SERVICES = ("writer", "reader", "executor")


def parent_of(pid: int) -> int:
    """The parent pid of ``pid`` (0 if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


class UpVictims:
    """Victims among ``quill up``'s children, found by ping (which reports the pid), never
    more than ``budget`` kills of one service in ``window`` seconds: the supervisor gives
    up on a child restarted more than 5 times in 60 s."""

    def __init__(self, up: Up, nc: NATS, *, budget: int = 4, window: float = 60.0) -> None:
        assert up.process is not None
        self.owner, self.nc = up.process.pid, nc
        self.budget, self.window = budget, window
        self.kills: defaultdict[str, list[float]] = defaultdict(list)

    async def children(self, service: str) -> list[int]:
        """Pids of ``quill up``'s instances of ``service`` that answer a ping."""
        found = await pings(self.nc, service, window=0.3)
        return [p["pid"] for p in found if parent_of(p["pid"]) == self.owner]

    def victim(self, service: str) -> Victim:
        async def strike() -> str:
            now = time.monotonic()
            recent = [t for t in self.kills[service] if now - t < self.window]
            if len(recent) >= self.budget:
                return f"{service}: spared ({self.budget} kills in {self.window:.0f}s)"
            pids = await self.children(service)
            if not pids:
                return f"{service}: not answering (restarting), spared"
            os.kill(pids[0], signal.SIGKILL)
            self.kills[service] = [*recent, now]
            return f"SIGKILL {service} pid {pids[0]}"

        return strike

    def all(self) -> list[Victim]:
        return [self.victim(s) for s in SERVICES]

    async def recovered(self, timeout: float = 60.0) -> None:
        """Wait until every service is back (restarted by the supervisor) and answering.

        Raises:
            AssertionError: one is not back within ``timeout``, or ``quill up`` gave up.
        """
        missing = list(SERVICES)

        async def back() -> bool:
            nonlocal missing
            missing = [s for s in missing if not await self.children(s)]
            return not missing

        with contextlib.suppress(AssertionError):  # then the assertion names them
            await eventually(back, timeout)
        assert not missing, f"not back after the chaos: {missing}"


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """A ``quill up`` of each test's own (not the module's: load and chaos leave theirs
    changed)."""
    with running(tmp_path / ".quill") as stack:
        yield stack


@pytest_asyncio.fixture
async def second_reader(up: Up, tmp_path: Path) -> AsyncIterator[NATS]:
    """A second reader replica next to ``quill up``'s; yields a connection for the checks
    once both readers answer."""
    log = open(tmp_path / "reader2.log", "wb")  # noqa: SIM115 - closed below
    reader = subprocess.Popen(
        [sys.executable, "-m", "quill", "reader", "--nats-url", up.nats_url]
        + ["--data", str(tmp_path / "reader2")],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    nc = await bus.connect(up.nats_url, "load-checks")
    try:

        async def both() -> bool:
            assert reader.poll() is None, (tmp_path / "reader2.log").read_text()
            return len(await pings(nc, "reader", expect=2)) >= 2

        await eventually(both, 30, "the second reader answering")
        yield nc
    finally:
        await nc.close()
        reader.terminate()
        try:
            reader.wait(15)
        except subprocess.TimeoutExpired:
            reader.kill()
            reader.wait()
        log.close()


async def check(url: str, nc: NATS, report: Report) -> None:
    print(report.table())
    await verify_run(url, nc, report, expect_replicas=2)


async def test_load_short(up: Up, second_reader: NATS) -> None:
    report = await run_load(LoadConfig(up.nats_url, clients=8, workspaces=4, seconds=5))
    await check(up.nats_url, second_reader, report)
    # and the checks do bite: a write never made, a tree hash no replica has
    quill = await Quill.connect(up.nats_url)
    try:
        never = dataclasses.replace(report.acked[-1], content="never written")
        with pytest.raises(AssertionError, match="lost"):
            await verify_acked(quill, [*report.acked, never])
    finally:
        await quill.close()
    tenant, workspace = split_workspace(report.config.names()[0])
    with pytest.raises(AssertionError, match="replicas disagree"):
        await replicas_converge(second_reader, tenant, workspace, 1, tree_hash="f" * 64)


async def test_verify_chain_finds_breaks(nc: NATS) -> None:
    """A log with a repeated request, a gap and a forged link fails ``verify_chain``; a payload
    that does not match its hash header is refused as corrupt."""
    await bus.ensure_streams(nc, Subjects())
    log = LogBuilder("acme", "broken")
    log.run(rq.CreateWorkspace(), "create")
    for i in range(4):
        log.run(rq.WriteFile(path="a.txt", content=f"{i}\n"))
    js, subject = nc.jetstream(), Subjects().evt("acme", "broken")

    async def append(event: Event) -> None:
        payload = codec.encode(event)
        await js.publish(subject, payload, headers={HEADER_EVENT_HASH: hashing.event_hash(payload)})

    first, second, third, _, fifth = (c.event for c in log.log)
    for event in (first, second, third):
        await append(event)
    assert (await verify_chain(nc, "acme", "broken")).last == 3
    await append(msgspec.structs.replace(third, version=4))  # the same request again
    await append(fifth)  # v5 after v4: fine by number, but its prev_hash is v4's original
    with pytest.raises(AssertionError) as broken:
        await verify_chain(nc, "acme", "broken")
    assert "request req-3 already appended at v3" in str(broken.value)
    assert "v4: prev_hash does not link" in str(broken.value)
    assert "v5: prev_hash does not link" in str(broken.value)
    await js.publish(subject, codec.encode(fifth), headers={HEADER_EVENT_HASH: "0" * 64})
    with pytest.raises(CorruptEvent):
        await verify_chain(nc, "acme", "broken")


async def test_chaos_short(up: Up, second_reader: NATS) -> None:
    victims = UpVictims(up, second_reader)
    chaos = Chaos(victims.all(), interval=2.0)
    config = LoadConfig(up.nats_url, clients=8, workspaces=4, seconds=7)
    report = await run_load(config, chaos)
    await victims.recovered()
    assert any(f.what.startswith("SIGKILL") for f in report.faults), report.table()
    await check(up.nats_url, second_reader, report)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_load_long(up: Up, second_reader: NATS) -> None:
    config = LoadConfig(up.nats_url, clients=32, workspaces=16, seconds=60)
    await check(up.nats_url, second_reader, await run_load(config))


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_chaos_long(up: Up, second_reader: NATS) -> None:
    victims = UpVictims(up, second_reader)
    config = LoadConfig(up.nats_url, clients=32, workspaces=16, seconds=60)
    report = await run_load(config, Chaos(victims.all(), interval=5.0))
    await victims.recovered()
    await check(up.nats_url, second_reader, report)


def test_report_table_reads_well() -> None:
    """The table without a stack: one row per op and a total, errors by code."""
    report = Report(LoadConfig("nats://unused", clients=2, workspaces=1), seconds=2.0)
    report.stats["read"].ok, report.stats["read"].latencies = 4, [0.001, 0.002, 0.003, 0.004]
    report.stats["edit"].errors["CONFLICT"] = 3
    table = report.table().splitlines()
    assert table[0] == "load: 2 clients x 1 workspaces, 2.0 s"
    assert table[2].split()[:4] == ["read", "4", "4", "2.0"]
    assert table[4].split()[-1] == "CONFLICT=3"
    assert table[7].split()[:3] == ["all", "7", "4"]
