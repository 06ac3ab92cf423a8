"""A load generator for Quill: N SDK clients (each its own NATS connection) × M workspaces,
mixing reads, writes, edits, greps and commands for a set time, optionally while a ``Chaos``
loop breaks things.

::

    report = await run_load(LoadConfig(url, clients=8, workspaces=4, seconds=5))
    print(report.table())
    assert not report.failures

Writes are checkable: client ``n`` alone writes ``c<n>/*`` in every workspace, each acked
write with unique content, so the last acked write of a path is its final content (a write
that failed retriably may have been applied too: it is kept in ``Report.unsure``). Edits
race on purpose: every client reads one shared file and edits its own line ``c<n>=<count>``
of it with ``if_match`` (both timed as the edit), so ``CONFLICT`` is expected there. Reads
check that they see what the client wrote; a command writes a file of the client's too.
``UNAVAILABLE`` and ``TIMEOUT`` are the documented retriable codes; any other error (or
exception, or a read contradicting an ack: ``WrongResult``) is a failure.

Chaos is pluggable: a ``Victim`` is any ``async () -> str`` that breaks something (kills a
process, takes a NATS node down for a while: ``outage``) and says what it did.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from contracts import requests as rq
from contracts.errors import RETRIABLE, ErrorCode, QuillError
from quill.client import Quill, Workspace

T = TypeVar("T")
OPS = ("read", "write", "edit", "grep", "exec")
DEFAULT_MIX: Mapping[str, float] = {"read": 8, "write": 5, "edit": 2, "grep": 2, "exec": 1}
SHARED = "shared/counters.txt"
"""The file every client edits (its own line of it)."""
FILLER = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(8))


@dataclass(frozen=True)
class LoadConfig:
    url: str
    """NATS server(s), comma-separated."""
    clients: int = 8
    workspaces: int = 4
    seconds: float = 5.0
    mix: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    tenant: str = "load"
    prefix: str = "w"
    """Workspaces are ``<tenant>/<prefix><m>``."""
    files: int = 8
    """Paths per client per workspace."""
    timeout: float = 3.0
    retries: int = 5
    exec_silence_s: float = 6.0
    drain_s: float = 60.0
    """After ``seconds``, how long ops in flight may take before they are cancelled."""
    seed: int = 0

    def names(self) -> list[str]:
        return [f"{self.tenant}/{self.prefix}{m}" for m in range(self.workspaces)]


Kind = Literal["seed", "write", "exec", "edit"]


@dataclass(frozen=True)
class Acked:
    """A change the service acknowledged (or, in ``Report.unsure``, attempted). ``write``,
    ``exec`` and ``seed``: ``content`` is the whole file; ``edit``: ``content`` is the line
    ``key=count`` the file holds at ``version``."""

    workspace: str
    path: str
    version: int
    content: str
    kind: Kind = "write"
    at: float = 0.0
    """``time.monotonic()`` of the ack (of the attempt's start, for an unsure one)."""


@dataclass
class OpStats:
    ok: int = 0
    latencies: list[float] = field(default_factory=list)
    """Seconds, of successful calls (SDK retries included)."""
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def count(self) -> int:
        return self.ok + sum(self.errors.values())

    def pct(self, q: float) -> float:
        data = sorted(self.latencies)
        return data[min(len(data) - 1, int(q * len(data)))] * 1000 if data else float("nan")


@dataclass(frozen=True)
class Fault:
    at: float
    """Seconds since the load began."""
    what: str


@dataclass
class Report:
    config: LoadConfig
    seconds: float = 0.0
    stats: dict[str, OpStats] = field(default_factory=lambda: {op: OpStats() for op in OPS})
    acked: list[Acked] = field(default_factory=list)
    unsure: list[Acked] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    """One line per unexpected error: ``op code: message``."""
    faults: list[Fault] = field(default_factory=list)
    examples: dict[str, str] = field(default_factory=dict)
    """The first message of each ``op CODE`` seen, expected or not."""

    def rate(self, op: str) -> float:
        return self.stats[op].ok / self.seconds if self.seconds else 0.0

    def table(self) -> str:
        c = self.config
        head = f"{'op':<6} {'calls':>7} {'ok':>7} {'ops/s':>8} {'p50 ms':>8} {'p99 ms':>8}  errors"
        lines = [
            f"load: {c.clients} clients x {c.workspaces} workspaces, {self.seconds:.1f} s"
            + (f", {len(self.faults)} faults" if self.faults else ""),
            head,
        ]
        total = OpStats()
        for op in OPS:
            s = self.stats[op]
            total.ok += s.ok
            total.latencies += s.latencies
            total.errors.update(s.errors)
            lines.append(_line(op, s, self.rate(op)))
        lines.append(_line("all", total, total.ok / self.seconds if self.seconds else 0.0))
        lines.append(
            f"acked changes {len(self.acked)}, unsure {len(self.unsure)}, "
            f"failures {len(self.failures)}"
        )
        lines += [f"  fault at {f.at:5.1f}s: {f.what}" for f in self.faults]
        lines += [f"  first {key}: {text[:110]}" for key, text in sorted(self.examples.items())]
        lines += [f"  FAILURE {line}" for line in self.failures[:20]]
        return "\n".join(lines)


def _line(op: str, s: OpStats, rate: float) -> str:
    errors = " ".join(f"{code}={n}" for code, n in sorted(s.errors.items())) or "-"
    return (
        f"{op:<6} {s.count:>7} {s.ok:>7} {rate:>8.1f} {s.pct(0.5):>8.1f} {s.pct(0.99):>8.1f}"
        f"  {errors}"
    )


def _name(ws: Workspace) -> str:
    return f"{ws.tenant}/{ws.name}"


class WrongResult(Exception):
    """An answer that contradicts what this client was acknowledged before."""


def applied_maybe(exc: BaseException) -> bool:
    """Whether a change that failed with ``exc`` may have been applied all the same: anything
    but a decided refusal (a non-retriable ``QuillError``)."""
    return not isinstance(exc, QuillError) or exc.retriable


def expected(op: str, exc: BaseException) -> bool:
    """Whether a client should expect this error under load: the retriable codes, and a
    ``CONFLICT`` of an edit racing other edits."""
    if not isinstance(exc, QuillError):
        return False
    return exc.code in RETRIABLE or (op == "edit" and exc.code == ErrorCode.CONFLICT)


Victim = Callable[[], Awaitable[str]]
"""One fault: kill (and perhaps restart) something; returns what it did."""


def outage(
    what: str, kill: Callable[[], object], restart: Callable[[], object], down_s: float
) -> Victim:
    """A victim that kills something, leaves it down ``down_s`` seconds and restarts it;
    ``kill`` and ``restart`` run in a thread (they may block) and may return awaitables, e.g.
    ``outage("n2", lambda: cluster.kill("n2"), lambda: cluster.restart("n2"), 3.0)``."""

    async def call(fn: Callable[[], object]) -> None:
        result = await asyncio.to_thread(fn)
        if inspect.isawaitable(result):
            await result

    async def strike() -> str:
        await call(kill)
        await asyncio.sleep(down_s)  # the outage itself, not a wait for something
        await call(restart)
        return f"{what}: killed, restarted {down_s:g}s later"

    return strike


@dataclass
class Chaos:
    """Call the victims in turn, one every ``interval`` seconds, while the load runs."""

    victims: Sequence[Victim]
    interval: float = 2.0
    first_after: float = 1.0

    async def run(self, stop: asyncio.Event, started: float, faults: list[Fault]) -> None:
        delay, turn = self.first_after, 0
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), delay)
                return
            except TimeoutError:
                pass
            victim = self.victims[turn % len(self.victims)]
            turn, delay = turn + 1, self.interval
            try:
                what = await victim()
            except Exception as exc:  # a victim that could not strike is reported, not fatal
                what = f"victim failed: {exc!r}"
            faults.append(Fault(time.monotonic() - started, what))


