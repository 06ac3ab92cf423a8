"""``quill attach``: serve a directory of this machine as a workspace (the bridge,
``services/bridge/``), until Ctrl-C. Its options fill ``BridgeConfig``, which the bridge reads
as it is."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from infra.runtime import setup_logging
from quill_cli.common import Commands, refusing, run_client

commands = Commands("services")


@commands.command()
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
    with refusing():
        policy = Policy.load(policy_file) if policy_file is not None else Policy()
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
    sys.exit(run_client(run_bridge(config)))
