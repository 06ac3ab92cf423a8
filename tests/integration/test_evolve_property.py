"""One fold (``core.evolve``) against replay, the projections and a real writer: ``quill
replay``'s fold of the log's payloads (every hash checked) is what the writer holds
(``test_replay_rebuilds_the_fold``); a log applied to a projection (real SQLite, in drawn
batches, compacted now and then) loads (``Store.load``, and its row, read back from the file)
as the log folds, and a log trimmed at a compaction (its manifest ``restore`` d, then the
events after it) folds as the whole (``test_the_projection_loads_the_fold``); a real writer
over a real nats-server, driven through the SDK by the same kind of commands, holds what the
log it appended folds to, as its projection loads it and ``quill replay`` rebuilds it
(``test_a_real_writer_holds_the_fold``).

The commands and the comparison: ``tests/core/evolving.py``; the pure property (the writer's
decisions against the fold, more examples): ``tests/core/test_evolve_property.py``.
"""

from __future__ import annotations

import asyncio
import tempfile
from contextlib import AsyncExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from contracts import hashing
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import HistoryCompacted
from contracts.subjects import Subjects
from core.evolve import WorkspaceState, evolve
from core.plan import Committed
from core.rows import WorkspaceRow
from infra import compaction
from infra.store import Store
from quill.client import Quill
from quill_cli.natsserver import NatsServer
from quill_cli.tools import replay as rpl
from services.writer.app import Writer
from tests.core.build import T0
from tests.core.evolving import (
    COMPACT,
    TENANT,
    Decided,
    actions,
    commands,
    decided,
    folded,
    norm,
    real_actions,
    request,
    session_of,
)
from tests.helpers import start_writer
from tests.integration.real_writer import REAL_WRITER, log_of

# ---------------------------------------------------------------- the projection


def replayed(log: list[Committed], payloads: list[bytes]) -> WorkspaceState | None:
    """What ``quill replay``'s fold rebuilds from the log as a writer leaves it: from the last
    creation (a purge removes what was before it, a creation again the purge); None: no
    workspace left to replay."""
    starts = [i for i, item in enumerate(log) if item.event.version == 1]
    if not starts or log[-1].event.op == "purge":
        return None
    fold = rpl.Fold(TENANT, log[0].event.workspace)
    for item, payload in list(zip(log, payloads, strict=True))[starts[-1] :]:
        event, digest = fold.check(payload, item.hash)
        fold.apply(event, digest, item.manifest)
    return fold.state


@settings(max_examples=100, deadline=None)
@given(script=commands())
def test_replay_rebuilds_the_fold(script: list[tuple[Any, ...]]) -> None:
    """``quill replay``'s fold of the log's payloads, checking every hash, is the writer's."""
    writer = decided(script)
    again = replayed(writer.log, writer.payloads)
    if again is not None:
        assert norm(again, seq=False) == norm(writer.state, seq=False)


W, C = ("write", "a", "x", False, None), COMPACT  # shorthands of the examples below


@settings(max_examples=60, deadline=None)
@given(
    script=st.lists(actions | st.just(COMPACT), min_size=2, max_size=24).map(
        lambda a: [("create", "full"), *a]
    ),
    cuts=st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=8),
)
@example(script=[("create", "full"), ("trust", "restricted", True), C, W], cuts=[1])
@example(
    script=[("create", "full"), W, ("purge",), ("create", "restricted"), ("lock", "s1"),
            ("run_start", "r1"), ("run_end", "r1"), W, C],
    cuts=[2, 3],
)  # fmt: skip
@example(
    script=[("create", "full"), ("apply", [("a", "x")], [("b", "symlink")], None),
            ("ask", "q1", 2), ("archive", "done"), ("decide", "q1", True), ("ask", "q2", 3600),
            ("attach", "o1"), C, ("unarchive",), ("write", "b", "y", True, None),
            ("detach", "o1"), ("delete", "a", None), C],
    cuts=[5],
)  # fmt: skip
def test_the_projection_loads_the_fold(script: list[tuple[Any, ...]], cuts: list[int]) -> None:
    with tempfile.TemporaryDirectory(prefix="quill-evolve-") as tmp:
        asyncio.run(_projection(Path(tmp), script, cuts))


