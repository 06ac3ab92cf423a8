"""Sessions (seed 003): a primary workspace, attached workspaces, and the resolution flowchart
case by case."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from textwrap import indent

import pytest
from nats.aio.client import Client as NATS

from contracts.errors import ErrorCode, QuillError
from infra import bridges
from quill.client import Quill
from quill.session import Session
from services.executor.app import ExecutorConfig
from tests.conftest import StartReader
from tests.executor.git_server import GitServer, git
from tests.helpers import services_see, start_executor


async def test_attach_detach_and_resolution(services: StartReader, quill: Quill, nc: NATS) -> None:
    await services("r1")
    session = await Session.open(quill, "acme", "chat-1")
    assert session.primary.name == "chat-1"
    shared = quill.workspace("acme/shared")
    await shared.create()
    await shared.write("facts.md", "water is wet\n")

    listing = await session.attach("server:/acme/shared")
    assert [(a.uri, a.target, a.kind) for a in listing.attached] == [
        ("server:/acme/shared", "acme/shared", "server")
    ]
    # Named: it goes there (by URI or by name).
    for name in ("server:/acme/shared", "shared", "acme/shared"):
        ws = await session.resolve("qry.read", name)
        assert await ws.read_text("facts.md") == "water is wet\n"
    # Not named, the primary offers it: the primary.
    assert (await session.resolve("qry.read")).name == "chat-1"
    # Not named, the primary does not offer it, an attached one does: the first such.
    await session.primary.set_trust("restricted")  # restricted: no commands
    session.refresh()
    assert (await session.resolve("exec.run")).name == "shared"
    # Nobody offers it: Tool not found.
    await shared.set_trust("restricted")
    session.refresh()
    with pytest.raises(QuillError) as info:
        await session.resolve("exec.run")
    assert info.value.message == "Tool not found: no workspace of session chat-1 offers exec.run"

    # A local folder is attached through the bridge serving it.
    with pytest.raises(QuillError) as info:
        await session.attach("macbook:~/dev/app")
    assert info.value.code == ErrorCode.FILE_NOT_FOUND
    assert "run `quill attach` on macbook" in info.value.message
    kv = await bridges.bucket(nc.jetstream())
    await bridges.claim(kv, "acme", "laptop-app", "b-1", "macbook", "~/dev/app")
    await services_see(nc, 1, ("writer",))  # the writer learns claims by watching: wait for it
    listing = await session.attach("macbook:~/dev/app")
    assert listing.attached[-1].target == "acme/laptop-app"
    assert listing.attached[-1].kind == "local"
    await bridges.release(kv, "acme", "laptop-app")
    # Another tenant's bridge is not found, as if it did not exist.
    await services_see(nc, 0, ("writer",))
    await bridges.claim(kv, "other", "vault", "b-2", "macbook", "~/secret")
    await services_see(nc, 1, ("writer",))
    with pytest.raises(QuillError) as info:
        await session.attach("macbook:~/secret")
    assert info.value.code == ErrorCode.FILE_NOT_FOUND
    assert info.value.message == "No bridge serves macbook:~/secret: run `quill attach` on macbook"
    await bridges.release(kv, "other", "vault")

    # Another tenant's workspace cannot be attached; detaching forgets one.
    with pytest.raises(QuillError) as info:
        await session.attach("server:/other/secret")
    assert info.value.code == ErrorCode.ACCESS_DENIED
    listing = await session.detach("server:/acme/shared")
    assert [a.uri for a in listing.attached] == ["macbook:~/dev/app"]
    assert [a.uri for a in (await session.workspaces()).attached] == ["macbook:~/dev/app"]
    types = [e.type for e in (await session.primary.events()).events]
    assert types.count("workspace_attached") == 2 and types.count("workspace_detached") == 1
    with pytest.raises(QuillError) as info:
        await session.attach("not a uri")
    assert info.value.code == ErrorCode.INVALID_ARGUMENT


def code_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page, flags=re.S)


@pytest.fixture
def repository(tmp_path: Path) -> Iterator[GitServer]:
    """A git server holding ``repo.git`` with one commit (README.md, src/app.py)."""
    server = GitServer(tmp_path / "git").start()
    bare = server.create("repo.git")
    work = tmp_path / "work"
    work.mkdir()
    (work / "README.md").write_text("# Repo\n")
    (work / "src").mkdir()
    (work / "src" / "app.py").write_text("print('hi')\n")
    git(work, "init", "-q", "-b", "main")
    git(work, "add", ".")
    git(work, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "first")
    git(work, "push", "-q", str(bare), "main")
    yield server
    server.stop()


async def test_git_uri_clones_into_a_restricted_workspace_and_the_docs_examples_run(
    services: StartReader, quill: Quill, nats_url: str, tmp_path: Path, repository: GitServer
) -> None:
    """``git:<url>``: an executor clones the repository into a new workspace of the tenant,
    which is restricted (cloned code is untrusted) and attached like any other; then the
    examples of docs/agents.md run as written (their repository is this one)."""
    await services("r1")
    async with AsyncExitStack() as stack:
        # The test's git server listens on 127.0.0.1: allow-listed, as an internal one would be.
        config = ExecutorConfig(sandbox="local", git_allow=("127.0.0.1",))
        await start_executor(stack, nats_url, tmp_path / "x", config)
        session = await Session.open(quill, "acme", "chat-git")
        url = repository.url("repo.git")
        listing = await session.attach(f"git:{url}")
        attached = listing.attached[0]
        assert (attached.uri, attached.kind) == (f"git:{url}", "git")
        cloned = quill.workspace(attached.target)
        assert await cloned.read_text("src/app.py") == "print('hi')\n"
        assert (await cloned.info()).trust == "restricted"
        ws = await session.resolve("qry.read", f"git:{url}")
        assert ws.name == cloned.name
        # Attaching the same repository again reuses its workspace.
        again = await Session.open(quill, "acme", "chat-git-2")
        assert (await again.attach(f"git:{url}")).attached[0].target == attached.target

        page = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text()
        blocks = code_blocks(page)  # the run's and the session's (the page has more after)
        run_example = next(b for b in blocks if b.startswith("async with ws.run()"))
        session_example = next(b for b in blocks if "Session.open(" in b)
        ws = quill.workspace("acme/docs")
        await ws.create()
        await ws.write("PLAN.md", "- start\n")
        exec(compile(f"async def example(ws):\n{indent(run_example, '    ')}", "agents.md", "exec"),
             scope := {})  # fmt: skip
        await scope["example"](ws)
        assert await ws.read_text("PLAN.md") == "- start\n- done\n"
        await quill.workspace("acme/shared-notes").create()
        code = session_example.replace("github.com/org/repo", url)
        body = f"{indent(code, '    ')}\n    return session, ws, repo"
        exec(compile(f"async def example(quill, Session):\n{body}", "agents.md", "exec"), scope)
        opened, primary, repo = await scope["example"](quill, Session)
        assert primary.name == opened.primary.name and primary.name.startswith("s-")
        assert repo.name == cloned.name
        assert [a.target for a in (await opened.workspaces()).attached] == [
            "acme/shared-notes",
            attached.target,
        ]
