"""Git actions with real git, in each sandbox provider, against a real HTTP remote that requires
a token (``git http-backend`` behind Basic auth); a hostile repository must neither run code
on the host nor get the token."""

from __future__ import annotations

import base64
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from contracts.errors import ErrorCode, QuillError
from contracts.replies import GitFileStatus, GitResult, GitStatus
from contracts.requests import GitCommand
from infra.exec import sandbox
from infra.exec.git import Credential, Credentials, Runner, run_git, sandbox_runner
from infra.exec.git.targets import UNREACHABLE, Targets
from infra.exec.sandbox import Limits, Outcome, Spawn
from tests.executor.git_server import GitServer, git

TOKEN = "ghs_T0kenThatMustNeverLeak_42"
CAP = 50_000
LOCAL_SERVERS = Targets().allowing(["127.0.0.1"])
"""The test servers listen on 127.0.0.1: allow-listed, as a deployment with an internal git
server would (``tests/security/test_git_network.py`` has what is refused without it)."""


# ---------------------------------------------------------------- fixtures


WHY_NO_BWRAP = sandbox.probe_bwrap()


@pytest.fixture(params=["bwrap", "local"])
def run(request: pytest.FixtureRequest) -> Runner:
    if request.param == "bwrap" and WHY_NO_BWRAP is not None:
        pytest.skip(f"bwrap cannot run here: {WHY_NO_BWRAP}")
    return sandbox_runner(sandbox.provider(request.param), Limits())


@pytest.fixture
def provider_name(run: Runner, request: pytest.FixtureRequest) -> str:
    return str(request.node.callspec.params["run"])


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def server(tmp_path: Path) -> Iterator[GitServer]:
    srv = GitServer(tmp_path / "server", token=TOKEN).start()
    srv.create("repo.git")
    yield srv
    srv.stop()


@pytest.fixture
def evil(tmp_path: Path) -> Iterator[GitServer]:
    """Asks every client for a password, and records what it was sent."""
    srv = GitServer(tmp_path / "evil", token="evil-wants-your-token").start()
    srv.create("repo.git")
    yield srv
    srv.stop()


@pytest.fixture
def creds(tmp_path: Path, server: GitServer) -> Credentials:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "token").write_text(TOKEN + "\n")
    return Credentials(
        (Credential(host=server.host, protocol="http", token_file=secrets / "token"),),
        LOCAL_SERVERS,
    )


OWNER = (sandbox.HOST_UID, sandbox.HOST_UID) if os.geteuid() == 0 else None
"""Who a checkout belongs to under bwrap (``Provider.owner``): its command has no privilege
over any other file."""


@pytest.fixture
def owner(request: pytest.FixtureRequest) -> tuple[int, int] | None:
    return OWNER if request.node.callspec.params.get("run") == "bwrap" else None


def own(root: Path, owner: tuple[int, int] | None) -> None:
    """Give what the test wrote into a checkout on the host to the command's uid, as the
    executor gives what it writes (nothing under a link is followed)."""
    if owner is not None and root.exists():
        for path in [root, *root.rglob("*")]:
            os.chown(path, *owner, follow_symlinks=False)


class Git:
    """Runs actions like the executor does, and git commands in the sandbox for setup."""

    def __init__(
        self,
        run: Runner,
        ws: Path,
        creds: Credentials,
        scratch: Path,
        owner: tuple[int, int] | None = None,
    ) -> None:
        self.run, self.ws, self.creds, self.scratch = run, ws, creds, scratch
        self.owner = owner

    async def __call__(
        self,
        action: str,
        *,
        actor: str | None = "alice",
        cap: int = CAP,
        creds: Credentials | None = None,
        ws: Path | None = None,
        **fields: Any,
    ) -> GitResult:
        req = msgspec.convert({"action": action, **fields}, GitCommand)
        own(ws or self.ws, self.owner)
        try:
            return await run_git(
                req,
                checkout=ws or self.ws,
                run=self.run,
                actor=actor,
                credentials=self.creds if creds is None else creds,
                output_cap=cap,
                scratch=self.scratch,
                owner=self.owner,
            )
        finally:  # scratch repositories never outlive the action
            assert not self.scratch.exists() or list(self.scratch.iterdir()) == []

    async def sh(self, *argv: str, workdir: str = "", ws: Path | None = None) -> str:
        own(ws or self.ws, self.owner)
        out = await self.run(ws or self.ws, Spawn(argv=list(argv), workdir=workdir))
        assert out.exit_code == 0, out.stderr.decode()
        return out.stdout.decode()

    async def init(self, workdir: str = "", ws: Path | None = None) -> None:
        await self.sh("git", "init", "-q", "-b", "main", workdir or ".", ws=ws)


