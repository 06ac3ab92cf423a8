"""Test helpers shared by unit and integration tests (no fixtures here): services started in
process, ``eventually`` (wait for a condition nothing signals), ``Gate``; the pure ones
(``LogBuilder``, ``T0``) are in tests/core/build.py, re-exported here."""

from __future__ import annotations

import asyncio
import http.server
import inspect
import json
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Self, TypeVar, cast

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from contracts.events import WorkspaceUpdated
from contracts.limits import LimitsPatch
from contracts.subjects import Subjects
from infra import bus
from infra.exec.sandbox import probe_bwrap
from infra.runtime import Settings
from infra.store import Store
from quill.client import Quill, Workspace
from quill_cli.natsserver import NatsServer, mappings_config
from services.executor.app import Executor, ExecutorConfig
from services.executor.app import start_executor as start_exec
from services.reader.app import Reader
from services.reader.app import start_reader as run_reader
from services.reader.snapshots import SnapshotConfig
from services.writer.app import Writer
from services.writer.app import start_writer as run_writer
from services.writer.config import WriterConfig
from tests.core.build import T0, LogBuilder

__all__ = [
    "T0",
    "Gate",
    "LogBuilder",
    "Refusals",
    "alive",
    "answers",
    "approvals_pending",
    "describe",
    "eventually",
    "eventually_sync",
    "host_processes",
    "mount_tmpfs",
    "need_bwrap",
    "parked",
    "new_workspace",
    "quill_of",
    "services_see",
    "start_executor",
    "start_reader",
    "start_writer",
    "start_writer_and_reader",
    "start_overlay_stack",
    "small_tree",
    "subscribed",
    "update_from",
    "writer_waiting",
]


T = TypeVar("T")

FIRST_S, MOST_S = 0.001, 0.05
"""``eventually``'s pauses between tries: from 1 ms, doubling, to at most 50 ms (a change is
seen soon after it happens; a condition that asks a server or walks /proc asks 20 times a
second at most)."""


PUT_FILES = """import os
def put(path, text="x"):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    open(path, "w").write(text)
"""
"""The start of a Python script that makes files as a tool would leave them (in a command's
checkout): ``put(path, text="x")`` writes ``text`` at ``path``, making its directories."""


