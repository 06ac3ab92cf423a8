"""One websocket relayed over NATS between the gateway and the executor holding a shell
(``contracts.ports``: ``WsOpen``, ``ws_pack``): each side's half of the stream.

Each side subscribes to an inbox of its own for the connection (a services' inbox: no tenant
may publish or subscribe there) and publishes to the other's. A message is its kind (text,
binary, close, ack), a sequence number and its payload. NATS keeps one publisher's messages
in order but may drop one (a slow consumer): a data message out of sequence ends the stream
(``StreamBroken``) rather than relay a gap. Flow control is by credit: a side sends data
while what it sent and the other has not yet acknowledged (``ack``: the last sequence number
delivered to its own end, client or port) stays within ``WS_WINDOW_BYTES``; past it, ``send``
waits. So a reader that never reads holds at most a window's worth on either side, and the
writer behind it is slowed down to the reader's pace (its TCP connection stops being read).
Each side also tells the other it is there every ``WS_BEAT_S`` (``heartbeat``: an ``ack`` of
what it acknowledged last), and ends once it has heard nothing for ``WS_BEAT_MISSED`` beats:
a side whose service was killed never says ``close``.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from contracts.ports import (
    WS_BEAT_MISSED,
    WS_BEAT_S,
    WS_WINDOW_BYTES,
    WsKind,
    ws_pack,
    ws_unpack,
)

_QUEUE_MAX = 64
"""Messages a side holds undelivered: the peer's window allows far fewer; past it, broken."""


class StreamBroken(Exception):
    """The stream lost a message, or its peer broke the protocol."""


class Stream:
    """One side of a relayed websocket (see the module docstring)."""

    beat_s = WS_BEAT_S
    """How often ``heartbeat`` beats (a test's may be shorter)."""

    def __init__(self, nc: NATS, inbox: str) -> None:
        self.nc, self.inbox = nc, inbox
        self.peer = ""
        """The other side's inbox (set once known)."""
        self.sent = self.received = 0
        """Message bytes sent, and received, so far (the audit's)."""
        self.sent_messages = self.received_messages = 0
        self._seq = self._expected = self._delivered = self._acked = 0
        self._heard = time.monotonic()
        """When the peer was last heard from (any message)."""
        self._in_flight: collections.deque[tuple[int, int]] = collections.deque()
        self._unacked = 0
        self._credit = asyncio.Event()
        self._credit.set()
        self._queue: asyncio.Queue[tuple[WsKind, int, bytes] | StreamBroken] = asyncio.Queue()
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(self.inbox, cb=self._on_message)

    async def stop(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()
        self._credit.set()

    @property
    def waiting(self) -> bool:
        """Whether ``send`` waits for the peer's acks (its window is full)."""
        return not self._credit.is_set()

    @property
    def unacked(self) -> int:
        """Message bytes sent that the peer has not acknowledged."""
        return self._unacked

    async def send(self, kind: WsKind, payload: bytes = b"") -> None:
        """Send a message (``text``/``binary`` wait for credit first; ``close`` does not)."""
        if kind in ("text", "binary"):
            while self._unacked and self._unacked + len(payload) > WS_WINDOW_BYTES:
                self._credit.clear()
                await self._credit.wait()
                if self._sub is None:
                    return
            self._seq += 1
            self._in_flight.append((self._seq, len(payload)))
            self._unacked += len(payload)
            self.sent += len(payload)
            self.sent_messages += 1
            await self.nc.publish(self.peer, ws_pack(kind, self._seq, payload))
            return
        await self.nc.publish(self.peer, ws_pack(kind, self._seq, payload))

    async def receive(self) -> tuple[WsKind, bytes]:
        """The next ``text``, ``binary`` or ``close`` message of the peer; ``delivered``
        after passing a data message on.

        Raises:
            StreamBroken: a message was lost, or the peer broke the protocol.
        """
        item = await self._queue.get()
        if isinstance(item, StreamBroken):
            raise item
        kind, seq, payload = item
        if kind != "close":
            self._delivered = seq
        return kind, payload

    async def delivered(self) -> None:
        """Acknowledge the data message last received (the peer may send more)."""
        self._acked = self._delivered
        await self.nc.publish(self.peer, ws_pack("ack", self._acked))

    async def heartbeat(self) -> None:
        """Tell the peer this side is there every ``beat_s`` seconds (an ``ack`` of what was
        acknowledged last: it changes nothing), and return once the peer has not been heard
        from for ``WS_BEAT_MISSED`` times as long: the caller ends the websocket."""
        every = self.beat_s
        self._heard = time.monotonic()
        while True:
            await asyncio.sleep(every)  # a period: the beat's, not a wait for something
            if time.monotonic() - self._heard > WS_BEAT_MISSED * every:
                return
            await self.nc.publish(self.peer, ws_pack("ack", self._acked))

    async def _on_message(self, msg: Msg) -> None:
        self._heard = time.monotonic()
        try:
            kind, seq, payload = ws_unpack(msg.data)
        except ValueError as exc:
            self._queue.put_nowait(StreamBroken(str(exc)))
            return
        if kind == "ack":
            while self._in_flight and self._in_flight[0][0] <= seq:
                self._unacked -= self._in_flight.popleft()[1]
            self._credit.set()
            return
        if kind == "close":
            self._queue.put_nowait((kind, seq, payload))
            return
        if seq != self._expected + 1 or self._queue.qsize() >= _QUEUE_MAX:
            self._queue.put_nowait(StreamBroken(f"message {seq} out of sequence"))
            return
        self._expected = seq
        self.received += len(payload)
        self.received_messages += 1
        self._queue.put_nowait((kind, seq, payload))


async def until_one_ends(*workers: Callable[[], Awaitable[object]]) -> None:
    """Run ``workers`` (a relay's directions and timers) until one ends; the others are then
    cancelled and waited for (also when this is cancelled)."""
    tasks = [asyncio.ensure_future(w()) for w in workers]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def close_payload(code: int, reason: str = "") -> bytes:
    return code.to_bytes(2, "big") + reason.encode()[:123]


def close_of(payload: bytes) -> tuple[int, str]:
    """The code and reason of a ``close`` message (1005, none given, when it has none)."""
    if len(payload) < 2:
        return 1005, ""
    return int.from_bytes(payload[:2], "big"), payload[2:].decode(errors="replace")
