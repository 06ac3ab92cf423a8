"""The network actions (push, pull, clone): the credential never meets the workspace.

The boundary is that the credential never enters a sandbox that runs workspace-controlled
code or reads workspace-controlled config. Network actions use scratch repositories in a
temporary directory of the executor's, outside the workspace, whose config the executor
writes itself:

* push: (a) in the workspace's sandbox, no network: resolve the branch and read
  ``remote.<name>.pushurl``/``url`` verbatim (the workspace's ``insteadOf`` rules are not
  applied). (b) A sandbox whose checkout is ``stage.git`` (a fresh bare repository) with
  the workspace bound read-only fetches the branch from it: the workspace side of a local
  fetch is ``git upload-pack``, which git promises is safe to run in an untrusted
  repository (it runs no hooks and ignores repository config that runs commands; see
  ``gitsecurityboundary``: ``git clone --no-local`` is the sanitized clone). This run has
  no network and no credential anyway. The tests check it where nothing else would stop
  it (the local provider): ``uploadpack.packObjectsHook``, ``core.alternateRefsCommand``,
  ``remote.*.uploadpack``, hooks and fsmonitor set by the workspace do not run.
  (c) ``push.git``, another fresh bare repository,
  borrows ``stage.git``'s objects through ``objects/info/alternates`` (data only: git
  never reads ``stage.git``'s config or hooks) and pushes the commit to the validated URL
  in a sandbox with network. Nothing that run reads could have been written by a process
  that saw the workspace, except object data.
* pull and clone: the network fetch runs in a fresh scratch repository with the credential;
  then the workspace's sandbox (no network, no credential) fetches from that repository,
  bound read-only, and fast-forwards (pull) or clones from it (clone, then sets
  ``origin`` to the real URL).

The URL is validated first: ``https`` (or ``http`` when a credential names that protocol,
for a trusted network), a plain host name, no ``user:password@``. Push requires a
configured credential for the host; pull and clone go anonymous without one. Each network run
then resolves the host and connects to an address ``targets`` admits (public, or
allow-listed), pinned; a failure before a git server answered is ``targets.unreachable()``.
The credential helper (``_HELPER``) is scoped with ``credential.<protocol>://<host>.helper``
and itself answers only for that exact protocol and host, so a redirect or a rewritten URL
gets nothing (``http.followRedirects=false`` as well). The token reaches the sandbox on the
standard input of the run (never in argv, env of the ``Spawn``, a file or a config), is put
in the environment of that git process only, and is redacted (also as base64 of
``user:token`` and URL-quoted) from everything git prints.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from contracts.errors import ErrorCode, QuillError
from contracts.replies import GitResult
from contracts.requests import GitCommand
from infra.exec.git import targets
from infra.exec.git.credentials import Credential, Credentials, has_control_chars
from infra.exec.git.local import check_branch
from infra.exec.git.running import Git, git_argv
from infra.exec.git.workspace import display, resolve_dir
from infra.exec.sandbox import Outcome
from infra.safefs import Dir, remove_tree

_HELPER = (
    '!f() { test "$1" = get || exit 0; p=; h=; '
    'while IFS= read -r l && test -n "$l"; do case "$l" in '
    'protocol=*) p="${l#protocol=}";; host=*) h="${l#host=}";; esac; done; '
    'test "$p" = "$QUILL_GIT_PROTOCOL" && test "$h" = "$QUILL_GIT_HOST" || exit 0; '
    'printf "username=%s\\npassword=%s\\n" "$QUILL_GIT_USERNAME" "$QUILL_GIT_TOKEN"; }; f'
)
"""Answers ``get`` for exactly one protocol and host, from its environment."""
_WITH_TOKEN = 'IFS= read -r QUILL_GIT_TOKEN && export QUILL_GIT_TOKEN && exec git "$@"'
"""Reads the token from stdin into git's environment (so it is in no argv and no Spawn)."""

