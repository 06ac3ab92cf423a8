"""``quill pull`` and ``quill push``: a workspace's tree into a folder of this machine (as of
a version), and a folder into a workspace as one commit (``cmd.apply``).

``pull`` writes only inside DIR: every path the workspace names is checked (no ``..``, no
empty or absolute part, no NUL), and DIR is walked one name at a time through directory
descriptors opened with ``O_NOFOLLOW``, so that a symbolic link in DIR (where a directory of
the workspace goes) is refused, never followed; a file is written to a new name and renamed
over its path (which replaces a link there, never writes through it). Contents are the bytes
the workspace holds, binary included; modes 0644/0755, modification times from the workspace.

``push`` sends what differs (a file of the same size is compared by its sha256) as one change
set against the version it looked at: a change made meanwhile to the same path is a
``CONFLICT`` and nothing is committed. Symbolic links and special files are not pushed (said
on stderr); ``.git`` directories are left out unless ``--git``. With ``--delete``, what the
workspace has and DIR does not is deleted in the same commit. The change set must fit one
request and the workspace's limits (``max_change_paths``, ``max_file_bytes``): a push over
them is refused before anything is sent, naming the limit.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import stat
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import click

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import MAX_MESSAGE_BYTES
from contracts.paths import normalize
from quill.client import Workspace
from quill_cli.common import Commands, connected, emit, plural, run_client, size_text
from quill_cli.common import workspace_command as _workspace_command

T = TypeVar("T")
commands = Commands("files")

PUSH_BUDGET = MAX_MESSAGE_BYTES - 256 * 1024
"""Encoded bytes one push may send (one request; the rest of the message: paths, headers)."""
PARALLEL = 8
"""Reads (or stats) in flight at once."""


async def _bounded(awaitables: list[Awaitable[T]]) -> list[T]:
    gate = asyncio.Semaphore(PARALLEL)

    async def one(a: Awaitable[T]) -> T:
        async with gate:
            return await a

    return await asyncio.gather(*(one(a) for a in awaitables))


def _parts(path: str) -> list[str]:
    """``path``'s names, refused unless each is a plain name inside the tree.

    Raises:
        QuillError: ``ACCESS_DENIED``: a name that would leave DIR (or cannot be one).
    """
    parts = path.split("/")
    if any(p in ("", ".", "..") or "\0" in p or len(p.encode()) > 255 for p in parts):
        raise QuillError(
            ErrorCode.ACCESS_DENIED, f"Refused to write {path!r}: not a path inside DIR"
        )
    return parts


class _Tree:
    """DIR's directories, opened one name at a time without following links."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fds: dict[str, int] = {"": os.open(root, os.O_RDONLY | os.O_DIRECTORY)}

    def directory(self, parts: list[str]) -> int:
        """The descriptor of ``DIR/parts`` (made if missing).

        Raises:
            QuillError: ``ACCESS_DENIED``: a link or a file where a directory goes.
        """
        key = ""
        for name in parts:
            parent, key = self._fds[key], f"{key}/{name}" if key else name
            if key in self._fds:
                continue
            try:
                os.mkdir(name, 0o755, dir_fd=parent)
            except FileExistsError:
                pass
            try:
                self._fds[key] = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent
                )
            except OSError:
                raise QuillError(
                    ErrorCode.ACCESS_DENIED,
                    f"Refused to write under {self.root / key}: it is a symbolic link or a "
                    "file, not a directory (not followed)",
                    {"path": key},
                ) from None
        return self._fds[key]

    def write(self, parts: list[str], data: bytes, executable: bool, mtime: float) -> None:
        folder, name = self.directory(parts[:-1]), parts[-1]
        temp = f".{name[:200]}.quill-{secrets.token_hex(6)}"
        mode = 0o755 if executable else 0o644
        fd = os.open(
            temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=folder
        )
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.chmod(temp, mode, dir_fd=folder)  # whatever the umask
            os.utime(temp, (mtime, mtime), dir_fd=folder)
            os.replace(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError as exc:
            os.unlink(temp, dir_fd=folder)
            raise QuillError(
                ErrorCode.ACCESS_DENIED,
                f"Cannot write {self.root / '/'.join(parts)}: {exc.strerror}",
                {"path": "/".join(parts)},
            ) from None

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)


