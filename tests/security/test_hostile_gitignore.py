"""Issue 30: commands' changes honour ``.gitignore`` files, and a ``.gitignore`` is written by
the command, so by whoever controls it. What it must not do:

* cost the executor without bound: a huge one is not read past ``MAX_FILE_BYTES`` (a sparse
  100 MiB file is never read) and not honoured, and the reply says so; patterns that make a
  backtracking matcher exponential are matched in time linear in the path (RE2); a capture
  spends at most ``BUDGET_S`` of CPU on them, then commits the rest and says so;
* make the executor read outside the checkout: a ``.gitignore`` that is a symlink (to a host
  FIFO, which would hang a reader that followed it) or a FIFO itself is not opened, not
  honoured, and said;
* hide a change of a committed file: a path the log holds is committed whatever a pattern says
  (git's rule), its deletion too.

Through the real path: a real nats-server, writer, reader and executor, with each sandbox
provider (bwrap over an overlay, and local, walked); the budget on the host, with a clock that
runs out."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest_asyncio

from core.gitignore import MAX_FILE_BYTES
from core.globs import Globs
from infra.exec import capture
from infra.exec.gitignores import Cache
from infra.exec.manifest import Manifest
from infra.safefs import Dir
from quill.client import Quill, Workspace
from services.executor.app import Executor, ExecutorConfig
from tests.helpers import start_executor, start_writer_and_reader
from tests.security.conftest import Canaries
from tests.security.conftest import per_provider as nats_server  # noqa: F401 (a fixture: each provider's own nats-server)


@dataclass
class Stack:
    quill: Quill
    executor: Executor

    def reads(self, name: str) -> int:
        """``.gitignore`` files the executor read for ``tenant/workspace``'s checkout."""
        tenant, workspace = name.split("/")
        return self.executor.checkouts.live[tenant, workspace].gitignores.reads


@pytest_asyncio.fixture
async def stack(nats_url: str, tmp_path: Path, provider: str) -> AsyncIterator[Stack]:
    async with AsyncExitStack() as es:
        await start_writer_and_reader(es, nats_url, tmp_path)
        config = ExecutorConfig(sandbox=provider)
        executor = await start_executor(es, nats_url, tmp_path / "executor", config)
        quill = await Quill.connect(nats_url)
        es.push_async_callback(quill.close)
        yield Stack(quill, executor)


async def new_workspace(stack: Stack, name: str) -> Workspace:
    ws = stack.quill.workspace(name)
    await ws.create()
    await ws.write("README.md", "# r\n")
    return ws


async def test_a_huge_gitignore_is_neither_read_nor_honoured(stack: Stack) -> None:
    ws = await new_workspace(stack, "acme/huge-gitignore")
    r = await ws.exec(
        "printf '*.skip\\n' > .gitignore && echo s > a.skip && mkdir sub"
        " && printf '*\\n' > sub/.gitignore && truncate -s 100M sub/.gitignore"
        " && echo kept > sub/file.txt"
    )
    assert r.exit_code == 0, r.stderr
    assert r.changes.ignored == ["a.skip"]  # the root's is honoured
    assert r.changes.warnings == [
        f"sub/.gitignore: over {MAX_FILE_BYTES // 1024} KiB (104857600 bytes): not honoured"
    ]
    committed = {p.path for p in r.changes.paths}
    assert "sub/file.txt" in committed
    assert stack.reads("acme/huge-gitignore") == 1  # the root's; never the 100 MiB one
    again = await ws.exec("echo more > sub/more.txt")  # said once per change of it
    assert again.changes.warnings == [] and again.changes.paths[0].path == "sub/more.txt"


