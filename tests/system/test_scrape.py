"""Every process of a real ``quill up`` can be scraped: ``stack.json`` names each one (its
role, pid and metrics URL), each URL answers Prometheus metrics of that very process (its
memory, the requests it served), the ready output lists them, and a service started again is
recorded with its new pid, scraped at the same URL. ``test_cluster.py`` checks the same of
``quill cluster up``."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from quill.client import Quill
from quill_cli.ports import EPHEMERAL, QUIET_FROM, Ports
from tests.helpers import eventually, eventually_sync
from tests.up import Up

pytestmark = pytest.mark.up("--gateway-workers", "2")

ROOT = Path(__file__).resolve().parents[2]
ROLES = ["nats", "writer", "reader", "executor", "gateway", "launcher"]


def scrape(url: str) -> list[Sample]:
    """Every sample ``url`` answers (it must answer 200 with Prometheus's text format)."""
    answer = httpx.get(url, timeout=10)
    assert answer.status_code == 200, (url, answer.status_code)
    return [s for family in text_string_to_metric_families(answer.text) for s in family.samples]


def values(samples: list[Sample], name: str, **labels: str) -> list[float]:
    return [
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def processes(data: Path) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = json.loads((data / "stack.json").read_text())["processes"]
    return listed


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def check_scraped(data: Path, requests: dict[str, dict[str, str]]) -> dict[str, list[Sample]]:
    """Scrape every process ``stack.json`` lists with a metrics URL: each has its resident
    memory, and each role in ``requests`` counted such a request (labels) at least once
    (summed over the processes of that role). The samples, by process name."""
    scraped, counted = {}, dict.fromkeys(requests, 0.0)
    for process in processes(data):
        assert alive(process["pid"]), process
        if process["role"] == "nats":
            assert process["metrics"] is None
            continue
        samples = scraped[process["name"]] = scrape(process["metrics"])
        memory = values(samples, "process_resident_memory_bytes")
        assert memory and all(m > 0 for m in memory), process
        if process["role"] in requests:
            labels = requests[process["role"]]
            counted[process["role"]] += sum(values(samples, "quill_requests_total", **labels))
    for role, count in counted.items():
        assert count >= 1, (role, requests[role])
    return scraped


async def use_every_service(up: Up) -> None:
    """A write, a read and a command run, through the SDK; a request to the gateway."""
    quill = await Quill.connect(up.nats_url)
    try:
        ws = quill.workspace("acme/scraped")
        await ws.create()
        await ws.write("a.md", "one\n")
        assert await ws.read_text("a.md") == "one\n"
        assert (await ws.exec("cat a.md")).stdout == "one\n"
    finally:
        await quill.close()
    assert httpx.get(up.http_url + "/health").status_code == 200


EVERY_KIND = {
    "writer": {"service": "writer", "kind": "cmd", "op": "write", "outcome": "ok"},
    "reader": {"service": "reader", "kind": "qry", "outcome": "ok"},
    "executor": {"service": "executor", "kind": "exec", "outcome": "ok"},
    "gateway": {"service": "gateway", "kind": "http", "op": "GET /health", "outcome": "ok"},
}


async def test_every_process_is_listed_and_scraped(up: Up) -> None:
    listed = processes(up.data)
    assert [p["role"] for p in listed] == ROLES
    assert [p["name"] for p in listed] == ROLES
    assert up.process is not None and listed[-1]["pid"] == up.process.pid
    await use_every_service(up)
    scraped = check_scraped(up.data, EVERY_KIND)
    url = next(p["metrics"] for p in processes(up.data) if p["role"] == "gateway")

    def both_workers() -> bool:  # worker 0 answers before worker 1 serves: wait for it
        scraped["gateway"] = scrape(url)  # its two workers in one scrape, each its memory
        return _workers(scraped["gateway"]) == {"0", "1"}

    await eventually(both_workers, 60)


def _workers(samples: list[Sample]) -> set[str]:
    return {s.labels["worker"] for s in samples if s.name == "process_resident_memory_bytes"}


def test_the_ready_output_lists_the_metrics_ports(up: Up) -> None:
    lines = eventually_sync(  # printed just after the ready line
        lambda: [line for line in up.output if line.startswith("metrics: ")], 30
    )
    line = lines[0]
    urls = dict(word.split("=", 1) for word in line.split()[1:])
    listed = {p["name"]: p["metrics"] for p in processes(up.data) if p["metrics"]}
    assert urls == listed  # each a real address: no PORT placeholder to fill in
    assert up.output[0].startswith("quill ready ")  # still the first line, as parsers expect
    assert up.output.index(line) == 1


def _started(samples: list[Sample]) -> float:
    """When the process (the first of a gateway's workers) started."""
    return min(values(samples, "process_start_time_seconds"))


def _recorded_again(data: Path, name: str, old: int, timeout: float = 60.0) -> dict[str, Any]:
    """``name``'s entry in ``stack.json`` once it names another pid than ``old``."""

    def recorded() -> dict[str, Any] | None:
        entry = next(p for p in processes(data) if p["name"] == name)
        return entry if entry["pid"] != old else None

    return eventually_sync(recorded, timeout, f"stack.json naming another {name} than pid {old}")


def _scraped_when_up(url: str, timeout: float = 60.0) -> list[Sample]:
    """``url``'s samples once it answers (a process started again binds its port soon)."""
    return eventually_sync(lambda: scrape(url), timeout, url, ignoring=(httpx.TransportError,))


@pytest.mark.parametrize("name", ["reader", "gateway"])
def test_a_restarted_process_is_recorded_with_its_new_pid(up: Up, name: str) -> None:
    """``kill -9`` one service: the launcher starts it again, ``stack.json`` names the new
    pid, and its metrics URL, unchanged, answers the new process's metrics."""
    before = next(p for p in processes(up.data) if p["name"] == name)
    started = _started(scrape(before["metrics"]))
    os.kill(before["pid"], signal.SIGKILL)
    after = _recorded_again(up.data, name, before["pid"])
    assert after["metrics"] == before["metrics"] and after["role"] == name
    assert f"{name}".encode() in Path(f"/proc/{after['pid']}/cmdline").read_bytes()
    samples = _scraped_when_up(after["metrics"])
    assert _started(samples) > started  # the new process's, not the killed one's
    assert values(samples, "process_resident_memory_bytes")[0] > 0
    assert json.loads((up.data / "stack.json").read_text())["nats_url"] == up.nats_url
    launcher = next(p for p in processes(up.data) if p["role"] == "launcher")
    restarts = values(scrape(launcher["metrics"]), "quill_launcher_restarts_total", process=name)
    assert restarts == [1.0]


def test_a_busy_metrics_port_is_refused_by_name(tmp_path: Path) -> None:
    """``--metrics-port N`` with N held by someone else: ``quill up`` refuses at once,
    naming the port and whose it was to be, and leaves no stack.json."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        first = port  # the writer's, the first of the series, is the held one
        done = subprocess.run(
            [sys.executable, "-m", "quill", "up", "--data", str(tmp_path / ".quill")]
            + ["--nats-port", "0", "--http-port", "0", "--metrics-port", str(first)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode != 0
    assert f"port {port} (writer's metrics port) is in use" in done.stderr, done.stderr
    assert not (tmp_path / ".quill" / "stack.json").exists()


@pytest.mark.parametrize(
    ("offset", "why"),
    [(2, "executor's metrics port) is another port of this stack"), (0, "past 65535")],
)
def test_metrics_ports_that_cannot_be_are_refused(tmp_path: Path, offset: int, why: str) -> None:
    """``--metrics-port`` whose series runs into the gateway's HTTP port, or past the last
    port: refused before anything starts, naming the port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        http = probe.getsockname()[1]
    first = http - offset if offset else 65533
    done = subprocess.run(
        [sys.executable, "-m", "quill", "up", "--data", str(tmp_path / ".quill")]
        + ["--nats-port", "0", "--http-port", str(http), "--metrics-port", str(first)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and why in done.stderr, done.stderr
    assert not (tmp_path / ".quill" / "stack.json").exists()


@pytest.mark.parametrize("host", ["256.1.1.1", "no-such-host.invalid", "8.8.8.8"])
def test_a_service_that_cannot_listen_for_metrics_says_where(tmp_path: Path, host: str) -> None:
    """A metrics address the service cannot listen on is one line naming it, and an exit
    (the service does not run unobservable)."""
    done = subprocess.run(
        [sys.executable, "-m", "quill", "writer", "--nats-url", "nats://127.0.0.1:1"]
        + ["--data", str(tmp_path), "--metrics-port", "0", "--metrics-host", host],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert f"cannot serve metrics on {host}:0" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_metrics_port_out_of_range_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "quill", "reader", "--data", str(tmp_path)]
        + ["--metrics-port", "70000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--metrics-port" in done.stderr


def test_the_documented_file_sd_command_lists_every_target(up: Up, tmp_path: Path) -> None:
    """docs/operations.md's ``jq`` line, run on this stack's ``stack.json``, writes a
    Prometheus file_sd list: one target a scraped process, its job ``quill-<role>``."""
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed: the documented command cannot run here")
    doc = (ROOT / "docs" / "operations.md").read_text()
    command = next(line for line in doc.splitlines() if line.startswith("jq "))
    command = command.replace(".quill/stack.json", shlex.quote(str(up.data / "stack.json")))
    command = command.replace("> quill-targets.json", f"> {shlex.quote(str(tmp_path / 't.json'))}")
    subprocess.run(["bash", "-c", command], check=True, timeout=30)
    targets = json.loads((tmp_path / "t.json").read_text())
    wanted = [
        {
            "targets": [p["metrics"].removeprefix("http://").removesuffix("/metrics")],
            "labels": {"job": f"quill-{p['role']}", "process": p["name"]},
        }
        for p in processes(up.data)
        if p["metrics"]
    ]
    assert targets == wanted and len(targets) == len(ROLES) - 1
    for target in targets:  # each answers at that address, as Prometheus will ask it
        assert scrape(f"http://{target['targets'][0]}/metrics")


def test_the_documented_stack_json_is_what_quill_up_writes(up: Up) -> None:
    """docs/operations.md's example of ``stack.json``: the same keys, the same processes in
    the same order, as the running stack's."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    block = next(b for b in re.findall(r"```json\n(.*?)```", doc, re.S) if '"processes"' in b)
    documented = json.loads(block)
    real = json.loads((up.data / "stack.json").read_text())
    assert set(documented) == set(real)
    assert [(p["name"], p["role"], set(p)) for p in documented["processes"]] == [
        (p["name"], p["role"], set(p)) for p in real["processes"]
    ]


def test_picked_ports_are_below_the_ephemeral_range() -> None:
    """Ports picked free stay out of the range outgoing connections take their local ports
    from (so none takes one before its service binds it), and none is picked twice."""
    low = int(EPHEMERAL.read_text().split()[0])
    ports = Ports()
    picked = [ports.free() for _ in range(20)]
    assert len(set(picked)) == 20
    if low - QUIET_FROM >= 1000:
        assert all(QUIET_FROM <= port < low for port in picked), picked
