"""What a cluster deployment runs, and the NATS servers' configurations for it; pure (no
processes): ``quill cluster up`` (``quill_cli.cluster``) runs it on one machine, ``compose.yaml``
on several, with the server configurations ``render`` writes to ``deploy/``.

A ``Deployment`` says what runs: ``nats`` servers (JetStream on each, streams with
``min(3, nats)`` replicas), ``writers`` sharing ``partitions`` command partitions by lease,
``readers``, ``executors`` and one gateway. Every server's configuration carries the subject
mapping that spreads ``ws.cmd.…`` over the partitions (``Subjects.partition_mapping``), so a
command reaches the writer holding its partition whichever server the client is on.

Every server keeps ``sync_interval: always`` (``quill_cli.natsserver.config``): on one machine
the three replicas share a disk and a power supply, so only an fsync makes an acknowledged
write survive a power loss; on separate machines it still covers losing them all at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from contracts.subjects import Subjects
from quill_cli.natsserver import config, mappings_config

COMPOSE_CLIENT_PORT = 4222
COMPOSE_CLUSTER_PORT = 6222
COMPOSE_MONITOR_PORT = 8222
COMPOSE_HTTP_PORT = 8080
COMPOSE_METRICS_PORT = 9464
"""Each service container's Prometheus metrics (every address of the container: reachable
inside the compose network, published nowhere)."""
COMPOSE_DATA = "/data"
"""Where each container keeps its state (a volume)."""
COMPOSE_TOKENS = "/run/secrets/quill-tokens"
"""The gateway's tokens file (a compose secret): it listens beyond loopback only with one."""
RENDERED = "written by `python -m quill cluster render` from quill_cli/deployment.py; do not edit"


@dataclass(frozen=True)
class NatsNode:
    """One NATS server of the cluster, as the others and the clients reach it."""

    name: str
    address: str
    """How the others and the clients reach it (``127.0.0.1``, or ``nats-1`` in compose)."""
    port: int
    cluster_port: int
    monitor_port: int
    listen: str = "127.0.0.1"
    """The interface it listens on."""

    @property
    def url(self) -> str:
        return f"nats://{self.address}:{self.port}"

    @property
    def route(self) -> str:
        return f"nats-route://{self.address}:{self.cluster_port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{self.address}:{self.monitor_port}"