@pytest.fixture
def g(
    run: Runner, ws: Path, creds: Credentials, tmp_path: Path, owner: tuple[int, int] | None
) -> Git:
    return Git(run, ws, creds, tmp_path / "data/scratch", owner)


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def leaks(root: Path, secret: str = TOKEN) -> list[str]:
    """Files under ``root`` (``.git`` included) holding the secret or its Basic form."""
    forms = [
        secret.encode(),
        base64.b64encode(f"x-access-token:{secret}".encode()),
    ]
    return [
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and any(f in p.read_bytes() for f in forms)
    ]


def blob(text: str) -> str:
    """The abbreviated object name git shows for a file's content."""
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()[:7]


async def fails(code: ErrorCode, call: Any) -> QuillError:
    with pytest.raises(QuillError) as info:
        await call
    assert info.value.code == code, info.value
    return info.value


# ---------------------------------------------------------------- local actions


async def test_no_repository(g: Git, ws: Path) -> None:
    err = await fails(ErrorCode.FILE_NOT_FOUND, g("status"))
    assert err.message == "Not a git repository: /workspace"
    (ws / "src").mkdir()
    err = await fails(ErrorCode.FILE_NOT_FOUND, g("log", workdir="src"))
    assert err.message == "Not a git repository: /workspace/src"
    await fails(ErrorCode.ACCESS_DENIED, g("status", workdir="../x"))


async def test_status_is_structured(g: Git, ws: Path) -> None:
    await g.init()
    result = await g("status")
    assert result.status == GitStatus(
        branch="main", upstream=None, ahead=0, behind=0, staged=[], unstaged=[], untracked=[]
    )
    write(ws, {"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n", "gone.txt": "g\n"})
    await g("commit", message="base")
    write(ws, {"a.txt": "a2\n", "b.txt": "b2\n", "new dir/x.txt": "x\n", "u v.txt": "u\n"})
    (ws / "gone.txt").unlink()
    await g.sh("git", "add", "b.txt")
    await g.sh("git", "mv", "c.txt", "d.txt")
    index = (ws / ".git/index").stat().st_mtime_ns
    result = await g("status")
    assert result.branch == "main"
    assert result.status == GitStatus(
        branch="main",
        upstream=None,
        ahead=0,
        behind=0,
        staged=[
            GitFileStatus(path="b.txt", status="modified"),
            GitFileStatus(path="d.txt", status="renamed", original_path="c.txt"),
        ],
        unstaged=[
            GitFileStatus(path="a.txt", status="modified"),
            GitFileStatus(path="gone.txt", status="deleted"),
        ],
        untracked=["new dir/", "u v.txt"],
    )
    assert "# branch.head main" in result.output and not result.output_truncated
    assert (ws / ".git/index").stat().st_mtime_ns == index  # GIT_OPTIONAL_LOCKS=0


async def test_status_paths_are_workspace_paths(g: Git, ws: Path) -> None:
    (ws / "proj/src").mkdir(parents=True)
    await g.init("proj")
    write(ws, {"proj/src/a.py": "print()\n", "proj/top.txt": "t\n"})
    await g("commit", message="one", workdir="proj/src", files=["proj/src/a.py"])
    write(ws, {"proj/src/a.py": "print(1)\n"})
    result = await g("status", workdir="/workspace/proj/src")
    assert result.status is not None
    assert result.status.unstaged == [GitFileStatus(path="proj/src/a.py", status="modified")]
    assert result.status.untracked == ["proj/top.txt"]
    await fails(ErrorCode.INVALID_ARGUMENT, g("diff", workdir="proj", path="elsewhere.txt"))


