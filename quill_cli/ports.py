"""Ports on this machine for a launcher's processes: a free one, whether one is busy, a series
of them never picked twice, and whether an HTTP endpoint answers 200 (no client library)."""

from __future__ import annotations

import asyncio
import random
import socket
from dataclasses import dataclass, field
from pathlib import Path

EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
QUIET_FROM = 10000


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (for ``--http-port 0``)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def quiet_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, below the kernel's ephemeral range when it can: outgoing
    connections take their local ports from that range, and one could take a port picked
    there before the process it is for binds it (seen: a service then failed to start)."""
    try:
        low = int(EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    if low - QUIET_FROM >= 1000:
        for _ in range(50):
            port = random.randrange(QUIET_FROM, low)
            if not port_busy(port, host):
                return port
    return free_port(host)


@dataclass
class Ports:
    """The ports a launcher picks for its processes: from a first one on, or free ones (a first
    of 0: ``quiet_port``); never one twice."""

    taken: set[int] = field(default_factory=set)

    def pick(self, first: int, index: int) -> int:
        """``first + index``, or a free port when ``first`` is 0."""
        if first:
            port = first + index
        else:
            while (port := quiet_port()) in self.taken:
                pass
        self.taken.add(port)
        return port

    def free(self) -> int:
        return self.pick(0, 0)


def port_busy(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on ``host:port`` (or holds it: it cannot be bound)."""
    if not port:
        return False
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


async def http_ok(host: str, port: int, path: str, timeout: float = 2.0) -> bool:
    """True when ``GET path`` on ``host:port`` answers 200 (no HTTP client library needed)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return False
    try:
        request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
        writer.write(request.encode())
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), timeout)
        return status.split()[1:2] == [b"200"]
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
