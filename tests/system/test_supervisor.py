"""``quill up`` under a service that keeps crashing: its supervisor restarts it with a growing
delay and never gives up, the other services serve on, ``/health`` names the failing one and
``quill up``'s output says when it exits and when it is back.

Before the supervisor had a backoff, the sixth exit within a minute made ``quill up`` give up
and stop everything: NATS, the writer, the reader and the gateway.

The NATS server is supervised like the services (issue 28): ``kill -9`` of it and it is started
again on its port, the services reconnect, writes resume and every acknowledged write is still
there. Before, nothing restarted it: every request timed out until ``quill up`` was restarted.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts.errors import QuillError
from quill.client import Quill, Workspace
from tests.helpers import Watch, alive, eventually, eventually_sync
from tests.up import Up, running

FIRST, CAP = 0.2, 1.0
KILLS = 7
SERVICES = ("writer", "reader", "executor", "gateway")
RESTARTING = re.compile(
    r"quill: executor exited \(killed by SIGKILL\); restarting it in ([\d.]+) s"
)


def children(up: Up) -> dict[str, int]:
    """``quill up``'s service processes by name, from the process table."""
    assert up.process is not None
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) != up.process.pid:
            continue
        names = [a.decode() for a in argv if a.decode() in SERVICES]
        if b"quill" in argv and names:
            found[names[0]] = int(entry.name)
    return found