@commands.command()
@_workspace_command
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--version", "at", type=int, help="As of this workspace version (default: now).")
@click.option("--force", is_flag=True, help="Write into a DIRECTORY that is not empty.")
async def pull(
    ctx: click.Context, ws: Workspace, directory: Path, at: int | None, force: bool
) -> None:
    """Download WORKSPACE's tree (as of --version) into DIRECTORY (absent or empty, unless
    --force), byte for byte; never writes outside it."""
    if directory.is_symlink() or (directory.exists() and any(directory.iterdir()) and not force):
        raise QuillError(
            ErrorCode.ALREADY_EXISTS,
            f"{directory} is not empty (or is a link): pull into a new directory, or --force",
            {"directory": str(directory)},
        )
    version = at or (await ws.info()).version
    entries = [e async for e in ws.list_all("", recursive=True, version=version)]
    files = [e for e in entries if e.kind == "file"]
    checked = [(e, _parts(e.path)) for e in entries]
    directory.mkdir(parents=True, exist_ok=True)
    tree = _Tree(directory)
    try:
        for e, parts in checked:
            if e.kind == "directory":
                tree.directory(parts)

        async def fetch(e: rp.Entry) -> None:
            info, data = await asyncio.gather(
                ws.stat(e.path, version=version), ws.read_bytes(e.path, version=version)
            )
            executable = info.permissions == "755"
            tree.write(_parts(e.path), data, executable, e.modified.timestamp())

        await _bounded([fetch(e) for e in files])
    finally:
        tree.close()
    total = sum(e.size for e in files)
    pulled = {"workspace": f"{ws.tenant}/{ws.name}", "version": version,
              "directory": str(directory), "files": len(files),
              "directories": len(entries) - len(files), "bytes": total}  # fmt: skip
    emit(
        ctx,
        pulled,
        f"pulled {ws.tenant}/{ws.name} version {version} into {directory}: "
        f"{plural(len(files), 'file')}, "
        f"{plural(len(entries) - len(files), 'directory', 'directories')}, {size_text(total)}",
    )


def _local(root: Path, git: bool) -> tuple[dict[str, Path], set[str], list[str]]:
    """DIR's files and directories by workspace path, and what is not pushed (why)."""
    files: dict[str, Path] = {}
    dirs: set[str] = set()
    skipped: list[str] = []
    for top, subdirs, names in os.walk(root, followlinks=False):
        rel = Path(top).relative_to(root).as_posix()
        rel = "" if rel == "." else rel
        for name in list(subdirs):
            path = f"{rel}/{name}" if rel else name
            if os.path.islink(os.path.join(top, name)):
                skipped.append(f"{path} (a symbolic link)")
                subdirs.remove(name)
            elif name == ".git" and not git:
                subdirs.remove(name)
            else:
                dirs.add(path)
        for name in names:
            path = f"{rel}/{name}" if rel else name
            mode = os.lstat(os.path.join(top, name)).st_mode
            if stat.S_ISREG(mode):
                files[path] = Path(top) / name
            else:
                kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                skipped.append(f"{path} ({kind})")
    bad: list[str] = []
    for path in sorted([*files, *dirs]):
        if any(path.startswith(f"{b}/") for b in bad):
            files.pop(path, None)  # under a directory that is not pushed
            dirs.discard(path)
            continue
        try:
            path.encode()
            normalize(path)
        except UnicodeEncodeError:
            why = "its name is not UTF-8"
        except QuillError as exc:
            why = exc.message.split(":")[0]
        else:
            continue
        bad.append(path)
        shown = path.encode(errors="surrogateescape").decode(errors="replace")
        skipped.append(f"{shown!r} ({why}: not a workspace path)")
        files.pop(path, None)
        dirs.discard(path)
    return files, dirs, skipped


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as source:
        return source.read()


