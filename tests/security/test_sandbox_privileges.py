"""Issue 28, item 2: nothing outside ``/workspace`` and the sandbox's own ``/tmp`` is writable or
privileged for a command.

Before, the sandbox's uid 0 was the host's root and the command kept CAP_DAC_OVERRIDE and
CAP_FOWNER in its user namespace, which hold over every file whose owner is mapped there: a
command set the host's ``/dev/full`` to 0600 (any tenant could ``chmod 000 /dev/null``
host-wide), changed the mode of ``/proc/execdomains`` for every later sandbox, and read the
root-only ``/proc/slabinfo``. It could ptrace, signal and write into the file descriptors of
the shim that reports its result (its uid was the command's), and add kernel keys that every
other sandbox saw in ``/proc/keys`` (one host uid for all of them). Now the command has no
capability, the shim is the sandbox's root (another unprivileged host uid), the host's root
is no one the command can be or act as, kernel-global ``/proc`` entries are read-only, and
``add_key``, ``request_key`` and ``keyctl`` fail (``infra/exec/sandbox/users.py``,
``seccomp.py``). The checkout is the command's: the executor gives it what it writes there.

Every probe is harmless on the host even where it succeeds (a mode set to the one it has, a
trace attached and dropped). Real bwrap sandboxes, a real nats-server, the writer, a reader and
an executor in this process; commands through the client, as an agent sends them.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio

from infra.exec import sandbox
from quill.client import Quill, Workspace
from services.executor.app import Executor, ExecutorConfig
from tests.helpers import Gate, start_executor, start_writer_and_reader
from tests.security.conftest import Canaries

WHY_NO_BWRAP = sandbox.probe_bwrap()
pytestmark = pytest.mark.skipif(WHY_NO_BWRAP is not None, reason=f"bwrap: {WHY_NO_BWRAP}")
ROOT = os.geteuid() == 0
StartExecutor = Callable[[AsyncExitStack], Awaitable[Executor]]

PROBE = r"""
import ctypes, json, os, stat
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
out = {}

def error():
    return os.strerror(ctypes.get_errno())

def chmod_same(path):
    try:
        os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode), follow_symlinks=False)
        return "allowed"
    except (OSError, NotImplementedError) as e:
        return getattr(e, "strerror", None) or str(e)

for path in ("/dev/full", "/dev/null", "/proc/execdomains"):
    out["chmod " + path] = chmod_same(path)
try:
    open("/proc/slabinfo").read(1)
    out["read /proc/slabinfo"] = "allowed"
except OSError as e:
    out["read /proc/slabinfo"] = e.strerror
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
for key in ("Uid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
    out[key] = status[key].split()

shim = os.getppid()  # bash -c runs python3 in its own process: its parent reports the result
out["parent"] = open(f"/proc/{shim}/cmdline", "rb").read().split(b"\0")[3].decode()
out["ptrace shim"] = "allowed" if libc.ptrace(0x4206, shim, None, None) == 0 else error()
try:
    os.kill(shim, 0)
    out["signal shim"] = "allowed"
except OSError as e:
    out["signal shim"] = e.strerror
try:
    fds = [n for n in os.listdir(f"/proc/{shim}/fd") if int(n) > 2]
    for n in fds:
        os.close(os.open(f"/proc/{shim}/fd/{n}", os.O_WRONLY | os.O_NONBLOCK))
    out["shim fds"] = "allowed"
except OSError as e:
    out["shim fds"] = e.strerror

nr = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}[os.uname().machine]
key = libc.syscall(nr[0], b"user", b"quill-probe", b"x", ctypes.c_size_t(1), ctypes.c_int(-4))
out["add_key"] = "allowed" if key >= 0 else error()
found = libc.syscall(nr[1], b"user", b"quill-none", None, ctypes.c_int(0))
out["request_key"] = "allowed" if found >= 0 else error()
ring = libc.syscall(nr[2], ctypes.c_int(0), ctypes.c_int(-4), ctypes.c_int(1))
out["keyctl"] = "allowed" if ring >= 0 else error()

