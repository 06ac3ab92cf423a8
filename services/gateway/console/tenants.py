"""Which tenants have workspaces, for a console without tokens (loopback only: whoever reaches
it runs the deployment and may browse any tenant, ``Principal.anywhere``).

``/ui/`` without ``?tenant=`` opens on the caller's tenant when it is the only one with
workspaces, and otherwise lists the tenants that have some, each with how many, to pick one.
The tenants are read from the log itself: the subjects of ``WS_EVENTS`` (one per workspace,
``<root>.evt.<tenant>.<workspace>``, as JetStream's stream info lists them with
``subjects_filter``; a purged workspace has none left). Nothing of a tenant's is read: names
and counts only. With tokens this is never asked: a token browses its own tenant.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from nats.aio.client import Client as NATS

from contracts.subjects import STREAM_EVENTS, Subjects

log = logging.getLogger("quill.gateway")

SHOWN_MAX = 500
"""Tenants the list shows at most (by name)."""


@dataclass(frozen=True)
class Tenant:
    name: str
    workspaces: int


async def with_workspaces(
    nc: NATS, subjects: Subjects, own: str | None = None
) -> list[Tenant] | None:
    """The tenants that have workspaces, by name (at most ``SHOWN_MAX``); None when JetStream
    does not tell (then the console shows the caller's own tenant). ``own``
    (``tenant/workspace``): the workspace the gateway makes for callers without tokens, not
    counted while it holds one event (its creation, or the purge that ended it): an empty
    ``default/default`` does not make ``default`` a tenant to browse."""
    try:
        info = await nc.jetstream().stream_info(
            STREAM_EVENTS, subjects_filter=subjects.evt("*", "*")
        )
    except Exception as exc:  # not allowed, or not there: the caller's tenant, as before
        log.info("console: no list of tenants from %s: %r", STREAM_EVENTS, exc)
        return None
    idle = subjects.evt(*own.split("/", 1)) if own and "/" in own else None
    counts = Counter(
        subject.split(".")[-2]
        for subject, n in (info.state.subjects or {}).items()
        if subject.count(".") >= 3 and not (subject == idle and n <= 1)
    )
    return [Tenant(name, n) for name, n in sorted(counts.items())[:SHOWN_MAX]]
