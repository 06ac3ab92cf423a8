"""Structured git actions (``GitCommand``) on a workspace's repository, run in the sandbox.

``run_git`` is called by the executor with the workspace's checkout; it returns a ``GitResult``
(``changes`` left for the executor to fill) or raises ``QuillError``:

    FILE_NOT_FOUND     no repository at ``workdir`` (or above it in the workspace); no branch
    INVALID_ARGUMENT   a missing or malformed field (message, branch, remote, url)
    ACCESS_DENIED      ``workdir`` leaves the workspace; a push to a host with no credential
    ALREADY_EXISTS     ``clone`` into a non-empty directory
    TIMEOUT            past ``timeout_ms`` (all the git runs of one action share it)
    EXECUTION_FAILED   git failed (the first lines of its stderr, redacted; ``exit_code``), or
                       the sandbox could not start it; ``commit`` with nothing staged is one:
                       message ``nothing to commit`` (a state of the repository, not a bad
                       request: the same request succeeds once something changed)

Paths in requests (``files``, ``path``) and in results (``GitStatus``) are workspace paths,
like everywhere in Quill (``proj/src/a.py`` for a repository at ``proj``).

Actions: ``status`` (porcelain v2; untracked directories as ``dir/``, as git shows them;
unmerged paths under ``unstaged``), ``diff`` (staged then unstaged; the smaller gets up to half
the cap), ``commit`` (``git add -A`` of ``files`` or of everything; the message kept verbatim
but for surrounding whitespace; no hooks run), ``checkout`` (``switch``, or ``switch -c`` from
HEAD), ``branch``, ``log`` (``output``: one line per commit), ``push`` (``branch``, default the
current one, to the same name on ``remote``; then ``refs/remotes/<remote>/<branch>``),
``pull`` (fetch ``branch`` of ``remote``, default the current one, fast-forward only),
``clone`` (``url`` into ``workdir``, which must be empty or absent; remote ``origin`` or
``remote``). ``output`` is capped at ``output_cap`` bytes of what git printed (cut at a
character boundary, invalid UTF-8 replaced), ``output_truncated`` says so.

Security
--------
The repository is untrusted: agents write ``.git/config``, hooks and ``.gitattributes``, and
git runs commands named there (hooks, ``core.fsmonitor``, ``filter.*``, ``diff.external``,
textconv, ``gpg.program``, ``credential.helper``, ``core.sshCommand``...). Hence:

1. Every git invocation goes through ``run`` (the sandbox), including the ones in the
   executor's scratch repositories; the executor itself only writes plain files (a scratch
   repository's ``HEAD``, ``config``, ``alternates``, a ref). Under the local provider ``run``
   is the host, unsandboxed: that provider isolates nothing.
2. Every invocation gets ``-c`` overrides (``HARDENING``: no hooks, no fsmonitor, no pager,
   editor, askpass, gpg or external diff, credential helpers reset, every transport forbidden
   unless the run needs it, no redirects, no submodule recursion, no auto-gc) and the
   environment ``GIT_ENV`` (no system or global config, no prompts). Read-only actions also
   get ``GIT_OPTIONAL_LOCKS=0``; diff and log pass ``--no-ext-diff --no-textconv``.
   In the workspace's own repository these are hygiene, not the boundary: that sandbox runs
   whatever the agent wants anyway (``RunCommand``), so ``.gitattributes`` filters stay on
   (git-lfs and friends work) and they run there, in the sandbox, like any agent code.
3. The boundary is that the credential never enters a sandbox that runs workspace-controlled
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
   configured credential for the host; pull and clone go anonymous without one.
   The credential helper (``_HELPER``) is scoped with ``credential.<protocol>://<host>.helper``
   and itself answers only for that exact protocol and host, so a redirect or a rewritten URL
   gets nothing (``http.followRedirects=false`` as well). The token reaches the sandbox on the
   standard input of the run (never in argv, env of the ``Spawn``, a file or a config), is put
   in the environment of that git process only, and is redacted (also as base64 of
   ``user:token`` and URL-quoted) from everything git prints.
   The local provider has no isolation: there the token is kept from the workspace's git
   config and hooks (none runs in the credentialed run), not from other processes.

Credentials are configured per host (``Credentials.load`` reads ``[[git.credential]]`` from
TOML; or build ``Credentials((Credential(host=..., token_file=...),))``); the token is read at
each use, so short-lived tokens may be rotated in place.

Identities: the author is the actor (name = actor, email ``<actor>@users.quill.invalid``;
``quill`` when there is none); the committer is ``quill[bot]``.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import os
import re
import tempfile
import time
import tomllib
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from contracts import paths
from contracts.errors import ErrorCode, QuillError
from contracts.replies import GitCommit, GitFileStatus, GitResult, GitStatus
from contracts.requests import GitCommand
from services.executor.sandbox import Limits, Outcome, Provider, SandboxError, Spawn

__all__ = ["Credential", "Credentials", "Runner", "run_git", "sandbox_runner"]

Runner = Callable[[Path, Spawn], Awaitable[Outcome]]
"""Runs a spawn in the sandbox against a directory (the checkout, or a scratch directory)."""

DEFAULT_TIMEOUT_S = 30.0
PARSE_CAP = 16 * 1024 * 1024
"""Most bytes of git's output read for parsing (status, log, branch)."""
BOT_NAME = "quill[bot]"
BOT_EMAIL = "quill[bot]@users.noreply.quill.invalid"
ACTOR_EMAIL_DOMAIN = "users.quill.invalid"

