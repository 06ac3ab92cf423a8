"""A bridge serves once every service has seen its claim (``infra.claims.await_seen``), on a
real nats-server, with services played by plain subscribers: one that misses a gather's
window (a loaded host) is waited for, not taken for one that has seen the claim — else an
executor that did not know the workspace was local took its command (a full run: the user
was never asked, the question timed out); one gone for good is named after the timeout."""

from __future__ import annotations

import json

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts.subjects import Subjects
from infra import claims

SUBJECTS = Subjects()


async def service(nc: NATS, instance: str, answers: list[int | None]) -> list[int]:
    """A service answering ``seen`` with each count of ``answers`` in turn (None: no answer
    to that gather; past the list: the last). Returns the counts it answered, as it goes."""
    asked = 0
    answered: list[int] = []

    async def seen(msg: Msg) -> None:
        nonlocal asked
        count = answers[min(asked, len(answers) - 1)]
        asked += 1
        if count is not None:
            body = {"service": "executor", "instance": instance, "local_workspaces": count}
            answered.append(count)
            await msg.respond(json.dumps(body).encode())

    await nc.subscribe(SUBJECTS.bridge("*", "seen"), cb=seen)
    await nc.flush()
    return answered


async def test_a_service_that_misses_a_gather_is_waited_for(nc: NATS) -> None:
    await service(nc, "fast", [0, 1])
    slow = await service(nc, "slow", [0, None, 1])  # the claim's first gather unanswered
    before = await claims.seen(nc, SUBJECTS, "acme")
    assert before == {"fast": 0, "slow": 0}
    behind = await claims.await_seen(nc, SUBJECTS, "acme", before, timeout=30)
    assert behind == [] and slow == [0, 1]  # asked until it said it counts the claim


async def test_a_service_gone_is_named_after_the_timeout(nc: NATS) -> None:
    await service(nc, "fast", [0, 1])
    await service(nc, "gone", [0, None])
    before = await claims.seen(nc, SUBJECTS, "acme")
    assert await claims.await_seen(nc, SUBJECTS, "acme", before, timeout=1) == ["gone"]


async def test_a_service_started_since_counts_the_claim_once(nc: NATS) -> None:
    before = await claims.seen(nc, SUBJECTS, "acme")
    assert before == {}
    await service(nc, "new", [1])
    assert await claims.await_seen(nc, SUBJECTS, "acme", before, timeout=30) == []