async def _projection(tmp: Path, script: list[tuple[Any, ...]], cuts: list[int]) -> None:
    store = await Store.open(tmp / "writer.db", role="writer")
    writer, applied = Decided("demo"), 0
    trimmed_at: int | None = None  # the log as a reader joining later sees it: from here

    async def catch_up() -> None:  # in batches of the drawn sizes
        nonlocal applied
        n = 0
        while applied < len(writer.log):
            size = cuts[n % len(cuts)]
            await store.apply(writer.log[applied : applied + size])
            applied, n = min(applied + size, len(writer.log)), n + 1

    try:
        for action in script:
            if action != COMPACT:
                writer.run(action)
                continue
            state = writer.state
            await catch_up()
            ws = store.workspace_id(TENANT, "demo")
            if not state.exists or ws is None:
                continue
            manifest, dropped, events_dropped = await store.compaction(ws, 2)
            body = compaction.encode_manifest(manifest)
            event = HistoryCompacted(
                tenant=TENANT, workspace="demo", version=state.version + 1,
                at=T0 + timedelta(seconds=writer.clock), op="compact",
                request_id=f"compact-{state.version + 1}", prev_hash=state.last_hash,
                tree_hash=hashing.tree_hex(state.tree.hash),
                manifest=hashing.content_sha256(body), manifest_size=len(body),
                floor=manifest.floor, max_versions=2, revisions_kept=len(manifest.revisions),
                revisions_dropped=dropped, events_dropped=events_dropped,
            )  # fmt: skip
            writer.commit(event, manifest)
            trimmed_at = len(writer.log) - 1
        await catch_up()
        loaded = (await store.load(TENANT, "demo")).state
        assert norm(loaded) == norm(writer.state)
        assert norm(folded(writer.log)) == norm(writer.state)
        if trimmed_at is not None and writer.state.exists and _same_life(writer, trimmed_at):
            # the log before the compaction purged: its manifest, then the events after it
            assert norm(folded(writer.log[trimmed_at:])) == norm(writer.state)
        again = replayed(writer.log, writer.payloads)
        if again is not None:
            assert norm(again, seq=False) == norm(writer.state, seq=False)
    finally:
        await store.close()
    # what SQLite holds, read back by a projection opened on it (its workspace row included)
    store = await Store.open(tmp / "writer.db", role="writer")
    try:
        assert head(store.workspace(TENANT, "demo")) == head(writer.state)
        assert norm((await store.load(TENANT, "demo")).state) == norm(writer.state)
    finally:
        await store.close()


def head(s: WorkspaceRow | WorkspaceState | None) -> tuple[object, ...] | None:
    """What a projection's workspace row holds (None: no workspace)."""
    if s is None or (isinstance(s, WorkspaceState) and not s.exists):
        return None
    name = s.name if isinstance(s, WorkspaceRow) else s.workspace
    return (
        s.tenant, name, s.trust, s.limits, s.created, s.version, s.last_seq, s.last_hash,
        s.tree_hash, s.updated, s.floor,
    )  # fmt: skip


def _same_life(writer: Decided, at: int) -> bool:
    """No purge or creation after the compaction at ``at`` (the log would start later)."""
    return all(item.event.version != 1 for item in writer.log[at:])


_examples = iter(range(1_000_000))


@REAL_WRITER
@given(script=st.lists(real_actions, min_size=4, max_size=16))
@example(
    script=[("write", "d/x", "a", False, None), ("lock", "s1"), ("trust", "restricted", True),
            ("write", "a", "b", False, "s1"), ("deny", 0), ("run_start", "r1"),
            ("apply", [("b", "x")], [("c", "symlink")], "s1"), ("archive", "done")],
)  # fmt: skip
@example(
    script=[("write", "a", "x", False, None), ("attach", "o1"), ("purge",),
            ("create", "full"), ("mkdir", "d", None), ("move", "d", "e", None), ("unlock", "s2")],
)  # fmt: skip
def test_a_real_writer_holds_the_fold(
    nats_server: NatsServer, tmp_path: Path, script: list[tuple[Any, ...]]
) -> None:
    name = f"p{next(_examples)}"
    asyncio.run(_real(nats_server.url, tmp_path / name, name, [("create", "full"), *script]))


async def _real(url: str, data: Path, name: str, script: list[tuple[Any, ...]]) -> None:
    async with AsyncExitStack() as stack:
        writer: Writer = await start_writer(stack, url, data)
        quill = await Quill.connect(url, actor="tester", timeout=10)
        stack.push_async_callback(quill.close)
        asked: list[str] = []
        for n, action in enumerate(script):
            if action[0] == "deny":
                if not asked:
                    continue
                cmd: rq.Request | None = rq.Decide(
                    approval_id=asked[action[1] % len(asked)], approve=False
                )
            else:
                cmd = request(action, name, quill.workspace(f"{TENANT}/{name}").last_version)
            assert cmd is not None
            client = quill.as_actor("tester", session=session_of(action))
            try:
                await client.send(TENANT, name, cmd, request_id=f"{name}-{n}", wait_ms=0)
            except QuillError as exc:
                if exc.code == ErrorCode.APPROVAL_REQUIRED:
                    asked.append(str(exc.details["approval_id"]))
                elif exc.code in (ErrorCode.UNAVAILABLE, ErrorCode.INTERNAL, ErrorCode.TIMEOUT):
                    raise
        log = await log_of(quill.nc, TENANT, name)
        actor = writer.actors.get(TENANT, name)
        await actor.wait_idle()
        assert actor.state is not None
        from_log = WorkspaceState(TENANT, name)
        for item in log:
            evolve(from_log, item.event, item.hash, item.seq)
        assert norm(from_log) == norm(actor.state)
        await writer.appender.applied()
        assert norm((await writer.store.load(TENANT, name)).state) == norm(from_log)
        if from_log.exists:
            fold = await rpl.replay(quill.nc.jetstream(), Subjects(), TENANT, name)
            assert norm(fold.state, seq=False) == norm(from_log, seq=False)