HARDENING: tuple[str, ...] = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.pager=cat",
    "core.editor=:",
    "core.askPass=",
    "core.sshCommand=false",
    "core.quotePath=false",
    "credential.helper=",
    "diff.external=",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "log.showSignature=false",
    "merge.verifySignatures=false",
    "gpg.program=false",
    "protocol.allow=never",
    *(f"protocol.{p}.allow=never" for p in ("file", "ext", "fd", "git", "ssh", "http", "https")),
    "http.followRedirects=false",
    "submodule.recurse=false",
    "fetch.recurseSubmodules=false",
    "push.recurseSubmodules=no",
    "gc.auto=0",
    "maintenance.auto=false",
    "color.ui=false",
    "advice.detachedHead=false",
    "safe.directory=*",
)
"""``-c`` overrides of every git run (the command line wins over repository config)."""

GIT_ENV: Mapping[str, str] = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
    "XDG_CONFIG_HOME": "/nonexistent",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ASKPASS": "",
    "SSH_ASKPASS": "",
    "GIT_EDITOR": ":",
    "GIT_PAGER": "cat",
    "GIT_NO_LAZY_FETCH": "1",
    "LC_ALL": "C.UTF-8",
}

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


# ---------------------------------------------------------------- credentials


@dataclass(frozen=True, slots=True)
class Credential:
    """A token for one remote host, read from a file or an environment variable at each use."""

    host: str
    """As git names it: ``github.com``, or ``host:port`` for a non-default port."""
    username: str = "x-access-token"
    token_file: Path | None = None
    token_env: str | None = None
    protocol: str = "https"
    """``http`` only for a trusted network (the token would cross it in clear)."""

    def __post_init__(self) -> None:
        if (self.token_file is None) == (self.token_env is None):
            raise ValueError(f"credential for {self.host}: give token_file or token_env")
        if self.protocol not in ("https", "http"):
            raise ValueError(f"credential for {self.host}: protocol must be https or http")
        if not self.host or self.host != self.host.lower() or "/" in self.host:
            raise ValueError(f"credential host must be a lower-case host[:port]: {self.host!r}")
        if not self.username or _control(self.username):
            raise ValueError(f"credential for {self.host}: bad username")

    def token(self) -> str:
        """The current token.

        Raises:
            QuillError: ``EXECUTION_FAILED`` when it cannot be read (the token is not named).
        """
        try:
            if self.token_file is not None:
                value = self.token_file.read_text().strip()
            else:
                value = os.environ.get(self.token_env or "", "").strip()
        except OSError as e:
            raise QuillError(
                ErrorCode.EXECUTION_FAILED,
                f"The credential for {self.host} cannot be read ({e.strerror})",
            ) from None
        if not value or _control(value):
            raise QuillError(
                ErrorCode.EXECUTION_FAILED, f"The credential for {self.host} is empty or invalid"
            )
        return value


