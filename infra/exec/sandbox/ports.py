"""How the executor reaches a TCP port that a process of a long-lived sandbox (a shell) listens
on in the sandbox's loopback (``Spawn.ports``): the reverse of ``forwarder``.

A bwrap sandbox has a network namespace of its own, so nothing on the host reaches its
``127.0.0.1``. ``Ports`` listens on a unix socket in a directory of its own, bound read-only
into the sandbox at ``INSIDE`` (world-connectable, as the egress proxy's), and the sandbox's
command is started through ``AGENT`` (the host's ``python3``, shown at /usr/bin in every
sandbox): the agent connects to that socket first (one control connection, made before any
command of the sandbox runs: ``Ports`` takes that first connection and no other, then removes
the socket), forks the command, and then for each port the executor names (``12345\\n``) it
connects to ``127.0.0.1:<port>`` inside the sandbox's network and hands the connected socket
back over the control connection (``SCM_RIGHTS``), or the error number. The executor then
talks to that socket itself: no relay, and nothing but the sandbox's own loopback is reached,
whatever is asked. A socket handed back is checked (a connected TCP socket to
``127.0.0.1:<port>``): a process of the sandbox that replaced the agent can give nothing the
sandbox could not reach anyway. Like the forwarder, the agent ignores SIGINT, SIGTERM, SIGHUP
and SIGQUIT, keeps no standard stream open, and exits as the command did.

The local provider has the host's network: ``connect`` dials ``127.0.0.1:<port>`` of the host
directly (no isolation at all: any host port is reached that way; docs/executor.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import os
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path

from infra.exec.sandbox import common, wrapper
from infra.exec.sandbox.interface import SandboxError, Spawn

INSIDE = "/tmp/.quill-ports"
"""Where a bwrap sandbox shows the agent's socket directory (directly under /tmp: see
``forwarder.INSIDE``)."""
SOCKET = "agent.sock"
CONNECT_S = 5.0
"""How long the agent may take to connect, and to answer for one port."""

AGENT = wrapper.script(
    setup=r"""path, argv = sys.argv[1], sys.argv[3:]
control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
control.connect(path)
""",
    held="control",
    serve=r"""
def serve():
    lines = control.makefile("rb")
    while True:
        line = lines.readline(16)
        if not line.endswith(b"\n"):
            return
        try:
            port = int(line)
            s = socket.create_connection(("127.0.0.1", port), timeout=4)
        except (OSError, ValueError) as e:
            code = getattr(e, "errno", None) or 22
            control.sendall(b"-%03d" % (code % 1000))
            continue
        socket.send_fds(control, [b"+000"], [s.fileno()])
        s.close()

threading.Thread(target=serve, daemon=True).start()
""",
)
"""``python3 -I -S -c AGENT SOCKET -- ARGV...`` (see the module docstring)."""


class PortRefused(Exception):
    """Nothing listens on the port (or it could not be reached): the error's text says which."""


