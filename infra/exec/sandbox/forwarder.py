"""How a command reaches its egress proxy (``Spawn.egress``): variables, and under bwrap a
forwarder inside the sandbox.

A bwrap sandbox has a network namespace of its own with loopback only, so no host port is
reachable from it. Its proxy (``infra.exec.egress``) listens on a unix socket instead, whose
directory is bound read-only at ``INSIDE``; the command is started through ``FORWARDER``
(the host's ``python3``, shown at /usr/bin in every sandbox), which listens on
``127.0.0.1:PORT`` in the sandbox's network, forks the command and relays each connection to
the socket until the command exits, then exits as it did (its status, or the same signal).
It ignores SIGINT, SIGTERM, SIGHUP and SIGQUIT itself (the command gets them: a timeout's
SIGTERM ends the command and then it; one that ignores SIGTERM is killed with the sandbox),
and keeps no standard stream open (the command's output ends when the command's does).

The local provider has the host's network anyway: its proxy is a loopback TCP port taking a
per-command credential in the URL (``EgressPort.url``); only the variables are set.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

from infra.exec.sandbox import common, wrapper
from infra.exec.sandbox.interface import (
    EgressPort,
    Limits,
    Live,
    OnOutput,
    Outcome,
    SandboxError,
    Spawn,
)

PORT = 3128
"""Where the forwarder listens in a bwrap sandbox (the usual proxy port)."""
INSIDE = "/tmp/.quill-egress"
"""Where a bwrap sandbox shows the proxy socket's directory: directly under /tmp, as git's
``remote.BOUND`` (bwrap makes a bind target's missing parents ``0700`` root, which the
sandbox's user could not enter)."""
NO_PROXY = "localhost,127.0.0.1,::1"

FORWARDER = wrapper.script(
    setup=r"""path, port, argv = sys.argv[1], int(sys.argv[2]), sys.argv[4:]
listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(128)
""",
    held="listener",
    serve=r"""
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
        b.shutdown(socket.SHUT_WR)
    except OSError:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

def serve(client):
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(path)
    except OSError:
        client.close()
        up.close()
        return
    other = threading.Thread(target=pipe, args=(client, up), daemon=True)
    other.start()
    pipe(up, client)
    other.join()
    client.close()
    up.close()

def accept():
    while True:
        try:
            client, _ = listener.accept()
            threading.Thread(target=serve, args=(client,), daemon=True).start()
        except (OSError, RuntimeError):
            pass

threading.Thread(target=accept, daemon=True).start()
""",
)
"""``python3 -I -S -c FORWARDER SOCKET PORT -- ARGV...`` (see the module docstring)."""


def environment(url: str) -> dict[str, str]:
    """The variables pointing a command's tools at the proxy ``url``: curl, git and Python's
    (``HTTPS_PROXY``, ``https_proxy``, ...), npm's (``npm_config_*``); loopback excluded."""
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "npm_config_proxy": url,
        "npm_config_https_proxy": url,
        "NO_PROXY": NO_PROXY,
        "no_proxy": NO_PROXY,
    }


def in_bwrap(spawn: Spawn, port: EgressPort) -> Spawn:
    """``spawn`` as a bwrap sandbox runs it with ``port``: the socket's directory bound, the
    command under the forwarder, the variables set (a command's own come last, and win).

    Raises:
        SandboxError: the host has no ``python3`` to run the forwarder with.
    """
    python3 = shutil.which("python3", path=common.PATH)
    if python3 is None:
        raise SandboxError("egress needs a python3 on the host's PATH (the forwarder)")
    socket = f"{INSIDE}/{port.socket.name}"
    argv = [python3, "-I", "-S", "-c", FORWARDER, socket, str(PORT), "--", *spawn.argv]
    return dataclasses.replace(
        spawn,
        argv=argv,
        env=environment(f"http://127.0.0.1:{PORT}") | dict(spawn.env),
        ro_binds=(*spawn.ro_binds, (port.socket.parent, INSIDE)),
        egress=None,
    )