@dataclass(frozen=True, slots=True)
class Credentials:
    """The executor's git credentials, at most one per (protocol, host)."""

    entries: tuple[Credential, ...] = ()

    @classmethod
    def load(cls, path: Path) -> Credentials:
        """Read ``[[git.credential]]`` tables (host, username, token_file | token_env,
        protocol) from a TOML file.

        Raises:
            ValueError: the file is malformed.
        """
        with path.open("rb") as f:
            return cls.from_mapping(tomllib.load(f))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Credentials:
        """``{"git": {"credential": [{...}, ...]}}``, as in the TOML file.

        Raises:
            ValueError: a table is malformed, or two name the same protocol and host.
        """
        entries: list[Credential] = []
        for item in data.get("git", {}).get("credential", []):
            if not isinstance(item, Mapping) or "host" not in item:
                raise ValueError("git.credential: each entry needs a host")
            unknown = set(item) - {"host", "username", "token_file", "token_env", "protocol"}
            if unknown:
                raise ValueError(f"git.credential: unknown keys {sorted(unknown)}")
            token_file = item.get("token_file")
            cred = Credential(
                host=str(item["host"]).lower(),
                username=str(item.get("username", "x-access-token")),
                token_file=Path(token_file) if token_file is not None else None,
                token_env=item.get("token_env"),
                protocol=str(item.get("protocol", "https")),
            )
            if any((c.protocol, c.host) == (cred.protocol, cred.host) for c in entries):
                raise ValueError(f"git.credential: {cred.protocol}://{cred.host} twice")
            entries.append(cred)
        return cls(tuple(entries))

    def find(self, protocol: str, host: str) -> Credential | None:
        return next((c for c in self.entries if (c.protocol, c.host) == (protocol, host)), None)


def _control(text: str) -> bool:
    return any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text)


def sandbox_runner(provider: Provider, limits: Limits) -> Runner:
    """A ``Runner`` over a sandbox provider."""

    async def run(directory: Path, spawn: Spawn) -> Outcome:
        return await provider.run(directory, spawn, limits)

    return run


# ---------------------------------------------------------------- running git


