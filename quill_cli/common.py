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
from datetime import UTC, datetime, timedelta
from functools import update_wrapper
from typing import Any, NoReturn, TypeVar

import click
import msgspec
from click.core import ParameterSource

from contracts.errors import ErrorCode, QuillError
from infra.storage import parse_size
from quill.client import Quill
from quill.connection import DEFAULT_NATS_URL, discover_url
from quill_cli import client as cli_client
from quill_cli.client import CliQuill

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
    ErrorCode.STORAGE_FULL: 9,
}
"""Exit status by error code; anything else exits 1. 7: someone else must act first (a lock,
an approval: try again, or ``--wait``); 8: an approver said no; 9: a disk is full (an operator
must free space: docs/operations.md, Disk full)."""

SANDBOX_HELP = "bwrap (bubblewrap), or local (a plain process: no isolation). Default: bwrap \
if it works here, else local, with a warning."
TOKENS_HELP = 'TOML file of [tokens."<token>"] tables (tenant = "...", workspace = "...").'
TENANTS_HELP = "TOML file of tenants: NATS credentials and gateway tokens (docs/operations.md)."
SECRETS_HELP = "TOML registry of secrets the services redact ($QUILL_SECRETS; see docs/cli.md)."
LOG_FORMAT_ENV = "QUILL_LOG_FORMAT"
"""The services' log format when ``--log-format`` is not given (``quill up`` sets it)."""


def _log_format(help: str) -> Callable[[click.decorators.FC], click.decorators.FC]:
    """``--log-format`` (text or json, default ``$QUILL_LOG_FORMAT``), with its ``help``."""
    return click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        envvar=LOG_FORMAT_ENV,
        help=help,
    )


LOG_FORMAT = _log_format(
    "Log lines as text, or one JSON object a line (docs/operations.md#logs); as $QUILL_LOG_FORMAT."
)
LAUNCHED_LOG_FORMAT = _log_format(
    "Every service's log format (DIR/logs/*.log): text, or one JSON object a line."
)

_json = msgspec.json.Encoder()

LOG_MAX_HELP = "Most bytes the log (JetStream) may store, e.g. 20GB (default: the disk less \
--disk-reserve, raised as the disk grows; docs/operations.md, Disk full)."
DISK_RESERVE_HELP = "Space the log leaves free on its disk, e.g. 1GiB (default: 5% of it, at \
least 32 MiB)."


class SizeType(click.ParamType):  # type: ignore[type-arg]
    """A size: ``512MiB``, ``20GB``, ``1048576``."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def storage_options(fn: click.decorators.FC) -> click.decorators.FC:
    """``--log-max-bytes`` and ``--disk-reserve`` (``quill up``, ``quill cluster up``)."""
    fn = click.option("--disk-reserve", type=SizeType(), help=DISK_RESERVE_HELP)(fn)
    return click.option("--log-max-bytes", type=SizeType(), help=LOG_MAX_HELP)(fn)


SECTIONS = {
    "files": "Files",
    "history": "History",
    "exec": "Exec",
    "runs": "Runs and sessions (trust, approvals, locks)",
    "admin": "Admin (logs, replay, secrets, tokens, any op)",
    "services": "Services (run Quill)",
}
"""The sections of ``quill --help``, in order: a command module's ``Commands(section)``."""


class Commands(click.Group):
    """The commands one module defines, declared as on the root group
    (``@commands.command()``, ``@commands.group()``); ``quill_cli/cli.py`` adds each of them
    to ``quill``, listed in ``quill --help`` under ``section`` (a key of ``SECTIONS``).
    Never invoked itself."""

    def __init__(self, section: str = "admin") -> None:
        super().__init__()
        if section not in SECTIONS:
            raise ValueError(f"unknown section {section!r}: one of {', '.join(SECTIONS)}")
        self.section = section


