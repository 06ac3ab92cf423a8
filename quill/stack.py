"""``quill up``: the whole service on one machine.

Starts ``nats-server`` from the wheel (unless given ``--nats-url``), then each service as its
own process (``python -m quill writer …``, the reader, the executor, and the HTTP gateway on
``--http-port``), waits until every one answers a ping and the gateway's ``GET /health``
answers 200, records the URLs in ``<data>/stack.json`` (clients find them there) and prints
one line with ``ready``.
Services that die are restarted; SIGINT/SIGTERM stops everything cleanly. Children get
SIGTERM if this process is killed, and everything they acknowledged is already on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from quill import tenants as tenancy
from quill.natsserver import terminate
from services.common import bus
from services.common.credentials import ENV_NAMES, NatsAuth
from services.common.secrets import ENV_FILE as SECRETS_ENV

log = logging.getLogger("quill.stack")

STACK_FILE = "stack.json"
DEFAULT_DATA = Path(".quill")
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def discover_url() -> str:
    """``QUILL_NATS_URL``, else the ``quill up`` running for this directory, else the default."""
    env = os.environ.get("QUILL_NATS_URL")
    if env:
        return env
    record = Path(os.environ.get("QUILL_DATA", DEFAULT_DATA)) / STACK_FILE
    try:
        info = json.loads(record.read_text())
        os.kill(int(info["pid"]), 0)
        return str(info["nats_url"])
    except (OSError, ValueError, KeyError):
        return DEFAULT_NATS_URL


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (for ``--http-port 0``)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


async def http_ok(host: str, port: int, path: str, timeout: float = 2.0) -> bool:
    """True when ``GET path`` on ``host:port`` answers 200 (no HTTP client library needed)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return False
    try:
        request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
        writer.write(request.encode())
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), timeout)
        return status.split()[1:2] == [b"200"]
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()


