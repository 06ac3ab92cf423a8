"""A local workspace answers as a server workspace holding the same files: the same results
(times and versions aside) and the same errors, codes and messages alike."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from contracts import requests as rq
from contracts.errors import QuillError
from quill.client import Quill, Workspace
from tests.bridge.conftest import Attach

FILES: dict[str, str | bytes] = {
    "README.md": "# Demo\nhello world\nhello again\n",
    "src/app.py": "import sys\n\n\ndef main():\n    print('hello')\n",
    "src/util/strings.py": "def shout(s):\n    return s.upper() + '!'\n",
    "src/util/empty.py": "",
    "docs/guide.md": "Hello\nworld\n" * 5,
    "docs/notes.txt": "no newline at the end",
    "data/blob.bin": bytes(range(256)) * 4,
    "node_modules/pkg/index.js": "hello from node_modules\n",
    ".env": "SECRET=hello\n",
    "big.txt": "".join(f"line {i} hello\n" for i in range(3000)),
}
DIRECTORIES = ["empty", "src/util/deeper"]
UNSTABLE = {"modified", "created", "file_version", "etag", "changed_version", "files_searched"}
"""Fields that differ by nature: times, versions, and what a reader's index let it skip."""

Call = Callable[[Workspace], Awaitable[Any]]


def stable(value: Any) -> Any:
    """``value`` as builtins without the unstable fields; glob's entries (newest first, by
    time) ordered by path."""
    if isinstance(value, msgspec.Struct):
        value = msgspec.to_builtins(value)
    if isinstance(value, dict):
        out = {k: stable(v) for k, v in value.items() if k not in UNSTABLE}
        if "pattern" in out and isinstance(out.get("entries"), list):
            out["entries"].sort(key=lambda e: e["path"])
        return out
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


async def outcome(ws: Workspace, call: Call) -> Any:
    try:
        return ("ok", stable(await call(ws)))
    except QuillError as exc:
        return ("error", str(exc.code), exc.message)


async def server_and_local(
    client: Quill, attach: Attach, tmp_path: Path, name: str
) -> tuple[Workspace, Workspace, Path]:
    """A server workspace ``acme/<name>`` and a folder holding the same files, attached (full
    trust) as ``acme/laptop``: ``(the server's, the folder's, the folder)``."""
    directory = tmp_path / "folder"
    directory.mkdir()
    server = client.workspace(f"acme/{name}")
    await server.create()
    for path, content in FILES.items():
        await server.write(path, content)
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    for path in DIRECTORIES:
        await server.mkdir(path)
        (directory / path).mkdir(parents=True)
    await attach(directory, "laptop", "--trust", "full")
    return server, client.workspace("acme/laptop"), directory


async def read_bytes(ws: Workspace, body: rq.ReadBytes) -> Any:
    return (await ws.client.request("qry", ws.tenant, ws.name, "read_bytes", body, dict))[1]


QUERIES: list[Call] = [
    lambda ws: ws.read("README.md"),
    lambda ws: ws.read("/workspace/README.md", line_numbers=True),
    lambda ws: ws.read("docs/guide.md", offset=3, limit=4, line_numbers=True),
    lambda ws: ws.read("docs/guide.md", head=2),
    lambda ws: ws.read("docs/guide.md", tail=3),
    lambda ws: ws.read("docs/notes.txt"),
    lambda ws: ws.read("src/util/empty.py"),
    lambda ws: ws.read("big.txt"),
    lambda ws: ws.read("data/blob.bin"),
    lambda ws: ws.read("src"),
    lambda ws: ws.read("."),
    lambda ws: ws.read("nope.txt"),
    lambda ws: ws.read("README.md", head=1, tail=1),
    lambda ws: ws.read_bytes("data/blob.bin"),
    lambda ws: read_bytes(ws, rq.ReadBytes(path="data/blob.bin", offset=10, length=20)),
    lambda ws: read_bytes(ws, rq.ReadBytes(path="src")),
    lambda ws: ws.list("."),
    lambda ws: ws.list("src", recursive=True),
    lambda ws: ws.list(".", recursive=True, kind="file", prefix="s"),
    lambda ws: ws.list(".", kind="directory"),
    lambda ws: ws.list(".", limit=3),
    lambda ws: ws.list(".", limit=3, after="f:.env"),
    lambda ws: ws.list(".", recursive=True, limit=4, after="d:src/util"),
    lambda ws: ws.list("nope"),
    lambda ws: ws.list("README.md"),
    lambda ws: ws.stat("README.md"),
    lambda ws: ws.stat("data/blob.bin"),
    lambda ws: ws.stat("src"),
    lambda ws: ws.stat("."),
    lambda ws: ws.stat("missing/thing"),
    lambda ws: ws.glob("**/*.py"),
    lambda ws: ws.glob("*.md"),
    lambda ws: ws.glob("**", exclude=[]),
    lambda ws: ws.glob("**", kind="directory"),
    lambda ws: ws.glob("util/*", path="src"),
    lambda ws: ws.glob("../x"),
    lambda ws: ws.glob("*", path="README.md"),
    lambda ws: ws.grep("hello", context_lines=1),
    lambda ws: ws.grep("hello", include=["*.py", "*.md"]),
    lambda ws: ws.grep("HELLO", ignore_case=True, exclude=[]),
    lambda ws: ws.grep("s.upper()", literal=True),
    lambda ws: ws.grep("^line 29[0-9]9", max_results=3),
    lambda ws: ws.grep("print", path="src"),
    lambda ws: ws.grep("(unclosed"),
    lambda ws: ws.grep("x", path="gone"),
    lambda ws: ws.grep("hello", path="README.md"),
    lambda ws: ws.grep("hello", path="data/blob.bin"),
    lambda ws: ws.explore(),
    lambda ws: ws.explore(recursive=True, metadata=True),
    lambda ws: ws.explore("src", recursive=True, max_depth=1),
    lambda ws: ws.explore(recursive=True, exclude=[], max_results=5),
    lambda ws: ws.read("../outside.txt"),
    lambda ws: ws.stat("/etc/passwd"),
]