CLI_WORDS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    (
        ErrorCode.NO_MATCH,
        re.compile(r"oldString not found in content"),
        "OLD not found in the file",
    ),
    (
        ErrorCode.MULTIPLE_MATCHES,
        re.compile(
            r"Found multiple matches for oldString\. Provide more surrounding lines in oldString "
            r"to identify the correct match, or set replace_all to replace every occurrence\."
        ),
        "OLD occurs more than once: give more of the surrounding text in OLD to pick one, "
        "or use --all to replace every occurrence.",
    ),
    ("", re.compile(r"\boldString\b"), "OLD"),
    ("", re.compile(r"\bnewString\b"), "NEW"),
    (
        "",
        re.compile(r"\(set recursive to delete it with its contents\)"),
        "(use -r to delete it with its contents)",
    ),
    ("", re.compile(r"\bset replace_all\b"), "use --all"),
    ("", re.compile(r"\breplace_all\b"), "--all"),
    (
        ErrorCode.APPROVAL_REQUIRED,
        re.compile(
            r"Waiting for approval (\S+) \(restricted workspace (\S+)\): once approved, Quill "
            r"carries it out; its outcome is kept under the approval id \(qry.approval\)"
        ),
        r"\2 is restricted: this waits for approval \1. Once someone approves it "
        r"(quill approve \2 \1), Quill carries it out; see what it gave with: quill resume "
        r"\2 \1 (or run the command with --wait 10m to wait for the decision)",
    ),
    ("", re.compile(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(\.\d+)?(\+00:00|Z)"), r"\1 \2"),
)
"""The CLI's own words for what the services say in the wire's (MCP's ``oldString``, the
``Ws-Request-Id`` header, ISO times): ``(code or "" for any, pattern, replacement)``, applied
in order to every error message the CLI prints."""


def cli_words(code: str, message: str) -> str:
    """``message`` in the CLI's words (``CLI_WORDS``)."""
    for only, pattern, replacement in CLI_WORDS:
        if not only or only == code:
            message = pattern.sub(replacement, message)
    return message


def _json_wanted() -> bool:
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    return bool(isinstance(obj, dict) and obj.get("json"))


def report(
    code: str,
    message: str,
    status: int,
    details: dict[str, Any] | None = None,
    *,
    as_json: bool | None = None,
) -> NoReturn:
    """Exit with ``status``, saying why on stderr: ``quill: CODE: message``, or with
    ``--json`` (or ``as_json``) one JSON object ``{"code", "message", "details",
    "exit_status"}``."""
    if as_json or (as_json is None and _json_wanted()):
        shown = code or ("INVALID_ARGUMENT" if status == 2 else "FAILED")
        body = {"code": shown, "message": message, "details": details or {}, "exit_status": status}
        click.echo(_json.encode(body).decode(), err=True)
    else:
        click.echo(f"quill: {code}: {message}" if code else f"quill: {message}", err=True)
    sys.exit(status)


def fail(error: QuillError) -> NoReturn:
    """Exit as ``error`` says (``report``), in the CLI's words, with its ``EXIT_CODES``."""
    code = str(error.code)
    report(code, cli_words(code, error.message), EXIT_CODES.get(code, 1), error.details)


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
    ``QuillError``, a ``RuntimeError`` such as a partition count the deployment does not
    have, a data directory in use or JetStream not answering, or a ``ConnectionError``: no
    NATS server answered) is one line on stderr and a non-zero exit."""
    try:
        return _run(coro)
    except (RuntimeError, ConnectionError) as exc:
        report("", str(exc), 1)


@contextmanager
def refusing(*errors: type[Exception]) -> Iterator[None]:
    """A bad option or file (``ValueError``, or ``errors``) is one line ``quill: ...`` on
    stderr and exit status 2."""
    caught: tuple[type[Exception], ...] = (ValueError, *errors)
    try:
        yield
    except caught as exc:
        report("", str(exc), 2)


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


def nats_url(ctx: click.Context) -> tuple[str, str]:
    """The NATS URL the global options name, and where it came from (for an error)."""
    root = ctx.find_root()
    url = root.obj["nats_url"]
    if url:
        source = root.get_parameter_source("nats_url")
        return url, "$QUILL_NATS_URL" if source == ParameterSource.ENVIRONMENT else "--nats-url"
    found = discover_url()
    return found, "the NATS URL" if found == DEFAULT_NATS_URL else "$QUILL_NATS_URL or stack.json"


async def connect(ctx: click.Context) -> CliQuill:
    """A client as the global options say (actor, session, run, wait), failing at once when
    no server answers (``quill_cli/client.py``).

    Raises:
        QuillError: ``UNAVAILABLE`` if NATS cannot be reached, ``INVALID_ARGUMENT`` for a URL
            that is not NATS's.
    """
    obj = ctx.find_root().obj
    url, source = nats_url(ctx)
    return await cli_client.connect(
        url,
        source,
        actor=obj["actor"],
        session=obj["session"],
        run=obj["run"],
        wait_ms=obj["wait_ms"],
    )


def when(stamp: datetime | None) -> str:
    """A time as the CLI shows every time: ``2025-06-01 10:42:07``, in UTC."""
    if stamp is None:
        return "-"
    if stamp.tzinfo is not None:
        stamp = stamp.astimezone(UTC)
    return stamp.strftime("%Y-%m-%d %H:%M:%S")


def value_text(value: Any) -> str:
    """A value as the CLI prints it: no Python reprs (``yes``/``no``, ``-``, times by
    ``when``, lists comma-separated)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return when(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(value_text(v) for v in value) or "-"
    if isinstance(value, msgspec.Struct):
        return ", ".join(f"{k}={value_text(v)}" for k, v in msgspec.structs.asdict(value).items())
    return str(value)


def columns(rows: list[list[str]], right: frozenset[int] = frozenset()) -> str:
    """``rows`` as aligned columns (two spaces apart; ``right``: the columns aligned right);
    the last column is never padded."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(map(len, rows)))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[i])
            if i in right
            else cell
            if i == len(row) - 1
            else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


@asynccontextmanager
async def connected(ctx: click.Context) -> AsyncIterator[CliQuill]:
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
