"""Work a client can make expensive, off the event loop: in worker processes, under a time
budget, a few at a time per tenant, and never for a client that has stopped waiting.

A grep runs the client's regular expression over every file in scope, a diff compares two
versions of files up to ``max_file_bytes``, ``modify`` runs regular expressions, and a refused
``edit`` looks for the text closest to its ``oldString``: on the event loop, one of them held a
service for seconds (a backtracking regex the whole 10 s of grep's budget, ``difflib`` 12 s
over a 1 MB file), and every other tenant waited. Here that work is a pure function of
``core`` that the service hands to a worker process (``infra/offload_worker.py``) and awaits:

* **Processes, not threads.** A thread cannot be stopped, and pure Python (``difflib``) holds
  the GIL the event loop needs; a process is stopped by ``SIGKILL``, and runs under
  ``SCHED_IDLE`` on half the CPUs (``offload_worker``): it takes the CPU the services leave,
  and a service woken by a request takes it back at once.
* **A budget per job**, in CPU time (so that a busy machine does not shorten it), and
  ``WALL_FACTOR`` times as much in time at most. The worker interrupts the function at either
  (``TimeoutError`` inside it: grep answers ``TIMEOUT``, a diff "too large to diff here"); a
  worker that does not answer ``GRACE_S`` later is killed and replaced.
* **Per tenant.** A tenant runs at most ``OFFLOAD_PER_TENANT`` jobs at once per service and
  queues ``OFFLOAD_QUEUED_PER_TENANT`` more; past that its request is answered busy
  (``UNAVAILABLE``, ``retry_after_ms``; queue ``tenant_work``). A free worker goes to the next
  tenant in turn with work waiting (round robin), so one tenant's queue never holds another's
  work back; there are ``OFFLOAD_WORKERS`` workers per service.
* **The client's deadline.** A request may say how long its client waits (``Ws-Timeout``,
  ``contracts/subjects.py``); the handler puts the deadline in ``CLIENT_DEADLINE``. Work still
  queued at that deadline never starts, and running work is stopped there: what a client gave
  up on costs nothing more. Without the header, a job waits for a worker at most
  ``WALL_FACTOR`` times its budget.

Deadlines are on ``time.monotonic``. Counted in ``quill_offload_jobs_total{service,outcome}``;
``quill_offload_running{service}`` is the number of jobs running now.
"""

from __future__ import annotations

import asyncio
import contextvars
import fcntl
import logging
import math
import os
import pickle
import sys
import time
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, TypeVar

import prometheus_client as prom

from contracts.errors import ErrorCode, QuillError
from contracts.limits import (
    OFFLOAD_PER_TENANT,
    OFFLOAD_QUEUED_PER_TENANT,
    OFFLOAD_WORKERS,
    RETRY_AFTER_MS,
)
from infra.busy import refused
from infra.offload_worker import HEADER, idle

log = logging.getLogger("quill.offload")

T = TypeVar("T")

GRACE_S = 5.0
"""How long past its time a worker may take to answer before it is killed (it was
interrupted at its time, and answers once it gets the CPU again: on a busy machine that may
take a while, and a killed worker costs a new one's start)."""
WALL_FACTOR = 5
"""A job's budget is CPU time (what it costs, however busy the machine is); it may take this
many times as long in time (its worker gets the CPU the services leave), or until its client's
deadline when that is sooner."""
KEEP_IDLE = 4
"""Idle workers kept started (a new one takes ~0.5 s of CPU to start, at ``SCHED_IDLE``)."""

CLIENT_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "client_deadline", default=None
)
"""When the client of the request being served stops waiting (``time.monotonic``), if it
said (``Ws-Timeout``); set by the service's handler for the request's task."""

JOBS = prom.Counter(
    "quill_offload_jobs_total",
    "Expensive jobs (grep, diff, regex replacements, closest-text searches) run in worker "
    "processes, by service and outcome: ok, error (the job's own error), timeout (its "
    "budget ran out), killed (its worker did not stop and was killed, or its client left "
    "while it ran), expired (its client had stopped waiting before it started), crash.",
    ["service", "outcome"],
)
RUNNING = prom.Gauge(
    "quill_offload_running", "Expensive jobs running in worker processes now.", ["service"]
)


def client_deadline(received: float, timeout_ms: int) -> float | None:
    """The deadline of a request received at ``received`` (``time.monotonic``) whose client
    waits ``timeout_ms`` (0: it did not say)."""
    return received + timeout_ms / 1000 if timeout_ms else None


