"""What ``quill up`` and ``quill cluster up`` share: children, readiness, supervision.

A ``Launcher`` starts its children (each its own process, logging to ``<data>/logs/``), waits
until every service process answers its ping and the gateway its ``GET /health``, restarts a
child that dies, with a backoff and never giving up, while the others serve on
(``quill_cli.supervisor``), records the URLs and each process in ``<data>/stack.json`` and
prints the ready line; SIGINT/SIGTERM stops everything. Children get SIGTERM if the launcher is
killed (``PR_SET_PDEATHSIG``). ``quill_cli.stack.Stack`` and ``quill_cli.cluster.Cluster`` say
what to start.

Longer than most modules because the life cycle is one piece: the children, their readiness,
their supervision and their record in ``stack.json`` change together; the ports it picks are
``quill_cli.ports``.

Every service process serves Prometheus metrics on a loopback port of its own
(``--metrics-port``: the ``metrics_port`` given and the next ones, or free ports), which it
keeps across restarts; so does the launcher. ``stack.json``'s ``processes`` names each
process: ``name``, ``role``, ``pid`` and ``metrics`` URL (None for a NATS server), rewritten
(whole, by a rename) each time a process starts again with a new pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from infra import bus, private
from infra.runtime import METRICS_HOST, MetricsServer, lock_directory, serve_metrics
from quill.connection import STACK_FILE
from quill.credentials import NatsAuth
from quill_cli.natsserver import terminate
from quill_cli.ports import Ports, http_ok, port_busy
from quill_cli.serverlog import ServerLog, pump
from quill_cli.supervisor import Backoff, Supervisor

log = logging.getLogger("quill_cli.launcher")


LAUNCHER = "launcher"
"""The launcher's own name and role in ``stack.json``'s ``processes``."""

GITIGNORE = "# Written by quill: the data of a Quill stack, never to commit.\n*\n"


def _ignore_in_git(data_dir: Path) -> None:
    """Make git ignore the data directory (``.quill/``, ``.quill-cluster/``...), as a venv
    does: a ``.gitignore`` of ``*`` in it, unless it has one."""
    with contextlib.suppress(OSError):
        with (data_dir / ".gitignore").open("x") as out:
            out.write(GITIGNORE)


def _die_with_parent() -> None:
    """In a child: get SIGTERM when the parent dies (Linux ``PR_SET_PDEATHSIG``)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


