"""The ``quill`` command line: run the services, and use workspaces as a person would.

Client commands print readable text (``--json`` for scripts) and report a failure as one
line ``quill: CODE: message`` with a non-zero exit status (see ``docs/cli.md``).

This module is the root group (``quill``, its global options) and nothing else: each command
is defined in its group's module under ``quill_cli/commands/`` and added here; what they share
is in ``quill_cli/common.py``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from quill_cli.commands import (
    admin,
    attach,
    call,
    cluster,
    files,
    history,
    replay,
    runs,
    sandbox,
    search,
    services,
    terminal,
    tokens,
    transfer,
    workspaces,
)
from quill_cli.common import DURATION, SECTIONS, report

GROUPS = (
    files,
    transfer,
    search,
    history,
    sandbox,
    terminal,
    runs,
    call,
    replay,
    admin,
    tokens,
    workspaces,
    services,
    attach,
    cluster,
)
"""The modules whose commands ``quill`` offers (listed in its help by section, then name,
whatever the order here)."""


def _wants_json(args: Sequence[str]) -> bool:
    """``--json`` anywhere among the options (not after ``--``)."""
    words = list(args)
    return "--json" in (words[: words.index("--")] if "--" in words else words)


class Root(click.Group):
    """``quill``: its help lists the commands by section (``SECTIONS``) with their whole
    one-line descriptions; a usage error under ``--json`` is JSON on stderr, as every other."""

    sections: dict[str, str] = {}
    """Command name → section key."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        listed: dict[str, list[tuple[str, str]]] = {key: [] for key in SECTIONS}
        for name in sorted(self.list_commands(ctx)):
            command = self.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            section = self.sections.get(name, "admin")
            listed[section].append((name, command.get_short_help_str(limit=10_000)))
        for key, rows in listed.items():
            if rows:
                with formatter.section(SECTIONS[key]):
                    formatter.write_dl(rows, col_max=12)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        self._json = _wants_json(args)
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:
            self._usage(exc)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            self._usage(exc)

    def _usage(self, exc: click.ClickException) -> NoReturn:
        if not getattr(self, "_json", False) or not isinstance(exc, click.UsageError):
            raise exc
        report(
            "INVALID_ARGUMENT", exc.format_message(), exc.exit_code, {"usage": True}, as_json=True
        )


def _json_anywhere(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value:
        root = ctx.find_root()
        root.ensure_object(dict)["json"] = True


JSON_OPTION = click.Option(
    ["--json"],
    is_flag=True,
    expose_value=False,
    hidden=True,
    callback=_json_anywhere,
    help="Print results as JSON (as quill --json).",
)
"""``--json`` after the subcommand too (``quill ls --json WS``)."""


def _add_json(command: click.Command) -> None:
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_json(sub)
    elif not any("--json" in p.opts for p in command.params):
        command.params.append(JSON_OPTION)


@click.group(
    cls=Root,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 160},
)
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
        json=as_json or ctx.obj.get("json", False),
        actor=actor or "cli",
        log_level=log_level,
        session=session or None,
        wait_ms=wait_ms,
        run=run or None,
    )


for _group in GROUPS:
    for _command in _group.commands.commands.values():
        _add_json(_command)
        main.add_command(_command)
        assert _command.name is not None
        Root.sections[_command.name] = _group.commands.section