def _put(path: str, data: bytes, executable: bool) -> tuple[rq.PutChange, int]:
    """The put of ``data`` (as text when it is UTF-8) and about what it adds to a request."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return rq.PutChange(path=path, data=data, executable=executable), len(data) * 4 // 3 + 64
    return rq.PutChange(path=path, content=text, executable=executable), len(data) * 2 + 64


async def _changes(
    ws: Workspace, root: Path, version: int, limits: Any, git: bool, delete: bool
) -> tuple[list[rq.ApplyItem], list[str]]:
    files, dirs, skipped = _local(root, git)
    theirs = {e.path: e async for e in ws.list_all("", recursive=True, version=version)}
    for path, local in files.items():
        size = local.stat().st_size
        if size > limits.max_file_bytes:
            raise QuillError(
                ErrorCode.SIZE_LIMIT_EXCEEDED,
                f"{local} is {size_text(size)}, over the {size_text(limits.max_file_bytes)} a "
                f"file of {ws.tenant}/{ws.name} may hold (max_file_bytes): nothing pushed",
                {"path": path, "max_file_bytes": limits.max_file_bytes},
            )

    async def differs(path: str) -> bool:
        entry, local = theirs.get(path), files[path]
        if entry is None or entry.kind != "file" or entry.size != local.stat().st_size:
            return True
        info = await ws.stat(path, version=version)
        executable = bool(local.stat().st_mode & 0o100)
        same = info.sha256 == hashlib.sha256(_read(local)).hexdigest()
        return not same or (info.permissions == "755") != executable

    order = sorted(files)
    changed = [
        p for p, d in zip(order, await _bounded([differs(p) for p in order]), strict=True) if d
    ]
    items: list[rq.ApplyItem] = []
    if delete:
        gone = sorted(p for p in theirs if p not in files and p not in dirs)
        for path in gone:  # a directory deleted takes what is under it
            if not any(path.startswith(f"{g}/") for g in gone if theirs[g].kind == "directory"):
                if git or not (path == ".git" or path.startswith(".git/") or "/.git/" in path):
                    items.append(rq.DeleteChange(path=path))
    for path in sorted(dirs):
        entry = theirs.get(path)
        if entry is not None and entry.kind == "file":
            items.append(rq.DeleteChange(path=path))
        if entry is None or entry.kind == "file":
            if not any(f.startswith(f"{path}/") for f in files):
                items.append(rq.MkdirChange(path=path))
    budget = PUSH_BUDGET
    for path in changed:
        entry = theirs.get(path)
        if entry is not None and entry.kind == "directory":
            items.append(rq.DeleteChange(path=path))
        put, size = _put(path, _read(files[path]), bool(files[path].stat().st_mode & 0o100))
        budget -= size
        if budget < 0:
            raise QuillError(
                ErrorCode.SIZE_LIMIT_EXCEEDED,
                f"The changes in {root} are more than one push carries (about "
                f"{size_text(PUSH_BUDGET)} of content, one request): nothing pushed; push "
                "fewer changes at a time",
                {"bytes": PUSH_BUDGET},
            )
        items.append(put)
    if len(items) > limits.max_change_paths:
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"{plural(len(items), 'change')} in {root}: one commit of {ws.tenant}/{ws.name} "
            f"takes at most {limits.max_change_paths:,} (max_change_paths): nothing pushed",
            {"changes": len(items), "max_change_paths": limits.max_change_paths},
        )
    return items, skipped


@commands.command()
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.argument("workspace")
@click.option("--delete", is_flag=True, help="Delete what WORKSPACE has and DIRECTORY has not.")
@click.option("--git", is_flag=True, help="Push .git directories too (left out by default).")
@click.option("-m", "--message", help="Why (recorded in the event).")
@click.pass_context
def push(
    ctx: click.Context,
    directory: Path,
    workspace: str,
    delete: bool,
    git: bool,
    message: str | None,
) -> None:
    """Upload DIRECTORY into WORKSPACE as one commit: what differs (with --delete, what is
    gone too); symbolic links and .git are not pushed."""

    async def go() -> None:
        async with connected(ctx) as quill:
            ws = quill.workspace(workspace)
            info = await ws.info()
            items, skipped = await _changes(ws, directory, info.version, info.limits, git, delete)
            for what in skipped:
                click.echo(f"quill: not pushed: {what}", err=True)
            name = f"{ws.tenant}/{ws.name}"
            if not items:
                same = {"workspace": name, "version": info.version, "committed": False}
                emit(ctx, same, f"unchanged: {name} version {info.version} matches {directory}")
                return
            r = await ws.apply(
                items, base_version=info.version, message=message or f"quill push {directory}"
            )
            emit(
                ctx,
                r,
                f"pushed {directory} to {name}: {plural(len(r.applied), 'path')} changed, "
                f"workspace version {ws.last_version}",
            )

    run_client(go())