_HOST = re.compile(r"^(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
_IPV6 = re.compile(r"^[0-9a-f:.]+$")
_REMOTE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


@dataclass(frozen=True, slots=True)
class _Remote:
    url: str
    """Rebuilt from its parts: what git fetches from or pushes to."""
    protocol: str
    host: str
    """``name[:port]``, as git names it for credentials."""
    credential: Credential | None
    hostname: str
    """The name, IPv4 literal or ``[IPv6]`` literal, without the port."""
    port: int
    """The port git connects to (the protocol's default when the URL names none)."""


def _remote(raw: str, credentials: Credentials) -> _Remote:
    """Validate a remote URL and find its credential.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for anything but a plain http(s) URL.
    """
    try:
        parts = urlsplit(raw.strip())
        port = parts.port
    except ValueError:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Invalid remote URL") from None
    protocol = parts.scheme.lower()
    if protocol not in ("https", "http"):
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Only https:// remotes are supported, not {protocol or raw[:50]!r}",
        )
    if "@" in parts.netloc:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "A remote URL must not carry credentials")
    hostname = parts.hostname or ""
    if _HOST.match(hostname) and (
        targets.literal(hostname) is not None or not targets.numeric(hostname)
    ):
        name = hostname
    elif ":" in hostname and _IPV6.match(hostname) and targets.literal(hostname) is not None:
        name = f"[{hostname}]"
    else:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Invalid host in remote URL: {hostname!r}")
    if port == 0:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Invalid port in remote URL")
    host = name if port is None else f"{name}:{port}"
    rest = parts.path + (f"?{parts.query}" if parts.query else "")
    if parts.fragment or has_control_chars(rest) or " " in rest:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Invalid path in remote URL")
    return _Remote(
        f"{protocol}://{host}{rest}",
        protocol,
        host,
        credentials.find(protocol, host),
        name,
        port or (443 if protocol == "https" else 80),
    )


async def _remote_url(g: Git, name: str, *, push: bool) -> str:
    """``remote.<name>.pushurl`` (for a push) or ``.url``, verbatim (no ``insteadOf``)."""
    if not _REMOTE.match(name):
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Invalid remote name: {name!r}")
    keys = ("pushurl", "url") if push else ("url",)
    for key in keys:
        out = await g.git("config", "--get-all", f"remote.{name}.{key}", ok=(0, 1))
        urls = out.stdout.decode(errors="replace").splitlines()
        if len(urls) > 1:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Remote {name} has several {key}s")
        if urls:
            return urls[0]
    raise QuillError(ErrorCode.INVALID_ARGUMENT, f"No such remote: {name}", {"remote": name})


async def _network(
    g: Git,
    directory: Path,
    workdir: str,
    args: Sequence[str],
    remote: _Remote,
    credentials: Credentials,
) -> Outcome:
    """Run git with network in a scratch ``directory``, with the remote's credential, connected
    to the one address ``targets`` admits for it.

    Raises:
        QuillError: ``targets.unreachable()`` for a remote refused, unreachable, or failing
            before a git server answered (see ``targets``); else as ``Git.spawn``.
    """
    remaining = g.deadline - time.monotonic()
    if remaining <= 0:
        raise g.timed_out()
    target = await credentials.targets.resolve(remote.hostname, remote.port, remaining)
    config = [f"protocol.{remote.protocol}.allow=always", *target.config()]
    env: dict[str, str] = {}
    stdin: bytes | None = None
    argv = git_argv(args, config)
    cred = remote.credential
    if cred is not None:
        token = cred.token()
        basic = base64.b64encode(f"{cred.username}:{token}".encode())
        forms = {token.encode(), basic, quote(token, safe="").encode()} - set(g.secrets)
        g.secrets = sorted([*g.secrets, *forms], key=len, reverse=True)  # longest first
        config.append(f"credential.{remote.protocol}://{remote.host}.helper={_HELPER}")
        env = {
            "QUILL_GIT_PROTOCOL": remote.protocol,
            "QUILL_GIT_HOST": remote.host,
            "QUILL_GIT_USERNAME": cred.username,
        }
        argv = ["sh", "-c", _WITH_TOKEN, "sh", *git_argv(args, config)[1:]]
        stdin = token.encode() + b"\n"
    cap = g.cap + max((len(s) for s in g.secrets), default=0)
    out = await g.spawn(
        directory, argv, workdir=workdir, cap=cap, network=True, env=env, stdin=stdin, ok=_ANY
    )
    if out.exit_code != 0:
        if not targets.spoke_git(g.redact(out.stderr)):
            raise targets.unreachable()
        raise g.failed(out)
    return out