# everything outside /workspace and /tmp: nothing writable but device nodes, nothing whose
# mode can be set (to the one it has: the probe changes nothing where it is allowed)
skip = {"/workspace", "/tmp", "/dev/shm", "/proc/self", "/proc/thread-self", "/usr"}
bad, stack = [], ["/"]
while stack:
    top = stack.pop()
    try:
        names = os.listdir(top)
    except OSError:
        continue
    for name in names:
        path = os.path.join(top, name)
        if path in skip or (top == "/proc" and name.isdigit()):
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            continue
        if not stat.S_ISCHR(st.st_mode) and os.access(path, os.W_OK, effective_ids=True):
            bad.append("writable " + path)
        if chmod_same(path) == "allowed":
            bad.append("chmod " + path)
        if stat.S_ISDIR(st.st_mode):
            stack.append(path)
out["outside"] = bad
print(json.dumps(out))
"""
"""What a command may do outside its checkout: a JSON object of what was allowed."""

ADD_KEY = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
add_key = {"x86_64": 248, "aarch64": 217}[os.uname().machine]
name = os.environ["NAME"].encode()
key = libc.syscall(add_key, b"user", name, b"secret", ctypes.c_size_t(6), ctypes.c_int(-4))
print("added" if key >= 0 else "refused: " + os.strerror(ctypes.get_errno()), flush=True)
"""
"""Adds a key (``$NAME``) to the command's user keyring; says whether it could."""


@pytest_asyncio.fixture
async def services(nats_url: str, tmp_path: Path) -> AsyncIterator[tuple[Quill, StartExecutor]]:
    """A writer, a reader, a client that does not retry, and a function starting a bwrap
    executor (on the same data directory each time) until the given stack closes."""
    async with AsyncExitStack() as es:
        await start_writer_and_reader(es, nats_url, tmp_path)
        quill = await Quill.connect(nats_url, retries=0)
        es.push_async_callback(quill.close)

        async def executor(stack: AsyncExitStack) -> Executor:
            config = ExecutorConfig(sandbox="bwrap")
            return await start_executor(stack, nats_url, tmp_path / "executor", config)

        yield quill, executor


@pytest_asyncio.fixture
async def stack(
    services: tuple[Quill, StartExecutor],
) -> AsyncIterator[tuple[Quill, Executor]]:
    """The services and one executor."""
    quill, start = services
    async with AsyncExitStack() as es:
        yield quill, await start(es)


async def workspace(quill: Quill, name: str) -> Workspace:
    ws = quill.workspace(name)
    await ws.create()
    await ws.write("a.txt", "kept\n")
    return ws


async def probe(ws: Workspace) -> dict[str, object]:
    result = await ws.exec('python3 -c "$PROBE"', env={"PROBE": PROBE}, timeout_ms=60_000)
    assert result.exit_code == 0, result.stderr
    found: dict[str, object] = json.loads(result.stdout)
    return found


def modes(*paths: str) -> dict[str, int]:
    return {path: os.stat(path).st_mode for path in paths}