def in_local(spawn: Spawn, port: EgressPort) -> Spawn:
    """``spawn`` as the local provider runs it with ``port``: the variables only."""
    assert port.url is not None
    return dataclasses.replace(spawn, env=environment(port.url) | dict(spawn.env), egress=None)


Wrap = Callable[[Spawn, EgressPort], Spawn]


async def start_with_egress(
    spawn: Spawn, *, tcp: bool, wrap: Wrap, start: Callable[[Spawn], Awaitable[Live]]
) -> Live:
    """Start ``spawn`` (``start``: the provider's own) with its egress proxy open for as long
    as the command lives (a yielded one's included): opened first, ``wrap`` makes the command
    reach it, closed once the command has been waited for (or could not start)."""
    assert spawn.egress is not None
    stack = contextlib.AsyncExitStack()
    try:
        port = await stack.enter_async_context(spawn.egress.open(tcp=tcp))
        inner = await start(wrap(spawn, port))
    except BaseException:
        await stack.aclose()
        raise
    return _Proxied(inner, stack)


class _Proxied:
    """A command and its proxy (``start_with_egress``), or its ports (``Spawn.ports``): they
    close after ``wait``."""

    def __init__(self, inner: Live, stack: contextlib.AsyncExitStack) -> None:
        self.inner, self.stack = inner, stack

    async def write(self, data: bytes, timeout_s: float) -> int:
        return await self.inner.write(data, timeout_s)

    def close_stdin(self) -> None:
        self.inner.close_stdin()

    def signal(self, signum: int) -> int:
        return self.inner.signal(signum)

    async def wait(self) -> Outcome:
        try:
            return await self.inner.wait()
        finally:
            await self.stack.aclose()


class Starts:
    """What both providers share of starting a command: ``run`` is ``start`` then ``wait``,
    and a command with ``Spawn.egress`` is started with its proxy (``start_with_egress``,
    made reachable by ``egress_wrap``); each provider's own ``_start`` does the rest."""

    egress_tcp: bool
    """Whether the proxy also listens on loopback TCP (no network namespace of its own)."""

    def egress_wrap(self, spawn: Spawn, port: EgressPort) -> Spawn:
        raise NotImplementedError

    def wrappers(self, spawn: Spawn) -> int:
        """The egress forwarder and the ports agent, each a process in a sandbox of its own
        network; none where the command has the host's (they are not started there)."""
        if self.egress_tcp:
            return 0
        return (spawn.egress is not None) + (spawn.ports is not None)

    async def _start(
        self, checkout: Path, spawn: Spawn, limits: Limits, on_output: OnOutput | None
    ) -> Live:
        raise NotImplementedError

    async def run(
        self, checkout: Path, spawn: Spawn, limits: Limits, on_output: OnOutput | None = None
    ) -> Outcome:
        return await (await self.start(checkout, spawn, limits, on_output)).wait()

    async def start(
        self, checkout: Path, spawn: Spawn, limits: Limits, on_output: OnOutput | None = None
    ) -> Live:
        if spawn.ports is not None:  # reachable for as long as the sandbox lives
            ports = spawn.ports
            stack = contextlib.AsyncExitStack()
            try:
                await stack.enter_async_context(ports.opened(agent=not self.egress_tcp))
                inner = dataclasses.replace(spawn, ports=None)
                if not self.egress_tcp:
                    inner = ports.wrap(inner)
                live = await self.start(checkout, inner, limits, on_output)
            except BaseException:
                await stack.aclose()
                raise
            return _Proxied(live, stack)
        if spawn.egress is None:
            return await self._start(checkout, spawn, limits, on_output)
        return await start_with_egress(
            spawn,
            tcp=self.egress_tcp,
            wrap=self.egress_wrap,
            start=lambda s: self._start(checkout, s, limits, on_output),
        )
