"""What every command module of the ``quill`` CLI shares: the exit codes, running a command
(``run_client`` for the client commands, ``run_to_exit`` for those that run services), the
client as the global options say (``connect``, ``connected``, ``workspace_command``),
printing (``emit``), durations, sizes, and the option help texts several commands repeat.

The command modules (``quill_cli/commands/``) import this module; it imports none of them,
nor ``quill_cli/cli.py`` (import-linter keeps it so: pyproject.toml).
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from functools import update_wrapper
from typing import Any, NoReturn, TypeVar

import click
import msgspec

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill

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

SANDBOX_HELP = "bwrap (bubblewrap), or local (a plain process: no isolation). Default: bwrap \
if it works here, else local, with a warning."
TOKENS_HELP = 'TOML file of [tokens."<token>"] tables (tenant = "...", workspace = "...").'
TENANTS_HELP = "TOML file of tenants: NATS credentials and gateway tokens (docs/operations.md)."
SECRETS_HELP = "TOML registry of secrets the services redact ($QUILL_SECRETS; see docs/cli.md)."

_json = msgspec.json.Encoder()


class Commands(click.Group):
    """The commands one module defines, declared as on the root group
    (``@commands.command()``, ``@commands.group()``); ``quill_cli/cli.py`` adds each of them
    to ``quill``. Never invoked itself."""


def fail(error: QuillError) -> NoReturn:
    """Exit as ``error`` says: one line ``quill: CODE: message`` on stderr, ``EXIT_CODES``."""
    click.echo(f"quill: {error.code}: {error.message}", err=True)
    sys.exit(EXIT_CODES.get(str(error.code), 1))


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``; a ``QuillError`` is one line on stderr and its exit status."""
    try:
        return asyncio.run(coro)
    except QuillError as exc:
        fail(exc)


def run_client(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` for the client commands: a ``QuillError`` is one line on stderr
    and its exit status (``EXIT_CODES``); Ctrl-C exits 130."""
    try:
        return _run(coro)
    except KeyboardInterrupt:
        sys.exit(130)


def run_to_exit(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` for the commands that run services: a start refused (a
    ``QuillError``, or a ``RuntimeError`` such as a partition count the deployment does not
    have or a data directory in use) is one line on stderr and a non-zero exit."""
    try:
        return _run(coro)
    except RuntimeError as exc:
        click.echo(f"quill: {exc}", err=True)
        sys.exit(1)


@contextmanager
def refusing(*errors: type[Exception]) -> Iterator[None]:
    """A bad option or file (``ValueError``, or ``errors``) is one line ``quill: ...`` on
    stderr and exit status 2."""
    caught: tuple[type[Exception], ...] = (ValueError, *errors)
    try:
        yield
    except caught as exc:
        click.echo(f"quill: {exc}", err=True)
        sys.exit(2)


def emit(ctx: click.Context, result: Any, human: str | Callable[[], str | None]) -> None:
    """Print ``result`` as JSON with ``--json``, else the human text."""
    if ctx.obj["json"]:
        click.echo(_json.encode(result).decode())
        return
    text = human if isinstance(human, str) else human()
    if text is not None:
        click.echo(text)


DURATION_PATTERN = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration(text: str) -> timedelta:
    """``500ms``, ``30s``, ``2m``, ``1h``, ``1d`` (``1.5s`` too) as a ``timedelta``.

    Raises:
        ValueError: anything else (a bare number is refused: seconds or milliseconds?).
    """
    match = DURATION_PATTERN.fullmatch(text.strip())
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


def short(digest: str | None) -> str:
    return f"{digest[:12]}…" if digest else "-"


def plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else words or word + 's'}"


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


@asynccontextmanager
async def connected(ctx: click.Context) -> AsyncIterator[Quill]:
    """``connect(ctx)``, closed on the way out.

    Raises:
        QuillError: ``UNAVAILABLE`` if NATS cannot be reached.
    """
    quill = await connect(ctx)
    try:
        yield quill
    finally:
        await quill.close()


def client_command(
    param: str, make: Callable[[Quill, str], Any], fn: Callable[..., Awaitable[None]], **arg: Any
) -> Callable[..., None]:
    """Decorate ``async fn(ctx, thing, ...)`` as a command taking the argument ``param``
    (``click.argument(param, **arg)``), where ``thing`` is ``make(client, its value)``:
    connect, call, close, report errors (``run_client``)."""

    def command(ctx: click.Context, /, **kwargs: Any) -> None:
        value = kwargs.pop(param)

        async def go() -> None:
            async with connected(ctx) as quill:
                await fn(ctx, make(quill, value), **kwargs)

        run_client(go())

    update_wrapper(command, fn)
    return click.argument(param, **arg)(click.pass_context(command))


def workspace_command(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Decorate ``async fn(ctx, ws, ...)``: connect, resolve ``WORKSPACE``, report errors."""
    return client_command("workspace", lambda quill, name: quill.workspace(name), fn)