async def test_diff_staged_and_unstaged(g: Git, ws: Path) -> None:
    await g.init()
    write(ws, {"a.txt": "one\n", "b.txt": "bee\n"})
    await g("commit", message="base")
    write(ws, {"a.txt": "two\n", "b.txt": "bee\nsting\n"})
    await g.sh("git", "add", "a.txt")
    result = await g("diff")
    one, two, bee, sting = blob("one\n"), blob("two\n"), blob("bee\n"), blob("bee\nsting\n")
    staged = (
        f"diff --git a/a.txt b/a.txt\nindex {one}..{two} 100644\n"
        "--- a/a.txt\n+++ b/a.txt\n"
        "@@ -1 +1 @@\n-one\n+two\n"
    )
    unstaged = (
        f"diff --git a/b.txt b/b.txt\nindex {bee}..{sting} 100644\n"
        "--- a/b.txt\n+++ b/b.txt\n"
        "@@ -1 +1,2 @@\n bee\n+sting\n"
    )
    assert (result.staged_diff, result.unstaged_diff) == (staged, unstaged)
    assert result.output == staged + unstaged and not result.output_truncated
    only_b = await g("diff", path="/workspace/b.txt")
    assert (only_b.staged_diff, only_b.unstaged_diff) == ("", unstaged)
    small = await g("diff", cap=100)
    assert small.output_truncated
    assert len(small.output.encode()) <= 100
    assert small.output == (small.staged_diff or "") + (small.unstaged_diff or "")
    assert small.output.startswith("diff --git a/a.txt")


async def test_commit_identity_files_and_errors(g: Git, ws: Path) -> None:
    await g.init()
    write(ws, {"a.txt": "a\n", "b.txt": "b\n"})
    result = await g("commit", message="#1: add a", files=["a.txt"], actor="agent-7")
    assert result.branch == "main"
    assert result.commit == (await g.sh("git", "rev-parse", "HEAD")).strip()
    shown = await g.sh("git", "log", "-1", "--format=%an|%ae|%cn|%ce|%B")
    assert shown == (
        "agent-7|agent-7@users.quill.invalid|quill[bot]|quill[bot]@users.noreply.quill.invalid"
        "|#1: add a\n\n"
    )
    assert await g.sh("git", "ls-files") == "a.txt\n"  # b.txt was not staged
    await fails(ErrorCode.INVALID_ARGUMENT, g("commit"))
    await fails(ErrorCode.INVALID_ARGUMENT, g("commit", message="  \n"))
    err = await fails(ErrorCode.EXECUTION_FAILED, g("commit", message="again", files=["a.txt"]))
    assert err.message == "nothing to commit"
    (ws / "a.txt").unlink()
    await g("commit", message="everything", actor=None)
    assert await g.sh("git", "ls-files") == "b.txt\n"
    assert await g.sh("git", "log", "-1", "--format=%an <%ae>") == (
        "quill <quill@users.quill.invalid>\n"
    )
    err = await fails(ErrorCode.EXECUTION_FAILED, g("commit", message="x", files=["nope.txt"]))
    assert "did not match any files" in err.message
    assert err.details == {"exit_code": 128}


async def test_checkout_and_branch(g: Git, ws: Path) -> None:
    await g.init()
    write(ws, {"a.txt": "a\n"})
    await g("commit", message="base")
    result = await g("checkout", branch="feature/new-thing")
    assert result.branch == "feature/new-thing"
    assert "Switched to a new branch 'feature/new-thing'" in result.output
    write(ws, {"f.txt": "f\n"})
    await g("commit", message="on feature")
    back = await g("checkout", branch="main")
    assert back.branch == "main" and not (ws / "f.txt").exists()
    listed = await g("branch")
    assert (listed.branches, listed.branch) == (["feature/new-thing", "main"], "main")
    assert listed.output == "  feature/new-thing\n* main\n"
    for bad in ("-f", "a..b", "x y", "x:y", "x.lock", "@{-1}"):
        await fails(ErrorCode.INVALID_ARGUMENT, g("checkout", branch=bad))
    await fails(ErrorCode.INVALID_ARGUMENT, g("checkout"))


