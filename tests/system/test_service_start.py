"""A service started before NATS or JetStream can answer, as processes: it waits for
JetStream (a cluster electing its meta leader, a server still starting on a loaded machine),
then serves; when nothing answers, it exits with one line that says what is missing, never a
traceback. (A cluster's executor once exited at start on one JetStream timeout, taking
``quill cluster up`` with it.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from quill.client import Quill
from quill_cli.natsserver import NatsServer, binary, terminate
from quill_cli.ports import quiet_port
from tests.helpers import eventually_sync

WAITING = "creating the streams: JetStream did not answer"


@contextmanager
def without_jetstream(port: int, home: Path) -> Iterator[str]:
    """A nats-server with no JetStream on ``port``: every JetStream request has no responder."""
    home.mkdir(parents=True, exist_ok=True)
    log = (home / "nats.log").open("w")
    proc = subprocess.Popen(
        [str(binary()), "-a", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT
    )
    try:

        def accepts() -> bool:
            assert proc.poll() is None, "nats-server exited"
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True

        eventually_sync(accepts, 20, "nats-server accepting connections", ignoring=(OSError,))
        yield f"nats://127.0.0.1:{port}"
    finally:
        terminate(proc)
        log.close()


def service(name: str, url: str, data: Path, err: Path, **env: str) -> subprocess.Popen[bytes]:
    with err.open("wb") as stderr:  # the child has its own copy
        return subprocess.Popen(
            [sys.executable, "-m", "quill", name, "--nats-url", url, "--data", str(data)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**os.environ, **env},
        )


def said(err: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Until ``text`` is in the process's stderr (polled: the file is the only channel)."""

    def there() -> bool:
        if text in err.read_text():
            return True
        assert proc.poll() is None, err.read_text()
        return False

    try:
        eventually_sync(there, timeout, f"{text!r} in {err.name}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{err.read_text()}") from None


async def test_a_writer_started_before_jetstream_waits_for_it_then_serves(tmp_path: Path) -> None:
    port = quiet_port()
    err = tmp_path / "writer.err"
    with without_jetstream(port, tmp_path / "plain") as url:
        writer = service("writer", url, tmp_path / "writer", err)
        try:
            said(err, WAITING, writer)  # waiting, not exited
        except BaseException:
            terminate(writer)
            raise
    # the server it waits for comes up where the other was: JetStream this time
    server = NatsServer(tmp_path / "js", port=port).start()
    try:
        quill = await Quill.connect(url, timeout=30)
        try:
            made = await quill.workspace("start/late").create()
            assert made.created and made.workspace == "late"
        finally:
            await quill.close()
        assert writer.poll() is None
        assert "Traceback" not in err.read_text()
    finally:
        terminate(writer)
        server.stop()


def test_a_service_jetstream_never_answers_exits_with_one_line(tmp_path: Path) -> None:
    with without_jetstream(quiet_port(), tmp_path / "plain") as url:
        err = tmp_path / "executor.err"
        executor = service("executor", url, tmp_path / "x", err, QUILL_SETUP_WAIT_S="2")
        try:
            assert executor.wait(timeout=60) == 1
        finally:
            terminate(executor)
    said = err.read_text()
    assert "Traceback" not in said, said
    last = said.strip().splitlines()[-1]
    assert last == (
        "quill: creating the streams: JetStream did not answer within 2 s (no JetStream "
        "responded): is JetStream enabled on the server, and has the cluster elected its leader?"
    )


@pytest.mark.parametrize("wait", ["soon", "-1", "nan"])
def test_a_setup_wait_that_is_not_seconds_is_refused(tmp_path: Path, wait: str) -> None:
    with without_jetstream(quiet_port(), tmp_path / "plain") as url:
        err = tmp_path / "reader.err"
        reader = service("reader", url, tmp_path / "r", err, QUILL_SETUP_WAIT_S=wait)
        try:
            assert reader.wait(timeout=60) == 1
        finally:
            terminate(reader)
    said = err.read_text().strip()
    assert said == f"quill: QUILL_SETUP_WAIT_S={wait!r}: expected a number of seconds >= 0"


def test_a_service_with_no_nats_server_exits_with_one_line(tmp_path: Path) -> None:
    port = quiet_port()  # nothing listens there
    err = tmp_path / "writer.err"
    writer = service("writer", f"nats://127.0.0.1:{port}", tmp_path / "w", err)
    try:
        assert writer.wait(timeout=60) == 1
    finally:
        terminate(writer)
    said = err.read_text().strip()
    assert "Traceback" not in said, said
    assert said.startswith(f"quill: Cannot connect to NATS at nats://127.0.0.1:{port}:"), said
