"""Forks on a cluster (issue 33, item 5): two writers each serving a partition of the
workspaces, the fork made through one, the purge (or scrub) of its source through the other.
Each writer once knew a source's forks from its own projection only: the source's writer
purged it while a fork made through the other stood on it, and the fork's reads broke. The
shared record (WS_FORKS, ``infra/fork_registry.py``) makes a fork and a purge or a scrub of
its source exclusive, whichever writers they reach."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from contracts.subjects import Subjects
from core.secrets import Secrets
from infra.fork_registry import Registry
from infra.runtime import Running, Settings
from quill.client import Quill
from quill_cli.natsserver import NatsServer
from quill_cli.tools import scrub as scrub_tool
from services.writer.app import Writer, start_writer
from services.writer.config import WriterConfig
from tests.helpers import answers, eventually, partitioned_nats, start_reader

PARTITIONS = 4
TENANT = "acme"
_NUMBERS = itertools.count(1)
SECRET = "sk-live-0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    with partitioned_nats(tmp_path_factory.mktemp("nats"), PARTITIONS) as server:
        yield server


class Cluster:
    def __init__(self, a: Writer, b: Writer, quill: Quill) -> None:
        self.a, self.b, self.quill = a, b, quill

    def name(self, writer: Writer, prefix: str) -> str:
        """A new workspace name whose partition ``writer`` serves."""
        assert writer.partitions is not None
        while True:
            name = f"{prefix}{next(_NUMBERS)}"  # never one an earlier test made
            if Subjects.partition_of(TENANT, name, PARTITIONS) in writer.partitions.held:
                return name

    async def source(self, prefix: str = "src") -> str:
        name = self.name(self.a, prefix)
        ws = self.quill.workspace(f"{TENANT}/{name}")
        await ws.create()
        await ws.write("inherited.txt", f"{name}'s own\n")
        return name

    async def reads_inherited(self, fork: str, source: str) -> None:
        ws = self.quill.workspace(f"{TENANT}/{fork}")

        async def read() -> bool:
            try:
                return await ws.read_text("inherited.txt") == f"{source}'s own\n"
            except QuillError:
                return False

        await eventually(read, timeout=20)


@pytest_asyncio.fixture
async def cluster(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with AsyncExitStack() as stack:
        writers: list[Writer] = []
        for name in ("writer-a", "writer-b"):
            settings = Settings(nats_url=nats_server.url, data_dir=tmp_path / name, instance=name)
            running: Running[Writer] = await start_writer(
                settings, WriterConfig(partitions=PARTITIONS, lease_ttl=5.0)
            )
            stack.push_async_callback(running.stop)
            await answers(nats_server.url, "writer", name)
            writers.append(running.service)
        a, b = writers

        async def balanced() -> bool:
            assert a.partitions is not None and b.partitions is not None
            ha, hb = set(a.partitions.held), set(b.partitions.held)
            return len(ha) == len(hb) == PARTITIONS // 2 and not ha & hb

        await eventually(balanced, timeout=30)
        await start_reader(stack, nats_server.url, tmp_path / "reader")
        quill = await Quill.connect(nats_server.url, actor="tester", timeout=10)
        stack.push_async_callback(quill.close)
        yield Cluster(a, b, quill)


async def test_a_purge_through_one_writer_is_refused_for_a_fork_made_through_the_other(
    cluster: Cluster,
) -> None:
    quill = cluster.quill
    source = await cluster.source()
    fork = cluster.name(cluster.b, "fork")  # served by writer b; the source by writer a
    await quill.fork(f"{TENANT}/{source}", fork)
    with pytest.raises(QuillError) as refused:
        await quill.workspace(f"{TENANT}/{source}").purge()
    assert refused.value.code == ErrorCode.CONFLICT
    assert refused.value.details["forks"] == [fork]
    await cluster.reads_inherited(fork, source)  # the fork still reads what it inherited
    # once the fork is purged (through b), the source may be (through a)
    await quill.workspace(f"{TENANT}/{fork}").purge()
    await quill.workspace(f"{TENANT}/{source}").purge()
    with pytest.raises(QuillError) as gone:
        await quill.fork(f"{TENANT}/{source}", cluster.name(cluster.b, "late"))
    assert gone.value.code == ErrorCode.WORKSPACE_NOT_FOUND


async def _race(cluster: Cluster, forks_each: int, at: float | None) -> tuple[bool, list[str]]:
    """Forks of one source through both writers and purges of it, all at once (the purges
    sent from ``at``, a fraction of the forks sent before them; None: as soon as a fork is
    on the source's record, maybe not appended yet): whether a purge went through, and the
    forks that were made."""
    quill = cluster.quill
    source = await cluster.source("race")
    names = [cluster.name(w, "rf") for _ in range(forks_each) for w in (cluster.a, cluster.b)]

    async def fork(name: str) -> str | None:
        try:
            await quill.fork(f"{TENANT}/{source}", name)
        except QuillError as exc:
            assert exc.code in (ErrorCode.CONFLICT, ErrorCode.WORKSPACE_NOT_FOUND), exc
            return None
        return name

    async def purge() -> bool:
        try:
            await quill.workspace(f"{TENANT}/{source}").purge()
        except QuillError as exc:
            assert exc.code in (ErrorCode.CONFLICT, ErrorCode.WORKSPACE_NOT_FOUND), exc
            return False
        return True

    async def purges_once_registered() -> list[bool]:
        registry = Registry(quill.nc.jetstream(), Subjects(), "test")

        async def registered() -> bool:
            return bool((await registry.record(TENANT, source)).forks)

        await eventually(registered, timeout=20)
        return list(await asyncio.gather(*(purge() for _ in range(3))))

    jobs: list[Any] = [fork(n) for n in names]
    if at is None:
        jobs.append(purges_once_registered())
    else:
        start = round(at * len(names))
        jobs[start:start] = [purge() for _ in range(3)]
    outcomes = await asyncio.gather(*jobs)
    purged = any(o is True or (isinstance(o, list) and any(o)) for o in outcomes)
    made = [o for o in outcomes if isinstance(o, str)]
    for name in made:  # every fork made still reads what it inherited
        await cluster.reads_inherited(name, source)
    assert not (purged and made), f"{source} purged under its forks {made}"
    if at is None:  # a fork stood on the record when the purges were sent
        assert not purged and made
    return purged, made


async def test_forks_and_purges_racing_on_both_writers_never_leave_a_fork_without_source(
    cluster: Cluster,
) -> None:
    for at in (0.0, 1.0, None):
        await _race(cluster, 3, at)


@pytest.mark.slow
async def test_forks_and_purges_racing_many_rounds(cluster: Cluster) -> None:
    seen: set[bool] = set()
    for i in range(20):
        purged, _made = await _race(cluster, 5, None if i % 2 else i / 19)
        seen.add(purged)
    print(f"outcomes seen (purge went through): {sorted(seen)}")


async def test_a_fork_made_while_its_source_is_scrubbed_is_refused(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    quill = cluster.quill
    source = cluster.name(cluster.a, "scrubbed")
    ws = quill.workspace(f"{TENANT}/{source}")
    await ws.create()
    await ws.write("inherited.txt", f"key = {SECRET}\n")
    fork = cluster.name(cluster.b, "during")
    during: list[BaseException | None] = []
    looked = scrub_tool.stores.kv_hits

    async def kv_hits(*args: Any, **kwargs: Any) -> Any:
        """Between the scrub's reading of the log and its append: a fork, through writer b."""
        try:
            await quill.fork(f"{TENANT}/{source}", fork)
            during.append(None)
        except QuillError as exc:
            during.append(exc)
        return await looked(*args, **kwargs)

    monkeypatch.setattr(scrub_tool.stores, "kv_hits", kv_hits)
    done = await scrub_tool.scrub(quill.nc, Subjects(), TENANT, source, Secrets({"k": SECRET}))
    assert done.events_changed
    [error] = during
    assert isinstance(error, QuillError), "a fork was made while its source was scrubbed"
    assert error.code == ErrorCode.CONFLICT and error.details["mark"] == "scrubbing"
    # once the scrub is over, the fork is made, of the scrubbed history
    await quill.fork(f"{TENANT}/{source}", fork)
    inherited = await quill.workspace(f"{TENANT}/{fork}").read_text("inherited.txt")
    assert SECRET not in inherited


async def test_a_source_is_not_compacted_while_a_fork_made_through_the_other_writer_stands(
    cluster: Cluster,
) -> None:
    """Compaction drops the history a fork reads up to its fork point: the source's writer
    (a) holds it while a fork made through writer b stands on it, which its own projection
    does not know of; once the fork is purged, the source is compacted."""
    quill = cluster.quill
    source = cluster.name(cluster.a, "capped")
    ws = quill.workspace(f"{TENANT}/{source}")
    await ws.create(limits=LimitsPatch(max_versions=2))
    await ws.write("inherited.txt", f"{source}'s own\n")
    fork = cluster.name(cluster.b, "fork")
    await quill.fork(f"{TENANT}/{source}", fork)
    for i in range(40):  # past max_versions 2 and its slack: due many times over
        await ws.write("hot.md", f"hot {i}\n")
    first = (await ws.events(after=0, limit=1)).events[0]
    assert first.version == 1  # the log was not compacted
    await cluster.reads_inherited(fork, source)
    await quill.workspace(f"{TENANT}/{fork}").purge()
    for i in range(40):
        await ws.write("hot.md", f"again {i}\n")

    async def compacted() -> bool:
        await ws.write("hot.md", "once more\n")
        return (await ws.events(after=0, limit=1)).events[0].version > 1

    await eventually(compacted, timeout=30)