class _Client:
    """One closed loop: an SDK connection doing one op at a time."""

    def __init__(self, n: int, quill: Quill, config: LoadConfig, report: Report) -> None:
        self.n, self.quill, self.config, self.report = n, quill, config, report
        self.rng = random.Random(config.seed * 1_000_003 + n)
        self.ops = list(config.mix)
        self.weights = [config.mix[op] for op in self.ops]
        self.i = 0
        self.names = config.names()
        self.expect: dict[tuple[str, str], set[str]] = {}
        """What reading a path of mine may give: the last acked content, and anything
        attempted since without an ack."""
        self.existing: dict[str, list[str]] = {}
        """By workspace, the paths of mine that exist for sure (no op deletes a file)."""

    async def loop(self, until: float) -> None:
        while time.monotonic() < until:
            op = self.rng.choices(self.ops, self.weights)[0]
            ws = self.quill.workspace(self.rng.choice(self.names))
            self.i += 1
            t0 = time.monotonic()
            try:
                await getattr(self, op)(ws, t0)
            except Exception as exc:
                self._failed(op, exc)
            else:
                stats = self.report.stats[op]
                stats.ok += 1
                stats.latencies.append(time.monotonic() - t0)

    def _failed(self, op: str, exc: BaseException) -> None:
        code = str(exc.code) if isinstance(exc, QuillError) else type(exc).__name__
        self.report.stats[op].errors[code] += 1
        self.report.examples.setdefault(f"{op} {code}", str(exc))
        if not expected(op, exc):
            self.report.failures.append(f"client {self.n} {op} {code}: {exc}")

    def _path(self) -> str:
        return f"c{self.n}/f{self.rng.randrange(self.config.files)}.txt"

    def _ack(self, ws: Workspace, path: str, version: int, content: str, kind: Kind) -> None:
        self.report.acked.append(Acked(_name(ws), path, version, content, kind, time.monotonic()))
        if kind != "edit":  # an edit acks one line of a file others change too
            self.expect[(_name(ws), path)] = {content}
            known = self.existing.setdefault(_name(ws), [])
            if path not in known:
                known.append(path)

    def _unsure(self, ws: Workspace, path: str, content: str, kind: Kind, t0: float) -> None:
        self.report.unsure.append(Acked(_name(ws), path, 0, content, kind, t0))
        if kind != "edit":
            self.expect.setdefault((_name(ws), path), set()).add(content)

    async def _changing(
        self, ws: Workspace, path: str, content: str, op: str, t0: float, change: Awaitable[T]
    ) -> T:
        """``change``'s answer; when it fails in a way that may still have applied (a lost
        reply, a failover), ``path`` is noted as maybe holding ``content`` (unsure)."""
        try:
            return await change
        except BaseException as exc:
            if applied_maybe(exc):
                self._unsure(ws, path, content, op, t0)
            raise

    async def write(self, ws: Workspace, t0: float) -> None:
        path = self._path()
        content = f"client {self.n} op {self.i} {_name(ws)}\n{FILLER}"
        await self._changing(ws, path, content, "write", t0, ws.write(path, content))
        # ops of one client are sequential: nothing it saw is newer than its own write
        self._ack(ws, path, ws.last_version, content, "write")

    async def read(self, ws: Workspace, t0: float) -> None:
        mine = self.existing.get(_name(ws))
        path = self.rng.choice(mine) if mine else SHARED
        got = await ws.read(path)
        allowed = self.expect.get((_name(ws), path))
        if allowed is not None and got.content not in allowed:
            raise WrongResult(f"read {path} at v{ws.last_version}: not what was written")

    async def grep(self, ws: Workspace, t0: float) -> None:
        await ws.grep(rf"client {self.n} op \d+", include=["*.txt"], max_results=20)

    async def edit(self, ws: Workspace, t0: float) -> None:
        current = await ws.read(SHARED)
        key = f"c{self.n}="
        line = next((x for x in (current.content or "").splitlines() if x.startswith(key)), None)
        if line is None:
            raise WrongResult(f"{SHARED} at v{ws.last_version} has no line {key}")
        new = f"{key}{int(line[len(key) :]) + 1}"
        edited = ws.edit(SHARED, line + "\n", new + "\n", if_match=current.etag)
        await self._changing(ws, SHARED, new, "edit", t0, edited)
        self._ack(ws, SHARED, ws.last_version, new, "edit")

    async def exec(self, ws: Workspace, t0: float) -> None:
        path = f"c{self.n}/x.txt"
        content = f"exec {self.n} {self.i}"
        command = f"mkdir -p c{self.n} && printf '{content}' > {path} && wc -l c{self.n}/*"
        ran = ws.exec(command, timeout_ms=30_000)
        result = await self._changing(ws, path, content, "exec", t0, ran)
        error = result.changes.error or ""
        if result.exit_code == 0 and not result.changes.committed and error:
            code = error.split(":", 1)[0]
            if code in RETRIABLE:
                # The command ran; committing its changes met a failover and the reply says
                # so with a retriable code (the apply may still have landed: unsure).
                self._unsure(ws, path, content, "exec", t0)
                raise QuillError(ErrorCode(code), f"changes not committed: {error}")
        if result.exit_code != 0 or not result.changes.committed:
            raise WrongResult(
                f"exec exit {result.exit_code}, committed {result.changes.committed}, "
                f"error {error!r}, captured {result.changes.total}, "
                f"conflicts {result.changes.conflicts}: {result.stderr[:200]}"
            )
        self._ack(ws, path, result.changes.version, content, "exec")


