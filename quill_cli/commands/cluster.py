"""``quill cluster up``: a NATS cluster and the services as separate processes, on one
machine; ``quill cluster render``: the servers' configurations for ``compose.yaml``;
``quill cluster health``: a container's health check (docs/cluster.md)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import click

from infra.runtime import setup_logging
from quill_cli.common import (
    LAUNCHED_LOG_FORMAT,
    LOG_FORMAT_ENV,
    SANDBOX_HELP,
    TOKENS_HELP,
    Commands,
    SizeType,
    refusing,
    run_to_exit,
    storage_options,
)

commands = Commands("services")


@commands.group("cluster")
def cluster_group() -> None:
    """A NATS cluster with JetStream replicas and several processes of each service."""


def _counts(fn: click.decorators.FC) -> click.decorators.FC:
    for option in reversed(
        [
            click.option("--nats", default=3, show_default=True, help="NATS servers."),
            click.option(
                "--partitions",
                default=64,
                show_default=True,
                help="Command partitions the writers share (in every server's subject mapping).",
            ),
        ]
    ):
        fn = option(fn)
    return fn


@cluster_group.command("up")
@click.option("--data", type=click.Path(path_type=Path), default=Path(".quill"), show_default=True)
@_counts
@click.option("--writers", default=2, show_default=True, help="Writer processes.")
@click.option("--readers", default=2, show_default=True, help="Reader processes.")
@click.option("--executors", default=2, show_default=True, help="Executor processes.")
@click.option("--lease-ttl", type=float, help="Seconds a writer's partition lease outlives it.")
@click.option(
    "--nats-port",
    default=4222,
    show_default=True,
    help="Client port of the first server; the others take the next ones. 0: free ports.",
)
@click.option("--http-port", default=8080, show_default=True, help="0 picks a free port.")
@click.option("--sandbox", type=click.Choice(["bwrap", "local"]), help=SANDBOX_HELP)
@click.option("--tokens", type=click.Path(path_type=Path, dir_okay=False), help=TOKENS_HELP)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="The first service's metrics port; the others and the launcher take the next ones "
    "(in DATA/stack.json). 0: free ports.",
)
@LAUNCHED_LOG_FORMAT
@storage_options
@click.pass_context
def up(
    ctx: click.Context,
    data: Path,
    nats: int,
    partitions: int,
    writers: int,
    readers: int,
    executors: int,
    lease_ttl: float | None,
    nats_port: int,
    http_port: int,
    sandbox: str | None,
    tokens: Path | None,
    metrics_port: int,
    log_format: str,
    log_max_bytes: int | None,
    disk_reserve: int | None,
) -> None:
    """Start NATS servers in a cluster and the services, each its own process; Ctrl-C stops
    them. Clients use every server's URL, comma-separated (printed, and in DATA/stack.json)."""
    from quill_cli.cluster import Cluster
    from services.gateway.access import Tokens

    setup_logging(ctx.obj["log_level"], log_format)
    os.environ[LOG_FORMAT_ENV] = log_format  # the services inherit it
    with refusing():
        if tokens is not None:
            Tokens.load(tokens)  # refuse a bad file here rather than in the gateway's log
        cluster = Cluster(
            data,
            nats=nats,
            writers=writers,
            readers=readers,
            executors=executors,
            partitions=partitions,
            lease_ttl=lease_ttl,
            sandbox=sandbox,
            tokens=tokens,
            nats_port=nats_port,
            http_port=http_port,
            log_level=ctx.obj["log_level"],
            metrics_port=metrics_port,
            log_max_bytes=log_max_bytes,
            disk_reserve=disk_reserve,
        )
    sys.exit(run_to_exit(cluster.run()))


@cluster_group.command("render")
@click.option("--out", type=click.Path(path_type=Path), default=Path("deploy"), show_default=True)
@_counts
@click.option(
    "--log-max-bytes",
    type=SizeType(),
    help="Each server's JetStream storage limit (max_file_store), e.g. 20GB: set it below "
    "the volume's size (docs/operations.md, Disk full). Default: nats-server's own.",
)
def render(out: Path, nats: int, partitions: int, log_max_bytes: int | None) -> None:
    """Write OUT/nats/nats-N.conf, the servers' configurations that compose.yaml mounts."""
    from quill_cli.deployment import Deployment
    from quill_cli.deployment import render as write

    with refusing():
        deployment = Deployment(nats=nats, partitions=partitions, log_max_bytes=log_max_bytes)
    for path in write(deployment, out):
        click.echo(str(path))


@cluster_group.command("health")
@click.argument("service", type=click.Choice(["nats", "writer", "reader", "executor", "gateway"]))
@click.option(
    "--monitor-port",
    type=int,
    help="nats-server's monitoring port. Default: the first server's in DATA/stack.json (the "
    "quill cluster up running here, $QUILL_DATA or .quill), else 8222 (compose).",
)
@click.option("--timeout", default=3.0, show_default=True, help="Seconds to wait for an answer.")
@click.pass_context
def health(ctx: click.Context, service: str, monitor_port: int | None, timeout: float) -> None:
    """Exit 0 if SERVICE on this host is healthy: the local nats-server's /healthz, or a
    process of the service on this host answering its ping (a container's health check)."""
    from quill_cli.cluster import health as check
    from quill_cli.cluster import monitor_port_of
    from quill_cli.deployment import COMPOSE_MONITOR_PORT
    from quill_cli.stack import DEFAULT_DATA, discover_url

    if monitor_port is None:
        data = Path(os.environ.get("QUILL_DATA", DEFAULT_DATA))
        monitor_port = monitor_port_of(data) or COMPOSE_MONITOR_PORT
    url = ctx.obj["nats_url"] or discover_url()
    why = asyncio.run(check(service, nats_url=url, monitor_port=monitor_port, wait_s=timeout))
    if why is not None:
        click.echo(f"quill: {service} unhealthy: {why}", err=True)
        sys.exit(1)
