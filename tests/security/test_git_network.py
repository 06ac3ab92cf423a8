"""Issue 10, item 5: remote git (clone, pull, push) reaches public addresses only, connects to
the address it checked (pinned: DNS cannot move it), and tells every refused or unreachable
target with the same error; a deployment's allow-list admits an internal server.

No test here sends anything to an address that is not loopback: every non-loopback target is
refused before any connection, and is only tried after the loopback ones were refused (so a
regression fails on a loopback target first). Names are resolved by a test resolver, except
``localhost`` and the names of ``/etc/hosts`` (no DNS query leaves the machine)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from contracts.errors import ErrorCode, QuillError
from contracts.replies import GitResult
from contracts.requests import GitCommand
from infra.exec import sandbox
from infra.exec.git import Credential, Credentials, Runner, run_git, sandbox_runner
from infra.exec.git.targets import UNREACHABLE, Allowed, Targets, is_public
from infra.exec.sandbox import Limits, Spawn
from quill.client import Quill
from tests.executor.git_server import GitServer, git
from tests.security.conftest import Canaries, verify
from tests.up import Up

WHY_NO_BWRAP = sandbox.probe_bwrap()
NOT_LOOPBACK = [
    "http://169.254.169.254/latest/meta-data/",
    "http://[::ffff:169.254.169.254]/latest/meta-data/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://10.0.0.1/repo.git",
    "https://10.0.0.1:8443/repo.git",
    "http://172.16.0.1/repo.git",
    "http://192.168.1.1/repo.git",
    "http://100.64.0.1/repo.git",
    "http://224.0.0.1/repo.git",
    "http://240.0.0.1/repo.git",
    "http://255.255.255.255/repo.git",
    "http://198.18.0.1/repo.git",
    "http://[fe80::1]/repo.git",
    "http://[fc00::1]/repo.git",
    "http://[ff02::1]/repo.git",
    "http://[::ffff:10.0.0.1]/repo.git",
    "http://[64:ff9b::a00:1]/repo.git",  # NAT64 of 10.0.0.1
    "http://[2002:a00:1::1]/repo.git",  # 6to4 of 10.0.0.1
    "http://[::]/repo.git",
]


def hosts_aliases() -> list[str]:
    """Names other than localhost that /etc/hosts maps to a loopback address."""
    names: list[str] = []
    for line in Path("/etc/hosts").read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) > 1 and fields[0].startswith(("127.", "::1")):
            names += [n.lower() for n in fields[1:] if "localhost" not in n and "." not in n]
    return names


def loopback_urls(open_port: int, closed_port: int) -> list[str]:
    urls = [
        f"http://127.0.0.1:{open_port}/repo.git",
        f"http://127.0.0.1:{closed_port}/repo.git",
        f"http://127.0.0.2:{open_port}/repo.git",
        f"http://localhost:{open_port}/repo.git",
        f"http://LocalHost:{open_port}/repo.git",
        f"http://git.localhost:{open_port}/repo.git",
        f"http://[::1]:{open_port}/repo.git",
        f"http://[::ffff:127.0.0.1]:{open_port}/repo.git",
        f"http://[::ffff:7f00:1]:{open_port}/repo.git",
        f"http://0.0.0.0:{open_port}/repo.git",
        f"https://127.0.0.1:{open_port}/repo.git",
    ]
    return urls + [f"http://{name}:{open_port}/repo.git" for name in hosts_aliases()]


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port bound and not listening: connecting to it is refused at once."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield int(sock.getsockname()[1])
    sock.close()


def seeded(root: Path, tmp_path: Path, token: str | None = None) -> GitServer:
    """A git server holding ``repo.git`` with one commit on ``main``."""
    server = GitServer(root, token=token).start()
    bare = server.create("repo.git")
    work = tmp_path / f"seed-{root.name}"
    work.mkdir()
    (work / "README.md").write_text("# internal\n")
    git(work, "init", "-q", "-b", "main")
    git(work, "add", ".")
    git(work, "commit", "-q", "-m", "seed")
    git(work, "push", "-q", str(bare), "main")
    return server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[GitServer]:
    srv = seeded(tmp_path / "server", tmp_path)
    yield srv
    srv.stop()


# ---------------------------------------------------------------- through quill up


@pytest.fixture
async def quill(up: Up) -> AsyncIterator[Quill]:
    client = await Quill.connect(up.nats_url, actor="attacker")
    yield client
    await client.close()


async def refused(quill: Quill, workspace: str, url: str) -> QuillError:
    ws = quill.workspace(workspace)
    with pytest.raises(QuillError) as info:
        await ws.git("clone", url=url, workdir="c", timeout_ms=20_000)
    return info.value


async def test_clone_reaches_no_host_or_internal_address(
    up: Up, quill: Quill, server: GitServer, closed_port: int, canaries: Canaries
) -> None:
    """Every loopback, private, link-local, metadata... target: the same error, and nothing
    reached the git server listening on 127.0.0.1 (open port) — nor anything else."""
    await quill.workspace("acme/probe").create(exist_ok=True)
    errors: dict[str, tuple[str, str]] = {}
    for url in loopback_urls(server.port, closed_port):
        err = await refused(quill, "acme/probe", url)
        errors[url] = (err.code, err.message)
        assert errors[url] == (ErrorCode.EXECUTION_FAILED, UNREACHABLE), (url, err)
        assert server.requests == [], url
    for url in NOT_LOOPBACK:  # refused before connecting, like the loopback ones above
        err = await refused(quill, "acme/probe", url)
        assert (err.code, err.message) == (ErrorCode.EXECUTION_FAILED, UNREACHABLE), (url, err)
    assert err.details == {}
    with pytest.raises(QuillError) as info:
        await quill.workspace("acme/probe").stat("c")
    assert info.value.code == ErrorCode.FILE_NOT_FOUND
    verify(up, "acme/probe")


# ---------------------------------------------------------------- the executor's git, in bwrap


@pytest.fixture(params=["bwrap", "local"])
def run(request: pytest.FixtureRequest) -> Runner:
    """The policy is the executor's, whatever runs git: both providers are held to it."""
    if request.param == "bwrap" and WHY_NO_BWRAP is not None:
        pytest.skip(f"bwrap cannot run here: {WHY_NO_BWRAP}")
    return sandbox_runner(sandbox.provider(request.param), Limits())