@dataclass(slots=True)
class _Git:
    """Runs git for one action: the shared deadline, hardening, identity and redaction."""

    checkout: Path
    run: Runner
    workdir: str
    """Where workspace runs start (relative to the checkout)."""
    repo: str
    """The repository's root, a workspace path."""
    cap: int
    timeout_s: float
    deadline: float
    env: dict[str, str]
    secrets: list[bytes] = field(default_factory=list)
    mounts: bool | None = None
    """Whether the sandbox shows ``ro_binds`` (asked once, by ``_show``)."""

    async def spawn(
        self,
        directory: Path,
        argv: list[str],
        *,
        workdir: str,
        cap: int = PARSE_CAP,
        network: bool = False,
        ro_binds: tuple[tuple[Path, str], ...] = (),
        stdin: bytes | None = None,
        ok: Sequence[int] = (0,),
        env: Mapping[str, str] | None = None,
    ) -> Outcome:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self.timed_out()
        spawn = Spawn(
            argv=argv,
            workdir=workdir,
            env={**self.env, **(env or {})},
            timeout_s=remaining,
            output_cap=cap,
            network=network,
            ro_binds=ro_binds,
            stdin=stdin,
        )
        try:
            out = await self.run(directory, spawn)
        except SandboxError as e:
            what = "with network " if network else ""
            raise QuillError(
                ErrorCode.EXECUTION_FAILED,
                f"The sandbox could not run git {what}here: {self.redact(str(e).encode())}",
            ) from None
        if out.timed_out:
            raise self.timed_out()
        if out.exit_code not in ok:
            raise self.failed(out)
        return out

    async def git(
        self, *args: str, config: Sequence[str] = (), workdir: str | None = None, **kw: Any
    ) -> Outcome:
        """Run git in the workspace's repository."""
        wd = self.workdir if workdir is None else workdir
        return await self.spawn(self.checkout, _argv(args, config), workdir=wd, **kw)

    def timed_out(self) -> QuillError:
        return QuillError(
            ErrorCode.TIMEOUT,
            f"git timed out after {self.timeout_s:g} s",
            {"timeout_ms": int(self.timeout_s * 1000)},
        )

    def failed(self, out: Outcome) -> QuillError:
        raw = out.stderr if out.stderr.strip() else out.stdout
        lines = [ln for ln in self.redact(raw).splitlines() if ln.strip()][:5]
        message = "\n".join(lines)[:2000] or f"git exited with status {out.exit_code}"
        return QuillError(ErrorCode.EXECUTION_FAILED, message, {"exit_code": out.exit_code})

    def scrub(self, data: bytes) -> bytes:
        """``data`` with every secret replaced, and a secret's start cut off by the output cap
        at its end too."""
        for secret in self.secrets:
            data = data.replace(secret, b"***")
            for k in range(len(secret) - 1, 3, -1):
                if data.endswith(secret[:k]):
                    data = data[:-k] + b"***"
                    break
        return data

    def redact(self, data: bytes) -> str:
        return self.scrub(data).decode(errors="replace")

    def text(self, *parts: bytes, cap: int | None = None) -> tuple[str, bool]:
        """Output for the reply: redacted, the first ``cap`` bytes, valid UTF-8."""
        cap = self.cap if cap is None else cap
        data = b"".join(self.scrub(part) for part in parts)
        if len(data) <= cap:
            return data.decode(errors="replace"), False
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return decoder.decode(data[:cap], final=False), True

    def printed(self, *outs: Outcome) -> tuple[str, bool]:
        """What the runs printed (stdout, then stderr, of each) for the reply."""
        text, truncated = self.text(*(part for o in outs for part in (o.stdout, o.stderr)))
        cut = any(o.stdout_bytes > len(o.stdout) or o.stderr_bytes > len(o.stderr) for o in outs)
        return text, truncated or cut

    def spec(self, path: str) -> str:
        """A literal pathspec, from the repository's root, for a workspace path."""
        rel = _within(self.repo, paths.normalize(path))
        if rel is None:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"{path} is outside the repository at {_display(self.repo)}",
                {"path": path},
            )
        return f":(top,literal){rel}"

    def ws_path(self, rel: bytes) -> str:
        """A workspace path for a path git printed (relative to the repository's root)."""
        text = rel.decode(errors="replace")
        return f"{self.repo}/{text}" if self.repo else text

    async def branch(self, *, required: bool = False) -> str | None:
        """The current branch (None when HEAD is detached)."""
        out = await self.git("symbolic-ref", "-q", "HEAD", ok=(0, 1))
        ref = out.stdout.decode(errors="replace").strip()
        if ref.startswith("refs/heads/"):
            return ref.removeprefix("refs/heads/")
        if required:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, "HEAD is detached: name a branch")
        return None

    async def rev(self, name: str) -> str | None:
        """The commit ``name`` names, or None."""
        out = await self.git("rev-parse", "--verify", "-q", f"{name}^{{commit}}", ok=(0, 1))
        return out.stdout.decode().strip() if out.exit_code == 0 else None


