"""Forks against the fold (issue 33): random writes, deletes, mkdirs and moves on a source, a
fork of it and a fork of the fork, through a real writer and reader on a real nats-server
(the SDK). At every version, a fork's tree as the reader answers it (``qry.tree`` as of that
version, the whole page) is the fold (``core.evolve``) of its source's events up to the fork
point, then its own (for a fork of a fork: the first source's up to the first fork point,
the first fork's up to the second, then its own); and the source's tree at each of its
versions is the fold of its own log alone: what a fork writes never shows in its source.

The model is the log itself (``tests/integration/test_evolve_property.py`` does the same for
one workspace); the commands are drawn, those the writer refuses change nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from core.evolve import WorkspaceState, evolve
from core.plan import Committed
from quill.client import Quill, Workspace
from quill_cli.natsserver import NatsServer
from tests.helpers import eventually, start_writer_and_reader
from tests.integration.forking import TENANT, play
from tests.integration.real_writer import REAL_WRITER, log_of

PATHS = ["a", "b", "d", "d/x", "d/y", "e/z"]
WHERE = st.sampled_from(["src", "one", "two"])
OPS = st.one_of(
    st.tuples(st.just("write"), WHERE, st.sampled_from(PATHS), st.sampled_from("xyz")),
    st.tuples(st.just("delete"), WHERE, st.sampled_from(PATHS)),
    st.tuples(st.just("mkdir"), WHERE, st.sampled_from(PATHS)),
    st.tuples(st.just("move"), WHERE, st.sampled_from(PATHS), st.sampled_from(PATHS)),
)
Tree = dict[str, tuple[str, str | None, bool]]
"""path → (kind, sha256, executable)."""

_names = iter(range(1_000_000))


def tree_of(state: WorkspaceState) -> Tree:
    out: Tree = {p: ("file", f.sha256, f.executable) for p, f in state.tree.files.items()}
    out.update({p: ("directory", None, False) for p in state.tree.dirs if p})
    return out


async def read_tree(ws: Workspace, version: int) -> Tree:
    page = await ws.tree(limit=1000, contents=False, version=version)
    assert page.next is None
    return {i.path: (i.kind, i.sha256, i.executable) for i in page.entries}


async def fold_and_check(
    quill: Quill, ws: Workspace, log: list[Committed], state: WorkspaceState, upto: int | None
) -> WorkspaceState:
    """Fold ``log`` into ``state`` (events at or before ``upto``), checking the reader's
    tree of ``ws`` and its totals (``info``) after each; the state at the end."""
    for item in log:
        if upto is not None and item.event.version > upto:
            break
        evolve(state, item.event, item.hash, item.seq)
        assert await read_tree(ws, item.event.version) == tree_of(state), (
            ws.name,
            item.event.version,
        )
        info = await ws.info(version=item.event.version)  # its totals: what changed since
        files = state.tree.files.values()
        dirs = len([d for d in state.tree.dirs if d])
        totals = (len(files), dirs, sum(f.size for f in files))
        assert (info.files, info.directories, info.total_bytes) == totals, (ws.name, info)
    return state


def caught_up(ws: Workspace, version: int) -> Callable[[], Awaitable[bool]]:
    async def ask() -> bool:
        return (await ws.info()).version >= version

    return ask


async def run(url: str, data: Path, script: list[tuple[Any, ...]]) -> None:
    tag = f"p{next(_names)}"
    names = {"src": f"{tag}-src", "one": f"{tag}-one", "two": f"{tag}-two"}
    async with AsyncExitStack() as stack:
        await start_writer_and_reader(stack, url, data)
        quill = await Quill.connect(url, actor="tester", timeout=10)
        stack.push_async_callback(quill.close)
        ws, made = await play(quill, names, script, lambda t, n: f"{t}{n}\n")
        logs = {k: await log_of(quill.nc, TENANT, names[k]) for k in made}
        for k in made:
            await eventually(caught_up(ws[k], logs[k][-1].event.version), what=f"{k} read")
        # the source alone: its own log, whatever its forks wrote
        src = await fold_and_check(quill, ws["src"], logs["src"], WorkspaceState(TENANT, "s"), None)
        assert await read_tree(ws["src"], src.version) == tree_of(src)
        if "one" not in made:
            return
        n1 = logs["one"][0].event.version
        state = WorkspaceState(TENANT, "one")
        for item in logs["src"]:  # the source's events up to the fork point
            if item.event.version <= n1:
                evolve(state, item.event, item.hash, item.seq)
        inherited = state  # then the first fork's own, checked at each of its versions
        one = await fold_and_check(quill, ws["one"], logs["one"], inherited, None)
        if "two" not in made:
            return
        n2 = logs["two"][0].event.version
        state = WorkspaceState(TENANT, "two")
        for item in logs["src"]:
            if item.event.version <= n1:
                evolve(state, item.event, item.hash, item.seq)
        for item in logs["one"]:
            if item.event.version <= n2:
                evolve(state, item.event, item.hash, item.seq)
        await fold_and_check(quill, ws["two"], logs["two"], state, None)
        assert one.version >= n2


@REAL_WRITER
@given(script=st.lists(OPS, min_size=4, max_size=18))
@example(
    script=[("write", "src", "d/x", "x"), ("write", "one", "d/y", "y"), ("delete", "one", "d"),
            ("write", "src", "d/z", "z"), ("move", "two", "a", "b"), ("mkdir", "two", "d"),
            ("write", "two", "d/x", "y"), ("delete", "src", "d/x")],
)  # fmt: skip
def test_a_forks_tree_is_the_fold_of_its_layers(
    nats_server: NatsServer, tmp_path: Path, script: list[tuple[Any, ...]]
) -> None:
    asyncio.run(run(nats_server.url, tmp_path / f"d{next(_names)}", script))
