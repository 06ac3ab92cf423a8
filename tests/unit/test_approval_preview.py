"""The diff an approver is shown (``services.writer.preview``): each kind of change, what it
does not show, the size cut, and secrets redacted on both sides."""

from __future__ import annotations

from datetime import UTC, datetime

from contracts import hashing
from contracts.events import AnyChange, MakeDir, PutFile, Remove
from contracts.limits import PREVIEW_MAX_BYTES
from core.diffs import Pair, unified
from core.secrets import Secrets
from core.tree import Tree, apply_change
from services.writer.preview import preview

AT = datetime(2026, 1, 1, tzinfo=UTC)
SECRET = "sk-live-preview-0123456789"


def put(path: str, text: str, **more: object) -> PutFile:
    data = text.encode()
    return PutFile(
        path=path,
        sha256=hashing.content_sha256(data),
        size=len(data),
        file_version=1,
        created=AT,
        text=text,
        **more,  # type: ignore[arg-type]
    )


def tree_of(files: dict[str, str]) -> tuple[Tree, dict[str, bytes]]:
    tree, contents = Tree(), {}
    for path, text in files.items():
        parts = path.split("/")
        for depth in range(1, len(parts)):
            apply_change(tree, MakeDir(path="/".join(parts[:depth])), 1, AT)
        change = put(path, text)
        apply_change(tree, change, 1, AT)
        contents[change.sha256] = text.encode()
    return tree, contents


async def shown(
    changes: list[AnyChange], files: dict[str, str], secrets: Secrets | None = None
) -> str:
    tree, contents = tree_of(files)

    async def fetch(sha: str) -> bytes | None:
        return contents.get(sha)

    async def diff(pairs: list[Pair]) -> list[str]:  # the writer's: in a worker process
        return [unified(*pair) for pair in pairs]

    return await preview(changes, tree, fetch, secrets or Secrets(), diff)


async def test_a_new_file_a_deleted_one_and_a_new_directory() -> None:
    text = await shown(
        [put("new.txt", "hello\n"), Remove(path="old.txt"), MakeDir(path="docs")],
        {"old.txt": "bye\n"},
    )
    assert text == (
        "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+hello\n"
        "--- a/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"
        "new directory docs/\n"
    )


async def test_a_directory_deleted_shows_each_file_it_holds() -> None:
    text = await shown([Remove(path="src")], {"src/a.py": "a\n", "src/sub/b.py": "b\n"})
    assert text.splitlines()[0] == "deleted directory src/"
    assert "-a\n" in text and "-b\n" in text and "--- a/src/sub/b.py" in text


async def test_a_move_is_a_rename_not_a_delete_and_an_add() -> None:
    moved = put("b.txt", "same\n", moved_from="a.txt")
    text = await shown([moved, Remove(path="a.txt")], {"a.txt": "same\n"})
    assert text == "renamed a.txt -> b.txt\n"


async def test_a_secret_in_the_old_content_is_redacted_too() -> None:
    """A file written before its secret was registered: the preview still hides it."""
    text = await shown(
        [put("env", "KEY=rotated\n")],
        {"env": f"KEY={SECRET}\n"},
        Secrets({"api_key": SECRET}),
    )
    assert SECRET not in text and "-KEY=[REDACTED:api_key]" in text and "+KEY=rotated" in text


async def test_large_previews_are_cut_with_a_note() -> None:
    big = "".join(f"line {i}\n" for i in range(20_000))  # ~200 KB: shown, and over the cut
    text = await shown([put("a.txt", "x\n"), put("big.txt", big), put("z.txt", "z\n")], {})
    assert len(text.encode()) <= PREVIEW_MAX_BYTES + 100
    assert text.startswith("--- /dev/null\n+++ b/a.txt")
    assert text.endswith("... the rest is not shown (the preview is cut at 32 KiB)\n")


async def test_binary_and_oversized_files_are_named_not_shown() -> None:
    huge = "x" * (300 * 1024)
    binary = PutFile(
        path="img.png",
        sha256="0" * 64,
        size=4,
        file_version=1,
        created=AT,
        binary=True,
        data=b"\x89PNG",
    )
    text = await shown([binary, put("huge.txt", huge)], {})
    assert text == (
        "new file img.png (4 bytes, binary)\nnew file huge.txt (307200 bytes, not shown)\n"
    )
