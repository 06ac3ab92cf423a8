"""Depth (``python -m bench depth``, issue 29): what a long-lived workspace costs.

Two families of workspaces on one stack (a nats-server, a writer, a reader and an executor,
each its own process, so that each can be restarted and its peak memory read):

* **history**: ``depth/e<N>``, 500 paths written round robin until the workspace holds N
  events (1k, 10k, 100k, 1M), through the writer (64 clients of the SDK; ``--fast`` appends a
  synthesised log of the same shape instead, saying so);
* **tree**: ``depth/f<N>``, N files (1k, 10k, 100k) in ``pkgNN/subM/`` plus the same 100-file
  directory ``fixed/`` and one file holding a rare word, committed 1,000 files an event.

Every operation whose answer does not grow with the workspace is timed at each size (the
median of ``--samples``), and printed with its ratio to the smallest size of the same run:
what a workspace's long life costs, measured against the same operation on a young one. The
goals (issue 29): at most 1.5x at 1M events (2x for the writer's restart-then-first-write and
an executor's first checkout), at most 2x at 100k files. Each process's peak resident memory
(VmHWM) is printed at each size. ``--plot`` draws the ratios (docs/depth.png).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats

from bench import size
from bench.harness import settle
from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from contracts.requests import PutChange
from infra import bus
from quill.client import Quill, Workspace
from quill.shell import Shell
from quill_cli.natsserver import NatsServer

EVENT_STEPS = (1_000, 10_000, 100_000, 1_000_000)
FILE_STEPS = (1_000, 10_000, 100_000)
PATHS = 500
CLIENTS = 64
PER_APPLY = 1_000
SAMPLES = 15
COLD = 3
"""Samples of what must be made cold each time (a restart, a fresh checkout)."""
RARE = "zyzzogeton"
GOALS = {"history": 1.5, "history-cold": 2.0, "tree": 2.0}

Op = Callable[[], Awaitable[object]]


def history_path(n: int) -> str:
    """The paths of ``bench size``'s synthesised log (``--fast`` builds with it)."""
    return size.path_of(n % PATHS)


def tree_path(n: int) -> str:
    return f"pkg{n % 100:02}/sub{n // 100 % 10}/m{n:06}.py"


class Stack:
    """nats-server and the three services, each restartable."""

    def __init__(self, tmp: Path, sandbox: str) -> None:
        self.tmp, self.sandbox = tmp, sandbox
        self.server = NatsServer(tmp / "nats").start()
        self.url = self.server.url
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts = 0

    async def start(self, nc: nats.NATS, name: str, fresh: bool = False) -> None:
        """(Re)start service ``name``; ``fresh``: with an empty data directory."""
        old = self.procs.pop(name, None)
        if old is not None:
            old.terminate()
            old.wait()
        data = self.tmp / name
        if fresh:
            self.starts += 1
            data = self.tmp / f"{name}-{self.starts}"
        more = ("--sandbox", self.sandbox) if name == "executor" else ()
        self.procs[name] = size.service(self.url, name, data, *more)
        await size.pinged(nc, name)

    def memory(self) -> dict[str, int]:
        """Peak resident MiB of each process (nats-server's included)."""
        peaks = {name: size.hwm(proc.pid) for name, proc in self.procs.items()}
        if self.server.process is not None:
            peaks["nats-server"] = size.hwm(self.server.process.pid)
        return peaks

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
            proc.wait()
        self.server.stop()


async def median(op: Op, samples: int) -> float:
    """Milliseconds: the median of ``samples`` calls after one unmeasured call."""
    await op()
    took = []
    for _ in range(samples):
        t0 = time.perf_counter()
        await op()
        took.append(time.perf_counter() - t0)
    return statistics.median(took) * 1000


async def build_history(quill: Quill, nc: nats.NATS, events: int, fast: bool) -> Workspace:
    """``depth/e<events>``: 500 paths written round robin up to ``events`` events."""
    name = f"depth/e{events}"
    ws = quill.workspace(name)
    if fast:
        await size.build(nc, PATHS, events, name=name, max_versions=None)
        ws.last_version = events
        while True:  # the reader has it all (a million events take it a while)
            try:
                await ws.info()
                return ws
            except QuillError as exc:
                if exc.code != ErrorCode.UNAVAILABLE:
                    raise
                await asyncio.sleep(1)
    await ws.create(limits=LimitsPatch(max_files=10 * PATHS))
    todo = iter(range(events - 1))

    async def client() -> None:
        writer = quill.workspace(name)
        for n in todo:
            await writer.write(history_path(n), size.content(n, n).decode())

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    ws.last_version = events
    await ws.info()
    return ws


