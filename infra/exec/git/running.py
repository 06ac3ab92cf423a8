"""Running git for one action: in the sandbox, hardened, under one deadline, redacted.

Every git invocation goes through ``Git.spawn`` and so through the ``Runner`` (the sandbox).
Each gets ``-c`` overrides (``HARDENING``: no hooks, no fsmonitor, no pager, editor, askpass,
gpg or external diff, credential helpers reset, every transport forbidden unless the run needs
it, no redirects, no submodule recursion, no auto-gc) and the environment ``GIT_ENV`` (no
system or global config, no prompts). Read-only actions also get ``GIT_OPTIONAL_LOCKS=0``;
diff and log pass ``--no-ext-diff --no-textconv``.

All the git runs of one action share its deadline (``TIMEOUT`` past it). What git prints is
redacted (every form of a token a network run was given, see ``remote``) before it reaches a
reply or an error message, and capped at a character boundary.

Identities: the author is the actor (name = actor, email ``<actor>@users.quill.invalid``;
``quill`` when there is none); the committer is ``quill[bot]``.
"""

from __future__ import annotations

import codecs
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts import paths
from contracts.errors import ErrorCode, QuillError
from infra.exec.git.workspace import display, within
from infra.exec.sandbox import Limits, Outcome, Provider, SandboxError, Spawn

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


def sandbox_runner(provider: Provider, limits: Limits) -> Runner:
    """A ``Runner`` over a sandbox provider."""

    async def run(directory: Path, spawn: Spawn) -> Outcome:
        return await provider.run(directory, spawn, limits)

    return run


def git_argv(args: Sequence[str], config: Sequence[str] = ()) -> list[str]:
    """``git`` with ``HARDENING`` and ``config`` as ``-c`` overrides, then ``args``."""
    argv = ["git"]
    for item in (*HARDENING, *config):
        argv += ["-c", item]
    return [*argv, *args]


def identity(actor: str | None) -> dict[str, str]:
    """The author and committer environment of an action on behalf of ``actor``."""
    name = re.sub(r"[<>\x00-\x1f\x7f]", "", actor or "").strip() or "quill"
    local = re.sub(r"[^A-Za-z0-9._+-]", "-", actor or "quill").strip(".") or "quill"
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": f"{local}@{ACTOR_EMAIL_DOMAIN}",
        "GIT_COMMITTER_NAME": BOT_NAME,
        "GIT_COMMITTER_EMAIL": BOT_EMAIL,
    }


@dataclass(slots=True)
class Git:
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
    """Whether the sandbox shows ``ro_binds`` (asked once, by ``remote._show``)."""
    owner: tuple[int, int] | None = None
    """Who the scratch repositories must belong to for the sandboxed git to write them
    (``Provider.owner``)."""

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
        return await self.spawn(self.checkout, git_argv(args, config), workdir=wd, **kw)

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
        rel = within(self.repo, paths.normalize(path))
        if rel is None:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"{path} is outside the repository at {display(self.repo)}",
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