class Ports:
    """One sandbox's ports, as the executor reaches them (see the module docstring).

    ``directory`` is the socket's (made here, for this sandbox alone); the provider opens it
    (``opened``) for as long as the sandbox lives. Until then, and after, ``connect`` fails."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.direct = False
        """The host's own loopback (the local provider): no agent."""
        self._listener: socket.socket | None = None
        self._accepted: asyncio.Task[socket.socket] | None = None
        self._control: socket.socket | None = None
        self._lock = asyncio.Lock()
        self._open = False

    @contextlib.asynccontextmanager
    async def opened(self, *, agent: bool) -> AsyncIterator[None]:
        """Reachable while the context lasts: through an agent (``agent``) or directly."""
        self.direct, self._open = not agent, True
        try:
            if agent:
                self._listen()
            yield
        finally:
            self._open = False
            self._close()

    def _listen(self) -> None:
        self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.directory.chmod(0o755)  # whatever the umask: the sandbox's uid must enter it
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # by the directory's descriptor: a path of any length (sun_path holds 108 bytes)
            listener.bind(f"/proc/self/fd/{fd}/{SOCKET}")
            os.chmod(SOCKET, 0o666, dir_fd=fd)
            listener.listen(1)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        finally:
            os.close(fd)
        self._listener = listener
        self._accepted = asyncio.ensure_future(self._accept(listener))

    async def _accept(self, listener: socket.socket) -> socket.socket:
        """The agent's connection (the first), then no other: the socket goes."""
        conn, _ = await asyncio.get_running_loop().sock_accept(listener)
        self._unlisten()
        conn.setblocking(True)
        conn.settimeout(CONNECT_S)
        self._control = conn
        return conn

    def _unlisten(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            with contextlib.suppress(OSError):
                (self.directory / SOCKET).unlink()

    def _close(self) -> None:
        if self._accepted is not None:
            self._accepted.cancel()
        self._unlisten()
        if self._control is not None:
            self._control.close()
            self._control = None

    def wrap(self, spawn: Spawn) -> Spawn:
        """``spawn`` started through the agent, its socket's directory bound.

        Raises:
            SandboxError: the host has no ``python3`` to run the agent with.
        """
        python3 = shutil.which("python3", path=common.PATH)
        if python3 is None:
            raise SandboxError("a shell's ports need a python3 on the host's PATH (the agent)")
        argv = [python3, "-I", "-S", "-c", AGENT, f"{INSIDE}/{SOCKET}", "--", *spawn.argv]
        return dataclasses.replace(
            spawn, argv=argv, ro_binds=(*spawn.ro_binds, (self.directory, INSIDE)), ports=None
        )

    async def connect(self, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``127.0.0.1:port`` in the sandbox's network, as streams.

        Raises:
            PortRefused: nothing listens there, or the sandbox (its agent) is gone.
        """
        return await asyncio.open_connection(sock=await self.dial(port))

    async def dial(self, port: int) -> socket.socket:
        """A connected socket to ``127.0.0.1:port`` in the sandbox's network (non-blocking).

        Raises:
            PortRefused: nothing listens there, or the sandbox (its agent) is gone.
        """
        if not self._open:
            raise PortRefused("the shell has ended")
        if self.direct:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                loop = asyncio.get_running_loop()
                await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), CONNECT_S)
            except (OSError, TimeoutError) as exc:
                sock.close()
                raise PortRefused(_why(exc, port)) from None
            return sock
        return await self._through_agent(port)

    async def _through_agent(self, port: int) -> socket.socket:
        accepted = self._accepted
        if accepted is None:
            raise PortRefused("the shell has ended")
        try:
            control = await asyncio.wait_for(asyncio.shield(accepted), CONNECT_S)
        except (TimeoutError, asyncio.CancelledError, OSError):
            raise PortRefused("the shell's port agent did not start") from None
        async with self._lock:
            if self._control is not control:
                raise PortRefused("the shell has ended")
            try:
                sock = await asyncio.to_thread(_ask, control, port)
            except OSError as exc:
                if exc.filename == "agent":  # the agent's own answer for the port
                    raise PortRefused(_why(exc, port)) from None
                self._close()  # out of step, or gone: no more answers
                raise PortRefused(f"the shell's port agent is gone ({exc})") from None
        return sock


def _ask(control: socket.socket, port: int) -> socket.socket:
    """One exchange with the agent (in a thread): the checked socket to ``port``.

    Raises:
        OSError: with ``filename`` set, the agent's own error for the port; else the control
            connection failed.
    """
    control.sendall(b"%d\n" % port)
    data, fds, _, _ = socket.recv_fds(control, 4, 1)
    if len(data) != 4:
        for fd in fds:
            os.close(fd)
        raise ConnectionResetError("the agent closed its connection")
    if data[:1] == b"-" and data[1:].isdigit() and not fds:
        code = int(data[1:])
        raise OSError(code, os.strerror(code), "agent")
    if data != b"+000" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ConnectionResetError("the agent answered out of protocol")
    sock = socket.socket(fileno=fds[0])
    try:
        family, kind = sock.family, sock.type
        peer = sock.getpeername() if family == socket.AF_INET else None
    except OSError:
        peer = None
    if family != socket.AF_INET or kind != socket.SOCK_STREAM or peer != ("127.0.0.1", port):
        sock.close()
        raise OSError(errno.ECONNREFUSED, "not a connection to that port", "agent")
    sock.setblocking(False)
    return sock


def _why(exc: BaseException, port: int) -> str:
    if isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED:
        return f"nothing listens on port {port} in the shell"
    if isinstance(exc, TimeoutError) or getattr(exc, "errno", None) == errno.ETIMEDOUT:
        return f"port {port} in the shell did not accept a connection in time"
    return f"port {port} in the shell could not be reached ({exc})"
