"""Where remote git may connect: public addresses only, pinned, unless allow-listed.

The executor's network runs (push, pull, clone) connect from the executor's host network, so a
remote URL is an address an agent chooses: without a check, ``http://127.0.0.1:4222/``,
``http://169.254.169.254/`` (cloud metadata) or ``http://10.0.0.5/`` would make the executor
a probe of the host and of the internal network. Hence, before any connection:

1. The URL's host is resolved here (an IP literal as is, a name with the system's resolver),
   once per network run.
2. The first address that is admitted is chosen: a public one (``is_public``, shared with the
   egress proxy in ``infra.exec.addresses``: not loopback,
   link-local, private, shared (CGNAT), multicast, unspecified, reserved, documentation or
   benchmarking, nor an IPv6 form of such an IPv4 address (6to4; IPv4-mapped, -compatible and
   NAT64 addresses are refused whatever they embed); the metadata
   addresses 169.254.169.254 and fd00:ec2::254 are link-local and private), or one the
   deployment's allow-list admits (``Allowed``).
3. git connects to that address only: ``http.curloptResolve=<host>:<port>:<address>`` puts it
   in libcurl's DNS cache, so git never resolves the name itself and a DNS answer that changes
   afterwards (rebinding) does not move the connection; ``http.followRedirects=false`` (in
   ``running.HARDENING``) keeps a redirect from leading elsewhere. Only http(s) are allowed
   (``remote`` refuses ssh, git://, file://, ``ext::``...); the sandbox's environment has no
   proxy variable and the scratch repository's config no proxy.
4. Every refused, unresolvable or unreachable target, and every failure before the remote
   spoke git (connection refused or reset, TLS, an HTTP server that is not git, a repository
   that does not exist), ends in the same error, ``unreachable()``: its text does not tell a
   refused address from an unreachable one, nor an open port from a closed one. Only what a
   git server says itself (``remote:`` lines, rejected refs, authentication) is passed on.

The allow-list (``[git] allow`` in the credentials TOML, ``quill executor --git-allow``) is
for a deployment whose git server is internal: ``HOST[:PORT]`` where HOST is a name (the URL's
host must be that name: any address it resolves to is then admitted), an IP address or a
network in CIDR form (``10.1.0.0/16``; the address resolved must be in it; IPv6 in brackets
when a port follows: ``[fd00::/8]:443``). Without a port, any port of it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from contracts.errors import ErrorCode, QuillError
from infra.exec.addresses import (
    NAME,
    IPAddress,
    IPNetwork,
    Resolver,
    is_public,
    literal,
    loopback_name,
    numeric,
    system_resolver,
)

__all__ = [
    "UNREACHABLE",
    "Allowed",
    "IPAddress",
    "Resolver",
    "Target",
    "Targets",
    "is_public",
    "literal",
    "numeric",
    "spoke_git",
    "system_resolver",
    "unreachable",
]

UNREACHABLE = (
    "The git remote cannot be reached: its address is not public (and not in the executor's "
    "git allow-list), it does not answer, or it is not a git repository"
)
"""The one message of every refused or unreachable remote."""

RESOLVE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Allowed:
    """One allow-list entry: a host name, an address or a network; a port or any."""

    name: str | None = None
    network: IPNetwork | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> Allowed:
        """``HOST[:PORT]``: ``git.internal``, ``git.internal:8443``, ``10.1.2.3``,
        ``10.1.0.0/16:443``, ``[fd00::1]:443``, ``fd00::/8``.

        Raises:
            ValueError: not such an entry.
        """
        raw = text.strip().lower()
        host, port = raw, None
        if raw.startswith("["):
            host, sep, rest = raw[1:].partition("]")
            if not sep or (rest and not rest.startswith(":")):
                raise ValueError(f"git allow-list: bad entry {text!r}")
            if rest:
                port = rest[1:]
        elif raw.count(":") == 1:
            host, port = raw.split(":")
        number = None
        if port is not None:
            if not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"git allow-list: bad port in {text!r}")
            number = int(port)
        try:
            return cls(network=ipaddress.ip_network(host, strict=False), port=number)
        except ValueError:
            pass
        if not NAME.match(host) or numeric(host):
            raise ValueError(f"git allow-list: {text!r} is no host name, address or network")
        return cls(name=host, port=number)

    def admits(self, name: str, port: int, address: IPAddress) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.name is not None:
            return self.name == name
        assert self.network is not None
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address.version == self.network.version and address in self.network

    def __str__(self) -> str:
        host = self.name or str(self.network)
        if self.port is None:
            return host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Target:
    """Where a network run connects: the URL's host and port, and the one address."""

    host: str
    """As in the URL: a lower-case name, an IPv4 literal or ``[IPv6]``."""
    port: int
    address: IPAddress

    def config(self) -> list[str]:
        """The ``-c`` settings that make git connect to ``address`` only."""
        if literal(self.host) is not None:
            return []  # an address already: libcurl resolves nothing
        where = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        return [f"http.curloptResolve={self.host}:{self.port}:{where}"]


@dataclass(frozen=True, slots=True)
class Targets:
    """The executor's policy for remote git: the allow-list, and how names are resolved."""

    allow: tuple[Allowed, ...] = ()
    resolver: Resolver | None = None
    """None: the system's (``system_resolver``); tests give their own."""

    def allowing(self, entries: Sequence[str]) -> Targets:
        """These targets with more allow-list entries (``Allowed.parse`` each).

        Raises:
            ValueError: an entry is malformed.
        """
        more = tuple(Allowed.parse(e) for e in entries)
        return Targets(self.allow + more, self.resolver)

    def admits(self, name: str, port: int, address: IPAddress) -> bool:
        return is_public(address) or any(a.admits(name, port, address) for a in self.allow)

    async def resolve(self, host: str, port: int, timeout_s: float) -> Target:
        """The address git may connect to for ``host:port`` (``host`` as ``remote`` checked
        it: a lower-case name, an IPv4 literal or ``[IPv6]``).

        Raises:
            QuillError: ``unreachable()`` when no address is admitted or the name does not
                resolve (in ``timeout_s``).
        """
        address = literal(host)
        if address is not None:
            if self.admits(host, port, address):
                return Target(host, port, address)
            raise unreachable()
        if loopback_name(host) and not any(a.name == host for a in self.allow):
            raise unreachable()  # libcurl would answer these names itself, with loopback
        resolver = self.resolver or system_resolver
        try:
            async with asyncio.timeout(max(0.0, min(timeout_s, RESOLVE_TIMEOUT_S))):
                found = await resolver(host, port)
        except (OSError, TimeoutError, UnicodeError):
            raise unreachable() from None
        for text in found:
            try:
                candidate = ipaddress.ip_address(text.split("%", 1)[0])
            except ValueError:
                continue
            if "%" not in text and self.admits(host, port, candidate):
                return Target(host, port, candidate)
        raise unreachable()


def unreachable() -> QuillError:
    """The error of every refused or unreachable remote (one text: see the docstring)."""
    return QuillError(ErrorCode.EXECUTION_FAILED, UNREACHABLE)


_SPOKE_GIT = re.compile(
    r"^(?:remote: |To |\s*! \[|error: failed to push|fatal: couldn't find remote ref|"
    r"fatal: Authentication failed|fatal: could not read (?:Username|Password))"
)
"""Lines git prints only once a git server answered: a failure with none of them is a transport
failure, told as ``unreachable()``."""


def spoke_git(stderr: str) -> bool:
    """Whether git's error output shows that a git server answered."""
    return any(_SPOKE_GIT.match(line) for line in stderr.splitlines())