def _argv(args: Sequence[str], config: Sequence[str] = ()) -> list[str]:
    argv = ["git"]
    for item in (*HARDENING, *config):
        argv += ["-c", item]
    return [*argv, *args]


def _within(root: str, path: str) -> str | None:
    """``path`` relative to ``root`` (both normalised workspace paths), or None outside it."""
    if not root:
        return path
    if path == root:
        return ""
    return path[len(root) + 1 :] if path.startswith(root + "/") else None


def _identity(actor: str | None) -> dict[str, str]:
    name = re.sub(r"[<>\x00-\x1f\x7f]", "", actor or "").strip() or "quill"
    local = re.sub(r"[^A-Za-z0-9._+-]", "-", actor or "quill").strip(".") or "quill"
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": f"{local}@{ACTOR_EMAIL_DOMAIN}",
        "GIT_COMMITTER_NAME": BOT_NAME,
        "GIT_COMMITTER_EMAIL": BOT_EMAIL,
    }


def _check_branch(name: str) -> str:
    if name.startswith("-") or name == "@" or _BAD_REF.search(name):
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Invalid branch name: {name!r}")
    return name


def _resolve_dir(checkout: Path, workdir: str) -> Path | None:
    """The host directory of ``workdir``: None when absent.

    Raises:
        QuillError: ``ACCESS_DENIED`` when a symlink leads it out of the workspace.
    """
    root = checkout.resolve()
    try:
        target = (root / workdir).resolve()
    except (OSError, RuntimeError):  # a symlink loop
        raise QuillError(
            ErrorCode.FILE_NOT_FOUND, f"Cannot resolve {_display(workdir)}", {"path": workdir}
        ) from None
    if not target.is_relative_to(root):
        raise QuillError(ErrorCode.ACCESS_DENIED, paths.ACCESS_DENIED_MESSAGE, {"path": workdir})
    return target if target.exists() else None


def _find_repo(checkout: Path, workdir: str) -> tuple[str, str]:
    """(workdir, repository root) as workspace paths, symlinks resolved.

    Raises:
        QuillError: ``FILE_NOT_FOUND`` without a repository there.
    """
    root = checkout.resolve()
    target = _resolve_dir(checkout, workdir)
    if target is not None and target.is_dir():
        for d in (target, *target.parents):
            if os.path.lexists(d / ".git"):
                return _rel(target, root), _rel(d, root)
            if d == root:
                break
    raise QuillError(
        ErrorCode.FILE_NOT_FOUND, f"Not a git repository: {_display(workdir)}", {"path": workdir}
    )


def _display(path: str) -> str:
    """A workspace path as agents see it."""
    return f"/workspace/{path}" if path else "/workspace"


def _rel(path: Path, root: Path) -> str:
    rel = path.relative_to(root).as_posix()
    return "" if rel == "." else rel


