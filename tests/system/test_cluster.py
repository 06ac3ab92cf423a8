"""``quill cluster up`` as a real process: three NATS servers in a cluster, two writers
sharing the partitions, two readers, an executor and the gateway; used through the SDK and
the CLI with every server's URL; stopped by SIGTERM with nothing left behind. And the
``Cluster`` API that fault tests drive: one process killed, stopped, started, restarted."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from contracts.subjects import (
    BUCKET_LEASES,
    HEADER_REQUEST_ID,
    STREAM_AUDIT,
    STREAM_EVENTS,
    Subjects,
)
from infra import bus
from quill.client import Quill
from quill_cli.cluster import Cluster
from tests.helpers import alive, eventually
from tests.system.test_scrape import EVERY_KIND, check_scraped, processes, use_every_service
from tests.up import Up

PARTITIONS = 16
ROOT = Path(__file__).resolve().parents[2]


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        children = {p for p, pp in parents.items() if pp == parent}
        found |= children
        todo += children
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    args = ("--executors", "1", "--partitions", str(PARTITIONS), "--log-format", "json")
    up = Up(tmp_path_factory.mktemp("cluster") / ".quill", args, command=("cluster", "up"))
    yield up.start()
    up.kill()


def test_ready_with_every_server_in_the_url(cluster: Up) -> None:
    urls = cluster.nats_url.split(",")
    assert len(urls) == 3 and len(set(urls)) == 3
    record = json.loads((cluster.data / "stack.json").read_text())
    assert record["nats_url"] == cluster.nats_url
    assert [s["name"] for s in record["servers"]] == ["nats-1", "nats-2", "nats-3"]
    logs = {p.stem for p in (cluster.data / "logs").iterdir()}
    assert logs >= {"nats-1", "writer-1", "writer-2", "reader-1", "reader-2", "executor-1"}
    print(f"quill cluster up ready in {cluster.ready_s:.1f}s")


async def test_every_service_logs_json_and_a_failure_names_its_request(cluster: Up) -> None:
    """``--log-format json`` reaches every service; a refused command sent with no request id
    is answered with the one it was given, which its writer's log line names."""
    nc = await nats.connect(cluster.nats_url.split(","))
    try:
        subject = Subjects("ws").cmd("acme", "logged", "write")
        reply = await nc.request(subject, b'{"path": "../x", "content": "x"}', timeout=15)
    finally:
        await nc.close()
    assert json.loads(reply.data)["error"]["code"] in ("ACCESS_DENIED", "WORKSPACE_NOT_FOUND")
    assert reply.headers is not None
    rid = reply.headers[HEADER_REQUEST_ID]
    logs = cluster.data / "logs"
    for name in ("writer-1", "writer-2", "reader-1", "executor-1", "gateway"):
        first = (logs / f"{name}.log").read_text().splitlines()[0]
        assert json.loads(first)["level"], name
    found = await eventually(  # the line is written after the reply: wait for it
        lambda: [
            json.loads(line)
            for log in logs.glob("writer-*.log")
            for line in log.read_text().splitlines()
            if rid in line
        ],
        20,
        f"a writer line naming {rid}",
    )
    assert [(x["request_id"], x["workspace"], x["op"]) for x in found] == [
        (rid, "logged", "cmd.write")
    ]


async def test_streams_have_three_replicas(cluster: Up) -> None:
    nc = await bus.connect(cluster.nats_url, "test")
    try:
        js = nc.jetstream()
        for name in (STREAM_EVENTS, STREAM_AUDIT, f"KV_{BUCKET_LEASES}"):
            info = await js.stream_info(name)
            assert info.config.num_replicas == 3, name
            assert info.cluster is not None and info.cluster.leader
            assert len(info.cluster.replicas or []) == 2, name
    finally:
        await nc.close()


async def test_sdk_writes_and_reads_across_partitions(cluster: Up) -> None:
    quill = await Quill.connect(cluster.nats_url)
    try:
        names = [f"acme/spread-{i}" for i in range(8)]  # several partitions, both writers
        for name in names:
            ws = quill.workspace(name)
            await ws.create()
            await ws.write("notes.md", f"# {name}\n")
        for name in names:
            assert await quill.workspace(name).read_text("notes.md") == f"# {name}\n"
        result = await quill.workspace(names[0]).exec("echo ran > out.txt && cat notes.md")
        assert result.exit_code == 0 and result.stdout == f"# {names[0]}\n"
        assert await quill.workspace(names[0]).read_text("out.txt") == "ran\n"
    finally:
        await quill.close()
    listed = await Quill.connect(cluster.nats_url.split(","))  # a list works too
    try:
        assert (await listed.workspace(names[1]).stat("notes.md")).file_version == 1
    finally:
        await listed.close()


