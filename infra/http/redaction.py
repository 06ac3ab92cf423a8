"""Every gateway response redacted: one ASGI middleware that each response's headers and body
pass through on their way out.

The gateway echoes what a client sends in many places, most of them not its own: the
``X-Request-Id`` it keeps, the MCP SDK's ``Unknown tool: <name>``, ``Unknown resource``,
``Method not found`` data and the JSON-RPC ``id``, REST's ``Unknown field(s)``, a bad workspace
id in an error message, the console's pages naming the workspace of the URL, a ``Link`` or a
redirect's ``Location``. The services redact what they answer (``infra/bus.py``, the last net
of every reply), but what the gateway makes of a request itself never crosses NATS. So
``Redaction`` is the last net of the HTTP side, outside every other middleware (the busy
answers of ``inflight.py`` and the ``X-Request-Id`` of ``requestids.py`` included): whatever
a client sent that holds a registered secret (``$QUILL_SECRETS``, ``core/secrets.py``) comes
back with each occurrence replaced by ``[REDACTED:<id>]``, in header values and body alike,
and ``Content-Length`` follows.

A JSON-RPC id that held a secret comes back redacted too: ``"id": "[REDACTED:openai]"`` for
``"id": "sk-live-…"``. The client still pairs the answer with its request: the stateless MCP
exchange answers each POST's one request on that same HTTP exchange, and the id it reads is
its own with the marker in place of the secret (what redacting its id gives).

A body sent whole (every JSON answer, every page) is redacted whole. A streamed body:
server-sent events (``text/event-stream``, the console's live streams) are redacted chunk by
chunk, each chunk being whole events (``services/gateway/console/live.py``'s ``message``), so
nothing is held back and a live page stays live (the executor already redacted live output
across its chunks); any other (REST's whole listing) goes through a ``StreamRedactor``, which
holds back the last bytes of each chunk so that a secret cut between two chunks is caught, and
is sent without its ``Content-Length`` (chunked).

Cost: without a registry nothing is wrapped (a request costs one lookup,
``secrets_from_env``); with one, a regex pass over the header values and one over the body,
the response's start held until its first body chunk (to set ``Content-Length``).

What it does not catch (docs/executor.md, Threat model): encodings of a secret (base64, hex;
also JSON's or HTML's escapes of a secret that holds ``"``, ``\\``, ``<``, ``&`` or control
characters); a secret the body holds as a JSON number is replaced where it stands, which
leaves invalid JSON rather than the secret.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.secrets import Secrets, StreamRedactor
from infra.http.streams import is_stream
from infra.secret_registry import secrets_from_env

_LENGTH = b"content-length"


class Redaction:
    """ASGI middleware: every registered secret redacted from each response's header values
    and body (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        secrets = secrets_from_env() if scope["type"] == "http" else None
        if not secrets:
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, _Redacting(secrets, send))


class _Redacting:
    """The ``send`` of one response, redacting what passes."""

    def __init__(self, secrets: Secrets, send: Send) -> None:
        self.secrets, self.send = secrets, send
        self.start: Message | None = None
        """The response's start, held until its first body chunk."""
        self.stream: StreamRedactor | None = None
        self.events = False
        """A server-sent event stream: redacted chunk by chunk."""

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            headers = [(k, self.secrets.redact_bytes(v)[0]) for k, v in message.get("headers", ())]
            self.start = {**message, "headers": headers}
            self.events = is_stream(self.start)
            return
        if kind != "http.response.body":
            await self.send(message)
            return
        body: bytes = message.get("body", b"")
        more = bool(message.get("more_body", False))
        start, self.start = self.start, None
        if start is not None and not more:  # the whole body at once
            shown, ids = self.secrets.redact_bytes(body)
            if ids:
                start["headers"] = _with_length(start["headers"], len(shown))
            await self.send(start)
            await self.send({**message, "body": shown})
            return
        if start is not None:  # the first chunk of a streamed body: its length will change
            start["headers"] = [(k, v) for k, v in start["headers"] if k.lower() != _LENGTH]
            await self.send(start)
            if not self.events:
                self.stream = StreamRedactor(self.secrets)
        if self.stream is None:
            shown = self.secrets.redact_bytes(body)[0]
        else:
            shown = self.stream.feed(body) if more else self.stream.feed(body) + self.stream.flush()
        await self.send({**message, "body": shown})


def _with_length(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``Content-Length`` set to ``length`` where they had one."""
    return [(k, str(length).encode() if k.lower() == _LENGTH else v) for k, v in headers]
