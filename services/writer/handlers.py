"""Entry point of the writer: a command message → a pending command on its workspace's queue.

Only translation happens here; it never awaits the commit (the subscription delivers
messages one at a time, and group commit needs the next ones to queue while one is in
flight).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg

from contracts.errors import ErrorCode, QuillError
from contracts.limits import RETRY_AFTER_MS
from contracts.subjects import new_request_id
from infra.busy import refused
from infra.entry import Incoming, parse, reject
from services.writer.deps import Backlog, Deps
from services.writer.workspace import Pending, WorkspaceActor

log = logging.getLogger("quill.writer")


def command_handler(
    deps: Deps,
    actor_of: Callable[[str, str, int | None], WorkspaceActor],
    partition: int | None = None,
) -> Callable[[Msg], Awaitable[None]]:
    """``actor_of``: a workspace's actor (``Writer.actor``); ``partition``: the partition
    whose subscription this serves (on a cluster)."""
    backlog = deps.backlog

    async def on_command(msg: Msg) -> None:
        incoming = Incoming(msg)
        try:
            address, spec, origin, request = parse(incoming, deps.subjects, "cmd", new_request_id)
            if deps.bridges.claims(address.tenant, address.workspace):
                return  # a local workspace: its bridge answers
            if partition is not None and deps.partitions is not None:
                home = deps.subjects.partition_of(
                    address.tenant, address.workspace, deps.partitions.count
                )
                if home != partition:  # sent to a partition subject by hand: refuse, or
                    raise QuillError(  # two writers could serve one workspace
                        ErrorCode.ACCESS_DENIED,
                        f"Commands for {address.tenant}/{address.workspace} go to "
                        f"{deps.subjects.cmd(address.tenant, address.workspace, address.op)}",
                    )
            full(backlog, len(msg.data))
            actor = actor_of(address.tenant, address.workspace, partition)
            if actor.queued - actor.waiting >= backlog.per_workspace:  # waiters: apart
                raise refused(
                    "writer",
                    "workspace_commands",
                    f"Workspace {address.tenant}/{address.workspace}",
                    RETRY_AFTER_MS,
                    limit=backlog.per_workspace,
                )
            if actor.submit(Pending(address, spec, request, origin, msg, incoming.started)):
                backlog.queued += 1
                backlog.bytes += len(msg.data)
        except QuillError as exc:
            await reject(incoming, exc, deps.auditor)
            return
        except Exception as exc:  # a bug: still one answer
            log.exception("request %s on %s: not queued", origin.request_id, msg.subject)
            error = QuillError(ErrorCode.INTERNAL, f"Internal error: {type(exc).__name__}")
            await reject(incoming, error, deps.auditor)

    return on_command


def full(backlog: Backlog, size: int) -> None:
    """Refuse a command of ``size`` bytes when the writer holds as many commands, or as many
    bytes, as it may.

    Raises:
        QuillError: busy (``UNAVAILABLE``), queue ``commands`` or ``command_bytes``.
    """
    if backlog.queued >= backlog.limit:
        raise refused("writer", "commands", "The writer", RETRY_AFTER_MS, limit=backlog.limit)
    if backlog.queued and backlog.bytes + size > backlog.max_bytes:  # one always fits
        raise refused(
            "writer", "command_bytes", "The writer", RETRY_AFTER_MS, limit=backlog.max_bytes
        )
