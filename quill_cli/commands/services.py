"""``quill up``, ``writer``, ``reader``, ``executor``, ``gateway``: running the services, one
each, or all of them and NATS on this machine.

Each service's options fill its typed config (``WriterConfig``, ``SnapshotConfig`` for a
reader, ``ExecutorConfig``, ``GatewayConfig``), which the service reads as it is; what every
service keeping a projection takes (``service_options``) is ``Settings``. ``quill up`` starts
each service as ``quill <service> OPTIONS`` (``quill_cli/stack.py``): these options are that
command line. Serving a directory of this machine (the bridge) is ``commands/attach.py``."""

from __future__ import annotations

import os
import sys
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import click

from contracts.limits import (
    GATEWAY_MAX_INFLIGHT,
    GATEWAY_STREAMS_PER_PRINCIPAL,
    PROJECTION_ROWS,
    WRITER_MAX_QUEUED,
    WRITER_MAX_QUEUED_BYTES,
    WRITER_MAX_QUEUED_PER_WORKSPACE,
    WRITER_MAX_WAITING_PER_WORKSPACE,
    WRITER_WORKSPACES,
)
from infra import private, secret_registry
from infra.runtime import Settings, run_until_stopped, setup_logging
from quill_cli.common import (
    LAUNCHED_LOG_FORMAT,
    LOG_FORMAT,
    LOG_FORMAT_ENV,
    SANDBOX_HELP,
    SECRETS_HELP,
    TENANTS_HELP,
    TOKENS_HELP,
    Commands,
    SizeType,
    refusing,
    run_to_exit,
    storage_options,
)

commands = Commands("services")

WORKERS_HELP = "Gateway processes serving the HTTP port (default: one a core)."
UP_METRICS_HELP = (
    "The writer's metrics port; the reader, executor, gateway and quill up itself take the "
    "next ones (in DATA/stack.json). 0: free ports."
)
EGRESS_HELP = (
    "Let this tenant's (or workspace's) commands reach these hosts through the executor's "
    "egress proxy (pypi.org, *.pythonhosted.org, host:port; public addresses only; each "
    "connection audited). Repeatable. Default: no network (see docs/executor.md, Egress)."
)
UP_WORKERS_HELP = "Gateway processes serving the HTTP port (default: half the cores)."


METRICS_PORT_HELP = "Serve Prometheus metrics at http://HOST:N/metrics (--metrics-host)."
METRICS_HOST_HELP = "The address --metrics-port listens on (0.0.0.0 in a container)."
_metrics_port_option = click.option(
    "--metrics-port", type=click.IntRange(0, 65535), help=METRICS_PORT_HELP
)
_metrics_host_option = click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help=METRICS_HOST_HELP
)

_nats_url_option = click.option(
    "--nats-url",
    "service_nats_url",
    envvar="QUILL_NATS_URL",
    default="nats://127.0.0.1:4222",
    show_default=True,
)


def service_options(fn: Callable[..., None]) -> Callable[..., None]:
    """The options of every service that keeps a projection (``_settings`` reads them)."""
    for option in reversed(
        [
            _nats_url_option,
            click.option(
                "--data",
                type=click.Path(path_type=Path),
                required=True,
                help="Directory for this service's projection.",
            ),
            _metrics_port_option,
            _metrics_host_option,
            click.option("--root", default="ws", show_default=True, help="Subject root."),
            click.option(
                "--replicas",
                default=1,
                show_default=True,
                help="JetStream replicas for the streams it creates.",
            ),
            click.option(
                "--projection-rows",
                type=click.IntRange(min=1),
                default=PROJECTION_ROWS,
                show_default=True,
                envvar="QUILL_PROJECTION_ROWS",
                help="Workspace rows its projection holds in memory; past it the least "
                "recently used is dropped (and read again from the projection when next used).",
            ),
            LOG_FORMAT,
        ]
    ):
        fn = option(fn)
    return fn


