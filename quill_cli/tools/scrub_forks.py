"""What a scrub does about forks (``scrub.py``'s docstring, "Forks"): it refuses a fork, and
a workspace that forks stand on, as its readers and the fork record every writer keeps
(WS_FORKS, ``infra/fork_registry.py``) know them; while it runs, it holds the workspace
marked ``scrubbing`` on that record, so that no fork is made meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from nats.js import JetStreamContext

from contracts.errors import ErrorCode, QuillError
from contracts.events import WorkspaceForked
from infra import log as eventlog
from infra.fork_registry import SCRUB_RENEW_S, Registry


async def not_forked(
    js: JetStreamContext,
    subject: str,
    name: str,
    last_seq: int,
    forks: Callable[[], Awaitable[list[str]]] | None,
) -> None:
    """Refuse a fork, and a workspace with forks (module docstring: "Forks")."""
    first = await eventlog.first(js, subject, last_seq)
    if first is not None and isinstance(event := first.event, WorkspaceForked):
        raise QuillError(
            ErrorCode.CONFLICT,
            f"{name} is a fork of {event.source} at v{event.version}: its history up to there "
            f"is {event.source}'s, which scrubbing {name} cannot rewrite. Purge the fork (merge "
            f"or copy what it should keep first), then scrub {event.source}",
            {"source": event.source, "version": event.version},
        )
    named = await forks() if forks is not None else []
    if named:
        raise QuillError(
            ErrorCode.CONFLICT,
            f"{name} has forks ({', '.join(named)}): they inherit its history, which a scrub "
            "rewrites (their chains continue it). Purge them first (merge what they should "
            "keep), then scrub",
            {"forks": named},
        )


@contextlib.asynccontextmanager
async def marked(
    registry: Registry, tenant: str, workspace: str, dry_run: bool
) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """The workspace marked ``scrubbing`` on the fork record while the scrub runs (renewed
    every ``SCRUB_RENEW_S``, cleared at the end); a dry run only checks that no fork stands.
    Yields a check that the mark is still this scrub's (made before the new log is appended).
    """
    if dry_run:
        standing = await registry.standing(tenant, workspace)
        if standing:
            raise QuillError(
                ErrorCode.CONFLICT,
                f"{tenant}/{workspace} has forks ({', '.join(standing[:10])}): they inherit its "
                "history, which a scrub rewrites (their chains continue it). Purge them first "
                "(merge what they should keep), then scrub",
                {"forks": standing[:100]},
            )

        async def nothing() -> None:
            return None

        yield nothing
        return
    await registry.mark(tenant, workspace, "scrubbing")

    async def renewing() -> None:
        while True:
            await asyncio.sleep(SCRUB_RENEW_S)
            await registry.renew(tenant, workspace, "scrubbing")

    async def still() -> None:
        if renewer.done() and renewer.exception() is not None:
            raise renewer.exception()  # type: ignore[misc]
        await registry.renew(tenant, workspace, "scrubbing")

    renewer = asyncio.create_task(renewing())
    try:
        yield still
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await renewer
        await registry.release(tenant, workspace, "scrubbing")