async def test_a_command_changes_no_host_device_or_kernel_file(
    stack: tuple[Quill, Executor], canaries: Canaries
) -> None:
    quill, _ = stack
    host = ("/dev/full", "/dev/null", "/proc/execdomains", "/proc/slabinfo")
    before = modes(*host)
    found = await probe(await workspace(quill, "acme/privileges"))
    refused = ("Operation not permitted", "Read-only file system")
    for path in ("/dev/full", "/dev/null", "/proc/execdomains"):  # before: "allowed"
        assert found[f"chmod {path}"] in refused, found
    assert found["read /proc/slabinfo"] == "Permission denied", found  # before: "allowed"
    assert found["outside"] == [], found["outside"]  # before: /dev, 60 files of /proc...
    none = ["0000000000000000"]
    caps = {key: found[key] for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    assert caps == dict.fromkeys(caps, none)  # before: DAC_OVERRIDE and FOWNER (0xa)
    assert found["Uid"] == [str(sandbox.SANDBOX_UID)] * 4
    assert modes(*host) == before


async def test_the_shim_that_reports_a_command_is_out_of_its_reach(
    stack: tuple[Quill, Executor], canaries: Canaries
) -> None:
    if not ROOT:  # one host uid for the whole sandbox: docs/executor.md says what follows
        print("not root: bwrap's usual map gives the shim the command's uid")
        pytest.skip("not root: bwrap's usual map gives the shim the command's uid")
    quill, _ = stack
    found = await probe(await workspace(quill, "acme/shim"))
    assert found["parent"] == "quill", found  # it probed the shim (bash -c SHIM quill ...)
    assert found["ptrace shim"] == "Operation not permitted", found  # before: "allowed"
    assert found["signal shim"] == "Operation not permitted", found  # before: "allowed"
    assert found["shim fds"] == "Permission denied", found  # before: "allowed"


async def test_no_kernel_key_is_added_and_no_tenant_sees_anothers(
    stack: tuple[Quill, Executor], canaries: Canaries
) -> None:
    quill, executor = stack
    # tenant a's command adds a key and waits; tenant b's, meanwhile, lists /proc/keys
    a, b = await workspace(quill, "acme/keys"), await workspace(quill, "globex/keys")
    name = f"quill-key-{secrets.token_hex(8)}"
    said = asyncio.Event()

    def seen(stream: str, chunk: bytes) -> None:
        if b"added" in chunk or b"refused" in chunk:
            said.set()

    gate = Gate()  # a file made in the checkout is not seen by a command over an overlay
    wait = f'python3 -c "$ADD"; {gate.wait}'
    holding = asyncio.create_task(
        a.exec(wait, env={"ADD": ADD_KEY, "NAME": name}, timeout_ms=60_000, on_output=seen)
    )
    try:
        await asyncio.wait_for(said.wait(), 30)
        listed = await b.exec("cat /proc/keys; echo listed", timeout_ms=60_000)
        assert listed.stdout.endswith("listed\n"), listed.stderr
        assert name not in listed.stdout  # before: tenant a's key, by its name
    finally:
        await gate.open()
        held = await holding
    assert held.stdout == "refused: Operation not permitted\n"  # before: "added"
    found = await probe(await workspace(quill, "acme/keys-probe"))
    for call in ("add_key", "request_key", "keyctl"):  # before: allowed (request_key: ENOKEY)
        assert found[call] == "Operation not permitted", found


async def test_the_checkout_is_the_commands_and_files_are_owned_right_on_the_host(
    services: tuple[Quill, StartExecutor], canaries: Canaries
) -> None:
    quill, start = services
    ws = await workspace(quill, "acme/owned")
    await ws.write("src/lib/b.txt", "b\n")
    async with AsyncExitStack() as es:
        executor = await start(es)
        owner = executor.provider.owner
        if owner is None:
            print("not root: the checkout is the executor's own, as its command's uid is")
            pytest.skip("not root: the checkout is the executor's own, as its command's uid is")
        tree = executor.settings.data_dir / "checkouts" / "acme" / "owned" / "tree"
        command = "echo more >> a.txt && chmod +x src/lib/b.txt && mkdir new && echo n > new/c"
        result = await ws.exec(command)
        assert result.exit_code == 0, result.stderr  # the executor's files are the command's
        assert await ws.read_text("a.txt") == "kept\nmore\n"
        for path in [tree, *tree.rglob("*")]:  # before: what the executor wrote was root's
            st = path.lstat()
            assert (st.st_uid, st.st_gid) == owner, path
            assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID)
    # what an older executor left (every file root's) is rebuilt the command's at next use
    for path in [tree, *tree.rglob("*")]:
        os.chown(path, 0, 0)
    async with AsyncExitStack() as es:
        await start(es)
        result = await ws.exec("echo again >> a.txt")
        assert result.exit_code == 0, result.stderr
        assert (tree / "a.txt").stat().st_uid == owner[0]
        assert await ws.read_text("a.txt") == "kept\nmore\nagain\n"