_ANY = range(-256, 256)
"""Every exit status: ``_network`` tells the failures itself."""


_LOCAL = ("protocol.file.allow=always",)
_UPLOAD_PACK = "--upload-pack=git -c 'safe.directory=*' upload-pack"
"""The serving side of a local fetch gets no ``-c`` from its caller; the scratch repositories
belong to the executor, not to the sandbox's user, so it needs this one."""
BOUND = "/tmp/quill-source"
"""Where a sandbox with a mount namespace shows a directory it reads from. Directly under
/tmp: bwrap makes the parents of a bind target ``0700`` root, which git's ``access(2)`` checks
refuse to the sandbox's user."""


async def _show(g: Git, host: Path, probe: Path) -> tuple[str, tuple[tuple[Path, str], ...]]:
    """The path at which a run sees ``host`` read-only, and the ``ro_binds`` that show it.

    Under bwrap that is ``BOUND``; the local provider has no mount namespace and ignores
    ``ro_binds``, so there it is the host path. Which applies is asked of the sandbox once per
    action (``pwd`` in ``probe``: ``/workspace`` means the checkout is mounted).
    """
    if g.mounts is None:
        out = await g.spawn(probe, ["pwd"], workdir="")
        g.mounts = out.stdout.decode(errors="replace").strip() == "/workspace"
    if g.mounts:
        return BOUND, ((host, BOUND),)
    return str(host), ()


@contextlib.contextmanager
def _scratch(scratch: Path | None, owner: tuple[int, int] | None) -> Iterator[Path]:
    """A temporary directory of the executor's, the sandbox's user's to write (``owner``);
    removed afterwards however deep a sandboxed git made it (``safefs.remove_tree``)."""
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="quill-git-", dir=scratch)).resolve()
    try:
        path.chmod(0o755)
        _own(owner, path)
        yield path
    finally:
        with Dir.open(path.parent) as parent:
            remove_tree(parent, path.name)


def _own(owner: tuple[int, int] | None, *paths: Path) -> None:
    """Give ``paths`` (the executor just made them) to ``owner``."""
    if owner is not None:
        for path in paths:
            os.chown(path, *owner, follow_symlinks=False)


