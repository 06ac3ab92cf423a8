"""Playing a generated script of changes on a source, a fork of it and a fork of the fork
(the fork property tests: ``test_fork_property.py`` folds their logs, ``test_fork_pages.py``
pages their trees)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from contracts.errors import ErrorCode, QuillError
from contracts.requests import PutChange
from quill.client import Quill, Workspace
from services.reader.app import Reader
from tests.helpers import start_reader, start_writer

TENANT = "acme"

Op = tuple[Any, ...]
"""``(kind, where, ...)``: ``("write", where, path, text)``, ``("delete", where, path)``,
``("mkdir", where, path)``, ``("move", where, path, to)``, ``("apply", where, directory)``
(three files written below it in one change); ``where`` is ``src``, ``one`` (a
fork of src), ``two`` (a fork of one) or ``three`` (another fork of src)."""


async def play(
    quill: Quill,
    names: dict[str, str],
    script: list[Op],
    text: Callable[[str, int], str],
    after: Callable[[str, Workspace], Awaitable[None]] | None = None,
) -> tuple[dict[str, Workspace], set[str]]:
    """Create ``src``, then play ``script``: a fork is made when first named (``one`` and
    ``three`` of src, ``two`` of one; an op on a fork whose base is not made yet is
    skipped); a refusal a client may get is fine, never ``UNAVAILABLE`` or ``INTERNAL``.
    ``text(letter, n)``: what the ``n``th op writes; ``after(where, ws)``: called after each
    op played. The handles and the workspaces made."""
    ws = {k: quill.workspace(f"{TENANT}/{v}") for k, v in names.items()}
    await ws["src"].create()
    made = {"src"}
    for n, op in enumerate(script):
        where = op[1]
        if where not in made:
            base = "one" if where == "two" else "src"
            if base not in made:
                continue
            await quill.fork(f"{TENANT}/{names[base]}", names[where])
            made.add(where)
        w = ws[where]
        try:
            match op:
                case ("write", _, path, letter):
                    await w.write(path, text(letter, n))
                case ("delete", _, path):
                    await w.delete(path, recursive=True)
                case ("mkdir", _, path):
                    await w.mkdir(path)
                case ("move", _, path, to):
                    await w.move(path, to)
                case ("apply", _, directory):
                    names_below = ("p1", "p2", "p3")
                    await w.apply(
                        [
                            PutChange(path=f"{directory}/{p}", content=text(p, n))
                            for p in names_below
                        ]
                    )
        except QuillError as exc:
            assert exc.code not in (ErrorCode.UNAVAILABLE, ErrorCode.INTERNAL), exc
        if after is not None:
            await after(where, w)
    return ws, made


@asynccontextmanager
async def served(
    url: str, data: Path, tag: str
) -> AsyncIterator[tuple[dict[str, str], Reader, Quill]]:
    """A writer and a reader (data in ``data``) and an SDK client, for one script: the names
    of its workspaces (``tag``-src, -one, -two, -three), the reader, the client."""
    names = {n: f"{tag}-{n}" for n in ("src", "one", "two", "three")}
    async with AsyncExitStack() as stack:
        await start_writer(stack, url, data / "writer")
        reader = await start_reader(stack, url, data / "reader")
        quill = await Quill.connect(url, actor="tester", timeout=10)
        stack.push_async_callback(quill.close)
        yield names, reader, quill
