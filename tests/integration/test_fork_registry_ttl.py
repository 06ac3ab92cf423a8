"""The fork record's windows in time (``infra/fork_registry.py``), on a real nats-server's
WS_FORKS bucket and log, with owners whose clocks run ahead instead of waiting minutes: a
mark left by a purge, compaction or scrub that crashed blocks forks only until its TTL; a
running scrub that renews keeps its mark, one whose mark ran out is told so; a fork whose
event never came is stale only after ``FORK_APPEND_TTL_S``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from nats.aio.client import Client as NATS

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Subjects
from infra import bus, fork_registry
from infra.fork_registry import FORK_APPEND_TTL_S, MARK_TTL_S, SCRUB_RENEW_S, Registry


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def owners(nc: NATS) -> tuple[Clock, Callable[[str], Registry]]:
    js = nc.jetstream()
    await bus.ensure_streams(nc, Subjects())
    await fork_registry.bucket(js, 1)
    clock = Clock()
    return clock, lambda owner: Registry(js, Subjects(), owner, clock)


async def refused(call: object) -> QuillError:
    with pytest.raises(QuillError) as caught:
        await call  # type: ignore[misc]
    return caught.value


@pytest.mark.parametrize("kind", ["purging", "compacting", "scrubbing"])
async def test_a_mark_left_by_a_crash_blocks_forks_until_its_ttl(nc: NATS, kind: str) -> None:
    clock, owner = await owners(nc)
    crashed, writer = owner("writer:crashed"), owner("writer:alive")
    await crashed.mark("ttl", f"src-{kind}", kind)  # type: ignore[arg-type]
    clock.now += MARK_TTL_S[kind] - 1
    error = await refused(writer.add_fork("ttl", f"src-{kind}", "f"))
    assert error.code is ErrorCode.CONFLICT and error.details["owner"] == "writer:crashed"
    clock.now += 2  # past its TTL: the owner is taken for crashed
    await writer.add_fork("ttl", f"src-{kind}", "f")
    record = await writer.record("ttl", f"src-{kind}")
    assert record.mark is None and list(record.forks) == ["f"]


async def test_a_scrub_that_renews_keeps_its_mark_and_one_that_lapsed_is_told(nc: NATS) -> None:
    clock, owner = await owners(nc)
    scrub, writer = owner("scrub@host:1"), owner("writer:alive")
    await scrub.mark("ttl", "scrubbed", "scrubbing")
    for _ in range(int(MARK_TTL_S["scrubbing"] // SCRUB_RENEW_S) * 2):  # twice its TTL
        clock.now += SCRUB_RENEW_S
        await scrub.renew("ttl", "scrubbed", "scrubbing")
        error = await refused(writer.add_fork("ttl", "scrubbed", "f"))
        assert error.code is ErrorCode.CONFLICT
        purge = await refused(writer.mark("ttl", "scrubbed", "purging"))  # a scrub's: kept
        assert purge.code is ErrorCode.CONFLICT and purge.details["mark"] == "scrubbing"
    clock.now += MARK_TTL_S["scrubbing"] + 1  # the scrub hung: its mark ran out
    await writer.add_fork("ttl", "scrubbed", "f")  # the fork is made
    lapsed = await refused(scrub.renew("ttl", "scrubbed", "scrubbing"))
    assert lapsed.code is ErrorCode.CONFLICT and "ran out" in lapsed.message


async def test_a_fork_whose_event_never_came_is_stale_only_after_its_ttl(nc: NATS) -> None:
    clock, owner = await owners(nc)
    writer, purger = owner("writer:forking"), owner("writer:purging")
    await writer.add_fork("ttl", "base", "never")  # its append failed: no event in its log
    clock.now += FORK_APPEND_TTL_S - 1  # its event may still be on its way
    error = await refused(purger.mark("ttl", "base", "purging"))
    assert error.code is ErrorCode.CONFLICT and error.details["forks"] == ["never"]
    clock.now += 2
    await purger.mark("ttl", "base", "purging")  # the stale registration dropped
    record = await purger.record("ttl", "base")
    assert record.forks == {} and record.mark is not None and record.mark.kind == "purging"
