"""The ``quill`` command line: run the services, and use workspaces as a person would.

Client commands print readable text (``--json`` for scripts) and report a failure as one
line ``quill: CODE: message`` with a non-zero exit status (see ``docs/cli.md``).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import re
import shlex
import sys
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from functools import update_wrapper
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import AuditRecord, WorkspaceUpdated
from contracts.limits import CEILINGS, LimitsPatch
from contracts.paths import display, normalize
from infra import secret_registry
from infra.runtime import (
    Settings,
    run_until_stopped,
    setup_logging,
    start_service,
)
from quill.client import Quill, Workspace
from quill.session import Session

T = TypeVar("T")

EXIT_CODES: dict[str, int] = {
    ErrorCode.INVALID_ARGUMENT: 2,
    ErrorCode.FILE_NOT_FOUND: 3,
    ErrorCode.WORKSPACE_NOT_FOUND: 3,
    ErrorCode.RUN_NOT_FOUND: 3,
    ErrorCode.CONFLICT: 4,
    ErrorCode.ACCESS_DENIED: 5,
    ErrorCode.UNAVAILABLE: 6,
    ErrorCode.TIMEOUT: 6,
    ErrorCode.LOCKED: 7,
    ErrorCode.APPROVAL_REQUIRED: 7,
    ErrorCode.DENIED: 8,
}
"""Exit status by error code; anything else exits 1. 7: someone else must act first (a lock,
an approval: try again, or ``--wait``); 8: an approver said no."""

_json = msgspec.json.Encoder()


def fail(error: QuillError) -> None:
    click.echo(f"quill: {error.code}: {error.message}", err=True)
    sys.exit(EXIT_CODES.get(str(error.code), 1))


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except QuillError as exc:
        fail(exc)
        raise AssertionError from exc  # unreachable: fail() exits
    except KeyboardInterrupt:
        sys.exit(130)


def run_to_exit(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` for the commands that run services: a start refused (a
    ``QuillError``, or a ``RuntimeError`` such as a partition count the deployment does not
    have or a data directory in use) is one line on stderr and a non-zero exit."""
    try:
        return asyncio.run(coro)
    except QuillError as exc:
        fail(exc)
        raise AssertionError from exc  # unreachable: fail() exits
    except RuntimeError as exc:
        click.echo(f"quill: {exc}", err=True)
        sys.exit(1)


def emit(ctx: click.Context, result: Any, human: str | Callable[[], str | None]) -> None:
    """Print ``result`` as JSON with ``--json``, else the human text."""
    if ctx.obj["json"]:
        click.echo(_json.encode(result).decode())
        return
    text = human if isinstance(human, str) else human()
    if text is not None:
        click.echo(text)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration(text: str) -> timedelta:
    """``500ms``, ``30s``, ``2m``, ``1h``, ``1d`` (``1.5s`` too) as a ``timedelta``.

    Raises:
        ValueError: anything else (a bare number is refused: seconds or milliseconds?).
    """
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"Bad duration {text!r}: use 500ms, 30s, 2m or 1h")
    return timedelta(milliseconds=float(match.group(1)) * _UNIT_MS[match.group(2)])