def _settings(ctx: click.Context, options: dict[str, Any]) -> Settings:
    """Logging as ``--log-level`` and ``--log-format`` say; the settings ``service_options``
    give."""
    setup_logging(ctx.obj["log_level"], options["log_format"])
    return Settings(
        nats_url=options["service_nats_url"],
        data_dir=options["data"],
        root=options["root"],
        replicas=options["replicas"],
        metrics_port=options["metrics_port"],
        metrics_host=options["metrics_host"],
        projection_rows=options["projection_rows"],
    )


def _serve(start: Callable[[], Awaitable[Any]]) -> None:
    """Run the service ``start()`` starts until SIGINT or SIGTERM, then its ``stop()``; a start
    refused is one line on stderr and a non-zero exit (``run_to_exit``)."""

    async def started() -> Callable[[], Awaitable[None]]:
        return (await start()).stop  # type: ignore[no-any-return]

    run_to_exit(run_until_stopped(started))


@commands.command()
@service_options
@click.option(
    "--snapshot-events",
    envvar="QUILL_SNAPSHOT_EVENTS",
    default=20_000,
    show_default=True,
    help="Snapshot the projection into WS_SNAPSHOTS once this many events were applied since "
    "the newest snapshot (one replica makes it). 0: this replica makes none unless asked.",
)
@click.option(
    "--snapshot-minutes",
    envvar="QUILL_SNAPSHOT_MINUTES",
    default=30.0,
    show_default=True,
    help="... or once the newest snapshot is this old and events came since.",
)
@click.option(
    "--snapshot-keep",
    envvar="QUILL_SNAPSHOT_KEEP",
    default=3,
    show_default=True,
    help="Snapshots kept (the oldest deleted when one is made).",
)
@click.option(
    "--snapshot-behind",
    envvar="QUILL_SNAPSHOT_BEHIND",
    default=20_000,
    show_default=True,
    help="Start from the newest snapshot when the local projection is missing or more than "
    "this many events behind it. 0: always replay the log.",
)
@click.pass_context
def reader(
    ctx: click.Context,
    /,
    snapshot_events: int,
    snapshot_minutes: float,
    snapshot_keep: int,
    snapshot_behind: int,
    **options: Any,
) -> None:
    """Run a reader replica (answers as of any version)."""
    from services.reader.app import start_reader
    from services.reader.snapshots import SnapshotConfig

    if min(snapshot_events, snapshot_behind) < 0 or snapshot_minutes <= 0 or snapshot_keep < 1:
        click.echo(
            "quill: --snapshot-events and --snapshot-behind must be >= 0, --snapshot-minutes "
            "> 0, --snapshot-keep >= 1",
            err=True,
        )
        sys.exit(2)
    settings = _settings(ctx, options)
    snapshots = SnapshotConfig(
        every_events=snapshot_events,
        every_s=snapshot_minutes * 60,
        keep=snapshot_keep,
        behind=snapshot_behind,
    )
    private.umask("reader")
    _serve(lambda: start_reader(settings, snapshots))


