"""``quill cluster up``: a NATS cluster and the services as separate processes, on one
machine (the ``quill_cli.deployment.Deployment``); ``health``, a container's health check.

``Cluster`` runs a deployment here: each server and each service is a child process of the
launcher (``quill_cli.launcher``: readiness, supervision, ``kill``/``stop``/``start``/``restart``
of one process by name, ``nats-2`` or ``writer-1``). It is ready when every server's
JetStream is healthy, every service process answers its ping, every partition has a writer
and the gateway answers ``/health``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts.subjects import Subjects
from infra import bus
from infra.storage import Limit, executor_share, shares_disk
from quill.client import Workspace
from quill.connection import STACK_FILE
from quill_cli.deployment import COMPOSE_MONITOR_PORT, Deployment, NatsNode
from quill_cli.launcher import Child, Launcher, ping_until_answered
from quill_cli.natsserver import SHARED, WATCH_S, binary
from quill_cli.ports import http_ok, port_busy
from services.writer.partitions import leases_bucket

log = logging.getLogger("quill_cli.cluster")


WRITER_OF_S = 15.0
"""How long ``writer_of`` looks for the writer that served a workspace (its audit record, its
ping) before it says none did."""


class Cluster(Launcher):
    """A cluster on this machine. ``async with Cluster(tmp_path, partitions=16) as c:``, or
    ``await c.start()`` … ``await c.stop()``; ``c.kill("writer-1")``, ``c.restart("nats-2")``.
    ``restart=False``: a child that dies stays down until ``start(name)``/``restart(name)``.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        nats: int = 3,
        writers: int = 2,
        readers: int = 2,
        executors: int = 2,
        partitions: int = 64,
        lease_ttl: float | None = None,
        sandbox: str | None = None,
        tokens: Path | None = None,
        nats_port: int = 0,
        http_port: int = 0,
        log_level: str = "info",
        restart: bool = True,
        metrics_port: int = 0,
        log_max_bytes: int | None = None,
        disk_reserve: int | None = None,
    ) -> None:
        """``nats_port``: the first server's client port, the others take the next ones
        (0: free ports); ``http_port``: the gateway's (0: a free one); ``tokens``: the
        gateway's tokens file (docs/gateway.md); ``metrics_port``: the first service's
        metrics port, the others (``names`` order, this launcher last) the next ones (0: free
        ports); ``log_max_bytes``, ``disk_reserve``: each server's JetStream storage limit, as
        ``quill up``'s (``quill_cli.natsserver``), the free space shared between the servers
        (one disk).

        Raises:
            ValueError: counts the deployment cannot run with.
        """
        super().__init__(
            data_dir,
            http_port=http_port,
            log_level=log_level,
            restart=restart,
            metrics_port=metrics_port,
        )
        self.deployment = Deployment(
            nats, writers, readers, executors, partitions, lease_ttl, sandbox
        )
        self.root = self.deployment.root
        ports = self.ports
        self.servers = [
            NatsNode(name, "127.0.0.1", ports.pick(nats_port, i), ports.free(), ports.free())
            for i, name in enumerate(self.deployment.nats_names)
        ]
        self.http_port = self.http_port or ports.free()
        self.tokens = tokens.resolve() if tokens else None
        self.limits = {
            node.name: Limit(
                self.data_dir / node.name / "jetstream",
                disk_reserve,
                log_max_bytes,
                SHARED / len(self.servers),  # one disk: the servers' and the services' data
            )
            for node in self.servers
        }
        """Each server's JetStream ``max_file_store`` (``quill_cli.natsserver``)."""
        self._limits_watch: asyncio.Task[None] | None = None

    @property
    def nats_urls(self) -> list[str]:
        return [node.url for node in self.servers]

    @property
    def nats_url(self) -> str:
        return ",".join(self.nats_urls)

    @property
    def names(self) -> list[str]:
        """Every process: ``nats-1``… then ``writer-1``…, ``reader-…``, ``executor-…``,
        ``gateway``."""
        return [*self.deployment.nats_names, *self.deployment.service_names]

    def record(self) -> dict[str, Any]:
        servers = [{"name": n.name, "url": n.url, "monitor": n.monitor_url} for n in self.servers]
        return {**super().record(), "servers": servers}

    def _server(self, node: NatsNode) -> Child:
        home = self.data_dir / node.name
        home.mkdir(parents=True, exist_ok=True)
        self.limits[node.name].start()
        self._write_config(node)
        argv = [str(binary()), "-c", str(home / "nats.conf")]
        return Child(node.name, argv, self._log(node.name), pumped=True)

    def _write_config(self, node: NatsNode) -> None:
        home = self.data_dir / node.name
        limit = self.limits[node.name].limit
        text = self.deployment.server_config(node, self.servers, str(home / "jetstream"), limit)
        (home / "nats.conf").write_text(text)

    async def _watch_limits(self) -> None:
        """Raise each server's storage limit as the disk grows (``quill_cli.natsserver``)."""
        while True:
            await asyncio.sleep(WATCH_S)
            for node in self.servers:
                child = self.child(node.name)
                if not child.alive():
                    continue
                try:
                    target = await asyncio.to_thread(self.limits[node.name].grown)
                except OSError as exc:
                    log.warning("%s: storage limit not recomputed: %s", node.name, exc)
                    continue
                if target is None:
                    continue
                log.warning("%s: raising JetStream's storage limit to %d bytes", node.name, target)
                self._write_config(node)
                assert child.process is not None
                child.process.send_signal(signal.SIGHUP)

    def _service(self, name: str) -> Child:
        args = self.deployment.service_args(
            name,
            nats_url=self.nats_url,
            data=str(self.data_dir / name),
            http_port=self.http_port,
            tokens=str(self.tokens) if self.tokens else None,
            metrics_port=self.metrics_ports[name],
        )
        role, port = name.rsplit("-", 1)[0], self.metrics_ports[name]
        if role == "executor":
            args += self._executor_disk(self.data_dir / name)
        return Child(name, self.argv(*args), self._log(name), ping=role, metrics_port=port)

    def _executor_disk(self, data: Path) -> list[str]:
        """An executor's ``--disk-reserve-mb`` and ``--checkouts-budget-mb`` when its data
        shares the servers' disk: the room every store was promised stays free, the budget is
        shared between the executors (``infra.storage.executor_share``)."""
        probe = data if data.exists() else self.data_dir  # a filesystem mounted there exists
        limits = list(self.limits.values())
        if not any(shares_disk(limit.store_dir, probe) for limit in limits):
            return []
        count = sum(1 for n in self.deployment.service_names if n.startswith("executor-"))
        reserve, budget = executor_share(limits, executors=count)
        mib = 1024 * 1024
        return [
            "--disk-reserve-mb",
            str(-(-reserve // mib)),
            "--checkouts-budget-mb",
            str(max(1, budget // mib)),
        ]

    def _log(self, name: str) -> Path:
        return self.data_dir / "logs" / f"{name}.log"

    def _check_ports(self) -> None:
        """Refuse to start on a port something else holds, naming it (nats-server would only
        log it, and the cluster wait for a server that never comes up).

        Raises:
            RuntimeError: the first busy port, whose it was to be, and what to do.
        """
        wanted = [(self.http_port, "the gateway's HTTP port", "--http-port")]
        for node in self.servers:
            wanted += [
                (node.port, f"{node.name}'s client port", "--nats-port"),
                (node.cluster_port, f"{node.name}'s cluster port", "--nats-port"),
                (node.monitor_port, f"{node.name}'s monitoring port", "--nats-port"),
            ]
        for port, what, option in wanted:
            if port_busy(port):
                raise RuntimeError(
                    f"port {port} ({what}) is in use on 127.0.0.1: stop what holds it, or "
                    f"choose another with {option} (0: free ports)"
                )

    async def _launch(self, timeout: float = 30.0) -> None:
        self._check_ports()
        self.plan_metrics(self.deployment.service_names)
        servers = [self._server(node) for node in self.servers]
        self.children = servers
        for child in servers:
            child.start()
        deadline = time.monotonic() + timeout
        await self._wait_servers(servers, deadline)
        await self._create_streams(deadline)
        services = [self._service(name) for name in self.deployment.service_names]
        self.children = [*servers, *services]
        for child in services:
            child.start()
        self._limits_watch = asyncio.create_task(self._watch_limits())

    async def _shutdown(self) -> None:
        if self._limits_watch is not None:
            self._limits_watch.cancel()
            await asyncio.gather(self._limits_watch, return_exceptions=True)
            self._limits_watch = None

    async def _wait_servers(self, children: list[Child], deadline: float) -> None:
        """Until each server's ``/healthz`` answers 200: JetStream up, current with the
        cluster's meta leader and with its streams."""
        for child in children:
            node = next(n for n in self.servers if n.name == child.name)
            while not await http_ok(node.address, node.monitor_port, "/healthz"):
                if not child.alive():
                    raise RuntimeError(f"{child.name} exited; see {child.log_path}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{child.name} is not healthy; see {child.log_path}")
                await asyncio.sleep(0.1)

    async def _create_streams(self, deadline: float) -> None:
        """Create every stream and bucket with the deployment's replicas, then wait until
        each has a leader, before any service starts: services racing to create them, or
        writing to one whose replicas are still electing, fail (``no response from
        stream``)."""
        nc = await bus.connect(self.nats_url, "quill-cluster")
        js = nc.jetstream()
        try:
            while True:
                try:
                    await bus.ensure_streams(nc, Subjects(self.deployment.root), self.replicas)
                    await leases_bucket(js, self.replicas)
                    leaderless = [
                        info.config.name
                        for info in await js.streams_info()
                        if info.cluster is not None and not info.cluster.leader  # None: one server
                    ]
                    if not leaderless:
                        return
                    error = f"no leader yet for {', '.join(map(str, leaderless))}"
                except Exception as exc:  # nats-py raises several types while placing
                    error = str(exc) or type(exc).__name__
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the cluster did not create its streams: {error}")
                await asyncio.sleep(0.2)
        finally:
            await nc.close()

    @property
    def replicas(self) -> int:
        return self.deployment.replicas

    def name_of(self, pid: int) -> str:
        """The name (``writer-1``, ``nats-2``...) of the child process ``pid``."""
        return next(c.name for c in self.children if c.pid == pid)

    async def writer_of(self, ws: Workspace) -> str:
        """The name (``writer-N``) of the writer that served ``ws``'s last command (its audit
        record names the instance; the writers' pings give their pids)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WRITER_OF_S
        while True:  # the audit record is published after the reply; a pong may come late
            instance = ""
            async for record in ws.audit():
                if record.service == "writer":
                    instance = record.instance
            pongs = await bus.ping_all(ws.client.nc, Subjects(self.deployment.root), "writer")
            pid = next((p["pid"] for p in pongs if instance and p["instance"] == instance), None)
            if pid is not None:
                return self.name_of(pid)
            if loop.time() >= deadline:
                name = f"{ws.tenant}/{ws.name}"
                raise RuntimeError(f"no writer answering a ping served {name} ({instance!r})")

    async def failover(self, ws: Workspace) -> tuple[str, float]:
        """Write ``ws``, kill -9 the writer that served it, and write again: that writer's
        name, and the seconds the second write took (the SDK retries through the failover;
        ``a.txt`` then holds ``after``)."""
        await ws.create(exist_ok=True)
        await ws.write("a.txt", "before\n")
        victim = await self.writer_of(ws)
        await self.kill(victim)
        started = time.perf_counter()
        await ws.write("a.txt", "after\n")
        return victim, time.perf_counter() - started

    async def _wait_more(self, nc: NATS, children: list[Child], deadline: float) -> None:
        names = set(self.deployment.nats_names)
        await self._wait_servers([c for c in children if c.name in names], deadline)
        if any(c.ping == "writer" for c in children):
            await self._wait_partitions(nc, deadline)

    async def _wait_partitions(self, nc: NATS, deadline: float) -> None:
        """Until every partition has a writer (as the running writers report them)."""
        writers = [c for c in self.children if c.ping == "writer" and c.wanted]
        wanted = set(range(self.deployment.partitions))
        while True:
            answers = await ping_until_answered(nc, writers, deadline)
            held = _held(answers.values())
            if held is None or wanted <= held:
                return
            if time.monotonic() > deadline:
                missing = sorted(wanted - held)
                raise RuntimeError(f"partitions without a writer: {missing[:10]}")
            await asyncio.sleep(0.2)


def _held(answers: Any) -> set[int] | None:
    """The partitions the writers' ping answers say they hold; None: they do not say."""
    held: set[int] = set()
    reported = False
    for answer in answers:
        info = answer.get("partitions")
        if isinstance(info, dict):
            reported = True
            held.update(int(p) for p in info.get("held", []))
    return held if reported else None


def monitor_port_of(data_dir: Path) -> int | None:
    """The monitoring port of the first NATS server ``quill cluster up`` (or ``quill up``)
    recorded in ``DATA/stack.json``, if one runs there."""
    try:
        record = json.loads((data_dir / STACK_FILE).read_text())
        monitor = urlsplit(str(record["servers"][0]["monitor"]))
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return monitor.port


async def health(
    service: str, *, nats_url: str, monitor_port: int = COMPOSE_MONITOR_PORT, wait_s: float = 3.0
) -> str | None:
    """Whether ``service`` on this host is healthy (a container's health check): for ``nats``,
    the local server's ``/healthz``; for the others, a process of the service on this host
    (by host name) answers its ping. None when healthy, else why not."""
    if service == "nats":
        if not await http_ok("127.0.0.1", monitor_port, "/healthz", timeout=wait_s):
            return f"nats-server's /healthz on port {monitor_port} did not answer 200"
        return await _storage_full(monitor_port, wait_s)
    mine = bus.instance_id(service).rsplit("-", 1)[0] + "-"  # <service>-<host>-
    try:
        nc = await bus.connect(nats_url, f"quill-health-{service}", wait_s=wait_s)
    except ConnectionError as exc:
        return str(exc)
    found = asyncio.Event()
    full: list[str] = []

    async def check(msg: Msg) -> None:
        with contextlib.suppress(ValueError, AttributeError):
            answer = json.loads(msg.data)
            if str(answer.get("instance", "")).startswith(mine):
                if answer.get("storage_full"):
                    full.append(str(answer["storage_full"]))
                found.set()

    try:
        await nc.subscribe(inbox := nc.new_inbox(), cb=check)
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            await nc.publish(f"{Subjects().root}.sys.ping.{service}", b"", reply=inbox)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(found.wait(), min(left, 0.5))
                what = "the log" if service == "writer" else f"the {service}'s disk"
                return f"storage full: {what}: {full[0]}" if full else None
        return f"no {service} on {socket.gethostname()} answered its ping"
    finally:
        await nc.close()


async def _storage_full(monitor_port: int, wait_s: float) -> str | None:
    """Why the server on ``monitor_port`` is full (its JetStream storage at its limit, from
    ``/jsz``), or None."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", monitor_port), wait_s
        )
        writer.write(b"GET /jsz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), wait_s)
        writer.close()
        jsz = json.loads(raw.split(b"\r\n\r\n", 1)[1])
        used, limit = int(jsz["storage"]), int(jsz["config"]["max_storage"])
    except (OSError, TimeoutError, ValueError, KeyError, IndexError, TypeError):
        return None  # /healthz answered: a /jsz it cannot read says nothing of the disk
    if limit > 0 and used >= limit:
        return (
            f"storage full: JetStream stores {used} bytes, its limit is {limit} "
            "(docs/operations.md, Disk full)"
        )
    return None


__all__ = ["Cluster", "health"]