class Duration(click.ParamType[int]):
    """A click option taking ``500ms``, ``30s``, ``2m``...: its value in milliseconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return int(parse_duration(str(value)) / timedelta(milliseconds=1))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()


def size_text(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--nats-url", envvar="QUILL_NATS_URL", help="NATS URL (default: the local quill up).")
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
@click.option("--actor", envvar="QUILL_ACTOR", help="Who you are, recorded in events and audit.")
@click.option("--log-level", default="info", show_default=True, help="Service log level.")
@click.option(
    "--nats-user", help="NATS user, as $QUILL_NATS_USER (password: $QUILL_NATS_PASSWORD)."
)
@click.option("--nats-nkey", help="File holding an nkey seed (as $QUILL_NATS_NKEY).")
@click.option("--inbox-prefix", help="Inbox prefix for replies (as $QUILL_NATS_INBOX).")
@click.option(
    "--session",
    envvar="QUILL_SESSION",
    help="The session you act for (Ws-Session): it holds the locks you take.",
)
@click.option(
    "--wait",
    "wait_ms",
    type=DURATION,
    default="0s",
    help="Changes wait this long (500ms, 30s, 2m) for another session's lock or for their "
    "approval, instead of failing with LOCKED or APPROVAL_REQUIRED.",
)
@click.option(
    "--run",
    envvar="QUILL_RUN",
    help="Act within this run (Ws-Run): queries read the version it is pinned to.",
)
@click.version_option(package_name="quill")
@click.pass_context
def main(
    ctx: click.Context,
    nats_url: str | None,
    as_json: bool,
    actor: str | None,
    log_level: str,
    nats_user: str | None,
    nats_nkey: str | None,
    inbox_prefix: str | None,
    session: str | None,
    wait_ms: int,
    run: str | None,
) -> None:
    """Quill: shared, versioned, audited workspaces for agents, on NATS."""
    # Credentials travel in the environment, where every Quill process (and the services
    # a command starts) reads them; a password never goes on the command line.
    for name, value in (
        ("QUILL_NATS_USER", nats_user),
        ("QUILL_NATS_NKEY", nats_nkey),
        ("QUILL_NATS_INBOX", inbox_prefix),
    ):
        if value:
            os.environ[name] = value
    ctx.ensure_object(dict)
    ctx.obj.update(
        nats_url=nats_url,
        json=as_json,
        actor=actor or "cli",
        log_level=log_level,
        session=session or None,
        wait_ms=wait_ms,
        run=run or None,
    )


async def connect(ctx: click.Context) -> Quill:
    """A client as the global options say (actor, session, run, wait).

    Raises:
        QuillError: ``UNAVAILABLE`` if NATS cannot be reached.
    """
    obj = ctx.obj
    return await Quill.connect(
        obj["nats_url"],
        actor=obj["actor"],
        session=obj["session"],
        run=obj["run"],
        wait_ms=obj["wait_ms"],
    )


def workspace_command(
    fn: Callable[..., Awaitable[None]],
) -> Callable[..., None]:
    """Decorate ``async fn(ctx, ws, ...)``: connect, resolve ``WORKSPACE``, report errors."""

    def command(ctx: click.Context, /, workspace: str, **kwargs: Any) -> None:
        async def go() -> None:
            quill = await connect(ctx)
            try:
                await fn(ctx, quill.workspace(workspace), **kwargs)
            finally:
                await quill.close()

        _run(go())

    update_wrapper(command, fn)
    return click.argument("workspace")(click.pass_context(command))


# ---------------------------------------------------------------- services


def _settings(
    nats_url: str, data: Path, metrics_port: int | None, root: str, replicas: int
) -> Settings:
    return Settings(
        nats_url=nats_url, data_dir=data, root=root, replicas=replicas, metrics_port=metrics_port
    )


def service_options(fn: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(
        [
            click.option(
                "--nats-url",
                "service_nats_url",
                envvar="QUILL_NATS_URL",
                default="nats://127.0.0.1:4222",
                show_default=True,
            ),
            click.option(
                "--data",
                type=click.Path(path_type=Path),
                required=True,
                help="Directory for this service's projection.",
            ),
            click.option("--metrics-port", type=int, help="Serve Prometheus metrics on this port."),
            click.option("--root", default="ws", show_default=True, help="Subject root."),
            click.option(
                "--replicas",
                default=1,
                show_default=True,
                help="JetStream replicas for the streams it creates.",
            ),
            click.option("--log-format", type=click.Choice(["text", "json"]), default="text"),
        ]
    ):
        fn = option(fn)
    return fn


SERVICES = {
    "reader": (
        "services.reader.app",
        "Reader",
        "Run a reader replica (answers as of any version).",
    ),
}


def _service_command(name: str, module: str, attr: str, doc: str) -> click.Command:
    @service_options
    @click.pass_context
    def command(
        ctx: click.Context,
        service_nats_url: str,
        data: Path,
        metrics_port: int | None,
        root: str,
        replicas: int,
        log_format: str,
    ) -> None:
        factory = getattr(importlib.import_module(module), attr)
        setup_logging(ctx.obj["log_level"], log_format)
        settings = _settings(service_nats_url, data, metrics_port, root, replicas)

        async def start() -> Callable[[], Awaitable[None]]:
            return (await start_service(settings, name, factory)).stop

        run_to_exit(run_until_stopped(start))

    return click.command(name=name, help=doc)(command)


for _name, (_module, _attr, _doc) in SERVICES.items():
    main.add_command(_service_command(_name, _module, _attr, _doc))


@main.command()
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
@click.pass_context
def writer(
    ctx: click.Context,
    service_nats_url: str,
    data: Path,
    metrics_port: int | None,
    root: str,
    replicas: int,
    log_format: str,
    partitions: int,
    lease_ttl: float,
) -> None:
    """Run a writer (validates and commits mutations)."""
    from services.writer.app import Writer

    if partitions < 0 or lease_ttl < 2:
        click.echo("quill: --partitions must be >= 0 and --lease-ttl >= 2", err=True)
        sys.exit(2)
    setup_logging(ctx.obj["log_level"], log_format)
    settings = _settings(service_nats_url, data, metrics_port, root, replicas)
    settings.extra.update(partitions=str(partitions), lease_ttl=str(lease_ttl))

    async def start() -> Callable[[], Awaitable[None]]:
        return (await start_service(settings, "writer", Writer)).stop

    run_to_exit(run_until_stopped(start))


SANDBOX_HELP = "bwrap (bubblewrap), or local (a plain process: no isolation). Default: bwrap \
if it works here, else local, with a warning."


@main.command()
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
    help="Disk for checkouts; past it, idle ones are evicted (least recently used first).",
)
@click.option(
    "--disk-reserve-mb",
    type=click.IntRange(min=0),
    help="Free space kept on the data disk: below it, new commands are refused. "
    "Default: max(1 GiB, 5% of the disk).",
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
@click.pass_context
def executor(
    ctx: click.Context,
    service_nats_url: str,
    data: Path,
    metrics_port: int | None,
    root: str,
    replicas: int,
    log_format: str,
    sandbox: str | None,
    max_runs: int,
    memory_mb: int,
    processes: int,
    tenant_runs: int | None,
    queue: int,
    queue_wait: float,
    checkouts_budget_mb: int,
    disk_reserve_mb: int | None,
    git_credentials: Path | None,
    git_allow: tuple[str, ...],
) -> None:
    """Run an executor (commands and git in a sandbox; their changes become events)."""
    from infra.exec.git.targets import Targets
    from services.executor.app import ExecutorConfig, start_executor

    try:
        Targets().allowing(git_allow)
    except ValueError as exc:
        click.echo(f"quill: {exc}", err=True)
        sys.exit(2)

    setup_logging(ctx.obj["log_level"], log_format)
    settings = _settings(service_nats_url, data, metrics_port, root, replicas)
    config = ExecutorConfig(
        sandbox=sandbox,
        max_runs=max_runs,
        memory_bytes=memory_mb * 1024 * 1024,
        processes=processes,
        tenant_runs=tenant_runs,
        queue=queue,
        queue_wait_s=queue_wait,
        checkouts_budget=checkouts_budget_mb * 1024 * 1024,
        disk_reserve=None if disk_reserve_mb is None else disk_reserve_mb * 1024 * 1024,
        credentials=git_credentials,
        git_allow=git_allow,
    )

    async def start() -> Callable[[], Awaitable[None]]:
        return (await start_executor(settings, config)).stop

    run_to_exit(run_until_stopped(start))


TOKENS_HELP = 'TOML file of [tokens."<token>"] tables (tenant = "...", workspace = "...").'
TENANTS_HELP = "TOML file of tenants: NATS credentials and gateway tokens (docs/operations.md)."
SECRETS_HELP = "TOML registry of secrets the services redact ($QUILL_SECRETS; see docs/cli.md)."


@main.command()
@click.option(
    "--nats-url",
    "service_nats_url",
    envvar="QUILL_NATS_URL",
    default="nats://127.0.0.1:4222",
    show_default=True,
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--http-port", default=8080, show_default=True, help="0 picks a free port.")
@click.option("--tokens", type=click.Path(path_type=Path, dir_okay=False), help=TOKENS_HELP)
@click.option("--root", default="ws", show_default=True, help="Subject root.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text")
@click.pass_context
def gateway(
    ctx: click.Context,
    service_nats_url: str,
    host: str,
    http_port: int,
    tokens: Path | None,
    root: str,
    log_format: str,
) -> None:
    """Run the HTTP gateway: MCP at /mcp, WAP at /mcp/wap, REST at /v1/host/workspace."""
    from services.gateway.app import GatewayConfig, start_gateway
    from services.gateway.principals import Tokens

    setup_logging(ctx.obj["log_level"], log_format)
    try:
        config = GatewayConfig(
            service_nats_url,
            host=host,
            port=http_port,
            tokens=Tokens.load(tokens) if tokens else None,
            root=root,
        )
        config.check()
    except ValueError as exc:
        click.echo(f"quill: {exc}", err=True)
        sys.exit(2)

    async def start() -> Callable[[], Awaitable[None]]:
        return (await start_gateway(config)).stop

    try:
        run_to_exit(run_until_stopped(start))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        click.echo(f"quill: cannot listen on {host}:{http_port}: {reason}", err=True)
        sys.exit(1)


@main.command()
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
) -> None:
    """Start NATS and every service on this machine; Ctrl-C stops them."""
    from quill_cli import tenants as tenancy
    from quill_cli.stack import Stack
    from services.gateway.principals import Tokens

    setup_logging(ctx.obj["log_level"])
    try:  # refuse a bad file here rather than in a child's log
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
        if secrets_file is not None:  # { env = ... } values too: the services inherit ours
            try:
                secret_registry.load(secrets_file)
            except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise ValueError(f"cannot read secrets file {secrets_file}: {exc}") from None
    except ValueError as exc:
        click.echo(f"quill: {exc}", err=True)
        sys.exit(2)
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
    )
    sys.exit(run_to_exit(stack.run()))


@main.command("nats-auth")
@click.argument("tenants_file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--root", default="ws", show_default=True, help="Subject root.")
def nats_auth(tenants_file: Path, root: str) -> None:
    """Print the nats-server authorization block for TENANTS_FILE (put it in the
    configuration of every server of yours). The services' password is $QUILL_NATS_PASSWORD."""
    from quill_cli import tenants as tenancy

    password = os.environ.get("QUILL_NATS_PASSWORD", "")
    try:
        if len(password) < tenancy.MIN_PASSWORD or not password.isascii():
            raise ValueError(
                "set QUILL_NATS_PASSWORD to the services' password (at least "
                f"{tenancy.MIN_PASSWORD} ASCII characters; never on the command line)"
            )
        block = tenancy.authorization(tenancy.load(tenants_file), password, root)
    except (ValueError, AssertionError) as exc:
        click.echo(f"quill: {exc}", err=True)
        sys.exit(2)
    click.echo(block, nl=False)


