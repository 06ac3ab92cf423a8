"""Who may reach which hosts through the egress proxy: the operator's allow-list.

An entry (``quill executor --egress-allow``) is ``TENANT[/WORKSPACE]=HOST[,HOST...]``: a
tenant's every workspace, or one workspace, may reach those hosts. A HOST is

* a name (``pypi.org``): that name only;
* ``*.`` and a suffix (``*.pythonhosted.org``): any name below it (not the suffix itself);
* a public IP literal (``151.101.0.223``; IPv6 in brackets when a port follows): a client
  asking for that address literally (never a name resolving to it: names are checked as names);

each with ``:PORT``, or without: ports 443 and 80 only. A name is matched case-insensitively
and without a trailing dot; a name resolvers would read as an address (``2130706433``,
``127.1``) is refused, as for git (``addresses.numeric``). Where it leads is checked afterwards
by the proxy, whatever the entry says: every address must be public (``addresses.is_public``).

Only the operator writes these (a command line, not a request): a tenant cannot grant itself
a host. Without an entry for it, a workspace gets no proxy at all (no socket, no variable).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts.errors import QuillError
from contracts.subjects import check_id
from infra.exec.addresses import NAME, IPAddress, is_public, literal, numeric

DEFAULT_PORTS = (443, 80)
"""The ports of an entry that names none."""


@dataclass(frozen=True, slots=True)
class HostPattern:
    """One allowed host: a name, ``*.suffix`` or a public IP literal; a port or 443 and 80."""

    name: str = ""
    """A lower-case name, or the suffix of a wildcard (without ``*.``)."""
    wildcard: bool = False
    address: IPAddress | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        """``pypi.org``, ``*.pythonhosted.org``, ``registry.npmjs.org:443``, ``[2001:db9::1]:443``.

        Raises:
            ValueError: not such a host.
        """
        raw = text.strip().lower()
        host, port = raw, None
        if raw.startswith("["):
            host, sep, rest = raw.partition("]")
            host += sep
            if not sep or (rest and not rest.startswith(":")):
                raise ValueError(f"egress allow-list: bad host {text!r}")
            port = rest[1:] if rest else None
        elif raw.count(":") == 1:
            host, port = raw.split(":")
        number = None
        if port is not None:
            if not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"egress allow-list: bad port in {text!r}")
            number = int(port)
        address = literal(host)
        if address is not None:
            if not is_public(address):
                raise ValueError(f"egress allow-list: {text!r} is not a public address")
            return cls(address=address, port=number)
        wildcard = host.startswith("*.")
        name = host[2:] if wildcard else host
        name = name.removesuffix(".")
        if not NAME.match(name) or numeric(name) or (not wildcard and "." not in name):
            raise ValueError(f"egress allow-list: {text!r} is no host name (or *.suffix)")
        return cls(name=name, wildcard=wildcard, port=number)

    def admits(self, host: str, port: int) -> bool:
        """Whether a client asking for ``host:port`` (``host`` normalised: ``normal``) may."""
        if port not in ((self.port,) if self.port is not None else DEFAULT_PORTS):
            return False
        if self.address is not None:
            return literal(host) == self.address
        if self.wildcard:
            return host.endswith("." + self.name)
        return host == self.name

    def __str__(self) -> str:
        host = (
            f"[{self.address}]"
            if self.address is not None and self.address.version == 6
            else (
                str(self.address)
                if self.address is not None
                else ("*." if self.wildcard else "") + self.name
            )
        )
        return host if self.port is None else f"{host}:{self.port}"


def normal(host: str) -> str:
    """``host`` as the rules compare it: lower-case, no trailing dot (an IP literal as is)."""
    return host.lower().removesuffix(".")


@dataclass(frozen=True, slots=True)
class Rule:
    tenant: str
    workspace: str | None
    """None: every workspace of the tenant."""
    hosts: tuple[HostPattern, ...]


@dataclass(frozen=True, slots=True)
class Rules:
    """The operator's egress allow-list (see the module docstring)."""

    rules: tuple[Rule, ...] = ()

    @classmethod
    def parse(cls, entries: Sequence[str]) -> Rules:
        """``TENANT[/WORKSPACE]=HOST,HOST`` each.

        Raises:
            ValueError: an entry is malformed.
        """
        rules = []
        for entry in entries:
            who, sep, hosts = entry.partition("=")
            tenant, _, workspace = who.strip().partition("/")
            try:
                check_id("tenant", tenant)
                if workspace:
                    check_id("workspace", workspace)
            except QuillError as exc:
                raise ValueError(f"egress allow-list: {entry!r}: {exc.message}") from None
            if not sep or not hosts.strip():
                raise ValueError(f"egress allow-list: {entry!r} is not TENANT[/WORKSPACE]=HOST,...")
            patterns = tuple(HostPattern.parse(h) for h in hosts.split(",") if h.strip())
            rules.append(Rule(tenant, workspace or None, patterns))
        return cls(tuple(rules))

    def hosts(self, tenant: str, workspace: str) -> tuple[HostPattern, ...]:
        """What ``tenant/workspace`` may reach (its tenant's entries and its own); () none."""
        return tuple(
            host
            for rule in self.rules
            if rule.tenant == tenant and rule.workspace in (None, workspace)
            for host in rule.hosts
        )

    def __bool__(self) -> bool:
        return bool(self.rules)