@commands.command()
@service_options
@click.option(
    "--partitions",
    default=0,
    show_default=True,
    help="On a cluster: the number of command partitions (as in the NATS servers' subject "
    "mapping); the writer leases its share of them. 0: serve every command (one writer).",
)
@click.option(
    "--lease-ttl",
    default=5.0,
    show_default=True,
    help="Seconds a partition lease lives unrenewed: how soon another writer takes over "
    "when this one dies.",
)
@click.option(
    "--max-queued",
    type=click.IntRange(min=1),
    default=WRITER_MAX_QUEUED,
    show_default=True,
    help="Commands held (queued, deciding, appending) at once, all workspaces together; "
    "past it a command is answered busy (docs/operations.md, Overload).",
)
@click.option(
    "--max-queued-bytes",
    type=click.IntRange(min=1),
    default=WRITER_MAX_QUEUED_BYTES,
    show_default=True,
    help="Bytes of the requests of those commands.",
)
@click.option(
    "--max-queued-per-workspace",
    type=click.IntRange(min=1),
    default=WRITER_MAX_QUEUED_PER_WORKSPACE,
    show_default=True,
    help="Commands one workspace holds at once (queued, deciding, appending).",
)
@click.option(
    "--max-waiting-per-workspace",
    type=click.IntRange(min=1),
    default=WRITER_MAX_WAITING_PER_WORKSPACE,
    show_default=True,
    help="Commands one workspace holds waiting for its lock or their approval.",
)
@click.option(
    "--snapshot-behind",
    envvar="QUILL_WRITER_SNAPSHOT_BEHIND",
    default=0,
    show_default=True,
    help="A writer with no projection starts from the newest reader snapshot if it covers "
    "more than this many events. 0: never (it loads each workspace from its own log when "
    "first used, which is faster unless single workspaces have very long logs).",
)
@click.option(
    "--max-workspaces",
    default=WRITER_WORKSPACES,
    show_default=True,
    envvar="QUILL_WRITER_WORKSPACES",
    help="Workspaces held in memory; past it the least recently used idle one is dropped "
    "(and loaded again from the projection when next used).",
)
@click.pass_context
def writer(
    ctx: click.Context,
    /,
    partitions: int,
    lease_ttl: float,
    max_queued: int,
    max_queued_bytes: int,
    max_queued_per_workspace: int,
    max_waiting_per_workspace: int,
    snapshot_behind: int,
    max_workspaces: int,
    **options: Any,
) -> None:
    """Run a writer (validates and commits mutations)."""
    from services.writer.app import start_writer
    from services.writer.config import WriterConfig

    if partitions < 0 or lease_ttl < 2 or snapshot_behind < 0 or max_workspaces < 1:
        click.echo(
            "quill: --partitions must be >= 0, --lease-ttl >= 2, --snapshot-behind >= 0 and "
            "--max-workspaces >= 1",
            err=True,
        )
        sys.exit(2)
    settings = _settings(ctx, options)
    config = WriterConfig(
        partitions=partitions,
        lease_ttl=lease_ttl,
        max_queued=max_queued,
        max_queued_bytes=max_queued_bytes,
        max_queued_per_workspace=max_queued_per_workspace,
        max_waiting_per_workspace=max_waiting_per_workspace,
        snapshot_behind=snapshot_behind,
        max_workspaces=max_workspaces,
    )
    private.umask("writer")
    _serve(lambda: start_writer(settings, config))