async def build_tree(quill: Quill, files: int) -> Workspace:
    """``depth/f<files>``: ``files`` files under ``pkgNN/subM/``, and ``fixed/`` (100 files,
    one of them with the rare word)."""
    ws = quill.workspace(f"depth/f{files}")
    await ws.create(limits=LimitsPatch(max_files=2 * files + 1_000))
    fixed = [PutChange(path=f"fixed/x{n:03}.py", content=f"x = {n}\n") for n in range(100)]
    fixed.append(PutChange(path="fixed/notes.txt", content=f"a {RARE} here\n"))
    await ws.apply(fixed)
    for start in range(0, files, PER_APPLY):
        puts = [
            PutChange(path=tree_path(n), content=f"value = {n}\n")
            for n in range(start, min(files, start + PER_APPLY))
        ]
        await ws.apply(puts)
    await ws.info()
    return ws


def history_ops(ws: Workspace, nc: nats.NATS) -> dict[str, Op]:
    """The operations of a history workspace whose answer does not grow with its history."""
    tenant, name = ws.tenant, ws.name
    subject = size.SUBJECTS.cmd(tenant, name, "write")
    counter = iter(range(10**9))

    async def write() -> object:
        return await ws.write("bench/w.txt", f"{next(counter)}\n")

    async def bare_write() -> object:  # a client that sends no Ws-Request-Id
        body = json.dumps({"path": "bench/bare.txt", "content": f"{next(counter)}\n"}).encode()
        reply = await nc.request(subject, body, timeout=60)
        assert b'"error"' not in reply.data[:200], reply.data[:300]
        return reply

    async def edit() -> object:
        await ws.write("bench/e.txt", "mark 0\n")
        n = next(counter)
        return await ws.edit("bench/e.txt", "mark 0", f"mark {n}")

    last = ws.last_version
    return {
        "write (SDK, with Ws-Request-Id)": write,
        "write (bare, no header)": bare_write,
        "write then edit (SDK)": edit,
        "read": lambda: ws.read(history_path(7)),
        "stat": lambda: ws.stat(history_path(7)),
        "list (one directory)": lambda: ws.list(history_path(7).split("/")[0]),
        "glob **/*.txt (max 100)": lambda: ws.glob("**/*.txt", max_results=100),
        f"grep rare literal ({RARE})": lambda: ws.grep(RARE, literal=True),
        "history of one path (a page)": lambda: ws.history(history_path(7), limit=100),
        "diff of the last 10 versions": lambda: ws.diff(last - 10, last),
        "info": lambda: ws.info(),
        "info as of 10 versions back": lambda: ws.info(version=last - 10),
        "a page of events (the last 100)": lambda: ws.events(after=last - 100, limit=100),
        "exec true (second)": lambda: ws.exec("true"),
    }


def shell_ops(ws: Workspace, path: str) -> dict[str, Op]:
    """A command in an open shell (issue 32), each sample in the same shell: one that changes
    nothing and one that changes ``path`` (committed as the command returns)."""
    opened: list[Shell] = []
    counter = iter(range(10**9))

    async def shell() -> Shell:
        if not opened:
            opened.append(await ws.shell())
        return opened[0]

    async def true() -> object:
        return await (await shell()).run("true")

    async def change() -> object:
        return await (await shell()).run(f"echo {next(counter)} > {path}")

    return {"shell: true (second)": true, "shell: changing one file": change}


def tree_ops(ws: Workspace) -> dict[str, Op]:
    """The operations of a tree workspace whose answer does not grow with its tree."""
    counter = iter(range(10**9))
    back = max(1, ws.last_version - 10)

    async def change_one() -> object:
        return await ws.exec(f"echo {next(counter)} > fixed/changed.txt")

    return {
        "glob **/*.py (max 100)": lambda: ws.glob("**/*.py", max_results=100),
        "glob fixed/*.py (100 files)": lambda: ws.glob("fixed/*.py"),
        "grep under fixed/": lambda: ws.grep("x = 5", path="fixed"),
        f"grep rare word ({RARE})": lambda: ws.grep(RARE),
        "info": lambda: ws.info(),
        "info as of 10 versions back": lambda: ws.info(version=back),
        "exec true (second)": lambda: ws.exec("true"),
        "exec changing one file": change_one,
        **shell_ops(ws, "fixed/shell.txt"),
    }


def cold_ops(ws: Workspace) -> list[tuple[str, str, Op]]:
    """What is measured after a restart of a role: (label, role, op)."""
    return [
        ("writer restart, then the first write", "writer", lambda: ws.write("bench/c.txt", "x")),
        ("first exec true (a fresh checkout)", "executor", lambda: ws.exec("true")),
        ("first shell open, true, close (fresh)", "executor", lambda: shell_once(ws)),
    ]


