"""Audit for downstream pipelines: ``examples/audit_consumer.py`` (a durable pull consumer on
WS_AUDIT) resumes after a stop or a ``kill -9`` without losing or repeating a record, and
``quill audit --since/--follow`` prints what the stream holds from a time on, then what comes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from nats.aio.client import Client as NATS

from contracts import codec
from contracts.events import AuditRecord
from contracts.subjects import Subjects
from infra import bus

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "audit_consumer.py"
SUBJECTS = Subjects()


async def publish(nc: NATS, workspace: str, ids: Iterable[int]) -> list[str]:
    """Audit records (as the services publish them) for ``acme/<workspace>``; their ids."""
    js, out = nc.jetstream(), []
    for i in ids:
        record = AuditRecord(
            at=datetime.now(UTC), tenant="acme", workspace=workspace, kind="cmd", op="write",
            actor="tester", session=None, run=None, request_id=f"req-{i}", outcome="ok",
            error_code=None, duration_ms=1.0, version=i, paths=[f"f{i}.txt"], summary=None,
            service="writer", instance="w1",
        )  # fmt: skip
        await js.publish(SUBJECTS.audit("acme", workspace), codec.encode(record))
        out.append(f"req-{i}")
    return out


def consumer(nats_url: str, out: Path, *extra: str) -> subprocess.Popen[str]:
    """The example, as a process: one durable consumer, ``pipeline``, on acme/piped."""
    argv = [sys.executable, str(EXAMPLE), "--nats-url", nats_url, "--durable", "pipeline",
            "--subject", "ws.audit.acme.piped", "--out", str(out), "--ack-wait", "1"]  # fmt: skip
    return subprocess.Popen([*argv, *extra], stdout=subprocess.PIPE, text=True)


async def ended(proc: subprocess.Popen[str], kill: bool = False) -> int:
    """Wait for ``proc`` to exit (``kill``: ``kill -9`` it first); its exit status."""
    if kill:
        os.kill(proc.pid, signal.SIGKILL)
    try:
        return await asyncio.wait_for(asyncio.to_thread(proc.wait), 20)
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


async def line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)


def sink(out: Path) -> list[str]:
    return [json.loads(row)["request_id"] for row in out.read_text().splitlines()]


async def test_the_durable_consumer_resumes_without_loss(
    nats_url: str, nc: NATS, tmp_path: Path
) -> None:
    await bus.ensure_streams(nc, SUBJECTS)
    out = tmp_path / "audit.jsonl"
    published = await publish(nc, "piped", range(10))
    first = consumer(nats_url, out, "--max", "4")  # stops after 4: acknowledged, position kept
    assert await ended(first) == 0
    assert sink(out) == published[:4]
    second = consumer(nats_url, out)
    for _ in range(3):
        assert (await line(second)).split()[1:3] == ["acme/piped", "cmd.write"]
    await ended(second, kill=True)  # wherever it was: before, between or after an ack
    published += await publish(nc, "piped", range(10, 15))  # while nobody consumes
    left = len(published) - len(sink(out))
    third = consumer(nats_url, out, "--max", str(left))
    assert await ended(third) == 0
    assert sorted(sink(out)) == sorted(published)  # each record exactly once


async def quill(nats_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QUILL_NATS_URL": nats_url}
    argv = [sys.executable, "-m", "quill", *args]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done


async def test_quill_audit_since_and_follow(nats_url: str, nc: NATS) -> None:
    await bus.ensure_streams(nc, SUBJECTS)
    older = await publish(nc, "followed", range(3))
    boundary = datetime.now(UTC)  # the stream stamps records with this machine's clock
    newer = await publish(nc, "followed", range(3, 6))
    everything = await quill(nats_url, "--json", "audit", "acme/followed", "--since", "1h")
    assert [json.loads(r)["request_id"] for r in everything.stdout.splitlines()] == older + newer
    since = await quill(nats_url, "audit", "acme/followed", "--since", boundary.isoformat())
    assert [r.split()[-1] for r in since.stdout.splitlines()] == ["f3.txt", "f4.txt", "f5.txt"]
    env = {**os.environ, "QUILL_NATS_URL": nats_url}
    argv = [sys.executable, "-m", "quill", "--json", "audit", "acme/followed", "--follow",
            "--since", boundary.isoformat()]  # fmt: skip
    follower = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        seen = [json.loads(await line(follower))["request_id"] for _ in newer]
        assert seen == newer
        later = await publish(nc, "followed", range(6, 8))
        assert [json.loads(await line(follower))["request_id"] for _ in later] == later
    finally:
        await ended(follower, kill=True)