async def test_patterns_a_backtracking_matcher_takes_exponential_time_on(stack: Stack) -> None:
    """``**/a*/**/a*/...`` against a path of 60 ``a/``: pathspec's ``re`` translation takes
    ~1 s at 40 levels and doubles with each few more; here it is one automaton pass."""
    ws = await new_workspace(stack, "acme/nested-globstars")
    lines = "".join(f"**/a*/**/a*/**/a*/**/a*/**/b{i}\n" for i in range(200))
    deep = "/".join(["a"] * 60)
    r = await ws.exec(
        f"printf '{lines}' > .gitignore && mkdir -p {deep} && echo x > {deep}/b7"
        f" && echo y > {deep}/c7"
    )
    assert r.exit_code == 0, r.stderr
    assert r.changes.ignored == [f"{deep}/b7"]
    assert f"{deep}/c7" in {p.path for p in r.changes.paths}
    assert r.changes.warnings == []


async def test_a_gitignore_that_is_a_link_or_a_fifo_is_not_opened(
    stack: Stack, canaries: Canaries, tmp_path: Path
) -> None:
    """A link to a host FIFO: a reader following it would block for good (the test's timeout);
    a link to a host file; a FIFO in the tree itself."""
    fifo = tmp_path / "outside" / "fifo"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    ws = await new_workspace(stack, "acme/linked-gitignore")
    r = await ws.exec(
        "printf '*.skip\\n' > .gitignore && echo s > a.skip"
        f" && mkdir one two three && ln -s {fifo} one/.gitignore"
        f" && ln -s {canaries.files['host-file']} two/.gitignore && mkfifo three/.gitignore"
        " && for d in one two three; do echo kept > $d/file.txt; done"
    )
    assert r.exit_code == 0, r.stderr
    assert r.changes.ignored == ["a.skip"]
    assert {"one/file.txt", "two/file.txt", "three/file.txt"} <= {p.path for p in r.changes.paths}
    assert sorted(r.changes.warnings) == [
        "one/.gitignore: a symlink: not honoured",
        "two/.gitignore: a symlink: not honoured",
    ]
    skipped = sorted((s.path, s.reason) for s in r.changes.skipped)
    assert skipped == [
        ("one/.gitignore", "symlink"),
        ("three/.gitignore", "not a regular file"),
        ("two/.gitignore", "symlink"),
    ]


async def test_a_gitignore_cannot_hide_a_change_to_a_committed_file(stack: Stack) -> None:
    ws = await new_workspace(stack, "acme/hide-tracked")
    await ws.write("secret.txt", "v1\n")
    await ws.write("conf/app.ini", "a=1\n")
    await ws.write("conf/old.ini", "o=1\n")
    r = await ws.exec(
        "printf '*\\n!.gitignore\\n' > .gitignore && printf '*\\n' > conf/.gitignore"
        " && echo v2 > secret.txt && echo a=2 > conf/app.ini && rm conf/old.ini"
        " && echo new > new.txt"
    )
    assert r.exit_code == 0, r.stderr
    changed = sorted((p.path, p.change) for p in r.changes.paths)
    assert changed == [
        (".gitignore", "created"),
        ("conf/app.ini", "modified"),
        ("conf/old.ini", "deleted"),
        ("secret.txt", "modified"),
    ]
    assert sorted(r.changes.ignored) == ["conf/.gitignore", "new.txt"]
    assert await ws.read_text("secret.txt") == "v2\n"
    assert await ws.read_text("conf/app.ini") == "a=2\n"


def test_a_capture_stops_honouring_gitignore_files_past_its_budget(tmp_path: Path) -> None:
    """A clock that runs a second a call: the budget is spent after ``BUDGET_S`` paths; the
    rest are committed (never hidden), and it is said."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / ".gitignore").write_text("*.skip\n")
    for n in range(30):
        (tree / f"f{n:02}.skip").write_text("x")
    ticks = iter(range(10_000))
    with Dir.open(tree) as root:
        git = Cache().lookup(root, budget_s=10.0, clock=lambda: float(next(ticks)))
        out = capture.whole(root, Manifest(present_known=True), Globs.names([]), git)
    assert len(out.seen_ignored) == 9  # .gitignore itself was the first path asked about
    assert sum(1 for p in out.sigs if p.endswith(".skip")) == 21
    assert out.warnings == [
        ".gitignore files: over 10 s of matching in one command's changes: the rest of its "
        "paths were not checked against them"
    ]