def _bare(path: Path, alternates: str | None = None) -> None:
    """A fresh bare repository whose every file the executor wrote."""
    for sub in ("objects/info", "refs/heads", "refs/tags"):
        (path / sub).mkdir(parents=True)
    (path / "HEAD").write_text("ref: refs/heads/quill-scratch\n")
    (path / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tbare = true\n")
    if alternates is not None:
        (path / "objects/info/alternates").write_text(alternates + "\n")


def _nul_fields(data: bytes) -> list[bytes]:
    fields = data.split(b"\0")
    return fields[:-1] if fields and fields[-1] == b"" else fields


# ---------------------------------------------------------------- actions


async def run_git(
    req: GitCommand,
    *,
    checkout: Path,
    run: Runner,
    actor: str | None,
    credentials: Credentials,
    output_cap: int,
    scratch: Path | None = None,
) -> GitResult:
    """Run one git action against the repository at ``req.workdir`` in ``checkout``.

    ``run`` runs each git process in the sandbox; ``scratch`` is where the network actions
    make their temporary repositories (default: the system's temporary directory), outside
    the checkout. The result's ``changes`` is None (the executor captures them).

    Raises:
        QuillError: see the module docstring.
    """
    timeout_s = req.timeout_ms / 1000 if req.timeout_ms is not None else DEFAULT_TIMEOUT_S
    workdir = paths.normalize(req.workdir)
    env = {**GIT_ENV, **_identity(actor)}
    if req.action in ("status", "diff", "branch", "log"):
        env["GIT_OPTIONAL_LOCKS"] = "0"
    if req.action == "clone":
        workdir_found, repo = workdir, workdir
    else:
        workdir_found, repo = _find_repo(checkout, workdir)
    g = _Git(
        checkout=checkout,
        run=run,
        workdir=workdir_found,
        repo=repo,
        cap=output_cap,
        timeout_s=timeout_s,
        deadline=time.monotonic() + timeout_s,
        env=env,
    )
    match req.action:
        case "status":
            return await _status(g)
        case "diff":
            return await _diff(g, req.path)
        case "commit":
            return await _commit(g, req.message, req.files)
        case "checkout":
            return await _checkout(g, req.branch)
        case "branch":
            return await _branches(g)
        case "log":
            return await _log(g, req.limit, req.path)
        case "push":
            return await _push(g, req, credentials, scratch)
        case "pull":
            return await _pull(g, req, credentials, scratch)
        case "clone":
            return await _clone(g, req, credentials, scratch)
    raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Unknown git action: {req.action}")


async def _status(g: _Git) -> GitResult:
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


def _parse_status(g: _Git, data: bytes) -> GitStatus:
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


async def _diff(g: _Git, path: str | None) -> GitResult:
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


async def _commit(g: _Git, message: str | None, files: list[str] | None) -> GitResult:
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


async def _checkout(g: _Git, branch: str | None) -> GitResult:
    if branch is None:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "checkout needs a branch")
    _check_branch(branch)
    exists = await g.git("show-ref", "--verify", "-q", f"refs/heads/{branch}", ok=(0, 1))
    if exists.exit_code == 0:
        out = await g.git("switch", "--no-guess", branch, cap=g.cap)
    else:
        out = await g.git("switch", "-c", branch, cap=g.cap)
    text, truncated = g.printed(out)
    return GitResult(action="checkout", output=text, output_truncated=truncated, branch=branch)


async def _branches(g: _Git) -> GitResult:
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


async def _log(g: _Git, limit: int, path: str | None) -> GitResult:
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


# ---------------------------------------------------------------- network actions


@dataclass(frozen=True, slots=True)
class _Remote:
    url: str
    """Rebuilt from its parts: what git fetches from or pushes to."""
    protocol: str
    host: str
    credential: Credential | None


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
    if _HOST.match(hostname):
        host = hostname
    elif ":" in hostname and _IPV6.match(hostname):
        host = f"[{hostname}]"
    else:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Invalid host in remote URL: {hostname!r}")
    if port is not None:
        host += f":{port}"
    rest = parts.path + (f"?{parts.query}" if parts.query else "")
    if parts.fragment or _control(rest) or " " in rest:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Invalid path in remote URL")
    return _Remote(f"{protocol}://{host}{rest}", protocol, host, credentials.find(protocol, host))


async def _remote_url(g: _Git, name: str, *, push: bool) -> str:
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
    g: _Git, directory: Path, workdir: str, args: Sequence[str], remote: _Remote
) -> Outcome:
    """Run git with network in a scratch ``directory``, with the remote's credential."""
    config = [f"protocol.{remote.protocol}.allow=always"]
    env: dict[str, str] = {}
    stdin: bytes | None = None
    argv = _argv(args, config)
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
        argv = ["sh", "-c", _WITH_TOKEN, "sh", *_argv(args, config)[1:]]
        stdin = token.encode() + b"\n"
    cap = g.cap + max((len(s) for s in g.secrets), default=0)
    return await g.spawn(
        directory, argv, workdir=workdir, cap=cap, network=True, env=env, stdin=stdin
    )


