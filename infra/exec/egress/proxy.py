"""One command's egress proxy: an HTTP proxy (``CONNECT`` and plain ``http://`` requests) that
reaches the allowed hosts only, at public addresses only, each connection recorded.

A client (pip, npm, curl, git: each speaks it through ``HTTPS_PROXY``/``HTTP_PROXY``) sends a
request head; the proxy reads at most ``ProxyLimits.head_bytes`` of it within ``head_s``, then

1. takes the host and port: ``CONNECT host:port`` (a TLS tunnel: the client verifies the host's
   certificate itself), or ``GET http://host[:port]/path`` (plain HTTP, sent on as
   ``GET /path`` with ``Connection: close``: one request per connection, so that a client
   reusing the connection cannot reach a second host unchecked); ``https://`` URLs in a plain
   request are refused (a client tunnels them);
2. refuses a host no ``HostPattern`` of the workspace admits (an IP literal only if an entry is
   that literal), a loopback name (``localhost``, ``*.localhost``);
3. resolves a name itself (``Policy.resolver``) and keeps the public addresses only
   (``addresses.is_public``: never loopback, private, shared, link-local, metadata, ...);
   none: refused;
4. connects to those addresses, in order (pinned: no second resolution, so a DNS answer that
   changes meanwhile moves nothing), and relays bytes both ways until both ends close, the
   connection is idle for ``idle_s``, or the command's bytes run out.

A redirect is the client's to follow: a new host is a new request, checked again from 1.
Every connection, refused or not, ends in one ``Connection`` handed to ``record`` (the
executor audits it). Refusals are answered ``403`` (not allowed, not public), ``502`` (no
answer), ``400``/``431`` (a malformed or too large head), ``407`` (no credential, on a TCP
listener), ``503`` (too many connections), each with a one-line reason.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import ipaddress
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from infra.exec.addresses import (
    IPAddress,
    Resolver,
    is_public,
    literal,
    loopback_name,
    system_resolver,
)
from infra.exec.egress.rules import HostPattern, normal

log = logging.getLogger(__name__)

Verdict = Literal["allowed", "refused", "failed"]
Dial = Callable[[IPAddress, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
"""Opens a connection to a checked address (tests only: where a test's server really is)."""
USER = "quill"
"""The user name of the TCP listener's credential (``Proxy.url``)."""
_CHUNK = 64 * 1024
_LINGER_S = 1.0
_HOP = {b"proxy-authorization", b"proxy-connection", b"connection", b"keep-alive", b"te"}


@dataclass(frozen=True, slots=True)
class ProxyLimits:
    """What one command may do through its proxy."""

    connections: int = 32
    """Connections open at once; more are refused (503)."""
    total_connections: int = 4096
    """Connections in all, for the command's life."""
    total_bytes: int = 4 * 1024**3
    """Bytes relayed in all (both ways, all connections); past it connections are cut."""
    idle_s: float = 120.0
    """A connection with no byte either way for this long is closed."""
    head_bytes: int = 16 * 1024
    """The request line and headers."""
    head_s: float = 10.0
    """Time to send them."""
    connect_s: float = 10.0
    """Time to resolve the host and to connect, each."""


@dataclass(frozen=True, slots=True)
class Policy:
    """How the executor's proxies resolve and connect (the same for every command)."""

    limits: ProxyLimits = ProxyLimits()
    resolver: Resolver | None = None
    """None: the system's (``addresses.system_resolver``); tests give their own."""
    dial: Dial | None = None
    """None: connect to the checked address; tests only (never from a request or an option)."""


@dataclass(slots=True)
class Connection:
    """One connection through the proxy, as audited."""

    host: str = ""
    port: int = 0
    method: str = ""
    address: str | None = None
    """Where it connected (None: it did not)."""
    sent: int = 0
    """Bytes from the command to the host."""
    received: int = 0
    verdict: Verdict = "refused"
    reason: str = ""
    started: float = field(default_factory=time.perf_counter)


Record = Callable[[Connection], Awaitable[None]]


class Refused(Exception):
    def __init__(self, status: int, reason: str, verdict: Verdict = "refused") -> None:
        super().__init__(reason)
        self.status, self.reason, self.verdict = status, reason, verdict


_STATUS = {
    400: "Bad Request",
    403: "Forbidden",
    407: "Proxy Authentication Required",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


class Proxy:
    """One command's proxy: a unix socket in ``directory`` (a bwrap sandbox binds it), and with
    ``tcp`` a loopback TCP port taking ``url``'s credential (the local provider)."""

    def __init__(
        self,
        hosts: Sequence[HostPattern],
        policy: Policy,
        record: Record,
        directory: Path,
    ) -> None:
        self.hosts, self.policy, self.record = tuple(hosts), policy, record
        self.limits = policy.limits
        self.directory = directory
        self.socket = directory / "proxy.sock"
        self.token = secrets.token_urlsafe(24)
        self.url: str | None = None
        self.open = 0
        self.connections = 0
        self.relayed = 0
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, *, tcp: bool) -> None:
        """Listen (the socket world-connectable: the sandbox's user is another uid)."""
        unix = await asyncio.start_unix_server(
            self._unix, path=str(self.socket), limit=self.limits.head_bytes
        )
        self._servers.append(unix)
        os.chmod(self.socket, 0o666)
        if tcp:
            server = await asyncio.start_server(
                self._tcp, "127.0.0.1", 0, limit=self.limits.head_bytes
            )
            self._servers.append(server)
            port = server.sockets[0].getsockname()[1]
            self.url = f"http://{USER}:{self.token}@127.0.0.1:{port}"

    async def close(self) -> None:
        """Stop listening and cut every connection (the command has ended)."""
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1)
        with contextlib.suppress(OSError):
            self.socket.unlink()

    async def _unix(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve(reader, writer, credential=False)

    async def _tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve(reader, writer, credential=True)

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, credential: bool
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn = Connection()
        upstream: asyncio.StreamWriter | None = None
        self.open += 1
        self.connections += 1
        try:
            try:
                if self.open > self.limits.connections:
                    raise Refused(503, f"more than {self.limits.connections} connections at once")
                if self.connections > self.limits.total_connections:
                    raise Refused(503, f"more than {self.limits.total_connections} connections")
                head = await self._head(reader)
                method, host, port, forward = parse(head)
                conn.method, conn.host, conn.port = method, host, port
                if credential and not self._authorized(head):
                    raise Refused(407, "no or a wrong proxy credential")
                address, up_r, upstream = await self._connect(host, port)
                conn.address = str(address)
            except Refused as refused:
                conn.verdict, conn.reason = refused.verdict, refused.reason
                status = f"{refused.status} {_STATUS[refused.status]}"
                body = f"quill egress: {refused.reason}\n".encode()
                with contextlib.suppress(OSError):
                    writer.write(
                        f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                        + body
                    )
                    await writer.drain()
                    await _linger(reader, writer)
                return
            conn.verdict = "allowed"
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.write(forward)
                conn.sent += len(forward)
            conn.reason = await self._relay(reader, writer, up_r, upstream, conn)
        except asyncio.CancelledError:  # ``close``: the command ended (the task ends quietly:
            conn.reason = conn.reason or "the command ended"  # asyncio logs a cancelled one)
        except OSError as exc:
            conn.reason = conn.reason or f"connection error: {exc.strerror or exc}"
        finally:
            self.open -= 1
            for end in (writer, upstream):
                if end is not None:
                    end.close()
            self._tasks.discard(task)
            try:
                await asyncio.shield(self.record(conn))
            except Exception:  # auditing never breaks the proxy
                log.exception("cannot record an egress connection")

    async def _head(self, reader: asyncio.StreamReader) -> bytes:
        try:
            async with asyncio.timeout(self.limits.head_s):
                return await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise Refused(431, f"request head over {self.limits.head_bytes} bytes") from None
        except asyncio.IncompleteReadError as exc:
            if len(exc.partial) >= self.limits.head_bytes:
                raise Refused(431, f"request head over {self.limits.head_bytes} bytes") from None
            raise Refused(400, "the request head ended early") from None
        except TimeoutError:
            raise Refused(400, f"no request head within {self.limits.head_s:g} s") from None

    def _authorized(self, head: bytes) -> bool:
        expected = base64.b64encode(f"{USER}:{self.token}".encode())
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"proxy-authorization":
                scheme, _, given = value.strip().partition(b" ")
                if scheme.lower() == b"basic" and hmac.compare_digest(given.strip(), expected):
                    return True
        return False

    async def _connect(
        self, host: str, port: int
    ) -> tuple[IPAddress, asyncio.StreamReader, asyncio.StreamWriter]:
        if not any(pattern.admits(host, port) for pattern in self.hosts):
            raise Refused(403, f"{host}:{port} is not allowed for this workspace")
        candidates = await self._public(host, port)
        dial = self.policy.dial or _open
        errors = []
        for address in candidates:
            try:
                async with asyncio.timeout(self.limits.connect_s):
                    reader, writer = await dial(address, port)
            except (OSError, TimeoutError) as exc:
                errors.append(f"{address}: {getattr(exc, 'strerror', None) or 'timed out'}")
                continue
            return address, reader, writer
        raise Refused(502, f"{host}:{port} does not answer ({'; '.join(errors)})", "failed")

    async def _public(self, host: str, port: int) -> list[IPAddress]:
        """The public addresses of ``host`` (an IP literal: itself, if public)."""
        address = literal(host)
        if address is not None:
            if not is_public(address):
                raise Refused(403, f"{host} is not a public address")
            return [address]
        if loopback_name(host):
            raise Refused(403, f"{host} is a loopback name")
        resolver = self.policy.resolver or system_resolver
        try:
            async with asyncio.timeout(self.limits.connect_s):
                found = await resolver(host, port)
        except (OSError, TimeoutError, UnicodeError):
            raise Refused(502, f"{host} does not resolve", "failed") from None
        public: list[IPAddress] = []
        for text in found:
            try:
                candidate = ipaddress.ip_address(text.split("%", 1)[0])
            except ValueError:
                continue
            if "%" not in text and is_public(candidate) and candidate not in public:
                public.append(candidate)
        if not public:
            shown = ", ".join(sorted(set(found))[:4])
            raise Refused(403, f"{host} resolves to no public address ({shown})")
        return public

    async def _relay(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
        conn: Connection,
    ) -> str:
        """Bytes both ways until both ends closed; why it ended."""
        loop = asyncio.get_running_loop()
        last = [loop.time()]
        idle = self.limits.idle_s

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            while True:
                try:
                    data = await asyncio.wait_for(src.read(_CHUNK), idle)
                except TimeoutError:
                    if loop.time() - last[0] >= idle:
                        raise _Ended(f"idle for {idle:g} s") from None
                    continue
                if not data:
                    if dst.can_write_eof():
                        with contextlib.suppress(OSError):
                            dst.write_eof()
                    return
                room = self.limits.total_bytes - self.relayed
                if len(data) > room:  # what fits goes through, then the connection is cut
                    if room > 0:
                        self.relayed += room
                        if up:
                            conn.sent += room
                        else:
                            conn.received += room
                        dst.write(data[:room])
                        with contextlib.suppress(OSError):
                            await dst.drain()
                    raise _Ended(f"the command's {self.limits.total_bytes} bytes are used up")
                self.relayed += len(data)
                if up:
                    conn.sent += len(data)
                else:
                    conn.received += len(data)
                last[0] = loop.time()
                dst.write(data)
                await dst.drain()

        tasks = [
            asyncio.ensure_future(pump(client_r, up_w, True)),
            asyncio.ensure_future(pump(up_r, client_w, False)),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                exc = task.exception()
                if isinstance(exc, _Ended):
                    return str(exc)
                if isinstance(exc, OSError):
                    return f"connection error: {exc.strerror or exc}"
            return "closed"
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After a refusal: end our side, and read what the client still sends (at most
    ``_LINGER_S``, a few chunks) so that closing with unread input does not reset the
    connection before the client read the answer."""
    if writer.can_write_eof():
        writer.write_eof()
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(_LINGER_S):
            for _ in range(16):
                if not await reader.read(_CHUNK):
                    return


class _Ended(Exception):
    """A relay cut short (idle, out of bytes): the reason."""


async def _open(address: IPAddress, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(str(address), port)


def parse(head: bytes) -> tuple[str, str, int, bytes]:
    """(method, host, port, what to send on) of a request head (``CONNECT``: nothing).

    Raises:
        Refused: not a request the proxy takes.
    """
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise Refused(400, "the request head is not ASCII") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Refused(400, "not an HTTP/1 request line")
    method, target, version = parts
    if method == "CONNECT":
        host, port = _authority(target, None)
        return method, host, port, b""
    if not method.isalpha() or not method.isupper():
        raise Refused(400, "not an HTTP method")
    url = urlsplit(target)
    if url.scheme != "http" or not url.netloc:
        raise Refused(400, "a plain request needs an absolute http:// URL (CONNECT for https)")
    if "@" in url.netloc:
        raise Refused(400, "a URL with credentials in its host part")
    host, port = _authority(url.netloc, 80)
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    kept = [
        line
        for line in lines[1:]
        if line and line.split(":", 1)[0].strip().lower().encode() not in _HOP
    ]
    forward = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close", "", ""])
    return method, host, port, forward.encode()


def _authority(text: str, default: int | None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) as (normal host, port)."""
    if text.startswith("["):
        host, sep, rest = text.partition("]")
        host, port = host + sep, rest[1:] if rest.startswith(":") else None
        if not sep or (rest and port is None):
            raise Refused(400, f"a malformed host {text[:100]!r}")
    elif ":" in text:
        host, _, port = text.rpartition(":")
    else:
        host, port = text, None
    if port is None:
        if default is None:
            raise Refused(400, "CONNECT needs host:port")
        return normal(host), default
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise Refused(400, f"a bad port in {text[:100]!r}")
    if not host:
        raise Refused(400, "no host")
    return normal(host), int(port)