@commands.command()
@service_options
@click.option("--sandbox", type=click.Choice(["bwrap", "local"]), help=SANDBOX_HELP)
@click.option("--max-runs", default=4, show_default=True, help="Requests run at once.")
@click.option(
    "--memory-mb", default=4096, show_default=True, help="Memory (data segment) per command."
)
@click.option("--processes", default=512, show_default=True, help="Processes per command.")
@click.option(
    "--tenant-runs",
    type=click.IntRange(min=1),
    help="Most requests one tenant runs at once. Default: --max-runs minus 1 (see "
    "docs/executor.md, fair share).",
)
@click.option(
    "--queue", default=16, show_default=True, help="Requests waiting for a slot, per tenant."
)
@click.option(
    "--queue-wait", default=120.0, show_default=True, help="Seconds a request waits for a slot."
)
@click.option(
    "--checkouts-budget-mb",
    default=16384,
    show_default=True,
    help="Disk for all checkouts, running commands' included; past it, idle ones are evicted "
    "(least recently used first) and a command growing past what the others leave is stopped.",
)
@click.option(
    "--max-checkout-mb",
    type=click.IntRange(min=1),
    help="The most disk one checkout may hold, whatever its workspace's max_checkout_bytes "
    "says. Default: --checkouts-budget-mb.",
)
@click.option(
    "--disk-reserve-mb",
    type=click.IntRange(min=0),
    help="Free space kept on the data disk: below it, new commands are refused. "
    "Default: max(1 GiB, 5% of the disk).",
)
@click.option(
    "--overlay/--no-overlay",
    default=True,
    show_default=True,
    help="bwrap: run each command over an overlay of its checkout, so that what it changed "
    "is found without walking the checkout (root only; see docs/executor.md, Change capture).",
)
@click.option(
    "--git-credentials",
    type=click.Path(path_type=Path, dir_okay=False),
    help="TOML file of git credentials for push/pull/clone (see docs/executor.md).",
)
@click.option(
    "--git-allow",
    multiple=True,
    metavar="HOST[:PORT]",
    help="Let git reach this remote though it is not public: an internal server's name, "
    "address or CIDR network. Repeatable (see docs/executor.md).",
)
@click.option(
    "--egress-allow",
    multiple=True,
    metavar="TENANT[/WORKSPACE]=HOST,...",
    help=EGRESS_HELP,
)
@click.pass_context
def executor(
    ctx: click.Context,
    /,
    sandbox: str | None,
    max_runs: int,
    memory_mb: int,
    processes: int,
    tenant_runs: int | None,
    queue: int,
    queue_wait: float,
    checkouts_budget_mb: int,
    max_checkout_mb: int | None,
    disk_reserve_mb: int | None,
    overlay: bool,
    git_credentials: Path | None,
    git_allow: tuple[str, ...],
    egress_allow: tuple[str, ...],
    **options: Any,
) -> None:
    """Run an executor (commands and git in a sandbox; their changes become events)."""
    from infra.exec.egress import Rules
    from infra.exec.git.targets import Targets
    from services.executor.app import ExecutorConfig, start_executor

    with refusing():
        Targets().allowing(git_allow)
        Rules.parse(egress_allow)

    settings = _settings(ctx, options)
    config = ExecutorConfig(
        sandbox=sandbox,
        max_runs=max_runs,
        memory_bytes=memory_mb * 1024 * 1024,
        processes=processes,
        tenant_runs=tenant_runs,
        queue=queue,
        queue_wait_s=queue_wait,
        checkouts_budget=checkouts_budget_mb * 1024 * 1024,
        max_checkout_bytes=None if max_checkout_mb is None else max_checkout_mb * 1024 * 1024,
        disk_reserve=None if disk_reserve_mb is None else disk_reserve_mb * 1024 * 1024,
        credentials=git_credentials,
        git_allow=git_allow,
        egress_allow=egress_allow,
        overlay=overlay,
    )

    private.umask("executor")  # what it writes for commands, the sandbox's user reads
    _serve(lambda: start_executor(settings, config))