async def test_log(g: Git, ws: Path) -> None:
    await g.init()
    assert (await g("log")).log == []
    for i in range(3):
        write(ws, {f"f{i}.txt": f"{i}\n", "all.txt": f"{i}\n"})
        await g("commit", message=f"commit {i}\n\nbody {i}")
    shas = (await g.sh("git", "rev-list", "HEAD")).split()
    result = await g("log", limit=2)
    assert result.log is not None
    assert [c.sha for c in result.log] == shas[:2]
    assert [c.subject for c in result.log] == ["commit 2", "commit 1"]
    first = result.log[0]
    assert (first.author, first.email) == ("alice", "alice@users.quill.invalid")
    assert first.at.utcoffset() is not None
    assert abs(first.at.timestamp() - time.time()) < 60
    assert result.output.splitlines()[0].startswith(f"{shas[0]} ")
    only = await g("log", path="f0.txt")
    assert only.log is not None and [c.sha for c in only.log] == shas[2:]


# ---------------------------------------------------------------- remote actions


async def remote_repo(g: Git, ws: Path, server: GitServer, files: dict[str, str]) -> str:
    await g.init()
    await g.sh("git", "remote", "add", "origin", server.url("repo.git"))
    write(ws, files)
    result = await g("commit", message="first")
    assert result.commit is not None
    return result.commit


async def test_push_with_the_token(g: Git, ws: Path, server: GitServer) -> None:
    sha = await remote_repo(g, ws, server, {"a.txt": "a\n"})
    result = await g("push")
    assert result.branch == "main"
    assert result.output == f"To {server.url('repo.git')}\n * [new branch]      main -> main\n"
    assert git(server.root / "repo.git", "rev-parse", "main").strip() == sha
    assert [s.authorization is not None for s in server.requests if "POST" == s.method] == [True]
    assert TOKEN not in msgspec.json.encode(result).decode()
    assert leaks(ws) == []
    tracking = await g.sh("git", "rev-parse", "refs/remotes/origin/main")
    assert tracking.strip() == sha


async def test_push_needs_the_right_credential(
    g: Git, ws: Path, server: GitServer, tmp_path: Path
) -> None:
    await remote_repo(g, ws, server, {"a.txt": "a\n"})
    err = await fails(ErrorCode.ACCESS_DENIED, g("push", creds=Credentials()))
    assert server.host in err.message
    (tmp_path / "wrong").write_text("wrong-token\n")
    wrong = Credentials(
        (Credential(host=server.host, protocol="http", token_file=tmp_path / "wrong"),),
        LOCAL_SERVERS,
    )
    err = await fails(ErrorCode.EXECUTION_FAILED, g("push", creds=wrong))
    assert "Authentication failed" in err.message and "wrong-token" not in err.message
    missing = Credentials(
        (Credential(host=server.host, protocol="http", token_env="NO_SUCH_VAR"),), LOCAL_SERVERS
    )
    await fails(ErrorCode.EXECUTION_FAILED, g("push", creds=missing))
    assert git(server.root / "repo.git", "branch", "--list") == ""


async def test_push_refuses_unsafe_remotes(
    g: Git, ws: Path, server: GitServer, evil: GitServer
) -> None:
    await remote_repo(g, ws, server, {"a.txt": "a\n"})
    for url in (
        f"http://x-access-token:{TOKEN}@{server.host}/repo.git",
        "file:///tmp/elsewhere.git",
        "ext::sh -c touch% /tmp/pwned",
        f"{server.host}:repo.git",
    ):
        await g.sh("git", "remote", "set-url", "origin", url)
        err = await fails(ErrorCode.INVALID_ARGUMENT, g("push"))
        assert TOKEN not in err.message
    await g.sh("git", "remote", "set-url", "origin", evil.url("repo.git"))
    await fails(ErrorCode.ACCESS_DENIED, g("push"))
    await fails(ErrorCode.INVALID_ARGUMENT, g("push", remote="nope"))
    await fails(ErrorCode.INVALID_ARGUMENT, g("push", remote="-x"))
    assert evil.requests == []


async def test_push_follows_no_redirect(
    g: Git, ws: Path, server: GitServer, evil: GitServer
) -> None:
    server.redirect_to = f"http://{evil.host}"
    await remote_repo(g, ws, server, {"a.txt": "a\n"})
    await g.sh("git", "remote", "set-url", "origin", f"http://{server.host}/redirect/repo.git")
    err = await fails(ErrorCode.EXECUTION_FAILED, g("push"))
    assert err.message == UNREACHABLE  # no git server answered
    assert evil.requests == []