class HealthWatch(Watch):
    """Every ``/health`` body seen while it runs (a thread polling the gateway)."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url, self.seen = url + "/health", list[dict[str, Any]]()

    def watch(self) -> None:
        with httpx.Client(timeout=5) as http:
            while not self.stop.is_set():
                try:
                    reply = http.get(self.url)
                    self.seen.append({"code": reply.status_code, **reply.json()})
                except httpx.HTTPError:
                    self.seen.append({"code": None})
                self.stop.wait(0.1)


def health(up: Up) -> dict[str, Any]:
    reply = httpx.get(up.http_url + "/health", timeout=5)
    return {"code": reply.status_code, **reply.json()}


def failing(body: dict[str, Any]) -> list[str]:
    return [c["name"] for c in body.get("supervisor", {}).get("failing", [])]


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """A ``quill up`` of each test's own (not the module's: each kills its processes)."""
    backoff = {"QUILL_RESTART_BACKOFF": f"{FIRST},{CAP}"}
    with running(tmp_path / ".quill", "--sandbox", "local", env=backoff) as stack:
        yield stack


async def test_a_service_killed_again_and_again_is_restarted_while_the_others_serve(
    up: Up,
) -> None:
    before = children(up)
    assert sorted(before) == sorted(SERVICES), before
    quill = await Quill.connect(up.nats_url, actor="tester", timeout=15)
    try:
        ws = quill.workspace("acme/crashing")
        await ws.create()
        assert health(up)["status"] == "ok"
        killed: list[int] = []
        with HealthWatch(up.http_url) as watch:
            for n in range(KILLS):
                # wait for the supervisor to start it again, then kill the new process
                pid = await asyncio.to_thread(
                    eventually_sync,
                    lambda: p if (p := children(up).get("executor")) not in killed else None,
                    60,
                    f"executor restarted after {n} kills",
                )
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                if n == KILLS // 2:  # meanwhile, the others serve
                    await ws.write("meanwhile.txt", f"written after {n + 1} kills\n")
                    text = await ws.read_text("meanwhile.txt")
                    assert text == f"written after {n + 1} kills\n"
            # it comes back: /health is clean again
            back = await asyncio.to_thread(
                eventually_sync,
                lambda: b if (b := health(up))["status"] == "ok" and not failing(b) else None,
                60,
                "a clean /health",
            )
        # the services and the NATS server: every process is supervised
        assert back["code"] == 200 and back["supervisor"]["processes"] == len(SERVICES) + 1
        degraded = [b for b in watch.seen if b.get("status") == "degraded"]
        assert degraded, "/health never said degraded while the executor kept exiting"
        assert all(failing(b) == ["executor"] and b["code"] == 200 for b in degraded)
        assert any("executor: exited" in w for b in degraded for w in b["warnings"])
        assert all(b["code"] == 200 for b in watch.seen), "the gateway stopped answering"

        # only the executor was restarted; the others kept their processes
        after = children(up)
        assert after["executor"] not in killed
        assert {s: after[s] for s in SERVICES if s != "executor"} == {
            s: before[s] for s in SERVICES if s != "executor"
        }
        assert up.process is not None and up.process.poll() is None
        await ws.write("after.txt", "still here\n")
        assert await ws.read_text("after.txt") == "still here\n"
    finally:
        await quill.close()

    # quill up's output: a line per exit with its delay (doubling, capped), one when back
    output = "".join(up.output)
    delays = [float(d) for d in RESTARTING.findall(output)]
    assert len(delays) == KILLS, output
    assert delays[0] == FIRST and max(delays) == CAP and all(d <= CAP for d in delays), delays
    assert "quill: executor is back (pid" in output.rsplit("restarting it in", 1)[1], output


def stack_pids(up: Up) -> dict[str, int]:
    record = json.loads((up.data / "stack.json").read_text())
    return {p["name"]: int(p["pid"]) for p in record["processes"]}


async def writes_through(ws: Workspace, acked: dict[str, str], stop: asyncio.Event) -> int:
    """Write until ``stop``, recording what was acknowledged; the refusals (NATS away)."""
    failed, n = 0, 0
    while not stop.is_set():
        path, text = f"during/{n}.txt", f"write {n}\n"
        n += 1
        try:
            await ws.write(path, text)
        except QuillError:
            failed += 1
            await asyncio.sleep(0.05)  # a client's pause before trying again, not a wait
            continue
        acked[path] = text
    return failed


async def readable(ws: Workspace, path: str, timeout: float = 60.0) -> None:
    """Until ``path`` reads (a replica catching up answers UNAVAILABLE meanwhile)."""

    async def reads() -> bool:
        await ws.read_text(path)
        return True

    await eventually(reads, timeout, f"{path} readable", ignoring=(QuillError,))


async def test_the_nats_server_killed_is_started_again_and_no_acknowledged_write_is_lost(
    up: Up,
) -> None:
    before = stack_pids(up)
    assert sorted(before) == sorted(["nats", *SERVICES, "launcher"]), before
    quill = await Quill.connect(up.nats_url, actor="tester", timeout=5, retries=0)
    try:
        ws = quill.workspace("acme/nats-killed")
        await ws.create()
        acked: dict[str, str] = {}
        stop = asyncio.Event()
        writer = asyncio.create_task(writes_through(ws, acked, stop))
        await eventually(lambda: len(acked) >= 20, 60, "writes before")
        os.kill(before["nats"], signal.SIGKILL)
        counted = len(acked)
        back = await asyncio.to_thread(
            eventually_sync,
            lambda: p if (p := stack_pids(up)["nats"]) != before["nats"] and alive(p) else None,
            60,
            "stack.json naming a new nats-server",
        )
        await eventually(lambda: len(acked) >= counted + 20, 60, "writes after")
        stop.set()
        await writer
        assert Path(f"/proc/{back}/exe").resolve().name == "nats-server"
        last = list(acked)[-1]
        await readable(ws, last)  # the reader follows the log again (its consumer resumed)
        for path, text in acked.items():
            assert await ws.read_text(path) == text, path
        after = stack_pids(up)
        assert {s: after[s] for s in SERVICES} == {s: before[s] for s in SERVICES}
    finally:
        await quill.close()
    output = "".join(up.output)
    assert "quill: nats exited (killed by SIGKILL); restarting it in" in output, output
    assert f"quill: nats is back (pid {back})" in output, output