async def setup(config: LoadConfig, quill: Quill, report: Report) -> None:
    """Create the workspaces, each with the shared file and one file per client."""
    for name in config.names():
        ws = quill.workspace(name)
        await ws.create(exist_ok=True)
        counters = "".join(f"c{n}=0\n" for n in range(config.clients))
        files = {f"c{n}/f0.txt": f"seed {n} {name}\n" for n in range(config.clients)}
        changes = [rq.PutChange(path=p, content=t) for p, t in files.items()]
        await ws.apply([rq.PutChange(path=SHARED, content=counters), *changes])
        at = time.monotonic()
        report.acked += [Acked(name, p, ws.last_version, t, "seed", at) for p, t in files.items()]
        report.acked += [
            Acked(name, SHARED, ws.last_version, f"c{n}=0", "edit", at)
            for n in range(config.clients)
        ]


async def run_load(config: LoadConfig, chaos: Chaos | None = None) -> Report:
    """Set up the workspaces, run the load for ``config.seconds`` (with ``chaos`` meanwhile)
    and return the report.

    Raises:
        QuillError: the setup failed (the load itself records errors, never raises them).
    """
    report = Report(config)
    options: dict[str, Any] = {"timeout": config.timeout, "retries": config.retries}
    admin = await Quill.connect(config.url, actor="load-setup", **options)
    clients: list[Quill] = []
    try:
        await setup(config, admin, report)
        for n in range(config.clients):
            clients.append(
                await Quill.connect(
                    config.url, actor=f"load-{n}", exec_silence_s=config.exec_silence_s, **options
                )
            )
        loops = [_Client(n, q, config, report) for n, q in enumerate(clients)]
        for loop in loops:  # each client is handed its seed files, and the version they
            for name in config.names():  # are at: it reads its own writes from there on
                loop.expect[(name, f"c{loop.n}/f0.txt")] = {f"seed {loop.n} {name}\n"}
                loop.existing[name] = [f"c{loop.n}/f0.txt"]
                loop.quill.workspace(name).last_version = admin.workspace(name).last_version
        started = time.monotonic()
        stop = asyncio.Event()
        striker = asyncio.create_task(
            chaos.run(stop, started, report.faults) if chaos else stop.wait()
        )
        ending = asyncio.get_running_loop().call_later(config.seconds, stop.set)
        tasks = [asyncio.create_task(c.loop(started + config.seconds)) for c in loops]
        done, pending = await asyncio.wait(tasks, timeout=config.seconds + config.drain_s)
        stop.set()  # chaos ends with the load's time; ops in flight finish after it
        ending.cancel()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        report.seconds = time.monotonic() - started
        await striker
        if pending:
            report.failures.append(
                f"{len(pending)} clients still busy {config.drain_s:.0f}s after the end"
            )
        for task in done:
            if task.exception() is not None:
                report.failures.append(f"a client crashed: {task.exception()!r}")
    finally:
        for quill in [admin, *clients]:
            try:
                await quill.close()
            except Exception:
                pass
    return report