@commands.command()
@_nats_url_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--http-port", default=8080, show_default=True, help="0 picks a free port.")
@click.option("--tokens", type=click.Path(path_type=Path, dir_okay=False), help=TOKENS_HELP)
@click.option("--root", default="ws", show_default=True, help="Subject root.")
@LOG_FORMAT
@click.option("--workers", type=click.IntRange(min=1), help=WORKERS_HELP)
@click.option(
    "--max-inflight",
    type=click.IntRange(min=1),
    default=GATEWAY_MAX_INFLIGHT,
    show_default=True,
    help="HTTP requests each worker serves at once; past it a request is answered busy "
    "(503 with Retry-After; docs/operations.md, Overload).",
)
@click.option(
    "--max-streams",
    type=click.IntRange(min=1),
    default=GATEWAY_STREAMS_PER_PRINCIPAL,
    show_default=True,
    help="Live streams (server-sent events: the console's live pages) each token keeps open "
    "at once on each worker; past it 429 with Retry-After. Streams take no request slot "
    "(docs/gateway.md, Streams).",
)
@click.option(
    "--operator-tool",
    "operator_tools",
    multiple=True,
    help="Offer this operators' tool at /mcp too (archive_workspace): by default no model is "
    "offered one (docs/gateway.md, Operator tools). Repeat for more.",
)
@_metrics_port_option
@_metrics_host_option
@click.pass_context
def gateway(
    ctx: click.Context,
    service_nats_url: str,
    host: str,
    http_port: int,
    tokens: Path | None,
    root: str,
    log_format: str,
    workers: int | None,
    max_inflight: int,
    max_streams: int,
    operator_tools: tuple[str, ...],
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run the HTTP gateway: MCP at /mcp, WAP at /mcp/wap, REST at /v1/host/workspace."""
    from infra.http.workers import default_count
    from services.gateway.access import Tokens
    from services.gateway.server import GatewayConfig, start_gateway

    setup_logging(ctx.obj["log_level"], log_format)
    with refusing():
        config = GatewayConfig(
            service_nats_url,
            host=host,
            port=http_port,
            tokens=Tokens.load(tokens) if tokens else None,
            root=root,
            workers=workers or default_count(),
            max_inflight=max_inflight,
            max_streams=max_streams,
            settle_heap=True,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            operator_tools=operator_tools,
        )
        config.check()
    private.umask("gateway")
    try:
        _serve(lambda: start_gateway(config))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        click.echo(f"quill: cannot listen on {host}:{http_port}: {reason}", err=True)
        sys.exit(1)


@commands.command()
@click.option("--data", type=click.Path(path_type=Path), default=Path(".quill"), show_default=True)
@click.option("--nats-port", default=4222, show_default=True, help="0 picks a free port.")
@click.option("--http-port", default=8080, show_default=True, help="0 picks a free port.")
@click.option("--nats-url", "external", help="Use this NATS instead of starting one.")
@click.option("--tokens", type=click.Path(path_type=Path, dir_okay=False), help=TOKENS_HELP)
@click.option("--sandbox", type=click.Choice(["bwrap", "local"]), help=SANDBOX_HELP)
@click.option("--tenants", type=click.Path(path_type=Path, dir_okay=False), help=TENANTS_HELP)
@click.option(
    "--secrets", "secrets_file", type=click.Path(path_type=Path, dir_okay=False), help=SECRETS_HELP
)
@click.option("--gateway-workers", type=click.IntRange(min=1), help=UP_WORKERS_HELP)
@click.option(
    "--egress-allow", multiple=True, metavar="TENANT[/WORKSPACE]=HOST,...", help=EGRESS_HELP
)
@click.option(
    "--nats-memory",
    type=SizeType(),
    help="The NATS server's Go memory limit (GOMEMLIMIT), e.g. 1GiB; 0 for none (default: "
    "400MiB, or $GOMEMLIMIT; a soft limit: docs/operations.md, Memory).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help=UP_METRICS_HELP,
)
@LAUNCHED_LOG_FORMAT
@storage_options
@click.pass_context
def up(
    ctx: click.Context,
    data: Path,
    nats_port: int,
    http_port: int,
    external: str | None,
    tokens: Path | None,
    sandbox: str | None,
    tenants: Path | None,
    secrets_file: Path | None,
    gateway_workers: int | None,
    egress_allow: tuple[str, ...],
    nats_memory: int | None,
    metrics_port: int,
    log_format: str,
    log_max_bytes: int | None,
    disk_reserve: int | None,
) -> None:
    """Start NATS and every service on this machine; Ctrl-C stops them."""
    from infra.exec.egress import Rules
    from quill_cli import tenants as tenancy
    from quill_cli.stack import Stack
    from services.gateway.access import Tokens

    setup_logging(ctx.obj["log_level"], log_format)
    os.environ[LOG_FORMAT_ENV] = log_format  # the services inherit it
    with refusing():  # refuse a bad file here rather than in a child's log
        if tenants is not None:
            if tokens is not None:
                raise ValueError("--tenants holds the gateway's tokens: drop --tokens")
            if external is not None:
                raise ValueError(
                    "--tenants configures the NATS server quill up starts; for your own "
                    "server, see docs/operations.md (quill nats-auth)"
                )
            tenancy.load(tenants)
        if tokens or tenants:
            Tokens.load(tokens or tenants)  # type: ignore[arg-type]
        Rules.parse(egress_allow)
        if secrets_file is not None:  # { env = ... } values too: the services inherit ours
            try:
                secret_registry.load(secrets_file)
            except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise ValueError(f"cannot read secrets file {secrets_file}: {exc}") from None
    stack = Stack(
        data,
        nats_port=nats_port,
        http_port=http_port,
        nats_url=external,
        log_level=ctx.obj["log_level"],
        tokens=tokens,
        sandbox=sandbox,
        tenants=tenants,
        secrets_file=secrets_file,
        gateway_workers=gateway_workers,
        egress_allow=egress_allow,
        metrics_port=metrics_port,
        log_max_bytes=log_max_bytes,
        disk_reserve=disk_reserve,
        nats_memory=nats_memory,
    )
    sys.exit(run_to_exit(stack.run()))
