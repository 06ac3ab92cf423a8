"""Egress: packages without opening the network.

A sandbox has no network (bwrap: a network namespace of its own, loopback only). An operator
may let a tenant's or a workspace's commands reach named hosts (a package index) through a
proxy the executor runs for each command (``quill executor --egress-allow
TENANT[/WORKSPACE]=HOST,...``: ``rules``). The proxy (``proxy``) admits only those host names,
resolves them itself, connects only to public addresses (``infra.exec.addresses``, git's
rule), pinned, and hands every connection (host, port, address, bytes each way, verdict,
reason) to the executor, which audits it and counts it by verdict.

How a command reaches it: the proxy listens on a unix socket of its own per command
(``Proxy.socket``); a bwrap sandbox binds that socket's directory read-only, and a forwarder
its first process starts (``infra.exec.sandbox.forwarder``) listens on 127.0.0.1:3128 in the
sandbox's own network namespace, relaying each connection to the socket; ``HTTPS_PROXY``,
``HTTP_PROXY`` (and lower-case, npm's and ``NO_PROXY``) point there. The local provider, which
has the host's network anyway, gets a loopback TCP port taking a per-command credential.
A workspace with no entry gets nothing: no proxy, no socket, no variable (as before).

Modules
-------
``rules``  the operator's allow-list: ``Rules``, ``HostPattern``
``proxy``  one command's proxy: ``Proxy``, ``Policy``, ``ProxyLimits``, ``Connection``
(here)     ``Gate``: the executor's egress, handing each allowed command a ``Grant``
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from infra.exec.egress.proxy import Connection, Dial, Policy, Proxy, ProxyLimits
from infra.exec.egress.rules import HostPattern, Rules
from infra.exec.sandbox.interface import EgressPort

__all__ = [
    "Connection",
    "Dial",
    "Gate",
    "Grant",
    "HostPattern",
    "Policy",
    "Proxy",
    "ProxyLimits",
    "Rules",
]

SOCKET_PATH_MAX = 100
"""A unix socket's path must fit ``sun_path`` (108 bytes, with its NUL)."""

Audit = Callable[[Connection], Awaitable[None]]


class Grant:
    """One command's right to the proxy (``Spawn.egress``): the provider opens it around the
    sandbox (``open``), and everything is closed when the command ends."""

    def __init__(
        self, hosts: tuple[HostPattern, ...], policy: Policy, directory: Path, audit: Audit
    ) -> None:
        self.hosts, self.policy, self.directory, self.audit = hosts, policy, directory, audit
        self.proxy: Proxy | None = None
        """The last proxy opened (tests read its counts)."""

    @contextlib.asynccontextmanager
    async def open(self, *, tcp: bool) -> AsyncIterator[EgressPort]:
        """A proxy listening for one sandbox: its unix socket, and with ``tcp`` a loopback
        URL with its credential."""
        where = self.directory / secrets.token_hex(6)
        where.mkdir(mode=0o755, parents=True)
        where.chmod(0o755)  # whatever the umask: the sandbox's uid must enter it
        proxy = self.proxy = Proxy(self.hosts, self.policy, self.audit, where)
        try:
            await proxy.start(tcp=tcp)
            yield EgressPort(socket=proxy.socket, url=proxy.url)
        finally:
            await proxy.close()
            shutil.rmtree(where, ignore_errors=True)


class Gate:
    """The executor's egress: the operator's ``rules``, how proxies resolve and connect
    (``policy``), where their sockets go (``directory``, under the executor's private data
    directory)."""

    def __init__(self, rules: Rules, directory: Path, policy: Policy | None = None) -> None:
        longest = directory / ("x" * 12) / "proxy.sock"
        if len(str(longest)) > SOCKET_PATH_MAX:  # sun_path: a private directory under /tmp
            directory = Path(tempfile.mkdtemp(prefix="quill-egress-"))
            if len(str(directory / ("x" * 12) / "proxy.sock")) > SOCKET_PATH_MAX:
                raise ValueError(f"egress: no directory short enough for a socket: {directory}")
        self.rules, self.directory, self.policy = rules, directory, policy or Policy()

    def grant(self, tenant: str, workspace: str, audit: Audit) -> Grant | None:
        """The proxy ``tenant/workspace``'s command may use, each connection handed to
        ``audit``; None when the workspace may reach no host."""
        hosts = self.rules.hosts(tenant, workspace)
        if not hosts:
            return None
        return Grant(hosts, self.policy, self.directory, audit)