def _die_with_parent() -> None:
    """In a child: get SIGTERM when the parent dies (Linux ``PR_SET_PDEATHSIG``)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    """The child's whole environment (None: this process's)."""
    process: subprocess.Popen[bytes] | None = None
    restarts: list[float] = field(default_factory=list)
    _log: IO[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            env=self.env,
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        if self.process is not None:
            terminate(self.process, timeout)
        if self._log is not None:
            self._log.close()
            self._log = None


@contextlib.contextmanager
def _lock(data_dir: Path) -> Iterator[None]:
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"quill: {data_dir} is in use by another quill up") from None
        yield


class Stack:
    def __init__(
        self,
        data_dir: Path,
        *,
        nats_port: int = 4222,
        http_port: int = 8080,
        nats_url: str | None = None,
        log_level: str = "info",
        tokens: Path | None = None,
        sandbox: str | None = None,
        tenants: Path | None = None,
        secrets_file: Path | None = None,
    ) -> None:
        """``tenants``: a tenants file (``quill/tenants.py``): the embedded server then
        admits each tenant with its own rights and the services as the system user, whose
        password is made here and handed to the services in their environment.
        ``secrets_file``: the registry every service redacts (``$QUILL_SECRETS`` in their
        environment; ``services/common/secrets.py``)."""
        self.data_dir = data_dir.resolve()
        self.sandbox = sandbox
        self.nats_port, self.http_port = nats_port, http_port
        self.external_nats = nats_url
        self.log_level = log_level
        self.tokens = tokens.resolve() if tokens else None
        self.tenants = tenants.resolve() if tenants else None
        self.secrets_file = secrets_file.resolve() if secrets_file else None
        self.system: NatsAuth | None = None
        if self.tenants is not None:
            self.tokens = self.tenants  # the gateway reads its tokens from the same file
            self.system = NatsAuth(tenancy.SYSTEM_USER, secrets.token_urlsafe(32))
        self.nats: object | None = None
        self.children: list[Child] = []

    @property
    def nats_url(self) -> str:
        from quill.natsserver import NatsServer

        if self.external_nats:
            return self.external_nats
        assert isinstance(self.nats, NatsServer)
        return self.nats.url

    def _service(self, name: str, *extra: str) -> Child:
        argv = [
            sys.executable,
            "-m",
            "quill",
            "--log-level",
            self.log_level,
            name,
            "--nats-url",
            self.nats_url,
            "--data",
            str(self.data_dir / name),
            *extra,
        ]
        return Child(name, argv, self.data_dir / "logs" / f"{name}.log", self._env())

    def _env(self) -> dict[str, str] | None:
        """The services' environment: with tenants, the system user's credentials (never in
        argv, which ``ps`` shows to everyone), and no one else's; with secrets, the
        registry's path."""
        if self.system is None and self.secrets_file is None:
            return None
        env = dict(os.environ)
        if self.system is not None:
            env = {k: v for k, v in env.items() if k not in ENV_NAMES} | self.system.environ()
        if self.secrets_file is not None:
            env[SECRETS_ENV] = str(self.secrets_file)
        return env

    def _gateway(self) -> Child:
        argv = [
            sys.executable,
            "-m",
            "quill",
            "--log-level",
            self.log_level,
            "gateway",
            "--nats-url",
            self.nats_url,
            "--host",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
            *(["--tokens", str(self.tokens)] if self.tokens else []),
        ]
        return Child("gateway", argv, self.data_dir / "logs" / "gateway.log", self._env())

    async def _wait_ready(self, timeout: float = 30.0) -> None:
        nc = await bus.connect(self.nats_url, "quill-up", wait_s=timeout, auth=self.system)
        try:
            deadline = time.monotonic() + timeout
            for child in self.children:
                while True:
                    if not child.alive():
                        raise RuntimeError(f"{child.name} exited; see {child.log_path}")
                    try:
                        await nc.request(f"ws.sys.ping.{child.name}", b"", timeout=1)
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise RuntimeError(
                                f"{child.name} did not answer; see {child.log_path}"
                            ) from None
                        await asyncio.sleep(0.1)
            while not await http_ok("127.0.0.1", self.http_port, "/health"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the gateway's /health did not answer on {self.http_url}")
                await asyncio.sleep(0.1)
        finally:
            await nc.close()

    async def run(self) -> int:
        from quill.natsserver import NatsServer

        with _lock(self.data_dir):
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            try:
                if not self.external_nats:
                    port = self.nats_port or -1  # 0: any free port
                    auth = self._authorization()
                    server = NatsServer(self.data_dir / "nats", port=port, extra_config=auth)
                    self.nats = server
                    await asyncio.to_thread(server.start)
                self.http_port = self.http_port or free_port()
                sandbox = ["--sandbox", self.sandbox] if self.sandbox else []
                self.children = [
                    self._service("writer"),
                    self._service("reader"),
                    self._service("executor", *sandbox),
                    self._gateway(),
                ]
                for child in self.children:
                    child.start()
                await self._wait_ready()
                record = {
                    "nats_url": self.nats_url,
                    "http_url": self.http_url,
                    "pid": os.getpid(),
                    "data": str(self.data_dir),
                }
                (self.data_dir / STACK_FILE).write_text(json.dumps(record))
                print(
                    f"quill ready nats={self.nats_url} http={self.http_url} data={self.data_dir}",
                    flush=True,
                )
                await self._supervise(stop)
                return 0
            finally:
                (self.data_dir / STACK_FILE).unlink(missing_ok=True)
                for child in reversed(self.children):
                    await asyncio.to_thread(child.stop)
                if isinstance(self.nats, NatsServer):
                    await asyncio.to_thread(self.nats.stop)

    def _authorization(self) -> str:
        """The server's ``authorization`` block ("" without tenants: an open server).

        Raises:
            ValueError: the tenants file is unreadable or malformed.
        """
        if self.tenants is None or self.system is None:
            return ""
        assert self.system.password is not None
        return tenancy.authorization(tenancy.load(self.tenants), self.system.password)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    async def _supervise(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except TimeoutError:
                pass
            for child in self.children:
                if stop.is_set() or child.alive():
                    continue
                now = time.monotonic()
                child.restarts = [t for t in child.restarts if now - t < 60] + [now]
                code = child.process.returncode if child.process else None
                if len(child.restarts) > 5:
                    log.error("%s keeps exiting (code %s); giving up", child.name, code)
                    stop.set()
                    break
                log.warning("%s exited (code %s); restarting", child.name, code)
                child.stop()
                child.start()