class Resolver:
    """A DNS of the test's own: ``answers[name]`` is the list of answers, one per query
    (the last repeated); a name it does not know fails as a name that does not exist."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.queries: list[str] = []

    async def __call__(self, name: str, port: int) -> Sequence[str]:
        self.queries.append(name)
        known = self.answers.get(name)
        if known is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return known[min(len(self.queries), len(known)) - 1]


class Action:
    def __init__(self, run: Runner, tmp_path: Path, owner: tuple[int, int] | None) -> None:
        self.run, self.tmp, self.owner = run, tmp_path, owner
        """``owner``: who a checkout belongs to under the provider (``Provider.owner``)."""
        self.count = 0

    async def __call__(
        self, action: str, creds: Credentials, ws: Path | None = None, **fields: Any
    ) -> GitResult:
        if ws is None:
            self.count += 1
            ws = self.tmp / f"ws{self.count}"
            ws.mkdir()
        if self.owner is not None:  # the checkout's, as the executor makes it
            os.chown(ws, *self.owner)
        req = msgspec.convert({"action": action, **fields}, GitCommand)
        return await run_git(
            req,
            checkout=ws,
            run=self.run,
            actor="alice",
            credentials=creds,
            output_cap=10_000,
            scratch=self.tmp / "scratch",
            owner=self.owner,
        )

    async def fails(self, action: str, creds: Credentials, **fields: Any) -> QuillError:
        with pytest.raises(QuillError) as info:
            await self(action, creds, **fields)
        return info.value


@pytest.fixture
def act(run: Runner, tmp_path: Path, request: pytest.FixtureRequest) -> Action:
    bwrap = request.node.callspec.params["run"] == "bwrap"
    owner = (sandbox.HOST_UID, sandbox.HOST_UID) if bwrap and os.geteuid() == 0 else None
    return Action(run, tmp_path, owner)


def allowing(*entries: str, resolver: Resolver | None = None) -> Credentials:
    return Credentials(targets=Targets(resolver=resolver).allowing(entries))


async def test_an_allow_listed_internal_server_works(act: Action, server: GitServer) -> None:
    url = server.url("repo.git")
    err = await act.fails("clone", Credentials(), url=url)
    assert (err.code, err.message) == (ErrorCode.EXECUTION_FAILED, UNREACHABLE)
    assert server.requests == []
    for allow in ("127.0.0.1", f"127.0.0.1:{server.port}", "127.0.0.0/8"):
        result = await act("clone", allowing(allow), url=url)
        assert (result.branch, result.output) == ("main", "Cloning into '.'...\n")
    assert server.requests != []
    seen = len(server.requests)
    err = await act.fails("clone", allowing(f"127.0.0.1:{server.port + 1}"), url=url)
    assert err.message == UNREACHABLE and len(server.requests) == seen
    err = await act.fails("clone", allowing("10.0.0.0/8", "git.internal"), url=url)
    assert err.message == UNREACHABLE and len(server.requests) == seen


async def test_open_and_closed_ports_give_the_same_error(
    act: Action, server: GitServer, closed_port: int, tmp_path: Path
) -> None:
    """Even on an allow-listed host, the error does not tell a closed port from an open one
    that is not git (a plain HTTP server, a line protocol) or a repository that is not there."""
    with not_http() as other:
        creds = allowing("127.0.0.1")
        urls = [
            f"http://127.0.0.1:{closed_port}/repo.git",
            f"http://127.0.0.1:{other}/repo.git",
            server.url("missing.git"),
            f"https://127.0.0.1:{server.port}/repo.git",  # TLS to a plain HTTP server
        ]
        errors = set()
        for url in urls:
            err = await act.fails("clone", creds, url=url)
            errors.add((err.code, err.message, repr(err.details)))
    assert errors == {(ErrorCode.EXECUTION_FAILED, UNREACHABLE, "{}")}


@contextlib.contextmanager
def not_http() -> Iterator[int]:
    """A server on 127.0.0.1 that answers every connection with a line that is not HTTP (as a
    NATS server or an SMTP server would) and hangs up; yields its port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b'INFO {"server_name":"not-git"}\r\n')

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        thread.join(5)