@dataclass(frozen=True)
class Deployment:
    """What runs; ``quill cluster up`` and ``compose.yaml`` are both this."""

    nats: int = 3
    writers: int = 2
    readers: int = 2
    executors: int = 2
    partitions: int = 64
    lease_ttl: float | None = None
    """Seconds a writer's partition lease lives unrenewed (None: the writer's default)."""
    sandbox: str | None = None
    cluster_name: str = "quill"
    root: str = "ws"
    log_max_bytes: int | None = None
    """Each server's JetStream storage limit in ``compose.yaml`` (``render --log-max-bytes``;
    None: nats-server's own, 75% of the free disk at start). ``quill cluster up`` computes
    its servers' from their disk (``infra.storage.jetstream_limit``)."""

    def __post_init__(self) -> None:
        """Raises: ValueError: a count the deployment cannot run with."""
        if self.nats < 1 or self.writers < 1 or self.readers < 1 or self.executors < 0:
            raise ValueError("need at least 1 NATS server, 1 writer and 1 reader")
        if self.partitions < 1:
            raise ValueError("--partitions must be at least 1")

    @property
    def replicas(self) -> int:
        """JetStream replicas of every stream and bucket."""
        return min(3, self.nats)

    @property
    def nats_names(self) -> list[str]:
        return [f"nats-{i}" for i in range(1, self.nats + 1)]

    @property
    def service_names(self) -> list[str]:
        counts = {"writer": self.writers, "reader": self.readers, "executor": self.executors}
        names = [f"{kind}-{i}" for kind, n in counts.items() for i in range(1, n + 1)]
        return [*names, "gateway"]

    def service_args(
        self,
        name: str,
        *,
        nats_url: str,
        data: str,
        host: str = "127.0.0.1",
        http_port: int = 8080,
        tokens: str | None = None,
        metrics_port: int | None = None,
        metrics_host: str | None = None,
    ) -> list[str]:
        """The ``quill`` arguments that run service ``name`` (``writer-1``, ``gateway``);
        ``metrics_port``, ``metrics_host``: where it serves its metrics (None: not at all; the
        service's default address)."""
        kind = name.rsplit("-", 1)[0]
        metrics = [] if metrics_port is None else ["--metrics-port", str(metrics_port)]
        metrics += ["--metrics-host", metrics_host] if metrics_host else []
        if kind == "gateway":
            args = [kind, "--nats-url", nats_url, "--host", host, "--http-port", str(http_port)]
            return args + (["--tokens", tokens] if tokens else []) + metrics
        args = [kind, "--nats-url", nats_url, "--data", data, "--replicas", str(self.replicas)]
        if kind == "writer":
            args += ["--partitions", str(self.partitions)]
            args += ["--lease-ttl", f"{self.lease_ttl:g}"] if self.lease_ttl else []
        if kind == "executor" and self.sandbox:
            args += ["--sandbox", self.sandbox]
        return args + metrics

    def server_config(
        self,
        node: NatsNode,
        nodes: Sequence[NatsNode],
        store_dir: str,
        max_store: int | None = None,
    ) -> str:
        """The configuration of server ``node`` among ``nodes``: client port, JetStream (and
        its storage limit ``max_store``), the cluster and its routes (every server, itself
        included: it ignores its own), the monitoring port and the partition mapping."""
        lines = [f"server_name: {node.name}", f"http: {node.listen}:{node.monitor_port}"]
        if len(nodes) > 1:  # one server: a plain JetStream server, no cluster to form
            routes = "".join(f"    {n.route}\n" for n in nodes)
            lines.append(
                f"cluster {{\n  name: {self.cluster_name}\n"
                f"  listen: {node.listen}:{node.cluster_port}\n  routes: [\n{routes}  ]\n}}"
            )
        extra = "\n".join(lines) + "\n" + mappings_config(Subjects(self.root), self.partitions)
        return config(Path(store_dir), node.port, node.listen, extra, max_store)

    # ---------------------------------------------------------------- compose
    def compose_nodes(self) -> list[NatsNode]:
        """The servers in ``compose.yaml``: one container each, reached by service name."""
        ports = (COMPOSE_CLIENT_PORT, COMPOSE_CLUSTER_PORT, COMPOSE_MONITOR_PORT)
        return [NatsNode(name, name, *ports, listen="0.0.0.0") for name in self.nats_names]

    @property
    def compose_nats_url(self) -> str:
        return ",".join(node.url for node in self.compose_nodes())

    def compose_configs(self) -> dict[str, str]:
        """``nats/<name>.conf`` → text, for the containers (``render``)."""
        nodes, store = self.compose_nodes(), f"{COMPOSE_DATA}/jetstream"
        return {
            f"nats/{n.name}.conf": f"# {n.name} of compose.yaml, {RENDERED}\n"
            + self.server_config(n, nodes, store, self.log_max_bytes)
            for n in nodes
        }

    def compose_args(self, name: str) -> list[str]:
        """The ``quill`` arguments of service ``name`` in ``compose.yaml``."""
        return self.service_args(
            name,
            nats_url=self.compose_nats_url,
            data=COMPOSE_DATA,
            host="0.0.0.0",
            http_port=COMPOSE_HTTP_PORT,
            tokens=COMPOSE_TOKENS,
            metrics_port=COMPOSE_METRICS_PORT,
            metrics_host="0.0.0.0",
        )


def render(deployment: Deployment, out: Path) -> list[Path]:
    """Write the servers' configurations for ``compose.yaml`` under ``out`` (``deploy/``)."""
    written = []
    for relative, text in deployment.compose_configs().items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