STOP_WAIT_S = 5.0
"""How long a stop waits for a killed worker to end (a process the scheduler starves, as one
``SCHED_IDLE`` on a busy CPU is, may take that long to get the CPU it needs to die)."""


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.dead = False

    @classmethod
    async def start(cls) -> _Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "infra.offload_worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=_environment(),
        )
        idle(proc.pid)  # from its first instruction, start-up imports included
        for stream in (proc.stdin, proc.stdout):
            _widen(stream)
        return cls(proc)

    async def call(
        self, fn: Callable[..., Any], args: tuple[Any, ...], budget_s: float, wall_s: float
    ) -> Any:
        """``fn(*args)`` in the worker, within ``budget_s`` of CPU and ``wall_s`` of time.
        Returns its reply ``(kind, value)``; kills the worker when it does not answer within
        ``wall_s + GRACE_S`` (``TimeoutError``) or the caller is cancelled."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        frame = pickle.dumps((fn, args, budget_s, wall_s), pickle.HIGHEST_PROTOCOL)
        try:
            async with asyncio.timeout(wall_s + GRACE_S):
                self.proc.stdin.writelines((HEADER.pack(len(frame)), frame))
                await self.proc.stdin.drain()
                header = await self.proc.stdout.readexactly(HEADER.size)
                data = await self.proc.stdout.readexactly(HEADER.unpack(header)[0])
        except BaseException:
            await self.stop()
            raise
        return pickle.loads(data)

    async def stop(self) -> None:
        """Kill the process (whatever it is doing) and close its pipes."""
        self.dead = True
        if self.proc.returncode is None:
            with suppress(ProcessLookupError):
                self.proc.kill()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        with suppress(Exception):  # killed: it ends (reaped by the child watcher) if not now
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), STOP_WAIT_S)


class Offload:
    """A service's worker processes and the tenants' turns at them."""

    def __init__(
        self,
        service: str,
        *,
        workers: int = OFFLOAD_WORKERS,
        per_tenant: int = OFFLOAD_PER_TENANT,
        queued_per_tenant: int = OFFLOAD_QUEUED_PER_TENANT,
    ) -> None:
        self.service = service
        self.workers, self.per_tenant = workers, per_tenant
        self.queued_per_tenant = queued_per_tenant
        self._free = workers
        """Jobs that may start now (workers not taken)."""
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._running: Counter[str] = Counter()
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._spawning: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._outcomes = {o: JOBS.labels(service, o) for o in _OUTCOMES}
        self._gauge = RUNNING.labels(service)

    def warm(self) -> None:
        """Start a worker in the background, so the first job need not wait for one."""
        task = asyncio.ensure_future(self._spawn_idle())
        self._spawning.add(task)
        task.add_done_callback(self._spawning.discard)

    async def _spawn_idle(self) -> None:
        try:
            worker = await _Worker.start()
        except Exception as exc:
            log.warning("%s: could not start a worker process: %s", self.service, exc)
            return
        if self._closed or len(self._idle) >= KEEP_IDLE:
            await worker.stop()
        else:
            self._idle.append(worker)

    def info(self) -> dict[str, Any]:
        return {
            "running": sum(self._running.values()),
            "waiting": sum(len(q) for q in self._waiting.values()),
            "workers_idle": len(self._idle),
        }

    async def run(
        self,
        tenant: str,
        fn: Callable[..., T],
        *args: Any,
        budget_s: float,
        overtime: str,
        until: float | None = None,
    ) -> T:
        """``fn(*args, remaining=...)`` (a pure function of ``core``) in a worker, as
        ``tenant``'s, within ``budget_s`` seconds of CPU, ``WALL_FACTOR`` times as long at
        most, the client's deadline (``CLIENT_DEADLINE``) and ``until`` (``time.monotonic``:
        the end of a request of several jobs).

        Raises:
            QuillError: what ``fn`` raised; ``TIMEOUT`` saying ``overtime`` past the budget,
                or when the client's deadline passed (before it started: it never did);
                ``UNAVAILABLE`` busy past the tenant's queue; ``INTERNAL`` if the worker
                broke.
        """
        if budget_s <= 0:  # spent by the request's earlier parts
            self._outcomes["timeout"].inc()
            raise QuillError(ErrorCode.TIMEOUT, overtime, {"budget_s": budget_s})
        client = CLIENT_DEADLINE.get()
        own = min(time.monotonic() + budget_s * WALL_FACTOR, until or math.inf)
        async with self._turn(tenant, own if client is None else min(own, client)):
            wall = min(own, math.inf if client is None else client) - time.monotonic()
            if wall <= 0:
                self._outcomes["expired"].inc()
                raise _expired()
            worker = self._idle.pop() if self._idle else await _Worker.start()
            self._busy.add(worker)
            self._gauge.inc()
            try:
                kind, value = await worker.call(fn, args, budget_s, wall)
            except TimeoutError:
                self._outcomes["killed"].inc()
                raise QuillError(ErrorCode.TIMEOUT, overtime, {"budget_s": budget_s}) from None
            except asyncio.CancelledError:
                self._outcomes["killed"].inc()
                raise
            except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
                self._outcomes["crash"].inc()
                log.error("%s: a worker process broke: %r", self.service, exc)
                raise QuillError(ErrorCode.INTERNAL, "Internal error: a worker ended") from None
            finally:
                self._gauge.dec()
                self._busy.discard(worker)
                if worker.dead or self._closed or len(self._idle) >= KEEP_IDLE:
                    await worker.stop()
                else:
                    self._idle.append(worker)
                if worker.dead and not self._closed:
                    self.warm()  # the next job need not wait for a worker to start
        self._outcomes[kind].inc()
        if kind == "ok":
            return value  # type: ignore[no-any-return]
        if kind == "error":
            raise value
        if kind == "timeout":
            raise QuillError(ErrorCode.TIMEOUT, overtime, {"budget_s": budget_s})
        log.error("%s: %s failed in its worker: %s", self.service, fn.__qualname__, value)
        raise QuillError(ErrorCode.INTERNAL, f"Internal error: {str(value).split(':')[0]}")

    @asynccontextmanager
    async def _turn(self, tenant: str, wait_until: float) -> AsyncIterator[None]:
        """Hold one of ``tenant``'s turns: at once if it has one free and a worker is free,
        else in its queue until one is given or ``wait_until`` passes.

        Raises:
            QuillError: ``UNAVAILABLE`` busy when the tenant's queue is full; ``TIMEOUT``
                when ``wait_until`` passed before its turn came.
        """
        if self._closed:
            raise QuillError(ErrorCode.UNAVAILABLE, f"The {self.service} is stopping")
        queue = self._waiting.get(tenant)
        if queue is None and self._free > 0 and self._running[tenant] < self.per_tenant:
            self._take(tenant)
        else:
            if queue is not None and len(queue) >= self.queued_per_tenant:
                raise refused(
                    self.service,
                    "tenant_work",
                    f"The {self.service}",
                    RETRY_AFTER_MS,
                    limit=self.per_tenant,
                    queued=self.queued_per_tenant,
                )
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(tenant, deque()).append(granted)
            try:
                async with asyncio.timeout_at(_loop_time(wait_until)):
                    await asyncio.shield(granted)
            except BaseException as exc:
                if granted.done():  # given at the same time: give it back
                    self._give_back(tenant)
                else:
                    granted.cancel()
                    self._forget(tenant, granted)
                if isinstance(exc, TimeoutError):
                    self._outcomes["expired"].inc()
                    raise _expired() from None
                raise
        try:
            yield
        finally:
            self._give_back(tenant)

    def _take(self, tenant: str) -> None:
        self._free -= 1
        self._running[tenant] += 1

    def _give_back(self, tenant: str) -> None:
        self._free += 1
        self._running[tenant] -= 1
        if not self._running[tenant]:
            del self._running[tenant]
        self._dispatch()

    def _forget(self, tenant: str, granted: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is not None:
            with suppress(ValueError):
                queue.remove(granted)
            if not queue:
                del self._waiting[tenant]

    def _dispatch(self) -> None:
        """Give free workers to waiting tenants, in turn (each at most its share)."""
        while self._free > 0:
            tenant = next((t for t in self._waiting if self._running[t] < self.per_tenant), None)
            if tenant is None:
                return
            queue = self._waiting[tenant]
            granted = queue.popleft()
            if queue:
                self._waiting.move_to_end(tenant)  # the next free worker: another tenant's
            else:
                del self._waiting[tenant]
            if granted.done():
                continue  # its waiter gave up
            self._take(tenant)
            granted.set_result(None)

    async def close(self) -> None:
        """Stop every worker (running jobs end ``INTERNAL``/cancelled) and refuse new jobs."""
        self._closed = True
        for task in list(self._spawning):
            task.cancel()
        await asyncio.gather(*self._spawning, return_exceptions=True)
        idle, self._idle = self._idle, []
        for worker in [*idle, *self._busy]:  # a running job ends INTERNAL
            await worker.stop()
        for queue in self._waiting.values():
            for granted in queue:
                granted.cancel()
        self._waiting.clear()


_OUTCOMES = ("ok", "error", "timeout", "killed", "expired", "crash")


def _environment() -> dict[str, str]:
    """The service's environment without its credentials and settings (``QUILL_*``,
    ``NATS_*``): a worker reaches nothing, it computes."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("QUILL_", "NATS_"))}


PIPE_BYTES = 1024 * 1024
"""A worker's pipes hold this much (Linux's default is 64 KiB): a grep's texts go over in
fewer writes, each a pass of the event loop."""


def _widen(stream: asyncio.StreamWriter | asyncio.StreamReader | None) -> None:
    """Make ``stream``'s pipe hold ``PIPE_BYTES`` where the system lets it."""
    transport = getattr(stream, "transport", None) or getattr(stream, "_transport", None)
    pipe = transport.get_extra_info("pipe") if transport is not None else None
    if pipe is not None and hasattr(fcntl, "F_SETPIPE_SZ"):
        with suppress(OSError):
            fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def _expired() -> QuillError:
    return QuillError(
        ErrorCode.TIMEOUT,
        "The client stopped waiting before this request's turn came: not started",
    )


def _loop_time(deadline: float) -> float:
    """``deadline`` (``time.monotonic``) on the running loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (deadline - time.monotonic())
