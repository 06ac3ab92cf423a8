"""The local actions (status, diff, commit, checkout, branch, log) and their parsers.

Each runs git in the workspace's own repository, in its sandbox without network, and turns
what git printed into a ``GitResult`` whose paths are workspace paths.
"""

from __future__ import annotations

import re
from datetime import datetime

from contracts.errors import ErrorCode, QuillError
from contracts.replies import GitCommit, GitFileStatus, GitResult, GitStatus
from infra.exec.git.running import Git

_BAD_REF = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//|/\.|\.lock$|\.lock/|^\.|/$|\.$")
_STATUS = {
    "M": "modified",
    "A": "added",
    "D": "deleted",
    "R": "renamed",
    "C": "copied",
    "T": "type_changed",
    "U": "unmerged",
}


async def status(g: Git) -> GitResult:
    out = await g.git(
        "status", "--porcelain=v2", "--branch", "-z", "--untracked-files=normal", "--renames"
    )
    data = out.stdout
    if out.stdout_bytes > len(data):  # past PARSE_CAP: keep whole records
        data = data[: data.rfind(b"\0") + 1]
    status = _parse_status(g, data)
    text, truncated = g.text(out.stdout.replace(b"\0", b"\n"))
    return GitResult(
        action="status",
        output=text,
        output_truncated=truncated or out.stdout_bytes > len(out.stdout),
        branch=status.branch,
        status=status,
    )


def _parse_status(g: Git, data: bytes) -> GitStatus:
    branch: str | None = None
    upstream: str | None = None
    ahead = behind = 0
    staged: list[GitFileStatus] = []
    unstaged: list[GitFileStatus] = []
    untracked: list[str] = []
    records = iter(_nul_fields(data))
    for rec in records:
        kind = rec[:2]
        if rec.startswith(b"# branch.head "):
            head = rec[14:].decode(errors="replace")
            branch = None if head == "(detached)" else head
        elif rec.startswith(b"# branch.upstream "):
            upstream = rec[18:].decode(errors="replace")
        elif rec.startswith(b"# branch.ab "):
            a, b = rec[12:].split(b" ")
            ahead, behind = int(a), -int(b)
        elif kind in (b"1 ", b"2 ", b"u "):
            nfields = {b"1 ": 9, b"2 ": 10, b"u ": 11}[kind]
            parts = rec.split(b" ", nfields - 1)
            path = g.ws_path(parts[-1])
            original = g.ws_path(next(records, b"")) if kind == b"2 " else None
            xy = parts[1].decode()
            if kind == b"u ":
                unstaged.append(GitFileStatus(path=path, status="unmerged"))
                continue
            for code, out in ((xy[0], staged), (xy[1], unstaged)):
                if code in _STATUS:
                    renamed = code in "RC"
                    out.append(
                        GitFileStatus(
                            path=path,
                            status=_STATUS[code],
                            original_path=original if renamed else None,
                        )
                    )
        elif kind == b"? ":
            untracked.append(g.ws_path(rec[2:]))
    return GitStatus(
        branch=branch,
        upstream=upstream,
        ahead=ahead,
        behind=behind,
        staged=staged,
        unstaged=unstaged,
        untracked=untracked,
    )