async def test_remote_echoing_the_token_is_redacted(g: Git, ws: Path, server: GitServer) -> None:
    basic = base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    hook = server.root / "repo.git/hooks/pre-receive"
    hook.write_text(f"#!/bin/sh\necho 'token {TOKEN} basic {basic}' >&2\n")
    hook.chmod(0o755)
    await remote_repo(g, ws, server, {"a.txt": "a\n"})
    result = await g("push")
    assert "remote: token *** basic ***" in result.output
    assert TOKEN not in result.output and basic not in result.output


async def test_the_token_is_redacted_even_cut_by_the_cap(
    run: Runner,
    ws: Path,
    server: GitServer,
    creds: Credentials,
    tmp_path: Path,
    owner: tuple[int, int] | None,
) -> None:
    """Whatever git prints with the credential, no piece of the token reaches the reply."""
    basic = base64.b64encode(f"x-access-token:{TOKEN}".encode())
    noise = b"remote: " + basic + b"\n" + (TOKEN.encode() + b" ") * 50

    async def echoing(directory: Path, spawn: Spawn) -> Outcome:
        if not spawn.network:
            return await run(directory, spawn)
        kept = noise[: spawn.output_cap]  # as a sandbox keeps the first output_cap bytes
        return Outcome(0, b"", kept, 0, len(noise), False, 1)

    g = Git(echoing, ws, creds, tmp_path / "scratch", owner)
    await remote_repo(g, ws, server, {"a.txt": "a\n"})
    pieces = {TOKEN[i : i + 4] for i in range(len(TOKEN) - 3)}
    for cap in range(20, 200, 11):
        result = await g("push", cap=cap)
        assert result.output_truncated and len(result.output.encode()) <= cap
        assert not any(piece in result.output for piece in pieces), (cap, result.output)
        assert basic.decode()[:8] not in result.output


HOSTILE_HOOK = "#!/bin/sh\nenv > {name}.leak\ntouch {marker}\n"


async def test_hostile_repository(
    g: Git, ws: Path, server: GitServer, evil: GitServer, tmp_path: Path, provider_name: str
) -> None:
    """Hooks, fsmonitor, credential helpers and insteadOf in the workspace's config never run
    or apply with the credential; a filter runs, in the sandbox only, and sees no token."""
    sha0 = await remote_repo(g, ws, server, {"a.txt": "a\n"})
    markers = tmp_path / "markers"
    markers.mkdir()
    for name in ("pre-commit", "commit-msg", "post-commit", "pre-push", "post-checkout",
                 "post-merge", "reference-transaction", "pre-auto-gc"):  # fmt: skip
        hook = ws / ".git/hooks" / name
        hook.write_text(HOSTILE_HOOK.format(name=name, marker=markers / name))
        hook.chmod(0o755)
    good = f"http://{server.host}/"
    for key, value in (
        (f"url.http://{evil.host}/.insteadOf", good),
        (f"url.http://{evil.host}/.pushInsteadOf", good),
        ("core.fsmonitor", f"env > fsmonitor.leak; touch {markers}/fsmonitor; false"),
        ("credential.helper", f"!env > helper.leak; touch {markers}/helper; echo"),
        ("core.pager", f"touch {markers}/pager; cat"),
        ("diff.external", f"touch {markers}/difftool"),
        ("commit.gpgSign", "true"),
        ("gpg.program", f"{ws}/gpg.sh"),
        ("filter.evil.clean", f"sh -c 'env > .git/filter.leak; touch {markers}/filter; cat'"),
        ("filter.evil.smudge", "cat"),
        ("diff.evil.textconv", f"touch {markers}/textconv; cat"),
        ("core.hooksPath", ".git/hooks"),
        ("http.proxy", f"http://{evil.host}"),
        ("uploadpack.packObjectsHook", f"touch {markers}/packobjectshook; git"),
        ("core.alternateRefsCommand", f"touch {markers}/alternaterefs; true"),
        ("remote.origin.receivepack", f"touch {markers}/receivepack; git-receive-pack"),
        ("remote.origin.uploadpack", f"touch {markers}/uploadpack; git-upload-pack"),
    ):
        await g.sh("git", "config", key, value)
    write(ws, {".gitattributes": "*.txt filter=evil diff=evil\n", "b.txt": "b\n"})
    (ws / "gpg.sh").write_text(f"#!/bin/sh\ntouch {markers}/gpg\n")
    (ws / "gpg.sh").chmod(0o755)

    committed = await g("commit", message="hostile")
    await g("status")
    write(ws, {"b.txt": "b2\n"})
    assert "+b2" in (await g("diff")).output  # neither textconv nor diff.external ran
    await g("log", path="b.txt")
    pushed = await g("push")
    await g("checkout", branch="other")
    await g("checkout", branch="main")
    await g("pull")

    assert git(server.root / "repo.git", "rev-parse", "main").strip() == committed.commit
    assert committed.commit != sha0
    assert evil.requests == []
    assert leaks(ws) == [] and leaks(tmp_path / "markers") == []
    assert TOKEN not in pushed.output
    leaked = sorted(p.name for p in ws.rglob("*.leak"))
    assert leaked == ["filter.leak"]  # filters run, in the workspace's sandbox
    ran = sorted(p.name for p in markers.iterdir())
    # bwrap: the filter could not touch the host; local: no isolation, but nothing else ran
    assert ran == ([] if provider_name == "bwrap" else ["filter"])