# ---------------------------------------------------------------- workspaces


@main.command()
@workspace_command
@click.option("--trust", type=click.Choice(["full", "restricted"]), default="full")
@click.option("--max-file-bytes", type=int)
@click.option("--max-files", type=int)
@click.option("--max-versions", type=int, help="Revisions kept per file (at least; default: all).")
@click.option(
    "--max-checkout-bytes", type=int, help="Disk an executor's checkout of it may hold (4 GiB)."
)
@click.option("--exist-ok", is_flag=True, help="Succeed if it already exists.")
async def create(
    ctx: click.Context,
    ws: Workspace,
    trust: str,
    max_file_bytes: int | None,
    max_files: int | None,
    max_versions: int | None,
    max_checkout_bytes: int | None,
    exist_ok: bool,
) -> None:
    """Create WORKSPACE (tenant/workspace)."""
    limits = LimitsPatch(
        max_file_bytes=max_file_bytes,
        max_files=max_files,
        max_versions=max_versions,
        max_checkout_bytes=max_checkout_bytes,
    )
    r = await ws.create(trust=trust, limits=limits, exist_ok=exist_ok)  # type: ignore[arg-type]
    emit(
        ctx,
        r,
        lambda: (
            f"{'created' if r.created else 'exists:'} {r.tenant}/{r.workspace} (trust {r.trust})"
        ),
    )


async def _read_bounded(ws: Workspace, source: Any) -> bytes:
    """SOURCE's bytes, reading no more than the workspace's ``max_file_bytes`` + 1.

    Raises:
        QuillError: ``SIZE_LIMIT_EXCEEDED`` for a bigger source.
    """
    try:
        most = (await ws.info()).limits.max_file_bytes
    except QuillError:  # the write will say what is wrong; bound the read all the same
        most = CEILINGS.max_file_bytes
    data = bytearray()
    while len(data) <= most:
        chunk = source.read(min(1 << 20, most + 1 - len(data)))
        if not chunk:
            return bytes(data)
        data += chunk
    name = getattr(source, "name", "SOURCE")
    raise QuillError(
        ErrorCode.SIZE_LIMIT_EXCEEDED,
        f"{'stdin' if name == '<stdin>' else name} is over {most} bytes, the largest file "
        f"{ws.tenant}/{ws.name} takes (max_file_bytes): not sent",
        {"max_file_bytes": most},
    )


@main.command()
@workspace_command
@click.argument("path")
@click.argument("source", type=click.File("rb"), required=False)
@click.option("--text", help="Content to write (instead of SOURCE or stdin).")
@click.option("--append", is_flag=True, help="Append instead of overwriting.")
@click.option("--create-only", is_flag=True, help="Fail if the file exists.")
@click.option("--if-match", help="Only if the file's etag is this one.")
async def put(
    ctx: click.Context,
    ws: Workspace,
    path: str,
    source: Any,
    text: str | None,
    append: bool,
    create_only: bool,
    if_match: str | None,
) -> None:
    """Write PATH from SOURCE (a file, or - for stdin), or from --text.

    At most the workspace's max_file_bytes (plus one) is read from SOURCE: a bigger source is
    refused (SIZE_LIMIT_EXCEEDED) without reading the rest."""
    if text is not None:
        content: str | bytes = text
    else:
        content = await _read_bounded(ws, source or sys.stdin.buffer)
    mode = "append" if append else "create" if create_only else "overwrite"
    r = await ws.write(path, content, mode=mode, if_match=if_match)  # type: ignore[arg-type]
    emit(
        ctx,
        r,
        lambda: (
            f"wrote {r.path}: {r.bytes_written} bytes, file version "
            f"{r.file_version}, workspace version {ws.last_version}"
        ),
    )


@main.command()
@workspace_command
@click.argument("path")
@click.option("--version", "at", type=int, help="As of this workspace version.")
@click.option("-n", "--line-numbers", is_flag=True)
@click.option("--head", type=int)
@click.option("--tail", type=int)
@click.option("--offset", type=int, help="First line (1-based).")
@click.option("--limit", type=int, help="Number of lines.")
async def cat(
    ctx: click.Context,
    ws: Workspace,
    path: str,
    at: int | None,
    line_numbers: bool,
    head: int | None,
    tail: int | None,
    offset: int | None,
    limit: int | None,
) -> None:
    """Print PATH (binary files are written as raw bytes)."""
    r = await ws.read(
        path,
        version=at,
        line_numbers=line_numbers,
        head=head,
        tail=tail,
        offset=offset,
        limit=limit,
    )
    if ctx.obj["json"]:
        emit(ctx, r, lambda: None)
    elif r.binary:
        sys.stdout.buffer.write(await ws.read_bytes(path, version=at))
    else:
        click.echo(r.content or "", nl=False)
        if r.truncated:
            click.echo(
                f"\nquill: output truncated ({r.returned_lines} of {r.total_lines} "
                "lines); use --offset/--limit",
                err=True,
            )


@main.command()
@workspace_command
@click.argument("path", default=".")
@click.option("--version", "at", type=int)
@click.option("-l", "long", is_flag=True, help="Long listing.")
@click.option("-R", "--recursive", is_flag=True, help="Everything beneath PATH, by path.")
async def ls(
    ctx: click.Context, ws: Workspace, path: str, at: int | None, long: bool, recursive: bool
) -> None:
    """List a directory (every entry: page after page, as of one version)."""
    entries = [e async for e in ws.list_all(path, recursive=recursive, version=at)]

    def human() -> str:
        lines = []
        for e in entries:
            label = (e.path if recursive else e.name) + ("/" if e.kind == "directory" else "")
            if long:
                stamp = e.modified.strftime("%Y-%m-%d %H:%M")
                fv = f"v{e.file_version}" if e.file_version else "-"
                lines.append(f"{size_text(e.size):>10}  {stamp}  {fv:>5}  {label}")
            else:
                lines.append(label)
        return "\n".join(lines) if lines else f"(empty: {shown})"

    shown = display(normalize(path))  # valid: the listing succeeded
    listing = rp.Listing(path=shown, entries=entries, total=len(entries), truncated=False)
    emit(ctx, listing, human)


