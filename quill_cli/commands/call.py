"""``quill call``: any op of the registry (``contracts/ops.py``), its request as JSON, its
result as JSON: the generic command behind the named ones, for ops they do not offer and for
scripts that speak the wire contract (docs/contract.md)."""

from __future__ import annotations

import sys

import click
import msgspec

from contracts import codec, ops
from contracts.errors import ErrorCode, QuillError
from contracts.limits import MAX_MESSAGE_BYTES
from quill.client import Workspace
from quill_cli.common import Commands, workspace_command

commands = Commands("admin")


def _spec(op: str) -> ops.OpSpec:
    """``cmd.write``, or ``write`` when one kind alone has it."""
    spec = ops.OPS.get(op)
    named = [s for s in ops.OPS.values() if s.name == op]
    if spec is None and len(named) == 1:
        spec = named[0]
    if spec is None:
        hint = f" ({', '.join(s.key for s in named)})" if named else ""
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Unknown op {op!r}{hint}: `quill call --list` lists them",
            {"op": op},
        )
    return spec


def _list(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    for spec in ops.OPS.values():
        click.echo(f"{spec.key:22} {spec.summary}")
    ctx.exit()


@commands.command(name="call")
@click.option(
    "--list",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_list,
    help="List the ops and exit.",
)
@workspace_command
@click.argument("op")
@click.argument("body", default="{}")
async def call(ctx: click.Context, ws: Workspace, op: str, body: str) -> None:
    """Send OP (cmd.write, qry.read, exec.run...; or its name alone when unique) to WORKSPACE
    with BODY, its request as JSON ('-': read it from stdin), and print the result as JSON.

    \b
    quill call acme/demo cmd.write '{"path": "a.txt", "content": "hi"}'
    quill call acme/demo qry.history '{"path": "a.txt", "limit": 5}'
    """
    spec = _spec(op)
    data = sys.stdin.buffer.read(MAX_MESSAGE_BYTES + 1) if body == "-" else body.encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"The request is over {MAX_MESSAGE_BYTES} bytes: not sent",
            {"bytes": MAX_MESSAGE_BYTES},
        )
    request = codec.decode_request(spec, data)  # refused here as the service would refuse it
    result = await ws.call(request)
    click.echo(msgspec.json.encode(result).decode())
