"""Which addresses the executor may connect to on an agent's behalf: public ones only.

Shared by remote git (``infra.exec.git.targets``) and the egress proxy (``infra.exec.egress``):
an address an agent chooses (a remote's URL, a host a command asks the proxy for) must never
make the executor a probe of the host (loopback), of the internal network (private, shared,
link-local) or of a cloud's metadata service (169.254.169.254, fd00:ec2::254). ``is_public``
is that rule (its list: ``infra.exec.git.targets``' docstring); ``literal`` and ``numeric`` tell
an IP literal from a host name (and catch the names resolvers would read as addresses);
``system_resolver`` is the resolver both use unless a test gives its own.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Sequence

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""``(host name, port)`` to its addresses, as text (``socket.getaddrinfo``'s by default)."""

_BLOCKED: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",  # this network, unspecified
        "10.0.0.0/8",
        "100.64.0.0/10",  # shared address space (CGNAT)
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local, cloud metadata (169.254.169.254)
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.88.99.0/24",  # 6to4 relay anycast
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, broadcast
        "::/127",  # unspecified, loopback
        "::/96",  # IPv4-compatible (deprecated)
        "::ffff:0:0/96",  # IPv4-mapped: refused whatever it maps
        "64:ff9b::/96",  # NAT64: refused whatever it maps
        "64:ff9b:1::/48",  # local-use NAT64
        "100::/64",  # discard
        "2001::/23",  # IETF protocol assignments (Teredo among them)
        "2001:db8::/32",  # documentation
        "fc00::/7",  # unique local (fd00:ec2::254, the EC2 metadata service)
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated)
        "ff00::/8",  # multicast
    )
)
NAME = re.compile(r"^(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
_NUMERIC_LABEL = re.compile(r"^(?:[0-9]+|0x[0-9a-f]*)$")


def is_public(address: IPAddress) -> bool:
    """Whether ``address`` is a public unicast address (see the module's docstring)."""
    if any(address in net for net in _BLOCKED if net.version == address.version):
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.sixtofour is not None:
        if not is_public(address.sixtofour):
            return False
    return not (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_unspecified
        or address.is_reserved
    ) and bool(address.is_global)


def literal(host: str) -> IPAddress | None:
    """The address of a host that is an IP literal (``[...]`` for IPv6), else None."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def numeric(name: str) -> bool:
    """Whether a host name that is no canonical IP literal would still be read as an address
    (``2130706433``, ``0x7f.1``, ``127.1``): refused as a host name, as resolvers disagree."""
    return bool(_NUMERIC_LABEL.match(name.rsplit(".", 1)[-1]))


async def system_resolver(name: str, port: int) -> Sequence[str]:
    """The addresses of ``name`` from the system's resolver (``getaddrinfo``)."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return [str(info[4][0]) for info in infos]


def loopback_name(name: str) -> bool:
    """Whether ``name`` is one resolvers (and libcurl) answer with loopback themselves."""
    return name == "localhost" or name.endswith(".localhost")