@main.command()
@workspace_command
@click.argument("path", default=".")
@click.option("--version", "at", type=int)
async def stat(ctx: click.Context, ws: Workspace, path: str, at: int | None) -> None:
    """Show metadata of a file or directory."""
    r = await ws.stat(path, version=at)
    fields = msgspec.structs.asdict(r)
    emit(ctx, r, lambda: "\n".join(f"{k}: {v}" for k, v in fields.items() if v is not None))


@main.command()
@workspace_command
@click.argument("path")
@click.option("-r", "--recursive", is_flag=True)
@click.option("--if-match")
async def rm(
    ctx: click.Context, ws: Workspace, path: str, recursive: bool, if_match: str | None
) -> None:
    """Delete a file (or a directory with -r)."""
    r = await ws.delete(path, recursive=recursive, if_match=if_match)
    emit(
        ctx,
        r,
        lambda: f"deleted {r.path} ({r.deleted} entries), workspace version {ws.last_version}",
    )


@main.command()
@workspace_command
@click.argument("source")
@click.argument("destination")
@click.option("--overwrite", is_flag=True)
async def mv(
    ctx: click.Context, ws: Workspace, source: str, destination: str, overwrite: bool
) -> None:
    """Move or rename a file or directory."""
    r = await ws.move(source, destination, overwrite=overwrite)
    emit(
        ctx,
        r,
        lambda: (
            f"moved {r.path} -> {r.to} ({r.moved} entries), workspace version {ws.last_version}"
        ),
    )


@main.command()
@workspace_command
@click.argument("path")
async def mkdir(ctx: click.Context, ws: Workspace, path: str) -> None:
    """Create a directory and its parents."""
    r = await ws.mkdir(path)
    emit(ctx, r, lambda: f"created {', '.join(r.created)}" if r.created else f"exists: {r.path}")


@main.command()
@workspace_command
@click.argument("path")
@click.argument("old")
@click.argument("new")
@click.option("--all", "replace_all", is_flag=True, help="Replace every occurrence.")
@click.option("--if-match", help="Only if the file's etag is this one.")
async def edit(
    ctx: click.Context,
    ws: Workspace,
    path: str,
    old: str,
    new: str,
    replace_all: bool,
    if_match: str | None,
) -> None:
    """Replace the text OLD with NEW in PATH: exactly one occurrence, or every one with --all."""
    r = await ws.edit(path, old, new, replace_all=replace_all, if_match=if_match)
    emit(
        ctx,
        r,
        lambda: (
            f"edited {r.path}: {r.replacements} replaced, {r.lines_changed} lines changed, "
            f"file version {r.file_version}, workspace version {ws.last_version}"
        ),
    )


def _patterns(values: tuple[str, ...], none: bool) -> list[str] | None:
    """``--exclude`` values; none given means the workspace's default exclusions."""
    return [] if none else list(values) or None


@main.command()
@workspace_command
@click.argument("pattern")
@click.argument("path", default=".")
@click.option("-F", "--fixed-strings", "literal", is_flag=True, help="PATTERN is literal text.")
@click.option("-i", "--ignore-case", is_flag=True)
@click.option("-C", "--context", "context_lines", default=0, help="Lines of context.")
@click.option("--include", multiple=True, help="Only files matching this glob (repeatable).")
@click.option("--exclude", multiple=True, help="Leave out paths matching this glob (repeatable).")
@click.option("--no-exclude", is_flag=True, help="Search everything (no default exclusions).")
@click.option("--max-results", type=int, help="Matching lines to show.")
@click.option("--version", "at", type=int, help="As of this workspace version.")
async def grep(
    ctx: click.Context,
    ws: Workspace,
    pattern: str,
    path: str,
    literal: bool,
    ignore_case: bool,
    context_lines: int,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    no_exclude: bool,
    max_results: int | None,
    at: int | None,
) -> None:
    """Lines matching the regular expression PATTERN under PATH (exit status 1: none)."""
    r = await ws.grep(
        pattern,
        path,
        literal=literal,
        ignore_case=ignore_case,
        include=list(include) or None,
        exclude=_patterns(exclude, no_exclude),
        context_lines=context_lines,
        max_results=max_results,
        version=at,
    )

    def human() -> str | None:
        # Like grep: "path:n:text" for a match, "path-n-text" for context, "--" between groups.
        files: dict[str, dict[int, tuple[str, bool]]] = {}
        for m in r.matches:
            numbered = files.setdefault(m.path, {})
            for n, text in enumerate(m.before, m.line - len(m.before)):
                numbered.setdefault(n, (text, False))
            numbered[m.line] = (m.text, True)
            for n, text in enumerate(m.after, m.line + 1):
                numbered.setdefault(n, (text, False))
        lines: list[str] = []
        previous: tuple[str, int] | None = None
        for file, numbered in files.items():
            for n in sorted(numbered):
                text, hit = numbered[n]
                if context_lines and lines and previous != (file, n - 1):
                    lines.append("--")
                mark = ":" if hit else "-"
                lines.append(f"{file}{mark}{n}{mark}{text}")
                previous = (file, n)
        if r.truncated:
            click.echo(
                f"quill: {len(r.matches)} of {r.total} matching lines shown; use --max-results",
                err=True,
            )
        return "\n".join(lines) if lines else None

    emit(ctx, r, human)
    if not r.matches:
        sys.exit(1)


@main.command(name="glob")
@workspace_command
@click.argument("pattern")
@click.argument("path", default=".")
@click.option("--type", "kind", type=click.Choice(["file", "directory", "any"]), default="any")
@click.option("--exclude", multiple=True, help="Leave out paths matching this glob (repeatable).")
@click.option("--no-exclude", is_flag=True, help="Match everything (no default exclusions).")
@click.option("--max-results", type=int)
@click.option("--version", "at", type=int, help="As of this workspace version.")
async def glob_(
    ctx: click.Context,
    ws: Workspace,
    pattern: str,
    path: str,
    kind: str,
    exclude: tuple[str, ...],
    no_exclude: bool,
    max_results: int | None,
    at: int | None,
) -> None:
    """Paths under PATH matching PATTERN (*, **, ?, [abc], {a,b}), newest first."""
    r = await ws.glob(
        pattern,
        path,
        kind=kind,  # type: ignore[arg-type]
        exclude=_patterns(exclude, no_exclude),
        max_results=max_results,
        version=at,
    )

    def human() -> str | None:
        if r.truncated:
            click.echo(f"quill: {len(r.entries)} of {r.total} shown; use --max-results", err=True)
        names = [e.path + ("/" if e.kind == "directory" else "") for e in r.entries]
        return "\n".join(names) if names else None

    emit(ctx, r, human)