def test_cli_with_the_comma_separated_url(cluster: Up) -> None:
    assert "created acme/cli" in cluster.cli("create", "acme/cli").stdout
    cluster.cli("put", "acme/cli", "todo.md", "--text", "- ship\n")
    assert cluster.cli("cat", "acme/cli", "todo.md").stdout == "- ship\n"
    ran = cluster.cli("exec", "acme/cli", "--", "sh", "-c", "wc -l < todo.md")
    assert ran.stdout.strip() == "1"
    cluster.cli("cluster", "health", "writer")  # a writer on this host answers
    record = json.loads((cluster.data / "stack.json").read_text())
    monitor = record["servers"][1]["monitor"].rsplit(":", 1)[1]
    cluster.cli("cluster", "health", "nats", "--monitor-port", monitor)


def _doc_block(lang: str, containing: str) -> str:
    text = (ROOT / "docs" / "cluster.md").read_text()
    return str(next(b for b in re.findall(rf"```{lang}\n(.*?)```", text, re.S) if containing in b))


def test_docs_client_commands_run_as_written(cluster: Up) -> None:
    lines = _doc_block("bash", "quill create").strip().splitlines()
    out = [cluster.cli(*shlex.split(line)[1:]).stdout for line in lines]
    assert out[0].startswith("created acme/team") and out[2].split()[0] == "6"


async def test_every_process_is_listed_and_scraped(cluster: Up) -> None:
    """``stack.json`` names every process of the cluster with its role and pid, and each
    service's (and the launcher's) metrics URL answers its own metrics; after a write, a read
    and a command, the writers, readers and executor counted them."""
    listed = processes(cluster.data)
    roles = [p["role"] for p in listed]
    assert roles == ["nats"] * 3 + ["writer"] * 2 + ["reader"] * 2 + ["executor", "gateway"] + [
        "launcher"
    ]
    assert [p["name"] for p in listed][:3] == ["nats-1", "nats-2", "nats-3"]
    await use_every_service(cluster)
    check_scraped(cluster.data, EVERY_KIND)


def test_sigterm_stops_everything(cluster: Up) -> None:
    """Last of the tests on the module's cluster: it ends it."""
    assert cluster.process is not None
    children = descendants(cluster.process.pid)
    assert len(children) >= 9  # 3 servers, 2 writers, 2 readers, an executor, the gateway
    cluster.process.send_signal(signal.SIGTERM)
    assert cluster.process.wait(30) == 0
    assert not [pid for pid in children if alive(pid)]
    assert not (cluster.data / "stack.json").exists()


def supervised(launcher: Cluster, name: str) -> str:
    """The state the launcher's supervisor gives child ``name`` (what ``ping.launcher``
    answers): ``up``, ``restarting``, ``starting`` or ``stopped``."""
    assert launcher.supervisor is not None
    (state,) = [c["state"] for c in launcher.supervisor.report()["children"] if c["name"] == name]
    return str(state)


async def test_the_programmatic_api_kills_stops_and_restarts_one_process(tmp_path: Path) -> None:
    small = Cluster(tmp_path, writers=1, readers=1, executors=0, partitions=8)
    async with small:
        assert small.names == ["nats-1", "nats-2", "nats-3", "writer-1", "reader-1", "gateway"]
        quill = await Quill.connect(small.nats_urls)
        try:
            ws = quill.workspace("acme/api")
            await ws.create()
            reader = small.child("reader-1")
            crashed = reader.pid
            await small.kill("reader-1")  # the supervisor starts it again
            await eventually(lambda: reader.alive() and reader.pid != crashed, 10)
            await small.wait_ready("reader-1")
            await small.stop("reader-1")  # on purpose: it stays down
            await eventually(  # the supervisor's next round saw it and leaves it down
                lambda: supervised(small, "reader-1") == "stopped", 10
            )
            assert not reader.alive()
            await small.start("reader-1")
            await small.restart("nats-2")
            await ws.write("a.txt", "after\n")
            assert await ws.read_text("a.txt") == "after\n"
        finally:
            await quill.close()
    assert not [c.name for c in small.children if c.alive()]


def test_docs_cluster_example_runs_as_written(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _doc_block("python", "Cluster(")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "up\n"
