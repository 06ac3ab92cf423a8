"""``quill token add``, ``list``, ``revoke``: the gateway's bearer tokens, in its tokens file
(``services/gateway/access.py: Tokens``; a tenants file too), which a running gateway
reads again when it changes.

The file is edited as text, so its comments and layout stay: ``add`` appends a table,
``revoke`` removes one; the result is checked as the gateway reads it, then written to a new
file (mode 0600) that replaces the old one at once (a gateway never reads half a file). A
token is printed once, when it is made; after that it is named by its id, the start of its
sha256 (as the gateway's default actor ``token:<id>`` is).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import click

from contracts.errors import QuillError
from contracts.subjects import check_id, split_workspace
from quill_cli.common import Commands, columns, emit, plural, refusing

commands = Commands("admin")

ID_CHARS = 12
"""Hex digits of a token's sha256 that name it."""
_file_option = click.option(
    "--file",
    "path",
    envvar="QUILL_TOKENS",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The tokens file (as quill up --tokens; or a tenants file). Default: $QUILL_TOKENS.",
)


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_id(token: str) -> str:
    return _sha(token)[:ID_CHARS]


def _tables(data: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(token, tenant, table)`` of every token of a tokens or tenants file."""
    found = [(t, str(v.get("tenant", "")), v) for t, v in data.get("tokens", {}).items()]
    for tenant, settings in data.get("tenants", {}).items():
        for token, table in (settings.get("tokens") or {}).items():
            found.append((token, tenant, table))
    return found


def _read(path: Path) -> tuple[str, dict[str, Any]]:
    """Raises: ValueError: a file that is not TOML."""
    try:
        text = path.read_text()
        return text, tomllib.loads(text)
    except FileNotFoundError:
        return "", {}
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read tokens file {path}: {exc}") from None


def _replace(path: Path, text: str) -> None:
    """Check ``text`` as the gateway reads it, then put it in place of ``path`` at once.

    Raises:
        ValueError: the gateway would refuse it.
    """
    from services.gateway.access import Tokens

    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:  # mkstemp: mode 0600
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        Tokens.load(Path(name))
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


def _quoted(key: str) -> str:
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


@commands.group(name="token")
def token_group() -> None:
    """The gateway's bearer tokens: add, list, revoke (a running gateway follows the file)."""


@token_group.command(name="add")
@_file_option
@click.argument("workspace", metavar="TENANT/WORKSPACE")
@click.option(
    "--scope",
    type=click.Choice(["workspace", "tenant"]),
    default="workspace",
    show_default=True,
    help="workspace: reaches WORKSPACE only; tenant: any workspace of TENANT.",
)
@click.option("--actor", help="Who its caller is in events and audit (default: token:<id>).")
@click.pass_context
def token_add(
    ctx: click.Context, path: Path, workspace: str, scope: str, actor: str | None
) -> None:
    """Make a token for TENANT/WORKSPACE, add it to the file and print it (the only time it
    is shown: keep it)."""
    with refusing(QuillError):
        tenant, name = split_workspace(workspace)
        check_id("tenant", tenant)
        check_id("workspace", name)
        text, data = _read(path)
        token = secrets.token_urlsafe(32)
        if "tenants" in data:
            if tenant not in data["tenants"]:
                raise ValueError(f"{path} is a tenants file without tenant {tenant}: add it first")
            lines = [f"[tenants.{tenant}.tokens.{_quoted(token)}]"]
        else:
            lines = [f"[tokens.{_quoted(token)}]", f"tenant = {_quoted(tenant)}"]
        lines.append(f"workspace = {_quoted(name)}")
        if scope != "workspace":
            lines.append(f"scope = {_quoted(scope)}")
        if actor:
            lines.append(f"actor = {_quoted(actor)}")
        head = text if not text or text.endswith("\n") else text + "\n"
        _replace(path, head + ("\n" if head else "") + "\n".join(lines) + "\n")
    made = {"token": token, "id": token_id(token), "workspace": workspace, "scope": scope}
    emit(
        ctx,
        made,
        f"{token}\nadded token {made['id']} for {workspace} (scope {scope}) to {path}; "
        "it is not shown again",
    )


@token_group.command(name="list")
@_file_option
@click.pass_context
def token_list(ctx: click.Context, path: Path) -> None:
    """The file's tokens by id (never the tokens themselves): workspace, scope, actor."""
    with refusing():
        _, data = _read(path)
    rows = [
        {
            "id": token_id(token),
            "workspace": f"{tenant}/{table.get('workspace', '')}",
            "scope": str(table.get("scope", "workspace")),
            "actor": str(
                table.get("actor") or f"token:{hashlib.sha256(token.encode()).hexdigest()[:8]}"
            ),
        }
        for token, tenant, table in _tables(data)
        if isinstance(table, dict)
    ]
    emit(
        ctx,
        {"tokens": rows},
        lambda: columns([list(r.values()) for r in rows]) or f"no tokens in {path}",
    )


@token_group.command(name="revoke")
@_file_option
@click.argument("token_ids", metavar="ID...", nargs=-1, required=True)
@click.pass_context
def token_revoke(ctx: click.Context, path: Path, token_ids: tuple[str, ...]) -> None:
    """Take the tokens ID... (as quill token list shows them; 6 hex digits at least) out
    of the file: a running gateway refuses them from its next request on."""
    with refusing():
        text, data = _read(path)
        tokens = [token for token, _, _ in _tables(data)]
        lines = text.splitlines(keepends=True)
        for wanted in token_ids:
            if not re.fullmatch(r"[0-9a-f]{6,64}", wanted):
                raise ValueError(f"not a token id: {wanted!r} (quill token list shows them)")
            matching = [
                t for t in tokens if hashlib.sha256(t.encode()).hexdigest().startswith(wanted)
            ]
            if len(matching) != 1:
                raise ValueError(
                    f"{'no' if not matching else 'more than one'} token of {path} has id {wanted}"
                )
            lines = _without(lines, matching[0], path)
            tokens.remove(matching[0])
        if not tokens and "tenants" not in data:
            raise ValueError(
                f"that would leave {path} without tokens, which the gateway refuses: add "
                "another first (quill token add), or run the gateway without --tokens"
            )
        _replace(path, "".join(lines).lstrip("\n"))
    emit(
        ctx,
        {"revoked": list(token_ids)},
        f"revoked {plural(len(token_ids), 'token')} ({', '.join(token_ids)}) in {path}",
    )


def _without(lines: list[str], token: str, path: Path) -> list[str]:
    """``lines`` without the table of ``token`` (from its header to the next header).

    Raises:
        ValueError: the token is not written as a table of its own (edit it by hand).
    """
    forms = "|".join(re.escape(q) for q in (_quoted(token), f"'{token}'", token))
    header = re.compile(rf"\s*\[\s*(tenants\s*\.\s*[\w-]+\s*\.\s*)?tokens\s*\.\s*({forms})\s*\]")
    for start, line in enumerate(lines):
        if header.match(line):
            end = start + 1
            while end < len(lines) and not lines[end].lstrip().startswith("["):
                end += 1
            while end > start + 1 and not lines[end - 1].strip():  # keep the blank before
                end -= 1  # the next table with it
            return lines[:start] + lines[end:]
    raise ValueError(
        f'{path}: that token is not a [tokens."..."] table of its own: edit it by hand'
    )