@main.command()
@workspace_command
@click.argument("path", default=".")
@click.option("-L", "--depth", "max_depth", default=3, show_default=True, help="Levels to show.")
@click.option("--exclude", multiple=True, help="Leave out paths matching this glob (repeatable).")
@click.option("--no-exclude", is_flag=True, help="Show everything (no default exclusions).")
@click.option("-l", "long", is_flag=True, help="Sizes and modification times.")
@click.option("--max-results", type=int)
@click.option("--version", "at", type=int, help="As of this workspace version.")
async def tree(
    ctx: click.Context,
    ws: Workspace,
    path: str,
    max_depth: int,
    exclude: tuple[str, ...],
    no_exclude: bool,
    long: bool,
    max_results: int | None,
    at: int | None,
) -> None:
    """The tree under PATH, directories first (default exclusions such as .git left out)."""
    r = await ws.explore(
        path,
        recursive=True,
        max_depth=max_depth,
        exclude=_patterns(exclude, no_exclude),
        metadata=long,
        max_results=max_results,
        version=at,
    )

    def human() -> str:
        lines = []
        for e in r.entries:
            name = e.path.rsplit("/", 1)[-1] + ("/" if e.kind == "directory" else "")
            size = f"{size_text(e.size or 0):>10}  " if long else ""
            stamp = f"{e.modified:%Y-%m-%d %H:%M}  " if long and e.modified else ""
            lines.append(f"{size}{stamp}{'  ' * (e.depth - 1)}{name}")
        if r.truncated:
            lines.append(f"... {r.total - len(r.entries)} more")
        return "\n".join(lines) or f"(empty: {r.path or '.'})"

    emit(ctx, r, human)


@main.command()
@workspace_command
@click.argument("from_version", type=int)
@click.argument("to_version", type=int, required=False)
@click.option("--path", help="A file or directory (default: the whole workspace).")
@click.option("-U", "--unified", "context_lines", default=3, show_default=True)
async def diff(
    ctx: click.Context,
    ws: Workspace,
    from_version: int,
    to_version: int | None,
    path: str | None,
    context_lines: int,
) -> None:
    """Unified diff between FROM_VERSION and TO_VERSION (default: the latest)."""
    r = await ws.diff(from_version, to_version, path, context_lines=context_lines)

    def human() -> str | None:
        if r.truncated:
            click.echo("quill: the diff was cut at the read limit; use --path", err=True)
        return r.diff.rstrip("\n") or None

    emit(ctx, r, human)


@main.command()
@workspace_command
@click.argument("version", type=int)
@click.argument("path", required=False)
async def restore(ctx: click.Context, ws: Workspace, version: int, path: str | None) -> None:
    """Bring PATH (default: the whole workspace) back to VERSION, as a new change."""
    r = await ws.restore(version, path)
    what = r.path or "the workspace"

    def human() -> str:
        if not r.committed:
            return f"unchanged: {what} is already as at version {version}"
        more = f" (+{r.changed_total - len(r.changed)})" if r.changed_total > len(r.changed) else ""
        return (
            f"restored {what} to version {version}: {', '.join(r.changed)}{more}; "
            f"workspace version {ws.last_version}"
        )

    emit(ctx, r, human)


@main.command()
@workspace_command
@click.argument("path", required=False)
@click.option("--limit", default=20, show_default=True)
@click.option("--before", type=int, help="Only versions before this one.")
async def history(
    ctx: click.Context, ws: Workspace, path: str | None, limit: int, before: int | None
) -> None:
    """Revisions of PATH, or the workspace's events; newest first."""
    r = await ws.history(path, limit=limit, before=before)

    def human() -> str:
        lines = []
        for v in r.revisions:
            what = v.change if path else f"{v.change} {', '.join(v.paths or [])}"
            extra = f"  {v.size} B  {v.etag}" if v.size is not None else ""
            lines.append(
                f"v{v.version:<5} {v.at:%Y-%m-%d %H:%M:%S}  {v.op:<8} "
                f"{v.actor or '-':<12} {what}{extra}"
            )
        return "\n".join(lines) or "(no history)"

    emit(ctx, r, human)


@main.command(name="log")
@workspace_command
@click.option("--after", default=0, show_default=True, help="Events after this version.")
@click.option("--limit", default=50, show_default=True)
async def log_(ctx: click.Context, ws: Workspace, after: int, limit: int) -> None:
    """Show the workspace's events (oldest first)."""
    r = await ws.events(after=after, limit=limit)

    def human() -> str:
        lines = []
        for e in r.events:
            changes = ", ".join(f"{c.kind} {c.path}" for c in e.changes[:3])
            more = f" (+{e.changes_total - 3})" if e.changes_total > 3 else ""
            lines.append(
                f"v{e.version:<5} seq {e.seq:<6} {e.at:%Y-%m-%d %H:%M:%S} {e.op:<8} "
                f"{e.actor or '-':<10} {changes}{more}  {e.hash[:12]}"
            )
        return "\n".join(lines) or "(no events)"

    emit(ctx, r, human)


def _changes_note(changes: rp.CapturedChanges | None) -> None:
    """What a command did to the workspace, on stderr (stdout is the command's)."""
    if changes is None:
        return
    if changes.committed:
        click.echo(
            f"quill: committed {changes.total} path(s) as version {changes.version}", err=True
        )
    for conflict in changes.conflicts:
        click.echo(f"quill: not committed: {conflict.path}: {conflict.reason}", err=True)
    for skipped in changes.skipped:
        click.echo(f"quill: not committed: {skipped.path} ({skipped.reason})", err=True)
    if changes.error:
        click.echo(f"quill: nothing committed: {changes.error}", err=True)


