"""Where the partition fences go in a batch (``Appender._fence``): one check per partition,
on a message whose own workspace CAS is not lost where the batch has one."""

from __future__ import annotations

import asyncio

from services.writer.append import Appender, Group
from services.writer.partitions import Fence

SEQ = "Nats-Expected-Last-Subject-Sequence"
ON = "Nats-Expected-Last-Subject-Sequence-Subject"


def group(subject: str, n: int, fence: Fence | None, expected: int) -> Group:
    future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
    payloads = [b"{}"] * n
    return Group(subject, expected, payloads, ["id"] * n, ["h"] * n, fence=fence, future=future)


def headers(groups: list[Group]) -> list[dict[str, str]]:
    msgs = [
        (g.subject, p, {SEQ: str(g.expected_seq)} if i == 0 else {})
        for g in groups
        for i, p in enumerate(g.payloads)
    ]
    Appender._fence(groups, msgs)
    return [h for _, _, h in msgs]


async def test_one_check_per_partition_preferring_a_groups_second_message() -> None:
    p1, p2 = Fence("ws.fence.1", 40, 3), Fence("ws.fence.2", 41, 1)
    out = headers(
        [
            group("ws.evt.a.lone", 1, p1, 10),
            group("ws.evt.a.pair", 2, p1, 11),
            group("ws.evt.a.other", 1, p2, 12),
            group("ws.evt.a.single-node", 1, None, 13),
        ]
    )
    assert out[0] == {SEQ: "10"}  # keeps its CAS: the pair carries partition 1's fence
    assert out[1] == {SEQ: "11"}
    assert out[2] == {SEQ: "40", ON: "ws.fence.1"}
    assert out[3] == {SEQ: "41", ON: "ws.fence.2"}  # alone in its partition: trades its CAS
    assert out[4] == {SEQ: "13"}


async def test_a_batch_without_fences_keeps_every_cas() -> None:
    out = headers([group("ws.evt.a.b", 2, None, 5)])
    assert out == [{SEQ: "5"}, {}]