async def shell_once(ws: Workspace) -> None:
    """A shell opened on an executor with no checkouts (its checkout built), one command, and
    closed."""
    async with await ws.shell() as shell:
        await shell.run("true")


async def cold(stack: Stack, nc: nats.NATS, role: str, op: Op) -> float:
    """Milliseconds: the median of ``COLD`` runs of ``op`` each after a restart of ``role``
    (an executor with no checkouts)."""
    took = []
    for _ in range(COLD):
        await stack.start(nc, role, fresh=role == "executor")
        t0 = time.perf_counter()
        await op()
        took.append(time.perf_counter() - t0)
    return statistics.median(took) * 1000


def table(title: str, steps: list[int], figures: dict[str, list[float]], goal: float) -> None:
    print(f"\n{title} (ms, median; ratio to {steps[0]:,}; goal <= {goal}x at the largest)")
    head = "".join(f"{s:>14,}" for s in steps)
    print(f"{'operation':<40}{head}   ratio")
    for label, values in figures.items():
        cells = "".join(f"{v:>14.1f}" for v in values)
        ratio = values[-1] / values[0] if values[0] else float("nan")
        mark = "" if ratio <= goal else "  over"
        print(f"{label:<40}{cells}   {ratio:5.2f}x{mark}")


def plot(path: Path, runs: list[tuple[str, list[int], dict[str, list[float]]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(7 * len(runs), 5))
    for ax, (title, steps, figures) in zip(axes, runs, strict=True):
        for label, values in figures.items():
            ax.plot(steps, [v / values[0] for v in values], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_title(title)
        ax.set_xlabel("events" if "history" in title else "files")
        ax.set_ylabel("cost / cost at the smallest size")
        ax.axhline(1.5 if "history" in title else 2.0, color="grey", linestyle="--")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


async def main(
    max_events: int, max_files: int, samples: int, fast: bool, sandbox: str, out: Path | None
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="quill-bench-depth-"))
    stack = Stack(tmp, sandbox)
    try:
        nc = await bus.connect(stack.url, "bench-depth")
        await bus.ensure_streams(nc, size.SUBJECTS)
        for role in ("writer", "reader", "executor"):
            await stack.start(nc, role)
        quill = await Quill.connect(stack.url, actor="bench", timeout=3600)
        how = "a synthesised log appended directly (--fast)" if fast else "the writer, 64 clients"
        print(f"Depth: one workspace per size, built through {how}; sandbox {sandbox}")
        e_steps = [s for s in EVENT_STEPS if s <= max_events]
        f_steps = [s for s in FILE_STEPS if s <= max_files]
        history: dict[str, list[float]] = {}
        colds: dict[str, list[float]] = {}
        memory: list[tuple[str, dict[str, int]]] = []
        for events in e_steps:
            t0 = time.perf_counter()
            ws = await build_history(quill, nc, events, fast)
            print(f"  depth/e{events}: built in {time.perf_counter() - t0:.0f} s", flush=True)
            await settle(stack.url, indexed=True)  # timed apart from the index's upkeep
            for label, op in history_ops(ws, nc).items():
                history.setdefault(label, []).append(await median(op, samples))
            for label, role, op in cold_ops(ws):
                colds.setdefault(label, []).append(await cold(stack, nc, role, op))
            memory.append((f"{events:,} events", stack.memory()))
        tree: dict[str, list[float]] = {}
        for files in f_steps:
            t0 = time.perf_counter()
            ws = await build_tree(quill, files)
            print(f"  depth/f{files}: built in {time.perf_counter() - t0:.0f} s", flush=True)
            await settle(stack.url, indexed=True)  # timed apart from the index's upkeep
            for label, op in tree_ops(ws).items():
                tree.setdefault(label, []).append(await median(op, samples))
            memory.append((f"{files:,} files", stack.memory()))
        table("History: one workspace of 500 paths", e_steps, history, GOALS["history"])
        table("  made cold each time", e_steps, colds, GOALS["history-cold"])
        table("Tree: one workspace of N files", f_steps, tree, GOALS["tree"])
        print("\nPeak resident memory (VmHWM, MiB) after each size")
        for label, peaks in memory:
            print(f"  {label:<18}" + "  ".join(f"{k} {v:,}" for k, v in sorted(peaks.items())))
        if out is not None:
            plot(
                out,
                [
                    ("history (events)", e_steps, {**history, **colds}),
                    ("tree (files)", f_steps, tree),
                ],
            )
            print(f"\nplot: {out}")
        await quill.close()
        await nc.close()
    finally:
        stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)
