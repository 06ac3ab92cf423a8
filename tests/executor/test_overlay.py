"""A command over an overlay (bwrap, ``infra.exec.layers``) gives the replies and leaves the
workspace a command on the checkout itself does (``--sandbox local``, walked): the same
commands, run by each on a workspace of the same files, one after another, compared reply by
reply and then file by file. Renames of directories, deletions of what was renamed, a file
made a directory and back, chmod alone, links, an ignored directory, a file over
``max_file_bytes``, a name that breaks the path rule, ``.quillignore`` changed, ``.gitignore``
files made, nested and changed, a git repository, a file touched without a change.

A real nats-server, writer, reader and executors (one bwrap over an overlay, one local)."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from contracts import requests as rq
from contracts.limits import LimitsPatch
from contracts.replies import CommandResult
from quill.client import Quill, Workspace
from services.executor.app import ExecutorConfig
from tests.helpers import (
    need_bwrap,
    start_executor,
    start_writer_and_reader,
)

FILES = [
    rq.PutChange(path="src/a.py", content="a = 1\n"),
    rq.PutChange(path="src/b.py", content="b = 2\n"),
    rq.PutChange(path="src/deep/c.py", content="c = 3\n"),
    rq.PutChange(path="docs/x.md", content="# x\n"),
    rq.PutChange(path="run.sh", content="#!/bin/sh\n", executable=True),
    rq.PutChange(path="dir/sub/file.txt", content="f\n"),
    rq.MkdirChange(path="empty"),
]
COMMANDS = [
    "echo new > src/new.py && rm src/b.py && chmod +x docs/x.md",
    "mv src lib && ls lib",
    "python3 -c \"import os; os.rename('lib/deep', 'deeper')\" && ls deeper",
    "mkdir -p node_modules/pkg && echo x > node_modules/pkg/i.js && ln -s /etc/passwd link"
    " && head -c 70K /dev/zero > huge.bin",
    "rm -rf dir && echo now-a-file > dir",
    "rm docs/x.md && mkdir docs/x.md && echo y > docs/x.md/inner && rmdir empty",
    "echo '*.log' > .quillignore && echo l > a.log && echo keep > b.txt",
    "export GIT_AUTHOR_DATE=2020-01-01T00:00:00Z GIT_COMMITTER_DATE=2020-01-01T00:00:00Z"
    " && git init -q repo && cd repo && echo r > r.txt && git add r.txt"
    " && git -c user.email=a@b.invalid -c user.name=a commit -qm r && git log --format=%s",
    "true",
    "touch lib/a.py && cat lib/a.py",
    "mv lib/a.py lib/a2.py && mv run.sh bin.sh && test -x bin.sh",
    "touch $'bad\\nname' && mkdir $'bad\\x01dir' && echo z > $'bad\\x01dir/in.txt'",
    "rm -rf lib deeper && ls",
    "mkdir -p fresh/a/b && echo d > fresh/a/b/d.txt && mv fresh/a fresh/z && rm -f huge.bin",
    "rm .quillignore && echo again > a.log",
    "mkdir -p .hyp/ex && printf '*\\n' > .hyp/.gitignore && echo e > .hyp/ex/1"
    " && printf 'gen/\\n*.tmp\\n!keep.tmp\\n' > .gitignore && mkdir -p gen && echo g > gen/g"
    " && echo t > t.tmp && echo k > keep.tmp",
    "echo again > .hyp/ex/2 && mkdir -p pkg && printf '!*.tmp\\n' > pkg/.gitignore"
    " && echo p > pkg/p.tmp",
    "printf 'gen/\\n' > .gitignore",  # t.tmp is no longer ignored
    "printf '*.tmp\\n' > pkg/.gitignore && echo q > pkg/q.tmp && echo p2 > pkg/p.tmp",
    "rm pkg/.gitignore",  # q.tmp is no longer ignored
    "chmod -x bin.sh && rm -rf repo/.git/logs",
    "rm -rf repo",  # its index holds inodes and times: the trees compared hold no git state
]


def shown(result: CommandResult) -> dict[str, Any]:
    """What a reply says of a command and its changes (the parts both must agree on)."""
    changes = result.changes
    return {
        "exit": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "committed": changes.committed,
        "version": changes.version,
        "total": changes.total,
        "paths": sorted((p.path, p.change, p.kind) for p in changes.paths),
        "skipped": sorted((s.path, s.reason) for s in changes.skipped),
        "ignored": sorted(changes.ignored),
        "ignored_reasons": changes.ignored_reasons,
        "warnings": changes.warnings,
        "conflicts": changes.conflicts,
    }


async def tree(ws: Workspace) -> list[tuple[str, str, bytes | None, str | None]]:
    """Every entry of ``ws``: path, kind, content and permissions."""
    out = []
    async for entry in ws.list_all(recursive=True):
        if entry.kind == "file":
            info = await ws.stat(entry.path)
            out.append((entry.path, "file", await ws.read_bytes(entry.path), info.permissions))
        else:
            out.append((entry.path, "directory", None, None))
    return out


async def replies(nats_url: str, data: Path, sandbox: str, ws: Workspace) -> list[dict[str, Any]]:
    """``COMMANDS`` on ``ws``, one by one, by an executor of ``sandbox`` of its own."""
    async with AsyncExitStack() as es:
        executor = await start_executor(es, nats_url, data, ExecutorConfig(sandbox=sandbox))
        assert executor.provider.overlays == (sandbox == "bwrap"), executor.provider.no_overlays
        return [shown(await ws.exec(command)) for command in COMMANDS]


async def test_a_command_over_an_overlay_changes_what_it_would_change_in_place(
    nats_url: str, tmp_path: Path
) -> None:
    need_bwrap()
    async with AsyncExitStack() as es:
        await start_writer_and_reader(es, nats_url, tmp_path)
        quill = await Quill.connect(nats_url, actor="agent")
        es.push_async_callback(quill.close)
        got = {}
        for sandbox in ("bwrap", "local"):
            ws = quill.workspace(f"acme/same-{sandbox}")
            await ws.create(limits=LimitsPatch(max_file_bytes=64 * 1024))
            await ws.apply(FILES)
            got[sandbox] = await replies(nats_url, tmp_path / sandbox, sandbox, ws), await tree(ws)
        (overlay, overlay_tree), (in_place, in_place_tree) = got["bwrap"], got["local"]
        for command, a, b in zip(COMMANDS, overlay, in_place, strict=True):
            assert a == b, command
        assert overlay_tree == in_place_tree
        assert [r["exit"] for r in overlay] == [0] * len(COMMANDS), overlay
        assert ("src", "deleted", "directory") in overlay[1]["paths"]  # renamed: moved whole
    assert not [entry for entry in overlay_tree if entry[0].startswith(".hyp")]  # .gitignore'd
    assert {"t.tmp", "keep.tmp", "pkg/q.tmp"} <= {entry[0] for entry in overlay_tree}
