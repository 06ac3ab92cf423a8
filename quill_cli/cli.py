"""The ``quill`` command line: run the services, and use workspaces as a person would.

Client commands print readable text (``--json`` for scripts) and report a failure as one
line ``quill: CODE: message`` with a non-zero exit status (see ``docs/cli.md``).

This module is the root group (``quill``, its global options) and nothing else: each command
is defined in its group's module under ``quill_cli/commands/`` and added here; what they share
is in ``quill_cli/common.py``.
"""

from __future__ import annotations

import os

import click

from quill_cli.commands import (
    admin,
    call,
    cluster,
    files,
    history,
    replay,
    runs,
    sandbox,
    search,
    services,
    workspaces,
)
from quill_cli.common import DURATION

GROUPS = (files, search, history, sandbox, runs, call, replay, admin, services, cluster, workspaces)
"""The modules whose commands ``quill`` offers (listed by name in its help, whatever the
order here)."""


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


for _group in GROUPS:
    for _command in _group.commands.commands.values():
        main.add_command(_command)
