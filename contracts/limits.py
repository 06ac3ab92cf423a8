"""Workspace limits: defaults, per-workspace overrides, and the hard ceilings of a deployment.

Every limit a client can influence is bounded here. A workspace gets ``DEFAULT_LIMITS``
unless its ``create`` request overrides some of them (within ``CEILINGS``); ``info``
reports the effective values. One option travels with them, set the same way: ``gitignore``
(commands' changes honour ``.gitignore`` files; on unless turned off).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from contracts.errors import ErrorCode, QuillError

DEFAULT_EXCLUSIONS: tuple[str, ...] = (
    "**/node_modules/**",
    "**/.git/**",
    "**/dist/**",
    "**/build/**",
    "**/.venv/**",
    "**/target/**",
    "**/__pycache__/**",
    "**/vendor/**",
)
"""WAP's default exclusion patterns for recursive operations."""

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""The NATS ``max_payload`` Quill's embedded server runs with (requests, replies, events)."""

MAX_FORKS_PER_SOURCE = 1_000
"""Forks standing on one workspace at once (its record in WS_FORKS, ``infra/fork_registry.py``,
holds them all in one value): a fork beyond is refused (``SIZE_LIMIT_EXCEEDED``)."""

TREE_PAGE_BYTES = 2 * 1024 * 1024
"""Content bytes one page of ``qry.tree`` carries at most (the page ends sooner)."""
TREE_CHANGED_MOST = 1000
"""Paths changed between two versions that ``qry.tree`` with ``changed_from`` names at most
(beyond, it says it cannot tell: the whole tree is about as cheap to ask for)."""
TREE_CHANGED_ENTRIES = 10_000
"""Entries at and below those paths that ``qry.tree`` with ``changed_from`` answers at most
(the same: beyond, it cannot tell)."""

PREVIEW_MAX_BYTES = 32 * 1024
"""The longest diff an approval request shows of the change it would make (cut past it)."""

EXEC_STDIN_MAX_BYTES = 1024 * 1024
"""The most a command's standard input (``exec.run``'s ``stdin``) may hold. It travels whole
in the request (base64 in JSON: with the largest command line and environment, still under
``MAX_MESSAGE_BYTES``), is not streamed, and is never logged or audited (its size is);
past it the request is refused with ``SIZE_LIMIT_EXCEEDED`` (``check_stdin``)."""


LIVE_YIELD_MAX_MS = 60_000
"""The longest ``exec.run`` waits before answering a command still running (``yield_ms``)."""
LIVE_WAIT_MAX_MS = 60_000
"""The longest ``exec.poll`` waits for more output (``wait_ms``); below the request's
timeout too."""
LIVE_INPUT_MAX_BYTES = 64 * 1024
"""The most one ``exec.input`` carries."""
LIVE_POLL_MAX_BYTES = 1024 * 1024
"""The most one ``exec.poll`` returns of each stream."""
PTY_MAX_SIDE = 4096
"""The most rows, and the most columns, of a live command's terminal (``exec.run``'s ``pty``,
``exec.resize``)."""


def check_stdin(stdin: bytes | None) -> None:
    """Refuse a command's standard input over ``EXEC_STDIN_MAX_BYTES``.

    Raises:
        QuillError: ``SIZE_LIMIT_EXCEEDED`` (``details``: its size and the limit).
    """
    if stdin is not None and len(stdin) > EXEC_STDIN_MAX_BYTES:
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"Standard input of {len(stdin)} bytes is over the {EXEC_STDIN_MAX_BYTES} bytes a "
            "command may be given (put a larger input in the workspace and read it from there)",
            {"stdin_bytes": len(stdin), "max_stdin_bytes": EXEC_STDIN_MAX_BYTES},
        )


# ---------------------------------------------------------------- queues (a flood is refused)
# Every queue a client can fill is bounded; past its bound a request is answered at once with
# ``errors.busy`` (``UNAVAILABLE``, ``details.reason == "busy"``, a ``retry_after_ms`` hint)
# and counted in ``quill_busy_rejections_total{service,queue}``. docs/operations.md
# ("Overload") lists them.