async def test_clone_and_pull(
    g: Git, ws: Path, server: GitServer, tmp_path: Path, creds: Credentials
) -> None:
    sha = await remote_repo(g, ws, server, {"a.txt": "a\n", "d/b.txt": "b\n"})
    await g("push")
    other = tmp_path / "other"
    (other / "keep").mkdir(parents=True)
    (other / "keep/x").write_text("x")
    cloned = await g("clone", ws=other, workdir="clone", url=server.url("repo.git"))
    assert (cloned.branch, cloned.output) == ("main", "Cloning into 'clone'...\n")
    assert (other / "clone/d/b.txt").read_text() == "b\n"
    assert (await g.sh("git", "rev-parse", "HEAD", ws=other, workdir="clone")).strip() == sha
    origin = await g.sh("git", "config", "remote.origin.url", ws=other, workdir="clone")
    assert origin == server.url("repo.git") + "\n"
    assert leaks(other) == []
    err = await fails(
        ErrorCode.ALREADY_EXISTS, g("clone", ws=other, workdir="keep", url=server.url("repo.git"))
    )
    assert err.details == {"path": "keep"}

    write(ws, {"a.txt": "a2\n"})
    second = await g("commit", message="second")
    await g("push")
    pulled = await g("pull", ws=other, workdir="clone")
    assert pulled.output.startswith(f"Updating {sha[:7]}..{(second.commit or '')[:7]}\n")
    assert "Fast-forward" in pulled.output and pulled.branch == "main"
    assert (other / "clone/a.txt").read_text() == "a2\n"
    status = await g("status", ws=other, workdir="clone")
    assert status.status is not None
    assert (status.status.upstream, status.status.ahead, status.status.behind) == (
        "origin/main", 0, 0,
    )  # fmt: skip
    log = await g("log", ws=other, workdir="clone", limit=1)
    assert log.log is not None and log.log[0].sha == second.commit

    write(ws, {"a.txt": "a3\n"})
    await g("commit", message="third")
    await g("push")
    write(other, {"clone/a.txt": "diverged\n"})
    await g("commit", ws=other, workdir="clone", message="diverged")
    err = await fails(ErrorCode.EXECUTION_FAILED, g("pull", ws=other, workdir="clone"))
    assert "fast-forward" in err.message.lower()
    assert leaks(other) == [] and leaks(ws) == []


