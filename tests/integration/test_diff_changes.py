"""A diff of two versions of one workspace reads what changed between them (issue 33), and
answers what the whole walk answers: random writes, edits, deletes of files and whole
directories, moves of files and directories, mkdirs and multi-file changes on a source, a
fork of it, a fork of the fork and another fork of the source (deletes of inherited paths
leave whiteouts), through a real writer and reader on a real nats-server (the SDK).

For random pairs of versions of each workspace (either order, across its fork points) and
scopes (everything, a directory, a file, a path that never existed), the diff the SDK gets
equals the one the reader computes from every file of the scope at both versions
(``Differ.diff(..., whole=True)``, the walk it made before). So does each workspace's diff
against each other one (``from_workspace``: a fork and its source, the fork's fork and its
grandparent, two forks of the source, each way) for random versions of each side: what each
changed since their histories meet. Summaries are cut after two changes here
(``SUMMARY_CHANGES``), so the paths of a multi-file change come from the log.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from contracts import replies as rp
from contracts import requests as rq
from core import plan
from quill.client import Workspace
from quill_cli.natsserver import NatsServer
from services.reader.app import Reader
from services.reader.diff import Differ
from tests.helpers import eventually
from tests.integration.forking import TENANT, play, served
from tests.integration.real_writer import REAL_WRITER

PATHS = ["a", "b", "d/x", "d/y", "d/e/z", "d/e/q", "e/z", "e/f/g"]
WHERE = st.sampled_from(["src", "src", "one", "two", "three"])
OPS = st.one_of(
    st.tuples(st.just("write"), WHERE, st.sampled_from(PATHS), st.sampled_from("xyz")),
    st.tuples(st.just("delete"), WHERE, st.sampled_from([*PATHS, "d", "e", "d/e"])),
    st.tuples(st.just("mkdir"), WHERE, st.sampled_from(["d", "e/f", "k"])),
    st.tuples(st.just("move"), WHERE, st.sampled_from(["d", "e", "d/e", *PATHS]), st.sampled_from(
        [*PATHS, "k/m", "n"]
    )),
    st.tuples(st.just("apply"), WHERE, st.sampled_from(["d/e", "k", "e/f"])),
)  # fmt: skip
SCOPES = [None, "d", "d/e", "e", "k", "a", "d/x", "e/f/g", "never/there"]
PAIRS = 8
"""Version pairs compared in each workspace (each with a few scopes)."""
_names = iter(range(1_000_000))


def shown(diff: rp.Diff) -> tuple[Any, ...]:
    return (
        [(f.path, f.change, f.binary, f.diff) for f in diff.files],
        diff.diff,
        diff.truncated,
        diff.path,
        (diff.from_version, diff.to_version),
    )


async def compare(
    ws: Workspace, reader: Reader, differ: Differ, rnd: random.Random, newest: int
) -> int:
    """The SDK's diffs of ``ws`` against the whole walk's, for random version pairs and
    scopes; how many were compared."""
    row = reader.store.workspace(ws.tenant, ws.name)
    assert row is not None
    pairs = {(1, newest), (newest, 1)} | {
        (rnd.randint(1, newest), rnd.randint(1, newest)) for _ in range(PAIRS)
    }
    done = 0
    for a, b in sorted(pairs):
        for scope in rnd.sample(SCOPES, 3) + [None]:
            got = await ws.diff(a, b, scope)
            req = rq.DiffQuery(from_version=a, to_version=b, path=scope)
            want = await differ.diff(row, newest, req, whole=True)
            assert shown(got) == shown(want), (ws.name, a, b, scope)
            done += 1
    return done


async def between(
    ws: dict[str, Workspace],
    newest: dict[str, int],
    reader: Reader,
    differ: Differ,
    rnd: random.Random,
) -> int:
    """The SDK's diffs of each workspace against each other (``from_workspace``) against the
    whole walk's, for random versions of each side (below, at and after the fork points) and
    scopes; how many were compared."""
    done = 0
    for old, new in ((o, n) for o in newest for n in newest if o != n):
        row = reader.store.workspace(ws[new].tenant, ws[new].name)
        assert row is not None
        pairs = {(newest[old], newest[new]), (1, newest[new])} | {
            (rnd.randint(1, newest[old]), rnd.randint(1, newest[new])) for _ in range(PAIRS // 2)
        }
        for a, b in sorted(pairs):
            for scope in rnd.sample(SCOPES, 2) + [None]:
                got = await ws[new].diff(a, b, scope, from_workspace=ws[old].name)
                req = rq.DiffQuery(
                    from_version=a, to_version=b, path=scope, from_workspace=ws[old].name
                )
                want = await differ.diff(row, newest[new], req, whole=True)
                assert shown(got) == shown(want), (old, a, new, b, scope)
                done += 1
    return done


async def run(url: str, data: Path, script: list[tuple[Any, ...]], seed: int) -> None:
    async with served(url, data, f"c{next(_names)}") as (names, reader, quill):
        rnd = random.Random(seed)
        ws, made = await play(quill, names, script, lambda t, n: f"{t}{n:03}\n")
        differ = Differ(reader.queries, reader.offload)
        compared = 0
        newest_of: dict[str, int] = {}
        for k in made:
            newest = newest_of[k] = (await ws[k].info()).version

            async def caught_up(k: str = k, newest: int = newest) -> bool:
                return reader.store.version_of(TENANT, names[k]) >= newest

            await eventually(caught_up, what=f"{k} read")
            compared += await compare(ws[k], reader, differ, rnd, newest)
        compared += await between(ws, newest_of, reader, differ, rnd)
        assert compared > 0


@REAL_WRITER
@given(script=st.lists(OPS, min_size=6, max_size=24), seed=st.integers(0, 2**32))
@example(
    script=[("write", "src", "d/x", "x"), ("write", "src", "d/e/z", "z"),
            ("apply", "src", "k"), ("write", "one", "d/y", "y"), ("delete", "one", "d"),
            ("write", "src", "d/y", "w"), ("move", "src", "e", "n"),
            ("write", "one", "d/e/q", "x"), ("move", "two", "a", "b"),
            ("write", "two", "e/f/g", "y"), ("move", "two", "d/e", "k/m"),
            ("delete", "two", "e"), ("write", "src", "e/z", "y"), ("mkdir", "two", "d"),
            ("delete", "src", "d/x"), ("apply", "two", "d/e"), ("write", "two", "d/x", "z")],
    seed=7,
)  # fmt: skip
@example(  # two forks move a directory each to one name at one version: not one directory
    script=[("write", "src", "d/x", "x"), ("write", "src", "e/z", "z"),
            ("move", "one", "d", "n"), ("move", "three", "e", "n"), ("apply", "one", "k"),
            ("mkdir", "three", "k"), ("write", "two", "n/x", "y"), ("delete", "three", "d"),
            ("write", "src", "d/y", "w"), ("move", "two", "k", "e/f")],
    seed=11,
)  # fmt: skip
def test_a_diff_of_what_changed_is_the_whole_walks(
    nats_server: NatsServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    script: list[tuple[Any, ...]],
    seed: int,
) -> None:
    monkeypatch.setattr(plan, "SUMMARY_CHANGES", 2)  # a 3-file change is read from the log
    asyncio.run(run(nats_server.url, tmp_path / f"d{next(_names)}", script, seed))