WRITER_MAX_QUEUED = 20_000
"""Commands a writer holds accepted and not yet answered, all workspaces together
(``quill writer --max-queued``); queue ``commands``."""
WRITER_MAX_QUEUED_BYTES = 512 * 1024 * 1024
"""Bytes of those commands' requests (``--max-queued-bytes``); queue ``command_bytes``."""
WRITER_MAX_QUEUED_PER_WORKSPACE = 2_048
"""Commands one workspace holds queued, deciding or appending
(``--max-queued-per-workspace``); queue ``workspace_commands``."""
WRITER_MAX_WAITING_PER_WORKSPACE = 1_024
"""Commands one workspace holds waiting (``Ws-Wait``) for another session's lock to go, or
for their approval; past it a command that would wait for the lock is answered busy (queue
``workspace_waiting``), one that awaits its approval gets ``APPROVAL_REQUIRED`` at once.
Apart from the bound above, so that waiters never keep the lock's holder from unlocking."""
MAX_PENDING_APPROVALS = 256
"""Requests one workspace holds parked for approval at once (past it a new one is answered
busy, queue ``approvals``: decide or let some expire first)."""
APPROVAL_TTL_MAX_S = 7 * 24 * 3600
"""The longest ``approval_ttl_s`` a workspace may set."""
APPROVAL_KEEP_S = APPROVAL_TTL_MAX_S + 3600
"""How long ``WS_APPROVALS`` keeps a parked request and its outcome (its ``max_age``): the
longest wait for a decision, then at least an hour for the outcome to be read."""
WRITER_MAX_RETRIES_WAITING = 16
"""Copies of one request id (retries) waiting for that request's answer; queue
``request_retries``."""
READER_MAX_INFLIGHT = 4_096
"""Queries a reader is answering at once (those that had to wait for I/O); queue
``queries``."""
READER_MAX_VERSION_WAITERS = 1_024
"""Queries a reader holds waiting for a version it has not applied yet (``min_version``, a
run's version); queue ``version_waiters``."""
GATEWAY_MAX_INFLIGHT = 1_024
"""HTTP requests (REST, MCP, the console) one gateway process serves at once (``quill gateway
--max-inflight``; ``/health`` and ``/metrics`` are not counted); queue ``http``."""
GATEWAY_STREAMS_PER_PRINCIPAL = 32
"""Long-lived HTTP streams (server-sent events: the console's live pages) one principal (a
token; everyone, without tokens) keeps open at once on one gateway process (``quill gateway
--max-streams``); past it ``429``. Streams do not take request slots (``GATEWAY_MAX_INFLIGHT``);
queue ``streams``."""
GATEWAY_MAX_STREAMS = 4_096
"""Long-lived HTTP streams one gateway process keeps open at once, all principals together;
past it ``503`` busy; queue ``streams``."""
EXECUTOR_MAX_WAITING = 1_024
"""Exec requests an executor holds waiting for a slot, all tenants together (each tenant's
queue is bounded too: ``quill executor --queue``); queue ``runs``."""
EXECUTOR_MAX_OUTPUT_READS = 256
"""``exec.output`` reads an executor answers at once; queue ``output_reads``."""
BRIDGE_MAX_INFLIGHT = 1_024
"""Requests (commands, queries, exec) a bridge answers at once; queue ``requests``."""
OFFLOAD_PER_TENANT = 2
"""Expensive jobs (grep, diff, ``modify``'s regexes, a refused ``edit``'s closest-text search)
one tenant runs at once in one writer or reader (``infra/offload.py``)."""
OFFLOAD_QUEUED_PER_TENANT = 8
"""Expensive jobs of one tenant waiting for their turn in one writer or reader; past it the
next is answered busy (queue ``tenant_work``)."""
OFFLOAD_WORKERS = 8
"""Worker processes one writer or reader runs expensive jobs in, all tenants together."""
SUBSCRIPTION_PENDING_MSGS = 65_536
"""Messages a service's subscription holds received and not yet handled (nats-py's pending
limit); past it nats-py drops them as a slow consumer and the service answers each dropped
request busy (queue ``subscription``)."""
SUBSCRIPTION_PENDING_BYTES = 256 * 1024 * 1024
"""Bytes those messages may hold."""

RETRY_AFTER_MS = 250
"""The retry hint of a busy answer from a writer, a reader or a subscription."""
GATEWAY_RETRY_AFTER_MS = 1_000
"""The retry hint of a busy gateway (also its ``Retry-After``, rounded up to seconds)."""
EXECUTOR_RETRY_AFTER_MS = 1_000
"""The retry hint of a busy executor (its tenant's queue full, or no slot in time)."""

WRITER_WORKSPACES = 2000
"""Workspaces a writer holds in memory (their state, their recent results): past it, the
least recently used idle one is dropped (never one with commands queued, parked or in
flight), and loaded again from the projection when next used (``docs/operations.md``)."""

PROJECTION_ROWS = 10_000
"""Workspace rows (id, version, limits, ...: ~1 KB each) a projection holds in memory, in the
writer and in each reader (``--projection-rows``): past it, the least recently used is
dropped and read again from SQLite (one indexed lookup) when next asked for. At least the
writer's ``WRITER_WORKSPACES``, so a workspace the writer holds has its row too."""

WRITER_RECENT_RESULTS = 128
"""Request ids (with their replies) a writer keeps in memory per workspace it holds, for
idempotent retries; an older request id is looked up in the projection."""

