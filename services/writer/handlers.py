"""Entry point of the writer: a command message → a pending command on its workspace's queue.

Only translation happens here; it never awaits the commit (the subscription delivers
messages one at a time, and group commit needs the next ones to queue while one is in
flight). The command goes to its workspace's actor through ``Actors.take`` (the writer's
bounds), which ``app.py`` hands the entry with its ``Deps``.
"""

from __future__ import annotations

import logging

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import QUEUE_WRITER, new_request_id
from infra import bus
from infra.entry import Incoming, parse, reject
from services.writer.actors import Actors
from services.writer.deps import Deps
from services.writer.workspace import Pending

log = logging.getLogger("quill.writer")


class Entry:
    """The writer's command subscriptions: all commands, or a cluster's partitions one at a
    time (``serve_partition``, given to ``Partitions``)."""

    def __init__(self, deps: Deps, actors: Actors) -> None:
        self.deps, self.actors = deps, actors

    async def serve(self) -> Subscription:
        """Take every workspace's commands (a writer without partitions)."""
        return await bus.serve(self.deps.nc, self.deps.subjects.all_cmd, QUEUE_WRITER, self.take)

    async def serve_partition(self, partition: int) -> Subscription:
        """Take the commands of ``partition``, just taken: and resume what its previous
        writer left approved and not carried out."""
        subject = self.deps.subjects.cmd_partition(partition)

        async def take(msg: Msg) -> None:
            await self.take(msg, partition)

        sub = await bus.serve(self.deps.nc, subject, QUEUE_WRITER, take)
        self.actors.resume(partition)
        return sub

    async def take(self, msg: Msg, partition: int | None = None) -> None:
        """One command message (of ``partition``'s subscription, on a cluster): queued on
        its workspace's actor, or refused."""
        deps = self.deps
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
            pending = Pending(address, spec, request, origin, msg, incoming.started)
            self.actors.take(pending, partition)
        except QuillError as exc:
            await reject(incoming, exc, deps.auditor)
            return
        except Exception as exc:  # a bug: still one answer
            log.exception("request %s on %s: not queued", origin.request_id, msg.subject)
            error = QuillError(ErrorCode.INTERNAL, f"Internal error: {type(exc).__name__}")
            await reject(incoming, error, deps.auditor)