async def test_the_resolved_address_is_pinned(act: Action, server: GitServer) -> None:
    """git connects to the address the executor checked: a name that no real DNS knows works
    (git asked no DNS), and a second answer of the name (rebinding) changes nothing."""
    port = server.port
    dns = Resolver({"git.quill.test": [["127.0.0.1"], ["10.0.0.1"], ["169.254.169.254"]]})
    creds = allowing("127.0.0.1", resolver=dns)
    result = await act("clone", creds, url=f"http://git.quill.test:{port}/repo.git")
    assert result.branch == "main"
    assert dns.queries == ["git.quill.test"]  # once: git itself never resolved it
    # The next action asks again, gets an internal address, and is refused.
    err = await act.fails("clone", creds, url=f"http://git.quill.test:{port}/repo.git")
    assert (err.code, err.message) == (ErrorCode.EXECUTION_FAILED, UNREACHABLE)
    assert dns.queries == ["git.quill.test"] * 2
    # Allowed by name: whatever it resolves to.
    named = allowing("git.quill.test", resolver=Resolver({"git.quill.test": [["127.0.0.1"]]}))
    assert (await act("clone", named, url=f"http://git.quill.test:{port}/repo.git")).branch


async def test_names_resolving_inside_are_refused_like_the_rest(
    act: Action, server: GitServer
) -> None:
    port = server.port
    dns = Resolver(
        {
            "loop.quill.test": [["127.0.0.1"]],
            "meta.quill.test": [["169.254.169.254"]],
            "lan.quill.test": [["10.0.0.1", "192.168.0.7"]],
            "v6.quill.test": [["::1", "fd00:ec2::254", "fe80::1%2"]],
            "mapped.quill.test": [["::ffff:127.0.0.1"]],
            "odd.quill.test": [["not-an-address"]],
        }
    )
    creds = Credentials(targets=Targets(resolver=dns))
    seen = len(server.requests)
    messages = set()
    for name in [*dns.answers, "nxdomain.quill.test"]:
        err = await act.fails("clone", creds, url=f"http://{name}:{port}/repo.git")
        messages.add((err.code, err.message))
    assert messages == {(ErrorCode.EXECUTION_FAILED, UNREACHABLE)}
    assert len(server.requests) == seen
    for bad in ("2130706433", "0x7f000001", "127.1", "0177.0.0.1"):  # numeric names
        err = await act.fails("clone", creds, url=f"http://{bad}:{port}/repo.git")
        assert err.code == ErrorCode.INVALID_ARGUMENT, bad
    assert dns.queries == [*dns.answers, "nxdomain.quill.test"]
    assert len(server.requests) == seen


async def test_push_and_pull_are_held_to_the_same_rule(
    act: Action, server: GitServer, tmp_path: Path, run: Runner
) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    cred = Credential(host=server.host, protocol="http", token_file=token)
    allowed = Credentials((cred,)).allowing(["127.0.0.1"])
    ws = tmp_path / "pushing"
    ws.mkdir()
    await act("clone", allowed, ws=ws, url=server.url("repo.git"))
    (ws / "new.txt").write_text("new\n")
    await act("commit", allowed, ws=ws, message="new")
    seen = len(server.requests)
    for action in ("push", "pull"):
        err = await act.fails(action, Credentials((cred,)), ws=ws)
        assert (err.code, err.message) == (ErrorCode.EXECUTION_FAILED, UNREACHABLE), action
    assert len(server.requests) == seen
    out = await run(ws, Spawn(argv=["git", "remote", "set-url", "origin", "http://10.0.0.1/r"]))
    assert out.exit_code == 0
    err = await act.fails("pull", allowed, ws=ws)
    assert err.message == UNREACHABLE
    out = await run(ws, Spawn(argv=["git", "remote", "set-url", "origin", server.url("repo.git")]))
    assert out.exit_code == 0
    assert (await act("push", allowed, ws=ws)).branch == "main"
    assert len(server.requests) > seen


def test_the_address_rules() -> None:
    import ipaddress

    public = ("8.8.8.8", "140.82.112.3", "2606:4700::1111", "2002:808:808::1")
    for text in public:
        assert is_public(ipaddress.ip_address(text)), text
    for url in NOT_LOOPBACK + loopback_urls(1, 2):
        host = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            continue  # a name
        assert not is_public(address), host
    assert str(Allowed.parse("[FD00::1]:443")) == "[fd00::1/128]:443"
    assert Allowed.parse("git.internal:8443") == Allowed(name="git.internal", port=8443)
    for bad in ("", "a b", "git.internal:0", "git.internal:x", "[fd00::1", "127.1", "x:1:2:"):
        with pytest.raises(ValueError):
            Allowed.parse(bad)
