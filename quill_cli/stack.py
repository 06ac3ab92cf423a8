"""``quill up``: the whole service on one machine.

Starts ``nats-server`` from the wheel (unless given ``--nats-url``), then each service as its
own process (``python -m quill writer …``, the reader, the executor, and the HTTP gateway on
``--http-port``), waits until every one answers a ping and the gateway's ``GET /health``
answers 200, records the URLs and each process (its role, pid and metrics URL) in
``<data>/stack.json`` (clients find them there) and prints one line with ``ready``, then one
with each process's metrics port (every service serves its own, on loopback).
Every process that dies is restarted, NATS included, after a delay that doubles with each exit
in a row (``quill_cli.supervisor``), while the others serve on; SIGINT/SIGTERM stops everything
cleanly. The NATS server listens on the same port when it starts again (the services reconnect
by themselves), and its output goes to ``<data>/nats/nats-server.log`` through
``quill_cli.serverlog`` (redacted with ``--secrets``, rate-limited, rotated, capped).

The executor shares the disk of JetStream's store (unless its data directory is elsewhere): so
that no command can take the room the log was promised, it gets a disk reserve of that room
plus the log's own reserve and a checkouts budget of half of what is left
(``infra.storage.executor_share``).
Children get SIGTERM if this process is killed, and everything they acknowledged is already on
disk.

The life cycle is ``quill_cli.launcher.Launcher``'s, shared with ``quill cluster up``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from pathlib import Path

from core.secrets import NO_SECRETS
from infra import secret_registry
from infra.secret_registry import ENV_FILE as SECRETS_ENV
from infra.storage import executor_share, shares_disk
from quill.connection import DEFAULT_DATA, STACK_FILE, discover_url
from quill.credentials import ENV_NAMES, SYSTEM_USER, NatsAuth
from quill_cli import tenants as tenancy
from quill_cli.launcher import Child, Launcher
from quill_cli.natsserver import MEMORY_LIMIT, NatsServer
from quill_cli.ports import free_port, http_ok

log = logging.getLogger("quill_cli.stack")
MIB = 1024 * 1024

__all__ = ["DEFAULT_DATA", "STACK_FILE", "Stack", "discover_url", "free_port", "http_ok"]


def up_workers() -> int:
    """The gateway's processes under ``quill up``: half the cores, since NATS, the writer, the
    reader and the executor run on the same ones (on 2 cores one worker measured faster than
    two, docs/performance.md)."""
    from infra.http.workers import default_count

    return max(1, default_count() // 2)


class NatsChild(Child):
    """The NATS server ``quill up`` starts, as one of its children: supervised like the
    services (restarted, on its port, after a crash or a ``kill -9``), listed in ``stack.json``
    (``name`` and ``role`` ``nats``). It starts again by itself too, when its watcher restarts
    it with a lower storage limit (``quill_cli.natsserver``)."""

    def __init__(self, server: NatsServer) -> None:
        super().__init__("nats", [], server.log_path)
        self.server = server
        server.on_start = self._started

    def _started(self) -> None:
        if self.on_start is not None:
            self.on_start(self)

    def start(self) -> None:
        """Start it (if it is not running) and wait until it is ready; one that does not
        start is left down for the supervisor to try again after its delay."""
        try:
            self.server.start()
        except RuntimeError as exc:  # "nats-server did not start: ..."
            log.warning("%s", exc)
        except OSError as exc:  # its configuration or its store's disk
            log.warning("nats-server not started: %s", exc)

    def alive(self) -> bool:
        return self.server.alive()

    @property
    def pid(self) -> int | None:
        process = self.server.process
        return process.pid if process is not None else None

    @property
    def exit_code(self) -> int | None:
        process = self.server.process
        return process.poll() if process is not None else None

    def stop(self, timeout: float = 15.0) -> None:
        self.server.stop(timeout)

    def kill(self) -> None:
        self.server.kill()


class Stack(Launcher):
    """``quill up``: one NATS server (or ``nats_url``'s) and one process of each service."""

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
        restart: bool = True,
        gateway_workers: int | None = None,
        metrics_port: int = 0,
        log_max_bytes: int | None = None,
        disk_reserve: int | None = None,
        nats_memory: int | None = None,
        egress_allow: tuple[str, ...] = (),
    ) -> None:
        """``tenants``: a tenants file (``quill_cli/tenants.py``): the embedded server then
        admits each tenant with its own rights and the services as the system user, whose
        password is made here and handed to the services in their environment.
        ``secrets_file``: the registry every service redacts (``$QUILL_SECRETS`` in their
        environment; ``core/secrets.py``). ``metrics_port``: the writer's metrics port, the
        reader, executor, gateway and this launcher taking the next ones (0: free ports).
        ``log_max_bytes``, ``disk_reserve``: JetStream's storage limit
        (``quill_cli.natsserver``); ``nats_memory``: its Go memory limit (None: the default,
        0: none). ``egress_allow``: the executor's ``--egress-allow`` entries."""
        system = None
        if tenants is not None:
            system = NatsAuth(SYSTEM_USER, secrets.token_urlsafe(32))
        super().__init__(
            data_dir,
            http_port=http_port,
            log_level=log_level,
            restart=restart,
            auth=system,
            metrics_port=metrics_port,
        )
        self.sandbox = sandbox
        self.egress_allow = egress_allow
        self.nats_port = nats_port
        self.external_nats = nats_url
        self.tokens = tokens.resolve() if tokens else None
        self.tenants = tenants.resolve() if tenants else None
        self.secrets_file = secrets_file.resolve() if secrets_file else None
        if self.tenants is not None:
            self.tokens = self.tenants  # the gateway reads its tokens from the same file
        self.nats: NatsServer | None = None
        self.gateway_workers = gateway_workers
        self.log_max_bytes, self.disk_reserve = log_max_bytes, disk_reserve
        self.nats_memory = nats_memory

    @property
    def nats_url(self) -> str:
        if self.external_nats:
            return self.external_nats
        assert self.nats is not None
        return self.nats.url

    def _executor_disk(self) -> list[str]:
        """The executor's ``--disk-reserve-mb`` and ``--checkouts-budget-mb`` when its data
        shares the disk of JetStream's store (``infra.storage.executor_share``); else none
        (its own defaults)."""
        if self.nats is None:
            return []
        executor = self.data_dir / "executor"  # a filesystem mounted there: it exists
        if not shares_disk(self.nats.store_dir, executor if executor.exists() else self.data_dir):
            return []
        reserve, budget = executor_share([self.nats.limits], executors=1)
        return [
            "--disk-reserve-mb",
            str(-(-reserve // MIB)),  # rounded up: never less than the log's room
            "--checkouts-budget-mb",
            str(max(1, budget // MIB)),
        ]

    def _service(self, name: str, *extra: str) -> Child:
        argv = self.argv(name, "--nats-url", self.nats_url, "--data", str(self.data_dir / name))
        argv += [*self.metrics_args(name), *extra]
        port = self.metrics_ports[name]
        return Child(name, argv, self._log(name), self._env(), ping=name, metrics_port=port)

    def _log(self, name: str) -> Path:
        return self.data_dir / "logs" / f"{name}.log"

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
        argv = self.argv("gateway", "--nats-url", self.nats_url, "--host", "127.0.0.1")
        argv += ["--http-port", str(self.http_port)]
        argv += ["--tokens", str(self.tokens)] if self.tokens else []
        argv += ["--workers", str(self.gateway_workers or up_workers())]
        argv += self.metrics_args("gateway")
        port = self.metrics_ports["gateway"]
        log = self._log("gateway")
        return Child("gateway", argv, log, self._env(), ping="gateway", metrics_port=port)

    async def _launch(self) -> None:
        if not self.external_nats and self.nats_port:
            self.ports.taken.add(self.nats_port)
        self.plan_metrics(["writer", "reader", "executor", "gateway"])
        if not self.external_nats:
            port = self.nats_port or -1  # 0: any free port
            auth = self._authorization()
            registry = NO_SECRETS
            if self.secrets_file is not None:  # checked by the command before we got here
                registry = secret_registry.load(self.secrets_file)
            self.nats = NatsServer(
                self.data_dir / "nats",
                port=port,
                extra_config=auth,
                log_max_bytes=self.log_max_bytes,
                disk_reserve=self.disk_reserve,
                secrets=registry,
                memory_limit=MEMORY_LIMIT if self.nats_memory is None else self.nats_memory,
            )
            await asyncio.to_thread(self.nats.start)
        self.http_port = self.http_port or self.ports.free()
        sandbox = ["--sandbox", self.sandbox] if self.sandbox else []
        sandbox += [f"--egress-allow={entry}" for entry in self.egress_allow]
        services = [
            self._service("writer"),
            self._service("reader"),
            self._service("executor", *sandbox, *self._executor_disk()),
            self._gateway(),
        ]
        for child in services:
            child.start()
        self.children = [NatsChild(self.nats), *services] if self.nats else services

    async def _shutdown(self) -> None:
        if self.nats is not None:
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
