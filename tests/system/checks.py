"""Checks after a load or a fault, reusable by any system test (``quill up`` or a cluster).

* ``verify_acked``: every acknowledged change is there at its version, and each path ends
  with its last acknowledged write (or a later attempt that failed retriably).
* ``verify_chain``: a workspace's log in WS_EVENTS is whole: each payload hashes to its
  ``Ws-Event-Hash``, versions run without gap or repeat, each event links to the previous
  one's hash, and no request was appended twice.
* ``replicas_converge``: every live reader replica answers the same tree hash at a version.
* ``verify_run``: all of them after a ``loadgen`` run, and no failure the clients saw.

Each raises ``AssertionError`` listing what is wrong. ``verify_chain`` lists every break
itself (and a request appended twice, which replay does not look for), then has
``quill_cli.tools.replay`` (``quill verify``) fold the log, which checks each event's tree
hash against the tree rebuilt from the events before it.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client as NATS
from nats.js.api import ConsumerConfig, DeliverPolicy

from contracts import codec, hashing
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import HistoryCompacted
from contracts.subjects import Subjects, split_workspace
from core.plan import Committed
from infra import bus
from infra import log as eventlog
from quill.client import Quill
from quill_cli.tools import replay
from tests.helpers import eventually
from tests.system.loadgen import Acked, Report

SUBJECTS = Subjects()
MAX_LISTED = 20


def _fail(problems: list[str], what: str) -> None:
    if problems:
        shown = "\n  ".join(problems[:MAX_LISTED])
        more = (
            f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        )
        raise AssertionError(f"{len(problems)} {what}:\n  {shown}{more}")


def _counter(line: str) -> tuple[str, int]:
    key, _, value = line.partition("=")
    return key, int(value)


async def verify_acked(
    quill: Quill, acked: Sequence[Acked], unsure: Iterable[Acked] = (), *, parallel: int = 32
) -> None:
    """Every change in ``acked`` is present at its version: a whole file equal to its content
    (``write``, ``exec``, ``seed``), a line the file holds (``edit``, ``key=count``). And now:
    each file holds its last acked content, or content attempted after that ack without
    one (``unsure``); each counter is at least its last acked count and at most that plus
    the attempts since.

    Raises:
        AssertionError: what is missing or wrong (up to 20 listed).
    """
    problems: list[str] = []
    gate = asyncio.Semaphore(parallel)

    async def content(name: str, path: str, version: int | None) -> str | None:
        async with gate:
            try:
                got = await quill.workspace(name).read(path, version=version)
            except QuillError as exc:
                problems.append(f"{name} {path} at v{version}: {exc}")
                return None
            return got.content

    async def at_version(change: Acked) -> None:
        text = await content(change.workspace, change.path, change.version)
        if text is None:
            return
        if change.kind == "edit":
            ok = change.content in text.splitlines()
        else:
            ok = text == change.content
        if not ok:
            problems.append(f"{change.workspace} {change.path} at v{change.version}: lost")

    await asyncio.gather(*[at_version(c) for c in acked])

    latest: dict[tuple[str, str, str], Acked] = {}
    for change in acked:
        key = _counter(change.content)[0] if change.kind == "edit" else ""
        slot = (change.workspace, change.path, key)
        if slot not in latest or change.version > latest[slot].version:
            latest[slot] = change
    later: defaultdict[tuple[str, str, str], list[Acked]] = defaultdict(list)
    for attempt in unsure:
        key = _counter(attempt.content)[0] if attempt.kind == "edit" else ""
        last = latest.get((attempt.workspace, attempt.path, key))
        if last is None or attempt.at >= last.at:
            later[(attempt.workspace, attempt.path, key)].append(attempt)
    for name in {c.workspace for c in acked}:  # read the final state as of the newest ack
        newest = max(c.version for c in acked if c.workspace == name)
        ws = quill.workspace(name)
        ws.last_version = max(ws.last_version, newest)

    async def final(slot: tuple[str, str, str], last: Acked) -> None:
        text = await content(slot[0], slot[1], None)
        if text is None:
            return
        tries = later.get(slot, [])
        if last.kind != "edit":
            if text != last.content and text not in {t.content for t in tries}:
                problems.append(f"{slot[0]} {slot[1]}: not its last acked write (v{last.version})")
            return
        lines = dict(_counter(x) for x in text.splitlines() if x.startswith(slot[2] + "="))
        low = _counter(last.content)[1]
        if not low <= lines.get(slot[2], -1) <= low + len(tries):
            problems.append(
                f"{slot[0]} {slot[1]}: {slot[2]}={lines.get(slot[2])}, acked {low} "
                f"(+{len(tries)} unsure)"
            )

    await asyncio.gather(*[final(slot, last) for slot, last in latest.items()])
    _fail(problems, "acknowledged changes missing or wrong")


@dataclass(frozen=True)
class Chain:
    """A verified log: its first and last versions, and the tree hash after each event."""

    first: int
    last: int
    last_hash: str
    tree_hashes: dict[int, str]


async def read_log(nc: NATS, tenant: str, workspace: str, timeout: float) -> list[Committed]:
    """The whole log of ``tenant/workspace`` in WS_EVENTS, each payload checked against its
    hash header. (Not ``infra.log.read``: a corrupt event raised in its callback
    is only logged, and the read then waits out its timeout.)

    Raises:
        infra.log.CorruptEvent: a payload does not match its hash.
        TimeoutError: the log did not arrive within ``timeout``.
    """
    js = nc.jetstream()
    subject = SUBJECTS.evt(tenant, workspace)
    upto = await eventlog.last_seq(js, subject)
    out: list[Committed] = []
    if upto == 0:
        return out
    config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    sub = await js.subscribe(subject, ordered_consumer=True, config=config)
    try:
        async with asyncio.timeout(timeout):
            while not out or out[-1].seq < upto:
                out.append(eventlog.committed(await sub.next_msg(timeout=timeout)))
    finally:
        await sub.unsubscribe()
    return out


async def verify_chain(nc: NATS, tenant: str, workspace: str, timeout: float = 60.0) -> Chain:
    """Read the whole log of ``tenant/workspace`` and verify it (see the module docstring),
    replay included. A log that starts at a ``history_compacted`` event (``max_versions``)
    is verified from there.

    Raises:
        AssertionError: the chain is broken (every break listed), or the log is empty.
        infra.log.CorruptEvent: a payload does not match its hash.
    """
    events = await read_log(nc, tenant, workspace, timeout)
    if not events:
        raise AssertionError(f"{tenant}/{workspace}: the log is empty")
    problems: list[str] = []
    first = events[0].event
    if first.version != 1 and not isinstance(first, HistoryCompacted):
        problems.append(f"the log starts at v{first.version}")
    if first.version == 1 and first.prev_hash != hashing.ZERO_HASH:
        problems.append("v1 does not start the chain from the zero hash")
    requests: dict[str, int] = {}
    for before, item in zip([None, *events], events, strict=False):
        event = item.event
        if (event.tenant, event.workspace) != (tenant, workspace):
            problems.append(f"seq {item.seq}: an event of {event.tenant}/{event.workspace}")
        if before is not None:
            if event.version != before.event.version + 1:
                problems.append(f"seq {item.seq}: v{event.version} after v{before.event.version}")
            if event.prev_hash != before.hash:
                problems.append(
                    f"v{event.version}: prev_hash does not link to v{event.version - 1}"
                )
        if event.request_id and event.request_id in requests:
            problems.append(
                f"v{event.version}: request {event.request_id} already appended "
                f"at v{requests[event.request_id]}"
            )
        requests.setdefault(event.request_id, event.version)
    _fail(problems, f"breaks in the chain of {tenant}/{workspace}")
    try:
        fold = await replay.replay(nc.jetstream(), SUBJECTS, tenant, workspace)
    except QuillError as exc:
        raise AssertionError(f"{tenant}/{workspace}: the replay refuses the log: {exc}") from exc
    if (fold.version, fold.last_hash) != (events[-1].event.version, events[-1].hash):
        raise AssertionError(f"{tenant}/{workspace}: the replay ends at v{fold.version}")
    return Chain(
        first=first.version,
        last=events[-1].event.version,
        last_hash=events[-1].hash,
        tree_hashes={c.event.version: c.event.tree_hash for c in events},
    )


async def pings(
    nc: NATS, service: str = "", *, expect: int | None = None, window: float = 0.5
) -> list[dict[str, Any]]:
    """The instances of ``service`` (all services: ``""``) that answer a ping:
    ``{"service", "instance", "pid", ...}``, gathered until ``expect`` have answered or
    ``window`` seconds have passed."""
    return await bus.ping_all(nc, SUBJECTS, service or None, window, expect=expect)


async def replica_info(
    nc: NATS, instance: str, tenant: str, workspace: str, version: int, timeout: float
) -> rp.WorkspaceInfo:
    """``info`` as of ``version`` from one reader replica, waiting (up to ``timeout``) while
    it has not applied that version yet.

    Raises:
        QuillError: the replica's error, or ``TIMEOUT``.
    """
    subject = SUBJECTS.replica(instance, tenant, workspace, "info")
    body = codec.encode(rq.WorkspaceInfoQuery(version=version, min_version=version))
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            msg = await nc.request(subject, body, timeout=max(0.1, min(left, 10.0)))
            return codec.decode_reply(msg.data, rp.WorkspaceInfo)[1]
        except QuillError as exc:
            if not exc.retriable or left <= 0:
                raise
        except Exception as exc:  # no reply in time, no responders (restarting)
            if left <= 0:
                raise QuillError(ErrorCode.TIMEOUT, f"{instance}: {exc!r}") from None
            await asyncio.sleep(0.2)  # a client's pause before asking again


async def replicas_converge(
    nc: NATS,
    tenant: str,
    workspace: str,
    version: int,
    *,
    expect_replicas: int = 1,
    tree_hash: str | None = None,
    timeout: float = 30.0,
) -> dict[str, str]:
    """Ask every live reader replica for the tree hash of ``tenant/workspace`` at ``version``
    and check they agree (and equal ``tree_hash``, the log's, when given). Returns the tree
    hash by replica.

    Raises:
        AssertionError: fewer than ``expect_replicas`` answer, or they disagree.
    """
    deadline = time.monotonic() + timeout

    async def enough() -> list[dict[str, Any]] | None:
        readers = await pings(nc, "reader", window=1.0)  # one may be restarting
        return readers if len(readers) >= expect_replicas else None

    readers = await eventually(enough, timeout, f"{expect_replicas} reader replicas answer")
    left = max(1.0, deadline - time.monotonic())
    infos = await asyncio.gather(
        *[replica_info(nc, r["instance"], tenant, workspace, version, left) for r in readers]
    )
    hashes = {r["instance"]: i.tree_hash for r, i in zip(readers, infos, strict=True)}
    wanted = {tree_hash} if tree_hash else set()
    if len(set(hashes.values()) | wanted) != 1 or any(i.version != version for i in infos):
        raise AssertionError(
            f"{tenant}/{workspace} at v{version}: replicas disagree: {hashes}"
            + (f" (the log says {tree_hash})" if tree_hash else "")
        )
    return hashes


async def verify_run(url: str, nc: NATS, report: Report, *, expect_replicas: int = 1) -> None:
    """Everything issue 6 asks after a load (with faults or not): clients saw only expected
    errors, every acked change is there, each workspace's chain verifies, and every reader
    replica (at least ``expect_replicas``) answers the log's tree hash at its last version.

    Raises:
        AssertionError: what is wrong (the report's table included for failures).
    """
    assert not report.failures, report.table()
    mixed = [op for op, weight in report.config.mix.items() if weight > 0]
    assert report.acked and all(report.stats[op].ok for op in mixed), report.table()
    quill = await Quill.connect(url, timeout=10, retries=5)
    try:
        await verify_acked(quill, report.acked, report.unsure)
    finally:
        await quill.close()
    for name in report.config.names():
        tenant, workspace = split_workspace(name)
        chain = await verify_chain(nc, tenant, workspace)
        await replicas_converge(
            nc,
            tenant,
            workspace,
            chain.last,
            expect_replicas=expect_replicas,
            tree_hash=chain.tree_hashes[chain.last],
        )
