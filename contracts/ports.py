"""The wire of a shell's ports: one HTTP request the gateway hands the executor holding a shell,
and its answer (``/v1/workspaces/{t}/{w}/shells/{id}/ports/{port}/…``, docs/gateway.md).

The gateway sends it on ``<root>.exechold.<route>.<t>.<w>.port`` (``Subjects.exec_holder``:
services only; ``route`` is the shell id's, ``route_of``), where ``t``/``w`` are the tenant and
workspace its caller's token reaches: the holder looks the shell up under them only, so
another tenant's shell id is answered as a made-up one. Each message is one ``frame``: four
bytes (big-endian) giving the length of a JSON head (``PortRequest``/``PortResponse``), the
head, then the body as it is. The bounds keep a frame within NATS's ``max_payload``
(``MAX_MESSAGE_BYTES``): a body of at most ``BODY_MAX_BYTES`` each way, a head within
``HEAD_MAX_BYTES``.

A websocket is opened with a ``WsOpen`` on ``<root>.exechold.<route>.<t>.<w>.portws`` (answered
``WsOpened``), then relayed as ``ws_pack`` messages between two services' inboxes
(``infra/wsstream.py``), within the ``WS_*`` bounds.
"""

from __future__ import annotations

import struct
from typing import Literal, TypeVar

import msgspec

from contracts.limits import MAX_MESSAGE_BYTES

HEAD_MAX_BYTES = 128 * 1024
"""The most a frame's JSON head holds (an HTTP head is at most 16 KiB on either side)."""
BODY_MAX_BYTES = MAX_MESSAGE_BYTES - HEAD_MAX_BYTES
"""The most a request's or a response's body holds (8 MiB less the head's room)."""
TIMEOUT_S = 30.0
"""The longest the executor waits for a port's whole answer (504 past it)."""
LOWEST_PORT = 1024
"""Ports below this are not reachable (the privileged range: nothing a shell runs)."""
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
"""Headers never passed on either way, by the gateway or the executor (the executor sets
``Host``, ``Connection`` and ``Content-Length`` itself; the gateway recomputes the response's
length)."""

PortError = Literal["not_found", "bad_gateway", "timeout", "invalid", "busy"]
"""Why the holder gives no response: no such shell here (404), the port refused or its
answer was bad or too large (502), no answer in ``TIMEOUT_S`` (504), a malformed request
(400), too many at once (503)."""

_LENGTH = struct.Struct(">I")


class PortRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One HTTP request to a port of a shell (the body follows the head)."""

    shell: str
    port: int
    method: str
    target: str
    """The origin-form target: ``/path?query`` as the client sent it after the port."""
    headers: list[tuple[str, str]] = []
    """The client's headers less hop-by-hop ones, ``Host`` and its credentials."""


class PortResponse(msgspec.Struct, frozen=True, kw_only=True):
    """The port's answer (the body follows the head), or ``error`` with a ``message``."""

    status: int = 0
    headers: list[tuple[str, str]] = []
    error: PortError | None = None
    message: str = ""


def route_of(shell: str) -> str:
    """The route of the executor holding ``shell`` (``s`` + 12 hex digits + a random part)."""
    return shell[1:13]


T = TypeVar("T", "PortRequest", "PortResponse", "WsOpen", "WsOpened")


def frame(head: PortRequest | PortResponse | WsOpen | WsOpened, body: bytes = b"") -> bytes:
    data = msgspec.json.encode(head)
    return _LENGTH.pack(len(data)) + data + body


def unframe(data: bytes, kind: type[T]) -> tuple[T, bytes]:
    """The head and the body of a frame.

    Raises:
        ValueError: not a frame of ``kind`` within the bounds.
    """
    if len(data) < _LENGTH.size:
        raise ValueError("short frame")
    (n,) = _LENGTH.unpack_from(data)
    if n > HEAD_MAX_BYTES or _LENGTH.size + n > len(data):
        raise ValueError("bad frame head length")
    try:
        head = msgspec.json.decode(data[_LENGTH.size : _LENGTH.size + n], type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"bad frame head: {exc}") from None
    body = data[_LENGTH.size + n :]
    if len(body) > BODY_MAX_BYTES:
        raise ValueError("body too large")
    return head, body


# ---------------------------------------------------------------- websockets

WS_MESSAGE_MAX = 1024 * 1024
"""The largest websocket message relayed either way (a larger one closes the connection,
1009)."""
WS_WINDOW_BYTES = 2 * 1024 * 1024
"""The most message bytes one side has sent and the other not yet delivered (its acks): what
a connection buffers each way, whoever does not read."""
WS_IDLE_S = 300.0
"""A websocket without a message either way for this long is closed (1001)."""
WS_BEAT_S = 10.0
"""Each side of a relayed websocket tells the other it is there this often (an ``ack`` of
what it last acknowledged: changes nothing); one that hears nothing from the other for
``WS_BEAT_MISSED`` times as long ends the websocket (``1011``): the service at the other end
is gone (killed, cut off), and neither the client nor the port waits ``WS_IDLE_S`` for it."""
WS_BEAT_MISSED = 3
WS_OPEN_S = 10.0
"""How long the executor may take to open the port's websocket."""
WS_PER_SHELL = 8
"""Websockets open at once to the ports of one shell."""
WS_PER_TENANT = 16
"""Websockets open at once to the ports of one tenant's shells, on one executor."""

WsKind = Literal["text", "binary", "close", "ack"]
_KINDS: dict[str, bytes] = {"text": b"t", "binary": b"b", "close": b"c", "ack": b"a"}
_NAMES = {v: k for k, v in _KINDS.items()}
_HEAD = struct.Struct(">cQ")


class WsOpen(msgspec.Struct, frozen=True, kw_only=True):
    """A websocket to a port of a shell: the gateway asks the holder to open it, on
    ``<root>.exechold.<route>.<t>.<w>.portws``; messages to the client go to ``inbox``."""

    shell: str
    port: int
    target: str
    headers: list[tuple[str, str]] = []
    """The client's headers less hop-by-hop, credentials and the websocket handshake's."""
    subprotocols: list[str] = []
    inbox: str


class WsOpened(msgspec.Struct, frozen=True, kw_only=True):
    """The holder's answer: the port's websocket is open (messages to it go to ``inbox``),
    or ``error`` with a ``message``."""

    inbox: str = ""
    subprotocol: str | None = None
    error: PortError | None = None
    message: str = ""


def ws_pack(kind: WsKind, seq: int, payload: bytes = b"") -> bytes:
    """One message of a websocket's stream: its kind, its sequence number (``ack``: the last
    one delivered; ``close``: its payload is the code, two bytes, then the reason)."""
    return _HEAD.pack(_KINDS[kind], seq) + payload


def ws_unpack(data: bytes) -> tuple[WsKind, int, bytes]:
    """The kind, sequence number and payload of a stream's message.

    Raises:
        ValueError: not one.
    """
    if len(data) < _HEAD.size or len(data) > _HEAD.size + WS_MESSAGE_MAX:
        raise ValueError("bad stream message length")
    code, seq = _HEAD.unpack_from(data)
    kind = _NAMES.get(code)
    if kind is None:
        raise ValueError("bad stream message kind")
    return kind, seq, data[_HEAD.size :]  # type: ignore[return-value]
