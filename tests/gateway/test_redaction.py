"""``infra/http/redaction.py`` message by message: a body sent whole, a body streamed in
chunks (a secret cut between two), a stream of server-sent events (nothing held back), and no
registry (nothing wrapped)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.types import Message, Receive, Scope, Send

from infra.http.redaction import Redaction
from infra.secret_registry import ENV_FILE

SECRET = b"sk-live-0123456789abcdef"
MARK = b"[REDACTED:openai]"
SCOPE: Scope = {"type": "http", "method": "GET", "path": "/x", "headers": []}


@pytest.fixture
def registered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    registry = tmp_path / "secrets.toml"
    registry.write_text(f'[secrets]\nopenai = "{SECRET.decode()}"\n')
    monkeypatch.setenv(ENV_FILE, str(registry))
    yield


def start(*headers: tuple[bytes, bytes]) -> Message:
    return {"type": "http.response.start", "status": 200, "headers": list(headers)}


def body(data: bytes, more: bool = False) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": more}


class Wire:
    """What reached the client, and what had when each message of the app was sent."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.seen: list[int] = []

    async def __call__(self, message: Message) -> None:
        self.sent.append(message)

    def data(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


async def run(messages: list[Message]) -> Wire:
    wire = Wire()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        for message in messages:
            await send(message)
            wire.seen.append(len(wire.sent))

    async def receive() -> Message:
        raise AssertionError("not read")

    await Redaction(app)(dict(SCOPE), receive, wire)
    return wire


async def test_a_whole_body_and_its_headers(registered: None) -> None:
    text = b'{"id":"' + SECRET + b'","ok":1}'
    wire = await run(
        [
            start((b"content-length", str(len(text)).encode()), (b"x-request-id", SECRET)),
            body(text),
        ]
    )
    head, sent = wire.sent
    assert dict(head["headers"]) == {
        b"content-length": str(len(sent["body"])).encode(),
        b"x-request-id": MARK,
    }
    assert sent["body"] == b'{"id":"' + MARK + b'","ok":1}'


async def test_a_streamed_body_cut_inside_a_secret(registered: None) -> None:
    cut = 10
    text = b"a" * 100 + SECRET + b"b" * 100
    parts = [text[: 100 + cut], text[100 + cut :]]
    wire = await run(
        [start((b"content-length", str(len(text)).encode())), body(parts[0], True), body(parts[1])]
    )
    assert wire.data() == b"a" * 100 + MARK + b"b" * 100
    assert b"content-length" not in dict(wire.sent[0]["headers"])  # sent chunked


async def test_server_sent_events_are_redacted_and_sent_as_they_come(registered: None) -> None:
    events = [b"event: a\ndata: " + SECRET + b"\n\n", b": keepalive\n\n", b"data: x\n\n"]
    kind = (b"content-type", b"text/event-stream; charset=utf-8")
    wire = await run([start(kind), *(body(e, True) for e in events), body(b"")])
    # each event reached the client whole when the app sent it, none held for the next
    assert wire.seen == [0, 2, 3, 4, 5]
    assert wire.sent[1]["body"] == b"event: a\ndata: " + MARK + b"\n\n"
    assert wire.data() == b"".join(events).replace(SECRET, MARK)


async def test_without_a_registry_nothing_is_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_FILE, raising=False)
    text = b"x" + SECRET
    messages = [start((b"content-length", b"25")), body(text)]
    wire = await run(messages)
    assert wire.sent == messages and wire.seen == [1, 2]
