"""``quill up`` and ``quill cluster up/health`` as an operator meets them: a busy port named,
the health check finding its ports in ``stack.json``, a line when they stop, and a data
directory git ignores."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.helpers import QuietHandler, http_server
from tests.up import Up


def test_cluster_up_names_a_busy_port(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "quill", "cluster", "up", "--data", str(tmp_path / "c")]
            + ["--nats", "1", "--writers", "1", "--readers", "1", "--executors", "1"]
            + ["--nats-port", str(port), "--http-port", "0"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r.returncode == 1
    assert f"port {port} (nats-1's client port) is in use" in r.stderr
    assert "--nats-port" in r.stderr


class _Healthz(QuietHandler):
    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        self.answer(200 if self.path == "/healthz" else 404)


def test_cluster_health_reads_its_ports_from_stack_json(tmp_path: Path) -> None:
    with http_server(_Healthz) as port:
        data = tmp_path / ".quill-cluster"
        data.mkdir()
        record = {"nats_url": "nats://127.0.0.1:1", "pid": 1, "servers": [
            {"name": "nats-1", "url": "nats://127.0.0.1:1", "monitor": f"http://127.0.0.1:{port}"}
        ]}  # fmt: skip
        (data / "stack.json").write_text(json.dumps(record))
        argv = [sys.executable, "-m", "quill", "cluster", "health", "nats", "--timeout", "5"]
        env = {"QUILL_DATA": str(data), "PATH": ""}
        found = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        assert found.returncode == 0, found.stderr
        elsewhere = subprocess.run(
            argv, capture_output=True, text=True, env={"PATH": ""}, cwd=tmp_path, timeout=60
        )
        assert elsewhere.returncode == 1 and "on port 8222" in elsewhere.stderr


def test_up_says_when_it_stops_and_git_ignores_its_data(tmp_path: Path) -> None:
    stack = Up(tmp_path / ".quill").start()
    console = f"console: {stack.http_url}/ui/ (open it in a browser)\n"
    page = httpx.get(f"{stack.http_url}/ui/", follow_redirects=True, timeout=30)
    assert page.status_code == 200 and "<html" in page.text  # the printed address serves it
    assert stack.stop() == 0
    assert console in stack.output  # right after the ready line
    assert stack.output[-1].startswith("quill stopped: data=")
    assert (tmp_path / ".quill" / ".gitignore").read_text().endswith("\n*\n")
    repo = subprocess.run(["git", "init", "-q", str(tmp_path)], capture_output=True)
    if repo.returncode == 0:
        ignored = subprocess.run(
            ["git", "-C", str(tmp_path), "check-ignore", ".quill/stack.json"], capture_output=True
        )
        assert ignored.returncode == 0
