"""Entry point of the writer: a command message → a pending command on its workspace's queue.

Only translation happens here; it never awaits the commit (the subscription delivers
messages one at a time, and group commit needs the next ones to queue while one is in
flight).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from nats.aio.msg import Msg

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import new_request_id
from infra.entry import Incoming, parse, reject
from services.writer.workspace import Pending

if TYPE_CHECKING:
    from services.writer.app import Writer

log = logging.getLogger("quill.writer")


def command_handler(
    writer: Writer, partition: int | None = None
) -> Callable[[Msg], Awaitable[None]]:
    """``partition``: the partition whose subscription this serves (on a cluster)."""

    async def on_command(msg: Msg) -> None:
        incoming = Incoming(msg)
        try:
            address, spec, origin, request = parse(incoming, writer.subjects, "cmd", new_request_id)
            if writer.bridges.claims(address.tenant, address.workspace):
                return  # a local workspace: its bridge answers
            if partition is not None and writer.partitions is not None:
                home = writer.subjects.partition_of(
                    address.tenant, address.workspace, writer.partitions.count
                )
                if home != partition:  # sent to a partition subject by hand: refuse, or
                    raise QuillError(  # two writers could serve one workspace
                        ErrorCode.ACCESS_DENIED,
                        f"Commands for {address.tenant}/{address.workspace} go to "
                        f"{writer.subjects.cmd(address.tenant, address.workspace, address.op)}",
                    )
            if writer.queued >= writer.max_queued:
                raise QuillError(
                    ErrorCode.UNAVAILABLE,
                    "The writer is overloaded; retry later",
                    {"queued": writer.queued},
                )
        except QuillError as exc:
            await reject(incoming, exc, writer.auditor)
            return
        try:
            actor = writer.actor(address.tenant, address.workspace, partition)
            if actor.submit(Pending(address, spec, request, origin, msg, incoming.started)):
                writer.queued += 1
        except Exception as exc:  # a bug: still one answer
            log.exception("request %s on %s: not queued", origin.request_id, msg.subject)
            error = QuillError(ErrorCode.INTERNAL, f"Internal error: {type(exc).__name__}")
            await reject(incoming, error, writer.auditor)

    return on_command
