"""A bare nats-py client's requests on Quill's subjects, as the tests of what a tenant can and
cannot do make them: ``answer`` (the reply, decoded: one must come; a request nobody answers
raises nats-py's error), ``code`` (its error code, None when it is ok) and ``ok`` (the reply,
asserted ok). ``tests.helpers.ask`` is the one for a request the server may refuse (None)."""

from __future__ import annotations

import json
from typing import Any

from nats.aio.client import Client as NATS


async def answer(
    nc: NATS, subject: str, body: dict[str, Any], timeout: float = 15
) -> dict[str, Any]:
    """The reply to ``body`` on ``subject``, decoded."""
    reply = await nc.request(subject, json.dumps(body).encode(), timeout=timeout)
    decoded: dict[str, Any] = json.loads(reply.data)
    return decoded


def code(reply: dict[str, Any]) -> str | None:
    """A reply's error code; None: it is ok."""
    return None if reply["ok"] else str(reply["error"]["code"])


async def ok(nc: NATS, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    """The reply to ``body`` on ``subject``, asserted ok."""
    reply = await answer(nc, subject, body)
    assert reply["ok"], reply
    return reply