async def test_queries_answer_as_a_server_workspace_does(
    servers: None, attach: Attach, client: Quill, tmp_path: Path
) -> None:
    """Each query's answer, or its error, is the server's to the letter."""
    server, local, _ = await server_and_local(client, attach, tmp_path, "server-q")
    for i, call in enumerate(QUERIES):
        expected = await outcome(server, call)
        assert await outcome(local, call) == expected, f"query {i}: {expected}"


MUTATIONS: list[Call] = [
    lambda ws: ws.write("new/deep/file.txt", "one\n"),
    lambda ws: ws.write("new/deep/file.txt", "two\n", mode="create"),
    lambda ws: ws.write("new/deep/file.txt", "two\n", mode="append"),
    lambda ws: ws.write("src", "x"),
    lambda ws: ws.write("README.md/x", "x"),
    lambda ws: ws.write("nope/x.txt", "x", create_parents=False),
    lambda ws: ws.write("README.md", "x", if_match="v9"),
    lambda ws: ws.write("../escape.txt", "x"),
    lambda ws: ws.write("/etc/passwd", "x"),
    lambda ws: ws.write("raw.bin", b"\x00\x01\x02"),
    lambda ws: ws.edit("README.md", "hello world", "howdy world"),
    lambda ws: ws.edit("README.md", "not there", "x"),
    lambda ws: ws.edit("x.txt", "a", "b"),
    lambda ws: ws.edit("docs/guide.md", "Hello", "Hi"),
    lambda ws: ws.edit("docs/guide.md", "Hello", "Hi", replace_all=True),
    lambda ws: ws.edit("data/blob.bin", "a", "b"),
    lambda ws: ws.edit("src", "a", "b"),
    lambda ws: ws.edit("README.md", "same", "same"),
    lambda ws: ws.modify(
        "src/app.py",
        [
            rq.InsertLines(after_line=0, new_content="import os\n"),
            rq.RegexReplace(pattern=r"print\((.*)\)", replacement="log($1)", flags="g"),
        ],
    ),
    lambda ws: ws.modify("src/app.py", [rq.DeleteLines(start_line=40, end_line=41)]),
    lambda ws: ws.modify("src/app.py", [rq.RegexReplace(pattern="absent", replacement="x")]),
    lambda ws: ws.mkdir("a/b/c"),
    lambda ws: ws.mkdir("a/b"),
    lambda ws: ws.mkdir("README.md/x"),
    lambda ws: ws.move("docs/notes.txt", "archive/notes.txt"),
    lambda ws: ws.move("missing.txt", "x.txt"),
    lambda ws: ws.move("src", "src/inner"),
    lambda ws: ws.move("docs/guide.md", "README.md"),
    lambda ws: ws.move("docs/guide.md", "README.md", overwrite=True),
    lambda ws: ws.move("a", "moved/a"),
    lambda ws: ws.delete("moved"),
    lambda ws: ws.delete("moved", recursive=True),
    lambda ws: ws.delete("gone.txt"),
    lambda ws: ws.delete("gone.txt", missing_ok=True),
    lambda ws: ws.delete("."),
    lambda ws: ws.delete("raw.bin"),
    lambda ws: ws.apply(
        [
            rq.PutChange(path="batch/one.txt", content="1\n"),
            rq.MkdirChange(path="batch/empty"),
            rq.DeleteChange(path="big.txt"),
        ]
    ),
    lambda ws: ws.apply([rq.PutChange(path="x.txt", content="1"), rq.DeleteChange(path="x.txt")]),
    lambda ws: ws.create(exist_ok=True),
    lambda ws: ws.create(),
    lambda ws: ws.list(".", recursive=True),
    lambda ws: ws.read("README.md"),
    lambda ws: ws.read("src/app.py"),
    lambda ws: ws.read("new/deep/file.txt"),
]


async def test_mutations_succeed_and_fail_as_on_a_server_workspace(
    servers: None, attach: Attach, client: Quill, tmp_path: Path
) -> None:
    """Each mutation, applied in turn to both, succeeds or fails alike (the workspace names
    aside); the folder holds what they made, nothing outside it, no temporary file."""
    server, local, directory = await server_and_local(client, attach, tmp_path, "server-m")
    for i, call in enumerate(MUTATIONS):
        expected = json.dumps(await outcome(server, call))
        got = json.dumps(await outcome(local, call))  # the names differ, nothing else:
        got = got.replace("acme/laptop", "acme/server-m").replace('"laptop"', '"server-m"')
        assert got == expected, f"mutation {i}"
    assert (directory / "archive/notes.txt").read_text() == "no newline at the end"
    assert (directory / "README.md").read_text() == "Hi\nworld\n" * 5
    assert not (directory / "moved").exists() and not (tmp_path / "escape.txt").exists()
    leftovers = [p.name for p in directory.rglob("*") if p.name.endswith(".quill")]
    assert leftovers == []  # no temporary file left behind