SDK_WORKSPACES = 10_000
"""Workspaces an SDK client (``quill.Quill``: the gateway's, the executor's, a script's)
remembers (its handle, and the highest version it saw, for read-your-writes): past it, the
least recently used is forgotten; a query on it then reads the newest version a reader has
applied, with no floor, until the client sees a version of it again."""
GATEWAY_SESSIONS = 10_000
"""MCP sessions (a principal's, or another primary workspace's of its tenant) a gateway
process keeps: past it, the least recently used is forgotten and opened again when next used
(its attachments are in its primary workspace's log; what each offers is asked again)."""
GATEWAY_WORKSPACES = 10_000
"""Workspaces a gateway process remembers it has created (``exist_ok``) and their limits:
past it, the least recently used is forgotten, and created (``exist_ok``: a no-op) and asked
again when next used."""

Positive = Annotated[int, Meta(ge=1, le=2**40)]


class Limits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The limits of one workspace."""

    max_file_bytes: Annotated[int, Meta(ge=1, description="Largest file, in bytes.")] = (
        4 * 1024 * 1024
    )
    max_files: Annotated[int, Meta(ge=1, description="Most files in the workspace.")] = 100_000
    max_read_bytes: Annotated[
        int, Meta(ge=1, description="Most content bytes one read returns (then truncated).")
    ] = 256 * 1024
    max_read_lines: Annotated[
        int, Meta(ge=1, description="Most lines one read returns (then truncated).")
    ] = 2000
    max_directory_entries: Annotated[
        int, Meta(ge=1, description="Most entries one listing returns.")
    ] = 500
    max_search_results: Annotated[
        int, Meta(ge=1, description="Most results one search returns.")
    ] = 100
    max_output_bytes: Annotated[
        int, Meta(ge=1, description="Most bytes of each output stream a command returns.")
    ] = 50 * 1024
    max_exec_ms: Annotated[int, Meta(ge=1, description="Longest a command may run, in ms.")] = (
        600_000
    )
    max_change_paths: Annotated[
        int, Meta(ge=1, description="Most paths one change set may touch.")
    ] = 10_000
    max_versions: Annotated[
        int | None,
        Meta(description="Historical versions kept per file (None: all; latest always kept)."),
    ] = None
    max_checkout_bytes: Annotated[
        int,
        Meta(
            ge=1,
            description="Most disk bytes an executor's checkout of the workspace may hold, "
            "ignored and uncommitted files included; a command going over is stopped.",
        ),
    ] = 4 * 1024**3
    gitignore: Annotated[
        bool,
        Meta(
            description="Commands' changes honour .gitignore files as git does: a new path "
            "they ignore is not committed (it stays in the executor's checkout)."
        ),
    ] = True
    approval_ttl_s: Annotated[
        int,
        Meta(
            ge=1,
            description="How long a request parked for approval waits for a decision, in "
            "seconds; past it the request is refused (DENIED, reason expired).",
        ),
    ] = 24 * 3600


class LimitsPatch(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Overrides of some limits, given when a workspace is created."""

    max_file_bytes: Positive | None = None
    max_files: Positive | None = None
    max_read_bytes: Positive | None = None
    max_read_lines: Positive | None = None
    max_directory_entries: Positive | None = None
    max_search_results: Positive | None = None
    max_output_bytes: Positive | None = None
    max_exec_ms: Positive | None = None
    max_change_paths: Positive | None = None
    max_versions: Positive | None = None
    max_checkout_bytes: Positive | None = None
    gitignore: bool | None = None
    approval_ttl_s: Positive | None = None


DEFAULT_LIMITS = Limits()

CEILINGS = Limits(
    max_file_bytes=6 * 1024 * 1024,
    max_files=1_000_000,
    max_read_bytes=4 * 1024 * 1024,
    max_read_lines=100_000,
    max_directory_entries=10_000,
    max_search_results=10_000,
    max_output_bytes=1024 * 1024,
    max_exec_ms=600_000,
    max_change_paths=50_000,
    max_versions=None,
    max_checkout_bytes=64 * 1024**3,
    gitignore=True,
    approval_ttl_s=APPROVAL_TTL_MAX_S,
)
"""What a per-workspace override may not exceed (the NATS message size bounds several)."""


def effective_limits(patch: LimitsPatch | None, base: Limits = DEFAULT_LIMITS) -> Limits:
    """Apply ``patch`` to ``base``.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` if an override exceeds its ceiling.
    """
    if patch is None:
        return base
    values = msgspec.structs.asdict(base)
    for field in patch.__struct_fields__:
        value = getattr(patch, field)
        if value is None:
            continue
        ceiling = getattr(CEILINGS, field)
        if ceiling is not None and not isinstance(value, bool) and value > ceiling:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"Limit {field}={value} exceeds the ceiling {ceiling}",
                {"limit": field, "ceiling": ceiling},
            )
        values[field] = value
    return Limits(**values)