@main.command(name="exec")
@workspace_command
@click.option("-C", "--workdir", default="", help="Working directory in the workspace.")
@click.option("-t", "--timeout", "timeout_s", type=float, help="Seconds (default 30).")
@click.option("-e", "--env", multiple=True, help="NAME=VALUE for the command (repeatable).")
@click.option("--version", "at", type=int, help="Run against this workspace version.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
async def exec_(
    ctx: click.Context,
    ws: Workspace,
    workdir: str,
    timeout_s: float | None,
    env: tuple[str, ...],
    at: int | None,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND in the workspace's sandbox (after --), streaming its output; exit with its
    status. One argument is a shell line; several are words, quoted for the shell."""
    line = command[0] if len(command) == 1 else shlex.join(command)
    variables: dict[str, str] = {}
    for item in env:
        name, sep, value = item.partition("=")
        if not sep:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Bad --env {item!r}: use NAME=VALUE")
        variables[name] = value
    as_json = ctx.obj["json"]

    shown = {"stdout": 0, "stderr": 0}

    def live(stream: str, chunk: bytes) -> None:
        shown[stream] += len(chunk)
        out = sys.stdout.buffer if stream == "stdout" else sys.stderr.buffer
        out.write(chunk)
        out.flush()

    r = await ws.exec(
        line,
        workdir=workdir,
        timeout_ms=int(timeout_s * 1000) if timeout_s is not None else None,
        env=variables or None,
        version=at,
        on_output=None if as_json else live,
    )
    if as_json:
        emit(ctx, r, lambda: None)
    else:
        if r.timed_out:
            click.echo(f"quill: timed out after {r.duration_ms / 1000:.1f}s", err=True)
        _exec_notes(r, shown, f"{ws.tenant}/{ws.name}")
        _changes_note(r.changes)
    sys.exit(min(r.exit_code, 255))


def _exec_notes(r: rp.CommandResult, shown: dict[str, int], workspace: str) -> None:
    """What the live output did not show (past what is streamed), and what the command left
    running or tried to read."""
    for stream, total in (("stdout", r.stdout_bytes), ("stderr", r.stderr_bytes)):
        if shown[stream] < total:
            how = (
                f"quill output {workspace} {r.command_id} --stream {stream} "
                f"--offset {shown[stream]}"
                if r.output_kept
                else "it was not kept"
            )
            click.echo(
                f"quill: {stream}: {total - shown[stream]} bytes past the first "
                f"{shown[stream]} were not streamed; the rest: {how}",
                err=True,
            )
    if r.background_killed:
        n = r.background_killed
        click.echo(
            f"quill: the command left {n} process{'' if n == 1 else 'es'} running in the "
            "background, killed when it ended",
            err=True,
        )
    if r.stdin_read:
        click.echo(
            "quill: the command read its standard input, which is closed (end of file)",
            err=True,
        )


@main.command(name="output")
@workspace_command
@click.argument("command_id")
@click.option(
    "--stream", type=click.Choice(["stdout", "stderr"]), default="stdout", show_default=True
)
@click.option("--offset", type=click.IntRange(min=0), default=0, help="First byte (default 0).")
@click.option("--length", type=click.IntRange(min=1), help="Most bytes (default: to the end).")
async def output(
    ctx: click.Context,
    ws: Workspace,
    command_id: str,
    stream: str,
    offset: int,
    length: int | None,
) -> None:
    """Print the kept output of command COMMAND_ID (its id: `quill exec --json`, or the note
    `quill exec` prints past what it streamed), from --offset. Output is kept an hour after
    the command ended. With --json: one page (64 KiB unless --length) as JSON."""
    which: rq.OutputStream = "stderr" if stream == "stderr" else "stdout"
    if ctx.obj["json"]:
        page = await ws.command_output(
            command_id, stream=which, offset=offset, length=min(length or 65536, 1024**2)
        )
        emit(ctx, page, lambda: None)
        return
    end = None if length is None else offset + length
    while end is None or offset < end:
        size = 1024**2 if end is None else min(end - offset, 1024**2)
        page = await ws.command_output(command_id, stream=which, offset=offset, length=size)
        sys.stdout.write(page.text)
        offset += page.length
        if not page.more or not page.length:
            break
    sys.stdout.flush()


@main.command()
@workspace_command
@click.argument(
    "action",
    type=click.Choice(
        ["status", "diff", "commit", "checkout", "branch", "log", "push", "pull", "clone"]
    ),
)
@click.option("-C", "--workdir", default="", help="The repository's directory.")
@click.option("-m", "--message", help="commit: the message.")
@click.option("-f", "--file", "files", multiple=True, help="commit: stage only these paths.")
@click.option("-b", "--branch", help="checkout/push/pull: the branch.")
@click.option("--remote", default="origin", show_default=True)
@click.option("--url", help="clone: the repository to clone.")
@click.option("--path", help="diff/log: only this path.")
@click.option("-n", "--limit", default=20, show_default=True, help="log: commits.")
async def git(
    ctx: click.Context,
    ws: Workspace,
    action: str,
    workdir: str,
    message: str | None,
    files: tuple[str, ...],
    branch: str | None,
    remote: str,
    url: str | None,
    path: str | None,
    limit: int,
) -> None:
    """Run a git ACTION on the repository in the workspace (its .git is versioned too)."""
    r = await ws.git(
        action,  # type: ignore[arg-type]
        workdir=workdir,
        message=message,
        files=list(files) or None,
        branch=branch,
        remote=remote,
        url=url,
        path=path,
        limit=limit,
    )

    def human() -> str | None:
        if r.status is not None:
            st = r.status
            track = f" ({st.upstream}: +{st.ahead} -{st.behind})" if st.upstream else ""
            lines = [f"## {st.branch or '(detached)'}{track}"]
            lines += [f"staged    {f.status:<12} {f.path}" for f in st.staged]
            lines += [f"unstaged  {f.status:<12} {f.path}" for f in st.unstaged]
            lines += [f"untracked {'':<12} {p}" for p in st.untracked]
            return "\n".join(lines)
        if r.log is not None:
            return "\n".join(
                f"{c.sha[:10]} {c.at:%Y-%m-%d %H:%M} {c.author:<12} {c.subject}" for c in r.log
            )
        if r.branches is not None:
            return "\n".join(("* " if b == r.branch else "  ") + b for b in r.branches)
        if r.commit is not None:
            return f"[{r.branch or 'detached'} {r.commit[:10]}] {message or ''}".rstrip()
        return r.output.rstrip("\n") or None

    emit(ctx, r, human)
    if not ctx.obj["json"]:
        if r.output_truncated:
            click.echo("quill: output truncated", err=True)
        _changes_note(r.changes)


def _since(value: str | None) -> datetime | None:
    if value is None:
        return None
    if _DURATION.fullmatch(value):
        return datetime.now(UTC) - parse_duration(value)
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT, f"Bad --since {value!r}: use 10m or ISO time"
        ) from None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


RETRY_FIRST_S, RETRY_MOST_S = 0.5, 15.0
"""A follower's reconnection attempts: 0.5 s apart at first, doubling up to 15 s."""


async def _follow(
    ctx: click.Context, ws: Workspace, stream: AsyncIterator[T], line: Callable[[T], str]
) -> None:
    """Print each item of ``stream`` until Ctrl-C. While NATS is away, say so once, retry
    with backoff (``RETRY_FIRST_S`` doubling to ``RETRY_MOST_S``) and say once when it is back;
    the client's own log lines (one per failed attempt) are kept off the terminal."""
    nc = ws.client.nc
    quiet = logging.getLogger("quill.bus")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)

    where = nc.connected_url.netloc if nc.connected_url else "?"

    async def watch_connection() -> None:
        wait, lost_at, bumped_at = RETRY_FIRST_S, 0.0, 0.0
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0.2)
            now = loop.time()
            if nc.is_connected:
                if lost_at:
                    click.echo("quill: connected to NATS again", err=True)
                    wait, lost_at = RETRY_FIRST_S, 0.0
                    nc.options["reconnect_time_wait"] = wait
                continue
            if not lost_at:
                lost_at = bumped_at = now
                click.echo(
                    f"quill: lost the connection to NATS ({where}); retrying until it is back "
                    "(Ctrl-C to stop)",
                    err=True,
                )
            elif now - bumped_at >= wait and wait < RETRY_MOST_S:
                wait, bumped_at = min(wait * 2, RETRY_MOST_S), now
                nc.options["reconnect_time_wait"] = wait

    monitor = asyncio.create_task(watch_connection())
    try:
        async for item in stream:
            emit(ctx, item, line(item))
    finally:
        monitor.cancel()
        quiet.setLevel(level)


