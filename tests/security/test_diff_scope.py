"""A diff a client sends cannot reach outside its scope or its versions (issue 33: a diff of
one workspace reads the paths changed between its two versions, kept to its scope).

A scope that climbs out (``..``), an absolute one or one that never existed, versions past
the newest, before the first or in either order, and a version below the floor of a
compacted workspace each get the clear answer they got when the diff read the whole scope
at both versions: ``ACCESS_DENIED`` or ``INVALID_ARGUMENT``, an empty diff, ``INVALID_ARGUMENT``,
``VERSION_TRIMMED``; never a traceback or another scope's files. A ``to_version`` below the
floor (a diff newest first) was answered before, from a tree compaction had trimmed: it is
refused like a ``from_version`` below it. So is a version of another workspace
(``from_workspace``) below that workspace's floor, which was answered from its trimmed tree;
one of another workspace below this one's floor (not that one's) is answered.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from quill.client import Quill
from tests.helpers import start_reader, start_writer
from tests.integration.test_compaction import WRITES, compacted


async def refused(call: object) -> QuillError:
    with pytest.raises(QuillError) as info:
        await call  # type: ignore[misc]
    return info.value


async def test_a_diff_stays_in_its_scope_and_versions(nats_url: str, tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "w")
        await start_reader(stack, nats_url, tmp_path / "r")
        quill = await Quill.connect(nats_url, actor="tester", timeout=10)
        stack.push_async_callback(quill.close)
        other = quill.workspace("acme/other")
        await other.create()
        await other.write("secret.txt", "other's\n")
        ws = quill.workspace("acme/scoped")
        await ws.create()
        await ws.write("d/a.txt", "a\n")  # 2
        await ws.write("top.txt", "top\n")  # 3
        await ws.delete("d", recursive=True)  # 4
        newest = ws.last_version

        for scope in ("..", "../other", "d/../../other", "/etc/passwd", "/"):
            error = await refused(ws.diff(1, newest, scope))
            assert error.code == ErrorCode.ACCESS_DENIED, (scope, error)
        error = await refused(ws.diff(1, newest, "d/\0x"))
        assert error.code == ErrorCode.INVALID_ARGUMENT, error
        for scope in ("never/there", "nope.txt", "top.txt/below"):
            empty = await ws.diff(1, newest, scope)
            assert (empty.files, empty.diff) == ([], ""), scope
        whole = await ws.diff(1, newest)
        assert [f.path for f in whole.files] == ["top.txt"]
        for scope in (".", "d/..", "/workspace"):
            assert (await ws.diff(1, newest, scope)).files == whole.files, scope
        assert [(f.path, f.change) for f in (await ws.diff(3, 2)).files] == [("top.txt", "deleted")]
        assert [(f.path, f.change) for f in (await ws.diff(newest, 2, "d")).files] == [
            ("d/a.txt", "added")
        ]
        for a, b in ((newest + 1, None), (1, newest + 1), (2**40, 1), (1, 2**40)):
            error = await refused(ws.diff(a, b))
            assert error.code == ErrorCode.INVALID_ARGUMENT, (a, b)
            assert "version" in error.message.lower(), error.message
        for a, b in ((0, 1), (-1, 1), (1, -5)):
            error = await refused(ws.diff(a, b))
            assert error.code == ErrorCode.INVALID_ARGUMENT, (a, b)

        kept = quill.workspace("acme/kept")
        await kept.create(limits=LimitsPatch(max_versions=2))
        await kept.write("cold.md", "cold\n")  # 2
        event = await compacted(kept, WRITES)
        assert event.floor > 3
        for a, b in ((3, None), (3, event.floor), (event.version, 3)):
            error = await refused(kept.diff(a, b))
            assert error.code == ErrorCode.VERSION_TRIMMED, (a, b, error)
            assert error.details["floor"] == event.floor
        after = await kept.diff(event.floor, event.version)
        assert after.files == [] or all(f.path == "hot.md" for f in after.files)

        # against another workspace (``from_workspace``): its version is held to its own
        # floor, not this one's (before: a version of the compacted workspace below its floor
        # was answered from the tree compaction had trimmed, and one of an uncompacted
        # workspace below the compacted one's floor was refused)
        for a in (2, 3):
            error = await refused(other.diff(a, from_workspace="kept"))
            assert error.code == ErrorCode.VERSION_TRIMMED, (a, error)
            assert error.details["floor"] == event.floor
        cold = await other.diff(event.floor, from_workspace="kept")
        assert ("cold.md", "deleted") in {(f.path, f.change) for f in cold.files}
        assert ("secret.txt", "added") in {(f.path, f.change) for f in cold.files}
        back = await kept.diff(2, from_workspace="other")
        assert ("secret.txt", "deleted") in {(f.path, f.change) for f in back.files}
