"""More than one gateway process on one port (``quill gateway --workers N``).

The gateway is stateless (what a caller's session holds lives in its workspace's log), so
workers share nothing but the port: each is a whole gateway (its own NATS connection, MCP
servers, event loop) whose listening socket has ``SO_REUSEPORT``, and the kernel spreads new
connections across them. The process ``quill gateway`` starts is worker 0 and starts the
others (``multiprocessing``, spawned: nothing of the parent's event loop is inherited), waits
until each serves, and restarts one that exits, after a delay that doubles with each exit in a
row (at most ``MAX_DELAY_S``), logging each exit; ``/health`` counts them
(``gateway_workers``). A worker whose parent is gone stops.

Each worker n ≥ 1 serves its own metrics on a loopback port it picks and names with "ready"
(``metrics``: worker → URL); worker 0 serves them all as one (``infra/http/scrape.py``).

``default_count`` is how many a machine gets by default: one a core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Generic, Protocol, TypeVar

from infra.runtime import JsonFormatter, run_until_stopped, serve_metrics, setup_logging

log = logging.getLogger("quill.gateway")

START_TIMEOUT_S = 60.0
"""How long a worker has to serve before the gateway gives up starting."""
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 30.0
STEADY_S = 60.0
"""A worker that served this long before exiting is restarted at once (its delay reset)."""


def default_count() -> int:
    """One worker a core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


class Serving(Protocol):
    async def stop(self) -> None: ...


C = TypeVar("C")
Start = Callable[[C], Awaitable[Serving]]
"""What a worker runs: ``start_gateway`` (passed in, so this module needs nothing of the app)."""


class Workers(Generic[C]):
    """Workers 1..``count`` of a gateway whose worker 0 is this process."""

    def __init__(self, config: C, count: int, start: Start[C]) -> None:
        """``config``: a worker's (worker 0's port, ``reuse_port``, one worker); ``start``: a
        module-level function (the spawned process imports it by name)."""
        self.config, self.starter = config, start
        self.count = count
        root = logging.getLogger()
        json = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
        self.logging_as = (
            logging.getLevelName(root.getEffectiveLevel()),
            "json" if json else "text",
        )
        self.context = multiprocessing.get_context("spawn")
        self.processes: dict[int, BaseProcess] = {}
        self.metrics: dict[int, str] = {}
        """Worker n's metrics URL (its own series), while it serves."""
        self.restarts = 0
        self.restarted = asyncio.Event()
        """Set when a worker has been restarted (and serves again)."""
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> None:
        """Start every worker and wait until each serves.

        Raises:
            RuntimeError: a worker did not start (the others are stopped again).
        """
        try:
            await asyncio.gather(*(self._start(n) for n in range(1, self.count + 1)))
        except BaseException:
            await self.stop()
            raise
        self._watchers = [asyncio.create_task(self._watch(n)) for n in self.processes]

    async def _start(self, n: int) -> None:
        ours, theirs = self.context.Pipe(duplex=False)
        process = self.context.Process(
            target=serve,
            args=(self.config, self.starter, theirs, self.logging_as),
            name=f"quill-gateway-{n}",
            daemon=True,
        )
        process.start()
        theirs.close()
        self.processes[n] = process
        self.metrics.pop(n, None)
        try:
            ready = await _wait(process, ours)
        finally:
            ours.close()
        if ready:
            self.metrics[n] = ready
        else:
            raise RuntimeError(
                f"gateway worker {n} did not start (exit code {process.exitcode}; see the log)"
            )

    async def _watch(self, n: int) -> None:
        delay = FIRST_DELAY_S
        loop = asyncio.get_running_loop()
        while not self._stopping:
            process = self.processes[n]
            started = loop.time()
            await _exited(process)
            if self._stopping:
                return
            if loop.time() - started > STEADY_S:
                delay = FIRST_DELAY_S
            self.restarts += 1
            log.warning(
                "gateway worker %d (pid %s) exited with code %s; restarting in %.1f s",
                n,
                process.pid,
                process.exitcode,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_DELAY_S)
            with contextlib.suppress(RuntimeError):  # logged; tried again after the delay
                await self._start(n)
                self.restarted.set()

    async def stop(self) -> None:
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        for process in self.processes.values():
            if process.is_alive():
                process.terminate()  # SIGTERM: the worker stops as quill gateway does
        for process in self.processes.values():
            await asyncio.to_thread(process.join, 10)
            if process.is_alive():
                process.kill()
                await asyncio.to_thread(process.join)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _exited(process: BaseProcess) -> None:
    """Return when ``process`` has exited."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    sentinel = process.sentinel
    loop.add_reader(sentinel, _settle, done)
    try:
        await done
    finally:
        loop.remove_reader(sentinel)
    await asyncio.to_thread(process.join)


async def _wait(process: BaseProcess, ready: Connection) -> str:
    """``process``'s metrics URL once it says it serves (within ``START_TIMEOUT_S``, before it
    exits); "" if it does not."""
    loop = asyncio.get_running_loop()
    said: asyncio.Future[None] = loop.create_future()
    loop.add_reader(ready.fileno(), _settle, said)
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            await said
        return str(ready.recv() or "") if ready.poll() else ""
    except (TimeoutError, EOFError, OSError):
        return ""
    finally:
        loop.remove_reader(ready.fileno())


def serve(config: C, start: Start[C], ready: Connection, logging_as: tuple[str, str]) -> None:
    """A worker's process: serve ``config`` until SIGTERM or until the parent is gone."""
    setup_logging(*logging_as)
    asyncio.run(run_until_stopped(lambda: _started(config, start, ready)))


async def _started(config: C, start: Start[C], ready: Connection) -> Callable[[], Awaitable[None]]:
    try:
        gateway = await start(config)
        metrics = serve_metrics(0)  # this worker's own series, for worker 0 to gather
    except BaseException:
        ready.send("")
        raise
    assert metrics is not None
    ready.send(metrics.url)
    ready.close()
    parent = multiprocessing.parent_process()
    if parent is not None:  # the parent gone: stop as on SIGTERM
        loop = asyncio.get_running_loop()
        loop.add_reader(parent.sentinel, lambda: os.kill(os.getpid(), 15))
    return gateway.stop