def _audit_line(rec: AuditRecord) -> str:
    code = f" {rec.error_code}" if rec.error_code else ""
    return (
        f"{rec.at:%Y-%m-%d %H:%M:%S.%f} {rec.kind}.{rec.op:<10} {rec.outcome}{code} "
        f"{rec.duration_ms:.1f}ms v{rec.version or '-'} {rec.actor or '-'} "
        f"{' '.join(rec.paths)}"
    )


def _update_line(update: WorkspaceUpdated) -> str:
    more = update.paths_total - len(update.paths)
    line = f"v{update.version} {update.op} by {update.actor or '-'}: {', '.join(update.paths)}"
    return line + (f" (+{more})" if more > 0 else "")


@main.command()
@workspace_command
@click.option("--follow", "-f", is_flag=True, help="Keep printing new records.")
@click.option("--since", help="Start at this time (ISO 8601) or this long ago (30s, 10m, 2h).")
async def audit(ctx: click.Context, ws: Workspace, follow: bool, since: str | None) -> None:
    """Print the workspace's audit records."""
    records = ws.audit(since=_since(since), follow=follow)
    if follow:
        await _follow(ctx, ws, records, _audit_line)
        return
    async for rec in records:
        emit(ctx, rec, _audit_line(rec))


@main.command()
@workspace_command
@click.option(
    "--wait",
    is_flag=True,
    help="Wait for a workspace that does not exist yet (else: WORKSPACE_NOT_FOUND, exit 3).",
)
async def watch(ctx: click.Context, ws: Workspace, wait: bool) -> None:
    """Print workspace.updated notifications as they happen (Ctrl-C to stop)."""
    if wait:
        try:
            await ws.stat(".")
        except QuillError as exc:
            if exc.code != ErrorCode.WORKSPACE_NOT_FOUND:
                raise
            click.echo(f"quill: waiting for {ws.tenant}/{ws.name} to be created", err=True)
    await _follow(ctx, ws, ws.watch(wait=wait), _update_line)


@main.command()
@workspace_command
@click.option("--version", "at", type=int)
async def info(ctx: click.Context, ws: Workspace, at: int | None) -> None:
    """Show the workspace's version, limits and counters."""
    r: rp.WorkspaceInfo = await ws.info(version=at)
    emit(
        ctx,
        r,
        lambda: "\n".join(
            [
                f"workspace: {r.tenant}/{r.workspace}",
                f"version: {r.version}",
                f"trust: {r.trust}",
                f"files: {r.files}  directories: {r.directories}  bytes: {r.total_bytes}",
                f"created: {r.created}",
                f"updated: {r.updated}",
                f"tree hash: {r.tree_hash}",
                "limits: "
                + ", ".join(f"{k}={v}" for k, v in msgspec.structs.asdict(r.limits).items()),
                f"default exclusions: {' '.join(r.default_exclusions)}",
            ]
        ),
    )


@main.command()
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("--as", "name", required=True, help="The workspace name it is served as.")
@click.option("--tenant", default="default", show_default=True)
@click.option("--client", help="This machine's name in the workspace's URI (default: host name).")
@click.option(
    "--trust",
    type=click.Choice(["full", "restricted"]),
    default="restricted",
    show_default=True,
    help="restricted: ask before each mutation or command (or follow --policy).",
)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="TOML rules that allow, deny or ask (see docs/bridge.md).",
)
@click.option(
    "--ask-timeout",
    default=30.0,
    show_default=True,
    help="Seconds a question waits for its answer before it counts as no.",
)
@click.option("--nats-url", "attach_nats_url", help="NATS URL (default: as the other commands).")
@click.pass_context
def attach(
    ctx: click.Context,
    directory: Path,
    name: str,
    tenant: str,
    client: str | None,
    trust: str,
    policy_file: Path | None,
    ask_timeout: float,
    attach_nats_url: str | None,
) -> None:
    """Serve DIRECTORY as workspace TENANT/NAME from this machine, until Ctrl-C."""
    import socket

    from quill_cli.stack import discover_url
    from services.bridge.app import BridgeConfig
    from services.bridge.app import attach as run_bridge
    from services.bridge.policy import Policy

    setup_logging(ctx.obj["log_level"])
    try:
        policy = Policy.load(policy_file) if policy_file is not None else Policy()
    except ValueError as exc:
        click.echo(f"quill: {exc}", err=True)
        sys.exit(2)
    config = BridgeConfig(
        directory=directory,
        workspace=name,
        tenant=tenant,
        client=client or socket.gethostname(),
        nats_url=attach_nats_url or ctx.obj["nats_url"] or discover_url(),
        trust=trust,
        policy=policy,
        ask_timeout_s=ask_timeout,
    )
    sys.exit(_run(run_bridge(config)))


# ---------------------------------------------------------------- trust, approvals, locks


def _trust_text(ws: Workspace, r: rp.TrustInfo) -> str:
    if r.trust != "restricted":
        return f"{ws.tenant}/{ws.name}: trust {r.trust}"
    commands = "commands offered, each approved first" if r.commands else "no commands"
    return f"{ws.tenant}/{ws.name}: trust restricted ({commands})"


@main.command()
@workspace_command
@click.argument("level", type=click.Choice(["full", "restricted"]), required=False)
@click.option(
    "--commands/--no-commands",
    default=None,
    help="restricted: offer exec and git (each approved first), or not (the default).",
)
async def trust(
    ctx: click.Context, ws: Workspace, level: str | None, commands: bool | None
) -> None:
    """Show WORKSPACE's trust level, or set it to LEVEL. On a restricted workspace every change
    waits for approval (quill approvals), and commands are refused unless offered."""
    if level is None:
        if commands is not None:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, "--commands goes with a level: restricted")
        info = await ws.info()
        offered = info.trust == "restricted" and "exec.run" in info.capabilities
        shown = rp.TrustInfo(trust=info.trust, commands=offered, changed=False)
        emit(ctx, shown, lambda: _trust_text(ws, shown))
        return
    if level == "full" and commands:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT, "--commands is for restricted workspaces (full offers all)"
        )
    r = await ws.set_trust(level, commands=bool(commands))  # type: ignore[arg-type]
    emit(ctx, r, lambda: ("set " if r.changed else "unchanged: ") + _trust_text(ws, r))


@main.command()
@workspace_command
async def approvals(ctx: click.Context, ws: Workspace) -> None:
    """Requests waiting for approval on WORKSPACE: id, when, who asked, the op, what it would
    touch (paths, or the command line). Decide with quill approve / quill deny."""
    r = await ws.approvals()

    def human() -> str:
        lines = [
            f"{a.approval_id}  {a.requested:%Y-%m-%d %H:%M:%S}  {a.requested_by or '-':<12} "
            f"{a.op:<10} {a.summary}"
            for a in r.pending
        ]
        return "\n".join(lines) or "(no pending approvals)"

    emit(ctx, r, human)