_LOCAL = ("protocol.file.allow=always",)
_UPLOAD_PACK = "--upload-pack=git -c 'safe.directory=*' upload-pack"
"""The serving side of a local fetch gets no ``-c`` from its caller; the scratch repositories
belong to the executor, not to the sandbox's user, so it needs this one."""
BOUND = "/tmp/quill-source"
"""Where a sandbox with a mount namespace shows a directory it reads from. Directly under
/tmp: bwrap makes the parents of a bind target ``0700`` root, which git's ``access(2)`` checks
refuse to the sandbox's user."""


async def _show(g: _Git, host: Path, probe: Path) -> tuple[str, tuple[tuple[Path, str], ...]]:
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
def _scratch(scratch: Path | None) -> Iterator[Path]:
    """A temporary directory of the executor's, readable by the sandbox's user."""
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="quill-git-", dir=scratch) as tmp:
        path = Path(tmp).resolve()
        path.chmod(0o755)
        yield path


async def _push(
    g: _Git, req: GitCommand, credentials: Credentials, scratch: Path | None
) -> GitResult:
    branch = _check_branch(req.branch or await g.branch(required=True) or "")
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
    with _scratch(scratch) as tmp:
        stage, push = tmp / "stage.git", tmp / "push.git"
        _bare(stage)
        root, binds = await _show(g, g.checkout.resolve(), stage)
        source = f"{root}/{g.repo}".rstrip("/")
        await g.spawn(
            stage,
            _argv(
                ["fetch", "-q", "--no-tags", _UPLOAD_PACK, source, f"refs/heads/{branch}"],
                _LOCAL,
            ),
            workdir="",
            ro_binds=binds,
        )
        _bare(push, alternates="../../stage.git/objects")
        ref = push / "refs/heads" / branch
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(sha + "\n")
        spec = f"refs/heads/{branch}:refs/heads/{branch}"
        out = await _network(g, tmp, "push.git", ["push", remote.url, spec], remote)
    await g.git("update-ref", f"refs/remotes/{req.remote}/{branch}", sha)
    text, truncated = g.printed(out)
    return GitResult(
        action="push", output=text, output_truncated=truncated, branch=await g.branch()
    )


async def _pull(
    g: _Git, req: GitCommand, credentials: Credentials, scratch: Path | None
) -> GitResult:
    current = await g.branch(required=True)
    branch = _check_branch(req.branch or current or "")
    remote = _remote(await _remote_url(g, req.remote, push=False), credentials)
    tracking = f"refs/remotes/{req.remote}/{branch}"
    with _scratch(scratch) as tmp:
        _bare(tmp / "fetch.git")
        await _network(
            g,
            tmp,
            "fetch.git",
            ["fetch", "-q", "--no-tags", remote.url, f"+refs/heads/{branch}:refs/heads/{branch}"],
            remote,
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


async def _clone(
    g: _Git, req: GitCommand, credentials: Credentials, scratch: Path | None
) -> GitResult:
    if req.url is None:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "clone needs a url")
    remote = _remote(req.url, credentials)
    target = _resolve_dir(g.checkout, g.workdir)
    if target is not None and (not target.is_dir() or any(target.iterdir())):
        raise QuillError(
            ErrorCode.ALREADY_EXISTS,
            f"{_display(g.workdir)} is not an empty directory",
            {"path": g.workdir},
        )
    name = req.remote
    if not _REMOTE.match(name):
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Invalid remote name: {name!r}")
    with _scratch(scratch) as tmp:
        await _network(
            g, tmp, "", ["clone", "-q", "--bare", "--template=", remote.url, "clone.git"], remote
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
