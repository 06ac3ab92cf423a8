"""Long-lived HTTP streams, counted apart from requests: at most ``per_principal`` open per
principal (``quill gateway --max-streams``, ``GATEWAY_STREAMS_PER_PRINCIPAL``) and ``total``
in all (``GATEWAY_MAX_STREAMS``), per gateway process.

A stream is a response of server-sent events (``Content-Type: text/event-stream``): the
console's live pages (``/ui/…/live``, a command's output), and any such response the gateway
may come to send. A stream stays open as long as its client likes; counted as a request, 1,100
of them left open by one tenant took every request slot (``inflight.py``), and every other
tenant was answered busy for as long as they stayed. So ``Inflight`` tells a stream apart when
its response starts: from then on it holds one of its principal's streams and gives its
request slot back. Until then it is a request like any other (it reads the workspace and
subscribes within a request slot).

Past its principal's cap a stream is refused ``429`` with ``Retry-After`` and
``{"error": "too_many_streams", "message", "details": {"reason": "streams", "queue":
"streams", "limit", "open", "retry_after_ms"}}``; past the total, ``503`` busy
(``{"error": "unavailable", …}``), as ``inflight.py`` answers a full gateway. Both count in
``quill_busy_rejections_total{service="gateway",queue="streams"}``;
``quill_gateway_open_streams`` is the number open. A principal is the token's (tenant,
workspace, actor); without tokens every caller is the same one, so the cap is the whole
loopback's. Each worker process counts its own.

The MCP endpoints open none: stateless, they answer ``GET`` with ``405``
(``services/gateway/mcp/exchange.py``).
"""

from __future__ import annotations

from collections.abc import Hashable

import prometheus_client as prom
from starlette.types import Message, Scope

from contracts.errors import ErrorCode, QuillError
from contracts.limits import GATEWAY_MAX_STREAMS, GATEWAY_STREAMS_PER_PRINCIPAL
from infra.busy import REJECTIONS, refused

OPEN = prom.Gauge(
    "quill_gateway_open_streams",
    "Long-lived HTTP streams (server-sent events) this gateway process has open now.",
)

QUEUE = "streams"
_TYPE = b"content-type"
_EVENTS = b"text/event-stream"


def is_stream(start: Message) -> bool:
    """Whether the response that ``start`` begins is a stream (server-sent events)."""
    return any(k.lower() == _TYPE and _EVENTS in v.lower() for k, v in start.get("headers", ()))


def owner(scope: Scope) -> Hashable:
    """Whose stream it is: the request's principal (``PrincipalMiddleware`` stored it in the
    scope's ``state``), else its client address (no path that streams is public)."""
    principal: Hashable | None = scope.get("state", {}).get("principal")
    if principal is not None:
        return principal
    client = scope.get("client") or ("?", 0)
    return ("client", client[0])


class Streams:
    """The streams open, by principal."""

    def __init__(
        self, per_principal: int = GATEWAY_STREAMS_PER_PRINCIPAL, total: int = GATEWAY_MAX_STREAMS
    ) -> None:
        if per_principal < 1:
            raise ValueError(f"--max-streams must be at least 1, not {per_principal}")
        if total < 1:
            raise ValueError(f"the gateway's total of streams must be at least 1, not {total}")
        self.per_principal, self.total = per_principal, total
        self.open = 0
        self._by_owner: dict[Hashable, int] = {}

    def admit(self, who: Hashable, retry_after_ms: int) -> tuple[int, QuillError] | None:
        """Open a stream of ``who`` (None), or the status and error that refuse it."""
        held = self._by_owner.get(who, 0)
        if held >= self.per_principal:
            REJECTIONS.labels("gateway", QUEUE).inc()
            name = getattr(who, "name", None) or "this caller"
            message = (
                f"Too many open streams: {name} has {held} open, at most {self.per_principal} "
                "per caller (quill gateway --max-streams); close one (a live page), then retry "
                f"in {retry_after_ms} ms"
            )
            details = {"reason": QUEUE, "queue": QUEUE, "limit": self.per_principal}
            details |= {"open": held, "retry_after_ms": retry_after_ms}
            return 429, QuillError(ErrorCode.UNAVAILABLE, message, details)
        if self.open >= self.total:
            error = refused("gateway", QUEUE, "The gateway", retry_after_ms, limit=self.total)
            return 503, error
        self._by_owner[who] = held + 1
        self.open += 1
        OPEN.inc()
        return None

    def release(self, who: Hashable) -> None:
        """A stream of ``who`` ended."""
        held = self._by_owner.pop(who, 0) - 1
        if held > 0:
            self._by_owner[who] = held
        self.open -= 1
        OPEN.dec()