async def diff(g: Git, path: str | None) -> GitResult:
    flags = ("diff", "--no-color", "--no-ext-diff", "--no-textconv", "--submodule=short")
    spec = ("--", g.spec(path)) if path is not None else ()
    staged = await g.git(*flags, "--cached", *spec, cap=g.cap)
    unstaged = await g.git(*flags, *spec, cap=g.cap)
    # Share the cap: the smaller diff gets up to half, the other the rest.
    small = min(staged.stdout_bytes, unstaged.stdout_bytes, g.cap // 2)
    big = g.cap - small
    staged_cap, unstaged_cap = (
        (small, big) if staged.stdout_bytes <= unstaged.stdout_bytes else (big, small)
    )
    staged_text, t1 = g.text(staged.stdout, cap=staged_cap)
    unstaged_text, t2 = g.text(unstaged.stdout, cap=unstaged_cap)
    t1 = t1 or staged.stdout_bytes > staged_cap
    t2 = t2 or unstaged.stdout_bytes > unstaged_cap
    branch = await g.branch()
    return GitResult(
        action="diff",
        output=staged_text + unstaged_text,
        output_truncated=t1 or t2,
        branch=branch,
        staged_diff=staged_text,
        unstaged_diff=unstaged_text,
    )


async def commit(g: Git, message: str | None, files: list[str] | None) -> GitResult:
    if message is None or not message.strip():
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "commit needs a message")
    if files is None:
        await g.git("add", "-A", "--", ":(top)")
    elif files:
        specs = b"".join(g.spec(f).encode() + b"\0" for f in files)
        await g.git("add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul", stdin=specs)
    nothing = await g.git("diff", "--cached", "--quiet", "--no-ext-diff", ok=(0, 1))
    if nothing.exit_code == 0:
        raise QuillError(ErrorCode.EXECUTION_FAILED, "nothing to commit", {"exit_code": 1})
    out = await g.git(
        "commit", "--no-verify", "--cleanup=whitespace", "-F", "-", stdin=message.encode()
    )
    head = await g.git("rev-parse", "HEAD", "--symbolic-full-name", "HEAD")
    sha, ref = (head.stdout.decode(errors="replace").split("\n") + ["", ""])[:2]
    branch = ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else None
    text, truncated = g.printed(out)
    return GitResult(
        action="commit", output=text, output_truncated=truncated, branch=branch, commit=sha
    )


async def checkout(g: Git, branch: str | None) -> GitResult:
    if branch is None:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "checkout needs a branch")
    check_branch(branch)
    exists = await g.git("show-ref", "--verify", "-q", f"refs/heads/{branch}", ok=(0, 1))
    if exists.exit_code == 0:
        out = await g.git("switch", "--no-guess", branch, cap=g.cap)
    else:
        out = await g.git("switch", "-c", branch, cap=g.cap)
    text, truncated = g.printed(out)
    return GitResult(action="checkout", output=text, output_truncated=truncated, branch=branch)


async def branches(g: Git) -> GitResult:
    out = await g.git("for-each-ref", "--format=%(HEAD)%(refname)", "refs/heads/")
    names: list[str] = []
    current: str | None = None
    for line in out.stdout.decode(errors="replace").splitlines():
        name = line[1:].removeprefix("refs/heads/")
        names.append(name)
        if line.startswith("*"):
            current = name
    if current is None:
        current = await g.branch()
    lines = "".join(f"{'*' if n == current else ' '} {n}\n" for n in names)
    text, truncated = g.text(lines.encode())
    return GitResult(
        action="branch", output=text, output_truncated=truncated, branch=current, branches=names
    )


async def log(g: Git, limit: int, path: str | None) -> GitResult:
    spec = ("--", g.spec(path)) if path is not None else ()
    fmt = "--format=%H%x00%an%x00%ae%x00%aI%x00%s"
    out = await g.git(
        "log", "-z", "--no-color", "--no-decorate", "--no-show-signature", fmt, f"-n{limit}",
        *spec, ok=(0, 128),
    )  # fmt: skip
    if out.exit_code == 128:
        if b"does not have any commits yet" not in out.stderr:
            raise g.failed(out)
    fields = _nul_fields(out.stdout)
    complete = len(fields) - len(fields) % 5
    commits = [
        GitCommit(
            sha=fields[i].decode(),
            author=fields[i + 1].decode(errors="replace"),
            email=fields[i + 2].decode(errors="replace"),
            at=datetime.fromisoformat(fields[i + 3].decode()),
            subject=fields[i + 4].decode(errors="replace"),
        )
        for i in range(0, complete, 5)
    ]
    lines = "".join(
        f"{c.sha} {c.at.isoformat()} {c.author} <{c.email}> {c.subject}\n" for c in commits
    )
    text, truncated = g.text(lines.encode())
    branch = await g.branch()
    return GitResult(
        action="log",
        output=text,
        output_truncated=truncated or out.stdout_bytes > len(out.stdout),
        branch=branch,
        log=commits,
    )


def check_branch(name: str) -> str:
    """``name``, if it is a valid branch name that git cannot take for an option.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` otherwise.
    """
    if name.startswith("-") or name == "@" or _BAD_REF.search(name):
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Invalid branch name: {name!r}")
    return name


def _nul_fields(data: bytes) -> list[bytes]:
    fields = data.split(b"\0")
    return fields[:-1] if fields and fields[-1] == b"" else fields