async def eventually(
    condition: Callable[[], T | Awaitable[T]],
    timeout: float = 20.0,
    what: str = "",
    *,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Ask ``condition()`` (sync or async) again and again until it answers something true;
    that answer. For a state of another task, process or server that nothing signals (where
    there is an event, a version or a future to wait on, wait on it instead).

    ``ignoring``: exceptions that mean "not yet" (a server not answering yet); any other
    propagates at once.

    Raises:
        AssertionError: not true within ``timeout`` seconds; it says what was awaited
            (``what``, else the condition's source) and its last answer.
    """
    last: object = None
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            for pause in _pauses():
                try:
                    answer = condition()
                    if inspect.isawaitable(answer):
                        answer = await answer
                except ignoring as exc:
                    last = exc
                else:
                    if answer:
                        return cast(T, answer)
                    last = answer
                await asyncio.sleep(pause)
    except TimeoutError:
        if not scope.expired():
            raise  # the condition's own
    raise AssertionError(_not_within(timeout, what or describe(condition), last))


def eventually_sync(
    condition: Callable[[], T],
    timeout: float = 20.0,
    what: str = "",
    *,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """``eventually`` for a test without an event loop (or a thread of one): the same tries,
    blocking between them.

    Raises:
        AssertionError: not true within ``timeout`` seconds, saying what was awaited.
    """
    last: object = None
    deadline = time.monotonic() + timeout
    for pause in _pauses():
        try:
            answer = condition()
        except ignoring as exc:
            last = exc
        else:
            if answer:
                return answer
            last = answer
        if time.monotonic() >= deadline:
            raise AssertionError(_not_within(timeout, what or describe(condition), last))
        time.sleep(pause)
    raise AssertionError("unreachable")  # _pauses never ends


def _pauses() -> Iterator[float]:
    pause = FIRST_S
    while True:
        yield pause
        pause = min(pause * 2, MOST_S)


def describe(condition: Callable[..., object]) -> str:
    """What a condition checks, for a failure to say: a lambda's line, else the function's
    name and the first line of its docstring."""
    name = getattr(condition, "__qualname__", repr(condition))
    if name.endswith("<lambda>"):
        try:
            return inspect.getsource(condition).strip()
        except (OSError, TypeError):
            return name
    doc = (inspect.getdoc(condition) or "").split("\n", 1)[0]
    return f"{name}: {doc}" if doc else name


def _not_within(timeout: float, what: str, last: object) -> str:
    said = repr(last)
    said = said if len(said) <= 500 else said[:500] + "…"
    return f"not within {timeout:g} s: {what} (last answer: {said})"


@asynccontextmanager
async def writer_on(
    nats_url: str, data: Path, config: WriterConfig | None = None
) -> AsyncIterator[Writer]:
    """A started in-process writer of its own connection and projection (``data/writer.db``),
    stopped and closed on leaving."""
    nc = await bus.connect(nats_url, "writer")
    await bus.ensure_streams(nc, Subjects())
    store = await Store.open(data / "writer.db", role="writer")
    writer = Writer(Settings(nats_url=nats_url, data_dir=data), nc, store, config)
    await writer.start()
    try:
        yield writer
    finally:
        await writer.stop()
        await store.close()
        await nc.close()


async def start_writer(
    stack: AsyncExitStack,
    nats_url: str,
    data: Path,
    config: WriterConfig | None = None,
    *,
    projection_rows: int | None = None,
) -> Writer:
    """Start an in-process writer, ready to answer; ``stack`` stops it. ``config``: its
    options (``quill writer``'s)."""
    settings = Settings(nats_url=nats_url, data_dir=data, projection_rows=projection_rows)
    running = await run_writer(settings, config)
    stack.push_async_callback(running.stop)
    await answers(nats_url, "writer", running.service.instance)
    return running.service


async def start_reader(
    stack: AsyncExitStack,
    nats_url: str,
    data: Path,
    instance: str = "",
    snapshots: SnapshotConfig | None = None,
    *,
    caught_up: bool = True,
    projection_rows: int | None = None,
) -> Reader:
    """Start an in-process reader replica, ready to answer; ``stack`` stops it. ``snapshots``:
    its options (``quill reader``'s). It has caught up with the log when this returns;
    ``caught_up=False``: as soon as it serves (it joins the queue group before, when near the
    log's end: ``services/reader/follower.py``)."""
    settings = Settings(
        nats_url=nats_url, data_dir=data, instance=instance, projection_rows=projection_rows
    )
    running = await run_reader(settings, snapshots)
    stack.push_async_callback(running.stop)
    await answers(nats_url, "reader", running.service.instance)
    await asyncio.wait_for(running.service.serving.wait(), 60)
    if caught_up:
        await asyncio.wait_for(running.service.follower.ready.wait(), 60)
    return running.service


async def start_writer_and_reader(stack: AsyncExitStack, nats_url: str, root: Path) -> None:
    """A writer (data in ``root/writer``) and a reader (``root/reader``), both answering;
    ``stack`` stops them."""
    await start_writer(stack, nats_url, root / "writer")
    await start_reader(stack, nats_url, root / "reader")


async def start_executor(
    stack: AsyncExitStack, nats_url: str, data: Path, config: ExecutorConfig | None = None
) -> Executor:
    """Start an in-process executor, ready to answer; ``stack`` stops it."""
    running = await start_exec(
        Settings(nats_url=nats_url, data_dir=data), config or ExecutorConfig()
    )
    stack.push_async_callback(running.stop)
    await answers(nats_url, "executor", running.service.instance)
    return running.service


async def start_overlay_stack(stack: AsyncExitStack, nats_url: str, root: Path) -> Executor:
    """A writer, a reader and a bwrap executor whose commands run over an overlay (the test
    skipped, saying why, where bwrap cannot run); ``stack`` stops them."""
    need_bwrap()
    await start_writer_and_reader(stack, nats_url, root)
    config = ExecutorConfig(sandbox="bwrap")
    running = await start_executor(stack, nats_url, root / "executor", config)
    assert running.provider.overlays, running.provider.no_overlays
    return running


async def answers(nats_url: str, service: str, instance: str, timeout: float = 10.0) -> None:
    """Wait until ``instance`` answers a ping from another connection, as ``quill up`` does."""
    nc = await bus.connect(nats_url, "test-readiness")
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)  # every instance's answer (a request would take the first)

    async def ours() -> bool:
        await nc.publish(f"ws.sys.ping.{service}", b"", reply=inbox)
        msg = await sub.next_msg(timeout=0.5)
        # empty: the server's "no responders" (not subscribed yet)
        return bool(msg.data) and json.loads(msg.data)["instance"] == instance

    try:
        await eventually(
            ours, timeout, f"{service} {instance} answers", ignoring=(nats.errors.TimeoutError,)
        )
    finally:
        await nc.close()


async def new_workspace(
    services: Callable[[str], Awaitable[object]],
    client: Quill,
    name: str,
    reader: str = "r1",
    *,
    limits: LimitsPatch | None = None,
) -> Workspace:
    """A reader replica started (``services``: the root fixture, a writer already running) and
    workspace ``name`` created by ``client`` (with ``limits``): how most in-process tests
    begin."""
    await services(reader)
    ws = client.workspace(name)
    await ws.create(limits=limits)
    return ws


def quill_of(ws: Workspace) -> Quill:
    """The SDK client ``ws`` was taken from (``agent_and_human``'s agent: to fork, or to set
    how long it waits)."""
    client = ws.client
    assert isinstance(client, Quill)
    return client


async def agent_and_human(
    stack: AsyncExitStack,
    nats_url: str,
    name: str,
    *,
    session: str | None = "s-1",
    human_session: str | None = None,
    human_timeout: float = 10.0,
) -> tuple[Workspace, Workspace]:
    """Workspace ``name`` as seen by an agent (actor ``agent-7``, ``session``, no retries) and
    by a human who decides its approvals (``alice``, ``human_session``): ``(the agent's, the
    human's)``, both clients closed with ``stack``. Nothing is created."""
    agent = await Quill.connect(nats_url, actor="agent-7", session=session, retries=0)
    human = await Quill.connect(
        nats_url, actor="alice", session=human_session, timeout=human_timeout
    )
    stack.push_async_callback(agent.close)
    stack.push_async_callback(human.close)
    return agent.workspace(name), human.workspace(name)


async def restricted_for_commands(
    stack: AsyncExitStack,
    nats_url: str,
    name: str,
    *,
    limits: LimitsPatch | None = None,
    human_timeout: float = 10.0,
) -> tuple[Workspace, Workspace]:
    """Workspace ``name`` created by the agent of ``agent_and_human`` (session ``s-1``) and
    made restricted, commands offered, by its human: ``(the agent's, the human's)``, both
    clients closed with ``stack``."""
    ws, desk = await agent_and_human(stack, nats_url, name, human_timeout=human_timeout)
    await ws.create(limits=limits)
    await desk.set_trust("restricted", commands=True)
    return ws, desk


async def approvals_pending(ws: Workspace, count: int = 1, timeout: float = 20.0) -> list[str]:
    """The ids of ``ws``'s pending approvals, once there are ``count`` (a request parked
    meanwhile: nothing tells another client)."""

    async def listed() -> list[str] | None:
        found = (await ws.approvals()).pending
        return [a.approval_id for a in found] if len(found) == count else None

    what = f"{count} approvals pending on {ws.tenant}/{ws.name}"
    return await eventually(listed, timeout, what)


async def writer_waiting(nc: NATS, count: int, timeout: float = 20.0) -> None:
    """Until the writer holds ``count`` commands back (for a lock or an approval): its ping
    says so."""

    async def holds() -> bool:
        pong = json.loads((await nc.request("ws.sys.ping.writer", b"", timeout=5)).data)
        return bool(pong["waiting"] == count)

    await eventually(holds, timeout, f"the writer holds {count} commands back")


async def subscribed(nc: NATS, subject: str, timeout: float = 20.0) -> None:
    """Until ``nc`` holds a subscription to ``subject`` that the server has too: one another
    task makes (a ``watch`` running in a task), confirmed by a flush (the server answers the
    PING after it has the SUB before it)."""
    await eventually(
        lambda: any(s.subject == subject for s in nc._subs.values()),
        timeout,
        f"a subscription to {subject}",
    )
    await nc.flush()


async def update_from(updates: AsyncIterator[WorkspaceUpdated], version: int) -> WorkspaceUpdated:
    """The first of a ``watch``'s ``updates`` at ``version`` or later: an earlier one may come
    first (the writer publishes an update after it answered, so a watch started at once may
    still see the previous command's)."""
    while (update := await anext(updates)).version < version:
        continue
    return update


async def services_see(
    nc: NATS,
    claims: int,
    services: tuple[str, ...] = ("writer", "reader", "executor"),
    timeout: float = 20.0,
) -> None:
    """Wait until each of ``services`` reports ``claims`` live bridge claims
    (``local_workspaces`` in its ping): they learn claims by watching the bucket."""

    async def sees(service: str) -> bool:
        pong = await nc.request(f"ws.sys.ping.{service}", b"", timeout=2)
        return bool(json.loads(pong.data)["local_workspaces"] == claims)

    for service in services:
        await eventually(partial(sees, service), timeout, f"the {service} sees {claims} claims")


class Watch:
    """A daemon thread running ``watch`` while a ``with`` block runs (what it sees kept on
    the instance); at the block's end ``stop`` is set and the thread joined."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self.watch, daemon=True)

    def watch(self) -> None:
        """Look until ``stop`` is set (a subclass's own)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(10)


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A test server's request handler: logs nothing; ``answer`` sends a whole reply."""

    def answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def http_server(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[int]:
    """``handler`` serving HTTP on a loopback port (a thread) until the block ends; the port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


class Gate:
    """What lets a running command go on, whatever its sandbox: the command waits in a
    ``sleep`` of its own (``wait``, a shell snippet), which ``open`` ends. A file the test makes
    in the checkout would not do: a command over an overlay does not see its tree change
    (``infra.exec.layers``)."""

    def __init__(self) -> None:
        self.arg = f"86400.{secrets.randbelow(10**9):09d}"
        self.wait = f"sleep {self.arg} || :"

    def waiting(self) -> list[int]:
        """The pids of the sleeps the command waits in."""
        wanted = b"sleep\0" + self.arg.encode() + b"\0"
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/cmdline", "rb") as f:
                        if f.read() == wanted:
                            found.append(int(name))
                except OSError:
                    continue
        return found

    async def open(self, timeout: float = 30.0) -> None:
        """End the command's wait, once it waits (polling /proc: nothing to wait on)."""
        pids = await eventually(self.waiting, timeout, f"a command waiting in {self.wait!r}")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue


def need_bwrap() -> None:
    """Skip the test, saying why, where the bwrap sandbox cannot run."""
    if (why := probe_bwrap()) is not None:
        print(f"skipped: bwrap cannot run here: {why}")
        pytest.skip(f"bwrap cannot run here: {why}")


async def parked(call: Awaitable[object]) -> str:
    """The approval id of the ``APPROVAL_REQUIRED`` that ``call`` is answered with."""
    with pytest.raises(QuillError) as info:
        await call
    assert info.value.code == ErrorCode.APPROVAL_REQUIRED, info.value
    return str(info.value.details["approval_id"])


class Refusals:
    """nats-py's error callback (``error_cb=refusals.on_error``): the permissions violations
    the server reports to a bare client. ``whole``: ``wait`` names whole subjects, not their
    beginnings."""

    def __init__(self, *, whole: bool = False) -> None:
        self.seen: list[str] = []
        self._news = asyncio.Event()
        self._end = '"' if whole else ""

    async def on_error(self, exc: Exception) -> None:
        self.seen.append(str(exc))
        self._news.set()

    async def wait(self, kind: str, subject: str, timeout: float = 10.0) -> None:
        """Until the server has refused ``kind`` ("publish", "subscription") on a subject
        starting with ``subject`` (nats-py reports it in lower case)."""
        needle = f'permissions violation for {kind} to "{subject.lower()}{self._end}'
        try:
            async with asyncio.timeout(timeout):
                while not any(needle in seen for seen in self.seen):
                    self._news.clear()
                    await self._news.wait()
        except TimeoutError:
            raise AssertionError(f"the server did not refuse {kind} to {subject}") from None


def host_processes(token: str) -> list[int]:
    """Host processes whose command line holds ``token``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def mount_tmpfs(path: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` on ``path``; why not, or None."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    return None if done.returncode == 0 else f"mount refused: {done.stderr.strip()}"


def small_tree(root: Path) -> Path:
    """``root`` with a directory ``d`` (``d/x.txt``: "x") and a file ``f.txt`` ("f")."""
    (root / "d").mkdir(parents=True)
    (root / "d/x.txt").write_text("x\n")
    (root / "f.txt").write_text("f\n")
    return root


async def ask(
    nc: NATS, subject: str, body: dict[str, Any], timeout: float = 10
) -> dict[str, Any] | None:
    """The reply to a request, or None when the server refused it (no reply comes)."""
    try:
        msg = await nc.request(subject, json.dumps(body).encode(), timeout=timeout)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return None
    reply: dict[str, Any] = json.loads(msg.data)
    return reply


async def refused(nc: NATS, refusals: Refusals, subject: str, body: dict[str, Any] | bytes) -> None:
    """Send ``body`` as a request on ``subject`` and wait until the server refuses it (the
    permissions violation it reports to ``nc``, whose ``error_cb`` is ``refusals``'): the
    request reached nobody, known as soon as the server says so (not after a timeout)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    await nc.publish(subject, data, reply=nc.new_inbox())
    await nc.flush()
    await refusals.wait("publish", subject)


def error_shape(reply: dict[str, Any] | None, id_: str) -> tuple[str, str]:
    """An error reply's code and message, the id ``id_`` in it blanked (to compare two ids')."""
    assert reply is not None and not reply["ok"], reply
    error = reply["error"]
    return error["code"], error["message"].replace(id_, "ID")


@contextmanager
def partitioned_nats(root: Path, partitions: int) -> Iterator[NatsServer]:
    """A nats-server in ``root`` whose mappings split the command subjects into
    ``partitions`` (as ``quill cluster up``'s), stopped after the block."""
    server = NatsServer(root, extra_config=mappings_config(Subjects(), partitions)).start()
    try:
        yield server
    finally:
        server.stop()


async def tree_items(
    ws: Workspace, version: int, *, contents: bool = False, limit: int = 1000
) -> AsyncIterator[tuple[rp.TreeItem, rp.TreePage]]:
    """Every entry of ``ws``'s tree as of ``version``, with the page it came in (its
    ``contents``), through ``qry.tree`` page after page."""
    after = None
    while True:
        page = await ws.tree(version=version, after=after, contents=contents, limit=limit)
        for item in page.entries:
            yield item, page
        if page.next is None:
            return
        after = page.next