def _bare(path: Path, owner: tuple[int, int] | None, alternates: str | None = None) -> None:
    """A fresh bare repository whose every file the executor wrote, given to ``owner``."""
    for sub in ("objects/info", "refs/heads", "refs/tags"):
        (path / sub).mkdir(parents=True)
    (path / "HEAD").write_text("ref: refs/heads/quill-scratch\n")
    (path / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tbare = true\n")
    made = ["", "objects", "objects/info", "refs", "refs/heads", "refs/tags", "HEAD", "config"]
    if alternates is not None:
        (path / "objects/info/alternates").write_text(alternates + "\n")
        made.append("objects/info/alternates")
    _own(owner, *(path / name for name in made))


async def push(
    g: Git, req: GitCommand, credentials: Credentials, scratch: Path | None
) -> GitResult:
    branch = check_branch(req.branch or await g.branch(required=True) or "")
    sha = await g.rev(f"refs/heads/{branch}")
    if sha is None:
        raise QuillError(ErrorCode.FILE_NOT_FOUND, f"No such branch: {branch}", {"branch": branch})
    remote = _remote(await _remote_url(g, req.remote, push=True), credentials)
    if remote.credential is None:
        raise QuillError(
            ErrorCode.ACCESS_DENIED,
            f"No git credential is configured for {remote.protocol}://{remote.host}",
            {"host": remote.host},
        )
    with _scratch(scratch, g.owner) as tmp:
        stage, push = tmp / "stage.git", tmp / "push.git"
        _bare(stage, g.owner)
        root, binds = await _show(g, g.checkout.resolve(), stage)
        source = f"{root}/{g.repo}".rstrip("/")
        await g.spawn(
            stage,
            git_argv(
                ["fetch", "-q", "--no-tags", _UPLOAD_PACK, source, f"refs/heads/{branch}"],
                _LOCAL,
            ),
            workdir="",
            ro_binds=binds,
        )
        _bare(push, g.owner, alternates="../../stage.git/objects")
        ref = push / "refs/heads" / branch
        made = [p for p in ref.parents if not p.exists() and push in p.parents]
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(sha + "\n")
        _own(g.owner, *made, ref)
        spec = f"refs/heads/{branch}:refs/heads/{branch}"
        out = await _network(g, tmp, "push.git", ["push", remote.url, spec], remote, credentials)
    await g.git("update-ref", f"refs/remotes/{req.remote}/{branch}", sha)
    text, truncated = g.printed(out)
    return GitResult(
        action="push", output=text, output_truncated=truncated, branch=await g.branch()
    )


async def pull(
    g: Git, req: GitCommand, credentials: Credentials, scratch: Path | None
) -> GitResult:
    current = await g.branch(required=True)
    branch = check_branch(req.branch or current or "")
    remote = _remote(await _remote_url(g, req.remote, push=False), credentials)
    tracking = f"refs/remotes/{req.remote}/{branch}"
    with _scratch(scratch, g.owner) as tmp:
        _bare(tmp / "fetch.git", g.owner)
        await _network(
            g,
            tmp,
            "fetch.git",
            ["fetch", "-q", "--no-tags", remote.url, f"+refs/heads/{branch}:refs/heads/{branch}"],
            remote,
            credentials,
        )
        root, binds = await _show(g, tmp, tmp)
        await g.git(
            "fetch", "-q", "--no-tags", _UPLOAD_PACK, f"{root}/fetch.git",
            f"+refs/heads/{branch}:{tracking}",
            config=_LOCAL, ro_binds=binds,
        )  # fmt: skip
    merged = await g.git("merge", "--ff-only", "--no-edit", tracking, cap=g.cap)
    text, truncated = g.printed(merged)
    return GitResult(action="pull", output=text, output_truncated=truncated, branch=current)


async def clone(
    g: Git, req: GitCommand, credentials: Credentials, scratch: Path | None
) -> GitResult:
    if req.url is None:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "clone needs a url")
    remote = _remote(req.url, credentials)
    target = resolve_dir(g.checkout, g.workdir)
    if target is not None and (not target.is_dir() or any(target.iterdir())):
        raise QuillError(
            ErrorCode.ALREADY_EXISTS,
            f"{display(g.workdir)} is not an empty directory",
            {"path": g.workdir},
        )
    name = req.remote
    if not _REMOTE.match(name):
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Invalid remote name: {name!r}")
    with _scratch(scratch, g.owner) as tmp:
        await _network(
            g,
            tmp,
            "",
            ["clone", "-q", "--bare", "--template=", remote.url, "clone.git"],
            remote,
            credentials,
        )
        root, binds = await _show(g, tmp, tmp)
        local = await g.git(
            "clone", "--no-local", "--template=", _UPLOAD_PACK, "--origin", name,
            f"{root}/clone.git",
            g.workdir or ".", config=_LOCAL, ro_binds=binds, workdir="",
        )  # fmt: skip
    await g.git("remote", "set-url", name, remote.url)
    text, truncated = g.printed(local)
    return GitResult(
        action="clone", output=text, output_truncated=truncated, branch=await g.branch()
    )