@dataclass
class Child:
    """One process a launcher runs: a service, or a NATS server of a cluster."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    """The child's whole environment (None: this process's)."""
    ping: str | None = None
    """The service it answers pings as (``ws.sys.ping.<ping>``); None: it answers none."""
    wanted: bool = True
    """False while stopped on purpose: the supervisor leaves it down."""
    metrics_port: int | None = None
    """Where it serves Prometheus metrics on loopback (None: it serves none)."""
    on_start: Callable[[Child], None] | None = None
    """Called once it has started (a new pid)."""
    pumped: bool = False
    """Its output read by the launcher into ``log_path`` (``quill_cli.serverlog``: rate-limited,
    rotated, capped, 0600; a NATS server's), not written to it by the child itself."""
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None
    _pump: threading.Thread | None = None

    @property
    def role(self) -> str:
        """``nats``, or the service it runs (``writer``, ``reader``, ``executor``,
        ``gateway``)."""
        return self.ping or "nats"

    @property
    def metrics_url(self) -> str | None:
        if self.metrics_port is None:
            return None
        return f"http://{METRICS_HOST}:{self.metrics_port}/metrics"

    def describe(self) -> dict[str, Any]:
        """Its entry in ``stack.json``'s ``processes``."""
        return {"name": self.name, "role": self.role, "pid": self.pid, "metrics": self.metrics_url}

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._close_log()
        if not self.pumped:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE if self.pumped else self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            env=self.env,
        )
        if self.pumped:
            assert self.process.stdout is not None
            out = ServerLog(self.log_path)
            self._pump = threading.Thread(target=pump, args=(self.process.stdout, out))
            self._pump.daemon = True
            self._pump.start()
        if self.on_start is not None:
            self.on_start(self)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def exit_code(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM; SIGKILL if it has not exited within ``timeout``."""
        if self.process is not None:
            terminate(self.process, timeout)
        self._close_log()

    def kill(self) -> None:
        """SIGKILL (``kill -9``): no chance to flush or hand anything over."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._pump is not None:  # its child has exited: the pipe ends
            self._pump.join(5)
            self._pump = None
            if self.process is not None and self.process.stdout is not None:
                self.process.stdout.close()


@contextlib.contextmanager
def _lock(data_dir: Path) -> Iterator[None]:
    try:
        handle = lock_directory(data_dir, "another quill up or cluster up")
    except RuntimeError as exc:
        raise SystemExit(f"quill: {exc}") from None
    with handle:
        yield


async def ping_until_answered(
    nc: NATS, children: list[Child], deadline: float, root: str = "ws"
) -> dict[int, dict[str, Any]]:
    """Ping each child's service until that very process (its pid) has answered; the answers
    by pid.

    Raises:
        RuntimeError: a child exited, or one had not answered by ``deadline`` (monotonic).
    """
    answers: dict[int, dict[str, Any]] = {}

    async def collect(msg: Msg) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            body = json.loads(msg.data)
            answers[int(body["pid"])] = body

    sub = await nc.subscribe(inbox := nc.new_inbox(), cb=collect)
    try:
        while waiting := [c for c in children if c.pid not in answers]:
            for child in waiting:
                if not child.alive():
                    raise RuntimeError(f"{child.name} exited; see {child.log_path}")
            if time.monotonic() > deadline:
                late = waiting[0]
                raise RuntimeError(f"{late.name} did not answer; see {late.log_path}")
            for service in sorted({c.ping for c in waiting if c.ping}):
                await nc.publish(f"{root}.sys.ping.{service}", b"", reply=inbox)
            await asyncio.sleep(0.1)
        return answers
    finally:
        await sub.unsubscribe()


class Launcher:
    """Runs children, waits until they answer, restarts those that die (``restart``), and
    stops everything; as a command (``run``) or from a program (``async with``, or
    ``await start()`` / ``await stop()``). Subclasses start NATS and make the children in
    ``_launch`` and stop NATS in ``_shutdown``.

    One child: ``kill(name)`` (SIGKILL: a crash, which the supervisor answers with a restart
    when ``restart``), ``stop(name)`` (SIGTERM; it stays down), ``start(name)``,
    ``restart(name)``; these two wait until it answers again.
    """

    root = "ws"
    """The subjects' root (``<root>.sys.ping.*``)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        http_port: int,
        log_level: str = "info",
        restart: bool = True,
        auth: NatsAuth | None = None,
        metrics_port: int = 0,
    ) -> None:
        """``metrics_port``: the first process's metrics port, the others take the next ones
        in the order of ``processes`` (the launcher's last); 0: free ports."""
        self.data_dir = data_dir.resolve()
        self.ports = Ports()
        self.metrics_first = metrics_port
        self.metrics_ports: dict[str, int] = {}
        """Each service's metrics port, and the launcher's (``plan_metrics``)."""
        self.http_port = http_port
        self.log_level = log_level
        self.restart_children = restart
        self.system = auth
        self.children: list[Child] = []
        self.say: Callable[[str], None] = log.warning
        """Where the supervisor's lines go (``run``: this process's output)."""
        self.supervisor: Supervisor | None = None
        """While ``restart`` and started: what it knows of each child (``watches``)."""
        self._guard = asyncio.Lock()
        self._record: Path | None = None
        """``stack.json`` while ``run`` has written it (rewritten when a pid changes)."""
        self._recording = threading.Lock()
        self._metrics: MetricsServer | None = None
        """The launcher's own metrics, while ``run`` serves them."""

    # ---------------------------------------------------------------- what subclasses say
    @property
    def nats_url(self) -> str:
        """The NATS URL(s) clients use (comma-separated for a cluster)."""
        raise NotImplementedError

    async def _launch(self) -> None:
        raise NotImplementedError

    async def _shutdown(self) -> None:
        """Stop NATS (the children are stopped already)."""

    async def _wait_more(self, nc: NATS, children: list[Child], deadline: float) -> None:
        """Readiness beyond the pings (a cluster: its NATS servers, the partitions)."""

    def plan_metrics(self, names: list[str]) -> None:
        """Pick the metrics ports of the services ``names`` and of the launcher (last).

        Raises:
            RuntimeError: with a first port given, one of them is in use.
        """
        others = self.ports.taken | {self.http_port}  # NATS's ports, the gateway's HTTP port
        for index, name in enumerate([*names, LAUNCHER]):
            self.metrics_ports[name] = self.ports.pick(self.metrics_first, index)
        if not self.metrics_first:
            return
        for name, port in self.metrics_ports.items():
            if port > 65535 or port in others:
                why = "past 65535" if port > 65535 else "another port of this stack"
                raise RuntimeError(
                    f"port {port} ({name}'s metrics port) is {why}: choose another "
                    "--metrics-port (0: free ports)"
                )
        for name, port in self.metrics_ports.items():
            if port_busy(port):
                raise RuntimeError(
                    f"port {port} ({name}'s metrics port) is in use on {METRICS_HOST}: stop "
                    "what holds it, or choose another with --metrics-port (0: free ports)"
                )

    def metrics_args(self, name: str) -> list[str]:
        """``--metrics-port N`` for the service ``name`` (``plan_metrics``)."""
        return ["--metrics-port", str(self.metrics_ports[name])]

    # ---------------------------------------------------------------- life cycle
    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def argv(self, *args: str) -> list[str]:
        """``python -m quill --log-level L args…``."""
        return [sys.executable, "-m", "quill", "--log-level", self.log_level, *args]

    def child(self, name: str) -> Child:
        """Raises: KeyError: no child has that name."""
        for child in self.children:
            if child.name == name:
                return child
        names = ", ".join(c.name for c in self.children)
        raise KeyError(f"no process {name!r} (there are: {names})")

    async def start(self, name: str | None = None) -> None:
        """Start everything (or the one child ``name``, if it is not running) and wait until
        it answers; then supervise, when ``restart``.

        Raises:
            RuntimeError: something did not start or did not answer (see its log), or
                ``$QUILL_RESTART_BACKOFF`` is malformed.
            KeyError: no child is called ``name``.
        """
        if name is not None:
            child = self.child(name)
            async with self._guard:
                child.wanted = True
                if not child.alive():
                    await asyncio.to_thread(child.start)
            await self.wait_ready(name)
            return
        try:
            backoff = Backoff.from_env()
        except ValueError as exc:
            raise RuntimeError(str(exc)) from None
        try:
            await self._launch()
            await self.wait_ready()
            if self.restart_children:
                await self._supervise(backoff)
        except BaseException:
            await self.stop()
            raise

    async def _supervise(self, backoff: Backoff) -> None:
        supervisor = Supervisor(
            lambda: self.children,
            self._guard,
            self.nats_url,
            self.system,
            self.root,
            lambda line: self.say(line),
            backoff,
        )
        await supervisor.open()
        self.supervisor = supervisor

    async def stop(self, name: str | None = None) -> None:
        """Stop everything: the services (at once), then the NATS servers (or the one child
        ``name``, which stays down until ``start(name)``): SIGTERM, SIGKILL after 15 s."""
        if name is not None:
            child = self.child(name)
            async with self._guard:
                child.wanted = False
                await asyncio.to_thread(child.stop)
            return
        if self.supervisor is not None:
            await self.supervisor.close()
            self.supervisor = None
        services = [c for c in self.children if c.ping]
        for group in (services, [c for c in self.children if not c.ping]):
            await asyncio.gather(*(asyncio.to_thread(child.stop) for child in group))
        await self._shutdown()

    async def kill(self, name: str) -> None:
        """``kill -9`` one child (the supervisor restarts it when ``restart``)."""
        child = self.child(name)
        async with self._guard:
            await asyncio.to_thread(child.kill)

    async def restart(self, name: str) -> None:
        """Stop one child (SIGTERM) and start it again; wait until it answers."""
        child = self.child(name)
        async with self._guard:
            await asyncio.to_thread(child.stop)
            child.wanted = True
            await asyncio.to_thread(child.start)
        await self.wait_ready(name)

    async def __aenter__(self) -> Launcher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_ready(self, *names: str, timeout: float = 30.0) -> None:
        """Wait until the named children (default: every one that should run) answer: each
        service process its ping, the gateway ``/health``.

        Raises:
            RuntimeError: one exited, or had not answered within ``timeout`` seconds.
        """
        children = [self.child(n) for n in names] or [c for c in self.children if c.wanted]
        deadline = time.monotonic() + timeout
        nc = await bus.connect(self.nats_url, "quill-up", wait_s=timeout, auth=self.system)
        try:
            await self._wait_more(nc, children, deadline)
            await ping_until_answered(nc, [c for c in children if c.ping], deadline, self.root)
        finally:
            await nc.close()
        if any(c.ping == "gateway" for c in children):
            while not await http_ok("127.0.0.1", self.http_port, "/health"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the gateway's /health did not answer on {self.http_url}")
                await asyncio.sleep(0.1)

    def processes(self) -> list[dict[str, Any]]:
        """Each process (``name``, ``role``, ``pid``, ``metrics`` URL), the launcher last."""
        served = self._metrics
        me = {
            "name": LAUNCHER,
            "role": LAUNCHER,
            "pid": os.getpid(),
            "metrics": None if served is None else served.url,
        }
        return [*(child.describe() for child in self.children), me]

    def record(self) -> dict[str, Any]:
        """What ``<data>/stack.json`` says (clients find NATS there; tooling the processes)."""
        return {
            "nats_url": self.nats_url,
            "http_url": self.http_url,
            "pid": os.getpid(),
            "data": str(self.data_dir),
            "processes": self.processes(),
        }

    def _write_record(self, *_: object) -> None:
        """(Re)write ``stack.json`` whole: a reader sees the old file or the new one."""
        with self._recording:
            if self._record is None:
                return
            fresh = self._record.with_suffix(".json.new")
            fresh.write_text(json.dumps(self.record()))
            os.replace(fresh, self._record)

    def metrics_line(self) -> str:
        """``metrics: writer=http://127.0.0.1:9101/metrics reader=…``: each process's address,
        as ``stack.json`` records it (one line: the line after the ready line)."""
        urls = (
            f"{name}=http://{METRICS_HOST}:{port}/metrics"
            for name, port in self.metrics_ports.items()
        )
        return "metrics: " + " ".join(urls)

    async def run(self) -> int:
        """The command: start, record, print the ready line, run until SIGINT/SIGTERM, stop;
        a line for each child that exits and is restarted, and for each that is back. Returns
        0 (a child that keeps exiting is restarted, with a backoff, for as long as it runs).

        Raises:
            RuntimeError: something did not start (see its log).
            SystemExit: the data directory is in use by another launcher.
        """
        private.umask("launcher")  # its children's too (the executor sets its own)
        private.tighten_logged(self.data_dir, "quill")  # what an earlier version left readable
        with _lock(self.data_dir):
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            record = self.data_dir / STACK_FILE
            self.say = lambda line: print(line, flush=True)
            _ignore_in_git(self.data_dir)
            try:
                await self.start()
                self._metrics = serve_metrics(self.metrics_ports.get(LAUNCHER))
                self._record = record
                self._write_record()
                for child in self.children:  # a new pid (a restart): stack.json says so
                    child.on_start = self._write_record
                print(
                    f"quill ready nats={self.nats_url} http={self.http_url} data={self.data_dir}",
                    flush=True,
                )
                print(self.metrics_line(), flush=True)
                print(f"console: {self.http_url}/ui/ (open it in a browser)", flush=True)
                await stop.wait()
                return 0
            finally:
                with self._recording:
                    self._record = None
                    record.unlink(missing_ok=True)
                if self._metrics is not None:
                    self._metrics.close()
                    self._metrics = None
                await self.stop()
                print(f"quill stopped: data={self.data_dir}", flush=True)
