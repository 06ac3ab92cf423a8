"""The executor: a ``true`` round trip through the pool (bwrap and local) next to a bare
``subprocess.run(["true"])``; ``true`` in an open shell next to both (issue 32: within 5x of
the bare run, at most half of a one-shot); the executor's CPU while a poll of an idle live
command waits; and the capture of 1,000 changed files next to a client sending the same
1,000 files in one ``apply`` itself; in one run."""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.harness import Process, quill_up, row
from contracts import requests as rq
from quill.client import Quill

ROUNDS = 100
FILES = 1000


def bare_true(n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(["true"], check=True)
        samples.append(time.perf_counter() - t0)
    return samples


def processes(up: Process) -> dict[int, str]:
    """``quill up``'s processes (its own included), each by its role: ``executor``, ``writer``,
    ``nats-server``..."""
    table = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True)
    rows = [line.split(None, 2) for line in table.stdout.splitlines()[1:]]
    found, parents = {up.proc.pid: "up"}, {up.proc.pid}
    while parents:
        kids = [r for r in rows if int(r[1]) in parents and len(r) == 3]
        parents = {int(r[0]) for r in kids}
        for pid, _, args in kids:
            words = args.split()
            role = next((w for w in words if w in ROLES), os.path.basename(words[0]))
            found[int(pid)] = role
    return found


ROLES = ("executor", "writer", "reader", "gateway", "bridge", "scheduler", "indexer")


def cpu(pids: dict[int, str]) -> dict[str, float]:
    """CPU seconds so far per role: each process's own, and apart its reaped children's (a
    sandbox's processes are reaped up the chain to the executor)."""
    spent: dict[str, float] = {}
    for pid, role in pids.items():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        hz = os.sysconf("SC_CLK_TCK")
        spent[role] = spent.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / hz
        reaped = (int(fields[13]) + int(fields[14])) / hz
        spent[f"{role}'s children"] = spent.get(f"{role}'s children", 0.0) + reaped
    return spent


async def pool_true(
    quill: Quill, name: str, n: int, up: Process | None = None
) -> tuple[list[float], list[float], dict[str, float]]:
    """(``ws.exec("true")``, a bare ``subprocess.run(["true"])``), interleaved one for one so
    that drift of a shared machine falls on both alike; and the CPU each of ``up``'s
    processes spent per command (ms), the bare runs' included in ``bench``."""
    ws = quill.workspace(name)
    await ws.create(exist_ok=True)
    for _ in range(3):
        await ws.exec("true")  # warm: the checkout exists (and a spare sandbox waits)
    pids = processes(up) if up is not None else {}
    samples, bare = [], []
    before, own = cpu(pids), time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        await ws.exec("true")
        samples.append(time.perf_counter() - t0)
        bare += bare_true(1)
    after = cpu(pids)
    per = {role: (after[role] - before.get(role, 0.0)) * 1000 / n for role in after}
    per["bench"] = (time.process_time() - own) * 1000 / n
    return samples, bare, per


async def capture(quill: Quill, name: str, rounds: int) -> tuple[list[float], list[float]]:
    """(capture + commit of 1,000 modified files, a client's own apply of the same files to
    another workspace, so that the executor has nothing of it to sync)."""
    ws, other = quill.workspace(name), quill.workspace(name + "-apply")
    await ws.create(exist_ok=True)
    await other.create(exist_ok=True)
    await ws.exec(f"mkdir -p m && for i in $(seq {FILES}); do echo 0 > m/$i.txt; done")
    ours, theirs = [], []
    for r in range(1, rounds + 1):
        t0 = time.perf_counter()
        done = await ws.exec(f"for f in m/*.txt; do echo {r} > $f; done")
        ours.append(time.perf_counter() - t0 - done.duration_ms / 1000)
        assert done.changes.total == FILES, done.changes
        changes = [rq.PutChange(path=f"m/{i}.txt", content=f"{r}\n") for i in range(1, FILES + 1)]
        t0 = time.perf_counter()
        await other.apply(changes)
        theirs.append(time.perf_counter() - t0)
    return ours, theirs


