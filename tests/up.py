"""``quill up`` as a real subprocess (its own process group), and the CLI against it: the one
launcher of the tests (``tests/conftest.py``'s ``up`` fixture is a module's ``running``).

``running(data, *args, tenants=..., secrets=..., env=...)`` for a block; ``Up(...).start()``
where a test stops or kills it itself; ``TENANTS`` (tenants a and b, with their NATS
passwords and gateway tokens) for ``tenants=``, and ``quill_as`` to connect as one of them
(``bare_as``, ``bare``: a bare nats-py client)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS

from quill.client import Quill, Workspace
from tests.helpers import Refusals

READY = re.compile(r"quill ready nats=(\S+) http=(\S+)")

PASSWORDS = {"a": "tenant-a-password", "b": "tenant-b-password"}
TOKENS = {"a": "token-of-tenant-a", "b": "token-of-tenant-b"}
BRIDGES = {"a": "", "b": "bridges = true\n"}
"""b may serve local workspaces: a bridge tenant is attacked, and attacks, like any other."""
TENANTS = "".join(
    f'[tenants.{t}]\npassword = "{PASSWORDS[t]}"\n{BRIDGES[t]}\n'
    f'[tenants.{t}.tokens."{TOKENS[t]}"]\nworkspace = "shared"\n\n'
    for t in ("a", "b")
)
"""A ``--tenants`` file: tenants a and b, each with its NATS user and a gateway token, both on
a workspace named ``shared``."""


@dataclass
class Up:
    """A running ``quill up`` (or, with ``command=("cluster", "up")``, ``quill cluster up``)."""

    data: Path
    args: tuple[str, ...] = ()
    """More options for the command."""
    command: tuple[str, ...] = ("up",)
    env: Mapping[str, str] = field(default_factory=dict)
    """More environment for its process (``QUILL_RESTART_BACKOFF``)."""
    process: subprocess.Popen[str] | None = None
    nats_url: str = ""
    http_url: str = ""
    output: list[str] = field(default_factory=list)
    ready_s: float = 0.0
    """How long it took to print its ready line."""
    _pump: threading.Thread | None = None

    def tracebacks(self, most: int = 20_000) -> str:
        """The tracebacks its services logged (``<data>/logs/*.log``), at most ``most``
        characters: shown beside a failed test that used it (``tests/conftest.py``)."""
        found: list[str] = []
        for log in sorted((self.data / "logs").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()
            for n, line in enumerate(lines):
                if line.startswith("Traceback"):
                    found.append(f"{log.name}: {lines[n - 1] if n else ''}")
                    found.extend(lines[n : n + 40])
        return "\n".join(found)[-most:]

    def start(self, timeout: float = 60.0) -> Up:
        self.output = []
        began = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "quill", *self.command, "--data", str(self.data)]
            + ["--nats-port", "0", "--http-port", "0", *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, **self.env},
        )
        ready = threading.Event()

        def pump() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                self.output.append(line)
                if match := READY.search(line):
                    self.nats_url, self.http_url = match.group(1), match.group(2)
                    ready.set()
            ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        if not ready.wait(timeout) or not self.nats_url:
            self.kill()
            name = " ".join(self.command)
            raise RuntimeError(f"quill {name} did not get ready:\n" + "".join(self.output))
        self.ready_s = time.monotonic() - began
        return self

    def kill(self) -> None:
        """``kill -9`` the whole process group."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._close()

    def stop(self) -> int:
        """SIGTERM, as Ctrl-C would; return the exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(30)
        self._close()
        return code

    def _close(self) -> None:
        """Stop reading its output. Closing a pipe that the pump thread is still reading blocks
        on the reader's lock until that read returns, which is never while a process the
        stack left behind holds the pipe open (a test that hung 45 min in teardown): then the
        pipe is left to the daemon thread."""
        pumping = False
        if self._pump is not None:
            self._pump.join(10)
            pumping = self._pump.is_alive()
            self._pump = None
        if not pumping and self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    def cli(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``quill ARGS`` against this ``up`` (``env``: more environment, the credentials of
        a tenant), done; ``check``: raise unless it exits 0."""
        env = {**os.environ, "QUILL_NATS_URL": self.nats_url, **(env or {})}
        result = subprocess.run(
            [sys.executable, "-m", "quill", *args],
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,  # never the test runner's
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"quill {' '.join(args)} failed: {result.stderr}")
        return result

    def failure(self, *args: str) -> tuple[int, str]:
        """``quill ARGS`` run for how it fails: its exit code and its standard error, to be
        compared whole."""
        result = self.cli(*args, check=False)
        return result.returncode, result.stderr

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        """``quill ARGS`` running in the background against this ``up`` (a second user, or an
        agent that waits): its output in pipes, the caller waits for it."""
        return subprocess.Popen(
            [sys.executable, "-m", "quill", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "QUILL_NATS_URL": self.nats_url},
        )


@contextlib.contextmanager
def running(
    data: Path,
    *args: str,
    tenants: str | None = None,
    secrets: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[Up]:
    """``quill up --data DATA ARGS...`` until the block ends (then stopped, if still up).

    ``tenants``, ``secrets``: the text of its ``--tenants`` and ``--secrets`` files (written
    beside ``data``, 0600); ``env``: more environment for its process."""
    home = data.parent
    home.mkdir(parents=True, exist_ok=True)
    for name, text in (("tenants", tenants), ("secrets", secrets)):
        if text is not None:
            path = home / f"{name}.toml"
            path.write_text(text)
            path.chmod(0o600)
            args = (*args, f"--{name}", str(path))
    stack = Up(data, args=args, env=env or {}).start()
    try:
        yield stack
    finally:
        if stack.process and stack.process.poll() is None:
            stack.stop()


async def bare_as(up: Up, tenant: str, password: str | None = None, **options: Any) -> NATS:
    """A bare nats-py client as ``tenant`` (of ``TENANTS`` unless ``password`` is given),
    replying on its own inboxes; ``options``: more of ``nats.connect``'s (``error_cb``)."""
    return await nats.connect(
        up.nats_url,
        user=tenant,
        password=password or PASSWORDS[tenant],
        inbox_prefix=f"_INBOX_{tenant}",
        **options,
    )


@contextlib.asynccontextmanager
async def bare(up: Up, tenant: str | None) -> AsyncIterator[NATS]:
    """``bare_as`` for a block, closed when it ends (``tenant`` None: a ``quill up`` without
    tenants, connected without credentials)."""
    nc = await (bare_as(up, tenant) if tenant is not None else nats.connect(up.nats_url))
    try:
        yield nc
    finally:
        await nc.close()


async def quill_as(up: Up, tenant: str) -> Quill:
    """An SDK client as ``tenant`` of ``TENANTS``."""
    return await Quill.connect(up.nats_url, user=tenant, password=PASSWORDS[tenant], actor=tenant)


@contextlib.asynccontextmanager
async def a_against_b(up: Up) -> AsyncIterator[tuple[Workspace, NATS, Refusals]]:
    """Tenant a's workspace ``a/shared`` and tenant b's (both made), b as a bare nats-py
    client and the refusals the server reports to it: ``(a's workspace, b, b's refusals)``,
    all closed when the block ends. How a test of what b cannot reach of a's begins."""
    qa = await quill_as(up, "a")
    qb = await quill_as(up, "b")
    refusals = Refusals(whole=True)
    nb = await bare_as(up, "b", error_cb=refusals.on_error)
    try:
        wa = qa.workspace("a/shared")
        await wa.create(exist_ok=True)
        await qb.workspace("b/shared").create(exist_ok=True)
        yield wa, nb, refusals
    finally:
        await nb.close()
        await qa.close()
        await qb.close()
