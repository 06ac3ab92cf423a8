"""Entry point of the writer: a command message → a pending command on its workspace's queue.

Only translation happens here; it never awaits the commit (the subscription delivers
messages one at a time, and group commit needs the next ones to queue while one is in
flight).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from nats.aio.msg import Msg

from contracts import codec, ops
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Address, Origin
from services.common.bus import respond
from services.writer.workspace import Pending

if TYPE_CHECKING:
    from services.writer.app import Writer


def command_handler(writer: Writer) -> Callable[[Msg], Awaitable[None]]:
    names = ", ".join(spec.name for spec in ops.of_kind("cmd"))

    async def on_command(msg: Msg) -> None:
        started = time.perf_counter()
        address: Address | None = None
        origin: Origin | None = None
        try:
            address = writer.subjects.parse_request(msg.subject)
            spec = ops.find("cmd", address.op)
            if spec is None:
                raise QuillError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"Unknown command {address.op!r} (commands: {names})",
                )
            origin = Origin.from_headers(msg.headers, new_id=uuid.uuid4)
            request = codec.decode_request(spec, msg.data)
            if writer.queued >= writer.max_queued:
                raise QuillError(
                    ErrorCode.UNAVAILABLE,
                    "The writer is overloaded; retry later",
                    {"queued": writer.queued},
                )
        except QuillError as exc:
            await respond(msg, codec.error_reply(exc))
            if address is not None:
                await writer.auditor.record(address, origin, started, error=exc)
            return
        actor = writer.actor(address.tenant, address.workspace)
        if actor.submit(Pending(address, spec, request, origin, msg, started)):
            writer.queued += 1

    return on_command