async def shell_true(
    quill: Quill, name: str, n: int
) -> tuple[list[float], list[float], list[float]]:
    """(``true`` in an open shell, a one-shot ``ws.exec("true")``, a bare
    ``subprocess.run(["true"])``), interleaved one for one."""
    ws = quill.workspace(name)
    await ws.create(exist_ok=True)
    shell = await ws.shell()
    try:
        for _ in range(3):
            await shell.run("true")
            await ws.exec("true")
        inside, one_shot, bare = [], [], []
        for _ in range(n):
            t0 = time.perf_counter()
            await shell.run("true")
            inside.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await ws.exec("true")
            one_shot.append(time.perf_counter() - t0)
            bare += bare_true(1)
    finally:
        await shell.close()
    return inside, one_shot, bare


async def idle_poll(
    quill: Quill, name: str, up: Process, wait_s: float = 5.0
) -> tuple[float, float]:
    """The executor's CPU (ms) while one poll of a live command that prints nothing waits
    ``wait_s`` for output, and over the same time with the command running and no poll."""
    ws = quill.workspace(name)
    await ws.create(exist_ok=True)
    started = await ws.exec("sleep 60", yield_ms=100)
    command = ws.command(started.command_id or "")
    pids = {pid: role for pid, role in processes(up).items() if role == "executor"}
    before = cpu(pids)
    await command.poll(wait_ms=int(wait_s * 1000))
    polled = cpu(pids)
    await asyncio.sleep(wait_s)  # the baseline: the same time, nobody polling
    after = cpu(pids)
    await command.signal("KILL")
    return (
        (polled.get("executor", 0.0) - before.get("executor", 0.0)) * 1000,
        (after.get("executor", 0.0) - polled.get("executor", 0.0)) * 1000,
    )


def ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.1f} ms"


async def main(rounds: int = ROUNDS) -> None:
    figures: list[str] = []
    cpus: list[str] = []
    bare = bare_true(rounds)
    for sandbox in ("bwrap", "local"):
        with tempfile.TemporaryDirectory() as tmp:
            up, url = quill_up(Path(tmp) / "quill", "--sandbox", sandbox)
            try:
                quill = await Quill.connect(url, timeout=60)
                ours, base, per = await pool_true(quill, f"bench/true-{sandbox}", rounds, up)
                figures.append(
                    row(
                        f"run `true` through the pool ({sandbox})",
                        ms(ours),
                        ms(base),
                        statistics.median(ours) / statistics.median(base),
                        "(p50 ratio; baseline: subprocess.run(['true']), interleaved)",
                    )
                )
                shown = sorted(per.items(), key=lambda kv: -kv[1])
                spent = ", ".join(f"{role} {v:.1f}" for role, v in shown if v >= 0.05)
                services = sum(v for role, v in per.items() if role != "bench")
                cpus.append(f"CPU per `true` ({sandbox}), ms: {services:.1f} in quill up ({spent})")
                inside, one_shot, bare_s = await shell_true(quill, f"bench/shell-{sandbox}", rounds)
                figures.append(
                    row(
                        f"`true` in an open shell ({sandbox})",
                        ms(inside),
                        ms(bare_s),
                        statistics.median(inside) / statistics.median(bare_s),
                        "(p50 ratio; baseline: subprocess.run(['true']), interleaved; goal <= 5)",
                    )
                )
                figures.append(
                    row(
                        f"`true` in a shell vs one-shot ({sandbox})",
                        ms(inside),
                        ms(one_shot),
                        statistics.median(inside) / statistics.median(one_shot),
                        "(p50 ratio; baseline: a one-shot exec, interleaved; goal <= 0.5)",
                    )
                )
                idle, quiet = await idle_poll(quill, f"bench/idle-{sandbox}", up)
                cpus.append(
                    f"executor CPU over 5 s while a poll of an idle command waits ({sandbox}): "
                    f"{idle:.1f} ms; the same 5 s with nobody polling: {quiet:.1f} ms"
                )
                if sandbox == "bwrap":
                    caught, sent = await capture(quill, "bench/capture", max(3, rounds // 10))
                    figures.append(
                        row(
                            f"capture + commit {FILES:,} modified files (bwrap)",
                            ms(caught),
                            ms(sent),
                            statistics.median(caught) / statistics.median(sent),
                            "(ratio; baseline: a client's own apply of them)",
                        )
                    )
                await quill.close()
            finally:
                up.stop()
    print(
        f"Executor: serial round trips (median of {rounds}), SDK over NATS to `quill up` on "
        f"this machine; bare `true` before the stacks: {ms(bare)}\n"
    )
    print(f"{'figure':<44} {'quill':>16} {'baseline':>16} {'ratio':>8}  note")
    for line in figures:
        print(line)
    print()
    for line in cpus:
        print(line)


if __name__ == "__main__":
    asyncio.run(main())
