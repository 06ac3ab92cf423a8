"""The executor end to end, over a real nats-server with a writer, a reader and an executor:
seed 002's command scenarios, change capture, the pool's limits, audit. Every test runs with
both sandbox providers, and the providers must answer identically."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import HEADER_STREAM, STREAM_AUDIT
from quill.client import Quill, Workspace
from services.executor.app import Executor, ExecutorConfig
from tests import helpers
from tests.executor.conftest import PROVIDERS, StartExecutor
from tests.helpers import (
    eventually,
    need_bwrap,
    start_executor,
    start_writer,
    start_writer_and_reader,
)


async def workspace(quill: Quill, name: str) -> Workspace:
    ws = quill.workspace(name)
    await ws.create()
    await ws.write("src/app.py", "print('hi')\n")
    await ws.write("old.txt", "old\n")
    return ws


@pytest_asyncio.fixture
async def ws(stack: StartExecutor, quill: Quill, name: str) -> Workspace:
    """An executor started (the test's provider) and workspace ``name`` holding
    ``src/app.py`` and ``old.txt``."""
    await stack()
    return await workspace(quill, name)


def comparable(result: rp.CommandResult) -> dict[str, object]:
    """A result without what differs from run to run (time, versions, the command's id)."""
    data = msgspec.to_builtins(result)
    del data["duration_ms"], data["command_id"]
    data["changes"] = {k: v for k, v in data["changes"].items() if "version" not in k}
    return data


# ------------------------------------------------------------------ seed 002 scenarios


async def test_success(ws: Workspace, provider: str) -> None:
    r = await ws.exec('echo "hello"')
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("hello\n", "", 0, False)
    assert not r.changes.committed and r.changes.version == r.changes.base_version
    # Only bwrap shows the checkout at /workspace (local has no mount namespace).
    where = "/workspace" if provider == "bwrap" else "."
    listing = await ws.exec(f"ls -la {where}", workdir="/workspace")
    assert listing.exit_code == 0 and "src" in listing.stdout and "old.txt" in listing.stdout


SAME_EVERYWHERE = [
    ('echo "hello"', {}),
    ("echo out; echo err >&2; exit 3", {}),
    ("echo started; sleep 60", {"timeout_ms": 800}),
    ("ls", {"workdir": "src"}),
    ("head -c 60000 /dev/zero | tr '\\0' b", {}),
    ("printf '\\xff ok'", {}),
    ("echo new > new.txt; rm old.txt; mkdir d", {}),
    ("echo $GREETING", {"env": {"GREETING": "hi there"}}),
]


async def test_both_providers_answer_identically(nats_url: str, tmp_path: Path) -> None:
    """Seed 002, "Same tool behavior across providers": the same commands give the same
    replies (but for time and versions) under bwrap and local."""
    need_bwrap()
    answers: dict[str, list[dict[str, object]]] = {}
    async with AsyncExitStack() as es:
        await start_writer_and_reader(es, nats_url, tmp_path)
        quill = await Quill.connect(nats_url)
        es.push_async_callback(quill.close)
        for provider in PROVIDERS:
            async with AsyncExitStack() as one:
                config = ExecutorConfig(sandbox=provider)
                await start_executor(one, nats_url, tmp_path / provider, config)
                ws = await workspace(quill, f"acme/same-{provider}")
                answers[provider] = [
                    comparable(await ws.exec(command, **options))  # type: ignore[arg-type]
                    for command, options in SAME_EVERYWHERE
                ]
    assert answers["bwrap"] == answers["local"]
    first = answers["bwrap"][0]
    assert (first["stdout"], first["stderr"], first["exit_code"]) == ("hello\n", "", 0)


async def test_non_zero_exit_is_a_result_with_both_streams(ws: Workspace) -> None:
    r = await ws.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    missing = await ws.exec("no-such-command-here")
    assert missing.exit_code == 127 and "not found" in missing.stderr


async def test_timeout_keeps_partial_output(ws: Workspace) -> None:
    r = await ws.exec("echo started; echo warn >&2; sleep 60; echo never", timeout_ms=1000)
    assert r.timed_out and r.exit_code == 128 + 15
    assert (r.stdout, r.stderr) == ("started\n", "warn\n")
    stubborn = await ws.exec("trap '' TERM; echo stubborn; sleep 60", timeout_ms=500)
    assert stubborn.timed_out and stubborn.exit_code == 128 + 9 and stubborn.stdout == "stubborn\n"
    assert stubborn.duration_ms >= 5000  # SIGTERM was ignored: SIGKILL came after the grace


async def test_workdir(ws: Workspace) -> None:
    for workdir in ("src", "/workspace/src"):
        r = await ws.exec("ls", workdir=workdir)
        assert r.stdout.split() == ["app.py"]
    await ws.exec("echo made > here.txt", workdir="src")
    assert await ws.read_text("src/here.txt") == "made\n"
    for bad, code in (
        ("../etc", ErrorCode.ACCESS_DENIED),
        ("/etc", ErrorCode.ACCESS_DENIED),
        ("nowhere", ErrorCode.FILE_NOT_FOUND),
        ("old.txt", ErrorCode.NOT_A_DIRECTORY),
    ):
        with pytest.raises(QuillError) as info:
            await ws.exec("true", workdir=bad)
        assert info.value.code == code, bad


async def test_output_over_50kb_is_cut_and_counted(ws: Workspace) -> None:
    r = await ws.exec("head -c 200000 /dev/zero | tr '\\0' a; echo small >&2")
    # the first and the last half of the cap (51,200 bytes), and what is left out between
    assert r.stdout == r.stdout_tail == "a" * 25600 and r.stdout_truncated
    assert (r.stdout_bytes, r.stdout_omitted_bytes, r.stdout_omitted_offset) == (
        200_000,
        200_000 - 51200,
        25600,
    )
    assert r.stderr == "small\n" and not r.stderr_truncated and r.stderr_bytes == 6
    utf8 = await ws.exec("printf '\\xff\\xfeok'; printf '%.0s\\xc3\\xa9' $(seq 30000)")
    assert utf8.stdout.startswith("\ufffd\ufffdok") and utf8.stdout_truncated
    assert not utf8.stdout.endswith("\ufffd")  # a character cut by the cap is dropped
    assert set(utf8.stdout_tail) == {"é"}  # and one the tail starts inside


async def test_live_output_reaches_the_caller(ws: Workspace) -> None:
    chunks: list[tuple[str, bytes]] = []
    script = "for i in $(seq 5); do echo line $i; echo oops $i >&2; done"
    r = await ws.exec(script, on_output=lambda stream, data: chunks.append((stream, data)))
    out = b"".join(d for s, d in chunks if s == "stdout").decode()
    err = b"".join(d for s, d in chunks if s == "stderr").decode()
    assert (out, err) == (r.stdout, r.stderr) and out.count("line") == 5


# ------------------------------------------------------------------ change capture


async def test_changes_become_one_event_by_the_caller(
    stack: StartExecutor, nats_url: str, name: str
) -> None:
    await stack()
    quill = await Quill.connect(nats_url, actor="agent-7", session="s-1")
    try:
        ws = await workspace(quill, name)
        before = ws.last_version
        r = await ws.exec(
            "mkdir -p out && echo built > out/app.bin && rm old.txt && "
            "printf '\\x00\\x01' > blob.dat && chmod +x src/app.py"
        )
        changes = r.changes
        assert changes.committed and changes.base_version == before
        assert changes.version == before + 1  # one event
        assert {(p.path, p.change) for p in changes.paths} == {
            ("out/app.bin", "created"),
            ("old.txt", "deleted"),
            ("blob.dat", "created"),
            ("src/app.py", "modified"),
        }
        assert await ws.read_text("out/app.bin") == "built\n"
        assert await ws.read_bytes("blob.dat") == b"\x00\x01"
        assert (await ws.stat("src/app.py")).permissions == "755"
        event = (await ws.history(limit=1)).revisions[0]
        assert (event.actor, event.version) == ("agent-7", changes.version)
        again = await ws.exec("cat out/app.bin")  # the next command sees it all
        assert again.stdout == "built\n" and not again.changes.committed
    finally:
        await quill.close()


async def test_ten_thousand_files_are_one_event(ws: Workspace) -> None:
    r = await ws.exec("mkdir gen && cd gen && for i in $(seq 10000); do echo $i > f$i; done")
    assert r.exit_code == 0 and r.changes.committed and r.changes.total == 10_000
    assert r.changes.version == r.changes.base_version + 1
    assert await ws.read_text("gen/f9999") == "9999\n"
    assert (await ws.stat("gen")).entries == 10_000


async def test_ignored_paths_stay_out_of_history(ws: Workspace) -> None:
    r = await ws.exec(
        "mkdir -p node_modules/dep __pycache__ && echo x > node_modules/dep/i.js && "
        "echo y > __pycache__/a.pyc && echo z > kept.txt && ln -s /etc/passwd link"
    )
    assert [p.path for p in r.changes.paths] == ["kept.txt"]
    assert r.changes.ignored == ["__pycache__", "node_modules"]
    assert [(s.path, s.reason) for s in r.changes.skipped] == [("link", "symlink")]
    later = await ws.exec("cat node_modules/dep/i.js")  # still there for the next command
    assert later.stdout == "x\n"
    own = await ws.exec(
        "printf '# ours\\nlogs/\\n*.tmp\\n' > .quillignore && mkdir -p logs a && "
        "echo l > logs/1 && echo t > a/x.tmp && echo n > node_modules/more.js"
    )
    # a/ is new with nothing but an ignored file in it: left out too (as git would); the
    # defaults still hold
    assert [p.path for p in own.changes.paths] == [".quillignore"]
    assert sorted(own.changes.ignored) == ["a/x.tmp", "logs"]  # node_modules: reported before
    assert own.changes.ignored_reasons == {"quillignore": 2}


async def test_two_commands_on_one_workspace_at_once(ws: Workspace) -> None:
    first, second = await asyncio.gather(
        ws.exec("echo a > a.txt; sleep 0.5; cat b.txt 2>/dev/null; true"),
        ws.exec("echo b > b.txt"),
    )
    assert first.changes.committed and second.changes.committed
    assert first.changes.version != second.changes.version
    assert await ws.read_text("a.txt") == "a\n" and await ws.read_text("b.txt") == "b\n"


async def test_a_run_against_an_old_version(ws: Workspace) -> None:
    v = ws.last_version
    await ws.write("src/app.py", "print('changed')\n")
    old = await ws.exec("cat src/app.py; echo fix > fix.txt", version=v)
    assert old.stdout == "print('hi')\n" and old.changes.base_version == v
    assert old.changes.committed and await ws.read_text("fix.txt") == "fix\n"
    assert await ws.read_text("src/app.py") == "print('changed')\n"
    with pytest.raises(QuillError) as info:
        await ws.exec("true", version=999)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT


# ------------------------------------------------------------------ the pool


class Gate:
    """A command that prints ``go``, then waits until the test releases it
    (``tests.helpers.Gate``; the test waits on events)."""

    def __init__(self, executor: Executor, ws: Workspace) -> None:
        self.executor, self.ws = executor, ws
        self.started = asyncio.Event()
        self.gate = helpers.Gate()
        command = f"echo go; {self.gate.wait}"
        self.task = asyncio.create_task(ws.exec(command, on_output=self._seen))

    def _seen(self, stream: str, chunk: bytes) -> None:
        if b"go" in chunk:
            self.started.set()

    async def release(self) -> None:
        await self.gate.open()


async def test_a_busy_executor_queues_up_to_its_bound_then_refuses(
    stack: StartExecutor, nats_url: str, nc: NATS, name: str
) -> None:
    executor = await stack(max_runs=1, queue=1)
    quill = await Quill.connect(nats_url, retries=0)
    try:
        first, second, third = [await workspace(quill, f"{name}-{n}") for n in (1, 2, 3)]
        gate = Gate(executor, first)
        await asyncio.wait_for(gate.started.wait(), 10)
        beats = 0

        async def beat(msg: Msg) -> None:
            nonlocal beats
            beats += (msg.headers or {}).get(HEADER_STREAM) == "heartbeat"

        await nc.subscribe(f"ws.execout.{second.tenant}.{second.name}.>", cb=beat)
        await nc.flush()
        queued = asyncio.create_task(second.exec("echo queued"))
        await eventually(lambda: executor.info()["waiting"] == 1)
        with pytest.raises(QuillError) as info:  # past the queue's bound: refused at once
            await third.exec("true")
        assert info.value.code == ErrorCode.UNAVAILABLE and "busy" in info.value.message
        assert info.value.details["waiting"] == 1 and not queued.done()
        await eventually(lambda: beats >= 2)  # the waiting request is announced alive
        assert not queued.done() and executor.info()["waiting"] == 1
        await gate.release()
        assert (await gate.task).exit_code == 0
        assert (await queued).stdout == "queued\n"  # it waited, heartbeats on, then ran
        assert executor.info()["running"] == executor.info()["waiting"] == 0
    finally:
        await quill.close()


async def test_a_request_waiting_past_queue_wait_is_unavailable(
    stack: StartExecutor, nats_url: str, name: str
) -> None:
    executor = await stack(max_runs=1, queue_wait_s=0.5)
    quill = await Quill.connect(nats_url, retries=0)
    try:
        first, second = [await workspace(quill, f"{name}-{n}") for n in (1, 2)]
        gate = Gate(executor, first)
        await asyncio.wait_for(gate.started.wait(), 10)
        with pytest.raises(QuillError) as info:
            await second.exec("echo never > never.txt")
        assert info.value.code == ErrorCode.UNAVAILABLE and "no slot in 0.5 s" in info.value.message
        await gate.release()
        assert (await gate.task).exit_code == 0
        with pytest.raises(QuillError) as missing:
            await second.read_text("never.txt")
        assert missing.value.code == ErrorCode.FILE_NOT_FOUND
    finally:
        await quill.close()


async def test_no_executor_is_unavailable(nats_url: str, tmp_path: Path, name: str) -> None:
    async with AsyncExitStack() as es:
        await start_writer(es, nats_url, tmp_path / "writer")
        quill = await Quill.connect(nats_url, retries=0)
        try:
            ws = quill.workspace(name)
            await ws.create()
            with pytest.raises(QuillError) as info:
                await ws.exec("true")
            assert info.value.code == ErrorCode.UNAVAILABLE
            assert info.value.message == "No Quill executor is running"
        finally:
            await quill.close()


async def test_every_run_is_audited_without_output_or_env_values(
    stack: StartExecutor, quill: Quill, nc: NATS, name: str
) -> None:
    await stack()
    ws = await workspace(quill, name)
    await ws.exec(
        "echo $SECRET_TOKEN > leaked.txt; echo visible-output", env={"SECRET_TOKEN": "s3cr3t"}
    )
    js = nc.jetstream()
    tenant, workspace_id = name.split("/")
    msg = await js.get_last_msg(STREAM_AUDIT, f"ws.audit.{tenant}.{workspace_id}")
    assert msg.data is not None
    raw = msg.data.decode()
    record = json.loads(raw)
    assert (record["kind"], record["op"], record["outcome"]) == ("exec", "run", "ok")
    details = record["details"]
    assert details["command"].startswith("echo $SECRET_TOKEN")
    assert (details["exit_code"], details["timed_out"], details["env"]) == (
        0,
        False,
        ["SECRET_TOKEN"],
    )
    assert record["paths"] == ["leaked.txt"]
    assert "s3cr3t" not in raw
    assert "visible-42" not in raw