async def test_clone_into_the_root_and_anonymous(g: Git, tmp_path: Path, evil: GitServer) -> None:
    public = GitServer(tmp_path / "public").start()
    try:
        bare = public.create("pub.git")
        git(tmp_path, "clone", "-q", str(bare), "seed")
        (tmp_path / "seed/r.md").write_text("readme\n")
        git(tmp_path / "seed", "add", "r.md")
        git(tmp_path / "seed", "commit", "-qm", "seed")
        git(tmp_path / "seed", "push", "-q", "origin", "HEAD:main")
        target = tmp_path / "root"
        target.mkdir()
        result = await g("clone", ws=target, url=public.url("pub.git"))
        assert (target / "r.md").read_text() == "readme\n" and result.branch == "main"
        assert all(s.authorization is None for s in public.requests)
    finally:
        public.stop()
    err = await fails(
        ErrorCode.EXECUTION_FAILED, g("clone", ws=tmp_path / "e", url=evil.url("repo.git"))
    )
    assert "Authentication failed" in err.message or "could not read Username" in err.message
    assert evil.requests and all(s.authorization is None for s in evil.requests)
    await fails(ErrorCode.INVALID_ARGUMENT, g("clone", ws=tmp_path / "e"))
    await fails(ErrorCode.INVALID_ARGUMENT, g("clone", ws=tmp_path / "e", url="file:///etc"))


async def test_no_network_in_the_sandbox_fails_clearly(
    run: Runner, ws: Path, server: GitServer, creds: Credentials, owner: tuple[int, int] | None
) -> None:
    async def offline(directory: Path, spawn: Spawn) -> Outcome:
        if spawn.network:
            raise sandbox.SandboxError("network is not available in this sandbox")
        return await run(directory, spawn)

    g = Git(offline, ws, creds, ws.parent / "scratch", owner)
    await remote_repo(g, ws, server, {"a.txt": "a\n"})
    err = await fails(ErrorCode.EXECUTION_FAILED, g("push"))
    assert err.message == (
        "The sandbox could not run git with network here: network is not available in this sandbox"
    )


async def test_timeout(g: Git, ws: Path) -> None:
    await g.init()
    await g.sh("git", "config", "filter.slow.clean", "sleep 60")
    write(ws, {".gitattributes": "* filter=slow\n", "a.txt": "a\n"})
    started = time.monotonic()
    err = await fails(ErrorCode.TIMEOUT, g("commit", message="slow", timeout_ms=500))
    assert err.details == {"timeout_ms": 500}
    assert time.monotonic() - started < 10


def test_credentials_from_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gh").write_text("from-file\n")
    (tmp_path / "creds.toml").write_text(
        "[[git.credential]]\n"
        'host = "github.com"\n'
        f'token_file = "{tmp_path / "gh"}"\n'
        "[[git.credential]]\n"
        'host = "git.example.com:8443"\n'
        'username = "bot"\n'
        'token_env = "QUILL_TEST_TOKEN"\n'
        "[git]\n"
        'allow = ["git.internal", "10.1.0.0/16:443"]\n'
    )
    monkeypatch.setenv("QUILL_TEST_TOKEN", "from-env")
    creds = Credentials.load(tmp_path / "creds.toml")
    github = creds.find("https", "github.com")
    assert github is not None and github.token() == "from-file"
    assert github.username == "x-access-token"
    other = creds.find("https", "git.example.com:8443")
    assert other is not None and (other.username, other.token()) == ("bot", "from-env")
    assert creds.find("http", "github.com") is None
    assert creds.find("https", "evil.com") is None
    assert TOKEN not in repr(creds)
    assert [str(a) for a in creds.targets.allow] == ["git.internal", "10.1.0.0/16:443"]
    more = creds.allowing(["[fd00::1]:8443"])
    assert [str(a) for a in more.targets.allow][-1] == "[fd00::1/128]:8443"
    assert more.entries == creds.entries
    (tmp_path / "allow.toml").write_text('[git]\nallow = ["http://x/"]\n')
    with pytest.raises(ValueError):
        Credentials.load(tmp_path / "allow.toml")
    (tmp_path / "allow.toml").write_text('[git]\nallow = "git.internal"\n')
    with pytest.raises(ValueError):
        Credentials.load(tmp_path / "allow.toml")
    (tmp_path / "bad.toml").write_text('[[git.credential]]\nhost = "x"\ntoken = "inline"\n')
    with pytest.raises(ValueError):
        Credentials.load(tmp_path / "bad.toml")
    with pytest.raises(ValueError):
        Credential(host="x", token_file=tmp_path / "gh", token_env="Y")