@main.command()
@workspace_command
@click.argument("approval_id")
@click.option("--reason", help="Why, recorded with the decision.")
async def approve(ctx: click.Context, ws: Workspace, approval_id: str, reason: str | None) -> None:
    """Approve the waiting request APPROVAL_ID: it goes ahead, and its caller gets its result."""
    r = await ws.approve(approval_id, reason)
    emit(ctx, r, f"approved {r.approval_id}")


@main.command()
@workspace_command
@click.argument("approval_id")
@click.option("--reason", help="Why, recorded with the decision (its caller sees it).")
async def deny(ctx: click.Context, ws: Workspace, approval_id: str, reason: str | None) -> None:
    """Deny the waiting request APPROVAL_ID: its caller gets DENIED."""
    r = await ws.deny(approval_id, reason)
    emit(ctx, r, f"denied {r.approval_id}")


def _need_session(ctx: click.Context, what: str) -> None:
    if not ctx.obj["session"]:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"A lock belongs to a session: quill --session ID {what} (or set $QUILL_SESSION)",
        )


@main.command()
@workspace_command
@click.option(
    "--ttl",
    "ttl_ms",
    type=DURATION,
    default="60s",
    show_default=True,
    help="It expires on its own after this long; lock again to renew.",
)
@click.option(
    "--wait", "wait_ms", type=DURATION, help="Wait this long for another session's lock to go."
)
async def lock(ctx: click.Context, ws: Workspace, ttl_ms: int, wait_ms: int | None) -> None:
    """Lock WORKSPACE for your session (--session): until you unlock it or it expires, other
    sessions' changes get LOCKED (or wait, with --wait). Reads are never locked."""
    _need_session(ctx, "lock")
    r = await ws.lock(ttl_ms=ttl_ms, wait_ms=wait_ms)
    until = f"{r.expires:%Y-%m-%d %H:%M:%S} UTC" if r.expires else "-"
    emit(ctx, r, f"locked {ws.tenant}/{ws.name} for session {r.holder} until {until}")


@main.command()
@workspace_command
async def unlock(ctx: click.Context, ws: Workspace) -> None:
    """Release your session's lock on WORKSPACE (LOCKED if another session holds it)."""
    _need_session(ctx, "unlock")
    r = await ws.unlock()
    emit(ctx, r, f"unlocked {ws.tenant}/{ws.name}")


# ---------------------------------------------------------------- runs


@main.group(name="run")
def run_group() -> None:
    """Agent runs: a run reads the workspace as of the version it started at (quill --run ID
    cat ...), whatever is written meanwhile; the log keeps which version each run saw."""


def _run_text(r: rp.RunInfo) -> str:
    lines = [
        f"run: {r.run}",
        f"reads version: {r.version}",
        f"started: {r.started:%Y-%m-%d %H:%M:%S} by {r.actor or '-'} (version {r.started_version})",
        f"ended: {'no' if r.ended_version is None else f'version {r.ended_version}'}",
    ]
    if r.parent:
        lines.insert(1, f"parent: {r.parent}")
    return "\n".join(lines)


@run_group.command(name="start")
@workspace_command
@click.option("--id", "run_id", help="The run's id (default: one is made).")
@click.option("--version", "at", type=int, help="Read this version (default: the latest).")
@click.option("--parent", help="A sub-run of this run (it reads what its parent reads).")
async def run_start(
    ctx: click.Context, ws: Workspace, run_id: str | None, at: int | None, parent: str | None
) -> None:
    """Start a run on WORKSPACE; print its id and the version it reads."""
    r = await ws.start_run(run_id, parent=parent, version=at)
    emit(ctx, r, f"started run {r.run}, reading version {r.version}")


@run_group.command(name="end")
@workspace_command
@click.argument("run_id", metavar="RUN")
async def run_end(ctx: click.Context, ws: Workspace, run_id: str) -> None:
    """End RUN (its later changes are refused; ending it again changes nothing)."""
    r = await ws.end_run(run_id)
    emit(ctx, r, f"ended run {r.run} (it read version {r.version})")


@run_group.command(name="show")
@workspace_command
@click.argument("run_id", metavar="RUN")
async def run_show(ctx: click.Context, ws: Workspace, run_id: str) -> None:
    """Show RUN: the version it reads, its parent, when and by whom it started, and ended."""
    r = await ws.run_info(run_id)
    emit(ctx, r, lambda: _run_text(r))


# ---------------------------------------------------------------- sessions


@main.group(name="session")
def session_group() -> None:
    """Sessions (a conversation): a primary workspace, and workspaces attached to it by URI
    (server:/TENANT/WS, CLIENT:PATH served by quill attach, git:URL)."""


def session_command(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Decorate ``async fn(ctx, session, ...)``: the session ``TENANT/SESSION``."""

    def command(ctx: click.Context, /, session: str, **kwargs: Any) -> None:
        async def go() -> None:
            quill = await connect(ctx)
            try:
                await fn(ctx, Session(quill, quill.workspace(session)), **kwargs)
            finally:
                await quill.close()

        _run(go())

    update_wrapper(command, fn)
    return click.argument("session", metavar="TENANT/SESSION")(click.pass_context(command))


def _attached_text(r: rp.Attached) -> str:
    lines = [f"primary  {r.primary}"]
    lines += [f"{a.kind:<8} {a.target:<30} {a.uri}" for a in r.attached]
    return "\n".join(lines)


@session_group.command(name="open")
@click.argument("tenant")
@click.option("--id", "session_id", help="Open this session (created if new; default: a new id).")
@click.pass_context
def session_open(ctx: click.Context, tenant: str, session_id: str | None) -> None:
    """Open a session of TENANT (its primary workspace is created); print its id."""

    async def go() -> None:
        quill = await connect(ctx)
        try:
            session = await Session.open(quill, tenant, session_id)
        finally:
            await quill.close()
        primary = f"{session.primary.tenant}/{session.primary.name}"
        opened = {"session": session.id, "primary": primary}
        emit(ctx, opened, f"session {session.id}: primary workspace {primary}")

    _run(go())


@session_group.command(name="attach")
@session_command
@click.argument("uri")
async def session_attach(ctx: click.Context, session: Session, uri: str) -> None:
    """Attach the workspace at URI to the session (a git: URL is cloned first)."""
    emit(ctx, r := await session.attach(uri), lambda: _attached_text(r))


@session_group.command(name="detach")
@session_command
@click.argument("uri")
async def session_detach(ctx: click.Context, session: Session, uri: str) -> None:
    """Detach the workspace at URI from the session."""
    emit(ctx, r := await session.detach(uri), lambda: _attached_text(r))


@session_group.command(name="list")
@session_command
async def session_list(ctx: click.Context, session: Session) -> None:
    """The session's primary workspace, then its attached ones in order (kind, target, URI):
    a tool call naming no workspace goes to the first of them that offers it."""
    emit(ctx, r := await session.workspaces(), lambda: _attached_text(r))


# Commands defined in their own modules register themselves on ``main`` when imported.
from quill_cli import cli_cluster, cli_replay  # noqa: E402, F401
